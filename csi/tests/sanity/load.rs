//! Many volumes at once: full create / publish / write / read-back / unpublish / delete cycles
//! with 8 and 64 in flight, in mount and in block mode, as external-provisioner's workers and a
//! node's pods drive a driver. Every call must succeed (each create is sent twice: the second
//! must return the same volume), and afterwards nothing may be left: no mount, loop device,
//! volume directory or metadata file. Without root the cycles skip publish/write/read-back.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi::pb;

use crate::common::*;

const CYCLES: usize = 200;
const BYTES: usize = 64 << 10;

/// One cycle for volume `id`; Err says which step failed and how.
async fn cycle(s: Arc<Server>, id: String, block: bool, publish: bool) -> Result<(), String> {
    let capability = if block { block_cap() } else { mount_cap() };
    let mut c = s.controller();
    let mut n = s.node();
    let req = create_req(&id, MIB, capability.clone());
    let first = c
        .create_volume(req.clone())
        .await
        .map_err(|e| format!("create: {e:?}"))?;
    let again = c
        .create_volume(req)
        .await
        .map_err(|e| format!("repeated create: {e:?}"))?;
    if first.into_inner().volume != again.into_inner().volume {
        return Err("a repeated create returned another volume".into());
    }
    if publish {
        let target = s.dir.path().join("pods").join(&id).join("vol");
        n.node_publish_volume(pb::NodePublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(capability),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("publish: {e:?}"))?;
        let pattern: Vec<u8> = id.bytes().cycle().take(BYTES).collect();
        let t = target.clone();
        tokio::task::spawn_blocking(move || write_and_read_back(&t, block, &pattern))
            .await
            .unwrap()
            .map_err(|e| format!("write/read-back at {}: {e}", target.display()))?;
        n.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.to_string_lossy().into(),
        })
        .await
        .map_err(|e| format!("unpublish: {e:?}"))?;
    }
    c.delete_volume(pb::DeleteVolumeRequest {
        volume_id: id,
        ..Default::default()
    })
    .await
    .map_err(|e| format!("delete: {e:?}"))?;
    Ok(())
}

fn write_and_read_back(target: &Path, block: bool, pattern: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let path: PathBuf = if block {
        target.to_path_buf()
    } else {
        target.join("data")
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(!block)
        .truncate(false)
        .open(&path)?;
    f.write_all_at(pattern, 4096)?;
    f.sync_all()?;
    let mut back = vec![0u8; pattern.len()];
    f.read_exact_at(&mut back, 4096)?;
    if back != pattern {
        return Err(std::io::Error::other("read back other bytes than written"));
    }
    Ok(())
}

async fn run(in_flight: usize, block: bool) {
    let publish = if block { can_loop() } else { is_root() };
    if !publish {
        eprintln!("load: not root (or no loop devices): cycles skip publish, write and read-back");
    }
    let s = Arc::new(Server::start().await);
    let _c = Cleanup(s.dir.path().to_path_buf());
    let gate = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..CYCLES {
        let (s, gate) = (s.clone(), gate.clone());
        let id = format!("load-{}-{i}", if block { "blk" } else { "fs" });
        set.spawn(async move {
            let _slot = gate.acquire_owned().await.unwrap();
            cycle(s, id.clone(), block, publish)
                .await
                .map_err(|e| format!("{id}: {e}"))
        });
    }
    let failures: Vec<String> = set
        .join_all()
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {CYCLES} cycles failed ({in_flight} in flight), first: {}",
        failures.len(),
        failures[0]
    );
    let root = s.dir.path();
    let mounts: Vec<_> = provisioner::sys::mount::mounts()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(root))
        .collect();
    assert!(mounts.is_empty(), "mounts left: {mounts:?}");
    assert!(loops_under(root).is_empty(), "loop devices left");
    let pool = s.pool_path(0);
    let left: Vec<_> = std::fs::read_dir(&pool)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != ".quarry")
        .collect();
    assert!(left.is_empty(), "volume directories left: {left:?}");
    let meta: Vec<_> = std::fs::read_dir(pool.join(".quarry/volumes"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(meta.is_empty(), "metadata files left: {meta:?}");
    let pods: Vec<_> = std::fs::read_dir(root.join("pods"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    // the kubelet removes pod directories; the driver removes its target in each of them
    for pod in pods {
        assert!(!pod.join("vol").exists(), "target {} left", pod.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mount_cycles_8_in_flight() {
    run(8, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mount_cycles_64_in_flight() {
    run(64, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn block_cycles_8_in_flight() {
    run(8, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn block_cycles_64_in_flight() {
    run(64, true).await;
}
