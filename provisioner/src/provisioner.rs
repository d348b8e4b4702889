//! The provisioner: volumes and snapshots over a node's pools (the controller side).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::PoolConfig;
use crate::error::{Error, IoContext, Result};
use crate::guard::{OpGuard, OpGuards};
use crate::meta::{
    ContentSource, CopyMethod, QUOTA_PARAMETER, SnapshotMeta, State, VolumeMeta, VolumeMode,
    remove_file, sync_dir, write_json,
};
use crate::page::{Page, paginate};
use crate::pool::{Pool, PoolCapacity, QuotaInForce};
use crate::sys::{copy, loopdev, quota};

/// First project quota id handed out to volumes.
pub const FIRST_PROJECT_ID: u32 = 100_000;
/// Size given to block volumes created without a capacity.
pub const DEFAULT_BLOCK_SIZE: u64 = 1 << 30;

/// A requested capacity: at least `required`, at most `limit` (0 = no bound).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapacityRange {
    /// Minimum bytes (0 = unspecified).
    pub required: u64,
    /// Maximum bytes (0 = unspecified).
    pub limit: u64,
}

impl CapacityRange {
    /// Whether `bytes` satisfies the range.
    pub fn accepts(&self, bytes: u64) -> bool {
        bytes >= self.required && (self.limit == 0 || bytes <= self.limit)
    }
}

/// A CreateVolume request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateVolume {
    /// Volume name, used as its id (as HPP does).
    pub name: String,
    /// Requested size.
    pub capacity: CapacityRange,
    /// Filesystem or block.
    pub mode: VolumeMode,
    /// Pool name (`storagePool` parameter); `None` selects the first pool.
    pub pool: Option<String>,
    /// Initial content.
    pub source: Option<ContentSource>,
    /// StorageClass parameters, recorded.
    pub parameters: BTreeMap<String, String>,
    /// Created for an ephemeral inline volume.
    pub ephemeral: bool,
}

/// The hostpath provisioner for one node.
#[derive(Debug)]
pub struct Provisioner {
    pools: Vec<PoolSlot>,
    /// Held while a mounted pool opens (and recovers), so it is used only once recovered.
    opening: Mutex<()>,
    guards: OpGuards,
    project_alloc: Mutex<()>,
}

/// Whether `path` is a mount point (an error reading the mount table counts as not mounted).
fn is_mounted(path: &std::path::Path) -> bool {
    crate::sys::mount::is_mount_point(path).unwrap_or(false)
}

/// A configured pool: open from the start, or (a mounted pool) once its mount is there.
#[derive(Debug)]
struct PoolSlot {
    cfg: PoolConfig,
    open: OnceLock<Pool>,
}

pub(crate) fn now() -> (u64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs(), d.subsec_nanos())
}

/// Checks that a volume or snapshot name can be used as a directory name.
pub fn validate_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument(format!("{what} name is required")));
    }
    if name.len() > 200
        || name.starts_with('.')
        || name
            .chars()
            .any(|c| c == '/' || c == '\0' || c.is_control())
    {
        return Err(Error::InvalidArgument(format!(
            "{what} name {name:?} is not usable as a directory name"
        )));
    }
    Ok(())
}

pub(crate) fn vol_key(id: &str) -> String {
    format!("volume/{id}")
}
pub(crate) fn snap_key(id: &str) -> String {
    format!("snapshot/{id}")
}

impl Provisioner {
    /// Opens every pool and recovers interrupted operations. A mounted pool whose mount is not
    /// there yet opens when it is first needed after it appears.
    pub fn open(pools: &[PoolConfig]) -> Result<Provisioner> {
        crate::config::validate(pools)?;
        let mut slots = Vec::new();
        for cfg in pools {
            let open = OnceLock::new();
            if !cfg.mounted || is_mounted(&cfg.path) {
                let _ = open.set(Pool::open(cfg)?);
            } else {
                tracing::info!(pool = %cfg.name, path = %cfg.path.display(), "storage pool waits for its mount");
            }
            slots.push(PoolSlot {
                cfg: cfg.clone(),
                open,
            });
        }
        let p = Provisioner {
            pools: slots,
            opening: Mutex::new(()),
            guards: OpGuards::default(),
            project_alloc: Mutex::new(()),
        };
        p.recover()?;
        Ok(p)
    }

    /// The open pools, in configuration order (the first configured is the default).
    pub fn pools(&self) -> Vec<&Pool> {
        self.open_pools().collect()
    }

    fn open_pools(&self) -> impl Iterator<Item = &Pool> {
        self.pools.iter().filter_map(|s| s.open.get())
    }

    /// The pool of `slot`, opened (and recovered) now if it is a mounted pool that just got its
    /// mount; a mounted pool is usable only while its mount is there (else writes would land on
    /// the directory under it).
    fn slot_pool<'a>(&'a self, slot: &'a PoolSlot) -> Result<&'a Pool> {
        let mounted = || !slot.cfg.mounted || is_mounted(&slot.cfg.path);
        if let Some(p) = slot.open.get() {
            return if mounted() {
                Ok(p)
            } else {
                Err(Error::PoolNotMounted(slot.cfg.name.clone()))
            };
        }
        if !mounted() {
            return Err(Error::PoolNotMounted(slot.cfg.name.clone()));
        }
        let _opening = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = slot.open.get() {
            return Ok(p);
        }
        let pool = Pool::open(&slot.cfg)?;
        self.recover_pool(&pool)?;
        Ok(slot.open.get_or_init(|| pool))
    }

    /// The operation guards (shared with the node side).
    pub fn guards(&self) -> &OpGuards {
        &self.guards
    }

    /// The pool named `name`, or the default pool for `None` / an empty name.
    pub fn pool(&self, name: Option<&str>) -> Result<&Pool> {
        let slot = match name {
            None | Some("") => &self.pools[0],
            Some(n) => self
                .pools
                .iter()
                .find(|s| s.cfg.name == n)
                .ok_or_else(|| Error::PoolNotFound(n.to_string()))?,
        };
        self.slot_pool(slot)
    }

    /// Looks for an object in every pool; a miss while a pool waits for its mount is not a
    /// NotFound (the object may be there): deleting it must be retried, not taken as done.
    fn find_in_pools<T>(
        &self,
        mut find: impl FnMut(&Pool) -> Result<Option<T>>,
    ) -> Result<Option<(&Pool, T)>> {
        let mut waiting = None;
        for slot in &self.pools {
            match self.slot_pool(slot) {
                Ok(p) => {
                    if let Some(found) = find(p)? {
                        return Ok(Some((p, found)));
                    }
                }
                Err(e @ Error::PoolNotMounted(_)) => waiting = Some(e),
                Err(e) => return Err(e),
            }
        }
        match waiting {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Takes the guard of a volume.
    pub fn lock_volume(&self, id: &str) -> Result<OpGuard> {
        self.guards.try_lock([vol_key(id)])
    }

    /// Finds a volume in any pool, in any state.
    pub fn find_volume(&self, id: &str) -> Result<Option<(&Pool, VolumeMeta)>> {
        if validate_name("volume", id).is_err() {
            return Ok(None);
        }
        self.find_in_pools(|p| p.volume(id))
    }

    /// A ready volume, or NotFound.
    pub fn volume(&self, id: &str) -> Result<(&Pool, VolumeMeta)> {
        match self.find_volume(id)? {
            Some((p, m)) if m.state == State::Ready => Ok((p, m)),
            _ => Err(Error::VolumeNotFound(id.to_string())),
        }
    }

    pub(crate) fn find_snapshot(&self, id: &str) -> Result<Option<(&Pool, SnapshotMeta)>> {
        if validate_name("snapshot", id).is_err() {
            return Ok(None);
        }
        self.find_in_pools(|p| p.snapshot(id))
    }

    /// A ready snapshot, or NotFound.
    pub fn snapshot(&self, id: &str) -> Result<(&Pool, SnapshotMeta)> {
        match self.find_snapshot(id)? {
            Some((p, m)) if m.state == State::Ready => Ok((p, m)),
            _ => Err(Error::SnapshotNotFound(id.to_string())),
        }
    }

    /// Finishes or rolls back operations a crash interrupted, re-applies quota limits, and
    /// releases loop devices backed by pool files that nothing has mounted any more.
    pub fn recover(&self) -> Result<()> {
        for pool in self.open_pools() {
            self.recover_pool(pool)?;
        }
        self.release_stale_loops();
        Ok(())
    }

    fn recover_pool(&self, pool: &Pool) -> Result<()> {
        {
            self.adopt_unknown_volumes(pool)?;
            for m in pool.volumes()? {
                match m.state {
                    State::Creating | State::Deleting => {
                        tracing::warn!(volume = %m.id, state = ?m.state, "removing volume left by an interrupted operation");
                        self.remove_volume_data(pool, &m)?;
                    }
                    State::Ready => self.reconcile_volume(pool, m)?,
                }
            }
            for g in pool.groups()? {
                if g.state != State::Ready {
                    tracing::warn!(group = %g.id, state = ?g.state, "removing group snapshot left by an interrupted operation");
                    self.remove_group(pool, &g)?;
                }
            }
            for s in pool.snapshots()? {
                if s.state != State::Ready {
                    tracing::warn!(snapshot = %s.id, state = ?s.state, "removing snapshot left by an interrupted operation");
                    self.remove_snapshot_data(pool, &s)?;
                }
            }
        }
        Ok(())
    }

    /// Takes over the volume directories of a pool that another driver (HPP) made: a directory
    /// `<pool>/<name>` with no metadata becomes a ready filesystem volume named `<name>`, so the
    /// PersistentVolumes that point at it keep working (publish, stats, expand, delete).
    fn adopt_unknown_volumes(&self, pool: &Pool) -> Result<()> {
        let entries =
            std::fs::read_dir(&pool.path).ctx(|| format!("list {}", pool.path.display()))?;
        for entry in entries {
            let entry = entry.ctx(|| format!("list {}", pool.path.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if !is_dir || name == "lost+found" || validate_name("volume", &name).is_err() {
                continue;
            }
            if pool.volume(&name)?.is_some() {
                continue;
            }
            let meta = VolumeMeta {
                id: name.clone(),
                pool: pool.name.clone(),
                capacity_bytes: 0,
                mode: VolumeMode::Filesystem,
                state: State::Ready,
                project_id: None,
                source: None,
                ephemeral: false,
                parameters: BTreeMap::new(),
                created_unix: entry
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs()),
                adopted: true,
                exclusive_target: None,
            };
            write_json(&pool.volume_meta_path(&name), &meta)?;
            tracing::warn!(volume = %name, pool = %pool.name, "adopted a volume directory without metadata (made by HPP?); its size is unknown until expanded");
        }
        Ok(())
    }

    fn reconcile_volume(&self, pool: &Pool, mut m: VolumeMeta) -> Result<()> {
        if m.mode == VolumeMode::Block {
            // an expansion that grew the file but crashed before recording it
            if let Ok(md) = std::fs::metadata(pool.block_file(&m.id))
                && md.len() > m.capacity_bytes
            {
                m.capacity_bytes = md.len();
                write_json(&pool.volume_meta_path(&m.id), &m)?;
            }
        } else {
            pool.apply_limit(&m, m.capacity_bytes)?;
        }
        Ok(())
    }

    /// Detaches loop devices whose backing file is inside a pool and that no mount uses.
    pub fn release_stale_loops(&self) {
        let Ok(attached) = loopdev::list() else {
            return;
        };
        let mounts = crate::sys::mount::mounts().unwrap_or_default();
        for a in attached {
            if !self.open_pools().any(|p| p.contains(&a.backing)) {
                continue;
            }
            let name = a.dev.file_name().unwrap_or_default().to_string_lossy();
            let root = format!("/{name}");
            let in_use = mounts.iter().any(|m| m.root == root && m.source != "none")
                || mounts.iter().any(|m| m.source == a.dev.to_string_lossy());
            if in_use {
                continue;
            }
            match loopdev::detach(&a.dev) {
                Ok(()) => {
                    tracing::warn!(dev = %a.dev.display(), backing = %a.backing.display(), "released a stale loop device")
                }
                Err(e) => {
                    tracing::error!(dev = %a.dev.display(), error = %e, "cannot release stale loop device")
                }
            }
        }
    }

    fn remove_volume_data(&self, pool: &Pool, m: &VolumeMeta) -> Result<()> {
        let mut m = m.clone();
        if m.state != State::Deleting {
            m.state = State::Deleting;
            write_json(&pool.volume_meta_path(&m.id), &m)?;
        }
        let dir = pool.volume_dir(&m.id);
        if m.mode == VolumeMode::Block
            && let Ok(f) = std::fs::canonicalize(pool.block_file(&m.id))
        {
            for dev in loopdev::find_by_backing(&f).unwrap_or_default() {
                let _ = loopdev::detach(&dev);
            }
        }
        crate::crash::point("delete-volume.marked");
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("remove {}", dir.display()), e)),
        }
        sync_dir(&pool.path)?;
        crate::crash::point("delete-volume.removed");
        if pool.quota == QuotaInForce::Project {
            // project ids are reused once nothing is charged to them; a subvolume's qgroup goes
            // with the subvolume
            pool.apply_limit(&m, 0)?;
        }
        remove_file(&pool.volume_meta_path(&m.id))
    }

    pub(crate) fn remove_snapshot_data(&self, pool: &Pool, s: &SnapshotMeta) -> Result<()> {
        let mut s = s.clone();
        if s.state != State::Deleting {
            s.state = State::Deleting;
            write_json(&pool.snapshot_meta_path(&s.id), &s)?;
        }
        let dir = pool.snapshot_dir(&s.id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("remove {}", dir.display()), e)),
        }
        remove_file(&pool.snapshot_meta_path(&s.id))
    }

    /// A project id for a new volume on `pool`: see [`next_project_id`].
    fn allocate_project_id(&self, pool: &Pool) -> Result<u32> {
        let mut taken = Vec::new();
        for p in self.open_pools() {
            taken.extend(p.volumes()?.into_iter().filter_map(|m| m.project_id));
        }
        Ok(next_project_id(taken, |id| pool.project_charged(id)))
    }

    fn resolve_size(pool: &Pool, req: &CreateVolume, min: u64) -> Result<u64> {
        let CapacityRange { required, limit } = req.capacity;
        if limit > 0 && limit < required {
            return Err(Error::OutOfRange(format!(
                "limit_bytes {limit} is smaller than required_bytes {required}"
            )));
        }
        let mut size = if required > 0 {
            required
        } else if min > 0 {
            // No size asked: a volume made from a snapshot or another volume takes its source's
            // (CSI leaves the choice to the plugin; the source's is what a restore means).
            min
        } else if req.mode == VolumeMode::Block {
            if limit > 0 {
                limit.min(DEFAULT_BLOCK_SIZE)
            } else {
                DEFAULT_BLOCK_SIZE
            }
        } else {
            0
        };
        size = size.max(min);
        if req.mode == VolumeMode::Block {
            size = size.div_ceil(512) * 512;
        }
        if limit > 0 && size > limit {
            return Err(Error::OutOfRange(format!(
                "a {size}-byte volume does not fit limit_bytes {limit}"
            )));
        }
        let cap = pool.capacity()?;
        if size > cap.total_bytes {
            return Err(Error::OutOfRange(format!(
                "{size} bytes is more than pool {} can ever hold ({} bytes)",
                pool.name, cap.total_bytes
            )));
        }
        if (pool.enforces_sizes() || req.mode == VolumeMode::Block) && size > cap.available_bytes {
            return Err(Error::NoSpace(format!(
                "pool {} can promise {} more bytes, {size} requested",
                pool.name, cap.available_bytes
            )));
        }
        Ok(size)
    }

    /// Creates a volume, or returns the existing one when an identical request already made it.
    pub fn create_volume(&self, req: &CreateVolume) -> Result<VolumeMeta> {
        validate_name("volume", &req.name)?;
        let mut keys = vec![vol_key(&req.name)];
        match &req.source {
            Some(ContentSource::Volume(src)) => keys.push(vol_key(src)),
            Some(ContentSource::Snapshot(src)) => keys.push(snap_key(src)),
            None => {}
        }
        let _guard = self.guards.try_lock(keys)?;
        let pool = self.pool(req.pool.as_deref())?;

        // A pool waiting for its mount cannot say whether it has the name: new names are
        // unique (a PV's), so creating in another pool goes on.
        let existing = match self.find_volume(&req.name) {
            Err(Error::PoolNotMounted(_)) => {
                let mut found = None;
                for p in self.open_pools() {
                    if let Some(m) = p.volume(&req.name)? {
                        found = Some((p, m));
                        break;
                    }
                }
                found
            }
            other => other?,
        };
        if let Some((p, m)) = existing {
            if m.state == State::Ready {
                let same = p.name == pool.name
                    && m.mode == req.mode
                    && m.source == req.source
                    && (req.capacity == CapacityRange::default()
                        || req.capacity.accepts(m.capacity_bytes));
                if same {
                    return Ok(m);
                }
                return Err(Error::AlreadyExists(format!(
                    "volume {} exists in pool {} with {} bytes, mode {:?}, source {:?}",
                    m.id, p.name, m.capacity_bytes, m.mode, m.source
                )));
            }
            // an earlier attempt failed half-way: clear it and start again
            self.remove_volume_data(p, &m)?;
        }

        // the content source decides the minimum size and the data to copy
        let (min, copy_from) = match &req.source {
            None => (0, None),
            Some(ContentSource::Snapshot(sid)) => {
                let (sp, s) = self.snapshot(sid)?;
                if s.mode != req.mode {
                    return Err(Error::InvalidArgument(format!(
                        "snapshot {sid} is a {:?} volume snapshot, a {:?} volume was requested",
                        s.mode, req.mode
                    )));
                }
                (s.size_bytes, Some((sp, sp.snapshot_dir(sid))))
            }
            Some(ContentSource::Volume(vid)) => {
                let (vp, v) = self.volume(vid)?;
                if v.mode != req.mode {
                    return Err(Error::InvalidArgument(format!(
                        "volume {vid} is a {:?} volume, a {:?} volume was requested",
                        v.mode, req.mode
                    )));
                }
                (v.capacity_bytes, Some((vp, vp.volume_dir(vid))))
            }
        };
        if min > 0 && req.capacity.limit > 0 && min > req.capacity.limit {
            return Err(Error::OutOfRange(format!(
                "the source holds {min} bytes, more than limit_bytes {}",
                req.capacity.limit
            )));
        }
        let size = Self::resolve_size(pool, req, min)?;
        let dir = pool.volume_dir(&req.name);
        if dir.exists() {
            return Err(Error::AlreadyExists(format!(
                "{} exists but is not a volume of this driver",
                dir.display()
            )));
        }

        let _alloc = self.project_alloc.lock().unwrap_or_else(|p| p.into_inner());
        let project_id = match pool.quota {
            QuotaInForce::Project => Some(self.allocate_project_id(pool)?),
            QuotaInForce::BtrfsQgroup | QuotaInForce::None => None,
        };
        let meta = VolumeMeta {
            id: req.name.clone(),
            pool: pool.name.clone(),
            capacity_bytes: size,
            mode: req.mode,
            state: State::Creating,
            project_id,
            source: req.source.clone(),
            ephemeral: req.ephemeral,
            parameters: req.parameters.clone(),
            created_unix: now().0,
            adopted: false,
            exclusive_target: None,
        };
        write_json(&pool.volume_meta_path(&meta.id), &meta)?;
        drop(_alloc);

        let ready = VolumeMeta {
            state: State::Ready,
            ..meta.clone()
        };
        // everything after the `Creating` record is undone if any step fails, up to and
        // including the `Ready` record itself
        let built = (|| -> Result<()> {
            pool.make_volume_dir(&meta)?;
            pool.apply_limit(&meta, size)?;
            if let Some((src_pool, src_dir)) = &copy_from {
                let method = if src_pool.name == pool.name {
                    pool.copy
                } else {
                    CopyMethod::Sparse
                };
                copy::copy_tree(src_dir, &dir, method)
                    .ctx(|| format!("copy {} to {}", src_dir.display(), dir.display()))?;
                crate::crash::point("create-volume.copied");
            }
            if req.mode == VolumeMode::Block {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(pool.block_file(&req.name))
                    .ctx(|| format!("create block file of {}", req.name))?;
                if f.metadata().map(|m| m.len()).unwrap_or(0) < size {
                    f.set_len(size)
                        .ctx(|| format!("size block file of {}", req.name))?;
                }
                f.sync_all()
                    .ctx(|| format!("fsync block file of {}", req.name))?;
            }
            sync_dir(&dir)?;
            sync_dir(&pool.path)?;
            crate::crash::point("create-volume.built");
            write_json(&pool.volume_meta_path(&meta.id), &ready)
        })();
        if let Err(e) = built {
            tracing::warn!(volume = %meta.id, error = %e, "create failed; rolling back");
            if let Err(e2) = self.remove_volume_data(pool, &meta) {
                tracing::error!(volume = %meta.id, error = %e2, "rollback failed; retried at restart");
            }
            return Err(e);
        }
        tracing::info!(volume = %ready.id, pool = %pool.name, bytes = size, mode = ?ready.mode, "volume created");
        Ok(ready)
    }

    /// Deletes a volume; deleting a missing volume succeeds.
    pub fn delete_volume(&self, id: &str) -> Result<()> {
        if id.is_empty() {
            return Err(Error::InvalidArgument("volume id is required".into()));
        }
        let _guard = self.lock_volume(id)?;
        let Some((pool, m)) = self.find_volume(id)? else {
            return Ok(());
        };
        if m.state == State::Ready {
            let targets = self.publications(pool, &m)?;
            if let Some(t) = targets.first() {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is still published ({} of {} mount(s); first: {})",
                    match m.mode {
                        VolumeMode::Filesystem => "bind",
                        VolumeMode::Block => "loop device",
                    },
                    targets.len(),
                    t.display()
                )));
            }
        }
        self.remove_volume_data(pool, &m)?;
        tracing::info!(volume = %id, "volume deleted");
        Ok(())
    }

    /// Ready volumes of all pools, one page.
    pub fn list_volumes(&self, token: &str, max_entries: i32) -> Result<Page<VolumeMeta>> {
        let mut all = Vec::new();
        for p in self.open_pools() {
            all.extend(p.volumes()?.into_iter().filter(|m| m.state == State::Ready));
        }
        paginate(all, |m| m.id.as_str(), token, max_entries)
    }

    /// Capacity of a pool (`None` = default pool).
    pub fn capacity(&self, pool: Option<&str>) -> Result<PoolCapacity> {
        self.pool(pool)?.capacity()
    }

    /// Checks a volume's health; `Some(message)` when abnormal.
    pub fn volume_condition(&self, pool: &Pool, m: &VolumeMeta) -> Option<String> {
        let dir = pool.volume_dir(&m.id);
        if !dir.is_dir() {
            return Some(format!("volume directory {} is missing", dir.display()));
        }
        if m.mode == VolumeMode::Block {
            match std::fs::metadata(pool.block_file(&m.id)) {
                Err(e) => return Some(format!("block file is unreadable: {e}")),
                Ok(md) if md.len() < m.capacity_bytes => {
                    return Some(format!(
                        "block file holds {} bytes, {} expected",
                        md.len(),
                        m.capacity_bytes
                    ));
                }
                Ok(_) => {}
            }
        }
        if pool.quota == QuotaInForce::BtrfsQgroup && !crate::sys::btrfs::is_subvolume(&dir) {
            return Some(format!(
                "{} is not a subvolume, so its size is not enforced",
                dir.display()
            ));
        }
        if let (QuotaInForce::Project, Some(pid)) = (pool.quota, m.project_id) {
            match quota::get_project(&dir) {
                Ok(got) if got == pid => {}
                Ok(got) => return Some(format!("directory has project {got}, {pid} expected")),
                Err(e) => return Some(format!("cannot read project id: {e}")),
            }
        }
        None
    }

    /// Grows a volume to at least `range.required`. Returns the new capacity and whether the
    /// node must act (block volumes: refresh attached loop devices).
    pub fn expand_volume(&self, id: &str, range: CapacityRange) -> Result<(u64, bool)> {
        if id.is_empty() {
            return Err(Error::InvalidArgument("volume id is required".into()));
        }
        let _guard = self.lock_volume(id)?;
        let (pool, mut m) = self.volume(id)?;
        if range.limit > 0 && range.limit < range.required {
            return Err(Error::OutOfRange(format!(
                "limit_bytes {} is smaller than required_bytes {}",
                range.limit, range.required
            )));
        }
        let mut want = range.required;
        if m.mode == VolumeMode::Block {
            want = want.div_ceil(512) * 512;
        }
        let node = m.mode == VolumeMode::Block;
        if want <= m.capacity_bytes {
            return Ok((m.capacity_bytes, node));
        }
        if range.limit > 0 && want > range.limit {
            return Err(Error::OutOfRange(format!(
                "{want} bytes exceeds limit_bytes {}",
                range.limit
            )));
        }
        let cap = pool.capacity()?;
        if want > cap.total_bytes {
            return Err(Error::OutOfRange(format!(
                "{want} bytes is more than pool {} can ever hold",
                pool.name
            )));
        }
        let growth = want - m.capacity_bytes;
        if pool.is_bounded(&m) && growth > cap.available_bytes {
            return Err(Error::NoSpace(format!(
                "pool {} can promise {} more bytes, {growth} needed",
                pool.name, cap.available_bytes
            )));
        }
        if m.mode == VolumeMode::Block {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(pool.block_file(id))
                .ctx(|| format!("open block file of {id}"))?;
            f.set_len(want).ctx(|| format!("grow block file of {id}"))?;
            f.sync_all().ctx(|| format!("fsync block file of {id}"))?;
            crate::crash::point("expand-volume.grown");
        } else {
            pool.apply_limit(&m, want)?;
        }
        m.capacity_bytes = want;
        write_json(&pool.volume_meta_path(id), &m)?;
        tracing::info!(volume = %id, bytes = want, "volume expanded");
        Ok((want, node))
    }

    /// Checks mutable parameters (ControllerModifyVolume, or CreateVolume's
    /// `mutable_parameters`): only [`QUOTA_PARAMETER`] (`enforced` or `none`) is known.
    pub fn check_mutable_parameters(params: &BTreeMap<String, String>) -> Result<()> {
        for (k, v) in params {
            match (k.as_str(), v.as_str()) {
                (QUOTA_PARAMETER, "enforced" | "none") => {}
                (QUOTA_PARAMETER, other) => {
                    return Err(Error::InvalidArgument(format!(
                        "mutable parameter {QUOTA_PARAMETER}={other:?}: enforced or none expected"
                    )));
                }
                (other, _) => {
                    return Err(Error::InvalidArgument(format!(
                        "unknown mutable parameter {other:?} (known: {QUOTA_PARAMETER})"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Applies mutable parameters to a volume (ControllerModifyVolume): `quota: none` lifts a
    /// filesystem volume's size limit, `quota: enforced` puts it back. Idempotent.
    pub fn modify_volume(&self, id: &str, params: &BTreeMap<String, String>) -> Result<VolumeMeta> {
        if id.is_empty() {
            return Err(Error::InvalidArgument("volume id is required".into()));
        }
        Self::check_mutable_parameters(params)?;
        let _guard = self.lock_volume(id)?;
        let (pool, mut m) = self.volume(id)?;
        if m.mode == VolumeMode::Block
            && params.get(QUOTA_PARAMETER).map(String::as_str) == Some("none")
        {
            return Err(Error::InvalidArgument(format!(
                "volume {id} is a block volume: its file bounds it, {QUOTA_PARAMETER}=none cannot apply"
            )));
        }
        m.parameters
            .extend(params.iter().map(|(k, v)| (k.clone(), v.clone())));
        pool.apply_limit(&m, m.capacity_bytes)?;
        write_json(&pool.volume_meta_path(id), &m)?;
        tracing::info!(volume = %id, parameters = ?params, "volume modified");
        Ok(m)
    }

    /// Snapshots a volume (a reflink or sparse copy in the volume's pool). Idempotent by name.
    pub fn create_snapshot(&self, name: &str, source_volume: &str) -> Result<SnapshotMeta> {
        validate_name("snapshot", name)?;
        if source_volume.is_empty() {
            return Err(Error::InvalidArgument(
                "source_volume_id is required".into(),
            ));
        }
        let _guard = self
            .guards
            .try_lock([snap_key(name), vol_key(source_volume)])?;
        if let Some((p, s)) = self.find_snapshot(name)? {
            if s.state == State::Ready {
                if s.source_volume_id == source_volume && s.group.is_none() {
                    return Ok(s);
                }
                return Err(Error::AlreadyExists(format!(
                    "snapshot {name} exists for volume {}",
                    s.source_volume_id
                )));
            }
            self.remove_snapshot_data(p, &s)?;
        }
        let (pool, v) = self.volume(source_volume)?;
        self.take_snapshot(name, pool, &v, None)
    }

    /// Copies volume `v` of `pool` into the new snapshot `name` (a member of `group`, if any).
    /// The caller holds the guards of both; a failed copy leaves nothing.
    pub(crate) fn take_snapshot(
        &self,
        name: &str,
        pool: &Pool,
        v: &VolumeMeta,
        group: Option<&str>,
    ) -> Result<SnapshotMeta> {
        let (secs, nanos) = now();
        let mut s = SnapshotMeta {
            id: name.to_string(),
            source_volume_id: v.id.clone(),
            pool: pool.name.clone(),
            size_bytes: v.capacity_bytes,
            mode: v.mode,
            state: State::Creating,
            copy: pool.copy,
            created_unix: secs,
            created_nanos: nanos,
            group: group.map(str::to_string),
        };
        write_json(&pool.snapshot_meta_path(name), &s)?;
        let dir = pool.snapshot_dir(name);
        let made = (|| -> Result<()> {
            std::fs::create_dir(&dir).ctx(|| format!("create {}", dir.display()))?;
            copy::copy_tree(&pool.volume_dir(&v.id), &dir, pool.copy)
                .ctx(|| format!("copy volume {} to snapshot {name}", v.id))?;
            sync_dir(dir.parent().unwrap_or(&pool.path))?;
            crate::crash::point("create-snapshot.copied");
            s.state = State::Ready;
            write_json(&pool.snapshot_meta_path(name), &s)
        })();
        if let Err(e) = made {
            let _ = self.remove_snapshot_data(pool, &s);
            return Err(e);
        }
        tracing::info!(snapshot = %name, volume = %v.id, copy = ?pool.copy, group = ?group, "snapshot created");
        Ok(s)
    }

    /// Deletes a snapshot; a missing snapshot succeeds.
    pub fn delete_snapshot(&self, id: &str) -> Result<()> {
        if id.is_empty() {
            return Err(Error::InvalidArgument("snapshot id is required".into()));
        }
        let _guard = self.guards.try_lock([snap_key(id)])?;
        if let Some((p, s)) = self.find_snapshot(id)? {
            if let Some(g) = &s.group
                && s.state == State::Ready
            {
                return Err(Error::FailedPrecondition(format!(
                    "snapshot {id} belongs to group snapshot {g}: delete the group"
                )));
            }
            self.remove_snapshot_data(p, &s)?;
            tracing::info!(snapshot = %id, "snapshot deleted");
        }
        Ok(())
    }

    /// Ready snapshots, optionally filtered, one page.
    pub fn list_snapshots(
        &self,
        snapshot_id: &str,
        source_volume_id: &str,
        token: &str,
        max_entries: i32,
    ) -> Result<Page<SnapshotMeta>> {
        let mut all = Vec::new();
        for p in self.open_pools() {
            all.extend(p.snapshots()?.into_iter().filter(|s| {
                s.state == State::Ready
                    && (snapshot_id.is_empty() || s.id == snapshot_id)
                    && (source_volume_id.is_empty() || s.source_volume_id == source_volume_id)
            }));
        }
        paginate(all, |s| s.id.as_str(), token, max_entries)
    }

    /// The directory of a ready volume (what is published), and its block file for block volumes.
    pub fn volume_paths(&self, id: &str) -> Result<(VolumeMeta, PathBuf, PathBuf)> {
        let (pool, m) = self.volume(id)?;
        Ok((m, pool.volume_dir(id), pool.block_file(id)))
    }
}

/// The id after the highest `taken` one (ids of deleted volumes on top are reused), skipping ids
/// the filesystem still charges usage to: files of a deleted volume that a process still holds
/// open, or that XFS has not yet inactivated (it frees unlinked inodes in the background). A new
/// volume must start empty, or its first writes fail against its predecessor's leftovers.
fn next_project_id(taken: impl IntoIterator<Item = u32>, charged: impl Fn(u32) -> bool) -> u32 {
    let highest = taken
        .into_iter()
        .max()
        .unwrap_or(0)
        .max(FIRST_PROJECT_ID - 1);
    (highest + 1..=u32::MAX)
        .find(|&id| !charged(id))
        .unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_ids_follow_the_highest_and_skip_charged_ones() {
        let never = |_| false;
        assert_eq!(next_project_id([], never), FIRST_PROJECT_ID);
        assert_eq!(next_project_id([5], never), FIRST_PROJECT_ID);
        assert_eq!(
            next_project_id([FIRST_PROJECT_ID + 3, FIRST_PROJECT_ID], never),
            FIRST_PROJECT_ID + 4
        );
        // the top id's volume was deleted but its files still hold blocks: skip past them
        let charged = |id| id == FIRST_PROJECT_ID + 1 || id == FIRST_PROJECT_ID + 2;
        assert_eq!(
            next_project_id([FIRST_PROJECT_ID], charged),
            FIRST_PROJECT_ID + 3
        );
    }
}
