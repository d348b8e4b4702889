//! A DataImportCron's decisions, as CDI's controller makes them: when to poll, what its status
//! becomes from the state of the current import, when to create the next import DataVolume (and
//! what it looks like), when a succeeded import is kept as a VolumeSnapshot (the StorageProfile's
//! `snapshot` format, [`super::snapshot`]), the managed DataSource it points at the newest
//! import, and whether it owns that DataSource. The cluster controller
//! ([`super::cron_controller`]) and the local mode (`crate::local::cron`) read the world, call
//! these, and write what they return.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::schedule::{Schedule, ScheduleError};
use super::snapshot::SourceFormat;
use super::version::{NameError, import_name};
use crate::datavolume::status::set_condition;
use api::datavolume::SourcePvc;
use api::golden::{
    DATA_IMPORT_CRON_LABEL, DataImportCron, DataImportCronStatus, DataSource, DataSourceSource,
    DataSourceSpec, ImportStatus, RetentionPolicy, condition,
};
use api::{DataVolume, Phase};

/// CDI's annotations on a DataImportCron and its imports.
pub mod annotation {
    /// The source version found by the last poll (what the next import imports).
    pub const SOURCE_DESIRED_DIGEST: &str = "cdi.kubevirt.io/storage.import.sourceDesiredDigest";
    /// When the schedule fires next (RFC 3339).
    pub const NEXT_CRON_TIME: &str = "cdi.kubevirt.io/storage.import.nextCronTime";
    /// When the source was last polled (RFC 3339).
    pub const LAST_CRON_TIME: &str = "cdi.kubevirt.io/storage.import.lastCronTime";
    /// Import DataVolumes bind at once, without waiting for a consumer.
    pub const IMMEDIATE_BINDING: &str = crate::datavolume::ANN_IMMEDIATE_BINDING;
}

/// The label marking a cron's objects for deletion with it (`retentionPolicy: None`).
pub const CLEANUP_LABEL: &str = "cdi.kubevirt.io/dataImportCron.cleanup";
/// The finalizer that deletes those objects when the cron goes.
pub const FINALIZER: &str = "cdi.kubevirt.io/dataImportCronFinalizer";

/// CDI's condition reasons of a DataImportCron.
pub mod reason {
    /// No poll has found a version yet.
    pub const NO_DIGEST: &str = "NoDigest";
    /// No import runs.
    pub const NO_IMPORT: &str = "NoImport";
    /// The source changed since the last import.
    pub const OUTDATED: &str = "Outdated";
    /// The import DataVolume is scheduled.
    pub const SCHEDULED: &str = "ImportScheduled";
    /// The import runs (also: its snapshot is being taken).
    pub const IN_PROGRESS: &str = "ImportProgressing";
    /// The newest import is of the current version.
    pub const UP_TO_DATE: &str = "UpToDate";
}

/// What became of the import recorded first in `status.currentImports`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportState {
    /// None is recorded, or neither its DataVolume nor its PVC exists.
    None,
    /// Its DataVolume exists, in this phase.
    DataVolume(Option<Phase>),
    /// Only its PVC exists (the DataVolume was garbage-collected after it succeeded).
    Pvc,
    /// Its DataVolume exists, in this phase, and failed: Failed, or retrying after its pod
    /// failed (CDI's Running=False with an error). When a new version arrives it is deleted
    /// and the new version imported (CDI's `deleteErroneousDataVolume`).
    Erroneous(Option<Phase>),
}

/// The state of an import whose DataVolume is `dv`.
pub fn import_state_of(dv: &DataVolume) -> ImportState {
    let st = dv.status.as_ref();
    let phase = st.and_then(|s| s.phase);
    let retrying_after_failure = st.is_some_and(|s| {
        s.restart_count.unwrap_or(0) > 0
            && crate::datavolume::status::find(&s.conditions, DV_RUNNING)
                .is_some_and(|c| c.status == "False")
    });
    if phase == Some(Phase::Failed) || retrying_after_failure {
        ImportState::Erroneous(phase)
    } else {
        ImportState::DataVolume(phase)
    }
}

const DV_RUNNING: &str = api::datavolume::condition::RUNNING;

/// What the controller found of the current import, and the format imports are kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Its DataVolume or PVC.
    pub import: ImportState,
    /// The VolumeSnapshot named as the import: None when there is none, else whether it is
    /// `readyToUse`.
    pub snapshot: Option<bool>,
    /// The format asked for now (the StorageProfile's; `Pvc` when no snapshot can be taken).
    pub format: SourceFormat,
}

/// An import as the PVC format sees it: no snapshot.
impl From<ImportState> for Seen {
    fn from(import: ImportState) -> Self {
        Seen {
            import,
            snapshot: None,
            format: SourceFormat::Pvc,
        }
    }
}

/// CDI's event reason when a cron's managed DataSource is another cron's.
pub const ERR_DATA_SOURCE_ALREADY_MANAGED: &str = "ErrDataSourceAlreadyManaged";

/// The cron named by the `DATA_IMPORT_CRON_LABEL` of the managed DataSource `ds`, when it is
/// not `cron` (the controller reads it for [`already_managed`]).
pub fn labelled_manager<'a>(cron: &DataImportCron, ds: &'a DataSource) -> Option<&'a str> {
    let label = ds.labels().get(DATA_IMPORT_CRON_LABEL)?;
    (!label.is_empty() && *label != cron.name_any()).then_some(label.as_str())
}

/// CDI's `shouldReconcileCron`: the message of the Warning when the managed DataSource `ds` is
/// labelled with another cron, `other`, that exists and manages it too; the cron then does
/// nothing. None: the cron goes ahead (no such DataSource, no label, its own, or a label naming
/// a cron that is gone or manages another DataSource).
pub fn already_managed(
    cron: &DataImportCron,
    ds: Option<&DataSource>,
    other: Option<&DataImportCron>,
) -> Option<String> {
    let ds = ds?;
    let label = labelled_manager(cron, ds)?;
    let other = other?;
    (other.name_any() == label && other.spec.managed_data_source == ds.name_any()).then(|| {
        format!(
            "DataSource {} is already managed by DataImportCron {label}",
            ds.name_any()
        )
    })
}

/// Whether a poll is due: never polled, or the recorded next run has come, [`spread`] after
/// it (an unreadable one counts as due).
pub fn poll_due(cron: &DataImportCron, now: Timestamp) -> bool {
    match cron.annotations().get(annotation::NEXT_CRON_TIME) {
        None => true,
        Some(t) => t
            .parse::<Timestamp>()
            .map_or(true, |t| poll_time(cron, t) <= now),
    }
}

/// When to look again for the next poll: the recorded run's [`poll_time`] while that is ahead
/// (a reconcile inside the spread must not skip it), else the next run's.
pub fn next_poll(
    cron: &DataImportCron,
    now: Timestamp,
) -> Result<Option<Timestamp>, ScheduleError> {
    let recorded = cron
        .annotations()
        .get(annotation::NEXT_CRON_TIME)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map(|t| poll_time(cron, t))
        .filter(|t| *t > now);
    match recorded {
        Some(t) if !cron.spec.schedule.trim().is_empty() => Ok(Some(t)),
        _ => Ok(next_run(cron, now)?.map(|t| poll_time(cron, t))),
    }
}

/// Longest a poll waits after its scheduled time.
pub const MAX_SPREAD: std::time::Duration = std::time::Duration::from_secs(30);

/// When the run scheduled at `scheduled` polls: [`spread`] after it.
pub fn poll_time(cron: &DataImportCron, scheduled: Timestamp) -> Timestamp {
    let spread = spread(cron, scheduled);
    scheduled
        .checked_add(k8s_openapi::jiff::SignedDuration::try_from(spread).unwrap_or_default())
        .unwrap_or(scheduled)
}

/// How long after its scheduled time a cron polls: a fraction of [`MAX_SPREAD`] (of a quarter
/// of the schedule's period when that is shorter) fixed by its UID. Crons sharing a schedule (a
/// hundred golden images polled every 12 hours) then reach their registry over half a minute,
/// not all in the first second of it. The recorded next run stays the scheduled time.
pub fn spread(cron: &DataImportCron, scheduled: Timestamp) -> std::time::Duration {
    let period = Schedule::parse(&cron.spec.schedule)
        .ok()
        .and_then(|s| s.next_after(scheduled))
        .and_then(|next| std::time::Duration::try_from(next.duration_since(scheduled)).ok())
        .unwrap_or(MAX_SPREAD * 4);
    let window = MAX_SPREAD.min(period / 4);
    let key = cron.metadata.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            cron.namespace().unwrap_or_default(),
            cron.name_any()
        )
    });
    let hash = super::version::fnv1a(&key);
    window.mul_f64(f64::from(hash % 10_000) / 10_000.0)
}

/// The next run after `now`; None when the schedule is empty (polling off) or never fires.
pub fn next_run(cron: &DataImportCron, now: Timestamp) -> Result<Option<Timestamp>, ScheduleError> {
    if cron.spec.schedule.trim().is_empty() {
        return Ok(None);
    }
    Ok(Schedule::parse(&cron.spec.schedule)?.next_after(now))
}

/// What one reconcile decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The cron's new status.
    pub status: DataImportCronStatus,
    /// An import DataVolume to create (its name, the version of `status.currentImports`;
    /// [`import_data_volume`] builds it).
    pub create: Option<String>,
    /// The current import is in place in the format `status.sourceFormat` says: its PVC or
    /// snapshot is stamped as used, the DataSource points at `status.lastImportedPVC` and old
    /// imports are garbage-collected.
    pub succeeded: bool,
    /// A failed import DataVolume to delete (a new version replaces it).
    pub delete: Option<String>,
    /// The snapshot format: take the snapshot of this import's PVC (the import succeeded).
    pub take_snapshot: Option<String>,
    /// The snapshot format: this import's snapshot is ready, its DataVolume and PVC go (CDI
    /// deletes them then).
    pub delete_import: Option<String>,
    /// The PVC format: this import's PVC replaced its snapshot, which goes.
    pub delete_snapshot: Option<String>,
    /// A snapshot is awaited (snapshots are not watched): look again soon.
    pub awaits_snapshot: bool,
}

/// The cron's status and actions (CDI's `update`): `desired` is the version the last poll
/// found (the [`annotation::SOURCE_DESIRED_DIGEST`]), `seen` the current import and the format
/// asked for, `polled_at` when this reconcile polled.
///
/// The snapshot format, as CDI's: once the import DataVolume succeeded its PVC is snapshotted
/// (`take_snapshot`); once the snapshot is ready it is the import (`lastImportedPVC` names it,
/// `sourceFormat: snapshot`, the DataSource points at it) and the DataVolume and PVC go
/// (`delete_import`). Unlike CDI, the DataSource keeps the previous version until the snapshot
/// is ready, so it never points at a snapshot that cannot be restored yet. A switch of format
/// applies to the current version too: a PVC still there is snapshotted; a version kept only as
/// a snapshot is imported again as a PVC (while the snapshot keeps serving), and the snapshot
/// goes once the PVC replaced it (CDI deletes the snapshot first).
pub fn decide(
    cron: &DataImportCron,
    desired: Option<&str>,
    seen: impl Into<Seen>,
    polled_at: Option<Timestamp>,
    now: Timestamp,
) -> Result<Decision, NameError> {
    let seen: Seen = seen.into();
    let ns = cron.namespace().unwrap_or_default();
    let mut st = cron.status.clone().unwrap_or_default();
    let imports = st.current_imports.clone();
    let current = imports.first().map(|i| i.data_volume_name.clone());
    let (state, erroneous) = match seen.import {
        ImportState::Erroneous(phase) => (ImportState::DataVolume(phase), true),
        other => (other, false),
    };
    let (mut take_snapshot, mut delete_import, mut delete_snapshot) = (None, None, None);
    let mut awaits_snapshot = false;
    let progressing = |st: &mut DataImportCronStatus, ok: bool, reason: &str, msg: &str| {
        set_condition(
            &mut st.conditions,
            condition::PROGRESSING,
            ok,
            reason,
            msg,
            now,
        )
    };
    // `finished`: the version is imported (a new one may start); `kept`: in which format it is
    // in place for the DataSource (None while its snapshot is awaited).
    let (finished, kept) = match state {
        ImportState::DataVolume(Some(Phase::Succeeded)) | ImportState::Pvc => {
            match (seen.format, seen.snapshot) {
                (SourceFormat::Pvc, snapshot) => {
                    if snapshot.is_some() {
                        delete_snapshot = current.clone();
                    }
                    (true, Some(SourceFormat::Pvc))
                }
                (SourceFormat::Snapshot, None) => {
                    take_snapshot = current.clone();
                    awaits_snapshot = true;
                    (true, None)
                }
                (SourceFormat::Snapshot, Some(false)) => {
                    awaits_snapshot = true;
                    (true, None)
                }
                (SourceFormat::Snapshot, Some(true)) => {
                    delete_import = current.clone();
                    (true, Some(SourceFormat::Snapshot))
                }
            }
        }
        // The snapshot alone: its PVC went once it was ready.
        ImportState::None if seen.snapshot == Some(true) => (true, Some(SourceFormat::Snapshot)),
        // A snapshot whose PVC went before it was ready: the snapshotter finishes it.
        ImportState::None if seen.snapshot == Some(false) => {
            awaits_snapshot = true;
            (true, None)
        }
        ImportState::DataVolume(Some(Phase::ImportScheduled)) => {
            progressing(&mut st, false, reason::SCHEDULED, "Import is scheduled");
            (false, None)
        }
        ImportState::DataVolume(Some(Phase::ImportInProgress)) => {
            progressing(&mut st, true, reason::IN_PROGRESS, "Import is progressing");
            (false, None)
        }
        ImportState::DataVolume(phase) | ImportState::Erroneous(phase) => {
            let p = phase.map(Phase::as_str).unwrap_or_default();
            progressing(&mut st, false, p, &format!("Import DataVolume phase {p}"));
            (false, None)
        }
        ImportState::None => {
            if !st.current_imports.is_empty() {
                st.current_imports.remove(0);
            }
            progressing(&mut st, false, reason::NO_IMPORT, "No current import");
            (false, None)
        }
    };
    let succeeded = kept.is_some();
    if finished {
        progressing(&mut st, false, reason::NO_IMPORT, "No current import");
    }
    if let (Some(format), Some(first)) = (kept, imports.first()) {
        let pvc = SourcePvc {
            namespace: ns.clone(),
            name: first.data_volume_name.clone(),
        };
        if st.last_imported_pvc.as_ref() != Some(&pvc) {
            st.last_imported_pvc = Some(pvc);
            st.last_import_timestamp = Some(Time(now));
        }
        // What the DataSource points at: lastImportedPVC in this format.
        st.source_format = Some(format.as_str().into());
    }
    let (mut create, mut delete) = (None, None);
    let up_to_date = |st: &mut DataImportCronStatus, ok: bool, reason: &str, msg: &str| {
        set_condition(
            &mut st.conditions,
            condition::UP_TO_DATE,
            ok,
            reason,
            msg,
            now,
        )
    };
    let desired = desired.filter(|d| !d.is_empty());
    let digest_updated = desired.is_some_and(|d| imports.first().is_none_or(|i| i.digest != d));
    if let (true, Some(d)) = (digest_updated, desired) {
        up_to_date(
            &mut st,
            false,
            reason::OUTDATED,
            "Source digest updated since last import",
        );
        if erroneous && let Some(failed) = imports.first() {
            delete = Some(failed.data_volume_name.clone());
            st.current_imports.clear();
        }
        if finished || imports.is_empty() || delete.is_some() {
            let name = import_name(&cron.spec.managed_data_source, d)?;
            st.current_imports = vec![ImportStatus {
                data_volume_name: name.clone(),
                digest: d.into(),
            }];
            create = Some(name);
            // Moving on: the previous version's snapshot is not taken (or awaited).
            take_snapshot = None;
            awaits_snapshot = false;
        }
    } else if succeeded {
        up_to_date(
            &mut st,
            true,
            reason::UP_TO_DATE,
            "Latest import is up to date",
        );
        // A version kept only as a snapshot while PVCs are asked for: imported again.
        if seen.format == SourceFormat::Pvc && kept == Some(SourceFormat::Snapshot) {
            create = current.clone();
        }
    } else if finished {
        up_to_date(
            &mut st,
            false,
            reason::IN_PROGRESS,
            "Snapshot of imported data is progressing",
        );
    } else if !imports.is_empty() {
        up_to_date(&mut st, false, reason::IN_PROGRESS, "Import is progressing");
    } else {
        up_to_date(&mut st, false, reason::NO_DIGEST, "No source digest");
    }
    if let Some(t) = polled_at {
        st.last_execution_timestamp = Some(Time(t));
    }
    Ok(Decision {
        status: st,
        create,
        succeeded,
        delete,
        take_snapshot,
        delete_import,
        delete_snapshot,
        awaits_snapshot,
    })
}

/// The cron's own labels CDI passes on to its imports and DataSource: the VM defaults a
/// golden image carries (KubeVirt's instance type and preference) and its credentials support.
pub const PASSED_LABELS: [&str; 5] = [
    "instancetype.kubevirt.io/default-instancetype",
    "instancetype.kubevirt.io/default-instancetype-kind",
    "instancetype.kubevirt.io/default-preference",
    "instancetype.kubevirt.io/default-preference-kind",
    "kubevirt.io/dynamic-credentials-support",
];

/// The labels CDI puts on a cron's DataVolumes, PVCs, snapshots and DataSource: the cron's
/// name, the cleanup mark under `retentionPolicy: None`, and the cron's [`PASSED_LABELS`].
pub fn cron_labels(cron: &DataImportCron) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = PASSED_LABELS
        .iter()
        .filter_map(|k| {
            let v = cron.labels().get(*k)?;
            (!v.is_empty()).then(|| (k.to_string(), v.clone()))
        })
        .collect();
    labels.insert(DATA_IMPORT_CRON_LABEL.into(), cron.name_any());
    if cron.spec.retention_policy() == RetentionPolicy::None {
        labels.insert(CLEANUP_LABEL.into(), "true".into());
    }
    labels
}

/// A registry URL pinned to `digest` (CDI imports the version it polled, not whatever the tag
/// names by then): `docker://HOST/NAME:TAG` becomes `docker://HOST/NAME@DIGEST`.
pub fn pinned_registry_url(url: &str, digest: &str) -> String {
    let base = url.split_once('@').map_or(url, |(b, _)| b);
    let slash = base.rfind('/').map_or(0, |i| i + 1);
    let untagged = match base[slash..].rfind(':') {
        Some(i) => &base[..slash + i],
        None => base,
    };
    format!("{untagged}@{digest}")
}

/// The import DataVolume `name` for version `digest`: the template's spec (a registry source
/// pinned to the digest), its labels and annotations, the cron's labels and immediate binding.
pub fn import_data_volume(cron: &DataImportCron, name: &str, digest: &str) -> DataVolume {
    let template = &cron.spec.template;
    let mut spec = template.spec.clone();
    if let Some(reg) = spec.source.as_mut().and_then(|s| s.registry.as_mut())
        && let Some(url) = reg.url.as_mut()
    {
        *url = pinned_registry_url(url, digest);
    }
    let meta = template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.extend(cron_labels(cron));
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.insert(annotation::IMMEDIATE_BINDING.into(), "true".into());
    let mut dv = DataVolume::new(name, spec);
    dv.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: cron.namespace(),
        labels: Some(labels),
        annotations: Some(annotations),
        ..Default::default()
    };
    dv
}

/// The managed DataSource as it should be, or None when it is left alone: a missing one is
/// created (owned by the cron as its controller), one labelled with this cron is pointed at the
/// last import, as a `pvc` or a `snapshot` source as `status.sourceFormat` says (and, when the
/// cron does not own it yet, owned with `controller: false`, as CDI takes pre-existing
/// DataSources); one without the cron label is not the cron's to change.
pub fn managed_data_source(
    cron: &DataImportCron,
    existing: Option<&DataSource>,
) -> Option<DataSource> {
    let mut ds = match existing {
        None => {
            let mut ds = DataSource::new(&cron.spec.managed_data_source, DataSourceSpec::default());
            ds.metadata.namespace = cron.namespace();
            ds.metadata.owner_references = Some(vec![owner(cron, true)]);
            ds
        }
        Some(ds) => {
            let label = ds.labels().get(DATA_IMPORT_CRON_LABEL);
            if label.is_none_or(String::is_empty) {
                return None;
            }
            let mut ds = ds.clone();
            let uid = cron.uid();
            let refs = ds.metadata.owner_references.get_or_insert_with(Vec::new);
            if !refs.iter().any(|r| Some(&r.uid) == uid.as_ref()) {
                refs.push(owner(cron, false));
            }
            ds
        }
    };
    ds.labels_mut().extend(cron_labels(cron));
    let st = cron.status.as_ref();
    if let Some(last) = st.and_then(|s| s.last_imported_pvc.clone()) {
        let format = SourceFormat::of_status(st.and_then(|s| s.source_format.as_deref()));
        ds.spec.source = match format {
            SourceFormat::Pvc => DataSourceSource {
                pvc: Some(last),
                ..Default::default()
            },
            SourceFormat::Snapshot => DataSourceSource {
                snapshot: Some(last),
                ..Default::default()
            },
        };
    }
    Some(ds)
}

/// The name of the cron's last import (a PVC, or a snapshot as `status.sourceFormat` says).
pub fn last_import(cron: &DataImportCron) -> Option<&str> {
    cron.status
        .as_ref()?
        .last_imported_pvc
        .as_ref()
        .map(|p| p.name.as_str())
}

/// An owner reference to the cron.
fn owner(cron: &DataImportCron, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: DataImportCron::api_version(&()).into(),
        kind: DataImportCron::kind(&()).into(),
        name: cron.name_any(),
        uid: cron.uid().unwrap_or_default(),
        controller: Some(controller),
        block_owner_deletion: Some(true),
    }
}

/// The imports to delete after a success (CDI's order, [`super::gc::to_delete`]): `pvcs` are
/// the cron's PVCs, or its VolumeSnapshots (each kind is kept to `importsToKeep` on its own, as
/// CDI does), as `(name, lastUseTime annotation)`; the last import and the one in progress stay.
pub fn garbage(cron: &DataImportCron, pvcs: &[(String, Option<String>)]) -> Vec<String> {
    let imports: Vec<super::gc::Import> = pvcs
        .iter()
        .map(|(n, t)| super::gc::Import::new(n, t.as_deref()))
        .collect();
    let st = cron.status.clone().unwrap_or_default();
    let mut protected: Vec<&str> = st
        .current_imports
        .iter()
        .map(|i| i.data_volume_name.as_str())
        .collect();
    if let Some(p) = &st.last_imported_pvc {
        protected.push(&p.name);
    }
    super::gc::to_delete(
        &imports,
        cron.spec.imports_to_keep(),
        cron.spec.garbage_collect(),
        &protected,
    )
    .into_iter()
    .map(str::to_string)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::golden::{DataImportCronSpec, DataVolumeTemplate, GarbageCollect};

    const D1: &str = "sha256:1111111111112222222222223333333333334444444444445555555555556666";
    const D2: &str = "sha256:aaaaaaaaaaaabbbbbbbbbbbbccccccccccccddddddddddddeeeeeeeeeeeeffff";

    fn now() -> Timestamp {
        "2024-05-02T10:00:00Z".parse().unwrap()
    }

    fn cron() -> DataImportCron {
        let template: DataVolumeTemplate = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"app": "golden"}},
            "spec": {"source": {"registry": {"url": "docker://reg:5000/fedora:latest"}},
                     "storage": {"resources": {"requests": {"storage": "1Gi"}}}}
        }))
        .unwrap();
        let mut c = DataImportCron::new(
            "fedora-cron",
            DataImportCronSpec {
                template,
                schedule: "0 * * * *".into(),
                managed_data_source: "fedora".into(),
                ..Default::default()
            },
        );
        c.metadata.namespace = Some("golden".into());
        c.metadata.uid = Some("cron-uid".into());
        c
    }

    fn with_import(mut c: DataImportCron, digest: &str) -> DataImportCron {
        let name = import_name("fedora", digest).unwrap();
        c.status
            .get_or_insert_with(Default::default)
            .current_imports = vec![ImportStatus {
            data_volume_name: name,
            digest: digest.into(),
        }];
        c
    }

    fn cond<'a>(st: &'a DataImportCronStatus, t: &str) -> (&'a str, &'a str) {
        let c = st.conditions.iter().find(|c| c.type_ == t).unwrap();
        (c.status.as_str(), c.reason.as_deref().unwrap_or_default())
    }

    #[test]
    fn crons_of_one_schedule_poll_spread_over_half_a_minute_each_at_its_own_fixed_time() {
        let next = "2024-05-02T12:00:00Z".parse::<Timestamp>().unwrap();
        let spreads: Vec<_> = (0..100)
            .map(|i| {
                let mut c = cron();
                c.metadata.uid = Some(format!("6f1c2a9e-0000-4000-8000-{i:012}"));
                spread(&c, next)
            })
            .collect();
        assert!(spreads.iter().all(|s| *s < MAX_SPREAD));
        // Spread out: no 3-second slice holds more than a fifth of them.
        let mut slices = [0; 10];
        spreads
            .iter()
            .for_each(|s| slices[(s.as_secs() / 3) as usize] += 1);
        assert!(slices.iter().all(|n| *n <= 20), "{slices:?}");
        // Fixed by the UID: the same cron waits as long every time.
        let mut c = cron();
        c.metadata.uid = Some("6f1c2a9e-0000-4000-8000-000000000007".into());
        assert_eq!(spread(&c, next), spreads[7]);
        // Inside the spread, the next look is still this run's poll, not the next run's.
        let late = spreads.iter().position(|s| s.as_secs() >= 2).unwrap();
        c.metadata.uid = Some(format!("6f1c2a9e-0000-4000-8000-{late:012}"));
        c.annotations_mut()
            .insert(annotation::NEXT_CRON_TIME.into(), next.to_string());
        let inside = next
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(1))
            .unwrap();
        assert!(!poll_due(&c, inside));
        assert_eq!(next_poll(&c, inside).unwrap(), Some(poll_time(&c, next)));
        assert!(poll_due(&c, poll_time(&c, next)));
        // A short period spreads over a quarter of it.
        c.spec.schedule = "@every 20s".into();
        assert!(spread(&c, next) < std::time::Duration::from_secs(5));
    }

    #[test]
    fn a_cron_never_polled_is_due_and_then_waits_for_its_next_run() {
        let mut c = cron();
        assert!(poll_due(&c, now()));
        let next = next_run(&c, now()).unwrap().unwrap();
        assert_eq!(next.to_string(), "2024-05-02T11:00:00Z");
        c.annotations_mut()
            .insert(annotation::NEXT_CRON_TIME.into(), next.to_string());
        assert!(!poll_due(&c, now()));
        assert!(poll_due(&c, poll_time(&c, next)));
        c.spec.schedule = String::new();
        assert_eq!(next_run(&c, now()).unwrap(), None);
    }

    #[test]
    fn no_version_yet_is_not_up_to_date_with_no_digest() {
        let d = decide(&cron(), None, ImportState::None, None, now()).unwrap();
        assert_eq!(d.create, None);
        assert_eq!(cond(&d.status, "UpToDate"), ("False", "NoDigest"));
        assert_eq!(cond(&d.status, "Progressing"), ("False", "NoImport"));
    }

    #[test]
    fn a_first_version_creates_the_import_named_from_the_digest() {
        let t = now();
        let d = decide(&cron(), Some(D1), ImportState::None, Some(t), t).unwrap();
        assert_eq!(d.create.as_deref(), Some("fedora-111111111111"));
        assert_eq!(d.status.current_imports[0].digest, D1);
        assert_eq!(cond(&d.status, "UpToDate"), ("False", "Outdated"));
        assert_eq!(d.status.last_execution_timestamp, Some(Time(t)));
    }

    #[test]
    fn a_running_import_is_progressing() {
        let c = with_import(cron(), D1);
        let d = decide(
            &c,
            Some(D1),
            ImportState::DataVolume(Some(Phase::ImportInProgress)),
            None,
            now(),
        )
        .unwrap();
        assert_eq!(d.create, None);
        assert_eq!(
            cond(&d.status, "Progressing"),
            ("True", "ImportProgressing")
        );
        assert_eq!(cond(&d.status, "UpToDate"), ("False", "ImportProgressing"));
        let d = decide(
            &c,
            Some(D1),
            ImportState::DataVolume(Some(Phase::ImportScheduled)),
            None,
            now(),
        )
        .unwrap();
        assert_eq!(cond(&d.status, "Progressing"), ("False", "ImportScheduled"));
    }

    #[test]
    fn a_succeeded_import_is_recorded_and_up_to_date() {
        let c = with_import(cron(), D1);
        let d = decide(
            &c,
            Some(D1),
            ImportState::DataVolume(Some(Phase::Succeeded)),
            None,
            now(),
        )
        .unwrap();
        assert!(d.succeeded);
        assert_eq!(d.create, None);
        assert_eq!(
            d.status.last_imported_pvc,
            Some(SourcePvc {
                namespace: "golden".into(),
                name: "fedora-111111111111".into()
            })
        );
        assert_eq!(d.status.last_import_timestamp, Some(Time(now())));
        assert_eq!(d.status.source_format.as_deref(), Some("pvc"));
        assert_eq!(cond(&d.status, "UpToDate"), ("True", "UpToDate"));
        assert_eq!(cond(&d.status, "Progressing"), ("False", "NoImport"));
    }

    #[test]
    fn a_new_version_after_a_success_creates_the_next_import() {
        let c = with_import(cron(), D1);
        let d = decide(&c, Some(D2), ImportState::Pvc, None, now()).unwrap();
        assert!(d.succeeded);
        assert_eq!(d.create.as_deref(), Some("fedora-aaaaaaaaaaaa"));
        assert_eq!(
            d.status.last_imported_pvc.unwrap().name,
            "fedora-111111111111"
        );
        assert_eq!(d.status.current_imports[0].digest, D2);
    }

    #[test]
    fn a_new_version_during_an_import_waits_for_it() {
        let c = with_import(cron(), D1);
        let d = decide(
            &c,
            Some(D2),
            ImportState::DataVolume(Some(Phase::ImportInProgress)),
            None,
            now(),
        )
        .unwrap();
        assert_eq!(d.create, None);
        assert_eq!(cond(&d.status, "UpToDate"), ("False", "Outdated"));
    }

    #[test]
    fn a_failed_import_is_deleted_and_replaced_when_a_new_version_arrives() {
        let c = with_import(cron(), D1);
        let failed = ImportState::Erroneous(Some(Phase::Failed));
        // The same version: the failed import stays (nothing new to try).
        let d = decide(&c, Some(D1), failed, None, now()).unwrap();
        assert_eq!((d.delete.as_deref(), d.create.as_deref()), (None, None));
        assert_eq!(cond(&d.status, "Progressing"), ("False", "Failed"));
        // A new version: the failed DataVolume goes and the new one is imported.
        let d = decide(&c, Some(D2), failed, None, now()).unwrap();
        assert_eq!(d.delete.as_deref(), Some("fedora-111111111111"));
        assert_eq!(d.create.as_deref(), Some("fedora-aaaaaaaaaaaa"));
        assert_eq!(d.status.current_imports.len(), 1);
        assert_eq!(d.status.current_imports[0].digest, D2);
        // One retrying after a failed pod counts as failed too; a healthy one is waited for.
        let retrying = ImportState::Erroneous(Some(Phase::ImportInProgress));
        let d = decide(&c, Some(D2), retrying, None, now()).unwrap();
        assert_eq!(d.delete.as_deref(), Some("fedora-111111111111"));
        let running = ImportState::DataVolume(Some(Phase::ImportInProgress));
        assert_eq!(
            decide(&c, Some(D2), running, None, now()).unwrap().delete,
            None
        );
    }

    #[test]
    fn an_import_is_erroneous_once_failed_or_retrying_after_a_failure() {
        let dv = |phase: &str, restarts: i32, running: &str| -> DataVolume {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                "metadata": {"name": "fedora-111111111111"},
                "spec": {"source": {"blank": {}}},
                "status": {"phase": phase, "restartCount": restarts,
                           "conditions": [{"type": "Running", "status": running}]}
            }))
            .unwrap()
        };
        let failed = import_state_of(&dv("Failed", 0, "False"));
        assert_eq!(failed, ImportState::Erroneous(Some(Phase::Failed)));
        let retrying = import_state_of(&dv("ImportInProgress", 1, "False"));
        assert_eq!(
            retrying,
            ImportState::Erroneous(Some(Phase::ImportInProgress))
        );
        let running = import_state_of(&dv("ImportInProgress", 1, "True"));
        assert_eq!(
            running,
            ImportState::DataVolume(Some(Phase::ImportInProgress))
        );
        let first_try = import_state_of(&dv("ImportScheduled", 0, "False"));
        assert_eq!(
            first_try,
            ImportState::DataVolume(Some(Phase::ImportScheduled))
        );
    }

    #[test]
    fn a_data_source_another_cron_manages_is_refused_as_cdi_does() {
        let ds = |label: Option<&str>| {
            let mut ds = DataSource::new("fedora", DataSourceSpec::default());
            ds.metadata.namespace = Some("golden".into());
            if let Some(l) = label {
                ds.labels_mut()
                    .insert(DATA_IMPORT_CRON_LABEL.into(), l.into());
            }
            ds
        };
        let mut other = cron();
        other.metadata.name = Some("fedora-other".into());
        let taken = ds(Some("fedora-other"));
        assert_eq!(labelled_manager(&cron(), &taken), Some("fedora-other"));
        assert_eq!(
            already_managed(&cron(), Some(&taken), Some(&other)).as_deref(),
            Some("DataSource fedora is already managed by DataImportCron fedora-other")
        );
        // Its own, unlabelled, or missing: go ahead.
        for mine in [ds(Some("fedora-cron")), ds(None), ds(Some(""))] {
            assert_eq!(labelled_manager(&cron(), &mine), None);
            assert_eq!(already_managed(&cron(), Some(&mine), Some(&other)), None);
        }
        assert_eq!(already_managed(&cron(), None, Some(&other)), None);
        // The labelled cron is gone, or manages another DataSource: go ahead.
        assert_eq!(already_managed(&cron(), Some(&taken), None), None);
        other.spec.managed_data_source = "rhel".into();
        assert_eq!(already_managed(&cron(), Some(&taken), Some(&other)), None);
    }

    #[test]
    fn an_unchanged_version_imports_nothing() {
        let c = with_import(cron(), D1);
        let d = decide(&c, Some(D1), ImportState::Pvc, Some(now()), now()).unwrap();
        assert_eq!(d.create, None);
        assert_eq!(d.status.current_imports.len(), 1);
    }

    #[test]
    fn a_vanished_import_is_dropped() {
        let c = with_import(cron(), D1);
        let d = decide(&c, Some(D1), ImportState::None, None, now()).unwrap();
        assert!(d.status.current_imports.is_empty());
        // The next reconcile imports the version again.
        let mut c2 = c.clone();
        c2.status = Some(d.status);
        let d = decide(&c2, Some(D1), ImportState::None, None, now()).unwrap();
        assert_eq!(d.create.as_deref(), Some("fedora-111111111111"));
    }

    #[test]
    fn the_import_data_volume_is_pinned_labelled_and_binds_at_once() {
        let mut c = cron();
        c.spec.retention_policy = Some(RetentionPolicy::None);
        let dv = import_data_volume(&c, "fedora-111111111111", D1);
        assert_eq!(dv.metadata.namespace.as_deref(), Some("golden"));
        let url = dv.spec.source.as_ref().unwrap().registry.as_ref().unwrap();
        assert_eq!(
            url.url.as_deref(),
            Some(format!("docker://reg:5000/fedora@{D1}").as_str())
        );
        let labels = dv.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[DATA_IMPORT_CRON_LABEL], "fedora-cron");
        assert_eq!(labels[CLEANUP_LABEL], "true");
        assert_eq!(labels["app"], "golden");
        assert_eq!(
            dv.metadata.annotations.as_ref().unwrap()[annotation::IMMEDIATE_BINDING],
            "true"
        );
    }

    #[test]
    fn registry_urls_lose_their_tag_and_keep_their_port() {
        assert_eq!(
            pinned_registry_url("docker://reg:5000/a/b:1.0", D1),
            format!("docker://reg:5000/a/b@{D1}")
        );
        assert_eq!(
            pinned_registry_url("docker://reg:5000/a/b", D1),
            format!("docker://reg:5000/a/b@{D1}")
        );
        assert_eq!(
            pinned_registry_url(&format!("docker://q.io/b@{D2}"), D1),
            format!("docker://q.io/b@{D1}")
        );
    }

    #[test]
    fn a_created_data_source_is_controlled_by_the_cron() {
        let c = with_import(cron(), D1);
        let ds = managed_data_source(&c, None).unwrap();
        assert_eq!(ds.metadata.namespace.as_deref(), Some("golden"));
        let r = &ds.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (r.kind.as_str(), r.controller),
            ("DataImportCron", Some(true))
        );
        assert_eq!(ds.labels()[DATA_IMPORT_CRON_LABEL], "fedora-cron");
        assert_eq!(ds.spec.source.pvc, None);
    }

    #[test]
    fn a_pre_existing_labelled_data_source_is_taken_without_control() {
        let mut c = with_import(cron(), D1);
        c.status.as_mut().unwrap().last_imported_pvc = Some(SourcePvc {
            namespace: "golden".into(),
            name: "fedora-111111111111".into(),
        });
        let mut existing = DataSource::new("fedora", DataSourceSpec::default());
        existing
            .labels_mut()
            .insert(DATA_IMPORT_CRON_LABEL.into(), "fedora-cron".into());
        let ds = managed_data_source(&c, Some(&existing)).unwrap();
        let refs = ds.metadata.owner_references.as_ref().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].controller, Some(false));
        assert_eq!(ds.spec.source.pvc.unwrap().name, "fedora-111111111111");
        // Taken once: a second pass adds nothing.
        let again = managed_data_source(&c, Some(&ds_with(refs.clone()))).unwrap();
        assert_eq!(again.metadata.owner_references.unwrap().len(), 1);
    }

    fn ds_with(refs: Vec<OwnerReference>) -> DataSource {
        let mut ds = DataSource::new("fedora", DataSourceSpec::default());
        ds.labels_mut()
            .insert(DATA_IMPORT_CRON_LABEL.into(), "fedora-cron".into());
        ds.metadata.owner_references = Some(refs);
        ds
    }

    #[test]
    fn an_unlabelled_data_source_is_left_alone() {
        let existing = DataSource::new("fedora", DataSourceSpec::default());
        assert!(managed_data_source(&cron(), Some(&existing)).is_none());
    }

    #[test]
    fn garbage_keeps_imports_to_keep_and_the_current_import() {
        let mut c = with_import(cron(), D2);
        c.spec.imports_to_keep = Some(1);
        let pvcs = vec![
            (
                "fedora-1".to_string(),
                Some("2024-05-01T00:00:00Z".to_string()),
            ),
            (
                "fedora-2".to_string(),
                Some("2024-05-02T00:00:00Z".to_string()),
            ),
            ("fedora-aaaaaaaaaaaa".to_string(), None),
        ];
        assert_eq!(garbage(&c, &pvcs), ["fedora-1"]);
        c.spec.garbage_collect = Some(GarbageCollect::Never);
        assert!(garbage(&c, &pvcs).is_empty());
    }

    fn seen(import: ImportState, snapshot: Option<bool>, format: SourceFormat) -> Seen {
        Seen {
            import,
            snapshot,
            format,
        }
    }

    const SUCCEEDED: ImportState = ImportState::DataVolume(Some(Phase::Succeeded));
    const X: &str = "fedora-111111111111";

    /// The cron with version D1 imported and kept in `format`.
    fn kept(format: SourceFormat) -> DataImportCron {
        let mut c = with_import(cron(), D1);
        let st = c.status.as_mut().unwrap();
        st.last_imported_pvc = Some(SourcePvc {
            namespace: "golden".into(),
            name: X.into(),
        });
        st.source_format = Some(format.as_str().into());
        c
    }

    fn after(mut c: DataImportCron, d: &Decision) -> DataImportCron {
        c.status = Some(d.status.clone());
        c
    }

    #[test]
    fn in_the_snapshot_format_a_succeeded_import_is_snapshotted_before_it_counts() {
        let c = with_import(cron(), D1);
        let s = seen(SUCCEEDED, None, SourceFormat::Snapshot);
        let d = decide(&c, Some(D1), s, None, now()).unwrap();
        assert_eq!(d.take_snapshot.as_deref(), Some(X));
        assert!(d.awaits_snapshot);
        assert!(!d.succeeded, "recorded before its snapshot is ready");
        assert_eq!(d.status.last_imported_pvc, None);
        assert_eq!(
            (d.delete_import.as_deref(), d.create.as_deref()),
            (None, None)
        );
        assert_eq!(cond(&d.status, "UpToDate"), ("False", "ImportProgressing"));
        let up = d.status.conditions.iter().find(|c| c.type_ == "UpToDate");
        assert_eq!(
            up.unwrap().message.as_deref(),
            Some("Snapshot of imported data is progressing")
        );
        // Taken, not ready yet: awaited, not taken again.
        let s = seen(SUCCEEDED, Some(false), SourceFormat::Snapshot);
        let d = decide(&c, Some(D1), s, None, now()).unwrap();
        assert_eq!(d.take_snapshot, None);
        assert!(d.awaits_snapshot && !d.succeeded);
    }

    #[test]
    fn a_ready_snapshot_is_the_import_and_its_pvc_goes() {
        let c = with_import(cron(), D1);
        let s = seen(SUCCEEDED, Some(true), SourceFormat::Snapshot);
        let d = decide(&c, Some(D1), s, None, now()).unwrap();
        assert!(d.succeeded && !d.awaits_snapshot);
        assert_eq!(d.delete_import.as_deref(), Some(X));
        assert_eq!(d.take_snapshot, None);
        assert_eq!(d.status.last_imported_pvc.as_ref().unwrap().name, X);
        assert_eq!(d.status.source_format.as_deref(), Some("snapshot"));
        assert_eq!(cond(&d.status, "UpToDate"), ("True", "UpToDate"));
        // The DataSource points at the snapshot.
        let ds = managed_data_source(&after(c.clone(), &d), None).unwrap();
        let snap = ds.spec.source.snapshot.unwrap();
        assert_eq!((snap.namespace.as_str(), snap.name.as_str()), ("golden", X));
        assert_eq!(ds.spec.source.pvc, None);
        // Its PVC gone, the snapshot alone is the import: nothing more to delete.
        let c = after(c, &d);
        let s = seen(ImportState::None, Some(true), SourceFormat::Snapshot);
        let d = decide(&c, Some(D1), s, None, now()).unwrap();
        assert!(d.succeeded);
        assert_eq!(
            (d.delete_import, d.create, d.delete_snapshot),
            (None, None, None)
        );
        assert_eq!(d.status.current_imports.len(), 1, "the import is kept");
        assert_eq!(cond(&d.status, "UpToDate"), ("True", "UpToDate"));
    }

    #[test]
    fn the_data_source_keeps_the_previous_version_until_the_new_snapshot_is_ready() {
        let mut c = with_import(kept(SourceFormat::Snapshot), D2);
        c.status.as_mut().unwrap().current_imports[0].data_volume_name =
            "fedora-aaaaaaaaaaaa".into();
        let s = seen(SUCCEEDED, Some(false), SourceFormat::Snapshot);
        let d = decide(&c, Some(D2), s, None, now()).unwrap();
        let ds = managed_data_source(&after(c, &d), None).unwrap();
        assert_eq!(ds.spec.source.snapshot.unwrap().name, X);
    }

    #[test]
    fn a_new_version_while_a_snapshot_is_awaited_moves_on() {
        let c = with_import(cron(), D1);
        let s = seen(SUCCEEDED, None, SourceFormat::Snapshot);
        let d = decide(&c, Some(D2), s, None, now()).unwrap();
        assert_eq!(d.create.as_deref(), Some("fedora-aaaaaaaaaaaa"));
        assert_eq!((d.take_snapshot, d.awaits_snapshot), (None, false));
        assert_eq!(cond(&d.status, "UpToDate"), ("False", "Outdated"));
    }

    #[test]
    fn a_version_kept_as_a_pvc_is_snapshotted_when_the_format_becomes_snapshot() {
        let c = kept(SourceFormat::Pvc);
        let d = decide(
            &c,
            Some(D1),
            seen(ImportState::Pvc, None, SourceFormat::Snapshot),
            None,
            now(),
        )
        .unwrap();
        assert_eq!(d.take_snapshot.as_deref(), Some(X));
        // Meanwhile the DataSource stays on the PVC.
        let ds = managed_data_source(&after(c.clone(), &d), None).unwrap();
        assert_eq!(ds.spec.source.pvc.unwrap().name, X);
        let s = seen(ImportState::Pvc, Some(true), SourceFormat::Snapshot);
        let d = decide(&c, Some(D1), s, None, now()).unwrap();
        assert_eq!(d.status.source_format.as_deref(), Some("snapshot"));
        assert_eq!(d.delete_import.as_deref(), Some(X));
    }

    #[test]
    fn a_version_kept_as_a_snapshot_is_imported_again_when_the_format_becomes_pvc() {
        let c = kept(SourceFormat::Snapshot);
        let s = seen(ImportState::None, Some(true), SourceFormat::Pvc);
        let d = decide(&c, Some(D1), s, None, now()).unwrap();
        assert_eq!(d.create.as_deref(), Some(X), "imported again as a PVC");
        assert_eq!(d.status.current_imports[0].digest, D1);
        assert_eq!(d.delete_snapshot, None, "the snapshot serves meanwhile");
        let ds = managed_data_source(&after(c.clone(), &d), None).unwrap();
        assert_eq!(ds.spec.source.snapshot.unwrap().name, X);
        // The PVC import succeeded: the DataSource moves to it, the snapshot goes.
        let c = after(c, &d);
        let s = seen(SUCCEEDED, Some(true), SourceFormat::Pvc);
        let d = decide(&c, Some(D1), s, None, now()).unwrap();
        assert!(d.succeeded);
        assert_eq!(d.status.source_format.as_deref(), Some("pvc"));
        assert_eq!(d.delete_snapshot.as_deref(), Some(X));
        assert_eq!((&d.create, &d.delete_import), (&None, &None));
        let ds = managed_data_source(&after(c, &d), None).unwrap();
        assert_eq!(ds.spec.source.pvc.unwrap().name, X);
    }

    #[test]
    fn after_a_switch_to_pvc_a_new_version_is_imported_and_the_old_snapshot_left_to_gc() {
        let c = kept(SourceFormat::Snapshot);
        let s = seen(ImportState::None, Some(true), SourceFormat::Pvc);
        let d = decide(&c, Some(D2), s, None, now()).unwrap();
        assert_eq!(d.create.as_deref(), Some("fedora-aaaaaaaaaaaa"));
        assert_eq!(d.delete_snapshot, None);
    }

    #[test]
    fn garbage_collection_keeps_imports_to_keep_snapshots_newest_first() {
        let mut c = kept(SourceFormat::Snapshot);
        c.spec.imports_to_keep = Some(1);
        let snapshots = vec![
            (
                "fedora-old".to_string(),
                Some("2024-05-01T00:00:00Z".to_string()),
            ),
            (
                "fedora-older".to_string(),
                Some("2024-04-01T00:00:00Z".to_string()),
            ),
            (X.to_string(), Some("2024-05-02T00:00:00Z".to_string())),
        ];
        assert_eq!(garbage(&c, &snapshots), ["fedora-older", "fedora-old"]);
    }

    #[test]
    fn the_crons_instance_type_labels_pass_to_its_imports_and_data_source() {
        let mut c = cron();
        c.labels_mut().extend([
            (
                "instancetype.kubevirt.io/default-instancetype".to_string(),
                "u1.medium".to_string(),
            ),
            ("owner".to_string(), "team-a".to_string()),
        ]);
        let dv = import_data_volume(&c, X, D1);
        let labels = dv.metadata.labels.unwrap();
        assert_eq!(
            labels["instancetype.kubevirt.io/default-instancetype"],
            "u1.medium"
        );
        assert!(!labels.contains_key("owner"));
        let ds = managed_data_source(&c, None).unwrap();
        assert_eq!(
            ds.labels()["instancetype.kubevirt.io/default-instancetype"],
            "u1.medium"
        );
    }
}
