//! One storage pool: its directory layout, its quota and copy modes, and its capacity.

use std::path::{Path, PathBuf};

use crate::config::{PoolConfig, QuotaMode};
use crate::error::{Error, IoContext, Result};
use crate::meta::{
    CopyMethod, GroupSnapshotMeta, SnapshotMeta, VolumeMeta, VolumeMode, read_json,
    sweep_temp_files,
};
use crate::sys::{btrfs, copy, fsinfo, quota};

/// Size enforcement actually in force on a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaInForce {
    /// Each filesystem volume's size is a project quota hard limit (XFS, ext4).
    Project,
    /// Each filesystem volume is a btrfs subvolume whose qgroup limits what it references.
    BtrfsQgroup,
    /// Sizes are recorded only (block volumes are still bounded by their file size).
    None,
}

impl QuotaInForce {
    /// `"project"`, `"btrfs-qgroup"` or `"none"`.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaInForce::Project => "project",
            QuotaInForce::BtrfsQgroup => "btrfs-qgroup",
            QuotaInForce::None => "none",
        }
    }
}

/// An opened storage pool.
///
/// Layout: `<path>/<volume-id>/` is a volume (HPP's layout: importers write `disk.img` there;
/// block volumes keep their sparse backing file at `<path>/<volume-id>/disk.img`);
/// `<path>/.quarry/volumes/<id>.json` its metadata; `<path>/.quarry/snapshots/<id>.json` and
/// `<path>/.quarry/snapshot-data/<id>/` a snapshot.
#[derive(Debug)]
pub struct Pool {
    /// Pool name.
    pub name: String,
    /// Canonical pool directory.
    pub path: PathBuf,
    /// The configured mode.
    pub configured_quota: QuotaMode,
    /// The mode in force.
    pub quota: QuotaInForce,
    /// How snapshots and clones are copied within this pool.
    pub copy: CopyMethod,
    /// Pool filesystem type.
    pub fs: fsinfo::FsKind,
}

/// Block volumes' backing file name inside their volume directory.
pub const BLOCK_FILE: &str = "disk.img";
const META_DIR: &str = ".quarry";

impl Pool {
    /// Opens (creating if needed) the pool directory and detects its capabilities.
    pub fn open(cfg: &PoolConfig) -> Result<Pool> {
        std::fs::create_dir_all(&cfg.path)
            .ctx(|| format!("create pool {} at {}", cfg.name, cfg.path.display()))?;
        let path = std::fs::canonicalize(&cfg.path)
            .ctx(|| format!("resolve pool path {}", cfg.path.display()))?;
        for sub in ["volumes", "snapshots", "snapshot-data", "groups"] {
            std::fs::create_dir_all(path.join(META_DIR).join(sub))
                .ctx(|| format!("create {}/{META_DIR}/{sub}", path.display()))?;
        }
        for sub in ["volumes", "snapshots", "groups"] {
            sweep_temp_files(&path.join(META_DIR).join(sub))?;
        }
        let fs = fsinfo::stats(&path)
            .ctx(|| format!("statfs {}", path.display()))?
            .kind;
        let quota = quota_in_force(&cfg.name, &path, fs, cfg.quota)?;
        let copy = if copy::reflink_supported(&path.join(META_DIR)) {
            CopyMethod::Reflink
        } else {
            CopyMethod::Sparse
        };
        tracing::info!(
            pool = %cfg.name,
            path = %path.display(),
            fs = %fs.name(),
            quota = quota.as_str(),
            copy = ?copy,
            "storage pool opened"
        );
        Ok(Pool {
            name: cfg.name.clone(),
            path,
            configured_quota: cfg.quota,
            quota,
            copy,
            fs,
        })
    }

    /// The volume's directory.
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.path.join(id)
    }

    /// A block volume's backing file.
    pub fn block_file(&self, id: &str) -> PathBuf {
        self.volume_dir(id).join(BLOCK_FILE)
    }

    /// The volume's metadata file.
    pub fn volume_meta_path(&self, id: &str) -> PathBuf {
        self.path
            .join(META_DIR)
            .join("volumes")
            .join(format!("{id}.json"))
    }

    /// The snapshot's metadata file.
    pub fn snapshot_meta_path(&self, id: &str) -> PathBuf {
        self.path
            .join(META_DIR)
            .join("snapshots")
            .join(format!("{id}.json"))
    }

    /// The group snapshot's metadata file.
    pub fn group_meta_path(&self, id: &str) -> PathBuf {
        self.path
            .join(META_DIR)
            .join("groups")
            .join(format!("{id}.json"))
    }

    /// Reads a group snapshot's metadata.
    pub fn group(&self, id: &str) -> Result<Option<GroupSnapshotMeta>> {
        read_json(&self.group_meta_path(id))
    }

    /// All group snapshot metadata in the pool (any state).
    pub fn groups(&self) -> Result<Vec<GroupSnapshotMeta>> {
        self.list_json("groups")
    }

    /// The snapshot's data directory.
    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.path.join(META_DIR).join("snapshot-data").join(id)
    }

    /// Reads a volume's metadata.
    pub fn volume(&self, id: &str) -> Result<Option<VolumeMeta>> {
        read_json(&self.volume_meta_path(id))
    }

    /// Reads a snapshot's metadata.
    pub fn snapshot(&self, id: &str) -> Result<Option<SnapshotMeta>> {
        read_json(&self.snapshot_meta_path(id))
    }

    fn list_json<T: serde::de::DeserializeOwned>(&self, sub: &str) -> Result<Vec<T>> {
        let dir = self.path.join(META_DIR).join(sub);
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).ctx(|| format!("list {}", dir.display()))? {
            let entry = entry.ctx(|| format!("list {}", dir.display()))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            // temp files of atomic writes (`.<name>.tmp`) are some request's work in progress
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            if let Some(m) = read_json(&entry.path())? {
                out.push(m);
            }
        }
        Ok(out)
    }

    /// All volume metadata in the pool (any state).
    pub fn volumes(&self) -> Result<Vec<VolumeMeta>> {
        self.list_json("volumes")
    }

    /// All snapshot metadata in the pool (any state).
    pub fn snapshots(&self) -> Result<Vec<SnapshotMeta>> {
        self.list_json("snapshots")
    }

    /// Bytes allocated to a volume (its project's usage, or its tree's blocks).
    pub fn volume_usage(&self, m: &VolumeMeta) -> Result<(u64, u64)> {
        if let (QuotaInForce::Project, Some(pid)) = (self.quota, m.project_id) {
            let u = quota::usage(&self.path, pid)
                .ctx(|| format!("read project quota {pid} of volume {}", m.id))?;
            return Ok((u.bytes, u.inodes));
        }
        match fsinfo::tree_usage(&self.volume_dir(&m.id)) {
            Ok(u) => Ok(u),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((0, 0)),
            Err(e) => Err(Error::io(format!("measure volume {}", m.id), e)),
        }
    }

    /// Whether the filesystem still charges blocks or inodes to project `id` (an unreadable
    /// quota counts as free: the volume's own quota calls will report the problem).
    pub fn project_charged(&self, id: u32) -> bool {
        self.quota == QuotaInForce::Project
            && quota::usage(&self.path, id).is_ok_and(|u| u.bytes > 0 || u.inodes > 0)
    }

    /// Whether a volume's size is bounded (it can never allocate more than its capacity).
    pub fn is_bounded(&self, m: &VolumeMeta) -> bool {
        m.capacity_bytes > 0
            && ((self.enforces_sizes() && m.size_enforced()) || m.mode == VolumeMode::Block)
    }

    /// Whether filesystem volumes' sizes are enforced on this pool.
    pub fn enforces_sizes(&self) -> bool {
        self.quota != QuotaInForce::None
    }

    /// Creates a volume's directory: a subvolume on a qgroup pool, tagged with its project on a
    /// project-quota pool.
    pub fn make_volume_dir(&self, m: &VolumeMeta) -> Result<PathBuf> {
        let dir = self.volume_dir(&m.id);
        match self.quota {
            QuotaInForce::BtrfsQgroup => btrfs::create_subvolume(&dir)
                .ctx(|| format!("create subvolume {}", dir.display()))?,
            _ => std::fs::create_dir(&dir).ctx(|| format!("create {}", dir.display()))?,
        }
        if let (QuotaInForce::Project, Some(pid)) = (self.quota, m.project_id) {
            quota::set_project(&dir, pid)
                .ctx(|| format!("set project {pid} on {}", dir.display()))?;
        }
        Ok(dir)
    }

    /// Sets (0: clears) the size limit of a volume where the pool enforces sizes. Block volumes
    /// are bounded by their file, so their limit only ever accounts; a volume whose enforcement
    /// is turned off ([`VolumeMeta::size_enforced`]) gets none.
    pub fn apply_limit(&self, m: &VolumeMeta, bytes: u64) -> Result<()> {
        let bytes = if m.mode == VolumeMode::Block || !m.size_enforced() {
            0
        } else {
            bytes
        };
        match (self.quota, m.project_id) {
            (QuotaInForce::Project, Some(pid)) => quota::set_limit(&self.path, pid, bytes)
                .ctx(|| format!("set quota of volume {} (project {pid})", m.id)),
            (QuotaInForce::BtrfsQgroup, _) => btrfs::set_limit(&self.volume_dir(&m.id), bytes)
                .ctx(|| format!("set qgroup limit of volume {}", m.id)),
            _ => Ok(()),
        }
    }

    /// What the pool can still promise: free space minus what bounded volumes may still grow into.
    pub fn capacity(&self) -> Result<PoolCapacity> {
        let st = fsinfo::stats(&self.path).ctx(|| format!("statfs {}", self.path.display()))?;
        let mut reserved = Vec::new();
        for m in self.volumes()? {
            if self.is_bounded(&m) {
                let (used, _) = self.volume_usage(&m)?;
                reserved.push((m.capacity_bytes, used));
            }
        }
        Ok(PoolCapacity {
            total_bytes: st.total_bytes,
            free_bytes: st.avail_bytes,
            available_bytes: promisable(st.avail_bytes, &reserved),
        })
    }

    /// Whether `path` lies inside this pool.
    pub fn contains(&self, path: &Path) -> bool {
        path.starts_with(&self.path)
    }
}

/// Decides the enforcement a pool gets from its configured mode and what its filesystem offers.
fn quota_in_force(
    name: &str,
    path: &Path,
    fs: fsinfo::FsKind,
    mode: QuotaMode,
) -> Result<QuotaInForce> {
    let is_btrfs = fs == fsinfo::FsKind::Btrfs;
    let project = || quota::project_quota_enforced(path).unwrap_or(false);
    let qgroups = || is_btrfs && btrfs::quota_enabled(path).unwrap_or(false);
    Ok(match mode {
        QuotaMode::None => QuotaInForce::None,
        QuotaMode::Auto if project() => QuotaInForce::Project,
        QuotaMode::Auto if qgroups() => QuotaInForce::BtrfsQgroup,
        QuotaMode::Auto => QuotaInForce::None,
        QuotaMode::Project if project() => QuotaInForce::Project,
        QuotaMode::Project => {
            return Err(Error::Config(format!(
                "pool {name} asks for project quotas but {} ({}) does not enforce them \
                 (XFS: mount with prjquota; ext4: mkfs -O quota,project and mount with prjquota)",
                path.display(),
                fs.name()
            )));
        }
        QuotaMode::Btrfs if !is_btrfs => {
            return Err(Error::Config(format!(
                "pool {name} asks for btrfs qgroups but {} is on {}",
                path.display(),
                fs.name()
            )));
        }
        QuotaMode::Btrfs => {
            if !qgroups() {
                btrfs::enable_quota(path).ctx(|| format!("enable btrfs quotas for pool {name}"))?;
                tracing::info!(pool = %name, "btrfs qgroups enabled");
            }
            QuotaInForce::BtrfsQgroup
        }
    })
}

/// A pool's capacity figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCapacity {
    /// Filesystem size.
    pub total_bytes: u64,
    /// Free bytes on the filesystem.
    pub free_bytes: u64,
    /// Bytes that can still be promised to new volumes.
    pub available_bytes: u64,
}

/// Free space minus what each bounded volume `(capacity, used)` may still grow into.
pub fn promisable(free: u64, bounded: &[(u64, u64)]) -> u64 {
    let growth: u64 = bounded
        .iter()
        .map(|(cap, used)| cap.saturating_sub(*used))
        .fold(0u64, u64::saturating_add);
    free.saturating_sub(growth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promisable_subtracts_unused_reservations() {
        assert_eq!(promisable(100, &[]), 100);
        assert_eq!(promisable(100, &[(30, 10), (20, 0)]), 60);
        // a volume using more than its capacity (metadata overhead) reserves nothing more
        assert_eq!(promisable(100, &[(10, 15)]), 100);
        assert_eq!(promisable(10, &[(30, 0)]), 0);
        assert_eq!(promisable(u64::MAX, &[(u64::MAX, 0), (u64::MAX, 0)]), 0);
    }

    #[test]
    fn opens_plain_directory_pool_without_quota() {
        let d = tempfile::tempdir().unwrap();
        let cfg = PoolConfig {
            mounted: false,
            name: "p".into(),
            path: d.path().join("pool"),
            quota: QuotaMode::Auto,
        };
        let p = Pool::open(&cfg).unwrap();
        assert!(p.path.join(".quarry/volumes").is_dir());
        // tmp dirs in CI are not quota-enabled
        if p.quota == QuotaInForce::None {
            let strict = PoolConfig {
                mounted: false,
                quota: QuotaMode::Project,
                ..cfg
            };
            assert!(Pool::open(&strict).is_err());
        }
    }
}
