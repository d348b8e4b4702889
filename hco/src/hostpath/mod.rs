//! The HostPathProvisioner operator: deploys Quarry's CSI driver (HPP's driver name, topology
//! key and `storagePool` parameter) from the CR and reports pool status.
//!
//! - [`objects`]: DaemonSet, CSIDriver, StorageClasses, ConfigMap and RBAC from the CR;
//! - [`status`]: conditions and pool statuses from the DaemonSet;
//! - [`controller`]: the kube-runtime controller.

pub mod controller;
pub mod objects;
pub mod status;
