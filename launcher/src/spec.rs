//! The VM spec: what `quarry launch` boots, read from YAML (or built from command-line flags) and
//! validated before anything is started.
//!
//! The shape follows the parts of a KubeVirt VirtualMachineInstance the launcher needs: name, CPUs,
//! memory, disks (volume paths with bus, read-only flag and boot order), an optional direct kernel
//! boot, the acceleration policy and the lifecycle timeouts.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{Error, Result};

/// Acceleration asked for by the spec.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// KVM when the host can really use it, else TCG when emulation is allowed.
    #[default]
    Auto,
    /// KVM or fail.
    Kvm,
    /// Software emulation (needs `allowEmulation: true`).
    Tcg,
}

/// How a disk is attached to the guest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Bus {
    /// One virtio-blk PCI device per disk (`/dev/vdX` in a Linux guest).
    #[default]
    VirtioBlk,
    /// A LUN on the VM's virtio-scsi controller (`/dev/sdX`).
    VirtioScsi,
}

/// One disk: a volume's `disk.img` file or a raw block device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskSpec {
    /// Short name: lowercase letters, digits and `-`, starting with a letter, at most 20 characters
    /// (it becomes part of QEMU node names, which are limited to 31).
    pub name: String,
    /// The volume: a raw image file, a directory holding `disk.img` (a filesystem volume), or a
    /// block device.
    pub path: PathBuf,
    #[serde(default)]
    pub bus: Bus,
    #[serde(default)]
    pub readonly: bool,
    /// Boot order (1 boots first); disks without one are not bootable.
    #[serde(default)]
    pub boot_order: Option<u32>,
}

/// Direct kernel boot, as KubeVirt's `firmware.kernelBoot`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelBoot {
    pub kernel: PathBuf,
    #[serde(default)]
    pub initrd: Option<PathBuf>,
    #[serde(default)]
    pub cmdline: Option<String>,
}

/// A memory size: a Kubernetes quantity (`128Mi`, `1Gi`) or a plain number of bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Quantity {
    Bytes(u64),
    Text(String),
}

impl Quantity {
    fn bytes(&self) -> Result<u64> {
        match self {
            Quantity::Bytes(n) => Ok(*n),
            Quantity::Text(s) => {
                quantity::parse(s).map_err(|e| Error::InvalidSpec(format!("memory {s:?}: {e}")))
            }
        }
    }
}

/// The whole VM spec (YAML keys in camelCase).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmSpec {
    /// VM name: lowercase letters, digits and `-` (a Kubernetes name), at most 63 characters.
    pub name: String,
    #[serde(default = "default_vcpus")]
    pub vcpus: u32,
    #[serde(default = "default_memory")]
    pub memory: Quantity,
    #[serde(default)]
    pub disks: Vec<DiskSpec>,
    #[serde(default)]
    pub kernel_boot: Option<KernelBoot>,
    #[serde(default)]
    pub accel: Accel,
    /// Allow TCG when KVM is unusable (KubeVirt's `useEmulation`); off by default.
    #[serde(default)]
    pub allow_emulation: bool,
    /// QEMU machine type; `pc` hot-plugs PCI devices through ACPI without extra root ports.
    #[serde(default = "default_machine")]
    pub machine: String,
    /// Where the serial console (ttyS0) is written [default: RUN_DIR/serial.log].
    #[serde(default)]
    pub serial_log: Option<PathBuf>,
    /// Directory for the QMP and control sockets, pid file and logs [default: /run/quarry/NAME].
    #[serde(default)]
    pub run_dir: Option<PathBuf>,
    /// Where the current state is written as JSON [default: RUN_DIR/status.json].
    #[serde(default)]
    pub status_file: Option<PathBuf>,
    /// Fail the VM when the serial console stays silent this long after start (0: never).
    #[serde(default = "default_watchdog")]
    pub boot_watchdog_seconds: u64,
    /// After SIGTERM's ACPI power-down, wait this long for the guest before quitting qemu.
    #[serde(default = "default_grace")]
    pub grace_period_seconds: u64,
    /// A guest reset ends the VM (with failure) instead of rebooting it.
    #[serde(default = "default_true")]
    pub no_reboot: bool,
    /// The qemu binary [default: qemu-system-x86_64 from PATH].
    #[serde(default)]
    pub qemu: Option<PathBuf>,
}

fn default_vcpus() -> u32 {
    1
}
fn default_memory() -> Quantity {
    Quantity::Text("512Mi".into())
}
fn default_machine() -> String {
    "pc".into()
}
fn default_watchdog() -> u64 {
    120
}
fn default_grace() -> u64 {
    30
}
fn default_true() -> bool {
    true
}

impl VmSpec {
    /// A spec with defaults for everything but the name.
    pub fn new(name: impl Into<String>) -> Self {
        VmSpec {
            name: name.into(),
            vcpus: default_vcpus(),
            memory: default_memory(),
            disks: Vec::new(),
            kernel_boot: None,
            accel: Accel::default(),
            allow_emulation: false,
            machine: default_machine(),
            serial_log: None,
            run_dir: None,
            status_file: None,
            boot_watchdog_seconds: default_watchdog(),
            grace_period_seconds: default_grace(),
            no_reboot: true,
            qemu: None,
        }
    }

    /// Parses and validates a YAML spec.
    pub fn from_yaml(text: &str) -> Result<Self> {
        let spec: VmSpec = serde_saphyr::from_str(text).map_err(|e| {
            // the parser's message starts with its own "error: ", which the CLI already prints
            let msg = e.to_string();
            Error::InvalidSpec(msg.strip_prefix("error: ").unwrap_or(&msg).to_string())
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// Reads, parses and validates a YAML spec file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("cannot read spec {}", path.display()), e))?;
        Self::from_yaml(&text)
    }

    /// Memory in MiB (QEMU's `-m` unit); must be a whole number of MiB, at least 16.
    pub fn memory_mib(&self) -> Result<u64> {
        let bytes = self.memory.bytes()?;
        if bytes % (1 << 20) != 0 || bytes < 16 << 20 {
            return Err(Error::InvalidSpec(format!(
                "memory must be a whole number of MiB and at least 16Mi, got {bytes} bytes"
            )));
        }
        Ok(bytes >> 20)
    }

    /// Checks every rule the command line and the lifecycle rely on.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidSpec(m));
        if !valid_name(&self.name, 63, false) {
            return bad(format!(
                "name {:?} must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit",
                self.name
            ));
        }
        if self.vcpus == 0 || self.vcpus > 255 {
            return bad(format!("vcpus must be 1-255, got {}", self.vcpus));
        }
        self.memory_mib()?;
        if self.disks.is_empty() && self.kernel_boot.is_none() {
            return bad("at least one disk (or a kernelBoot) is needed".into());
        }
        let mut names = HashSet::new();
        let mut orders = HashSet::new();
        for d in &self.disks {
            validate_disk(d)?;
            if !names.insert(d.name.as_str()) {
                return bad(format!("disk name {:?} is used twice", d.name));
            }
            if let Some(o) = d.boot_order {
                if o == 0 {
                    return bad(format!("disk {:?}: bootOrder starts at 1", d.name));
                }
                if !orders.insert(o) {
                    return bad(format!("bootOrder {o} is used twice"));
                }
            }
        }
        if self.accel == Accel::Tcg && !self.allow_emulation {
            return bad("accel: tcg needs allowEmulation: true".into());
        }
        if self.machine.is_empty() || self.machine.contains([',', '=']) {
            return bad(format!("machine {:?} is not a machine type", self.machine));
        }
        Ok(())
    }

    /// The run directory (sockets, pid file, default logs).
    pub fn run_dir(&self) -> PathBuf {
        self.run_dir
            .clone()
            .unwrap_or_else(|| Path::new("/run/quarry").join(&self.name))
    }
}

/// Checks one disk on its own (also used for hot-plugged disks).
pub fn validate_disk(d: &DiskSpec) -> Result<()> {
    if !valid_name(&d.name, 20, true) {
        return Err(Error::InvalidSpec(format!(
            "disk name {:?} must be 1-20 lowercase letters, digits or '-', starting with a letter",
            d.name
        )));
    }
    if d.path.as_os_str().is_empty() {
        return Err(Error::InvalidSpec(format!("disk {:?} has no path", d.name)));
    }
    Ok(())
}

fn valid_name(s: &str, max: usize, letter_first: bool) -> bool {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let first_ok = |c: char| {
        if letter_first {
            c.is_ascii_lowercase()
        } else {
            c.is_ascii_lowercase() || c.is_ascii_digit()
        }
    };
    !s.is_empty()
        && s.len() <= max
        && s.chars().all(ok_char)
        && s.chars().next().is_some_and(first_ok)
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
name: test-vm
vcpus: 2
memory: 128Mi
accel: tcg
allowEmulation: true
kernelBoot:
  kernel: /boot/vmlinuz
  initrd: /boot/initrd.img
  cmdline: console=ttyS0
disks:
  - name: root
    path: /var/lib/quarry/pvc-1/disk.img
    bootOrder: 1
  - name: data
    path: /dev/vg0/data
    bus: virtio-scsi
    readonly: true
bootWatchdogSeconds: 20
gracePeriodSeconds: 5
"#;

    #[test]
    fn parses_full_spec() {
        let s = VmSpec::from_yaml(FULL).unwrap();
        assert_eq!(s.name, "test-vm");
        assert_eq!(s.vcpus, 2);
        assert_eq!(s.memory_mib().unwrap(), 128);
        assert_eq!(s.accel, Accel::Tcg);
        assert_eq!(s.disks.len(), 2);
        assert_eq!(s.disks[0].boot_order, Some(1));
        assert_eq!(s.disks[1].bus, Bus::VirtioScsi);
        assert!(s.disks[1].readonly);
        assert_eq!(
            s.kernel_boot.unwrap().cmdline.as_deref(),
            Some("console=ttyS0")
        );
        assert_eq!(s.boot_watchdog_seconds, 20);
        assert!(s.no_reboot);
        assert_eq!(s.machine, "pc");
    }

    #[test]
    fn defaults_follow_kubevirt() {
        let s = VmSpec::from_yaml("name: a\ndisks: [{name: d, path: /x}]\n").unwrap();
        assert_eq!(s.memory_mib().unwrap(), 512);
        assert_eq!(s.accel, Accel::Auto);
        assert!(!s.allow_emulation, "emulation is opt-in, as useEmulation");
        assert_eq!(s.disks[0].bus, Bus::VirtioBlk);
        assert_eq!(s.run_dir(), PathBuf::from("/run/quarry/a"));
    }

    #[test]
    fn memory_as_bytes() {
        let s = VmSpec::from_yaml("name: a\nmemory: 134217728\ndisks: [{name: d, path: /x}]\n")
            .unwrap();
        assert_eq!(s.memory_mib().unwrap(), 128);
    }

    fn err(yaml: &str) -> String {
        let e = VmSpec::from_yaml(yaml).unwrap_err();
        assert_eq!(e.kind(), super::super::ErrorKind::InvalidInput);
        e.to_string()
    }

    #[test]
    fn refusals_name_the_problem() {
        assert!(err("name: a\n").contains("at least one disk"));
        assert!(err("name: A\ndisks: [{name: d, path: /x}]\n").contains("name \"A\""));
        assert!(err("name: a\nvcpus: 0\ndisks: [{name: d, path: /x}]\n").contains("vcpus"));
        assert!(err("name: a\nmemory: 1000\ndisks: [{name: d, path: /x}]\n").contains("MiB"));
        assert!(err("name: a\nmemory: lots\ndisks: [{name: d, path: /x}]\n").contains("memory"));
        assert!(
            err("name: a\ndisks: [{name: d, path: /x}, {name: d, path: /y}]\n")
                .contains("used twice")
        );
        assert!(
            err("name: a\ndisks: [{name: d, path: /x, bootOrder: 1}, {name: e, path: /y, bootOrder: 1}]\n")
                .contains("bootOrder 1")
        );
        assert!(err("name: a\ndisks: [{name: 1d, path: /x}]\n").contains("disk name"));
        assert!(
            err("name: a\ndisks: [{name: d, path: /x}]\naccel: tcg\n").contains("allowEmulation")
        );
        assert!(err("name: a\ndisks: [{name: d, path: /x}]\ncolour: red\n").contains("colour"));
        assert!(err("name: a\ndisks: [{name: d, path: /x, bus: ide}]\n").contains("ide"));
        assert!(err("name: [a\n").contains("invalid VM spec"));
        // the parser's own "error: " prefix is not repeated after the CLI's
        let yaml = err("name: a\nvcpus: [\n");
        assert!(yaml.starts_with("invalid VM spec: "), "{yaml}");
        assert!(!yaml.contains("error:"), "{yaml}");
    }
}
