//! End-to-end tests of `quarry csi`, the real binary: it serves on a unix socket and on TCP,
//! answers GetPluginInfo, and on SIGTERM exits 0 promptly and removes its socket.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use csi::pb::{self, identity_client::IdentityClient};
use tonic::transport::Channel;

fn spawn(endpoint: &str, pool: &Path) -> Child {
    let pools = serde_json::json!([{"name": "default", "path": pool, "quota": "none"}]).to_string();
    Command::new(env!("CARGO_BIN_EXE_quarry"))
        .args(["csi", "--endpoint", endpoint, "--node-id", "cli-node"])
        .args(["--pools", &pools])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn quarry csi")
}

/// SIGTERM, then the exit status within `limit`.
async fn terminate(child: &mut Child, limit: Duration) -> ExitStatus {
    let pid = child.id() as libc::pid_t;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("quarry csi did not exit within {limit:?} of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Retries `connect` until the server answers or `limit` passes.
async fn connect_retry<F, Fut>(mut connect: F, child: &mut Child) -> Channel
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Channel, tonic::transport::Error>>,
{
    let start = Instant::now();
    loop {
        if let Ok(ch) = connect().await {
            return ch;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("quarry csi exited early: {st}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "quarry csi did not listen within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn unix_channel(sock: PathBuf) -> Result<Channel, tonic::transport::Error> {
    csi::connect_unix(&sock).await
}

async fn plugin_info(ch: Channel) -> pb::GetPluginInfoResponse {
    IdentityClient::new(ch)
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await
        .expect("GetPluginInfo")
        .into_inner()
}

fn assert_info(info: &pb::GetPluginInfoResponse) {
    assert_eq!(info.name, csi::DRIVER_NAME);
    assert!(!info.vendor_version.is_empty());
}

#[tokio::test]
async fn serves_on_a_unix_socket_and_removes_it_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("plugins/csi.sock");
    let mut child = spawn(
        &format!("unix://{}", sock.display()),
        &dir.path().join("pool"),
    );
    let ch = connect_retry(|| unix_channel(sock.clone()), &mut child).await;
    assert_info(&plugin_info(ch.clone()).await);
    // the client stays connected, as the kubelet and the sidecars do: it must not hold up exit
    let st = terminate(&mut child, Duration::from_secs(5)).await;
    assert!(st.success(), "exit status {st}");
    assert!(!sock.exists(), "the socket is removed on exit");
    drop(ch);
}

#[tokio::test]
async fn replaces_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    // a socket left behind by a killed server
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let mut child = spawn(
        &format!("unix://{}", sock.display()),
        &dir.path().join("pool"),
    );
    let ch = connect_retry(|| unix_channel(sock.clone()), &mut child).await;
    assert_info(&plugin_info(ch).await);
    let st = terminate(&mut child, Duration::from_secs(5)).await;
    assert!(st.success(), "exit status {st}");
    assert!(!sock.exists());
}

#[tokio::test]
async fn serves_on_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = spawn(&format!("tcp://127.0.0.1:{port}"), &dir.path().join("pool"));
    let url = format!("http://127.0.0.1:{port}");
    let ch = connect_retry(
        || {
            let ep = tonic::transport::Endpoint::try_from(url.clone()).unwrap();
            async move { ep.connect().await }
        },
        &mut child,
    )
    .await;
    assert_info(&plugin_info(ch.clone()).await);
    drop(ch);
    let st = terminate(&mut child, Duration::from_secs(5)).await;
    assert!(st.success(), "exit status {st}");
}

#[test]
fn bad_endpoint_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quarry"))
        .args(["csi", "--endpoint", "http://x", "--node-id", "n"])
        .args([
            "--pools",
            &serde_json::json!([{"name": "d", "path": dir.path().join("p")}]).to_string(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("endpoint"));
}

/// A connected client that stops answering (its runtime is blocked here) cannot hold up
/// shutdown past the grace period.
#[tokio::test]
async fn a_hung_client_does_not_block_exit() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    let mut child = spawn(
        &format!("unix://{}", sock.display()),
        &dir.path().join("pool"),
    );
    let ch = connect_retry(|| unix_channel(sock.clone()), &mut child).await;
    assert_info(&plugin_info(ch.clone()).await);
    // blocks this (single-threaded) runtime: the client cannot react to GOAWAY
    let pid = child.id() as libc::pid_t;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let start = Instant::now();
    let limit = csi::SHUTDOWN_GRACE + Duration::from_secs(5);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("quarry csi did not exit within {limit:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success(), "exit status {st}");
    assert!(!sock.exists());
    drop(ch);
}
