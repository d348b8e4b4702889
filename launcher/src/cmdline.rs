//! The qemu-system-x86_64 command line built from a spec.
//!
//! Everything a path can appear in is passed as JSON (`-blockdev`, `-device`) so commas and spaces
//! need no escaping; the two chardevs (QMP socket, serial log) still use QemuOpts syntax, where a
//! comma inside a value is written twice. The VM starts paused (`-S`): the lifecycle checks the
//! block devices over QMP before it lets the guest run. No default devices, no user config, no
//! display, no reboot unless the spec asks for it.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::accel::Resolved;
use super::disk::{self, DiskIo, SCSI_CONTROLLER};
use super::error::Result;
use super::spec::{DiskSpec, VmSpec};

/// Files qemu creates or writes, all chosen by the launcher.
#[derive(Debug, Clone)]
pub struct RunPaths {
    pub qmp_socket: PathBuf,
    pub serial_log: PathBuf,
    pub pidfile: PathBuf,
}

/// The arguments after the qemu binary's name.
pub fn build(
    spec: &VmSpec,
    accel: Resolved,
    disks: &[(DiskSpec, DiskIo)],
    paths: &RunPaths,
) -> Result<Vec<OsString>> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&OsStr]| args.extend(items.iter().map(|s| s.to_os_string()));
    let s = |v: &str| OsString::from(v);
    let json = |v: &Value| OsString::from(v.to_string());

    push(&[
        &s("-name"),
        &s(&format!("guest={},debug-threads=on", spec.name)),
    ]);
    push(&[&s("-no-user-config"), &s("-nodefaults")]);
    push(&[&s("-machine"), &s(&spec.machine)]);
    push(&[&s("-accel"), &s(accel.qemu_accel())]);
    push(&[&s("-cpu"), &s(accel.qemu_cpu())]);
    push(&[&s("-smp"), &s(&spec.vcpus.to_string())]);
    push(&[&s("-m"), &s(&format!("{}M", spec.memory_mib()?))]);
    push(&[&s("-display"), &s("none")]);
    push(&[&s("-S")]);
    if spec.no_reboot {
        push(&[&s("-no-reboot")]);
    }
    push(&[&s("-pidfile"), paths.pidfile.as_os_str()]);
    push(&[
        &s("-chardev"),
        &opts_with_path("socket,id=qmp,server=on,wait=off,path=", &paths.qmp_socket),
    ]);
    push(&[&s("-mon"), &s("chardev=qmp,mode=control")]);
    push(&[
        &s("-chardev"),
        &opts_with_path("file,id=serial0,path=", &paths.serial_log),
    ]);
    push(&[&s("-serial"), &s("chardev:serial0")]);
    // pvpanic turns a guest kernel panic into a GUEST_PANICKED event instead of a silent hang.
    push(&[&s("-device"), &json(&json!({"driver": "pvpanic"}))]);
    // Always present so virtio-scsi disks can be hot-plugged later, as KubeVirt does.
    push(&[
        &s("-device"),
        &json(&json!({"driver": "virtio-scsi-pci", "id": SCSI_CONTROLLER})),
    ]);
    if let Some(k) = &spec.kernel_boot {
        push(&[&s("-kernel"), k.kernel.as_os_str()]);
        if let Some(initrd) = &k.initrd {
            push(&[&s("-initrd"), initrd.as_os_str()]);
        }
        if let Some(cmdline) = &k.cmdline {
            push(&[&s("-append"), &s(cmdline)]);
        }
    }
    for (d, io) in disks {
        for node in disk::blockdev_nodes(d, *io) {
            push(&[&s("-blockdev"), &json(&node)]);
        }
        push(&[&s("-device"), &json(&disk::device(d, *io))]);
    }
    Ok(args)
}

/// `prefix` followed by `path` with every comma doubled (QemuOpts escaping).
fn opts_with_path(prefix: &str, path: &Path) -> OsString {
    let mut bytes = prefix.as_bytes().to_vec();
    for &b in path.as_os_str().as_bytes() {
        bytes.push(b);
        if b == b',' {
            bytes.push(b',');
        }
    }
    OsString::from_vec(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::choose_io;
    use crate::spec::{Bus, KernelBoot, Quantity};

    fn spec() -> VmSpec {
        let mut s = VmSpec::new("vm-1");
        s.vcpus = 2;
        s.memory = Quantity::Text("128Mi".into());
        s.kernel_boot = Some(KernelBoot {
            kernel: "/k/vmlinuz".into(),
            initrd: Some("/k/initrd".into()),
            cmdline: Some("console=ttyS0 quiet".into()),
        });
        s.disks = vec![
            DiskSpec {
                name: "root".into(),
                path: "/vols/pvc a,1/disk.img".into(),
                bus: Bus::VirtioBlk,
                readonly: false,
                boot_order: Some(1),
            },
            DiskSpec {
                name: "data".into(),
                path: "/dev/sdz".into(),
                bus: Bus::VirtioScsi,
                readonly: true,
                boot_order: None,
            },
        ];
        s
    }

    fn args_of(spec: &VmSpec, accel: Resolved) -> Vec<String> {
        let disks = vec![
            (spec.disks[0].clone(), choose_io(false, true, false)),
            (spec.disks[1].clone(), choose_io(true, true, false)),
        ];
        let paths = RunPaths {
            qmp_socket: "/run/q,x/qmp.sock".into(),
            serial_log: "/run/q,x/serial.log".into(),
            pidfile: "/run/q,x/qemu.pid".into(),
        };
        build(spec, accel, &disks, &paths)
            .unwrap()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    /// The value following each occurrence of `flag`.
    fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn basic_shape() {
        let a = args_of(&spec(), Resolved::Tcg);
        assert_eq!(values(&a, "-accel"), ["tcg"]);
        assert_eq!(values(&a, "-cpu"), ["max"]);
        assert_eq!(values(&a, "-smp"), ["2"]);
        assert_eq!(values(&a, "-m"), ["128M"]);
        assert_eq!(values(&a, "-machine"), ["pc"]);
        assert_eq!(values(&a, "-display"), ["none"]);
        for flag in ["-S", "-no-reboot", "-nodefaults", "-no-user-config"] {
            assert!(a.iter().any(|x| x == flag), "{flag} missing in {a:?}");
        }
        assert!(!a.iter().any(|x| x == "-nographic"));
        assert_eq!(values(&a, "-kernel"), ["/k/vmlinuz"]);
        assert_eq!(values(&a, "-initrd"), ["/k/initrd"]);
        assert_eq!(values(&a, "-append"), ["console=ttyS0 quiet"]);
        assert_eq!(values(&a, "-pidfile"), ["/run/q,x/qemu.pid"]);
        let k = args_of(&spec(), Resolved::Kvm);
        assert_eq!(values(&k, "-accel"), ["kvm"]);
        assert_eq!(values(&k, "-cpu"), ["host"]);
    }

    #[test]
    fn chardev_paths_escape_commas() {
        let a = args_of(&spec(), Resolved::Tcg);
        assert_eq!(
            values(&a, "-chardev"),
            [
                "socket,id=qmp,server=on,wait=off,path=/run/q,,x/qmp.sock",
                "file,id=serial0,path=/run/q,,x/serial.log"
            ]
        );
        assert_eq!(values(&a, "-mon"), ["chardev=qmp,mode=control"]);
        assert_eq!(values(&a, "-serial"), ["chardev:serial0"]);
    }

    #[test]
    fn disks_as_json_blockdevs() {
        let a = args_of(&spec(), Resolved::Tcg);
        let blockdevs: Vec<Value> = values(&a, "-blockdev")
            .iter()
            .map(|j| serde_json::from_str(j).unwrap())
            .collect();
        assert_eq!(blockdevs.len(), 4);
        // The root disk is a sparse file: O_DIRECT but thread-pool AIO.
        assert_eq!(blockdevs[0]["filename"], "/vols/pvc a,1/disk.img");
        assert_eq!(blockdevs[0]["cache"]["direct"], true);
        assert_eq!(blockdevs[0]["aio"], "threads");
        assert_eq!(blockdevs[1]["driver"], "raw");
        assert_eq!(blockdevs[1]["file"], "file-root");
        // The data disk is a block device: host_device, native AIO, read-only on both nodes.
        assert_eq!(blockdevs[2]["driver"], "host_device");
        assert_eq!(blockdevs[2]["aio"], "native");
        assert_eq!(blockdevs[2]["read-only"], true);
        assert_eq!(blockdevs[3]["read-only"], true);

        let devices: Vec<Value> = values(&a, "-device")
            .iter()
            .map(|j| serde_json::from_str(j).unwrap())
            .collect();
        let drivers: Vec<&str> = devices
            .iter()
            .map(|d| d["driver"].as_str().unwrap())
            .collect();
        assert_eq!(
            drivers,
            ["pvpanic", "virtio-scsi-pci", "virtio-blk-pci", "scsi-hd"]
        );
        assert_eq!(devices[2]["bootindex"], 1);
        assert_eq!(devices[2]["drive"], "fmt-root");
        assert!(devices[3].get("bootindex").is_none());
        // Every -blockdev comes before the -device that uses it.
        let pos = |needle: &str| a.iter().position(|x| x.contains(needle)).unwrap();
        assert!(pos("\"node-name\":\"fmt-data\"") < pos("\"drive\":\"fmt-data\""));
    }

    #[test]
    fn reboot_and_kernel_are_optional() {
        let mut s = spec();
        s.no_reboot = false;
        s.kernel_boot = None;
        let a = args_of(&s, Resolved::Tcg);
        assert!(
            !a.iter()
                .any(|x| x == "-no-reboot" || x == "-kernel" || x == "-append")
        );
    }
}
