//! What to do after a failed pod: `quarry import`'s exit code says whether retrying can help
//! (10-15 terminal, 20-21 retryable, see the README's exit codes); retryable failures are retried
//! with an exponential back-off, capped in delay and in count.

use importer::ErrorKind;

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

/// Whether `reason` (a [`Failure`]'s) names a terminal failure.
pub fn is_terminal(reason: &str) -> bool {
    (0..=255).any(|code| {
        let f = classify(code);
        !f.retryable && f.reason == reason
    })
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
    fn terminal_reasons_are_known_by_name() {
        for (_, reason) in TERMINAL_EXIT_CODES {
            assert!(is_terminal(reason), "{reason}");
        }
        for reason in ["SourceUnavailable", "IOError", "Error", ""] {
            assert!(!is_terminal(reason), "{reason}");
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
}
