//! Access modes across target paths, and NodePublish failures that must leave nothing behind.
//!
//! SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_READER_ONLY publish a volume at one target only;
//! SINGLE_NODE_WRITER (Kubernetes' ReadWriteOnce, shared by a node's pods) and
//! SINGLE_NODE_MULTI_WRITER share it. Every refused or failed publish leaves the mount table,
//! the loop devices and the target's tree as they were.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use csi::pb::{self, volume_capability as vc};
use tonic::Code;
use vc::access_mode::Mode;

use crate::common::*;
use crate::require;

const MODES: [Mode; 4] = [
    Mode::SingleNodeWriter,
    Mode::SingleNodeReaderOnly,
    Mode::SingleNodeSingleWriter,
    Mode::SingleNodeMultiWriter,
];

fn exclusive(m: Mode) -> bool {
    matches!(m, Mode::SingleNodeReaderOnly | Mode::SingleNodeSingleWriter)
}

fn publish(id: &str, target: &Path, cap: pb::VolumeCapability) -> pb::NodePublishVolumeRequest {
    pb::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn unpublish(id: &str, target: &Path) -> pb::NodeUnpublishVolumeRequest {
    pb::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into(),
    }
}

/// The mount points under `root` (other tests run beside this one), in order.
fn mount_table(root: &Path) -> Vec<PathBuf> {
    provisioner::sys::mount::mounts()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(root))
        .collect()
}

/// Every path under `dir`, sorted.
fn tree(dir: &Path) -> Vec<PathBuf> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            out.push(e.path());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// What a failed publish must not change.
struct Before {
    mounts: Vec<PathBuf>,
    loops: Vec<PathBuf>,
    tree: Vec<PathBuf>,
    root: PathBuf,
}

impl Before {
    fn take(s: &Server) -> Before {
        Before {
            mounts: mount_table(s.dir.path()),
            loops: loops_under(s.dir.path()),
            tree: tree(&s.dir.path().join("pods")),
            root: s.dir.path().to_path_buf(),
        }
    }

    fn unchanged(&self, what: &str) {
        assert_eq!(
            mount_table(&self.root),
            self.mounts,
            "{what}: mount table changed"
        );
        assert_eq!(
            loops_under(&self.root),
            self.loops,
            "{what}: loop devices changed"
        );
        assert_eq!(
            tree(&self.root.join("pods")),
            self.tree,
            "{what}: files or directories left behind"
        );
    }
}

/// Every ordered pair of access modes, at two target paths: the second publish is refused with
/// FAILED_PRECONDITION (and changes nothing) where either mode is single-workload, and succeeds
/// otherwise. The same target again stays idempotent, and once the first target is unpublished
/// the second one can publish whatever the modes.
#[tokio::test]
async fn access_mode_pairs_across_targets() {
    require!(is_root(), "bind mounts need root");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    std::fs::create_dir_all(s.dir.path().join("pods")).unwrap();
    let mut n = s.node();
    for (i, first) in MODES.into_iter().enumerate() {
        for (j, second) in MODES.into_iter().enumerate() {
            let what = format!("{} then {}", first.as_str_name(), second.as_str_name());
            let id = format!("v{i}{j}");
            create(&s, create_req(&id, MIB, cap(first, false))).await;
            let a = s.dir.path().join(format!("pods/{id}-a/mount"));
            let b = s.dir.path().join(format!("pods/{id}-b/mount"));
            n.node_publish_volume(publish(&id, &a, cap(first, false)))
                .await
                .unwrap_or_else(|e| panic!("{what}: first publish: {e:?}"));
            n.node_publish_volume(publish(&id, &a, cap(first, false)))
                .await
                .unwrap_or_else(|e| panic!("{what}: repeated publish: {e:?}"));
            let before = Before::take(&s);
            let r = n
                .node_publish_volume(publish(&id, &b, cap(second, false)))
                .await;
            if exclusive(first) || exclusive(second) {
                assert_eq!(code(r), Code::FailedPrecondition, "{what}");
                before.unchanged(&what);
                assert!(!b.parent().unwrap().exists(), "{what}: pod dir created");
                // the first publication ends: now the second target may have it
                n.node_unpublish_volume(unpublish(&id, &a)).await.unwrap();
                n.node_publish_volume(publish(&id, &b, cap(second, false)))
                    .await
                    .unwrap_or_else(|e| panic!("{what}: after unpublish: {e:?}"));
            } else {
                r.unwrap_or_else(|e| panic!("{what}: {e:?}"));
                assert!(is_mounted(&a) && is_mounted(&b), "{what}");
                n.node_unpublish_volume(unpublish(&id, &a)).await.unwrap();
            }
            n.node_unpublish_volume(unpublish(&id, &b)).await.unwrap();
            assert!(!is_mounted(&a) && !is_mounted(&b), "{what}");
            delete_volume(&s, &id).await;
        }
    }
}

/// A block volume published for a single writer: a second target is refused without attaching
/// a loop device.
#[tokio::test]
async fn block_single_writer_is_refused_at_a_second_target() {
    require!(can_loop(), "loop devices need root and /dev/loop-control");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    let single = cap(Mode::SingleNodeSingleWriter, true);
    create(&s, create_req("blk", MIB, single.clone())).await;
    let mut n = s.node();
    let a = s.dir.path().join("pods/a/dev/blk");
    let b = s.dir.path().join("pods/b/dev/blk");
    n.node_publish_volume(publish("blk", &a, single.clone()))
        .await
        .unwrap();
    n.node_publish_volume(publish("blk", &a, single.clone()))
        .await
        .unwrap();
    let before = Before::take(&s);
    for mode in MODES {
        let r = n
            .node_publish_volume(publish("blk", &b, cap(mode, true)))
            .await;
        assert_eq!(code(r), Code::FailedPrecondition, "{}", mode.as_str_name());
        before.unchanged(mode.as_str_name());
    }
    n.node_unpublish_volume(unpublish("blk", &a)).await.unwrap();
    assert!(loops_under(s.dir.path()).is_empty());
    delete_volume(&s, "blk").await;
}

/// Each way a NodePublish can fail after validation leaves the mount table, the loop devices
/// and the pod's tree unchanged: an unusable mount flag, a mode mismatch, a missing volume
/// directory (the bind fails after the target directory was made), a missing block file (the
/// loop device cannot attach after the target file was made), a target already holding another
/// volume, and an ephemeral volume whose publish fails (its volume is removed again).
#[tokio::test]
async fn failed_publishes_leave_nothing_behind() {
    require!(can_loop(), "loop devices need root and /dev/loop-control");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    std::fs::create_dir_all(s.dir.path().join("pods")).unwrap();
    let mut n = s.node();
    create(&s, create_req("fs", MIB, mount_cap())).await;
    create(&s, create_req("other", MIB, mount_cap())).await;
    create(&s, create_req("blk", MIB, block_cap())).await;
    let target = s.dir.path().join("pods/p/volumes/mount");

    let before = Before::take(&s);
    let mut flagged = mount_cap();
    if let Some(vc::AccessType::Mount(m)) = flagged.access_type.as_mut() {
        m.mount_flags = vec!["discard".into()];
    }
    let r = n.node_publish_volume(publish("fs", &target, flagged)).await;
    assert_eq!(code(r), Code::InvalidArgument);
    before.unchanged("unusable mount flag");

    let r = n
        .node_publish_volume(publish("blk", &target, mount_cap()))
        .await;
    assert_eq!(code(r), Code::InvalidArgument);
    before.unchanged("block volume published as a mount");

    // the volume's directory vanished behind the driver's back: the bind fails
    let fs_dir = s.pool_path(0).join("fs");
    std::fs::rename(&fs_dir, s.pool_path(0).join("fs-away")).unwrap();
    let r = n
        .node_publish_volume(publish("fs", &target, mount_cap()))
        .await;
    assert_eq!(code(r), Code::Internal);
    before.unchanged("bind of a missing volume directory");
    std::fs::rename(s.pool_path(0).join("fs-away"), &fs_dir).unwrap();

    // the block file vanished: the loop device cannot attach
    let blk = s.pool_path(0).join("blk/disk.img");
    std::fs::rename(&blk, s.pool_path(0).join("blk/away")).unwrap();
    let dev_target = s.dir.path().join("pods/p/volumeDevices/blk");
    let r = n
        .node_publish_volume(publish("blk", &dev_target, block_cap()))
        .await;
    assert_ne!(code(r), Code::Ok);
    before.unchanged("loop device over a missing block file");
    std::fs::rename(s.pool_path(0).join("blk/away"), &blk).unwrap();

    // the target holds another volume: ALREADY_EXISTS, the one mount stays as it was
    n.node_publish_volume(publish("other", &target, mount_cap()))
        .await
        .unwrap();
    let before = Before::take(&s);
    let r = n
        .node_publish_volume(publish("fs", &target, mount_cap()))
        .await;
    assert_eq!(code(r), Code::AlreadyExists);
    before.unchanged("target holding another volume");

    // an ephemeral volume made for a publish that then fails is removed again
    let mut eph = publish("csi-eph", &target, mount_cap());
    eph.volume_context = HashMap::from([
        ("csi.storage.k8s.io/ephemeral".into(), "true".into()),
        ("size".into(), "1Mi".into()),
    ]);
    let r = n.node_publish_volume(eph).await;
    assert_eq!(code(r), Code::AlreadyExists);
    before.unchanged("ephemeral publish at an occupied target");
    assert!(
        !s.pool_path(0).join("csi-eph").exists(),
        "ephemeral volume left"
    );
    assert!(s.prov.find_volume("csi-eph").unwrap().is_none());
    n.node_unpublish_volume(unpublish("other", &target))
        .await
        .unwrap();
}

/// DeleteVolume of a filesystem volume still bind-mounted at a target is refused (as for a
/// block volume a loop device holds); once unpublished it is deleted.
#[tokio::test]
async fn delete_of_a_mounted_volume_is_refused() {
    require!(is_root(), "bind mounts need root");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    create(&s, create_req("v", MIB, mount_cap())).await;
    let target = s.dir.path().join("pods/p/mount");
    s.node()
        .node_publish_volume(publish("v", &target, mount_cap()))
        .await
        .unwrap();
    std::fs::write(target.join("data"), b"kept").unwrap();
    let r = s.controller().delete_volume(delete_req("v")).await;
    assert_eq!(code(r), Code::FailedPrecondition);
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"kept");
    assert!(s.prov.volume("v").is_ok());
    s.node()
        .node_unpublish_volume(unpublish("v", &target))
        .await
        .unwrap();
    delete_volume(&s, "v").await;
    assert!(!s.pool_path(0).join("v").exists());
}
