//! Project quotas through ioctls and `quotactl_fd(2)` (no `xfs_quota` binary needed). Works on
//! XFS mounted with `prjquota` and on ext4 with the `project` and `quota` features mounted with
//! `prjquota`; csi's sanity suite runs both in a guest kernel that has quota support
//! (`guest::project_quotas_are_enforced_in_a_guest_kernel`). XFS holds every writer to the limit
//! (ENOSPC); ext4 fails writes with EDQUOT but lets writers with CAP_SYS_RESOURCE past it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;
// _IOR('X', 31, struct fsxattr) and _IOW('X', 32, struct fsxattr); sizeof(struct fsxattr) == 28
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;

const PRJQUOTA: i32 = 2;
const fn xqm_cmd(x: i32) -> i32 {
    (('X' as i32) << 8) + x
}
const Q_XSETQLIM: i32 = xqm_cmd(4);
const Q_XGETQUOTA: i32 = xqm_cmd(3);
const Q_XGETQSTATV: i32 = xqm_cmd(8);
const fn qcmd(cmd: i32, kind: i32) -> i32 {
    (cmd << 8) | (kind & 0xff)
}

const FS_QSTATV_VERSION1: u8 = 1;
const FS_DQUOT_VERSION: i8 = 1;
const FS_PROJ_QUOTA: i8 = 2;
const FS_DQ_BSOFT: u16 = 1 << 2;
const FS_DQ_BHARD: u16 = 1 << 3;
const FS_QUOTA_PDQ_ACCT: u16 = 1 << 4;
const FS_QUOTA_PDQ_ENFD: u16 = 1 << 5;

#[repr(C)]
#[derive(Default)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

#[repr(C)]
#[derive(Default)]
struct FsDiskQuota {
    version: i8,
    flags: i8,
    fieldmask: u16,
    id: u32,
    blk_hardlimit: u64,
    blk_softlimit: u64,
    ino_hardlimit: u64,
    ino_softlimit: u64,
    bcount: u64,
    icount: u64,
    itimer: i32,
    btimer: i32,
    iwarns: u16,
    bwarns: u16,
    itimer_hi: i8,
    btimer_hi: i8,
    rtbtimer_hi: i8,
    padding2: i8,
    rtb_hardlimit: u64,
    rtb_softlimit: u64,
    rtbcount: u64,
    rtbtimer: i32,
    rtbwarns: u16,
    padding3: i16,
    padding4: [u8; 8],
}

/// Space and inodes charged to a project, and its hard block limit (0 = none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProjectUsage {
    /// Bytes allocated.
    pub bytes: u64,
    /// Inodes used.
    pub inodes: u64,
    /// Hard limit in bytes, 0 when unlimited.
    pub limit_bytes: u64,
}

/// quotactl_fd(2) on the filesystem holding `on`, for project quotas.
///
/// # Safety
///
/// `addr` must point to a live, writable structure of the layout `cmd` reads or fills (for
/// `Q_XGETQSTATV`, a `struct fs_quota_statv` with its version set; for `Q_XGETQUOTA` and
/// `Q_XSETQLIM`, a `struct fs_disk_quota`), valid for the whole call.
unsafe fn quotactl(on: &Path, cmd: i32, id: u32, addr: *mut libc::c_void) -> io::Result<()> {
    let f = File::open(on)?;
    // SAFETY: `f` is open for the whole call, so the descriptor is valid; the caller guarantees
    // that `addr` points to a live structure of the layout and size `cmd` expects. The integer
    // arguments are passed by value.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            f.as_raw_fd(),
            qcmd(cmd, PRJQUOTA) as libc::c_uint,
            id as libc::c_int,
            addr,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether project quota accounting AND enforcement are on for the filesystem holding `path`.
pub fn project_quota_enforced(path: &Path) -> io::Result<bool> {
    // struct fs_quota_statv: version (s8), pad (u8), flags (u16), ...; 160 bytes on Linux. The
    // first word holds version, pad and flags in memory order.
    let mut buf = [0u64; 24];
    buf[0] = u64::from_ne_bytes([FS_QSTATV_VERSION1, 0, 0, 0, 0, 0, 0, 0]);
    // SAFETY: `buf` is 192 bytes, larger than struct fs_quota_statv, 8-byte aligned (its fields
    // need 8 at most), lives across the call and has the version byte the kernel checks set.
    match unsafe { quotactl(path, Q_XGETQSTATV, 0, buf.as_mut_ptr().cast()) } {
        Ok(()) => {
            let head = buf[0].to_ne_bytes();
            let flags = u16::from_ne_bytes([head[2], head[3]]);
            Ok(flags & FS_QUOTA_PDQ_ACCT != 0 && flags & FS_QUOTA_PDQ_ENFD != 0)
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS | libc::EINVAL | libc::ENOTSUP | libc::ESRCH | libc::ENOENT)
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Tags directory `dir` with project `id` and PROJINHERIT, so everything created below it is
/// charged to the project.
pub fn set_project(dir: &Path, id: u32) -> io::Result<()> {
    let f = File::open(dir)?;
    let mut x = FsXattr::default();
    // SAFETY: FS_IOC_FSGETXATTR writes one struct fsxattr (28 bytes) through its argument;
    // `x` is a live FsXattr, which mirrors it (repr(C), size checked by the tests), and `f` is
    // open for the call.
    if unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FSGETXATTR, &mut x) } < 0 {
        return Err(io::Error::last_os_error());
    }
    x.projid = id;
    x.xflags |= FS_XFLAG_PROJINHERIT;
    // SAFETY: as above; FS_IOC_FSSETXATTR only reads the struct fsxattr `x` holds.
    if unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FSSETXATTR, &x) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the project id of a file or directory.
pub fn get_project(path: &Path) -> io::Result<u32> {
    let f = File::open(path)?;
    let mut x = FsXattr::default();
    // SAFETY: as in set_project: the kernel writes one struct fsxattr, which `x` mirrors.
    if unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FSGETXATTR, &mut x) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(x.projid)
}

/// Sets the hard (and soft) block limit of project `id` on the filesystem holding `on`.
/// `bytes == 0` removes the limit.
pub fn set_limit(on: &Path, id: u32, bytes: u64) -> io::Result<()> {
    let blocks = bytes.div_ceil(512);
    let mut q = FsDiskQuota {
        version: FS_DQUOT_VERSION,
        flags: FS_PROJ_QUOTA,
        fieldmask: FS_DQ_BSOFT | FS_DQ_BHARD,
        id,
        blk_hardlimit: blocks,
        blk_softlimit: blocks,
        ..Default::default()
    };
    // SAFETY: `q` is a live FsDiskQuota, which mirrors struct fs_disk_quota (repr(C), size
    // checked by the tests), the structure Q_XSETQLIM reads.
    unsafe { quotactl(on, Q_XSETQLIM, id, (&raw mut q).cast()) }
}

/// Usage and limit of project `id`; an unknown project reads as all zeros.
pub fn usage(on: &Path, id: u32) -> io::Result<ProjectUsage> {
    let mut q = FsDiskQuota::default();
    // SAFETY: `q` is a live FsDiskQuota, which mirrors struct fs_disk_quota (repr(C), size
    // checked by the tests), the structure Q_XGETQUOTA fills.
    match unsafe { quotactl(on, Q_XGETQUOTA, id, (&raw mut q).cast()) } {
        Ok(()) => Ok(ProjectUsage {
            bytes: q.bcount * 512,
            inodes: q.icount,
            limit_bytes: q.blk_hardlimit * 512,
        }),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(ProjectUsage::default()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<FsXattr>(), 28);
        assert_eq!(std::mem::size_of::<FsDiskQuota>(), 112);
        assert_eq!(Q_XSETQLIM, 0x5804);
        assert_eq!(qcmd(Q_XGETQUOTA, PRJQUOTA), 0x580302);
    }

    #[test]
    fn a_filesystem_without_project_quotas_reports_not_enforced() {
        // /tmp has no project quotas on any machine this runs on (a quota-less kernel answers
        // ENOSYS, one with quotas ESRCH/ENOENT): either way "not enforced", not an error.
        let d = tempfile::tempdir().unwrap();
        assert!(!project_quota_enforced(d.path()).unwrap());
    }
}
