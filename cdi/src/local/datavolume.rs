//! `quarry apply -f dv.yaml` and `quarry get dv` without a cluster: the same [`decide`] state
//! machine, driven by local stand-ins. The PVC is a volume of the [`provisioner`] in a pool
//! directory; the importer pod is an in-process [`importer::import::import`] (or, for a blank
//! disk, [`importer::import::import_from`] of nothing) on a thread whose
//! outcome becomes the pod's phase and exit code. Statuses are YAML files in a state directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use importer::archive::{extract, extract_from};
use importer::import::{ImportRequest, import, import_from};
use importer::progress::Progress;
use importer::source::Blank;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, PersistentVolumeClaim,
    PersistentVolumeClaimStatus, Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use provisioner::{CapacityRange, CreateVolume, PoolConfig, Provisioner};

use crate::datavolume::adopt;
use crate::datavolume::pod::{SourceRefs, importer_pod_name};
use crate::datavolume::pvc::{StorageDefaults, VolumeMode, claim};
use crate::datavolume::request::{SourceObjects, import_request};
use crate::datavolume::source::{Source, source};
use crate::datavolume::{Action, Observed, decide, name};
use crate::settings::{Config, RetryPolicy};
use api::{DataVolume, Phase};
use kubekit::error::{Error, Result};

/// Where local DataVolumes live by default (`$QUARRY_STATE_DIR` overrides it).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/quarry";

/// The state directory from the environment, else the default.
pub fn default_state_dir() -> PathBuf {
    std::env::var_os("QUARRY_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
}

/// Local DataVolume statuses: `<dir>/datavolumes/<namespace>/<name>.yaml`.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// A store in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Store { dir: dir.into() }
    }

    fn path(&self, ns: &str, name: &str) -> PathBuf {
        self.dir
            .join("datavolumes")
            .join(ns)
            .join(format!("{name}.yaml"))
    }

    /// Writes a DataVolume atomically (a reader never sees half a file).
    pub fn save(&self, dv: &DataVolume) -> Result<()> {
        let path = self.path(&namespace(dv), name(dv));
        let dir = path.parent().expect("a state file has a directory");
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let text = to_yaml(dv)?;
        let tmp = path.with_extension("yaml.tmp");
        std::fs::write(&tmp, text)
            .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| Error::io(format!("renaming {}", tmp.display()), e))
    }

    /// Reads one DataVolume.
    pub fn load(&self, ns: &str, name: &str) -> Result<DataVolume> {
        let path = self.path(ns, name);
        match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::invalid(format!(
                "datavolume {ns}/{name} not found in {}",
                self.dir.display()
            ))),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Every DataVolume of a namespace, by name.
    pub fn list(&self, ns: &str) -> Result<Vec<DataVolume>> {
        super::store::ObjectStore::<DataVolume>::new(&self.dir)
            .names(ns)?
            .iter()
            .map(|n| self.load(ns, n))
            .collect()
    }
}

fn namespace(dv: &DataVolume) -> String {
    dv.metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into())
}

/// A DataVolume as YAML.
pub fn to_yaml(dv: &DataVolume) -> Result<String> {
    let v = serde_json::to_value(dv).map_err(|e| Error::Yaml {
        context: "serialising the DataVolume".into(),
        message: e.to_string(),
    })?;
    serde_saphyr::to_string(&v).map_err(|e| Error::Yaml {
        context: "writing YAML".into(),
        message: e.to_string(),
    })
}

/// Reads a DataVolume manifest (YAML or JSON), checking its kind.
pub fn parse(text: &str, what: &str) -> Result<DataVolume> {
    let v: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| Error::Yaml {
        context: what.into(),
        message: e.to_string(),
    })?;
    let (api_version, kind) = (v["apiVersion"].as_str(), v["kind"].as_str());
    if api_version != Some("cdi.kubevirt.io/v1beta1") || kind != Some("DataVolume") {
        return Err(Error::invalid(format!(
            "{what}: expected apiVersion cdi.kubevirt.io/v1beta1, kind DataVolume (got {}, {})",
            api_version.unwrap_or("none"),
            kind.unwrap_or("none")
        )));
    }
    let dv: DataVolume = serde_json::from_value(v.clone()).map_err(|e| Error::Yaml {
        context: what.into(),
        message: e.to_string(),
    })?;
    if dv.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err(Error::invalid(format!("{what}: metadata.name is required")));
    }
    let known = serde_json::to_value(&dv).unwrap_or_default();
    let mut unknown = Vec::new();
    unknown_fields(&v, &known, "", &mut unknown);
    for field in unknown {
        // As kubectl warns (the API server drops such fields).
        eprintln!("Warning: unknown field \"{field}\" in {what}");
    }
    Ok(dv)
}

/// The paths of `given` (the manifest as written) that `known` (the manifest as the DataVolume
/// type reads it back) lacks. Empty values are not counted: the type may just omit them.
fn unknown_fields(
    given: &serde_json::Value,
    known: &serde_json::Value,
    path: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Object(o) => o.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    match (given, known) {
        (Value::Object(g), Value::Object(k)) => {
            for (key, value) in g {
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match k.get(key) {
                    Some(kv) => unknown_fields(value, kv, &at, out),
                    None if !empty(value) => out.push(at),
                    None => {}
                }
            }
        }
        (Value::Array(g), Value::Array(k)) => {
            for (i, (gv, kv)) in g.iter().zip(k).enumerate() {
                unknown_fields(gv, kv, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// What `quarry apply` needs besides the manifest.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// The pool directory volumes are created in.
    pub pool: PathBuf,
    /// Where statuses are written.
    pub state_dir: PathBuf,
    /// Secrets and ConfigMaps as directories, `<dir>/<name>/<key>` (as Kubernetes mounts them).
    pub secrets_dir: Option<PathBuf>,
    /// Retries of retryable failures.
    pub retry: RetryPolicy,
    /// Registries (`HOST[:PORT]`) reached over plain HTTP or without verifying TLS, as the
    /// controller's `--insecure-registry` (CDI's `insecureRegistries`).
    pub insecure_registries: Vec<String>,
}

/// The local PVC: bound as soon as the provisioner made the volume.
fn bound_pvc() -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        status: Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The stand-in PVC of an existing volume, populated for the DataVolume: it is adopted.
fn populated_pvc(dv: &DataVolume) -> PersistentVolumeClaim {
    let mut pvc = bound_pvc();
    pvc.metadata.annotations = Some(
        [(adopt::ANN_POPULATED_FOR.to_string(), name(dv).to_string())]
            .into_iter()
            .collect(),
    );
    pvc
}

/// The stand-in importer pod in `phase`, with the exit code and message once finished.
fn local_pod(dv: &DataVolume, phase: &str, exit: Option<(i32, String)>) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(importer_pod_name(name(dv)));
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        container_statuses: exit.map(|(code, message)| {
            vec![ContainerStatus {
                name: "importer".into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: code,
                        message: Some(format!("error: {message}")),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]
        }),
        ..Default::default()
    });
    p
}

/// The local pool's provisioner; a missing pool directory is made, as the CSI driver makes its
/// pools' directories.
pub fn open_pool(pool: &Path) -> Result<Provisioner> {
    std::fs::create_dir_all(pool)
        .map_err(|e| Error::io(format!("creating the pool directory {}", pool.display()), e))?;
    let pools = [PoolConfig {
        mounted: false,
        name: "local".into(),
        path: std::fs::canonicalize(pool)
            .map_err(|e| Error::io(format!("pool directory {}", pool.display()), e))?,
        quota: Default::default(),
    }];
    Ok(Provisioner::open(&pools)?)
}

type Worker = JoinHandle<importer::Result<()>>;

/// What the local importer pod runs: an import of a named source, or of a blank disk.
enum Job {
    Named(ImportRequest),
    Blank(ImportRequest<()>),
}

impl Job {
    /// The import, or with `archive` the extraction into the volume's directory.
    fn run(self, archive: bool, progress: Arc<Progress>) -> importer::Result<()> {
        match (self, archive) {
            (Job::Named(req), false) => import(&req, progress).map(drop),
            (Job::Named(req), true) => extract(&req, progress).map(drop),
            (Job::Blank(req), false) => {
                import_from(Box::new(Blank::default()), &req, progress).map(drop)
            }
            (Job::Blank(req), true) => {
                extract_from(Box::new(Blank::default()), &req, progress).map(drop)
            }
        }
    }
}

/// Runs a DataVolume to Succeeded or Failed against the local pool, writing its status as it
/// goes; `progress` is shared with the caller (for a progress bar).
pub fn apply(
    mut dv: DataVolume,
    opts: &ApplyOptions,
    progress: Arc<Progress>,
) -> Result<DataVolume> {
    let store = Store::new(&opts.state_dir);
    let ns = namespace(&dv);
    dv.metadata.namespace = Some(ns.clone());
    if let Ok(existing) = store.load(&ns, name(&dv))
        && existing.spec == dv.spec
        && existing.status.as_ref().and_then(|s| s.phase) == Some(Phase::Succeeded)
    {
        return Ok(existing);
    }
    dv.metadata.creation_timestamp = Some(Time(Timestamp::now()));
    if dv.metadata.uid.is_none() {
        dv.metadata.uid = Some(local_uid(&ns, name(&dv)));
    }
    dv.status = None;
    let cfg = Config {
        retry: opts.retry.clone(),
        ..Config::default()
    };
    let volume = format!("{ns}-{}", name(&dv));
    // A prePopulated DataVolume adopts its volume as it is, whatever its source.
    let adopted = if adopt::pre_populated(&dv) {
        match open_pool(&opts.pool)?.volume_paths(&volume) {
            Ok(_) => Some(populated_pvc(&dv)),
            Err(e) => {
                let message = format!(
                    "the DataVolume is {}, but its volume {volume} cannot be used: {e}",
                    adopt::ANN_PRE_POPULATED
                );
                return refuse(dv, &store, &message);
            }
        }
    } else {
        None
    };
    if adopted.is_none() && matches!(source(&dv.spec), Ok(Source::Upload)) {
        const MESSAGE: &str = "source.upload needs a client to upload to: run `quarry \
             upload-server --target POOL/NAMESPACE-NAME/disk.img` and `quarry upload` instead of \
             `quarry apply`";
        return refuse(dv, &store, MESSAGE);
    }
    let prov = open_pool(&opts.pool)?;
    if adopted.is_none() && super::clone::is_clone(&dv) {
        return super::clone::apply(dv, opts, &store, &prov, &volume, &cfg);
    }

    let mut pvc: Option<PersistentVolumeClaim> = adopted;
    let mut pod: Option<Pod> = None;
    let mut worker: Option<Worker> = None;
    loop {
        if worker.as_ref().is_some_and(|w| w.is_finished()) {
            let outcome = worker.take().expect("checked").join();
            pod = Some(match outcome {
                Ok(Ok(_)) => local_pod(&dv, "Succeeded", Some((0, String::new()))),
                Ok(Err(e)) => local_pod(&dv, "Failed", Some((e.kind().exit_code(), e.to_string()))),
                Err(_) => local_pod(
                    &dv,
                    "Failed",
                    Some((1, "the import thread panicked".into())),
                ),
            });
        }
        let observed = Observed {
            pvc: pvc.as_ref(),
            pod: pod.as_ref(),
            service: false,
            wait_for_first_consumer: false,
            // No populator runs in local mode: the import runs here.
            csi_class: None,
            progress: worker.as_ref().and_then(|_| progress.percent()),
            refs: SourceRefs::default(),
            storage: StorageDefaults::Builtin,
            source_ref: None,
            clone: Default::default(),
            // A local import runs in-process: no API server refuses it.
            refused: None,
            now: Timestamp::now(),
        };
        let d = decide(&dv, &observed, &cfg);
        let changed = dv.status.as_ref() != Some(&d.status);
        dv.status = Some(d.status);
        if changed {
            store.save(&dv)?;
        }
        let mut acted = false;
        for action in d.actions {
            acted = true;
            match action {
                Action::CreatePvc(_) => {
                    let c = claim(&dv, &cfg, &StorageDefaults::Builtin)?;
                    prov.create_volume(&CreateVolume {
                        name: volume.clone(),
                        capacity: CapacityRange {
                            required: c.size,
                            limit: 0,
                        },
                        mode: match c.mode {
                            VolumeMode::Filesystem => provisioner::meta::VolumeMode::Filesystem,
                            VolumeMode::Block => provisioner::meta::VolumeMode::Block,
                        },
                        pool: None,
                        source: None,
                        parameters: Default::default(),
                        ephemeral: false,
                    })?;
                    pvc = Some(bound_pvc());
                }
                Action::CreatePod(_) => pod = Some(local_pod(&dv, "Pending", None)),
                Action::DeletePod(_) => pod = None,
                // Local mode has no upload servers.
                Action::CreateService(_)
                | Action::DeleteService(_)
                | Action::EnsureUploadSecret { .. } => {}
                // Clones are refused above.
                Action::CreateSnapshot(_)
                | Action::DeleteSnapshot(_)
                | Action::CreateSourcePod(_)
                | Action::DeleteSourcePod { .. }
                | Action::CreateRestore(_)
                | Action::DeleteRestore { .. }
                | Action::ExpandPvc(_) => {}
                // Local volumes have no owners.
                Action::AdoptPvc { .. } => {}
                // No populator runs here (`csi_class: None`): the import runs in-process.
                Action::CreatePopulatorSource(_) => {}
                Action::Event(e) => {
                    tracing::info!(reason = %e.reason, warning = e.warning, "{}", e.message)
                }
            }
        }
        let phase = dv.status.as_ref().and_then(|s| s.phase);
        if phase.is_some_and(Phase::is_final) {
            return Ok(dv);
        }
        // The scheduled pod starts once ImportScheduled has been recorded.
        if phase == Some(Phase::ImportScheduled) && worker.is_none() && pod.is_some() {
            let (_, dir, _) = prov.volume_paths(&volume)?;
            // An archive is extracted into the volume's directory itself.
            let archive = crate::datavolume::source::is_archive(&dv.spec);
            let target = if archive {
                dir
            } else {
                dir.join(provisioner::pool::BLOCK_FILE)
            };
            let job = match source(&dv.spec)? {
                Source::Import(i) => Job::Named(import_request(
                    &i,
                    target,
                    &claim(&dv, &cfg, &StorageDefaults::Builtin)?,
                    dv.spec.preallocation == Some(true),
                    &SourceObjects::from_dir(&i, opts.secrets_dir.as_deref())?,
                    &opts.insecure_registries,
                )?),
                _ => {
                    let mut r = ImportRequest::new((), target);
                    let c = claim(&dv, &cfg, &StorageDefaults::Builtin)?;
                    r.size = Some(c.size);
                    r.filesystem_overhead = Some(c.overhead);
                    Job::Blank(r)
                }
            };
            reset(&progress);
            let p = progress.clone();
            worker = Some(std::thread::spawn(move || job.run(archive, p)));
            pod = Some(local_pod(&dv, "Running", None));
            continue;
        }
        let pause = match (&worker, d.requeue) {
            (Some(_), _) => Duration::from_millis(250),
            (None, Some(r)) => r,
            (None, None) if acted => Duration::ZERO,
            (None, None) => Duration::from_millis(100),
        };
        std::thread::sleep(pause);
    }
}

/// A DataVolume local mode cannot run (an upload source has no client here; a prePopulated
/// one has no volume) is recorded as Failed with `message`, so `quarry get dv` shows why.
fn refuse(mut dv: DataVolume, store: &Store, message: &str) -> Result<DataVolume> {
    use crate::datavolume::status::{PROGRESS_UNKNOWN, reason, set_condition};
    use api::datavolume::condition;
    let now = Timestamp::now();
    let mut st = dv.status.take().unwrap_or_default();
    st.phase = Some(Phase::Failed);
    st.progress = Some(PROGRESS_UNKNOWN.into());
    for c in [condition::READY, condition::RUNNING] {
        set_condition(
            &mut st.conditions,
            c,
            false,
            reason::INVALID_SPEC,
            message,
            now,
        );
    }
    set_condition(&mut st.conditions, condition::BOUND, false, "", "", now);
    dv.status = Some(st);
    store.save(&dv)?;
    Ok(dv)
}

/// Zeroes the counters before an attempt (a retry starts over).
fn reset(p: &Progress) {
    use std::sync::atomic::Ordering::Relaxed;
    for c in [
        &p.source_read,
        &p.source_length,
        &p.written,
        &p.data_written,
        &p.virtual_size,
    ] {
        c.store(0, Relaxed);
    }
}

/// A stable UID for a local DataVolume (the importer's progress metric label).
fn local_uid(ns: &str, name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        ns,
        name,
        std::process::id(),
        Timestamp::now().as_nanosecond(),
    )
        .hash(&mut h);
    format!("local-{:016x}", h.finish())
}

/// kubectl's short age: `45s`, `3m12s`, `25m`, `5h3m`, `20h`, `3d4h`, `12d`.
pub fn age(secs: i64) -> String {
    let s = secs.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        format!("{m}m{}s", s % 60)
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        format!("{h}h{}m", m % 60)
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        format!("{d}d{}h", h % 24)
    } else {
        format!("{d}d")
    }
}

/// The `kubectl get dv` table: NAME PHASE PROGRESS RESTARTS AGE.
pub fn table(dvs: &[DataVolume], now: Timestamp) -> String {
    let rows: Vec<[String; 5]> = dvs
        .iter()
        .map(|dv| {
            let st = dv.status.clone().unwrap_or_default();
            let age_s = dv
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| now.duration_since(t.0).as_secs())
                .unwrap_or(0);
            [
                dv.name_any(),
                st.phase.map(|p| p.as_str().to_string()).unwrap_or_default(),
                st.progress.unwrap_or_default(),
                st.restart_count.unwrap_or(0).to_string(),
                age(age_s),
            ]
        })
        .collect();
    let header = ["NAME", "PHASE", "PROGRESS", "RESTARTS", "AGE"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (c, w)) in r.iter().zip(widths).enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}   "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        for (s, want) in [
            (5, "5s"),
            (119, "119s"),
            (192, "3m12s"),
            (25 * 60, "25m"),
            (5 * 3600 + 180, "5h3m"),
            (20 * 3600, "20h"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (12 * 86400, "12d"),
        ] {
            assert_eq!(age(s), want);
        }
    }

    #[test]
    fn unknown_fields_are_found_at_any_depth() {
        let text = "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: a, labels: {}}\nspec:\n  sourc: {}\n  source: {http: {url: 'http://x/a.img', sha256: abc}}\n  storage: {resources: {requests: {storage: 1Mi}}, acessModes: [ReadWriteOnce]}\n  contentTyp: kubevirt\n";
        let v: serde_json::Value = serde_saphyr::from_str(text).unwrap();
        let dv = parse(text, "x").unwrap();
        let mut unknown = Vec::new();
        unknown_fields(&v, &serde_json::to_value(&dv).unwrap(), "", &mut unknown);
        unknown.sort();
        assert_eq!(
            unknown,
            [
                "spec.contentTyp",
                "spec.source.http.sha256",
                "spec.storage.acessModes"
            ]
        );
    }

    #[test]
    fn manifests_must_be_datavolumes_with_names() {
        let ok = "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: a}\nspec: {source: {blank: {}}, storage: {resources: {requests: {storage: 1Mi}}}}\n";
        assert_eq!(parse(ok, "x").unwrap().name_any(), "a");
        let wrong = ok.replace("DataVolume", "PersistentVolumeClaim");
        assert!(
            parse(&wrong, "x")
                .unwrap_err()
                .to_string()
                .contains("kind DataVolume")
        );
        let unnamed = ok.replace("{name: a}", "{}");
        assert!(
            parse(&unnamed, "x")
                .unwrap_err()
                .to_string()
                .contains("metadata.name")
        );
        assert!(parse("{{{", "x").is_err());
    }

    #[test]
    fn the_table_lines_up_columns() {
        let mut dv = parse(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: fedora}\nspec: {}\n",
            "x",
        )
        .unwrap();
        let now = Timestamp::from_second(1_800_000_100).unwrap();
        dv.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_800_000_000).unwrap()));
        dv.status = Some(api::DataVolumeStatus {
            phase: Some(Phase::ImportInProgress),
            progress: Some("45.50%".into()),
            restart_count: Some(1),
            ..Default::default()
        });
        assert_eq!(
            table(&[dv], now),
            "NAME     PHASE              PROGRESS   RESTARTS   AGE\n\
             fedora   ImportInProgress   45.50%     1          100s\n"
        );
    }
}
