//! Format readers: turn a decoded image stream into guest extents.
//!
//! [`detect`] names the format from the first bytes; each reader parses its header when it is built
//! (so the virtual size is known before anything is written) and then streams the image into an
//! [`ExtentSink`](crate::sink::ExtentSink).

use std::path::PathBuf;

use crate::error::Result;
use crate::sink::ExtentSink;

/// The container format of a (decoded) disk image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    Raw,
    Qcow2,
    Vmdk,
    Vhdx,
    Vpc,
    Vdi,
}

impl ImageFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Raw => "raw",
            ImageFormat::Qcow2 => "qcow2",
            ImageFormat::Vmdk => "vmdk",
            ImageFormat::Vhdx => "vhdx",
            ImageFormat::Vpc => "vpc",
            ImageFormat::Vdi => "vdi",
        }
    }
}

/// Tuning shared by all readers.
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    /// Where a streaming reader may spill data that arrives before its place is known
    /// (beside the target, so it never needs space elsewhere).
    pub spill_dir: PathBuf,
    /// How many bytes of such data a reader may hold in memory before spilling.
    pub memory_budget: usize,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            spill_dir: std::env::temp_dir(),
            memory_budget: 32 << 20,
        }
    }
}

/// A parsed image, ready to stream its guest disk into a sink.
pub trait FormatReader: Send {
    fn format(&self) -> ImageFormat;
    /// The guest disk size, when the format states it up front (None for a raw stream of unknown length).
    fn virtual_size(&self) -> Option<u64>;
    /// Streams the whole guest disk into `sink`; returns the virtual size.
    fn copy_to(self: Box<Self>, sink: &mut dyn ExtentSink) -> Result<u64>;
}
pub mod qcow2;
