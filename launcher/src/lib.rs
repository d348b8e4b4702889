//! The KVM launcher: boots one VM from imported volumes with `qemu-system-x86_64`, driven over
//! QMP (no libvirt), and runs its lifecycle, as KubeVirt's virt-launcher does for one pod.
//!
//! - [`spec`]: the VM spec (YAML or flags) and its validation;
//! - [`accel`]: KVM only where it really works, else TCG when allowed;
//! - [`disk`]: the `O_DIRECT` probe, cache/aio choice and the JSON block graph of a disk;
//! - [`cmdline`]: the qemu command line;
//! - [`qmp`]: an async QMP client with an event stream;
//! - [`lifecycle`]: start paused, check, run, watch, stop; no orphaned qemu;
//! - [`hotplug`]: attach/detach disks of a running VM;
//! - [`control`]: the control socket (hot-plug, unplug, pause, resume);
//! - [`status`]: states as JSON lines and a status file;
//! - [`cli`]: the `quarry launch` and `quarry vmctl` arguments.

pub mod accel;
pub mod cli;
pub mod cmdline;
pub mod control;
pub mod disk;
pub mod error;
pub mod hotplug;
pub mod lifecycle;
pub mod qmp;
pub mod spec;
pub mod status;

pub use error::{Error, ErrorKind, Result};
pub use lifecycle::{LaunchPaths, Outcome, run};
pub use spec::VmSpec;
pub use status::State;
