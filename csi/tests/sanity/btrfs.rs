//! Pools on a real loop-mounted btrfs image: every filesystem volume a subvolume whose qgroup
//! limit is its size, so writing past it fails inside the volume and nowhere else.

use provisioner::{PoolConfig, QuotaInForce, QuotaMode};

use crate::common::*;
use crate::require;

async fn btrfs_server(fs: &LoopFs, quota: QuotaMode) -> Server {
    let dir = tempfile::tempdir().unwrap();
    Server::start_with(
        dir,
        vec![PoolConfig {
            mounted: false,
            name: "btrfs".into(),
            path: fs.mnt.join("pool"),
            quota,
        }],
    )
    .await
}

fn btrfs_fs() -> Result<LoopFs, String> {
    LoopFs::new(&["mkfs.btrfs", "-q", "-f"], 300, "rw")
}

#[tokio::test]
async fn btrfs_qgroup_enforces_volume_size_and_expansion() {
    let fs = btrfs_fs();
    require!(fs.is_ok(), fs.err().unwrap());
    let fs = fs.unwrap();
    let s = btrfs_server(&fs, QuotaMode::Btrfs).await;
    assert_eq!(s.prov.pools()[0].quota, QuotaInForce::BtrfsQgroup);
    create(&s, create_req("q", 8 * MIB, mount_cap())).await;
    let dir = s.pool_path(0).join("q");
    assert!(provisioner::sys::btrfs::is_subvolume(&dir));

    let err = std::fs::write(dir.join("big"), vec![1u8; 16 << 20]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    // the rest of the pool is unaffected
    std::fs::write(s.pool_path(0).join("outside"), vec![1u8; 16 << 20]).unwrap();

    // after ControllerExpandVolume the same write fits
    std::fs::remove_file(dir.join("big")).unwrap();
    s.controller()
        .controller_expand_volume(expand_req("q", 32 * MIB))
        .await
        .unwrap();
    std::fs::write(dir.join("big"), vec![1u8; 16 << 20]).unwrap();

    assert_capacity_holds_back(&s, &fs.mnt).await;

    // deleting removes the subvolume
    delete_volume(&s, "q").await;
    assert!(!dir.exists());
}

#[tokio::test]
async fn btrfs_auto_mode_uses_qgroups_only_when_enabled() {
    let fs = btrfs_fs();
    require!(fs.is_ok(), fs.err().unwrap());
    let fs = fs.unwrap();
    let s = btrfs_server(&fs, QuotaMode::Auto).await;
    assert_eq!(s.prov.pools()[0].quota, QuotaInForce::None);
    drop(s);
    // an explicit btrfs pool turns qgroups on; auto then picks them up
    let s = btrfs_server(&fs, QuotaMode::Btrfs).await;
    drop(s);
    let s = btrfs_server(&fs, QuotaMode::Auto).await;
    assert_eq!(s.prov.pools()[0].quota, QuotaInForce::BtrfsQgroup);
}

#[tokio::test]
async fn btrfs_mode_is_refused_on_other_filesystems() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = PoolConfig {
        mounted: false,
        name: "p".into(),
        path: dir.path().join("pool"),
        quota: QuotaMode::Btrfs,
    };
    if provisioner::sys::fsinfo::stats(dir.path()).unwrap().kind
        == provisioner::sys::fsinfo::FsKind::Btrfs
    {
        eprintln!("SKIP: the temp dir is on btrfs");
        return;
    }
    let err = provisioner::Provisioner::open(&[cfg]).unwrap_err();
    assert!(err.to_string().contains("btrfs"), "{err}");
}
