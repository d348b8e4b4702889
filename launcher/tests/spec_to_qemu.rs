//! The launcher through its public API, without booting anything: a YAML spec file over real
//! volumes (a filesystem volume's directory, a preallocated image, paths with commas and spaces)
//! goes through the steps a launch takes (parse and validate, resolve and probe each disk, pick
//! the accelerator, lay out the run directory) into the exact qemu command line; `launcher::run`
//! hands that command line to the qemu it starts (a stand-in script that records its arguments
//! and fails as qemu does) and reports the failure with qemu's words; bad specs are refused with
//! their kind and a message that names the problem, before any qemu starts.
//!
//! Booting real guests is the root `tests/launch.rs`'s job.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use launcher::accel::{HostVirt, Resolved};
use launcher::disk::DiskIo;
use launcher::spec::DiskSpec;
use launcher::{ErrorKind, LaunchPaths, State, VmSpec};
use serde_json::{Value, json};

/// A temp dir on the build's filesystem, which takes `O_DIRECT` (ext4 or xfs; `/tmp` may be a
/// tmpfs that does not, on older kernels), so the probe's outcome is known.
fn workdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// The volumes of the spec: `vol root,1/` (a filesystem volume: a directory holding a sparse
/// `disk.img`) and `data.img` (fully written, so preallocated).
fn volumes(dir: &Path) -> (PathBuf, PathBuf) {
    let fs_volume = dir.join("vol root,1");
    std::fs::create_dir(&fs_volume).unwrap();
    std::fs::File::create(fs_volume.join("disk.img"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let data = dir.join("data.img");
    std::fs::write(&data, vec![0x5a; 1 << 20]).unwrap();
    (fs_volume, data)
}

/// The spec file: the two volumes, the run directory `run,x/`, and what `extra` adds.
fn spec_file(dir: &Path, fs_volume: &Path, data: &Path, extra: &str) -> PathBuf {
    let yaml = format!(
        "name: web-1
vcpus: 2
memory: 256Mi
allowEmulation: true
runDir: {run:?}
bootWatchdogSeconds: 0
disks:
  - name: root
    path: {root:?}
    bootOrder: 1
  - name: data
    path: {data:?}
    bus: virtio-scsi
    readonly: true
{extra}",
        run = dir.join("run,x"),
        root = fs_volume,
        data = data,
    );
    let path = dir.join("vm.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// What a launch does before it starts qemu: each disk resolved and probed, on `host`.
fn command_line(spec: &VmSpec, host: HostVirt) -> (Resolved, Vec<OsString>) {
    let accel = launcher::accel::resolve(spec.accel, spec.allow_emulation, host).unwrap();
    let disks: Vec<(DiskSpec, DiskIo)> = spec
        .disks
        .iter()
        .map(launcher::disk::resolve)
        .map(|d| {
            let io = launcher::disk::probe(&d).unwrap();
            (d, io)
        })
        .collect();
    let paths = LaunchPaths::for_spec(spec);
    let args = launcher::cmdline::build(spec, accel, &disks, &paths.qemu).unwrap();
    (accel, args)
}

/// Arguments as JSON values: the JSON ones (`-blockdev`, `-device`) parsed, so that they compare
/// by content, the others as strings.
fn as_values(args: &[OsString]) -> Vec<Value> {
    args.iter()
        .map(|a| {
            let a = a.to_str().expect("UTF-8 argument");
            if a.starts_with('{') {
                serde_json::from_str(a).unwrap()
            } else {
                json!(a)
            }
        })
        .collect()
}

/// The expected command line for the spec of [`spec_file`] with a kernel boot.
fn expected(dir: &Path, fs_volume: &Path, data: &Path, accel: &str, cpu: &str) -> Vec<Value> {
    let run = dir.join("run,x").display().to_string();
    let escaped = run.replace(',', ",,");
    let root = fs_volume.join("disk.img").display().to_string();
    let data = data.display().to_string();
    let args = [
        json!("-name"),
        json!("guest=web-1,debug-threads=on"),
        json!("-no-user-config"),
        json!("-nodefaults"),
        json!("-machine"),
        json!("pc"),
        json!("-accel"),
        json!(accel),
        json!("-cpu"),
        json!(cpu),
        json!("-smp"),
        json!("2"),
        json!("-m"),
        json!("256M"),
        json!("-display"),
        json!("none"),
        json!("-S"),
        json!("-no-reboot"),
        json!("-pidfile"),
        json!(format!("{run}/qemu.pid")),
        json!("-chardev"),
        json!(format!(
            "socket,id=qmp,server=on,wait=off,path={escaped}/qmp.sock"
        )),
        json!("-mon"),
        json!("chardev=qmp,mode=control"),
        json!("-chardev"),
        json!(format!("file,id=serial0,path={escaped}/serial.log")),
        json!("-serial"),
        json!("chardev:serial0"),
        json!("-device"),
        json!({"driver": "pvpanic"}),
        json!("-device"),
        json!({"driver": "virtio-scsi-pci", "id": "scsi0"}),
        json!("-kernel"),
        json!("/boot/vmlinuz"),
        json!("-append"),
        json!("console=ttyS0 root=/dev/vda"),
        // The sparse root image: the page cache bypassed, but thread-pool AIO (native AIO
        // would block on allocation).
        json!("-blockdev"),
        json!({"driver": "file", "filename": root, "node-name": "file-root",
               "cache": {"direct": true, "no-flush": false}, "aio": "threads",
               "discard": "unmap", "read-only": false}),
        json!("-blockdev"),
        json!({"driver": "raw", "file": "file-root", "node-name": "fmt-root",
               "cache": {"direct": true, "no-flush": false}, "discard": "unmap",
               "read-only": false}),
        json!("-device"),
        json!({"driver": "virtio-blk-pci", "id": "disk-root", "drive": "fmt-root",
               "write-cache": "on", "bootindex": 1}),
        // The preallocated data image: native AIO, read-only on both nodes, a SCSI LUN.
        json!("-blockdev"),
        json!({"driver": "file", "filename": data, "node-name": "file-data",
               "cache": {"direct": true, "no-flush": false}, "aio": "native",
               "discard": "unmap", "read-only": true}),
        json!("-blockdev"),
        json!({"driver": "raw", "file": "file-data", "node-name": "fmt-data",
               "cache": {"direct": true, "no-flush": false}, "discard": "unmap",
               "read-only": true}),
        json!("-device"),
        json!({"driver": "scsi-hd", "bus": "scsi0.0", "id": "disk-data", "drive": "fmt-data",
               "write-cache": "on"}),
    ];
    args.to_vec()
}

#[test]
fn a_spec_file_over_real_volumes_makes_the_expected_qemu_command_line() {
    let dir = workdir();
    let (fs_volume, data) = volumes(dir.path());
    let file = spec_file(
        dir.path(),
        &fs_volume,
        &data,
        "kernelBoot:\n  kernel: /boot/vmlinuz\n  cmdline: console=ttyS0 root=/dev/vda\n",
    );
    let spec = VmSpec::from_file(&file).unwrap();

    // No usable KVM: emulation, as the spec allows.
    let no_kvm = HostVirt {
        kvm_rw: false,
        hw_virt: false,
    };
    let (accel, args) = command_line(&spec, no_kvm);
    assert_eq!(accel, Resolved::Tcg);
    assert_eq!(
        as_values(&args),
        expected(dir.path(), &fs_volume, &data, "tcg", "max")
    );

    // Usable KVM: the same command line with the host's CPU.
    let kvm = HostVirt {
        kvm_rw: true,
        hw_virt: true,
    };
    let (accel, args) = command_line(&spec, kvm);
    assert_eq!(accel, Resolved::Kvm);
    assert_eq!(
        as_values(&args),
        expected(dir.path(), &fs_volume, &data, "kvm", "host")
    );

    // A /dev/kvm without hardware virtualisation (nested, paravirtual) is not usable KVM, and
    // `accel: kvm` asks for nothing else.
    let mut kvm_only = spec.clone();
    kvm_only.accel = launcher::spec::Accel::Kvm;
    let half = HostVirt {
        kvm_rw: true,
        hw_virt: false,
    };
    let e = launcher::accel::resolve(kvm_only.accel, kvm_only.allow_emulation, half).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.to_string().contains("vmx/svm"), "{e}");
}

/// A stand-in for qemu-system-x86_64: records its arguments (NUL-separated) in `args`, says
/// what real qemu says when it cannot start, and exits 1.
fn fake_qemu(dir: &Path) -> (PathBuf, PathBuf) {
    let args = dir.join("qemu-args");
    let script = dir.join("fake-qemu");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s\\0' \"$@\" > '{}'\necho 'qemu-system-x86_64: fake: cannot start here' >&2\nexit 1\n",
            args.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, args)
}

/// The status file's record.
fn status(spec: &VmSpec) -> Value {
    let text = std::fs::read_to_string(LaunchPaths::for_spec(spec).status_file).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn run_starts_qemu_with_that_command_line_and_reports_its_failure_in_qemu_s_words() {
    let dir = workdir();
    let (fs_volume, data) = volumes(dir.path());
    let (qemu, recorded) = fake_qemu(dir.path());
    let file = spec_file(
        dir.path(),
        &fs_volume,
        &data,
        &format!("accel: tcg\nqemu: {qemu:?}\n"),
    );
    let spec = VmSpec::from_file(&file).unwrap();
    let (_, built) = command_line(
        &spec,
        HostVirt {
            kvm_rw: false,
            hw_virt: false,
        },
    );

    let outcome = launcher::run(spec.clone(), std::future::pending())
        .await
        .unwrap();
    assert_eq!(
        (outcome.state, outcome.reason.code),
        (State::Failed, "StartFailed")
    );
    let message = &outcome.reason.message;
    assert!(
        message.contains("before its QMP socket was ready"),
        "{message}"
    );
    assert!(
        message.contains("qemu said: qemu-system-x86_64: fake: cannot start here"),
        "{message}"
    );

    // qemu got exactly the command line the spec makes.
    let got = std::fs::read(&recorded).unwrap();
    let got: Vec<OsString> = got
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| OsString::from(String::from_utf8(a.to_vec()).unwrap()))
        .collect();
    assert_eq!(got, built);

    // The status file holds the final state; the QMP socket is not left behind.
    let st = status(&spec);
    assert_eq!(st["vm"], "web-1");
    assert_eq!(st["state"], "Failed");
    assert_eq!(st["reason"]["code"], "StartFailed");
    assert!(st["qemu_pid"].as_u64().is_some(), "{st}");
    let paths = LaunchPaths::for_spec(&spec);
    assert!(!paths.qemu.qmp_socket.exists());
    assert!(
        std::fs::read_to_string(&paths.qemu_log)
            .unwrap()
            .contains("fake: cannot start here")
    );
}

#[tokio::test]
async fn bad_specs_are_refused_with_the_problem_named_and_no_qemu_started() {
    let dir = workdir();
    let (fs_volume, data) = volumes(dir.path());
    let (qemu, recorded) = fake_qemu(dir.path());

    // A misspelt field, and a spec file that is not there.
    let typo = spec_file(dir.path(), &fs_volume, &data, "vcpu: 4\n");
    let e = VmSpec::from_file(&typo).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("vcpu"), "{e}");
    let missing = dir.path().join("absent.yaml");
    let e = VmSpec::from_file(&missing).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.to_string().contains("absent.yaml"), "{e}");

    // A filesystem volume without its disk.img: a valid spec, refused when the disk is probed,
    // before qemu is started.
    std::fs::remove_file(fs_volume.join("disk.img")).unwrap();
    let file = spec_file(
        dir.path(),
        &fs_volume,
        &data,
        &format!("accel: tcg\nqemu: {qemu:?}\n"),
    );
    let spec = VmSpec::from_file(&file).unwrap();
    let resolved = launcher::disk::resolve(&spec.disks[0]);
    assert_eq!(resolved.path, fs_volume.join("disk.img"));
    let e = launcher::disk::probe(&resolved).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("vol root,1/disk.img"), "{e}");

    let outcome = launcher::run(spec.clone(), std::future::pending())
        .await
        .unwrap();
    assert_eq!(
        (outcome.state, outcome.reason.code),
        (State::Failed, "InvalidSpec")
    );
    assert!(
        outcome.reason.message.contains("vol root,1/disk.img"),
        "{}",
        outcome.reason.message
    );
    assert!(!recorded.exists(), "qemu was started");
    let st = status(&spec);
    assert_eq!(st["reason"]["code"], "InvalidSpec");
    assert!(st.get("qemu_pid").is_none(), "{st}");
}
