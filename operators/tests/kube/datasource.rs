//! The DataSource controller against the real API server: Ready follows the DataVolume its PVC
//! source names (missing, importing, succeeded), the PVC alone, and a change of source; a
//! `dataSource` source shows and follows the source of the DataSource it names (one deep, CDI's
//! reasons otherwise); a DataVolume's `sourceRef` waits for its DataSource, then resolves to its
//! source.

use std::sync::Arc;
use std::time::Duration;

use api::{DataSource, DataVolume, Phase};
use cdi::datavolume::controller::{self as dv_controller, Context};
use cdi::golden::controller;
use cdi::settings::{Config, RetryPolicy};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, Patch, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::{bind_pvc, namespace, test_writes, wait_for};

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

/// A fresh namespace (None: skip) with the DataSource controller over it, stopped by aborting.
async fn with_controller(prefix: &str) -> Option<(Client, String, tokio::task::JoinHandle<()>)> {
    let (client, ns) = namespace(prefix, &[]).await?;
    let task = {
        let (client, ns) = (client.clone(), ns.clone());
        tokio::spawn(async move { controller::run(client, Arc::default(), Some(&ns)).await })
    };
    Some((client, ns, task))
}

#[tokio::test]
async fn ready_follows_the_data_volume_and_pvc_of_its_source() {
    let Some((client, golden, task)) = with_controller("golden").await else {
        return;
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

#[tokio::test]
async fn a_data_volume_with_a_source_ref_waits_for_its_data_source_then_resolves_it() {
    let Some((client, ns)) = namespace("sourceref", &[]).await else {
        return;
    };
    // Retries far beyond the test's patience: only the watch of DataSources can wake the
    // waiting DataVolume.
    let config = Config {
        retry: RetryPolicy {
            base_delay: Duration::from_secs(600),
            max_delay: Duration::from_secs(600),
            max_restarts: 2,
        },
        ..Config::default()
    };
    let ctx = Arc::new(Context::new(client.clone(), config, Arc::default()));
    let tasks = [
        {
            let ns = ns.clone();
            tokio::spawn(async move { dv_controller::run(ctx, Some(&ns)).await })
        },
        {
            let (client, ns) = (client.clone(), ns.clone());
            tokio::spawn(async move { controller::run(client, Arc::default(), Some(&ns)).await })
        },
    ];
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "vm-disk"},
        "spec": {"sourceRef": {"kind": "DataSource", "name": "fedora"},
                 "storage": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}}}}}))
    .unwrap();
    dvs.create(&PostParams::default(), &dv).await.unwrap();
    let expected = format!("The source datasource {ns}/fedora doesn't exist");
    wait_for("the DataVolume waiting with CloneWithoutSource", || async {
        let st = dvs.get("vm-disk").await.ok()?.status?;
        let bound = st.conditions.iter().find(|c| c.type_ == "Bound")?;
        (st.phase == Some(Phase::Pending)
            && bound.reason.as_deref() == Some("CloneWithoutSource")
            && bound.message.as_deref() == Some(expected.as_str()))
        .then_some(())
    })
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    wait_for("the CloneWithoutSource event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("CloneWithoutSource")
                    && e.type_.as_deref() == Some("Warning")
                    && e.involved_object.name.as_deref() == Some("vm-disk")
            })
            .then_some(())
    })
    .await;
    // No PVC is made while waiting.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    assert!(pvcs.get_opt("vm-disk").await.unwrap().is_none());

    // The DataSource appears and becomes Ready on its (bound) PVC: the DataVolume clones that
    // PVC (no VolumeSnapshotClass here: host-assisted, into a target PVC recording it).
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "fedora-golden"},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}}))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    bind_pvc(&client, &ns, "fedora-golden").await;
    let sources: Api<DataSource> = Api::namespaced(client.clone(), &ns);
    let ds: DataSource = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora"},
        "spec": {"source": {"pvc": {"namespace": ns, "name": "fedora-golden"}}}}))
    .unwrap();
    sources.create(&PostParams::default(), &ds).await.unwrap();
    ready(&sources, "fedora", "True", "Ready").await;
    wait_for("the DataVolume cloning its sourceRef's PVC", || async {
        let st = dvs.get("vm-disk").await.ok()?.status?;
        (st.phase == Some(Phase::CloneScheduled)).then_some(())
    })
    .await;
    let target = pvcs.get("vm-disk").await.unwrap();
    assert_eq!(target.annotations()["cdi.kubevirt.io/cloneType"], "copy");
    for t in tasks {
        t.abort();
    }
}

/// A DataSource named `name` with `source`.
fn data_source(name: &str, source: serde_json::Value) -> DataSource {
    serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": name}, "spec": {"source": source}}))
    .unwrap()
}

#[tokio::test]
async fn a_data_source_naming_another_shows_and_follows_that_ones_source_one_deep() {
    let Some((client, ns, task)) = with_controller("ds-chain").await else {
        return;
    };
    let sources: Api<DataSource> = Api::namespaced(client.clone(), &ns);
    let create = |ds: DataSource| {
        let sources = sources.clone();
        async move { sources.create(&PostParams::default(), &ds).await.unwrap() }
    };
    // A DataSource `name` whose source is the DataSource `to` of its namespace.
    let refer = |name: &str, to: &str| {
        create(data_source(
            name,
            json!({"dataSource": {"namespace": "", "name": to}}),
        ))
    };
    let shown = |name: &'static str| {
        let sources = sources.clone();
        async move {
            let st = sources.get(name).await.unwrap().status.unwrap();
            st.source.unwrap_or_default()
        }
    };
    create(data_source(
        "fedora-42",
        json!({"pvc": {"namespace": "", "name": "fedora-42-disk"}}),
    ))
    .await;
    refer("fedora", "fedora-42").await;
    // The named one's source is missing: so is the referrer's, and it shows no source.
    assert_eq!(
        ready(&sources, "fedora", "False", "NotFound").await,
        "PVC not found"
    );
    assert_eq!(shown("fedora").await, Default::default());

    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pvc = |name: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap()
    };
    pvcs.create(&PostParams::default(), &pvc("fedora-42-disk"))
        .await
        .unwrap();
    ready(&sources, "fedora", "True", "Ready").await;
    assert_eq!(shown("fedora").await.pvc.unwrap().name, "fedora-42-disk");

    // The named one moves (as a DataImportCron moves its DataSource): the referrer follows.
    sources
        .patch(
            "fedora-42",
            &test_writes(),
            &Patch::Merge(
                json!({"spec": {"source": {"pvc": {"namespace": "", "name": "fedora-43-disk"}}}}),
            ),
        )
        .await
        .unwrap();
    ready(&sources, "fedora", "False", "NotFound").await;
    pvcs.create(&PostParams::default(), &pvc("fedora-43-disk"))
        .await
        .unwrap();
    ready(&sources, "fedora", "True", "Ready").await;
    assert_eq!(shown("fedora").await.pvc.unwrap().name, "fedora-43-disk");

    // What CDI does not follow, with its reasons and messages.
    refer("chained", "fedora").await;
    refer("selfish", "selfish").await;
    refer("dangling", "nothere").await;
    let elsewhere = json!({"dataSource": {"namespace": "golden-images", "name": "fedora"}});
    create(data_source("elsewhere", elsewhere)).await;
    assert_eq!(
        ready(&sources, "chained", "False", "MaxReferenceDepthReached").await,
        "DataSource reference chain exceeds maximum depth of 1"
    );
    ready(&sources, "selfish", "False", "SelfReference").await;
    assert_eq!(
        ready(&sources, "dangling", "False", "NotFound").await,
        "datasources.cdi.kubevirt.io \"nothere\" not found"
    );
    ready(&sources, "elsewhere", "False", "CrossNamespaceReference").await;
    task.abort();
}
