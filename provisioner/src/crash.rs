//! Named crash points: where a test makes the driver die exactly as `kill -9` would, to prove
//! that a restart recovers from that point. Inert unless `QUARRY_CRASH_AT` names the point.

use std::sync::OnceLock;

/// The environment variable naming the crash point to die at.
pub const CRASH_AT_ENV: &str = "QUARRY_CRASH_AT";

/// Kills the process with SIGKILL when `QUARRY_CRASH_AT` equals `point`.
pub fn point(point: &str) {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    let at = AT.get_or_init(|| std::env::var(CRASH_AT_ENV).ok());
    if at.as_deref() == Some(point) {
        tracing::error!(point, "crash point reached: killing the process");
        // SAFETY: raise(2) with a valid signal number; SIGKILL cannot be caught, so nothing
        // after this point runs, as with an external `kill -9`.
        unsafe { libc::raise(libc::SIGKILL) };
    }
}
