//! What shows an import's progress as it runs (feature `cli`): the terminal progress bar and the
//! Prometheus endpoint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Progress, ProgressMetric, render_progress};
use crate::error::Result;

/// Serves `/metrics` on `addr` from a background thread for the life of the process.
/// Returns the bound address (so `127.0.0.1:0` can be used).
pub fn serve_metrics(
    addr: SocketAddr,
    owner_uid: String,
    progress: Arc<Progress>,
) -> Result<SocketAddr> {
    serve_progress(addr, ProgressMetric::Import, owner_uid, progress)
}

/// [`serve_metrics`] of `metric`.
pub fn serve_progress(
    addr: SocketAddr,
    metric: ProgressMetric,
    owner_uid: String,
    progress: Arc<Progress>,
) -> Result<SocketAddr> {
    let app = netkit::metrics::router(Some(netkit::metrics::OPENMETRICS), move || {
        render_progress(metric, &owner_uid, &progress)
    });
    Ok(netkit::metrics::serve_on_thread(addr, app)?)
}

/// A terminal progress bar fed from an import's counters (hidden when stderr is not a terminal).
pub struct ProgressBar {
    /// Dropped to stop the bar: its thread wakes at once instead of finishing a 100 ms tick,
    /// which small imports would otherwise wait for.
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProgressBar {
    pub fn start(progress: Arc<Progress>) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(10_000),
                indicatif::ProgressDrawTarget::stderr(),
            );
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% {msg}",
                )
                .expect("valid template"),
            );
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(std::time::Duration::from_millis(100))
            {
                if let Some(p) = progress.percent() {
                    bar.set_position((p * 100.0) as u64);
                }
                let written = progress.data_written.load(Ordering::Relaxed);
                bar.set_message(format!("{} MiB written", written >> 20));
            }
            bar.finish_and_clear();
        });
        ProgressBar {
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
