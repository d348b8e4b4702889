//! Object-store addressing shared by the S3 and GCS sources: `SCHEME://BUCKET/KEY` on the
//! store's endpoint, or CDI's path-style form `http(s)://HOST[:PORT]/BUCKET/KEY`, which names its
//! endpoint; and back to the path-style URL the object is read from.

use reqwest::Url;

use crate::error::{Error, Result};
use netkit::{percent_decode, percent_encode};

/// One object: the endpoint it lives on, its bucket and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Addressed {
    pub endpoint: Url,
    pub bucket: String,
    pub key: String,
}

/// Reads `spec`: `scheme` (`"s3://"`, `"gs://"`) + `BUCKET/KEY` on the endpoint `endpoint`
/// gives (asked only for that form; the key as written), or `http(s)://HOST[:PORT]/BUCKET/KEY`
/// (the key percent-decoded). `store` names the store in errors (`"S3"`, `"GCS"`).
pub(crate) fn parse(
    spec: &str,
    scheme: &str,
    store: &str,
    endpoint: impl FnOnce() -> String,
) -> Result<Addressed> {
    let bad = |why: &str| Error::InvalidInput(format!("{store} source {spec:?}: {why}"));
    let (endpoint, path) = if let Some(rest) = strip_prefix_ci(spec, scheme) {
        (endpoint(), rest.to_string())
    } else {
        let url = Url::parse(spec).map_err(|e| bad(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad(&format!(
                "expected {scheme}BUCKET/KEY or http(s)://HOST/BUCKET/KEY"
            )));
        }
        let endpoint = format!(
            "{}://{}",
            url.scheme(),
            &url[url::Position::BeforeHost..url::Position::AfterPort]
        );
        (endpoint, percent_decode(url.path()))
    };
    let endpoint = Url::parse(&endpoint)
        .map_err(|e| Error::InvalidInput(format!("invalid {store} endpoint {endpoint:?}: {e}")))?;
    if !matches!(endpoint.scheme(), "http" | "https") || endpoint.host_str().is_none() {
        return Err(Error::InvalidInput(format!(
            "{store} endpoint {endpoint} is not an http(s)://HOST[:PORT] URL"
        )));
    }
    let path = path.trim_start_matches('/');
    let (bucket, key) = path
        .split_once('/')
        .ok_or_else(|| bad("expected a bucket and a key"))?;
    if bucket.is_empty() || key.is_empty() {
        return Err(bad("the bucket or the key is empty"));
    }
    Ok(Addressed {
        endpoint,
        bucket: bucket.to_string(),
        key: key.to_string(),
    })
}

/// The path-style URL `ENDPOINT/BUCKET/KEY`, each part percent-encoded strictly (the key's `/`
/// kept).
pub(crate) fn url(endpoint: &Url, bucket: &str, key: &str) -> Url {
    let mut url = endpoint.clone();
    url.set_path(&format!(
        "/{}/{}",
        percent_encode(bucket, false),
        percent_encode(key, true)
    ));
    url.set_query(None);
    url
}

/// `s` without `prefix`, compared case-insensitively (URL schemes).
pub(crate) fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    s.get(..prefix.len())
        .filter(|head| head.eq_ignore_ascii_case(prefix))
        .map(|_| &s[prefix.len()..])
}
