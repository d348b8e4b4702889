//! The marker-driven converter for streamOptimized extents, in one forward pass.
//!
//! From the header's `overHead` on, the extent is a sequence of sector-aligned markers: a grain
//! marker names the guest sector of the deflate (zlib) data that follows it, so each grain is
//! inflated and written at its place as it arrives, whatever the grain tables (which VMware writes
//! after the grains) say. Grain table, grain directory and footer markers are skipped (the footer's
//! copy of the header must agree on the geometry); the end-of-stream marker, or the end of the
//! stream at a marker boundary (qemu-img writes no end marker), ends the extent. Guest grains no
//! marker wrote read as zeroes.
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
//! arrive).

use flate2::{Decompress, FlushDecompress, Status};

use super::error::VmdkError;
use super::header::{GRAIN_MARKER_LEN, Marker, SECTOR, SparseHeader, parse_marker};
use super::window::Window;
use crate::error::{Error, Result};
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
}

/// Converts the streamOptimized extent behind `win` (at its start) into `sink`, at extent offsets.
pub(super) fn convert(
    h: &SparseHeader,
    win: &mut Window,
    read_size: usize,
    sink: &mut dyn ExtentSink,
) -> Result<()> {
    let gsize = h.grain_size() as usize;
    if !win.skip_to(h.grain_offset * SECTOR)? {
        return Err(corrupt(format!(
            "truncated: the first grain at {:#x} is past the end of the image",
            h.grain_offset * SECTOR
        )));
    }
    let mut c = Converter {
        h,
        out: ExtentWriter::new(sink),
        written: GrainSet::new(h.grains()),
        pool: InflatePool::new(gsize, GrainInflater::new)?,
        batch_max: (BATCH_OUT / gsize).max(1),
        batch_failed: false,
    };
    let mut read = || -> Result<()> {
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
    written.gaps(h.grains(), |a, b| out.zero(a * gs, (b * gs).min(vsize)))?;
    out.flush()
}

impl Converter<'_, '_> {
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

    /// Handles the one marker at the window's position: metadata, the end, or a grain too large
    /// for a batch; false at the end of the extent.
    fn marker(&mut self, win: &mut Window) -> Result<bool> {
        let h = self.h;
        let at = win.pos();
        let head = win.peek(16)?;
        if head.is_empty() {
            return Ok(false); // the end of the stream at a marker boundary
        }
        if head.len() < GRAIN_MARKER_LEN {
            return Err(corrupt(format!(
                "truncated: a marker at {at:#x} is cut short"
            )));
        }
        match parse_marker(head, at)? {
            Marker::EndOfStream => return Ok(false),
            Marker::GrainTable { sectors } | Marker::GrainDirectory { sectors } => {
                if !win.skip_to(metadata_end(at, sectors)?)? {
                    return Err(corrupt(format!(
                        "truncated: the metadata of the marker at {at:#x} runs past the end of the image"
                    )));
                }
            }
            Marker::Footer { sectors } => {
                let footer = win.peek(2 * SECTOR as usize)?;
                if footer.len() < 2 * SECTOR as usize {
                    return Err(corrupt(format!(
                        "truncated: the footer at {at:#x} is cut short"
                    )));
                }
                let f = SparseHeader::parse(&footer[SECTOR as usize..])
                    .map_err(|e| corrupt(format!("the footer at {:#x}: {e}", at + SECTOR)))?;
                if (f.capacity, f.granularity) != (h.capacity, h.granularity) {
                    return Err(corrupt(format!(
                        "the footer at {:#x} says {} sectors in grains of {}, the header {} in grains of {}",
                        at + SECTOR,
                        f.capacity,
                        f.granularity,
                        h.capacity,
                        h.granularity
                    )));
                }
                if !win.skip_to(metadata_end(at, sectors.max(1))?)? {
                    return Err(corrupt(format!(
                        "truncated: the footer at {at:#x} is cut short"
                    )));
                }
            }
            Marker::Grain { lba, size } => {
                // Larger than a batch's window: alone, with a window of its own size.
                let (job, view) = whole_grain(h, win, at, lba, size)?;
                let (from, to) = (job.from, job.to);
                let mut batch = self.pool.batch();
                batch.push(job, &view[from..to], to - from);
                win.consume((to as u64).next_multiple_of(SECTOR))?;
                self.submit(batch)?;
            }
        }
        Ok(true)
    }
}
