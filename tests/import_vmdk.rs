//! `quarry import` of vmdk images made by qemu-img (`create -o subformat=...` plus `qemu-io`
//! writes, and `convert -O vmdk`), compared byte for byte with `qemu-img convert -O raw`: from a
//! file, from standard input, under gzip/xz/zstd and over HTTP; the split and flat subformats
//! from their local descriptor; and the refusals and corrupt images by exit code.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use testkit::qemu::{self, assert_same, assert_same_as_qemu, qemu_img, qemu_io};

mod common;
mod disk_formats;
use common::mutants::{self, Base, Campaign, Field};
use common::*;
use disk_formats::{
    assert_fails_everywhere, import_everywhere, sample_converted, sample_stream_vmdk,
};
use testkit::nginx::{Nginx, NginxConfig};

/// Grain size of every image qemu-img makes.
const GRAIN: u64 = 65536;
/// An odd size: qemu rounds it up to 9766 sectors, and the last grain holds 19456 bytes.
const ODD_SIZE: u64 = 5_000_000;
const ODD_SECTORS_BYTES: u64 = 9766 * 512;

/// `qemu-img create -f vmdk -o OPTIONS PATH SIZE`, then the `qemu-io` commands.
fn create(path: &Path, options: &str, size: u64, writes: &[&str]) -> PathBuf {
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "vmdk",
        "-o",
        options,
        arg(path),
        &size.to_string(),
    ]);
    if !writes.is_empty() {
        qemu_io("vmdk", path, writes);
    }
    path.to_path_buf()
}

/// Writes that cover what the readers must tell apart: data in the first grain, an all-zero
/// data grain, a hole, data ending the disk in its partial last grain, and grains written out of
/// order (whole grains: streamOptimized takes only those).
fn writes() -> Vec<String> {
    let last = ODD_SECTORS_BYTES / GRAIN * GRAIN;
    vec![
        format!("write -P 0xab {} {GRAIN}", 5 * GRAIN),
        format!("write -P 0xcd 0 {GRAIN}"),
        format!("write -P 0 {} {GRAIN}", 2 * GRAIN),
        format!("write -P 0x5e {last} {}", ODD_SECTORS_BYTES - last),
        format!("write -P 0x11 {} {GRAIN}", 3 * GRAIN),
    ]
}

/// The test images: sparse extents (any source) made both ways.
fn sparse_images(dir: &Path) -> Vec<PathBuf> {
    let w = writes();
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    let mut images = Vec::new();
    for sub in ["monolithicSparse", "streamOptimized"] {
        let options = format!("subformat={sub}");
        let written = dir.join(format!("{sub}-written.vmdk"));
        images.push(create(&written, &options, ODD_SIZE, &w));
        let name = format!("{sub}-converted.vmdk");
        images.push(sample_converted(dir, &name, "vmdk", &options));
    }
    images.push(create(
        &dir.join("zeroed-grains.vmdk"),
        "subformat=monolithicSparse,zeroed_grain=on",
        ODD_SIZE,
        &[
            &format!("write -P 0x77 0 {}", 4 * GRAIN),
            &format!("write -z {GRAIN} {GRAIN}"),
            &format!("write -z {} {}", 8 * GRAIN, 2 * GRAIN),
        ],
    ));
    images.push(create(
        &dir.join("empty-stream.vmdk"),
        "subformat=streamOptimized",
        ODD_SIZE,
        &[],
    ));
    images
}

/// `dir/out/disk.img`, its directory created: a target whose directory holds nothing else.
fn out_target(dir: &Path) -> PathBuf {
    let target = dir.join("out").join("disk.img");
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    target
}

fn import_stdin(source: &Path, target: &Path) -> Output {
    quarry()
        .args(["import", "-", arg(target), "--json"])
        .stdin(fs::File::open(source).unwrap())
        .output()
        .unwrap()
}

#[test]
fn sparse_images_equal_qemu_img_from_a_file_stdin_http_and_compressed() {
    let dir = tempfile::tempdir().unwrap();
    for image in sparse_images(dir.path()) {
        let expected = qemu::reference_raw(&image, dir.path());
        import_everywhere(&image, None, "vmdk", &expected);
    }
}

#[test]
fn flat_and_split_descriptors_equal_qemu_img_from_their_local_file() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = writes();
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    for sub in [
        "monolithicFlat",
        "twoGbMaxExtentFlat",
        "twoGbMaxExtentSparse",
    ] {
        let sub_dir = dir.path().join(sub);
        fs::create_dir(&sub_dir).unwrap();
        let image = create(
            &sub_dir.join("d.vmdk"),
            &format!("subformat={sub}"),
            ODD_SIZE,
            &w,
        );
        let expected = qemu::reference_raw(&image, work.path());
        let target = work.path().join("disk.img");
        let out = run(&["import", arg(&image), arg(&target), "--json"]);
        assert_ok(&out);
        assert_same(sub, &fs::read(&target).unwrap(), &expected);
        assert_eq!(json(&out)["format_chain"], serde_json::json!(["vmdk"]));
    }
}

/// A local monolithicFlat descriptor of [`ODD_SIZE`], its extent beside it, in its own directory.
fn flat_descriptor(dir: &Path) -> PathBuf {
    let sub_dir = dir.join("flat");
    fs::create_dir(&sub_dir).unwrap();
    let w = writes();
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    create(
        &sub_dir.join("d.vmdk"),
        "subformat=monolithicFlat",
        ODD_SIZE,
        &w,
    )
}

#[test]
fn a_descriptor_that_is_not_a_plain_local_file_is_refused_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    let image = flat_descriptor(dir.path());
    let target = out_target(dir.path());
    // From standard input: its extents are out of reach.
    let out = import_stdin(&image, &target);
    assert_refused(&out, 11, "from a local path", &target);
    // Compressed, beside its extent: the reason is the compression, not the place.
    let packed = image.with_extension("vmdk.gz");
    compress(&["gzip", "-c"], &image, &packed);
    let out = run(&["import", arg(&packed), arg(&target)]);
    assert_refused(&out, 11, "it is gzip-compressed", &target);
    // With --checksum, which would cover the descriptor's text only.
    let sha = testkit::oci::sha256_digest(&fs::read(&image).unwrap());
    let out = run(&["import", arg(&image), arg(&target), "--checksum", &sha]);
    assert_refused(&out, 11, "--checksum would cover only", &target);
}

#[test]
fn a_local_descriptor_larger_than_the_requested_size_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let image = flat_descriptor(dir.path());
    let target = out_target(dir.path());
    let out = run(&["import", arg(&image), arg(&target), "--size", "4Mi"]);
    assert_refused(&out, 13, &ODD_SECTORS_BYTES.to_string(), &target);
}

#[test]
fn flat_extents_at_offsets_into_their_file_equal_qemu_img() {
    // Three extents of one file: from sector 512, from sector 2560 (ending in a zero run), and
    // from sector 16000 of the file's 16384, so its last 640 sectors lie past the end of the
    // file (zeroes, as qemu reads them) after 384 of data.
    let dir = tempfile::tempdir().unwrap();
    let (_, mut data) = sample_disk(dir.path());
    data.rotate_left(4 << 20); // data up to the end of the file
    let flat_dir = dir.path().join("offsets");
    fs::create_dir(&flat_dir).unwrap();
    fs::write(flat_dir.join("x-flat.vmdk"), data).unwrap();
    let template = fs::read_to_string(flat_descriptor(dir.path())).unwrap();
    let extents = "RW 2048 FLAT \"x-flat.vmdk\" 512\n\
                   RW 4096 FLAT \"x-flat.vmdk\" 2560\n\
                   RW 1024 FLAT \"x-flat.vmdk\" 16000\n";
    let text: String = template
        .lines()
        .map(|l| {
            if l.starts_with("RW ") {
                extents.to_string()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    let image = flat_dir.join("x.vmdk");
    fs::write(&image, text).unwrap();
    let expected = qemu::reference_raw(&image, dir.path());
    assert_eq!(expected.len(), 7168 * 512);
    let target = dir.path().join("disk.img");
    let out = run(&["import", arg(&image), arg(&target), "--json"]);
    assert_ok(&out);
    assert_same(
        "flat extents at offsets",
        &fs::read(&target).unwrap(),
        &expected,
    );
}

#[test]
fn split_disks_of_several_extents_equal_qemu_img() {
    // 4.5 GiB: three 2 GiB extents, data across each extent boundary and at the very end.
    let size: u64 = 9 << 29;
    let two_gib: u64 = 2 << 30;
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = [
        format!("write -P 0x21 {} {}", two_gib - GRAIN, 2 * GRAIN),
        format!("write -P 0x42 {} {}", 2 * two_gib - 4096, 8192),
        format!("write -P 0x63 {} {GRAIN}", size - GRAIN),
    ];
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    for sub in ["twoGbMaxExtentSparse", "twoGbMaxExtentFlat"] {
        let sub_dir = dir.path().join(sub);
        fs::create_dir(&sub_dir).unwrap();
        let image = create(
            &sub_dir.join("d.vmdk"),
            &format!("subformat={sub}"),
            size,
            &w,
        );
        let reference = work.path().join("reference.raw");
        qemu::convert_to_raw(&image, &reference);
        let target = work.path().join("disk.img");
        let out = run(&["import", arg(&image), arg(&target), "--json"]);
        assert_ok(&out);
        assert_eq!(json(&out)["virtual_size"], size, "{sub}");
        // qemu-img compare reads only where either file has data.
        assert_same_as_qemu(&target, &reference, "raw");
        fs::remove_file(&target).unwrap();
        fs::remove_file(&reference).unwrap();
    }
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Rewrites a streamOptimized image from qemu-img (tables before the grains, no trailer) the way
/// VMware writes one: `gdOffset = -1` in the header, the grains in guest order, then a grain
/// table marker and table per directory entry, the directory behind its marker, the footer (the
/// header with the real `gdOffset`) and the end-of-stream marker.
fn vmware_stream(qemu: &[u8]) -> Vec<u8> {
    const S: usize = 512;
    let (capacity, granularity) = (le64(qemu, 12), le64(qemu, 20));
    let gtes = le32(qemu, 44) as u64;
    let (gd, grain_offset) = (le64(qemu, 56) as usize * S, le64(qemu, 64) as usize);
    let grains = capacity.div_ceil(granularity);
    let tables = grains.div_ceil(gtes);
    let mut header = qemu[..S].to_vec();
    let flags = le32(&header, 8) & !2; // no redundant directory
    header[8..12].copy_from_slice(&flags.to_le_bytes());
    set64(&mut header, 48, 0);
    set64(&mut header, 56, u64::MAX);
    let mut out = header.clone();
    out.extend_from_slice(&qemu[S..grain_offset * S]); // the descriptor, then padding
    out[S + 20 * S..].fill(0); // qemu's tables are not VMware's
    let mut gt_entries = vec![0u32; (tables * gtes) as usize];
    for (g, entry) in gt_entries.iter_mut().enumerate().take(grains as usize) {
        let table = le32(qemu, gd + 4 * (g / gtes as usize)) as usize * S;
        let sector = le32(qemu, table + 4 * (g % gtes as usize)) as usize;
        if sector == 0 {
            continue;
        }
        let at = sector * S;
        let size = le32(qemu, at + 8) as usize;
        *entry = (out.len() / S) as u32;
        out.extend_from_slice(&qemu[at..at + 12 + size]);
        out.resize(out.len().next_multiple_of(S), 0);
    }
    let marker = |out: &mut Vec<u8>, sectors: u64, kind: u32| {
        out.extend(sectors.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend(kind.to_le_bytes());
        out.resize(out.len() + S - 16, 0);
    };
    let gt_sectors = (gtes * 4).div_ceil(S as u64);
    let mut gd_entries = Vec::new();
    for t in 0..tables as usize {
        marker(&mut out, gt_sectors, 1);
        gd_entries.push((out.len() / S) as u32);
        for e in &gt_entries[t * gtes as usize..(t + 1) * gtes as usize] {
            out.extend(e.to_le_bytes());
        }
        out.resize(out.len().next_multiple_of(S), 0);
    }
    marker(&mut out, (tables * 4).div_ceil(S as u64), 2);
    let gd_sector = (out.len() / S) as u64;
    for e in gd_entries {
        out.extend(e.to_le_bytes());
    }
    out.resize(out.len().next_multiple_of(S), 0);
    marker(&mut out, 1, 3);
    set64(&mut header, 56, gd_sector);
    out.extend(header);
    marker(&mut out, 0, 0);
    out
}

#[test]
fn a_vmware_stream_with_its_tables_and_footer_after_the_data_equals_qemu_img() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let qemu_made = sample_stream_vmdk(dir.path(), "qemu.vmdk");
    let vmware = dir.path().join("vmware.vmdk");
    fs::write(&vmware, vmware_stream(&fs::read(&qemu_made).unwrap())).unwrap();
    let expected = qemu::reference_raw(&vmware, work.path());
    assert_same(
        "qemu-img on the rewritten stream",
        &expected,
        &qemu::reference_raw(&qemu_made, work.path()),
    );
    let target = work.path().join("disk.img");
    for out in [
        run(&["import", arg(&vmware), arg(&target)]),
        import_stdin(&vmware, &target),
    ] {
        assert_ok(&out);
        assert_same(
            "a VMware-style stream",
            &fs::read(&target).unwrap(),
            &expected,
        );
    }
}

/// Imports `bytes` written to `dir/name`; returns the output and the target.
fn import_bytes(dir: &Path, name: &str, bytes: &[u8]) -> (Output, PathBuf) {
    let src = dir.join(name);
    fs::write(&src, bytes).unwrap();
    let target = out_target(dir);
    let out = quarry()
        .args(["import", arg(&src), arg(&target)])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    (out, target)
}

fn set64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn corrupt_headers_and_tables_exit_12_and_leave_no_target() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = dir.path().join("sparse.vmdk");
    // 40 MiB: two grain tables.
    qemu_img(&["create", "-q", "-f", "vmdk", arg(&sparse), "40M"]);
    qemu_io(
        "vmdk",
        &sparse,
        &["write -P 0x99 0 1M", "write -P 0x98 33M 1M"],
    );
    let good = fs::read(&sparse).unwrap();
    let gd = u64::from_le_bytes(good[56..64].try_into().unwrap()) as usize * 512;
    let stream = sample_stream_vmdk(dir.path(), "stream.vmdk");
    let stream_good = fs::read(&stream).unwrap();

    let mut cases: Vec<(&str, Vec<u8>)> = vec![("truncated header", good[..100].to_vec())];
    let mut b = good.clone();
    set64(&mut b, 56, 1 << 40); // grain directory far past the end
    cases.push(("directory out of range", b));
    let mut b = good.clone();
    set64(&mut b, 12, u64::MAX / 8); // capacity
    cases.push(("absurd capacity", b));
    let mut b = good.clone();
    set64(&mut b, 20, 1 << 40); // granularity
    cases.push(("absurd grain size", b));
    let mut b = good.clone();
    let first = le32(&b, gd);
    b[gd + 4..gd + 8].copy_from_slice(&first.to_le_bytes()); // both entries: one table
    cases.push(("grain table loop", b));
    let mut b = good.clone();
    let gt = le32(&b, gd) as usize * 512;
    let grain0 = le32(&b, gt);
    b[gt + 4..gt + 8].copy_from_slice(&(grain0 + 8).to_le_bytes()); // overlaps grain 0
    cases.push(("overlapping grains", b));
    let mut b = good.clone();
    b[gt..gt + 4].copy_from_slice(&u32::MAX.to_le_bytes()); // a grain far past the end
    cases.push(("grain out of range", b));
    let mut b = stream_good.clone();
    let grain_at = u64::from_le_bytes(b[64..72].try_into().unwrap()) as usize * 512;
    b[grain_at + 20] ^= 0xff; // inside the first grain's zlib stream
    cases.push(("compressed grain that inflates wrong", b));
    let mut b = stream_good.clone();
    b.truncate(grain_at + 100);
    cases.push(("stream cut inside a grain", b));

    for (what, bytes) in cases {
        let (out, target) = import_bytes(dir.path(), "bad.vmdk", &bytes);
        assert_exit(&out, 12);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("vmdk"), "{what}: {stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        assert!(!target.exists(), "{what}: target left");
        no_partial_left(target.parent().unwrap());
        // The same from a stream.
        let out = import_stdin(&dir.path().join("bad.vmdk"), &target);
        assert_exit(&out, 12);
    }
}

#[test]
fn snapshots_change_tracking_and_cowd_are_refused_with_exit_11() {
    let dir = tempfile::tempdir().unwrap();
    let base = create(
        &dir.path().join("base.vmdk"),
        "subformat=monolithicSparse",
        1 << 20,
        &[],
    );
    let snap = dir.path().join("snap.vmdk");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "vmdk",
        "-b",
        arg(&base),
        "-F",
        "vmdk",
        arg(&snap),
    ]);
    let target = out_target(dir.path());
    let out = run(&["import", arg(&snap), arg(&target)]);
    assert_refused(&out, 11, "parent", &target);

    // An ESXi delta: a descriptor naming its parent.
    let flat_dir = dir.path().join("esxi");
    fs::create_dir(&flat_dir).unwrap();
    let flat = create(
        &flat_dir.join("d.vmdk"),
        "subformat=monolithicFlat",
        1 << 20,
        &[],
    );
    let text = fs::read_to_string(&flat)
        .unwrap()
        .replace("parentCID=ffffffff", "parentCID=1234abcd");
    fs::write(&flat, format!("{text}parentFileNameHint=\"base.vmdk\"\n")).unwrap();
    let out = run(&["import", arg(&flat), arg(&target)]);
    assert_refused(&out, 11, "parent", &target);

    let (out, target) = import_bytes(dir.path(), "disk-ctk.vmdk", &[0x43; 4096]);
    assert_refused(&out, 11, "ctk", &target);
    let mut cowd = b"COWD\x01\0\0\0".to_vec();
    cowd.resize(4096, 0);
    let (out, target) = import_bytes(dir.path(), "esx3.vmdk", &cowd);
    assert_refused(&out, 11, "COWD", &target);
}

#[test]
fn a_disk_larger_than_the_requested_size_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let image = create(
        &dir.path().join("so.vmdk"),
        "subformat=streamOptimized",
        64 << 20,
        &["write -P 0x1 0 64k"],
    );
    let target = out_target(dir.path());
    for source in [arg(&image), "-"] {
        let out = quarry()
            .args(["import", source, arg(&target), "--size", "32Mi"])
            .stdin(fs::File::open(&image).unwrap())
            .output()
            .unwrap();
        assert_refused(&out, 13, &(64u64 << 20).to_string(), &target);
    }
}

/// `quarry import` of `image` fails with `code` naming `what` from a file, stdin and HTTP.
fn fails_from_file_stdin_and_http(image: &Path, code: i32, what: &str) {
    assert_fails_everywhere(image, &[], code, what);
    let server = Nginx::start(NginxConfig {
        root: image.parent().unwrap().to_path_buf(),
        ranges: true,
        ..Default::default()
    });
    let url = server.url(&format!(
        "/{}",
        image.file_name().unwrap().to_string_lossy()
    ));
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("disk.img");
    let out = run(&["import", &url, arg(&target)]);
    assert_refused(&out, code, what, &target);
}

/// A 1 MiB disk with data at 0 and 64k, converted to streamOptimized by qemu-img.
fn two_grain_stream(dir: &Path) -> PathBuf {
    let raw = dir.join("two.raw");
    let f = fs::File::create(&raw).unwrap();
    f.set_len(1 << 20).unwrap();
    qemu_io(
        "raw",
        &raw,
        &["write -P 0x61 0 64k", "write -P 0x62 64k 64k"],
    );
    let image = dir.join("two.vmdk");
    qemu_img(&[
        "convert",
        "-O",
        "vmdk",
        "-o",
        "subformat=streamOptimized",
        arg(&raw),
        arg(&image),
    ]);
    image
}

#[test]
fn a_truncated_stream_optimized_image_is_corrupt_from_a_file_stdin_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let image = two_grain_stream(dir.path());
    let whole = fs::read(&image).unwrap();
    let vmware = vmware_stream(&whole);
    let cuts = dir.path().join("cuts");
    fs::create_dir(&cuts).unwrap();
    // qemu-img's layout cut before and inside its grains; VMware's cut before its trailer, inside
    // it and before its end-of-stream marker.
    let mut images = Vec::new();
    for len in [65536, 0x10200] {
        images.push((format!("qemu-{len}.vmdk"), whole[..len].to_vec()));
    }
    for len in [
        65536,
        vmware.len() - 1536,
        vmware.len() - 900,
        vmware.len() - 512,
    ] {
        images.push((format!("vmware-{len}.vmdk"), vmware[..len].to_vec()));
    }
    for (name, bytes) in images {
        let path = cuts.join(&name);
        fs::write(&path, &bytes).unwrap();
        let qemu = std::process::Command::new("qemu-img")
            .args(["convert", "-O", "raw", arg(&path)])
            .arg(dir.path().join("qemu.raw"))
            .output()
            .unwrap();
        assert!(!qemu.status.success(), "{name}: qemu-img reads it");
        fails_from_file_stdin_and_http(&path, 12, "truncated");
        fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_stream_optimized_image_written_in_several_sessions_equals_qemu_img() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("sessions.vmdk");
    create(&image, "subformat=streamOptimized", 1 << 20, &[]);
    // Each qemu-io run is a session: each appends its grain after zero sectors.
    qemu_io("vmdk", &image, &["write -P 0xaa 0 64k"]);
    qemu_io("vmdk", &image, &["write -P 0xbb 512k 64k"]);
    let expected = qemu::reference_raw(&image, dir.path());
    assert!(expected[512 << 10..].starts_with(&[0xbb; 4096]));
    import_everywhere(&image, None, "vmdk", &expected);
}

/// The place of each grain of a qemu-img streamOptimized image, by its grain tables.
fn grain_places(image: &[u8]) -> Vec<usize> {
    let gd = le64(image, 56) as usize * 512;
    let gtes = le32(image, 44) as usize;
    let tables = (le64(image, 12).div_ceil(le64(image, 20)) as usize).div_ceil(gtes);
    let mut places = Vec::new();
    for t in 0..tables {
        let gt = le32(image, gd + 4 * t) as usize * 512;
        for j in 0..gtes {
            match le32(image, gt + 4 * j) {
                0 => {}
                s => places.push(s as usize * 512),
            }
        }
    }
    places.sort();
    places
}

#[test]
fn grain_markers_are_not_trusted_over_qemu_img_s_tables() {
    let dir = tempfile::tempdir().unwrap();
    let image = two_grain_stream(dir.path());
    let good = fs::read(&image).unwrap();
    let places = grain_places(&good);
    assert_eq!(places.len(), 2);
    let mut mutants = Vec::new();
    // A size field too large (two grains: qemu still inflates the first grain's zlib stream).
    let mut b = good.clone();
    b[places[0] + 8..places[0] + 12].copy_from_slice(&(2 * GRAIN as u32).to_le_bytes());
    mutants.push(("size", b));
    // A marker naming another sector than its table entry.
    let mut b = good.clone();
    set64(&mut b, places[0], 512);
    mutants.push(("lba", b));
    for (what, bytes) in mutants {
        let path = dir.path().join(format!("{what}.vmdk"));
        fs::write(&path, bytes).unwrap();
        let expected = qemu::reference_raw(&path, dir.path());
        assert_same(what, &expected, &qemu::reference_raw(&image, dir.path()));
        let target = out_target(dir.path());
        for out in [
            run(&["import", arg(&path), arg(&target)]),
            import_stdin(&path, &target),
        ] {
            assert_ok(&out);
            assert_same(what, &fs::read(&target).unwrap(), &expected);
        }
    }
}

#[test]
fn a_vmware_stream_whose_grain_marker_disagrees_with_its_tables_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let image = two_grain_stream(dir.path());
    let mut vmware = vmware_stream(&fs::read(&image).unwrap());
    let first = le64(&vmware, 64) as usize * 512;
    // The first grain (guest 0) says it is guest 512k; qemu follows the tables.
    set64(&mut vmware, first, 1024);
    let path = dir.path().join("disagrees.vmdk");
    fs::write(&path, vmware).unwrap();
    assert_fails_everywhere(&path, &[], 12, "disagree");
}

/// Where a streamOptimized image's structures are: the header, every grain marker and, per
/// layout, the tables before the grains or the trailer after them (sector starts).
fn structures(image: &[u8]) -> Vec<usize> {
    let mut at = vec![0];
    let grain_offset = le64(image, 64) as usize * 512;
    let mut s = grain_offset;
    while s + 16 <= image.len() {
        at.push(s);
        let size = le32(image, s + 8) as usize;
        let sectors = le64(image, s) as usize;
        s = if size != 0 {
            (s + 12 + size).next_multiple_of(512)
        } else {
            // Metadata: its sectors too.
            for m in 1..=sectors.min(8) {
                at.push(s + m * 512);
            }
            s + 512 + sectors.min(1 << 20) * 512
        };
    }
    if le64(image, 56) != u64::MAX {
        let gd = le64(image, 56) as usize * 512;
        at.extend((gd..grain_offset).step_by(512));
    }
    at
}

/// The fields to mutate: the header's, then the first 16 words of every structure.
fn fields(image: &[u8]) -> Vec<Field> {
    let mut fields = mutants::fields(
        false,
        "",
        0,
        &[
            ("version", 4, 4),
            ("flags", 8, 4),
            ("capacity", 12, 8),
            ("grainSize", 20, 8),
            ("descriptorOffset", 28, 8),
            ("descriptorSize", 36, 8),
            ("numGTEsPerGT", 44, 4),
            ("rgdOffset", 48, 8),
            ("gdOffset", 56, 8),
            ("overHead", 64, 8),
            ("compressAlgorithm", 77, 2),
        ],
    );
    for place in structures(image) {
        let words = 16.min((image.len() - place) / 4);
        fields.extend(mutants::table(
            &format!("{place:#x}"),
            place,
            words,
            4,
            false,
        ));
    }
    fields
}

#[test]
fn mutated_stream_optimized_images_give_qemu_img_s_bytes_or_fail() {
    let dir = tempfile::tempdir().unwrap();
    let w = writes();
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    let qemu_made = create(
        &dir.path().join("stream.vmdk"),
        "subformat=streamOptimized",
        ODD_SIZE,
        &w,
    );
    let qemu_bytes = fs::read(&qemu_made).unwrap();
    let vmware = vmware_stream(&qemu_bytes);
    let bases = vec![
        Base::new("qemu-img's layout", qemu_bytes, fields),
        Base::new("VMware's layout", vmware, fields),
    ];
    mutants::run(Campaign {
        mutants: 150,
        ..Campaign::new("vmdk", bases)
    });
}
