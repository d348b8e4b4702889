//! GCS source: one Google Cloud Storage object read with path-style `GET`s of the XML API
//! (`ENDPOINT/BUCKET/OBJECT`), which serves byte ranges as any HTTP server does.
//!
//! The transfer is an [`HttpSource`]: the same TLS options, retries with back-off, ranged resume
//! (`Range` + `If-Range` on the object's ETag) and length checks. Only the authorisation is GCS's
//! own. With a service-account key (the JSON file Google issues, which CDI's Secret holds as
//! `credentials.json`) every request carries `Authorization: Bearer` with an OAuth 2 access
//! token, asked of the key's `token_uri` with a JWT assertion (RFC 7523) that the key signs
//! RS256 for the read-only storage scope. A token is renewed before it expires (five minutes
//! ahead, or half its lifetime when that is shorter) and when the server answers 401 (a token
//! revoked, or expired while a connection stalled, before a resumed range). Without a key the
//! requests are anonymous (public objects), as CDI's are.
//!
//! `gs://BUCKET/OBJECT` is read from `https://storage.googleapis.com`, or from the emulator that
//! `STORAGE_EMULATOR_HOST` names (`host:port` or `http://host:port`), as Google's client
//! libraries do; CDI's other form, `http(s)://HOST[:PORT]/BUCKET/OBJECT`, names its endpoint.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use reqwest::Url;
use reqwest::header::{self, HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use crate::error::{Error, Result};
use crate::source::http::{
    HttpOptions, HttpRequest, HttpSource, RequestSigner, build_client, classify_request_error,
    is_transient, read_limited,
};
use crate::source::object;
use crate::source::run_async;
use token::{Algorithm, JwtHeader};

/// Where `gs://` objects are read from.
pub const DEFAULT_ENDPOINT: &str = "https://storage.googleapis.com";
/// The variable Google's client libraries read an emulator's address from.
pub const EMULATOR_HOST_ENV: &str = "STORAGE_EMULATOR_HOST";
/// The one scope an import needs.
pub const READ_ONLY_SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_only";
/// Google's token endpoint, for key files that name none (as Google's libraries assume).
pub const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// The OAuth 2 grant of a JWT assertion (RFC 7523).
pub const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Seconds an assertion is valid (Google takes at most an hour).
pub const ASSERTION_LIFETIME: i64 = 3600;
/// A token is renewed this long before it expires (or at half its lifetime, when shorter).
const RENEW_AHEAD: Duration = Duration::from_secs(300);
/// Token answers are a few hundred bytes.
const MAX_TOKEN_ANSWER: u64 = 64 << 10;

/// The parts of a service-account key file a token request needs. `Debug` redacts the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ServiceAccountKey {
    pub client_email: String,
    /// The key's id, sent as the assertion's `kid`.
    pub private_key_id: Option<String>,
    /// The RSA private key, PEM.
    pub private_key: String,
    pub token_uri: String,
}

impl std::fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .field("private_key_id", &self.private_key_id)
            .field("private_key", &"<redacted>")
            .field("token_uri", &self.token_uri)
            .finish()
    }
}

/// A key file as Google writes it; only what a token request needs is read.
#[derive(Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key_id: Option<String>,
    private_key: Option<String>,
    token_uri: Option<String>,
}

impl ServiceAccountKey {
    /// Reads a service-account key file (CDI's `credentials.json`).
    pub fn from_file(path: &Path) -> Result<ServiceAccountKey> {
        let json = std::fs::read(path)
            .map_err(|e| Error::io(format!("reading the GCS credentials {}", path.display()), e))?;
        Self::from_json(&json, &path.display().to_string())
    }

    /// Parses and checks a service-account key (its PEM key included); `what` names where it
    /// came from in errors.
    pub fn from_json(json: &[u8], what: &str) -> Result<ServiceAccountKey> {
        let bad = |why: String| Error::InvalidInput(format!("GCS credentials {what}: {why}"));
        let file: KeyFile = serde_json::from_slice(json)
            .map_err(|e| bad(format!("not a service-account key file (JSON): {e}")))?;
        if let Some(kind) = file.kind.as_deref().filter(|k| *k != "service_account") {
            return Err(bad(format!(
                "type {kind:?} is not supported (a service-account key, type \"service_account\", is)"
            )));
        }
        let required = |v: Option<String>, field: &str| {
            v.filter(|v| !v.trim().is_empty())
                .ok_or_else(|| bad(format!("{field} is missing or empty")))
        };
        let key = ServiceAccountKey {
            client_email: required(file.client_email, "client_email")?,
            private_key: required(file.private_key, "private_key")?,
            private_key_id: file.private_key_id.filter(|id| !id.is_empty()),
            token_uri: file
                .token_uri
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| DEFAULT_TOKEN_URI.to_string()),
        };
        let uri = Url::parse(&key.token_uri)
            .map_err(|e| bad(format!("token_uri {:?} is not a URL: {e}", key.token_uri)))?;
        if !matches!(uri.scheme(), "http" | "https") {
            return Err(bad(format!(
                "token_uri {:?} is not an http(s) URL",
                key.token_uri
            )));
        }
        key.signing_key(what)?;
        Ok(key)
    }

    fn signing_key(&self, what: &str) -> Result<token::PrivateKey> {
        token::private_key_from_pem(&self.private_key, &format!("private_key of {what}"))
            .map_err(|e| Error::InvalidInput(format!("GCS credentials {what}: {e}")))
    }
}

/// How to read from GCS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcsOptions {
    /// A service-account key; None: anonymous requests (public objects).
    pub credentials: Option<ServiceAccountKey>,
}

/// One object: the endpoint it lives on, its bucket and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcsObject {
    pub endpoint: Url,
    pub bucket: String,
    pub object: String,
}

impl GcsObject {
    /// `gs://BUCKET/OBJECT` (on `emulator_host` when given, else [`DEFAULT_ENDPOINT`]), or CDI's
    /// form `http(s)://HOST[:PORT]/BUCKET/OBJECT`.
    pub fn parse(spec: &str, emulator_host: Option<&str>) -> Result<GcsObject> {
        let o = object::parse(spec, "gs://", "GCS", || match emulator_host {
            Some(host) if host.contains("://") => host.trim_end_matches('/').to_string(),
            Some(host) => format!("http://{}", host.trim_end_matches('/')),
            None => DEFAULT_ENDPOINT.to_string(),
        })?;
        Ok(GcsObject {
            endpoint: o.endpoint,
            bucket: o.bucket,
            object: o.key,
        })
    }

    /// The XML API's path-style URL of the object.
    pub fn url(&self) -> Url {
        object::url(&self.endpoint, &self.bucket, &self.object)
    }

    /// `gs://BUCKET/OBJECT`, and the endpoint when it is not Google's.
    pub fn name(&self) -> String {
        let name = format!("gs://{}/{}", self.bucket, self.object);
        if self.endpoint.as_str().trim_end_matches('/') == DEFAULT_ENDPOINT {
            name
        } else {
            format!("{name} at {}", self.endpoint)
        }
    }
}

/// The `GET` of a GCS object, not yet authorised; `STORAGE_EMULATOR_HOST` redirects `gs://`
/// sources.
pub fn object_request(spec: &str) -> Result<HttpRequest> {
    let emulator = std::env::var(EMULATOR_HOST_ENV)
        .ok()
        .filter(|h| !h.is_empty());
    let object = GcsObject::parse(spec, emulator.as_deref())?;
    let mut req = HttpRequest::new(object.url());
    req.name = object.name();
    Ok(req)
}

/// Opens a GCS object as a byte source.
pub fn open(spec: &str, gcs: &GcsOptions, http: &HttpOptions) -> Result<HttpSource> {
    let mut req = object_request(spec)?;
    if let Some(key) = &gcs.credentials {
        req.signer = Some(Arc::new(TokenSigner::new(key, http)?));
    }
    HttpSource::open_request(req, http)
}

/// The claims of a token request's assertion.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AssertionClaims {
    pub iss: String,
    pub scope: String,
    pub aud: String,
    pub iat: i64,
    pub exp: i64,
}

/// A token endpoint's answer; `expires_in` defaults to an hour.
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
    expires_in: Option<u64>,
}

/// An OAuth 2 error answer (RFC 6749 5.2).
#[derive(Deserialize)]
struct TokenRefusal {
    error: Option<String>,
    error_description: Option<String>,
}

/// An access token and when to ask for the next.
#[derive(Clone)]
pub struct AccessToken {
    /// `Bearer TOKEN`, marked sensitive.
    pub authorization: HeaderValue,
    pub renew_at: Instant,
}

/// The bearer tokens of one service account: asked for when first needed, renewed before they
/// expire and when refused.
pub struct TokenSigner {
    key: ServiceAccountKey,
    signing_key: token::PrivateKey,
    http: HttpOptions,
    current: Mutex<Option<AccessToken>>,
}

impl TokenSigner {
    pub fn new(key: &ServiceAccountKey, http: &HttpOptions) -> Result<TokenSigner> {
        Ok(TokenSigner {
            signing_key: key.signing_key(&key.client_email)?,
            key: key.clone(),
            http: http.clone(),
            current: Mutex::new(None),
        })
    }

    /// The signed JWT a token request made at `now` (Unix seconds) carries.
    pub fn assertion(&self, now: i64) -> Result<String> {
        let header = JwtHeader {
            alg: Algorithm::Rs256,
            typ: Some("JWT"),
            kid: self.key.private_key_id.as_deref(),
        };
        let claims = AssertionClaims {
            iss: self.key.client_email.clone(),
            scope: READ_ONLY_SCOPE.into(),
            aud: self.key.token_uri.clone(),
            iat: now,
            exp: now.saturating_add(ASSERTION_LIFETIME),
        };
        token::sign_jwt(&header, &claims, &self.signing_key).map_err(|e| {
            Error::InvalidInput(format!(
                "the token request of {}: {e}",
                self.key.client_email
            ))
        })
    }

    /// A new access token from the key's token endpoint. A refusal (4xx) is
    /// [`Error::SourceRejected`] with the endpoint's `error_description`; no answer, or a 5xx,
    /// is [`Error::SourceUnavailable`].
    pub async fn request_token(&self) -> Result<AccessToken> {
        let uri = &self.key.token_uri;
        let what = format!("the token endpoint {uri}");
        let body = format!(
            "grant_type={}&assertion={}",
            netkit::percent_encode(JWT_BEARER_GRANT, false),
            self.assertion(token::now())?
        );
        let request = build_client(&self.http)?
            .post(uri)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json")
            .body(body)
            .send();
        let limit = self.http.connect_timeout + self.http.idle_timeout;
        let resp = match tokio::time::timeout(limit, request).await {
            Err(_) => {
                return Err(Error::SourceUnavailable(format!(
                    "POST {what}: no answer within {limit:?}"
                )));
            }
            Ok(Err(e)) => return Err(classify_request_error("POST", &what, e).0),
            Ok(Ok(resp)) => resp,
        };
        let status = resp.status();
        let answer = read_limited(resp, MAX_TOKEN_ANSWER, self.http.idle_timeout, &what).await?;
        if !status.is_success() {
            let refusal = serde_json::from_slice::<TokenRefusal>(&answer).ok();
            let why = refusal
                .and_then(|r| r.error_description.or(r.error))
                .map(|w| format!(": {w}"))
                .unwrap_or_default();
            let msg = format!(
                "{what} refused a token for {} ({status}){why}",
                self.key.client_email
            );
            return Err(if is_transient(status) {
                Error::SourceUnavailable(msg)
            } else {
                Error::SourceRejected(msg)
            });
        }
        let answer: TokenAnswer = serde_json::from_slice(&answer).map_err(|e| {
            Error::SourceRejected(format!("{what} answered {status} with no token JSON: {e}"))
        })?;
        let token = answer
            .access_token
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Error::SourceRejected(format!("{what} answered without access_token"))
            })?;
        let mut authorization = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| Error::SourceRejected(format!("{what} answered an unusable token")))?;
        authorization.set_sensitive(true);
        // A day at most: Google's tokens live an hour, and the instant below must not overflow.
        let lifetime = Duration::from_secs(answer.expires_in.unwrap_or(3600).min(86_400));
        debug!(account = %self.key.client_email, lifetime_s = lifetime.as_secs(), "got a GCS access token");
        Ok(AccessToken {
            authorization,
            renew_at: Instant::now() + lifetime - RENEW_AHEAD.min(lifetime / 2),
        })
    }

    /// The current token's header, or a new token's when there is none or it is due.
    fn authorization(&self) -> Result<HeaderValue> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = current.as_ref().filter(|t| Instant::now() < t.renew_at) {
            return Ok(t.authorization.clone());
        }
        let fresh = run_async(self.request_token())?;
        let header = fresh.authorization.clone();
        *current = Some(fresh);
        Ok(header)
    }
}

impl RequestSigner for TokenSigner {
    fn sign(&self, _url: &Url, headers: &mut HeaderMap) -> Result<()> {
        headers.insert(header::AUTHORIZATION, self.authorization()?);
        Ok(())
    }

    fn renew(&self, _challenge: Option<&str>) -> Result<bool> {
        info!(account = %self.key.client_email, "GCS refused the access token (expired?); asking for a new one");
        // Dropped first: if no new one comes, the next attempt asks again.
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.authorization().map(|_| true)
    }
}

#[cfg(test)]
mod tests;
