//! The uploader's error type. [`Error::kind`] says whether trying again may help.

use std::io;

/// What went wrong, coarsely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bad option, file or key.
    InvalidInput,
    /// A token that is not a JWT at all (HTTP 400 at the proxy).
    MalformedToken,
    /// A token whose signature, times or claims are wrong (HTTP 401 at the proxy).
    Unauthorized,
    /// The upload server or proxy answered with a refusal that retrying will not change.
    Refused,
    /// The upload server or proxy could not be reached or dropped the connection.
    Unavailable,
    /// Local I/O failed.
    Io,
    /// The import behind an upload failed.
    Import(importer::ErrorKind),
}

impl ErrorKind {
    pub fn is_retryable(self) -> bool {
        match self {
            ErrorKind::Unavailable | ErrorKind::Io => true,
            ErrorKind::Import(kind) => kind.is_retryable(),
            _ => false,
        }
    }

    /// Short stable name, for JSON output and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid-input",
            ErrorKind::MalformedToken => "malformed-token",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::Refused => "refused",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Io => "io",
            ErrorKind::Import(kind) => kind.as_str(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The upload proxy answered 401.
    #[error("token rejected: {0}")]
    Unauthorized(String),
    /// Signing, reading or checking a token (its kind kept: the proxy answers each differently).
    #[error(transparent)]
    Token(#[from] token::Error),
    #[error("upload refused with HTTP {status}: {message}")]
    Refused { status: u16, message: String },
    #[error("upload endpoint unavailable: {0}")]
    Unavailable(String),
    /// The OS error is part of the message (no `source()`), as in the importer's.
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
    #[error(transparent)]
    Import(#[from] importer::Error),
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

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidInput(_) => ErrorKind::InvalidInput,
            Error::Unauthorized(_) => ErrorKind::Unauthorized,
            Error::Token(e) => match e.kind() {
                token::ErrorKind::InvalidInput => ErrorKind::InvalidInput,
                token::ErrorKind::MalformedToken => ErrorKind::MalformedToken,
                token::ErrorKind::Unauthorized => ErrorKind::Unauthorized,
                token::ErrorKind::Io => ErrorKind::Io,
            },
            Error::Refused { .. } => ErrorKind::Refused,
            Error::Unavailable(_) => ErrorKind::Unavailable,
            Error::Io { .. } => ErrorKind::Io,
            Error::Import(e) => ErrorKind::Import(e.kind()),
        }
    }

    pub fn io(context: impl Into<String>, cause: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            cause,
        }
    }
}

/// Reads a small local file (a key, a certificate, a token) with an error naming it.
pub fn read_file(path: &std::path::Path, what: &str) -> Result<Vec<u8>> {
    Ok(netkit::error::read_file(path, what)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transport_and_local_io_are_retryable() {
        assert!(Error::Unavailable("x".into()).kind().is_retryable());
        assert!(!Error::Unauthorized("x".into()).kind().is_retryable());
        let refused = Error::Refused {
            status: 409,
            message: "done".into(),
        };
        assert!(!refused.kind().is_retryable());
        let corrupt = Error::Import(importer::Error::Corrupt("bad".into()));
        assert_eq!(
            corrupt.kind(),
            ErrorKind::Import(importer::ErrorKind::CorruptImage)
        );
        assert!(!corrupt.kind().is_retryable());
    }
}
