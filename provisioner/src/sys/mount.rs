//! Bind mounts, filesystem mounts of a device, and `/proc/self/mountinfo`.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The mounted subtree of the source filesystem.
    pub root: String,
    /// Filesystem type.
    pub fstype: String,
    /// Mount source (device).
    pub source: String,
    /// Per-mount options (rw/ro, ...).
    pub options: String,
}

fn unescape(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(sep) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        if f.len() < 6 || f.len() < sep + 3 {
            continue;
        }
        out.push(MountEntry {
            root: unescape(f[3]),
            mount_point: PathBuf::from(unescape(f[4])),
            options: f[5].to_string(),
            fstype: f[sep + 1].to_string(),
            source: unescape(f[sep + 2]),
        });
    }
    out
}

/// The current mounts of this process's namespace.
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&std::fs::read_to_string(
        "/proc/self/mountinfo",
    )?))
}

/// Whether something is mounted exactly at `path`.
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    let p = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(mounts()?.iter().any(|m| m.mount_point == p))
}

/// Parses CSI `mount_flags` (each entry may hold several, comma-separated) into the per-mount
/// flags a bind mount can carry. Anything else is refused, by name: a hostpath volume is a
/// directory of the pool's filesystem, so filesystem options cannot apply.
pub fn bind_flags(mount_flags: &[String]) -> Result<MsFlags, String> {
    let mut flags = MsFlags::empty();
    for flag in mount_flags.iter().flat_map(|f| f.split(',')).map(str::trim) {
        match flag {
            "" | "defaults" | "bind" | "rw" | "suid" | "dev" | "exec" | "atime" | "relatime" => {}
            "ro" => flags |= MsFlags::MS_RDONLY,
            "nosuid" => flags |= MsFlags::MS_NOSUID,
            "nodev" => flags |= MsFlags::MS_NODEV,
            "noexec" => flags |= MsFlags::MS_NOEXEC,
            "noatime" => flags |= MsFlags::MS_NOATIME,
            "nodiratime" => flags |= MsFlags::MS_NODIRATIME,
            "strictatime" => flags |= MsFlags::MS_STRICTATIME,
            other => {
                return Err(format!(
                    "mount flag {other:?} cannot apply to a bind mount (supported: ro, nosuid, \
                     nodev, noexec, noatime, nodiratime, strictatime)"
                ));
            }
        }
    }
    Ok(flags)
}

/// Bind-mounts `src` onto `target` (a directory onto a directory, or a file or device node onto
/// a file), then applies per-mount `flags` such as `MS_RDONLY` by a bind remount (the mount is
/// undone if the remount fails).
pub fn bind(src: &Path, target: &Path, flags: MsFlags) -> io::Result<()> {
    nix::mount::mount(
        Some(src),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    if !flags.is_empty()
        && let Err(e) = nix::mount::mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags,
            None::<&str>,
        )
    {
        let _ = nix::mount::umount2(target, MntFlags::empty());
        return Err(e.into());
    }
    Ok(())
}

/// Mounts the filesystem of type `fstype` (`xfs`, `ext4`, ...) on block device `device` at
/// `target`, with no options.
pub fn filesystem(device: &Path, target: &Path, fstype: &str) -> io::Result<()> {
    nix::mount::mount(
        Some(device),
        target,
        Some(fstype),
        MsFlags::empty(),
        None::<&str>,
    )?;
    Ok(())
}

/// Unmounts `target`; not being mounted is not an error.
pub fn unmount(target: &Path) -> io::Result<()> {
    match nix::mount::umount2(target, MntFlags::empty()) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(list: &[&str]) -> Result<MsFlags, String> {
        bind_flags(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn bind_flags_map_to_per_mount_flags() {
        assert_eq!(flags(&[]).unwrap(), MsFlags::empty());
        assert_eq!(
            flags(&["noexec,nosuid", "ro"]).unwrap(),
            MsFlags::MS_NOEXEC | MsFlags::MS_NOSUID | MsFlags::MS_RDONLY
        );
        assert_eq!(
            flags(&["defaults", "rw", "relatime"]).unwrap(),
            MsFlags::empty()
        );
    }

    #[test]
    fn filesystem_options_are_refused_by_name() {
        let err = flags(&["noexec", "discard"]).unwrap_err();
        assert!(err.contains("\"discard\""), "{err}");
    }

    #[test]
    fn parses_mountinfo_lines_with_escapes_and_optional_fields() {
        let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    37 35 0:5 /loop3 /tgt/blk ro shared:2 master:3 - devtmpfs udev rw\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m[0].root, "/mnt1");
        assert_eq!(m[0].fstype, "ext3");
        assert_eq!(m[1].source, "udev");
        assert_eq!(m[1].options, "ro");
    }
}
