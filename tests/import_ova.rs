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
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1">
  <References>
    <File ovf:href="{data}" ovf:id="file2"/>
    <File ovf:href="{system}" ovf:id="file1"/>
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
fn an_ova_with_its_descriptor_after_a_disk_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    sample_ova(dir.path());
    let late = dir.path().join("late.ova");
    tar(dir.path(), &late, &["system.qcow2", "vm.ovf"]);
    let target = dir.path().join("out.img");
    let out = run(&["import", arg(&late), arg(&target), "--json"]);
    assert_exit(&out, 11);
    let error = json(&out)["error"].as_str().unwrap().to_string();
    assert!(error.contains("needs its .ovf first"), "{error}");
    assert!(!target.exists());

    // A descriptor naming a file the archive lacks is corrupt.
    fs::write(dir.path().join("vm.ovf"), ovf("missing.qcow2", "data.img")).unwrap();
    let broken = dir.path().join("broken.ova");
    tar(dir.path(), &broken, &["vm.ovf", "data.img"]);
    let out = run(&["import", arg(&broken), arg(&target)]);
    assert_exit(&out, 12);
    assert!(!target.exists());
}

#[test]
fn an_ova_of_a_stream_optimized_vmdk_is_imported() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (raw, _) = sample_disk(d);
    let vmdk = d.join("system.vmdk");
    qemu_img(&[
        "convert".as_ref(),
        "-O".as_ref(),
        "vmdk".as_ref(),
        "-o".as_ref(),
        "subformat=streamOptimized".as_ref(),
        raw.as_os_str(),
        vmdk.as_os_str(),
    ]);
    let reference = d.join("reference.raw");
    convert_to_raw(&vmdk, &reference);
    fs::write(d.join("data.img"), b"x").unwrap();
    fs::write(d.join("vm.ovf"), ovf("system.vmdk", "data.img")).unwrap();
    let ova = d.join("vm.ova");
    tar(d, &ova, &["vm.ovf", "system.vmdk", "data.img"]);
    let target = d.join("out.img");
    let out = run(&["import", arg(&ova), arg(&target), "--json"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), fs::read(&reference).unwrap());
    assert_eq!(
        json(&out)["format_chain"],
        serde_json::json!(["ova", "vmdk"])
    );
}
