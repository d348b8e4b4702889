//! File targets (`disk.img` on a filesystem volume).
//!
//! The import writes a sparse temporary file `.NAME.quarry-partial` beside the target (zero runs
//! become holes, never written), and on commit sizes it, optionally preallocates it, syncs it and
//! renames it over the target, then syncs the directory. Until that rename the target is
//! untouched: an interrupted import leaves at most a `.quarry-partial` file, never a `disk.img`
//! that looks complete, and never loses the file the user had.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{FallocateFlags, fallocate};

use crate::error::{Error, Result};
use crate::sink::direct::{Bounce, DirectWriter};
use crate::sink::{ExtentSink, VolumeSink, for_each_run};

pub struct FileSink {
    file: File,
    /// Large writes bypass the page cache where the filesystem allows it.
    direct: Option<DirectWriter>,
    partial: PathBuf,
    target: PathBuf,
    preallocate: bool,
    data_written: u64,
}

/// The temporary name an import into `target` writes to.
pub fn partial_path(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "disk.img".into());
    target.with_file_name(format!(".{name}.quarry-partial"))
}

impl FileSink {
    /// `bounce`: the bounce buffers of the `O_DIRECT` writer.
    pub fn create(target: &Path, preallocate: bool, bounce: Bounce) -> Result<Self> {
        if target.is_dir() {
            return Err(Error::InvalidInput(format!(
                "target {} is a directory; name the image file (e.g. {}/disk.img)",
                target.display(),
                target.display()
            )));
        }
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            return Err(Error::InvalidInput(format!(
                "target directory {} does not exist",
                dir.display()
            )));
        }
        let partial = partial_path(target);
        // A stale partial file is what an earlier interrupted import left: it was never complete.
        match fs::remove_file(&partial) {
            Ok(()) => tracing::info!(path = %partial.display(), "removed a stale partial import"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("removing {}", partial.display()), e)),
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&partial)
            .map_err(|e| Error::io(format!("creating {}", partial.display()), e))?;
        Ok(FileSink {
            direct: DirectWriter::open(&partial, bounce),
            file,
            partial,
            target: target.to_path_buf(),
            preallocate,
            data_written: 0,
        })
    }

    /// Flushes the last writes, sizes, optionally preallocates and syncs the partial file.
    fn complete_partial(&mut self, size: u64) -> Result<()> {
        if let Some(direct) = self.direct.take() {
            direct
                .finish(&self.file)
                .map_err(|e| Error::io(format!("writing {}", self.partial.display()), e))?;
        }
        self.file
            .set_len(size)
            .map_err(|e| Error::io(self.ctx("sizing"), e))?;
        if self.preallocate && size > 0 {
            fallocate(&self.file, FallocateFlags::empty(), 0, size as i64)
                .map_err(|e| Error::io(self.ctx("preallocating"), e.into()))?;
        }
        self.file
            .sync_all()
            .map_err(|e| Error::io(self.ctx("syncing"), e))
    }

    /// Where the data is written until commit.
    pub fn partial(&self) -> &Path {
        &self.partial
    }

    fn ctx(&self, what: &str) -> String {
        format!("{what} {}", self.partial.display())
    }
}

/// The largest length below `too_large` that `file` can be given (to 4 KiB), found by bisection
/// of `ftruncate` (metadata only on a sparse file); the file is left empty.
fn largest_size(file: &File, too_large: u64) -> u64 {
    let (mut fits, mut fails) = (0u64, too_large);
    while fails - fits > 4096 {
        let mid = fits + (fails - fits) / 2;
        if file.set_len(mid).is_ok() {
            fits = mid;
        } else {
            fails = mid;
        }
    }
    let _ = file.set_len(0);
    fits
}

impl ExtentSink for FileSink {
    fn write_data(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        for_each_run(data, |start, end, zero| {
            if zero {
                return Ok(());
            }
            let run = &data[start..end];
            let at = offset + start as u64;
            match &mut self.direct {
                Some(direct) => direct.write_at(&self.file, run, at),
                None => self.file.write_all_at(run, at),
            }
            .map_err(|e| Error::io(format!("writing {}", self.partial.display()), e))?;
            self.data_written += run.len() as u64;
            Ok(())
        })
    }

    fn write_zeroes(&mut self, _offset: u64, _len: u64) -> Result<()> {
        // A fresh file reads zeroes wherever nothing was written.
        Ok(())
    }
}

impl VolumeSink for FileSink {
    fn device_size(&self) -> Option<u64> {
        None
    }

    fn data_written(&self) -> u64 {
        self.data_written
    }

    fn expect_size(&mut self, size: u64) -> Result<()> {
        self.file.set_len(size).map_err(|e| {
            if e.raw_os_error() == Some(libc::EFBIG) {
                Error::TooSmall {
                    needed: size,
                    available: largest_size(&self.file, size),
                    detail: format!(
                        "the filesystem holding {} does not take larger files",
                        self.target.display()
                    ),
                }
            } else {
                Error::io(self.ctx("sizing"), e)
            }
        })
    }

    fn commit(mut self: Box<Self>, size: u64) -> Result<()> {
        // A failure before the rename (a last write or the sync meeting a full disk) leaves no
        // partial file behind, as any other failed import.
        if let Err(e) = self.complete_partial(size) {
            self.abort();
            return Err(e);
        }
        if let Err(e) = fs::rename(&self.partial, &self.target) {
            let e = Error::io(
                format!(
                    "renaming {} to {}",
                    self.partial.display(),
                    self.target.display()
                ),
                e,
            );
            self.abort();
            return Err(e);
        }
        let dir = self
            .target
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(format!("syncing directory {}", dir.display()), e))
    }

    fn abort(mut self: Box<Self>) {
        // stop the writer thread before the file goes
        drop(self.direct.take());
        if let Err(e) = fs::remove_file(&self.partial) {
            tracing::warn!(path = %self.partial.display(), error = %e, "could not remove the partial import");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn nothing_appears_at_the_target_until_commit() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("disk.img");
        let mut sink = Box::new(FileSink::create(&target, false, Bounce::FULL).unwrap());
        sink.write_data(0, b"hello").unwrap();
        assert!(!target.exists());
        assert!(partial_path(&target).exists());
        sink.commit(1 << 20).unwrap();
        let data = fs::read(&target).unwrap();
        assert_eq!(data.len(), 1 << 20);
        assert_eq!(&data[..5], b"hello");
        assert!(!partial_path(&target).exists());
    }

    #[test]
    fn abort_keeps_what_the_user_had() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("disk.img");
        fs::write(&target, b"precious").unwrap();
        let mut sink = Box::new(FileSink::create(&target, false, Bounce::FULL).unwrap());
        sink.write_data(0, b"half an import").unwrap();
        sink.abort();
        assert_eq!(fs::read(&target).unwrap(), b"precious");
        assert!(!partial_path(&target).exists());
    }

    #[test]
    fn zero_runs_become_holes_and_preallocation_fills_them() {
        let dir = tempfile::tempdir().unwrap();
        let sparse = dir.path().join("sparse.img");
        let mut sink = Box::new(FileSink::create(&sparse, false, Bounce::FULL).unwrap());
        sink.write_data(0, &vec![0u8; 8 << 20]).unwrap();
        sink.write_data(8 << 20, &[1u8; 4096]).unwrap();
        sink.commit(16 << 20).unwrap();
        let allocated = fs::metadata(&sparse).unwrap().blocks() * 512;
        assert!(
            allocated <= 64 << 10,
            "sparse file allocates {allocated} bytes"
        );

        let full = dir.path().join("full.img");
        let sink = Box::new(FileSink::create(&full, true, Bounce::FULL).unwrap());
        sink.commit(16 << 20).unwrap();
        let allocated = fs::metadata(&full).unwrap().blocks() * 512;
        assert!(
            allocated >= 16 << 20,
            "preallocated file allocates {allocated} bytes"
        );
    }

    #[test]
    fn a_directory_target_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = FileSink::create(dir.path(), false, Bounce::FULL)
            .err()
            .unwrap();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidInput);
    }
}
