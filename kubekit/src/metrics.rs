//! Prometheus metrics of the controllers' reconciles (controller-rs style), served as text on
//! `/metrics` by [`netkit::metrics`].

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::error::{Error, Result};

/// Labels: which controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    /// `datavolume`, `hyperconverged` or `hostpathprovisioner`.
    pub controller: String,
}

/// Labels: which controller, which error kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabel {
    /// The controller.
    pub controller: String,
    /// `invalid` or `transient`.
    pub kind: String,
}

/// Reconcile counters and durations of all controllers.
#[derive(Debug)]
pub struct Metrics {
    /// Reconciles run.
    pub reconciles: Family<ControllerLabel, Counter>,
    /// Reconciles that failed.
    pub failures: Family<FailureLabel, Counter>,
    /// Reconcile durations in seconds.
    pub duration: Family<ControllerLabel, Histogram>,
    registry: Mutex<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        let reconciles = Family::<ControllerLabel, Counter>::default();
        let failures = Family::<FailureLabel, Counter>::default();
        let duration = Family::<ControllerLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0])
        });
        let mut registry = Registry::with_prefix("quarry_controller");
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register(
            "reconcile_failures",
            "Reconciles that failed",
            failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile durations",
            duration.clone(),
        );
        Metrics {
            reconciles,
            failures,
            duration,
            registry: Mutex::new(registry),
        }
    }
}

/// Measures one reconcile; the duration is recorded when dropped.
#[derive(Debug)]
pub struct Measure {
    metrics: Arc<Metrics>,
    label: ControllerLabel,
    start: Instant,
}

impl Drop for Measure {
    fn drop(&mut self) {
        self.metrics
            .duration
            .get_or_create(&self.label)
            .observe(self.start.elapsed().as_secs_f64());
    }
}

impl Metrics {
    /// Counts a reconcile of `controller` and times it until the guard drops.
    pub fn reconcile(self: &Arc<Self>, controller: &str) -> Measure {
        let label = ControllerLabel {
            controller: controller.into(),
        };
        self.reconciles.get_or_create(&label).inc();
        Measure {
            metrics: self.clone(),
            label,
            start: Instant::now(),
        }
    }

    /// Counts a failed reconcile.
    pub fn failure(&self, controller: &str, err: &Error) {
        let kind = match err.kind() {
            crate::ErrorKind::Invalid => "invalid",
            crate::ErrorKind::Transient => "transient",
        };
        self.failures
            .get_or_create(&FailureLabel {
                controller: controller.into(),
                kind: kind.into(),
            })
            .inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("encoding metrics into a String");
        out
    }
}

/// Serves `/metrics` (and `/healthz`) on `addr` until the runtime stops.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<SocketAddr> {
    let app = netkit::metrics::router(None, move || metrics.render())
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    Ok(netkit::metrics::serve(addr, app).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciles_and_failures_are_counted_per_controller() {
        let m = Arc::new(Metrics::default());
        drop(m.reconcile("datavolume"));
        drop(m.reconcile("datavolume"));
        m.failure("datavolume", &Error::InvalidSpec("x".into()));
        let text = m.render();
        assert!(
            text.contains("quarry_controller_reconciles_total{controller=\"datavolume\"} 2"),
            "{text}"
        );
        assert!(text.contains(
            "quarry_controller_reconcile_failures_total{controller=\"datavolume\",kind=\"invalid\"} 1"
        ));
        assert!(text.contains(
            "quarry_controller_reconcile_duration_seconds_count{controller=\"datavolume\"} 2"
        ));
    }
}
