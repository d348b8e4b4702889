//! The header section (the first MiB): the file identifier, the two headers (the current one is
//! the valid one with the higher sequence number, as qemu picks it) and the two region tables,
//! which place the BAT and the metadata region. Pure parsing of bytes already read.

use super::crc::checksum_is_valid;
use super::error::VhdxError;
use crate::format::fields::{le16, le32, le64};

/// The header section's size: nothing else may lie in the first MiB.
pub const HEADER_SECTION: u64 = 1 << 20;
/// How much of the header section the parser reads: up to the end of the second region table.
pub const HEAD_LEN: usize = 0x50000;
pub const SIGNATURE: &[u8; 8] = b"vhdxfile";
const HEADER_OFFSETS: [u64; 2] = [0x10000, 0x20000];
/// A header's checksum covers 4 KiB.
const HEADER_SIZE: usize = 4096;
const REGION_TABLE_OFFSETS: [u64; 2] = [0x30000, 0x40000];
const REGION_TABLE_SIZE: usize = 0x10000;
/// The log's offset and length are multiples of this.
const LOG_UNIT: u64 = 1 << 20;

/// A GUID as the format stores it (the first three fields little-endian).
pub type Guid = [u8; 16];

/// Builds the stored form of GUID `d1-d2-d3-d4`.
pub const fn guid(d1: u32, d2: u16, d3: u16, d4: [u8; 8]) -> Guid {
    let a = d1.to_le_bytes();
    let b = d2.to_le_bytes();
    let c = d3.to_le_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d4[0], d4[1], d4[2], d4[3], d4[4], d4[5],
        d4[6], d4[7],
    ]
}

/// The usual text form of a stored GUID, for messages.
pub fn guid_text(g: &Guid) -> String {
    let d1 = u32::from_le_bytes([g[0], g[1], g[2], g[3]]);
    let d2 = u16::from_le_bytes([g[4], g[5]]);
    let d3 = u16::from_le_bytes([g[6], g[7]]);
    let tail: String = g[8..].iter().map(|b| format!("{b:02x}")).collect();
    format!("{d1:08x}-{d2:04x}-{d3:04x}-{}-{}", &tail[..4], &tail[4..])
}

pub const BAT_GUID: Guid = guid(
    0x2dc2_7766,
    0xf623,
    0x4200,
    [0x9d, 0x64, 0x11, 0x5e, 0x9b, 0xfd, 0x4a, 0x08],
);
pub const METADATA_GUID: Guid = guid(
    0x8b7c_a206,
    0x4790,
    0x4b9a,
    [0xb8, 0xfe, 0x57, 0x5f, 0x05, 0x0f, 0x88, 0x6e],
);

/// A byte range of the image file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub offset: u64,
    pub len: u64,
}

impl Region {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        start < self.end() && end > self.offset
    }
}

/// The current header's fields that matter for reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Where it is (0x10000 or 0x20000).
    pub at: u64,
    pub sequence: u64,
    pub log_guid: Guid,
    pub log: Region,
}

/// Everything the header section says: the current header, where the BAT and the metadata are,
/// and every range of the file that payload blocks must stay out of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub header: Header,
    /// The region table used (0x30000, or 0x40000 when the first is damaged).
    pub region_table: u64,
    pub bat: Region,
    pub metadata: Region,
    /// The header section, the log, and every region, with their names.
    pub reserved: Vec<(String, Region)>,
}

impl Layout {
    /// The reserved range overlapping `[start, end)`, if any.
    pub fn reserved_overlap(&self, start: u64, end: u64) -> Option<&(String, Region)> {
        self.reserved.iter().find(|(_, r)| r.overlaps(start, end))
    }
}

/// Parses the header section from its first [`HEAD_LEN`] bytes (`head` may be shorter only when
/// the image is: that is a truncated image).
pub fn parse(head: &[u8]) -> Result<Layout, VhdxError> {
    if head.len() < SIGNATURE.len() || &head[..8] != SIGNATURE {
        return Err(VhdxError::NoSignature);
    }
    if head.len() < HEAD_LEN {
        return Err(VhdxError::Truncated {
            what: "the header section",
            offset: 0,
            len: HEAD_LEN as u64,
            end: head.len() as u64,
        });
    }
    let header = current_header(head)?;
    let log = header.log;
    let mut reserved = vec![(
        "the header section".to_string(),
        Region {
            offset: 0,
            len: HEADER_SECTION,
        },
    )];
    if log.len > 0 {
        reserved.push(("the log".to_string(), log));
    }
    let mut first_error = None;
    for at in REGION_TABLE_OFFSETS {
        let table = &head[at as usize..at as usize + REGION_TABLE_SIZE];
        if &table[..4] != b"regi" || !checksum_is_valid(table, 4) {
            continue;
        }
        match region_table(table, at, reserved.clone()) {
            Ok((bat, metadata, reserved)) => {
                return Ok(Layout {
                    header,
                    region_table: at,
                    bat,
                    metadata,
                    reserved,
                });
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or(VhdxError::NoValidRegionTable))
}

/// Picks the current header as qemu does: the valid one, or of two valid ones the higher
/// sequence number (equal numbers only when both are identical, as Disk2VHD writes them).
fn current_header(head: &[u8]) -> Result<Header, VhdxError> {
    let valid = |at: u64| {
        let h = &head[at as usize..at as usize + HEADER_SIZE];
        (&h[..4] == b"head" && le16(h, 66) == 1 && checksum_is_valid(h, 4)).then_some(h)
    };
    let (a, b) = (valid(HEADER_OFFSETS[0]), valid(HEADER_OFFSETS[1]));
    let (at, h) = match (a, b) {
        (None, None) => return Err(VhdxError::NoValidHeader),
        (Some(a), None) => (HEADER_OFFSETS[0], a),
        (None, Some(b)) => (HEADER_OFFSETS[1], b),
        (Some(a), Some(b)) => {
            let (sa, sb) = (le64(a, 8), le64(b, 8));
            if sa > sb {
                (HEADER_OFFSETS[0], a)
            } else if sb > sa {
                (HEADER_OFFSETS[1], b)
            } else if a == b {
                (HEADER_OFFSETS[0], a)
            } else {
                return Err(VhdxError::HeadersDisagree { sequence: sa });
            }
        }
    };
    let log_guid: Guid = h[48..64].try_into().expect("16 bytes");
    let log_version = le16(h, 64);
    let log_len = le32(h, 68);
    let log_offset = le64(h, 72);
    let bad = |why| VhdxError::BadLog {
        header: at,
        offset: log_offset,
        len: log_len,
        why,
    };
    // qemu's checks, in its order: placement and version always, the length when there is a log.
    if log_offset < LOG_UNIT || !log_offset.is_multiple_of(LOG_UNIT) {
        return Err(bad(
            "the log must start at a multiple of 1 MiB past the header section",
        ));
    }
    if log_version != 0 {
        return Err(bad("the log version is not 0"));
    }
    if log_offset.checked_add(u64::from(log_len)).is_none() {
        return Err(bad("the log ends past 2^64"));
    }
    if log_guid != [0; 16] && log_len != 0 {
        if !u64::from(log_len).is_multiple_of(LOG_UNIT) {
            return Err(bad("the log length is not a multiple of 1 MiB"));
        }
        return Err(VhdxError::LogNeedsReplay {
            header: at,
            offset: log_offset,
            len: log_len,
            guid: guid_text(&log_guid),
        });
    }
    Ok(Header {
        at,
        sequence: le64(h, 8),
        log_guid,
        log: Region {
            offset: log_offset,
            len: u64::from(log_len),
        },
    })
}

/// The file's regions taken so far, each with its name for error messages.
type Reserved = Vec<(String, Region)>;

/// Reads a region table whose signature and checksum are valid: its BAT and metadata regions,
/// each checked against everything reserved before it (as qemu's `vhdx_region_check`).
fn region_table(
    table: &[u8],
    at: u64,
    mut reserved: Reserved,
) -> Result<(Region, Region, Reserved), VhdxError> {
    let count = le32(table, 8);
    if count > 2047 {
        return Err(VhdxError::RegionCount { table: at, count });
    }
    let (mut bat, mut metadata) = (None, None);
    for i in 0..count as usize {
        let e = &table[16 + 32 * i..48 + 32 * i];
        let id: Guid = e[..16].try_into().expect("16 bytes");
        let region = Region {
            offset: le64(e, 16),
            len: u64::from(le32(e, 24)),
        };
        let required = le32(e, 28) & 1 != 0;
        let name = if id == BAT_GUID {
            "the BAT".to_string()
        } else if id == METADATA_GUID {
            "the metadata region".to_string()
        } else {
            format!("region {}", guid_text(&id))
        };
        let Some(end) = region.offset.checked_add(region.len) else {
            return Err(VhdxError::RegionOverflow {
                table: at,
                what: name,
                offset: region.offset,
            });
        };
        if let Some((other, o)) = reserved
            .iter()
            .find(|(_, r)| r.overlaps(region.offset, end))
        {
            return Err(VhdxError::RegionOverlap {
                table: at,
                what: name,
                start: region.offset,
                end,
                other: other.clone(),
                other_start: o.offset,
                other_end: o.end(),
            });
        }
        if id == BAT_GUID {
            if bat.replace(region).is_some() {
                return Err(VhdxError::DuplicateRegion {
                    table: at,
                    what: "the BAT",
                });
            }
        } else if id == METADATA_GUID {
            if metadata.replace(region).is_some() {
                return Err(VhdxError::DuplicateRegion {
                    table: at,
                    what: "the metadata region",
                });
            }
        } else if required {
            return Err(VhdxError::UnknownRequiredRegion {
                table: at,
                guid: guid_text(&id),
            });
        }
        reserved.push((name, region));
    }
    let missing = |what| VhdxError::MissingRegion { table: at, what };
    Ok((
        bat.ok_or_else(|| missing("the BAT"))?,
        metadata.ok_or_else(|| missing("the metadata region"))?,
        reserved,
    ))
}
