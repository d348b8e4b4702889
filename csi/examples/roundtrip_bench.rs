//! Round-trip benchmark of the CSI driver over its unix socket: CreateVolume, NodePublishVolume,
//! NodeUnpublishVolume, DeleteVolume, one volume after the other, as the kubelet and the
//! external-provisioner would drive them. Runs as root (real bind mounts, loop devices).
//!
//! ```text
//! cargo run --release -p csi --example roundtrip_bench -- [--count N] [--block] [--both]
//! ```
//!
//! Starts the driver in-process over a temp-dir pool, prints volumes per second and the
//! p50/p99/max latency of the whole round trip and of each call, and removes everything it made
//! (mounts, loop devices, the pool). `csi/tests/roundtrip.rs` runs the same code with a few round
//! trips.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi::pb::{
    self, controller_client::ControllerClient, node_client::NodeClient, volume_capability as vc,
};
use csi::{Driver, DriverConfig, Endpoint};
use provisioner::{PoolConfig, Provisioner, QuotaMode};
use tonic::transport::Channel;

/// Size of each benchmark volume: tiny, so block volumes cost a sparse file and a loop device.
pub const VOLUME_BYTES: i64 = 4 << 20;

/// The four calls of a round trip, in order.
pub const CALLS: [&str; 4] = [
    "CreateVolume",
    "NodePublish",
    "NodeUnpublish",
    "DeleteVolume",
];

/// Latencies of one benchmark pass.
#[derive(Debug, Default)]
pub struct Report {
    /// Filesystem or block volumes.
    pub block: bool,
    /// Wall time of the whole pass.
    pub elapsed: Duration,
    /// One entry per round trip.
    pub round_trips: Vec<Duration>,
    /// Per call (in [`CALLS`] order), one entry per round trip.
    pub calls: [Vec<Duration>; 4],
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Report {
    /// Round trips per second over the whole pass.
    pub fn volumes_per_second(&self) -> f64 {
        self.round_trips.len() as f64 / self.elapsed.as_secs_f64()
    }

    fn line(name: &str, v: &[Duration]) -> String {
        let mut s = v.to_vec();
        s.sort();
        format!(
            "  {name:<14} p50 {:>8.3} ms   p99 {:>8.3} ms   max {:>8.3} ms",
            ms(percentile(&s, 50.0)),
            ms(percentile(&s, 99.0)),
            ms(s.last().copied().unwrap_or_default()),
        )
    }

    /// The human-readable summary.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{} mode: {} round trips in {:.2} s = {:.1} volumes/s\n",
            if self.block { "block" } else { "filesystem" },
            self.round_trips.len(),
            self.elapsed.as_secs_f64(),
            self.volumes_per_second()
        );
        out += &Self::line("round trip", &self.round_trips);
        out.push('\n');
        for (name, v) in CALLS.iter().zip(&self.calls) {
            out += &Self::line(name, v);
            out.push('\n');
        }
        out
    }
}

/// Unmounts everything under a directory and detaches loop devices backed there.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(ms) = provisioner::sys::mount::mounts() {
            for m in ms.iter().rev() {
                if m.mount_point.starts_with(&self.0) {
                    let _ = nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH);
                }
            }
        }
        if let Ok(loops) = provisioner::sys::loopdev::list() {
            for l in loops.into_iter().filter(|l| l.backing.starts_with(&self.0)) {
                let _ = provisioner::sys::loopdev::detach(&l.dev);
            }
        }
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

/// Runs `count` sequential round trips against a fresh in-process driver over a temp-dir pool
/// and cleans up after itself (also when a call fails).
pub async fn run(count: usize, block: bool) -> Result<Report, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let root = std::fs::canonicalize(dir.path())?;
    let _cleanup = Cleanup(root.clone());
    let pools = vec![PoolConfig {
        mounted: false,
        name: "bench".into(),
        path: root.join("pool"),
        quota: QuotaMode::Auto,
    }];
    let prov = tokio::task::spawn_blocking(move || Provisioner::open(&pools)).await??;
    let driver = Driver::new(
        DriverConfig {
            driver_name: csi::DRIVER_NAME.into(),
            node_id: "bench-node".into(),
            max_volumes_per_node: 0,
        },
        Arc::new(prov),
    );
    let sock = root.join("csi.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let ep = Endpoint::Unix(sock.clone());
    let server = tokio::spawn(async move {
        csi::serve(driver, &ep, async {
            let _ = stopped.await;
        })
        .await
    });
    for _ in 0..500 {
        if sock.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let channel = csi::connect_unix(&sock).await?;
    let result = round_trips(channel, &root, count, block).await;
    let _ = stop.send(());
    server.await??;
    let mut report = result?;
    report.block = block;
    Ok(report)
}

async fn round_trips(
    channel: Channel,
    root: &Path,
    count: usize,
    block: bool,
) -> Result<Report, Box<dyn std::error::Error>> {
    let mut ctl = ControllerClient::new(channel.clone());
    let mut node = NodeClient::new(channel);
    let mut report = Report::default();
    let cap = capability(block);
    let pods = root.join("pods");
    let start = Instant::now();
    for i in 0..count {
        let name = format!("bench-{i:06}");
        let target = if block {
            pods.join(&name).join("dev")
        } else {
            pods.join(&name).join("mount")
        };
        let target = target.to_string_lossy().into_owned();
        let mut t = [Duration::ZERO; 4];

        let t0 = Instant::now();
        let vol = ctl
            .create_volume(pb::CreateVolumeRequest {
                name: name.clone(),
                capacity_range: Some(pb::CapacityRange {
                    required_bytes: VOLUME_BYTES,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap.clone()],
                ..Default::default()
            })
            .await?
            .into_inner()
            .volume
            .ok_or("CreateVolume returned no volume")?;
        t[0] = t0.elapsed();

        let t1 = Instant::now();
        node.node_publish_volume(pb::NodePublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            target_path: target.clone(),
            volume_capability: Some(cap.clone()),
            volume_context: vol.volume_context.clone(),
            ..Default::default()
        })
        .await?;
        t[1] = t1.elapsed();

        let t2 = Instant::now();
        node.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            target_path: target,
        })
        .await?;
        t[2] = t2.elapsed();

        let t3 = Instant::now();
        ctl.delete_volume(pb::DeleteVolumeRequest {
            volume_id: vol.volume_id,
            secrets: Default::default(),
        })
        .await?;
        t[3] = t3.elapsed();

        report.round_trips.push(t0.elapsed());
        for (k, d) in t.into_iter().enumerate() {
            report.calls[k].push(d);
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut count = 200usize;
    let mut modes = vec![false, true];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--count" => count = args.next().ok_or("--count needs a number")?.parse()?,
            "--block" => modes = vec![true],
            "--filesystem" => modes = vec![false],
            "--both" => modes = vec![false, true],
            "-h" | "--help" => {
                println!("roundtrip_bench [--count N] [--block | --filesystem | --both]");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(
            "the benchmark bind-mounts volumes and attaches loop devices: run as root".into(),
        );
    }
    for block in modes {
        // one warm-up round trip, not counted
        run(1, block).await?;
        let report = run(count, block).await?;
        print!("{}", report.render());
    }
    Ok(())
}
