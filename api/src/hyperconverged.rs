//! `HyperConverged` in `hco.kubevirt.io/v1beta1`: the storage-related fields HCO propagates to
//! CDI, typed; every other HCO field is kept as it is (the schema preserves unknown fields) so an
//! HCO manifest applies unchanged.

use k8s_openapi::api::core::v1::{ObjectReference, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;

pub use super::hostpath::NodePlacement;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The singleton's name.
pub const HYPERCONVERGED_NAME: &str = "kubevirt-hyperconverged";

/// The desired state of the virtualization stack.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hco.kubevirt.io",
    version = "v1beta1",
    kind = "HyperConverged",
    plural = "hyperconvergeds",
    shortname = "hco",
    shortname = "hcos",
    category = "all",
    namespaced,
    status = "HyperConvergedStatus",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct HyperConvergedSpec {
    /// StorageClass of CDI's scratch space (propagated; Quarry itself never needs scratch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch_space_storage_class: Option<String>,
    /// Containerized data import settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_import: Option<StorageImportConfig>,
    /// Space reserved for the filesystem on Filesystem volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem_overhead: Option<FilesystemOverhead>,
    /// Resource requirements of the operands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_requirements: Option<OperandResourceRequirements>,
    /// Feature gates, `name: bool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_gates: Option<FeatureGates>,
    /// Rotation of the internal self-signed certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config: Option<CertConfig>,
    /// `BlockUninstallIfWorkloadsExist` (default) or `RemoveWorkloads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uninstall_strategy: Option<String>,
    /// Where infrastructure components (operators' controllers, webhooks, APIs) run; passed to
    /// the children as HCO does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infra: Option<HyperConvergedConfig>,
    /// Where workloads (VMs, importer pods, node agents such as the CSI driver) run; passed to
    /// the children as HCO does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workloads: Option<HyperConvergedConfig>,
    /// Golden images: each template becomes a DataImportCron in the boot image namespace (HCO
    /// hands them to SSP, which creates them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_import_cron_templates: Option<Vec<DataImportCronTemplate>>,
    /// HCO's common golden images (CentOS Stream 9 and 10, Fedora): imported when true (HCO
    /// defaults it to true; Quarry only when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_common_boot_image_import: Option<bool>,
    /// Where the golden-image crons live (default `openshift-virtualization-os-images`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub common_boot_image_namespace: Option<String>,
}

/// HCO's DataImportCronTemplate: a DataImportCron's metadata (its name) and spec.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct DataImportCronTemplate {
    /// Name, labels and annotations of the cron.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::cdi::preserved")]
    pub metadata: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    /// The cron's spec.
    pub spec: super::golden::DataImportCronSpec,
}

/// HCO's HyperConvergedConfig: the node placement of one class of components.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HyperConvergedConfig {
    /// Node selector, affinity and tolerations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_placement: Option<NodePlacement>,
}

/// Import settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageImportConfig {
    /// Registries that may be reached without TLS verification.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub insecure_registries: Vec<String>,
}

/// CDI's FilesystemOverhead: fractions as decimal strings (`"0.055"`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemOverhead {
    /// Default for all StorageClasses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<String>,
    /// Per StorageClass.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub storage_class: std::collections::BTreeMap<String, String>,
}

/// Operand resource requirements.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperandResourceRequirements {
    /// Resources of storage workloads (importer, upload and clone pods), propagated to CDI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_workloads: Option<ResourceRequirements>,
    /// Physical CPU per virtual CPU, as a divisor (KubeVirt's setting).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "vmiCPUAllocationRatio"
    )]
    pub vmi_cpu_allocation_ratio: Option<i32>,
}

/// HCO feature gates (the known ones typed; any gate is accepted).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct FeatureGates {
    /// Expose host metrics to guests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downward_metrics: Option<bool>,
    /// Deploy KubeSecondaryDNS.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "deployKubeSecondaryDNS"
    )]
    pub deploy_kube_secondary_dns: Option<bool>,
    /// Disable mediated devices handling.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "disableMDevConfiguration"
    )]
    pub disable_mdev_configuration: Option<bool>,
    /// SCSI persistent reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_reservation: Option<bool>,
    /// Boot images for several architectures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_multi_arch_boot_image_import: Option<bool>,
    /// Cross-cluster live migration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decentralized_live_migration: Option<bool>,
    /// Declarative volume hotplug.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declarative_hotplug_volumes: Option<bool>,
}

/// Certificate rotation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertConfig {
    /// CA certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CertRotation>,
    /// Server certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<CertRotation>,
}

/// Lifetime and renewal of a certificate, Go durations (`48h0m0s`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertRotation {
    /// Lifetime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// How long before expiry to renew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
}

/// The observed state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HyperConvergedStatus {
    /// Available, Progressing, Degraded, ReconcileComplete, Upgradeable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The child objects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related_objects: Vec<ObjectReference>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `healthy`, `warning` or `error`, from the conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_health_status: Option<String>,
}
