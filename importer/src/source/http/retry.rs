//! Retry classification: which failures are worth another attempt (connection errors,
//! timeouts, 408/429/5xx) and which are final (other 4xx, TLS verification, refused redirects),
//! and how long to wait before the next attempt.

use std::io;
use std::time::Duration;

use reqwest::header;
use reqwest::{Response, StatusCode};

use crate::Error;
use crate::error::chain;

pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Why an attempt ended.
pub(super) enum Failure {
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

pub(super) fn retry(cause: impl Into<String>) -> Failure {
    Failure::Retry {
        cause: cause.into(),
        retry_after: None,
    }
}

/// A signer's failure (no new token): another attempt when its kind is retryable (a token
/// endpoint that did not answer), final otherwise (credentials refused).
pub(super) fn signer_failure(e: Error) -> Failure {
    match e {
        Error::SourceUnavailable(cause) => retry(cause),
        e if e.kind().is_retryable() => retry(e.to_string()),
        e => Failure::Fatal(e),
    }
}

/// Classifies a `GET` error: `(error, retryable)`. TLS verification failures and refused
/// redirects are terminal; connection errors and timeouts are worth retrying.
pub fn classify_error(name: &str, e: reqwest::Error) -> (Error, bool) {
    classify_request_error("GET", name, e)
}

/// As [`classify_error`], for a request of `method` (a token request's `POST`).
pub fn classify_request_error(method: &str, name: &str, e: reqwest::Error) -> (Error, bool) {
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
    (
        Error::SourceUnavailable(format!("{method} {name}: {msg}")),
        true,
    )
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
}
