//! `quarry import` of vhd images (qemu's `vpc`) made by qemu-img and qemu-io, fixed and dynamic,
//! with `force_size` both ways, compared byte for byte with `qemu-img convert -O raw` from a file,
//! stdin, compressed and over HTTP; the creator applications that change the disk size; and the
//! refused and corrupt images by exit code.

use std::fs;
use std::path::Path;

mod common;
mod disk_formats;
use common::mutants::{self, Base, Campaign, Field};
use common::*;
use disk_formats::*;

/// qemu's footer checksum: the one's complement of the byte sum, the checksum field as zero.
fn with_checksum(mut footer: Vec<u8>) -> Vec<u8> {
    footer[64..68].fill(0);
    let sum = footer.iter().fold(0u32, |s, &b| s.wrapping_add(b.into()));
    footer[64..68].copy_from_slice(&(!sum).to_be_bytes());
    footer
}

/// A copy of `image` whose footers (the copy at 0 of a dynamic disk, and the one at the end)
/// are changed by `change`, checksums fixed.
fn refooted(image: &Path, name: &str, change: impl Fn(&mut Vec<u8>)) -> std::path::PathBuf {
    let mut data = fs::read(image).unwrap();
    let end = data.len() - 512;
    let mut at = vec![end];
    if data.starts_with(b"conectix") {
        at.push(0);
    }
    for at in at {
        let mut footer = data[at..at + 512].to_vec();
        change(&mut footer);
        data[at..at + 512].copy_from_slice(&with_checksum(footer));
    }
    let out = image.with_file_name(name);
    fs::write(&out, data).unwrap();
    out
}

const SIZE: &str = "41000k";

#[test]
fn fixed_and_dynamic_vhds_equal_qemu_img_from_every_source_with_force_size_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    for (subformat, force) in [
        ("dynamic", "off"),
        ("dynamic", "on"),
        ("fixed", "off"),
        ("fixed", "on"),
    ] {
        let name = format!("{subformat}-force-{force}.vhd");
        let opts = format!("subformat={subformat},force_size={force}");
        let image = written_image(dir.path(), &name, "vpc", &opts, SIZE);
        // A fixed vhd is read as one only when asked (qemu-img needs `-f vpc` too).
        let format = (subformat == "fixed").then_some(if force == "on" { "vhd" } else { "vpc" });
        let expected = reference(&image, format.map(|_| "vpc"), dir.path());
        if force == "on" {
            assert_eq!(
                expected.len(),
                41000 * 1024,
                "{name}: force_size keeps the size"
            );
        } else {
            assert!(expected.len() >= 41000 * 1024, "{name}: CHS rounds up");
        }
        import_everywhere(&image, format, "vpc", &expected);
    }
}

#[test]
fn a_vhd_converted_by_qemu_img_equals_its_raw_conversion() {
    import_qemu_img_conversion("vpc");
}

#[test]
fn a_fixed_vhd_without_format_is_raw_as_for_qemu_img() {
    let dir = tempfile::tempdir().unwrap();
    let image = written_image(dir.path(), "fixed.vhd", "vpc", "subformat=fixed", "8M");
    let expected = reference(&image, None, dir.path());
    assert_eq!(
        expected,
        fs::read(&image).unwrap(),
        "qemu-img reads it raw, footer and all"
    );
    let target = dir.path().join("disk.img");
    let out = run(&["import", arg(&image), arg(&target), "--json"]);
    assert_ok(&out);
    assert_eq!(json(&out)["format_chain"], serde_json::json!(["raw"]));
    assert_same("fixed vhd as raw", &fs::read(&target).unwrap(), &expected);
}

#[test]
fn creator_apps_size_the_disk_as_qemu_does() {
    // Hyper-V and Azure size a disk by the footer's current size, Virtual PC by its geometry:
    // the same footers with a current size 1 MiB + 3 sectors short of the geometry's.
    let dir = tempfile::tempdir().unwrap();
    for subformat in ["fixed", "dynamic"] {
        let name = format!("{subformat}.vhd");
        let image = written_image(
            dir.path(),
            &name,
            "vpc",
            &format!("subformat={subformat}"),
            SIZE,
        );
        let chs = virtual_size(&image, "vpc");
        let format = (subformat == "fixed").then_some("vpc");
        for app in [*b"win ", *b"wa\0\0", *b"vpc "] {
            let short = chs - (1 << 20) - 3 * 512;
            let app_name = String::from_utf8_lossy(&app[..2]).into_owned();
            let patched = refooted(&image, &format!("{app_name}-{name}"), |f| {
                f[28..32].copy_from_slice(&app);
                f[48..56].copy_from_slice(&short.to_be_bytes());
            });
            let expected = reference(&patched, Some("vpc"), dir.path());
            let want = if &app == b"vpc " { chs } else { short };
            assert_eq!(expected.len() as u64, want, "{app_name} {subformat}");
            let work = tempfile::tempdir().unwrap();
            let target = work.path().join("disk.img");
            let mut args = vec!["import", arg(&patched), arg(&target), "--json"];
            args.extend(format.map(|f| ["--format", f]).into_iter().flatten());
            let out = run(&args);
            assert_ok(&out);
            assert_eq!(json(&out)["virtual_size"], want, "{app_name} {subformat}");
            assert_same(
                &patched.display().to_string(),
                &fs::read(&target).unwrap(),
                &expected,
            );
        }
    }
}

#[test]
fn the_sector_bitmap_is_ignored_as_by_qemu() {
    // A block whose bitmap says no sector is written still reads whole in qemu.
    let dir = tempfile::tempdir().unwrap();
    let image = written_image(dir.path(), "d.vhd", "vpc", "", SIZE);
    let bat = fs::read(&image).unwrap()[1536..1540].to_vec();
    let block0 = u64::from(u32::from_be_bytes(bat.try_into().unwrap())) * 512;
    let patched = patched(&image, "bitmap.vhd", block0, &[0u8; 512]);
    let expected = reference(&patched, None, dir.path());
    assert_eq!(expected[0], 0x11);
    let target = dir.path().join("disk.img");
    assert_ok(&run(&["import", arg(&patched), arg(&target)]));
    assert_same("cleared bitmap", &fs::read(&target).unwrap(), &expected);
}

#[test]
fn a_differencing_vhd_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image = written_image(dir.path(), "d.vhd", "vpc", "", "8M");
    let child = refooted(&image, "child.vhd", |f| {
        f[60..64].copy_from_slice(&4u32.to_be_bytes())
    });
    assert_fails_everywhere(&child, &[], 11, "differencing");
}

#[test]
fn corrupt_vhds_fail_with_exit_12_naming_what_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let image = written_image(dir.path(), "d.vhd", "vpc", "", SIZE);
    let len = fs::metadata(&image).unwrap().len();
    // BAT entry 1 (2 MiB..4 MiB, written) pointing past the end.
    let far = ((len / 512 + 8) as u32).to_be_bytes();
    let past = patched(&image, "past.vhd", 1536 + 4, &far);
    assert_fails_everywhere(&past, &[], 12, "BAT entry 1");
    // BAT entry 1 pointing at block 0's place.
    let entry0 = fs::read(&image).unwrap()[1536..1540].to_vec();
    let overlap = patched(&image, "overlap.vhd", 1536 + 4, &entry0);
    assert_fails_everywhere(&overlap, &[], 12, "over each other");
    // An absurd BAT size.
    let absurd = patched(&image, "absurd.vhd", 512 + 28, &u32::MAX.to_be_bytes());
    assert_fails_everywhere(&absurd, &[], 12, "BAT at 0x600");
    // A footer whose checksum does not match.
    let bad_sum = patched(&image, "sum.vhd", 100, &[0xee]);
    assert_fails_everywhere(&bad_sum, &[], 12, "checksum");
    // Cut in the middle of the blocks.
    let cut = dir.path().join("cut.vhd");
    fs::write(&cut, &fs::read(&image).unwrap()[..len as usize / 2]).unwrap();
    assert_fails_everywhere(&cut, &[], 12, "past the end of the image");
    // A fixed disk whose data is shorter than its footer says.
    let fixed = written_image(dir.path(), "f.vhd", "vpc", "subformat=fixed", "8M");
    let short = refooted(&fixed, "short.vhd", |f| {
        f[28..32].copy_from_slice(b"win ");
        f[48..56].copy_from_slice(&(16u64 << 20).to_be_bytes());
    });
    assert_fails_everywhere(&short, &["--format", "vpc"], 12, "states 16777216 bytes");
}

#[test]
fn a_vhd_too_large_for_the_volume_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let image = written_image(dir.path(), "d.vhd", "vpc", "", SIZE);
    assert_fails_everywhere(&image, &["--size", "20Mi"], 13, "does not fit");
}

#[test]
fn a_fixed_vhd_stream_too_large_is_refused_as_it_is_written_saying_why() {
    // A fixed disk states its size in its footer, at the end: a local file is refused before
    // writing; a stream (stdin, or compressed) as its data passes the usable space, with the
    // reason, and nothing left behind.
    let dir = tempfile::tempdir().unwrap();
    let fixed = written_image(dir.path(), "f.vhd", "vpc", "subformat=fixed", SIZE);
    let target = dir.path().join("out").join("disk.img");
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    let too_small = ["--size", "20Mi", "--format", "vpc"];
    let out = run(&[&["import", arg(&fixed), arg(&target)][..], &too_small].concat());
    assert_refused(&out, 13, &virtual_size(&fixed, "vpc").to_string(), &target);
    let packed = dir.path().join("f.vhd.zst");
    compress(&["zstd", "-q", "-c"], &fixed, &packed);
    for (what, source, stdin) in [("stdin", "-", Some(&fixed)), ("zstd", arg(&packed), None)] {
        let mut cmd = quarry();
        cmd.args(["import", source, arg(&target)]).args(too_small);
        if let Some(f) = stdin {
            cmd.stdin(fs::File::open(f).unwrap());
        }
        let out = cmd.output().unwrap();
        assert_refused(&out, 13, "known only at the end of its stream", &target);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("fixed vhd's footer"), "{what}: {err}");
    }
}

/// The footer's fields at `at`.
fn footer_fields(at: usize, fields: &mut Vec<Field>) {
    let prefix = format!("footer at {at:#x}: ");
    fields.extend(mutants::fields(
        true,
        &prefix,
        at,
        &[
            ("cookie", 0, 8),
            ("data offset", 16, 8),
            ("creator application", 28, 4),
            ("current size", 48, 8),
            ("cylinders", 56, 2),
            ("heads", 58, 1),
            ("sectors per track", 59, 1),
            ("disk type", 60, 4),
            ("checksum", 64, 4),
        ],
    ));
    // Features, format version, time stamp, creator version and host, original size, UUID and
    // saved state: no part in the disk.
    let inert = mutants::fields(
        true,
        &prefix,
        at,
        &[
            ("features", 8, 4),
            ("format version", 12, 4),
            ("time stamp", 24, 4),
            ("creator version", 32, 4),
            ("creator host", 36, 4),
            ("original size", 40, 8),
            ("UUID", 68, 8),
            ("saved state", 84, 1),
        ],
    );
    fields.extend(inert.into_iter().map(Field::inert));
}

/// A vhd's fields: its footer (both copies of a dynamic disk's), and a dynamic disk's header and
/// BAT.
fn vpc_fields(image: &[u8]) -> Vec<Field> {
    let mut fields = Vec::new();
    footer_fields(image.len() - 512, &mut fields);
    if !image.starts_with(b"conectix") {
        return fields;
    }
    footer_fields(0, &mut fields);
    let header = Field::be("", 16, 8).read(image) as usize;
    let prefix = "dynamic header: ";
    fields.extend(mutants::fields(
        true,
        prefix,
        header,
        &[
            ("cookie", 0, 8),
            ("table offset", 16, 8),
            ("max table entries", 28, 4),
            ("block size", 32, 4),
            ("checksum", 36, 4),
            ("parent UUID", 40, 8),
            ("parent locator 0 code", 576, 4),
            ("parent locator 0 offset", 592, 8),
        ],
    ));
    let inert = mutants::fields(
        true,
        prefix,
        header,
        &[
            ("data offset", 8, 8),
            ("header version", 24, 4),
            ("parent time stamp", 56, 4),
            ("parent name", 64, 8),
        ],
    );
    fields.extend(inert.into_iter().map(Field::inert));
    let bat = Field::be("", header + 16, 8).read(image) as usize;
    let entries = Field::be("", header + 28, 4).read(image) as usize;
    fields.extend(mutants::table("BAT", bat, entries, 4, true));
    fields
}

/// Fixes the checksums of the footers and the dynamic header a mutant still has.
fn reseal(image: &mut [u8]) {
    if image.len() < 512 {
        return;
    }
    let end = image.len() - 512;
    for at in [0, end] {
        if image[at..].starts_with(b"conectix") {
            let footer = with_checksum(image[at..at + 512].to_vec());
            image[at..at + 512].copy_from_slice(&footer);
        }
    }
    let header = Field::be("", 16, 8).read(image) as usize;
    if image.starts_with(b"conectix")
        && header.checked_add(1024).is_some_and(|e| e <= image.len())
        && image[header..].starts_with(b"cxsparse")
    {
        let h = &mut image[header..header + 1024];
        h[36..40].fill(0);
        let sum = h.iter().fold(0u32, |s, &b| s.wrapping_add(b.into()));
        h[36..40].copy_from_slice(&(!sum).to_be_bytes());
    }
}

#[test]
fn mutated_vhds_give_qemu_img_s_bytes_or_fail() {
    let dir = tempfile::tempdir().unwrap();
    let dynamic = small_image(dir.path(), "dynamic.vhd", "vpc", "", "4M");
    let fixed = small_image(dir.path(), "fixed.vhd", "vpc", "subformat=fixed", "2M");
    // Hyper-V's sizing: by the current size, not the geometry.
    let hyper_v = refooted(&dynamic, "hyper-v.vhd", |f| {
        f[28..32].copy_from_slice(b"win ");
        f[48..56].copy_from_slice(&((3u64 << 20) + 1536).to_be_bytes());
    });
    // A fixed disk is raw to both probes: named to both.
    let fixed = Base {
        format: Some("vpc"),
        ..Base::read(&fixed, vpc_fields)
    };
    let bases = vec![
        Base::read(&dynamic, vpc_fields),
        fixed,
        Base::read(&hyper_v, vpc_fields),
    ];
    mutants::run(Campaign {
        reseal: &reseal,
        mutants: 80,
        ..Campaign::new("vhd", bases)
    });
}
