//! Loop devices through the loop ioctls (`/dev/loop-control`, `LOOP_CONFIGURE`, `LOOP_CLR_FD`),
//! and discovery of attached devices through sysfs, so leaked devices can be found and released.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_CAPACITY: libc::c_ulong = 0x4C07;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LOOP_MAJOR: u64 = 7;

#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// The device node path of loop device `n`.
pub fn dev_path(n: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{n}"))
}

fn open_dev(n: u32) -> io::Result<File> {
    let path = dev_path(n);
    if !path.exists() {
        // containers without udev: make the node ourselves
        let dev = nix::sys::stat::makedev(LOOP_MAJOR, n as u64);
        nix::sys::stat::mknod(
            &path,
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o660),
            dev,
        )?;
    }
    OpenOptions::new().read(true).write(true).open(&path)
}

/// Attaches `file` to a free loop device and returns the device path.
pub fn attach(file: &Path, read_only: bool) -> io::Result<PathBuf> {
    let backing = OpenOptions::new().read(true).write(!read_only).open(file)?;
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    // GET_FREE hands every concurrent caller the same lowest free device: this process's
    // attaches take turns, so only other processes can still race it (and are retried)
    static ATTACH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ATTACH.lock().unwrap_or_else(|p| p.into_inner());
    let mut last = io::Error::other("no free loop device");
    for _ in 0..64 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let dev = open_dev(n as u32)?;
        // SAFETY: LoopConfig is plain data; all-zero is a valid value.
        let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
        cfg.fd = backing.as_raw_fd() as u32;
        cfg.info.flags = if read_only { LO_FLAGS_READ_ONLY } else { 0 };
        let name = file.as_os_str().as_encoded_bytes();
        let len = name.len().min(63);
        cfg.info.file_name[..len].copy_from_slice(&name[..len]);
        // SAFETY: LOOP_CONFIGURE reads a struct loop_config, which LoopConfig mirrors.
        if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg) } == 0 {
            return Ok(dev_path(n as u32));
        }
        last = io::Error::last_os_error();
        if last.raw_os_error() != Some(libc::EBUSY) {
            return Err(last);
        }
        // another process took this device between GET_FREE and CONFIGURE: try the next one
    }
    Err(last)
}

/// Detaches a loop device; a device that is already free is not an error.
pub fn detach(dev: &Path) -> io::Result<()> {
    let f = match OpenOptions::new().read(true).open(dev) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    // SAFETY: LOOP_CLR_FD takes no argument.
    if unsafe { libc::ioctl(f.as_raw_fd(), LOOP_CLR_FD, 0) } < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// Makes an attached loop device pick up its backing file's new size.
pub fn refresh_capacity(dev: &Path) -> io::Result<()> {
    let f = OpenOptions::new().read(true).open(dev)?;
    // SAFETY: LOOP_SET_CAPACITY takes no argument.
    if unsafe { libc::ioctl(f.as_raw_fd(), LOOP_SET_CAPACITY, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An attached loop device and its backing file as sysfs reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// `/dev/loopN`.
    pub dev: PathBuf,
    /// The backing file path (a trailing " (deleted)" removed).
    pub backing: PathBuf,
    /// The backing file was deleted.
    pub deleted: bool,
}

/// All attached loop devices.
pub fn list() -> io::Result<Vec<Attached>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/block")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let Some(num) = name.strip_prefix("loop") else {
            continue;
        };
        if num.parse::<u32>().is_err() {
            continue;
        }
        let Ok(b) = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")) else {
            continue;
        };
        let b = b.trim_end_matches('\n');
        let (b, deleted) = match b.strip_suffix(" (deleted)") {
            Some(s) => (s, true),
            None => (b, false),
        };
        out.push(Attached {
            dev: PathBuf::from(format!("/dev/{name}")),
            backing: PathBuf::from(b),
            deleted,
        });
    }
    out.sort_by(|a, b| a.dev.cmp(&b.dev));
    Ok(out)
}

/// Loop devices attached to `file` (compared by path; the file must be given canonical).
pub fn find_by_backing(file: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(list()?
        .into_iter()
        .filter(|a| a.backing == file)
        .map(|a| a.dev)
        .collect())
}

/// If `path` is a loop block device node (or a bind mount of one), its `/dev/loopN` path.
pub fn loop_of_node(path: &Path) -> io::Result<Option<PathBuf>> {
    let md = std::fs::metadata(path)?;
    if !md.file_type().is_block_device() {
        return Ok(None);
    }
    let rdev = md.rdev();
    if nix::sys::stat::major(rdev) != LOOP_MAJOR {
        return Ok(None);
    }
    Ok(Some(dev_path(nix::sys::stat::minor(rdev) as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }
}
