//! Custom resource types with the upstream groups, versions and field names: CDI's
//! [`DataVolume`], HCO's [`HyperConverged`] and the HPP operator's [`HostPathProvisioner`].

pub mod datavolume;
pub mod hostpath;
pub mod hyperconverged;

pub use datavolume::{DataVolume, DataVolumeSpec, DataVolumeStatus, Phase};
pub use hostpath::{HostPathProvisioner, HostPathProvisionerSpec, HostPathProvisionerStatus};
pub use hyperconverged::{HyperConverged, HyperConvergedSpec, HyperConvergedStatus};
