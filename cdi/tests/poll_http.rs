//! DataImportCron polling (`cdi::golden::poll`) against a real nginx: many simultaneous polls
//! of one URL agree on its version, and all see a new one once it is published. Moved from the
//! root `tests/cron_local.rs`, whose other tests drive the `quarry` binary.

use std::fs;

use testkit::nginx::{Nginx, NginxConfig};

/// Version `version` of a 1 MiB disk.
fn disk(version: u8) -> Vec<u8> {
    (0..1u32 << 20)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(version))
        .collect()
}

/// Load, bounded: this many polls of one nginx at once.
const CONCURRENT_POLLS: usize = 16;

/// The versions `CONCURRENT_POLLS` simultaneous polls of `url` find (within 60 s).
fn poll_together(url: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opts = importer::source::http::HttpOptions::default();
        let polls = (0..CONCURRENT_POLLS).map(|_| {
            let (url, opts) = (url.to_string(), opts.clone());
            tokio::spawn(async move {
                cdi::golden::poll::http_version(&url, &opts)
                    .await
                    .map(|v| v.digest())
            })
        });
        let all = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            futures_util::future::join_all(polls),
        )
        .await
        .expect("the polls finish within 60 s");
        all.into_iter()
            .map(|r| r.unwrap().unwrap_or_else(|e| panic!("a poll failed: {e}")))
            .collect()
    })
}

#[test]
fn concurrent_polls_of_one_nginx_agree_on_each_version() {
    let www = tempfile::tempdir().unwrap();
    let file = www.path().join("disk.img");
    fs::write(&file, disk(1)).unwrap();
    let nginx = Nginx::start(NginxConfig {
        root: www.path().to_path_buf(),
        ranges: true,
        ..Default::default()
    });
    let url = nginx.url("/disk.img");
    let first = poll_together(&url);
    assert_eq!(first.len(), CONCURRENT_POLLS);
    assert!(first.iter().all(|v| *v == first[0]), "{first:?}");
    // A new version (other length, so another ETag whatever the clock): every poll sees it.
    fs::write(&file, [disk(2), disk(2)].concat()).unwrap();
    let second = poll_together(&url);
    assert!(second.iter().all(|v| *v == second[0]), "{second:?}");
    assert_ne!(second[0], first[0]);
}
