//! Faults on the node: each ends with the right bytes or a clear failure, and nothing left.

use std::time::{Duration, Instant};

use crate::support::{
    DV_LIMIT, Image, assert_disk, cluster, delete_and_expect_nothing_left, dv_yaml, volume_holding,
    wait_succeeded,
};
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

/// Creates the DataVolume `slow` in `ns` from [`slow_source`]'s server and waits until its
/// import runs: its `spec.source` lines, for more DataVolumes of the same source.
fn start_slow_import(c: &Cluster, ns: &str, nginx: &testkit::nginx::Nginx) -> String {
    let source = format!("    http:\n      url: {}", nginx.url("/slow.img"));
    c.apply(&dv_yaml(ns, "slow", &source, "64Mi", false));
    c.wait_for(
        ns,
        "dv/slow",
        "{.status.phase}",
        "ImportInProgress",
        DV_LIMIT,
    );
    source
}

/// The importer killed mid-import (SIGKILL to its process on the node): counted as a restart,
/// tried again, the disk right.
#[test]
fn an_importer_pod_killed_mid_import_is_retried_and_finishes() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (nginx, image) = slow_source(c, dir.path());
    let ns = c.namespace("killed", &[]);
    start_slow_import(c, &ns, &nginx);
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
    start_slow_import(c, &ns, &nginx);
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
    start_slow_import(c, &ns, &nginx);
    delete_and_expect_nothing_left(c, &ns, &["slow"]);
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
    let pv = volume_holding(c, &ns, "up");
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
    delete_and_expect_nothing_left(c, &ns, &["up"]);
    // the client's request ends (cut, or finished by the server within its grace period)
    let out = curl.wait_with_output().unwrap();
    assert!(out.status.code().is_some());
}

/// A host-assisted clone across namespaces deleted while it runs: the target's pods, PVC and
/// volume go, the source namespace keeps only its PVC, whose disk is unchanged.
#[test]
fn a_data_volume_deleted_mid_clone_leaves_nothing() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = crate::support::raw_image_of(dir.path(), "big.raw", 256 << 20, 9);
    let server = crate::support::FileServer::start(c, dir.path());
    let from = c.namespace("clone-src", &[]);
    let source = format!("    http:\n      url: {}/big.raw", server.url);
    c.apply(&dv_yaml(&from, "src", &source, "300Mi", false));
    wait_succeeded(c, &from, "src", Instant::now());

    let to = c.namespace("clone-cut", &[]);
    let source = format!("    pvc:\n      namespace: {from}\n      name: src");
    c.apply(&dv_yaml(&to, "copy", &source, "300Mi", false));
    // delete as soon as the clone is under way (its PVC bound, its pods scheduled)
    let start = Instant::now();
    let phase = loop {
        let phase = c.kubectl_ok(&[
            "-n",
            &to,
            "get",
            "dv",
            "copy",
            "-o",
            "jsonpath={.status.phase}",
        ]);
        let bound = !c
            .kubectl_ok(&[
                "-n",
                &to,
                "get",
                "pvc",
                "copy",
                "--ignore-not-found",
                "-o",
                "jsonpath={.spec.volumeName}",
            ])
            .is_empty();
        if bound && ["CloneScheduled", "CloneInProgress"].contains(&phase.as_str()) {
            break phase;
        }
        assert!(
            phase != "Succeeded" && start.elapsed() < DV_LIMIT,
            "the clone was never seen running: {phase:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("deleting the clone in phase {phase}");
    delete_and_expect_nothing_left(c, &to, &["copy"]);
    let start = Instant::now();
    loop {
        let left = c.kubectl_ok(&["-n", &from, "get", "pod,pvc,service", "-o", "name"]);
        if left.trim() == "persistentvolumeclaim/src" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "left in the source namespace: {left}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_disk(c, &from, "src", &image, false);
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

/// The restart counts of Quarry's pods, by pod name.
fn quarry_restarts(c: &Cluster) -> std::collections::BTreeMap<String, String> {
    let out = c.kubectl_ok(&[
        "-n",
        testkit::cluster::NAMESPACE,
        "get",
        "pods",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.status.containerStatuses[*].restartCount}{\"\\n\"}{end}",
    ]);
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(pod, n)| (pod.to_string(), n.to_string()))
        .collect()
}

/// The API server restarted while an import runs: the import finishes with the right bytes, a
/// DataVolume made after the restart is served too (the controllers' watches came back), and
/// no Quarry container restarted to get there.
#[test]
fn the_api_server_restarted_mid_import_is_survived() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (nginx, image) = slow_source(c, dir.path());
    let ns = c.namespace("apirestart", &[]);
    let before = quarry_restarts(c);
    let source = start_slow_import(c, &ns, &nginx);
    let restarting = Instant::now();
    c.restart_api_server();
    // Back once the `kubernetes` Service reaches it (the admission webhooks read through it).
    eprintln!(
        "the API server restarted and routed again in {:.1} s",
        restarting.elapsed().as_secs_f64()
    );
    let after = dv_yaml(&ns, "after", &source, "64Mi", false);
    c.apply(&after);
    wait_succeeded(c, &ns, "slow", Instant::now());
    wait_succeeded(c, &ns, "after", Instant::now());
    assert_disk(c, &ns, "slow", &image, false);
    assert_disk(c, &ns, "after", &image, false);
    // (pods that other tests replace meanwhile are not compared)
    let after = quarry_restarts(c);
    for (pod, n) in &before {
        if let Some(m) = after.get(pod) {
            assert_eq!(m, n, "{pod}'s containers restarted");
        }
    }
}

/// A pool of its own on a small loop-mounted ext4, added to the HostPathProvisioner CR (its
/// StorageClass made by the controller); on drop the pool leaves the CR and the mount goes.
struct SmallPool<'a> {
    mount: std::path::PathBuf,
    image: std::path::PathBuf,
    added: crate::support::AddedPool<'a>,
}

impl<'a> SmallPool<'a> {
    fn add(c: &'a Cluster, name: &str, mib: u64) -> SmallPool<'a> {
        let mount = std::path::PathBuf::from(format!("/var/hpvolumes/{name}"));
        let image = std::path::PathBuf::from(format!("/var/tmp/quarry-pool-{name}.img"));
        let sh = |cmd: &str| {
            let out = std::process::Command::new("sh")
                .args(["-c", cmd])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{cmd}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        sh(&format!(
            "truncate -s {mib}M {img} && mkfs.ext4 -q -F {img} && mkdir -p {m} && mount -o loop {img} {m}",
            img = image.display(),
            m = mount.display()
        ));
        let pool = format!(r#"{{"name":"{name}","path":"{}"}}"#, mount.display());
        let added = crate::support::AddedPool::add(c, name, &pool);
        let pool = SmallPool {
            mount,
            image,
            added,
        };
        c.wait_for(
            "default",
            &format!("storageclass/hostpath-csi-{name}"),
            "{.parameters.storagePool}",
            name,
            DV_LIMIT,
        );
        let rolled = crate::support::driver_rolled_out(c);
        assert!(rolled.status.success(), "the driver's rollout: {rolled:?}");
        pool
    }
}

impl Drop for SmallPool<'_> {
    fn drop(&mut self) {
        self.added.restore();
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.mount)
            .status();
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_file(&self.image);
    }
}

/// An import into a pool that fills up: the DataVolume says so (a condition and an event naming
/// the lack of space), no complete-looking disk is left, and once space is freed the retried
/// import lands with the right bytes. The pool is added by editing the HostPathProvisioner CR
/// on the running cluster, whose controller makes its StorageClass and rolls the driver.
#[test]
fn an_import_into_a_pool_that_fills_up_says_so_and_recovers() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    // 140 MiB, a third of it data: more than the pool has left once the filler is in
    // 140 MiB, a third of it data, sent at 8 MiB/s: long enough to fill the pool under it
    let image = crate::support::raw_image_of(dir.path(), "big.raw", 140 << 20, 11);
    let nginx = testkit::nginx::Nginx::start(testkit::nginx::NginxConfig {
        root: dir.path().into(),
        ranges: true,
        limit_rate: Some(8 << 20),
        address: Some(c.node_ip.parse().unwrap()),
        ..Default::default()
    });
    let name = format!("small{:x}", std::process::id());
    let pool = SmallPool::add(c, &name, 200);

    let ns = c.namespace("poolfull", &[]);
    let source = format!("    http:\n      url: {}", nginx.url("/big.raw"));
    let dv = dv_yaml(&ns, "full", &source, "140Mi", false)
        .replace(crate::support::CLASS, &format!("hostpath-csi-{name}"));
    c.apply(&dv);
    c.wait_for(
        &ns,
        "dv/full",
        "{.status.phase}",
        "ImportInProgress",
        DV_LIMIT,
    );
    // another user of the disk takes all but 4 MiB of it
    let filler = pool.mount.join("filler");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "fallocate -l $(( $(df -B1 --output=avail {m} | tail -1) - (4 << 20) )) {f}",
            m = pool.mount.display(),
            f = filler.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // the condition and the event name the cause
    c.wait_until(
        &ns,
        "dv/full",
        "{.status.conditions[?(@.type==\"Running\")].message}",
        "a message naming the lack of space",
        DV_LIMIT,
        |m| m.to_lowercase().contains("no space left"),
    );
    let events = c.kubectl_ok(&[
        "-n",
        &ns,
        "get",
        "events",
        "-o",
        "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    ]);
    assert!(
        events.to_lowercase().contains("no space left"),
        "no event names the lack of space: {events}"
    );
    let phase = c.kubectl_ok(&[
        "-n",
        &ns,
        "get",
        "dv",
        "full",
        "-o",
        "jsonpath={.status.phase}",
    ]);
    assert_ne!(phase, "Succeeded");
    // what the failed attempt wrote is gone: no disk that looks complete
    let pv = volume_holding(c, &ns, "full");
    let disk = pool.mount.join(&pv).join("disk.img");
    let len = std::fs::metadata(&disk).map_or(0, |m| m.len());
    assert!(
        len < image.raw_len,
        "{} is {len} bytes after the failure",
        disk.display()
    );

    // space freed: the retried import lands
    std::fs::remove_file(&filler).unwrap();
    wait_succeeded(c, &ns, "full", Instant::now());
    assert_disk(c, &ns, "full", &image, false);
    c.kubectl_ok(&[
        "-n",
        &ns,
        "delete",
        "dv",
        "full",
        "--wait=true",
        "--timeout=120s",
    ]);
    drop(pool);
}
