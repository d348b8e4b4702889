//! A controller process's work, once stopped, leaves nothing of it running. A leader's work is
//! a future that `kubekit::leader::Elector::lead_on` drops when the Lease is lost; whatever it
//! had started must end with it, or the next term runs beside the last (every write made twice)
//! or beside another replica that leads now.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cdi::datavolume::controller::Context;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

/// The request paths of the connections still open, by connection.
type Open = Arc<Mutex<BTreeMap<u64, String>>>;

/// An API server that takes every request and never answers it: each list or watch a
/// controller starts holds its connection open until the controller lets it go.
async fn silent_api_server() -> (String, Open) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let open = Open::default();
    let seen = open.clone();
    tokio::spawn(async move {
        for id in 0u64.. {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let open = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            head.extend_from_slice(&buf[..n]);
                            if head.len() < 64 << 10 {
                                let line = String::from_utf8_lossy(&head);
                                if let Some(first) = line.lines().next() {
                                    open.lock().unwrap().insert(id, first.to_string());
                                }
                            }
                        }
                    }
                }
                open.lock().unwrap().remove(&id);
            });
        }
    });
    (url, open)
}

/// Waits until `done` holds of the open connections' paths; fails naming them after `limit`.
async fn wait_until(open: &Open, what: &str, limit: Duration, done: impl Fn(&[String]) -> bool) {
    let start = Instant::now();
    loop {
        let paths: Vec<String> = open.lock().unwrap().values().cloned().collect();
        if done(&paths) {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{what}: still open after {limit:?}: {paths:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_cdi_process_leaves_none_of_its_controllers_running() {
    let (url, open) = silent_api_server().await;
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let ctx = Arc::new(Context::new(client, Default::default(), Arc::default()));
    let work = tokio::spawn(async move { operators::process::cdi(ctx, None).await });

    // Every part of the process has asked for its first answer: the DataVolume reconciler, the
    // shared PVC and pod watches, the populators (registering themselves), the CDIConfig (the
    // CDI CR first) and StorageProfile reconcilers, DataSources and DataImportCrons.
    let parts = [
        "/datavolumes?",
        "/persistentvolumeclaims?",
        "/pods?",
        "/volumepopulators/",
        "/cdis?",
        "/storageprofiles?",
        "/datasources?",
        "/dataimportcrons?",
    ];
    wait_until(
        &open,
        "the process starting",
        Duration::from_secs(60),
        |paths| {
            parts
                .iter()
                .all(|part| paths.iter().any(|p| p.contains(part)))
        },
    )
    .await;

    // Stopped as a lost Lease stops it: the future is dropped.
    work.abort();
    let _ = work.await;
    wait_until(
        &open,
        "the process stopped",
        Duration::from_secs(30),
        |paths| paths.is_empty(),
    )
    .await;
}
