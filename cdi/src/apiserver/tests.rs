//! The token API over real TLS (certificates made by openssl), with the Kubernetes API scripted
//! by [`kubekit::mockapi`]: who may ask, what is asked of the API server, and what comes back.

use axum::http::Method;
use serde_json::{Value, json};
use testkit::tls::TestCa;

use super::*;
use kubekit::mockapi::{self, ApiServer};

const SAR_PATH: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
const PVC_PATH: &str = "/api/v1/namespaces/vms/persistentvolumeclaims/disk";

/// A running token API with its scripted cluster, its CA and the key that checks its tokens.
struct Fixture {
    url: String,
    cluster: ApiServer,
    ca: TestCa,
    public_key: token::PublicKey,
}

async fn start(allowed_names: &[&str]) -> Fixture {
    importer::source::http::install_tls_provider();
    let ca = TestCa::new();
    let dir = ca.dir();
    let (signing_key, public_key) = testkit::tls::rsa_key_pair(dir, "signing");
    let (client, cluster) = mockapi::pair();
    let ca_pem = std::fs::read_to_string(ca.ca_pem()).unwrap();
    let tls = tls_config(&ca.cert_pem(), &ca.key_pem(), &ca_pem).unwrap();
    let app = App {
        client,
        auth: RequestHeaderConfig {
            allowed_names: allowed_names.iter().map(|s| s.to_string()).collect(),
            ..RequestHeaderConfig::default()
        },
        signing_key: token::load_private_key(&signing_key).unwrap(),
        token_ttl: Duration::from_secs(300),
    };
    let bound = serve("127.0.0.1:0".parse().unwrap(), tls, app)
        .await
        .unwrap();
    Fixture {
        url: format!("https://127.0.0.1:{}", bound.port()),
        cluster,
        public_key: token::load_public_key(&public_key).unwrap(),
        ca,
    }
}

/// An HTTPS client trusting the test CA, presenting `identity` (a client certificate of `ca`).
fn client(trust: &TestCa, identity: Option<(&TestCa, &str)>) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(trust.ca_pem()).unwrap()).unwrap();
    let mut b = reqwest::Client::builder().add_root_certificate(ca);
    if let Some((issuer, name)) = identity {
        let (cert, key) = issuer.client_cert(name);
        let mut pem = std::fs::read(cert).unwrap();
        pem.extend(std::fs::read(key).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

fn request_body() -> Value {
    json!({"apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
           "metadata": {"name": "t", "namespace": "vms"}, "spec": {"pvcName": "disk"}})
}

/// POSTs a token request as `user` (no user header when None).
async fn ask(
    url: &str,
    client: &reqwest::Client,
    user: Option<&str>,
) -> reqwest::Result<reqwest::Response> {
    let mut rb = client
        .post(format!(
            "{url}/apis/upload.cdi.kubevirt.io/v1beta1/namespaces/vms/uploadtokenrequests"
        ))
        .header("X-Remote-Group", "devs")
        .header("X-Remote-Group", "system:authenticated")
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&request_body()).unwrap());
    if let Some(user) = user {
        rb = rb.header("X-Remote-User", user);
    }
    rb.send().await
}

async fn json(resp: reqwest::Response) -> Value {
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

fn sar_answer(allowed: bool, reason: &str) -> Value {
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {},
           "status": {"allowed": allowed, "reason": reason}})
}

fn pvc(annotated: bool) -> Value {
    let annotations = if annotated {
        json!({UPLOAD_TARGET_ANNOTATION: ""})
    } else {
        json!({})
    };
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "disk", "namespace": "vms", "annotations": annotations}})
}

#[tokio::test]
async fn the_front_proxy_gets_a_token_the_proxy_accepts() {
    let mut f = start(&["front-proxy-client"]).await;
    let c = client(&f.ca, Some((&f.ca, "front-proxy-client")));
    let (resp, sar) = tokio::join!(ask(&f.url, &c, Some("alice")), async {
        let (_, sar) = f
            .cluster
            .expect(Method::POST, SAR_PATH, 201, sar_answer(true, ""))
            .await;
        f.cluster
            .expect(Method::GET, PVC_PATH, 200, pvc(true))
            .await;
        sar
    });
    let attrs = &sar["spec"]["resourceAttributes"];
    assert_eq!(sar["spec"]["user"], "alice");
    assert_eq!(
        sar["spec"]["groups"],
        json!(["devs", "system:authenticated"])
    );
    assert_eq!(attrs["verb"], "create");
    assert_eq!(attrs["namespace"], "vms");
    assert_eq!(attrs["group"], "upload.cdi.kubevirt.io");
    assert_eq!(attrs["resource"], "uploadtokenrequests");
    let resp = resp.unwrap();
    assert_eq!(resp.status(), 200);
    let body = json(resp).await;
    assert_eq!(body["kind"], "UploadTokenRequest");
    let token = body["status"]["token"].as_str().unwrap();
    let claims = token::verify(token, &f.public_key, token::now()).unwrap();
    assert_eq!(
        (claims.namespace.as_str(), claims.name.as_str()),
        ("vms", "disk")
    );
    f.cluster.silence().await;
}

#[tokio::test]
async fn a_certificate_of_another_ca_is_refused_in_the_handshake() {
    let mut f = start(&[]).await;
    let other = TestCa::new();
    let c = client(&f.ca, Some((&other, "front-proxy-client")));
    let err = ask(&f.url, &c, Some("alice")).await.unwrap_err();
    assert!(err.is_connect() || err.is_request(), "{err:?}");
    f.cluster.silence().await;
}

#[tokio::test]
async fn requests_without_a_proxy_certificate_or_user_are_not_authenticated() {
    let mut f = start(&["front-proxy-client"]).await;
    for (who, user, needle) in [
        (None, Some("alice"), "request is not authenticated"),
        (
            Some("mallory"),
            Some("alice"),
            "not an allowed front-proxy name",
        ),
        (Some("front-proxy-client"), None, "X-Remote-User"),
    ] {
        let c = client(&f.ca, who.map(|n| (&f.ca, n)));
        let resp = ask(&f.url, &c, user).await.unwrap();
        assert_eq!(resp.status(), 401, "{who:?}");
        let body = json(resp).await;
        assert!(body["message"].as_str().unwrap().contains(needle), "{body}");
    }
    f.cluster.silence().await;
}

#[tokio::test]
async fn a_denied_review_an_absent_pvc_and_a_plain_pvc_are_refused() {
    let mut f = start(&[]).await;
    let c = client(&f.ca, Some((&f.ca, "front-proxy-client")));
    let (resp, _) = tokio::join!(
        ask(&f.url, &c, Some("bob")),
        f.cluster.expect(
            Method::POST,
            SAR_PATH,
            201,
            sar_answer(false, "RBAC: bob may not")
        )
    );
    let resp = resp.unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(json(resp).await["message"], "RBAC: bob may not");

    let (resp, _) = tokio::join!(ask(&f.url, &c, Some("alice")), async {
        f.cluster
            .expect(Method::POST, SAR_PATH, 201, sar_answer(true, ""))
            .await;
        f.cluster.not_found(Method::GET, PVC_PATH).await;
    });
    let resp = resp.unwrap();
    assert_eq!(resp.status(), 404);
    let body = json(resp).await;
    assert_eq!(body["message"], "persistentvolumeclaims \"disk\" not found");
    assert_eq!(body["reason"], "NotFound");

    let (resp, _) = tokio::join!(ask(&f.url, &c, Some("alice")), async {
        f.cluster
            .expect(Method::POST, SAR_PATH, 201, sar_answer(true, ""))
            .await;
        f.cluster
            .expect(Method::GET, PVC_PATH, 200, pvc(false))
            .await;
    });
    let resp = resp.unwrap();
    assert_eq!(resp.status(), 400);
    let body = json(resp).await;
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("not an upload target"),
        "{body}"
    );
    f.cluster.silence().await;
}

#[tokio::test]
async fn discovery_is_open_to_every_client() {
    let mut f = start(&["front-proxy-client"]).await;
    let c = client(&f.ca, None);
    for (path, kind) in [
        ("/apis", "APIGroupList"),
        ("/apis/upload.cdi.kubevirt.io", "APIGroup"),
        ("/apis/upload.cdi.kubevirt.io/v1alpha1", "APIResourceList"),
    ] {
        let body = json(c.get(format!("{}{path}", f.url)).send().await.unwrap()).await;
        assert_eq!(body["kind"], kind, "{path}");
    }
    let health = c.get(format!("{}/healthz", f.url)).send().await.unwrap();
    assert_eq!(health.text().await.unwrap(), "ok");
    let openapi = json(c.get(format!("{}/openapi/v2", f.url)).send().await.unwrap()).await;
    assert_eq!(openapi["swagger"], "2.0");
    f.cluster.silence().await;
}

/// An AdmissionReview of a DataVolume `op` (`oldObject` for updates).
fn datavolume_review(op: &str, url: &str, old_url: Option<&str>) -> Value {
    let dv = |url: &str| {
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
               "metadata": {"name": "fedora", "namespace": "vms"},
               "spec": {"source": {"http": {"url": url}},
                        "storage": {"resources": {"requests": {"storage": "1Gi"}}}}})
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
           "request": {"uid": "dv-1",
               "kind": {"group": "cdi.kubevirt.io", "version": "v1beta1", "kind": "DataVolume"},
               "resource": {"group": "cdi.kubevirt.io", "version": "v1beta1", "resource": "datavolumes"},
               "name": "fedora", "namespace": "vms", "operation": op, "userInfo": {},
               "object": dv(url), "oldObject": old_url.map(dv)}})
}

#[tokio::test]
async fn the_datavolume_webhook_answers_without_a_client_certificate() {
    let mut f = start(&["front-proxy-client"]).await;
    let c = client(&f.ca, None);
    let url = format!("{}{}", f.url, api::names::webhook::DATAVOLUME_PATH);
    let post = |body: Value| {
        c.post(&url)
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
    };
    const PVC: &str = "/api/v1/namespaces/vms/persistentvolumeclaims/fedora";
    const URL: &str = "https://images.example/fedora.qcow2";

    // CREATE: the PVC of the same name is looked up first; none exists.
    let (resp, _) = tokio::join!(post(datavolume_review("CREATE", URL, None)), async {
        f.cluster.not_found(Method::GET, PVC).await;
    });
    let body = json(resp.unwrap()).await;
    assert_eq!(
        (&body["response"]["uid"], &body["response"]["allowed"]),
        (&json!("dv-1"), &json!(true)),
        "{body}"
    );
    // One that belongs to something else refuses the DataVolume.
    let (resp, _) = tokio::join!(post(datavolume_review("CREATE", URL, None)), async {
        f.cluster
            .expect(
                Method::GET,
                PVC,
                200,
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": "fedora", "namespace": "vms"}}),
            )
            .await;
    });
    let body = json(resp.unwrap()).await;
    assert_eq!(
        body["response"]["status"]["message"],
        "Destination PVC vms/fedora already exists"
    );
    // UPDATE: a new URL is refused, with nothing asked of the cluster.
    let body = json(
        post(datavolume_review(
            "UPDATE",
            "https://other/x.img",
            Some(URL),
        ))
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (
            &body["response"]["allowed"],
            &body["response"]["status"]["message"],
            &body["response"]["status"]["code"]
        ),
        (
            &json!(false),
            &json!("Cannot update DataVolume Spec"),
            &json!(422)
        )
    );
    f.cluster.silence().await;
}

#[tokio::test]
async fn the_datavolume_webhook_refuses_a_cross_namespace_clone_its_user_may_not_make() {
    let mut f = start(&["front-proxy-client"]).await;
    let c = client(&f.ca, None);
    let url = format!("{}{}", f.url, api::names::webhook::DATAVOLUME_MUTATE_PATH);
    let mut review = datavolume_review("CREATE", "", None);
    review["request"]["object"]["spec"]["source"] =
        json!({"pvc": {"namespace": "golden", "name": "fedora-base"}});
    review["request"]["userInfo"] = json!({"username": "bob", "groups": ["devs"]});
    let post = c
        .post(&url)
        .header("Content-Type", "application/json")
        .body(review.to_string())
        .send();
    const SAR: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let denied = |sent: &Value| {
        let mut r = sent.clone();
        r["status"] = json!({"allowed": false});
        r
    };
    let (resp, (explicit, implicit)) = tokio::join!(post, async {
        let (_, explicit) = f.cluster.expect_with(Method::POST, SAR, 201, denied).await;
        let (_, implicit) = f.cluster.expect_with(Method::POST, SAR, 201, denied).await;
        (explicit, implicit)
    });
    // For the requesting user: datavolumes/source first, then pods, in the source namespace.
    assert_eq!(explicit["spec"]["user"], "bob");
    assert_eq!(explicit["spec"]["groups"], json!(["devs"]));
    assert_eq!(
        explicit["spec"]["resourceAttributes"],
        json!({"namespace": "golden", "verb": "create", "group": "cdi.kubevirt.io",
               "resource": "datavolumes", "subresource": "source", "name": "fedora-base"})
    );
    assert_eq!(implicit["spec"]["resourceAttributes"]["resource"], "pods");
    let body = json(resp.unwrap()).await;
    assert_eq!(
        (
            &body["response"]["allowed"],
            &body["response"]["status"]["message"],
            &body["response"]["status"]["code"]
        ),
        (
            &json!(false),
            &json!("User bob has insufficient permissions in clone source namespace golden"),
            &json!(422)
        )
    );
    f.cluster.silence().await;
}

/// Posts a CREATE review of `source` by user bob to the mutating webhook.
async fn mutate((base, ca): (&str, &TestCa), source: Value) -> reqwest::Result<reqwest::Response> {
    let url = format!("{base}{}", api::names::webhook::DATAVOLUME_MUTATE_PATH);
    let mut review = datavolume_review("CREATE", "", None);
    review["request"]["object"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("source");
    for (k, v) in source.as_object().unwrap() {
        review["request"]["object"]["spec"][k] = v.clone();
    }
    review["request"]["userInfo"] = json!({"username": "bob", "groups": ["devs"]});
    client(ca, None)
        .post(&url)
        .header("Content-Type", "application/json")
        .body(review.to_string())
        .send()
        .await
}

#[tokio::test]
async fn the_mutating_webhook_signs_a_clone_token_for_the_source_it_authorized() {
    let mut f = start(&["front-proxy-client"]).await;
    // Within the namespace: nothing is asked of the cluster, the token is added.
    let at = (f.url.as_str(), &f.ca);
    let resp = mutate(
        at,
        json!({"source": {"pvc": {"namespace": "vms", "name": "fedora-base"}}}),
    )
    .await;
    let body = json(resp.unwrap()).await;
    let r = &body["response"];
    assert_eq!(
        (&r["allowed"], &r["patchType"]),
        (&json!(true), &json!("JSONPatch"))
    );
    // kube writes the bytes as a JSON array, which the API server's decoder takes too.
    let patch: Vec<u8> = serde_json::from_value(r["patch"].clone()).unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(patch[0]["path"], "/metadata/annotations");
    let token = patch[0]["value"][crate::datavolume::clone::token::ANN_CLONE_TOKEN]
        .as_str()
        .unwrap();
    let claims = token::verify_signed(token, &f.public_key).unwrap();
    assert_eq!(
        (
            claims.operation.as_str(),
            claims.namespace.as_str(),
            claims.name.as_str()
        ),
        ("Clone", "vms", "fedora-base")
    );
    assert_eq!(claims.params["targetNamespace"], "vms");
    assert_eq!(claims.params["targetName"], "fedora");
    assert_eq!(claims.exp - claims.iat, 300);
    // An import is let through untouched.
    let body = json(
        mutate(at, json!({"source": {"http": {"url": "https://x/y.img"}}}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(body["response"]["allowed"], true);
    assert!(body["response"]["patch"].is_null(), "{body}");
    // A sourceRef to a DataSource that does not exist is refused with NotFound, as CDI does.
    let source_ref = json!({"sourceRef": {"kind": "DataSource", "name": "fedora"}});
    let (resp, _) = tokio::join!(mutate((&f.url, &f.ca), source_ref), async {
        f.cluster
            .not_found(
                Method::GET,
                "/apis/cdi.kubevirt.io/v1beta1/namespaces/vms/datasources/fedora",
            )
            .await;
    });
    let body = json(resp.unwrap()).await;
    assert_eq!(
        (
            &body["response"]["allowed"],
            &body["response"]["status"]["code"]
        ),
        (&json!(false), &json!(400))
    );
    assert!(
        body["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains(r#"datasources.cdi.kubevirt.io "fedora" not found"#),
        "{body}"
    );
    f.cluster.silence().await;
}
