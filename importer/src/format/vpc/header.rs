//! Pure parsing of the vhd footer, the dynamic disk header and the BAT, with the rules of qemu's
//! `block/vpc.c` (qemu 10): which footer counts, its checksum, and the disk size.
//!
//! The disk size is qemu's (10.x, `vpc_ignore_current_size`): the footer's current size, rounded
//! down to sectors, except for images whose creator application sizes disks by their CHS geometry
//! (Virtual PC `vpc `, qemu without `force_size` `qemu`), which take cylinders x heads x sectors
//! unless it is the largest geometry CHS can state (65535 x 16 x 255). Every other creator
//! (Hyper-V `win `, Azure `wa\0\0`, qemu's `qem2`, Disk2vhd, XenServer, any unknown one) goes by
//! the current size.

use super::error::VpcError;
use crate::format::blocks::{HOLE, Layout, MAX_BLOCKS};
use crate::format::fields::{be16, be32, be64};

pub const FOOTER_LEN: usize = 512;
/// What qemu reads of the dynamic disk header (the rest is about parent images).
pub const DYN_HEADER_LEN: usize = 512;
/// The dynamic disk header's full size, kept clear of blocks.
const DYN_HEADER_SPAN: u64 = 1024;
pub const MAGIC: &[u8; 8] = b"conectix";
const SPARSE_MAGIC: &[u8; 8] = b"cxsparse";
const SECTOR: u64 = 512;
/// qemu's limit: 2040 GiB.
const MAX_SECTORS: u64 = 0xff00_0000;
/// The largest geometry CHS can state: such disks are sized by the footer's current size.
const MAX_GEOMETRY: u64 = 65535 * 16 * 255;
/// The most BAT entries qemu reads (a table of at most `INT_MAX` bytes).
const MAX_TABLE_ENTRIES: u64 = i32::MAX as u64 / 4;
/// Creator applications whose disks are sized by their CHS geometry, not the current size.
const SIZED_BY_GEOMETRY: [&[u8; 4]; 2] = [b"vpc ", b"qemu"];

/// The footer's disk types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskType {
    Fixed,
    Dynamic,
}

/// A validated footer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    pub disk_type: DiskType,
    /// Where the dynamic disk header is (dynamic disks).
    pub data_offset: u64,
    /// The guest disk size, by qemu's rules.
    pub virtual_size: u64,
}

/// qemu's checksum: the one's complement of the byte sum, with the checksum field as zero.
pub fn checksum(footer: &[u8]) -> u32 {
    let sum = footer[..FOOTER_LEN]
        .iter()
        .enumerate()
        .filter(|(i, _)| !(64..68).contains(i))
        .fold(0u32, |s, (_, &b)| s.wrapping_add(b.into()));
    !sum
}

/// True when `b` starts with a footer's magic.
pub fn is_footer(b: &[u8]) -> bool {
    b.starts_with(MAGIC)
}

/// Parses the 512-byte footer found at `offset`: 0 (dynamic disks keep a copy there) or the
/// last sector (fixed disks have it only there).
pub fn parse_footer(b: &[u8], offset: u64) -> Result<Footer, VpcError> {
    debug_assert!(b.len() >= FOOTER_LEN && is_footer(b));
    let stored = be32(b, 64);
    let computed = checksum(b);
    if stored != computed {
        return Err(VpcError::FooterChecksum {
            offset,
            stored,
            computed,
        });
    }
    let disk_type = match be32(b, 60) {
        2 => DiskType::Fixed,
        3 => DiskType::Dynamic,
        4 => return Err(VpcError::Differencing { offset }),
        disk_type => return Err(VpcError::UnknownType { offset, disk_type }),
    };
    let at_start = offset == 0;
    if at_start != (disk_type == DiskType::Dynamic) {
        let found = match disk_type {
            DiskType::Fixed => "fixed",
            DiskType::Dynamic => "dynamic",
        };
        return Err(VpcError::MisplacedFooter { offset, found });
    }
    let chs = u64::from(be16(b, 56)) * u64::from(b[58]) * u64::from(b[59]);
    let creator_app: &[u8; 4] = b[28..32].try_into().expect("4 bytes");
    let sectors = if chs != MAX_GEOMETRY && SIZED_BY_GEOMETRY.contains(&creator_app) {
        chs
    } else {
        be64(b, 48) / SECTOR
    };
    if sectors > MAX_SECTORS {
        return Err(VpcError::TooLarge { offset, sectors });
    }
    Ok(Footer {
        disk_type,
        data_offset: be64(b, 16),
        virtual_size: sectors * SECTOR,
    })
}

/// A validated dynamic disk header, with the footer it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dynamic {
    pub header_offset: u64,
    pub table_offset: u64,
    pub table_entries: u64,
    pub block_size: u64,
    /// The sector bitmap before each block's data, rounded up to sectors.
    pub bitmap_size: u64,
    pub virtual_size: u64,
}

impl Dynamic {
    /// BAT entries that map the disk (the rest are never read).
    pub fn needed_entries(&self) -> u64 {
        self.virtual_size.div_ceil(self.block_size)
    }

    /// Where the blocks these BAT entries (big-endian, any of them, past the disk's end too)
    /// place end, at the furthest; 0 for none.
    pub fn blocks_end(&self, entries: &[u8]) -> u64 {
        bat_hosts(entries)
            .into_iter()
            .filter(|&h| h != HOLE)
            .map(|h| h + self.bitmap_size + self.block_size)
            .max()
            .unwrap_or(0)
    }

    /// The end of the BAT, rounded up to a sector.
    pub fn table_end(&self) -> u64 {
        self.table_offset
            .saturating_add(self.table_entries * 4)
            .next_multiple_of(SECTOR)
    }

    /// The block table's shape: blocks keep clear of the footer copy, this header and the BAT;
    /// the image reaches at least `min_len` (the BAT's end and the end of every block any of its
    /// entries places, as qemu's `free_data_block_offset`: qemu refuses a shorter image).
    pub(crate) fn layout(&self, min_len: u64) -> Layout {
        Layout {
            table: "BAT",
            block_size: self.block_size,
            virtual_size: self.virtual_size,
            data_skip: self.bitmap_size,
            reserved: vec![
                ("footer copy", 0, FOOTER_LEN as u64),
                (
                    "dynamic disk header",
                    self.header_offset,
                    self.header_offset.saturating_add(DYN_HEADER_SPAN),
                ),
                (
                    "BAT",
                    self.table_offset,
                    self.table_offset.saturating_add(self.table_entries * 4),
                ),
            ],
            min_len,
        }
    }
}

/// Parses the dynamic disk header found at `footer.data_offset` and checks its BAT against the
/// disk size as qemu does.
pub fn parse_dynamic(b: &[u8], footer: &Footer) -> Result<Dynamic, VpcError> {
    let offset = footer.data_offset;
    if !b.starts_with(SPARSE_MAGIC) || b.len() < DYN_HEADER_LEN {
        return Err(VpcError::NoDynamicHeader { offset });
    }
    // qemu ignores this header's checksum, and so does Quarry.
    let table_offset = be64(b, 16);
    let table_entries = u64::from(be32(b, 28));
    let raw_block_size = be32(b, 32);
    if !raw_block_size.is_power_of_two() || u64::from(raw_block_size) < SECTOR {
        return Err(VpcError::BlockSize {
            offset,
            block_size: raw_block_size,
        });
    }
    let block_size = u64::from(raw_block_size);
    let size = footer.virtual_size;
    if table_entries > MAX_TABLE_ENTRIES {
        return Err(VpcError::TableTooLarge {
            offset: table_offset,
            entries: table_entries,
        });
    }
    if table_entries * block_size < size {
        return Err(VpcError::TableTooSmall {
            offset: table_offset,
            entries: table_entries,
            block_size,
            size,
        });
    }
    let dynamic = Dynamic {
        header_offset: offset,
        table_offset,
        table_entries,
        block_size,
        bitmap_size: (block_size / (8 * SECTOR)).next_multiple_of(SECTOR),
        virtual_size: size,
    };
    if dynamic.needed_entries() > MAX_BLOCKS {
        return Err(VpcError::TooManyBlocks {
            offset: table_offset,
            blocks: dynamic.needed_entries(),
            block_size,
            max: MAX_BLOCKS,
        });
    }
    Ok(dynamic)
}

/// The host offset of each needed block from the BAT's bytes (big-endian sector numbers,
/// `0xFFFFFFFF` for an unallocated block).
pub fn bat_hosts(bat: &[u8]) -> Vec<u64> {
    bat.chunks_exact(4)
        .map(
            |e| match u32::from_be_bytes(e.try_into().expect("4 bytes")) {
                u32::MAX => HOLE,
                sector => u64::from(sector) * SECTOR,
            },
        )
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::error::FormatFault;

    /// A footer with these fields and a right checksum.
    pub(crate) struct FooterFields {
        pub disk_type: u32,
        pub data_offset: u64,
        pub current_size: u64,
        pub chs: (u16, u8, u8),
        pub creator_app: [u8; 4],
    }

    impl FooterFields {
        /// A dynamic disk as `qemu-img create -f vpc -o force_size=on` makes it: sized by its
        /// current size.
        pub fn dynamic(size: u64) -> FooterFields {
            FooterFields {
                disk_type: 3,
                data_offset: 512,
                current_size: size,
                chs: (65535, 16, 255),
                creator_app: *b"qem2",
            }
        }

        pub fn fixed(size: u64) -> FooterFields {
            FooterFields {
                disk_type: 2,
                data_offset: u64::MAX,
                ..FooterFields::dynamic(size)
            }
        }

        pub fn bytes(&self) -> Vec<u8> {
            let mut b = vec![0u8; FOOTER_LEN];
            b[..8].copy_from_slice(MAGIC);
            b[8..12].copy_from_slice(&2u32.to_be_bytes());
            b[12..16].copy_from_slice(&0x0001_0000u32.to_be_bytes());
            b[16..24].copy_from_slice(&self.data_offset.to_be_bytes());
            b[28..32].copy_from_slice(&self.creator_app);
            b[40..48].copy_from_slice(&self.current_size.to_be_bytes());
            b[48..56].copy_from_slice(&self.current_size.to_be_bytes());
            b[56..58].copy_from_slice(&self.chs.0.to_be_bytes());
            b[58] = self.chs.1;
            b[59] = self.chs.2;
            b[60..64].copy_from_slice(&self.disk_type.to_be_bytes());
            let sum = checksum(&b);
            b[64..68].copy_from_slice(&sum.to_be_bytes());
            b
        }
    }

    pub(crate) fn dyn_header(table_offset: u64, entries: u32, block_size: u32) -> Vec<u8> {
        let mut b = vec![0u8; 1024];
        b[..8].copy_from_slice(SPARSE_MAGIC);
        b[8..16].copy_from_slice(&u64::MAX.to_be_bytes());
        b[16..24].copy_from_slice(&table_offset.to_be_bytes());
        b[24..28].copy_from_slice(&0x0001_0000u32.to_be_bytes());
        b[28..32].copy_from_slice(&entries.to_be_bytes());
        b[32..36].copy_from_slice(&block_size.to_be_bytes());
        b
    }

    #[test]
    fn a_qemu_footer_is_sized_by_its_geometry() {
        // qemu-img create -f vpc 10M: geometry 302 x 4 x 17, current size 10 MiB.
        let f = FooterFields {
            chs: (302, 4, 17),
            creator_app: *b"qemu",
            ..FooterFields::dynamic(10 << 20)
        };
        let footer = parse_footer(&f.bytes(), 0).unwrap();
        assert_eq!(footer.virtual_size, 302 * 4 * 17 * 512);
        assert_eq!(footer.disk_type, DiskType::Dynamic);
        assert_eq!(footer.data_offset, 512);
    }

    #[test]
    fn other_apps_and_the_largest_geometry_use_the_current_size() {
        // What qemu 10 sizes by the current size: Hyper-V, Azure, qemu's force_size, Disk2vhd,
        // XenServer, XenConverter, and any other creator (an unknown one, a changed letter).
        let apps = [
            b"win ",
            b"wa\0\0",
            b"qem2",
            b"d2v ",
            b"CTXS",
            b"tap\0",
            b"abcd",
            b"wIn ",
            b"\0\0\0\0",
        ];
        for app in apps {
            let f = FooterFields {
                creator_app: *app,
                chs: (302, 4, 17),
                current_size: (20 << 20) + 7 * 512 + 100,
                ..FooterFields::dynamic(0)
            };
            let footer = parse_footer(&f.bytes(), 0).unwrap();
            assert_eq!(footer.virtual_size, (20 << 20) + 7 * 512, "{app:?}");
        }
        let f = FooterFields {
            creator_app: *b"vpc ",
            chs: (65535, 16, 255),
            current_size: 200 << 30,
            ..FooterFields::dynamic(0)
        };
        assert_eq!(parse_footer(&f.bytes(), 0).unwrap().virtual_size, 200 << 30);
        // Virtual PC and qemu go by the geometry.
        for app in SIZED_BY_GEOMETRY {
            let f = FooterFields {
                creator_app: *app,
                chs: (302, 4, 17),
                current_size: 20 << 20,
                ..FooterFields::dynamic(0)
            };
            assert_eq!(
                parse_footer(&f.bytes(), 0).unwrap().virtual_size,
                302 * 4 * 17 * 512,
                "{app:?}"
            );
        }
    }

    #[test]
    fn a_wrong_footer_checksum_is_corrupt_as_for_qemu() {
        let mut b = FooterFields::dynamic(1 << 20).bytes();
        b[100] ^= 1;
        assert!(matches!(
            parse_footer(&b, 0),
            Err(VpcError::FooterChecksum { offset: 0, .. })
        ));
    }

    #[test]
    fn differencing_disks_are_refused_as_unsupported() {
        let f = FooterFields {
            disk_type: 4,
            ..FooterFields::dynamic(1 << 20)
        };
        let e = parse_footer(&f.bytes(), 0).unwrap_err();
        assert_eq!(e, VpcError::Differencing { offset: 0 });
        assert!(e.is_refusal());
        let e = crate::Error::from(e);
        assert_eq!(e.kind(), crate::ErrorKind::Unsupported);
    }

    #[test]
    fn unknown_types_and_misplaced_footers_are_corrupt() {
        let f = FooterFields {
            disk_type: 5,
            ..FooterFields::dynamic(1 << 20)
        };
        assert!(matches!(
            parse_footer(&f.bytes(), 0),
            Err(VpcError::UnknownType { disk_type: 5, .. })
        ));
        assert!(matches!(
            parse_footer(&FooterFields::fixed(1 << 20).bytes(), 0),
            Err(VpcError::MisplacedFooter { found: "fixed", .. })
        ));
        assert!(matches!(
            parse_footer(&FooterFields::dynamic(1 << 20).bytes(), 4096),
            Err(VpcError::MisplacedFooter {
                found: "dynamic",
                ..
            })
        ));
        assert!(parse_footer(&FooterFields::fixed(1 << 20).bytes(), 4096).is_ok());
    }

    #[test]
    fn sizes_past_2040_gib_are_refused() {
        let f = FooterFields {
            creator_app: *b"win ",
            current_size: (MAX_SECTORS + 1) * 512,
            ..FooterFields::dynamic(0)
        };
        let e = parse_footer(&f.bytes(), 0).unwrap_err();
        assert!(matches!(e, VpcError::TooLarge { .. }), "{e}");
        assert_eq!(crate::Error::from(e).kind(), crate::ErrorKind::CorruptImage);
    }

    fn footer(size: u64) -> Footer {
        parse_footer(&FooterFields::dynamic(size).bytes(), 0).unwrap()
    }

    #[test]
    fn the_dynamic_header_needs_its_magic_and_a_power_of_two_block_size() {
        let mut h = dyn_header(1536, 4, 2 << 20);
        h[0] = b'X';
        assert!(matches!(
            parse_dynamic(&h, &footer(8 << 20)),
            Err(VpcError::NoDynamicHeader { offset: 512 })
        ));
        for bad in [0u32, 256, 3 << 20] {
            let h = dyn_header(1536, 64, bad);
            assert!(
                matches!(
                    parse_dynamic(&h, &footer(8 << 20)),
                    Err(VpcError::BlockSize { .. })
                ),
                "{bad}"
            );
        }
        let d = parse_dynamic(&dyn_header(1536, 4, 2 << 20), &footer(8 << 20)).unwrap();
        assert_eq!(d.bitmap_size, 512);
        assert_eq!(d.needed_entries(), 4);
        // 2 MiB blocks have a 64-byte bitmap rounded to a sector; 8 MiB blocks 2 KiB.
        let d = parse_dynamic(&dyn_header(1536, 1, 8 << 20), &footer(8 << 20)).unwrap();
        assert_eq!(d.bitmap_size, 2048);
    }

    #[test]
    fn a_bat_that_does_not_cover_the_disk_or_is_absurd_is_corrupt() {
        let e = parse_dynamic(&dyn_header(1536, 3, 2 << 20), &footer(8 << 20)).unwrap_err();
        assert!(
            matches!(e, VpcError::TableTooSmall { entries: 3, .. }),
            "{e}"
        );
        let e = parse_dynamic(&dyn_header(1536, u32::MAX, 2 << 20), &footer(8 << 20)).unwrap_err();
        assert!(matches!(e, VpcError::TableTooLarge { .. }), "{e}");
        assert!(!e.is_refusal());
    }

    #[test]
    fn more_blocks_than_quarry_maps_are_refused_as_unsupported() {
        // 512-byte blocks over a 2 GiB disk: 4 Mi entries.
        let size = 2u64 << 30;
        let f = FooterFields {
            creator_app: *b"win ",
            ..FooterFields::dynamic(size)
        };
        let footer = parse_footer(&f.bytes(), 0).unwrap();
        let e = parse_dynamic(&dyn_header(1536, 4 << 20, 512), &footer).unwrap_err();
        assert!(e.is_refusal(), "{e}");
    }

    #[test]
    fn bat_entries_are_sectors_or_holes() {
        let bat = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 3, 0, 1, 0, 0];
        assert_eq!(bat_hosts(&bat), vec![HOLE, 1536, 65536 * 512]);
    }
}
