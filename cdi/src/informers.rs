//! The PVC and pod watches of CDI's controller process, shared by the DataVolume and populator
//! controllers ([`kubekit::informer`]): one store of each, read instead of GETs, and a stream of
//! changes for each controller.

use std::fmt::Debug;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use futures_util::{FutureExt as _, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodSpec};
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kubekit::informer::{Informer, Made};
use kubekit::kubeops;
use serde::de::DeserializeOwned;

/// The label every pod Quarry makes carries (with [`crate::datavolume::labels`]): the pod watch
/// holds only those.
pub const MANAGED_PODS: &str = "app.kubernetes.io/managed-by=quarry";

/// What the controllers read of a pod: its metadata, status, restart policy and node. Its
/// containers and volumes are most of an importer pod, and thousands may wait at once.
fn trim_pod(pod: &mut Pod) {
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(PodSpec {
            restart_policy: spec.restart_policy,
            node_name: spec.node_name,
            ..Default::default()
        });
    }
}

/// The shared watches, until [`Informers::run`].
pub struct Informers {
    claims: Informer<PersistentVolumeClaim>,
    pods: Informer<Pod>,
}

/// What one controller reads: the stores, and the changes as they come.
pub struct Feed {
    /// The stores.
    pub stores: Stores,
    /// PVCs applied or deleted.
    pub claim_changes: BoxStream<'static, Arc<PersistentVolumeClaim>>,
    /// Quarry's pods applied or deleted.
    pub pod_changes: BoxStream<'static, Arc<Pod>>,
}

/// The stores a controller reads before the API server.
#[derive(Clone)]
pub struct Stores {
    /// Every PVC (in the namespace watched).
    pub claims: Store<PersistentVolumeClaim>,
    /// The pods Quarry made (trimmed: [`trim_pod`]).
    pub pods: Store<Pod>,
}

impl Informers {
    /// The watches over every namespace (`namespace` None) or one.
    pub fn new(client: &Client, namespace: Option<&str>) -> Self {
        Informers {
            claims: Informer::new(
                kubeops::scoped(client, namespace),
                watcher::Config::default(),
            ),
            pods: Informer::new(
                kubeops::scoped(client, namespace),
                watcher::Config::default().labels(MANAGED_PODS),
            )
            .trimmed(trim_pod),
        }
    }

    /// A feed for one more controller (taken before [`Informers::run`]).
    pub fn feed(&mut self) -> Feed {
        Feed {
            stores: Stores {
                claims: self.claims.store(),
                pods: self.pods.store(),
            },
            claim_changes: self.claims.subscribe().boxed(),
            pod_changes: self.pods.subscribe().boxed(),
        }
    }

    /// Watches until the process stops.
    pub async fn run(self) {
        tokio::join!(self.claims.run(), self.pods.run());
    }

    /// Runs one controller on watches of its own (a controller run alone, as in tests).
    pub async fn alone<Fut>(client: &Client, namespace: Option<&str>, run: impl FnOnce(Feed) -> Fut)
    where
        Fut: Future<Output = ()>,
    {
        let mut informers = Informers::new(client, namespace);
        let feed = informers.feed();
        // Aborted when dropped, as when this future is (a leader's work, stopped).
        let mut watching = tokio::task::JoinSet::new();
        watching.spawn(informers.run());
        run(feed).await;
    }
}

/// `name` in `ns` as `store` has it, else `made` as its create returned it (the store has it
/// moments later, the same or newer).
pub fn stored_or<K>(store: Option<&Store<K>>, ns: &str, name: &str, made: &K) -> K
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .and_then(|s| s.get(&ObjectRef::new(name).within(ns)))
        .map_or_else(|| made.clone(), |obj| obj.as_ref().clone())
}

/// An object only this controller creates, under a name it derives (a populator's PVC' and
/// pods): from `store` when it holds it; a miss is absence once the store has listed
/// everything, unless `made` says one of that name was created here moments ago (the store may
/// not have it yet: the API server is asked, as before the store is ready).
pub async fn read_ours<K>(
    store: Option<&Store<K>>,
    api: &Api<K>,
    ns: &str,
    name: &str,
    made: &Made,
) -> kubekit::Result<Option<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + 'static,
{
    if let Some(s) = store {
        let listed = s
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok());
        if listed && !made.recently(ns, name) {
            return Ok(s
                .get(&ObjectRef::new(name).within(ns))
                .map(|obj| obj.as_ref().clone()));
        }
    }
    read(store, api, Some(ns), name).await
}

/// `name` (in `ns` for a namespaced kind): from `store` when it holds it, else from the API
/// server. A store lags the server (an object just made may not be in it yet), so a miss is
/// confirmed there rather than taken for absence, which would make the object again.
pub async fn read<K>(
    store: Option<&Store<K>>,
    api: &Api<K>,
    ns: Option<&str>,
    name: &str,
) -> kubekit::Result<Option<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + 'static,
{
    let key = match ns {
        Some(ns) => ObjectRef::new(name).within(ns),
        None => ObjectRef::new(name),
    };
    match store.and_then(|s| s.get(&key)) {
        Some(obj) => Ok(Some(obj.as_ref().clone())),
        None => kubeops::get(api, name).await,
    }
}
