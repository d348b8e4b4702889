//! Local-mode clones (`quarry apply` of a DataVolume with `spec.source.pvc`, `spec.source.snapshot`
//! or `spec.sourceRef` to a local DataSource): the target volume is made from the source volume
//! or snapshot of the same pool by the provisioner's own clone code (reflink, else sparse copy),
//! exactly as the CSI driver's CreateVolume with a content source, at the source's size; a larger
//! target is then expanded as CDI does it (the volume grown, then its `disk.img`, as
//! `quarry resize-disk`). Local PVC `namespace/name` is pool volume `namespace-name`.
//!
//! A missing source leaves the DataVolume Pending with CDI's `CloneWithoutSource` (there is no
//! controller to wait for it to appear); a sourceRef whose DataSource is not ready likewise.

use k8s_openapi::jiff::Timestamp;
use provisioner::meta::ContentSource;
use provisioner::meta::VolumeMode as PoolMode;
use provisioner::{CapacityRange, CreateVolume, Provisioner};

use super::datasource::{refresh, volume_id};
use super::datavolume::{ApplyOptions, Store};
use super::store::ObjectStore;
use crate::datavolume::clone::{SourceRef, reason as clone_reason, resolve_source_ref};
use crate::datavolume::pvc::{Claim, StorageDefaults, VolumeMode, claim};
use crate::datavolume::status::{PROGRESS_UNKNOWN, format_progress, reason, set_condition};
use crate::settings::Config;
use api::datavolume::{SourcePvc, condition};
use api::golden::DataSource;
use api::{DataVolume, Phase};
use kubekit::error::{Error, Result};

/// True when the DataVolume clones (a PVC or snapshot source, or a sourceRef).
pub fn is_clone(dv: &DataVolume) -> bool {
    let src = dv.spec.source.as_ref();
    dv.spec.source_ref.is_some() || src.is_some_and(|s| s.pvc.is_some() || s.snapshot.is_some())
}

/// What the clone copies: a pool volume or a pool snapshot, by local name.
#[derive(Debug, Clone, PartialEq)]
enum Origin {
    Volume(SourcePvc),
    Snapshot(SourcePvc),
}

/// The clone's source, or the reason it cannot start (`Err((reason, message))`).
fn origin(
    dv: &DataVolume,
    ns: &str,
    opts: &ApplyOptions,
    prov: &Provisioner,
) -> Result<std::result::Result<Origin, (&'static str, String)>> {
    let in_ns = |p: &SourcePvc| SourcePvc {
        namespace: if p.namespace.is_empty() {
            ns.to_string()
        } else {
            p.namespace.clone()
        },
        name: p.name.clone(),
    };
    if let Some(r) = &dv.spec.source_ref {
        // The DataSources the reference may pass through (one deep), their Ready refreshed.
        let store = ObjectStore::<DataSource>::new(&opts.state_dir);
        let mut found = Vec::new();
        let mut at = (
            r.namespace.clone().unwrap_or_else(|| ns.into()),
            r.name.clone(),
        );
        for _ in 0..2 {
            let Some(ds) = store.get(&at.0, &at.1)? else {
                break;
            };
            let ds = refresh(ds, &opts.state_dir, prov)?;
            let next = ds.spec.source.data_source.clone();
            found.push(ds);
            match next {
                Some(n) if n.namespace.is_empty() => at.1 = n.name,
                Some(n) => at = (n.namespace, n.name),
                None => break,
            }
        }
        let lookup = |n: &str, m: &str| {
            found.iter().find(|d| {
                d.metadata.namespace.as_deref() == Some(n) && d.metadata.name.as_deref() == Some(m)
            })
        };
        return Ok(match resolve_source_ref(ns, r, lookup) {
            SourceRef::Pvc(p) => Ok(Origin::Volume(p)),
            SourceRef::Snapshot(s) => Ok(Origin::Snapshot(s)),
            SourceRef::Wait { reason, message } => Err((reason, message)),
            SourceRef::Invalid(why) => return Err(Error::invalid(why)),
        });
    }
    let src = dv.spec.source.as_ref().expect("is_clone checked it");
    Ok(match (&src.pvc, &src.snapshot) {
        (Some(p), None) => Ok(Origin::Volume(in_ns(p))),
        (None, Some(s)) => Ok(Origin::Snapshot(in_ns(s))),
        _ => return Err(Error::invalid("spec.source names more than one source")),
    })
}

/// Writes the clone's status: phase, the Bound/Ready/Running conditions, progress.
fn set_status(dv: &mut DataVolume, phase: Phase, why: (&str, &str), store: &Store) -> Result<()> {
    let now = Timestamp::now();
    let mut st = dv.status.take().unwrap_or_default();
    st.phase = Some(phase);
    let (r, message) = why;
    let done = phase == Phase::Succeeded;
    let bound = !matches!(phase, Phase::Pending);
    st.progress = Some(if done {
        format_progress(100.0)
    } else {
        PROGRESS_UNKNOWN.into()
    });
    let bound_reason = if bound { reason::BOUND } else { r };
    let bound_message = if bound { "PVC Bound" } else { message };
    set_condition(
        &mut st.conditions,
        condition::BOUND,
        bound,
        bound_reason,
        bound_message,
        now,
    );
    set_condition(&mut st.conditions, condition::READY, done, r, message, now);
    let running = matches!(phase, Phase::CloneInProgress);
    set_condition(
        &mut st.conditions,
        condition::RUNNING,
        running,
        r,
        message,
        now,
    );
    dv.status = Some(st);
    store.save(dv)
}

/// Why a clone does not start: the phase to record, its reason and message.
type Stop = (Phase, &'static str, String);

/// A clone ready to run: what it copies and the target's claim.
struct Plan {
    origin: Origin,
    kind: &'static str,
    src: SourcePvc,
    src_id: String,
    src_size: u64,
    claim: Claim,
}

/// Resolves the source, finds it in the pool and checks the target's claim against it.
fn plan(
    dv: &DataVolume,
    opts: &ApplyOptions,
    prov: &Provisioner,
    cfg: &Config,
) -> Result<std::result::Result<Plan, Stop>> {
    let ns = dv.metadata.namespace.as_deref().unwrap_or("default");
    let origin = match origin(dv, ns, opts, prov) {
        Ok(Ok(o)) => o,
        Ok(Err((r, message))) => return Ok(Err((Phase::Pending, r, message))),
        Err(e) => return Ok(Err((Phase::Failed, reason::INVALID_SPEC, e.to_string()))),
    };
    let (kind, src) = match &origin {
        Origin::Volume(p) => ("pvc", p.clone()),
        Origin::Snapshot(s) => ("snapshot", s.clone()),
    };
    let src_id = volume_id(&src.namespace, &src.name);
    let src_size = match &origin {
        Origin::Volume(_) => prov.find_volume(&src_id)?.map(|(_, m)| m.capacity_bytes),
        Origin::Snapshot(_) => prov.snapshot(&src_id).ok().map(|(_, m)| m.size_bytes),
    };
    let Some(src_size) = src_size else {
        // CDI's event and condition when the source is missing.
        let message = format!("The source {kind} {} doesn't exist", src.name);
        return Ok(Err((
            Phase::Pending,
            clone_reason::CLONE_WITHOUT_SOURCE,
            message,
        )));
    };
    let claim = match claim(dv, cfg, &StorageDefaults::Builtin) {
        Ok(c) if c.size < src_size => {
            let message = format!(
                "target resources requests storage size is smaller than the source: {} < {src_size}",
                c.size
            );
            return Ok(Err((Phase::Failed, reason::INVALID_SPEC, message)));
        }
        Ok(c) => c,
        Err(e) => return Ok(Err((Phase::Failed, reason::INVALID_SPEC, e.to_string()))),
    };
    Ok(Ok(Plan {
        origin,
        kind,
        src,
        src_id,
        src_size,
        claim,
    }))
}

/// Makes the target volume from the source at the source's size (as a CSI clone), then expands
/// it like any PVC: the volume, then a filesystem volume's image.
fn make(prov: &Provisioner, volume: &str, p: &Plan) -> std::result::Result<(), String> {
    let c = &p.claim;
    let mode = match c.mode {
        VolumeMode::Filesystem => PoolMode::Filesystem,
        VolumeMode::Block => PoolMode::Block,
    };
    let at_least = |required| CapacityRange { required, limit: 0 };
    prov.create_volume(&CreateVolume {
        name: volume.to_string(),
        capacity: at_least(p.src_size),
        mode,
        pool: None,
        source: Some(match p.origin {
            Origin::Volume(_) => ContentSource::Volume(p.src_id.clone()),
            Origin::Snapshot(_) => ContentSource::Snapshot(p.src_id.clone()),
        }),
        parameters: Default::default(),
        ephemeral: false,
    })
    .map_err(|e| e.to_string())?;
    if c.size > p.src_size {
        prov.expand_volume(volume, at_least(c.size))
            .map_err(|e| e.to_string())?;
        if c.mode == VolumeMode::Filesystem {
            let (_, dir, _) = prov.volume_paths(volume).map_err(|e| e.to_string())?;
            let image = dir.join(provisioner::pool::BLOCK_FILE);
            importer::resize::resize_disk(&image, c.size, Some(c.overhead))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Runs a clone DataVolume to Succeeded (or Pending/Failed, saying why) in the local pool.
/// `volume` is the target's pool volume.
pub fn apply(
    mut dv: DataVolume,
    opts: &ApplyOptions,
    store: &Store,
    prov: &Provisioner,
    volume: &str,
    cfg: &Config,
) -> Result<DataVolume> {
    let p = match plan(&dv, opts, prov, cfg)? {
        Ok(p) => p,
        Err((phase, r, message)) => {
            set_status(&mut dv, phase, (r, &message), store)?;
            return Ok(dv);
        }
    };
    let from = format!("{} {}/{}", p.kind, p.src.namespace, p.src.name);
    set_status(
        &mut dv,
        Phase::CloneScheduled,
        ("CloneScheduled", "Cloning scheduled"),
        store,
    )?;
    let cloning = format!("Cloning from {from}");
    set_status(
        &mut dv,
        Phase::CloneInProgress,
        ("CloneInProgress", &cloning),
        store,
    )?;
    match make(prov, volume, &p) {
        Ok(()) => {
            tracing::info!(source = %p.src_id, target = %volume, "clone succeeded");
            let done = (reason::COMPLETED, "Successfully cloned");
            set_status(&mut dv, Phase::Succeeded, done, store)?;
        }
        Err(e) => {
            let message = format!("cloning {from}: {e}");
            set_status(&mut dv, Phase::Failed, ("CloneFailed", &message), store)?;
        }
    }
    Ok(dv)
}
