//! OVA import: a tar holding an OVF descriptor and its disks, imported as the descriptor's first
//! disk (or the one `--disk` names) straight out of the tar, compared with qemu-img's conversion.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::nginx::{Nginx, NginxConfig};
use testkit::qemu::{convert_to_raw, qemu_img};

mod common;
use common::*;

/// An OVF listing `system` as its first disk and `data` as its second (with a blank disk between,
/// which has no file).
fn ovf(system: &str, data: &str) -> String {
    ovf_with(system, "", data)
}

/// [`ovf`], with `attrs` (e.g. `ovf:compression="gzip"`) added to `system`'s `<File>`.
fn ovf_with(system: &str, attrs: &str, data: &str) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1">
  <References>
    <File ovf:href="{data}" ovf:id="file2"/>
    <File ovf:href="{system}" ovf:id="file1" {attrs}/>
  </References>
  <DiskSection>
    <Info>Virtual disks</Info>
    <Disk ovf:capacity="8" ovf:capacityAllocationUnits="byte * 2^20" ovf:diskId="vmdisk1" ovf:fileRef="file1"/>
    <Disk ovf:capacity="1" ovf:diskId="blank"/>
    <Disk ovf:capacity="8" ovf:capacityAllocationUnits="byte * 2^20" ovf:diskId="vmdisk2" ovf:fileRef="file2"/>
  </DiskSection>
  <VirtualSystem ovf:id="vm"><Info>A VM</Info></VirtualSystem>
</Envelope>
"#
    )
}

/// Packs `members` of `dir`, in that order, into `out` with GNU tar.
fn tar(dir: &Path, out: &Path, members: &[&str]) {
    let status = Command::new("tar")
        .args(["-C", arg(dir), "-cf", arg(out)])
        .args(members)
        .status()
        .expect("running tar");
    assert!(status.success());
}

/// `dir/vm.ova`: the descriptor, then `data.img` (raw, the second disk) before `system.qcow2`
/// (the first disk); returns the OVA and the two disks' raw conversions.
fn sample_ova(dir: &Path) -> (PathBuf, Vec<u8>, Vec<u8>) {
    let (qcow2, system) = sample_qcow2(dir);
    fs::rename(&qcow2, dir.join("system.qcow2")).unwrap();
    let data: Vec<u8> = (0..(3u32 << 20) + 512).map(|i| (i % 251) as u8).collect();
    fs::write(dir.join("data.img"), &data).unwrap();
    fs::write(dir.join("vm.ovf"), ovf("system.qcow2", "data.img")).unwrap();
    let ova = dir.join("vm.ova");
    tar(dir, &ova, &["vm.ovf", "data.img", "system.qcow2"]);
    (ova, system, data)
}

/// [`sample_ova`]'s members with the descriptor last (`dir/late.ova`).
fn late_ova(dir: &Path) -> (PathBuf, Vec<u8>, Vec<u8>) {
    let (_, system, data) = sample_ova(dir);
    let late = dir.join("late.ova");
    tar(dir, &late, &["system.qcow2", "data.img", "vm.ovf"]);
    (late, system, data)
}

/// `dir/system.vmdk`, a streamOptimized vmdk of [`sample_disk`], and its raw conversion by
/// qemu-img (`dir/reference.raw`).
fn stream_optimized_vmdk(dir: &Path) -> (PathBuf, PathBuf) {
    let (raw, _) = sample_disk(dir);
    let vmdk = dir.join("system.vmdk");
    qemu_img(&[
        "convert".as_ref(),
        "-O".as_ref(),
        "vmdk".as_ref(),
        "-o".as_ref(),
        "subformat=streamOptimized".as_ref(),
        raw.as_os_str(),
        vmdk.as_os_str(),
    ]);
    let reference = dir.join("reference.raw");
    convert_to_raw(&vmdk, &reference);
    (vmdk, reference)
}

#[test]
fn the_descriptors_first_disk_is_imported_not_the_tars_first() {
    let dir = tempfile::tempdir().unwrap();
    let (ova, system, data) = sample_ova(dir.path());
    let target = dir.path().join("out.img");
    let out = run(&["import", arg(&ova), arg(&target), "--json"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), system);
    assert_eq!(
        json(&out)["format_chain"],
        serde_json::json!(["ova", "qcow2"])
    );

    for pick in ["2", "data.img", "vmdisk2"] {
        fs::remove_file(&target).unwrap();
        let out = run(&["import", arg(&ova), arg(&target), "--disk", pick, "--json"]);
        assert_ok(&out);
        assert_eq!(fs::read(&target).unwrap(), data, "--disk {pick}");
        assert_eq!(
            json(&out)["format_chain"],
            serde_json::json!(["ova", "raw"])
        );
    }

    fs::remove_file(&target).unwrap();
    let out = run(&["import", arg(&ova), arg(&target), "--disk", "3", "--json"]);
    assert_exit(&out, 10);
    let error = json(&out)["error"].as_str().unwrap().to_string();
    assert!(
        error.contains("1 system.qcow2 (vmdisk1), 2 data.img (vmdisk2)"),
        "{error}"
    );
    assert!(!target.exists());

    // --disk on something that is not an OVA.
    let out = run(&[
        "import",
        arg(&dir.path().join("data.img")),
        arg(&target),
        "--disk",
        "1",
    ]);
    assert_exit(&out, 10);
}

#[test]
fn a_compressed_ova_over_http_streams_its_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (ova, system, _) = sample_ova(dir.path());
    let served = dir.path().join("served");
    fs::create_dir(&served).unwrap();
    compress(&["gzip", "-c"], &ova, &served.join("vm.ova.gz"));
    let server = Nginx::start(NginxConfig {
        root: served.clone(),
        ranges: true,
        ..Default::default()
    });
    let target = dir.path().join("out.img");
    let out = run(&["import", &server.url("/vm.ova.gz"), arg(&target), "--json"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), system);
    let report = json(&out);
    assert_eq!(
        report["format_chain"],
        serde_json::json!(["gzip", "ova", "qcow2"])
    );
    assert_eq!(
        report["source_bytes"],
        fs::metadata(served.join("vm.ova.gz")).unwrap().len()
    );
}

#[test]
fn an_ova_with_its_descriptor_after_its_disks_is_imported_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let (late, system, data) = late_ova(dir.path());
    let target = dir.path().join("out.img");
    let out = run(&["import", arg(&late), arg(&target), "--json"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), system);
    assert_eq!(
        json(&out)["format_chain"],
        serde_json::json!(["ova", "qcow2"])
    );
    let out = run(&["import", arg(&late), arg(&target), "--disk", "2"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);
}

#[test]
fn a_streamed_ova_holds_the_disks_before_its_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let (_, system, data) = sample_ova(dir.path());
    let served = dir.path().join("served");
    fs::create_dir(&served).unwrap();
    // The chosen disk before the descriptor (held, then spilled past a 64 KiB budget), and after
    // it with another disk before (held, then dropped).
    tar(
        dir.path(),
        &served.join("disk-first.ova"),
        &["system.qcow2", "data.img", "vm.ovf"],
    );
    tar(
        dir.path(),
        &served.join("disk-after.ova"),
        &["data.img", "vm.ovf", "system.qcow2"],
    );
    compress(
        &["gzip", "-c"],
        &served.join("disk-first.ova"),
        &dir.path().join("disk-first.ova.gz"),
    );
    let server = Nginx::start(NginxConfig {
        root: served.clone(),
        ranges: true,
        ..Default::default()
    });
    let target = dir.path().join("out.img");
    for (source, disk, expected) in [
        (server.url("/disk-first.ova"), "1", &system),
        (server.url("/disk-first.ova"), "2", &data),
        (server.url("/disk-after.ova"), "1", &system),
        (
            arg(&dir.path().join("disk-first.ova.gz")).into(),
            "1",
            &system,
        ),
    ] {
        let out = quarry()
            .env("QUARRY_LOG", "info")
            .args(["import", &source, arg(&target), "--disk", disk])
            .args(["--memory-budget", "64Ki"])
            .output()
            .unwrap();
        assert_ok(&out);
        assert_eq!(
            &fs::read(&target).unwrap(),
            expected,
            "{source} --disk {disk}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        let held = stderr
            .lines()
            .find(|l| l.contains("streaming the held disk"));
        if source.contains("disk-after") {
            assert!(held.is_none(), "{source}: {stderr}");
        } else {
            let spilled: u64 = held
                .and_then(|l| l.split("spilled=").nth(1))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{source}: no hold reported: {stderr}"));
            assert!(
                spilled > 0,
                "{source}: nothing spilled past 64 KiB: {stderr}"
            );
        }
    }
}

#[test]
fn an_ova_on_stdin_with_its_disk_before_its_descriptor_is_known_by_its_disk() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (late, system, data) = late_ova(dir.path());
    let target = dir.path().join("out.img");
    for (disk, expected) in [("1", &system), ("2", &data)] {
        let mut child = quarry()
            .args(["import", "-", arg(&target), "--disk", disk, "--json"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&fs::read(&late).unwrap()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert_ok(&out);
        assert_eq!(&fs::read(&target).unwrap(), expected, "--disk {disk}");
        let chain = &json(&out)["format_chain"];
        assert_eq!(chain[0], "ova", "{chain}");
    }
}

#[test]
fn an_ova_without_a_descriptor_or_its_disk_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    sample_ova(dir.path());
    let target = dir.path().join("out.img");
    let bare = dir.path().join("bare.ova");
    tar(dir.path(), &bare, &["system.qcow2", "data.img"]);
    let gz = dir.path().join("bare.ova.gz");
    compress(&["gzip", "-c"], &bare, &gz);
    for source in [&bare, &gz] {
        let out = run(&["import", arg(source), arg(&target), "--json"]);
        assert_exit(&out, 12);
        let error = json(&out)["error"].as_str().unwrap().to_string();
        assert!(error.contains("no OVF descriptor"), "{error}");
        assert!(!target.exists());
    }

    // A descriptor naming a file the archive lacks.
    fs::write(dir.path().join("vm.ovf"), ovf("missing.qcow2", "data.img")).unwrap();
    let broken = dir.path().join("broken.ova");
    tar(dir.path(), &broken, &["vm.ovf", "data.img"]);
    let out = run(&["import", arg(&broken), arg(&target)]);
    assert_exit(&out, 12);
    assert!(!target.exists());
}

#[test]
fn a_disk_whose_compression_or_chunks_cannot_be_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    sample_ova(d);
    let target = d.join("out.img");
    for (attrs, code, says) in [
        // Said to be gzip, but stored plain: read as it is, it would be a wrong disk.
        (r#"ovf:compression="gzip""#, 12, "its bytes are not gzip"),
        (r#"ovf:compression="bzip2""#, 11, "only gzip"),
        (r#"ovf:chunkSize="1048576""#, 11, "ovf:chunkSize"),
    ] {
        fs::write(
            d.join("vm.ovf"),
            ovf_with("system.qcow2", attrs, "data.img"),
        )
        .unwrap();
        let ova = d.join("odd.ova");
        tar(d, &ova, &["vm.ovf", "system.qcow2", "data.img"]);
        let out = run(&["import", arg(&ova), arg(&target), "--json"]);
        assert_exit(&out, code);
        let error = json(&out)["error"].as_str().unwrap().to_string();
        assert!(error.contains(says), "{attrs}: {error}");
        assert!(!target.exists(), "{attrs}");
    }
}

/// The streamOptimized vmdk VMware exports, stored plain and gzip-compressed
/// (`ovf:compression="gzip"`), equals qemu-img's conversion of the vmdk.
#[test]
fn an_ova_of_a_stream_optimized_vmdk_is_imported_plain_or_gzip_compressed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (vmdk, reference) = stream_optimized_vmdk(d);
    compress(&["gzip", "-c"], &vmdk, &d.join("system.vmdk.gz"));
    fs::write(d.join("data.img"), b"x").unwrap();
    for (member, attrs, chain) in [
        ("system.vmdk", "", &["ova", "vmdk"][..]),
        (
            "system.vmdk.gz",
            r#"ovf:compression="gzip""#,
            &["ova", "gzip", "vmdk"],
        ),
    ] {
        fs::write(d.join("vm.ovf"), ovf_with(member, attrs, "data.img")).unwrap();
        let ova = d.join("vm.ova");
        tar(d, &ova, &["vm.ovf", member, "data.img"]);
        let target = d.join("out.img");
        let out = run(&["import", arg(&ova), arg(&target), "--json"]);
        assert_ok(&out);
        assert!(
            fs::read(&target).unwrap() == fs::read(&reference).unwrap(),
            "{member}: not qemu-img's bytes"
        );
        assert_eq!(
            json(&out)["format_chain"],
            serde_json::json!(chain),
            "{member}"
        );
        fs::remove_file(&target).unwrap();
    }
}

/// `quarry import - TARGET ARGS... --json` with `source` on stdin.
fn import_stdin(source: &Path, target: &Path, args: &[&str]) -> std::process::Output {
    quarry()
        .args(["import", "-", arg(target), "--json"])
        .args(args)
        .stdin(fs::File::open(source).unwrap())
        .output()
        .unwrap()
}

/// Packs `members` of `dir` into `out` with Python's tarfile in `format` (`GNU_FORMAT`,
/// `PAX_FORMAT`).
fn python_tar(dir: &Path, out: &Path, members: &[&str], format: &str) {
    let script = format!(
        "import sys, tarfile\nwith tarfile.open(sys.argv[1], 'w', format=tarfile.{format}) as t:\n    for m in sys.argv[2:]:\n        t.add(m)\n"
    );
    let status = Command::new("python3")
        .current_dir(dir)
        .args(["-c", &script, arg(out)])
        .args(members)
        .status()
        .expect("running python3");
    assert!(status.success());
}

#[test]
fn an_ova_whose_first_member_has_a_long_name_is_known_on_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let (_, system, _) = sample_ova(dir.path());
    let long = format!("{}.ovf", "a-vm-exported-with-a-very-long-name-".repeat(4));
    fs::write(dir.path().join(&long), ovf("system.qcow2", "data.img")).unwrap();
    let members = [long.as_str(), "data.img", "system.qcow2"];
    let gnu = dir.path().join("gnu.tar");
    tar(dir.path(), &gnu, &members); // GNU tar: a long-name ('L') header first
    let pax = dir.path().join("pax.tar");
    python_tar(dir.path(), &pax, &members, "PAX_FORMAT"); // an 'x' header first
    let posix = dir.path().join("posix.tar");
    let status = Command::new("tar")
        .args(["-C", arg(dir.path()), "--format=posix", "-cf", arg(&posix)])
        .args(["vm.ovf", "data.img", "system.qcow2"])
        .status()
        .unwrap();
    assert!(status.success()); // GNU tar's PAX headers, even for short names
    let target = dir.path().join("out.img");
    for ova in [&gnu, &pax, &posix] {
        let out = import_stdin(ova, &target, &[]);
        assert_ok(&out);
        assert_eq!(fs::read(&target).unwrap(), system, "{}", ova.display());
        assert_eq!(json(&out)["format_chain"][0], "ova");
    }
}

/// `dir/holes.img`: 4 MiB with data only in its first and last 4 KiB (a file with holes).
fn disk_with_holes(dir: &Path) -> Vec<u8> {
    let mut disk = vec![0u8; 4 << 20];
    disk[..4096].fill(0x5a);
    let end = disk.len();
    disk[end - 4096..].fill(0xa5);
    let path = dir.join("holes.img");
    let f = fs::File::create(&path).unwrap();
    f.set_len(disk.len() as u64).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&disk[..4096], 0).unwrap();
    f.write_all_at(&disk[end - 4096..], (end - 4096) as u64)
        .unwrap();
    disk
}

#[test]
fn an_ova_whose_disk_is_a_pax_sparse_file_reads_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let disk = disk_with_holes(dir.path());
    fs::write(dir.path().join("vm.ovf"), ovf("holes.img", "holes.img")).unwrap();
    let target = dir.path().join("out.img");
    for version in ["0.0", "0.1", "1.0"] {
        let ova = dir.path().join(format!("sparse-{version}.ova"));
        let status = Command::new("tar")
            .args(["-C", arg(dir.path()), "--sparse", "--format=posix"])
            .arg(format!("--sparse-version={version}"))
            .args(["-cf", arg(&ova), "vm.ovf", "holes.img"])
            .status()
            .unwrap();
        assert!(status.success());
        // The tar stores the data, not the holes.
        assert!(fs::metadata(&ova).unwrap().len() < 1 << 20, "{version}");
        for out in [
            run(&["import", arg(&ova), arg(&target), "--json"]),
            import_stdin(&ova, &target, &[]),
        ] {
            assert_ok(&out);
            assert_eq!(fs::read(&target).unwrap(), disk, "sparse {version}");
        }
    }
}

#[test]
fn a_descriptor_naming_itself_or_ambiguous_members_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, _) = sample_ova(dir.path());
    let target = dir.path().join("out.img");
    let refused = |ova: &Path, what: &str| {
        for out in [
            run(&["import", arg(ova), arg(&target), "--json"]),
            import_stdin(ova, &target, &[]),
        ] {
            assert_exit(&out, 12);
            let error = json(&out)["error"].as_str().unwrap().to_string();
            assert!(error.contains(what), "{}: {error}", ova.display());
            assert!(!target.exists());
        }
    };
    // The descriptor's disk is the descriptor.
    let sub = dir.path().join("self");
    fs::create_dir(&sub).unwrap();
    fs::write(sub.join("vm.ovf"), ovf("vm.ovf", "vm.ovf")).unwrap();
    let ova = dir.path().join("self.ova");
    tar(&sub, &ova, &["vm.ovf"]);
    refused(&ova, "names itself");
    // Two descriptors.
    fs::write(dir.path().join("other.ovf"), ovf("data.img", "data.img")).unwrap();
    let ova = dir.path().join("two.ova");
    tar(
        dir.path(),
        &ova,
        &["vm.ovf", "other.ovf", "system.qcow2", "data.img"],
    );
    refused(&ova, "two OVF descriptors");
    // Two members of the disk's name (tar -r appends the second).
    let ova = dir.path().join("twice.ova");
    tar(dir.path(), &ova, &["vm.ovf", "system.qcow2", "data.img"]);
    let status = Command::new("tar")
        .args(["-C", arg(dir.path()), "-rf", arg(&ova), "system.qcow2"])
        .status()
        .unwrap();
    assert!(status.success());
    refused(&ova, "two members named system.qcow2");
}
