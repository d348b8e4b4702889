//! A tiny bootable Linux guest for launcher tests, made from Debian packages only.
//!
//! The kernel comes from the package behind `linux-image-cloud-amd64`, the userland from
//! `busybox-static`; both are fetched with `apt-get download` and unpacked with `dpkg-deb -x` (no
//! loop mounts, no root filesystem image). The initramfs (an uncompressed `newc` cpio written here)
//! loads the virtio modules, prints `QUARRY-SHA256 NAME HEX` for every virtio-blk (`vdX`) and
//! virtio-scsi (`sdX`) disk on the serial console and then acts on `qmode=` from the kernel command
//! line (see [`INIT`]). The result is cached under a directory the caller chooses (keyed by kernel
//! version, init script and module list), so only the first run downloads anything.
//!
//! A guest can also carry more kernel modules ([`Guest::get_with`]) and, for one boot, a
//! [`Payload`]: host programs with their shared libraries and a script that `qmode=run` runs,
//! appended to the cached initramfs as a second cpio archive (the kernel unpacks concatenated
//! archives in turn). [`Guest::boot`] runs such a guest to its power-off under a watchdog.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A built guest: boot it with `-kernel`/`-initrd` and [`Guest::cmdline`].
#[derive(Debug, Clone)]
pub struct Guest {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

/// Modules loaded in this order, with their parameters (the cloud kernel ships them uncompressed).
const MODULES: &[&str] = &[
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_pci_modern_dev",
    "drivers/virtio/virtio_pci_legacy_dev",
    "drivers/virtio/virtio_pci",
    "drivers/block/virtio_blk",
    "drivers/scsi/scsi_common",
    // Synchronous scanning: the disks exist when insmod returns.
    "drivers/scsi/scsi_mod scan=sync",
    "drivers/scsi/sd_mod",
    "drivers/scsi/virtio_scsi",
    "drivers/acpi/button",
    "drivers/input/evdev",
    // pvpanic (ISA, ACPI QEMU0001) turns a guest panic into QEMU's GUEST_PANICKED event.
    "drivers/misc/pvpanic/pvpanic",
    "drivers/misc/pvpanic/pvpanic-mmio",
];

/// The guest's /init. `qmode` (set from the kernel command line) picks what happens after the
/// disks' checksums are printed:
/// - `poweroff` (default): power off at once;
/// - `wait`: keep running, print the checksum of every disk that appears (hot-plug) and
///   `QUARRY-GONE vdX` for every disk that goes, power off on the ACPI power button;
/// - `deaf`: as `wait` but ignore the power button;
/// - `reset`: reboot at once; `panic`: crash the kernel;
/// - `run`: mount a scratch tmpfs on /scratch (`TMPDIR` and the working directory), run `/run`
///   (a [`Payload`]'s script) with sh, print `QUARRY-EXIT N` with its exit status and power
///   off. Nothing is mounted over /tmp: payload files keep their host paths, and a checkout
///   (or a test binary) under /tmp must stay visible.
pub const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
while read m args; do insmod /lib/modules/$m.ko $args || echo "QUARRY-INSMOD-FAILED $m"; done < /modules
echo QUARRY-GUEST-UP
seen=""
sums() {
  for d in /dev/vd? /dev/sd?; do
    [ -b "$d" ] || continue
    case " $seen " in *" $d "*) continue ;; esac
    seen="$seen $d"
    echo "QUARRY-SHA256 ${d#/dev/} $(sha256sum < $d | cut -d' ' -f1)"
  done
  for d in $seen; do
    [ -b "$d" ] && continue
    seen=$(echo $seen | tr ' ' '\n' | grep -vx "$d" | tr '\n' ' ')
    echo "QUARRY-GONE ${d#/dev/}"
  done
}
sums
case "${qmode:-poweroff}" in
  poweroff) echo QUARRY-POWEROFF; poweroff -f ;;
  reset) reboot -f ;;
  panic) echo c > /proc/sysrq-trigger ;;
  run)
    mkdir -p /scratch && mount -t tmpfs scratch /scratch
    export TMPDIR=/scratch
    cd /scratch
    sh /run
    echo "QUARRY-EXIT $?"
    poweroff -f ;;
esac
if [ "$qmode" = wait ]; then
  for e in /sys/class/input/event*; do
    if grep -q "Power Button" "$e/device/name"; then
      # Opened here, before QUARRY-WAITING is printed, so no press can come before the reader.
      exec 3< /dev/input/${e##*/}
      (dd of=/dev/null bs=24 count=1 <&3 2>/dev/null; echo QUARRY-POWER-BUTTON; poweroff -f) &
      break
    fi
  done
fi
echo QUARRY-WAITING
while true; do sums; sleep 0.3; done
"#;

impl Guest {
    /// The kernel command line for `qmode`.
    pub fn cmdline(qmode: &str) -> String {
        format!("console=ttyS0 quiet panic=-1 qmode={qmode}")
    }

    /// Builds the guest in `cache`, or reuses a build from an earlier run. `None` (after saying
    /// why on stderr) when the host has no apt-get/dpkg-deb to fetch the packages with, or the
    /// packages cannot be had.
    pub fn get(cache: &Path) -> Option<Guest> {
        Guest::get_with(cache, &[])
    }

    /// As [`Guest::get`], with `modules` (paths under the kernel's module tree, optionally
    /// followed by parameters, dependencies first) loaded after the base ones. One `cache`
    /// directory holds one build: use a directory of its own per module list.
    pub fn get_with(cache: &Path, modules: &[&str]) -> Option<Guest> {
        for tool in ["apt-get", "apt-cache", "dpkg-deb"] {
            if Command::new(tool).arg("--version").output().is_err() {
                eprintln!("skipping: {tool} is missing, cannot build the test guest");
                return None;
            }
        }
        let kernel_pkg = match kernel_package() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("skipping: {e}");
                return None;
            }
        };
        let modules: Vec<&str> = MODULES.iter().chain(modules).copied().collect();
        let recipe = format!("{INIT}{modules:?}");
        let key = format!("{kernel_pkg}-{:016x}", fnv1a(recipe.as_bytes()));
        let dir = cache.join(format!("guest-{key}"));
        let guest = Guest {
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.cpio"),
        };
        if guest.kernel.is_file() && guest.initrd.is_file() {
            return Some(guest);
        }
        fs::create_dir_all(cache).expect("creating the guest cache");
        let work = tempfile::tempdir_in(cache).expect("guest work dir");
        if let Err(e) = build(work.path(), &kernel_pkg, &modules) {
            eprintln!("skipping: {e}");
            return None;
        }
        // Another test process may have finished first: either copy is fine.
        if fs::rename(work.path().join("out"), &dir).is_err() && !guest.kernel.is_file() {
            panic!("cannot move the built guest to {}", dir.display());
        }
        // Builds from older recipes or kernels are of no more use.
        for old in fs::read_dir(cache).into_iter().flatten().flatten() {
            let name = old.file_name();
            if name.to_string_lossy().starts_with("guest-") && old.path() != dir {
                let _ = fs::remove_dir_all(old.path());
            }
        }
        Some(guest)
    }

    /// Boots the guest under TCG (one vCPU, `memory_mib` of RAM, no disks, no network) with
    /// `initrd` in place of its own (e.g. one [`Payload::initrd`] wrote) and `qmode`; returns what
    /// it printed on ttyS0 once qemu exits. Err (with the console so far) when qemu cannot start,
    /// fails, or is still running after `timeout`, the boot watchdog (qemu is killed then).
    pub fn boot(
        &self,
        initrd: &Path,
        qmode: &str,
        memory_mib: u32,
        timeout: Duration,
    ) -> Result<String, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let console = dir.path().join("ttyS0");
        let stderr = fs::File::create(dir.path().join("stderr")).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args([
            "-accel",
            "tcg",
            "-smp",
            "1",
            "-nodefaults",
            "-no-user-config",
        ])
        .args([
            "-display",
            "none",
            "-no-reboot",
            "-m",
            &memory_mib.to_string(),
        ])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-kernel")
        .arg(&self.kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(Guest::cmdline(qmode))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
        // SAFETY: prctl is async-signal-safe; it only makes qemu die with the test process.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start qemu-system-x86_64: {e}"))?;
        let deadline = Instant::now() + timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() >= deadline => break None,
                Ok(None) => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => return Err(format!("waiting for qemu: {e}")),
            }
        };
        let out = String::from_utf8_lossy(&fs::read(&console).unwrap_or_default()).into_owned();
        match status {
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!(
                    "the guest was still running after {} s; console:\n{out}",
                    timeout.as_secs()
                ))
            }
            Some(status) if !status.success() => Err(format!(
                "qemu-system-x86_64 failed ({status}): {}\nconsole:\n{out}",
                fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
            )),
            Some(_) => Ok(out),
        }
    }
}

/// Files for one boot of a guest, appended to its cached initramfs as a second cpio archive:
/// host programs with their shared libraries, and the script `qmode=run` runs (see [`INIT`]).
#[derive(Default)]
pub struct Payload {
    cpio: Cpio,
    paths: BTreeSet<String>,
}

impl Payload {
    /// Adds `data` as the file `path` (absolute, in the guest) with permissions `perm`, and the
    /// directories above it. A path already added keeps its first content.
    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> &mut Payload {
        let rel = path.trim_start_matches('/');
        for (i, _) in rel.match_indices('/') {
            if self.paths.insert(rel[..i].to_string()) {
                self.cpio.dir(&rel[..i]);
            }
        }
        if self.paths.insert(rel.to_string()) {
            self.cpio.file(rel, perm, data);
        }
        self
    }

    /// Adds the host file `path` (symlinks followed) at the same path in the guest, with its
    /// permissions.
    pub fn host_file(&mut self, path: &Path) -> std::io::Result<&mut Payload> {
        use std::os::unix::fs::PermissionsExt;
        let perm = fs::metadata(path)?.permissions().mode() & 0o7777;
        let data = fs::read(path)?;
        Ok(self.file(&path.to_string_lossy(), perm, &data))
    }

    /// Adds the host executable `exe` at the same path in the guest, with the shared libraries
    /// and the dynamic loader `ldd` names for it, each at its host path.
    pub fn program(&mut self, exe: &Path) -> Result<&mut Payload, String> {
        let out = Command::new("ldd")
            .arg(exe)
            .output()
            .map_err(|e| format!("cannot run ldd: {e}"))?;
        let listing = String::from_utf8_lossy(&out.stdout);
        // A static executable makes ldd fail with "not a dynamic executable": nothing to add.
        if out.status.success() {
            for lib in ldd_paths(&listing).map_err(|e| format!("{}: {e}", exe.display()))? {
                self.host_file(&lib)
                    .map_err(|e| format!("{} (for {}): {e}", lib.display(), exe.display()))?;
            }
        }
        self.host_file(exe)
            .map_err(|e| format!("{}: {e}", exe.display()))
    }

    /// Sets the script (run by the guest's busybox sh) that `qmode=run` runs.
    pub fn run(&mut self, script: &str) -> &mut Payload {
        self.file("/run", 0o755, script.as_bytes())
    }

    /// Writes the initrd for one boot to `out`: `guest`'s own, then this payload.
    pub fn initrd(self, guest: &Guest, out: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut f = fs::File::create(out)?;
        std::io::copy(&mut fs::File::open(&guest.initrd)?, &mut f)?;
        f.write_all(&self.cpio.finish())?;
        f.sync_all()
    }
}

/// The files in `ldd` output: `name => /path (addr)` lines and the loader's `/path (addr)` line
/// (the vDSO has no file). Err names a library ldd could not find.
fn ldd_paths(listing: &str) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for line in listing.lines().map(str::trim) {
        let target = line.split_once("=>").map_or(line, |(_, t)| t).trim();
        if target.starts_with("not found") {
            return Err(format!("ldd: {line}"));
        }
        if let Some(path) = target
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        {
            out.push(PathBuf::from(path));
        }
    }
    Ok(out)
}

/// The versioned kernel package `linux-image-cloud-amd64` depends on.
fn kernel_package() -> Result<String, String> {
    let out = Command::new("apt-cache")
        .args([
            "depends",
            "--no-recommends",
            "--no-suggests",
            "linux-image-cloud-amd64",
        ])
        .output()
        .map_err(|e| format!("cannot run apt-cache: {e}"))?;
    let out = String::from_utf8_lossy(&out.stdout);
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-") && p.ends_with("-cloud-amd64"))
        .map(str::to_string)
        .ok_or_else(|| {
            format!("no kernel package behind linux-image-cloud-amd64 (run apt-get update): {out}")
        })
}

/// Downloads the packages and writes `work/out/{vmlinuz,initrd.cpio}`. Err when the packages
/// cannot be downloaded; panics when they lack what they should hold.
fn build(work: &Path, kernel_pkg: &str, module_list: &[&str]) -> Result<(), String> {
    let got = Command::new("apt-get")
        .current_dir(work)
        .args(["download", "-q", kernel_pkg, "busybox-static"])
        .output()
        .map_err(|e| format!("cannot run apt-get: {e}"))?;
    if !got.status.success() {
        return Err(format!(
            "apt-get download {kernel_pkg} busybox-static failed: {}",
            String::from_utf8_lossy(&got.stderr).trim()
        ));
    }
    let root = work.join("root");
    for deb in fs::read_dir(work).unwrap().filter_map(|e| e.ok()) {
        if deb.path().extension().is_some_and(|e| e == "deb") {
            crate::qemu::run(
                Command::new("dpkg-deb")
                    .arg("-x")
                    .arg(deb.path())
                    .arg(&root),
            );
        }
    }
    let boot = root.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("vmlinuz-")
        })
        .expect("vmlinuz in the kernel package");
    let release = vmlinuz.file_name().unwrap().to_string_lossy()["vmlinuz-".len()..].to_string();
    let modules = root.join("lib/modules").join(&release).join("kernel");

    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "proc", "sys", "lib", "lib/modules"] {
        cpio.dir(d);
    }
    cpio.file("init", 0o755, INIT.as_bytes());
    cpio.file(
        "bin/busybox",
        0o755,
        &fs::read(root.join("bin/busybox")).expect("busybox in busybox-static"),
    );
    let mut names = String::new();
    for line in module_list {
        let (m, params) = line.split_once(' ').unwrap_or((line, ""));
        let name = Path::new(m).file_name().unwrap().to_string_lossy();
        let ko = fs::read(modules.join(format!("{m}.ko")))
            .unwrap_or_else(|e| panic!("module {m}.ko in {kernel_pkg}: {e}"));
        cpio.file(&format!("lib/modules/{name}.ko"), 0o644, &ko);
        names.push_str(&format!("{name} {params}\n"));
    }
    cpio.file("modules", 0o644, names.as_bytes());

    let out = work.join("out");
    fs::create_dir(&out).unwrap();
    fs::copy(&vmlinuz, out.join("vmlinuz")).unwrap();
    fs::write(out.join("initrd.cpio"), cpio.finish()).unwrap();
    Ok(())
}

/// A `newc` (SVR4, no CRC) cpio archive, the format the kernel unpacks as initramfs.
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100000 | perm, data);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

/// A stable hash of the init script and module list, so changing them rebuilds the cached guest.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_listing_gives_libraries_and_loader() {
        let listing = "\tlinux-vdso.so.1 (0x00007ffd0b5f1000)\n\
            \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f58a1c00000)\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f58a1a1e000)\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007f58a1f4f000)\n";
        assert_eq!(
            ldd_paths(listing).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        let err = ldd_paths("\tlibinih.so.1 => not found\n").unwrap_err();
        assert!(err.contains("libinih.so.1"), "{err}");
    }

    #[test]
    fn payload_adds_parent_directories_once_and_keeps_first_content() {
        let mut p = Payload::default();
        p.file("/usr/sbin/a", 0o755, b"one")
            .file("/usr/sbin/b", 0o644, b"two")
            .file("/usr/sbin/a", 0o755, b"again");
        let names: Vec<&String> = p.paths.iter().collect();
        assert_eq!(names, ["usr", "usr/sbin", "usr/sbin/a", "usr/sbin/b"]);
        let archive = p.cpio.finish();
        let text = String::from_utf8_lossy(&archive);
        assert_eq!(text.matches("usr/sbin\0").count(), 1);
        assert!(text.contains("one") && !text.contains("again"));
        // newc entries are 4-byte aligned, so the archive can follow another one
        assert_eq!(archive.len() % 4, 0);
    }
}
