//! PVCs populated before their DataVolume (CDI's `populatedFor` and `prePopulated`): a PVC
//! named like the DataVolume and annotated `cdi.kubevirt.io/storage.populatedFor: <its name>`
//! already holds the data. The DataVolume adopts it as it is: Succeeded at once (CDI's
//! `pvcRequiresWork` false: whatever the PVC's phase but Lost), the PVC gets the DataVolume as
//! its owner (unless retained), and no importer, upload server or clone ever runs for it.
//!
//! A DataVolume annotated `cdi.kubevirt.io/storage.prePopulated` (any value; CDI writes it on
//! the DataVolumes it adopted, and Velero's KubeVirt plugin on restored ones) never makes a
//! PVC or a pod: it stays Pending until its PVC, annotated `populatedFor`, appears.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::decide::{Action, Ctx, pvc_phase};
use super::status::{PROGRESS_UNKNOWN, reason};
use super::{name, owner_ref, pvc};
use api::datavolume::condition;
use api::{DataVolume, Phase};

/// PVC annotation naming the DataVolume a prepared PVC is for (CDI's): such a PVC may exist
/// before its DataVolume, which adopts it as already populated.
pub const ANN_POPULATED_FOR: &str = "cdi.kubevirt.io/storage.populatedFor";
/// DataVolume annotation (CDI's): its PVC is populated already; never make one or fill it.
pub const ANN_PRE_POPULATED: &str = "cdi.kubevirt.io/storage.prePopulated";

/// Whether `pvc` is annotated as populated for the DataVolume named `dv`.
pub fn populated_for(pvc: &PersistentVolumeClaim, dv: &str) -> bool {
    pvc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_POPULATED_FOR))
        .is_some_and(|n| n == dv)
}

/// Whether the DataVolume says its PVC is populated already.
pub fn pre_populated(dv: &DataVolume) -> bool {
    dv.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANN_PRE_POPULATED))
}

/// Whether the DataVolume's PVC (`pvc`, the one named like it, if any) is to be adopted, or
/// waited for, instead of filled: nothing about its source need be looked at then.
pub fn adopts(dv: &DataVolume, pvc: Option<&PersistentVolumeClaim>) -> bool {
    pre_populated(dv) || pvc.is_some_and(|p| populated_for(p, name(dv)))
}

/// Decides an adopting DataVolume ([`adopts`]); false (nothing decided) for any other.
pub(super) fn decide_adopted(cx: &mut Ctx<'_>) -> bool {
    if !adopts(cx.dv, cx.obs.pvc) {
        return false;
    }
    let pvc_name = name(cx.dv).to_string();
    cx.st.phase.get_or_insert(Phase::Pending);
    for c in [condition::READY, condition::BOUND, condition::RUNNING] {
        if super::status::find(&cx.st.conditions, c).is_none() {
            cx.cond(c, false, "", "");
        }
    }
    let Some(p) = cx.obs.pvc else {
        let msg = format!(
            "PVC {pvc_name} Pending: the DataVolume is {ANN_PRE_POPULATED} and waits for its PVC \
             annotated {ANN_POPULATED_FOR}: {pvc_name}"
        );
        cx.cond(condition::BOUND, false, reason::PENDING, &msg);
        return true;
    };
    let phase = pvc_phase(p);
    if p.metadata.deletion_timestamp.is_some() || !populated_for(p, &pvc_name) {
        // Being deleted, or (prePopulated) not the PVC populated for it: nothing is written to
        // it, as CDI does nothing then either.
        let msg = match p.metadata.deletion_timestamp {
            Some(_) => format!("PVC {pvc_name} is being deleted"),
            None => format!(
                "PVC {pvc_name} {phase}: the DataVolume is {ANN_PRE_POPULATED}, but the PVC is not \
                 annotated {ANN_POPULATED_FOR}: {pvc_name}; nothing is written to it"
            ),
        };
        let bound = phase == "Bound";
        let why = if bound {
            reason::BOUND
        } else {
            reason::PENDING
        };
        cx.cond(condition::BOUND, bound, why, &msg);
        if bound && cx.st.phase == Some(Phase::Pending) {
            cx.st.phase = Some(Phase::PvcBound);
        }
        return true;
    }
    if phase == "Lost" {
        cx.cond(condition::BOUND, false, reason::CLAIM_LOST, "Claim Lost");
        let msg = format!("PVC {pvc_name} lost");
        cx.fail(reason::CLAIM_LOST, &msg, reason::ERR_CLAIM_LOST);
        return true;
    }
    if let Some(owners) = adoption_owners(cx.dv, p) {
        cx.actions.push(Action::AdoptPvc {
            resource_version: p.metadata.resource_version.clone(),
            owners,
        });
    }
    let bound = phase == "Bound";
    let (why, msg) = match bound {
        true => (reason::BOUND, format!("PVC {pvc_name} Bound")),
        false => (reason::PENDING, format!("PVC {pvc_name} Pending")),
    };
    cx.cond(condition::BOUND, bound, why, &msg);
    cx.cond(condition::RUNNING, false, "", "");
    cx.cond(condition::READY, true, "", "");
    cx.st
        .progress
        .get_or_insert_with(|| PROGRESS_UNKNOWN.into());
    cx.st.phase = Some(Phase::Succeeded);
    super::decide::cleanup_after(cx);
    true
}

/// The owner references the adopted PVC is to have, or None when it needs no change (already
/// owned by the DataVolume, or the DataVolume retains its PVC). The DataVolume is added as the
/// PVC's controller, as CDI does, unless something else controls it already (a PVC has at most
/// one controller), then as a plain owner.
fn adoption_owners(dv: &DataVolume, p: &PersistentVolumeClaim) -> Option<Vec<OwnerReference>> {
    if pvc::retained(dv) {
        return None;
    }
    let ours = owner_ref(dv)?;
    let mut owners = p.metadata.owner_references.clone().unwrap_or_default();
    if owners.iter().any(|o| o.uid == ours.uid) {
        return None;
    }
    let controlled = owners.iter().any(|o| o.controller == Some(true));
    owners.push(OwnerReference {
        controller: Some(!controlled),
        ..ours
    });
    Some(owners)
}
