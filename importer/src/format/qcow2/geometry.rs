//! Cluster geometry: the sizes both converters compute guest and host offsets with, copied out of
//! the header, and what one guest cluster reads of its host cluster.

use super::header::Header;

/// Cluster geometry, copied out of the header.
#[derive(Clone, Copy)]
pub(super) struct ClusterGeometry {
    pub(super) cluster_bits: u32,
    pub(super) cluster_size: u64,
    pub(super) virtual_size: u64,
    pub(super) guest_clusters: u64,
    pub(super) l2_entries: u64,
    pub(super) extended: bool,
    /// The subcluster mask of a guest cluster read whole.
    pub(super) full_mask: u32,
}

impl ClusterGeometry {
    pub(super) fn of(h: &Header) -> ClusterGeometry {
        ClusterGeometry {
            cluster_bits: h.cluster_bits,
            cluster_size: h.cluster_size(),
            virtual_size: h.virtual_size,
            guest_clusters: h.guest_clusters(),
            l2_entries: h.l2_entries(),
            extended: h.extended_l2,
            full_mask: if h.extended_l2 { u32::MAX } else { 1 },
        }
    }

    /// How many bytes of its host cluster guest cluster `t` reads.
    pub(super) fn needed_len(&self, t: Target) -> u64 {
        let glen = self
            .cluster_size
            .min(self.virtual_size - (t.guest_cluster << self.cluster_bits));
        if t.mask == self.full_mask {
            glen
        } else {
            let last = u64::from(31 - t.mask.leading_zeros());
            ((last + 1) * (self.cluster_size / 32)).min(glen)
        }
    }
}

/// A guest cluster that reads (some subclusters of) a host cluster.
#[derive(Clone, Copy, Debug)]
pub(super) struct Target {
    pub(super) guest_cluster: u64,
    pub(super) mask: u32,
}
