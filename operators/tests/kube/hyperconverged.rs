//! The HyperConverged controller against the real API server: on the shared server only
//! Quarry's CRDs are installed (CDI's among them; the other children's are not); a server of the
//! test's own gets stand-ins for the children's CRDs too (cluster-scoped, so they would change
//! what the other tests see).

use std::sync::Arc;

use api::HyperConverged;
use hco::hyperconverged::children::{self, ChildKind};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use testkit::kube::{KubeApiServer, Options};

use crate::support::{
    degraded, established, hyperconverged, hyperconverged_degraded, install_crds, namespace,
    wait_for,
};

fn run_controller(client: &Client, ns: &str) -> tokio::task::JoinHandle<()> {
    let (c, n) = (client.clone(), ns.to_string());
    tokio::spawn(async move { hco::hyperconverged::controller::run(c, n, Arc::default()).await })
}

#[tokio::test]
async fn a_missing_child_crd_is_named_in_degraded_and_in_an_event() {
    let Some((client, ns)) = namespace("hco", &[]).await else {
        return;
    };
    let ctl = run_controller(&client, &ns);
    let degraded = hyperconverged_degraded(&client, &ns).await;
    assert!(
        degraded.message.contains("KubeVirt") && degraded.message.contains("kubevirts.kubevirt.io"),
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
async fn children_get_placement_and_cert_defaults_and_report_back() {
    let Some(server) = KubeApiServer::start(&Options::default()) else {
        return;
    };
    let client = server.client();
    install_crds(&client).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    // CDI's CRD is one of Quarry's (installed above); stand-ins for the others.
    let others: Vec<_> = children::ALL[..4]
        .iter()
        .filter(|k| k.plural != "cdis")
        .collect();
    for kind in &others {
        crds.create(&PostParams::default(), &stand_in(kind))
            .await
            .unwrap();
    }
    for kind in &children::ALL[..4] {
        established(&client, &format!("{}.{}", kind.plural, kind.group)).await;
    }
    let ns = server.namespace("hco", &[]).await;
    let ctl = run_controller(&client, &ns);
    let infra = json!({"nodeSelector": {"node-role.kubernetes.io/infra": ""},
        "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}]});
    let workloads = json!({"nodeSelector": {"kvm": "true"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions":
                [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}});
    let images = format!("{ns}-images");
    let template = json!({"metadata": {"name": "fedora-image-cron"}, "spec": {
        "schedule": "0 */12 * * *", "managedDataSource": "fedora",
        "template": {"spec": {"source": {"registry": {"url": "docker://quay.io/containerdisks/fedora:latest"}},
                              "storage": {"resources": {"requests": {"storage": "5Gi"}}}}}}});
    let mut hc = hyperconverged(
        "kubevirt-hyperconverged",
        json!({"infra": {"nodePlacement": infra}, "workloads": {"nodePlacement": workloads},
               "commonBootImageNamespace": images, "dataImportCronTemplates": [template]}),
    );
    hc.metadata.annotations = Some(
        [(
            children::ANN_HOSTPATH_POOLS.to_string(),
            r#"[{"name":"local","path":"/var/hpvolumes"}]"#.to_string(),
        )]
        .into(),
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
    assert_eq!((&cdi["infra"], &cdi["workload"]), (&infra, &workloads));
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

    // The golden-image template became a DataImportCron in the boot image namespace (made by
    // the controller); an empty template list deletes it.
    let crons: Api<api::golden::DataImportCron> = Api::namespaced(client.clone(), &images);
    let cron = wait_for("the golden-image DataImportCron", || async {
        crons.get_opt("fedora-image-cron").await.ok()?
    })
    .await;
    assert_eq!(cron.spec.managed_data_source, "fedora");
    assert_eq!(cron.labels()["app"], "kubevirt-hyperconverged");
    Api::<HyperConverged>::namespaced(client.clone(), &ns)
        .patch(
            "kubevirt-hyperconverged",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"dataImportCronTemplates": []}})),
        )
        .await
        .unwrap();
    wait_for("the DataImportCron deleted", || async {
        crons
            .get_opt("fedora-image-cron")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;

    // Without a certConfig, the children get HCO's defaults.
    assert_eq!(
        cdi["certConfig"],
        json!({"ca": {"duration": "48h0m0s", "renewBefore": "24h0m0s"},
               "server": {"duration": "24h0m0s", "renewBefore": "12h0m0s"}})
    );
    assert_eq!(
        kv["certificateRotateStrategy"]["selfSigned"]["server"]["renewBefore"],
        "12h0m0s"
    );

    // relatedObjects name every child as HCO does.
    let hcs: Api<HyperConverged> = Api::namespaced(client.clone(), &ns);
    let related = wait_for("relatedObjects of every child", || async {
        let st = hcs.get("kubevirt-hyperconverged").await.ok()?.status?;
        (st.related_objects.len() == children::ALL.len()).then_some(st.related_objects)
    })
    .await;
    let kv_obj = child(children::KUBEVIRT).await;
    let kv_ref = related
        .iter()
        .find(|r| r.kind.as_deref() == Some("KubeVirt"))
        .unwrap();
    assert_eq!(
        (
            kv_ref.api_version.as_deref(),
            kv_ref.name.as_deref(),
            kv_ref.namespace.as_deref(),
            kv_ref.uid.as_deref()
        ),
        (
            Some("kubevirt.io/v1"),
            Some("kubevirt-kubevirt-hyperconverged"),
            Some(ns.as_str()),
            kv_obj.metadata.uid.as_deref()
        )
    );
    let cdi_ref = related
        .iter()
        .find(|r| r.kind.as_deref() == Some("CDI"))
        .unwrap();
    assert_eq!(
        (cdi_ref.api_version.as_deref(), cdi_ref.namespace.as_deref()),
        (Some("cdi.kubevirt.io/v1beta1"), None)
    );

    // A child's own condition message reaches the HyperConverged.
    let cdis: Api<DynamicObject> = Api::all_with(client.clone(), &children::CDI.api_resource());
    cdis.patch_status(
        children::CDI.name,
        &crate::support::test_writes(),
        &kube::api::Patch::Merge(json!({"status": {"conditions": [
            {"type": "Available", "status": "False", "message": ""},
            {"type": "Progressing", "status": "False", "message": ""},
            {"type": "Degraded", "status": "True",
             "message": "cdi-deployment has 0 of 1 replicas ready"}]}})),
    )
    .await
    .unwrap();
    let degraded = degraded(&hcs).await;
    assert_eq!(
        (degraded.reason.as_str(), degraded.message.as_str()),
        (
            "CDIDegraded",
            "CDI is degraded: cdi-deployment has 0 of 1 replicas ready"
        )
    );
    ctl.abort();
}
