//! End-to-end tests of `quarry import docker://...` against Debian's real `docker-registry`
//! (plain, TLS, htpasswd, token auth with the suite's token service, schema-1 compatibility),
//! with containerDisk images built by testkit and pushed by `skopeo` as OCI, Docker schema 2,
//! an OCI index and a Docker manifest list. Outputs are compared with `qemu-img convert -O raw`.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;

use base64::Engine as _;
use testkit::faults::{FaultConfig, FaultServer};
use testkit::nginx::{Nginx, NginxConfig};
use testkit::oci::{Compression, Entry, Image, Layer, OciLayout};
use testkit::proxy::CutProxy;
use testkit::registry::{self, Registry, RegistryConfig, TokenService};
use testkit::tls::TestCa;

mod common;
use common::*;

fn peers_missing() -> bool {
    if registry::installed() {
        return false;
    }
    eprintln!("skipping: docker-registry or skopeo is missing (scripts/setup.sh installs them)");
    true
}

fn import(image: &str, target: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["import", image, arg(target), "--json", "--retries", "2"];
    args.extend_from_slice(extra);
    run(&args)
}

/// [`import`] as `user`, the password passed the way a pod would: in an environment variable.
fn import_as(image: &str, target: &Path, user: &str, password: &str, extra: &[&str]) -> Output {
    quarry()
        .args(["import", image, arg(target), "--json", "--retries", "2"])
        .args(["--user", user, "--password-env", "QUARRY_TEST_PW"])
        .args(extra)
        .env("QUARRY_TEST_PW", password)
        .output()
        .unwrap()
}

/// A small raw disk that differs from the sample one.
fn other_disk() -> Vec<u8> {
    (0..1u32 << 20).map(|i| (i % 251) as u8 | 1).collect()
}

/// An OCI layout with the sample qcow2 as containerDisk `v1`, and qemu-img's conversion of it.
fn sample_image(dir: &Path) -> (OciLayout, Vec<u8>) {
    let (qcow2, expected) = sample_qcow2(dir);
    let mut layout = OciLayout::create(&dir.join("layout"));
    layout.add(
        "v1",
        &Image::new(vec![Layer::disk("disk.qcow2", fs::read(&qcow2).unwrap())]),
    );
    (layout, expected)
}

/// A plain-HTTP registry serving the sample image as `vm/disk:v1`, and qemu-img's conversion.
fn plain_registry_with_sample(dir: &Path) -> (Registry, Vec<u8>) {
    let (layout, expected) = sample_image(dir);
    let reg = Registry::start(RegistryConfig::default());
    reg.push(layout.dir(), "v1", "vm/disk:v1", None, false);
    (reg, expected)
}

#[test]
fn oci_and_docker_schema2_images_import_like_qemu_img() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (qcow2, expected) = sample_qcow2(dir.path());
    let qcow2_bytes = fs::read(&qcow2).unwrap();
    let mut layout = OciLayout::create(&dir.path().join("layout"));
    let qcow2_manifest = layout.add(
        "qcow2",
        &Image::new(vec![Layer::disk("disk.qcow2", qcow2_bytes.clone())]),
    );
    let raw = other_disk();
    layout.add(
        "raw-zstd",
        &Image::new(vec![Layer::new(
            Compression::Zstd,
            vec![
                Entry::Dir("disk".into()),
                Entry::File("disk/disk.img".into(), raw.clone()),
            ],
        )]),
    );
    let reg = Registry::start(RegistryConfig::default());
    reg.push(layout.dir(), "qcow2", "vm/disk:oci", None, false);
    reg.push(layout.dir(), "qcow2", "vm/disk:v2s2", Some("v2s2"), false);
    reg.push(layout.dir(), "raw-zstd", "vm/raw:zstd", None, false);

    let out_dir = tempfile::tempdir().unwrap();
    for tag in ["oci", "v2s2"] {
        let target = out_dir.path().join(format!("{tag}.img"));
        let out = import(
            &reg.image(&format!("vm/disk:{tag}")),
            &target,
            &["--insecure"],
        );
        assert_ok(&out);
        assert_eq!(fs::read(&target).unwrap(), expected, "{tag}");
        let report = json(&out);
        assert_eq!(
            report["format_chain"],
            serde_json::json!(["qcow2"]),
            "{tag}"
        );
        assert_eq!(report["source_bytes"], qcow2_bytes.len(), "{tag}");
    }
    // Pinned by digest (skopeo keeps an OCI manifest byte for byte).
    let target = out_dir.path().join("pinned.img");
    let pinned = format!("{}@{}", reg.image("vm/disk"), qcow2_manifest.digest);
    assert_ok(&import(&pinned, &target, &["--insecure"]));
    assert_eq!(fs::read(&target).unwrap(), expected);

    let target = out_dir.path().join("zstd.img");
    assert_ok(&import(&reg.image("vm/raw:zstd"), &target, &["--insecure"]));
    assert_eq!(fs::read(&target).unwrap(), raw);

    // --checksum covers the disk file as stored in the image.
    let sha = testkit::oci::sha256_digest(&qcow2_bytes);
    let target = out_dir.path().join("sum.img");
    let out = import(
        &reg.image("vm/disk:oci"),
        &target,
        &["--insecure", "--checksum", &sha],
    );
    assert_ok(&out);
    assert_eq!(json(&out)["source_checksum"], sha);
    let wrong = format!("sha256:{}", "0".repeat(64));
    let target = out_dir.path().join("badsum.img");
    let out = import(
        &reg.image("vm/disk:oci"),
        &target,
        &["--insecure", "--checksum", &wrong],
    );
    assert_refused(&out, 14, "checksum mismatch", &target);

    // Without --insecure a plain-HTTP registry is not used.
    let target = out_dir.path().join("secure.img");
    let out = import(&reg.image("vm/disk:oci"), &target, &[]);
    assert_refused(&out, 15, "TLS", &target);
    assert_refused(&out, 15, "plain HTTP, not TLS", &target);
    assert_refused(&out, 15, "--insecure", &target);
}

#[test]
fn index_and_manifest_list_resolve_to_the_platform() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (qcow2, expected) = sample_qcow2(dir.path());
    let amd = Image::new(vec![Layer::disk("disk.qcow2", fs::read(&qcow2).unwrap())]);
    let arm_disk = other_disk();
    let arm = Image::new(vec![Layer::disk("disk.img", arm_disk.clone())]).arch("arm64");
    let mut layout = OciLayout::create(&dir.path().join("layout"));
    let (a, b) = (layout.image(&amd), layout.image(&arm));
    let index = layout.index(&[(b, &arm), (a, &amd)]);
    layout.tag("multi", &index);
    let reg = Registry::start(RegistryConfig::default());
    reg.push(layout.dir(), "multi", "vm/multi:oci", None, true);
    reg.push(layout.dir(), "multi", "vm/multi:list", Some("v2s2"), true);

    let out_dir = tempfile::tempdir().unwrap();
    for tag in ["oci", "list"] {
        let image = reg.image(&format!("vm/multi:{tag}"));
        let target = out_dir.path().join(format!("{tag}-amd64.img"));
        assert_ok(&import(&image, &target, &["--insecure"]));
        assert_eq!(
            fs::read(&target).unwrap(),
            expected,
            "{tag} default platform"
        );

        let target = out_dir.path().join(format!("{tag}-arm64.img"));
        let out = import(
            &image,
            &target,
            &["--insecure", "--platform", "linux/arm64"],
        );
        assert_ok(&out);
        assert_eq!(fs::read(&target).unwrap(), arm_disk, "{tag} arm64");

        let target = out_dir.path().join(format!("{tag}-s390x.img"));
        let out = import(
            &image,
            &target,
            &["--insecure", "--platform", "linux/s390x"],
        );
        assert_refused(&out, 11, "no image for platform linux/s390x", &target);
    }
}

#[test]
fn tls_and_basic_auth_with_user_and_auth_file() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (layout, expected) = sample_image(dir.path());
    let ca = TestCa::new();
    let reg = Registry::start(RegistryConfig {
        tls: Some(&ca),
        htpasswd: Some(("alice", "s3cret")),
        ..Default::default()
    });
    reg.push(layout.dir(), "v1", "vm/disk:v1", None, false);
    let image = reg.image("vm/disk:v1");
    let ca_arg = arg(&ca.ca_pem()).to_string();
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");

    let out = import(&image, &target, &[]);
    assert_refused(&out, 15, "TLS verification failed", &target);
    let out = import(&image, &target, &["--ca-cert", &ca_arg]);
    assert_refused(&out, 15, "unauthorised", &target);
    let wrong = out_dir.path().join("wrong");
    fs::write(&wrong, "nope\n").unwrap();
    let out = import(
        &image,
        &target,
        &[
            "--ca-cert",
            &ca_arg,
            "--user",
            "alice",
            "--password-file",
            arg(&wrong),
        ],
    );
    assert_refused(&out, 15, "unauthorised", &target);

    let out = import_as(&image, &target, "alice", "s3cret", &["--ca-cert", &ca_arg]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);

    // A pull secret's config.json: base64 user:password under the registry's host:port.
    let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
    let config = out_dir.path().join("config.json");
    fs::write(
        &config,
        format!(
            r#"{{"auths":{{"127.0.0.1:{}":{{"auth":"{auth}"}}}}}}"#,
            reg.port()
        ),
    )
    .unwrap();
    let target = out_dir.path().join("secret.img");
    let out = import(
        &image,
        &target,
        &["--ca-cert", &ca_arg, "--auth-file", arg(&config)],
    );
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);
}

#[test]
fn bearer_tokens_from_a_token_service() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (layout, expected) = sample_image(dir.path());
    let tokens = TokenService::start("bob", "t0ken-pw");
    let reg = Registry::start(RegistryConfig {
        token: Some(&tokens),
        ..Default::default()
    });
    reg.push(layout.dir(), "v1", "vm/disk:v1", Some("v2s2"), false);
    let image = reg.image("vm/disk:v1");
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");

    let out = import(&image, &target, &["--insecure"]);
    assert_refused(&out, 15, "unauthorised", &target);

    let config = out_dir.path().join("config.json");
    fs::write(
        &config,
        format!(
            r#"{{"auths":{{"http://127.0.0.1:{}/v2/":{{"username":"bob","password":"t0ken-pw"}}}}}}"#,
            reg.port()
        ),
    )
    .unwrap();
    let out = import(
        &image,
        &target,
        &["--insecure", "--auth-file", arg(&config)],
    );
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);
    // A front that answers the ping anonymously (as some registries do): the manifest's 401
    // challenge is answered then.
    let front = Nginx::start(NginxConfig {
        root: dir.path().to_path_buf(),
        extra: format!(
            "location = /v2/ {{ return 200 '{{}}'; }}\nlocation /v2/ {{ proxy_pass http://127.0.0.1:{}; }}\n",
            reg.port()
        ),
        ..Default::default()
    });
    let target = out_dir.path().join("front.img");
    let image = format!("docker://127.0.0.1:{}/vm/disk:v1", front.port());
    let out = import_as(&image, &target, "bob", "t0ken-pw", &["--insecure"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);
    let last = tokens.requests().pop().unwrap();
    assert!(
        last.contains("scope=repository%3Avm%2Fdisk%3Apull")
            && last.contains("service=testkit-registry")
            && last.ends_with("auth=yes"),
        "{last}"
    );
}

#[test]
fn images_without_exactly_one_plain_disk_are_refused() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut layout = OciLayout::create(&dir.path().join("layout"));
    let disk = other_disk();
    let file = |p: &str| Entry::File(p.into(), disk.clone());
    let gz = |entries| Layer::new(Compression::Gzip, entries);
    let cases: Vec<(&str, Image, i32, &str)> = vec![
        (
            "nodisk",
            Image::new(vec![gz(vec![Entry::File(
                "etc/hostname".into(),
                b"vm\n".to_vec(),
            )])]),
            11,
            "no disk",
        ),
        (
            "twodisks",
            Image::new(vec![gz(vec![file("disk/a.img"), file("disk/b.img")])]),
            11,
            "two disks",
        ),
        (
            "traversal",
            Image::new(vec![gz(vec![Entry::RawName(
                b"disk/../../etc/passwd".to_vec(),
                disk.clone(),
            )])]),
            12,
            "path traversal",
        ),
        (
            "symlink",
            Image::new(vec![gz(vec![Entry::Symlink(
                "disk/disk.img".into(),
                "/etc/passwd".into(),
            )])]),
            11,
            "not a regular file",
        ),
        (
            "bootc",
            Image::new(vec![Layer::disk("disk.img", disk.clone())]).label("containers.bootc", "1"),
            11,
            "bootc",
        ),
        (
            "whitedout",
            Image::new(vec![
                Layer::disk("old.img", disk.clone()),
                gz(vec![Entry::File("disk/.wh.old.img".into(), Vec::new())]),
            ]),
            11,
            "no disk",
        ),
    ];
    for (tag, image, _, _) in &cases {
        layout.add(tag, image);
    }
    // A whiteout hiding the old disk of a lower layer, with a new one beside it.
    let new_disk: Vec<u8> = disk.iter().map(|b| b ^ 0x40).collect();
    layout.add(
        "replaced",
        &Image::new(vec![
            Layer::disk("old.img", disk.clone()),
            gz(vec![
                Entry::File("disk/.wh.old.img".into(), Vec::new()),
                Entry::File("disk/new.img".into(), new_disk.clone()),
            ]),
        ]),
    );
    let reg = Registry::start(RegistryConfig::default());
    let out_dir = tempfile::tempdir().unwrap();
    for (tag, _, code, what) in &cases {
        reg.push(layout.dir(), tag, &format!("vm/bad:{tag}"), None, false);
        let target = out_dir.path().join(format!("{tag}.img"));
        let out = import(
            &reg.image(&format!("vm/bad:{tag}")),
            &target,
            &["--insecure"],
        );
        assert_refused(&out, *code, what, &target);
    }
    reg.push(layout.dir(), "replaced", "vm/ok:replaced", None, false);
    let target = out_dir.path().join("replaced.img");
    assert_ok(&import(
        &reg.image("vm/ok:replaced"),
        &target,
        &["--insecure"],
    ));
    assert_eq!(fs::read(&target).unwrap(), new_disk);
}

#[test]
fn schema1_manifests_are_refused() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut layout = OciLayout::create(&dir.path().join("layout"));
    layout.add(
        "v1",
        &Image::new(vec![Layer::disk("disk.img", other_disk())]),
    );
    let reg = Registry::start(RegistryConfig {
        schema1: true,
        ..Default::default()
    });
    reg.push(layout.dir(), "v1", "vm/old:s1", Some("v2s1"), false);
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let out = import(&reg.image("vm/old:s1"), &target, &["--insecure"]);
    assert_refused(&out, 11, "schema 1", &target);
}

#[test]
fn a_blob_that_does_not_match_its_digest_fails_and_leaves_no_target() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut layout = OciLayout::create(&dir.path().join("layout"));
    layout.add(
        "v1",
        &Image::new(vec![Layer::disk("disk.img", other_disk())]),
    );
    let reg = Registry::start(RegistryConfig::default());
    reg.push(layout.dir(), "v1", "vm/disk:v1", None, false);
    // Change the gzip header's mtime: the layer still decodes to the same disk, so only the
    // digest check can notice.
    let (stored, digest) = reg.largest_blob();
    let mut bytes = fs::read(&stored).unwrap();
    assert_eq!(&bytes[..2], b"\x1f\x8b", "the layer is gzip");
    bytes[4] ^= 0xff;
    fs::write(&stored, &bytes).unwrap();

    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let out = import(&reg.image("vm/disk:v1"), &target, &["--insecure"]);
    assert_refused(&out, 14, &digest, &target);
    assert_eq!(json(&out)["kind"], "checksum-mismatch");
    assert_eq!(json(&out)["retryable"], false);
}

#[test]
fn a_dropped_blob_download_resumes_with_a_range() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (reg, expected) = plain_registry_with_sample(dir.path());
    let proxy = CutProxy::start(SocketAddr::from(([127, 0, 0, 1], reg.port())), 1 << 20);
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let image = format!("docker://127.0.0.1:{}/vm/disk:v1", proxy.port());
    let out = import(&image, &target, &["--insecure"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);
    assert_eq!(proxy.cuts(), 1);
    assert!(
        proxy.sent().contains("range: bytes="),
        "no ranged request was sent"
    );
}

#[test]
fn blob_redirects_are_followed_without_the_registry_credentials() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (layout, expected) = sample_image(dir.path());
    let reg = Registry::start(RegistryConfig {
        htpasswd: Some(("alice", "s3cret")),
        ..Default::default()
    });
    reg.push(layout.dir(), "v1", "vm/disk:v1", None, false);
    // "Blob storage" on another host (localhost, not 127.0.0.1), and nginx in front of the
    // registry sending the layer there, as registries backed by object storage do.
    let (layer, digest) = reg.largest_blob();
    let storage = FaultServer::start(FaultConfig::new(fs::read(&layer).unwrap()));
    let storage_url = storage.url("/blob").replace("127.0.0.1", "localhost");
    let front = Nginx::start(NginxConfig {
        root: dir.path().to_path_buf(),
        redirects: vec![(format!("/v2/vm/disk/blobs/{digest}"), storage_url)],
        extra: format!(
            "location /v2/ {{ proxy_pass http://127.0.0.1:{}; }}\n",
            reg.port()
        ),
        ..Default::default()
    });
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let image = format!("docker://127.0.0.1:{}/vm/disk:v1", front.port());
    let out = import_as(&image, &target, "alice", "s3cret", &["--insecure"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);
    let reqs = storage.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(reqs[0].header("authorization"), None, "{reqs:?}");
}

#[test]
fn an_expired_token_is_renewed_when_a_dropped_download_resumes() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (layout, expected) = sample_image(dir.path());
    // Expired 57 s ago: inside the registry's 60 s leeway for 3 s.
    let tokens = TokenService::start_with_lifetime("bob", "t0ken-pw", -57);
    let reg = Registry::start(RegistryConfig {
        token: Some(&tokens),
        ..Default::default()
    });
    reg.push(layout.dir(), "v1", "vm/disk:v1", None, false);
    // The layer download stops after 1 MiB for 4 s, then breaks: the resumed request's token
    // has expired by then.
    let proxy = CutProxy::start_stalling(
        SocketAddr::from(([127, 0, 0, 1], reg.port())),
        1 << 20,
        std::time::Duration::from_secs(4),
    );
    let before = tokens.requests().len();
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let image = format!("docker://127.0.0.1:{}/vm/disk:v1", proxy.port());
    let out = import_as(&image, &target, "bob", "t0ken-pw", &["--insecure"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);
    assert_eq!(proxy.cuts(), 1);
    let fetched = tokens.requests().len() - before;
    assert_eq!(fetched, 2, "{:?}", tokens.requests());
    assert!(proxy.sent().contains("range: bytes="));
}

#[test]
fn local_mode_reaches_a_plain_http_registry_only_when_it_is_named_insecure() {
    if peers_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (reg, expected) = plain_registry_with_sample(dir.path());
    let manifest = dir.path().join("dv.yaml");
    fs::write(
        &manifest,
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata:\n  name: golden\nspec:\n  source:\n    registry:\n      url: \"{}\"\n  storage:\n    resources:\n      requests:\n        storage: 64Mi\n",
            reg.image("vm/disk:v1")
        ),
    )
    .unwrap();
    let (pool, state) = (dir.path().join("pool"), dir.path().join("state"));
    let apply = |extra: &[&str]| {
        let mut args = vec!["apply", "-f", arg(&manifest), "--pool", arg(&pool)];
        args.extend(["--state-dir", arg(&state), "--max-restarts", "0"]);
        args.extend_from_slice(extra);
        run(&args)
    };
    let refused = apply(&[]);
    assert_exit(&refused, 1);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("datavolume/golden Failed"), "{err}");
    assert!(err.contains("plain HTTP"), "{err}");

    let host = format!("127.0.0.1:{}", reg.port());
    assert_ok(&apply(&["--insecure-registry", &host]));
    let disk = fs::read(pool.join("default-golden").join("disk.img")).unwrap();
    assert_eq!(&disk[..expected.len()], &expected[..]);
    assert!(disk[expected.len()..].iter().all(|&b| b == 0));
}
