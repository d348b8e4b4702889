//! The operators that install storage: HCO's HyperConverged ([`hyperconverged`]: its children,
//! golden images and validating webhook) and the HostPathProvisioner ([`hostpath`]: the CSI
//! driver's objects per storage pool).

pub mod hostpath;
pub mod hyperconverged;
