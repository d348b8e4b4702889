//! Pure decoding of L1 entries, L2 entries (standard and extended) and compressed cluster
//! descriptors, following qemu's `qcow2_get_cluster_type` / `qcow2_get_subcluster_type`, and of
//! whole L2 tables.

use super::error::Qcow2Error;
use super::geometry::ClusterGeometry;
use crate::error::{Error, Result};
use crate::format::fields::be64;

/// Bits 9..=55 of an L1 entry: the L2 table's host offset.
pub const L1E_OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// Bits 9..=55 of a standard L2 entry: the data cluster's host offset.
pub const L2E_OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
pub const OFLAG_COPIED: u64 = 1 << 63;
pub const OFLAG_COMPRESSED: u64 = 1 << 62;
pub const OFLAG_ZERO: u64 = 1;

/// Compressed data is stored in 512-byte sectors.
pub const SECTOR: u64 = 512;

/// Decodes an L1 entry: `Ok(None)` when no L2 table is allocated, else the L2 table's offset.
/// Reserved bits are ignored, as qemu does.
pub fn l1_entry(raw: u64, cluster_bits: u32) -> Result<Option<u64>, Qcow2Error> {
    let off = raw & L1E_OFFSET_MASK;
    if off == 0 {
        Ok(None)
    } else if off & ((1 << cluster_bits) - 1) != 0 {
        Err(Qcow2Error::MisalignedL2Table { offset: off })
    } else {
        Ok(Some(off))
    }
}

/// Where a compressed cluster's bytes are: `[offset, offset + len)` in the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compressed {
    pub offset: u64,
    /// Sector-rounded: the data itself may end up to 511 bytes earlier.
    pub len: u64,
}

impl Compressed {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// Decodes a compressed cluster descriptor (qemu's `qcow2_parse_compressed_l2_entry`).
pub fn compressed(raw: u64, cluster_bits: u32) -> Compressed {
    let csize_shift = 62 - (cluster_bits - 8);
    let csize_mask = (1u64 << (cluster_bits - 8)) - 1;
    let offset = raw & ((1u64 << csize_shift) - 1);
    let sectors = ((raw >> csize_shift) & csize_mask) + 1;
    Compressed {
        offset,
        len: sectors * SECTOR - (offset & (SECTOR - 1)),
    }
}

/// Largest `Compressed::len` for a cluster size: twice the cluster.
pub fn max_compressed_len(cluster_bits: u32) -> u64 {
    (1u64 << (cluster_bits - 8)) * SECTOR
}

/// What one guest cluster reads as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// Every byte reads as zero (unallocated without a backing file, or zero flags).
    Zero,
    /// The subclusters whose bit is set in `data_mask` read from the host cluster at `host`; the
    /// others read as zero. Without extended L2 entries there is one subcluster (mask 1).
    Data { host: u64, data_mask: u32 },
    /// The cluster is compressed.
    Compressed(Compressed),
}

/// Decodes one L2 entry. `bitmap` is the second half of an extended entry (`None` for standard
/// entries).
pub fn l2_entry(raw: u64, bitmap: Option<u64>, cluster_bits: u32) -> Result<Mapping, Qcow2Error> {
    if raw & OFLAG_COMPRESSED != 0 {
        // The subcluster bitmap of a compressed cluster is ignored.
        return Ok(Mapping::Compressed(compressed(raw, cluster_bits)));
    }
    let host = raw & L2E_OFFSET_MASK;
    let aligned = || {
        if host & ((1 << cluster_bits) - 1) != 0 {
            Err(Qcow2Error::MisalignedDataCluster { offset: host })
        } else {
            Ok(())
        }
    };
    match bitmap {
        None => {
            if raw & OFLAG_ZERO != 0 {
                if host != 0 {
                    aligned()?;
                }
                Ok(Mapping::Zero)
            } else if host == 0 {
                Ok(Mapping::Zero)
            } else {
                aligned()?;
                Ok(Mapping::Data { host, data_mask: 1 })
            }
        }
        Some(bitmap) => {
            let alloc = bitmap as u32;
            let zero = (bitmap >> 32) as u32;
            if host == 0 {
                if alloc != 0 {
                    return Err(Qcow2Error::UnallocatedWithSubclusters { bitmap });
                }
                Ok(Mapping::Zero)
            } else {
                aligned()?;
                if alloc & zero != 0 {
                    return Err(Qcow2Error::SubclustersAllocatedAndZero { bitmap });
                }
                if alloc == 0 {
                    Ok(Mapping::Zero)
                } else {
                    Ok(Mapping::Data {
                        host,
                        data_mask: alloc,
                    })
                }
            }
        }
    }
}

/// Decodes the entries of the L2 table at host offset `table`, for L1 entry `l1_index`, that map
/// the virtual disk, into `out` as (guest cluster, mapping).
pub(super) fn decode_table(
    bytes: &[u8],
    g: &ClusterGeometry,
    l1_index: u64,
    table: u64,
    out: &mut Vec<(u64, Mapping)>,
) -> Result<()> {
    out.clear();
    let g0 = l1_index * g.l2_entries;
    let n = g.l2_entries.min(g.guest_clusters - g0);
    let esize = if g.extended { 16 } else { 8 };
    for j in 0..n as usize {
        let raw = be64(bytes, j * esize);
        let bitmap = g.extended.then(|| be64(bytes, j * esize + 8));
        let m = l2_entry(raw, bitmap, g.cluster_bits).map_err(|e| {
            Error::Corrupt(format!(
                "qcow2 L2 table at {table:#x}, entry {j} (guest offset {:#x}): {e}",
                (g0 + j as u64) << g.cluster_bits
            ))
        })?;
        out.push((g0 + j as u64, m));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l1_entry_zero_means_no_l2_table() {
        assert_eq!(l1_entry(0, 16), Ok(None));
        // The "copied" flag alone is still no table.
        assert_eq!(l1_entry(OFLAG_COPIED, 16), Ok(None));
    }

    #[test]
    fn l1_entry_gives_the_aligned_l2_offset_and_ignores_flags() {
        assert_eq!(l1_entry(OFLAG_COPIED | 0x30000, 16), Ok(Some(0x30000)));
        // Reserved low bits and bits 56..62 are masked off.
        assert_eq!(l1_entry(0x7f00_0000_0003_01ff, 16), Ok(Some(0x30000)));
    }

    #[test]
    fn l1_entry_refuses_an_unaligned_l2_offset() {
        let e = l1_entry(0x30200, 16).unwrap_err();
        assert!(e.contains("0x30200") && e.contains("aligned"), "{e}");
        assert_eq!(l1_entry(0x30200, 9), Ok(Some(0x30200)));
    }

    #[test]
    fn standard_unallocated_reads_as_zero() {
        assert_eq!(l2_entry(0, None, 16), Ok(Mapping::Zero));
        assert_eq!(l2_entry(OFLAG_COPIED, None, 16), Ok(Mapping::Zero));
    }

    #[test]
    fn standard_zero_flag_plain_and_allocated() {
        assert_eq!(l2_entry(OFLAG_ZERO, None, 16), Ok(Mapping::Zero));
        assert_eq!(l2_entry(0x50000 | OFLAG_ZERO, None, 16), Ok(Mapping::Zero));
        assert!(l2_entry(0x50200 | OFLAG_ZERO, None, 16).is_err());
    }

    #[test]
    fn standard_normal_cluster() {
        assert_eq!(
            l2_entry(OFLAG_COPIED | 0x50000, None, 16),
            Ok(Mapping::Data {
                host: 0x50000,
                data_mask: 1
            })
        );
        let e = l2_entry(0x50200, None, 16).unwrap_err();
        assert!(e.contains("not cluster aligned"), "{e}");
    }

    #[test]
    fn compressed_descriptor_fields_for_each_cluster_size() {
        // 64 KiB clusters: offset in bits 0..54, sector count - 1 in bits 54..62.
        let raw = OFLAG_COMPRESSED | (3u64 << 54) | 0x12345;
        assert_eq!(
            l2_entry(raw, None, 16),
            Ok(Mapping::Compressed(Compressed {
                offset: 0x12345,
                len: 4 * 512 - 0x145,
            }))
        );
        // 512-byte clusters: one bit of sector count at bit 61.
        let c = compressed(OFLAG_COMPRESSED | (1 << 61) | 0x400, 9);
        assert_eq!((c.offset, c.len), (0x400, 1024));
        // 2 MiB clusters: 13 bits of sector count from bit 49; all set = 8192 sectors = 2 clusters.
        let c = compressed(OFLAG_COMPRESSED | (0x1fff << 49) | 0x20_0000, 21);
        assert_eq!((c.offset, c.len), (0x20_0000, 4 << 20));
        assert_eq!(max_compressed_len(21), 4 << 20);
        assert_eq!(max_compressed_len(9), 1024);
        // The copied flag is not part of the size.
        let c = compressed(OFLAG_COPIED | OFLAG_COMPRESSED | 0x200, 16);
        assert_eq!((c.offset, c.len), (0x200, 512));
    }

    #[test]
    fn compressed_descriptor_extremes_do_not_overflow() {
        for bits in 9..=21 {
            let c = compressed(u64::MAX, bits);
            assert!(c.offset.checked_add(c.len).is_some());
            assert!(c.len <= max_compressed_len(bits));
        }
    }

    #[test]
    fn extended_entries_follow_the_subcluster_bitmap() {
        let host = 0x40000;
        assert_eq!(
            l2_entry(host, Some(0xffff_ffff), 16),
            Ok(Mapping::Data {
                host,
                data_mask: u32::MAX
            })
        );
        assert_eq!(
            l2_entry(host, Some(0x0000_0001_0000_0006), 16),
            Ok(Mapping::Data { host, data_mask: 6 })
        );
        // Allocated cluster whose subclusters are all zero or unallocated: reads as zero.
        assert_eq!(
            l2_entry(host, Some(0xffff_ffff_0000_0000), 16),
            Ok(Mapping::Zero)
        );
        assert_eq!(l2_entry(host, Some(0), 16), Ok(Mapping::Zero));
    }

    #[test]
    fn extended_entries_reject_contradictory_bitmaps() {
        let e = l2_entry(0x40000, Some(0x0000_0002_0000_0002), 16).unwrap_err();
        assert!(e.contains("both allocated and zero"), "{e}");
        let e = l2_entry(0, Some(1), 16).unwrap_err();
        assert!(e.contains("unallocated cluster"), "{e}");
        assert!(l2_entry(0x40200, Some(1), 16).is_err());
    }

    #[test]
    fn extended_unallocated_cluster_with_zero_bits_reads_as_zero() {
        assert_eq!(
            l2_entry(0, Some(0xffff_ffff_0000_0000), 16),
            Ok(Mapping::Zero)
        );
    }

    #[test]
    fn extended_entries_ignore_the_standard_zero_flag() {
        // With subclusters, bit 0 is not a zero flag: the bitmap decides.
        assert_eq!(
            l2_entry(0x40000 | OFLAG_ZERO, Some(1), 16),
            Ok(Mapping::Data {
                host: 0x40000,
                data_mask: 1
            })
        );
    }

    #[test]
    fn extended_compressed_ignores_the_bitmap() {
        let raw = OFLAG_COMPRESSED | 0x10000;
        assert!(matches!(
            l2_entry(raw, Some(u64::MAX), 16),
            Ok(Mapping::Compressed(_))
        ));
    }
}
