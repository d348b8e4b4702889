//! `quarry upload`: what `virtctl image-upload` does, plus resume. It probes the async path with
//! `HEAD` (200 means async, else the sync path), then `POST`s the file with its exact
//! `Content-Length` and a bearer token. When the connection drops, it asks the server (through
//! the proxy, with the same token) how much it holds (`HEAD` → `Upload-Offset`) and sends only the
//! rest with `Upload-Offset: N`, instead of starting over as virtctl does. Only 200 is success.
//! With a checksum, the sync path is used so that the server's verdict comes back.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use std::io::{Read as _, Seek as _};

use bytes::Bytes;
use futures_util::{StreamExt as _, stream};
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};

use crate::error::{Error, Result};
use crate::{UPLOAD_CHECKSUM, UPLOAD_OFFSET, UPLOAD_STATE};
use importer::error::chain;

const CHUNK: usize = 1 << 20;
/// Chunks read ahead of the connection.
const READ_AHEAD: usize = 4;
/// How many times (every 250 ms) a busy server is asked again before starting over.
const BUSY_PROBES: u32 = 120;

/// One upload, as asked for.
#[derive(Debug, Clone)]
pub struct UploadRequest {
    pub file: PathBuf,
    /// The proxy's base URL (the upload paths are appended).
    pub url: String,
    pub token: String,
    pub ca_certs: Vec<PathBuf>,
    pub insecure: bool,
    /// Resume from the server's offset after a dropped connection (else start over).
    pub resume: bool,
    /// Attempts after the first that may follow a failure.
    pub retries: u32,
    /// `ALG:HEX` of the file, checked by the server.
    pub checksum: Option<String>,
}

/// What an upload did, printed by `quarry upload --json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UploadReport {
    pub file: String,
    pub url: String,
    pub asynchronous: bool,
    /// The file's length.
    pub bytes: u64,
    /// Body bytes sent over all attempts (more than `bytes` only after an interruption).
    pub bytes_sent: u64,
    pub attempts: u32,
    /// Offsets later attempts started from.
    pub resumed_from: Vec<u64>,
    pub duration_seconds: f64,
}

impl UploadReport {
    /// The one-line summary `quarry upload` prints without `--json`.
    pub fn summary(&self) -> String {
        format!(
            "uploaded {} ({} bytes, {} sent in {} attempt(s)) in {:.2}s",
            self.file, self.bytes, self.bytes_sent, self.attempts, self.duration_seconds
        )
    }
}

/// Counters a progress bar can follow.
#[derive(Debug, Default)]
pub struct Counters {
    /// The file's length.
    pub total: AtomicU64,
    /// How far into the file the current attempt has sent.
    pub position: AtomicU64,
    /// Every body byte sent.
    pub sent: AtomicU64,
}

/// How one attempt ended.
enum Attempt {
    Done,
    /// The connection failed: find out where to continue.
    Dropped(String),
    /// The server named the offset to continue from (416), or is still busy with the broken
    /// connection (503).
    Retry {
        offset: Option<u64>,
        why: String,
    },
}

/// Runs the upload; `counters` follow its progress.
pub async fn upload(req: &UploadRequest, counters: Arc<Counters>) -> Result<UploadReport> {
    let started = Instant::now();
    let len = tokio::fs::metadata(&req.file)
        .await
        .map_err(|e| Error::io(format!("reading {}", req.file.display()), e))?
        .len();
    counters.total.store(len, Ordering::Relaxed);
    let client = netkit::client_builder(&netkit::HttpOptions {
        ca_certs: req.ca_certs.clone(),
        insecure: req.insecure,
        ..Default::default()
    })?
    .user_agent(concat!("quarry-upload/", env!("CARGO_PKG_VERSION")))
    .build()
    .map_err(|e| Error::InvalidInput(format!("configuring the HTTP client: {}", chain(&e))))?;
    let base = req.url.trim_end_matches('/');
    let probe_url = format!("{base}/v1beta1/upload-async");
    let bearer = format!("Bearer {}", req.token);

    // An async answer comes before the server has hashed the last byte: with a checksum to
    // verify, wait for the verdict on the sync path.
    let asynchronous = probe(&client, &probe_url, &bearer).await?.status == StatusCode::OK
        && req.checksum.is_none();
    let url = if asynchronous {
        probe_url.clone()
    } else {
        format!("{base}/v1beta1/upload")
    };
    let mut offset = 0u64;
    let mut attempts = 0u32;
    let mut resumed_from = Vec::new();
    loop {
        attempts += 1;
        if offset > 0 {
            resumed_from.push(offset);
        }
        let outcome = send(&client, &url, &bearer, req, offset, len, &counters).await?;
        let (next, why) = match outcome {
            Attempt::Done => break,
            Attempt::Retry { offset, why } => (offset, why),
            Attempt::Dropped(why) => (None, why),
        };
        if attempts > req.retries {
            return Err(Error::Unavailable(format!(
                "giving up after {attempts} attempts: {why}"
            )));
        }
        tokio::time::sleep(backoff(attempts)).await;
        offset = match next {
            Some(o) if req.resume => o.min(len),
            _ if req.resume => held_offset(&client, &probe_url, &bearer).await.min(len),
            _ => 0,
        };
        tracing::warn!(cause = %why, offset, "upload attempt failed; trying again");
    }
    Ok(UploadReport {
        file: req.file.display().to_string(),
        url,
        asynchronous,
        bytes: len,
        bytes_sent: counters.sent.load(Ordering::Relaxed),
        attempts,
        resumed_from,
        duration_seconds: started.elapsed().as_secs_f64(),
    })
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(250u64 << attempt.min(5))
}

/// What `HEAD` on the async path tells.
struct Probe {
    /// 200 means the async path exists.
    status: StatusCode,
    /// `Upload-Offset`: the bytes of an interrupted upload the server holds.
    held: Option<u64>,
    /// `Upload-State` (Quarry's servers only).
    state: Option<String>,
}

async fn probe(client: &reqwest::Client, url: &str, bearer: &str) -> Result<Probe> {
    let resp = client
        .head(url)
        .header(AUTHORIZATION, bearer)
        .send()
        .await
        .map_err(|e| Error::Unavailable(format!("HEAD {url}: {}", chain(&e))))?;
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    match resp.status() {
        StatusCode::BAD_REQUEST | StatusCode::UNAUTHORIZED => {
            Err(refused_probe(client, url, bearer, resp.status()).await)
        }
        status => Ok(Probe {
            status,
            held: header(UPLOAD_OFFSET).and_then(|v| v.parse().ok()),
            state: header(UPLOAD_STATE),
        }),
    }
}

/// Where to continue after a dropped connection: the server's offset once it holds the upload.
/// While it is still `busy` (it has not yet noticed the broken connection), wait for it rather
/// than send the image again; anything else means starting over.
async fn held_offset(client: &reqwest::Client, url: &str, bearer: &str) -> u64 {
    for _ in 0..BUSY_PROBES {
        match probe(client, url, bearer).await {
            Ok(Probe {
                held: Some(offset), ..
            }) => return offset,
            Ok(Probe { state: Some(s), .. }) if s == "busy" => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            _ => return 0,
        }
    }
    0
}

/// The token was refused: a `HEAD` answer has no body, so the reason is asked for with an
/// empty `POST` to the same path (refused the same way, before anything is written).
async fn refused_probe(
    client: &reqwest::Client,
    url: &str,
    bearer: &str,
    status: StatusCode,
) -> Error {
    let post = client
        .post(url)
        .header(AUTHORIZATION, bearer)
        .header(CONTENT_LENGTH, 0)
        .send()
        .await;
    match post {
        Ok(resp) if resp.status() == status => refused(resp).await,
        _ => refusal(status.as_u16(), String::new()),
    }
}

async fn refused(resp: reqwest::Response) -> Error {
    let status = resp.status().as_u16();
    refusal(status, resp.text().await.unwrap_or_default())
}

/// The error for a refusal with HTTP `status` and the answer's body.
fn refusal(status: u16, message: String) -> Error {
    let message = if message.trim().is_empty() {
        format!("HTTP {status}")
    } else {
        message.trim().to_string()
    };
    match status {
        // The proxy's reason already says the token was rejected.
        401 => Error::Unauthorized(
            message
                .strip_prefix("token rejected: ")
                .map(str::to_string)
                .unwrap_or(message),
        ),
        _ => Error::Refused { status, message },
    }
}

/// `left` bytes of `file` as a body stream, read ahead on a thread of their own (blocking reads
/// stay off the async runtime) through a bounded channel.
fn file_stream(
    mut file: std::fs::File,
    left: u64,
    counters: Arc<Counters>,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(READ_AHEAD);
    std::thread::spawn(move || {
        let mut left = left;
        while left > 0 {
            let want = CHUNK.min(usize::try_from(left).unwrap_or(CHUNK));
            let mut buf = vec![0u8; want];
            let read = match file.read(&mut buf) {
                Ok(0) => Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file shrank while being uploaded",
                )),
                Ok(n) => {
                    buf.truncate(n);
                    left -= n as u64;
                    Ok(Bytes::from(buf))
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            let failed = read.is_err();
            // The request was dropped (the connection failed): stop reading.
            if tx.blocking_send(read).is_err() || failed {
                return;
            }
        }
    });
    stream::poll_fn(move |cx| rx.poll_recv(cx)).inspect(move |chunk| {
        if let Ok(chunk) = chunk {
            counters
                .position
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            counters
                .sent
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    })
}

/// One `POST` of the file from `offset`.
async fn send(
    client: &reqwest::Client,
    url: &str,
    bearer: &str,
    req: &UploadRequest,
    offset: u64,
    len: u64,
    counters: &Arc<Counters>,
) -> Result<Attempt> {
    let mut file = std::fs::File::open(&req.file)
        .map_err(|e| Error::io(format!("opening {}", req.file.display()), e))?;
    file.seek(std::io::SeekFrom::Start(offset))
        .map_err(|e| Error::io(format!("seeking in {}", req.file.display()), e))?;
    counters.position.store(offset, Ordering::Relaxed);
    let body = file_stream(file, len - offset, counters.clone());
    let mut post = client
        .post(url)
        .header(AUTHORIZATION, bearer)
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(CONTENT_LENGTH, len - offset)
        .body(reqwest::Body::wrap_stream(body));
    if offset > 0 {
        post = post.header(UPLOAD_OFFSET, offset);
    }
    if let Some(sum) = &req.checksum {
        post = post.header(UPLOAD_CHECKSUM, sum);
    }
    let resp = match post.send().await {
        Ok(resp) => resp,
        Err(e) => return Ok(Attempt::Dropped(chain(&e))),
    };
    let status = resp.status();
    let held = resp
        .headers()
        .get(UPLOAD_OFFSET)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    match status {
        StatusCode::OK => Ok(Attempt::Done),
        StatusCode::RANGE_NOT_SATISFIABLE => Ok(Attempt::Retry {
            offset: Some(held.unwrap_or(0)),
            why: "the server holds another offset".into(),
        }),
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => Ok(Attempt::Retry {
            offset: None,
            why: format!("HTTP {status}: {}", resp.text().await.unwrap_or_default()),
        }),
        // The server saw the body break off (a cut between proxy and server, say).
        StatusCode::BAD_REQUEST if held.is_some() => Ok(Attempt::Retry {
            offset: held,
            why: "the server saw the body break off".into(),
        }),
        _ => Err(refused(resp).await),
    }
}
