use std::collections::HashMap;

use csi::pb::{self, volume_capability as vc};
use tonic::Code;

use crate::common::*;
use crate::require;

#[tokio::test]
async fn create_delete_idempotent_with_hpp_layout_and_topology() {
    let s = Server::start().await;
    let mut c = s.controller();
    let v = create(&s, create_req("pvc-a", 10 * MIB, mount_cap())).await;
    assert_eq!(v.volume_id, "pvc-a");
    assert_eq!(v.capacity_bytes, 10 * MIB);
    assert_eq!(v.volume_context.get("storagePool").unwrap(), "default");
    assert_eq!(
        v.accessible_topology[0]
            .segments
            .get("topology.hostpath.csi/node"),
        Some(&NODE.to_string())
    );
    // HPP layout: one directory per volume directly under the pool path
    assert!(s.pool_path(0).join("pvc-a").is_dir());
    let again = create(&s, create_req("pvc-a", 10 * MIB, mount_cap())).await;
    assert_eq!(again, v);
    c.delete_volume(pb::DeleteVolumeRequest {
        volume_id: "pvc-a".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(!s.pool_path(0).join("pvc-a").exists());
    c.delete_volume(pb::DeleteVolumeRequest {
        volume_id: "pvc-a".into(),
        ..Default::default()
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn storage_pool_parameter_selects_pool() {
    let s = Server::start().await;
    let v = create(&s, in_pool(create_req("pvc-b", MIB, mount_cap()), "second")).await;
    assert_eq!(v.volume_context.get("storagePool").unwrap(), "second");
    assert!(s.pool_path(1).join("pvc-b").is_dir());
    let r = s
        .controller()
        .create_volume(in_pool(create_req("pvc-c", MIB, mount_cap()), "nope"))
        .await;
    assert_eq!(code(r), Code::NotFound);
    // same name in another pool is a different volume
    let r = s
        .controller()
        .create_volume(create_req("pvc-b", MIB, mount_cap()))
        .await;
    assert_eq!(code(r), Code::AlreadyExists);
}

#[tokio::test]
async fn same_name_different_capacity_or_mode_already_exists() {
    let s = Server::start().await;
    create(&s, create_req("v", 2 * MIB, mount_cap())).await;
    let r = s
        .controller()
        .create_volume(create_req("v", 3 * MIB, mount_cap()))
        .await;
    assert_eq!(code(r), Code::AlreadyExists);
    let r = s
        .controller()
        .create_volume(create_req("v", 2 * MIB, block_cap()))
        .await;
    assert_eq!(code(r), Code::AlreadyExists);
}

#[tokio::test]
async fn request_validation_and_capacity_limits() {
    let s = Server::start().await;
    let mut c = s.controller();
    let mut no_name = create_req("", MIB, mount_cap());
    assert_eq!(
        code(c.create_volume(no_name.clone()).await),
        Code::InvalidArgument
    );
    no_name.name = "x".into();
    no_name.volume_capabilities.clear();
    assert_eq!(code(c.create_volume(no_name).await), Code::InvalidArgument);
    let multi = create_req(
        "m",
        MIB,
        cap(vc::access_mode::Mode::MultiNodeMultiWriter, false),
    );
    assert_eq!(code(c.create_volume(multi).await), Code::InvalidArgument);
    let mut mixed = create_req("mx", MIB, mount_cap());
    mixed.volume_capabilities.push(block_cap());
    assert_eq!(code(c.create_volume(mixed).await), Code::InvalidArgument);
    let mut bad = create_req("r", 2 * MIB, mount_cap());
    bad.capacity_range.as_mut().unwrap().limit_bytes = MIB;
    assert_eq!(code(c.create_volume(bad).await), Code::OutOfRange);
    let neg = create_req("n", -1, mount_cap());
    assert_eq!(code(c.create_volume(neg).await), Code::InvalidArgument);
    let huge = create_req("h", 1 << 60, mount_cap());
    assert_eq!(code(c.create_volume(huge).await), Code::OutOfRange);
    let mut elsewhere = create_req("t", MIB, mount_cap());
    elsewhere.accessibility_requirements = Some(pb::TopologyRequirement {
        requisite: vec![pb::Topology {
            segments: HashMap::from([(csi::TOPOLOGY_KEY.into(), "other-node".into())]),
        }],
        preferred: vec![],
    });
    assert_eq!(
        code(c.create_volume(elsewhere).await),
        Code::ResourceExhausted
    );
    // within limits: a block volume without required bytes takes min(default, limit)
    let mut lim = create_req("l", 0, block_cap());
    lim.capacity_range.as_mut().unwrap().limit_bytes = 4 * MIB;
    let v = create(&s, lim).await;
    assert_eq!(v.capacity_bytes, 4 * MIB);
}

async fn list_ids(s: &Server, token: &str, max: i32) -> (Vec<String>, String) {
    let r = s
        .controller()
        .list_volumes(pb::ListVolumesRequest {
            max_entries: max,
            starting_token: token.into(),
        })
        .await
        .unwrap()
        .into_inner();
    for e in &r.entries {
        let cond = e
            .status
            .as_ref()
            .unwrap()
            .volume_condition
            .as_ref()
            .unwrap();
        assert!(!cond.abnormal, "{}", cond.message);
    }
    (
        r.entries
            .into_iter()
            .map(|e| e.volume.unwrap().volume_id)
            .collect(),
        r.next_token,
    )
}

#[tokio::test]
async fn list_volumes_paginates_across_changes() {
    let s = Server::start().await;
    for n in ["v1", "v2", "v3", "v4", "v5"] {
        create(&s, create_req(n, MIB, mount_cap())).await;
    }
    create(&s, in_pool(create_req("v6", MIB, mount_cap()), "second")).await;
    let (all, tok) = list_ids(&s, "", 0).await;
    assert_eq!(all, ["v1", "v2", "v3", "v4", "v5", "v6"]);
    assert!(tok.is_empty());
    let (p1, tok) = list_ids(&s, "", 2).await;
    assert_eq!(p1, ["v1", "v2"]);
    // between pages: delete a returned one and a pending one, add one before and one after
    let mut c = s.controller();
    for id in ["v2", "v3"] {
        c.delete_volume(pb::DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    create(&s, create_req("v0", MIB, mount_cap())).await;
    create(&s, create_req("v9", MIB, mount_cap())).await;
    let (p2, tok) = list_ids(&s, &tok, 2).await;
    assert_eq!(p2, ["v4", "v5"]);
    let (p3, tok) = list_ids(&s, &tok, 2).await;
    assert_eq!(p3, ["v6", "v9"]);
    assert!(tok.is_empty());
    let r = c
        .list_volumes(pb::ListVolumesRequest {
            max_entries: 0,
            starting_token: "bogus".into(),
        })
        .await;
    assert_eq!(code(r), Code::Aborted);
}

#[tokio::test]
async fn validate_volume_capabilities() {
    let s = Server::start().await;
    create(&s, create_req("v", MIB, mount_cap())).await;
    let mut c = s.controller();
    let req = |caps: Vec<pb::VolumeCapability>, id: &str| pb::ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: caps,
        ..Default::default()
    };
    let ok = c
        .validate_volume_capabilities(req(vec![mount_cap()], "v"))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.confirmed.is_some());
    let no = c
        .validate_volume_capabilities(req(
            vec![cap(vc::access_mode::Mode::MultiNodeReaderOnly, false)],
            "v",
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none() && !no.message.is_empty());
    let wrong_mode = c
        .validate_volume_capabilities(req(vec![block_cap()], "v"))
        .await
        .unwrap()
        .into_inner();
    assert!(wrong_mode.confirmed.is_none());
    assert_eq!(
        code(
            c.validate_volume_capabilities(req(vec![mount_cap()], "missing"))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(c.validate_volume_capabilities(req(vec![], "v")).await),
        Code::InvalidArgument
    );
}

async fn capacity(s: &Server, pool: &str, node: Option<&str>) -> i64 {
    s.controller()
        .get_capacity(pb::GetCapacityRequest {
            volume_capabilities: vec![block_cap()],
            parameters: HashMap::from([("storagePool".into(), pool.into())]),
            accessible_topology: node.map(|n| pb::Topology {
                segments: HashMap::from([(csi::TOPOLOGY_KEY.into(), n.into())]),
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .available_capacity
}

#[tokio::test]
async fn get_capacity_per_pool_and_topology() {
    // The "second" pool gets a filesystem of its own: on the shared temp filesystem, builds and
    // other tests running at the same time move the free space by more than the volume's size.
    let fs = LoopFs::new(&["mkfs.ext4", "-q"], 256, "rw");
    require!(
        fs.is_ok(),
        format!("no loop filesystem: {}", fs.err().unwrap())
    );
    let fs = fs.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pools = two_pools(dir.path(), &fs.mnt);
    let s = Server::start_with(dir, pools).await;
    let before = capacity(&s, "second", Some(NODE)).await;
    assert!(before > 0);
    assert_eq!(capacity(&s, "second", Some("other")).await, 0);
    assert_eq!(capacity(&s, "unknown-pool", None).await, 0);
    // a sparse block volume is bounded: the space it may still grow into is promised away
    create(
        &s,
        in_pool(create_req("blk", 64 * MIB, block_cap()), "second"),
    )
    .await;
    let after = capacity(&s, "second", Some(NODE)).await;
    let promised = before - after;
    // 64 MiB promised, give or take the volume's directory and metadata blocks
    assert!(
        (63 * MIB..=65 * MIB).contains(&promised),
        "capacity dropped by {promised}"
    );
    drop(s);
}

#[tokio::test]
async fn expand_volumes() {
    let s = Server::start().await;
    create(&s, create_req("fs", 2 * MIB, mount_cap())).await;
    create(&s, create_req("blk", 2 * MIB, block_cap())).await;
    let mut c = s.controller();
    let exp = |id: &str, bytes: i64| pb::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let r = c
        .controller_expand_volume(exp("fs", 5 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 5 * MIB);
    assert!(!r.node_expansion_required);
    let r = c
        .controller_expand_volume(exp("blk", 6 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 6 * MIB);
    assert!(r.node_expansion_required);
    let len = std::fs::metadata(s.pool_path(0).join("blk/disk.img"))
        .unwrap()
        .len();
    assert_eq!(len as i64, 6 * MIB);
    // no shrinking: a smaller request answers the current size
    let r = c
        .controller_expand_volume(exp("blk", MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 6 * MIB);
    assert_eq!(
        code(c.controller_expand_volume(exp("nope", MIB)).await),
        Code::NotFound
    );
    assert_eq!(
        code(c.controller_expand_volume(exp("fs", 1 << 60)).await),
        Code::OutOfRange
    );
    let got = c
        .controller_get_volume(pb::ControllerGetVolumeRequest {
            volume_id: "fs".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().capacity_bytes, 5 * MIB);
}

#[tokio::test]
async fn controller_get_volume_reports_condition() {
    let s = Server::start().await;
    create(&s, create_req("v", MIB, block_cap())).await;
    let mut c = s.controller();
    let get = |id: &str| pb::ControllerGetVolumeRequest {
        volume_id: id.into(),
    };
    let r = c
        .controller_get_volume(get("v"))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.status.unwrap().volume_condition.unwrap().abnormal);
    std::fs::remove_file(s.pool_path(0).join("v/disk.img")).unwrap();
    let r = c
        .controller_get_volume(get("v"))
        .await
        .unwrap()
        .into_inner();
    let cond = r.status.unwrap().volume_condition.unwrap();
    assert!(cond.abnormal, "{}", cond.message);
    assert_eq!(
        code(c.controller_get_volume(get("zz")).await),
        Code::NotFound
    );
}

#[tokio::test]
async fn busy_volume_is_aborted() {
    let s = Server::start().await;
    create(&s, create_req("v", MIB, mount_cap())).await;
    let held = s.prov.lock_volume("v").unwrap();
    let r = s
        .controller()
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::Aborted);
    drop(held);
    s.controller()
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn restart_recovers_interrupted_operations() {
    let s = Server::start().await;
    create(&s, create_req("done", MIB, mount_cap())).await;
    create(&s, create_req("half-deleted", MIB, mount_cap())).await;
    let pool = s.pool_path(0);
    // a crash after "Deleting" was recorded, and one in the middle of a create
    let meta = pool.join(".quarry/volumes/half-deleted.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, text.replace("\"ready\"", "\"deleting\"")).unwrap();
    let creating = std::fs::read_to_string(pool.join(".quarry/volumes/done.json"))
        .unwrap()
        .replace("\"ready\"", "\"creating\"")
        .replace("\"done\"", "\"half-made\"");
    std::fs::write(pool.join(".quarry/volumes/half-made.json"), creating).unwrap();
    std::fs::create_dir(pool.join("half-made")).unwrap();
    std::fs::write(pool.join(".quarry/volumes/.x.json.tmp"), b"{").unwrap();
    let s = s.restart().await;
    let (ids, _) = list_ids(&s, "", 0).await;
    assert_eq!(ids, ["done"]);
    assert!(!pool.join("half-made").exists());
    assert!(!pool.join("half-deleted").exists());
    assert!(!pool.join(".quarry/volumes/.x.json.tmp").exists());
    // the name is usable again
    create(&s, create_req("half-made", MIB, mount_cap())).await;
}

fn snap_req(name: &str, src: &str) -> pb::CreateSnapshotRequest {
    pb::CreateSnapshotRequest {
        source_volume_id: src.into(),
        name: name.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn snapshots_lifecycle_and_restore() {
    let s = Server::start().await;
    create(&s, create_req("src", 4 * MIB, mount_cap())).await;
    create(&s, create_req("other", 4 * MIB, mount_cap())).await;
    let pool = s.pool_path(0);
    std::fs::write(pool.join("src/disk.img"), b"snapshot me").unwrap();
    let mut c = s.controller();
    let snap = c
        .create_snapshot(snap_req("snap-1", "src"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snap.ready_to_use);
    assert_eq!(snap.size_bytes, 4 * MIB);
    assert_eq!(snap.source_volume_id, "src");
    assert!(snap.creation_time.is_some());
    let again = c
        .create_snapshot(snap_req("snap-1", "src"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(again, snap);
    assert_eq!(
        code(c.create_snapshot(snap_req("snap-1", "other")).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(c.create_snapshot(snap_req("snap-x", "missing")).await),
        Code::NotFound
    );
    // the snapshot does not follow later writes
    std::fs::write(pool.join("src/disk.img"), b"changed").unwrap();
    c.create_snapshot(snap_req("snap-2", "other"))
        .await
        .unwrap();

    let list = |snapshot_id: &str, src: &str, token: &str, max: i32| pb::ListSnapshotsRequest {
        max_entries: max,
        starting_token: token.into(),
        source_volume_id: src.into(),
        snapshot_id: snapshot_id.into(),
        ..Default::default()
    };
    let all = c
        .list_snapshots(list("", "", "", 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.entries.len(), 2);
    let p1 = c
        .list_snapshots(list("", "", "", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        p1.entries[0].snapshot.as_ref().unwrap().snapshot_id,
        "snap-1"
    );
    let p2 = c
        .list_snapshots(list("", "", &p1.next_token, 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        p2.entries[0].snapshot.as_ref().unwrap().snapshot_id,
        "snap-2"
    );
    assert!(p2.next_token.is_empty());
    let by_src = c
        .list_snapshots(list("", "other", "", 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_src.entries.len(), 1);
    let by_id = c
        .list_snapshots(list("nope", "", "", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(by_id.entries.is_empty());
    let got = c
        .get_snapshot(pb::GetSnapshotRequest {
            snapshot_id: "snap-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.snapshot.unwrap(), snap);

    // restore
    let mut restore = create_req("restored", 4 * MIB, mount_cap());
    restore.volume_content_source = Some(pb::VolumeContentSource {
        r#type: Some(pb::volume_content_source::Type::Snapshot(
            pb::volume_content_source::SnapshotSource {
                snapshot_id: "snap-1".into(),
            },
        )),
    });
    let v = create(&s, restore.clone()).await;
    assert!(v.content_source.is_some());
    assert_eq!(
        std::fs::read(pool.join("restored/disk.img")).unwrap(),
        b"snapshot me"
    );
    let mut small = restore.clone();
    small.name = "too-small".into();
    small.capacity_range = Some(pb::CapacityRange {
        required_bytes: MIB,
        limit_bytes: MIB,
    });
    assert_eq!(code(c.create_volume(small).await), Code::OutOfRange);
    let mut missing = restore;
    missing.name = "from-missing".into();
    missing.volume_content_source = Some(pb::VolumeContentSource {
        r#type: Some(pb::volume_content_source::Type::Snapshot(
            pb::volume_content_source::SnapshotSource {
                snapshot_id: "gone".into(),
            },
        )),
    });
    assert_eq!(code(c.create_volume(missing).await), Code::NotFound);

    for id in ["snap-1", "snap-1", "snap-2"] {
        c.delete_snapshot(pb::DeleteSnapshotRequest {
            snapshot_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(
        c.list_snapshots(list("", "", "", 0))
            .await
            .unwrap()
            .into_inner()
            .entries
            .is_empty()
    );
    // the restored volume is independent of the deleted snapshot
    assert_eq!(
        std::fs::read(pool.join("restored/disk.img")).unwrap(),
        b"snapshot me"
    );
}

#[tokio::test]
async fn clone_volume_sparse_block() {
    let s = Server::start().await;
    create(&s, create_req("blk", 8 * MIB, block_cap())).await;
    let pool = s.pool_path(0);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(pool.join("blk/disk.img"))
            .unwrap();
        f.write_all_at(b"boot", 4 * MIB as u64).unwrap();
    }
    let mut req = create_req("clone", 16 * MIB, block_cap());
    req.volume_content_source = Some(pb::VolumeContentSource {
        r#type: Some(pb::volume_content_source::Type::Volume(
            pb::volume_content_source::VolumeSource {
                volume_id: "blk".into(),
            },
        )),
    });
    let v = create(&s, req.clone()).await;
    assert_eq!(v.capacity_bytes, 16 * MIB);
    let data = std::fs::read(pool.join("clone/disk.img")).unwrap();
    assert_eq!(data.len() as i64, 16 * MIB);
    assert_eq!(&data[4 * MIB as usize..4 * MIB as usize + 4], b"boot");
    use std::os::unix::fs::MetadataExt;
    let blocks = std::fs::metadata(pool.join("clone/disk.img"))
        .unwrap()
        .blocks();
    assert!(
        blocks * 512 < 2 * MIB as u64,
        "clone is not sparse: {} blocks",
        blocks
    );
    // a clone into a filesystem volume is refused
    let mut wrong = req;
    wrong.name = "wrong".into();
    wrong.volume_capabilities = vec![mount_cap()];
    assert_eq!(
        code(s.controller().create_volume(wrong).await),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn volumes_made_by_hpp_are_adopted() {
    let s = Server::start().await;
    let pool = s.pool_path(0);
    // HPP's layout: one directory per volume, no metadata anywhere
    std::fs::create_dir(pool.join("pvc-0b7e")).unwrap();
    std::fs::write(pool.join("pvc-0b7e/disk.img"), vec![7u8; 4096]).unwrap();
    std::fs::create_dir(pool.join("lost+found")).unwrap();
    std::fs::write(pool.join("stray-file"), b"x").unwrap();
    let s = s.restart().await;

    let (ids, _) = list_ids(&s, "", 0).await;
    assert_eq!(ids, ["pvc-0b7e"]);
    let (_, m) = s.prov.volume("pvc-0b7e").unwrap();
    assert!(m.adopted);
    assert_eq!(m.capacity_bytes, 0, "HPP never recorded a size");
    let got = s
        .controller()
        .controller_get_volume(pb::ControllerGetVolumeRequest {
            volume_id: "pvc-0b7e".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let cond = got.status.unwrap().volume_condition.unwrap();
    assert!(!cond.abnormal, "{cond:?}");
    // the data is left as it was; expansion records a size; delete removes it
    assert_eq!(
        std::fs::read(pool.join("pvc-0b7e/disk.img")).unwrap(),
        vec![7u8; 4096]
    );
    s.controller()
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: "pvc-0b7e".into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 2 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(s.prov.volume("pvc-0b7e").unwrap().1.capacity_bytes, 2 << 20);
    s.controller()
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: "pvc-0b7e".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!pool.join("pvc-0b7e").exists());
    assert!(pool.join("lost+found").is_dir(), "not a volume: left alone");
}
