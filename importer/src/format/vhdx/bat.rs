//! The block allocation table: one 64-bit entry per payload block, with a sector-bitmap entry
//! after every `chunk_ratio` of them (used only by differencing images, so skipped here).
//! [`Geometry`] computes sizes and indexes from the metadata; [`Geometry::payload`] decodes and
//! checks one payload entry. Pure: no I/O.

use super::error::VhdxError;
use super::header::Layout;
use super::metadata::Metadata;

/// A BAT entry's state bits.
const STATE_MASK: u64 = 7;
/// A BAT entry's file offset bits (in MiB units, bits 20-63).
const OFFSET_MASK: u64 = !0xf_ffff;
/// The most BAT bytes a disk can need: 64 TiB in 1 MiB blocks, with a bitmap entry per 4096.
pub const MAX_BAT_BYTES: u64 = ((1 << 26) + (1 << 14)) * 8;
/// Sectors of a chunk (qemu's `VHDX_MAX_SECTORS_PER_BLOCK`): one sector bitmap block covers them.
const CHUNK_SECTORS: u64 = 1 << 23;

/// Sizes and indexes of the guest disk, from the metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u64,
    /// Payload blocks per sector bitmap block.
    pub chunk_ratio: u64,
    /// The guest disk's size: the stored size in whole 512-byte sectors, as qemu reads it.
    pub disk_size: u64,
    /// Payload blocks (those of the stored size).
    pub blocks: u64,
    /// BAT entries the disk needs, bitmap entries included.
    pub bat_entries: u64,
}

/// What a payload block reads as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// NOT_PRESENT, UNDEFINED, ZERO, UNMAPPED (and qemu's UNMAPPED_v095): zeroes, as qemu reads
    /// them in an image without a parent.
    Zero,
    /// FULLY_PRESENT: the block's bytes are at this file offset.
    Data(u64),
}

impl Geometry {
    pub fn of(m: &Metadata) -> Geometry {
        let block_size = u64::from(m.block_size);
        let chunk_ratio = CHUNK_SECTORS * u64::from(m.logical_sector_size) / block_size;
        let blocks = m.virtual_disk_size.div_ceil(block_size);
        let bat_entries = if blocks == 0 {
            0
        } else {
            blocks + (blocks - 1) / chunk_ratio
        };
        Geometry {
            block_size,
            chunk_ratio,
            disk_size: m.virtual_disk_size & !511,
            blocks,
            bat_entries,
        }
    }

    /// The BAT's needed length in bytes, checked against the region that holds it.
    pub fn check_bat_region(&self, layout: &Layout, m: &Metadata) -> Result<u64, VhdxError> {
        let need = self.bat_entries * 8;
        if need > layout.bat.len {
            return Err(VhdxError::BatTooShort {
                offset: layout.bat.offset,
                len: layout.bat.len,
                entries: self.bat_entries,
                virtual_size: m.virtual_disk_size,
            });
        }
        Ok(need)
    }

    /// The payload block BAT entry `index` describes; None for a sector bitmap entry.
    pub fn block_of_entry(&self, index: u64) -> Option<u64> {
        let period = self.chunk_ratio + 1;
        (index % period != self.chunk_ratio).then(|| index - index / period)
    }

    /// Guest bytes block `block` holds (less than a block only at the end of the disk).
    pub fn guest_len(&self, block: u64) -> u64 {
        self.block_size
            .min(self.disk_size.saturating_sub(block * self.block_size))
    }

    /// Decodes payload entry `index` (of block `block`), checking a data block against the
    /// reserved ranges of `layout` as qemu does (the whole block, even at the end of the disk).
    pub fn payload(
        &self,
        layout: &Layout,
        index: u64,
        block: u64,
        entry: u64,
    ) -> Result<Payload, VhdxError> {
        let bad = |why| VhdxError::BatState {
            index,
            offset: layout.bat.offset + index * 8,
            state: (entry & STATE_MASK) as u8,
            why,
        };
        match entry & STATE_MASK {
            0..=3 | 5 => Ok(Payload::Zero),
            6 => {
                let start = entry & OFFSET_MASK;
                let end = start
                    .checked_add(self.block_size)
                    .ok_or(bad("its offset overflows"))?;
                if let Some((other, r)) = layout.reserved_overlap(start, end) {
                    return Err(VhdxError::PayloadOverlap {
                        index,
                        offset: layout.bat.offset + index * 8,
                        guest: block * self.block_size,
                        start,
                        end,
                        other: other.clone(),
                        other_start: r.offset,
                        other_end: r.end(),
                    });
                }
                Ok(Payload::Data(start))
            }
            7 => Err(bad(
                "PARTIALLY_PRESENT, which only a differencing image may use",
            )),
            _ => Err(bad("which no payload block may have")),
        }
    }

    /// The error for payload entry `index` whose block `[start, start + block_size)` overlaps
    /// the block of entry `other_index` at `other_start`.
    pub fn payloads_overlap(
        &self,
        layout: &Layout,
        (index, block, start): (u64, u64, u64),
        (other_index, other_start): (u64, u64),
    ) -> VhdxError {
        VhdxError::PayloadOverlap {
            index,
            offset: layout.bat.offset + index * 8,
            guest: block * self.block_size,
            start,
            end: start + self.block_size,
            other: format!("the payload block of BAT entry {other_index}"),
            other_start,
            other_end: other_start + self.block_size,
        }
    }
}
