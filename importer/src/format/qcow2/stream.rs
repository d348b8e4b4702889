//! The single-pass streaming converter.
//!
//! The image is read front to back once, in large chunks, and never seeks. Each host cluster is
//! dispatched as it passes, by what is known about it at that moment:
//!
//! - the header cluster, the refcount table and the L1 table have roles known from the header
//!   (the L1 table is collected and, once complete, tells where the L2 tables are);
//! - an L2 table is parsed when it passes: it reports its zero and unallocated clusters at once and
//!   registers where its data clusters and compressed clusters are;
//! - a data cluster whose mapping is known is written to the sink as it passes (contiguous runs in
//!   one call); compressed clusters are inflated once all their bytes are in the read window;
//! - a cluster whose role is still unknown is *held* (memory up to the budget, then an unlinked
//!   temp file): an L2 table (or the L1 table) arriving later may map it, and then it is written
//!   from the hold and freed. Once every L2 table of the active L1 has passed, nothing unknown can
//!   become needed, so the hold is dropped and unknown clusters are skipped.
//!
//! Within a cluster that holds compressed data, the bytes outside the registered compressed
//! clusters are held too, and so is the last 512-byte sector of each (descriptors are rounded up
//! to sectors, so another compressed cluster mapped by a later L2 table may begin in it).
//!
//! A host cluster used in two exclusive roles (header, L1, refcount table, L2 table, data), a
//! mapping to something that has already passed and was not held, and anything needed that lies
//! past the end of the stream are corruption. Shared data clusters (several guest clusters mapping
//! one host cluster) are written to every guest cluster as long as all mappings are known when the
//! cluster passes.
//!
//! Memory: a read window of [`ReaderOptions::read_ahead`] plus up to three clusters, the L1 table (capped at 32 MiB),
//! one map entry per pending L2 table / data cluster / compressed cluster (that is, bounded by the
//! L2 tables seen), the hold's memory budget, and the [`InflatePool`]'s batches of compressed
//! clusters in flight. Work is proportional to the stream length plus the
//! number of guest clusters (the caller checks the virtual size against the target first).

use crate::format::fields::be64;
use std::collections::BTreeMap;
use std::io::{self, Read};

use super::extent::ExtentWriter;
use super::geometry::{ClusterGeometry, Target};
use super::header::{Compression, Header};
use super::inflate::Inflater;
use super::l2::{self, Mapping, SECTOR};
use super::roles::FixedRoles;
use crate::error::{Error, Result};
use crate::format::ReaderOptions;
use crate::format::hold::HeldBytes;
use crate::format::inflate_pool::{Batch, InflatePool};
use crate::sink::ExtentSink;

/// What a conversion did, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Qcow2Stats {
    /// Bytes of the image read (the conversion stops once every guest byte is reported).
    pub bytes_read: u64,
    /// Bytes held because they passed before their role was known.
    pub held_bytes: u64,
    /// Of those, bytes that went to the spill file.
    pub spilled_bytes: u64,
}

enum Targets {
    One(Target),
    Many(Vec<Target>),
}

struct CompressedNeed {
    end: u64,
    guest_cluster: u64,
}

pub(crate) struct Stream<'s> {
    g: ClusterGeometry,
    l1_offset: u64,
    reader: Box<dyn Read + Send>,
    buf: Vec<u8>,
    buf_len: usize,
    buf_start: u64,
    /// How far past `pos` the window reads.
    read_ahead: usize,
    eof: bool,
    /// Stream offset of the next cluster to dispatch.
    pos: u64,
    /// Cluster index ranges with roles from the header.
    roles: FixedRoles,
    /// Byte range of the L1 entries that map the disk.
    l1_bytes: (u64, u64),
    l1: Vec<u8>,
    l1_done: bool,
    /// Host cluster -> the L1 entries that point at it.
    pending_l2: BTreeMap<u64, Vec<u32>>,
    /// Host cluster -> the guest clusters that read it.
    data: BTreeMap<u64, Targets>,
    /// (start, sequence) -> compressed cluster.
    compressed: BTreeMap<(u64, u64), CompressedNeed>,
    seq: u64,
    holding: bool,
    hold: HeldBytes,
    /// Held ranges to free once the L2 table being processed is done.
    release: Vec<(u64, u64)>,
    out: ExtentWriter<'s>,
    /// Pending contiguous data write: guest offset, window offset, length.
    run: (u64, usize, usize),
    /// Inflates held compressed clusters (on this thread).
    inflater: Inflater,
    compression: Compression,
    /// Inflates the compressed clusters that pass, started at the first.
    pool: Option<InflatePool<Job>>,
    /// A batch of compressed clusters failed (corrupt, or the write): the batches in flight
    /// after it are not written.
    batch_failed: bool,
    cluster_buf: Vec<u8>,
    scratch: Vec<u8>,
    table_buf: Vec<u8>,
    mappings: Vec<(u64, Mapping)>,
    ready: Vec<(u64, u64)>,
}

impl<'s> Stream<'s> {
    pub fn new(
        h: &Header,
        head: Vec<u8>,
        reader: Box<dyn Read + Send>,
        opts: &ReaderOptions,
        sink: &'s mut dyn ExtentSink,
    ) -> Stream<'s> {
        let g = ClusterGeometry::of(h);
        let cs = g.cluster_size;
        let l1_needed = h.l1_entries_needed();
        let head_len = head.len();
        Stream {
            g,
            l1_offset: h.l1_offset,
            reader,
            buf: head,
            buf_len: head_len,
            buf_start: 0,
            // a whole cluster must fit past `pos`, and the next can be read while it is handled
            read_ahead: opts.read_ahead.max(2 * cs as usize),
            eof: false,
            pos: 0,
            roles: FixedRoles::of(h),
            l1_bytes: (h.l1_offset, h.l1_offset + l1_needed * 8),
            l1: Vec::new(),
            l1_done: l1_needed == 0,
            pending_l2: BTreeMap::new(),
            data: BTreeMap::new(),
            compressed: BTreeMap::new(),
            seq: 0,
            holding: l1_needed != 0,
            hold: HeldBytes::new(opts.memory_budget, opts.spill_dir.clone()),
            release: Vec::new(),
            out: ExtentWriter::new(sink),
            run: (0, 0, 0),
            inflater: Inflater::new(h.compression),
            compression: h.compression,
            pool: None,
            batch_failed: false,
            cluster_buf: vec![0; cs as usize],
            scratch: Vec::new(),
            table_buf: Vec::new(),
            mappings: Vec::new(),
            ready: Vec::new(),
        }
    }

    pub fn run(mut self) -> Result<Qcow2Stats> {
        let read = self.read();
        // A problem met reading lies past every compressed cluster in flight: those are written
        // (or found corrupt) first, as one thread reading in order would have.
        if read.is_ok() || !self.batch_failed {
            while let Some(done) = self
                .pool
                .as_mut()
                .map(|p| p.next_done())
                .transpose()?
                .flatten()
            {
                self.write_batch(done)?;
            }
        }
        read?;
        self.out.flush()?;
        Ok(Qcow2Stats {
            bytes_read: self.buf_end(),
            held_bytes: self.hold.held_bytes,
            spilled_bytes: self.hold.spilled_bytes,
        })
    }

    /// Reads the stream to its end, handing compressed clusters to the pool.
    fn read(&mut self) -> Result<()> {
        while !self.done() {
            self.fill()?;
            let end = self.buf_end();
            while self.pos < end
                && (self.pos + self.g.cluster_size <= end || self.eof)
                && !self.done()
            {
                self.cluster()?;
            }
            self.flush_run()?;
            self.compressed_ready()?;
            if !self.done() && self.eof {
                return Err(self.truncated());
            }
        }
        self.flush_run()
    }

    fn buf_end(&self) -> u64 {
        self.buf_start + self.buf_len as u64
    }

    fn done(&self) -> bool {
        self.l1_done
            && self.pending_l2.is_empty()
            && self.data.is_empty()
            && self.compressed.is_empty()
    }

    fn corrupt(&self, msg: String) -> Error {
        Error::Corrupt(format!("qcow2: {msg}"))
    }

    fn truncated(&self) -> Error {
        let cb = self.g.cluster_bits;
        let what = if !self.l1_done {
            format!("the L1 table at {:#x}", self.l1_offset)
        } else if let Some((h, l1s)) = self.pending_l2.first_key_value() {
            format!("the L2 table at {:#x} (L1 entry {})", h << cb, l1s[0])
        } else if let Some((h, t)) = self.data.first_key_value() {
            let g = match t {
                Targets::One(t) => t.guest_cluster,
                Targets::Many(v) => v[0].guest_cluster,
            };
            format!(
                "the data cluster at {:#x} (guest offset {:#x})",
                h << cb,
                g << cb
            )
        } else if let Some(((s, _), n)) = self.compressed.first_key_value() {
            format!(
                "the compressed cluster at {s:#x} (guest offset {:#x})",
                n.guest_cluster << cb
            )
        } else {
            "data".to_string()
        };
        self.corrupt(format!(
            "truncated: {what} is past the end of the image ({} bytes)",
            self.buf_end()
        ))
    }

    /// Drops what the window no longer needs and reads until it reaches `read_ahead` past `pos`.
    fn fill(&mut self) -> Result<()> {
        self.flush_run()?;
        let mut keep = self.pos.min(self.buf_end());
        if let Some((&(s, _), _)) = self.compressed.first_key_value() {
            keep = keep.min(s);
        }
        let keep = keep.max(self.buf_start);
        let drop = (keep - self.buf_start) as usize;
        if drop > 0 {
            self.buf.copy_within(drop..self.buf_len, 0);
            self.buf_len -= drop;
            self.buf_start = keep;
        }
        let want = (self.pos.max(self.buf_start) - self.buf_start) as usize + self.read_ahead;
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        while !self.eof && self.buf_len < want {
            match self.reader.read(&mut self.buf[self.buf_len..want]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf_len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::from_read(e, "qcow2 image")),
            }
        }
        Ok(())
    }

    fn flush_run(&mut self) -> Result<()> {
        let (guest, at, len) = self.run;
        if len > 0 {
            self.run.2 = 0;
            self.out.data(guest, &self.buf[at..at + len])?;
        }
        Ok(())
    }

    /// Dispatches the cluster at `pos` (partial only at the end of the stream).
    fn cluster(&mut self) -> Result<()> {
        let c = self.pos;
        let ci = c >> self.g.cluster_bits;
        let lo = (c - self.buf_start) as usize;
        let hi = (lo + self.g.cluster_size as usize).min(self.buf_len);
        let full = hi - lo == self.g.cluster_size as usize;
        if ci == 0 {
            // The header, parsed already.
        } else if (self.roles.l1.0..self.roles.l1.1).contains(&ci) {
            let (bs, be) = self.l1_bytes;
            let s = c.max(bs);
            let e = (c + (hi - lo) as u64).min(be);
            if s < e {
                let from = lo + (s - c) as usize;
                self.l1
                    .extend_from_slice(&self.buf[from..from + (e - s) as usize]);
            }
            if !self.l1_done && self.l1.len() as u64 == be - bs {
                self.finish_l1(ci)?;
            }
        } else if (self.roles.refcount_table.0..self.roles.refcount_table.1).contains(&ci) {
            // Refcounts do not matter for reading.
        } else if let Some(l1s) = self.pending_l2.get(&ci) {
            if !full {
                return Err(self.truncated());
            }
            let l1s = l1s.clone();
            for i in l1s {
                l2::decode_table(
                    &self.buf[lo..hi],
                    &self.g,
                    u64::from(i),
                    c,
                    &mut self.mappings,
                )?;
                self.register_mappings(ci, ci)?;
            }
            self.pending_l2.remove(&ci);
            self.flush_release();
            self.maybe_stop_holding();
        } else if let Some(targets) = self.data.remove(&ci) {
            // qemu reads past the end of the file as zeroes, and writes only the subclusters it
            // allocates: the cluster may end early, but not before the bytes the guest reads.
            let needed = match &targets {
                Targets::One(t) => self.g.needed_len(*t),
                Targets::Many(v) => v.iter().map(|t| self.g.needed_len(*t)).max().unwrap_or(0),
            };
            if ((hi - lo) as u64) < needed {
                self.data.insert(ci, targets);
                return Err(self.truncated());
            }
            match targets {
                Targets::One(t) if t.mask == self.g.full_mask => {
                    let goff = t.guest_cluster << self.g.cluster_bits;
                    let glen = (self.g.cluster_size.min(self.g.virtual_size - goff)) as usize;
                    let (rg, ro, rl) = self.run;
                    if rl > 0
                        && (rl as u64).is_multiple_of(self.g.cluster_size)
                        && rg + rl as u64 == goff
                        && ro + rl == lo
                    {
                        self.run.2 += glen;
                    } else {
                        self.flush_run()?;
                        self.run = (goff, lo, glen);
                    }
                }
                Targets::One(t) => self.out.guest_cluster(&self.g, t, &self.buf[lo..hi])?,
                Targets::Many(v) => {
                    for t in v {
                        self.out.guest_cluster(&self.g, t, &self.buf[lo..hi])?;
                    }
                }
            }
        } else if self.holding {
            self.hold_cluster(c, lo, hi)?;
        }
        self.pos = c + self.g.cluster_size;
        Ok(())
    }

    /// Holds the parts of a cluster of unknown role that no registered compressed cluster owns.
    fn hold_cluster(&mut self, c: u64, lo: usize, hi: usize) -> Result<()> {
        let cend = c + (hi - lo) as u64;
        let lower = c.saturating_sub(l2::max_compressed_len(self.g.cluster_bits));
        let mut covered = c;
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        for (&(s, _), n) in self.compressed.range((lower, 0)..(cend, 0)) {
            // Everything but the last sector belongs to this compressed cluster alone.
            let owned_end = if n.end - s > SECTOR {
                n.end - SECTOR
            } else {
                s
            };
            let a = s.max(c);
            let b = owned_end.min(cend);
            if b <= a {
                continue;
            }
            if a > covered {
                pieces.push((covered, a));
            }
            covered = covered.max(b);
        }
        if covered < cend {
            pieces.push((covered, cend));
        }
        for (a, b) in pieces {
            let from = lo + (a - c) as usize;
            self.hold.add(a, &self.buf[from..from + (b - a) as usize])?;
        }
        Ok(())
    }

    fn finish_l1(&mut self, ci: u64) -> Result<()> {
        self.l1_done = true;
        let l1 = std::mem::take(&mut self.l1);
        let cb = self.g.cluster_bits;
        for (i, e) in l1.chunks_exact(8).enumerate() {
            let raw = be64(e, 0);
            match l2::l1_entry(raw, cb) {
                Err(m) => return Err(self.corrupt(format!("L1 entry {i}: {m}"))),
                Ok(None) => {
                    let span = self.g.l2_entries << cb;
                    let start = i as u64 * span;
                    self.out
                        .zero(start, (start + span).min(self.g.virtual_size))?;
                }
                Ok(Some(off)) => {
                    let h = off >> cb;
                    if let Some(role) = self.roles.of_cluster(h) {
                        return Err(self.corrupt(format!(
                            "L1 entry {i} puts an L2 table at {off:#x}, inside {role}"
                        )));
                    }
                    self.pending_l2.entry(h).or_default().push(i as u32);
                }
            }
        }
        // L2 tables that passed before the L1 table come from the hold.
        let passed: Vec<u64> = self.pending_l2.range(..ci).map(|(&h, _)| h).collect();
        for h in passed {
            let mut bytes = std::mem::take(&mut self.table_buf);
            if !self.hold.read(h << cb, self.g.cluster_size, &mut bytes)? {
                let i = self.pending_l2[&h][0];
                return Err(self.corrupt(format!(
                    "L1 entry {i} puts an L2 table at {:#x}, a cluster already used for something else",
                    h << cb
                )));
            }
            let l1s = self.pending_l2[&h].clone();
            for i in l1s {
                l2::decode_table(&bytes, &self.g, u64::from(i), h << cb, &mut self.mappings)?;
                self.register_mappings(h, ci)?;
            }
            self.table_buf = bytes;
            self.pending_l2.remove(&h);
            self.release.push((h << cb, (h + 1) << cb));
            self.flush_release();
        }
        self.maybe_stop_holding();
        Ok(())
    }

    fn maybe_stop_holding(&mut self) {
        if self.holding && self.l1_done && self.pending_l2.is_empty() {
            self.holding = false;
            self.hold.clear();
        }
    }

    fn flush_release(&mut self) {
        for (a, b) in self.release.drain(..) {
            self.hold.release(a, b);
        }
    }

    /// Registers what `self.mappings` (decoded from the L2 table in host cluster `table`) maps.
    /// `cur` is the cluster being dispatched: everything before it has passed.
    fn register_mappings(&mut self, table: u64, cur: u64) -> Result<()> {
        let maps = std::mem::take(&mut self.mappings);
        let r = maps
            .iter()
            .try_for_each(|&(g, m)| self.register(g, m, table, cur));
        self.mappings = maps;
        r
    }

    fn register(&mut self, gc: u64, m: Mapping, table: u64, cur: u64) -> Result<()> {
        let g = self.g;
        let goff = gc << g.cluster_bits;
        match m {
            Mapping::Zero => self
                .out
                .zero(goff, (goff + g.cluster_size).min(g.virtual_size)),
            Mapping::Data { host, data_mask } => {
                let h = host >> g.cluster_bits;
                let role = if h == table {
                    Some("the L2 table that maps it")
                } else if self.pending_l2.contains_key(&h) {
                    Some("an L2 table")
                } else {
                    self.roles.of_cluster(h)
                };
                if let Some(role) = role {
                    return Err(self.corrupt(format!(
                        "guest offset {goff:#x} maps to host cluster {host:#x}, which is {role}"
                    )));
                }
                let t = Target {
                    guest_cluster: gc,
                    mask: data_mask,
                };
                if h < cur {
                    if !self.hold.read(host, g.cluster_size, &mut self.scratch)? {
                        return Err(self.passed(goff, host));
                    }
                    self.out.guest_cluster(&g, t, &self.scratch)?;
                    self.release.push((host, host + g.cluster_size));
                } else {
                    match self.data.get_mut(&h) {
                        None => {
                            self.data.insert(h, Targets::One(t));
                        }
                        Some(Targets::One(first)) => {
                            let first = *first;
                            self.data.insert(h, Targets::Many(vec![first, t]));
                        }
                        Some(Targets::Many(v)) => v.push(t),
                    }
                }
                Ok(())
            }
            Mapping::Compressed(c) => {
                let end = c.end();
                let overlaps = |(a, b): (u64, u64)| {
                    a < b && c.offset < b << g.cluster_bits && end > a << g.cluster_bits
                };
                let role = self.roles.overlapping(c.offset, end).or_else(|| {
                    (overlaps((table, table + 1)) || overlaps((cur, cur + 1)))
                        .then_some("the L2 table that maps it")
                });
                if let Some(role) = role {
                    return Err(self.corrupt(format!(
                        "guest offset {goff:#x} maps to compressed data at {:#x}..{end:#x}, which overlaps {role}",
                        c.offset
                    )));
                }
                if end <= cur << g.cluster_bits {
                    if !self.hold.read(c.offset, c.len, &mut self.scratch)? {
                        return Err(self.passed(goff, c.offset));
                    }
                    self.inflater
                        .inflate(&self.scratch, &mut self.cluster_buf)
                        .map_err(|e| {
                            Error::Corrupt(format!(
                                "qcow2: compressed cluster at {:#x} (guest offset {goff:#x}): {e}",
                                c.offset
                            ))
                        })?;
                    let t = Target {
                        guest_cluster: gc,
                        mask: g.full_mask,
                    };
                    self.out.guest_cluster(&g, t, &self.cluster_buf)?;
                    let owned_end = if c.len > SECTOR {
                        end - SECTOR
                    } else {
                        c.offset
                    };
                    self.release.push((c.offset, owned_end));
                } else {
                    self.compressed.insert(
                        (c.offset, self.seq),
                        CompressedNeed {
                            end,
                            guest_cluster: gc,
                        },
                    );
                    self.seq += 1;
                }
                Ok(())
            }
        }
    }

    fn passed(&self, goff: u64, host: u64) -> Error {
        self.corrupt(format!(
            "guest offset {goff:#x} maps to host offset {host:#x}, which already passed as \
             metadata or as another guest cluster's data (a single streaming pass cannot go back)"
        ))
    }

    /// Hands the compressed clusters whose bytes are all in the window to the pool, in batches,
    /// and writes the batches that come back.
    fn compressed_ready(&mut self) -> Result<()> {
        let end = self.buf_end();
        let limit = self.pos.min(end);
        self.ready.clear();
        for (&k, n) in self.compressed.range(..(limit, 0)) {
            if n.end <= limit || self.eof {
                self.ready.push(k);
            }
        }
        if self.ready.is_empty() {
            return Ok(());
        }
        let cs = self.g.cluster_size as usize;
        let per_batch = (BATCH_OUT / cs).max(1);
        let ready = std::mem::take(&mut self.ready);
        for keys in ready.chunks(per_batch) {
            let kind = self.compression;
            let pool = match &mut self.pool {
                Some(p) => p,
                None => self
                    .pool
                    .insert(InflatePool::new(cs, move || Inflater::new(kind))?),
            };
            let mut batch = pool.batch();
            for k in keys {
                let n = self.compressed.remove(k).expect("listed above");
                let from = (k.0 - self.buf_start) as usize;
                // Past the end of the stream reads as zeroes, as in qemu (the last compressed
                // cluster of an image may end mid-sector): the batch pads it.
                let to = (n.end.min(end) - self.buf_start) as usize;
                let job = Job {
                    start: k.0,
                    guest_cluster: n.guest_cluster,
                };
                batch.push(job, &self.buf[from..to], (n.end - k.0) as usize);
            }
            if let Some(done) = pool.submit(batch)? {
                self.write_batch(done)?;
            }
        }
        self.ready = ready;
        Ok(())
    }

    /// Writes an inflated batch of compressed clusters, or names its corrupt one.
    fn write_batch(&mut self, done: Batch<Job>) -> Result<()> {
        let g = self.g;
        let written = match done.decoded() {
            Ok((inflated, _)) => write_runs(&mut self.out, &g, done.tags(), inflated),
            Err((j, why)) => Err(Error::Corrupt(format!(
                "qcow2: compressed cluster at {:#x} (guest offset {:#x}): {why}",
                j.start,
                j.guest_cluster << g.cluster_bits
            ))),
        };
        self.batch_failed |= written.is_err();
        if let Some(pool) = &mut self.pool {
            pool.recycle(done);
        }
        written
    }
}

/// Writes the inflated clusters of `jobs` (one cluster size apart in `inflated`): those of
/// consecutive guest clusters with one call (a write per cluster made small `O_DIRECT` writes,
/// one at a time).
fn write_runs(
    out: &mut ExtentWriter<'_>,
    g: &ClusterGeometry,
    jobs: &[Job],
    inflated: &[u8],
) -> Result<()> {
    let cs = g.cluster_size as usize;
    let mut i = 0;
    while i < jobs.len() {
        let first = jobs[i].guest_cluster;
        let mut n = 1;
        while i + n < jobs.len() && jobs[i + n].guest_cluster == first + n as u64 {
            n += 1;
        }
        let goff = first << g.cluster_bits;
        let len = ((n * cs) as u64).min(g.virtual_size - goff) as usize;
        out.data(goff, &inflated[i * cs..i * cs + len])?;
        i += n;
    }
    Ok(())
}

/// Most guest bytes of one batch of compressed clusters handed to the pool.
const BATCH_OUT: usize = 2 << 20;

/// A compressed cluster handed to the pool: where its bytes start in the stream, and the guest
/// cluster they inflate to.
struct Job {
    start: u64,
    guest_cluster: u64,
}
