//! The HyperConverged controller against the real API server: on the shared server only
//! Quarry's CRDs are installed (the children's are not); a server of the test's own gets
//! stand-ins for the children's CRDs too (cluster-scoped, so they would change what the other
//! tests see).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use operators::api::HyperConverged;
use operators::hyperconverged::children::{self, ChildKind};
use serde_json::{Value, json};
use testkit::kube::{KubeApiServer, Options};

use crate::support::{install_crds, namespace, wait_for};

fn hyperconverged(spec: Value, annotations: Value) -> HyperConverged {
    serde_json::from_value(json!({
        "apiVersion": "hco.kubevirt.io/v1beta1", "kind": "HyperConverged",
        "metadata": {"name": "kubevirt-hyperconverged", "annotations": annotations},
        "spec": spec
    }))
    .unwrap()
}

fn run_controller(client: &Client, ns: &str) -> tokio::task::JoinHandle<()> {
    let (c, n) = (client.clone(), ns.to_string());
    tokio::spawn(
        async move { operators::hyperconverged::controller::run(c, n, Arc::default()).await },
    )
}

#[tokio::test]
async fn a_missing_child_crd_is_named_in_degraded_and_in_an_event() {
    let Some((client, ns)) = namespace("hco", &[]).await else {
        return;
    };
    let ctl = run_controller(&client, &ns);
    let api: Api<HyperConverged> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &hyperconverged(json!({}), json!({})),
    )
    .await
    .unwrap();
    let degraded = wait_for("Degraded", || async {
        let st = api.get("kubevirt-hyperconverged").await.ok()?.status?;
        st.conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
    })
    .await;
    assert!(
        degraded.message.contains("CDI") && degraded.message.contains("cdis.cdi.kubevirt.io"),
        "{degraded:?}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let event = wait_for("the ReconcileFailed event", || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ReconcileFailed"))
    })
    .await;
    ctl.abort();
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.involved_object.kind.as_deref(),
        Some("HyperConverged")
    );
    assert_eq!(event.message.as_deref(), Some(degraded.message.as_str()));
}

/// A stand-in CRD for a child kind: its group, names and scope, any contents.
fn stand_in(kind: &ChildKind) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{}", kind.plural, kind.group)},
        "spec": {"group": kind.group,
            "names": {"kind": kind.kind, "plural": kind.plural, "singular": kind.kind.to_lowercase()},
            "scope": if kind.namespaced { "Namespaced" } else { "Cluster" },
            "versions": [{"name": kind.version, "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn node_placement_reaches_every_child() {
    let Some(server) = KubeApiServer::start(&Options::default()) else {
        return;
    };
    let client = server.client();
    install_crds(&client).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for kind in &children::ALL[..4] {
        crds.create(&PostParams::default(), &stand_in(kind))
            .await
            .unwrap();
    }
    for kind in &children::ALL[..4] {
        let name = format!("{}.{}", kind.plural, kind.group);
        wait_for(&format!("CRD {name} established"), || async {
            let c = crds.get(&name).await.ok()?;
            c.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await;
    }
    let ns = server.namespace("hco", &[]).await;
    let ctl = run_controller(&client, &ns);
    let infra = json!({"nodeSelector": {"node-role.kubernetes.io/infra": ""},
        "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}]});
    let workloads = json!({"nodeSelector": {"kvm": "true"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions":
                [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}});
    let hc = hyperconverged(
        json!({"infra": {"nodePlacement": infra}, "workloads": {"nodePlacement": workloads}}),
        json!({children::ANN_HOSTPATH_POOLS: r#"[{"name":"local","path":"/var/hpvolumes"}]"#}),
    );
    Api::<HyperConverged>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &hc)
        .await
        .unwrap();
    let child = |kind: ChildKind| {
        let api: Api<DynamicObject> = if kind.namespaced {
            Api::namespaced_with(client.clone(), &ns, &kind.api_resource())
        } else {
            Api::all_with(client.clone(), &kind.api_resource())
        };
        async move {
            wait_for(&format!("{} {}", kind.kind, kind.name), || async {
                api.get_opt(kind.name).await.ok()?
            })
            .await
        }
    };
    let spec = |o: DynamicObject| o.data["spec"].clone();
    let cdi = spec(child(children::CDI).await);
    assert_eq!((&cdi["infra"], &cdi["workloads"]), (&infra, &workloads));
    let kv = spec(child(children::KUBEVIRT).await);
    assert_eq!(kv["infra"]["nodePlacement"], infra);
    assert_eq!(kv["workloads"]["nodePlacement"], workloads);
    let ssp = spec(child(children::SSP).await);
    assert_eq!(ssp["templateValidator"]["placement"], infra);
    let cnao = spec(child(children::NETWORK_ADDONS).await);
    assert_eq!(
        cnao["placementConfiguration"],
        json!({"infra": infra, "workloads": workloads})
    );
    // The HostPathProvisioner's CRD is Quarry's own: its schema keeps the placement.
    let hpp = child(children::HOSTPATH).await;
    assert_eq!(spec(hpp.clone())["workload"], workloads);
    assert_eq!(hpp.labels()["app"], "kubevirt-hyperconverged");
    ctl.abort();
}
