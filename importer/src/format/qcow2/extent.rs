//! Extent emission: guest data and zero ranges handed to the sink, adjacent zero ranges coalesced,
//! and a guest cluster written from its host cluster's bytes subcluster by subcluster.

use super::geometry::{ClusterGeometry, Target};
use crate::error::Result;
use crate::sink::ExtentSink;

/// The sink, with adjacent zero ranges coalesced.
pub(crate) struct ExtentWriter<'s> {
    sink: &'s mut dyn ExtentSink,
    /// The zero range not yet handed to the sink, `[start, end)`.
    zero: Option<(u64, u64)>,
}

impl<'s> ExtentWriter<'s> {
    pub(crate) fn new(sink: &'s mut dyn ExtentSink) -> Self {
        ExtentWriter { sink, zero: None }
    }

    pub(crate) fn data(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.sink.write_data(offset, data)
    }

    pub(crate) fn zero(&mut self, start: u64, end: u64) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        match &mut self.zero {
            Some((_, e)) if *e == start => *e = end,
            _ => {
                self.flush()?;
                self.zero = Some((start, end));
            }
        }
        Ok(())
    }

    pub(crate) fn flush(&mut self) -> Result<()> {
        if let Some((s, e)) = self.zero.take() {
            self.sink.write_zeroes(s, e - s)?;
        }
        Ok(())
    }

    /// Writes what guest cluster `t` reads, given its host cluster's bytes.
    pub(super) fn guest_cluster(
        &mut self,
        g: &ClusterGeometry,
        t: Target,
        bytes: &[u8],
    ) -> Result<()> {
        let goff = t.guest_cluster << g.cluster_bits;
        let gend = (goff + g.cluster_size).min(g.virtual_size);
        if t.mask == g.full_mask {
            return self.data(goff, &bytes[..(gend - goff) as usize]);
        }
        let scs = g.cluster_size / 32;
        let mut i = 0u64;
        while i < 32 {
            let is_data = t.mask >> i & 1 == 1;
            let mut j = i + 1;
            while j < 32 && (t.mask >> j & 1 == 1) == is_data {
                j += 1;
            }
            let a = goff + i * scs;
            let b = (goff + j * scs).min(gend);
            if a < b {
                if is_data {
                    let from = (i * scs) as usize;
                    self.data(a, &bytes[from..from + (b - a) as usize])?;
                } else {
                    self.zero(a, b)?;
                }
            }
            i = j;
        }
        Ok(())
    }
}
