//! Format readers: turn a decoded image stream into guest extents.
//!
//! [`detect`](mod@detect) says what a stream holds from its first bytes (a compression layer, an
//! OVA, an image format); [`open()`] is the one factory that names the image's format and opens
//! its reader. Each reader parses its header when it is built (so the virtual size is known before
//! anything is written) and then streams the image into a [`crate::sink::ExtentSink`].

use std::path::PathBuf;

pub mod blocks;
/// Benchmark instrumentation (feature `bench`): not part of the import pipeline.
#[cfg(any(test, feature = "bench"))]
pub mod cost;
pub mod detect;
pub(crate) mod fields;
pub(crate) mod hold;
pub mod inflate_pool;
pub mod open;
pub mod qcow2;
pub mod raw;
pub mod vdi;
pub mod vhdx;
pub mod vmdk;
pub mod vpc;

use crate::error::Result;
pub use crate::error::{FormatError, FormatFault};
use crate::sink::ExtentSink;
pub use detect::{Content, detect, detect_named, probe};
pub use open::{Input, open};

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
    /// qemu's formats that Quarry recognises only to refuse them by name: writing their bytes out
    /// as raw would give a wrong disk that looks right.
    Qed,
    Parallels,
    Luks,
    Cloop,
    Dmg,
    Bochs,
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
            ImageFormat::Qed => "qed",
            ImageFormat::Parallels => "parallels",
            ImageFormat::Luks => "luks",
            ImageFormat::Cloop => "cloop",
            ImageFormat::Dmg => "dmg",
            ImageFormat::Bochs => "bochs",
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

/// Most that readers copying a stream straight to the sink (raw, vhdx payload) read at once:
/// small enough that the bytes are still in the CPU cache when the sink scans them for zeroes
/// and copies them out; the file sink gathers consecutive writes into large ones anyway.
pub const COPY_READ: usize = 256 << 10;

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

#[cfg(test)]
mod fault_tests {
    use crate::error::{Error, ErrorKind};
    use crate::format::vpc::VpcError;

    #[test]
    fn a_fault_keeps_its_type_offset_and_kind() {
        let e = Error::from(VpcError::NoDynamicHeader { offset: 0x200 });
        assert_eq!(e.kind(), ErrorKind::CorruptImage);
        assert_eq!(
            e.to_string(),
            "corrupt image: vhd: dynamic disk header at 0x200: no \"cxsparse\" magic"
        );
        let Error::Format(f) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(f.offset(), Some(0x200));
        assert_eq!(
            f.fault::<VpcError>(),
            Some(&VpcError::NoDynamicHeader { offset: 0x200 })
        );
        assert!(std::error::Error::source(&e).is_none());
        let refused = Error::from(VpcError::Differencing { offset: 0 });
        assert_eq!(refused.kind(), ErrorKind::Unsupported);
        assert!(refused.to_string().starts_with("unsupported image: vhd: "));
    }
}
