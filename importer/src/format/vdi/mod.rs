//! vdi reader (VirtualBox disks), from a stream in one pass or from a local file by random access.
//!
//! - [`header`]: pure parsing of the header and the block map with qemu's checks;
//! - [`error`]: what they find wrong, mapped into the crate error.
//!
//! Read: dynamic and static images (header version 1.1, 1 MiB blocks); never-allocated and
//! discarded blocks are holes. Refused (exit 11): other versions, sector or block sizes, and
//! snapshot or differencing images (a link or parent UUID). Converted by
//! [`crate::format::blocks`].

use std::fs::File;
use std::io::Read;

use crate::error::Result;
use crate::format::blocks::{self, BlockSource, Mapped, Table, read_vec};
use crate::format::{FormatReader, ImageFormat, ReaderOptions};
use crate::sink::ExtentSink;

pub mod error;
pub mod header;

#[cfg(test)]
mod tests;

pub use error::VdiError;
use header::HEADER_LEN;

/// The format's name in messages.
const FORMAT: &str = "vdi";

/// A vdi image whose header and block map have been read and validated, ready to convert.
pub struct VdiReader {
    mapped: Mapped,
}

impl VdiReader {
    /// Reads the header and the block map from the start of a stream (bytes that pass before the
    /// block map are held, in case blocks lie there).
    pub fn new(mut reader: Box<dyn Read + Send>, opts: &ReaderOptions) -> Result<Self> {
        let head = blocks::read_head(&mut reader, HEADER_LEN, FORMAT)?;
        let h = header::parse(&head)?;
        // The blocks that can lie before the block map take at most the disk's size.
        let hold_limit = h.virtual_size.saturating_add(4 << 20);
        let mapped = Mapped::from_stream(&head, reader, FORMAT, opts, hold_limit, |source| {
            read_table(source, &h)
        })?;
        Ok(VdiReader { mapped })
    }

    /// Reads the header and the block map of the vdi in the local `file` (`length` bytes).
    pub fn open(file: File, length: u64) -> Result<Self> {
        let h = header::parse(&blocks::file_head(&file, length, HEADER_LEN, FORMAT)?)?;
        let mapped = Mapped::from_file(file, length, FORMAT, |source| read_table(source, &h))?;
        Ok(VdiReader { mapped })
    }
}

/// The block map's needed entries, as a block table.
fn read_table(source: &mut dyn BlockSource, h: &header::Header) -> Result<Table> {
    let len = (h.needed_entries() * 4) as usize;
    let map = read_vec(source, h.offset_bmap, len, "the block map")?;
    Ok((h.layout(), h.hosts(&map)))
}

impl FormatReader for VdiReader {
    fn format(&self) -> ImageFormat {
        ImageFormat::Vdi
    }

    fn virtual_size(&self) -> Option<u64> {
        Some(self.mapped.virtual_size())
    }

    fn copy_to(self: Box<Self>, sink: &mut dyn ExtentSink) -> Result<u64> {
        self.mapped.convert(sink)
    }
}
