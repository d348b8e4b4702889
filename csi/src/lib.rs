//! CSI gRPC services (Identity, Controller, GroupController, Node) over the [`provisioner`] crate: a drop-in for
//! KubeVirt's hostpath-provisioner CSI driver (same driver name, topology key and `storagePool`
//! parameter), with enforced sizes, block volumes, snapshots and clones.

mod authority;
mod client;
mod controller;
mod group;
mod identity;
pub mod mounter;
mod node;
mod server;
mod status;

/// Generated CSI v1 protocol types, servers and clients.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("csi.v1");
}

pub use client::connect_unix;
pub use server::{CsiArgs, Driver, DriverConfig, Endpoint, SHUTDOWN_GRACE, run, serve};
pub use status::to_status;

pub use provisioner::{DRIVER_NAME, POOL_PARAMETER};
/// HPP's topology key; its value is the node id.
pub const TOPOLOGY_KEY: &str = "topology.hostpath.csi/node";

/// Errors of the CSI server as a whole (request errors are gRPC statuses).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad command-line or configuration value.
    #[error("configuration: {0}")]
    Config(String),
    /// The provisioner failed to open its pools.
    #[error(transparent)]
    Provisioner(#[from] provisioner::Error),
    /// Socket setup failed.
    #[error("{context}")]
    Io {
        /// What was being done.
        context: String,
        /// Cause, printed by the CLI's chain.
        source: std::io::Error,
    },
    /// A storage pool's Block PVC could not be mounted (`quarry pool-mount --device`).
    #[error(transparent)]
    PoolDevice(#[from] mounter::DeviceError),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}
