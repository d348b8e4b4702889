//! The Node service.

use std::collections::BTreeMap;
use std::path::PathBuf;

use provisioner::Publish;
use tonic::{Request, Response, Status};

use crate::controller::capability_mode;
use crate::pb::{self, node_service_capability as nsc, volume_capability as vc};
use crate::server::Driver;
use crate::status::blocking;

#[tonic::async_trait]
impl pb::node_server::Node for Driver {
    async fn node_stage_volume(
        &self,
        _: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented("volumes are not staged"))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("volumes are not staged"))
    }

    async fn node_publish_volume(
        &self,
        req: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if r.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is required"));
        }
        let cap = r
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        let mode = capability_mode(cap).map_err(Status::invalid_argument)?;
        use vc::access_mode::Mode;
        let access = cap.access_mode.as_ref().map(|m| m.mode);
        let reader_only = access == Some(Mode::SingleNodeReaderOnly as i32);
        let read_only = r.readonly || reader_only;
        // SINGLE_NODE_WRITER stays shareable between a node's pods: Kubernetes sends it for
        // ReadWriteOnce where the driver lacks SINGLE_NODE_MULTI_WRITER
        let exclusive = reader_only || access == Some(Mode::SingleNodeSingleWriter as i32);
        let mount_flags = match &cap.access_type {
            Some(vc::AccessType::Mount(m)) => {
                if !m.fs_type.is_empty() {
                    // a hostpath volume is a directory of the pool's filesystem: nothing to format
                    tracing::debug!(fs_type = %m.fs_type, "fs_type does not apply to hostpath volumes");
                }
                m.mount_flags.clone()
            }
            _ => Vec::new(),
        };
        let context: BTreeMap<String, String> = r.volume_context.into_iter().collect();
        let prov = self.prov.clone();
        let target = PathBuf::from(r.target_path);
        let id = r.volume_id;
        blocking(move || {
            prov.publish(&Publish {
                volume_id: &id,
                target: &target,
                read_only,
                mode,
                context: &context,
                mount_flags: &mount_flags,
                exclusive,
            })
        })
        .await?;
        Ok(Response::new(pb::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if r.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is required"));
        }
        let prov = self.prov.clone();
        blocking(move || prov.unpublish(&r.volume_id, &PathBuf::from(r.target_path))).await?;
        Ok(Response::new(pb::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<pb::NodeGetVolumeStatsResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if r.volume_path.is_empty() {
            return Err(Status::invalid_argument("volume_path is required"));
        }
        let prov = self.prov.clone();
        let s = blocking(move || prov.volume_stats(&r.volume_id, &PathBuf::from(r.volume_path)))
            .await?;
        use pb::volume_usage::Unit;
        let mut usage = vec![pb::VolumeUsage {
            available: s.available_bytes as i64,
            total: s.total_bytes as i64,
            used: s.used_bytes as i64,
            unit: Unit::Bytes as i32,
        }];
        if !s.block {
            usage.push(pb::VolumeUsage {
                available: s.free_inodes as i64,
                total: s.total_inodes as i64,
                used: s.used_inodes as i64,
                unit: Unit::Inodes as i32,
            });
        }
        Ok(Response::new(pb::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(pb::VolumeCondition {
                abnormal: s.abnormal.is_some(),
                message: s.abnormal.unwrap_or_else(|| "volume is healthy".into()),
            }),
        }))
    }

    async fn node_expand_volume(
        &self,
        req: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if r.volume_path.is_empty() {
            return Err(Status::invalid_argument("volume_path is required"));
        }
        if let Some(c) = &r.volume_capability {
            capability_mode(c).map_err(Status::invalid_argument)?;
        }
        let prov = self.prov.clone();
        let bytes =
            blocking(move || prov.node_expand(&r.volume_id, &PathBuf::from(r.volume_path))).await?;
        Ok(Response::new(pb::NodeExpandVolumeResponse {
            capacity_bytes: bytes as i64,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        use nsc::rpc::Type as T;
        let caps = [
            T::GetVolumeStats,
            T::ExpandVolume,
            T::VolumeCondition,
            T::SingleNodeMultiWriter,
        ];
        Ok(Response::new(pb::NodeGetCapabilitiesResponse {
            capabilities: caps
                .into_iter()
                .map(|t| pb::NodeServiceCapability {
                    r#type: Some(nsc::Type::Rpc(nsc::Rpc { r#type: t as i32 })),
                })
                .collect(),
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: self.config.max_volumes_per_node,
            accessible_topology: Some(self.topology()),
        }))
    }
}
