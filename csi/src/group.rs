//! The GroupController service: group snapshots (see `provisioner::group` for what their
//! consistency means).

use tonic::{Request, Response, Status};

use provisioner::meta::{GroupSnapshotMeta, SnapshotMeta};

use crate::controller::{snapshot, timestamp};
use crate::pb::{self, group_controller_service_capability as gcc};
use crate::server::Driver;
use crate::status::blocking;

fn group((g, members): (GroupSnapshotMeta, Vec<SnapshotMeta>)) -> pb::VolumeGroupSnapshot {
    pb::VolumeGroupSnapshot {
        group_snapshot_id: g.id.clone(),
        snapshots: members.iter().map(snapshot).collect(),
        creation_time: Some(timestamp(g.created_unix, g.created_nanos)),
        ready_to_use: true,
    }
}

#[tonic::async_trait]
impl pb::group_controller_server::GroupController for Driver {
    async fn group_controller_get_capabilities(
        &self,
        _: Request<pb::GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<pb::GroupControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(pb::GroupControllerGetCapabilitiesResponse {
            capabilities: vec![pb::GroupControllerServiceCapability {
                r#type: Some(gcc::Type::Rpc(gcc::Rpc {
                    r#type: gcc::rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32,
                })),
            }],
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        req: Request<pb::CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<pb::CreateVolumeGroupSnapshotResponse>, Status> {
        let r = req.into_inner();
        if r.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        if r.source_volume_ids.is_empty() {
            return Err(Status::invalid_argument("source_volume_ids are required"));
        }
        let prov = self.prov.clone();
        let made =
            blocking(move || prov.create_group_snapshot(&r.name, &r.source_volume_ids)).await?;
        Ok(Response::new(pb::CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group(made)),
        }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        req: Request<pb::DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<pb::DeleteVolumeGroupSnapshotResponse>, Status> {
        let r = req.into_inner();
        if r.group_snapshot_id.is_empty() {
            return Err(Status::invalid_argument("group_snapshot_id is required"));
        }
        let prov = self.prov.clone();
        blocking(move || prov.delete_group_snapshot(&r.group_snapshot_id, &r.snapshot_ids)).await?;
        Ok(Response::new(pb::DeleteVolumeGroupSnapshotResponse {}))
    }

    async fn get_volume_group_snapshot(
        &self,
        req: Request<pb::GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<pb::GetVolumeGroupSnapshotResponse>, Status> {
        let r = req.into_inner();
        if r.group_snapshot_id.is_empty() {
            return Err(Status::invalid_argument("group_snapshot_id is required"));
        }
        let prov = self.prov.clone();
        let found =
            blocking(move || prov.get_group_snapshot(&r.group_snapshot_id, &r.snapshot_ids))
                .await?;
        Ok(Response::new(pb::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(group(found)),
        }))
    }
}
