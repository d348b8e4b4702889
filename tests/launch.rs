//! End-to-end tests of `quarry launch` and `quarry vmctl`: real qemu-system-x86_64 under TCG
//! booting a tiny Debian-made guest (see `testkit::guest`) from volumes filled by `quarry import`.
//!
//! Boot tests run one at a time (a nextest test group in `.config/nextest.toml`, and a lock for
//! plain `cargo test`): TCG boots on two cores slow each other down.

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use testkit::guest::Guest;

/// Generous bounds for waits (not timing assertions): TCG boots take seconds, CI may be loaded.
const WAIT: Duration = Duration::from_secs(120);

static ONE_BOOT_AT_A_TIME: Mutex<()> = Mutex::new(());

fn boot_lock() -> MutexGuard<'static, ()> {
    ONE_BOOT_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn have_qemu() -> bool {
    if Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok()
    {
        return true;
    }
    eprintln!("skipping: qemu-system-x86_64 is missing (scripts/setup.sh installs it)");
    false
}

/// The test guest, built once and cached in the target directory.
fn guest() -> Option<Guest> {
    if !have_qemu() {
        return None;
    }
    Guest::get(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("launcher-guest"))
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)[..64].to_string()
}

/// `quarry import SRC DIR/NAME/disk.img`; returns the volume.
fn import(src: &Path, dir: &Path, name: &str) -> PathBuf {
    let vol = dir.join(name);
    fs::create_dir_all(&vol).unwrap();
    let target = vol.join("disk.img");
    assert_ok(&run(&["import", arg(src), arg(&target)]));
    target
}

/// A small data disk (8 MiB, deterministic) named `name` in `dir`.
fn data_disk(dir: &Path, name: &str) -> PathBuf {
    let sub = dir.join(format!("src-{name}"));
    fs::create_dir_all(&sub).unwrap();
    let (raw, _) = sample_disk(&sub);
    raw
}

/// A spec for the test guest (or, without `qmode`, for booting from the first disk alone).
fn spec_yaml(name: &str, guest: Option<(&Guest, &str)>, disks: &[&Path], extra: &str) -> String {
    let mut y = format!("name: {name}\nmemory: 128Mi\naccel: tcg\nallowEmulation: true\n");
    if let Some((g, qmode)) = guest {
        y += &format!(
            "kernelBoot:\n  kernel: {:?}\n  initrd: {:?}\n  cmdline: {:?}\n",
            g.kernel,
            g.initrd,
            Guest::cmdline(qmode)
        );
    }
    y += "disks:\n";
    for (i, d) in disks.iter().enumerate() {
        y += &format!("  - name: disk{i}\n    path: {d:?}\n");
        if i == 0 {
            y += "    bootOrder: 1\n";
        } else if i == 1 {
            // The second disk exercises the virtio-scsi path.
            y += "    bus: virtio-scsi\n";
        }
    }
    y + extra
}

/// A running `quarry launch`, killed (with its qemu, through PDEATHSIG) if the test fails.
struct Launch {
    dir: PathBuf,
    child: Child,
    states: mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

impl Launch {
    fn start(dir: &Path, yaml: &str) -> Launch {
        let yaml = format!("{yaml}runDir: {:?}\n", dir.join("run"));
        let spec = dir.join("spec.yaml");
        fs::write(&spec, yaml).unwrap();
        let mut child = quarry()
            .arg("launch")
            .arg(&spec)
            .stdout(Stdio::piped())
            .stderr(fs::File::create(dir.join("launcher.err")).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, states) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Launch {
            dir: dir.to_path_buf(),
            child,
            states,
            seen: Vec::new(),
        }
    }

    fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    fn context(&self) -> String {
        format!(
            "states so far: {:?}\nlauncher stderr: {}\nserial: {}\nqemu: {}",
            self.seen,
            fs::read_to_string(self.dir.join("launcher.err")).unwrap_or_default(),
            self.serial(),
            fs::read_to_string(self.run_dir().join("qemu.log")).unwrap_or_default(),
        )
    }

    /// Waits for the state record `state` and returns it.
    fn wait_state(&mut self, state: &str) -> Value {
        if let Some(v) = self.seen.iter().find(|v| v["state"] == state) {
            return v.clone();
        }
        self.wait_new_state(state)
    }

    /// Waits for a state record `state` not seen yet.
    fn wait_new_state(&mut self, state: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        while let Ok(v) = self
            .states
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push(v.clone());
            if v["state"] == state {
                return v;
            }
        }
        panic!("no {state} state\n{}", self.context());
    }

    fn serial(&self) -> String {
        fs::read_to_string(self.run_dir().join("serial.log")).unwrap_or_default()
    }

    /// Waits until the serial console shows `needle`.
    fn wait_serial(&self, needle: &str) {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if self.serial().contains(needle) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("serial console never showed {needle:?}\n{}", self.context());
    }

    fn signal(&self, sig: libc::c_int) {
        assert_eq!(
            // SAFETY: kill(2) takes integers only; the launcher is our child, not reaped yet.
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) },
            0
        );
    }

    /// Waits for the launcher to exit; returns its status and final state record.
    fn finish(&mut self) -> (ExitStatus, Value) {
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "launcher did not exit\n{}",
                self.context()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        while let Ok(v) = self.states.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(v);
        }
        let last = self.seen.last().cloned().expect("at least one state");
        // The status file holds the same final record.
        let file: Value =
            serde_json::from_str(&fs::read_to_string(self.run_dir().join("status.json")).unwrap())
                .unwrap();
        assert_eq!(file["state"], last["state"]);
        assert_eq!(file["reason"], last["reason"]);
        (status, last)
    }

    fn qemu_pid(&mut self) -> i32 {
        self.wait_state("Running")["qemu_pid"].as_i64().unwrap() as i32
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// True once `pid` is gone (or a zombie nobody has reaped yet: it runs no more).
fn process_gone(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

fn assert_gone_soon(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !process_gone(pid) {
        assert!(Instant::now() < deadline, "qemu {pid} still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn states(l: &Launch) -> Vec<String> {
    l.seen
        .iter()
        .map(|v| v["state"].as_str().unwrap().to_string())
        .collect()
}

/// A launch under test with what it needs kept alive. Fields drop in declaration order: the
/// launcher (and its qemu) goes first, then the files, then the one-boot-at-a-time lock.
struct TestVm {
    l: Launch,
    dir: tempfile::TempDir,
    _one: MutexGuard<'static, ()>,
}

/// The test guest in `qmode` with one 8 MiB data disk (the guest's vda).
fn guest_vm(name: &str, qmode: &str, extra: &str) -> Option<(TestVm, PathBuf)> {
    let g = guest()?;
    let one = boot_lock();
    let dir = tempfile::tempdir().unwrap();
    let disk = data_disk(dir.path(), "a");
    let l = Launch::start(
        dir.path(),
        &spec_yaml(name, Some((&g, qmode)), &[&disk], extra),
    );
    Some((TestVm { _one: one, dir, l }, disk))
}

/// A VM booting from a 1 MiB disk of zeros: SeaBIOS finds no boot sector and prints nothing on
/// the serial port, so qemu runs without any guest output.
fn firmware_vm(name: &str, extra: &str) -> Option<TestVm> {
    if !have_qemu() {
        return None;
    }
    let one = boot_lock();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("zero.img");
    fs::File::create(&disk).unwrap().set_len(1 << 20).unwrap();
    let l = Launch::start(dir.path(), &spec_yaml(name, None, &[&disk], extra));
    Some(TestVm { _one: one, dir, l })
}

#[test]
fn boots_disks_imported_from_qcow2_and_xz_and_the_guest_reads_them() {
    let Some(g) = guest() else { return };
    let _one = boot_lock();
    let dir = tempfile::tempdir().unwrap();
    let raw = data_disk(dir.path(), "a");
    let qcow2 = dir.path().join("disk.qcow2");
    testkit::qemu::qemu_img(&[
        "convert".as_ref(),
        "-O".as_ref(),
        "qcow2".as_ref(),
        raw.as_os_str(),
        qcow2.as_os_str(),
    ]);
    let xz = dir.path().join("disk.raw.xz");
    compress(&["xz", "-c", "-T2"], &raw, &xz);
    let vol_a = import(&qcow2, dir.path(), "pvc-a");
    let vol_b = import(&xz, dir.path(), "pvc b,with comma");
    let (sha_a, sha_b) = (sha256(&vol_a), sha256(&vol_b));
    assert_eq!(sha_a, sha256(&raw), "the qcow2 import holds the raw disk");
    // A block volume too, when loop devices can be made (root): host_device with native AIO.
    let block = LoopDevice::new(&dir.path().join("block.backing"), 8 << 20);
    let mut disks = vec![vol_a.parent().unwrap(), &vol_b];
    if let Some(dev) = &block {
        assert_ok(&run(&["import", arg(&xz), arg(&dev.device)]));
        disks.push(&dev.device);
    }

    let mut l = Launch::start(
        dir.path(),
        &spec_yaml(
            "boot",
            Some((&g, "poweroff")),
            &disks,
            "bootWatchdogSeconds: 60\n",
        ),
    );
    let pid = l.qemu_pid();
    let (status, last) = l.finish();
    assert!(status.success(), "{}", l.context());
    assert_eq!(states(&l), ["Pending", "Running", "Succeeded"]);
    assert_eq!(last["reason"]["code"], "GuestShutdown");
    let serial = l.serial();
    // vda: the filesystem volume given as its directory; sda: virtio-scsi; vdb: the block device.
    let mut expected = vec![format!("vda {sha_a}"), format!("sda {sha_b}")];
    if let Some(dev) = &block {
        expected.push(format!("vdb {}", sha256(&dev.device)));
    }
    for e in expected {
        assert!(
            serial.contains(&format!("QUARRY-SHA256 {e}")),
            "{e}\n{serial}"
        );
    }
    assert_gone_soon(pid);
    // Sockets are cleaned up; the volumes are untouched.
    assert!(!l.run_dir().join("qmp.sock").exists());
    assert_eq!(sha256(&vol_a), sha_a);
}

#[test]
fn sigterm_powers_the_guest_down_gracefully() {
    let Some((mut vm, _)) = guest_vm("graceful", "wait", "gracePeriodSeconds: 60\n") else {
        return;
    };
    let pid = vm.l.qemu_pid();
    vm.l.wait_serial("QUARRY-WAITING");
    vm.l.signal(libc::SIGTERM);
    let (status, last) = vm.l.finish();
    assert!(status.success(), "{}", vm.l.context());
    assert_eq!(last["state"], "Succeeded");
    assert_eq!(last["reason"]["code"], "GuestShutdown");
    assert!(last["reason"]["message"].as_str().unwrap().contains("ACPI"));
    assert!(
        vm.l.serial().contains("QUARRY-POWER-BUTTON"),
        "{}",
        vm.l.context()
    );
    assert_gone_soon(pid);
}

#[test]
fn a_guest_ignoring_power_down_is_stopped_after_the_grace_period() {
    let Some((mut vm, _)) = guest_vm("deaf", "deaf", "gracePeriodSeconds: 2\n") else {
        return;
    };
    let pid = vm.l.qemu_pid();
    vm.l.wait_serial("QUARRY-WAITING");
    vm.l.signal(libc::SIGTERM);
    let (status, last) = vm.l.finish();
    assert_eq!(status.code(), Some(1), "{}", vm.l.context());
    assert_eq!(last["state"], "Failed");
    assert_eq!(last["reason"]["code"], "GracePeriodExpired");
    assert!(!vm.l.serial().contains("QUARRY-POWER-BUTTON"));
    assert_gone_soon(pid);
}

#[test]
fn boot_watchdog_fails_a_disk_that_does_not_boot() {
    let Some(mut vm) = firmware_vm("noboot", "bootWatchdogSeconds: 3\n") else {
        return;
    };
    let pid = vm.l.qemu_pid();
    let (status, last) = vm.l.finish();
    assert_eq!(status.code(), Some(1), "{}", vm.l.context());
    assert_eq!(last["state"], "Failed");
    assert_eq!(last["reason"]["code"], "WatchdogExpired");
    assert!(last["reason"]["message"].as_str().unwrap().contains("3 s"));
    assert_gone_soon(pid);
}

#[test]
fn killing_the_launcher_leaves_no_qemu_behind() {
    let Some(mut vm) = firmware_vm("orphan", "bootWatchdogSeconds: 0\n") else {
        return;
    };
    let pid = vm.l.qemu_pid();
    let pidfile = fs::read_to_string(vm.l.run_dir().join("qemu.pid")).unwrap();
    assert_eq!(
        pidfile.trim(),
        pid.to_string(),
        "qemu's own pid file agrees"
    );
    assert!(!process_gone(pid));
    vm.l.signal(libc::SIGKILL);
    assert_gone_soon(pid);
}

#[test]
fn qemu_dying_fails_the_vm_with_its_exit_status() {
    let Some(mut vm) = firmware_vm("crash", "bootWatchdogSeconds: 0\n") else {
        return;
    };
    let pid = vm.l.qemu_pid();
    // SAFETY: kill(2) takes integers only; `pid` is the qemu the launcher started for this test.
    let sent = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(sent, 0);
    let (status, last) = vm.l.finish();
    assert_eq!(status.code(), Some(1), "{}", vm.l.context());
    assert_eq!(last["state"], "Failed");
    assert_eq!(last["reason"]["code"], "QemuExited");
    assert!(
        last["reason"]["message"]
            .as_str()
            .unwrap()
            .contains("signal: 9"),
        "{}",
        vm.l.context()
    );
}

#[test]
fn hotplugged_disk_is_seen_by_the_guest_and_unplugged() {
    let Some((mut vm, _)) = guest_vm("hot", "wait", "gracePeriodSeconds: 60\n") else {
        return;
    };
    let extra_src = vm.dir.path().join("extra.raw");
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(&extra_src, &data).unwrap();
    let extra = import(&extra_src, vm.dir.path(), "pvc-hot");
    let sha = sha256(&extra);
    vm.l.wait_state("Running");
    vm.l.wait_serial("QUARRY-WAITING");
    let control = vm.l.run_dir().join("control.sock");
    let vmctl = |args: &[&str]| {
        quarry()
            .arg("vmctl")
            .arg("--control")
            .arg(&control)
            .args(args)
            .output()
            .unwrap()
    };
    assert_ok(&vmctl(&["attach", "extra", arg(&extra), "--readonly"]));
    vm.l.wait_serial(&format!("QUARRY-SHA256 vdb {sha}"));
    // The same name twice, or a boot disk's name, is refused before qemu is asked.
    for name in ["extra", "disk0"] {
        let again = vmctl(&["attach", name, arg(&extra)]);
        assert!(!again.status.success());
        let err = String::from_utf8_lossy(&again.stderr);
        assert!(err.contains(&format!("disk {name:?} is")), "{err}");
        assert!(!err.contains("Duplicate"), "{err}");
    }
    // Only hot-plugged disks can be detached.
    let cold = vmctl(&["detach", "disk0"]);
    assert!(!cold.status.success());
    let err = String::from_utf8_lossy(&cold.stderr);
    assert!(
        err.contains("a disk of the VM's spec, not hot-plugged"),
        "{err}"
    );
    assert!(!err.contains("invalid VM spec"), "{err}");

    assert_ok(&vmctl(&["detach", "extra"]));
    vm.l.wait_serial("QUARRY-GONE vdb");

    // A LUN on the virtio-scsi controller, given as its volume directory.
    let vol_dir = extra.parent().unwrap();
    assert_ok(&vmctl(&[
        "attach",
        "lun",
        arg(vol_dir),
        "--bus",
        "virtio-scsi",
    ]));
    vm.l.wait_serial(&format!("QUARRY-SHA256 sda {sha}"));
    assert_ok(&vmctl(&["detach", "lun"]));
    vm.l.wait_serial("QUARRY-GONE sda");

    // Pause and resume are reported from qemu's STOP and RESUME events.
    assert_ok(&vmctl(&["pause"]));
    vm.l.wait_new_state("Paused");
    assert_ok(&vmctl(&["resume"]));
    vm.l.wait_new_state("Running");
    vm.l.signal(libc::SIGTERM);
    let (status, last) = vm.l.finish();
    assert!(status.success(), "{}", vm.l.context());
    assert_eq!(last["reason"]["code"], "GuestShutdown");
}

/// Boots the guest in `qmode` and expects the VM to fail with reason `code`.
fn guest_fails_with(qmode: &str, code: &str) {
    let Some((mut vm, _)) = guest_vm(qmode, qmode, "") else {
        return;
    };
    let (status, last) = vm.l.finish();
    assert_eq!(status.code(), Some(1), "{}", vm.l.context());
    assert_eq!(last["reason"]["code"], code, "{}", vm.l.context());
}

#[test]
fn guest_reset_under_no_reboot_fails_the_vm() {
    guest_fails_with("reset", "GuestReset");
}

#[test]
fn guest_panic_fails_the_vm() {
    guest_fails_with("panic", "GuestPanicked");
}

/// Runs `quarry launch` on `yaml` (plus a run directory in `dir`), expects it to fail as a VM
/// (exit 1) and returns the final state record.
fn failed_launch(dir: &Path, yaml: &str) -> Value {
    failed_launch_with(dir, yaml, 1)
}

/// As [`failed_launch`], expecting exit status `code`.
fn failed_launch_with(dir: &Path, yaml: &str, code: i32) -> Value {
    let spec = dir.join("vm.yaml");
    fs::write(&spec, format!("{yaml}runDir: {:?}\n", dir.join("run"))).unwrap();
    let out = run(&["launch", arg(&spec)]);
    assert_eq!(out.status.code(), Some(code), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["state"], "Failed");
    last
}

#[test]
fn bad_specs_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("bad.yaml");
    fs::write(
        &spec,
        "name: x\nvcpus: 0\ndisks: [{name: d, path: /nope}]\n",
    )
    .unwrap();
    let out = run(&["launch", arg(&spec)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("vcpus"));

    // A valid spec whose disk is missing fails as a VM, before qemu starts, with a status, and
    // exits 2 as any spec error does.
    let run_dir = dir.path().join("run");
    let last = failed_launch_with(
        dir.path(),
        &format!(
            "name: x\nallowEmulation: true\ndisks: [{{name: d, path: {:?}}}]\n",
            dir.path().join("missing.img")
        ),
        2,
    );
    assert_eq!(last["reason"]["code"], "InvalidSpec");
    let msg = last["reason"]["message"].as_str().unwrap();
    assert!(msg.contains("missing.img"), "{msg}");
    assert!(!run_dir.join("qemu.pid").exists(), "qemu was never started");
}

#[test]
fn without_usable_kvm_and_without_emulation_the_vm_fails_with_the_reason() {
    if launcher::accel::HostVirt::probe().kvm_usable() {
        eprintln!("skipping: this host has usable KVM, the VM would boot");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    fs::write(&disk, [0u8; 4096]).unwrap();
    let last = failed_launch(
        dir.path(),
        &format!("name: nokvm\ndisks: [{{name: d, path: {disk:?}}}]\n"),
    );
    assert_eq!(last["reason"]["code"], "Unsupported");
    let msg = last["reason"]["message"].as_str().unwrap();
    assert!(msg.contains("allowEmulation"), "{msg}");
}
