//! Pools on a real loop-mounted XFS image: reflink copies, and project quotas (XFS and ext4)
//! where the kernel has them; `guest.rs` runs the quota tests in a kernel that has them.

use csi::pb;
use provisioner::sys::quota;
use provisioner::{PoolConfig, Provisioner, QuotaInForce, QuotaMode};

use crate::common::*;
use crate::require;

async fn pool_server(fs: &LoopFs, quota: QuotaMode) -> Server {
    let dir = tempfile::tempdir().unwrap();
    Server::start_with(
        dir,
        vec![PoolConfig {
            mounted: false,
            name: "xfs".into(),
            path: fs.mnt.join("pool"),
            quota,
        }],
    )
    .await
}

#[tokio::test]
async fn xfs_reflink_pool_snapshots_share_extents() {
    let fs = LoopFs::new(&["mkfs.xfs", "-q", "-m", "reflink=1"], 300, "rw");
    require!(fs.is_ok(), fs.err().unwrap());
    let fs = fs.unwrap();
    let s = pool_server(&fs, QuotaMode::Auto).await;
    assert_eq!(
        s.prov.pools()[0].copy,
        provisioner::meta::CopyMethod::Reflink
    );
    create(&s, create_req("src", 32 * MIB, block_cap())).await;
    let img = s.pool_path(0).join("src/disk.img");
    std::fs::write(&img, vec![0xabu8; 16 << 20]).unwrap();
    let free_before = nix::sys::statvfs::statvfs(&fs.mnt)
        .unwrap()
        .blocks_available();
    s.controller()
        .create_snapshot(pb::CreateSnapshotRequest {
            source_volume_id: "src".into(),
            name: "snap".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let free_after = nix::sys::statvfs::statvfs(&fs.mnt)
        .unwrap()
        .blocks_available();
    let bsize = nix::sys::statvfs::statvfs(&fs.mnt).unwrap().fragment_size();
    let used = (free_before.saturating_sub(free_after)) * bsize;
    assert!(
        used < 4 << 20,
        "a reflinked snapshot of 16 MiB used {used} bytes"
    );
    drop(s);
}

#[tokio::test]
async fn xfs_project_quota_enforces_volume_size() {
    let fs = LoopFs::new(&["mkfs.xfs", "-q"], 300, "prjquota");
    require!(
        fs.is_ok(),
        format!("no quota-enabled XFS here: {}", fs.err().unwrap())
    );
    let fs = fs.unwrap();
    let s = project_quota_enforces_volume_size(&fs, libc::ENOSPC).await;
    // XFS holds privileged writers (CAP_SYS_RESOURCE) to project limits too.
    let err = std::fs::write(s.pool_path(0).join("q/root"), vec![1u8; 8 << 20]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
}

#[tokio::test]
async fn ext4_project_quota_enforces_volume_size() {
    // Project ids live in the inode's extra space: 256-byte inodes, whatever mke2fs.conf says.
    let fs = LoopFs::new(
        &["mkfs.ext4", "-q", "-I", "256", "-O", "quota,project"],
        300,
        "prjquota",
    );
    require!(
        fs.is_ok(),
        format!("no quota-enabled ext4 here: {}", fs.err().unwrap())
    );
    project_quota_enforces_volume_size(&fs.unwrap(), libc::EDQUOT).await;
}

#[test]
fn project_mode_is_refused_where_project_quotas_only_account() {
    // XFS mounted pqnoenforce, and ext4 with the quota feature but no prjquota option, both
    // account project usage without enforcing limits: no size bound, so `project` must refuse.
    let cases: [(&[&str], &str); 2] = [
        (&["mkfs.xfs", "-q"], "pqnoenforce"),
        (
            &["mkfs.ext4", "-q", "-I", "256", "-O", "quota,project"],
            "rw",
        ),
    ];
    for (mkfs, options) in cases {
        let fs = LoopFs::new(mkfs, 300, options);
        require!(
            fs.is_ok(),
            format!("no quota-accounting {}: {}", mkfs[0], fs.err().unwrap())
        );
        let fs = fs.unwrap();
        let pool = |quota| PoolConfig {
            mounted: false,
            name: "acct".into(),
            path: fs.mnt.join("pool"),
            quota,
        };
        let err = Provisioner::open(&[pool(QuotaMode::Project)]).unwrap_err();
        assert!(
            err.to_string().contains("does not enforce them"),
            "{}: {err}",
            mkfs[0]
        );
        let p = Provisioner::open(&[pool(QuotaMode::Auto)]).unwrap();
        assert_eq!(p.pools()[0].quota, QuotaInForce::None, "{}", mkfs[0]);
    }
}

/// A 4 MiB volume on a project-quota pool takes no 8 MiB file from a writer without
/// CAP_SYS_RESOURCE (a pod) and fails it with `errno`; the pool outside the volume takes it,
/// the volume's usage is its project's, expansion raises the limit, and deletion clears it.
/// Returns the server with a fresh 4 MiB volume `q` (another project) in place.
async fn project_quota_enforces_volume_size(fs: &LoopFs, errno: i32) -> Server {
    let s = pool_server(fs, QuotaMode::Project).await;
    assert_eq!(s.prov.pools()[0].quota, QuotaInForce::Project);
    create(&s, create_req("q", 4 * MIB, mount_cap())).await;
    let dir = s.pool_path(0).join("q");
    let pid = s.prov.volume("q").unwrap().1.project_id.unwrap();
    assert_eq!(quota::get_project(&dir).unwrap(), pid);
    // an empty volume: its directory (a block on ext4, inline on XFS)
    let empty = quota::usage(&s.pool_path(0), pid).unwrap().bytes;
    let err = write_as_unprivileged(&dir.join("big"), 8 << 20).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(errno), "{err}");
    // the rest of the pool is unaffected
    write_as_unprivileged(&s.pool_path(0).join("outside"), 8 << 20).unwrap();
    let (used, _) = s.prov.pools()[0]
        .volume_usage(&s.prov.volume("q").unwrap().1)
        .unwrap();
    assert!(used > 0 && used <= 4 << 20, "volume q uses {used} bytes");

    // after ControllerExpandVolume the same write fits
    std::fs::remove_file(dir.join("big")).unwrap();
    s.controller()
        .controller_expand_volume(expand_req("q", 16 * MIB))
        .await
        .unwrap();
    write_as_unprivileged(&dir.join("big"), 8 << 20).unwrap();
    let u = quota::usage(&s.pool_path(0), pid).unwrap();
    assert_eq!(u.limit_bytes, 16 << 20);
    assert!(u.bytes >= 8 << 20, "{u:?}");
    // the volume may grow by 8 MiB more: GetCapacity does not promise that away
    assert_capacity_holds_back(&s, &fs.mnt).await;

    // Deleting clears the project's limit. A file still held open keeps its blocks charged to
    // the project, so the next volume gets another id and starts empty.
    let held = std::fs::File::open(dir.join("big")).unwrap();
    delete_volume(&s, "q").await;
    assert!(!dir.exists());
    let u = quota::usage(&s.pool_path(0), pid).unwrap();
    assert_eq!(u.limit_bytes, 0, "{u:?}");
    assert!(
        u.bytes >= 8 << 20,
        "the held file is no longer charged: {u:?}"
    );
    create(&s, create_req("q", 4 * MIB, mount_cap())).await;
    let next = s.prov.volume("q").unwrap().1;
    assert_ne!(next.project_id, Some(pid));
    assert_eq!(s.prov.pools()[0].volume_usage(&next).unwrap().0, empty);
    drop(held);
    s
}
