//! The converter for streamOptimized extents, in one forward pass.
//!
//! From the header's `overHead` on, the extent is a sequence of sector-aligned markers: a grain
//! marker holds a grain's deflate (zlib) data, and names its guest sector. qemu reads the grains
//! through the grain directory and tables only, so this reader follows them too where the
//! forward pass meets them first: when the header's directory lies before the grains (as qemu
//! writes it, and as an image appended to in several sessions keeps it), each grain is read at
//! the place its table entry gives, whatever its marker's sector says or whatever lies between
//! grains (qemu leaves zero sectors there), and a grain the tables promise that the stream lacks
//! is truncation. Otherwise (VMware's layout: `gdOffset = -1`, the tables, the directory and the
//! footer after the grains), each grain is inflated and written at the guest sector its marker
//! names as it arrives, and the tables, as they pass, must agree ([`Trailer`]); the footer's copy
//! of the header must agree on the geometry, and the stream must end with the end-of-stream
//! marker right after the footer (qemu reads the footer from the end of the file): a stream that
//! ends before it is truncated. Guest grains no marker wrote read as zeroes.
//!
//! A grain must inflate to the guest bytes it covers and at most one grain, as qemu's `uncompress`
//! into a one-grain buffer requires; a guest grain written twice, a grain outside the disk or not
//! on a grain boundary, and a grain larger than two grains compressed are corruption.
//!
//! Speed: the grains whose bytes are in the read window are copied out as a batch (up to
//! [`BATCH_OUT`] of guest bytes) for the [`InflatePool`]'s threads, one per core, while this
//! thread reads on and writes the batches that come back, in stream order. Consecutive grains are
//! written with one call.
//!
//! Memory: the read window (one read size, or one grain and its marker when larger), the pool's
//! batches in flight, and one bit per guest grain (allocated in pages of 4096 grains as grains
//! arrive); with the tables before the grains, the [`Map`]'s 8 bytes per grain between its table
//! and its data; with the tables after them, the [`Trailer`]'s 8 bytes per grain and 32 per
//! table until the end.

use crate::format::fields::le32;
use flate2::{Decompress, FlushDecompress, Status};

use super::error::VmdkError;
use super::header::{GD_AT_END, GRAIN_MARKER_LEN, Marker, SECTOR, SparseHeader, parse_marker};
use super::tables::{Map, Mapped};
use super::trailer::Trailer;
use super::window::Window;
use crate::error::{Error, Result};
#[cfg(any(test, feature = "bench"))]
use crate::format::cost::InflateCost;
use crate::format::inflate_pool::{Batch, InflatePool, PieceDecoder};
use crate::format::qcow2::extent::ExtentWriter;
use crate::sink::ExtentSink;

fn corrupt(msg: String) -> Error {
    Error::Corrupt(format!("vmdk: {msg}"))
}

/// Guest grains written so far: one bit each, in pages of 4096 grains.
pub(super) struct GrainSet {
    pages: Vec<Option<Box<[u64; 64]>>>,
}

const PAGE_GRAINS: u64 = 4096;

impl GrainSet {
    pub fn new(grains: u64) -> GrainSet {
        GrainSet {
            pages: (0..grains.div_ceil(PAGE_GRAINS)).map(|_| None).collect(),
        }
    }

    /// Marks grain `g`; false when it was marked already.
    pub fn insert(&mut self, g: u64) -> bool {
        let page = self.pages[(g / PAGE_GRAINS) as usize].get_or_insert_with(|| Box::new([0; 64]));
        let (word, bit) = ((g % PAGE_GRAINS / 64) as usize, g % 64);
        let was = page[word] >> bit & 1 == 1;
        page[word] |= 1 << bit;
        !was
    }

    pub fn contains(&self, g: u64) -> bool {
        self.pages[(g / PAGE_GRAINS) as usize]
            .as_ref()
            .is_some_and(|p| p[(g % PAGE_GRAINS / 64) as usize] >> (g % 64) & 1 == 1)
    }

    /// Calls `f(first, end)` for each run of unmarked grains below `grains`.
    pub fn gaps(&self, grains: u64, mut f: impl FnMut(u64, u64) -> Result<()>) -> Result<()> {
        let mut g = 0;
        while g < grains {
            let page_end = ((g / PAGE_GRAINS + 1) * PAGE_GRAINS).min(grains);
            if self.pages[(g / PAGE_GRAINS) as usize].is_none() {
                let start = g;
                g = page_end;
                // Coalesce with the following empty pages and unmarked grains.
                while g < grains && !self.contains(g) {
                    g += 1;
                }
                f(start, g)?;
                continue;
            }
            if self.contains(g) {
                g += 1;
                continue;
            }
            let start = g;
            while g < grains && !self.contains(g) {
                g += 1;
            }
            f(start, g)?;
        }
        Ok(())
    }
}

/// Each inflating thread's decoder, kept from grain to grain.
struct GrainInflater(Decompress);

impl GrainInflater {
    fn new() -> GrainInflater {
        GrainInflater(Decompress::new(true))
    }
}

impl PieceDecoder for GrainInflater {
    fn decode(&mut self, src: &[u8], dst: &mut [u8]) -> std::result::Result<usize, String> {
        inflate_grain(&mut self.0, src, dst)
    }
}

/// Inflates one grain's zlib stream into `out` (one grain long); returns the bytes produced.
/// Like qemu's `uncompress`: the stream must end (checksum included) within the grain.
pub(super) fn inflate_grain(
    z: &mut Decompress,
    src: &[u8],
    out: &mut [u8],
) -> Result<usize, String> {
    z.reset(true);
    match z.decompress(src, out, FlushDecompress::Finish) {
        Ok(Status::StreamEnd) => Ok(z.total_out() as usize),
        Ok(_) if z.total_out() as usize == out.len() => Err(format!(
            "inflates to more than a grain ({} bytes)",
            out.len()
        )),
        Ok(_) => Err(format!(
            "the zlib stream ends early, after {} bytes of output",
            z.total_out()
        )),
        Err(e) => Err(format!("zlib: {e}")),
    }
}

#[cfg(any(test, feature = "bench"))]
/// Inflates every grain of the streamOptimized extent behind `win` (at its start) on the calling
/// thread, writing nothing, and measures it: the extent's decode bound.
pub(super) fn inflate_cost(h: &SparseHeader, win: &mut Window) -> Result<InflateCost> {
    let mut cost = InflateCost::default();
    if !win.skip_to(h.grain_offset * SECTOR)? {
        return Ok(cost);
    }
    let mut z = Decompress::new(true);
    let mut grain = vec![0u8; h.grain_size() as usize];
    loop {
        let at = win.pos();
        let head = win.peek(16)?;
        if head.len() < GRAIN_MARKER_LEN {
            return Ok(cost);
        }
        match parse_marker(head, at)? {
            Marker::EndOfStream => return Ok(cost),
            Marker::Grain { lba, size } => {
                let (job, view) = whole_grain(h, win, at, lba, size)?;
                let src = &view[job.from..job.to];
                cost.measure(1, src.len(), || {
                    let n = inflate_grain(&mut z, src, &mut grain)
                        .map_err(|why| corrupt_grain(h, &job, &why))?;
                    Ok(((), n))
                })?;
                win.consume((job.to as u64).next_multiple_of(SECTOR))?;
            }
            Marker::GrainTable { sectors }
            | Marker::GrainDirectory { sectors }
            | Marker::Footer { sectors } => {
                win.skip_to(metadata_end(at, sectors)?)?;
            }
        }
    }
}

/// The grain whose marker at `at` (its window position) says `lba` and `size`, checked against
/// the geometry, and the window's view of the marker and its whole zlib stream
/// (`view[job.from..job.to]`).
fn whole_grain<'w>(
    h: &SparseHeader,
    win: &'w mut Window,
    at: u64,
    lba: u64,
    size: u32,
) -> Result<(Job, &'w [u8])> {
    check_grain(h, at, lba, size)?;
    let total = GRAIN_MARKER_LEN + size as usize;
    let view = win.peek(total)?;
    if view.len() < total {
        return Err(corrupt(format!(
            "truncated: the grain for guest offset {:#x} at {at:#x} is cut short",
            lba * SECTOR
        )));
    }
    let job = Job {
        at,
        from: GRAIN_MARKER_LEN,
        to: total,
        grain: lba / h.granularity,
    };
    Ok((job, view))
}

/// Where the metadata of `sectors` sectors behind the marker at `at` ends.
fn metadata_end(at: u64, sectors: u64) -> Result<u64> {
    sectors
        .checked_add(1)
        .and_then(|s| s.checked_mul(SECTOR))
        .and_then(|n| n.checked_add(at))
        .ok_or_else(|| {
            VmdkError::BadMarker {
                offset: at,
                why: format!("metadata of {sectors} sectors"),
            }
            .into()
        })
}

/// Most guest bytes of one batch of grains handed to the inflating threads.
const BATCH_OUT: usize = 2 << 20;

/// A grain whose marker and data lie in the window: `view[from..to]` is its zlib stream (`from`
/// and `to` are window positions, stale once the window moves on).
struct Job {
    at: u64,
    from: usize,
    to: usize,
    grain: u64,
}

/// Checks a grain marker against the geometry.
fn check_grain(h: &SparseHeader, at: u64, lba: u64, size: u32) -> Result<()> {
    let bad = |why: String| -> Error { VmdkError::BadMarker { offset: at, why }.into() };
    if !lba.is_multiple_of(h.granularity) || lba >= h.capacity {
        return Err(bad(format!(
            "a grain for sector {lba}, not at a grain boundary inside the disk ({} sectors in grains of {})",
            h.capacity, h.granularity
        )));
    }
    if u64::from(size) > 2 * h.grain_size() {
        return Err(bad(format!(
            "a grain of {size} compressed bytes, more than two grains"
        )));
    }
    Ok(())
}

fn corrupt_grain(h: &SparseHeader, job: &Job, why: &str) -> Error {
    corrupt(format!(
        "the grain for guest offset {:#x} at {:#x}: {why}",
        job.grain * h.grain_size(),
        job.at
    ))
}

/// Writes inflated grains: checks each (its length, that no marker wrote it before) and writes
/// consecutive full grains with one call.
struct Grains<'a, 'h, 's> {
    h: &'h SparseHeader,
    out: &'a mut ExtentWriter<'s>,
    written: &'a mut GrainSet,
}

impl Grains<'_, '_, '_> {
    /// `inflated` holds `jobs`' grains one grain size apart, `lens` their lengths.
    fn write(&mut self, jobs: &[Job], inflated: &[u8], lens: &[usize]) -> Result<()> {
        let h = self.h;
        let gsize = h.grain_size() as usize;
        let n = jobs.len();
        let mut i = 0;
        while i < n {
            let first = i;
            loop {
                let j = &jobs[i];
                let need = h.grain_len(j.grain) as usize;
                if lens[i] < need {
                    let why = format!("inflates to {} bytes, short of {need}", lens[i]);
                    return Err(corrupt_grain(h, j, &why));
                }
                if !self.written.insert(j.grain) {
                    return Err(corrupt_grain(h, j, "a second grain for it"));
                }
                i += 1;
                if i == n || need != gsize || jobs[i].grain != j.grain + 1 {
                    break;
                }
            }
            let g = jobs[first].grain;
            let len = ((i - first - 1) * gsize) as u64 + h.grain_len(jobs[i - 1].grain);
            let from = first * gsize;
            self.out
                .data(g * h.grain_size(), &inflated[from..from + len as usize])?;
        }
        Ok(())
    }
}

/// The converter's state between markers.
struct Converter<'h, 's> {
    h: &'h SparseHeader,
    out: ExtentWriter<'s>,
    written: GrainSet,
    pool: InflatePool<Job>,
    /// Most grains per batch.
    batch_max: usize,
    /// A batch failed (a corrupt grain, or the write): the batches in flight after it are not
    /// written.
    batch_failed: bool,
    /// The grains and tables met, when the tables follow the grains.
    trailer: Trailer,
    /// The footer's `gdOffset`, once the footer has passed.
    footer_gd: Option<u64>,
}

/// True when the grain directory lies before the first grain: the stream meets the tables first.
fn tables_first(h: &SparseHeader) -> bool {
    h.gd_offset != GD_AT_END && h.gd_offset < h.grain_offset
}

/// Converts the streamOptimized extent behind `win` (at its start) into `sink`, at extent offsets.
pub(super) fn convert(
    h: &SparseHeader,
    win: &mut Window,
    read_size: usize,
    sink: &mut dyn ExtentSink,
) -> Result<()> {
    let gsize = h.grain_size() as usize;
    let mut c = Converter {
        h,
        out: ExtentWriter::new(sink),
        written: GrainSet::new(h.grains()),
        pool: InflatePool::new(gsize, GrainInflater::new)?,
        batch_max: (BATCH_OUT / gsize).max(1),
        batch_failed: false,
        trailer: Trailer::default(),
        footer_gd: None,
    };
    let by_tables = tables_first(h);
    let mut read = || -> Result<()> {
        if by_tables {
            let mut map = Map::read(h, win, &mut c.out)?;
            while c.table_batch(&mut map, win, read_size)? {}
            return Ok(());
        }
        if !win.skip_to(h.grain_offset * SECTOR)? {
            return Err(corrupt(format!(
                "truncated: the first grain at {:#x} is past the end of the image",
                h.grain_offset * SECTOR
            )));
        }
        while c.batch(win, read_size)? || c.marker(win)? {}
        Ok(())
    };
    let read = read();
    // A problem met reading lies past every grain in flight: those are written (or found
    // corrupt) first, as one thread reading in order would have.
    if read.is_ok() || !c.batch_failed {
        while let Some(done) = c.pool.next_done()? {
            c.write(done)?;
        }
    }
    read?;
    let (gs, vsize) = (h.grain_size(), h.virtual_size());
    let Converter {
        mut out, written, ..
    } = c;
    // The tables wrote the grains they leave unallocated already.
    if !by_tables {
        written.gaps(h.grains(), |a, b| out.zero(a * gs, (b * gs).min(vsize)))?;
    }
    out.flush()
}

/// The grain the table entry `m` points at, whose marker is at `view[off..]` (`at` in the
/// extent; `eof`: the view ends where the stream does): the job, or None when the view does not
/// hold it whole. qemu reads only the marker's size (at most two grains), never its sector, and
/// reads past the end of the image as zeroes.
fn mapped_grain(
    h: &SparseHeader,
    view: &[u8],
    off: usize,
    at: u64,
    m: Mapped,
    eof: bool,
) -> Result<Option<(Job, usize)>> {
    let what = || {
        format!(
            "the grain table entry for guest offset {:#x} points at {at:#x}",
            m.grain * h.grain_size()
        )
    };
    let Some(head) = view.get(off..off + GRAIN_MARKER_LEN) else {
        return match eof {
            true => Err(corrupt(format!(
                "truncated: {}, past the end of the image",
                what()
            ))),
            false => Ok(None),
        };
    };
    let size = u64::from(le32(head, 8));
    if size == 0 || size > 2 * h.grain_size() {
        return Err(corrupt(format!(
            "{}, where a grain marker says {size} compressed bytes (1 to two grains)",
            what()
        )));
    }
    let from = off + GRAIN_MARKER_LEN;
    let want = from + size as usize;
    if want > view.len() && !eof {
        return Ok(None);
    }
    let job = Job {
        at,
        from,
        to: want.min(view.len()),
        grain: m.grain,
    };
    Ok(Some((job, size as usize)))
}

impl Converter<'_, '_> {
    /// Hands the grains the tables map next, whose bytes are all in the next read size, to the
    /// inflating threads as a batch, and writes the batch that comes back, if one does; false
    /// once the tables map no more.
    fn table_batch(&mut self, map: &mut Map, win: &mut Window, read_size: usize) -> Result<bool> {
        let h = self.h;
        let Some(first) = map.next(h, win, &mut self.out)? else {
            return Ok(false);
        };
        if !win.skip_to(first.host)? {
            return Err(corrupt(format!(
                "truncated: the grain for guest offset {:#x} at {:#x} is past the end of the image",
                first.grain * h.grain_size(),
                first.host
            )));
        }
        // Enough for the first grain whatever its size.
        let want = read_size.max(GRAIN_MARKER_LEN + 2 * h.grain_size() as usize);
        let view = win.peek(want)?;
        let eof = view.len() < want;
        let mut batch = self.pool.batch();
        let (job, size) =
            mapped_grain(h, view, 0, first.host, first, eof)?.expect("the view holds a grain");
        let (from, to) = (job.from, job.to);
        batch.push(job, &view[from..to], size);
        let mut last = first.host;
        while batch.len() < self.batch_max
            && let Some(n) = map.following()
            && map.table_at().is_none_or(|t| t > n.host)
        {
            if n.host <= last {
                return Err(corrupt(format!(
                    "the grain table entries for guest offsets {:#x} and {:#x} both point at {:#x}",
                    n.grain * h.grain_size(),
                    batch.tags().last().map_or(0, |j| j.grain) * h.grain_size(),
                    n.host
                )));
            }
            let off = (n.host - first.host) as usize;
            if off >= view.len() {
                break;
            }
            let Some((job, size)) = mapped_grain(h, view, off, n.host, n, eof)? else {
                break;
            };
            map.take_following();
            let (from, to) = (job.from, job.to);
            batch.push(job, &view[from..to], size);
            last = n.host;
        }
        win.skip_to(last)?;
        self.submit(batch)?;
        Ok(true)
    }

    /// Hands the grains at the window's position whose bytes are all in the next read size, up
    /// to the first other marker, to the inflating threads as a batch, and writes the batch that
    /// comes back, if one does; false when there are none.
    fn batch(&mut self, win: &mut Window, read_size: usize) -> Result<bool> {
        let h = self.h;
        let start = win.pos();
        let view = win.peek(read_size)?;
        let mut batch = self.pool.batch();
        let mut off = 0usize;
        while off + 16 <= view.len() && batch.len() < self.batch_max {
            let at = start + off as u64;
            let Marker::Grain { lba, size } = parse_marker(&view[off..off + 16], at)? else {
                break;
            };
            check_grain(h, at, lba, size)?;
            let to = off + GRAIN_MARKER_LEN + size as usize;
            if to > view.len() {
                break;
            }
            let from = off + GRAIN_MARKER_LEN;
            let job = Job {
                at,
                from,
                to,
                grain: lba / h.granularity,
            };
            self.trailer.grain(at / SECTOR, job.grain)?;
            batch.push(job, &view[from..to], to - from);
            off = to.next_multiple_of(SECTOR as usize);
        }
        if batch.is_empty() {
            self.pool.recycle(batch);
            return Ok(false);
        }
        win.consume(off as u64)?;
        self.submit(batch)?;
        Ok(true)
    }

    /// Hands `batch` to the inflating threads, and writes the one that comes back, if any.
    fn submit(&mut self, batch: Batch<Job>) -> Result<()> {
        match self.pool.submit(batch)? {
            Some(done) => self.write(done),
            None => Ok(()),
        }
    }

    /// Writes an inflated batch, or names its corrupt grain.
    fn write(&mut self, done: Batch<Job>) -> Result<()> {
        let written = match done.decoded() {
            Ok((inflated, lens)) => Grains {
                h: self.h,
                out: &mut self.out,
                written: &mut self.written,
            }
            .write(done.tags(), inflated, lens),
            Err((job, why)) => Err(corrupt_grain(self.h, job, why)),
        };
        self.batch_failed |= written.is_err();
        self.pool.recycle(done);
        written
    }

    /// The `len` bytes of metadata behind the marker at `at` (of `sectors` sectors), which
    /// must hold them.
    fn metadata<'w>(
        win: &'w mut Window,
        at: u64,
        sectors: u64,
        len: u64,
        what: &str,
    ) -> Result<&'w [u8]> {
        if sectors.saturating_mul(SECTOR) < len {
            return Err(corrupt(format!(
                "the {what} marker at {at:#x} says {sectors} sectors, short of its {len} bytes"
            )));
        }
        let view = win.peek((SECTOR + len) as usize)?;
        if (view.len() as u64) < SECTOR + len {
            return Err(corrupt(format!(
                "truncated: the {what} at {:#x} is cut short",
                at + SECTOR
            )));
        }
        Ok(&view[SECTOR as usize..])
    }

    /// Handles the one marker at the window's position: metadata, the end, or a grain too large
    /// for a batch; false at the end of the extent.
    fn marker(&mut self, win: &mut Window) -> Result<bool> {
        let h = self.h;
        let at = win.pos();
        let head = win.peek(16)?;
        if head.is_empty() {
            return Err(corrupt(format!(
                "truncated: the stream ends at {at:#x}, before its end-of-stream marker"
            )));
        }
        if head.len() < GRAIN_MARKER_LEN {
            return Err(corrupt(format!(
                "truncated: a marker at {at:#x} is cut short"
            )));
        }
        match parse_marker(head, at)? {
            Marker::EndOfStream => {
                self.end(win, at)?;
                return Ok(false);
            }
            Marker::GrainTable { sectors } => {
                let table = Self::metadata(win, at, sectors, h.gt_len(), "grain table")?;
                self.trailer.table(h, at / SECTOR + 1, table)?;
                self.skip_metadata(win, at, sectors)?;
            }
            Marker::GrainDirectory { sectors } => {
                let len = h.gd_entries() * 4;
                let gd = Self::metadata(win, at, sectors, len, "grain directory")?;
                self.trailer.directory(h, at / SECTOR + 1, gd)?;
                self.skip_metadata(win, at, sectors)?;
            }
            Marker::Footer { sectors } => {
                let footer = Self::metadata(win, at, sectors.max(1), SECTOR, "footer")?;
                let f = SparseHeader::parse(footer)
                    .map_err(|e| corrupt(format!("the footer at {:#x}: {e}", at + SECTOR)))?;
                // qemu reads the image by the footer in place of the header: they must agree
                // on all it reads but the directory's place.
                let same = SparseHeader {
                    gd_offset: h.gd_offset,
                    rgd_offset: h.rgd_offset,
                    desc_offset: h.desc_offset,
                    desc_size: h.desc_size,
                    ..f.clone()
                };
                if same != *h {
                    return Err(corrupt(format!(
                        "the footer at {:#x} disagrees with the header: {f:?}, the header {h:?}",
                        at + SECTOR
                    )));
                }
                self.footer_gd = Some(f.gd_offset);
                self.skip_metadata(win, at, sectors.max(1))?;
            }
            Marker::Grain { lba, size } => {
                // Larger than a batch's window: alone, with a window of its own size.
                let (job, view) = whole_grain(h, win, at, lba, size)?;
                self.trailer.grain(at / SECTOR, job.grain)?;
                let (from, to) = (job.from, job.to);
                let mut batch = self.pool.batch();
                batch.push(job, &view[from..to], to - from);
                win.consume((to as u64).next_multiple_of(SECTOR))?;
                self.submit(batch)?;
            }
        }
        Ok(true)
    }

    fn skip_metadata(&self, win: &mut Window, at: u64, sectors: u64) -> Result<()> {
        if !win.skip_to(metadata_end(at, sectors)?)? {
            return Err(corrupt(format!(
                "truncated: the metadata of the marker at {at:#x} runs past the end of the image"
            )));
        }
        Ok(())
    }

    /// The end-of-stream marker at `at`: after the footer the header promises, the last sector
    /// of the stream, and the tables that passed agree with the grains.
    fn end(&self, win: &mut Window, at: u64) -> Result<()> {
        let h = self.h;
        let gd = if h.gd_offset == GD_AT_END {
            self.footer_gd.ok_or_else(|| {
                corrupt(format!(
                    "truncated or corrupt: an end-of-stream marker at {at:#x} before the footer \
                     the header promises (gdOffset = -1)"
                ))
            })?
        } else {
            h.gd_offset
        };
        self.trailer.finish(gd)?;
        if !win.skip_to(at + SECTOR)? {
            return Err(corrupt(format!(
                "truncated: the end-of-stream marker at {at:#x} is cut short"
            )));
        }
        if !win.peek(1)?.is_empty() {
            return Err(corrupt(format!(
                "bytes after the end-of-stream marker at {at:#x} (qemu reads the footer from the end of the image)"
            )));
        }
        Ok(())
    }
}
