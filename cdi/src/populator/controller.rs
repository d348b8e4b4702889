//! The populator controller on kube-runtime: it watches PVCs (a target's PVC', the pods PVC'
//! owns and the populator sources map back to the target), reads what [`decide`] needs and
//! carries out its actions. It registers the sources' kinds as `VolumePopulator`s where the
//! volume data source validator's CRD is installed.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tracing::{Instrument, info_span};

use super::decide::{
    Action, CloneOrigin, Decision, Observed, PopulationSource, decide, needs_node, workload,
};
use super::placement::{Candidates, candidates};
use super::{ANN_POPULATOR_KIND, prime_name, source_ref};
use crate::datavolume::classes::StorageClasses;
use crate::datavolume::clone::objects::source_pod_name;
use crate::datavolume::clone::observe::{ensure_client_secret, snapshot_node};
use crate::datavolume::controller::{
    MetricsClient, copy_proxy_ca, metrics_http, scrape, source_refs,
};
use crate::datavolume::decide::{Announced, pod_phase};
use crate::datavolume::pod::{self, POD_PORT, SourceRefs};
use crate::datavolume::source::{self, Source};
use crate::datavolume::status::IMPORT_PROGRESS;
use crate::datavolume::upload_secret;
use crate::informers::{self, Feed, Informers, Stores};
use crate::settings::LiveSettings;
use api::populator::{self, VolumeCloneSource, VolumeImportSource, VolumeUploadSource};
use api::snapshot::VolumeSnapshot;
use kubekit::error::{Error, Result};
use kubekit::informer::{Echoes, Made, Written};
use kubekit::kubeops;
use kubekit::metrics::Metrics;

/// Name in metrics, events, the field manager and the user agent.
pub const CONTROLLER: &str = "populator";

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The settings in force.
    pub live: Arc<LiveSettings>,
    /// Reconcile metrics.
    pub metrics: Arc<Metrics>,
    /// Client for importer metrics endpoints.
    pub http: reqwest::Client,
    /// Field manager of every write.
    pub manager: String,
    /// StorageClasses, read once in a while.
    classes: StorageClasses,
    /// Nodes found for PVC's, for a few seconds.
    candidates: Candidates,
    /// Targets as our annotation writes left them, until the store has them.
    written: Written<PersistentVolumeClaim>,
    /// The PVC's and pods made here lately (a store miss of anything else of ours is absence).
    made: Made,
    /// The versions of PVC's, pods and targets our writes made: their events are no news.
    echoes: Arc<Echoes>,
    /// The shared PVC and pod stores and the VolumeImportSources, once [`run`] watches.
    stores: OnceLock<(Stores, Store<VolumeImportSource>)>,
    /// The last event published, by target UID.
    announced: Announced,
}

impl Context {
    /// A context for `client` reading the settings `live`.
    pub fn new(client: Client, live: Arc<LiveSettings>, metrics: Arc<Metrics>) -> Self {
        Context {
            classes: StorageClasses::new(client.clone()),
            stores: OnceLock::new(),
            written: Written::default(),
            made: Made::default(),
            echoes: Arc::default(),
            candidates: Candidates::default(),
            client,
            live,
            metrics,
            http: metrics_http(),
            manager: kubeops::manager(CONTROLLER),
            announced: Announced::default(),
        }
    }
}

/// Reconciles one PVC: a target, or a PVC' (which stands for its target).
pub async fn reconcile(pvc: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Requeue> {
    let ns = pvc.namespace().unwrap_or_default();
    let span =
        info_span!("reconcile", controller = CONTROLLER, namespace = %ns, name = %pvc.name_any());
    async move {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        let target = match target_of_prime(&pvc) {
            Some(owner) => match read_claim(&ctx, &pvcs, &ns, &owner.name).await? {
                Some(t) if t.metadata.uid.as_deref() == Some(owner.uid.as_str()) => Arc::new(t),
                // The target is gone: PVC' and its pod go now (the garbage collector would wait
                // for a pod that still uses PVC', which PVC''s deletion protection waits for).
                _ => {
                    orphaned(&ctx, &ns, &pvc, &owner.name).await?;
                    return Ok(Requeue::await_change());
                }
            },
            None => pvc,
        };
        let target = ctx.written.newest(target);
        let Some((kind, source_name)) = source_ref(&target) else {
            return Ok(Requeue::await_change());
        };
        if target.metadata.deletion_timestamp.is_some() {
            ctx.written.forget(&target.uid().unwrap_or_default());
            if let Some(prime) = read_prime(&ctx, &pvcs, &ns, &target).await? {
                orphaned(&ctx, &ns, &prime, &target.name_any()).await?;
            }
            return Ok(Requeue::await_change());
        }
        let _measure = ctx.metrics.reconcile(CONTROLLER);
        apply(&target, kind, source_name, &ctx).await
    }
    .instrument(span)
    .await
}

/// The target a PVC' stands for (its controller owner, a PVC), None for any other PVC.
fn target_of_prime(pvc: &PersistentVolumeClaim) -> Option<&OwnerReference> {
    pvc.annotations().get(ANN_POPULATOR_KIND)?;
    let owner = pvc
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))?;
    (owner.kind == "PersistentVolumeClaim").then_some(owner)
}

/// Deletes the pods of a PVC' whose target is gone (or going), and PVC' itself.
async fn orphaned(
    ctx: &Context,
    ns: &str,
    prime: &PersistentVolumeClaim,
    target: &str,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    kubeops::delete(&pods, &pod::importer_pod_name(&prime.name_any())).await?;
    let kind = prime
        .annotations()
        .get(ANN_POPULATOR_KIND)
        .map(String::as_str);
    if kind != Some(populator::IMPORT_KIND) {
        // An upload's or a host-assisted clone's upload server (its clone source pod is owned by
        // PVC' and goes with it).
        kubeops::delete(&pods, &pod::upload_name(target)).await?;
    }
    if prime.metadata.deletion_timestamp.is_none() {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        kubeops::delete(&pvcs, &prime.name_any()).await?;
    }
    Ok(())
}

/// The target's PVC', which only this controller makes.
async fn read_prime(
    ctx: &Context,
    pvcs: &Api<PersistentVolumeClaim>,
    ns: &str,
    target: &PersistentVolumeClaim,
) -> Result<Option<PersistentVolumeClaim>> {
    let store = ctx.stores.get().map(|(s, _)| &s.claims);
    informers::read_ours(store, pvcs, ns, &prime_name(target), &ctx.made).await
}

/// A PVC, from the shared store when it holds it.
async fn read_claim(
    ctx: &Context,
    pvcs: &Api<PersistentVolumeClaim>,
    ns: &str,
    name: &str,
) -> Result<Option<PersistentVolumeClaim>> {
    let store = ctx.stores.get().map(|(s, _)| &s.claims);
    informers::read(store, pvcs, Some(ns), name).await
}

/// Retries failed reconciles.
pub fn error_policy(pvc: Arc<PersistentVolumeClaim>, err: &Error, ctx: Arc<Context>) -> Requeue {
    kubeops::requeue_after(
        CONTROLLER,
        &pvc.name_any(),
        err,
        &ctx.metrics,
        Duration::from_secs(300),
    )
}

/// Reads the source a target names (None: missing, or meant for another claim).
async fn population_source(
    ctx: &Context,
    ns: &str,
    kind: &str,
    name: &str,
    target: &str,
) -> Result<Option<PopulationSource>> {
    let client = &ctx.client;
    Ok(if kind == populator::IMPORT_KIND {
        let api: Api<VolumeImportSource> = Api::namespaced(client.clone(), ns);
        let store = ctx.stores.get().map(|(_, imports)| imports);
        informers::read(store, &api, Some(ns), name)
            .await?
            .filter(|s| {
                s.spec
                    .target_claim
                    .as_deref()
                    .is_none_or(|c| c.is_empty() || c == target)
            })
            .map(|s| PopulationSource::Import(Box::new(s.spec)))
    } else if kind == populator::UPLOAD_KIND {
        let api: Api<VolumeUploadSource> = Api::namespaced(client.clone(), ns);
        kubeops::get(&api, name)
            .await?
            .map(|s| PopulationSource::Upload(s.spec))
    } else {
        let api: Api<VolumeCloneSource> = Api::namespaced(client.clone(), ns);
        kubeops::get(&api, name)
            .await?
            .map(|s| PopulationSource::Clone(s.spec))
    })
}

async fn apply(
    target: &PersistentVolumeClaim,
    kind: &str,
    source_name: &str,
    ctx: &Context,
) -> Result<Requeue> {
    let ns = target.namespace().unwrap_or_default();
    let client = &ctx.client;
    let cfg = ctx.live.get();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let name = target.name_any();

    let src = population_source(ctx, &ns, kind, source_name, &name).await?;
    let class = match target
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
    {
        Some(c) => ctx.classes.get(c).await?,
        None => None,
    };
    let prime = read_prime(ctx, &pvcs, &ns, target).await?;
    let import = kind == populator::IMPORT_KIND;
    let pod_store = ctx.stores.get().map(|(s, _)| &s.pods);
    // Named as [`workload`] names them: an importer for PVC', an upload server (an upload's, a
    // host-assisted clone's) for the target.
    let pod = match &prime {
        Some(p) if import => {
            let pod_name = pod::importer_pod_name(&p.name_any());
            informers::read_ours(pod_store, &pods, &ns, &pod_name, &ctx.made).await?
        }
        Some(_) => {
            let pod_name = pod::upload_name(&name);
            informers::read_ours(pod_store, &pods, &ns, &pod_name, &ctx.made).await?
        }
        None => None,
    };
    let service = !import
        && prime.is_some()
        && kubeops::get(&services, &pod::upload_name(&name))
            .await?
            .is_some();
    let source_pod = match &pod {
        Some(_) if kind == populator::CLONE_KIND => {
            let uid = target.uid().unwrap_or_default();
            kubeops::get(&pods, &source_pod_name(&uid)).await?
        }
        _ => None,
    };
    let import_from = src.as_ref().and_then(import_source);
    let refs = match (&import_from, &prime, &pod) {
        (Some(i), Some(_), None) => source_refs(client, &cfg, i, &ns).await?,
        _ => SourceRefs::default(),
    };
    // Progress: the importer's, or a host-assisted clone's source pod's (CDI's cloner serves it
    // as an importer does).
    let progress = match if import { &pod } else { &source_pod } {
        Some(p) if pod_phase(p) == "Running" => {
            let m = MetricsClient {
                http: &ctx.http,
                port: POD_PORT as u16,
            };
            scrape(m, p, IMPORT_PROGRESS, &target.uid().unwrap_or_default()).await
        }
        _ => None,
    };
    // A clone's source: the PVC, or the snapshot and the node of the PVC it was taken of.
    let (origin_pvc, origin_snapshot, snapshot_node) = match &src {
        Some(PopulationSource::Clone(c)) if c.source.kind == "PersistentVolumeClaim" => {
            (kubeops::get(&pvcs, &c.source.name).await?, None, None)
        }
        Some(PopulationSource::Clone(c)) if c.source.kind == "VolumeSnapshot" => {
            let api: Api<VolumeSnapshot> = Api::namespaced(client.clone(), &ns);
            let snap = kubeops::get(&api, &c.source.name).await?;
            let node = match &snap {
                Some(s) => snapshot_node(client, &ns, s).await?,
                None => None,
            };
            (None, snap, node)
        }
        _ => (None, None, None),
    };
    let origin = match (&origin_pvc, &origin_snapshot) {
        (Some(p), _) => Some(CloneOrigin::Pvc(p)),
        (_, Some(s)) => Some(CloneOrigin::Snapshot(s, snapshot_node.as_deref())),
        _ => None,
    };
    // PVC''s volume: read only when a decision asks for it.
    let volume: Option<PersistentVolume>;
    let mut observed = Observed {
        target,
        source: src.as_ref(),
        class: class.as_ref(),
        prime: prime.as_ref(),
        pod: pod.as_ref(),
        source_pod: source_pod.as_ref(),
        service,
        volume: None,
        origin,
        progress,
        refs,
        nodes: &[],
        now: Timestamp::now(),
    };
    // Read only when PVC' is about to be made with no consumer's node.
    let nodes = match (&prime, &class) {
        (None, Some(c)) if needs_node(&observed) => {
            let placement = &cfg.workload;
            match ctx.candidates.get(&c.provisioner, placement) {
                Some(names) => names,
                None => {
                    let all: Api<Node> = Api::all(client.clone());
                    let csi: Api<CSINode> = Api::all(client.clone());
                    // From the API server's watch cache: a placement hint, not a quorum read.
                    let cached = ListParams::default().match_any();
                    let names = candidates(
                        &all.list(&cached).await?.items,
                        &csi.list(&cached).await?.items,
                        &c.provisioner,
                        placement,
                    );
                    ctx.candidates.put(&c.provisioner, placement, &names);
                    names
                }
            }
        }
        _ => Vec::new(),
    };
    observed.nodes = &nodes;
    let mut decision = decide(&observed, &cfg);
    if decision.needs_volume
        && let Some(name) = prime
            .as_ref()
            .and_then(|p| p.spec.as_ref()?.volume_name.as_deref())
            .filter(|v| !v.is_empty())
    {
        volume = kubeops::get(&volumes, name).await?;
        observed.volume = volume.as_ref();
        decision = decide(&observed, &cfg);
    }
    let at = Place {
        ctx,
        target,
        src: src.as_ref(),
        import,
        prime: prime.as_ref(),
    };
    let mut done = Done::default();
    at.carry_out(decision, &mut done).await?;
    // What is made here is decided on again at once, as its watch event would have it decided
    // (that event is then no news: [`Echoes`]). PVC' just made: its pod may start in the same
    // reconcile (the pod needs PVC''s UID), with one annotation write for both.
    let made_prime = done.prime.take();
    let at = match &made_prime {
        Some(made) => {
            observed.prime = Some(made);
            observed.refs = match &import_from {
                Some(i) => source_refs(client, &cfg, i, &ns).await?,
                None => SourceRefs::default(),
            };
            let decision = decide(&observed, &cfg);
            let at = Place {
                prime: Some(made),
                ..at
            };
            at.carry_out(decision, &mut done).await?;
            at
        }
        None => at,
    };
    // The pod just made: following it as created (a host-assisted clone's source pod starts
    // with its upload server).
    let made_pod = done.pod.take();
    if let Some(made) = &made_pod {
        observed.pod = Some(made);
        observed.service |= done.service;
        let decision = decide(&observed, &cfg);
        at.carry_out(decision, &mut done).await?;
    }
    at.flush(&mut done).await?;
    Ok(match done.requeue {
        Some(d) => Requeue::requeue(d),
        None => Requeue::await_change(),
    })
}

/// What one reconcile acts on.
#[derive(Clone, Copy)]
struct Place<'a> {
    ctx: &'a Context,
    target: &'a PersistentVolumeClaim,
    src: Option<&'a PopulationSource>,
    import: bool,
    prime: Option<&'a PersistentVolumeClaim>,
}

/// What carrying out a decision left to do or made.
#[derive(Default)]
struct Done {
    /// PVC' as created.
    prime: Option<PersistentVolumeClaim>,
    /// The importer or upload server pod as created.
    pod: Option<Pod>,
    /// Whether the upload Service was made.
    service: bool,
    /// Annotations of the target to write (once, at the end).
    annotations: BTreeMap<String, Option<String>>,
    requeue: Option<Duration>,
}

impl Place<'_> {
    async fn carry_out(&self, mut decision: Decision, done: &mut Done) -> Result<()> {
        let Place {
            ctx,
            target,
            src,
            import,
            prime,
        } = *self;
        let client = &ctx.client;
        let cfg = ctx.live.get();
        let ns = target.namespace().unwrap_or_default();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        for action in std::mem::take(&mut decision.actions) {
            match action {
                Action::CreatePrime(p) => {
                    let made = kubeops::create_new(&pvcs, &p, &ctx.manager).await?;
                    done.prime = ctx.echoes.created(made);
                    ctx.made.record(&ns, &p.name_any());
                }
                Action::CreatePod(p) => {
                    if let (Some(ca), Some(prime), Some(src)) = (pod::proxy_ca(&cfg), prime, src)
                        && import
                    {
                        let w = workload(target, prime, src);
                        copy_proxy_ca(client, &ctx.manager, &w, ca).await?;
                    }
                    let made = kubeops::create_new(&pods, &p, &ctx.manager).await?;
                    done.pod = ctx.echoes.created(made);
                    ctx.made.record(&ns, &p.name_any());
                }
                Action::CreateService(s) => {
                    kubeops::create(&services, &s, &ctx.manager).await?;
                    done.service = true;
                }
                Action::CreateSourcePod(p) => kubeops::create(&pods, &p, &ctx.manager).await?,
                Action::EnsureClientSecret { namespace, secret } => {
                    ensure_client_secret(client, *secret, &namespace, &ctx.manager).await?;
                }
                Action::Annotate(set) => done.annotations.extend(set),
                Action::Rebind {
                    volume,
                    resource_version,
                    claim_ref,
                } => {
                    // The resourceVersion makes it conditional: a volume that changed since it was
                    // read (still naming PVC' then) is read again, never taken from another claim.
                    let patch = serde_json::json!({
                        "metadata": {"resourceVersion": resource_version},
                        "spec": {"claimRef": claim_ref},
                    });
                    let params = PatchParams {
                        field_manager: Some(ctx.manager.clone()),
                        ..Default::default()
                    };
                    volumes
                        .patch(&volume, &params, &Patch::Merge(&patch))
                        .await?;
                }
                Action::EnsureUploadSecret { namespace } => {
                    let (Some(prime), Some(src)) = (prime, src) else {
                        continue;
                    };
                    let w = workload(target, prime, src);
                    let renewal =
                        upload_secret::ensure(client, &w, &namespace, &ctx.manager).await?;
                    done.requeue = Some(done.requeue.map_or(renewal, |r| r.min(renewal)));
                }
                Action::Event(e) => {
                    if ctx.announced.news(&target.uid().unwrap_or_default(), &e) {
                        kubeops::publish_event(
                            client,
                            &target.object_ref(&()),
                            e.warning,
                            &e.reason,
                            &e.message,
                            &ctx.manager,
                        )
                        .await;
                    }
                }
                // A deletion triggers a reconcile, which must find the annotations (the
                // restart count) written.
                Action::DeletePod(n) => {
                    self.flush(done).await?;
                    kubeops::delete(&pods, &n).await?
                }
                Action::DeleteService(n) => {
                    self.flush(done).await?;
                    kubeops::delete(&services, &n).await?
                }
                Action::DeletePrime(n) => {
                    self.flush(done).await?;
                    kubeops::delete(&pvcs, &n).await?
                }
            }
        }
        if let Some(r) = decision.requeue {
            done.requeue = Some(done.requeue.map_or(r, |d| d.min(r)));
        }
        Ok(())
    }

    /// Writes the annotations collected so far.
    async fn flush(&self, done: &mut Done) -> Result<()> {
        if done.annotations.is_empty() {
            return Ok(());
        }
        let ns = self.target.namespace().unwrap_or_default();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), &ns);
        let set = std::mem::take(&mut done.annotations);
        annotate(self.ctx, &pvcs, self.target, set).await
    }
}

/// The checked import of a VolumeImportSource (None: another kind, or invalid, which
/// [`decide`] reports).
fn import_source(src: &PopulationSource) -> Option<crate::datavolume::source::ImportSource> {
    match source::source(&src.as_spec()).ok()? {
        Source::Import(i) => Some(i),
        _ => None,
    }
}

/// Merges the annotations that differ into the target (a no-op write would trigger another
/// reconcile for nothing), and remembers the target as written.
async fn annotate(
    ctx: &Context,
    pvcs: &Api<PersistentVolumeClaim>,
    target: &PersistentVolumeClaim,
    set: BTreeMap<String, Option<String>>,
) -> Result<()> {
    let current = target.annotations();
    let changed: BTreeMap<_, _> = set
        .into_iter()
        .filter(|(k, v)| current.get(k) != v.as_ref())
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"annotations": changed}});
    let params = PatchParams {
        field_manager: Some(ctx.manager.clone()),
        ..Default::default()
    };
    let written = pvcs
        .patch(&target.name_any(), &params, &Patch::Merge(&patch))
        .await?;
    ctx.echoes.record(&written);
    ctx.written.record(written);
    Ok(())
}

/// The targets naming the source `name` of `kind` in `ns`.
fn referring(
    store: &Store<PersistentVolumeClaim>,
    kind: &str,
    ns: Option<String>,
    name: &str,
) -> Vec<ObjectRef<PersistentVolumeClaim>> {
    store
        .state()
        .iter()
        .filter(|p| p.namespace() == ns && source_ref(p) == Some((kind, name)))
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// Registers the three source kinds as `VolumePopulator`s where that CRD is installed (the
/// volume data source validator's); elsewhere nothing to do.
pub async fn register(client: &Client, manager: &str) -> Result<()> {
    let ar = populator::registration::api_resource();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let params = PatchParams::apply(manager).force();
    for obj in populator::registration::objects() {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match api.patch(&name, &params, &Patch::Apply(&obj)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {
                tracing::info!("no VolumePopulator CRD: the populator sources are not registered");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Runs the populator controller until the process is stopped, over every namespace
/// (`namespace` None) or one, with PVC and pod watches of its own ([`run_fed`] shares them).
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>) {
    let client = ctx.client.clone();
    Informers::alone(&client, namespace, |feed| run_fed(ctx, namespace, feed)).await
}

/// [`run`] on shared PVC and pod watches. Every reconcile is keyed by the target: a PVC''s
/// changes and its pods' are the target's (one reconcile at a time for a target, never one for
/// it and one for its PVC' at once); a PVC' without its target is reconciled as itself (to go).
pub async fn run_fed(ctx: Arc<Context>, namespace: Option<&str>, feed: Feed) {
    use kubekit::kubeops::scoped as api;
    let client = ctx.client.clone();
    if let Err(e) = register(&client, &ctx.manager).await {
        tracing::warn!(error = %e, "registering the VolumePopulators failed");
    }
    let (imports_reader, imports_writer) = reflector::store();
    let claims = feed.stores.claims.clone();
    let _ = ctx.stores.set((feed.stores, imports_reader));
    let import_changes = watcher(
        api::<VolumeImportSource>(&client, namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|s: &mut VolumeImportSource| s.managed_fields_mut().clear())
    .reflect(imports_writer)
    .touched_objects();
    let (by_claim, by_pod) = (claims.clone(), claims.clone());
    let (imports, uploads, clones) = (claims.clone(), claims.clone(), claims.clone());
    let results = Controller::for_shared_stream(futures_util::stream::pending(), claims)
        .with_config(kubeops::controller_config())
        .watches_shared_stream(ctx.echoes.filter(feed.claim_changes), move |pvc| {
            reconciled_for(&by_claim, &pvc)
        })
        .watches_shared_stream(ctx.echoes.filter(feed.pod_changes), move |pod| {
            let owner = pod
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true) && o.kind == "PersistentVolumeClaim")?;
            let pvc = by_pod.get(&ObjectRef::new(&owner.name).within(&pod.namespace()?))?;
            reconciled_for(&by_pod, &pvc)
        })
        .watches_stream(import_changes, move |s| {
            referring(
                &imports,
                populator::IMPORT_KIND,
                s.namespace(),
                &s.name_any(),
            )
        })
        .watches(
            api::<VolumeUploadSource>(&client, namespace),
            watcher::Config::default(),
            move |s| {
                referring(
                    &uploads,
                    populator::UPLOAD_KIND,
                    s.namespace(),
                    &s.name_any(),
                )
            },
        )
        .watches(
            api::<VolumeCloneSource>(&client, namespace),
            watcher::Config::default(),
            move |s| referring(&clones, populator::CLONE_KIND, s.namespace(), &s.name_any()),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx);
    kubeops::drain(results).await;
}

/// The PVC reconciled for a change of `pvc`: its target when it is a PVC' whose target is
/// there, else itself when it is a target or a PVC' left alone; none for other PVCs.
fn reconciled_for(
    claims: &Store<PersistentVolumeClaim>,
    pvc: &PersistentVolumeClaim,
) -> Option<ObjectRef<PersistentVolumeClaim>> {
    let ns = pvc.namespace()?;
    if let Some(owner) = target_of_prime(pvc) {
        let target = claims.get(&ObjectRef::new(&owner.name).within(&ns));
        return Some(match target {
            Some(t) if t.metadata.uid.as_deref() == Some(owner.uid.as_str()) => {
                ObjectRef::from_obj(t.as_ref())
            }
            _ => ObjectRef::from_obj(pvc),
        });
    }
    source_ref(pvc).map(|_| ObjectRef::from_obj(pvc))
}
