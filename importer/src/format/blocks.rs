//! Images cut into equal blocks placed by one table (vhd's BAT, vdi's block map): the validated
//! placement of the blocks ([`BlockTable`]), and their conversion by random access from a local
//! file ([`FileBlocks`]) or in one forward pass over a stream ([`Forward`]).
//!
//! A stream is read front to back. Until the table has been read, the bytes the reader skips are
//! held ([`HeldBytes`]: memory up to the budget, then a spill file), since a block may lie before
//! its table; blocks are then read in host order, from the hold or as they pass. Memory: the table
//! (one `u64` and one `u32` per guest block, at most [`MAX_BLOCKS`]), one read chunk and the hold's
//! budget.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use crate::error::{Error, Result};
use crate::format::ReaderOptions;
use crate::format::hold::HeldBytes;
use crate::sink::ExtentSink;

/// A guest block with no data: it reads as zeroes.
pub(crate) const HOLE: u64 = u64::MAX;

/// The most guest blocks a table may map: it bounds the memory a hostile header can make the
/// reader take (16 MiB + 8 MiB); at vhd's 2 MiB and vdi's 1 MiB blocks, 4 TiB and 2 TiB disks.
pub(crate) const MAX_BLOCKS: u64 = 1 << 21;

/// What is wrong with where a table puts its blocks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error(
        "{table} entry {index} places its block at {offset:#x}..{end:#x}, past the end of the \
         image ({len} bytes)"
    )]
    PastEnd {
        table: &'static str,
        index: u64,
        offset: u64,
        end: u64,
        len: u64,
    },
    #[error(
        "{table} entries {first} and {second} place their blocks over each other at {offset:#x}"
    )]
    Overlap {
        table: &'static str,
        first: u64,
        second: u64,
        offset: u64,
    },
    #[error(
        "{table} places blocks up to {end:#x} (past the disk's end included), past the end of the \
         image ({len} bytes): truncated"
    )]
    ShortImage {
        table: &'static str,
        end: u64,
        len: u64,
    },
    #[error("{table} entry {index} places its block at {offset:#x}, over the {what} at {start:#x}")]
    OverMetadata {
        table: &'static str,
        index: u64,
        offset: u64,
        what: &'static str,
        start: u64,
    },
}

/// The shape of a block table.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The table's name in messages ("BAT", "block map").
    pub table: &'static str,
    pub block_size: u64,
    pub virtual_size: u64,
    /// Host bytes before each block's data (vhd's sector bitmap).
    pub data_skip: u64,
    /// Metadata no block may overlap: name, host start, host end.
    pub reserved: Vec<(&'static str, u64, u64)>,
    /// The least the image's length may be, whatever the blocks the disk needs: where the
    /// format's reader (qemu's) finds the image truncated (0: only those blocks count).
    pub min_len: u64,
}

impl Layout {
    /// Guest blocks the disk spans (the last one may be partial).
    pub fn blocks(&self) -> u64 {
        self.virtual_size.div_ceil(self.block_size)
    }

    /// Host bytes a block occupies.
    fn span(&self) -> u64 {
        self.data_skip + self.block_size
    }
}

/// Where each guest block's bytes are, checked: no block overlaps another or the metadata, and,
/// when the image length is known, every block lies inside the image.
#[derive(Debug)]
pub(crate) struct BlockTable {
    layout: Layout,
    /// Guest block -> host offset of the block, or [`HOLE`].
    hosts: Vec<u64>,
    /// The allocated guest blocks by ascending host offset.
    order: Vec<u32>,
}

impl BlockTable {
    /// `hosts` holds [`Layout::blocks`] entries (at most [`MAX_BLOCKS`]).
    pub fn new(
        layout: Layout,
        hosts: Vec<u64>,
        image_len: Option<u64>,
    ) -> Result<BlockTable, TableError> {
        debug_assert_eq!(hosts.len() as u64, layout.blocks());
        let table = layout.table;
        let span = layout.span();
        let mut order: Vec<u32> = (0..hosts.len() as u32)
            .filter(|&g| hosts[g as usize] != HOLE)
            .collect();
        order.sort_unstable_by_key(|&g| (hosts[g as usize], g));
        let mut prev_end = None;
        for (i, &g) in order.iter().enumerate() {
            let offset = hosts[g as usize];
            let end = offset.saturating_add(span);
            if let Some(len) = image_len
                && end > len
            {
                return Err(TableError::PastEnd {
                    table,
                    index: g.into(),
                    offset,
                    end,
                    len,
                });
            }
            if let Some(&(what, start, _)) = layout
                .reserved
                .iter()
                .find(|&&(_, start, stop)| offset < stop && start < end)
            {
                return Err(TableError::OverMetadata {
                    table,
                    index: g.into(),
                    offset,
                    what,
                    start,
                });
            }
            if prev_end.is_some_and(|e| e > offset) {
                return Err(TableError::Overlap {
                    table,
                    first: order[i - 1].into(),
                    second: g.into(),
                    offset,
                });
            }
            prev_end = Some(end);
        }
        if let Some(len) = image_len
            && layout.min_len > len
        {
            return Err(TableError::ShortImage {
                table,
                end: layout.min_len,
                len,
            });
        }
        Ok(BlockTable {
            layout,
            hosts,
            order,
        })
    }

    pub fn virtual_size(&self) -> u64 {
        self.layout.virtual_size
    }

    /// How long the image must be: to the end of the block that ends last in it (all its host
    /// bytes, past the disk's end too) and to [`Layout::min_len`]; and what ends there.
    fn end(&self) -> (u64, String) {
        let table = self.layout.table;
        let last = self.order.last().map(|&g| {
            let end = self.hosts[g as usize].saturating_add(self.layout.span());
            (end, format!("the end of the block of {table} entry {g}"))
        });
        match last {
            Some((end, what)) if end >= self.layout.min_len => (end, what),
            _ => (
                self.layout.min_len,
                format!("the end of what the {table} places"),
            ),
        }
    }

    /// Reports every guest byte exactly once: the holes first, then the blocks in host order,
    /// read from `source` in pieces of at most `chunk` bytes.
    pub fn convert(
        &self,
        source: &mut dyn BlockSource,
        sink: &mut dyn ExtentSink,
        chunk: usize,
    ) -> Result<()> {
        let l = &self.layout;
        let mut g = 0;
        while g < self.hosts.len() {
            if self.hosts[g] != HOLE {
                g += 1;
                continue;
            }
            let first = g;
            while g < self.hosts.len() && self.hosts[g] == HOLE {
                g += 1;
            }
            let start = first as u64 * l.block_size;
            let end = (g as u64 * l.block_size).min(l.virtual_size);
            sink.write_zeroes(start, end - start)?;
        }
        let mut buf = vec![0u8; (chunk.max(512) as u64).min(l.block_size) as usize];
        for &g in &self.order {
            let guest = u64::from(g) * l.block_size;
            let len = l.block_size.min(l.virtual_size - guest);
            let host = self.hosts[g as usize];
            let what = || {
                format!(
                    "the block of {} entry {g} (guest offset {guest:#x}) at {host:#x}",
                    l.table
                )
            };
            let mut done = 0;
            while done < len {
                let n = (len - done).min(buf.len() as u64) as usize;
                source.read_at(host + l.data_skip + done, &mut buf[..n], &what)?;
                sink.write_data(guest + done, &buf[..n])?;
                done += n as u64;
            }
        }
        Ok(())
    }
}

/// Where a converter reads image bytes.
pub(crate) trait BlockSource {
    /// Fills `buf` with the image bytes at `offset`; `what` names them for errors.
    fn read_at(&mut self, offset: u64, buf: &mut [u8], what: &dyn Fn() -> String) -> Result<()>;
}

/// `format: truncated: WHAT at OFFSET is past the end of the image (LEN bytes)`.
fn truncated(format: &str, what: &dyn Fn() -> String, offset: u64, len: u64) -> Error {
    Error::Corrupt(format!(
        "{format}: truncated: {} at {offset:#x} is past the end of the image ({len} bytes)",
        what()
    ))
}

/// A local file read at random.
pub(crate) struct FileBlocks<'f> {
    pub file: &'f File,
    pub length: u64,
    /// The format's name in messages.
    pub format: &'static str,
}

impl BlockSource for FileBlocks<'_> {
    fn read_at(&mut self, offset: u64, buf: &mut [u8], what: &dyn Fn() -> String) -> Result<()> {
        if offset.saturating_add(buf.len() as u64) > self.length {
            return Err(truncated(self.format, what, offset, self.length));
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::from_read(e, self.format))
    }
}

/// A stream read once, front to back, holding what it skips until told to stop.
pub(crate) struct Forward {
    reader: Box<dyn Read + Send>,
    /// Stream offset of the next byte.
    pos: u64,
    format: &'static str,
    hold: HeldBytes,
    /// How many more skipped bytes may be held.
    hold_left: u64,
    scratch: Vec<u8>,
}

impl Forward {
    /// A stream of which `head` (its first bytes) has been read already. Skipped bytes are held
    /// (at most `hold_limit` of them: more than the blocks of the disk take is never needed) until
    /// [`Forward::stop_holding`].
    pub fn new(
        head: &[u8],
        reader: Box<dyn Read + Send>,
        format: &'static str,
        opts: &ReaderOptions,
        hold_limit: u64,
    ) -> Result<Forward> {
        let mut forward = Forward {
            reader,
            pos: head.len() as u64,
            format,
            hold: HeldBytes::new(opts.memory_budget, opts.spill_dir.clone()),
            hold_left: hold_limit,
            scratch: Vec::new(),
        };
        forward.keep(0, head)?;
        Ok(forward)
    }

    /// Once the table is read, skipped bytes are dropped: no block can lie in them unseen.
    pub fn stop_holding(&mut self) {
        self.hold_left = 0;
    }

    /// Holds what of `bytes` (the stream's bytes at `at`) the limit allows.
    fn keep(&mut self, at: u64, bytes: &[u8]) -> Result<()> {
        let n = (bytes.len() as u64).min(self.hold_left) as usize;
        self.hold_left -= n as u64;
        self.hold.add(at, &bytes[..n])
    }

    /// Reads up to `buf.len()` bytes; fewer only at the end of the stream.
    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.reader.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::from_read(e, self.format)),
            }
        }
        self.pos += filled as u64;
        Ok(filled)
    }

    /// Reads (holding or dropping) up to `offset`.
    fn skip_to(&mut self, offset: u64, what: &dyn Fn() -> String) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(256 << 10, 0);
        while self.pos < offset {
            let at = self.pos;
            let want = (offset - at).min(scratch.len() as u64) as usize;
            let n = self.read_some(&mut scratch[..want])?;
            if n == 0 {
                return Err(truncated(self.format, what, offset, at));
            }
            self.keep(at, &scratch[..n])?;
        }
        self.scratch = scratch;
        Ok(())
    }
}

impl BlockSource for Forward {
    fn read_at(&mut self, offset: u64, buf: &mut [u8], what: &dyn Fn() -> String) -> Result<()> {
        if offset < self.pos {
            let len = buf.len() as u64;
            let mut scratch = std::mem::take(&mut self.scratch);
            if !self.hold.read(offset, len, &mut scratch)? {
                return Err(Error::Corrupt(format!(
                    "{}: {} at {offset:#x} passed before the table that places it",
                    self.format,
                    what()
                )));
            }
            buf.copy_from_slice(&scratch);
            self.scratch = scratch;
            return Ok(());
        }
        self.skip_to(offset, what)?;
        let at = self.pos;
        if self.read_some(buf)? < buf.len() {
            return Err(truncated(self.format, what, offset, at.max(self.pos)));
        }
        Ok(())
    }
}

/// A validated block table and where its blocks are read from: the converter of vhd's dynamic
/// disks and of vdi images.
pub(crate) struct Mapped {
    table: BlockTable,
    source: Source,
    /// The most bytes read (and written) at once.
    chunk: usize,
    format: &'static str,
}

enum Source {
    File { file: File, length: u64 },
    Stream(Box<Forward>),
}

/// What a format's metadata reader finds: the table's shape and each needed guest block's host
/// offset ([`HOLE`] for none).
pub(crate) type Table = (Layout, Vec<u64>);

impl Mapped {
    /// Reads the table of a stream whose first bytes, `head`, have been read: `read` reads the
    /// metadata from the stream, which holds the bytes that pass before it (at most
    /// `hold_limit`), in case blocks lie there.
    pub fn from_stream(
        head: &[u8],
        reader: Box<dyn Read + Send>,
        format: &'static str,
        opts: &ReaderOptions,
        hold_limit: u64,
        read: impl FnOnce(&mut dyn BlockSource) -> Result<Table>,
    ) -> Result<Mapped> {
        let mut forward = Forward::new(head, reader, format, opts, hold_limit)?;
        let (layout, hosts) = read(&mut forward)?;
        forward.stop_holding();
        Ok(Mapped {
            table: checked(layout, hosts, None, format)?,
            source: Source::Stream(Box::new(forward)),
            chunk: opts.read_ahead,
            format,
        })
    }

    /// Reads the table of the local `file` (`length` bytes) with `read`.
    pub fn from_file(
        file: File,
        length: u64,
        format: &'static str,
        read: impl FnOnce(&mut dyn BlockSource) -> Result<Table>,
    ) -> Result<Mapped> {
        let (layout, hosts) = read(&mut FileBlocks {
            file: &file,
            length,
            format,
        })?;
        Ok(Mapped {
            table: checked(layout, hosts, Some(length), format)?,
            source: Source::File { file, length },
            chunk: crate::format::READ_AHEAD,
            format,
        })
    }

    pub fn virtual_size(&self) -> u64 {
        self.table.virtual_size()
    }

    /// Reports the whole guest disk into `sink`; returns its size.
    pub fn convert(self, sink: &mut dyn ExtentSink) -> Result<u64> {
        match self.source {
            Source::File { file, length } => {
                let mut source = FileBlocks {
                    file: &file,
                    length,
                    format: self.format,
                };
                self.table.convert(&mut source, sink, self.chunk)?;
            }
            Source::Stream(mut forward) => {
                self.table.convert(forward.as_mut(), sink, self.chunk)?;
                // As a file's table is checked: every block lies whole in the image, the part of
                // the last one past the disk's end too, and the image is at least as long as the
                // format requires (qemu refuses a vhd whose last block is cut short, even there).
                let (end, what) = self.table.end();
                forward.skip_to(end, &|| what.clone())?;
            }
        }
        Ok(self.table.virtual_size())
    }
}

/// [`BlockTable::new`], its findings a corrupt `format` image.
fn checked(
    layout: Layout,
    hosts: Vec<u64>,
    image_len: Option<u64>,
    format: &str,
) -> Result<BlockTable> {
    BlockTable::new(layout, hosts, image_len).map_err(|e| Error::Corrupt(format!("{format}: {e}")))
}

/// The first `want` bytes of the local `file` (`length` bytes; fewer if it is shorter).
pub(crate) fn file_head(file: &File, length: u64, want: usize, format: &str) -> Result<Vec<u8>> {
    let mut head = vec![0u8; (want as u64).min(length) as usize];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| Error::from_read(e, format))?;
    Ok(head)
}

/// The first `want` bytes of the stream (fewer if it ends before).
pub(crate) fn read_head(reader: &mut dyn Read, want: usize, format: &str) -> Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(want);
    Read::take(&mut *reader, want as u64)
        .read_to_end(&mut buf)
        .map_err(|e| Error::from_read(e, format))?;
    Ok(buf)
}

/// The `len` image bytes at `offset`, named `what` in errors.
pub(crate) fn read_vec(
    source: &mut dyn BlockSource,
    offset: u64,
    len: usize,
    what: &str,
) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    source.read_at(offset, &mut buf, &|| what.to_string())?;
    Ok(buf)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::format::FormatReader;
    use crate::format::qcow2::tests::Rec;

    /// A conversion's outcome: the disk size and bytes.
    pub(crate) type Converted = Result<(u64, Vec<u8>)>;
    type OpenStream = fn(Box<dyn Read + Send>, &ReaderOptions) -> Result<Box<dyn FormatReader>>;
    type OpenFile = fn(File, u64) -> Result<Box<dyn FormatReader>>;

    /// Converts `image` with a format's stream reader (with a memory budget, and with none, so
    /// held bytes spill) and its file reader.
    pub(crate) fn convert_all(image: &[u8], stream: OpenStream, file: OpenFile) -> Vec<Converted> {
        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        for budget in [1 << 20, 0] {
            let opts = ReaderOptions {
                memory_budget: budget,
                spill_dir: dir.path().into(),
                read_ahead: 1000,
            };
            out.push(
                stream(Box::new(io::Cursor::new(image.to_vec())), &opts)
                    .and_then(convert_into_memory),
            );
        }
        let mut f = tempfile::tempfile().unwrap();
        io::Write::write_all(&mut f, image).unwrap();
        out.push(file(f, image.len() as u64).and_then(convert_into_memory));
        out
    }

    /// Converts into memory, checking the exactly-once contract when the size is stated up front.
    fn convert_into_memory(reader: Box<dyn FormatReader>) -> Converted {
        let stated = reader.virtual_size();
        let mut rec = Rec::new(stated.unwrap_or(64 << 20));
        let size = reader.copy_to(&mut rec)?;
        if stated.is_some() {
            rec.assert_complete();
        }
        rec.bytes.truncate(size as usize);
        Ok((size, rec.bytes))
    }

    /// The kind and message of a conversion that must fail.
    pub(crate) fn failure(r: Converted) -> (ErrorKind, String) {
        let e = r.expect_err("must fail");
        (e.kind(), e.to_string())
    }

    fn layout(virtual_size: u64) -> Layout {
        Layout {
            table: "T",
            block_size: 1024,
            virtual_size,
            data_skip: 512,
            reserved: vec![("header", 0, 512), ("table", 512, 1024)],
            min_len: 0,
        }
    }

    #[test]
    fn blocks_over_each_other_are_refused() {
        let err = BlockTable::new(layout(2048), vec![1024, 2048], None).unwrap_err();
        assert_eq!(
            err,
            TableError::Overlap {
                table: "T",
                first: 0,
                second: 1,
                offset: 2048
            }
        );
        // The same host offset twice is an overlap too.
        assert!(BlockTable::new(layout(2048), vec![4096, 4096], None).is_err());
        assert!(BlockTable::new(layout(2048), vec![1024, 2560], None).is_ok());
    }

    #[test]
    fn a_block_over_the_metadata_is_refused() {
        let err = BlockTable::new(layout(1024), vec![0], None).unwrap_err();
        assert!(
            matches!(err, TableError::OverMetadata { what: "header", .. }),
            "{err}"
        );
        let err = BlockTable::new(layout(1024), vec![600], None).unwrap_err();
        assert!(
            matches!(err, TableError::OverMetadata { what: "table", .. }),
            "{err}"
        );
    }

    #[test]
    fn a_block_past_the_end_of_a_file_is_refused() {
        // The block's bitmap (512 bytes) and data (1024) must both be in the file.
        let err = BlockTable::new(layout(1024), vec![1024], Some(2559)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "T entry 0 places its block at 0x400..0xa00, past the end of the image (2559 bytes)"
        );
        assert!(BlockTable::new(layout(1024), vec![1024], Some(2560)).is_ok());
        // A hole never is.
        assert!(BlockTable::new(layout(1024), vec![HOLE], Some(0)).is_ok());
    }

    #[test]
    fn a_stream_reads_blocks_before_the_table_from_the_hold_and_after_it_as_they_pass() {
        // Block 1 lies before the "table", block 0 after it; the disk ends mid-block.
        let mut image = vec![0u8; 8192];
        image[512..1536].fill(1); // block 1's data, after its 512 skipped bytes
        image[4608..5632].fill(2); // block 0's data
        let l = Layout {
            reserved: vec![("table", 2048, 3072)],
            ..layout(1500)
        };
        let table = BlockTable::new(l, vec![4096, 0], None).unwrap();
        for budget in [0, 1 << 20] {
            let dir = tempfile::tempdir().unwrap();
            let opts = ReaderOptions {
                memory_budget: budget,
                spill_dir: dir.path().into(),
                ..ReaderOptions::default()
            };
            let rest = Box::new(io::Cursor::new(image[512..].to_vec()));
            let mut forward = Forward::new(&image[..512], rest, "t", &opts, u64::MAX).unwrap();
            let mut t = vec![0u8; 1024];
            forward.read_at(2048, &mut t, &|| "table".into()).unwrap();
            forward.stop_holding();
            let mut rec = Rec::new(1500);
            table.convert(&mut forward, &mut rec, 300).unwrap();
            rec.assert_complete();
            assert_eq!(&rec.bytes[..1024], &[2u8; 1024][..]);
            assert_eq!(&rec.bytes[1024..], &[1u8; 476][..]);
        }
    }

    #[test]
    fn a_block_beyond_the_hold_limit_is_corrupt_not_wrong() {
        let image = vec![7u8; 8192];
        let l = Layout {
            reserved: vec![("table", 4096, 5120)],
            ..layout(1024)
        };
        let table = BlockTable::new(l, vec![1024], None).unwrap();
        let rest = Box::new(io::Cursor::new(image));
        let mut forward = Forward::new(&[], rest, "t", &ReaderOptions::default(), 1000).unwrap();
        forward
            .read_at(4096, &mut [0u8; 1024], &|| "table".into())
            .unwrap();
        forward.stop_holding();
        let err = table
            .convert(&mut forward, &mut Rec::new(1024), 1 << 20)
            .unwrap_err();
        assert!(err.to_string().contains("passed before the table"), "{err}");
    }

    #[test]
    fn a_truncated_stream_names_the_block_and_its_offset() {
        let table = BlockTable::new(layout(1024), vec![4096], None).unwrap();
        let opts = ReaderOptions::default();
        let rest = Box::new(io::Cursor::new(vec![0u8; 4200]));
        let mut forward = Forward::new(&[], rest, "t", &opts, 0).unwrap();
        let err = table
            .convert(&mut forward, &mut Rec::new(1024), 1 << 20)
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::CorruptImage);
        let msg = err.to_string();
        assert!(msg.contains("the block of T entry 0"), "{msg}");
        assert!(msg.contains("0x1200"), "{msg}");
    }
}
