//! The node side: publishing volumes with bind mounts (block volumes through loop devices),
//! unpublishing, statistics and node expansion.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::meta::{State, VolumeMeta, VolumeMode, write_json};
use crate::pool::Pool;
use crate::provisioner::{CapacityRange, CreateVolume, Provisioner};
use crate::sys::{fsinfo, loopdev, mount};

/// Volume context key the kubelet sets for CSI ephemeral inline volumes.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// A NodePublishVolume request.
#[derive(Debug, Clone)]
pub struct Publish<'a> {
    /// Volume id.
    pub volume_id: &'a str,
    /// Where to place the volume.
    pub target: &'a Path,
    /// Publish read-only.
    pub read_only: bool,
    /// The access type the workload asked for.
    pub mode: VolumeMode,
    /// The volume context (ephemeral inline volumes carry their parameters here).
    pub context: &'a BTreeMap<String, String>,
    /// CSI `mount_flags` of a filesystem volume (per-mount flags of the bind mount).
    pub mount_flags: &'a [String],
    /// The access mode allows one target only (SINGLE_NODE_SINGLE_WRITER,
    /// SINGLE_NODE_READER_ONLY): refused while the volume is published elsewhere, and while
    /// it is published here no other target may publish it.
    pub exclusive: bool,
}

/// Space and inode usage of one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStats {
    /// Volume size in bytes (its capacity; the pool's size for unbounded volumes).
    pub total_bytes: u64,
    /// Bytes allocated by the volume.
    pub used_bytes: u64,
    /// Bytes the volume can still allocate.
    pub available_bytes: u64,
    /// Inodes: total the volume may use (the pool's), used by the volume, still free.
    pub total_inodes: u64,
    /// Inodes used by the volume.
    pub used_inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
    /// Block volume (only byte totals are meaningful).
    pub block: bool,
    /// Abnormal condition message, if any.
    pub abnormal: Option<String>,
}

/// Parses a size such as `1048576`, `512Mi`, `1Gi`, `10M`.
pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("K", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ]
    .iter()
    .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((s, 1));
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| Error::InvalidArgument(format!("invalid size {s:?}")))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

impl Provisioner {
    fn pool_of_path(&self, p: &Path) -> Option<&Pool> {
        self.pools().into_iter().find(|pool| pool.contains(p))
    }

    /// Publishes a volume at `target`: a bind mount of its directory, or for block volumes a
    /// loop device over its file bind-mounted onto the target file. Idempotent. A refused or
    /// failed publish leaves nothing behind: no mount, no loop device, no directory or file it
    /// created, and no ephemeral volume it created.
    pub fn publish(&self, req: &Publish<'_>) -> Result<()> {
        if req.volume_id.is_empty() {
            return Err(Error::InvalidArgument("volume id is required".into()));
        }
        if req.target.as_os_str().is_empty() || !req.target.is_absolute() {
            return Err(Error::InvalidArgument(
                "target path must be an absolute path".into(),
            ));
        }
        let mut flags = mount::bind_flags(req.mount_flags).map_err(Error::InvalidArgument)?;
        if req.read_only {
            flags |= nix::mount::MsFlags::MS_RDONLY;
        }
        let created = req.context.get(EPHEMERAL_KEY).map(String::as_str) == Some("true")
            && self.ensure_ephemeral(req)?;
        let published = self.publish_volume(req, flags);
        if published.is_err()
            && created
            && let Err(e) = self.delete_volume(req.volume_id)
        {
            tracing::error!(volume = %req.volume_id, error = %e, "cannot remove the ephemeral volume of a failed publish");
        }
        published
    }

    fn publish_volume(&self, req: &Publish<'_>, flags: nix::mount::MsFlags) -> Result<()> {
        let _guard = self.lock_volume(req.volume_id)?;
        let (pool, mut m) = self.volume(req.volume_id)?;
        let (dir, file) = (pool.volume_dir(&m.id), pool.block_file(&m.id));
        if m.mode != req.mode {
            return Err(Error::InvalidArgument(format!(
                "volume {} is a {:?} volume, published as {:?}",
                m.id, m.mode, req.mode
            )));
        }
        if mount::is_mount_point(req.target).ctx(|| "read mountinfo".into())? {
            return already_published(req, &m, &dir, &file);
        }
        self.check_sharing(pool, &m, req)?;
        let mut made = Made::default();
        match m.mode {
            VolumeMode::Filesystem => {
                made.dirs(req.target)?;
                mount::bind(&dir, req.target, flags)
                    .ctx(|| format!("bind {} on {}", dir.display(), req.target.display()))?;
            }
            VolumeMode::Block => {
                if let Some(parent) = req.target.parent() {
                    made.dirs(parent)?;
                }
                made.file(req.target)?;
                let dev = loopdev::attach(&file, req.read_only)
                    .ctx(|| format!("attach a loop device to {}", file.display()))?;
                crate::crash::point("publish-block.attached");
                if let Err(e) = mount::bind(&dev, req.target, flags) {
                    let _ = loopdev::detach(&dev);
                    return Err(Error::io(
                        format!("bind {} on {}", dev.display(), req.target.display()),
                        e,
                    ));
                }
                tracing::debug!(volume = %m.id, dev = %dev.display(), "block volume attached");
            }
        }
        if req.exclusive {
            m.exclusive_target = Some(req.target.to_path_buf());
            if let Err(e) = write_json(&pool.volume_meta_path(&m.id), &m) {
                self.unmount_target(req.target)?;
                return Err(e);
            }
        }
        made.keep();
        tracing::info!(volume = %m.id, target = %req.target.display(), read_only = req.read_only, exclusive = req.exclusive, "volume published");
        Ok(())
    }

    /// Refuses a publish at a new target that the access modes forbid: any other target while
    /// an exclusive publication is mounted, and an exclusive one while any other is.
    fn check_sharing(&self, pool: &Pool, m: &VolumeMeta, req: &Publish<'_>) -> Result<()> {
        if let Some(t) = &m.exclusive_target
            && t != req.target
            && mount::is_mount_point(t).ctx(|| "read mountinfo".into())?
        {
            return Err(Error::FailedPrecondition(format!(
                "volume {} is published at {} with a single-workload access mode \
                 (SINGLE_NODE_SINGLE_WRITER or SINGLE_NODE_READER_ONLY)",
                m.id,
                t.display()
            )));
        }
        if req.exclusive {
            let others = self.publications(pool, m)?;
            if let Some(t) = others.first() {
                return Err(Error::FailedPrecondition(format!(
                    "volume {} is already published ({} in use), and its access mode allows \
                     one workload only",
                    m.id,
                    t.display()
                )));
            }
        }
        Ok(())
    }

    /// Where a volume is in use on this node: the mount points its directory is bound to, or
    /// the loop devices over its block file.
    pub fn publications(&self, pool: &Pool, m: &VolumeMeta) -> Result<Vec<PathBuf>> {
        match m.mode {
            VolumeMode::Filesystem => {
                let dir = pool.volume_dir(&m.id);
                let Ok(canon) = std::fs::canonicalize(&dir) else {
                    return Ok(Vec::new());
                };
                let suffix = format!("/{}", m.id);
                Ok(mount::mounts()
                    .ctx(|| "read mountinfo".into())?
                    .into_iter()
                    // the bind's root is the volume's path in its filesystem: a cheap filter
                    // before comparing inodes
                    .filter(|e| e.root.ends_with(&suffix) && e.mount_point != canon)
                    .filter(|e| same_file(&e.mount_point, &canon))
                    .map(|e| e.mount_point)
                    .collect())
            }
            VolumeMode::Block => match std::fs::canonicalize(pool.block_file(&m.id)) {
                Ok(f) => loopdev::find_by_backing(&f).ctx(|| "list loop devices".into()),
                Err(_) => Ok(Vec::new()),
            },
        }
    }

    /// Creates the volume of an ephemeral inline publish; true when this call created it.
    fn ensure_ephemeral(&self, req: &Publish<'_>) -> Result<bool> {
        let size = match req.context.get("size") {
            Some(s) => parse_size(s)?,
            None => 0,
        };
        let create = CreateVolume {
            name: req.volume_id.to_string(),
            capacity: CapacityRange {
                required: size,
                limit: 0,
            },
            mode: req.mode,
            pool: req.context.get("storagePool").cloned(),
            source: None,
            parameters: req.context.clone(),
            ephemeral: true,
        };
        match self.find_volume(req.volume_id)? {
            Some((_, m)) if m.state == State::Ready && m.ephemeral => Ok(false),
            Some((_, m)) if m.state == State::Ready => Err(Error::AlreadyExists(format!(
                "volume {} exists and is not ephemeral",
                m.id
            ))),
            _ => self.create_volume(&create).map(|_| true),
        }
    }

    /// Unpublishes `target`: unmounts it, releases the loop device of a block volume, removes
    /// the target, and deletes an ephemeral volume. Succeeds when there is nothing to do.
    pub fn unpublish(&self, volume_id: &str, target: &Path) -> Result<()> {
        if volume_id.is_empty() {
            return Err(Error::InvalidArgument("volume id is required".into()));
        }
        if target.as_os_str().is_empty() {
            return Err(Error::InvalidArgument("target path is required".into()));
        }
        let guard = self.lock_volume(volume_id)?;
        if std::fs::symlink_metadata(target).is_ok() {
            self.unmount_target(target)?;
            let md =
                std::fs::symlink_metadata(target).ctx(|| format!("stat {}", target.display()))?;
            let removed = if md.is_dir() {
                std::fs::remove_dir(target)
            } else {
                std::fs::remove_file(target)
            };
            if let Err(e) = removed
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(Error::io(format!("remove {}", target.display()), e));
            }
            tracing::info!(volume = %volume_id, target = %target.display(), "volume unpublished");
        }
        if let Some((pool, mut m)) = self.find_volume(volume_id)?
            && m.state == State::Ready
            && m.exclusive_target.as_deref() == Some(target)
        {
            m.exclusive_target = None;
            write_json(&pool.volume_meta_path(&m.id), &m)?;
        }
        drop(guard);
        if let Some((_, m)) = self.find_volume(volume_id)?
            && m.ephemeral
        {
            self.delete_volume(volume_id)?;
        }
        Ok(())
    }

    /// Unmounts everything stacked on `target`, releasing the loop devices of block volumes.
    fn unmount_target(&self, target: &Path) -> Result<()> {
        while mount::is_mount_point(target).ctx(|| "read mountinfo".into())? {
            let dev = loopdev::loop_of_node(target).ok().flatten();
            mount::unmount(target).ctx(|| format!("unmount {}", target.display()))?;
            if let Some(dev) = dev {
                self.release_loop(&dev)?;
            }
        }
        Ok(())
    }

    fn release_loop(&self, dev: &Path) -> Result<()> {
        let backing = loopdev::list()
            .unwrap_or_default()
            .into_iter()
            .find(|a| a.dev == dev)
            .map(|a| a.backing);
        match backing {
            Some(b) if self.pool_of_path(&b).is_some() => {
                loopdev::detach(dev).ctx(|| format!("detach {}", dev.display()))?;
                tracing::debug!(dev = %dev.display(), "loop device released");
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Usage of a published volume, measured on the volume itself (its project quota, or its
    /// tree), not on the whole pool.
    pub fn volume_stats(&self, volume_id: &str, volume_path: &Path) -> Result<VolumeStats> {
        if volume_id.is_empty() || volume_path.as_os_str().is_empty() {
            return Err(Error::InvalidArgument(
                "volume id and volume path are required".into(),
            ));
        }
        let (pool, m) = self.volume(volume_id)?;
        if !volume_path.exists() {
            return Err(Error::VolumeNotFound(format!(
                "{volume_id} at {}",
                volume_path.display()
            )));
        }
        let abnormal = self.volume_condition(pool, &m);
        if m.mode == VolumeMode::Block {
            return Ok(VolumeStats {
                total_bytes: m.capacity_bytes,
                used_bytes: 0,
                available_bytes: 0,
                total_inodes: 0,
                used_inodes: 0,
                free_inodes: 0,
                block: true,
                abnormal,
            });
        }
        let st = fsinfo::stats(&pool.path).ctx(|| format!("statfs {}", pool.path.display()))?;
        let (used, inodes) = pool.volume_usage(&m)?;
        let total = if m.capacity_bytes > 0 {
            m.capacity_bytes
        } else {
            st.total_bytes
        };
        let bounded = pool.enforces_sizes() && m.capacity_bytes > 0;
        let available = if bounded {
            total.saturating_sub(used).min(st.avail_bytes)
        } else {
            st.avail_bytes.min(total.saturating_sub(used))
        };
        Ok(VolumeStats {
            total_bytes: total,
            used_bytes: used,
            available_bytes: available,
            total_inodes: inodes + st.free_inodes,
            used_inodes: inodes,
            free_inodes: st.free_inodes,
            block: false,
            abnormal,
        })
    }

    /// Node part of an expansion: block volumes' loop devices pick up the new file size.
    /// Returns the volume's capacity.
    pub fn node_expand(&self, volume_id: &str, volume_path: &Path) -> Result<u64> {
        if volume_id.is_empty() || volume_path.as_os_str().is_empty() {
            return Err(Error::InvalidArgument(
                "volume id and volume path are required".into(),
            ));
        }
        let _guard = self.lock_volume(volume_id)?;
        let (m, _dir, file) = self.volume_paths(volume_id)?;
        if !volume_path.exists() {
            return Err(Error::VolumeNotFound(format!(
                "{volume_id} at {}",
                volume_path.display()
            )));
        }
        if m.mode == VolumeMode::Block {
            let back =
                std::fs::canonicalize(&file).ctx(|| format!("resolve {}", file.display()))?;
            for dev in loopdev::find_by_backing(&back).ctx(|| "list loop devices".into())? {
                loopdev::refresh_capacity(&dev)
                    .ctx(|| format!("refresh capacity of {}", dev.display()))?;
            }
        }
        Ok(m.capacity_bytes)
    }

    /// Block volume targets currently attached (for diagnostics).
    pub fn attached_loops(&self) -> Vec<(PathBuf, PathBuf)> {
        loopdev::list()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| self.pool_of_path(&a.backing).is_some())
            .map(|a| (a.dev, a.backing))
            .collect()
    }
}

/// A publish at a target that is already a mount point: fine if it is this volume with the same
/// read-only setting (a repeated call), ALREADY_EXISTS otherwise.
fn already_published(req: &Publish<'_>, m: &VolumeMeta, dir: &Path, file: &Path) -> Result<()> {
    let ok_src = match m.mode {
        VolumeMode::Filesystem => same_file(req.target, dir),
        VolumeMode::Block => loopdev::loop_of_node(req.target)
            .ok()
            .flatten()
            .map(|dev| {
                let back = std::fs::canonicalize(file).unwrap_or(file.to_path_buf());
                loopdev::find_by_backing(&back)
                    .unwrap_or_default()
                    .contains(&dev)
            })
            .unwrap_or(false),
    };
    let ro = fsinfo::stats(req.target)
        .map(|s| s.read_only)
        .unwrap_or(false);
    let ro = match m.mode {
        VolumeMode::Filesystem => ro,
        // for a bind-mounted device node, the mount flag says read-only
        VolumeMode::Block => mount_read_only(req.target).unwrap_or(ro),
    };
    if ok_src && ro == req.read_only {
        return Ok(());
    }
    Err(Error::AlreadyExists(format!(
        "{} is already mounted with another volume or access mode",
        req.target.display()
    )))
}

/// What a publish created on its way (directories above the target, the block target file),
/// removed again in reverse order on drop unless [`Made::keep`] is called: a failed publish
/// leaves the tree as it found it.
#[derive(Default)]
struct Made {
    paths: Vec<PathBuf>,
}

impl Made {
    /// Creates `dir` and its missing ancestors, remembering each one made here.
    fn dirs(&mut self, dir: &Path) -> Result<()> {
        let missing: Vec<&Path> = dir
            .ancestors()
            .take_while(|p| std::fs::symlink_metadata(p).is_err())
            .collect();
        for d in missing.into_iter().rev() {
            match std::fs::create_dir(d) {
                Ok(()) => self.paths.push(d.to_path_buf()),
                // made meanwhile by someone else: theirs to keep
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io(format!("create {}", d.display()), e)),
            }
        }
        Ok(())
    }

    /// Creates the file `path` unless something is there.
    fn file(&mut self, path: &Path) -> Result<()> {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(_) => self.paths.push(path.to_path_buf()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(Error::io(
                    format!("create target file {}", path.display()),
                    e,
                ));
            }
        }
        Ok(())
    }

    /// The publish succeeded: keep everything.
    fn keep(mut self) {
        self.paths.clear();
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        for p in self.paths.iter().rev() {
            let removed = if p.is_dir() {
                std::fs::remove_dir(p)
            } else {
                std::fs::remove_file(p)
            };
            if let Err(e) = removed {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove what a failed publish created");
            }
        }
    }
}

fn mount_read_only(target: &Path) -> Option<bool> {
    let p = std::fs::canonicalize(target).ok()?;
    mount::mounts()
        .ok()?
        .into_iter()
        .rev()
        .find(|m| m.mount_point == p)
        .map(|m| m.options.split(',').any(|o| o == "ro"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("2Mi").unwrap(), 2 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1_000_000_000);
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999Ti").is_err());
    }
}
