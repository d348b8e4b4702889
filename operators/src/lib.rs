//! CRD types ([`api`]), the DataVolume ([`datavolume`]), HyperConverged ([`hyperconverged`]) and
//! HostPathProvisioner ([`hostpath`]) controllers, the manifests generated from them
//! ([`deploy`]) and the `quarry controller` / `apply` / `get` commands ([`cli`]). The KVM
//! launcher is its own crate (`launcher`).

pub mod api;
pub mod apiserver;
pub mod cdiconfig;
pub mod certs;
pub mod cli;
pub mod datavolume;
pub mod deploy;
pub mod error;
pub mod golden;
pub mod hostpath;
pub mod hyperconverged;
pub mod kubeops;
pub mod leader;
pub mod local;
pub mod metrics;
#[cfg(test)]
mod mockapi;
pub mod names;
pub mod process;
pub mod settings;
mod tls;

pub use error::{Error, ErrorKind, Result};
