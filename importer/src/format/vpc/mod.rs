//! vhd reader (qemu's `vpc`: Virtual PC, Hyper-V and Azure disks), from a stream in one pass or
//! from a local file by random access.
//!
//! - [`header`]: pure parsing of the footer, the dynamic disk header and the BAT, and qemu's
//!   disk-size rules;
//! - [`error`]: what they find wrong, mapped into the crate error.
//!
//! Subformats:
//! - **dynamic** (disk type 3): a footer copy at offset 0, the dynamic disk header, the BAT, then
//!   blocks (a sector bitmap, then the data) in any order; unallocated blocks (`0xFFFFFFFF`) are
//!   holes. As in qemu, the sector bitmaps are not consulted: an allocated block is read whole.
//!   Converted by [`crate::format::blocks`].
//! - **fixed** (disk type 2): the data, then the footer. qemu probes `conectix` at offset 0 only,
//!   so a fixed disk is raw unless the format is given (`--format vpc`); then the footer at the
//!   end decides the size. A stream holds back its last bytes until the footer is known.
//!
//! Refused: differencing disks (type 4, exit 11). A wrong footer checksum is corrupt, as in qemu;
//! the dynamic header's checksum is ignored, as in qemu.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

use crate::error::{Error, Result};
use crate::format::blocks::{self, BlockSource, Mapped, Table, read_vec};
use crate::format::raw::SparseFileReader;
use crate::format::{FormatReader, ImageFormat, ReaderOptions};
use crate::sink::ExtentSink;

pub mod error;
pub mod header;

#[cfg(test)]
mod tests;

pub use error::VpcError;
use header::{DYN_HEADER_LEN, DiskType, FOOTER_LEN};

/// The format's name in messages.
const FORMAT: &str = "vhd";

/// How many bytes a fixed disk's stream holds back: its footer, and the most CHS sizing can cut
/// off the data (up to 16 heads x 255 sectors, short of one cylinder).
const FIXED_TAIL: usize = 16 * 255 * 512 + FOOTER_LEN;

/// BAT entries past the disk's end read at once.
const BAT_PIECE: u64 = 16 << 10;

/// A vhd image whose metadata has been read and validated, ready to convert.
pub struct VpcReader {
    input: Input,
}

enum Input {
    /// A fixed disk in a local file: a raw file of `size` bytes before the footer.
    FixedFile {
        file: File,
        size: u64,
    },
    /// A fixed disk in a stream, of which `head` has been read: its size comes at the end.
    FixedStream {
        head: Vec<u8>,
        reader: Box<dyn Read + Send>,
        chunk: usize,
    },
    Dynamic(Mapped),
}

/// The dynamic disk header and the BAT's needed entries, as a block table, once the footer at
/// offset 0 (`head`) is parsed.
fn read_table(source: &mut dyn BlockSource, head: &[u8]) -> Result<Table> {
    let footer = header::parse_footer(head, 0)?;
    let bytes = read_vec(
        source,
        footer.data_offset,
        DYN_HEADER_LEN,
        "the dynamic disk header",
    )?;
    let dynamic = header::parse_dynamic(&bytes, &footer)?;
    let needed = dynamic.needed_entries();
    let bat = read_vec(
        source,
        dynamic.table_offset,
        (needed * 4) as usize,
        "the BAT",
    )?;
    // qemu reads the whole BAT, entries past the disk's end too, and refuses an image that ends
    // before the end of the BAT or of any block it places: so are those entries read (a piece at
    // a time, never kept).
    let mut min_len = dynamic.table_end().max(dynamic.blocks_end(&bat));
    let mut at = needed;
    while at < dynamic.table_entries {
        let n = (dynamic.table_entries - at).min(BAT_PIECE);
        let offset = dynamic.table_offset.saturating_add(at * 4);
        let rest = read_vec(source, offset, (n * 4) as usize, "the BAT")?;
        min_len = min_len.max(dynamic.blocks_end(&rest));
        at += n;
    }
    Ok((dynamic.layout(min_len), header::bat_hosts(&bat)))
}

impl VpcReader {
    /// Reads the metadata from the start of a stream: a dynamic disk's footer copy, header and
    /// BAT; or, when the stream does not start with a footer (`--format vpc` on a fixed disk),
    /// nothing more: the footer comes at the end.
    pub fn new(mut reader: Box<dyn Read + Send>, opts: &ReaderOptions) -> Result<Self> {
        let head = blocks::read_head(&mut reader, FOOTER_LEN, FORMAT)?;
        if head.len() < FOOTER_LEN || !header::is_footer(&head) {
            return Ok(VpcReader {
                input: Input::FixedStream {
                    head,
                    reader,
                    chunk: opts.read_ahead,
                },
            });
        }
        // The blocks that can lie before the BAT take at most twice the disk's size (a 512-byte
        // block has a 512-byte bitmap).
        let size = header::parse_footer(&head, 0)?.virtual_size;
        let hold_limit = size.saturating_mul(2).saturating_add(4 << 20);
        let mapped = Mapped::from_stream(&head, reader, FORMAT, opts, hold_limit, |source| {
            read_table(source, &head)
        })?;
        Ok(VpcReader {
            input: Input::Dynamic(mapped),
        })
    }

    /// Reads the metadata of the vhd in the local `file` (`length` bytes): the footer at offset 0
    /// (dynamic disks) or in the last sector (fixed disks).
    pub fn open(file: File, length: u64) -> Result<Self> {
        let head = blocks::file_head(&file, length, FOOTER_LEN, FORMAT)?;
        if head.len() == FOOTER_LEN && header::is_footer(&head) {
            let mapped =
                Mapped::from_file(file, length, FORMAT, |source| read_table(source, &head))?;
            return Ok(VpcReader {
                input: Input::Dynamic(mapped),
            });
        }
        let Some(data) = length.checked_sub(FOOTER_LEN as u64) else {
            return Err(VpcError::NoFooter { len: length }.into());
        };
        let mut tail = vec![0u8; FOOTER_LEN];
        file.read_exact_at(&mut tail, data)
            .map_err(|e| Error::from_read(e, FORMAT))?;
        let size = fixed_size(&tail, data, 0)?;
        Ok(VpcReader {
            input: Input::FixedFile { file, size },
        })
    }
}

/// The size of a fixed disk whose last sector is `tail` and whose data is `data` bytes (the
/// footer being at `data`), of which `written` have been reported already.
fn fixed_size(tail: &[u8], data: u64, written: u64) -> Result<u64> {
    if !header::is_footer(tail) {
        return Err(VpcError::NoFooter {
            len: data + tail.len() as u64,
        }
        .into());
    }
    let footer = header::parse_footer(tail, data)?;
    debug_assert_eq!(footer.disk_type, DiskType::Fixed);
    let size = footer.virtual_size;
    if size > data || size < written {
        return Err(VpcError::FixedSize { size, data }.into());
    }
    Ok(size)
}

/// Streams a fixed disk: the data is written as it passes, except the last [`FIXED_TAIL`] bytes,
/// held until the stream ends and the footer among them tells the size.
fn copy_fixed_stream(
    mut window: Vec<u8>,
    mut reader: Box<dyn Read + Send>,
    chunk: usize,
    sink: &mut dyn ExtentSink,
) -> Result<u64> {
    let want = FIXED_TAIL + chunk.max(64 << 10);
    let mut written = 0u64;
    loop {
        let missing = want.saturating_sub(window.len());
        let n = (&mut reader)
            .take(missing as u64)
            .read_to_end(&mut window)
            .map_err(|e| Error::from_read(e, FORMAT))?;
        if n < missing {
            break;
        }
        let out = window.len() - FIXED_TAIL;
        sink.write_data(written, &window[..out])?;
        written += out as u64;
        window.drain(..out);
    }
    if window.len() < FOOTER_LEN {
        return Err(VpcError::NoFooter {
            len: written + window.len() as u64,
        }
        .into());
    }
    let at = window.len() - FOOTER_LEN;
    let size = fixed_size(&window[at..], written + at as u64, written)?;
    let rest = (size - written) as usize;
    if rest > 0 {
        sink.write_data(written, &window[..rest])?;
    }
    Ok(size)
}

impl FormatReader for VpcReader {
    fn format(&self) -> ImageFormat {
        ImageFormat::Vpc
    }

    fn virtual_size(&self) -> Option<u64> {
        match &self.input {
            Input::FixedFile { size, .. } => Some(*size),
            Input::FixedStream { .. } => None,
            Input::Dynamic(mapped) => Some(mapped.virtual_size()),
        }
    }

    fn copy_to(self: Box<Self>, sink: &mut dyn ExtentSink) -> Result<u64> {
        match self.input {
            Input::FixedFile { file, size } => {
                Box::new(SparseFileReader::new(file, size)).copy_to(sink)
            }
            Input::FixedStream {
                head,
                reader,
                chunk,
            } => copy_fixed_stream(head, reader, chunk, sink),
            Input::Dynamic(mapped) => mapped.convert(sink),
        }
    }
}
