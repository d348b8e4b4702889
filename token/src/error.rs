//! The token crate's errors. [`Error::kind`] tells a caller which answer to give: the upload
//! proxy answers a malformed token 400 and a rejected one 401.

use std::io;

/// What went wrong, coarsely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bad key or key file.
    InvalidInput,
    /// A token that is not a JWT at all.
    MalformedToken,
    /// A token whose signature, times or claims are wrong.
    Unauthorized,
    /// Reading a key file failed.
    Io,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("malformed token: {0}")]
    MalformedToken(String),
    #[error("token rejected: {0}")]
    Unauthorized(String),
    /// The OS error is part of the message (no `source()`), as in the other crates'.
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidInput(_) => ErrorKind::InvalidInput,
            Error::MalformedToken(_) => ErrorKind::MalformedToken,
            Error::Unauthorized(_) => ErrorKind::Unauthorized,
            Error::Io { .. } => ErrorKind::Io,
        }
    }
}

/// Reads a key file with an error naming it.
pub(crate) fn read_file(path: &std::path::Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|cause| Error::Io {
        context: format!("reading {what} {}", path.display()),
        cause,
    })
}
