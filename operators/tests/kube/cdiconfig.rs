//! CDI's configuration objects against the real API server: the CDI CR's settings reaching
//! importer pods and PVCs, a flag given explicitly winning over the CR, the CDIConfig status,
//! and StorageProfiles completing `spec.storage`.
//!
//! The CDI CR and the CDIConfig are cluster singletons, so the test that needs them runs its own
//! API server; the StorageProfile test shares the server and uses StorageClasses named after its
//! own namespace.

use std::sync::Arc;
use std::time::Duration;

use api::names;
use api::{Cdi, CdiConfig, DataVolume, StorageProfile};
use cdi::cdiconfig::controller::run_profiles;
use cdi::datavolume::controller::{self, Context};
use cdi::datavolume::pvc::required_space;
use cdi::settings::{Config, RetryPolicy, default_resources};
use cdi::settings::{LiveSettings, Overrides};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use testkit::kube::{KubeApiServer, Options};

use crate::support::{bind_pvc, install_crds, namespace, pod, test_writes, wait_for};

/// Controllers sharing one context, stopped when dropped.
struct Running(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

fn context(client: &Client, overrides: Overrides) -> Arc<Context> {
    let live = Arc::new(LiveSettings::new(Config::default(), overrides));
    Arc::new(Context::with_settings(client.clone(), live, Arc::default()))
}

/// The DataVolume controller with both configuration reconcilers, as `quarry controller
/// datavolume` runs them (DataVolumes of `ns` only).
fn start_all(ctx: Arc<Context>, ns: &str) -> Running {
    let ns = ns.to_string();
    Running(vec![tokio::spawn(async move {
        operators::process::cdi(ctx, Some(&ns)).await
    })])
}

async fn create<K>(api: &Api<K>, obj: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {}: {e}", obj.name_any()))
}

fn http_dv(name: &str, storage: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
           "metadata": {"name": name},
           "spec": {"source": {"http": {"url": "http://images.example/fedora.qcow2"}},
                    "storage": storage}})
}

/// The size the controller asked for in PVC `name`.
async fn pvc_size(client: &Client, ns: &str, name: &str) -> String {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc = wait_for(&format!("PVC {name}"), || async {
        api.get_opt(name).await.ok()?
    })
    .await;
    pvc.spec.unwrap().resources.unwrap().requests.unwrap()["storage"]
        .0
        .clone()
}

#[tokio::test]
async fn the_cdi_cr_configures_importer_pods_pvcs_and_the_cdiconfig_status() {
    let Some(server) = KubeApiServer::start(&Options::default()) else {
        return;
    };
    let client = server.client();
    install_crds(&client).await;
    create::<Namespace>(
        &Api::all(client.clone()),
        json!({"metadata": {"name": names::NAMESPACE}}),
    )
    .await;
    create::<ConfigMap>(
        &Api::namespaced(client.clone(), names::NAMESPACE),
        json!({"metadata": {"name": "proxy-ca"}, "data": {"ca.pem": "-----BEGIN CERTIFICATE-----\n"}}),
    )
    .await;
    create::<StorageClass>(
        &Api::all(client.clone()),
        json!({"metadata": {"name": "fast"}, "provisioner": "example.com/fast"}),
    )
    .await;
    let ns = server.namespace("cdi-config", &[]).await;
    create::<Cdi>(
        &Api::all(client.clone()),
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
               "metadata": {"name": "cdi"},
               "spec": {"workload": {"nodeSelector": {"disktype": "ssd"}},
                        "config": {
                   "uploadProxyURLOverride": "https://upload.example",
                   "filesystemOverhead": {"global": "0.1", "storageClass": {"fast": "0.2"}},
                   "podResourceRequirements": {"limits": {"cpu": "2", "memory": "1Gi"}},
                   "importProxy": {"HTTPProxy": "http://proxy.example:3128",
                                   "HTTPSProxy": "http://proxy.example:3129",
                                   "noProxy": ".cluster.local",
                                   "trustedCAProxy": "proxy-ca"}}}}),
    )
    .await;
    let ctl = start_all(context(&client, Overrides::default()), &ns);

    // The CDIConfig: the CR's config as its spec, the settings in force as its status.
    let configs: Api<CdiConfig> = Api::all(client.clone());
    let config = wait_for("the CDIConfig status", || async {
        let c = configs.get_opt("config").await.ok()??;
        c.status.as_ref()?.filesystem_overhead.as_ref()?;
        Some(c)
    })
    .await;
    assert_eq!(
        config.spec.upload_proxy_url_override.as_deref(),
        Some("https://upload.example")
    );
    let st = config.status.unwrap();
    assert_eq!(
        st.upload_proxy_url.as_deref(),
        Some("https://upload.example")
    );
    let fo = st.filesystem_overhead.unwrap();
    assert_eq!(fo.global.as_deref(), Some("0.1"));
    assert_eq!(fo.storage_class["fast"], "0.2");
    let res = st.default_pod_resource_requirements.unwrap();
    let limits = res.limits.unwrap();
    assert_eq!(
        (limits["cpu"].0.as_str(), limits["memory"].0.as_str()),
        ("2", "1Gi")
    );
    assert_eq!(
        res.requests,
        default_resources().requests,
        "CDI's default requests"
    );
    assert_eq!(
        st.import_proxy.unwrap().http_proxy.as_deref(),
        Some("http://proxy.example:3128")
    );

    // An import: overhead in the PVC size, resources and proxy in the pod.
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    let storage = json!({"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}});
    create(&dvs, http_dv("fedora", storage.clone())).await;
    assert_eq!(
        pvc_size(&client, &ns, "fedora").await,
        required_space(1 << 30, 0.1).to_string()
    );
    bind_pvc(&client, &ns, "fedora").await;
    let p = pod(&client, &ns, "importer-fedora", None).await;
    let spec = p.spec.unwrap();
    let c = &spec.containers[0];
    let limits = c.resources.as_ref().unwrap().limits.clone().unwrap();
    assert_eq!(
        (limits["cpu"].0.as_str(), limits["memory"].0.as_str()),
        ("2", "1Gi")
    );
    let env: Vec<_> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    for (k, v) in [
        ("HTTP_PROXY", "http://proxy.example:3128"),
        ("HTTPS_PROXY", "http://proxy.example:3129"),
        ("NO_PROXY", ".cluster.local"),
    ] {
        assert!(env.contains(&(k.into(), v.into())), "{k} in {env:?}");
    }
    let args = c.args.clone().unwrap().join(" ");
    assert!(args.contains("--ca-cert /proxycerts/ca.pem"), "{args}");
    // The CR's workload placement, as CDI places its pods.
    let selector = spec.node_selector.clone().unwrap_or_default();
    assert_eq!(selector.get("disktype").map(String::as_str), Some("ssd"));
    let copy: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let copy = copy.get("import-proxy-cm-fedora").await.unwrap();
    assert!(copy.data.unwrap().contains_key("ca.pem"));

    // The StorageClass's own overhead.
    let mut fast = storage.clone();
    fast["storageClassName"] = json!("fast");
    create(&dvs, http_dv("on-fast", fast)).await;
    assert_eq!(
        pvc_size(&client, &ns, "on-fast").await,
        required_space(1 << 30, 0.2).to_string()
    );

    // A flag given explicitly wins over the CR; what it does not set stays the CR's.
    drop(ctl);
    let flagged = Overrides {
        filesystem_overhead: Some(0.3),
        ..Overrides::default()
    };
    let _ctl = start_all(context(&client, flagged), &ns);
    wait_for("the flag's overhead in the CDIConfig status", || async {
        let c = configs.get_opt("config").await.ok()??;
        (c.status?.filesystem_overhead?.global.as_deref() == Some("0.3")).then_some(())
    })
    .await;
    create(&dvs, http_dv("flagged", storage)).await;
    assert_eq!(
        pvc_size(&client, &ns, "flagged").await,
        required_space(1 << 30, 0.3).to_string()
    );
    bind_pvc(&client, &ns, "flagged").await;
    let p = pod(&client, &ns, "importer-flagged", None).await;
    let limits = p.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .limits
        .unwrap();
    assert_eq!(limits["cpu"].0, "2");

    // Editing the CR reaches the CDIConfig.
    let cdis: Api<Cdi> = Api::all(client.clone());
    cdis.patch(
        "cdi",
        &test_writes(),
        &Patch::Merge(
            json!({"spec": {"config": {"uploadProxyURLOverride": "https://other.example"}}}),
        ),
    )
    .await
    .unwrap();
    wait_for("the new upload proxy URL", || async {
        let c = configs.get_opt("config").await.ok()??;
        (c.status?.upload_proxy_url.as_deref() == Some("https://other.example")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn storage_profiles_follow_storage_classes_and_complete_spec_storage() {
    let Some((client, ns)) = namespace("profiles", &[]).await else {
        return;
    };
    // Retries far beyond the test's patience: only the StorageProfile watch can wake the
    // waiting DataVolume.
    let slow = Config {
        retry: RetryPolicy {
            base_delay: Duration::from_secs(600),
            ..RetryPolicy::default()
        },
        ..Config::default()
    };
    let ctx = Arc::new(Context::new(client.clone(), slow, Arc::default()));
    let (c, n) = (ctx.clone(), ns.clone());
    let _ctl = Running(vec![
        tokio::spawn(async move { controller::run(c, Some(&n)).await }),
        tokio::spawn(run_profiles(Arc::new(
            cdi::cdiconfig::controller::Context {
                client: ctx.client.clone(),
                metrics: ctx.metrics.clone(),
                settings: ctx.live.clone(),
            },
        ))),
    ]);
    let classes: Api<StorageClass> = Api::all(client.clone());
    let profiles: Api<StorageProfile> = Api::all(client.clone());
    let hostpath = format!("{ns}-hostpath");
    let unknown = format!("{ns}-unknown");
    create(
        &classes,
        json!({"metadata": {"name": hostpath}, "provisioner": "kubevirt.io.hostpath-provisioner"}),
    )
    .await;
    let profile = wait_for("the hostpath StorageProfile", || async {
        let p = profiles.get_opt(&hostpath).await.ok()??;
        p.status
            .clone()
            .filter(|s| !s.profile.claim_property_sets.is_empty())
    })
    .await;
    assert_eq!(profile.storage_class.as_deref(), Some(hostpath.as_str()));
    assert_eq!(
        profile.provisioner.as_deref(),
        Some("kubevirt.io.hostpath-provisioner")
    );
    assert_eq!(profile.profile.clone_strategy.as_deref(), Some("csi-clone"));
    let sets: Vec<_> = profile
        .profile
        .claim_property_sets
        .iter()
        .map(|s| (s.access_modes.join(","), s.volume_mode.clone().unwrap()))
        .collect();
    assert_eq!(
        sets,
        [
            ("ReadWriteOnce".into(), "Filesystem".into()),
            ("ReadWriteOnce".into(), "Block".into())
        ]
    );

    // spec.storage without modes takes the profile's first set.
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    let storage = |class: &str| json!({"storageClassName": class, "resources": {"requests": {"storage": "1Gi"}}});
    create(&dvs, http_dv("on-hostpath", storage(&hostpath))).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pvc = wait_for("PVC on-hostpath", || async {
        pvcs.get_opt("on-hostpath").await.ok()?
    })
    .await;
    let spec = pvc.spec.unwrap();
    assert_eq!(spec.access_modes.unwrap(), ["ReadWriteOnce"]);
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));

    // A class nothing is known of: the DataVolume waits, saying why as CDI does...
    create(
        &classes,
        json!({"metadata": {"name": unknown}, "provisioner": "example.com/unknown"}),
    )
    .await;
    wait_for("the unknown class's StorageProfile", || async {
        profiles.get_opt(&unknown).await.ok()??.status
    })
    .await;
    create(&dvs, http_dv("on-unknown", storage(&unknown))).await;
    let message = format!(
        "Spec is missing accessMode and volumeMode, cannot get access mode from StorageProfile {unknown}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    wait_for("the ErrClaimNotValid event", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("ErrClaimNotValid")
                    && e.message.as_deref() == Some(message.as_str())
                    && e.type_.as_deref() == Some("Warning")
            })
            .then_some(())
    })
    .await;
    // The controller publishes its events before it writes the status: wait for the condition.
    wait_for("the Bound condition naming the claim's problem", || async {
        let st = dvs.get("on-unknown").await.ok()?.status?;
        let bound = st.conditions.into_iter().find(|c| c.type_ == "Bound")?;
        (bound.message.as_deref() == Some(message.as_str())).then_some(())
    })
    .await;
    assert!(pvcs.get_opt("on-unknown").await.unwrap().is_none());

    // ...until the admin fills in the profile's spec (the profile's change wakes it).
    profiles
        .patch(
            &unknown,
            &test_writes(),
            &Patch::Merge(json!({"spec": {"claimPropertySets": [
                {"accessModes": ["ReadWriteMany"], "volumeMode": "Block"}]}})),
        )
        .await
        .unwrap();
    let pvc = wait_for("PVC on-unknown", || async {
        pvcs.get_opt("on-unknown").await.ok()?
    })
    .await;
    let spec = pvc.spec.unwrap();
    assert_eq!(spec.access_modes.unwrap(), ["ReadWriteMany"]);
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));

    // A class's profile goes with it.
    classes
        .delete(&unknown, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the StorageProfile deleted", || async {
        matches!(profiles.get_opt(&unknown).await, Ok(None)).then_some(())
    })
    .await;
}
