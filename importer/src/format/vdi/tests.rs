//! Conversions of small vdi images built in code, from a stream and from a file, and the corrupt
//! and refused ones by error kind.

use super::VdiReader;
use super::header::tests::header;
use crate::error::ErrorKind;
use crate::format::blocks::tests::{Converted, convert_all, failure};

const MIB: u64 = 1 << 20;

fn both(image: &[u8]) -> Vec<Converted> {
    convert_all(
        image,
        |r, o| Ok(Box::new(VdiReader::new(r, o)?)),
        |f, len| Ok(Box::new(VdiReader::open(f, len)?)),
    )
}

fn set(image: &mut Vec<u8>, at: u64, bytes: &[u8]) {
    let end = at as usize + bytes.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[at as usize..end].copy_from_slice(bytes);
}

/// A vdi of `size` bytes as qemu lays it out (block map at 0x200, data after it) with the given
/// block map entries; block number `n` holds bytes `n + 1`. Returns the image and its guest disk.
fn vdi(size: u64, entries: &[u32]) -> (Vec<u8>, Vec<u8>) {
    let mut image = header(size, false);
    let offset_data = u32::from_le_bytes(image[344..348].try_into().unwrap()) as u64;
    let mut guest = vec![0u8; size as usize];
    for (g, &e) in entries.iter().enumerate() {
        set(&mut image, 0x200 + 4 * g as u64, &e.to_le_bytes());
        if e < 0xffff_fffe {
            let fill = vec![e as u8 + 1; MIB as usize];
            set(&mut image, offset_data + u64::from(e) * MIB, &fill);
            let start = g as u64 * MIB;
            let end = (start + MIB).min(size);
            guest[start as usize..end as usize].fill(e as u8 + 1);
        }
    }
    image.resize(image.len().max(offset_data as usize), 0);
    (image, guest)
}

#[test]
fn a_dynamic_image_converts_with_unallocated_discarded_and_out_of_order_blocks() {
    // Four blocks, the last one partial (an odd size rounded up to sectors): block 1
    // unallocated, block 2 discarded, blocks 0 and 3 stored in reverse order.
    let size = 3 * MIB + 4096;
    let (image, guest) = vdi(size, &[1, 0xffff_ffff, 0xffff_fffe, 0]);
    for got in both(&image) {
        let (n, bytes) = got.unwrap();
        assert_eq!(n, size);
        assert!(bytes == guest, "guest disk differs");
    }
}

#[test]
fn a_static_image_reads_every_block() {
    let (mut image, guest) = vdi(2 * MIB, &[0, 1]);
    image[0x4c] = 2; // static
    for got in both(&image) {
        assert!(got.unwrap().1 == guest);
    }
}

#[test]
fn blocks_before_the_block_map_come_from_the_hold() {
    // The block map after the data: offset_data 0x200, offset_bmap 0x200 + 2 MiB.
    let mut image = header(2 * MIB, false);
    let bmap = 0x200 + 2 * MIB;
    image[340..344].copy_from_slice(&(bmap as u32).to_le_bytes());
    image[344..348].copy_from_slice(&0x200u32.to_le_bytes());
    set(&mut image, 0x200, &vec![5u8; MIB as usize]);
    set(&mut image, 0x200 + MIB, &vec![6u8; MIB as usize]);
    let mut map = 1u32.to_le_bytes().to_vec();
    map.extend(0u32.to_le_bytes());
    set(&mut image, bmap, &map);
    let mut guest = vec![6u8; MIB as usize];
    guest.extend(vec![5u8; MIB as usize]);
    for got in both(&image) {
        assert!(got.unwrap().1 == guest);
    }
}

#[test]
fn a_block_past_the_end_is_corrupt_naming_the_block_map() {
    let (mut image, _) = vdi(2 * MIB, &[0, 1]);
    image.truncate(image.len() - 100);
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("block map entry 1"), "{msg}");
    }
}

#[test]
fn two_entries_for_one_block_are_corrupt() {
    let (mut image, _) = vdi(2 * MIB, &[0, 1]);
    image[0x204..0x208].copy_from_slice(&0u32.to_le_bytes());
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("block map entries 0 and 1"), "{msg}");
    }
}

#[test]
fn a_truncated_block_map_is_corrupt() {
    let (image, _) = vdi(200 * MIB, &[]);
    for got in both(&image[..0x300]) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("the block map at 0x200"), "{msg}");
    }
}

#[test]
fn a_parent_uuid_is_refused() {
    let (mut image, _) = vdi(MIB, &[0xffff_ffff]);
    image[440] = 1;
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::Unsupported, "{msg}");
        assert!(msg.contains("parent UUID"), "{msg}");
    }
}

#[test]
fn a_short_header_is_corrupt() {
    let (image, _) = vdi(MIB, &[0xffff_ffff]);
    for got in both(&image[..100]) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("100 bytes"), "{msg}");
    }
}
