//! The DataImportCron controller, run in the DataVolume controller's process as CDI runs it: on
//! schedule (a reconcile is queued for the next run) the template's source is polled and the
//! version recorded in CDI's `sourceDesiredDigest` annotation; the [`super::cron`] decisions
//! then create the import DataVolume, keep a succeeded import as a VolumeSnapshot when the
//! StorageProfile of the cron's StorageClass asks for the `snapshot` format (read at every
//! reconcile), point the managed DataSource at the newest import, and garbage-collect old
//! imports. A cron whose managed DataSource another cron manages does nothing but say so (CDI's
//! ErrDataSourceAlreadyManaged); a failed import is deleted when a new version arrives. This
//! module only reads and writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::cron::{
    CLEANUP_LABEL, ERR_DATA_SOURCE_ALREADY_MANAGED, FINALIZER, ImportState, Seen, already_managed,
    annotation, decide, garbage, import_data_volume, import_state_of, labelled_manager,
    managed_data_source, next_poll, next_run, poll_due,
};
use super::poll::{poll, poll_request, template_source};
use super::snapshot::{FormatError, SourceFormat, import_snapshot, snapshot_class, volume_node};
use super::version::SourceVersion;
use crate::datavolume::clone::observe::snapshot_classes;
use crate::datavolume::clone::reason::NO_VOLUME_SNAPSHOT_CLASS;
use crate::datavolume::request::SourceObjects;
use crate::datavolume::source::ImportSource;
use crate::settings::default_class;
use api::datavolume::ContentType;
use api::golden::{DATA_IMPORT_CRON_LABEL, DataImportCron, DataSource, RetentionPolicy};
use api::snapshot::VolumeSnapshot;
use api::{DataVolume, StorageProfile};
use kubekit::error::{Error, Result};
use kubekit::kubeops;
use kubekit::metrics::Metrics;

/// Name in metrics, logs and the field manager.
pub const CONTROLLER: &str = "dataimportcron";
/// The longest wait between two looks at a cron.
const RESYNC: Duration = Duration::from_secs(300);
/// How soon a cron looks again at a snapshot it awaits (snapshots are not watched: the
/// snapshot API may not be installed, and a watch of a missing kind only fails).
const SNAPSHOT_POLL: Duration = Duration::from_secs(2);

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
    let keeping = keeping(&ctx.client, &cron).await?;
    let seen = Seen {
        import: import_state(&ctx.client, &cron, &ns).await?,
        snapshot: current_snapshot(&ctx.client, &cron, &ns).await?,
        format: keeping.format(),
    };
    let d = decide(&cron, desired.as_deref(), seen, polled_at, Timestamp::now())
        .map_err(|e| Error::invalid(e.to_string()))?;
    let old_status = cron.status.clone();
    cron.status = Some(d.status.clone());
    if let Keeping::PvcInstead(why) = &keeping
        && d.succeeded
        && old_status
            .as_ref()
            .and_then(|s| s.last_imported_pvc.as_ref())
            != d.status.last_imported_pvc.as_ref()
    {
        // Said once, when an import is kept as a PVC although snapshots are asked for.
        let last = super::cron::last_import(&cron).unwrap_or_default();
        let message = format!("import {last} is kept as a PVC, not a VolumeSnapshot: {why}");
        tracing::warn!(cron = %name, namespace = %ns, "{message}");
        let reference = cron.object_ref(&());
        kubeops::publish_event(
            &ctx.client,
            &reference,
            true,
            NO_VOLUME_SNAPSHOT_CLASS,
            &message,
            &manager,
        )
        .await;
    }
    if d.succeeded {
        mark_used(&ctx.client, &cron, &ns, &manager).await?;
    }
    update_data_source(&ctx.client, &cron, &ns, &manager).await?;
    if d.succeeded {
        collect_garbage(&ctx.client, &cron, &ns).await?;
    }
    let dvs: Api<DataVolume> = Api::namespaced(ctx.client.clone(), &ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(failed) = &d.delete {
        tracing::info!(cron = %name, import = %failed, "deleting a failed import for a new version");
        kubeops::delete(&dvs, failed).await?;
    }
    if let (Some(pvc_name), Keeping::Snapshot(class)) = (&d.take_snapshot, &keeping)
        && let Some(pvc) = kubeops::get(&pvcs, pvc_name).await?
    {
        let pv = match pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
            Some(pv) => kubeops::get(&Api::<PersistentVolume>::all(ctx.client.clone()), pv).await?,
            None => None,
        };
        let node = volume_node(&pvc, pv.as_ref());
        tracing::info!(cron = %name, import = %pvc_name, class = %class, node = ?node, "taking the import's snapshot");
        let snapshot = import_snapshot(&cron, &pvc, class, node.as_deref(), Timestamp::now());
        kubeops::create(&snapshots, &snapshot, &manager).await?;
    }
    if let Some(import) = &d.delete_import {
        // As CDI: the snapshot is the import now; the DataVolume (and with it, or else
        // directly, the PVC) goes.
        tracing::info!(cron = %name, import = %import, "snapshot ready: deleting the import's DataVolume and PVC");
        kubeops::delete(&dvs, import).await?;
        kubeops::delete(&pvcs, import).await?;
    }
    if let Some(replaced) = &d.delete_snapshot {
        tracing::info!(cron = %name, import = %replaced, "the PVC format replaced the import's snapshot: deleting it");
        kubeops::delete(&snapshots, replaced).await?;
    }
    if let Some(dv_name) = &d.create
        && let Some(import) = d.status.current_imports.first()
    {
        let dv = import_data_volume(&cron, dv_name, &import.digest);
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
    let wait = match next_poll(&cron, Timestamp::now()) {
        Ok(Some(next)) => Duration::try_from(next.duration_since(Timestamp::now()))
            .unwrap_or_default()
            .clamp(Duration::from_secs(1), RESYNC),
        _ => RESYNC,
    };
    let wait = if d.awaits_snapshot {
        wait.min(SNAPSHOT_POLL)
    } else {
        wait
    };
    Ok(Requeue::requeue(wait))
}

/// How the cron's imports are kept now.
#[derive(Debug, Clone, PartialEq)]
enum Keeping {
    /// As PVCs (the StorageProfile says `pvc`, or nothing, or there is no StorageClass).
    Pvc,
    /// As VolumeSnapshots of this VolumeSnapshotClass.
    Snapshot(String),
    /// As PVCs, although the profile asks for snapshots: why none can be taken.
    PvcInstead(String),
}

impl Keeping {
    fn format(&self) -> SourceFormat {
        match self {
            Keeping::Snapshot(_) => SourceFormat::Snapshot,
            Keeping::Pvc | Keeping::PvcInstead(_) => SourceFormat::Pvc,
        }
    }
}

/// The StorageClass the cron's imports get: the template's, else the default class (of
/// virtual machine disks first), as the DataVolume controller will choose it (CDI's
/// GetStorageClassByNameWithVirtFallback). None when the named class does not exist.
async fn cron_class(client: &Client, cron: &DataImportCron) -> Result<Option<StorageClass>> {
    let spec = &cron.spec.template.spec;
    let named = match (&spec.pvc, &spec.storage) {
        (Some(p), _) => p.storage_class_name.clone(),
        (None, Some(s)) => s.storage_class_name.clone(),
        (None, None) => None,
    };
    let classes: Api<StorageClass> = Api::all(client.clone());
    match named {
        Some(name) => kubeops::get(&classes, &name).await,
        None => {
            let all = classes.list(&ListParams::default()).await?.items;
            let disk_image = spec.content_type != Some(ContentType::Archive);
            Ok(default_class(&all, disk_image).cloned())
        }
    }
}

/// StorageProfile annotation (CDI's): the VolumeSnapshotClass of DataImportCron snapshots.
pub const ANN_SNAPSHOT_CLASS_FOR_CRONS: &str = "cdi.kubevirt.io/snapshotClassForDataImportCron";

/// What the StorageProfile of the cron's class asks for (CDI's getSourceFormat), and for the
/// snapshot format the VolumeSnapshotClass that takes them (CDI's GetVolumeSnapshotClass).
async fn keeping(client: &Client, cron: &DataImportCron) -> Result<Keeping> {
    let Some(class) = cron_class(client, cron).await? else {
        return Ok(Keeping::Pvc);
    };
    let class_name = class.name_any();
    let profiles: Api<StorageProfile> = Api::all(client.clone());
    let Some(object) = kubeops::get(&profiles, &class_name).await? else {
        return Ok(Keeping::Pvc);
    };
    // CDI's annotation naming the class for crons (set where snapshots of golden images need
    // their own class) comes before the profile's `snapshotClass`.
    let for_crons = object
        .annotations()
        .get(ANN_SNAPSHOT_CLASS_FOR_CRONS)
        .filter(|c| !c.is_empty())
        .cloned();
    let Some(profile) = object.status.map(|s| s.profile) else {
        return Ok(Keeping::Pvc);
    };
    let asked = SourceFormat::parse(
        &class_name,
        profile.data_import_cron_source_format.as_deref(),
    )
    .map_err(|e| Error::invalid(e.to_string()))?;
    if asked == SourceFormat::Pvc {
        return Ok(Keeping::Pvc);
    }
    let classes = snapshot_classes(client).await;
    Ok(
        match snapshot_class(
            &class.provisioner,
            for_crons.as_deref().or(profile.snapshot_class.as_deref()),
            &classes,
        ) {
            Ok(c) => Keeping::Snapshot(c),
            Err(e @ FormatError::NoSnapshotClass(_)) => Keeping::PvcInstead(e.to_string()),
            Err(e) => return Err(Error::invalid(e.to_string())),
        },
    )
}

/// The current import's VolumeSnapshot: None when missing (or the snapshot API is not
/// served), else whether it is ready to use.
async fn current_snapshot(
    client: &Client,
    cron: &DataImportCron,
    ns: &str,
) -> Result<Option<bool>> {
    let Some(first) = cron.status.as_ref().and_then(|s| s.current_imports.first()) else {
        return Ok(None);
    };
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), ns);
    // Without the snapshot CRD the server answers 404 too: no snapshot.
    Ok(kubeops::get(&snapshots, &first.data_volume_name)
        .await?
        .map(|s| s.ready()))
}

/// Retries failed reconciles.
pub fn error_policy(cron: Arc<DataImportCron>, err: &Error, ctx: Arc<Context>) -> Requeue {
    eprintln!("DEBUG cron error: {err}");
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
/// Objects being deleted count as gone: the DataVolume and PVC of an import kept as a snapshot
/// are deleted, and a PVC may wait a while on its protection finalizer.
async fn import_state(client: &Client, cron: &DataImportCron, ns: &str) -> Result<ImportState> {
    let Some(first) = cron.status.as_ref().and_then(|s| s.current_imports.first()) else {
        return Ok(ImportState::None);
    };
    let live = |meta: &kube::api::ObjectMeta| meta.deletion_timestamp.is_none();
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    if let Some(dv) = kubeops::get(&dvs, &first.data_volume_name).await?
        && live(&dv.metadata)
    {
        return Ok(import_state_of(&dv));
    }
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    Ok(match kubeops::get(&pvcs, &first.data_volume_name).await? {
        Some(pvc) if live(&pvc.metadata) => ImportState::Pvc,
        _ => ImportState::None,
    })
}

/// Stamps the last import (its PVC, or its VolumeSnapshot in the snapshot format) with its use
/// time and the cron's labels (CDI's `updateSource`).
async fn mark_used(client: &Client, cron: &DataImportCron, ns: &str, manager: &str) -> Result<()> {
    let Some(last) = super::cron::last_import(cron) else {
        return Ok(());
    };
    let format = cron
        .status
        .as_ref()
        .and_then(|s| s.source_format.as_deref());
    match SourceFormat::of_status(format) {
        SourceFormat::Pvc => {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
            stamp(&api, last, cron, manager).await
        }
        SourceFormat::Snapshot => {
            let api: Api<VolumeSnapshot> = Api::namespaced(client.clone(), ns);
            stamp(&api, last, cron, manager).await
        }
    }
}

/// Merges the cron's labels and the last-use time into `name` (gone: nothing to stamp).
async fn stamp<K>(api: &Api<K>, name: &str, cron: &DataImportCron, manager: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({"metadata": {
        "labels": super::cron::cron_labels(cron),
        "annotations": {super::gc::LAST_USE_ANNOTATION: Timestamp::now().to_string()},
    }});
    let params = PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    };
    match api.patch(name, &params, &Patch::Merge(patch)).await {
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

/// Deletes the imports beyond `importsToKeep`: PVCs (the DataVolume, else the PVC, as CDI
/// does) and VolumeSnapshots, each kind counted on its own as CDI counts them.
async fn collect_garbage(client: &Client, cron: &DataImportCron, ns: &str) -> Result<()> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    for name in garbage(cron, &imports_of(&pvcs, cron).await?) {
        tracing::info!(cron = %cron.name_any(), import = %name, "deleting an old import");
        kubeops::delete(&dvs, &name).await?;
        kubeops::delete(&pvcs, &name).await?;
    }
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), ns);
    let listed = match imports_of(&snapshots, cron).await {
        // The snapshot API is not served: no snapshots to collect.
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => Vec::new(),
        other => other?,
    };
    for name in garbage(cron, &listed) {
        tracing::info!(cron = %cron.name_any(), snapshot = %name, "deleting an old import's snapshot");
        kubeops::delete(&snapshots, &name).await?;
    }
    Ok(())
}

/// The cron's imports of kind `K` (labelled with its name) as `(name, lastUseTime)`.
async fn imports_of<K>(api: &Api<K>, cron: &DataImportCron) -> Result<Vec<(String, Option<String>)>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let lp = ListParams::default().labels(&format!("{DATA_IMPORT_CRON_LABEL}={}", cron.name_any()));
    Ok(api
        .list(&lp)
        .await?
        .into_iter()
        .map(|o| {
            let used = o.annotations().get(super::gc::LAST_USE_ANNOTATION).cloned();
            (o.name_any(), used)
        })
        .collect())
}

/// `retentionPolicy: None`: the cron's DataSource, DataVolumes, PVCs and VolumeSnapshots go
/// with it.
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
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), ns);
    match snapshots.list(&lp).await {
        Ok(list) => {
            for s in list {
                kubeops::delete(&snapshots, &s.name_any()).await?;
            }
        }
        // The snapshot API is not served: there are none.
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// The cron an object belongs to, by its label.
fn owning_cron<K: Resource<DynamicType = ()>>(obj: &K) -> Option<ObjectRef<DataImportCron>> {
    let name = obj.meta().labels.as_ref()?.get(DATA_IMPORT_CRON_LABEL)?;
    let ns = obj.meta().namespace.as_deref()?;
    (!name.is_empty()).then(|| ObjectRef::new(name).within(ns))
}

/// A hash of what others change on a cron: its spec (generation), labels, finalizers,
/// deletion, and annotations but the poll's own (a predicate).
fn not_our_writes(cron: &DataImportCron) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let ours = [
        annotation::SOURCE_DESIRED_DIGEST,
        annotation::NEXT_CRON_TIME,
        annotation::LAST_CRON_TIME,
    ];
    let mut h = std::collections::hash_map::DefaultHasher::new();
    cron.metadata.generation.hash(&mut h);
    cron.metadata.deletion_timestamp.is_some().hash(&mut h);
    cron.labels().hash(&mut h);
    cron.finalizers().hash(&mut h);
    cron.annotations()
        .iter()
        .filter(|(k, _)| !ours.contains(&k.as_str()))
        .for_each(|kv| kv.hash(&mut h));
    Some(h.finish())
}

/// Runs the controller (DataImportCrons of `namespace`, or all) until the process stops.
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>) {
    let client = ctx.client.clone();
    let (reader, writer) = reflector::store();
    // Our own writes (the poll's annotations, the status) are no news: each reconcile goes on
    // with what it wrote, and the next run comes by the timer.
    let trigger = watcher(
        kubeops::scoped::<DataImportCron>(&client, namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|c: &mut DataImportCron| c.managed_fields_mut().clear())
    .reflect(writer)
    .applied_objects()
    .predicate_filter(not_our_writes, Default::default());
    let results = Controller::for_stream(trigger, reader)
        .with_config(kubeops::controller_config())
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
