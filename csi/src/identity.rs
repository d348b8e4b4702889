//! The Identity service.

use tonic::{Request, Response, Status};

use crate::pb::{self, plugin_capability as pc};
use crate::server::Driver;

#[tonic::async_trait]
impl pb::identity_server::Identity for Driver {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: self.config.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        let service = |t: pc::service::Type| pb::PluginCapability {
            r#type: Some(pc::Type::Service(pc::Service { r#type: t as i32 })),
        };
        Ok(Response::new(pb::GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(pc::service::Type::ControllerService),
                service(pc::service::Type::VolumeAccessibilityConstraints),
                service(pc::service::Type::GroupControllerService),
                pb::PluginCapability {
                    r#type: Some(pc::Type::VolumeExpansion(pc::VolumeExpansion {
                        r#type: pc::volume_expansion::Type::Online as i32,
                    })),
                },
            ],
        }))
    }

    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        let prov = self.prov.clone();
        let ready = tokio::task::spawn_blocking(move || {
            prov.pools()
                .iter()
                .all(|p| provisioner::sys::fsinfo::stats(&p.path).is_ok())
        })
        .await
        .unwrap_or(false);
        if !ready {
            return Err(Status::failed_precondition(
                "a storage pool is not accessible",
            ));
        }
        Ok(Response::new(pb::ProbeResponse { ready: Some(true) }))
    }
}
