//! vhdx reader (Hyper-V): converts a VHDX image to the guest disk in one sequential pass, or,
//! for a local file, by random access.
//!
//! - [`header`]: the file identifier, the two headers and the two region tables (CRC-32C);
//! - [`metadata`]: the metadata table and items (block size, virtual size, sector sizes);
//! - [`bat`]: the geometry and the block allocation table's entries;
//! - [`error`]: what the pure parsers find wrong, mapped into [`crate::Error`];
//! - `crc`: CRC-32C;
//! - `stream`: the single-pass converter (see its docs for the algorithm and memory bounds);
//! - `seek`: the random-access converter for local files (the BAT first, then the data).
//!
//! Read: dynamic and fixed images, block sizes 1-256 MiB, 512 and 4096-byte logical sectors,
//! any layout of the regions (a BAT after its data in a stream is held for, as qcow2's late L2
//! tables). Blocks NOT_PRESENT, UNDEFINED, ZERO and UNMAPPED read as zeroes, as in qemu.
//! Refused ([`Error::Unsupported`](crate::Error::Unsupported)): differencing images (HasParent),
//! images whose log may need replaying (a non-zero LogGuid), and unknown required regions or
//! metadata items.

use std::io::Read;

use crate::error::Result;
use crate::format::{FormatReader, ImageFormat, ReaderOptions};
use crate::sink::ExtentSink;

pub mod bat;
mod crc;
pub mod error;
pub mod header;
pub mod metadata;
mod seek;
mod stream;

#[cfg(test)]
mod tests;

pub use crc::{crc32c, structure_checksum};
pub use error::VhdxError;

/// What a conversion did, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VhdxStats {
    /// Bytes of the image read (a stream stops once every guest byte is reported).
    pub bytes_read: u64,
    /// Bytes held because they passed before the BAT entry that maps them.
    pub held_bytes: u64,
    /// Of those, bytes that went to the spill file.
    pub spilled_bytes: u64,
}

/// A VHDX image whose header section and metadata have been read and checked (so its size is
/// known), ready to convert.
pub struct VhdxReader {
    input: Input,
}

enum Input {
    Stream(Box<stream::Stream>),
    File(Box<seek::Opened>),
}

impl VhdxReader {
    /// Reads the stream up to the metadata (the header section, and what lies before the
    /// metadata region is held).
    pub fn new(reader: Box<dyn Read + Send>, opts: &ReaderOptions) -> Result<Self> {
        Ok(VhdxReader {
            input: Input::Stream(Box::new(stream::Stream::open(reader, opts)?)),
        })
    }

    /// Reads the header section and the metadata of the image in the local `file` (`length`
    /// bytes), to convert it by random access.
    pub fn open(file: std::fs::File, length: u64) -> Result<Self> {
        Ok(VhdxReader {
            input: Input::File(Box::new(seek::Opened::open(file, length)?)),
        })
    }

    /// The disk's parameters.
    pub fn metadata(&self) -> metadata::Metadata {
        match &self.input {
            Input::Stream(s) => s.metadata(),
            Input::File(f) => f.metadata,
        }
    }

    fn geometry(&self) -> bat::Geometry {
        match &self.input {
            Input::Stream(s) => s.geometry(),
            Input::File(f) => f.geometry,
        }
    }

    /// Converts the guest disk into `sink` (every byte of `[0, virtual_size)` exactly once).
    pub fn convert(self, sink: &mut dyn ExtentSink) -> Result<VhdxStats> {
        match self.input {
            Input::Stream(s) => s.run(sink),
            Input::File(f) => f.convert(sink),
        }
    }
}

impl FormatReader for VhdxReader {
    fn format(&self) -> ImageFormat {
        ImageFormat::Vhdx
    }

    fn virtual_size(&self) -> Option<u64> {
        Some(self.geometry().disk_size)
    }

    fn copy_to(self: Box<Self>, sink: &mut dyn ExtentSink) -> Result<u64> {
        let size = self.geometry().disk_size;
        let stats = self.convert(sink)?;
        tracing::debug!(?stats, "vhdx converted");
        Ok(size)
    }
}
