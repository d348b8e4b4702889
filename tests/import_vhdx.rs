//! `quarry import` of vhdx images made by `qemu-img` (dynamic and fixed, 1-256 MiB blocks, odd
//! sizes, holes, data at the end, all-zero blocks), compared byte for byte with
//! `qemu-img convert -O raw`: from a file, from standard input, over HTTP (nginx) and through
//! gzip, xz and zstd; a BAT moved after its data; and hostile images by exit code.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use importer::format::vhdx::structure_checksum;
use testkit::qemu::{assert_same_as_qemu, qemu_img, qemu_io, reference_raw};

mod common;
mod disk_formats;
use common::mutants::{self, Base, Campaign, Field};
use common::*;
use disk_formats::{assert_same, import_everywhere, small_image};

const MIB: usize = 1 << 20;

/// A vhdx made by `qemu-img create` with `opts`, then written by qemu-io.
fn create(dir: &Path, name: &str, size: &str, opts: &str, writes: &[&str]) -> PathBuf {
    let path = dir.join(name);
    qemu_img(&["create", "-q", "-f", "vhdx", "-o", opts, arg(&path), size]);
    if !writes.is_empty() {
        qemu_io("vhdx", &path, writes);
    }
    path
}

/// The test images: (path, how it was made).
fn corpus(dir: &Path) -> Vec<PathBuf> {
    let (base, _) = sample_disk(dir);
    let convert = |name: &str, opts: &str| {
        let out = dir.join(name);
        qemu_img(&["convert", "-O", "vhdx", "-o", opts, arg(&base), arg(&out)]);
        out
    };
    vec![
        // An odd size (qemu rounds it up to whole sectors), a hole in the middle, data at the
        // very end, an all-zero block written as data.
        create(
            dir,
            "dynamic-1m.vhdx",
            "20000123",
            "subformat=dynamic,block_size=1M",
            &[
                "write -P 0x11 0 4096",
                "write -P 0x22 1049088 65536",
                "write -P 0 5242880 1048576",
                "write -P 0x33 19996160 4096",
            ],
        ),
        create(
            dir,
            "dynamic-8m.vhdx",
            "50M",
            "subformat=dynamic,block_size=8M,block_state_zero=off",
            &["write -P 0x44 8388096 1024", "write -P 0x55 52428288 512"],
        ),
        create(
            dir,
            "dynamic-32m.vhdx",
            "70M",
            "subformat=dynamic,block_size=32M",
            &["write -P 0x66 33554432 33554432", "write -z 0 4096"],
        ),
        // A second block of 4 MiB of its 256: data at the very end.
        create(
            dir,
            "dynamic-256m.vhdx",
            "260M",
            "subformat=dynamic,block_size=256M",
            &["write -P 0x77 272628736 1024"],
        ),
        create(
            dir,
            "empty.vhdx",
            "7M",
            "subformat=dynamic,block_size=1M",
            &[],
        ),
        convert("converted-dynamic.vhdx", "subformat=dynamic,block_size=1M"),
        convert("converted-fixed.vhdx", "subformat=fixed,block_size=8M"),
    ]
}

/// `quarry import SOURCE TARGET --json` with `extra` arguments, fed `stdin` when given.
fn import(source: &str, target: &Path, stdin: Option<&Path>, extra: &[&str]) -> Output {
    let mut cmd = quarry();
    cmd.args(["import", source, arg(target), "--json"])
        .args(extra);
    if let Some(f) = stdin {
        cmd.stdin(Stdio::from(fs::File::open(f).unwrap()));
    }
    cmd.output().unwrap()
}

/// Imports the corpus images with (or without) blocks of 32 MiB and more from every source.
fn corpus_everywhere(large_blocks: bool) {
    let dir = tempfile::tempdir().unwrap();
    for image in corpus(dir.path()) {
        let name = image.file_name().unwrap().to_string_lossy();
        if (name.contains("-32m") || name.contains("-256m")) != large_blocks {
            continue;
        }
        let expected = reference_raw(&image, dir.path());
        import_everywhere(&image, None, "vhdx", &expected);
    }
}

#[test]
fn images_with_small_blocks_equal_qemu_img_from_a_file_stdin_http_and_compressed() {
    corpus_everywhere(false);
}

#[test]
fn images_with_32_and_256_mib_blocks_equal_qemu_img_from_a_file_stdin_http_and_compressed() {
    corpus_everywhere(true);
}

/// The metadata region and BAT of a qemu-made image, from its first region table.
fn regions(img: &[u8]) -> [(usize, u64, u32); 2] {
    let mut found = [(0, 0, 0); 2];
    let count = u32::from_le_bytes(img[0x30008..0x3000c].try_into().unwrap()) as usize;
    for i in 0..count {
        let e = 0x30000 + 16 + 32 * i;
        let off = u64::from_le_bytes(img[e + 16..e + 24].try_into().unwrap());
        let len = u32::from_le_bytes(img[e + 24..e + 28].try_into().unwrap());
        // BAT 2dc27766-..., metadata 8b7ca206-...
        match img[e..e + 4] {
            [0x66, 0x77, 0xc2, 0x2d] => found[0] = (e, off, len),
            [0x06, 0xa2, 0x7c, 0x8b] => found[1] = (e, off, len),
            _ => {}
        }
    }
    found
}

/// `img` with its BAT moved to the end of the file, after every payload block.
fn with_the_bat_at_the_end(mut img: Vec<u8>) -> Vec<u8> {
    let [(entry, bat, len), _] = regions(&img);
    let new_at = img.len().next_multiple_of(MIB);
    let bytes = img[bat as usize..bat as usize + len as usize].to_vec();
    img[bat as usize..bat as usize + len as usize].fill(0);
    img.resize(new_at, 0);
    img.extend_from_slice(&bytes);
    img[entry + 16..entry + 24].copy_from_slice(&(new_at as u64).to_le_bytes());
    reseal_region_tables(&mut img);
    img
}

/// Copies the first region table (after edits) over both, with a fresh checksum.
fn reseal_region_tables(img: &mut [u8]) {
    img[0x30004..0x30008].fill(0);
    let crc = structure_checksum(&img[0x30000..0x40000], 4);
    img[0x30004..0x30008].copy_from_slice(&crc.to_le_bytes());
    let table = img[0x30000..0x40000].to_vec();
    img[0x40000..0x50000].copy_from_slice(&table);
}

/// The current header (the higher sequence number), resealed after `edit`.
fn edit_current_header(img: &mut [u8], edit: impl FnOnce(&mut [u8])) {
    let seq = |at: usize| u64::from_le_bytes(img[at + 8..at + 16].try_into().unwrap());
    let at = if seq(0x10000) > seq(0x20000) {
        0x10000
    } else {
        0x20000
    };
    let h = &mut img[at..at + 4096];
    edit(h);
    let crc = structure_checksum(h, 4);
    h[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// The absolute offset of the metadata item with this GUID's first four bytes, and the offset
/// of its table entry.
fn metadata_item(img: &[u8], guid_head: [u8; 4]) -> (usize, usize) {
    let m = regions(img)[1].1 as usize;
    let count = u16::from_le_bytes(img[m + 10..m + 12].try_into().unwrap()) as usize;
    (0..count)
        .map(|i| m + 32 + 32 * i)
        .find(|&e| img[e..e + 4] == guid_head)
        .map(|e| {
            let off = u32::from_le_bytes(img[e + 16..e + 20].try_into().unwrap()) as usize;
            (m + off, e)
        })
        .expect("metadata item")
}

const FILE_PARAMETERS: [u8; 4] = [0x37, 0x67, 0xa1, 0xca];
const VIRTUAL_DISK_SIZE: [u8; 4] = [0x24, 0x42, 0xa5, 0x2f];
const LOGICAL_SECTOR_SIZE: [u8; 4] = [0x1d, 0xbf, 0x41, 0x81];

/// Payload blocks per sector bitmap block: the BAT holds a bitmap entry after every this many
/// payload entries (2^23 sectors of the logical sector size, in blocks).
fn chunk_ratio(logical_sector: u64, block_size: u64) -> u64 {
    (1 << 23) * logical_sector / block_size
}

#[test]
fn an_image_with_4096_byte_logical_sectors_reads_as_its_512_byte_original() {
    // qemu-img neither makes 4096-byte logical sectors (its vhdx driver has no option for it)
    // nor reads them (it refuses them, ENOTSUP), though Hyper-V makes them. So a qemu-made
    // image is rewritten as one: the metadata item set to 4096 and the BAT laid out for it (a
    // bitmap entry after every 32768 payload entries instead of 4096). The guest disk is the
    // same, so the reference is qemu-img's reading of the original. Past 4 GiB (one 512-byte
    // chunk) the two layouts differ: a reader that ignored the sector size would put block 4096
    // 1 MiB off.
    let dir = tempfile::tempdir().unwrap();
    let block = MIB as u64;
    let size = (4 << 30) + 8 * block;
    let image = create(
        dir.path(),
        "sectors-512.vhdx",
        &size.to_string(),
        "subformat=dynamic,block_size=1M",
        &[
            "write -P 0x11 0 65536",
            &format!("write -P 0x22 {} 65536", 4u64 << 30),
            &format!("write -P 0x33 {} 1048576", (4u64 << 30) + block),
            &format!("write -P 0x44 {} 4096", size - 4096),
        ],
    );
    let mut img = fs::read(&image).unwrap();
    let (item, _) = metadata_item(&img, LOGICAL_SECTOR_SIZE);
    assert_eq!(
        img[item..item + 4],
        512u32.to_le_bytes(),
        "qemu's sector size"
    );
    img[item..item + 4].copy_from_slice(&4096u32.to_le_bytes());
    let [(_, bat, len), _] = regions(&img);
    let bat = bat as usize;
    let old = img[bat..bat + len as usize].to_vec();
    img[bat..bat + len as usize].fill(0);
    let (old_ratio, new_ratio) = (chunk_ratio(512, block), chunk_ratio(4096, block));
    for b in 0..size.div_ceil(block) {
        let from = ((b + b / old_ratio) * 8) as usize;
        let to = bat + ((b + b / new_ratio) * 8) as usize;
        img[to..to + 8].copy_from_slice(&old[from..from + 8]);
    }
    let patched = dir.path().join("sectors-4096.vhdx");
    fs::write(&patched, &img).unwrap();

    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("disk.img");
    let stream = work.path().join("stream.img");
    let from_file = import(arg(&patched), &target, None, &[]);
    assert_ok(&from_file);
    let from_stdin = import("-", &stream, Some(&patched), &[]);
    assert_ok(&from_stdin);
    for (what, out, got) in [("file", from_file, &target), ("stdin", from_stdin, &stream)] {
        assert_eq!(json(&out)["virtual_size"], size, "{what}");
        assert_eq!(fs::metadata(got).unwrap().len(), size, "{what}");
        // The sizes are checked equal, so compare checks every byte (qemu-img reading the
        // original vhdx).
        assert_same_as_qemu(got, &image, "vhdx");
    }
}

#[test]
fn a_bat_after_its_data_streams_through_the_hold_and_the_spill_file() {
    let dir = tempfile::tempdir().unwrap();
    let image = create(
        dir.path(),
        "late-bat.vhdx",
        "80M",
        "subformat=dynamic,block_size=1M",
        &["write -P 0x5a 0 50331648", "write -P 0xa5 79691776 1048576"],
    );
    let late = dir.path().join("moved.vhdx");
    fs::write(&late, with_the_bat_at_the_end(fs::read(&image).unwrap())).unwrap();
    // qemu-img reads the rewritten image as the original.
    let work = tempfile::tempdir().unwrap();
    let expected = reference_raw(&late, work.path());
    assert_same("qemu-img", &expected, &reference_raw(&image, work.path()));
    let target = work.path().join("disk.img");
    for budget in ["32Mi", "0"] {
        let out = import("-", &target, Some(&late), &["--memory-budget", budget]);
        assert_ok(&out);
        assert_same(
            &format!("late BAT, budget {budget}"),
            &fs::read(&target).unwrap(),
            &expected,
        );
    }
    // 49 MiB of data wait for the BAT: held in memory with a 64 MiB budget, spilled with 1 MiB.
    // (wait4's peak includes this test process's own pages, shared until quarry's exec, so only
    // the difference between the two runs tells quarry's memory.)
    let spilled = peak_rss_kib(&late, &target, "1Mi");
    let held = peak_rss_kib(&late, &target, "64Mi");
    assert!(
        held > spilled + (32 << 10),
        "peak RSS held in memory: {held} KiB, spilled: {spilled} KiB"
    );
    assert_same("late BAT, spilled", &fs::read(&target).unwrap(), &expected);
    let zst = dir.path().join("moved.vhdx.zst");
    compress(&["zstd", "-q", "-c"], &late, &zst);
    let out = import(arg(&zst), &target, None, &["--memory-budget", "1Mi"]);
    assert_ok(&out);
    assert_same("late BAT, zstd", &fs::read(&target).unwrap(), &expected);
    let out = import(arg(&late), &target, None, &[]);
    assert_ok(&out);
    assert_same("late BAT, file", &fs::read(&target).unwrap(), &expected);
    no_partial_left(work.path());
}

/// Streams `image` on stdin with this memory budget; returns quarry's peak RSS (KiB), as GNU
/// time reports it: its child is forked from time, not from this test, whose own (large) pages
/// the rusage of a child it spawned directly would include.
fn peak_rss_kib(image: &Path, target: &Path, budget: &str) -> i64 {
    let report = target.with_extension("rss");
    let status = Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(&report)
        .arg(env!("CARGO_BIN_EXE_quarry"))
        .args(["import", "-", arg(target), "--memory-budget", budget])
        .stdin(Stdio::from(fs::File::open(image).unwrap()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("GNU time (/usr/bin/time, scripts/setup.sh installs it)");
    assert!(status.success(), "quarry failed ({status})");
    let text = fs::read_to_string(&report).unwrap();
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("time's report: {text:?}"))
}

/// Imports `img` from a file and from stdin: both must exit `code` naming `what`, leaving nothing.
fn assert_rejected(dir: &Path, img: &[u8], code: i32, what: &str) {
    let path = dir.join("hostile.vhdx");
    fs::write(&path, img).unwrap();
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("disk.img");
    let out = import(arg(&path), &target, None, &[]);
    assert_refused(&out, code, what, &target);
    let out = import("-", &target, Some(&path), &[]);
    assert_refused(&out, code, what, &target);
}

#[test]
fn hostile_images_exit_12_and_refused_ones_11() {
    let dir = tempfile::tempdir().unwrap();
    let image = create(
        dir.path(),
        "base.vhdx",
        "16M",
        "subformat=dynamic,block_size=1M",
        &["write -P 0x42 0 2097152", "write -P 0x24 15728640 4096"],
    );
    let good = fs::read(&image).unwrap();
    let [(bat_entry, bat, _), (meta_entry, _, _)] = regions(&good);

    // Both headers' checksums wrong.
    let mut img = good.clone();
    img[0x10000 + 200] ^= 1;
    img[0x20000 + 200] ^= 1;
    assert_rejected(dir.path(), &img, 12, "neither header");

    // Both region tables' checksums wrong.
    let mut img = good.clone();
    img[0x30000 + 300] ^= 1;
    img[0x40000 + 300] ^= 1;
    assert_rejected(dir.path(), &img, 12, "neither region table");

    // The metadata region far past the end of the file; the BAT over the metadata region.
    let mut img = good.clone();
    img[meta_entry + 16..meta_entry + 24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    reseal_region_tables(&mut img);
    assert_rejected(dir.path(), &img, 12, "past the end");
    let mut img = good.clone();
    let meta = regions(&good)[1].1;
    img[bat_entry + 16..bat_entry + 24].copy_from_slice(&meta.to_le_bytes());
    reseal_region_tables(&mut img);
    assert_rejected(dir.path(), &img, 12, "overlapping");

    // A BAT entry pointing into the metadata region, then at another block's payload.
    let entry0 = u64::from_le_bytes(good[bat as usize..bat as usize + 8].try_into().unwrap());
    let mut img = good.clone();
    img[bat as usize..bat as usize + 8].copy_from_slice(&(meta | 6).to_le_bytes());
    assert_rejected(dir.path(), &img, 12, "BAT entry 0");
    let mut img = good.clone();
    img[bat as usize + 8..bat as usize + 16].copy_from_slice(&entry0.to_le_bytes());
    assert_rejected(dir.path(), &img, 12, "payload block of BAT entry");

    // Absurd block sizes and a disk whose BAT would not fit its region.
    let (params, _) = metadata_item(&good, FILE_PARAMETERS);
    for size in [4096u32, 3 << 20, 1 << 30] {
        let mut img = good.clone();
        img[params..params + 4].copy_from_slice(&size.to_le_bytes());
        assert_rejected(dir.path(), &img, 12, "block size");
    }
    let (vsize, _) = metadata_item(&good, VIRTUAL_DISK_SIZE);
    let mut img = good.clone();
    img[vsize..vsize + 8].copy_from_slice(&(60u64 << 40).to_le_bytes());
    assert_rejected(dir.path(), &img, 12, "too short");

    // HasParent without a parent locator is corrupt; with one, a differencing disk is refused.
    let mut img = good.clone();
    img[params + 4] |= 2;
    assert_rejected(dir.path(), &img, 12, "parent locator");
    let m = regions(&good)[1].1 as usize;
    let count = u16::from_le_bytes(img[m + 10..m + 12].try_into().unwrap()) as usize;
    let e = m + 32 + 32 * count;
    // a8d35f2d-b30b-454d-abf7-d3d84834ab0c, 64 bytes at 0x20000 into the region.
    img[e..e + 16].copy_from_slice(&[
        0x2d, 0x5f, 0xd3, 0xa8, 0x0b, 0xb3, 0x4d, 0x45, 0xab, 0xf7, 0xd3, 0xd8, 0x48, 0x34, 0xab,
        0x0c,
    ]);
    img[e + 16..e + 20].copy_from_slice(&0x20000u32.to_le_bytes());
    img[e + 20..e + 24].copy_from_slice(&64u32.to_le_bytes());
    img[m + 10..m + 12].copy_from_slice(&(count as u16 + 1).to_le_bytes());
    assert_rejected(dir.path(), &img, 11, "differencing");

    // A log to replay.
    let mut img = good.clone();
    edit_current_header(&mut img, |h| h[48..64].fill(0x77));
    assert_rejected(dir.path(), &img, 11, "qemu-img check -r all");

    // Cut inside the payload.
    assert_rejected(dir.path(), &good[..good.len() - 4096], 12, "past the end");
}

#[test]
fn a_qemu_image_with_a_log_to_replay_is_refused_until_qemu_img_check_replays_it() {
    // A real dirty log: qemu-io writes a new block through blkdebug, which fails every write to
    // the BAT's first sector, so qemu's BAT update stays in the log, unapplied (qemu-img itself
    // then refuses to read the image until it is replayed).
    let dir = tempfile::tempdir().unwrap();
    let image = create(
        dir.path(),
        "dirty.vhdx",
        "16M",
        "subformat=dynamic,block_size=1M",
        &["write -P 0x42 2097152 65536"],
    );
    let [(_, bat, _), _] = regions(&fs::read(&image).unwrap());
    let config = dir.path().join("blkdebug.cfg");
    fs::write(
        &config,
        format!(
            "[inject-error]\nevent = \"pwritev\"\nerrno = \"5\"\nsector = \"{}\"\n",
            bat / 512
        ),
    )
    .unwrap();
    let opts = format!(
        "driver=vhdx,file.driver=blkdebug,file.config={},file.image.filename={}",
        arg(&config),
        arg(&image)
    );
    let io = Command::new("qemu-io")
        .args(["--image-opts", &opts, "-c", "write -P 0x55 0 65536"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&io.stdout).contains("Input/output error"),
        "blkdebug did not fail the BAT write: {io:?}"
    );
    let img = fs::read(&image).unwrap();
    assert!(
        img[0x10000 + 48..0x10000 + 64].iter().any(|&b| b != 0),
        "no log GUID"
    );
    assert_rejected(dir.path(), &img, 11, "qemu-img check -r all");

    // Replayed as the message says, it imports as qemu-img reads it: both writes.
    qemu_img(&["check", "-q", "-r", "all", arg(&image)]);
    let work = tempfile::tempdir().unwrap();
    let expected = reference_raw(&image, work.path());
    assert!(
        expected[..65536].iter().all(|&b| b == 0x55),
        "the replayed write"
    );
    let target = work.path().join("disk.img");
    assert_ok(&import(arg(&image), &target, None, &[]));
    assert_same("replayed", &fs::read(&target).unwrap(), &expected);
}

#[test]
fn the_size_is_checked_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let image = create(
        dir.path(),
        "big.vhdx",
        "64M",
        "subformat=dynamic,block_size=8M",
        &["write -P 0x42 0 1048576"],
    );
    let target = dir.path().join("disk.img");
    for stdin in [None, Some(image.as_path())] {
        let source = if stdin.is_some() { "-" } else { arg(&image) };
        // 64 MiB needs more than 64 MiB less the filesystem overhead.
        let out = import(source, &target, stdin, &["--size", "64Mi"]);
        assert_refused(&out, 13, &(64u64 << 20).to_string(), &target);
    }
}

/// A vhdx's fields: both headers, both region tables, the metadata table and items, the BAT.
fn vhdx_fields(img: &[u8]) -> Vec<Field> {
    let mut fields = vec![Field::le("file identifier", 0, 8)];
    for at in [0x10000, 0x20000] {
        let prefix = format!("header at {at:#x}: ");
        fields.extend(mutants::fields(
            false,
            &prefix,
            at,
            &[
                ("signature", 0, 4),
                ("checksum", 4, 4),
                ("sequence number", 8, 8),
                ("log GUID", 48, 8),
                ("log version", 64, 2),
                ("version", 66, 2),
                ("log length", 68, 4),
                ("log offset", 72, 8),
            ],
        ));
        let guids = [("file write GUID", 16, 8), ("data write GUID", 32, 8)];
        let inert = mutants::fields(false, &prefix, at, &guids);
        fields.extend(inert.into_iter().map(Field::inert));
    }
    // The first 8 entries of each region table, the first 16 of the metadata table.
    let entry = [
        ("GUID", 0, 4),
        ("offset", 16, 8),
        ("length", 24, 4),
        ("required", 28, 4),
    ];
    for table in [0x30000, 0x40000] {
        let prefix = format!("region table at {table:#x}: ");
        let head = [
            ("signature", 0, 4),
            ("checksum", 4, 4),
            ("entry count", 8, 4),
        ];
        fields.extend(mutants::fields(false, &prefix, table, &head));
        for i in 0..Field::le("", table + 8, 4).read(img).min(8) as usize {
            let prefix = format!("{prefix}entry {i} ");
            fields.extend(mutants::fields(false, &prefix, table + 16 + 32 * i, &entry));
        }
    }
    let [(_, bat, bat_len), (_, meta, _)] = regions(img);
    let meta = meta as usize;
    let head = [("signature", 0, 8), ("entry count", 10, 2)];
    fields.extend(mutants::fields(false, "metadata ", meta, &head));
    let entry = [
        ("GUID", 0, 4),
        ("offset", 16, 4),
        ("length", 20, 4),
        ("flags", 24, 4),
    ];
    let value = [
        ("value", 0, 4),
        ("value at 4", 4, 4),
        ("value as 8 bytes", 0, 8),
    ];
    for i in 0..Field::le("", meta + 10, 2).read(img).min(16) as usize {
        let e = meta + 32 + 32 * i;
        let prefix = format!("metadata entry {i} ");
        fields.extend(mutants::fields(false, &prefix, e, &entry));
        let item = meta + Field::le("", e + 16, 4).read(img) as usize;
        fields.extend(mutants::fields(false, &prefix, item, &value));
    }
    let (params, _) = metadata_item(img, FILE_PARAMETERS);
    let (vsize, _) = metadata_item(img, VIRTUAL_DISK_SIZE);
    let block = Field::le("", params, 4).read(img);
    let blocks = Field::le("", vsize, 8).read(img).div_ceil(block);
    let entries = (blocks + blocks / chunk_ratio(512, block) + 1).min(bat_len as u64 / 8);
    fields.extend(mutants::table(
        "BAT",
        bat as usize,
        entries as usize,
        8,
        false,
    ));
    fields
}

/// Fixes the checksums of the headers and region tables a mutant still has.
fn reseal(img: &mut [u8]) {
    for (at, len, magic) in [
        (0x10000, 4096, b"head"),
        (0x20000, 4096, b"head"),
        (0x30000, 0x10000, b"regi"),
        (0x40000, 0x10000, b"regi"),
    ] {
        if img.len() >= at + len && img[at..].starts_with(magic) {
            let crc = structure_checksum(&img[at..at + len], 4);
            img[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        }
    }
}

#[test]
fn mutated_images_give_qemu_img_s_bytes_or_fail() {
    let dir = tempfile::tempdir().unwrap();
    // Small disks: a vhdx's own structures take 4 MiB (its header section, log, metadata region
    // and BAT, 1 MiB each), and every mutant is written, imported and converted whole.
    let opts = "subformat=dynamic,block_size=1M";
    let dynamic = small_image(dir.path(), "dynamic.vhdx", "vhdx", opts, "5M");
    qemu_io("vhdx", &dynamic, &["write -z 2M 1M"]);
    let opts = "subformat=fixed,block_size=1M";
    let fixed = small_image(dir.path(), "fixed.vhdx", "vhdx", opts, "3M");
    let late = with_the_bat_at_the_end(fs::read(&dynamic).unwrap());
    let bases = vec![
        Base::read(&dynamic, vhdx_fields),
        Base::read(&fixed, vhdx_fields),
        Base::new("late-bat.vhdx", late, vhdx_fields),
    ];
    mutants::run(Campaign {
        reseal: &reseal,
        mutants: 70,
        // The MS-VHDX specification keeps two region tables so that a damaged first one can be
        // read past; qemu reads only the first (and refuses the image when it is damaged).
        redundant: &[(
            0x30000..0x40000,
            "the region table's second copy at 0x40000",
        )],
        ..Campaign::new("vhdx", bases)
    });
}
