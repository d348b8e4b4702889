//! What to do after a failed pod: `quarry import`'s exit code says whether retrying can help
//! (10-15 terminal, 20-21 retryable, see the README's exit codes); retryable failures are retried
//! with an exponential back-off, capped in delay and in count.

use std::time::Duration;

use importer::ErrorKind;

/// Back-off and bound of retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay before the first retry; doubled for each further one.
    pub base_delay: Duration,
    /// Longest delay between two attempts.
    pub max_delay: Duration,
    /// Attempts after the first one; then the DataVolume fails.
    pub max_restarts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base_delay: Duration::from_secs(10),
            max_delay: Duration::from_secs(300),
            max_restarts: 10,
        }
    }
}

impl RetryPolicy {
    /// Delay before restart number `restart` (1 for the first retry).
    pub fn delay(&self, restart: u32) -> Duration {
        let factor = 1u32
            .checked_shl(restart.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base_delay
            .checked_mul(factor)
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }
}

/// How a finished pod failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Condition and event reason (`ChecksumMismatch`, `SourceUnavailable`, `Error`, ...).
    pub reason: String,
    /// Whether running the pod again may succeed.
    pub retryable: bool,
}

/// Classifies a container's exit code: `quarry`'s terminal codes fail at once, retryable codes
/// and anything unknown (killed, OOM, node lost) are retried.
pub fn classify(exit_code: i32) -> Failure {
    match ErrorKind::from_exit_code(exit_code) {
        Some(kind) => Failure {
            reason: kind.reason().to_string(),
            retryable: kind.is_retryable(),
        },
        None => Failure {
            reason: "Error".to_string(),
            retryable: true,
        },
    }
}

/// `quarry import`'s terminal exit codes and the reasons CDI users see for them (tests' table).
#[cfg(test)]
pub(crate) const TERMINAL_EXIT_CODES: [(i32, &str); 6] = [
    (10, "InvalidInput"),
    (11, "UnsupportedImage"),
    (12, "CorruptImage"),
    (13, "TargetTooSmall"),
    (14, "ChecksumMismatch"),
    (15, "SourceRejected"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_exit_codes_fail_at_once() {
        for (code, reason) in TERMINAL_EXIT_CODES {
            assert_eq!(
                classify(code),
                Failure {
                    reason: reason.into(),
                    retryable: false
                }
            );
        }
    }

    #[test]
    fn retryable_and_unknown_exit_codes_are_retried() {
        assert_eq!(classify(20).reason, "SourceUnavailable");
        assert_eq!(classify(21).reason, "IOError");
        for code in [20, 21, 1, 137, 255] {
            assert!(classify(code).retryable, "{code}");
        }
    }

    #[test]
    fn back_off_doubles_up_to_the_cap() {
        let p = RetryPolicy {
            base_delay: Duration::from_secs(10),
            max_delay: Duration::from_secs(60),
            max_restarts: 5,
        };
        let d: Vec<u64> = (1..=6).map(|n| p.delay(n).as_secs()).collect();
        assert_eq!(d, [10, 20, 40, 60, 60, 60]);
        assert_eq!(p.delay(1000), Duration::from_secs(60));
    }
}
