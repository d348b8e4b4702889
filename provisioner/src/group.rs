//! Group snapshots: snapshots of several volumes taken together (a VM's disks), as one object
//! that is created, looked up and deleted as a whole.
//!
//! What "consistent" means here: the member copies are taken one after another, but with every
//! member's guard held (no driver operation such as expand, publish or delete runs on any of
//! them meanwhile) and after `syncfs` of each member's filesystem, so every write a workload
//! completed before the call is in every copy. Each member's copy is a reflink (`FICLONE`, per
//! file: a block volume's one file is copied at one instant) or a sparse copy. Writes made
//! *during* the call may be in some copies and not others: for a crash-consistent image of a
//! running VM its guest is frozen first (KubeVirt freezes it through the guest agent before a
//! VirtualMachineSnapshot), as for any group snapshot of volumes the driver cannot pause.

use std::collections::HashSet;

use crate::error::{Error, IoContext, Result};
use crate::meta::{GroupSnapshotMeta, SnapshotMeta, State, VolumeMeta, remove_file, write_json};
use crate::pool::Pool;
use crate::provisioner::{Provisioner, now, snap_key, validate_name, vol_key};

fn group_key(id: &str) -> String {
    format!("group/{id}")
}

/// The id of the member snapshot of `volume` in group `group`.
pub fn member_id(group: &str, volume: &str) -> String {
    format!("{group}-{volume}")
}

impl Provisioner {
    /// A group snapshot in any pool, in any state.
    fn find_group(&self, id: &str) -> Result<Option<(&Pool, GroupSnapshotMeta)>> {
        if validate_name("group snapshot", id).is_err() {
            return Ok(None);
        }
        for p in self.pools() {
            if let Some(g) = p.group(id)? {
                return Ok(Some((p, g)));
            }
        }
        Ok(None)
    }

    /// A ready group snapshot and its member snapshots, or NotFound.
    pub fn group_snapshot(&self, id: &str) -> Result<(GroupSnapshotMeta, Vec<SnapshotMeta>)> {
        match self.find_group(id)? {
            Some((_, g)) if g.state == State::Ready => {
                let members = g
                    .snapshot_ids
                    .iter()
                    .map(|s| self.snapshot(s).map(|(_, m)| m))
                    .collect::<Result<Vec<_>>>()?;
                Ok((g, members))
            }
            _ => Err(Error::SnapshotNotFound(format!("group {id}"))),
        }
    }

    /// Snapshots `volumes` together as group `name` (see the module docs for what is
    /// guaranteed). Idempotent by name; the same name for other volumes is ALREADY_EXISTS.
    pub fn create_group_snapshot(
        &self,
        name: &str,
        volumes: &[String],
    ) -> Result<(GroupSnapshotMeta, Vec<SnapshotMeta>)> {
        validate_name("group snapshot", name)?;
        if volumes.is_empty() {
            return Err(Error::InvalidArgument(
                "source_volume_ids are required".into(),
            ));
        }
        let mut seen = HashSet::new();
        if let Some(dup) = volumes.iter().find(|v| !seen.insert(v.as_str())) {
            return Err(Error::InvalidArgument(format!(
                "volume {dup} is named twice in source_volume_ids"
            )));
        }
        let members: Vec<String> = volumes.iter().map(|v| member_id(name, v)).collect();
        for m in &members {
            validate_name("snapshot", m)?;
        }
        let keys = std::iter::once(group_key(name))
            .chain(volumes.iter().map(|v| vol_key(v)))
            .chain(members.iter().map(|m| snap_key(m)));
        let _guard = self.guards().try_lock(keys)?;

        if let Some((p, g)) = self.find_group(name)? {
            if g.state == State::Ready {
                if g.source_volume_ids == volumes {
                    return self.group_snapshot(name);
                }
                return Err(Error::AlreadyExists(format!(
                    "group snapshot {name} exists for volumes {:?}",
                    g.source_volume_ids
                )));
            }
            self.remove_group(p, &g)?;
        }
        let sources = volumes
            .iter()
            .map(|v| self.volume(v))
            .collect::<Result<Vec<(&Pool, VolumeMeta)>>>()?;
        for m in &members {
            if self.find_snapshot(m)?.is_some() {
                return Err(Error::AlreadyExists(format!(
                    "snapshot {m} (the member id for group {name}) exists outside the group"
                )));
            }
        }
        let home = sources[0].0;
        let (secs, nanos) = now();
        let mut group = GroupSnapshotMeta {
            id: name.to_string(),
            source_volume_ids: volumes.to_vec(),
            snapshot_ids: members.clone(),
            state: State::Creating,
            created_unix: secs,
            created_nanos: nanos,
        };
        write_json(&home.group_meta_path(name), &group)?;
        let taken = (|| -> Result<Vec<SnapshotMeta>> {
            let mut synced = HashSet::new();
            for (pool, _) in &sources {
                if synced.insert(pool.name.as_str()) {
                    syncfs(pool)?;
                }
            }
            let mut snaps = Vec::with_capacity(sources.len());
            for ((pool, v), id) in sources.iter().zip(&members) {
                snaps.push(self.take_snapshot(id, pool, v, Some(name))?);
            }
            group.state = State::Ready;
            write_json(&home.group_meta_path(name), &group)?;
            Ok(snaps)
        })();
        match taken {
            Ok(snaps) => {
                tracing::info!(group = %name, volumes = ?volumes, "group snapshot created");
                Ok((group, snaps))
            }
            Err(e) => {
                if let Err(e2) = self.remove_group(home, &group) {
                    tracing::error!(group = %name, error = %e2, "rollback failed; retried at restart");
                }
                Err(e)
            }
        }
    }

    /// Deletes a group snapshot with its members; a missing one succeeds. `snapshot_ids`, when
    /// given, must be the group's members (INVALID_ARGUMENT otherwise).
    pub fn delete_group_snapshot(&self, id: &str, snapshot_ids: &[String]) -> Result<()> {
        if id.is_empty() {
            return Err(Error::InvalidArgument(
                "group_snapshot_id is required".into(),
            ));
        }
        let _guard = self.guards().try_lock([group_key(id)])?;
        let Some((pool, g)) = self.find_group(id)? else {
            return Ok(());
        };
        check_members(&g, snapshot_ids)?;
        self.remove_group(pool, &g)?;
        tracing::info!(group = %id, "group snapshot deleted");
        Ok(())
    }

    /// A ready group snapshot, checked against `snapshot_ids` when they are given.
    pub fn get_group_snapshot(
        &self,
        id: &str,
        snapshot_ids: &[String],
    ) -> Result<(GroupSnapshotMeta, Vec<SnapshotMeta>)> {
        if id.is_empty() {
            return Err(Error::InvalidArgument(
                "group_snapshot_id is required".into(),
            ));
        }
        let found = self.group_snapshot(id)?;
        check_members(&found.0, snapshot_ids)?;
        Ok(found)
    }

    /// Removes a group's member snapshots, then its record (marked deleting first, so a crash
    /// half-way is finished on restart).
    pub(crate) fn remove_group(&self, pool: &Pool, g: &GroupSnapshotMeta) -> Result<()> {
        if g.state != State::Deleting {
            let deleting = GroupSnapshotMeta {
                state: State::Deleting,
                ..g.clone()
            };
            write_json(&pool.group_meta_path(&g.id), &deleting)?;
        }
        for m in &g.snapshot_ids {
            if let Some((p, s)) = self.find_snapshot(m)?
                && s.group.as_deref() == Some(g.id.as_str())
            {
                self.remove_snapshot_data(p, &s)?;
            }
        }
        remove_file(&pool.group_meta_path(&g.id))
    }
}

fn check_members(g: &GroupSnapshotMeta, snapshot_ids: &[String]) -> Result<()> {
    if snapshot_ids.is_empty() {
        return Ok(());
    }
    let given: HashSet<&str> = snapshot_ids.iter().map(String::as_str).collect();
    let have: HashSet<&str> = g.snapshot_ids.iter().map(String::as_str).collect();
    if given != have {
        return Err(Error::InvalidArgument(format!(
            "snapshot_ids {snapshot_ids:?} are not the members of group snapshot {} ({:?})",
            g.id, g.snapshot_ids
        )));
    }
    Ok(())
}

/// Flushes the filesystem holding `pool` (every file of every volume on it) to stable storage.
fn syncfs(pool: &Pool) -> Result<()> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(&pool.path).ctx(|| format!("open {}", pool.path.display()))?;
    // SAFETY: syncfs takes an open descriptor and nothing else.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } < 0 {
        return Err(Error::io(
            format!("syncfs {}", pool.path.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}
