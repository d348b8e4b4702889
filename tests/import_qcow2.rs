//! `quarry import` of the qcow2 test corpus (`testdata/make-images.sh`), compared byte for byte
//! with `qemu-img convert -O raw`: into files, from standard input (compressed, so nothing can
//! seek), and onto loop-device block targets; plus the refusals and corrupt images by exit code.

use std::fs;
use std::process::Stdio;

use testkit::qemu::{self, TestImage, assert_same};

mod common;
use common::mutants::{self, Base, Campaign, Field};
use common::*;

fn corpus() -> (tempfile::TempDir, Vec<TestImage>) {
    let dir = tempfile::tempdir().unwrap();
    let images = qemu::make_images(dir.path());
    assert!(images.iter().filter(|i| i.expect == "convert").count() >= 10);
    (dir, images)
}

#[test]
fn every_image_equals_qemu_img_from_a_file_and_from_a_compressed_stream() {
    let (dir, images) = corpus();
    let work = tempfile::tempdir().unwrap();
    for image in images.iter().filter(|i| i.expect == "convert") {
        let expected = qemu::reference_raw(&image.path, work.path());
        let name = image.path.file_name().unwrap().to_string_lossy();

        let target = work.path().join("from-file.img");
        let out = run(&["import", arg(&image.path), arg(&target), "--json"]);
        assert_ok(&out);
        assert_same(
            &format!("{name} from a file"),
            &fs::read(&target).unwrap(),
            &expected,
        );
        assert_eq!(json(&out)["virtual_size"], expected.len() as u64, "{name}");

        let xz = dir.path().join(format!("{name}.xz"));
        compress(&["xz", "-c", "-T2"], &image.path, &xz);
        let target = work.path().join("from-stdin.img");
        let out = quarry()
            .args(["import", "-", arg(&target), "--json"])
            .stdin(fs::File::open(&xz).unwrap())
            .output()
            .unwrap();
        assert_ok(&out);
        assert_eq!(
            json(&out)["format_chain"],
            serde_json::json!(["xz", "qcow2"]),
            "{name}"
        );
        assert_same(
            &format!("{name} from stdin (xz)"),
            &fs::read(&target).unwrap(),
            &expected,
        );
    }
}

#[test]
fn images_with_held_clusters_convert_with_no_memory_budget() {
    // Snapshot and resized images carry data before the tables that map it; with no memory
    // budget all of it goes through the spill file beside the target.
    let (_dir, images) = corpus();
    let work = tempfile::tempdir().unwrap();
    for name in ["snapshot.qcow2", "resized.qcow2"] {
        let image = images
            .iter()
            .find(|i| i.path.ends_with(name))
            .unwrap_or_else(|| panic!("{name} missing from the corpus"));
        let expected = qemu::reference_raw(&image.path, work.path());
        let target = work.path().join("disk.img");
        let out = quarry()
            .args(["import", "-", arg(&target), "--memory-budget", "0"])
            .stdin(fs::File::open(&image.path).unwrap())
            .output()
            .unwrap();
        assert_ok(&out);
        assert_same(name, &fs::read(&target).unwrap(), &expected);
        no_partial_left(work.path());
    }
}

#[test]
fn every_image_equals_qemu_img_on_a_block_device() {
    let (_dir, images) = corpus();
    let work = tempfile::tempdir().unwrap();
    let Some(dev) = LoopDevice::new(&work.path().join("backing"), 64 << 20) else {
        return;
    };
    for image in images.iter().filter(|i| i.expect == "convert") {
        let expected = qemu::reference_raw(&image.path, work.path());
        if expected.len() > 64 << 20 {
            continue;
        }
        // Old bytes everywhere, so a zero range that was skipped would show.
        fs::write(&dev.device, vec![0xa5u8; 64 << 20]).unwrap();
        let out = run(&["import", arg(&image.path), arg(&dev.device)]);
        assert_ok(&out);
        let name = image.path.file_name().unwrap().to_string_lossy();
        assert_same(
            &format!("{name} on a block device"),
            &read_prefix(&dev.device, expected.len()),
            &expected,
        );
    }
}

#[test]
fn refused_images_exit_as_unsupported_and_name_the_problem() {
    let (_dir, images) = corpus();
    let work = tempfile::tempdir().unwrap();
    let refused: Vec<_> = images
        .iter()
        .filter(|i| i.expect == "unsupported")
        .collect();
    assert_eq!(refused.len(), 3, "{refused:?}");
    for image in refused {
        let target = work.path().join("disk.img");
        let out = run(&["import", arg(&image.path), arg(&target), "--json"]);
        assert_eq!(out.status.code(), Some(11), "{image:?}: {out:?}");
        let message = json(&out)["error"].as_str().unwrap().to_lowercase();
        let name = image.path.file_name().unwrap().to_string_lossy();
        let expected_word = match &*name {
            "backing.qcow2" => "backing",
            "luks.qcow2" => "encrypt",
            "datafile.qcow2" => "data file",
            other => panic!("unexpected refused image {other}"),
        };
        assert!(message.contains(expected_word), "{name}: {message}");
        assert!(!target.exists());
    }
}

#[test]
fn truncated_image_is_corrupt_and_leaves_no_target() {
    let (dir, images) = corpus();
    let image = images
        .iter()
        .find(|i| i.path.ends_with("default.qcow2"))
        .unwrap();
    let bytes = fs::read(&image.path).unwrap();
    let cut = dir.path().join("cut.qcow2");
    fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("disk.img");
    let out = run(&["import", arg(&cut), arg(&target), "--json"]);
    assert_eq!(out.status.code(), Some(12), "{out:?}");
    assert!(!target.exists());
    no_partial_left(work.path());
}

#[test]
fn corrupt_tables_are_refused() {
    let (dir, images) = corpus();
    let image = images
        .iter()
        .find(|i| i.path.ends_with("default.qcow2"))
        .unwrap();
    let mut bytes = fs::read(&image.path).unwrap();
    // The L1 table offset (header bytes 40..48) pointing far past the end of the file.
    bytes[40..48].copy_from_slice(&(1u64 << 50).to_be_bytes());
    let bad = dir.path().join("bad-l1.qcow2");
    fs::write(&bad, &bytes).unwrap();
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("disk.img");
    let out = quarry()
        .args(["import", arg(&bad), arg(&target)])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(12), "{out:?}");
    assert!(!target.exists());
}

#[test]
fn image_larger_than_the_requested_size_is_refused_before_writing() {
    let (_dir, images) = corpus();
    let image = images
        .iter()
        .find(|i| i.path.ends_with("default.qcow2"))
        .unwrap();
    let virtual_size = qemu::virtual_size(&image.path);
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("disk.img");
    let size = (virtual_size / 2).to_string();
    let out = run(&["import", arg(&image.path), arg(&target), "--size", &size]);
    assert_eq!(out.status.code(), Some(13), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&virtual_size.to_string()), "{stderr}");
    assert!(!target.exists());
    no_partial_left(work.path());
}

fn be32(b: &[u8], at: usize) -> u64 {
    Field::be("", at, 4).read(b)
}

fn be64(b: &[u8], at: usize) -> u64 {
    Field::be("", at, 8).read(b)
}

/// A table of 8-byte entries at `at` (`count` of them): the allocated ones and the first 16.
fn entries(name: &str, b: &[u8], at: usize, count: usize, fields: &mut Vec<Field>) {
    for (i, f) in mutants::table(name, at, count, 8, true).enumerate() {
        if f.at + 8 <= b.len() && (i < 16 || f.read(b) != 0) {
            fields.push(f);
        }
    }
}

/// A qcow2's fields: the header's, its extensions' headers, the L1 table, every L2 table, and
/// (no part in the disk) the refcount table, the snapshot table's place and the feature bits
/// qemu may check but that do not change what the active disk reads.
fn qcow2_fields(b: &[u8]) -> Vec<Field> {
    let mut fields = mutants::fields(
        true,
        "",
        0,
        &[
            ("magic", 0, 4),
            ("version", 4, 4),
            ("backing file offset", 8, 8),
            ("backing file size", 16, 4),
            ("cluster bits", 20, 4),
            ("size", 24, 8),
            ("crypt method", 32, 4),
            ("L1 size", 36, 4),
            ("L1 table offset", 40, 8),
        ],
    );
    let inert = mutants::fields(
        true,
        "",
        0,
        &[
            ("refcount table offset", 48, 8),
            ("refcount table clusters", 56, 4),
            ("snapshot count", 60, 4),
            ("snapshots offset", 64, 8),
        ],
    );
    fields.extend(inert.into_iter().map(Field::inert));
    let version = be32(b, 4);
    let mut extensions = 72;
    if version >= 3 {
        fields.push(Field::be("incompatible features", 72, 8));
        fields.push(Field::be("compatible features", 80, 8).inert());
        fields.push(Field::be("autoclear features", 88, 8).inert());
        fields.push(Field::be("refcount order", 96, 4).inert());
        fields.push(Field::be("header length", 100, 4));
        extensions = be32(b, 100) as usize;
        if extensions > 104 {
            fields.push(Field::be("compression type", 104, 1));
        }
    }
    // Header extensions: a type and a length each, to the end marker.
    let mut at = extensions;
    while at + 8 <= b.len().min(1 << 16) {
        let kind = be32(b, at);
        fields.push(Field::be(format!("extension {kind:#x} type"), at, 4));
        fields.push(Field::be(format!("extension {kind:#x} length"), at + 4, 4));
        if kind == 0 {
            break;
        }
        at += 8 + (be32(b, at + 4) as usize).next_multiple_of(8);
    }
    let cluster = 1usize << be32(b, 20);
    let (l1, l1_size) = (be64(b, 40) as usize, be32(b, 36) as usize);
    entries("L1", b, l1, l1_size, &mut fields);
    // An extended L2 entry is two: the cluster's and its subclusters' bitmap.
    let l2_entries = cluster / 8;
    for i in 0..l1_size {
        let l2 = (be64(b, l1 + 8 * i) & 0x00ff_ffff_ffff_fe00) as usize;
        if l2 != 0 && l2 + cluster <= b.len() {
            entries(&format!("L2 {i}"), b, l2, l2_entries, &mut fields);
        }
    }
    let refcounts = be64(b, 48) as usize;
    let mut table = Vec::new();
    entries("refcount table", b, refcounts, cluster / 8, &mut table);
    fields.extend(table.into_iter().map(Field::inert));
    fields
}

#[test]
fn mutated_images_give_qemu_img_s_bytes_or_fail() {
    let (_dir, images) = corpus();
    // qemu-img's own layouts, compressed clusters, subclusters, and the images whose tables come
    // after what they map (a snapshot's copied L2 tables; an L1 moved by a resize).
    let bases = [
        "default.qcow2",
        "c512.qcow2",
        "deflate.qcow2",
        "extl2.qcow2",
        "snapshot.qcow2",
        "resized.qcow2",
    ]
    .into_iter()
    .map(|name| {
        let image = images.iter().find(|i| i.path.ends_with(name)).unwrap();
        Base::read(&image.path, qcow2_fields)
    })
    .collect();
    mutants::run(Campaign {
        mutants: 40,
        ..Campaign::new("qcow2", bases)
    });
}
