//! The HyperConverged controller against the real API server, where only Quarry's CRDs are
//! installed (CDI's among them; the other children's CRDs are not).

use std::sync::Arc;

use kube::api::{Api, PostParams};
use operators::api::HyperConverged;
use serde_json::json;

use crate::support::{namespace, wait_for};

#[tokio::test]
async fn a_missing_child_crd_is_named_in_degraded() {
    let Some((client, ns)) = namespace("hco", &[]).await else {
        return;
    };
    let (c, n) = (client.clone(), ns.clone());
    let ctl = tokio::spawn(async move {
        operators::hyperconverged::controller::run(c, n, Arc::default()).await
    });
    let api: Api<HyperConverged> = Api::namespaced(client.clone(), &ns);
    let hc: HyperConverged = serde_json::from_value(json!({
        "apiVersion": "hco.kubevirt.io/v1beta1", "kind": "HyperConverged",
        "metadata": {"name": "kubevirt-hyperconverged"}, "spec": {}
    }))
    .unwrap();
    api.create(&PostParams::default(), &hc).await.unwrap();
    let degraded = wait_for("Degraded", || async {
        let st = api.get("kubevirt-hyperconverged").await.ok()?.status?;
        st.conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
    })
    .await;
    ctl.abort();
    assert!(
        degraded.message.contains("KubeVirt") && degraded.message.contains("kubevirts.kubevirt.io"),
        "{degraded:?}"
    );
}
