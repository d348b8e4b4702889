//! Google Cloud Storage for the GCS source tests: PyPI's `gcp-storage-emulator` started on
//! 127.0.0.1 (or a given address) with a free port and one bucket, objects uploaded with
//! `curl -X PUT` on its XML path; and [`TokenEndpoint`], an OAuth 2 token endpoint of the suite's
//! own that holds a service account's RSA key (made with `openssl`), writes that account's key
//! file and grants tokens only for assertions whose RS256 signature `openssl` verifies with the
//! public key and whose claims are what Google checks. Both stopped on drop.
//!
//! The emulator serves an object at `/BUCKET/OBJECT` (the XML API's path) with `Range` honoured
//! (206 and `Content-Range`), but sends neither `ETag` nor `Last-Modified`, and ignores
//! `Authorization`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use tempfile::TempDir;

use crate::accept::AcceptLoop;
use crate::nginx::stop_child;
use crate::registry::{percent_decode, wait_listening_on};

pub const BUCKET: &str = "quarry-images";
/// The service account of [`TokenEndpoint`]'s key file.
pub const CLIENT_EMAIL: &str = "importer@quarry-test.iam.gserviceaccount.com";
pub const PRIVATE_KEY_ID: &str = "0123456789abcdef0123456789abcdef01234567";
pub const READ_ONLY_SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_only";
pub const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// True when `gcp-storage-emulator` runs (scripts/setup.sh pip-installs it); a pyenv shim on
/// the PATH without the package behind it does not count.
pub fn installed() -> bool {
    Command::new("gcp-storage-emulator")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A running emulator with [`BUCKET`].
pub struct Emulator {
    child: Child,
    host: Ipv4Addr,
    port: u16,
}

impl Emulator {
    /// On 127.0.0.1.
    pub fn start() -> Emulator {
        Emulator::start_on(Ipv4Addr::LOCALHOST)
    }

    /// On `host` (a test cluster's node address, where pods reach it).
    pub fn start_on(host: Ipv4Addr) -> Emulator {
        for attempt in 0.. {
            let port = TcpListener::bind((host, 0))
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let mut child = Command::new("gcp-storage-emulator")
                .args([
                    "start",
                    "--in-memory",
                    "--quiet",
                    "--default-bucket",
                    BUCKET,
                ])
                .arg(format!("--host={host}"))
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("running gcp-storage-emulator (pip install gcp-storage-emulator)");
            // The bucket is made before the port opens. A port taken meanwhile makes the
            // emulator exit: start again on another.
            if wait_listening_on(&mut child, host, port).is_ok() {
                return Emulator { child, host, port };
            }
            stop_child(&mut child);
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            assert!(attempt < 3, "gcp-storage-emulator did not start: {err}");
        }
        unreachable!()
    }

    /// `HOST:PORT`, as `STORAGE_EMULATOR_HOST` takes it.
    pub fn host_port(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// `http://HOST:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.host_port())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Uploads `file` as `BUCKET/object` (a plain name: `/` allowed, nothing to escape).
    pub fn put(&self, file: &Path, object: &str) {
        let ok = Command::new("curl")
            .args(["-sS", "-f", "-X", "PUT", "-H", "Expect:", "--data-binary"])
            .arg(format!("@{}", file.display()))
            .arg(format!("{}/{BUCKET}/{object}", self.endpoint()))
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "uploading {object} to the GCS emulator failed");
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

/// How the token endpoint answers.
#[derive(Clone, Debug)]
pub enum Grant {
    /// Verify each assertion; grant tokens (`token-1`, `token-2`, ...) of this lifetime in
    /// seconds, refuse bad assertions with 400 `invalid_grant` naming what is wrong.
    Verify { expires_in: u64 },
    /// Refuse every request with this status and OAuth 2 error body.
    Refuse { status: u16, body: String },
}

/// What the endpoint made of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRequest {
    /// The `assertion` form field.
    pub assertion: String,
    /// The token granted, or why the assertion was refused.
    pub outcome: Result<String, String>,
}

/// The OAuth 2 token endpoint of a service account (see the module docs).
pub struct TokenEndpoint {
    dir: TempDir,
    host: Ipv4Addr,
    port: u16,
    requests: Arc<Mutex<Vec<TokenRequest>>>,
    _serving: AcceptLoop,
}

impl TokenEndpoint {
    /// On 127.0.0.1.
    pub fn start(grant: Grant) -> TokenEndpoint {
        TokenEndpoint::start_on(Ipv4Addr::LOCALHOST, grant)
    }

    /// On `host`, with a fresh RSA key pair.
    pub fn start_on(host: Ipv4Addr, grant: Grant) -> TokenEndpoint {
        let dir = tempfile::Builder::new()
            .prefix("testkit-gcs-token-")
            .tempdir()
            .unwrap();
        for args in [
            &["genpkey", "-algorithm", "RSA", "-out", "key.pem"][..],
            &["pkey", "-in", "key.pem", "-pubout", "-out", "pub.pem"],
        ] {
            let ok = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "openssl {args:?} failed");
        }
        let listener = TcpListener::bind((host, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let served = Served {
            uri: format!("http://{host}:{port}/token"),
            public_key: dir.path().join("pub.pem"),
            grant,
            granted: AtomicUsize::new(0),
            requests: requests.clone(),
        };
        TokenEndpoint {
            dir,
            host,
            port,
            requests,
            _serving: AcceptLoop::start(listener, move |conn| served.answer(conn)),
        }
    }

    /// `http://HOST:PORT/token`, the key file's `token_uri`.
    pub fn uri(&self) -> String {
        format!("http://{}:{}/token", self.host, self.port)
    }

    /// The service account's private key (PKCS#8 PEM).
    pub fn private_key_pem(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("key.pem")).unwrap()
    }

    /// The key file Google would issue for the account, its `token_uri` this endpoint.
    pub fn key_json(&self) -> String {
        serde_json::json!({
            "type": "service_account",
            "project_id": "quarry-test",
            "private_key_id": PRIVATE_KEY_ID,
            "private_key": self.private_key_pem(),
            "client_email": CLIENT_EMAIL,
            "client_id": "100000000000000000001",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": self.uri(),
        })
        .to_string()
    }

    /// Writes [`TokenEndpoint::key_json`] to `dir/credentials.json`.
    pub fn write_key_file(&self, dir: &Path) -> PathBuf {
        let path = dir.join("credentials.json");
        std::fs::write(&path, self.key_json()).unwrap();
        path
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<TokenRequest> {
        self.requests.lock().unwrap().clone()
    }
}

/// The endpoint's side of the connection.
struct Served {
    uri: String,
    public_key: PathBuf,
    grant: Grant,
    granted: AtomicUsize,
    requests: Arc<Mutex<Vec<TokenRequest>>>,
}

impl Served {
    fn answer(&self, conn: TcpStream) {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let Some(form) = read_form_post(&conn) else {
            return;
        };
        let field = |name: &str| {
            form.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let assertion = field("assertion");
        let (status, body, outcome) = match &self.grant {
            Grant::Refuse { status, body } => (*status, body.clone(), Err(body.clone())),
            Grant::Verify { expires_in } => {
                let checked = if field("grant_type") == JWT_BEARER_GRANT {
                    self.check(&assertion)
                } else {
                    Err(format!("grant_type {:?}", field("grant_type")))
                };
                match checked {
                    Ok(()) => {
                        let n = self.granted.fetch_add(1, Ordering::SeqCst) + 1;
                        let token = format!("token-{n}");
                        let body = serde_json::json!({"access_token": token,
                            "expires_in": expires_in, "token_type": "Bearer"});
                        (200, body.to_string(), Ok(token))
                    }
                    Err(why) => {
                        let body = serde_json::json!({"error": "invalid_grant",
                            "error_description": why});
                        (400, body.to_string(), Err(why))
                    }
                }
            }
        };
        self.requests
            .lock()
            .unwrap()
            .push(TokenRequest { assertion, outcome });
        let mut conn = conn;
        let _ = write!(
            conn,
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }

    /// What Google checks of an assertion: the RS256 signature (by `openssl`), the header, and
    /// the claims `iss`, `aud`, `scope`, `iat` (now, give or take a minute) and `exp` (an hour on).
    fn check(&self, jwt: &str) -> Result<(), String> {
        let parts: Vec<&str> = jwt.split('.').collect();
        let [header, claims, signature] = parts[..] else {
            return Err("the assertion is not a compact JWT".into());
        };
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let json = |part: &str| -> Result<serde_json::Value, String> {
            let bytes = b64.decode(part).map_err(|e| format!("base64: {e}"))?;
            serde_json::from_slice(&bytes).map_err(|e| format!("JSON: {e}"))
        };
        let expected_header =
            serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": PRIVATE_KEY_ID});
        if json(header)? != expected_header {
            return Err(format!("header {}", json(header)?));
        }
        let sig = b64
            .decode(signature)
            .map_err(|e| format!("signature: {e}"))?;
        if !openssl_verifies(
            &self.public_key,
            &jwt[..header.len() + 1 + claims.len()],
            &sig,
        ) {
            return Err("Invalid JWT Signature.".into());
        }
        let c = json(claims)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let iat = c["iat"].as_i64().unwrap_or_default();
        let checks = [
            (c["iss"] == CLIENT_EMAIL, "iss"),
            (c["aud"] == self.uri.as_str(), "aud"),
            (c["scope"] == READ_ONLY_SCOPE, "scope"),
            ((iat - now).abs() <= 60, "iat"),
            (c["exp"].as_i64() == Some(iat + 3600), "exp"),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, claim)) => Err(format!("claim {claim} is wrong in {c}")),
            None => Ok(()),
        }
    }
}

/// A POST's form fields (None when the request is unreadable).
fn read_form_post(conn: &TcpStream) -> Option<Vec<(String, String)>> {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut length = 0;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let body = String::from_utf8(body).ok()?;
    Some(
        body.split('&')
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (percent_decode(k), percent_decode(v))
            })
            .collect(),
    )
}

/// Whether `signature` is `input`'s RSASSA-PKCS1-v1_5 SHA-256 signature under `public_key`.
fn openssl_verifies(public_key: &Path, input: &str, signature: &[u8]) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let (data, sig) = (dir.path().join("input"), dir.path().join("sig"));
    std::fs::write(&data, input).unwrap();
    std::fs::write(&sig, signature).unwrap();
    Command::new("openssl")
        .args(["dgst", "-sha256", "-verify"])
        .arg(public_key)
        .arg("-signature")
        .arg(&sig)
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
