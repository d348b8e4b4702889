//! What the pure qcow2 decoders find wrong: with the header ([`HeaderError`], a [`FormatFault`]
//! with its place), and with a table entry ([`Qcow2Error`], to which the converters add where the
//! entry is).

use crate::error::FormatFault;

/// A table entry that contradicts the format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Qcow2Error {
    #[error("L2 table offset {offset:#x} is not cluster aligned")]
    MisalignedL2Table { offset: u64 },
    #[error("data cluster offset {offset:#x} is not cluster aligned")]
    MisalignedDataCluster { offset: u64 },
    #[error("unallocated cluster has allocated subclusters (bitmap {bitmap:#018x})")]
    UnallocatedWithSubclusters { bitmap: u64 },
    #[error("subclusters both allocated and zero (bitmap {bitmap:#018x})")]
    SubclustersAllocatedAndZero { bitmap: u64 },
}

/// The spec reference in the tests reports every failure as text.
#[cfg(test)]
impl From<Qcow2Error> for String {
    fn from(e: Qcow2Error) -> String {
        e.to_string()
    }
}

/// The unit tests written when the decoders returned text look into the message.
#[cfg(test)]
impl Qcow2Error {
    pub(crate) fn contains(&self, text: &str) -> bool {
        self.to_string().contains(text)
    }
}

/// What the qcow2 header parser ([`super::header::parse`]) finds wrong or refuses. Each variant
/// names the field or structure, and where the structure is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("qcow2 header: bad magic {magic:02x?} (not a qcow2 image)")]
    BadMagic { magic: [u8; 4] },
    #[error("qcow2 header: truncated: the image is {len} bytes, shorter than a header")]
    ShortHeader { len: usize },
    #[error("qcow2 header: truncated: the image is {len} bytes, shorter than a version 3 header")]
    ShortV3Header { len: usize },
    #[error(
        "qcow2 header: truncated: the image is {len} bytes, shorter than its {header_length}-byte header"
    )]
    ShortForHeaderLength { len: usize, header_length: u32 },
    #[error("qcow version 1 (the original qcow format, not qcow2)")]
    Qcow1,
    #[error("qcow2 header: unknown version {version} (expected 2 or 3)")]
    UnknownVersion { version: u32 },
    #[error("qcow2 header: cluster_bits {cluster_bits} is outside {min}..={max}")]
    ClusterBits {
        cluster_bits: u32,
        min: u32,
        max: u32,
    },
    #[error("qcow2 header: header_length {header_length} is shorter than {min}")]
    HeaderLengthTooShort { header_length: u32, min: usize },
    #[error("qcow2 header: header_length {header_length} exceeds the cluster size {cluster_size}")]
    HeaderLengthTooLong {
        header_length: u32,
        cluster_size: u64,
    },
    #[error("qcow2 header: backing file name offset {offset:#x} is outside the first cluster")]
    BackingNameOutside { offset: u64 },
    #[error("qcow2 header: header extension at {offset:#x} does not fit before {end:#x}")]
    ExtensionOutside { offset: u64, end: u64 },
    #[error(
        "qcow2 header: truncated: header extension at {offset:#x} is past the end of the image ({len} bytes)"
    )]
    ExtensionTruncated { offset: u64, len: usize },
    #[error(
        "qcow2 header: header extension {magic:#010x} at {offset:#x} ({len} bytes) is too large"
    )]
    ExtensionTooLarge { magic: u32, offset: u64, len: u64 },
    #[error(
        "qcow2 header: truncated: header extension {magic:#010x} at {offset:#x} is past the end of the image"
    )]
    ExtensionDataTruncated { magic: u32, offset: u64 },
    #[error("qcow2 header: backing format extension is {len} bytes long (at most 15)")]
    BackingFormatTooLong { offset: u64, len: usize },
    #[error(
        "qcow2 image has a backing file {name}{fmt}; images with backing files are not supported",
        fmt = .backing_format.as_deref().map(|f| format!(" (format {f})")).unwrap_or_default()
    )]
    BackingFile {
        name: String,
        backing_format: Option<String>,
    },
    #[error("qcow2 image is encrypted ({how}); encrypted images are not supported")]
    Encrypted { how: String },
    #[error("qcow2 image uses unknown incompatible feature {names}")]
    UnknownIncompatible { names: String },
    #[error(
        "qcow2 image keeps its data in an external data file{shown}; external data files are not supported",
        shown = .name.as_deref().map(|n| format!(" {n:?}")).unwrap_or_default()
    )]
    ExternalDataFile { name: Option<String> },
    #[error("qcow2 header: unknown compression type {compression_type}")]
    UnknownCompression { compression_type: u8 },
    #[error(
        "qcow2 header: compression type {compression_type} disagrees with the compression feature bit"
    )]
    CompressionBit { compression_type: u8 },
    #[error(
        "qcow2 header: extended L2 entries need clusters of at least 16 KiB, not {cluster_size} bytes"
    )]
    ExtendedL2Clusters { cluster_size: u64 },
    #[error("qcow2 header: refcount_order {order}: refcounts wider than 64 bits")]
    RefcountOrder { order: u32 },
    #[error(
        "qcow2 header: L1 table of {entries} entries is too large (qemu's limit is {max} entries)"
    )]
    L1TooLarge { entries: u32, max: u64 },
    #[error(
        "qcow2 header: L1 table of {entries} entries is too small for a {size}-byte disk ({needed} needed)"
    )]
    L1TooSmall {
        entries: u32,
        size: u64,
        needed: u64,
    },
    #[error("qcow2 header: {what} offset {offset:#x} is not cluster aligned")]
    Misaligned { what: &'static str, offset: u64 },
    #[error("qcow2 header: {what} at {offset:#x} (+{len} bytes) overflows")]
    TableOverflow {
        what: &'static str,
        offset: u64,
        len: u64,
    },
    #[error("qcow2 header: the {what} overlaps the {other}")]
    Overlap {
        what: &'static str,
        offset: u64,
        other: &'static str,
    },
    #[error("qcow2 header: refcount table of {clusters} clusters is too large")]
    RefcountTableTooLarge { clusters: u32 },
    #[error("qcow2 header: {count} snapshots is too many")]
    TooManySnapshots { count: u32 },
}

impl FormatFault for HeaderError {
    /// Every message names qcow2 (`qcow2 header: ...`, `qcow2 image has ...`).
    const PREFIX: &'static str = "";

    fn is_refusal(&self) -> bool {
        matches!(
            self,
            HeaderError::Qcow1
                | HeaderError::BackingFile { .. }
                | HeaderError::Encrypted { .. }
                | HeaderError::UnknownIncompatible { .. }
                | HeaderError::ExternalDataFile { .. }
        )
    }

    /// An extension's or a table's offset; the header's (0) for the rest.
    fn offset(&self) -> Option<u64> {
        Some(match self {
            HeaderError::ExtensionOutside { offset, .. }
            | HeaderError::ExtensionTruncated { offset, .. }
            | HeaderError::ExtensionTooLarge { offset, .. }
            | HeaderError::ExtensionDataTruncated { offset, .. }
            | HeaderError::BackingFormatTooLong { offset, .. }
            | HeaderError::Misaligned { offset, .. }
            | HeaderError::TableOverflow { offset, .. }
            | HeaderError::Overlap { offset, .. } => *offset,
            _ => 0,
        })
    }
}
