//! Byte sources: where an image's bytes come from (a local file, stdin, HTTP(S)).
//!
//! A source is a blocking [`Read`] of the image exactly as stored at the source (still compressed),
//! plus what is known about it up front. Errors that cross the `Read` boundary carry a
//! [`crate::Error`] inside the `io::Error` (see [`crate::Error::into_io`]) so their kind survives.

pub mod http;

use std::io::Read;

/// What is known about a source before reading it.
#[derive(Debug, Clone, Default)]
pub struct SourceInfo {
    /// Human-readable name for messages (path or URL without credentials).
    pub name: String,
    /// Total length in bytes, when known.
    pub length: Option<u64>,
}

/// An open source of image bytes.
pub trait ByteSource: Read + Send {
    fn info(&self) -> &SourceInfo;
}
