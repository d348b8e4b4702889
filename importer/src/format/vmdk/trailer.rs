//! The cross-check of a streamOptimized extent whose grain tables follow its grains (VMware's
//! layout: `gdOffset = -1`, a grain table marker after each table's grains, then the directory,
//! the footer and the end-of-stream marker): pure checks of bytes, no I/O.
//!
//! qemu reads such a stream through the footer's directory and tables, never the grain markers'
//! sector numbers. A forward pass writes each grain at its marker's sector before the tables
//! arrive, so it remembers where each grain was (8 bytes a grain) and, as the tables and the
//! directory pass, requires them to say the same: every table entry points at a grain marker
//! for that guest grain, every directory entry at a table of its own span, and every grain is
//! in a table. A disagreement is corruption, found before the import ends.

use super::header::{GrainEntry, SparseHeader, grain_entry};
use crate::error::{Error, Result};
use crate::format::fields::le32;

fn corrupt(msg: String) -> Error {
    Error::Corrupt(format!("vmdk: {msg}"))
}

/// The grains and tables seen so far.
#[derive(Default)]
pub(super) struct Trailer {
    /// Each grain as (extent sector << 32 | guest grain), in stream order (so by sector).
    grains: Vec<u64>,
    /// Each grain table: its sector, the directory entry its grains belong to (None when it
    /// maps none) and how many it maps.
    tables: Vec<(u64, Option<u64>, u64)>,
    /// The directory's sector, once it has passed.
    directory: Option<u64>,
    /// Grains mapped through the directory.
    mapped: u64,
}

impl Trailer {
    /// A grain at extent `sector` for guest grain `grain`.
    pub fn grain(&mut self, sector: u64, grain: u64) -> Result<()> {
        if sector > u64::from(u32::MAX) {
            return Err(corrupt(format!(
                "the grain at sector {sector} lies past what a grain table can point at"
            )));
        }
        self.grains.push(sector << 32 | grain);
        Ok(())
    }

    /// The grain table at extent `sector` (its entries in `bytes`).
    pub fn table(&mut self, h: &SparseHeader, sector: u64, bytes: &[u8]) -> Result<()> {
        let gtes = u64::from(h.gtes_per_gt);
        let (mut index, mut count) = (None, 0);
        for j in 0..gtes {
            let GrainEntry::Data(s) = grain_entry(le32(bytes, j as usize * 4), h.has_zero_grains())
            else {
                continue;
            };
            let Ok(k) = self.grains.binary_search_by_key(&s, |k| k >> 32) else {
                return Err(corrupt(format!(
                    "the grain table at sector {sector}: entry {j} points at sector {s}, where no grain marker is"
                )));
            };
            let g = self.grains[k] & 0xffff_ffff;
            if g % gtes != j || index.is_some_and(|i| i != g / gtes) {
                return Err(corrupt(format!(
                    "entry {j} of the grain table at sector {sector} points at sector {s}, whose \
                     grain marker says guest offset {:#x} (grain markers and tables disagree)",
                    g * h.grain_size()
                )));
            }
            index = Some(g / gtes);
            count += 1;
        }
        self.tables.push((sector, index, count));
        Ok(())
    }

    /// The grain directory at extent `sector` (its entries in `bytes`).
    pub fn directory(&mut self, h: &SparseHeader, sector: u64, bytes: &[u8]) -> Result<()> {
        if self.directory.is_some() {
            return Err(corrupt(format!(
                "a second grain directory at sector {sector}"
            )));
        }
        for i in 0..h.gd_entries() {
            let t = u64::from(le32(bytes, i as usize * 4));
            if t == 0 {
                continue;
            }
            let Ok(k) = self.tables.binary_search_by_key(&t, |t| t.0) else {
                return Err(corrupt(format!(
                    "grain directory entry {i} points at sector {t}, where no grain table is"
                )));
            };
            match self.tables[k] {
                (_, Some(j), _) if j != i => {
                    return Err(corrupt(format!(
                        "the grain table at sector {t} holds the grains of directory entry {j}, \
                         the directory puts it at entry {i} (grain markers and tables disagree)"
                    )));
                }
                (_, _, count) => self.mapped += count,
            }
        }
        self.directory = Some(sector);
        Ok(())
    }

    /// At the end of the stream: the directory at `gd_offset` (the footer's, or the header's)
    /// passed and mapped every grain.
    pub fn finish(&self, gd_offset: u64) -> Result<()> {
        match self.directory {
            None => {
                return Err(corrupt(format!(
                    "truncated or corrupt: no grain directory marker before the end of the stream (the directory is at sector {gd_offset})"
                )));
            }
            Some(s) if s != gd_offset => {
                return Err(corrupt(format!(
                    "the grain directory is at sector {s}, the header says {gd_offset}"
                )));
            }
            Some(_) => {}
        }
        let unmapped = (self.grains.len() as u64).saturating_sub(self.mapped);
        if unmapped != 0 {
            return Err(corrupt(format!(
                "{unmapped} grain markers are in no grain table (grain markers and tables disagree)"
            )));
        }
        Ok(())
    }
}
