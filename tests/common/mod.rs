//! Helpers shared by the CLI test suites: running `quarry`, sample disks, output checks.
#![allow(dead_code)]

pub mod archive;
pub mod mutants;

use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn quarry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_quarry"))
}

pub fn run(args: &[&str]) -> Output {
    quarry().args(args).output().expect("running quarry")
}

/// Runs `cmd` to completion, or kills it after `limit` and fails naming it with what it printed
/// (a hang becomes a failure that says where, not a stuck test).
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    run_within(cmd, limit).unwrap_or_else(|out| {
        panic!(
            "{cmd:?} did not finish within {limit:?}; its stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs `cmd` to completion; or kills it after `limit` and returns what it printed as an error.
pub fn run_within(cmd: &mut Command, limit: std::time::Duration) -> Result<Output, Output> {
    use std::process::Stdio;
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => Ok(out.expect("waiting")),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            Err(rx.recv().expect("the waiter").expect("waiting"))
        }
    }
}

pub fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A deterministic 8 MiB disk: random-looking data, zero runs and a hole, so sparse handling and
/// zero detection are both exercised.
pub fn sample_disk(dir: &Path) -> (PathBuf, Vec<u8>) {
    let mut data = vec![0u8; 8 << 20];
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for (i, b) in data.iter_mut().enumerate() {
        // Zero 1 MiB..3 MiB and the last 512 KiB; pseudo-random elsewhere.
        if (1 << 20..3 << 20).contains(&i) || i >= (8 << 20) - (512 << 10) {
            continue;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 56) as u8 & 0x3f; // compressible, never all-zero blocks
    }
    let path = dir.join("disk.raw");
    fs::write(&path, &data).unwrap();
    (path, data)
}

pub fn compress(tool: &[&str], input: &Path, output: &Path) {
    let out = Command::new(tool[0])
        .args(&tool[1..])
        .arg(input)
        .stdout(fs::File::create(output).unwrap())
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e} (install it)", tool[0]));
    assert!(out.success(), "{tool:?} failed");
}

pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "quarry failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

pub fn no_partial_left(dir: &Path) {
    let leftovers: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("quarry-partial"))
        .collect();
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
}

/// A loop device over a sparse file, detached on drop.
pub struct LoopDevice {
    pub device: PathBuf,
}

impl LoopDevice {
    pub fn new(backing: &Path, size: u64) -> Option<Self> {
        if !nix_is_root() {
            eprintln!("skipping: loop devices need root");
            return None;
        }
        let f = fs::File::create(backing).unwrap();
        f.set_len(size).unwrap();
        let out = Command::new("losetup")
            .args(["--find", "--show", arg(backing)])
            .output()
            .expect("losetup");
        if !out.status.success() {
            eprintln!(
                "skipping: losetup failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        let device = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        Some(LoopDevice { device })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

pub fn nix_is_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

pub fn read_prefix(device: &Path, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    fs::File::open(device)
        .unwrap()
        .read_exact(&mut buf)
        .unwrap();
    buf
}

/// [`sample_disk`] converted to qcow2 by qemu-img, and qemu-img's raw conversion of that qcow2
/// (the reference every import of it must equal).
pub fn sample_qcow2(dir: &Path) -> (PathBuf, Vec<u8>) {
    let (raw, _) = sample_disk(dir);
    let qcow2 = dir.join("disk.qcow2");
    testkit::qemu::qemu_img(&[
        "convert".as_ref(),
        "-O".as_ref(),
        "qcow2".as_ref(),
        raw.as_os_str(),
        qcow2.as_os_str(),
    ]);
    let reference = dir.join("reference.raw");
    testkit::qemu::convert_to_raw(&qcow2, &reference);
    let expected = fs::read(&reference).unwrap();
    (qcow2, expected)
}

/// Exit code, with the output in the panic message when it differs.
pub fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stderr: {}\nstdout: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A refused import: this exit code, the message names `what`, and no target or partial file.
pub fn assert_refused(out: &Output, code: i32, what: &str, target: &Path) {
    assert_exit(out, code);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(what), "expected {what:?} in: {err}");
    assert!(
        !target.exists(),
        "{} exists after a refusal",
        target.display()
    );
    no_partial_left(target.parent().unwrap());
}
