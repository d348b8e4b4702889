//! Quarry's network kit: the pieces of HTTP and TLS that the importer, the uploader and the
//! operators all need, written once.
//!
//! - [`client`]: the HTTP client factory ([`HttpOptions`], [`client_builder`]): extra CAs,
//!   insecure mode, redirects, timeouts, one user agent.
//! - [`tls`]: the process's crypto provider, PEM certificates, serving identities and client CAs
//!   that follow their files when kubelet rotates a mounted Secret, the rustls server
//!   configuration, and an axum listener that completes the handshake before serving (feature
//!   `serve`).
//! - `metrics` (feature `serve`): binding a listener and serving a Prometheus `/metrics` endpoint, on the
//!   caller's runtime or on a thread of its own.
//! - [`percent`]: percent-decoding of URL parts, and the strict encoding object stores want.
//! - [`runtime`]: a thread with a tokio runtime of its own.
//!
//! Errors are [`Error`]: each crate turns them into its own (`InvalidInput` and `Io` map onto
//! the crate's variants of the same name).

pub mod argv;
pub mod client;
pub mod error;
#[cfg(feature = "serve")]
pub mod metrics;
pub mod percent;
pub mod runtime;
pub mod tls;

pub use client::{HttpOptions, build_client, client_builder};
pub use error::{Error, Result};
pub use percent::{percent_decode, percent_encode};
pub use runtime::thread_with_runtime;
pub use tls::install_tls_provider;
