//! The grain directory and grain tables of a sparse extent, read in one forward pass, and the
//! table-driven converter for uncompressed extents (monolithicSparse and the extents of
//! twoGbMaxExtentSparse).
//!
//! The header says where the grain directory is; once it has passed, every grain table's place is
//! known, and each grain table, as it passes, says where its grains are. Everything is visited in
//! extent order: the next grain table or the next mapped grain, whichever comes first; all else
//! (the redundant directory and its tables, the descriptor, free space) is skipped. Grains that
//! are contiguous in both the extent and the guest are written with one call. The streamOptimized
//! converter follows the same [`Map`] when the tables come before the grains (as qemu writes them).
//!
//! qemu-img and VMware place the directory and every table before the grains. A table placed
//! before the directory, or a grain placed before the table that maps it, would need the stream
//! to go back: it is refused, saying so. Tables or grains overlapping the header, the directory,
//! each other or another grain are corruption.
//!
//! Memory: the read window, one entry (16 bytes) per allocated grain table and one (8 bytes) per
//! grain whose table has passed and whose data has not: with qemu's layout, 8 bytes per allocated
//! 64 KiB grain (1/8192 of the data).

use crate::format::fields::le32;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::header::{GrainEntry, SECTOR, SparseHeader, grain_entry};
use super::window::Window;
use crate::error::{Error, Result};
use crate::format::qcow2::extent::ExtentWriter;
use crate::sink::ExtentSink;

fn corrupt(msg: String) -> Error {
    Error::Corrupt(format!("vmdk: {msg}"))
}

/// Where the grains are: the grain tables not read yet and the grains mapped by those read.
pub(super) struct Map {
    /// `(extent offset, directory entry)` of each allocated grain table, in extent order.
    tables: Vec<(u64, u32)>,
    next_table: usize,
    /// Grains mapped by passed tables, as (extent sector << 32 | guest grain), smallest first.
    grains: BinaryHeap<Reverse<u64>>,
}

/// A mapped grain: its data's extent offset and its guest grain.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mapped {
    pub host: u64,
    pub grain: u64,
}

fn mapped(k: u64) -> Mapped {
    Mapped {
        host: (k >> 32) * SECTOR,
        grain: k & 0xffff_ffff,
    }
}

impl Map {
    /// Reads the grain directory (the window moves to it and past it); the spans of unallocated
    /// directory entries are written as zeroes.
    pub fn read(h: &SparseHeader, win: &mut Window, out: &mut ExtentWriter) -> Result<Map> {
        let vsize = h.virtual_size();
        let gd_start = h.gd_offset * SECTOR;
        let gd_len = h.gd_entries() * 4;
        let gd_end = gd_start + gd_len;
        if !win.skip_to(gd_start)? {
            return Err(corrupt(format!(
                "truncated: the grain directory at {gd_start:#x} is past the end of the image"
            )));
        }
        let mut tables: Vec<(u64, u32)> = Vec::new();
        let span = h.gt_span();
        for i in 0..h.gd_entries() {
            if i % 1024 == 0 {
                let want = ((h.gd_entries() - i) * 4).min(4096) as usize;
                if win.peek(want)?.len() < want {
                    return Err(corrupt(format!(
                        "truncated: the grain directory at {gd_start:#x} ({gd_len} bytes) runs past the end of the image"
                    )));
                }
            }
            let at = ((i % 1024) * 4) as usize;
            let sector = u64::from(le32(win.peek(at + 4)?, at));
            if (i + 1) % 1024 == 0 || i + 1 == h.gd_entries() {
                win.consume(at as u64 + 4)?;
            }
            if sector == 0 {
                let start = i * span;
                out.zero(start, (start + span).min(vsize))?;
            } else {
                tables.push((sector * SECTOR, i as u32));
            }
        }
        tables.sort_unstable();
        let gt_len = h.gt_len();
        for (n, &(at, i)) in tables.iter().enumerate() {
            if at < gd_end && at + gt_len > gd_start {
                return Err(corrupt(format!(
                    "grain directory entry {i} puts a grain table at {at:#x}, inside the grain directory at {gd_start:#x}"
                )));
            }
            if at < gd_start {
                return Err(Error::Unsupported(format!(
                    "vmdk: grain directory entry {i} puts a grain table at {at:#x}, before the grain \
                     directory at {gd_start:#x}; a single forward pass cannot go back for it"
                )));
            }
            if let Some(&(next, j)) = tables.get(n + 1)
                && next < at + gt_len
            {
                return Err(corrupt(format!(
                    "grain tables of directory entries {i} and {j} overlap at {at:#x} and {next:#x}"
                )));
            }
        }
        Ok(Map {
            tables,
            next_table: 0,
            grains: BinaryHeap::new(),
        })
    }

    /// Where the next grain table not read yet is.
    pub fn table_at(&self) -> Option<u64> {
        self.tables.get(self.next_table).map(|t| t.0)
    }

    /// The next mapped grain in extent order, reading the grain tables before it (the guest
    /// grains they leave unallocated or zeroed are written as zeroes); None once all are done.
    pub fn next(
        &mut self,
        h: &SparseHeader,
        win: &mut Window,
        out: &mut ExtentWriter,
    ) -> Result<Option<Mapped>> {
        loop {
            let grain_at = self.following().map(|m| m.host);
            match (self.table_at(), grain_at) {
                (Some(t), g) if g.is_none_or(|g| t <= g) => self.read_table(h, win, out, t, g)?,
                (_, Some(_)) => return Ok(self.grains.pop().map(|Reverse(k)| mapped(k))),
                (None, None) => return Ok(None),
                (Some(_), None) => unreachable!("matched above"),
            }
        }
    }

    /// The grain after the one [`Map::next`] returned, without reading any table: there may be
    /// one before it (see [`Map::table_at`]).
    pub fn following(&self) -> Option<Mapped> {
        self.grains.peek().map(|&Reverse(k)| mapped(k))
    }

    /// Takes the grain [`Map::following`] returned.
    pub fn take_following(&mut self) {
        self.grains.pop();
    }

    /// Reads the grain table at `t`; `g` is where the next mapped grain is.
    fn read_table(
        &mut self,
        h: &SparseHeader,
        win: &mut Window,
        out: &mut ExtentWriter,
        t: u64,
        g: Option<u64>,
    ) -> Result<()> {
        let gt_len = h.gt_len();
        let gsize = h.grain_size();
        let i = self.tables[self.next_table].1;
        if let Some(g) = g
            && g < t + gt_len
        {
            return Err(corrupt(format!(
                "a grain at {g:#x} overlaps the grain table of directory entry {i} at {t:#x}"
            )));
        }
        win.skip_to(t)?;
        let bytes = win.peek(gt_len as usize)?;
        if (bytes.len() as u64) < gt_len {
            return Err(corrupt(format!(
                "truncated: the grain table of directory entry {i} at {t:#x} runs past the end of the image"
            )));
        }
        let first = u64::from(i) * u64::from(h.gtes_per_gt);
        let count = u64::from(h.gtes_per_gt).min(h.grains() - first);
        for j in 0..count {
            let g = first + j;
            match grain_entry(le32(bytes, (j * 4) as usize), h.has_zero_grains()) {
                GrainEntry::Unallocated | GrainEntry::Zeroed => {
                    out.zero(g * gsize, g * gsize + h.grain_len(g))?;
                }
                GrainEntry::Data(sector) => {
                    if sector * SECTOR < t + gt_len {
                        return Err(corrupt(format!(
                            "grain table at {t:#x} (directory entry {i}) puts guest offset {:#x} at {:#x}, \
                             which is metadata or data already read (a grain must follow its table)",
                            g * gsize,
                            sector * SECTOR
                        )));
                    }
                    self.grains.push(Reverse(sector << 32 | g));
                }
            }
        }
        win.consume(gt_len)?;
        self.next_table += 1;
        Ok(())
    }
}

/// Converts the extent behind `win` (positioned at its start) into `sink`, at extent offsets.
pub(super) fn convert(
    h: &SparseHeader,
    win: &mut Window,
    read_size: usize,
    sink: &mut dyn ExtentSink,
) -> Result<()> {
    let mut out = ExtentWriter::new(sink);
    let mut map = Map::read(h, win, &mut out)?;
    let gsize = h.grain_size();
    let run_max = (read_size as u64).max(gsize);
    while let Some(Mapped { host, grain }) = map.next(h, win, &mut out)? {
        let guest = grain * gsize;
        let mut len = h.grain_len(grain);
        // Extend the run while the next grain follows in both the extent and the guest.
        while let Some(n) = map.following() {
            if n.host < host + len {
                return Err(corrupt(format!(
                    "grains for guest offsets {guest:#x} and {:#x} overlap at {:#x}",
                    n.grain * gsize,
                    n.host
                )));
            }
            if n.host != host + len || n.grain * gsize != guest + len || len + gsize > run_max {
                break;
            }
            map.take_following();
            len += h.grain_len(n.grain);
        }
        if let Some(t) = map.table_at()
            && t < host + len
        {
            return Err(corrupt(format!(
                "the grain for guest offset {guest:#x} at {host:#x} overlaps the grain table at {t:#x}"
            )));
        }
        win.skip_to(host)?;
        let bytes = win.peek(len as usize)?;
        if bytes.is_empty() {
            return Err(corrupt(format!(
                "truncated: the grain for guest offset {guest:#x} at {host:#x} is past the end of the image"
            )));
        }
        // qemu reads past the end of the extent file as zeroes: its last grain may be cut short.
        let got = bytes.len() as u64;
        out.data(guest, bytes)?;
        out.zero(guest + got, guest + len)?;
        win.consume(len)?;
    }
    out.flush()
}
