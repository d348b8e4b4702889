//! VM states and how they are reported.
//!
//! Each change of state is printed as one JSON line on stdout (for whoever supervises the
//! launcher) and written to the status file, which always holds the latest state as one JSON
//! object (replaced atomically, so a reader never sees half of it).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::error::{Error, Result};

/// The VM's phase, as KubeVirt's VirtualMachineInstance phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum State {
    /// Accepted; qemu is being started and checked (the guest has not run yet).
    Pending,
    /// The guest is running.
    Running,
    /// The guest is paused (by qemu, e.g. on an I/O error, or over QMP).
    Paused,
    /// The guest powered itself off (final).
    Succeeded,
    /// The VM could not start or ended abnormally (final); see the reason.
    Failed,
}

impl State {
    pub fn is_final(self) -> bool {
        matches!(self, State::Succeeded | State::Failed)
    }
}

/// Why the VM is in its state: a stable machine-readable code and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    pub code: &'static str,
    pub message: String,
}

impl Reason {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Reason {
            code,
            message: message.into(),
        }
    }
}

/// One status record.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub vm: String,
    pub state: State,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// Seconds since the Unix epoch.
    pub time: f64,
    /// The qemu process, once started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qemu_pid: Option<u32>,
}

/// Writes state changes to stdout and the status file.
pub struct Reporter {
    vm: String,
    file: PathBuf,
    last: Option<Status>,
    qemu_pid: Option<u32>,
}

impl Reporter {
    pub fn new(vm: &str, file: &Path) -> Self {
        Reporter {
            vm: vm.to_string(),
            file: file.to_path_buf(),
            last: None,
            qemu_pid: None,
        }
    }

    /// Remembers the qemu pid for the following records.
    pub fn set_qemu_pid(&mut self, pid: Option<u32>) {
        self.qemu_pid = pid;
    }

    /// The latest reported status.
    pub fn last(&self) -> Option<&Status> {
        self.last.as_ref()
    }

    /// Reports `state` unless it is already the current one (with the same reason). A final state
    /// is never left.
    pub fn report(&mut self, state: State, reason: Option<Reason>) -> Result<()> {
        if let Some(last) = &self.last
            && (last.state.is_final() || (last.state == state && last.reason == reason))
        {
            return Ok(());
        }
        let status = Status {
            vm: self.vm.clone(),
            state,
            reason,
            time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            qemu_pid: self.qemu_pid,
        };
        let line = serde_json::to_string(&status).expect("status serializes");
        tracing::info!(vm = %self.vm, state = ?state, "{line}");
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{line}")
                .and_then(|()| out.flush())
                .map_err(|e| Error::io("writing the status to stdout", e))?;
        }
        write_atomically(&self.file, format!("{line}\n").as_bytes())?;
        self.last = Some(status);
        Ok(())
    }
}

/// Replaces `path` with `bytes` through a temporary file and a rename.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let ctx = || format!("writing the status file {}", path.display());
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(ctx(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(ctx(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_latest_state_and_keeps_final() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("status.json");
        let mut r = Reporter::new("vm1", &file);
        r.report(State::Pending, None).unwrap();
        r.set_qemu_pid(Some(42));
        r.report(State::Running, None).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(v["vm"], "vm1");
        assert_eq!(v["state"], "Running");
        assert_eq!(v["qemu_pid"], 42);
        assert!(v.get("reason").is_none());
        r.report(
            State::Failed,
            Some(Reason::new("WatchdogExpired", "no serial output")),
        )
        .unwrap();
        r.report(State::Succeeded, None).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(v["state"], "Failed");
        assert_eq!(v["reason"]["code"], "WatchdogExpired");
        assert_eq!(r.last().unwrap().state, State::Failed);
    }
}
