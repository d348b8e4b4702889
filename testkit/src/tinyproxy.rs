//! tinyproxy (Debian's `tinyproxy`), a real forward proxy, started on a free 127.0.0.1 port with
//! its own configuration and stopped on drop. It forwards plain HTTP requests and tunnels HTTPS
//! with `CONNECT` (to any port: the configuration has no `ConnectPort` line), and logs every
//! request line, so a test can see that a client really went through it.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::nginx::{free_port, on_path, stop_child};

const READY_TIMEOUT: Duration = Duration::from_secs(15);
const START_ATTEMPTS: usize = 5;

/// True when tinyproxy is installed (`.ci/run` installs it).
pub fn installed() -> bool {
    on_path("tinyproxy")
}

/// A running tinyproxy, stopped (TERM, wait, KILL) when dropped.
pub struct Tinyproxy {
    dir: TempDir,
    child: Child,
    port: u16,
}

impl Tinyproxy {
    /// Starts tinyproxy in the foreground on a free port and waits until it accepts connections.
    pub fn start() -> Tinyproxy {
        assert!(
            installed(),
            "testkit: tinyproxy is not installed (Debian package `tinyproxy`, which .ci/run installs)"
        );
        let dir = tempfile::Builder::new()
            .prefix("testkit-tinyproxy-")
            .tempdir()
            .unwrap();
        let mut last_err = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            let d = dir.path();
            std::fs::write(d.join("tinyproxy.conf"), render(d, port)).unwrap();
            let mut child = Command::new("tinyproxy")
                .arg("-d")
                .arg("-c")
                .arg(d.join("tinyproxy.conf"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("running tinyproxy");
            let deadline = Instant::now() + READY_TIMEOUT;
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    // most likely the port was taken between the probe and tinyproxy's bind
                    last_err = format!("tinyproxy exited with {status}: {}", read_log(d));
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Tinyproxy { dir, child, port };
                }
                if Instant::now() > deadline {
                    stop_child(&mut child);
                    last_err = format!("tinyproxy did not listen in time: {}", read_log(d));
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("testkit: {last_err}");
    }

    /// `http://127.0.0.1:PORT`, for `HTTP_PROXY` / `HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The request lines tinyproxy logged so far, e.g. `CONNECT 127.0.0.1:4433 HTTP/1.1`.
    pub fn requests(&self) -> Vec<String> {
        read_log(self.dir.path())
            .lines()
            .filter_map(|l| l.split_once("): ").map(|(_, rest)| rest))
            .filter(|rest| rest.contains(" HTTP/"))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

fn render(dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        "Port {port}\nListen 127.0.0.1\nTimeout 60\nLogFile \"{d}/tinyproxy.log\"\n\
         LogLevel Connect\nPidFile \"{d}/tinyproxy.pid\"\nMaxClients 16\nAllow 127.0.0.1\n"
    )
}

fn read_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("tinyproxy.log")).unwrap_or_default()
}
