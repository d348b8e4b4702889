//! Command-line arguments of `quarry launch` and `quarry vmctl`, and their entry points (the
//! binary only parses and dispatches).

use std::path::PathBuf;

use super::control::{self, ControlRequest};
use super::error::{Error, Result};
use super::lifecycle::{self, Outcome};
use super::spec::{Accel, Bus, DiskSpec, KernelBoot, Quantity, VmSpec};

/// `quarry launch`: boot a VM from a spec file and/or flags (flags override the file).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "States go to stdout as JSON lines and to the status file. Exit codes: 0 the guest \
powered off (Succeeded); 1 the VM failed (see the reason); 2 bad spec or usage."
)]
pub struct LaunchArgs {
    /// VM spec (YAML).
    pub spec: Option<PathBuf>,
    /// VM name [required without a spec file].
    #[arg(long)]
    pub name: Option<String>,
    /// Virtual CPUs [default: 1].
    #[arg(long)]
    pub vcpus: Option<u32>,
    /// Memory, a quantity such as 512Mi [default: 512Mi].
    #[arg(long)]
    pub memory: Option<String>,
    /// A disk volume (disk.img file, volume directory or block device); repeatable, named disk0,
    /// disk1, ...; the first boots first.
    #[arg(long = "disk", value_name = "PATH")]
    pub disks: Vec<PathBuf>,
    /// Bus of the --disk volumes.
    #[arg(long, value_enum)]
    pub bus: Option<Bus>,
    /// Direct kernel boot: the kernel image.
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// Direct kernel boot: the initramfs.
    #[arg(long, requires = "kernel")]
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    #[arg(long, requires = "kernel")]
    pub append: Option<String>,
    /// Accelerator [default: auto].
    #[arg(long, value_enum)]
    pub accel: Option<Accel>,
    /// Allow TCG software emulation when KVM is unusable.
    #[arg(long)]
    pub allow_emulation: bool,
    /// Serial console (ttyS0) log [default: RUN_DIR/serial.log].
    #[arg(long)]
    pub serial_log: Option<PathBuf>,
    /// Directory for sockets, pid file and logs [default: /run/quarry/NAME].
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// File holding the latest state as JSON [default: RUN_DIR/status.json].
    #[arg(long)]
    pub status_file: Option<PathBuf>,
    /// Seconds without serial output after which the boot fails (0: never) [default: 120].
    #[arg(long)]
    pub boot_watchdog: Option<u64>,
    /// Seconds the guest gets to power off after SIGTERM [default: 30].
    #[arg(long)]
    pub grace_period: Option<u64>,
    /// The qemu binary [default: qemu-system-x86_64].
    #[arg(long)]
    pub qemu: Option<PathBuf>,
}

impl LaunchArgs {
    /// The spec: the file's, with the flags applied on top, validated.
    pub fn to_spec(&self) -> Result<VmSpec> {
        let mut spec = match (&self.spec, &self.name) {
            (Some(path), _) => VmSpec::from_file(path)?,
            (None, Some(name)) => VmSpec::new(name.clone()),
            (None, None) => {
                return Err(Error::InvalidSpec(
                    "give a spec file or at least --name and --disk".into(),
                ));
            }
        };
        if let Some(n) = &self.name {
            spec.name = n.clone();
        }
        if let Some(v) = self.vcpus {
            spec.vcpus = v;
        }
        if let Some(m) = &self.memory {
            spec.memory = Quantity::Text(m.clone());
        }
        let first = spec.disks.len();
        for (i, path) in self.disks.iter().enumerate() {
            spec.disks.push(DiskSpec {
                name: format!("disk{}", first + i),
                path: path.clone(),
                bus: self.bus.unwrap_or_default(),
                readonly: false,
                boot_order: (first == 0 && i == 0).then_some(1),
            });
        }
        if let Some(kernel) = &self.kernel {
            spec.kernel_boot = Some(KernelBoot {
                kernel: kernel.clone(),
                initrd: self.initrd.clone(),
                cmdline: self.append.clone(),
            });
        }
        if let Some(a) = self.accel {
            spec.accel = a;
        }
        spec.allow_emulation |= self.allow_emulation;
        macro_rules! set {
            ($field:ident, $flag:expr) => {
                if let Some(v) = &$flag {
                    spec.$field = Some(v.clone());
                }
            };
        }
        set!(serial_log, self.serial_log);
        set!(run_dir, self.run_dir);
        set!(status_file, self.status_file);
        set!(qemu, self.qemu);
        if let Some(w) = self.boot_watchdog {
            spec.boot_watchdog_seconds = w;
        }
        if let Some(g) = self.grace_period {
            spec.grace_period_seconds = g;
        }
        spec.validate()?;
        Ok(spec)
    }
}

/// Runs `quarry launch`: SIGTERM and SIGINT stop the VM gracefully. Must run on a runtime whose
/// spawning thread lives as long as the process (see [`lifecycle`]): the binary uses a
/// current-thread runtime.
pub async fn launch(spec: VmSpec) -> Result<Outcome> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| Error::io("installing SIGTERM handler", e))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| Error::io("installing SIGINT handler", e))?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
    };
    lifecycle::run(spec, stop).await
}

/// `quarry vmctl`: hot-plug, unplug, pause or resume a VM run by `quarry launch`.
#[derive(Debug, clap::Args)]
pub struct VmctlArgs {
    /// The launcher's control socket (RUN_DIR/control.sock).
    #[arg(long, value_name = "SOCKET")]
    pub control: PathBuf,
    #[command(subcommand)]
    pub action: VmctlAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum VmctlAction {
    /// Attach a volume to the running VM.
    Attach {
        /// Disk name (lowercase letters, digits, '-').
        name: String,
        /// The volume: disk.img file or block device.
        path: PathBuf,
        #[arg(long)]
        readonly: bool,
        #[arg(long, value_enum, default_value_t = Bus::VirtioBlk)]
        bus: Bus,
    },
    /// Detach a hot-plugged disk (the guest must release it).
    Detach { name: String },
    /// Pause the guest.
    Pause,
    /// Resume a paused guest.
    Resume,
}

/// Runs `quarry vmctl`.
pub async fn vmctl(args: VmctlArgs) -> Result<()> {
    let req = match args.action {
        VmctlAction::Attach {
            name,
            path,
            readonly,
            bus,
        } => ControlRequest::Attach {
            disk: DiskSpec {
                name,
                path,
                bus,
                readonly,
                boot_order: None,
            },
        },
        VmctlAction::Detach { name } => ControlRequest::Detach { name },
        VmctlAction::Pause => ControlRequest::Pause,
        VmctlAction::Resume => ControlRequest::Resume,
    };
    control::request(&args.control, &req).await
}

/// Why `quarry launch` did not end with the guest powered off; [`LaunchFailure::exit_code`] is
/// the documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum LaunchFailure {
    /// The spec (or the flags) are wrong.
    #[error(transparent)]
    Spec(Error),
    /// The launcher itself failed.
    #[error(transparent)]
    Launcher(Error),
    /// The VM ran and failed; `code` is its status reason.
    #[error("VM failed: {code}: {message}")]
    Vm { code: &'static str, message: String },
}

impl LaunchFailure {
    /// 2 for a bad spec, 1 for a failed VM or launcher.
    pub fn exit_code(&self) -> u8 {
        match self {
            LaunchFailure::Spec(_) => 2,
            // a spec error found only on the host (a missing disk) is still a spec error
            LaunchFailure::Vm { code, .. } if *code == "InvalidSpec" => 2,
            LaunchFailure::Launcher(_) | LaunchFailure::Vm { .. } => 1,
        }
    }
}

/// The launcher runs on the main thread only: qemu's PR_SET_PDEATHSIG is tied to the thread that
/// started it, which must live as long as the process.
fn current_thread() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the async runtime", e))
}

/// `quarry launch`, on the calling thread: Ok once the guest powered off.
pub fn run_launch(args: &LaunchArgs) -> std::result::Result<(), LaunchFailure> {
    let spec = args.to_spec().map_err(LaunchFailure::Spec)?;
    let outcome = current_thread()
        .and_then(|rt| rt.block_on(launch(spec)))
        .map_err(LaunchFailure::Launcher)?;
    if outcome.state == crate::State::Succeeded {
        Ok(())
    } else {
        Err(LaunchFailure::Vm {
            code: outcome.reason.code,
            message: outcome.reason.message,
        })
    }
}

/// `quarry vmctl`, on the calling thread.
pub fn run_vmctl(args: VmctlArgs) -> Result<()> {
    current_thread()?.block_on(vmctl(args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        launch: LaunchArgs,
    }

    fn spec(args: &[&str]) -> Result<VmSpec> {
        Cli::try_parse_from(std::iter::once("launch").chain(args.iter().copied()))
            .unwrap()
            .launch
            .to_spec()
    }

    #[test]
    fn flags_alone_make_a_spec() {
        let s = spec(&[
            "--name",
            "vm",
            "--disk",
            "/a.img",
            "--disk",
            "/b.img",
            "--bus",
            "virtio-scsi",
            "--memory",
            "256Mi",
            "--accel",
            "tcg",
            "--allow-emulation",
            "--kernel",
            "/k",
            "--append",
            "console=ttyS0",
            "--boot-watchdog",
            "9",
        ])
        .unwrap();
        assert_eq!(s.name, "vm");
        assert_eq!(s.memory_mib().unwrap(), 256);
        let names: Vec<_> = s.disks.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["disk0", "disk1"]);
        assert_eq!(s.disks[0].boot_order, Some(1));
        assert_eq!(s.disks[1].boot_order, None);
        assert_eq!(s.disks[1].bus, Bus::VirtioScsi);
        assert_eq!(
            s.kernel_boot.unwrap().cmdline.as_deref(),
            Some("console=ttyS0")
        );
        assert_eq!(s.boot_watchdog_seconds, 9);
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vm.yaml");
        std::fs::write(
            &file,
            "name: a\ndisks: [{name: root, path: /r, bootOrder: 1}]\n",
        )
        .unwrap();
        let s = spec(&[file.to_str().unwrap(), "--vcpus", "4", "--disk", "/extra"]).unwrap();
        assert_eq!(s.vcpus, 4);
        assert_eq!(s.disks[1].name, "disk1");
        assert_eq!(
            s.disks[1].boot_order, None,
            "the file's disk keeps booting first"
        );
    }

    #[test]
    fn flags_are_validated() {
        let e = spec(&["--disk", "/a"]).unwrap_err();
        assert!(e.to_string().contains("--name"), "{e}");
        let e = spec(&["--name", "vm", "--disk", "/a", "--accel", "tcg"]).unwrap_err();
        assert!(e.to_string().contains("allowEmulation"), "{e}");
    }
}
