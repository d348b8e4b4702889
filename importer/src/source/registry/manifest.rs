//! Manifests, indexes and image configs of the distribution API: parsing, schema-1 refusal,
//! platform resolution and the bootc/ostree refusal.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::{Error, Result};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Sent with every manifest request: a registry answers a Docker v2 manifest requested without
/// its type by converting it to schema 1, and an OCI manifest with 404.
pub const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.v2+json, \
application/vnd.docker.distribution.manifest.list.v2+json";

/// CDI's labels of bootc / ostree-bootable images, which are not disk images.
const BOOTC_LABELS: [&str; 2] = ["containers.bootc", "ostree.bootable"];

/// A content descriptor (a manifest in an index, a config or a layer in a manifest).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// `os/architecture[/variant]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    #[serde(default)]
    pub variant: Option<String>,
}

impl Platform {
    pub fn parse(s: &str) -> Result<Platform> {
        let parts: Vec<&str> = s.split('/').collect();
        match parts.as_slice() {
            [os, arch] | [os, arch, _] if !os.is_empty() && !arch.is_empty() => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: parts.get(2).map(|v| v.to_string()),
            }),
            _ => Err(Error::InvalidInput(format!(
                "platform {s:?} is not OS/ARCH[/VARIANT] (e.g. linux/amd64)"
            ))),
        }
    }

    fn matches(&self, other: &Platform) -> bool {
        self.os == other.os
            && self.architecture == other.architecture
            && (self.variant.is_none() || self.variant == other.variant)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    config: Option<Descriptor>,
    layers: Option<Vec<Descriptor>>,
    manifests: Option<Vec<Descriptor>>,
}

/// A parsed manifest.
#[derive(Debug)]
pub enum Manifest {
    Image {
        config: Descriptor,
        /// Bottom layer first.
        layers: Vec<Descriptor>,
    },
    Index(Vec<Descriptor>),
}

impl Manifest {
    /// Parses a manifest body answered with `content_type`.
    pub fn parse(content_type: Option<&str>, body: &[u8], what: &str) -> Result<Manifest> {
        let ct = content_type
            .map(|c| c.split(';').next().unwrap_or("").trim().to_string())
            .unwrap_or_default();
        if ct.starts_with("application/vnd.docker.distribution.manifest.v1") {
            return Err(schema1(what));
        }
        let raw: Raw = serde_json::from_slice(body)
            .map_err(|e| Error::Corrupt(format!("{what}: manifest is not valid JSON: {e}")))?;
        if raw.schema_version == Some(1) {
            return Err(schema1(what));
        }
        let kind = raw.media_type.clone().unwrap_or(ct);
        let is_index = kind == OCI_INDEX || kind == DOCKER_LIST || raw.manifests.is_some();
        if is_index {
            let list = raw.manifests.unwrap_or_default();
            return Ok(Manifest::Index(list));
        }
        match (raw.config, raw.layers) {
            (Some(config), Some(layers))
                if kind.is_empty() || kind == OCI_MANIFEST || kind == DOCKER_MANIFEST =>
            {
                Ok(Manifest::Image { config, layers })
            }
            (Some(_), Some(_)) => Err(Error::Unsupported(format!(
                "{what}: manifest type {kind:?} is not an image manifest"
            ))),
            _ => Err(Error::Corrupt(format!(
                "{what}: manifest has no config or no layers"
            ))),
        }
    }
}

fn schema1(what: &str) -> Error {
    Error::Unsupported(format!(
        "{what}: Docker schema 1 manifests are not supported (deprecated and unverifiable); \
         push the image again as Docker schema 2 or OCI"
    ))
}

/// The index entry for `platform`.
pub fn select_platform<'a>(
    list: &'a [Descriptor],
    platform: &Platform,
    what: &str,
) -> Result<&'a Descriptor> {
    list.iter()
        .find(|d| d.platform.as_ref().is_some_and(|p| platform.matches(p)))
        .ok_or_else(|| {
            let available: Vec<String> = list
                .iter()
                .filter_map(|d| d.platform.as_ref().map(|p| p.to_string()))
                .collect();
            Error::Unsupported(format!(
                "{what}: no image for platform {platform} (the index has: {})",
                if available.is_empty() {
                    "no platforms".to_string()
                } else {
                    available.join(", ")
                }
            ))
        })
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RunConfig {
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

/// The parts of an image config Quarry looks at.
#[derive(Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    config: Option<RunConfig>,
}

impl ImageConfig {
    pub fn parse(body: &[u8], what: &str) -> Result<ImageConfig> {
        serde_json::from_slice(body)
            .map_err(|e| Error::Corrupt(format!("{what}: image config is not valid JSON: {e}")))
    }

    /// Refuses bootc / ostree images (as CDI does), and, when a platform was asked for, an
    /// image of another one.
    pub fn check(&self, platform: Option<&Platform>, what: &str) -> Result<()> {
        let labels = self.config.as_ref().and_then(|c| c.labels.as_ref());
        if let Some(label) = BOOTC_LABELS
            .iter()
            .find(|l| labels.and_then(|m| m.get(**l)).is_some_and(|v| v == "1"))
        {
            return Err(Error::Unsupported(format!(
                "{what}: bootc image detected ({label}=1): it holds an ostree-based bootable OS, \
                 not a disk under /disk, and cannot be imported as a containerDisk"
            )));
        }
        if let Some(p) = platform
            && !self.architecture.is_empty()
            && (self.architecture != p.architecture || (!self.os.is_empty() && self.os != p.os))
        {
            return Err(Error::Unsupported(format!(
                "{what}: the image is for {}/{}, not the requested {p}",
                self.os, self.architecture
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(arch: &str) -> String {
        format!(
            r#"{{"mediaType":"{OCI_MANIFEST}","digest":"sha256:{}","size":1,"platform":{{"os":"linux","architecture":"{arch}"}}}}"#,
            "0".repeat(64)
        )
    }

    #[test]
    fn schema1_is_refused_by_type_and_by_version() {
        let e = Manifest::parse(
            Some("application/vnd.docker.distribution.manifest.v1+prettyjws"),
            b"{}",
            "x",
        )
        .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Unsupported);
        assert!(e.to_string().contains("schema 1"), "{e}");
        let e = Manifest::parse(None, br#"{"schemaVersion":1,"fsLayers":[]}"#, "x").unwrap_err();
        assert!(e.to_string().contains("schema 1"), "{e}");
    }

    #[test]
    fn indexes_resolve_to_the_platform() {
        let body = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{},{}]}}"#,
            desc("arm64"),
            desc("amd64")
        );
        let Manifest::Index(list) = Manifest::parse(Some(OCI_INDEX), body.as_bytes(), "x").unwrap()
        else {
            panic!("not an index")
        };
        let amd = Platform::parse("linux/amd64").unwrap();
        assert_eq!(
            select_platform(&list, &amd, "x")
                .unwrap()
                .platform
                .as_ref()
                .unwrap()
                .architecture,
            "amd64"
        );
        let e = select_platform(&list, &Platform::parse("linux/s390x").unwrap(), "x").unwrap_err();
        assert!(e.to_string().contains("linux/arm64, linux/amd64"), "{e}");
        assert!(Platform::parse("amd64").is_err());
    }

    #[test]
    fn bootc_labels_and_platform_mismatch_are_refused() {
        let cfg = ImageConfig::parse(
            br#"{"architecture":"amd64","os":"linux","config":{"Labels":{"containers.bootc":"1"}}}"#,
            "x",
        )
        .unwrap();
        let e = cfg.check(None, "x").unwrap_err();
        assert!(e.to_string().contains("bootc"), "{e}");
        let cfg = ImageConfig::parse(br#"{"architecture":"arm64","os":"linux"}"#, "x").unwrap();
        assert!(cfg.check(None, "x").is_ok());
        assert!(
            cfg.check(Some(&Platform::parse("linux/amd64").unwrap()), "x")
                .is_err()
        );
    }
}
