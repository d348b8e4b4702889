//! Import progress: counters updated by the pipeline, read by the terminal progress bar
//! (`ProgressBar`, feature `cli`) and by the Prometheus endpoint (`kubevirt_cdi_import_progress_total{ownerUID}`,
//! as CDI's importer serves).

use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(any(test, feature = "cli"))]
mod live;

#[cfg(any(test, feature = "cli"))]
pub use live::{ProgressBar, serve_metrics, serve_progress};

/// Shared counters of one import.
#[derive(Debug, Default)]
pub struct Progress {
    /// Source bytes read (before decompression).
    pub source_read: AtomicU64,
    /// Source length, 0 when unknown.
    pub source_length: AtomicU64,
    /// Guest bytes written (data and zeroes).
    pub written: AtomicU64,
    /// Data bytes written to the target (non-zero runs; see `VolumeSink::data_written`).
    pub data_written: AtomicU64,
    /// Virtual size, 0 until known.
    pub virtual_size: AtomicU64,
}

impl Progress {
    /// Percent done in 0..=100, from the source position when its length is known (as CDI
    /// computes it), else from the guest bytes written; `None` when neither is known.
    pub fn percent(&self) -> Option<f64> {
        let ratio = |done: &AtomicU64, total: &AtomicU64| {
            let total = total.load(Ordering::Relaxed);
            (total > 0)
                .then(|| (done.load(Ordering::Relaxed) as f64 / total as f64 * 100.0).min(100.0))
        };
        ratio(&self.source_read, &self.source_length)
            .or_else(|| ratio(&self.written, &self.virtual_size))
    }
}

/// Which of CDI's progress counters an endpoint serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMetric {
    /// The importer's `kubevirt_cdi_import_progress_total`.
    Import,
    /// The cloner's `kubevirt_cdi_clone_progress_total` (`quarry clone-source`).
    Clone,
}

impl ProgressMetric {
    /// The counter's name without `_total` (the encoder adds it) and its help text.
    fn name_and_help(self) -> (&'static str, &'static str) {
        match self {
            ProgressMetric::Import => (
                "kubevirt_cdi_import_progress",
                "The import progress in percentage",
            ),
            ProgressMetric::Clone => (
                "kubevirt_cdi_clone_progress",
                "The clone progress in percentage",
            ),
        }
    }
}

/// The metrics text: CDI's progress counter, labelled with the owner's UID.
pub fn render_metrics(owner_uid: &str, progress: &Progress) -> String {
    render_progress(ProgressMetric::Import, owner_uid, progress)
}

/// The metrics text of `metric`, labelled with the owner's UID.
pub fn render_progress(metric: ProgressMetric, owner_uid: &str, progress: &Progress) -> String {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::registry::Registry;
    use std::sync::atomic::AtomicU64 as A;

    let mut registry = Registry::default();
    let family = Family::<Vec<(String, String)>, Counter<f64, A>>::default();
    let (name, help) = metric.name_and_help();
    registry.register(name, help, family.clone());
    family
        .get_or_create(&vec![("ownerUID".to_string(), owner_uid.to_string())])
        .inc_by(progress.percent().unwrap_or(0.0));
    let mut out = String::new();
    encode(&mut out, &registry).expect("encoding metrics into a String");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_prefers_the_source_position() {
        let p = Progress::default();
        assert_eq!(p.percent(), None);
        p.virtual_size.store(1000, Ordering::Relaxed);
        p.written.store(250, Ordering::Relaxed);
        assert_eq!(p.percent(), Some(25.0));
        p.source_length.store(200, Ordering::Relaxed);
        p.source_read.store(150, Ordering::Relaxed);
        assert_eq!(p.percent(), Some(75.0));
    }

    #[test]
    fn metrics_name_and_label_match_cdi() {
        let p = Progress::default();
        p.source_length.store(4, Ordering::Relaxed);
        p.source_read.store(1, Ordering::Relaxed);
        let text = render_metrics("uid-123", &p);
        assert!(
            text.contains(r#"kubevirt_cdi_import_progress_total{ownerUID="uid-123"} 25"#),
            "{text}"
        );
    }
}
