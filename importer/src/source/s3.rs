//! S3 source: one object read with path-style `GET`s signed with AWS Signature Version 4.
//!
//! The transfer itself is an [`HttpSource`]: the same TLS options, retries with back-off, ranged
//! resume (`Range` + `If-Range` on the object's ETag) and length checks. Only the signing is S3's
//! own: every attempt is signed afresh (a signature carries its time and S3 refuses it after 15
//! minutes), with `x-amz-content-sha256: UNSIGNED-PAYLOAD` (GETs have no body), and `Range` /
//! `If-Range` left out of the signed headers so a resumed request needs no other signature.
//!
//! Addressing is path-style (`ENDPOINT/BUCKET/KEY`), which every S3-compatible server (MinIO,
//! Ceph RGW, SeaweedFS) and AWS accept. Without credentials the request is sent unsigned (public
//! objects). Presigned URLs need none of this: they are plain `https://` sources.

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{KeyInit, Mac};
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::source::http::{HttpOptions, HttpRequest, HttpSource, RequestSigner};
use crate::source::object;
use netkit::{percent_decode, percent_encode};

/// The region signatures are scoped to when none is given or derivable (as CDI does).
pub const DEFAULT_REGION: &str = "us-east-1";
const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// S3 access keys. `Debug` redacts the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Temporary credentials' session token (`x-amz-security-token`).
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`), when both are set.
    pub fn from_env() -> Option<Credentials> {
        let id = std::env::var("AWS_ACCESS_KEY_ID").ok()?;
        let secret = std::env::var("AWS_SECRET_ACCESS_KEY").ok()?;
        Some(Credentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: std::env::var("AWS_SESSION_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
        })
    }

    /// Reads the keys CDI takes from its S3 Secret, `accessKeyId` and `secretKey`, from either a
    /// directory holding one file per key (a mounted Secret) or one file of `key=value` or
    /// `key: value` lines (or a JSON object with those keys).
    pub fn from_file(path: &Path) -> Result<Credentials> {
        let read = |p: &Path| {
            std::fs::read_to_string(p)
                .map_err(|e| Error::io(format!("reading S3 credentials {}", p.display()), e))
        };
        let (id, secret) = if path.is_dir() {
            let id = read(&path.join("accessKeyId"))?;
            let secret = read(&path.join("secretKey"))?;
            (id.trim().to_string(), secret.trim().to_string())
        } else {
            let text = read(path)?;
            let pairs = parse_key_values(&text).ok_or_else(|| {
                Error::InvalidInput(format!(
                    "S3 credentials file {} is neither JSON nor key=value lines",
                    path.display()
                ))
            })?;
            let get = |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.clone())
            };
            match (get("accessKeyId"), get("secretKey")) {
                (Some(id), Some(secret)) => (id, secret),
                _ => {
                    return Err(Error::InvalidInput(format!(
                        "S3 credentials file {} lacks accessKeyId or secretKey",
                        path.display()
                    )));
                }
            }
        };
        if id.is_empty() || secret.is_empty() {
            return Err(Error::InvalidInput(format!(
                "S3 credentials in {} have an empty accessKeyId or secretKey",
                path.display()
            )));
        }
        Ok(Credentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: None,
        })
    }
}

/// `key=value` / `key: value` lines (blank lines and `#` comments skipped), or a flat JSON object
/// of strings.
fn parse_key_values(text: &str) -> Option<Vec<(String, String)>> {
    if text.trim_start().starts_with('{') {
        let map: std::collections::BTreeMap<String, String> = serde_json::from_str(text).ok()?;
        return Some(map.into_iter().collect());
    }
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').or_else(|| line.split_once(':'))?;
        let v = v.trim().trim_matches('"');
        out.push((k.trim().to_string(), v.to_string()));
    }
    Some(out)
}

/// How to reach S3.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    /// `http(s)://host[:port]` of the S3 service; `s3://` sources need it unless they are on AWS
    /// (`https://s3.REGION.amazonaws.com`).
    pub endpoint: Option<String>,
    /// Signing region; default: from an AWS endpoint's host, else `us-east-1`.
    pub region: Option<String>,
    /// None: unsigned requests (public objects).
    pub credentials: Option<Credentials>,
}

/// One object: the endpoint it lives on, its bucket and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Object {
    pub endpoint: Url,
    pub bucket: String,
    pub key: String,
}

impl S3Object {
    /// `s3://BUCKET/KEY` (on `opts.endpoint`), or CDI's form `http(s)://HOST[:PORT]/BUCKET/KEY`.
    pub fn parse(spec: &str, opts: &S3Options) -> Result<S3Object> {
        let o = object::parse(spec, "s3://", "S3", || match &opts.endpoint {
            Some(e) => e.clone(),
            None => format!("https://s3.{}.amazonaws.com", region_for(None, opts)),
        })?;
        Ok(S3Object {
            endpoint: o.endpoint,
            bucket: o.bucket,
            key: o.key,
        })
    }

    /// The path-style URL of the object.
    pub fn url(&self) -> Url {
        object::url(&self.endpoint, &self.bucket, &self.key)
    }

    pub fn name(&self) -> String {
        format!("s3://{}/{} at {}", self.bucket, self.key, self.endpoint)
    }
}

/// The signing region: the option, else `s3.REGION.amazonaws.com` / `s3-REGION.amazonaws.com`
/// in the endpoint's host, else [`DEFAULT_REGION`].
fn region_for(endpoint: Option<&Url>, opts: &S3Options) -> String {
    if let Some(r) = &opts.region {
        return r.clone();
    }
    let host = endpoint.and_then(|u| u.host_str()).unwrap_or("");
    if let Some(rest) = host.strip_suffix(".amazonaws.com") {
        let label = rest.rsplit('.').next().unwrap_or(rest);
        let region = label
            .strip_prefix("s3-")
            .or_else(|| rest.strip_prefix("s3.").filter(|r| !r.contains('.')));
        if let Some(r) = region.filter(|r| !r.is_empty() && *r != "dualstack") {
            return r.to_string();
        }
    }
    DEFAULT_REGION.to_string()
}

/// Opens an S3 object as a byte source.
pub fn open(spec: &str, s3: &S3Options, http: &HttpOptions) -> Result<HttpSource> {
    let object = S3Object::parse(spec, s3)?;
    let mut req = HttpRequest::new(object.url());
    req.name = object.name();
    req.signer = signer(&object, s3).map(|s| Arc::new(s) as Arc<dyn RequestSigner>);
    HttpSource::open_request(req, http)
}

/// The SigV4 signer of `object`'s requests; None for unsigned (public) access.
pub fn signer(object: &S3Object, s3: &S3Options) -> Option<SigV4> {
    s3.credentials.as_ref().map(|creds| SigV4 {
        credentials: creds.clone(),
        region: region_for(Some(&object.endpoint), s3),
        service: "s3".into(),
    })
}

/// AWS Signature Version 4 for one service and region.
#[derive(Debug, Clone)]
pub struct SigV4 {
    pub credentials: Credentials,
    pub region: String,
    pub service: String,
}

impl SigV4 {
    /// The `Authorization` header for a request: `headers` are the headers to sign besides
    /// `host` (lower-case names), `payload_hash` the hex SHA-256 of the body or
    /// `UNSIGNED-PAYLOAD`, `amz_date` the request's `x-amz-date` (`YYYYMMDDTHHMMSSZ`).
    pub fn authorization(
        &self,
        method: &str,
        url: &Url,
        headers: &[(&str, &str)],
        payload_hash: &str,
        amz_date: &str,
    ) -> String {
        let mut all: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        all.push(("host".into(), host_header(url)));
        all.sort();
        let signed: Vec<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
        let signed = signed.join(";");
        let canonical_headers: String = all.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let canonical = format!(
            "{method}\n{}\n{}\n{canonical_headers}\n{signed}\n{payload_hash}",
            canonical_uri(url),
            canonical_query(url)
        );
        let (scope, signature) = self.signature(&canonical, amz_date);
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            self.credentials.access_key_id
        )
    }

    /// A presigned `GET` URL valid for `expires` seconds from `amz_date` (query-string auth).
    pub fn presign(&self, url: &Url, expires: u64, amz_date: &str) -> Url {
        let scope = self.scope(&amz_date[..8]);
        let mut url = url.clone();
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("X-Amz-Algorithm", "AWS4-HMAC-SHA256");
            q.append_pair(
                "X-Amz-Credential",
                &format!("{}/{scope}", self.credentials.access_key_id),
            );
            q.append_pair("X-Amz-Date", amz_date);
            q.append_pair("X-Amz-Expires", &expires.to_string());
            if let Some(t) = &self.credentials.session_token {
                q.append_pair("X-Amz-Security-Token", t);
            }
            q.append_pair("X-Amz-SignedHeaders", "host");
        }
        let canonical = format!(
            "GET\n{}\n{}\nhost:{}\n\nhost\n{UNSIGNED_PAYLOAD}",
            canonical_uri(&url),
            canonical_query(&url),
            host_header(&url)
        );
        let (_, signature) = self.signature(&canonical, amz_date);
        url.query_pairs_mut()
            .append_pair("X-Amz-Signature", &signature);
        url
    }

    fn scope(&self, date: &str) -> String {
        format!("{date}/{}/{}/aws4_request", self.region, self.service)
    }

    /// `(credential scope, hex signature)` of a canonical request.
    fn signature(&self, canonical: &str, amz_date: &str) -> (String, String) {
        let date = &amz_date[..8.min(amz_date.len())];
        let scope = self.scope(date);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            hex::encode(Sha256::digest(canonical.as_bytes()))
        );
        let key = format!("AWS4{}", self.credentials.secret_access_key);
        let k = hmac(key.as_bytes(), date.as_bytes());
        let k = hmac(&k, self.region.as_bytes());
        let k = hmac(&k, self.service.as_bytes());
        let k = hmac(&k, b"aws4_request");
        (scope, hex::encode(hmac(&k, to_sign.as_bytes())))
    }
}

impl RequestSigner for SigV4 {
    fn sign(&self, url: &Url, headers: &mut HeaderMap) -> Result<()> {
        let amz_date = amz_date(SystemTime::now());
        let mut signed = vec![
            ("x-amz-content-sha256", UNSIGNED_PAYLOAD),
            ("x-amz-date", amz_date.as_str()),
        ];
        if let Some(t) = &self.credentials.session_token {
            signed.push(("x-amz-security-token", t.as_str()));
        }
        let auth = self.authorization("GET", url, &signed, UNSIGNED_PAYLOAD, &amz_date);
        signed.push(("authorization", &auth));
        for (k, v) in signed {
            let v = HeaderValue::from_str(v)
                .map_err(|e| Error::InvalidInput(format!("S3 header {k}: {e}")))?;
            headers.insert(HeaderName::from_static(k), v);
        }
        Ok(())
    }
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// `host[:port]` as the request's `Host` header carries it (default ports omitted).
fn host_header(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    }
}

/// The path with every segment decoded and re-encoded strictly (S3 does not double-encode).
fn canonical_uri(url: &Url) -> String {
    let path = url.path();
    if path.is_empty() {
        return "/".into();
    }
    percent_encode(&percent_decode(path), true)
}

/// Query parameters encoded strictly and sorted by name, then value.
fn canonical_query(url: &Url) -> String {
    let mut pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (percent_encode(&k, false), percent_encode(&v, false)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// `YYYYMMDDTHHMMSSZ` in UTC.
pub fn amz_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example_signer() -> SigV4 {
        SigV4 {
            credentials: Credentials {
                access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
                secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
                session_token: None,
            },
            region: "us-east-1".into(),
            service: "s3".into(),
        }
    }

    /// AWS's documented example "GET Object" (Signature Version 4, header authentication).
    #[test]
    fn signs_the_documented_get_object_example() {
        let url = Url::parse("https://examplebucket.s3.amazonaws.com/test.txt").unwrap();
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let auth = example_signer().authorization(
            "GET",
            &url,
            &[
                ("Range", "bytes=0-9"),
                ("x-amz-content-sha256", empty),
                ("x-amz-date", "20130524T000000Z"),
            ],
            empty,
            "20130524T000000Z",
        );
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    /// AWS's documented presigned-URL example (query-string authentication, 86400 s).
    #[test]
    fn presigns_the_documented_example() {
        let url = Url::parse("https://examplebucket.s3.amazonaws.com/test.txt").unwrap();
        let signed = example_signer().presign(&url, 86_400, "20130524T000000Z");
        let sig = signed
            .query_pairs()
            .find(|(k, _)| k == "X-Amz-Signature")
            .map(|(_, v)| v.into_owned());
        assert_eq!(
            sig.as_deref(),
            Some("aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404")
        );
    }

    #[test]
    fn amz_dates() {
        assert_eq!(amz_date(UNIX_EPOCH), "19700101T000000Z");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_369_353_600);
        assert_eq!(amz_date(t), "20130524T000000Z");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400 + 86_399);
        assert_eq!(amz_date(t), "20000229T235959Z");
    }

    #[test]
    fn object_urls_and_forms() {
        let opts = S3Options {
            endpoint: Some("http://127.0.0.1:9000".into()),
            ..Default::default()
        };
        let o = S3Object::parse("s3://bkt/dir/a b+c.img", &opts).unwrap();
        assert_eq!(
            (o.bucket.as_str(), o.key.as_str()),
            ("bkt", "dir/a b+c.img")
        );
        assert_eq!(
            o.url().as_str(),
            "http://127.0.0.1:9000/bkt/dir/a%20b%2Bc.img"
        );
        assert_eq!(canonical_uri(&o.url()), "/bkt/dir/a%20b%2Bc.img");
        let cdi = S3Object::parse("https://minio.example:9000/bkt/dir/x.qcow2", &opts).unwrap();
        assert_eq!(cdi.endpoint.as_str(), "https://minio.example:9000/");
        assert_eq!(cdi.key, "dir/x.qcow2");
        let aws = S3Object::parse("s3://b/k", &S3Options::default()).unwrap();
        assert_eq!(aws.endpoint.as_str(), "https://s3.us-east-1.amazonaws.com/");
        for bad in ["s3://bucket-only", "s3:///key", "ftp://h/b/k"] {
            assert_eq!(
                S3Object::parse(bad, &opts).unwrap_err().kind(),
                crate::ErrorKind::InvalidInput,
                "{bad}"
            );
        }
    }

    /// An `&` or `=` in a key is part of the path, not a form separator: the signed path and
    /// the key read from a CDI URL keep them (the form decoder used before cut the key at `&`).
    #[test]
    fn keys_with_ampersands_sign_and_parse_whole() {
        let endpoint = Some("http://127.0.0.1:9000".to_string());
        let opts = S3Options {
            endpoint,
            ..S3Options::default()
        };
        let o = S3Object::parse("s3://bkt/a&b=c.img", &opts).unwrap();
        assert_eq!(o.key, "a&b=c.img");
        assert_eq!(canonical_uri(&o.url()), "/bkt/a%26b%3Dc.img");
        let cdi = S3Object::parse("http://127.0.0.1:9000/bkt/x&y.img", &opts).unwrap();
        assert_eq!(cdi.key, "x&y.img");
    }

    #[test]
    fn regions_from_aws_hosts() {
        let o = S3Options::default();
        let r = |h: &str| region_for(Some(&Url::parse(h).unwrap()), &o);
        assert_eq!(r("https://s3.eu-west-1.amazonaws.com"), "eu-west-1");
        assert_eq!(r("https://s3-us-west-2.amazonaws.com"), "us-west-2");
        assert_eq!(r("http://127.0.0.1:8333"), DEFAULT_REGION);
        let set = S3Options {
            region: Some("r1".into()),
            ..Default::default()
        };
        assert_eq!(region_for(None, &set), "r1");
    }

    #[test]
    fn credentials_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("creds");
        std::fs::write(&f, "accessKeyId=AK\nsecretKey: \"SK\"\n").unwrap();
        let c = Credentials::from_file(&f).unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.secret_access_key.as_str()),
            ("AK", "SK")
        );
        std::fs::write(&f, r#"{"accessKeyId":"A2","secretKey":"S2"}"#).unwrap();
        assert_eq!(Credentials::from_file(&f).unwrap().access_key_id, "A2");
        let secret = dir.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("accessKeyId"), "A3\n").unwrap();
        std::fs::write(secret.join("secretKey"), "S3\n").unwrap();
        let c = Credentials::from_file(&secret).unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.secret_access_key.as_str()),
            ("A3", "S3")
        );
        std::fs::write(&f, "user=x\n").unwrap();
        assert_eq!(
            Credentials::from_file(&f).unwrap_err().kind(),
            crate::ErrorKind::InvalidInput
        );
        assert!(!format!("{c:?}").contains("S3\""), "{c:?}");
    }
}
