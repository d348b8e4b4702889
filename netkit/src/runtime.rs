//! A thread with a tokio runtime of its own (current-thread), for network work started from
//! code that has no runtime, or must not depend on the caller's: an HTTP transfer, the importer's
//! metrics endpoint; and the signal every server stops on.

use std::io;
use std::thread::JoinHandle;

/// Starts thread `name` and runs `body` on it with a fresh current-thread runtime (or the
/// error that building one gave).
pub fn thread_with_runtime<F>(name: &str, body: F) -> io::Result<JoinHandle<()>>
where
    F: FnOnce(io::Result<tokio::runtime::Runtime>) + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            body(
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build(),
            )
        })
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn terminated() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
}
