//! The validating webhooks called by the real API server: CDI's DataVolume webhook served by
//! `quarry apiserver`, and the HyperConverged webhook. Each test registers a
//! ValidatingWebhookConfiguration whose `clientConfig.url` is its own server on 127.0.0.1 over
//! TLS, scoped to the test's namespace (the API server is shared by every test of the binary).

use std::path::Path;

use api::{DataVolume, HyperConverged};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::json;
use testkit::tls::TestCa;

use crate::support::{hyperconverged, namespace, test_writes, wait_for};

/// A ValidatingWebhookConfiguration for `resource` of `group`, calling `url` (trusted with
/// `ca`) for `operations` in namespace `ns` only; removed by [`Registered::remove`].
struct Registered {
    client: Client,
    name: String,
}

impl Registered {
    async fn new(
        client: &Client,
        ns: &str,
        (group, resource): (&str, &str),
        operations: &[&str],
        url: String,
        ca: &Path,
    ) -> Registered {
        let name = format!("{resource}-{ns}");
        let config = ValidatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            webhooks: Some(vec![ValidatingWebhook {
                name: format!("{resource}.{ns}.quarry.test"),
                admission_review_versions: vec!["v1".into()],
                client_config: WebhookClientConfig {
                    url: Some(url),
                    ca_bundle: Some(ByteString(std::fs::read(ca).unwrap())),
                    service: None,
                },
                failure_policy: Some("Fail".into()),
                side_effects: "None".into(),
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(
                        [("kubernetes.io/metadata.name".to_string(), ns.to_string())].into(),
                    ),
                    ..Default::default()
                }),
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(vec![group.into()]),
                    api_versions: Some(vec!["*".into()]),
                    operations: Some(operations.iter().map(|o| o.to_string()).collect()),
                    resources: Some(vec![resource.into()]),
                    scope: Some("Namespaced".into()),
                }]),
                ..Default::default()
            }]),
        };
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &config)
            .await
            .unwrap_or_else(|e| panic!("registering webhook {name}: {e}"));
        Registered {
            client: client.clone(),
            name,
        }
    }

    async fn remove(self) {
        Api::<ValidatingWebhookConfiguration>::all(self.client)
            .delete(&self.name, &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// Waits until the API server calls the webhook (it picks registrations up asynchronously):
/// until a dry-run create of `refused` is refused by a webhook.
async fn wait_until_called<K>(api: &Api<K>, refused: &K)
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for("the webhook to be called", || async {
        match api.create(&dry, refused).await {
            Err(kube::Error::Api(e)) if e.message.contains("admission webhook") => Some(()),
            _ => None,
        }
    })
    .await;
}

fn datavolume(name: &str, url: &str, size: &str) -> DataVolume {
    serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": name},
        "spec": {"source": {"http": {"url": url}},
                 "storage": {"resources": {"requests": {"storage": size}}}}
    }))
    .unwrap()
}

/// The API server's refusal of a write, as (code, message).
fn refusal<T: std::fmt::Debug>(r: kube::Result<T>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(e)) => (e.code, e.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn datavolume_spec_edits_are_refused_and_metadata_edits_pass() {
    let Some((client, ns)) = namespace("dvwebhook", &[]).await else {
        return;
    };
    let ca = TestCa::new();
    let (signing_key, _) = testkit::tls::rsa_key_pair(ca.dir(), "signing");
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
    let path = api::names::webhook::DATAVOLUME_PATH;
    let registered = Registered::new(
        &client,
        &ns,
        ("cdi.kubevirt.io", "datavolumes"),
        &["CREATE", "UPDATE"],
        format!("https://127.0.0.1:{}{path}", bound.port()),
        &ca.ca_pem(),
    )
    .await;
    let api: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    // CREATE runs the controller's validation.
    wait_until_called(&api, &datavolume("probe", "ftp://images.example/x", "1Gi")).await;
    let (code, message) = refusal(
        api.create(
            &PostParams::default(),
            &datavolume("bad", "ftp://images.example/x", "0"),
        )
        .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("must start with http:// or https://")
            && message.contains("must be greater than 0"),
        "{message}"
    );
    // A PVC of the same name that is not the DataVolume's refuses the DataVolume.
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "taken"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
    let url = "https://images.example/fedora.qcow2";
    let (_, message) = refusal(
        api.create(&PostParams::default(), &datavolume("taken", url, "1Gi"))
            .await,
    );
    assert!(
        message.contains(&format!("Destination PVC {ns}/taken already exists")),
        "{message}"
    );

    api.create(&PostParams::default(), &datavolume("fedora", url, "1Gi"))
        .await
        .unwrap();
    // The URL and the size cannot change, with CDI's message.
    for edit in [
        json!({"spec": {"source": {"http": {"url": "https://images.example/other.qcow2"}}}}),
        json!({"spec": {"storage": {"resources": {"requests": {"storage": "2Gi"}}}}}),
    ] {
        let (code, message) = refusal(
            api.patch("fedora", &test_writes(), &Patch::Merge(&edit))
                .await,
        );
        assert_eq!(code, 422, "{message}");
        assert!(
            message.contains("Cannot update DataVolume Spec"),
            "{message}"
        );
    }
    // Metadata can, and so can a spec that only says the same in other words.
    let edited = api
        .patch(
            "fedora",
            &test_writes(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "storage"}},
                "spec": {"storage": {"resources": {"requests": {"storage": "1073741824"}}}}})),
        )
        .await
        .unwrap();
    assert_eq!(edited.metadata.labels.unwrap()["team"], "storage");
    assert_eq!(edited.spec.source.unwrap().http.unwrap().url, url);
    registered.remove().await;
}

#[tokio::test]
async fn hyperconverged_deletion_waits_for_datavolumes_unless_workloads_may_go() {
    let Some((client, ns)) = namespace("hcowebhook", &[]).await else {
        return;
    };
    let ca = TestCa::new();
    let settings = hco::hyperconverged::webhook::Settings {
        namespace: Some(ns.clone()),
        client: Some(client.clone()),
    };
    let bound = hco::hyperconverged::webhook::serve(
        "127.0.0.1:0".parse().unwrap(),
        Some((ca.cert_pem(), ca.key_pem())),
        settings,
    )
    .await
    .unwrap();
    let path = api::names::webhook::HYPERCONVERGED_PATH;
    let registered = Registered::new(
        &client,
        &ns,
        ("hco.kubevirt.io", "hyperconvergeds"),
        &["CREATE", "UPDATE", "DELETE"],
        format!("https://127.0.0.1:{}{path}", bound.port()),
        &ca.ca_pem(),
    )
    .await;
    let api: Api<HyperConverged> = Api::namespaced(client.clone(), &ns);
    wait_until_called(&api, &hyperconverged("not-the-singleton", json!({}))).await;
    // A DataVolume exists (in this namespace; the webhook looks in all of them).
    Api::<DataVolume>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &datavolume("disk", "https://images.example/disk.img", "1Gi"),
        )
        .await
        .unwrap();
    let name = "kubevirt-hyperconverged";
    // No strategy: HCO's default, BlockUninstallIfWorkloadsExist.
    api.create(&PostParams::default(), &hyperconverged(name, json!({})))
        .await
        .unwrap();
    let (_, message) = refusal(api.delete(name, &DeleteParams::default()).await);
    assert!(
        message.contains(hco::hyperconverged::webhook::UNINSTALL_BLOCKED),
        "{message}"
    );
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"uninstallStrategy": "BlockUninstallIfWorkloadsExist"}})),
    )
    .await
    .unwrap();
    refusal(api.delete(name, &DeleteParams::default()).await);
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"uninstallStrategy": "RemoveWorkloads"}})),
    )
    .await
    .unwrap();
    api.delete(name, &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt(name).await.unwrap().is_none());
    registered.remove().await;
}
