//! The uploader through its library API, no `quarry` process: the upload server's router
//! (`uploader::server`) behind the token-checking proxy (`uploader::proxy`), each served with
//! `uploader::net::serve` on a loopback port, and images sent by the resumable client
//! (`uploader::client`) with tokens signed by `token`. Every written target is compared byte for
//! byte with `qemu-img convert -O raw` of the image sent; refusals are checked by their HTTP
//! status and error kind, and by what they leave behind (nothing).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use testkit::qemu::{assert_same, convert_to_raw, qemu_img};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use uploader::client::{Counters, UploadReport, UploadRequest};
use uploader::proxy::{Proxy, Upstreams};
use uploader::reload::ReloadingUpstream;
use uploader::{Error, ErrorKind, UPLOAD_STATE};

const NAMESPACE: &str = "vms";
const PVC: &str = "disk";
/// Bound on anything the tests wait for.
const LIMIT: Duration = Duration::from_secs(60);

/// A router served on 127.0.0.1 (the listener is bound before this returns, so a request can
/// be sent at once); stopped, and checked to stop cleanly, by [`Served::stop`].
struct Served {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<uploader::Result<()>>,
}

impl Served {
    async fn start(router: axum::Router) -> Served {
        let listener = uploader::net::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(uploader::net::serve(
            listener,
            None,
            router,
            uploader::limits::Limits::default(),
            async {
                let _ = stopped.await;
            },
        ));
        Served { addr, stop, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let served = tokio::time::timeout(LIMIT, self.task)
            .await
            .expect("the server stops")
            .unwrap();
        served.expect("the server ends without an error");
    }
}

/// An upload server writing `target`, behind a proxy that routes `vms/disk` to it and checks
/// tokens with the public key of `key`.
struct Stack {
    server: Served,
    proxy: Served,
    /// Turns true once an upload succeeded (the router's own signal).
    succeeded: watch::Receiver<bool>,
}

impl Stack {
    async fn start(target: &Path, public_key: &Path) -> Stack {
        let (router, succeeded) = uploader::server::router(uploader::server::Config {
            target: target.to_path_buf(),
            size: None,
            filesystem_overhead: None,
            preallocate: false,
            archive: false,
            resume_window: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(30),
        });
        let server = Served::start(router).await;
        let routes = [((NAMESPACE.to_string(), PVC.to_string()), server.url())];
        let proxy = uploader::proxy::router(Proxy {
            public_key: token::load_public_key(public_key).unwrap(),
            upstreams: Upstreams::Static(routes.into()),
            client: ReloadingUpstream::new(None, None).unwrap(),
            upstream_wait: Duration::from_secs(5),
        });
        let proxy = Served::start(proxy).await;
        Stack {
            server,
            proxy,
            succeeded,
        }
    }

    /// Sends `file` through the proxy with the client `quarry upload` uses.
    async fn upload(
        &self,
        file: &Path,
        token: &str,
        checksum: Option<String>,
    ) -> uploader::Result<UploadReport> {
        let req = UploadRequest {
            file: file.to_path_buf(),
            url: self.proxy.url(),
            token: token.to_string(),
            ca_certs: Vec::new(),
            insecure: false,
            resume: true,
            retries: 0,
            checksum,
        };
        tokio::time::timeout(
            LIMIT,
            uploader::client::upload(&req, Arc::new(Counters::default())),
        )
        .await
        .expect("the upload ends")
    }

    /// `Upload-State` as the server itself (not the proxy) answers `HEAD` on the async path.
    async fn server_state(&self) -> String {
        let client = netkit::client_builder(&netkit::HttpOptions::default())
            .unwrap()
            .build()
            .unwrap();
        let resp = client
            .head(format!("{}/v1beta1/upload-async", self.server.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.headers()[UPLOAD_STATE].to_str().unwrap().to_string()
    }

    async fn stop(self) {
        self.proxy.stop().await;
        self.server.stop().await;
    }
}

/// A signing key and its public key's file, from `token`'s own generator.
fn keys(dir: &Path) -> (token::PrivateKey, PathBuf) {
    let (private, public) = token::generate().unwrap();
    let path = dir.join("public.pem");
    std::fs::write(&path, public).unwrap();
    (
        token::private_key_from_pem(&private, "the test key").unwrap(),
        path,
    )
}

/// A token for `vms/disk` issued `age` seconds ago, valid for five minutes from then.
fn upload_token(key: &token::PrivateKey, age: i64) -> String {
    let claims =
        token::Claims::upload(NAMESPACE, PVC, token::now() - age, Duration::from_secs(300));
    token::sign(&claims, key).unwrap()
}

/// A 6 MiB raw disk: pseudo-random data with a 2 MiB hole and a zero tail.
fn raw_disk(dir: &Path) -> PathBuf {
    let mut data = vec![0u8; 6 << 20];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for (i, b) in data.iter_mut().enumerate() {
        if (1 << 20..3 << 20).contains(&i) || i >= (6 << 20) - (256 << 10) {
            continue;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 56) as u8 | 1;
    }
    let path = dir.join("disk.raw");
    std::fs::write(&path, data).unwrap();
    path
}

/// `qemu-img convert -O raw` of `image`, read back.
fn reference(image: &Path, dir: &Path) -> Vec<u8> {
    let raw = dir.join("reference.raw");
    convert_to_raw(image, &raw);
    std::fs::read(raw).unwrap()
}

/// The names in `dir` (a refused upload must leave no target and no partial file).
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn refusal_status(e: &Error) -> u16 {
    match e {
        Error::Refused { status, .. } => *status,
        other => panic!("expected an HTTP refusal, got {other:?}"),
    }
}

/// A scratch folder for the images and an empty volume folder (kept while the TempDir lives).
fn dirs() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (work, volume) = (dir.path().join("work"), dir.path().join("volume"));
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&volume).unwrap();
    (dir, work, volume)
}

/// A refused upload left the volume empty and the server idle, waiting for a new one.
async fn assert_nothing_received(stack: &Stack, volume: &Path) {
    assert!(names(volume).is_empty(), "left behind: {:?}", names(volume));
    assert_eq!(stack.server_state().await, "idle");
    assert!(!*stack.succeeded.borrow());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qcow2_sent_through_the_proxy_is_written_as_qemu_img_reads_it_and_a_second_upload_gets_409()
 {
    let (_dir, work, volume) = dirs();
    let raw = raw_disk(&work);
    let qcow2 = work.join("disk.qcow2");
    qemu_img(&[
        "convert".as_ref(),
        "-O".as_ref(),
        "qcow2".as_ref(),
        raw.as_os_str(),
        qcow2.as_os_str(),
    ]);
    let expected = reference(&qcow2, &work);
    let (key, public) = keys(&work);
    let target = volume.join("disk.img");
    let mut stack = Stack::start(&target, &public).await;
    assert_eq!(stack.server_state().await, "idle");

    let token = upload_token(&key, 0);
    let report = stack.upload(&qcow2, &token, None).await.unwrap();
    let sent = std::fs::metadata(&qcow2).unwrap().len();
    assert!(
        report.asynchronous,
        "the server answers HEAD on the async path"
    );
    assert!(
        report.url.ends_with("/v1beta1/upload-async"),
        "{}",
        report.url
    );
    assert_eq!(
        (report.bytes, report.bytes_sent, report.attempts),
        (sent, sent, 1)
    );
    assert!(report.resumed_from.is_empty());

    // The async answer comes once every byte is received; the router says when it is written.
    tokio::time::timeout(LIMIT, stack.succeeded.wait_for(|done| *done))
        .await
        .expect("the upload is written")
        .unwrap();
    assert_same(
        "the uploaded qcow2",
        &std::fs::read(&target).unwrap(),
        &expected,
    );
    assert_eq!(names(&volume), ["disk.img"], "no partial file is left");
    assert_eq!(stack.server_state().await, "done");

    // The volume is complete: another upload, even a valid one, is refused with CDI's 409 and
    // the target is untouched.
    let e = stack.upload(&raw, &token, None).await.unwrap_err();
    assert_eq!(refusal_status(&e), 409, "{e}");
    assert_eq!(e.kind(), ErrorKind::Refused);
    assert!(!e.kind().is_retryable());
    assert!(e.to_string().contains("already succeeded"), "{e}");
    assert_same(
        "the volume after a refused upload",
        &std::fs::read(&target).unwrap(),
        &expected,
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_image_with_a_checksum_is_verified_on_the_sync_path() {
    let (_dir, work, volume) = dirs();
    let raw = raw_disk(&work);
    let expected = reference(&raw, &work);
    let (key, public) = keys(&work);
    let target = volume.join("disk.img");
    let stack = Stack::start(&target, &public).await;
    let token = upload_token(&key, 0);

    // A checksum the image does not have: the server's verdict (500) comes back on the sync
    // path, nothing is left, and the server takes a new upload.
    let wrong = format!("sha256:{}", "0".repeat(64));
    let e = stack.upload(&raw, &token, Some(wrong)).await.unwrap_err();
    assert_eq!(refusal_status(&e), 500, "{e}");
    assert_eq!(e.kind(), ErrorKind::Refused);
    assert!(e.to_string().contains("Saving stream failed"), "{e}");
    assert_nothing_received(&stack, &volume).await;

    let digest = Sha256::digest(std::fs::read(&raw).unwrap());
    let right = format!(
        "sha256:{}",
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let report = stack.upload(&raw, &token, Some(right)).await.unwrap();
    assert!(!report.asynchronous, "a checksum waits for the verdict");
    assert!(report.url.ends_with("/v1beta1/upload"), "{}", report.url);
    // Answered after the image is written and synced: no waiting needed.
    assert!(*stack.succeeded.borrow());
    assert_same(
        "the uploaded raw image",
        &std::fs::read(&target).unwrap(),
        &expected,
    );
    assert_eq!(names(&volume), ["disk.img"]);
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_refuses_expired_and_malformed_tokens_before_the_server_sees_a_byte() {
    let (_dir, work, volume) = dirs();
    let raw = raw_disk(&work);
    let (key, public) = keys(&work);
    let stack = Stack::start(&volume.join("disk.img"), &public).await;

    // Signed with the right key, but its five minutes ended ten minutes ago: 401.
    let expired = upload_token(&key, 900);
    let e = stack.upload(&raw, &expired, None).await.unwrap_err();
    assert!(matches!(e, Error::Unauthorized(_)), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::Unauthorized);
    assert!(!e.kind().is_retryable());

    // Not a JWT at all: 400.
    let e = stack.upload(&raw, "not-a-token", None).await.unwrap_err();
    assert_eq!(refusal_status(&e), 400, "{e}");
    assert!(e.to_string().contains("three dot-separated parts"), "{e}");

    assert_nothing_received(&stack, &volume).await;
    stack.stop().await;
}
