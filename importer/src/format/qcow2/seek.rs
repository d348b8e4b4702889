//! The random-access converter, for qcow2 images in local files.
//!
//! Where the image can be read at any offset, nothing has to be held: a planner thread walks the
//! L1 and L2 tables in guest order and hands data runs and batches of guest-contiguous compressed
//! clusters to worker threads, which read (and inflate) them in parallel, as `qemu-img convert -W`
//! does; the calling thread writes each piece as it completes (the sink accepts extents in any
//! order). Zero and unallocated clusters are never read.
//!
//! A batch is inflated into one buffer and written as one extent of up to [`RUN_MAX`] bytes: a
//! write per cluster (64 KiB) kept the `O_DIRECT` writer busy with small writes, one at a time,
//! while the inflating threads waited for the writer to take their clusters.
//!
//! Memory: at most [`PIECES`] pieces of up to [`RUN_MAX`] bytes in flight (and a batch's
//! compressed bytes, up to [`SPAN_MAX`], per worker), plus one L2 table, the active L1 table and
//! the set of L2 table places in the planner.

use crate::format::fields::be64;
use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};

use super::Qcow2Stats;
use super::extent::ExtentWriter;
use super::geometry::{ClusterGeometry, Target};
use super::header::Header;
use super::inflate::Inflater;
use super::l2::{self, Compressed, Mapping};
use super::roles::FixedRoles;
use crate::error::{Error, Result};
#[cfg(any(test, feature = "bench"))]
use crate::format::cost::InflateCost;
use crate::sink::ExtentSink;

/// Longest data run one worker reads at once, and most guest bytes of a compressed batch.
const RUN_MAX: u64 = 2 << 20;
/// Most host bytes a compressed batch reads at once (its clusters lie in increasing host order
/// within them, as `qemu-img convert -c` writes them).
const SPAN_MAX: u64 = 2 * RUN_MAX;
/// Pieces queued between the planner, the workers and the writer.
const PIECES: usize = 8;

/// Work for a reader thread.
enum Job {
    /// Host bytes `[host, host + len)` are guest bytes `[guest, guest + len)`.
    Run { guest: u64, host: u64, len: u64 },
    /// A cluster of which only some subclusters are allocated (extended L2 entries).
    Subclusters { target: Target, host: u64 },
    /// Compressed clusters mapping consecutive guest clusters from `guest_cluster` on.
    Compressed {
        guest_cluster: u64,
        clusters: Vec<Compressed>,
    },
}

/// Something ready to write.
enum Piece {
    Zero(u64, u64),
    Data { guest: u64, buf: Vec<u8> },
    Subclusters { target: Target, buf: Vec<u8> },
}

/// What the planner, the workers and the writer share.
struct Shared<'a> {
    file: &'a File,
    file_len: u64,
    g: ClusterGeometry,
    cancel: AtomicBool,
    bytes_read: AtomicU64,
    /// Buffers the writer is done with, for the workers to reuse.
    spare: Mutex<Vec<Vec<u8>>>,
}

impl<'a> Shared<'a> {
    fn new(h: &Header, file: &'a File, file_len: u64) -> Self {
        Shared {
            file,
            file_len,
            g: ClusterGeometry::of(h),
            cancel: AtomicBool::new(false),
            bytes_read: AtomicU64::new(0),
            spare: Mutex::new(Vec::new()),
        }
    }

    fn corrupt(&self, what: String) -> Error {
        Error::Corrupt(format!("qcow2 image: {what}"))
    }

    /// Reads exactly `len` bytes at `offset`; anything past the end of the file is corruption.
    fn read(&self, offset: u64, len: u64, what: &str) -> Result<Vec<u8>> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.file_len)
        {
            return Err(self.corrupt(format!(
                "{what} at {offset:#x} ({len} bytes) lies past the end of the image ({} bytes)",
                self.file_len
            )));
        }
        let mut buf = self.buffer(len as usize);
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| Error::from_read(e, "qcow2 image"))?;
        self.bytes_read.fetch_add(len, Ordering::Relaxed);
        Ok(buf)
    }

    /// A buffer of `len` bytes, for a read or an inflate to fill completely: a reused one keeps
    /// its old bytes (zeroing megabytes per piece only to overwrite them cost as much as a copy).
    fn buffer(&self, len: usize) -> Vec<u8> {
        let mut buf = self
            .spare
            .lock()
            .ok()
            .and_then(|mut s| s.pop())
            .unwrap_or_default();
        buf.resize(len, 0);
        buf
    }

    fn recycle(&self, buf: Vec<u8>) {
        if let Ok(mut s) = self.spare.lock()
            && s.len() < PIECES
        {
            s.push(buf);
        }
    }
}

/// Converts the qcow2 image in `file` (`file_len` bytes, header `h`) into `sink`.
pub(super) fn convert(
    h: &Header,
    file: &File,
    file_len: u64,
    sink: &mut dyn ExtentSink,
) -> Result<Qcow2Stats> {
    let shared = Shared::new(h, file, file_len);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
    let (job_tx, job_rx) = sync_channel::<Job>(PIECES);
    let (piece_tx, piece_rx) = sync_channel::<Result<Piece>>(PIECES);
    let job_rx = Arc::new(Mutex::new(job_rx));
    let written = std::thread::scope(|s| {
        let planner_out = piece_tx.clone();
        let shared = &shared;
        s.spawn(move || {
            if let Err(e) = plan(h, shared, &job_tx, &planner_out) {
                let _ = planner_out.send(Err(e));
            }
        });
        for _ in 0..workers {
            let jobs = job_rx.clone();
            let out = piece_tx.clone();
            s.spawn(move || work(shared, h, &jobs, &out));
        }
        // only the threads hold these now: when they are gone, sends and receives fail
        drop(job_rx);
        drop(piece_tx);
        let written = write(shared, piece_rx, sink);
        // Whatever happened, the other threads stop at their next send.
        shared.cancel.store(true, Ordering::Relaxed);
        written
    });
    written?;
    Ok(Qcow2Stats {
        bytes_read: shared.bytes_read.load(Ordering::Relaxed),
        held_bytes: 0,
        spilled_bytes: 0,
    })
}

#[cfg(any(test, feature = "bench"))]
/// Inflates every compressed cluster of the image in `file` on the calling thread, as the
/// converter's workers do, and measures it.
pub(super) fn inflate_cost(h: &Header, file: &File, file_len: u64) -> Result<InflateCost> {
    let shared = Shared::new(h, file, file_len);
    let (job_tx, job_rx) = sync_channel::<Job>(PIECES);
    let (piece_tx, piece_rx) = sync_channel::<Result<Piece>>(PIECES);
    std::thread::scope(|s| {
        let shared = &shared;
        s.spawn(move || {
            if let Err(e) = plan(h, shared, &job_tx, &piece_tx) {
                let _ = piece_tx.send(Err(e));
            }
        });
        // Zero ranges, and the planner's error, arrive as pieces.
        let planned = s.spawn(move || piece_rx.into_iter().find_map(Result::err));
        let measured = measure_inflating(shared, h, job_rx);
        shared.cancel.store(true, Ordering::Relaxed);
        // A failed inflate stops the planner, which then reports that: the inflate's error
        // comes first.
        let planned = planned.join();
        match (measured, planned) {
            (Ok(_), Ok(Some(e))) => Err(e),
            (measured, _) => measured,
        }
    })
}

#[cfg(any(test, feature = "bench"))]
/// The inflating of [`inflate_cost`]: takes the planner's jobs until there are none (returning
/// drops `jobs`, which stops the planner after an error).
fn measure_inflating(shared: &Shared<'_>, h: &Header, jobs: Receiver<Job>) -> Result<InflateCost> {
    let mut inflater = Inflater::new(h.compression);
    let mut cost = InflateCost::default();
    for job in jobs {
        let (guest_cluster, clusters) = match job {
            Job::Compressed {
                guest_cluster,
                clusters,
            } => (guest_cluster, clusters),
            // Written as read: only the phased bound's stretches count them.
            Job::Run { len, .. } => {
                cost.stored(len);
                continue;
            }
            Job::Subclusters { .. } => {
                cost.stored(shared.g.cluster_size);
                continue;
            }
        };
        let src = read_batch(shared, &clusters)?;
        let out = cost.measure(clusters.len() as u64, src.bytes.len(), || {
            let out = inflate_batch(shared, &mut inflater, guest_cluster, &clusters, &src)?;
            let len = out.len();
            Ok((out, len))
        })?;
        shared.recycle(src.bytes);
        shared.recycle(out);
    }
    Ok(cost)
}

/// Writes pieces until every other thread is done; the receiver is dropped on return, which
/// stops them after an error.
fn write(
    shared: &Shared<'_>,
    pieces: Receiver<Result<Piece>>,
    sink: &mut dyn ExtentSink,
) -> Result<()> {
    let mut out = ExtentWriter::new(sink);
    for piece in pieces {
        match piece? {
            Piece::Zero(start, end) => out.zero(start, end)?,
            Piece::Data { guest, buf } => {
                out.data(guest, &buf)?;
                shared.recycle(buf);
            }
            Piece::Subclusters { target, buf } => {
                out.guest_cluster(&shared.g, target, &buf)?;
                shared.recycle(buf);
            }
        }
    }
    out.flush()
}

/// The reader threads: take jobs until there are none, or the writer stopped.
fn work(
    shared: &Shared<'_>,
    h: &Header,
    jobs: &Mutex<Receiver<Job>>,
    out: &SyncSender<Result<Piece>>,
) {
    let g = shared.g;
    let mut inflater = Inflater::new(h.compression);
    crate::pipe::lower_priority();
    loop {
        let job = match jobs.lock() {
            Ok(rx) => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
            Err(_) => return,
        };
        let piece = match job {
            Job::Run { guest, host, len } => shared
                .read(host, len, "data cluster")
                .map(|buf| Piece::Data { guest, buf }),
            Job::Subclusters { target, host } => shared
                .read(host, g.needed_len(target), "data cluster")
                .map(|buf| Piece::Subclusters { target, buf }),
            Job::Compressed {
                guest_cluster,
                clusters,
            } => read_batch(shared, &clusters).and_then(|src| {
                let buf = inflate_batch(shared, &mut inflater, guest_cluster, &clusters, &src)?;
                shared.recycle(src.bytes);
                Ok(Piece::Data {
                    guest: guest_cluster << g.cluster_bits,
                    buf,
                })
            }),
        };
        if out.send(piece).is_err() {
            return;
        }
    }
}

/// The host bytes of a compressed batch: `[start, start + bytes.len())` of the image.
struct Span {
    start: u64,
    bytes: Vec<u8>,
}

/// Reads the host span of a batch (the planner keeps it within [`SPAN_MAX`]). Bytes past the end
/// of the file read as zeroes, as in qemu (the last compressed cluster of an image may end
/// mid-sector).
fn read_batch(shared: &Shared<'_>, clusters: &[Compressed]) -> Result<Span> {
    if let Some(c) = clusters.iter().find(|c| c.offset >= shared.file_len) {
        return Err(shared.corrupt(format!(
            "compressed cluster at {:#x} lies past the end of the image",
            c.offset
        )));
    }
    let start = clusters.first().map_or(0, |c| c.offset);
    let end = clusters.iter().map(Compressed::end).max().unwrap_or(start);
    let mut bytes = shared.read(
        start,
        end.min(shared.file_len) - start,
        "compressed cluster",
    )?;
    bytes.resize((end - start) as usize, 0);
    Ok(Span { start, bytes })
}

/// Inflates a batch read by [`read_batch`] into one buffer of guest bytes (cut at the virtual
/// size).
fn inflate_batch(
    shared: &Shared<'_>,
    inflater: &mut Inflater,
    guest_cluster: u64,
    clusters: &[Compressed],
    src: &Span,
) -> Result<Vec<u8>> {
    let g = shared.g;
    let cs = g.cluster_size as usize;
    let mut dst = shared.buffer(clusters.len() * cs);
    for ((i, c), out) in (0u64..).zip(clusters).zip(dst.chunks_exact_mut(cs)) {
        let from = (c.offset - src.start) as usize;
        inflater
            .inflate(&src.bytes[from..from + c.len as usize], out)
            .map_err(|e| {
                shared.corrupt(format!(
                    "compressed cluster at {:#x} (guest offset {:#x}): {e}",
                    c.offset,
                    (guest_cluster + i) << g.cluster_bits
                ))
            })?;
    }
    let goff = guest_cluster << g.cluster_bits;
    dst.truncate(dst.len().min((g.virtual_size - goff) as usize));
    Ok(dst)
}

/// The planner's pending output: zero ranges, data runs and compressed batches grow while they
/// stay contiguous.
struct Planner<'a> {
    jobs: &'a SyncSender<Job>,
    pieces: &'a SyncSender<Result<Piece>>,
    g: ClusterGeometry,
    zero: Option<(u64, u64)>,
    run: Option<(u64, u64, u64)>,
    /// First guest cluster and the compressed clusters from there on.
    batch: Option<(u64, Vec<Compressed>)>,
}

impl Planner<'_> {
    fn stopped() -> Error {
        Error::io(
            "qcow2 conversion",
            std::io::Error::other("the writer stopped"),
        )
    }

    fn job(&mut self, job: Job) -> Result<()> {
        self.jobs.send(job).map_err(|_| Self::stopped())
    }

    fn zero(&mut self, start: u64, end: u64) -> Result<()> {
        self.flush_run()?;
        self.flush_batch()?;
        match &mut self.zero {
            Some((_, e)) if *e == start => *e = end,
            _ => {
                self.flush_zero()?;
                self.zero = Some((start, end));
            }
        }
        Ok(())
    }

    fn data(&mut self, guest: u64, host: u64, len: u64) -> Result<()> {
        self.flush_zero()?;
        self.flush_batch()?;
        match &mut self.run {
            Some((g, h, l)) if *g + *l == guest && *h + *l == host && *l + len <= RUN_MAX => {
                *l += len;
            }
            _ => {
                self.flush_run()?;
                self.run = Some((guest, host, len));
            }
        }
        Ok(())
    }

    fn compressed(&mut self, guest_cluster: u64, c: Compressed) -> Result<()> {
        self.flush_zero()?;
        self.flush_run()?;
        let max_clusters = (RUN_MAX >> self.g.cluster_bits).max(1) as usize;
        match &mut self.batch {
            Some((first, clusters))
                if *first + clusters.len() as u64 == guest_cluster
                    && clusters.len() < max_clusters
                    && clusters.last().is_some_and(|last| c.offset >= last.offset)
                    && c.end() <= clusters[0].offset + SPAN_MAX =>
            {
                clusters.push(c);
            }
            _ => {
                self.flush_batch()?;
                self.batch = Some((guest_cluster, vec![c]));
            }
        }
        Ok(())
    }

    fn other(&mut self, job: Job) -> Result<()> {
        self.flush_zero()?;
        self.flush_run()?;
        self.flush_batch()?;
        self.job(job)
    }

    fn flush_batch(&mut self) -> Result<()> {
        if let Some((guest_cluster, clusters)) = self.batch.take() {
            self.job(Job::Compressed {
                guest_cluster,
                clusters,
            })?;
        }
        Ok(())
    }

    fn flush_zero(&mut self) -> Result<()> {
        if let Some((s, e)) = self.zero.take() {
            self.pieces
                .send(Ok(Piece::Zero(s, e)))
                .map_err(|_| Self::stopped())?;
        }
        Ok(())
    }

    fn flush_run(&mut self) -> Result<()> {
        if let Some((guest, host, len)) = self.run.take() {
            self.job(Job::Run { guest, host, len })?;
        }
        Ok(())
    }
}

/// Walks the active L1 table and its L2 tables in guest order.
fn plan(
    h: &Header,
    shared: &Shared<'_>,
    jobs: &SyncSender<Job>,
    pieces: &SyncSender<Result<Piece>>,
) -> Result<()> {
    let g = shared.g;
    let mut p = Planner {
        jobs,
        pieces,
        g,
        zero: None,
        run: None,
        batch: None,
    };
    // The whole active L1 table first (capped at 32 MiB by the header check), so that every L2
    // table's place is known before any data is: guest data placed on an L2 table (or on the
    // header, the L1 or the refcount table) is refused as the streaming converter refuses it.
    let roles = FixedRoles::of(h);
    let l1_needed = h.l1_entries_needed();
    let l1 = shared.read(h.l1_offset, l1_needed * 8, "L1 table")?;
    let mut tables = Vec::with_capacity(l1_needed as usize);
    for index in 0..l1_needed {
        let raw = be64(&l1, (index * 8) as usize);
        let table = l2::l1_entry(raw, g.cluster_bits)
            .map_err(|e| shared.corrupt(format!("L1 entry {index}: {e}")))?;
        if let Some(off) = table
            && let Some(role) = roles.of_cluster(off >> g.cluster_bits)
        {
            return Err(shared.corrupt(format!(
                "L1 entry {index} puts an L2 table at {off:#x}, inside {role}"
            )));
        }
        tables.push(table);
    }
    let l2_clusters: BTreeSet<u64> = tables
        .iter()
        .flatten()
        .map(|&t| t >> g.cluster_bits)
        .collect();
    let data_role = |host: u64, table: u64| {
        let cluster = host >> g.cluster_bits;
        if cluster == table >> g.cluster_bits {
            Some("the L2 table that maps it")
        } else if l2_clusters.contains(&cluster) {
            Some("an L2 table")
        } else {
            roles.of_cluster(cluster)
        }
    };
    let mut mappings = Vec::new();
    for (index, table) in (0u64..).zip(tables) {
        if shared.cancel.load(Ordering::Relaxed) {
            return Ok(());
        }
        let g0 = index * g.l2_entries;
        let g_end = ((g0 + g.l2_entries) << g.cluster_bits).min(g.virtual_size);
        let Some(table) = table else {
            p.zero(g0 << g.cluster_bits, g_end)?;
            continue;
        };
        let bytes = shared.read(table, g.cluster_size, "L2 table")?;
        l2::decode_table(&bytes, &g, index, table, &mut mappings)?;
        shared.recycle(bytes);
        for &(gc, m) in &mappings {
            let goff = gc << g.cluster_bits;
            let glen = g.cluster_size.min(g.virtual_size - goff);
            let role = match m {
                Mapping::Data { host, .. } => data_role(host, table),
                Mapping::Compressed(c) => roles.overlapping(c.offset, c.end()).or_else(|| {
                    (c.offset < table + g.cluster_size && c.end() > table)
                        .then_some("the L2 table that maps it")
                }),
                Mapping::Zero => None,
            };
            if let Some(role) = role {
                return Err(shared.corrupt(format!(
                    "guest offset {goff:#x} maps to host data inside {role}"
                )));
            }
            match m {
                Mapping::Zero => p.zero(goff, goff + glen)?,
                Mapping::Data { host, data_mask } if data_mask == g.full_mask => {
                    p.data(goff, host, glen)?
                }
                Mapping::Data { host, data_mask } => p.other(Job::Subclusters {
                    target: Target {
                        guest_cluster: gc,
                        mask: data_mask,
                    },
                    host,
                })?,
                Mapping::Compressed(c) => p.compressed(gc, c)?,
            }
        }
    }
    p.flush_zero()?;
    p.flush_run()?;
    p.flush_batch()
}
