//! The child resources HCO keeps for a HyperConverged, with the upstream names:
//! `CDI/cdi-kubevirt-hyperconverged` (carrying the storage settings), `KubeVirt/kubevirt-
//! kubevirt-hyperconverged`, `SSP/ssp-kubevirt-hyperconverged`, `NetworkAddonsConfig/cluster` and,
//! when enabled, `HostPathProvisioner/hostpath-provisioner`.

use std::collections::BTreeMap;

use kube::Resource;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::core::ObjectMeta;
use serde_json::{Value, json};

use crate::api::HyperConverged;
use crate::api::hostpath::StoragePool;
use crate::api::hyperconverged::{CertConfig, CertRotation};
use crate::error::{Error, Result};

/// HyperConverged annotation enabling the HostPathProvisioner child: a JSON list of
/// `{name, path}` storage pools (HCO itself has no such field).
pub const ANN_HOSTPATH_POOLS: &str = "quarry.kubevirt.io/hostPathStoragePools";

/// Labels HCO puts on its children (also how the controller finds them).
pub fn child_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app".into(), "kubevirt-hyperconverged".into()),
        ("app.kubernetes.io/managed-by".into(), "hco-operator".into()),
        (
            "app.kubernetes.io/part-of".into(),
            "hyperconverged-cluster".into(),
        ),
    ])
}

/// One kind of child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildKind {
    /// API group.
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Plural resource name.
    pub plural: &'static str,
    /// The object's name.
    pub name: &'static str,
    /// Namespaced (in the HyperConverged's namespace) or cluster-scoped.
    pub namespaced: bool,
}

/// A relatedObjects entry for an applied child, as HCO lists them: apiVersion, kind, name,
/// namespace (for namespaced children), uid and resourceVersion.
pub fn related_object(
    kind: &ChildKind,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(kind.api_resource().api_version),
        kind: Some(kind.kind.into()),
        name: Some(kind.name.into()),
        namespace: meta.namespace.clone().filter(|_| kind.namespaced),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        field_path: None,
    }
}

impl ChildKind {
    /// The API resource, for dynamic clients.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(self.group, self.version, self.kind),
            self.plural,
        )
    }
}

/// `CDI/cdi-kubevirt-hyperconverged`.
pub const CDI: ChildKind = ChildKind {
    group: "cdi.kubevirt.io",
    version: "v1beta1",
    kind: "CDI",
    plural: "cdis",
    name: "cdi-kubevirt-hyperconverged",
    namespaced: false,
};
/// `KubeVirt/kubevirt-kubevirt-hyperconverged`.
pub const KUBEVIRT: ChildKind = ChildKind {
    group: "kubevirt.io",
    version: "v1",
    kind: "KubeVirt",
    plural: "kubevirts",
    name: "kubevirt-kubevirt-hyperconverged",
    namespaced: true,
};
/// `SSP/ssp-kubevirt-hyperconverged`.
pub const SSP: ChildKind = ChildKind {
    group: "ssp.kubevirt.io",
    version: "v1beta2",
    kind: "SSP",
    plural: "ssps",
    name: "ssp-kubevirt-hyperconverged",
    namespaced: true,
};
/// `NetworkAddonsConfig/cluster`.
pub const NETWORK_ADDONS: ChildKind = ChildKind {
    group: "networkaddonsoperator.network.kubevirt.io",
    version: "v1",
    kind: "NetworkAddonsConfig",
    plural: "networkaddonsconfigs",
    name: "cluster",
    namespaced: false,
};
/// `HostPathProvisioner/hostpath-provisioner`.
pub const HOSTPATH: ChildKind = ChildKind {
    group: "hostpathprovisioner.kubevirt.io",
    version: "v1beta1",
    kind: "HostPathProvisioner",
    plural: "hostpathprovisioners",
    name: "hostpath-provisioner",
    namespaced: false,
};

/// Every kind a HyperConverged may have.
pub const ALL: [ChildKind; 5] = [CDI, KUBEVIRT, SSP, NETWORK_ADDONS, HOSTPATH];

/// The storage pools of the HostPathProvisioner child, when enabled.
pub fn hostpath_pools(hc: &HyperConverged) -> Result<Option<Vec<StoragePool>>> {
    let Some(text) = hc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_HOSTPATH_POOLS))
    else {
        return Ok(None);
    };
    let pools: Vec<StoragePool> = serde_json::from_str(text).map_err(|e| {
        Error::invalid(format!(
            "annotation {ANN_HOSTPATH_POOLS} must be a JSON list of {{name, path}}: {e}"
        ))
    })?;
    Ok(Some(pools))
}

fn object(hc: &HyperConverged, kind: ChildKind, spec: Value) -> DynamicObject {
    let namespace = kind
        .namespaced
        .then(|| hc.metadata.namespace.clone())
        .flatten();
    // Cluster-scoped children cannot be owned by a namespaced object: labels tie them instead.
    let owner = kind
        .namespaced
        .then(|| hc.controller_owner_ref(&()))
        .flatten()
        .map(|o| vec![o]);
    DynamicObject {
        types: Some(kube::core::TypeMeta {
            api_version: format!("{}/{}", kind.group, kind.version),
            kind: kind.kind.into(),
        }),
        metadata: ObjectMeta {
            name: Some(kind.name.into()),
            namespace,
            labels: Some(child_labels()),
            owner_references: owner,
            ..Default::default()
        },
        data: json!({ "spec": spec }),
    }
}

fn drop_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, drop_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

/// The certificate rotation the children get: what the HyperConverged sets, each unset field
/// filled with HCO's defaults (CA 48h, renewed 24h before expiry; server 24h, renewed 12h before).
pub fn cert_config(hc: &HyperConverged) -> CertConfig {
    let given = hc.spec.cert_config.clone().unwrap_or_default();
    let fill = |r: Option<CertRotation>, duration: &str, renew: &str| {
        let r = r.unwrap_or_default();
        Some(CertRotation {
            duration: r.duration.or_else(|| Some(duration.into())),
            renew_before: r.renew_before.or_else(|| Some(renew.into())),
        })
    };
    CertConfig {
        ca: fill(given.ca, "48h0m0s", "24h0m0s"),
        server: fill(given.server, "24h0m0s", "12h0m0s"),
    }
}

/// The CDI child: HCO's storage settings propagated into `spec.config` and `spec.certConfig`.
pub fn cdi(hc: &HyperConverged) -> DynamicObject {
    let s = &hc.spec;
    let cert = cert_config(hc);
    let cert = Some(&cert);
    let spec = json!({
        "config": {
            "scratchSpaceStorageClass": s.scratch_space_storage_class,
            "filesystemOverhead": s.filesystem_overhead,
            "insecureRegistries": s.storage_import.as_ref().map(|i| &i.insecure_registries),
            "podResourceRequirements": s.resource_requirements.as_ref().and_then(|r| r.storage_workloads.as_ref()),
            "featureGates": ["HonorWaitForFirstConsumer"],
        },
        "certConfig": {
            "ca": cert.and_then(|c| c.ca.as_ref()),
            "server": cert.and_then(|c| c.server.as_ref()),
        },
        "uninstallStrategy": "BlockUninstallIfWorkloadsExist",
    });
    object(hc, CDI, drop_nulls(spec))
}

/// The KubeVirt child: certificate rotation and the feature gates HCO maps to KubeVirt's.
pub fn kubevirt(hc: &HyperConverged) -> DynamicObject {
    let s = &hc.spec;
    let fg = s.feature_gates.clone().unwrap_or_default();
    let mut gates = vec!["DataVolumes", "HotplugVolumes"];
    if fg.downward_metrics == Some(true) {
        gates.push("DownwardMetrics");
    }
    if fg.persistent_reservation == Some(true) {
        gates.push("PersistentReservation");
    }
    let cert = cert_config(hc);
    let cert = Some(&cert);
    let spec = json!({
        "certificateRotateStrategy": {"selfSigned": {
            "ca": cert.and_then(|c| c.ca.as_ref()),
            "server": cert.and_then(|c| c.server.as_ref()),
        }},
        "configuration": {"developerConfiguration": {"featureGates": gates}},
        "uninstallStrategy": s.uninstall_strategy.as_deref().unwrap_or("BlockUninstallIfWorkloadsExist"),
    });
    object(hc, KUBEVIRT, drop_nulls(spec))
}

/// The SSP child.
pub fn ssp(hc: &HyperConverged) -> DynamicObject {
    let spec = json!({
        "commonTemplates": {"namespace": "openshift"},
        "templateValidator": {"replicas": 2},
    });
    object(hc, SSP, spec)
}

/// The NetworkAddonsConfig child.
pub fn network_addons(hc: &HyperConverged) -> DynamicObject {
    let spec = json!({"multus": {}, "linuxBridge": {}, "kubeMacPool": {}});
    object(hc, NETWORK_ADDONS, spec)
}

/// The HostPathProvisioner child for `pools`.
pub fn hostpath(hc: &HyperConverged, pools: &[StoragePool]) -> DynamicObject {
    let spec = json!({"imagePullPolicy": "IfNotPresent", "storagePools": pools});
    object(hc, HOSTPATH, spec)
}

/// All children a HyperConverged asks for, in creation order.
pub fn children(hc: &HyperConverged) -> Result<Vec<(ChildKind, DynamicObject)>> {
    let mut out = vec![
        (CDI, cdi(hc)),
        (KUBEVIRT, kubevirt(hc)),
        (SSP, ssp(hc)),
        (NETWORK_ADDONS, network_addons(hc)),
    ];
    if let Some(pools) = hostpath_pools(hc)? {
        out.push((HOSTPATH, hostpath(hc, &pools)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::HyperConvergedSpec;

    fn hc(cert: Option<CertConfig>) -> HyperConverged {
        let mut hc = HyperConverged::new(
            "kubevirt-hyperconverged",
            HyperConvergedSpec {
                cert_config: cert,
                ..Default::default()
            },
        );
        hc.metadata.namespace = Some("kubevirt-hyperconverged".into());
        hc
    }

    #[test]
    fn children_get_hcos_certificate_defaults_where_none_are_set() {
        let spec = &cdi(&hc(None)).data["spec"]["certConfig"];
        assert_eq!(spec["ca"]["duration"], "48h0m0s");
        assert_eq!(spec["ca"]["renewBefore"], "24h0m0s");
        assert_eq!(spec["server"]["duration"], "24h0m0s");
        assert_eq!(spec["server"]["renewBefore"], "12h0m0s");
        // What is set is kept; only the rest is filled.
        let partial = CertConfig {
            server: Some(CertRotation {
                duration: Some("6h0m0s".into()),
                renew_before: None,
            }),
            ca: None,
        };
        let kv = kubevirt(&hc(Some(partial)));
        let rot = &kv.data["spec"]["certificateRotateStrategy"]["selfSigned"];
        assert_eq!(rot["server"]["duration"], "6h0m0s");
        assert_eq!(rot["server"]["renewBefore"], "12h0m0s");
        assert_eq!(rot["ca"]["duration"], "48h0m0s");
    }

    #[test]
    fn the_cdi_child_reads_as_a_typed_cdi_whose_config_the_datavolume_controller_takes() {
        let child = serde_json::to_value(cdi(&hc(None))).unwrap();
        let typed: crate::api::Cdi = serde_json::from_value(child).unwrap();
        let config = typed.spec.config.unwrap();
        assert_eq!(config.feature_gates, ["HonorWaitForFirstConsumer"]);
        let settings = crate::cdiconfig::settings::effective(
            &Default::default(),
            Some(&config),
            &Default::default(),
        );
        assert!(settings.honor_wait_for_first_consumer);
    }
}
