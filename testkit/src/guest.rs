//! A tiny bootable Linux guest for launcher tests, made from Debian packages only.
//!
//! The kernel comes from the package behind `linux-image-cloud-amd64`, the userland from
//! `busybox-static`; both are fetched with `apt-get download` and unpacked with `dpkg-deb -x` (no
//! loop mounts, no root filesystem image). The initramfs (an uncompressed `newc` cpio written here)
//! loads the virtio modules, prints `QUARRY-SHA256 NAME HEX` for every virtio-blk (`vdX`) and
//! virtio-scsi (`sdX`) disk on the serial console and then acts on `qmode=` from the kernel command
//! line (see [`INIT`]). The result is cached under a directory the caller chooses (keyed by kernel
//! version, init script and module list), so only the first run downloads anything.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

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
/// - `reset`: reboot at once; `panic`: crash the kernel.
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
    /// why on stderr) when the host has no apt-get/dpkg-deb to fetch the packages with.
    pub fn get(cache: &Path) -> Option<Guest> {
        for tool in ["apt-get", "apt-cache", "dpkg-deb"] {
            if Command::new(tool).arg("--version").output().is_err() {
                eprintln!("skipping: {tool} is missing, cannot build the test guest");
                return None;
            }
        }
        let kernel_pkg = kernel_package();
        let recipe = format!("{INIT}{MODULES:?}");
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
        build(work.path(), &kernel_pkg);
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
}

/// The versioned kernel package `linux-image-cloud-amd64` depends on.
fn kernel_package() -> String {
    let out = crate::qemu::run(Command::new("apt-cache").args([
        "depends",
        "--no-recommends",
        "--no-suggests",
        "linux-image-cloud-amd64",
    ]));
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-") && p.ends_with("-cloud-amd64"))
        .unwrap_or_else(|| {
            panic!("no kernel package behind linux-image-cloud-amd64 (run apt-get update): {out}")
        })
        .to_string()
}

fn build(work: &Path, kernel_pkg: &str) {
    crate::qemu::run(Command::new("apt-get").current_dir(work).args([
        "download",
        "-q",
        kernel_pkg,
        "busybox-static",
    ]));
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
    for line in MODULES {
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
