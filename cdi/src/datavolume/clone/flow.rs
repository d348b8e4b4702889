//! A clone's steps as a pure decision, CDI's DataVolume phases on the way ([`crate::datavolume::decide`]
//! hands clones here):
//! - CSI clone: the target PVC with the source as `dataSource` (CSICloneInProgress);
//! - snapshot (smart clone): a temporary VolumeSnapshot (SnapshotForSmartCloneInProgress), once
//!   ready a PVC restored from it (SmartClonePVCInProgress), then the snapshot is deleted; a
//!   `spec.source.snapshot` is restored directly (CloneFromSnapshotSourceInProgress);
//! - host-assisted: the target PVC, its upload server and Service (CloneScheduled), then the
//!   clone source pod streaming to it (CloneInProgress);
//! - a CSI clone or restore made at the source's size grows to the requested size
//!   (ExpansionInProgress): the PVC's request, then `disk.img` on a filesystem volume.
//!
//! A clone from another namespace goes ahead only with a valid clone token
//! ([`clone_token::check`], CDI's CloneValidationFailed otherwise: Pending, and a Warning).
//! The strategy is [`choose_strategy`]'s, recorded on the target PVC ([`ANN_CLONE_TYPE`]) so
//! it never changes once the PVC exists.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::objects::{self, ANN_CLONE_TYPE, SourcePodSpec, capacity, node_of, usable_space};
use super::token::{self, CLONE_VALIDATION_FAILED, CLONE_VALIDATION_FAILED_MESSAGE, TokenCheck};
use super::{CloneFacts, Strategy, choose_strategy};
use crate::datavolume::decide::{Action, Ctx, Work};
use crate::datavolume::pvc::{Claim, VolumeMode};
use crate::datavolume::source::CloneSource;
use crate::datavolume::source::CloneSourceKind;
use crate::datavolume::status::{self, reason};
use crate::datavolume::{name, pod};
use api::Phase;
use api::datavolume::condition;
use api::snapshot::{ANN_SOURCE_VOLUME_MODE, VolumeSnapshot};

/// Event and condition reasons of clones (CDI's spelling).
pub mod event {
    /// The clone's first object is created.
    pub const CLONE_SCHEDULED: &str = "CloneScheduled";
    /// A host-assisted clone's data moves.
    pub const CLONE_IN_PROGRESS: &str = "CloneInProgress";
    /// The CSI driver clones.
    pub const CSI_CLONE_IN_PROGRESS: &str = "CSICloneInProgress";
    /// The smart clone's snapshot is taken.
    pub const SNAPSHOT_FOR_SMART_CLONE_IN_PROGRESS: &str = "SnapshotForSmartCloneInProgress";
    /// The smart clone's PVC is restored.
    pub const SMART_CLONE_PVC_IN_PROGRESS: &str = "SmartClonePVCInProgress";
    /// A PVC is restored from a `spec.source.snapshot`.
    pub const CLONE_FROM_SNAPSHOT_SOURCE_IN_PROGRESS: &str = "CloneFromSnapshotSourceInProgress";
    /// The target grows to the requested size.
    pub const EXPANSION_IN_PROGRESS: &str = "ExpansionInProgress";
    /// The clone is complete.
    pub const CLONE_SUCCEEDED: &str = "CloneSucceeded";
    /// The clone failed for good.
    pub const CLONE_FAILED: &str = "CloneFailed";
    /// The target cannot hold the source.
    pub const ERR_INCOMPATIBLE_PVC: &str = "ErrIncompatiblePVC";
    /// The source is missing or not ready.
    pub const CLONE_WITHOUT_SOURCE: &str = crate::datavolume::clone::reason::CLONE_WITHOUT_SOURCE;
    /// CDI's Running message once done.
    pub const CLONE_COMPLETE: &str = "Clone Complete";
    /// Quarry's own: a host-assisted clone cannot run with the shared upload TLS Secret.
    pub const HOST_ASSISTED_CLONE_NOT_POSSIBLE: &str = "HostAssistedCloneNotPossible";
}

/// Why a host-assisted clone waits when upload servers share one TLS Secret
/// ([`crate::settings::UploadTls::Shared`]): its clone source pod would have no CA to trust
/// the upload server with and no client certificate it accepts (the proxy's client CA signs
/// none for it).
pub const SHARED_TLS_REFUSED: &str = "A host-assisted clone needs per-pod upload TLS \
    (--upload-tls-signer-namespace): with a shared upload TLS Secret (--upload-tls-secret) the \
    clone source pod has no certificate the upload server accepts";

/// What the controller read for a clone (absent objects are None).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CloneObserved {
    /// The source PVC (a PVC clone).
    pub source_pvc: Option<PersistentVolumeClaim>,
    /// The source VolumeSnapshot (a `spec.source.snapshot`).
    pub source_snapshot: Option<VolumeSnapshot>,
    /// The node of the PVC the source snapshot was taken of (its selected node), where a
    /// node-local driver keeps the snapshot: the restored PVC is placed there.
    pub snapshot_node: Option<String>,
    /// The smart clone's temporary VolumeSnapshot.
    pub temp_snapshot: Option<VolumeSnapshot>,
    /// The host-assisted clone source pod.
    pub source_pod: Option<Pod>,
    /// The pod that grows `disk.img`.
    pub resize_pod: Option<Pod>,
    /// Facts of the strategy choice.
    pub facts: CloneFacts,
    /// The clone source pod's client certificate Secret, in the source namespace (None: the
    /// upload server takes plain HTTP, or no certificate is issued yet).
    pub client_secret: Option<String>,
    /// The PVC a source snapshot is restored into for a host-assisted copy.
    pub restore: Option<PersistentVolumeClaim>,
    /// A StorageClass of the source snapshot's driver, to restore it with (read while the
    /// restore is not made).
    pub restore_class: Option<String>,
}

/// The source PVC or snapshot as far as the clone needs it: `Err` with the awaited message.
fn source_ready(kind: CloneSourceKind, ns: &str, n: &str, o: &CloneObserved) -> Result<(), String> {
    match kind {
        CloneSourceKind::Pvc => match &o.source_pvc {
            None => Err(format!("The source pvc {ns}/{n} doesn't exist")),
            Some(p) if p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") => {
                Err(format!("The source pvc {ns}/{n} is not bound"))
            }
            Some(_) => Ok(()),
        },
        CloneSourceKind::Snapshot => match &o.source_snapshot {
            None => Err(format!("The source snapshot {ns}/{n} doesn't exist")),
            Some(s) if !s.ready() => Err(format!("The source snapshot {ns}/{n} is not ready")),
            Some(_) => Ok(()),
        },
    }
}

/// Bytes the source holds: the PVC's capacity, or the snapshot's `restoreSize`.
fn source_size(kind: CloneSourceKind, o: &CloneObserved) -> Option<u64> {
    match kind {
        CloneSourceKind::Pvc => o.source_pvc.as_ref().and_then(capacity),
        CloneSourceKind::Snapshot => {
            let q = o
                .source_snapshot
                .as_ref()?
                .status
                .as_ref()?
                .restore_size
                .as_ref()?;
            quantity::parse(&q.0).ok()
        }
    }
}

fn volume_mode(p: &PersistentVolumeClaim) -> Option<VolumeMode> {
    VolumeMode::parse(p.spec.as_ref()?.volume_mode.as_deref()).ok()
}

/// Bytes the DataVolume asks for, before any filesystem overhead (a clone copies the source's
/// overhead along, so a target that asks for its source's size needs no expansion).
fn requested(dv: &api::DataVolume, claim: &Claim) -> u64 {
    let resources = match (&dv.spec.storage, &dv.spec.pvc) {
        (Some(s), _) => s.resources.as_ref(),
        (None, Some(p)) => p.resources.as_ref(),
        (None, None) => None,
    };
    storage_request(resources).unwrap_or(claim.size)
}

/// The bytes of `resources.requests.storage`, when it is there and parses.
fn storage_request(
    resources: Option<&k8s_openapi::api::core::v1::VolumeResourceRequirements>,
) -> Option<u64> {
    let q = resources?.requests.as_ref()?.get("storage")?;
    quantity::parse(&q.0).ok()
}

/// The strategy the target PVC records.
fn recorded(pvc: &PersistentVolumeClaim) -> Option<Strategy> {
    let a = pvc.metadata.annotations.as_ref()?.get(ANN_CLONE_TYPE)?;
    Strategy::parse(a)
}

/// Decides the next step of a clone into the DataVolume's PVC.
pub(in crate::datavolume) fn decide_clone(cx: &mut Ctx<'_>, src: &CloneSource, claim: &Claim) {
    let dv_ns = cx.dv.metadata.namespace.clone().unwrap_or_default();
    let src_ns = src.namespace_or(&dv_ns).to_string();
    let o = &cx.obs.clone;
    let from = format!("{src_ns}/{}", src.name);
    let into = format!("{dv_ns}/{}", name(cx.dv));

    // Every step checks the token: a DataVolume edited to name another source stops.
    let key = cx.cfg.clone_token_key.as_ref();
    if let TokenCheck::Refused(why) = token::check(cx.dv, src, key) {
        let message = format!("{CLONE_VALIDATION_FAILED_MESSAGE}: {why}");
        crate::datavolume::decide::wait_for_source(cx, CLONE_VALIDATION_FAILED, &message);
        return;
    }

    let strategy = match cx.obs.pvc.and_then(recorded) {
        Some(s) => s,
        None => {
            if let Err(message) = source_ready(src.kind, &src_ns, &src.name, o) {
                crate::datavolume::decide::wait_for_source(
                    cx,
                    event::CLONE_WITHOUT_SOURCE,
                    &message,
                );
                return;
            }
            let facts = CloneFacts {
                source_volume_mode: match src.kind {
                    CloneSourceKind::Pvc => o.source_pvc.as_ref().and_then(volume_mode),
                    // A snapshot keeps its source's mode; CDI records it in an annotation.
                    CloneSourceKind::Snapshot => Some(claim.mode),
                },
                target_volume_mode: Some(claim.mode),
                source_size: source_size(src.kind, o),
                // the claim as it is made (a `storage` request inflated for filesystem overhead,
                // as the source's was when this controller made it): PVC bytes against PVC
                // bytes, so a target that asks for its source's size is never too small
                target_size: Some(claim.size),
                cross_namespace: src_ns != dv_ns,
                target_on_source_node: None,
                ..o.facts.clone()
            };
            let choice = match choose_strategy(src.kind, &facts) {
                Ok(c) => c,
                Err(e) => {
                    cx.fail(
                        event::ERR_INCOMPATIBLE_PVC,
                        &e.to_string(),
                        event::ERR_INCOMPATIBLE_PVC,
                    );
                    return;
                }
            };
            if let Some((why, message)) = choice.fallback
                && cx.st.phase != Some(Phase::CloneScheduled)
            {
                cx.event(true, why, message.to_string());
            }
            choice.strategy
        }
    };
    match strategy {
        Strategy::HostAssisted => host_assisted(cx, src, claim, &src_ns, &from, &into),
        Strategy::CsiClone | Strategy::Snapshot => by_driver(cx, src, claim, strategy, &from),
    }
}

/// CSI clone and snapshot restore: the driver copies; Quarry creates and waits.
fn by_driver(cx: &mut Ctx<'_>, src: &CloneSource, claim: &Claim, strategy: Strategy, from: &str) {
    let o = &cx.obs.clone;
    let node = match src.kind {
        CloneSourceKind::Pvc => o.source_pvc.as_ref().and_then(node_of).map(String::from),
        CloneSourceKind::Snapshot => o.snapshot_node.clone(),
    };
    let size = source_size(src.kind, o).unwrap_or(claim.size);
    let (data_source, phase, ev, message) = match (src.kind, strategy) {
        (CloneSourceKind::Snapshot, _) => (
            objects::snapshot_source(&src.name),
            Phase::CloneFromSnapshotSourceInProgress,
            event::CLONE_FROM_SNAPSHOT_SOURCE_IN_PROGRESS,
            format!("Creating PVC from snapshot source {from} is in progress"),
        ),
        (CloneSourceKind::Pvc, Strategy::CsiClone) => (
            objects::pvc_source(&src.name),
            Phase::CsiCloneInProgress,
            event::CSI_CLONE_IN_PROGRESS,
            format!("CSI Volume clone in progress (for pvc {from})"),
        ),
        (CloneSourceKind::Pvc, _) => (
            objects::snapshot_source(&objects::temp_snapshot_name(cx.dv)),
            Phase::SmartClonePvcInProgress,
            event::SMART_CLONE_PVC_IN_PROGRESS,
            format!("Creating PVC for smart-clone is in progress (for pvc {from})"),
        ),
    };
    let Some(target) = cx.obs.pvc else {
        if src.kind == CloneSourceKind::Pvc && strategy == Strategy::Snapshot {
            smart_clone_snapshot(cx, src, claim, from, node.as_deref(), size);
            return;
        }
        let pvc = objects::target_pvc(cx.dv, claim, data_source, size, node.as_deref(), strategy);
        cx.actions.push(Action::CreatePvc(Box::new(pvc)));
        pending_target(cx);
        cx.phase(phase, Some((false, ev, message)));
        return;
    };
    if target.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        // Said again on every look: the DataVolume read may predate the last status write.
        pending_target(cx);
        if cx.obs.wait_for_first_consumer && objects::node_of(target).is_none() {
            // no node to put it on (a snapshot of unknown origin): it binds with its consumer
            cx.wait_for_first_consumer();
            return;
        }
        cx.phase(phase, Some((false, ev, message)));
        return;
    }
    let msg = format!("PVC {} Bound", name(cx.dv));
    cx.cond(condition::BOUND, true, reason::BOUND, &msg);
    if let Some(s) = &cx.obs.clone.temp_snapshot
        && s.metadata.deletion_timestamp.is_none()
    {
        cx.actions
            .push(Action::DeleteSnapshot(objects::temp_snapshot_name(cx.dv)));
    }
    expand(cx, target, claim, size, from);
}

/// The smart clone before its PVC: the temporary snapshot, taken and awaited.
fn smart_clone_snapshot(
    cx: &mut Ctx<'_>,
    src: &CloneSource,
    claim: &Claim,
    from: &str,
    node: Option<&str>,
    size: u64,
) {
    match &cx.obs.clone.temp_snapshot {
        None => {
            let class = cx.obs.clone.facts.snapshot_class.clone();
            let s = objects::temp_snapshot(cx.dv, &src.name, class.as_deref());
            cx.actions.push(Action::CreateSnapshot(Box::new(s)));
            cx.requeue = Some(cx.cfg.progress_interval);
        }
        Some(s) if s.ready() => {
            let restore = s
                .status
                .as_ref()
                .and_then(|st| st.restore_size.as_ref())
                .and_then(|q| quantity::parse(&q.0).ok())
                .unwrap_or(size);
            let pvc = objects::target_pvc(
                cx.dv,
                claim,
                objects::snapshot_source(&objects::temp_snapshot_name(cx.dv)),
                restore,
                node,
                Strategy::Snapshot,
            );
            cx.actions.push(Action::CreatePvc(Box::new(pvc)));
            pending_target(cx);
            cx.phase(
                Phase::SmartClonePvcInProgress,
                Some((
                    false,
                    event::SMART_CLONE_PVC_IN_PROGRESS,
                    format!("Creating PVC for smart-clone is in progress (for pvc {from})"),
                )),
            );
            return;
        }
        // Snapshots are not watched: look again soon.
        Some(_) => cx.requeue = Some(cx.cfg.progress_interval),
    }
    pending_target(cx);
    cx.phase(
        Phase::SnapshotForSmartCloneInProgress,
        Some((
            false,
            event::SNAPSHOT_FOR_SMART_CLONE_IN_PROGRESS,
            format!("Creating snapshot for smart-clone is in progress (for pvc {from})"),
        )),
    );
}

fn pending_target(cx: &mut Ctx<'_>) {
    let msg = format!("PVC {} Pending", name(cx.dv));
    cx.cond(condition::BOUND, false, reason::PENDING, &msg);
}

/// After a CSI clone or restore at the source's size `base`: the PVC's request grows to the
/// DataVolume's, then (filesystem) `disk.img` grows to the usable space; then the clone is done.
fn expand(cx: &mut Ctx<'_>, target: &PersistentVolumeClaim, claim: &Claim, base: u64, from: &str) {
    let want = requested(cx.dv, claim);
    let asked =
        storage_request(target.spec.as_ref().and_then(|s| s.resources.as_ref())).unwrap_or(want);
    let has = target
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref()?.get("storage"))
        .and_then(|q| quantity::parse(&q.0).ok())
        .unwrap_or(asked);
    // Derived from the sizes, not the recorded phase (which may be stale).
    if want <= base {
        return succeed(cx, from, None);
    }
    let message = format!("Expanding PVC {} to {want} bytes", name(cx.dv));
    if asked < want {
        cx.actions
            .push(Action::ExpandPvc(Quantity(want.to_string())));
    }
    cx.phase(
        Phase::ExpansionInProgress,
        Some((false, event::EXPANSION_IN_PROGRESS, message)),
    );
    if has < want || asked < want {
        // The resizer's capacity change is watched (the PVC is).
        return;
    }
    if claim.mode == VolumeMode::Block {
        return succeed(cx, from, None);
    }
    match &cx.obs.clone.resize_pod {
        None => {
            let size = usable_space(has, claim.overhead);
            let p = objects::resize_pod(cx.dv, claim, size, cx.cfg);
            cx.actions.push(Action::CreatePod(Box::new(p)));
        }
        Some(p) => match crate::datavolume::decide::pod_phase(p) {
            "Succeeded" => succeed(cx, from, p.metadata.name.clone()),
            "Failed" => {
                let (code, msg) =
                    crate::datavolume::decide::terminated(p).unwrap_or((-1, String::new()));
                let message = format!(
                    "Growing disk.img of {} failed: {msg} (exit code {code})",
                    name(cx.dv)
                );
                cx.fail(event::CLONE_FAILED, &message, event::CLONE_FAILED);
                cx.actions.push(Action::DeletePod(
                    p.metadata.name.clone().unwrap_or_default(),
                ));
            }
            _ => {}
        },
    }
}

fn succeed(cx: &mut Ctx<'_>, from: &str, pod_to_delete: Option<String>) {
    cx.cond(
        condition::RUNNING,
        false,
        reason::COMPLETED,
        event::CLONE_COMPLETE,
    );
    cx.cond(condition::READY, true, "", "");
    cx.st.progress = Some(status::format_progress(100.0));
    let message = format!("Successfully cloned from {from} into {}", name(cx.dv));
    cx.phase(
        Phase::Succeeded,
        Some((false, event::CLONE_SUCCEEDED, message)),
    );
    if let Some(p) = pod_to_delete {
        cx.actions.push(Action::DeletePod(p));
    }
}

/// Host-assisted: the target and its upload server as for an upload, then the source pod.
fn host_assisted(
    cx: &mut Ctx<'_>,
    src: &CloneSource,
    claim: &Claim,
    src_ns: &str,
    from: &str,
    into: &str,
) {
    if matches!(
        cx.cfg.upload_tls,
        Some(crate::settings::UploadTls::Shared { .. })
    ) && cx.obs.clone.source_pod.is_none()
    {
        crate::datavolume::decide::wait_for_source(
            cx,
            event::HOST_ASSISTED_CLONE_NOT_POSSIBLE,
            SHARED_TLS_REFUSED,
        );
        return;
    }
    let scheduled = |cx: &mut Ctx<'_>| {
        cx.phase(
            Phase::CloneScheduled,
            Some((
                false,
                event::CLONE_SCHEDULED,
                format!("Cloning from {from} into {into} scheduled"),
            )),
        );
    };
    if !crate::datavolume::decide::claim_ready(cx, claim) {
        // A new target records the strategy.
        for a in &mut cx.actions {
            if let Action::CreatePvc(p) = a {
                p.metadata.annotations.get_or_insert_default().insert(
                    ANN_CLONE_TYPE.into(),
                    Strategy::HostAssisted.as_str().into(),
                );
            }
        }
        if cx.st.phase != Some(Phase::WaitForFirstConsumer) {
            scheduled(cx);
        }
        if cx.obs.pvc.is_none() || !cx.obs.wait_for_first_consumer {
            return;
        }
    }
    // A snapshot is copied from a PVC restored from it, in its namespace.
    let source = match src.kind {
        CloneSourceKind::Pvc => {
            let o = &cx.obs.clone;
            let pvc = o.source_pvc.as_ref();
            (
                src.name.clone(),
                pvc.and_then(volume_mode),
                pvc.and_then(node_of).map(String::from),
            )
        }
        CloneSourceKind::Snapshot => match restore(cx, claim, src_ns, &src.name) {
            Some(r) => r,
            None => return,
        },
    };
    let target_uid = crate::datavolume::decide::pvc_uid(cx);
    let source_pod = cx.obs.clone.source_pod.clone();
    let Some(upload) = cx.obs.pod else {
        crate::datavolume::decide::start_pod(
            cx,
            &crate::datavolume::source::Source::Upload,
            claim,
            Work::Upload,
        );
        scheduled(cx);
        return;
    };
    if upload.metadata.deletion_timestamp.is_some() {
        return;
    }
    let delete_source = |cx: &mut Ctx<'_>| {
        if let Some(p) = &source_pod {
            cx.actions.push(Action::DeleteSourcePod {
                namespace: src_ns.to_string(),
                name: p.metadata.name.clone().unwrap_or_default(),
            });
        }
    };
    // The upload server takes data: the transfer can be under way.
    let serving = |phase: &str| phase == "Running" && crate::datavolume::decide::pod_ready(upload);
    match crate::datavolume::decide::pod_phase(upload) {
        "Succeeded" => {
            succeed(cx, from, None);
            crate::datavolume::decide::remove_pod(cx, pod::upload_name(name(cx.dv)), Work::Upload);
            delete_source(cx);
            if cx.obs.clone.restore.is_some() {
                cx.actions.push(Action::DeleteRestore {
                    namespace: src_ns.to_string(),
                    name: objects::restore_name(cx.dv),
                });
            }
        }
        "Failed" => {
            let upload_name = upload.metadata.name.clone().unwrap_or_default();
            crate::datavolume::decide::pod_failed(cx, upload, upload_name, Work::Upload);
            delete_source(cx);
        }
        // The source pod starts beside the upload server, not after it: its start and its scan
        // of the source overlap the server's, and it waits until the server answers.
        upload_phase => match &source_pod {
            None => {
                let (pvc, mode, node) = &source;
                let spec = SourcePodSpec {
                    namespace: src_ns,
                    pvc,
                    mode: mode.unwrap_or(VolumeMode::Filesystem),
                    node: node.as_deref(),
                    target_uid: &target_uid,
                    tls_secret: cx.obs.clone.client_secret.as_deref(),
                };
                let p = objects::source_pod(&pod::Workload::of(cx.dv), &spec, cx.cfg);
                cx.actions.push(Action::CreateSourcePod(Box::new(p)));
                cx.requeue = Some(cx.cfg.progress_interval);
                if !serving(upload_phase) {
                    crate::datavolume::decide::pending_reason(cx, upload);
                }
                scheduled(cx);
            }
            // The source pod is not watched (another namespace, no owner): look again soon.
            Some(p) => match crate::datavolume::decide::pod_phase(p) {
                "Running" | "Succeeded" if serving(upload_phase) => {
                    cx.requeue = Some(cx.cfg.progress_interval);
                    cx.transfer_running();
                    // The source pod's progress counter, read as an importer's.
                    cx.observed_progress();
                    cx.phase(
                        Phase::CloneInProgress,
                        Some((
                            false,
                            event::CLONE_IN_PROGRESS,
                            format!("Cloning from {from} into {into} in progress"),
                        )),
                    );
                }
                "Failed" => {
                    // The upload server keeps waiting: a new source pod starts over.
                    let message = objects::source_pod_failed(p);
                    cx.cond(condition::RUNNING, false, event::CLONE_FAILED, &message);
                    cx.event(true, event::CLONE_FAILED, message);
                    delete_source(cx);
                }
                _ => {
                    cx.requeue = Some(cx.cfg.progress_interval);
                    if !serving(upload_phase) {
                        crate::datavolume::decide::pending_reason(cx, upload);
                    }
                    scheduled(cx)
                }
            },
        },
    }
}

/// The PVC a snapshot is copied from (its name, mode and node): restored from the snapshot in
/// its namespace, made here when missing; None when it cannot be made (the DataVolume failed).
fn restore(
    cx: &mut Ctx<'_>,
    claim: &Claim,
    src_ns: &str,
    snapshot: &str,
) -> Option<(String, Option<VolumeMode>, Option<String>)> {
    let o = &cx.obs.clone;
    let name = objects::restore_name(cx.dv);
    if let Some(r) = &o.restore {
        return Some((name, volume_mode(r), node_of(r).map(String::from)));
    }
    if o.source_pod.is_some() {
        // Its source pod outlived it: it fails and is replaced once the restore is back.
        return Some((name, None, o.snapshot_node.clone()));
    }
    let Some(class) = o.restore_class.clone() else {
        let message =
            format!("no StorageClass of snapshot {src_ns}/{snapshot}'s driver to restore it with");
        cx.fail(reason::INVALID_SPEC, &message, reason::DATA_VOLUME_FAILED);
        return None;
    };
    let snap = o.source_snapshot.as_ref();
    // The mode of the volume snapshotted, as CDI records it on the snapshots it takes; else the
    // target's (CDI's assumption).
    let mode = snap
        .and_then(|s| s.metadata.annotations.as_ref()?.get(ANN_SOURCE_VOLUME_MODE))
        .and_then(|m| VolumeMode::parse(Some(m)).ok())
        .unwrap_or(claim.mode);
    let node = o.snapshot_node.clone();
    let r = objects::Restore {
        namespace: src_ns,
        snapshot,
        class: &class,
        mode,
        size: source_size(CloneSourceKind::Snapshot, o).unwrap_or(claim.size),
        node: node.as_deref(),
    };
    let pvc = objects::restore_pvc(cx.dv, &r);
    cx.actions.push(Action::CreateRestore(Box::new(pvc)));
    Some((name, Some(mode), node))
}

#[cfg(test)]
mod tests {
    //! One test per rule of the clone steps, each driving [`crate::datavolume::decide`].

    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PodCondition, PodStatus,
    };
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::datavolume::clone::token::testing::{config as token_config, sign_for};
    use crate::datavolume::decide::{Decision, Observed, decide};
    use crate::datavolume::pod::SourceRefs;
    use crate::datavolume::status;
    use crate::datavolume::tests::events;
    use crate::settings::Config;
    use api::DataVolume;
    use api::snapshot::VolumeSnapshotStatus;

    const GI: u64 = 1 << 30;
    const DRIVER: &str = "kubevirt.io.hostpath-provisioner";

    fn dv(source: serde_json::Value, size: &str, mode: &str) -> DataVolume {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "vm-disk", "namespace": "vms", "uid": "dv-uid"},
            "spec": {"source": source,
                     "storage": {"accessModes": ["ReadWriteOnce"], "volumeMode": mode,
                                 "resources": {"requests": {"storage": size}}}}
        }))
        .unwrap()
    }

    /// A clone of `ns/golden-disk`, with the webhook's token.
    fn pvc_clone(ns: &str) -> DataVolume {
        let mut d = dv(
            serde_json::json!({"pvc": {"namespace": ns, "name": "golden-disk"}}),
            "1Gi",
            "Filesystem",
        );
        sign_for(&mut d, CloneSourceKind::Pvc, (ns, "golden-disk"));
        d
    }

    fn claim_pvc(phase: &str, request: u64, capacity: Option<u64>) -> PersistentVolumeClaim {
        let q = |b: u64| BTreeMap::from([("storage".to_string(), Quantity(b.to_string()))]);
        let mut p = PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: Some("hostpath-csi".into()),
                resources: Some(k8s_openapi::api::core::v1::VolumeResourceRequirements {
                    requests: Some(q(request)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some(phase.into()),
                capacity: capacity.map(q),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.uid = Some("pvc-uid".into());
        p.metadata.name = Some("vm-disk".into());
        p
    }

    fn source_pvc() -> PersistentVolumeClaim {
        let mut p = claim_pvc("Bound", GI, Some(GI));
        p.metadata.name = Some("golden-disk".into());
        p.metadata.annotations = Some(BTreeMap::from([(
            objects::ANN_SELECTED_NODE.to_string(),
            "node-a".to_string(),
        )]));
        p
    }

    fn target(
        strategy: Strategy,
        phase: &str,
        request: u64,
        capacity: Option<u64>,
    ) -> PersistentVolumeClaim {
        let mut p = claim_pvc(phase, request, capacity);
        p.metadata.annotations = Some(BTreeMap::from([(
            ANN_CLONE_TYPE.to_string(),
            strategy.as_str().to_string(),
        )]));
        p
    }

    fn facts(profile: &str) -> CloneFacts {
        CloneFacts {
            profile_strategy: Some(profile.into()),
            source_driver: Some(DRIVER.into()),
            target_driver: Some(DRIVER.into()),
            snapshot_class: Some("hostpath-snapclass".into()),
            allow_expansion: true,
            ..Default::default()
        }
    }

    fn snapshot(ready: bool, restore: u64) -> VolumeSnapshot {
        let mut s = objects::temp_snapshot(&pvc_clone("vms"), "golden-disk", None);
        s.status = Some(VolumeSnapshotStatus {
            ready_to_use: Some(ready),
            restore_size: Some(Quantity(restore.to_string())),
            ..Default::default()
        });
        s
    }

    fn pod_in(name: &str, phase: &str, ready: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    fn observed<'a>(
        pvc: Option<&'a PersistentVolumeClaim>,
        pod: Option<&'a Pod>,
        clone: CloneObserved,
    ) -> Observed<'a> {
        Observed {
            pvc,
            pod,
            service: pod.is_some(),
            wait_for_first_consumer: false,
            csi_class: Some(false),
            progress: None,
            refs: SourceRefs::default(),
            storage: Default::default(),
            source_ref: None,
            clone,
            refused: None,
            now: Timestamp::from_second(1_800_000_000).unwrap(),
        }
    }

    fn step(dv: &mut DataVolume, o: &Observed<'_>) -> Decision {
        let d = decide(dv, o, &token_config());
        dv.status = Some(d.status.clone());
        d
    }

    fn objects_of(d: &Decision) -> Vec<&Action> {
        d.actions
            .iter()
            .filter(|a| !matches!(a, Action::Event(_)))
            .collect()
    }

    fn created_pvc(d: &Decision) -> &PersistentVolumeClaim {
        d.actions
            .iter()
            .find_map(|a| match a {
                Action::CreatePvc(p) => Some(&**p),
                _ => None,
            })
            .expect("a CreatePvc action")
    }

    fn with_pvc(profile: &str) -> CloneObserved {
        CloneObserved {
            source_pvc: Some(source_pvc()),
            facts: facts(profile),
            ..Default::default()
        }
    }

    #[test]
    fn a_missing_source_waits_with_clone_without_source_and_creates_nothing() {
        let mut dv = pvc_clone("vms");
        let d = step(&mut dv, &observed(None, None, CloneObserved::default()));
        assert_eq!(d.status.phase, Some(Phase::Pending));
        assert!(objects_of(&d).is_empty());
        assert_eq!(events(&d), [(true, "CloneWithoutSource".to_string())]);
        let bound = status::find(&d.status.conditions, condition::BOUND).unwrap();
        assert_eq!(
            bound.message.as_deref(),
            Some("The source pvc vms/golden-disk doesn't exist")
        );
    }

    #[test]
    fn a_csi_clone_creates_the_target_from_the_source_on_its_node() {
        let mut dv = pvc_clone("vms");
        let d = step(&mut dv, &observed(None, None, with_pvc("csi-clone")));
        assert_eq!(d.status.phase, Some(Phase::CsiCloneInProgress));
        assert_eq!(events(&d), [(false, "CSICloneInProgress".to_string())]);
        let p = created_pvc(&d);
        let ds = p.spec.as_ref().unwrap().data_source.as_ref().unwrap();
        assert_eq!(
            (ds.kind.as_str(), ds.name.as_str()),
            ("PersistentVolumeClaim", "golden-disk")
        );
        let ann = p.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[objects::ANN_SELECTED_NODE], "node-a");
        assert_eq!(ann[ANN_CLONE_TYPE], "csi-clone");
    }

    #[test]
    fn a_bound_clone_target_of_the_requested_size_succeeds() {
        let mut dv = pvc_clone("vms");
        step(&mut dv, &observed(None, None, with_pvc("csi-clone")));
        let t = target(Strategy::CsiClone, "Bound", GI, Some(GI));
        let d = step(&mut dv, &observed(Some(&t), None, with_pvc("csi-clone")));
        assert_eq!(d.status.phase, Some(Phase::Succeeded));
        assert_eq!(d.status.progress.as_deref(), Some("100.00%"));
        assert_eq!(events(&d), [(false, "CloneSucceeded".to_string())]);
        assert!(objects_of(&d).is_empty());
        let running = status::find(&d.status.conditions, condition::RUNNING).unwrap();
        assert_eq!(running.message.as_deref(), Some("Clone Complete"));
    }

    #[test]
    fn a_smart_clone_first_snapshots_the_source_with_its_drivers_class() {
        let mut dv = pvc_clone("vms");
        let d = step(&mut dv, &observed(None, None, with_pvc("snapshot")));
        assert_eq!(d.status.phase, Some(Phase::SnapshotForSmartCloneInProgress));
        let [Action::CreateSnapshot(s)] = &objects_of(&d)[..] else {
            panic!("{:?}", d.actions)
        };
        assert_eq!(
            s.spec.volume_snapshot_class_name.as_deref(),
            Some("hostpath-snapclass")
        );
        assert_eq!(
            s.spec.source.persistent_volume_claim_name.as_deref(),
            Some("golden-disk")
        );
        assert!(d.requeue.is_some(), "snapshots are not watched");
    }

    #[test]
    fn a_smart_clone_restores_once_the_snapshot_is_ready() {
        let mut dv = pvc_clone("vms");
        let waiting = CloneObserved {
            temp_snapshot: Some(snapshot(false, GI)),
            ..with_pvc("snapshot")
        };
        let d = step(&mut dv, &observed(None, None, waiting));
        assert!(objects_of(&d).is_empty());
        assert_eq!(d.status.phase, Some(Phase::SnapshotForSmartCloneInProgress));
        let ready = CloneObserved {
            temp_snapshot: Some(snapshot(true, GI)),
            ..with_pvc("snapshot")
        };
        let d = step(&mut dv, &observed(None, None, ready));
        assert_eq!(d.status.phase, Some(Phase::SmartClonePvcInProgress));
        let ds = created_pvc(&d)
            .spec
            .as_ref()
            .unwrap()
            .data_source
            .clone()
            .unwrap();
        assert_eq!(
            (ds.kind.as_str(), ds.name.as_str()),
            ("VolumeSnapshot", "cdi-tmp-dv-uid")
        );
    }

    #[test]
    fn the_temporary_snapshot_is_deleted_once_the_target_is_bound() {
        let mut dv = pvc_clone("vms");
        let t = target(Strategy::Snapshot, "Bound", GI, Some(GI));
        let o = CloneObserved {
            temp_snapshot: Some(snapshot(true, GI)),
            ..with_pvc("snapshot")
        };
        let d = step(&mut dv, &observed(Some(&t), None, o));
        assert_eq!(
            objects_of(&d),
            [&Action::DeleteSnapshot("cdi-tmp-dv-uid".into())]
        );
        assert_eq!(d.status.phase, Some(Phase::Succeeded));
    }

    #[test]
    fn a_snapshot_source_is_restored_directly() {
        let mut dv = dv(
            serde_json::json!({"snapshot": {"namespace": "vms", "name": "golden-snap"}}),
            "1Gi",
            "Filesystem",
        );
        let o = CloneObserved {
            source_snapshot: Some(snapshot(true, GI)),
            facts: facts("snapshot"),
            ..Default::default()
        };
        let d = step(&mut dv, &observed(None, None, o));
        assert_eq!(
            d.status.phase,
            Some(Phase::CloneFromSnapshotSourceInProgress)
        );
        let ds = created_pvc(&d)
            .spec
            .as_ref()
            .unwrap()
            .data_source
            .clone()
            .unwrap();
        assert_eq!(ds.name, "golden-snap");
    }

    /// A snapshot in another namespace (a golden image kept as a snapshot, cloned for a VM) is
    /// copied host-assisted, as CDI: restored into a PVC of its namespace, on its node, in the
    /// mode it was taken in, which the clone source pod reads; the restore goes once done.
    #[test]
    fn a_snapshot_of_another_namespace_is_restored_there_and_copied_host_assisted() {
        let mut dv = dv(
            serde_json::json!({"snapshot": {"namespace": "golden", "name": "fedora-snap"}}),
            "1Gi",
            "Block",
        );
        sign_for(
            &mut dv,
            CloneSourceKind::Snapshot,
            ("golden", "fedora-snap"),
        );
        let mut snap = snapshot(true, GI);
        snap.metadata.annotations = Some(BTreeMap::from([(
            ANN_SOURCE_VOLUME_MODE.to_string(),
            "Filesystem".to_string(),
        )]));
        let o = |restore: Option<PersistentVolumeClaim>, source_pod: Option<Pod>| CloneObserved {
            source_snapshot: Some(snap.clone()),
            snapshot_node: Some("node-s".into()),
            restore_class: Some("hostpath-csi".into()),
            restore,
            source_pod,
            facts: facts("snapshot"),
            ..Default::default()
        };
        let d = step(&mut dv, &observed(None, None, o(None, None)));
        assert!(
            events(&d).contains(&(true, "CrossNamespaceClone".to_string())),
            "{d:?}"
        );
        assert_eq!(
            created_pvc(&d).metadata.annotations.as_ref().unwrap()[ANN_CLONE_TYPE],
            "copy"
        );
        let t = target(Strategy::HostAssisted, "Bound", GI, Some(GI));
        let d = step(&mut dv, &observed(Some(&t), None, o(None, None)));
        let restore = d
            .actions
            .iter()
            .find_map(|a| match a {
                Action::CreateRestore(p) => Some(p.as_ref().clone()),
                _ => None,
            })
            .expect("the snapshot's restore");
        assert_eq!(
            restore.metadata.name.as_deref(),
            Some("dv-uid-host-assisted-source-pvc")
        );
        assert_eq!(restore.metadata.namespace.as_deref(), Some("golden"));
        assert_eq!(restore.metadata.owner_references, None);
        let ann = restore.metadata.annotations.clone().unwrap();
        assert_eq!(ann[crate::datavolume::ANN_OWNED_BY], "vms/vm-disk");
        assert_eq!(ann[objects::ANN_SELECTED_NODE], "node-s");
        let spec = restore.spec.clone().unwrap();
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(spec.storage_class_name.as_deref(), Some("hostpath-csi"));
        assert_eq!(spec.data_source.unwrap().name, "fedora-snap");
        assert!(d.actions.iter().any(|a| matches!(a, Action::CreatePod(_))));

        // The upload server ready: the source pod reads the restore, on the snapshot's node.
        let upload = pod_in("cdi-upload-vm-disk", "Running", true);
        let mut restored = restore.clone();
        restored.metadata.annotations = Some(ann);
        let d = step(
            &mut dv,
            &observed(Some(&t), Some(&upload), o(Some(restored.clone()), None)),
        );
        let [Action::CreateSourcePod(sp)] = &objects_of(&d)[..] else {
            panic!("{:?}", d.actions)
        };
        let pod_spec = sp.spec.as_ref().unwrap();
        let claim = pod_spec
            .volumes
            .iter()
            .flatten()
            .find_map(|v| v.persistent_volume_claim.as_ref());
        assert_eq!(claim.unwrap().claim_name, "dv-uid-host-assisted-source-pvc");
        assert!(
            serde_json::to_string(&pod_spec.affinity)
                .unwrap()
                .contains("node-s")
        );
        let args = pod_spec.containers[0].args.clone().unwrap().join(" ");
        assert!(
            args.contains("/data/disk.img"),
            "a Filesystem snapshot's disk: {args}"
        );

        // Done: the pods, the Service and the restore go.
        let done = pod_in("cdi-upload-vm-disk", "Succeeded", false);
        let running = pod_in("pvc-uid-source-pod", "Running", true);
        let d = step(
            &mut dv,
            &observed(Some(&t), Some(&done), o(Some(restored), Some(running))),
        );
        assert_eq!(d.status.phase, Some(Phase::Succeeded));
        assert!(d.actions.contains(&Action::DeleteRestore {
            namespace: "golden".into(),
            name: "dv-uid-host-assisted-source-pvc".into()
        }));

        // No class of the snapshot's driver: failed, saying so.
        let mut fresh = dv.clone();
        fresh.status = None;
        let d = step(
            &mut fresh,
            &observed(
                Some(&t),
                None,
                CloneObserved {
                    restore_class: None,
                    ..o(None, None)
                },
            ),
        );
        assert_eq!(d.status.phase, Some(Phase::Failed), "{d:?}");
    }

    #[test]
    fn a_larger_target_expands_the_pvc_then_grows_disk_img() {
        let mut dv = dv(
            serde_json::json!({"pvc": {"namespace": "vms", "name": "golden-disk"}}),
            "2Gi",
            "Filesystem",
        );
        let want = 2 * GI;
        let o = || with_pvc("csi-clone");
        // Created at the source's size.
        let d = step(&mut dv, &observed(None, None, o()));
        let req = &created_pvc(&d)
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"];
        assert_eq!(req.0, GI.to_string());
        // Bound: the request grows.
        let t = target(Strategy::CsiClone, "Bound", GI, Some(GI));
        let d = step(&mut dv, &observed(Some(&t), None, o()));
        assert_eq!(d.status.phase, Some(Phase::ExpansionInProgress));
        assert!(objects_of(&d).contains(&&Action::ExpandPvc(Quantity(want.to_string()))));
        // Asked, not grown yet: wait.
        let t = target(Strategy::CsiClone, "Bound", want, Some(GI));
        let d = step(&mut dv, &observed(Some(&t), None, o()));
        assert!(objects_of(&d).is_empty());
        // Grown: disk.img grows to the usable space.
        let t = target(Strategy::CsiClone, "Bound", want, Some(want));
        let d = step(&mut dv, &observed(Some(&t), None, o()));
        let [Action::CreatePod(p)] = &objects_of(&d)[..] else {
            panic!("{:?}", d.actions)
        };
        let args = p.spec.as_ref().unwrap().containers[0].args.clone().unwrap();
        assert_eq!(args[0], "resize-disk");
        assert_eq!(
            args[4],
            usable_space(want, crate::settings::DEFAULT_FILESYSTEM_OVERHEAD).to_string()
        );
        // Grown: done, the pod goes.
        let resize = CloneObserved {
            resize_pod: Some(pod_in("cdi-expand-vm-disk", "Succeeded", false)),
            ..o()
        };
        let d = step(&mut dv, &observed(Some(&t), None, resize));
        assert_eq!(d.status.phase, Some(Phase::Succeeded));
        assert_eq!(
            objects_of(&d),
            [&Action::DeletePod("cdi-expand-vm-disk".into())]
        );
    }

    #[test]
    fn a_larger_block_target_needs_no_resize_pod() {
        let mut dv = dv(
            serde_json::json!({"pvc": {"namespace": "vms", "name": "golden-disk"}}),
            "2Gi",
            "Block",
        );
        let mut src = source_pvc();
        src.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let o = || CloneObserved {
            source_pvc: Some(src.clone()),
            facts: facts("csi-clone"),
            ..Default::default()
        };
        step(&mut dv, &observed(None, None, o()));
        let t = target(Strategy::CsiClone, "Bound", GI, Some(GI));
        step(&mut dv, &observed(Some(&t), None, o()));
        let t = target(Strategy::CsiClone, "Bound", 2 * GI, Some(2 * GI));
        let d = step(&mut dv, &observed(Some(&t), None, o()));
        assert_eq!(d.status.phase, Some(Phase::Succeeded));
        assert!(objects_of(&d).is_empty());
    }

    #[test]
    fn a_target_smaller_than_the_source_fails() {
        let mut dv = dv(
            serde_json::json!({"pvc": {"namespace": "vms", "name": "golden-disk"}}),
            "100Mi",
            "Filesystem",
        );
        let d = step(&mut dv, &observed(None, None, with_pvc("csi-clone")));
        assert_eq!(d.status.phase, Some(Phase::Failed));
        assert!(objects_of(&d).is_empty());
        assert_eq!(events(&d), [(true, "ErrIncompatiblePVC".to_string())]);
    }

    #[test]
    fn a_source_made_by_a_storage_request_clones_into_the_same_request() {
        // The source DataVolume asked for 1Gi: its PVC was inflated for filesystem overhead.
        let inflated = crate::datavolume::pvc::required_space(GI, 0.055);
        let mut o = with_pvc("csi-clone");
        o.source_pvc = Some(claim_pvc("Bound", inflated, Some(inflated)));
        let mut dv = pvc_clone("vms");
        let d = step(&mut dv, &observed(None, None, o));
        assert_ne!(d.status.phase, Some(Phase::Failed), "{:?}", events(&d));
        assert_eq!(
            created_pvc(&d)
                .spec
                .as_ref()
                .unwrap()
                .data_source
                .as_ref()
                .unwrap()
                .kind,
            "PersistentVolumeClaim"
        );
    }

    #[test]
    fn the_strategy_recorded_on_the_target_is_kept() {
        // The profile now says csi-clone, but the target was made for a copy.
        let mut dv = pvc_clone("vms");
        let t = target(Strategy::HostAssisted, "Bound", GI, Some(GI));
        let d = step(&mut dv, &observed(Some(&t), None, with_pvc("csi-clone")));
        assert!(
            matches!(&objects_of(&d)[..], [Action::CreatePod(p), Action::CreateService(_)]
            if p.metadata.name.as_deref() == Some("cdi-upload-vm-disk"))
        );
        assert_eq!(d.status.phase, Some(Phase::CloneScheduled));
    }

    #[test]
    fn a_cross_namespace_clone_runs_host_assisted_through_the_upload_server() {
        let mut dv = pvc_clone("golden");
        let o = |source_pod: Option<Pod>| CloneObserved {
            source_pod,
            ..with_pvc("csi-clone")
        };
        // The target, recording the strategy; a Warning says why not CSI.
        let d = step(&mut dv, &observed(None, None, o(None)));
        assert_eq!(d.status.phase, Some(Phase::CloneScheduled));
        assert_eq!(
            events(&d),
            [
                (true, "CrossNamespaceClone".to_string()),
                (false, "CloneScheduled".to_string())
            ]
        );
        let p = created_pvc(&d);
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[ANN_CLONE_TYPE],
            "copy"
        );
        assert!(p.spec.as_ref().unwrap().data_source.is_none());
        // Bound: the upload server and its Service.
        let t = target(Strategy::HostAssisted, "Bound", GI, Some(GI));
        // The DataVolume's preallocation reaches the server writing the copy, as CDI's.
        let server = |d: &Decision| {
            let [Action::CreatePod(p), Action::CreateService(_)] = &objects_of(d)[..] else {
                panic!("{:?}", d.actions)
            };
            let argv = p.spec.as_ref().unwrap().containers[0].args.clone().unwrap();
            uploader::cli::parse_args::<uploader::cli::ServerArgs>(&argv[1..]).unwrap()
        };
        let mut preallocated = dv.clone();
        preallocated.spec.preallocation = Some(true);
        let o_t = observed(Some(&t), None, o(None));
        assert!(server(&decide(&preallocated, &o_t, &token_config())).preallocate);
        let d = step(&mut dv, &o_t);
        assert!(!server(&d).preallocate);
        // The upload server made, still pending: the source pod starts beside it, in the
        // source namespace (it waits for the server to answer).
        let pending = pod_in("cdi-upload-vm-disk", "Pending", false);
        let d = step(&mut dv, &observed(Some(&t), Some(&pending), o(None)));
        let [Action::CreateSourcePod(sp)] = &objects_of(&d)[..] else {
            panic!("{:?}", d.actions)
        };
        assert_eq!(sp.metadata.name.as_deref(), Some("pvc-uid-source-pod"));
        assert_eq!(sp.metadata.namespace.as_deref(), Some("golden"));
        assert_eq!(d.status.phase, Some(Phase::CloneScheduled));
        // The source pod runs before the server is ready: still scheduled, not in progress.
        let running = pod_in("pvc-uid-source-pod", "Running", true);
        let d = step(
            &mut dv,
            &observed(Some(&t), Some(&pending), o(Some(running.clone()))),
        );
        assert!(objects_of(&d).is_empty(), "{:?}", d.actions);
        assert_eq!(d.status.phase, Some(Phase::CloneScheduled));
        // The upload server ready and the source pod running: CloneInProgress.
        let upload = pod_in("cdi-upload-vm-disk", "Running", true);
        let d = step(
            &mut dv,
            &observed(Some(&t), Some(&upload), o(Some(running.clone()))),
        );
        assert_eq!(d.status.phase, Some(Phase::CloneInProgress));
        assert_eq!(events(&d), [(false, "CloneInProgress".to_string())]);
        // Its progress, read from the source pod, shows; a failed read keeps the last one.
        let mut read = observed(Some(&t), Some(&upload), o(Some(running.clone())));
        read.progress = Some(37.5);
        let d = step(&mut dv, &read);
        assert_eq!(d.status.progress.as_deref(), Some("37.50%"));
        read.progress = None;
        let d = step(&mut dv, &read);
        assert_eq!(d.status.progress.as_deref(), Some("37.50%"));
        // The upload server is done: Succeeded, and every pod and the Service go.
        let done = pod_in("cdi-upload-vm-disk", "Succeeded", false);
        let d = step(&mut dv, &observed(Some(&t), Some(&done), o(Some(running))));
        assert_eq!(d.status.phase, Some(Phase::Succeeded));
        assert_eq!(
            objects_of(&d),
            [
                &Action::DeletePod("cdi-upload-vm-disk".into()),
                &Action::DeleteService("cdi-upload-vm-disk".into()),
                &Action::DeleteSourcePod {
                    namespace: "golden".into(),
                    name: "pvc-uid-source-pod".into()
                },
            ]
        );
    }

    #[test]
    fn a_cross_namespace_clone_without_a_valid_token_creates_nothing() {
        // Created while the webhook was absent: no token.
        let mut bare = dv(
            serde_json::json!({"pvc": {"namespace": "golden", "name": "golden-disk"}}),
            "1Gi",
            "Filesystem",
        );
        let d = step(&mut bare, &observed(None, None, with_pvc("copy")));
        assert!(objects_of(&d).is_empty(), "{:?}", d.actions);
        assert_eq!(d.status.phase, Some(Phase::Pending));
        assert_eq!(events(&d), [(true, CLONE_VALIDATION_FAILED.to_string())]);
        let bound = status::find(&d.status.conditions, condition::BOUND).unwrap();
        assert_eq!(bound.reason.as_deref(), Some(CLONE_VALIDATION_FAILED));
        assert_eq!(
            bound.message.as_deref(),
            Some("The clone doesn't meet the validation requirements: clone token missing")
        );
        // Edited after admission to name another source: the running clone stops short of
        // its source pod.
        let mut edited = pvc_clone("golden");
        edited
            .spec
            .source
            .as_mut()
            .unwrap()
            .pvc
            .as_mut()
            .unwrap()
            .name = "secret-disk".into();
        let t = target(Strategy::HostAssisted, "Bound", GI, Some(GI));
        let upload = pod_in("cdi-upload-vm-disk", "Running", true);
        let d = step(
            &mut edited,
            &observed(Some(&t), Some(&upload), with_pvc("copy")),
        );
        assert!(objects_of(&d).is_empty(), "{:?}", d.actions);
        // Without a key to check with, nothing crosses namespaces either.
        let signed = pvc_clone("golden");
        let d = decide(
            &signed,
            &observed(None, None, with_pvc("copy")),
            &Config::default(),
        );
        assert!(objects_of(&d).is_empty());
    }

    #[test]
    fn shared_upload_tls_refuses_a_host_assisted_clone_clearly_and_creates_nothing() {
        let mut dv = pvc_clone("golden");
        let cfg = Config {
            upload_tls: Some(crate::settings::UploadTls::Shared {
                secret: "upload-tls".into(),
                client_ca_config_map: None,
            }),
            ..token_config()
        };
        let d = decide(&dv, &observed(None, None, with_pvc("copy")), &cfg);
        dv.status = Some(d.status.clone());
        assert!(objects_of(&d).is_empty(), "{:?}", d.actions);
        assert_eq!(d.status.phase, Some(Phase::Pending));
        let bound = status::find(&d.status.conditions, condition::BOUND).unwrap();
        assert_eq!(
            bound.reason.as_deref(),
            Some(event::HOST_ASSISTED_CLONE_NOT_POSSIBLE)
        );
        assert_eq!(bound.message.as_deref(), Some(SHARED_TLS_REFUSED));
        assert_eq!(
            events(&d),
            [(true, event::HOST_ASSISTED_CLONE_NOT_POSSIBLE.to_string())]
        );
        // A CSI clone in the namespace needs no upload server: it goes ahead.
        let local = pvc_clone("vms");
        let d = decide(&local, &observed(None, None, with_pvc("csi-clone")), &cfg);
        assert!(matches!(&objects_of(&d)[..], [Action::CreatePvc(_)]));
    }

    #[test]
    fn a_failed_source_pod_is_replaced_while_the_upload_server_waits() {
        let mut dv = pvc_clone("golden");
        let t = target(Strategy::HostAssisted, "Bound", GI, Some(GI));
        let upload = pod_in("cdi-upload-vm-disk", "Running", true);
        let o = CloneObserved {
            source_pod: Some(pod_in("pvc-uid-source-pod", "Failed", false)),
            ..with_pvc("copy")
        };
        let d = step(&mut dv, &observed(Some(&t), Some(&upload), o));
        assert_eq!(
            objects_of(&d),
            [&Action::DeleteSourcePod {
                namespace: "golden".into(),
                name: "pvc-uid-source-pod".into()
            }]
        );
        assert_eq!(events(&d), [(true, "CloneFailed".to_string())]);
    }

    #[test]
    fn a_pending_target_shows_its_strategys_phase_even_after_a_stale_read() {
        // The DataVolume as read before the CSICloneInProgress write: still Pending.
        let mut dv = pvc_clone("vms");
        let t = target(Strategy::CsiClone, "Pending", GI, None);
        let d = step(&mut dv, &observed(Some(&t), None, with_pvc("csi-clone")));
        assert_eq!(d.status.phase, Some(Phase::CsiCloneInProgress));
        assert!(objects_of(&d).is_empty());
    }

    #[test]
    fn expansion_follows_the_sizes_not_the_recorded_phase() {
        // Expanded already, but the read predates ExpansionInProgress: disk.img still grows.
        let mut dv = dv(
            serde_json::json!({"pvc": {"namespace": "vms", "name": "golden-disk"}}),
            "2Gi",
            "Filesystem",
        );
        let t = target(Strategy::CsiClone, "Bound", 2 * GI, Some(2 * GI));
        let d = step(&mut dv, &observed(Some(&t), None, with_pvc("csi-clone")));
        assert_eq!(d.status.phase, Some(Phase::ExpansionInProgress));
        assert!(matches!(&objects_of(&d)[..], [Action::CreatePod(_)]));
    }
}
