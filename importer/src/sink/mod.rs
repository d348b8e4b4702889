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
