//! Pure parsing of the vdi header (version 1.1) and its block map, with the checks of qemu's
//! `block/vdi.c` (qemu 10), in its order.
//!
//! The disk size is the header's, rounded up to whole sectors (VBoxManage can write odd sizes).
//! The block map holds one little-endian entry per 1 MiB block: a block number (its data is at
//! `offset_data + number * 1 MiB`), `0xFFFFFFFF` (never allocated) or `0xFFFFFFFE` (discarded);
//! both of the latter read as zeroes. As in qemu, the image type (dynamic, static) is not
//! consulted: a static image simply has every block allocated.

use super::error::VdiError;
use crate::format::blocks::{HOLE, Layout, MAX_BLOCKS};
use crate::format::fields::{le32, le64};

pub const HEADER_LEN: usize = 512;
pub const SIGNATURE: u32 = 0xbeda_107f;
const VERSION_1_1: u32 = 0x0001_0001;
const SECTOR: u64 = 512;
const BLOCK_SIZE: u64 = 1 << 20;
/// qemu's limits: a block map of at most `INT_MAX` bytes once rounded to sectors.
const BLOCKS_MAX: u64 = (i32::MAX as u64 + 1 - SECTOR) / 4;
const DISK_SIZE_MAX: u64 = BLOCKS_MAX * BLOCK_SIZE;
/// Block map entries from this one up are not allocated (discarded, never allocated).
const FIRST_UNALLOCATED: u32 = 0xffff_fffe;

/// A validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub offset_bmap: u64,
    pub offset_data: u64,
    pub virtual_size: u64,
    pub blocks_in_image: u64,
}

impl Header {
    /// Block map entries that map the disk.
    pub fn needed_entries(&self) -> u64 {
        self.virtual_size.div_ceil(BLOCK_SIZE)
    }

    /// The block table's shape: blocks keep clear of the header and the block map.
    pub(crate) fn layout(&self) -> Layout {
        let map_len = (self.blocks_in_image * 4).next_multiple_of(SECTOR);
        Layout {
            table: "block map",
            block_size: BLOCK_SIZE,
            virtual_size: self.virtual_size,
            data_skip: 0,
            reserved: vec![
                ("header", 0, HEADER_LEN as u64),
                ("block map", self.offset_bmap, self.offset_bmap + map_len),
            ],
            min_len: 0,
        }
    }

    /// The host offset of each needed block from the block map's bytes.
    pub fn hosts(&self, map: &[u8]) -> Vec<u64> {
        map.chunks_exact(4)
            .map(
                |e| match u32::from_le_bytes(e.try_into().expect("4 bytes")) {
                    n if n >= FIRST_UNALLOCATED => HOLE,
                    n => self.offset_data + u64::from(n) * BLOCK_SIZE,
                },
            )
            .collect()
    }
}

/// Parses and checks the header (the first 512 bytes of the image).
pub fn parse(b: &[u8]) -> Result<Header, VdiError> {
    if b.len() < HEADER_LEN {
        return Err(VdiError::ShortHeader {
            len: b.len() as u64,
        });
    }
    let disk_size = le64(b, 368);
    if disk_size > DISK_SIZE_MAX {
        return Err(VdiError::TooLarge {
            size: disk_size,
            max: DISK_SIZE_MAX,
        });
    }
    let virtual_size = disk_size.next_multiple_of(SECTOR);
    let signature = le32(b, 0x40);
    let version = le32(b, 0x44);
    let offset_bmap = u64::from(le32(b, 340));
    let offset_data = u64::from(le32(b, 344));
    let sector_size = le32(b, 360);
    let block_size = le32(b, 376);
    let blocks_in_image = u64::from(le32(b, 384));
    let null = |at: usize| b[at..at + 16].iter().all(|&x| x == 0);
    if signature != SIGNATURE {
        return Err(VdiError::Signature { signature });
    }
    if version != VERSION_1_1 {
        return Err(VdiError::Version {
            major: version >> 16,
            minor: version & 0xffff,
        });
    }
    for (what, offset) in [("block map", offset_bmap), ("data", offset_data)] {
        if offset % SECTOR != 0 {
            return Err(VdiError::Misaligned { what, offset });
        }
    }
    if u64::from(sector_size) != SECTOR {
        return Err(VdiError::SectorSize { sector_size });
    }
    if u64::from(block_size) != BLOCK_SIZE {
        return Err(VdiError::BlockSize { block_size });
    }
    if virtual_size > blocks_in_image * BLOCK_SIZE {
        return Err(VdiError::TableTooSmall {
            offset: offset_bmap,
            blocks: blocks_in_image,
            size: virtual_size,
        });
    }
    if !null(424) {
        return Err(VdiError::Linked { what: "link" });
    }
    if !null(440) {
        return Err(VdiError::Linked { what: "parent" });
    }
    if blocks_in_image > BLOCKS_MAX {
        return Err(VdiError::TableTooLarge {
            offset: offset_bmap,
            blocks: blocks_in_image,
        });
    }
    let header = Header {
        offset_bmap,
        offset_data,
        virtual_size,
        blocks_in_image,
    };
    if header.needed_entries() > MAX_BLOCKS {
        return Err(VdiError::TooManyBlocks {
            offset: offset_bmap,
            blocks: header.needed_entries(),
            max: MAX_BLOCKS,
        });
    }
    Ok(header)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::error::FormatFault;

    /// A header as `qemu-img create -f vdi` writes it for `size` bytes (`static` for
    /// `-o static=on`): block map at 0x200, data right after it.
    pub(crate) fn header(size: u64, is_static: bool) -> Vec<u8> {
        let blocks = size.div_ceil(BLOCK_SIZE) as u32;
        let map_len = (u64::from(blocks) * 4).next_multiple_of(SECTOR) as u32;
        let mut b = vec![0u8; HEADER_LEN];
        b[..36].copy_from_slice(b"<<< QEMU VM Virtual Disk Image >>>\n\0");
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(0x40, &SIGNATURE.to_le_bytes());
        put(0x44, &VERSION_1_1.to_le_bytes());
        put(0x48, &0x180u32.to_le_bytes());
        put(0x4c, &(if is_static { 2u32 } else { 1 }).to_le_bytes());
        put(340, &0x200u32.to_le_bytes());
        put(344, &(0x200 + map_len).to_le_bytes());
        put(360, &512u32.to_le_bytes());
        put(368, &size.to_le_bytes());
        put(376, &(BLOCK_SIZE as u32).to_le_bytes());
        put(384, &blocks.to_le_bytes());
        put(392, &[7u8; 16]); // the image's own UUID
        b
    }

    fn with(mut b: Vec<u8>, at: usize, v: &[u8]) -> Vec<u8> {
        b[at..at + v.len()].copy_from_slice(v);
        b
    }

    #[test]
    fn a_qemu_header_parses() {
        let h = parse(&header(3 << 20, false)).unwrap();
        assert_eq!(
            h,
            Header {
                offset_bmap: 0x200,
                offset_data: 0x400,
                virtual_size: 3 << 20,
                blocks_in_image: 3,
            }
        );
        assert_eq!(h.needed_entries(), 3);
    }

    #[test]
    fn an_odd_disk_size_is_rounded_up_to_sectors() {
        let h = parse(&with(
            header(3 << 20, false),
            368,
            &((2 << 20) + 1u64).to_le_bytes(),
        ))
        .unwrap();
        assert_eq!(h.virtual_size, (2 << 20) + 512);
    }

    #[test]
    fn a_short_header_or_a_wrong_signature_is_corrupt() {
        let e = parse(&header(1 << 20, false)[..300]).unwrap_err();
        assert_eq!(e, VdiError::ShortHeader { len: 300 });
        let e = parse(&with(header(1 << 20, false), 0x40, &[0; 4])).unwrap_err();
        assert!(matches!(e, VdiError::Signature { signature: 0 }), "{e}");
        assert!(!e.is_refusal());
    }

    #[test]
    fn other_versions_sector_and_block_sizes_are_unsupported() {
        for (at, v) in [(0x44, 0x0001_0000u32), (360, 4096), (376, 2 << 20)] {
            let e = parse(&with(header(4 << 20, false), at, &v.to_le_bytes())).unwrap_err();
            assert!(e.is_refusal(), "{e}");
        }
    }

    #[test]
    fn misaligned_offsets_are_corrupt() {
        for at in [340, 344] {
            let e = parse(&with(header(1 << 20, false), at, &0x201u32.to_le_bytes())).unwrap_err();
            assert!(
                matches!(e, VdiError::Misaligned { offset: 0x201, .. }),
                "{e}"
            );
        }
    }

    #[test]
    fn a_block_map_too_small_for_the_disk_is_corrupt() {
        let e = parse(&with(header(3 << 20, false), 384, &2u32.to_le_bytes())).unwrap_err();
        assert!(
            matches!(e, VdiError::TableTooSmall { blocks: 2, .. }),
            "{e}"
        );
        assert_eq!(crate::Error::from(e).kind(), crate::ErrorKind::CorruptImage);
    }

    #[test]
    fn absurd_sizes_are_corrupt() {
        let e = parse(&with(header(1 << 20, false), 368, &u64::MAX.to_le_bytes())).unwrap_err();
        assert!(matches!(e, VdiError::TooLarge { .. }), "{e}");
        let e = parse(&with(header(1 << 20, false), 384, &u32::MAX.to_le_bytes())).unwrap_err();
        assert!(matches!(e, VdiError::TableTooLarge { .. }), "{e}");
        assert!(!e.is_refusal());
    }

    #[test]
    fn more_blocks_than_quarry_maps_are_unsupported() {
        let size = (MAX_BLOCKS + 1) * BLOCK_SIZE;
        let h = with(
            header(size, false),
            384,
            &((MAX_BLOCKS + 1) as u32).to_le_bytes(),
        );
        let e = parse(&h).unwrap_err();
        assert!(matches!(e, VdiError::TooManyBlocks { .. }), "{e}");
        assert!(e.is_refusal());
    }

    #[test]
    fn snapshots_and_differencing_images_are_unsupported() {
        for (at, what) in [(424, "link"), (440, "parent")] {
            let e = parse(&with(header(1 << 20, false), at, &[1; 16])).unwrap_err();
            assert_eq!(e, VdiError::Linked { what });
            assert_eq!(crate::Error::from(e).kind(), crate::ErrorKind::Unsupported);
        }
    }

    #[test]
    fn unallocated_and_discarded_entries_are_holes() {
        let h = parse(&header(4 << 20, false)).unwrap();
        let mut map = Vec::new();
        for e in [0xffff_ffffu32, 0xffff_fffe, 0, 5] {
            map.extend(e.to_le_bytes());
        }
        assert_eq!(
            h.hosts(&map),
            vec![HOLE, HOLE, 0x400, 0x400 + 5 * BLOCK_SIZE]
        );
    }
}
