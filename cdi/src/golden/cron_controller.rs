//! The DataImportCron controller, run in the DataVolume controller's process as CDI runs it: on
//! schedule (a reconcile is queued for the next run) the template's source is polled and the
//! version recorded in CDI's `sourceDesiredDigest` annotation; the [`super::cron`] decisions
//! then create the import DataVolume, point the managed DataSource at the newest import once it
//! succeeded, and garbage-collect old imports. A cron whose managed DataSource another cron
//! manages does nothing but say so (CDI's ErrDataSourceAlreadyManaged); a failed import is
//! deleted when a new version arrives. This module only reads and writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};

use super::cron::{
    CLEANUP_LABEL, ERR_DATA_SOURCE_ALREADY_MANAGED, FINALIZER, ImportState, already_managed,
    annotation, decide, garbage, import_data_volume, import_state_of, labelled_manager,
    managed_data_source, next_run, poll_due,
};
use super::poll::{poll, poll_request, template_source};
use super::version::SourceVersion;
use crate::datavolume::request::SourceObjects;
use crate::datavolume::source::ImportSource;
use api::DataVolume;
use api::golden::{DATA_IMPORT_CRON_LABEL, DataImportCron, DataSource, RetentionPolicy};
use kubekit::error::{Error, Result};
use kubekit::kubeops;
use kubekit::metrics::Metrics;

/// Name in metrics, logs and the field manager.
pub const CONTROLLER: &str = "dataimportcron";
/// The longest wait between two looks at a cron.
const RESYNC: Duration = Duration::from_secs(300);

/// What the reconciles share.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Reconcile counts and failures.
    pub metrics: Arc<Metrics>,
    /// Registries polled without TLS verification (the DataVolume controller's).
    pub insecure_registries: Vec<String>,
}

/// Reconciles one DataImportCron.
pub async fn reconcile(cron: Arc<DataImportCron>, ctx: Arc<Context>) -> Result<Requeue> {
    let _measure = ctx.metrics.reconcile(CONTROLLER);
    let ns = cron.namespace().unwrap_or_default();
    let name = cron.name_any();
    let manager = kubeops::manager(CONTROLLER);
    let crons: Api<DataImportCron> = Api::namespaced(ctx.client.clone(), &ns);
    let has_finalizer = cron.finalizers().iter().any(|f| f == FINALIZER);
    if cron.metadata.deletion_timestamp.is_some() {
        if has_finalizer {
            if cron.spec.retention_policy() == RetentionPolicy::None {
                clean_up(&ctx.client, &ns, &name).await?;
            }
            kubeops::remove_finalizer(&crons, cron.as_ref(), FINALIZER, &manager).await?;
        }
        return Ok(Requeue::await_change());
    }
    if !has_finalizer {
        kubeops::add_finalizer(&crons, cron.as_ref(), FINALIZER, &manager).await?;
        return Ok(Requeue::await_change());
    }

    // CDI's shouldReconcileCron: a DataSource another cron manages is left to it.
    let sources: Api<DataSource> = Api::namespaced(ctx.client.clone(), &ns);
    let managed = kubeops::get(&sources, &cron.spec.managed_data_source).await?;
    if let Some(label) = managed.as_ref().and_then(|ds| labelled_manager(&cron, ds)) {
        let other = kubeops::get(&crons, label).await?;
        if let Some(message) = already_managed(&cron, managed.as_ref(), other.as_ref()) {
            tracing::info!(cron = %name, namespace = %ns, "{message}");
            let reference = cron.object_ref(&());
            let reason = ERR_DATA_SOURCE_ALREADY_MANAGED;
            kubeops::publish_event(&ctx.client, &reference, true, reason, &message, &manager).await;
            return Ok(Requeue::requeue(RESYNC));
        }
    }

    let now = Timestamp::now();
    let mut cron = cron.as_ref().clone();
    let mut polled_at = None;
    let schedule_on = !cron.spec.schedule.trim().is_empty();
    if schedule_on && poll_due(&cron, now) {
        let mut notes = BTreeMap::new();
        match poll_source(&ctx, &cron).await {
            Ok(v) => {
                notes.insert(annotation::SOURCE_DESIRED_DIGEST, v.digest());
                polled_at = Some(now);
            }
            Err(e) => tracing::warn!(cron = %name, namespace = %ns, error = %e, "polling failed"),
        }
        notes.insert(annotation::LAST_CRON_TIME, now.to_string());
        match next_run(&cron, now) {
            Ok(Some(next)) => {
                notes.insert(annotation::NEXT_CRON_TIME, next.to_string());
            }
            Ok(None) => {}
            Err(e) => return Err(Error::invalid(e.to_string())),
        }
        let patch = serde_json::json!({"metadata": {"annotations": notes}});
        cron = crons
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }

    let desired = cron
        .annotations()
        .get(annotation::SOURCE_DESIRED_DIGEST)
        .cloned();
    let state = import_state(&ctx.client, &cron, &ns).await?;
    let d = decide(
        &cron,
        desired.as_deref(),
        state,
        polled_at,
        Timestamp::now(),
    )
    .map_err(|e| Error::invalid(e.to_string()))?;
    let old_status = cron.status.clone();
    cron.status = Some(d.status.clone());
    if d.succeeded {
        mark_used(&ctx.client, &cron, &ns, &manager).await?;
    }
    update_data_source(&ctx.client, &cron, &ns, &manager).await?;
    if d.succeeded {
        collect_garbage(&ctx.client, &cron, &ns).await?;
    }
    let dvs: Api<DataVolume> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(failed) = &d.delete {
        tracing::info!(cron = %name, import = %failed, "deleting a failed import for a new version");
        kubeops::delete(&dvs, failed).await?;
    }
    if let (Some(dv_name), Some(digest)) = (&d.create, &desired) {
        let dv = import_data_volume(&cron, dv_name, digest);
        kubeops::create(&dvs, &dv, &manager).await?;
    }
    if old_status.as_ref() != Some(&d.status) {
        let doc = serde_json::json!({
            "apiVersion": DataImportCron::api_version(&()),
            "kind": DataImportCron::kind(&()),
            "status": d.status,
        });
        kubeops::apply_status(&crons, &name, doc, &manager).await?;
    }
    let wait = match next_run(&cron, Timestamp::now()) {
        Ok(Some(next)) => Duration::try_from(next.duration_since(Timestamp::now()))
            .unwrap_or_default()
            .clamp(Duration::from_secs(1), RESYNC),
        _ => RESYNC,
    };
    Ok(Requeue::requeue(wait))
}

/// Retries failed reconciles.
pub fn error_policy(cron: Arc<DataImportCron>, err: &Error, ctx: Arc<Context>) -> Requeue {
    kubeops::requeue_after(CONTROLLER, &cron.name_any(), err, &ctx.metrics, RESYNC)
}

/// Polls the template's source with the options its importer pod would get: its Secret,
/// header Secrets and CA ConfigMap, read from the API, go into the request in memory (the same
/// code builds local mode's).
async fn poll_source(ctx: &Context, cron: &DataImportCron) -> Result<SourceVersion> {
    let ns = cron.namespace().unwrap_or_default();
    let template = template_source(cron)?;
    let objects = read_objects(&ctx.client, &ns, &template.1).await?;
    let req = poll_request(&template, &objects, &ctx.insecure_registries)?;
    poll(&req.source, &req.http)
        .await
        .map_err(|e| Error::Poll(Box::new(e)))
}

/// The Secrets and ConfigMap `src` names, from the API.
async fn read_objects(client: &Client, ns: &str, src: &ImportSource) -> Result<SourceObjects> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let mut out = SourceObjects::default();
    for name in src.secret_ref.iter().chain(&src.secret_extra_headers) {
        let data = secrets.get(name).await?.data.unwrap_or_default();
        let data = data.into_iter().map(|(k, v)| (k, v.0)).collect();
        out.secrets.insert(name.clone(), data);
    }
    if let Some(name) = &src.cert_config_map {
        let data = maps.get(name).await?.data.unwrap_or_default();
        let data = data.into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
        out.config_maps.insert(name.clone(), data);
    }
    Ok(out)
}

/// The state of the cron's current import: its DataVolume's phase, else whether its PVC exists.
async fn import_state(client: &Client, cron: &DataImportCron, ns: &str) -> Result<ImportState> {
    let Some(first) = cron.status.as_ref().and_then(|s| s.current_imports.first()) else {
        return Ok(ImportState::None);
    };
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    if let Some(dv) = kubeops::get(&dvs, &first.data_volume_name).await? {
        return Ok(import_state_of(&dv));
    }
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    Ok(match kubeops::get(&pvcs, &first.data_volume_name).await? {
        Some(_) => ImportState::Pvc,
        None => ImportState::None,
    })
}

/// Stamps the last import's PVC with its use time and the cron's labels (CDI's `updateSource`).
async fn mark_used(client: &Client, cron: &DataImportCron, ns: &str, manager: &str) -> Result<()> {
    let Some(pvc) = super::cron::last_import(cron) else {
        return Ok(());
    };
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({"metadata": {
        "labels": super::cron::cron_labels(cron),
        "annotations": {super::gc::LAST_USE_ANNOTATION: Timestamp::now().to_string()},
    }});
    let params = PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    };
    match pvcs.patch(pvc, &params, &Patch::Merge(patch)).await {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map(|_| ()).map_err(Into::into),
    }
}

/// Creates the managed DataSource, or points the cron's own at the last import.
async fn update_data_source(
    client: &Client,
    cron: &DataImportCron,
    ns: &str,
    manager: &str,
) -> Result<()> {
    let api: Api<DataSource> = Api::namespaced(client.clone(), ns);
    let existing = kubeops::get(&api, &cron.spec.managed_data_source).await?;
    let Some(desired) = managed_data_source(cron, existing.as_ref()) else {
        return Ok(());
    };
    match existing {
        None => kubeops::create(&api, &desired, manager).await,
        Some(old) if old.metadata == desired.metadata && old.spec == desired.spec => Ok(()),
        Some(_) => {
            let params = kube::api::PostParams {
                field_manager: Some(manager.into()),
                ..Default::default()
            };
            api.replace(&desired.name_any(), &params, &desired).await?;
            Ok(())
        }
    }
}

/// Deletes the imports beyond `importsToKeep` (the DataVolume, else the PVC, as CDI does).
async fn collect_garbage(client: &Client, cron: &DataImportCron, ns: &str) -> Result<()> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{DATA_IMPORT_CRON_LABEL}={}", cron.name_any()));
    let listed: Vec<(String, Option<String>)> = pvcs
        .list(&lp)
        .await?
        .into_iter()
        .map(|p| {
            let used = p.annotations().get(super::gc::LAST_USE_ANNOTATION).cloned();
            (p.name_any(), used)
        })
        .collect();
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    for name in garbage(cron, &listed) {
        tracing::info!(cron = %cron.name_any(), import = %name, "deleting an old import");
        kubeops::delete(&dvs, &name).await?;
        kubeops::delete(&pvcs, &name).await?;
    }
    Ok(())
}

/// `retentionPolicy: None`: the cron's DataSource, DataVolumes and PVCs go with it.
async fn clean_up(client: &Client, ns: &str, cron: &str) -> Result<()> {
    let lp = ListParams::default().labels(&format!(
        "{DATA_IMPORT_CRON_LABEL}={cron},{CLEANUP_LABEL}=true"
    ));
    let sources: Api<DataSource> = Api::namespaced(client.clone(), ns);
    for ds in sources.list(&lp).await? {
        kubeops::delete(&sources, &ds.name_any()).await?;
    }
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    for dv in dvs.list(&lp).await? {
        kubeops::delete(&dvs, &dv.name_any()).await?;
    }
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    for pvc in pvcs.list(&lp).await? {
        kubeops::delete(&pvcs, &pvc.name_any()).await?;
    }
    Ok(())
}

/// The cron an object belongs to, by its label.
fn owning_cron<K: Resource<DynamicType = ()>>(obj: &K) -> Option<ObjectRef<DataImportCron>> {
    let name = obj.meta().labels.as_ref()?.get(DATA_IMPORT_CRON_LABEL)?;
    let ns = obj.meta().namespace.as_deref()?;
    (!name.is_empty()).then(|| ObjectRef::new(name).within(ns))
}

/// Runs the controller (DataImportCrons of `namespace`, or all) until the process stops.
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>) {
    let client = ctx.client.clone();
    let results = Controller::new(
        kubeops::scoped::<DataImportCron>(&client, namespace),
        watcher::Config::default(),
    )
    .watches(
        kubeops::scoped::<DataVolume>(&client, namespace),
        watcher::Config::default().labels(DATA_IMPORT_CRON_LABEL),
        |dv| owning_cron(&dv),
    )
    .watches(
        kubeops::scoped::<DataSource>(&client, namespace),
        watcher::Config::default().labels(DATA_IMPORT_CRON_LABEL),
        |ds| owning_cron(&ds),
    )
    .shutdown_on_signal()
    .run(reconcile, error_policy, ctx);
    kubeops::drain(results).await;
}
