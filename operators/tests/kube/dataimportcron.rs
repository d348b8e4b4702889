//! The DataImportCron controller against the real API server, under the DataVolume controller's
//! generated RBAC, polling a real nginx: the first poll creates the import DataVolume (CDI's
//! name, labels and annotations); once the test (playing the DataVolume controller) marks it
//! Succeeded, the cron creates and owns the DataSource pointing at it and is UpToDate; a new
//! file version creates the next import, and with `importsToKeep: 1` the first is deleted.
//! A pre-existing labelled DataSource is taken with `controller: false`; `retentionPolicy:
//! None` deletes the cron's objects with it.
//!
//! The snapshot format (the StorageProfile's `dataImportCronSourceFormat: snapshot`), with the
//! minimal snapshot CRDs of `clone.rs` and the test playing the snapshotter: each version
//! becomes a VolumeSnapshot the DataSource points at once it is ready, its import's
//! DataVolume and PVC go, old snapshots are collected, and a DataVolume with a `sourceRef`
//! restores the snapshot on the node of its (deleted) PVC; a switch of format applies to the
//! current version.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use api::golden::DataImportCron;
use api::snapshot::VolumeSnapshot;
use api::{DataSource, DataVolume, StorageProfile};
use cdi::golden::cron_controller::{self, Context};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use testkit::nginx::{Nginx, NginxConfig};

use crate::support::{apply, component_client, namespace, test_writes, wait_for};

/// Writes `version` of the served file with its own mtime (nginx's ETag is mtime and length).
fn publish(root: &std::path::Path, version: u64) {
    let path = root.join("disk.img");
    std::fs::write(&path, vec![version as u8; 4096]).unwrap();
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + version * 100);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// nginx serving version 1 of the file from a directory of its own.
fn serve_version_1() -> (tempfile::TempDir, Nginx) {
    let www = tempfile::tempdir().unwrap();
    publish(www.path(), 1);
    let nginx = Nginx::start(NginxConfig {
        root: www.path().to_path_buf(),
        ranges: true,
        ..Default::default()
    });
    (www, nginx)
}

fn cron(url: &str, keep: u32, retention: &str) -> DataImportCron {
    serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
        "metadata": {"name": "fedora-cron"},
        "spec": {
            "schedule": "@every 1s",
            "managedDataSource": "fedora",
            "importsToKeep": keep,
            "retentionPolicy": retention,
            "template": {"spec": {"source": {"http": {"url": url}},
                                  "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}
        }
    }))
    .unwrap()
}

/// Plays the DataVolume controller: the import's PVC exists and the DataVolume succeeded.
async fn succeed(client: &Client, ns: &str, name: &str) {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    dv_status(client, ns, name, json!({"phase": "Succeeded"})).await;
}

/// The name of the cron's import DataVolume other than `not`.
async fn import(dvs: &Api<DataVolume>, not: Option<&str>) -> DataVolume {
    wait_for("the import DataVolume", || async {
        dvs.list(&Default::default())
            .await
            .ok()?
            .into_iter()
            .find(|d| d.metadata.name.as_deref() != not && d.metadata.deletion_timestamp.is_none())
    })
    .await
}

async fn up_to_date(crons: &Api<DataImportCron>, last: &str) {
    wait_for(&format!("the cron UpToDate with {last}"), || async {
        let st = crons.get("fedora-cron").await.ok()?.status?;
        let c = st.conditions.iter().find(|c| c.type_ == "UpToDate")?;
        (c.status == "True"
            && c.reason.as_deref() == Some("UpToDate")
            && st.last_imported_pvc.as_ref()?.name == last
            && st.last_import_timestamp.is_some()
            && st.last_execution_timestamp.is_some())
        .then_some(())
    })
    .await
}

/// The cron's last poll time (CDI's lastCronTime annotation).
async fn last_poll(crons: &Api<DataImportCron>) -> Option<String> {
    let c = crons.get("fedora-cron").await.ok()?;
    c.metadata
        .annotations?
        .get("cdi.kubevirt.io/storage.import.lastCronTime")
        .cloned()
}

/// Creates the DataImportCron `c` in `ns`: the API of the namespace's crons.
async fn created(client: &Client, ns: &str, c: &DataImportCron) -> Api<DataImportCron> {
    let crons: Api<DataImportCron> = Api::namespaced(client.clone(), ns);
    crons.create(&PostParams::default(), c).await.unwrap();
    crons
}

async fn controller(ns: &str) -> Option<tokio::task::JoinHandle<()>> {
    let client = component_client(api::names::component::DATAVOLUME_CONTROLLER).await?;
    let ctx = Arc::new(Context {
        client,
        metrics: Arc::default(),
        insecure_registries: Vec::new(),
    });
    let ns = ns.to_string();
    Some(tokio::spawn(async move {
        cron_controller::run(ctx, Some(&ns)).await
    }))
}

#[tokio::test]
async fn each_new_version_is_imported_pointed_at_and_old_imports_collected() {
    let Some((client, ns)) = namespace("cron", &[]).await else {
        return;
    };
    let (www, nginx) = serve_version_1();
    let task = controller(&ns).await.unwrap();
    let crons = created(&client, &ns, &cron(&nginx.url("/disk.img"), 1, "All")).await;

    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    let first = import(&dvs, None).await;
    let first_name = first.metadata.name.clone().unwrap();
    assert!(
        first_name.starts_with("fedora-") && first_name.len() == 19,
        "{first_name}"
    );
    let labels = first.metadata.labels.clone().unwrap();
    assert_eq!(labels["cdi.kubevirt.io/dataImportCron"], "fedora-cron");
    assert_eq!(
        first.metadata.annotations.as_ref().unwrap()["cdi.kubevirt.io/storage.bind.immediate.requested"],
        "true"
    );
    // The controller writes the cron's annotation and status after creating the import.
    let (digest, current) = wait_for("the cron's digest and current import", || async {
        let c = crons.get("fedora-cron").await.ok()?;
        let digest = c
            .annotations()
            .get("cdi.kubevirt.io/storage.import.sourceDesiredDigest")?
            .clone();
        let current = c.status?.current_imports.first()?.digest.clone();
        Some((digest, current))
    })
    .await;
    assert_eq!(current, digest);

    succeed(&client, &ns, &first_name).await;
    up_to_date(&crons, &first_name).await;
    let sources: Api<DataSource> = Api::namespaced(client.clone(), &ns);
    let ds = wait_for("the DataSource at the first import", || async {
        let ds = sources.get("fedora").await.ok()?;
        (ds.spec.source.pvc.as_ref()?.name == first_name).then_some(ds)
    })
    .await;
    let owner = &ds.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("DataImportCron", Some(true))
    );

    // A poll while the file stays the same creates nothing.
    let polled = last_poll(&crons).await;
    wait_for("another poll", || async {
        (last_poll(&crons).await != polled).then_some(())
    })
    .await;
    assert_eq!(dvs.list(&Default::default()).await.unwrap().items.len(), 1);

    // A new version: the next import, then the first one goes (importsToKeep 1).
    publish(www.path(), 2);
    let second = import(&dvs, Some(&first_name)).await;
    let second_name = second.metadata.name.clone().unwrap();
    succeed(&client, &ns, &second_name).await;
    up_to_date(&crons, &second_name).await;
    wait_for("the DataSource at the second import", || async {
        let ds = sources.get("fedora").await.ok()?;
        (ds.spec.source.pvc?.name == second_name).then_some(())
    })
    .await;
    wait_for("the first import deleted", || async {
        dvs.get_opt(&first_name).await.ok()?.is_none().then_some(())
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn a_labelled_data_source_is_taken_and_retention_none_deletes_with_the_cron() {
    let Some((client, ns)) = namespace("cron-take", &[]).await else {
        return;
    };
    let (_www, nginx) = serve_version_1();
    let sources: Api<DataSource> = Api::namespaced(client.clone(), &ns);
    let ds: DataSource = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora", "labels": {"cdi.kubevirt.io/dataImportCron": "fedora-cron"}},
        "spec": {"source": {}}
    }))
    .unwrap();
    sources.create(&PostParams::default(), &ds).await.unwrap();
    let task = controller(&ns).await.unwrap();
    let crons = created(&client, &ns, &cron(&nginx.url("/disk.img"), 3, "None")).await;
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    let first = import(&dvs, None).await.metadata.name.unwrap();
    succeed(&client, &ns, &first).await;
    up_to_date(&crons, &first).await;
    let taken = wait_for("the DataSource taken", || async {
        let ds = sources.get("fedora").await.ok()?;
        ds.spec.source.pvc.as_ref()?;
        ds.metadata.owner_references.clone()
    })
    .await;
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].controller, Some(false));

    crons
        .delete("fedora-cron", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the cron's objects deleted with it", || async {
        let gone_cron = crons.get_opt("fedora-cron").await.ok()?.is_none();
        let gone_ds = sources.get_opt("fedora").await.ok()?.is_none();
        let gone_dv = dvs.get_opt(&first).await.ok()?.is_none();
        (gone_cron && gone_ds && gone_dv).then_some(())
    })
    .await;
    task.abort();
}

/// Plays the DataVolume controller: the import failed for good.
async fn fail(client: &Client, ns: &str, name: &str) {
    let failed = json!({"phase": "Failed", "conditions": [
        {"type": "Running", "status": "False", "reason": "Error"}]});
    dv_status(client, ns, name, failed).await;
}

/// Plays the DataVolume controller: the DataVolume `name`'s status is `status`.
async fn dv_status(client: &Client, ns: &str, name: &str, status: serde_json::Value) {
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    dvs.patch_status(
        name,
        &test_writes(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_failed_import_is_deleted_when_a_new_version_arrives() {
    let Some((client, ns)) = namespace("cron-failed", &[]).await else {
        return;
    };
    let (www, nginx) = serve_version_1();
    let task = controller(&ns).await.unwrap();
    let crons = created(&client, &ns, &cron(&nginx.url("/disk.img"), 3, "All")).await;
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    let first = import(&dvs, None).await.metadata.name.unwrap();
    fail(&client, &ns, &first).await;
    // While the version stays, the failed import stays (as CDI keeps it).
    let polled = last_poll(&crons).await;
    wait_for("another poll", || async {
        (last_poll(&crons).await != polled).then_some(())
    })
    .await;
    assert!(dvs.get_opt(&first).await.unwrap().is_some());
    // A new version: the failed DataVolume goes, the new version is imported.
    publish(www.path(), 2);
    let second = import(&dvs, Some(&first)).await.metadata.name.unwrap();
    wait_for("the failed import deleted", || async {
        dvs.get_opt(&first).await.ok()?.is_none().then_some(())
    })
    .await;
    // The status follows in the cron's next status patch.
    wait_for("the status to list only the new import", || async {
        let st = crons.get("fedora-cron").await.ok()?.status?;
        let names: Vec<_> = st
            .current_imports
            .iter()
            .map(|i| &i.data_volume_name)
            .collect();
        (names == [&second]).then_some(())
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn a_data_source_another_cron_manages_is_left_to_it_with_cdis_warning() {
    let Some((client, ns)) = namespace("cron-taken", &[]).await else {
        return;
    };
    let (_www, nginx) = serve_version_1();
    let crons: Api<DataImportCron> = Api::namespaced(client.clone(), &ns);
    // The first cron manages "fedora" (its label is on the DataSource).
    let mut first = cron(&nginx.url("/disk.img"), 3, "All");
    first.metadata.name = Some("fedora-first".into());
    first.spec.schedule = String::new();
    crons.create(&PostParams::default(), &first).await.unwrap();
    let sources: Api<DataSource> = Api::namespaced(client.clone(), &ns);
    let ds: DataSource = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora", "labels": {"cdi.kubevirt.io/dataImportCron": "fedora-first"}},
        "spec": {"source": {}}
    }))
    .unwrap();
    sources.create(&PostParams::default(), &ds).await.unwrap();
    // A second cron names the same DataSource: it does nothing but warn.
    let task = controller(&ns).await.unwrap();
    crons
        .create(
            &PostParams::default(),
            &cron(&nginx.url("/disk.img"), 3, "All"),
        )
        .await
        .unwrap();
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), &ns);
    let warning = wait_for("the ErrDataSourceAlreadyManaged event", || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ErrDataSourceAlreadyManaged"))
    })
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert_eq!(warning.involved_object.name.as_deref(), Some("fedora-cron"));
    assert_eq!(
        warning.message.as_deref(),
        Some("DataSource fedora is already managed by DataImportCron fedora-first")
    );
    let polled = crons.get("fedora-cron").await.unwrap();
    assert!(
        polled
            .annotations()
            .get("cdi.kubevirt.io/storage.import.lastCronTime")
            .is_none(),
        "the second cron polled"
    );
    assert!(
        dvs_in(&client, &ns).await.is_empty(),
        "the second cron imported"
    );
    let ds = sources.get("fedora").await.unwrap();
    assert_eq!(
        ds.labels()["cdi.kubevirt.io/dataImportCron"],
        "fedora-first"
    );
    task.abort();
}

async fn dvs_in(client: &Client, ns: &str) -> Vec<DataVolume> {
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    dvs.list(&Default::default()).await.unwrap().items
}

/// A StorageClass of the hostpath driver named after the namespace, the VolumeSnapshotClasses
/// `snap-<ns>` and `cron-snap-<ns>` of that driver, and the class's StorageProfile asking for
/// `format` with the first as its snapshot class and the second for crons (spec and status: a
/// profile reconciler of another test keeps them; other tests' classes of the driver exist, so
/// the profile names its own).
async fn storage(client: &Client, ns: &str, format: &str) -> String {
    let class = format!("hostpath-{ns}");
    let driver = crate::clone::DRIVER;
    apply(
        client,
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": class}, "provisioner": driver,
                "allowVolumeExpansion": true}),
    )
    .await
    .unwrap();
    for name in [format!("snap-{ns}"), format!("cron-snap-{ns}")] {
        apply(
            client,
            &json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
                    "metadata": {"name": name}, "driver": driver, "deletionPolicy": "Delete"}),
        )
        .await
        .unwrap();
    }
    set_format(client, ns, &class, format).await;
    class
}

/// The StorageProfile of `class` asks for `format` (what an admin's `kubectl patch
/// storageprofile` and the profile reconciler make of it).
async fn set_format(client: &Client, ns: &str, class: &str, format: &str) {
    let profile =
        json!({"dataImportCronSourceFormat": format, "snapshotClass": format!("snap-{ns}")});
    // CDI's annotation for the crons' snapshots names another class of the driver.
    let for_crons =
        json!({"cdi.kubevirt.io/snapshotClassForDataImportCron": format!("cron-snap-{ns}")});
    apply(
        client,
        &json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "StorageProfile",
                "metadata": {"name": class, "annotations": for_crons}, "spec": profile}),
    )
    .await
    .unwrap();
    let mut status = profile.clone();
    status["storageClass"] = json!(class);
    Api::<StorageProfile>::all(client.clone())
        .patch_status(
            class,
            &test_writes(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
}

/// Plays the DataVolume controller and the provisioner for an import of `class`: a PV pinned
/// to node-a by the hostpath driver's topology, the PVC bound to it without a selected node
/// (as a populator leaves it), and the DataVolume Succeeded. A PVC of the name still being
/// deleted (no controller-manager here removes its protection finalizer) is let go first.
async fn succeed_on(client: &Client, ns: &str, name: &str, class: &str) {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    if pvcs.get_opt(name).await.unwrap().is_some() {
        pvcs.patch(
            name,
            &test_writes(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        wait_for("the old PVC gone", || async {
            pvcs.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await;
    }
    let pv = format!("pv-{ns}-{name}");
    apply(
        client,
        &json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": class,
                "csi": {"driver": crate::clone::DRIVER, "volumeHandle": pv},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.hostpath.csi/node", "operator": "In",
                     "values": ["node-a"]}]}]}}}}),
    )
    .await
    .unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "volumeMode": "Filesystem", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    pvcs.patch_status(
        name,
        &test_writes(),
        &Patch::Merge(json!({"status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}})),
    )
    .await
    .unwrap();
    dv_status(client, ns, name, json!({"phase": "Succeeded"})).await;
}

/// The cron of `cron()` on `class`, labelled with a default preference (passed on).
fn cron_on(url: &str, keep: u32, class: &str) -> DataImportCron {
    let mut c = cron(url, keep, "All");
    c.labels_mut().insert(
        "instancetype.kubevirt.io/default-preference".into(),
        "fedora".into(),
    );
    c.spec
        .template
        .spec
        .storage
        .as_mut()
        .unwrap()
        .storage_class_name = Some(class.into());
    c
}

/// Waits for the VolumeSnapshot `name`.
async fn snapshot(snapshots: &Api<VolumeSnapshot>, name: &str) -> VolumeSnapshot {
    wait_for(&format!("the snapshot {name}"), || async {
        snapshots.get_opt(name).await.ok()?
    })
    .await
}

/// Plays the snapshotter: `name` is ready to use, restorable at 1 GiB.
async fn snapshot_ready(snapshots: &Api<VolumeSnapshot>, name: &str) {
    snapshots
        .patch_status(
            name,
            &test_writes(),
            &Patch::Merge(json!({"status": {"readyToUse": true, "restoreSize": "1Gi"}})),
        )
        .await
        .unwrap();
}

/// Plays the snapshotter for the import `name` (its snapshot taken, then ready) and waits for
/// what follows: the DataSource at the snapshot, the import's DataVolume and PVC deleted.
async fn snapshot_becomes_the_import(client: &Client, ns: &str, name: &str) {
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), ns);
    snapshot(&snapshots, name).await;
    snapshot_ready(&snapshots, name).await;
    pointed_at_snapshot(client, ns, name).await;
    import_deleted(client, ns, name).await;
}

/// Waits until the snapshot `name` is deleted (`why`).
async fn snapshot_deleted(snapshots: &Api<VolumeSnapshot>, name: &str, why: &str) {
    wait_for(why, || async {
        snapshots.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
}

/// Waits until the DataSource points at the snapshot `name` and the cron records it as its
/// last import, in the snapshot format, up to date.
async fn pointed_at_snapshot(client: &Client, ns: &str, name: &str) {
    let sources: Api<DataSource> = Api::namespaced(client.clone(), ns);
    let crons: Api<DataImportCron> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("the DataSource at snapshot {name}"), || async {
        let ds = sources.get("fedora").await.ok()?;
        let snap = ds.spec.source.snapshot?;
        (snap.name == name && snap.namespace == ns && ds.spec.source.pvc.is_none()).then_some(())
    })
    .await;
    wait_for(
        &format!("the cron's last import {name} as a snapshot"),
        || async {
            let st = crons.get("fedora-cron").await.ok()?.status?;
            let up = st.conditions.iter().find(|c| c.type_ == "UpToDate")?;
            (st.last_imported_pvc?.name == name
                && st.source_format.as_deref() == Some("snapshot")
                && up.status == "True")
                .then_some(())
        },
    )
    .await;
}

/// Waits until the import's DataVolume is gone and its PVC gone or being deleted (its
/// protection finalizer waits for a controller-manager the test server lacks).
async fn import_deleted(client: &Client, ns: &str, name: &str) {
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("the import {name}'s DataVolume and PVC deleted"),
        || async {
            let dv_gone = dvs.get_opt(name).await.ok()?.is_none();
            let pvc_going = pvcs
                .get_opt(name)
                .await
                .ok()?
                .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
            (dv_gone && pvc_going).then_some(())
        },
    )
    .await;
}

/// A cron on a class of its own whose profile asks for `format`, keeping `keep` imports, with
/// its controller running and its first import succeeded.
struct OnClass {
    client: Client,
    ns: String,
    class: String,
    www: tempfile::TempDir,
    /// Serves `www` (bind it, or it stops at once).
    _nginx: Nginx,
    task: tokio::task::JoinHandle<()>,
    crons: Api<DataImportCron>,
    dvs: Api<DataVolume>,
    snapshots: Api<VolumeSnapshot>,
    sources: Api<DataSource>,
    /// The first import's name.
    first: String,
}

async fn cron_on_class(prefix: &str, format: &str, keep: u32) -> Option<OnClass> {
    let (client, ns) = namespace(prefix, &[]).await?;
    crate::clone::install_snapshot_crds(&client).await;
    let class = storage(&client, &ns, format).await;
    let (www, nginx) = serve_version_1();
    let task = controller(&ns).await.unwrap();
    let crons = created(
        &client,
        &ns,
        &cron_on(&nginx.url("/disk.img"), keep, &class),
    )
    .await;
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    let first = import(&dvs, None).await.metadata.name.unwrap();
    succeed_on(&client, &ns, &first, &class).await;
    Some(OnClass {
        snapshots: Api::namespaced(client.clone(), &ns),
        sources: Api::namespaced(client.clone(), &ns),
        client,
        ns,
        class,
        www,
        _nginx: nginx,
        task,
        crons,
        dvs,
        first,
    })
}

#[tokio::test]
async fn in_the_snapshot_format_each_version_is_a_snapshot_the_data_source_restores() {
    let Some(OnClass {
        client,
        ns,
        class,
        www,
        task,
        dvs,
        snapshots,
        sources,
        first,
        _nginx,
        ..
    }) = cron_on_class("cron-snap", "snapshot", 1).await
    else {
        return;
    };
    // The import succeeded: its PVC is snapshotted, as CDI names and labels it.
    let s = snapshot(&snapshots, &first).await;
    assert_eq!(
        s.spec.source.persistent_volume_claim_name.as_deref(),
        Some(first.as_str())
    );
    // The profile's class for crons (its annotation), over its snapshotClass.
    assert_eq!(
        s.spec.volume_snapshot_class_name,
        Some(format!("cron-snap-{ns}"))
    );
    let labels = s.metadata.labels.clone().unwrap();
    assert_eq!(labels["cdi.kubevirt.io/dataImportCron"], "fedora-cron");
    assert_eq!(
        labels["instancetype.kubevirt.io/default-preference"],
        "fedora"
    );
    let ann = s.metadata.annotations.clone().unwrap();
    assert!(ann.contains_key("cdi.kubevirt.io/storage.import.lastUseTime"));
    assert_eq!(
        ann["cdi.kubevirt.io/storage.import.sourceVolumeMode"],
        "Filesystem"
    );
    assert_eq!(
        ann["quarry.kubevirt.io/sourceNode"], "node-a",
        "the PV's node"
    );
    // Not ready yet: the DataSource points at nothing yet (the first version), and the
    // import's DataVolume stays.
    let ds = sources.get("fedora").await.unwrap();
    assert_eq!(ds.spec.source, Default::default());
    assert!(dvs.get_opt(&first).await.unwrap().is_some());

    snapshot_becomes_the_import(&client, &ns, &first).await;

    // The next version, the same way; the first snapshot is collected (importsToKeep 1).
    publish(www.path(), 2);
    let second = import(&dvs, Some(&first)).await.metadata.name.unwrap();
    succeed_on(&client, &ns, &second, &class).await;
    snapshot_becomes_the_import(&client, &ns, &second).await;
    snapshot_deleted(&snapshots, &first, "the first snapshot collected").await;

    // A DataVolume cloning the DataSource restores its snapshot on the snapshot's node (the
    // PVC it was taken of is gone).
    let _dv_controller = crate::datavolume::start(&ns, crate::datavolume::config(), None).await;
    let ds_task = {
        let (client, ns) = (client.clone(), ns.clone());
        tokio::spawn(async move {
            cdi::golden::controller::run(client, Arc::default(), Some(&ns)).await
        })
    };
    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "vm-disk"},
        "spec": {"sourceRef": {"kind": "DataSource", "name": "fedora"},
                 "storage": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                             "resources": {"requests": {"storage": "1Gi"}}}}
    }))
    .unwrap();
    dvs.create(&PostParams::default(), &dv).await.unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let target = wait_for("the restored PVC", || async {
        pvcs.get_opt("vm-disk").await.ok()?
    })
    .await;
    let source = target.spec.as_ref().unwrap().data_source.clone().unwrap();
    assert_eq!(
        (source.kind.as_str(), source.name.as_str()),
        ("VolumeSnapshot", second.as_str())
    );
    assert_eq!(
        target.annotations()["volume.kubernetes.io/selected-node"],
        "node-a"
    );
    wait_for("the DataVolume restoring the snapshot", || async {
        let st = dvs.get("vm-disk").await.ok()?.status?;
        (st.phase == Some(api::Phase::CloneFromSnapshotSourceInProgress)).then_some(())
    })
    .await;
    ds_task.abort();
    task.abort();
}

#[tokio::test]
async fn a_switch_of_format_applies_to_the_current_version() {
    let Some(OnClass {
        client,
        ns,
        class,
        task,
        crons,
        dvs,
        snapshots,
        sources,
        first,
        www: _www,
        _nginx,
    }) = cron_on_class("cron-switch", "pvc", 3).await
    else {
        return;
    };
    up_to_date(&crons, &first).await;
    let at_pvc = || async {
        wait_for(&format!("the DataSource at PVC {first}"), || async {
            let ds = sources.get("fedora").await.ok()?;
            (ds.spec.source.pvc?.name == first).then_some(())
        })
        .await
    };
    at_pvc().await;
    assert!(snapshots.get_opt(&first).await.unwrap().is_none());

    // To snapshots: the version's PVC is snapshotted, and replaced by the snapshot once ready.
    set_format(&client, &ns, &class, "snapshot").await;
    snapshot_becomes_the_import(&client, &ns, &first).await;

    // Back to PVCs: the version is imported again while the snapshot serves, then the
    // DataSource moves to the PVC and the snapshot goes.
    set_format(&client, &ns, &class, "pvc").await;
    wait_for("the version imported again", || async {
        let dv = dvs.get_opt(&first).await.ok()??;
        dv.metadata.deletion_timestamp.is_none().then_some(())
    })
    .await;
    let ds = sources.get("fedora").await.unwrap();
    assert_eq!(ds.spec.source.snapshot.unwrap().name, first);
    succeed_on(&client, &ns, &first, &class).await;
    at_pvc().await;
    snapshot_deleted(&snapshots, &first, "the replaced snapshot deleted").await;
    let st = crons.get("fedora-cron").await.unwrap().status.unwrap();
    assert_eq!(st.source_format.as_deref(), Some("pvc"));
    task.abort();
}
