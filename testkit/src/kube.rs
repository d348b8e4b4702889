//! A real Kubernetes API server for tests: Debian's etcd and the `kube-apiserver` built on this
//! machine into [`artifacts_dir`] (1.28 or later), on 127.0.0.1 with free ports, openssl-made certificates,
//! a token file with one admin user (`system:masters`), RBAC authorization, Pod Security
//! admission, and the front-proxy flags an aggregated API server needs.
//!
//! Two ways to get one:
//! - [`KubeApiServer::shared`]: one server for the whole test binary, shared by every test in it
//!   (each test works in its own namespace, [`KubeApiServer::namespace`]). nextest runs each test
//!   in its own process, so the first test process starts the server detached, under a lock file,
//!   and the others attach to it; a small watcher stops etcd and the apiserver by PID when the
//!   test runner (nextest, or the `cargo test` process itself) exits.
//! - [`KubeApiServer::start`]: a server of the test's own, stopped by PID when dropped.
//!
//! Both return `None` after printing why (`skipping: ...`) when that `kube-apiserver` (plain or
//! `.xz`) or `etcd` is absent, so the suite passes on machines without them. An `.xz` binary is
//! unpacked once into a cache directory under the system temp dir.
//!
//! There is no scheduler, kubelet or controller-manager: tests play those parts by writing status
//! subresources themselves.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::tls::{make_ca, openssl, signed_by};

/// Server-side applies `crd` as field manager `manager` (idempotent) and waits until the server
/// serves it.
pub async fn apply_crd(client: &kube::Client, crd: &CustomResourceDefinition, manager: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().expect("a CRD's name");
    api.patch(
        &name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(crd),
    )
    .await
    .unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
    established(client, &name).await;
}

/// Waits (a minute at most) until the server serves CRD `name`.
pub async fn established(client: &kube::Client, name: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let crd = api.get_opt(name).await.ok().flatten();
        let conditions = crd.and_then(|c| c.status?.conditions).unwrap_or_default();
        if conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "CRD {name} not established in {READY_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Token of the admin user (`system:masters`) in the server's token file.
const ADMIN_TOKEN: &str = "quarry-testkit-admin-token";
/// Common name of the front-proxy client certificate the apiserver presents to aggregated
/// API servers (and the only name they should accept).
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const START_ATTEMPTS: usize = 3;

/// Where the test cluster's binaries are built and kept (never in a repository):
/// `$KUBELAB_ARTIFACTS`, else `~/.cache/kubelab` (see `../shared/kube/README.md`).
pub fn artifacts_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KUBELAB_ARTIFACTS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/kubelab")
}

/// `NAME` or `NAME.xz` in the artifacts directory, whichever is there.
pub fn artifact(name: &str) -> Option<PathBuf> {
    let dir = artifacts_dir();
    [dir.join(name), dir.join(format!("{name}.xz"))]
        .into_iter()
        .find(|p| p.is_file())
}

/// Why the API server cannot run here, if it cannot.
pub fn skip_reason() -> Option<String> {
    if artifact("kube-apiserver").is_none() {
        return Some(format!(
            "no kube-apiserver in {} (built locally from Kubernetes' sources: ../shared/kube/README.md)",
            artifacts_dir().display()
        ));
    }
    if which("etcd").is_none() {
        return Some("etcd is not installed (Debian package etcd-server)".into());
    }
    if which("xz").is_none() || which("openssl").is_none() || which("curl").is_none() {
        return Some("xz, openssl or curl is not installed".into());
    }
    None
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.is_file())
}

/// The `kube-apiserver` to run: the artifact itself, or an `.xz` one unpacked once into a
/// cache (atomically; each unpacking writes a file of its own, so that no thread executes a
/// file another is still writing).
fn apiserver_binary() -> Result<PathBuf, String> {
    let src = artifact("kube-apiserver").ok_or_else(|| "no kube-apiserver".to_string())?;
    if src.extension().is_none_or(|e| e != "xz") {
        return Ok(src);
    }
    let meta = fs::metadata(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let cache = std::env::temp_dir().join("quarry-testkit-cache");
    fs::create_dir_all(&cache).map_err(|e| format!("creating {}: {e}", cache.display()))?;
    let bin = cache.join(format!("kube-apiserver-{}-{mtime}", meta.len()));
    if bin.is_file() {
        return Ok(bin);
    }
    let tmp = cache.join(format!("kube-apiserver.{:x}.part", unique()));
    let out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(&tmp)
        .map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let status = Command::new("xz")
        .arg("-dc")
        .arg(&src)
        .stdout(out)
        .status()
        .map_err(|e| format!("running xz: {e}"))?;
    if !status.success() {
        let _ = fs::remove_file(&tmp);
        return Err(format!("xz -dc {} failed: {status}", src.display()));
    }
    fs::rename(&tmp, &bin).map_err(|e| format!("moving {}: {e}", tmp.display()))?;
    Ok(bin)
}

/// How to start a server of one's own.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Extra `kube-apiserver` flags (`--feature-gates=...`, `--runtime-config=...`).
    pub extra_args: Vec<String>,
}

/// Paths of the front-proxy material, for aggregated API servers under test: they trust
/// `client_ca` for the apiserver's client certificate (CN [`FRONT_PROXY_CLIENT`]) and read the
/// user from `X-Remote-User` / `X-Remote-Group` / `X-Remote-Extra-*`.
#[derive(Debug, Clone)]
pub struct FrontProxy {
    /// CA of the front-proxy client certificate.
    pub client_ca: PathBuf,
    /// The client certificate and key the apiserver presents (tests may present them too).
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
}

/// A running API server (etcd behind it).
pub struct KubeApiServer {
    dir: PathBuf,
    url: String,
    /// Children stopped on drop (None for the shared server: its watcher stops it).
    owned: Option<Owned>,
}

struct Owned {
    processes: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        if let Some(owned) = &mut self.owned {
            // The apiserver first, then etcd under it.
            for child in owned.processes.iter_mut().rev() {
                stop(child);
            }
        }
    }
}

fn stop(child: &mut Child) {
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

static SHARED: OnceLock<Option<KubeApiServer>> = OnceLock::new();

impl KubeApiServer {
    /// The test binary's shared server, started by the first test that asks. `None` (after
    /// printing why) when it cannot run here. Panics when it should run but does not start.
    pub fn shared() -> Option<&'static KubeApiServer> {
        SHARED
            .get_or_init(|| {
                if let Some(why) = skip_reason() {
                    eprintln!("skipping: {why}");
                    return None;
                }
                Some(shared_server().unwrap_or_else(|e| panic!("testkit: kube-apiserver: {e}")))
            })
            .as_ref()
    }

    /// A server of the caller's own, stopped when dropped. `None` (after printing why) when it
    /// cannot run here.
    pub fn start(opts: &Options) -> Option<KubeApiServer> {
        if let Some(why) = skip_reason() {
            eprintln!("skipping: {why}");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("testkit-kube-")
            .tempdir()
            .expect("creating a temp dir for the API server");
        let (url, processes) = launch(dir.path(), opts, false)
            .unwrap_or_else(|e| panic!("testkit: kube-apiserver: {e}"));
        Some(KubeApiServer {
            dir: dir.path().to_path_buf(),
            url,
            owned: Some(Owned {
                processes,
                _dir: dir,
            }),
        })
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The CA of the serving certificate (PEM).
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The CA the apiserver trusts for client certificates (also signs the serving one): its key
    /// is `ca.key` beside [`KubeApiServer::ca_pem`].
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// The front-proxy material.
    pub fn front_proxy(&self) -> FrontProxy {
        FrontProxy {
            client_ca: self.dir.join("front-proxy-ca.pem"),
            client_cert: self.dir.join("front-proxy-client.pem"),
            client_key: self.dir.join("front-proxy-client.key"),
        }
    }

    /// A kubeconfig file for the admin user (for `kubectl`-style CLIs under test).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// A client acting as the admin (`system:masters`).
    pub fn client(&self) -> kube::Client {
        self.client_from(&kubeconfig_yaml(self, ADMIN_TOKEN, None))
    }

    /// A client acting as `user` in `groups`, by impersonation (the admin may impersonate
    /// anyone): what RBAC allows that user is what the client can do.
    pub fn client_as(&self, user: &str, groups: &[&str]) -> kube::Client {
        self.client_from(&kubeconfig_yaml(self, ADMIN_TOKEN, Some((user, groups))))
    }

    /// A client with a real token of ServiceAccount `namespace/name` (created when missing),
    /// issued by the TokenRequest API.
    pub async fn service_account_client(&self, namespace: &str, name: &str) -> kube::Client {
        let admin = self.client();
        let sas: Api<ServiceAccount> = Api::namespaced(admin, namespace);
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating ServiceAccount {namespace}/{name}: {e}"),
        }
        let req: TokenRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [], "expirationSeconds": 3600}
        }))
        .expect("a TokenRequest");
        let token = sas
            .create_token_request(name, &PostParams::default(), &req)
            .await
            .unwrap_or_else(|e| panic!("token for {namespace}/{name}: {e}"))
            .status
            .expect("TokenRequest status")
            .token;
        self.client_from(&kubeconfig_yaml(self, &token, None))
    }

    /// Creates a fresh namespace named `PREFIX-N` (unique in the server) with `labels` and its
    /// `default` ServiceAccount, and returns its name. Tests sharing a server each work in their own namespaces.
    pub async fn namespace(&self, prefix: &str, labels: &[(&str, &str)]) -> String {
        let api: Api<Namespace> = Api::all(self.client());
        for _ in 0..100 {
            let name = format!("{prefix}-{:x}", unique());
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(
                        labels
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&PostParams::default(), &ns).await {
                Ok(_) => {
                    // The ServiceAccount admission plugin refuses pods without their
                    // ServiceAccount; no controller-manager makes `default` here.
                    let sas: Api<ServiceAccount> = Api::namespaced(self.client(), &name);
                    let sa = ServiceAccount {
                        metadata: ObjectMeta {
                            name: Some("default".into()),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    sas.create(&PostParams::default(), &sa)
                        .await
                        .unwrap_or_else(|e| panic!("creating {name}/default: {e}"));
                    return name;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => panic!("creating namespace {name}: {e}"),
            }
        }
        panic!("no free namespace name for {prefix}")
    }

    fn client_from(&self, yaml: &str) -> kube::Client {
        client_from(yaml)
    }
}

/// A client from a kubeconfig whose user has a token (loading it never waits).
pub(crate) fn client_from(yaml: &str) -> kube::Client {
    let kc = Kubeconfig::from_yaml(yaml).expect("testkit kubeconfig parses");
    let cfg = futures_executor_block_on(kube::Config::from_custom_kubeconfig(
        kc,
        &KubeConfigOptions::default(),
    ))
    .expect("testkit kubeconfig loads");
    kube::Client::try_from(cfg).expect("a kube client (needs a tokio runtime)")
}

/// A process-unique, time-seeded number for names.
pub(crate) fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ (u64::from(std::process::id()) << 32)).wrapping_add(N.fetch_add(1, Ordering::Relaxed))
        & 0xff_ffff_ffff
}

/// `Config::from_custom_kubeconfig` is async but does no I/O for a token kubeconfig: poll it once.
fn futures_executor_block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("loading a token kubeconfig unexpectedly waited"),
    }
}

fn kubeconfig_yaml(s: &KubeApiServer, token: &str, who: Option<(&str, &[&str])>) -> String {
    let ca = fs::read(s.ca_pem()).expect("reading the API server CA");
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    let mut user = format!("    token: {token}\n");
    if let Some((name, groups)) = who {
        user += &format!("    as: {}\n", serde_json::to_string(name).unwrap());
        user += &format!(
            "    as-groups: {}\n",
            serde_json::to_string(groups).unwrap()
        );
    }
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testkit\n  cluster:\n    server: {}\n    \
         certificate-authority-data: {ca}\nusers:\n- name: testkit\n  user:\n{user}contexts:\n\
         - name: testkit\n  context:\n    cluster: testkit\n    user: testkit\n\
         current-context: testkit\n",
        s.url
    )
}

/// The shared server: attached to when another test process of this run started it, else
/// started detached (with a watcher that stops it when the test runner exits).
fn shared_server() -> Result<KubeApiServer, String> {
    // Under nextest every test is a process whose parent is the runner; under `cargo test` the
    // tests are threads of this process.
    let owner = if std::env::var_os("NEXTEST_RUN_ID").is_some() {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::getppid() as u32 }
    } else {
        std::process::id()
    };
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let key = fnv1a(exe.to_string_lossy().as_bytes());
    let dir = std::env::temp_dir().join(format!("quarry-kube-{owner}-{key:016x}"));
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let lock = fs::File::create(dir.join("lock")).map_err(|e| format!("lock file: {e}"))?;
    // SAFETY: flock on a descriptor we own; released when `lock` is closed.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(format!("flock: {}", std::io::Error::last_os_error()));
    }
    let ready = dir.join("ready");
    if let Ok(text) = fs::read_to_string(&ready) {
        let mut lines = text.lines();
        let url = lines.next().unwrap_or_default().to_string();
        let alive = lines
            .filter_map(|l| l.parse::<i32>().ok())
            // SAFETY: signal 0 only checks that the PID exists.
            .all(|pid| unsafe { libc::kill(pid, 0) } == 0);
        if alive {
            return Ok(KubeApiServer {
                dir,
                url,
                owned: None,
            });
        }
        let _ = fs::remove_file(&ready);
    }
    let (url, processes) = launch(&dir, &Options::default(), true)?;
    let pids: Vec<u32> = processes.iter().map(Child::id).collect();
    // The watcher outlives this test process; it stops the apiserver, then etcd, by PID.
    let script = format!(
        "while kill -0 {owner} 2>/dev/null; do sleep 1; done; kill {api} 2>/dev/null; sleep 1; \
         kill {etcd} 2>/dev/null; sleep 3; kill -9 {api} {etcd} 2>/dev/null; rm -rf '{dir}'",
        api = pids[1],
        etcd = pids[0],
        dir = dir.display()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting the watcher: {e}"))?;
    let mut f = fs::File::create(&ready).map_err(|e| format!("writing ready: {e}"))?;
    writeln!(f, "{url}\n{}\n{}", pids[0], pids[1]).map_err(|e| format!("writing ready: {e}"))?;
    // The children are left running; their `Child` handles are forgotten on purpose.
    for p in processes {
        std::mem::forget(p);
    }
    Ok(KubeApiServer {
        dir,
        url,
        owned: None,
    })
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding a free port")
        .port()
}

/// Makes the PKI in `dir`, starts etcd and the apiserver, waits for `/readyz`: returns the URL
/// and the processes (etcd first). `detached`: in their own process group, to outlive us.
fn launch(dir: &Path, opts: &Options, detached: bool) -> Result<(String, Vec<Child>), String> {
    let bin = apiserver_binary()?;
    pki(dir)?;
    let mut last = String::new();
    for _ in 0..START_ATTEMPTS {
        let (client, peer, secure) = (free_port(), free_port(), free_port());
        let data = dir.join("etcd-data");
        let _ = fs::remove_dir_all(&data);
        let mut etcd = Command::new("etcd");
        etcd.arg("--data-dir")
            .arg(&data)
            .args(["--name", "testkit", "--unsafe-no-fsync"])
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=testkit=http://127.0.0.1:{peer}"))
            .arg("--listen-metrics-urls=")
            .stdin(Stdio::null())
            .stdout(log_file(dir, "etcd.log")?)
            .stderr(log_file(dir, "etcd.log")?);
        let d = |f: &str| dir.join(f).display().to_string();
        let mut api = Command::new(&bin);
        api.args([
            format!("--etcd-servers=http://127.0.0.1:{client}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={secure}"),
            format!("--tls-cert-file={}", d("server.pem")),
            format!("--tls-private-key-file={}", d("server.key")),
            format!("--client-ca-file={}", d("ca.pem")),
            format!("--service-account-key-file={}", d("sa.pub")),
            format!("--service-account-signing-key-file={}", d("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--token-auth-file={}", d("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
            format!("--requestheader-client-ca-file={}", d("front-proxy-ca.pem")),
            format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
            format!("--proxy-client-cert-file={}", d("front-proxy-client.pem")),
            format!("--proxy-client-key-file={}", d("front-proxy-client.key")),
        ])
        .args(&opts.extra_args)
        .stdin(Stdio::null())
        .stdout(log_file(dir, "kube-apiserver.log")?)
        .stderr(log_file(dir, "kube-apiserver.log")?);
        if detached {
            etcd.process_group(0);
            api.process_group(0);
        }
        let mut etcd = etcd.spawn().map_err(|e| format!("starting etcd: {e}"))?;
        let mut api = match api.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop(&mut etcd);
                return Err(format!("starting {}: {e}", bin.display()));
            }
        };
        let url = format!("https://127.0.0.1:{secure}");
        match wait_ready(dir, &url, &mut [&mut etcd, &mut api]) {
            Ok(()) => {
                write_kubeconfig(dir, &url)?;
                return Ok((url, vec![etcd, api]));
            }
            Err(e) => {
                stop(&mut api);
                stop(&mut etcd);
                last = e;
            }
        }
    }
    let log = fs::read_to_string(dir.join("kube-apiserver.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(15).collect();
    Err(format!(
        "{last}\nkube-apiserver.log (last lines, newest first):\n{}",
        tail.join("\n")
    ))
}

fn write_kubeconfig(dir: &Path, url: &str) -> Result<(), String> {
    let s = KubeApiServer {
        dir: dir.to_path_buf(),
        url: url.to_string(),
        owned: None,
    };
    fs::write(
        dir.join("kubeconfig"),
        kubeconfig_yaml(&s, ADMIN_TOKEN, None),
    )
    .map_err(|e| format!("writing the kubeconfig: {e}"))
}

fn log_file(dir: &Path, name: &str) -> Result<fs::File, String> {
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .map_err(|e| format!("opening {name}: {e}"))
}

/// Polls `/readyz` (with the admin token) until 200, or a process exits, or the timeout.
fn wait_ready(dir: &Path, url: &str, children: &mut [&mut Child]) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while Instant::now() < deadline {
        for c in children.iter_mut() {
            if let Ok(Some(st)) = c.try_wait() {
                return Err(format!("a process (pid {}) exited early: {st}", c.id()));
            }
        }
        let out = Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "2",
            ])
            .arg("--cacert")
            .arg(dir.join("ca.pem"))
            .args(["-H", &format!("Authorization: Bearer {ADMIN_TOKEN}")])
            .arg(format!("{url}/readyz"))
            .output()
            .map_err(|e| format!("running curl: {e}"))?;
        if out.stdout == b"200" {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("{url}/readyz not 200 within {READY_TIMEOUT:?}"))
}

/// CA, serving certificate, front-proxy CA and client certificate, service-account key pair and
/// the token file (only what is missing: a restarted shared server keeps its PKI).
fn pki(dir: &Path) -> Result<(), String> {
    if dir.join("tokens.csv").is_file() {
        return Ok(());
    }
    make_ca(dir, "ca", "Quarry testkit kube CA");
    make_ca(dir, "front-proxy-ca", "front-proxy-ca");
    signed_by(
        dir,
        "ca",
        "/CN=kube-apiserver",
        ("server.key", "server.pem"),
        "subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:kubernetes.default.svc\n\
         extendedKeyUsage = serverAuth\n",
    );
    signed_by(
        dir,
        "front-proxy-ca",
        &format!("/CN={FRONT_PROXY_CLIENT}"),
        ("front-proxy-client.key", "front-proxy-client.pem"),
        "extendedKeyUsage = clientAuth\n",
    );
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-out",
            "sa.key",
        ],
    );
    openssl(dir, &["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
    fs::write(
        dir.join("tokens.csv"),
        format!("{ADMIN_TOKEN},admin,admin-uid,system:masters\n"),
    )
    .map_err(|e| format!("writing tokens.csv: {e}"))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    #[tokio::test]
    async fn admin_impersonated_users_and_service_accounts_meet_rbac() {
        let Some(server) = KubeApiServer::shared() else {
            return;
        };
        let ns = server.namespace("testkit", &[]).await;
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("c".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let admin: Api<ConfigMap> = Api::namespaced(server.client(), &ns);
        admin.create(&PostParams::default(), &cm).await.unwrap();
        // Nobody else has any role: RBAC refuses both with 403.
        let alice: Api<ConfigMap> = Api::namespaced(server.client_as("alice", &["devs"]), &ns);
        let sa: Api<ConfigMap> =
            Api::namespaced(server.service_account_client(&ns, "robot").await, &ns);
        for api in [alice, sa] {
            match api.get("c").await {
                Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
                other => panic!("expected 403, got {other:?}"),
            }
        }
        assert!(server.kubeconfig().is_file());
    }

    #[tokio::test]
    async fn an_own_server_takes_extra_flags_and_stops_on_drop() {
        let opts = Options {
            extra_args: vec!["--feature-gates=CustomResourceValidationExpressions=true".into()],
        };
        let Some(server) = tokio::task::spawn_blocking(move || KubeApiServer::start(&opts))
            .await
            .unwrap()
        else {
            return;
        };
        let version = server.client().apiserver_version().await.unwrap();
        let minor: u32 = version.minor.trim_end_matches('+').parse().unwrap();
        assert!(version.major == "1" && minor >= 28, "{version:?}");
        let port: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
        drop(server);
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    }
}
