//! The end-to-end suite: Quarry installed on a real one-node Kubernetes (`testkit::cluster`,
//! from `../shared/kube`), each workflow as a user runs it, each checked by its real outcome: the
//! bytes a pod reads from the volume equal `qemu-img convert -O raw` of the source, and the
//! DataVolume's phase and events are CDI's. Skips, saying why, where the cluster cannot run.

#[path = "../common/mod.rs"]
mod common;

mod faults;
mod flows;
mod operators;
mod populators;
mod pvc_pool;
mod support;
