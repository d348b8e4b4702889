//! Debian's `docker-registry` (distribution 2.8) started on 127.0.0.1 with a free port: plain,
//! TLS, htpasswd basic auth, token auth (with [`TokenService`], a bearer-token service of the
//! suite's own), or schema-1 compatibility; images pushed with `skopeo` from an OCI layout.
//! Stopped (by PID) on drop.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use tempfile::TempDir;

use crate::accept::AcceptLoop;
use crate::nginx::{free_port, stop_child};
use crate::tls::TestCa;

const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// True when `docker-registry` and `skopeo` are installed (scripts/setup.sh installs them).
pub fn installed() -> bool {
    ["docker-registry", "skopeo"]
        .iter()
        .all(|b| crate::nginx::on_path(b))
}

/// How to run the registry.
#[derive(Default)]
pub struct RegistryConfig<'a> {
    pub tls: Option<&'a TestCa>,
    /// htpasswd basic auth with this one user (bcrypt, as the registry requires).
    pub htpasswd: Option<(&'a str, &'a str)>,
    /// Token auth against this token service.
    pub token: Option<&'a TokenService>,
    /// Accept schema-1 manifests (`compatibility.schema1.enabled`).
    pub schema1: bool,
    /// The IPv4 address to listen on (None: 127.0.0.1), e.g. a test cluster's node address.
    pub address: Option<std::net::Ipv4Addr>,
}

pub struct Registry {
    child: Child,
    dir: TempDir,
    host: std::net::Ipv4Addr,
    port: u16,
    push_creds: Option<(String, String)>,
}

impl Registry {
    pub fn start(cfg: RegistryConfig<'_>) -> Registry {
        let dir = tempfile::Builder::new()
            .prefix("testkit-registry-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let mut push_creds = None;
        let mut auth = String::new();
        if let Some((user, pass)) = cfg.htpasswd {
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, pass])
                .output()
                .expect("running htpasswd (apache2-utils)");
            assert!(out.status.success(), "htpasswd failed");
            std::fs::write(d.join("htpasswd"), &out.stdout).unwrap();
            auth = format!(
                "auth:\n  htpasswd:\n    realm: testkit\n    path: {}\n",
                d.join("htpasswd").display()
            );
            push_creds = Some((user.to_string(), pass.to_string()));
        }
        if let Some(t) = cfg.token {
            auth = format!(
                "auth:\n  token:\n    realm: {}\n    service: testkit-registry\n    issuer: testkit\n    rootcertbundle: {}\n",
                t.realm(),
                t.cert_pem().display()
            );
            push_creds = Some((t.user.clone(), t.password.clone()));
        }
        let host = cfg.address.unwrap_or(std::net::Ipv4Addr::LOCALHOST);
        for attempt in 0.. {
            let port = free_port();
            let mut http = format!("http:\n  addr: {host}:{port}\n");
            if let Some(ca) = cfg.tls {
                http += &format!(
                    "  tls:\n    certificate: {}\n    key: {}\n",
                    ca.cert_pem().display(),
                    ca.key_pem().display()
                );
            }
            let compat = if cfg.schema1 {
                "compatibility:\n  schema1:\n    enabled: true\n"
            } else {
                ""
            };
            let config = format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n{http}{auth}{compat}",
                d.join("data").display()
            );
            std::fs::write(d.join("config.yml"), config).unwrap();
            let log = std::fs::File::create(d.join("registry.log")).unwrap();
            let mut child = Command::new("docker-registry")
                .arg("serve")
                .arg(d.join("config.yml"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("running docker-registry (Debian package docker-registry)");
            match wait_listening_on(&mut child, host, port) {
                Ok(()) => {
                    return Registry {
                        child,
                        dir,
                        host,
                        port,
                        push_creds,
                    };
                }
                Err(exited) => {
                    stop_child(&mut child);
                    let log = std::fs::read_to_string(d.join("registry.log")).unwrap_or_default();
                    assert!(
                        exited && log.contains("address already in use") && attempt < 5,
                        "docker-registry did not start: {log}"
                    );
                }
            }
        }
        unreachable!()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `docker://ADDRESS:PORT/NAME`.
    pub fn image(&self, name: &str) -> String {
        format!("docker://{}:{}/{name}", self.host, self.port)
    }

    /// Pushes `tag` of the OCI layout to `dest` (`NAME:TAG`) with skopeo. `format`: `None`
    /// (keep OCI), `Some("v2s2")` (Docker schema 2) or `Some("v2s1")`; `all`: copy every image
    /// of an index (else skopeo picks the host's platform).
    pub fn push(&self, layout: &Path, tag: &str, dest: &str, format: Option<&str>, all: bool) {
        let mut c = Command::new("skopeo");
        c.args(["--insecure-policy", "copy", "-q", "--dest-tls-verify=false"]);
        if let Some(f) = format {
            c.args(["--format", f]);
        }
        if all {
            c.arg("--all");
        }
        if let Some((u, p)) = &self.push_creds {
            c.arg("--dest-creds").arg(format!("{u}:{p}"));
        }
        c.arg(format!("oci:{}:{tag}", layout.display()));
        c.arg(format!("docker://{}:{}/{dest}", self.host, self.port));
        let out = c.output().expect("running skopeo (Debian package skopeo)");
        assert!(
            out.status.success(),
            "skopeo push of {tag} to {dest} failed: {}\nregistry log: {}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// The file in the registry's storage that holds blob `digest` (`sha256:HEX`).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The largest blob file in the registry's storage (the layer, in a one-layer image) and
    /// its digest.
    pub fn largest_blob(&self) -> (PathBuf, String) {
        let root = self.dir.path().join("data/docker/registry/v2/blobs/sha256");
        let mut best: Option<(u64, PathBuf, String)> = None;
        for prefix in std::fs::read_dir(&root).expect("registry blob storage") {
            for blob in std::fs::read_dir(prefix.unwrap().path()).unwrap() {
                let blob = blob.unwrap();
                let data = blob.path().join("data");
                let len = std::fs::metadata(&data).map(|m| m.len()).unwrap_or(0);
                if best.as_ref().is_none_or(|(l, _, _)| len > *l) {
                    let digest = format!("sha256:{}", blob.file_name().to_string_lossy());
                    best = Some((len, data, digest));
                }
            }
        }
        let (_, path, digest) = best.expect("no blobs in the registry");
        (path, digest)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

/// Waits until `port` accepts connections; `Err(true)` when the child exited first.
pub fn wait_listening(child: &mut Child, port: u16) -> Result<(), bool> {
    wait_listening_on(child, std::net::Ipv4Addr::LOCALHOST, port)
}

/// [`wait_listening`] on `host`.
pub fn wait_listening_on(
    child: &mut Child,
    host: std::net::Ipv4Addr,
    port: u16,
) -> Result<(), bool> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let addr = SocketAddr::from((host, port));
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return Err(true);
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A bearer-token service for the registry's token auth: `GET /token?service=..&scope=..` with
/// the right basic credentials gets a JWT (RS256, signed by `openssl dgst` with a throw-away RSA
/// key whose self-signed certificate travels in `x5c` and is the registry's root bundle) granting
/// the actions asked for; anything else gets 401. Requests are recorded.
pub struct TokenService {
    pub user: String,
    pub password: String,
    port: u16,
    dir: TempDir,
    requests: Arc<Mutex<Vec<String>>>,
    _serving: AcceptLoop,
}

impl TokenService {
    pub fn start(user: &str, password: &str) -> TokenService {
        Self::start_with_lifetime(user, password, 600)
    }

    /// Tokens that expire `secs` seconds after they are issued (may be negative: the registry
    /// accepts tokens up to 60 s past their expiry, for clock skew).
    pub fn start_with_lifetime(user: &str, password: &str, secs: i64) -> TokenService {
        let dir = tempfile::Builder::new()
            .prefix("testkit-token-")
            .tempdir()
            .unwrap();
        let d = dir.path().to_path_buf();
        let ok = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "key.pem",
                "-out",
                "cert.pem",
                "-days",
                "2",
                "-subj",
                "/CN=testkit token signer",
            ])
            .current_dir(&d)
            .output()
            .expect("running openssl");
        assert!(ok.status.success(), "openssl req failed");
        let der = Command::new("openssl")
            .args(["x509", "-in", "cert.pem", "-outform", "DER"])
            .current_dir(&d)
            .output()
            .unwrap()
            .stdout;
        let x5c = base64::engine::general_purpose::STANDARD.encode(der);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let r = requests.clone();
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        );
        let serving = AcceptLoop::start(listener, move |conn| {
            serve_token(conn, &d, &x5c, &expected, secs, &r);
        });
        TokenService {
            user: user.into(),
            password: password.into(),
            port,
            dir,
            requests,
            _serving: serving,
        }
    }

    pub fn realm(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }

    pub fn cert_pem(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    /// Request lines (`GET /token?... HTTP/1.1`) so far, each followed by ` auth=yes|no`.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve_token(
    conn: TcpStream,
    dir: &Path,
    x5c: &str,
    expected: &str,
    lifetime: i64,
    log: &Mutex<Vec<String>>,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(&conn);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut authorized = false;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("authorization")
        {
            authorized = v.trim() == expected;
        }
    }
    log.lock().unwrap().push(format!(
        "{} auth={}",
        line.trim(),
        if authorized { "yes" } else { "no" }
    ));
    let target = line.split_whitespace().nth(1).unwrap_or("");
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
    let mut service = String::new();
    let mut access = Vec::new();
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "service" => service = v,
            "scope" => {
                let parts: Vec<&str> = v.splitn(3, ':').collect();
                if let [kind, name, actions] = parts.as_slice() {
                    let actions: Vec<String> =
                        actions.split(',').map(|a| format!("\"{a}\"")).collect();
                    access.push(format!(
                        r#"{{"type":"{kind}","name":"{name}","actions":[{}]}}"#,
                        actions.join(",")
                    ));
                }
            }
            _ => {}
        }
    }
    let mut conn = conn;
    if !authorized {
        let _ = conn.write_all(
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        return;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let header = format!(r#"{{"typ":"JWT","alg":"RS256","x5c":["{x5c}"]}}"#);
    let claims = format!(
        r#"{{"iss":"testkit","sub":"testkit","aud":"{service}","exp":{},"nbf":{},"iat":{now},"jti":"{now}","access":[{}]}}"#,
        now as i64 + lifetime,
        now - 60,
        access.join(",")
    );
    let signing_input = format!("{}.{}", b64(header.as_bytes()), b64(claims.as_bytes()));
    let mut openssl = Command::new("openssl")
        .args(["dgst", "-sha256", "-sign", "key.pem"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running openssl");
    openssl
        .stdin
        .take()
        .unwrap()
        .write_all(signing_input.as_bytes())
        .unwrap();
    let sig = openssl.wait_with_output().unwrap().stdout;
    let token = format!("{signing_input}.{}", b64(&sig));
    let body = format!(r#"{{"token":"{token}","expires_in":{lifetime}}}"#);
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

pub(crate) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
