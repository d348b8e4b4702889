//! End-to-end tests of `quarry import` over HTTP(S): against a real nginx (ranges, TLS, basic auth,
//! redirects) and the suite's fault server (resets, lies, 503 storms), checking the bytes written
//! and the exit codes.

use std::fs;
use std::path::Path;

use testkit::faults::{FaultConfig, FaultServer, Step};
use testkit::nginx::{Nginx, NginxConfig};
use testkit::tinyproxy::Tinyproxy;
use testkit::tls::TestCa;

mod common;
use common::*;

/// A directory served by nginx holding `disk.raw` and `disk.raw.xz`.
fn served_dir() -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    compress(
        &["xz", "-c", "-T2", "--block-size=1MiB"],
        &src,
        &dir.path().join("disk.raw.xz"),
    );
    (dir, data)
}

fn nginx(root: &Path) -> NginxConfig<'static> {
    NginxConfig {
        root: root.to_path_buf(),
        ranges: true,
        ..Default::default()
    }
}

#[test]
fn compressed_image_over_http_is_imported() {
    let (dir, data) = served_dir();
    let server = Nginx::start(nginx(dir.path()));
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let out = run(&[
        "import",
        &server.url("/disk.raw.xz"),
        arg(&target),
        "--json",
        "--header",
        "X-Quarry-Test: 1",
    ]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);
    let report = json(&out);
    assert_eq!(report["format_chain"], serde_json::json!(["xz", "raw"]));
    assert_eq!(
        report["source_bytes"],
        fs::metadata(dir.path().join("disk.raw.xz")).unwrap().len()
    );
}

#[test]
fn https_needs_the_ca_unless_insecure() {
    let (dir, data) = served_dir();
    let ca = TestCa::new();
    let server = Nginx::start(NginxConfig {
        tls: Some(&ca),
        ..nginx(dir.path())
    });
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let url = server.url("/disk.raw");

    let out = run(&["import", &url, arg(&target)]);
    assert_eq!(out.status.code(), Some(15), "{out:?}");
    assert!(!target.exists());

    let out = run(&["import", &url, arg(&target), "--ca-cert", arg(&ca.ca_pem())]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);

    fs::remove_file(&target).unwrap();
    assert_ok(&run(&["import", &url, arg(&target), "--insecure"]));
    assert_eq!(fs::read(&target).unwrap(), data);
}

#[test]
fn https_goes_through_the_proxy_from_the_environment_with_connect() {
    let (dir, data) = served_dir();
    let ca = TestCa::new();
    let server = Nginx::start(NginxConfig {
        tls: Some(&ca),
        ..nginx(dir.path())
    });
    let proxy = Tinyproxy::start();
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let out = quarry()
        .args(["import", &server.url("/disk.raw.xz"), arg(&target)])
        .args(["--ca-cert", arg(&ca.ca_pem())])
        .env("HTTPS_PROXY", proxy.url())
        .env_remove("https_proxy")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);
    let tunnel = format!("CONNECT 127.0.0.1:{} HTTP/1.1", server.port());
    let requests = proxy.requests();
    assert!(requests.contains(&tunnel), "{requests:?}");
}

#[test]
fn basic_auth_password_comes_from_a_file_or_the_environment() {
    let (dir, data) = served_dir();
    let server = Nginx::start(NginxConfig {
        basic_auth: Some(("importer".into(), "s3cret".into())),
        ..nginx(dir.path())
    });
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let url = server.url("/disk.raw.xz");
    let password = out_dir.path().join("password");

    fs::write(&password, "s3cret\n").unwrap();
    let out = run(&[
        "import",
        &url,
        arg(&target),
        "--user",
        "importer",
        "--password-file",
        arg(&password),
    ]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);

    fs::remove_file(&target).unwrap();
    let out = quarry()
        .args(["import", &url, arg(&target), "--user", "importer"])
        .args(["--password-env", "QUARRY_TEST_PW"])
        .env("QUARRY_TEST_PW", "s3cret")
        .output()
        .unwrap();
    assert_ok(&out);

    fs::remove_file(&target).unwrap();
    fs::write(&password, "wrong").unwrap();
    let out = run(&[
        "import",
        &url,
        arg(&target),
        "--user",
        "importer",
        "--password-file",
        arg(&password),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(15), "{out:?}");
    assert_eq!(json(&out)["kind"], "source-rejected");
    assert!(!target.exists());
}

#[test]
fn missing_image_is_refused_at_once() {
    let (dir, _) = served_dir();
    let server = Nginx::start(nginx(dir.path()));
    let out_dir = tempfile::tempdir().unwrap();
    let out = run(&[
        "import",
        &server.url("/nope.img"),
        arg(&out_dir.path().join("disk.img")),
    ]);
    assert_eq!(out.status.code(), Some(15), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("404"));
}

#[test]
fn redirect_is_followed() {
    let (dir, data) = served_dir();
    let server = Nginx::start(NginxConfig {
        redirects: vec![("/latest.img".into(), "/disk.raw.xz".into())],
        ..nginx(dir.path())
    });
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    assert_ok(&run(&["import", &server.url("/latest.img"), arg(&target)]));
    assert_eq!(fs::read(&target).unwrap(), data);
}

fn xz_body() -> (Vec<u8>, Vec<u8>) {
    let (dir, data) = served_dir();
    (fs::read(dir.path().join("disk.raw.xz")).unwrap(), data)
}

#[test]
fn connection_reset_mid_body_resumes_and_the_checksum_still_holds() {
    let (body, data) = xz_body();
    let sha = {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b");
        fs::write(&p, &body).unwrap();
        let out = std::process::Command::new("sha256sum")
            .arg(&p)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_string()
    };
    let half = body.len() as u64 / 2;
    let server = FaultServer::start(
        FaultConfig::new(body).script([Step::reset_after(half), Step::reset_after(4096)]),
    );
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let out = run(&[
        "import",
        &server.url("/disk.raw.xz"),
        arg(&target),
        "--checksum",
        &format!("sha256:{sha}"),
    ]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert_eq!(
        requests[1].header("range"),
        Some(format!("bytes={half}-").as_str())
    );
}

#[test]
fn a_server_that_keeps_failing_is_a_retryable_error() {
    let (body, _) = xz_body();
    let server = FaultServer::start(FaultConfig::new(body).otherwise(Step::unavailable(None)));
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let out = run(&[
        "import",
        &server.url("/disk.raw.xz"),
        arg(&target),
        "--retries",
        "2",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(20), "{out:?}");
    assert_eq!(json(&out)["retryable"], true);
    assert!(!target.exists());
    no_partial_left(out_dir.path());
}

#[test]
fn a_body_shorter_than_its_content_length_never_succeeds() {
    let (body, _) = xz_body();
    let server = FaultServer::start(
        FaultConfig::new(body)
            .ranges(false)
            .otherwise(Step::short_by(1000)),
    );
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("disk.img");
    let out = run(&[
        "import",
        &server.url("/disk.raw.xz"),
        arg(&target),
        "--retries",
        "1",
    ]);
    assert!(!out.status.success(), "{out:?}");
    assert!(!target.exists());
    no_partial_left(out_dir.path());
}

/// Load, bounded: this many imports from one nginx at once.
const CONCURRENT_IMPORTS: usize = 8;

/// Many downloads at once (raw, xz and zlib-compressed qcow2, so some decoders fall behind the
/// network and frames pile up into batches, and several inflate pools run side by side): every
/// target holds exactly the disk, and nothing else is left beside it.
#[test]
fn concurrent_imports_each_write_the_disk_and_leave_nothing_else() {
    let (dir, data) = served_dir();
    // The sample disk is random, which qemu-img stores uncompressed: text compresses.
    let text: Vec<u8> = (0u32..)
        .flat_map(|i| format!("line {i} of a compressible disk\n").into_bytes())
        .take(8 << 20)
        .collect();
    let text_raw = dir.path().join("text.raw");
    fs::write(&text_raw, &text).unwrap();
    testkit::qemu::qemu_img(&[
        "convert".as_ref(),
        "-f".as_ref(),
        "raw".as_ref(),
        "-O".as_ref(),
        "qcow2".as_ref(),
        "-c".as_ref(),
        text_raw.as_os_str(),
        dir.path().join("text-zlib.qcow2").as_os_str(),
    ]);
    let server = Nginx::start(nginx(dir.path()));
    let out_dir = tempfile::tempdir().unwrap();
    let runs: Vec<_> = (0..CONCURRENT_IMPORTS)
        .map(|i| {
            let target_dir = out_dir.path().join(format!("volume-{i}"));
            fs::create_dir_all(&target_dir).unwrap();
            let (name, expected) = [
                ("/disk.raw", &data),
                ("/disk.raw.xz", &data),
                ("/text-zlib.qcow2", &text),
            ][i % 3];
            let mut cmd = quarry();
            cmd.args(["import", &server.url(name)])
                .arg(target_dir.join("disk.img"))
                .arg("--json");
            let run = std::thread::spawn(move || {
                output_within(&mut cmd, std::time::Duration::from_secs(120))
            });
            (target_dir, expected, run)
        })
        .collect();
    for (target_dir, expected, run) in runs {
        let out = run.join().unwrap();
        assert_ok(&out);
        let left: Vec<_> = fs::read_dir(&target_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["disk.img"], "{}", target_dir.display());
        assert!(
            fs::read(target_dir.join("disk.img")).unwrap() == *expected,
            "{} differs from the served disk",
            target_dir.display()
        );
    }
}
