//! `DataVolume` in `cdi.kubevirt.io/v1beta1`, with CDI's field names so manifests written for CDI
//! are accepted unchanged (fields Quarry does not act on are kept, not rejected).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaimSpec, TypedLocalObjectReference, TypedObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The desired state of a DataVolume: where the data comes from and the volume it goes to.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "DataVolume",
    plural = "datavolumes",
    shortname = "dv",
    shortname = "dvs",
    category = "all",
    namespaced,
    status = "DataVolumeStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"The phase the data volume is in"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress","description":"Transfer progress in percentage if known, N/A otherwise"}"#,
    printcolumn = r#"{"name":"Restarts","type":"integer","jsonPath":".status.restartCount","description":"The number of times the transfer has been restarted."}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSpec {
    /// Where the data comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<DataVolumeSource>,
    /// An indirect reference to the source (a DataSource); accepted, not acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ref: Option<DataVolumeSourceRef>,
    /// The PVC to create, taken literally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<Box<PersistentVolumeClaimSpec>>,
    /// The storage to create, with defaults filled in (access mode, volume mode, overhead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
    /// PriorityClassName of the importer and upload pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// `kubevirt` (a disk image, the default) or `archive`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<ContentType>,
    /// Stages of a multistage import; accepted, not acted on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints: Vec<DataVolumeCheckpoint>,
    /// Whether the current checkpoint is the final one; accepted, not acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_checkpoint: Option<bool>,
    /// Allocate the whole volume in advance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preallocation: Option<bool>,
}

/// The content type of the imported data.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ContentType {
    /// A disk image, written as `disk.img` or onto the block device.
    #[default]
    #[serde(rename = "kubevirt")]
    Kubevirt,
    /// A tar archive extracted onto the filesystem (not supported by Quarry's importer).
    #[serde(rename = "archive")]
    Archive,
}

/// CDI's StorageSpec: a PVC spec whose unset fields CDI fills in.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Access modes; default ReadWriteOnce.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_modes: Vec<String>,
    /// Label query over volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The requested size (`resources.requests.storage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<VolumeResourceRequirements>,
    /// Binding reference to a PersistentVolume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_name: Option<String>,
    /// StorageClass of the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// `Filesystem` (default) or `Block`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<String>,
    /// Volume data source; accepted, passed through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_source: Option<TypedLocalObjectReference>,
    /// Volume data source reference; accepted, passed through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_source_ref: Option<TypedObjectReference>,
}

/// A stage of a multistage import.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct DataVolumeCheckpoint {
    /// Snapshot of the previous checkpoint.
    pub previous: String,
    /// Snapshot of this checkpoint.
    pub current: String,
}

/// The source of the data: exactly one member is set. The larger, rarer members are boxed: a
/// controller holds every DataVolume in memory, and each would carry room for all of them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSource {
    /// An HTTP(S) URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<SourceHttp>,
    /// An S3 object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<Box<SourceS3>>,
    /// A Google Cloud Storage object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcs: Option<Box<SourceGcs>>,
    /// A containerDisk image in a registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<Box<SourceRegistry>>,
    /// Clone of another PVC (not supported by this controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<SourcePvc>,
    /// Data uploaded by a client (virtctl image-upload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<Empty>,
    /// A blank raw image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blank: Option<Empty>,
    /// oVirt imageio (not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imageio: Option<Box<SourceImageIo>>,
    /// VMware VDDK (not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vddk: Option<Box<SourceVddk>>,
    /// A VolumeSnapshot (not supported by this controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SourcePvc>,
}

/// An oVirt imageio source (accepted, not supported).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceImageIo {
    /// ovirt-engine URL.
    pub url: String,
    /// Disk id.
    pub disk_id: String,
    /// Credentials Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
    /// CA ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config_map: Option<String>,
    /// Skip certificate verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
}

/// A VMware VDDK source (accepted, not supported).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceVddk {
    /// vCenter or ESXi URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// VM UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Disk backing file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_file: Option<String>,
    /// Certificate thumbprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thumbprint: Option<String>,
    /// Credentials Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
    /// VDDK init image.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "initImageURL"
    )]
    pub init_image_url: Option<String>,
    /// ConfigMap of extra VDDK arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_args: Option<String>,
}

/// An empty object (`upload: {}`, `blank: {}`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Empty {}

/// An HTTP(S) source.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceHttp {
    /// The URL.
    pub url: String,
    /// Secret with `accessKeyId` (user) and `secretKey` (password) for basic auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
    /// ConfigMap holding the CA certificate(s) to trust (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config_map: Option<String>,
    /// Extra request headers, `Name: value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_headers: Vec<String>,
    /// Secrets each holding extra headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_extra_headers: Vec<String>,
    /// Expected checksum of the download, `ALG:HEX`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

/// An S3 source.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceS3 {
    /// `s3://BUCKET/KEY` or `https://HOST/BUCKET/KEY`.
    pub url: String,
    /// Secret with `accessKeyId` and `secretKey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
    /// ConfigMap holding the CA certificate(s) to trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config_map: Option<String>,
}

/// A Google Cloud Storage source.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceGcs {
    /// `gs://BUCKET/OBJECT` or `https://HOST/BUCKET/OBJECT`.
    pub url: String,
    /// Secret whose `credentials.json` is a Google service-account key; without it the object
    /// is read anonymously.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
}

/// A registry (containerDisk) source.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceRegistry {
    /// `docker://HOST/NAME:TAG`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// OpenShift ImageStream (not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_stream: Option<String>,
    /// `pod` (default) or `node` (not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_method: Option<String>,
    /// Secret with `accessKeyId` and `secretKey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
    /// ConfigMap holding the registry's CA certificate(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config_map: Option<String>,
    /// Platform the image index resolves to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<PlatformOptions>,
}

/// Image platform selection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PlatformOptions {
    /// CPU architecture, e.g. `arm64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
}

/// A PVC or VolumeSnapshot to clone from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SourcePvc {
    /// Namespace of the source.
    pub namespace: String,
    /// Name of the source.
    pub name: String,
}

/// An indirect source reference.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct DataVolumeSourceRef {
    /// `DataSource`.
    pub kind: String,
    /// Namespace, defaults to the DataVolume's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

/// The observed state of a DataVolume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeStatus {
    /// The PVC holding the data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// The phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Transfer progress, `NN.NN%` or `N/A`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Times the populating pod has been restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<i32>,
    /// Ready, Bound and Running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<DataVolumeCondition>,
    /// The `metadata.generation` this status was decided from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// CDI's DataVolume phases (the subset Quarry's controller moves through, plus the others CDI
/// defines so any existing status parses).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Phase {
    /// Created, nothing done yet.
    Pending,
    /// The PVC is bound.
    #[serde(rename = "PVCBound")]
    PvcBound,
    /// The importer pod is created, not yet running.
    ImportScheduled,
    /// The importer pod is running.
    ImportInProgress,
    /// A host-assisted clone's pods are created, not yet running.
    CloneScheduled,
    /// A host-assisted clone's data moves.
    CloneInProgress,
    /// A smart clone's VolumeSnapshot of the source is being taken.
    SnapshotForSmartCloneInProgress,
    /// A PVC is being restored from a `spec.source.snapshot`.
    CloneFromSnapshotSourceInProgress,
    /// A smart clone's PVC is being restored from its snapshot.
    #[serde(rename = "SmartClonePVCInProgress")]
    SmartClonePvcInProgress,
    /// The CSI driver clones the source into the target PVC.
    #[serde(rename = "CSICloneInProgress")]
    CsiCloneInProgress,
    /// The target PVC grows to the requested size after a clone.
    ExpansionInProgress,
    /// A cross-namespace transfer (CDI's; not used by Quarry).
    NamespaceTransferInProgress,
    /// A claim is being prepared (CDI's populators; not used by Quarry).
    PrepClaimInProgress,
    /// A PV is being rebound (CDI's populators; not used by Quarry).
    RebindInProgress,
    /// The upload server pod is created, not yet ready.
    UploadScheduled,
    /// The upload server accepts data.
    UploadReady,
    /// The PVC waits for a pod to use it (WaitForFirstConsumer binding).
    WaitForFirstConsumer,
    /// Populators (other controllers).
    PendingPopulation,
    /// The data is in place.
    Succeeded,
    /// The population failed and will not be retried.
    Failed,
    /// Unknown.
    Unknown,
    /// Paused multistage import.
    Paused,
}

impl Phase {
    /// CDI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::PvcBound => "PVCBound",
            Phase::ImportScheduled => "ImportScheduled",
            Phase::ImportInProgress => "ImportInProgress",
            Phase::CloneScheduled => "CloneScheduled",
            Phase::CloneInProgress => "CloneInProgress",
            Phase::SnapshotForSmartCloneInProgress => "SnapshotForSmartCloneInProgress",
            Phase::CloneFromSnapshotSourceInProgress => "CloneFromSnapshotSourceInProgress",
            Phase::SmartClonePvcInProgress => "SmartClonePVCInProgress",
            Phase::CsiCloneInProgress => "CSICloneInProgress",
            Phase::ExpansionInProgress => "ExpansionInProgress",
            Phase::NamespaceTransferInProgress => "NamespaceTransferInProgress",
            Phase::PrepClaimInProgress => "PrepClaimInProgress",
            Phase::RebindInProgress => "RebindInProgress",
            Phase::UploadScheduled => "UploadScheduled",
            Phase::UploadReady => "UploadReady",
            Phase::WaitForFirstConsumer => "WaitForFirstConsumer",
            Phase::PendingPopulation => "PendingPopulation",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Unknown => "Unknown",
            Phase::Paused => "Paused",
        }
    }

    /// Whether nothing more will happen to the DataVolume.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// A DataVolume condition (CDI's shape: both transition and heartbeat times).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeCondition {
    /// `Ready`, `Bound` or `Running`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// When the condition was last updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    /// Machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Condition types.
pub mod condition {
    /// The data volume can be consumed.
    pub const READY: &str = "Ready";
    /// The PVC is bound.
    pub const BOUND: &str = "Bound";
    /// The populating pod runs.
    pub const RUNNING: &str = "Running";
}

/// Resource labels shared by the objects made for one DataVolume.
pub type Labels = BTreeMap<String, String>;

#[cfg(test)]
mod tests {
    use super::*;

    /// DataVolumes as CDI's documentation and users write them, every source and both PVC forms.
    const CDI_MANIFESTS: &str = r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: fedora-http
  annotations:
    cdi.kubevirt.io/storage.bind.immediate.requested: "true"
spec:
  source:
    http:
      url: "https://download.fedoraproject.org/pub/fedora/linux/releases/40/Cloud/x86_64/images/Fedora-Cloud-Base-Generic.x86_64-40-1.14.qcow2"
      secretRef: "endpoint-secret"
      certConfigMap: "tls-certs"
      extraHeaders:
        - "X-First-Header: 12345"
      secretExtraHeaders:
        - "header-secret"
      checksum: "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
  pvc:
    accessModes:
      - ReadWriteOnce
    resources:
      requests:
        storage: "5Gi"
    storageClassName: hostpath-csi
    volumeMode: Filesystem
---
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: registry-image-datavolume
spec:
  source:
    registry:
      url: "docker://kubevirt/fedora-cloud-registry-disk-demo"
      secretRef: registry-creds
      certConfigMap: registry-ca
      pullMethod: pod
      platform:
        architecture: arm64
  storage:
    resources:
      requests:
        storage: 5Gi
---
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: s3-dv
spec:
  source:
    s3:
      url: "https://s3.us-east-2.amazonaws.com/my-bucket/disk.img"
      secretRef: "s3-secret"
  storage:
    accessModes: [ReadWriteMany]
    volumeMode: Block
    storageClassName: ceph-block
    resources:
      requests:
        storage: 10Gi
  preallocation: true
  priorityClassName: high
---
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: upload-datavolume
spec:
  source:
    upload: {}
  contentType: kubevirt
  storage:
    resources:
      requests:
        storage: 500Mi
---
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: blank-image-datavolume
spec:
  source:
    blank: {}
  pvc:
    accessModes:
      - ReadWriteOnce
    resources:
      requests:
        storage: 500Mi
status:
  phase: Succeeded
  progress: 100.0%
  restartCount: 0
  claimName: blank-image-datavolume
  conditions:
  - type: Bound
    status: "True"
    reason: Bound
    message: PVC blank-image-datavolume Bound
    lastHeartbeatTime: "2024-05-02T10:00:00Z"
    lastTransitionTime: "2024-05-02T10:00:00Z"
  - type: Ready
    status: "True"
    lastHeartbeatTime: "2024-05-02T10:00:05Z"
    lastTransitionTime: "2024-05-02T10:00:05Z"
---
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: cloned-datavolume
spec:
  source:
    pvc:
      namespace: source-ns
      name: golden
  sourceRef:
    kind: DataSource
    name: fedora
  storage: {}
"#;

    fn parse_all() -> Vec<DataVolume> {
        CDI_MANIFESTS
            .split("\n---\n")
            .map(|doc| {
                serde_saphyr::from_str::<DataVolume>(doc).unwrap_or_else(|e| panic!("{e}\n{doc}"))
            })
            .collect()
    }

    #[test]
    fn cdi_manifests_parse_unchanged() {
        let dvs = parse_all();
        assert_eq!(dvs.len(), 6);
        let http = dvs[0].spec.source.as_ref().unwrap().http.as_ref().unwrap();
        assert_eq!(http.secret_ref.as_deref(), Some("endpoint-secret"));
        assert_eq!(http.cert_config_map.as_deref(), Some("tls-certs"));
        assert_eq!(http.extra_headers, ["X-First-Header: 12345"]);
        assert_eq!(http.secret_extra_headers, ["header-secret"]);
        assert!(http.checksum.as_deref().unwrap().starts_with("sha256:e3b0"));
        let pvc = dvs[0].spec.pvc.as_ref().unwrap();
        assert_eq!(pvc.storage_class_name.as_deref(), Some("hostpath-csi"));
        assert_eq!(
            pvc.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
            "5Gi"
        );

        let reg = dvs[1]
            .spec
            .source
            .as_ref()
            .unwrap()
            .registry
            .as_ref()
            .unwrap();
        assert_eq!(
            reg.url.as_deref(),
            Some("docker://kubevirt/fedora-cloud-registry-disk-demo")
        );
        assert_eq!(
            reg.platform.as_ref().unwrap().architecture.as_deref(),
            Some("arm64")
        );

        let s3 = &dvs[2];
        assert_eq!(
            s3.spec
                .source
                .as_ref()
                .unwrap()
                .s3
                .as_ref()
                .unwrap()
                .secret_ref
                .as_deref(),
            Some("s3-secret")
        );
        let st = s3.spec.storage.as_ref().unwrap();
        assert_eq!(
            (st.volume_mode.as_deref(), st.access_modes.as_slice()),
            (Some("Block"), &["ReadWriteMany".to_string()][..])
        );
        assert_eq!(s3.spec.preallocation, Some(true));
        assert_eq!(s3.spec.priority_class_name.as_deref(), Some("high"));

        assert!(dvs[3].spec.source.as_ref().unwrap().upload.is_some());
        assert_eq!(dvs[3].spec.content_type, Some(ContentType::Kubevirt));
        assert!(dvs[4].spec.source.as_ref().unwrap().blank.is_some());
        let status = dvs[4].status.as_ref().unwrap();
        assert_eq!(status.phase, Some(Phase::Succeeded));
        assert_eq!(status.conditions[0].reason.as_deref(), Some("Bound"));
        assert!(dvs[5].spec.source_ref.is_some());
    }

    #[test]
    fn manifests_survive_a_round_trip() {
        for dv in parse_all() {
            let json = serde_json::to_string(&dv).unwrap();
            let back: DataVolume = serde_json::from_str(&json).unwrap();
            assert_eq!(back.spec, dv.spec);
            assert_eq!(back.status, dv.status);
        }
    }
}
