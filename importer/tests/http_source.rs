//! HttpSource against real nginx (plain, ranges off, HTTPS with a test CA, basic auth,
//! redirects) and the testkit fault server (resets, Content-Length lies, 503s, stalls, changed
//! entities). Every test runs under a watchdog so none can hang.

use std::io::Read;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use importer::source::ByteSource;
use importer::source::http::{HttpOptions, HttpSource};
use importer::{Error, ErrorKind};
use testkit::faults::{Cut, FaultConfig, FaultServer, Step};
use testkit::nginx::{Nginx, NginxConfig};
use testkit::tls::TestCa;

const MIB: usize = 1 << 20;

/// Runs `f` on a thread and fails the test if it takes longer than `secs`.
fn bounded<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "importer=debug".into()),
        )
        .try_init();
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The closure panicked: surface its panic.
            std::panic::resume_unwind(h.join().expect_err("closure ended without a value"))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("test did not finish within {secs}s"),
    }
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Test options: fast back-off, bounded timeouts.
fn opts() -> HttpOptions {
    HttpOptions {
        connect_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(10),
        max_retries: 3,
        retry_backoff: Duration::from_millis(10),
        chunk_depth: 8,
        ..HttpOptions::default()
    }
}

fn read_all(url: &str, opts: &HttpOptions) -> Result<(Vec<u8>, Option<u64>), Error> {
    let mut src = HttpSource::open(url, opts)?;
    let len = src.info().length;
    let mut out = Vec::new();
    src.read_to_end(&mut out)
        .map_err(|e| Error::from_read(e, "http body"))?;
    Ok((out, len))
}

/// Asserts equality without printing megabytes.
fn assert_same(got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "length differs");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("bytes differ first at offset {i}");
    }
}

struct Site {
    _root: tempfile::TempDir,
    data: Vec<u8>,
}

fn site(len: usize) -> Site {
    let root = tempfile::tempdir().unwrap();
    let data = random_bytes(len, 0x5eed);
    std::fs::write(root.path().join("disk.img"), &data).unwrap();
    Site { _root: root, data }
}

impl Site {
    fn root(&self) -> &Path {
        self._root.path()
    }
}

// ---------------------------------------------------------------- nginx

fn nginx_plain(ranges: bool) {
    let s = site(3 * MIB + 123);
    let nginx = Nginx::start(NginxConfig {
        root: s.root().into(),
        ranges,
        ..Default::default()
    });
    let url = nginx.url("/disk.img");
    let (got, len) = bounded(60, move || read_all(&url, &opts()).unwrap());
    assert_eq!(len, Some(s.data.len() as u64));
    assert_same(&got, &s.data);
}

#[test]
fn nginx_plain_with_ranges() {
    nginx_plain(true);
}

#[test]
fn nginx_plain_without_ranges() {
    nginx_plain(false);
}

#[test]
fn slow_server_within_the_idle_timeout_is_fine() {
    // ~3 s of transfer at 1 MiB/s with a 2 s idle timeout: the timeout is per chunk, not
    // per transfer.
    let s = site(3 * MIB);
    let nginx = Nginx::start(NginxConfig {
        root: s.root().into(),
        ranges: true,
        limit_rate: Some(MIB as u64),
        ..Default::default()
    });
    let url = nginx.url("/disk.img");
    let o = HttpOptions {
        idle_timeout: Duration::from_secs(2),
        max_retries: 0,
        ..opts()
    };
    let (got, _) = bounded(60, move || read_all(&url, &o).unwrap());
    assert_same(&got, &s.data);
}

#[test]
fn nginx_missing_file_is_rejected() {
    let s = site(10);
    let nginx = Nginx::start(NginxConfig {
        root: s.root().into(),
        ranges: true,
        ..Default::default()
    });
    let url = nginx.url("/nope.img");
    let err = bounded(30, move || read_all(&url, &opts()).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceRejected, "{err}");
    assert!(err.to_string().contains("404"), "{err}");
    assert!(err.to_string().contains("/nope.img"), "{err}");
}

#[test]
fn https_with_the_test_ca() {
    let s = site(2 * MIB + 7);
    let ca = TestCa::new();
    let nginx = Nginx::start(NginxConfig {
        root: s.root().into(),
        ranges: true,
        tls: Some(&ca),
        ..Default::default()
    });
    for url in [nginx.url("/disk.img"), nginx.url_localhost("/disk.img")] {
        let o = HttpOptions {
            ca_certs: vec![ca.ca_pem()],
            ..opts()
        };
        let (got, len) = bounded(60, move || read_all(&url, &o).unwrap());
        assert_eq!(len, Some(s.data.len() as u64));
        assert_same(&got, &s.data);
    }
    // ALPN picked HTTP/2.
    assert!(
        nginx.access_log().contains("HTTP/2.0"),
        "{}",
        nginx.access_log()
    );
}

#[test]
fn https_without_the_ca_is_rejected_and_insecure_works() {
    let s = site(MIB);
    let ca = TestCa::new();
    let nginx = Nginx::start(NginxConfig {
        root: s.root().into(),
        ranges: true,
        tls: Some(&ca),
        ..Default::default()
    });
    let url = nginx.url("/disk.img");
    let u = url.clone();
    let err = bounded(30, move || read_all(&u, &opts()).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceRejected, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("TLS") && msg.contains("certificate"), "{msg}");

    // A different CA does not help either.
    let other = TestCa::new();
    let o = HttpOptions {
        ca_certs: vec![other.ca_pem()],
        ..opts()
    };
    let u = url.clone();
    let err = bounded(30, move || read_all(&u, &o).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceRejected, "{err}");

    let o = HttpOptions {
        insecure: true,
        ..opts()
    };
    let (got, _) = bounded(60, move || read_all(&url, &o).unwrap());
    assert_same(&got, &s.data);
}

fn auth_nginx(s: &Site) -> Nginx {
    Nginx::start(NginxConfig {
        root: s.root().into(),
        ranges: true,
        basic_auth: Some(("alice".into(), "s3cret".into())),
        redirects: vec![("/old.img".into(), "/disk.img".into())],
        ..Default::default()
    })
}

#[test]
fn basic_auth_right_wrong_and_missing() {
    let s = site(MIB + 1);
    let nginx = auth_nginx(&s);
    let url = nginx.url("/disk.img");

    let o = HttpOptions {
        basic_auth: Some(("alice".into(), "s3cret".into())),
        ..opts()
    };
    let u = url.clone();
    let (got, _) = bounded(60, move || read_all(&u, &o).unwrap());
    assert_same(&got, &s.data);

    let o = HttpOptions {
        basic_auth: Some(("alice".into(), "wrong".into())),
        ..opts()
    };
    let u = url.clone();
    let err = bounded(30, move || read_all(&u, &o).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceRejected, "{err}");
    assert!(err.to_string().contains("401"), "{err}");

    let u = url.clone();
    let err = bounded(30, move || read_all(&u, &opts()).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceRejected, "{err}");
    assert!(err.to_string().contains("401"), "{err}");

    // Credentials in the URL work too, and are not part of the source's name.
    let u = format!("http://alice:s3cret@127.0.0.1:{}/disk.img", nginx.port());
    let (name, got) = bounded(60, move || {
        let mut src = HttpSource::open(&u, &opts()).unwrap();
        let mut out = Vec::new();
        src.read_to_end(&mut out).unwrap();
        (src.info().name.clone(), out)
    });
    assert!(
        !name.contains("s3cret") && !name.contains("alice"),
        "{name}"
    );
    assert_same(&got, &s.data);
}

#[test]
fn same_host_redirect_keeps_credentials() {
    let s = site(MIB + 3);
    let nginx = auth_nginx(&s);
    let url = nginx.url("/old.img");
    let o = HttpOptions {
        basic_auth: Some(("alice".into(), "s3cret".into())),
        ..opts()
    };
    let (got, _) = bounded(60, move || read_all(&url, &o).unwrap());
    assert_same(&got, &s.data);
}

#[test]
fn cross_host_redirect_does_not_leak_authorization() {
    let data = random_bytes(MIB + 5, 7);
    let fault = FaultServer::start(FaultConfig::new(data.clone()));
    let s = site(10);
    let nginx = Nginx::start(NginxConfig {
        root: s.root().into(),
        ranges: true,
        redirects: vec![("/away.img".into(), fault.url("/disk.img"))],
        ..Default::default()
    });
    let url = nginx.url("/away.img");
    let o = HttpOptions {
        basic_auth: Some(("alice".into(), "s3cret".into())),
        headers: vec![("X-Quarry-Test".into(), "kept".into())],
        ..opts()
    };
    let (got, _) = bounded(60, move || read_all(&url, &o).unwrap());
    assert_same(&got, &data);
    let reqs = fault.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(reqs[0].target, "/disk.img");
    assert_eq!(reqs[0].header("authorization"), None, "{reqs:?}");
    assert_eq!(reqs[0].header("x-quarry-test"), Some("kept"));
    // nginx did get the credentials.
    assert!(
        nginx.access_log().contains("alice"),
        "{}",
        nginx.access_log()
    );
}

#[test]
fn cross_host_redirect_drops_an_authorization_extra_header() {
    let data = random_bytes(1000, 8);
    let fault = FaultServer::start(FaultConfig::new(data.clone()));
    let redirector = FaultServer::start(
        FaultConfig::new(Vec::new()).redirect("/disk.img", &fault.url("/disk.img")),
    );
    let url = redirector.url("/disk.img");
    let o = HttpOptions {
        headers: vec![("Authorization".into(), "Bearer tok".into())],
        ..opts()
    };
    let (got, _) = bounded(30, move || read_all(&url, &o).unwrap());
    assert_same(&got, &data);
    assert_eq!(
        redirector.requests()[0].header("authorization"),
        Some("Bearer tok")
    );
    assert_eq!(fault.requests()[0].header("authorization"), None);
}

#[test]
fn redirect_loops_are_rejected() {
    let fault = FaultServer::start(FaultConfig::new(Vec::new()).redirect("/loop", "/loop"));
    let url = fault.url("/loop");
    let err = bounded(30, move || read_all(&url, &opts()).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceRejected, "{err}");
    assert!(fault.request_count() <= 12, "{}", fault.request_count());
}

#[test]
fn extra_headers_arrive() {
    let data = random_bytes(1000, 3);
    let fault = FaultServer::start(FaultConfig::new(data.clone()));
    let url = fault.url("/disk.img");
    let o = HttpOptions {
        headers: vec![
            ("X-Quarry-Test".into(), "one".into()),
            ("Authorization".into(), "Bearer tok".into()),
        ],
        ..opts()
    };
    let (got, len) = bounded(30, move || read_all(&url, &o).unwrap());
    assert_eq!(len, Some(1000));
    assert_same(&got, &data);
    let r = &fault.requests()[0];
    assert_eq!(r.method, "GET");
    assert_eq!(r.header("x-quarry-test"), Some("one"));
    assert_eq!(r.header("authorization"), Some("Bearer tok"));
    assert_eq!(r.header("range"), None);
}

#[test]
fn chunked_body_has_unknown_length() {
    let data = random_bytes(MIB + 11, 4);
    let fault = FaultServer::start(FaultConfig::new(data.clone()).chunked(true));
    let url = fault.url("/disk.img");
    let (got, len) = bounded(30, move || read_all(&url, &opts()).unwrap());
    assert_eq!(len, None);
    assert_same(&got, &data);
}

// ---------------------------------------------------------------- faults

#[test]
fn chunked_body_reset_after_its_last_byte_completes() {
    let data = random_bytes(MIB + 3, 5);
    let fault = FaultServer::start(
        FaultConfig::new(data.clone())
            .chunked(true)
            .script([Step::reset_after(data.len() as u64)]),
    );
    let url = fault.url("/disk.img");
    let (got, len) = bounded(30, move || read_all(&url, &opts()).unwrap());
    assert_eq!(len, None);
    assert_same(&got, &data);
    let reqs = fault.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(
        reqs[1].header("range"),
        Some(format!("bytes={}-", MIB + 3).as_str())
    );
}

#[test]
fn chunked_body_reset_mid_way_resumes() {
    let data = random_bytes(2 * MIB, 6);
    let fault = FaultServer::start(
        FaultConfig::new(data.clone())
            .chunked(true)
            .script([Step::reset_after(MIB as u64)]),
    );
    let url = fault.url("/disk.img");
    let (got, _) = bounded(30, move || read_all(&url, &opts()).unwrap());
    assert_same(&got, &data);
    assert_eq!(fault.request_count(), 2);
}

#[test]
fn reset_mid_body_resumes_with_range_and_if_range() {
    let data = random_bytes(3 * MIB, 11);
    let fault = FaultServer::start(
        FaultConfig::new(data.clone()).script([Step::reset_after(MIB as u64 + 17), Step::ok()]),
    );
    let url = fault.url("/disk.img");
    let (got, _) = bounded(60, move || read_all(&url, &opts()).unwrap());
    assert_same(&got, &data);
    let reqs = fault.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(reqs[0].header("range"), None);
    let range = reqs[1].header("range").expect("resume must send Range");
    let offset: u64 = range
        .strip_prefix("bytes=")
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected Range {range:?}"));
    assert!(offset > 0 && offset <= MIB as u64 + 17, "{range}");
    assert_eq!(reqs[1].header("if-range"), Some("\"v1\""));
}

#[test]
fn repeated_resets_with_progress_still_complete() {
    let data = random_bytes(6 * MIB, 12);
    // Every response breaks after 1.5 MiB: each attempt makes progress, so the retry count
    // (max 1 here) is reset and the transfer completes.
    let fault = FaultServer::start(
        FaultConfig::new(data.clone()).otherwise(Step::reset_after(3 * MIB as u64 / 2)),
    );
    let url = fault.url("/disk.img");
    let o = HttpOptions {
        max_retries: 1,
        ..opts()
    };
    let (got, _) = bounded(60, move || read_all(&url, &o).unwrap());
    assert_same(&got, &data);
    assert!(fault.request_count() >= 4, "{}", fault.request_count());
}

#[test]
fn weak_etag_uses_last_modified_for_if_range() {
    let data = random_bytes(2 * MIB, 13);
    let fault = FaultServer::start(
        FaultConfig::new(data.clone())
            .etag(Some("W/\"weak\""))
            .script([Step::reset_after(MIB as u64)]),
    );
    let url = fault.url("/disk.img");
    let (got, _) = bounded(60, move || read_all(&url, &opts()).unwrap());
    assert_same(&got, &data);
    let reqs = fault.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert!(reqs[1].header("range").is_some());
    assert_eq!(
        reqs[1].header("if-range"),
        Some("Tue, 03 Nov 2026 10:00:00 GMT")
    );
}

#[test]
fn partial_content_for_the_wrong_range_is_an_error() {
    let data = random_bytes(2 * MIB, 22);
    let fault = FaultServer::start(
        FaultConfig::new(data).script([Step::reset_after(MIB as u64), Step::ok().range_from(0)]),
    );
    let url = fault.url("/disk.img");
    let err = bounded(60, move || read_all(&url, &opts()).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
    assert!(err.to_string().contains("Content-Range"), "{err}");
    assert_eq!(fault.request_count(), 2);
}

#[test]
fn read_works_from_inside_an_async_runtime() {
    let data = random_bytes(MIB, 23);
    let fault = FaultServer::start(FaultConfig::new(data.clone()));
    let url = fault.url("/disk.img");
    let got = bounded(30, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move { read_all(&url, &opts()).unwrap().0 })
    });
    assert_same(&got, &data);
}

/// A server with neither ETag nor Last-Modified whose first answer ends after 1 MiB (a clean
/// close, so that exactly 1 MiB is passed on before the retry).
fn without_validators(data: &[u8], after_break: Step) -> FaultServer {
    FaultServer::start(
        FaultConfig::new(data.to_vec())
            .etag(None)
            .last_modified(None)
            .script([Step::close_after(MIB as u64), after_break]),
    )
}

#[test]
fn resume_without_validators_rereads_from_the_start_and_checks_the_prefix() {
    // Nothing ties a range of such a file to its first part: the retry asks for the whole body
    // and checks the first MiB against what was passed on.
    let data = random_bytes(2 * MIB, 14);
    let fault = without_validators(&data, Step::ok());
    let url = fault.url("/disk.img");
    let (got, _) = bounded(60, move || read_all(&url, &opts()).unwrap());
    assert_same(&got, &data);
    let reqs = fault.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(reqs[1].header("range"), None, "{reqs:?}");
    assert_eq!(reqs[1].header("if-range"), None);
}

#[test]
fn a_replaced_file_without_validators_is_never_joined() {
    // The server answers the retry with another file (a range request would have got its
    // tail: A[..N] + B[N..] with exit 0 before).
    let data = random_bytes(2 * MIB, 15);
    let other = random_bytes(2 * MIB, 16);
    let fault = without_validators(&data, Step::ok().body(other));
    let url = fault.url("/disk.img");
    let err = bounded(60, move || read_all(&url, &opts()).map(|_| ()).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
    assert!(err.to_string().contains("changed during download"), "{err}");
    assert_eq!(fault.requests()[1].header("range"), None);
}

#[test]
fn a_replaced_file_with_the_same_first_bytes_is_read_whole_from_the_new_one() {
    // Same first MiB, different tail: the result is the new file, never a mix.
    let data = random_bytes(2 * MIB, 17);
    let mut other = data.clone();
    other[MIB + 5..].fill(0x5a);
    let fault = without_validators(&data, Step::ok().body(other.clone()));
    let url = fault.url("/disk.img");
    let (got, _) = bounded(60, move || read_all(&url, &opts()).unwrap());
    assert_same(&got, &other);
}

#[test]
fn a_weak_etag_alone_is_no_validator_to_resume_with() {
    let data = random_bytes(2 * MIB, 18);
    let other = random_bytes(2 * MIB, 21);
    let fault = FaultServer::start(
        FaultConfig::new(data)
            .etag(Some("W/\"weak\""))
            .last_modified(None)
            .script([Step::close_after(MIB as u64), Step::ok().body(other)]),
    );
    let url = fault.url("/disk.img");
    let err = bounded(60, move || read_all(&url, &opts()).map(|_| ()).unwrap_err());
    assert!(err.to_string().contains("changed during download"), "{err}");
    let reqs = fault.requests();
    assert_eq!(reqs[1].header("range"), None, "{reqs:?}");
    assert_eq!(reqs[1].header("if-range"), None, "{reqs:?}");
}

#[test]
fn response_headers_are_held_to_the_idle_timeout() {
    // Before, the headers had the connect and idle limits together (31 s here): the server
    // below would have been waited for and the transfer would have succeeded.
    let fault = FaultServer::start(
        FaultConfig::new(random_bytes(4096, 5))
            .otherwise(Step::ok().headers_after(Duration::from_secs(20))),
    );
    let url = fault.url("/disk.img");
    let o = HttpOptions {
        idle_timeout: Duration::from_secs(1),
        max_retries: 1,
        ..opts()
    };
    let err = bounded(15, move || read_all(&url, &o).unwrap_err());
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
    assert!(
        err.to_string().contains("no response headers within 1s"),
        "{err}"
    );
    assert_eq!(fault.request_count(), 2);
}

#[test]
fn a_body_trickling_below_the_minimum_rate_is_given_up() {
    // One byte every 200 ms never trips the idle timeout.
    let fault = FaultServer::start(
        FaultConfig::new(random_bytes(64 << 10, 6))
            .otherwise(Step::ok().cut(Cut::Trickle(1000, Duration::from_millis(200)))),
    );
    let url = fault.url("/disk.img");
    let o = HttpOptions {
        idle_timeout: Duration::from_secs(1),
        min_rate: 1024,
        max_retries: 1,
        ..opts()
    };
    let err = bounded(20, move || read_all(&url, &o).unwrap_err());
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
    assert!(
        err.to_string()
            .contains("slower than the minimum of 1024 bytes/s"),
        "{err}"
    );
}

#[test]
fn reset_with_ranges_ignored_restarts_and_discards() {
    let data = random_bytes(3 * MIB, 21);
    let fault = FaultServer::start(
        FaultConfig::new(data.clone())
            .ranges(false)
            .script([Step::reset_after(2 * MIB as u64), Step::ok()]),
    );
    let url = fault.url("/disk.img");
    let (got, _) = bounded(60, move || read_all(&url, &opts()).unwrap());
    assert_same(&got, &data);
    let reqs = fault.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert!(reqs[1].header("range").is_some(), "{reqs:?}");
}

#[test]
fn entity_changed_between_attempts_fails() {
    let data = random_bytes(3 * MIB, 31);
    let fault = FaultServer::start(
        FaultConfig::new(data).script([Step::reset_after(MIB as u64), Step::ok().etag("\"v2\"")]),
    );
    let url = fault.url("/disk.img");
    let err = bounded(60, move || read_all(&url, &opts()).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
    assert!(err.to_string().contains("changed"), "{err}");
    assert_eq!(fault.request_count(), 2);
}

#[test]
fn entity_changed_when_the_server_ignores_ranges_fails() {
    let data = random_bytes(2 * MIB, 32);
    let fault = FaultServer::start(
        FaultConfig::new(data)
            .ranges(false)
            .script([Step::reset_after(MIB as u64), Step::ok().etag("\"v2\"")]),
    );
    let url = fault.url("/disk.img");
    let err = bounded(60, move || read_all(&url, &opts()).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
    assert!(err.to_string().contains("changed"), "{err}");
}

fn short_every_time(ranges: bool) {
    let data = random_bytes(2 * MIB, 41);
    let fault = FaultServer::start(
        FaultConfig::new(data)
            .ranges(ranges)
            .otherwise(Step::short_by(1000)),
    );
    let url = fault.url("/disk.img");
    let err = bounded(60, move || read_all(&url, &opts()).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
    // 1 attempt + max_retries (3).
    assert_eq!(fault.request_count(), 4);
}

#[test]
fn content_length_lie_short_is_an_error_with_ranges() {
    short_every_time(true);
}

#[test]
fn content_length_lie_short_is_an_error_without_ranges() {
    short_every_time(false);
}

#[test]
fn content_length_lie_short_once_is_resumed() {
    let data = random_bytes(2 * MIB, 42);
    let fault =
        FaultServer::start(FaultConfig::new(data.clone()).script([Step::close_after(12345)]));
    let url = fault.url("/disk.img");
    let (got, _) = bounded(60, move || read_all(&url, &opts()).unwrap());
    assert_same(&got, &data);
    let reqs = fault.requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[1].header("range").is_some());
}

#[test]
fn content_length_lie_long_delivers_exactly_content_length() {
    let data = random_bytes(MIB, 43);
    let fault = FaultServer::start(FaultConfig::new(data.clone()).otherwise(Step::extra(4096)));
    let url = fault.url("/disk.img");
    let (got, _) = bounded(60, move || read_all(&url, &opts()).unwrap());
    assert_same(&got, &data);
}

#[test]
fn service_unavailable_twice_then_success() {
    let data = random_bytes(MIB, 51);
    let fault = FaultServer::start(FaultConfig::new(data.clone()).script([
        Step::unavailable(Some(0)),
        Step::unavailable(None),
        Step::ok(),
    ]));
    let url = fault.url("/disk.img");
    let (got, _) = bounded(60, move || read_all(&url, &opts()).unwrap());
    assert_same(&got, &data);
    assert_eq!(fault.request_count(), 3);
}

#[test]
fn retry_after_is_honoured() {
    let data = random_bytes(1000, 52);
    let fault = FaultServer::start(
        FaultConfig::new(data.clone()).script([Step::unavailable(Some(1)), Step::ok()]),
    );
    let url = fault.url("/disk.img");
    let t0 = Instant::now();
    let (got, _) = bounded(60, move || read_all(&url, &opts()).unwrap());
    assert_same(&got, &data);
    // A lower bound only: Retry-After: 1 must be waited for (the back-off alone is 10 ms).
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn service_unavailable_forever_gives_up() {
    let fault = FaultServer::start(FaultConfig::new(vec![1u8; 10]).otherwise(Step::status(503)));
    let url = fault.url("/disk.img");
    let o = HttpOptions {
        max_retries: 2,
        ..opts()
    };
    let err = bounded(60, move || read_all(&url, &o).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
    assert!(err.to_string().contains("503"), "{err}");
    assert_eq!(fault.request_count(), 3);
}

#[test]
fn not_found_is_rejected_without_retries() {
    for code in [404, 403, 401] {
        let fault =
            FaultServer::start(FaultConfig::new(vec![1u8; 10]).otherwise(Step::status(code)));
        let url = fault.url("/disk.img");
        let err = bounded(30, move || read_all(&url, &opts()).unwrap_err());
        eprintln!("error: {err}");
        assert_eq!(err.kind(), ErrorKind::SourceRejected, "{err}");
        assert!(err.to_string().contains(&code.to_string()), "{err}");
        assert!(err.to_string().contains("/disk.img"), "{err}");
        assert_eq!(fault.request_count(), 1);
    }
}

#[test]
fn connection_refused_is_unavailable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/disk.img");
    let o = HttpOptions {
        max_retries: 1,
        ..opts()
    };
    let err = bounded(30, move || read_all(&url, &o).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
}

#[test]
fn stalled_body_fails_within_bounded_time() {
    let data = random_bytes(2 * MIB, 61);
    let fault = FaultServer::start(
        FaultConfig::new(data).otherwise(Step::stall_after(64 * 1024, Duration::from_secs(30))),
    );
    let url = fault.url("/disk.img");
    let o = HttpOptions {
        idle_timeout: Duration::from_millis(300),
        max_retries: 1,
        ..opts()
    };
    let (err, again) = bounded(30, move || {
        let mut src = HttpSource::open(&url, &o).unwrap();
        let mut out = Vec::new();
        let err = src.read_to_end(&mut out).unwrap_err();
        // The failure sticks: later reads fail the same way instead of looking like EOF.
        let again = src.read(&mut [0u8; 10]).unwrap_err();
        (
            Error::from_read(err, "http body"),
            Error::from_read(again, "http body"),
        )
    });
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
    assert!(err.to_string().contains("no data"), "{err}");
    assert_eq!(again.kind(), ErrorKind::SourceUnavailable, "{again}");
    assert_eq!(fault.request_count(), 2);
}

#[test]
fn stalled_headers_fail_within_bounded_time() {
    let data = random_bytes(1000, 62);
    // Stalls before any body byte: the first attempt gets headers then nothing.
    let fault = FaultServer::start(
        FaultConfig::new(data).otherwise(Step::stall_after(0, Duration::from_secs(30))),
    );
    let url = fault.url("/disk.img");
    let o = HttpOptions {
        idle_timeout: Duration::from_millis(300),
        max_retries: 1,
        ..opts()
    };
    let err = bounded(30, move || read_all(&url, &o).unwrap_err());
    eprintln!("error: {err}");
    assert_eq!(err.kind(), ErrorKind::SourceUnavailable, "{err}");
}

#[test]
fn dropping_the_source_mid_body_does_not_hang() {
    let data = random_bytes(4 * MIB, 71);
    let fault = FaultServer::start(FaultConfig::new(data.clone()));
    let url = fault.url("/disk.img");
    bounded(30, move || {
        let o = HttpOptions {
            chunk_depth: 1,
            ..opts()
        };
        let mut src = HttpSource::open(&url, &o).unwrap();
        let mut buf = vec![0u8; 1000];
        src.read_exact(&mut buf).unwrap();
        assert_eq!(buf[..], data[..1000]);
        drop(src);
    });
}

#[test]
fn invalid_urls_and_headers_are_invalid_input() {
    let e = HttpSource::open("not a url", &opts()).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = HttpSource::open("ftp://127.0.0.1/x", &opts())
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let o = HttpOptions {
        headers: vec![("bad header".into(), "v".into())],
        ..opts()
    };
    let e = HttpSource::open("http://127.0.0.1:1/x", &o).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}
