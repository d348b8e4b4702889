//! The whole `deploy/` bundle against a real API server of its own (the bundle has
//! cluster-scoped objects): every file applied in order (server-side apply) and accepted; every
//! Deployment's pod admitted under Pod Security `restricted`; then each component runs with
//! nothing but its own ServiceAccount's generated RBAC, so a missing permission fails (403).

use std::path::Path;
use std::sync::Arc;

use api::cdi::CDI_CONFIG_NAME;
use api::names::DEFAULT_IMAGE;
use api::names::{self, NAMESPACE, component};
use api::{CdiConfig, DataVolume, HostPathProvisioner, StorageProfile};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, ServiceAccount};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};
use kubekit::leader::{Elector, Timing};
use serde_json::{Value, json};
use testkit::kube::{FRONT_PROXY_CLIENT, KubeApiServer, Options};

use crate::support::{apply, bind_pvc, established, hyperconverged_degraded, pod, wait_for};

/// The objects of one generated file, read from the checkout.
fn objects_of(rel: &Path) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n---\n")
        .map(|doc| {
            serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

/// A Pod made from `template` (a pod template), named `name`.
fn pod_from(template: &Value, name: &str) -> Pod {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
                       "metadata": template["metadata"].clone(), "spec": template["spec"].clone()});
    p["metadata"]["name"] = json!(name);
    serde_json::from_value(p).unwrap()
}

#[tokio::test]
async fn the_whole_bundle_applies_its_pods_are_admitted_and_each_component_needs_only_its_rbac() {
    let Some(server) = tokio::task::spawn_blocking(|| KubeApiServer::start(&Options::default()))
        .await
        .unwrap()
    else {
        return;
    };
    let admin = server.client();

    let sa = |c: &'static str| server.service_account_client(NAMESPACE, c);

    // 1. Every file, in the generated order (namespace, CRDs, the rest), is accepted.
    let files = bundle::manifests(DEFAULT_IMAGE).unwrap();
    let mut templates = Vec::new();
    for (rel, _) in &files {
        if rel.ends_with("kustomization.yaml") {
            continue;
        }
        for obj in objects_of(rel) {
            apply(&admin, &obj)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", rel.display()));
            match obj["kind"].as_str() {
                Some("CustomResourceDefinition") => {
                    established(&admin, obj["metadata"]["name"].as_str().unwrap()).await;
                }
                Some("Deployment") => templates.push((
                    obj["metadata"]["name"].as_str().unwrap().to_string(),
                    obj["spec"]["template"].clone(),
                )),
                _ => {}
            }
        }
    }
    assert_eq!(
        templates.len(),
        6,
        "{:?}",
        templates.iter().map(|t| &t.0).collect::<Vec<_>>()
    );
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NAMESPACE);
    for (name, _) in &templates {
        deployments.get(name).await.unwrap();
    }

    // 2. Each Deployment's pod is admitted where `restricted` is enforced; the CSI driver's is
    // not (it needs the namespace's privileged level), and is admitted in the bundle's namespace.
    let restricted = server
        .namespace(
            "restricted",
            &[
                ("pod-security.kubernetes.io/enforce", "restricted"),
                ("pod-security.kubernetes.io/enforce-version", "latest"),
            ],
        )
        .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &restricted);
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &restricted);
    for (name, template) in &templates {
        let sa = ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        sas.create(&PostParams::default(), &sa).await.unwrap();
        pods.create(&PostParams::default(), &pod_from(template, name))
            .await
            .unwrap_or_else(|e| panic!("{name}'s pod under restricted: {e}"));
    }
    // The CSI DaemonSet is the HostPathProvisioner controller's, from its default CR.
    let (pool, path) = bundle::DEFAULT_POOL.split_once('=').unwrap();
    let hpp = api::HostPathProvisioner::with_pool(pool, path);
    let driver = hco::hostpath::objects::driver_objects(&hpp, &Default::default()).unwrap();
    let template = serde_json::to_value(&driver.daemon_set.spec.unwrap().template).unwrap();
    let csi = pod_from(&template, "quarry-csi");
    match pods.create(&PostParams::default(), &csi).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("the CSI pod under restricted: {other:?}"),
    }
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    sas.create(&PostParams::default(), &driver.service_account)
        .await
        .unwrap();
    Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &csi)
        .await
        .expect("the CSI pod in the privileged namespace");

    // 3. The cert controller, with only its ServiceAccount's RBAC, makes every Secret and bundle
    // and injects the caBundle of the bundle's APIServices and webhook configurations.
    cert_controller(&admin, sa(component::CERT_CONTROLLER).await).await;

    // The webhooks have no server here: with failurePolicy Fail they would refuse every
    // HyperConverged and DataVolume below. They are not under test here.
    // 4. Each other component with only its own ServiceAccount's RBAC.
    for name in [
        names::webhook::HYPERCONVERGED_CONFIG,
        names::webhook::DATAVOLUME_CONFIG,
    ] {
        let api: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
            Api::all(admin.clone());
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let api: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(admin.clone());
    api.delete(
        names::webhook::DATAVOLUME_MUTATE_CONFIG,
        &DeleteParams::default(),
    )
    .await
    .unwrap();

    leader_election(
        &sa(component::DATAVOLUME_CONTROLLER).await,
        component::DATAVOLUME_CONTROLLER,
    )
    .await;
    leader_election(
        &sa(component::CERT_CONTROLLER).await,
        component::CERT_CONTROLLER,
    )
    .await;
    hostpath(&admin, sa(component::HOSTPATH_CONTROLLER).await).await;
    hyperconverged(&admin, sa(component::HYPERCONVERGED_CONTROLLER).await).await;
    datavolume(&server, &admin, sa(component::DATAVOLUME_CONTROLLER).await).await;
    token_api(&server, sa(component::APISERVER).await).await;
}

/// The controller's own Lease, and no other.
async fn leader_election(client: &Client, component: &str) {
    let lease = names::lease(component);
    let mut own = Elector::new(
        client.clone(),
        NAMESPACE,
        &lease,
        "pod-a",
        Timing::default(),
    );
    assert!(own.try_acquire_or_renew().await.unwrap(), "{component}");
    assert!(
        own.try_acquire_or_renew().await.unwrap(),
        "{component} renews"
    );
    own.release().await.unwrap();
    let mut other = Elector::new(
        client.clone(),
        NAMESPACE,
        "someone-else",
        "pod-a",
        Timing::default(),
    );
    match other.try_acquire_or_renew().await {
        Err(kubekit::Error::Kube(kube::Error::Api(e))) => assert_eq!(e.code, 403, "{e:?}"),
        r => panic!("{component} on another Lease: {r:?}"),
    }
}

/// The HostPathProvisioner controller takes the bundle's CSI objects over for the default CR,
/// and may read its own pod (the image it gives the driver).
async fn hostpath(admin: &Client, client: Client) {
    let mut own: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "own"},
        "spec": {"serviceAccountName": component::HOSTPATH_CONTROLLER,
                 "containers": [{"name": "c", "image": "registry.example/quarry:own"}]}
    }))
    .unwrap();
    own = Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &own)
        .await
        .unwrap();
    assert_eq!(
        kubekit::kubeops::pod_image(&client, NAMESPACE, &own.name_any())
            .await
            .as_deref(),
        Some("registry.example/quarry:own")
    );
    // with no HostPathProvisioner, the controller makes the default one (under its own RBAC)
    let (pool, path) = bundle::DEFAULT_POOL.split_once('=').unwrap();
    hco::hostpath::controller::ensure_one(&client, (pool.into(), path.into()))
        .await
        .unwrap();
    let ctl = tokio::spawn(hco::hostpath::controller::run(
        client,
        Default::default(),
        Arc::default(),
    ));
    let hpps: Api<HostPathProvisioner> = Api::all(admin.clone());
    let created = hpps.get("hostpath-provisioner").await.unwrap();
    assert_eq!(created.spec.storage_pools[0].path, path);
    let ds: Api<DaemonSet> = Api::namespaced(admin.clone(), NAMESPACE);
    wait_for("the controller owning the CSI DaemonSet", || async {
        let d = ds.get("quarry-csi").await.ok()?;
        (d.owner_references().first()?.uid == created.uid()?).then_some(())
    })
    .await;
    let classes: Api<StorageClass> = Api::all(admin.clone());
    wait_for("the StorageClass owned", || async {
        let c = classes.get("hostpath-csi-local").await.ok()?;
        (!c.owner_references().is_empty()).then_some(())
    })
    .await;
    let st = wait_for("the HostPathProvisioner's status", || async {
        hpps.get(&created.name_any()).await.ok()?.status
    })
    .await;
    ctl.abort();
    for c in &st.conditions {
        let m = c.message.as_deref().unwrap_or_default();
        assert!(!m.contains("forbidden"), "{c:?}");
    }
}

/// The HyperConverged controller applies its first child (a CDI, whose CRD is in the bundle)
/// and reports the next missing CRD: every call before it was allowed.
async fn hyperconverged(admin: &Client, client: Client) {
    let ctl = tokio::spawn(hco::hyperconverged::controller::run(
        client,
        NAMESPACE.into(),
        Arc::default(),
    ));
    let degraded = hyperconverged_degraded(admin, NAMESPACE).await;
    ctl.abort();
    assert!(
        degraded.message.contains("kubevirts.kubevirt.io"),
        "{degraded:?}"
    );
    let cdis = Api::<DynamicObject>::all_with(
        admin.clone(),
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cdi.kubevirt.io", "v1beta1", "CDI"),
            "cdis",
        ),
    );
    cdis.get("cdi-kubevirt-hyperconverged").await.unwrap();
}

/// The DataVolume controller's process (with its CDIConfig, StorageProfile and DataSource
/// reconcilers) makes a PVC and an importer pod in a user's namespace, the CDIConfig with its
/// status, and the StorageProfile of the bundle's StorageClass.
async fn datavolume(server: &KubeApiServer, admin: &Client, client: Client) {
    let ns = server.namespace("user", &[]).await;
    let ctx = Arc::new(cdi::datavolume::controller::Context::new(
        client,
        Default::default(),
        Arc::default(),
    ));
    let ctl = tokio::spawn(async move { operators::process::cdi(ctx, None).await });
    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "fedora"},
        "spec": {"source": {"http": {"url": "http://images.example/fedora.qcow2"}},
                 "storage": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}}}}
    }))
    .unwrap();
    Api::<DataVolume>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &dv)
        .await
        .unwrap();
    bind_pvc(admin, &ns, "fedora").await;
    pod(admin, &ns, "importer-fedora", None).await;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin.clone(), &ns);
    wait_for("an event of the DataVolume controller", || async {
        let list = events.list(&Default::default()).await.ok()?;
        (!list.items.is_empty()).then_some(())
    })
    .await;
    let configs: Api<CdiConfig> = Api::all(admin.clone());
    wait_for("the CDIConfig's status", || async {
        configs.get(CDI_CONFIG_NAME).await.ok()?.status
    })
    .await;
    let profiles: Api<StorageProfile> = Api::all(admin.clone());
    wait_for("the StorageProfile of the bundle's class", || async {
        profiles.get("hostpath-csi-local").await.ok()?.status
    })
    .await;
    ctl.abort();
    Api::<PersistentVolumeClaim>::namespaced(admin.clone(), &ns)
        .get("fedora")
        .await
        .unwrap();
}

/// `quarry apiserver`'s calls: the front-proxy ConfigMap in kube-system (what it trusts without
/// `--requestheader-client-ca`), SubjectAccessReviews, PVCs.
async fn token_api(server: &KubeApiServer, client: Client) {
    let (auth, ca) = cdi::apiserver::front_proxy_from_cluster(&client)
        .await
        .unwrap();
    let front_proxy = std::fs::read_to_string(server.front_proxy().client_ca).unwrap();
    assert_eq!(ca.trim(), front_proxy.trim());
    assert_eq!(auth.allowed_names, [FRONT_PROXY_CLIENT]);
    assert_eq!(auth.username_headers, ["X-Remote-User"]);
    let sar: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "alice", "resourceAttributes": {"namespace": "default", "verb": "create",
                 "group": "upload.cdi.kubevirt.io", "resource": "uploadtokenrequests"}}
    }))
    .unwrap();
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &sar)
        .await
        .unwrap();
    assert!(!answer.status.unwrap().allowed);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    match pvcs.get("missing").await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 404, "{e:?}"),
        r => panic!("{r:?}"),
    }
}

/// The cert controller's first pass over the applied bundle: every signer, certificate and
/// bundle written, the caBundle of both APIServices and both webhook configurations set (and
/// nothing missing), a second pass changing nothing; Secrets elsewhere are out of its reach.
async fn cert_controller(admin: &Client, client: Client) {
    let now = token::now();
    let first = certs::reconcile(&client, NAMESPACE, now).await.unwrap();
    assert!(first.missing.is_empty(), "{:?}", first.missing);
    let mut injected = first.injected.clone();
    injected.sort();
    let webhooks = [
        names::webhook::HYPERCONVERGED_CONFIG,
        names::webhook::DATAVOLUME_CONFIG,
    ];
    let mut expected: Vec<String> = names::API_SERVICES
        .iter()
        .map(|n| format!("APIService/{n}"))
        .chain(
            webhooks
                .iter()
                .map(|n| format!("ValidatingWebhookConfiguration/{n}")),
        )
        .chain([format!(
            "MutatingWebhookConfiguration/{}",
            names::webhook::DATAVOLUME_MUTATE_CONFIG
        )])
        .collect();
    expected.sort();
    assert_eq!(injected, expected);
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    for name in [
        names::secret::APISERVER_CERT,
        names::secret::HYPERCONVERGED_WEBHOOK_CERT,
        names::secret::UPLOAD_PROXY_CERT,
        names::secret::UPLOAD_PROXY_CLIENT_CERT,
        names::secret::UPLOAD_TOKEN_KEY,
    ] {
        let s = secrets.get(name).await.unwrap();
        assert!(
            s.data.is_some_and(|d| d.values().all(|v| !v.0.is_empty())),
            "{name}"
        );
    }
    let apiservices = Api::<DynamicObject>::all_with(
        admin.clone(),
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
            "apiservices",
        ),
    );
    for name in names::API_SERVICES {
        let a = apiservices.get(name).await.unwrap();
        assert!(
            a.data["spec"]["caBundle"]
                .as_str()
                .is_some_and(|b| !b.is_empty()),
            "{name}"
        );
    }
    let second = certs::reconcile(&client, NAMESPACE, now + 1).await.unwrap();
    assert!(second.plan.is_empty(), "{:?}", second.plan);
    assert!(second.injected.is_empty(), "{:?}", second.injected);
    match Api::<Secret>::namespaced(client, "default")
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        r => panic!("{r:?}"),
    }
}

/// Whether `kubectl` (with its built-in kustomize) runs here; says why not.
fn kubectl_present() -> bool {
    let found = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("skipping: kubectl is not installed (scripts/setup.sh installs it)");
    }
    found
}

fn kubectl() -> std::process::Command {
    std::process::Command::new("kubectl")
}

/// What the README tells an admin to run: `kubectl apply -k` of `deploy/`, here through an
/// overlay that sets the image with kustomize `images:` (the one image setting). Every Quarry
/// container gets the new image, and the real API server accepts the whole install.
#[tokio::test]
async fn kubectl_apply_k_of_an_overlay_installs_the_bundle_with_its_image() {
    if !kubectl_present() {
        return;
    }
    let Some(server) = tokio::task::spawn_blocking(|| KubeApiServer::start(&Options::default()))
        .await
        .unwrap()
    else {
        return;
    };
    // kustomize refuses absolute resource paths: a copy of deploy/ beside the overlay.
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(repo.join("deploy"))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let overlay = dir.path().join("overlay");
    std::fs::create_dir(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "resources:\n- ../deploy\nimages:\n- name: quay.io/quarry/quarry\n  newName: registry.example/quarry\n  newTag: v1\n",
    )
    .unwrap();

    let out = kubectl().arg("kustomize").arg(&overlay).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let images: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .collect();
    let ours = images.iter().filter(|i| i.contains("quarry")).count();
    // Six Deployments (the CSI driver takes the hostpath controller's own image at run time).
    assert_eq!(ours, 6, "{images:?}");
    assert!(
        images
            .iter()
            .filter(|i| i.contains("quarry"))
            .all(|i| *i == "registry.example/quarry:v1"),
        "{images:?}"
    );

    let out = kubectl()
        .arg("--kubeconfig")
        .arg(server.kubeconfig())
        .args(["apply", "--server-side", "-k"])
        .arg(&overlay)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl apply -k: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let admin = server.client();
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NAMESPACE);
    let listed = deployments.list(&Default::default()).await.unwrap();
    let mut names: Vec<String> = listed.items.iter().map(|d| d.name_any()).collect();
    names.sort();
    let mut expected = [
        component::APISERVER,
        component::CERT_CONTROLLER,
        component::DATAVOLUME_CONTROLLER,
        component::HOSTPATH_CONTROLLER,
        component::HYPERCONVERGED_CONTROLLER,
        component::UPLOAD_PROXY,
    ]
    .map(String::from)
    .to_vec();
    expected.sort();
    assert_eq!(names, expected);
    for d in &listed.items {
        let image = d
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .image
            .clone();
        assert_eq!(
            image.as_deref(),
            Some("registry.example/quarry:v1"),
            "{}",
            d.name_any()
        );
    }
    // the CSI DaemonSet is the HostPathProvisioner controller's, not the bundle's
    assert!(
        Api::<DaemonSet>::namespaced(admin.clone(), NAMESPACE)
            .get_opt("quarry-csi")
            .await
            .unwrap()
            .is_none()
    );
    for (rel, _) in bundle::manifests(DEFAULT_IMAGE).unwrap() {
        if rel.starts_with("deploy/crds") {
            let name = rel.file_stem().unwrap().to_str().unwrap().to_string();
            established(&admin, &name).await;
        }
    }
}
