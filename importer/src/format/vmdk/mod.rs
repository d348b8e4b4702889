//! VMDK reader: converts a VMware disk to the guest disk, from a stream in one forward pass, or
//! from a local descriptor file and the extent files beside it.
//!
//! - [`header`]: pure parse of the sparse extent header, grain table entries and stream markers;
//! - [`descriptor`]: pure parse of the text descriptor (settings and extent lines);
//! - [`error`]: what those parses find wrong or refuse;
//! - `window`: the forward-only read window both converters use;
//! - `tables`: uncompressed sparse extents (grain directory and grain tables);
//! - `markers`: streamOptimized extents (compressed grains behind markers that name their place).
//!
//! Read: monolithicSparse and streamOptimized (`KDMV` files) from any source and under any
//! compression; monolithicFlat, vmfs, twoGbMaxExtentFlat and twoGbMaxExtentSparse as a local
//! descriptor file with its extent files in the same directory (a flat extent from any sector
//! offset into its file). Refused ([`Error::Unsupported`]): a descriptor that reaches the reader
//! as a stream (from the network or stdin, compressed, with a checksum to compute, in an OVA:
//! [`StreamedBecause`] says which), disks with a parent (snapshots and deltas: `parentCID`, `parentFileNameHint`,
//! seSparse, vmfsSparse), ESX 3 sparse extents (`COWD`), changeTracking files (`-ctk.vmdk`), and
//! anything else that is not a disk.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::raw::SparseFileReader;
use crate::format::{FormatReader, ImageFormat, READ_AHEAD, ReaderOptions};
use crate::sink::ExtentSink;

pub mod descriptor;
pub mod error;
pub mod header;
mod markers;
mod tables;
mod trailer;
mod window;

#[cfg(test)]
mod tests;

pub use descriptor::{Descriptor, Extent, ExtentKind};
pub use error::{StreamedBecause, VmdkError};
pub use header::{Layout, SparseHeader};
use window::Window;

/// A VMDK image whose header (or descriptor) has been read and checked, ready to convert.
pub struct VmdkReader {
    virtual_size: u64,
    extents: Vec<Part>,
    read_size: usize,
}

/// One extent of the disk, in guest order.
enum Part {
    /// A sparse extent (`KDMV`), read forward from its first byte.
    Sparse { header: SparseHeader, win: Window },
    /// A flat extent: `len` bytes of a local file, from `start` on.
    Flat { file: File, start: u64, len: u64 },
}

impl Part {
    fn len(&self) -> u64 {
        match self {
            Part::Sparse { header, .. } => header.virtual_size(),
            Part::Flat { len, .. } => *len,
        }
    }
}

/// Appends to `buf` until it holds `want` bytes or the stream ends.
fn read_up_to(reader: &mut (dyn Read + Send), buf: &mut Vec<u8>, want: usize) -> Result<()> {
    let more = want.saturating_sub(buf.len()) as u64;
    reader
        .take(more)
        .read_to_end(buf)
        .map_err(|e| Error::from_read(e, "vmdk image"))?;
    Ok(())
}

/// Why a stream that starts like no VMDK disk is refused.
fn not_a_disk(head: &[u8]) -> Error {
    if head.starts_with(&header::COWD_MAGIC) {
        return Error::Unsupported(
            "vmdk: ESX 3 sparse extents (COWD, vmfsSparse) are not supported; convert with \
             `qemu-img convert -O qcow2` first"
                .into(),
        );
    }
    Error::Unsupported(
        "vmdk: the file is neither a sparse extent (KDMV) nor a descriptor, so it holds no disk \
         (a changeTracking file, -ctk.vmdk, is one of these); import the disk's descriptor or \
         its extent instead"
            .into(),
    )
}

/// Reads the sparse extent header at the start of `reader` and the embedded descriptor, and
/// refuses an extent with a parent.
/// `head` holds the first bytes, read already.
fn open_sparse(head: Vec<u8>, reader: Box<dyn Read + Send>, read_size: usize) -> Result<Part> {
    let (header, win) = sparse_extent(head, reader, read_size)?;
    Ok(Part::Sparse { header, win })
}

/// [`open_sparse`]'s header and window.
fn sparse_extent(
    mut head: Vec<u8>,
    mut reader: Box<dyn Read + Send>,
    read_size: usize,
) -> Result<(SparseHeader, Window)> {
    read_up_to(reader.as_mut(), &mut head, header::SECTOR as usize)?;
    if !head.starts_with(&header::MAGIC) {
        if head.len() < 4 {
            return Err(VmdkError::TruncatedHeader { len: head.len() }.into());
        }
        return Err(not_a_disk(&head));
    }
    let h = SparseHeader::parse(&head)?;
    if let Some((start, end)) = h.descriptor_range()
        && end <= header::MAX_DESCRIPTOR + header::SECTOR
    {
        read_up_to(reader.as_mut(), &mut head, end as usize)?;
        if let Some(text) = head.get(start as usize..) {
            Descriptor::parse(text).check_parent()?;
        }
    }
    Ok((h, Window::new(head, reader, read_size)))
}

#[cfg(any(test, feature = "bench"))]
/// Inflates every grain of the streamOptimized vmdk in the local `file` on one thread, writing
/// nothing, and tells what it cost: the image's decode bound.
pub fn inflate_cost(mut file: File) -> Result<crate::format::cost::InflateCost> {
    file.seek(SeekFrom::Start(0))
        .map_err(|e| Error::io("seeking the vmdk image", e))?;
    let (header, mut win) = sparse_extent(Vec::new(), Box::new(file), READ_AHEAD)?;
    if header.layout()? != Layout::Markers {
        return Err(Error::InvalidInput(
            "vmdk: not a streamOptimized extent, so it has no compressed grains".into(),
        ));
    }
    markers::inflate_cost(&header, &mut win)
}

impl VmdkReader {
    /// Reads the header of a sparse extent (monolithicSparse or streamOptimized) from the start
    /// of a stream. A descriptor is refused: its extents are files the stream cannot reach.
    pub fn new(reader: Box<dyn Read + Send>, opts: &ReaderOptions) -> Result<Self> {
        VmdkReader::streamed(reader, opts, StreamedBecause::Remote)
    }

    /// [`VmdkReader::new`], saying `because` why a descriptor in the stream cannot be read.
    pub fn streamed(
        mut reader: Box<dyn Read + Send>,
        opts: &ReaderOptions,
        because: StreamedBecause,
    ) -> Result<Self> {
        let mut head = Vec::new();
        read_up_to(reader.as_mut(), &mut head, header::DESCRIPTOR_MAGIC.len())?;
        if head.starts_with(header::DESCRIPTOR_MAGIC) {
            return Err(VmdkError::StreamedDescriptor(because).into());
        }
        let part = open_sparse(head, reader, opts.read_ahead)?;
        Ok(VmdkReader {
            virtual_size: part.len(),
            extents: vec![part],
            read_size: opts.read_ahead,
        })
    }

    /// Opens the local file at `path` (already opened as `file`, `length` bytes): a sparse extent,
    /// or a descriptor whose extent files lie beside it.
    pub fn open(path: &Path, mut file: File, length: u64) -> Result<Self> {
        let mut head = vec![0u8; header::DESCRIPTOR_MAGIC.len().min(length as usize)];
        file.read_exact_at(&mut head, 0)
            .map_err(|e| Error::from_read(e, "vmdk image"))?;
        if !head.starts_with(header::DESCRIPTOR_MAGIC) {
            // Format sniffing read through the file's offset.
            file.seek(SeekFrom::Start(0))
                .map_err(|e| Error::io(format!("seeking {}", path.display()), e))?;
            let part = open_sparse(Vec::new(), Box::new(file), READ_AHEAD)?;
            return Ok(VmdkReader {
                virtual_size: part.len(),
                extents: vec![part],
                read_size: READ_AHEAD,
            });
        }
        let mut text = vec![0u8; length.min(header::MAX_DESCRIPTOR) as usize];
        file.read_exact_at(&mut text, 0)
            .map_err(|e| Error::from_read(e, "vmdk descriptor"))?;
        let desc = Descriptor::parse(&text);
        desc.check_parent()?;
        desc.create_type()?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut extents = Vec::new();
        for extent in &desc.extents()? {
            extents.push(open_extent(dir, extent)?);
        }
        let virtual_size = extents
            .iter()
            .try_fold(0u64, |sum, p| sum.checked_add(p.len()))
            .filter(|&v| v <= i64::MAX as u64)
            .ok_or_else(|| {
                Error::Corrupt("vmdk descriptor: the extents add up to more than 2^63 bytes".into())
            })?;
        Ok(VmdkReader {
            virtual_size,
            extents,
            read_size: READ_AHEAD,
        })
    }

    /// The header of a single sparse extent (None for a descriptor's disk).
    pub fn header(&self) -> Option<&SparseHeader> {
        match &self.extents[..] {
            [Part::Sparse { header, .. }] => Some(header),
            _ => None,
        }
    }

    /// Converts the guest disk into `sink`: every byte of `[0, virtual_size)` exactly once.
    pub fn convert(self, sink: &mut dyn ExtentSink) -> Result<()> {
        let mut base = 0;
        for part in self.extents {
            let len = part.len();
            let mut shifted = Shifted {
                inner: &mut *sink,
                base,
            };
            match part {
                Part::Sparse { header, mut win } => {
                    match header.layout()? {
                        Layout::Tables => {
                            tables::convert(&header, &mut win, self.read_size, &mut shifted)?
                        }
                        Layout::Markers => {
                            markers::convert(&header, &mut win, self.read_size, &mut shifted)?
                        }
                    }
                    reaches_grain_offset(&header, &mut win)?;
                }
                Part::Flat { file, start, len } => {
                    Box::new(SparseFileReader::at(file, start, len)).copy_to(&mut shifted)?;
                }
            }
            base += len;
        }
        Ok(())
    }
}

/// Checks that a converted sparse extent is at least as long as its header's `overHead` (where
/// its grains begin), as qemu does on opening it ("File truncated"): an extent read through its
/// tables may end before it, and what its tables map is then no reason to trust it.
fn reaches_grain_offset(h: &SparseHeader, win: &mut Window) -> Result<()> {
    let grains_at = h.grain_offset.saturating_mul(header::SECTOR);
    if win.skip_to(grains_at.max(win.pos()))? {
        return Ok(());
    }
    Err(Error::Corrupt(format!(
        "vmdk: truncated: the header's overHead puts the grains at {grains_at:#x}, past the end \
         of the image ({:#x} bytes)",
        win.pos()
    )))
}

/// Opens an extent of a descriptor in `dir`.
fn open_extent(dir: &Path, extent: &Extent) -> Result<Part> {
    let path: PathBuf = dir.join(&extent.file);
    let file = File::open(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::InvalidInput(format!(
            "vmdk descriptor: extent file {} does not exist",
            path.display()
        )),
        _ => Error::io(format!("opening vmdk extent {}", path.display()), e),
    })?;
    match extent.kind {
        ExtentKind::Flat { offset } => Ok(Part::Flat {
            file,
            start: offset * header::SECTOR,
            len: extent.sectors * header::SECTOR,
        }),
        ExtentKind::Sparse => {
            open_sparse(Vec::new(), Box::new(file), READ_AHEAD).map_err(|e| match e {
                Error::Corrupt(m) => Error::Corrupt(format!("extent {}: {m}", path.display())),
                Error::Unsupported(m) => {
                    Error::Unsupported(format!("extent {}: {m}", path.display()))
                }
                other => other,
            })
        }
    }
}

/// A sink seen at an offset: an extent's bytes land at its place in the disk.
struct Shifted<'a> {
    inner: &'a mut dyn ExtentSink,
    base: u64,
}

impl ExtentSink for Shifted<'_> {
    fn write_data(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.inner.write_data(self.base + offset, data)
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
        self.inner.write_zeroes(self.base + offset, len)
    }
}

impl FormatReader for VmdkReader {
    fn format(&self) -> ImageFormat {
        ImageFormat::Vmdk
    }

    fn virtual_size(&self) -> Option<u64> {
        Some(self.virtual_size)
    }

    fn copy_to(self: Box<Self>, sink: &mut dyn ExtentSink) -> Result<u64> {
        let size = self.virtual_size;
        self.convert(sink)?;
        Ok(size)
    }
}
