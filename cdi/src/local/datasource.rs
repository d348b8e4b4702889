//! Local DataSources (`quarry apply -f datasource.yaml`), so a local DataVolume's `sourceRef` can
//! resolve without a cluster. Kept beside the local DataVolumes, as
//! `<state dir>/datasources/<namespace>/<name>.yaml`.
//!
//! They are kept in the [`ObjectStore`]; [`parse`] reads a manifest, and [`refresh`] recomputes a
//! DataSource's Ready condition from the local DataVolumes and pool (as the cluster's DataSource
//! controller does from the API).

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use provisioner::Provisioner;

use super::datavolume::Store;
use super::store::ObjectStore;
use crate::golden::datasource::{SourceState, reference, resolve, status_of};
use api::golden::{DataSource, DataSourceSource};
use kubekit::error::{Error, Result};

/// The pool volume of a local PVC `namespace/name` (what `quarry apply` names a DataVolume's).
pub fn volume_id(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
}

/// Reads a DataSource manifest (YAML or JSON), checking its kind and name.
pub fn parse(text: &str, what: &str) -> Result<DataSource> {
    let v: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| Error::Yaml {
        context: what.into(),
        message: e.to_string(),
    })?;
    if v["apiVersion"].as_str() != Some("cdi.kubevirt.io/v1beta1")
        || v["kind"].as_str() != Some("DataSource")
    {
        return Err(Error::invalid(format!(
            "{what}: expected apiVersion cdi.kubevirt.io/v1beta1, kind DataSource"
        )));
    }
    let ds: DataSource = serde_json::from_value(v).map_err(|e| Error::Yaml {
        context: what.into(),
        message: e.to_string(),
    })?;
    if ds.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err(Error::invalid(format!("{what}: metadata.name is required")));
    }
    Ok(ds)
}

/// What `src`, a source of the local DataSource `ds`, is now: the local DataVolume of its PVC
/// (else whether the pool has the volume), or whether the pool has its snapshot.
fn source_state(
    ds: &DataSource,
    src: &DataSourceSource,
    state_dir: &Path,
    prov: &Provisioner,
) -> Result<SourceState> {
    let ns = ds.metadata.namespace.as_deref().unwrap_or("default");
    let in_ns = |p: &api::datavolume::SourcePvc| {
        let pns = if p.namespace.is_empty() {
            ns.to_string()
        } else {
            p.namespace.clone()
        };
        (pns, p.name.clone())
    };
    if let Some(p) = &src.pvc {
        let (pns, name) = in_ns(p);
        if let Ok(dv) = Store::new(state_dir).load(&pns, &name) {
            return Ok(SourceState::DataVolume(dv.status.and_then(|s| s.phase)));
        }
        let exists = prov.find_volume(&volume_id(&pns, &name))?.is_some();
        return Ok(SourceState::Pvc { exists });
    }
    if let Some(s) = &src.snapshot {
        let (sns, name) = in_ns(s);
        let ready = prov.snapshot(&volume_id(&sns, &name)).is_ok();
        return Ok(SourceState::Snapshot(ready.then_some(true)));
    }
    Ok(SourceState::NoSource)
}

/// Recomputes a DataSource's status (Ready) from the local state, and saves it.
pub fn refresh(mut ds: DataSource, state_dir: &Path, prov: &Provisioner) -> Result<DataSource> {
    if ds.metadata.namespace.is_none() {
        ds.metadata.namespace = Some("default".into());
    }
    let store = ObjectStore::<DataSource>::new(state_dir);
    // A `dataSource` reference stands for the source of the one it names (as in a cluster).
    let referenced = match reference(&ds) {
        Some((ns, name)) => store.get(&ns, &name)?,
        None => None,
    };
    let (source, state) = match resolve(&ds, referenced.as_ref()) {
        Ok(src) => (src.clone(), source_state(&ds, src, state_dir, prov)?),
        Err(u) => (DataSourceSource::default(), SourceState::Unresolved(u)),
    };
    ds.status = Some(status_of(&ds, &source, state, Timestamp::now()));
    store.save(&ds)?;
    Ok(ds)
}

/// `quarry apply -f FILE` of a DataSource: stores it with its Ready condition and prints it as
/// `datasource/NAME Ready|NotReady: REASON`; whether it is Ready.
pub fn apply_manifest(file: &Path, opts: &super::datavolume::ApplyOptions) -> Result<bool> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
    let ds = parse(&text, &file.display().to_string())?;
    let prov = super::datavolume::open_pool(&opts.pool)?;
    let ds = refresh(ds, &opts.state_dir, &prov)?;
    let name = ds.metadata.name.clone().unwrap_or_default();
    let ready = ds.is_ready();
    let why = ds
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == api::golden::condition::READY)
        .map(|c| api::reason_and_message(c.reason.as_deref(), c.message.as_deref()))
        .unwrap_or_default();
    eprintln!(
        "datasource/{name} {}: {why}",
        if ready { "Ready" } else { "NotReady" }
    );
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DS: &str = "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataSource\nmetadata: {name: fedora, namespace: golden}\nspec: {source: {pvc: {namespace: golden, name: fedora-1}}}\n";

    #[test]
    fn a_data_source_is_kept_and_listed() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectStore::<DataSource>::new(dir.path());
        let ds = parse(DS, "ds.yaml").unwrap();
        store.save(&ds).unwrap();
        let spec = |d: Option<DataSource>| d.map(|d| d.spec);
        assert_eq!(
            spec(store.get("golden", "fedora").unwrap()),
            Some(ds.spec.clone())
        );
        assert_eq!(spec(store.get("golden", "other").unwrap()), None);
        let listed = store.list("golden").unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].metadata.name.as_deref(), Some("fedora"));
        assert!(parse(&DS.replace("DataSource", "DataVolume"), "x").is_err());
    }
}
