//! One watch of a kind, one store of it, and any number of controllers fed from them: the
//! DataVolume and populator controllers of one process read the same PVCs and pods, and two
//! watches would hold every object twice. Each consumer gets every object touched (applied or
//! deleted, after the store has it) on a stream of its own; reconciles read the store instead
//! of GETting what they are triggered by.
//!
//! `managedFields` are dropped before the store: nothing reads them, and on objects written by
//! several managers they are a large part of each object.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

/// A watch with its store, and the consumers subscribed before it runs.
pub struct Informer<K: Resource<DynamicType = ()> + Clone + 'static> {
    api: Api<K>,
    config: watcher::Config,
    reader: Store<K>,
    writer: Writer<K>,
    consumers: Vec<UnboundedSender<Arc<K>>>,
    trim: fn(&mut K),
}

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// A watch of `api` with `config` (a label selector keeps the store to one's own objects).
    pub fn new(api: Api<K>, config: watcher::Config) -> Self {
        let (reader, writer) = reflector::store();
        Informer {
            api,
            config,
            reader,
            writer,
            consumers: Vec::new(),
            trim: |_| {},
        }
    }

    /// Drops what no consumer reads from every object before the store (besides
    /// `managedFields`).
    pub fn trimmed(self, trim: fn(&mut K)) -> Self {
        Informer { trim, ..self }
    }

    /// The store (filled once [`Informer::run`] runs; `wait_until_ready` waits for the first
    /// list).
    pub fn store(&self) -> Store<K> {
        self.reader.clone()
    }

    /// A stream of every object touched from now on. A consumer that stops reading only drops
    /// its own events.
    pub fn subscribe(&mut self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let (tx, rx) = unbounded_channel();
        self.consumers.push(tx);
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|o| (o, rx)) })
    }

    /// Watches until the process stops (errors are retried with back-off).
    pub async fn run(self) {
        let Informer {
            api,
            config,
            reader,
            writer,
            consumers,
            trim,
        } = self;
        let events = watcher(api, config)
            .default_backoff()
            .modify(move |o: &mut K| {
                o.managed_fields_mut().clear();
                trim(o);
            })
            .reflect(writer)
            .touched_objects();
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(obj) => {
                    // The store's copy when it holds this version (one copy in memory, however
                    // far behind a consumer is), else (deleted) this one.
                    let obj = reader
                        .get(&ObjectRef::from_obj(&obj))
                        .filter(|o| o.meta().resource_version == obj.meta().resource_version)
                        .unwrap_or_else(|| Arc::new(obj));
                    for consumer in &consumers {
                        let _ = consumer.send(obj.clone());
                    }
                }
                Err(e) => tracing::warn!(
                    kind = %K::kind(&()),
                    error = %e,
                    "watch failed; retrying"
                ),
            }
        }
    }
}

/// Entries kept for a while, by key: what a store may still lag behind. Every
/// [`SWEEP_EVERY`]th insertion drops what is older than `keep` (a last entry of each object is
/// never read again, and at thousands of DataVolumes such entries were a tenth of the
/// controller's memory).
struct Recent<Key, V> {
    by_key: std::sync::Mutex<std::collections::HashMap<Key, (Instant, V)>>,
    records: std::sync::atomic::AtomicUsize,
    keep: Duration,
}

impl<Key: std::hash::Hash + Eq, V> Recent<Key, V> {
    fn new(keep: Duration) -> Self {
        Recent {
            by_key: Default::default(),
            records: Default::default(),
            keep,
        }
    }

    fn insert(&self, key: Key, value: V) {
        let mut by_key = self.lock();
        let records = self
            .records
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if records.is_multiple_of(SWEEP_EVERY) {
            by_key.retain(|_, (at, _)| self.fresh(at));
        }
        by_key.insert(key, (Instant::now(), value));
    }

    /// Whether an entry made at `at` is still kept.
    fn fresh(&self, at: &Instant) -> bool {
        at.elapsed() < self.keep
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Key, (Instant, V)>> {
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What this controller's own writes returned, by UID, while its store still holds an older
/// copy. A reconcile that runs before the watch delivers our last write would otherwise decide
/// on the copy before it and write the same thing again (and be triggered again by it).
pub struct Written<K>(Recent<String, Arc<K>>);

/// How long a write is remembered: longer than a watch lags on a busy server, short enough
/// that the last write of each object (which no reconcile reads again) is not kept long.
/// Forgetting early costs at most one write repeated.
const REMEMBERED: Duration = Duration::from_secs(5);

/// Writes recorded between two sweeps of what is older than [`REMEMBERED`].
const SWEEP_EVERY: usize = 128;

impl<K> Default for Written<K> {
    fn default() -> Self {
        Written(Recent::new(REMEMBERED))
    }
}

impl<K: Resource> Written<K> {
    /// Records what a write of ours returned (without its managedFields, as the stores: a
    /// write's answer carries them, and no reconcile reads them).
    pub fn record(&self, mut obj: K) {
        obj.managed_fields_mut().clear();
        if let Some(uid) = obj.meta().uid.clone() {
            self.0.insert(uid, Arc::new(obj));
        }
    }

    /// `obj`, or what our last write of it returned when that is newer (then kept until the
    /// store catches up).
    pub fn newest(&self, obj: Arc<K>) -> Arc<K> {
        let Some(uid) = obj.meta().uid.as_deref() else {
            return obj;
        };
        let mut by_uid = self.0.lock();
        let Some((_, written)) = by_uid.get(uid) else {
            return obj;
        };
        match (version(obj.as_ref()), version(written.as_ref())) {
            (Some(seen), Some(ours)) if seen < ours => written.clone(),
            _ => {
                by_uid.remove(uid);
                obj
            }
        }
    }

    /// Drops what was recorded for `uid` (the object is gone).
    pub fn forget(&self, uid: &str) {
        self.0.lock().remove(uid);
    }
}

/// The objects this controller created, by namespace and name, for as long as a store may lag
/// behind them ([`REMEMBERED`]). For what only this controller creates (a populator's PVC' and
/// pods, under names it derives), a store that has listed everything and lacks a name not made
/// here moments ago does not have it because there is none: no GET needs to confirm it.
pub struct Made(Recent<(String, String), ()>);

impl Default for Made {
    fn default() -> Self {
        Made(Recent::new(REMEMBERED))
    }
}

impl Made {
    /// Notes that `ns/name` was just created (or found existing when creating it).
    pub fn record(&self, ns: &str, name: &str) {
        self.0.insert((ns.to_string(), name.to_string()), ());
    }

    /// Whether `ns/name` was created here within the store's lag.
    pub fn recently(&self, ns: &str, name: &str) -> bool {
        self.0
            .lock()
            .get(&(ns.to_string(), name.to_string()))
            .is_some_and(|(at, _)| self.0.fresh(at))
    }
}

/// The versions this controller's own writes made, by UID, until its watch brings each back.
/// A reconcile that writes an object it observes decides again on what the write returned
/// before it ends, so the watch event of that version is no news to it: [`Echoes::is_echo`]
/// drops it from a controller's stream of changes ([`Echoes::filter`]) before it triggers a
/// reconcile (a DataVolume's PVC, a populator's PVC', pod and annotations). Any other version,
/// and any object not written here, passes. An echo that comes before its write is recorded,
/// or after [`ECHOED`], passes too: one reconcile more.
pub struct Echoes(Recent<String, String>);

/// How long a written version waits for its echo: longer than a watch lags on a busy server
/// (thousands of creates at once), short enough to hold few versions.
const ECHOED: Duration = Duration::from_secs(60);

impl Default for Echoes {
    fn default() -> Self {
        Echoes(Recent::new(ECHOED))
    }
}

impl Echoes {
    /// Notes the version of `obj` a write of ours returned.
    pub fn record<K: Resource>(&self, obj: &K) {
        let meta = obj.meta();
        if let (Some(uid), Some(version)) = (&meta.uid, &meta.resource_version) {
            self.0.insert(uid.clone(), version.clone());
        }
    }

    /// Records what a create of ours made (None: one of that name was there), and returns it.
    pub fn created<K: Resource>(&self, made: Option<K>) -> Option<K> {
        made.inspect(|obj| self.record(obj))
    }

    /// `changes` without the echoes of our own writes.
    pub fn filter<K: Resource + Send + Sync + 'static>(
        self: &Arc<Self>,
        changes: impl Stream<Item = Arc<K>> + Send + 'static,
    ) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let echoes = self.clone();
        changes.filter(move |obj| std::future::ready(!echoes.is_echo(obj.as_ref())))
    }

    /// Whether `obj` is the version our last write of it made (then forgotten: it came back).
    pub fn is_echo<K: Resource>(&self, obj: &K) -> bool {
        let meta = obj.meta();
        let (Some(uid), Some(version)) = (&meta.uid, &meta.resource_version) else {
            return false;
        };
        let mut by_uid = self.0.lock();
        match by_uid.get(uid) {
            Some((at, ours)) if ours == version && self.0.fresh(at) => {
                by_uid.remove(uid);
                true
            }
            _ => false,
        }
    }
}

/// The resourceVersion as a number. The API treats it as opaque, but etcd's are increasing
/// integers; anything else counts as not comparable (and the store's copy is taken).
fn version<K: Resource>(obj: &K) -> Option<u64> {
    obj.meta().resource_version.as_deref()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn at(version: &str, data: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                uid: Some("u-1".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            data: Some([("k".to_string(), data.to_string())].into()),
            ..Default::default()
        }
    }

    fn data(c: &ConfigMap) -> &str {
        c.data.as_ref().unwrap()["k"].as_str()
    }

    #[test]
    fn made_names_are_remembered_by_namespace_and_name() {
        let made = Made::default();
        assert!(!made.recently("vms", "importer-prime-1"));
        made.record("vms", "importer-prime-1");
        assert!(made.recently("vms", "importer-prime-1"));
        assert!(!made.recently("other", "importer-prime-1"));
        assert!(!made.recently("vms", "importer-prime-2"));
    }

    #[test]
    fn only_the_version_our_write_made_is_an_echo_and_only_once() {
        let echoes = Echoes::default();
        // Nothing written here: no echo.
        assert!(!echoes.is_echo(&at("10", "theirs")));
        echoes.record(&at("12", "ours"));
        // An older version (the watch still behind) and a newer one (someone else's) pass.
        assert!(!echoes.is_echo(&at("11", "before")));
        assert!(!echoes.is_echo(&at("13", "after")));
        // Ours comes back once: then it is forgotten.
        assert!(echoes.is_echo(&at("12", "ours")));
        assert!(!echoes.is_echo(&at("12", "ours")));
        // A second write of ours replaces the first: only its version is an echo.
        echoes.record(&at("14", "ours"));
        echoes.record(&at("15", "ours again"));
        assert!(!echoes.is_echo(&at("14", "ours")));
        assert!(echoes.is_echo(&at("15", "ours again")));
        // Another object with the same version is not ours.
        echoes.record(&at("16", "ours"));
        let mut other = at("16", "ours");
        other.metadata.uid = Some("u-2".into());
        assert!(!echoes.is_echo(&other));
    }

    #[test]
    fn our_write_wins_over_an_older_copy_until_the_store_catches_up() {
        let written = Written::default();
        // Nothing written: the store's copy.
        assert_eq!(data(&written.newest(Arc::new(at("10", "store")))), "store");
        written.record(at("12", "ours"));
        // The store still has version 10: our write.
        assert_eq!(data(&written.newest(Arc::new(at("10", "store")))), "ours");
        // The store has our write or later: the store's, and ours is dropped.
        assert_eq!(data(&written.newest(Arc::new(at("13", "later")))), "later");
        assert_eq!(data(&written.newest(Arc::new(at("10", "store")))), "store");
        // Versions that are not numbers are not compared: the store's copy.
        written.record(at("x", "ours"));
        assert_eq!(data(&written.newest(Arc::new(at("10", "store")))), "store");
        written.record(at("20", "ours"));
        written.forget("u-1");
        assert_eq!(data(&written.newest(Arc::new(at("10", "store")))), "store");
    }
}
