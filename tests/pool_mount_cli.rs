//! `quarry pool-mount --device`, the real binary on real loop devices (root only): the mounter
//! of a storage pool on a Block PVC. A blank device is made XFS and mounted at the target; a
//! second run mounts the same filesystem (a file written by the first is still there); an ext4
//! device is mounted as ext4 and not formatted; a device holding anything else is refused by
//! name and left as it was; SIGTERM unmounts and exits 0.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

/// XFS's smallest filesystem (mkfs.xfs 5.19 and later).
const DEVICE_SIZE: u64 = 300 << 20;

/// A loop device over a blank sparse file, and the directory the pool is mounted at (not made:
/// the mounter makes it). None, having said why, where loop devices cannot be made.
struct Setup {
    target: PathBuf,
    // dropped first: the mount goes before its device
    _unmount: Unmount,
    dev: LoopDevice,
    _dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Option<Setup> {
        let dir = tempfile::tempdir().unwrap();
        let dev = LoopDevice::new(&dir.path().join("backing"), DEVICE_SIZE)?;
        let target = dir.path().join("node/var/hpvolumes/pool");
        Some(Setup {
            _unmount: Unmount(target.clone()),
            target,
            dev,
            _dir: dir,
        })
    }

    fn device(&self) -> &Path {
        &self.dev.device
    }
}

/// Unmounts a mount a failed test left.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mount_at(&self.0).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// The filesystem type and source of the mount at `target`, from /proc/self/mountinfo.
fn mount_at(target: &Path) -> Option<(String, String)> {
    let mounts = provisioner::sys::mount::mounts().unwrap();
    let m = mounts.into_iter().rfind(|m| m.mount_point == target)?;
    Some((m.fstype, m.source))
}

/// `blkid -p`'s value of `tag` on `dev`.
fn blkid(dev: &Path, tag: &str) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-s", tag, "-o", "value"])
        .arg(dev)
        .output()
        .expect("blkid (util-linux)");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A running `quarry pool-mount`, killed on drop; its stderr goes to a file.
struct Mounter {
    child: Child,
    log: tempfile::NamedTempFile,
}

impl Mounter {
    fn start(device: &Path, target: &Path) -> Mounter {
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = quarry()
            .args([
                "pool-mount",
                "--device",
                arg(device),
                "--target",
                arg(target),
            ])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("spawning quarry pool-mount");
        Mounter { child, log }
    }

    fn stderr(&self) -> String {
        let mut s = String::new();
        fs::File::open(self.log.path())
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        s
    }

    /// Waits until `target` is a mount point of `device`; its type.
    fn wait_mounted(&mut self, device: &Path, target: &Path) -> String {
        let start = Instant::now();
        loop {
            if let Some((fstype, source)) = mount_at(target) {
                assert_eq!(Path::new(&source), device, "the mount's source");
                return fstype;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("quarry pool-mount exited ({st}): {}", self.stderr());
            }
            // mkfs.xfs and the mount take well under a second; allow for a loaded machine
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{} not mounted within a minute: {}",
                target.display(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then its exit code.
    fn terminate(mut self) -> (i32, String) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) takes integers only; the child is not reaped yet, so the pid is its.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let code = exit_code_within(&mut self.child, Duration::from_secs(20));
        (code, self.stderr())
    }

    /// Its exit code once it ends by itself (within a minute).
    fn exit(mut self) -> (i32, String) {
        let code = exit_code_within(&mut self.child, Duration::from_secs(60));
        (code, self.stderr())
    }
}

impl Drop for Mounter {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The child's exit code, or a failure if it runs past `limit`.
fn exit_code_within(child: &mut Child, limit: Duration) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code().unwrap_or(-1);
        }
        assert!(start.elapsed() < limit, "still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_blank_device_is_made_xfs_once_and_mounted_until_sigterm() {
    let Some(s) = Setup::new() else { return };
    assert_eq!(blkid(s.device(), "TYPE"), "", "the device starts blank");

    let mut m = Mounter::start(s.device(), &s.target);
    assert_eq!(m.wait_mounted(s.device(), &s.target), "xfs");
    assert_eq!(blkid(s.device(), "TYPE"), "xfs");
    let uuid = blkid(s.device(), "UUID");
    fs::write(s.target.join("volume"), b"a pool's data").unwrap();
    let (code, log) = m.terminate();
    assert_eq!(code, 0, "{log}");
    assert!(log.contains("making an XFS filesystem"), "{log}");
    assert_eq!(mount_at(&s.target), None, "SIGTERM unmounts: {log}");
    assert!(!s.target.join("volume").exists());

    // the second mounter finds the filesystem and formats nothing
    let mut m = Mounter::start(s.device(), &s.target);
    assert_eq!(m.wait_mounted(s.device(), &s.target), "xfs");
    assert_eq!(fs::read(s.target.join("volume")).unwrap(), b"a pool's data");
    assert_eq!(blkid(s.device(), "UUID"), uuid, "the same filesystem");
    let (code, log) = m.terminate();
    assert_eq!(code, 0, "{log}");
    assert!(!log.contains("making an XFS filesystem"), "{log}");
    assert_eq!(mount_at(&s.target), None);
}

#[test]
fn an_ext4_device_is_mounted_as_ext4_and_not_formatted() {
    let Some(s) = Setup::new() else { return };
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(s.device())
        .output()
        .expect("mkfs.ext4 (e2fsprogs)");
    assert!(out.status.success(), "{out:?}");
    let uuid = blkid(s.device(), "UUID");

    let mut m = Mounter::start(s.device(), &s.target);
    assert_eq!(m.wait_mounted(s.device(), &s.target), "ext4");
    assert!(s.target.join("lost+found").is_dir());
    let (code, log) = m.terminate();
    assert_eq!(code, 0, "{log}");
    assert!(!log.contains("making an XFS filesystem"), "{log}");
    assert_eq!(blkid(s.device(), "TYPE"), "ext4");
    assert_eq!(blkid(s.device(), "UUID"), uuid, "not formatted again");
    assert_eq!(mount_at(&s.target), None);
}

#[test]
fn a_device_holding_anything_else_is_refused_by_name_and_left_as_it_was() {
    let Some(s) = Setup::new() else { return };
    // swap (a signature the probe names) and stale data (one it does not)
    let swap = Command::new("mkswap").arg(s.device()).output().unwrap();
    assert!(swap.status.success(), "{swap:?}");
    let stale = || {
        let f = fs::OpenOptions::new().write(true).open(s.device()).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"old data", 512 << 10).unwrap();
        // and the swap signature gone: nothing at either end that blkid knows
        std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 4096], 0).unwrap();
    };
    for (what, prepare) in [
        ("swap", None),
        ("data of no known kind", Some(&stale as &dyn Fn())),
    ] {
        if let Some(prepare) = prepare {
            prepare();
        }
        let before = read_prefix(s.device(), 1 << 20);
        let (code, log) = Mounter::start(s.device(), &s.target).exit();
        assert_eq!(code, 1, "{log}");
        let named = format!("{} holds {what}", s.device().display());
        assert!(log.contains(&named), "expected {named:?} in: {log}");
        assert!(log.contains("left as it is"), "{log}");
        assert_eq!(
            read_prefix(s.device(), 1 << 20),
            before,
            "{what}: untouched"
        );
        assert_eq!(mount_at(&s.target), None);
    }
}
