//! Layers: digest verification of blobs, and the walk through layer tarballs that finds the
//! containerDisk's one disk file under `disk/` (whiteouts honoured, path traversal refused).

use std::collections::BTreeSet;
use std::io::{self, Read};

use crate::checksum::{Checksum, Hasher};
use crate::decode::{self, Compression};
use crate::error::{Error, Result};

/// Reads a blob and checks, at its end, that it had the descriptor's size and digest. The check
/// happens when [`DigestReader::finish`] is called after the last byte; more bytes than the size
/// fail at once.
pub struct DigestReader<R> {
    inner: R,
    hasher: Option<Hasher>,
    expected: Checksum,
    size: u64,
    read: u64,
    what: String,
}

impl<R: Read> DigestReader<R> {
    pub fn new(inner: R, expected: Checksum, size: u64, what: String) -> Self {
        DigestReader {
            inner,
            hasher: Some(expected.algorithm.hasher()),
            expected,
            size,
            read: 0,
            what,
        }
    }

    /// Reads what is left and verifies size and digest.
    pub fn finish(mut self) -> Result<()> {
        io::copy(&mut self, &mut io::sink()).map_err(|e| Error::from_read(e, &self.what))?;
        if self.read != self.size {
            return Err(Error::Corrupt(format!(
                "{}: {} bytes instead of the {} its descriptor gives",
                self.what, self.read, self.size
            )));
        }
        let actual = self.hasher.take().expect("finished once").finish();
        verify_digest(&self.expected, actual, &self.what)
    }
}

/// Checks a digest; a mismatch names what was digested.
pub fn verify_digest(expected: &Checksum, actual: Checksum, what: &str) -> Result<()> {
    expected.verify(&actual).map_err(|e| match e {
        Error::ChecksumMismatch {
            algorithm,
            expected,
            actual,
        } => Error::ChecksumMismatch {
            algorithm,
            expected: format!("{expected} (digest of {what})"),
            actual,
        },
        other => other,
    })
}

impl<R: Read> Read for DigestReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.size {
            return Err(Error::Corrupt(format!(
                "{}: more bytes than the {} its descriptor gives",
                self.what, self.size
            ))
            .into_io());
        }
        if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        Ok(n)
    }
}

/// The compression of a layer, from its media type (sniffed when the type does not say).
pub fn layer_compression(media_type: &str, head: &[u8]) -> Option<Compression> {
    if media_type.ends_with("+gzip") || media_type.ends_with(".tar.gzip") {
        Some(Compression::Gzip)
    } else if media_type.ends_with("+zstd") {
        Some(Compression::Zstd)
    } else if media_type.ends_with(".tar") || media_type.ends_with("diff.tar") {
        None
    } else {
        decode::detect(head).filter(|c| *c != Compression::Xz)
    }
}

/// What upper layers removed: whited-out paths and opaque directories.
#[derive(Debug, Default)]
pub struct Whiteouts {
    deleted: BTreeSet<String>,
    opaque: BTreeSet<String>,
}

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

impl Whiteouts {
    /// Records `path` if it is a whiteout; returns whether it was one.
    pub fn record(&mut self, path: &str) -> bool {
        let (dir, base) = match path.rsplit_once('/') {
            Some((d, b)) => (d, b),
            None => ("", path),
        };
        if base == OPAQUE {
            self.opaque.insert(dir.to_string());
        } else if let Some(name) = base.strip_prefix(WHITEOUT) {
            let full = if dir.is_empty() {
                name.to_string()
            } else {
                format!("{dir}/{name}")
            };
            self.deleted.insert(full);
        } else {
            return false;
        }
        true
    }

    /// True when an upper layer removed `path` (itself, an ancestor, or made an ancestor opaque).
    pub fn hides(&self, path: &str) -> bool {
        let mut prefix = String::new();
        for (i, part) in path.split('/').enumerate() {
            if self.opaque.contains(&prefix) {
                return true;
            }
            if i > 0 {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.deleted.contains(&prefix) {
                return true;
            }
        }
        false
    }

    /// Adds a lower layer's view: whiteouts of a layer apply to the layers below it only.
    pub fn merge(&mut self, lower: Whiteouts) {
        self.deleted.extend(lower.deleted);
        self.opaque.extend(lower.opaque);
    }
}

/// True for paths inside the containerDisk's `disk/` directory.
pub fn in_disk_dir(path: &str) -> bool {
    path.strip_prefix("disk/")
        .is_some_and(|rest| !rest.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whiteouts_hide_lower_paths() {
        let mut w = Whiteouts::default();
        assert!(w.record("disk/.wh.old.img"));
        assert!(!w.record("disk/new.img"));
        assert!(w.hides("disk/old.img"));
        assert!(!w.hides("disk/new.img"));
        let mut w = Whiteouts::default();
        w.record("disk/.wh..wh..opq");
        assert!(w.hides("disk/any.img"));
        assert!(!w.hides("disk"));
        let mut w = Whiteouts::default();
        w.record(".wh.disk");
        assert!(w.hides("disk/a.img"));
        assert!(!w.hides("diskette/a"));
    }

    #[test]
    fn digests_are_checked_at_the_end() {
        let data = b"layer bytes".to_vec();
        let mut h = crate::checksum::Algorithm::Sha256.hasher();
        h.update(&data);
        let good = h.finish();
        let r = DigestReader::new(&data[..], good.clone(), data.len() as u64, "blob".into());
        assert!(r.finish().is_ok());
        let mut other = data.clone();
        other[0] ^= 1;
        let r = DigestReader::new(&other[..], good.clone(), data.len() as u64, "blob".into());
        assert_eq!(
            r.finish().unwrap_err().kind(),
            crate::ErrorKind::ChecksumMismatch
        );
        let r = DigestReader::new(&data[..], good, 4, "blob".into());
        assert_eq!(
            r.finish().unwrap_err().kind(),
            crate::ErrorKind::CorruptImage
        );
    }

    #[test]
    fn compression_from_media_types() {
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+zstd", b""),
            Some(Compression::Zstd)
        );
        assert_eq!(
            layer_compression("application/vnd.docker.image.rootfs.diff.tar.gzip", b""),
            Some(Compression::Gzip)
        );
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar", b"\x1f\x8b"),
            None
        );
        assert_eq!(layer_compression("", b"\x1f\x8b"), Some(Compression::Gzip));
    }
}
