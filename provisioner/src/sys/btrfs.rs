//! Btrfs subvolumes and qgroup limits through ioctls (no `btrfs` binary needed on the node).
//!
//! On a btrfs pool each filesystem volume is a subvolume, and its size is the `max_rfer` limit of
//! its level-0 qgroup: writing past it fails with `EDQUOT` inside the volume, while the rest of
//! the pool is unaffected. This is the size enforcement available where project quotas are not
//! (kernels built without XFS quota or the quota formats ext4 needs).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

// _IOW(0x94, 14, struct btrfs_ioctl_vol_args), 4096 bytes
const BTRFS_IOC_SUBVOL_CREATE: libc::c_ulong = 0x5000_940e;
// _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args), 16 bytes
const BTRFS_IOC_QUOTA_CTL: libc::c_ulong = 0xc010_9428;
// _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args), 48 bytes
const BTRFS_IOC_QGROUP_LIMIT: libc::c_ulong = 0x8030_942b;
// _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args), 1024 bytes
const BTRFS_IOC_FS_INFO: libc::c_ulong = 0x8400_941f;

const BTRFS_QUOTA_CTL_ENABLE: u64 = 1;
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1;
/// The value that clears a limit (btrfs-progs' `qgroup limit none`).
const CLEAR_LIMIT: u64 = u64::MAX;
const BTRFS_PATH_NAME_MAX: usize = 4087;

#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; BTRFS_PATH_NAME_MAX + 1],
}

#[repr(C)]
#[derive(Default)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

#[repr(C)]
#[derive(Default)]
struct QgroupLimitArgs {
    qgroupid: u64,
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 1024 - 32],
}

/// A btrfs ioctl on `f` whose argument is a pointer to `arg`.
///
/// # Safety
///
/// `T` must mirror the structure request `req` reads or fills: `repr(C)`, the kernel's layout
/// and the size `req` encodes, and made of integers and byte arrays only, so whatever the kernel
/// writes into it is a valid `T`.
unsafe fn ioctl<T>(f: &File, req: libc::c_ulong, arg: &mut T) -> io::Result<()> {
    // SAFETY: `f` is open for the call and `arg` is a live, exclusive reference, so the pointer
    // is valid for reads and writes of one `T`; the caller guarantees that `T` is the structure
    // `req` expects, so the kernel touches no byte outside it and leaves a valid `T`.
    if unsafe { libc::ioctl(f.as_raw_fd(), req as _, arg as *mut T) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The filesystem's UUID, as sysfs names it (`/sys/fs/btrfs/<uuid>`).
fn fsid(path: &Path) -> io::Result<String> {
    let f = File::open(path)?;
    let mut args = FsInfoArgs {
        max_id: 0,
        num_devices: 0,
        fsid: [0; 16],
        rest: [0; 1024 - 32],
    };
    // SAFETY: FsInfoArgs mirrors struct btrfs_ioctl_fs_info_args (integers and bytes; sizes
    // checked by ioctl_argument_sizes_match_the_kernel_abi).
    unsafe { ioctl(&f, BTRFS_IOC_FS_INFO, &mut args) }?;
    Ok(uuid_string(&args.fsid))
}

/// `8-4-4-4-12` lowercase hex, as sysfs and `blkid` print a UUID.
fn uuid_string(id: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in id.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Whether qgroups (quota accounting, hence limits) are enabled on the btrfs holding `path`.
pub fn quota_enabled(path: &Path) -> io::Result<bool> {
    let id = fsid(path)?;
    Ok(Path::new("/sys/fs/btrfs").join(id).join("qgroups").is_dir())
}

/// Turns qgroups on for the btrfs holding `path` (the kernel then rescans existing data).
pub fn enable_quota(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    let mut args = QuotaCtlArgs {
        cmd: BTRFS_QUOTA_CTL_ENABLE,
        status: 0,
    };
    // SAFETY: QuotaCtlArgs mirrors struct btrfs_ioctl_quota_ctl_args (two u64).
    unsafe { ioctl(&f, BTRFS_IOC_QUOTA_CTL, &mut args) }
}

/// Creates `dir` as a new subvolume (its parent must exist).
pub fn create_subvolume(dir: &Path) -> io::Result<()> {
    let (parent, name) = match (dir.parent(), dir.file_name()) {
        (Some(p), Some(n)) => (p, n),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} has no parent directory", dir.display()),
            ));
        }
    };
    let name: &OsStr = name;
    if name.len() > BTRFS_PATH_NAME_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "subvolume name too long",
        ));
    }
    let parent = File::open(parent)?;
    let mut args = VolArgs {
        fd: 0,
        name: [0; BTRFS_PATH_NAME_MAX + 1],
    };
    args.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: VolArgs mirrors struct btrfs_ioctl_vol_args (an i64 and a byte array).
    unsafe { ioctl(&parent, BTRFS_IOC_SUBVOL_CREATE, &mut args) }
}

/// Whether `dir` is the root of a subvolume (btrfs gives every subvolume root inode 256).
pub fn is_subvolume(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;
    std::fs::metadata(dir).is_ok_and(|m| m.is_dir() && m.ino() == BTRFS_FIRST_FREE_OBJECTID)
}

/// Limits the bytes the subvolume at `dir` may reference to `bytes` (0 clears the limit).
pub fn set_limit(dir: &Path, bytes: u64) -> io::Result<()> {
    let f = File::open(dir)?;
    let mut args = QgroupLimitArgs {
        // 0 means the qgroup of the subvolume the fd is in
        qgroupid: 0,
        flags: BTRFS_QGROUP_LIMIT_MAX_RFER,
        max_rfer: if bytes == 0 { CLEAR_LIMIT } else { bytes },
        ..Default::default()
    };
    // SAFETY: QgroupLimitArgs mirrors struct btrfs_ioctl_qgroup_limit_args (six u64).
    unsafe { ioctl(&f, BTRFS_IOC_QGROUP_LIMIT, &mut args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_argument_sizes_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<VolArgs>(), 4096);
        assert_eq!(std::mem::size_of::<QuotaCtlArgs>(), 16);
        assert_eq!(std::mem::size_of::<QgroupLimitArgs>(), 48);
        assert_eq!(std::mem::size_of::<FsInfoArgs>(), 1024);
        // the request numbers encode those sizes in bits 16..30
        for (req, size) in [
            (BTRFS_IOC_SUBVOL_CREATE, 4096),
            (BTRFS_IOC_QUOTA_CTL, 16),
            (BTRFS_IOC_QGROUP_LIMIT, 48),
            (BTRFS_IOC_FS_INFO, 1024),
        ] {
            assert_eq!((req >> 16) & 0x3fff, size, "{req:#x}");
            assert_eq!((req >> 8) & 0xff, 0x94, "{req:#x}");
        }
    }

    #[test]
    fn fsid_prints_as_sysfs_names_it() {
        let id = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(uuid_string(&id), "12345678-9abc-def0-0123-456789abcdef");
    }
}
