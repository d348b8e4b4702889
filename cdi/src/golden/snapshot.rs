//! How a DataImportCron keeps its imports, as CDI decides it: the StorageProfile of the cron's
//! StorageClass says `dataImportCronSourceFormat` `pvc` (each version stays the PVC it was
//! imported into) or `snapshot` (each version is kept as a VolumeSnapshot of that PVC, which is
//! then deleted). This module parses the format, chooses the VolumeSnapshotClass (the
//! profile's `snapshotClass`, else the class of the provisioner's driver, the default-annotated
//! one first) and builds the snapshot. The cron's decisions are [`super::cron`]'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::DynamicObject;

use super::cron::cron_labels;
use super::gc::LAST_USE_ANNOTATION;
use crate::datavolume::clone::objects::ANN_SELECTED_NODE;
use api::golden::DataImportCron;
use api::snapshot::{
    ANN_SOURCE_NODE, ANN_SOURCE_VOLUME_MODE, VolumeSnapshot, VolumeSnapshotSource,
    VolumeSnapshotSpec,
};

/// The annotation marking a VolumeSnapshotClass as its driver's default.
pub const ANN_DEFAULT_SNAPSHOT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";

/// How a cron keeps each imported version (CDI's `DataImportCronSourceFormat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SourceFormat {
    /// The PVC the version was imported into (CDI's default).
    #[default]
    Pvc,
    /// A VolumeSnapshot of that PVC; the PVC goes once the snapshot is ready.
    Snapshot,
}

impl SourceFormat {
    /// CDI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceFormat::Pvc => "pvc",
            SourceFormat::Snapshot => "snapshot",
        }
    }

    /// A StorageProfile's `status.dataImportCronSourceFormat` (unset: `pvc`, as CDI).
    pub fn parse(profile: &str, value: Option<&str>) -> Result<SourceFormat, FormatError> {
        match value {
            None | Some("pvc") => Ok(SourceFormat::Pvc),
            Some("snapshot") => Ok(SourceFormat::Snapshot),
            Some(other) => Err(FormatError::Unknown {
                profile: profile.into(),
                value: other.into(),
            }),
        }
    }

    /// A cron's `status.sourceFormat`: the format its last import is kept in (unset: `pvc`,
    /// what Quarry wrote before it kept snapshots).
    pub fn of_status(value: Option<&str>) -> SourceFormat {
        match value {
            Some("snapshot") => SourceFormat::Snapshot,
            _ => SourceFormat::Pvc,
        }
    }
}

/// Why the imports cannot be kept as the StorageProfile asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The profile names a format CDI does not know (CDI fails the same way).
    #[error(
        "StorageProfile {profile}: dataImportCronSourceFormat {value:?} is neither pvc nor snapshot"
    )]
    Unknown {
        /// The StorageProfile (named like its StorageClass).
        profile: String,
        /// What it says.
        value: String,
    },
    /// No VolumeSnapshotClass can take the snapshots: the import stays a PVC.
    #[error("{0}")]
    NoSnapshotClass(String),
}

impl FormatError {
    /// Whether trying again may succeed: a VolumeSnapshotClass may be created, an unknown
    /// format is the profile's until someone edits it.
    pub fn kind(&self) -> kubekit::error::ErrorKind {
        match self {
            FormatError::Unknown { .. } => kubekit::error::ErrorKind::Invalid,
            FormatError::NoSnapshotClass(_) => kubekit::error::ErrorKind::Transient,
        }
    }
}

/// The VolumeSnapshotClass for snapshots of `driver`'s volumes, as CDI picks it: the
/// StorageProfile's `snapshotClass` when it names a class of that driver; without one, the
/// driver's class annotated as default, else the first of its classes by name. `classes` are
/// the cluster's VolumeSnapshotClasses.
pub fn snapshot_class(
    driver: &str,
    profile_class: Option<&str>,
    classes: &[DynamicObject],
) -> Result<String, FormatError> {
    fn driver_of(c: &DynamicObject) -> Option<&str> {
        c.data.get("driver")?.as_str()
    }
    if let Some(name) = profile_class {
        let Some(c) = classes.iter().find(|c| c.name_any() == name) else {
            return Err(FormatError::NoSnapshotClass(format!(
                "the StorageProfile's snapshotClass {name} does not exist"
            )));
        };
        return match driver_of(c) {
            Some(d) if d == driver => Ok(name.into()),
            other => Err(FormatError::NoSnapshotClass(format!(
                "the StorageProfile's snapshotClass {name} is of driver {}, not {driver}",
                other.unwrap_or("(none)")
            ))),
        };
    }
    let mut of_driver: Vec<&DynamicObject> = classes
        .iter()
        .filter(|c| driver_of(c) == Some(driver))
        .collect();
    of_driver.sort_by_key(|c| c.name_any());
    let default = of_driver.iter().find(|c| {
        c.annotations()
            .get(ANN_DEFAULT_SNAPSHOT_CLASS)
            .is_some_and(|v| v == "true")
    });
    default
        .or(of_driver.first())
        .map(|c| c.name_any())
        .ok_or_else(|| {
            FormatError::NoSnapshotClass(format!("no VolumeSnapshotClass of driver {driver}"))
        })
}

/// Topology keys whose value is a node's name: Kubernetes' own, and the hostpath driver's
/// (`csi::TOPOLOGY_KEY`; the operators do not link the CSI crate). A zone's key says nothing
/// of the node.
const NODE_KEYS: [&str; 2] = ["kubernetes.io/hostname", "topology.hostpath.csi/node"];

/// The node a node-local volume lives on: the PVC's selected node, else the one its
/// PersistentVolume is pinned to (a PVC filled through a populator with immediate binding has
/// no selected node: the scheduler chose the node for its PVC').
pub fn volume_node(pvc: &PersistentVolumeClaim, pv: Option<&PersistentVolume>) -> Option<String> {
    if let Some(node) = pvc.annotations().get(ANN_SELECTED_NODE) {
        return Some(node.clone());
    }
    let terms = &pv?
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|t| {
        t.match_expressions.iter().flatten().find_map(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            (NODE_KEYS.contains(&e.key.as_str()) && e.operator == "In" && values.len() == 1)
                .then(|| values[0].clone())
        })
    })
}

/// The VolumeSnapshot keeping the import `pvc` of `cron` (CDI's: named as the PVC, in the
/// cron's namespace, labelled as the cron's imports, stamped as used `now`, with the PVC's
/// volume mode), plus the `node` of the PVC, where a node-local driver keeps it.
pub fn import_snapshot(
    cron: &DataImportCron,
    pvc: &PersistentVolumeClaim,
    class: &str,
    node: Option<&str>,
    now: Timestamp,
) -> VolumeSnapshot {
    let name = pvc.name_any();
    let mut s = VolumeSnapshot::new(
        &name,
        VolumeSnapshotSpec {
            source: VolumeSnapshotSource {
                persistent_volume_claim_name: Some(name.clone()),
                volume_snapshot_content_name: None,
            },
            volume_snapshot_class_name: Some(class.into()),
        },
    );
    s.metadata.namespace = cron.namespace();
    let mut labels = api::cdi::cdi_labels();
    labels.extend(cron_labels(cron));
    s.metadata.labels = Some(labels);
    let mut annotations = BTreeMap::from([(LAST_USE_ANNOTATION.to_string(), now.to_string())]);
    if let Some(mode) = pvc.spec.as_ref().and_then(|s| s.volume_mode.clone()) {
        annotations.insert(ANN_SOURCE_VOLUME_MODE.into(), mode);
    }
    if let Some(node) = node {
        annotations.insert(ANN_SOURCE_NODE.into(), node.into());
    }
    s.metadata.annotations = Some(annotations);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::golden::DATA_IMPORT_CRON_LABEL;

    fn class(name: &str, driver: &str, default: bool) -> DynamicObject {
        let ann = if default {
            serde_json::json!({ANN_DEFAULT_SNAPSHOT_CLASS: "true"})
        } else {
            serde_json::json!({})
        };
        serde_json::from_value(serde_json::json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": name, "annotations": ann},
            "driver": driver, "deletionPolicy": "Delete"
        }))
        .unwrap()
    }

    const HP: &str = "kubevirt.io.hostpath-provisioner";

    #[test]
    fn formats_parse_as_cdi_spells_them_and_unset_is_pvc() {
        assert_eq!(SourceFormat::parse("c", None), Ok(SourceFormat::Pvc));
        assert_eq!(SourceFormat::parse("c", Some("pvc")), Ok(SourceFormat::Pvc));
        assert_eq!(
            SourceFormat::parse("c", Some("snapshot")),
            Ok(SourceFormat::Snapshot)
        );
        let e = SourceFormat::parse("local", Some("Snapshot")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "StorageProfile local: dataImportCronSourceFormat \"Snapshot\" is neither pvc nor snapshot"
        );
        assert_eq!(e.kind(), kubekit::error::ErrorKind::Invalid);
        assert_eq!(SourceFormat::of_status(None), SourceFormat::Pvc);
        assert_eq!(
            SourceFormat::of_status(Some("snapshot")),
            SourceFormat::Snapshot
        );
    }

    #[test]
    fn the_profiles_class_wins_when_it_is_of_the_driver() {
        let classes = [class("a", HP, true), class("mine", HP, false)];
        assert_eq!(snapshot_class(HP, Some("mine"), &classes).unwrap(), "mine");
        let other = [class("ceph", "rbd.csi.ceph.com", false)];
        let e = snapshot_class(HP, Some("ceph"), &other).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the StorageProfile's snapshotClass ceph is of driver rbd.csi.ceph.com, not kubevirt.io.hostpath-provisioner"
        );
        assert_eq!(e.kind(), kubekit::error::ErrorKind::Transient);
        assert!(snapshot_class(HP, Some("gone"), &classes).is_err());
    }

    #[test]
    fn without_a_profile_class_the_drivers_default_then_the_first_by_name() {
        let classes = [
            class("z-default", HP, true),
            class("b", HP, false),
            class("a-ceph", "rbd.csi.ceph.com", true),
        ];
        assert_eq!(snapshot_class(HP, None, &classes).unwrap(), "z-default");
        let classes = [class("c", HP, false), class("b", HP, false)];
        assert_eq!(snapshot_class(HP, None, &classes).unwrap(), "b");
        assert_eq!(
            snapshot_class(HP, None, &[class("x", "other", true)])
                .unwrap_err()
                .to_string(),
            "no VolumeSnapshotClass of driver kubevirt.io.hostpath-provisioner"
        );
    }

    #[test]
    fn the_snapshot_is_named_and_labelled_as_the_import_and_remembers_mode_and_node() {
        let cron: DataImportCron = serde_json::from_value(serde_json::json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
            "metadata": {"name": "fedora-cron", "namespace": "golden",
                         "labels": {"instancetype.kubevirt.io/default-preference": "fedora",
                                    "team": "not-passed"}},
            "spec": {"schedule": "", "managedDataSource": "fedora", "retentionPolicy": "None",
                     "template": {"spec": {"source": {"blank": {}}}}}
        }))
        .unwrap();
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "fedora-111111111111", "namespace": "golden"},
            "spec": {"volumeMode": "Block"}
        }))
        .unwrap();
        let now: Timestamp = "2024-05-02T10:00:00Z".parse().unwrap();
        let s = import_snapshot(&cron, &pvc, "hostpath-csi-snapshots", Some("node-a"), now);
        assert_eq!(s.metadata.name.as_deref(), Some("fedora-111111111111"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("golden"));
        assert_eq!(
            s.spec.source.persistent_volume_claim_name.as_deref(),
            Some("fedora-111111111111")
        );
        assert_eq!(
            s.spec.volume_snapshot_class_name.as_deref(),
            Some("hostpath-csi-snapshots")
        );
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[DATA_IMPORT_CRON_LABEL], "fedora-cron");
        assert_eq!(labels["cdi.kubevirt.io/dataImportCron.cleanup"], "true");
        assert_eq!(
            labels["instancetype.kubevirt.io/default-preference"],
            "fedora"
        );
        assert!(!labels.contains_key("team"));
        let ann = s.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[LAST_USE_ANNOTATION], "2024-05-02T10:00:00Z");
        assert_eq!(ann[ANN_SOURCE_VOLUME_MODE], "Block");
        assert_eq!(ann[ANN_SOURCE_NODE], "node-a");
        assert!(s.metadata.owner_references.is_none());
    }

    fn pv(key: &str, values: &[&str]) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": key, "operator": "In", "values": values}]}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn a_volumes_node_is_its_selected_node_else_its_pvs_node_affinity() {
        let bare = PersistentVolumeClaim::default();
        let selected: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"annotations": {ANN_SELECTED_NODE: "node-a"}}
        }))
        .unwrap();
        let hostpath = pv("topology.hostpath.csi/node", &["node-b"]);
        assert_eq!(
            volume_node(&selected, Some(&hostpath)).as_deref(),
            Some("node-a")
        );
        assert_eq!(
            volume_node(&bare, Some(&hostpath)).as_deref(),
            Some("node-b")
        );
        let host = pv("kubernetes.io/hostname", &["node-c"]);
        assert_eq!(volume_node(&bare, Some(&host)).as_deref(), Some("node-c"));
        // A zone, or a choice of nodes, names no one node.
        let zone = pv("topology.kubernetes.io/zone", &["eu-1a"]);
        assert_eq!(volume_node(&bare, Some(&zone)), None);
        let two = pv("kubernetes.io/hostname", &["n1", "n2"]);
        assert_eq!(volume_node(&bare, Some(&two)), None);
        assert_eq!(volume_node(&bare, None), None);
    }
}
