use csi::pb::{self, plugin_capability as pc};

use crate::common::Server;

#[tokio::test]
async fn plugin_info_uses_hpp_name() {
    let s = Server::start().await;
    let info = s
        .identity()
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "kubevirt.io.hostpath-provisioner");
    assert!(!info.vendor_version.is_empty());
}

#[tokio::test]
async fn plugin_capabilities_and_probe() {
    let s = Server::start().await;
    let caps = s
        .identity()
        .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let services: Vec<i32> = caps
        .iter()
        .filter_map(|c| match c.r#type {
            Some(pc::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    assert!(services.contains(&(pc::service::Type::ControllerService as i32)));
    assert!(services.contains(&(pc::service::Type::VolumeAccessibilityConstraints as i32)));
    let probe = s
        .identity()
        .probe(pb::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
}
