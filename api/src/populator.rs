//! CDI's volume populator sources (`cdi.kubevirt.io/v1beta1`): a PVC whose `spec.dataSourceRef`
//! names one of them is filled by Quarry's populator controller, and the `VolumePopulator`
//! registration (`populator.storage.k8s.io/v1beta1`) that tells the volume data source
//! validator somebody handles them.

use k8s_openapi::api::core::v1::TypedLocalObjectReference;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::datavolume::{
    ContentType, DataVolumeCheckpoint, Empty, SourceGcs, SourceHttp, SourceImageIo, SourceRegistry,
    SourceS3, SourceVddk,
};

/// The API group of every populator source, which a PVC's `dataSourceRef.apiGroup` names.
pub const GROUP: &str = "cdi.kubevirt.io";
/// The kind of [`VolumeImportSource`].
pub const IMPORT_KIND: &str = "VolumeImportSource";
/// The kind of [`VolumeUploadSource`].
pub const UPLOAD_KIND: &str = "VolumeUploadSource";
/// The kind of [`VolumeCloneSource`].
pub const CLONE_KIND: &str = "VolumeCloneSource";

/// Data imported from an HTTP, S3, GCS or registry source, or a blank disk, into the PVC that
/// names it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "VolumeImportSource",
    plural = "volumeimportsources",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeImportSourceSpec {
    /// Where the data comes from: exactly one member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ImportSourceType>,
    /// Allocate the whole volume in advance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preallocation: Option<bool>,
    /// `kubevirt` (a disk image, the default) or `archive`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<ContentType>,
    /// Only this claim may be populated from it (CDI's multistage imports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_claim: Option<String>,
    /// Stages of a multistage import (not supported).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints: Vec<DataVolumeCheckpoint>,
    /// Whether the current checkpoint is the last (not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_checkpoint: Option<bool>,
}

/// The sources a [`VolumeImportSource`] may name (CDI's `ImportSourceType`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportSourceType {
    /// An HTTP(S) URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<SourceHttp>,
    /// An S3 object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<Box<SourceS3>>,
    /// A containerDisk image in a registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<Box<SourceRegistry>>,
    /// A GCS object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcs: Option<Box<SourceGcs>>,
    /// A blank raw disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blank: Option<Empty>,
    /// oVirt imageio (not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imageio: Option<Box<SourceImageIo>>,
    /// VMware VDDK (not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vddk: Option<Box<SourceVddk>>,
}

/// Data uploaded by a client (`virtctl image-upload pvc`) into the PVC that names it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "VolumeUploadSource",
    plural = "volumeuploadsources",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeUploadSourceSpec {
    /// `kubevirt` (a disk image, the default) or `archive`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<ContentType>,
    /// Allocate the whole volume in advance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preallocation: Option<bool>,
}

/// A PVC or VolumeSnapshot of the same namespace whose data fills the PVC that names it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "VolumeCloneSource",
    plural = "volumeclonesources",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeCloneSourceSpec {
    /// The PVC (`kind: PersistentVolumeClaim`) or VolumeSnapshot (`apiGroup:
    /// snapshot.storage.k8s.io`) to copy.
    pub source: TypedLocalObjectReference,
    /// Allocate the whole volume in advance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preallocation: Option<bool>,
    /// Priority class of the pods that copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// The `VolumePopulator` registrations (`populator.storage.k8s.io/v1beta1`, cluster-scoped, the
/// volume data source validator's kind): each names a kind a PVC's `dataSourceRef` may name.
pub mod registration {
    use kube::core::{ApiResource, GroupVersionKind};

    /// Group of the `VolumePopulator` kind.
    pub const GROUP: &str = "populator.storage.k8s.io";
    /// Its version.
    pub const VERSION: &str = "v1beta1";
    /// Its kind.
    pub const KIND: &str = "VolumePopulator";

    /// The API resource, for a dynamic client.
    pub fn api_resource() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, VERSION, KIND),
            "volumepopulators",
        )
    }

    /// One registration per source kind, named as CDI names them.
    pub fn objects() -> Vec<serde_json::Value> {
        [super::IMPORT_KIND, super::UPLOAD_KIND, super::CLONE_KIND]
            .into_iter()
            .map(|kind| {
                serde_json::json!({
                    "apiVersion": format!("{GROUP}/{VERSION}"),
                    "kind": KIND,
                    "metadata": {"name": format!("{}-populator", kind.to_ascii_lowercase())},
                    "sourceKind": {"group": super::GROUP, "kind": kind},
                })
            })
            .collect()
    }
}
