//! What the tests share: the CRDs installed once, polling for an outcome, playing the PV binder
//! and the kubelet by writing status, and a fake importer metrics endpoint.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use api::HyperConverged;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use serde_json::{Value, json};
use testkit::kube::KubeApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A client acting as `component`'s ServiceAccount (in `quarry`) with nothing but the RBAC the
/// bundle generates for it (applied to the shared server, idempotently), or None (skip).
pub async fn component_client(component: &str) -> Option<Client> {
    let server = server().await?;
    let admin = server.client();
    let ns = json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": api::names::NAMESPACE}});
    apply(&admin, &ns).await.unwrap();
    let access = api::rbac::of(component).expect("a component");
    for obj in api::rbac::objects(&access) {
        apply(&admin, &obj).await.unwrap();
    }
    Some(
        server
            .service_account_client(api::names::NAMESPACE, component)
            .await,
    )
}

/// Server-side applies `obj` (any kind the server serves) as the admin; the error names it.
pub async fn apply(client: &Client, obj: &Value) -> Result<(), String> {
    let (api_version, kind) = (
        obj["apiVersion"].as_str().unwrap_or_default(),
        obj["kind"].as_str().unwrap_or_default(),
    );
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let what = format!("{kind} {}", obj["metadata"]["name"]);
    let (ar, caps) = pinned_kind(client, &GroupVersionKind::gvk(group, version, kind))
        .await
        .map_err(|e| format!("{what}: discovery: {e}"))?;
    let api: Api<DynamicObject> = match (caps.scope, obj["metadata"]["namespace"].as_str()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        (Scope::Namespaced, None) => {
            return Err(format!("{what}: namespaced, without a namespace"));
        }
        (Scope::Cluster, _) => Api::all_with(client.clone(), &ar),
    };
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    api.patch(
        name,
        &PatchParams::apply("quarry-tests").force(),
        &Patch::Apply(obj),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("{what}: {e}"))
}

/// Field manager of the tests' own writes (playing binder and kubelet).
pub fn test_writes() -> PatchParams {
    PatchParams {
        field_manager: Some("quarry-tests".into()),
        ..Default::default()
    }
}

/// How long an expected outcome may take before the test fails (a hang guard, not a measure).
const PATIENCE: Duration = Duration::from_secs(60);

/// The shared server with the project's CRDs installed, or None (skip) where it cannot run.
async fn server() -> Option<&'static KubeApiServer> {
    let server = KubeApiServer::shared()?;
    install_crds(&server.client()).await;
    Some(server)
}

/// The shared server's admin client and a fresh namespace of its own for one test (None: skip).
pub async fn namespace(prefix: &str, labels: &[(&str, &str)]) -> Option<(Client, String)> {
    let server = server().await?;
    Some((server.client(), server.namespace(prefix, labels).await))
}

/// Applies the project's CRDs (idempotent) and waits until the server serves them.
pub async fn install_crds(client: &Client) {
    for (crd, _) in bundle::custom_resource_definitions() {
        testkit::kube::apply_crd(client, &crd, "quarry-tests").await;
    }
}

pub use testkit::kube::established;

/// A HyperConverged named `name` with `spec`.
pub fn hyperconverged(name: &str, spec: Value) -> HyperConverged {
    serde_json::from_value(json!({
        "apiVersion": "hco.kubevirt.io/v1beta1", "kind": "HyperConverged",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}

/// Creates HCO's singleton HyperConverged in `ns` and waits for its Degraded condition.
pub async fn hyperconverged_degraded(
    client: &Client,
    ns: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let api: Api<HyperConverged> = Api::namespaced(client.clone(), ns);
    let hc = hyperconverged("kubevirt-hyperconverged", json!({}));
    api.create(&kube::api::PostParams::default(), &hc)
        .await
        .unwrap();
    degraded(&api).await
}

/// Waits until the singleton HyperConverged is Degraded, and returns the condition.
pub async fn degraded(
    api: &Api<HyperConverged>,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    wait_for("Degraded", || async {
        let st = api.get("kubevirt-hyperconverged").await.ok()?.status?;
        st.conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
    })
    .await
}

/// Polls `f` until it returns Some, failing the test after [`PATIENCE`].
pub async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Plays the PV binder: the PVC `name` becomes Bound once it exists.
pub async fn bind_pvc(client: &Client, ns: &str, name: &str) {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("PVC {name}"), || async {
        api.get_opt(name).await.ok()?
    })
    .await;
    api.patch_status(
        name,
        &test_writes(),
        &Patch::Merge(json!({"status": {"phase": "Bound"}})),
    )
    .await
    .unwrap_or_else(|e| panic!("binding PVC {name}: {e}"));
}

/// Waits for pod `name` (a new one when `not_uid` names the old) and returns it.
pub async fn pod(client: &Client, ns: &str, name: &str, not_uid: Option<&str>) -> Pod {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("pod {name}"), || async {
        let p = api.get_opt(name).await.ok()??;
        (p.metadata.uid.as_deref() != not_uid && p.metadata.deletion_timestamp.is_none())
            .then_some(p)
    })
    .await
}

/// Plays the kubelet: writes the pod's status.
pub async fn set_pod_status(client: &Client, ns: &str, name: &str, status: Value) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.patch_status(
        name,
        &test_writes(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap_or_else(|e| panic!("writing the status of pod {name}: {e}"));
}

/// A running pod's status, reachable on 127.0.0.1.
pub fn running() -> Value {
    json!({"phase": "Running", "podIP": "127.0.0.1",
           "containerStatuses": [{"name": "importer", "image": "quarry", "imageID": "",
             "ready": true, "restartCount": 0, "state": {"running": {}}}]})
}

/// A terminated pod's status.
pub fn exited(code: i32, message: &str) -> Value {
    json!({"phase": if code == 0 { "Succeeded" } else { "Failed" },
           "containerStatuses": [{"name": "importer", "image": "quarry", "imageID": "",
             "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": code, "message": message}}}]})
}

/// A fake importer metrics endpoint: `kubevirt_cdi_import_progress_total{ownerUID}` grows with
/// the time since the first scrape, as a real import does, reaching 100 % after `duration`.
pub struct FakeImporter {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    scrapes: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeImporter {
    /// Starts serving progress for `owner_uid`.
    pub async fn start(owner_uid: String, duration: Duration) -> FakeImporter {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let scrapes = Arc::new(AtomicU64::new(0));
        let counter = scrapes.clone();
        let task = tokio::spawn(async move {
            let mut first: Option<Instant> = None;
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                counter.fetch_add(1, Ordering::Relaxed);
                let since = first.get_or_insert_with(Instant::now).elapsed();
                let percent = (since.as_secs_f64() / duration.as_secs_f64() * 100.0).min(100.0);
                let body = format!(
                    "kubevirt_cdi_import_progress_total{{ownerUID=\"{owner_uid}\"}} {percent}\n"
                );
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(resp.as_bytes()).await;
            }
        });
        FakeImporter {
            port,
            scrapes,
            task,
        }
    }

    /// Scrapes served so far.
    pub fn scrapes(&self) -> u64 {
        self.scrapes.load(Ordering::Relaxed)
    }
}

impl Drop for FakeImporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}
