//! `quarry clone-source`: streams a source volume to the target's upload server as CDI's cloner
//! does (see the module above for the wire format), sparse-aware:
//!
//! - a `disk.img` file's holes are found with `SEEK_DATA`/`SEEK_HOLE` and never read; a block
//!   device is scanned once and its all-zero 64 KiB runs are treated as holes;
//! - `filesystem-clone` sends only the data extents (a sparse tar member); `blockdevice-clone`
//!   must carry every byte, so holes go out as zeroes that snappy shrinks about twentyfold.
//!
//! The scan also hashes the image (holes as zeroes), so the request can carry the image's
//! length and sha256 and Quarry's upload server verifies both before the target looks complete.
//! A dropped connection, a 502/503/504 or a server still busy with the broken attempt is retried
//! with doubling back-off (1 s up to 30 s); each retry sends the whole stream again, since CDI's
//! upload server keeps nothing of a broken clone (Quarry's drops the held part when a new
//! `POST` comes without an offset), and the importer only makes the target visible on success.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt as _, FileTypeExt as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt as _;
use reqwest::StatusCode;
use sha2::{Digest as _, Sha256};

use super::tar::{self, Extent};
use super::{CLONE_LENGTH, CONTENT_TYPE_HEADER, CloneKind};
use crate::UPLOAD_CHECKSUM;
use crate::error::{Error, Result};
use importer::error::chain;
use importer::progress::Progress;

/// Granularity of zero detection on block devices.
const ZERO_RUN: usize = 64 << 10;
/// Read size for scanning and sending.
const CHUNK: usize = 1 << 20;
/// Body chunks read ahead of the connection.
const READ_AHEAD: usize = 4;
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// One clone, as asked for.
#[derive(Debug, Clone)]
pub struct CloneSourceRequest {
    /// A filesystem volume's `disk.img`, or a block device.
    pub source: PathBuf,
    /// The target upload server's URL, path included (CDI's `UPLOAD_URL`).
    pub url: String,
    pub kind: CloneKind,
    /// Extra trusted CA certificates (PEM).
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key (PEM), for the upload server's mutual TLS.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// Attempts after the first that may follow a transport failure.
    pub retries: u32,
    /// First back-off between attempts; doubles each time up to 30 s.
    pub backoff: Duration,
    /// How long to wait, after the scan and before the first attempt, for the server to answer
    /// at all (the controller starts this pod beside its upload server, not after it).
    pub server_wait: Duration,
    /// Counters of the clone's progress (what `--metrics-addr` serves as CDI's
    /// `kubevirt_cdi_clone_progress_total`): `source_length` is the bytes the stream carries
    /// before compression (the data extents of a `filesystem-clone`, every byte of a
    /// `blockdevice-clone`), `source_read` how many of them the current attempt has read.
    pub progress: Option<Arc<Progress>>,
}

/// What a clone did, printed by `quarry clone-source --json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CloneReport {
    pub source: String,
    pub url: String,
    pub content_type: &'static str,
    /// The image's length.
    pub bytes: u64,
    /// Bytes in data extents (holes excluded).
    pub data_bytes: u64,
    /// `sha256:HEX` of the image, holes read as zeroes.
    pub checksum: String,
    /// Body bytes sent over all attempts (compressed).
    pub bytes_sent: u64,
    pub attempts: u32,
    pub duration_seconds: f64,
}

impl CloneReport {
    pub fn summary(&self) -> String {
        format!(
            "cloned {} ({} bytes, {} in data extents, {} sent in {} attempt(s)) in {:.2}s",
            self.source,
            self.bytes,
            self.data_bytes,
            self.bytes_sent,
            self.attempts,
            self.duration_seconds
        )
    }
}

/// The source's layout: its length, data extents and checksum.
#[derive(Debug, Clone)]
pub struct Layout {
    pub size: u64,
    pub extents: Vec<Extent>,
    pub sha256: String,
}

/// Opens the source and maps it: data extents from `SEEK_DATA`/`SEEK_HOLE` for a file (only data
/// is read, holes hash as zeroes), from a full read for a block device (zero runs dropped).
pub fn scan(path: &std::path::Path) -> Result<(File, Layout)> {
    let file = File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let read_err = |e| Error::io(format!("reading {}", path.display()), e);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let zeroes = vec![0u8; CHUNK];
    let (size, extents) = if meta.file_type().is_block_device() {
        let size = importer::sink::block::device_size(path)?;
        let mut extents: Vec<Extent> = Vec::new();
        let mut pos = 0u64;
        while pos < size {
            let n = (size - pos).min(CHUNK as u64) as usize;
            file.read_exact_at(&mut buf[..n], pos).map_err(read_err)?;
            hasher.update(&buf[..n]);
            for (i, run) in buf[..n].chunks(ZERO_RUN).enumerate() {
                if importer::sink::is_zero(run) {
                    continue;
                }
                let start = pos + (i * ZERO_RUN) as u64;
                match extents.last_mut() {
                    Some((o, l)) if *o + *l == start => *l += run.len() as u64,
                    _ => extents.push((start, run.len() as u64)),
                }
            }
            pos += n as u64;
        }
        (size, extents)
    } else {
        let size = meta.len();
        let extents = data_extents(&file, size).map_err(read_err)?;
        let mut pos = 0u64;
        for &(start, len) in &extents {
            hash_zeroes(&mut hasher, &zeroes, start - pos);
            let mut off = start;
            while off < start + len {
                let n = (start + len - off).min(CHUNK as u64) as usize;
                file.read_exact_at(&mut buf[..n], off).map_err(read_err)?;
                hasher.update(&buf[..n]);
                off += n as u64;
            }
            pos = start + len;
        }
        hash_zeroes(&mut hasher, &zeroes, size - pos);
        (size, extents)
    };
    let sha256 = format!("sha256:{}", hex(&hasher.finalize()));
    Ok((
        file,
        Layout {
            size,
            extents,
            sha256,
        },
    ))
}

fn hash_zeroes(hasher: &mut Sha256, zeroes: &[u8], mut len: u64) {
    while len > 0 {
        let n = len.min(zeroes.len() as u64) as usize;
        hasher.update(&zeroes[..n]);
        len -= n as u64;
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A regular file's data extents (the whole file where the filesystem cannot tell holes).
fn data_extents(file: &File, size: u64) -> io::Result<Vec<Extent>> {
    use nix::unistd::{Whence, lseek};
    let mut extents = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let start = match lseek(file, pos as i64, Whence::SeekData) {
            Ok(s) => s as u64,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(nix::errno::Errno::EINVAL) => {
                extents.push((pos, size - pos));
                break;
            }
            Err(e) => return Err(e.into()),
        };
        let end = (lseek(file, start as i64, Whence::SeekHole)? as u64).min(size);
        if end > start {
            extents.push((start, end - start));
        }
        pos = end;
    }
    Ok(extents)
}

/// The logical image (holes as zeroes) or, for a tar member, only its data extents in order;
/// what it yields counts as read in `progress`.
struct ExtentReader {
    file: File,
    extents: Vec<Extent>,
    size: u64,
    with_holes: bool,
    next: usize,
    pos: u64,
    progress: Option<Arc<Progress>>,
}

impl Read for ExtentReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.read_extents(buf)?;
        if let Some(p) = &self.progress {
            p.source_read.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
}

impl ExtentReader {
    fn read_extents(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(&(start, len)) = self.extents.get(self.next) else {
                // Past the last extent: the trailing hole, if holes are sent.
                if !self.with_holes || self.pos >= self.size {
                    return Ok(0);
                }
                let n = buf.len().min((self.size - self.pos) as usize);
                buf[..n].fill(0);
                self.pos += n as u64;
                return Ok(n);
            };
            if self.pos < start {
                if !self.with_holes {
                    self.pos = start;
                    continue;
                }
                let n = buf.len().min((start - self.pos) as usize);
                buf[..n].fill(0);
                self.pos += n as u64;
                return Ok(n);
            }
            if self.pos >= start + len {
                self.next += 1;
                continue;
            }
            let n = buf.len().min((start + len - self.pos) as usize);
            self.file.read_exact_at(&mut buf[..n], self.pos)?;
            self.pos += n as u64;
            return Ok(n);
        }
    }
}

/// The stream's content before snappy framing.
fn content(
    kind: CloneKind,
    file: File,
    layout: &Layout,
    progress: Option<Arc<Progress>>,
) -> Result<Box<dyn Read + Send>> {
    let extents = ExtentReader {
        file,
        extents: layout.extents.clone(),
        size: layout.size,
        with_holes: kind == CloneKind::Blockdevice,
        next: 0,
        pos: 0,
        progress,
    };
    Ok(match kind {
        CloneKind::Blockdevice => Box::new(extents),
        CloneKind::Filesystem => {
            let meta = extents
                .file
                .metadata()
                .map_err(|e| Error::io("reading the source's mode", e))?;
            let mode = if meta.file_type().is_block_device() {
                0o660
            } else {
                std::os::unix::fs::PermissionsExt::mode(&meta.permissions())
            };
            let mtime = std::os::unix::fs::MetadataExt::mtime(&meta).max(0) as u64;
            let stored: u64 = layout.extents.iter().map(|&(_, l)| l).sum();
            let header = tar::sparse_header(layout.size, &layout.extents, mode, mtime);
            let mut tail = vec![0u8; tar::padding(stored)];
            tail.extend_from_slice(&tar::end_of_archive());
            Box::new(
                io::Cursor::new(header)
                    .chain(extents)
                    .chain(io::Cursor::new(tail)),
            )
        }
    })
}

/// The HTTP client: the platform's roots plus `ca_pem`, and the client identity.
fn client(req: &CloneSourceRequest) -> Result<reqwest::Client> {
    let mut b = importer::source::http::client_builder(&Default::default())?
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("quarry-clone-source/", env!("CARGO_PKG_VERSION")));
    if let Some(pem) = &req.ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| Error::InvalidInput(format!("bad server CA certificate: {e}")))?;
        if certs.is_empty() {
            return Err(Error::InvalidInput(
                "no PEM certificate in the server CA".into(),
            ));
        }
        for cert in certs {
            b = b.add_root_certificate(cert);
        }
    }
    if let Some((cert, key)) = &req.identity_pem {
        b = b.identity(identity(
            cert,
            key,
            "the clone source's client certificate",
        )?);
    }
    b.build()
        .map_err(|e| Error::InvalidInput(format!("configuring the HTTP client: {}", chain(&e))))
}

/// A client identity from a PEM certificate (chain) and its key.
pub(crate) fn identity(cert: &[u8], key: &[u8], what: &str) -> Result<reqwest::Identity> {
    let mut pem = cert.to_vec();
    pem.push(b'\n');
    pem.extend_from_slice(key);
    reqwest::Identity::from_pem(&pem)
        .map_err(|e| Error::InvalidInput(format!("{what}: {}", chain(&e))))
}

/// How one attempt ended.
enum Attempt {
    Done,
    /// Worth another try: the connection failed, or the server is busy or unreachable.
    Retry(String),
}

/// Runs the clone.
pub async fn clone_source(req: &CloneSourceRequest) -> Result<CloneReport> {
    let started = Instant::now();
    let path = req.source.clone();
    let (_, layout) = tokio::task::spawn_blocking(move || scan(&path))
        .await
        .map_err(|e| Error::Unavailable(format!("the scan task failed: {e}")))??;
    tracing::info!(
        source = %req.source.display(),
        bytes = layout.size,
        data = layout.extents.iter().map(|&(_, l)| l).sum::<u64>(),
        extents = layout.extents.len(),
        "source mapped"
    );
    if let Some(p) = &req.progress {
        let carried = match req.kind {
            CloneKind::Blockdevice => layout.size,
            CloneKind::Filesystem => layout.extents.iter().map(|&(_, l)| l).sum(),
        };
        // An empty image is done as soon as it is sent: 1 of 1.
        p.source_length.store(carried.max(1), Ordering::Relaxed);
    }
    let client = client(req)?;
    wait_for_server(&client, &req.url, req.server_wait).await;
    let mut sent = 0u64;
    let mut attempts = 0u32;
    let mut backoff = req.backoff;
    loop {
        attempts += 1;
        match attempt(&client, req, &layout, &mut sent, attempts > 1).await? {
            Attempt::Done => break,
            Attempt::Retry(why) if attempts <= req.retries => {
                tracing::warn!(attempt = attempts, cause = %why, "clone attempt failed; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Attempt::Retry(why) => {
                return Err(Error::Unavailable(format!(
                    "{} after {attempts} attempt(s): {why}",
                    req.url
                )));
            }
        }
    }
    if let Some(p) = &req.progress {
        p.source_read
            .store(p.source_length.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    Ok(CloneReport {
        source: req.source.display().to_string(),
        url: req.url.clone(),
        content_type: req.kind.as_str(),
        bytes: layout.size,
        data_bytes: layout.extents.iter().map(|&(_, l)| l).sum(),
        checksum: layout.sha256.clone(),
        bytes_sent: sent,
        attempts,
        duration_seconds: started.elapsed().as_secs_f64(),
    })
}

/// How often a server not answering yet is asked again: its Service routes to it within a
/// fraction of a second of its readiness.
const SERVER_POLL: Duration = Duration::from_millis(100);

/// Waits up to `limit` until the server at `url` answers (any HTTP status: its `/healthz`,
/// behind a Service that routes only to a ready server). Past the limit the attempts go ahead
/// and fail or retry as they would have.
async fn wait_for_server(client: &reqwest::Client, url: &str, limit: Duration) {
    if limit.is_zero() {
        return;
    }
    let Ok(mut health) = reqwest::Url::parse(url) else {
        return;
    };
    health.set_path("/healthz");
    health.set_query(None);
    let started = Instant::now();
    let mut told = started;
    loop {
        let probe = client.get(health.clone()).timeout(Duration::from_secs(5));
        let why = match probe.send().await {
            Ok(_) => return,
            Err(e) => chain(&e),
        };
        if started.elapsed() >= limit {
            tracing::warn!(url, cause = %why, "the upload server did not answer in {limit:?}; sending anyway");
            return;
        }
        if told.elapsed() >= Duration::from_secs(10) {
            tracing::info!(url, cause = %why, "waiting for the upload server");
            told = Instant::now();
        }
        tokio::time::sleep(SERVER_POLL).await;
    }
}

async fn attempt(
    client: &reqwest::Client,
    req: &CloneSourceRequest,
    layout: &Layout,
    sent: &mut u64,
    is_retry: bool,
) -> Result<Attempt> {
    let file = File::open(&req.source)
        .map_err(|e| Error::io(format!("opening {}", req.source.display()), e))?;
    if let Some(p) = &req.progress {
        // Each attempt sends the whole stream again.
        p.source_read.store(0, Ordering::Relaxed);
    }
    let content = content(req.kind, file, layout, req.progress.clone())?;
    let framed = snap::read::FrameEncoder::new(content);
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(READ_AHEAD);
    let counted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let producer = {
        let counted = counted.clone();
        std::thread::Builder::new()
            .name("clone-source-read".into())
            .spawn(move || pump(framed, tx, &counted))
            .map_err(|e| Error::io("starting the reader thread", e))?
    };
    let body = reqwest::Body::wrap_stream(tokio_stream(rx));
    let result = client
        .post(&req.url)
        .header(CONTENT_TYPE_HEADER, req.kind.as_str())
        .header(CLONE_LENGTH, layout.size)
        .header(UPLOAD_CHECKSUM, &layout.sha256)
        .body(body)
        .send()
        .await;
    let _ = producer.join();
    *sent += counted.load(std::sync::atomic::Ordering::Relaxed);
    let resp = match result {
        Ok(resp) => resp,
        Err(e) => return Ok(Attempt::Retry(chain(&e))),
    };
    let status = resp.status();
    let message = resp.text().await.unwrap_or_default();
    match status {
        s if s.is_success() => Ok(Attempt::Done),
        // A retry after a lost answer: the first attempt completed the volume.
        StatusCode::CONFLICT if is_retry => {
            tracing::warn!("the target reports an earlier attempt completed it: {message}");
            Ok(Attempt::Done)
        }
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT => {
            Ok(Attempt::Retry(format!(
                "HTTP {}: {}",
                status.as_u16(),
                message.trim()
            )))
        }
        _ => Err(Error::Refused {
            status: status.as_u16(),
            message: message.trim().to_string(),
        }),
    }
}

/// Reads the framed stream in chunks into the body channel, until the end or the receiver goes.
fn pump(
    mut framed: impl Read,
    tx: tokio::sync::mpsc::Sender<io::Result<Bytes>>,
    counted: &std::sync::atomic::AtomicU64,
) {
    loop {
        let mut buf = vec![0u8; CHUNK];
        let mut filled = 0;
        let ended = loop {
            match framed.read(&mut buf[filled..]) {
                Ok(0) => break true,
                Ok(n) => {
                    filled += n;
                    if filled == buf.len() {
                        break false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::error!(error = %e, "reading the clone source failed");
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        };
        buf.truncate(filled);
        if !buf.is_empty() {
            if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                return;
            }
            counted.fetch_add(filled as u64, std::sync::atomic::Ordering::Relaxed);
        }
        if ended {
            return;
        }
    }
}

fn tokio_stream(
    mut rx: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
) -> impl futures_util::Stream<Item = io::Result<Bytes>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_file_maps_to_its_data_and_hashes_as_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let f = File::create(&path).unwrap();
        f.write_all_at(&[7u8; 8192], 1 << 20).unwrap();
        f.set_len(4 << 20).unwrap();
        drop(f);
        let (_, layout) = scan(&path).unwrap();
        assert_eq!(layout.size, 4 << 20);
        let data: u64 = layout.extents.iter().map(|&(_, l)| l).sum();
        assert!(data < 1 << 20, "holes are not data: {:?}", layout.extents);
        let whole = std::fs::read(&path).unwrap();
        assert_eq!(
            layout.sha256,
            format!("sha256:{}", hex(&Sha256::digest(&whole)))
        );

        // The tar content decodes to the same bytes.
        let file = File::open(&path).unwrap();
        let mut framed = snap::read::FrameEncoder::new(
            content(CloneKind::Filesystem, file, &layout, None).unwrap(),
        );
        let mut body = Vec::new();
        framed.read_to_end(&mut body).unwrap();
        assert!(
            body.len() < 64 << 10,
            "holes are not sent: {} bytes",
            body.len()
        );
        let mut image = Vec::new();
        super::super::decode::decode(CloneKind::Filesystem, io::Cursor::new(body))
            .read_to_end(&mut image)
            .unwrap();
        assert!(image == whole, "the decoded image differs");
    }

    #[test]
    fn gnu_tar_extracts_the_tar_as_a_cdi_target_does_with_its_holes() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let f = File::create(&path).unwrap();
        for i in 0..40u64 {
            // More extents than the header's four: extension blocks too.
            f.write_all_at(&[i as u8 + 1; 4096], i * (256 << 10))
                .unwrap();
        }
        f.set_len(12 << 20).unwrap();
        drop(f);
        let (file, layout) = scan(&path).unwrap();
        let mut tar_bytes = Vec::new();
        content(CloneKind::Filesystem, file, &layout, None)
            .unwrap()
            .read_to_end(&mut tar_bytes)
            .unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let mut child = std::process::Command::new("tar")
            .args(["--preserve-permissions", "--no-same-owner", "-xC"])
            .arg(&out)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("GNU tar");
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), &tar_bytes).unwrap();
        drop(child.stdin.take());
        assert!(
            child.wait().unwrap().success(),
            "GNU tar refused the stream"
        );
        let extracted = out.join("disk.img");
        assert!(std::fs::read(&extracted).unwrap() == std::fs::read(&path).unwrap());
        let blocks = std::fs::metadata(&extracted).unwrap().blocks() * 512;
        assert!(
            blocks < 2 << 20,
            "GNU tar filled the holes: {blocks} bytes allocated"
        );
    }
}
