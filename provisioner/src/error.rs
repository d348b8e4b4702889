//! The provisioner's error type. Every variant has a deliberate [`ErrorKind`], which the CSI layer
//! maps to a gRPC status code in one place.

use std::path::PathBuf;

/// What kind of failure an [`Error`] is; the CSI layer maps each kind to one gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or asks for something this driver never supports.
    InvalidArgument,
    /// The volume, snapshot or pool does not exist.
    NotFound,
    /// An object with this name exists with incompatible parameters.
    AlreadyExists,
    /// Another operation on the same object is in progress; retry later.
    Aborted,
    /// The requested size is outside what the driver can provide.
    OutOfRange,
    /// Not enough space (or volumes) left to satisfy the request.
    ResourceExhausted,
    /// The object is in a state that does not allow the operation.
    FailedPrecondition,
    /// Unexpected I/O or system failure.
    Internal,
    /// Not possible yet (a pool waiting for its mount); retry later.
    Unavailable,
}

/// A provisioner error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No volume with this id.
    #[error("volume {0} not found")]
    VolumeNotFound(String),
    /// No snapshot with this id.
    #[error("snapshot {0} not found")]
    SnapshotNotFound(String),
    /// No pool with this name.
    #[error("storage pool {0:?} is not configured on this node")]
    PoolNotFound(String),
    /// A pool on a mounted volume (an HPP `pvcTemplate` pool) whose mount is not there yet.
    #[error("storage pool {0:?} is not mounted on this node yet")]
    PoolNotMounted(String),
    /// A volume or snapshot with this name exists with other parameters.
    #[error("{0}")]
    AlreadyExists(String),
    /// Another operation holds the guard of this object.
    #[error("an operation on {0} is already in progress")]
    Busy(String),
    /// A list token this driver did not issue (CSI wants ABORTED).
    #[error("invalid starting token {0:?}")]
    InvalidToken(String),
    /// Requested size not satisfiable by definition.
    #[error("{0}")]
    OutOfRange(String),
    /// Not enough free space in the pool.
    #[error("{0}")]
    NoSpace(String),
    /// Operation not allowed in the object's current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Invalid pool configuration.
    #[error("pool configuration: {0}")]
    Config(String),
    /// A system call or file operation failed. The OS error is part of the message (no
    /// `source()`): gRPC statuses carry the message alone, and chain printers do not repeat it.
    #[error("{context}: {cause}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        cause: std::io::Error,
    },
    /// A metadata file could not be parsed.
    #[error("corrupt metadata {path}: {source}")]
    Metadata {
        /// The metadata file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// The kind of this error, for mapping to a protocol status.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument(_) | Error::Config(_) => ErrorKind::InvalidArgument,
            Error::VolumeNotFound(_) | Error::SnapshotNotFound(_) | Error::PoolNotFound(_) => {
                ErrorKind::NotFound
            }
            Error::AlreadyExists(_) => ErrorKind::AlreadyExists,
            Error::Busy(_) | Error::InvalidToken(_) => ErrorKind::Aborted,
            Error::OutOfRange(_) => ErrorKind::OutOfRange,
            Error::NoSpace(_) => ErrorKind::ResourceExhausted,
            Error::FailedPrecondition(_) => ErrorKind::FailedPrecondition,
            Error::PoolNotMounted(_) => ErrorKind::Unavailable,
            Error::Io { cause, .. } if cause.raw_os_error() == Some(libc::ENOSPC) => {
                ErrorKind::ResourceExhausted
            }
            Error::Io { .. } | Error::Metadata { .. } => ErrorKind::Internal,
        }
    }

    /// Wraps an I/O error with context.
    pub fn io(context: impl Into<String>, cause: impl Into<std::io::Error>) -> Self {
        Error::Io {
            context: context.into(),
            cause: cause.into(),
        }
    }
}

/// Adds context to I/O results.
pub(crate) trait IoContext<T> {
    fn ctx(self, f: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<std::io::Error>> IoContext<T> for std::result::Result<T, E> {
    fn ctx(self, f: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::io(f(), e))
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
