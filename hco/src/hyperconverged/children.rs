//! The child resources HCO keeps for a HyperConverged, with the upstream names:
//! `CDI/cdi-kubevirt-hyperconverged` (carrying the storage settings), `KubeVirt/kubevirt-
//! kubevirt-hyperconverged`, `SSP/ssp-kubevirt-hyperconverged`, `NetworkAddonsConfig/cluster` and,
//! when enabled, `HostPathProvisioner/hostpath-provisioner`.
//!
//! Node placement goes where HCO puts it: `spec.infra.nodePlacement` to CDI's `spec.infra`,
//! KubeVirt's `spec.infra.nodePlacement`, SSP's `spec.templateValidator.placement` and
//! NetworkAddonsConfig's `spec.placementConfiguration.infra`; `spec.workloads.nodePlacement` to
//! CDI's `spec.workload`, KubeVirt's `spec.workloads.nodePlacement`,
//! `spec.placementConfiguration.workloads` and the HostPathProvisioner's `spec.workload`.

use std::collections::BTreeMap;

use kube::Resource;
use kube::api::DynamicObject;
use kube::core::ObjectMeta;
use serde_json::{Value, json};

use api::HyperConverged;
use api::hostpath::{NodePlacement, StoragePool};
use api::hyperconverged::{CertConfig, CertRotation};
use kubekit::error::{Error, Result};

pub use api::children::{ALL, CDI, ChildKind, HOSTPATH, KUBEVIRT, NETWORK_ADDONS, SSP};

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

/// Whether an object carries [`child_labels`]: a HyperConverged made it.
pub fn is_child(meta: &ObjectMeta) -> bool {
    let labels = meta.labels.as_ref();
    child_labels()
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
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

/// `spec.infra.nodePlacement`: where infrastructure components run.
pub fn infra(hc: &HyperConverged) -> Option<&NodePlacement> {
    hc.spec.infra.as_ref()?.node_placement.as_ref()
}

/// `spec.workloads.nodePlacement`: where workloads and node agents run.
pub fn workloads(hc: &HyperConverged) -> Option<&NodePlacement> {
    hc.spec.workloads.as_ref()?.node_placement.as_ref()
}

/// KubeVirt's ComponentConfig for a placement: `{nodePlacement}`, absent without one
/// (HCO's hcoConfig2KvConfig).
pub fn kubevirt_component(placement: Option<&NodePlacement>) -> Option<Value> {
    placement.map(|p| json!({ "nodePlacement": p }))
}

/// NetworkAddonsConfig's `placementConfiguration`: each placement only when it sets something,
/// and none at all when neither does (HCO's hcoConfig2CnaoPlacement).
pub fn cnao_placement(
    infra: Option<&NodePlacement>,
    workloads: Option<&NodePlacement>,
) -> Option<Value> {
    fn set(p: Option<&NodePlacement>) -> Option<&NodePlacement> {
        p.filter(|p| {
            p.affinity.is_some() || !p.tolerations.is_empty() || !p.node_selector.is_empty()
        })
    }
    match (set(infra), set(workloads)) {
        (None, None) => None,
        (i, w) => Some(json!({ "infra": i, "workloads": w })),
    }
}

/// The CDI child: HCO's storage settings propagated into `spec.config` and `spec.certConfig`,
/// and the placements as `spec.infra` and `spec.workload` (CDI's name, singular).
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
        "infra": infra(hc),
        "workload": workloads(hc),
    });
    object(hc, CDI, drop_nulls(spec))
}

/// The KubeVirt child: certificate rotation, the feature gates HCO maps to KubeVirt's, and the
/// placements as `spec.infra` / `spec.workloads` ComponentConfigs.
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
        "infra": kubevirt_component(infra(hc)),
        "workloads": kubevirt_component(workloads(hc)),
    });
    object(hc, KUBEVIRT, drop_nulls(spec))
}

/// The SSP child; the template validator (infrastructure) gets the infra placement.
pub fn ssp(hc: &HyperConverged) -> DynamicObject {
    let spec = json!({
        "commonTemplates": {"namespace": "openshift"},
        "templateValidator": {"replicas": 2, "placement": infra(hc)},
    });
    object(hc, SSP, drop_nulls(spec))
}

/// The NetworkAddonsConfig child, with both placements in `placementConfiguration`.
pub fn network_addons(hc: &HyperConverged) -> DynamicObject {
    let spec = json!({"multus": {}, "linuxBridge": {}, "kubeMacPool": {},
        "placementConfiguration": cnao_placement(infra(hc), workloads(hc))});
    object(hc, NETWORK_ADDONS, drop_nulls(spec))
}

/// The HostPathProvisioner child for `pools`; its CSI driver is a node agent, placed as
/// workloads are (`spec.workload`).
pub fn hostpath(hc: &HyperConverged, pools: &[StoragePool]) -> DynamicObject {
    let spec = json!({"imagePullPolicy": "IfNotPresent", "storagePools": pools,
        "workload": workloads(hc)});
    object(hc, HOSTPATH, drop_nulls(spec))
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
    use api::HyperConvergedSpec;

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

    fn placed(infra: Option<Value>, workloads: Option<Value>) -> HyperConverged {
        let mut h = hc(None);
        let config = |p: Option<Value>| {
            p.map(|p| api::hyperconverged::HyperConvergedConfig {
                node_placement: Some(serde_json::from_value(p).unwrap()),
            })
        };
        h.spec.infra = config(infra);
        h.spec.workloads = config(workloads);
        h
    }

    #[test]
    fn node_placement_goes_where_hco_puts_it() {
        let infra = json!({"nodeSelector": {"node-role.kubernetes.io/infra": ""},
            "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}]});
        let workloads = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "kvm", "operator": "In", "values": ["true"]}]}]}}}});
        let h = placed(Some(infra.clone()), Some(workloads.clone()));
        let spec = |o: DynamicObject| o.data["spec"].clone();
        let cdi = spec(cdi(&h));
        assert_eq!((&cdi["infra"], &cdi["workload"]), (&infra, &workloads));
        let kv = spec(kubevirt(&h));
        assert_eq!(kv["infra"], json!({ "nodePlacement": infra }));
        assert_eq!(kv["workloads"], json!({ "nodePlacement": workloads }));
        assert_eq!(spec(ssp(&h))["templateValidator"]["placement"], infra);
        assert_eq!(
            spec(network_addons(&h))["placementConfiguration"],
            json!({"infra": infra, "workloads": workloads})
        );
        let pools = [StoragePool {
            name: "local".into(),
            path: "/var/hpvolumes".into(),
            ..Default::default()
        }];
        assert_eq!(spec(hostpath(&h, &pools))["workload"], workloads);
    }

    #[test]
    fn without_node_placement_no_placement_field_is_written() {
        let h = placed(None, None);
        let kids = children(&h).unwrap();
        for (kind, obj) in &kids {
            let text = obj.data["spec"].to_string();
            for field in ["infra", "workloads", "placement", "\"workload\""] {
                assert!(!text.contains(field), "{}: {text}", kind.kind);
            }
        }
        // An empty placement is none for the NetworkAddonsConfig (HCO's rule), and a
        // placement for the others.
        let empty = placed(Some(json!({})), None);
        assert!(
            spec_of(network_addons(&empty))
                .get("placementConfiguration")
                .is_none()
        );
        assert_eq!(spec_of(cdi(&empty))["infra"], json!({}));
        let only_workloads = placed(None, Some(json!({"nodeSelector": {"a": "b"}})));
        assert_eq!(
            spec_of(network_addons(&only_workloads))["placementConfiguration"],
            json!({"workloads": {"nodeSelector": {"a": "b"}}})
        );
    }

    fn spec_of(o: DynamicObject) -> Value {
        o.data["spec"].clone()
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
        let typed: api::Cdi = serde_json::from_value(child).unwrap();
        let config = typed.spec.config.unwrap();
        assert_eq!(config.feature_gates, ["HonorWaitForFirstConsumer"]);
        let settings =
            cdi::settings::effective(&Default::default(), Some(&config), &Default::default());
        assert!(settings.honor_wait_for_first_consumer);
    }
}
