//! CDI's configuration objects in `cdi.kubevirt.io/v1beta1`, all cluster-scoped, with CDI's
//! field names: the [`Cdi`] CR (what HyperConverged creates, and where an admin configures CDI),
//! the [`CdiConfig`] named `config` (the settings in force, which `virtctl` reads), and one
//! [`StorageProfile`] per StorageClass (claim defaults and the clone strategy). Fields Quarry does
//! not act on are kept, not rejected.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::hyperconverged::{CertRotation, FilesystemOverhead};

/// The name of the CDIConfig singleton (CDI's `common.ConfigName`).
pub const CDI_CONFIG_NAME: &str = "config";

/// An object whose contents are kept as written (scheduling, patches, TLS profiles).
pub(crate) fn preserved(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// The CDI installation: Quarry acts on `spec.config` (and keeps the rest).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "CDI",
    root = "Cdi",
    plural = "cdis",
    shortname = "cdi",
    shortname = "cdis",
    status = "CdiStatus",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    /// Pull policy of CDI's images (`Always`, `IfNotPresent`, `Never`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// `RemoveWorkloads` or `BlockUninstallIfWorkloadsExist`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uninstall_strategy: Option<String>,
    /// Placement and replicas of the infrastructure components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved")]
    pub infra: Option<serde_json::Value>,
    /// Placement of the workload pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved")]
    pub workload: Option<serde_json::Value>,
    /// Patches and flags for the deployed components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved")]
    pub customize_components: Option<serde_json::Value>,
    /// `copy`, `snapshot` or `csi-clone`, over every StorageProfile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_strategy_override: Option<String>,
    /// The settings the CDIConfig takes (CDI's operator copies them there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<CdiConfigSpec>,
    /// Rotation of CDI's certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config: Option<CdiCertConfig>,
    /// PriorityClass of the control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
}

/// CDI's certificate rotation: CA, server and client certificates.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CdiCertConfig {
    /// CA certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CertRotation>,
    /// Server certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<CertRotation>,
    /// Client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<CertRotation>,
}

/// The CDI CR's status (the operator SDK's: phase, conditions, versions).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CdiStatus {
    /// `Deploying`, `Deployed`, `Deleting`, `Deleted`, `Error`, `Upgrading`, `Empty`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Available, Progressing, Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "preserved_list")]
    pub conditions: Vec<serde_json::Value>,
    /// Version of the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_version: Option<String>,
    /// Version being deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    /// Version deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_version: Option<String>,
}

fn preserved_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "array", "items": {
        "type": "object", "x-kubernetes-preserve-unknown-fields": true}})
}

/// CDI's settings (`CDI.spec.config`), and the spec of the CDIConfig named
/// [`CDI_CONFIG_NAME`], the settings in force.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "CDIConfig",
    root = "CdiConfig",
    plural = "cdiconfigs",
    status = "CdiConfigStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct CdiConfigSpec {
    /// The upload proxy URL published in the status instead of the derived one.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "uploadProxyURLOverride"
    )]
    pub upload_proxy_url_override: Option<String>,
    /// Proxy of importer pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import_proxy: Option<ImportProxy>,
    /// StorageClass of scratch space (Quarry needs none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch_space_storage_class: Option<String>,
    /// Resources of importer and upload pods (each of cpu and memory, limits and requests,
    /// replaces CDI's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_resource_requirements: Option<ResourceRequirements>,
    /// Enabled feature gates (`HonorWaitForFirstConsumer`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feature_gates: Vec<String>,
    /// Space reserved on Filesystem volumes, fractions as strings (`"0.055"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem_overhead: Option<FilesystemOverhead>,
    /// Preallocate DataVolumes that do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preallocation: Option<bool>,
    /// Registries reached without TLS verification (`HOST[:PORT]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub insecure_registries: Vec<String>,
    /// Deprecated upstream; kept.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "dataVolumeTTLSeconds"
    )]
    pub data_volume_ttl_seconds: Option<i32>,
    /// TLS settings of CDI's servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved")]
    pub tls_security_profile: Option<serde_json::Value>,
    /// Pull secrets of importer and upload pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Log verbosity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_verbosity: Option<i32>,
}

/// The importer pods' proxy, passed as `HTTP_PROXY`, `HTTPS_PROXY` and `NO_PROXY`; the trusted
/// CA ConfigMap (in Quarry's namespace) is copied next to the pod and mounted. CDI's field names
/// (upper-case `HTTPProxy`, `HTTPSProxy`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportProxy {
    /// `http://USER:PASSWORD@HOST:PORT` for HTTP requests; empty means unset.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "HTTPProxy")]
    pub http_proxy: Option<String>,
    /// The same for HTTPS requests.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "HTTPSProxy"
    )]
    pub https_proxy: Option<String>,
    /// Comma-separated hosts and CIDRs reached directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_proxy: Option<String>,
    /// ConfigMap with the proxy's CA bundle under `ca.pem`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "trustedCAProxy"
    )]
    pub trusted_ca_proxy: Option<String>,
}

/// What CDI derives from the spec and the cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CdiConfigStatus {
    /// Where `virtctl image-upload` sends data: the override, else an Ingress host.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "uploadProxyURL"
    )]
    pub upload_proxy_url: Option<String>,
    /// CA of the upload proxy.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "uploadProxyCA"
    )]
    pub upload_proxy_ca: Option<String>,
    /// Proxy of importer pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import_proxy: Option<ImportProxy>,
    /// The StorageClass CDI would put scratch space on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch_space_storage_class: Option<String>,
    /// Resources of importer and upload pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pod_resource_requirements: Option<ResourceRequirements>,
    /// The global overhead and the overhead of every StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem_overhead: Option<FilesystemOverhead>,
    /// Whether DataVolumes that do not say are preallocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preallocation: Option<bool>,
    /// Pull secrets of importer and upload pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
}

/// Claim defaults and the clone strategy of one StorageClass (named like it).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "StorageProfile",
    plural = "storageprofiles",
    status = "StorageProfileStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct StorageProfileSpec {
    /// `copy`, `snapshot` or `csi-clone` (a spec's choice wins over what is known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_strategy: Option<String>,
    /// Access and volume modes, most preferred first (a spec's sets replace the known ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claim_property_sets: Vec<ClaimPropertySet>,
    /// `pvc` or `snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_import_cron_source_format: Option<String>,
    /// VolumeSnapshotClass for snapshot clones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_class: Option<String>,
}

/// What CDI knows of the StorageClass, with the spec's choices applied.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageProfileStatus {
    /// The StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// Its provisioner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioner: Option<String>,
    /// The clone strategy, claim property sets, DataImportCron source format and snapshot
    /// class in force (the spec's fields, computed).
    #[serde(flatten)]
    pub profile: StorageProfileSpec,
}

/// Access modes with a volume mode, a combination the storage supports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimPropertySet {
    /// `ReadWriteOnce`, `ReadOnlyMany`, `ReadWriteMany`, `ReadWriteOncePod`.
    #[serde(default)]
    pub access_modes: Vec<String>,
    /// `Filesystem` or `Block`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<String>,
}

/// Feature gates of `spec.config.featureGates` Quarry acts on.
pub mod feature_gate {
    /// Leave WaitForFirstConsumer PVCs unbound until their consumer appears.
    pub const HONOR_WAIT_FOR_FIRST_CONSUMER: &str = "HonorWaitForFirstConsumer";
}

/// Labels CDI puts on the objects it creates.
pub fn cdi_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cdi.kubevirt.io".to_string(), String::new()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "quarry".to_string(),
        ),
    ])
}

/// The active CDI CR, as CDI picks it: the only one, or among several the only one whose phase
/// is not `Error`. Several active ones are an error.
pub fn active_cdi(crs: &[Cdi]) -> Result<Option<&Cdi>, String> {
    if crs.len() <= 1 {
        return Ok(crs.first());
    }
    let active: Vec<&Cdi> = crs
        .iter()
        .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Error"))
        .collect();
    match active.as_slice() {
        [one] => Ok(Some(one)),
        _ => Err(format!(
            "invalid number of active CDI resources: {}",
            active.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cdi(name: &str, phase: Option<&str>) -> Cdi {
        let mut c = Cdi::new(name, CdiSpec::default());
        c.status = phase.map(|p| CdiStatus {
            phase: Some(p.into()),
            ..Default::default()
        });
        c
    }

    #[test]
    fn the_active_cdi_is_the_only_one_or_the_only_one_not_in_error() {
        assert!(active_cdi(&[]).unwrap().is_none());
        let one = [cdi("a", Some("Error"))];
        assert_eq!(
            active_cdi(&one).unwrap().unwrap().metadata.name.as_deref(),
            Some("a")
        );
        let two = [cdi("a", Some("Error")), cdi("b", Some("Deployed"))];
        assert_eq!(
            active_cdi(&two).unwrap().unwrap().metadata.name.as_deref(),
            Some("b")
        );
        let both = [cdi("a", None), cdi("b", Some("Deployed"))];
        assert_eq!(
            active_cdi(&both).unwrap_err(),
            "invalid number of active CDI resources: 2"
        );
    }

    #[test]
    fn cdi_manifests_parse_with_cdi_field_names() {
        let cdi: Cdi = serde_saphyr::from_str(
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: CDI
metadata: {name: cdi}
spec:
  imagePullPolicy: IfNotPresent
  infra: {nodeSelector: {kubernetes.io/os: linux}}
  config:
    uploadProxyURLOverride: https://upload.example
    filesystemOverhead: {global: "0.08", storageClass: {fast: "0.1"}}
    insecureRegistries: [registry.local:5000]
    featureGates: [HonorWaitForFirstConsumer]
    podResourceRequirements: {limits: {cpu: "1"}}
    importProxy: {HTTPProxy: "http://proxy:3128", noProxy: ".local", trustedCAProxy: proxy-ca}
status: {phase: Deployed}
"#,
        )
        .unwrap();
        let c = cdi.spec.config.as_ref().unwrap();
        assert_eq!(
            c.upload_proxy_url_override.as_deref(),
            Some("https://upload.example")
        );
        let p = c.import_proxy.as_ref().unwrap();
        assert_eq!(p.http_proxy.as_deref(), Some("http://proxy:3128"));
        assert_eq!(p.trusted_ca_proxy.as_deref(), Some("proxy-ca"));
        assert_eq!(
            c.filesystem_overhead.as_ref().unwrap().storage_class["fast"],
            "0.1"
        );
        let json = serde_json::to_value(&cdi).unwrap();
        assert_eq!(
            json["spec"]["config"]["importProxy"]["HTTPProxy"],
            "http://proxy:3128"
        );
        assert_eq!(
            json["spec"]["infra"]["nodeSelector"]["kubernetes.io/os"],
            "linux"
        );
        assert_eq!(json["status"]["phase"], "Deployed");
    }
}
