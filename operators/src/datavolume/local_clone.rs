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

use super::Config;
use super::clone::{SourceRef, reason as clone_reason, resolve_source_ref};
use super::local::{ApplyOptions, Store};
use super::pvc::{StorageDefaults, VolumeMode, claim};
use super::status::{PROGRESS_UNKNOWN, format_progress, reason, set_condition};
use crate::api::datavolume::{SourcePvc, condition};
use crate::api::{DataVolume, Phase};
use crate::error::{Error, Result};
use crate::golden::local_store::{DataSourceStore, refresh, volume_id};

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
        let store = DataSourceStore::new(&opts.state_dir);
        let mut found = Vec::new();
        let mut at = (
            r.namespace.clone().unwrap_or_else(|| ns.into()),
            r.name.clone(),
        );
        for _ in 0..2 {
            let Some(ds) = store.load(&at.0, &at.1)? else {
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
    let ns = dv
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let origin = match origin(&dv, &ns, opts, prov) {
        Ok(Ok(o)) => o,
        Ok(Err((r, message))) => {
            set_status(&mut dv, Phase::Pending, (r, &message), store)?;
            return Ok(dv);
        }
        Err(e) => {
            set_status(
                &mut dv,
                Phase::Failed,
                (reason::INVALID_SPEC, &e.to_string()),
                store,
            )?;
            return Ok(dv);
        }
    };
    let (kind, src) = match &origin {
        Origin::Volume(p) => ("pvc", p),
        Origin::Snapshot(s) => ("snapshot", s),
    };
    let src_id = volume_id(&src.namespace, &src.name);
    let src_size = match &origin {
        Origin::Volume(_) => prov.find_volume(&src_id)?.map(|(_, m)| m.capacity_bytes),
        Origin::Snapshot(_) => prov.snapshot(&src_id).ok().map(|(_, m)| m.size_bytes),
    };
    let Some(src_size) = src_size else {
        // CDI's event and condition when the source is missing.
        let message = format!("The source {kind} {} doesn't exist", src.name);
        set_status(
            &mut dv,
            Phase::Pending,
            (clone_reason::CLONE_WITHOUT_SOURCE, &message),
            store,
        )?;
        return Ok(dv);
    };
    let c = match claim(&dv, cfg, &StorageDefaults::Builtin) {
        Ok(c) => c,
        Err(e) => {
            set_status(
                &mut dv,
                Phase::Failed,
                (reason::INVALID_SPEC, &e.to_string()),
                store,
            )?;
            return Ok(dv);
        }
    };
    if c.size < src_size {
        let message = format!(
            "target resources requests storage size is smaller than the source: {} < {src_size}",
            c.size
        );
        set_status(
            &mut dv,
            Phase::Failed,
            (reason::INVALID_SPEC, &message),
            store,
        )?;
        return Ok(dv);
    }
    set_status(
        &mut dv,
        Phase::CloneScheduled,
        ("CloneScheduled", "Cloning scheduled"),
        store,
    )?;
    set_status(
        &mut dv,
        Phase::CloneInProgress,
        (
            "CloneInProgress",
            &format!("Cloning from {kind} {}/{}", src.namespace, src.name),
        ),
        store,
    )?;
    let made = (|| -> std::result::Result<(), String> {
        let mode = match c.mode {
            VolumeMode::Filesystem => PoolMode::Filesystem,
            VolumeMode::Block => PoolMode::Block,
        };
        // At the source's size, as a CSI clone; then expanded like any PVC.
        prov.create_volume(&CreateVolume {
            name: volume.to_string(),
            capacity: CapacityRange {
                required: src_size,
                limit: 0,
            },
            mode,
            pool: None,
            source: Some(match origin {
                Origin::Volume(_) => ContentSource::Volume(src_id.clone()),
                Origin::Snapshot(_) => ContentSource::Snapshot(src_id.clone()),
            }),
            parameters: Default::default(),
            ephemeral: false,
        })
        .map_err(|e| e.to_string())?;
        if c.size > src_size {
            prov.expand_volume(
                volume,
                CapacityRange {
                    required: c.size,
                    limit: 0,
                },
            )
            .map_err(|e| e.to_string())?;
            if c.mode == VolumeMode::Filesystem {
                let (_, dir, _) = prov.volume_paths(volume).map_err(|e| e.to_string())?;
                let image = dir.join(provisioner::pool::BLOCK_FILE);
                importer::resize::resize_disk(&image, c.size, Some(c.overhead))
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    })();
    match made {
        Ok(()) => {
            tracing::info!(source = %src_id, target = %volume, "clone succeeded");
            set_status(
                &mut dv,
                Phase::Succeeded,
                (reason::COMPLETED, "Successfully cloned"),
                store,
            )?;
        }
        Err(e) => {
            let message = format!("cloning {kind} {}/{}: {e}", src.namespace, src.name);
            set_status(&mut dv, Phase::Failed, ("CloneFailed", &message), store)?;
        }
    }
    Ok(dv)
}
