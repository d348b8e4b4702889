//! CSI conformance suite, organised like csi-sanity: Identity, Controller, Node. Each test
//! starts the driver in-process on a unix socket in a temp dir and talks to it with the
//! generated tonic clients. Tests that need root, loop devices or XFS print why and pass; the
//! project-quota tests also run inside a guest kernel that has quota support (`guest.rs`).

mod access;
mod btrfs;
mod common;
mod controller;
mod group;
mod guest;
mod identity;
mod load;
mod node;
mod python;
mod race;
mod xfs;
