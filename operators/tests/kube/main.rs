//! The controllers against a real `kube-apiserver` (1.28 or later, with etcd: `testkit::kube`). One
//! server per test binary; each test works in namespaces of its own and runs its controller
//! scoped to them. There is no scheduler or kubelet: the tests write PVC and pod status
//! themselves, and serve fake importer metrics on 127.0.0.1.
//!
//! Every test skips (printing why) where the locally built kube-apiserver (`~/.cache/kubelab`) or etcd is absent.

mod bundle;
mod cdiconfig;
mod certs;
mod clone;
mod dataimportcron;
mod datasource;
mod datavolume;
mod hostpath;
mod hyperconverged;
mod leader;
mod populator;
mod support;
mod webhooks;
