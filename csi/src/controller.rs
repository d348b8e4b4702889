//! The Controller service.

use std::collections::{BTreeMap, HashMap};

use provisioner::meta::{ContentSource, SnapshotMeta, VolumeMeta, VolumeMode};
use provisioner::{CapacityRange, CreateVolume, Provisioner};
use tonic::{Request, Response, Status};

use crate::pb::{self, controller_service_capability as csc, volume_capability as vc};
use crate::server::Driver;
use crate::status::{blocking, to_status};
use crate::{POOL_PARAMETER, TOPOLOGY_KEY};

use vc::access_mode::Mode;

/// Access modes a node-local volume supports.
const SUPPORTED_MODES: [Mode; 4] = [
    Mode::SingleNodeWriter,
    Mode::SingleNodeReaderOnly,
    Mode::SingleNodeSingleWriter,
    Mode::SingleNodeMultiWriter,
];

/// Why a capability cannot be served, or the volume mode it asks for.
pub(crate) fn capability_mode(cap: &pb::VolumeCapability) -> Result<VolumeMode, String> {
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or("volume capability has no access_mode")?;
    let m = Mode::try_from(mode.mode).map_err(|_| format!("unknown access mode {}", mode.mode))?;
    if !SUPPORTED_MODES.contains(&m) {
        return Err(format!(
            "access mode {} is not supported: hostpath volumes live on one node",
            m.as_str_name()
        ));
    }
    match &cap.access_type {
        Some(vc::AccessType::Block(_)) => Ok(VolumeMode::Block),
        Some(vc::AccessType::Mount(m)) => {
            provisioner::sys::mount::bind_flags(&m.mount_flags)?;
            Ok(VolumeMode::Filesystem)
        }
        None => Err("volume capability has no access_type (block or mount)".into()),
    }
}

/// The single volume mode all `caps` agree on.
pub(crate) fn capabilities_mode(caps: &[pb::VolumeCapability]) -> Result<VolumeMode, String> {
    let mut mode = None;
    for c in caps {
        let m = capability_mode(c)?;
        if mode.is_some_and(|x| x != m) {
            return Err("volume capabilities mix block and mount access".into());
        }
        mode = Some(m);
    }
    mode.ok_or_else(|| "volume_capabilities are required".into())
}

fn range(r: Option<&pb::CapacityRange>) -> Result<CapacityRange, Status> {
    let Some(r) = r else {
        return Ok(CapacityRange::default());
    };
    if r.required_bytes < 0 || r.limit_bytes < 0 {
        return Err(Status::invalid_argument(
            "capacity_range must not be negative",
        ));
    }
    Ok(CapacityRange {
        required: r.required_bytes as u64,
        limit: r.limit_bytes as u64,
    })
}

fn content_source(s: &ContentSource) -> pb::VolumeContentSource {
    use pb::volume_content_source as vcs;
    pb::VolumeContentSource {
        r#type: Some(match s {
            ContentSource::Snapshot(id) => vcs::Type::Snapshot(vcs::SnapshotSource {
                snapshot_id: id.clone(),
            }),
            ContentSource::Volume(id) => vcs::Type::Volume(vcs::VolumeSource {
                volume_id: id.clone(),
            }),
        }),
    }
}

pub(crate) fn timestamp(secs: u64, nanos: u32) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: secs as i64,
        nanos: nanos as i32,
    }
}

pub(crate) fn snapshot(s: &SnapshotMeta) -> pb::Snapshot {
    pb::Snapshot {
        size_bytes: s.size_bytes as i64,
        snapshot_id: s.id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(timestamp(s.created_unix, s.created_nanos)),
        ready_to_use: true,
        group_snapshot_id: s.group.clone().unwrap_or_default(),
    }
}

impl Driver {
    pub(crate) fn topology(&self) -> pb::Topology {
        pb::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), self.config.node_id.clone())]),
        }
    }

    fn volume(&self, m: &VolumeMeta) -> pb::Volume {
        pb::Volume {
            capacity_bytes: m.capacity_bytes as i64,
            volume_id: m.id.clone(),
            volume_context: HashMap::from([(POOL_PARAMETER.to_string(), m.pool.clone())]),
            content_source: m.source.as_ref().map(content_source),
            accessible_topology: vec![self.topology()],
        }
    }

    /// Whether a topology names this node (or does not constrain our key).
    fn topology_matches(&self, t: &pb::Topology) -> bool {
        t.segments
            .get(TOPOLOGY_KEY)
            .is_none_or(|n| *n == self.config.node_id)
    }

    fn condition(&self, id: &str) -> Option<pb::VolumeCondition> {
        let (pool, m) = self.prov.volume(id).ok()?;
        let abnormal = self.prov.volume_condition(pool, &m);
        Some(pb::VolumeCondition {
            abnormal: abnormal.is_some(),
            message: abnormal.unwrap_or_else(|| "volume is healthy".into()),
        })
    }
}

#[tonic::async_trait]
impl pb::controller_server::Controller for Driver {
    async fn create_volume(
        &self,
        req: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::CreateVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        let mode = capabilities_mode(&r.volume_capabilities).map_err(Status::invalid_argument)?;
        let capacity = range(r.capacity_range.as_ref())?;
        if let Some(t) = &r.accessibility_requirements
            && !t.requisite.is_empty()
            && !t.requisite.iter().any(|t| self.topology_matches(t))
        {
            return Err(Status::resource_exhausted(format!(
                "this driver only provisions on node {}",
                self.config.node_id
            )));
        }
        let source = match r.volume_content_source.and_then(|s| s.r#type) {
            None => None,
            Some(pb::volume_content_source::Type::Snapshot(s)) => {
                Some(ContentSource::Snapshot(s.snapshot_id))
            }
            Some(pb::volume_content_source::Type::Volume(v)) => {
                Some(ContentSource::Volume(v.volume_id))
            }
        };
        let mut parameters: BTreeMap<String, String> = r.parameters.into_iter().collect();
        // a VolumeAttributesClass's parameters at creation: checked, then kept with the rest
        let mutable: BTreeMap<String, String> = r.mutable_parameters.into_iter().collect();
        Provisioner::check_mutable_parameters(&mutable).map_err(to_status)?;
        parameters.extend(mutable);
        let create = CreateVolume {
            name: r.name,
            capacity,
            mode,
            pool: parameters.get(POOL_PARAMETER).cloned(),
            source,
            parameters,
            ephemeral: false,
        };
        let prov = self.prov.clone();
        let m = blocking(move || prov.create_volume(&create)).await?;
        Ok(Response::new(pb::CreateVolumeResponse {
            volume: Some(self.volume(&m)),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        let id = req.into_inner().volume_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let prov = self.prov.clone();
        blocking(move || prov.delete_volume(&id)).await?;
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _: Request<pb::ControllerPublishVolumeRequest>,
    ) -> Result<Response<pb::ControllerPublishVolumeResponse>, Status> {
        Err(Status::unimplemented("hostpath volumes need no attach"))
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<pb::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<pb::ControllerUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented("hostpath volumes need no detach"))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<pb::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<pb::ValidateVolumeCapabilitiesResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if r.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities are required"));
        }
        let prov = self.prov.clone();
        let id = r.volume_id.clone();
        let m = blocking(move || prov.volume(&id).map(|(_, m)| m)).await?;
        let verdict = match capabilities_mode(&r.volume_capabilities) {
            Ok(mode) if mode == m.mode => Ok(()),
            Ok(mode) => Err(format!(
                "volume {} is a {:?} volume, not {mode:?}",
                m.id, m.mode
            )),
            Err(e) => Err(e),
        };
        Ok(Response::new(match verdict {
            Ok(()) => pb::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(pb::validate_volume_capabilities_response::Confirmed {
                    volume_context: r.volume_context,
                    volume_capabilities: r.volume_capabilities,
                    parameters: r.parameters,
                    mutable_parameters: Default::default(),
                }),
                message: String::new(),
            },
            Err(message) => pb::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
        }))
    }

    async fn list_volumes(
        &self,
        req: Request<pb::ListVolumesRequest>,
    ) -> Result<Response<pb::ListVolumesResponse>, Status> {
        let r = req.into_inner();
        let prov = self.prov.clone();
        let page = blocking(move || prov.list_volumes(&r.starting_token, r.max_entries)).await?;
        let entries = page
            .items
            .iter()
            .map(|m| pb::list_volumes_response::Entry {
                volume: Some(self.volume(m)),
                status: Some(pb::list_volumes_response::VolumeStatus {
                    published_node_ids: vec![],
                    volume_condition: self.condition(&m.id),
                }),
            })
            .collect();
        Ok(Response::new(pb::ListVolumesResponse {
            entries,
            next_token: page.next_token,
        }))
    }

    async fn get_capacity(
        &self,
        req: Request<pb::GetCapacityRequest>,
    ) -> Result<Response<pb::GetCapacityResponse>, Status> {
        let r = req.into_inner();
        let zero = Response::new(pb::GetCapacityResponse {
            available_capacity: 0,
            maximum_volume_size: Some(0),
            minimum_volume_size: None,
        });
        if let Some(t) = &r.accessible_topology
            && !self.topology_matches(t)
        {
            return Ok(zero);
        }
        if !r.volume_capabilities.is_empty() && capabilities_mode(&r.volume_capabilities).is_err() {
            return Ok(zero);
        }
        let pool = r.parameters.get(POOL_PARAMETER).cloned();
        let prov = self.prov.clone();
        let cap = match blocking(move || prov.capacity(pool.as_deref())).await {
            Ok(c) => c,
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(zero),
            Err(s) => return Err(s),
        };
        let avail = cap.available_bytes.min(i64::MAX as u64) as i64;
        Ok(Response::new(pb::GetCapacityResponse {
            available_capacity: avail,
            maximum_volume_size: Some(avail),
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<pb::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<pb::ControllerGetCapabilitiesResponse>, Status> {
        use csc::rpc::Type as T;
        let caps = [
            T::CreateDeleteVolume,
            T::ListVolumes,
            T::GetCapacity,
            T::CreateDeleteSnapshot,
            T::ListSnapshots,
            T::CloneVolume,
            T::ExpandVolume,
            T::GetVolume,
            T::VolumeCondition,
            T::SingleNodeMultiWriter,
            T::ModifyVolume,
        ];
        // GetSnapshot is served but not advertised: GET_SNAPSHOT (CSI 1.12) is unknown to the
        // sidecars built on CSI 1.11, and csi-lib-utils before v0.22 (csi-provisioner v5.2.0)
        // panics logging a capability it has no name for. No sidecar calls GetSnapshot yet.
        Ok(Response::new(pb::ControllerGetCapabilitiesResponse {
            capabilities: caps
                .into_iter()
                .map(|t| pb::ControllerServiceCapability {
                    r#type: Some(csc::Type::Rpc(csc::Rpc { r#type: t as i32 })),
                })
                .collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        req: Request<pb::CreateSnapshotRequest>,
    ) -> Result<Response<pb::CreateSnapshotResponse>, Status> {
        let r = req.into_inner();
        if r.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        if r.source_volume_id.is_empty() {
            return Err(Status::invalid_argument("source_volume_id is required"));
        }
        let prov = self.prov.clone();
        let s = blocking(move || prov.create_snapshot(&r.name, &r.source_volume_id)).await?;
        Ok(Response::new(pb::CreateSnapshotResponse {
            snapshot: Some(snapshot(&s)),
        }))
    }

    async fn delete_snapshot(
        &self,
        req: Request<pb::DeleteSnapshotRequest>,
    ) -> Result<Response<pb::DeleteSnapshotResponse>, Status> {
        let id = req.into_inner().snapshot_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("snapshot_id is required"));
        }
        let prov = self.prov.clone();
        blocking(move || prov.delete_snapshot(&id)).await?;
        Ok(Response::new(pb::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        req: Request<pb::ListSnapshotsRequest>,
    ) -> Result<Response<pb::ListSnapshotsResponse>, Status> {
        let r = req.into_inner();
        let prov = self.prov.clone();
        let page = blocking(move || {
            prov.list_snapshots(
                &r.snapshot_id,
                &r.source_volume_id,
                &r.starting_token,
                r.max_entries,
            )
        })
        .await?;
        Ok(Response::new(pb::ListSnapshotsResponse {
            entries: page
                .items
                .iter()
                .map(|s| pb::list_snapshots_response::Entry {
                    snapshot: Some(snapshot(s)),
                })
                .collect(),
            next_token: page.next_token,
        }))
    }

    async fn get_snapshot(
        &self,
        req: Request<pb::GetSnapshotRequest>,
    ) -> Result<Response<pb::GetSnapshotResponse>, Status> {
        let id = req.into_inner().snapshot_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("snapshot_id is required"));
        }
        let prov = self.prov.clone();
        let s = blocking(move || prov.snapshot(&id).map(|(_, s)| s)).await?;
        Ok(Response::new(pb::GetSnapshotResponse {
            snapshot: Some(snapshot(&s)),
        }))
    }

    async fn controller_expand_volume(
        &self,
        req: Request<pb::ControllerExpandVolumeRequest>,
    ) -> Result<Response<pb::ControllerExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if r.capacity_range.is_none() {
            return Err(Status::invalid_argument("capacity_range is required"));
        }
        if let Some(c) = &r.volume_capability {
            capability_mode(c).map_err(Status::invalid_argument)?;
        }
        let range = range(r.capacity_range.as_ref())?;
        let prov = self.prov.clone();
        let (bytes, node) = blocking(move || prov.expand_volume(&r.volume_id, range)).await?;
        Ok(Response::new(pb::ControllerExpandVolumeResponse {
            capacity_bytes: bytes as i64,
            node_expansion_required: node,
        }))
    }

    async fn controller_get_volume(
        &self,
        req: Request<pb::ControllerGetVolumeRequest>,
    ) -> Result<Response<pb::ControllerGetVolumeResponse>, Status> {
        let id = req.into_inner().volume_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let prov = self.prov.clone();
        let id2 = id.clone();
        let m = blocking(move || prov.volume(&id2).map(|(_, m)| m)).await?;
        Ok(Response::new(pb::ControllerGetVolumeResponse {
            volume: Some(self.volume(&m)),
            status: Some(pb::controller_get_volume_response::VolumeStatus {
                published_node_ids: vec![],
                volume_condition: self.condition(&id),
            }),
        }))
    }

    async fn controller_modify_volume(
        &self,
        req: Request<pb::ControllerModifyVolumeRequest>,
    ) -> Result<Response<pb::ControllerModifyVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let params: BTreeMap<String, String> = r.mutable_parameters.into_iter().collect();
        let prov = self.prov.clone();
        blocking(move || prov.modify_volume(&r.volume_id, &params)).await?;
        Ok(Response::new(pb::ControllerModifyVolumeResponse {}))
    }
}
