//! What decoding a compressed image's data costs, measured apart from any writing: the decode
//! bound of the benchmark's compressed qcow2 and streamOptimized vmdk rows
//! (`examples/inflate_cost.rs`, used by `bench/import_bench.py`).

use std::time::Duration;

use crate::error::{Error, Result};

/// What inflating the compressed pieces (qcow2 clusters, vmdk grains) of an image costs on one
/// thread, nothing written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InflateCost {
    /// Compressed pieces inflated.
    pub pieces: u64,
    /// Host bytes read for them.
    pub compressed_bytes: u64,
    pub inflated_bytes: u64,
    /// CPU time of the inflating alone (reading the compressed bytes is not counted).
    pub cpu: Duration,
}

impl InflateCost {
    /// Runs `inflate`, which inflates `pieces` pieces of `compressed` bytes and returns what it
    /// made with the length of its output, and counts it.
    pub(crate) fn measure<T>(
        &mut self,
        pieces: u64,
        compressed: usize,
        inflate: impl FnOnce() -> Result<(T, usize)>,
    ) -> Result<T> {
        let started = thread_cpu()?;
        let (made, inflated) = inflate()?;
        self.cpu += thread_cpu()?.saturating_sub(started);
        self.pieces += pieces;
        self.compressed_bytes += compressed as u64;
        self.inflated_bytes += inflated as u64;
        Ok(made)
    }
}

/// CPU time the calling thread has used.
fn thread_cpu() -> Result<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Err(Error::io(
            "reading the thread's CPU time",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}
