//! The uploader end to end: `quarry upload-server` behind `quarry upload-proxy`, driven by curl
//! with virtctl's exact requests (and by `quarry upload`), every result compared byte for byte
//! with `qemu-img convert -O raw`; every refusal; resume after a cut connection.

mod common;

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{arg, compress, no_partial_left, quarry, sample_disk, sample_qcow2};
use testkit::proxy::CutProxy;
use testkit::qemu::{convert_to_raw, first_difference, qemu_img};
use testkit::tls::TestCa;

/// A `quarry` process, killed on drop.
struct Proc {
    child: Child,
    port: u16,
    name: &'static str,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn start(name: &'static str, args: &[&str], port: u16, log: &Path) -> Proc {
        let child = quarry()
            .args(args)
            .stdout(Stdio::null())
            .stderr(fs::File::create(log).unwrap())
            .spawn()
            .expect("starting quarry");
        let mut p = Proc { child, port, name };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!(
                    "{name} exited early ({status}): {}",
                    fs::read_to_string(log).unwrap()
                );
            }
            assert!(Instant::now() < deadline, "{name} did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    /// Waits for the process to exit (an upload server stops after a success); returns its code.
    fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "{} did not exit", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn token(key: &Path, ns: &str, pvc: &str) -> String {
    let out = quarry()
        .args([
            "upload-token",
            "--namespace",
            ns,
            "--pvc",
            pvc,
            "--key",
            arg(key),
        ])
        .output()
        .unwrap();
    common::assert_ok(&out);
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// An upload server for `target` with extra arguments.
fn server(dir: &Path, target: &Path, extra: &[&str]) -> Proc {
    server_on(free_port(), dir, target, extra)
}

/// [`server`] listening on `port`.
fn server_on(port: u16, dir: &Path, target: &Path, extra: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "upload-server",
        "--target",
        arg(target),
        "--listen",
        &listen,
    ];
    args.extend_from_slice(extra);
    let log = dir.join(format!("server-{port}.log"));
    Proc::start("upload-server", &args, port, &log)
}

/// A proxy routing each `(ns/pvc, server)` pair.
fn proxy(dir: &Path, public: &Path, routes: &[(&str, &Proc)], extra: &[&str]) -> Proc {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let routes: Vec<String> = routes
        .iter()
        .map(|(pvc, s)| format!("{pvc}=http://127.0.0.1:{}", s.port))
        .collect();
    let mut args = vec![
        "upload-proxy",
        "--public-key",
        arg(public),
        "--listen",
        &listen,
    ];
    for r in &routes {
        args.extend(["--upstream", r]);
    }
    args.extend_from_slice(extra);
    let log = dir.join(format!("proxy-{port}.log"));
    Proc::start("upload-proxy", &args, port, &log)
}

/// One volume behind one proxy: openssl signing keys, `vol/disk.img` written by an upload server
/// that the proxy serves as PVC `vms/disk`.
struct Volume {
    private: PathBuf,
    vol: PathBuf,
    target: PathBuf,
    srv: Proc,
    px: Proc,
    dir: tempfile::TempDir,
}

impl Volume {
    fn start(server_args: &[&str], proxy_args: &[&str]) -> Volume {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (private, public) = testkit::tls::rsa_key_pair(d, "signer");
        let vol = d.join("vol");
        fs::create_dir(&vol).unwrap();
        let target = vol.join("disk.img");
        let srv = server(d, &target, server_args);
        let px = proxy(d, &public, &[("vms/disk", &srv)], proxy_args);
        Volume {
            private,
            vol,
            target,
            srv,
            px,
            dir,
        }
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A fresh token for `vms/disk`.
    fn token(&self) -> String {
        token(&self.private, "vms", "disk")
    }

    /// The proxy's base URL.
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.px.port)
    }
}

/// Runs curl; returns the HTTP status and the answer body.
fn curl(args: &[&str]) -> (u16, String) {
    let (code, body, _) = curl_version(args);
    (code, body)
}

/// Runs curl; returns the HTTP status, the answer body and the HTTP version used.
fn curl_version(args: &[&str]) -> (u16, String, String) {
    let body = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            arg(body.path()),
            "-w",
            "%{http_code} %{http_version}",
        ])
        .args(args)
        .output()
        .expect("curl (install it)");
    let written = String::from_utf8_lossy(&out.stdout).to_string();
    let mut words = written.split_whitespace();
    let code = words.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    let version = words.next().unwrap_or("").to_string();
    (
        code,
        fs::read_to_string(body.path()).unwrap_or_default(),
        version,
    )
}

/// virtctl's POST: the file as the body with its exact length, no `Expect`.
fn post(url: &str, token: &str, file: &Path) -> (u16, String) {
    let (code, body, _) = post_with(url, token, file, &[]);
    (code, body)
}

/// [`post`] with more curl arguments; also returns the HTTP version used.
fn post_with(url: &str, token: &str, file: &Path, extra: &[&str]) -> (u16, String, String) {
    let auth = format!("Authorization: Bearer {token}");
    let mut args = vec![
        "-X",
        "POST",
        "-T",
        arg(file),
        "-H",
        "Expect:",
        "-H",
        "Content-Type: application/octet-stream",
        "-H",
        &auth,
    ];
    args.extend_from_slice(extra);
    args.push(url);
    curl_version(&args)
}

/// A multipart form upload, the part named `file`.
fn post_form(url: &str, token: &str, file: &Path) -> (u16, String) {
    let auth = format!("Authorization: Bearer {token}");
    let part = format!("file=@{}", arg(file));
    curl(&["-X", "POST", "-H", "Expect:", "-H", &auth, "-F", &part, url])
}

fn head(url: &str, token: &str) -> u16 {
    let auth = format!("Authorization: Bearer {token}");
    curl(&["-I", "-H", &auth, url]).0
}

fn assert_same(target: &Path, expected: &[u8]) {
    let got = fs::read(target).unwrap_or_else(|e| panic!("{}: {e}", target.display()));
    assert!(
        got == expected,
        "{} differs from qemu-img's conversion (lengths {} and {}, first difference at {:?})",
        target.display(),
        got.len(),
        expected.len(),
        first_difference(&got, expected)
    );
    no_partial_left(target.parent().unwrap());
}

/// The images of the format test, each with qemu-img's raw conversion.
fn images(dir: &Path) -> Vec<(&'static str, PathBuf, Vec<u8>)> {
    let (raw, raw_bytes) = sample_disk(dir);
    let (qcow2, qcow2_ref) = sample_qcow2(dir);
    let xz = dir.join("disk.qcow2.xz");
    compress(&["xz", "-T1", "-c"], &qcow2, &xz);
    let gz = dir.join("disk.raw.gz");
    compress(&["gzip", "-c"], &raw, &gz);
    let reference = dir.join("raw-reference.raw");
    convert_to_raw(&raw, &reference);
    assert_eq!(fs::read(&reference).unwrap(), raw_bytes);
    vec![
        ("raw", raw, raw_bytes.clone()),
        ("qcow2", qcow2, qcow2_ref.clone()),
        ("qcow2.xz", xz, qcow2_ref),
        ("raw.gz", gz, raw_bytes),
    ]
}

#[test]
fn virtctl_requests_through_the_proxy_write_what_qemu_img_writes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (private, public) = testkit::tls::rsa_key_pair(d, "signer");
    for (i, (what, image, expected)) in images(d).into_iter().enumerate() {
        let pvc = format!("disk-{i}");
        let vol = d.join(&pvc);
        fs::create_dir(&vol).unwrap();
        let target = vol.join("disk.img");
        let mut srv = server(d, &target, &[]);
        let px = proxy(d, &public, &[(&format!("vms/{pvc}"), &srv)], &[]);
        let base = format!("http://127.0.0.1:{}", px.port);
        let t = token(&private, "vms", &pvc);
        // virtctl's probe, then each test image through a different endpoint.
        assert_eq!(
            head(&format!("{base}/v1beta1/upload-async"), &t),
            200,
            "{what}"
        );
        let (path, form) = match what {
            "raw" => ("/v1beta1/upload-async", false),
            "qcow2" => ("/v1beta1/upload", false),
            "qcow2.xz" => ("/v1beta1/upload-form", true),
            _ => ("/v1alpha1/upload-form-async", true),
        };
        let url = format!("{base}{path}");
        let (code, body) = if form {
            post_form(&url, &t, image.as_path())
        } else {
            post(&url, &t, &image)
        };
        assert_eq!(code, 200, "{what} via {path}: {body}");
        // The server stops once the upload is complete (as CDI's upload pod does).
        assert_eq!(srv.wait_exit(), 0, "{what}");
        assert_same(&target, &expected);
    }
}

#[test]
fn tls_h2_and_mutual_tls_between_proxy_and_server() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = TestCa::new();
    let (client_cert, client_key) = ca.client_cert("cdi-uploadproxy");
    let (private, public) = testkit::tls::rsa_key_pair(d, "signer");
    let (qcow2, expected) = sample_qcow2(d);
    let target = d.join("disk.img");
    let mut srv = server(
        d,
        &target,
        &[
            "--tls-cert",
            arg(&ca.cert_pem()),
            "--tls-key",
            arg(&ca.key_pem()),
            "--client-ca",
            arg(&ca.ca_pem()),
        ],
    );
    // Without the proxy's client certificate, the server does not talk.
    let direct = format!("https://127.0.0.1:{}/v1beta1/upload", srv.port);
    let (code, _) = post(&direct, "x", &qcow2);
    assert_eq!(
        code, 0,
        "the server answered a client without a certificate"
    );
    let (code, _) = curl(&[
        "--cacert",
        arg(&ca.ca_pem()),
        &direct.replace("upload", "../healthz"),
    ]);
    assert_eq!(code, 0);

    let px_port = free_port();
    let listen = format!("127.0.0.1:{px_port}");
    let route = format!("vms/disk=https://localhost:{}", srv.port);
    let _px = Proc::start(
        "upload-proxy",
        &[
            "upload-proxy",
            "--public-key",
            arg(&public),
            "--listen",
            &listen,
            "--upstream",
            &route,
            "--tls-cert",
            arg(&ca.cert_pem()),
            "--tls-key",
            arg(&ca.key_pem()),
            "--upstream-ca",
            arg(&ca.ca_pem()),
            "--client-cert",
            arg(&client_cert),
            "--client-key",
            arg(&client_key),
        ],
        px_port,
        &d.join("proxy.log"),
    );
    let t = token(&private, "vms", "disk");
    let url = format!("https://127.0.0.1:{px_port}/v1beta1/upload");
    let (code, body, version) = post_with(
        &url,
        &t,
        &qcow2,
        &["--http2", "--cacert", arg(&ca.ca_pem())],
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(version, "2", "curl did not speak h2 to the proxy");
    assert_eq!(srv.wait_exit(), 0);
    assert_same(&target, &expected);
}

#[test]
fn quarry_upload_over_tls_checks_the_proxy_certificate() {
    let ca = TestCa::new();
    let (cert, key) = (ca.cert_pem(), ca.key_pem());
    let mut v = Volume::start(&[], &["--tls-cert", arg(&cert), "--tls-key", arg(&key)]);
    let d = v.dir().to_path_buf();
    let (qcow2, expected) = sample_qcow2(&d);
    let url = v.url().replace("http:", "https:");
    let token_file = d.join("token");
    fs::write(&token_file, v.token()).unwrap();
    let base = [
        "upload",
        arg(&qcow2),
        "--url",
        &url,
        "--token-file",
        arg(&token_file),
        "--json",
    ];
    // An unknown CA is refused before anything is sent.
    let out = quarry()
        .args(base)
        .args(["--retries", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!v.target.exists());
    let out = quarry()
        .args(base)
        .args(["--ca-cert", arg(&ca.ca_pem())])
        .output()
        .unwrap();
    common::assert_ok(&out);
    let report = common::json(&out);
    assert_eq!(report["asynchronous"], true);
    assert_eq!(report["attempts"], 1);
    assert_eq!(v.srv.wait_exit(), 0);
    assert_same(&v.target, &expected);
}

#[test]
fn refusals_have_cdis_status_codes_and_leave_no_complete_looking_target() {
    // `vms/gone` is routed to a port nothing listens on.
    let gone = format!("vms/gone=http://127.0.0.1:{}", free_port());
    let v = Volume::start(
        &["--size", "64Mi", "--keep-serving"],
        &["--upstream", &gone, "--upstream-wait", "1s"],
    );
    let (d, vol, target, private) = (v.dir(), &v.vol, &v.target, &v.private);
    let (other_key, _) = testkit::tls::rsa_key_pair(d, "intruder");
    let (raw, raw_bytes) = sample_disk(d);
    let url = format!("{}/v1beta1/upload", v.url());
    let good = v.token();
    let nothing = || {
        assert!(!target.exists(), "a refusal left {}", target.display());
        no_partial_left(vol);
    };

    // Tokens: missing or malformed 400, wrong signature or expired 401, another PVC 503, a PVC
    // whose server is not up 503. The body is large, so a proxy that answered without reading it
    // would reset the connection and curl could lose the answer.
    let long = d.join("long.raw");
    let f = fs::File::create(&long).unwrap();
    f.set_len(70 << 20).unwrap();
    drop(f);
    let (code, _) = curl(&["-X", "POST", "-T", arg(&long), "-H", "Expect:", &url]);
    assert_eq!(code, 400, "no token");
    assert_eq!(post(&url, "not-a.jwt", &long).0, 400, "malformed token");
    let (code, _) = curl(&[
        "-X",
        "POST",
        "-H",
        "Authorization: Basic abc",
        "-d",
        "x",
        &url,
    ]);
    assert_eq!(code, 400, "not a bearer token");
    let forged = token(&other_key, "vms", "disk");
    let (code, body) = post(&url, &forged, &long);
    assert_eq!((code, body.contains("signature")), (401, true), "{body}");
    let key = token::load_private_key(private).unwrap();
    let now = token::now();
    let expired = token::Claims::upload("vms", "disk", now - 900, Duration::from_secs(300));
    let expired = token::sign(&expired, &key).unwrap();
    let (code, body) = post(&url, &expired, &long);
    assert_eq!((code, body.contains("expired")), (401, true), "{body}");
    let (code, body) = post(&url, &token(private, "vms", "someone-else"), &long);
    assert_eq!(code, 503, "{body}");
    assert_eq!(
        post(&url, &token(private, "other-ns", "disk"), &long).0,
        503
    );
    let asked = Instant::now();
    let (code, body) = post(&url, &token(private, "vms", "gone"), &long);
    assert_eq!(
        (code, body.contains("not reachable")),
        (503, true),
        "{body}"
    );
    // refused connections were tried again for the proxy's --upstream-wait (1s here)
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    nothing();

    // An image whose virtual size cannot fit the volume: 400, nothing written.
    let big = d.join("big.qcow2");
    qemu_img(&["create", "-f", "qcow2", arg(&big), "128M"]);
    let (code, body) = post(&url, &good, &big);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("does not fit"), "{body}");
    nothing();
    // A raw image in a form (no length known up front) is stopped when it passes the limit.
    let form_url = url.replace("upload", "upload-form");
    let (code, body) = post_form(&form_url, &good, &long);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("does not fit"), "{body}");
    nothing();

    // Corrupt mid-stream: gzip whose deflate data is damaged halfway through: 500.
    let gz = d.join("disk.raw.gz");
    compress(&["gzip", "-c"], &raw, &gz);
    let mut bytes = fs::read(&gz).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 4096] {
        *b ^= 0x5a;
    }
    let bad = d.join("corrupt.raw.gz");
    fs::write(&bad, bytes).unwrap();
    let (code, body) = post(&url, &good, &bad);
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("corrupt"), "{body}");
    nothing();

    // A second upload while one is running: 503. The slow one is then abandoned.
    let auth = format!("Authorization: Bearer {good}");
    let mut slow = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "--limit-rate",
            "512K",
            "-X",
            "POST",
            "-T",
            arg(&raw),
        ])
        .args(["-H", "Expect:", "-H", &auth, &url])
        .spawn()
        .unwrap();
    // It is running once its partial file exists.
    let partial = vol.join(".disk.img.quarry-partial");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !partial.exists() {
        assert!(Instant::now() < deadline, "the slow upload did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let busy = post(&url, &good, &raw);
    assert_eq!(busy.0, 503, "{}", busy.1);
    assert!(busy.1.contains("in progress"), "{}", busy.1);
    let _ = slow.kill();
    let _ = slow.wait();
    assert!(!target.exists());

    // virtctl's retry from byte 0 replaces the interrupted upload and succeeds.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, body) = post(&url, &good, &raw);
        if code == 200 {
            break;
        }
        assert!(code == 503 && Instant::now() < deadline, "{code}: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut expected = raw_bytes;
    // The volume is the requested size's usable space (64Mi less 6%, whole MiB), as `import --size`.
    expected.resize(importer::size::usable_space(64 << 20, 0.06) as usize, 0);
    assert_same(target, &expected);

    // Anything after a success: 409.
    let (code, body) = post(&url, &good, &raw);
    assert_eq!(code, 409, "{body}");
    assert_eq!(head(&url.replace("upload", "upload-async"), &good), 200);
    assert_same(target, &expected);
}

#[test]
fn cors_preflight_is_answered() {
    let v = Volume::start(&[], &[]);
    let out = Command::new("curl")
        .args([
            "-sS",
            "-i",
            "-X",
            "OPTIONS",
            "-H",
            "Origin: https://ui.example",
        ])
        .args(["-H", "Access-Control-Request-Method: POST"])
        .args([
            "-H",
            "Access-Control-Request-Headers: authorization, content-type",
        ])
        .arg(format!("{}/v1beta1/upload-form-async", v.url()))
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(answer.starts_with("http/1.1 204"), "{answer}");
    assert!(
        answer.contains("access-control-allow-origin: *"),
        "{answer}"
    );
    assert!(
        answer.contains("access-control-allow-headers: authorization"),
        "{answer}"
    );
    assert!(
        answer.contains("access-control-allow-methods: post"),
        "{answer}"
    );
}

#[test]
fn a_cut_upload_resumes_from_the_servers_offset() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Keys from `quarry upload-token keygen`.
    let (private, public) = (d.join("signer.key"), d.join("signer.pub"));
    let out = quarry()
        .args([
            "upload-token",
            "keygen",
            "--private",
            arg(&private),
            "--public",
            arg(&public),
        ])
        .output()
        .unwrap();
    common::assert_ok(&out);
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        fs::metadata(&private).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let (qcow2, expected) = sample_qcow2(d);
    let len = fs::metadata(&qcow2).unwrap().len();
    let token_file = d.join("token");
    fs::write(&token_file, token(&private, "vms", "disk")).unwrap();

    // The cut between the client and the proxy, then between the proxy and the server; last,
    // with --no-resume (virtctl's behaviour: the whole image again).
    for (client_side, resume) in [(true, true), (false, true), (true, false)] {
        let vol = d.join(format!("vol-{client_side}-{resume}"));
        fs::create_dir(&vol).unwrap();
        let target = vol.join("disk.img");
        let mut srv = server(d, &target, &[]);
        let (cut, px) = if client_side {
            let px = proxy(d, &public, &[("vms/disk", &srv)], &[]);
            let cut = CutProxy::start_upload(SocketAddr::from(([127, 0, 0, 1], px.port)), 3 << 20);
            (cut, px)
        } else {
            let cut = CutProxy::start_upload(SocketAddr::from(([127, 0, 0, 1], srv.port)), 3 << 20);
            let route = format!("vms/disk=http://127.0.0.1:{}", cut.port());
            let px = proxy(d, &public, &[], &["--upstream", &route]);
            (cut, px)
        };
        let url = if client_side {
            format!("http://127.0.0.1:{}", cut.port())
        } else {
            format!("http://127.0.0.1:{}", px.port)
        };
        let out = quarry()
            .args([
                "upload",
                arg(&qcow2),
                "--url",
                &url,
                "--token-file",
                arg(&token_file),
                "--json",
            ])
            .args(if resume {
                &[][..]
            } else {
                &["--no-resume"][..]
            })
            .output()
            .unwrap();
        common::assert_ok(&out);
        let report = common::json(&out);
        assert_eq!(cut.cuts(), 1, "the connection was not cut");
        if !resume {
            assert_eq!(report["resumed_from"], serde_json::json!([]), "{report}");
            assert!(report["bytes_sent"].as_u64().unwrap() > len, "{report}");
            assert_eq!(srv.wait_exit(), 0);
            assert_same(&target, &expected);
            continue;
        }
        let attempts = report["attempts"].as_u64().unwrap();
        let sent = report["bytes_sent"].as_u64().unwrap();
        let resumed: Vec<u64> = serde_json::from_value(report["resumed_from"].clone()).unwrap();
        assert!(attempts >= 2, "{report}");
        assert!(
            !resumed.is_empty() && resumed[0] > 0,
            "did not resume: {report}"
        );
        // Resent: what went out beyond the file's length; less than the whole image.
        assert!(sent - len < len, "{report}");
        assert!(
            (cut.client_bytes() as u64) < 2 * len,
            "{} bytes went through",
            cut.client_bytes()
        );
        assert!(
            cut.sent().contains("upload-offset: "),
            "no resume request went out"
        );
        assert_eq!(srv.wait_exit(), 0);
        assert_same(&target, &expected);
    }
}

#[test]
fn a_checksum_header_is_verified_over_the_bytes_sent() {
    let mut v = Volume::start(&[], &[]);
    let (qcow2, expected) = sample_qcow2(v.dir());
    let (url, t) = (v.url(), v.token());
    let upload = |sum: &str| {
        quarry()
            .args([
                "upload",
                arg(&qcow2),
                "--url",
                &url,
                "--token",
                &t,
                "--json",
            ])
            .args(["--checksum", sum])
            .output()
            .unwrap()
    };
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let out = upload(&wrong);
    assert!(!out.status.success());
    let report = common::json(&out);
    assert_eq!(report["kind"], "refused", "{report}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("checksum mismatch"),
        "{report}"
    );
    assert!(!v.target.exists());
    no_partial_left(&v.vol);
    let sha = Command::new("sha256sum").arg(&qcow2).output().unwrap();
    let hex = String::from_utf8_lossy(&sha.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    common::assert_ok(&upload(&format!("sha256:{hex}")));
    assert_eq!(v.srv.wait_exit(), 0);
    assert_same(&v.target, &expected);
}

#[test]
fn virtctl_style_retry_from_zero_after_a_cut_still_works() {
    let mut v = Volume::start(&[], &[]);
    let (qcow2, expected) = sample_qcow2(v.dir());
    let cut = CutProxy::start_upload(SocketAddr::from(([127, 0, 0, 1], v.px.port)), 2 << 20);
    let t = v.token();
    let url = format!("http://127.0.0.1:{}/v1beta1/upload-async", cut.port());
    let (code, _) = post(&url, &t, &qcow2);
    assert_ne!(code, 200, "the cut upload succeeded");
    assert_eq!(cut.cuts(), 1);
    assert!(!v.target.exists(), "an interrupted upload left a v.target");
    // virtctl retries from byte 0 with the same request.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, body) = post(&url, &t, &qcow2);
        if code == 200 {
            break;
        }
        assert!(code == 503 && Instant::now() < deadline, "{code}: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(v.srv.wait_exit(), 0);
    assert_same(&v.target, &expected);
}

#[test]
fn an_interrupted_upload_is_held_for_the_resume_window_then_dropped() {
    let v = Volume::start(&["--resume-window", "2s", "--keep-serving"], &[]);
    let (qcow2, _) = sample_qcow2(v.dir());
    let len = fs::metadata(&qcow2).unwrap().len();
    let (px, target) = (&v.px, &v.target);
    let cut = CutProxy::start_upload(SocketAddr::from(([127, 0, 0, 1], px.port)), 2 << 20);
    let t = v.token();
    let url = format!("http://127.0.0.1:{}/v1beta1/upload-async", cut.port());
    assert_ne!(post(&url, &t, &qcow2).0, 200);
    assert_eq!(cut.cuts(), 1);

    // While held, HEAD (through the proxy, with the token) tells how much the server has.
    let held = |token: &str| {
        let out = Command::new("curl")
            .args(["-sS", "-I", "-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("http://127.0.0.1:{}/v1beta1/upload-async", px.port))
            .output()
            .unwrap();
        let answer = String::from_utf8_lossy(&out.stdout).to_lowercase();
        let offset = answer
            .lines()
            .find_map(|l| l.strip_prefix("upload-offset: "))
            .map(|v| v.trim().parse::<u64>().unwrap());
        let length = answer
            .lines()
            .find_map(|l| l.strip_prefix("upload-length: "))
            .map(|v| v.trim().parse::<u64>().unwrap());
        (
            answer.lines().next().unwrap_or("").to_string(),
            offset,
            length,
            answer
                .lines()
                .find_map(|l| l.strip_prefix("upload-state: "))
                .map(|v| v.trim().to_string()),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let (status, offset, length, state) = loop {
        let h = held(&t);
        if h.1.is_some() || Instant::now() > deadline {
            break h;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.contains("200"), "{status}");
    let offset = offset.expect("no Upload-Offset while the upload is held");
    assert!(offset > 0 && offset <= 2 << 20, "offset {offset}");
    assert_eq!(length, Some(len));
    assert_eq!(state.as_deref(), Some("held"));
    // The offset is behind the same token checks as uploads.
    assert_eq!(head(&url, "not-a.jwt"), 400);
    assert!(!target.exists());

    // Not resumed in time: the upload is dropped, its partial file removed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while held(&t).1.is_some() {
        assert!(
            Instant::now() < deadline,
            "the held upload was never dropped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(held(&t).3.as_deref(), Some("idle"));
    assert!(!target.exists());
    no_partial_left(&v.vol);
    // A resume now is told to start over.
    let direct = format!("http://127.0.0.1:{}/v1beta1/upload-async", px.port);
    let resume = format!("Upload-Offset: {offset}");
    let (code, body, _) = post_with(&direct, &t, &qcow2, &["-H", &resume]);
    assert_eq!(code, 416, "{body}");
}

#[test]
fn a_form_upload_is_written_while_it_arrives() {
    use std::os::unix::fs::MetadataExt as _;
    let mut v = Volume::start(&[], &[]);
    let (raw, expected) = sample_disk(v.dir());
    let auth = format!("Authorization: Bearer {}", v.token());
    let part = format!("file=@{}", arg(&raw));
    // 8 MiB at 2 MiB/s: about four seconds on the wire.
    let mut slow = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--limit-rate",
            "2M",
        ])
        .args(["-H", "Expect:", "-H", &auth, "-F", &part])
        .arg(format!("{}/v1beta1/upload-form", v.url()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Data lands in the v.target's partial file while the form is still arriving: the part is
    // streamed into the pipeline, not buffered first.
    let partial = v.vol.join(".disk.img.quarry-partial");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let written = fs::metadata(&partial)
            .map(|m| m.blocks() * 512)
            .unwrap_or(0);
        if written >= 2 << 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "nothing written while the form arrived"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        slow.try_wait().unwrap().is_none(),
        "the upload had already finished"
    );
    let out = slow.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    assert_eq!(v.srv.wait_exit(), 0);
    assert_same(&v.target, &expected);
}

#[test]
fn upload_server_help_says_it_exits_after_one_upload() {
    let out = quarry().args(["upload-server", "--help"]).output().unwrap();
    common::assert_ok(&out);
    let help = String::from_utf8_lossy(&out.stdout).replace('\n', " ");
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("exits 0 after the first successful upload")
            && help.contains("pass --keep-serving"),
        "{help}"
    );
    for cmd in ["upload-server", "upload-proxy"] {
        let out = quarry().args([cmd, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        for flag in [
            "--header-read-timeout",
            "--keep-alive-timeout",
            "--max-connections",
        ] {
            assert!(help.contains(flag), "{cmd} --help lacks {flag}: {help}");
        }
    }
}

#[test]
fn quarry_upload_tells_why_the_proxy_refused_the_token() {
    let v = Volume::start(&[], &[]);
    let (raw, _) = sample_disk(v.dir());
    let upload = |token: &str| {
        let out = quarry()
            .args(["upload", arg(&raw), "--url", &v.url(), "--token", token])
            .args(["--json", "--retries", "0"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        common::json(&out)
    };
    // The HEAD probe's refusal has no body: the reason comes from the proxy's answer to a POST.
    let report = upload("garbage");
    let error = report["error"].as_str().unwrap();
    assert_eq!(report["kind"], "refused", "{report}");
    assert!(
        error.contains("HTTP 400") && error.contains("not three dot-separated parts"),
        "{error}"
    );
    let key = token::load_private_key(&v.private).unwrap();
    let claims = token::Claims::upload("vms", "disk", token::now() - 900, Duration::from_secs(300));
    let report = upload(&token::sign(&claims, &key).unwrap());
    let error = report["error"].as_str().unwrap();
    assert_eq!(report["kind"], "unauthorized", "{report}");
    assert!(error.contains("expired"), "{error}");
    assert_eq!(error.matches("token rejected").count(), 1, "{error}");
    assert!(!v.target.exists());
    no_partial_left(&v.vol);
}

#[test]
fn a_form_with_two_file_parts_is_refused_and_nothing_is_written() {
    let mut v = Volume::start(&[], &[]);
    let (raw, expected) = sample_disk(v.dir());
    let url = format!("{}/v1beta1/upload-form", v.url());
    let auth = format!("Authorization: Bearer {}", v.token());
    let part = format!("file=@{}", arg(&raw));
    let (code, body) = curl(&[
        "-X", "POST", "-H", "Expect:", "-H", &auth, "-F", &part, "-F", &part, &url,
    ]);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("more than one part named \"file\""), "{body}");
    assert!(!v.target.exists());
    no_partial_left(&v.vol);
    // The server is still there for a proper upload.
    let (code, body) = post_form(&url, &v.token(), &raw);
    assert_eq!(code, 200, "{body}");
    assert_eq!(v.srv.wait_exit(), 0);
    assert_same(&v.target, &expected);
}

/// Sends a request with an `Authorization` header of `size` bytes as a network would (16 KiB
/// every millisecond); returns the answer's status line, or the error that stopped the sending.
fn oversized_authorization(port: u16, size: usize) -> std::io::Result<String> {
    use std::io::{BufRead as _, Write as _};
    let request = format!(
        "POST /v1beta1/upload HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Content-Length: 0\r\n\r\n",
        "a".repeat(size)
    );
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    for chunk in request.as_bytes().chunks(16 << 10) {
        s.write_all(chunk)?;
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut status = String::new();
    std::io::BufReader::new(s).read_line(&mut status)?;
    Ok(status.trim_end().to_string())
}

#[test]
fn an_oversized_authorization_header_is_answered_431() {
    let v = Volume::start(&["--keep-serving"], &[]);
    // 100 KiB gets past hyper's header limit (about 400 KiB) and is refused by the proxy. 1 MiB
    // is refused while the headers are read, by the proxy and by the server: the client is still
    // sending then, and must be able to finish and read the answer (no reset).
    for (port, size) in [
        (v.px.port, 100 << 10),
        (v.px.port, 1 << 20),
        (v.srv.port, 1 << 20),
    ] {
        match oversized_authorization(port, size) {
            Ok(status) => assert!(
                status.starts_with("HTTP/1.1 431 "),
                "{size} bytes: {status}"
            ),
            Err(e) => panic!("{size} bytes to port {port}: {e}"),
        }
    }
    assert!(!v.target.exists());
}

/// Open descriptors and resident memory (KiB) of a process.
fn fds_and_rss(pid: u32) -> (usize, u64) {
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    (fds, rss)
}

/// Raises this process's descriptor limit (inherited by the processes it starts) to the hard
/// limit; returns it.
fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    limit.rlim_cur
}

/// Slow-loris connections to `port`: each sends part of a request line, then nothing. Opens one
/// every half millisecond until `stop` or `max`; returns them, still open.
fn loris(port: u16, max: usize, stop: &std::sync::atomic::AtomicBool) -> Vec<TcpStream> {
    use std::io::Write as _;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut open = Vec::new();
    while open.len() < max && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            let _ =
                s.write_all(b"POST /v1beta1/upload-async HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthori");
            open.push(s);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    open
}

/// `HEAD` on the async path over a new connection, the answer read; the connection is returned
/// open (keep-alive).
fn head_kept_alive(port: u16, token: &str) -> TcpStream {
    use std::io::{Read as _, Write as _};
    // A HEAD left waiting must fail the test, not hang it.
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(30)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "HEAD /v1beta1/upload-async HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "the HEAD got no answer");
        answer.push(byte[0]);
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    s
}

/// Asserts that the other end closed each connection (end of file or reset, within 10 s each).
fn assert_closed_by_peer(conns: Vec<TcpStream>, what: &str) {
    use std::io::Read as _;
    let mut buf = [0u8; 4096];
    for (i, mut s) in conns.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue, // an answer before the close (none expected, but harmless)
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("{what} connection {i} is still open: {e}"),
            }
        }
    }
}

/// The most descriptors and resident memory each process had, sampled until `running` clears.
fn peaks_while(pids: [u32; 2], running: &std::sync::atomic::AtomicBool) -> [(usize, u64); 2] {
    let mut peaks = [(0usize, 0u64); 2];
    while running.load(std::sync::atomic::Ordering::Relaxed) {
        for (peak, pid) in peaks.iter_mut().zip(pids) {
            let (fds, rss) = fds_and_rss(pid);
            *peak = (peak.0.max(fds), peak.1.max(rss));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    peaks
}

/// Waits (up to 15 s) until `pid` holds at most `limit` descriptors; returns the last count.
fn settle_fds(pid: u32, limit: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (fds, _) = fds_and_rss(pid);
        if fds <= limit || Instant::now() > deadline {
            return fds;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_slow_loris_flood_neither_locks_out_an_upload_nor_keeps_descriptors_or_memory() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const CAP: usize = 256;
    let fd_limit = raise_fd_limit();
    // Per target, well over the cap; the test process holds them all.
    let flood = 1000.min((fd_limit as usize).saturating_sub(500) / 3);
    assert!(
        flood > CAP,
        "descriptor limit {fd_limit} too low for the flood"
    );
    let limits = [
        "--header-read-timeout",
        "2s",
        "--keep-alive-timeout",
        "2s",
        "--max-connections",
        "256",
    ];
    let mut server_args = vec!["--keep-serving"];
    server_args.extend(limits);
    let v = Volume::start(&server_args, &limits);
    let (qcow2, expected) = sample_qcow2(v.dir());
    let t = v.token();
    let pids = [("proxy", v.px.child.id()), ("server", v.srv.child.id())];
    // Baseline once the proxy has a connection to the server.
    drop(head_kept_alive(v.px.port, &t));
    std::thread::sleep(Duration::from_millis(300));
    let base = pids.map(|(_, pid)| fds_and_rss(pid));

    let stop = AtomicBool::new(false);
    let sampling = AtomicBool::new(true);
    let (peaks, proxy_loris, server_loris, report) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| peaks_while(pids.map(|(_, pid)| pid), &sampling));
        let at_proxy = scope.spawn(|| loris(v.px.port, flood, &stop));
        let at_server = scope.spawn(|| loris(v.srv.port, flood, &stop));
        // Both listeners at their cap, the flood still going: a real upload gets through.
        let deadline = Instant::now() + Duration::from_secs(20);
        while pids
            .iter()
            .zip(base)
            .any(|((_, pid), (fds, _))| fds_and_rss(*pid).0 < fds + CAP - 8)
        {
            assert!(Instant::now() < deadline, "the flood did not reach the cap");
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = common::output_within(
            quarry()
                .args(["upload", arg(&qcow2), "--url", &v.url(), "--token", &t])
                .arg("--json")
                .env("QUARRY_LOG", "uploader=debug"),
            Duration::from_secs(120),
        );
        let flood_ended = at_proxy.is_finished() || at_server.is_finished();
        stop.store(true, Ordering::Relaxed);
        let (proxy_loris, server_loris) = (at_proxy.join().unwrap(), at_server.join().unwrap());
        sampling.store(false, Ordering::Relaxed);
        common::assert_ok(&out);
        assert!(!flood_ended, "the flood ended before the upload did");
        (
            sampler.join().unwrap(),
            proxy_loris,
            server_loris,
            common::json(&out),
        )
    });
    // An async upload: the image is renamed into place once written.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !v.target.exists() {
        assert!(Instant::now() < deadline, "the upload was never written");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_same(&v.target, &expected);
    for ((name, _), ((fds, _), (base_fds, _))) in pids.iter().zip(peaks.iter().zip(base)) {
        assert!(
            *fds <= base_fds + CAP + 8,
            "{name} held {fds} descriptors, {base_fds} before the flood, capped at {CAP}"
        );
    }
    eprintln!(
        "{} + {} slow-loris connections; upload: {report}",
        proxy_loris.len(),
        server_loris.len()
    );

    // The loris clients never close: the servers do.
    assert_closed_by_peer(proxy_loris, "a slow-loris (proxy)");
    assert_closed_by_peer(server_loris, "a slow-loris (server)");
    for ((name, pid), (base_fds, _)) in pids.iter().zip(base) {
        let fds = settle_fds(*pid, base_fds + 2);
        assert!(
            fds <= base_fds + 2,
            "{name}: {fds} descriptors, {base_fds} before"
        );
    }

    // Memory, from when the upload is written: a second flood, slow-loris connections at both
    // listeners and HEADs through the proxy whose clients half close and half keep idle (the
    // proxy closes those after the keep-alive timeout). Afterwards the memory is given back.
    std::thread::sleep(Duration::from_millis(500));
    let before = pids.map(|(_, pid)| fds_and_rss(pid));
    let sampling = AtomicBool::new(true);
    let never = AtomicBool::new(false);
    let (peaks, open) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| peaks_while(pids.map(|(_, pid)| pid), &sampling));
        let at_proxy = scope.spawn(|| loris(v.px.port, flood, &never));
        let at_server = scope.spawn(|| loris(v.srv.port, flood, &never));
        let heads: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    (0..125)
                        .filter_map(|i| {
                            let s = head_kept_alive(v.px.port, &t);
                            (i % 2 == 0).then_some(s)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut open = at_proxy.join().unwrap();
        open.extend(at_server.join().unwrap());
        open.extend(heads.into_iter().flat_map(|w| w.join().unwrap()));
        sampling.store(false, Ordering::Relaxed);
        (sampler.join().unwrap(), open)
    });
    eprintln!(
        "second flood: {} connections left open by their clients",
        open.len()
    );
    assert_closed_by_peer(open, "a slow-loris or idle keep-alive");
    for ((name, pid), ((base_fds, _), ((_, rss_before), (_, peak_rss)))) in
        pids.iter().zip(base.iter().zip(before.iter().zip(peaks)))
    {
        let fds = settle_fds(*pid, base_fds + 2);
        let rss = fds_and_rss(*pid).1;
        eprintln!(
            "{name}: {base_fds} descriptors before the floods, {fds} after; VmRSS {rss_before} \
             KiB before the second flood, {peak_rss} KiB at its peak, {rss} KiB after"
        );
        assert!(
            fds <= base_fds + 2,
            "{name}: {fds} descriptors, {base_fds} before"
        );
        // At least half of what the flood took is given back (glibc keeps freed memory for
        // reuse unless trimmed).
        let growth = peak_rss.saturating_sub(*rss_before);
        assert!(
            rss <= rss_before + (growth / 2).max(1 << 10),
            "{name} kept its memory: VmRSS {rss_before} KiB before, {peak_rss} KiB peak, {rss} KiB after"
        );
    }
}

// ---- Host-assisted clone streams (`quarry clone-source` → `quarry upload-server`) ----

/// A sparse 48 MiB `disk.img`: [`sample_disk`]'s 8 MiB at 4 MiB, 1 MiB of it again at 40 MiB, a
/// hole between and after. Returns its path and bytes.
fn sparse_source(dir: &Path) -> (PathBuf, Vec<u8>) {
    use std::os::unix::fs::FileExt as _;
    let (_, data) = sample_disk(dir);
    let vol = dir.join("source");
    fs::create_dir_all(&vol).unwrap();
    let path = vol.join("disk.img");
    let f = fs::File::create(&path).unwrap();
    f.write_all_at(&data, 4 << 20).unwrap();
    f.write_all_at(&data[..1 << 20], 40 << 20).unwrap();
    f.set_len(48 << 20).unwrap();
    drop(f);
    let bytes = fs::read(&path).unwrap();
    (path, bytes)
}

fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata(path).unwrap().blocks() * 512
}

/// `quarry clone-source` with CDI's cloner environment (PEM text, not paths).
fn clone_source(
    source: &Path,
    url: &str,
    kind: &str,
    ca: &TestCa,
    extra: &[&str],
) -> std::process::Output {
    clone_source_command(source, url, kind, ca, extra)
        .output()
        .unwrap()
}

/// The command [`clone_source`] runs.
fn clone_source_command(
    source: &Path,
    url: &str,
    kind: &str,
    ca: &TestCa,
    extra: &[&str],
) -> Command {
    let (cert, key) = ca.client_cert("cdi-uploadserver-client");
    let mut cmd = quarry();
    cmd.args([
        "clone-source",
        "--source",
        arg(source),
        "--content-type",
        kind,
        "--json",
    ])
    .args(extra)
    .env("UPLOAD_URL", url)
    .env("SERVER_CA_CERT", fs::read_to_string(ca.ca_pem()).unwrap())
    .env("CLIENT_CERT", fs::read_to_string(cert).unwrap())
    .env("CLIENT_KEY", fs::read_to_string(key).unwrap());
    cmd
}

/// An upload server with mutual TLS, as the target pod of a host-assisted clone.
fn tls_server(dir: &Path, target: &Path, ca: &TestCa) -> Proc {
    tls_server_on(free_port(), dir, target, ca)
}

/// [`tls_server`] listening on `port`.
fn tls_server_on(port: u16, dir: &Path, target: &Path, ca: &TestCa) -> Proc {
    server_on(
        port,
        dir,
        target,
        &[
            "--tls-cert",
            arg(&ca.cert_pem()),
            "--tls-key",
            arg(&ca.key_pem()),
            "--client-ca",
            arg(&ca.ca_pem()),
        ],
    )
}

/// A sparse source, a test CA, and where the target upload server writes.
fn clone_fixture() -> (tempfile::TempDir, PathBuf, Vec<u8>, TestCa, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (source, bytes) = sparse_source(dir.path());
    fs::create_dir_all(dir.path().join("target")).unwrap();
    let target = dir.path().join("target/disk.img");
    (dir, source, bytes, TestCa::new(), target)
}

#[test]
fn a_filesystem_clone_arrives_equal_and_sparse_without_sending_holes() {
    let (dir, source, bytes, ca, target) = clone_fixture();
    let d = dir.path();
    let mut srv = tls_server(d, &target, &ca);
    let url = format!("https://127.0.0.1:{}/v1beta1/upload", srv.port);
    let out = clone_source(&source, &url, "filesystem-clone", &ca, &[]);
    common::assert_ok(&out);
    let report = common::json(&out);
    assert_eq!(report["bytes"], 48 << 20);
    assert_eq!(report["attempts"], 1);
    let sent = report["bytes_sent"].as_u64().unwrap();
    assert!(
        sent < 10 << 20,
        "holes were sent: {sent} bytes for 9 MiB of data"
    );
    assert_eq!(srv.wait_exit(), 0, "the server stops after the clone");
    assert_same(&target, &bytes);
    assert!(
        allocated(&target) < 12 << 20,
        "holes were filled: {} bytes allocated",
        allocated(&target)
    );
}

#[test]
fn a_clone_source_started_before_its_server_waits_for_it_and_sends_once() {
    let (dir, source, bytes, ca, target) = clone_fixture();
    let d = dir.path();
    // The port answers nothing yet: each connection is closed unread, as no server is there.
    let early = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = early.local_addr().unwrap().port();
    let url = format!("https://127.0.0.1:{port}/v1beta1/upload");
    // A failed first attempt would wait its 60 s back-off: the wait makes it one attempt.
    let client = clone_source_command(
        &source,
        &url,
        "filesystem-clone",
        &ca,
        &["--server-wait", "60s", "--retry-backoff", "60s"],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // The client asks before the server is up; then the server starts on that port.
    early.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match early.accept() {
            Ok((conn, _)) => break drop(conn),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "the client never asked");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accepting: {e}"),
        }
    }
    drop(early);
    let mut srv = tls_server_on(port, d, &target, &ca);
    let out = client.wait_with_output().unwrap();
    common::assert_ok(&out);
    let report = common::json(&out);
    assert_eq!(report["attempts"], 1, "{report}");
    assert_eq!(srv.wait_exit(), 0, "the server stops after the clone");
    assert_same(&target, &bytes);
}

#[test]
fn a_gnu_tar_stream_as_cdis_cloner_sends_is_accepted() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (source, bytes) = sparse_source(d);
    // CDI's cloner: `tar cv -S <files>` in the volume's mount, piped through snappy's framing.
    let tar = Command::new("tar")
        .args(["cv", "-S", "disk.img"])
        .current_dir(source.parent().unwrap())
        .output()
        .expect("tar");
    assert!(tar.status.success());
    let mut enc = snap::write::FrameEncoder::new(Vec::new());
    enc.write_all(&tar.stdout).unwrap();
    let body = d.join("body.sz");
    fs::write(&body, enc.into_inner().unwrap()).unwrap();
    fs::create_dir_all(d.join("target")).unwrap();
    let target = d.join("target/disk.img");
    let srv = server(d, &target, &["--keep-serving"]);
    let url = format!("http://127.0.0.1:{}/v1beta1/upload", srv.port);
    let (code, msg, _) = post_with(
        &url,
        "x",
        &body,
        &["-H", "x-cdi-content-type: filesystem-clone"],
    );
    assert_eq!(code, 200, "{msg}");
    assert_same(&target, &bytes);
    assert!(allocated(&target) < 12 << 20, "holes were filled");
}

#[test]
fn a_clone_cut_mid_way_is_sent_again_and_completes() {
    let (dir, source, bytes, ca, target) = clone_fixture();
    let d = dir.path();
    let srv = tls_server(d, &target, &ca);
    let cut = CutProxy::start_upload(SocketAddr::from(([127, 0, 0, 1], srv.port)), 3 << 20);
    let url = format!("https://127.0.0.1:{}/v1beta1/upload", cut.port());
    let out = clone_source(
        &source,
        &url,
        "filesystem-clone",
        &ca,
        &["--retry-backoff", "1s"],
    );
    common::assert_ok(&out);
    assert_eq!(cut.cuts(), 1);
    let report = common::json(&out);
    assert!(report["attempts"].as_u64().unwrap() >= 2, "{report}");
    assert_same(&target, &bytes);
    no_partial_left(target.parent().unwrap());
}

#[test]
fn a_bad_clone_stream_is_refused_and_leaves_no_target() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::create_dir_all(d.join("target")).unwrap();
    let target = d.join("target/disk.img");
    let srv = server(d, &target, &["--keep-serving"]);
    let url = format!("http://127.0.0.1:{}/v1beta1/upload", srv.port);
    // Not snappy framing at all.
    let (raw, _) = sample_disk(d);
    let (code, msg, _) = post_with(
        &url,
        "x",
        &raw,
        &["-H", "x-cdi-content-type: blockdevice-clone"],
    );
    assert_eq!(code, 500, "{msg}");
    assert!(msg.contains("snappy"), "{msg}");
    // Framed, but a tar without disk.img.
    let mut enc = snap::write::FrameEncoder::new(Vec::new());
    enc.write_all(&[0u8; 10240]).unwrap();
    let empty = d.join("empty.sz");
    fs::write(&empty, enc.into_inner().unwrap()).unwrap();
    let (code, msg, _) = post_with(
        &url,
        "x",
        &empty,
        &["-H", "x-cdi-content-type: filesystem-clone"],
    );
    assert_eq!(code, 500, "{msg}");
    assert!(msg.contains("no disk.img"), "{msg}");
    assert!(!target.exists(), "a refused clone left a target");
    no_partial_left(target.parent().unwrap());
}

#[test]
fn a_block_device_clone_arrives_equal_and_sparse() {
    use std::os::unix::fs::FileExt as _;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(dev) = common::LoopDevice::new(&d.join("backing"), 32 << 20) else {
        return; // LoopDevice::new said why
    };
    let (_, data) = sample_disk(d);
    let f = fs::OpenOptions::new()
        .write(true)
        .open(&dev.device)
        .unwrap();
    f.write_all_at(&data, 8 << 20).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let bytes = fs::read(&dev.device).unwrap();
    let ca = TestCa::new();
    fs::create_dir_all(d.join("target")).unwrap();
    let target = d.join("target/disk.img");
    for kind in ["blockdevice-clone", "filesystem-clone"] {
        let _ = fs::remove_file(&target);
        let mut srv = tls_server(d, &target, &ca);
        let url = format!("https://127.0.0.1:{}/v1beta1/upload", srv.port);
        let out = clone_source(&dev.device, &url, kind, &ca, &[]);
        common::assert_ok(&out);
        assert_eq!(common::json(&out)["bytes"], 32 << 20, "{kind}");
        assert_eq!(srv.wait_exit(), 0);
        assert_same(&target, &bytes);
        assert!(
            allocated(&target) < 12 << 20,
            "{kind}: zero runs were written"
        );
    }
}

#[test]
fn resize_disk_grows_a_file_never_shrinks_and_refuses_a_small_block_device() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = d.join("disk.img");
    fs::write(&img, vec![7u8; 1 << 20]).unwrap();
    let resize = |target: &Path, size: &str| {
        quarry()
            .args([
                "resize-disk",
                "--target",
                arg(target),
                "--size",
                size,
                "--json",
            ])
            .output()
            .unwrap()
    };
    let out = resize(&img, "100Mi");
    common::assert_ok(&out);
    // 100 MiB less CDI's default 6% overhead, down to a whole MiB.
    assert_eq!(common::json(&out)["after"], 94 << 20);
    assert_eq!(fs::metadata(&img).unwrap().len(), 94 << 20);
    assert!(allocated(&img) < 4 << 20, "the growth is a hole");
    common::assert_ok(&resize(&img, "10Mi"));
    assert_eq!(fs::metadata(&img).unwrap().len(), 94 << 20, "never shrinks");
    let Some(dev) = common::LoopDevice::new(&d.join("backing"), 8 << 20) else {
        return;
    };
    common::assert_ok(&resize(&dev.device, "8Mi"));
    let out = resize(&dev.device, "16Mi");
    common::assert_exit(&out, 13);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot grow"));
}

/// The `kubevirt_cdi_clone_progress_total{ownerUID="OWNER"}` sample at `addr`, if served.
fn clone_progress(addr: SocketAddr, owner: &str) -> Option<f64> {
    use std::io::{Read as _, Write as _};
    let mut s = TcpStream::connect(addr).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let sample = format!("kubevirt_cdi_clone_progress_total{{ownerUID=\"{owner}\"}} ");
    let line = text.lines().find_map(|l| l.strip_prefix(&sample))?;
    line.trim().parse().ok()
}

#[test]
fn clone_progress_is_served_while_the_stream_is_held_up() {
    let dir = tempfile::tempdir().unwrap();
    // 64 MiB that snappy cannot shrink, so the stream outgrows every buffer on the way.
    let source = dir.path().join("disk.img");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..(64 << 20) / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    fs::write(&source, &data).unwrap();
    // An "upload server" that accepts and never reads.
    let stalled = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1beta1/upload", stalled.local_addr().unwrap());
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut child = quarry()
        .args(["clone-source", "--source", arg(&source)])
        .args(["--content-type", "blockdevice-clone", "--upload-url", &url])
        .args(["--metrics-addr", &metrics.to_string(), "--retries", "0"])
        .env("OWNER_UID", "target-uid")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (_held, _) = stalled.accept().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let seen = loop {
        match clone_progress(metrics, "target-uid") {
            Some(p) if p > 0.0 => break p,
            _ => {}
        }
        assert!(Instant::now() < deadline, "no clone progress was served");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Part of the stream is read, and it cannot all be while the server reads nothing.
    assert!(seen < 100.0, "{seen}");
    assert_eq!(clone_progress(metrics, "someone-else"), None);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Load, bounded: this many clone streams at once, each to its own upload server.
const CONCURRENT_CLONES: usize = 8;

#[test]
fn concurrent_clone_streams_each_arrive_equal_and_sparse() {
    use std::os::unix::fs::FileExt as _;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = TestCa::new();
    // Per stream: a 16 MiB disk.img with 1 MiB of its own data at its own offset and 512 KiB
    // more near the end, holes between.
    let streams: Vec<(PathBuf, Vec<u8>, PathBuf, Proc)> = (0..CONCURRENT_CLONES)
        .map(|i| {
            let vol = d.join(format!("source-{i}"));
            fs::create_dir_all(&vol).unwrap();
            let path = vol.join("disk.img");
            let f = fs::File::create(&path).unwrap();
            let data: Vec<u8> = (0..1 << 20)
                .map(|j: u32| (j * 7 + i as u32) as u8 | 1)
                .collect();
            f.write_all_at(&data, (i as u64 + 1) << 20).unwrap();
            f.write_all_at(&data[..512 << 10], 14 << 20).unwrap();
            f.set_len(16 << 20).unwrap();
            drop(f);
            let bytes = fs::read(&path).unwrap();
            fs::create_dir_all(d.join(format!("target-{i}"))).unwrap();
            let target = d.join(format!("target-{i}/disk.img"));
            let srv = tls_server(d, &target, &ca);
            (path, bytes, target, srv)
        })
        .collect();
    // Every stream at once, each bounded in time.
    let runs: Vec<_> = streams
        .iter()
        .map(|(source, _, _, srv)| {
            let url = format!("https://127.0.0.1:{}/v1beta1/upload", srv.port);
            let mut cmd = clone_source_command(source, &url, "filesystem-clone", &ca, &[]);
            std::thread::spawn(move || common::output_within(&mut cmd, Duration::from_secs(120)))
        })
        .collect();
    let outputs: Vec<_> = runs.into_iter().map(|t| t.join().unwrap()).collect();
    for ((_, bytes, target, mut srv), out) in streams.into_iter().zip(outputs) {
        common::assert_ok(&out);
        let report = common::json(&out);
        assert_eq!(report["bytes"], 16 << 20);
        assert!(
            report["bytes_sent"].as_u64().unwrap() < 4 << 20,
            "holes were sent"
        );
        assert_eq!(srv.wait_exit(), 0, "the server stops after its clone");
        assert_same(&target, &bytes);
        assert!(allocated(&target) < 4 << 20, "holes were filled");
    }
}

#[test]
fn an_archive_volume_extracts_uploads_on_cdis_archive_path_and_through_the_proxy() {
    use common::archive::{check_tree, pack, sample_tree};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (private, public) = testkit::tls::rsa_key_pair(d, "signer");
    let tree = sample_tree(d);
    let tar = d.join("tree.tar");
    pack(&tree, &tar, "gnu");
    let gz = d.join("tree.tar.gz");
    compress(&["gzip", "-c"], &tar, &gz);

    // CDI's upload proxy sends uploads to an archive volume to /v1beta1/upload-archive.
    let vol = d.join("vol");
    fs::create_dir(&vol).unwrap();
    let mut srv = server(d, &vol, &["--archive", "--size", "64Mi"]);
    let direct = format!("http://127.0.0.1:{}/v1beta1/upload-archive", srv.port);
    let (code, body) = post(&direct, "unused", &gz);
    assert_eq!(code, 200, "{body}");
    check_tree(&vol);
    assert_eq!(srv.wait_exit(), 0);

    // Through Quarry's proxy on virtctl's path, with a hostile archive first: refused with 500,
    // nothing written, and the server takes the good one after.
    let vol2 = d.join("vol2");
    fs::create_dir(&vol2).unwrap();
    let srv2 = server(d, &vol2, &["--archive", "--keep-serving"]);
    let px = proxy(d, &public, &[("vms/files", &srv2)], &[]);
    let url = format!("http://127.0.0.1:{}/v1beta1/upload-async", px.port);
    let hostile = d.join("hostile.tar");
    common::archive::python_tar(&hostile, "add('../escape', data=b'x')");
    let tok = token(&private, "vms", "files");
    let sync_url = format!("http://127.0.0.1:{}/v1beta1/upload", px.port);
    let (code, body) = post(&sync_url, &tok, &hostile);
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("refused"), "{body}");
    assert_eq!(fs::read_dir(&vol2).unwrap().count(), 0);
    assert!(!d.join("escape").exists());
    let (code, body) = post(&url, &tok, &gz);
    assert_eq!(code, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !vol2.join("top.txt").exists() {
        assert!(
            Instant::now() < deadline,
            "the async upload was not extracted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The async answer comes before the commit: wait for the 409 that follows success.
    let archive_url = format!("http://127.0.0.1:{}/v1beta1/upload-archive", px.port);
    let deadline = Instant::now() + Duration::from_secs(30);
    while post(&archive_url, &tok, &gz).0 != 409 {
        assert!(Instant::now() < deadline, "the upload did not settle");
        std::thread::sleep(Duration::from_millis(50));
    }
    check_tree(&vol2);

    // A disk-image server refuses the archive path.
    let vol3 = d.join("vol3");
    fs::create_dir(&vol3).unwrap();
    let srv3 = server(d, &vol3.join("disk.img"), &[]);
    let url = format!("http://127.0.0.1:{}/v1beta1/upload-archive", srv3.port);
    let (code, body) = post(&url, "unused", &gz);
    assert_eq!(code, 400, "{body}");
    assert!(!vol3.join("disk.img").exists());
}

/// A server made ready just before its Service routes to it: the proxy tries the refused
/// connection again instead of answering 503 at once, and the upload lands whole.
#[test]
fn the_proxy_waits_for_an_upload_server_that_is_not_listening_yet() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (private, public) = testkit::tls::rsa_key_pair(d, "signer");
    let target = d.join("disk.img");
    let port = free_port();
    let route = format!("vms/disk=http://127.0.0.1:{port}");
    let px = proxy(d, &public, &[], &["--upstream", &route]);
    let (qcow2, expected) = sample_qcow2(d);
    let late = {
        let (target, log) = (target.clone(), d.join("late-server.log"));
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            let listen = format!("127.0.0.1:{port}");
            let args = [
                "upload-server",
                "--target",
                arg(&target),
                "--listen",
                &listen,
            ];
            let mut srv = Proc::start("upload-server", &args, port, &log);
            srv.wait_exit()
        })
    };
    let url = format!("http://127.0.0.1:{}/v1beta1/upload", px.port);
    let (code, body) = post(&url, &token(&private, "vms", "disk"), &qcow2);
    assert_eq!(code, 200, "{body}");
    assert_eq!(late.join().unwrap(), 0);
    assert_same(&target, &expected);
}
