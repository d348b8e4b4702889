//! Block device targets.
//!
//! A device cannot be renamed into place, so completeness is guarded by its head: the first
//! [`HEAD_LEN`] bytes (partition table, boot sector, filesystem superblocks) are zeroed and synced
//! before anything else is written, held in memory during the import, and written (then synced)
//! only on commit. An interrupted import leaves a device whose head reads as zeroes, which no
//! bootloader, partition tool or filesystem mistakes for a finished disk.
//!
//! Zero extents are zeroed with `BLKZEROOUT` (offloaded to the device where it can), unless the
//! caller knows the device already reads zeroes ([`ZeroMode::AssumeZeroed`], `--no-zero`).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::sink::{ExtentSink, VolumeSink, data_len, for_each_run};

/// Bytes at the start of the device written last.
pub const HEAD_LEN: u64 = 1 << 20;

nix::ioctl_read!(blk_get_size64, 0x12, 114, u64);
nix::ioctl_write_ptr_bad!(blk_zero_out, nix::request_code_none!(0x12, 127), [u64; 2]);

/// How zero extents reach the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroMode {
    /// Zero them explicitly: the device may hold old data.
    Explicit,
    /// Skip them: the user says the device already reads zeroes.
    AssumeZeroed,
}

pub struct BlockSink {
    device: File,
    path: PathBuf,
    size: u64,
    zero_mode: ZeroMode,
    head: Vec<u8>,
    data_written: u64,
}

/// True when `path` is a block device.
pub fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// The size of the block device at `path`, read without opening it for writing.
pub fn device_size(path: &Path) -> Result<u64> {
    let device = File::open(path)
        .map_err(|e| Error::io(format!("opening block device {}", path.display()), e))?;
    ioctl_size(&device).map_err(|e| Error::io(format!("reading the size of {}", path.display()), e))
}

fn ioctl_size(device: &File) -> std::io::Result<u64> {
    let mut size = 0u64;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid for writes.
    unsafe { blk_get_size64(device.as_raw_fd(), &mut size) }?;
    Ok(size)
}

impl BlockSink {
    pub fn open(path: &Path, zero_mode: ZeroMode) -> Result<Self> {
        // O_EXCL on a block device fails while it is mounted or held by another exclusive opener.
        let device = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_EXCL)
            .open(path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    Error::InvalidInput(format!(
                        "block device {} is in use (mounted or opened exclusively)",
                        path.display()
                    ))
                } else {
                    Error::io(format!("opening block device {}", path.display()), e)
                }
            })?;
        let size = ioctl_size(&device)
            .map_err(|e| Error::io(format!("reading the size of {}", path.display()), e))?;
        let head_len = HEAD_LEN.min(size);
        let mut sink = BlockSink {
            device,
            path: path.to_path_buf(),
            size,
            zero_mode,
            head: vec![0u8; head_len as usize],
            data_written: 0,
        };
        sink.zero_range(0, head_len)?;
        sink.device
            .sync_data()
            .map_err(|e| Error::io(sink.ctx("syncing"), e))?;
        Ok(sink)
    }

    fn ctx(&self, what: &str) -> String {
        format!("{what} block device {}", self.path.display())
    }

    /// Zeroes `[offset, offset + len)` on the device: BLKZEROOUT for the 512-byte aligned middle,
    /// plain writes for unaligned edges.
    fn zero_range(&mut self, offset: u64, len: u64) -> Result<()> {
        const SECTOR: u64 = 512;
        let end = offset + len;
        let aligned_start = offset.div_ceil(SECTOR) * SECTOR;
        let aligned_end = end / SECTOR * SECTOR;
        if aligned_start >= aligned_end {
            return self.write_zero_bytes(offset, len);
        }
        self.write_zero_bytes(offset, aligned_start - offset)?;
        let range = [aligned_start, aligned_end - aligned_start];
        // SAFETY: BLKZEROOUT reads two u64 (start, length) through the pointer.
        unsafe { blk_zero_out(self.device.as_raw_fd(), &range) }
            .map_err(|e| Error::io(self.ctx("zeroing"), e.into()))?;
        self.write_zero_bytes(aligned_end, end - aligned_end)
    }

    fn write_zero_bytes(&self, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.device
            .write_all_at(&vec![0u8; len as usize], offset)
            .map_err(|e| Error::io(self.ctx("writing"), e))
    }

    /// Splits off the part of an extent that lies in the held head; returns the rest's start.
    fn split_head(&self, offset: u64, len: u64) -> u64 {
        let head_len = self.head.len() as u64;
        if offset >= head_len {
            offset
        } else {
            head_len.min(offset + len)
        }
    }
}

impl ExtentSink for BlockSink {
    fn write_data(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let rest = self.split_head(offset, data.len() as u64);
        let in_head = (rest - offset) as usize;
        if in_head > 0 {
            self.head[offset as usize..rest as usize].copy_from_slice(&data[..in_head]);
        }
        let (head, data) = data.split_at(in_head);
        // A device that may hold old data gets the zeroes inside data written too.
        let whole = self.zero_mode == ZeroMode::Explicit;
        if whole {
            self.device
                .write_all_at(data, rest)
                .map_err(|e| Error::io(self.ctx("writing"), e))?;
        }
        let mut nonzero = data_len(head);
        for_each_run(data, |start, end, zero| {
            if zero {
                return Ok(());
            }
            nonzero += (end - start) as u64;
            if whole {
                return Ok(());
            }
            self.device
                .write_all_at(&data[start..end], rest + start as u64)
                .map_err(|e| Error::io(self.ctx("writing"), e))
        })?;
        self.data_written += nonzero;
        Ok(())
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
        // The held head starts zeroed, and each head byte is reported once.
        let rest = self.split_head(offset, len);
        let remaining = offset + len - rest;
        if self.zero_mode == ZeroMode::AssumeZeroed || remaining == 0 {
            return Ok(());
        }
        self.zero_range(rest, remaining)
    }
}

impl VolumeSink for BlockSink {
    fn device_size(&self) -> Option<u64> {
        Some(self.size)
    }

    fn data_written(&self) -> u64 {
        self.data_written
    }

    fn commit(self: Box<Self>, _size: u64) -> Result<()> {
        self.device
            .sync_data()
            .map_err(|e| Error::io(self.ctx("syncing"), e))?;
        self.device
            .write_all_at(&self.head, 0)
            .map_err(|e| Error::io(self.ctx("writing the head of"), e))?;
        self.device
            .sync_data()
            .map_err(|e| Error::io(self.ctx("syncing"), e))
    }

    fn abort(self: Box<Self>) {
        // The head stays zeroed: the device does not look like a finished disk.
        let _ = self.device.sync_data();
    }
}
