//! The importer's one error type.
//!
//! Every failure is an [`Error`] whose [`ErrorKind`] decides whether a controller should retry the
//! import (the source was unreachable, a transient I/O fault) or give up at once (the image is
//! corrupt, too large, refused, or its checksum is wrong). The CLI maps kinds to exit codes.

mod format;

use std::io;

pub use format::{FormatError, FormatFault};

/// What went wrong, coarsely: enough to decide retry versus fail and to pick an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request itself is wrong (bad option, unparsable URL, target unusable).
    InvalidInput,
    /// A well-formed image uses a feature Quarry refuses (backing file, encryption, ...).
    Unsupported,
    /// The image's bytes contradict its own format (truncated, bad tables, bad compression).
    CorruptImage,
    /// The image does not fit the target volume.
    TooSmall,
    /// The downloaded bytes do not match the expected checksum.
    ChecksumMismatch,
    /// The source answered, but definitively no (404, 401, 403, TLS verification failure).
    SourceRejected,
    /// The source could not be reached or stopped answering (timeouts, resets, 5xx).
    SourceUnavailable,
    /// Reading or writing local storage failed.
    Io,
}

impl ErrorKind {
    /// True when running the same import again may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorKind::SourceUnavailable | ErrorKind::Io)
    }

    /// The `quarry` process exit code for this kind: 10-19 terminal, 20-29 retryable.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::InvalidInput => 10,
            ErrorKind::Unsupported => 11,
            ErrorKind::CorruptImage => 12,
            ErrorKind::TooSmall => 13,
            ErrorKind::ChecksumMismatch => 14,
            ErrorKind::SourceRejected => 15,
            ErrorKind::SourceUnavailable => 20,
            ErrorKind::Io => 21,
        }
    }

    /// The kind a `quarry import` exit code stands for (None for 0, 1, 2 and unknown codes).
    pub fn from_exit_code(code: i32) -> Option<ErrorKind> {
        Some(match code {
            10 => ErrorKind::InvalidInput,
            11 => ErrorKind::Unsupported,
            12 => ErrorKind::CorruptImage,
            13 => ErrorKind::TooSmall,
            14 => ErrorKind::ChecksumMismatch,
            15 => ErrorKind::SourceRejected,
            20 => ErrorKind::SourceUnavailable,
            21 => ErrorKind::Io,
            _ => return None,
        })
    }

    /// CamelCase name, used as the Kubernetes condition and event reason.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "InvalidInput",
            ErrorKind::Unsupported => "UnsupportedImage",
            ErrorKind::CorruptImage => "CorruptImage",
            ErrorKind::TooSmall => "TargetTooSmall",
            ErrorKind::ChecksumMismatch => "ChecksumMismatch",
            ErrorKind::SourceRejected => "SourceRejected",
            ErrorKind::SourceUnavailable => "SourceUnavailable",
            ErrorKind::Io => "IOError",
        }
    }

    /// Short stable name, used in JSON output and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid-input",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::CorruptImage => "corrupt-image",
            ErrorKind::TooSmall => "too-small",
            ErrorKind::ChecksumMismatch => "checksum-mismatch",
            ErrorKind::SourceRejected => "source-rejected",
            ErrorKind::SourceUnavailable => "source-unavailable",
            ErrorKind::Io => "io",
        }
    }
}

/// An import failure, with a message that names the problem.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("unsupported image: {0}")]
    Unsupported(String),
    #[error("corrupt image: {0}")]
    Corrupt(String),
    /// A format's parser refused the image or found it corrupt: its typed fault, kept whole.
    #[error(
        "{label}: {0}",
        label = if .0.kind() == ErrorKind::Unsupported { "unsupported image" } else { "corrupt image" }
    )]
    Format(FormatError),
    #[error(
        "image does not fit the target: it needs {needed} bytes but only {available} bytes are usable{}",
        if detail.is_empty() { String::new() } else { format!(" ({detail})") }
    )]
    TooSmall {
        needed: u64,
        available: u64,
        detail: String,
    },
    #[error("{algorithm} checksum mismatch: expected {expected}, got {actual}")]
    ChecksumMismatch {
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    #[error("source refused: {0}")]
    SourceRejected(String),
    #[error("source unavailable: {0}")]
    SourceUnavailable(String),
    /// The OS error is part of the message (no `source()`): the message is shown whole in
    /// DataVolume conditions and JSON reports, and chain printers do not repeat it.
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The network kit's errors keep their kind: a bad option or file, or local I/O.
impl From<netkit::Error> for Error {
    fn from(e: netkit::Error) -> Self {
        match e {
            netkit::Error::InvalidInput(m) => Error::InvalidInput(m),
            netkit::Error::Io { context, cause } => Error::Io { context, cause },
        }
    }
}

/// Local errors that the same import will meet again however often it is retried: the target (or
/// a file it needs) may not be written, or lies on a read-only filesystem.
fn never_passes(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EROFS)
    )
}

pub use netkit::error::chain;

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidInput(_) => ErrorKind::InvalidInput,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Corrupt(_) => ErrorKind::CorruptImage,
            Error::Format(e) => e.kind(),
            Error::TooSmall { .. } => ErrorKind::TooSmall,
            Error::ChecksumMismatch { .. } => ErrorKind::ChecksumMismatch,
            Error::SourceRejected(_) => ErrorKind::SourceRejected,
            Error::SourceUnavailable(_) => ErrorKind::SourceUnavailable,
            Error::Io { cause, .. } if never_passes(cause) => ErrorKind::InvalidInput,
            Error::Io { .. } => ErrorKind::Io,
        }
    }

    pub fn io(context: impl Into<String>, cause: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            cause,
        }
    }

    /// Carries this error through an [`io::Read`] boundary; [`Error::from_read`] unwraps it again.
    pub fn into_io(self) -> io::Error {
        io::Error::other(self)
    }

    /// Whether `err` carries one of ours through an [`io::Read`] boundary ([`Error::into_io`]).
    pub(crate) fn carried_by(err: &io::Error) -> bool {
        err.get_ref().is_some_and(|inner| inner.is::<Error>())
    }

    /// Classifies an error that came out of reading the (decoded) image stream.
    ///
    /// Errors raised by Quarry's own stages keep their kind; a premature end of the stream is a
    /// truncated image; decoder complaints (`InvalidData`/`InvalidInput`) are corruption of the
    /// named layer; anything else is a local I/O failure.
    pub fn from_read(err: io::Error, what: &str) -> Self {
        if Error::carried_by(&err) {
            return *err
                .into_inner()
                .expect("checked above")
                .downcast::<Error>()
                .expect("checked above");
        }
        match err.kind() {
            io::ErrorKind::UnexpectedEof => Error::Corrupt(format!("{what}: truncated ({err})")),
            io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput => {
                Error::Corrupt(format!("{what}: {err}"))
            }
            _ => Error::io(format!("reading {what}"), err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_kinds_are_exactly_source_unavailable_and_io() {
        let all = [
            ErrorKind::InvalidInput,
            ErrorKind::Unsupported,
            ErrorKind::CorruptImage,
            ErrorKind::TooSmall,
            ErrorKind::ChecksumMismatch,
            ErrorKind::SourceRejected,
            ErrorKind::SourceUnavailable,
            ErrorKind::Io,
        ];
        let retryable: Vec<_> = all.into_iter().filter(|k| k.is_retryable()).collect();
        assert_eq!(retryable, [ErrorKind::SourceUnavailable, ErrorKind::Io]);
        for k in all {
            let code = k.exit_code();
            assert_eq!(k.is_retryable(), (20..30).contains(&code), "{k:?}");
            assert_eq!(ErrorKind::from_exit_code(code), Some(k));
        }
        for code in [0, 1, 2, 16, 22, 137] {
            assert_eq!(ErrorKind::from_exit_code(code), None, "{code}");
        }
    }

    #[test]
    fn from_read_keeps_the_kind_of_an_error_carried_through_io() {
        let carried = Error::ChecksumMismatch {
            algorithm: "sha256",
            expected: "aa".into(),
            actual: "bb".into(),
        }
        .into_io();
        assert_eq!(
            Error::from_read(carried, "x").kind(),
            ErrorKind::ChecksumMismatch
        );
    }

    #[test]
    fn from_read_calls_early_eof_a_truncated_image() {
        let e = Error::from_read(io::Error::from(io::ErrorKind::UnexpectedEof), "qcow2 image");
        assert_eq!(e.kind(), ErrorKind::CorruptImage);
        assert!(e.to_string().contains("truncated"), "{e}");
    }

    #[test]
    fn an_io_error_names_its_cause_once_in_the_chain() {
        let e = Error::io(
            "writing .disk.img.quarry-partial",
            io::Error::from_raw_os_error(28),
        );
        let text = chain(&e);
        assert_eq!(text.matches("No space left on device").count(), 1, "{text}");
        assert!(
            text.starts_with("writing .disk.img.quarry-partial: "),
            "{text}"
        );
    }

    #[test]
    fn chain_skips_a_cause_the_message_already_holds() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Repeats(#[source] io::Error);
        let e = Repeats(io::Error::other("inner"));
        assert_eq!(chain(&e), "outer: inner");
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Chained(#[source] io::Error);
        assert_eq!(chain(&Chained(io::Error::other("inner"))), "outer: inner");
    }

    #[test]
    fn permission_and_read_only_errors_are_not_retryable() {
        for errno in [libc::EACCES, libc::EPERM, libc::EROFS] {
            let e = Error::io("creating disk.img", io::Error::from_raw_os_error(errno));
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        }
        for errno in [libc::EIO, libc::ENOSPC, libc::EAGAIN] {
            let e = Error::io("writing disk.img", io::Error::from_raw_os_error(errno));
            assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        }
    }

    #[test]
    fn too_small_names_both_sizes() {
        let e = Error::TooSmall {
            needed: 2048,
            available: 1024,
            detail: String::new(),
        };
        let msg = e.to_string();
        assert!(msg.contains("2048") && msg.contains("1024"), "{msg}");
    }
}
