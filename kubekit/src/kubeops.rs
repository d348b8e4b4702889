//! The few API calls the controllers make, with the conflicts that are normal in a level-driven
//! controller (already exists, already gone) treated as success.

use std::fmt::Debug;

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use kube::runtime::controller::Action as Requeue;

use crate::error::{Error, ErrorKind, Result};
use crate::metrics::Metrics;

/// Prefix of the controllers' field managers and user agents: each controller manages its own
/// fields as `quarry-<controller>` (`quarry-datavolume`, `quarry-hyperconverged`,
/// `quarry-hostpathprovisioner`).
pub fn manager(controller: &str) -> String {
    format!("quarry-{controller}")
}

/// `client` with `User-Agent: quarry-<controller>/VERSION` on every request (the API server
/// records it in audit logs and managedFields), for `config`.
pub fn client_for(mut config: kube::Config, controller: &str) -> Result<kube::Client> {
    let agent = format!("{}/{}", manager(controller), env!("CARGO_PKG_VERSION"));
    let value = http::HeaderValue::from_str(&agent)
        .map_err(|e| Error::Config(format!("user agent {agent:?}: {e}")))?;
    config.headers.push((http::header::USER_AGENT, value));
    kube::Client::try_from(config).map_err(|e| Error::Config(e.to_string()))
}

/// [`client_for`] the cluster of the kubeconfig (`KUBECONFIG`, `~/.kube/config`) or the pod's
/// service account.
pub async fn cluster_client(controller: &str) -> Result<kube::Client> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Config(e.to_string()))?;
    client_for(config, controller)
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Reconciles at most this many objects at once per controller. Thousands of DataVolumes made
/// at once would otherwise each hold a reconcile (its objects, requests and answers) in memory
/// while the API server, the real bound, serves a few at a time.
pub const CONCURRENT_RECONCILES: u16 = 32;

/// The controllers' kube-runtime settings: [`CONCURRENT_RECONCILES`].
pub fn controller_config() -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(CONCURRENT_RECONCILES)
}

/// How long [`while_unreachable`] tries: an admission webhook answers within the API server's
/// 10 s.
pub const UNREACHABLE_BUDGET: Duration = Duration::from_secs(5);

/// `call`, tried again (100 ms, doubling up to 1 s) while the API server gives no answer, for at
/// most `budget`: a webhook must not deny a request because the server was out of its reach for
/// a moment.
pub async fn while_unreachable<T, F, Fut>(budget: Duration, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let start = std::time::Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match call().await {
            Err(e) if e.unreachable() && start.elapsed() + pause < budget => {
                tracing::debug!(error = %e, "the API server gives no answer; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            done => return done,
        }
    }
}

/// The owners of kind `K`, a cluster-scoped kind, of `child`, keyed as `K`'s own watch keys
/// them. `Controller::owns` keys an owner in its child's namespace: a namespaced child (a
/// DaemonSet) of a cluster-scoped owner would give the owner a second key, so two reconciles
/// of the one object on every event and every requeue.
pub fn cluster_owners<K>(child: &impl kube::Resource) -> Vec<kube::runtime::reflector::ObjectRef<K>>
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>,
{
    child
        .meta()
        .owner_references
        .iter()
        .flatten()
        .filter_map(|o| kube::runtime::reflector::ObjectRef::from_owner_ref(None, o, ()))
        .collect()
}

/// Creates `obj` as field manager `manager`; an object of that name that already exists counts
/// as created.
pub async fn create<K>(api: &Api<K>, obj: &K, manager: &str) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    create_new(api, obj, manager).await.map(|_| ())
}

/// [`create`], returning the object as created (None when one of that name was there).
pub async fn create_new<K>(api: &Api<K>, obj: &K, manager: &str) -> Result<Option<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let params = PostParams {
        field_manager: Some(manager.to_string()),
        ..Default::default()
    };
    match api.create(&params, obj).await {
        Ok(made) => Ok(Some(made)),
        Err(e) if status_code(&e) == Some(409) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Deletes `name`; an object already gone counts as deleted.
pub async fn delete<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(e) if status_code(&e) == Some(404) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The objects of kind `K` in `namespace`, or in every namespace.
pub fn scoped<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Reads `name`, None when it does not exist. A kind the server does not serve (a CRD not
/// installed, such as the snapshot API's) has no objects either: the server's bare `404 page
/// not found` is not a `Status` that kube's `get_opt` recognizes as NotFound.
pub async fn get<K>(api: &Api<K>, name: &str) -> Result<Option<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    match api.get_opt(name).await {
        Ok(found) => Ok(found),
        Err(e) if status_code(&e) == Some(404) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The image of pod `namespace/name`'s first container; None (logged) when it cannot be read.
pub async fn pod_image(client: &kube::Client, namespace: &str, name: &str) -> Option<String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    match pods.get(name).await {
        Ok(p) => p.spec?.containers.into_iter().next()?.image,
        Err(e) => {
            tracing::warn!(error = %e, pod = %name, "reading a pod's image");
            None
        }
    }
}

/// Server-side applies `obj` (the whole desired object), taking over conflicting fields: what
/// someone else edits in the fields we own is put back.
pub async fn apply<K>(api: &Api<K>, name: &str, obj: &K, manager: &str) -> Result<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    Ok(api
        .patch(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(obj),
        )
        .await?)
}

/// Server-side applies the `status` of `name` (apiVersion and kind must be in `status_doc`).
pub async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    status_doc: serde_json::Value,
    manager: &str,
) -> Result<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    Ok(api
        .patch_status(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(status_doc),
        )
        .await?)
}

/// Adds `finalizer` to `obj`, returning the object as written (None when it had it already or
/// is gone). The patch carries the object's resourceVersion, so a stale copy fails with 409
/// (and is retried) instead of dropping someone else's finalizer.
pub async fn add_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    manager: &str,
) -> Result<Option<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    let mut list = obj.meta().finalizers.clone().unwrap_or_default();
    if list.iter().any(|f| f == finalizer) {
        return Ok(None);
    }
    list.push(finalizer.to_string());
    set_finalizers(api, obj, list, manager).await
}

/// Removes `finalizer` from `obj` (guarded like [`add_finalizer`]); absent counts as removed.
pub async fn remove_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    manager: &str,
) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    let list = obj.meta().finalizers.clone().unwrap_or_default();
    if !list.iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let rest = list.into_iter().filter(|f| f != finalizer).collect();
    set_finalizers(api, obj, rest, manager).await?;
    Ok(())
}

async fn set_finalizers<K>(
    api: &Api<K>,
    obj: &K,
    list: Vec<String>,
    manager: &str,
) -> Result<Option<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    let meta = obj.meta();
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": meta.resource_version, "finalizers": list}
    });
    let params = PatchParams {
        field_manager: Some(manager.to_string()),
        ..Default::default()
    };
    let name = meta.name.clone().unwrap_or_default();
    match api.patch(&name, &params, &Patch::Merge(patch)).await {
        Ok(written) => Ok(Some(written)),
        // Gone already: nothing left to finalize.
        Err(e) if status_code(&e) == Some(404) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Records a core/v1 Event on `regarding`, each one its own object (kube-rs's recorder folds
/// events of one reason into a series whose visible message stays the first one). Best effort:
/// a lost event is logged, never an error.
pub async fn publish_event(
    client: &kube::Client,
    regarding: &ObjectReference,
    warning: bool,
    reason: &str,
    message: &str,
    component: &str,
) {
    let ns = regarding
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let now = Time(Timestamp::now());
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let event = CoreEvent {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{stamp:x}",
                regarding.name.as_deref().unwrap_or("object")
            )),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: regarding.clone(),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        reason: Some(reason.into()),
        // The API server caps messages at 1 KiB.
        message: Some(truncate(message, 1024).into()),
        source: Some(EventSource {
            component: Some(component.into()),
            host: None,
        }),
        reporting_component: Some(component.into()),
        reporting_instance: Some(std::env::var("POD_NAME").unwrap_or_else(|_| component.into())),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Default::default()
    };
    let api: Api<CoreEvent> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = create(&api, &event, component).await {
        tracing::warn!(error = %e, reason, "publishing an event failed");
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The error policy all controllers share: count the failure, retry transient errors after 5 s
/// and invalid objects after `invalid`.
pub fn requeue_after(
    controller: &str,
    name: &str,
    err: &Error,
    metrics: &Metrics,
    invalid: Duration,
) -> Requeue {
    tracing::warn!(controller, name, error = %err, "reconcile failed");
    metrics.failure(controller, err);
    match err.kind() {
        ErrorKind::Transient => Requeue::requeue(Duration::from_secs(5)),
        ErrorKind::Invalid => Requeue::requeue(invalid),
    }
}

/// Drains a controller's result stream until shutdown (failures are logged by the policy).
pub async fn drain<T, E: std::fmt::Display>(
    results: impl Stream<Item = std::result::Result<T, E>>,
) {
    results
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile error");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::error::Error;

    /// A client of an address where nothing listens: what a webhook's client gets while the
    /// API server's Service routes nowhere.
    fn client_of_nothing() -> kube::Client {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}").parse().unwrap();
        kube::Client::try_from(kube::Config::new(url)).unwrap()
    }

    #[tokio::test]
    async fn a_refused_connection_is_unreachable_and_tried_until_the_budget_ends() {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client_of_nothing(), "ns");
        let calls = AtomicUsize::new(0);
        let budget = Duration::from_millis(400);
        let start = std::time::Instant::now();
        let got = while_unreachable(budget, || async {
            calls.fetch_add(1, Ordering::Relaxed);
            Ok(api.get_opt("cm").await?)
        })
        .await;
        let e = got.unwrap_err();
        assert!(e.unreachable(), "{e:?}");
        assert!(start.elapsed() < budget, "{:?}", start.elapsed());
        assert_eq!(calls.load(Ordering::Relaxed), 3, "at 0, 100 and 300 ms");
    }

    #[tokio::test]
    async fn an_answer_ends_the_tries_refusal_or_not() {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client_of_nothing(), "ns");
        let calls = AtomicUsize::new(0);
        let got = while_unreachable(Duration::from_secs(5), || async {
            match calls.fetch_add(1, Ordering::Relaxed) {
                0 | 1 => Ok(api.get_opt("cm").await.map(|_| 0)?),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(got.unwrap(), 7);
        assert_eq!(calls.load(Ordering::Relaxed), 3);

        let calls = AtomicUsize::new(0);
        let forbidden = || kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
        let got: Result<()> = while_unreachable(Duration::from_secs(5), || async {
            calls.fetch_add(1, Ordering::Relaxed);
            Err(Error::Kube(kube::Error::Api(Box::new(forbidden()))))
        })
        .await;
        assert!(!got.unwrap_err().unreachable());
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }
}
