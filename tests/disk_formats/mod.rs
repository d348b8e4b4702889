//! Helpers shared by the disk format suites (vhd, vdi, vhdx, vmdk, and the remote sources):
//! images written by qemu-img and qemu-io, and one import of each through every source (file,
//! stdin, gzip / xz / zstd, HTTP from nginx, S3, a registry layer, an upload), each compared byte
//! for byte with `qemu-img convert -O raw`.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use testkit::nginx::{Nginx, NginxConfig};
pub use testkit::qemu::assert_same;
use testkit::qemu::{qemu_img, qemu_io};

use super::common::*;

/// `qemu-img create -f FORMAT -o OPTS` of `size`, then qemu-io writes: data at the start, an odd
/// length at an odd offset, an all-zero block's worth of written zeroes, and data in the last
/// 4 KiB of the disk (the rest stays unallocated).
pub fn written_image(dir: &Path, name: &str, format: &str, opts: &str, size: &str) -> PathBuf {
    created_and_written(
        dir,
        name,
        format,
        opts,
        size,
        &[
            "write -P 0x11 0 65536",
            "write -P 0x22 1234567 4321",
            "write -z 3145728 2097152",
            "write -P 0x44 5242880 512",
        ],
    )
}

/// A small image for the mutation tests (each mutant is imported and converted whole, and a
/// debug build scans every data byte): `qemu-img create -f FORMAT -o OPTS` of `size`, data in its
/// first block (a run at 0, an odd one just past 4 KiB) and its last 4 KiB, nothing between.
pub fn small_image(dir: &Path, name: &str, format: &str, opts: &str, size: &str) -> PathBuf {
    let writes = ["write -P 0x11 0 65536", "write -P 0x22 4097 3000"];
    created_and_written(dir, name, format, opts, size, &writes)
}

/// `qemu-img create -f FORMAT -o OPTS` of `size`, then the qemu-io `writes` and 4 KiB of data
/// ending the disk.
fn created_and_written(
    dir: &Path,
    name: &str,
    format: &str,
    opts: &str,
    size: &str,
    writes: &[&str],
) -> PathBuf {
    let path = dir.join(name);
    let mut args = vec!["create", "-q", "-f", format];
    if !opts.is_empty() {
        args.extend(["-o", opts]);
    }
    args.extend([arg(&path), size]);
    qemu_img(&args);
    let last = format!("write -P 0x33 {} 4096", virtual_size(&path, format) - 4096);
    let mut writes = writes.to_vec();
    writes.push(&last);
    qemu_io(format, &path, &writes);
    path
}

/// The virtual size qemu-img gives `image` read as `format` (a fixed vhd is raw to its probe).
pub fn virtual_size(image: &Path, format: &str) -> u64 {
    let info = qemu_img(&["info", "-f", format, "--output=json", arg(image)]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    info["virtual-size"].as_u64().expect("virtual-size")
}

/// `qemu-img convert -O raw` of `image`, read as `format` when given (else probed).
pub fn reference(image: &Path, format: Option<&str>, dir: &Path) -> Vec<u8> {
    let raw = dir.join("reference.raw");
    let mut args = vec!["convert"];
    if let Some(f) = format {
        args.extend(["-f", f]);
    }
    args.extend(["-O", "raw", arg(image), arg(&raw)]);
    qemu_img(&args);
    let bytes = fs::read(&raw).unwrap();
    fs::remove_file(&raw).unwrap();
    bytes
}

/// Runs `cmd`, a `quarry import SOURCE TARGET --json ...`, and checks the JSON report's format
/// chain and size and `target` against `expected`; removes the target.
pub fn check_import(what: &str, cmd: &mut Command, target: &Path, chain: &[&str], expected: &[u8]) {
    let out = output_within(cmd, std::time::Duration::from_secs(120));
    assert_ok(&out);
    let report = json(&out);
    assert_eq!(report["format_chain"], serde_json::json!(chain), "{what}");
    assert_eq!(report["virtual_size"], expected.len() as u64, "{what}");
    assert_same(what, &fs::read(target).unwrap(), expected);
    fs::remove_file(target).unwrap();
}

/// Imports `source` (a path or URL, or `-` with `stdin`), with `extra` arguments, and checks the
/// result against `expected` and the JSON report's format chain.
fn import_one(
    what: &str,
    source: &str,
    stdin: Option<&Path>,
    extra: &[&str],
    chain: &[&str],
    expected: &[u8],
    work: &Path,
) {
    let target = work.join("disk.img");
    let mut cmd = quarry();
    cmd.args(["import", source, arg(&target), "--json"])
        .args(extra);
    if let Some(file) = stdin {
        cmd.stdin(Stdio::from(fs::File::open(file).unwrap()));
    }
    check_import(what, &mut cmd, &target, chain, expected);
}

/// Imports `image` from a file, from stdin, gzip / xz / zstd compressed (from a file and from
/// stdin) and over HTTP (plain and zstd), each equal to `expected`. `format` is the `--format`
/// to give (a fixed vhd needs it), `name` what the report's chain calls the format.
pub fn import_everywhere(image: &Path, format: Option<&str>, name: &str, expected: &[u8]) {
    let work = tempfile::tempdir().unwrap();
    let served = tempfile::tempdir().unwrap();
    let file_name = image.file_name().unwrap().to_string_lossy().into_owned();
    let extra: Vec<&str> = format.map(|f| vec!["--format", f]).unwrap_or_default();
    let label = |how: &str| format!("{file_name} {how}");
    import_one(
        &label("from a file"),
        arg(image),
        None,
        &extra,
        &[name],
        expected,
        work.path(),
    );
    import_one(
        &label("from stdin"),
        "-",
        Some(image),
        &extra,
        &[name],
        expected,
        work.path(),
    );
    fs::copy(image, served.path().join(&file_name)).unwrap();
    for (tool, ext, layer) in [
        (&["gzip", "-c", "-1"][..], "gz", "gzip"),
        (&["xz", "-c", "-0", "-T2"][..], "xz", "xz"),
        (&["zstd", "-c", "-q", "-1"][..], "zst", "zstd"),
    ] {
        let packed = served.path().join(format!("{file_name}.{ext}"));
        compress(tool, image, &packed);
        let chain = [layer, name];
        import_one(
            &label(ext),
            arg(&packed),
            None,
            &extra,
            &chain,
            expected,
            work.path(),
        );
        import_one(
            &label(&format!("{ext} on stdin")),
            "-",
            Some(&packed),
            &extra,
            &chain,
            expected,
            work.path(),
        );
    }
    let server = Nginx::start(NginxConfig {
        root: served.path().to_path_buf(),
        ranges: true,
        ..Default::default()
    });
    let url = server.url(&format!("/{file_name}"));
    import_one(
        &label("over HTTP"),
        &url,
        None,
        &extra,
        &[name],
        expected,
        work.path(),
    );
    let url = server.url(&format!("/{file_name}.zst"));
    import_one(
        &label("zstd over HTTP"),
        &url,
        None,
        &extra,
        &["zstd", name],
        expected,
        work.path(),
    );
    no_partial_left(work.path());
}

/// The suite's sample disk (written into `dir`) converted by `qemu-img convert -O FORMAT -o OPTS`
/// into `dir/NAME` (qemu-img leaves its zero runs unallocated).
pub fn sample_converted(dir: &Path, name: &str, format: &str, opts: &str) -> PathBuf {
    let (raw, _) = sample_disk(dir);
    let image = dir.join(name);
    let mut args = vec!["convert", "-O", format];
    if !opts.is_empty() {
        args.extend(["-o", opts]);
    }
    args.extend([arg(&raw), arg(&image)]);
    qemu_img(&args);
    image
}

/// [`sample_converted`] as streamOptimized vmdk (what OVAs and VMware exports hold).
pub fn sample_stream_vmdk(dir: &Path, name: &str) -> PathBuf {
    sample_converted(dir, name, "vmdk", "subformat=streamOptimized")
}

/// The suite's sample disk converted by `qemu-img convert -O FORMAT`, imported from every source.
pub fn import_qemu_img_conversion(format: &str) {
    let dir = tempfile::tempdir().unwrap();
    let image = sample_converted(dir.path(), &format!("converted.{format}"), format, "");
    let expected = reference(&image, None, dir.path());
    import_everywhere(&image, None, format, &expected);
}

/// Runs `quarry import SOURCE TARGET EXTRA...` from a file, and from stdin, and checks the exit
/// code, that stderr names `what`, and that nothing is left behind.
pub fn assert_fails_everywhere(image: &Path, extra: &[&str], code: i32, what: &str) {
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("disk.img");
    let out = quarry()
        .args(["import", arg(image), arg(&target)])
        .args(extra)
        .output()
        .unwrap();
    assert_refused(&out, code, what, &target);
    let out = quarry()
        .args(["import", "-", arg(&target)])
        .args(extra)
        .stdin(fs::File::open(image).unwrap())
        .output()
        .unwrap();
    assert_refused(&out, code, what, &target);
}

/// A copy of `image` with `bytes` written at `at`.
pub fn patched(image: &Path, name: &str, at: u64, bytes: &[u8]) -> PathBuf {
    let mut data = fs::read(image).unwrap();
    data[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    let out = image.with_file_name(name);
    fs::write(&out, data).unwrap();
    out
}

/// One qemu-made image of each format, to import from the remote sources: (image, the format
/// chain's name for it, qemu-img's raw conversion). A streamOptimized vmdk (what OVAs and
/// exports hold) converted from the sample disk; a dynamic vhd, vhdx and vdi written by qemu-io.
pub fn one_of_each_format(dir: &Path) -> Vec<(PathBuf, &'static str, Vec<u8>)> {
    let mut images = vec![(sample_stream_vmdk(dir, "stream.vmdk"), "vmdk")];
    for (format, opts) in [
        ("vpc", "subformat=dynamic"),
        ("vhdx", "subformat=dynamic,block_size=1M"),
        ("vdi", ""),
    ] {
        let name = format!("written.{format}");
        images.push((written_image(dir, &name, format, opts, "41000k"), format));
    }
    images
        .into_iter()
        .map(|(image, name)| {
            let expected = reference(&image, None, dir);
            (image, name, expected)
        })
        .collect()
}
