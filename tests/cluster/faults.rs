//! Faults on the node: each ends with the right bytes or a clear failure, and nothing left.

use std::time::{Duration, Instant};

use crate::support::{DV_LIMIT, Image, assert_disk, cluster, dv_yaml, wait_succeeded};
use testkit::cluster::Cluster;

/// A 48 MiB raw disk served by nginx on the node's address at 8 MiB/s: an import that runs for
/// a few seconds, long enough to interrupt.
fn slow_source(c: &Cluster, dir: &std::path::Path) -> (testkit::nginx::Nginx, Image) {
    let image = crate::support::raw_image_of(dir, "slow.img", 48 << 20, 7);
    let nginx = testkit::nginx::Nginx::start(testkit::nginx::NginxConfig {
        root: dir.into(),
        ranges: true,
        limit_rate: Some(8 << 20),
        address: Some(c.node_ip.parse().unwrap()),
        ..Default::default()
    });
    (nginx, image)
}

/// The importer killed mid-import (SIGKILL to its process on the node): counted as a restart,
/// tried again, the disk right.
#[test]
fn an_importer_pod_killed_mid_import_is_retried_and_finishes() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (nginx, image) = slow_source(c, dir.path());
    let ns = c.namespace("killed", &[]);
    let source = format!("    http:\n      url: {}", nginx.url("/slow.img"));
    c.apply(&dv_yaml(&ns, "slow", &source, "64Mi", false));
    c.wait_for(
        &ns,
        "dv/slow",
        "{.status.phase}",
        "ImportInProgress",
        DV_LIMIT,
    );
    // the importer's process is this node's: its arguments name this test's URL
    let url = nginx.url("/slow.img");
    let killed = std::process::Command::new("pkill")
        .args(["-KILL", "-e", "-f", &url])
        .output()
        .unwrap();
    assert!(killed.status.success(), "no importer process for {url}");
    wait_succeeded(c, &ns, "slow", Instant::now());
    let restarts = c.kubectl_ok(&[
        "-n",
        &ns,
        "get",
        "dv",
        "slow",
        "-o",
        "jsonpath={.status.restartCount}",
    ]);
    let events = crate::support::event_reasons(c, &ns, "DataVolume", "slow");
    assert!(
        restarts.parse::<u32>().unwrap_or(0) >= 1,
        "restartCount {restarts:?}, events {events:?}, killed: {}",
        String::from_utf8_lossy(&killed.stdout)
    );
    assert_disk(c, &ns, "slow", &image, false);
}

/// The DataVolume controller's pod deleted mid-import: the Deployment's next pod takes the Lease
/// and the import finishes with the right status.
#[test]
fn the_controller_deleted_mid_import_is_taken_over() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (nginx, image) = slow_source(c, dir.path());
    let ns = c.namespace("takeover", &[]);
    let source = format!("    http:\n      url: {}", nginx.url("/slow.img"));
    c.apply(&dv_yaml(&ns, "slow", &source, "64Mi", false));
    c.wait_for(
        &ns,
        "dv/slow",
        "{.status.phase}",
        "ImportInProgress",
        DV_LIMIT,
    );
    c.kubectl_ok(&[
        "-n",
        testkit::cluster::NAMESPACE,
        "delete",
        "pod",
        "-l",
        "app.kubernetes.io/name=quarry-datavolume-controller",
        "--wait=false",
    ]);
    wait_succeeded(c, &ns, "slow", Instant::now());
    assert_disk(c, &ns, "slow", &image, false);
}

/// A DataVolume deleted mid-import: its pod, PVC and volume go; nothing is left in the pool.
#[test]
fn a_data_volume_deleted_mid_import_leaves_nothing() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (nginx, _) = slow_source(c, dir.path());
    let ns = c.namespace("deleted", &[]);
    let source = format!("    http:\n      url: {}", nginx.url("/slow.img"));
    c.apply(&dv_yaml(&ns, "slow", &source, "64Mi", false));
    c.wait_for(
        &ns,
        "dv/slow",
        "{.status.phase}",
        "ImportInProgress",
        DV_LIMIT,
    );
    delete_and_expect_nothing_left(c, &ns, "slow");
}

/// Deletes the DataVolume `name` and waits until its pods, PVC, Services, PV and pool directory
/// are all gone.
fn delete_and_expect_nothing_left(c: &Cluster, ns: &str, name: &str) {
    let pv = c.kubectl_ok(&[
        "-n",
        ns,
        "get",
        "pvc",
        name,
        "-o",
        "jsonpath={.spec.volumeName}",
    ]);
    assert!(!pv.is_empty());
    c.kubectl_ok(&[
        "-n",
        ns,
        "delete",
        "dv",
        name,
        "--wait=true",
        "--timeout=120s",
    ]);
    let start = Instant::now();
    loop {
        let left = c.kubectl_ok(&["-n", ns, "get", "pod,pvc,service", "-o", "name"]);
        let pv_left = c.kubectl(&["get", "pv", &pv]).status.success();
        let dir_left = std::path::Path::new("/var/hpvolumes/csi")
            .join(&pv)
            .exists();
        if left.trim().is_empty() && !pv_left && !dir_left {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "left after the DataVolume's deletion: {left} pv {pv}: {pv_left}, its directory: {dir_left}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A DataVolume deleted mid-upload: the client's request ends and nothing is left.
#[test]
fn a_data_volume_deleted_mid_upload_leaves_nothing() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = crate::support::raw_image_of(dir.path(), "big.raw", 48 << 20, 5);
    let ns = c.namespace("cutupload", &[]);
    c.apply(&dv_yaml(&ns, "up", "    upload: {}", "64Mi", false));
    c.wait_for(&ns, "dv/up", "{.status.phase}", "UploadReady", DV_LIMIT);
    let token = crate::support::upload_token(c, &ns, "up");
    let ip = crate::support::upload_proxy_ip(c);
    // a slow upload, cut by the deletion
    let curl = std::process::Command::new("curl")
        .args([
            "-sS",
            "-k",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--limit-rate",
            "4M",
        ])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg("--data-binary")
        .arg(format!("@{}", image.path.display()))
        .arg(format!("https://{ip}/v1beta1/upload"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // the upload is under way once its first bytes are in the volume on the node
    let pv = c.kubectl_ok(&[
        "-n",
        &ns,
        "get",
        "pvc",
        "up",
        "-o",
        "jsonpath={.spec.volumeName}",
    ]);
    let disk = std::path::Path::new("/var/hpvolumes/csi")
        .join(&pv)
        .join("disk.img");
    let start = Instant::now();
    while std::fs::metadata(&disk).map_or(0, |m| m.len()) == 0 {
        assert!(
            start.elapsed() < DV_LIMIT,
            "no upload bytes reached {}",
            disk.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    delete_and_expect_nothing_left(c, &ns, "up");
    // the client's request ends (cut, or finished by the server within its grace period)
    let out = curl.wait_with_output().unwrap();
    assert!(out.status.code().is_some());
}

/// The CSI driver's pod deleted while a pod uses a volume: the pod keeps reading its data, and
/// a new volume mounts once the driver is back.
#[test]
fn the_csi_driver_restarted_under_a_running_pod_keeps_its_data() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = crate::support::qcow2_image(dir.path(), &[]);
    let server = crate::support::FileServer::start(c, dir.path());
    let ns = c.namespace("csirestart", &[]);
    let source = format!("    http:\n      url: {}/disk.qcow2", server.url);
    c.apply(&dv_yaml(&ns, "keep", &source, "64Mi", false));
    wait_succeeded(c, &ns, "keep", Instant::now());
    c.apply(&format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: user, namespace: {ns}}}
spec:
  containers:
  - name: c
    image: docker.io/library/busybox:1.35
    command: [sleep, '3600']
    volumeMounts: [{{name: d, mountPath: /pvc}}]
  volumes:
  - name: d
    persistentVolumeClaim: {{claimName: keep}}
"
    ));
    c.wait_for(&ns, "pod/user", "{.status.phase}", "Running", DV_LIMIT);
    let read = |c: &Cluster| {
        c.kubectl_ok(&[
            "-n",
            &ns,
            "exec",
            "user",
            "--",
            "sh",
            "-c",
            &format!("head -c {} /pvc/disk.img | sha256sum", image.raw_len),
        ])
    };
    assert!(read(c).starts_with(&image.raw_sha256));
    c.kubectl_ok(&[
        "-n",
        testkit::cluster::NAMESPACE,
        "delete",
        "pod",
        "-l",
        "app=quarry-csi",
        "--wait=true",
    ]);
    assert!(
        read(c).starts_with(&image.raw_sha256),
        "the running pod lost its data"
    );
    c.kubectl_ok(&[
        "-n",
        testkit::cluster::NAMESPACE,
        "rollout",
        "status",
        "daemonset/quarry-csi",
        "--timeout=120s",
    ]);
    c.apply(&dv_yaml(&ns, "after", "    blank: {}", "16Mi", false));
    wait_succeeded(c, &ns, "after", Instant::now());
    assert_disk(c, &ns, "keep", &image, false);
}
