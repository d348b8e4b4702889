//! Conversions of small vhd images built in code, from a stream and from a file, and the corrupt
//! and refused ones by error kind.

use super::VpcReader;
use super::header::tests::{FooterFields, dyn_header};
use crate::error::ErrorKind;
use crate::format::blocks::tests::{Converted, convert_all, failure};

const BS: u64 = 4096;
/// A 4 KiB block's bitmap: one sector.
const BITMAP: u64 = 512;

/// A dynamic vhd of `size` bytes with 4 KiB blocks, its BAT at `bat_at`, and the given guest
/// blocks at the given host offsets; returns the image and the guest disk it holds.
fn dynamic(size: u64, bat_at: u64, blocks: &[(u64, u64)]) -> (Vec<u8>, Vec<u8>) {
    let entries = size.div_ceil(BS) as u32;
    let footer = FooterFields::dynamic(size).bytes();
    let mut image = footer.clone();
    image.extend(dyn_header(bat_at, entries, BS as u32));
    let mut bat = vec![0xffu8; entries as usize * 4];
    let mut guest = vec![0u8; size as usize];
    for &(g, host) in blocks {
        bat[g as usize * 4..g as usize * 4 + 4]
            .copy_from_slice(&((host / 512) as u32).to_be_bytes());
        let end = (host + BITMAP + BS) as usize;
        if image.len() < end {
            image.resize(end, 0);
        }
        image[host as usize..(host + BITMAP) as usize].fill(0xff);
        for i in 0..BS {
            let b = (g as u8).wrapping_mul(31).wrapping_add(i as u8) | 1;
            image[(host + BITMAP + i) as usize] = b;
            if g * BS + i < size {
                guest[(g * BS + i) as usize] = b;
            }
        }
    }
    let bat_end = bat_at as usize + bat.len();
    if image.len() < bat_end {
        image.resize(bat_end, 0);
    }
    image[bat_at as usize..bat_end].copy_from_slice(&bat);
    image.extend(&footer);
    (image, guest)
}

fn both(image: &[u8]) -> Vec<Converted> {
    convert_all(
        image,
        |r, o| Ok(Box::new(VpcReader::new(r, o)?)),
        |f, len| Ok(Box::new(VpcReader::open(f, len)?)),
    )
}

#[test]
fn a_dynamic_disk_converts_with_holes_blocks_out_of_order_and_an_odd_size() {
    // Five blocks, the last one partial; block 1 unallocated; blocks stored 3, 0, 4, 2.
    let size = 4 * BS + 1536;
    let blocks = [
        (3, 2048),
        (0, 2048 + 4608),
        (4, 2048 + 2 * 4608),
        (2, 2048 + 3 * 4608),
    ];
    let (image, guest) = dynamic(size, 1536, &blocks);
    for got in both(&image) {
        let (n, bytes) = got.unwrap();
        assert_eq!(n, size);
        assert!(bytes == guest, "guest disk differs");
        assert!(bytes[BS as usize..2 * BS as usize].iter().all(|&b| b == 0));
    }
}

#[test]
fn blocks_before_the_bat_come_from_the_hold() {
    // The BAT after the blocks: a stream holds them (or spills them with no memory budget).
    let blocks = [(1, 2048), (0, 2048 + 4608)];
    let bat_at = 2048 + 2 * 4608;
    let (image, guest) = dynamic(2 * BS, bat_at, &blocks);
    for got in both(&image) {
        assert!(got.unwrap().1 == guest);
    }
}

#[test]
fn the_sector_bitmap_is_not_consulted_as_in_qemu() {
    // qemu reads an allocated block whole whatever its bitmap says; so does Quarry.
    let (mut image, guest) = dynamic(BS, 1536, &[(0, 2048)]);
    image[2048..2048 + 512].fill(0);
    for got in both(&image) {
        assert!(got.unwrap().1 == guest);
    }
}

#[test]
fn a_bat_entry_past_the_end_is_corrupt_naming_the_bat() {
    let (mut image, _) = dynamic(2 * BS, 1536, &[(0, 2048)]);
    let far = (image.len() as u32 / 512 + 100).to_be_bytes();
    image[1536 + 4..1536 + 8].copy_from_slice(&far);
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("BAT entry 1"), "{msg}");
    }
}

#[test]
fn overlapping_bat_entries_are_corrupt() {
    let (mut image, _) = dynamic(2 * BS, 1536, &[(0, 2048), (1, 2048 + 4608)]);
    image[1536 + 4..1536 + 8].copy_from_slice(&(2048u32 / 512 + 1).to_be_bytes());
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("over each other"), "{msg}");
    }
}

#[test]
fn a_block_over_the_bat_or_headers_is_corrupt() {
    let (mut image, _) = dynamic(2 * BS, 1536, &[(0, 2048)]);
    image[1536..1540].copy_from_slice(&0u32.to_be_bytes());
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("over the footer copy"), "{msg}");
    }
}

#[test]
fn a_last_block_cut_past_the_disk_s_end_is_truncation_from_a_stream_as_from_a_file() {
    // A disk of a block and a half: the last block's second half lies past the disk's end, and
    // the image is cut in it (its footer gone too). qemu refuses it ("free_data_block_offset
    // points after the end of file"), whatever lies past the disk's end.
    let size = BS + BS / 2;
    let (image, _) = dynamic(size, 1536, &[(0, 2048), (1, 2048 + 4608)]);
    let cut = (2048 + 4608 + BITMAP + BS - 100) as usize;
    for got in both(&image[..cut]) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("BAT entry 1"), "{msg}");
    }
    // Whole, without its footer: read as qemu reads it.
    let whole = (2048 + 4608 + BITMAP + BS) as usize;
    for got in both(&image[..whole]) {
        assert_eq!(got.unwrap().0, size);
    }
}

#[test]
fn a_bat_entry_past_the_disk_s_end_must_place_its_block_inside_the_image_as_in_qemu() {
    // Two BAT entries, both allocated, for a disk of one block: qemu reads the whole BAT and
    // refuses an image that ends before any block it places ends.
    let (mut image, guest) = dynamic(2 * BS, 1536, &[(0, 2048), (1, 2048 + 4608)]);
    let footer = FooterFields::dynamic(BS).bytes();
    let end = image.len() - 512;
    image[..512].copy_from_slice(&footer);
    image[end..].copy_from_slice(&footer);
    for got in both(&image) {
        let (n, bytes) = got.unwrap();
        assert_eq!(n, BS);
        assert!(bytes[..] == guest[..BS as usize]);
    }
    for cut in [2048 + 4608 + 100, end - 1] {
        for got in both(&image[..cut]) {
            let (k, msg) = failure(got);
            assert_eq!(k, ErrorKind::CorruptImage, "cut at {cut}: {msg}");
            assert!(msg.contains("truncated"), "cut at {cut}: {msg}");
        }
    }
    // Pointing past the end of the image, whole.
    let far = (image.len() as u32 / 512 + 100).to_be_bytes();
    image[1536 + 4..1536 + 8].copy_from_slice(&far);
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("truncated"), "{msg}");
    }
}

#[test]
fn a_truncated_image_is_corrupt_naming_what_is_missing() {
    let (image, _) = dynamic(2 * BS, 1536, &[(0, 2048), (1, 2048 + 4608)]);
    for (cut, what) in [
        (700, "dynamic disk header"),
        (1540, "the BAT"),
        (9000, "BAT entry 1"),
    ] {
        for got in both(&image[..cut]) {
            let (k, msg) = failure(got);
            assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
            assert!(msg.contains(what), "cut at {cut}: {msg}");
        }
    }
}

#[test]
fn an_absurd_bat_is_refused_before_any_read() {
    let (mut image, _) = dynamic(BS, 1536, &[]);
    image[512 + 28..512 + 32].copy_from_slice(&u32::MAX.to_be_bytes());
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("more than a VHD can have"), "{msg}");
    }
}

#[test]
fn a_differencing_disk_is_refused() {
    let (mut image, _) = dynamic(BS, 1536, &[]);
    let f = FooterFields {
        disk_type: 4,
        ..FooterFields::dynamic(BS)
    };
    image[..512].copy_from_slice(&f.bytes());
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::Unsupported, "{msg}");
        assert!(msg.contains("differencing"), "{msg}");
    }
}

/// A fixed disk: `data`, then a footer stating `footer`.
fn fixed(data: &[u8], footer: FooterFields) -> Vec<u8> {
    let mut image = data.to_vec();
    image.extend(footer.bytes());
    image
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[test]
fn a_fixed_disk_is_its_data_before_the_footer() {
    // Larger than the held tail, so a stream writes some before the footer arrives.
    let data = pattern(3 << 20);
    let image = fixed(&data, FooterFields::fixed(data.len() as u64));
    for got in both(&image) {
        let (n, bytes) = got.unwrap();
        assert_eq!(n, data.len() as u64);
        assert!(bytes == data);
    }
}

#[test]
fn a_fixed_disk_sized_by_its_geometry_drops_the_data_past_it() {
    // Virtual PC: 20 cylinders x 4 heads x 17 sectors stated over more data than that.
    let data = pattern(20 * 4 * 17 * 512 + 3000);
    let f = FooterFields {
        creator_app: *b"vpc ",
        chs: (20, 4, 17),
        ..FooterFields::fixed(data.len() as u64)
    };
    let image = fixed(&data, f);
    for got in both(&image) {
        let (n, bytes) = got.unwrap();
        assert_eq!(n, 20 * 4 * 17 * 512);
        assert!(bytes == data[..n as usize]);
    }
}

#[test]
fn a_fixed_disk_larger_than_its_data_is_corrupt() {
    let data = pattern(8192);
    let image = fixed(&data, FooterFields::fixed(16384));
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("states 16384 bytes"), "{msg}");
    }
}

#[test]
fn no_footer_at_either_end_is_corrupt() {
    for image in [pattern(8192), pattern(100), Vec::new()] {
        for got in both(&image) {
            let (k, msg) = failure(got);
            assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
            assert!(msg.contains("no \"conectix\" footer"), "{msg}");
        }
    }
}

#[test]
fn a_fixed_footer_with_a_wrong_checksum_is_corrupt() {
    let mut image = fixed(&pattern(4096), FooterFields::fixed(4096));
    let at = image.len() - 400;
    image[at] ^= 0x40;
    for got in both(&image) {
        let (k, msg) = failure(got);
        assert_eq!(k, ErrorKind::CorruptImage, "{msg}");
        assert!(msg.contains("footer at 0x1000: checksum"), "{msg}");
    }
}
