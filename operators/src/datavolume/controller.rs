//! The DataVolume controller on kube-runtime (controller-rs style): a [`Context`], [`reconcile`]
//! and [`error_policy`], a finalizer that cleans up pods (and the PVC unless retained), status by
//! server-side apply, a tracing span per object and Prometheus reconcile metrics. All decisions
//! are [`decide`]'s; this module only reads the objects and carries out the actions.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tracing::{Instrument, info_span, warn};

use super::pod::{self, POD_PORT, SourceRefs};
use super::source::{Source, source};
use super::status::parse_progress;
use super::{ANN_OWNED_BY, ANN_RETAIN_PVC, Action, Config, FINALIZER, Observed, decide, name};
use crate::api::DataVolume;
use crate::error::{Error, Result};
use crate::kubeops;
use crate::metrics::Metrics;

/// Name in metrics and events.
pub const CONTROLLER: &str = "datavolume";

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Controller settings.
    pub config: Config,
    /// Event recorder.
    pub recorder: Recorder,
    /// Reconcile metrics.
    pub metrics: Arc<Metrics>,
    /// Client for importer metrics endpoints.
    pub http: reqwest::Client,
}

impl Context {
    /// A context for `client`.
    pub fn new(client: Client, config: Config, metrics: Arc<Metrics>) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "quarry-datavolume-controller".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        importer::source::http::install_tls_provider();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(3))
            .build()
            .unwrap_or_default();
        Context {
            client,
            config,
            recorder,
            metrics,
            http,
        }
    }
}

/// Reconciles one DataVolume (with the finalizer around it).
pub async fn reconcile(dv: Arc<DataVolume>, ctx: Arc<Context>) -> Result<Requeue> {
    let ns = dv.namespace().unwrap_or_default();
    let span =
        info_span!("reconcile", controller = CONTROLLER, namespace = %ns, name = %dv.name_any());
    async move {
        let _measure = ctx.metrics.reconcile(CONTROLLER);
        let api: Api<DataVolume> = Api::namespaced(ctx.client.clone(), &ns);
        finalizer(&api, FINALIZER, dv, |event| async {
            match event {
                Finalizer::Apply(dv) => apply(&dv, &ctx).await,
                Finalizer::Cleanup(dv) => cleanup(&dv, &ctx).await,
            }
        })
        .await
        .map_err(|e| match e {
            kube::runtime::finalizer::Error::ApplyFailed(e)
            | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
            other => Error::Finalizer(other.to_string()),
        })
    }
    .instrument(span)
    .await
}

/// Retries failed reconciles: soon for transient errors, rarely for invalid objects.
pub fn error_policy(dv: Arc<DataVolume>, err: &Error, ctx: Arc<Context>) -> Requeue {
    kubeops::requeue_after(
        CONTROLLER,
        &dv.name_any(),
        err,
        &ctx.metrics,
        Duration::from_secs(300),
    )
}

/// The pod name a DataVolume's source uses.
fn pod_name(dv: &DataVolume) -> (String, bool) {
    match source(&dv.spec) {
        Ok(Source::Upload) => (pod::upload_name(name(dv)), true),
        _ => (pod::importer_pod_name(name(dv)), false),
    }
}

async fn apply(dv: &DataVolume, ctx: &Context) -> Result<Requeue> {
    let ns = dv.namespace().unwrap_or_default();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let finished = dv
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(|p| p.is_final());

    let pvc = kubeops::get(&pvcs, name(dv)).await?;
    let (pod_name, upload) = pod_name(dv);
    let pod = kubeops::get(&pods, &pod_name).await?;
    let service = if upload {
        kubeops::get(&services, &pod_name).await?.is_some()
    } else {
        false
    };
    let pending = pvc
        .as_ref()
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.phase.as_deref())
        != Some("Bound");
    let wffc = match pvc
        .as_ref()
        .and_then(|p| p.spec.as_ref()?.storage_class_name.clone())
    {
        Some(class) if pending && !finished => {
            let classes: Api<StorageClass> = Api::all(ctx.client.clone());
            kubeops::get(&classes, &class)
                .await?
                .and_then(|c| c.volume_binding_mode)
                .as_deref()
                == Some("WaitForFirstConsumer")
        }
        _ => false,
    };
    let refs = if pvc.is_some() && pod.is_none() && !finished {
        source_refs(dv, ctx, &ns).await?
    } else {
        SourceRefs::default()
    };
    let progress = match &pod {
        Some(p) if !upload => scrape_progress(dv, p, ctx).await,
        _ => None,
    };
    let observed = Observed {
        pvc: pvc.as_ref(),
        pod: pod.as_ref(),
        service,
        wait_for_first_consumer: wffc,
        progress,
        refs,
        now: Timestamp::now(),
    };
    let decision = decide(dv, &observed, &ctx.config);

    for action in decision.actions {
        match action {
            Action::CreatePvc(p) => kubeops::create(&pvcs, &p).await?,
            Action::CreatePod(p) => kubeops::create(&pods, &p).await?,
            Action::CreateService(s) => kubeops::create(&services, &s).await?,
            Action::DeletePod(n) => kubeops::delete(&pods, &n).await?,
            Action::DeleteService(n) => kubeops::delete(&services, &n).await?,
            Action::Event(e) => {
                let ev = KubeEvent {
                    type_: if e.warning {
                        EventType::Warning
                    } else {
                        EventType::Normal
                    },
                    reason: e.reason,
                    note: Some(e.message),
                    action: "Reconcile".into(),
                    secondary: None,
                };
                // Events are best effort: a lost event must not stall the DataVolume.
                if let Err(err) = ctx.recorder.publish(&ev, &dv.object_ref(&())).await {
                    warn!(error = %err, "publishing an event failed");
                }
            }
        }
    }
    if dv.status.as_ref() != Some(&decision.status) {
        let doc = serde_json::json!({
            "apiVersion": DataVolume::api_version(&()),
            "kind": DataVolume::kind(&()),
            "status": decision.status,
        });
        let api: Api<DataVolume> = Api::namespaced(ctx.client.clone(), &ns);
        kubeops::apply_status(&api, name(dv), doc).await?;
    }
    Ok(match decision.requeue {
        Some(d) => Requeue::requeue(d),
        None => Requeue::await_change(),
    })
}

/// Keys of the CA ConfigMap and of the header Secrets, so the pod can name each file and key.
async fn source_refs(dv: &DataVolume, ctx: &Context, ns: &str) -> Result<SourceRefs> {
    let Ok(Source::Import(src)) = source(&dv.spec) else {
        return Ok(SourceRefs::default());
    };
    let mut refs = SourceRefs::default();
    if let Some(cm) = &src.cert_config_map {
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
        let map = api.get(cm).await?;
        refs.ca_keys = map.data.iter().flat_map(|d| d.keys().cloned()).collect();
        refs.ca_keys
            .extend(map.binary_data.iter().flat_map(|d| d.keys().cloned()));
    }
    for secret in &src.secret_extra_headers {
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
        let s = api.get(secret).await?;
        let keys = s.data.iter().flat_map(|d| d.keys().cloned()).collect();
        refs.header_secrets.push((secret.clone(), keys));
    }
    Ok(refs)
}

/// The running importer's progress, from its metrics endpoint (None when it cannot be read).
async fn scrape_progress(dv: &DataVolume, pod: &Pod, ctx: &Context) -> Option<f64> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ip = status.pod_ip.as_ref()?;
    let url = format!("http://{ip}:{POD_PORT}/metrics");
    fetch_progress(
        &ctx.http,
        &url,
        dv.metadata.uid.as_deref().unwrap_or_default(),
    )
    .await
}

/// Reads `kubevirt_cdi_import_progress_total{ownerUID}` from a metrics URL.
async fn fetch_progress(http: &reqwest::Client, url: &str, owner_uid: &str) -> Option<f64> {
    let resp = http.get(url).send().await.ok()?.error_for_status().ok()?;
    parse_progress(&resp.text().await.ok()?, owner_uid)
}

/// Deletion: the pods and Service go; the PVC too unless the DataVolume asks to retain it.
async fn cleanup(dv: &DataVolume, ctx: &Context) -> Result<Requeue> {
    let ns = dv.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    kubeops::delete(&pods, &pod::importer_pod_name(name(dv))).await?;
    kubeops::delete(&pods, &pod::upload_name(name(dv))).await?;
    kubeops::delete(&services, &pod::upload_name(name(dv))).await?;
    let retain = dv
        .annotations()
        .get(ANN_RETAIN_PVC)
        .is_some_and(|v| v == "true");
    if !retain {
        kubeops::delete(&pvcs, name(dv)).await?;
    }
    Ok(Requeue::await_change())
}

/// The DataVolume a PVC belongs to, from CDI's ownedByDataVolume annotation.
fn owner_of(pvc: PersistentVolumeClaim) -> Option<ObjectRef<DataVolume>> {
    let key = pvc.annotations().get(ANN_OWNED_BY)?;
    let (ns, name) = key.split_once('/')?;
    Some(ObjectRef::new(name).within(ns))
}

/// Runs the controller until the process is stopped.
pub async fn run(client: Client, config: Config, metrics: Arc<Metrics>) {
    let dvs: Api<DataVolume> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let services: Api<Service> = Api::all(client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let ctx = Arc::new(Context::new(client, config, metrics));
    let results = Controller::new(dvs, watcher::Config::default())
        .owns(pods, watcher::Config::default())
        .owns(services, watcher::Config::default())
        .watches(pvcs, watcher::Config::default(), owner_of)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx);
    kubeops::drain(results).await;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use http::Method;
    use k8s_openapi::api::core::v1::VolumeResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::{Value, json};

    use super::*;
    use crate::ErrorKind;
    use crate::api::datavolume::{DataVolumeSource, SourceHttp, StorageSpec};
    use crate::api::{DataVolumeSpec, Phase};
    use crate::mockapi::{self, ApiServer};

    const NS: &str = "/api/v1/namespaces/vms";
    const DV: &str = "/apis/cdi.kubevirt.io/v1beta1/namespaces/vms/datavolumes/fedora";

    fn dv() -> DataVolume {
        let mut dv = DataVolume::new(
            "fedora",
            DataVolumeSpec {
                source: Some(DataVolumeSource {
                    http: Some(SourceHttp {
                        url: "http://images.example/fedora.qcow2".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                storage: Some(StorageSpec {
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".into(),
                            Quantity("1Gi".into()),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        dv.metadata.namespace = Some("vms".into());
        dv.metadata.uid = Some("uid-1".into());
        dv.metadata.finalizers = Some(vec![FINALIZER.into()]);
        dv
    }

    fn context(client: Client) -> Arc<Context> {
        Arc::new(Context::new(client, Config::default(), Arc::default()))
    }

    fn to_json<T: serde::Serialize>(v: &T) -> Value {
        serde_json::to_value(v).unwrap()
    }

    fn bound_pvc() -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": "fedora", "namespace": "vms"},
               "spec": {}, "status": {"phase": "Bound"}})
    }

    fn pod(phase: &str, exit: Option<i32>) -> Value {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "importer-fedora", "namespace": "vms"},
            "spec": {"containers": []}, "status": {"phase": phase}});
        if let Some(code) = exit {
            p["status"]["containerStatuses"] = json!([{"name": "importer", "image": "", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "message": "error: checksum mismatch"}}}]);
        }
        p
    }

    fn importing() -> DataVolume {
        let mut d = dv();
        d.status = Some(crate::api::DataVolumeStatus {
            phase: Some(Phase::ImportInProgress),
            ..Default::default()
        });
        d
    }

    fn deleting(annotations: &[(&str, &str)]) -> DataVolume {
        let mut d = dv();
        d.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::now(),
        ));
        d.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        d
    }

    /// Answers the reconcile's reads of the PVC and the importer pod (404 for None).
    async fn reads(api: &mut ApiServer, pvc: Option<Value>, pod: Option<Value>) {
        for (path, obj) in [
            (format!("{NS}/persistentvolumeclaims/fedora"), pvc),
            (format!("{NS}/pods/importer-fedora"), pod),
        ] {
            match obj {
                Some(o) => api.expect(Method::GET, &path, 200, o).await,
                None => {
                    api.expect(Method::GET, &path, 404, mockapi::status(404, "NotFound"))
                        .await
                }
            };
        }
    }

    async fn reconciled(
        dv: DataVolume,
        ctx: Arc<Context>,
    ) -> tokio::task::JoinHandle<Result<Requeue>> {
        tokio::spawn(reconcile(Arc::new(dv), ctx))
    }

    /// Checks the status apply and returns the applied status.
    async fn status_applied(api: &mut ApiServer, dv: &DataVolume) -> Value {
        let (query, sent) = api
            .expect(Method::PATCH, &format!("{DV}/status"), 200, to_json(dv))
            .await;
        assert!(
            query.contains("fieldManager=quarry-operators") && query.contains("force=true"),
            "{query}"
        );
        assert_eq!(sent["kind"], "DataVolume");
        sent["status"].clone()
    }

    #[tokio::test]
    async fn new_datavolume_creates_the_pvc_then_patches_status() {
        let (client, mut api) = mockapi::pair();
        let task = reconciled(dv(), context(client)).await;
        reads(&mut api, None, None).await;
        let pvc = api.created(&format!("{NS}/persistentvolumeclaims")).await;
        assert_eq!(pvc["metadata"]["name"], "fedora");
        assert_eq!(
            pvc["spec"]["resources"]["requests"]["storage"],
            "1136234735"
        );
        let st = status_applied(&mut api, &dv()).await;
        assert_eq!(st["phase"], "Pending");
        api.silence().await;
        let action = task.await.unwrap().unwrap();
        assert_eq!(action, Requeue::await_change());
    }

    #[tokio::test]
    async fn bound_pvc_gets_an_importer_pod() {
        let (client, mut api) = mockapi::pair();
        let task = reconciled(dv(), context(client)).await;
        reads(&mut api, Some(bound_pvc()), None).await;
        let pod = api.created(&format!("{NS}/pods")).await;
        assert_eq!(pod["metadata"]["name"], "importer-fedora");
        assert_eq!(pod["spec"]["containers"][0]["args"][0], "import");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        let st = status_applied(&mut api, &dv()).await;
        assert_eq!(st["phase"], "PVCBound");
        api.silence().await;
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn succeeded_pod_is_reported_then_deleted() {
        let (client, mut api) = mockapi::pair();
        let running = importing();
        let task = reconciled(running.clone(), context(client)).await;
        reads(&mut api, Some(bound_pvc()), Some(pod("Succeeded", Some(0)))).await;
        let ev = api
            .created("/apis/events.k8s.io/v1/namespaces/vms/events")
            .await;
        assert_eq!(ev["reason"], "ImportSucceeded");
        api.expect(
            Method::DELETE,
            &format!("{NS}/pods/importer-fedora"),
            200,
            pod("Succeeded", Some(0)),
        )
        .await;
        let st = status_applied(&mut api, &running).await;
        assert_eq!(st["phase"], "Succeeded");
        assert_eq!(st["progress"], "100.00%");
        api.silence().await;
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn checksum_failure_fails_at_once_and_no_new_pod_is_made() {
        let (client, mut api) = mockapi::pair();
        let running = importing();
        let ctx = context(client);
        let task = reconciled(running.clone(), ctx.clone()).await;
        reads(&mut api, Some(bound_pvc()), Some(pod("Failed", Some(14)))).await;
        let ev = api
            .created("/apis/events.k8s.io/v1/namespaces/vms/events")
            .await;
        assert_eq!(
            (ev["reason"].as_str(), ev["type"].as_str()),
            (Some("ImportFailed"), Some("Warning"))
        );
        api.not_found(Method::DELETE, &format!("{NS}/pods/importer-fedora"))
            .await;
        let st = status_applied(&mut api, &running).await;
        assert_eq!(st["phase"], "Failed");
        assert_eq!(st["restartCount"], 0);
        api.silence().await;
        task.await.unwrap().unwrap();

        // The next reconcile of the failed DataVolume only looks: no pod is created.
        let mut failed = running;
        failed.status = serde_json::from_value(st).unwrap();
        let task = reconciled(failed, ctx).await;
        reads(&mut api, Some(bound_pvc()), None).await;
        api.silence().await;
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn deletion_removes_pods_service_and_pvc_then_the_finalizer() {
        let (client, mut api) = mockapi::pair();
        let deleting = deleting(&[]);
        let task = reconciled(deleting.clone(), context(client)).await;
        api.expect(
            Method::DELETE,
            &format!("{NS}/pods/importer-fedora"),
            200,
            pod("Running", None),
        )
        .await;
        api.not_found(Method::DELETE, &format!("{NS}/pods/cdi-upload-fedora"))
            .await;
        api.not_found(Method::DELETE, &format!("{NS}/services/cdi-upload-fedora"))
            .await;
        api.expect(
            Method::DELETE,
            &format!("{NS}/persistentvolumeclaims/fedora"),
            200,
            bound_pvc(),
        )
        .await;
        let (_, patch) = api.expect(Method::PATCH, DV, 200, to_json(&deleting)).await;
        assert_eq!(patch[1]["op"], "remove", "{patch}");
        api.silence().await;
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_retained_pvc_survives_deletion() {
        let (client, mut api) = mockapi::pair();
        let deleting = deleting(&[(ANN_RETAIN_PVC, "true")]);
        let task = reconciled(deleting.clone(), context(client)).await;
        api.not_found(Method::DELETE, &format!("{NS}/pods/importer-fedora"))
            .await;
        api.not_found(Method::DELETE, &format!("{NS}/pods/cdi-upload-fedora"))
            .await;
        api.not_found(Method::DELETE, &format!("{NS}/services/cdi-upload-fedora"))
            .await;
        api.expect(Method::PATCH, DV, 200, to_json(&deleting)).await;
        api.silence().await;
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn the_finalizer_is_added_before_anything_else() {
        let (client, mut api) = mockapi::pair();
        let mut fresh = dv();
        fresh.metadata.finalizers = None;
        let task = reconciled(fresh.clone(), context(client)).await;
        let (_, patch) = api.expect(Method::PATCH, DV, 200, to_json(&fresh)).await;
        assert_eq!(patch[1]["value"][0], FINALIZER, "{patch}");
        api.silence().await;
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn progress_is_read_from_the_importers_metrics_server() {
        let progress = Arc::new(importer::progress::Progress::default());
        progress
            .virtual_size
            .store(1000, std::sync::atomic::Ordering::Relaxed);
        progress
            .written
            .store(455, std::sync::atomic::Ordering::Relaxed);
        let addr = importer::progress::serve_metrics(
            "127.0.0.1:0".parse().unwrap(),
            "uid-1".into(),
            progress,
        )
        .unwrap();
        let ctx = context(mockapi::pair().0);
        let url = format!("http://{addr}/metrics");
        let p = fetch_progress(&ctx.http, &url, "uid-1").await;
        assert_eq!(
            p.map(crate::datavolume::status::format_progress).as_deref(),
            Some("45.50%")
        );
        assert_eq!(fetch_progress(&ctx.http, &url, "someone-else").await, None);
        assert_eq!(
            fetch_progress(&ctx.http, "http://127.0.0.1:1/metrics", "uid-1").await,
            None
        );
    }

    #[tokio::test]
    async fn api_errors_surface_as_transient_errors() {
        let (client, mut api) = mockapi::pair();
        let ctx = context(client);
        let task = reconciled(dv(), ctx.clone()).await;
        api.expect(
            Method::GET,
            &format!("{NS}/persistentvolumeclaims/fedora"),
            500,
            mockapi::status(500, "InternalError"),
        )
        .await;
        let err = task.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Transient);
        assert_eq!(
            error_policy(Arc::new(dv()), &err, ctx.clone()),
            Requeue::requeue(Duration::from_secs(5))
        );
        assert!(ctx.metrics.render().contains("kind=\"transient\"} 1"));
    }
}
