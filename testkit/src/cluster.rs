//! A real one-node Kubernetes cluster with Quarry installed, for the end-to-end suite
//! (`tests/cluster/`): `../shared/kube/cluster.sh` starts kubelet, containerd, the control plane,
//! kube-proxy, DNS, a registry and the CSI sidecars from binaries built on this machine
//! ([`crate::kube::artifacts_dir`]); then Quarry's image is built from the test's `quarry`
//! binary, loaded, and the bundle applied exactly as the README's "Install on a cluster" says.
//!
//! Only one cluster can run on a machine (the kubelet's directory and the bridge are fixed), so
//! every test process of a run shares it: the first starts it under a lock and leaves a watcher
//! that takes it down when the test runner exits; the others attach. [`Cluster::shared`]
//! returns `None` after printing why (`skipping: ...`) where the cluster cannot run: not root,
//! no `cluster.sh`, or no binaries.

use std::fs;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::kube::{artifact, artifacts_dir};

/// Where the cluster lives: short (a unix socket is inside) and fixed (one cluster a machine).
const DIR: &str = "/var/tmp/quarry-e2e";
/// The default pool of the bundle's HostPathProvisioner: the cluster's volumes live there, on
/// the host, after the cluster is gone; each run empties it when it takes the cluster down.
const POOL: &str = "/var/hpvolumes/csi";
/// The reference the bundle runs (`deploy/kustomization.yaml`).
pub const IMAGE: &str = "quay.io/quarry/quarry:latest";
/// Quarry's namespace.
pub const NAMESPACE: &str = "quarry";
/// The binaries `cluster.sh` needs besides the API server.
const NODE_BINARIES: [&str; 6] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
];

/// The running cluster, as `cluster.sh env` describes it.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// `cluster.sh`'s directory (logs in `DIR/logs/`).
    pub dir: PathBuf,
    /// `KUBECONFIG`.
    pub kubeconfig: PathBuf,
    /// `PATH` with the cluster's kubectl first.
    path: String,
    /// The node's address, where pods reach servers on the host.
    pub node_ip: String,
    /// The node's name.
    pub node_name: String,
    /// The image registry on 127.0.0.1 (HOST:PORT), which pods pull every image from.
    pub registry: String,
}

/// `<checkout>/../shared/kube/cluster.sh`, or `$QUARRY_CLUSTER_SH`.
fn cluster_sh() -> PathBuf {
    std::env::var_os("QUARRY_CLUSTER_SH").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/kube/cluster.sh"),
        PathBuf::from,
    )
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Why the cluster cannot run here, if it cannot.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the test cluster needs root".into());
    }
    let sh = cluster_sh();
    if !sh.is_file() {
        return Some(format!("{} is absent", sh.display()));
    }
    let missing: Vec<_> = NODE_BINARIES
        .iter()
        .filter(|b| artifact(b).is_none())
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "{missing:?} not in {} (built locally from Kubernetes' sources: ../shared/kube/README.md)",
            artifacts_dir().display()
        ));
    }
    let images = artifacts_dir().join("images");
    let has_images = fs::read_dir(&images)
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".oci.tar.xz"))
        })
        .unwrap_or(false);
    if !has_images {
        return Some(format!("no sidecar images in {}", images.display()));
    }
    None
}

impl Cluster {
    /// The cluster of this test run with Quarry installed from `quarry` (the test's binary),
    /// started by the first caller; `None` (after saying why) where it cannot run.
    pub fn shared(quarry: &str) -> Option<&'static Cluster> {
        static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
        CLUSTER
            .get_or_init(|| {
                if let Some(why) = skip_reason() {
                    eprintln!("skipping: {why}");
                    return None;
                }
                Some(shared(Path::new(quarry)).unwrap_or_else(|e| panic!("testkit: cluster: {e}")))
            })
            .as_ref()
    }

    /// A command with the cluster's environment.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", &self.path);
        c
    }

    /// `kubectl ARGS`: its output, whatever its exit status. While the API server cannot be
    /// reached (restarted by a fault test, say) the call is repeated, for up to a minute: by
    /// kubectl, or by an admission webhook whose pod reaches it through the `kubernetes`
    /// Service, which kube-proxy routes to the new server only once its own watch is back.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with_input(args, None)
    }

    /// [`Cluster::kubectl`] with `input` on its standard input.
    pub fn kubectl_with_input(&self, args: &[&str], input: Option<&str>) -> Output {
        let start = Instant::now();
        loop {
            let mut child = self
                .command("kubectl")
                .args(args)
                .stdin(if input.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("running kubectl");
            if let Some(input) = input {
                // kubectl may exit before reading all of it: its exit status says what failed
                let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
            }
            let out = child.wait_with_output().expect("running kubectl");
            let err = String::from_utf8_lossy(&out.stderr);
            let unreachable = [
                "connection refused",
                "The connection to the server",
                "TLS handshake timeout",
                "etcdserver: leader changed",
            ]
            .iter()
            .any(|m| err.contains(m))
                || (err.contains("admission webhook") && err.contains("client error (Connect)"));
            if out.status.success() || !unreachable || start.elapsed() > Duration::from_secs(60) {
                return out;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `kubectl ARGS`, which must succeed: its standard output.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `yaml`, which must succeed.
    pub fn apply(&self, yaml: &str) {
        let out = self.kubectl_with_input(&["apply", "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "kubectl apply: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the API server (SIGTERM, as a restart does) and starts it again with the same
    /// command line, where `cluster.sh` keeps it (its pid file, its log); returns once it is
    /// ready and the `kubernetes` Service reaches it. The controllers must carry on by
    /// themselves.
    pub fn restart_api_server(&self) {
        let pid_file = self.dir.join("run/kube-apiserver.pid");
        let pid: i32 = fs::read_to_string(&pid_file)
            .expect("the API server's pid file")
            .trim()
            .parse()
            .expect("a pid");
        let argv: Vec<String> = fs::read(format!("/proc/{pid}/cmdline"))
            .expect("the API server's command line")
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        // Where pods reach it (the Service's address outlives the server).
        let service: std::net::IpAddr = self
            .kubectl_ok(&[
                "-n",
                "default",
                "get",
                "service",
                "kubernetes",
                "-o",
                "jsonpath={.spec.clusterIP}",
            ])
            .trim()
            .parse()
            .expect("the kubernetes Service's clusterIP");
        // As cluster.sh stops it: SIGTERM, then SIGKILL after 20 s. Gone once its /proc entry
        // is, or it is a zombie (whoever adopted it may not reap it soon).
        let gone = || {
            fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| {
                st.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z'))
            })
        };
        for (signal, wait) in [(libc::SIGTERM, 20), (libc::SIGKILL, 10)] {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid, signal) };
            let start = Instant::now();
            while !gone() && start.elapsed() < Duration::from_secs(wait) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        assert!(gone(), "the API server (pid {pid}) did not stop");
        // Started as cluster.sh starts it: in a session of its own, adopted once the shell
        // exits, so that `cluster.sh down` stops it.
        let out = Command::new("sh")
            .arg("-c")
            .arg(r#"setsid "$@" </dev/null >>"$LOG" 2>&1 & echo $!"#)
            .arg("sh")
            .args(&argv)
            .env("LOG", self.dir.join("logs/kube-apiserver.log"))
            .output()
            .expect("starting the API server again");
        let new_pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success() && !new_pid.is_empty(),
            "starting the API server again: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        fs::write(&pid_file, format!("{new_pid}\n")).expect("writing its pid file");
        // Ready, back in the `kubernetes` Service's endpoints (it takes itself out when it
        // stops), and reached through the Service, as pods reach it: kube-proxy rejects the
        // Service's connections while it has no endpoints, and its own watch of them comes back
        // only after its back-off, seconds to a minute later. The node's own connections pass
        // the same rules.
        let start = Instant::now();
        let routed = || {
            std::net::TcpStream::connect_timeout(&(service, 443).into(), Duration::from_secs(1))
                .is_ok()
        };
        while !self.kubectl(&["get", "--raw", "/readyz"]).status.success()
            || self
                .kubectl_ok(&[
                    "-n",
                    "default",
                    "get",
                    "endpoints",
                    "kubernetes",
                    "-o",
                    "jsonpath={.subsets[*].addresses[*].ip}",
                ])
                .trim()
                .is_empty()
            || !routed()
        {
            assert!(
                start.elapsed() < Duration::from_secs(180),
                "the API server did not come back, or the kubernetes Service does not reach it"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// A kube-rs client as the cluster's admin.
    pub fn client(&self) -> kube::Client {
        let yaml = fs::read_to_string(&self.kubeconfig).expect("reading the kubeconfig");
        crate::kube::client_from(&yaml)
    }

    /// A new namespace named after `prefix` with `labels` (Pod Security levels, say).
    pub fn namespace(&self, prefix: &str, labels: &[(&str, &str)]) -> String {
        let name = format!("{prefix}-{:x}", crate::kube::unique() & 0xffff_ffff);
        self.kubectl_ok(&["create", "namespace", &name]);
        for (k, v) in labels {
            self.kubectl_ok(&["label", "namespace", &name, &format!("{k}={v}")]);
        }
        name
    }

    /// Waits until `jsonpath` of `what` (in `namespace`) reads `want`, for at most `limit`, or
    /// panics naming the value last read and the object.
    pub fn wait_for(
        &self,
        namespace: &str,
        what: &str,
        jsonpath: &str,
        want: &str,
        limit: Duration,
    ) {
        self.wait_until(
            namespace,
            what,
            jsonpath,
            &format!("{want:?}"),
            limit,
            |v| v == want,
        );
    }

    /// Waits until `done` holds for `jsonpath` of `what` (in `namespace`), for at most `limit`:
    /// the value read then, or a panic naming the value last read, `expected` (what `done`
    /// looks for, in words) and the object.
    pub fn wait_until(
        &self,
        namespace: &str,
        what: &str,
        jsonpath: &str,
        expected: &str,
        limit: Duration,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < limit {
            let out = self.kubectl(&[
                "-n",
                namespace,
                "get",
                what,
                "-o",
                &format!("jsonpath={jsonpath}"),
            ]);
            last = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && done(&last) {
                return last;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let dump = self.kubectl(&["-n", namespace, "get", what, "-o", "yaml"]);
        let events = self.kubectl(&["-n", namespace, "get", "events", "--sort-by=.lastTimestamp"]);
        panic!(
            "{what} in {namespace}: {jsonpath} is {last:?}, not {expected}, after {limit:?}\n{}\n{}",
            String::from_utf8_lossy(&dump.stdout),
            String::from_utf8_lossy(&events.stdout)
        );
    }
}

fn run(what: &str, cmd: &mut Command, log: &Path) -> Result<(), String> {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .status()
        .map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        let text = fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<_> = text.lines().rev().take(30).collect();
        let tail: Vec<_> = tail.into_iter().rev().collect();
        Err(format!(
            "{what} failed ({status}); {}:\n{}",
            log.display(),
            tail.join("\n")
        ))
    }
}

/// `cluster.sh env DIR` parsed.
fn describe(dir: &Path) -> Result<Cluster, String> {
    let out = Command::new("bash")
        .arg(cluster_sh())
        .arg("env")
        .arg(dir)
        .output()
        .map_err(|e| format!("cluster.sh env: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let var = |name: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .map(str::to_string)
            .ok_or_else(|| format!("cluster.sh env printed no {name}: {text}"))
    };
    let bin_path = var("PATH")?.replace("$PATH", &std::env::var("PATH").unwrap_or_default());
    Ok(Cluster {
        dir: dir.to_path_buf(),
        kubeconfig: var("KUBECONFIG")?.into(),
        path: bin_path,
        node_ip: var("KUBELAB_NODE_IP")?,
        node_name: var("KUBELAB_NODE_NAME")?,
        registry: var("KUBELAB_REGISTRY")?,
    })
}

/// The cluster of this run: attached to when another test process started it, else started
/// (with a watcher that takes it down when the test runner exits) and Quarry installed.
fn shared(quarry: &Path) -> Result<Cluster, String> {
    let owner = if std::env::var_os("NEXTEST_RUN_ID").is_some() {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::getppid() as u32 }
    } else {
        std::process::id()
    };
    let dir = PathBuf::from(DIR);
    let state = PathBuf::from(format!("{DIR}-state"));
    fs::create_dir_all(&state).map_err(|e| format!("creating {}: {e}", state.display()))?;
    let lock = fs::File::create(state.join("lock")).map_err(|e| format!("lock file: {e}"))?;
    // SAFETY: flock on a descriptor we own; released when `lock` is closed.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(format!("flock: {}", std::io::Error::last_os_error()));
    }
    let ready = state.join("ready");
    if fs::read_to_string(&ready).ok().as_deref() == Some(owner.to_string().as_str()) {
        return describe(&dir);
    }
    let _ = fs::remove_file(&ready);
    // From here the cluster is this run's: an earlier run's watcher leaves it alone.
    let owner_file = state.join("owner");
    fs::write(&owner_file, owner.to_string()).map_err(|e| format!("writing owner: {e}"))?;
    let log = state.join("setup.log");
    let _ = fs::remove_file(&log);
    let sh = cluster_sh();
    // A cluster left by an earlier run (a killed runner) goes first.
    run(
        "cluster.sh down",
        Command::new("bash").arg(&sh).arg("down").arg(&dir),
        &log,
    )?;
    run(
        "emptying the pool",
        Command::new("sh").args(["-c", &format!("rm -rf {POOL}/pvc-*")]),
        &log,
    )?;
    // The watcher outlives this test process: it takes the cluster down when the runner exits,
    // under the lock, unless a later run has taken the cluster over by then.
    let script = format!(
        "while kill -0 {owner} 2>/dev/null; do sleep 2; done; \
         exec flock '{lock}' sh -c '[ \"$(cat {owner_file})\" = {owner} ] || exit 0; \
         rm -f {ready}; bash {sh} down {dir} >>{log} 2>&1 && rm -rf {POOL}/pvc-*'",
        lock = state.join("lock").display(),
        owner_file = owner_file.display(),
        ready = ready.display(),
        sh = sh.display(),
        dir = dir.display(),
        log = log.display()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting the watcher: {e}"))?;
    let started = Instant::now();
    run(
        "cluster.sh up",
        Command::new("bash").arg(&sh).arg("up").arg(&dir),
        &log,
    )?;
    let cluster = describe(&dir)?;
    install(&cluster, quarry, &state, &log)?;
    eprintln!(
        "testkit: cluster up with Quarry installed in {:.0?}",
        started.elapsed()
    );
    fs::write(&ready, owner.to_string()).map_err(|e| format!("writing ready: {e}"))?;
    Ok(cluster)
}

/// Builds Quarry's image from `quarry`, loads it and applies the bundle as the README's
/// "Install on a cluster" does, then waits for every component.
fn install(c: &Cluster, quarry: &Path, state: &Path, log: &Path) -> Result<(), String> {
    let root = repo_root();
    let out = state.join("image");
    run(
        "scripts/build-image.sh",
        Command::new("bash")
            .arg(root.join("scripts/build-image.sh"))
            .arg("--binary")
            .arg(quarry)
            .arg("--tag")
            .arg("latest")
            .arg("--out")
            .arg(&out),
        log,
    )?;
    run(
        "cluster.sh load",
        Command::new("bash")
            .arg(cluster_sh())
            .arg("load")
            .arg(&c.dir)
            .arg(out.join("quarry-oci.tar"))
            .arg(IMAGE),
        log,
    )?;
    let deploy = root.join("deploy");
    run(
        "kubectl apply -k deploy/",
        c.command("kubectl")
            .args(["apply", "--server-side", "-k"])
            .arg(&deploy),
        log,
    )?;
    run(
        "waiting for the Deployments",
        c.command("kubectl").args([
            "-n",
            NAMESPACE,
            "wait",
            "--for=condition=Available",
            "deployment",
            "--all",
            "--timeout=300s",
        ]),
        log,
    )?;
    // The HostPathProvisioner controller makes the CSI DaemonSet from its default CR.
    let start = Instant::now();
    while c
        .kubectl(&["-n", NAMESPACE, "get", "daemonset", "quarry-csi"])
        .status
        .code()
        != Some(0)
    {
        if start.elapsed() > Duration::from_secs(120) {
            return Err("no CSI DaemonSet from the HostPathProvisioner controller in 120 s".into());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    run(
        "waiting for the CSI DaemonSet",
        c.command("kubectl").args([
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            "daemonset/quarry-csi",
            "--timeout=300s",
        ]),
        log,
    )
}
