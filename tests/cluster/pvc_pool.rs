//! HPP's storage pools on PVCs (`storagePools[].pvcTemplate`) on the node: a pool whose PVC
//! comes from a local StorageClass (a static local PersistentVolume on a directory of the node,
//! or a Block one on a loop device) is mounted by its mounter at the pool's path (a blank device
//! gets an XFS filesystem first), reported with its claim, and a DataVolume of the pool's
//! StorageClass keeps its disk on that PVC.

use std::time::Duration;

use crate::support::{
    AddedPool, DV_LIMIT, assert_disk, cluster, driver_rolled_out, dv_yaml, qcow2_image,
    wait_succeeded,
};
use crate::support::{CLASS, FileServer};
use testkit::cluster::{Cluster, NAMESPACE};

/// What backs the pool's PVC: a directory, or a loop device (a Block volume).
enum Backing {
    Dir(std::path::PathBuf),
    Loop {
        file: std::path::PathBuf,
        device: String,
    },
}

/// The pool added to the HostPathProvisioner and the local volume under it, all taken back
/// when dropped.
struct PvcPool<'a> {
    c: &'a Cluster,
    name: &'static str,
    class: String,
    added: AddedPool<'a>,
    backing: Backing,
}

impl<'a> PvcPool<'a> {
    /// A pool `name` on a local volume: a directory, or with `block` a blank loop device.
    fn add(c: &'a Cluster, name: &'static str, block: bool) -> PvcPool<'a> {
        let base = format!("/var/tmp/quarry-pvc-pool-{name}-{:x}", std::process::id());
        let (backing, path, mode, size) = if block {
            // mkfs.xfs takes 300 MiB at least.
            let file = std::path::PathBuf::from(format!("{base}.img"));
            let f = std::fs::File::create(&file).unwrap();
            f.set_len(320 << 20).unwrap();
            let out = std::process::Command::new("losetup")
                .args(["-f", "--show"])
                .arg(&file)
                .output()
                .expect("losetup");
            assert!(out.status.success(), "losetup: {out:?}");
            let device = String::from_utf8(out.stdout).unwrap().trim().to_string();
            let path = device.clone();
            (Backing::Loop { file, device }, path, "Block", "320Mi")
        } else {
            let dir = std::path::PathBuf::from(&base);
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.display().to_string();
            (Backing::Dir(dir), path, "Filesystem", "1Gi")
        };
        let class = format!("quarry-test-local-{name}");
        c.apply(&format!(
            "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {class}}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {class}-pv}}
spec:
  capacity: {{storage: {size}}}
  volumeMode: {mode}
  accessModes: [ReadWriteOnce]
  storageClassName: {class}
  persistentVolumeReclaimPolicy: Retain
  local: {{path: {path}}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {{key: kubernetes.io/hostname, operator: In, values: [{node}]}}
",
            node = c.node_name
        ));
        let value = format!(
            r#"{{"name":"{name}","path":"/var/hpvolumes/{name}","pvcTemplate":{{"storageClassName":"{class}","volumeMode":"{mode}","accessModes":["ReadWriteOnce"],"resources":{{"requests":{{"storage":"{size}"}}}}}}}}"#
        );
        let added = AddedPool::add(c, name, &value);
        PvcPool {
            c,
            name,
            class,
            added,
            backing,
        }
    }

    /// Waits until the pool is Ready with its PVC bound and the driver serves it.
    fn wait_ready(&self) {
        let (c, name) = (self.c, self.name);
        let status = format!("{{.status.storagePoolStatuses[?(@.name==\"{name}\")]");
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
        assert_eq!(claim, format!("hpp-pool-{name}-{}=Bound", c.node_name));
        let rolled = driver_rolled_out(c);
        assert!(rolled.status.success(), "the driver's rollout: {rolled:?}");
    }

    /// Imports `image` (served by `server`) into a DataVolume of the pool's class in `ns`.
    fn import(&self, ns: &str, server: &FileServer, image: &crate::support::Image) {
        let c = self.c;
        let source = format!("    http:\n      url: {}/disk.qcow2", server.url);
        let yaml = dv_yaml(ns, self.name, &source, "64Mi", false)
            .replace(CLASS, &format!("hostpath-csi-{}", self.name));
        c.apply(&yaml);
        wait_succeeded(c, ns, self.name, std::time::Instant::now());
        assert_disk(c, ns, self.name, image, false);
    }

    /// The disk file of the DataVolume's volume, seen at `root`.
    fn disk(&self, ns: &str, root: &std::path::Path) -> std::path::PathBuf {
        let pv = crate::support::pvc_field(self.c, ns, self.name, "{.spec.volumeName}");
        root.join(pv).join("disk.img")
    }

    /// Deletes the DataVolume and waits for its disk to go.
    fn delete_and_wait(&self, ns: &str, disk: &std::path::Path) {
        self.c.kubectl_ok(&[
            "-n",
            ns,
            "delete",
            "dv",
            self.name,
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
    }
}

impl Drop for PvcPool<'_> {
    fn drop(&mut self) {
        let (c, name) = (self.c, self.name);
        self.added.restore();
        let mounter = format!("deployment/hpp-pool-{name}-{}", c.node_name);
        let _ = c.kubectl(&[
            "-n",
            NAMESPACE,
            "wait",
            "--for=delete",
            &mounter,
            "--timeout=120s",
        ]);
        let pvc = format!("hpp-pool-{name}-{}", c.node_name);
        let _ = c.kubectl(&["-n", NAMESPACE, "delete", "pvc", &pvc, "--wait=true"]);
        let _ = c.kubectl(&["delete", "pv", &format!("{}-pv", self.class), "--wait=true"]);
        let _ = c.kubectl(&["delete", "storageclass", &self.class]);
        match &self.backing {
            Backing::Dir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Backing::Loop { file, device } => {
                let _ = std::process::Command::new("losetup")
                    .args(["-d", device])
                    .status();
                let _ = std::fs::remove_file(file);
            }
        }
    }
}

/// The filesystem type mounted at `path` on the node (this machine), if any.
fn mounted_type(path: &str) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-")?;
        (f.get(4) == Some(&path)).then(|| f.get(sep + 1).map(|t| t.to_string()))?
    })
}

#[test]
fn a_pool_on_a_pvc_keeps_its_volumes_on_that_pvc() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let server = FileServer::start(c, dir.path());
    let pool = PvcPool::add(c, "onpvc", false);
    pool.wait_ready();
    let ns = c.namespace("pvc-pool", &[]);
    pool.import(&ns, &server, &image);
    // The disk is on the pool's PVC: in the local volume's directory, not under the mount.
    let Backing::Dir(backing) = &pool.backing else {
        unreachable!()
    };
    let disk = pool.disk(&ns, backing);
    let len = std::fs::metadata(&disk).map(|m| m.len());
    assert!(
        len.as_ref().is_ok_and(|l| *l > 0),
        "{}: {len:?}",
        disk.display()
    );
    pool.delete_and_wait(&ns, &disk);
    drop(pool);
}

/// A pool on a Block PVC (HPP's `volumeMode: Block` template): the mounter makes XFS on the
/// blank device and mounts it at the pool's path; the DataVolume's disk is on that XFS; a new
/// mounter pod mounts the same filesystem again without making another (the disk stays).
#[test]
fn a_pool_on_a_block_pvc_gets_a_filesystem_and_keeps_its_volumes_there() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let server = FileServer::start(c, dir.path());
    let pool = PvcPool::add(c, "onblock", true);
    pool.wait_ready();
    let Backing::Loop { device, .. } = &pool.backing else {
        unreachable!()
    };
    let blkid = |dev: &str| {
        let out = std::process::Command::new("blkid")
            .args(["-p", "-s", "TYPE", "-s", "UUID", "-o", "export", dev])
            .output()
            .expect("blkid");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let made = blkid(device);
    assert!(made.contains("TYPE=xfs"), "{device}: {made}");
    let path = "/var/hpvolumes/onblock";
    assert_eq!(mounted_type(path).as_deref(), Some("xfs"), "{path}");

    let ns = c.namespace("block-pool", &[]);
    pool.import(&ns, &server, &image);
    let disk = pool.disk(&ns, std::path::Path::new(path));
    assert!(disk.exists(), "{} is not on the pool's XFS", disk.display());

    // The mounter's pod replaced: the same filesystem mounted again, the disk still there.
    let selector = "kubevirt.io.hostpath-provisioner/storagePool=onblock";
    c.kubectl_ok(&[
        "-n",
        NAMESPACE,
        "delete",
        "pod",
        "-l",
        selector,
        "--wait=true",
    ]);
    let mounter = format!("deployment/hpp-pool-onblock-{}", c.node_name);
    c.kubectl_ok(&[
        "-n",
        NAMESPACE,
        "rollout",
        "status",
        &mounter,
        "--timeout=120s",
    ]);
    pool.wait_ready();
    let start = std::time::Instant::now();
    while mounted_type(path).as_deref() != Some("xfs") {
        assert!(start.elapsed() < DV_LIMIT, "{path} not mounted again");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(blkid(device), made, "the device was formatted again");
    assert!(disk.exists(), "{} gone after the remount", disk.display());
    assert_disk(c, &ns, "onblock", &image, false);
    pool.delete_and_wait(&ns, &disk);
    drop(pool);
}
