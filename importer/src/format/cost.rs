//! What decoding a compressed image's data costs, measured apart from any writing: the decode
//! bound of the benchmark's compressed qcow2 and streamOptimized vmdk rows
//! (`examples/inflate_cost.rs`, used by `bench/import_bench.py`).
//!
//! The cost is also kept per stretch of the image, in image order: an importer with bounded
//! memory can decode ahead of the device only by what it holds, so where the image does not
//! compress the device bounds it while the cores idle, and where it compresses well the cores
//! bound it while the device idles. The benchmark's phased bound adds up, stretch by stretch, the
//! slower of decoding and writing.

use std::time::Duration;

use crate::error::{Error, Result};

/// How much image a stretch covers: it ends once 64 MiB were read or written, the most a
/// bounded-memory importer could hold between decoding and writing (quarry holds far less).
pub const STRETCH: u64 = 64 << 20;

/// What inflating the compressed pieces (qcow2 clusters, vmdk grains) of an image costs on one
/// thread, nothing written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InflateCost {
    /// Compressed pieces inflated.
    pub pieces: u64,
    /// Host bytes read for them.
    pub compressed_bytes: u64,
    pub inflated_bytes: u64,
    /// CPU time of the inflating alone (reading the compressed bytes is not counted).
    pub cpu: Duration,
    /// The same, stretch by stretch in image order, with the data stored uncompressed.
    pub stretches: Vec<Stretch>,
}

/// A stretch of the image: what was read of it, what an importer writes of it (inflated pieces
/// and data stored uncompressed), and the CPU time its inflating took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stretch {
    pub image_bytes: u64,
    pub written_bytes: u64,
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
        let cpu = thread_cpu()?.saturating_sub(started);
        self.cpu += cpu;
        self.pieces += pieces;
        self.compressed_bytes += compressed as u64;
        self.inflated_bytes += inflated as u64;
        self.add(compressed as u64, inflated as u64, cpu);
        Ok(made)
    }

    /// Counts `bytes` of data stored uncompressed: read and written, nothing to inflate.
    pub(crate) fn stored(&mut self, bytes: u64) {
        self.add(bytes, bytes, Duration::ZERO);
    }

    fn add(&mut self, image_bytes: u64, written_bytes: u64, cpu: Duration) {
        let open = self
            .stretches
            .last()
            .is_some_and(|s| s.image_bytes.max(s.written_bytes) < STRETCH);
        if !open {
            self.stretches.push(Stretch::default());
        }
        let s = self.stretches.last_mut().expect("pushed above");
        s.image_bytes += image_bytes;
        s.written_bytes += written_bytes;
        s.cpu += cpu;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn inflate(cost: &mut InflateCost, compressed: usize, inflated: usize) {
        cost.measure(1, compressed, || Ok(((), inflated))).unwrap();
    }

    #[test]
    fn a_stretch_ends_once_it_has_read_or_written_a_stretch() {
        let mut cost = InflateCost::default();
        let half = (STRETCH / 2) as usize;
        inflate(&mut cost, 1000, half);
        inflate(&mut cost, 1000, half); // written reaches a stretch: the next starts
        cost.stored(STRETCH); // read and written: a stretch of its own
        inflate(&mut cost, 10, 20);
        let sizes: Vec<_> = cost
            .stretches
            .iter()
            .map(|s| (s.image_bytes, s.written_bytes))
            .collect();
        assert_eq!(
            sizes,
            [(2000, STRETCH), (STRETCH, STRETCH), (10, 20)],
            "{sizes:?}"
        );
    }

    #[test]
    fn the_stretches_add_up_to_the_whole() {
        let mut cost = InflateCost::default();
        for i in 1..200 {
            inflate(&mut cost, i * 1000, i * 4096);
            if i % 7 == 0 {
                cost.stored(i as u64 * 65536);
            }
        }
        let cpu: Duration = cost.stretches.iter().map(|s| s.cpu).sum();
        let written: u64 = cost.stretches.iter().map(|s| s.written_bytes).sum();
        let stored: u64 = (1..200).filter(|i| i % 7 == 0).map(|i| i * 65536).sum();
        assert_eq!(cpu, cost.cpu);
        assert_eq!(written, cost.inflated_bytes + stored);
        assert!(cost.stretches.len() > 1);
    }
}
