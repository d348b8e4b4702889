//! One transfer, on its own thread and runtime: the first `GET`, the body streamed downstream,
//! and on a break the retry (see [`super::retry`]) and the resume from where it broke, with the
//! entity and length checks the module docs of [`super`] describe.

use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use reqwest::header::{self, HeaderMap, HeaderName};
use reqwest::{Client, Response, StatusCode, Url};
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use super::client::{HttpRequest, RequestSigner, strip_userinfo};
use super::retry::{
    Failure, backoff_delay, classify_error, is_transient, retry, retry_after, signer_failure,
};
use crate::chunks::{ChunkSender, Forward, Forwarded};
use crate::error::chain;
use crate::source::SourceInfo;
use crate::{Error, Result};
use netkit::HttpOptions;

/// An attempt that delivered at least this many new bytes resets the retry count.
const PROGRESS_RESETS_RETRIES: u64 = 1 << 20;

/// Starts `req` on a `quarry-http` thread feeding `tx`, and waits for the first response's
/// headers: what they say of the entity, or why the transfer failed before any byte.
pub(super) fn start(req: HttpRequest, opts: &HttpOptions, tx: ChunkSender) -> Result<SourceInfo> {
    let client = netkit::build_client(opts)?;
    let HttpRequest {
        url,
        name,
        headers,
        basic_auth: auth,
        signer,
        expected_length,
    } = req;
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
    netkit::thread_with_runtime("quarry-http", move |rt| match rt {
        Ok(rt) => rt.block_on(transfer.run(ready_tx)),
        Err(e) => {
            let _ = ready_tx.send(Err(Error::io("starting the HTTP runtime", e)));
        }
    })
    .map_err(|e| Error::io("spawning the HTTP thread", e))?;
    ready_rx.recv().map_err(|_| {
        Error::SourceUnavailable(format!("{name}: the HTTP task ended without an answer"))
    })?
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
    tx: ChunkSender,
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
                        self.tx.end().await;
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
                self.tx.fail(e).await;
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
                .map_err(signer_failure)?;
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
            if signer.renew(challenge.as_deref()).map_err(signer_failure)? {
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
        let Some(resp) = resp else {
            return Ok(());
        };
        // Frames that arrive while the decoder is busy go downstream as one chunk.
        let mut frames = Forward::new(Box::pin(resp.bytes_stream()));
        let resume_at = self.delivered;
        let mut reread = (start < resume_at && self.delivered_digest.is_some()).then(Sha256::new);
        // The rate is measured over windows of `idle_timeout` spent waiting for the network (time
        // blocked on a slow consumer downstream does not count against the server).
        let mut window = (Duration::ZERO, pos);
        loop {
            let mut chunk = match frames.next(&self.tx, self.idle_timeout).await {
                Forwarded::Frame(chunk) => chunk,
                Forwarded::End => break,
                Forwarded::Closed => return Err(Failure::Closed),
                Forwarded::Idle => {
                    return Err(retry(format!(
                        "no data for {:?} at byte {pos}",
                        self.idle_timeout
                    )));
                }
                Forwarded::Failed(e) => {
                    return Err(retry(format!(
                        "body broke at byte {pos}: {}",
                        chain(&e.without_url())
                    )));
                }
            };
            let chunk_start = pos;
            pos += chunk.len() as u64;
            let (waited_before, from) = window;
            let waited = frames.network_wait() - waited_before;
            if waited >= self.idle_timeout {
                let got = pos - from;
                if (got as f64) < self.min_rate as f64 * waited.as_secs_f64() {
                    // What was delivered so far counts for the resume.
                    if !frames.flush(&self.tx).await {
                        return Err(Failure::Closed);
                    }
                    return Err(retry(format!(
                        "{got} bytes in {waited:.1?} at byte {pos}, slower than the minimum of {} bytes/s",
                        self.min_rate
                    )));
                }
                window = (frames.network_wait(), pos);
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
            frames.push(chunk);
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

#[cfg(test)]
mod tests {
    use super::*;

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
        netkit::install_tls_provider();
        let (tx, _rx) = crate::chunks::channel(1, "");
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
}
