//! Growing a volume's raw disk image after a clone into (or an expansion to) a larger volume, as
//! CDI does it: the image is resized (`qemu-img resize`) to the smaller of the requested size and
//! the space the volume's filesystem has, each less the filesystem overhead ([`usable_space`]).
//! An image is never shrunk; a block device is left as it is (it must be at least the size asked).

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::Path;

use crate::error::{Error, Result};
use crate::import::DEFAULT_FILESYSTEM_OVERHEAD;
use crate::sink::block;
use crate::size::usable_space;

/// What a resize did, printed by `quarry resize-disk --json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ResizeReport {
    pub target: String,
    pub block_device: bool,
    /// The image's (or device's) size before and after.
    pub before: u64,
    pub after: u64,
}

impl ResizeReport {
    pub fn summary(&self) -> String {
        if self.after > self.before {
            format!(
                "grew {} from {} to {} bytes",
                self.target, self.before, self.after
            )
        } else {
            format!("{} stays at {} bytes", self.target, self.before)
        }
    }
}

/// Grows the raw image `target` for a volume of `size` bytes (`overhead`: the fraction kept for
/// the filesystem, default 0.06), or checks that block device `target` holds `size` bytes.
pub fn resize_disk(target: &Path, size: u64, overhead: Option<f64>) -> Result<ResizeReport> {
    let meta = std::fs::metadata(target)
        .map_err(|e| Error::io(format!("reading disk image {}", target.display()), e))?;
    if meta.file_type().is_block_device() {
        let device = block::device_size(target)?;
        if device < size {
            return Err(Error::TooSmall {
                needed: size,
                available: device,
                detail: format!("block device {} cannot grow", target.display()),
            });
        }
        return Ok(ResizeReport {
            target: target.display().to_string(),
            block_device: true,
            before: device,
            after: device,
        });
    }
    if !meta.is_file() {
        return Err(Error::InvalidInput(format!(
            "{} is neither a disk image file nor a block device",
            target.display()
        )));
    }
    let overhead = overhead.unwrap_or(DEFAULT_FILESYSTEM_OVERHEAD);
    if !(0.0..1.0).contains(&overhead) {
        return Err(Error::InvalidInput(format!(
            "filesystem overhead {overhead} is not a fraction in [0, 1)"
        )));
    }
    let dir = target.parent().unwrap_or(Path::new("."));
    let fs = nix::sys::statvfs::statvfs(dir).map_err(|e| {
        Error::io(
            format!("reading free space under {}", dir.display()),
            e.into(),
        )
    })?;
    // The space the image may take: what is free plus what it already holds.
    let space = (fs.blocks_available() as u64)
        .saturating_mul(fs.fragment_size() as u64)
        .saturating_add(meta.blocks() * 512);
    let after = grown_size(meta.len(), size, space, overhead);
    if after > meta.len() {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(target)
            .map_err(|e| Error::io(format!("opening {}", target.display()), e))?;
        file.set_len(after)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(format!("growing {} to {after} bytes", target.display()), e))?;
        tracing::info!(target = %target.display(), before = meta.len(), after, "disk image grown");
    }
    Ok(ResizeReport {
        target: target.display().to_string(),
        block_device: false,
        before: meta.len(),
        after,
    })
}

/// The image's new size: the requested size or, when the filesystem has less, its space, each
/// less the overhead (CDI's `ResizeImage`); never below `current`.
pub fn grown_size(current: u64, requested: u64, space: u64, overhead: f64) -> u64 {
    let wanted = usable_space(requested, overhead);
    let available = usable_space(space, overhead);
    if available < wanted {
        tracing::warn!(
            wanted,
            available,
            "less space than requested: growing to the space there is"
        );
    }
    wanted.min(available).max(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_usable_part_of_the_request_never_shrinks() {
        let gi = 1u64 << 30;
        // 2 GiB less 6%, down to a whole MiB.
        assert_eq!(grown_size(gi, 2 * gi, 100 * gi, 0.06), 1925 << 20);
        // Less room than asked: the room there is, less the overhead.
        assert_eq!(grown_size(gi, 10 * gi, 2 * gi, 0.06), 1925 << 20);
        // Never smaller than the image.
        assert_eq!(grown_size(3 * gi, 2 * gi, 100 * gi, 0.06), 3 * gi);
        assert_eq!(grown_size(gi, 2 * gi, 100 * gi, 0.0), 2 * gi);
    }

    #[test]
    fn a_file_grows_sparse_and_a_smaller_request_leaves_it() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        std::fs::write(&img, vec![1u8; 1 << 20]).unwrap();
        let r = resize_disk(&img, 64 << 20, Some(0.0)).unwrap();
        assert_eq!((r.before, r.after), (1 << 20, 64 << 20));
        let meta = std::fs::metadata(&img).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        assert!(meta.blocks() * 512 < 4 << 20, "the growth is a hole");
        let r = resize_disk(&img, 1 << 20, None).unwrap();
        assert_eq!(r.after, 64 << 20);
        let err = resize_disk(&dir.path().join("none"), 1 << 20, None).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Io);
    }
}
