//! Polls a DataImportCron's source for its current [`SourceVersion`], one function per source
//! kind, over the importer's own HTTP client (TLS roots, CA files, `insecure`, extra headers),
//! registry session (authentication) and S3 signer:
//! - registry: the manifest digest of the tag, as CDI's poller records it;
//! - HTTP: `ETag`, else `Last-Modified` from a `HEAD`; a server that answers `HEAD` without
//!   either (or refuses it) gets a ranged `GET` of the first [`HEAD_BYTES`], whose headers or
//!   bytes (hashed) are the version;
//! - S3: the object's ETag, from a signed one-byte ranged `GET`;
//! - GCS: as HTTP, with the service account's bearer token.

use std::path::PathBuf;
use std::time::Duration;

use api::{DataImportCron, DataVolume};
use importer::import::ImportRequest;
use importer::source::SourceSpec;
use importer::source::gcs::{self, GcsOptions, TokenSigner};
use importer::source::http::{HttpOptions, HttpRequest, RequestSigner, client_builder};
use importer::source::registry::{RegistryOptions, manifest_digest};
use importer::source::s3::{S3Object, S3Options, signer};
use kube::ResourceExt;
use reqwest::header::{AUTHORIZATION, ETAG, HeaderMap, LAST_MODIFIED, RANGE};
use reqwest::{Client, Method, RequestBuilder, Response};

use super::version::SourceVersion;
use crate::datavolume::pvc::{StorageDefaults, claim};
use crate::datavolume::request::{SourceObjects, import_request};
use crate::datavolume::source::{ImportSource, Source, source};
use crate::settings::Config;

/// Bytes of an HTTP object hashed when the server sends neither `ETag` nor `Last-Modified`.
pub const HEAD_BYTES: u64 = 64 << 10;

/// Why a source's version could not be found.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// The importer refused the source or its options, or the registry failed.
    #[error("polling {what}")]
    Importer {
        /// The source polled.
        what: String,
        /// What failed.
        #[source]
        cause: importer::Error,
    },
    /// The request failed (connection, TLS, timeout).
    #[error("polling {what}: {method} failed")]
    Request {
        /// The source polled.
        what: String,
        /// `HEAD` or `GET`.
        method: Method,
        /// What failed.
        #[source]
        cause: reqwest::Error,
    },
    /// No answer in time.
    #[error("polling {what}: no answer to {method} within {after:?}")]
    Timeout {
        /// The source polled.
        what: String,
        /// `HEAD` or `GET`.
        method: Method,
        /// The limit.
        after: Duration,
    },
    /// The server answered with an error status.
    #[error("polling {what}: {method} answered {status}")]
    Status {
        /// The source polled.
        what: String,
        /// `HEAD` or `GET`.
        method: Method,
        /// The status.
        status: reqwest::StatusCode,
    },
    /// An answer without anything that identifies a version.
    #[error("polling {0}: the answer has no ETag")]
    NoVersion(String),
    /// The source kind has nothing to poll.
    #[error("polling: {0} sources have no version to poll (http, registry, s3 or gcs only)")]
    Unsupported(&'static str),
}

/// A DataImportCron's template source: an import (http, registry, s3 or gcs), as its imports run.
pub fn template_source(cron: &DataImportCron) -> kubekit::Result<(DataVolume, ImportSource)> {
    let template = DataVolume::new(&cron.name_any(), cron.spec.template.spec.clone());
    let Source::Import(src) = source(&template.spec)? else {
        return Err(kubekit::Error::invalid(
            "a DataImportCron's template must import from http, registry, s3 or gcs",
        ));
    };
    Ok((template, src))
}

/// The request a poll of the template's source ([`template_source`]) is made with: the
/// options its import would get, with the Secrets and ConfigMap it names (`objects`).
pub fn poll_request(
    (template, src): &(DataVolume, ImportSource),
    objects: &SourceObjects,
    insecure_registries: &[String],
) -> kubekit::Result<ImportRequest> {
    let claim = claim(template, &Config::default(), &StorageDefaults::Builtin)?;
    import_request(
        src,
        PathBuf::new(),
        &claim,
        false,
        objects,
        insecure_registries,
    )
}

/// The current version of an import source.
pub async fn poll(source: &SourceSpec, http: &HttpOptions) -> Result<SourceVersion, PollError> {
    match source {
        SourceSpec::Http(url) => http_version(url, http).await,
        SourceSpec::Registry { image, options } => registry_version(image, http, options).await,
        SourceSpec::S3 { url, options } => s3_version(url, options, http).await,
        SourceSpec::Gcs { url, options } => gcs_version(url, options, http).await,
        SourceSpec::File(_) => Err(PollError::Unsupported("file")),
        SourceSpec::Stdin => Err(PollError::Unsupported("stream")),
    }
}

/// A registry image's manifest digest.
pub async fn registry_version(
    image: &str,
    http: &HttpOptions,
    options: &RegistryOptions,
) -> Result<SourceVersion, PollError> {
    manifest_digest(image, http, options)
        .await
        .map(SourceVersion::RegistryDigest)
        .map_err(|cause| PollError::Importer {
            what: image.into(),
            cause,
        })
}

/// An HTTP object's `ETag`, else `Last-Modified`, else the hash of its first bytes.
pub async fn http_version(url: &str, http: &HttpOptions) -> Result<SourceVersion, PollError> {
    let req = HttpRequest::from_url(url, http).map_err(|cause| PollError::Importer {
        what: url.into(),
        cause,
    })?;
    request_version(req, http).await
}

/// A GCS object's version as an HTTP object's, asked with a token of the service account.
pub async fn gcs_version(
    url: &str,
    options: &GcsOptions,
    http: &HttpOptions,
) -> Result<SourceVersion, PollError> {
    let importer_err = |cause| PollError::Importer {
        what: url.into(),
        cause,
    };
    let mut req = gcs::object_request(url).map_err(importer_err)?;
    if let Some(key) = &options.credentials {
        let signer = TokenSigner::new(key, http).map_err(importer_err)?;
        let token = signer.request_token().await.map_err(importer_err)?;
        req.headers.insert(AUTHORIZATION, token.authorization);
    }
    request_version(req, http).await
}

/// The version of the object `req` asks for (see [`http_version`]).
async fn request_version(req: HttpRequest, http: &HttpOptions) -> Result<SourceVersion, PollError> {
    let client = client(http).map_err(|cause| PollError::Importer {
        what: req.name.clone(),
        cause,
    })?;
    let what = req.name.clone();
    let request = |method: Method| {
        let mut rb = client
            .request(method, req.url.clone())
            .headers(req.headers.clone());
        if let Some((user, pass)) = &req.basic_auth {
            rb = rb.basic_auth(user, Some(pass));
        }
        rb
    };
    // A HEAD refused (405, 403 on some object stores) is no failure: the GET below decides.
    if let Ok(resp) = send(request(Method::HEAD), Method::HEAD, &what, http).await
        && let Some(v) = header_version(resp.headers())
    {
        return Ok(v);
    }
    let resp = send(
        request(Method::GET).header(RANGE, format!("bytes=0-{}", HEAD_BYTES - 1)),
        Method::GET,
        &what,
        http,
    )
    .await?;
    if let Some(v) = header_version(resp.headers()) {
        return Ok(v);
    }
    let head = read_head(resp, &what, http).await?;
    SourceVersion::from_http(None, None, Some(&head)).ok_or(PollError::NoVersion(what))
}

/// An S3 object's ETag (the credentials sign the request, as an import's).
pub async fn s3_version(
    url: &str,
    options: &S3Options,
    http: &HttpOptions,
) -> Result<SourceVersion, PollError> {
    let importer_err = |cause| PollError::Importer {
        what: url.into(),
        cause,
    };
    let object = S3Object::parse(url, options).map_err(importer_err)?;
    let what = object.name();
    let target = object.url();
    let mut headers = HeaderMap::new();
    if let Some(s) = signer(&object, options) {
        s.sign(&target, &mut headers).map_err(importer_err)?;
    }
    let client = client(http).map_err(importer_err)?;
    let rb = client
        .get(target)
        .headers(headers)
        .header(RANGE, "bytes=0-0");
    let resp = send(rb, Method::GET, &what, http).await?;
    resp.headers()
        .get(ETAG)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| SourceVersion::S3Etag(v.into()))
        .ok_or(PollError::NoVersion(what))
}

fn client(http: &HttpOptions) -> importer::Result<Client> {
    client_builder(http)?
        .build()
        .map_err(|e| importer::Error::InvalidInput(format!("configuring the HTTP client: {e}")))
}

/// The version the headers give (`ETag`, else `Last-Modified`).
fn header_version(headers: &HeaderMap) -> Option<SourceVersion> {
    let get = |h| headers.get(h).and_then(|v| v.to_str().ok());
    SourceVersion::from_http(get(ETAG), get(LAST_MODIFIED), None)
}

/// Sends one request within the connect and idle timeouts; an error status fails.
async fn send(
    rb: RequestBuilder,
    method: Method,
    what: &str,
    http: &HttpOptions,
) -> Result<Response, PollError> {
    let after = http.connect_timeout + http.idle_timeout;
    let resp = tokio::time::timeout(after, rb.send())
        .await
        .map_err(|_| PollError::Timeout {
            what: what.into(),
            method: method.clone(),
            after,
        })?
        .map_err(|cause| PollError::Request {
            what: what.into(),
            method: method.clone(),
            cause,
        })?;
    if !resp.status().is_success() {
        return Err(PollError::Status {
            what: what.into(),
            method,
            status: resp.status(),
        });
    }
    Ok(resp)
}

/// The first [`HEAD_BYTES`] of a body (a server ignoring the range sends more: cut there).
async fn read_head(
    mut resp: Response,
    what: &str,
    http: &HttpOptions,
) -> Result<Vec<u8>, PollError> {
    let mut out = Vec::new();
    while (out.len() as u64) < HEAD_BYTES {
        let chunk = tokio::time::timeout(http.idle_timeout, resp.chunk())
            .await
            .map_err(|_| PollError::Timeout {
                what: what.into(),
                method: Method::GET,
                after: http.idle_timeout,
            })?
            .map_err(|cause| PollError::Request {
                what: what.into(),
                method: Method::GET,
                cause,
            })?;
        match chunk {
            Some(c) => out.extend_from_slice(&c),
            None => break,
        }
    }
    out.truncate(HEAD_BYTES as usize);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use testkit::faults::{FaultConfig, FaultServer, Step};

    use super::*;

    fn block_on<T>(f: impl Future<Output = T>) -> T {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(f)
    }

    fn poll_http(server: &FaultServer) -> SourceVersion {
        block_on(http_version(
            &server.url("/disk.img"),
            &HttpOptions::default(),
        ))
        .unwrap()
    }

    #[test]
    fn an_etag_from_head_is_the_version_without_a_get() {
        let server = FaultServer::start(FaultConfig::new(vec![1u8; 4096]).etag(Some("\"v7\"")));
        assert_eq!(poll_http(&server), SourceVersion::HttpEtag("\"v7\"".into()));
        let methods: Vec<String> = server.requests().iter().map(|r| r.method.clone()).collect();
        assert_eq!(methods, ["HEAD"]);
    }

    #[test]
    fn last_modified_is_the_version_without_an_etag() {
        let date = "Wed, 01 May 2024 10:00:00 GMT";
        let server = FaultServer::start(
            FaultConfig::new(vec![1u8; 4096])
                .etag(None)
                .last_modified(Some(date)),
        );
        assert_eq!(
            poll_http(&server),
            SourceVersion::HttpLastModified(date.into())
        );
    }

    #[test]
    fn without_either_header_the_first_bytes_are_hashed_from_a_ranged_get() {
        let body: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let cfg = |b: Vec<u8>| FaultConfig::new(b).etag(None).last_modified(None);
        let server = FaultServer::start(cfg(body.clone()));
        let v = poll_http(&server);
        let reqs = server.requests();
        assert_eq!(reqs[1].method, "GET");
        assert_eq!(reqs[1].header("range"), Some("bytes=0-65535"));
        assert_eq!(
            v,
            SourceVersion::from_http(None, None, Some(&body[..HEAD_BYTES as usize])).unwrap()
        );
        // A change within the head is a new version; the same bytes are the same version.
        let mut changed = body.clone();
        changed[10] ^= 1;
        assert_ne!(poll_http(&FaultServer::start(cfg(changed))), v);
        assert_eq!(poll_http(&FaultServer::start(cfg(body))), v);
    }

    #[test]
    fn a_refused_head_falls_back_to_the_get() {
        let server = FaultServer::start(
            FaultConfig::new(vec![1u8; 4096])
                .etag(Some("\"g1\""))
                .script([Step::status(405)]),
        );
        assert_eq!(poll_http(&server), SourceVersion::HttpEtag("\"g1\"".into()));
    }

    /// A GCS object's version is its ETag, asked with the service account's token (the
    /// token endpoint verifies the assertion).
    #[test]
    fn a_gcs_object_is_polled_with_a_bearer_token() {
        use testkit::gcs::{Grant, TokenEndpoint};
        let server = FaultServer::start(FaultConfig::new(vec![1u8; 4096]).etag(Some("\"g7\"")));
        let tokens = TokenEndpoint::start(Grant::Verify { expires_in: 3600 });
        let key = gcs::ServiceAccountKey::from_json(tokens.key_json().as_bytes(), "key").unwrap();
        let options = GcsOptions {
            credentials: Some(key),
        };
        let v = block_on(gcs_version(
            &server.url("/bkt/disk.img"),
            &options,
            &HttpOptions::default(),
        ))
        .unwrap();
        assert_eq!(v, SourceVersion::HttpEtag("\"g7\"".into()));
        let reqs = server.requests();
        assert_eq!(reqs[0].header("authorization"), Some("Bearer token-1"));
        assert_eq!(tokens.requests()[0].outcome, Ok("token-1".into()));
    }

    #[test]
    fn an_error_status_fails_naming_the_source() {
        let server = FaultServer::start(
            FaultConfig::new(vec![1u8; 16]).script([Step::status(404), Step::status(404)]),
        );
        let err = block_on(http_version(
            &server.url("/disk.img"),
            &HttpOptions::default(),
        ))
        .unwrap_err();
        assert!(
            matches!(err, PollError::Status { status, .. } if status == 404),
            "{err}"
        );
        assert!(err.to_string().contains("/disk.img"), "{err}");
    }
}
