//! The HostPathProvisioner controller against the real API server. One test only: every
//! HostPathProvisioner is cluster-scoped, and each controller sees them all.

use std::sync::Arc;

use api::HostPathProvisioner;
use api::hostpath::OperatorCondition;
use hco::hostpath::objects::Settings;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::{namespace, wait_for};

async fn create(client: &Client, name: &str, pools: Value) -> HostPathProvisioner {
    let hpp: HostPathProvisioner = serde_json::from_value(json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": name},
        "spec": {"imagePullPolicy": "IfNotPresent", "storagePools": pools}
    }))
    .unwrap();
    Api::<HostPathProvisioner>::all(client.clone())
        .create(&PostParams::default(), &hpp)
        .await
        .unwrap()
}

/// Waits until `name`'s Degraded condition has `reason`, and returns all its conditions.
async fn degraded(client: &Client, name: &str, reason: &str) -> Vec<OperatorCondition> {
    let api: Api<HostPathProvisioner> = Api::all(client.clone());
    wait_for(&format!("{name} Degraded: {reason}"), || async {
        let st = api.get(name).await.ok()?.status?;
        st.conditions
            .iter()
            .any(|c| {
                c.type_ == "Degraded" && c.status == "True" && c.reason.as_deref() == Some(reason)
            })
            .then_some(st.conditions)
    })
    .await
}

fn message<'a>(conditions: &'a [OperatorCondition], type_: &str) -> &'a str {
    let c = conditions.iter().find(|c| c.type_ == type_).unwrap();
    c.message.as_deref().unwrap_or_default()
}

#[tokio::test]
async fn one_cr_is_served_others_are_degraded_and_bad_pool_names_are_one_short_message() {
    let Some((client, ns)) = namespace("hpp", &[]).await else {
        return;
    };
    let settings = Settings {
        namespace: ns.clone(),
        ..Settings::default()
    };
    let c = client.clone();
    let ctl =
        tokio::spawn(
            async move { hco::hostpath::controller::run(c, settings, Arc::default()).await },
        );
    let (first, second) = (format!("a-{ns}"), format!("b-{ns}"));
    let served = create(
        &client,
        &first,
        json!([{"name": "local", "path": "/var/a"}]),
    )
    .await;
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    wait_for("the driver DaemonSet", || async {
        ds.get_opt("quarry-csi").await.ok()?
    })
    .await;

    // A second CR does not take the driver over: it is Degraded, naming the served one.
    create(
        &client,
        &second,
        json!([{"name": "other", "path": "/var/b"}]),
    )
    .await;
    let conds = degraded(&client, &second, "AnotherHostPathProvisionerActive").await;
    assert!(message(&conds, "Degraded").contains(&first), "{conds:?}");
    let owner = ds.get("quarry-csi").await.unwrap().owner_references()[0]
        .uid
        .clone();
    assert_eq!(Some(owner), served.uid());

    // Bad pool names: checked before anything is applied, one short clause each.
    let api: Api<HostPathProvisioner> = Api::all(client.clone());
    let pools = json!({"spec": {"storagePools": [
        {"name": "Fast_Pool", "path": "/var/fast"},
        {"name": "Bad.Name", "path": "/var/bad"},
        {"name": "good", "path": "/var/good"}]}});
    api.patch(&first, &PatchParams::default(), &Patch::Merge(pools))
        .await
        .unwrap();
    let conds = degraded(&client, &first, "DeployFailed").await;
    ctl.abort();
    for c in &conds {
        assert!(c.last_transition_time.is_some(), "{c:?}");
    }
    let msg = message(&conds, "Degraded");
    assert!(
        msg.contains("\"Fast_Pool\"") && msg.contains("\"Bad.Name\"") && !msg.contains("good"),
        "{msg}"
    );
    assert!(msg.len() < 400, "{} bytes: {msg}", msg.len());
}
