//! Filesystem statistics: free space, filesystem type, and the usage of one directory tree.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Filesystem kinds the provisioner distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsKind {
    /// XFS.
    Xfs,
    /// ext2/3/4.
    Ext4,
    /// btrfs.
    Btrfs,
    /// tmpfs.
    Tmpfs,
    /// Anything else (magic number).
    Other(i64),
}

impl FsKind {
    /// A short name for reports.
    pub fn name(self) -> String {
        match self {
            FsKind::Xfs => "xfs".into(),
            FsKind::Ext4 => "ext4".into(),
            FsKind::Btrfs => "btrfs".into(),
            FsKind::Tmpfs => "tmpfs".into(),
            FsKind::Other(m) => format!("0x{m:x}"),
        }
    }
}

/// Space figures of the filesystem holding a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// Filesystem type.
    pub kind: FsKind,
    /// Total bytes.
    pub total_bytes: u64,
    /// Bytes available to unprivileged users.
    pub avail_bytes: u64,
    /// Total inodes.
    pub total_inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
    /// Mounted read-only.
    pub read_only: bool,
}

/// statfs(2) of the filesystem holding `path`.
pub fn stats(path: &Path) -> io::Result<FsStats> {
    let s = nix::sys::statfs::statfs(path)?;
    let magic = s.filesystem_type().0 as i64;
    let kind = match magic {
        0x5846_5342 => FsKind::Xfs,
        0xEF53 => FsKind::Ext4,
        0x9123_683E => FsKind::Btrfs,
        0x0102_1994 => FsKind::Tmpfs,
        m => FsKind::Other(m),
    };
    let bsize = s.block_size() as u64;
    let v = nix::sys::statvfs::statvfs(path)?;
    Ok(FsStats {
        kind,
        total_bytes: s.blocks() * bsize,
        avail_bytes: s.blocks_available() * bsize,
        total_inodes: s.files(),
        free_inodes: s.files_free(),
        read_only: v.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY),
    })
}

/// Bytes allocated and inodes used by the tree at `root` (not following symlinks, not crossing
/// mount points).
pub fn tree_usage(root: &Path) -> io::Result<(u64, u64)> {
    let top = std::fs::symlink_metadata(root)?;
    let dev = top.dev();
    let mut bytes = top.blocks() * 512;
    let mut inodes = 1;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in rd {
            let entry = entry?;
            let md = match entry.metadata() {
                Ok(md) => md,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if md.dev() != dev {
                continue;
            }
            bytes += md.blocks() * 512;
            inodes += 1;
            if md.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok((bytes, inodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_usage_counts_files_and_dirs() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/f"), vec![1u8; 64 * 1024]).unwrap();
        let (bytes, inodes) = tree_usage(d.path()).unwrap();
        assert_eq!(inodes, 3);
        assert!(bytes >= 64 * 1024, "{bytes}");
        let st = stats(d.path()).unwrap();
        assert!(st.total_bytes > 0);
    }
}
