//! Custom resource types with the upstream groups, versions and field names: CDI's
//! [`DataVolume`] and configuration objects ([`Cdi`], [`CdiConfig`], [`StorageProfile`]), HCO's
//! [`HyperConverged`] and the HPP operator's [`HostPathProvisioner`], and CDI's golden-image
//! objects ([`DataSource`], [`DataImportCron`]); and what a Quarry install agrees on besides:
//! the names of its objects ([`names`]), each component's RBAC ([`rbac`]) and the kinds a
//! HyperConverged makes ([`children`]). Types and names only: no client, no I/O.

pub mod cdi;
pub mod children;
pub mod datavolume;
pub mod duration;
pub mod golden;
pub mod hostpath;
pub mod hyperconverged;
pub mod names;
pub mod populator;
pub mod rbac;
pub mod snapshot;

pub use cdi::{Cdi, CdiConfig, CdiConfigSpec, CdiConfigStatus, StorageProfile};
pub use datavolume::{DataVolume, DataVolumeSpec, DataVolumeStatus, Phase};
pub use golden::{DataImportCron, DataImportCronSpec, DataSource, DataSourceSpec};
pub use hostpath::{HostPathProvisioner, HostPathProvisionerSpec, HostPathProvisionerStatus};
pub use hyperconverged::{HyperConverged, HyperConvergedSpec, HyperConvergedStatus};

/// A condition's `REASON: MESSAGE`, as `quarry apply` prints why an object is not done.
pub fn reason_and_message(reason: Option<&str>, message: Option<&str>) -> String {
    format!(
        "{}: {}",
        reason.unwrap_or_default(),
        message.unwrap_or_default()
    )
}
