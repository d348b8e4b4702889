//! `quarry apiserver`: CDI's upload token API, `upload.cdi.kubevirt.io` (`v1beta1` and
//! `v1alpha1`), served as an aggregated API server behind an `APIService`. It is what
//! `virtctl image-upload` calls first: `POST .../namespaces/NS/uploadtokenrequests` with
//! `spec.pvcName` returns the object with `status.token`, the PS256 upload token the upload
//! proxy verifies (the same as `quarry upload-token` issues).
//!
//! Requests come from the kube-apiserver's front proxy ([`auth`]): a client certificate of the
//! request-header CA, the user in `X-Remote-*` headers. The user's right to `create`
//! `uploadtokenrequests` in the namespace is asked of the API server with a SubjectAccessReview,
//! as CDI's cdi-apiserver does; then the PVC must exist and be an upload target.
//! Discovery (`/apis`, the group, each version), `/healthz`, `/readyz` and `/openapi/v2` are
//! open to all, as the aggregator reads them.
//!
//! It also serves CDI's DataVolume validating webhook at
//! [`api::names::webhook::DATAVOLUME_PATH`] and its mutating webhook at
//! [`api::names::webhook::DATAVOLUME_MUTATE_PATH`] ([`crate::datavolume::admission`]), as
//! CDI's cdi-apiserver does: the API server calls them over TLS like any webhook. The mutating
//! one authorizes clones and signs their clone token with the upload token key.

pub mod auth;
mod discovery;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::PostParams;
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};

use auth::RequestHeaderConfig;
pub use discovery::{RESOURCE, VERSIONS};
use kubekit::error::{Error, Result};
use kubekit::kubeops;

use api::names::UPLOAD_API_GROUP as GROUP;

use crate::datavolume::ANN_UPLOAD_TARGET as UPLOAD_TARGET_ANNOTATION;
use crate::datavolume::admission;
use crate::settings::Config as DataVolumeConfig;
use api::names::webhook::{DATAVOLUME_MUTATE_PATH, DATAVOLUME_PATH};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};

/// `quarry apiserver`.
#[derive(clap::Args, Debug)]
pub struct ApiServerArgs {
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Serving certificate (PEM).
    #[arg(long, value_name = "PEM")]
    pub tls_cert: PathBuf,
    /// Serving key (PEM).
    #[arg(long, value_name = "PEM")]
    pub tls_key: PathBuf,
    /// The RSA private key (PEM) that signs upload tokens; the upload proxy holds its public key.
    #[arg(long, value_name = "PEM")]
    pub signing_key: PathBuf,
    /// How long an issued token is valid, in seconds (CDI: 5 minutes).
    #[arg(long, default_value_t = 300)]
    pub token_ttl: u64,
    /// The front proxy's CA (PEM) [default: `requestheader-client-ca-file` of the
    /// `kube-system/extension-apiserver-authentication` ConfigMap, with its other
    /// `requestheader-*` settings].
    #[arg(long, value_name = "PEM")]
    pub requestheader_client_ca: Option<PathBuf>,
    /// A common name the front proxy's certificate may have; repeatable (none: any the CA signed).
    #[arg(long = "requestheader-allowed-name", value_name = "CN")]
    pub requestheader_allowed_names: Vec<String>,
}

/// What the handlers share.
struct App {
    client: kube::Client,
    auth: RequestHeaderConfig,
    signing_key: token::PrivateKey,
    token_ttl: Duration,
}

/// The peer of one connection: the common name of its verified client certificate, if any.
#[derive(Debug, Clone)]
pub struct Peer {
    pub common_name: Option<String>,
}

/// Runs the token API until SIGTERM.
pub async fn run(args: ApiServerArgs) -> Result<()> {
    let client = kubeops::cluster_client("apiserver").await?;
    let bound = start(client, &args).await?;
    tracing::info!(%bound, "serving {GROUP}");
    netkit::runtime::terminated().await;
    Ok(())
}

/// Starts serving with `client` in a background task; returns the bound address.
pub async fn start(client: kube::Client, args: &ApiServerArgs) -> Result<SocketAddr> {
    let (auth, ca_pem) = match &args.requestheader_client_ca {
        Some(path) => (
            RequestHeaderConfig {
                allowed_names: args.requestheader_allowed_names.clone(),
                ..RequestHeaderConfig::default()
            },
            std::fs::read_to_string(path)
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?,
        ),
        None => front_proxy_from_cluster(&client).await?,
    };
    let signing_key = token::load_private_key(&args.signing_key)
        .map_err(|e| Error::Config(netkit::error::chain(&e)))?;
    let tls = tls_config(&args.tls_cert, &args.tls_key, &ca_pem)?;
    let app = App {
        client,
        auth,
        signing_key,
        token_ttl: Duration::from_secs(args.token_ttl),
    };
    serve(args.listen, tls, app).await
}

/// The front-proxy settings the cluster publishes in `kube-system` (ConfigMap
/// `extension-apiserver-authentication`): what `quarry apiserver` trusts without
/// `--requestheader-client-ca`. Returns the settings and the CA bundle (PEM).
pub async fn front_proxy_from_cluster(
    client: &kube::Client,
) -> Result<(RequestHeaderConfig, String)> {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "kube-system");
    let cm = cms.get("extension-apiserver-authentication").await?;
    RequestHeaderConfig::from_configmap(&cm.data.unwrap_or_default()).map_err(|e| {
        Error::Config(format!(
            "kube-system/extension-apiserver-authentication: {e}"
        ))
    })
}

/// The TLS setup: the serving identity, and client certificates verified against the front
/// proxy's CA when one is offered (discovery stays open to clients without one).
fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    ca_pem: &str,
) -> Result<rustls::ServerConfig> {
    let bad = |what: &str, e: &dyn std::fmt::Display| Error::Config(format!("{what}: {e}"));
    let provider = netkit::tls::provider();
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let c = c.map_err(|e| bad("the request-header CA", &e))?;
        roots.add(c).map_err(|e| bad("the request-header CA", &e))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| bad("the request-header CA", &e))?;
    let identity = kubekit::tls::identity(cert, key)?;
    netkit::tls::server_config_with(identity, Some(verifier), netkit::tls::Alpn::H2AndHttp1)
        .map_err(|e| bad("the serving certificate", &e))
}

/// Serves the API on `addr` in a background task; returns the bound address.
async fn serve(addr: SocketAddr, tls: rustls::ServerConfig, app: App) -> Result<SocketAddr> {
    let (tcp, bound) = netkit::metrics::bind(addr, "apiserver").await?;
    let listener = netkit::tls::TlsListener {
        tcp,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(tls)),
        what: "apiserver",
    };
    let router = router(Arc::new(app));
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<Peer>(),
        )
        .await
    });
    Ok(bound)
}

fn router(app: Arc<App>) -> Router {
    let create = format!("/apis/{GROUP}/{{version}}/namespaces/{{namespace}}/{RESOURCE}");
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/", get(|| async { axum::Json(discovery::root_paths()) }))
        .route(
            "/apis",
            get(|| async { axum::Json(discovery::group_list()) }),
        )
        .route(
            "/apis/",
            get(|| async { axum::Json(discovery::group_list()) }),
        )
        .route(
            &format!("/apis/{GROUP}"),
            get(|| async { axum::Json(discovery::group()) }),
        )
        .route(
            &format!("/apis/{GROUP}/{{version}}"),
            get(|Path(version): Path<String>| async move {
                match discovery::resource_list(&version) {
                    Some(list) => axum::Json(list).into_response(),
                    None => status(
                        StatusCode::NOT_FOUND,
                        &format!("no version {version} of {GROUP}"),
                    ),
                }
            }),
        )
        .route(
            "/openapi/v2",
            get(|| async { axum::Json(discovery::openapi_v2()) }),
        )
        .route(&create, post(create_token))
        .route(DATAVOLUME_PATH, post(review_datavolume))
        .route(DATAVOLUME_MUTATE_PATH, post(mutate_datavolume))
        .with_state(app)
}

/// `POST /datavolume-validate`: CDI's DataVolume webhook ([`crate::datavolume::admission`]).
/// A CREATE first reads the PVC of the DataVolume's name.
async fn review_datavolume(
    State(app): State<Arc<App>>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    let req: std::result::Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
    let resp = match req {
        Err(e) => AdmissionResponse::invalid(e.to_string()),
        Ok(req) => {
            let pvc = match admission::target_pvc(&req) {
                None => Ok(None),
                Some((ns, name)) => {
                    let pvcs = Api::<PersistentVolumeClaim>::namespaced(app.client.clone(), &ns);
                    kubeops::while_unreachable(kubeops::UNREACHABLE_BUDGET, || async {
                        Ok(pvcs.get_opt(&name).await?)
                    })
                    .await
                    .map_err(|e| format!("reading PVC {ns}/{name}: {e}"))
                }
            };
            match pvc {
                Ok(pvc) => admission::review(&req, pvc.as_ref(), &DataVolumeConfig::default()),
                Err(e) => AdmissionResponse::from(&req).deny(e),
            }
        }
    };
    axum::Json(resp.into_review())
}

/// `POST /datavolume-mutate`: CDI's DataVolume mutating webhook ([`clone_token`]).
async fn mutate_datavolume(
    State(app): State<Arc<App>>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    let req: std::result::Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
    let resp = match req {
        Err(e) => AdmissionResponse::invalid(e.to_string()),
        Ok(req) => clone_token(&app, &req).await,
    };
    axum::Json(resp.into_review())
}

/// A CREATE of a clone, as CDI's mutating webhook: its source resolved (a sourceRef through its
/// DataSource, refused when that does not exist); from another namespace, the requesting user
/// authorized; then the signed clone token added. Anything else passes unchanged.
async fn clone_token(app: &App, req: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let pass = AdmissionResponse::from(req);
    if req.operation != kube::core::admission::Operation::Create {
        return pass;
    }
    let Some(dv) = req.object.as_ref().and_then(|o| {
        serde_json::to_value(o)
            .and_then(serde_json::from_value::<api::DataVolume>)
            .ok()
    }) else {
        return pass;
    };
    if dv.metadata.deletion_timestamp.is_some() {
        return pass;
    }
    let request_ns = req.namespace.clone().unwrap_or_default();
    let found = kubeops::while_unreachable(kubeops::UNREACHABLE_BUDGET, || {
        data_sources(&app.client, &dv, &request_ns)
    });
    let found = match found.await {
        Ok(f) => f,
        Err(e) => return pass.deny(format!("reading the sourceRef's DataSource: {e}")),
    };
    let lookup = |ns: &str, n: &str| {
        found.iter().find(|d| {
            d.metadata.namespace.as_deref() == Some(ns) && d.metadata.name.as_deref() == Some(n)
        })
    };
    let (kind, src_ns, src_name) = match admission::clone_source(&dv, &request_ns, lookup) {
        Ok(Some(s)) => s,
        Ok(None) => return pass,
        Err(not_found) => {
            let mut resp = pass.deny(not_found);
            resp.result.code = 400;
            return resp;
        }
    };
    let dv_ns = dv.metadata.namespace.clone().unwrap_or(request_ns);
    let dv_name = dv.metadata.name.clone().unwrap_or_else(|| req.name.clone());
    if src_ns != dv_ns {
        let source = (kind, src_ns.as_str(), src_name.as_str());
        let authorized = kubeops::while_unreachable(kubeops::UNREACHABLE_BUDGET, || {
            admission::authorize_clone(&app.client, source, &req.user_info)
        });
        match authorized.await {
            Ok(Ok(())) => {}
            Ok(Err(message)) => return admission::refuse_clone(req, message),
            Err(e) => return pass.deny(format!("authorizing the clone: {e}")),
        }
    }
    let claims = crate::datavolume::clone::token::claims(
        kind,
        (&src_ns, &src_name),
        (&dv_ns, &dv_name),
        token::now(),
    );
    let signed = token::sign(&claims, &app.signing_key).map_err(|e| e.to_string());
    let patched = signed.and_then(|t| {
        pass.clone()
            .with_patch(crate::datavolume::clone::token::patch(&dv, t))
            .map_err(|e| e.to_string())
    });
    patched.unwrap_or_else(|e| {
        tracing::error!(error = %e, "signing the clone token failed");
        pass.deny(format!("signing the clone token: {e}"))
    })
}

/// The DataSources a DataVolume's `spec.sourceRef` goes through: its own and the one it points
/// to, those that exist.
async fn data_sources(
    client: &kube::Client,
    dv: &api::DataVolume,
    request_ns: &str,
) -> Result<Vec<api::DataSource>> {
    let mut found = Vec::new();
    let (None, Some(r)) = (&dv.spec.source, &dv.spec.source_ref) else {
        return Ok(found);
    };
    let ns = r
        .namespace
        .clone()
        .unwrap_or_else(|| request_ns.to_string());
    let api: Api<api::DataSource> = Api::namespaced(client.clone(), &ns);
    let Some(ds) = kubeops::get(&api, &r.name).await? else {
        return Ok(found);
    };
    if let Some(next) = &ds.spec.source.data_source {
        let next_ns = if next.namespace.is_empty() {
            ns.clone()
        } else {
            next.namespace.clone()
        };
        let api: Api<api::DataSource> = Api::namespaced(client.clone(), &next_ns);
        found.extend(kubeops::get(&api, &next.name).await?);
    }
    found.push(ds);
    Ok(found)
}

/// `POST /apis/upload.cdi.kubevirt.io/{version}/namespaces/{namespace}/uploadtokenrequests`.
async fn create_token(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path((version, namespace)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match issue(&app, &peer, &version, &namespace, &headers, &body).await {
        Ok(object) => (StatusCode::OK, axum::Json(object)).into_response(),
        Err((code, message)) => status(code, &message),
    }
}

type Refusal = (StatusCode, String);

/// Authenticates, authorizes and answers one token request.
async fn issue(
    app: &App,
    peer: &Peer,
    version: &str,
    namespace: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> std::result::Result<Value, Refusal> {
    let unauthorized = |m: String| (StatusCode::UNAUTHORIZED, m);
    if !VERSIONS.contains(&version) {
        return Err((
            StatusCode::NOT_FOUND,
            format!("no version {version} of {GROUP}"),
        ));
    }
    // Only the front proxy, proven by its certificate, may tell who the user is.
    let Some(cn) = peer.common_name.as_deref() else {
        return Err(unauthorized("request is not authenticated".into()));
    };
    if !app.auth.allows(Some(cn)) {
        return Err(unauthorized(format!(
            "request is not authenticated: client certificate {cn:?} is not an allowed front-proxy name"
        )));
    }
    let identity = app.auth.identity(headers).map_err(unauthorized)?;
    let review = identity.access_review(namespace, GROUP, version, RESOURCE);
    let reviews: Api<SubjectAccessReview> = Api::all(app.client.clone());
    let verdict = reviews
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "SubjectAccessReview failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal server error".to_string(),
            )
        })?;
    let status_of = verdict.status.unwrap_or_default();
    if !status_of.allowed {
        let reason = status_of.reason.unwrap_or_default();
        return Err(unauthorized(if reason.is_empty() {
            format!(
                "user {:?} may not create {RESOURCE} in namespace {namespace}",
                identity.user
            )
        } else {
            reason
        }));
    }
    let mut object: Value = serde_json::from_slice(body).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("the body is not an UploadTokenRequest: {e}"),
        )
    })?;
    let pvc_name = object["spec"]["pvcName"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or((
            StatusCode::BAD_REQUEST,
            "spec.pvcName is required".to_string(),
        ))?
        .to_string();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(app.client.clone(), namespace);
    let pvc = claims.get_opt(&pvc_name).await.map_err(|e| {
        tracing::error!(error = %e, "reading the PVC failed");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal server error".to_string(),
        )
    })?;
    let Some(pvc) = pvc else {
        return Err((
            StatusCode::NOT_FOUND,
            format!("persistentvolumeclaims \"{pvc_name}\" not found"),
        ));
    };
    if !pvc
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(UPLOAD_TARGET_ANNOTATION))
    {
        return Err((
            StatusCode::BAD_REQUEST,
            format!(
                "PVC {namespace}/{pvc_name} is not an upload target (no {UPLOAD_TARGET_ANNOTATION} annotation)"
            ),
        ));
    }
    let claims = token::Claims::upload(namespace, &pvc_name, token::now(), app.token_ttl);
    let token = token::sign(&claims, &app.signing_key).map_err(|e| {
        tracing::error!(error = %e, "signing the token failed");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal server error".to_string(),
        )
    })?;
    object["apiVersion"] = json!(format!("{GROUP}/{version}"));
    object["kind"] = json!("UploadTokenRequest");
    object["metadata"]["namespace"] = json!(namespace);
    object["status"] = json!({ "token": token });
    Ok(object)
}

/// A Kubernetes `Status` answer.
fn status(code: StatusCode, message: &str) -> Response {
    let reason = match code {
        StatusCode::UNAUTHORIZED => "Unauthorized",
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::BAD_REQUEST => "BadRequest",
        _ => "InternalError",
    };
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

impl
    axum::extract::connect_info::Connected<
        axum::serve::IncomingStream<'_, netkit::tls::TlsListener>,
    > for Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, netkit::tls::TlsListener>) -> Self {
        let certs = stream.io().get_ref().1.peer_certificates();
        Peer {
            common_name: certs
                .and_then(|c| c.first())
                .and_then(|c| auth::common_name(c.as_ref())),
        }
    }
}

#[cfg(test)]
mod tests;
