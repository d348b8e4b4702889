//! The node side: publishing volumes with bind mounts (block volumes through loop devices),
//! unpublishing, statistics and node expansion.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::meta::{State, VolumeMode};
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
        self.pools().iter().find(|pool| pool.contains(p))
    }

    /// Publishes a volume at `target`: a bind mount of its directory, or for block volumes a
    /// loop device over its file bind-mounted onto the target file. Idempotent.
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
        if req.context.get(EPHEMERAL_KEY).map(String::as_str) == Some("true") {
            self.ensure_ephemeral(req)?;
        }
        let _guard = self.lock_volume(req.volume_id)?;
        let (m, dir, file) = self.volume_paths(req.volume_id)?;
        if m.mode != req.mode {
            return Err(Error::InvalidArgument(format!(
                "volume {} is a {:?} volume, published as {:?}",
                m.id, m.mode, req.mode
            )));
        }
        if mount::is_mount_point(req.target).ctx(|| "read mountinfo".into())? {
            let ok_src = match m.mode {
                VolumeMode::Filesystem => same_file(req.target, &dir),
                VolumeMode::Block => loopdev::loop_of_node(req.target)
                    .ok()
                    .flatten()
                    .map(|dev| {
                        let back = std::fs::canonicalize(&file).unwrap_or(file.clone());
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
            return Err(Error::AlreadyExists(format!(
                "{} is already mounted with another volume or access mode",
                req.target.display()
            )));
        }
        match m.mode {
            VolumeMode::Filesystem => {
                std::fs::create_dir_all(req.target)
                    .ctx(|| format!("create target {}", req.target.display()))?;
                mount::bind(&dir, req.target, flags)
                    .ctx(|| format!("bind {} on {}", dir.display(), req.target.display()))?;
            }
            VolumeMode::Block => {
                if let Some(parent) = req.target.parent() {
                    std::fs::create_dir_all(parent)
                        .ctx(|| format!("create {}", parent.display()))?;
                }
                if !req.target.exists() {
                    std::fs::File::create(req.target)
                        .ctx(|| format!("create target file {}", req.target.display()))?;
                }
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
        tracing::info!(volume = %m.id, target = %req.target.display(), read_only = req.read_only, "volume published");
        Ok(())
    }

    fn ensure_ephemeral(&self, req: &Publish<'_>) -> Result<()> {
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
            Some((_, m)) if m.state == State::Ready && m.ephemeral => Ok(()),
            Some((_, m)) if m.state == State::Ready => Err(Error::AlreadyExists(format!(
                "volume {} exists and is not ephemeral",
                m.id
            ))),
            _ => self.create_volume(&create).map(|_| ()),
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
            while mount::is_mount_point(target).ctx(|| "read mountinfo".into())? {
                let dev = loopdev::loop_of_node(target).ok().flatten();
                mount::unmount(target).ctx(|| format!("unmount {}", target.display()))?;
                if let Some(dev) = dev {
                    self.release_loop(&dev)?;
                }
            }
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
        drop(guard);
        if let Some((_, m)) = self.find_volume(volume_id)?
            && m.ephemeral
        {
            self.delete_volume(volume_id)?;
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
