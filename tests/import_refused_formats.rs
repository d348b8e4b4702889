//! Images in formats Quarry does not read are refused by name (exit 11), never written out as raw:
//! every format `qemu-img` probes, made by `qemu-img` itself where it can write the format, and
//! refused the same way from a file, from standard input and under a compression layer.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::*;
use testkit::qemu::qemu_img;

/// `qemu-img convert` of `base` into `format`, with its extra arguments.
fn make(base: &Path, dir: &Path, format: &str, extra: &[&str]) -> std::path::PathBuf {
    let out = dir.join(format!("disk.{format}"));
    let mut args = vec!["convert", "-O", format];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[arg(base), arg(&out)]);
    qemu_img(&args);
    out
}

/// Runs `quarry import` of `source` (a path, or `-` fed from `stdin`) and checks the refusal.
fn assert_refused_by_name(source: &str, stdin: Option<&Path>, name: &str, dir: &Path, what: &str) {
    let target = dir.join("disk.img");
    let mut cmd = quarry();
    cmd.args(["import", source, arg(&target), "--json"]);
    if let Some(file) = stdin {
        cmd.stdin(Stdio::from(fs::File::open(file).unwrap()));
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{what}: {stderr}");
    assert!(stderr.contains(name), "{what}: {stderr}");
    assert_eq!(json(&out)["kind"], "unsupported", "{what}");
    assert!(!target.exists(), "{what}: a target was left");
    no_partial_left(dir);
}

#[test]
fn formats_qemu_img_writes_are_refused_by_name_from_every_source() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = sample_disk(dir.path());
    let luks = [
        "--object",
        "secret,id=sec0,data=quarry",
        "-o",
        "key-secret=sec0,iter-time=10",
    ];
    let images = [
        ("qed", make(&base, dir.path(), "qed", &[])),
        ("parallels", make(&base, dir.path(), "parallels", &[])),
        ("luks", make(&base, dir.path(), "luks", &luks)),
        ("qcow version 1", make(&base, dir.path(), "qcow", &[])),
    ];
    for (name, image) in &images {
        assert_refused_by_name(arg(image), None, name, dir.path(), &format!("{name} file"));
        assert_refused_by_name("-", Some(image), name, dir.path(), &format!("{name} stdin"));
        let gz = dir.path().join("image.gz");
        compress(&["gzip", "-c", "-1"], image, &gz);
        assert_refused_by_name(arg(&gz), None, name, dir.path(), &format!("{name}.gz"));
    }
}

#[test]
fn an_apple_disk_image_is_refused_by_its_name() {
    // qemu-img cannot write dmg; qemu probes it by the file name alone (its trailer is at the
    // end), and so does Quarry.
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = sample_disk(dir.path());
    let dmg = dir.path().join("macos.dmg");
    fs::copy(&base, &dmg).unwrap();
    assert_refused_by_name(arg(&dmg), None, "dmg", dir.path(), "dmg file");
    let zst = dir.path().join("macos.dmg.zst");
    let status = Command::new("zstd")
        .args(["-q", "-f", arg(&dmg), "-o", arg(&zst)])
        .status()
        .unwrap();
    assert!(status.success());
    assert_refused_by_name(arg(&zst), None, "dmg", dir.path(), "dmg.zst file");
}
