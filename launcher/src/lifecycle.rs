//! The VM lifecycle: start qemu paused, check it over QMP, let the guest run, watch it, stop it.
//!
//! 1. Pending: the accelerator is chosen, every disk probed, qemu started with `-S` (paused), its
//!    QMP socket connected, and `query-block` must show every disk attached to its device.
//! 2. `cont`, Running. From here the launcher watches QMP events, the qemu process and the serial
//!    log: the guest powering itself off (SHUTDOWN with reason `guest-shutdown`) ends it with
//!    Succeeded; a panic, a reset under `noReboot`, qemu dying, or no serial output within the boot
//!    watchdog ends it with Failed and the reason.
//! 3. A stop request (SIGTERM) sends an ACPI power-down; a guest that does not power off within
//!    the grace period gets `quit`, and qemu that does not exit gets SIGKILL.
//!
//! qemu never outlives the launcher: it is started with `PR_SET_PDEATHSIG(SIGKILL)` (the kernel
//! kills it when the launcher dies, even by SIGKILL), killed when its handle is dropped (panics,
//! early returns) and reaped on every exit path.

use std::future::Future;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::{Instant, sleep, sleep_until, timeout};

use super::accel::{self, HostVirt};
use super::cmdline::{self, RunPaths};
use super::control;
use super::disk;
use super::error::{Error, Result};
use super::qmp::{Event, Qmp};
use super::spec::VmSpec;
use super::status::{Reason, Reporter, State};

/// How long qemu may take to open its QMP socket.
const QMP_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long `quit` may take before qemu is killed.
const QUIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the serial log is checked by the boot watchdog.
const WATCHDOG_POLL: Duration = Duration::from_millis(200);

/// Where a launch keeps its files.
#[derive(Debug, Clone)]
pub struct LaunchPaths {
    pub run_dir: PathBuf,
    pub qemu: RunPaths,
    pub status_file: PathBuf,
    pub control_socket: PathBuf,
    /// qemu's own stderr (its error messages end up in failure reasons).
    pub qemu_log: PathBuf,
}

impl LaunchPaths {
    pub fn for_spec(spec: &VmSpec) -> Self {
        let run_dir = spec.run_dir();
        LaunchPaths {
            qemu: RunPaths {
                qmp_socket: run_dir.join("qmp.sock"),
                serial_log: spec
                    .serial_log
                    .clone()
                    .unwrap_or_else(|| run_dir.join("serial.log")),
                pidfile: run_dir.join("qemu.pid"),
            },
            status_file: spec
                .status_file
                .clone()
                .unwrap_or_else(|| run_dir.join("status.json")),
            control_socket: run_dir.join("control.sock"),
            qemu_log: run_dir.join("qemu.log"),
            run_dir,
        }
    }
}

/// How the VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub state: State,
    pub reason: Reason,
}

impl Outcome {
    fn failed(code: &'static str, message: impl Into<String>) -> Self {
        Outcome {
            state: State::Failed,
            reason: Reason::new(code, message),
        }
    }
}

/// Boots the VM of `spec` and runs it to the end. `stop` resolves when the VM should be stopped
/// (SIGTERM). States go to stdout and the status file; the final one is also returned. Errors
/// are returned only when not even the status could be reported.
///
/// Call it from a thread that lives as long as the process (a current-thread runtime on the main
/// thread): qemu's `PR_SET_PDEATHSIG` fires when the thread that started it ends.
pub async fn run(spec: VmSpec, stop: impl Future<Output = ()>) -> Result<Outcome> {
    let paths = LaunchPaths::for_spec(&spec);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&paths.run_dir)
        .map_err(|e| Error::io(format!("cannot create {}", paths.run_dir.display()), e))?;
    let mut reporter = Reporter::new(&spec.name, &paths.status_file);
    reporter.report(State::Pending, None)?;
    let mut vm = Vm {
        spec: &spec,
        paths: &paths,
        child: None,
        qmp: None,
        events: None,
        control: None,
        quit_timeout: QUIT_TIMEOUT,
    };
    tokio::pin!(stop);
    // A stop before the guest runs ends the start-up at once (dropping boot halfway is fine:
    // terminate() below ends whatever qemu it started).
    let booted = tokio::select! {
        booted = vm.boot(&mut reporter) => Some(booted),
        () = &mut stop => None,
    };
    let outcome = match booted {
        Some(Ok(())) => vm.supervise(&mut reporter, stop).await,
        Some(Err(e)) => Outcome::failed(
            match e.kind() {
                super::ErrorKind::InvalidInput => "InvalidSpec",
                super::ErrorKind::Unsupported => "Unsupported",
                _ => "StartFailed",
            },
            e.to_string(),
        ),
        None => Outcome::failed("Stopped", "stopped before the guest started"),
    };
    // Whatever happened, qemu is gone before the final state is reported.
    let tail = vm.terminate().await;
    let outcome = match (outcome.reason.code, tail) {
        ("QemuExited" | "StartFailed", Some(t)) if !t.is_empty() => Outcome {
            reason: Reason::new(
                outcome.reason.code,
                format!("{}; qemu said: {t}", outcome.reason.message),
            ),
            ..outcome
        },
        _ => outcome,
    };
    for p in [&paths.qemu.qmp_socket, &paths.control_socket] {
        let _ = std::fs::remove_file(p);
    }
    reporter.report(outcome.state, Some(outcome.reason.clone()))?;
    Ok(outcome)
}

struct Vm<'a> {
    spec: &'a VmSpec,
    paths: &'a LaunchPaths,
    child: Option<Child>,
    qmp: Option<Arc<Qmp>>,
    events: Option<broadcast::Receiver<Event>>,
    /// The control socket's server task.
    control: Option<tokio::task::JoinHandle<()>>,
    /// How long `quit` may take before qemu is killed ([`QUIT_TIMEOUT`]).
    quit_timeout: Duration,
}

/// What the event loop learnt that decides the outcome when qemu exits.
#[derive(Default)]
struct Seen {
    /// The reason of the SHUTDOWN event, if one came.
    shutdown: Option<String>,
    /// An outcome the launcher decided itself (watchdog, grace period).
    forced: Option<Outcome>,
    stop_requested: bool,
}

impl Vm<'_> {
    /// Everything up to the guest running: Pending work, then `cont`.
    async fn boot(&mut self, reporter: &mut Reporter) -> Result<()> {
        let spec = self.spec;
        let accel = accel::resolve(spec.accel, spec.allow_emulation, HostVirt::probe())?;
        let disks = spec
            .disks
            .iter()
            .map(disk::resolve)
            .map(|d| disk::probe(&d).map(|io| (d, io)))
            .collect::<Result<Vec<_>>>()?;
        for k in spec.kernel_boot.iter() {
            for p in std::iter::once(&k.kernel).chain(k.initrd.iter()) {
                if !p.is_file() {
                    return Err(Error::InvalidSpec(format!(
                        "kernelBoot: {} is not a file",
                        p.display()
                    )));
                }
            }
        }
        for sock in [&self.paths.qemu.qmp_socket, &self.paths.control_socket] {
            // sun_path holds 108 bytes with the terminating NUL.
            if sock.as_os_str().len() > 107 {
                return Err(Error::InvalidSpec(format!(
                    "runDir is too long for a unix socket path ({} bytes): {}",
                    sock.as_os_str().len(),
                    sock.display()
                )));
            }
        }
        let args = cmdline::build(spec, accel, &disks, &self.paths.qemu)?;
        for p in [
            &self.paths.qemu.qmp_socket,
            &self.paths.qemu.serial_log,
            &self.paths.control_socket,
        ] {
            // Stale files from an earlier run would confuse the socket wait and the watchdog.
            let _ = std::fs::remove_file(p);
        }
        let qemu = spec
            .qemu
            .clone()
            .unwrap_or_else(|| PathBuf::from("qemu-system-x86_64"));
        tracing::info!(accel = ?accel, qemu = %qemu.display(), ?args, "starting qemu");
        let child = spawn_qemu(&qemu, &args, &self.paths.qemu_log)?;
        reporter.set_qemu_pid(child.id());
        self.child = Some(child);

        let (qmp, events) = self.connect_qmp().await?;
        let qmp = Arc::new(qmp);
        self.qmp = Some(qmp.clone());
        check_block_devices(&qmp, spec).await?;
        let spec_disks = spec.disks.iter().map(|d| d.name.clone()).collect();
        let control =
            control::ControlServer::bind(&self.paths.control_socket, qmp.clone(), spec_disks)?;
        self.control = Some(tokio::spawn(control.serve()));
        qmp.execute("cont", None).await?;
        reporter.report(State::Running, None)?;
        self.events = Some(events);
        Ok(())
    }

    /// Waits for qemu's QMP socket, as long as qemu lives and at most [`QMP_CONNECT_TIMEOUT`].
    async fn connect_qmp(&mut self) -> Result<(Qmp, broadcast::Receiver<Event>)> {
        let path = &self.paths.qemu.qmp_socket;
        let child = self.child.as_mut().expect("qemu was started");
        let deadline = Instant::now() + QMP_CONNECT_TIMEOUT;
        loop {
            if let Some(status) = child
                .try_wait()
                .map_err(|e| Error::io("waiting for qemu", e))?
            {
                return Err(Error::Qemu(format!(
                    "qemu exited ({status}) before its QMP socket was ready"
                )));
            }
            if path.exists() {
                match Qmp::connect(path).await {
                    Ok(session) => return Ok(session),
                    Err(e) if Instant::now() >= deadline => return Err(e),
                    Err(e) => tracing::debug!(%e, "QMP not ready yet"),
                }
            } else if Instant::now() >= deadline {
                return Err(Error::Qemu(format!(
                    "qemu did not open its QMP socket {} within {} s",
                    path.display(),
                    QMP_CONNECT_TIMEOUT.as_secs()
                )));
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// The event loop while the guest runs; returns how the VM ended (qemu may still be alive
    /// when the launcher decided to end it; [`Vm::terminate`] follows).
    async fn supervise(
        &mut self,
        reporter: &mut Reporter,
        mut stop: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Outcome {
        let spec = self.spec;
        let mut events = self.events.take().expect("boot subscribed to events");
        let qmp = self.qmp.clone().expect("boot connected QMP");
        let child = self.child.as_mut().expect("boot started qemu");
        let watchdog = (spec.boot_watchdog_seconds > 0)
            .then(|| Instant::now() + Duration::from_secs(spec.boot_watchdog_seconds));
        let mut booted = false;
        let mut seen = Seen::default();
        let mut events_open = true;
        let mut grace_deadline: Option<Instant> = None;
        let mut tick = tokio::time::interval(WATCHDOG_POLL);
        let exit_status: Option<ExitStatus> = loop {
            tokio::select! {
                status = child.wait() => break status.ok(),
                ev = events.recv(), if events_open => match ev {
                    Ok(ev) => {
                        if let Some(forced) = on_event(&ev, &mut seen, reporter) {
                            seen.forced = Some(forced);
                            break None;
                        }
                    }
                    Err(RecvError::Lagged(n)) => tracing::warn!(n, "missed QMP events"),
                    // qemu closed QMP: it is exiting, child.wait() will tell.
                    Err(RecvError::Closed) => events_open = false,
                },
                _ = tick.tick(), if !booted && watchdog.is_some() => {
                    if file_len(&self.paths.qemu.serial_log) > 0 {
                        booted = true;
                        tracing::info!("first serial output: boot watchdog disarmed");
                    } else if watchdog.is_some_and(|w| Instant::now() >= w) {
                        seen.forced = Some(Outcome::failed(
                            "WatchdogExpired",
                            format!(
                                "boot watchdog: no serial console output within {} s",
                                spec.boot_watchdog_seconds
                            ),
                        ));
                        break None;
                    }
                }
                () = &mut stop, if !seen.stop_requested => {
                    seen.stop_requested = true;
                    tracing::info!(grace_s = spec.grace_period_seconds, "stop requested: ACPI power-down");
                    if let Err(e) = qmp.execute("system_powerdown", None).await {
                        tracing::warn!(%e, "system_powerdown failed");
                    }
                    grace_deadline = Some(Instant::now() + Duration::from_secs(spec.grace_period_seconds));
                }
                () = sleep_until(grace_deadline.unwrap_or_else(Instant::now)), if grace_deadline.is_some() => {
                    seen.forced = Some(Outcome::failed(
                        "GracePeriodExpired",
                        format!(
                            "the guest did not power off within the {} s grace period; qemu was stopped",
                            spec.grace_period_seconds
                        ),
                    ));
                    break None;
                }
            }
        };
        if exit_status.is_some() {
            // qemu's exit can be seen before its last events (SHUTDOWN) are read: take what is
            // left until the socket's end closes the stream.
            let drain = async {
                loop {
                    match events.recv().await {
                        Ok(ev) => {
                            if let Some(forced) = on_event(&ev, &mut seen, reporter) {
                                seen.forced = Some(forced);
                            }
                        }
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => break,
                    }
                }
            };
            let _ = timeout(Duration::from_secs(2), drain).await;
        }
        outcome_of(seen, exit_status)
    }

    /// Ends qemu if it still runs (`quit`, then SIGKILL) and reaps it; returns the end of its
    /// stderr for failure reasons.
    async fn terminate(&mut self) -> Option<String> {
        if let Some(control) = self.control.take() {
            control.abort();
        }
        let child = self.child.as_mut()?;
        if matches!(child.try_wait(), Ok(None)) {
            match &self.qmp {
                Some(qmp) => {
                    // qemu may close the socket before answering quit: only its exit counts.
                    let _ = timeout(self.quit_timeout, qmp.execute("quit", None)).await;
                    if timeout(self.quit_timeout, child.wait()).await.is_err() {
                        tracing::warn!("qemu ignored quit: killing it");
                        let _ = child.start_kill();
                    }
                }
                // Never reached over QMP: nothing to shut down gracefully.
                None => {
                    let _ = child.start_kill();
                }
            }
        }
        if let Err(e) = child.wait().await {
            tracing::warn!(%e, "reaping qemu");
        }
        self.qmp = None;
        Some(log_tail(&self.paths.qemu_log))
    }
}

/// Handles one QMP event; returns an outcome when the event ends the VM by itself.
fn on_event(ev: &Event, seen: &mut Seen, reporter: &mut Reporter) -> Option<Outcome> {
    tracing::debug!(event = %ev.name, data = %ev.data, "QMP event");
    let report = |r: &mut Reporter, state| {
        if let Err(e) = r.report(state, None) {
            tracing::warn!(%e, "cannot report state");
        }
    };
    match ev.name.as_str() {
        "SHUTDOWN" => {
            seen.shutdown = Some(
                ev.data
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("none")
                    .to_string(),
            );
        }
        "GUEST_PANICKED" => {
            return Some(Outcome::failed(
                "GuestPanicked",
                format!("the guest kernel panicked ({})", ev.data),
            ));
        }
        "STOP" if seen.shutdown.is_none() => report(reporter, State::Paused),
        "RESUME" => report(reporter, State::Running),
        "BLOCK_IO_ERROR" => tracing::warn!(data = %ev.data, "guest disk I/O error"),
        _ => {}
    }
    None
}

/// The final outcome once qemu is gone (or about to be).
fn outcome_of(seen: Seen, exit_status: Option<ExitStatus>) -> Outcome {
    if let Some(forced) = seen.forced {
        return forced;
    }
    match seen.shutdown.as_deref() {
        Some("guest-shutdown") => Outcome {
            state: State::Succeeded,
            reason: Reason::new(
                "GuestShutdown",
                if seen.stop_requested {
                    "the guest powered off after the ACPI power-down request"
                } else {
                    "the guest powered off"
                },
            ),
        },
        Some("guest-reset") => {
            Outcome::failed("GuestReset", "the guest reset itself and noReboot is set")
        }
        Some("guest-panic") => Outcome::failed("GuestPanicked", "the guest kernel panicked"),
        Some(other) => Outcome::failed("QemuStopped", format!("qemu shut down: {other}")),
        None => Outcome::failed(
            "QemuExited",
            match exit_status {
                Some(s) => format!("qemu exited ({s}) without a shutdown event"),
                None => "qemu exited without a shutdown event".to_string(),
            },
        ),
    }
}

/// Starts qemu in its own process group (a terminal's Ctrl-C reaches only the launcher, which
/// stops the guest gracefully), with stdout/stderr into `log`, killed by the kernel if the
/// launcher dies and killed on drop.
fn spawn_qemu(qemu: &Path, args: &[std::ffi::OsString], log: &Path) -> Result<Child> {
    let out = std::fs::File::create(log)
        .map_err(|e| Error::io(format!("cannot create {}", log.display()), e))?;
    let err = out
        .try_clone()
        .map_err(|e| Error::io(format!("cannot create {}", log.display()), e))?;
    let mut cmd = std::process::Command::new(qemu);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let launcher = std::process::id();
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe syscalls.
    unsafe {
        cmd.pre_exec(move || {
            // PDEATHSIG fires when the forking *thread* ends: the launcher runs qemu from a
            // thread that lives as long as the process (the CLI uses a current-thread runtime).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher died before prctl took effect: do not run unsupervised.
            if libc::getppid() as u32 != launcher {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let mut cmd = Command::from(cmd);
    cmd.kill_on_drop(true);
    cmd.spawn()
        .map_err(|e| Error::Qemu(format!("cannot start {}: {e}", qemu.display())))
}

/// `query-block` must show every spec disk inserted under its device.
async fn check_block_devices(qmp: &Qmp, spec: &VmSpec) -> Result<()> {
    let blocks = qmp.execute("query-block", None).await?;
    let list = blocks.as_array().cloned().unwrap_or_default();
    for d in &spec.disks {
        let node = disk::format_node(&d.name);
        let id = disk::device_id(&d.name);
        let child_prefix = format!("/machine/peripheral/{id}/");
        // query-block names the device by its id (scsi-hd) or, for virtio-blk, by the QOM path of
        // its id-less backend child.
        let found = list.iter().any(|b| {
            b["inserted"]["node-name"] == node.as_str()
                && b["qdev"]
                    .as_str()
                    .is_some_and(|q| q == id || q.starts_with(&child_prefix))
        });
        if !found {
            return Err(Error::Qemu(format!(
                "disk {:?} is not attached to its device according to query-block",
                d.name
            )));
        }
    }
    Ok(())
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The last non-empty lines of qemu's output (at most its last 600 bytes), joined with ` | `.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text[text.len().saturating_sub(600)..]).into_owned();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn seen(shutdown: Option<&str>, stop_requested: bool) -> Seen {
        Seen {
            shutdown: shutdown.map(str::to_string),
            stop_requested,
            ..Seen::default()
        }
    }

    #[test]
    fn outcomes_from_shutdown_reasons() {
        let o = outcome_of(seen(Some("guest-shutdown"), false), None);
        assert_eq!(
            (o.state, o.reason.code),
            (State::Succeeded, "GuestShutdown")
        );
        let o = outcome_of(seen(Some("guest-shutdown"), true), None);
        assert!(o.reason.message.contains("ACPI"));
        for (reason, code) in [
            ("guest-reset", "GuestReset"),
            ("guest-panic", "GuestPanicked"),
            ("host-signal", "QemuStopped"),
        ] {
            let o = outcome_of(seen(Some(reason), false), None);
            assert_eq!((o.state, o.reason.code), (State::Failed, code), "{reason}");
        }
        let o = outcome_of(seen(None, false), Some(ExitStatus::from_raw(9)));
        assert_eq!(o.reason.code, "QemuExited");
        assert!(
            o.reason.message.contains("signal: 9"),
            "{}",
            o.reason.message
        );
    }

    #[test]
    fn a_decided_outcome_wins() {
        let mut s = seen(Some("guest-shutdown"), true);
        s.forced = Some(Outcome::failed("GracePeriodExpired", "late"));
        assert_eq!(outcome_of(s, None).reason.code, "GracePeriodExpired");
    }

    /// A spec whose "qemu" is `qemu` (no real qemu needed) with one small disk.
    fn fake_qemu_spec(dir: &Path, qemu: PathBuf) -> VmSpec {
        let disk = dir.join("disk.img");
        std::fs::write(&disk, [0u8; 4096]).unwrap();
        let mut spec = VmSpec::new("unit");
        spec.allow_emulation = true;
        spec.run_dir = Some(dir.join("run"));
        spec.qemu = Some(qemu);
        spec.disks = vec![crate::spec::DiskSpec {
            name: "d".into(),
            path: disk,
            bus: Default::default(),
            readonly: false,
            boot_order: Some(1),
        }];
        spec
    }

    #[tokio::test]
    async fn stop_during_start_up_kills_qemu() {
        let dir = tempfile::tempdir().unwrap();
        // A "qemu" that never opens its QMP socket; it records its pid first. The pid file
        // appears by rename, whole: a redirect creates it empty before the pid is written, and a
        // stop at that moment left the test reading an empty file.
        let script = dir.path().join("hang.sh");
        let pidfile = dir.path().join("hang.pid");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho $$ > {0}.tmp\nmv {0}.tmp {0}\nexec sleep 60\n",
                pidfile.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let spec = fake_qemu_spec(dir.path(), script);
        let pidfile2 = pidfile.clone();
        let stop = async move {
            while !pidfile2.exists() {
                sleep(Duration::from_millis(20)).await;
            }
        };
        let outcome = run(spec, stop).await.unwrap();
        assert_eq!(
            (outcome.state, outcome.reason.code),
            (State::Failed, "Stopped")
        );
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Reaped by run(): the pid no longer exists.
        // SAFETY: kill(2) takes integers only, and signal 0 only checks that the pid exists.
        let alive = unsafe { libc::kill(pid, 0) };
        assert_eq!(alive, -1);
    }

    #[tokio::test]
    async fn qemu_ignoring_quit_is_killed() {
        use crate::qmp::fake;
        let dir = tempfile::tempdir().unwrap();
        let spec = fake_qemu_spec(dir.path(), "/bin/sleep".into());
        let paths = LaunchPaths::for_spec(&spec);
        std::fs::create_dir_all(&paths.run_dir).unwrap();
        // A "qemu" that answers quit over QMP but keeps running.
        let (_sock_dir, sock, listener) = fake::socket();
        tokio::spawn(fake::server(listener, |cmd| {
            vec![serde_json::json!({"return": {}, "id": cmd["id"]}).to_string()]
        }));
        let (qmp, _events) = Qmp::connect(&sock).await.unwrap();
        let child = spawn_qemu(Path::new("/bin/sleep"), &["60".into()], &paths.qemu_log).unwrap();
        let mut vm = Vm {
            spec: &spec,
            paths: &paths,
            child: Some(child),
            qmp: Some(Arc::new(qmp)),
            events: None,
            control: None,
            quit_timeout: Duration::from_millis(200),
        };
        vm.terminate().await;
        let status = vm
            .child
            .as_mut()
            .unwrap()
            .try_wait()
            .unwrap()
            .expect("reaped");
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[tokio::test]
    async fn a_run_dir_too_long_for_sockets_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = fake_qemu_spec(dir.path(), "/bin/false".into());
        spec.run_dir = Some(dir.path().join("r".repeat(110)));
        let outcome = run(spec, std::future::pending()).await.unwrap();
        assert_eq!(outcome.reason.code, "InvalidSpec");
        assert!(
            outcome.reason.message.contains("too long"),
            "{}",
            outcome.reason.message
        );
    }

    #[tokio::test]
    async fn a_missing_qemu_fails_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let spec = fake_qemu_spec(dir.path(), dir.path().join("no-such-qemu"));
        let outcome = run(spec, std::future::pending()).await.unwrap();
        assert_eq!(outcome.reason.code, "StartFailed");
        assert!(
            outcome.reason.message.contains("no-such-qemu"),
            "{}",
            outcome.reason.message
        );
        let status = std::fs::read_to_string(dir.path().join("run/status.json")).unwrap();
        assert!(status.contains("StartFailed"), "{status}");
    }

    #[test]
    fn qemu_log_tail() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("qemu.log");
        let mut text = "x".repeat(1000);
        text.push_str("\nqemu-system-x86_64: -blockdev x: Could not open 'x'\n\n");
        std::fs::write(&log, text).unwrap();
        let tail = log_tail(&log);
        assert!(
            tail.ends_with("qemu-system-x86_64: -blockdev x: Could not open 'x'"),
            "{tail}"
        );
        assert!(tail.len() <= 600 + 3);
        assert_eq!(log_tail(&dir.path().join("missing")), "");
    }
}
