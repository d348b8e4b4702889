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
