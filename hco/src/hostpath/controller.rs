//! The HostPathProvisioner controller: server-side applies the driver objects (putting back
//! edits, recreating deleted ones) and applies the status.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tracing::{Instrument, info_span};

use super::objects::{
    DriverObjects, POOL_LABEL, Settings, driver_objects, pool_mount_name, pool_mounts, pools,
};
use super::status::{ObservedMount, active, inactive, status};
use api::HostPathProvisioner;
use api::names::csi::DRIVER_APP;
use kubekit::error::{Error, Result};
use kubekit::kubeops;
use kubekit::metrics::Metrics;

/// Name in metrics.
pub const CONTROLLER: &str = "hostpathprovisioner";

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Images and namespace.
    pub settings: Settings,
    /// Reconcile metrics.
    pub metrics: Arc<Metrics>,
    /// Every HostPathProvisioner (the controller's cache), to serve only the [`active`] one.
    pub all: Option<Store<HostPathProvisioner>>,
}

async fn deploy(o: &DriverObjects, client: &Client, ns: &str) -> Result<DaemonSet> {
    let name = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.name.clone().unwrap_or_default()
    };
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    kubeops::apply(
        &sa,
        &name(&o.service_account.metadata),
        &o.service_account,
        &kubeops::manager(CONTROLLER),
    )
    .await?;
    let cr: Api<ClusterRole> = Api::all(client.clone());
    kubeops::apply(
        &cr,
        &name(&o.cluster_role.metadata),
        &o.cluster_role,
        &kubeops::manager(CONTROLLER),
    )
    .await?;
    let crb: Api<ClusterRoleBinding> = Api::all(client.clone());
    kubeops::apply(
        &crb,
        &name(&o.cluster_role_binding.metadata),
        &o.cluster_role_binding,
        &kubeops::manager(CONTROLLER),
    )
    .await?;
    let cm: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    kubeops::apply(
        &cm,
        &name(&o.pools.metadata),
        &o.pools,
        &kubeops::manager(CONTROLLER),
    )
    .await?;
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let applied = kubeops::apply(
        &ds,
        &name(&o.daemon_set.metadata),
        &o.daemon_set,
        &kubeops::manager(CONTROLLER),
    )
    .await?;
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    kubeops::apply(
        &drivers,
        &name(&o.csi_driver.metadata),
        &o.csi_driver,
        &kubeops::manager(CONTROLLER),
    )
    .await?;
    let classes: Api<StorageClass> = Api::all(client.clone());
    for sc in &o.storage_classes {
        kubeops::apply(
            &classes,
            &name(&sc.metadata),
            sc,
            &kubeops::manager(CONTROLLER),
        )
        .await?;
    }
    Ok(applied)
}

/// The nodes the driver runs on (its pods', HPP's way of choosing where pools are mounted).
async fn driver_nodes(client: &Client, ns: &str) -> Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("app={DRIVER_APP}"));
    let mut nodes: Vec<String> = pods
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.spec?.node_name)
        .collect();
    nodes.sort();
    nodes.dedup();
    Ok(nodes)
}

/// Each `pvcTemplate` pool's PVC (created once: a PVC spec is not edited) and mounter on
/// every driver node; mounters of pools or nodes no longer there go (their PVCs stay: they hold
/// the pool's volumes). What each looks like now, for the status.
async fn deploy_pool_mounts(
    hpp: &HostPathProvisioner,
    ctx: &Context,
) -> Result<Vec<ObservedMount>> {
    let ns = &ctx.settings.namespace;
    let manager = kubeops::manager(CONTROLLER);
    let templated = hpp
        .spec
        .storage_pools
        .iter()
        .any(|p| p.pvc_template.is_some());
    let nodes = match templated {
        true => driver_nodes(&ctx.client, ns).await?,
        false => Vec::new(),
    };
    let wanted = pool_mounts(hpp, &ctx.settings, &nodes)?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let mut observed = Vec::new();
    for m in &wanted {
        let name = pool_mount_name(&m.pool, &m.node);
        let pvc = match kubeops::get(&pvcs, &name).await? {
            Some(p) => p,
            None => {
                kubeops::create(&pvcs, &m.pvc, &manager).await?;
                m.pvc.clone()
            }
        };
        let dep = kubeops::apply(&deployments, &name, &m.deployment, &manager).await?;
        observed.push(ObservedMount {
            pool: m.pool.clone(),
            pvc,
            deployment: dep,
        });
    }
    let lp = ListParams::default().labels(POOL_LABEL);
    for d in deployments.list(&lp).await?.items {
        let ours = d
            .owner_references()
            .iter()
            .any(|o| Some(o.uid.as_str()) == hpp.metadata.uid.as_deref());
        if ours
            && !wanted
                .iter()
                .any(|m| m.deployment.metadata.name == d.metadata.name)
        {
            kubeops::delete(&deployments, &d.name_any()).await?;
        }
    }
    Ok(observed)
}

/// Reconciles one HostPathProvisioner.
pub async fn reconcile(hpp: Arc<HostPathProvisioner>, ctx: Arc<Context>) -> Result<Requeue> {
    let span = info_span!("reconcile", controller = CONTROLLER, name = %hpp.name_any());
    async move {
        let _measure = ctx.metrics.reconcile(CONTROLLER);
        let api: Api<HostPathProvisioner> = Api::all(ctx.client.clone());
        let manager = kubeops::manager(CONTROLLER);
        let all = ctx.all.as_ref().map(|s| s.state()).unwrap_or_default();
        if let Some(winner) = active(all.iter().map(|h| h.as_ref()))
            && winner != hpp.name_any()
        {
            let st = inactive(hpp.status.as_ref(), &winner, Timestamp::now());
            if !same_but_heartbeats(hpp.status.as_ref(), &st) {
                let doc = serde_json::json!({
                    "apiVersion": HostPathProvisioner::api_version(&()),
                    "kind": HostPathProvisioner::kind(&()),
                    "status": st,
                });
                kubeops::apply_status(&api, &hpp.name_any(), doc, &manager).await?;
            }
            // Looked at again: the served one may go away.
            return Ok(Requeue::requeue(Duration::from_secs(60)));
        }
        let outcome = match driver_objects(&hpp, &ctx.settings) {
            Ok(o) => deploy(&o, &ctx.client, &ctx.settings.namespace).await,
            Err(e) => Err(e),
        };
        let mounts = match &outcome {
            Ok(_) => deploy_pool_mounts(&hpp, &ctx).await,
            Err(_) => Ok(Vec::new()),
        };
        let pools = pools(&hpp).unwrap_or_default();
        let (ds, error) = match (&outcome, &mounts) {
            (Ok(ds), Ok(_)) => (Some(ds), None),
            (Err(e), _) | (_, Err(e)) => (outcome.as_ref().ok(), Some(e.to_string())),
        };
        let mounts = mounts.unwrap_or_default();
        let st = status(
            hpp.status.as_ref(),
            &pools,
            ds,
            &mounts,
            error.as_deref(),
            Timestamp::now(),
        );
        if !same_but_heartbeats(hpp.status.as_ref(), &st) {
            let doc = serde_json::json!({
                "apiVersion": HostPathProvisioner::api_version(&()),
                "kind": HostPathProvisioner::kind(&()),
                "status": st,
            });
            kubeops::apply_status(&api, &hpp.name_any(), doc, &kubeops::manager(CONTROLLER))
                .await?;
        }
        outcome.map(|_| Requeue::requeue(Duration::from_secs(60)))
    }
    .instrument(span)
    .await
}

/// Whether `new` differs from `old` only in heartbeat times (then it is not written).
fn same_but_heartbeats(
    old: Option<&api::HostPathProvisionerStatus>,
    new: &api::HostPathProvisionerStatus,
) -> bool {
    old.is_some_and(|s| {
        let mut a = s.clone();
        let mut b = new.clone();
        for c in a.conditions.iter_mut().chain(b.conditions.iter_mut()) {
            c.last_heartbeat_time = None;
        }
        a == b
    })
}

/// Retries failed reconciles.
pub fn error_policy(hpp: Arc<HostPathProvisioner>, err: &Error, ctx: Arc<Context>) -> Requeue {
    kubeops::requeue_after(
        CONTROLLER,
        &hpp.name_any(),
        err,
        &ctx.metrics,
        Duration::from_secs(60),
    )
}

/// Makes the HostPathProvisioner `hostpath-provisioner` with one pool when none exists, as HCO
/// makes its children: the bundle then gives a working driver, and the CR stays the one owner
/// of the driver's objects (an admin's edits to it are never undone; an existing one is kept).
pub async fn ensure_one(client: &Client, (name, path): (String, String)) -> Result<()> {
    let api: Api<HostPathProvisioner> = Api::all(client.clone());
    if !api.list(&Default::default()).await?.items.is_empty() {
        return Ok(());
    }
    let hpp = HostPathProvisioner::with_pool(&name, &path);
    kubeops::create(&api, &hpp, &kubeops::manager(CONTROLLER)).await
}

/// Runs the controller until the process stops.
pub async fn run(client: Client, settings: Settings, metrics: Arc<Metrics>) {
    let hpps: Api<HostPathProvisioner> = Api::all(client.clone());
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &settings.namespace);
    let classes: Api<StorageClass> = Api::all(client.clone());
    let mounters: Api<Deployment> = Api::namespaced(client.clone(), &settings.namespace);
    let controller = Controller::new(hpps, watcher::Config::default());
    let ctx = Arc::new(Context {
        client,
        settings,
        metrics,
        all: Some(controller.store()),
    });
    let results = controller
        // the CR is cluster-scoped, these children namespaced: not `owns` (see cluster_owners)
        .watches(daemonsets, watcher::Config::default(), |ds| {
            kubeops::cluster_owners(&ds)
        })
        .owns(classes, watcher::Config::default())
        // a pvcTemplate pool's mounters: their readiness is the pool's
        .watches(
            mounters,
            watcher::Config::default().labels(POOL_LABEL),
            |d| kubeops::cluster_owners(&d),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx);
    kubeops::drain(results).await;
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;
    use api::HostPathProvisionerSpec;
    use api::hostpath::StoragePool;
    use kubekit::mockapi;

    #[tokio::test]
    async fn driver_objects_are_applied_then_status() {
        let (client, mut api) = mockapi::pair();
        let ctx = Arc::new(Context {
            client,
            settings: Settings::default(),
            metrics: Arc::default(),
            all: None,
        });
        let mut hpp = HostPathProvisioner::new(
            "hostpath-provisioner",
            HostPathProvisionerSpec {
                storage_pools: vec![StoragePool {
                    name: "local".into(),
                    path: "/var/hpvolumes".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        hpp.metadata.uid = Some("u".into());
        let task = tokio::spawn(reconcile(Arc::new(hpp.clone()), ctx));
        for p in [
            "/api/v1/namespaces/quarry/serviceaccounts/quarry-csi",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/quarry-csi-provisioner",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/quarry-csi-provisioner",
            "/api/v1/namespaces/quarry/configmaps/quarry-csi-pools",
        ] {
            api.expect_echo(Method::PATCH, p).await;
        }
        api.expect_with(
            Method::PATCH,
            "/apis/apps/v1/namespaces/quarry/daemonsets/quarry-csi",
            200,
            |b| {
                let mut b = b.clone();
                b["status"] = serde_json::json!({"desiredNumberScheduled": 2, "numberReady": 2,
                "currentNumberScheduled": 2, "numberMisscheduled": 0});
                b
            },
        )
        .await;
        api.expect_echo(
            Method::PATCH,
            "/apis/storage.k8s.io/v1/csidrivers/kubevirt.io.hostpath-provisioner",
        )
        .await;
        let (_, sc) = api
            .expect_echo(
                Method::PATCH,
                "/apis/storage.k8s.io/v1/storageclasses/hostpath-csi-local",
            )
            .await;
        assert_eq!(sc["parameters"]["storagePool"], "local");
        // No pvcTemplate pool: only the look for mounters left over.
        api.expect(
            Method::GET,
            "/apis/apps/v1/namespaces/quarry/deployments",
            200,
            serde_json::json!({"apiVersion": "apps/v1", "kind": "DeploymentList",
                               "metadata": {}, "items": []}),
        )
        .await;
        let (_, st) = api
            .expect(
                Method::PATCH,
                "/apis/hostpathprovisioner.kubevirt.io/v1beta1/hostpathprovisioners/hostpath-provisioner/status",
                200,
                serde_json::to_value(&hpp).unwrap(),
            )
            .await;
        assert_eq!(st["status"]["storagePoolStatuses"][0]["phase"], "Ready");
        api.silence().await;
        task.await.unwrap().unwrap();
    }

    /// The driver's DaemonSet and a pool's mounter (in the namespace) wake the CR under the key
    /// of its own watch; kube's `owns` would wake a second key, in the child's namespace, and
    /// every requeue would then run the whole apply twice (seen on the node: 14 applies a minute
    /// while nothing changed, now 7).
    #[tokio::test]
    async fn namespaced_children_wake_the_cr_under_its_own_key() {
        use futures_util::StreamExt;
        use kube::runtime::reflector::ObjectRef;

        let hpp: HostPathProvisioner = serde_json::from_value(serde_json::json!({
            "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
            "metadata": {"name": "hostpath-provisioner", "uid": "u"},
            "spec": {"storagePools": [{"name": "big", "path": "/var/big",
                "pvcTemplate": {"resources": {"requests": {"storage": "1Gi"}}}}]}
        }))
        .unwrap();
        let s = Settings::default();
        let ds = driver_objects(&hpp, &s).unwrap().daemon_set;
        let mounter = pool_mounts(&hpp, &s, &["node-a".into()]).unwrap()[0]
            .deployment
            .clone();
        assert_eq!(ds.metadata.namespace.as_deref(), Some("quarry"));
        let key = ObjectRef::from_obj(&hpp);
        assert_eq!(
            kubeops::cluster_owners::<HostPathProvisioner>(&ds),
            std::slice::from_ref(&key)
        );
        assert_eq!(
            kubeops::cluster_owners::<HostPathProvisioner>(&mounter),
            std::slice::from_ref(&key)
        );

        // why not `owns`: its mapping keys the owner in the DaemonSet's namespace
        let by_owns = kube::runtime::controller::trigger_owners::<HostPathProvisioner, _>(
            futures_util::stream::iter([Ok::<_, std::convert::Infallible>(ds)]),
            (),
            (),
        )
        .next()
        .await
        .unwrap()
        .unwrap()
        .obj_ref;
        assert_ne!(by_owns, key);
        assert_eq!(by_owns.namespace.as_deref(), Some("quarry"));
    }
}
