//! `quarry import --archive`: tar archives (plain, gzip, xz, zstd; from a file, stdin and HTTP)
//! extracted into a directory, with every hostile entry refused before anything escapes the
//! target, and a failed extraction leaving the target as it was.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use testkit::nginx::{Nginx, NginxConfig};

mod common;
use common::archive::{
    check_tree, check_tree_but_owners, nothing_of_quarry_left, pack, python_tar, sample_tree,
};
use common::*;

/// A work directory: `target/` (the volume) and `outside/victim` (what must never change).
struct Work {
    dir: tempfile::TempDir,
}

impl Work {
    fn new() -> Work {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("target")).unwrap();
        fs::create_dir(dir.path().join("outside")).unwrap();
        fs::write(dir.path().join("outside/victim"), b"victim\n").unwrap();
        Work { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn target(&self) -> PathBuf {
        self.path().join("target")
    }

    fn outside(&self) -> PathBuf {
        self.path().join("outside")
    }

    /// The target holds nothing, and `outside` only the untouched victim.
    fn assert_untouched(&self) {
        let in_target: Vec<_> = fs::read_dir(self.target())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(in_target.is_empty(), "the target holds {in_target:?}");
        let outside: Vec<_> = fs::read_dir(self.outside())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(outside, ["victim"]);
        assert_eq!(
            fs::read(self.outside().join("victim")).unwrap(),
            b"victim\n"
        );
        assert_eq!(
            fs::symlink_metadata(self.outside().join("victim"))
                .unwrap()
                .nlink(),
            1
        );
    }
}

use std::os::unix::fs::{MetadataExt, PermissionsExt};

fn extract(source: &Path, target: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["import", "--archive", arg(source), arg(target)];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn hostile_entries_are_refused_and_nothing_escapes() {
    let cases: &[(&str, &str)] = &[
        (
            "dotdot",
            "add('ok.txt', data=b'ok')\nadd('../outside/new', data=b'x')",
        ),
        ("absolute", "add(OUT + '/new', data=b'x')"),
        (
            "symlink to an absolute path",
            "add('l', tarfile.SYMTYPE, link=OUT)",
        ),
        (
            "symlink up out of the volume",
            "add('d/l', tarfile.SYMTYPE, link='../../outside')",
        ),
        (
            "a file written through a symlink",
            "add('d', tarfile.DIRTYPE)\nadd('l', tarfile.SYMTYPE, link='d')\nadd('l/x', data=b'x')",
        ),
        (
            "a file written through a symlink to outside",
            "add('l', tarfile.SYMTYPE, link='..')\nadd('l/outside/new', data=b'x')",
        ),
        (
            "a chain of symlinks climbing out",
            "add('a/s', tarfile.SYMTYPE, link='..')\nadd('a/t', tarfile.SYMTYPE, link='s/../..')",
        ),
        (
            "a hard link out of the volume",
            "add('h', tarfile.LNKTYPE, link='../outside/victim')",
        ),
        (
            "a hard link to an absolute path",
            "add('h', tarfile.LNKTYPE, link=OUT + '/victim')",
        ),
        (
            "a hard link to a symlink",
            "add('a/b/s', tarfile.SYMTYPE, link='../..')\nadd('h', tarfile.LNKTYPE, link='a/b/s')",
        ),
        ("a character device", "add('null', tarfile.CHRTYPE)"),
        ("a block device", "add('sda', tarfile.BLKTYPE)"),
        ("a FIFO", "add('pipe', tarfile.FIFOTYPE)"),
        (
            "a directory replaced by a symlink",
            "add('d', tarfile.DIRTYPE)\nadd('d', tarfile.SYMTYPE, link='.')",
        ),
    ];
    for (name, body) in cases {
        let w = Work::new();
        let tar = w.path().join("hostile.tar");
        let out_dir = w.outside();
        python_tar(&tar, &format!("OUT = {:?}\n{body}", arg(&out_dir)));
        let out = extract(&tar, &w.target(), &["--json"]);
        assert_eq!(out.status.code(), Some(11), "{name}: {out:?}");
        let err = json(&out);
        assert_eq!(err["kind"], "unsupported", "{name}: {err}");
        assert!(
            err["error"].as_str().unwrap().contains("refused"),
            "{name}: {err}"
        );
        w.assert_untouched();
    }
}

#[test]
fn a_good_archive_is_extracted_with_links_modes_and_sparse_files() {
    for format in ["gnu", "posix"] {
        let w = Work::new();
        let tree = sample_tree(w.path());
        let tar = w.path().join("tree.tar");
        pack(&tree, &tar, format);
        let out = extract(&tar, &w.target(), &["--json"]);
        assert_ok(&out);
        let report = json(&out);
        assert_eq!(
            report["format_chain"],
            serde_json::json!(["tar"]),
            "{format}"
        );
        assert_eq!(report["hard_links"], 1, "{format}: {report}");
        assert_eq!(report["symlinks"], 1, "{format}: {report}");
        assert_eq!(report["owners_kept"], nix_is_root(), "{format}: {report}");
        check_tree(&w.target());
    }
}

#[test]
fn compressed_archives_from_a_file_and_stdin() {
    let w = Work::new();
    let tree = sample_tree(w.path());
    let tar = w.path().join("tree.tar");
    pack(&tree, &tar, "posix");
    for (tool, layer) in [
        (&["gzip", "-c"][..], "gzip"),
        (&["xz", "-c", "-T2"], "xz"),
        (&["zstd", "-c", "-q"], "zstd"),
    ] {
        let packed = w.path().join(format!("tree.tar.{layer}"));
        compress(tool, &tar, &packed);
        let target = w.path().join(format!("from-file-{layer}"));
        let out = extract(&packed, &target, &["--json"]);
        assert_ok(&out);
        assert_eq!(
            json(&out)["format_chain"],
            serde_json::json!([layer, "tar"])
        );
        check_tree(&target);

        let target = w.path().join(format!("from-stdin-{layer}"));
        let out = quarry()
            .args(["import", "--archive", "-", arg(&target)])
            .stdin(fs::File::open(&packed).unwrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_ok(&out);
        check_tree(&target);
    }
}

#[test]
fn an_archive_over_http_is_extracted_and_checksummed() {
    let w = Work::new();
    let tree = sample_tree(w.path());
    let served = w.path().join("served");
    fs::create_dir(&served).unwrap();
    let tar = w.path().join("tree.tar");
    pack(&tree, &tar, "gnu");
    compress(&["gzip", "-c"], &tar, &served.join("tree.tar.gz"));
    let server = Nginx::start(NginxConfig {
        root: served.clone(),
        ranges: true,
        ..Default::default()
    });
    let url = server.url("/tree.tar.gz");
    let sum = Command::new("sha256sum")
        .arg(served.join("tree.tar.gz"))
        .output()
        .unwrap();
    let sum = String::from_utf8(sum.stdout).unwrap();
    let good = format!("sha256:{}", sum.split_whitespace().next().unwrap());
    let bad = format!("sha256:{}", "0".repeat(64));

    let out = extract(Path::new(&url), &w.target(), &["--checksum", &bad]);
    assert_eq!(out.status.code(), Some(14), "{out:?}");
    w.assert_untouched();

    let out = extract(
        Path::new(&url),
        &w.target(),
        &["--checksum", &good, "--json"],
    );
    assert_ok(&out);
    let report = json(&out);
    assert_eq!(report["format_chain"], serde_json::json!(["gzip", "tar"]));
    assert_eq!(report["source_checksum"], good);
    check_tree(&w.target());
}

#[test]
fn sizes_are_checked_before_and_during_extraction() {
    let w = Work::new();
    let tree = sample_tree(w.path());
    let tar = w.path().join("tree.tar");
    pack(&tree, &tar, "gnu");
    // Before: the plain tar is longer than 1 MiB.
    let out = extract(&tar, &w.target(), &["--size", "1Mi", "--json"]);
    assert_eq!(out.status.code(), Some(13), "{out:?}");
    assert!(
        json(&out)["error"]
            .as_str()
            .unwrap()
            .contains("the tar archive is")
    );
    w.assert_untouched();
    // During: compressed, its length says nothing; the data passes 1 MiB while extracting.
    let gz = w.path().join("tree.tar.gz");
    compress(&["gzip", "-c"], &tar, &gz);
    let out = extract(&gz, &w.target(), &["--size", "1Mi", "--json"]);
    assert_eq!(out.status.code(), Some(13), "{out:?}");
    assert!(
        json(&out)["error"]
            .as_str()
            .unwrap()
            .contains("reached while writing")
    );
    w.assert_untouched();
    // The sparse file's hole is free: 8 MiB is enough for ~1.2 MiB of data.
    let out = extract(&gz, &w.target(), &["--size", "8Mi"]);
    assert_ok(&out);
    check_tree(&w.target());
}

#[test]
fn broken_archives_and_unusable_targets_fail_clearly() {
    let w = Work::new();
    let tar = w.path().join("one.tar");
    python_tar(&tar, "add('big', data=b'x' * 10000)");
    let bytes = fs::read(&tar).unwrap();
    let cut = w.path().join("cut.tar");
    fs::write(&cut, &bytes[..2048]).unwrap();
    let out = extract(&cut, &w.target(), &[]);
    assert_eq!(out.status.code(), Some(12), "{out:?}");
    w.assert_untouched();

    let junk = w.path().join("junk.tar");
    fs::write(&junk, vec![0x5a; 4096]).unwrap();
    let out = extract(&junk, &w.target(), &[]);
    assert_eq!(out.status.code(), Some(12), "{out:?}");
    w.assert_untouched();

    // A target that is not empty is not extracted into (CDI extracts into a fresh volume).
    fs::write(w.target().join("mine"), b"user data").unwrap();
    let out = extract(&tar, &w.target(), &["--json"]);
    assert_eq!(out.status.code(), Some(10), "{out:?}");
    assert!(json(&out)["error"].as_str().unwrap().contains("not empty"));
    assert_eq!(fs::read(w.target().join("mine")).unwrap(), b"user data");
    fs::remove_file(w.target().join("mine")).unwrap();

    // Disk-image options do not apply.
    let out = extract(&tar, &w.target(), &["--preallocate"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");

    // lost+found of a fresh filesystem is allowed.
    fs::create_dir(w.target().join("lost+found")).unwrap();
    let out = extract(&tar, &w.target(), &[]);
    assert_ok(&out);
    assert_eq!(fs::read(w.target().join("big")).unwrap(), vec![b'x'; 10000]);
    nothing_of_quarry_left(&w.target());
}

#[test]
fn an_interrupted_commit_is_rolled_back_by_the_next_attempt() {
    let w = Work::new();
    let target = w.target();
    // What a crash between the journal and its removal leaves: a moved entry, the journal and
    // the staging directory with the rest.
    fs::create_dir(target.join("moved")).unwrap();
    fs::write(target.join("moved/f"), b"half").unwrap();
    fs::write(target.join(".quarry-archive-commit"), b"moved\0notyet\0").unwrap();
    fs::create_dir_all(target.join(".quarry-archive-partial/notyet")).unwrap();
    let tar = w.path().join("one.tar");
    python_tar(&tar, "add('fresh', data=b'new')");
    let out = extract(&tar, &target, &[]);
    assert_ok(&out);
    let names: Vec<_> = fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["fresh"]);
}

/// Runs `cmd` as the unprivileged user 65534 (nobody) when the tests run as root; as the current
/// (already unprivileged) user otherwise. Returns the uid and gid the command runs as.
fn unprivileged(cmd: &mut Command) -> (Command, u32, u32) {
    if !nix_is_root() {
        let me = fs::metadata("/proc/self").unwrap();
        let mut same = Command::new(cmd.get_program());
        same.args(cmd.get_args());
        return (same, me.uid(), me.gid());
    }
    let mut setpriv = Command::new("setpriv");
    setpriv
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    (setpriv, 65534, 65534)
}

/// Gives the work directory to `uid`:`gid` (a test's temp directory is root's, mode 0700).
fn give(path: &Path, uid: u32, gid: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

/// Every entry under `dir` (links not followed) belongs to `uid`:`gid`.
fn assert_owned_by(dir: &Path, uid: u32, gid: u32) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = fs::symlink_metadata(entry.path()).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (uid, gid),
            "{}",
            entry.path().display()
        );
        if meta.is_dir() {
            assert_owned_by(&entry.path(), uid, gid);
        }
    }
}

#[test]
fn without_root_modes_and_contents_are_kept_and_owners_are_the_users() {
    let w = Work::new();
    let tree = sample_tree(w.path());
    // Modes only root could misapply: setuid, setgid, sticky, and a read-only directory (filled
    // before its mode is applied) holding a read-only file.
    let special = [
        ("suid", 0o4755),
        ("sgid", 0o2750),
        ("sticky", 0o1777),
        ("ro", 0o555),
        ("ro/file", 0o400),
    ];
    for (name, _) in special {
        let path = tree.join(name);
        if name == "sticky" || name == "ro" {
            fs::create_dir(&path).unwrap();
        } else {
            fs::write(&path, name).unwrap();
        }
    }
    for (name, mode) in special.iter().rev() {
        fs::set_permissions(tree.join(name), fs::Permissions::from_mode(*mode)).unwrap();
    }
    let tar = w.path().join("tree.tar");
    pack(&tree, &tar, "posix");
    give(w.path(), 0, 0);
    let (mut cmd, uid, gid) =
        unprivileged(quarry().args(["import", "--archive", arg(&tar), arg(&w.target()), "--json"]));
    give(&w.target(), uid, gid);
    let out = cmd.output().unwrap();
    assert_ok(&out);
    let report = json(&out);
    assert_eq!(report["owners_kept"], false, "{report}");
    assert_eq!(report["files"], 7, "{report}");
    check_tree_but_owners(&w.target());
    assert_owned_by(&w.target(), uid, gid);
    for (name, mode) in special {
        let meta = fs::symlink_metadata(w.target().join(name)).unwrap();
        assert_eq!(meta.mode() & 0o7777, mode, "{name}");
    }
    assert_eq!(fs::read(w.target().join("ro/file")).unwrap(), b"ro/file");

    // A target the user may not write to is a clear error, and nothing is left.
    let locked = w.path().join("locked");
    fs::create_dir(&locked).unwrap();
    give(&locked, uid, gid);
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o555)).unwrap();
    let (mut cmd, _, _) =
        unprivileged(quarry().args(["import", "--archive", arg(&tar), arg(&locked), "--json"]));
    let out = cmd.output().unwrap();
    assert_exit(&out, 10);
    let error = json(&out)["error"].as_str().unwrap().to_string();
    assert!(error.contains("Permission denied"), "{error}");
    assert!(error.contains(".quarry-archive-partial"), "{error}");
    assert_eq!(fs::read_dir(&locked).unwrap().count(), 0);
}

/// GNU tar's PAX sparse formats 0.0, 0.1 and 1.0 (`--sparse-version`): each extracts to the same
/// bytes GNU tar extracts, at most as many allocated blocks, and holes kept.
#[test]
fn pax_sparse_versions_extract_as_gnu_tar_extracts_them() {
    let w = Work::new();
    let tree = w.path().join("sparse-tree");
    fs::create_dir_all(tree.join("deep")).unwrap();
    let long = format!("deep/{}", "long-name-".repeat(12));
    let write = |name: &str, size: u64, data: &[(u64, usize)]| {
        let f = fs::File::create(tree.join(name)).unwrap();
        f.set_len(size).unwrap();
        for (i, &(at, len)) in data.iter().enumerate() {
            let bytes: Vec<u8> = (0..len).map(|j| (j as u8) ^ (i as u8) | 1).collect();
            std::os::unix::fs::FileExt::write_all_at(&f, &bytes, at).unwrap();
        }
    };
    let files: Vec<(&str, u64)> = vec![
        ("middle", 10 << 20),
        ("ends-in-a-hole", 8 << 20),
        ("all-hole", 6 << 20),
        ("many", 16 << 20),
        ("dense", 3000),
        (long.as_str(), 5 << 20),
    ];
    write("middle", 10 << 20, &[(5_000_000, 3000)]);
    write("ends-in-a-hole", 8 << 20, &[(0, 64 << 10)]);
    write("all-hole", 6 << 20, &[]);
    let mut many: Vec<(u64, usize)> = (0..16).map(|i| ((i << 20) + 4096 * i, 4096)).collect();
    many.push(((16 << 20) - 100, 100));
    write("many", 16 << 20, &many);
    write("dense", 3000, &[(0, 3000)]);
    write(long.as_str(), 5 << 20, &[(1 << 20, 512)]);
    for version in ["0.0", "0.1", "1.0"] {
        let tar = w.path().join(format!("sparse-{version}.tar"));
        let status = Command::new("tar")
            .args(["--format=pax", "--sparse", "--sparse-version", version])
            .args(["-C", arg(&tree), "-cf", arg(&tar), "."])
            .status()
            .unwrap();
        assert!(status.success());
        let by_tar = w.path().join(format!("by-tar-{version}"));
        fs::create_dir(&by_tar).unwrap();
        let status = Command::new("tar")
            .args(["-C", arg(&by_tar), "-xf", arg(&tar)])
            .status()
            .unwrap();
        assert!(status.success());
        let by_quarry = w.path().join(format!("by-quarry-{version}"));
        let out = extract(&tar, &by_quarry, &["--json"]);
        assert_ok(&out);
        assert_eq!(json(&out)["files"], files.len(), "{version}");
        for (name, size) in &files {
            let ours = fs::metadata(by_quarry.join(name)).unwrap();
            let theirs = fs::metadata(by_tar.join(name)).unwrap();
            assert_eq!(ours.len(), *size, "{version} {name}");
            assert!(
                fs::read(by_quarry.join(name)).unwrap() == fs::read(by_tar.join(name)).unwrap(),
                "{version} {name}: the bytes differ from GNU tar's extraction"
            );
            assert!(
                ours.blocks() <= theirs.blocks(),
                "{version} {name}: {} blocks allocated, GNU tar {}",
                ours.blocks(),
                theirs.blocks()
            );
            if *size > 1 << 20 {
                assert!(
                    ours.blocks() * 512 < size / 2,
                    "{version} {name}: not sparse ({} blocks)",
                    ours.blocks()
                );
            }
        }
    }
}
