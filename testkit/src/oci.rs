//! containerDisk images built without a container engine: tar layers (entries owned by 107:107,
//! as KubeVirt's containerDisks have them), gzip or zstd, image configs, manifests, indexes and
//! an OCI image layout that `skopeo copy oci:DIR:TAG ...` pushes to a registry.
//!
//! Layers can hold what real tools refuse to write (`..` in names, whiteouts, symlinks), so
//! importers can be tested against hostile images.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// One member of a layer tarball.
#[derive(Clone, Debug)]
pub enum Entry {
    /// A regular file (mode 0644).
    File(String, Vec<u8>),
    Dir(String),
    Symlink(String, String),
    /// A regular file whose name is written as is (no sanitising: `disk/../../x`).
    RawName(Vec<u8>, Vec<u8>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// A layer: entries plus how the tarball is compressed.
#[derive(Clone, Debug)]
pub struct Layer {
    pub entries: Vec<Entry>,
    pub compression: Compression,
}

impl Layer {
    pub fn new(compression: Compression, entries: Vec<Entry>) -> Layer {
        Layer {
            entries,
            compression,
        }
    }

    /// A gzip layer holding `disk/` and `disk/NAME` with `data`: a containerDisk's layer.
    pub fn disk(name: &str, data: Vec<u8>) -> Layer {
        Layer::new(
            Compression::Gzip,
            vec![
                Entry::Dir("disk".into()),
                Entry::File(format!("disk/{name}"), data),
            ],
        )
    }

    /// The uncompressed tarball.
    pub fn tar(&self) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in &self.entries {
            let mut h = tar::Header::new_gnu();
            h.set_uid(107);
            h.set_gid(107);
            h.set_mtime(0);
            match e {
                Entry::File(path, data) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(0o644);
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, path, &data[..]).expect("tar file");
                }
                Entry::Dir(path) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    b.append_data(&mut h, path, &[][..]).expect("tar dir");
                }
                Entry::Symlink(path, target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    b.append_link(&mut h, path, target).expect("tar symlink");
                }
                Entry::RawName(name, data) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(0o644);
                    h.set_size(data.len() as u64);
                    let field = &mut h.as_old_mut().name;
                    assert!(name.len() < field.len(), "raw names must fit 100 bytes");
                    field[..name.len()].copy_from_slice(name);
                    h.set_cksum();
                    b.append(&h, &data[..]).expect("tar raw entry");
                }
            }
        }
        b.into_inner().expect("finishing the tarball")
    }

    /// `(compressed blob, uncompressed tarball, media type)`.
    pub fn blob(&self) -> (Vec<u8>, Vec<u8>, &'static str) {
        let tar = self.tar();
        match self.compression {
            Compression::None => (tar.clone(), tar, "application/vnd.oci.image.layer.v1.tar"),
            Compression::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(&tar).unwrap();
                (
                    e.finish().unwrap(),
                    tar,
                    "application/vnd.oci.image.layer.v1.tar+gzip",
                )
            }
            Compression::Zstd => (
                zstd::encode_all(&tar[..], 3).unwrap(),
                tar,
                "application/vnd.oci.image.layer.v1.tar+zstd",
            ),
        }
    }
}

/// An image: layers bottom first, its platform and config labels.
#[derive(Clone, Debug)]
pub struct Image {
    pub layers: Vec<Layer>,
    pub os: String,
    pub architecture: String,
    pub labels: Vec<(String, String)>,
}

impl Image {
    pub fn new(layers: Vec<Layer>) -> Image {
        Image {
            layers,
            os: "linux".into(),
            architecture: "amd64".into(),
            labels: Vec::new(),
        }
    }

    pub fn arch(mut self, arch: &str) -> Image {
        self.architecture = arch.into();
        self
    }

    pub fn label(mut self, k: &str, v: &str) -> Image {
        self.labels.push((k.into(), v.into()));
        self
    }
}

/// A blob's descriptor.
#[derive(Clone, Debug)]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

impl Descriptor {
    fn json(&self, extra: &str) -> String {
        format!(
            r#"{{"mediaType":"{}","digest":"{}","size":{}{extra}}}"#,
            self.media_type, self.digest, self.size
        )
    }
}

pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// An OCI image layout directory (`oci-layout`, `index.json`, `blobs/sha256/`).
pub struct OciLayout {
    dir: PathBuf,
    tags: Vec<(String, Descriptor)>,
}

impl OciLayout {
    pub fn create(dir: &Path) -> OciLayout {
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let l = OciLayout {
            dir: dir.to_path_buf(),
            tags: Vec::new(),
        };
        l.write_index();
        l
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stores a blob; returns its descriptor.
    pub fn blob(&self, media_type: &str, data: &[u8]) -> Descriptor {
        let digest = sha256_digest(data);
        let hex = digest.trim_start_matches("sha256:");
        std::fs::write(self.dir.join("blobs/sha256").join(hex), data).unwrap();
        Descriptor {
            media_type: media_type.into(),
            digest,
            size: data.len() as u64,
        }
    }

    /// Stores an image's layers, config and manifest; returns the manifest's descriptor.
    pub fn image(&self, image: &Image) -> Descriptor {
        let mut layers = Vec::new();
        let mut diff_ids = Vec::new();
        for layer in &image.layers {
            let (blob, tar, media_type) = layer.blob();
            diff_ids.push(format!("\"{}\"", sha256_digest(&tar)));
            layers.push(self.blob(media_type, &blob));
        }
        let labels: Vec<String> = image
            .labels
            .iter()
            .map(|(k, v)| format!("\"{k}\":\"{v}\""))
            .collect();
        let history: Vec<&str> = image
            .layers
            .iter()
            .map(|_| r#"{"created":"1970-01-01T00:00:00Z","created_by":"testkit"}"#)
            .collect();
        let config = format!(
            r#"{{"architecture":"{}","os":"{}","config":{{"Labels":{{{}}}}},"rootfs":{{"type":"layers","diff_ids":[{}]}},"history":[{}]}}"#,
            image.architecture,
            image.os,
            labels.join(","),
            diff_ids.join(","),
            history.join(",")
        );
        let config = self.blob(OCI_CONFIG, config.as_bytes());
        let layer_json: Vec<String> = layers.iter().map(|d| d.json("")).collect();
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{},"layers":[{}]}}"#,
            config.json(""),
            layer_json.join(",")
        );
        self.blob(OCI_MANIFEST, manifest.as_bytes())
    }

    /// Stores an index of `(manifest, image)` pairs (platforms from the images).
    pub fn index(&self, entries: &[(Descriptor, &Image)]) -> Descriptor {
        let manifests: Vec<String> = entries
            .iter()
            .map(|(d, img)| {
                d.json(&format!(
                    r#","platform":{{"os":"{}","architecture":"{}"}}"#,
                    img.os, img.architecture
                ))
            })
            .collect();
        let index = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{}]}}"#,
            manifests.join(",")
        );
        self.blob(OCI_INDEX, index.as_bytes())
    }

    /// Names `desc` as `tag` in `index.json`.
    pub fn tag(&mut self, tag: &str, desc: &Descriptor) {
        self.tags.push((tag.into(), desc.clone()));
        self.write_index();
    }

    /// Stores and tags an image in one go.
    pub fn add(&mut self, tag: &str, image: &Image) -> Descriptor {
        let d = self.image(image);
        self.tag(tag, &d);
        d
    }

    fn write_index(&self) {
        let manifests: Vec<String> = self
            .tags
            .iter()
            .map(|(t, d)| {
                d.json(&format!(
                    r#","annotations":{{"org.opencontainers.image.ref.name":"{t}"}}"#
                ))
            })
            .collect();
        std::fs::write(
            self.dir.join("index.json"),
            format!(
                r#"{{"schemaVersion":2,"manifests":[{}]}}"#,
                manifests.join(",")
            ),
        )
        .unwrap();
    }
}
