//! The DataVolume controller: CDI's DataVolume lifecycle with the logic in pure functions.
//!
//! - [`source`]: the checked source of a DataVolume;
//! - [`pvc`]: the PVC to create (CDI's size inflation and defaults);
//! - [`pod`]: the importer pod (`quarry import`), the upload server pod and Service;
//! - [`status`]: conditions, progress, CDI's phases and event reasons;
//! - [`clone`], [`clone_flow`], [`clone_objects`]: clones (strategy, phases, objects);
//! - [`clone_token`]: the signed clone token that authorizes a clone from another namespace;
//! - [`decide`]: the state machine: observed PVC and pod in, status and actions out;
//! - [`retry`]: terminal versus retryable failures and the back-off;
//! - [`controller`]: the kube-runtime controller that executes the actions;
//! - [`admission`]: CDI's validating webhook (spec edits refused, new DataVolumes checked);
//! - [`local`]: `quarry apply` / `quarry get dv` without a cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

use crate::api::DataVolume;
use crate::api::cdi::ImportProxy;

pub mod admission;
pub mod clone;
pub mod clone_flow;
pub mod clone_objects;
pub mod clone_observe;
pub mod clone_token;
pub mod controller;
pub mod decide;
pub mod local;
pub mod local_clone;
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
/// How often a running import's progress is read by default.
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(3);
/// CDI's default filesystem overhead (`0.055`).
pub const DEFAULT_FILESYSTEM_OVERHEAD: f64 = 0.055;

/// Upload server TLS material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadTls {
    /// One Secret with `tls.crt` and `tls.key`, in the DataVolume's namespace, for every upload
    /// server, and optionally a ConfigMap with the upload proxy's client CA as `ca.crt`.
    Shared {
        secret: String,
        client_ca_config_map: Option<String>,
    },
    /// As CDI does: per upload pod, a serving certificate for its Service issued from the cert
    /// controller's upload server signer in `namespace`, kept with the proxy's client CA bundle
    /// (`ca.crt`) in a Secret named as the pod, owned by the DataVolume ([`upload_secret`]).
    Issued { namespace: String },
}

pub mod upload_secret;

/// Settings of the DataVolume controller (CDI's CDIConfig, and the pod image): the flags, or the
/// CDI CR's `spec.config` with explicit flags over it ([`crate::cdiconfig`]).
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
    /// Resources of importer and upload pods (None: CDI's defaults, [`default_resources`]).
    pub resources: Option<ResourceRequirements>,
    /// Retries of failed pods.
    pub retry: RetryPolicy,
    /// Leave a WaitForFirstConsumer PVC unbound until its consumer appears (CDI's
    /// HonorWaitForFirstConsumer); when false, the importer pod is the first consumer.
    pub honor_wait_for_first_consumer: bool,
    /// TLS of upload servers (None: plain HTTP inside the cluster).
    pub upload_tls: Option<UploadTls>,
    /// How often a running import's progress is read (CDI: every few seconds).
    pub progress_interval: Duration,
    /// Proxy of importer pods (CDI's importProxy; unset fields: none).
    pub import_proxy: ImportProxy,
    /// Preallocate DataVolumes that do not say (CDI's global preallocation).
    pub preallocation: bool,
    /// Pull secrets of importer and upload pods.
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Checks the clone tokens the DataVolume webhook signs ([`clone_token`]); None: a clone
    /// from another namespace is refused.
    pub clone_token_key: Option<token::PublicKey>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            image: crate::deploy::DEFAULT_IMAGE.into(),
            pull_policy: None,
            filesystem_overhead: DEFAULT_FILESYSTEM_OVERHEAD,
            filesystem_overhead_per_class: BTreeMap::new(),
            default_storage_class: None,
            insecure_registries: Vec::new(),
            resources: None,
            retry: RetryPolicy::default(),
            honor_wait_for_first_consumer: true,
            upload_tls: None,
            progress_interval: DEFAULT_PROGRESS_INTERVAL,
            import_proxy: ImportProxy::default(),
            preallocation: false,
            image_pull_secrets: Vec::new(),
            clone_token_key: None,
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

/// Every reason the controller would fail `dv` before running anything, one message each: the
/// source and the claim checks the controller itself applies ([`source::source`],
/// [`pvc::claim`]). Modes a StorageProfile may still complete are not required here.
pub fn validate(dv: &DataVolume, cfg: &Config) -> Result<(), Vec<String>> {
    let claim = pvc::claim(dv, cfg, &pvc::StorageDefaults::Builtin);
    // A sourceRef is checked once resolved (its DataSource may not exist yet).
    let by_ref = dv.spec.source.is_none() && dv.spec.source_ref.is_some();
    let source = (!by_ref).then(|| source::source(&dv.spec).err()).flatten();
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

/// CDI's default podResourceRequirements of importer and upload pods: requests 100m CPU and
/// 60M memory, limits 750m CPU and 600M memory.
pub fn default_resources() -> ResourceRequirements {
    let q = |cpu: &str, mem: &str| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(mem.into())),
        ])
    };
    ResourceRequirements {
        requests: Some(q("100m", "60M")),
        limits: Some(q("750m", "600M")),
        ..Default::default()
    }
}
