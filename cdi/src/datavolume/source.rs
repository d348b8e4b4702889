//! What a DataVolume asks to import, checked once and shared by the importer pod and the local
//! mode as one [`ImportArgs`] (the pod writes it as `quarry import` arguments, local mode imports
//! its request in-process).

use std::path::PathBuf;

use importer::checksum::Checksum;
use importer::cli::ImportArgs;

use super::pod::insecure_registry;
use super::pvc::{Claim, VolumeMode};
use api::datavolume::{ContentType, DataVolumeSpec};
use kubekit::error::{Error, Result};

/// Where the data of a DataVolume comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Imported by `quarry import` from a URL.
    Import(ImportSource),
    /// Uploaded by a client to an upload server.
    Upload,
    /// A blank disk of the requested size.
    Blank,
    /// Cloned from a PVC or a VolumeSnapshot ([`super::clone::flow`]).
    Clone(CloneSource),
}

/// What a clone is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneSourceKind {
    /// A PVC.
    Pvc,
    /// A VolumeSnapshot.
    Snapshot,
}

/// The checked contents of `spec.source.pvc|snapshot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneSource {
    /// A PVC or a VolumeSnapshot.
    pub kind: CloneSourceKind,
    /// Its namespace (empty: the DataVolume's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl CloneSource {
    /// The source's namespace, the DataVolume's (`dv_namespace`) when not given.
    pub fn namespace_or<'a>(&'a self, dv_namespace: &'a str) -> &'a str {
        if self.namespace.is_empty() {
            dv_namespace
        } else {
            &self.namespace
        }
    }
}

/// The checked contents of `spec.source.http|registry|s3|gcs`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImportSource {
    /// `http(s)://...`, `docker://...`, `s3://...` or `gs://...` as `quarry import` takes it.
    pub url: String,
    /// Which source type it came from.
    pub kind: ImportKind,
    /// Secret with `accessKeyId` / `secretKey` (a gcs source's: `credentials.json`, a Google
    /// service-account key).
    pub secret_ref: Option<String>,
    /// ConfigMap with CA certificates.
    pub cert_config_map: Option<String>,
    /// Extra headers, `Name: value`.
    pub extra_headers: Vec<String>,
    /// Secrets each holding header lines.
    pub secret_extra_headers: Vec<String>,
    /// Expected checksum of the download (checked to parse).
    pub checksum: Option<String>,
    /// Registry image platform, `linux/ARCH`.
    pub platform: Option<String>,
    /// `contentType: archive`: the source is a tar extracted into the volume.
    pub archive: bool,
}

/// The source type of an [`ImportSource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImportKind {
    /// `source.http`.
    #[default]
    Http,
    /// `source.registry`.
    Registry,
    /// `source.s3`.
    S3,
    /// `source.gcs`.
    Gcs,
}

/// The one source of a DataVolume, or a clear error for what Quarry does not support.
pub fn source(spec: &DataVolumeSpec) -> Result<Source> {
    let mut found = sources(spec)?;
    let archive = spec.content_type == Some(ContentType::Archive);
    match &mut found {
        Source::Import(i) => i.archive = archive,
        Source::Upload => {}
        Source::Blank | Source::Clone(_) if archive => {
            return Err(Error::invalid(
                "contentType archive needs an http, s3, gcs, registry or upload source (as CDI's)",
            ));
        }
        Source::Blank | Source::Clone(_) => {}
    }
    Ok(found)
}

/// Whether a DataVolume's content is an archive to extract (not a disk image).
pub fn is_archive(spec: &DataVolumeSpec) -> bool {
    spec.content_type == Some(ContentType::Archive)
}

fn sources(spec: &DataVolumeSpec) -> Result<Source> {
    let Some(src) = &spec.source else {
        return Err(if spec.source_ref.is_some() {
            Error::invalid("spec.sourceRef must be resolved to its DataSource's source first")
        } else {
            Error::invalid("spec.source is required")
        });
    };
    let mut found = Vec::new();
    if let Some(h) = &src.http {
        found.push(Source::Import(ImportSource {
            url: h.url.clone(),
            kind: ImportKind::Http,
            secret_ref: nonempty(&h.secret_ref),
            cert_config_map: nonempty(&h.cert_config_map),
            extra_headers: h.extra_headers.clone(),
            secret_extra_headers: h.secret_extra_headers.clone(),
            checksum: nonempty(&h.checksum),
            ..Default::default()
        }));
    }
    if let Some(r) = &src.registry {
        if r.image_stream.is_some() {
            return Err(Error::invalid(
                "source.registry.imageStream is not supported; give source.registry.url",
            ));
        }
        if r.pull_method.as_deref().is_some_and(|m| m != "pod") {
            return Err(Error::invalid(
                "source.registry.pullMethod node is not supported; use pod",
            ));
        }
        let url = r
            .url
            .clone()
            .ok_or_else(|| Error::invalid("source.registry.url is required"))?;
        found.push(Source::Import(ImportSource {
            url,
            kind: ImportKind::Registry,
            secret_ref: nonempty(&r.secret_ref),
            cert_config_map: nonempty(&r.cert_config_map),
            platform: r
                .platform
                .as_ref()
                .and_then(|p| p.architecture.as_ref())
                .map(|a| format!("linux/{a}")),
            ..Default::default()
        }));
    }
    if let Some(s) = &src.s3 {
        found.push(Source::Import(ImportSource {
            url: s.url.clone(),
            kind: ImportKind::S3,
            secret_ref: nonempty(&s.secret_ref),
            cert_config_map: nonempty(&s.cert_config_map),
            ..Default::default()
        }));
    }
    if let Some(g) = &src.gcs {
        found.push(Source::Import(ImportSource {
            url: g.url.clone(),
            kind: ImportKind::Gcs,
            secret_ref: nonempty(&g.secret_ref),
            ..Default::default()
        }));
    }
    if src.upload.is_some() {
        found.push(Source::Upload);
    }
    if src.blank.is_some() {
        found.push(Source::Blank);
    }
    for (p, kind) in [
        (&src.pvc, CloneSourceKind::Pvc),
        (&src.snapshot, CloneSourceKind::Snapshot),
    ] {
        if let Some(p) = p {
            if p.name.is_empty() {
                return Err(Error::invalid("the clone source's name is required"));
            }
            found.push(Source::Clone(CloneSource {
                kind,
                namespace: p.namespace.clone(),
                name: p.name.clone(),
            }));
        }
    }
    for (set, name) in [
        (src.imageio.is_some(), "imageio"),
        (src.vddk.is_some(), "vddk"),
    ] {
        if set {
            return Err(Error::invalid(format!(
                "source {name} is not supported by Quarry's DataVolume controller"
            )));
        }
    }
    if found.len() != 1 {
        return Err(Error::invalid(format!(
            "spec.source must have exactly one of http, registry, s3, gcs, upload, blank, pvc, snapshot (found {})",
            found.len()
        )));
    }
    let found = found.remove(0);
    if let Source::Import(i) = &found {
        check(i)?;
    }
    Ok(found)
}

fn nonempty(s: &Option<String>) -> Option<String> {
    s.clone().filter(|s| !s.is_empty())
}

/// Rejects what `quarry import` would refuse, so the DataVolume fails before any pod runs.
fn check(src: &ImportSource) -> Result<()> {
    let lower = src.url.to_ascii_lowercase();
    let schemes: &[&str] = match src.kind {
        ImportKind::Http => &["http://", "https://"],
        ImportKind::Registry => &["docker://"],
        ImportKind::S3 => &["s3://", "http://", "https://"],
        ImportKind::Gcs => &["gs://", "http://", "https://"],
    };
    if !schemes.iter().any(|s| lower.starts_with(s)) {
        return Err(Error::invalid(format!(
            "source url {:?} must start with {}",
            src.url,
            schemes.join(" or ")
        )));
    }
    if let Some(c) = &src.checksum {
        c.parse::<Checksum>()
            .map_err(|e| Error::invalid(format!("source.http.checksum: {e}")))?;
    }
    for h in &src.extra_headers {
        header(h)?;
    }
    if let Some(p) = &src.platform {
        importer::source::registry::manifest::Platform::parse(p)
            .map_err(|e| Error::invalid(format!("source.registry.platform: {e}")))?;
    }
    Ok(())
}

/// Checks a header line `Name: value`, as CDI's extraHeaders are written (with the importer's
/// parser).
fn header(h: &str) -> Result<()> {
    importer::cli::parse_header(h).map(drop).map_err(|_| {
        Error::invalid(format!(
            "extra header {h:?} is not of the form 'Name: value'"
        ))
    })
}

impl ImportSource {
    /// The import of this source into `target` that the importer pod and local mode share: the
    /// source, its size, checksum, headers and registry options. Each adds where it finds the
    /// credentials, CA files and secret headers.
    pub fn import_args(
        &self,
        target: impl Into<PathBuf>,
        claim: &Claim,
        insecure_registries: &[String],
    ) -> ImportArgs {
        let mut args = ImportArgs::new(&self.url, target);
        args.size = Some(claim.size);
        args.filesystem_overhead = (claim.mode == VolumeMode::Filesystem).then_some(claim.overhead);
        args.checksum = self.checksum.clone();
        // CDI's http(s)://HOST/BUCKET/KEY form of an object store's URL, read as that store's.
        let url = self.url.to_ascii_lowercase();
        args.s3 = self.kind == ImportKind::S3 && !url.starts_with("s3://");
        args.gcs = self.kind == ImportKind::Gcs && !url.starts_with("gs://");
        args.headers = self.extra_headers.clone();
        args.archive = self.archive;
        if self.kind == ImportKind::Registry {
            args.platform = self.platform.clone();
            args.insecure = insecure_registry(&self.url, insecure_registries);
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::datavolume::{DataVolumeSource, Empty, SourceGcs, SourceHttp, SourcePvc};

    fn spec(src: DataVolumeSource) -> DataVolumeSpec {
        DataVolumeSpec {
            source: Some(src),
            ..Default::default()
        }
    }

    fn http(url: &str) -> SourceHttp {
        SourceHttp {
            url: url.into(),
            ..Default::default()
        }
    }

    #[test]
    fn http_source_is_checked() {
        let s = source(&spec(DataVolumeSource {
            http: Some(SourceHttp {
                checksum: Some(format!("sha256:{}", "ab".repeat(32))),
                extra_headers: vec!["X-Token: abc".into()],
                ..http("https://example.org/disk.qcow2")
            }),
            ..Default::default()
        }))
        .unwrap();
        let Source::Import(i) = s else { panic!() };
        assert_eq!(i.kind, ImportKind::Http);
        assert!(i.checksum.unwrap().starts_with("sha256:abab"));
    }

    #[test]
    fn bad_checksum_header_and_scheme_are_refused_by_name() {
        for (h, needle) in [
            (
                SourceHttp {
                    checksum: Some("crc32:00".into()),
                    ..http("http://h/x")
                },
                "checksum",
            ),
            (
                SourceHttp {
                    extra_headers: vec!["no colon".into()],
                    ..http("http://h/x")
                },
                "extra header",
            ),
            (http("ftp://h/x"), "must start with"),
        ] {
            let e = source(&spec(DataVolumeSource {
                http: Some(h),
                ..Default::default()
            }))
            .unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
        }
    }

    #[test]
    fn exactly_one_supported_source() {
        let two = spec(DataVolumeSource {
            http: Some(http("http://h/x")),
            blank: Some(Empty {}),
            ..Default::default()
        });
        assert!(
            source(&two)
                .unwrap_err()
                .to_string()
                .contains("exactly one")
        );
        assert!(source(&DataVolumeSpec::default()).is_err());
        let clone = spec(DataVolumeSource {
            pvc: Some(SourcePvc {
                namespace: "a".into(),
                name: "b".into(),
            }),
            ..Default::default()
        });
        assert_eq!(
            source(&clone).unwrap(),
            Source::Clone(CloneSource {
                kind: CloneSourceKind::Pvc,
                namespace: "a".into(),
                name: "b".into()
            })
        );
        let upload = spec(DataVolumeSource {
            upload: Some(Empty {}),
            ..Default::default()
        });
        assert_eq!(source(&upload).unwrap(), Source::Upload);
        let archive = DataVolumeSpec {
            content_type: Some(ContentType::Archive),
            ..upload
        };
        assert_eq!(source(&archive).unwrap(), Source::Upload);
        let blank_archive = DataVolumeSpec {
            source: Some(DataVolumeSource {
                blank: Some(Empty {}),
                ..Default::default()
            }),
            ..archive.clone()
        };
        assert!(
            source(&blank_archive)
                .unwrap_err()
                .to_string()
                .contains("archive")
        );
    }

    /// `source.gcs` imports `gs://` as it is, and CDI's `http(s)://HOST/BUCKET/OBJECT` as a
    /// GCS object; other schemes are refused by name.
    #[test]
    fn a_gcs_source_is_an_import_of_a_gcs_object() {
        let gcs = |url: &str| {
            source(&spec(DataVolumeSource {
                gcs: Some(Box::new(SourceGcs {
                    url: url.into(),
                    secret_ref: Some("sa-key".into()),
                })),
                ..Default::default()
            }))
        };
        let claim = Claim {
            spec: Default::default(),
            size: 1 << 30,
            mode: VolumeMode::Block,
            overhead: 0.0,
        };
        for (url, http_form) in [
            ("gs://images/fedora.qcow2", false),
            ("https://storage.googleapis.com/images/fedora.qcow2", true),
        ] {
            let Source::Import(i) = gcs(url).unwrap() else {
                panic!("{url}")
            };
            assert_eq!(i.kind, ImportKind::Gcs);
            assert_eq!(i.secret_ref.as_deref(), Some("sa-key"));
            let args = i.import_args("/dev/cdi-block-volume", &claim, &[]);
            assert_eq!(
                (args.source.as_str(), args.gcs, args.s3),
                (url, http_form, false)
            );
        }
        let e = gcs("s3://images/fedora.qcow2").unwrap_err().to_string();
        assert!(
            e.contains("must start with gs:// or http:// or https://"),
            "{e}"
        );
    }

    #[test]
    fn an_archive_source_imports_with_archive() {
        let spec = DataVolumeSpec {
            content_type: Some(ContentType::Archive),
            ..spec(DataVolumeSource {
                http: Some(http("http://h/tree.tar.gz")),
                ..Default::default()
            })
        };
        let Source::Import(i) = source(&spec).unwrap() else {
            panic!()
        };
        assert!(i.archive);
        let claim = Claim {
            spec: Default::default(),
            size: 1 << 30,
            mode: VolumeMode::Filesystem,
            overhead: 0.06,
        };
        assert!(i.import_args("/data", &claim, &[]).archive);
    }
}
