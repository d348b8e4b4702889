//! nginx started on a free 127.0.0.1 port with its own configuration, stopped on drop.
//!
//! Each [`Nginx`] writes `nginx.conf` into its own temporary directory, with the pid file, the
//! error and access logs and every temp path inside it, and runs `nginx -e ERRLOG -p DIR -c
//! DIR/nginx.conf` in the foreground (`daemon off; master_process off;`: one process, our child,
//! so stopping it by PID stops everything). Readiness is the pid file, which nginx writes only
//! after it has bound its listening socket, followed by a TCP connect. A port lost to a bind race
//! (another process took it between our probe and nginx's bind) is retried with a new port.
//!
//! Served files: everything under [`NginxConfig::root`], with nginx's own strong `ETag`,
//! `Last-Modified`, `Accept-Ranges`, 206 / 416 / `If-Range` handling (unless `ranges` is off,
//! which sets `max_ranges 0`).

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::tls::TestCa;

/// How to configure the server.
#[derive(Clone, Default)]
pub struct NginxConfig<'a> {
    /// Directory served at `/`.
    pub root: PathBuf,
    /// Byte ranges on (nginx's default) or off (`max_ranges 0`: always 200 with the full body).
    pub ranges: bool,
    /// Serve HTTPS (and HTTP/2 by ALPN) with the CA's server certificate instead of plain HTTP.
    pub tls: Option<&'a TestCa>,
    /// Require HTTP basic authentication with this user and password (made with `htpasswd -bc`).
    pub basic_auth: Option<(String, String)>,
    /// `(from, to)`: exact path `from` answers `302 Location: to` (`to` may be absolute).
    pub redirects: Vec<(String, String)>,
    /// `limit_rate` in bytes per second for response bodies (slow-server tests).
    pub limit_rate: Option<u64>,
    /// Extra directives pasted into the `server { }` block as they are.
    pub extra: String,
    /// The IPv4 address to listen on (None: 127.0.0.1), e.g. a test cluster's node address.
    pub address: Option<std::net::Ipv4Addr>,
}

/// A running nginx. Stopped (TERM, wait, KILL) when dropped.
pub struct Nginx {
    dir: TempDir,
    child: Child,
    host: std::net::Ipv4Addr,
    port: u16,
    scheme: &'static str,
}

const START_ATTEMPTS: usize = 5;
const READY_TIMEOUT: Duration = Duration::from_secs(15);

impl Nginx {
    /// Writes the configuration, starts nginx on a free port and waits until it answers.
    ///
    /// Panics with a clear message when nginx is not installed or does not start.
    pub fn start(cfg: NginxConfig<'_>) -> Nginx {
        check_installed("nginx", "nginx-light (or nginx)");
        let dir = tempfile::Builder::new()
            .prefix("testkit-nginx-")
            .tempdir()
            .expect("creating a temp dir for nginx");
        if let Some((user, pass)) = &cfg.basic_auth {
            check_installed("htpasswd", "apache2-utils");
            let out = Command::new("htpasswd")
                .arg("-bc")
                .arg(dir.path().join("htpasswd"))
                .arg(user)
                .arg(pass)
                .output()
                .expect("running htpasswd");
            assert!(
                out.status.success(),
                "testkit: htpasswd failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut last_err = String::new();
        let host = cfg.address.unwrap_or(std::net::Ipv4Addr::LOCALHOST);
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            std::fs::write(
                dir.path().join("nginx.conf"),
                render(&cfg, dir.path(), host, port),
            )
            .expect("writing nginx.conf");
            let _ = std::fs::remove_file(dir.path().join("nginx.pid"));
            match launch(dir.path(), host, port) {
                Ok(child) => {
                    return Nginx {
                        dir,
                        child,
                        host,
                        port,
                        scheme: if cfg.tls.is_some() { "https" } else { "http" },
                    };
                }
                Err((bind_race, msg)) => {
                    last_err = msg;
                    if !bind_race {
                        break;
                    }
                }
            }
        }
        panic!("testkit: nginx did not start: {last_err}");
    }

    /// `http(s)://ADDRESS:PORT` + `path` (which should start with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}://{}:{}{}", self.scheme, self.host, self.port, path)
    }

    /// The same URL with `localhost` as the host name.
    pub fn url_localhost(&self, path: &str) -> String {
        format!("{}://localhost:{}{}", self.scheme, self.port, path)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The process id of the nginx process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The directory holding nginx.conf, logs and temp paths.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The error log so far (for assertion messages).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// The access log so far.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

/// True when `bin` is on the PATH (or in /usr/sbin, /sbin).
pub(crate) fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
                .any(|p| p.join(bin).is_file())
        })
        .unwrap_or(false)
}

fn check_installed(bin: &str, package: &str) {
    let found = on_path(bin);
    assert!(
        found,
        "testkit: `{bin}` is not installed; the HTTP tests need it (Debian package `{package}`, \
         which .ci/run installs)"
    );
}

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

fn render(cfg: &NginxConfig<'_>, dir: &Path, host: std::net::Ipv4Addr, port: u16) -> String {
    let d = dir.display();
    let mut server = String::new();
    match cfg.tls {
        Some(ca) => {
            server += &format!("listen {host}:{port} ssl http2;\n");
            server += &format!("ssl_certificate {};\n", ca.cert_pem().display());
            server += &format!("ssl_certificate_key {};\n", ca.key_pem().display());
        }
        None => server += &format!("listen {host}:{port};\n"),
    }
    server += "server_name localhost;\n";
    server += &format!("root {};\n", cfg.root.display());
    if !cfg.ranges {
        server += "max_ranges 0;\n";
    }
    if cfg.basic_auth.is_some() {
        server += "auth_basic \"testkit\";\n";
        server += &format!("auth_basic_user_file {d}/htpasswd;\n");
    }
    if let Some(rate) = cfg.limit_rate {
        server += &format!("limit_rate {rate};\n");
    }
    for (from, to) in &cfg.redirects {
        server += &format!("location = {from} {{ return 302 {to}; }}\n");
    }
    server += &cfg.extra;
    format!(
        "daemon off;\n\
         master_process off;\n\
         worker_processes 1;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/error.log info;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n\
         default_type application/octet-stream;\n\
         access_log {d}/access.log;\n\
         client_body_temp_path {d}/client_body;\n\
         proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n\
         uwsgi_temp_path {d}/uwsgi;\n\
         scgi_temp_path {d}/scgi;\n\
         sendfile on;\n\
         keepalive_timeout 30;\n\
         server {{\n{server}}}\n\
         }}\n"
    )
}

/// Starts nginx and waits for readiness. `Err((bind_race, message))`.
fn launch(dir: &Path, host: std::net::Ipv4Addr, port: u16) -> Result<Child, (bool, String)> {
    let errlog = dir.join("startup.log");
    let mut child = Command::new("nginx")
        .arg("-e")
        .arg(&errlog)
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| (false, format!("cannot run nginx: {e}")))?;
    let pid_file = dir.join("nginx.pid");
    let deadline = Instant::now() + READY_TIMEOUT;
    let logs = |child: &mut Child| {
        let mut stderr = String::new();
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut stderr);
        }
        let log = std::fs::read_to_string(&errlog).unwrap_or_default()
            + &std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        format!("{stderr}{log}")
    };
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let msg = logs(&mut child);
            let race = msg.contains("Address already in use");
            return Err((race, format!("nginx exited with {status}: {msg}")));
        }
        let pid_written = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            == Some(child.id());
        if pid_written
            && TcpStream::connect_timeout(&SocketAddr::from((host, port)), Duration::from_secs(1))
                .is_ok()
        {
            return Ok(child);
        }
        if Instant::now() > deadline {
            stop_child(&mut child);
            let msg = logs(&mut child);
            let race = msg.contains("Address already in use");
            return Err((
                race,
                format!("nginx not ready after {READY_TIMEOUT:?}: {msg}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// TERM, wait up to 5 s, then KILL; always reaps the child.
pub fn stop_child(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let pid = child.id() as libc::pid_t;
    // SAFETY: plain kill(2) on our own child's pid; the child is not reaped yet, so the pid is
    // still ours.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn get(port: u16, path: &str, extra: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{extra}\r\n"
        )
        .unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn serves_files_with_ranges_and_stops_on_drop() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f.txt"), "0123456789").unwrap();
        let nginx = Nginx::start(NginxConfig {
            root: root.path().into(),
            ranges: true,
            redirects: vec![("/old".into(), "/f.txt".into())],
            ..Default::default()
        });
        let r = get(nginx.port(), "/f.txt", "");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(r.ends_with("0123456789"), "{r}");
        let r = get(nginx.port(), "/f.txt", "Range: bytes=4-\r\n");
        assert!(r.starts_with("HTTP/1.1 206"), "{r}");
        assert!(r.contains("Content-Range: bytes 4-9/10"), "{r}");
        assert!(r.ends_with("456789"), "{r}");
        let r = get(nginx.port(), "/old", "");
        assert!(r.starts_with("HTTP/1.1 302"), "{r}");
        let pid = nginx.pid();
        drop(nginx);
        // SAFETY: signal 0 only checks whether the pid exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
        assert!(!alive, "nginx {pid} still running after drop");
    }

    #[test]
    fn ranges_off_and_basic_auth() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f.txt"), "0123456789").unwrap();
        let nginx = Nginx::start(NginxConfig {
            root: root.path().into(),
            ranges: false,
            basic_auth: Some(("u".into(), "p".into())),
            ..Default::default()
        });
        let r = get(nginx.port(), "/f.txt", "");
        assert!(r.starts_with("HTTP/1.1 401"), "{r}");
        // "u:p" in base64.
        let r = get(
            nginx.port(),
            "/f.txt",
            "Authorization: Basic dTpw\r\nRange: bytes=4-\r\n",
        );
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(r.ends_with("0123456789"), "{r}");
    }

    #[test]
    fn https_with_the_test_ca() {
        let ca = TestCa::new();
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f.txt"), "secure").unwrap();
        let nginx = Nginx::start(NginxConfig {
            root: root.path().into(),
            ranges: true,
            tls: Some(&ca),
            ..Default::default()
        });
        let out = Command::new("curl")
            .arg("-sS")
            .arg("--max-time")
            .arg("10")
            .arg("--cacert")
            .arg(ca.ca_pem())
            .arg(nginx.url("/f.txt"))
            .output()
            .expect("running curl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"secure");
    }
}
