//! The cert controller and the token API against a real kube-apiserver of the test's own (they
//! write the cluster-scoped APIServices and webhook configurations, which the shared server's
//! other tests must not see):
//! - on an empty namespace the controller makes every Secret and bundle and injects `caBundle`;
//!   with certConfig durations that make the CA due it renews it, the bundle keeping the old CA;
//! - `quarry apiserver`, serving the controller's certificate, is registered as the
//!   `upload.cdi.kubevirt.io` APIServices behind an ExternalName Service (`127.0.0.1`: the
//!   aggregator resolves ExternalName Services to that host and the APIService's port), and a
//!   token request goes through the kube-apiserver for a user RBAC allows and one it does not;
//!   the token then passes the real upload proxy to a real upload server (mutual TLS with the
//!   controller's upload certificates) and the bytes land.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use api::names::{self, secret};
use certs::{self, pki};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use testkit::kube::{FRONT_PROXY_CLIENT, KubeApiServer, Options};

use super::support::wait_for;

async fn create<K>(api: &Api<K>, obj: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {obj:?}: {e}"));
}

fn api_service(name: &str, ns: &str, port: u16) -> Value {
    let version = name.split('.').next().unwrap();
    json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
           "metadata": {"name": name},
           "spec": {"group": "upload.cdi.kubevirt.io", "version": version,
                    "groupPriorityMinimum": 1000, "versionPriority": 15,
                    "service": {"namespace": ns, "name": names::service::APISERVER, "port": port}}})
}

fn webhook_config(name: &str, ns: &str) -> Value {
    // Rules that match nothing: the configuration is only a caBundle target here.
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
           "metadata": {"name": name},
           "webhooks": [{"name": "validate.quarry.example", "sideEffects": "None",
                         "admissionReviewVersions": ["v1"], "failurePolicy": "Ignore",
                         "rules": [],
                         "clientConfig": {"service": {"namespace": ns,
                                          "name": names::service::APISERVER,
                                          "path": names::webhook::DATAVOLUME_PATH}}}]})
}

async fn secret_data(client: &Client, ns: &str, name: &str) -> BTreeMap<String, String> {
    let s = Api::<Secret>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("Secret {name}: {e}"));
    s.data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect()
}

async fn bundle(client: &Client, ns: &str, name: &str) -> String {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("ConfigMap {name}: {e}"));
    cm.data.unwrap()[secret::BUNDLE_KEY].clone()
}

/// Writes `text` to `dir/name` and returns the path.
fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cert_controller_fills_an_empty_namespace_and_renews_a_due_ca_keeping_the_old_in_the_bundle()
 {
    let Some(server) = KubeApiServer::start(&Options::default()) else {
        return;
    };
    let admin = server.client();
    let ns = server.namespace("quarry", &[]).await;
    let api_services: Api<APIService> = Api::all(admin.clone());
    for name in names::API_SERVICES {
        create(&api_services, api_service(name, &ns, 8443)).await;
    }
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    for name in [
        names::webhook::HYPERCONVERGED_CONFIG,
        names::webhook::DATAVOLUME_CONFIG,
    ] {
        create(&webhooks, webhook_config(name, &ns)).await;
    }
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let mut config = webhook_config(names::webhook::DATAVOLUME_MUTATE_CONFIG, &ns);
    config["kind"] = json!("MutatingWebhookConfiguration");
    create(&mutating, config).await;

    // The controller runs as its ServiceAccount with exactly the rights the report lists.
    let ctl = controller_client(&server, &admin, &ns).await;
    let t0 = token::now();
    let out = certs::reconcile(&ctl, &ns, t0).await.unwrap();
    assert!(out.missing.is_empty(), "{:?}", out.missing);
    assert_eq!(out.injected.len(), 5, "{:?}", out.injected);
    for name in certs::plan::secret_names() {
        let data = secret_data(&admin, &ns, name).await;
        assert!(data.contains_key("tls.key"), "{name}: {:?}", data.keys());
    }
    let api_bundle = bundle(&admin, &ns, secret::APISERVER_SIGNER_BUNDLE).await;
    for name in names::API_SERVICES {
        let svc = api_services.get(name).await.unwrap();
        assert_eq!(
            svc.spec.unwrap().ca_bundle.unwrap().0,
            api_bundle.as_bytes()
        );
    }
    for name in [
        names::webhook::HYPERCONVERGED_CONFIG,
        names::webhook::DATAVOLUME_CONFIG,
    ] {
        let w = webhooks.get(name).await.unwrap().webhooks.unwrap();
        assert_eq!(
            w[0].client_config.ca_bundle.as_ref().unwrap().0,
            api_bundle.as_bytes()
        );
    }
    let w = mutating
        .get(names::webhook::DATAVOLUME_MUTATE_CONFIG)
        .await
        .unwrap()
        .webhooks
        .unwrap();
    assert_eq!(
        w[0].client_config.ca_bundle.as_ref().unwrap().0,
        api_bundle.as_bytes()
    );
    // A second pass at once writes nothing and injects nothing.
    let again = certs::reconcile(&ctl, &ns, t0 + 1).await.unwrap();
    assert!(
        again.plan.is_empty() && again.injected.is_empty(),
        "{again:?}"
    );

    // certConfig in the CDI CR: a CA renewBefore longer than what remains of the CA's 48h
    // makes it due now.
    install_cdi_crd(&admin).await;
    let cdis: Api<DynamicObject> = Api::all_with(admin.clone(), &cdi_resource());
    let cdi: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
        "metadata": {"name": "cdi-kubevirt-hyperconverged"},
        "spec": {"certConfig": {"ca": {"duration": "100h0m0s", "renewBefore": "99h0m0s"},
                                "server": {"duration": "24h0m0s", "renewBefore": "12h0m0s"}}}}))
    .unwrap();
    cdis.create(&PostParams::default(), &cdi).await.unwrap();
    let old = pki::parse_cert(&secret_data(&admin, &ns, secret::APISERVER_SIGNER).await["tls.crt"])
        .unwrap();
    let renewed = certs::reconcile(&ctl, &ns, t0 + 2).await.unwrap();
    assert_eq!(renewed.plan.signers.len(), 4, "every CA was due");
    let new = pki::parse_cert(&secret_data(&admin, &ns, secret::APISERVER_SIGNER).await["tls.crt"])
        .unwrap();
    assert_ne!(new.der, old.der);
    assert_eq!(new.not_after - new.not_before, 100 * 3600 + 60);
    let api_bundle = bundle(&admin, &ns, secret::APISERVER_SIGNER_BUNDLE).await;
    assert_eq!(pki::parse_certs(&api_bundle), vec![new.clone(), old]);
    let served =
        pki::parse_cert(&secret_data(&admin, &ns, secret::APISERVER_CERT).await["tls.crt"])
            .unwrap();
    assert!(
        served.issued_by(&new),
        "the serving certificate was re-issued by the new CA"
    );
    let svc = api_services.get(names::API_SERVICES[0]).await.unwrap();
    assert_eq!(
        svc.spec.unwrap().ca_bundle.unwrap().0,
        api_bundle.as_bytes()
    );
}

/// A client of the cert controller's ServiceAccount in `ns`, bound to the rules its calls need:
/// Secrets and ConfigMaps get, create and patch (a server-side apply that creates an object
/// needs `create` too) in `ns`; APIServices and
/// ValidatingWebhookConfigurations get/patch; CDIs list.
async fn controller_client(server: &KubeApiServer, admin: &Client, ns: &str) -> Client {
    let sa = names::component::CERT_CONTROLLER;
    let client = server.service_account_client(ns, sa).await;
    let subject = json!([{"kind": "ServiceAccount", "name": sa, "namespace": ns}]);
    create(
        &Api::<Role>::namespaced(admin.clone(), ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": sa},
               "rules": [{"apiGroups": [""], "resources": ["secrets", "configmaps"],
                          "verbs": ["get", "create", "patch"]}]}),
    )
    .await;
    create(
        &Api::<RoleBinding>::namespaced(admin.clone(), ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": sa},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
               "subjects": subject}),
    )
    .await;
    let cluster_name = format!("{sa}-{ns}");
    create(
        &Api::<ClusterRole>::all(admin.clone()),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": cluster_name},
               "rules": [
                 {"apiGroups": ["apiregistration.k8s.io"], "resources": ["apiservices"],
                  "resourceNames": names::API_SERVICES, "verbs": ["get", "patch"]},
                 {"apiGroups": ["admissionregistration.k8s.io"],
                  "resources": ["validatingwebhookconfigurations"],
                  "resourceNames": [names::webhook::HYPERCONVERGED_CONFIG,
                                    names::webhook::DATAVOLUME_CONFIG],
                  "verbs": ["get", "patch"]},
                 {"apiGroups": ["admissionregistration.k8s.io"],
                  "resources": ["mutatingwebhookconfigurations"],
                  "resourceNames": [names::webhook::DATAVOLUME_MUTATE_CONFIG],
                  "verbs": ["get", "patch"]},
                 {"apiGroups": ["cdi.kubevirt.io"], "resources": ["cdis"], "verbs": ["list"]}]}),
    )
    .await;
    create(
        &Api::<ClusterRoleBinding>::all(admin.clone()),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": cluster_name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": cluster_name},
               "subjects": subject}),
    )
    .await;
    // RBAC reaches the authorizer through its informers: wait until both bindings count.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let api_services: Api<APIService> = Api::all(client.clone());
    wait_for("the cert controller's RBAC in force", || async {
        secrets.get_opt(secret::APISERVER_SIGNER).await.ok()?;
        api_services.get_opt(names::API_SERVICES[0]).await.ok()?;
        Some(())
    })
    .await;
    client
}

fn cdi_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cdi.kubevirt.io", "v1beta1", "CDI"),
        "cdis",
    )
}

/// A minimal `cdis.cdi.kubevirt.io` CRD (any spec kept), for the certConfig the controller reads.
async fn install_cdi_crd(client: &Client) {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "cdis.cdi.kubevirt.io"},
        "spec": {"group": "cdi.kubevirt.io", "scope": "Cluster",
                 "names": {"kind": "CDI", "plural": "cdis", "singular": "cdi", "listKind": "CDIList"},
                 "versions": [{"name": "v1beta1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                 "x-kubernetes-preserve-unknown-fields": true}}}]}}))
    .unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        "cdis.cdi.kubevirt.io",
        &PatchParams::apply("quarry-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    let cdis: Api<DynamicObject> = Api::all_with(client.clone(), &cdi_resource());
    wait_for("the CDI CRD served", || async {
        cdis.list(&Default::default()).await.ok().map(|_| ())
    })
    .await;
}

/// POSTs an UploadTokenRequest through the kube-apiserver; the status code and body.
async fn token_request(client: &Client, ns: &str, pvc: &str) -> (u16, Value) {
    let body = json!({"apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
                      "metadata": {"name": "t"}, "spec": {"pvcName": pvc}});
    let req = http::Request::post(format!(
        "/apis/upload.cdi.kubevirt.io/v1beta1/namespaces/{ns}/uploadtokenrequests"
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body).unwrap())
    .unwrap();
    match client.request_text(req).await {
        Ok(text) => (200, serde_json::from_str(&text).unwrap()),
        Err(kube::Error::Api(s)) => (s.code, json!({"message": s.message})),
        Err(e) => panic!("token request: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_the_aggregated_token_api_uploads_through_the_real_proxy() {
    let Some(server) = KubeApiServer::start(&Options::default()) else {
        return;
    };
    let admin = server.client();
    let ns = server.namespace("quarry", &[]).await;
    let users = server.namespace("vms", &[]).await;
    let dir = tempfile::tempdir().unwrap();

    // The install's TLS, by the cert controller.
    certs::reconcile(&admin, &ns, token::now()).await.unwrap();
    let serving = secret_data(&admin, &ns, secret::APISERVER_CERT).await;
    let token_key = secret_data(&admin, &ns, secret::UPLOAD_TOKEN_KEY).await;

    // The token API on 127.0.0.1, with the controller's serving certificate.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    drop(tcp);
    let front_proxy = server.front_proxy();
    let args = cdi::apiserver::ApiServerArgs {
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        tls_cert: file(dir.path(), "api.crt", &serving["tls.crt"]),
        tls_key: file(dir.path(), "api.key", &serving["tls.key"]),
        signing_key: file(dir.path(), "token.key", &token_key["tls.key"]),
        token_ttl: 300,
        requestheader_client_ca: Some(front_proxy.client_ca.clone()),
        requestheader_allowed_names: vec![FRONT_PROXY_CLIENT.into()],
    };
    cdi::apiserver::start(admin.clone(), &args).await.unwrap();

    // Registered behind an ExternalName Service; the controller injects the caBundle.
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns);
    create(
        &services,
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": names::service::APISERVER},
               "spec": {"type": "ExternalName", "externalName": "127.0.0.1"}}),
    )
    .await;
    let api_services: Api<APIService> = Api::all(admin.clone());
    for name in names::API_SERVICES {
        create(&api_services, api_service(name, &ns, port)).await;
    }
    let out = certs::reconcile(&admin, &ns, token::now()).await.unwrap();
    assert_eq!(out.injected.len(), 2, "{out:?}");
    for name in names::API_SERVICES {
        wait_for(&format!("APIService {name} Available"), || async {
            let s = api_services.get(name).await.ok()?;
            s.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
                .then_some(())
        })
        .await;
    }

    // alice may create upload tokens in `users`; bob may not.
    let roles: Api<Role> = Api::namespaced(admin.clone(), &users);
    create(
        &roles,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "uploader"},
               "rules": [{"apiGroups": ["upload.cdi.kubevirt.io"],
                          "resources": ["uploadtokenrequests"], "verbs": ["create"]}]}),
    )
    .await;
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), &users);
    create(
        &bindings,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "alice-uploads"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "uploader"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}),
    )
    .await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &users);
    create(
        &pvcs,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": "disk",
                            "annotations": {cdi::datavolume::ANN_UPLOAD_TARGET: ""}},
               "spec": {"accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Mi"}}}}),
    )
    .await;

    let (code, body) = token_request(&server.client_as("alice", &[]), &users, "disk").await;
    assert_eq!(code, 200, "{body}");
    let token = body["status"]["token"].as_str().unwrap().to_string();
    let (code, body) = token_request(&server.client_as("bob", &[]), &users, "disk").await;
    // The kube-apiserver authorizes the request before proxying it (and the token API asks
    // again with a SubjectAccessReview): bob is refused with 403.
    assert_eq!(code, 403, "{body}");
    assert!(body["message"].as_str().unwrap().contains("bob"), "{body}");

    // The token through the real upload proxy to a real upload server, over the mutual TLS the
    // controller's upload signers make.
    let landed = upload_through_proxy(
        &admin,
        &ns,
        dir.path(),
        &token_key["public.pem"],
        &users,
        &token,
    )
    .await;
    assert_eq!(landed, payload());
}

fn payload() -> Vec<u8> {
    (0..1024 * 1024u32).map(|i| (i % 251) as u8).collect()
}

async fn upload_through_proxy(
    admin: &Client,
    ns: &str,
    dir: &Path,
    public_pem: &str,
    users: &str,
    token: &str,
) -> Vec<u8> {
    // The upload server: a serving certificate of the upload server signer (as the DataVolume
    // controller issues), the proxy's client CA bundle required.
    let signer = secret_data(admin, ns, secret::UPLOAD_SERVER_SIGNER).await;
    let signer = pki::Pair {
        cert: signer["tls.crt"].clone(),
        key: signer["tls.key"].clone(),
    };
    let now = token::now();
    let served = pki::make_signed(
        &signer,
        &pki::Usage::Server(vec!["localhost".into()]),
        now,
        now + 3600,
    )
    .unwrap();
    let target = dir.join("disk.img");
    let config = uploader::server::Config {
        target: target.clone(),
        size: None,
        filesystem_overhead: None,
        preallocate: false,
        archive: false,
        resume_window: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(30),
    };
    let tls = uploader::net::TlsFiles {
        cert: file(dir, "up.crt", &served.cert),
        key: file(dir, "up.key", &served.key),
        client_ca: Some(file(
            dir,
            "client-ca.crt",
            &bundle(admin, ns, secret::UPLOAD_SERVER_CLIENT_SIGNER_BUNDLE).await,
        )),
    };
    let tls = uploader::net::server_config(&tls).unwrap();
    let listener = uploader::net::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let upload_port = listener.local_addr().unwrap().port();
    let (router, _) = uploader::server::router(config);
    tokio::spawn(uploader::net::serve(
        listener,
        Some(tls),
        router,
        Default::default(),
        std::future::pending(),
    ));

    // The proxy: the token key's public half, the upload servers' bundle, its client cert.
    let client_cert = secret_data(admin, ns, secret::UPLOAD_PROXY_CLIENT_CERT).await;
    let upstream_ca = file(
        dir,
        "server-ca.crt",
        &bundle(admin, ns, secret::UPLOAD_SERVER_SIGNER_BUNDLE).await,
    );
    let (cc, ck) = (
        file(dir, "proxy-client.crt", &client_cert["tls.crt"]),
        file(dir, "proxy-client.key", &client_cert["tls.key"]),
    );
    let client = uploader::reload::ReloadingUpstream::new(
        Some(&upstream_ca),
        Some((cc.as_path(), ck.as_path())),
    )
    .unwrap();
    let public_key = token::load_public_key(&file(dir, "token.pub", public_pem)).unwrap();
    let routes = BTreeMap::from([(
        (users.to_string(), "disk".to_string()),
        format!("https://localhost:{upload_port}"),
    )]);
    let proxy = uploader::proxy::router(uploader::proxy::Proxy {
        public_key,
        upstreams: uploader::proxy::Upstreams::Static(routes),
        client,
        upstream_wait: std::time::Duration::from_secs(1),
    });
    let listener = uploader::net::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    tokio::spawn(uploader::net::serve(
        listener,
        None,
        proxy,
        Default::default(),
        std::future::pending(),
    ));

    importer::source::http::install_tls_provider();
    let response = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{proxy_port}/v1beta1/upload"))
        .bearer_auth(token)
        .body(payload())
        .send()
        .await
        .unwrap();
    let status = response.status();
    assert!(
        status.is_success(),
        "{status}: {}",
        response.text().await.unwrap()
    );
    std::fs::read(&target).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_pod_gets_a_certificate_of_the_upload_server_signer_in_a_secret_its_datavolume_owns()
 {
    use api::DataVolume;
    use cdi::datavolume::controller::{self, Context};
    use cdi::settings::{Config, UploadTls};

    let Some(server) = KubeApiServer::start(&Options::default()) else {
        return;
    };
    let admin = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let crd = <DataVolume as kube::CustomResourceExt>::crd();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let dvs_all: Api<DataVolume> = Api::all(admin.clone());
    wait_for("the DataVolume CRD served", || async {
        dvs_all.list(&Default::default()).await.ok().map(|_| ())
    })
    .await;
    let install = server.namespace("quarry", &[]).await;
    let ns = server
        .namespace(
            "vms",
            &[
                ("pod-security.kubernetes.io/enforce", "restricted"),
                ("pod-security.kubernetes.io/enforce-version", "latest"),
            ],
        )
        .await;
    // The controller's loop (what `quarry controller certs` runs) fills the install namespace.
    let certs_task = tokio::spawn(certs::run(
        admin.clone(),
        install.clone(),
        Duration::from_secs(300),
    ));
    let install_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &install);
    wait_for("the cert controller's bundles", || async {
        install_maps
            .get_opt(secret::UPLOAD_SERVER_CLIENT_SIGNER_BUNDLE)
            .await
            .ok()?
            .map(|_| ())
    })
    .await;
    wait_for("the cert controller's last Secret", || async {
        Api::<Secret>::namespaced(admin.clone(), &install)
            .get_opt(secret::UPLOAD_TOKEN_KEY)
            .await
            .ok()?
            .map(|_| ())
    })
    .await;

    let config = Config {
        upload_tls: Some(UploadTls::Issued {
            namespace: install.clone(),
        }),
        ..Config::default()
    };
    let ctx = std::sync::Arc::new(Context::new(admin.clone(), config, Default::default()));
    let scope = ns.clone();
    let task = tokio::spawn(async move { controller::run(ctx, Some(&scope)).await });

    let dvs: Api<DataVolume> = Api::namespaced(admin.clone(), &ns);
    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "up"},
        "spec": {"source": {"upload": {}},
                 "storage": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}}}}}))
    .unwrap();
    let dv = dvs.create(&PostParams::default(), &dv).await.unwrap();
    super::support::bind_pvc(&admin, &ns, "up").await;
    // The pod is admitted under Pod Security `restricted` with its Secret volume.
    let pod = super::support::pod(&admin, &ns, "cdi-upload-up", None).await;
    task.abort();
    certs_task.abort();

    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
    let s = secrets.get("cdi-upload-up").await.unwrap();
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("DataVolume", dv.metadata.uid.as_deref().unwrap())
    );
    let data = secret_data(&admin, &ns, "cdi-upload-up").await;
    assert_eq!(
        data["ca.crt"],
        bundle(&admin, &install, secret::UPLOAD_SERVER_CLIENT_SIGNER_BUNDLE).await
    );
    // The certificate verifies, for the upload Service's name, against the bundle the proxy
    // trusts.
    let mut roots = rustls::RootCertStore::empty();
    let trusted = bundle(&admin, &install, secret::UPLOAD_SERVER_SIGNER_BUNDLE).await;
    for c in pki::parse_certs(&trusted) {
        roots.add(c.der.into()).unwrap();
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        std::sync::Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    let leaf = pki::parse_cert(&data["tls.crt"]).unwrap();
    let host = format!("cdi-upload-up.{ns}.svc");
    rustls::client::danger::ServerCertVerifier::verify_server_cert(
        verifier.as_ref(),
        &leaf.der.into(),
        &[],
        &rustls::pki_types::ServerName::try_from(host.as_str()).unwrap(),
        &[],
        rustls::pki_types::UnixTime::now(),
    )
    .unwrap_or_else(|e| panic!("the upload server certificate for {host}: {e}"));
    let spec = pod.spec.unwrap();
    assert!(
        spec.volumes.unwrap().iter().any(|v| v
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref())
            == Some("cdi-upload-up"))
    );
    let args = spec.containers[0].args.clone().unwrap();
    assert!(
        args.windows(2).any(|w| w == ["--client-ca", "/tls/ca.crt"]),
        "{args:?}"
    );
}
