//! Clones by the DataVolume controller against the real API server, each strategy's object
//! sequence with the test playing scheduler, kubelet, CSI snapshotter and resizer (writing PVC,
//! Pod and VolumeSnapshot status); and CDI's SubjectAccessReviews answered by the server's RBAC.
//!
//! The snapshot API's CRDs are not Kubernetes' own: minimal ones are installed here (test
//! support only; CDI and HCO do not ship them either, the cluster's CSI snapshotter does).

use api::snapshot::VolumeSnapshot;
use api::{DataVolume, Phase, StorageProfile};
use cdi::datavolume::clone::objects::ANN_SELECTED_NODE;
use cdi::datavolume::clone::token as clone_token;
use cdi::datavolume::source::CloneSourceKind;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PostParams};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::{Value, json};

use crate::datavolume::{config, start};
use crate::support::{
    apply, component_client, established, exited, namespace, pod, running, set_pod_status,
    test_writes, wait_for,
};

pub(crate) const DRIVER: &str = "kubevirt.io.hostpath-provisioner";
const GI: u64 = 1 << 30;

/// Minimal VolumeSnapshotClass and VolumeSnapshotContent CRDs (any fields kept), and the
/// VolumeSnapshot schema of the fields Quarry uses.
pub(crate) async fn install_snapshot_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let open = |kind: &str, plural: &str, scope: &str| -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.snapshot.storage.k8s.io")},
            "spec": {"group": "snapshot.storage.k8s.io", "scope": scope,
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(),
                          "listKind": format!("{kind}List")},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .unwrap()
    };
    for crd in [
        VolumeSnapshot::crd(),
        open("VolumeSnapshotClass", "volumesnapshotclasses", "Cluster"),
        open("VolumeSnapshotContent", "volumesnapshotcontents", "Cluster"),
    ] {
        let mut crd = crd;
        // A k8s.io group: the server wants the API review's link, as the snapshotter's carry.
        crd.metadata.annotations.get_or_insert_default().insert(
            "api-approved.kubernetes.io".into(),
            "https://github.com/kubernetes-csi/external-snapshotter/pull/419".into(),
        );
        let name = crd.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &kube::api::PatchParams::apply("quarry-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
        established(client, &name).await;
    }
}

/// A StorageClass of the hostpath driver (expandable), named after the test's namespace, with
/// a StorageProfile whose `status.cloneStrategy` is `strategy` (its spec says so too: a profile
/// reconciler of another test, which rewrites the status, keeps it).
async fn class(client: &Client, ns: &str, strategy: &str) -> String {
    let name = format!("hostpath-{ns}");
    apply(
        client,
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": name}, "provisioner": DRIVER,
                "allowVolumeExpansion": true}),
    )
    .await
    .unwrap();
    apply(
        client,
        &json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "StorageProfile",
                "metadata": {"name": name}, "spec": {"cloneStrategy": strategy}}),
    )
    .await
    .unwrap();
    let profiles: Api<StorageProfile> = Api::all(client.clone());
    profiles
        .patch_status(
            &name,
            &test_writes(),
            &Patch::Merge(json!({"status": {"cloneStrategy": strategy, "storageClass": name}})),
        )
        .await
        .unwrap();
    name
}

/// A bound source PVC `golden-disk` of `class` in `ns`, 1 GiB, on node-a.
async fn source_pvc(client: &Client, ns: &str, class: &str) {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let p: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "golden-disk", "annotations": {ANN_SELECTED_NODE: "node-a"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &p).await.unwrap();
    set_pvc_status(client, ns, "golden-disk", GI).await;
}

/// Plays binder and resizer: Bound with `capacity` bytes.
async fn set_pvc_status(client: &Client, ns: &str, name: &str, capacity: u64) {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    pvcs.patch_status(
        name,
        &test_writes(),
        &Patch::Merge(json!({"status": {"phase": "Bound",
            "capacity": {"storage": capacity.to_string()}}})),
    )
    .await
    .unwrap_or_else(|e| panic!("PVC {name} status: {e}"));
}

/// The key pair of clone tokens in these tests (made once).
fn token_key() -> &'static token::PrivateKey {
    static KEY: std::sync::OnceLock<token::PrivateKey> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let (private, _) = token::generate().unwrap();
        token::private_key_from_pem(&private, "test").unwrap()
    })
}

/// The controller settings of these tests, checking clone tokens with [`token_key`].
fn token_config() -> cdi::settings::Config {
    cdi::settings::Config {
        clone_token_key: Some(token_key().to_public_key()),
        ..config()
    }
}

/// The annotations of `vm-disk` in `ns` cloning `src_ns/golden-disk`: the webhook's clone token
/// (issued now) when the namespaces differ.
fn token_annotations(ns: &str, src_ns: &str) -> Value {
    if ns == src_ns {
        return json!({});
    }
    let source = (src_ns, "golden-disk");
    let now = token::now();
    let c = clone_token::claims(CloneSourceKind::Pvc, source, (ns, "vm-disk"), now);
    let t = token::sign(&c, token_key()).unwrap();
    json!({ clone_token::ANN_CLONE_TOKEN: t })
}

async fn create_dv(client: &Client, ns: &str, source: Value, class: &str, size: &str) {
    let src_ns = source
        .pointer("/pvc/namespace")
        .and_then(Value::as_str)
        .unwrap_or(ns);
    let annotations = token_annotations(ns, src_ns);
    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "vm-disk", "annotations": annotations},
        "spec": {"source": source, "storage": {"accessModes": ["ReadWriteOnce"],
            "storageClassName": class, "resources": {"requests": {"storage": size}}}}
    }))
    .unwrap();
    let api: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &dv).await.unwrap();
}

async fn phase(client: &Client, ns: &str, want: Phase) -> DataVolume {
    let api: Api<DataVolume> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("DataVolume phase {}", want.as_str()), || async {
        let dv = api.get("vm-disk").await.ok()?;
        (dv.status.as_ref()?.phase == Some(want)).then_some(dv)
    })
    .await
}

async fn target(client: &Client, ns: &str) -> PersistentVolumeClaim {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    wait_for("the target PVC", || async {
        pvcs.get_opt("vm-disk").await.ok()?
    })
    .await
}

fn request(p: &PersistentVolumeClaim) -> String {
    p.spec
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["storage"]
        .0
        .clone()
}

/// The clone of `golden-disk` in `src_ns` into DataVolume `vm-disk` of `size` in `ns`, on a
/// class whose profile says `strategy`, with the controller running for `ns`.
async fn clone_into(
    client: &Client,
    (ns, src_ns): (&str, &str),
    strategy: &str,
    size: &str,
) -> crate::datavolume::Running {
    let class = class(client, ns, strategy).await;
    source_pvc(client, src_ns, &class).await;
    let running = start(ns, token_config(), None).await;
    let source = json!({"pvc": {"namespace": src_ns, "name": "golden-disk"}});
    create_dv(client, ns, source, &class, size).await;
    running
}

#[tokio::test]
async fn a_csi_clone_is_a_data_source_pvc_on_the_sources_node() {
    let Some((client, ns)) = namespace("clone-csi", &[]).await else {
        return;
    };
    let _running = clone_into(&client, (&ns, &ns), "csi-clone", "1Gi").await;
    let t = target(&client, &ns).await;
    let ds = t.spec.as_ref().unwrap().data_source.clone().unwrap();
    assert_eq!(
        (ds.kind.as_str(), ds.name.as_str()),
        ("PersistentVolumeClaim", "golden-disk")
    );
    assert_eq!(t.annotations()[ANN_SELECTED_NODE], "node-a");
    assert_eq!(request(&t), GI.to_string());
    phase(&client, &ns, Phase::CsiCloneInProgress).await;
    // The CSI driver cloned: bound at the source's size.
    set_pvc_status(&client, &ns, "vm-disk", GI).await;
    let dv = phase(&client, &ns, Phase::Succeeded).await;
    assert_eq!(dv.status.unwrap().progress.as_deref(), Some("100.00%"));
}

#[tokio::test]
async fn a_smart_clone_snapshots_restores_expands_and_deletes_its_snapshot() {
    let Some((client, ns)) = namespace("clone-snap", &[]).await else {
        return;
    };
    install_snapshot_crds(&client).await;
    let snap_class = format!("snap-{ns}");
    apply(
        &client,
        &json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
                "metadata": {"name": snap_class}, "driver": DRIVER, "deletionPolicy": "Delete"}),
    )
    .await
    .unwrap();
    let _running = clone_into(&client, (&ns, &ns), "snapshot", "2Gi").await;
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    let uid = wait_for("the DataVolume's UID", || async {
        dvs.get("vm-disk").await.ok()?.uid()
    })
    .await;
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), &ns);
    let temp = format!("cdi-tmp-{uid}");
    let s = wait_for("the temporary snapshot", || async {
        snapshots.get_opt(&temp).await.ok()?
    })
    .await;
    assert_eq!(
        s.spec.volume_snapshot_class_name.as_deref(),
        Some(snap_class.as_str())
    );
    assert_eq!(
        s.spec.source.persistent_volume_claim_name.as_deref(),
        Some("golden-disk")
    );
    phase(&client, &ns, Phase::SnapshotForSmartCloneInProgress).await;
    // The snapshotter: ready, restorable at 1 GiB.
    snapshots
        .patch_status(
            &temp,
            &test_writes(),
            &Patch::Merge(json!({"status": {"readyToUse": true, "restoreSize": "1Gi"}})),
        )
        .await
        .unwrap();
    let t = target(&client, &ns).await;
    let ds = t.spec.as_ref().unwrap().data_source.clone().unwrap();
    assert_eq!(
        (ds.kind.as_str(), ds.name.as_str()),
        ("VolumeSnapshot", temp.as_str())
    );
    assert_eq!(request(&t), GI.to_string());
    phase(&client, &ns, Phase::SmartClonePvcInProgress).await;
    // Restored at 1 GiB: the request grows to 2 GiB, the snapshot goes.
    set_pvc_status(&client, &ns, "vm-disk", GI).await;
    phase(&client, &ns, Phase::ExpansionInProgress).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    wait_for("the expanded request", || async {
        (request(&pvcs.get("vm-disk").await.ok()?) == (2 * GI).to_string()).then_some(())
    })
    .await;
    wait_for("the temporary snapshot deleted", || async {
        snapshots.get_opt(&temp).await.ok()?.is_none().then_some(())
    })
    .await;
    // The resizer grew it: disk.img grows in a pod.
    set_pvc_status(&client, &ns, "vm-disk", 2 * GI).await;
    let p = pod(&client, &ns, "cdi-expand-vm-disk", None).await;
    let args = p.spec.unwrap().containers[0].args.clone().unwrap();
    assert_eq!(&args[..3], ["resize-disk", "--target", "/data/disk.img"]);
    set_pod_status(&client, &ns, "cdi-expand-vm-disk", exited(0, "")).await;
    phase(&client, &ns, Phase::Succeeded).await;
}

#[tokio::test]
async fn a_cross_namespace_clone_is_copied_by_a_source_pod_to_the_upload_server() {
    let Some((client, ns)) = namespace("clone-copy", &[]).await else {
        return;
    };
    let Some((_, golden)) = namespace("clone-golden", &[]).await else {
        return;
    };
    let _running = clone_into(&client, (&ns, &golden), "csi-clone", "1Gi").await;
    let t = target(&client, &ns).await;
    assert_eq!(t.annotations()["cdi.kubevirt.io/cloneType"], "copy");
    assert!(t.spec.as_ref().unwrap().data_source.is_none());
    phase(&client, &ns, Phase::CloneScheduled).await;
    set_pvc_status(&client, &ns, "vm-disk", GI).await;
    // The upload server made, not running yet: the source pod starts beside the source (and
    // waits for the server to answer).
    pod(&client, &ns, "cdi-upload-vm-disk", None).await;
    let source_pod = format!("{}-source-pod", t.uid().unwrap());
    let sp = pod(&client, &golden, &source_pod, None).await;
    let spec = sp.spec.unwrap();
    let c = &spec.containers[0];
    assert_eq!(
        c.args.clone().unwrap().join(" "),
        format!(
            "clone-source --source /data/disk.img --upload-url http://cdi-upload-vm-disk.{ns}.svc/v1beta1/upload --content-type filesystem-clone --server-wait 600s --metrics-addr 0.0.0.0:8443 --owner-uid {}",
            t.uid().unwrap()
        )
    );
    let claim = spec.volumes.unwrap()[0]
        .persistent_volume_claim
        .clone()
        .unwrap();
    assert_eq!(
        (claim.claim_name.as_str(), claim.read_only),
        ("golden-disk", Some(true))
    );
    // Both run, the server ready: the copy is under way.
    set_pod_status(&client, &golden, &source_pod, running()).await;
    let mut ready = running();
    ready["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    set_pod_status(&client, &ns, "cdi-upload-vm-disk", ready).await;
    phase(&client, &ns, Phase::CloneInProgress).await;
    // The upload server received it all and exits.
    set_pod_status(&client, &ns, "cdi-upload-vm-disk", exited(0, "")).await;
    phase(&client, &ns, Phase::Succeeded).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &golden);
    wait_for("the source pod deleted", || async {
        let p = pods.get_opt(&source_pod).await.ok()?;
        p.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn cross_namespace_clones_are_authorized_by_the_servers_rbac() {
    let Some((admin, golden)) = namespace("clone-auth", &[]).await else {
        return;
    };
    // The webhook's identity: what it may do is the bundle's RBAC for quarry-apiserver.
    let webhook = component_client(api::names::component::APISERVER)
        .await
        .expect("the server the test already uses");
    apply(
        &admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "clone-source", "namespace": golden},
                "rules": [{"apiGroups": ["cdi.kubevirt.io"],
                           "resources": ["datavolumes/source"], "verbs": ["create"]}]}),
    )
    .await
    .unwrap();
    apply(
        &admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "clone-source", "namespace": golden},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                            "name": "clone-source"},
                "subjects": [
                    {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"},
                    {"kind": "ServiceAccount", "name": "cloner", "namespace": "vms"}]}),
    )
    .await
    .unwrap();
    let user = |name: &str, groups: &[&str]| k8s_openapi::api::authentication::v1::UserInfo {
        username: Some(name.into()),
        groups: Some(groups.iter().map(|g| g.to_string()).collect()),
        ..Default::default()
    };
    let ask = |u| {
        let (webhook, golden) = (webhook.clone(), golden.clone());
        async move {
            cdi::datavolume::admission::authorize_clone(
                &webhook,
                (CloneSourceKind::Pvc, &golden, "golden-disk"),
                &u,
            )
            .await
            .unwrap()
        }
    };
    // The API server's authorizer sees a new RoleBinding from its own watch, moments later (a
    // loaded CI run once asked before it had): alice is allowed once it has.
    wait_for("the RoleBinding in the API server's authorizer", || async {
        ask(user("alice", &["system:authenticated"])).await.ok()
    })
    .await;
    let sa = user(
        "system:serviceaccount:vms:cloner",
        &["system:serviceaccounts", "system:authenticated"],
    );
    assert_eq!(ask(sa).await, Ok(()));
    assert_eq!(
        ask(user("bob", &["system:authenticated"])).await,
        Err(format!(
            "User bob has insufficient permissions in clone source namespace {golden}"
        ))
    );
}

/// Registers CDI's DataVolume mutating webhook for namespace `ns` only, served at `url`
/// (trusted with the CA file `ca`); returns its name.
async fn register_mutating(client: &Client, ns: &str, url: String, ca: &std::path::Path) -> String {
    use base64::Engine as _;
    let name = format!("dv-mutate-{ns}");
    let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(ca).unwrap());
    apply(
        client,
        &json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration", "metadata": {"name": name},
            "webhooks": [{"name": format!("datavolume-mutate.{ns}.quarry.test"),
                "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {"url": url, "caBundle": ca},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "rules": [{"apiGroups": ["cdi.kubevirt.io"], "apiVersions": ["*"],
                           "operations": ["CREATE"], "resources": ["datavolumes"],
                           "scope": "Namespaced"}]}]}),
    )
    .await
    .unwrap();
    name
}

#[tokio::test]
async fn the_webhooks_clone_token_lets_the_controller_clone_and_a_datavolume_without_one_waits() {
    let Some((client, ns)) = namespace("clone-token", &[]).await else {
        return;
    };
    let Some((_, golden)) = namespace("clone-token-src", &[]).await else {
        return;
    };
    let Some((_, bare)) = namespace("clone-no-token", &[]).await else {
        return;
    };
    // `quarry apiserver` with its signing key; its webhook is registered for `ns` only.
    let ca = testkit::tls::TestCa::new();
    let (signing_key, public_key) = testkit::tls::rsa_key_pair(ca.dir(), "signing");
    let args = cdi::apiserver::ApiServerArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls_cert: ca.cert_pem(),
        tls_key: ca.key_pem(),
        signing_key,
        token_ttl: 300,
        requestheader_client_ca: Some(ca.ca_pem()),
        requestheader_allowed_names: Vec::new(),
    };
    let bound = cdi::apiserver::start(client.clone(), &args).await.unwrap();
    let path = api::names::webhook::DATAVOLUME_MUTATE_PATH;
    let url = format!("https://127.0.0.1:{}{path}", bound.port());
    let registration = register_mutating(&client, &ns, url, &ca.ca_pem()).await;
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);

    // A sourceRef to a DataSource that does not exist is refused (NotFound), as CDI does.
    let missing: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "from-missing"},
        "spec": {"sourceRef": {"kind": "DataSource", "name": "nowhere"},
                 "storage": {"resources": {"requests": {"storage": "1Gi"}}}}
    }))
    .unwrap();
    let (code, message) = wait_for("the mutating webhook to be called", || async {
        match dvs.create(&PostParams::default(), &missing).await {
            Err(kube::Error::Api(e)) if e.message.contains("admission webhook") => {
                Some((e.code, e.message))
            }
            Ok(_) => {
                // Admitted before the registration took effect: try again.
                let _ = dvs.delete("from-missing", &Default::default()).await;
                None
            }
            Err(_) => None,
        }
    })
    .await;
    assert_eq!(code, 400, "{message}");
    assert!(
        message.contains(r#"datasources.cdi.kubevirt.io "nowhere" not found"#),
        "{message}"
    );

    // Through the webhook: the token, and the controller (with the public key) clones.
    let class = class(&client, &ns, "copy").await;
    source_pvc(&client, &golden, &class).await;
    let mut key_config = config();
    key_config.clone_token_key = Some(token::load_public_key(&public_key).unwrap());
    let _running = start(&ns, key_config.clone(), None).await;
    let source = json!({"pvc": {"namespace": golden, "name": "golden-disk"}});
    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "vm-disk"},
        "spec": {"source": source, "storage": {"accessModes": ["ReadWriteOnce"],
            "storageClassName": class, "resources": {"requests": {"storage": "1Gi"}}}}
    }))
    .unwrap();
    let created = dvs.create(&PostParams::default(), &dv).await.unwrap();
    let token = &created.annotations()[clone_token::ANN_CLONE_TOKEN];
    let claims =
        token::verify_signed(token, &token::load_public_key(&public_key).unwrap()).unwrap();
    assert_eq!(
        (claims.namespace.as_str(), claims.name.as_str()),
        (golden.as_str(), "golden-disk")
    );
    let t = target(&client, &ns).await;
    assert_eq!(t.annotations()["cdi.kubevirt.io/cloneType"], "copy");
    phase(&client, &ns, Phase::CloneScheduled).await;

    // Without the webhook: no token, so no clone; CDI's reason says why.
    let class = self::class(&client, &bare, "copy").await;
    let _bare_running = start(&bare, key_config, None).await;
    let mut unsigned = dv.clone();
    unsigned.spec.storage.as_mut().unwrap().storage_class_name = Some(class);
    let api: Api<DataVolume> = Api::namespaced(client.clone(), &bare);
    let created = api.create(&PostParams::default(), &unsigned).await.unwrap();
    assert!(
        !created
            .annotations()
            .contains_key(clone_token::ANN_CLONE_TOKEN)
    );
    let waiting = wait_for("CloneValidationFailed", || async {
        let d = api.get("vm-disk").await.ok()?;
        let st = d.status.clone()?;
        st.conditions
            .iter()
            .find(|c| c.type_ == "Bound" && c.reason.as_deref() == Some("CloneValidationFailed"))
            .cloned()
            .map(|c| (st.phase, c))
    })
    .await;
    assert_eq!(waiting.0, Some(Phase::Pending));
    assert_eq!(
        waiting.1.message.as_deref(),
        Some("The clone doesn't meet the validation requirements: clone token missing")
    );
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &bare);
    assert!(pvcs.get_opt("vm-disk").await.unwrap().is_none());
    Api::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>::all(
        client.clone(),
    )
    .delete(&registration, &Default::default())
    .await
    .unwrap();
}

#[tokio::test]
async fn the_source_pods_client_certificate_is_issued_once_from_the_client_signer() {
    use api::names::secret;
    use cdi::datavolume::clone::objects::client_secret_meta;
    use cdi::datavolume::clone::observe::ensure_client_secret;
    use cdi::datavolume::pod::Workload;
    use certs::pki;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let Some((admin, install)) = namespace("clone-certs", &[]).await else {
        return;
    };
    let Some((_, golden)) = namespace("clone-certs-src", &[]).await else {
        return;
    };
    // Under the DataVolume controller's own RBAC.
    let ctl = component_client(api::names::component::DATAVOLUME_CONTROLLER)
        .await
        .expect("the server the test already uses");
    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "vm-disk", "namespace": "vms", "uid": "dv-uid"},
        "spec": {"source": {"pvc": {"namespace": golden, "name": "golden-disk"}},
                 "storage": {"resources": {"requests": {"storage": "1Gi"}}}}
    }))
    .unwrap();
    let meta = client_secret_meta(&Workload::of(&dv), &golden, "t-uid");
    let ensure = || ensure_client_secret(&ctl, meta.clone(), &install, "quarry-tests");

    // Before the cert controller has run: an error naming what is missing, and no Secret.
    let e = ensure().await.unwrap_err();
    let want = format!("{install}/{}", secret::UPLOAD_SERVER_CLIENT_SIGNER);
    assert!(e.to_string().contains(&want), "{e}");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), &golden);
    assert!(secrets.get_opt("t-uid-source-pod").await.unwrap().is_none());

    certs::reconcile(&admin, &install, token::now())
        .await
        .unwrap();
    let name = ensure().await.unwrap();
    assert_eq!(name, "t-uid-source-pod");
    let s: Secret = secrets.get(&name).await.unwrap();
    assert_eq!(s.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(s.labels()["cdi.kubevirt.io/dataVolume"], "vm-disk");
    let text =
        |s: &Secret, k: &str| String::from_utf8(s.data.as_ref().unwrap()[k].0.clone()).unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &install);
    let bundle = |name: &str| {
        let maps = maps.clone();
        let name = name.to_string();
        async move { maps.get(&name).await.unwrap().data.unwrap()[secret::BUNDLE_KEY].clone() }
    };
    // It trusts the upload servers' signer...
    assert_eq!(
        text(&s, "ca.crt"),
        bundle(secret::UPLOAD_SERVER_SIGNER_BUNDLE).await
    );
    // ...and its certificate is one the upload servers accept: a client certificate that
    // verifies against the client signer's bundle they trust.
    let mut roots = rustls::RootCertStore::empty();
    for c in pki::parse_certs(&bundle(secret::UPLOAD_SERVER_CLIENT_SIGNER_BUNDLE).await) {
        roots.add(c.der.into()).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        std::sync::Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    let leaf = pki::parse_cert(&text(&s, "tls.crt")).unwrap();
    rustls::server::danger::ClientCertVerifier::verify_client_cert(
        verifier.as_ref(),
        &leaf.der.into(),
        &[],
        rustls::pki_types::UnixTime::now(),
    )
    .expect("the upload servers' verifier accepts the source pod's certificate");

    // Issued once: a second look changes nothing.
    assert_eq!(ensure().await.unwrap(), name);
    let again = secrets.get(&name).await.unwrap();
    assert_eq!(again.resource_version(), s.resource_version());
}
