//! The CSI snapshot API (`snapshot.storage.k8s.io/v1`, the external-snapshotter's CRDs, which
//! the cluster installs, not Quarry): the [`VolumeSnapshot`] fields a clone uses, and the one
//! field of a VolumeSnapshotClass it reads. [`VolumeSnapshot::crd`] is a schema for tests only
//! (the deploy bundle does not ship it, as neither CDI nor HCO do).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "snapshot.storage.k8s.io";

/// CDI's annotation on the snapshots it takes: the volume mode of the PVC snapshotted (a
/// snapshot does not say it before Kubernetes 1.29's `sourceVolumeMode`).
pub const ANN_SOURCE_VOLUME_MODE: &str = "cdi.kubevirt.io/storage.import.sourceVolumeMode";

/// Quarry's annotation on the snapshots it keeps: the node of the PVC snapshotted (its
/// `volume.kubernetes.io/selected-node`). A node-local driver (the hostpath one) keeps the
/// snapshot on that node, so a restore must be placed there; once the PVC is gone (a
/// DataImportCron's snapshot outlives its import) this is the only record of it.
pub const ANN_SOURCE_NODE: &str = "quarry.kubevirt.io/sourceNode";

/// A snapshot of a PVC.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "snapshot.storage.k8s.io",
    version = "v1",
    kind = "VolumeSnapshot",
    plural = "volumesnapshots",
    namespaced,
    status = "VolumeSnapshotStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSpec {
    /// What is snapshotted.
    pub source: VolumeSnapshotSource,
    /// The VolumeSnapshotClass (None: the default one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
}

/// A VolumeSnapshot's source: a PVC of its namespace, or a pre-provisioned content.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSource {
    /// The PVC to snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_name: Option<String>,
    /// A pre-provisioned VolumeSnapshotContent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_content_name: Option<String>,
}

/// What the snapshot controller reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    /// The snapshot can be restored from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// The smallest PVC a restore needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<Quantity>,
    /// The bound VolumeSnapshotContent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_volume_snapshot_content_name: Option<String>,
    /// The last error of the snapshot controller or driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<VolumeSnapshotError>,
}

/// A snapshot error.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct VolumeSnapshotError {
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl VolumeSnapshot {
    /// Whether the snapshot can be restored from.
    pub fn ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.ready_to_use)
            .unwrap_or(false)
    }
}
