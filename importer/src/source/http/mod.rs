//! HTTP(S) byte source with bounded retries and resume.
//!
//! # Threads and memory
//!
//! Each [`HttpSource`] owns a small tokio runtime (current-thread) on a background thread named
//! `quarry-http`. That thread does the whole transfer: the first `GET` (which [`HttpSource::open`]
//! waits for, so a 404 or a bad certificate fails `open` at once), then streams the body into a
//! bounded channel of [`HttpOptions::chunk_depth`] chunks ([`crate::chunks`]). [`Read`] on the
//! other side blocks on that channel; the import takes the channel itself
//! ([`ByteSource::take_chunks`]) and decodes straight from it, so a body byte crosses one
//! channel between this thread and the decoder. Frames that are ready at the same poll go as one
//! chunk of up to [`crate::chunks::BATCH`] ([`crate::chunks::Coalesce`]), and a frame is never
//! held back waiting for the next. hyper hands the body over one frame at a time, so this
//! rarely joins frames; joining those that arrive while the channel is full would need the pump
//! to read on while it waits for room. Memory is bounded by `chunk_depth` × the
//! largest chunk, hyper's largest frame ([`LARGEST_CHUNK`]); the kernel's socket buffer keeps
//! the transfer going while the decoder is busy. A runtime per source keeps the
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
//!
//! # Layout
//!
//! - [`client`]: what a transfer asks for ([`HttpRequest`], [`RequestSigner`]); the HTTP client
//!   itself comes from [`netkit::client`] (re-exported here).
//! - [`transfer`]: one transfer on its own thread: streaming, resume, entity and length checks.
//! - [`retry`]: which failures are retried, and the back-off.
//! - this module: [`HttpSource`], the blocking reader over a transfer.

pub mod client;
pub mod retry;
pub mod transfer;

use std::io::{self, Read};

use crate::Result;
use crate::chunks::{self, ChunkReader};
use crate::source::ChunkSource;
use crate::source::{ByteSource, SourceInfo};

pub use client::{HttpRequest, RequestSigner, read_limited};
pub use netkit::{HttpOptions, build_client, client_builder, install_tls_provider};
pub use retry::{backoff_delay, classify_error, classify_request_error, is_transient, retry_after};

/// The largest body chunk hyper hands out: its read buffer's limit (8 KiB + 100 pages).
pub const LARGEST_CHUNK: usize = 8192 + 4096 * 100;

/// An image streamed over HTTP(S). See the module docs.
pub struct HttpSource(ChunkSource);

impl HttpSource {
    /// Starts the transfer and waits for the first response's headers.
    pub fn open(url: &str, opts: &HttpOptions) -> Result<Self> {
        install_tls_provider();
        Self::open_request(HttpRequest::from_url(url, opts)?, opts)
    }

    /// Starts a prepared transfer and waits for the first response's headers.
    pub fn open_request(req: HttpRequest, opts: &HttpOptions) -> Result<Self> {
        install_tls_provider();
        let interrupted = format!(
            "{}: the HTTP task ended before the body was complete",
            req.name
        );
        let (tx, chunks) = chunks::channel(opts.chunk_depth, interrupted);
        let info = transfer::start(req, opts, tx)?;
        Ok(HttpSource(ChunkSource::new(info, chunks)))
    }
}

impl Read for HttpSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl ByteSource for HttpSource {
    fn info(&self) -> &SourceInfo {
        self.0.info()
    }

    fn take_chunks(&mut self) -> Option<ChunkReader> {
        self.0.take_chunks()
    }
}

// A coalesced batch is no larger than hyper's largest frame: the memory bound above holds.
const _: () = assert!(crate::chunks::BATCH <= LARGEST_CHUNK);
