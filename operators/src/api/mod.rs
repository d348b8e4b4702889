//! Custom resource types with the upstream groups, versions and field names: CDI's
//! [`DataVolume`] and configuration objects ([`Cdi`], [`CdiConfig`], [`StorageProfile`]), HCO's
//! [`HyperConverged`] and the HPP operator's [`HostPathProvisioner`].

pub mod cdi;
pub mod datavolume;
pub mod hostpath;
pub mod hyperconverged;

pub use cdi::{Cdi, CdiConfig, CdiConfigSpec, CdiConfigStatus, StorageProfile};
pub use datavolume::{DataVolume, DataVolumeSpec, DataVolumeStatus, Phase};
pub use hostpath::{HostPathProvisioner, HostPathProvisionerSpec, HostPathProvisionerStatus};
pub use hyperconverged::{HyperConverged, HyperConvergedSpec, HyperConvergedStatus};
