//! Thin, safe wrappers over the Linux interfaces the provisioner uses: project quotas, btrfs
//! subvolumes and qgroups, loop devices, bind mounts, reflink and sparse copies, filesystem
//! statistics.

pub mod btrfs;
pub mod copy;
pub mod fsinfo;
pub mod loopdev;
pub mod mount;
pub mod quota;
