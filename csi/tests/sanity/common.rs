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

/// Set (by the guest-kernel run, see `guest.rs`) where everything the tests need is there, so
/// a missing piece fails a test instead of skipping it.
pub const NO_SKIP_ENV: &str = "QUARRY_NO_SKIP";

/// Prints why a test is skipped and returns from it; panics instead where [`NO_SKIP_ENV`] is set.
#[macro_export]
macro_rules! require {
    ($cond:expr, $why:expr) => {
        if !$cond {
            if std::env::var_os($crate::common::NO_SKIP_ENV).is_some() {
                panic!("{} cannot run here: {}", module_path!(), $why);
            }
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
    which(cmd).is_some()
}

/// Where `cmd` is on PATH.
pub fn which(cmd: &str) -> Option<PathBuf> {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
}

/// Writes `len` bytes to `path` as a pod's container would: from a thread without
/// CAP_SYS_RESOURCE, which (on ext4 and other quota-v2 filesystems) lets a writer past hard
/// quota limits. Capabilities belong to a thread, so the rest of the test keeps them.
pub fn write_as_unprivileged(path: &Path, len: usize) -> std::io::Result<()> {
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        drop_effective_capability(CAP_SYS_RESOURCE)?;
        std::fs::write(path, vec![1u8; len])
    })
    .join()
    .unwrap()
}

const CAP_SYS_RESOURCE: u32 = 24;

/// Clears capability `cap` from the calling thread's effective set (capget/capset, version 3).
fn drop_effective_capability(cap: u32) -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: version 3 headers take two data structs; both live across the calls.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    data[(cap / 32) as usize].effective &= !(1 << (cap % 32));
    // SAFETY: as above; pid 0 is the calling thread.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
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
        let pools = two_pools(dir.path(), dir.path());
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
        let channel = connect_when_listening(&sock).await;
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

/// Connects once the server listens. The socket file appears at bind(), before listen(), so a
/// connect in between is refused: retry for up to 20 s.
async fn connect_when_listening(sock: &Path) -> Channel {
    let mut last = None;
    for _ in 0..2000 {
        match csi::connect_unix(sock).await {
            Ok(channel) => return channel,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!(
        "the CSI server never listened on {}: {last:?}",
        sock.display()
    )
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

pub fn expand_req(id: &str, bytes: i64) -> pb::ControllerExpandVolumeRequest {
    pb::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

pub fn delete_req(id: &str) -> pb::DeleteVolumeRequest {
    pb::DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    }
}

pub async fn delete_volume(s: &Server, id: &str) {
    s.controller().delete_volume(delete_req(id)).await.unwrap();
}

/// GetCapacity holds back what bounded volumes may still grow into: it promises less than the
/// filesystem at `mnt` has free.
pub async fn assert_capacity_holds_back(s: &Server, mnt: &Path) {
    let cap = s
        .controller()
        .get_capacity(pb::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    let free = nix::sys::statvfs::statvfs(mnt).unwrap();
    let free = free.blocks_available() * free.fragment_size();
    assert!(
        (cap.available_capacity as u64) < free,
        "{} promised with {free} free",
        cap.available_capacity
    );
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
/// The pools of [`Server::start`]: `default` (quota auto) under `default_root`, `second` (no
/// quota) under `second_root`.
pub fn two_pools(default_root: &Path, second_root: &Path) -> Vec<PoolConfig> {
    vec![
        PoolConfig {
            mounted: false,
            name: "default".into(),
            path: default_root.join("pool-default"),
            quota: QuotaMode::Auto,
        },
        PoolConfig {
            mounted: false,
            name: "second".into(),
            path: second_root.join("pool-second"),
            quota: QuotaMode::None,
        },
    ]
}

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
        let mut mount = Command::new("mount");
        // Named, so a mount that probes (busybox's) does not try every filesystem first.
        if let Some(fstype) = mkfs[0].strip_prefix("mkfs.") {
            mount.args(["-t", fstype]);
        }
        let out = mount
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
        // Cleanup unmounts everything at or below mnt: a leftover mount gets the command.
        drop(Cleanup(self.mnt.clone()));
        if !provisioner::sys::mount::is_mount_point(&self.mnt).unwrap_or(true) {
            return;
        }
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
