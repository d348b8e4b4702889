//! `quarry import` against targets that fail for local reasons, on real filesystems mounted by
//! the test (root): each error names its cause once, and errors that no retry can mend are
//! terminal (a read-only filesystem: exit 10; a file larger than the filesystem allows: exit 13,
//! before anything is written). Also: the same data-byte count from every reader, and logs
//! without colour codes when stderr is not a terminal.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;
use common::*;
use testkit::qemu::qemu_img;

/// A filesystem mounted on a temporary directory for the test's life (root only).
struct Mounted {
    dir: tempfile::TempDir,
    _backing: Option<tempfile::TempDir>,
}

impl Mounted {
    /// `mount -t tmpfs -o OPTIONS`.
    fn tmpfs(options: &str) -> Option<Mounted> {
        let dir = tempfile::tempdir().unwrap();
        mount(&["-t", "tmpfs", "-o", options, "tmpfs", arg(dir.path())])?;
        Some(Mounted {
            dir,
            _backing: None,
        })
    }

    /// A fresh 32 MiB ext4 filesystem on a loop device.
    fn ext4() -> Option<Mounted> {
        let backing = tempfile::tempdir().unwrap();
        let image = backing.path().join("fs.img");
        fs::File::create(&image).unwrap().set_len(32 << 20).unwrap();
        let status = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", arg(&image)])
            .status()
            .expect("mkfs.ext4 (scripts/setup.sh installs e2fsprogs)");
        assert!(status.success());
        let dir = tempfile::tempdir().unwrap();
        mount(&["-o", "loop", arg(&image), arg(dir.path())])?;
        Some(Mounted {
            dir,
            _backing: Some(backing),
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Runs `mount ARGS`; None (the test is skipped, saying why) when not root.
fn mount(args: &[&str]) -> Option<()> {
    if !nix_is_root() {
        eprintln!("skipped: mounting filesystems needs root");
        return None;
    }
    let out = Command::new("mount").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "mount {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(())
}

fn nix_is_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_full_filesystem_is_named_once_and_leaves_nothing() {
    let Some(fs) = Mounted::tmpfs("size=2m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = sample_disk(dir.path());
    let target = fs.path().join("disk.img");
    let out = run(&["import", arg(&src), arg(&target)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(21), "{err}");
    assert_eq!(err.matches("No space left on device").count(), 1, "{err}");
    assert!(err.contains(".disk.img.quarry-partial"), "{err}");
    assert!(!target.exists());
    no_partial_left(fs.path());
}

#[test]
fn a_read_only_filesystem_is_terminal() {
    let Some(fs) = Mounted::tmpfs("ro,size=1m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = sample_disk(dir.path());
    let out = run(&[
        "import",
        arg(&src),
        arg(&fs.path().join("disk.img")),
        "--json",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(10), "{err}");
    assert_eq!(err.matches("Read-only file system").count(), 1, "{err}");
    assert_eq!(json(&out)["retryable"], false);
}

#[test]
fn a_disk_larger_than_the_filesystem_allows_is_too_small_before_writing() {
    let Some(fs) = Mounted::ext4() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.qcow2");
    // ext4 with 4 KiB blocks takes files up to 16 TiB.
    qemu_img(&["create", "-q", "-f", "qcow2", arg(&huge), "100T"]);
    let target = fs.path().join("disk.img");
    let out = run(&["import", arg(&huge), arg(&target)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(13), "{err}");
    assert!(err.contains("109951162777600"), "{err}");
    assert!(err.contains("17592186"), "the filesystem's limit: {err}");
    assert!(!target.exists());
    no_partial_left(fs.path());
}

/// The `bytes_written` of `quarry import SOURCE --json` (`-` reads `stdin`).
fn bytes_written(source: &str, stdin: Option<&Path>, target: &Path) -> u64 {
    let mut cmd = quarry();
    cmd.args(["import", source, arg(target), "--json"]);
    if let Some(file) = stdin {
        cmd.stdin(Stdio::from(fs::File::open(file).unwrap()));
    }
    let out = cmd.output().unwrap();
    assert_ok(&out);
    json(&out)["bytes_written"].as_u64().unwrap()
}

#[test]
fn bytes_written_counts_data_the_same_from_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    let expected = data
        .chunks(4096)
        .filter(|b| b.iter().any(|&x| x != 0))
        .count() as u64
        * 4096;
    let qcow2: PathBuf = dir.path().join("disk.qcow2");
    qemu_img(&["convert", "-q", "-O", "qcow2", arg(&src), arg(&qcow2)]);
    let gz = dir.path().join("disk.raw.gz");
    compress(&["gzip", "-c", "-1"], &src, &gz);
    let target = dir.path().join("disk.img");
    for (what, source, stdin) in [
        ("raw file", arg(&src), None),
        ("raw stdin", "-", Some(src.as_path())),
        ("qcow2 file", arg(&qcow2), None),
        ("qcow2 stdin", "-", Some(qcow2.as_path())),
        ("raw.gz file", arg(&gz), None),
    ] {
        assert_eq!(bytes_written(source, stdin, &target), expected, "{what}");
    }
}

#[test]
fn logs_have_no_colour_codes_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = sample_disk(dir.path());
    let gz = dir.path().join("disk.raw.gz");
    compress(&["gzip", "-c", "-1"], &src, &gz);
    let out = quarry()
        .args(["import", arg(&gz), arg(&dir.path().join("disk.img"))])
        .env("QUARRY_LOG", "debug")
        .output()
        .unwrap();
    assert_ok(&out);
    let err = stderr(&out);
    assert!(err.contains("DEBUG"), "no debug log to check: {err}");
    assert!(!err.contains('\x1b'), "colour codes in {err:?}");
}
