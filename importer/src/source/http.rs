//! HTTP(S) byte source with bounded retries and resume.
//!
//! # Threads and memory
//!
//! Each [`HttpSource`] owns a small tokio runtime (current-thread) on a background thread named
//! `quarry-http`. That thread does the whole transfer: the first `GET` (which [`HttpSource::open`]
//! waits for, so a 404 or a bad certificate fails `open` at once), then streams the body into a
//! bounded channel of [`HttpOptions::chunk_depth`] chunks. [`Read`] on the other side blocks on
//! that channel. Memory is bounded by `chunk_depth` × the largest chunk hyper hands out
//! ([`LARGEST_CHUNK`]; TLS records make most chunks 16 KiB). The import reads the source on a
//! pipeline stage that buffers on its own, so the channel only needs to keep the transfer going. A runtime per source keeps the
//! source independent of whatever runtime (or none) the caller has, and a slow consumer only
//! blocks its own transfer. `Read` blocks the calling thread (parking it until the next chunk):
//! call it from a plain thread, as the pipeline does, not from an async task.
//! Dropping the source closes the channel; the background task notices at once (even while
//! waiting for the network or backing off) and ends.
//!
//! # Retries and resume
//!
//! - 404/401/403 (every 4xx except 408 and 429) and TLS verification failures are
//!   [`Error::SourceRejected`], never retried.
//! - Connection errors, timeouts, 408/429/5xx and bodies that break mid-way (reset, error, no
//!   byte for [`HttpOptions::idle_timeout`], a clean close before `Content-Length`) are retried
//!   with exponential back-off (`retry_backoff`, doubling, capped at 30 s; a `Retry-After` in
//!   seconds or as an HTTP date is honoured as a lower bound, capped at 60 s). After `max_retries` retries in a row
//!   the transfer fails with [`Error::SourceUnavailable`]. An attempt that passed at least 1 MiB
//!   of new bytes downstream resets the count, so a long download over a flaky link keeps going
//!   while a server that makes no progress is given up on.
//! - Once bytes have been passed downstream, a retry asks for `Range: bytes=N-` with `If-Range`,
//!   but only when the entity has a strong validator: a strong ETag, else a Last-Modified at
//!   least a second older than the response's `Date` (RFC 9110 8.8.2.2). Without one, nothing
//!   ties the rest of a file to its first part (a server may serve a replaced file's tail), so
//!   the retry asks for the whole body again, re-reads the first N bytes and checks them against
//!   a SHA-256 of what was passed on (kept only for such entities): equal, it goes on from N;
//!   different, the transfer fails with `SourceUnavailable` "source changed during download".
//!   Two different files are never joined.
//!   - 206 with `Content-Range: bytes N-…/total` matching what we know: continue from N.
//!   - 200 (the server ignored the range, or `If-Range` did not match): if the validators
//!     (ETag, weakly compared; Last-Modified; length) that both responses carry are unchanged,
//!     re-read from 0 and discard the first N bytes; if any changed, fail with
//!     `SourceUnavailable` "source changed during download" (bytes already passed on cannot be
//!     taken back; the importer retries the whole import).
//!   - A 206 whose Content-Range starts elsewhere, whose total or Content-Length disagrees, or
//!     that names a different entity is an error.
//!
//! # Length checks
//!
//! The bytes delivered must equal the `Content-Length` of the first response when it had one: a
//! short body is resumed and fails after the retries, never accepted. The end-of-stream marker is
//! sent only after that check, so a `Read` that returns 0 means "complete". A body *longer* than
//! its Content-Length cannot be seen over HTTP/1.1: hyper stops reading at Content-Length (the
//! extra bytes would be the start of the next response; each transfer uses its connection for one
//! response, so they are simply dropped), and over HTTP/2 h2 reports a protocol error, which is
//! retried. What can be detected is: a 206 whose total differs from the known length, a restarted
//! 200 whose Content-Length differs, and a chunked body that runs past the known length.
//! Without any Content-Length (chunked from the start) a clean end of the chunked encoding is
//! taken as complete.
//!
//! # Redirects, credentials, proxies
//!
//! Up to 10 redirects are followed. reqwest drops `Authorization` (basic or from extra headers),
//! `Cookie` and `Proxy-Authorization` when a redirect changes scheme, host or port; other extra
//! headers are forwarded (as Go's net/http, and so CDI, does). Resumed requests start again from
//! the original URL, so credentials never go to a redirect target that did not get them first.
//! No `Referer` is sent. Credentials in the URL (`http://user:pass@host/`) become basic auth
//! unless [`HttpOptions::basic_auth`] is set. `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and
//! `NO_PROXY` (and their lower-case forms) are honoured by reqwest.

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::{Arc, Once};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Client, Response, StatusCode, Url};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::error::chain;
use crate::source::{ByteSource, SourceInfo};
use crate::{Error, ErrorKind, Result};

/// How an [`HttpSource`] connects and how hard it tries. `Debug` redacts the password and the
/// header values.
#[derive(Clone)]
pub struct HttpOptions {
    /// Extra trusted CA certificates (PEM files, each may hold several). They are trusted in
    /// addition to the platform's roots.
    pub ca_certs: Vec<PathBuf>,
    /// Skip TLS certificate verification entirely.
    pub insecure: bool,
    /// Extra request headers (CDI `extraHeaders` / `secretExtraHeaders`).
    pub headers: Vec<(String, String)>,
    /// HTTP basic authentication `(user, password)`.
    pub basic_auth: Option<(String, String)>,
    /// Time allowed for the TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// No response headers (counted from the request, connecting included), or no body byte, for
    /// this long fails the attempt.
    pub idle_timeout: Duration,
    /// A body slower than this many bytes per second over a whole `idle_timeout` fails the
    /// attempt (a server trickling a byte now and then never goes idle); 0 turns it off.
    pub min_rate: u64,
    /// Retries of one transfer in a row without progress (see the module docs).
    pub max_retries: u32,
    /// First back-off between attempts; doubles on each retry, capped at 30 s.
    pub retry_backoff: Duration,
    /// Chunks buffered between the network task and the reader.
    pub chunk_depth: usize,
}

/// The largest body chunk hyper hands out: its read buffer's limit (8 KiB + 100 pages).
pub const LARGEST_CHUNK: usize = 8192 + 4096 * 100;

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            ca_certs: Vec::new(),
            insecure: false,
            headers: Vec::new(),
            basic_auth: None,
            connect_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            min_rate: 1024,
            max_retries: 5,
            retry_backoff: Duration::from_secs(1),
            chunk_depth: 2,
        }
    }
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<String> = self
            .headers
            .iter()
            .map(|(k, _)| format!("{k}: <redacted>"))
            .collect();
        f.debug_struct("HttpOptions")
            .field("ca_certs", &self.ca_certs)
            .field("insecure", &self.insecure)
            .field("headers", &headers)
            .field(
                "basic_auth",
                &self.basic_auth.as_ref().map(|(u, _)| (u, "<redacted>")),
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("min_rate", &self.min_rate)
            .field("max_retries", &self.max_retries)
            .field("retry_backoff", &self.retry_backoff)
            .field("chunk_depth", &self.chunk_depth)
            .finish()
    }
}

const MAX_REDIRECTS: usize = 10;
const MAX_BACKOFF: Duration = Duration::from_secs(30);
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// An attempt that delivered at least this many new bytes resets the retry count.
const PROGRESS_RESETS_RETRIES: u64 = 1 << 20;

/// Installs rustls' ring crypto provider as the process default, once. Safe to call often; an
/// already installed provider is kept.
pub fn install_tls_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// An image streamed over HTTP(S). See the module docs.
pub struct HttpSource {
    info: SourceInfo,
    rx: mpsc::Receiver<Msg>,
    current: Bytes,
    state: ReadState,
}

enum ReadState {
    Open,
    Done,
    Failed(ErrorKind, String),
}

enum Msg {
    Data(Bytes),
    /// The body is complete and its length checked.
    End,
    Failed(Error),
}

/// Signs each attempt's request just before it is sent (S3 SigV4 signatures carry the time, so
/// they are made per attempt, not once).
pub trait RequestSigner: Send + Sync {
    /// Adds the authentication headers for a `GET` of `url` to `headers`.
    fn sign(&self, url: &Url, headers: &mut HeaderMap) -> Result<()>;

    /// Called when the server answers 401 (with its `WWW-Authenticate`, if any): `Ok(true)` when
    /// new credentials were obtained (an expired registry token renewed), so the request is sent
    /// again; at most once in a row. It may block: it runs on the transfer's own thread.
    fn renew(&self, _challenge: Option<&str>) -> Result<bool> {
        Ok(false)
    }
}

/// One transfer as the other sources (registry blobs, S3 objects) ask for it: they reuse the
/// whole retry, resume and length-check machinery of [`HttpSource`].
pub struct HttpRequest {
    pub url: Url,
    /// Name for messages (the URL without credentials, or something more telling).
    pub name: String,
    /// Sent with every attempt (e.g. `Authorization: Bearer ...` for a registry blob).
    pub headers: HeaderMap,
    pub basic_auth: Option<(String, String)>,
    /// Called for every attempt after the headers above are set.
    pub signer: Option<Arc<dyn RequestSigner>>,
    /// The length the entity must have (a registry descriptor's size): a different
    /// `Content-Length` is refused, and a body without one is still held to it.
    pub expected_length: Option<u64>,
}

impl HttpRequest {
    pub fn new(url: Url) -> Self {
        HttpRequest {
            name: strip_userinfo(&url),
            url,
            headers: HeaderMap::new(),
            basic_auth: None,
            signer: None,
            expected_length: None,
        }
    }

    /// A request for an `http(s)://` URL as given by a user: credentials in the URL become basic
    /// authentication (else `opts.basic_auth`), and `opts.headers` are sent.
    pub fn from_url(url: &str, opts: &HttpOptions) -> Result<Self> {
        let mut url = Url::parse(url)
            .map_err(|e| Error::InvalidInput(format!("invalid URL {url:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Error::InvalidInput(format!(
                "unsupported URL scheme {:?} (expected http or https)",
                url.scheme()
            )));
        }
        let mut auth = opts.basic_auth.clone();
        if !url.username().is_empty() || url.password().is_some() {
            let user = percent_decode(url.username());
            let pass = percent_decode(url.password().unwrap_or(""));
            auth.get_or_insert((user, pass));
            let _ = url.set_username("");
            let _ = url.set_password(None);
        }
        let mut req = HttpRequest::new(url);
        req.headers = extra_headers(opts)?;
        req.basic_auth = auth;
        Ok(req)
    }
}

impl HttpSource {
    /// Starts the transfer and waits for the first response's headers.
    pub fn open(url: &str, opts: &HttpOptions) -> Result<Self> {
        Self::open_request(HttpRequest::from_url(url, opts)?, opts)
    }

    /// Starts a prepared transfer and waits for the first response's headers.
    pub fn open_request(req: HttpRequest, opts: &HttpOptions) -> Result<Self> {
        install_tls_provider();
        let client = build_client(opts)?;
        let HttpRequest {
            url,
            name,
            headers,
            basic_auth: auth,
            signer,
            expected_length,
        } = req;
        let (tx, rx) = mpsc::channel(opts.chunk_depth.max(1));
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let transfer = Transfer {
            client,
            url,
            name: name.clone(),
            headers,
            auth,
            signer,
            expected_length,
            renewed: false,
            idle_timeout: opts.idle_timeout,
            min_rate: opts.min_rate,
            max_retries: opts.max_retries,
            retry_backoff: opts.retry_backoff,
            tx,
            etag: None,
            last_modified: None,
            date: None,
            delivered_digest: None,
            length: None,
            seen_entity: false,
            delivered: 0,
        };
        std::thread::Builder::new()
            .name("quarry-http".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::io("starting the HTTP runtime", e)));
                        return;
                    }
                };
                rt.block_on(transfer.run(ready_tx));
            })
            .map_err(|e| Error::io("spawning the HTTP thread", e))?;
        let info = ready_rx.recv().map_err(|_| {
            Error::SourceUnavailable(format!("{name}: the HTTP task ended without an answer"))
        })??;
        Ok(HttpSource {
            info,
            rx,
            current: Bytes::new(),
            state: ReadState::Open,
        })
    }
}

impl Read for HttpSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.current.is_empty() {
                let n = buf.len().min(self.current.len());
                buf[..n].copy_from_slice(&self.current[..n]);
                self.current.advance(n);
                return Ok(n);
            }
            match &self.state {
                ReadState::Open => {}
                ReadState::Done => return Ok(0),
                ReadState::Failed(kind, msg) => {
                    let msg = format!("{msg} (already reported)");
                    let e = match kind {
                        ErrorKind::SourceRejected => Error::SourceRejected(msg),
                        _ => Error::SourceUnavailable(msg),
                    };
                    return Err(e.into_io());
                }
            }
            match block_on(self.rx.recv()) {
                Some(Msg::Data(b)) => self.current = b,
                Some(Msg::End) => self.state = ReadState::Done,
                Some(Msg::Failed(e)) => {
                    self.state = ReadState::Failed(e.kind(), e.to_string());
                    return Err(e.into_io());
                }
                None => {
                    let e = Error::SourceUnavailable(format!(
                        "{}: the HTTP task ended before the body was complete",
                        self.info.name
                    ));
                    self.state = ReadState::Failed(e.kind(), e.to_string());
                    return Err(e.into_io());
                }
            }
        }
    }
}

impl ByteSource for HttpSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }
}

/// Polls `fut` to completion on the calling thread, parking it in between. Unlike tokio's
/// `blocking_recv` this does not panic when the caller happens to be inside a runtime.
fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// The extra headers of `opts` as a header map.
fn extra_headers(opts: &HttpOptions) -> Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    for (k, v) in &opts.headers {
        let hn = HeaderName::from_bytes(k.as_bytes())
            .map_err(|e| Error::InvalidInput(format!("invalid header name {k:?}: {e}")))?;
        let hv = HeaderValue::from_str(v)
            .map_err(|e| Error::InvalidInput(format!("invalid value for header {k}: {e}")))?;
        headers.append(hn, hv);
    }
    Ok(headers)
}

/// The HTTP client every source uses: TLS roots plus `opts.ca_certs`, `insecure`, redirects
/// (credentials dropped across hosts), timeouts.
pub fn build_client(opts: &HttpOptions) -> Result<Client> {
    client_builder(opts)?
        .build()
        .map_err(|e| Error::InvalidInput(format!("configuring the HTTP client: {}", chain(&e))))
}

/// [`build_client`]'s configuration, for callers that add to it (a client certificate, say).
pub fn client_builder(opts: &HttpOptions) -> Result<reqwest::ClientBuilder> {
    install_tls_provider();
    let mut b = Client::builder()
        .connect_timeout(opts.connect_timeout)
        .redirect(reqwest::redirect::Policy::limited(MAX_REDIRECTS))
        .referer(false)
        .tcp_keepalive(Duration::from_secs(30))
        .user_agent(concat!("quarry-importer/", env!("CARGO_PKG_VERSION")));
    if opts.insecure {
        b = b.tls_danger_accept_invalid_certs(true);
    }
    let mut certs = Vec::new();
    for path in &opts.ca_certs {
        let pem = std::fs::read(path)
            .map_err(|e| Error::io(format!("reading CA certificates {}", path.display()), e))?;
        let found = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
            Error::InvalidInput(format!("bad CA certificate file {}: {e}", path.display()))
        })?;
        if found.is_empty() {
            return Err(Error::InvalidInput(format!(
                "no PEM certificate in {}",
                path.display()
            )));
        }
        certs.extend(found);
    }
    if !certs.is_empty() {
        b = b.tls_certs_merge(certs);
    }
    Ok(b)
}

/// Why an attempt ended.
enum Failure {
    /// Transient: try again (after a back-off, at least `retry_after`).
    Retry {
        cause: String,
        retry_after: Option<Duration>,
    },
    /// Definitive.
    Fatal(Error),
    /// The reader is gone: stop quietly.
    Closed,
    /// The signer renewed its credentials after a 401: ask again at once.
    Renewed,
}

fn retry(cause: impl Into<String>) -> Failure {
    Failure::Retry {
        cause: cause.into(),
        retry_after: None,
    }
}

/// One response to stream: entity bytes `[start, end)` (end unknown when chunked). No response
/// means nothing is left to read (a 416 confirming that the entity ends where we are).
struct Body {
    resp: Option<Response>,
    start: u64,
    end: Option<u64>,
}

/// The state of one transfer, owned by the background task.
struct Transfer {
    client: Client,
    url: Url,
    name: String,
    headers: HeaderMap,
    auth: Option<(String, String)>,
    signer: Option<Arc<dyn RequestSigner>>,
    expected_length: Option<u64>,
    /// The last attempt renewed the signer's credentials after a 401.
    renewed: bool,
    idle_timeout: Duration,
    min_rate: u64,
    max_retries: u32,
    retry_backoff: Duration,
    tx: mpsc::Sender<Msg>,
    // What the first response told us about the entity.
    etag: Option<String>,
    last_modified: Option<String>,
    /// The first response's `Date`, which can make its Last-Modified a strong validator.
    date: Option<String>,
    /// SHA-256 of the bytes passed downstream, kept when the entity has no strong validator: a
    /// retry re-reads them and must find the same.
    delivered_digest: Option<Sha256>,
    length: Option<u64>,
    seen_entity: bool,
    /// Bytes passed downstream so far (= the entity offset to continue from).
    delivered: u64,
}

impl Transfer {
    async fn run(mut self, ready: std::sync::mpsc::SyncSender<Result<SourceInfo>>) {
        let mut ready = Some(ready);
        let mut failures = 0u32;
        loop {
            let before = self.delivered;
            let outcome = match self.fetch().await {
                Ok(body) => {
                    if let Some(r) = ready.take() {
                        let info = SourceInfo {
                            name: self.name.clone(),
                            length: self.length,
                        };
                        if r.send(Ok(info)).is_err() {
                            return;
                        }
                    }
                    self.pump(body).await
                }
                Err(f) => Err(f),
            };
            let (cause, retry_after) = match outcome {
                Ok(()) => match self.length {
                    // A 206 that covered less than asked for: ask for the rest right away.
                    Some(len) if self.delivered < len => {
                        debug!(source = %self.name, offset = self.delivered, "partial range complete; asking for the rest");
                        continue;
                    }
                    _ => {
                        let _ = self.tx.send(Msg::End).await;
                        return;
                    }
                },
                Err(Failure::Closed) => return,
                Err(Failure::Renewed) => continue,
                Err(Failure::Fatal(e)) => return self.fail(ready, e).await,
                Err(Failure::Retry { cause, retry_after }) => (cause, retry_after),
            };
            if self.delivered - before >= PROGRESS_RESETS_RETRIES {
                failures = 0;
            }
            failures += 1;
            if failures > self.max_retries {
                let got = match self.length {
                    Some(len) => format!("{} of {len} bytes received", self.delivered),
                    None => format!("{} bytes received", self.delivered),
                };
                let e = Error::SourceUnavailable(format!(
                    "{}: giving up after {failures} attempts ({got}): {cause}",
                    self.name
                ));
                return self.fail(ready, e).await;
            }
            let delay = backoff_delay(self.retry_backoff, failures, retry_after);
            warn!(
                source = %self.name,
                offset = self.delivered,
                attempt = failures,
                max_retries = self.max_retries,
                delay_ms = delay.as_millis() as u64,
                cause = %cause,
                "HTTP transfer interrupted; {}",
                if self.delivered > 0 { "resuming with a range request" } else { "retrying" }
            );
            tokio::select! {
                _ = self.tx.closed() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    async fn fail(&self, ready: Option<std::sync::mpsc::SyncSender<Result<SourceInfo>>>, e: Error) {
        match ready {
            Some(r) => {
                let _ = r.send(Err(e));
            }
            None => {
                let _ = self.tx.send(Msg::Failed(e)).await;
            }
        }
    }

    /// The `If-Range` validator: a strong ETag, else a strong Last-Modified, else none.
    fn if_range(&self) -> Option<&str> {
        match &self.etag {
            Some(e) if !e.starts_with("W/") => Some(e),
            _ => self
                .last_modified
                .as_deref()
                .filter(|lm| last_modified_is_strong(lm, self.date.as_deref())),
        }
    }

    /// Records the entity's validators from its first response.
    fn remember_entity(&mut self, resp: &Response) {
        self.seen_entity = true;
        self.etag = header_str(resp, header::ETAG);
        self.last_modified = header_str(resp, header::LAST_MODIFIED);
        self.date = header_str(resp, header::DATE);
        if self.if_range().is_none() {
            self.delivered_digest = Some(Sha256::new());
        }
    }

    /// Sends one request (ranged when bytes were already delivered) and checks its answer.
    async fn fetch(&mut self) -> Result<Body, Failure> {
        let offset = self.delivered;
        let mut rb = self
            .client
            .get(self.url.clone())
            .headers(self.headers.clone());
        if let Some((user, pass)) = &self.auth {
            rb = rb.basic_auth(user, Some(pass));
        }
        if let Some(signer) = &self.signer {
            let mut signed = HeaderMap::new();
            signer
                .sign(&self.url, &mut signed)
                .map_err(Failure::Fatal)?;
            rb = rb.headers(signed);
        }
        if offset > 0
            && let Some(v) = self.if_range()
        {
            rb = rb
                .header(header::RANGE, format!("bytes={offset}-"))
                .header(header::IF_RANGE, v);
        }
        // The response headers are held to the idle limit like any other byte.
        let limit = self.idle_timeout;
        let resp = tokio::select! {
            _ = self.tx.closed() => return Err(Failure::Closed),
            r = tokio::time::timeout(limit, rb.send()) => match r {
                Err(_) => return Err(retry(format!("no response headers within {limit:?}"))),
                Ok(Err(e)) => return Err(self.classify(e)),
                Ok(Ok(resp)) => resp,
            },
        };

        let status = resp.status();
        let where_ = if resp.url() == &self.url {
            self.name.clone()
        } else {
            format!(
                "{} (redirected to {})",
                self.name,
                strip_userinfo(resp.url())
            )
        };
        if status.is_success() {
            self.renewed = false;
        }
        if status == StatusCode::PARTIAL_CONTENT {
            return self.check_partial(resp, offset, &where_);
        }
        if status == StatusCode::RANGE_NOT_SATISFIABLE && offset > 0 {
            // Fine only when the entity ends exactly where we are (a chunked body that broke
            // after its last byte); otherwise it shrank.
            let cr = header_str(&resp, header::CONTENT_RANGE).unwrap_or_default();
            let total = cr
                .strip_prefix("bytes */")
                .and_then(|t| t.trim().parse::<u64>().ok());
            if total == Some(offset) && self.length.is_none_or(|l| l == offset) {
                self.length = Some(offset);
                return Ok(Body {
                    resp: None,
                    start: offset,
                    end: Some(offset),
                });
            }
            return Err(Failure::Fatal(self.changed(&format!(
                "a range from byte {offset} is not satisfiable (Content-Range {cr:?})"
            ))));
        }
        if status.is_success() {
            let cl = content_length(&resp);
            if !self.seen_entity {
                self.remember_entity(&resp);
                self.length = cl;
                self.check_expected_length(&where_)?;
            } else if let Err(what) = self.same_entity(&resp, true) {
                return Err(Failure::Fatal(self.changed(&what)));
            } else if offset > 0 {
                warn!(
                    source = %self.name,
                    offset,
                    "server answered the range request with the whole body; re-reading from the start and discarding {offset} bytes"
                );
            }
            return Ok(Body {
                end: cl,
                resp: Some(resp),
                start: 0,
            });
        }
        let cause = format!("GET {where_} answered {status}");
        if status == StatusCode::UNAUTHORIZED
            && !self.renewed
            && let Some(signer) = &self.signer
        {
            let challenge = header_str(&resp, header::WWW_AUTHENTICATE);
            if signer.renew(challenge.as_deref()).map_err(Failure::Fatal)? {
                debug!(source = %self.name, "credentials renewed after a 401; asking again");
                self.renewed = true;
                return Err(Failure::Renewed);
            }
        }
        if is_transient(status) {
            return Err(Failure::Retry {
                cause,
                retry_after: retry_after(&resp),
            });
        }
        Err(Failure::Fatal(Error::SourceRejected(cause)))
    }

    /// Validates a 206 answer to `Range: bytes=offset-`.
    fn check_partial(
        &mut self,
        resp: Response,
        offset: u64,
        where_: &str,
    ) -> Result<Body, Failure> {
        let bad =
            |msg: String| Failure::Fatal(Error::SourceUnavailable(format!("{where_}: {msg}")));
        let cr = header_str(&resp, header::CONTENT_RANGE).ok_or_else(|| {
            bad("206 Partial Content without a single-range Content-Range".into())
        })?;
        let (first, last, total) = parse_content_range(&cr)
            .ok_or_else(|| bad(format!("unusable Content-Range {cr:?}")))?;
        if first != offset {
            return Err(bad(format!(
                "asked for bytes from {offset}, got Content-Range {cr:?}"
            )));
        }
        if let (Some(len), Some(total)) = (self.length, total)
            && len != total
        {
            return Err(Failure::Fatal(self.changed(&format!(
                "length {len} became {total} (Content-Range {cr:?})"
            ))));
        }
        if self.length.is_none() {
            self.length = total;
            self.check_expected_length(where_)?;
        }
        let end = last + 1;
        if let Some(len) = self.length
            && end > len
        {
            return Err(bad(format!(
                "Content-Range {cr:?} runs past the length {len}"
            )));
        }
        if let Some(cl) = content_length(&resp)
            && cl != end - first
        {
            return Err(bad(format!(
                "Content-Length {cl} disagrees with Content-Range {cr:?}"
            )));
        }
        if !self.seen_entity {
            self.remember_entity(&resp);
        } else if let Err(what) = self.same_entity(&resp, false) {
            return Err(Failure::Fatal(self.changed(&what)));
        }
        if offset > 0 {
            debug!(source = %self.name, offset, "resuming with 206 {cr}");
        }
        Ok(Body {
            resp: Some(resp),
            start: first,
            end: Some(end),
        })
    }

    /// Holds the entity to the length the caller expects (when it does): a different announced
    /// length is refused; an unannounced one becomes the expected one.
    fn check_expected_length(&mut self, where_: &str) -> Result<(), Failure> {
        let Some(expected) = self.expected_length else {
            return Ok(());
        };
        match self.length {
            Some(len) if len != expected => Err(Failure::Fatal(Error::SourceRejected(format!(
                "{where_}: the server announces {len} bytes but {expected} are expected"
            )))),
            _ => {
                self.length = Some(expected);
                Ok(())
            }
        }
    }

    /// Compares the validators both responses carry. `Err` names what changed.
    fn same_entity(&self, resp: &Response, full: bool) -> Result<(), String> {
        if let (Some(a), Some(b)) = (&self.etag, header_str(resp, header::ETAG))
            && opaque_tag(a) != opaque_tag(&b)
        {
            return Err(format!("ETag {a} became {b}"));
        }
        if let (Some(a), Some(b)) = (&self.last_modified, header_str(resp, header::LAST_MODIFIED))
            && *a != b
        {
            return Err(format!("Last-Modified {a} became {b}"));
        }
        if full
            && let (Some(a), Some(b)) = (self.length, content_length(resp))
            && a != b
        {
            return Err(format!("length {a} became {b}"));
        }
        Ok(())
    }

    /// Compares the re-read first bytes of the entity with those already passed on.
    fn check_reread(&self, reread: Sha256) -> Result<(), Failure> {
        let delivered = self.delivered_digest.clone().map(Sha256::finalize);
        if delivered == Some(reread.finalize()) {
            debug!(source = %self.name, offset = self.delivered, "re-read the first bytes: unchanged; going on");
            return Ok(());
        }
        Err(Failure::Fatal(self.changed(&format!(
            "the server gives no strong validator to resume with, and its first {} bytes differ when read again",
            self.delivered
        ))))
    }

    fn changed(&self, what: &str) -> Error {
        Error::SourceUnavailable(format!(
            "{}: source changed during download ({what}); {} bytes were already passed on",
            self.name, self.delivered
        ))
    }

    fn classify(&self, e: reqwest::Error) -> Failure {
        match classify_error(&self.name, e) {
            (e, false) => Failure::Fatal(e),
            (Error::SourceUnavailable(cause), true) => retry(cause),
            (e, true) => retry(e.to_string()),
        }
    }

    /// Streams one response downstream, discarding bytes already delivered (and checking them
    /// against what was delivered when the entity has no strong validator).
    async fn pump(&mut self, body: Body) -> Result<(), Failure> {
        let Body { resp, start, end } = body;
        let mut pos = start;
        let Some(mut resp) = resp else {
            return Ok(());
        };
        let resume_at = self.delivered;
        let mut reread = (start < resume_at && self.delivered_digest.is_some()).then(Sha256::new);
        // The rate is measured over windows of `idle_timeout` spent waiting for the network (time
        // blocked on a slow consumer downstream does not count against the server).
        let mut window = (Duration::ZERO, pos);
        loop {
            let asked = tokio::time::Instant::now();
            let next = tokio::select! {
                _ = self.tx.closed() => return Err(Failure::Closed),
                r = tokio::time::timeout(self.idle_timeout, resp.chunk()) => r,
            };
            window.0 += asked.elapsed();
            let mut chunk = match next {
                Err(_) => {
                    return Err(retry(format!(
                        "no data for {:?} at byte {pos}",
                        self.idle_timeout
                    )));
                }
                Ok(Err(e)) => {
                    return Err(retry(format!(
                        "body broke at byte {pos}: {}",
                        chain(&e.without_url())
                    )));
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(c))) => c,
            };
            let chunk_start = pos;
            pos += chunk.len() as u64;
            let (waited, from) = window;
            if waited >= self.idle_timeout {
                let got = pos - from;
                if (got as f64) < self.min_rate as f64 * waited.as_secs_f64() {
                    return Err(retry(format!(
                        "{got} bytes in {waited:.1?} at byte {pos}, slower than the minimum of {} bytes/s",
                        self.min_rate
                    )));
                }
                window = (Duration::ZERO, pos);
            }
            if let Some(len) = self.length
                && pos > len
            {
                return Err(Failure::Fatal(Error::SourceUnavailable(format!(
                    "{}: the body runs past its announced length of {len} bytes",
                    self.name
                ))));
            }
            if chunk_start < resume_at {
                let skip = (resume_at - chunk_start).min(chunk.len() as u64) as usize;
                if let Some(h) = reread.as_mut() {
                    h.update(&chunk[..skip]);
                }
                chunk.advance(skip);
                if pos >= resume_at
                    && let Some(h) = reread.take()
                {
                    self.check_reread(h)?;
                }
                if chunk.is_empty() {
                    continue;
                }
            }
            if let Some(digest) = self.delivered_digest.as_mut() {
                digest.update(&chunk);
            }
            self.delivered = pos;
            if self.tx.send(Msg::Data(chunk)).await.is_err() {
                return Err(Failure::Closed);
            }
        }
        let expected = end.or(self.length);
        if let Some(expected) = expected
            && pos < expected
        {
            return Err(retry(format!(
                "the body ended early at byte {pos} of {expected}"
            )));
        }
        Ok(())
    }
}

/// Classifies a request error: `(error, retryable)`. TLS verification failures and refused
/// redirects are terminal; connection errors and timeouts are worth retrying.
pub fn classify_error(name: &str, e: reqwest::Error) -> (Error, bool) {
    let e = e.without_url();
    let msg = chain(&e);
    if let Some(tls) = find_rustls_error(&e) {
        let hint = match tls {
            rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
                " (the server certificate is not trusted: give its CA, or allow insecure)"
            }
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => {
                " (the server answered in plain HTTP, not TLS: use an http:// URL, or for a \
                 plain-HTTP registry allow it with --insecure)"
            }
            _ => "",
        };
        return (
            Error::SourceRejected(format!("{name}: TLS verification failed: {tls}{hint}")),
            false,
        );
    }
    if e.is_redirect() {
        return (Error::SourceRejected(format!("{name}: {msg}")), false);
    }
    if e.is_builder() {
        return (Error::InvalidInput(format!("{name}: {msg}")), false);
    }
    (Error::SourceUnavailable(format!("GET {name}: {msg}")), true)
}

/// The delay before retry number `failures` (1-based): `base` doubled each time, capped at
/// 30 s, and at least the server's `Retry-After`.
pub fn backoff_delay(base: Duration, failures: u32, retry_after: Option<Duration>) -> Duration {
    base.saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(MAX_BACKOFF)
        .max(retry_after.unwrap_or_default())
}

/// The server's `Retry-After`, in seconds or as an HTTP date, capped at 60 s.
pub fn retry_after(resp: &Response) -> Option<Duration> {
    let value = resp.headers().get(header::RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(value, std::time::SystemTime::now())
}

/// `Retry-After: 120` or `Retry-After: Fri, 31 Dec 1999 23:59:59 GMT` (a date already past means
/// no wait), capped at 60 s; None when it is neither.
fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .unwrap_or_default(),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// True for the statuses worth retrying: 408, 429 and 5xx.
pub fn is_transient(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

fn header_str(resp: &Response, name: HeaderName) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
}

fn content_length(resp: &Response) -> Option<u64> {
    header_str(resp, header::CONTENT_LENGTH).and_then(|v| v.parse().ok())
}

/// True when `last_modified` may serve as a strong validator: the response's `Date` is at least
/// one second later (RFC 9110 8.8.2.2); a file changed within the second it was served could
/// change again under the same date.
fn last_modified_is_strong(last_modified: &str, date: Option<&str>) -> bool {
    let (Ok(modified), Some(Ok(date))) = (
        httpdate::parse_http_date(last_modified),
        date.map(httpdate::parse_http_date),
    ) else {
        return false;
    };
    date.duration_since(modified)
        .is_ok_and(|d| d >= Duration::from_secs(1))
}

/// The opaque part of an entity tag (weak comparison).
fn opaque_tag(tag: &str) -> &str {
    tag.strip_prefix("W/").unwrap_or(tag)
}

/// `bytes FIRST-LAST/TOTAL` (TOTAL may be `*`).
fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let (first, last) = range.trim().split_once('-')?;
    let first: u64 = first.trim().parse().ok()?;
    let last: u64 = last.trim().parse().ok()?;
    if last < first {
        return None;
    }
    let total = match total.trim() {
        "*" => None,
        t => {
            let t: u64 = t.parse().ok()?;
            if last >= t {
                return None;
            }
            Some(t)
        }
    };
    Some((first, last, total))
}

fn strip_userinfo(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.to_string()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex_val(b[i + 1]), hex_val(b[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// A rustls error somewhere in the chain (io::Error hides its inner error from `source()`).
fn find_rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(r) = c.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(io) = c.downcast_ref::<io::Error>()
            && let Some(inner) = io.get_ref()
        {
            if let Some(r) = inner.downcast_ref::<rustls::Error>() {
                return Some(r);
            }
            if let Some(r) = find_rustls_error(inner) {
                return Some(r);
            }
        }
        cur = c.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_seconds_or_as_an_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("3600", now), Some(MAX_RETRY_AFTER));
        let in_12s = httpdate::fmt_http_date(now + Duration::from_secs(12));
        assert_eq!(
            parse_retry_after(&in_12s, now),
            Some(Duration::from_secs(12))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(5));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
    }

    #[test]
    fn content_range_parsing() {
        assert_eq!(parse_content_range("bytes 5-9/10"), Some((5, 9, Some(10))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, 9, None)));
        assert_eq!(parse_content_range("bytes 5-9/9"), None);
        assert_eq!(parse_content_range("bytes 9-5/10"), None);
        assert_eq!(parse_content_range("bytes */10"), None);
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }

    #[test]
    fn weak_etags_compare_weakly_and_are_not_used_for_if_range() {
        assert_eq!(opaque_tag("W/\"a\""), opaque_tag("\"a\""));
        install_tls_provider();
        let (tx, _rx) = mpsc::channel(1);
        let mut t = Transfer {
            client: Client::new(),
            url: Url::parse("http://x/").unwrap(),
            name: "http://x/".into(),
            headers: HeaderMap::new(),
            auth: None,
            signer: None,
            expected_length: None,
            renewed: false,
            idle_timeout: Duration::from_secs(1),
            min_rate: 0,
            max_retries: 0,
            retry_backoff: Duration::from_millis(1),
            tx,
            etag: Some("W/\"a\"".into()),
            last_modified: Some("Tue, 03 Nov 2026 10:00:00 GMT".into()),
            date: Some("Tue, 03 Nov 2026 10:00:01 GMT".into()),
            delivered_digest: None,
            length: None,
            seen_entity: true,
            delivered: 0,
        };
        assert_eq!(t.if_range(), Some("Tue, 03 Nov 2026 10:00:00 GMT"));
        t.last_modified = None;
        assert_eq!(t.if_range(), None);
        t.etag = Some("\"b\"".into());
        assert_eq!(t.if_range(), Some("\"b\""));
    }

    #[test]
    fn last_modified_is_strong_only_a_second_before_the_date() {
        let lm = "Tue, 03 Nov 2026 10:00:00 GMT";
        assert!(last_modified_is_strong(
            lm,
            Some("Tue, 03 Nov 2026 10:00:01 GMT")
        ));
        assert!(last_modified_is_strong(
            lm,
            Some("Wed, 04 Nov 2026 10:00:00 GMT")
        ));
        assert!(!last_modified_is_strong(lm, Some(lm)));
        assert!(!last_modified_is_strong(
            lm,
            Some("Tue, 03 Nov 2026 09:59:59 GMT")
        ));
        assert!(!last_modified_is_strong(lm, None));
        assert!(!last_modified_is_strong("yesterday", Some(lm)));
        assert!(!last_modified_is_strong(lm, Some("later")));
    }

    #[test]
    fn debug_redacts_secrets() {
        let o = HttpOptions {
            basic_auth: Some(("alice".into(), "s3cret".into())),
            headers: vec![("Authorization".into(), "Bearer tok".into())],
            ..HttpOptions::default()
        };
        let d = format!("{o:?}");
        assert!(d.contains("alice") && d.contains("Authorization"), "{d}");
        assert!(!d.contains("s3cret") && !d.contains("tok"), "{d}");
    }

    #[test]
    fn userinfo_is_percent_decoded() {
        assert_eq!(percent_decode("a%40b%3Ac"), "a@b:c");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
