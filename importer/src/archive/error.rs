//! Why an archive extraction failed. Each variant maps to one importer [`ErrorKind`] (and so one
//! exit code) when it becomes an [`Error`]: a hostile or unsupported entry is refused (11), a
//! malformed tar is corrupt (12), a tree that does not fit the volume is too small (13), a target
//! that cannot take the tree is invalid input (10), local I/O is retryable (21), and the source's
//! own failures keep their kind.

use std::io;

use crate::error::{Error, ErrorKind};

/// An archive extraction failure. Entry names are shown as the archive spells them.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// An entry Quarry refuses to write: a path or link leaving the volume, a device, a FIFO.
    #[error("archive entry {entry:?} refused: {why}")]
    Refused { entry: String, why: String },
    /// The tar stream contradicts itself (bad header, bad sparse map, truncated data).
    #[error("archive entry {entry:?}: {detail}")]
    Malformed { entry: String, detail: String },
    /// The stream is not a tar archive at all.
    #[error("not a valid tar archive: {0}")]
    NotTar(String),
    /// The extracted files would not fit the volume.
    #[error("the archive needs more than the {available} bytes usable in {target} ({detail})")]
    TooLarge {
        needed: u64,
        available: u64,
        target: String,
        detail: String,
    },
    /// The target directory cannot take the archive (not a directory, not empty).
    #[error("target {target}: {why}")]
    Target { target: String, why: String },
    /// A local file operation failed; the OS error is part of the message (as [`Error::Io`]).
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
    /// Reading the source (or a decoder) failed: the importer's error, with its own kind.
    #[error(transparent)]
    Source(#[from] Error),
}

impl ArchiveError {
    pub fn refused(entry: &str, why: impl Into<String>) -> Self {
        ArchiveError::Refused {
            entry: entry.to_string(),
            why: why.into(),
        }
    }

    pub fn malformed(entry: &str, detail: impl Into<String>) -> Self {
        ArchiveError::Malformed {
            entry: entry.to_string(),
            detail: detail.into(),
        }
    }

    pub fn io(context: impl Into<String>, cause: impl Into<io::Error>) -> Self {
        ArchiveError::Io {
            context: context.into(),
            cause: cause.into(),
        }
    }

    /// An error out of reading the tar stream: the source's and decoders' errors keep their
    /// kind, anything else the tar reader says makes the archive malformed at `entry`.
    pub fn reading(e: io::Error, entry: Option<&str>) -> Self {
        if Error::carried_by(&e) {
            return ArchiveError::Source(Error::from_read(e, "archive"));
        }
        match (entry, e.kind()) {
            (_, io::ErrorKind::UnexpectedEof) | (Some(_), _) => ArchiveError::malformed(
                entry.unwrap_or("(end)"),
                format!("truncated or bad data ({e})"),
            ),
            (None, io::ErrorKind::InvalidData | io::ErrorKind::Other) => {
                ArchiveError::NotTar(e.to_string())
            }
            (None, _) => ArchiveError::Source(Error::from_read(e, "archive")),
        }
    }

    /// The importer's kind of this failure (and so the exit code).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ArchiveError::Refused { .. } => ErrorKind::Unsupported,
            ArchiveError::Malformed { .. } | ArchiveError::NotTar(_) => ErrorKind::CorruptImage,
            ArchiveError::TooLarge { .. } => ErrorKind::TooSmall,
            ArchiveError::Target { .. } => ErrorKind::InvalidInput,
            ArchiveError::Io { context, cause } => {
                let copy = match cause.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::from(cause.kind()),
                };
                Error::io(context.clone(), copy).kind()
            }
            ArchiveError::Source(e) => e.kind(),
        }
    }
}

impl From<ArchiveError> for Error {
    fn from(e: ArchiveError) -> Self {
        let message = e.to_string();
        match e {
            ArchiveError::Refused { .. } => Error::Unsupported(message),
            ArchiveError::Malformed { .. } | ArchiveError::NotTar(_) => Error::Corrupt(message),
            ArchiveError::TooLarge {
                needed,
                available,
                target,
                detail,
            } => Error::TooSmall {
                needed,
                available,
                detail: format!("extracting the archive into {target}: {detail}"),
            },
            ArchiveError::Target { .. } => Error::InvalidInput(message),
            ArchiveError::Io { context, cause } => Error::io(context, cause),
            ArchiveError::Source(e) => e,
        }
    }
}

pub type Result<T, E = ArchiveError> = std::result::Result<T, E>;
