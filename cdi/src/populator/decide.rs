//! The populator's state machine as one pure function: the target PVC, its source, PVC', the
//! pod filling PVC' and PVC''s volume as observed go in; the API actions come out.
//!
//! Target pending → (WaitForFirstConsumer: a node selected, or immediate binding asked) →
//! PVC' created → its pod runs (importer, or upload server and Service) → the pod succeeded:
//! PVC''s volume is rebound to the target → the target is bound, PVC' is Lost → PVC', pod and
//! Service deleted.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod,
    Service, TypedLocalObjectReference,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

use super::{
    ANN_POD_PHASE, ANN_POD_READY, ANN_POD_RESTARTS, ANN_POPULATOR_KIND, ANN_PRIME_NAME,
    ANN_PRIORITY_CLASS, ANN_PROGRESS, ANN_RUNNING, ANN_RUNNING_MESSAGE, ANN_RUNNING_REASON,
    ANN_SELECTED_NODE, annotation, labels, prime_name,
};
use crate::datavolume::clone::flow::SHARED_TLS_REFUSED;
use crate::datavolume::clone::flow::event::{CLONE_FAILED, HOST_ASSISTED_CLONE_NOT_POSSIBLE};
use crate::datavolume::clone::objects as clone_objects;
use crate::datavolume::decide::{Event, pod_phase, pod_ready, terminated};
use crate::datavolume::pod::{self, SourceRefs, Workload};
use crate::datavolume::pvc::{Claim, VolumeMode};
use crate::datavolume::retry::classify;
use crate::datavolume::source::{self, Source};
use crate::datavolume::status::{PROGRESS_UNKNOWN, format_progress};
use crate::datavolume::{ANN_CONTENT_TYPE, ANN_IMMEDIATE_BINDING, ANN_UPLOAD_TARGET};
use crate::settings::{Config, UploadTls};
use api::datavolume::{ContentType, DataVolumeSource, DataVolumeSpec};
use api::populator::{VolumeCloneSourceSpec, VolumeImportSourceSpec, VolumeUploadSourceSpec};
use api::snapshot::VolumeSnapshot;

/// The source object a target PVC's `dataSourceRef` names.
#[derive(Debug, Clone, PartialEq)]
pub enum PopulationSource {
    /// A `VolumeImportSource`.
    Import(Box<VolumeImportSourceSpec>),
    /// A `VolumeUploadSource`.
    Upload(VolumeUploadSourceSpec),
    /// A `VolumeCloneSource`.
    Clone(VolumeCloneSourceSpec),
}

/// What a `VolumeCloneSource` names, as observed.
#[derive(Debug, Clone, Copy)]
pub enum CloneOrigin<'a> {
    /// A PVC of the target's namespace.
    Pvc(&'a PersistentVolumeClaim),
    /// A VolumeSnapshot of the target's namespace, and the node of the PVC it was taken of.
    Snapshot(&'a VolumeSnapshot, Option<&'a str>),
}

impl PopulationSource {
    fn kind(&self) -> &'static str {
        match self {
            PopulationSource::Import(_) => api::populator::IMPORT_KIND,
            PopulationSource::Upload(_) => api::populator::UPLOAD_KIND,
            PopulationSource::Clone(_) => api::populator::CLONE_KIND,
        }
    }

    fn content_type(&self) -> ContentType {
        match self {
            PopulationSource::Import(s) => s.content_type,
            PopulationSource::Upload(s) => s.content_type,
            PopulationSource::Clone(_) => None,
        }
        .unwrap_or_default()
    }

    fn preallocation(&self) -> Option<bool> {
        match self {
            PopulationSource::Import(s) => s.preallocation,
            PopulationSource::Upload(s) => s.preallocation,
            PopulationSource::Clone(s) => s.preallocation,
        }
    }

    /// The DataVolume spec with the same source, which the DataVolume's checks and pod
    /// builders take.
    pub(crate) fn as_spec(&self) -> DataVolumeSpec {
        let source = match self {
            PopulationSource::Import(s) => {
                let t = s.source.clone().unwrap_or_default();
                DataVolumeSource {
                    http: t.http,
                    s3: t.s3,
                    gcs: t.gcs,
                    registry: t.registry,
                    blank: t.blank,
                    imageio: t.imageio,
                    vddk: t.vddk,
                    ..Default::default()
                }
            }
            PopulationSource::Upload(_) => DataVolumeSource {
                upload: Some(Default::default()),
                ..Default::default()
            },
            // A CSI clone runs no pod; a host-assisted one fills PVC' through an upload server.
            PopulationSource::Clone(_) => DataVolumeSource {
                upload: Some(Default::default()),
                ..Default::default()
            },
        };
        DataVolumeSpec {
            source: Some(source),
            content_type: Some(self.content_type()),
            preallocation: self.preallocation(),
            ..Default::default()
        }
    }
}

/// What the controller saw.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The PVC to populate.
    pub target: &'a PersistentVolumeClaim,
    /// The source its `dataSourceRef` names (None: not there yet).
    pub source: Option<&'a PopulationSource>,
    /// Its StorageClass (None: not found, or the PVC names none).
    pub class: Option<&'a StorageClass>,
    /// PVC'.
    pub prime: Option<&'a PersistentVolumeClaim>,
    /// The importer or upload server pod of PVC'.
    pub pod: Option<&'a Pod>,
    /// The clone source pod of a host-assisted clone.
    pub source_pod: Option<&'a Pod>,
    /// Whether the upload Service exists.
    pub service: bool,
    /// The PersistentVolume PVC' is (or was) bound to.
    pub volume: Option<&'a PersistentVolume>,
    /// What a `VolumeCloneSource` names (None: missing, or not a clone).
    pub origin: Option<CloneOrigin<'a>>,
    /// Progress read from the running importer, in percent.
    pub progress: Option<f64>,
    /// Keys of the ConfigMap and Secrets an import source references.
    pub refs: SourceRefs,
    /// Where PVC' may go when it is bound at once with no consumer
    /// ([`super::placement::candidates`]; read only then).
    pub nodes: &'a [String],
    /// The current time.
    pub now: Timestamp,
}

/// An API call to make, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create PVC'.
    CreatePrime(Box<PersistentVolumeClaim>),
    /// Create the importer or upload server pod.
    CreatePod(Box<Pod>),
    /// Create the upload Service.
    CreateService(Box<Service>),
    /// Merge these annotations into the target PVC (None removes one).
    Annotate(BTreeMap<String, Option<String>>),
    /// Point the volume's claimRef (naming PVC' when read) at the target PVC.
    Rebind {
        /// The PersistentVolume.
        volume: String,
        /// Its resourceVersion when read: the write is refused if it changed since.
        resource_version: String,
        /// The target PVC.
        claim_ref: Box<ObjectReference>,
    },
    /// Issue (or renew) the upload server's serving certificate from the signer in `namespace`
    /// (`UploadTls::Issued`), before the pod that mounts it; look again by its renewal time.
    EnsureUploadSecret {
        /// The cert controller's namespace, holding the signer.
        namespace: String,
    },
    /// Issue the clone source pod's client certificate Secret (`secret`) from the signer in
    /// `namespace`, unless it exists, before the pod that mounts it.
    EnsureClientSecret {
        /// The cert controller's namespace, holding the signer.
        namespace: String,
        /// The Secret's metadata.
        secret: Box<ObjectMeta>,
    },
    /// Create the clone source pod of a host-assisted clone.
    CreateSourcePod(Box<Pod>),
    /// Record an event on the target PVC.
    Event(Event),
    /// Delete a pod by name.
    DeletePod(String),
    /// Delete the upload Service by name.
    DeleteService(String),
    /// Delete PVC'.
    DeletePrime(String),
}

/// The outcome of one decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// The calls to make.
    pub actions: Vec<Action>,
    /// Look again after this long even without a change.
    pub requeue: Option<Duration>,
    /// PVC''s PersistentVolume is wanted and was not read: read it and decide again. It is read
    /// only for the steps that need it (the rebind, the cleanup), not on every look while the
    /// pod works.
    pub needs_volume: bool,
}

/// Decides what to do for `obs.target`.
pub fn decide(obs: &Observed<'_>, cfg: &Config) -> Decision {
    let mut d = Decision::default();
    let t = obs.target;
    if t.metadata.deletion_timestamp.is_some() {
        return d;
    }
    if is_bound(t) {
        cleanup(obs, &mut d);
        return d;
    }
    let Some(src) = obs.source else {
        return d;
    };
    if !ready_for_population(obs) {
        return d;
    }
    let clone = match src {
        PopulationSource::Clone(c) => match clone_route(obs, c) {
            Some(route) => Some(route),
            // Not there or not ready yet: a source PVC's binding is not watched for its
            // targets, so look again soon.
            None => {
                d.requeue = Some(Duration::from_secs(5));
                return d;
            }
        },
        _ => None,
    };
    let Some(prime) = obs.prime else {
        let mut p = prime_claim(t, src);
        if let Some(node) = obs.nodes.first()
            && needs_node(obs)
            && !matches!(clone, Some(CloneRoute::Csi { .. }))
        {
            // Provisioned at once there; the pod follows its volume.
            let ann = p.metadata.annotations.get_or_insert_default();
            ann.insert(ANN_SELECTED_NODE.into(), node.clone());
        }
        if let Some(CloneRoute::Csi { data_source, node }) = clone {
            let spec = p.spec.get_or_insert_default();
            spec.data_source = Some(data_source);
            // A node-local driver clones where the source is.
            if let Some(node) = node {
                let ann = p.metadata.annotations.get_or_insert_default();
                ann.insert(ANN_SELECTED_NODE.into(), node);
            }
        }
        d.actions.push(Action::CreatePrime(Box::new(p)));
        let mut set = vec![(ANN_PRIME_NAME, Some(prime_name(t)))];
        if matches!(src, PopulationSource::Upload(_)) {
            // An upload target, for the token API (CDI's upload annotation).
            set.push((ANN_UPLOAD_TARGET, Some(String::new())));
        }
        d.actions.push(annotate(set));
        d.actions.push(event(
            false,
            "CreatedPVCPrimeSuccessfully",
            "PVC Prime created successfully",
        ));
        return d;
    };
    // Already rebound: the PV controller binds the target next.
    if obs
        .volume
        .and_then(|v| v.spec.as_ref()?.claim_ref.as_ref()?.uid.as_deref())
        .is_some_and(|uid| Some(uid) == t.metadata.uid.as_deref())
    {
        return d;
    }
    match &clone {
        Some(CloneRoute::Csi { .. }) => {
            cloned(obs, prime, &mut d);
            return d;
        }
        Some(CloneRoute::HostAssisted(_)) if shared_upload_tls(cfg) && obs.source_pod.is_none() => {
            refuse(
                &mut d,
                HOST_ASSISTED_CLONE_NOT_POSSIBLE,
                SHARED_TLS_REFUSED.into(),
            );
            return d;
        }
        _ => {}
    }
    match obs.pod {
        // PVC' is being provisioned on its node: its pod waits for the binding (the scheduler
        // would only poll it, every second).
        None if !consumable(obs, prime) => {}
        None => start_pod(obs, src, prime, cfg, &mut d),
        Some(p) => follow_pod(obs, src, prime, p, cfg, &mut d),
    }
    if let (Some(CloneRoute::HostAssisted(from)), Some(upload)) = (&clone, obs.pod) {
        feed_upload(obs, (src, from), (prime, upload), cfg, &mut d);
    }
    // An upload server's certificate comes before its pod, and stays current while it runs.
    let live = obs
        .pod
        .is_some_and(|p| !matches!(pod_phase(p), "Succeeded" | "Failed"));
    let starts = d.actions.iter().any(|a| matches!(a, Action::CreatePod(_)));
    let upload_server = matches!(src, PopulationSource::Upload(_))
        || matches!(clone, Some(CloneRoute::HostAssisted(_)));
    if let (true, Some(UploadTls::Issued { namespace })) = (upload_server, &cfg.upload_tls)
        && (live || starts)
    {
        let ensure = Action::EnsureUploadSecret {
            namespace: namespace.clone(),
        };
        d.actions.insert(0, ensure);
    }
    d
}

fn is_bound(pvc: &PersistentVolumeClaim) -> bool {
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty())
}

/// CDI's rule: a WaitForFirstConsumer claim is populated once the scheduler chose its node,
/// or at once when immediate binding is asked (the importer then is PVC''s first consumer).
fn ready_for_population(obs: &Observed<'_>) -> bool {
    obs.class.is_some()
        && (!waits_for_consumer(obs)
            || annotation(obs.target, ANN_SELECTED_NODE).is_some()
            || annotation(obs.target, ANN_IMMEDIATE_BINDING).is_some())
}

/// Whether the target's StorageClass binds on first consumer.
fn waits_for_consumer(obs: &Observed<'_>) -> bool {
    obs.class
        .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"))
}

/// Whether PVC' needs a node chosen for it: bound at once (asked) on a WaitForFirstConsumer
/// class, with no consumer's node on the target.
pub fn needs_node(obs: &Observed<'_>) -> bool {
    waits_for_consumer(obs)
        && annotation(obs.target, ANN_SELECTED_NODE).is_none()
        && annotation(obs.target, ANN_IMMEDIATE_BINDING).is_some()
}

/// Whether PVC''s pod may start: PVC' is bound, or it waits for a first consumer to choose its
/// node (WaitForFirstConsumer with no node yet: the pod is that consumer).
fn consumable(obs: &Observed<'_>, prime: &PersistentVolumeClaim) -> bool {
    let bound = prime.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    bound || (waits_for_consumer(obs) && annotation(prime, ANN_SELECTED_NODE).is_none())
}

/// PVC': the target's class, size, modes, on its selected node, owned by it.
fn prime_claim(t: &PersistentVolumeClaim, src: &PopulationSource) -> PersistentVolumeClaim {
    let spec = t.spec.clone().unwrap_or_default();
    let mut ann = BTreeMap::from([
        (ANN_IMMEDIATE_BINDING.to_string(), String::new()),
        (ANN_POPULATOR_KIND.to_string(), src.kind().to_string()),
    ]);
    if let Some(node) = annotation(t, ANN_SELECTED_NODE) {
        ann.insert(ANN_SELECTED_NODE.into(), node.into());
    }
    if matches!(src, PopulationSource::Upload(_)) {
        ann.insert(ANN_UPLOAD_TARGET.into(), String::new());
        let content = match src.content_type() {
            ContentType::Kubevirt => "kubevirt",
            ContentType::Archive => "archive",
        };
        ann.insert(ANN_CONTENT_TYPE.into(), content.into());
    }
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(prime_name(t)),
            namespace: t.metadata.namespace.clone(),
            labels: Some(labels()),
            annotations: Some(ann),
            owner_references: Some(vec![owner(t)]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            resources: spec.resources,
            storage_class_name: spec.storage_class_name,
            volume_mode: spec.volume_mode,
            ..Default::default()
        }),
        status: None,
    }
}

/// The controller reference of PVC' to its target PVC (no blockOwnerDeletion: deleting the
/// target need not wait for PVC').
fn owner(t: &PersistentVolumeClaim) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "PersistentVolumeClaim".into(),
        name: t.metadata.name.clone().unwrap_or_default(),
        uid: t.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// Whom the pods work for: PVC', owned by it, labelled with the target's UID for progress.
pub fn workload(
    t: &PersistentVolumeClaim,
    prime: &PersistentVolumeClaim,
    src: &PopulationSource,
) -> Workload {
    let uid = |p: &PersistentVolumeClaim| p.metadata.uid.clone().unwrap_or_default();
    // An upload server (an upload's, a host-assisted clone's) is named for the target, which
    // the upload proxy routes by; an importer for PVC', as CDI names it.
    let name = match src {
        PopulationSource::Upload(_) | PopulationSource::Clone(_) => t.metadata.name.clone(),
        PopulationSource::Import(_) => prime.metadata.name.clone(),
    };
    Workload {
        name: name.unwrap_or_default(),
        claim: prime.metadata.name.clone().unwrap_or_default(),
        namespace: t.metadata.namespace.clone(),
        uid: uid(t),
        labels: labels(),
        owner: Some(OwnerReference {
            name: prime.metadata.name.clone().unwrap_or_default(),
            uid: uid(prime),
            ..owner(t)
        }),
        // A VolumeCloneSource's own, else the PVC's (a DataVolume's goes there).
        priority_class: match src {
            PopulationSource::Clone(c) => c.priority_class_name.clone(),
            _ => None,
        }
        .or_else(|| annotation(t, ANN_PRIORITY_CLASS).map(String::from)),
        preallocation: src.preallocation(),
        annotations: pod::passed_annotations(t.metadata.annotations.as_ref()),
    }
}

/// A claim's volume mode (Filesystem unless it says Block).
fn mode_of(spec: &PersistentVolumeClaimSpec) -> VolumeMode {
    VolumeMode::parse(spec.volume_mode.as_deref()).unwrap_or(VolumeMode::Filesystem)
}

/// What the pods need of the claim: its size, mode and filesystem overhead.
fn claim_of(t: &PersistentVolumeClaim, cfg: &Config) -> Result<Claim, String> {
    let spec = t.spec.clone().unwrap_or_default();
    let requested = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref()?.get("storage"))
        .ok_or("the PVC requests no storage")?;
    let size = quantity::parse(&requested.0)
        .map_err(|e| format!("the PVC's storage request {:?}: {e}", requested.0))?;
    let mode = mode_of(&spec);
    let overhead = match mode {
        VolumeMode::Filesystem => cfg.overhead(spec.storage_class_name.as_deref()),
        VolumeMode::Block => 0.0,
    };
    Ok(Claim {
        spec,
        size,
        mode,
        overhead,
    })
}

fn start_pod(
    obs: &Observed<'_>,
    src: &PopulationSource,
    prime: &PersistentVolumeClaim,
    cfg: &Config,
    d: &mut Decision,
) {
    let t = obs.target;
    let claim = match claim_of(t, cfg) {
        Ok(c) => c,
        Err(e) => return refuse(d, "ErrClaimNotValid", e),
    };
    let spec = src.as_spec();
    let source = match source::source(&spec) {
        Ok(s) => s,
        Err(e) => return refuse(d, "ErrInvalidSource", e.to_string()),
    };
    let w = workload(t, prime, src);
    let target_uid = t.metadata.uid.clone().unwrap_or_default();
    let p = match &source {
        Source::Import(i) => pod::importer_pod(&w, i, &claim, &obs.refs, cfg),
        Source::Blank => pod::blank_pod(&w, &claim, cfg),
        Source::Upload => {
            let archive = src.content_type() == ContentType::Archive;
            pod::upload_pod(&w, &claim, cfg, &target_uid, archive)
        }
        Source::Clone(_) => return refuse(d, "ErrInvalidSource", "not an import".into()),
    };
    d.actions.push(Action::CreatePod(Box::new(p)));
    if source == Source::Upload && !obs.service {
        let svc = pod::upload_service(&w, &target_uid);
        d.actions.push(Action::CreateService(Box::new(svc)));
    }
    // As following the Pending pod would write them: one write, not two.
    d.actions.push(annotate([
        (ANN_POD_PHASE, Some("Pending".into())),
        (ANN_PROGRESS, Some(PROGRESS_UNKNOWN.into())),
        (ANN_POD_READY, Some("false".into())),
        (ANN_RUNNING, Some("false".into())),
    ]));
}

fn follow_pod(
    obs: &Observed<'_>,
    src: &PopulationSource,
    prime: &PersistentVolumeClaim,
    p: &Pod,
    cfg: &Config,
    d: &mut Decision,
) {
    let t = obs.target;
    let phase = pod_phase(p);
    let restarts: u32 = annotation(t, ANN_POD_RESTARTS)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let (done_reason, done_message, failed_reason, failed_message) = match src {
        PopulationSource::Import(_) => (
            "importSucceeded",
            format!("Successfully imported into {}", name(t)),
            "importFailed",
            format!("import into {} failed", name(t)),
        ),
        PopulationSource::Upload(_) => (
            "UploadSucceeded",
            format!("Successfully uploaded into {}", name(t)),
            "UploadFailed",
            format!("Upload into {} failed", name(t)),
        ),
        PopulationSource::Clone(_) => (
            "CloneSucceeded",
            format!("Successfully cloned into {}", name(t)),
            CLONE_FAILED,
            format!("Clone into {} failed", name(t)),
        ),
    };
    match phase {
        "Succeeded" => {
            if rebind(obs, prime, d) {
                d.actions.push(event(false, done_reason, &done_message));
            }
        }
        // Deleted for its retry: the restart is counted; the next pod follows once it is gone.
        "Failed" if p.metadata.deletion_timestamp.is_some() => {}
        "Failed" => {
            let (code, message) = terminated(p).unwrap_or((-1, String::new()));
            let failure = classify(code);
            let message = if message.is_empty() {
                failed_message.clone()
            } else {
                format!("{failed_message}: {message}")
            };
            d.actions.push(annotate([
                (ANN_POD_PHASE, Some("Failed".into())),
                (ANN_RUNNING, Some("false".into())),
                (ANN_RUNNING_REASON, Some(failure.reason.clone())),
                (ANN_RUNNING_MESSAGE, Some(message.clone())),
            ]));
            d.actions.push(event(true, failed_reason, &message));
            // A terminal failure keeps its pod (and log); a retryable one starts again after
            // the back-off, a bounded number of times.
            if !failure.retryable || restarts >= cfg.retry.max_restarts {
                return;
            }
            let delay = cfg.retry.delay(restarts);
            let finished = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref()?.first()?.state.as_ref())
                .and_then(|s| s.terminated.as_ref()?.finished_at.as_ref())
                .map(|t| t.0);
            if let Some(at) = finished {
                let elapsed = obs.now.duration_since(at).unsigned_abs();
                if elapsed < delay {
                    d.requeue = Some(delay - elapsed);
                    return;
                }
            }
            d.actions.push(annotate([(
                ANN_POD_RESTARTS,
                Some((restarts + 1).to_string()),
            )]));
            d.actions.push(Action::DeletePod(
                p.metadata.name.clone().unwrap_or_default(),
            ));
        }
        phase => {
            let running = phase == "Running";
            let mut set = vec![
                (ANN_POD_PHASE, Some(phase.to_string())),
                (ANN_POD_READY, Some(pod_ready(p).to_string())),
                (ANN_RUNNING, Some(running.to_string())),
                (
                    ANN_RUNNING_REASON,
                    running.then(|| "Pod is running".to_string()),
                ),
            ];
            if let Some(progress) = obs.progress.filter(|p| *p < 100.0) {
                set.push((ANN_PROGRESS, Some(format_progress(progress))));
            }
            d.actions.push(annotate(set));
            // Progress is read from an importer or a clone source pod (not watched: another
            // object than the upload server): look again.
            if running && !matches!(src, PopulationSource::Upload(_)) {
                d.requeue = Some(cfg.progress_interval);
            }
        }
    }
}

/// Gives PVC''s volume to the target: true when the rebind is asked. PVC''s node goes with
/// it, as if the target had been bound by a consumer there (clones of it are placed by it).
fn rebind(obs: &Observed<'_>, prime: &PersistentVolumeClaim, d: &mut Decision) -> bool {
    let t = obs.target;
    let Some(volume) = obs.volume else {
        // PVC' bound: its volume is read now (and on a later look if it cannot be yet).
        d.needs_volume = true;
        d.requeue = Some(Duration::from_secs(1));
        return false;
    };
    let names_prime = volume
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref()?.uid.as_deref())
        == prime.metadata.uid.as_deref();
    if !names_prime {
        // PVC''s volume belongs to some other claim: never take it.
        let message = format!("the volume of {} is not bound to it", name(prime));
        d.actions.push(event(true, "ErrRebindingPV", &message));
        return false;
    }
    let mut set = vec![
        (ANN_POD_PHASE, Some("Succeeded".into())),
        (ANN_PROGRESS, Some("100.0%".into())),
        (ANN_RUNNING, Some("false".into())),
        (ANN_RUNNING_REASON, Some("Completed".into())),
        (ANN_RUNNING_MESSAGE, None),
        (ANN_PRIME_NAME, None),
    ];
    if annotation(t, ANN_SELECTED_NODE).is_none()
        && let Some(node) = annotation(prime, ANN_SELECTED_NODE)
    {
        set.push((ANN_SELECTED_NODE, Some(node.to_string())));
    }
    d.actions.push(annotate(set));
    d.actions.push(Action::Rebind {
        volume: volume.metadata.name.clone().unwrap_or_default(),
        resource_version: volume.metadata.resource_version.clone().unwrap_or_default(),
        claim_ref: Box::new(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: t.metadata.namespace.clone(),
            name: t.metadata.name.clone(),
            uid: t.metadata.uid.clone(),
            resource_version: t.metadata.resource_version.clone(),
            field_path: None,
        }),
    });
    true
}

/// How a `VolumeCloneSource`'s PVC' is filled.
#[derive(Debug, Clone, PartialEq)]
enum CloneRoute {
    /// By the CSI driver: PVC''s `dataSource`, made on the source's node (a node-local driver
    /// clones where the source is).
    Csi {
        data_source: TypedLocalObjectReference,
        node: Option<String>,
    },
    /// Host-assisted (CDI's way when the source is of another StorageClass or volume mode): an
    /// upload server fills PVC' from a clone source pod reading this PVC.
    HostAssisted(SourcePvc),
}

/// The source PVC of a host-assisted clone.
#[derive(Debug, Clone, PartialEq)]
struct SourcePvc {
    name: String,
    mode: VolumeMode,
    node: Option<String>,
}

/// How to clone `c`; None while its source is missing or not ready.
fn clone_route(obs: &Observed<'_>, c: &VolumeCloneSourceSpec) -> Option<CloneRoute> {
    let spec = obs.target.spec.clone().unwrap_or_default();
    match obs.origin? {
        CloneOrigin::Pvc(src) => {
            let bound = src.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            if !bound {
                return None;
            }
            let src_spec = src.spec.clone().unwrap_or_default();

            let node = annotation(src, ANN_SELECTED_NODE).map(String::from);
            let csi = src_spec.storage_class_name == spec.storage_class_name
                && mode_of(&src_spec) == mode_of(&spec);
            Some(if csi {
                CloneRoute::Csi {
                    data_source: c.source.clone(),
                    node,
                }
            } else {
                CloneRoute::HostAssisted(SourcePvc {
                    name: c.source.name.clone(),
                    mode: mode_of(&src_spec),
                    node,
                })
            })
        }
        CloneOrigin::Snapshot(snap, node) => {
            let ready = snap.status.as_ref().and_then(|s| s.ready_to_use) == Some(true);
            ready.then(|| CloneRoute::Csi {
                data_source: c.source.clone(),
                node: node.map(String::from),
            })
        }
    }
}

fn shared_upload_tls(cfg: &Config) -> bool {
    matches!(cfg.upload_tls, Some(UploadTls::Shared { .. }))
}

/// A host-assisted clone once its upload server exists: the clone source pod streams the source
/// to it (with a client certificate first, where upload servers have their own). It starts beside
/// the server, not once it is ready (its start and its scan of the source overlap the server's;
/// it waits until the server answers); a failed source pod is replaced while the server waits.
fn feed_upload(
    obs: &Observed<'_>,
    (src, from): (&PopulationSource, &SourcePvc),
    (prime, upload): (&PersistentVolumeClaim, &Pod),
    cfg: &Config,
    d: &mut Decision,
) {
    if upload.metadata.deletion_timestamp.is_some()
        || matches!(pod_phase(upload), "Succeeded" | "Failed")
    {
        return;
    }
    let t = obs.target;
    let target_uid = t.metadata.uid.clone().unwrap_or_default();
    match obs.source_pod {
        None => {
            let w = workload(t, prime, src);
            let namespace = t.metadata.namespace.clone().unwrap_or_default();
            let mut secret = None;
            if let Some(UploadTls::Issued { namespace: signer }) = &cfg.upload_tls {
                let mut meta = clone_objects::client_secret_meta(&w, &namespace, &target_uid);
                meta.owner_references = w.owner.clone().map(|o| vec![o]);
                secret = meta.name.clone();
                d.actions.push(Action::EnsureClientSecret {
                    namespace: signer.clone(),
                    secret: Box::new(meta),
                });
            }
            let spec = clone_objects::SourcePodSpec {
                namespace: &namespace,
                pvc: &from.name,
                mode: from.mode,
                node: from.node.as_deref(),
                target_uid: &target_uid,
                tls_secret: secret.as_deref(),
            };
            let mut p = clone_objects::source_pod(&w, &spec, cfg);
            // Same namespace as PVC': owned by it, so it goes with it.
            p.metadata.owner_references = w.owner.map(|o| vec![o]);
            d.actions.push(Action::CreateSourcePod(Box::new(p)));
            d.requeue = Some(cfg.progress_interval);
        }
        Some(p) if pod_phase(p) == "Failed" && p.metadata.deletion_timestamp.is_none() => {
            let message = clone_objects::source_pod_failed(p);
            d.actions.push(event(true, CLONE_FAILED, &message));
            d.actions.push(Action::DeletePod(
                p.metadata.name.clone().unwrap_or_default(),
            ));
        }
        Some(_) => d.requeue = Some(cfg.progress_interval),
    }
}

/// Says on the target why nothing runs.
fn refuse(d: &mut Decision, reason: &str, message: String) {
    d.actions.push(annotate([
        (ANN_RUNNING, Some("false".into())),
        (ANN_RUNNING_REASON, Some(reason.into())),
        (ANN_RUNNING_MESSAGE, Some(message.clone())),
    ]));
    d.actions.push(event(true, reason, &message));
}

/// A clone's PVC' is made by the CSI driver from its source: once bound, its volume is the
/// target's.
fn cloned(obs: &Observed<'_>, prime: &PersistentVolumeClaim, d: &mut Decision) {
    let bound = prime.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if !bound {
        d.actions.push(annotate([(
            ANN_PROGRESS,
            Some(PROGRESS_UNKNOWN.to_string()),
        )]));
        return;
    }
    if rebind(obs, prime, d) {
        let message = format!("Successfully cloned into {}", name(obs.target));
        d.actions.push(event(false, "CloneSucceeded", &message));
    }
}

/// The target is bound: once PVC' lost its volume to it, PVC' and its pod and Service go.
fn cleanup(obs: &Observed<'_>, d: &mut Decision) {
    let Some(prime) = obs.prime else {
        return;
    };
    let lost = prime.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost");
    let has_volume = prime
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    if !lost && has_volume && obs.volume.is_none() {
        d.needs_volume = true;
        return;
    }
    let rebound = obs
        .volume
        .and_then(|v| v.spec.as_ref()?.claim_ref.as_ref()?.uid.as_deref())
        .is_some_and(|uid| Some(uid) != prime.metadata.uid.as_deref());
    if !(lost || rebound) {
        return;
    }
    // What is already going is not deleted again: PVC' waits, deleted, until its pod is gone
    // (its protection finalizer), and every look in between would ask once more.
    if let Some(p) = obs.pod.filter(|p| p.metadata.deletion_timestamp.is_none()) {
        d.actions.push(Action::DeletePod(
            p.metadata.name.clone().unwrap_or_default(),
        ));
    }
    if obs.service {
        d.actions
            .push(Action::DeleteService(pod::upload_name(&name(obs.target))));
    }
    if prime.metadata.deletion_timestamp.is_none() {
        d.actions.push(Action::DeletePrime(
            prime.metadata.name.clone().unwrap_or_default(),
        ));
    }
}

fn name(pvc: &PersistentVolumeClaim) -> String {
    pvc.metadata.name.clone().unwrap_or_default()
}

fn annotate<K: Into<String>>(set: impl IntoIterator<Item = (K, Option<String>)>) -> Action {
    Action::Annotate(set.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

fn event(warning: bool, reason: &str, message: &str) -> Action {
    Action::Event(Event {
        warning,
        reason: reason.into(),
        message: message.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datavolume::ANN_IMMEDIATE_BINDING;
    use api::datavolume::SourceHttp;
    use api::populator::ImportSourceType;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PersistentVolumeClaimStatus,
        PersistentVolumeSpec, PodStatus, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn target(annotations: &[(&str, &str)]) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("disk".into()),
                namespace: Some("vms".into()),
                uid: Some("t-uid".into()),
                resource_version: Some("7".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: Some("local".into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity("1Gi".into()),
                    )])),
                    limits: None,
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn class(mode: &str) -> StorageClass {
        StorageClass {
            volume_binding_mode: Some(mode.into()),
            ..Default::default()
        }
    }

    fn import() -> PopulationSource {
        PopulationSource::Import(Box::new(VolumeImportSourceSpec {
            source: Some(ImportSourceType {
                http: Some(SourceHttp {
                    url: "http://files/disk.qcow2".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    fn prime_of(t: &PersistentVolumeClaim, phase: &str) -> PersistentVolumeClaim {
        let mut p = prime_claim(t, &import());
        p.metadata.uid = Some("p-uid".into());
        // The scheduler placed its importer there.
        p.metadata
            .annotations
            .get_or_insert_default()
            .insert(ANN_SELECTED_NODE.into(), "node-7".into());
        p.spec.get_or_insert_default().volume_name = Some("pv-1".into());
        p.status = Some(PersistentVolumeClaimStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        p
    }

    fn volume(claim_uid: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv-1".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                claim_ref: Some(ObjectReference {
                    uid: Some(claim_uid.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn pod(phase: &str, exit: Option<i32>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("importer-prime-t-uid".into()),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: exit.map(|code| {
                    vec![ContainerStatus {
                        state: Some(ContainerState {
                            terminated: Some(ContainerStateTerminated {
                                exit_code: code,
                                message: Some("source: 404 Not Found".into()),
                                finished_at: Some(
                                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                                        Timestamp::UNIX_EPOCH,
                                    ),
                                ),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    fn observe<'a>(
        t: &'a PersistentVolumeClaim,
        src: &'a PopulationSource,
        class: &'a StorageClass,
    ) -> Observed<'a> {
        Observed {
            target: t,
            source: Some(src),
            class: Some(class),
            prime: None,
            pod: None,
            source_pod: None,
            service: false,
            volume: None,
            origin: None,
            progress: None,
            refs: SourceRefs::default(),
            nodes: &[],
            now: Timestamp::UNIX_EPOCH + std::time::Duration::from_secs(3600),
        }
    }

    fn created_prime(d: &Decision) -> &PersistentVolumeClaim {
        d.actions
            .iter()
            .find_map(|a| match a {
                Action::CreatePrime(p) => Some(p.as_ref()),
                _ => None,
            })
            .expect("PVC' created")
    }

    #[test]
    fn wait_for_first_consumer_waits_for_the_selected_node_or_immediate_binding() {
        let cfg = Config::default();
        let src = import();
        let wffc = class("WaitForFirstConsumer");
        let t = target(&[]);
        assert_eq!(decide(&observe(&t, &src, &wffc), &cfg), Decision::default());

        let t = target(&[(ANN_SELECTED_NODE, "node-1")]);
        let d = decide(&observe(&t, &src, &wffc), &cfg);
        let p = created_prime(&d);
        assert_eq!(p.metadata.name.as_deref(), Some("prime-t-uid"));
        let ann = p.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[ANN_SELECTED_NODE], "node-1");
        assert_eq!(ann[ANN_POPULATOR_KIND], "VolumeImportSource");
        assert!(ann.contains_key(ANN_IMMEDIATE_BINDING));
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("PersistentVolumeClaim", "t-uid")
        );
        assert_eq!(
            p.spec.as_ref().unwrap().storage_class_name.as_deref(),
            Some("local")
        );

        let t = target(&[(ANN_IMMEDIATE_BINDING, "true")]);
        let d = decide(&observe(&t, &src, &wffc), &cfg);
        let ann = created_prime(&d).metadata.annotations.clone().unwrap();
        assert!(!ann.contains_key(ANN_SELECTED_NODE));

        // Immediate classes need neither; a missing class or source waits.
        let t = target(&[]);
        let imm = class("Immediate");
        created_prime(&decide(&observe(&t, &src, &imm), &cfg));
        let no_class = Observed {
            class: None,
            ..observe(&t, &src, &imm)
        };
        assert_eq!(decide(&no_class, &cfg), Decision::default());
        let no_source = Observed {
            source: None,
            ..observe(&t, &src, &imm)
        };
        assert_eq!(decide(&no_source, &cfg), Decision::default());
    }

    #[test]
    fn the_importer_fills_prime_and_reports_progress_on_the_target() {
        let cfg = Config::default();
        let (src, imm) = (import(), class("Immediate"));
        let t = target(&[
            (ANN_PRIORITY_CLASS, "vm-disks"),
            ("k8s.v1.cni.cncf.io/networks", "net1"),
        ]);
        let prime = prime_of(&t, "Bound");
        let d = decide(
            &Observed {
                prime: Some(&prime),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        let Some(Action::CreatePod(p)) = d.actions.first() else {
            panic!("{d:?}")
        };
        assert_eq!(p.metadata.name.as_deref(), Some("importer-prime-t-uid"));
        // The PVC's pod network (a DataVolume's, passed on) reaches the pod, as with CDI.
        let ann = p.metadata.annotations.clone().unwrap();
        assert_eq!(ann["k8s.v1.cni.cncf.io/networks"], "net1");
        assert_eq!(ann["sidecar.istio.io/inject"], "false");
        assert_eq!(
            p.spec.as_ref().unwrap().priority_class_name.as_deref(),
            Some("vm-disks")
        );
        let spec = p.spec.as_ref().unwrap();
        let claim = spec.volumes.as_ref().unwrap()[0]
            .persistent_volume_claim
            .as_ref();
        assert_eq!(claim.unwrap().claim_name, "prime-t-uid");
        let args = spec.containers[0].args.clone().unwrap();
        assert!(
            args.contains(&"http://files/disk.qcow2".to_string()),
            "{args:?}"
        );
        assert!(
            args.contains(&"t-uid".to_string()),
            "progress labelled by the target: {args:?}"
        );
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.uid, "p-uid");

        let running = pod("Running", None);
        let d = decide(
            &Observed {
                prime: Some(&prime),
                pod: Some(&running),
                progress: Some(42.5),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        let Some(Action::Annotate(set)) = d.actions.first() else {
            panic!("{d:?}")
        };
        assert_eq!(set[ANN_PROGRESS].as_deref(), Some("42.50%"));
        assert_eq!(set[ANN_POD_PHASE].as_deref(), Some("Running"));
        assert_eq!(d.requeue, Some(cfg.progress_interval));
    }

    #[test]
    fn success_rebinds_the_volume_then_prime_goes_once_lost() {
        let cfg = Config::default();
        let (src, imm) = (import(), class("Immediate"));
        let t = target(&[]);
        let prime = prime_of(&t, "Bound");
        let done = pod("Succeeded", Some(0));
        let pv = volume("p-uid");
        let d = decide(
            &Observed {
                prime: Some(&prime),
                pod: Some(&done),
                volume: Some(&pv),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        let rebind = d
            .actions
            .iter()
            .find_map(|a| match a {
                Action::Rebind {
                    volume,
                    resource_version,
                    claim_ref,
                } => Some((volume, resource_version, claim_ref)),
                _ => None,
            })
            .expect("rebind");
        assert_eq!((rebind.0.as_str(), rebind.1.as_str()), ("pv-1", "42"));
        let placed = d.actions.iter().any(|a| {
            matches!(a, Action::Annotate(set)
                if set.get(ANN_SELECTED_NODE) == Some(&Some("node-7".to_string())))
        });
        assert!(placed, "PVC''s node carried to the target: {:?}", d.actions);
        assert_eq!(rebind.2.uid.as_deref(), Some("t-uid"));
        assert_eq!(rebind.2.name.as_deref(), Some("disk"));
        assert!(d.actions.contains(&event(
            false,
            "importSucceeded",
            "Successfully imported into disk"
        )));

        // A volume some other claim holds is never taken.
        let other = volume("someone-else");
        let d = decide(
            &Observed {
                prime: Some(&prime),
                pod: Some(&done),
                volume: Some(&other),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(!d.actions.iter().any(|a| matches!(a, Action::Rebind { .. })));

        // Rebound, not yet bound: wait for the PV controller.
        let rebound = volume("t-uid");
        let waiting = Observed {
            prime: Some(&prime),
            pod: Some(&done),
            volume: Some(&rebound),
            ..observe(&t, &src, &imm)
        };
        assert_eq!(decide(&waiting, &cfg), Decision::default());

        // Bound: PVC' (Lost), its pod go.
        let mut bound = t.clone();
        bound.spec.as_mut().unwrap().volume_name = Some("pv-1".into());
        let lost = prime_of(&t, "Lost");
        let d = decide(
            &Observed {
                target: &bound,
                prime: Some(&lost),
                pod: Some(&done),
                volume: Some(&rebound),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert_eq!(
            d.actions,
            vec![
                Action::DeletePod("importer-prime-t-uid".into()),
                Action::DeletePrime("prime-t-uid".into())
            ]
        );
    }

    #[test]
    fn the_volume_is_read_only_for_the_rebind_and_the_cleanup() {
        let cfg = Config::default();
        let (src, imm) = (import(), class("Immediate"));
        let t = target(&[]);
        let prime = prime_of(&t, "Bound");
        // While the importer works its volume is of no use.
        let running = pod("Running", None);
        let d = decide(
            &Observed {
                prime: Some(&prime),
                pod: Some(&running),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(!d.needs_volume, "{d:?}");
        // Done: the rebind asks for it, and does nothing else until it is read.
        let done = pod("Succeeded", Some(0));
        let d = decide(
            &Observed {
                prime: Some(&prime),
                pod: Some(&done),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(d.needs_volume && d.actions.is_empty(), "{d:?}");
        // The target bound: whether PVC' lost its volume to it is read from the volume.
        let mut bound = t.clone();
        bound.spec.as_mut().unwrap().volume_name = Some("pv-1".into());
        let d = decide(
            &Observed {
                target: &bound,
                prime: Some(&prime),
                pod: Some(&done),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(d.needs_volume && d.actions.is_empty(), "{d:?}");
        let rebound = volume("t-uid");
        let d = decide(
            &Observed {
                target: &bound,
                prime: Some(&prime),
                pod: Some(&done),
                volume: Some(&rebound),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(!d.needs_volume);
        assert!(
            d.actions
                .contains(&Action::DeletePrime("prime-t-uid".into()))
        );
        // PVC' Lost says so by itself.
        let lost = prime_of(&t, "Lost");
        let d = decide(
            &Observed {
                target: &bound,
                prime: Some(&lost),
                pod: Some(&done),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(!d.needs_volume);
        assert!(
            d.actions
                .contains(&Action::DeletePrime("prime-t-uid".into()))
        );
    }

    #[test]
    fn what_is_already_going_is_not_deleted_again() {
        let cfg = Config::default();
        let (src, imm) = (import(), class("Immediate"));
        let t = target(&[]);
        let mut bound = t.clone();
        bound.spec.as_mut().unwrap().volume_name = Some("pv-1".into());
        let going = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::UNIX_EPOCH,
        ));
        let mut lost = prime_of(&t, "Lost");
        lost.metadata.deletion_timestamp = going.clone();
        let mut done = pod("Succeeded", Some(0));
        done.metadata.deletion_timestamp = going.clone();
        let d = decide(
            &Observed {
                target: &bound,
                prime: Some(&lost),
                pod: Some(&done),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert_eq!(d, Decision::default());
        // A failed pod deleted for its retry: its restart is counted once, not at every look
        // until it is gone.
        let prime = prime_of(&t, "Bound");
        let mut retried = pod("Failed", Some(20));
        retried.metadata.deletion_timestamp = going;
        let counted = target(&[(ANN_POD_RESTARTS, "1")]);
        let d = decide(
            &Observed {
                target: &counted,
                prime: Some(&prime),
                pod: Some(&retried),
                ..observe(&counted, &src, &imm)
            },
            &cfg,
        );
        assert_eq!(d, Decision::default());
    }

    #[test]
    fn terminal_failures_keep_the_pod_and_retryable_ones_restart_after_the_back_off() {
        let cfg = Config::default();
        let (src, imm) = (import(), class("Immediate"));
        let t = target(&[]);
        let prime = prime_of(&t, "Bound");
        let terminal = pod("Failed", Some(15));
        let d = decide(
            &Observed {
                prime: Some(&prime),
                pod: Some(&terminal),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(!d.actions.iter().any(|a| matches!(a, Action::DeletePod(_))));
        let Some(Action::Annotate(set)) = d.actions.first() else {
            panic!("{d:?}")
        };
        assert_eq!(set[ANN_RUNNING_REASON].as_deref(), Some("SourceRejected"));
        assert!(set[ANN_RUNNING_MESSAGE].as_deref().unwrap().contains("404"));

        let retryable = pod("Failed", Some(20));
        let d = decide(
            &Observed {
                prime: Some(&prime),
                pod: Some(&retryable),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(
            d.actions
                .contains(&Action::DeletePod("importer-prime-t-uid".into()))
        );
        assert!(
            d.actions
                .contains(&annotate([(ANN_POD_RESTARTS, Some("1".to_string()))]))
        );

        let spent = target(&[(ANN_POD_RESTARTS, &cfg.retry.max_restarts.to_string())]);
        let d = decide(
            &Observed {
                target: &spent,
                prime: Some(&prime),
                pod: Some(&retryable),
                ..observe(&spent, &src, &imm)
            },
            &cfg,
        );
        assert!(!d.actions.iter().any(|a| matches!(a, Action::DeletePod(_))));
    }

    #[test]
    fn an_upload_source_gets_an_upload_server_and_a_service_named_for_the_target() {
        let cfg = Config::default();
        let src = PopulationSource::Upload(VolumeUploadSourceSpec::default());
        let imm = class("Immediate");
        let t = target(&[]);
        let d = decide(&observe(&t, &src, &imm), &cfg);
        let ann = created_prime(&d).metadata.annotations.clone().unwrap();
        assert!(ann.contains_key(ANN_UPLOAD_TARGET));
        let mut prime = prime_claim(&t, &src);
        prime.metadata.uid = Some("p-uid".into());
        // PVC' is being provisioned (an Immediate class): its pod waits for the binding.
        let d = decide(
            &Observed {
                prime: Some(&prime),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(
            !d.actions.iter().any(|a| matches!(a, Action::CreatePod(_))),
            "{d:?}"
        );
        // A WaitForFirstConsumer PVC' with no node yet (immediate binding asked): the pod is
        // its first consumer.
        let wffc = class("WaitForFirstConsumer");
        let now = target(&[(ANN_IMMEDIATE_BINDING, "true")]);
        let d = decide(
            &Observed {
                prime: Some(&prime),
                ..observe(&now, &src, &wffc)
            },
            &cfg,
        );
        assert!(
            d.actions.iter().any(|a| matches!(a, Action::CreatePod(_))),
            "{d:?}"
        );
        prime.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        });
        let d = decide(
            &Observed {
                prime: Some(&prime),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        let names: Vec<_> = d
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::CreatePod(p) => p.metadata.name.clone(),
                Action::CreateService(s) => s.metadata.name.clone(),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["cdi-upload-disk", "cdi-upload-disk"]);

        // Certificates issued per upload server: its Secret comes first.
        let issued = Config {
            upload_tls: Some(UploadTls::Issued {
                namespace: "quarry".into(),
            }),
            ..Config::default()
        };
        let d = decide(
            &Observed {
                prime: Some(&prime),
                ..observe(&t, &src, &imm)
            },
            &issued,
        );
        assert_eq!(
            d.actions.first(),
            Some(&Action::EnsureUploadSecret {
                namespace: "quarry".into()
            })
        );
    }

    fn clone_of(kind: &str, name: &str) -> PopulationSource {
        PopulationSource::Clone(VolumeCloneSourceSpec {
            source: TypedLocalObjectReference {
                api_group: (kind == "VolumeSnapshot").then(|| "snapshot.storage.k8s.io".into()),
                kind: kind.into(),
                name: name.into(),
            },
            ..Default::default()
        })
    }

    /// Immediate binding on a WaitForFirstConsumer class with no consumer: PVC' goes to a
    /// node the driver runs on, so it is provisioned at once; a consumer's node, or an
    /// Immediate class, is left as it is.
    #[test]
    fn a_pvc_bound_at_once_with_no_consumer_gets_a_node_for_its_prime() {
        let cfg = Config::default();
        let src = import();
        let (wffc, imm) = (class("WaitForFirstConsumer"), class("Immediate"));
        let nodes = ["node-1".to_string(), "node-2".to_string()];
        let node_of = |d: &Decision| {
            created_prime(d)
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_SELECTED_NODE).cloned())
        };
        let now = target(&[(ANN_IMMEDIATE_BINDING, "true")]);
        let o = Observed {
            nodes: &nodes,
            ..observe(&now, &src, &wffc)
        };
        assert!(needs_node(&o));
        assert_eq!(node_of(&decide(&o, &cfg)).as_deref(), Some("node-1"));
        let consumer = target(&[
            (ANN_IMMEDIATE_BINDING, "true"),
            (ANN_SELECTED_NODE, "node-9"),
        ]);
        let o = Observed {
            nodes: &nodes,
            ..observe(&consumer, &src, &wffc)
        };
        assert!(!needs_node(&o));
        assert_eq!(node_of(&decide(&o, &cfg)).as_deref(), Some("node-9"));
        let o = Observed {
            nodes: &nodes,
            ..observe(&now, &src, &imm)
        };
        assert!(!needs_node(&o));
        assert_eq!(node_of(&decide(&o, &cfg)), None);
        // No node known: PVC' waits for its pod as first consumer, as before.
        let o = observe(&now, &src, &wffc);
        assert_eq!(node_of(&decide(&o, &cfg)), None);
    }

    #[test]
    fn a_clone_source_is_cloned_by_the_driver_on_the_source_node_then_rebound() {
        let cfg = Config::default();
        let (src, imm) = (
            clone_of("PersistentVolumeClaim", "golden"),
            class("Immediate"),
        );
        let t = target(&[]);
        let mut golden = target(&[(ANN_SELECTED_NODE, "node-3")]);
        golden.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        });
        // Missing or unbound source: wait, and look again.
        let d = decide(&observe(&t, &src, &imm), &cfg);
        assert!(d.actions.is_empty() && d.requeue.is_some(), "{d:?}");

        let with_source = Observed {
            origin: Some(CloneOrigin::Pvc(&golden)),
            ..observe(&t, &src, &imm)
        };
        let d = decide(&with_source, &cfg);
        let p = created_prime(&d);
        let ds = p.spec.as_ref().unwrap().data_source.as_ref().unwrap();
        assert_eq!(
            (ds.kind.as_str(), ds.name.as_str()),
            ("PersistentVolumeClaim", "golden")
        );
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[ANN_SELECTED_NODE],
            "node-3"
        );

        // PVC' made by the driver and bound: its volume becomes the target's, no pod ever.
        let prime = prime_of(&t, "Bound");
        let pv = volume("p-uid");
        let d = decide(
            &Observed {
                prime: Some(&prime),
                volume: Some(&pv),
                ..with_source
            },
            &cfg,
        );
        assert!(d.actions.iter().any(|a| matches!(a, Action::Rebind { .. })));
        assert!(!d.actions.iter().any(|a| matches!(a, Action::CreatePod(_))));
        assert!(d.actions.contains(&event(
            false,
            "CloneSucceeded",
            "Successfully cloned into disk"
        )));
    }

    fn ready_pod(name: &str, phase: &str) -> Pod {
        let mut p = pod(phase, None);
        p.metadata.name = Some(name.into());
        p.status.get_or_insert_default().conditions =
            Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]);
        p
    }

    /// Another StorageClass or volume mode than the source's: CDI's host-assisted copy. PVC'
    /// is made plain (no dataSource, not on the source's node), an upload server named for the
    /// target fills it, and once it takes data a clone source pod on the source's node streams
    /// the source to it with a client certificate; then PVC''s volume is rebound.
    #[test]
    fn a_clone_source_of_another_class_or_mode_is_copied_host_assisted() {
        let cfg = Config {
            upload_tls: Some(UploadTls::Issued {
                namespace: "quarry".into(),
            }),
            ..Config::default()
        };
        let mut src = clone_of("PersistentVolumeClaim", "golden");
        if let PopulationSource::Clone(c) = &mut src {
            c.priority_class_name = Some("copies".into());
        }
        let imm = class("Immediate");
        let mut t = target(&[]);
        t.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let mut golden = target(&[(ANN_SELECTED_NODE, "node-3")]);
        golden.metadata.name = Some("golden".into());
        golden.spec.as_mut().unwrap().storage_class_name = Some("other".into());
        golden.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        });
        let with_source = Observed {
            origin: Some(CloneOrigin::Pvc(&golden)),
            ..observe(&t, &src, &imm)
        };
        let d = decide(&with_source, &cfg);
        let p = created_prime(&d);
        assert_eq!(p.spec.as_ref().unwrap().data_source, None);
        assert!(
            !p.metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(ANN_SELECTED_NODE)
        );

        // PVC' made: the upload server for the target, its Service and certificate.
        let prime = prime_of(&t, "Bound");
        let with_prime = Observed {
            prime: Some(&prime),
            ..with_source.clone()
        };
        let d = decide(&with_prime, &cfg);
        let upload = d
            .actions
            .iter()
            .find_map(|a| match a {
                Action::CreatePod(p) => Some(p.as_ref()),
                _ => None,
            })
            .expect("upload server");
        assert_eq!(upload.metadata.name.as_deref(), Some("cdi-upload-disk"));
        assert!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::CreateService(_)))
        );
        assert!(
            matches!(d.actions[0], Action::EnsureUploadSecret { .. }),
            "{d:?}"
        );
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::CreateSourcePod(_)))
        );

        // The upload server made, not yet running: the client certificate, then the source pod
        // (it starts beside the server and waits for it to answer).
        let mut server = pod("Pending", None);
        server.metadata.name = Some("cdi-upload-disk".into());
        let running = Observed {
            pod: Some(&server),
            service: true,
            ..with_prime.clone()
        };
        let d = decide(&running, &cfg);
        let secret = d.actions.iter().position(|a| {
            matches!(a, Action::EnsureClientSecret { namespace, secret }
                if namespace == "quarry" && secret.name.as_deref() == Some("t-uid-source-pod"))
        });
        let source = d
            .actions
            .iter()
            .position(|a| matches!(a, Action::CreateSourcePod(_)));
        assert!(
            matches!((secret, source), (Some(a), Some(b)) if a < b),
            "{d:?}"
        );
        let Action::CreateSourcePod(sp) = &d.actions[source.unwrap()] else {
            unreachable!()
        };
        let spec = sp.spec.as_ref().unwrap();
        let claims: Vec<_> = spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .collect();
        assert!(
            matches!(claims.as_slice(), [c] if c.claim_name == "golden" && c.read_only == Some(true)),
            "{claims:?}"
        );
        let affinity = serde_json::to_string(&spec.affinity).unwrap();
        assert!(affinity.contains("node-3"), "{affinity}");
        assert_eq!(
            sp.metadata.owner_references.as_ref().unwrap()[0].uid,
            "p-uid"
        );
        let args = spec.containers[0]
            .args
            .clone()
            .unwrap_or_default()
            .join(" ");
        assert!(args.contains("https://cdi-upload-disk.vms.svc/"), "{args}");
        assert_eq!(spec.priority_class_name.as_deref(), Some("copies"));
        assert!(d.requeue.is_some());

        // A failed source pod is replaced while the upload server waits.
        let mut failed = pod("Failed", Some(1));
        failed.metadata.name = Some("t-uid-source-pod".into());
        let d = decide(
            &Observed {
                source_pod: Some(&failed),
                ..running.clone()
            },
            &cfg,
        );
        assert!(
            d.actions
                .contains(&Action::DeletePod("t-uid-source-pod".into()))
        );
        assert!(
            d.actions
                .iter()
                .any(|a| matches!(a, Action::Event(e) if e.reason == "CloneFailed"))
        );

        // The upload server finished: PVC''s volume becomes the target's.
        let bound = prime_of(&t, "Bound");
        let done = ready_pod("cdi-upload-disk", "Succeeded");
        let pv = volume("p-uid");
        let d = decide(
            &Observed {
                prime: Some(&bound),
                pod: Some(&done),
                volume: Some(&pv),
                ..running.clone()
            },
            &cfg,
        );
        assert!(d.actions.iter().any(|a| matches!(a, Action::Rebind { .. })));
        assert!(d.actions.contains(&event(
            false,
            "CloneSucceeded",
            "Successfully cloned into disk"
        )));

        // One upload TLS Secret for every server: the source pod could not authenticate.
        let shared = Config {
            upload_tls: Some(UploadTls::Shared {
                secret: "tls".into(),
                client_ca_config_map: None,
            }),
            ..cfg.clone()
        };
        let d = decide(&with_prime, &shared);
        assert!(!d.actions.iter().any(|a| matches!(a, Action::CreatePod(_))));
        assert!(d.actions.iter().any(
            |a| matches!(a, Action::Event(e) if e.warning && e.reason == "HostAssistedCloneNotPossible")
        ));
    }

    #[test]
    fn a_snapshot_clone_source_waits_until_ready() {
        let cfg = Config::default();
        let (src, imm) = (clone_of("VolumeSnapshot", "snap"), class("Immediate"));
        let t = target(&[]);
        let mut snap = VolumeSnapshot::new("snap", Default::default());
        let d = decide(
            &Observed {
                origin: Some(CloneOrigin::Snapshot(&snap, Some("node-9"))),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(d.actions.is_empty(), "{d:?}");
        snap.status = Some(api::snapshot::VolumeSnapshotStatus {
            ready_to_use: Some(true),
            ..Default::default()
        });
        let d = decide(
            &Observed {
                origin: Some(CloneOrigin::Snapshot(&snap, Some("node-9"))),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        let p = created_prime(&d);
        assert_eq!(
            p.spec.as_ref().unwrap().data_source.as_ref().unwrap().kind,
            "VolumeSnapshot"
        );
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[ANN_SELECTED_NODE],
            "node-9"
        );
    }

    #[test]
    fn an_invalid_source_is_reported_on_the_target_and_nothing_runs() {
        let cfg = Config::default();
        let src = PopulationSource::Import(Box::default());
        let imm = class("Immediate");
        let t = target(&[]);
        let prime = prime_of(&t, "Bound");
        let d = decide(
            &Observed {
                prime: Some(&prime),
                ..observe(&t, &src, &imm)
            },
            &cfg,
        );
        assert!(!d.actions.iter().any(|a| matches!(a, Action::CreatePod(_))));
        assert!(
            d.actions.iter().any(
                |a| matches!(a, Action::Event(e) if e.warning && e.reason == "ErrInvalidSource")
            )
        );
    }
}
