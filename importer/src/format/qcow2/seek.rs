//! The random-access converter, for qcow2 images in local files.
//!
//! Where the image can be read at any offset, nothing has to be held: a planner thread walks the
//! L1 and L2 tables in guest order and hands data runs and compressed clusters to worker threads,
//! which read (and inflate) them in parallel, as `qemu-img convert -W` does; the calling thread
//! writes each piece as it completes (the sink accepts extents in any order). Zero and
//! unallocated clusters are never read.
//!
//! Memory: at most [`PIECES`] pieces of up to [`RUN_MAX`] bytes in flight, plus one L2 table, the
//! active L1 table and the set of L2 table places in the planner.

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
use crate::sink::ExtentSink;

/// Longest data run one worker reads at once.
const RUN_MAX: u64 = 2 << 20;
/// Pieces queued between the planner, the workers and the writer.
const PIECES: usize = 8;

/// Work for a reader thread.
enum Job {
    /// Host bytes `[host, host + len)` are guest bytes `[guest, guest + len)`.
    Run { guest: u64, host: u64, len: u64 },
    /// A cluster of which only some subclusters are allocated (extended L2 entries).
    Subclusters { target: Target, host: u64 },
    /// A compressed cluster.
    Compressed { guest_cluster: u64, c: Compressed },
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

impl Shared<'_> {
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

    fn buffer(&self, len: usize) -> Vec<u8> {
        let mut buf = self
            .spare
            .lock()
            .ok()
            .and_then(|mut s| s.pop())
            .unwrap_or_default();
        buf.clear();
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
    let shared = Shared {
        file,
        file_len,
        g: ClusterGeometry::of(h),
        cancel: AtomicBool::new(false),
        bytes_read: AtomicU64::new(0),
        spare: Mutex::new(Vec::new()),
    };
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
            Job::Compressed { guest_cluster, c } => {
                inflate(shared, &mut inflater, guest_cluster, c)
            }
        };
        if out.send(piece).is_err() {
            return;
        }
    }
}

/// Reads and inflates one compressed cluster. Bytes past the end of the file read as zeroes, as
/// in qemu (the last compressed cluster of an image may end mid-sector).
fn inflate(
    shared: &Shared<'_>,
    inflater: &mut Inflater,
    guest_cluster: u64,
    c: Compressed,
) -> Result<Piece> {
    let g = shared.g;
    if c.offset >= shared.file_len {
        return Err(shared.corrupt(format!(
            "compressed cluster at {:#x} lies past the end of the image",
            c.offset
        )));
    }
    let avail = c.len.min(shared.file_len - c.offset);
    let mut src = shared.read(c.offset, avail, "compressed cluster")?;
    src.resize(c.len as usize, 0);
    let mut dst = shared.buffer(g.cluster_size as usize);
    let goff = guest_cluster << g.cluster_bits;
    inflater.inflate(&src, &mut dst).map_err(|e| {
        shared.corrupt(format!(
            "compressed cluster at {:#x} (guest offset {goff:#x}): {e}",
            c.offset
        ))
    })?;
    shared.recycle(src);
    dst.truncate(g.cluster_size.min(g.virtual_size - goff) as usize);
    Ok(Piece::Data {
        guest: goff,
        buf: dst,
    })
}

/// The planner's pending output: zero ranges and data runs grow while they stay contiguous.
struct Planner<'a> {
    jobs: &'a SyncSender<Job>,
    pieces: &'a SyncSender<Result<Piece>>,
    zero: Option<(u64, u64)>,
    run: Option<(u64, u64, u64)>,
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

    fn other(&mut self, job: Job) -> Result<()> {
        self.flush_zero()?;
        self.flush_run()?;
        self.job(job)
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
        zero: None,
        run: None,
    };
    // The whole active L1 table first (capped at 32 MiB by the header check), so that every L2
    // table's place is known before any data is: guest data placed on an L2 table (or on the
    // header, the L1 or the refcount table) is refused as the streaming converter refuses it.
    let roles = FixedRoles::of(h);
    let l1_needed = h.l1_entries_needed();
    let l1 = shared.read(h.l1_offset, l1_needed * 8, "L1 table")?;
    let mut tables = Vec::with_capacity(l1_needed as usize);
    for index in 0..l1_needed {
        let raw = super::be64(&l1, (index * 8) as usize);
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
                Mapping::Compressed(c) => p.other(Job::Compressed {
                    guest_cluster: gc,
                    c,
                })?,
            }
        }
    }
    p.flush_zero()?;
    p.flush_run()
}
