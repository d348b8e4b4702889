//! The pure decisions of a clone, as CDI makes them: resolving `spec.sourceRef` through its
//! DataSource, choosing the clone strategy (CDI's planner, plus the node-locality rule of
//! hostpath volumes), and the SubjectAccessReviews that authorize cloning from another
//! namespace (sent by the DataVolume webhook, [`super::admission`]).

pub mod flow;
pub mod objects;
pub mod observe;
pub mod token;

use super::pvc::VolumeMode;
use super::source::CloneSourceKind;
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};

use api::datavolume::{DataVolumeSourceRef, SourcePvc};
use api::golden::DataSource;

/// Condition and event reasons of clones, CDI's spelling.
pub mod reason {
    /// The clone's source (PVC, snapshot or DataSource) does not exist, or is not ready yet.
    pub const CLONE_WITHOUT_SOURCE: &str = "CloneWithoutSource";
    /// No VolumeSnapshotClass for the source's driver: host-assisted instead of snapshot.
    pub const NO_VOLUME_SNAPSHOT_CLASS: &str = "NoVolumeSnapshotClass";
    /// Source and target volume modes differ: host-assisted.
    pub const INCOMPATIBLE_VOLUME_MODES: &str = "IncompatibleVolumeModes";
    /// The sizes differ and the target class cannot expand: host-assisted.
    pub const NO_VOLUME_EXPANSION: &str = "NoVolumeExpansion";
    /// The snapshot's driver is not the target class's provisioner: host-assisted.
    pub const NO_PROVISIONER_MATCH: &str = "NoProvisionerMatch";
    /// Source and target are not on one CSI driver: host-assisted.
    pub const INCOMPATIBLE_PROVISIONERS: &str = "IncompatibleProvisioners";
    /// Quarry's own: a node-local (hostpath) source cannot be cloned by CSI or snapshot to a
    /// target that cannot land on the source's node: host-assisted.
    pub const TARGET_NOT_ON_SOURCE_NODE: &str = "TargetNotOnSourceNode";
    /// Quarry's own: source and target namespaces differ. A `dataSource` must be in the PVC's
    /// namespace; CDI then clones into a temporary PVC beside the source and moves its volume
    /// over (ObjectTransfer), Quarry copies host-assisted.
    pub const CROSS_NAMESPACE: &str = "CrossNamespaceClone";
}

/// What `spec.sourceRef` resolves to.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceRef {
    /// Clone this PVC (a `spec.source.pvc`).
    Pvc(SourcePvc),
    /// Restore or copy this VolumeSnapshot (a `spec.source.snapshot`).
    Snapshot(SourcePvc),
    /// Wait (Pending, with this reason and message) until the DataSource exists and is Ready.
    Wait {
        /// CDI's reason.
        reason: &'static str,
        /// What is awaited.
        message: String,
    },
    /// The reference cannot be followed (wrong kind, a chain deeper than one, no source).
    Invalid(String),
}

/// Resolves `spec.sourceRef` of a DataVolume in `dv_namespace`. `lookup(namespace, name)` gives
/// the DataSources the controller found; a DataSource pointing to another DataSource is
/// followed once (CDI's limit).
pub fn resolve_source_ref<'a>(
    dv_namespace: &str,
    r: &DataVolumeSourceRef,
    lookup: impl Fn(&str, &str) -> Option<&'a DataSource>,
) -> SourceRef {
    if r.kind != "DataSource" {
        return SourceRef::Invalid(format!(
            "spec.sourceRef.kind {:?} is not supported (only DataSource)",
            r.kind
        ));
    }
    let ns = r.namespace.as_deref().unwrap_or(dv_namespace);
    let mut at = (ns.to_string(), r.name.clone());
    for depth in 0..2 {
        let Some(ds) = lookup(&at.0, &at.1) else {
            return SourceRef::Wait {
                reason: reason::CLONE_WITHOUT_SOURCE,
                message: format!("The source datasource {}/{} doesn't exist", at.0, at.1),
            };
        };
        let src = &ds.spec.source;
        let in_ns = |p: &SourcePvc| SourcePvc {
            namespace: if p.namespace.is_empty() {
                at.0.clone()
            } else {
                p.namespace.clone()
            },
            name: p.name.clone(),
        };
        if let Some(next) = &src.data_source {
            if depth == 1 {
                return SourceRef::Invalid(format!(
                    "DataSource {}/{} refers to another DataSource; a chain may be one deep",
                    at.0, at.1
                ));
            }
            let next = in_ns(next);
            // CDI's chain rules, as the DataSource's own status says them: the DataSource is
            // edited to fix them, so the DataVolume waits.
            let refused = if next.namespace != at.0 {
                Some("cannot reference a DataSource in another namespace")
            } else if next.name == at.1 {
                Some("cannot self-reference")
            } else {
                None
            };
            if let Some(why) = refused {
                return SourceRef::Wait {
                    reason: reason::CLONE_WITHOUT_SOURCE,
                    message: format!("DataSource {}/{} {why}", at.0, at.1),
                };
            }
            at = (next.namespace, next.name);
            continue;
        }
        if !ds.is_ready() {
            return SourceRef::Wait {
                reason: reason::CLONE_WITHOUT_SOURCE,
                message: format!("DataSource {}/{} is not ready", at.0, at.1),
            };
        }
        return match (&src.pvc, &src.snapshot) {
            (Some(p), _) => SourceRef::Pvc(in_ns(p)),
            (None, Some(s)) => SourceRef::Snapshot(in_ns(s)),
            (None, None) => SourceRef::Invalid(format!(
                "DataSource {}/{} has no pvc or snapshot source",
                at.0, at.1
            )),
        };
    }
    unreachable!("the loop returns by its second pass")
}

/// How a clone copies the data (CDI's `cloneStrategy` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// `csi-clone`: a `dataSource` PVC served by the CSI driver.
    CsiClone,
    /// `snapshot`: a VolumeSnapshot, then a PVC restored from it.
    Snapshot,
    /// `copy`: a source pod streams to the target's upload server.
    HostAssisted,
}

impl Strategy {
    /// CDI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::CsiClone => "csi-clone",
            Strategy::Snapshot => "snapshot",
            Strategy::HostAssisted => "copy",
        }
    }

    /// CDI's spelling read back; unknown values are ignored, as CDI's enum validation would
    /// have refused them.
    pub fn parse(s: &str) -> Option<Strategy> {
        match s {
            "csi-clone" => Some(Strategy::CsiClone),
            "snapshot" => Some(Strategy::Snapshot),
            "copy" => Some(Strategy::HostAssisted),
            _ => None,
        }
    }
}

/// What the controller knows about source and target when choosing: what it reads from the
/// cluster for the target (`clone::observe`), and what the DataVolume and its source say
/// (`clone::flow`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CloneFacts {
    /// `CDI.spec.cloneStrategyOverride`.
    pub global_override: Option<String>,
    /// The target StorageClass's StorageProfile `status.cloneStrategy`.
    pub profile_strategy: Option<String>,
    /// CSI driver of the source (its StorageClass's provisioner, or the snapshot's driver).
    pub source_driver: Option<String>,
    /// Provisioner of the target StorageClass.
    pub target_driver: Option<String>,
    /// The VolumeSnapshotClass whose driver is the source's.
    pub snapshot_class: Option<String>,
    /// The target StorageClass allows volume expansion.
    pub allow_expansion: bool,
    /// The source's volume mode (unset: Filesystem).
    pub source_volume_mode: Option<VolumeMode>,
    /// The target's volume mode (unset: Filesystem).
    pub target_volume_mode: Option<VolumeMode>,
    /// Source capacity (a PVC's `status.capacity`, a snapshot's `restoreSize`), bytes.
    pub source_size: Option<u64>,
    /// Target request, bytes.
    pub target_size: Option<u64>,
    /// Source and target are in different namespaces.
    pub cross_namespace: bool,
    /// The source is node-local (a hostpath volume): `Some(false)` when the target cannot be
    /// placed on the source's node; `None` for storage reachable from any node.
    pub target_on_source_node: Option<bool>,
}

/// The strategy chosen, with the reason and message of a fall back to host-assisted (CDI
/// records them as an event on the target).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The strategy.
    pub strategy: Strategy,
    /// `(reason, message)` when host-assisted was forced.
    pub fallback: Option<(&'static str, &'static str)>,
}

/// A clone that cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloneError {
    /// The target asks for less space than the source holds.
    #[error(
        "target resources requests storage size is smaller than the source ({target} < {source_size} bytes)"
    )]
    TargetTooSmall {
        /// Source size.
        source_size: u64,
        /// Target request.
        target: u64,
    },
}

fn host_assisted(reason: &'static str, message: &'static str) -> Choice {
    Choice {
        strategy: Strategy::HostAssisted,
        fallback: Some((reason, message)),
    }
}

/// Chooses the strategy as CDI's planner does: the CDI CR's override, else the StorageProfile's,
/// else snapshot; snapshot without a VolumeSnapshotClass, a change of driver or volume mode, or
/// a size change the target class cannot expand fall back to host-assisted. A node-local source
/// also falls back when the target cannot be on its node.
pub fn choose_strategy(kind: CloneSourceKind, f: &CloneFacts) -> Result<Choice, CloneError> {
    if let (Some(source), Some(target)) = (f.source_size, f.target_size)
        && target < source
    {
        return Err(CloneError::TargetTooSmall {
            source_size: source,
            target,
        });
    }
    let size_changes = match (f.source_size, f.target_size) {
        (Some(s), Some(t)) => s != t,
        _ => true,
    };
    let same_driver = matches!((&f.source_driver, &f.target_driver), (Some(a), Some(b)) if a == b);
    if kind == CloneSourceKind::Snapshot {
        // A snapshot is restored (smart clone) or copied; CSI clone does not apply.
        if !same_driver {
            return Ok(host_assisted(
                reason::NO_PROVISIONER_MATCH,
                "The storageclass provisioner does not match the volumesnapshotcontent driver",
            ));
        }
        if size_changes && !f.allow_expansion {
            return Ok(host_assisted(
                reason::NO_VOLUME_EXPANSION,
                "No volume expansion is possible",
            ));
        }
        return Ok(node_local(Strategy::Snapshot, f));
    }
    let strategy = f
        .global_override
        .as_deref()
        .and_then(Strategy::parse)
        .or_else(|| f.profile_strategy.as_deref().and_then(Strategy::parse))
        .unwrap_or(Strategy::Snapshot);
    if strategy == Strategy::HostAssisted {
        return Ok(Choice {
            strategy,
            fallback: None,
        });
    }
    if strategy == Strategy::Snapshot && f.snapshot_class.is_none() {
        return Ok(host_assisted(
            reason::NO_VOLUME_SNAPSHOT_CLASS,
            "No compatible volumesnapshotclass found",
        ));
    }
    if !same_driver {
        return Ok(host_assisted(
            reason::INCOMPATIBLE_PROVISIONERS,
            "Provisioners are incompatible",
        ));
    }
    let mode = |m: Option<VolumeMode>| m.unwrap_or(VolumeMode::Filesystem);
    if mode(f.source_volume_mode) != mode(f.target_volume_mode) {
        return Ok(host_assisted(
            reason::INCOMPATIBLE_VOLUME_MODES,
            "The volume modes of source and target are incompatible",
        ));
    }
    if size_changes && !f.allow_expansion {
        return Ok(host_assisted(
            reason::NO_VOLUME_EXPANSION,
            "No volume expansion is possible",
        ));
    }
    Ok(node_local(strategy, f))
}

fn node_local(strategy: Strategy, f: &CloneFacts) -> Choice {
    if f.cross_namespace {
        host_assisted(
            reason::CROSS_NAMESPACE,
            "The source is in another namespace than the target",
        )
    } else if f.target_on_source_node == Some(false) {
        host_assisted(
            reason::TARGET_NOT_ON_SOURCE_NODE,
            "The source volume is local to a node the target cannot be placed on",
        )
    } else {
        Choice {
            strategy,
            fallback: None,
        }
    }
}

/// The SubjectAccessReviews that authorize cloning `kind` `namespace/name`, sent for the
/// DataVolume's creator, as CDI sends them: `create` on `datavolumes/source` in the source
/// namespace comes first and suffices; failing it, a PVC clone is allowed by `create` on
/// `pods`, a snapshot clone by `create` on both `pods` and `pvcs` (CDI's spelling).
#[derive(Debug, Clone, PartialEq)]
pub struct CloneReviews {
    /// `create` on `datavolumes/source`: allowed means authorized.
    pub explicit: SubjectAccessReview,
    /// Asked when the explicit one is denied: all must be allowed.
    pub implicit: Vec<SubjectAccessReview>,
}

/// Builds [`CloneReviews`] for `user` (the DataVolume's creator, from the admission request).
pub fn clone_reviews(
    kind: CloneSourceKind,
    namespace: &str,
    name: &str,
    user: &UserInfo,
) -> CloneReviews {
    let review =
        |group: Option<&str>, resource: &str, subresource: Option<&str>| SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.into()),
                    verb: Some("create".into()),
                    group: group.map(Into::into),
                    resource: Some(resource.into()),
                    subresource: subresource.map(Into::into),
                    name: Some(name.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
    let implicit = match kind {
        CloneSourceKind::Pvc => vec![review(None, "pods", None)],
        CloneSourceKind::Snapshot => vec![review(None, "pods", None), review(None, "pvcs", None)],
    };
    CloneReviews {
        explicit: review(Some("cdi.kubevirt.io"), "datavolumes", Some("source")),
        implicit,
    }
}

/// The verdict from the reviews' `status.allowed`: `Err` with CDI's message when refused.
pub fn clone_authorized(
    explicit_allowed: bool,
    implicit_allowed: &[bool],
    user: &UserInfo,
    namespace: &str,
) -> Result<(), String> {
    if explicit_allowed || (!implicit_allowed.is_empty() && implicit_allowed.iter().all(|a| *a)) {
        Ok(())
    } else {
        Err(format!(
            "User {} has insufficient permissions in clone source namespace {namespace}",
            user.username.as_deref().unwrap_or_default()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::DataSourceSpec;
    use api::golden::{Condition, DataSourceSource, DataSourceStatus, condition};

    fn data_source(ns: &str, name: &str, src: DataSourceSource, ready: bool) -> DataSource {
        let mut ds = DataSource::new(name, DataSourceSpec { source: src });
        ds.metadata.namespace = Some(ns.into());
        ds.status = Some(DataSourceStatus {
            conditions: vec![Condition {
                type_: condition::READY.into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        ds
    }

    fn pvc(ns: &str, name: &str) -> DataSourceSource {
        DataSourceSource {
            pvc: Some(SourcePvc {
                namespace: ns.into(),
                name: name.into(),
            }),
            ..Default::default()
        }
    }

    fn sref(ns: Option<&str>, name: &str) -> DataVolumeSourceRef {
        DataVolumeSourceRef {
            kind: "DataSource".into(),
            namespace: ns.map(Into::into),
            name: name.into(),
        }
    }

    fn resolve(r: &DataVolumeSourceRef, all: &[DataSource]) -> SourceRef {
        resolve_source_ref("vms", r, |ns, n| {
            all.iter().find(|d| {
                d.metadata.namespace.as_deref() == Some(ns) && d.metadata.name.as_deref() == Some(n)
            })
        })
    }

    #[test]
    fn a_ready_data_source_resolves_to_its_pvc() {
        let all = [data_source(
            "golden",
            "fedora",
            pvc("golden", "fedora-3d8e"),
            true,
        )];
        let SourceRef::Pvc(p) = resolve(&sref(Some("golden"), "fedora"), &all) else {
            panic!()
        };
        assert_eq!(
            (p.namespace.as_str(), p.name.as_str()),
            ("golden", "fedora-3d8e")
        );
    }

    #[test]
    fn the_ref_namespace_and_the_source_namespace_default() {
        // No sourceRef namespace: the DataVolume's; no PVC namespace: the DataSource's.
        let all = [data_source("vms", "fedora", pvc("", "fedora-3d8e"), true)];
        let SourceRef::Pvc(p) = resolve(&sref(None, "fedora"), &all) else {
            panic!()
        };
        assert_eq!(p.namespace, "vms");
    }

    #[test]
    fn a_snapshot_data_source_resolves_to_a_snapshot_source() {
        let snap = DataSourceSource {
            snapshot: Some(SourcePvc {
                namespace: "golden".into(),
                name: "fedora-snap".into(),
            }),
            ..Default::default()
        };
        let all = [data_source("golden", "fedora", snap, true)];
        let SourceRef::Snapshot(s) = resolve(&sref(Some("golden"), "fedora"), &all) else {
            panic!()
        };
        assert_eq!(s.name, "fedora-snap");
    }

    #[test]
    fn a_chain_into_another_namespace_or_onto_itself_is_waited_on_as_cdi_refuses_it() {
        let chain = |ns: &str, name: &str| DataSourceSource {
            data_source: Some(SourcePvc {
                namespace: ns.into(),
                name: name.into(),
            }),
            ..Default::default()
        };
        let all = [
            data_source("vms", "across", chain("golden", "fedora"), false),
            data_source("vms", "itself", chain("", "itself"), false),
            data_source("golden", "fedora", pvc("golden", "fedora-3d8e"), true),
        ];
        for (name, says) in [
            ("across", "another namespace"),
            ("itself", "self-reference"),
        ] {
            let SourceRef::Wait { message, .. } = resolve(&sref(None, name), &all) else {
                panic!("{name}")
            };
            assert!(message.contains(says), "{message}");
        }
    }

    #[test]
    fn a_missing_or_unready_data_source_is_waited_for() {
        assert_eq!(
            resolve(&sref(Some("golden"), "fedora"), &[]),
            SourceRef::Wait {
                reason: "CloneWithoutSource",
                message: "The source datasource golden/fedora doesn't exist".into()
            }
        );
        let all = [data_source("golden", "fedora", pvc("golden", "x"), false)];
        assert!(matches!(
            resolve(&sref(Some("golden"), "fedora"), &all),
            SourceRef::Wait {
                reason: "CloneWithoutSource",
                ..
            }
        ));
    }

    #[test]
    fn a_data_source_chain_is_followed_once() {
        let to = |ns: &str, n: &str| DataSourceSource {
            data_source: Some(SourcePvc {
                namespace: ns.into(),
                name: n.into(),
            }),
            ..Default::default()
        };
        let all = [
            data_source("golden", "alias", to("", "fedora"), false),
            data_source("golden", "fedora", pvc("golden", "fedora-3d8e"), true),
            data_source("golden", "alias2", to("golden", "alias"), false),
        ];
        assert!(matches!(
            resolve(&sref(Some("golden"), "alias"), &all),
            SourceRef::Pvc(_)
        ));
        assert!(matches!(
            resolve(&sref(Some("golden"), "alias2"), &all),
            SourceRef::Invalid(_)
        ));
    }

    #[test]
    fn other_kinds_are_invalid() {
        let r = DataVolumeSourceRef {
            kind: "PersistentVolumeClaim".into(),
            ..sref(None, "x")
        };
        assert!(matches!(resolve(&r, &[]), SourceRef::Invalid(m) if m.contains("only DataSource")));
    }

    fn facts() -> CloneFacts {
        CloneFacts {
            source_driver: Some("kubevirt.io.hostpath-provisioner".into()),
            target_driver: Some("kubevirt.io.hostpath-provisioner".into()),
            snapshot_class: Some("hostpath-snapclass".into()),
            source_size: Some(1 << 30),
            target_size: Some(1 << 30),
            target_on_source_node: Some(true),
            ..Default::default()
        }
    }

    fn chosen(kind: CloneSourceKind, f: &CloneFacts) -> (Strategy, Option<&'static str>) {
        let c = choose_strategy(kind, f).unwrap();
        (c.strategy, c.fallback.map(|f| f.0))
    }

    #[test]
    fn snapshot_is_the_default_strategy() {
        assert_eq!(
            chosen(CloneSourceKind::Pvc, &facts()),
            (Strategy::Snapshot, None)
        );
    }

    #[test]
    fn the_storage_profile_strategy_is_taken() {
        let f = CloneFacts {
            profile_strategy: Some("csi-clone".into()),
            ..facts()
        };
        assert_eq!(chosen(CloneSourceKind::Pvc, &f), (Strategy::CsiClone, None));
    }

    #[test]
    fn the_cdi_override_wins_over_the_profile() {
        let f = CloneFacts {
            global_override: Some("copy".into()),
            profile_strategy: Some("csi-clone".into()),
            ..facts()
        };
        assert_eq!(
            chosen(CloneSourceKind::Pvc, &f),
            (Strategy::HostAssisted, None)
        );
    }

    #[test]
    fn snapshot_without_a_snapshot_class_falls_back() {
        let f = CloneFacts {
            snapshot_class: None,
            ..facts()
        };
        assert_eq!(
            chosen(CloneSourceKind::Pvc, &f),
            (Strategy::HostAssisted, Some("NoVolumeSnapshotClass"))
        );
        // csi-clone does not need one.
        let f = CloneFacts {
            profile_strategy: Some("csi-clone".into()),
            ..f
        };
        assert_eq!(chosen(CloneSourceKind::Pvc, &f).0, Strategy::CsiClone);
    }

    #[test]
    fn another_driver_falls_back() {
        let f = CloneFacts {
            profile_strategy: Some("csi-clone".into()),
            target_driver: Some("rbd.csi.ceph.com".into()),
            ..facts()
        };
        assert_eq!(
            chosen(CloneSourceKind::Pvc, &f),
            (Strategy::HostAssisted, Some("IncompatibleProvisioners"))
        );
    }

    #[test]
    fn a_volume_mode_change_falls_back() {
        let f = CloneFacts {
            profile_strategy: Some("csi-clone".into()),
            target_volume_mode: Some(VolumeMode::Block),
            ..facts()
        };
        assert_eq!(
            chosen(CloneSourceKind::Pvc, &f),
            (Strategy::HostAssisted, Some("IncompatibleVolumeModes"))
        );
    }

    #[test]
    fn a_size_change_falls_back_unless_the_class_expands() {
        let f = CloneFacts {
            profile_strategy: Some("csi-clone".into()),
            target_size: Some(2 << 30),
            ..facts()
        };
        assert_eq!(
            chosen(CloneSourceKind::Pvc, &f),
            (Strategy::HostAssisted, Some("NoVolumeExpansion"))
        );
        let f = CloneFacts {
            allow_expansion: true,
            ..f
        };
        assert_eq!(chosen(CloneSourceKind::Pvc, &f), (Strategy::CsiClone, None));
    }

    #[test]
    fn a_target_off_the_node_of_a_local_source_falls_back() {
        let f = CloneFacts {
            profile_strategy: Some("csi-clone".into()),
            target_on_source_node: Some(false),
            ..facts()
        };
        assert_eq!(
            chosen(CloneSourceKind::Pvc, &f),
            (Strategy::HostAssisted, Some("TargetNotOnSourceNode"))
        );
        // Storage reachable from every node has no such constraint.
        let f = CloneFacts {
            target_on_source_node: None,
            ..f
        };
        assert_eq!(chosen(CloneSourceKind::Pvc, &f).0, Strategy::CsiClone);
    }

    #[test]
    fn a_cross_namespace_clone_is_copied() {
        for profile in ["csi-clone", "snapshot"] {
            let f = CloneFacts {
                profile_strategy: Some(profile.into()),
                cross_namespace: true,
                ..facts()
            };
            assert_eq!(
                chosen(CloneSourceKind::Pvc, &f),
                (Strategy::HostAssisted, Some("CrossNamespaceClone"))
            );
        }
    }

    #[test]
    fn a_target_smaller_than_the_source_is_refused() {
        let f = CloneFacts {
            target_size: Some(1 << 20),
            ..facts()
        };
        assert!(matches!(
            choose_strategy(CloneSourceKind::Pvc, &f),
            Err(CloneError::TargetTooSmall { .. })
        ));
    }

    #[test]
    fn a_snapshot_source_restores_on_its_driver_and_copies_otherwise() {
        assert_eq!(
            chosen(CloneSourceKind::Snapshot, &facts()),
            (Strategy::Snapshot, None)
        );
        let f = CloneFacts {
            target_driver: Some("rbd.csi.ceph.com".into()),
            ..facts()
        };
        assert_eq!(
            chosen(CloneSourceKind::Snapshot, &f),
            (Strategy::HostAssisted, Some("NoProvisionerMatch"))
        );
    }

    fn user() -> UserInfo {
        UserInfo {
            username: Some("alice".into()),
            uid: Some("u-1".into()),
            groups: Some(vec!["system:authenticated".into()]),
            extra: Some([("scopes".to_string(), vec!["x".to_string()])].into()),
        }
    }

    #[test]
    fn the_explicit_review_is_create_on_datavolumes_source_for_the_creator() {
        let r = clone_reviews(CloneSourceKind::Pvc, "golden", "fedora-3d8e", &user());
        let spec = &r.explicit.spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        assert_eq!(spec.uid.as_deref(), Some("u-1"));
        assert_eq!(spec.groups, user().groups);
        assert_eq!(spec.extra, user().extra);
        let a = spec.resource_attributes.as_ref().unwrap();
        assert_eq!(
            (
                a.namespace.as_deref(),
                a.verb.as_deref(),
                a.group.as_deref(),
                a.resource.as_deref(),
                a.subresource.as_deref(),
                a.name.as_deref()
            ),
            (
                Some("golden"),
                Some("create"),
                Some("cdi.kubevirt.io"),
                Some("datavolumes"),
                Some("source"),
                Some("fedora-3d8e")
            )
        );
        let json = serde_json::to_value(&r.explicit).unwrap();
        assert_eq!(json["apiVersion"], "authorization.k8s.io/v1");
        assert_eq!(json["kind"], "SubjectAccessReview");
    }

    #[test]
    fn the_implicit_reviews_are_pods_for_pvcs_and_pods_and_pvcs_for_snapshots() {
        let res = |r: &CloneReviews| -> Vec<String> {
            r.implicit
                .iter()
                .map(|s| {
                    s.spec
                        .resource_attributes
                        .as_ref()
                        .unwrap()
                        .resource
                        .clone()
                        .unwrap()
                })
                .collect()
        };
        assert_eq!(
            res(&clone_reviews(CloneSourceKind::Pvc, "g", "n", &user())),
            ["pods"]
        );
        assert_eq!(
            res(&clone_reviews(CloneSourceKind::Snapshot, "g", "n", &user())),
            ["pods", "pvcs"]
        );
    }

    #[test]
    fn authorization_needs_the_explicit_review_or_every_implicit_one() {
        let u = user();
        assert!(clone_authorized(true, &[false], &u, "golden").is_ok());
        assert!(clone_authorized(false, &[true, true], &u, "golden").is_ok());
        assert_eq!(
            clone_authorized(false, &[true, false], &u, "golden"),
            Err("User alice has insufficient permissions in clone source namespace golden".into())
        );
    }
}
