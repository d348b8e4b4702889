//! The HyperConverged controller: server-side applies every child on each reconcile (so edits
//! are reverted and deleted children recreated, as HCO does), removes a disabled
//! HostPathProvisioner, and applies the aggregated status.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tracing::{Instrument, info_span};

use super::children::{self, ChildKind};
use super::conditions::{ChildStatus, RECONCILE_FAILED, Reconciled, aggregate, failure_event};
use api::HyperConverged;
use api::hyperconverged::HYPERCONVERGED_NAME;
use kubekit::error::{Error, Result};
use kubekit::kubeops;
use kubekit::metrics::Metrics;

/// Name in metrics.
pub const CONTROLLER: &str = "hyperconverged";
/// Children are looked at again this often even without a watch event.
pub const RESYNC: Duration = Duration::from_secs(60);

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Reconcile metrics.
    pub metrics: Arc<Metrics>,
    /// Failed reconciles in a row (the singleton is the only object), for the back-off.
    pub failures: AtomicU32,
}

impl Context {
    /// A context with no failures yet.
    pub fn new(client: Client, metrics: Arc<Metrics>) -> Self {
        Context {
            client,
            metrics,
            failures: AtomicU32::new(0),
        }
    }
}

/// The wait before retrying after `failures` failed reconciles in a row: 5 s, doubled each
/// time up to 5 minutes, so a child CRD installed later is picked up soon, without a retry storm
/// while it stays missing.
pub fn retry_delay(failures: u32) -> Duration {
    (Duration::from_secs(5) * 2u32.saturating_pow(failures.saturating_sub(1).min(6)))
        .min(Duration::from_secs(300))
}

fn child_api(client: &Client, kind: &ChildKind, namespace: &str) -> Api<DynamicObject> {
    let ar = kind.api_resource();
    if kind.namespaced {
        Api::namespaced_with(client.clone(), namespace, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    }
}

/// Reconciles the HyperConverged.
pub async fn reconcile(hc: Arc<HyperConverged>, ctx: Arc<Context>) -> Result<Requeue> {
    let ns = hc.namespace().unwrap_or_default();
    let span =
        info_span!("reconcile", controller = CONTROLLER, namespace = %ns, name = %hc.name_any());
    async move {
        let _measure = ctx.metrics.reconcile(CONTROLLER);
        if hc.name_any() != HYPERCONVERGED_NAME {
            // HCO's singleton: others are refused by the webhook and left alone here.
            tracing::warn!("ignored: only {HYPERCONVERGED_NAME} is reconciled");
            return Ok(Requeue::await_change());
        }
        let (statuses, related, outcome) = match apply_children(&hc, &ctx.client, &ns).await {
            Ok((s, r)) => (s, r, Reconciled::Complete),
            Err(e) => (Vec::new(), Vec::new(), Reconciled::Failed(e.to_string())),
        };
        let previous = hc
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let (conditions, health) = aggregate(
            &previous,
            &statuses,
            &outcome,
            hc.metadata.generation,
            Timestamp::now(),
        );
        let status = api::HyperConvergedStatus {
            conditions,
            related_objects: related,
            observed_generation: hc.metadata.generation,
            system_health_status: Some(health),
        };
        if hc.status.as_ref() != Some(&status) {
            let api: Api<HyperConverged> = Api::namespaced(ctx.client.clone(), &ns);
            let doc = serde_json::json!({
                "apiVersion": HyperConverged::api_version(&()),
                "kind": HyperConverged::kind(&()),
                "status": status,
            });
            kubeops::apply_status(&api, &hc.name_any(), doc, &kubeops::manager(CONTROLLER)).await?;
        }
        if let Some(message) = failure_event(&previous, &outcome) {
            kubeops::publish_event(
                &ctx.client,
                &hc.object_ref(&()),
                true,
                RECONCILE_FAILED,
                message,
                &kubeops::manager(CONTROLLER),
            )
            .await;
        }
        match outcome {
            Reconciled::Complete => {
                ctx.failures.store(0, Ordering::Relaxed);
                Ok(Requeue::requeue(RESYNC))
            }
            Reconciled::Failed(m) => Err(Error::InvalidSpec(m)),
        }
    }
    .instrument(span)
    .await
}

/// Applies every child and returns what they report, and references to them (HCO's
/// relatedObjects).
async fn apply_children(
    hc: &HyperConverged,
    client: &Client,
    ns: &str,
) -> Result<(Vec<ChildStatus>, Vec<ObjectReference>)> {
    let wanted = children::children(hc)?;
    let mut statuses = Vec::new();
    let mut related = Vec::new();
    for (kind, obj) in &wanted {
        let api = child_api(client, kind, ns);
        let applied = kubeops::apply(&api, kind.name, obj, &kubeops::manager(CONTROLLER))
            .await
            .map_err(|e| missing_kind(e, kind))?;
        statuses.push(ChildStatus::from_object(kind.kind, &applied.data));
        related.push(children::related_object(kind, &applied.metadata));
    }
    apply_golden_images(hc, client).await?;
    if !wanted.iter().any(|(k, _)| *k == children::HOSTPATH) {
        // Only the one the HyperConverged made: a HostPathProvisioner of the same name made
        // otherwise (`quarry controller hostpath`'s default, an admin's) serves volumes in use.
        let api = child_api(client, &children::HOSTPATH, ns);
        let ours = kubeops::get(&api, children::HOSTPATH.name)
            .await?
            .is_some_and(|h| children::is_child(&h.metadata));
        if ours {
            kubeops::delete(&api, children::HOSTPATH.name).await?;
        }
    }
    Ok((statuses, related))
}

/// Applies the golden-image DataImportCrons (their namespace made when missing) and deletes
/// those no template asks for any more. A HyperConverged that sets neither
/// `enableCommonBootImageImport` nor `dataImportCronTemplates` is not looked at.
async fn apply_golden_images(hc: &HyperConverged, client: &Client) -> Result<()> {
    use crate::hyperconverged::golden_images;
    use api::golden::DataImportCron;
    if hc.spec.enable_common_boot_image_import.is_none()
        && hc.spec.data_import_cron_templates.is_none()
    {
        return Ok(());
    }
    let ns = golden_images::namespace(hc);
    let manager = kubeops::manager(CONTROLLER);
    let crons: Api<DataImportCron> = Api::namespaced(client.clone(), &ns);
    let wanted = golden_images::crons(hc);
    if !wanted.is_empty() {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        if kubeops::get(&namespaces, &ns).await?.is_none() {
            let mut obj = k8s_openapi::api::core::v1::Namespace::default();
            obj.metadata.name = Some(ns.clone());
            kubeops::create(&namespaces, &obj, &manager).await?;
        }
    }
    for cron in &wanted {
        kubeops::apply(&crons, &cron.name_any(), cron, &manager).await?;
    }
    let selector: Vec<String> = children::child_labels()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let lp = kube::api::ListParams::default().labels(&selector.join(","));
    let existing = match crons.list(&lp).await {
        Ok(l) => l.items,
        Err(e) => return Err(e.into()),
    };
    for name in golden_images::stale(hc, &existing) {
        kubeops::delete(&crons, &name).await?;
    }
    Ok(())
}

/// A 404 on applying a child means its CRD is not installed: say which (the API server's own
/// "404 page not found" names nothing).
fn missing_kind(e: Error, kind: &ChildKind) -> Error {
    match e {
        Error::Kube(kube::Error::Api(s)) if s.code == 404 => Error::InvalidSpec(format!(
            "cannot create {} {}: the CustomResourceDefinition {}.{} is not installed",
            kind.kind, kind.name, kind.plural, kind.group
        )),
        e => e,
    }
}

/// Retries failed reconciles: transient errors after 5 s, others with [`retry_delay`].
pub fn error_policy(hc: Arc<HyperConverged>, err: &Error, ctx: Arc<Context>) -> Requeue {
    let failures = ctx.failures.fetch_add(1, Ordering::Relaxed) + 1;
    kubeops::requeue_after(
        CONTROLLER,
        &hc.name_any(),
        err,
        &ctx.metrics,
        retry_delay(failures),
    )
}

/// Runs the controller for the HyperConverged in `namespace` until the process stops.
pub async fn run(client: Client, namespace: String, metrics: Arc<Metrics>) {
    let hcs: Api<HyperConverged> = Api::namespaced(client.clone(), &namespace);
    let ctx = Arc::new(Context::new(client.clone(), metrics));
    let labels = "app=kubevirt-hyperconverged";
    let mut controller = Controller::new(hcs, watcher::Config::default());
    for kind in children::ALL {
        // A watch of a kind whose CRD is missing fails and backs off, holding every reconcile
        // back (over a minute against a real API server): watch only installed kinds; the
        // others are applied (and their absence reported) on every resync.
        let probe = child_api(&client, &kind, &namespace)
            .list(&kube::api::ListParams::default().limit(1))
            .await;
        if let Err(kube::Error::Api(e)) = probe
            && e.code == 404
        {
            tracing::warn!(kind = kind.kind, "CRD not installed: not watched");
            continue;
        }
        let ar = kind.api_resource();
        let ns = namespace.clone();
        controller = controller.watches_with(
            child_api(&client, &kind, &namespace),
            ar,
            watcher::Config::default().labels(labels),
            move |_| Some(ObjectRef::new(HYPERCONVERGED_NAME).within(&ns)),
        );
    }
    let results = controller
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx);
    kubeops::drain(results).await;
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::json;

    use super::*;
    use api::HyperConvergedSpec;
    use api::hyperconverged::{FilesystemOverhead, StorageImportConfig};
    use kubekit::mockapi;

    fn hc() -> HyperConverged {
        let mut hc = HyperConverged::new(
            HYPERCONVERGED_NAME,
            HyperConvergedSpec {
                scratch_space_storage_class: Some("local".into()),
                filesystem_overhead: Some(FilesystemOverhead {
                    global: Some("0.07".into()),
                    ..Default::default()
                }),
                storage_import: Some(StorageImportConfig {
                    insecure_registries: vec!["registry.local:5000".into()],
                }),
                ..Default::default()
            },
        );
        hc.metadata.namespace = Some("kubevirt-hyperconverged".into());
        hc.metadata.uid = Some("hc-uid".into());
        hc.metadata.generation = Some(2);
        hc
    }

    fn healthy(mut obj: serde_json::Value) -> serde_json::Value {
        obj["status"] = json!({"conditions": [
            {"type": "Available", "status": "True"},
            {"type": "Progressing", "status": "False"},
            {"type": "Degraded", "status": "False"}]});
        obj
    }

    const STATUS: &str = "/apis/hco.kubevirt.io/v1beta1/namespaces/kubevirt-hyperconverged/hyperconvergeds/kubevirt-hyperconverged/status";

    fn start(hc: HyperConverged) -> (tokio::task::JoinHandle<Result<Requeue>>, mockapi::ApiServer) {
        let (client, api) = mockapi::pair();
        let ctx = Arc::new(Context::new(client, Arc::default()));
        (tokio::spawn(reconcile(Arc::new(hc), ctx)), api)
    }

    /// Answers the status apply; returns the applied status and its condition of `type_`.
    async fn status_applied(
        api: &mut mockapi::ApiServer,
        hc: &HyperConverged,
        type_: &str,
    ) -> (serde_json::Value, serde_json::Value) {
        let (_, st) = api
            .expect(
                Method::PATCH,
                STATUS,
                200,
                serde_json::to_value(hc).unwrap(),
            )
            .await;
        let cond = st["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .unwrap()
            .clone();
        (st["status"].clone(), cond)
    }

    #[tokio::test]
    async fn failed_reconciles_back_off() {
        let delays: Vec<u64> = (1..=9).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        // A failure after a success starts again at 5 s.
        let (client, _api) = mockapi::pair();
        let ctx = Arc::new(Context::new(client, Arc::default()));
        let err = Error::InvalidSpec("the CustomResourceDefinition is not installed".into());
        let hc = Arc::new(hc());
        for want in [5, 10, 20] {
            assert_eq!(
                error_policy(hc.clone(), &err, ctx.clone()),
                Requeue::requeue(Duration::from_secs(want))
            );
        }
        ctx.failures.store(0, Ordering::Relaxed);
        assert_eq!(
            error_policy(hc, &err, ctx),
            Requeue::requeue(Duration::from_secs(5))
        );
    }

    #[tokio::test]
    async fn only_the_singleton_is_reconciled() {
        let mut other = hc();
        other.metadata.name = Some("second".into());
        let (task, mut api) = start(other);
        api.silence().await;
        assert_eq!(task.await.unwrap().unwrap(), Requeue::await_change());
    }

    #[tokio::test]
    async fn children_are_applied_in_order_and_status_aggregated() {
        let mut with_hpp = hc();
        with_hpp.metadata.annotations = Some(
            [(
                children::ANN_HOSTPATH_POOLS.to_string(),
                r#"[{"name":"local","path":"/var/hpvolumes"}]"#.to_string(),
            )]
            .into(),
        );
        let (task, mut api) = start(with_hpp.clone());
        let paths = [
            "/apis/cdi.kubevirt.io/v1beta1/cdis/cdi-kubevirt-hyperconverged",
            "/apis/kubevirt.io/v1/namespaces/kubevirt-hyperconverged/kubevirts/kubevirt-kubevirt-hyperconverged",
            "/apis/ssp.kubevirt.io/v1beta2/namespaces/kubevirt-hyperconverged/ssps/ssp-kubevirt-hyperconverged",
            "/apis/networkaddonsoperator.network.kubevirt.io/v1/networkaddonsconfigs/cluster",
            "/apis/hostpathprovisioner.kubevirt.io/v1beta1/hostpathprovisioners/hostpath-provisioner",
        ];
        let mut applied = Vec::new();
        for p in paths {
            let (query, body) = api
                .expect_with(Method::PATCH, p, 200, |b| healthy(b.clone()))
                .await;
            // Forced server-side apply: fields someone edited are taken back.
            assert!(
                query.contains("fieldManager=quarry-hyperconverged")
                    && query.contains("force=true"),
                "{query}"
            );
            applied.push(body);
        }
        assert_eq!(
            applied[0]["spec"]["config"]["scratchSpaceStorageClass"],
            "local"
        );
        assert_eq!(
            applied[0]["spec"]["config"]["filesystemOverhead"]["global"],
            "0.07"
        );
        assert_eq!(
            applied[0]["spec"]["config"]["insecureRegistries"][0],
            "registry.local:5000"
        );
        assert_eq!(
            applied[1]["metadata"]["ownerReferences"][0]["uid"],
            "hc-uid"
        );
        assert!(applied[0]["metadata"].get("ownerReferences").is_none());
        assert_eq!(
            applied[4]["spec"]["storagePools"][0]["path"],
            "/var/hpvolumes"
        );
        let (st, avail) = status_applied(&mut api, &with_hpp, "Available").await;
        assert_eq!(st["systemHealthStatus"], "healthy");
        // relatedObjects as HCO lists them: apiVersion, kind, name, and the namespace of
        // namespaced children only.
        let kv = &st["relatedObjects"][1];
        assert_eq!(
            (&kv["apiVersion"], &kv["kind"], &kv["name"]),
            (
                &json!("kubevirt.io/v1"),
                &json!("KubeVirt"),
                &json!("kubevirt-kubevirt-hyperconverged")
            ),
            "{kv}"
        );
        assert_eq!(
            st["relatedObjects"][0]["name"],
            "cdi-kubevirt-hyperconverged"
        );
        assert!(st["relatedObjects"][0].get("namespace").is_none());
        assert_eq!(avail["status"], "True");
        api.silence().await;
        assert_eq!(task.await.unwrap().unwrap(), Requeue::requeue(RESYNC));
    }

    #[tokio::test]
    async fn a_disabled_hostpath_provisioner_is_removed_and_a_missing_crd_fails_the_reconcile() {
        let (task, mut api) = start(hc());
        let (_, cdi) = api
            .expect_echo(
                Method::PATCH,
                "/apis/cdi.kubevirt.io/v1beta1/cdis/cdi-kubevirt-hyperconverged",
            )
            .await;
        assert_eq!(cdi["kind"], "CDI");
        api.expect(
            Method::PATCH,
            "/apis/kubevirt.io/v1/namespaces/kubevirt-hyperconverged/kubevirts/kubevirt-kubevirt-hyperconverged",
            404,
            mockapi::status(404, "NotFound"),
        )
        .await;
        let (st, rc) = status_applied(&mut api, &hc(), "ReconcileComplete").await;
        // A Warning event tells the same.
        let (_, event) = api
            .expect_echo(
                Method::POST,
                "/api/v1/namespaces/kubevirt-hyperconverged/events",
            )
            .await;
        assert_eq!(
            (&event["type"], &event["reason"], &event["message"]),
            (&json!("Warning"), &json!("ReconcileFailed"), &rc["message"])
        );
        assert_eq!(event["involvedObject"]["kind"], "HyperConverged");
        assert_eq!(st["systemHealthStatus"], "error");
        assert_eq!(rc["status"], "False");
        // The missing kind is named, and Degraded says so too.
        let msg = rc["message"].as_str().unwrap();
        assert!(
            msg.contains("KubeVirt") && msg.contains("kubevirts.kubevirt.io is not installed"),
            "{msg}"
        );
        let degraded = st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Degraded")
            .unwrap();
        assert_eq!(
            (&degraded["status"], &degraded["message"]),
            (&json!("True"), &json!(msg))
        );
        api.silence().await;
        assert!(task.await.unwrap().is_err());

        // With every child present, a HostPathProvisioner it made is deleted when not enabled
        // (there is none here).
        let (task, mut api) = start(hc());
        accept_children(&mut api).await;
        api.not_found(Method::GET, "/apis/hostpathprovisioner.kubevirt.io/v1beta1/hostpathprovisioners/hostpath-provisioner").await;
        let (st, progressing) = status_applied(&mut api, &hc(), "Progressing").await;
        // Children without status yet: progressing, a warning.
        assert_eq!(st["systemHealthStatus"], "warning");
        assert_eq!(progressing["reason"], "CDIProgressing");
        api.silence().await;
        task.await.unwrap().unwrap();
    }

    /// Accepts the applies of the four children a plain HyperConverged asks for.
    async fn accept_children(api: &mut mockapi::ApiServer) {
        for p in [
            "/apis/cdi.kubevirt.io/v1beta1/cdis/cdi-kubevirt-hyperconverged",
            "/apis/kubevirt.io/v1/namespaces/kubevirt-hyperconverged/kubevirts/kubevirt-kubevirt-hyperconverged",
            "/apis/ssp.kubevirt.io/v1beta2/namespaces/kubevirt-hyperconverged/ssps/ssp-kubevirt-hyperconverged",
            "/apis/networkaddonsoperator.network.kubevirt.io/v1/networkaddonsconfigs/cluster",
        ] {
            api.expect_echo(Method::PATCH, p).await;
        }
    }

    /// Found on a real node: the default HostPathProvisioner that `quarry controller hostpath`
    /// makes (its CSI driver serving every volume) was deleted by any HyperConverged without
    /// the pools annotation. Only one carrying the HyperConverged's labels is removed.
    #[tokio::test]
    async fn only_a_hostpath_provisioner_the_hyperconverged_made_is_removed() {
        const HPP: &str = "/apis/hostpathprovisioner.kubevirt.io/v1beta1/hostpathprovisioners/hostpath-provisioner";
        for (labels, deleted) in [
            (json!({"app.kubernetes.io/managed-by": "quarry"}), false),
            (json!(children::child_labels()), true),
        ] {
            let (task, mut api) = start(hc());
            accept_children(&mut api).await;
            let existing = json!({
                "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1",
                "kind": "HostPathProvisioner",
                "metadata": {"name": "hostpath-provisioner", "labels": labels},
                "spec": {},
            });
            api.expect(Method::GET, HPP, 200, existing).await;
            if deleted {
                api.expect(Method::DELETE, HPP, 200, mockapi::status(200, "Success"))
                    .await;
            }
            status_applied(&mut api, &hc(), "Progressing").await;
            api.silence().await;
            task.await.unwrap().unwrap();
        }
    }
}
