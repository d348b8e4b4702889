//! The operators' composition root: what each `quarry controller` process runs ([`process`]) and
//! the `quarry controller` / `apply` / `get` / `gen-deploy` commands ([`cli`]). The parts are
//! crates of their own: `api` (types and names), `kubekit` (the controller kit), `cdi` (CDI's
//! controllers and local mode), `hco` (the HyperConverged and HostPathProvisioner operators),
//! `certs` (the PKI and cert controller) and `bundle` (the generated install).

pub mod cli;
pub mod process;
