//! The request side of an HTTP transfer: what one transfer asks for ([`HttpRequest`]), how a
//! signer authenticates each attempt ([`RequestSigner`]), and a user's URL and options turned
//! into a request (credentials in the URL become basic auth). The client itself comes from
//! [`netkit::client`]. Also the reading of small answers (manifests, tokens) whole.

use std::sync::Arc;

use bytes::Bytes;

use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::{Error, Result};
use netkit::{HttpOptions, percent_decode};

/// Signs each attempt's request just before it is sent (S3 SigV4 signatures carry the time, so
/// they are made per attempt, not once; a GCS token is renewed before it expires). Both methods
/// may block: they run on the transfer's own thread. An error of a retryable kind (a token
/// endpoint that did not answer) ends the attempt, to be retried as a dropped connection is; any
/// other ends the transfer.
pub trait RequestSigner: Send + Sync {
    /// Adds the authentication headers for a `GET` of `url` to `headers`.
    fn sign(&self, url: &Url, headers: &mut HeaderMap) -> Result<()>;

    /// Called when the server answers 401 (with its `WWW-Authenticate`, if any): `Ok(true)` when
    /// new credentials were obtained (an expired registry or GCS token renewed), so the request
    /// is sent again; at most once in a row.
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

    /// The request for a user's `url` with `opts`' headers and credentials (those in the URL become
    /// basic auth unless `opts` has some).
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

/// The extra headers of `opts` as a header map.
pub(super) fn extra_headers(opts: &HttpOptions) -> Result<HeaderMap> {
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

pub(super) fn strip_userinfo(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.to_string()
}

/// A small response body, at most `limit` bytes, each chunk within `idle`.
pub async fn read_limited(
    mut resp: reqwest::Response,
    limit: u64,
    idle: std::time::Duration,
    name: &str,
) -> Result<Bytes> {
    let mut out = Vec::new();
    loop {
        let chunk = tokio::time::timeout(idle, resp.chunk())
            .await
            .map_err(|_| {
                Error::SourceUnavailable(format!("{name}: no response data for {idle:?}"))
            })?
            .map_err(|e| {
                Error::SourceUnavailable(format!("{name}: reading a response: {}", e.without_url()))
            })?;
        let Some(chunk) = chunk else {
            return Ok(out.into());
        };
        if (out.len() + chunk.len()) as u64 > limit {
            return Err(Error::SourceRejected(format!(
                "{name}: an answer larger than {limit} bytes (a manifest, config or token answer is a few KiB)"
            )));
        }
        out.extend_from_slice(&chunk);
    }
}
