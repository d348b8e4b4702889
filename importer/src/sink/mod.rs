//! Volume sinks: where the guest bytes of an image land.
//!
//! Format readers describe the guest disk as extents through [`ExtentSink`]; a [`VolumeSink`] is an
//! extent sink bound to a real target (a `disk.img` file or a block device) that can be committed
//! (synced, and only then made to look complete) or aborted.

use crate::error::Result;

/// Receives the guest disk as extents.
///
/// Contract for format readers: every guest byte in `[0, virtual_size)` is reported exactly once,
/// either as data or as zeroes, in any order. Offsets are guest offsets.
pub trait ExtentSink {
    /// Guest bytes `[offset, offset + data.len())` hold `data`.
    fn write_data(&mut self, offset: u64, data: &[u8]) -> Result<()>;
    /// Guest bytes `[offset, offset + len)` read as zeroes.
    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()>;
}

pub mod block;
pub mod direct;
pub mod file;

use std::sync::atomic::Ordering;

use crate::error::Error;
use crate::progress::Progress;

/// An [`ExtentSink`] bound to a real target, which can be committed or aborted.
pub trait VolumeSink: ExtentSink + Send {
    /// The fixed capacity of the target (a block device's size); `None` for files, which grow.
    fn device_size(&self) -> Option<u64>;
    /// Data bytes written so far: the non-zero [`ZERO_BLOCK`] runs of data extents, so the same
    /// image counts the same whichever reader reported its zeroes (holes are never counted).
    fn data_written(&self) -> u64;
    /// Told the virtual size before any write, when it is known: a file is sized up front so
    /// that writes do not extend it (and journal a new size) one by one.
    fn expect_size(&mut self, _size: u64) -> Result<()> {
        Ok(())
    }
    /// Makes the result final: sized to `size` (files), synced, and only then visible as complete.
    fn commit(self: Box<Self>, size: u64) -> Result<()>;
    /// Gives up: removes what the import wrote where it can (never anything the user had).
    fn abort(self: Box<Self>);
}

/// Granularity of zero detection in data: runs of this many zero bytes are not written.
pub const ZERO_BLOCK: usize = 4096;

/// True when every byte of `data` is zero.
pub fn is_zero(data: &[u8]) -> bool {
    // OR-folding fixed-size chunks vectorises; an early-exit byte loop does not.
    let mut chunks = data.chunks_exact(64);
    for chunk in &mut chunks {
        if chunk.iter().fold(0u8, |acc, &b| acc | b) != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == 0)
}

/// Calls `f(start, end, zero)` for the consecutive runs of `data`, split at [`ZERO_BLOCK`]
/// boundaries of the buffer into zero and non-zero runs.
pub fn for_each_run(
    data: &[u8],
    mut f: impl FnMut(usize, usize, bool) -> Result<()>,
) -> Result<()> {
    let mut run_start = 0;
    let mut run_zero = None;
    for (i, block) in data.chunks(ZERO_BLOCK).enumerate() {
        let zero = is_zero(block);
        let start = i * ZERO_BLOCK;
        match run_zero {
            Some(z) if z == zero => {}
            Some(z) => {
                f(run_start, start, z)?;
                run_start = start;
                run_zero = Some(zero);
            }
            None => run_zero = Some(zero),
        }
    }
    if let Some(z) = run_zero {
        f(run_start, data.len(), z)?;
    }
    Ok(())
}

/// The bytes of `data` in non-zero [`ZERO_BLOCK`] runs: what a sparse target stores of it.
pub fn data_len(data: &[u8]) -> u64 {
    let mut len = 0;
    let _ = for_each_run(data, |start, end, zero| {
        if !zero {
            len += (end - start) as u64;
        }
        Ok(())
    });
    len
}

/// Enforces the usable size of the target and counts written guest bytes for progress.
pub struct Bounded<'a> {
    pub inner: &'a mut dyn VolumeSink,
    /// Guest bytes beyond this do not fit the target.
    pub limit: Option<u64>,
    pub progress: &'a Progress,
}

impl Bounded<'_> {
    fn check(&self, offset: u64, len: u64) -> Result<()> {
        let end = offset.checked_add(len).ok_or_else(|| {
            Error::Corrupt(format!("extent at {offset} of {len} bytes overflows"))
        })?;
        match self.limit {
            Some(limit) if end > limit => Err(Error::TooSmall {
                needed: end,
                available: limit,
                // Only an image whose size is unknown until its stream ends gets this far.
                detail: "its size is known only at the end of its stream (a fixed vhd's footer, \
                         a compressed raw image), and its data reached that many bytes as it was \
                         written"
                    .into(),
            }),
            _ => Ok(()),
        }
    }
}

impl ExtentSink for Bounded<'_> {
    fn write_data(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        self.inner.write_data(offset, data)?;
        self.progress
            .written
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.progress
            .data_written
            .store(self.inner.data_written(), Ordering::Relaxed);
        Ok(())
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        self.inner.write_zeroes(offset, len)?;
        self.progress.written.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(data: &[u8]) -> Vec<(usize, usize, bool)> {
        let mut out = Vec::new();
        for_each_run(data, |s, e, z| {
            out.push((s, e, z));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn is_zero_sees_a_single_nonzero_byte_anywhere() {
        for len in [0usize, 1, 63, 64, 65, 4096] {
            let mut data = vec![0u8; len];
            assert!(is_zero(&data));
            for pos in [0, len / 2, len.saturating_sub(1)] {
                if len > 0 {
                    data[pos] = 1;
                    assert!(!is_zero(&data), "len {len} pos {pos}");
                    data[pos] = 0;
                }
            }
        }
    }

    #[test]
    fn runs_cover_the_buffer_and_alternate() {
        let mut data = vec![0u8; 5 * ZERO_BLOCK + 10];
        data[ZERO_BLOCK + 5] = 1;
        data[2 * ZERO_BLOCK] = 1;
        data[5 * ZERO_BLOCK + 9] = 1;
        assert_eq!(
            runs(&data),
            [
                (0, ZERO_BLOCK, true),
                (ZERO_BLOCK, 3 * ZERO_BLOCK, false),
                (3 * ZERO_BLOCK, 5 * ZERO_BLOCK, true),
                (5 * ZERO_BLOCK, 5 * ZERO_BLOCK + 10, false),
            ]
        );
        assert!(runs(&[]).is_empty());
    }
}
