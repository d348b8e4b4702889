//! The provisioner through its public API, as the CSI driver drives it, on pools in temp dirs:
//! volumes created, written, grown, snapshotted, restored, cloned (within a pool and into
//! another) and deleted, with their sizes, their bytes and what is left on disk checked; a
//! reopened provisioner sees the same objects; refusals carry the kind the CSI layer maps to a
//! gRPC code. No root needed: the pools enforce no quota, and nothing is published.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use provisioner::meta::{ContentSource, State, VolumeMode};
use provisioner::{CapacityRange, CreateVolume, ErrorKind, PoolConfig, Provisioner, QuotaMode};

const MIB: u64 = 1 << 20;

fn pool(name: &str, path: &Path) -> PoolConfig {
    PoolConfig {
        mounted: false,
        name: name.into(),
        path: path.to_path_buf(),
        quota: QuotaMode::None,
    }
}

fn request(
    name: &str,
    bytes: u64,
    mode: VolumeMode,
    source: Option<ContentSource>,
) -> CreateVolume {
    CreateVolume {
        name: name.into(),
        capacity: CapacityRange {
            required: bytes,
            limit: 0,
        },
        mode,
        pool: None,
        source,
        parameters: BTreeMap::new(),
        ephemeral: false,
    }
}

/// A block volume's backing file, through the provisioner.
fn block_file(p: &Provisioner, id: &str) -> PathBuf {
    let (m, _, file) = p.volume_paths(id).unwrap();
    assert_eq!(m.mode, VolumeMode::Block);
    file
}

fn volume_ids(p: &Provisioner) -> Vec<String> {
    let page = p.list_volumes("", 0).unwrap();
    assert!(page.next_token.is_empty());
    page.items.into_iter().map(|m| m.id).collect()
}

fn snapshot_ids(p: &Provisioner) -> Vec<String> {
    let page = p.list_snapshots("", "", "", 0).unwrap();
    page.items.into_iter().map(|s| s.id).collect()
}

/// Every file and directory under `root`, relative, sorted.
fn tree(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if path.is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// `len` bytes of a pattern seeded by `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

#[test]
fn a_block_volume_grows_and_its_snapshot_and_clones_hold_its_bytes_until_all_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pool");
    let p = Provisioner::open(&[pool("default", &root)]).unwrap();

    let v = p
        .create_volume(&request("vol", 8 * MIB, VolumeMode::Block, None))
        .unwrap();
    assert_eq!((v.id.as_str(), v.pool.as_str()), ("vol", "default"));
    assert_eq!(
        (v.capacity_bytes, v.mode, v.state),
        (8 * MIB, VolumeMode::Block, State::Ready)
    );
    let file = block_file(&p, "vol");
    assert!(file.starts_with(std::fs::canonicalize(&root).unwrap()));
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 8 * MIB);
    // Data at 1 MiB, as a guest writes it through the loop device.
    let written = pattern(7, 3 * MIB as usize);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .write_all_at(&written, MIB)
        .unwrap();

    // Growing: block sizes round up to 512 bytes, the node must refresh its loop device; the
    // data stays. A smaller request is already satisfied and shrinks nothing.
    let grown = 12 * MIB + 512;
    assert_eq!(
        p.expand_volume(
            "vol",
            CapacityRange {
                required: 12 * MIB + 100,
                limit: 0
            }
        )
        .unwrap(),
        (grown, true)
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), grown);
    assert_eq!(p.volume("vol").unwrap().1.capacity_bytes, grown);
    assert_eq!(
        p.expand_volume(
            "vol",
            CapacityRange {
                required: 4 * MIB,
                limit: 0
            }
        )
        .unwrap(),
        (grown, true)
    );
    let before = std::fs::read(&file).unwrap();
    assert_eq!(&before[MIB as usize..4 * MIB as usize], &written[..]);

    let s = p.create_snapshot("snap", "vol").unwrap();
    assert_eq!(
        (s.source_volume_id.as_str(), s.size_bytes, s.mode, s.state),
        ("vol", grown, VolumeMode::Block, State::Ready)
    );
    // Idempotent by name.
    assert_eq!(p.create_snapshot("snap", "vol").unwrap(), s);
    // The volume changes after the snapshot: the snapshot keeps what it was.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .write_all_at(&[0xff; 4096], 0)
        .unwrap();
    let after = std::fs::read(&file).unwrap();

    // Restored from the snapshot at its size: its bytes.
    let restored = p
        .create_volume(&request(
            "restored",
            s.size_bytes,
            VolumeMode::Block,
            Some(ContentSource::Snapshot("snap".into())),
        ))
        .unwrap();
    assert_eq!(restored.capacity_bytes, grown);
    assert_eq!(
        restored.source,
        Some(ContentSource::Snapshot("snap".into()))
    );
    assert!(std::fs::read(block_file(&p, "restored")).unwrap() == before);
    // Restored with no size asked: the snapshot's size, not the default of a new block volume.
    let no_size = p
        .create_volume(&request(
            "restored-unsized",
            0,
            VolumeMode::Block,
            Some(ContentSource::Snapshot("snap".into())),
        ))
        .unwrap();
    assert_eq!(no_size.capacity_bytes, s.size_bytes);
    assert!(std::fs::read(block_file(&p, "restored-unsized")).unwrap() == before);
    p.delete_volume("restored-unsized").unwrap();

    // Cloned from the volume into a larger one: its bytes now, then zeroes up to the size.
    let copy = p
        .create_volume(&request(
            "copy",
            16 * MIB,
            VolumeMode::Block,
            Some(ContentSource::Volume("vol".into())),
        ))
        .unwrap();
    assert_eq!(copy.capacity_bytes, 16 * MIB);
    let cloned = std::fs::read(block_file(&p, "copy")).unwrap();
    assert_eq!(cloned.len() as u64, 16 * MIB);
    assert!(cloned[..after.len()] == after[..]);
    assert!(cloned[after.len()..].iter().all(|&b| b == 0));

    assert_eq!(volume_ids(&p), ["copy", "restored", "vol"]);
    assert_eq!(snapshot_ids(&p), ["snap"]);
    let by_source = p.list_snapshots("", "vol", "", 0).unwrap().items;
    assert_eq!(by_source, std::slice::from_ref(&s));

    // Another provisioner on the same pool (a restarted driver) finds everything as it was.
    drop(p);
    let p = Provisioner::open(&[pool("default", &root)]).unwrap();
    assert_eq!(volume_ids(&p), ["copy", "restored", "vol"]);
    assert_eq!(p.volume("vol").unwrap().1.capacity_bytes, grown);
    assert_eq!(p.snapshot("snap").unwrap().1, s);
    assert!(std::fs::read(block_file(&p, "restored")).unwrap() == before);

    // Deleting everything leaves the pool as a fresh one: only its empty metadata directories.
    p.delete_snapshot("snap").unwrap();
    for id in ["vol", "restored", "copy"] {
        p.delete_volume(id).unwrap();
    }
    assert!(volume_ids(&p).is_empty());
    assert!(snapshot_ids(&p).is_empty());
    assert_eq!(
        tree(&root),
        [
            ".quarry",
            ".quarry/groups",
            ".quarry/snapshot-data",
            ".quarry/snapshots",
            ".quarry/volumes"
        ]
    );
    // Deleting what is gone succeeds (CSI's DeleteVolume is idempotent); using it does not.
    p.delete_volume("vol").unwrap();
    p.delete_snapshot("snap").unwrap();
    assert_eq!(p.volume("vol").unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(p.snapshot("snap").unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn a_filesystem_volume_s_tree_is_carried_by_snapshot_restore_and_a_clone_into_another_pool() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let p = Provisioner::open(&[pool("a", &a), pool("b", &b)]).unwrap();
    let v = p
        .create_volume(&request("fs", 64 * MIB, VolumeMode::Filesystem, None))
        .unwrap();
    assert_eq!((v.pool.as_str(), v.capacity_bytes), ("a", 64 * MIB));
    let (_, vol_dir, _) = p.volume_paths("fs").unwrap();
    assert_eq!(vol_dir, std::fs::canonicalize(&a).unwrap().join("fs"));
    // What an importer and a workload leave: a sparse disk.img with data at 5 MiB, and a tree.
    let disk = std::fs::File::create(vol_dir.join("disk.img")).unwrap();
    disk.set_len(32 * MIB).unwrap();
    disk.write_all_at(&pattern(3, 64 << 10), 5 * MIB).unwrap();
    std::fs::create_dir_all(vol_dir.join("etc/conf.d")).unwrap();
    std::fs::write(vol_dir.join("etc/conf.d/app"), pattern(9, 10_000)).unwrap();
    let original = tree(&vol_dir);
    let read = |root: &Path| -> Vec<Vec<u8>> {
        ["disk.img", "etc/conf.d/app"]
            .iter()
            .map(|f| std::fs::read(root.join(f)).unwrap())
            .collect()
    };
    let contents = read(&vol_dir);

    p.create_snapshot("fs-snap", "fs").unwrap();
    let restored = p
        .create_volume(&request(
            "fs-restored",
            0,
            VolumeMode::Filesystem,
            Some(ContentSource::Snapshot("fs-snap".into())),
        ))
        .unwrap();
    assert_eq!(restored.capacity_bytes, 64 * MIB, "the snapshot's size");
    let (_, restored_dir, _) = p.volume_paths("fs-restored").unwrap();
    assert_eq!(tree(&restored_dir), original);
    assert!(read(&restored_dir) == contents);

    let mut into_b = request(
        "fs-b",
        128 * MIB,
        VolumeMode::Filesystem,
        Some(ContentSource::Volume("fs".into())),
    );
    into_b.pool = Some("b".into());
    let cloned = p.create_volume(&into_b).unwrap();
    assert_eq!(
        (cloned.pool.as_str(), cloned.capacity_bytes),
        ("b", 128 * MIB)
    );
    let (_, b_dir, _) = p.volume_paths("fs-b").unwrap();
    assert_eq!(b_dir, std::fs::canonicalize(&b).unwrap().join("fs-b"));
    assert_eq!(tree(&b_dir), original);
    assert!(read(&b_dir) == contents);
    // The hole stays a hole across pools (a sparse copy): 32 MiB with 64 KiB of data.
    let allocated =
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(b_dir.join("disk.img")).unwrap())
            * 512;
    assert!(allocated < 4 * MIB, "{allocated} bytes allocated");

    p.delete_snapshot("fs-snap").unwrap();
    for id in ["fs", "fs-restored", "fs-b"] {
        p.delete_volume(id).unwrap();
    }
    for root in [&a, &b] {
        assert!(
            tree(root).iter().all(|e| e.starts_with(".quarry")),
            "{:?}",
            tree(root)
        );
        let leftover: Vec<String> = tree(&root.join(".quarry"))
            .into_iter()
            .filter(|e| e.contains('/'))
            .collect();
        assert!(leftover.is_empty(), "{leftover:?}");
    }
}

#[test]
fn refusals_carry_their_kind_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pool");
    let p = Provisioner::open(&[pool("default", &root)]).unwrap();
    let block = request("vol", 8 * MIB, VolumeMode::Block, None);
    let v = p.create_volume(&block).unwrap();
    p.create_volume(&request("fs", MIB, VolumeMode::Filesystem, None))
        .unwrap();
    let before = tree(&root);

    // The same request again is the same volume; the same name with another size is not.
    assert_eq!(p.create_volume(&block).unwrap(), v);
    let e = p
        .create_volume(&request("vol", 16 * MIB, VolumeMode::Block, None))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert!(e.to_string().contains("8388608 bytes"), "{e}");

    let cases: Vec<(CreateVolume, ErrorKind, &str)> = vec![
        (
            request("huge", 1 << 60, VolumeMode::Block, None),
            ErrorKind::OutOfRange,
            "can ever hold",
        ),
        (
            CreateVolume {
                capacity: CapacityRange {
                    required: 8 * MIB,
                    limit: 4 * MIB,
                },
                ..request("narrow", 0, VolumeMode::Block, None)
            },
            ErrorKind::OutOfRange,
            "smaller than required_bytes",
        ),
        (
            CreateVolume {
                capacity: CapacityRange {
                    required: 0,
                    limit: 4 * MIB,
                },
                ..request(
                    "small-clone",
                    0,
                    VolumeMode::Block,
                    Some(ContentSource::Volume("vol".into())),
                )
            },
            ErrorKind::OutOfRange,
            "more than limit_bytes",
        ),
        (
            request(
                "as-block",
                0,
                VolumeMode::Block,
                Some(ContentSource::Volume("fs".into())),
            ),
            ErrorKind::InvalidArgument,
            "Filesystem volume",
        ),
        (
            request(
                "orphan",
                0,
                VolumeMode::Block,
                Some(ContentSource::Snapshot("none".into())),
            ),
            ErrorKind::NotFound,
            "snapshot none not found",
        ),
        (
            CreateVolume {
                pool: Some("elsewhere".into()),
                ..request("lost", MIB, VolumeMode::Filesystem, None)
            },
            ErrorKind::NotFound,
            "\"elsewhere\"",
        ),
        (
            request(".hidden", MIB, VolumeMode::Filesystem, None),
            ErrorKind::InvalidArgument,
            "not usable as a directory name",
        ),
    ];
    for (req, kind, says) in cases {
        let e = p.create_volume(&req).unwrap_err();
        assert_eq!(e.kind(), kind, "{}: {e}", req.name);
        assert!(e.to_string().contains(says), "{}: {e}", req.name);
    }

    let e = p.create_snapshot("s", "missing").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = p
        .expand_volume(
            "vol",
            CapacityRange {
                required: 32 * MIB,
                limit: 16 * MIB,
            },
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfRange, "{e}");
    let e = p
        .expand_volume(
            "missing",
            CapacityRange {
                required: MIB,
                limit: 0,
            },
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");

    // Nothing was made, nothing was changed.
    assert_eq!(tree(&root), before);
    assert_eq!(volume_ids(&p), ["fs", "vol"]);
    assert_eq!(p.volume("vol").unwrap().1, v);
    assert_eq!(
        std::fs::metadata(block_file(&p, "vol")).unwrap().len(),
        8 * MIB
    );
    assert!(snapshot_ids(&p).is_empty());
}

/// A mounted pool (an HPP `pvcTemplate` pool) opens once its path is a mount point and is used
/// only while it is: before, and after an unmount, its requests are Unavailable, a lookup that
/// misses is no NotFound (a delete must be retried, not taken as done), and nothing is written
/// to the directory under the mount.
#[test]
fn a_mounted_pool_is_used_only_while_mounted() {
    use provisioner::sys::mount;
    let under = tempfile::tempdir().unwrap();
    let backing = tempfile::tempdir().unwrap();
    let default_pool = tempfile::tempdir().unwrap();
    let mounted = PoolConfig {
        mounted: true,
        ..pool("onpvc", under.path())
    };
    let p = Provisioner::open(&[pool("local", default_pool.path()), mounted]).unwrap();
    let on_pvc = |name: &str| CreateVolume {
        pool: Some("onpvc".into()),
        ..request(name, MIB, VolumeMode::Filesystem, None)
    };
    let e = p.create_volume(&on_pvc("early")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("onpvc"), "{e}");
    let e = p.delete_volume("gone").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert_eq!(
        std::fs::read_dir(under.path()).unwrap().count(),
        0,
        "written under the mount point"
    );

    let flags = mount::bind_flags(&[]).unwrap();
    if let Err(e) = mount::bind(backing.path(), under.path(), flags) {
        eprintln!("skipping the mounted half: bind mount: {e}");
        return;
    }
    let created = p.create_volume(&on_pvc("vol")).map(|m| m.id);
    let unmounted = mount::unmount(under.path());
    let id = created.unwrap();
    unmounted.unwrap();
    assert!(
        backing.path().join(&id).is_dir(),
        "the volume is on the mounted filesystem"
    );
    // Unmounted again: refused, and the directory under the mount stays untouched.
    let e = p.create_volume(&on_pvc("late")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(!under.path().join(&id).exists());
    // The other pools never wait for it.
    p.create_volume(&request("here", MIB, VolumeMode::Filesystem, None))
        .unwrap();
    p.delete_volume("here").unwrap();
}
