//! The single-pass streaming converter.
//!
//! The image is read front to back once, never seeking. After the header section (read by
//! [`Stream::open`]), each range of the stream is dispatched by what is known about it as it
//! passes:
//!
//! - the metadata table and the few metadata items the reader needs are copied out; once they
//!   are all in, the geometry (block size, virtual size, BAT length) is known. [`Stream::open`]
//!   stops there, so the caller checks the size before anything is written;
//! - BAT entries are decoded as they pass once the geometry is known: zero blocks are reported at
//!   once, data blocks still ahead are registered, data blocks already passed are read back from
//!   the hold. A BAT that passes before the metadata is held, and decoded when the metadata is in;
//! - payload bytes of a registered block are written as they pass;
//! - anything else outside the log and the other regions is *held* (memory up to the budget,
//!   then an unlinked spill file, [`HeldBytes`]) until the whole BAT is decoded: it may be a
//!   payload block whose entry comes later (a BAT after its data, as qcow2's late L2 tables).
//!   Then the hold is dropped and unmapped bytes are skipped.
//!
//! A data block overlapping the header section, the log, the BAT, the metadata or another
//! region, or another data block, is corruption; so is a block whose bytes already passed and
//! were not held, and anything needed past the end of the stream.
//!
//! Memory: one read of [`ReaderOptions::read_ahead`], the 64 KiB metadata table, one map entry
//! per data block still ahead, and the hold's budget.

use crate::format::fields::le64;
use std::collections::BTreeMap;
use std::io::Read;

use super::VhdxStats;
use super::bat::{Geometry, MAX_BAT_BYTES, Payload};
use super::error::VhdxError;
use super::header::{HEAD_LEN, Layout};
use super::metadata::{self, Items, Metadata, TABLE_LEN};
use crate::error::{Error, Result};
use crate::format::ReaderOptions;
use crate::format::hold::HeldBytes;
use crate::sink::ExtentSink;

/// Bytes to be copied out of the stream at a known offset.
struct Capture {
    at: u64,
    buf: Vec<u8>,
    filled: usize,
}

impl Capture {
    fn new(at: u64, len: usize) -> Capture {
        Capture {
            at,
            buf: vec![0; len],
            filled: 0,
        }
    }

    fn end(&self) -> u64 {
        self.at + self.buf.len() as u64
    }

    fn done(&self) -> bool {
        self.filled == self.buf.len()
    }

    /// Takes what it still needs from stream bytes `[start, start + bytes.len())`.
    fn feed(&mut self, start: u64, bytes: &[u8]) {
        let want = self.at + self.filled as u64;
        let end = start + bytes.len() as u64;
        if self.done() || want < start || want >= end {
            return;
        }
        let n = ((end.min(self.end())) - want) as usize;
        let from = (want - start) as usize;
        self.buf[self.filled..self.filled + n].copy_from_slice(&bytes[from..from + n]);
        self.filled += n;
    }
}

/// A data block still ahead: its guest bytes are host `[start, end)`.
#[derive(Clone, Copy)]
struct Ahead {
    end: u64,
    guest: u64,
    index: u64,
}

pub(crate) struct Stream {
    reader: Box<dyn Read + Send>,
    read_ahead: usize,
    /// Stream bytes consumed.
    pos: u64,
    layout: Layout,
    table: Capture,
    items: Option<(Items, Vec<Capture>)>,
    meta: Option<(Metadata, Geometry)>,
    /// BAT bytes needed (known with the geometry).
    bat_len: u64,
    /// The next BAT entry to decode, and the bytes of it seen so far.
    bat_next: u64,
    bat_partial: Vec<u8>,
    /// Whether the held BAT bytes (passed before the metadata) have been decoded.
    bat_resolved: bool,
    ahead: BTreeMap<u64, Ahead>,
    holding: bool,
    hold: HeldBytes,
    /// Guest zero range not yet reported.
    zero: Option<(u64, u64)>,
    scratch: Vec<u8>,
}

/// Reads until `buf` holds `want` bytes or the stream ends.
fn read_full(reader: &mut dyn Read, buf: &mut [u8]) -> Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        match reader.read(&mut buf[at..]) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::from_read(e, "vhdx image")),
        }
    }
    Ok(at)
}

/// A sink for the opening phase, which never writes (the geometry is unknown until it ends).
struct NoSink;

impl ExtentSink for NoSink {
    fn write_data(&mut self, _: u64, _: &[u8]) -> Result<()> {
        Err(Error::Corrupt("vhdx: data before the metadata".into()))
    }
    fn write_zeroes(&mut self, _: u64, _: u64) -> Result<()> {
        Err(Error::Corrupt("vhdx: data before the metadata".into()))
    }
}

impl Stream {
    /// Reads the header section and then the stream up to the last metadata item needed.
    pub fn open(mut reader: Box<dyn Read + Send>, opts: &ReaderOptions) -> Result<Stream> {
        let mut head = vec![0u8; HEAD_LEN];
        let n = read_full(&mut reader, &mut head)?;
        head.truncate(n);
        let layout = super::header::parse(&head)?;
        let mut s = Stream {
            reader,
            read_ahead: opts.read_ahead.max(1 << 16),
            pos: HEAD_LEN as u64,
            table: Capture::new(layout.metadata.offset, TABLE_LEN),
            layout,
            items: None,
            meta: None,
            bat_len: 0,
            bat_next: 0,
            bat_partial: Vec::with_capacity(8),
            bat_resolved: false,
            ahead: BTreeMap::new(),
            holding: true,
            hold: HeldBytes::new(opts.memory_budget, opts.spill_dir.clone()),
            zero: None,
            scratch: Vec::new(),
        };
        let mut buf = Vec::new();
        while s.meta.is_none() {
            // Read no further than the next capture's end, so the metadata completes at the end
            // of a read and nothing past it is dispatched before the sink exists.
            let boundary = s.next_capture_end();
            let want = (boundary - s.pos).min(s.read_ahead as u64) as usize;
            buf.resize(want, 0);
            let n = read_full(&mut s.reader, &mut buf)?;
            if n == 0 {
                return Err(s.truncated());
            }
            s.consume(&buf[..n], &mut NoSink)?;
        }
        Ok(s)
    }

    pub fn metadata(&self) -> Metadata {
        self.meta.expect("open parsed it").0
    }

    pub fn geometry(&self) -> Geometry {
        self.meta.expect("open parsed it").1
    }

    fn next_capture_end(&self) -> u64 {
        match &self.items {
            None => self.table.end(),
            Some((_, caps)) => caps
                .iter()
                .filter(|c| !c.done())
                .map(Capture::end)
                .min()
                .unwrap_or(self.pos),
        }
    }

    /// Converts the rest of the stream into `sink`.
    pub fn run(mut self, sink: &mut dyn ExtentSink) -> Result<VhdxStats> {
        self.resolve_held_bat(sink)?;
        let mut buf = vec![0u8; self.read_ahead.min(crate::format::COPY_READ)];
        while !self.done() {
            let n = read_full(&mut self.reader, &mut buf)?;
            if n == 0 {
                return Err(self.truncated());
            }
            self.consume(&buf[..n], sink)?;
        }
        if let Some((s, e)) = self.zero.take() {
            sink.write_zeroes(s, e - s)?;
        }
        Ok(VhdxStats {
            bytes_read: self.pos,
            held_bytes: self.hold.held_bytes,
            spilled_bytes: self.hold.spilled_bytes,
        })
    }

    fn done(&self) -> bool {
        self.meta.is_some() && self.bat_next >= self.bat_len_entries() && self.ahead.is_empty()
    }

    fn bat_len_entries(&self) -> u64 {
        self.bat_len / 8
    }

    fn truncated(&self) -> Error {
        let (what, offset, len) = if self.meta.is_none() {
            match self
                .items
                .iter()
                .flat_map(|(_, caps)| caps)
                .find(|c| !c.done())
            {
                Some(c) => ("a metadata item", c.at, c.buf.len() as u64),
                None => ("the metadata table", self.table.at, TABLE_LEN as u64),
            }
        } else if self.bat_next < self.bat_len_entries() {
            ("the BAT", self.layout.bat.offset, self.bat_len)
        } else if let Some((&start, a)) = self.ahead.iter().next() {
            ("a payload block", start, a.end - start)
        } else {
            ("data", self.pos, 0)
        };
        VhdxError::Truncated {
            what,
            offset,
            len,
            end: self.pos,
        }
        .into()
    }

    /// Dispatches stream bytes `[pos, pos + bytes.len())` and moves `pos` past them.
    fn consume(&mut self, bytes: &[u8], sink: &mut dyn ExtentSink) -> Result<()> {
        let start = self.pos;
        let end = start + bytes.len() as u64;
        let mut at = start;
        while at < end {
            let slice = &bytes[(at - start) as usize..];
            let n = self.piece(at, slice, sink)?;
            at += n as u64;
        }
        self.pos = end;
        Ok(())
    }

    /// Handles a prefix of `bytes` (stream offset `at`) that lies in one kind of range; returns
    /// its length.
    fn piece(&mut self, at: u64, bytes: &[u8], sink: &mut dyn ExtentSink) -> Result<usize> {
        let len = bytes.len() as u64;
        let meta = self.layout.metadata;
        let bat = self.layout.bat;
        if meta.overlaps(at, at + 1) {
            let n = (meta.end() - at).min(len) as usize;
            self.metadata_bytes(at, &bytes[..n])?;
            return Ok(n);
        }
        if bat.overlaps(at, at + 1) {
            let n = (bat.end() - at).min(len) as usize;
            if self.meta.is_some() && self.bat_resolved {
                self.bat_bytes(at, &bytes[..n], at, sink)?;
            } else {
                // Held until the metadata says how much of it is needed (at most what the
                // largest disk needs).
                let keep = (bat.offset + MAX_BAT_BYTES)
                    .saturating_sub(at)
                    .min(n as u64);
                self.hold.add(at, &bytes[..keep as usize])?;
            }
            return Ok(n);
        }
        if let Some((_, r)) = self.layout.reserved_overlap(at, at + 1) {
            // The log and regions Quarry does not read.
            return Ok((r.end() - at).min(len) as usize);
        }
        // Payload area: up to the next reserved range.
        let limit = self
            .layout
            .reserved
            .iter()
            .map(|(_, r)| r.offset)
            .filter(|&o| o > at)
            .min()
            .map_or(len, |o| (o - at).min(len));
        self.payload_bytes(at, &bytes[..limit as usize], sink)?;
        Ok(limit as usize)
    }

    fn metadata_bytes(&mut self, at: u64, bytes: &[u8]) -> Result<()> {
        if self.meta.is_some() {
            return Ok(());
        }
        if self.items.is_none() {
            self.table.feed(at, bytes);
            if self.table.done() {
                self.metadata_table()?;
            }
        }
        if let Some((items, caps)) = &mut self.items {
            for c in caps.iter_mut() {
                c.feed(at, bytes);
            }
            if caps.iter().all(Capture::done) {
                let bytes = [&caps[0].buf[..], &caps[1].buf, &caps[2].buf, &caps[3].buf];
                let m = Metadata::parse(items, bytes)?;
                let g = Geometry::of(&m);
                self.bat_len = g.check_bat_region(&self.layout, &m)?;
                self.meta = Some((m, g));
                tracing::debug!(?m, ?g, "vhdx metadata");
            }
        }
        Ok(())
    }

    /// Parses the metadata table once it is complete; items inside it are copied at once.
    fn metadata_table(&mut self) -> Result<()> {
        if !self.table.done() {
            return Ok(());
        }
        let items = metadata::parse_table(&self.table.buf, self.layout.metadata)?;
        let mut caps: Vec<Capture> = items
            .ranges
            .iter()
            .map(|r| Capture::new(r.offset, r.len as usize))
            .collect();
        for c in &mut caps {
            c.feed(self.table.at, &self.table.buf);
        }
        self.items = Some((items, caps));
        Ok(())
    }

    /// Decodes the BAT bytes that passed (held) before the metadata, once it is in.
    fn resolve_held_bat(&mut self, sink: &mut dyn ExtentSink) -> Result<()> {
        self.bat_resolved = true;
        let bat = self.layout.bat;
        let passed_end = (bat.offset + self.bat_len).min(self.pos);
        let mut at = bat.offset;
        let mut chunk = Vec::new();
        while at < passed_end {
            let n = (passed_end - at).min(1 << 20);
            if !self.hold.read(at, n, &mut chunk)? {
                return Err(Error::Corrupt(format!(
                    "vhdx: the BAT at {:#x} passed and was not held",
                    bat.offset
                )));
            }
            self.bat_bytes(at, &chunk, self.pos, sink)?;
            at += n;
        }
        self.hold.release(bat.offset, bat.end().min(self.pos));
        self.maybe_stop_holding();
        Ok(())
    }

    /// Decodes BAT bytes at `at` (in order), up to the entries the disk needs. Every stream byte
    /// before `passed` has been dispatched.
    fn bat_bytes(
        &mut self,
        at: u64,
        bytes: &[u8],
        passed: u64,
        sink: &mut dyn ExtentSink,
    ) -> Result<()> {
        let bat = self.layout.bat.offset;
        let need_end = bat + self.bat_len;
        let start = bat + self.bat_next * 8 + self.bat_partial.len() as u64;
        let end = (at + bytes.len() as u64).min(need_end);
        if start >= end || start < at {
            return Ok(());
        }
        let mut i = (start - at) as usize;
        let stop = (end - at) as usize;
        while i < stop {
            let take = (8 - self.bat_partial.len()).min(stop - i);
            self.bat_partial.extend_from_slice(&bytes[i..i + take]);
            i += take;
            if self.bat_partial.len() == 8 {
                let entry = le64(&self.bat_partial, 0);
                self.bat_partial.clear();
                let index = self.bat_next;
                self.bat_next += 1;
                self.entry(index, entry, passed, sink)?;
            }
        }
        self.maybe_stop_holding();
        Ok(())
    }

    /// Handles BAT entry `index`; every stream byte before `passed` has been dispatched.
    fn entry(
        &mut self,
        index: u64,
        entry: u64,
        passed: u64,
        sink: &mut dyn ExtentSink,
    ) -> Result<()> {
        let g = self.geometry();
        let Some(block) = g.block_of_entry(index) else {
            return Ok(());
        };
        let len = g.guest_len(block);
        if len == 0 {
            return Ok(());
        }
        let guest = block * g.block_size;
        match g.payload(&self.layout, index, block, entry)? {
            Payload::Zero => match &mut self.zero {
                Some((_, e)) if *e == guest => *e = guest + len,
                z => {
                    if let Some((s, e)) = z.replace((guest, guest + len)) {
                        sink.write_zeroes(s, e - s)?;
                    }
                }
            },
            Payload::Data(host) if host < passed => {
                // Passed before its entry: it must be in the hold (and is used once).
                if !self.hold.read(host, len, &mut self.scratch)? {
                    return Err(Error::Corrupt(format!(
                        "vhdx: BAT entry {index} puts guest offset {guest:#x} at {host:#x}, \
                         which already passed as another block's data (a single streaming pass \
                         cannot go back)"
                    )));
                }
                sink.write_data(guest, &self.scratch)?;
                self.hold.release(host, host + g.block_size);
            }
            Payload::Data(host) => {
                let bs = g.block_size;
                let clash = self
                    .ahead
                    .range(..host + bs)
                    .next_back()
                    .filter(|&(&s, _)| s + bs > host);
                if let Some((&s, a)) = clash {
                    return Err(g
                        .payloads_overlap(&self.layout, (index, block, host), (a.index, s))
                        .into());
                }
                self.ahead.insert(
                    host,
                    Ahead {
                        end: host + len,
                        guest,
                        index,
                    },
                );
            }
        }
        Ok(())
    }

    fn maybe_stop_holding(&mut self) {
        if self.holding && self.meta.is_some() && self.bat_next >= self.bat_len_entries() {
            self.holding = false;
            self.hold.clear();
        }
    }

    /// Payload-area bytes: written where a registered block is, held while the BAT is not
    /// complete, skipped otherwise.
    fn payload_bytes(&mut self, at: u64, bytes: &[u8], sink: &mut dyn ExtentSink) -> Result<()> {
        let end = at + bytes.len() as u64;
        let mut cur = at;
        while cur < end {
            let next = self
                .ahead
                .range(..end)
                .find(|&(&s, a)| a.end > cur && s < end)
                .map(|(&s, &a)| (s, a));
            let Some((s, a)) = next else { break };
            let from = s.max(cur);
            if from > cur && self.holding {
                self.hold
                    .add(cur, &bytes[(cur - at) as usize..(from - at) as usize])?;
            }
            let to = a.end.min(end);
            sink.write_data(
                a.guest + (from - s),
                &bytes[(from - at) as usize..(to - at) as usize],
            )?;
            if a.end <= end {
                self.ahead.remove(&s);
            }
            cur = to;
        }
        if cur < end && self.holding {
            self.hold.add(cur, &bytes[(cur - at) as usize..])?;
        }
        Ok(())
    }
}
