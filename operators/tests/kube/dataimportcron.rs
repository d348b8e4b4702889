//! The DataImportCron controller against the real API server, under the DataVolume controller's
//! generated RBAC, polling a real nginx: the first poll creates the import DataVolume (CDI's
//! name, labels and annotations); once the test (playing the DataVolume controller) marks it
//! Succeeded, the cron creates and owns the DataSource pointing at it and is UpToDate; a new
//! file version creates the next import, and with `importsToKeep: 1` the first is deleted.
//! A pre-existing labelled DataSource is taken with `controller: false`; `retentionPolicy:
//! None` deletes the cron's objects with it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use api::golden::DataImportCron;
use api::{DataSource, DataVolume};
use cdi::golden::cron_controller::{self, Context};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use testkit::nginx::{Nginx, NginxConfig};

use crate::support::{component_client, namespace, test_writes, wait_for};

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
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    dvs.patch_status(
        name,
        &test_writes(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .unwrap();
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
    let crons: Api<DataImportCron> = Api::namespaced(client.clone(), &ns);
    crons
        .create(
            &PostParams::default(),
            &cron(&nginx.url("/disk.img"), 1, "All"),
        )
        .await
        .unwrap();

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
    let crons: Api<DataImportCron> = Api::namespaced(client.clone(), &ns);
    crons
        .create(
            &PostParams::default(),
            &cron(&nginx.url("/disk.img"), 3, "None"),
        )
        .await
        .unwrap();
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
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    dvs.patch_status(
        name,
        &test_writes(),
        &Patch::Merge(json!({"status": {"phase": "Failed", "conditions": [
            {"type": "Running", "status": "False", "reason": "Error"}]}})),
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
    let crons: Api<DataImportCron> = Api::namespaced(client.clone(), &ns);
    crons
        .create(
            &PostParams::default(),
            &cron(&nginx.url("/disk.img"), 3, "All"),
        )
        .await
        .unwrap();
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
