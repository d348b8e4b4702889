//! The HostPathProvisioner controller against the real API server.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Api, ListParams, PostParams};
use operators::api::HostPathProvisioner;
use operators::hostpath::objects::Settings;
use serde_json::json;

use crate::support::{namespace, wait_for};

#[tokio::test]
async fn invalid_pool_names_are_one_short_degraded_message_with_transition_times() {
    let Some((client, ns)) = namespace("hpp", &[]).await else {
        return;
    };
    let settings = Settings {
        namespace: ns.clone(),
        ..Settings::default()
    };
    let c = client.clone();
    let ctl = tokio::spawn(async move {
        operators::hostpath::controller::run(c, settings, Arc::default()).await
    });
    let api: Api<HostPathProvisioner> = Api::all(client.clone());
    let name = format!("bad-{ns}");
    let hpp: HostPathProvisioner = serde_json::from_value(json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": name},
        "spec": {"imagePullPolicy": "IfNotPresent", "storagePools": [
            {"name": "Fast_Pool", "path": "/var/fast"},
            {"name": "Bad.Name", "path": "/var/bad"},
            {"name": "good", "path": "/var/good"}]}
    }))
    .unwrap();
    api.create(&PostParams::default(), &hpp).await.unwrap();
    let st = wait_for("Degraded", || async {
        let h = api.get(&name).await.ok()?;
        let st = h.status?;
        st.conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.status == "True")
            .then_some(st)
    })
    .await;
    ctl.abort();
    for c in &st.conditions {
        assert!(c.last_transition_time.is_some(), "{c:?}");
    }
    let degraded = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    let msg = degraded.message.as_deref().unwrap();
    assert!(
        msg.contains("\"Fast_Pool\"") && msg.contains("\"Bad.Name\"") && !msg.contains("good"),
        "{msg}"
    );
    assert!(msg.len() < 400, "{} bytes: {msg}", msg.len());
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    assert!(
        ds.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}
