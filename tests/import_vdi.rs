//! `quarry import` of vdi images made by qemu-img and qemu-io, dynamic and static, compared byte
//! for byte with `qemu-img convert -O raw` from a file, stdin, compressed and over HTTP; discarded
//! blocks; and the refused and corrupt images by exit code.

use std::fs;
use std::path::Path;

mod common;
mod disk_formats;
use common::mutants::{self, Base, Campaign, Field};
use common::*;
use disk_formats::*;

const SIZE: &str = "41000k";
/// Where qemu-img puts the block map.
const BMAP: u64 = 0x200;

/// The block map entry of guest block `n`.
fn entry(image: &Path, n: u64) -> u32 {
    let at = (BMAP + 4 * n) as usize;
    u32::from_le_bytes(fs::read(image).unwrap()[at..at + 4].try_into().unwrap())
}

#[test]
fn dynamic_and_static_vdis_equal_qemu_img_from_every_source() {
    let dir = tempfile::tempdir().unwrap();
    for (name, opts, size) in [
        ("dynamic.vdi", "", SIZE),
        ("static.vdi", "static=on", SIZE),
        // An odd size: the disk ends mid-block, mid-sector rounded up.
        ("odd.vdi", "", "9000001"),
    ] {
        let image = written_image(dir.path(), name, "vdi", opts, size);
        let expected = reference(&image, None, dir.path());
        import_everywhere(&image, None, "vdi", &expected);
    }
}

#[test]
fn a_vdi_converted_by_qemu_img_equals_its_raw_conversion() {
    import_qemu_img_conversion("vdi");
}

#[test]
fn a_discarded_block_reads_as_zeroes_as_in_qemu() {
    let dir = tempfile::tempdir().unwrap();
    let image = written_image(dir.path(), "d.vdi", "vdi", "", SIZE);
    assert!(entry(&image, 0) < 0xffff_fffe, "block 0 is written");
    let discarded = patched(&image, "discarded.vdi", BMAP, &0xffff_fffeu32.to_le_bytes());
    let expected = reference(&discarded, None, dir.path());
    assert!(expected[..1 << 20].iter().all(|&b| b == 0));
    let target = dir.path().join("disk.img");
    assert_ok(&run(&["import", arg(&discarded), arg(&target)]));
    assert_same("discarded block", &fs::read(&target).unwrap(), &expected);
}

#[test]
fn corrupt_vdis_fail_with_exit_12_naming_what_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let image = written_image(dir.path(), "d.vdi", "vdi", "", SIZE);
    let len = fs::metadata(&image).unwrap().len();
    // Guest block 3 (3 MiB..4 MiB, written zeroes) pointing past the end.
    assert!(entry(&image, 3) < 0xffff_fffe, "block 3 is written");
    let past = patched(&image, "past.vdi", BMAP + 12, &1000u32.to_le_bytes());
    assert_fails_everywhere(&past, &[], 12, "block map entry 3");
    // Guest block 3 sharing block 0's place.
    let shared = patched(
        &image,
        "shared.vdi",
        BMAP + 12,
        &entry(&image, 0).to_le_bytes(),
    );
    assert_fails_everywhere(&shared, &[], 12, "over each other");
    // A block map far too small for the disk, and an absurd one.
    let small = patched(&image, "small.vdi", 384, &2u32.to_le_bytes());
    assert_fails_everywhere(&small, &[], 12, "do not cover the disk");
    let absurd = patched(&image, "absurd.vdi", 384, &u32::MAX.to_le_bytes());
    assert_fails_everywhere(&absurd, &[], 12, "more than a VDI can have");
    // Cut in the middle of the blocks.
    let cut = dir.path().join("cut.vdi");
    fs::write(&cut, &fs::read(&image).unwrap()[..len as usize / 2]).unwrap();
    assert_fails_everywhere(&cut, &[], 12, "past the end of the image");
}

#[test]
fn snapshot_and_differencing_vdis_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image = written_image(dir.path(), "d.vdi", "vdi", "", "8M");
    let child = patched(&image, "child.vdi", 440, &[0x42; 16]);
    assert_fails_everywhere(&child, &[], 11, "parent UUID");
    let snapshot = patched(&image, "snap.vdi", 424, &[0x42; 16]);
    assert_fails_everywhere(&snapshot, &[], 11, "link UUID");
}

#[test]
fn a_vdi_too_large_for_the_volume_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let image = written_image(dir.path(), "d.vdi", "vdi", "", SIZE);
    assert_fails_everywhere(&image, &["--size", "20Mi"], 13, "does not fit");
}

/// The header's fields and the block map's entries (qemu's header layout, version 1.1).
fn vdi_fields(image: &[u8]) -> Vec<Field> {
    let mut fields = mutants::fields(
        false,
        "",
        0,
        &[
            ("signature", 64, 4),
            ("version", 68, 4),
            ("header size", 72, 4),
            ("image type", 76, 4),
            ("image flags", 80, 4),
            ("block map offset", 340, 4),
            ("data offset", 344, 4),
            ("sector size", 360, 4),
            ("disk size", 368, 8),
            ("block size", 376, 4),
            ("block extra", 380, 4),
            ("blocks in image", 384, 4),
            ("blocks allocated", 388, 4),
            ("link UUID", 424, 8),
            ("parent UUID", 440, 8),
        ],
    );
    // Text, description, geometry, the image's and last snapshot's UUIDs: no part in the disk.
    let inert = mutants::fields(
        false,
        "",
        0,
        &[
            ("text", 0, 4),
            ("description", 84, 8),
            ("cylinders", 348, 4),
            ("heads", 352, 4),
            ("sectors", 356, 4),
            ("image UUID", 392, 8),
            ("last snapshot UUID", 408, 8),
        ],
    );
    fields.extend(inert.into_iter().map(Field::inert));
    let bmap = Field::le("", 340, 4).read(image) as usize;
    let blocks = Field::le("", 384, 4).read(image) as usize;
    fields.extend(mutants::table("block map", bmap, blocks, 4, false));
    fields
}

#[test]
fn mutated_vdis_give_qemu_img_s_bytes_or_fail() {
    let dir = tempfile::tempdir().unwrap();
    let images = [
        small_image(dir.path(), "dynamic.vdi", "vdi", "", "3M"),
        small_image(dir.path(), "static.vdi", "vdi", "static=on", "2M"),
        small_image(dir.path(), "odd.vdi", "vdi", "", "2000001"),
    ];
    let bases = images.iter().map(|i| Base::read(i, vdi_fields)).collect();
    mutants::run(Campaign {
        mutants: 80,
        ..Campaign::new("vdi", bases)
    });
}
