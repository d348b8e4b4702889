use std::collections::HashMap;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use csi::pb::{self, volume_capability as vc};
use tonic::Code;

use crate::common::*;
use crate::require;

fn publish(
    id: &str,
    target: &Path,
    cap: pb::VolumeCapability,
    ro: bool,
) -> pb::NodePublishVolumeRequest {
    pb::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(cap),
        readonly: ro,
        ..Default::default()
    }
}

fn unpublish(id: &str, target: &Path) -> pb::NodeUnpublishVolumeRequest {
    pb::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into(),
    }
}

#[tokio::test]
async fn node_info_and_capabilities() {
    let s = Server::start().await;
    let info = s
        .node()
        .node_get_info(pb::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, NODE);
    assert_eq!(info.max_volumes_per_node, 7);
    assert_eq!(
        info.accessible_topology
            .unwrap()
            .segments
            .get(csi::TOPOLOGY_KEY),
        Some(&NODE.to_string())
    );
    let caps = s
        .node()
        .node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(caps.capabilities.len() >= 3);
}

#[tokio::test]
async fn node_requests_are_validated() {
    let s = Server::start().await;
    let mut n = s.node();
    let t = s.dir.path().join("t");
    assert_eq!(
        code(
            n.node_publish_volume(publish("", &t, mount_cap(), false))
                .await
        ),
        Code::InvalidArgument
    );
    let mut no_cap = publish("v", &t, mount_cap(), false);
    no_cap.volume_capability = None;
    assert_eq!(
        code(n.node_publish_volume(no_cap).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_publish_volume(publish("missing", &t, mount_cap(), false))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(n.node_unpublish_volume(unpublish("v", Path::new(""))).await),
        Code::InvalidArgument
    );
    // unpublishing something never published succeeds
    n.node_unpublish_volume(unpublish("v", &t)).await.unwrap();
}

#[tokio::test]
async fn publish_unpublish_filesystem() {
    require!(is_root(), "bind mounts need root");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    create(&s, create_req("v", 8 * MIB, mount_cap())).await;
    let mut n = s.node();
    let target = s.dir.path().join("pods/p1/mount");
    n.node_publish_volume(publish("v", &target, mount_cap(), false))
        .await
        .unwrap();
    n.node_publish_volume(publish("v", &target, mount_cap(), false))
        .await
        .unwrap();
    assert!(is_mounted(&target));
    std::fs::write(target.join("disk.img"), vec![7u8; 1 << 20]).unwrap();
    assert_eq!(
        std::fs::read(s.pool_path(0).join("v/disk.img"))
            .unwrap()
            .len(),
        1 << 20
    );
    // same target, other access: refused
    assert_eq!(
        code(
            n.node_publish_volume(publish("v", &target, mount_cap(), true))
                .await
        ),
        Code::AlreadyExists
    );

    let stats = n
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: "v".into(),
            volume_path: target.to_string_lossy().into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == pb::volume_usage::Unit::Bytes as i32)
        .unwrap();
    assert_eq!(bytes.total, 8 * MIB);
    assert!(
        bytes.used >= MIB && bytes.used < 2 * MIB,
        "used {}",
        bytes.used
    );
    let inodes = stats
        .usage
        .iter()
        .find(|u| u.unit == pb::volume_usage::Unit::Inodes as i32)
        .unwrap();
    assert_eq!(inodes.used, 2, "the volume dir and disk.img");
    assert!(!stats.volume_condition.unwrap().abnormal);

    let exp = n
        .node_expand_volume(pb::NodeExpandVolumeRequest {
            volume_id: "v".into(),
            volume_path: target.to_string_lossy().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(exp.capacity_bytes, 8 * MIB);

    n.node_unpublish_volume(unpublish("v", &target))
        .await
        .unwrap();
    assert!(!target.exists());
    n.node_unpublish_volume(unpublish("v", &target))
        .await
        .unwrap();
    // data stays in the volume
    assert!(s.pool_path(0).join("v/disk.img").exists());
}

#[tokio::test]
async fn mount_flags_apply_to_the_bind_mount() {
    require!(is_root(), "bind mounts need root");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    create(&s, create_req("v", MIB, mount_cap())).await;
    let mut n = s.node();
    let target = s.dir.path().join("flags");
    let mut flagged = mount_cap();
    if let Some(vc::AccessType::Mount(m)) = flagged.access_type.as_mut() {
        m.mount_flags = vec!["noexec,nosuid".into(), "nodev".into()];
        m.fs_type = "ext4".into(); // does not apply to a directory volume: accepted
    }
    n.node_publish_volume(publish("v", &target, flagged.clone(), false))
        .await
        .unwrap();
    let canon = std::fs::canonicalize(&target).unwrap();
    let entry = provisioner::sys::mount::mounts()
        .unwrap()
        .into_iter()
        .rev()
        .find(|m| m.mount_point == canon)
        .expect("mounted");
    let opts: Vec<&str> = entry.options.split(',').collect();
    for want in ["rw", "noexec", "nosuid", "nodev"] {
        assert!(opts.contains(&want), "{want} missing from {opts:?}");
    }
    n.node_unpublish_volume(unpublish("v", &target))
        .await
        .unwrap();

    // a filesystem option that a bind mount cannot carry is refused by name
    if let Some(vc::AccessType::Mount(m)) = flagged.access_type.as_mut() {
        m.mount_flags = vec!["discard".into()];
    }
    let err = n
        .node_publish_volume(publish("v", &target, flagged, false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("discard"), "{}", err.message());
    assert!(!provisioner::sys::mount::is_mount_point(&target).unwrap());
}

#[tokio::test]
async fn read_only_publish_is_really_read_only() {
    require!(is_root(), "bind mounts need root");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    create(&s, create_req("v", MIB, mount_cap())).await;
    std::fs::write(s.pool_path(0).join("v/file"), b"x").unwrap();
    let mut n = s.node();
    let ro = s.dir.path().join("ro");
    n.node_publish_volume(publish("v", &ro, mount_cap(), true))
        .await
        .unwrap();
    let err = std::fs::write(ro.join("new"), b"y").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    assert_eq!(std::fs::read(ro.join("file")).unwrap(), b"x");
    n.node_unpublish_volume(unpublish("v", &ro)).await.unwrap();
    // the READER_ONLY access mode alone also makes it read-only (and it is the only
    // publication: SINGLE_NODE_READER_ONLY allows one, see access.rs)
    let ro2 = s.dir.path().join("ro2");
    let reader = cap(vc::access_mode::Mode::SingleNodeReaderOnly, false);
    n.node_publish_volume(publish("v", &ro2, reader, false))
        .await
        .unwrap();
    assert_eq!(
        std::fs::write(ro2.join("new"), b"y")
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EROFS)
    );
    // the volume itself is still writable
    std::fs::write(s.pool_path(0).join("v/other"), b"z").unwrap();
    n.node_unpublish_volume(unpublish("v", &ro2)).await.unwrap();
}

#[tokio::test]
async fn block_publish_through_loop_device_and_release() {
    require!(can_loop(), "loop devices need root and /dev/loop-control");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    create(&s, create_req("blk", 4 * MIB, block_cap())).await;
    let mut n = s.node();
    let target = s.dir.path().join("pods/p/dev/blk");
    n.node_publish_volume(publish("blk", &target, block_cap(), false))
        .await
        .unwrap();
    n.node_publish_volume(publish("blk", &target, block_cap(), false))
        .await
        .unwrap();
    let md = std::fs::metadata(&target).unwrap();
    assert!(md.file_type().is_block_device());
    assert_eq!(
        loops_under(s.dir.path()).len(),
        1,
        "one loop device, even after a repeated publish"
    );
    {
        use std::os::unix::fs::FileExt;
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&target)
            .unwrap();
        dev.write_all_at(b"through the loop", 4096).unwrap();
        dev.sync_all().unwrap();
    }
    let data = std::fs::read(s.pool_path(0).join("blk/disk.img")).unwrap();
    assert_eq!(&data[4096..4096 + 16], b"through the loop");
    // a published block volume cannot be deleted
    let r = s
        .controller()
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: "blk".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::FailedPrecondition);

    // online expansion: controller grows the file, node refreshes the loop device
    s.controller()
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: "blk".into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 8 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    n.node_expand_volume(pb::NodeExpandVolumeRequest {
        volume_id: "blk".into(),
        volume_path: target.to_string_lossy().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let size = std::fs::read_to_string(format!(
        "/sys/block/{}/size",
        loops_under(s.dir.path())[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
    ))
    .unwrap();
    assert_eq!(size.trim().parse::<i64>().unwrap() * 512, 8 * MIB);
    let stats = n
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: "blk".into(),
            volume_path: target.to_string_lossy().into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage[0].total, 8 * MIB);

    n.node_unpublish_volume(unpublish("blk", &target))
        .await
        .unwrap();
    assert!(!target.exists());
    assert!(loops_under(s.dir.path()).is_empty(), "loop device leaked");
    n.node_unpublish_volume(unpublish("blk", &target))
        .await
        .unwrap();
    s.controller()
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: "blk".into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn read_only_block_publish() {
    require!(can_loop(), "loop devices need root and /dev/loop-control");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    create(&s, create_req("blk", MIB, block_cap())).await;
    let target = s.dir.path().join("ro-blk");
    s.node()
        .node_publish_volume(publish("blk", &target, block_cap(), true))
        .await
        .unwrap();
    let dev = loops_under(s.dir.path())[0].clone();
    let ro = std::fs::read_to_string(format!(
        "/sys/block/{}/ro",
        dev.file_name().unwrap().to_string_lossy()
    ))
    .unwrap();
    assert_eq!(ro.trim(), "1", "the loop device itself is read-only");
    // the kernel may accept the open; the write must fail
    if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&target) {
        use std::os::unix::fs::FileExt;
        let r = f.write_all_at(b"nope", 0).and_then(|_| f.sync_all());
        assert!(r.is_err(), "write to a read-only block volume succeeded");
    }
    s.node()
        .node_unpublish_volume(unpublish("blk", &target))
        .await
        .unwrap();
    assert!(loops_under(s.dir.path()).is_empty());
}

#[tokio::test]
async fn restart_releases_leaked_loop_devices() {
    require!(can_loop(), "loop devices need root and /dev/loop-control");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    create(&s, create_req("blk", MIB, block_cap())).await;
    // a crash between attaching the loop device and mounting it
    provisioner::sys::loopdev::attach(&s.pool_path(0).join("blk/disk.img"), false).unwrap();
    assert_eq!(loops_under(s.dir.path()).len(), 1);
    let s = s.restart().await;
    assert!(
        loops_under(s.dir.path()).is_empty(),
        "restart must release it"
    );
}

#[tokio::test]
async fn ephemeral_inline_volume_lives_with_its_pod() {
    require!(is_root(), "bind mounts need root");
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    let target = s.dir.path().join("eph");
    let mut req = publish("csi-abc123", &target, mount_cap(), false);
    req.volume_context = HashMap::from([
        ("csi.storage.k8s.io/ephemeral".into(), "true".into()),
        ("storagePool".into(), "second".into()),
        ("size".into(), "2Mi".into()),
    ]);
    s.node().node_publish_volume(req.clone()).await.unwrap();
    s.node().node_publish_volume(req).await.unwrap();
    assert!(s.pool_path(1).join("csi-abc123").is_dir());
    assert!(is_mounted(&target));
    s.node()
        .node_unpublish_volume(unpublish("csi-abc123", &target))
        .await
        .unwrap();
    assert!(
        !s.pool_path(1).join("csi-abc123").exists(),
        "ephemeral volume deleted with its pod"
    );
}
