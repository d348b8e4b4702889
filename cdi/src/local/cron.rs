//! `quarry apply -f cron.yaml` without a cluster: one poll-and-import cycle of a DataImportCron,
//! now. The source is polled ([`crate::golden::poll`]) with the options an import of it would use; a
//! new version is imported into a pool volume by the local DataVolume path
//! ([`super::datavolume::apply`]); the managed DataSource then points at it and imports
//! beyond `importsToKeep` are deleted (volume and status). The same [`crate::golden::cron`] decisions as
//! the cluster controller; the cron and DataSource are kept in the [`ObjectStore`].

use std::sync::Arc;

use importer::progress::Progress;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::datavolume::{self as local, ApplyOptions};
use super::store::ObjectStore;
use crate::datavolume::request::SourceObjects;
use crate::golden::cron::{
    ImportState, annotation, decide, import_data_volume, managed_data_source,
};
use crate::golden::poll::{poll, poll_request, template_source};
use api::golden::{DATA_IMPORT_CRON_LABEL, DataImportCron, DataSource};
use api::{DataVolume, Phase};
use kubekit::error::{Error, Result};

/// What one cycle did.
#[derive(Debug, Clone)]
pub struct CycleReport {
    /// The cron as saved.
    pub cron: DataImportCron,
    /// The version polled (`status.currentImports[].Digest` form).
    pub digest: String,
    /// The DataVolume imported in this cycle, if the version changed.
    pub imported: Option<DataVolume>,
    /// Imports deleted by garbage collection.
    pub deleted: Vec<String>,
}

/// Reads a DataImportCron manifest, checking its kind.
pub fn parse(text: &str, what: &str) -> Result<DataImportCron> {
    let cron: DataImportCron = serde_saphyr::from_str(text).map_err(|e| Error::Yaml {
        context: what.into(),
        message: e.to_string(),
    })?;
    if cron.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err(Error::invalid(format!("{what}: metadata.name is required")));
    }
    if cron.spec.managed_data_source.is_empty() {
        return Err(Error::invalid(format!(
            "{what}: spec.managedDataSource is required"
        )));
    }
    Ok(cron)
}

/// Runs one cycle of `cron` (its status and annotations carried over from the last cycle).
pub fn apply(
    mut cron: DataImportCron,
    opts: &ApplyOptions,
    progress: Arc<Progress>,
) -> Result<CycleReport> {
    let ns = cron.namespace().unwrap_or_else(|| "default".into());
    cron.metadata.namespace = Some(ns.clone());
    let crons = ObjectStore::<DataImportCron>::new(&opts.state_dir);
    if let Some(old) = crons.get(&ns, &cron.name_any())? {
        cron.status = old.status;
        let kept = old.metadata.annotations.unwrap_or_default();
        cron.annotations_mut().extend(kept);
        cron.metadata.uid = old.metadata.uid;
    }
    if cron.metadata.uid.is_none() {
        cron.metadata.uid = Some(format!("local-{ns}-{}", cron.name_any()));
    }

    let now = Timestamp::now();
    let digest = poll_now(&cron, opts)?.digest();
    let ann = cron.annotations_mut();
    ann.insert(annotation::SOURCE_DESIRED_DIGEST.into(), digest.clone());
    ann.insert(annotation::LAST_CRON_TIME.into(), now.to_string());
    if let Some(next) =
        crate::golden::cron::next_run(&cron, now).map_err(|e| Error::invalid(e.to_string()))?
    {
        cron.annotations_mut()
            .insert(annotation::NEXT_CRON_TIME.into(), next.to_string());
    }

    let dvs = local::Store::new(&opts.state_dir);
    let mut polled_at = Some(now);
    let mut imported = None;
    let mut deleted = Vec::new();
    // At most: record the last import's outcome and start the next, then record that one.
    for _ in 0..3 {
        let state = import_state(&cron, &dvs, &ns);
        let d = decide(&cron, Some(&digest), state, polled_at, Timestamp::now())
            .map_err(|e| Error::invalid(e.to_string()))?;
        polled_at = None;
        cron.status = Some(d.status);
        if d.succeeded {
            mark_used(&cron, &dvs, &ns)?;
            update_data_source(&cron, opts)?;
            deleted.extend(collect_garbage(&cron, opts, &ns)?);
        }
        match d.create {
            Some(name) => {
                let dv = import_data_volume(&cron, &name, &digest);
                crons.save(&cron)?;
                imported = Some(local::apply(dv, opts, progress.clone())?);
            }
            None => break,
        }
    }
    crons.save(&cron)?;
    Ok(CycleReport {
        cron,
        digest,
        imported,
        deleted,
    })
}

/// Polls the template's source with the options its import would use.
fn poll_now(
    cron: &DataImportCron,
    opts: &ApplyOptions,
) -> Result<crate::golden::version::SourceVersion> {
    let template = template_source(cron)?;
    let objects = SourceObjects::from_dir(&template.1, opts.secrets_dir.as_deref())?;
    let req = poll_request(&template, &objects, &opts.insecure_registries)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the poll runtime", e))?;
    rt.block_on(poll(&req.source, &req.http))
        .map_err(|e| Error::Poll(Box::new(e)))
}

/// The state of the cron's current import in the local store.
fn import_state(cron: &DataImportCron, dvs: &local::Store, ns: &str) -> ImportState {
    let Some(first) = cron.status.as_ref().and_then(|s| s.current_imports.first()) else {
        return ImportState::None;
    };
    match dvs.load(ns, &first.data_volume_name) {
        Ok(dv) => ImportState::DataVolume(dv.status.and_then(|s| s.phase)),
        Err(_) => ImportState::None,
    }
}

/// Stamps the last import's use time (garbage collection keeps the most recently used).
fn mark_used(cron: &DataImportCron, dvs: &local::Store, ns: &str) -> Result<()> {
    let Some(pvc) = crate::golden::cron::last_import(cron) else {
        return Ok(());
    };
    if let Ok(mut dv) = dvs.load(ns, pvc) {
        dv.annotations_mut().insert(
            crate::golden::gc::LAST_USE_ANNOTATION.into(),
            Timestamp::now().to_string(),
        );
        dvs.save(&dv)?;
    }
    Ok(())
}

/// Points the managed DataSource at the last import (creating it), with its Ready condition.
fn update_data_source(cron: &DataImportCron, opts: &ApplyOptions) -> Result<()> {
    let store = ObjectStore::<DataSource>::new(&opts.state_dir);
    let ns = cron.namespace().unwrap_or_default();
    let existing = store.get(&ns, &cron.spec.managed_data_source)?;
    let Some(mut ds) = managed_data_source(cron, existing.as_ref()) else {
        return Ok(());
    };
    let state = match &ds.spec.source.pvc {
        Some(p) => crate::golden::datasource::SourceState::DataVolume(
            local::Store::new(&opts.state_dir)
                .load(&p.namespace, &p.name)
                .ok()
                .and_then(|dv| dv.status.and_then(|s| s.phase)),
        ),
        None => crate::golden::datasource::SourceState::NoSource,
    };
    ds.status = Some(crate::golden::datasource::status(
        &ds,
        state,
        Timestamp::now(),
    ));
    store.save(&ds)
}

/// Deletes the imports beyond `importsToKeep`: their volumes and their statuses.
fn collect_garbage(cron: &DataImportCron, opts: &ApplyOptions, ns: &str) -> Result<Vec<String>> {
    let dvs = local::Store::new(&opts.state_dir);
    let name = cron.name_any();
    let imports: Vec<(String, Option<String>)> = dvs
        .list(ns)?
        .into_iter()
        .filter(|dv| dv.labels().get(DATA_IMPORT_CRON_LABEL) == Some(&name))
        .filter(|dv| dv.status.as_ref().and_then(|s| s.phase) == Some(Phase::Succeeded))
        .map(|dv| {
            let used = dv
                .annotations()
                .get(crate::golden::gc::LAST_USE_ANNOTATION)
                .cloned();
            (dv.name_any(), used)
        })
        .collect();
    let doomed = crate::golden::cron::garbage(cron, &imports);
    if doomed.is_empty() {
        return Ok(doomed);
    }
    let prov = local::open_pool(&opts.pool)?;
    let files = ObjectStore::<DataVolume>::new(&opts.state_dir);
    for n in &doomed {
        match prov.delete_volume(&format!("{ns}-{n}")) {
            Ok(()) => {}
            Err(e) if e.kind() == provisioner::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        files.delete(ns, n)?;
    }
    Ok(doomed)
}

/// The `kubectl get dataimportcron` table: NAME FORMAT (CDI's print column) and what Quarry
/// adds to read it at a glance: UP-TO-DATE, LAST-IMPORT.
pub fn cron_table(crons: &[DataImportCron]) -> String {
    let rows = crons.iter().map(|c| {
        let st = c.status.clone().unwrap_or_default();
        let up = st
            .conditions
            .iter()
            .find(|x| x.type_ == api::golden::condition::UP_TO_DATE)
            .map(|x| x.status.clone())
            .unwrap_or_default();
        vec![
            c.name_any(),
            st.source_format.unwrap_or_default(),
            up,
            st.last_imported_pvc.map(|p| p.name).unwrap_or_default(),
        ]
    });
    table(&["NAME", "FORMAT", "UP-TO-DATE", "LAST-IMPORT"], rows)
}

/// The `kubectl get datasource` table: NAME, READY and the PVC it points at.
pub fn data_source_table(sources: &[DataSource]) -> String {
    let rows = sources.iter().map(|d| {
        let ready = if d.is_ready() { "True" } else { "False" };
        let pvc = d
            .spec
            .source
            .pvc
            .as_ref()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .unwrap_or_default();
        vec![d.name_any(), ready.into(), pvc]
    });
    table(&["NAME", "READY", "SOURCE"], rows)
}

/// Columns padded as kubectl pads them.
fn table(header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut all: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    all.extend(rows);
    let mut widths = vec![0; header.len()];
    for r in &all {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for r in &all {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}
