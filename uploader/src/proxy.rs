//! The upload proxy, as CDI's `cdi-uploadproxy`: checks the `Authorization: Bearer` upload token
//! (400 when missing or not a JWT, 401 when its signature, times or claims are wrong, 431 when
//! the header is too large to hold one), then streams the request to the upload server of the
//! PVC the token names, and streams the answer back. Nothing is buffered. The upload server's address comes from a template (CDI's default
//! `https://cdi-upload-{pvc}.{namespace}.svc`) or from static `NAMESPACE/PVC=URL` routes;
//! a PVC with no route, or a server that cannot be reached, gets 503. CORS preflights are
//! answered so browsers can upload.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use token::PublicKey;

use crate::error::{Error, Result};
use crate::net::text;

use crate::{UPLOAD_CHECKSUM, UPLOAD_LENGTH, UPLOAD_OFFSET, UPLOAD_STATE};
use importer::error::chain;

/// CDI's upload server address for a PVC.
pub const DEFAULT_TEMPLATE: &str = "https://cdi-upload-{pvc}.{namespace}.svc";

/// Longest `Authorization` header read (CDI's tokens are under 2 KiB); longer ones get 431.
const MAX_AUTHORIZATION: usize = 16 << 10;

/// The pause between those tries.
const UPSTREAM_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

/// Request headers passed on to the upload server.
const FORWARDED: [&str; 4] = [
    "content-type",
    "content-length",
    UPLOAD_OFFSET,
    UPLOAD_CHECKSUM,
];
/// Answer headers passed back to the client.
const RETURNED: [&str; 4] = ["content-type", UPLOAD_OFFSET, UPLOAD_LENGTH, UPLOAD_STATE];

/// Where tokens' PVCs are served.
#[derive(Debug, Clone)]
pub enum Upstreams {
    /// `{pvc}` and `{namespace}` are replaced by the token's claims.
    Template(String),
    /// Only these `(namespace, pvc)` have an upload server.
    Static(BTreeMap<(String, String), String>),
}

impl Upstreams {
    /// The upload server base URL for a PVC, if it has one.
    pub fn url(&self, namespace: &str, pvc: &str) -> Option<String> {
        match self {
            Upstreams::Template(t) => {
                Some(t.replace("{pvc}", pvc).replace("{namespace}", namespace))
            }
            Upstreams::Static(routes) => routes
                .get(&(namespace.to_string(), pvc.to_string()))
                .cloned(),
        }
    }

    /// Parses a `NAMESPACE/PVC=URL` route.
    pub fn parse_route(s: &str) -> Result<((String, String), String)> {
        let bad = || Error::InvalidInput(format!("route {s:?} is not NAMESPACE/PVC=URL"));
        let (pvc, url) = s.split_once('=').ok_or_else(bad)?;
        let (ns, name) = pvc.split_once('/').ok_or_else(bad)?;
        if ns.is_empty()
            || name.is_empty()
            || !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(bad());
        }
        Ok((
            (ns.to_string(), name.to_string()),
            url.trim_end_matches('/').to_string(),
        ))
    }
}

pub struct Proxy {
    pub public_key: PublicKey,
    pub upstreams: Upstreams,
    /// The client to upload servers, following rotated certificate files.
    pub client: crate::reload::ReloadingUpstream,
    /// How long a refused connection to an upload server is tried again (then 503).
    pub upstream_wait: std::time::Duration,
}

/// The proxy's router.
pub fn router(proxy: Proxy) -> Router {
    let proxy = Arc::new(proxy);
    let mut r = Router::new().route("/healthz", get(|| async { "OK" }));
    for path in crate::upload_paths() {
        r = r.route(path, any(forward));
    }
    r.with_state(proxy)
}

fn cors(headers: &mut HeaderMap) {
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("upload-offset, upload-length, upload-state"),
    );
}

fn preflight() -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    cors(h);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, HEAD, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type, upload-offset, upload-checksum"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    resp
}

async fn forward(State(proxy): State<Arc<Proxy>>, req: Request) -> Response {
    let mut resp = relay(&proxy, req).await;
    cors(resp.headers_mut());
    resp
}

async fn relay(proxy: &Proxy, req: Request) -> Response {
    if req.method() == Method::OPTIONS {
        return preflight();
    }
    let (parts, body) = req.into_parts();
    let body = body.into_data_stream();
    let (pvc, base) = match route(proxy, &parts.headers) {
        Ok(routed) => routed,
        Err((status, why)) => {
            crate::net::drain(body);
            return text(status, why);
        }
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let url = format!("{}{path_and_query}", base.trim_end_matches('/'));
    tracing::debug!(%pvc, method = %parts.method, %url, "forwarding");

    let method = parts.method.clone();
    let mut headers = HeaderMap::new();
    for name in FORWARDED {
        if let Some(v) = parts.headers.get(name) {
            headers.insert(HeaderName::from_static(name), v.clone());
        }
    }
    // A server just started may not listen yet (its Service routes to it once it has an
    // address), or not be behind its Service yet (the endpoints and every node's proxy rules
    // follow the pod): a refused connection is tried again for a while, the body being
    // untouched until the connection is made.
    let deadline = tokio::time::Instant::now() + proxy.upstream_wait;
    let mut body = Some(body);
    let answer = loop {
        let mut upstream = proxy
            .client
            .get()
            .request(method.clone(), &url)
            .headers(headers.clone());
        // The body is lent to the client, and taken back if it was never sent.
        let (lent, unsent) = crate::net::Reclaim::new(body.take().expect("the body is back"));
        if method != Method::HEAD && method != Method::GET {
            let body = importer::chunks::Coalesce::new(lent);
            upstream = upstream.body(reqwest::Body::wrap_stream(body));
        }
        match upstream.send().await {
            Ok(answer) => break answer,
            Err(e) => {
                let back = unsent.take_back();
                if e.is_connect() && tokio::time::Instant::now() < deadline && back.is_some() {
                    body = back;
                    tokio::time::sleep(UPSTREAM_RETRY).await;
                    continue;
                }
                if let Some(body) = back {
                    crate::net::drain(body);
                }
                return forwarding_failed(&pvc, &e);
            }
        }
    };
    let mut resp = Response::builder().status(answer.status().as_u16());
    for name in RETURNED {
        if let Some(v) = answer.headers().get(name) {
            resp = resp.header(name, v.clone());
        }
    }
    resp.body(Body::from_stream(answer.bytes_stream()))
        .unwrap_or_else(|e| text(StatusCode::BAD_GATEWAY, e.to_string()))
}

/// 503 when the upload server cannot be reached (not up yet), 502 when forwarding broke.
fn forwarding_failed(pvc: &str, e: &reqwest::Error) -> Response {
    if e.is_connect() {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the upload server of PVC {pvc} is not reachable: {}",
                chain(e)
            ),
        );
    }
    tracing::warn!(%pvc, error = %chain(e), "forwarding failed");
    text(
        StatusCode::BAD_GATEWAY,
        format!(
            "forwarding to the upload server of PVC {pvc} failed: {}",
            chain(e)
        ),
    )
}

/// The PVC the request's token names and its upload server's base URL, or the refusal.
fn route(
    proxy: &Proxy,
    headers: &HeaderMap,
) -> std::result::Result<(String, String), (StatusCode, String)> {
    let Some(auth) = headers.get(header::AUTHORIZATION) else {
        return Err((StatusCode::BAD_REQUEST, "no Authorization header".into()));
    };
    if auth.len() > MAX_AUTHORIZATION {
        return Err((
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "the Authorization header is {} bytes; upload tokens are under {MAX_AUTHORIZATION}",
                auth.len()
            ),
        ));
    }
    let Some(bearer) = auth.to_str().ok().and_then(token::bearer) else {
        return Err((
            StatusCode::BAD_REQUEST,
            "the Authorization header is not 'Bearer <token>'".into(),
        ));
    };
    let claims = match token::verify(bearer, &proxy.public_key, token::now()) {
        Ok(claims) => claims,
        Err(e @ token::Error::MalformedToken(_)) => {
            return Err((StatusCode::BAD_REQUEST, e.to_string()));
        }
        Err(e) => {
            tracing::info!(error = %e, "refused a token");
            return Err((StatusCode::UNAUTHORIZED, e.to_string()));
        }
    };
    let pvc = format!("{}/{}", claims.namespace, claims.name);
    match proxy.upstreams.url(&claims.namespace, &claims.name) {
        Some(base) => Ok((pvc, base)),
        None => Err((
            StatusCode::SERVICE_UNAVAILABLE,
            format!("rejecting the upload for PVC {pvc}: it has no upload server"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_and_static_routes() {
        let t = Upstreams::Template(DEFAULT_TEMPLATE.into());
        assert_eq!(
            t.url("vms", "disk").unwrap(),
            "https://cdi-upload-disk.vms.svc"
        );
        let (key, url) = Upstreams::parse_route("vms/disk=http://127.0.0.1:1234/").unwrap();
        let s = Upstreams::Static([(key, url)].into());
        assert_eq!(s.url("vms", "disk").unwrap(), "http://127.0.0.1:1234");
        assert_eq!(s.url("vms", "other"), None);
        assert_eq!(s.url("other", "disk"), None);
        for bad in [
            "vms/disk",
            "disk=http://x",
            "/d=http://x",
            "vms/disk=ftp://x",
        ] {
            assert!(Upstreams::parse_route(bad).is_err(), "{bad}");
        }
    }
}
