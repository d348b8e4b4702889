//! Choosing between KVM and TCG.
//!
//! `/dev/kvm` existing is not enough: on nested or paravirtual hosts (PVM) the device opens but
//! ordinary guests hang under it. KVM is used only when `/dev/kvm` opens read/write AND the CPU
//! advertises hardware virtualisation (`vmx` or `svm` in `/proc/cpuinfo`); otherwise the VM runs
//! under TCG if the spec allows emulation, and fails with a clear reason if it does not.

use std::path::Path;

use super::error::{Error, Result};
use super::spec::Accel;

/// What the host offers, probed once per launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostVirt {
    /// `/dev/kvm` opened read/write.
    pub kvm_rw: bool,
    /// `/proc/cpuinfo` lists `vmx` or `svm`.
    pub hw_virt: bool,
}

impl HostVirt {
    /// Probes `/dev/kvm` and `/proc/cpuinfo`.
    pub fn probe() -> Self {
        Self::probe_paths(Path::new("/dev/kvm"), Path::new("/proc/cpuinfo"))
    }

    fn probe_paths(kvm: &Path, cpuinfo: &Path) -> Self {
        let kvm_rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(kvm)
            .is_ok();
        let hw_virt = std::fs::read_to_string(cpuinfo)
            .map(|t| cpuinfo_has_hw_virt(&t))
            .unwrap_or(false);
        HostVirt { kvm_rw, hw_virt }
    }

    /// KVM can boot ordinary guests.
    pub fn kvm_usable(self) -> bool {
        self.kvm_rw && self.hw_virt
    }
}

/// True when a `flags` line of cpuinfo names `vmx` (Intel) or `svm` (AMD).
pub fn cpuinfo_has_hw_virt(cpuinfo: &str) -> bool {
    cpuinfo.lines().any(|line| {
        line.split_once(':').is_some_and(|(key, value)| {
            key.trim() == "flags" && value.split_whitespace().any(|f| f == "vmx" || f == "svm")
        })
    })
}

/// The accelerator the VM will run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    Kvm,
    Tcg,
}

impl Resolved {
    /// QEMU's `-accel` value.
    pub fn qemu_accel(self) -> &'static str {
        match self {
            Resolved::Kvm => "kvm",
            Resolved::Tcg => "tcg",
        }
    }

    /// The CPU model: the host's under KVM, every emulated feature under TCG.
    pub fn qemu_cpu(self) -> &'static str {
        match self {
            Resolved::Kvm => "host",
            Resolved::Tcg => "max",
        }
    }
}

/// Decides KVM or TCG for `requested` on `host`.
pub fn resolve(requested: Accel, allow_emulation: bool, host: HostVirt) -> Result<Resolved> {
    let why_not_kvm = || match (host.kvm_rw, host.hw_virt) {
        (false, _) => "/dev/kvm is missing or not read/write",
        (true, false) => {
            "/dev/kvm is present but the CPU advertises no vmx/svm (nested or paravirtual KVM cannot boot ordinary guests)"
        }
        (true, true) => unreachable!("KVM is usable"),
    };
    match requested {
        Accel::Kvm if host.kvm_usable() => Ok(Resolved::Kvm),
        Accel::Kvm => Err(Error::Unsupported(format!(
            "accel: kvm was requested but {}",
            why_not_kvm()
        ))),
        Accel::Auto if host.kvm_usable() => Ok(Resolved::Kvm),
        Accel::Auto | Accel::Tcg if allow_emulation => Ok(Resolved::Tcg),
        Accel::Auto => Err(Error::Unsupported(format!(
            "KVM is unusable ({}) and allowEmulation is false",
            why_not_kvm()
        ))),
        Accel::Tcg => Err(Error::Unsupported(
            "accel: tcg needs allowEmulation: true".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PVM: HostVirt = HostVirt {
        kvm_rw: true,
        hw_virt: false,
    };
    const REAL: HostVirt = HostVirt {
        kvm_rw: true,
        hw_virt: true,
    };
    const NONE: HostVirt = HostVirt {
        kvm_rw: false,
        hw_virt: true,
    };

    #[test]
    fn cpuinfo_flags() {
        assert!(cpuinfo_has_hw_virt(
            "processor\t: 0\nflags\t\t: fpu vme vmx sse\n"
        ));
        assert!(cpuinfo_has_hw_virt("flags\t\t: fpu svm\n"));
        assert!(!cpuinfo_has_hw_virt(
            "flags\t\t: fpu vmxx sse\nmodel name\t: vmx\n"
        ));
        assert!(!cpuinfo_has_hw_virt(""));
    }

    #[test]
    fn auto_uses_kvm_only_when_usable() {
        assert_eq!(resolve(Accel::Auto, false, REAL).unwrap(), Resolved::Kvm);
        assert_eq!(resolve(Accel::Auto, true, PVM).unwrap(), Resolved::Tcg);
        assert_eq!(resolve(Accel::Auto, true, NONE).unwrap(), Resolved::Tcg);
        let e = resolve(Accel::Auto, false, PVM).unwrap_err();
        assert!(e.to_string().contains("vmx/svm"), "{e}");
        let e = resolve(Accel::Auto, false, NONE).unwrap_err();
        assert!(e.to_string().contains("not read/write"), "{e}");
    }

    #[test]
    fn explicit_choices() {
        assert_eq!(resolve(Accel::Kvm, false, REAL).unwrap(), Resolved::Kvm);
        assert!(
            resolve(Accel::Kvm, true, PVM).is_err(),
            "kvm never falls back"
        );
        assert_eq!(resolve(Accel::Tcg, true, REAL).unwrap(), Resolved::Tcg);
        assert!(resolve(Accel::Tcg, false, REAL).is_err());
    }

    #[test]
    fn probes_files() {
        let dir = tempfile::tempdir().unwrap();
        let kvm = dir.path().join("kvm");
        let cpu = dir.path().join("cpuinfo");
        std::fs::write(&cpu, "flags : fpu svm\n").unwrap();
        assert_eq!(
            HostVirt::probe_paths(&kvm, &cpu),
            HostVirt {
                kvm_rw: false,
                hw_virt: true
            }
        );
        std::fs::write(&kvm, "").unwrap();
        assert!(HostVirt::probe_paths(&kvm, &cpu).kvm_usable());
    }
}
