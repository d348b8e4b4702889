//! The HostPathProvisioner controller: server-side applies the driver objects (putting back
//! edits, recreating deleted ones) and applies the status.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tracing::{Instrument, info_span};

use super::objects::{DriverObjects, Settings, driver_objects, pools};
use super::status::{active, inactive, status};
use api::HostPathProvisioner;
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
        let pools = pools(&hpp).unwrap_or_default();
        let (ds, error) = match &outcome {
            Ok(ds) => (Some(ds), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let st = status(
            hpp.status.as_ref(),
            &pools,
            ds,
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
    let controller = Controller::new(hpps, watcher::Config::default());
    let ctx = Arc::new(Context {
        client,
        settings,
        metrics,
        all: Some(controller.store()),
    });
    let results = controller
        .owns(daemonsets, watcher::Config::default())
        .owns(classes, watcher::Config::default())
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
                    pvc_template: None,
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
}
