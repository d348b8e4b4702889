//! Direct I/O for large writes: the block-aligned middle of each write goes through an
//! `O_DIRECT` descriptor (no page-cache copy, no dirty-page writeback storm at `fsync`), the
//! unaligned edges through the ordinary descriptor of the same file. The direct writes run on a
//! writer thread with a few bounce buffers in flight, so the device works while the importer
//! parses the next data. Filesystems without `O_DIRECT` (tmpfs) simply keep buffered writes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Alignment of direct writes (offset, length and memory): the largest logical block size.
const ALIGN: usize = 4096;
/// The bounce buffers of a [`DirectWriter`]: data is copied into them so that its address is
/// aligned, and the caller fills one while the writer thread waits on the device for the others,
/// so parsing and device writes overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounce {
    pub count: usize,
    /// Bytes each; a multiple of the alignment.
    pub size: usize,
}

impl Bounce {
    /// For sources at least as fast as the device.
    pub const FULL: Bounce = Bounce {
        count: 4,
        size: 2 << 20,
    };
    /// Enough when the source is much slower than the device (xz decoding, ~250 MB/s a thread):
    /// two small buffers keep the device busy, and the memory goes to the decoder instead.
    pub const LEAN: Bounce = Bounce {
        count: 2,
        size: 256 << 10,
    };

    /// Memory the buffers take.
    pub const fn memory(self) -> usize {
        self.count * (self.size + ALIGN)
    }
}

/// Runs smaller than this stay buffered: direct I/O only pays off for large ones.
const MIN_DIRECT: usize = 64 << 10;

/// A heap buffer with an [`ALIGN`]-aligned window of `size` bytes.
struct AlignedBuf {
    mem: Vec<u8>,
    start: usize,
}

impl AlignedBuf {
    fn new(size: usize) -> Self {
        let mem = vec![0u8; size + ALIGN];
        let start = mem.as_ptr().align_offset(ALIGN);
        AlignedBuf { mem, start }
    }

    fn window(&mut self, len: usize) -> &mut [u8] {
        &mut self.mem[self.start..self.start + len]
    }
}

/// One aligned piece for the writer thread.
struct Job {
    buf: AlignedBuf,
    len: usize,
    offset: u64,
}

/// Writes the aligned middles of large writes through `O_DIRECT` on a writer thread.
///
/// Consecutive writes (a stream handed over in network frames or small chunks) are gathered in
/// a bounce buffer until it is full, so the device sees writes of a bounce buffer's size whatever
/// size the caller writes in; a write elsewhere sends what was gathered.
pub struct DirectWriter {
    /// Size of each bounce buffer.
    bounce: usize,
    jobs: Option<SyncSender<Job>>,
    free: Receiver<AlignedBuf>,
    /// Gives back a bounce buffer that was gathered into but not sent.
    unused: SyncSender<AlignedBuf>,
    /// The run being gathered.
    gather: Option<Gather>,
    /// The first error the writer thread met; later writes fail with it.
    failed: Arc<Mutex<Option<io::Error>>>,
    worker: Option<JoinHandle<()>>,
    /// Writes sent to the writer thread, for tests.
    sent: u64,
}

/// File bytes `[at, at + len)` gathered in `buf` (`at` aligned).
struct Gather {
    buf: AlignedBuf,
    at: u64,
    len: usize,
}

impl DirectWriter {
    /// Opens `path` again with `O_DIRECT`; None where the filesystem does not support it.
    pub fn open(path: &Path, bounce: Bounce) -> Option<Self> {
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()?;
        // some filesystems accept O_DIRECT at open and refuse the write: the writer falls back
        let buffered = OpenOptions::new().write(true).open(path).ok()?;
        let count = bounce.count.max(1);
        let (jobs, job_rx) = sync_channel::<Job>(count);
        let (free_tx, free) = sync_channel::<AlignedBuf>(count);
        for _ in 0..count {
            free_tx.send(AlignedBuf::new(bounce.size)).ok()?;
        }
        let unused = free_tx.clone();
        let failed = Arc::new(Mutex::new(None));
        let record = failed.clone();
        let worker = std::thread::Builder::new()
            .name("direct-write".into())
            .spawn(move || {
                for mut job in job_rx {
                    let ok = record.lock().map(|f| f.is_none()).unwrap_or(false);
                    if ok {
                        let data = job.buf.window(job.len);
                        let res = match direct.write_all_at(data, job.offset) {
                            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                                buffered.write_all_at(data, job.offset)
                            }
                            other => other,
                        };
                        if let Err(e) = res
                            && let Ok(mut f) = record.lock()
                        {
                            f.get_or_insert(e);
                        }
                    }
                    if free_tx.send(job.buf).is_err() {
                        return;
                    }
                }
            })
            .ok()?;
        Some(DirectWriter {
            bounce: bounce.size,
            jobs: Some(jobs),
            free,
            unused,
            gather: None,
            failed,
            worker: Some(worker),
            sent: 0,
        })
    }

    fn check(&self) -> io::Result<()> {
        match self.failed.lock() {
            Ok(f) => match f.as_ref() {
                Some(e) => Err(io::Error::new(e.kind(), e.to_string())),
                None => Ok(()),
            },
            Err(_) => Err(io::Error::other("the direct writer thread panicked")),
        }
    }

    /// Writes `data` at `offset`: its aligned middle directly (gathered, then queued to the
    /// writer thread), its edges through `buffered`. Everything is in the file only after
    /// [`DirectWriter::finish`].
    pub fn write_at(
        &mut self,
        buffered: &File,
        mut data: &[u8],
        mut offset: u64,
    ) -> io::Result<()> {
        self.check()?;
        if self
            .gather
            .as_ref()
            .is_some_and(|g| g.at + g.len as u64 != offset)
        {
            self.flush(buffered)?;
        }
        if self.gather.is_none() {
            // A run starts: its unaligned head goes through the page cache.
            let head = ((offset.next_multiple_of(ALIGN as u64) - offset) as usize).min(data.len());
            buffered.write_all_at(&data[..head], offset)?;
            (data, offset) = (&data[head..], offset + head as u64);
        }
        while !data.is_empty() {
            if self.gather.is_none() {
                let buf = self.free.recv().map_err(|_| lost())?;
                self.gather = Some(Gather {
                    buf,
                    at: offset,
                    len: 0,
                });
            }
            let g = self.gather.as_mut().expect("gathering");
            let n = (self.bounce - g.len).min(data.len());
            g.buf.window(g.len + n)[g.len..].copy_from_slice(&data[..n]);
            g.len += n;
            (data, offset) = (&data[n..], offset + n as u64);
            if g.len == self.bounce {
                let full = self.gather.take().expect("gathering");
                self.send(full.buf, full.len, full.at)?;
            }
        }
        Ok(())
    }

    fn send(&mut self, buf: AlignedBuf, len: usize, offset: u64) -> io::Result<()> {
        let jobs = self.jobs.as_ref().ok_or_else(lost)?;
        jobs.send(Job { buf, len, offset }).map_err(|_| lost())?;
        self.sent += 1;
        Ok(())
    }

    /// Sends the gathered run: its aligned part directly (through the page cache when it is too
    /// small to pay off), its unaligned tail through `buffered`.
    fn flush(&mut self, buffered: &File) -> io::Result<()> {
        let Some(mut g) = self.gather.take() else {
            return Ok(());
        };
        let aligned = g.len / ALIGN * ALIGN;
        let bytes = g.buf.window(g.len);
        buffered.write_all_at(&bytes[aligned..], g.at + aligned as u64)?;
        if aligned >= MIN_DIRECT {
            return self.send(g.buf, aligned, g.at);
        }
        buffered.write_all_at(&bytes[..aligned], g.at)?;
        self.unused.send(g.buf).map_err(|_| lost())
    }

    /// Writes what is gathered and waits for every queued write; the first error any of them met.
    pub fn finish(mut self, buffered: &File) -> io::Result<()> {
        let flushed = self.flush(buffered);
        self.stop();
        flushed.and(self.check())
    }

    fn stop(&mut self) {
        drop(self.jobs.take());
        if let Some(w) = self.worker.take()
            && w.join().is_err()
            && let Ok(mut f) = self.failed.lock()
        {
            f.get_or_insert(io::Error::other("the direct writer thread panicked"));
        }
    }
}

fn lost() -> io::Error {
    io::Error::other("the direct writer thread stopped")
}

impl Drop for DirectWriter {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new file in a temporary directory, its buffered descriptor and a direct writer to it;
    /// None where the filesystem has no `O_DIRECT`.
    fn open(bounce: Bounce) -> Option<(tempfile::TempDir, std::path::PathBuf, File, DirectWriter)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let Some(direct) = DirectWriter::open(&path, bounce) else {
            eprintln!("skipping: no O_DIRECT on this filesystem");
            return None;
        };
        Some((dir, path, buffered, direct))
    }

    #[test]
    fn unaligned_writes_land_exactly() {
        for bounce in [Bounce::FULL, Bounce::LEAN] {
            let Some((_dir, path, buffered, mut direct)) = open(bounce) else {
                return;
            };
            buffered.set_len(16 << 20).unwrap();
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
            direct.finish(&buffered).unwrap();
            buffered.sync_all().unwrap();
            assert!(std::fs::read(&path).unwrap() == expected, "{bounce:?}");
        }
    }

    /// A stream handed over in small pieces reaches the device in bounce-buffer-sized writes,
    /// and a write elsewhere, a small one included, lands too.
    #[test]
    fn consecutive_small_writes_are_gathered_into_full_buffers() {
        let Some((_dir, path, buffered, mut direct)) = open(Bounce::FULL) else {
            return;
        };
        let mut expected = vec![0u8; 12 << 20];
        // 4 MiB + 5000 bytes from offset 100, in 5000-byte pieces: a 3996-byte head, two full
        // buffers, 1104 bytes left over
        let mut at = 100usize;
        for i in 0.. {
            let len = 5000.min(100 + (4 << 20) + 5000 - at);
            if len == 0 {
                break;
            }
            let data = vec![(i % 250) as u8 + 1; len];
            direct.write_at(&buffered, &data, at as u64).unwrap();
            expected[at..at + len].copy_from_slice(&data);
            at += len;
        }
        // two full buffers so far; the rest waits for more
        assert_eq!(direct.sent, 2);
        // a lone small write elsewhere sends the gathered rest
        direct.write_at(&buffered, &[9; 300], 10 << 20).unwrap();
        expected[(10 << 20)..(10 << 20) + 300].fill(9);
        assert_eq!(
            direct.sent, 2,
            "a gathered rest under 64 KiB goes through the page cache"
        );
        direct.finish(&buffered).unwrap();
        buffered.sync_all().unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), (10 << 20) + 300);
        assert!(got == expected[..got.len()]);
    }
}
