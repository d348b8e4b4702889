//! The metadata region: its table (the first 64 KiB) says where each item is; the items give
//! the block size, whether the image has a parent, the virtual disk size and the sector sizes.
//! Pure parsing: the table first ([`parse_table`]), then the few bytes of each item
//! ([`Metadata::parse`]), which the readers fetch in between.

use super::error::VhdxError;
use super::header::{Guid, Region, guid, guid_text};
use crate::format::fields::{le16, le32, le64};

/// The metadata table's size, at the start of the region.
pub const TABLE_LEN: usize = 0x10000;
const MIN_BLOCK: u32 = 1 << 20;
const MAX_BLOCK: u32 = 256 << 20;
/// The format's largest virtual disk.
const MAX_DISK: u64 = 64 << 40;

pub const FILE_PARAMETERS: Guid = guid(
    0xcaa1_6737,
    0xfa36,
    0x4d43,
    [0xb3, 0xb6, 0x33, 0xf0, 0xaa, 0x44, 0xe7, 0x6b],
);
pub const VIRTUAL_DISK_SIZE: Guid = guid(
    0x2fa5_4224,
    0xcd1b,
    0x4876,
    [0xb2, 0x11, 0x5d, 0xbe, 0xd8, 0x3b, 0xf4, 0xb8],
);
pub const PAGE_83: Guid = guid(
    0xbeca_12ab,
    0xb2e6,
    0x4523,
    [0x93, 0xef, 0xc3, 0x09, 0xe0, 0x00, 0xc7, 0x46],
);
pub const LOGICAL_SECTOR_SIZE: Guid = guid(
    0x8141_bf1d,
    0xa96f,
    0x4709,
    [0xba, 0x47, 0xf2, 0x33, 0xa8, 0xfa, 0xab, 0x5f],
);
pub const PHYSICAL_SECTOR_SIZE: Guid = guid(
    0xcda3_48c7,
    0x445d,
    0x4471,
    [0x9c, 0xc9, 0xe9, 0x88, 0x52, 0x51, 0xc5, 0x56],
);
pub const PARENT_LOCATOR: Guid = guid(
    0xa8d3_5f2d,
    0xb30b,
    0x454d,
    [0xab, 0xf7, 0xd3, 0xd8, 0x48, 0x34, 0xab, 0x0c],
);

/// The items a reader fetches, in this order: file parameters, virtual disk size, logical
/// sector size, physical sector size; with the bytes each needs.
const NEEDED: [(Guid, &str, u64); 4] = [
    (FILE_PARAMETERS, "the file parameters", 8),
    (VIRTUAL_DISK_SIZE, "the virtual disk size", 8),
    (LOGICAL_SECTOR_SIZE, "the logical sector size", 4),
    (PHYSICAL_SECTOR_SIZE, "the physical sector size", 4),
];

/// Where the needed items are: absolute file ranges, in [`NEEDED`] order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Items {
    pub ranges: [Region; 4],
    pub has_parent_locator: bool,
}

/// Parses the metadata table (the first [`TABLE_LEN`] bytes of the region `region`).
pub fn parse_table(table: &[u8], region: Region) -> Result<Items, VhdxError> {
    let at = region.offset;
    if region.len < TABLE_LEN as u64 {
        return Err(VhdxError::MetadataRegionTooShort {
            offset: at,
            len: region.len,
        });
    }
    if &table[..8] != b"metadata" {
        return Err(VhdxError::MetadataSignature { offset: at });
    }
    let count = le16(table, 10);
    if usize::from(count) * 32 > TABLE_LEN - 32 {
        return Err(VhdxError::MetadataCount { offset: at, count });
    }
    let mut found: [Option<Region>; 4] = [None; 4];
    let (mut page83, mut parent_locator) = (false, false);
    for i in 0..usize::from(count) {
        let e = &table[32 + 32 * i..64 + 32 * i];
        let id: Guid = e[..16].try_into().expect("16 bytes");
        let (offset, len) = (u64::from(le32(e, 16)), u64::from(le32(e, 20)));
        let required = le32(e, 24) & 4 != 0;
        let duplicate = |what| VhdxError::DuplicateMetadata { offset: at, what };
        if let Some(k) = NEEDED.iter().position(|(g, _, _)| *g == id) {
            let (_, what, need) = NEEDED[k];
            if found[k].is_some() {
                return Err(duplicate(what));
            }
            if len < need || offset + need > region.len {
                return Err(VhdxError::MetadataItemOutOfRange {
                    table: at,
                    what,
                    offset,
                    len,
                    region_len: region.len,
                });
            }
            found[k] = Some(Region {
                offset: at + offset,
                len: need,
            });
        } else if id == PAGE_83 {
            if std::mem::replace(&mut page83, true) {
                return Err(duplicate("the page 83 data"));
            }
        } else if id == PARENT_LOCATOR {
            if std::mem::replace(&mut parent_locator, true) {
                return Err(duplicate("the parent locator"));
            }
        } else if required {
            return Err(VhdxError::UnknownRequiredMetadata {
                table: at,
                guid: guid_text(&id),
            });
        }
    }
    let missing = |what| VhdxError::MissingMetadata { offset: at, what };
    if !page83 {
        return Err(missing("the page 83 data"));
    }
    let mut ranges = [Region { offset: 0, len: 0 }; 4];
    for (k, r) in found.into_iter().enumerate() {
        ranges[k] = r.ok_or_else(|| missing(NEEDED[k].1))?;
    }
    Ok(Items {
        ranges,
        has_parent_locator: parent_locator,
    })
}

/// The disk's parameters, from the metadata items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata {
    pub block_size: u32,
    /// LeaveBlockAllocated: a fixed image (every block allocated up front).
    pub leave_blocks_allocated: bool,
    /// The virtual disk size as stored.
    pub virtual_disk_size: u64,
    pub logical_sector_size: u32,
    pub physical_sector_size: u32,
}

impl Metadata {
    /// Checks the items' bytes (`bytes[k]` read from `items.ranges[k]`) as qemu does.
    pub fn parse(items: &Items, bytes: [&[u8]; 4]) -> Result<Metadata, VhdxError> {
        let params_at = items.ranges[0].offset;
        let block_size = le32(bytes[0], 0);
        let flags = le32(bytes[0], 4);
        if flags & 2 != 0 {
            return Err(if items.has_parent_locator {
                VhdxError::Differencing { offset: params_at }
            } else {
                VhdxError::ParentWithoutLocator { offset: params_at }
            });
        }
        if !(MIN_BLOCK..=MAX_BLOCK).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(VhdxError::BlockSize {
                offset: params_at,
                size: block_size,
            });
        }
        let virtual_disk_size = le64(bytes[1], 0);
        // qemu refuses an empty disk as it does one past the limit.
        if virtual_disk_size == 0 || virtual_disk_size > MAX_DISK {
            return Err(VhdxError::VirtualSize {
                offset: items.ranges[1].offset,
                size: virtual_disk_size,
            });
        }
        let logical_sector_size = le32(bytes[2], 0);
        if logical_sector_size != 512 && logical_sector_size != 4096 {
            return Err(VhdxError::LogicalSectorSize {
                offset: items.ranges[2].offset,
                size: logical_sector_size,
            });
        }
        Ok(Metadata {
            block_size,
            leave_blocks_allocated: flags & 1 != 0,
            virtual_disk_size,
            logical_sector_size,
            physical_sector_size: le32(bytes[3], 0),
        })
    }
}
