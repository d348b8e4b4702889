//! A DataSource's Ready condition from the state of what it points to, with CDI's reasons and
//! messages: a PVC source is ready when its DataVolume succeeded (or, without a DataVolume,
//! when the PVC exists); a snapshot source when the VolumeSnapshot is ready to use.

use k8s_openapi::jiff::Timestamp;

use crate::datavolume::status::set_condition;
use api::Phase;
use api::golden::{DataSource, DataSourceStatus, condition};

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
}

/// What the controller found of the DataSource's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceState {
    /// `spec.source` names neither a PVC nor a snapshot.
    NoSource,
    /// A PVC source: its DataVolume's phase (`None`: no phase yet).
    DataVolume(Option<Phase>),
    /// A PVC source without a DataVolume: whether the PVC exists.
    Pvc { exists: bool },
    /// A snapshot source: `None` when missing, else `status.readyToUse`.
    Snapshot(Option<bool>),
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
    }
}

/// The DataSource's new status: `status.source` copies the spec's (conditions restart when it
/// changes, as CDI's do), then Ready follows `state`.
pub fn status(ds: &DataSource, state: SourceState, now: Timestamp) -> DataSourceStatus {
    let mut st = ds.status.clone().unwrap_or_default();
    if st.source.as_ref() != Some(&ds.spec.source) {
        st.source = Some(ds.spec.source.clone());
        st.conditions.clear();
    }
    let (ok, reason, message) = ready(state);
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
        assert_eq!(st.source, Some(pvc("fedora-2")));
        assert_eq!(st.conditions.len(), 1);
        assert_eq!(st.conditions[0].reason.as_deref(), Some("ImportScheduled"));
        assert!(!ds.is_ready());
    }
}
