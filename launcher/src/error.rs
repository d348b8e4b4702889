//! The launcher's one error type.
//!
//! Every failure to start or drive a VM is an [`Error`]; its [`ErrorKind`] says whether starting
//! the same spec again may help (qemu or its socket misbehaved) or not (the spec is wrong, the host
//! cannot run it).

use std::io;

/// What went wrong, coarsely: enough to decide retry versus fail and to pick an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The spec or a request is wrong (bad field, missing disk, unknown disk name).
    InvalidInput,
    /// The host cannot run the VM as asked (no usable KVM and emulation not allowed).
    Unsupported,
    /// qemu or its QMP socket failed or answered with an error.
    Qemu,
    /// Local I/O failed (run directory, sockets, status file).
    Io,
}

impl ErrorKind {
    /// True when starting the same VM again may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorKind::Qemu | ErrorKind::Io)
    }

    /// Short stable name, used in JSON output and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid-input",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Qemu => "qemu",
            ErrorKind::Io => "io",
        }
    }
}

/// A launcher failure, with a message that names the problem.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid VM spec: {0}")]
    InvalidSpec(String),
    #[error("cannot run this VM here: {0}")]
    Unsupported(String),
    #[error("QMP command {command} failed: {class}: {desc}")]
    QmpCommand {
        command: String,
        class: String,
        desc: String,
    },
    #[error("QMP protocol error: {0}")]
    QmpProtocol(String),
    #[error("qemu: {0}")]
    Qemu(String),
    #[error("the launcher refused the request: {0}")]
    Refused(String),
    /// The OS error is part of the message (no `source()`), as in the other crates.
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
}

impl Error {
    /// The coarse kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidSpec(_) | Error::Refused(_) => ErrorKind::InvalidInput,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::QmpCommand { .. } | Error::QmpProtocol(_) | Error::Qemu(_) => ErrorKind::Qemu,
            Error::Io { .. } => ErrorKind::Io,
        }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            cause: source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
