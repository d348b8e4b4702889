//! The hosted sparse extent header (`KDMV`, VMware's `SparseExtentHeader`, qemu's `VMDK4Header`)
//! and the stream markers of streamOptimized extents: pure parses of bytes, no I/O.
//!
//! The checks follow qemu's `vmdk_open_vmdk4` / `vmdk_add_extent` (version at most 3, at most 512
//! entries per grain table, grains of at most 1 GiB, a grain directory of at most 32M entries),
//! plus this reader's own limits, refused as such: grains of at most 2 MiB and a grain directory
//! of at most [`MAX_GD_ENTRIES`] entries (memory stays bounded whatever the header says).

use super::error::VmdkError;
use crate::format::fields::{le16, le32, le64};

/// The first four bytes of a hosted sparse extent.
pub const MAGIC: [u8; 4] = *b"KDMV";
/// ESX 3 sparse extents (vmfsSparse), refused.
pub const COWD_MAGIC: [u8; 4] = *b"COWD";
/// How a descriptor file begins.
pub const DESCRIPTOR_MAGIC: &[u8] = b"# Disk DescriptorFile";

pub const SECTOR: u64 = 512;
/// `gdOffset` of a streamOptimized extent whose grain directory follows the data (the footer's
/// copy of the header holds the real one).
pub const GD_AT_END: u64 = u64::MAX;

/// Header flags.
pub mod flags {
    pub const REDUNDANT_GD: u32 = 1 << 1;
    /// A grain table entry of 1 means "zeroed grain".
    pub const ZERO_GRAIN: u32 = 1 << 2;
    pub const COMPRESSED: u32 = 1 << 16;
    pub const MARKERS: u32 = 1 << 17;
}

/// `compressAlgorithm` of deflate (zlib streams).
pub const COMPRESSION_DEFLATE: u16 = 1;

/// qemu's largest grain (0x200000 sectors); anything above is corrupt.
const QEMU_MAX_GRANULARITY: u64 = 0x20_0000;
/// This reader's largest grain: 2 MiB (4096 sectors), so a grain and its compressed form fit
/// the read window. VMware writes 64 KiB grains.
pub const MAX_GRANULARITY: u64 = 4096;
/// qemu's cap on the grain directory (`L1 size too big`).
const QEMU_MAX_GD_ENTRIES: u64 = 32 << 20;
/// This reader's cap: 1M grain tables, 32 TiB with VMware's geometry (64 KiB grains, 512
/// entries per table).
pub const MAX_GD_ENTRIES: u64 = 1 << 20;
/// Largest embedded descriptor read (qemu reads at most 1 MiB of a descriptor).
pub const MAX_DESCRIPTOR: u64 = 1 << 20;

/// How the grains of an extent are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Uncompressed grains placed by the grain directory and grain tables (monolithicSparse,
    /// twoGbMaxExtentSparse extents).
    Tables,
    /// Deflate-compressed grains, each behind a marker that names its guest sector
    /// (streamOptimized).
    Markers,
}

/// A validated sparse extent header. Offsets and sizes are in 512-byte sectors, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseHeader {
    pub version: u32,
    pub flags: u32,
    pub capacity: u64,
    pub granularity: u64,
    pub desc_offset: u64,
    pub desc_size: u64,
    pub gtes_per_gt: u32,
    pub rgd_offset: u64,
    pub gd_offset: u64,
    pub grain_offset: u64,
    pub compress_algorithm: u16,
}

impl SparseHeader {
    /// Parses and validates the header in the first sector of `b`.
    pub fn parse(b: &[u8]) -> Result<SparseHeader, VmdkError> {
        if b.len() < SECTOR as usize {
            return Err(VmdkError::TruncatedHeader { len: b.len() });
        }
        if b[..4] != MAGIC {
            return Err(VmdkError::BadMagic {
                magic: b[..4].try_into().expect("4 bytes"),
            });
        }
        let h = SparseHeader {
            version: le32(b, 4),
            flags: le32(b, 8),
            capacity: le64(b, 12),
            granularity: le64(b, 20),
            desc_offset: le64(b, 28),
            desc_size: le64(b, 36),
            gtes_per_gt: le32(b, 44),
            rgd_offset: le64(b, 48),
            gd_offset: le64(b, 56),
            grain_offset: le64(b, 64),
            compress_algorithm: le16(b, 77),
        };
        h.validate()?;
        Ok(h)
    }

    fn validate(&self) -> Result<(), VmdkError> {
        if self.version > 3 {
            return Err(VmdkError::UnsupportedVersion {
                version: self.version,
            });
        }
        if self.gtes_per_gt == 0 || self.gtes_per_gt > 512 {
            return Err(VmdkError::GrainTableTooBig {
                gtes: self.gtes_per_gt,
            });
        }
        if self.granularity == 0 || self.granularity > QEMU_MAX_GRANULARITY {
            return Err(VmdkError::BadGranularity {
                granularity: self.granularity,
            });
        }
        if self.granularity > MAX_GRANULARITY {
            return Err(VmdkError::GrainTooLarge {
                granularity: self.granularity,
            });
        }
        if self.capacity > (i64::MAX as u64) / SECTOR {
            return Err(VmdkError::BadCapacity {
                capacity: self.capacity,
            });
        }
        let entries = self.gd_entries();
        if entries > QEMU_MAX_GD_ENTRIES {
            return Err(VmdkError::BadCapacity {
                capacity: self.capacity,
            });
        }
        if entries > MAX_GD_ENTRIES {
            return Err(VmdkError::GrainDirectoryTooBig {
                entries,
                max: MAX_GD_ENTRIES,
            });
        }
        if self.capacity == 0 && self.desc_offset != 0 {
            return Err(VmdkError::DescriptorOnlyExtent);
        }
        match self.compress_algorithm {
            0 | COMPRESSION_DEFLATE => {}
            algorithm => return Err(VmdkError::UnknownCompression { algorithm }),
        }
        match self.layout()? {
            Layout::Tables if self.gd_offset == GD_AT_END => {
                return Err(VmdkError::UncompressedGdAtEnd);
            }
            Layout::Tables if self.gd_offset == 0 => {
                return Err(VmdkError::MetadataInHeader {
                    what: "the grain directory",
                    sector: 0,
                });
            }
            Layout::Markers if self.grain_offset == 0 => {
                return Err(VmdkError::MetadataInHeader {
                    what: "the first grain",
                    sector: 0,
                });
            }
            Layout::Tables
                if self
                    .gd_offset
                    .checked_mul(SECTOR)
                    .and_then(|s| s.checked_add(entries * 4))
                    .is_none_or(|end| end > i64::MAX as u64) =>
            {
                return Err(VmdkError::OffsetOutOfRange {
                    what: "the grain directory",
                    sector: self.gd_offset,
                });
            }
            Layout::Markers if self.grain_offset > (i64::MAX as u64) / SECTOR => {
                return Err(VmdkError::OffsetOutOfRange {
                    what: "the first grain",
                    sector: self.grain_offset,
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// How grains are found: qemu takes `compressAlgorithm` (not the flag) to mean compressed.
    pub fn layout(&self) -> Result<Layout, VmdkError> {
        match (
            self.compress_algorithm == COMPRESSION_DEFLATE,
            self.flags & flags::MARKERS != 0,
        ) {
            (false, _) => Ok(Layout::Tables),
            (true, true) => Ok(Layout::Markers),
            (true, false) => Err(VmdkError::CompressedWithoutMarkers),
        }
    }

    pub fn virtual_size(&self) -> u64 {
        self.capacity * SECTOR
    }

    pub fn grain_size(&self) -> u64 {
        self.granularity * SECTOR
    }

    /// Guest grains covering the capacity (the last one may be partial).
    pub fn grains(&self) -> u64 {
        self.capacity.div_ceil(self.granularity)
    }

    /// Guest bytes one grain table covers.
    pub fn gt_span(&self) -> u64 {
        u64::from(self.gtes_per_gt) * self.grain_size()
    }

    /// Bytes of one grain table.
    pub fn gt_len(&self) -> u64 {
        u64::from(self.gtes_per_gt) * 4
    }

    /// Entries in the grain directory (qemu's `l1_size`).
    pub fn gd_entries(&self) -> u64 {
        self.capacity
            .div_ceil(u64::from(self.gtes_per_gt) * self.granularity)
    }

    /// A zero grain table entry of 1 means a zeroed grain.
    pub fn has_zero_grains(&self) -> bool {
        self.flags & flags::ZERO_GRAIN != 0
    }

    /// The embedded descriptor's byte range, capped at [`MAX_DESCRIPTOR`].
    pub fn descriptor_range(&self) -> Option<(u64, u64)> {
        if self.desc_offset == 0 || self.desc_size == 0 {
            return None;
        }
        let start = self.desc_offset.checked_mul(SECTOR)?;
        let len = self.desc_size.saturating_mul(SECTOR).min(MAX_DESCRIPTOR);
        Some((start, start.checked_add(len)?))
    }

    /// Bytes of guest grain `g` that lie inside the disk.
    pub fn grain_len(&self, g: u64) -> u64 {
        self.grain_size()
            .min(self.virtual_size() - g * self.grain_size())
    }
}

/// What a grain table entry says of its grain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrainEntry {
    /// Never written: reads as zeroes (there is no parent: parents are refused).
    Unallocated,
    /// Written as zeroes (entry 1 with the zeroed-grain flag).
    Zeroed,
    /// The grain's data starts at this sector of the extent.
    Data(u64),
}

/// Decodes a grain table entry (qemu's `vmdk_get_cluster_offset`).
pub fn grain_entry(raw: u32, zero_grains: bool) -> GrainEntry {
    match raw {
        0 => GrainEntry::Unallocated,
        1 if zero_grains => GrainEntry::Zeroed,
        sector => GrainEntry::Data(u64::from(sector)),
    }
}

/// A streamOptimized marker: the first 16 bytes of a sector after the header's `overHead`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// A compressed grain: `size` bytes of zlib data follow the 12-byte marker.
    Grain {
        lba: u64,
        size: u32,
    },
    /// End of stream.
    EndOfStream,
    /// Metadata (a grain table, the grain directory or the footer) of `sectors` sectors follows
    /// the marker's sector.
    GrainTable {
        sectors: u64,
    },
    GrainDirectory {
        sectors: u64,
    },
    Footer {
        sectors: u64,
    },
}

/// Bytes of a grain marker before its data.
pub const GRAIN_MARKER_LEN: usize = 12;

/// Decodes a marker from the first 16 bytes of a sector (fewer only at the end of the stream,
/// where the missing bytes read as zeroes).
pub fn parse_marker(b: &[u8], offset: u64) -> Result<Marker, VmdkError> {
    let mut m = [0u8; 16];
    let n = b.len().min(16);
    m[..n].copy_from_slice(&b[..n]);
    let val = le64(&m, 0);
    let size = le32(&m, 8);
    if size != 0 {
        return Ok(Marker::Grain { lba: val, size });
    }
    let bad = |why: String| VmdkError::BadMarker { offset, why };
    match le32(&m, 12) {
        0 if val == 0 => Ok(Marker::EndOfStream),
        0 => Err(bad(format!("end-of-stream marker claims {val} sectors"))),
        1 => Ok(Marker::GrainTable { sectors: val }),
        2 => Ok(Marker::GrainDirectory { sectors: val }),
        3 => Ok(Marker::Footer { sectors: val }),
        t => Err(bad(format!("unknown marker type {t}"))),
    }
}
