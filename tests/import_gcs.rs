//! End-to-end tests of `quarry import` from Google Cloud Storage: PyPI's `gcp-storage-emulator`
//! as the store (`gs://` through `STORAGE_EMULATOR_HOST`, and CDI's `http://HOST/BUCKET/OBJECT`
//! form), a download cut mid-object and resumed, a missing object and bucket refused; a service
//! account's tokens from testkit's token endpoint (which has `openssl` verify each assertion's
//! RS256 signature and checks its claims) on every object request, renewed when the store
//! answers 401; bad key files and a refusing token endpoint failing clearly with nothing left.
//!
//! The emulator ignores `Authorization`, so the bearer is checked where requests are recorded:
//! through a cutting proxy in front of the emulator, and on testkit's fault server.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;

use base64::Engine as _;
use testkit::faults::{FaultConfig, FaultServer, Step};
use testkit::gcs::{self, BUCKET, CLIENT_EMAIL, Emulator, Grant, TokenEndpoint};
use testkit::proxy::CutProxy;

mod common;
use common::*;

fn peer_missing() -> bool {
    if gcs::installed() {
        return false;
    }
    eprintln!(
        "skipping: `gcp-storage-emulator` is missing (scripts/setup.sh pip-installs gcp-storage-emulator)"
    );
    true
}

/// `quarry import SOURCE TARGET --json ARGS`, `gs://` sources sent to `emulator` (or to Google
/// when None).
fn import(source: &str, target: &Path, emulator: Option<&str>, extra: &[&str]) -> Output {
    let mut cmd = quarry();
    cmd.args(["import", source, arg(target), "--json", "--retries", "2"])
        .args(extra)
        .env_remove("STORAGE_EMULATOR_HOST");
    if let Some(host) = emulator {
        cmd.env("STORAGE_EMULATOR_HOST", host);
    }
    cmd.output().unwrap()
}

#[test]
fn gs_and_cdi_urls_import_qcow2_and_qcow2_xz_and_refuse_missing_objects() {
    if peer_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (qcow2, expected) = sample_qcow2(dir.path());
    let xz = dir.path().join("disk.qcow2.xz");
    compress(&["xz", "-c"], &qcow2, &xz);
    let store = Emulator::start();
    store.put(&qcow2, "images/disk.qcow2");
    store.put(&xz, "images/disk.qcow2.xz");
    let out_dir = tempfile::tempdir().unwrap();
    let host = store.host_port();

    // gs:// through STORAGE_EMULATOR_HOST, in both of its forms.
    for (name, emulator) in [("gs.img", host.clone()), ("gs-url.img", store.endpoint())] {
        let target = out_dir.path().join(name);
        let sha = testkit::oci::sha256_digest(&fs::read(&qcow2).unwrap());
        let source = format!("gs://{BUCKET}/images/disk.qcow2");
        let out = import(&source, &target, Some(&emulator), &["--checksum", &sha]);
        assert_ok(&out);
        assert_eq!(fs::read(&target).unwrap(), expected);
        assert_eq!(json(&out)["format_chain"], serde_json::json!(["qcow2"]));
    }
    for (name, source) in [
        ("gs-xz.img", format!("gs://{BUCKET}/images/disk.qcow2.xz")),
        (
            "cdi-xz.img",
            format!("{}/{BUCKET}/images/disk.qcow2.xz", store.endpoint()),
        ),
    ] {
        let target = out_dir.path().join(name);
        let out = import(&source, &target, Some(&host), &["--gcs"]);
        assert_ok(&out);
        assert_eq!(fs::read(&target).unwrap(), expected, "{source}");
        assert_eq!(
            json(&out)["format_chain"],
            serde_json::json!(["xz", "qcow2"])
        );
    }

    // A missing object, and a missing bucket: terminal, named, nothing left.
    for object in [
        format!("{BUCKET}/images/missing.qcow2"),
        "no-such-bucket/disk.qcow2".to_string(),
    ] {
        let target = out_dir.path().join("missing.img");
        let out = import(&format!("gs://{object}"), &target, Some(&host), &[]);
        assert_refused(&out, 15, &format!("gs://{object}"), &target);
        assert!(String::from_utf8_lossy(&out.stderr).contains("404"));
        assert_eq!(json(&out)["retryable"], false);
    }
}

/// The emulator serves ranges but no ETag or Last-Modified, so nothing ties a range to the
/// bytes already passed on: the retry reads the object again from its start and goes on only
/// if the first bytes are the same (see docs/import.md, "Resuming a dropped download"). Every
/// request carries the service account's bearer.
#[test]
fn a_cut_gcs_download_resumes_with_the_bearer_on_every_request() {
    if peer_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (raw, data) = sample_disk(dir.path());
    let store = Emulator::start();
    store.put(&raw, "disk.raw");
    let tokens = TokenEndpoint::start(Grant::Verify { expires_in: 3600 });
    let key = tokens.write_key_file(dir.path());
    let proxy = CutProxy::start(SocketAddr::from(([127, 0, 0, 1], store.port())), 3 << 20);
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let out = import(
        &format!("gs://{BUCKET}/disk.raw"),
        &target,
        Some(&format!("127.0.0.1:{}", proxy.port())),
        &["--gcs-credentials", arg(&key)],
    );
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);
    assert_eq!(proxy.cuts(), 1);
    let sent = proxy.sent();
    assert_eq!(
        sent.matches(&format!("get /{BUCKET}/disk.raw ")).count(),
        2,
        "{sent}"
    );
    assert_eq!(
        sent.matches("authorization: bearer token-1").count(),
        2,
        "{sent}"
    );
    assert_eq!(tokens.requests().len(), 1);
}

/// The object server (testkit's fault server, which records headers and honours ranges with
/// an ETag) cuts the first body and refuses the resumed range with 401, as GCS does an expired
/// token: the importer asks the token endpoint again and resumes with the new token.
#[test]
fn a_service_account_s_token_authorises_every_request_and_is_renewed_after_a_401() {
    let dir = tempfile::tempdir().unwrap();
    let (qcow2, expected) = sample_qcow2(dir.path());
    let tokens = TokenEndpoint::start(Grant::Verify { expires_in: 3600 });
    let key = tokens.write_key_file(dir.path());
    let server = FaultServer::start(FaultConfig::new(fs::read(&qcow2).unwrap()).script([
        Step::reset_after(1 << 20),
        Step::status(401),
        Step::ok(),
    ]));
    let target = dir.path().join("disk.img");
    let before = testkit_now();
    let out = import(
        &server.url("/bkt/vm/disk.qcow2"),
        &target,
        None,
        &["--gcs-credentials", arg(&key)],
    );
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);

    let requests = server.requests();
    let seen: Vec<_> = requests
        .iter()
        .map(|r| {
            (
                r.target.as_str(),
                r.header("authorization"),
                r.header("range"),
            )
        })
        .collect();
    let range = requests[1].header("range");
    assert!(
        range.is_some_and(|r| r.starts_with("bytes=") && r != "bytes=0-"),
        "{seen:?}"
    );
    assert_eq!(
        seen,
        [
            ("/bkt/vm/disk.qcow2", Some("Bearer token-1"), None),
            ("/bkt/vm/disk.qcow2", Some("Bearer token-1"), range),
            ("/bkt/vm/disk.qcow2", Some("Bearer token-2"), range),
        ]
    );

    // Two assertions, each verified by the endpoint, each exactly what Google is sent.
    let asked = tokens.requests();
    assert_eq!(asked.len(), 2);
    for (n, request) in asked.iter().enumerate() {
        assert_eq!(request.outcome, Ok(format!("token-{}", n + 1)));
        let parts: Vec<&str> = request.assertion.split('.').collect();
        let decode = |p: &str| -> serde_json::Value {
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p)
                .unwrap();
            serde_json::from_slice(&bytes).unwrap()
        };
        assert_eq!(
            decode(parts[0]),
            serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": gcs::PRIVATE_KEY_ID})
        );
        let claims = decode(parts[1]);
        let iat = claims["iat"].as_i64().unwrap();
        assert!((before..=testkit_now()).contains(&iat), "{claims}");
        assert_eq!(
            claims,
            serde_json::json!({"iss": CLIENT_EMAIL, "scope": gcs::READ_ONLY_SCOPE,
                "aud": tokens.uri(), "iat": iat, "exp": iat + 3600})
        );
    }
}

fn testkit_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A key file that is not one, or whose key is no RSA key, is invalid input (exit 10); a token
/// endpoint that refuses is a refusal (exit 15) with its reason. No object is asked for, and
/// nothing is left that looks complete.
#[test]
fn bad_key_files_and_a_refusing_token_endpoint_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (qcow2, _) = sample_qcow2(dir.path());
    let server = FaultServer::start(FaultConfig::new(fs::read(&qcow2).unwrap()));
    let source = server.url("/bkt/disk.qcow2");
    let tokens = TokenEndpoint::start(Grant::Verify { expires_in: 3600 });
    let good: serde_json::Value = serde_json::from_str(&tokens.key_json()).unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let key = dir.path().join("bad.json");
    for (edit, needle) in [
        (
            serde_json::json!({"private_key": "-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n"}),
            "holds no RSA private key",
        ),
        (
            serde_json::json!({"client_email": null}),
            "client_email is missing",
        ),
    ] {
        let mut k = good.clone();
        for (field, value) in edit.as_object().unwrap() {
            k[field] = value.clone();
        }
        fs::write(&key, k.to_string()).unwrap();
        let out = import(&source, &target, None, &["--gcs-credentials", arg(&key)]);
        assert_refused(&out, 10, needle, &target);
        assert!(String::from_utf8_lossy(&out.stderr).contains(arg(&key)));
    }
    fs::write(&key, "accessKeyId=AK\nsecretKey=SK\n").unwrap();
    let out = import(&source, &target, None, &["--gcs-credentials", arg(&key)]);
    assert_refused(&out, 10, "not a service-account key file", &target);

    let refusing = TokenEndpoint::start(Grant::Refuse {
        status: 400,
        body: r#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#.into(),
    });
    let key = refusing.write_key_file(dir.path());
    let out = import(&source, &target, None, &["--gcs-credentials", arg(&key)]);
    assert_refused(&out, 15, "Invalid JWT Signature.", &target);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("400") && err.contains(&refusing.uri()),
        "{err}"
    );
    assert_eq!(json(&out)["retryable"], false);
    assert_eq!(refusing.requests().len(), 1);
    assert_eq!(
        server.request_count(),
        0,
        "an object was asked for without a token"
    );
}
