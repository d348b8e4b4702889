//! The DataVolume controller: CDI's DataVolume lifecycle with the logic in pure functions.
//!
//! - [`source`]: the checked source of a DataVolume;
//! - [`pvc`]: the PVC to create (CDI's size inflation and defaults);
//! - [`pod`]: the importer pod (`quarry import`), the upload server pod and Service;
//! - [`status`]: conditions, progress, CDI's phases and event reasons;
//! - [`decide`]: the state machine: observed PVC and pod in, status and actions out;
//! - [`retry`]: terminal versus retryable failures and the back-off;
//! - [`controller`]: the kube-runtime controller that executes the actions;
//! - [`local`]: `quarry apply` / `quarry get dv` without a cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::api::DataVolume;

pub mod controller;
pub mod decide;
pub mod local;
pub mod pod;
pub mod pvc;
pub mod retry;
pub mod source;
pub mod status;
#[cfg(test)]
mod tests;

pub use decide::{Action, Decision, Observed, decide};
pub use retry::RetryPolicy;

/// Annotation naming the DataVolume that owns a PVC (CDI's).
pub const ANN_OWNED_BY: &str = "cdi.kubevirt.io/ownedByDataVolume";
/// DataVolume annotation: keep the PVC when the DataVolume is deleted.
pub const ANN_RETAIN_PVC: &str = "quarry.kubevirt.io/retainPVC";
/// Pod label naming the PVC a pod populates (the upload Service selects on it).
pub const LABEL_TARGET: &str = "cdi.kubevirt.io/uploadTarget";
/// Finalizer that cleans up pods (and the PVC) when a DataVolume is deleted.
pub const FINALIZER: &str = "quarry.kubevirt.io/datavolume-cleanup";
/// CDI's default filesystem overhead (`0.055`).
pub const DEFAULT_FILESYSTEM_OVERHEAD: f64 = 0.055;

/// Upload server TLS material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadTls {
    /// Secret with `tls.crt` and `tls.key`.
    pub secret: String,
    /// ConfigMap with the upload proxy's client CA as `ca.crt`.
    pub client_ca_config_map: Option<String>,
}

/// Settings of the DataVolume controller (CDI's CDIConfig, and the pod image).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Image with the `quarry` binary, for importer and upload pods.
    pub image: String,
    /// Pull policy of that image.
    pub pull_policy: Option<String>,
    /// Global filesystem overhead.
    pub filesystem_overhead: f64,
    /// Filesystem overhead per StorageClass.
    pub filesystem_overhead_per_class: BTreeMap<String, f64>,
    /// StorageClass for `spec.storage` without one (None: the cluster default).
    pub default_storage_class: Option<String>,
    /// Registries reached without TLS verification (`HOST[:PORT]`).
    pub insecure_registries: Vec<String>,
    /// Resources of importer and upload pods.
    pub resources: Option<ResourceRequirements>,
    /// Retries of failed pods.
    pub retry: RetryPolicy,
    /// Leave a WaitForFirstConsumer PVC unbound until its consumer appears (CDI's
    /// HonorWaitForFirstConsumer); when false, the importer pod is the first consumer.
    pub honor_wait_for_first_consumer: bool,
    /// TLS of upload servers (None: plain HTTP inside the cluster).
    pub upload_tls: Option<UploadTls>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            image: "quay.io/quarry/quarry:latest".into(),
            pull_policy: None,
            filesystem_overhead: DEFAULT_FILESYSTEM_OVERHEAD,
            filesystem_overhead_per_class: BTreeMap::new(),
            default_storage_class: None,
            insecure_registries: Vec::new(),
            resources: None,
            retry: RetryPolicy::default(),
            honor_wait_for_first_consumer: true,
            upload_tls: None,
        }
    }
}

impl Config {
    /// The filesystem overhead for a StorageClass.
    pub fn overhead(&self, class: Option<&str>) -> f64 {
        class
            .and_then(|c| self.filesystem_overhead_per_class.get(c))
            .copied()
            .unwrap_or(self.filesystem_overhead)
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
