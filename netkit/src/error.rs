//! The kit's error type: a bad option or file, or a failed local operation.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad option, certificate, key or address.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The OS error is part of the message (no `source()`), as in the other crates' errors.
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(context: impl Into<String>, cause: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            cause,
        }
    }
}

/// Reads a small local file (a key, a certificate) with an error naming it.
pub fn read_file(path: &std::path::Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(format!("reading {what} {}", path.display()), e))
}

/// An error and its sources, `a: b: c`, each cause once: a cause whose text the message already
/// holds (libraries that print their source in their own message too) is not repeated.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}
