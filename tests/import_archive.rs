//! `quarry import --archive`: tar archives (plain, gzip, xz, zstd; from a file, stdin and HTTP)
//! extracted into a directory, with every hostile entry refused before anything escapes the
//! target, and a failed extraction leaving the target as it was.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use testkit::nginx::{Nginx, NginxConfig};

mod common;
use common::archive::{check_tree, nothing_of_quarry_left, pack, python_tar, sample_tree};
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

use std::os::unix::fs::MetadataExt;

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
