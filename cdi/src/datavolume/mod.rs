//! The DataVolume controller: CDI's DataVolume lifecycle with the logic in pure functions.
//!
//! - [`source`]: the checked source of a DataVolume;
//! - [`classes`]: StorageClasses read once in a while (their provisioner and binding mode are
//!   immutable);
//! - [`pvc`]: the PVC to create (CDI's size inflation and defaults);
//! - [`pod`]: the importer pod (`quarry import`), the upload server pod and Service;
//! - [`status`]: conditions, progress, CDI's phases and event reasons;
//! - [`clone`]: clones: the strategy, its steps ([`clone::flow`]), the objects it makes
//!   ([`clone::objects`]), what it reads ([`clone::observe`]) and the signed clone token that
//!   authorizes one from another namespace ([`clone::token`]);
//! - [`populated`]: a DataVolume filled by the volume populators ([`crate::populator`]), CDI's
//!   default on CSI storage;
//! - [`external`]: a DataVolume whose PVC is filled by the populator its claim names (CDI's
//!   external population);
//! - [`adopt`]: a PVC populated before its DataVolume (CDI's `populatedFor`, `prePopulated`),
//!   adopted as it is;
//! - [`decide`]: the state machine: observed PVC and pod in, status and actions out;
//! - [`retry`]: terminal versus retryable failures and the back-off;
//! - [`controller`]: the kube-runtime controller that executes the actions;
//! - [`admission`]: CDI's validating webhook (spec edits refused, new DataVolumes checked);
//! - [`request`]: the importer's request for a source, with the objects it references.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

use crate::settings::Config;
use api::DataVolume;

pub mod admission;
pub mod adopt;
pub mod classes;
pub mod clone;
pub mod controller;
pub mod decide;
pub mod external;
pub mod pod;
pub mod populated;
pub mod pvc;
pub mod request;
pub mod retry;
pub mod source;
pub mod status;
#[cfg(test)]
mod tests;
pub mod upload_secret;

pub use decide::{Action, Decision, Observed, decide};

/// Annotation naming the DataVolume that owns a PVC (CDI's).
pub const ANN_OWNED_BY: &str = "cdi.kubevirt.io/ownedByDataVolume";
/// Marks the PVC of an upload DataVolume as an upload target (CDI's); the token API issues
/// upload tokens only for such PVCs.
pub const ANN_UPLOAD_TARGET: &str = "cdi.kubevirt.io/storage.upload.target";
/// CDI's PVC annotation naming the volume's content type (`kubevirt` or `archive`); virtctl
/// checks it before an archive upload.
pub const ANN_CONTENT_TYPE: &str = "cdi.kubevirt.io/storage.contentType";
/// DataVolume annotation (CDI's): bind the PVC at once, the importer being its first consumer,
/// even where WaitForFirstConsumer is honoured (DataImportCrons set it on their imports).
pub const ANN_IMMEDIATE_BINDING: &str = "cdi.kubevirt.io/storage.bind.immediate.requested";
/// DataVolume annotation: keep the PVC when the DataVolume is deleted.
pub const ANN_RETAIN_PVC: &str = "quarry.kubevirt.io/retainPVC";
/// Upload pod label: the UID of the PVC it fills (CDI's; the upload Service selects on it).
pub const LABEL_TARGET: &str = "cdi.kubevirt.io/uploadTarget";
/// Finalizer that cleans up pods (and the PVC) when a DataVolume is deleted.
pub const FINALIZER: &str = "quarry.kubevirt.io/datavolume-cleanup";
/// Every reason the controller would fail `dv` before running anything, one message each: the
/// source and the claim checks the controller itself applies ([`source::source`],
/// [`pvc::claim`]). Modes a StorageProfile may still complete are not required here.
pub fn validate(dv: &DataVolume, cfg: &Config) -> Result<(), Vec<String>> {
    let claim = pvc::claim(dv, cfg, &pvc::StorageDefaults::Builtin);
    // A sourceRef is checked once resolved (its DataSource may not exist yet); an external
    // populator has no source to check.
    let by_ref = dv.spec.source.is_none() && dv.spec.source_ref.is_some();
    let unchecked = by_ref || external::populator(dv).is_some();
    let source = (!unchecked)
        .then(|| source::source(&dv.spec).err())
        .flatten();
    let errors: Vec<String> = [source, claim.err()]
        .into_iter()
        .flatten()
        .map(|e| e.to_string())
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// The DataVolume's name (also its PVC's).
pub fn name(dv: &DataVolume) -> &str {
    dv.metadata.name.as_deref().unwrap_or_default()
}

/// Labels of every object made for a DataVolume.
pub fn labels(dv: &DataVolume) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app".to_string(), "containerized-data-importer".to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "quarry".to_string(),
        ),
        (
            "cdi.kubevirt.io/dataVolume".to_string(),
            name(dv).to_string(),
        ),
    ])
}

/// The owner reference of everything made for a DataVolume: its controller, blocking the
/// DataVolume's foreground deletion until the object is gone (as CDI's).
pub fn owner_ref(dv: &DataVolume) -> Option<OwnerReference> {
    Some(OwnerReference {
        block_owner_deletion: Some(true),
        ..dv.controller_owner_ref(&())?
    })
}
