//! What the cluster tests share: the cluster, a file server on the node's address, DataVolume
//! manifests, and a pod that reads a volume's bytes as a VM would.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use testkit::cluster::Cluster;

/// The StorageClass of the HostPathProvisioner's default pool.
pub const CLASS: &str = "hostpath-csi-local";
/// How long a DataVolume may take to finish on the node.
pub const DV_LIMIT: Duration = Duration::from_secs(300);

/// The shared cluster with Quarry installed, or `None` (the test returns, skipped).
pub fn cluster() -> Option<&'static Cluster> {
    Cluster::shared(env!("CARGO_BIN_EXE_quarry"))
}

/// A static file server on the node's address (where pods reach the host), stopped when dropped.
pub struct FileServer {
    child: Child,
    /// `http://NODE_IP:PORT`.
    pub url: String,
}

impl FileServer {
    /// Serves `dir`.
    pub fn start(c: &Cluster, dir: &Path) -> FileServer {
        let port = TcpListener::bind((c.node_ip.as_str(), 0))
            .and_then(|l| l.local_addr())
            .expect("a free port on the node's address")
            .port();
        let child = Command::new("python3")
            .args(["-m", "http.server", &port.to_string(), "--bind", &c.node_ip])
            .arg("--directory")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server");
        let url = format!("http://{}:{port}", c.node_ip);
        let start = Instant::now();
        while std::net::TcpStream::connect((c.node_ip.as_str(), port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{url} never answered"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        FileServer { child, url }
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test image: the file to serve and qemu-img's raw conversion of it.
pub struct Image {
    /// The image as served or uploaded.
    pub path: PathBuf,
    /// The sha256 of `qemu-img convert -O raw` of it.
    pub raw_sha256: String,
    /// Its virtual size.
    pub raw_len: u64,
}

/// [`crate::common::sample_qcow2`] (8 MiB of data and holes), compressed with `compress`
/// (`["xz", "-c"]`, or nothing for the plain qcow2).
pub fn qcow2_image(dir: &Path, compress: &[&str]) -> Image {
    let (qcow2, expected) = crate::common::sample_qcow2(dir);
    let path = if compress.is_empty() {
        qcow2
    } else {
        let out = dir.join(format!("disk.qcow2.{}", compress[0]));
        crate::common::compress(compress, &qcow2, &out);
        out
    };
    Image {
        path,
        raw_sha256: hex::encode(Sha256::digest(&expected)),
        raw_len: expected.len() as u64,
    }
}

/// A DataVolume of `size` with `source` (YAML mapping lines, indented for `spec.source`), bound
/// at once (the importer is the PVC's first consumer, as DataImportCrons ask), `block` for
/// `volumeMode: Block`.
pub fn dv_yaml(ns: &str, name: &str, source: &str, size: &str, block: bool) -> String {
    let mode = if block { "Block" } else { "Filesystem" };
    format!(
        "apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: {name}
  namespace: {ns}
  annotations:
    cdi.kubevirt.io/storage.bind.immediate.requested: \"true\"
spec:
  source:
{source}
  storage:
    storageClassName: {CLASS}
    volumeMode: {mode}
    resources:
      requests:
        storage: {size}
"
    )
}

/// Waits for the DataVolume's phase to be `Succeeded`: the time it took from `since`, also
/// printed (`--no-capture` shows every workflow's time).
pub fn wait_succeeded(c: &Cluster, ns: &str, name: &str, since: Instant) -> Duration {
    c.wait_for(
        ns,
        &format!("dv/{name}"),
        "{.status.phase}",
        "Succeeded",
        DV_LIMIT,
    );
    let took = since.elapsed();
    eprintln!(
        "timing: DataVolume {ns}/{name} Succeeded {:.2} s after creation",
        took.as_secs_f64()
    );
    took
}

/// The reasons of the events about `object` (KIND/NAME) in `ns`, oldest first.
pub fn event_reasons(c: &Cluster, ns: &str, kind: &str, name: &str) -> Vec<String> {
    let out = c.kubectl_ok(&[
        "-n",
        ns,
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.kind={kind},involvedObject.name={name}"),
        "--sort-by=.metadata.creationTimestamp",
        "-o",
        "jsonpath={range .items[*]}{.reason}{\"\\n\"}{end}",
    ]);
    out.lines().map(str::to_string).collect()
}

/// What a VM would see: a pod mounts the PVC (a filesystem volume's `disk.img`, or the block
/// device) and reads it. Returns the sha256 of its first `len` bytes and whether every byte
/// after them is zero (the disk grown to the volume).
pub fn read_disk(c: &Cluster, ns: &str, pvc: &str, len: u64, block: bool) -> (String, bool) {
    let disk = if block { "/dev/disk0" } else { "/pvc/disk.img" };
    let script = format!(
        "head -c {len} {disk} | sha256sum | cut -d' ' -f1; \
         tail -c +{} {disk} | tr -d '\\000' | wc -c",
        len + 1
    );
    let logs = run_in_pod(c, ns, pvc, &script, block);
    let mut lines = logs.lines();
    let sha = lines.next().unwrap_or_default().trim().to_string();
    let nonzero_after = lines.next().unwrap_or_default().trim().to_string();
    (sha, nonzero_after == "0")
}

/// Creates the DataVolume `name` (64Mi, Filesystem) from `source` (as [`dv_yaml`] takes it),
/// waits for it to succeed and asserts its volume holds `image`'s disk.
pub fn import_and_check(c: &Cluster, ns: &str, name: &str, source: &str, image: &Image) {
    let start = Instant::now();
    c.apply(&dv_yaml(ns, name, source, "64Mi", false));
    wait_succeeded(c, ns, name, start);
    assert_disk(c, ns, name, image, false);
}

/// The ConfigMap `name` holding the CA certificate `pem` (what `certConfigMap` names).
pub fn ca_config_map(c: &Cluster, ns: &str, name: &str, pem: &Path) {
    c.kubectl_ok(&[
        "-n",
        ns,
        "create",
        "configmap",
        name,
        &format!("--from-file=ca.pem={}", pem.display()),
    ]);
}

/// The Secret `name` with CDI's `accessKeyId` and `secretKey` keys (what `secretRef` names).
pub fn key_secret(c: &Cluster, ns: &str, name: &str, id: &str, key: &str) {
    c.kubectl_ok(&[
        "-n",
        ns,
        "create",
        "secret",
        "generic",
        name,
        &format!("--from-literal=accessKeyId={id}"),
        &format!("--from-literal=secretKey={key}"),
    ]);
}

/// Asserts the volume holds `image`'s disk (then zeros), as a pod reads it.
pub fn assert_disk(c: &Cluster, ns: &str, pvc: &str, image: &Image, block: bool) {
    let (sha, zeros_after) = read_disk(c, ns, pvc, image.raw_len, block);
    assert_eq!(sha, image.raw_sha256, "{ns}/{pvc}: the disk's bytes");
    assert!(zeros_after, "{ns}/{pvc}: bytes past the disk are not zero");
}

/// An upload token for `pvc`, from the token API behind the aggregation layer (as virtctl asks).
pub fn upload_token(c: &Cluster, ns: &str, pvc: &str) -> String {
    let yaml = format!(
        "apiVersion: upload.cdi.kubevirt.io/v1beta1
kind: UploadTokenRequest
metadata: {{name: {pvc}, namespace: {ns}}}
spec: {{pvcName: {pvc}}}
"
    );
    let out = c.kubectl_with_input(
        &["create", "-f", "-", "-o", "jsonpath={.status.token}"],
        Some(&yaml),
    );
    assert!(
        out.status.success(),
        "UploadTokenRequest: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap();
    assert!(token.split('.').count() == 3, "not a JWT: {token:?}");
    token
}

/// The ClusterIP of the upload proxy's Service (what virtctl talks to).
pub fn upload_proxy_ip(c: &Cluster) -> String {
    c.kubectl_ok(&[
        "-n",
        testkit::cluster::NAMESPACE,
        "get",
        "service",
        "quarry-uploadproxy",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])
}

/// POSTs `file` to the upload proxy's Service as virtctl does: the HTTP status.
pub fn post_upload(c: &Cluster, token: &str, file: &Path) -> String {
    post_upload_to(c, "/v1beta1/upload", token, file)
}

/// [`post_upload`] to `path` (`/v1beta1/upload-async`, `/v1beta1/upload-archive`, ...).
pub fn post_upload_to(c: &Cluster, path: &str, token: &str, file: &Path) -> String {
    let ip = upload_proxy_ip(c);
    let out = Command::new("curl")
        .args([
            "-sS",
            "-k",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "POST",
        ])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-H", "Content-Type: application/octet-stream"])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("https://{ip}{path}"))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The VolumeSnapshotClass of the driver that the README tells admins to create.
pub const SNAPSHOT_CLASS: &str = "hostpath-csi-snapshots";

/// Creates [`SNAPSHOT_CLASS`] (idempotent).
pub fn snapshot_class(c: &Cluster) {
    c.apply(&format!(
        "apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {{name: {SNAPSHOT_CLASS}}}
driver: kubevirt.io.hostpath-provisioner
deletionPolicy: Delete
"
    ));
}

/// A raw disk `name` in `dir` of 4 MiB whose bytes follow `seed` (a new seed: new bytes and
/// a new modification time, as a new version of a served file has).
pub fn raw_image(dir: &Path, name: &str, seed: u64) -> Image {
    raw_image_of(dir, name, 4 << 20, seed)
}

/// [`raw_image`] of `len` bytes.
pub fn raw_image_of(dir: &Path, name: &str, len: usize, seed: u64) -> Image {
    let mut data = vec![0u8; len];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in data.chunks_mut(4096).step_by(3) {
        for b in chunk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.new"));
    std::fs::write(&tmp, &data).unwrap();
    let mtime =
        std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seed * 3600);
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    Image {
        path,
        raw_sha256: hex::encode(Sha256::digest(&data)),
        raw_len: data.len() as u64,
    }
}

/// What a DataSource points at: a PVC (ready once its DataVolume succeeded) or a
/// VolumeSnapshot (ready once `readyToUse`).
#[derive(Clone, Copy)]
pub enum Source {
    /// `spec.source.pvc`.
    Pvc,
    /// `spec.source.snapshot`.
    Snapshot,
}

/// Waits until the DataSource `name` points at a PVC other than `not` whose DataVolume has
/// succeeded: that PVC's name.
pub fn data_source_pvc(c: &Cluster, ns: &str, name: &str, not: Option<&str>) -> String {
    data_source_at(c, ns, name, Source::Pvc, not)
}

/// Waits until the DataSource `name` points at a `kind` of source other than `not` that is
/// ready: its name.
pub fn data_source_at(
    c: &Cluster,
    ns: &str,
    name: &str,
    kind: Source,
    not: Option<&str>,
) -> String {
    let (field, ready_of, ready) = match kind {
        Source::Pvc => ("pvc", "dv", ("{.status.phase}", "Succeeded")),
        Source::Snapshot => (
            "snapshot",
            "volumesnapshot",
            ("{.status.readyToUse}", "true"),
        ),
    };
    let start = Instant::now();
    loop {
        let at = c.kubectl_ok(&[
            "-n",
            ns,
            "get",
            "datasource",
            name,
            "--ignore-not-found",
            "-o",
            &format!("jsonpath={{.spec.source.{field}.name}}"),
        ]);
        if !at.is_empty() && Some(at.as_str()) != not {
            let state = c.kubectl(&[
                "-n",
                ns,
                "get",
                ready_of,
                &at,
                "-o",
                &format!("jsonpath={}", ready.0),
            ]);
            if String::from_utf8_lossy(&state.stdout) == ready.1 {
                return at;
            }
        }
        if start.elapsed() > DV_LIMIT {
            let dump = c.kubectl(&[
                "-n",
                ns,
                "get",
                "dataimportcron,datasource,dv,pvc,volumesnapshot,events",
                "-o",
                "wide",
            ]);
            panic!(
                "DataSource {ns}/{name} never pointed at a new ready {field} (not {not:?}):\n{}",
                String::from_utf8_lossy(&dump.stdout)
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Waits until `kind/name` in `ns` is gone, or panics saying `why` it matters.
pub fn wait_gone(c: &Cluster, ns: &str, kind: &str, name: &str, why: &str) {
    let start = Instant::now();
    while c.kubectl(&["-n", ns, "get", kind, name]).status.success() {
        assert!(start.elapsed() < DV_LIMIT, "{kind} {ns}/{name}: {why}");
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A DataImportCron `golden` in `ns` polling `url` every 5 s, managing the DataSource
/// `golden`, keeping one import, its imports of 32 MiB on `class`.
pub fn golden_cron(ns: &str, url: &str, class: &str) -> String {
    format!(
        "apiVersion: cdi.kubevirt.io/v1beta1
kind: DataImportCron
metadata: {{name: golden, namespace: {ns}}}
spec:
  schedule: '@every 5s'
  managedDataSource: golden
  importsToKeep: 1
  garbageCollect: Outdated
  template:
    spec:
      source:
        http: {{url: '{url}'}}
      storage:
        storageClassName: {class}
        resources: {{requests: {{storage: 32Mi}}}}
"
    )
}

/// The sha256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Runs `script` in a restricted busybox pod with the PVC at `/pvc`: what it printed.
pub fn in_volume(c: &Cluster, ns: &str, pvc: &str, script: &str) -> String {
    run_in_pod(c, ns, pvc, script, false)
}

/// Runs `script` in a restricted busybox pod that mounts the PVC at `/pvc` (or, for a `block`
/// volume, has it as `/dev/disk0`), waits for it to finish and deletes it: what it printed.
fn run_in_pod(c: &Cluster, ns: &str, pvc: &str, script: &str, block: bool) -> String {
    let pod = format!("look-{:x}", testkit_unique());
    let volume = if block {
        "volumeDevices: [{name: d, devicePath: /dev/disk0}]"
    } else {
        "volumeMounts: [{name: d, mountPath: /pvc}]"
    };
    c.apply(&format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {pod}, namespace: {ns}}}
spec:
  restartPolicy: Never
  securityContext: {{runAsNonRoot: true, runAsUser: 107, fsGroup: 107, seccompProfile: {{type: RuntimeDefault}}}}
  containers:
  - name: look
    image: docker.io/library/busybox:1.35
    command: [sh, -c, {script:?}]
    securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}
    {volume}
  volumes:
  - name: d
    persistentVolumeClaim: {{claimName: {pvc}}}
"
    ));
    c.wait_for(
        ns,
        &format!("pod/{pod}"),
        "{.status.phase}",
        "Succeeded",
        DV_LIMIT,
    );
    let logs = c.kubectl_ok(&["-n", ns, "logs", &pod]);
    c.kubectl_ok(&["-n", ns, "delete", "pod", &pod, "--wait=false"]);
    logs
}

fn testkit_unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    std::process::id().wrapping_mul(65599) ^ N.fetch_add(1, Ordering::Relaxed)
}

/// `jsonpath` (`{.spec.volumeName}`, say) of the PVC `pvc` in `ns`, which must exist.
pub fn pvc_field(c: &Cluster, ns: &str, pvc: &str, jsonpath: &str) -> String {
    c.kubectl_ok(&[
        "-n",
        ns,
        "get",
        "pvc",
        pvc,
        "-o",
        &format!("jsonpath={jsonpath}"),
    ])
}

/// The name of the PVC' a volume populator fills for `pvc` (`prime-<uid>`).
pub fn prime_of(c: &Cluster, ns: &str, pvc: &str) -> String {
    format!("prime-{}", pvc_field(c, ns, pvc, "{.metadata.uid}"))
}

/// Waits (at most 180 s) until every CSI driver pod runs the DaemonSet's current spec.
pub fn driver_rolled_out(c: &Cluster) -> std::process::Output {
    c.kubectl(&[
        "-n",
        testkit::cluster::NAMESPACE,
        "rollout",
        "status",
        "daemonset/quarry-csi",
        "--timeout=180s",
    ])
}

/// A pool added to the HostPathProvisioner CR (its controller makes the pool's StorageClass and
/// rolls the driver); [`AddedPool::restore`] takes it out again. Tests that run at once add and
/// remove their own pools only, each by name.
pub struct AddedPool<'a> {
    c: &'a Cluster,
    name: String,
}

const HPP: [&str; 2] = ["hostpathprovisioner", "hostpath-provisioner"];

impl<'a> AddedPool<'a> {
    /// Adds `pool`, a `storagePools` entry as JSON, named `name`.
    pub fn add(c: &'a Cluster, name: &str, pool: &str) -> AddedPool<'a> {
        let patch = format!(r#"[{{"op":"add","path":"/spec/storagePools/-","value":{pool}}}]"#);
        c.kubectl_ok(&["patch", HPP[0], HPP[1], "--type=json", "-p", &patch]);
        AddedPool {
            c,
            name: name.into(),
        }
    }

    /// Removes the pool (the patch names its index and tests that it is still this pool there,
    /// so another test's edit in between is read again, not undone) and waits for the driver's
    /// rollout. Best effort: it runs in drops.
    pub fn restore(&self) {
        for _ in 0..10 {
            let names = self.c.kubectl_ok(&[
                "get",
                HPP[0],
                HPP[1],
                "-o",
                "jsonpath={.spec.storagePools[*].name}",
            ]);
            let Some(at) = names.split_whitespace().position(|n| n == self.name) else {
                break;
            };
            let patch = format!(
                r#"[{{"op":"test","path":"/spec/storagePools/{at}/name","value":"{}"}},{{"op":"remove","path":"/spec/storagePools/{at}"}}]"#,
                self.name
            );
            let out = self
                .c
                .kubectl(&["patch", HPP[0], HPP[1], "--type=json", "-p", &patch]);
            if out.status.success() {
                break;
            }
        }
        let _ = driver_rolled_out(self.c);
    }
}

/// The PersistentVolume holding the data of the PVC `pvc`: its own, or while a populator fills
/// it, its PVC''s.
pub fn volume_holding(c: &Cluster, ns: &str, pvc: &str) -> String {
    let volume_of = |pvc: &str| pvc_field(c, ns, pvc, "{.spec.volumeName}");
    let pv = volume_of(pvc);
    if !pv.is_empty() {
        return pv;
    }
    volume_of(&prime_of(c, ns, pvc))
}

/// Deletes the DataVolumes `names` (the namespace's only ones) and waits until the namespace
/// has no pod, PVC (a populator's PVC' among them) or Service left, and their PVs and pool
/// directories are gone.
pub fn delete_and_expect_nothing_left(c: &Cluster, ns: &str, names: &[&str]) {
    let pvs: Vec<String> = names.iter().map(|n| volume_holding(c, ns, n)).collect();
    for (name, pv) in names.iter().zip(&pvs) {
        assert!(!pv.is_empty(), "no volume holds {name}'s data");
    }
    let mut delete = vec!["-n", ns, "delete", "dv", "--wait=true", "--timeout=120s"];
    delete.extend(names);
    c.kubectl_ok(&delete);
    let start = Instant::now();
    loop {
        let left = c.kubectl_ok(&["-n", ns, "get", "pod,pvc,service", "-o", "name"]);
        let pvs_left: Vec<&String> = pvs
            .iter()
            .filter(|pv| {
                c.kubectl(&["get", "pv", pv]).status.success()
                    || Path::new("/var/hpvolumes/csi").join(pv).exists()
            })
            .collect();
        if left.trim().is_empty() && pvs_left.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "left after the DataVolumes' deletion: {left} PVs or their directories: {pvs_left:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
