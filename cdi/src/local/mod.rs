//! Local mode: `quarry apply` and `quarry get` without a cluster. The cluster's decisions
//! (`datavolume::decide`, `golden::cron`, `golden::datasource`) driven by local stand-ins: a pool
//! directory of the [`provisioner`] for PVCs, in-process imports for importer pods, YAML files in
//! a state directory for the API ([`store`]).
//!
//! - [`datavolume`]: DataVolumes (imports, uploads refused, blank disks) and the `get dv` table;
//! - [`clone`]: DataVolumes cloned from a local PVC, snapshot or DataSource;
//! - [`datasource`]: DataSources and their Ready condition;
//! - [`cron`]: one poll-and-import cycle of a DataImportCron.

pub mod clone;
pub mod cron;
pub mod datasource;
pub mod datavolume;
pub mod store;
