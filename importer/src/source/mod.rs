//! Byte sources: where an image's bytes come from (a local file, stdin, HTTP(S), a container
//! registry's containerDisk image, an S3 object).
//!
//! A source is a blocking [`Read`] of the image exactly as stored at the source (still compressed),
//! plus what is known about it up front. Errors that cross the `Read` boundary carry a
//! [`crate::Error`] inside the `io::Error` (see [`crate::Error::into_io`]) so their kind survives.

pub mod http;
pub mod registry;
pub mod s3;

use std::io::Read;

/// What is known about a source before reading it.
#[derive(Debug, Clone, Default)]
pub struct SourceInfo {
    /// Human-readable name for messages (path or URL without credentials).
    pub name: String,
    /// Total length in bytes, when known.
    pub length: Option<u64>,
}

/// An open source of image bytes.
pub trait ByteSource: Read + Send {
    fn info(&self) -> &SourceInfo;
}
pub mod file;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// A source the caller opened itself (an upload's request body, say), handed to the import driver
/// through [`SourceSpec::Stream`]. It can be opened once; clones share it.
#[derive(Clone)]
pub struct SharedSource(Arc<Mutex<Option<Box<dyn ByteSource>>>>);

impl SharedSource {
    pub fn new(source: impl ByteSource + 'static) -> Self {
        SharedSource(Arc::new(Mutex::new(Some(Box::new(source)))))
    }

    fn take(&self) -> Result<Box<dyn ByteSource>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
            .ok_or_else(|| Error::InvalidInput("a stream source can be imported only once".into()))
    }
}

impl std::fmt::Debug for SharedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedSource")
    }
}

impl PartialEq for SharedSource {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedSource {}

/// Where an import reads from, as the user named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    Stdin,
    File(PathBuf),
    Http(String),
    /// `docker://HOST[:PORT]/NAME[:TAG|@DIGEST]`: the disk of a containerDisk image.
    Registry {
        image: String,
        options: registry::RegistryOptions,
    },
    /// `s3://BUCKET/KEY`, or CDI's `http(s)://HOST/BUCKET/KEY` when chosen explicitly.
    S3 {
        url: String,
        options: s3::S3Options,
    },
    /// Bytes the caller streams in itself (an upload); never produced by [`SourceSpec::parse`].
    Stream(SharedSource),
}

impl SourceSpec {
    pub fn parse(spec: &str) -> Result<Self> {
        if spec == "-" {
            return Ok(SourceSpec::Stdin);
        }
        let lower = spec.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            return Ok(SourceSpec::Http(spec.to_string()));
        }
        if lower.starts_with("docker://") {
            return Ok(SourceSpec::Registry {
                image: spec.to_string(),
                options: Default::default(),
            });
        }
        if lower.starts_with("s3://") {
            return Ok(SourceSpec::S3 {
                url: spec.to_string(),
                options: Default::default(),
            });
        }
        if let Some((scheme, _)) = spec.split_once("://") {
            return Err(Error::InvalidInput(format!(
                "source scheme {scheme:?} is not supported (use a path, '-', http://, https://, docker:// or s3://)"
            )));
        }
        Ok(SourceSpec::File(PathBuf::from(spec)))
    }

    /// Opens the source.
    pub fn open(&self, http: &http::HttpOptions) -> Result<Box<dyn ByteSource>> {
        Ok(match self {
            SourceSpec::Stdin => Box::new(file::FileSource::stdin()),
            SourceSpec::File(path) => Box::new(file::FileSource::open(path)?),
            SourceSpec::Http(url) => Box::new(http::HttpSource::open(url, http)?),
            SourceSpec::Registry { image, options } => {
                Box::new(registry::RegistrySource::open(image, http, options)?)
            }
            SourceSpec::S3 { url, options } => Box::new(s3::open(url, options, http)?),
            SourceSpec::Stream(shared) => shared.take()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(SourceSpec::parse("-").unwrap(), SourceSpec::Stdin);
        assert_eq!(
            SourceSpec::parse("HTTPS://h/x.img").unwrap(),
            SourceSpec::Http("HTTPS://h/x.img".into())
        );
        assert_eq!(
            SourceSpec::parse("./a:b.img").unwrap(),
            SourceSpec::File("./a:b.img".into())
        );
        assert!(matches!(
            SourceSpec::parse("docker://h.io/x:1").unwrap(),
            SourceSpec::Registry { .. }
        ));
        assert!(matches!(
            SourceSpec::parse("S3://b/k").unwrap(),
            SourceSpec::S3 { .. }
        ));
        assert_eq!(
            SourceSpec::parse("ftp://h/x").unwrap_err().kind(),
            crate::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn a_stream_source_opens_once() {
        let source = file::FileSource::open(std::path::Path::new("Cargo.toml")).unwrap();
        let spec = SourceSpec::Stream(SharedSource::new(source));
        let opts = http::HttpOptions::default();
        assert_eq!(spec.open(&opts).unwrap().info().name, "Cargo.toml");
        assert_eq!(
            spec.open(&opts).err().unwrap().kind(),
            crate::ErrorKind::InvalidInput
        );
    }
}
