//! Hostpath storage pools: volume create/delete/expand/snapshot/clone, capacity and quota.
//!
//! No gRPC here: the `csi` crate maps requests onto [`Provisioner`] and [`Error::kind`] onto
//! status codes.

pub mod config;
pub mod crash;
pub mod error;
pub mod group;
pub mod guard;
pub mod meta;
pub mod page;
pub mod sys;

pub use config::{PoolConfig, QuotaMode, parse_pools};
pub use error::{Error, ErrorKind, Result};
pub mod node;
pub mod pool;
pub mod provisioner;

pub use node::{Publish, VolumeStats};
pub use pool::{Pool, PoolCapacity, QuotaInForce};
pub use provisioner::{CapacityRange, CreateVolume, Provisioner};

/// HPP's CSI driver name (the CSI driver's default, and what the operators deploy).
pub const DRIVER_NAME: &str = "kubevirt.io.hostpath-provisioner";
/// StorageClass parameter selecting the pool.
pub const POOL_PARAMETER: &str = "storagePool";
