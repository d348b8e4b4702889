//! Direct I/O for large writes: the block-aligned middle of each write goes through an
//! `O_DIRECT` descriptor (no page-cache copy, no dirty-page writeback storm at `fsync`), the
//! unaligned edges through the ordinary descriptor of the same file. Filesystems without
//! `O_DIRECT` (tmpfs) simply keep buffered writes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Alignment of direct writes (offset, length and memory): the largest logical block size.
const ALIGN: usize = 4096;
/// Bounce buffer size: data is copied here so that its address is aligned.
const BOUNCE: usize = 4 << 20;
/// Writes smaller than this stay buffered: direct I/O only pays off for large ones.
const MIN_DIRECT: usize = 64 << 10;

pub struct DirectWriter {
    file: File,
    bounce: Vec<u8>,
    /// Where the aligned part of `bounce` starts.
    start: usize,
}

impl DirectWriter {
    /// Opens `path` again with `O_DIRECT`; None where the filesystem does not support it.
    pub fn open(path: &Path) -> Option<Self> {
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()?;
        let bounce = vec![0u8; BOUNCE + ALIGN];
        let start = bounce.as_ptr().align_offset(ALIGN);
        Some(DirectWriter {
            file,
            bounce,
            start,
        })
    }

    /// Writes `data` at `offset`: its aligned middle directly, its edges through `buffered`.
    pub fn write_at(&mut self, buffered: &File, data: &[u8], offset: u64) -> io::Result<()> {
        let end = offset + data.len() as u64;
        let mid_start = offset.next_multiple_of(ALIGN as u64);
        let mid_end = end / ALIGN as u64 * ALIGN as u64;
        if data.len() < MIN_DIRECT || mid_end <= mid_start {
            return buffered.write_all_at(data, offset);
        }
        let head = (mid_start - offset) as usize;
        let tail = (end - mid_end) as usize;
        buffered.write_all_at(&data[..head], offset)?;
        let middle = &data[head..data.len() - tail];
        for (i, piece) in middle.chunks(BOUNCE).enumerate() {
            let aligned = &mut self.bounce[self.start..self.start + piece.len()];
            aligned.copy_from_slice(piece);
            if let Err(e) = self
                .file
                .write_all_at(aligned, mid_start + (i * BOUNCE) as u64)
            {
                // Some filesystems accept O_DIRECT at open and refuse the write: fall back.
                if e.raw_os_error() == Some(libc::EINVAL) {
                    return buffered.write_all_at(data, offset);
                }
                return Err(e);
            }
        }
        buffered.write_all_at(&data[data.len() - tail..], mid_end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_writes_land_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        buffered.set_len(16 << 20).unwrap();
        let Some(mut direct) = DirectWriter::open(&path) else {
            eprintln!("skipping: no O_DIRECT on this filesystem");
            return;
        };
        let mut expected = vec![0u8; 16 << 20];
        for (offset, len, byte) in [
            (1000u64, 200_000usize, 1u8),
            (4096, 5 << 20, 2),
            (7 << 20, 100, 3),
            ((9 << 20) + 17, (3 << 20) + 5, 4),
        ] {
            let data = vec![byte; len];
            direct.write_at(&buffered, &data, offset).unwrap();
            expected[offset as usize..offset as usize + len].copy_from_slice(&data);
        }
        buffered.sync_all().unwrap();
        assert!(std::fs::read(&path).unwrap() == expected);
    }
}
