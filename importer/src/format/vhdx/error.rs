//! What the pure VHDX parsers find wrong with an image's structures. Each error names the
//! structure and where it is; [`FormatFault::is_refusal`] tells a well-formed image that Quarry
//! refuses by design (exit 11) from a corrupt one (exit 12).

use crate::error::FormatFault;

/// A VHDX structure that contradicts the format, or a feature Quarry refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VhdxError {
    #[error("{what} at {offset:#x} ({len} bytes) lies past the end of the image ({end} bytes)")]
    Truncated {
        what: &'static str,
        offset: u64,
        len: u64,
        end: u64,
    },
    #[error("the file identifier at 0x0 has no \"vhdxfile\" signature")]
    NoSignature,
    #[error("neither header (at 0x10000 and 0x20000) has a valid signature, version 1 and CRC-32C")]
    NoValidHeader,
    #[error("the headers at 0x10000 and 0x20000 both have sequence number {sequence} but differ")]
    HeadersDisagree { sequence: u64 },
    #[error("the header at {header:#x} puts the log at {offset:#x} ({len} bytes): {why}")]
    BadLog {
        header: u64,
        offset: u64,
        len: u32,
        why: &'static str,
    },
    #[error(
        "the header at {header:#x} says the log at {offset:#x} ({len} bytes, GUID {guid}) may \
         hold writes that were never replayed, and Quarry does not replay VHDX logs: open the \
         image once in Hyper-V (or run `qemu-img check -r all` on it), then import it again"
    )]
    LogNeedsReplay {
        header: u64,
        offset: u64,
        len: u32,
        guid: String,
    },
    #[error("neither region table (at 0x30000 and 0x40000) has a valid signature and CRC-32C")]
    NoValidRegionTable,
    #[error("the region table at {table:#x} has {count} entries (at most 2047)")]
    RegionCount { table: u64, count: u32 },
    #[error(
        "the region table at {table:#x} places {what} at {start:#x}..{end:#x}, overlapping \
         {other} at {other_start:#x}..{other_end:#x}"
    )]
    RegionOverlap {
        table: u64,
        what: String,
        start: u64,
        end: u64,
        other: String,
        other_start: u64,
        other_end: u64,
    },
    #[error("the region table at {table:#x} has {what} at offset {offset:#x} past 2^64")]
    RegionOverflow {
        table: u64,
        what: String,
        offset: u64,
    },
    #[error("the region table at {table:#x} lists {what} twice")]
    DuplicateRegion { table: u64, what: &'static str },
    #[error("the region table at {table:#x} lacks {what}")]
    MissingRegion { table: u64, what: &'static str },
    #[error("the region table at {table:#x} requires region {guid}, which Quarry does not know")]
    UnknownRequiredRegion { table: u64, guid: String },
    #[error("the metadata region at {offset:#x} is {len} bytes, less than its 64 KiB table")]
    MetadataRegionTooShort { offset: u64, len: u64 },
    #[error("the metadata table at {offset:#x} has no \"metadata\" signature")]
    MetadataSignature { offset: u64 },
    #[error("the metadata table at {offset:#x} has {count} entries (at most 2047)")]
    MetadataCount { offset: u64, count: u16 },
    #[error("the metadata table at {offset:#x} lists {what} twice")]
    DuplicateMetadata { offset: u64, what: &'static str },
    #[error("the metadata table at {offset:#x} lacks {what}")]
    MissingMetadata { offset: u64, what: &'static str },
    #[error("the metadata table at {table:#x} requires item {guid}, which Quarry does not know")]
    UnknownRequiredMetadata { table: u64, guid: String },
    #[error(
        "the metadata table at {table:#x} puts {what} at {offset:#x} ({len} bytes), outside the \
         {region_len}-byte metadata region"
    )]
    MetadataItemOutOfRange {
        table: u64,
        what: &'static str,
        offset: u64,
        len: u64,
        region_len: u64,
    },
    #[error(
        "the file parameters at {offset:#x} mark a differencing image (HasParent): Quarry does \
         not read its parent; merge it into a standalone image first (`qemu-img convert -O vhdx`)"
    )]
    Differencing { offset: u64 },
    #[error(
        "the file parameters at {offset:#x} mark a differencing image (HasParent) but the \
         metadata has no parent locator"
    )]
    ParentWithoutLocator { offset: u64 },
    #[error(
        "the file parameters at {offset:#x} give a block size of {size} bytes (a power of two \
         from 1 MiB to 256 MiB)"
    )]
    BlockSize { offset: u64, size: u32 },
    #[error("the logical sector size at {offset:#x} is {size} bytes (512 or 4096)")]
    LogicalSectorSize { offset: u64, size: u32 },
    #[error("the virtual disk size at {offset:#x} is {size} bytes (1 byte to the format's 64 TiB)")]
    VirtualSize { offset: u64, size: u64 },
    #[error(
        "the BAT at {offset:#x} is {len} bytes, too short for the {entries} entries a \
         {virtual_size}-byte disk needs"
    )]
    BatTooShort {
        offset: u64,
        len: u64,
        entries: u64,
        virtual_size: u64,
    },
    #[error("BAT entry {index} (at {offset:#x}) has state {state}, {why}")]
    BatState {
        index: u64,
        offset: u64,
        state: u8,
        why: &'static str,
    },
    #[error(
        "BAT entry {index} (at {offset:#x}) puts guest offset {guest:#x} at {start:#x}..{end:#x}, \
         overlapping {other} at {other_start:#x}..{other_end:#x}"
    )]
    PayloadOverlap {
        index: u64,
        offset: u64,
        guest: u64,
        start: u64,
        end: u64,
        other: String,
        other_start: u64,
        other_end: u64,
    },
}

impl FormatFault for VhdxError {
    const PREFIX: &'static str = "vhdx: ";

    fn is_refusal(&self) -> bool {
        matches!(
            self,
            VhdxError::LogNeedsReplay { .. }
                | VhdxError::UnknownRequiredRegion { .. }
                | VhdxError::UnknownRequiredMetadata { .. }
                | VhdxError::Differencing { .. }
        )
    }

    fn offset(&self) -> Option<u64> {
        Some(match self {
            VhdxError::NoSignature => 0,
            VhdxError::NoValidHeader | VhdxError::NoValidRegionTable => return None,
            VhdxError::HeadersDisagree { .. } => 0x10000,
            VhdxError::Truncated { offset, .. }
            | VhdxError::MetadataRegionTooShort { offset, .. }
            | VhdxError::MetadataSignature { offset }
            | VhdxError::MetadataCount { offset, .. }
            | VhdxError::DuplicateMetadata { offset, .. }
            | VhdxError::MissingMetadata { offset, .. }
            | VhdxError::Differencing { offset }
            | VhdxError::ParentWithoutLocator { offset }
            | VhdxError::BlockSize { offset, .. }
            | VhdxError::LogicalSectorSize { offset, .. }
            | VhdxError::VirtualSize { offset, .. }
            | VhdxError::BatTooShort { offset, .. }
            | VhdxError::BatState { offset, .. }
            | VhdxError::PayloadOverlap { offset, .. } => *offset,
            VhdxError::BadLog { header, .. } | VhdxError::LogNeedsReplay { header, .. } => *header,
            VhdxError::RegionCount { table, .. }
            | VhdxError::RegionOverlap { table, .. }
            | VhdxError::RegionOverflow { table, .. }
            | VhdxError::DuplicateRegion { table, .. }
            | VhdxError::MissingRegion { table, .. }
            | VhdxError::UnknownRequiredRegion { table, .. }
            | VhdxError::UnknownRequiredMetadata { table, .. }
            | VhdxError::MetadataItemOutOfRange { table, .. } => *table,
        })
    }
}
