//! The DataVolume controller on kube-runtime (controller-rs style): a [`Context`], [`reconcile`]
//! and [`error_policy`], a finalizer that cleans up pods (and the PVC unless retained), status by
//! server-side apply, a tracing span per object and Prometheus reconcile metrics. All decisions
//! are [`decide`]'s; this module only reads the objects and carries out the actions.
//!
//! What triggers a reconcile: a DataVolume's spec, finalizers or deletion (never its status, so
//! our own status writes cause no reconcile), its PVC, pod and Service, a StorageProfile change
//! (for DataVolumes waiting for one), and timers. The settings come from [`Context::settings`],
//! which the CDIConfig reconciler ([`crate::cdiconfig`]) keeps. A running
//! import's progress is read on the timer ([`Config::progress_interval`]), at most once per
//! interval whatever else triggers reconciles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use tracing::{Instrument, info_span};

use super::classes::{CsiDrivers, StorageClasses};
use super::clone::objects::temp_snapshot_name;
use super::clone::{SourceRef, resolve_source_ref};
use super::decide::{Announced, Event, PodRefusal};
use super::pod::{self, POD_PORT, SourceRefs};
use super::populated::{self, PopulatorSource};
use super::pvc::StorageDefaults;
use super::source::CloneSource;
use super::source::CloneSourceKind;
use super::source::{ImportSource, Source, source};
use super::status::{CLONE_PROGRESS, IMPORT_PROGRESS, parse_counter};
use super::{ANN_OWNED_BY, Action, FINALIZER, Observed, decide, name};
use crate::informers::{self, Feed, Informers, Stores};
use crate::settings::{Config, UploadTls};
use crate::settings::{LiveSettings, Overrides, default_class};
use api::datavolume::{ContentType, DataVolumeSourceRef};
use api::golden::DataSource;
use api::names;
use api::populator::{VolumeImportSource, VolumeUploadSource};
use api::snapshot::VolumeSnapshot;
use api::{DataVolume, StorageProfile};
use kubekit::error::{Error, Result};
use kubekit::informer::{Echoes, Made, Written};
use kubekit::kubeops;
use kubekit::metrics::Metrics;

/// Name in metrics, events, the field manager and the user agent.
pub const CONTROLLER: &str = "datavolume";

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The settings in force (what the CDIConfig reconciler last derived; the flags' until then).
    pub live: Arc<LiveSettings>,
    /// Reconcile metrics.
    pub metrics: Arc<Metrics>,
    /// Client for importer metrics endpoints.
    pub http: reqwest::Client,
    /// Field manager of every write (`quarry-datavolume`).
    pub manager: String,
    /// Port of the importers' metrics endpoints (tests point it at a fake importer).
    pub metrics_port: u16,
    /// StorageClasses, read once in a while.
    pub classes: StorageClasses,
    /// CSIDrivers, likewise.
    drivers: CsiDrivers,
    /// The shared PVC and pod stores and the StorageProfiles, once [`run`] watches.
    stores: OnceLock<(Stores, Store<StorageProfile>)>,
    /// DataVolumes as our status writes left them, until the store has them.
    written: Written<DataVolume>,
    /// The versions of the PVCs and pods our creates made: their events are no news.
    echoes: Arc<Echoes>,
    /// The pods made here lately (a store miss of any other of ours is absence).
    made: Made,
    /// When each running import (by DataVolume UID) was last scraped.
    scraped: Mutex<HashMap<String, Instant>>,
    /// Pod creations refused in a row, by DataVolume UID (an input of their back-off).
    refused: Mutex<HashMap<String, PodRefusal>>,
    /// The last event published, by DataVolume UID (reason, message): a decision made from a
    /// DataVolume read before its last status write repeats the phase change, not the event.
    announced: Announced,
}

impl Context {
    /// A context for `client` with fixed settings (no CDIConfig reconciler beside it).
    pub fn new(client: Client, config: Config, metrics: Arc<Metrics>) -> Self {
        let live = Arc::new(LiveSettings::new(config, Overrides::default()));
        Context::with_settings(client, live, metrics)
    }

    /// A context for `client` reading the settings `live` (which a CDIConfig reconciler keeps).
    pub fn with_settings(client: Client, live: Arc<LiveSettings>, metrics: Arc<Metrics>) -> Self {
        Context {
            classes: StorageClasses::new(client.clone()),
            drivers: CsiDrivers::new(client.clone()),
            stores: OnceLock::new(),
            written: Written::default(),
            echoes: Arc::default(),
            made: Made::default(),
            client,
            live,
            metrics,
            http: metrics_http(),
            manager: kubeops::manager(CONTROLLER),
            metrics_port: POD_PORT as u16,
            scraped: Mutex::default(),
            refused: Mutex::default(),
            announced: Announced::default(),
        }
    }

    /// Where importer metrics are read.
    pub(crate) fn metrics_client(&self) -> MetricsClient<'_> {
        MetricsClient {
            http: &self.http,
            port: self.metrics_port,
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> Arc<Config> {
        self.live.get()
    }

    /// Whether the import of `uid` is due for a progress scrape (and if so, records it).
    fn scrape_due(&self, uid: &str) -> bool {
        let mut scraped = self.scraped.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // A timer may fire a little early; 90 % of the interval counts as due.
        let due = scraped.get(uid).is_none_or(|last| {
            now.duration_since(*last) >= self.settings().progress_interval.mul_f32(0.9)
        });
        if due {
            scraped.insert(uid.to_string(), now);
        }
        due
    }

    /// The pod creations of `uid` refused in a row.
    fn refusal(&self, uid: &str) -> Option<PodRefusal> {
        let refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.get(uid).cloned()
    }

    fn set_refusal(&self, uid: &str, refusal: Option<PodRefusal>) {
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        match refusal {
            Some(r) => refused.insert(uid.to_string(), r),
            None => refused.remove(uid),
        };
    }

    fn forget(&self, uid: &str) {
        self.scraped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.announced.forget(uid);
        self.written.forget(uid);
    }

    /// Whether `e` differs from the last event published for `uid` (and if so, records it).
    fn news(&self, uid: &str, e: &Event) -> bool {
        self.announced.news(uid, e)
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
        let dv = ctx.written.newest(dv);
        let has_finalizer = dv.finalizers().iter().any(|f| f == FINALIZER);
        if dv.metadata.deletion_timestamp.is_some() {
            if has_finalizer {
                cleanup(&dv, &ctx).await?;
                kubeops::remove_finalizer(&api, dv.as_ref(), FINALIZER, &ctx.manager).await?;
            }
            ctx.forget(dv.metadata.uid.as_deref().unwrap_or_default());
            return Ok(Requeue::await_change());
        }
        let dv = match has_finalizer {
            true => dv,
            // Then on with the work, on the object as written.
            false => {
                match kubeops::add_finalizer(&api, dv.as_ref(), FINALIZER, &ctx.manager).await? {
                    Some(written) => {
                        ctx.written.record(written.clone());
                        Arc::new(written)
                    }
                    None => return Ok(Requeue::await_change()),
                }
            }
        };
        apply(&dv, &ctx, true).await
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

/// The pod name a DataVolume's (resolved) source uses, and whether it is an upload server
/// (uploads and host-assisted clones).
fn pod_name(dv: &DataVolume, src: Option<&Source>) -> (String, bool) {
    match src {
        Some(Source::Upload | Source::Clone(_)) => (pod::upload_name(name(dv)), true),
        _ => (pod::importer_pod_name(name(dv)), false),
    }
}

/// The source of `dv`, `spec.sourceRef` standing for what it resolved to.
fn resolved_source(dv: &DataVolume, source_ref: Option<&SourceRef>) -> Option<Source> {
    let (kind, p) = match source_ref {
        Some(SourceRef::Pvc(p)) => (CloneSourceKind::Pvc, p),
        Some(SourceRef::Snapshot(p)) => (CloneSourceKind::Snapshot, p),
        _ => return source(&dv.spec).ok(),
    };
    Some(Source::Clone(CloneSource {
        kind,
        namespace: p.namespace.clone(),
        name: p.name.clone(),
    }))
}

/// Resolves `spec.sourceRef`: reads its DataSource (and the one it refers to, a chain being
/// at most one deep) and decides with [`resolve_source_ref`].
async fn source_ref(client: &Client, ns: &str, r: &DataVolumeSourceRef) -> Result<SourceRef> {
    let get = |ns: String, name: String| {
        let api: Api<DataSource> = Api::namespaced(client.clone(), &ns);
        async move { kubeops::get(&api, &name).await }
    };
    let first_ns = r.namespace.clone().unwrap_or_else(|| ns.to_string());
    let mut found = Vec::new();
    if let Some(first) = get(first_ns.clone(), r.name.clone()).await? {
        if let Some(next) = &first.spec.source.data_source {
            let next_ns = if next.namespace.is_empty() {
                first_ns
            } else {
                next.namespace.clone()
            };
            found.extend(get(next_ns, next.name.clone()).await?);
        }
        found.push(first);
    }
    Ok(resolve_source_ref(ns, r, |ns, name| {
        found.iter().find(|d| {
            d.metadata.namespace.as_deref() == Some(ns) && d.metadata.name.as_deref() == Some(name)
        })
    }))
}

/// Observes, decides and acts. `may_refresh`: before creating a pod, the DataVolume is read
/// again from the API server (the cached copy may predate our last status write, whose
/// restart count and back-off the decision must see) and decided on afresh if it changed.
async fn apply(dv: &DataVolume, ctx: &Context, may_refresh: bool) -> Result<Requeue> {
    let round = Round {
        may_refresh,
        made: JustMade::default(),
        stored: dv.status.clone(),
        left: ROUNDS_AFTER_CREATES,
    };
    Ok(match apply_round(dv, ctx, round).await? {
        Some(d) => Requeue::requeue(d),
        None => Requeue::await_change(),
    })
}

/// How many times one reconcile decides again on what it made (a PVC, then its pod).
const ROUNDS_AFTER_CREATES: u8 = 2;

/// One decision of a reconcile.
struct Round {
    may_refresh: bool,
    /// What the rounds before made (the stores may not have it yet).
    made: JustMade,
    /// The status as the API server has it (the rounds after the first decide on the one
    /// before's, which is written once, by the last).
    stored: Option<api::datavolume::DataVolumeStatus>,
    left: u8,
}

/// The PVC, pod and Service a reconcile created, as the API server returned them.
#[derive(Default)]
struct JustMade {
    pvc: Option<PersistentVolumeClaim>,
    pod: Option<Pod>,
    service: bool,
}

/// A round of [`apply`]: what it made is decided on again at once, as the watch event of it
/// would have it decided (that event is then no news: [`Echoes`]); returns the requeue.
async fn apply_round(dv: &DataVolume, ctx: &Context, round: Round) -> Result<Option<Duration>> {
    let may_refresh = round.may_refresh;
    let ns = dv.namespace().unwrap_or_default();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let dvs: Api<DataVolume> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = dv.metadata.uid.clone().unwrap_or_default();
    let cfg = ctx.settings();
    let finished = dv
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(|p| p.is_final());

    let stores = ctx.stores.get().map(|(s, _)| s);
    let pvc = match &round.made.pvc {
        Some(made) => Some(informers::stored_or(
            stores.map(|s| &s.claims),
            &ns,
            name(dv),
            made,
        )),
        None => informers::read(stores.map(|s| &s.claims), &pvcs, Some(&ns), name(dv)).await?,
    };
    // A PVC populated before its DataVolume is adopted as it is: its source is never read.
    let adopts = super::adopt::adopts(dv, pvc.as_ref());
    let finished = finished || adopts;
    let source_ref = match (&dv.spec.source, &dv.spec.source_ref) {
        (None, Some(r)) if !finished => Some(source_ref(&ctx.client, &ns, r).await?),
        _ => None,
    };
    let resolved = resolved_source(dv, source_ref.as_ref());
    let (pod_name, upload) = pod_name(dv, resolved.as_ref());
    // A populated DataVolume follows its PVC: the pod and Service are the populator's.
    let csi_class = match (&pvc, &resolved) {
        (None, Some(src)) if !finished && populated::populates(src) => {
            Some(csi_class(dv, ctx).await?)
        }
        // An external populator other than a snapshot needs a CSI driver (read once bound).
        (Some(p), None) if !finished && super::external::populator(dv).is_some() => {
            let bound = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            let class = p.spec.as_ref().and_then(|s| s.storage_class_name.clone());
            match class {
                Some(c) if bound => Some(has_csi_driver(ctx.classes.get(&c).await?, ctx).await?),
                _ => None,
            }
        }
        _ => Some(false),
    };
    let populated = resolved.as_ref().is_some_and(populated::populates)
        && populated::uses_populator(dv, pvc.as_ref(), csi_class);
    let pod = match (populated, &round.made.pod) {
        (true, _) => None,
        (false, Some(made)) => Some(informers::stored_or(
            stores.map(|s| &s.pods),
            &ns,
            &pod_name,
            made,
        )),
        (false, None) => {
            let store = stores.map(|s| &s.pods);
            informers::read_ours(store, &pods, &ns, &pod_name, &ctx.made).await?
        }
    };
    let service = if round.made.service {
        true
    } else if upload && !populated {
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
            ctx.classes
                .get(&class)
                .await?
                .and_then(|c| c.volume_binding_mode)
                .as_deref()
                == Some("WaitForFirstConsumer")
        }
        _ => false,
    };
    let refs = if pvc.is_some() && pod.is_none() && !finished {
        match source(&dv.spec) {
            Ok(Source::Import(src)) => source_refs(&ctx.client, &cfg, &src, &ns).await?,
            _ => SourceRefs::default(),
        }
    } else {
        SourceRefs::default()
    };
    let progress = match &pod {
        Some(p) if !upload && pod_running(p) && ctx.scrape_due(&uid) => {
            scrape_progress(dv, p, ctx).await
        }
        _ => None,
    };
    let storage = if finished {
        StorageDefaults::Builtin
    } else {
        storage_defaults(dv, pvc.as_ref(), ctx).await?
    };
    let clone = match &resolved {
        Some(Source::Clone(c)) if !finished => {
            observe_clone(dv, ctx, c, pvc.as_ref(), pod.as_ref(), &storage).await?
        }
        _ => Default::default(),
    };
    // A host-assisted clone's progress is its source pod's, labelled with the target's UID.
    let progress = match (&clone.source_pod, pvc.as_ref().and_then(|p| p.uid())) {
        (Some(p), Some(target_uid)) if pod_running(p) && ctx.scrape_due(&uid) => {
            scrape(ctx.metrics_client(), p, CLONE_PROGRESS, &target_uid).await
        }
        _ => progress,
    };
    let observed = Observed {
        clone,
        source_ref,
        storage,
        pvc: pvc.as_ref(),
        pod: pod.as_ref(),
        service,
        wait_for_first_consumer: wffc,
        csi_class,
        progress,
        refs,
        refused: ctx.refusal(&uid),
        now: Timestamp::now(),
    };
    let mut decision = decide(dv, &observed, &cfg);

    if may_refresh
        && decision
            .actions
            .iter()
            .any(|a| matches!(a, Action::CreatePod(_)))
        && let Some(fresh) = kubeops::get(&dvs, name(dv)).await?
        && fresh.metadata.resource_version != dv.metadata.resource_version
    {
        let round = Round {
            may_refresh: false,
            stored: fresh.status.clone(),
            ..round
        };
        return Box::pin(apply_round(&fresh, ctx, round)).await;
    }

    if let Some(ca) = pod::proxy_ca(&cfg)
        && decision
            .actions
            .iter()
            .any(|a| matches!(a, Action::CreatePod(_)))
        && !upload
    {
        let w = pod::Workload::of(dv);
        copy_proxy_ca(&ctx.client, &ctx.manager, &w, ca).await?;
    }

    // Creations and events first, then the status, then deletions: a deletion triggers a
    // reconcile, which must find the status (restart count, back-off) already written.
    let mut deletions = Vec::new();
    let mut made = JustMade::default();
    let mut was_refused = false;
    for action in std::mem::take(&mut decision.actions) {
        match action {
            Action::CreatePvc(p) => {
                made.pvc = ctx
                    .echoes
                    .created(kubeops::create_new(&pvcs, &p, &ctx.manager).await?);
            }
            Action::CreatePopulatorSource(s) => match *s {
                PopulatorSource::Import(metadata, spec) => {
                    let api: Api<VolumeImportSource> = Api::namespaced(ctx.client.clone(), &ns);
                    let spec = *spec;
                    let obj = VolumeImportSource { metadata, spec };
                    kubeops::create(&api, &obj, &ctx.manager).await?
                }
                PopulatorSource::Upload(metadata, spec) => {
                    let api: Api<VolumeUploadSource> = Api::namespaced(ctx.client.clone(), &ns);
                    let obj = VolumeUploadSource { metadata, spec };
                    kubeops::create(&api, &obj, &ctx.manager).await?
                }
            },
            Action::CreatePod(p) => match kubeops::create_new(&pods, &p, &ctx.manager).await {
                Ok(created) => {
                    made.pod = ctx.echoes.created(created);
                    ctx.made.record(&ns, &p.name_any());
                    ctx.set_refusal(&uid, None)
                }
                Err(Error::Kube(kube::Error::Api(e))) if is_refusal(e.code) => {
                    // The refusal is the decision's input: decided again, the pod waits for
                    // its back-off and Running says why (the actions before it have run).
                    let refused = ctx.refusal(&uid).map_or(1, |r| r.attempt + 1);
                    let refused = PodRefusal {
                        attempt: refused,
                        message: e.message.clone(),
                        at: observed.now,
                    };
                    ctx.set_refusal(&uid, Some(refused.clone()));
                    let again = Observed {
                        refused: Some(refused),
                        ..observed.clone()
                    };
                    decision = decide(dv, &again, &cfg);
                    for action in std::mem::take(&mut decision.actions) {
                        if let Action::Event(ev) = action {
                            publish(ctx, dv, ev).await;
                        }
                    }
                    was_refused = true;
                    break;
                }
                Err(e) => return Err(e),
            },
            Action::CreateService(s) => {
                kubeops::create(&services, &s, &ctx.manager).await?;
                made.service = true;
            }
            Action::DeletePod(_)
            | Action::DeleteService(_)
            | Action::DeleteSnapshot(_)
            | Action::DeleteSourcePod { .. }
            | Action::DeleteRestore { .. } => deletions.push(action),
            Action::Event(e) => publish(ctx, dv, e).await,
            Action::CreateSnapshot(s) => {
                let api: Api<VolumeSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
                kubeops::create(&api, &s, &ctx.manager).await?
            }
            Action::CreateSourcePod(p) => {
                let src_ns = p.metadata.namespace.clone().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &src_ns);
                kubeops::create(&api, &p, &ctx.manager).await?
            }
            Action::CreateRestore(p) => {
                let src_ns = p.metadata.namespace.clone().unwrap_or_default();
                let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &src_ns);
                kubeops::create(&api, &p, &ctx.manager).await?
            }
            Action::EnsureUploadSecret { namespace } => {
                let renewal = super::upload_secret::ensure(
                    &ctx.client,
                    &pod::Workload::of(dv),
                    &namespace,
                    &ctx.manager,
                )
                .await?;
                decision.requeue = Some(decision.requeue.map_or(renewal, |r| r.min(renewal)));
            }
            Action::AdoptPvc {
                resource_version,
                owners,
            } => {
                // The resourceVersion makes a stale copy fail (409, retried) instead of
                // dropping an owner someone else added meanwhile.
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": resource_version, "ownerReferences": owners}
                });
                let params = kube::api::PatchParams {
                    field_manager: Some(ctx.manager.clone()),
                    ..Default::default()
                };
                pvcs.patch(name(dv), &params, &kube::api::Patch::Merge(&patch))
                    .await?;
            }
            Action::ExpandPvc(size) => {
                let patch = serde_json::json!({
                    "spec": {"resources": {"requests": {"storage": size}}}
                });
                let params = kube::api::PatchParams {
                    field_manager: Some(ctx.manager.clone()),
                    ..Default::default()
                };
                pvcs.patch(name(dv), &params, &kube::api::Patch::Merge(&patch))
                    .await?;
            }
        }
    }
    let again = made.pvc.is_some() || made.pod.is_some();
    if again && !was_refused && deletions.is_empty() && round.left > 0 {
        let next = DataVolume {
            status: Some(decision.status),
            ..dv.clone()
        };
        let round = Round {
            may_refresh: false,
            made: JustMade {
                pvc: made.pvc.or(round.made.pvc),
                pod: made.pod.or(round.made.pod),
                service: made.service || round.made.service,
            },
            stored: round.stored,
            left: round.left - 1,
        };
        let then = Box::pin(apply_round(&next, ctx, round)).await?;
        return Ok(match (decision.requeue, then) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        });
    }
    if round.stored.as_ref() != Some(&decision.status) {
        let doc = serde_json::json!({
            "apiVersion": DataVolume::api_version(&()),
            "kind": DataVolume::kind(&()),
            "status": decision.status,
        });
        let written = kubeops::apply_status(&dvs, name(dv), doc, &ctx.manager).await?;
        ctx.written.record(written);
    }
    for action in deletions {
        match action {
            Action::DeletePod(n) => kubeops::delete(&pods, &n).await?,
            Action::DeleteService(n) => kubeops::delete(&services, &n).await?,
            Action::DeleteSnapshot(n) => {
                let api: Api<VolumeSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
                kubeops::delete(&api, &n).await?
            }
            Action::DeleteSourcePod { namespace, name } => {
                let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
                kubeops::delete(&api, &name).await?;
                // Its client certificate is named as the pod.
                let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
                kubeops::delete(&api, &name).await?
            }
            Action::DeleteRestore { namespace, name } => {
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(ctx.client.clone(), &namespace);
                kubeops::delete(&api, &name).await?
            }
            _ => {}
        }
    }
    Ok(decision.requeue)
}

/// Reads a clone's objects and facts; issues the clone source pod's client certificate once
/// the target's upload server runs (when upload servers take issued certificates).
async fn observe_clone(
    dv: &DataVolume,
    ctx: &Context,
    c: &CloneSource,
    target: Option<&PersistentVolumeClaim>,
    upload_pod: Option<&Pod>,
    storage: &StorageDefaults,
) -> Result<super::clone::flow::CloneObserved> {
    let class = match storage {
        StorageDefaults::Cluster { class, .. } => class.clone(),
        _ => target.and_then(|t| t.spec.as_ref()?.storage_class_name.clone()),
    }
    .or_else(|| {
        dv.spec
            .pvc
            .as_ref()
            .and_then(|p| p.storage_class_name.clone())
    });
    let mut o =
        super::clone::observe::observe(&ctx.client, dv, c, target, class.as_deref()).await?;
    if let Some(UploadTls::Issued { namespace }) = &ctx.live.base.upload_tls
        && upload_pod.is_some()
        && let Some(uid) = target.and_then(|t| t.metadata.uid.as_deref())
    {
        let dv_ns = dv.namespace().unwrap_or_default();
        let src_ns = c.namespace_or(&dv_ns);
        let meta = super::clone::objects::client_secret_meta(&pod::Workload::of(dv), src_ns, uid);
        o.client_secret = Some(
            super::clone::observe::ensure_client_secret(&ctx.client, meta, namespace, &ctx.manager)
                .await?,
        );
    }
    Ok(o)
}

/// What completes a `spec.storage` claim: the PVC's own class and modes once it exists;
/// before, the class (the DataVolume's if it exists, else the default class) and, when a mode is
/// missing, its StorageProfile's status.
async fn storage_defaults(
    dv: &DataVolume,
    pvc: Option<&PersistentVolumeClaim>,
    ctx: &Context,
) -> Result<StorageDefaults> {
    let Some(st) = &dv.spec.storage else {
        return Ok(StorageDefaults::Builtin);
    };
    if let Some(spec) = pvc.and_then(|p| p.spec.as_ref()) {
        return Ok(StorageDefaults::Existing {
            class: spec.storage_class_name.clone(),
            access_modes: spec.access_modes.clone().unwrap_or_default(),
            volume_mode: spec.volume_mode.clone(),
        });
    }
    let class = match &st.storage_class_name {
        Some(name) => ctx.classes.get(name).await?.map(|_| name.clone()),
        None => default_class_of(dv, ctx)
            .await?
            .and_then(|c| c.metadata.name),
    };
    let profile = match &class {
        Some(name) if st.access_modes.is_empty() || st.volume_mode.is_none() => {
            let profiles: Api<StorageProfile> = Api::all(ctx.client.clone());
            let store = ctx.stores.get().map(|(_, profiles)| profiles);
            informers::read(store, &profiles, None, name)
                .await?
                .and_then(|p| p.status)
        }
        _ => None,
    };
    Ok(StorageDefaults::Cluster { class, profile })
}

/// The default class for a DataVolume naming none (the virt default for disk images, else the
/// cluster's), from a list: its annotations may change.
async fn default_class_of(dv: &DataVolume, ctx: &Context) -> Result<Option<StorageClass>> {
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    let all = classes.list(&Default::default()).await?.items;
    let disk_image = dv.spec.content_type != Some(ContentType::Archive);
    Ok(default_class(&all, disk_image).cloned())
}

/// Whether the StorageClass the DataVolume's PVC will have is a CSI driver's: a CSIDriver
/// object names its provisioner (CDI's test for using populators). Skipped when the
/// DataVolume's annotation decides.
async fn csi_class(dv: &DataVolume, ctx: &Context) -> Result<bool> {
    if dv.annotations().contains_key(populated::ANN_USE_POPULATOR) {
        return Ok(false);
    }
    let named = dv
        .spec
        .pvc
        .as_ref()
        .and_then(|p| p.storage_class_name.clone())
        .or_else(|| dv.spec.storage.as_ref()?.storage_class_name.clone());
    let class = match named {
        Some(name) => ctx.classes.get(&name).await?,
        None => default_class_of(dv, ctx).await?,
    };
    has_csi_driver(class, ctx).await
}

/// Whether a CSIDriver names `class`'s provisioner (false without a class).
async fn has_csi_driver(class: Option<StorageClass>, ctx: &Context) -> Result<bool> {
    let Some(class) = class else {
        return Ok(false);
    };
    Ok(ctx.drivers.get(&class.provisioner).await?.is_some())
}

/// Copies the import proxy's trusted CA ConfigMap from Quarry's namespace next to the
/// importer pod (CDI's `import-proxy-cm-<pvc>`), owned by the DataVolume.
pub(crate) async fn copy_proxy_ca(
    client: &Client,
    manager: &str,
    w: &pod::Workload,
    ca: &str,
) -> Result<()> {
    let source: Api<ConfigMap> = Api::namespaced(client.clone(), names::NAMESPACE);
    let found = source.get(ca).await?;
    let ns = w.namespace.clone().unwrap_or_default();
    let copy = ConfigMap {
        metadata: ObjectMeta {
            name: Some(pod::import_proxy_config_map(&w.name)),
            namespace: Some(ns.clone()),
            labels: Some(w.labels.clone()),
            owner_references: w.owner.clone().map(|o| vec![o]),
            ..Default::default()
        },
        data: found.data,
        binary_data: found.binary_data,
        immutable: None,
    };
    let target: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    kubeops::create(&target, &copy, manager).await
}

/// API answers that refuse an object as written (admission, Pod Security, quota, validation):
/// retrying at once cannot help.
fn is_refusal(code: u16) -> bool {
    matches!(code, 400 | 403 | 422)
}

/// Records an event on the DataVolume; best effort (a lost event must not stall the volume).
async fn publish(ctx: &Context, dv: &DataVolume, e: Event) {
    if !ctx.news(dv.metadata.uid.as_deref().unwrap_or_default(), &e) {
        return;
    }
    kubeops::publish_event(
        &ctx.client,
        &dv.object_ref(&()),
        e.warning,
        &e.reason,
        &e.message,
        &ctx.manager,
    )
    .await;
}

fn pod_running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Keys of the CA ConfigMap and of the header Secrets, so the pod can name each file and key.
pub(crate) async fn source_refs(
    client: &Client,
    cfg: &Config,
    src: &ImportSource,
    ns: &str,
) -> Result<SourceRefs> {
    let mut refs = SourceRefs::default();
    let keys = |map: ConfigMap| -> Vec<String> {
        let data = map.data.into_iter().flat_map(|d| d.into_keys());
        data.chain(map.binary_data.into_iter().flat_map(|d| d.into_keys()))
            .collect()
    };
    if let Some(cm) = &src.cert_config_map {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        refs.ca_keys = keys(api.get(cm).await?);
    }
    if let Some(ca) = pod::proxy_ca(cfg) {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), names::NAMESPACE);
        refs.proxy_ca_keys = keys(api.get(ca).await?);
    }
    for secret in &src.secret_extra_headers {
        let api: Api<Secret> = Api::namespaced(client.clone(), ns);
        let s = api.get(secret).await?;
        let keys = s.data.iter().flat_map(|d| d.keys().cloned()).collect();
        refs.header_secrets.push((secret.clone(), keys));
    }
    Ok(refs)
}

/// The running importer's progress, from its metrics endpoint (None when it cannot be read).
async fn scrape_progress(dv: &DataVolume, pod: &Pod, ctx: &Context) -> Option<f64> {
    let owner = dv.metadata.uid.as_deref().unwrap_or_default();
    scrape(ctx.metrics_client(), pod, IMPORT_PROGRESS, owner).await
}

/// The client importer metrics endpoints are read with (short timeout: a scrape is skipped,
/// never waited for).
pub(crate) fn metrics_http() -> reqwest::Client {
    netkit::install_tls_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap_or_default()
}

/// Where importer metrics are read: the client and the pods' metrics port.
#[derive(Clone, Copy)]
pub(crate) struct MetricsClient<'a> {
    pub http: &'a reqwest::Client,
    pub port: u16,
}

/// Reads `metric{ownerUID}` from the metrics endpoint of `pod` (None when it cannot be read).
pub(crate) async fn scrape(
    m: MetricsClient<'_>,
    pod: &Pod,
    metric: &str,
    owner_uid: &str,
) -> Option<f64> {
    let ip = pod.status.as_ref()?.pod_ip.as_ref()?;
    let url = format!("http://{ip}:{}/metrics", m.port);
    fetch_progress(m.http, &url, metric, owner_uid).await
}

/// Reads `metric{ownerUID}` from a metrics URL.
async fn fetch_progress(
    http: &reqwest::Client,
    url: &str,
    metric: &str,
    owner_uid: &str,
) -> Option<f64> {
    let resp = http.get(url).send().await.ok()?.error_for_status().ok()?;
    parse_counter(&resp.text().await.ok()?, metric, owner_uid)
}

/// Deletion: the pods and Service go; the PVC too unless the DataVolume asks to retain it.
async fn cleanup(dv: &DataVolume, ctx: &Context) -> Result<()> {
    let ns = dv.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    kubeops::delete(&pods, &pod::importer_pod_name(name(dv))).await?;
    kubeops::delete(&pods, &pod::upload_name(name(dv))).await?;
    kubeops::delete(&pods, &super::clone::objects::resize_pod_name(dv)).await?;
    kubeops::delete(&services, &pod::upload_name(name(dv))).await?;
    // A sourceRef's DataSource as it is now (its namespace is what matters here).
    let sref = match &dv.spec.source_ref {
        Some(r) => Some(source_ref(&ctx.client, &ns, r).await?),
        None => None,
    };
    if let Some(Source::Clone(c)) = resolved_source(dv, sref.as_ref()) {
        let snapshots: Api<VolumeSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
        // The snapshot API may not be served: nothing to delete then.
        if let Err(e) = kubeops::delete(&snapshots, &temp_snapshot_name(dv)).await {
            tracing::debug!("temporary snapshot: {e}");
        }
        // What a host-assisted copy made in the source's namespace (no owner reference
        // crosses namespaces): the clone source pod, its certificate, a snapshot's restore.
        let src_ns = c.namespace_or(&ns).to_string();
        let src_pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &src_ns);
        kubeops::delete(&src_pvcs, &super::clone::objects::restore_name(dv)).await?;
        if let Some(uid) = kubeops::get(&pvcs, name(dv)).await?.and_then(|p| p.uid()) {
            let source_pod = super::clone::objects::source_pod_name(&uid);
            let src_pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &src_ns);
            kubeops::delete(&src_pods, &source_pod).await?;
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &src_ns);
            kubeops::delete(&secrets, &source_pod).await?;
        }
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    kubeops::delete(&config_maps, &pod::import_proxy_config_map(name(dv))).await?;
    if !super::pvc::retained(dv) {
        kubeops::delete(&pvcs, name(dv)).await?;
    }
    Ok(())
}

/// The DataVolumes that may wait for StorageProfile `profile`: those with `spec.storage` naming
/// that class, or none, and no phase past Pending yet.
fn waiting_for_profile(dvs: &[Arc<DataVolume>], profile: &str) -> Vec<ObjectRef<DataVolume>> {
    dvs.iter()
        .filter(|dv| {
            let class = dv
                .spec
                .storage
                .as_ref()
                .map(|s| s.storage_class_name.as_deref());
            let pending = dv
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .is_none_or(|p| p == api::Phase::Pending);
            pending && (class == Some(None) || class == Some(Some(profile)))
        })
        .map(|dv| ObjectRef::from_obj(dv.as_ref()))
        .collect()
}

/// The DataVolumes whose `spec.sourceRef` names the DataSource `ds` (they wait for it).
fn referring_to(dvs: &[Arc<DataVolume>], ds: &DataSource) -> Vec<ObjectRef<DataVolume>> {
    let ds_ns = ds.namespace().unwrap_or_default();
    dvs.iter()
        .filter(|dv| {
            dv.spec.source.is_none()
                && dv.spec.source_ref.as_ref().is_some_and(|r| {
                    let ns = r.namespace.clone().or_else(|| dv.namespace());
                    r.kind == "DataSource"
                        && r.name == ds.name_any()
                        && ns.as_deref() == Some(&ds_ns)
                })
        })
        .map(|dv| ObjectRef::from_obj(dv.as_ref()))
        .collect()
}

/// The DataVolume a PVC belongs to, from CDI's ownedByDataVolume annotation, else the one of
/// its namespace it is populated for (CDI's populatedFor: a PVC made before its DataVolume).
fn owner_of(pvc: &PersistentVolumeClaim) -> Option<ObjectRef<DataVolume>> {
    let annotations = pvc.annotations();
    if let Some((ns, name)) = annotations
        .get(ANN_OWNED_BY)
        .and_then(|k| k.split_once('/'))
    {
        return Some(ObjectRef::new(name).within(ns));
    }
    let name = annotations.get(super::adopt::ANN_POPULATED_FOR)?;
    Some(ObjectRef::new(name).within(&pvc.namespace()?))
}

/// A hash of the finalizers other than ours (a predicate): adding ours is no news.
fn foreign_finalizers(dv: &DataVolume) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    dv.finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .for_each(|f| f.hash(&mut hasher));
    Some(hasher.finish())
}

/// Runs the DataVolume reconciler until the process is stopped, over every namespace
/// (`namespace` None) or one, with PVC and pod watches of its own.
/// [`operators::process::cdi`] runs it with its neighbours, sharing them ([`run_fed`]).
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>) {
    let client = ctx.client.clone();
    Informers::alone(&client, namespace, |feed| run_fed(ctx, namespace, feed)).await
}

/// [`run`] on shared PVC and pod watches.
pub async fn run_fed(ctx: Arc<Context>, namespace: Option<&str>, feed: Feed) {
    use kubeops::scoped as api;
    let client = ctx.client.clone();
    let (profiles_reader, profiles_writer) = reflector::store();
    let _ = ctx.stores.set((feed.stores, profiles_reader));
    let dvs: Api<DataVolume> = api(&client, namespace);
    let (reader, writer) = reflector::store();
    // Status-only changes and our own finalizer (our own writes) do not pass: the spec
    // (generation, also bumped by deletion) and other finalizers do.
    let trigger = watcher(dvs, watcher::Config::default())
        .default_backoff()
        .modify(|dv: &mut DataVolume| dv.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation.combine(foreign_finalizers),
            Default::default(),
        );
    // A DataVolume waiting for its class's StorageProfile (no PVC yet) tries again as soon as
    // a profile changes (as CDI's watch of StorageProfiles).
    let waiting = reader.clone();
    let profiles = watcher(
        Api::<StorageProfile>::all(client.clone()),
        Default::default(),
    )
    .default_backoff()
    .reflect(profiles_writer)
    .touched_objects();
    // A DataVolume whose sourceRef waits is looked at again when its DataSource changes (in any
    // namespace: a golden-image namespace usually).
    let referring = reader.clone();
    let results = Controller::for_stream(trigger, reader)
        .with_config(kubeops::controller_config())
        .watches_stream(profiles, move |p: StorageProfile| {
            waiting_for_profile(&waiting.state(), &p.name_any())
        })
        .watches(
            Api::<DataSource>::all(client.clone()),
            watcher::Config::default(),
            move |ds| referring_to(&referring.state(), &ds),
        )
        .owns_shared_stream(ctx.echoes.filter(feed.pod_changes))
        .owns(
            api::<Service>(&client, namespace),
            watcher::Config::default(),
        )
        .watches_shared_stream(ctx.echoes.filter(feed.claim_changes), |pvc| owner_of(&pvc))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx);
    kubeops::drain(results).await;
}

#[cfg(test)]
mod tests {
    //! Reconciles against the real API server are in `tests/kube/`; here only what needs none.

    use std::collections::BTreeMap;

    use http::Method;
    use k8s_openapi::api::core::v1::VolumeResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use api::DataVolumeSpec;
    use api::datavolume::{DataVolumeSource, SourceHttp, StorageSpec};
    use kubekit::ErrorKind;
    use kubekit::mockapi::{self};

    const NS: &str = "/api/v1/namespaces/vms";

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
        let p = fetch_progress(&ctx.http, &url, IMPORT_PROGRESS, "uid-1").await;
        assert_eq!(
            p.map(crate::datavolume::status::format_progress).as_deref(),
            Some("45.50%")
        );
        let other = fetch_progress(&ctx.http, &url, IMPORT_PROGRESS, "someone-else").await;
        assert_eq!(other, None);
        let down = "http://127.0.0.1:1/metrics";
        assert_eq!(
            fetch_progress(&ctx.http, down, IMPORT_PROGRESS, "uid-1").await,
            None
        );
    }

    #[tokio::test]
    async fn clone_progress_is_read_from_the_clone_sources_metrics_server() {
        use std::sync::atomic::Ordering::Relaxed;
        let progress = Arc::new(importer::progress::Progress::default());
        progress.source_length.store(4 << 20, Relaxed);
        progress.source_read.store(3 << 20, Relaxed);
        let addr = importer::progress::serve_progress(
            "127.0.0.1:0".parse().unwrap(),
            importer::progress::ProgressMetric::Clone,
            "target-uid".into(),
            progress,
        )
        .unwrap();
        let ctx = context(mockapi::pair().0);
        let url = format!("http://{addr}/metrics");
        let p = fetch_progress(&ctx.http, &url, CLONE_PROGRESS, "target-uid").await;
        assert_eq!(p, Some(75.0));
        // Not an import's counter.
        assert_eq!(
            fetch_progress(&ctx.http, &url, IMPORT_PROGRESS, "target-uid").await,
            None
        );
    }

    #[test]
    fn only_pending_storage_datavolumes_of_the_class_or_of_none_wait_for_a_profile() {
        let with = |class: Option<&str>, phase: Option<api::Phase>, name: &str| {
            let mut d = dv();
            d.metadata.name = Some(name.into());
            d.spec.storage.as_mut().unwrap().storage_class_name = class.map(String::from);
            d.status = phase.map(|p| api::DataVolumeStatus {
                phase: Some(p),
                ..Default::default()
            });
            Arc::new(d)
        };
        let mut pvc_form = dv();
        pvc_form.metadata.name = Some("pvc-form".into());
        pvc_form.spec.storage = None;
        let dvs = [
            with(Some("local"), None, "new"),
            with(Some("local"), Some(api::Phase::Pending), "pending"),
            with(None, None, "default-class"),
            with(Some("other"), None, "other-class"),
            with(Some("local"), Some(api::Phase::ImportScheduled), "started"),
            Arc::new(pvc_form),
        ];
        let names: Vec<_> = waiting_for_profile(&dvs, "local")
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["new", "pending", "default-class"]);
    }

    #[test]
    fn a_pvc_maps_to_its_owner_or_to_the_datavolume_it_is_populated_for() {
        let pvc = |annotations: &[(&str, &str)]| {
            let mut p = PersistentVolumeClaim::default();
            p.metadata.namespace = Some("vms".into());
            p.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            p
        };
        let to = |r: Option<ObjectRef<DataVolume>>| r.map(|r| (r.namespace, r.name));
        let owned = pvc(&[(ANN_OWNED_BY, "other/fedora")]);
        assert_eq!(
            to(owner_of(&owned)),
            Some((Some("other".into()), "fedora".into()))
        );
        // Made before its DataVolume: the one of its namespace it is populated for.
        let prepared = pvc(&[(super::super::adopt::ANN_POPULATED_FOR, "golden")]);
        assert_eq!(
            to(owner_of(&prepared)),
            Some((Some("vms".into()), "golden".into()))
        );
        assert_eq!(to(owner_of(&pvc(&[]))), None);
    }

    #[tokio::test]
    async fn api_errors_surface_as_transient_errors() {
        let (client, mut api) = mockapi::pair();
        let ctx = context(client);
        let task = tokio::spawn(reconcile(Arc::new(dv()), ctx.clone()));
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
