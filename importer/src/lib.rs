//! Quarry's streaming import engine.
//!
//! ```text
//! ByteSource ──> Decoder* ──> FormatReader ──> extents ──> VolumeSink
//!  (file, stdin,   (gzip, xz,    (raw, qcow2)    (data | zero,   (disk.img file,
//!   http(s), s3,    zstd)                         guest offset)   block device)
//!   registry)
//! ```
//!
//! Each arrow is a bounded channel between threads, so memory stays flat whatever the image size,
//! and the whole import is one pass over the source with no scratch copy.

pub mod archive;
pub mod error;
pub mod format;
pub mod sink;
pub mod source;

pub use error::{Error, ErrorKind, Result};
pub mod checksum;
pub mod chunks;
pub mod cli;
pub mod decode;
#[cfg(feature = "cli")]
pub mod import;
pub mod ova;
pub mod peek;
pub mod pipe;
pub mod progress;
pub mod resize;
pub mod size;
pub(crate) mod tarwalk;
