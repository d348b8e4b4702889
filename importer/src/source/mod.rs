//! Byte sources: where an image's bytes come from (a local file, stdin, HTTP(S), a container
//! registry's containerDisk image, an S3 or GCS object).
//!
//! A source is a blocking [`Read`] of the image exactly as stored at the source (still compressed),
//! plus what is known about it up front. Errors that cross the `Read` boundary carry a
//! [`crate::Error`] inside the `io::Error` (see [`crate::Error::into_io`]) so their kind survives.

pub mod chunked;
pub mod gcs;
pub mod http;
mod object;
pub mod registry;
pub mod s3;

use std::io::Read;

pub use chunked::ChunkSource;

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

    /// The source's bytes as the chunks its producer thread sends, when they come that way (an
    /// HTTP transfer, a registry's layer walk, an upload's body): the import then reads them
    /// straight from that one channel instead of through a stage of its own. Taking them leaves
    /// the source empty.
    fn take_chunks(&mut self) -> Option<crate::chunks::ChunkReader> {
        None
    }
}
pub mod file;

/// No bytes: a blank disk is an import of nothing into a volume of the requested size.
pub struct Blank(SourceInfo);

impl Default for Blank {
    fn default() -> Self {
        Blank(SourceInfo {
            name: "blank".into(),
            length: Some(0),
        })
    }
}

impl Read for Blank {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        Ok(0)
    }
}

impl ByteSource for Blank {
    fn info(&self) -> &SourceInfo {
        &self.0
    }
}

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Runs `fut` to completion on a fresh current-thread runtime on a thread of its own: network
/// work (a registry's resolution, a new token) from code that may or may not run in a runtime.
pub(crate) fn run_async<T: Send>(fut: impl Future<Output = Result<T>> + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::io("starting a network runtime", e))?;
            rt.block_on(fut)
        })
        .join()
        .unwrap_or_else(|_| Err(Error::SourceUnavailable("a network thread panicked".into())))
    })
}

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
    /// `gs://BUCKET/OBJECT`, or CDI's `http(s)://HOST/BUCKET/OBJECT` when chosen explicitly.
    Gcs {
        url: String,
        options: gcs::GcsOptions,
    },
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
        if lower.starts_with("gs://") {
            return Ok(SourceSpec::Gcs {
                url: spec.to_string(),
                options: Default::default(),
            });
        }
        if let Some((scheme, _)) = spec.split_once("://") {
            return Err(Error::InvalidInput(format!(
                "source scheme {scheme:?} is not supported (use a path, '-', http://, https://, docker://, s3:// or gs://)"
            )));
        }
        Ok(SourceSpec::File(PathBuf::from(spec)))
    }

    /// The path of a local file source.
    pub fn local_file(&self) -> Option<&Path> {
        match self {
            SourceSpec::File(path) => Some(path),
            _ => None,
        }
    }

    /// Opens the source.
    pub fn open(&self, http: &http::HttpOptions) -> Result<Box<dyn ByteSource>> {
        Ok(match self {
            SourceSpec::Stdin => Box::new(file::FileSource::stdin()),
            SourceSpec::File(path) => Box::new(file::FileSource::open(path)?),
            SourceSpec::Http(url) => Box::new(http::HttpSource::open(url, http)?),
            SourceSpec::Registry { image, options } => {
                Box::new(registry::open(image, http, options)?)
            }
            SourceSpec::S3 { url, options } => Box::new(s3::open(url, options, http)?),
            SourceSpec::Gcs { url, options } => Box::new(gcs::open(url, options, http)?),
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
        assert!(matches!(
            SourceSpec::parse("GS://b/dir/o").unwrap(),
            SourceSpec::Gcs { .. }
        ));
        assert_eq!(
            SourceSpec::parse("ftp://h/x").unwrap_err().kind(),
            crate::ErrorKind::InvalidInput
        );
    }
}
