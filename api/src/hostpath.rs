//! `HostPathProvisioner` in `hostpathprovisioner.kubevirt.io/v1beta1` (cluster-scoped), HPP
//! operator's field names.

use k8s_openapi::api::core::v1::{
    Affinity, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The desired hostpath CSI deployment.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hostpathprovisioner.kubevirt.io",
    version = "v1beta1",
    kind = "HostPathProvisioner",
    plural = "hostpathprovisioners",
    status = "HostPathProvisionerStatus",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct HostPathProvisionerSpec {
    /// Pull policy of the driver's images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// The legacy single-pool form (HPP's `pathConfig`): becomes a pool named `legacy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_config: Option<PathConfig>,
    /// Storage pools, one StorageClass each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_pools: Vec<StoragePool>,
    /// Where the driver's DaemonSet runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<NodePlacement>,
    /// Feature gates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feature_gates: Vec<String>,
}

/// The legacy path configuration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PathConfig {
    /// Host directory.
    pub path: String,
    /// Prefix volume directories with the namespace and claim name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_naming_prefix: Option<bool>,
}

/// One storage pool: a host directory.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoragePool {
    /// Pool name, the StorageClass parameter `storagePool`.
    pub name: String,
    /// Host directory of the pool.
    pub path: String,
    /// A PVC made from this on every node the driver runs on backs the pool there: it is
    /// mounted at `path` by a mounter pod (HPP's). A Filesystem volume is bind-mounted; a Block
    /// volume is given an XFS filesystem when it is blank, then mounted (one that already holds
    /// XFS, ext2/3/4 or btrfs is mounted as it is, never formatted again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_template: Option<PersistentVolumeClaimSpec>,
    /// The snapshot type, HPP's: only `reflink` is accepted. It changes nothing in Quarry, which
    /// snapshots on every pool (reflinks where the filesystem has them, sparse copies
    /// elsewhere), where HPP refuses snapshots on a pool without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_provider: Option<String>,
}

/// Node placement (the controller-lifecycle-operator-sdk shape).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePlacement {
    /// Node labels the pods require.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub node_selector: std::collections::BTreeMap<String, String>,
    /// Affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

/// The observed state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPathProvisionerStatus {
    /// Available, Progressing, Degraded (openshift custom-resource-status shape).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<OperatorCondition>,
    /// Version of the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_version: Option<String>,
    /// Version being deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    /// Version deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_version: Option<String>,
    /// One entry per pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_pool_statuses: Vec<StoragePoolStatus>,
}

/// A condition with heartbeat (openshift/custom-resource-status conditions/v1).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperatorCondition {
    /// Available, Progressing or Degraded.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// Machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Last update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    /// Last status change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

impl HostPathProvisioner {
    /// The HostPathProvisioner `hostpath-provisioner` (HPP's default CR name) with one pool.
    pub fn with_pool(pool: &str, path: &str) -> Self {
        HostPathProvisioner::new(
            "hostpath-provisioner",
            HostPathProvisionerSpec {
                storage_pools: vec![StoragePool {
                    name: pool.into(),
                    path: path.into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        )
    }
}

impl OperatorCondition {
    /// Sets condition `type_` in `conds` (added when missing): the heartbeat moves at every set,
    /// the transition time only when the status changes.
    pub fn set(
        conds: &mut Vec<OperatorCondition>,
        type_: &str,
        status: bool,
        reason: &str,
        message: &str,
        now: k8s_openapi::jiff::Timestamp,
    ) {
        let status = if status { "True" } else { "False" };
        let idx = conds
            .iter()
            .position(|c| c.type_ == type_)
            .unwrap_or_else(|| {
                conds.push(OperatorCondition {
                    type_: type_.into(),
                    ..Default::default()
                });
                conds.len() - 1
            });
        let c = &mut conds[idx];
        if c.status != status {
            c.last_transition_time = Some(Time(now));
        }
        c.status = status.into();
        c.reason = Some(reason.into());
        c.message = Some(message.into());
        c.last_heartbeat_time = Some(Time(now));
    }
}

/// The state of one pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoragePoolStatus {
    /// Pool name.
    pub name: String,
    /// `Ready` when every scheduled driver pod (and a `pvcTemplate` pool's every mounter) is
    /// ready, else `NotReady` (a `pvcTemplate` pool: `Mounting`, as HPP says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Driver pods ready (a `pvcTemplate` pool's: mounters ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_ready: Option<i32>,
    /// Driver pods scheduled (a `pvcTemplate` pool's: mounters wanted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_ready: Option<i32>,
    /// A `pvcTemplate` pool's PVCs, one per node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claim_statuses: Vec<ClaimStatus>,
}

/// The status of a `pvcTemplate` pool's PVC (HPP's).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    /// The PVC.
    pub name: String,
    /// Its status.
    pub status: PersistentVolumeClaimStatus,
}
