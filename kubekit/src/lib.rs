//! What every Quarry controller runs on: one error type with a kind that decides retry or not
//! ([`error`]), the API calls a level-driven controller makes ([`kubeops`]), reconcile metrics
//! ([`metrics`]), leader election ([`leader`]), TLS serving of webhooks ([`tls`]), and, for
//! tests, an API server stand-in that checks each request against the component's RBAC
//! ([`mockapi`], feature `mock`).

pub mod error;
pub mod informer;
pub mod kubeops;
pub mod leader;
pub mod metrics;
#[cfg(any(test, feature = "mock"))]
pub mod mockapi;
pub mod tls;

pub use error::{Error, ErrorKind, Result};
