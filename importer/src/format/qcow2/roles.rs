//! Host clusters whose role the header fixes: the header itself, the L1 table and the refcount
//! table. Both converters refuse an L2 table or guest data placed there, so an image gets the
//! same verdict whether it is streamed or read at random.

use super::header::Header;

/// The fixed roles of an image's host clusters, as cluster index ranges `[first, end)`.
#[derive(Debug, Clone, Copy)]
pub(super) struct FixedRoles {
    cluster_bits: u32,
    pub l1: (u64, u64),
    pub refcount_table: (u64, u64),
}

impl FixedRoles {
    pub fn of(h: &Header) -> Self {
        let (cluster_bits, cs) = (h.cluster_bits, h.cluster_size());
        let l1_len = u64::from(h.l1_entries) * 8;
        let l1 = if l1_len == 0 {
            (0, 0)
        } else {
            (
                h.l1_offset >> cluster_bits,
                (h.l1_offset + l1_len).div_ceil(cs),
            )
        };
        let rt = h.refcount_table_offset >> cluster_bits;
        FixedRoles {
            cluster_bits,
            l1,
            refcount_table: (rt, rt + u64::from(h.refcount_table_clusters)),
        }
    }

    /// The role of host cluster `cluster`, if the header fixes one.
    pub fn of_cluster(&self, cluster: u64) -> Option<&'static str> {
        if cluster == 0 {
            Some("the header")
        } else if (self.l1.0..self.l1.1).contains(&cluster) {
            Some("the L1 table")
        } else if (self.refcount_table.0..self.refcount_table.1).contains(&cluster) {
            Some("the refcount table")
        } else {
            None
        }
    }

    /// The fixed role overlapping host bytes `[start, end)` (compressed data), if any.
    pub fn overlapping(&self, start: u64, end: u64) -> Option<&'static str> {
        let overlaps = |(a, b): (u64, u64)| {
            a < b && start < b << self.cluster_bits && end > a << self.cluster_bits
        };
        if start < 1 << self.cluster_bits {
            Some("the header")
        } else if overlaps(self.l1) {
            Some("the L1 table")
        } else if overlaps(self.refcount_table) {
            Some("the refcount table")
        } else {
            None
        }
    }
}
