//! Quarry's streaming import engine: qcow2, raw, vmdk, vhd, vhdx and vdi images, and the disk of
//! an OVA, plain or gzip/xz/zstd compressed, into a raw disk.
//!
//! ```text
//! ByteSource ──> Decoder* ──> FormatReader ──> extents ──> VolumeSink
//!  (file, stdin,   (gzip, xz,    (qcow2, raw,    (data | zero,   (disk.img file,
//!   http(s), s3,    zstd; an      vmdk, vhd,      guest offset)   block device)
//!   registry,       OVA's tar)    vhdx, vdi)
//!   upload)
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
#[cfg(any(test, feature = "cli"))]
pub mod cli;
pub mod decode;
pub mod import;
pub mod ova;
pub mod peek;
pub mod pipe;
pub mod progress;
pub mod resize;
pub mod size;
pub(crate) mod tarwalk;
