//! The HyperConverged controller against the real API server, where only Quarry's CRDs are
//! installed (the children's CRDs are not).

use std::sync::Arc;

use crate::support::{hyperconverged_degraded, namespace};

#[tokio::test]
async fn a_missing_child_crd_is_named_in_degraded() {
    let Some((client, ns)) = namespace("hco", &[]).await else {
        return;
    };
    let (c, n) = (client.clone(), ns.clone());
    let ctl = tokio::spawn(async move {
        operators::hyperconverged::controller::run(c, n, Arc::default()).await
    });
    let degraded = hyperconverged_degraded(&client, &ns).await;
    ctl.abort();
    assert!(
        degraded.message.contains("CDI") && degraded.message.contains("cdis.cdi.kubevirt.io"),
        "{degraded:?}"
    );
}
