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
//! Speed: the grains whose bytes are in the read window are inflated as a batch, on two threads
//! when the batch is large (1 MiB of output or more): this thread inflates and writes the first
//! half while a helper inflates the second, whose grains are then written from the helper's
//! buffer. Consecutive grains are written with one call.
//!
//! Memory: the read window (one read size, or one grain and its marker when larger), a batch's
//! output (four read sizes at most), and one bit per guest grain (allocated in pages of 4096
//! grains as grains arrive).

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use flate2::{Decompress, FlushDecompress, Status};

use super::error::VmdkError;
use super::header::{GRAIN_MARKER_LEN, Marker, SECTOR, SparseHeader, parse_marker};
use super::window::Window;
use crate::error::{Error, Result};
use crate::format::cost::InflateCost;
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

/// Output of one batch at most, in read sizes: grains are inflated a batch at a time.
const BATCH_READS: usize = 4;
/// Batches with less output than this inflate on the calling thread alone.
const PARALLEL_MIN: usize = 1 << 20;

/// A grain whose marker and data lie in the window: `view[from..to]` is its zlib stream.
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

/// Inflates `jobs` into consecutive grains of `out`, their lengths into `lens`; on failure, the
/// job's index and why.
fn inflate_jobs(
    z: &mut Decompress,
    view: &[u8],
    jobs: &[Job],
    out: &mut [u8],
    lens: &mut [usize],
) -> std::result::Result<(), (usize, String)> {
    let gsize = out.len() / jobs.len().max(1);
    for (i, j) in jobs.iter().enumerate() {
        lens[i] = inflate_grain(z, &view[j.from..j.to], &mut out[i * gsize..(i + 1) * gsize])
            .map_err(|e| (i, e))?;
    }
    Ok(())
}

/// Half a batch for the helper thread: its grains' zlib streams copied out of the window (the
/// window moves on), and the buffers it inflates them into, sent back with the result.
struct HelperWork {
    input: Vec<u8>,
    /// `input[from..to]` per grain.
    spans: Vec<(usize, usize)>,
    out: Vec<u8>,
    lens: Vec<usize>,
    result: std::result::Result<(), (usize, String)>,
}

/// The inflating helper thread, started once per extent: a thread spawned per batch would start
/// behind every other runnable thread on a busy machine (the scheduler's debit for new tasks),
/// and the batch would wait for it each time.
struct Helper {
    work: SyncSender<HelperWork>,
    done: Receiver<HelperWork>,
    /// The buffers between batches.
    spare: Option<HelperWork>,
}

impl Helper {
    fn spawn<'scope>(scope: &'scope std::thread::Scope<'scope, '_>, gsize: usize) -> Helper {
        let (work, inbox) = sync_channel::<HelperWork>(1);
        let (outbox, done) = sync_channel::<HelperWork>(1);
        scope.spawn(move || {
            let mut z = Decompress::new(true);
            for mut w in inbox {
                let n = w.spans.len();
                w.out.resize(n * gsize, 0);
                w.lens.resize(n, 0);
                w.result = w.spans.iter().enumerate().try_for_each(|(i, &(from, to))| {
                    w.lens[i] = inflate_grain(
                        &mut z,
                        &w.input[from..to],
                        &mut w.out[i * gsize..(i + 1) * gsize],
                    )
                    .map_err(|e| (i, e))?;
                    Ok(())
                });
                if outbox.send(w).is_err() {
                    return;
                }
            }
        });
        Helper {
            work,
            done,
            spare: Some(HelperWork {
                input: Vec::new(),
                spans: Vec::new(),
                out: Vec::new(),
                lens: Vec::new(),
                result: Ok(()),
            }),
        }
    }
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
    /// The calling thread's decoder, kept from grain to grain.
    z: Decompress,
    helper: Helper,
    /// The inflated grains of a batch, and their lengths.
    grains: Vec<u8>,
    lens: Vec<usize>,
    jobs: Vec<Job>,
    batch_max: usize,
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
    std::thread::scope(|scope| {
        let mut c = Converter {
            h,
            out: ExtentWriter::new(sink),
            written: GrainSet::new(h.grains()),
            z: Decompress::new(true),
            helper: Helper::spawn(scope, gsize),
            grains: Vec::new(),
            lens: Vec::new(),
            jobs: Vec::new(),
            batch_max: (BATCH_READS * read_size / gsize).max(2),
        };
        while c.batch(win, read_size)? || c.marker(win)? {}
        let (gs, vsize) = (h.grain_size(), h.virtual_size());
        let Converter {
            mut out, written, ..
        } = c;
        // (Dropping the converter's helper ends its thread.)
        written.gaps(h.grains(), |a, b| out.zero(a * gs, (b * gs).min(vsize)))?;
        out.flush()
    })
}

impl Converter<'_, '_> {
    /// Converts the grains at the window's position whose bytes are all in the next read size,
    /// up to the first other marker; false when there are none.
    fn batch(&mut self, win: &mut Window, read_size: usize) -> Result<bool> {
        let h = self.h;
        let start = win.pos();
        let view = win.peek(read_size)?;
        self.jobs.clear();
        let mut off = 0usize;
        while off + 16 <= view.len() && self.jobs.len() < self.batch_max {
            let at = start + off as u64;
            let Marker::Grain { lba, size } = parse_marker(&view[off..off + 16], at)? else {
                break;
            };
            check_grain(h, at, lba, size)?;
            let to = off + GRAIN_MARKER_LEN + size as usize;
            if to > view.len() {
                break;
            }
            self.jobs.push(Job {
                at,
                from: off + GRAIN_MARKER_LEN,
                to,
                grain: lba / h.granularity,
            });
            off = to.next_multiple_of(SECTOR as usize);
        }
        if self.jobs.is_empty() {
            return Ok(false);
        }
        let gsize = h.grain_size() as usize;
        let n = self.jobs.len();
        let half = if n * gsize >= PARALLEL_MIN { n / 2 } else { n };
        self.grains.resize(half * gsize, 0);
        self.lens.resize(half, 0);
        let (ja, jb) = self.jobs.split_at(half);
        let (oa, la) = (&mut self.grains[..], &mut self.lens[..]);
        let mut grains = Grains {
            h,
            out: &mut self.out,
            written: &mut self.written,
        };
        if jb.is_empty() {
            inflate_jobs(&mut self.z, view, ja, oa, la)
                .map_err(|(i, e)| corrupt_grain(h, &ja[i], &e))?;
            grains.write(ja, oa, la)?;
        } else {
            // The helper inflates the second half while this thread inflates and writes the
            // first, then its grains are written from its own buffer.
            let mut w = self.helper.spare.take().expect("one batch at a time");
            w.input.clear();
            w.spans.clear();
            for j in jb {
                let from = w.input.len();
                w.input.extend_from_slice(&view[j.from..j.to]);
                w.spans.push((from, w.input.len()));
            }
            let lost = || corrupt_grain(h, &jb[0], "the inflating thread stopped");
            self.helper.work.send(w).map_err(|_| lost())?;
            let first = inflate_jobs(&mut self.z, view, ja, oa, la)
                .map_err(|(i, e)| corrupt_grain(h, &ja[i], &e))
                .and_then(|()| grains.write(ja, oa, la));
            // Take the helper's buffers back before anything fails.
            let w = self.helper.done.recv().map_err(|_| lost())?;
            let second = first.and_then(|()| {
                w.result
                    .clone()
                    .map_err(|(i, e)| corrupt_grain(h, &jb[i], &e))
            });
            let written = second.and_then(|()| grains.write(jb, &w.out, &w.lens));
            self.helper.spare = Some(w);
            written?;
        }
        win.consume(off as u64)?;
        Ok(true)
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
                self.grains.resize(h.grain_size() as usize, 0);
                let n = inflate_grain(&mut self.z, &view[job.from..job.to], &mut self.grains)
                    .map_err(|e| corrupt_grain(h, &job, &e))?;
                Grains {
                    h,
                    out: &mut self.out,
                    written: &mut self.written,
                }
                .write(std::slice::from_ref(&job), &self.grains, &[n])?;
                win.consume((job.to as u64).next_multiple_of(SECTOR))?;
            }
        }
        Ok(true)
    }
}
