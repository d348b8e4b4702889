//! HPP's storage pools on PVCs (`storagePools[].pvcTemplate`) on the node: a pool whose PVC
//! comes from a local StorageClass (a static local PersistentVolume on a directory of the node)
//! is mounted by its mounter at the pool's path, reported with its claim, and a DataVolume of
//! the pool's StorageClass keeps its disk on that PVC.

use std::time::Duration;

use crate::support::{
    AddedPool, DV_LIMIT, assert_disk, cluster, driver_rolled_out, dv_yaml, qcow2_image,
    wait_succeeded,
};
use crate::support::{CLASS, FileServer};
use testkit::cluster::{Cluster, NAMESPACE};

const POOL: &str = "onpvc";
const LOCAL_CLASS: &str = "quarry-test-local";

/// The pool added to the HostPathProvisioner and the local volume under it, all taken back
/// when dropped.
struct PvcPool<'a> {
    c: &'a Cluster,
    added: AddedPool<'a>,
    backing: std::path::PathBuf,
}

impl<'a> PvcPool<'a> {
    fn add(c: &'a Cluster) -> PvcPool<'a> {
        let backing =
            std::path::PathBuf::from(format!("/var/tmp/quarry-pvc-pool-{:x}", std::process::id()));
        std::fs::create_dir_all(&backing).unwrap();
        c.apply(&format!(
            "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {LOCAL_CLASS}}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {LOCAL_CLASS}-pv}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: {LOCAL_CLASS}
  persistentVolumeReclaimPolicy: Retain
  local: {{path: {backing}}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {{key: kubernetes.io/hostname, operator: In, values: [{node}]}}
",
            backing = backing.display(),
            node = c.node_name
        ));
        let value = format!(
            r#"{{"name":"{POOL}","path":"/var/hpvolumes/{POOL}","pvcTemplate":{{"storageClassName":"{LOCAL_CLASS}","accessModes":["ReadWriteOnce"],"resources":{{"requests":{{"storage":"1Gi"}}}}}}}}"#
        );
        let added = AddedPool::add(c, POOL, &value);
        PvcPool { c, added, backing }
    }
}

impl Drop for PvcPool<'_> {
    fn drop(&mut self) {
        let c = self.c;
        self.added.restore();
        let mounter = format!("deployment/hpp-pool-{POOL}-{}", c.node_name);
        let _ = c.kubectl(&[
            "-n",
            NAMESPACE,
            "wait",
            "--for=delete",
            &mounter,
            "--timeout=120s",
        ]);
        let pvc = format!("hpp-pool-{POOL}-{}", c.node_name);
        let _ = c.kubectl(&["-n", NAMESPACE, "delete", "pvc", &pvc, "--wait=true"]);
        let _ = c.kubectl(&["delete", "pv", &format!("{LOCAL_CLASS}-pv"), "--wait=true"]);
        let _ = c.kubectl(&["delete", "storageclass", LOCAL_CLASS]);
        let _ = std::fs::remove_dir_all(&self.backing);
    }
}

#[test]
fn a_pool_on_a_pvc_keeps_its_volumes_on_that_pvc() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let server = FileServer::start(c, dir.path());
    let pool = PvcPool::add(c);
    // The pool's status: Ready once its mounter runs, with its PVC bound.
    let status = format!("{{.status.storagePoolStatuses[?(@.name==\"{POOL}\")]");
    c.wait_for(
        "default",
        "hostpathprovisioner/hostpath-provisioner",
        &format!("{status}.phase}}"),
        "Ready",
        DV_LIMIT,
    );
    let claim = c.kubectl_ok(&[
        "get",
        "hostpathprovisioner",
        "hostpath-provisioner",
        "-o",
        &format!(
            "jsonpath={status}.claimStatuses[0].name}}={status}.claimStatuses[0].status.phase}}"
        ),
    ]);
    assert_eq!(claim, format!("hpp-pool-{POOL}-{}=Bound", c.node_name));
    let rolled = driver_rolled_out(c);
    assert!(rolled.status.success(), "the driver's rollout: {rolled:?}");

    let ns = c.namespace("pvc-pool", &[]);
    let source = format!("    http:\n      url: {}/disk.qcow2", server.url);
    let yaml = dv_yaml(&ns, "onpvc", &source, "64Mi", false)
        .replace(CLASS, &format!("hostpath-csi-{POOL}"));
    c.apply(&yaml);
    wait_succeeded(c, &ns, "onpvc", std::time::Instant::now());
    assert_disk(c, &ns, "onpvc", &image, false);
    // The disk is on the pool's PVC: in the local volume's directory, not under the mount.
    let pv = c.kubectl_ok(&[
        "-n",
        &ns,
        "get",
        "pvc",
        "onpvc",
        "-o",
        "jsonpath={.spec.volumeName}",
    ]);
    let disk = pool.backing.join(&pv).join("disk.img");
    let len = std::fs::metadata(&disk).map(|m| m.len());
    assert!(
        len.as_ref().is_ok_and(|l| *l > 0),
        "{}: {len:?}",
        disk.display()
    );
    c.kubectl_ok(&[
        "-n",
        &ns,
        "delete",
        "dv",
        "onpvc",
        "--wait=true",
        "--timeout=120s",
    ]);
    let start = std::time::Instant::now();
    while disk.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{} left",
            disk.display()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(pool);
}
