//! The DataSource controller: each DataSource's Ready condition follows what it points to (a
//! PVC's DataVolume, the PVC itself, or a VolumeSnapshot; through a `dataSource` reference, the
//! source of the DataSource it names), recomputed when the DataSource, the DataSource it names,
//! a DataVolume or a PVC changes (snapshots are looked at again every few minutes). The
//! decision is [`super::datasource`]'s; this module reads and writes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};

use super::datasource::{SourceState, reference, resolve, status_of};
use api::golden::{DataSource, DataSourceSource};
use api::{DataVolume, DataVolumeStatus};
use kubekit::error::{Error, Result};
use kubekit::kubeops;
use kubekit::metrics::Metrics;

/// Name in metrics, logs and the field manager.
pub const CONTROLLER: &str = "datasource";
/// A look even without a change (VolumeSnapshots are not watched).
const RESYNC: Duration = Duration::from_secs(300);

/// What the reconciles share.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Reconcile counts and failures.
    pub metrics: Arc<Metrics>,
}

fn volume_snapshot() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshot"),
        "volumesnapshots",
    )
}

/// The namespace a source names, else the DataSource's (CDI's default).
fn source_namespace<'a>(given: &'a str, ds: &'a DataSource) -> &'a str {
    if given.is_empty() {
        ds.metadata.namespace.as_deref().unwrap_or_default()
    } else {
        given
    }
}

/// The source in force of the DataSource and its state: its own source, or through its
/// `dataSource` reference the source of the DataSource it names (read here, one deep).
pub async fn resolved_state(
    client: &Client,
    ds: &DataSource,
) -> Result<(DataSourceSource, SourceState)> {
    let referenced = match reference(ds) {
        // Only one of its own namespace, not itself, is read (others do not resolve).
        Some((ns, name))
            if Some(ns.as_str()) == ds.metadata.namespace.as_deref()
                && Some(name.as_str()) != ds.metadata.name.as_deref() =>
        {
            let api: Api<DataSource> = Api::namespaced(client.clone(), &ns);
            kubeops::get(&api, &name).await?
        }
        _ => None,
    };
    Ok(match resolve(ds, referenced.as_ref()) {
        Ok(src) => (src.clone(), source_state(client, ds, src).await?),
        Err(u) => (DataSourceSource::default(), SourceState::Unresolved(u)),
    })
}

/// Reads the state of `src`, a source of `ds` (its namespace the default).
pub async fn source_state(
    client: &Client,
    ds: &DataSource,
    src: &DataSourceSource,
) -> Result<SourceState> {
    if let Some(p) = &src.pvc {
        let ns = source_namespace(&p.namespace, ds);
        let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
        if let Some(dv) = kubeops::get(&dvs, &p.name).await? {
            return Ok(SourceState::DataVolume(
                dv.status.as_ref().and_then(|s: &DataVolumeStatus| s.phase),
            ));
        }
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        let exists = kubeops::get(&pvcs, &p.name).await?.is_some();
        return Ok(SourceState::Pvc { exists });
    }
    if let Some(s) = &src.snapshot {
        let ns = source_namespace(&s.namespace, ds);
        let snaps: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &volume_snapshot());
        // Without the snapshot CRD the server answers 404 too: no snapshot.
        let snap = kubeops::get(&snaps, &s.name).await?;
        return Ok(SourceState::Snapshot(snap.map(|o| {
            o.data["status"]["readyToUse"].as_bool().unwrap_or(false)
        })));
    }
    Ok(SourceState::NoSource)
}

/// Writes the DataSource's status when the source's state changed it.
pub async fn reconcile(ds: Arc<DataSource>, ctx: Arc<Context>) -> Result<Requeue> {
    let _measure = ctx.metrics.reconcile(CONTROLLER);
    let (source, state) = resolved_state(&ctx.client, &ds).await?;
    let new = status_of(&ds, &source, state, Timestamp::now());
    if ds.status.as_ref() != Some(&new) {
        let ns = ds.namespace().unwrap_or_default();
        let api: Api<DataSource> = Api::namespaced(ctx.client.clone(), &ns);
        let doc = serde_json::json!({
            "apiVersion": DataSource::api_version(&()),
            "kind": DataSource::kind(&()),
            "status": new,
        });
        kubeops::apply_status(&api, &ds.name_any(), doc, &kubeops::manager(CONTROLLER)).await?;
    }
    Ok(Requeue::requeue(RESYNC))
}

/// Retries failed reconciles.
pub fn error_policy(ds: Arc<DataSource>, err: &Error, ctx: Arc<Context>) -> Requeue {
    kubeops::requeue_after(CONTROLLER, &ds.name_any(), err, &ctx.metrics, RESYNC)
}

/// The DataSources whose PVC source is `namespace/name`.
fn pointing_at(
    store: &Store<DataSource>,
    namespace: &str,
    name: &str,
) -> Vec<ObjectRef<DataSource>> {
    store
        .state()
        .iter()
        .filter(|ds| {
            ds.spec
                .source
                .pvc
                .as_ref()
                .is_some_and(|p| p.name == name && source_namespace(&p.namespace, ds) == namespace)
        })
        .map(|ds| ObjectRef::from_obj(ds.as_ref()))
        .collect()
}

/// The DataSources whose `dataSource` reference names `ds` (its source is theirs).
fn referring_to(store: &Store<DataSource>, ds: &DataSource) -> Vec<ObjectRef<DataSource>> {
    let target = (ds.namespace().unwrap_or_default(), ds.name_any());
    store
        .state()
        .iter()
        .filter(|d| reference(d).as_ref() == Some(&target))
        .map(|d| ObjectRef::from_obj(d.as_ref()))
        .collect()
}

/// Runs the controller (DataSources of `namespace`, or all) until the process stops.
pub async fn run(client: Client, metrics: Arc<Metrics>, namespace: Option<&str>) {
    let controller = Controller::new(
        kubeops::scoped::<DataSource>(&client, namespace),
        watcher::Config::default(),
    );
    let by_dv = controller.store();
    let by_pvc = controller.store();
    let by_reference = controller.store();
    let ctx = Arc::new(Context {
        client: client.clone(),
        metrics,
    });
    // Sources may be in any namespace: watch DataVolumes and PVCs everywhere. A DataSource
    // named by a `dataSource` reference (in the same namespace) is its referrers' source too.
    let results = controller
        .watches(
            kubeops::scoped::<DataSource>(&client, namespace),
            watcher::Config::default(),
            move |ds| referring_to(&by_reference, &ds),
        )
        .watches(
            Api::<DataVolume>::all(client.clone()),
            watcher::Config::default(),
            move |dv| pointing_at(&by_dv, &dv.namespace().unwrap_or_default(), &dv.name_any()),
        )
        .watches(
            Api::<PersistentVolumeClaim>::all(client),
            watcher::Config::default(),
            move |pvc| {
                pointing_at(
                    &by_pvc,
                    &pvc.namespace().unwrap_or_default(),
                    &pvc.name_any(),
                )
            },
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx);
    kubeops::drain(results).await;
}
