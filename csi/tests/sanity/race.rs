//! ABORTED for concurrent operations on one volume: a call that finds another operation on the
//! same volume in flight is refused (the CO retries) instead of racing it, and the state stays
//! consistent whatever the interleaving.

use std::path::Path;

use csi::pb;
use tonic::Code;

use crate::common::*;

fn expand(id: &str, bytes: i64) -> pb::ControllerExpandVolumeRequest {
    pb::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    }
}

fn delete(id: &str) -> pb::DeleteVolumeRequest {
    pb::DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    }
}

fn publish(id: &str, target: &Path) -> pb::NodePublishVolumeRequest {
    pb::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    }
}

async fn volume_ids(s: &Server) -> Vec<String> {
    s.controller()
        .list_volumes(pb::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .filter_map(|e| e.volume.map(|v| v.volume_id))
        .collect()
}

/// While an operation holds a volume (here: the test holds its guard, as an in-flight call
/// would), every mutating call on it is ABORTED, calls on other volumes go through, and the
/// same calls succeed once it is released.
#[tokio::test]
async fn calls_on_a_busy_volume_are_aborted() {
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    create(&s, create_req("v", 4 * MIB, mount_cap())).await;
    let mut c = s.controller();
    let mut n = s.node();
    let target = s.dir.path().join("pods/p/mount");

    let guard = s.prov.lock_volume("v").unwrap();
    assert_eq!(
        code(c.create_volume(create_req("v", 4 * MIB, mount_cap())).await),
        Code::Aborted
    );
    assert_eq!(
        code(c.controller_expand_volume(expand("v", 8 * MIB)).await),
        Code::Aborted
    );
    assert_eq!(code(c.delete_volume(delete("v")).await), Code::Aborted);
    if is_root() {
        assert_eq!(
            code(n.node_publish_volume(publish("v", &target)).await),
            Code::Aborted
        );
        assert!(!is_mounted(&target));
    }
    // another volume is not held up
    create(&s, create_req("w", 4 * MIB, mount_cap())).await;
    drop(guard);

    let grown = c
        .controller_expand_volume(expand("v", 8 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert!(grown.capacity_bytes >= 8 * MIB);
    c.delete_volume(delete("v")).await.unwrap();
    assert_eq!(volume_ids(&s).await, vec!["w".to_string()]);
}

/// Fires the same call many times at once on one volume, over the socket: every answer is OK or
/// ABORTED, some are ABORTED (the calls really overlapped), and the end state is what one call
/// alone would have made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_on_one_volume_are_ok_or_aborted() {
    const CALLERS: usize = 8;
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    let (mut create_aborted, mut expand_aborted, mut delete_aborted) = (0, 0, 0);

    for round in 0..40 {
        let id = format!("race-{round}");

        // CreateVolume × CALLERS
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..CALLERS {
            let mut c = s.controller();
            let req = create_req(&id, 4 * MIB, mount_cap());
            set.spawn(async move { c.create_volume(req).await });
        }
        let mut ok = 0;
        for r in set.join_all().await {
            match r {
                Ok(v) => {
                    let v = v.into_inner().volume.unwrap();
                    assert_eq!(v.volume_id, id);
                    assert_eq!(v.capacity_bytes, 4 * MIB);
                    ok += 1;
                }
                Err(e) if e.code() == Code::Aborted => create_aborted += 1,
                Err(e) => panic!("CreateVolume {id}: unexpected {e:?}"),
            }
        }
        assert!(ok >= 1, "the call holding the volume succeeds");
        assert_eq!(volume_ids(&s).await.iter().filter(|v| **v == id).count(), 1);

        // ControllerExpandVolume × CALLERS, to different sizes
        let mut set = tokio::task::JoinSet::new();
        for k in 0..CALLERS {
            let mut c = s.controller();
            let req = expand(&id, (5 + k as i64) * MIB);
            set.spawn(async move { (k, c.controller_expand_volume(req).await) });
        }
        let mut largest_ok = 0;
        for (k, r) in set.join_all().await {
            match r {
                Ok(r) => {
                    assert!(r.into_inner().capacity_bytes >= (5 + k as i64) * MIB);
                    largest_ok = largest_ok.max((5 + k as i64) * MIB);
                }
                Err(e) if e.code() == Code::Aborted => expand_aborted += 1,
                Err(e) => panic!("ControllerExpandVolume {id}: unexpected {e:?}"),
            }
        }
        assert!(largest_ok > 0, "the call holding the volume succeeds");
        let (_, meta) = s.prov.volume(&id).unwrap();
        assert!(meta.capacity_bytes as i64 >= largest_ok);

        // DeleteVolume × CALLERS
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..CALLERS {
            let mut c = s.controller();
            let req = delete(&id);
            set.spawn(async move { c.delete_volume(req).await });
        }
        for r in set.join_all().await {
            match r {
                Ok(_) => {}
                Err(e) if e.code() == Code::Aborted => delete_aborted += 1,
                Err(e) => panic!("DeleteVolume {id}: unexpected {e:?}"),
            }
        }
        // whoever held it deleted it; a retry is a no-op
        s.controller().delete_volume(delete(&id)).await.unwrap();
        assert!(volume_ids(&s).await.is_empty());
        assert!(!s.pool_path(0).join(&id).exists());

        if round >= 4 && create_aborted > 0 && expand_aborted > 0 && delete_aborted > 0 {
            break;
        }
    }
    eprintln!(
        "ABORTED answers: create {create_aborted}, expand {expand_aborted}, delete {delete_aborted}"
    );
    assert!(
        create_aborted > 0,
        "no CreateVolume overlapped in 40 rounds"
    );
    assert!(
        expand_aborted > 0,
        "no ControllerExpandVolume overlapped in 40 rounds"
    );
    assert!(
        delete_aborted > 0,
        "no DeleteVolume overlapped in 40 rounds"
    );
}
