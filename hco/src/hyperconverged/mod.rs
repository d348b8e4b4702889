//! The HyperConverged operator: keeps HCO's child resources in line with the singleton
//! `kubevirt-hyperconverged` and reports aggregated conditions; plus the validating webhook.
//!
//! - [`children`]: the child objects (CDI with the propagated storage settings, KubeVirt, SSP,
//!   NetworkAddonsConfig, HostPathProvisioner when enabled);
//! - [`conditions`]: Available / Progressing / Degraded / ReconcileComplete / Upgradeable;
//! - [`webhook`]: hco-webhook's checks and an `AdmissionReview` handler;
//! - [`controller`]: the kube-runtime controller.

pub mod children;
pub mod conditions;
pub mod controller;
pub mod golden_images;
pub mod webhook;
