//! Format readers: turn a decoded image stream into guest extents.
//!
//! [`detect`] names the format from the first bytes; each reader parses its header when it is built
//! (so the virtual size is known before anything is written) and then streams the image into an
//! [`ExtentSink`](crate::sink::ExtentSink).

use std::path::PathBuf;

pub mod qcow2;
pub mod raw;

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
    /// How far a streaming reader reads ahead: a raw copy's read size, the qcow2 read window past
    /// its position. Each write is at most this large.
    pub read_ahead: usize,
}

/// The default [`ReaderOptions::read_ahead`]: large, so each write is large.
pub const READ_AHEAD: usize = 2 << 20;

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            spill_dir: std::env::temp_dir(),
            memory_budget: 32 << 20,
            read_ahead: READ_AHEAD,
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

/// Names the image format from the first bytes of the decoded stream. Anything unrecognised
/// (including ISO 9660 images) is raw, as for qemu-img.
pub fn detect(head: &[u8]) -> ImageFormat {
    if head.starts_with(b"QFI\xfb") {
        ImageFormat::Qcow2
    } else if head.starts_with(b"KDMV") || head.starts_with(b"# Disk DescriptorFile") {
        ImageFormat::Vmdk
    } else if head.starts_with(b"vhdxfile") {
        ImageFormat::Vhdx
    } else if head.starts_with(b"conectix") {
        ImageFormat::Vpc
    } else if head.len() >= 0x44 && head[0x40..0x44] == [0x7f, 0x10, 0xda, 0xbe] {
        ImageFormat::Vdi
    } else {
        ImageFormat::Raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qcow2_magic() {
        assert_eq!(detect(b"QFI\xfb\0\0\0\x03"), ImageFormat::Qcow2);
    }

    #[test]
    fn other_formats_are_named() {
        assert_eq!(detect(b"KDMV\x01\0\0\0"), ImageFormat::Vmdk);
        assert_eq!(detect(b"vhdxfile"), ImageFormat::Vhdx);
        assert_eq!(detect(b"conectix\0\0"), ImageFormat::Vpc);
        let mut vdi = vec![0u8; 0x50];
        vdi[0x40..0x44].copy_from_slice(&0xbeda107fu32.to_le_bytes());
        assert_eq!(detect(&vdi), ImageFormat::Vdi);
    }

    #[test]
    fn unknown_and_short_heads_are_raw() {
        assert_eq!(detect(b""), ImageFormat::Raw);
        assert_eq!(detect(b"QFI"), ImageFormat::Raw);
        assert_eq!(detect(&[0u8; 512]), ImageFormat::Raw);
        let mut iso = vec![0u8; 512];
        iso[1..6].copy_from_slice(b"CD001");
        assert_eq!(detect(&iso), ImageFormat::Raw);
    }
}
