//! The DataSource controller against the real API server: Ready follows the DataVolume its PVC
//! source names (missing, importing, succeeded), the PVC alone, and a change of source.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::{Api, Patch, PostParams};
use operators::api::{DataSource, DataVolume};
use operators::golden::controller;
use serde_json::json;

use crate::support::{namespace, test_writes, wait_for};

/// Waits until the DataSource's Ready condition has `status` and `reason`.
async fn ready(api: &Api<DataSource>, name: &str, status: &str, reason: &str) -> String {
    wait_for(
        &format!("DataSource {name} Ready={status} ({reason})"),
        || async {
            let ds = api.get(name).await.ok()?;
            let c = ds
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (c.status == status && c.reason.as_deref() == Some(reason))
                .then(|| c.message.unwrap_or_default())
        },
    )
    .await
}

async fn set_phase(client: &Client, ns: &str, name: &str, phase: &str) {
    let api: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    api.patch_status(
        name,
        &test_writes(),
        &Patch::Merge(json!({"status": {"phase": phase}})),
    )
    .await
    .unwrap_or_else(|e| panic!("writing the phase of DataVolume {name}: {e}"));
}

#[tokio::test]
async fn ready_follows_the_data_volume_and_pvc_of_its_source() {
    let Some((client, golden)) = namespace("golden", &[]).await else {
        return;
    };
    let task = {
        let (client, ns) = (client.clone(), golden.clone());
        tokio::spawn(async move { controller::run(client, Arc::default(), Some(&ns)).await })
    };
    let sources: Api<DataSource> = Api::namespaced(client.clone(), &golden);
    let ds: DataSource = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora"},
        "spec": {"source": {"pvc": {"namespace": golden, "name": "fedora-3d8e5b5ff4b1"}}}}))
    .unwrap();
    sources.create(&PostParams::default(), &ds).await.unwrap();
    assert_eq!(
        ready(&sources, "fedora", "False", "NotFound").await,
        "PVC not found"
    );

    // The import DataVolume appears and runs, then succeeds.
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &golden);
    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "fedora-3d8e5b5ff4b1"},
        "spec": {"source": {"registry": {"url": "docker://quay.io/containerdisks/fedora:latest"}},
                 "storage": {"resources": {"requests": {"storage": "5Gi"}}}}}))
    .unwrap();
    dvs.create(&PostParams::default(), &dv).await.unwrap();
    set_phase(&client, &golden, "fedora-3d8e5b5ff4b1", "ImportInProgress").await;
    assert_eq!(
        ready(&sources, "fedora", "False", "ImportInProgress").await,
        "Import DataVolume phase ImportInProgress"
    );
    set_phase(&client, &golden, "fedora-3d8e5b5ff4b1", "Succeeded").await;
    assert_eq!(
        ready(&sources, "fedora", "True", "Ready").await,
        "DataSource is ready to be consumed"
    );

    // Pointed at a bare PVC (no DataVolume, the namespace left to default): ready once it exists.
    sources
        .patch(
            "fedora",
            &test_writes(),
            &Patch::Merge(json!(
            {"spec": {"source": {"pvc": {"namespace": "", "name": "fedora-manual"}}}})),
        )
        .await
        .unwrap();
    ready(&sources, "fedora", "False", "NotFound").await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &golden);
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "fedora-manual"},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}}))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    ready(&sources, "fedora", "True", "Ready").await;
    let st = sources.get("fedora").await.unwrap().status.unwrap();
    assert_eq!(st.source.unwrap().pvc.unwrap().name, "fedora-manual");
    task.abort();
}
