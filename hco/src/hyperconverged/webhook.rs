//! The validating webhook for HyperConverged (hco-webhook's checks on the storage-related
//! fields), as a pure function plus an axum handler for `AdmissionReview`. A DELETE is refused
//! while DataVolumes exist unless the uninstall strategy is `RemoveWorkloads` (what CDI's
//! webhook answers HCO when it tries the deletion of the CDI child); the handler then lists
//! DataVolumes in all namespaces.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Json;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

use super::children::hostpath_pools;
use api::HyperConverged;
use api::duration::parse_go_duration;
use api::hyperconverged::{CertRotation, HYPERCONVERGED_NAME};
use api::names::webhook::HYPERCONVERGED_PATH;
use kubekit::error::{Error, Result};

fn rotation(what: &str, r: Option<&CertRotation>, errors: &mut Vec<String>) -> Option<(f64, f64)> {
    let r = r?;
    let parse = |field: &str, v: &Option<String>, errors: &mut Vec<String>| match v {
        None => None,
        Some(v) => {
            let d = parse_go_duration(v).ok();
            if d.is_none() {
                errors.push(format!(
                    "spec.certConfig.{what}.{field}: {v:?} is not a duration such as 48h0m0s"
                ));
            }
            d
        }
    };
    let duration = parse("duration", &r.duration, errors);
    let renew = parse("renewBefore", &r.renew_before, errors);
    if let (Some(d), Some(rb)) = (duration, renew)
        && rb >= d
    {
        errors.push(format!(
            "spec.certConfig.{what}: renewBefore ({}) must be shorter than duration ({})",
            r.renew_before.as_deref().unwrap_or_default(),
            r.duration.as_deref().unwrap_or_default()
        ));
    }
    duration.zip(renew)
}

fn overhead(field: &str, v: &str, errors: &mut Vec<String>) {
    // CDI's pattern: 0, 1, or 0.NNN (at most three decimals).
    let ok = v == "0"
        || v == "1"
        || v.strip_prefix("0.")
            .is_some_and(|d| (1..=3).contains(&d.len()) && d.chars().all(|c| c.is_ascii_digit()));
    if !ok {
        errors.push(format!(
            "{field}: {v:?} is not a fraction between 0 and 1 with at most three decimals"
        ));
    }
}

/// Checks a HyperConverged as hco-webhook does; every problem found is listed.
pub fn validate(hc: &HyperConverged, namespace: Option<&str>) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    let name = hc.metadata.name.as_deref().unwrap_or_default();
    if name != HYPERCONVERGED_NAME {
        errors.push(format!(
            "metadata.name: only one HyperConverged, named {HYPERCONVERGED_NAME}, is allowed (got {name:?})"
        ));
    }
    if let (Some(want), Some(got)) = (namespace, hc.metadata.namespace.as_deref())
        && want != got
    {
        errors.push(format!(
            "metadata.namespace: the HyperConverged must be in {want} (got {got})"
        ));
    }
    let s = &hc.spec;
    if let Some(fo) = &s.filesystem_overhead {
        if let Some(g) = &fo.global {
            overhead("spec.filesystemOverhead.global", g, &mut errors);
        }
        for (class, v) in &fo.storage_class {
            overhead(
                &format!("spec.filesystemOverhead.storageClass[{class}]"),
                v,
                &mut errors,
            );
        }
    }
    if let Some(cc) = &s.cert_config {
        let ca = rotation("ca", cc.ca.as_ref(), &mut errors);
        let server = rotation("server", cc.server.as_ref(), &mut errors);
        if let (Some((ca_d, _)), Some((srv_d, _))) = (ca, server)
            && srv_d > ca_d
        {
            errors.push(
                "spec.certConfig: server.duration must not be longer than ca.duration".into(),
            );
        }
    }
    if let Some(si) = &s.storage_import {
        for r in &si.insecure_registries {
            if r.is_empty() || r.contains(char::is_whitespace) {
                errors.push(format!(
                    "spec.storageImport.insecureRegistries: {r:?} is not a registry host"
                ));
            }
        }
    }
    if let Some(rr) = &s.resource_requirements
        && rr.vmi_cpu_allocation_ratio.is_some_and(|r| r <= 0)
    {
        errors
            .push("spec.resourceRequirements.vmiCPUAllocationRatio must be greater than 0".into());
    }
    if let Some(u) = &s.uninstall_strategy
        && u != "RemoveWorkloads"
        && u != "BlockUninstallIfWorkloadsExist"
    {
        errors.push(format!(
            "spec.uninstallStrategy: {u:?} is not RemoveWorkloads or BlockUninstallIfWorkloadsExist"
        ));
    }
    match hostpath_pools(hc) {
        Err(e) => errors.push(e.to_string()),
        Ok(Some(pools)) => {
            for p in &pools {
                if p.name.is_empty() || !p.path.starts_with('/') {
                    errors.push(format!(
                        "hostPath storage pool {:?}: needs a name and an absolute path",
                        p.name
                    ));
                }
            }
        }
        Ok(None) => {}
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// CDI's refusal to uninstall while DataVolumes exist (HCO passes on what CDI's webhook says
/// when it tries the deletion of the CDI child).
pub const UNINSTALL_BLOCKED: &str = "Rejecting the uninstall request, since there are still DataVolumes present. Either delete all DataVolumes or change the uninstall strategy before uninstalling CDI.";

/// The HyperConverged a review is about: the new object, or the old one of a DELETE.
fn reviewed(req: &AdmissionRequest<DynamicObject>) -> Result<HyperConverged, String> {
    let obj = match req.operation {
        Operation::Delete => req.old_object.as_ref(),
        _ => req.object.as_ref(),
    }
    .ok_or("the request carries no object")?;
    serde_json::to_value(obj)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("not a HyperConverged: {e}"))
}

/// Whether deleting `hc` must first ask if DataVolumes exist: unless the uninstall strategy is
/// `RemoveWorkloads` (HCO's default is `BlockUninstallIfWorkloadsExist`).
pub fn deletion_blocks_on_workloads(hc: &HyperConverged) -> bool {
    hc.spec.uninstall_strategy.as_deref() != Some("RemoveWorkloads")
}

/// The admission decision for one review; `datavolumes_exist` answers a DELETE that
/// [`deletion_blocks_on_workloads`] (None: the webhook could not tell, and refuses).
pub fn review(
    req: &AdmissionRequest<DynamicObject>,
    namespace: Option<&str>,
    datavolumes_exist: Option<Result<bool, String>>,
) -> AdmissionResponse {
    let resp = AdmissionResponse::from(req);
    if req.operation == Operation::Connect {
        return resp;
    }
    let hc = match reviewed(req) {
        Ok(hc) => hc,
        Err(e) => return resp.deny(e),
    };
    if req.operation == Operation::Delete {
        if !deletion_blocks_on_workloads(&hc) {
            return resp;
        }
        return match datavolumes_exist {
            Some(Ok(false)) => resp,
            Some(Ok(true)) => resp.deny(UNINSTALL_BLOCKED),
            Some(Err(e)) => resp.deny(format!("cannot tell whether DataVolumes exist: {e}")),
            None => {
                resp.deny("cannot tell whether DataVolumes exist: the webhook has no API client")
            }
        };
    }
    match validate(&hc, namespace) {
        Ok(()) => resp,
        Err(errors) => resp.deny(errors.join("; ")),
    }
}

/// What the webhook needs besides the review.
#[derive(Clone, Default)]
pub struct Settings {
    /// The namespace the HyperConverged must be in (None: any).
    pub namespace: Option<String>,
    /// Lists DataVolumes in all namespaces when a deletion must check for them.
    pub client: Option<kube::Client>,
}

/// Whether any DataVolume exists, in any namespace.
async fn any_datavolume(client: &kube::Client) -> Result<bool, String> {
    let api: kube::Api<api::DataVolume> = kube::Api::all(client.clone());
    let one = kube::api::ListParams::default().limit(1);
    kubekit::kubeops::while_unreachable(kubekit::kubeops::UNREACHABLE_BUDGET, || async {
        Ok(api.list_metadata(&one).await?)
    })
    .await
    .map(|l| !l.items.is_empty())
    .map_err(|e| e.to_string())
}

/// Axum handler: `AdmissionReview` in, `AdmissionReview` out.
pub async fn handle(
    settings: Settings,
    Json(review_in): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let req: Result<AdmissionRequest<DynamicObject>, _> = review_in.try_into();
    let resp = match req {
        Ok(req) => {
            let ask = req.operation == Operation::Delete
                && reviewed(&req).is_ok_and(|hc| deletion_blocks_on_workloads(&hc));
            let exist = match (&settings.client, ask) {
                (Some(client), true) => Some(any_datavolume(client).await),
                _ => None,
            };
            review(&req, settings.namespace.as_deref(), exist)
        }
        Err(e) => AdmissionResponse::invalid(e.to_string()),
    };
    Json(resp.into_review())
}

/// A router serving the webhook on [`PATH`].
pub fn router(settings: Settings) -> axum::Router {
    axum::Router::new().route(
        HYPERCONVERGED_PATH,
        axum::routing::post(move |body| handle(settings.clone(), body)),
    )
}

fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig> {
    let identity = kubekit::tls::identity(cert, key)?;
    netkit::tls::server_config_with(identity, None, netkit::tls::Alpn::None)
        .map_err(|e| Error::Config(format!("webhook TLS {}: {e}", cert.display())))
}

/// Serves the webhook on `addr` in a background task: HTTPS with `tls` = (cert, key) PEM files
/// (what the API server requires), plain HTTP without. Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    tls: Option<(PathBuf, PathBuf)>,
    settings: Settings,
) -> Result<SocketAddr> {
    let (tcp, bound) = netkit::metrics::bind(addr, "webhook").await?;
    let app = router(settings);
    match tls {
        Some((cert, key)) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(&cert, &key)?));
            let listener = netkit::tls::TlsListener {
                tcp,
                acceptor,
                what: "webhook",
            };
            tokio::spawn(async move { axum::serve(listener, app).await });
        }
        None => {
            tokio::spawn(async move { axum::serve(tcp, app).await });
        }
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::HyperConvergedSpec;
    use api::hyperconverged::{CertConfig, FilesystemOverhead};

    fn hc(spec: HyperConvergedSpec) -> HyperConverged {
        let mut hc = HyperConverged::new(HYPERCONVERGED_NAME, spec);
        hc.metadata.namespace = Some("kubevirt-hyperconverged".into());
        hc
    }

    #[test]
    fn a_valid_hyperconverged_is_allowed() {
        let ok = hc(HyperConvergedSpec {
            filesystem_overhead: Some(FilesystemOverhead {
                global: Some("0.055".into()),
                storage_class: [("fast".to_string(), "0.1".to_string())].into(),
            }),
            cert_config: Some(CertConfig {
                ca: Some(CertRotation {
                    duration: Some("48h0m0s".into()),
                    renew_before: Some("24h0m0s".into()),
                }),
                server: Some(CertRotation {
                    duration: Some("24h0m0s".into()),
                    renew_before: Some("12h0m0s".into()),
                }),
            }),
            ..Default::default()
        });
        assert_eq!(validate(&ok, Some("kubevirt-hyperconverged")), Ok(()));
    }

    #[test]
    fn each_invalid_field_is_named() {
        let cases: Vec<(HyperConverged, &str)> = vec![
            (
                {
                    let mut h = hc(Default::default());
                    h.metadata.name = Some("other".into());
                    h
                },
                "metadata.name",
            ),
            (
                hc(HyperConvergedSpec {
                    filesystem_overhead: Some(FilesystemOverhead {
                        global: Some("1.5".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                "spec.filesystemOverhead.global",
            ),
            (
                hc(HyperConvergedSpec {
                    filesystem_overhead: Some(FilesystemOverhead {
                        storage_class: [("x".to_string(), "0.12345".to_string())].into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                "storageClass[x]",
            ),
            (
                hc(HyperConvergedSpec {
                    cert_config: Some(CertConfig {
                        ca: Some(CertRotation {
                            duration: Some("24h".into()),
                            renew_before: Some("48h".into()),
                        }),
                        server: None,
                    }),
                    ..Default::default()
                }),
                "renewBefore (48h) must be shorter",
            ),
            (
                hc(HyperConvergedSpec {
                    cert_config: Some(CertConfig {
                        ca: Some(CertRotation {
                            duration: Some("soon".into()),
                            renew_before: None,
                        }),
                        server: None,
                    }),
                    ..Default::default()
                }),
                "not a duration",
            ),
            (
                hc(HyperConvergedSpec {
                    cert_config: Some(CertConfig {
                        ca: Some(CertRotation {
                            duration: Some("24h".into()),
                            renew_before: Some("1h".into()),
                        }),
                        server: Some(CertRotation {
                            duration: Some("48h".into()),
                            renew_before: Some("1h".into()),
                        }),
                    }),
                    ..Default::default()
                }),
                "server.duration",
            ),
            (
                hc(HyperConvergedSpec {
                    uninstall_strategy: Some("Whatever".into()),
                    ..Default::default()
                }),
                "spec.uninstallStrategy",
            ),
            (
                hc(HyperConvergedSpec {
                    resource_requirements: Some(api::hyperconverged::OperandResourceRequirements {
                        vmi_cpu_allocation_ratio: Some(0),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                "vmiCPUAllocationRatio",
            ),
        ];
        for (h, needle) in cases {
            let errs = validate(&h, None).unwrap_err();
            assert!(
                errs.iter().any(|e| e.contains(needle)),
                "{needle}: {errs:?}"
            );
        }
        let mut wrong_ns = hc(Default::default());
        wrong_ns.metadata.namespace = Some("default".into());
        assert!(validate(&wrong_ns, Some("kubevirt-hyperconverged")).is_err());
    }

    /// An AdmissionReview of `operation` on the singleton with `spec` (the old object of a
    /// DELETE, the new one otherwise).
    fn review_json(operation: &str, spec: serde_json::Value) -> serde_json::Value {
        let hc = serde_json::json!({"apiVersion": "hco.kubevirt.io/v1beta1", "kind": "HyperConverged",
            "metadata": {"name": HYPERCONVERGED_NAME, "namespace": "kubevirt-hyperconverged"}, "spec": spec});
        let (object, old) = if operation == "DELETE" {
            (serde_json::Value::Null, hc)
        } else {
            (hc, serde_json::Value::Null)
        };
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "req-1", "kind": {"group": "hco.kubevirt.io", "version": "v1beta1", "kind": "HyperConverged"},
                "resource": {"group": "hco.kubevirt.io", "version": "v1beta1", "resource": "hyperconvergeds"},
                "name": HYPERCONVERGED_NAME, "namespace": "kubevirt-hyperconverged", "operation": operation,
                "userInfo": {}, "dryRun": false, "object": object, "oldObject": old}
        })
    }

    #[test]
    fn deletion_waits_for_datavolumes_unless_workloads_may_go() {
        let delete = |strategy: Option<&str>| -> AdmissionRequest<DynamicObject> {
            let review: AdmissionReview<DynamicObject> = serde_json::from_value(review_json(
                "DELETE",
                serde_json::json!({ "uninstallStrategy": strategy }),
            ))
            .unwrap();
            review.try_into().unwrap()
        };
        let ns = Some("kubevirt-hyperconverged");
        // HCO's default strategy blocks, as the explicit one does.
        for strategy in [None, Some("BlockUninstallIfWorkloadsExist")] {
            let req = delete(strategy);
            let refused = review(&req, ns, Some(Ok(true)));
            assert!(!refused.allowed);
            assert_eq!(refused.result.message, UNINSTALL_BLOCKED);
            assert!(review(&req, ns, Some(Ok(false))).allowed);
            // Not knowing is not a yes.
            assert!(!review(&req, ns, Some(Err("forbidden".into()))).allowed);
            assert!(!review(&req, ns, None).allowed);
        }
        assert!(review(&delete(Some("RemoveWorkloads")), ns, None).allowed);
    }

    #[tokio::test]
    async fn the_http_handler_answers_admission_reviews() {
        use tower::ServiceExt;
        let review = |spec: serde_json::Value| review_json("CREATE", spec);
        for (spec, allowed) in [
            (
                serde_json::json!({"filesystemOverhead": {"global": "0.1"}, "someOtherHcoField": {"x": 1}}),
                true,
            ),
            (
                serde_json::json!({"filesystemOverhead": {"global": "2"}}),
                false,
            ),
        ] {
            let req = http::Request::post(HYPERCONVERGED_PATH)
                .header("content-type", "application/json")
                .body(axum::body::Body::from(review(spec).to_string()))
                .unwrap();
            let resp = router(Settings {
                namespace: Some("kubevirt-hyperconverged".into()),
                client: None,
            })
            .oneshot(req)
            .await
            .unwrap();
            assert_eq!(resp.status(), 200);
            let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["response"]["uid"], "req-1");
            assert_eq!(v["response"]["allowed"], allowed, "{v}");
            if !allowed {
                assert!(
                    v["response"]["status"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("spec.filesystemOverhead.global"),
                    "{v}"
                );
            }
        }
    }

    #[tokio::test]
    async fn the_webhook_is_served_over_https_with_the_given_certificate() {
        let ca = testkit::tls::TestCa::new();
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            Some((ca.cert_pem(), ca.key_pem())),
            Settings::default(),
        )
        .await
        .unwrap();
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u2", "kind": {"group": "hco.kubevirt.io", "version": "v1beta1", "kind": "HyperConverged"},
                "resource": {"group": "hco.kubevirt.io", "version": "v1beta1", "resource": "hyperconvergeds"},
                "name": "wrong-name", "operation": "CREATE", "userInfo": {}, "dryRun": false,
                "object": {"apiVersion": "hco.kubevirt.io/v1beta1", "kind": "HyperConverged",
                    "metadata": {"name": "wrong-name"}, "spec": {}}}
        });
        let url = format!("https://{addr}{HYPERCONVERGED_PATH}");
        let ca_pem = ca.ca_pem();
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args(["-sS", "--fail", "--cacert"])
                .arg(&ca_pem)
                .args(["-H", "content-type: application/json", "--data-binary"])
                .arg(body.to_string())
                .arg(&url)
                .output()
                .expect("running curl")
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["response"]["allowed"], false);
        assert!(
            v["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains("metadata.name")
        );

        // Without the CA, the client refuses the server.
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "--fail",
                "-o",
                "/dev/null",
                &format!("https://{addr}{HYPERCONVERGED_PATH}"),
            ])
            .env("CURL_CA_BUNDLE", "/nonexistent")
            .env("SSL_CERT_FILE", "/nonexistent")
            .output()
            .unwrap();
        assert!(!out.status.success());
    }

    #[tokio::test]
    async fn bad_tls_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a pem").unwrap();
        let err = serve(
            "127.0.0.1:0".parse().unwrap(),
            Some((junk.clone(), junk)),
            Settings::default(),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("junk.pem"), "{err}");
    }
}
