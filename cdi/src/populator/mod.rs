//! CDI's volume populators: a PVC whose `spec.dataSourceRef` names a `VolumeImportSource` or a
//! `VolumeUploadSource` is filled as CDI fills it. A temporary claim PVC' (`prime-<uid>`) with
//! the same class, size and mode is bound (on the node the scheduler chose for the PVC, with
//! WaitForFirstConsumer) and filled by the importer or the upload server in one pass; its
//! PersistentVolume is then rebound to the PVC and PVC' deleted. No scratch claim ever.
//!
//! - [`decide`]: the state machine: the PVC, its source, PVC', its pod and volume in, API
//!   actions out;
//! - [`placement`]: the node of a PVC' bound at once with no consumer;
//! - [`controller`]: the kube-runtime controller that observes and carries them out, and the
//!   `VolumePopulator` registrations.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

pub mod controller;
pub mod decide;
pub mod placement;

pub use decide::{Action, Decision, Observed, PopulationSource, decide};

/// Target PVC annotation naming its PVC' (CDI's; the upload proxy of CDI routes by it).
pub const ANN_PRIME_NAME: &str = "cdi.kubevirt.io/storage.populator.pvcPrime";
/// Target PVC annotation: the population's progress (`N/A`, `12.34%`, `100.0%`), CDI's.
pub const ANN_PROGRESS: &str = "cdi.kubevirt.io/storage.populator.progress";
/// PVC' annotation: the kind of the source filling it (CDI's).
pub const ANN_POPULATOR_KIND: &str = "cdi.kubevirt.io/storage.populator.kind";
/// The node the scheduler chose for a WaitForFirstConsumer claim (Kubernetes').
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Target PVC annotation: the phase of the pod that fills it (CDI's).
pub const ANN_POD_PHASE: &str = "cdi.kubevirt.io/storage.pod.phase";
/// Target PVC annotation: the priority class of the pods that fill it (CDI's; a DataVolume's
/// `priorityClassName` goes on its PVC as this).
pub const ANN_PRIORITY_CLASS: &str = "cdi.kubevirt.io/storage.pod.priorityclassname";
/// Target PVC annotation: whether the pod that fills it is ready (an upload server takes data).
pub const ANN_POD_READY: &str = "cdi.kubevirt.io/storage.pod.ready";
/// Target PVC annotation: how many times the pod that fills it was started again (CDI's).
pub const ANN_POD_RESTARTS: &str = "cdi.kubevirt.io/storage.pod.restarts";
/// Target PVC annotations: the Running condition of the pod that fills it (CDI's).
pub const ANN_RUNNING: &str = "cdi.kubevirt.io/storage.condition.running";
/// Its reason.
pub const ANN_RUNNING_REASON: &str = "cdi.kubevirt.io/storage.condition.running.reason";
/// Its message.
pub const ANN_RUNNING_MESSAGE: &str = "cdi.kubevirt.io/storage.condition.running.message";

/// The annotation `key` of a PVC.
pub(crate) fn annotation<'a>(pvc: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    kube::ResourceExt::annotations(pvc)
        .get(key)
        .map(String::as_str)
}

/// PVC' of `target`: `prime-<uid>`, as CDI names it.
pub fn prime_name(target: &PersistentVolumeClaim) -> String {
    format!(
        "prime-{}",
        target.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// Labels of every object made for a population.
pub fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app".to_string(), "containerized-data-importer".to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "quarry".to_string(),
        ),
    ])
}

/// The kind named by `pvc.spec.dataSourceRef` when it is one of CDI's populator sources of the
/// PVC's own namespace, with the source's name.
pub fn source_ref(pvc: &PersistentVolumeClaim) -> Option<(&str, &str)> {
    let r = pvc.spec.as_ref()?.data_source_ref.as_ref()?;
    let ours = r.api_group.as_deref() == Some(api::populator::GROUP)
        && [
            api::populator::IMPORT_KIND,
            api::populator::UPLOAD_KIND,
            api::populator::CLONE_KIND,
        ]
        .contains(&r.kind.as_str())
        && r.namespace.as_deref().is_none_or(str::is_empty)
        && !r.name.is_empty();
    ours.then_some((r.kind.as_str(), r.name.as_str()))
}
