//! Registry source: the disk of a KubeVirt containerDisk image (`docker://HOST/NAME[:TAG|@DIGEST]`),
//! streamed out of its layer as the layer arrives, with no scratch copy of the image.
//!
//! # Protocol
//!
//! The distribution API v2 on reqwest: `GET /v2/` (ping, and the authentication challenge),
//! then the manifest with one `Accept` naming the OCI manifest and index and the Docker schema-2
//! manifest and manifest list (schema 1 is refused). An index or list is resolved to the
//! requested platform (`linux/amd64` unless [`RegistryOptions::platform`] says otherwise; with an
//! explicit platform a single-image manifest must match it too). The image config is read for
//! CDI's bootc/ostree refusal. Manifests fetched by digest, the config and every layer are
//! verified against their digests (and descriptor sizes).
//!
//! # Authentication
//!
//! Anonymous when `/v2/` answers 200. On 401: `Basic` uses the credentials
//! ([`RegistryOptions::credentials`], or the registry's entry in a Docker `config.json`);
//! `Bearer realm=..,service=..,scope=..` asks the token service (with the credentials, if any) for
//! a `repository:NAME:pull` token (also when the ping was anonymous but a manifest request gets a
//! bearer challenge). The resulting `Authorization` header goes with the manifest
//! and blob requests; reqwest drops it when a blob request is redirected to another host (blob
//! storage), so credentials never leak there. Plain HTTP is used only with
//! [`crate::source::http::HttpOptions::insecure`] (as CDI's insecure registries), after HTTPS
//! failed. A blob request answered 401 with a bearer challenge (a token that expired during a
//! long import, say before a resumed range request) gets a new token and is sent again, once.
//!
//! # Layers
//!
//! Layers are read from the top one down, each streamed once: an [`HttpSource`] (retries and
//! ranged resume), a [`DigestReader`], gzip or zstd decoding, and the `tar` crate. Whiteouts of
//! upper layers hide the files of lower ones. The first layer holding a visible regular file
//! under `disk/` is the disk's: that file's bytes are the source's bytes (the pipeline then
//! detects qcow2/raw and compression as for any source). The rest of that layer is still read,
//! so a second disk in it is refused and its digest is checked; lower layers are not downloaded.
//! The end of the stream is reported only after the digest check, so a mismatch fails the
//! import before the target is committed.
//!
//! Threads: resolution runs on a short-lived thread with its own runtime (the caller may or may
//! not be in one); the layer walk runs on a `quarry-registry` thread feeding the import through one bounded
//! channel ([`crate::tarwalk`]).

pub mod auth;
pub mod layer;
pub mod manifest;
pub mod reference;

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use reqwest::header::{self, HeaderValue};
use reqwest::{Client, StatusCode, Url};
use tracing::{debug, info, warn};

use crate::checksum::{Checksum, Hasher};
use crate::decode;
use crate::error::{Error, Result};
use crate::peek::Peeked;
use crate::source::ChunkSource;
use crate::source::SourceInfo;
use crate::source::http::{
    self, HttpOptions, HttpRequest, HttpSource, RequestSigner, backoff_delay, build_client,
    classify_error, read_limited,
};
use crate::source::run_async;
use crate::tarwalk::{self, WalkOut, normalize, tar_error};
use auth::Basic;
use layer::{DigestReader, Whiteouts, in_disk_dir, layer_compression, verify_digest};
use manifest::{ImageConfig, Manifest, Platform};
use reference::{Reference, parse_digest};

/// The platform an index resolves to when none is given.
pub const DEFAULT_PLATFORM: &str = "linux/amd64";
/// Manifests and configs larger than this are refused (real ones are a few KiB).
const MAX_DOCUMENT: u64 = 4 << 20;

/// How to pull from a registry. `Debug` redacts the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistryOptions {
    /// Platform to resolve an index to, and to require of the image; None: resolve indexes to
    /// [`DEFAULT_PLATFORM`] and accept any single-platform image.
    pub platform: Option<Platform>,
    /// Basic credentials, for the registry or its token service.
    pub credentials: Option<Basic>,
    /// A Docker `config.json`-style file to take credentials from (used when `credentials` is
    /// None).
    pub auth_file: Option<PathBuf>,
}

impl std::fmt::Debug for RegistryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryOptions")
            .field("platform", &self.platform)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|(u, _)| (u, "<redacted>")),
            )
            .field("auth_file", &self.auth_file)
            .finish()
    }
}

/// Resolves the image and opens its disk file (see the module docs); fails (before any target
/// is touched) when the image cannot be pulled, is refused, or has no disk.
pub fn open(spec: &str, http: &HttpOptions, opts: &RegistryOptions) -> Result<ChunkSource> {
    let reference = Reference::parse(spec)?;
    let credentials = match (&opts.credentials, &opts.auth_file) {
        (Some(c), _) => Some(c.clone()),
        (None, Some(file)) => auth::from_auth_file(file, &reference.registry)?,
        (None, None) => None,
    };
    let plan = run_async(resolve(
        &reference,
        credentials,
        opts.platform.clone(),
        http.clone(),
    ))?;
    let name = plan.name.clone();
    let http = http.clone();
    let (chunks, path, size) =
        tarwalk::spawn("registry", &format!("{name}: the layer walk"), move |out| {
            walk_layers(&plan, &http, out)
        })?;
    info!(image = %name, disk = %path, size, "found the disk");
    let info = SourceInfo {
        name: format!("{name} (/{path})"),
        length: Some(size),
    };
    Ok(ChunkSource::new(info, chunks))
}

/// The manifest digest an image reference names now (`sha256:HEX`), as a DataImportCron polls
/// it: the tag's manifest (an index stays an index, so the digest is the one CDI records) fetched
/// with the same `Accept`, authentication and TLS as an import, hashed as the registry hashes it.
/// A reference pinned by digest names that digest.
pub async fn manifest_digest(
    spec: &str,
    http: &HttpOptions,
    opts: &RegistryOptions,
) -> Result<String> {
    let reference = Reference::parse(spec)?;
    if let Some(d) = &reference.digest {
        return Ok(d.to_string());
    }
    let credentials = match (&opts.credentials, &opts.auth_file) {
        (Some(c), _) => Some(c.clone()),
        (None, Some(file)) => auth::from_auth_file(file, &reference.registry)?,
        (None, None) => None,
    };
    let mut s = Session::connect(&reference, credentials, http.clone()).await?;
    let (_, body) = s
        .document(
            &format!("manifests/{}", reference.reference),
            Some(manifest::ACCEPT),
            None,
            MAX_DOCUMENT,
        )
        .await?;
    let mut h: Hasher = crate::checksum::Algorithm::Sha256.hasher();
    h.update(&body);
    Ok(h.finish().to_string())
}

/// What resolution found: where the blobs are, how to authorise, which layers.
struct Plan {
    name: String,
    /// `scheme://host[:port]/v2/NAME/`.
    repo_url: Url,
    auth: Arc<BlobAuth>,
    /// Bottom layer first.
    layers: Vec<manifest::Descriptor>,
}

/// The `Authorization` of blob requests, renewed (a new bearer token) when the registry answers
/// 401 because the token expired during a long import.
struct BlobAuth {
    current: Mutex<Option<HeaderValue>>,
    repo_url: Url,
    repository: String,
    name: String,
    credentials: Option<Basic>,
    http: HttpOptions,
}

impl RequestSigner for BlobAuth {
    fn sign(&self, _url: &Url, headers: &mut reqwest::header::HeaderMap) -> Result<()> {
        if let Some(a) = self.current.lock().expect("not poisoned").clone() {
            headers.insert(header::AUTHORIZATION, a);
        }
        Ok(())
    }

    fn renew(&self, challenge: Option<&str>) -> Result<bool> {
        let Some(challenge) = challenge.filter(|c| auth::is_bearer(c)) else {
            return Ok(false);
        };
        info!(image = %self.name, "the registry refused the token (expired?); asking for a new one");
        let authorization = run_async(async {
            let mut s = Session::new(
                self.repo_url.clone(),
                self.repository.clone(),
                self.name.clone(),
                self.credentials.clone(),
                self.http.clone(),
            )?;
            s.authenticate(challenge).await?;
            Ok(s.authorization)
        })?;
        *self.current.lock().expect("not poisoned") = authorization;
        Ok(true)
    }
}

impl Plan {
    fn blob_url(&self, digest: &str) -> Result<Url> {
        blob_url(&self.repo_url, digest)
    }
}

fn blob_url(repo_url: &Url, digest: &str) -> Result<Url> {
    repo_url
        .join(&format!("blobs/{digest}"))
        .map_err(|e| Error::InvalidInput(format!("blob URL for {digest}: {e}")))
}

/// A connection to one repository of one registry, with its authorisation.
struct Session {
    client: Client,
    http: HttpOptions,
    repo_url: Url,
    repository: String,
    name: String,
    credentials: Option<Basic>,
    authorization: Option<HeaderValue>,
}

async fn resolve(
    reference: &Reference,
    credentials: Option<Basic>,
    platform: Option<Platform>,
    http: HttpOptions,
) -> Result<Plan> {
    let mut s = Session::connect(reference, credentials, http).await?;
    let what = reference.display();
    let (ct, body) = s
        .document(
            &format!("manifests/{}", reference.reference),
            Some(manifest::ACCEPT),
            reference.digest.as_ref(),
            MAX_DOCUMENT,
        )
        .await?;
    let mut parsed = Manifest::parse(ct.as_deref(), &body, &what)?;
    if let Manifest::Index(list) = &parsed {
        let wanted = match &platform {
            Some(p) => p.clone(),
            None => Platform::parse(DEFAULT_PLATFORM)?,
        };
        let chosen = manifest::select_platform(list, &wanted, &what)?;
        debug!(image = %what, platform = %wanted, digest = %chosen.digest, "resolved the index");
        let digest = parse_digest(&chosen.digest)?;
        let (ct, body) = s
            .document(
                &format!("manifests/{}", chosen.digest),
                Some(manifest::ACCEPT),
                Some(&digest),
                chosen.size.min(MAX_DOCUMENT),
            )
            .await?;
        parsed = Manifest::parse(ct.as_deref(), &body, &what)?;
    }
    let Manifest::Image { config, layers } = parsed else {
        return Err(Error::Unsupported(format!(
            "{what}: an index inside an index is not supported"
        )));
    };
    let digest = parse_digest(&config.digest)?;
    let (_, body) = s
        .document(
            &format!("blobs/{}", config.digest),
            None,
            Some(&digest),
            config.size.min(MAX_DOCUMENT),
        )
        .await?;
    ImageConfig::parse(&body, &what)?.check(platform.as_ref(), &what)?;
    if layers.is_empty() {
        return Err(Error::Unsupported(format!(
            "{what}: the image has no layers, so no disk"
        )));
    }
    Ok(Plan {
        name: what,
        auth: Arc::new(BlobAuth {
            current: Mutex::new(s.authorization),
            repo_url: s.repo_url.clone(),
            repository: s.repository,
            name: s.name,
            credentials: s.credentials,
            http: s.http,
        }),
        repo_url: s.repo_url,
        layers,
    })
}

impl Session {
    fn new(
        repo_url: Url,
        repository: String,
        name: String,
        credentials: Option<Basic>,
        http: HttpOptions,
    ) -> Result<Session> {
        Ok(Session {
            client: build_client(&http)?,
            http,
            repo_url,
            repository,
            name,
            credentials,
            authorization: None,
        })
    }

    /// Pings the registry (HTTPS; plain HTTP only when insecure and HTTPS failed) and answers
    /// its authentication challenge.
    async fn connect(
        reference: &Reference,
        credentials: Option<Basic>,
        http: HttpOptions,
    ) -> Result<Session> {
        let mut s = Session::new(
            repo_url("https", reference)?,
            reference.repository.clone(),
            reference.display(),
            credentials,
            http,
        )?;
        let pinged = match s.ping().await {
            Err(e) if s.http.insecure => {
                info!(registry = %reference.registry, error = %e, "HTTPS failed; trying plain HTTP (insecure registry)");
                s.repo_url = repo_url("http", reference)?;
                s.ping().await.map_err(|_| e)
            }
            other => other,
        };
        let challenge = pinged?;
        if let Some(challenge) = challenge {
            s.authenticate(&challenge).await?;
        }
        Ok(s)
    }

    /// `GET /v2/`: None when anonymous access is fine, else the `WWW-Authenticate` challenge.
    async fn ping(&self) -> Result<Option<String>> {
        let url = self.url("/v2/")?;
        let resp = self.send(&url, None, None).await?;
        match resp.status() {
            s if s.is_success() => Ok(None),
            StatusCode::UNAUTHORIZED => Ok(Some(
                resp.headers()
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string(),
            )),
            s => Err(Error::SourceRejected(format!(
                "{}: GET {url} answered {s}: not a registry speaking the v2 API",
                self.name
            ))),
        }
    }

    async fn authenticate(&mut self, challenge: &str) -> Result<()> {
        let unauthorised =
            |why: &str| Error::SourceRejected(format!("{}: unauthorised: {why}", self.name));
        let c = auth::parse_challenge(challenge).ok_or_else(|| {
            unauthorised("the registry demands authentication without a usable challenge")
        })?;
        match c.scheme.as_str() {
            "basic" => {
                let creds = self.credentials.as_ref().ok_or_else(|| {
                    unauthorised("the registry demands credentials (give --user with a password, or --auth-file)")
                })?;
                self.authorization = Some(auth::basic_header(creds)?);
            }
            "bearer" => {
                let realm = c.params.get("realm").ok_or_else(|| {
                    unauthorised("the bearer challenge names no token service (realm)")
                })?;
                let mut url = Url::parse(realm).map_err(|e| {
                    unauthorised(&format!("the token service URL {realm:?} is invalid: {e}"))
                })?;
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(service) = c.params.get("service") {
                        q.append_pair("service", service);
                    }
                    q.append_pair("scope", &format!("repository:{}:pull", self.repository));
                }
                let basic = match &self.credentials {
                    Some(c) => Some(auth::basic_header(c)?),
                    None => None,
                };
                let resp = self.send(&url, None, basic.as_ref()).await?;
                let status = resp.status();
                if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                    return Err(unauthorised(&format!(
                        "the token service refused {} ({status})",
                        if self.credentials.is_some() {
                            "the credentials"
                        } else {
                            "anonymous access"
                        }
                    )));
                }
                if !status.is_success() {
                    return Err(Error::SourceRejected(format!(
                        "{}: token service {} answered {status}",
                        self.name,
                        strip_query(&url)
                    )));
                }
                let body =
                    read_limited(resp, MAX_DOCUMENT, self.http.idle_timeout, &self.name).await?;
                let token = auth::parse_token(&body)?;
                self.authorization = Some(auth::header_value(&format!("Bearer {token}"))?);
            }
            other => {
                return Err(unauthorised(&format!(
                    "unsupported authentication scheme {other:?}"
                )));
            }
        }
        Ok(())
    }

    fn url(&self, path: &str) -> Result<Url> {
        self.repo_url
            .join(path)
            .map_err(|e| Error::InvalidInput(format!("{}: URL {path}: {e}", self.name)))
    }

    /// A manifest or blob of the repository, read whole (at most `limit` bytes) and checked
    /// against `digest` when given. Returns the content type and the bytes.
    async fn document(
        &mut self,
        path: &str,
        accept: Option<&str>,
        digest: Option<&Checksum>,
        limit: u64,
    ) -> Result<(Option<String>, Bytes)> {
        let url = self.url(path)?;
        let mut resp = self.send(&url, accept, self.authorization.as_ref()).await?;
        // Registries that answer the ping anonymously may still want a token per repository
        // (or a renewed one): answer the challenge once and ask again.
        if resp.status() == StatusCode::UNAUTHORIZED
            && let Some(challenge) = resp
                .headers()
                .get(header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .filter(|c| auth::is_bearer(c))
                .map(str::to_string)
        {
            self.authenticate(&challenge).await?;
            resp = self.send(&url, accept, self.authorization.as_ref()).await?;
        }
        let status = resp.status();
        if !status.is_success() {
            let why = match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => "unauthorised: ",
                StatusCode::NOT_FOUND => "not found: ",
                _ => "",
            };
            return Err(Error::SourceRejected(format!(
                "{}: {why}GET {url} answered {status}",
                self.name
            )));
        }
        let ct = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_limited(resp, limit, self.http.idle_timeout, &self.name).await?;
        if let Some(expected) = digest {
            let mut h: Hasher = expected.algorithm.hasher();
            h.update(&body);
            verify_digest(expected, h.finish(), url.as_str())?;
        }
        Ok((ct, body))
    }

    /// One GET, retried (with back-off) on connection errors and 408/429/5xx.
    async fn send(
        &self,
        url: &Url,
        accept: Option<&str>,
        authorization: Option<&HeaderValue>,
    ) -> Result<reqwest::Response> {
        let mut failures = 0u32;
        loop {
            let mut rb = self.client.get(url.clone());
            if let Some(a) = accept {
                rb = rb.header(header::ACCEPT, a);
            }
            if let Some(a) = authorization {
                rb = rb.header(header::AUTHORIZATION, a.clone());
            }
            let limit = self.http.connect_timeout + self.http.idle_timeout;
            let (cause, retry_after) = match tokio::time::timeout(limit, rb.send()).await {
                Err(_) => (format!("no response within {limit:?}"), None),
                Ok(Err(e)) => match classify_error(url.as_str(), e) {
                    (e, false) => return Err(e),
                    (e, true) => (e.to_string(), None),
                },
                Ok(Ok(resp)) if http::is_transient(resp.status()) => (
                    format!("GET {} answered {}", strip_query(url), resp.status()),
                    http::retry_after(&resp),
                ),
                Ok(Ok(resp)) => return Ok(resp),
            };
            failures += 1;
            if failures > self.http.max_retries {
                return Err(Error::SourceUnavailable(format!(
                    "{}: giving up after {failures} attempts: {cause}",
                    self.name
                )));
            }
            let delay = backoff_delay(self.http.retry_backoff, failures, retry_after);
            warn!(image = %self.name, attempt = failures, delay_ms = delay.as_millis() as u64, cause = %cause, "registry request failed; retrying");
            tokio::time::sleep(delay).await;
        }
    }
}

fn repo_url(scheme: &str, reference: &Reference) -> Result<Url> {
    Url::parse(&format!(
        "{scheme}://{}/v2/{}/",
        reference.registry, reference.repository
    ))
    .map_err(|e| Error::InvalidInput(format!("registry {:?}: {e}", reference.registry)))
}

fn strip_query(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

/// The layer walk (see the module docs); sends `Found` and the disk's bytes to `tx`.
fn walk_layers(plan: &Plan, http: &HttpOptions, out: &mut WalkOut) -> Result<()> {
    let mut hidden = Whiteouts::default();
    for layer in plan.layers.iter().rev() {
        let digest = parse_digest(&layer.digest)?;
        let what = format!("{} layer {}", plan.name, layer.digest);
        let mut req = HttpRequest::new(plan.blob_url(&layer.digest)?);
        req.name = what.clone();
        req.signer = Some(plan.auth.clone());
        req.expected_length = Some(layer.size);
        let blob = HttpSource::open_request(req, http)?;
        let mut verified = DigestReader::new(blob, digest, layer.size, what.clone());
        let (found, whiteouts) = {
            let peeked = Peeked::new(&mut verified, decode::SNIFF_LEN)
                .map_err(|e| Error::from_read(e, &what))?;
            let compression = layer_compression(&layer.media_type, peeked.head());
            let input: Box<dyn Read + Send + '_> = Box::new(peeked);
            let input = match compression {
                Some(c) => decode::decoder(c, input)?,
                None => input,
            };
            scan_layer(input, &hidden, out, &what)?
        };
        verified.finish()?;
        if found {
            return Ok(());
        }
        hidden.merge(whiteouts);
    }
    Err(Error::Unsupported(format!(
        "{}: no disk in the image: a containerDisk holds its disk as the one regular file under /disk/",
        plan.name
    )))
}

/// Reads one layer tarball; streams the visible disk file if it has one, refusing a second.
/// Returns whether it had the disk, and the layer's whiteouts.
fn scan_layer(
    input: Box<dyn Read + Send + '_>,
    hidden: &Whiteouts,
    out: &mut WalkOut,
    what: &str,
) -> Result<(bool, Whiteouts)> {
    let mut archive = tar::Archive::new(input);
    let mut here = Whiteouts::default();
    let mut found: Option<String> = None;
    for entry in archive.entries().map_err(|e| tar_error(e, what))? {
        let mut entry = entry.map_err(|e| tar_error(e, what))?;
        let path = normalize(&entry.path_bytes())?;
        if here.record(&path) || !in_disk_dir(&path) || hidden.hides(&path) {
            continue;
        }
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        if !(kind.is_file() || kind.is_gnu_sparse() || kind.is_contiguous()) {
            return Err(Error::Unsupported(format!(
                "{what}: /{path} is not a regular file ({kind:?}); the disk must be a regular file under /disk/"
            )));
        }
        if let Some(first) = &found {
            return Err(Error::Unsupported(format!(
                "{what}: two disks, /{first} and /{path}: a containerDisk holds exactly one file under /disk/"
            )));
        }
        let size = entry.size();
        out.stream_file(path.clone(), size, &mut entry, what)?;
        found = Some(path);
    }
    // The rest of the stream (end-of-archive blocks, padding) so the digest covers every byte.
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(|e| tar_error(e, what))?;
    Ok((found.is_some(), here))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn first_entry_error(archive: &[u8]) -> io::Error {
        let mut tar = tar::Archive::new(archive);
        let mut entries = tar.entries().expect("the iterator");
        match entries.next() {
            Some(Err(e)) => e,
            _ => panic!("the tar reader took a broken header"),
        }
    }

    #[test]
    fn the_tar_readers_complaint_is_a_bad_archive() {
        let mut block = [0u8; 1024];
        block[..9].copy_from_slice(b"disk.qcow");
        block[257..263].copy_from_slice(b"ustar\0");
        block[148..156].copy_from_slice(b"0000001\0"); // not the header's checksum
        let e = tar_error(first_entry_error(&block), "layer sha256:ab");
        assert_eq!(e.kind(), ErrorKind::CorruptImage);
        assert!(
            e.to_string()
                .contains("layer sha256:ab: not a valid tar archive:"),
            "{e}"
        );
    }

    #[test]
    fn a_spill_file_that_fails_to_read_back_is_a_local_failure() {
        let eio = io::Error::from_raw_os_error(libc::EIO);
        let e = tar_error(
            Error::io("reading the spill file", eio).into_io(),
            "OVA a.ova",
        );
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(!e.to_string().contains("tar"), "{e}");
    }

    #[test]
    fn a_system_read_failure_is_a_local_failure() {
        let e = tar_error(io::Error::from_raw_os_error(libc::EIO), "OVA a.ova");
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e.to_string().contains("reading OVA a.ova"), "{e}");
    }

    #[test]
    fn our_source_errors_keep_their_kind() {
        let gone = Error::SourceUnavailable("the registry stopped answering".into());
        let e = tar_error(gone.into_io(), "layer sha256:ab");
        assert_eq!(e.kind(), ErrorKind::SourceUnavailable);
    }

    #[test]
    fn a_cut_short_archive_is_truncated() {
        let e = tar_error(
            io::Error::new(io::ErrorKind::UnexpectedEof, "end of stream"),
            "OVA a.ova",
        );
        assert_eq!(e.kind(), ErrorKind::CorruptImage);
        assert!(e.to_string().contains("truncated"), "{e}");
    }
}
