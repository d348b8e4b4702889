//! DataVolume workflows on the node: imports, uploads, clones, snapshots.

use std::time::Instant;

use crate::support::{
    DV_LIMIT, FileServer, Image, Source, assert_disk, cluster, data_source_at,
    delete_and_expect_nothing_left, dv_yaml, event_reasons, import_and_check, pvc_field,
    qcow2_image, raw_image, wait_gone, wait_succeeded,
};

/// An HTTP qcow2.xz from a server on the node's address lands in a filesystem volume with
/// qemu-img's bytes; the phases are CDI's; the time is set against `quarry import` here.
#[test]
fn http_qcow2_xz_import_writes_the_disk() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &["xz", "-c"]);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("http", &[]);
    let url = format!("{}/disk.qcow2.xz", server.url);
    let start = Instant::now();
    c.apply(&dv_yaml(
        &ns,
        "web",
        &format!("    http:\n      url: {url}"),
        "64Mi",
        false,
    ));
    let took = wait_succeeded(c, &ns, "web", start);
    assert_disk(c, &ns, "web", &image, false);
    let reasons = event_reasons(c, &ns, "DataVolume", "web");
    // once each, in order (a decision from a stale read must not say it again)
    let of = |r: &str| reasons.iter().filter(|x| *x == r).count();
    let at = |r: &str| reasons.iter().position(|x| x == r);
    assert!(
        of("ImportScheduled") == 1 && of("ImportSucceeded") == 1,
        "{reasons:?}"
    );
    assert!(at("ImportScheduled") < at("ImportSucceeded"), "{reasons:?}");
    eprintln!("http qcow2.xz DataVolume: {took:.1?} from creation to Succeeded");
}

/// Eight DataVolumes created at once (raw, raw.gz, qcow2 and qcow2.xz, each disk its own
/// bytes) each land their own disk; once all succeeded, no importer pod or PVC' is left, and
/// deleting them leaves no PVC, PV or pool directory.
#[test]
fn eight_data_volumes_at_once_each_land_their_own_disk_and_leave_nothing() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let images: Vec<(String, Image)> = (0..8u64)
        .map(|i| {
            let raw = raw_image(dir.path(), &format!("d{i}.raw"), 100 + i);
            let qcow2 = dir.path().join(format!("d{i}.qcow2"));
            let served = match i % 4 {
                0 => raw.path.clone(),
                1 => {
                    let gz = dir.path().join(format!("d{i}.raw.gz"));
                    crate::common::compress(&["gzip", "-c"], &raw.path, &gz);
                    gz
                }
                _ => {
                    testkit::qemu::qemu_img(&[
                        "convert".as_ref(),
                        "-O".as_ref(),
                        "qcow2".as_ref(),
                        raw.path.as_os_str(),
                        qcow2.as_os_str(),
                    ]);
                    if i % 4 == 2 {
                        qcow2
                    } else {
                        let xz = dir.path().join(format!("d{i}.qcow2.xz"));
                        crate::common::compress(&["xz", "-c"], &qcow2, &xz);
                        xz
                    }
                }
            };
            (
                format!("burst-{i}"),
                Image {
                    path: served,
                    ..raw
                },
            )
        })
        .collect();
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("burst", &[]);
    let all: String = images
        .iter()
        .map(|(name, image)| {
            let file = image.path.file_name().unwrap().to_string_lossy();
            let source = format!("    http:\n      url: {}/{file}", server.url);
            format!("---\n{}", dv_yaml(&ns, name, &source, "64Mi", false))
        })
        .collect();
    let start = Instant::now();
    c.apply(&all);
    for (name, _) in &images {
        wait_succeeded(c, &ns, name, start);
    }
    eprintln!(
        "timing: 8 DataVolumes at once: all Succeeded {:.2} s after creation",
        start.elapsed().as_secs_f64()
    );
    let mut names: Vec<&str> = images.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    let only_the_pvcs = names.join(" ");
    c.wait_until(
        &ns,
        "pod,pvc",
        "{.items[*].metadata.name}",
        &format!("only the PVCs {only_the_pvcs}"),
        DV_LIMIT,
        |left| {
            let mut left: Vec<&str> = left.split_whitespace().collect();
            left.sort_unstable();
            left == names
        },
    );
    for (name, image) in &images {
        assert_disk(c, &ns, name, image, false);
    }
    delete_and_expect_nothing_left(c, &ns, &names);
}

/// `volumeMode: Block`: the raw disk is the device's first bytes, through the populator (the
/// default on the CSI class) and, with `usePopulator: "false"`, the importer writing the
/// DataVolume's own PVC.
#[test]
fn http_import_into_a_block_volume() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("block", &[]);
    let url = format!("{}/disk.qcow2", server.url);
    let source = format!("    http:\n      url: {url}");
    c.apply(&dv_yaml(&ns, "dev", &source, "64Mi", true));
    let direct = dv_yaml(&ns, "direct", &source, "64Mi", true).replace(
        "  annotations:\n",
        "  annotations:\n    cdi.kubevirt.io/storage.usePopulator: \"false\"\n",
    );
    c.apply(&direct);
    for name in ["dev", "direct"] {
        wait_succeeded(c, &ns, name, Instant::now());
        assert_disk(c, &ns, name, &image, true);
    }
    let source_ref = |pvc: &str| pvc_field(c, &ns, pvc, "{.spec.dataSourceRef.kind}");
    assert_eq!(source_ref("dev"), "VolumeImportSource");
    assert_eq!(source_ref("direct"), "");
}

/// A blank DataVolume is an all-zero disk of the volume's size.
#[test]
fn a_blank_volume_reads_as_zeros() {
    let Some(c) = cluster() else { return };
    let ns = c.namespace("blank", &[]);
    c.apply(&dv_yaml(&ns, "empty", "    blank: {}", "32Mi", false));
    wait_succeeded(c, &ns, "empty", Instant::now());
    let (_, zeros) = crate::support::read_disk(c, &ns, "empty", 0, false);
    assert!(zeros, "a blank disk.img holds data");
}

/// Upload as `virtctl image-upload` does it: a token from the aggregated API, then a POST to the
/// upload proxy's Service, which passes it to the DataVolume's upload server.
#[test]
fn upload_through_the_token_api_and_the_proxy() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let ns = c.namespace("upload", &[]);
    c.apply(&dv_yaml(&ns, "up", "    upload: {}", "64Mi", false));
    c.wait_for(
        &ns,
        "dv/up",
        "{.status.phase}",
        "UploadReady",
        crate::support::DV_LIMIT,
    );
    let token = crate::support::upload_token(c, &ns, "up");
    let status = crate::support::post_upload(c, &token, &image.path);
    assert_eq!(status, "200", "the proxy's answer");
    wait_succeeded(c, &ns, "up", Instant::now());
    assert_disk(c, &ns, "up", &image, false);
    let reasons = event_reasons(c, &ns, "DataVolume", "up");
    let scheduled = reasons.iter().filter(|r| *r == "UploadScheduled").count();
    assert!(
        scheduled <= 1,
        "UploadScheduled more than once: {reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r == "UploadSucceeded"),
        "{reasons:?}"
    );
}

/// A CSI clone into a DataVolume of its source's size, then a snapshot of the source restored
/// into another: both hold the source's disk.
#[test]
fn csi_clone_and_snapshot_restore_hold_the_source_disk() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &["gzip", "-c"]);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("clone", &[]);
    let url = format!("{}/disk.qcow2.gzip", server.url);
    c.apply(&dv_yaml(
        &ns,
        "src",
        &format!("    http:\n      url: {url}"),
        "64Mi",
        false,
    ));
    wait_succeeded(c, &ns, "src", Instant::now());

    let source = format!("    pvc:\n      namespace: {ns}\n      name: src");
    import_and_check(c, &ns, "copy", &source, &image);

    crate::support::snapshot_class(c);
    c.apply(&format!(
        "apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {{name: snap, namespace: {ns}}}
spec:
  volumeSnapshotClassName: {class}
  source: {{persistentVolumeClaimName: src}}
",
        class = crate::support::SNAPSHOT_CLASS
    ));
    c.wait_for(
        &ns,
        "volumesnapshot/snap",
        "{.status.readyToUse}",
        "true",
        crate::support::DV_LIMIT,
    );
    let source = format!("    snapshot:\n      namespace: {ns}\n      name: snap");
    import_and_check(c, &ns, "restored", &source, &image);
}

/// A namespace enforcing Pod Security `restricted`: importer, upload and clone pods run there.
#[test]
fn imports_uploads_and_clones_work_under_restricted_pod_security() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &["zstd", "-q", "-c"]);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace(
        "restricted",
        &[
            ("pod-security.kubernetes.io/enforce", "restricted"),
            ("pod-security.kubernetes.io/enforce-version", "latest"),
        ],
    );
    let url = format!("{}/disk.qcow2.zstd", server.url);
    c.apply(&dv_yaml(
        &ns,
        "web",
        &format!("    http:\n      url: {url}"),
        "64Mi",
        false,
    ));
    c.apply(&dv_yaml(&ns, "up", "    upload: {}", "64Mi", false));
    wait_succeeded(c, &ns, "web", Instant::now());
    assert_disk(c, &ns, "web", &image, false);

    c.wait_for(
        &ns,
        "dv/up",
        "{.status.phase}",
        "UploadReady",
        crate::support::DV_LIMIT,
    );
    let token = crate::support::upload_token(c, &ns, "up");
    assert_eq!(crate::support::post_upload(c, &token, &image.path), "200");
    wait_succeeded(c, &ns, "up", Instant::now());
    assert_disk(c, &ns, "up", &image, false);

    // host-assisted into another restricted namespace (a clone across namespaces)
    let other = c.namespace(
        "restricted-target",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    );
    let source = format!("    pvc:\n      namespace: {ns}\n      name: web");
    import_and_check(c, &other, "copy", &source, &image);
}

/// Without the immediate-binding annotation, a WaitForFirstConsumer class's DataVolume waits for
/// its consumer, as CDI's; a pod that mounts the PVC makes it bind, and the import then runs.
#[test]
fn a_wait_for_first_consumer_volume_imports_once_its_consumer_comes() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("wffc", &[]);
    let url = format!("{}/disk.qcow2", server.url);
    let yaml = dv_yaml(
        &ns,
        "late",
        &format!("    http:\n      url: {url}"),
        "64Mi",
        false,
    )
    .replace(
        "    cdi.kubevirt.io/storage.bind.immediate.requested: \"true\"\n",
        "",
    )
    .replace("  annotations:\n", "");
    c.apply(&yaml);
    // Populated (the CSI class's default): CDI's PendingPopulation until a consumer comes.
    c.wait_for(
        &ns,
        "dv/late",
        "{.status.phase}",
        "PendingPopulation",
        crate::support::DV_LIMIT,
    );
    c.apply(&format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: consumer, namespace: {ns}}}
spec:
  containers:
  - name: c
    image: docker.io/library/busybox:1.35
    command: [sleep, '3600']
    volumeMounts: [{{name: d, mountPath: /pvc}}]
  volumes:
  - name: d
    persistentVolumeClaim: {{claimName: late}}
"
    ));
    wait_succeeded(c, &ns, "late", Instant::now());
    c.kubectl_ok(&[
        "-n",
        &ns,
        "delete",
        "pod",
        "consumer",
        "--grace-period=0",
        "--force",
    ]);
    assert_disk(c, &ns, "late", &image, false);
}

/// A DataImportCron polls an HTTP source: each new version is imported and the DataSource
/// points at it; with `importsToKeep: 1` the older import is collected.
#[test]
fn a_data_import_cron_follows_two_versions_and_collects_the_old() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let v1 = crate::support::raw_image(dir.path(), "golden.img", 1);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("cron", &[]);
    let url = format!("{}/golden.img", server.url);
    c.apply(&crate::support::golden_cron(
        &ns,
        &url,
        crate::support::CLASS,
    ));
    let first = crate::support::data_source_pvc(c, &ns, "golden", None);
    assert_disk(c, &ns, &first, &v1, false);

    // a new version: other bytes, another Last-Modified
    let v2 = crate::support::raw_image(dir.path(), "golden.img", 2);
    let second = crate::support::data_source_pvc(c, &ns, "golden", Some(&first));
    assert_disk(c, &ns, &second, &v2, false);
    crate::support::wait_gone(c, &ns, "pvc", &first, "the outdated import is kept");
}

/// The StorageClass of the snapshot-format cron test: the default pool's, under a name of its
/// own, so that its StorageProfile's `dataImportCronSourceFormat: snapshot` leaves the other
/// tests' crons on PVCs.
const SNAPSHOT_FORMAT_CLASS: &str = "hostpath-csi-cron-snapshots";

/// A DataVolume `name` in `ns` cloning the DataSource `golden` of `golden_ns` (`sourceRef`)
/// onto `class`: once it succeeded, its volume holds `image`.
fn restore_and_check(
    c: &testkit::cluster::Cluster,
    (ns, golden_ns): (&str, &str),
    name: &str,
    image: &crate::support::Image,
) {
    let start = Instant::now();
    // dv_yaml's DataVolume, its source replaced by the reference, on the snapshot class.
    let yaml = dv_yaml(ns, name, "", "32Mi", false)
        .replace(
            "  source:\n\n",
            &format!("  sourceRef: {{kind: DataSource, name: golden, namespace: {golden_ns}}}\n"),
        )
        .replace(
            &format!("storageClassName: {}", crate::support::CLASS),
            &format!("storageClassName: {SNAPSHOT_FORMAT_CLASS}"),
        );
    assert!(
        yaml.contains("sourceRef") && yaml.contains(SNAPSHOT_FORMAT_CLASS),
        "{yaml}"
    );
    c.apply(&yaml);
    wait_succeeded(c, ns, name, start);
    assert_disk(c, ns, name, image, false);
}

/// A DataImportCron whose StorageClass's StorageProfile asks for the snapshot format (as an
/// admin patches it): each version is imported, kept as a VolumeSnapshot the DataSource points
/// at once it is ready to use, and its import PVC deleted; with `importsToKeep: 1` the older
/// snapshot is collected; a DataVolume with a `sourceRef` to the DataSource restores each
/// version's bytes.
#[test]
fn a_snapshot_format_data_import_cron_keeps_versions_as_snapshots_that_data_volumes_restore() {
    let Some(c) = cluster() else { return };
    crate::support::snapshot_class(c);
    c.apply(&format!(
        "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {SNAPSHOT_FORMAT_CLASS}}}
provisioner: kubevirt.io.hostpath-provisioner
parameters: {{storagePool: local}}
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
"
    ));
    let ns = c.namespace("cron-snapshots", &[]);
    let profile = format!("storageprofile/{SNAPSHOT_FORMAT_CLASS}");
    c.wait_for(
        &ns,
        &profile,
        "{.status.provisioner}",
        "kubevirt.io.hostpath-provisioner",
        crate::support::DV_LIMIT,
    );
    c.kubectl_ok(&[
        "patch",
        "storageprofile",
        SNAPSHOT_FORMAT_CLASS,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"dataImportCronSourceFormat":"snapshot"}}"#,
    ]);
    c.wait_for(
        &ns,
        &profile,
        "{.status.dataImportCronSourceFormat}",
        "snapshot",
        crate::support::DV_LIMIT,
    );

    let dir = tempfile::tempdir().unwrap();
    let v1 = crate::support::raw_image(dir.path(), "golden.img", 1);
    let server = FileServer::start(c, dir.path());
    let url = format!("{}/golden.img", server.url);
    c.apply(&crate::support::golden_cron(
        &ns,
        &url,
        SNAPSHOT_FORMAT_CLASS,
    ));
    let first = data_source_at(c, &ns, "golden", Source::Snapshot, None);
    let status = |path: &str| {
        c.kubectl_ok(&[
            "-n",
            &ns,
            "get",
            "dataimportcron",
            "golden",
            "-o",
            &format!("jsonpath={path}"),
        ])
    };
    assert_eq!(status("{.status.sourceFormat}"), "snapshot");
    assert_eq!(status("{.status.lastImportedPVC.name}"), first);
    let outlives = "the import outlives its ready snapshot";
    wait_gone(c, &ns, "pvc", &first, outlives);
    wait_gone(c, &ns, "dv", &first, outlives);
    restore_and_check(c, (&ns, &ns), "vm-1", &v1);

    // A new version: its own snapshot, the first one collected (importsToKeep 1).
    let v2 = crate::support::raw_image(dir.path(), "golden.img", 2);
    let second = data_source_at(c, &ns, "golden", Source::Snapshot, Some(&first));
    wait_gone(c, &ns, "pvc", &second, outlives);
    let kept = "the outdated snapshot is kept";
    wait_gone(c, &ns, "volumesnapshot", &first, kept);
    restore_and_check(c, (&ns, &ns), "vm-2", &v2);

    // Into another namespace (VMs apart from their golden images): the snapshot is restored in
    // its own namespace and copied host-assisted; the restore goes once the copy is done.
    let vms = c.namespace("cron-snapshot-vms", &[]);
    restore_and_check(c, (&vms, &ns), "vm-3", &v2);
    let reasons = crate::support::event_reasons(c, &vms, "DataVolume", "vm-3");
    assert!(
        reasons.iter().any(|r| r == "CrossNamespaceClone"),
        "{reasons:?}"
    );
    let uid = c.kubectl_ok(&[
        "-n",
        &vms,
        "get",
        "dv",
        "vm-3",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let restore = format!("{}-host-assisted-source-pvc", uid.trim());
    wait_gone(
        c,
        &ns,
        "pvc",
        &restore,
        "the snapshot's restore outlives the copy",
    );
}

/// HTTPS with the server's CA from a ConfigMap (`certConfigMap`) and basic auth from a Secret
/// (`secretRef`, CDI's `accessKeyId`/`secretKey` keys), from nginx on the node's address.
#[test]
fn https_import_with_a_ca_config_map_and_basic_auth() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &["xz", "-c"]);
    let ca = testkit::tls::TestCa::for_ip(Some(&c.node_ip));
    let nginx = testkit::nginx::Nginx::start(testkit::nginx::NginxConfig {
        root: dir.path().into(),
        ranges: true,
        tls: Some(&ca),
        basic_auth: Some(("importer".into(), "s3cret".into())),
        address: Some(c.node_ip.parse().unwrap()),
        ..Default::default()
    });
    let ns = c.namespace("https", &[]);
    crate::support::ca_config_map(c, &ns, "web-ca", &ca.ca_pem());
    crate::support::key_secret(c, &ns, "web-creds", "importer", "s3cret");
    let source = format!(
        "    http:\n      url: {}\n      certConfigMap: web-ca\n      secretRef: web-creds",
        nginx.url("/disk.qcow2.xz")
    );
    import_and_check(c, &ns, "secure", &source, &image);
}

/// S3 (SeaweedFS on the node's address, signatures checked) over HTTP and over HTTPS with the
/// server's CA from a ConfigMap, the keys from a Secret (CDI's `accessKeyId`/`secretKey`).
#[test]
fn s3_imports_over_http_and_https() {
    let Some(c) = cluster() else { return };
    if !testkit::s3::installed() {
        eprintln!("skipped: weed (SeaweedFS) is not installed (scripts/setup.sh installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &["gzip", "-c"]);
    let s3 = testkit::s3::Seaweed::start_on(c.node_ip.parse().unwrap());
    s3.put(&image.path, "images/disk.qcow2.gz");
    let ns = c.namespace("s3", &[]);
    crate::support::key_secret(
        c,
        &ns,
        "s3-keys",
        testkit::s3::ACCESS_KEY,
        testkit::s3::SECRET_KEY,
    );
    crate::support::ca_config_map(c, &ns, "s3-ca", &s3.ca().ca_pem());
    let key = format!("{}/images/disk.qcow2.gz", testkit::s3::BUCKET);
    let plain = format!(
        "    s3:\n      url: {}/{key}\n      secretRef: s3-keys",
        s3.endpoint()
    );
    let secure = format!(
        "    s3:\n      url: {}/{key}\n      secretRef: s3-keys\n      certConfigMap: s3-ca",
        s3.https_endpoint()
    );
    let start = Instant::now();
    c.apply(&dv_yaml(&ns, "plain", &plain, "64Mi", false));
    c.apply(&dv_yaml(&ns, "secure", &secure, "64Mi", false));
    for name in ["plain", "secure"] {
        wait_succeeded(c, &ns, name, start);
        assert_disk(c, &ns, name, &image, false);
    }
}

/// GCS (gcp-storage-emulator on the node's address, CDI's `http://HOST/BUCKET/OBJECT` form),
/// anonymously and with a service account's key from a Secret (`credentials.json`, mounted at
/// `/google`), whose token endpoint (testkit's, on the node's address) verifies each assertion.
#[test]
fn gcs_imports_anonymously_and_with_a_service_account_key() {
    let Some(c) = cluster() else { return };
    if !testkit::gcs::installed() {
        eprintln!("skipped: gcp-storage-emulator is not installed (scripts/setup.sh installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &["xz", "-c"]);
    let node: std::net::Ipv4Addr = c.node_ip.parse().unwrap();
    let store = testkit::gcs::Emulator::start_on(node);
    store.put(&image.path, "images/disk.qcow2.xz");
    let grant = testkit::gcs::Grant::Verify { expires_in: 3600 };
    let tokens = testkit::gcs::TokenEndpoint::start_on(node, grant);
    let ns = c.namespace("gcs", &[]);
    let key = tokens.write_key_file(dir.path());
    c.kubectl_ok(&[
        "-n",
        &ns,
        "create",
        "secret",
        "generic",
        "gcs-key",
        &format!("--from-file=credentials.json={}", key.display()),
    ]);
    let url = format!(
        "{}/{}/images/disk.qcow2.xz",
        store.endpoint(),
        testkit::gcs::BUCKET
    );
    let anonymous = format!("    gcs:\n      url: {url}");
    let keyed = format!("    gcs:\n      url: {url}\n      secretRef: gcs-key");
    let start = Instant::now();
    c.apply(&dv_yaml(&ns, "anonymous", &anonymous, "64Mi", false));
    c.apply(&dv_yaml(&ns, "keyed", &keyed, "64Mi", false));
    for name in ["anonymous", "keyed"] {
        wait_succeeded(c, &ns, name, start);
        assert_disk(c, &ns, name, &image, false);
    }
    // The keyed import's token came from a verified assertion (the anonymous one asks none).
    let asked = tokens.requests();
    assert!(
        !asked.is_empty() && asked.iter().all(|r| r.outcome.is_ok()),
        "{asked:?}"
    );
}

/// `contentType: archive`: a tar.gz's files land in the volume, a disk image among them as a
/// file; no `disk.img` is made.
#[test]
fn an_archive_is_extracted_into_the_volume() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("a.txt"), "hello from the archive\n").unwrap();
    let big: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    std::fs::write(tree.join("sub/b.bin"), &big).unwrap();
    let tar = dir.path().join("files.tar.gz");
    let out = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&tar)
        .arg("-C")
        .arg(&tree)
        .args(["a.txt", "sub"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("archive", &[]);
    let yaml = dv_yaml(
        &ns,
        "files",
        &format!("    http:\n      url: {}/files.tar.gz", server.url),
        "32Mi",
        false,
    )
    .replace(
        "spec:\n  source:",
        "spec:\n  contentType: archive\n  source:",
    );
    c.apply(&yaml);
    wait_succeeded(c, &ns, "files", Instant::now());
    let listing = crate::support::in_volume(
        c,
        &ns,
        "files",
        "cd /pvc && sha256sum a.txt sub/b.bin && ls -a /pvc | sort | tr '\\n' ' '",
    );
    let want_a = crate::support::sha256_hex(b"hello from the archive\n");
    let want_b = crate::support::sha256_hex(&big);
    assert!(listing.contains(&format!("{want_a}  a.txt")), "{listing}");
    assert!(
        listing.contains(&format!("{want_b}  sub/b.bin")),
        "{listing}"
    );
    assert!(!listing.contains("disk.img"), "{listing}");
}

/// `sourceRef` to a DataSource naming a PVC: the clone holds the PVC's disk; a larger target is
/// grown (its disk.img keeps the source's bytes, then zeros).
#[test]
fn a_source_ref_clone_into_a_larger_target_is_grown() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("sourceref", &[]);
    c.apply(&dv_yaml(
        &ns,
        "golden",
        &format!("    http:\n      url: {}/disk.qcow2", server.url),
        "64Mi",
        false,
    ));
    wait_succeeded(c, &ns, "golden", Instant::now());
    c.apply(&format!(
        "apiVersion: cdi.kubevirt.io/v1beta1
kind: DataSource
metadata: {{name: fedora, namespace: {ns}}}
spec:
  source:
    pvc: {{namespace: {ns}, name: golden}}
"
    ));
    let yaml = dv_yaml(&ns, "vm-disk", "", "128Mi", false).replace(
        "spec:\n  source:\n\n",
        &format!(
            "spec:\n  sourceRef:\n    kind: DataSource\n    name: fedora\n    namespace: {ns}\n"
        ),
    );
    c.apply(&yaml);
    wait_succeeded(c, &ns, "vm-disk", Instant::now());
    assert_disk(c, &ns, "vm-disk", &image, false);
    let size = crate::support::in_volume(c, &ns, "vm-disk", "stat -c %s /pvc/disk.img");
    let size: u64 = size.trim().parse().unwrap();
    assert!(size > 100 << 20, "disk.img was not grown: {size} bytes");
}

/// A containerDisk (the qcow2 in a gzip layer, as KubeVirt builds them) from a TLS registry on
/// the node's address, its CA from `certConfigMap`.
#[test]
fn a_registry_container_disk_is_imported() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let mut layout = testkit::oci::OciLayout::create(&dir.path().join("layout"));
    layout.add(
        "v1",
        &testkit::oci::Image::new(vec![testkit::oci::Layer::disk(
            "disk.qcow2",
            std::fs::read(&image.path).unwrap(),
        )]),
    );
    let ca = testkit::tls::TestCa::for_ip(Some(&c.node_ip));
    let reg = testkit::registry::Registry::start(testkit::registry::RegistryConfig {
        tls: Some(&ca),
        address: Some(c.node_ip.parse().unwrap()),
        ..Default::default()
    });
    reg.push(layout.dir(), "v1", "vm/disk:v1", None, false);
    let ns = c.namespace("registry", &[]);
    crate::support::ca_config_map(c, &ns, "registry-ca", &ca.ca_pem());
    let source = format!(
        "    registry:\n      url: {}\n      certConfigMap: registry-ca",
        reg.image("vm/disk:v1")
    );
    import_and_check(c, &ns, "cd", &source, &image);
}

/// A raw disk through the proxy's async path (virtctl's default), and a tar through its archive
/// path into a `contentType: archive` DataVolume.
#[test]
fn raw_and_archive_uploads_through_the_proxy() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let raw = crate::support::raw_image(dir.path(), "disk.raw", 11);
    let ns = c.namespace("uploads", &[]);
    c.apply(&dv_yaml(&ns, "raw", "    upload: {}", "32Mi", false));
    let archive = dv_yaml(&ns, "files", "    upload: {}", "32Mi", false).replace(
        "spec:\n  source:",
        "spec:\n  contentType: archive\n  source:",
    );
    c.apply(&archive);
    for dv in ["raw", "files"] {
        c.wait_for(
            &ns,
            &format!("dv/{dv}"),
            "{.status.phase}",
            "UploadReady",
            crate::support::DV_LIMIT,
        );
    }
    let token = crate::support::upload_token(c, &ns, "raw");
    let code = crate::support::post_upload_to(c, "/v1beta1/upload-async", &token, &raw.path);
    assert_eq!(code, "200");
    wait_succeeded(c, &ns, "raw", Instant::now());
    assert_disk(c, &ns, "raw", &raw, false);

    let tree = dir.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("notes.txt"), "uploaded as an archive\n").unwrap();
    let tar = dir.path().join("files.tar");
    let out = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&tree)
        .arg("notes.txt")
        .output()
        .unwrap();
    assert!(out.status.success());
    let token = crate::support::upload_token(c, &ns, "files");
    let code = crate::support::post_upload_to(c, "/v1beta1/upload-archive", &token, &tar);
    assert_eq!(code, "200");
    wait_succeeded(c, &ns, "files", Instant::now());
    let listing = crate::support::in_volume(c, &ns, "files", "cd /pvc && sha256sum notes.txt");
    let want = crate::support::sha256_hex(b"uploaded as an archive\n");
    assert!(listing.contains(&format!("{want}  notes.txt")), "{listing}");
}

/// A PVC expanded while a pod uses it: its capacity grows (the resizer and the driver's
/// expansion through the real sidecar) and the pod keeps reading its data.
#[test]
fn a_pvc_expanded_while_a_pod_uses_it_grows_and_keeps_its_data() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("expand", &[]);
    let source = format!("    http:\n      url: {}/disk.qcow2", server.url);
    c.apply(&dv_yaml(&ns, "grow", &source, "64Mi", false));
    wait_succeeded(c, &ns, "grow", Instant::now());
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
    persistentVolumeClaim: {{claimName: grow}}
"
    ));
    c.wait_for(
        &ns,
        "pod/user",
        "{.status.phase}",
        "Running",
        crate::support::DV_LIMIT,
    );
    c.kubectl_ok(&[
        "-n",
        &ns,
        "patch",
        "pvc",
        "grow",
        "--type=merge",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"256Mi"}}}}"#,
    ]);
    c.wait_for(
        &ns,
        "pvc/grow",
        "{.status.capacity.storage}",
        "256Mi",
        crate::support::DV_LIMIT,
    );
    let sum = c.kubectl_ok(&[
        "-n",
        &ns,
        "exec",
        "user",
        "--",
        "sh",
        "-c",
        &format!("head -c {} /pvc/disk.img | sha256sum", image.raw_len),
    ]);
    assert!(sum.starts_with(&image.raw_sha256), "{sum}");
}

/// `quarry upload` through the proxy's Service with the connection cut after 3 MiB: the client
/// asks the upload pod how much it holds and sends only the rest; the disk is whole.
#[test]
fn a_dropped_upload_through_the_proxy_is_resumed() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let len = std::fs::metadata(&image.path).unwrap().len();
    let ns = c.namespace("resume", &[]);
    c.apply(&dv_yaml(&ns, "up", "    upload: {}", "64Mi", false));
    c.wait_for(
        &ns,
        "dv/up",
        "{.status.phase}",
        "UploadReady",
        crate::support::DV_LIMIT,
    );
    let token = crate::support::upload_token(c, &ns, "up");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let proxy: std::net::IpAddr = crate::support::upload_proxy_ip(c).parse().unwrap();
    let cut = testkit::proxy::CutProxy::start_upload((proxy, 443).into(), 3 << 20);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quarry"))
        .arg("upload")
        .arg(&image.path)
        .args(["--url", &format!("https://127.0.0.1:{}", cut.port())])
        .arg("--token-file")
        .arg(&token_file)
        .args(["--insecure", "--json"])
        .output()
        .unwrap();
    crate::common::assert_ok(&out);
    let report = crate::common::json(&out);
    assert_eq!(cut.cuts(), 1, "the connection was not cut");
    let resumed: Vec<u64> = serde_json::from_value(report["resumed_from"].clone()).unwrap();
    assert!(
        !resumed.is_empty() && resumed[0] > 0,
        "did not resume: {report}"
    );
    let sent = report["bytes_sent"].as_u64().unwrap();
    assert!(sent - len < len, "the whole image went again: {report}");
    wait_succeeded(c, &ns, "up", Instant::now());
    assert_disk(c, &ns, "up", &image, false);
}
