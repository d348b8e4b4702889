//! The objects a clone creates, as pure builders: the target PVC with a `dataSource` (CSI clone,
//! or a restore from a VolumeSnapshot) pinned to the source's node, the temporary VolumeSnapshot
//! of a smart clone, the host-assisted clone source pod (`quarry clone-source`), and the pod that
//! grows `disk.img` after an expansion (`quarry resize-disk`). [`super::flow`] decides
//! which to create when.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolumeClaim, Pod, TypedLocalObjectReference, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use uploader::cli::{CloneSourceArgs, ResizeDiskArgs};
use uploader::clone::CloneKind;

use super::Strategy;
use crate::datavolume::pod::{self, BLOCK_DEVICE, DISK_IMG, TLS_DIR};
use crate::datavolume::pvc::{ALIGN, Claim, VolumeMode, desired_pvc};
use crate::datavolume::{ANN_OWNED_BY, labels, name, owner_ref};
use crate::settings::Config;
use api::DataVolume;
use api::snapshot::{self, VolumeSnapshot, VolumeSnapshotSource, VolumeSnapshotSpec};

/// The node a PVC's volume was provisioned on (the scheduler's annotation, CDI's
/// `AnnSelectedNode`); a hostpath volume lives there only.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The strategy a clone's target PVC was made with (CDI's `AnnCloneType`).
pub const ANN_CLONE_TYPE: &str = "cdi.kubevirt.io/cloneType";
/// Path of the upload server that receives a host-assisted clone stream.
pub const CLONE_UPLOAD_PATH: &str = "/v1beta1/upload";

/// The node a PVC's volume lives on, if the scheduler chose one.
pub fn node_of(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.metadata
        .annotations
        .as_ref()?
        .get(ANN_SELECTED_NODE)
        .map(String::as_str)
}

/// A PVC's capacity (else its request) in bytes.
pub fn capacity(pvc: &PersistentVolumeClaim) -> Option<u64> {
    let q = pvc
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .or_else(|| {
            pvc.spec
                .as_ref()?
                .resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("storage")
        })?;
    quantity::parse(&q.0).ok()
}

/// The name of a smart clone's temporary VolumeSnapshot (CDI's `cdi-tmp-<uid>`).
pub fn temp_snapshot_name(dv: &DataVolume) -> String {
    format!("cdi-tmp-{}", dv.metadata.uid.as_deref().unwrap_or_default())
}

/// The host-assisted clone source pod's name (CDI's `<target PVC UID>-source-pod`); its client
/// certificate Secret has the same name.
pub fn source_pod_name(target_pvc_uid: &str) -> String {
    format!("{target_pvc_uid}-source-pod")
}

/// The PVC a snapshot is restored into, in the snapshot's namespace, for a host-assisted copy
/// of it (CDI's `<DataVolume UID>-host-assisted-source-pvc`).
pub fn restore_name(dv: &DataVolume) -> String {
    format!(
        "{}-host-assisted-source-pvc",
        dv.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// What a snapshot's restore for a host-assisted copy is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct Restore<'a> {
    /// The snapshot's namespace and name.
    pub namespace: &'a str,
    /// The snapshot.
    pub snapshot: &'a str,
    /// A StorageClass of the snapshot's driver.
    pub class: &'a str,
    /// The volume mode of the volume the snapshot was taken of.
    pub mode: VolumeMode,
    /// The snapshot's restore size, bytes.
    pub size: u64,
    /// Where its data is (a node-local driver restores there).
    pub node: Option<&'a str>,
}

/// The PVC restored from a snapshot that a host-assisted copy reads (CDI's way to clone a
/// snapshot across namespaces, drivers or modes): in the snapshot's namespace, owned by the
/// DataVolume when that is its own, else named by [`ANN_OWNED_BY`] (the DataVolume's
/// controller deletes it).
pub fn restore_pvc(dv: &DataVolume, r: &Restore) -> PersistentVolumeClaim {
    let mut annotations = BTreeMap::from([(
        ANN_OWNED_BY.to_string(),
        format!(
            "{}/{}",
            dv.metadata.namespace.as_deref().unwrap_or_default(),
            name(dv)
        ),
    )]);
    if let Some(node) = r.node {
        annotations.insert(ANN_SELECTED_NODE.into(), node.into());
    }
    let own = dv.metadata.namespace.as_deref() == Some(r.namespace);
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(restore_name(dv)),
            namespace: Some(r.namespace.into()),
            labels: Some(labels(dv)),
            annotations: Some(annotations),
            owner_references: own.then(|| owner_ref(dv).into_iter().collect()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(r.class.into()),
            volume_mode: Some(r.mode.as_str().into()),
            data_source: Some(snapshot_source(r.snapshot)),
            resources: Some(k8s_openapi::api::core::v1::VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(r.size.to_string()),
                )])),
                limits: None,
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The pod that grows `disk.img` after an expansion.
pub fn resize_pod_name(dv: &DataVolume) -> String {
    format!("cdi-expand-{}", name(dv))
}

/// Bytes of a filesystem volume of `capacity` a disk image may fill after the filesystem's
/// `overhead`, aligned down to 1 MiB (CDI's usable space).
pub fn usable_space(capacity: u64, overhead: f64) -> u64 {
    let usable = (capacity as f64 * (1.0 - overhead)).floor() as u64;
    usable / ALIGN * ALIGN
}

/// The target PVC of a CSI clone or snapshot restore: the DataVolume's PVC with `data_source`,
/// requesting `size` bytes (the source's, expanded afterwards when the target asks for more),
/// placed on the source's `node`.
pub fn target_pvc(
    dv: &DataVolume,
    claim: &Claim,
    data_source: TypedLocalObjectReference,
    size: u64,
    node: Option<&str>,
    strategy: Strategy,
) -> PersistentVolumeClaim {
    let mut pvc = desired_pvc(dv, claim);
    let annotations = pvc.metadata.annotations.get_or_insert_default();
    annotations.insert(ANN_CLONE_TYPE.into(), strategy.as_str().into());
    if let Some(node) = node {
        annotations.insert(ANN_SELECTED_NODE.into(), node.into());
    }
    let spec = pvc.spec.get_or_insert_default();
    spec.data_source = Some(data_source);
    spec.resources
        .get_or_insert_default()
        .requests
        .get_or_insert_default()
        .insert("storage".into(), Quantity(size.to_string()));
    pvc
}

/// `data_source` naming a PVC.
pub fn pvc_source(name: &str) -> TypedLocalObjectReference {
    TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: name.into(),
    }
}

/// `data_source` naming a VolumeSnapshot.
pub fn snapshot_source(name: &str) -> TypedLocalObjectReference {
    TypedLocalObjectReference {
        api_group: Some(snapshot::GROUP.into()),
        kind: "VolumeSnapshot".into(),
        name: name.into(),
    }
}

/// A smart clone's temporary VolumeSnapshot of `source_pvc` (in the DataVolume's namespace,
/// owned by it), of `class`.
pub fn temp_snapshot(dv: &DataVolume, source_pvc: &str, class: Option<&str>) -> VolumeSnapshot {
    let mut s = VolumeSnapshot::new(
        &temp_snapshot_name(dv),
        VolumeSnapshotSpec {
            source: VolumeSnapshotSource {
                persistent_volume_claim_name: Some(source_pvc.into()),
                volume_snapshot_content_name: None,
            },
            volume_snapshot_class_name: class.map(Into::into),
        },
    );
    s.metadata.namespace = dv.metadata.namespace.clone();
    s.metadata.labels = Some(labels(dv));
    s.metadata.owner_references = owner_ref(dv).map(|o| vec![o]);
    s
}

/// The URL the clone source posts to: the upload Service of the target `w` works for.
pub fn upload_url(w: &pod::Workload, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!(
        "{scheme}://{}.{}.svc{CLONE_UPLOAD_PATH}",
        pod::upload_name(&w.name),
        w.namespace.as_deref().unwrap_or_default()
    )
}

/// Where the clone source pod runs and what it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcePodSpec<'a> {
    /// The source PVC's namespace and name.
    pub namespace: &'a str,
    /// The source PVC.
    pub pvc: &'a str,
    /// Its volume mode.
    pub mode: VolumeMode,
    /// Its node (hostpath volumes are node-local).
    pub node: Option<&'a str>,
    /// The target PVC's UID (names the pod).
    pub target_uid: &'a str,
    /// The Secret with the client certificate (`tls.crt`, `tls.key`) and the upload server's
    /// CA (`ca.crt`), in the source namespace (None: none issued).
    pub tls_secret: Option<&'a str>,
}

/// How long a clone source pod waits for its upload server to answer before its attempts.
pub const SERVER_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// The host-assisted clone source pod: `quarry clone-source` streaming the source volume
/// (mounted read-only: `disk.img`, or the block device) to the upload server of the target `w`
/// works for, on the source's node, in the source namespace. It has no owner (a reference cannot
/// cross namespaces: the controller deletes it).
pub fn source_pod(w: &pod::Workload, s: &SourcePodSpec, cfg: &Config) -> Pod {
    let (path, content_type) = match s.mode {
        VolumeMode::Filesystem => (DISK_IMG, CloneKind::Filesystem),
        VolumeMode::Block => (BLOCK_DEVICE, CloneKind::Blockdevice),
    };
    let mut args = CloneSourceArgs::new(path, content_type);
    args.upload_url = Some(upload_url(w, cfg.upload_tls.is_some()));
    // Made beside the upload server, it waits for it (then fails and is replaced).
    args.server_wait = SERVER_WAIT;
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    if let Some(secret) = s.tls_secret {
        args.ca_file = Some(format!("{TLS_DIR}/ca.crt").into());
        args.client_cert = Some(format!("{TLS_DIR}/tls.crt").into());
        args.client_key = Some(format!("{TLS_DIR}/tls.key").into());
        mounts.push(pod::mount("cdi-client-tls", TLS_DIR, true));
        volumes.push(pod::secret_volume("cdi-client-tls", secret));
    }
    // Its progress, as CDI's cloner serves it: the controller reads it as an importer's.
    args.metrics_addr = Some(SocketAddr::from(([0, 0, 0, 0], pod::POD_PORT as u16)));
    args.owner_uid = Some(s.target_uid.into());
    let c = Container {
        name: "cdi-clone-source".into(),
        args: Some(pod::subcommand("clone-source", args.to_args())),
        volume_mounts: Some(mounts),
        ports: pod::port("metrics"),
        ..Default::default()
    };
    let source_claim = Claim {
        spec: Default::default(),
        size: 0,
        mode: s.mode,
        overhead: 0.0,
    };
    let mut p = pod::pod(
        w,
        source_pod_name(s.target_uid),
        &source_claim,
        c,
        (volumes, BTreeMap::new()),
        cfg,
    );
    p.metadata.namespace = Some(s.namespace.into());
    p.metadata.owner_references = None;
    let spec = p.spec.get_or_insert_default();
    for v in spec.volumes.iter_mut().flatten() {
        if let Some(claim) = &mut v.persistent_volume_claim {
            claim.claim_name = s.pvc.into();
            claim.read_only = Some(true);
        }
    }
    for c in &mut spec.containers {
        for m in c.volume_mounts.iter_mut().flatten() {
            if m.name == "cdi-data-vol" {
                *m = VolumeMount {
                    read_only: Some(true),
                    ..m.clone()
                };
            }
        }
    }
    // Where the source lives, over the workload placement's affinity.
    if let Some(node) = s.node {
        spec.affinity = Some(on_node(node));
    }
    p
}

/// What a failed clone source pod says, for its event: it is replaced while the upload server
/// waits.
pub fn source_pod_failed(p: &Pod) -> String {
    let (code, msg) = crate::datavolume::decide::terminated(p).unwrap_or((-1, String::new()));
    format!("Clone source pod failed: {msg} (exit code {code}); restarting")
}

/// Required node affinity to the node named `node` (the scheduler still places the pod).
fn on_node(node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.into()]),
                    }]),
                    match_expressions: None,
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod that grows the target's `disk.img` to `size` bytes after its PVC expanded
/// (`quarry resize-disk`, which never shrinks).
pub fn resize_pod(dv: &DataVolume, claim: &Claim, size: u64, cfg: &Config) -> Pod {
    let c = Container {
        name: "cdi-expand".into(),
        args: Some(pod::subcommand(
            "resize-disk",
            ResizeDiskArgs {
                target: DISK_IMG.into(),
                size,
                filesystem_overhead: None,
                json: false,
            }
            .to_args(),
        )),
        ..Default::default()
    };
    let meta = (Vec::new(), BTreeMap::new());
    pod::pod(
        &pod::Workload::of(dv),
        resize_pod_name(dv),
        claim,
        c,
        meta,
        cfg,
    )
}

/// The metadata of the client certificate Secret of a clone source pod in `namespace`, for the
/// target `w` works for.
pub fn client_secret_meta(w: &pod::Workload, namespace: &str, target_uid: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(source_pod_name(target_uid)),
        namespace: Some(namespace.into()),
        labels: Some(w.labels.clone()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datavolume::pvc::{StorageDefaults, claim};
    use api::DataVolumeSpec;

    fn dv() -> DataVolume {
        let mut dv: DataVolume = serde_json::from_value(serde_json::json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "vm-disk", "namespace": "vms", "uid": "dv-uid"},
            "spec": {"source": {"pvc": {"namespace": "golden", "name": "fedora"}},
                     "storage": {"resources": {"requests": {"storage": "2Gi"}}}}
        }))
        .unwrap();
        dv.spec = DataVolumeSpec { ..dv.spec };
        dv
    }

    fn the_claim() -> Claim {
        claim(&dv(), &Config::default(), &StorageDefaults::Builtin).unwrap()
    }

    #[test]
    fn a_csi_clone_target_has_the_source_as_data_source_on_its_node() {
        let p = target_pvc(
            &dv(),
            &the_claim(),
            pvc_source("fedora"),
            1 << 30,
            Some("node-a"),
            Strategy::CsiClone,
        );
        let spec = p.spec.unwrap();
        let ds = spec.data_source.unwrap();
        assert_eq!(
            (ds.kind.as_str(), ds.name.as_str()),
            ("PersistentVolumeClaim", "fedora")
        );
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"].0,
            (1u64 << 30).to_string()
        );
        let ann = p.metadata.annotations.unwrap();
        assert_eq!(ann[ANN_SELECTED_NODE], "node-a");
        assert_eq!(ann[ANN_CLONE_TYPE], "csi-clone");
    }

    #[test]
    fn a_restore_names_the_snapshot_with_its_api_group() {
        let p = target_pvc(
            &dv(),
            &the_claim(),
            snapshot_source("cdi-tmp-dv-uid"),
            1 << 30,
            None,
            Strategy::Snapshot,
        );
        let ds = p.spec.unwrap().data_source.unwrap();
        assert_eq!(ds.api_group.as_deref(), Some("snapshot.storage.k8s.io"));
        assert_eq!(ds.kind, "VolumeSnapshot");
    }

    #[test]
    fn the_temporary_snapshot_is_owned_by_the_datavolume_and_names_its_class() {
        let s = temp_snapshot(&dv(), "fedora", Some("hostpath-snapclass"));
        assert_eq!(s.metadata.name.as_deref(), Some("cdi-tmp-dv-uid"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("vms"));
        assert_eq!(
            s.metadata.owner_references.as_ref().unwrap()[0].kind,
            "DataVolume"
        );
        assert_eq!(
            s.spec.source.persistent_volume_claim_name.as_deref(),
            Some("fedora")
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["apiVersion"], "snapshot.storage.k8s.io/v1");
        assert_eq!(
            json["spec"]["volumeSnapshotClassName"],
            "hostpath-snapclass"
        );
    }

    fn source(mode: VolumeMode, tls: Option<&'static str>) -> Pod {
        let s = SourcePodSpec {
            namespace: "golden",
            pvc: "fedora",
            mode,
            node: Some("node-a"),
            target_uid: "pvc-uid",
            tls_secret: tls,
        };
        let cfg = Config {
            upload_tls: tls.map(|_| crate::settings::UploadTls::Issued {
                namespace: "quarry".into(),
            }),
            ..Config::default()
        };
        source_pod(&pod::Workload::of(&dv()), &s, &cfg)
    }

    #[test]
    fn the_source_pod_reads_the_source_read_only_in_its_namespace_on_its_node() {
        let p = source(VolumeMode::Filesystem, Some("pvc-uid-source-pod"));
        assert_eq!(p.metadata.name.as_deref(), Some("pvc-uid-source-pod"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("golden"));
        assert!(p.metadata.owner_references.is_none());
        let spec = p.spec.unwrap();
        let claim = spec.volumes.as_ref().unwrap()[0]
            .persistent_volume_claim
            .clone()
            .unwrap();
        assert_eq!(
            (claim.claim_name.as_str(), claim.read_only),
            ("fedora", Some(true))
        );
        let c = &spec.containers[0];
        let data = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "cdi-data-vol");
        assert_eq!(data.unwrap().read_only, Some(true));
        let args = c.args.clone().unwrap().join(" ");
        assert!(args.starts_with(
            "clone-source --source /data/disk.img --upload-url https://cdi-upload-vm-disk.vms.svc/v1beta1/upload --content-type filesystem-clone --ca-file /tls/ca.crt --client-cert /tls/tls.crt --client-key /tls/tls.key"
        ), "{args}");
        let term = &spec
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms[0];
        assert_eq!(
            term.match_fields.as_ref().unwrap()[0].values,
            Some(vec!["node-a".into()])
        );
    }

    #[test]
    fn a_block_source_streams_the_device_without_tls_when_none_is_configured() {
        let p = source(VolumeMode::Block, None);
        let c = &p.spec.unwrap().containers[0];
        let args = c.args.clone().unwrap().join(" ");
        assert_eq!(
            args,
            "clone-source --source /dev/cdi-block-volume --upload-url http://cdi-upload-vm-disk.vms.svc/v1beta1/upload --content-type blockdevice-clone --server-wait 600s --metrics-addr 0.0.0.0:8443 --owner-uid pvc-uid"
        );
        let port = &c.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("metrics"), 8443)
        );
        assert_eq!(
            c.volume_devices.as_ref().unwrap()[0].device_path,
            BLOCK_DEVICE
        );
    }

    #[test]
    fn usable_space_leaves_the_overhead_and_aligns_down() {
        assert_eq!(usable_space(1 << 30, 0.0), 1 << 30);
        // 2 GiB less 5.5 %, down to whole MiB.
        let u = usable_space(2 << 30, 0.055);
        assert_eq!(u % ALIGN, 0);
        assert!(u <= ((2u64 << 30) as f64 * 0.945) as u64);
        assert!(u > ((2u64 << 30) as f64 * 0.945) as u64 - ALIGN);
    }

    #[test]
    fn the_resize_pod_grows_disk_img_to_the_size() {
        let p = resize_pod(&dv(), &the_claim(), 123 << 20, &Config::default());
        let args = p.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap()
            .join(" ");
        assert_eq!(
            args,
            format!(
                "resize-disk --target /data/disk.img --size {}",
                123u64 << 20
            )
        );
    }
}
