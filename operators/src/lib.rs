//! CRD types, the DataVolume / HyperConverged / HostPathProvisioner controllers and the KVM launcher (not yet built).
