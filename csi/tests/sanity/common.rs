//! Test harness: an in-process server on a unix socket, clients, fixtures that clean up on drop.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use csi::pb::{
    self, controller_client::ControllerClient, identity_client::IdentityClient,
    node_client::NodeClient, volume_capability as vc,
};
use csi::{Driver, DriverConfig, Endpoint};
use provisioner::{PoolConfig, Provisioner, QuotaMode};
use tonic::transport::Channel;

pub const NODE: &str = "node-a";
pub const MIB: i64 = 1 << 20;

/// Prints why a test is skipped and returns from it.
#[macro_export]
macro_rules! require {
    ($cond:expr, $why:expr) => {
        if !$cond {
            eprintln!("SKIP {}: {}", module_path!(), $why);
            return;
        }
    };
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub fn can_loop() -> bool {
    is_root() && Path::new("/dev/loop-control").exists()
}

pub fn has(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

pub struct Server {
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub prov: Arc<Provisioner>,
    pub pools: Vec<PoolConfig>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), csi::Error>>>,
    pub channel: Channel,
}

impl Server {
    /// A server with one plain pool `default` in the temp dir (plus `extra` pools).
    pub async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let pools = vec![
            PoolConfig {
                name: "default".into(),
                path: dir.path().join("pool-default"),
                quota: QuotaMode::Auto,
            },
            PoolConfig {
                name: "second".into(),
                path: dir.path().join("pool-second"),
                quota: QuotaMode::None,
            },
        ];
        Server::start_with(dir, pools).await
    }

    pub async fn start_with(dir: tempfile::TempDir, pools: Vec<PoolConfig>) -> Server {
        let p2 = pools.clone();
        let prov = Arc::new(
            tokio::task::spawn_blocking(move || Provisioner::open(&p2))
                .await
                .unwrap()
                .unwrap(),
        );
        let sock = dir.path().join("csi.sock");
        let driver = Driver::new(
            DriverConfig {
                driver_name: csi::DRIVER_NAME.into(),
                node_id: NODE.into(),
                max_volumes_per_node: 7,
            },
            prov.clone(),
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        let ep = Endpoint::Unix(sock.clone());
        let task = tokio::spawn(async move {
            csi::serve(driver, &ep, async {
                let _ = rx.await;
            })
            .await
        });
        for _ in 0..200 {
            if sock.exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let channel = connect(&sock).await;
        Server {
            dir,
            sock,
            prov,
            pools,
            stop: Some(tx),
            task: Some(task),
            channel,
        }
    }

    /// Stops the server and opens the same pools again (a restart).
    pub async fn restart(mut self) -> Server {
        self.shutdown().await;
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let pools = self.pools.clone();
        Server::start_with(dir, pools).await
    }

    pub async fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }

    pub fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel.clone())
    }
    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }
    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }
    pub fn pool_path(&self, i: usize) -> PathBuf {
        std::fs::canonicalize(&self.pools[i].path).unwrap()
    }
}

pub async fn connect(sock: &Path) -> Channel {
    csi::connect_unix(sock).await.unwrap()
}

pub fn mount_cap() -> pb::VolumeCapability {
    cap(vc::access_mode::Mode::SingleNodeWriter, false)
}

pub fn block_cap() -> pb::VolumeCapability {
    cap(vc::access_mode::Mode::SingleNodeWriter, true)
}

pub fn cap(mode: vc::access_mode::Mode, block: bool) -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_mode: Some(vc::AccessMode { mode: mode as i32 }),
        access_type: Some(if block {
            vc::AccessType::Block(vc::BlockVolume {})
        } else {
            vc::AccessType::Mount(vc::MountVolume::default())
        }),
    }
}

pub fn create_req(name: &str, bytes: i64, cap: pb::VolumeCapability) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        ..Default::default()
    }
}

pub fn in_pool(req: pb::CreateVolumeRequest, pool: &str) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        parameters: HashMap::from([("storagePool".to_string(), pool.to_string())]),
        ..req
    }
}

pub async fn create(s: &Server, req: pb::CreateVolumeRequest) -> pb::Volume {
    s.controller()
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

pub fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> tonic::Code {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(s) => s.code(),
    }
}

/// Whether any mount is at `p`.
pub fn is_mounted(p: &Path) -> bool {
    provisioner::sys::mount::is_mount_point(p).unwrap()
}

/// Loop devices backed by files under `dir`.
pub fn loops_under(dir: &Path) -> Vec<PathBuf> {
    provisioner::sys::loopdev::list()
        .unwrap()
        .into_iter()
        .filter(|a| a.backing.starts_with(dir))
        .map(|a| a.dev)
        .collect()
}

/// Unmounts everything under `dir` and detaches loop devices backed there, whatever a test did.
pub struct Cleanup(pub PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(ms) = provisioner::sys::mount::mounts() {
            for m in ms.iter().rev() {
                if m.mount_point.starts_with(&self.0) {
                    let _ = nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH);
                }
            }
        }
        for dev in loops_under(&self.0) {
            let _ = provisioner::sys::loopdev::detach(&dev);
        }
    }
}

/// A filesystem image mounted through a loop device; unmounted (and its loop released) on drop.
pub struct LoopFs {
    pub mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    /// `mkfs` args, size in MiB, mount options. Err(reason) when it cannot be made here.
    pub fn new(mkfs: &[&str], size_mib: u64, options: &str) -> Result<LoopFs, String> {
        if !can_loop() {
            return Err("needs root and /dev/loop-control".into());
        }
        if !has(mkfs[0]) {
            return Err(format!("{} is not installed", mkfs[0]));
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let img = dir.path().join("fs.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(size_mib << 20))
            .map_err(|e| e.to_string())?;
        let out = Command::new(mkfs[0])
            .args(&mkfs[1..])
            .arg(&img)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "{mkfs:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let out = Command::new("mount")
            .args(["-o", &format!("loop,{options}")])
            .arg(&img)
            .arg(&mnt)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "mount -o loop,{options} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(LoopFs { mnt, _dir: dir })
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        drop(Cleanup(self.mnt.clone()));
        let ok = Command::new("umount")
            .arg(&self.mnt)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}
