//! The DataVolume state machine as one pure function: the DataVolume, its PVC and its pod as
//! observed go in; the new status and the API actions to take come out. The controller and the
//! tests both drive it; nothing here talks to a cluster.
//!
//! Import: Pending → PVCBound → ImportScheduled → ImportInProgress → Succeeded | Failed.
//! Upload: Pending → PVCBound → UploadScheduled → UploadReady → Succeeded | Failed.
//! A PVC whose StorageClass binds WaitForFirstConsumer shows WaitForFirstConsumer until bound,
//! unless the DataVolume asks to bind at once (then its pod is the first consumer).

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::clone::SourceRef;
use super::clone::flow::CloneObserved;
use super::name;
use super::pod::{self, SourceRefs};
use super::populated;
use super::pvc::{self, Claim, StorageDefaults};
use super::retry::classify;
use super::source::{self, Source};
use super::status::{self, PROGRESS_UNKNOWN, reason};
use crate::settings::{Config, UploadTls};
use api::datavolume::{DataVolumeSource, DataVolumeSpec, DataVolumeStatus, condition};
use api::{DataVolume, Phase};
use kubekit::error::Error;

/// What the controller saw of the DataVolume's objects.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The PVC named like the DataVolume.
    pub pvc: Option<&'a PersistentVolumeClaim>,
    /// The importer or upload server pod.
    pub pod: Option<&'a Pod>,
    /// Whether the upload Service exists.
    pub service: bool,
    /// The PVC's StorageClass binds WaitForFirstConsumer.
    pub wait_for_first_consumer: bool,
    /// Whether the StorageClass of a PVC yet to be made is a CSI driver's (the volume
    /// populators fill such PVCs, as CDI's do); None where no populator runs (local mode).
    pub csi_class: Option<bool>,
    /// Progress read from the running importer's metrics, in percent.
    pub progress: Option<f64>,
    /// Keys of the ConfigMap and Secrets the source references.
    pub refs: SourceRefs,
    /// What completes a `spec.storage` claim (its StorageClass and StorageProfile).
    pub storage: StorageDefaults,
    /// What `spec.sourceRef` resolved to (None: no sourceRef, or not looked up).
    pub source_ref: Option<SourceRef>,
    /// A clone's source, temporary snapshot, source pod and strategy facts.
    pub clone: CloneObserved,
    /// The last creation of the pod the API server refused (None: the last one succeeded):
    /// a refusal leaves no object behind, so the executor remembers it.
    pub refused: Option<PodRefusal>,
    /// The current time.
    pub now: Timestamp,
}

/// Pod creations the API server refused in a row (Pod Security, quota, admission webhooks).
#[derive(Debug, Clone, PartialEq)]
pub struct PodRefusal {
    /// 1 for the first refusal.
    pub attempt: u32,
    /// The API server's message.
    pub message: String,
    /// When the last one was refused.
    pub at: Timestamp,
}

/// A Kubernetes event on the DataVolume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Warning (true) or Normal.
    pub warning: bool,
    /// CDI's reason.
    pub reason: String,
    /// What happened.
    pub message: String,
}

/// The last event published per object UID (reason, message): a decision made from an object
/// read before the last status write repeats its phase change, not its event.
#[derive(Debug, Default)]
pub struct Announced(std::sync::Mutex<std::collections::HashMap<String, (String, String)>>);

impl Announced {
    /// Whether `e` differs from the last event published for `uid` (and if so, records it).
    pub fn news(&self, uid: &str, e: &Event) -> bool {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (e.reason.clone(), e.message.clone());
        if last.get(uid) == Some(&key) {
            return false;
        }
        last.insert(uid.to_string(), key);
        true
    }

    /// Forgets `uid` (its object is gone).
    pub fn forget(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
}

/// An API call to make, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create the PVC.
    CreatePvc(Box<PersistentVolumeClaim>),
    /// Create the VolumeImportSource or VolumeUploadSource the PVC names.
    CreatePopulatorSource(Box<super::populated::PopulatorSource>),
    /// Create the importer or upload pod.
    CreatePod(Box<Pod>),
    /// Create the upload Service.
    CreateService(Box<Service>),
    /// Delete a pod by name.
    DeletePod(String),
    /// Delete the upload Service by name.
    DeleteService(String),
    /// Record an event.
    Event(Event),
    /// Create a VolumeSnapshot (a smart clone's, in the DataVolume's namespace).
    CreateSnapshot(Box<api::snapshot::VolumeSnapshot>),
    /// Delete a VolumeSnapshot of the DataVolume's namespace by name.
    DeleteSnapshot(String),
    /// Create a clone source pod (in its own namespace, the source's).
    CreateSourcePod(Box<Pod>),
    /// Delete a clone source pod.
    DeleteSourcePod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// Create the PVC a source snapshot is restored into (in the snapshot's namespace).
    CreateRestore(Box<PersistentVolumeClaim>),
    /// Delete that PVC.
    DeleteRestore {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// Make an existing PVC, populated for the DataVolume, the DataVolume's: write these owner
    /// references, guarded by the PVC's resourceVersion as observed ([`super::adopt`]).
    AdoptPvc {
        /// The PVC's resourceVersion the owners were computed from.
        resource_version: Option<String>,
        /// Its owner references: the ones it had and the DataVolume's.
        owners: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    },
    /// Grow the PVC's storage request to this.
    ExpandPvc(k8s_openapi::apimachinery::pkg::api::resource::Quantity),
    /// Issue (or renew) the upload server's serving certificate from the signer in `namespace`
    /// (`UploadTls::Issued`), before the pod that mounts it; look again by its renewal time.
    EnsureUploadSecret {
        /// The cert controller's namespace, holding the signer.
        namespace: String,
    },
}

/// The outcome of one decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The status to write.
    pub status: DataVolumeStatus,
    /// The calls to make, before writing the status.
    pub actions: Vec<Action>,
    /// Look again after this long even without a change.
    pub requeue: Option<Duration>,
}

/// The kind of pod a source needs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Work {
    Import,
    Upload,
}

/// The pod's phase, as the kubelet is about to report it: a pod that never restarts (all of
/// Quarry's) whose containers have all terminated is over, Succeeded when they all exited 0.
/// The kubelet reports the container's end a status sync (about a second) before the phase:
/// acting on it saves that second on every import, upload and clone.
pub(crate) fn pod_phase(p: &Pod) -> &str {
    let status = p.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let never = p.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
    let ended: Option<Vec<i32>> = status
        .and_then(|s| s.container_statuses.as_ref())
        .filter(|c| !c.is_empty())
        .and_then(|c| {
            c.iter()
                .map(|c| Some(c.state.as_ref()?.terminated.as_ref()?.exit_code))
                .collect()
        });
    match ended {
        // Pending too: a container that ran within one of the kubelet's relists is reported
        // ended before the pod was ever reported Running.
        Some(codes) if never && matches!(phase, "Pending" | "Running") => {
            if codes.iter().all(|c| *c == 0) {
                "Succeeded"
            } else {
                "Failed"
            }
        }
        _ => phase,
    }
}

pub(crate) fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Exit code and termination message of the pod's container, when it has terminated.
pub(crate) fn terminated(p: &Pod) -> Option<(i32, String)> {
    let st = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let t = st.state.as_ref()?.terminated.as_ref()?;
    let msg = t.message.clone().unwrap_or_default();
    Some((t.exit_code, last_error_line(&msg)))
}

/// The importer prints `error: ...` last; with `--json` a JSON line with `error` comes first.
fn last_error_line(log: &str) -> String {
    for line in log.lines().rev() {
        let line = line.trim();
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line)
            && let Some(e) = v.get("error").and_then(|e| e.as_str())
        {
            return e.to_string();
        }
        if let Some(e) = line.strip_prefix("error: ") {
            return e.to_string();
        }
    }
    log.trim().lines().last().unwrap_or_default().to_string()
}

/// Why the container is not running yet (`ContainerCreating`, `ImagePullBackOff`, ...), when
/// the kubelet has said.
fn waiting_reason(p: &Pod) -> Option<String> {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.clone())
}

/// Running while the pod is pending: the kubelet's waiting reason; without one, a retry keeps
/// the previous attempt's failure (its reason, message and back-off time) instead of "Pending".
pub(super) fn pending_reason(cx: &mut Ctx<'_>, p: &Pod) {
    let retrying = cx.st.restart_count.unwrap_or(0) > 0
        && status::find(&cx.st.conditions, condition::RUNNING)
            .is_some_and(|c| c.status == "False" && c.reason.is_some());
    match waiting_reason(p) {
        Some(why) => cx.cond(condition::RUNNING, false, &why, ""),
        None if retrying => {}
        None => cx.cond(condition::RUNNING, false, reason::PENDING, ""),
    }
}

/// A pod creation the API server refused lately (Pod Security, quota, admission webhooks) is
/// made again once the back-off of its attempt has passed; until then Running turns False with
/// the API's message (a Warning event when the message is new), the actions from the pod's
/// creation on wait, and the DataVolume is looked at again when the back-off ends.
fn back_off_refused_pod(d: &mut Decision, obs: &Observed<'_>, cfg: &Config) {
    let Some(r) = &obs.refused else { return };
    let Some(i) = d
        .actions
        .iter()
        .position(|a| matches!(a, Action::CreatePod(_)))
    else {
        return;
    };
    let delay = cfg.retry.delay(r.attempt);
    let due = SignedDuration::try_from(delay)
        .ok()
        .and_then(|delay| r.at.checked_add(delay).ok())
        .unwrap_or(Timestamp::MAX);
    if obs.now >= due {
        return;
    }
    let Action::CreatePod(pod) = &d.actions[i] else {
        return;
    };
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let message = format!("cannot create pod {pod_name}: {}", r.message);
    let new = status::find(&d.status.conditions, condition::RUNNING)
        .is_none_or(|c| c.message.as_deref() != Some(message.as_str()));
    status::set_condition(
        &mut d.status.conditions,
        condition::RUNNING,
        false,
        reason::CREATE_POD_FAILED,
        &message,
        obs.now,
    );
    d.actions.truncate(i);
    if new {
        d.actions.push(Action::Event(Event {
            warning: true,
            reason: reason::CREATE_POD_FAILED.into(),
            message,
        }));
    }
    let wait = obs.now.duration_until(due).unsigned_abs();
    d.requeue = Some(d.requeue.map_or(wait, |r| r.min(wait)));
}

/// An upload server's certificate before its pod, which mounts it; kept current while the pod
/// lives (when upload servers take certificates issued per pod).
fn ensure_upload_secret(d: &mut Decision, dv: &DataVolume, obs: &Observed<'_>, cfg: &Config) {
    let Some(UploadTls::Issued { namespace }) = &cfg.upload_tls else {
        return;
    };
    let finished = dv
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(Phase::is_final);
    let upload_server = pod::upload_name(name(dv));
    let is_upload_server = |p: &Pod| p.metadata.name.as_deref() == Some(upload_server.as_str());
    let creates = d
        .actions
        .iter()
        .any(|a| matches!(a, Action::CreatePod(p) if is_upload_server(p)));
    if !finished && (obs.pod.is_some_and(is_upload_server) || creates) {
        let ensure = Action::EnsureUploadSecret {
            namespace: namespace.clone(),
        };
        d.actions.insert(0, ensure);
    }
}

pub(super) struct Ctx<'a> {
    pub(super) dv: &'a DataVolume,
    pub(super) obs: &'a Observed<'a>,
    pub(super) cfg: &'a Config,
    pub(super) st: DataVolumeStatus,
    pub(super) actions: Vec<Action>,
    pub(super) requeue: Option<Duration>,
}

impl Ctx<'_> {
    pub(super) fn now(&self) -> Timestamp {
        self.obs.now
    }

    pub(super) fn cond(&mut self, type_: &str, status: bool, reason: &str, message: &str) {
        let now = self.now();
        status::set_condition(&mut self.st.conditions, type_, status, reason, message, now);
    }

    /// Running, with Ready false while the data moves.
    pub(super) fn transfer_running(&mut self) {
        self.cond(condition::RUNNING, true, reason::POD_RUNNING, "");
        self.cond(condition::READY, false, reason::TRANSFER_RUNNING, "");
    }

    /// The transfer pod's progress counter as `status.progress`, keeping the last one shown
    /// while the counter cannot be read.
    pub(super) fn observed_progress(&mut self) {
        self.st.progress = Some(match self.obs.progress {
            Some(p) => status::format_progress(p),
            None => self
                .st
                .progress
                .clone()
                .unwrap_or_else(|| PROGRESS_UNKNOWN.into()),
        });
    }

    /// WaitForFirstConsumer: the PVC binds when a pod that uses it is scheduled.
    pub(super) fn wait_for_first_consumer(&mut self) {
        self.cond(
            condition::RUNNING,
            false,
            reason::WAIT_FOR_FIRST_CONSUMER,
            "the PVC waits for its first consumer",
        );
        self.st.phase = Some(Phase::WaitForFirstConsumer);
    }

    /// UploadScheduled: the upload pod is not ready yet.
    pub(super) fn upload_scheduled(&mut self, pvc: &str) {
        self.phase(
            Phase::UploadScheduled,
            Some((
                false,
                reason::UPLOAD_SCHEDULED,
                format!("Upload into {pvc} scheduled"),
            )),
        );
    }

    pub(super) fn event(&mut self, warning: bool, reason: &str, message: String) {
        self.actions.push(Action::Event(Event {
            warning,
            reason: reason.into(),
            message,
        }));
    }

    /// Moves to `phase`, with its event when the phase changes.
    pub(super) fn phase(&mut self, phase: Phase, event: Option<(bool, &str, String)>) {
        if self.st.phase != Some(phase)
            && let Some((w, r, m)) = event
        {
            self.event(w, r, m);
        }
        self.st.phase = Some(phase);
    }

    pub(super) fn fail(&mut self, why: &str, message: &str, event_reason: &str) {
        self.cond(condition::READY, false, why, message);
        self.cond(condition::RUNNING, false, why, message);
        self.phase(
            Phase::Failed,
            Some((true, event_reason, message.to_string())),
        );
    }

    fn finish(self) -> Decision {
        Decision {
            status: self.st,
            actions: self.actions,
            requeue: self.requeue,
        }
    }
}

/// Decides the next status and actions of a DataVolume.
pub fn decide(dv: &DataVolume, obs: &Observed<'_>, cfg: &Config) -> Decision {
    let mut d = steps(dv, obs, cfg);
    back_off_refused_pod(&mut d, obs, cfg);
    ensure_upload_secret(&mut d, dv, obs, cfg);
    d
}

/// The decision of the DataVolume's phase: its source's steps.
fn steps(dv: &DataVolume, obs: &Observed<'_>, cfg: &Config) -> Decision {
    let mut st = dv.status.clone().unwrap_or_default();
    st.claim_name = Some(name(dv).to_string());
    st.observed_generation = dv.metadata.generation;
    st.progress.get_or_insert_with(|| PROGRESS_UNKNOWN.into());
    st.restart_count.get_or_insert(0);
    let mut cx = Ctx {
        dv,
        obs,
        cfg,
        st,
        actions: Vec::new(),
        requeue: None,
    };
    if cx.st.phase.is_some_and(Phase::is_final) {
        cleanup_after(&mut cx);
        return cx.finish();
    }
    // A PVC populated before its DataVolume is adopted as it is, whatever the source says.
    if super::adopt::decide_adopted(&mut cx) {
        return cx.finish();
    }
    // A sourceRef stands for the DataSource's source once it is Ready.
    let resolved;
    let spec = match (&dv.spec.source, &dv.spec.source_ref, &obs.source_ref) {
        (None, Some(_), Some(SourceRef::Wait { reason, message })) => {
            wait_for_source(&mut cx, reason, message);
            return cx.finish();
        }
        (None, Some(_), Some(SourceRef::Invalid(message))) => {
            cx.fail(reason::INVALID_SPEC, message, reason::DATA_VOLUME_FAILED);
            return cx.finish();
        }
        (None, Some(_), Some(SourceRef::Pvc(p) | SourceRef::Snapshot(p))) => {
            let pvc = matches!(obs.source_ref, Some(SourceRef::Pvc(_)));
            resolved = DataVolumeSpec {
                source: Some(DataVolumeSource {
                    pvc: pvc.then(|| p.clone()),
                    snapshot: (!pvc).then(|| p.clone()),
                    ..Default::default()
                }),
                ..dv.spec.clone()
            };
            &resolved
        }
        _ => &dv.spec,
    };
    if let Some(by) = super::external::populator(dv) {
        match pvc::claim(dv, cfg, &obs.storage) {
            Ok(claim) => super::external::decide_external(&mut cx, &claim, &by),
            Err(Error::ClaimNotValid(message)) => claim_not_valid(&mut cx, &message),
            Err(e) => cx.fail(
                reason::INVALID_SPEC,
                &e.to_string(),
                reason::DATA_VOLUME_FAILED,
            ),
        }
        return cx.finish();
    }
    let checked = source::source(spec).and_then(|s| Ok((s, pvc::claim(dv, cfg, &obs.storage)?)));
    let (src, claim) = match checked {
        Ok(v) => v,
        Err(Error::ClaimNotValid(message)) => {
            claim_not_valid(&mut cx, &message);
            return cx.finish();
        }
        Err(e) => {
            cx.fail(
                reason::INVALID_SPEC,
                &e.to_string(),
                reason::DATA_VOLUME_FAILED,
            );
            return cx.finish();
        }
    };
    if cx.st.phase.is_none() {
        cx.st.phase = Some(Phase::Pending);
        cx.st.progress = Some(PROGRESS_UNKNOWN.into());
    }
    for c in [condition::READY, condition::BOUND, condition::RUNNING] {
        if status::find(&cx.st.conditions, c).is_none() {
            cx.cond(c, false, "", "");
        }
    }
    if let Source::Clone(c) = &src {
        super::clone::flow::decide_clone(&mut cx, c, &claim);
        return cx.finish();
    }
    if populated::populates(&src) && populated::uses_populator(dv, obs.pvc, obs.csi_class) {
        populated::decide_populated(&mut cx, &src, &claim);
        return cx.finish();
    }
    if !claim_ready(&mut cx, &claim) {
        return cx.finish();
    }
    let work = match &src {
        Source::Upload | Source::Clone(_) => Work::Upload,
        Source::Import(_) | Source::Blank => Work::Import,
    };
    match obs.pod {
        None => start_pod(&mut cx, &src, &claim, work),
        Some(p) if p.metadata.deletion_timestamp.is_some() => {}
        Some(p) => follow_pod(&mut cx, p, work),
    }
    cx.finish()
}

/// The sourceRef's DataSource is missing or not Ready (CDI's CloneWithoutSource): the DataVolume
/// stays Pending with the reason in Bound and Ready, a Warning event when the message is new, and
/// looks again after the first retry delay.
pub(super) fn wait_for_source(cx: &mut Ctx<'_>, why: &str, message: &str) {
    let new = status::find(&cx.st.conditions, condition::BOUND)
        .is_none_or(|c| c.message.as_deref() != Some(message));
    cx.st.phase.get_or_insert(Phase::Pending);
    cx.cond(condition::BOUND, false, why, message);
    cx.cond(condition::READY, false, why, "");
    if status::find(&cx.st.conditions, condition::RUNNING).is_none() {
        cx.cond(condition::RUNNING, false, "", "");
    }
    if new {
        cx.event(true, why, message.to_string());
    }
    cx.requeue = Some(cx.cfg.retry.delay(1));
}

/// The claim cannot be completed yet (CDI's ErrClaimNotValid): the DataVolume stays Pending, Bound
/// says why, a Warning event says so when the message is new, and the claim is tried again after
/// the first retry delay (a StorageClass or StorageProfile may appear or change meanwhile).
fn claim_not_valid(cx: &mut Ctx<'_>, message: &str) {
    let new = status::find(&cx.st.conditions, condition::BOUND)
        .is_none_or(|c| c.message.as_deref() != Some(message));
    cx.st.phase.get_or_insert(Phase::Pending);
    for c in [condition::READY, condition::RUNNING] {
        if status::find(&cx.st.conditions, c).is_none() {
            cx.cond(c, false, "", "");
        }
    }
    cx.cond(
        condition::BOUND,
        false,
        reason::ERR_CLAIM_NOT_VALID,
        message,
    );
    if new {
        cx.event(true, reason::ERR_CLAIM_NOT_VALID, message.to_string());
    }
    cx.requeue = Some(cx.cfg.retry.delay(1));
}

/// Creates the PVC or follows its binding; true when a pod may use it.
pub(super) fn claim_ready(cx: &mut Ctx<'_>, claim: &Claim) -> bool {
    let pvc_name = name(cx.dv).to_string();
    let Some(pvc) = cx.obs.pvc else {
        cx.actions
            .push(Action::CreatePvc(Box::new(pvc::desired_pvc(cx.dv, claim))));
        let msg = format!("PVC {pvc_name} Pending");
        cx.cond(condition::BOUND, false, reason::PENDING, &msg);
        return false;
    };
    match pvc_phase(pvc) {
        "Bound" => {
            let msg = format!("PVC {pvc_name} Bound");
            cx.cond(condition::BOUND, true, reason::BOUND, &msg);
            true
        }
        "Lost" => {
            cx.cond(condition::BOUND, false, reason::CLAIM_LOST, "Claim Lost");
            cx.fail(
                reason::CLAIM_LOST,
                &format!("PVC {pvc_name} lost"),
                reason::ERR_CLAIM_LOST,
            );
            false
        }
        _ => {
            let msg = format!("PVC {pvc_name} Pending");
            cx.cond(condition::BOUND, false, reason::PENDING, &msg);
            if !cx.obs.wait_for_first_consumer {
                return false;
            }
            let immediate = cx
                .dv
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(super::ANN_IMMEDIATE_BINDING));
            if cx.cfg.honor_wait_for_first_consumer && !immediate {
                cx.wait_for_first_consumer();
                return false;
            }
            // The importer pod is the first consumer: it makes the PVC bind.
            true
        }
    }
}

/// The PVC's phase (`Pending` until the API server says otherwise).
pub(super) fn pvc_phase(pvc: &PersistentVolumeClaim) -> &str {
    pvc.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// The UID of the observed PVC (upload pods and Services are keyed on it).
pub(super) fn pvc_uid(cx: &Ctx<'_>) -> String {
    cx.obs
        .pvc
        .and_then(|p| p.metadata.uid.clone())
        .unwrap_or_default()
}

pub(super) fn start_pod(cx: &mut Ctx<'_>, src: &Source, claim: &Claim, work: Work) {
    let restarts = cx.st.restart_count.unwrap_or(0).max(0) as u32;
    if restarts > 0 {
        // A retry: wait out the back-off since the failure was recorded.
        let failed_at = status::find(&cx.st.conditions, condition::RUNNING)
            .and_then(|c| c.last_heartbeat_time.clone())
            .map(|t| t.0);
        let delay = cx.cfg.retry.delay(restarts);
        if let Some(at) = failed_at {
            let elapsed = cx.now().duration_since(at).unsigned_abs();
            if elapsed < delay {
                cx.requeue = Some(delay - elapsed);
                return;
            }
        }
    }
    let w = pod::Workload::of(cx.dv);
    let p = match src {
        Source::Import(i) => pod::importer_pod(&w, i, claim, &cx.obs.refs, cx.cfg),
        Source::Blank => pod::blank_pod(&w, claim, cx.cfg),
        Source::Upload | Source::Clone(_) => {
            let archive = source::is_archive(&cx.dv.spec);
            pod::upload_pod(&w, claim, cx.cfg, &pvc_uid(cx), archive)
        }
    };
    cx.actions.push(Action::CreatePod(Box::new(p)));
    if work == Work::Upload && !cx.obs.service {
        let svc = pod::upload_service(&w, &pvc_uid(cx));
        cx.actions.push(Action::CreateService(Box::new(svc)));
    }
    if matches!(
        cx.st.phase,
        None | Some(Phase::Pending) | Some(Phase::WaitForFirstConsumer)
    ) {
        let bound = cx
            .obs
            .pvc
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Bound");
        cx.st.phase = Some(if bound {
            Phase::PvcBound
        } else {
            Phase::Pending
        });
    }
}

fn follow_pod(cx: &mut Ctx<'_>, p: &Pod, work: Work) {
    let pvc = name(cx.dv).to_string();
    let pod_name = p.metadata.name.clone().unwrap_or_default();
    match (pod_phase(p), work) {
        ("Pending", Work::Import) => {
            pending_reason(cx, p);
            cx.cond(condition::READY, false, "", "");
            cx.phase(
                Phase::ImportScheduled,
                Some((
                    false,
                    reason::IMPORT_SCHEDULED,
                    format!("Import into {pvc} scheduled"),
                )),
            );
        }
        ("Pending", Work::Upload) => {
            pending_reason(cx, p);
            cx.upload_scheduled(&pvc);
        }
        ("Running", Work::Import) => {
            cx.transfer_running();
            cx.phase(
                Phase::ImportInProgress,
                Some((
                    false,
                    reason::IMPORT_IN_PROGRESS,
                    format!("Import into {pvc} in progress"),
                )),
            );
            cx.observed_progress();
            cx.requeue = Some(cx.cfg.progress_interval);
        }
        ("Running", Work::Upload) => {
            cx.transfer_running();
            if pod_ready(p) {
                cx.phase(
                    Phase::UploadReady,
                    Some((
                        false,
                        reason::UPLOAD_READY,
                        format!("Upload into {pvc} ready"),
                    )),
                );
            } else if cx.st.phase != Some(Phase::UploadReady) {
                // a server that was ready and is not any more is writing out a finished upload
                cx.upload_scheduled(&pvc);
            }
        }
        ("Succeeded", _) => {
            let (ev, msg, done) = match work {
                Work::Import => (
                    reason::IMPORT_SUCCEEDED,
                    format!("Successfully imported into PVC {pvc}"),
                    "Import Complete",
                ),
                Work::Upload => (
                    reason::UPLOAD_SUCCEEDED,
                    format!("Successfully uploaded into {pvc}"),
                    "Upload Complete",
                ),
            };
            cx.cond(condition::RUNNING, false, reason::COMPLETED, done);
            cx.cond(condition::READY, true, "", "");
            cx.st.progress = Some(status::format_progress(100.0));
            cx.phase(Phase::Succeeded, Some((false, ev, msg)));
            remove_pod(cx, pod_name, work);
        }
        ("Failed", _) => pod_failed(cx, p, pod_name, work),
        _ => {}
    }
}

/// Deletes the pod; the upload Service goes only once the DataVolume is finished (a restarted
/// upload server keeps its address).
pub(super) fn remove_pod(cx: &mut Ctx<'_>, pod_name: String, work: Work) {
    cx.actions.push(Action::DeletePod(pod_name));
    if work == Work::Upload && cx.obs.service && cx.st.phase.is_some_and(Phase::is_final) {
        cx.actions
            .push(Action::DeleteService(pod::upload_name(name(cx.dv))));
    }
}

pub(super) fn pod_failed(cx: &mut Ctx<'_>, p: &Pod, pod_name: String, work: Work) {
    let pvc = name(cx.dv).to_string();
    let (code, msg) = terminated(p).unwrap_or((-1, "the pod failed".into()));
    let failure = classify(code);
    let (ev, retry_ev, what) = match work {
        Work::Import => (
            reason::IMPORT_FAILED,
            reason::IMPORT_RETRYING,
            format!("Failed to import into PVC {pvc}"),
        ),
        Work::Upload => (
            reason::UPLOAD_FAILED,
            reason::UPLOAD_RETRYING,
            format!("Upload into {pvc} failed"),
        ),
    };
    let restarts = cx.st.restart_count.unwrap_or(0).max(0) as u32;
    let max = cx.cfg.retry.max_restarts;
    if !failure.retryable {
        let message = format!("{what}: {msg} (exit code {code}, not retried)");
        cx.fail(&failure.reason, &message, ev);
    } else if restarts >= max {
        let message =
            format!("{what}: {msg} (exit code {code}; giving up after {restarts} restarts)");
        cx.fail(&failure.reason, &message, ev);
    } else {
        let n = restarts + 1;
        let delay = cx.cfg.retry.delay(n);
        let message = format!(
            "{what}: {msg} (exit code {code}; restart {n} of {max} in {}s)",
            delay.as_secs()
        );
        cx.cond(condition::RUNNING, false, &failure.reason, &message);
        cx.cond(condition::READY, false, "", "");
        // Its own reason: the final failure must not read as one more of the same.
        cx.event(true, retry_ev, message);
        cx.st.restart_count = Some(n as i32);
        cx.requeue = Some(delay);
    }
    remove_pod(cx, pod_name, work);
}

/// A finished DataVolume keeps no pod or Service behind.
pub(super) fn cleanup_after(cx: &mut Ctx<'_>) {
    if let Some(p) = cx.obs.pod
        && p.metadata.deletion_timestamp.is_none()
    {
        cx.actions.push(Action::DeletePod(
            p.metadata.name.clone().unwrap_or_default(),
        ));
    }
    if cx.obs.service {
        cx.actions
            .push(Action::DeleteService(pod::upload_name(name(cx.dv))));
    }
}
