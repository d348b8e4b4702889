//! `quarry controller --leader-elect` as the Deployments run it, against the real API server:
//! of two replicas (identities from $POD_NAME) one leads; SIGTERM makes the leader stop and
//! release its Lease, and the other replica takes over. Skips, saying why, where
//! the locally built kube-apiserver (`~/.cache/kubelab`) or etcd is absent.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use testkit::kube::KubeApiServer;

/// One replica of `controller`, logging to `log`, campaigning for its Lease in `ns` (each test
/// its own: the server is shared).
fn replica(server: &KubeApiServer, controller: &str, ns: &str, pod: &str, log: &Path) -> Child {
    common::quarry()
        .args([
            "controller",
            "--leader-elect",
            &format!("--leader-elect-namespace={ns}"),
            "--metrics-addr=127.0.0.1:0",
            controller,
        ])
        .env("KUBECONFIG", server.kubeconfig())
        .env("POD_NAME", pod)
        .env("QUARRY_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(fs::File::create(log).unwrap())
        .spawn()
        .expect("starting quarry controller")
}

/// Waits (a hang guard of 60 s, not a measure) until `log` has a line with `what`.
fn wait_log(log: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !fs::read_to_string(log).unwrap_or_default().contains(what) {
        assert!(
            Instant::now() < deadline,
            "no {what:?} in {}:\n{}",
            log.display(),
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGTERMs `child` and waits for its exit; a hang fails the test with its log (`log`).
fn term(child: &mut Child, log: &Path) -> std::process::ExitStatus {
    assert_eq!(
        // SAFETY: kill(2) takes integers only; `child` is not reaped yet, so its PID is its own.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    // A hang guard, not a measure: a replica that ignores SIGTERM fails the test.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "pid {} did not exit within 60 s of SIGTERM; its log:\n{}",
                child.id(),
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn of_two_replicas_one_leads_and_the_other_takes_over_when_it_stops() {
    let Some(server) = KubeApiServer::shared() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let mut a = replica(server, "datavolume", "default", "replica-a", &log_a);
    wait_log(&log_a, "became leader");
    let mut b = replica(server, "datavolume", "default", "replica-b", &log_b);
    // b is up (its metrics server bound) and waiting: it does not lead while a does.
    wait_log(&log_b, "serving metrics");
    assert!(
        !fs::read_to_string(&log_b)
            .unwrap()
            .contains("became leader"),
        "two leaders"
    );
    let status = term(&mut a, &log_a);
    assert!(status.success(), "the leader's exit on SIGTERM: {status}");
    wait_log(&log_a, "released the lease");
    wait_log(&log_b, "became leader");
    let identity = fs::read_to_string(&log_b).unwrap();
    assert!(identity.contains("identity=replica-b"), "{identity}");
    assert!(term(&mut b, &log_b).success());
}

#[test]
fn a_replica_waiting_for_the_lease_exits_on_sigterm() {
    let Some(server) = KubeApiServer::shared() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    // The DataSource controller: of those that run beside the other tests on the shared server,
    // the one that touches least.
    let mut a = replica(server, "datasource", "kube-public", "replica-a", &log_a);
    wait_log(&log_a, "became leader");
    let mut b = replica(server, "datasource", "kube-public", "replica-b", &log_b);
    wait_log(&log_b, "serving metrics");
    // b campaigns behind a: SIGTERM ends it at once and cleanly, as it ends a leader.
    let status = term(&mut b, &log_b);
    assert!(
        status.success(),
        "the waiting replica's exit on SIGTERM: {status}"
    );
    assert!(
        !fs::read_to_string(&log_b)
            .unwrap()
            .contains("became leader"),
        "two leaders"
    );
    assert!(term(&mut a, &log_a).success());
}
