//! A DataSource's Ready condition from the state of what it points to, with CDI's reasons and
//! messages: a PVC source is ready when its DataVolume succeeded (or, without a DataVolume,
//! when the PVC exists); a snapshot source when the VolumeSnapshot is ready to use. A
//! `dataSource` source stands for the source of the DataSource it names ([`resolve`], one deep
//! and in the same namespace, as CDI's `ResolveDataSourceChain`).

use k8s_openapi::jiff::Timestamp;

use crate::datavolume::status::set_condition;
use api::Phase;
use api::golden::{DataSource, DataSourceSource, DataSourceStatus, condition};

/// Condition reasons CDI's DataSource controller writes (a DataVolume's phase is the reason
/// while it is not Succeeded).
pub mod reason {
    /// The source can be cloned.
    pub const READY: &str = "Ready";
    /// The DataVolume, PVC or VolumeSnapshot does not exist.
    pub const NOT_FOUND: &str = "NotFound";
    /// Neither a PVC nor a snapshot is given.
    pub const NO_SOURCE: &str = "NoSource";
    /// The VolumeSnapshot is not ready to use.
    pub const SNAPSHOT_NOT_READY: &str = "SnapshotNotReady";
    /// The `dataSource` named is in another namespace.
    pub const CROSS_NAMESPACE_REFERENCE: &str = "CrossNamespaceReference";
    /// The `dataSource` named is the DataSource itself.
    pub const SELF_REFERENCE: &str = "SelfReference";
    /// The `dataSource` named refers to yet another one.
    pub const MAX_REFERENCE_DEPTH_REACHED: &str = "MaxReferenceDepthReached";
}

/// Why a `dataSource` reference does not resolve (CDI's errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// It names a DataSource of another namespace.
    CrossNamespace,
    /// It names the DataSource itself.
    SelfReference,
    /// The DataSource it names does not exist.
    NotFound(String),
    /// The DataSource it names refers to another one in turn.
    TooDeep,
}

/// Where the DataSource's `dataSource` reference points, `(namespace, name)` (the namespace
/// filled in with the DataSource's own); None without one.
pub fn reference(ds: &DataSource) -> Option<(String, String)> {
    let r = ds.spec.source.data_source.as_ref()?;
    let own = ds.metadata.namespace.clone().unwrap_or_default();
    let ns = if r.namespace.is_empty() {
        own
    } else {
        r.namespace.clone()
    };
    Some((ns, r.name.clone()))
}

/// The source in force (CDI's `ResolveDataSourceChain`): the DataSource's own, or, for a
/// `dataSource` reference, the source of the DataSource it names (`referenced`, as read; None
/// when it does not exist), which must be in the same namespace, not itself, and not a
/// reference in turn.
pub fn resolve<'a>(
    ds: &'a DataSource,
    referenced: Option<&'a DataSource>,
) -> Result<&'a DataSourceSource, Unresolved> {
    let Some((ns, name)) = reference(ds) else {
        return Ok(&ds.spec.source);
    };
    if Some(ns.as_str()) != ds.metadata.namespace.as_deref() {
        return Err(Unresolved::CrossNamespace);
    }
    if Some(name.as_str()) == ds.metadata.name.as_deref() {
        return Err(Unresolved::SelfReference);
    }
    let Some(target) = referenced else {
        return Err(Unresolved::NotFound(name));
    };
    if target.spec.source.data_source.is_some() {
        return Err(Unresolved::TooDeep);
    }
    Ok(&target.spec.source)
}

/// What the controller found of the DataSource's source (resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceState {
    /// `spec.source` names neither a PVC nor a snapshot.
    NoSource,
    /// A PVC source: its DataVolume's phase (`None`: no phase yet).
    DataVolume(Option<Phase>),
    /// A PVC source without a DataVolume: whether the PVC exists.
    Pvc { exists: bool },
    /// A snapshot source: `None` when missing, else `status.readyToUse`.
    Snapshot(Option<bool>),
    /// A `dataSource` reference that does not resolve.
    Unresolved(Unresolved),
}

/// `(ready, reason, message)` as CDI words them.
pub fn ready(state: SourceState) -> (bool, String, String) {
    let ready = || {
        (
            true,
            reason::READY.into(),
            "DataSource is ready to be consumed".into(),
        )
    };
    match state {
        SourceState::NoSource => (false, reason::NO_SOURCE.into(), "No source PVC set".into()),
        SourceState::DataVolume(Some(Phase::Succeeded)) => ready(),
        SourceState::DataVolume(phase) => {
            let p = phase.map(Phase::as_str).unwrap_or_default();
            (false, p.into(), format!("Import DataVolume phase {p}"))
        }
        SourceState::Pvc { exists: true } => ready(),
        SourceState::Pvc { exists: false } => {
            (false, reason::NOT_FOUND.into(), "PVC not found".into())
        }
        SourceState::Snapshot(Some(true)) => ready(),
        SourceState::Snapshot(Some(false)) => (
            false,
            reason::SNAPSHOT_NOT_READY.into(),
            "Snapshot phase is not ready".into(),
        ),
        SourceState::Snapshot(None) => {
            (false, reason::NOT_FOUND.into(), "Snapshot not found".into())
        }
        SourceState::Unresolved(u) => {
            let (why, message) = match u {
                Unresolved::CrossNamespace => (
                    reason::CROSS_NAMESPACE_REFERENCE,
                    "DataSource cannot reference a DataSource in another namespace".into(),
                ),
                Unresolved::SelfReference => (
                    reason::SELF_REFERENCE,
                    "DataSource cannot self-reference".into(),
                ),
                Unresolved::NotFound(name) => (
                    reason::NOT_FOUND,
                    format!("datasources.cdi.kubevirt.io {name:?} not found"),
                ),
                Unresolved::TooDeep => (
                    reason::MAX_REFERENCE_DEPTH_REACHED,
                    "DataSource reference chain exceeds maximum depth of 1".into(),
                ),
            };
            (false, why.into(), message)
        }
    }
}

/// The new status of a DataSource without a `dataSource` reference: see [`status_of`].
pub fn status(ds: &DataSource, state: SourceState, now: Timestamp) -> DataSourceStatus {
    status_of(ds, &ds.spec.source, state, now)
}

/// The DataSource's new status, `source` being the source in force ([`resolve`]) and `state`
/// its state: Ready follows `state`; `status.source` is `source` while Ready, else empty (as
/// CDI's); conditions restart when it changes, as CDI's do.
pub fn status_of(
    ds: &DataSource,
    source: &DataSourceSource,
    state: SourceState,
    now: Timestamp,
) -> DataSourceStatus {
    let mut st = ds.status.clone().unwrap_or_default();
    let (ok, reason, message) = ready(state);
    let shown = if ok {
        source.clone()
    } else {
        DataSourceSource::default()
    };
    if st.source.as_ref() != Some(&shown) {
        st.source = Some(shown);
        st.conditions.clear();
    }
    set_condition(
        &mut st.conditions,
        condition::READY,
        ok,
        &reason,
        &message,
        now,
    );
    st
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::DataSourceSpec;
    use api::datavolume::SourcePvc;
    use api::golden::DataSourceSource;

    fn now() -> Timestamp {
        "2024-05-02T10:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_succeeded_data_volume_makes_it_ready() {
        assert_eq!(
            ready(SourceState::DataVolume(Some(Phase::Succeeded))),
            (
                true,
                "Ready".into(),
                "DataSource is ready to be consumed".into()
            )
        );
    }

    #[test]
    fn a_running_import_is_the_reason_while_not_ready() {
        assert_eq!(
            ready(SourceState::DataVolume(Some(Phase::ImportInProgress))),
            (
                false,
                "ImportInProgress".into(),
                "Import DataVolume phase ImportInProgress".into()
            )
        );
    }

    #[test]
    fn a_pvc_without_data_volume_is_ready_when_it_exists() {
        assert!(ready(SourceState::Pvc { exists: true }).0);
        assert_eq!(
            ready(SourceState::Pvc { exists: false }),
            (false, "NotFound".into(), "PVC not found".into())
        );
    }

    #[test]
    fn a_snapshot_is_ready_when_ready_to_use() {
        assert!(ready(SourceState::Snapshot(Some(true))).0);
        assert_eq!(
            ready(SourceState::Snapshot(Some(false))).1,
            "SnapshotNotReady"
        );
        assert_eq!(
            ready(SourceState::Snapshot(None)),
            (false, "NotFound".into(), "Snapshot not found".into())
        );
    }

    #[test]
    fn no_source_is_not_ready() {
        assert_eq!(
            ready(SourceState::NoSource),
            (false, "NoSource".into(), "No source PVC set".into())
        );
    }

    #[test]
    fn status_copies_the_source_and_restarts_conditions_when_it_changes() {
        let pvc = |name: &str| DataSourceSource {
            pvc: Some(SourcePvc {
                namespace: "golden".into(),
                name: name.into(),
            }),
            ..Default::default()
        };
        let mut ds = DataSource::new(
            "fedora",
            DataSourceSpec {
                source: pvc("fedora-1"),
            },
        );
        ds.status = Some(status(
            &ds,
            SourceState::DataVolume(Some(Phase::Succeeded)),
            now(),
        ));
        assert!(ds.is_ready());
        assert_eq!(ds.status.as_ref().unwrap().source, Some(pvc("fedora-1")));

        ds.spec.source = pvc("fedora-2");
        let later = "2024-05-03T10:00:00Z".parse().unwrap();
        ds.status = Some(status(
            &ds,
            SourceState::DataVolume(Some(Phase::ImportScheduled)),
            later,
        ));
        let st = ds.status.as_ref().unwrap();
        // Not ready: no source in force, as CDI shows it.
        assert_eq!(st.source, Some(DataSourceSource::default()));
        assert_eq!(st.conditions.len(), 1);
        assert_eq!(st.conditions[0].reason.as_deref(), Some("ImportScheduled"));
        assert!(!ds.is_ready());
    }

    fn in_ns(ns: &str, name: &str, source: DataSourceSource) -> DataSource {
        let mut ds = DataSource::new(name, DataSourceSpec { source });
        ds.metadata.namespace = Some(ns.into());
        ds
    }

    fn refers_to(ns: &str, name: &str) -> DataSourceSource {
        DataSourceSource {
            data_source: Some(SourcePvc {
                namespace: ns.into(),
                name: name.into(),
            }),
            ..Default::default()
        }
    }

    fn pvc_source(name: &str) -> DataSourceSource {
        DataSourceSource {
            pvc: Some(SourcePvc {
                namespace: String::new(),
                name: name.into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_reference_resolves_one_deep_to_the_named_data_sources_source() {
        let target = in_ns("golden", "fedora-42", pvc_source("fedora-42-disk"));
        // The namespace defaults to the DataSource's own.
        let ds = in_ns("golden", "fedora", refers_to("", "fedora-42"));
        assert_eq!(
            reference(&ds),
            Some(("golden".to_string(), "fedora-42".to_string()))
        );
        assert_eq!(resolve(&ds, Some(&target)), Ok(&target.spec.source));
        // Without a reference: its own source.
        assert_eq!(resolve(&target, None), Ok(&target.spec.source));
        assert_eq!(reference(&target), None);
    }

    #[test]
    fn references_cdi_does_not_follow_are_not_ready_with_its_reasons_and_messages() {
        let state = |ds: &DataSource, referenced: Option<&DataSource>| {
            ready(SourceState::Unresolved(
                resolve(ds, referenced).unwrap_err(),
            ))
        };
        let chained = in_ns("golden", "fedora-42", refers_to("", "fedora-41"));
        let ds = in_ns("golden", "fedora", refers_to("golden", "fedora-42"));
        assert_eq!(
            state(&ds, Some(&chained)),
            (
                false,
                "MaxReferenceDepthReached".into(),
                "DataSource reference chain exceeds maximum depth of 1".into()
            )
        );
        assert_eq!(
            state(&ds, None),
            (
                false,
                "NotFound".into(),
                "datasources.cdi.kubevirt.io \"fedora-42\" not found".into()
            )
        );
        let selfish = in_ns("golden", "fedora", refers_to("", "fedora"));
        assert_eq!(state(&selfish, None).1, "SelfReference");
        let elsewhere = in_ns("vms", "fedora", refers_to("golden", "fedora-42"));
        assert_eq!(
            state(&elsewhere, None),
            (
                false,
                "CrossNamespaceReference".into(),
                "DataSource cannot reference a DataSource in another namespace".into()
            )
        );
    }

    #[test]
    fn a_resolved_reference_shows_the_source_in_force_while_ready() {
        let target = in_ns("golden", "fedora-42", pvc_source("fedora-42-disk"));
        let mut ds = in_ns("golden", "fedora", refers_to("", "fedora-42"));
        let source = resolve(&ds, Some(&target)).unwrap().clone();
        let st = status_of(&ds, &source, SourceState::Pvc { exists: true }, now());
        assert_eq!(st.source, Some(pvc_source("fedora-42-disk")));
        ds.status = Some(st);
        assert!(ds.is_ready());
        let st = status_of(&ds, &source, SourceState::Pvc { exists: false }, now());
        assert_eq!(st.source, Some(DataSourceSource::default()));
        assert_eq!(st.conditions[0].reason.as_deref(), Some("NotFound"));
    }
}
