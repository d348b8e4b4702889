//! End-to-end tests of the local mode: `quarry apply -f dv.yaml` runs a CDI DataVolume manifest
//! against a pool directory (an HTTP image from a real nginx, checked against `qemu-img convert
//! -O raw`), and `quarry get dv` shows the status it wrote.

use std::fs;
use std::path::Path;

use testkit::nginx::{Nginx, NginxConfig};

mod common;
use common::*;

const MIB: u64 = 1 << 20;

fn manifest(dir: &Path, name: &str, source: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let text = format!(
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata:\n  name: {name}\nspec:\n  source:\n{source}  storage:\n    resources:\n      requests:\n        storage: 64Mi\n"
    );
    fs::write(&path, text).unwrap();
    path
}

fn sha256(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

struct Local {
    _tmp: tempfile::TempDir,
    pool: std::path::PathBuf,
    state: std::path::PathBuf,
    dir: std::path::PathBuf,
}

fn local() -> Local {
    let tmp = tempfile::tempdir().unwrap();
    let pool = tmp.path().join("pool");
    let state = tmp.path().join("state");
    fs::create_dir(&pool).unwrap();
    Local {
        dir: tmp.path().to_path_buf(),
        pool,
        state,
        _tmp: tmp,
    }
}

impl Local {
    fn apply(&self, file: &Path) -> std::process::Output {
        run(&[
            "apply",
            "-f",
            arg(file),
            "--pool",
            arg(&self.pool),
            "--state-dir",
            arg(&self.state),
        ])
    }

    fn get(&self, extra: &[&str]) -> std::process::Output {
        let mut args = vec!["get", "dv"];
        args.extend_from_slice(extra);
        args.extend(["--state-dir", arg(&self.state)]);
        run(&args)
    }

    fn status(&self, name: &str) -> serde_json::Value {
        let out = self.get(&[name, "-o", "json"]);
        assert_ok(&out);
        json(&out)["status"].clone()
    }
}

fn condition<'a>(status: &'a serde_json::Value, t: &str) -> &'a serde_json::Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == t)
        .unwrap_or_else(|| panic!("no {t} condition in {status}"))
}

/// nginx serving `root` (with ranges).
fn serve(root: &Path) -> Nginx {
    Nginx::start(NginxConfig {
        root: root.to_path_buf(),
        ranges: true,
        ..Default::default()
    })
}

/// `spec.source` of a DataVolume importing the served `disk.qcow2` with a sha256 checksum.
fn http_source(server: &Nginx, sha256_hex: &str) -> String {
    format!(
        "    http:\n      url: {}\n      checksum: sha256:{sha256_hex}\n",
        server.url("/disk.qcow2")
    )
}

#[test]
fn http_qcow2_datavolume_ends_succeeded_with_qemu_img_bytes_in_the_pool() {
    let served = tempfile::tempdir().unwrap();
    let (qcow2, expected) = sample_qcow2(served.path());
    let server = serve(served.path());
    let l = local();
    let source = http_source(&server, &sha256(&qcow2));
    let out = l.apply(&manifest(&l.dir, "fedora", &source));
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("datavolume/fedora Succeeded"));

    let disk = l.pool.join("default-fedora").join("disk.img");
    let written = fs::read(&disk).unwrap();
    assert_eq!(
        &written[..expected.len()],
        &expected[..],
        "the image equals qemu-img's conversion"
    );
    assert!(written[expected.len()..].iter().all(|&b| b == 0));
    // CDI's sizes: 64 MiB requested, inflated by the 5.5 % overhead; usable space (what the disk
    // is grown to) is the inflated size minus the overhead, floored to a MiB.
    let requested = ((64 * MIB) as f64 / (1.0 - 0.055)).ceil() as u64;
    let usable = ((1.0 - 0.055) * requested as f64) as u64 / MIB * MIB;
    assert_eq!(written.len() as u64, usable);

    let st = l.status("fedora");
    assert_eq!(st["phase"], "Succeeded");
    assert_eq!(st["progress"], "100.00%");
    assert_eq!(st["restartCount"], 0);
    assert_eq!(condition(&st, "Ready")["status"], "True");
    assert_eq!(condition(&st, "Bound")["reason"], "Bound");
    assert_eq!(condition(&st, "Running")["reason"], "Completed");

    let table = l.get(&[]);
    assert_ok(&table);
    let text = String::from_utf8(table.stdout).unwrap();
    let mut lines = text.lines();
    let header: Vec<_> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "PHASE", "PROGRESS", "RESTARTS", "AGE"]);
    let row: Vec<_> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], ["fedora", "Succeeded", "100.00%", "0"]);

    let yaml = l.get(&["fedora", "-o", "yaml"]);
    assert_ok(&yaml);
    let text = String::from_utf8(yaml.stdout).unwrap();
    assert!(
        text.contains("phase: Succeeded") && text.contains("kind: DataVolume"),
        "{text}"
    );
}

#[test]
fn wrong_checksum_ends_failed_at_once_without_retries() {
    let served = tempfile::tempdir().unwrap();
    let (_qcow2, _) = sample_qcow2(served.path());
    let server = serve(served.path());
    let l = local();
    let source = http_source(&server, &"0".repeat(64));
    let out = l.apply(&manifest(&l.dir, "bad", &source));
    assert_exit(&out, 1);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("datavolume/bad Failed: ChecksumMismatch")
    );

    let st = l.status("bad");
    assert_eq!(st["phase"], "Failed");
    assert_eq!(st["restartCount"], 0);
    for t in ["Ready", "Running"] {
        assert_eq!(condition(&st, t)["reason"], "ChecksumMismatch", "{st}");
    }
    assert!(
        condition(&st, "Running")["message"]
            .as_str()
            .unwrap()
            .contains("not retried")
    );
    // One download, no retry; no disk that looks complete.
    let gets = server
        .access_log()
        .lines()
        .filter(|l| l.contains("GET /disk.qcow2"))
        .count();
    assert_eq!(gets, 1, "{}", server.access_log());
    assert!(!l.pool.join("default-bad").join("disk.img").exists());
}

#[test]
fn blank_datavolume_is_a_sparse_disk_of_the_usable_size() {
    let l = local();
    let out = l.apply(&manifest(&l.dir, "scratch", "    blank: {}\n"));
    assert_ok(&out);
    let disk = l.pool.join("default-scratch").join("disk.img");
    let meta = fs::metadata(&disk).unwrap();
    assert!(meta.len() >= 64 * MIB, "{}", meta.len());
    use std::os::unix::fs::MetadataExt;
    assert!(meta.blocks() * 512 < MIB, "blank disks are sparse");
    assert_eq!(l.status("scratch")["phase"], "Succeeded");
}

#[test]
fn a_missing_pool_directory_is_made() {
    let l = local();
    let pool = l.dir.join("new").join("pool");
    let out = run(&[
        "apply",
        "-f",
        arg(&manifest(&l.dir, "scratch", "    blank: {}\n")),
        "--pool",
        arg(&pool),
        "--state-dir",
        arg(&l.state),
    ]);
    assert_ok(&out);
    assert!(pool.join("default-scratch").join("disk.img").is_file());
}

#[test]
fn a_pool_that_cannot_be_made_is_named_with_its_cause_once() {
    let l = local();
    let file = l.dir.join("not-a-dir");
    fs::write(&file, b"x").unwrap();
    let out = run(&[
        "apply",
        "-f",
        arg(&manifest(&l.dir, "scratch", "    blank: {}\n")),
        "--pool",
        arg(&file.join("pool")),
        "--state-dir",
        arg(&l.state),
    ]);
    assert_exit(&out, 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("creating the pool directory"), "{err}");
    assert_eq!(err.matches("Not a directory").count(), 1, "{err}");
}

#[test]
fn an_upload_source_is_recorded_as_failed_with_what_to_run() {
    let l = local();
    let out = l.apply(&manifest(&l.dir, "up", "    upload: {}\n"));
    assert_exit(&out, 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("datavolume/up Failed: InvalidSpec"), "{err}");
    assert!(err.contains("quarry upload-server"), "{err}");
    let status = l.status("up");
    assert_eq!(status["phase"], "Failed");
    assert_eq!(status["progress"], "N/A");
    let ready = condition(&status, "Ready");
    assert_eq!(ready["reason"], "InvalidSpec");
}

#[test]
fn unknown_manifest_fields_are_warned_about_as_kubectl_does() {
    let l = local();
    let path = manifest(&l.dir, "typo", "    blank: {}\n");
    let text = fs::read_to_string(&path)
        .unwrap()
        .replace("  storage:\n", "  contentTyp: kubevirt\n  storage:\n");
    fs::write(&path, text).unwrap();
    let out = l.apply(&path);
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Warning: unknown field \"spec.contentTyp\""),
        "{err}"
    );
}

#[test]
fn unknown_names_and_bad_manifests_are_refused_clearly() {
    let l = local();
    let out = l.get(&["nope"]);
    assert_exit(&out, 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("datavolume default/nope not found"));
    let bad = l.dir.join("pvc.yaml");
    fs::write(
        &bad,
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: x}\n",
    )
    .unwrap();
    let out = l.apply(&bad);
    assert_exit(&out, 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("kind DataVolume"));
}

#[test]
fn controllers_without_a_cluster_fail_with_a_clear_error() {
    let home = tempfile::tempdir().unwrap();
    for which in ["datavolume", "hyperconverged", "hostpath", "datasource"] {
        let out = quarry()
            .args(["controller", which, "--metrics-addr", "127.0.0.1:0"])
            .env("HOME", home.path())
            .env("KUBECONFIG", home.path().join("missing-kubeconfig"))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .output()
            .unwrap();
        assert_exit(&out, 1);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no Kubernetes configuration"), "{err}");
    }
}

#[test]
fn committed_deploy_manifests_are_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(&["gen-deploy", "--check", "--root", arg(root)]);
    assert_ok(&out);
}

// ---- Local clones: `spec.source.pvc|snapshot` and `spec.sourceRef` between pool volumes ----

/// A DataVolume manifest with any `spec` body.
fn dv_manifest(dir: &Path, name: &str, spec: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let text = format!(
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata:\n  name: {name}\nspec:\n{spec}"
    );
    fs::write(&path, text).unwrap();
    path
}

fn storage(size: &str, mode: &str) -> String {
    format!(
        "  storage:\n    volumeMode: {mode}\n    resources:\n      requests:\n        storage: {size}\n"
    )
}

fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().blocks() * 512
}

/// A blank source volume `name` of `size`, with data written at 1 MiB and 9 MiB (the rest holes).
fn source_volume(l: &Local, name: &str, size: &str, mode: &str) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let out = l.apply(&dv_manifest(
        &l.dir,
        name,
        &format!("  source:\n    blank: {{}}\n{}", storage(size, mode)),
    ));
    assert_ok(&out);
    let disk = l.pool.join(format!("default-{name}")).join("disk.img");
    let (_, data) = sample_disk(&l.dir);
    let f = fs::OpenOptions::new().write(true).open(&disk).unwrap();
    f.write_all_at(&data[..2 * MIB as usize], MIB).unwrap();
    f.write_all_at(&data[4 * MIB as usize..5 * MIB as usize], 9 * MIB)
        .unwrap();
    drop(f);
    fs::read(&disk).unwrap()
}

#[test]
fn a_pvc_clone_copies_the_pool_volume_sparse_and_a_larger_target_grows() {
    let l = local();
    let bytes = source_volume(&l, "golden", "64Mi", "Filesystem");
    let clone = |name: &str, size: &str| {
        let spec = format!(
            "  source:\n    pvc:\n      namespace: default\n      name: golden\n{}",
            storage(size, "Filesystem")
        );
        l.apply(&dv_manifest(&l.dir, name, &spec))
    };
    assert_ok(&clone("same", "64Mi"));
    assert_eq!(l.status("same")["phase"], "Succeeded");
    let same = l.pool.join("default-same/disk.img");
    assert!(
        fs::read(&same).unwrap() == bytes,
        "the clone's bytes differ"
    );
    assert!(
        allocated(&same) < 8 * MIB,
        "the clone is not sparse: {}",
        allocated(&same)
    );

    assert_ok(&clone("bigger", "128Mi"));
    let status = l.status("bigger");
    assert_eq!(status["phase"], "Succeeded");
    assert_eq!(condition(&status, "Ready")["status"], "True");
    let big = l.pool.join("default-bigger/disk.img");
    let grown = fs::read(&big).unwrap();
    // CDI's arithmetic: `spec.storage` asks for a PVC the overhead larger, and the image grows
    // to the PVC less that overhead, down to a whole MiB: the 128 MiB asked for.
    assert_eq!(grown.len() as u64, 128 * MIB);
    assert!(
        grown[..bytes.len()] == bytes[..],
        "the grown clone's data differs"
    );
    assert!(grown[bytes.len()..].iter().all(|&b| b == 0));
    assert!(allocated(&big) < 8 * MIB, "the growth was allocated");
    let table = String::from_utf8(l.get(&["bigger"]).stdout).unwrap();
    assert!(table.contains("Succeeded"), "{table}");
}

#[test]
fn a_block_volume_clone_copies_and_grows_the_block_file() {
    let l = local();
    let bytes = source_volume(&l, "golden", "16Mi", "Block");
    let spec = format!(
        "  source:\n    pvc:\n      namespace: default\n      name: golden\n{}",
        storage("32Mi", "Block")
    );
    assert_ok(&l.apply(&dv_manifest(&l.dir, "copy", &spec)));
    assert_eq!(l.status("copy")["phase"], "Succeeded");
    let copy = fs::read(l.pool.join("default-copy/disk.img")).unwrap();
    assert_eq!(
        copy.len() as u64,
        32 * MIB,
        "block volumes are grown to their size exactly"
    );
    assert!(copy[..bytes.len()] == bytes[..]);
}

#[test]
fn a_clone_of_a_missing_source_waits_with_cdis_reason() {
    let l = local();
    let spec = format!(
        "  source:\n    pvc:\n      namespace: default\n      name: nothere\n{}",
        storage("64Mi", "Filesystem")
    );
    let out = l.apply(&dv_manifest(&l.dir, "orphan", &spec));
    assert!(!out.status.success());
    let status = l.status("orphan");
    assert_eq!(status["phase"], "Pending");
    let bound = condition(&status, "Bound");
    assert_eq!(bound["reason"], "CloneWithoutSource");
    assert_eq!(bound["message"], "The source pvc nothere doesn't exist");
    assert!(!l.pool.join("default-orphan").exists());
}

#[test]
fn a_source_ref_clones_through_a_local_data_source() {
    let l = local();
    let ds = l.dir.join("ds.yaml");
    fs::write(
        &ds,
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataSource\nmetadata:\n  name: fedora\nspec:\n  source:\n    pvc:\n      namespace: default\n      name: golden\n",
    )
    .unwrap();
    let spec = format!(
        "  sourceRef:\n    kind: DataSource\n    name: fedora\n{}",
        storage("64Mi", "Filesystem")
    );
    let vm = dv_manifest(&l.dir, "vm-disk", &spec);
    // The DataSource's PVC does not exist yet: not ready, and the DataVolume waits.
    let out = l.apply(&ds);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("datasource/fedora NotReady"));
    assert!(!l.apply(&vm).status.success());
    assert_eq!(
        condition(&l.status("vm-disk"), "Bound")["reason"],
        "CloneWithoutSource"
    );

    let bytes = source_volume(&l, "golden", "64Mi", "Filesystem");
    let out = l.apply(&ds);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("datasource/fedora Ready"));
    assert_ok(&l.apply(&vm));
    assert_eq!(l.status("vm-disk")["phase"], "Succeeded");
    assert!(fs::read(l.pool.join("default-vm-disk/disk.img")).unwrap() == bytes);
}

#[test]
fn a_snapshot_source_restores_the_pool_snapshot() {
    let l = local();
    let bytes = source_volume(&l, "golden", "64Mi", "Filesystem");
    // A snapshot as the CSI driver's CreateSnapshot makes it (VolumeSnapshot default/snap).
    let prov = provisioner::Provisioner::open(&[provisioner::PoolConfig {
        mounted: false,
        name: "local".into(),
        path: fs::canonicalize(&l.pool).unwrap(),
        quota: Default::default(),
    }])
    .unwrap();
    prov.create_snapshot("default-snap", "default-golden")
        .unwrap();
    drop(prov);
    let spec = format!(
        "  source:\n    snapshot:\n      namespace: default\n      name: snap\n{}",
        storage("64Mi", "Filesystem")
    );
    assert_ok(&l.apply(&dv_manifest(&l.dir, "restored", &spec)));
    assert_eq!(l.status("restored")["phase"], "Succeeded");
    assert!(fs::read(l.pool.join("default-restored/disk.img")).unwrap() == bytes);
}

#[test]
fn an_archive_datavolume_is_extracted_into_the_pool_volume() {
    use common::archive::{check_tree, pack, sample_tree};
    let l = local();
    let served = l.dir.join("served");
    fs::create_dir(&served).unwrap();
    let tree = sample_tree(&l.dir);
    let tar = l.dir.join("tree.tar");
    pack(&tree, &tar, "posix");
    compress(&["zstd", "-c", "-q"], &tar, &served.join("tree.tar.zst"));
    let server = serve(&served);
    let spec = format!(
        "  contentType: archive\n  source:\n    http:\n      url: {}\n{}",
        server.url("/tree.tar.zst"),
        storage("64Mi", "Filesystem")
    );
    let out = l.apply(&dv_manifest(&l.dir, "files", &spec));
    assert_ok(&out);
    assert_eq!(l.status("files")["phase"], "Succeeded");
    let volume = l.pool.join("default-files");
    check_tree(&volume);
    assert!(!volume.join("disk.img").exists());

    // An archive cannot fill a block volume.
    let spec = format!(
        "  contentType: archive\n  source:\n    http:\n      url: {}\n{}",
        server.url("/tree.tar.zst"),
        storage("64Mi", "Block")
    );
    let out = l.apply(&dv_manifest(&l.dir, "blockfiles", &spec));
    let st = l.status("blockfiles");
    assert_eq!(st["phase"], "Failed", "{out:?}");
    assert!(
        condition(&st, "Ready")["message"]
            .as_str()
            .unwrap()
            .contains("Filesystem"),
        "{st}"
    );
}

#[test]
fn a_pre_populated_datavolume_adopts_its_volume_as_it_is_or_fails_without_one() {
    let l = local();
    let bytes = source_volume(&l, "restored", "64Mi", "Filesystem");
    // The same name with a source that would overwrite it (and cannot even be reached).
    let text = |name: &str| {
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata:\n  name: {name}\n  annotations:\n    cdi.kubevirt.io/storage.prePopulated: {name}\nspec:\n  source:\n    http:\n      url: http://127.0.0.1:1/other.qcow2\n{}",
            storage("64Mi", "Filesystem")
        )
    };
    let file = l.dir.join("restored-again.yaml");
    fs::write(&file, text("restored")).unwrap();
    assert_ok(&l.apply(&file));
    let status = l.status("restored");
    assert_eq!(status["phase"], "Succeeded");
    assert_eq!(condition(&status, "Ready")["status"], "True");
    let disk = l.pool.join("default-restored/disk.img");
    assert!(
        fs::read(&disk).unwrap() == bytes,
        "the adopted volume changed"
    );

    let file = l.dir.join("missing.yaml");
    fs::write(&file, text("missing")).unwrap();
    let out = l.apply(&file);
    assert_exit(&out, 1);
    let ready = condition(&l.status("missing"), "Ready").clone();
    assert_eq!(ready["reason"], "InvalidSpec");
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("storage.prePopulated") && message.contains("default-missing"),
        "{message}"
    );
    assert!(!l.pool.join("default-missing").exists());
}
