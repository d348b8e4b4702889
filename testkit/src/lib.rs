//! Test-only helpers shared by the workspace's test suites.
//!
//! Everything here starts real third-party peers (qemu-img, nginx, ...) or small servers of the
//! suite's own on 127.0.0.1 with free ports, and stops them by PID when dropped.

pub mod accept;
pub mod cluster;
pub mod faults;
pub mod gcs;
pub mod guest;
pub mod kube;
pub mod nginx;
pub mod oci;
pub mod proxy;
pub mod qemu;
pub mod registry;
pub mod s3;
pub mod tinyproxy;
pub mod tls;
