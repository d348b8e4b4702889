//! Volume and snapshot metadata, stored as JSON next to the pool's data and always replaced
//! atomically (write a temp file, fsync, rename, fsync the directory). Temp files are named
//! uniquely per write (`.<name>.<pid>.<n>.tmp`), so concurrent requests never share one; the
//! ones a crash left behind are swept when a pool opens ([`sweep_temp_files`]), never while
//! requests run.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};

/// Whether a volume is a directory (mounted) or a raw block device (a sparse file behind a loop
/// device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeMode {
    /// A directory bind-mounted into the workload.
    Filesystem,
    /// A sparse file exposed through a loop device.
    Block,
}

/// Life-cycle state recorded before and after each multi-step operation, so a restart can tell
/// finished objects from half-made or half-deleted ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Being created: data may be incomplete. Rolled back on restart.
    Creating,
    /// Complete.
    Ready,
    /// Being deleted. Deletion is finished on restart.
    Deleting,
}

/// Where a volume's initial content came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ContentSource {
    /// Restored from a snapshot.
    Snapshot(String),
    /// Cloned from another volume.
    Volume(String),
}

/// How data was copied for a snapshot or clone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyMethod {
    /// FICLONE: extents shared copy-on-write.
    Reflink,
    /// Data extents copied, holes kept (SEEK_DATA / SEEK_HOLE).
    Sparse,
}

/// A volume's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMeta {
    /// Volume id (the CreateVolume name).
    pub id: String,
    /// Pool name.
    pub pool: String,
    /// Requested (and, where enforced, limited) size in bytes.
    pub capacity_bytes: u64,
    /// Filesystem or block.
    pub mode: VolumeMode,
    /// Life-cycle state.
    pub state: State,
    /// Project quota id, when the pool enforces sizes with project quotas.
    #[serde(default)]
    pub project_id: Option<u32>,
    /// Initial content.
    #[serde(default)]
    pub source: Option<ContentSource>,
    /// Created by NodePublishVolume for a CSI ephemeral inline volume.
    #[serde(default)]
    pub ephemeral: bool,
    /// StorageClass parameters given at creation.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Creation time, seconds since the epoch.
    pub created_unix: u64,
    /// Found in the pool without metadata (a volume HPP made) and taken over as it was; its
    /// size was never recorded, so its capacity is 0 (unknown) until it is expanded.
    #[serde(default)]
    pub adopted: bool,
    /// The one target a single-workload access mode (SINGLE_NODE_SINGLE_WRITER,
    /// SINGLE_NODE_READER_ONLY) published the volume at; no other target may publish it while
    /// that one is mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_target: Option<std::path::PathBuf>,
}

/// The mutable parameter (CSI ControllerModifyVolume, Kubernetes VolumeAttributesClass) that
/// turns a filesystem volume's size enforcement off (`none`) or back on (`enforced`, the
/// default) on pools that enforce sizes.
pub const QUOTA_PARAMETER: &str = "quota";

impl VolumeMeta {
    /// Whether the volume's size is to be enforced where its pool can (see [`QUOTA_PARAMETER`]).
    pub fn size_enforced(&self) -> bool {
        self.parameters.get(QUOTA_PARAMETER).map(String::as_str) != Some("none")
    }
}

/// A snapshot's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotMeta {
    /// Snapshot id (the CreateSnapshot name).
    pub id: String,
    /// The volume it was taken from.
    pub source_volume_id: String,
    /// Pool holding the snapshot's data (the source volume's pool).
    pub pool: String,
    /// The source volume's capacity at snapshot time.
    pub size_bytes: u64,
    /// The source volume's mode.
    pub mode: VolumeMode,
    /// Life-cycle state.
    pub state: State,
    /// How the data was copied.
    pub copy: CopyMethod,
    /// Creation time: seconds and nanoseconds since the epoch.
    pub created_unix: u64,
    /// Nanoseconds part of the creation time.
    #[serde(default)]
    pub created_nanos: u32,
    /// The group snapshot it was taken in, if any (it is deleted with its group only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// A group snapshot's metadata: snapshots of several volumes taken together (see
/// [`crate::group`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupSnapshotMeta {
    /// Group snapshot id (the CreateVolumeGroupSnapshot name).
    pub id: String,
    /// The volumes, in request order.
    pub source_volume_ids: Vec<String>,
    /// The member snapshots, one per source volume, in the same order.
    pub snapshot_ids: Vec<String>,
    /// Life-cycle state.
    pub state: State,
    /// Creation time: seconds since the epoch.
    pub created_unix: u64,
    /// Nanoseconds part of the creation time.
    pub created_nanos: u32,
}

/// Writes `value` as JSON to `path` atomically and durably.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let data = serde_json::to_vec_pretty(value).map_err(|e| Error::Metadata {
        path: path.to_path_buf(),
        source: e,
    })?;
    write_atomic(path, &data)
}

/// Replaces `path` with `data`: temp file + fsync + rename + fsync of the directory.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().ok_or_else(|| {
        Error::io(
            "metadata path has no parent",
            std::io::ErrorKind::InvalidInput,
        )
    })?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .ctx(|| format!("create {}", tmp.display()))?;
    f.write_all(data)
        .ctx(|| format!("write {}", tmp.display()))?;
    f.sync_all().ctx(|| format!("fsync {}", tmp.display()))?;
    drop(f);
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(
            format!("rename {} to {}", tmp.display(), path.display()),
            e,
        ));
    }
    sync_dir(dir)
}

/// Removes the temp files of atomic writes a crash interrupted (their rename never happened).
/// Only for a pool being opened: a live request's temp file must not be taken from it.
pub fn sweep_temp_files(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).ctx(|| format!("list {}", dir.display()))? {
        let entry = entry.ctx(|| format!("list {}", dir.display()))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(".tmp") {
            tracing::debug!(file = %entry.path().display(), "removing an interrupted metadata write");
            remove_file(&entry.path())?;
        }
    }
    Ok(())
}

/// Removes a file durably; a missing file is not an error.
pub fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("remove {}", path.display()), e)),
    }
    match path.parent() {
        Some(dir) => sync_dir(dir),
        None => Ok(()),
    }
}

/// fsyncs a directory, making renames and removals in it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(|| format!("fsync directory {}", dir.display()))
}

/// Reads JSON from `path`; `Ok(None)` if it does not exist.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match std::fs::read(path) {
        Ok(data) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(|e| Error::Metadata {
                path: path.to_path_buf(),
                source: e,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> VolumeMeta {
        VolumeMeta {
            adopted: false,
            exclusive_target: None,
            id: "pvc-1".into(),
            pool: "fast".into(),
            capacity_bytes: 1 << 20,
            mode: VolumeMode::Block,
            state: State::Ready,
            project_id: Some(1001),
            source: Some(ContentSource::Snapshot("snap-1".into())),
            ephemeral: false,
            parameters: [("storagePool".to_string(), "fast".to_string())].into(),
            created_unix: 1_700_000_000,
        }
    }

    #[test]
    fn round_trip_and_atomic_replace() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pvc-1.json");
        assert_eq!(read_json::<VolumeMeta>(&p).unwrap(), None);
        let mut m = sample();
        write_json(&p, &m).unwrap();
        assert_eq!(read_json::<VolumeMeta>(&p).unwrap(), Some(m.clone()));
        m.state = State::Deleting;
        write_json(&p, &m).unwrap();
        assert_eq!(
            read_json::<VolumeMeta>(&p).unwrap().unwrap().state,
            State::Deleting
        );
        // no temp file left behind
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("pvc-1.json")]);
        remove_file(&p).unwrap();
        remove_file(&p).unwrap();
    }

    /// Many threads rewriting different files of one directory while others list it: every
    /// write lands (a shared temp name, or a lister sweeping temp files, made renames fail).
    #[test]
    fn concurrent_writes_in_one_directory_all_land() {
        let dir = tempfile::tempdir().unwrap();
        std::thread::scope(|s| {
            for t in 0..8 {
                let d = dir.path();
                s.spawn(move || {
                    for i in 0..50 {
                        let mut m = sample();
                        m.id = format!("v{t}-{i}");
                        write_json(&d.join(format!("{}.json", m.id)), &m).unwrap();
                        write_json(&d.join(format!("{}.json", m.id)), &m).unwrap();
                    }
                });
            }
        });
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 400);
        assert!(names.iter().all(|n| n.ends_with(".json")), "{names:?}");
    }

    #[test]
    fn sweep_removes_only_interrupted_writes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v.json");
        write_json(&p, &sample()).unwrap();
        std::fs::write(dir.path().join(".v.json.1.2.tmp"), b"{").unwrap();
        sweep_temp_files(dir.path()).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("v.json")]);
    }

    #[test]
    fn corrupt_metadata_is_an_internal_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        std::fs::write(&p, b"{not json").unwrap();
        let e = read_json::<VolumeMeta>(&p).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Internal);
    }

    #[test]
    fn old_metadata_without_optional_fields_parses() {
        let m: VolumeMeta = serde_json::from_str(
            r#"{"id":"v","pool":"p","capacityBytes":5,"mode":"filesystem","state":"ready","createdUnix":1}"#,
        )
        .unwrap();
        assert_eq!(m.project_id, None);
        assert!(!m.ephemeral);
    }
}
