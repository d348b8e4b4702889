//! DataVolumes filled by the volume populators, CDI's default on CSI storage: the DataVolume
//! makes a VolumeImportSource or VolumeUploadSource and a PVC whose `dataSourceRef` names it;
//! [`crate::populator`] does the work, and the DataVolume's phase, progress, restarts and
//! conditions follow the annotations the populator keeps on the PVC. The PVC binds only once
//! its data is in place, so nothing can use a half-written disk.
//!
//! Import: Pending (PendingPopulation while a WaitForFirstConsumer PVC waits for its consumer)
//! → ImportScheduled → ImportInProgress → Succeeded | Failed; uploads as their own flow.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::decide::{Action, Ctx};
use super::pvc::{self, Claim};
use super::retry;
use super::source::Source;
use super::status::{self, reason};
use super::{ANN_IMMEDIATE_BINDING, labels, name, owner_ref};
use crate::populator::{
    ANN_POD_PHASE, ANN_POD_READY, ANN_POD_RESTARTS, ANN_PRIORITY_CLASS, ANN_PROGRESS,
    ANN_RUNNING_MESSAGE, ANN_RUNNING_REASON, ANN_SELECTED_NODE, annotation,
};
use api::datavolume::{DataVolumeSource, condition};
use api::populator::{ImportSourceType, VolumeImportSourceSpec, VolumeUploadSourceSpec};
use api::{DataVolume, Phase};

/// DataVolume annotation (CDI's): `"false"` keeps a DataVolume off the populators, `"true"`
/// puts it on them whatever its StorageClass.
pub const ANN_USE_POPULATOR: &str = "cdi.kubevirt.io/storage.usePopulator";

/// The populator source a DataVolume makes: its metadata and spec.
#[derive(Debug, Clone, PartialEq)]
pub enum PopulatorSource {
    /// A VolumeImportSource, for an import or a blank disk.
    Import(ObjectMeta, Box<VolumeImportSourceSpec>),
    /// A VolumeUploadSource, for an upload.
    Upload(ObjectMeta, VolumeUploadSourceSpec),
}

/// Whether the DataVolume is filled by a populator: as its PVC was made when there is one,
/// else as CDI decides: the annotation, or a CSI StorageClass (`csi_class`; None: no
/// populators here).
pub fn uses_populator(
    dv: &DataVolume,
    pvc: Option<&PersistentVolumeClaim>,
    csi_class: Option<bool>,
) -> bool {
    if let Some(pvc) = pvc {
        return crate::populator::source_ref(pvc).is_some();
    }
    let Some(csi_class) = csi_class else {
        return false;
    };
    match dv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_USE_POPULATOR))
    {
        Some(v) => v == "true",
        None => csi_class,
    }
}

/// Whether `src` is one the populators fill (clones keep their own flow).
pub fn populates(src: &Source) -> bool {
    matches!(src, Source::Import(_) | Source::Blank | Source::Upload)
}

/// Name of the source object a DataVolume makes (CDI's names).
fn source_name(dv: &DataVolume, upload: bool) -> String {
    let uid = dv.metadata.uid.as_deref().unwrap_or_default();
    if upload {
        format!("volume-upload-source-{uid}")
    } else {
        format!("volume-import-source-{uid}")
    }
}

fn meta(dv: &DataVolume, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: dv.metadata.namespace.clone(),
        labels: Some(labels(dv)),
        owner_references: owner_ref(dv).map(|o| vec![o]),
        ..Default::default()
    }
}

/// The VolumeImportSource or VolumeUploadSource of `dv`, for its PVC only.
fn populator_source(dv: &DataVolume, upload: bool) -> PopulatorSource {
    let s = dv.spec.source.clone().unwrap_or_default();
    if upload {
        return PopulatorSource::Upload(
            meta(dv, source_name(dv, true)),
            VolumeUploadSourceSpec {
                content_type: dv.spec.content_type,
                preallocation: dv.spec.preallocation,
            },
        );
    }
    let DataVolumeSource {
        http,
        s3,
        gcs,
        registry,
        blank,
        imageio,
        vddk,
        ..
    } = s;
    PopulatorSource::Import(
        meta(dv, source_name(dv, false)),
        Box::new(VolumeImportSourceSpec {
            source: Some(ImportSourceType {
                http,
                s3,
                registry,
                gcs,
                blank,
                imageio,
                vddk,
            }),
            preallocation: dv.spec.preallocation,
            content_type: dv.spec.content_type,
            target_claim: Some(name(dv).to_string()),
            ..Default::default()
        }),
    )
}

/// The PVC of a populated DataVolume: as [`pvc::desired_pvc`], naming its source, bound at
/// once when the DataVolume asks (or WaitForFirstConsumer is not honoured).
fn populated_pvc(cx: &Ctx<'_>, claim: &Claim, upload: bool) -> PersistentVolumeClaim {
    let mut p = pvc::desired_pvc(cx.dv, claim);
    let kind = if upload {
        api::populator::UPLOAD_KIND
    } else {
        api::populator::IMPORT_KIND
    };
    p.spec.get_or_insert_default().data_source_ref = Some(TypedObjectReference {
        api_group: Some(api::populator::GROUP.into()),
        kind: kind.into(),
        name: source_name(cx.dv, upload),
        namespace: None,
    });
    let ann = p.metadata.annotations.get_or_insert_default();
    if immediate(cx) {
        ann.insert(ANN_IMMEDIATE_BINDING.into(), "true".into());
    }
    // The populator's pods run at the DataVolume's priority (CDI passes it the same way).
    if let Some(class) = &cx.dv.spec.priority_class_name {
        ann.insert(ANN_PRIORITY_CLASS.into(), class.clone());
    }
    p
}

fn immediate(cx: &Ctx<'_>) -> bool {
    !cx.cfg.honor_wait_for_first_consumer
        || cx
            .dv
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ANN_IMMEDIATE_BINDING))
}

/// The DataVolume's steps when a populator fills it.
pub(super) fn decide_populated(cx: &mut Ctx<'_>, src: &Source, claim: &Claim) {
    let upload = matches!(src, Source::Upload);
    let pvc_name = name(cx.dv).to_string();
    let Some(pvc) = cx.obs.pvc else {
        let source = populator_source(cx.dv, upload);
        cx.actions
            .push(Action::CreatePopulatorSource(Box::new(source)));
        let p = populated_pvc(cx, claim, upload);
        cx.actions.push(Action::CreatePvc(Box::new(p)));
        let msg = format!("PVC {pvc_name} Pending");
        cx.cond(condition::BOUND, false, reason::PENDING, &msg);
        return;
    };
    let restarts: i32 = annotation(pvc, ANN_POD_RESTARTS)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    cx.st.restart_count = Some(cx.st.restart_count.unwrap_or(0).max(restarts));
    match pvc.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Bound") => succeeded(cx, &pvc_name, upload),
        Some("Lost") => {
            cx.cond(condition::BOUND, false, reason::CLAIM_LOST, "Claim Lost");
            let msg = format!("PVC {pvc_name} lost");
            cx.fail(reason::CLAIM_LOST, &msg, reason::ERR_CLAIM_LOST);
        }
        _ => {
            let msg = format!("PVC {pvc_name} Pending");
            cx.cond(condition::BOUND, false, reason::PENDING, &msg);
            populating(cx, pvc, &pvc_name, upload);
        }
    }
}

fn succeeded(cx: &mut Ctx<'_>, pvc_name: &str, upload: bool) {
    let msg = format!("PVC {pvc_name} Bound");
    cx.cond(condition::BOUND, true, reason::BOUND, &msg);
    let (ev, msg, done) = if upload {
        (
            reason::UPLOAD_SUCCEEDED,
            format!("Successfully uploaded into {pvc_name}"),
            "Upload Complete",
        )
    } else {
        (
            reason::IMPORT_SUCCEEDED,
            format!("Successfully imported into PVC {pvc_name}"),
            "Import Complete",
        )
    };
    cx.cond(condition::RUNNING, false, reason::COMPLETED, done);
    cx.cond(condition::READY, true, "", "");
    cx.st.progress = Some(status::format_progress(100.0));
    cx.phase(Phase::Succeeded, Some((false, ev, msg)));
}

/// The PVC is pending: the populator's pod, as its annotations tell.
fn populating(cx: &mut Ctx<'_>, pvc: &PersistentVolumeClaim, pvc_name: &str, upload: bool) {
    match annotation(pvc, ANN_POD_PHASE) {
        None => {
            let waits = cx.obs.wait_for_first_consumer
                && annotation(pvc, ANN_SELECTED_NODE).is_none()
                && annotation(pvc, ANN_IMMEDIATE_BINDING).is_none();
            if waits {
                cx.cond(
                    condition::RUNNING,
                    false,
                    reason::WAIT_FOR_FIRST_CONSUMER,
                    "the PVC waits for its first consumer",
                );
                cx.st.phase = Some(Phase::PendingPopulation);
            }
        }
        Some("Pending") if upload => cx.upload_scheduled(pvc_name),
        Some("Pending") => {
            cx.cond(condition::RUNNING, false, reason::PENDING, "");
            cx.phase(
                Phase::ImportScheduled,
                Some((
                    false,
                    reason::IMPORT_SCHEDULED,
                    format!("Import into {pvc_name} scheduled"),
                )),
            );
        }
        Some("Running") if upload => {
            cx.transfer_running();
            if annotation(pvc, ANN_POD_READY) == Some("true") {
                cx.phase(
                    Phase::UploadReady,
                    Some((
                        false,
                        reason::UPLOAD_READY,
                        format!("Upload into {pvc_name} ready"),
                    )),
                );
            } else if cx.st.phase != Some(Phase::UploadReady) {
                cx.upload_scheduled(pvc_name);
            }
        }
        Some("Running") | Some("Succeeded") => {
            cx.transfer_running();
            if !upload {
                cx.phase(
                    Phase::ImportInProgress,
                    Some((
                        false,
                        reason::IMPORT_IN_PROGRESS,
                        format!("Import into {pvc_name} in progress"),
                    )),
                );
            }
            if let Some(p) = annotation(pvc, ANN_PROGRESS).filter(|p| p.ends_with('%')) {
                cx.st.progress = Some(p.to_string());
            }
        }
        Some("Failed") => {
            let why = annotation(pvc, ANN_RUNNING_REASON).unwrap_or("Error");
            let message = annotation(pvc, ANN_RUNNING_MESSAGE).unwrap_or_default();
            let spent = cx.st.restart_count.unwrap_or(0).max(0) as u32 >= cx.cfg.retry.max_restarts;
            if retry::is_terminal(why) || spent {
                let ev = if upload {
                    reason::UPLOAD_FAILED
                } else {
                    reason::IMPORT_FAILED
                };
                cx.fail(why, message, ev);
            } else {
                cx.cond(condition::RUNNING, false, why, message);
                cx.cond(condition::READY, false, "", "");
            }
        }
        Some(_) => {}
    }
}
