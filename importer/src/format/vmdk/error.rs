//! What the pure VMDK decoders ([`super::header`], [`super::descriptor`], [`super::marker`]) find
//! wrong or refuse. Each variant names the structure and, where it has one, its offset; the
//! format contract ([`FormatFault`]) decides the exit code: refusals are unsupported (11), the
//! rest corrupt (12).

use crate::error::FormatFault;

/// A VMDK structure that contradicts the format, or uses a feature Quarry refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmdkError {
    #[error("vmdk sparse header: truncated ({len} of 512 bytes)")]
    TruncatedHeader { len: usize },
    #[error("vmdk sparse header: bad magic {magic:02x?}")]
    BadMagic { magic: [u8; 4] },
    #[error("vmdk sparse header: version {version} is newer than 3")]
    UnsupportedVersion { version: u32 },
    #[error("vmdk sparse header: {gtes} grain table entries per table (at most 512)")]
    GrainTableTooBig { gtes: u32 },
    #[error("vmdk sparse header: grain size of {granularity} sectors is invalid")]
    BadGranularity { granularity: u64 },
    #[error(
        "vmdk sparse header: grains of {granularity} sectors are larger than the 2 MiB this reader supports"
    )]
    GrainTooLarge { granularity: u64 },
    #[error("vmdk sparse header: capacity of {capacity} sectors is out of range")]
    BadCapacity { capacity: u64 },
    #[error(
        "vmdk sparse header: the grain directory of {entries} entries exceeds the {max} this reader holds"
    )]
    GrainDirectoryTooBig { entries: u64, max: u64 },
    #[error("vmdk sparse header: {what} at sector {sector} is out of range")]
    OffsetOutOfRange { what: &'static str, sector: u64 },
    #[error("vmdk sparse header: {what} at sector {sector} overlaps the header")]
    MetadataInHeader { what: &'static str, sector: u64 },
    #[error("vmdk sparse header: compressed grains without grain markers are not supported")]
    CompressedWithoutMarkers,
    #[error("vmdk sparse header: compression algorithm {algorithm} is not deflate")]
    UnknownCompression { algorithm: u16 },
    #[error(
        "vmdk sparse header: an uncompressed extent with its grain directory at the end (gdOffset = -1) cannot be streamed"
    )]
    UncompressedGdAtEnd,
    #[error("vmdk sparse header: the extent holds only an embedded descriptor (capacity 0)")]
    DescriptorOnlyExtent,
    #[error("vmdk descriptor: {0}")]
    BadDescriptor(String),
    #[error("vmdk descriptor: createType {0:?} is not supported")]
    UnsupportedCreateType(String),
    #[error(
        "vmdk descriptor: the disk is a snapshot or delta of a parent disk ({0}); import the parent, or consolidate the snapshot first"
    )]
    HasParent(String),
    #[error("vmdk descriptor: extent {index} ({line:?}): {why}")]
    UnsupportedExtent {
        index: usize,
        line: String,
        why: String,
    },
    #[error("vmdk marker at {offset:#x}: {why}")]
    BadMarker { offset: u64, why: String },
    #[error("vmdk: this is a descriptor, whose extents are separate files; {0}")]
    StreamedDescriptor(StreamedBecause),
}

/// Why a descriptor reached the reader as a stream rather than as a local file with its extent
/// files beside it (the one way its extents can be read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamedBecause {
    /// It came from the network or standard input.
    Remote,
    /// It is a local file under this compression layer.
    Compressed(&'static str),
    /// It is a local file given with `--checksum`, which covers that one file only.
    Checksum,
    /// It is the disk an OVA names.
    InOva,
}

impl std::fmt::Display for StreamedBecause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamedBecause::Remote => f.write_str(
                "import it from a local path with its extent files in the same directory (a \
                 descriptor cannot be read from the network or standard input)",
            ),
            StreamedBecause::Compressed(layer) => write!(
                f,
                "it is {layer}-compressed, and a descriptor is read only as an uncompressed \
                 local file: decompress it beside its extent files, then import it"
            ),
            StreamedBecause::Checksum => f.write_str(
                "--checksum would cover only the descriptor's text, not the disk in its extent \
                 files: import it without --checksum",
            ),
            StreamedBecause::InOva => f.write_str(
                "the OVA's disk is a descriptor: extract the OVA and import the descriptor from \
                 the directory its extent files are in",
            ),
        }
    }
}

impl FormatFault for VmdkError {
    /// Every message names the vmdk structure it is about (`vmdk sparse header: ...`).
    const PREFIX: &'static str = "";

    fn is_refusal(&self) -> bool {
        matches!(
            self,
            VmdkError::UnsupportedVersion { .. }
                | VmdkError::GrainTooLarge { .. }
                | VmdkError::GrainDirectoryTooBig { .. }
                | VmdkError::CompressedWithoutMarkers
                | VmdkError::UncompressedGdAtEnd
                | VmdkError::DescriptorOnlyExtent
                | VmdkError::UnsupportedCreateType(_)
                | VmdkError::HasParent(_)
                | VmdkError::UnsupportedExtent { .. }
                | VmdkError::StreamedDescriptor(_)
        )
    }

    /// A marker's offset; the sparse header's (0) for its faults; none for a descriptor's (text).
    fn offset(&self) -> Option<u64> {
        match self {
            VmdkError::BadMarker { offset, .. } => Some(*offset),
            VmdkError::BadDescriptor(_)
            | VmdkError::UnsupportedCreateType(_)
            | VmdkError::HasParent(_)
            | VmdkError::UnsupportedExtent { .. }
            | VmdkError::StreamedDescriptor(_) => None,
            _ => Some(0),
        }
    }
}
