//! GroupController (group snapshots), GetSnapshot and ControllerModifyVolume: idempotency,
//! missing ids, unknown volumes, and snapshot contents equal to what was written before.

use std::collections::HashMap;

use csi::pb::{self, group_controller_client::GroupControllerClient};
use provisioner::{PoolConfig, QuotaInForce, QuotaMode};
use tonic::Code;

use crate::common::*;
use crate::require;

fn group_req(name: &str, volumes: &[&str]) -> pb::CreateVolumeGroupSnapshotRequest {
    pb::CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: volumes.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }
}

fn get_group(id: &str, members: &[String]) -> pb::GetVolumeGroupSnapshotRequest {
    pb::GetVolumeGroupSnapshotRequest {
        group_snapshot_id: id.into(),
        snapshot_ids: members.to_vec(),
        ..Default::default()
    }
}

fn delete_group(id: &str, members: &[String]) -> pb::DeleteVolumeGroupSnapshotRequest {
    pb::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: id.into(),
        snapshot_ids: members.to_vec(),
        ..Default::default()
    }
}

fn restore_req(name: &str, snapshot: &str, cap: pb::VolumeCapability) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        volume_content_source: Some(pb::VolumeContentSource {
            r#type: Some(pb::volume_content_source::Type::Snapshot(
                pb::volume_content_source::SnapshotSource {
                    snapshot_id: snapshot.into(),
                },
            )),
        }),
        ..create_req(name, 2 * MIB, cap)
    }
}

fn modify(id: &str, params: &[(&str, &str)]) -> pb::ControllerModifyVolumeRequest {
    pb::ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn capabilities_advertise_groups_get_snapshot_and_modify() {
    let s = Server::start().await;
    let caps = GroupControllerClient::new(s.channel.clone())
        .group_controller_get_capabilities(pb::GroupControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    use pb::group_controller_service_capability as gcc;
    assert_eq!(
        caps.capabilities[0].r#type,
        Some(gcc::Type::Rpc(gcc::Rpc {
            r#type: gcc::rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32
        }))
    );
    let caps = s
        .controller()
        .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    use pb::controller_service_capability as csc;
    let rpcs: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csc::Type::Rpc(r)) => Some(r.r#type),
            _ => None,
        })
        .collect();
    assert!(rpcs.contains(&(csc::rpc::Type::ModifyVolume as i32)));
    // served (below) but not advertised: sidecars on CSI 1.11 crash on the unknown value
    assert!(!rpcs.contains(&(csc::rpc::Type::GetSnapshot as i32)));
    let plugin = s
        .identity()
        .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    use pb::plugin_capability as pc;
    assert!(plugin.capabilities.iter().any(|c| c.r#type
        == Some(pc::Type::Service(pc::Service {
            r#type: pc::service::Type::GroupControllerService as i32
        }))));
}

/// Two filesystem volumes and a block volume snapshotted together: the members hold what was
/// written before the call (not what came after), restore to it, are listed with their group,
/// cannot be deleted alone, and go with their group.
#[tokio::test]
async fn group_snapshot_holds_what_was_written_before_it() {
    let s = Server::start().await;
    let mut g = GroupControllerClient::new(s.channel.clone());
    let mut c = s.controller();
    create(&s, create_req("disk-a", 2 * MIB, mount_cap())).await;
    create(&s, create_req("disk-b", 2 * MIB, mount_cap())).await;
    create(&s, create_req("disk-c", 2 * MIB, block_cap())).await;
    let pool = s.pool_path(0);
    let disks = ["disk-a", "disk-b", "disk-c"];
    // the filesystem volumes' disk.img files, and 8 bytes into the block volume at 8 KiB
    let write_all = |when: &str| {
        for (d, tag) in disks.iter().zip(["a", "b", "c"]) {
            let data = format!("{tag} {when:<6}");
            if *d == "disk-c" {
                write_at(&pool.join("disk-c/disk.img"), 8192, data.as_bytes());
            } else {
                std::fs::write(pool.join(d).join("disk.img"), data).unwrap();
            }
        }
    };
    let group_of = |g: &mut GroupControllerClient<_>| {
        let mut g = g.clone();
        async move {
            g.create_volume_group_snapshot(group_req("vm1", &disks))
                .await
                .unwrap()
                .into_inner()
                .group_snapshot
                .unwrap()
        }
    };
    write_all("before");
    let made = group_of(&mut g).await;
    assert_eq!(made.group_snapshot_id, "vm1");
    assert!(made.ready_to_use);
    assert_eq!(made.snapshots.len(), 3);
    let members: Vec<String> = made
        .snapshots
        .iter()
        .map(|m| m.snapshot_id.clone())
        .collect();
    for (m, v) in made.snapshots.iter().zip(disks) {
        assert_eq!(m.source_volume_id, v);
        assert_eq!(m.group_snapshot_id, "vm1");
        assert!(m.ready_to_use);
    }
    // writes after the group snapshot are not in it
    write_all("after");

    // idempotent: the same group, same ids and creation time
    assert_eq!(group_of(&mut g).await, made);
    let got = g
        .get_volume_group_snapshot(get_group("vm1", &members))
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(got, made);

    // each member restores to what was written before the group snapshot
    for (m, cap) in made
        .snapshots
        .iter()
        .zip([mount_cap(), mount_cap(), block_cap()])
    {
        let name = format!("restored-{}", m.source_volume_id);
        create(&s, restore_req(&name, &m.snapshot_id, cap)).await;
    }
    assert_eq!(
        std::fs::read(pool.join("restored-disk-a/disk.img")).unwrap(),
        b"a before"
    );
    assert_eq!(
        std::fs::read(pool.join("restored-disk-b/disk.img")).unwrap(),
        b"b before"
    );
    let c_restored = std::fs::read(pool.join("restored-disk-c/disk.img")).unwrap();
    assert_eq!(&c_restored[8192..8200], b"c before");

    // members are ordinary snapshots to GetSnapshot and ListSnapshots, with their group
    let one = c
        .get_snapshot(pb::GetSnapshotRequest {
            snapshot_id: members[0].clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(one, made.snapshots[0]);
    let listed = c
        .list_snapshots(pb::ListSnapshotsRequest {
            source_volume_id: "disk-b".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].snapshot.as_ref().unwrap().group_snapshot_id,
        "vm1"
    );
    // ... but are deleted only with their group
    let r = c
        .delete_snapshot(pb::DeleteSnapshotRequest {
            snapshot_id: members[1].clone(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::FailedPrecondition);

    g.delete_volume_group_snapshot(delete_group("vm1", &members))
        .await
        .unwrap();
    g.delete_volume_group_snapshot(delete_group("vm1", &members))
        .await
        .unwrap();
    for m in &members {
        let r = c
            .get_snapshot(pb::GetSnapshotRequest {
                snapshot_id: m.clone(),
                ..Default::default()
            })
            .await;
        assert_eq!(code(r), Code::NotFound, "{m} survived its group");
    }
    let r = g.get_volume_group_snapshot(get_group("vm1", &[])).await;
    assert_eq!(code(r), Code::NotFound);
    assert!(
        std::fs::read_dir(pool.join(".quarry/snapshot-data"))
            .unwrap()
            .next()
            .is_none(),
        "snapshot data left"
    );
}

fn write_at(path: &std::path::Path, offset: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(data, offset).unwrap();
    f.sync_all().unwrap();
}

#[tokio::test]
async fn group_snapshot_requests_are_validated() {
    let s = Server::start().await;
    let mut g = GroupControllerClient::new(s.channel.clone());
    create(&s, create_req("v1", MIB, mount_cap())).await;
    create(&s, create_req("v2", MIB, mount_cap())).await;
    assert_eq!(
        code(g.create_volume_group_snapshot(group_req("", &["v1"])).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(g.create_volume_group_snapshot(group_req("g", &[])).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            g.create_volume_group_snapshot(group_req("g", &["v1", "v1"]))
                .await
        ),
        Code::InvalidArgument
    );
    // an unknown volume: NOT_FOUND, and nothing is left of the attempt
    assert_eq!(
        code(
            g.create_volume_group_snapshot(group_req("g", &["v1", "nope"]))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(g.get_volume_group_snapshot(get_group("g", &[])).await),
        Code::NotFound
    );
    assert!(
        s.prov
            .list_snapshots("", "", "", 0)
            .unwrap()
            .items
            .is_empty()
    );

    let made = g
        .create_volume_group_snapshot(group_req("g", &["v1", "v2"]))
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    // the same name for other volumes
    assert_eq!(
        code(
            g.create_volume_group_snapshot(group_req("g", &["v1"]))
                .await
        ),
        Code::AlreadyExists
    );
    // ids: required, unknown, and member lists that do not match
    assert_eq!(
        code(g.get_volume_group_snapshot(get_group("", &[])).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(g.delete_volume_group_snapshot(delete_group("", &[])).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(g.get_volume_group_snapshot(get_group("unknown", &[])).await),
        Code::NotFound
    );
    g.delete_volume_group_snapshot(delete_group("unknown", &[]))
        .await
        .unwrap();
    let wrong = vec![made.snapshots[0].snapshot_id.clone()];
    assert_eq!(
        code(g.get_volume_group_snapshot(get_group("g", &wrong)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            g.delete_volume_group_snapshot(delete_group("g", &wrong))
                .await
        ),
        Code::InvalidArgument
    );
    // a member's volume can go: snapshots outlive their volumes
    delete_volume(&s, "v1").await;
    let got = g
        .get_volume_group_snapshot(get_group("g", &[]))
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(got.snapshots.len(), 2);
    g.delete_volume_group_snapshot(delete_group("g", &[]))
        .await
        .unwrap();
    assert!(
        s.prov
            .list_snapshots("", "", "", 0)
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn get_snapshot_of_an_unknown_id_is_not_found() {
    let s = Server::start().await;
    let mut c = s.controller();
    let r = c
        .get_snapshot(pb::GetSnapshotRequest {
            snapshot_id: "unknown".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::NotFound);
    let r = c.get_snapshot(pb::GetSnapshotRequest::default()).await;
    assert_eq!(code(r), Code::InvalidArgument);
}

#[tokio::test]
async fn modify_volume_validates_its_parameters() {
    let s = Server::start().await;
    let mut c = s.controller();
    create(&s, create_req("v", MIB, mount_cap())).await;
    create(&s, create_req("blk", MIB, block_cap())).await;
    let refused = [
        ("", ("quota", "none"), Code::InvalidArgument),
        ("unknown", ("quota", "none"), Code::NotFound),
        ("v", ("ioWeight", "100"), Code::InvalidArgument),
        ("v", ("quota", "off"), Code::InvalidArgument),
        // a block volume's file bounds it
        ("blk", ("quota", "none"), Code::InvalidArgument),
    ];
    for (id, param, want) in refused {
        let e = c
            .controller_modify_volume(modify(id, &[param]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), want, "{id} {param:?}: {}", e.message());
        if want == Code::InvalidArgument && !id.is_empty() {
            assert!(e.message().contains(param.0), "{}", e.message());
        }
    }
    // idempotent, and recorded
    for _ in 0..2 {
        c.controller_modify_volume(modify("v", &[("quota", "none")]))
            .await
            .unwrap();
    }
    assert!(!s.prov.volume("v").unwrap().1.size_enforced());
    c.controller_modify_volume(modify("v", &[("quota", "enforced")]))
        .await
        .unwrap();
    assert!(s.prov.volume("v").unwrap().1.size_enforced());
    // CreateVolume's mutable_parameters are checked the same way
    let mut bad = create_req("w", MIB, mount_cap());
    bad.mutable_parameters = HashMap::from([("ioWeight".into(), "1".into())]);
    assert_eq!(code(c.create_volume(bad).await), Code::InvalidArgument);
}

/// On a btrfs qgroup pool `quota: none` really lifts the volume's limit, `enforced` puts it
/// back, and the setting survives a restart.
#[tokio::test]
async fn modify_volume_lifts_and_restores_the_size_limit() {
    let fs = LoopFs::new(&["mkfs.btrfs", "-q", "-f"], 300, "rw");
    require!(fs.is_ok(), fs.err().unwrap());
    let fs = fs.unwrap();
    let pools = vec![PoolConfig {
        mounted: false,
        name: "btrfs".into(),
        path: fs.mnt.join("pool"),
        quota: QuotaMode::Btrfs,
    }];
    let s = Server::start_with(tempfile::tempdir().unwrap(), pools).await;
    assert_eq!(s.prov.pools()[0].quota, QuotaInForce::BtrfsQgroup);
    create(&s, create_req("q", 8 * MIB, mount_cap())).await;
    let dir = s.pool_path(0).join("q");
    let err = std::fs::write(dir.join("big"), vec![1u8; 16 << 20]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    std::fs::remove_file(dir.join("big")).unwrap();

    s.controller()
        .controller_modify_volume(modify("q", &[("quota", "none")]))
        .await
        .unwrap();
    std::fs::write(dir.join("big"), vec![1u8; 16 << 20]).unwrap();
    std::fs::remove_file(dir.join("big")).unwrap();
    let s = s.restart().await;
    std::fs::write(dir.join("big"), vec![1u8; 16 << 20]).unwrap();
    std::fs::remove_file(dir.join("big")).unwrap();
    // btrfs frees the blocks of removed files at the next commit
    nix::unistd::sync();

    s.controller()
        .controller_modify_volume(modify("q", &[("quota", "enforced")]))
        .await
        .unwrap();
    let err = std::fs::write(dir.join("big"), vec![1u8; 16 << 20]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
}
