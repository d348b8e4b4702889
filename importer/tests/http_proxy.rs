//! HttpSource honours HTTP_PROXY / NO_PROXY from the environment.
//!
//! Its own test binary: it changes the process environment, which no other test may see.
//! The fault server plays a plain-HTTP forward proxy (it records the absolute-form target and
//! serves its body).

use std::io::Read;
use std::time::Duration;

use importer::source::http::{HttpOptions, HttpSource};
use testkit::faults::{FaultConfig, FaultServer};

#[test]
fn http_proxy_from_the_environment_is_used_and_no_proxy_respected() {
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let proxy = FaultServer::start(FaultConfig::new(data.clone()));
    let direct = FaultServer::start(FaultConfig::new(b"direct".to_vec()));
    // SAFETY: set_var and remove_var need that no other thread reads or writes the environment
    // meanwhile. This is the binary's only test, so the harness runs nothing beside it; the only
    // other threads, the two fault servers' accept loops above, never touch the environment; the
    // client thread that reads these variables starts below.
    unsafe {
        for v in [
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            std::env::remove_var(v);
        }
        std::env::set_var("HTTP_PROXY", proxy.url(""));
        std::env::set_var("NO_PROXY", "127.0.0.1");
        std::env::remove_var("no_proxy");
    }
    let opts = HttpOptions {
        connect_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(10),
        max_retries: 0,
        ..HttpOptions::default()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let direct_url = direct.url("/d");
    std::thread::spawn(move || {
        let run = |url: &str| {
            let mut s = HttpSource::open(url, &opts).unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).unwrap();
            out
        };
        let via_proxy = run("http://quarry-proxy-test.invalid/images/disk.img");
        let not_proxied = run(&direct_url);
        tx.send((via_proxy, not_proxied)).unwrap();
    });
    let (via_proxy, not_proxied) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("proxy test did not finish in time");
    assert_eq!(via_proxy, data);
    assert_eq!(not_proxied, b"direct");
    let reqs = proxy.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(
        reqs[0].target,
        "http://quarry-proxy-test.invalid/images/disk.img"
    );
    assert_eq!(reqs[0].header("host"), Some("quarry-proxy-test.invalid"));
    assert_eq!(direct.requests()[0].target, "/d");
}
