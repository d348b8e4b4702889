//! CRD types, the DataVolume / HyperConverged / HostPathProvisioner controllers (not yet built) and
//! the KVM launcher ([`launcher`]).

pub mod launcher;
