//! Custom resource types with the upstream groups, versions and field names: CDI's
//! [`DataVolume`] and configuration objects ([`Cdi`], [`CdiConfig`], [`StorageProfile`]), HCO's
//! [`HyperConverged`] and the HPP operator's [`HostPathProvisioner`], and CDI's golden-image
//! objects ([`DataSource`], [`DataImportCron`]).

pub mod cdi;
pub mod datavolume;
pub mod golden;
pub mod hostpath;
pub mod hyperconverged;
pub mod snapshot;

pub use cdi::{Cdi, CdiConfig, CdiConfigSpec, CdiConfigStatus, StorageProfile};
pub use datavolume::{DataVolume, DataVolumeSpec, DataVolumeStatus, Phase};
pub use golden::{DataImportCron, DataImportCronSpec, DataSource, DataSourceSpec};
pub use hostpath::{HostPathProvisioner, HostPathProvisionerSpec, HostPathProvisionerStatus};
pub use hyperconverged::{HyperConverged, HyperConvergedSpec, HyperConvergedStatus};
