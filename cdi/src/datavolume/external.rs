//! CDI's external population: a DataVolume with neither `spec.source` nor `spec.sourceRef` whose
//! claim (`spec.storage` or `spec.pvc`) names a `dataSourceRef` or `dataSource` gets its PVC with
//! it, and whoever that names fills it: a volume populator (CDI's own kinds are Quarry's
//! [`crate::populator`]), or Kubernetes' provisioner for a PVC or a VolumeSnapshot. The
//! DataVolume is Succeeded once the PVC is bound, as CDI's `datavolume-external-population`
//! controller decides.

use k8s_openapi::api::core::v1::TypedObjectReference;

use super::decide::{Action, Ctx, claim_ready, pvc_phase};
use super::pvc::Claim;
use super::status::{self, reason};
use super::{ANN_IMMEDIATE_BINDING, name};
use api::datavolume::condition;
use api::{DataVolume, Phase};

/// PVC annotation marking it as filled by an external populator (CDI's `AnnExternalPopulation`).
pub const ANN_EXTERNAL_POPULATION: &str = "cdi.kubevirt.io/externalPopulation";
/// Event: the PVC is bound with its data (CDI's).
const EXTERNAL_POPULATION_SUCCEEDED: &str = "ExternalPopulationSucceeded";
/// Event: a populator other than a snapshot needs a CSI driver (CDI's).
const NO_CSI_DRIVER: &str = "NoCSIDriverForExternalPopulation";

/// What fills the PVC of an externally populated DataVolume: its claim's `dataSourceRef`, else
/// its `dataSource`. None when the DataVolume has a source (or a sourceRef) of its own.
pub fn populator(dv: &DataVolume) -> Option<TypedObjectReference> {
    if dv.spec.source.is_some() || dv.spec.source_ref.is_some() {
        return None;
    }
    let (data_source, data_source_ref) = match (&dv.spec.storage, &dv.spec.pvc) {
        (Some(s), _) => (s.data_source.as_ref(), s.data_source_ref.as_ref()),
        (None, Some(p)) => (p.data_source.as_ref(), p.data_source_ref.as_ref()),
        (None, None) => return None,
    };
    data_source_ref.cloned().or_else(|| {
        data_source.map(|s| TypedObjectReference {
            api_group: s.api_group.clone(),
            kind: s.kind.clone(),
            name: s.name.clone(),
            namespace: None,
        })
    })
}

/// The steps of an externally populated DataVolume: its PVC (marked), then Pending (or
/// WaitForFirstConsumer) until it is bound, then Succeeded.
pub(super) fn decide_external(cx: &mut Ctx<'_>, claim: &Claim, by: &TypedObjectReference) {
    let pvc_name = name(cx.dv).to_string();
    let ready = claim_ready(cx, claim);
    // CDI passes the DataVolume's annotations on; immediate binding is the one a populator
    // reads (Quarry's does not wait for a consumer then).
    let immediate = kube::ResourceExt::annotations(cx.dv)
        .get(ANN_IMMEDIATE_BINDING)
        .cloned();
    for a in &mut cx.actions {
        if let Action::CreatePvc(p) = a {
            let ann = p.metadata.annotations.get_or_insert_default();
            ann.insert(ANN_EXTERNAL_POPULATION.into(), "true".into());
            if let Some(v) = &immediate {
                ann.insert(ANN_IMMEDIATE_BINDING.into(), v.clone());
            }
        }
    }
    // No pod of Quarry's consumes it: bound is the only "ready".
    let bound = cx.obs.pvc.is_some_and(|p| pvc_phase(p) == "Bound");
    if !ready || !bound {
        if cx.st.phase != Some(Phase::WaitForFirstConsumer) {
            cx.st.phase = Some(Phase::Pending);
        }
        return;
    }
    // Only a snapshot is restored without a CSI driver (CDI's rule).
    if by.kind != "VolumeSnapshot" && cx.obs.csi_class == Some(false) {
        let message = "No CSI drivers were found: External population not supported";
        cx.cond(condition::READY, false, NO_CSI_DRIVER, message);
        if cx.st.phase != Some(Phase::PvcBound) {
            cx.event(true, NO_CSI_DRIVER, message.into());
        }
        cx.st.phase = Some(Phase::PvcBound);
        return;
    }
    cx.cond(condition::RUNNING, false, reason::COMPLETED, "");
    cx.cond(condition::READY, true, "", "");
    cx.st.progress = Some(status::format_progress(100.0));
    let message = format!("PVC {pvc_name} successfully populated by {}", by.name);
    cx.phase(
        Phase::Succeeded,
        Some((false, EXTERNAL_POPULATION_SUCCEEDED, message)),
    );
}
