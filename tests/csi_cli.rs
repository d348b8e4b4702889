//! End-to-end tests of `quarry csi`, the real binary: it serves on a unix socket and on TCP,
//! answers GetPluginInfo, and on SIGTERM exits 0 promptly and removes its socket; killed
//! (SIGKILL) at each named crash point of an operation, a restarted driver recovers a
//! consistent state.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use csi::pb::{self, identity_client::IdentityClient};
use tonic::transport::Channel;

fn spawn(endpoint: &str, pool: &Path) -> Child {
    spawn_with(endpoint, pool, None)
}

/// Starts `quarry csi`; with `crash_at`, it kills itself at that crash point.
fn spawn_with(endpoint: &str, pool: &Path, crash_at: Option<&str>) -> Child {
    let pools = serde_json::json!([{"name": "default", "path": pool, "quota": "none"}]).to_string();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quarry"));
    cmd.args(["csi", "--endpoint", endpoint, "--node-id", "cli-node"])
        .args(["--pools", &pools])
        .env("RUST_LOG", "info")
        .env_remove(provisioner::crash::CRASH_AT_ENV)
        .stdin(Stdio::null());
    if let Some(point) = crash_at {
        cmd.env(provisioner::crash::CRASH_AT_ENV, point);
    }
    cmd.spawn().expect("spawn quarry csi")
}

/// SIGTERM, then the exit status within `limit`.
async fn terminate(child: &mut Child, limit: Duration) -> ExitStatus {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) takes integers only; `child` is not reaped yet, so `pid` is still its.
    let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(sent, 0);
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
    // SAFETY: kill(2) takes integers only; `child` is not reaped yet, so `pid` is still its.
    let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(sent, 0);
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

mod crash_recovery {
    //! Each test kills the driver (SIGKILL, from inside, at a named point) in the middle of one
    //! operation, restarts it, and checks what a client and the pool see.

    use super::*;
    use csi::pb::controller_client::ControllerClient;
    use csi::pb::node_client::NodeClient;
    use csi::pb::volume_capability as vc;
    use std::os::unix::process::ExitStatusExt;

    const MIB: i64 = 1 << 20;

    /// A driver on a unix socket over a pool in a temp dir, restartable.
    struct Driver {
        dir: tempfile::TempDir,
        child: Child,
        ch: Channel,
    }

    impl Driver {
        async fn start(dir: tempfile::TempDir, crash_at: Option<&str>) -> Driver {
            let sock = dir.path().join("csi.sock");
            let mut child = spawn_with(
                &format!("unix://{}", sock.display()),
                &dir.path().join("pool"),
                crash_at,
            );
            let ch = connect_retry(|| unix_channel(sock.clone()), &mut child).await;
            Driver { dir, child, ch }
        }

        fn pool(&self) -> PathBuf {
            self.dir.path().join("pool")
        }

        fn controller(&self) -> ControllerClient<Channel> {
            ControllerClient::new(self.ch.clone())
        }

        fn node(&self) -> NodeClient<Channel> {
            NodeClient::new(self.ch.clone())
        }

        /// The request in flight must have killed the driver; returns the pool dir for a restart.
        async fn expect_killed<T: std::fmt::Debug>(
            mut self,
            answer: Result<T, tonic::Status>,
        ) -> tempfile::TempDir {
            assert!(answer.is_err(), "the driver answered {answer:?}");
            let start = Instant::now();
            let st = loop {
                if let Some(st) = self.child.try_wait().unwrap() {
                    break st;
                }
                assert!(start.elapsed() < Duration::from_secs(10), "no crash");
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            assert_eq!(st.signal(), Some(libc::SIGKILL), "{st}");
            self.dir
        }

        async fn stop(mut self) -> tempfile::TempDir {
            let st = terminate(&mut self.child, Duration::from_secs(5)).await;
            assert!(st.success(), "{st}");
            self.dir
        }

        async fn volume_ids(&self) -> Vec<String> {
            let r = self
                .controller()
                .list_volumes(pb::ListVolumesRequest::default())
                .await
                .unwrap()
                .into_inner();
            r.entries
                .into_iter()
                .filter_map(|e| e.volume.map(|v| v.volume_id))
                .collect()
        }
    }

    fn capability(block: bool) -> pb::VolumeCapability {
        pb::VolumeCapability {
            access_mode: Some(vc::AccessMode {
                mode: vc::access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(if block {
                vc::AccessType::Block(vc::BlockVolume {})
            } else {
                vc::AccessType::Mount(vc::MountVolume::default())
            }),
        }
    }

    fn create_req(name: &str, bytes: i64, block: bool) -> pb::CreateVolumeRequest {
        pb::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability(block)],
            ..Default::default()
        }
    }

    /// A fresh pool with a ready filesystem volume `v` holding a file, then the driver stopped.
    async fn pool_with_volume() -> tempfile::TempDir {
        let d = Driver::start(tempfile::tempdir().unwrap(), None).await;
        d.controller()
            .create_volume(create_req("v", 8 * MIB, false))
            .await
            .unwrap();
        std::fs::write(d.pool().join("v/disk.img"), vec![0x5au8; 1 << 20]).unwrap();
        d.stop().await
    }

    #[tokio::test]
    async fn create_killed_before_ready_is_rolled_back_and_can_be_retried() {
        let d = Driver::start(tempfile::tempdir().unwrap(), Some("create-volume.built")).await;
        let answer = d
            .controller()
            .create_volume(create_req("v", 8 * MIB, false))
            .await;
        let dir = d.expect_killed(answer).await;
        assert!(
            dir.path().join("pool/v").is_dir(),
            "killed after the dir was made"
        );

        let d = Driver::start(dir, None).await;
        assert!(d.volume_ids().await.is_empty());
        assert!(
            !d.pool().join("v").exists(),
            "the half-made volume is removed"
        );
        let v = d
            .controller()
            .create_volume(create_req("v", 8 * MIB, false))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(v.capacity_bytes, 8 * MIB);
        assert_eq!(d.volume_ids().await, ["v"]);
        d.stop().await;
    }

    #[tokio::test]
    async fn delete_killed_half_way_is_finished_at_restart() {
        let dir = pool_with_volume().await;
        let d = Driver::start(dir, Some("delete-volume.marked")).await;
        let answer = d
            .controller()
            .delete_volume(pb::DeleteVolumeRequest {
                volume_id: "v".into(),
                ..Default::default()
            })
            .await;
        let dir = d.expect_killed(answer).await;

        let d = Driver::start(dir, None).await;
        assert!(d.volume_ids().await.is_empty());
        assert!(!d.pool().join("v").exists());
        // the retried delete the CO sends succeeds
        d.controller()
            .delete_volume(pb::DeleteVolumeRequest {
                volume_id: "v".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        d.stop().await;
    }

    #[tokio::test]
    async fn snapshot_killed_after_copying_is_rolled_back_and_the_source_kept() {
        let dir = pool_with_volume().await;
        let d = Driver::start(dir, Some("create-snapshot.copied")).await;
        let answer = d
            .controller()
            .create_snapshot(pb::CreateSnapshotRequest {
                source_volume_id: "v".into(),
                name: "s".into(),
                ..Default::default()
            })
            .await;
        let dir = d.expect_killed(answer).await;

        let d = Driver::start(dir, None).await;
        let snaps = d
            .controller()
            .list_snapshots(pb::ListSnapshotsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(snaps.entries.is_empty(), "{snaps:?}");
        assert!(!d.pool().join(".quarry/snapshot-data/s").exists());
        assert_eq!(
            std::fs::read(d.pool().join("v/disk.img")).unwrap(),
            vec![0x5au8; 1 << 20],
            "the source volume is untouched"
        );
        d.controller()
            .create_snapshot(pb::CreateSnapshotRequest {
                source_volume_id: "v".into(),
                name: "s".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        d.stop().await;
    }

    #[tokio::test]
    async fn clone_killed_after_copying_is_rolled_back() {
        let dir = pool_with_volume().await;
        let d = Driver::start(dir, Some("create-volume.copied")).await;
        let answer = d
            .controller()
            .create_volume(pb::CreateVolumeRequest {
                volume_content_source: Some(pb::VolumeContentSource {
                    r#type: Some(pb::volume_content_source::Type::Volume(
                        pb::volume_content_source::VolumeSource {
                            volume_id: "v".into(),
                        },
                    )),
                }),
                ..create_req("c", 8 * MIB, false)
            })
            .await;
        let dir = d.expect_killed(answer).await;

        let d = Driver::start(dir, None).await;
        assert_eq!(d.volume_ids().await, ["v"]);
        assert!(!d.pool().join("c").exists());
        d.stop().await;
    }

    #[tokio::test]
    async fn block_expand_killed_after_growing_the_file_is_recorded_at_restart() {
        let d = Driver::start(tempfile::tempdir().unwrap(), None).await;
        d.controller()
            .create_volume(create_req("b", 8 * MIB, true))
            .await
            .unwrap();
        let dir = d.stop().await;
        let d = Driver::start(dir, Some("expand-volume.grown")).await;
        let answer = d
            .controller()
            .controller_expand_volume(pb::ControllerExpandVolumeRequest {
                volume_id: "b".into(),
                capacity_range: Some(pb::CapacityRange {
                    required_bytes: 16 * MIB,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await;
        let dir = d.expect_killed(answer).await;

        let d = Driver::start(dir, None).await;
        let v = d
            .controller()
            .controller_get_volume(pb::ControllerGetVolumeRequest {
                volume_id: "b".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(v.capacity_bytes, 16 * MIB);
        d.stop().await;
    }

    /// Loop devices whose backing file is `file`.
    fn loops_of(file: &Path) -> Vec<String> {
        let out = Command::new("losetup")
            .args(["-n", "-O", "NAME", "-j"])
            .arg(file)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    #[tokio::test]
    async fn block_publish_killed_after_attaching_leaks_no_loop_device() {
        let root = nix_is_root() && Path::new("/dev/loop-control").exists();
        if !root {
            eprintln!("SKIP: needs root and loop devices");
            return;
        }
        let d = Driver::start(tempfile::tempdir().unwrap(), None).await;
        d.controller()
            .create_volume(create_req("b", 8 * MIB, true))
            .await
            .unwrap();
        let dir = d.stop().await;
        let backing = std::fs::canonicalize(dir.path().join("pool/b/disk.img")).unwrap();
        let target = dir.path().join("publish/b");
        let publish = pb::NodePublishVolumeRequest {
            volume_id: "b".into(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability(true)),
            ..Default::default()
        };

        let d = Driver::start(dir, Some("publish-block.attached")).await;
        let answer = d.node().node_publish_volume(publish.clone()).await;
        let dir = d.expect_killed(answer).await;
        assert_eq!(
            loops_of(&backing).len(),
            1,
            "killed with the device attached"
        );

        let d = Driver::start(dir, None).await;
        assert!(loops_of(&backing).is_empty(), "released at restart");
        // and the retried publish works, then unpublish releases the device again
        d.node().node_publish_volume(publish).await.unwrap();
        assert_eq!(loops_of(&backing).len(), 1);
        d.node()
            .node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
                volume_id: "b".into(),
                target_path: target.display().to_string(),
            })
            .await
            .unwrap();
        assert!(loops_of(&backing).is_empty());
        d.stop().await;
    }

    fn nix_is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }
}
