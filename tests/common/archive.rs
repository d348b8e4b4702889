//! Tar archives for the archive tests: a sample tree made on disk and packed by GNU tar (sparse
//! files included), the checks of its extraction, and hostile archives built entry by entry with
//! Python's `tarfile`.

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use super::arg;

/// The sparse file's size: 1 MiB of data, a 64 MiB hole, 4 KiB of data at the end.
pub const SPARSE_SIZE: u64 = (65 << 20) + 4096;
/// The modification time given to `top.txt`.
pub const MTIME: u64 = 1_600_000_000;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed | 1)
        .collect()
}

/// Makes `dir/tree`: nested directories with modes, a symbolic link within, a hard link, an
/// owned file (uid 1234 when root), a sparse file and an empty directory.
pub fn sample_tree(dir: &Path) -> PathBuf {
    let t = dir.join("tree");
    fs::create_dir_all(t.join("a/b/c")).unwrap();
    fs::create_dir(t.join("empty")).unwrap();
    fs::write(t.join("top.txt"), b"top\n").unwrap();
    fs::set_permissions(t.join("top.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    let f = fs::File::options()
        .write(true)
        .open(t.join("top.txt"))
        .unwrap();
    f.set_modified(UNIX_EPOCH + Duration::from_secs(MTIME))
        .unwrap();
    fs::write(t.join("a/b/c/deep.bin"), pattern(100 << 10, 7)).unwrap();
    fs::set_permissions(t.join("a/b/c/deep.bin"), fs::Permissions::from_mode(0o751)).unwrap();
    std::os::unix::fs::symlink("../../top.txt", t.join("a/b/link")).unwrap();
    fs::hard_link(t.join("top.txt"), t.join("hard")).unwrap();
    fs::write(t.join("owned.txt"), b"owned\n").unwrap();
    if super::nix_is_root() {
        std::os::unix::fs::chown(t.join("owned.txt"), Some(1234), Some(5678)).unwrap();
    }
    let sparse = fs::File::create(t.join("sparse.img")).unwrap();
    sparse.write_all_at(&pattern(1 << 20, 1), 0).unwrap();
    sparse
        .write_all_at(&pattern(4096, 2), SPARSE_SIZE - 4096)
        .unwrap();
    fs::set_permissions(t.join("a"), fs::Permissions::from_mode(0o750)).unwrap();
    t
}

/// Packs `tree` with GNU tar in `format` (`gnu` or `posix`), sparse files kept sparse.
pub fn pack(tree: &Path, out: &Path, format: &str) {
    let status = Command::new("tar")
        .args([
            "--sparse",
            "--numeric-owner",
            &format!("--format={format}"),
            "-C",
            arg(tree),
            "-cf",
            arg(out),
            ".",
        ])
        .status()
        .expect("running tar (install it)");
    assert!(status.success(), "tar failed");
}

/// Checks an extraction of [`sample_tree`] in `dir`: bytes, modes, links, sparseness, times,
/// ownership (as root), and nothing of Quarry's left behind.
pub fn check_tree(dir: &Path) {
    check_tree_but_owners(dir);
    let owned = fs::metadata(dir.join("owned.txt")).unwrap();
    if super::nix_is_root() {
        assert_eq!((owned.uid(), owned.gid()), (1234, 5678));
    }
}

/// [`check_tree`] without the ownership check (for extractions made without root).
pub fn check_tree_but_owners(dir: &Path) {
    assert_eq!(fs::read(dir.join("top.txt")).unwrap(), b"top\n");
    let top = fs::symlink_metadata(dir.join("top.txt")).unwrap();
    assert_eq!(top.mode() & 0o7777, 0o640);
    assert_eq!(top.mtime() as u64, MTIME);
    assert_eq!(
        fs::read(dir.join("a/b/c/deep.bin")).unwrap(),
        pattern(100 << 10, 7)
    );
    let deep = fs::metadata(dir.join("a/b/c/deep.bin")).unwrap();
    assert_eq!(deep.mode() & 0o7777, 0o751);
    assert_eq!(fs::metadata(dir.join("a")).unwrap().mode() & 0o7777, 0o750);
    assert_eq!(
        fs::read_link(dir.join("a/b/link")).unwrap(),
        Path::new("../../top.txt")
    );
    assert_eq!(fs::read(dir.join("a/b/link")).unwrap(), b"top\n");
    assert_eq!(
        fs::metadata(dir.join("hard")).unwrap().ino(),
        top.ino(),
        "hard link"
    );
    assert!(fs::metadata(dir.join("empty")).unwrap().is_dir());
    assert_eq!(fs::read(dir.join("owned.txt")).unwrap(), b"owned\n");
    let sparse = fs::File::open(dir.join("sparse.img")).unwrap();
    let meta = sparse.metadata().unwrap();
    assert_eq!(meta.len(), SPARSE_SIZE);
    let mut head = vec![0u8; 1 << 20];
    sparse.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(head, pattern(1 << 20, 1));
    let mut hole = vec![1u8; 4096];
    sparse.read_exact_at(&mut hole, 30 << 20).unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    let mut tail = vec![0u8; 4096];
    sparse.read_exact_at(&mut tail, SPARSE_SIZE - 4096).unwrap();
    assert_eq!(tail, pattern(4096, 2));
    assert!(
        meta.blocks() * 512 < 4 << 20,
        "the sparse file takes {} bytes on disk",
        meta.blocks() * 512
    );
    nothing_of_quarry_left(dir);
}

/// No staging directory or commit journal remains in `dir`.
pub fn nothing_of_quarry_left(dir: &Path) {
    for name in [".quarry-archive-partial", ".quarry-archive-commit"] {
        assert!(!dir.join(name).exists(), "{name} left in {}", dir.display());
    }
}

/// Writes a tar to `out` with Python's tarfile: `body` calls `add(name, type, data, link)`
/// (`type` one of tarfile's constants, e.g. `tarfile.SYMTYPE`).
pub fn python_tar(out: &Path, body: &str) {
    let script = format!(
        "import io, sys, tarfile\n\
         t = tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT)\n\
         def add(name, type=tarfile.REGTYPE, data=b'', link=''):\n    \
             ti = tarfile.TarInfo(name)\n    ti.type = type\n    ti.linkname = link\n    \
             ti.mode = 0o644\n    ti.devmajor, ti.devminor = 1, 3\n    \
             ti.size = len(data) if type == tarfile.REGTYPE else 0\n    \
             t.addfile(ti, io.BytesIO(data) if ti.size else None)\n\
         {body}\n\
         t.close()\n"
    );
    let status = Command::new("python3")
        .args(["-c", &script, arg(out)])
        .status()
        .expect("running python3");
    assert!(status.success(), "python3 failed on:\n{script}");
}
