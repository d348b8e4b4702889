//! The qcow2 header and its extensions: a pure parse of the image's first cluster.
//!
//! [`parse`] takes the first bytes of the image (up to one cluster: the header, its extensions and
//! the backing file name all live there) and returns a validated [`Header`], or the reason the image
//! cannot be converted, a [`HeaderError`]: a refusal (unsupported) for well-formed images using a
//! feature Quarry refuses (backing file, encryption, external data file, unknown incompatible
//! features), corrupt for headers that contradict themselves. The checks follow qemu's
//! `qcow2_do_open` so that what qemu opens, this opens, and the limits are qemu's.

use super::error::HeaderError;
use crate::error::Result;
use crate::format::fields::{be32, be64};

/// The four bytes every qcow image starts with.
pub const MAGIC: [u8; 4] = *b"QFI\xfb";

/// Smallest and largest cluster sizes qemu accepts: 512 B and 2 MiB.
pub const MIN_CLUSTER_BITS: u32 = 9;
pub const MAX_CLUSTER_BITS: u32 = 21;
/// qemu's cap on the active L1 table (`QCOW_MAX_L1_SIZE`).
pub const MAX_L1_BYTES: u64 = 32 << 20;
/// qemu's cap on the refcount table (`QCOW_MAX_REFTABLE_SIZE`).
pub const MAX_REFTABLE_BYTES: u64 = 8 << 20;
/// qemu's cap on the number of internal snapshots (`QCOW_MAX_SNAPSHOTS`).
pub const MAX_SNAPSHOTS: u32 = 65536;

const V2_HEADER_LEN: usize = 72;
const V3_HEADER_MIN_LEN: usize = 104;
/// Size of a snapshot table entry without its variable parts (`QCowSnapshotHeader`).
const SNAPSHOT_HEADER_LEN: u64 = 40;

/// Incompatible feature bits.
pub mod incompat {
    pub const DIRTY: u64 = 1 << 0;
    pub const CORRUPT: u64 = 1 << 1;
    pub const DATA_FILE: u64 = 1 << 2;
    pub const COMPRESSION: u64 = 1 << 3;
    pub const EXTENDED_L2: u64 = 1 << 4;
    /// Every bit this reader understands.
    pub const KNOWN: u64 = DIRTY | CORRUPT | DATA_FILE | COMPRESSION | EXTENDED_L2;
}

/// Header extension types.
pub mod ext {
    pub const END: u32 = 0;
    pub const BACKING_FORMAT: u32 = 0xe279_2aca;
    pub const FEATURE_TABLE: u32 = 0x6803_f857;
    pub const CRYPTO: u32 = 0x0537_be77;
    pub const BITMAPS: u32 = 0x2385_2875;
    pub const DATA_FILE: u32 = 0x4441_5441;
}

/// How compressed clusters are compressed (header field `compression_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Raw deflate, 4 KiB window (qemu's `inflateInit2(-12)`).
    Deflate,
    /// zstd frames.
    Zstd,
}

/// One entry of the feature name table extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureName {
    /// 0 incompatible, 1 compatible, 2 autoclear.
    pub kind: u8,
    pub bit: u8,
    pub name: String,
}

/// A validated qcow2 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// 2 or 3.
    pub version: u32,
    pub cluster_bits: u32,
    /// Guest disk size in bytes: the header's size rounded down to whole 512-byte sectors, as
    /// qemu reads it (`total_sectors = size / 512`).
    pub virtual_size: u64,
    /// Entries in the active L1 table (may exceed what the virtual size needs: VM state).
    pub l1_entries: u32,
    pub l1_offset: u64,
    pub refcount_table_offset: u64,
    pub refcount_table_clusters: u32,
    pub nb_snapshots: u32,
    pub snapshots_offset: u64,
    pub incompatible_features: u64,
    pub compatible_features: u64,
    pub autoclear_features: u64,
    /// log2 of the refcount width in bits (0..=6; 4 for version 2).
    pub refcount_order: u32,
    pub header_length: u32,
    pub compression: Compression,
    /// 128-bit L2 entries with 32 subclusters each.
    pub extended_l2: bool,
    /// The backing format extension, if any (only informative: backing files are refused).
    pub backing_format: Option<String>,
    pub feature_names: Vec<FeatureName>,
}

impl Header {
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// Bytes per L2 entry: 8, or 16 with extended L2 entries.
    pub fn l2_entry_size(&self) -> u64 {
        if self.extended_l2 { 16 } else { 8 }
    }

    /// Entries per L2 table (one cluster).
    pub fn l2_entries(&self) -> u64 {
        self.cluster_size() / self.l2_entry_size()
    }

    /// Subclusters per cluster: 32 with extended L2 entries, else 1.
    pub fn subclusters(&self) -> u32 {
        if self.extended_l2 { 32 } else { 1 }
    }

    /// Guest clusters covering the virtual size (the last one may be partial).
    pub fn guest_clusters(&self) -> u64 {
        self.virtual_size.div_ceil(self.cluster_size())
    }

    /// L1 entries that map the virtual disk (qemu's `l1_vm_state_index`); later ones map VM state.
    pub fn l1_entries_needed(&self) -> u64 {
        self.guest_clusters().div_ceil(self.l2_entries())
    }

    pub fn is_dirty(&self) -> bool {
        self.incompatible_features & incompat::DIRTY != 0
    }

    pub fn is_marked_corrupt(&self) -> bool {
        self.incompatible_features & incompat::CORRUPT != 0
    }
}

/// Reads the cluster_bits field if the buffer is long enough and it is in range: how many bytes
/// [`parse`] may want (the whole first cluster).
pub fn wanted_len(head: &[u8]) -> usize {
    if head.len() >= 24 {
        let bits = be32(head, 20);
        if (MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&bits) {
            return 1 << bits;
        }
    }
    1 << MIN_CLUSTER_BITS
}

/// Bytes of text in a header field, lossily decoded and cut at the first NUL.
fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Host byte range `[offset, offset + len)`, refusing overflow past `i64::MAX` like qemu.
fn table_end(what: &'static str, offset: u64, len: u64) -> Result<u64> {
    Ok(offset
        .checked_add(len)
        .filter(|&end| end <= i64::MAX as u64)
        .ok_or(HeaderError::TableOverflow { what, offset, len })?)
}

/// What the extension area told us.
#[derive(Default)]
struct Extensions {
    backing_format: Option<String>,
    feature_names: Vec<FeatureName>,
    data_file: Option<String>,
    crypto: bool,
}

fn parse_extensions(buf: &[u8], start: u64, end: u64) -> Result<Extensions> {
    let mut exts = Extensions::default();
    let mut off = start;
    while off < end {
        let hdr_end = off + 8;
        if hdr_end > end {
            return Err(HeaderError::ExtensionOutside { offset: off, end }.into());
        }
        if hdr_end > buf.len() as u64 {
            return Err(HeaderError::ExtensionTruncated {
                offset: off,
                len: buf.len(),
            }
            .into());
        }
        let magic = be32(buf, off as usize);
        let len = u64::from(be32(buf, off as usize + 4));
        // qemu checks the length before the type: an end marker too long is corrupt too.
        let data_end = hdr_end + len;
        if data_end > end {
            return Err(HeaderError::ExtensionTooLarge {
                magic,
                offset: off,
                len,
            }
            .into());
        }
        if magic == ext::END {
            break;
        }
        if data_end > buf.len() as u64 {
            return Err(HeaderError::ExtensionDataTruncated { magic, offset: off }.into());
        }
        let data = &buf[hdr_end as usize..data_end as usize];
        match magic {
            ext::BACKING_FORMAT => {
                if data.len() >= 16 {
                    return Err(HeaderError::BackingFormatTooLong {
                        offset: off,
                        len: data.len(),
                    }
                    .into());
                }
                exts.backing_format = Some(text(data));
            }
            ext::FEATURE_TABLE => {
                exts.feature_names = data
                    .chunks_exact(48)
                    .map(|e| FeatureName {
                        kind: e[0],
                        bit: e[1],
                        name: text(&e[2..]),
                    })
                    .collect();
            }
            ext::CRYPTO => exts.crypto = true,
            ext::DATA_FILE => exts.data_file = Some(text(data)),
            // Bitmaps, and extensions we do not know, do not change what the guest reads.
            _ => {}
        }
        off = hdr_end + len.next_multiple_of(8);
    }
    Ok(exts)
}

/// Parses and validates the header from the first bytes of the image (ideally the whole first
/// cluster; fewer at the end of a short stream).
pub fn parse(buf: &[u8]) -> Result<Header> {
    if buf.len() >= 4 && buf[..4] != MAGIC {
        let magic = buf[..4].try_into().expect("4 bytes");
        return Err(HeaderError::BadMagic { magic }.into());
    }
    if buf.len() < V2_HEADER_LEN {
        return Err(HeaderError::ShortHeader { len: buf.len() }.into());
    }
    let version = be32(buf, 4);
    match version {
        2 | 3 => {}
        1 => {
            return Err(HeaderError::Qcow1.into());
        }
        version => return Err(HeaderError::UnknownVersion { version }.into()),
    }
    let backing_file_offset = be64(buf, 8);
    let backing_file_size = be32(buf, 16);
    let cluster_bits = be32(buf, 20);
    if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
        return Err(HeaderError::ClusterBits {
            cluster_bits,
            min: MIN_CLUSTER_BITS,
            max: MAX_CLUSTER_BITS,
        }
        .into());
    }
    let cluster_size = 1u64 << cluster_bits;
    let header_size = be64(buf, 24);
    let virtual_size = header_size / 512 * 512;
    let crypt_method = be32(buf, 32);
    let l1_entries = be32(buf, 36);
    let l1_offset = be64(buf, 40);
    let refcount_table_offset = be64(buf, 48);
    let refcount_table_clusters = be32(buf, 56);
    let nb_snapshots = be32(buf, 60);
    let snapshots_offset = be64(buf, 64);

    let (incompatible, compatible, autoclear, refcount_order, header_length, compression_type);
    if version == 2 {
        (incompatible, compatible, autoclear) = (0, 0, 0);
        refcount_order = 4;
        header_length = V2_HEADER_LEN as u32;
        compression_type = 0u8;
    } else {
        if buf.len() < V3_HEADER_MIN_LEN {
            return Err(HeaderError::ShortV3Header { len: buf.len() }.into());
        }
        incompatible = be64(buf, 72);
        compatible = be64(buf, 80);
        autoclear = be64(buf, 88);
        refcount_order = be32(buf, 96);
        header_length = be32(buf, 100);
        if (header_length as usize) < V3_HEADER_MIN_LEN {
            return Err(HeaderError::HeaderLengthTooShort {
                header_length,
                min: V3_HEADER_MIN_LEN,
            }
            .into());
        }
        if u64::from(header_length) > cluster_size {
            return Err(HeaderError::HeaderLengthTooLong {
                header_length,
                cluster_size,
            }
            .into());
        }
        if buf.len() < header_length as usize {
            return Err(HeaderError::ShortForHeaderLength {
                len: buf.len(),
                header_length,
            }
            .into());
        }
        compression_type = if header_length > 104 { buf[104] } else { 0 };
    }

    // The extension area ends where the backing file name starts, or at the end of the cluster.
    if backing_file_offset > cluster_size {
        return Err(HeaderError::BackingNameOutside {
            offset: backing_file_offset,
        }
        .into());
    }
    let ext_end = if backing_file_offset != 0 {
        backing_file_offset
    } else {
        cluster_size
    };
    let exts = parse_extensions(buf, u64::from(header_length), ext_end)?;

    // Refusals: well-formed images that use a feature Quarry does not convert.
    if backing_file_offset != 0 {
        let start = backing_file_offset as usize;
        let name = if backing_file_size > 1023
            || u64::from(backing_file_size) > cluster_size - backing_file_offset
        {
            format!("<name of {backing_file_size} bytes, too long>")
        } else {
            match buf.get(start..start + backing_file_size as usize) {
                Some(b) => format!("{:?}", String::from_utf8_lossy(b)),
                None => "<name past the end of the stream>".into(),
            }
        };
        return Err(HeaderError::BackingFile {
            name,
            backing_format: exts.backing_format,
        }
        .into());
    }
    if crypt_method != 0 || exts.crypto {
        let how = match crypt_method {
            1 => "AES".to_string(),
            2 => "LUKS".to_string(),
            0 => "a crypto header".to_string(),
            m => format!("method {m}"),
        };
        return Err(HeaderError::Encrypted { how }.into());
    }
    let unknown = incompatible & !incompat::KNOWN;
    if unknown != 0 {
        let names: Vec<String> = (0..64)
            .filter(|b| unknown & (1u64 << b) != 0)
            .map(|b| {
                match exts
                    .feature_names
                    .iter()
                    .find(|f| f.kind == 0 && u32::from(f.bit) == b)
                {
                    Some(f) => format!("bit {b} ({})", f.name),
                    None => format!("bit {b}"),
                }
            })
            .collect();
        return Err(HeaderError::UnknownIncompatible {
            names: names.join(", "),
        }
        .into());
    }
    if incompatible & incompat::DATA_FILE != 0 || exts.data_file.is_some() {
        return Err(HeaderError::ExternalDataFile {
            name: exts.data_file,
        }
        .into());
    }

    // Consistency.
    let compression = match compression_type {
        0 => Compression::Deflate,
        1 => Compression::Zstd,
        compression_type => return Err(HeaderError::UnknownCompression { compression_type }.into()),
    };
    let has_compression_bit = incompatible & incompat::COMPRESSION != 0;
    if has_compression_bit != (compression != Compression::Deflate) {
        return Err(HeaderError::CompressionBit { compression_type }.into());
    }
    let extended_l2 = incompatible & incompat::EXTENDED_L2 != 0;
    if extended_l2 && cluster_size / 32 < 512 {
        return Err(HeaderError::ExtendedL2Clusters { cluster_size }.into());
    }
    if refcount_order > 6 {
        return Err(HeaderError::RefcountOrder {
            order: refcount_order,
        }
        .into());
    }

    let header = Header {
        version,
        cluster_bits,
        virtual_size,
        l1_entries,
        l1_offset,
        refcount_table_offset,
        refcount_table_clusters,
        nb_snapshots,
        snapshots_offset,
        incompatible_features: incompatible,
        compatible_features: compatible,
        autoclear_features: autoclear,
        refcount_order,
        header_length,
        compression,
        extended_l2,
        backing_format: exts.backing_format,
        feature_names: exts.feature_names,
    };

    // The L1 table: capped, aligned, large enough for the disk, clear of the header.
    let l1_bytes = u64::from(l1_entries) * 8;
    if l1_bytes > MAX_L1_BYTES {
        return Err(HeaderError::L1TooLarge {
            entries: l1_entries,
            max: MAX_L1_BYTES / 8,
        }
        .into());
    }
    // qemu checks the L1 size against the header's size before rounding it to sectors.
    let needed = header_size
        .div_ceil(cluster_size)
        .div_ceil(header.l2_entries());
    if needed > u64::from(l1_entries) {
        return Err(HeaderError::L1TooSmall {
            entries: l1_entries,
            size: header_size,
            needed,
        }
        .into());
    }
    if !l1_offset.is_multiple_of(cluster_size) {
        return Err(HeaderError::Misaligned {
            what: "L1 table",
            offset: l1_offset,
        }
        .into());
    }
    let l1_end = table_end("L1 table", l1_offset, l1_bytes)?;
    if l1_bytes > 0 && l1_offset < cluster_size {
        return Err(HeaderError::Overlap {
            what: "L1 table",
            offset: l1_offset,
            other: "header",
        }
        .into());
    }

    // The refcount table: Quarry does not need refcounts, but they must make sense.
    if u64::from(refcount_table_clusters) > MAX_REFTABLE_BYTES >> cluster_bits {
        return Err(HeaderError::RefcountTableTooLarge {
            clusters: refcount_table_clusters,
        }
        .into());
    }
    if !refcount_table_offset.is_multiple_of(cluster_size) {
        return Err(HeaderError::Misaligned {
            what: "refcount table",
            offset: refcount_table_offset,
        }
        .into());
    }
    let rt_bytes = u64::from(refcount_table_clusters) << cluster_bits;
    let rt_end = table_end("refcount table", refcount_table_offset, rt_bytes)?;
    if rt_bytes > 0 && refcount_table_offset < cluster_size {
        return Err(HeaderError::Overlap {
            what: "refcount table",
            offset: refcount_table_offset,
            other: "header",
        }
        .into());
    }
    if l1_bytes > 0 && rt_bytes > 0 && l1_offset < rt_end && refcount_table_offset < l1_end {
        return Err(HeaderError::Overlap {
            what: "L1 table",
            offset: l1_offset,
            other: "refcount table",
        }
        .into());
    }

    // Snapshots: only the active L1 is converted, but the table must be plausible.
    if nb_snapshots > MAX_SNAPSHOTS {
        return Err(HeaderError::TooManySnapshots {
            count: nb_snapshots,
        }
        .into());
    }
    if !snapshots_offset.is_multiple_of(cluster_size) {
        return Err(HeaderError::Misaligned {
            what: "snapshot table",
            offset: snapshots_offset,
        }
        .into());
    }
    table_end(
        "snapshot table",
        snapshots_offset,
        u64::from(nb_snapshots) * SNAPSHOT_HEADER_LEN,
    )?;
    Ok(header)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{Error, ErrorKind};

    /// Header fields for building test images; `encode` lays them out big-endian.
    #[derive(Debug, Clone)]
    pub(crate) struct Fields {
        pub version: u32,
        pub backing_offset: u64,
        pub backing_size: u32,
        pub cluster_bits: u32,
        pub size: u64,
        pub crypt: u32,
        pub l1_size: u32,
        pub l1_offset: u64,
        pub rt_offset: u64,
        pub rt_clusters: u32,
        pub nb_snapshots: u32,
        pub snapshots_offset: u64,
        pub incompat: u64,
        pub compat: u64,
        pub autoclear: u64,
        pub refcount_order: u32,
        pub header_length: u32,
        pub compression_type: u8,
        /// (type, data) extensions written after the header, then an end marker.
        pub extensions: Vec<(u32, Vec<u8>)>,
    }

    impl Fields {
        /// A v3 header: refcount table in cluster 1, L1 table in cluster 2, sized for `size`.
        pub fn v3(cluster_bits: u32, size: u64) -> Fields {
            let cs = 1u64 << cluster_bits;
            let l1 = size.div_ceil(cs).div_ceil(cs / 8) as u32;
            Fields {
                version: 3,
                backing_offset: 0,
                backing_size: 0,
                cluster_bits,
                size,
                crypt: 0,
                l1_size: l1,
                l1_offset: 2 * cs,
                rt_offset: cs,
                rt_clusters: 1,
                nb_snapshots: 0,
                snapshots_offset: 0,
                incompat: 0,
                compat: 0,
                autoclear: 0,
                refcount_order: 4,
                header_length: 112,
                compression_type: 0,
                extensions: Vec::new(),
            }
        }

        pub fn v2(cluster_bits: u32, size: u64) -> Fields {
            Fields {
                version: 2,
                header_length: 72,
                ..Fields::v3(cluster_bits, size)
            }
        }

        /// The header bytes, extensions and end marker included (not padded to a cluster).
        pub fn encode(&self) -> Vec<u8> {
            let mut b = Vec::new();
            b.extend_from_slice(&MAGIC);
            b.extend_from_slice(&self.version.to_be_bytes());
            b.extend_from_slice(&self.backing_offset.to_be_bytes());
            b.extend_from_slice(&self.backing_size.to_be_bytes());
            b.extend_from_slice(&self.cluster_bits.to_be_bytes());
            b.extend_from_slice(&self.size.to_be_bytes());
            b.extend_from_slice(&self.crypt.to_be_bytes());
            b.extend_from_slice(&self.l1_size.to_be_bytes());
            b.extend_from_slice(&self.l1_offset.to_be_bytes());
            b.extend_from_slice(&self.rt_offset.to_be_bytes());
            b.extend_from_slice(&self.rt_clusters.to_be_bytes());
            b.extend_from_slice(&self.nb_snapshots.to_be_bytes());
            b.extend_from_slice(&self.snapshots_offset.to_be_bytes());
            if self.version >= 3 {
                b.extend_from_slice(&self.incompat.to_be_bytes());
                b.extend_from_slice(&self.compat.to_be_bytes());
                b.extend_from_slice(&self.autoclear.to_be_bytes());
                b.extend_from_slice(&self.refcount_order.to_be_bytes());
                b.extend_from_slice(&self.header_length.to_be_bytes());
                b.push(self.compression_type);
                b.resize((self.header_length as usize).max(b.len()), 0);
                b.truncate(self.header_length as usize);
            }
            for (t, data) in &self.extensions {
                b.extend_from_slice(&t.to_be_bytes());
                b.extend_from_slice(&(data.len() as u32).to_be_bytes());
                b.extend_from_slice(data);
                b.resize(b.len().next_multiple_of(8), 0);
            }
            b.extend_from_slice(&[0; 8]);
            b
        }

        /// The header padded to a whole cluster.
        pub fn cluster(&self) -> Vec<u8> {
            let mut b = self.encode();
            b.resize(b.len().max(1 << self.cluster_bits), 0);
            b
        }
    }

    fn err(f: &Fields) -> Error {
        parse(&f.cluster()).expect_err("header should be refused")
    }

    fn assert_err(f: &Fields, kind: ErrorKind, needle: &str) {
        let e = err(f);
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.to_string().contains(needle), "{e:?} lacks {needle:?}");
    }

    #[test]
    fn the_virtual_size_is_whole_sectors_as_qemu_reads_it() {
        let h = parse(&Fields::v3(16, 67_108_863).cluster()).unwrap();
        assert_eq!(h.virtual_size, 67_108_352);
        let h = parse(&Fields::v3(16, 511).cluster()).unwrap();
        assert_eq!(h.virtual_size, 0);
    }

    #[test]
    fn parses_a_v3_header() {
        let h = parse(&Fields::v3(16, 10 << 20).cluster()).unwrap();
        assert_eq!(h.version, 3);
        assert_eq!(h.cluster_size(), 65536);
        assert_eq!(h.virtual_size, 10 << 20);
        assert_eq!(h.l1_offset, 2 * 65536);
        assert_eq!(h.l2_entries(), 8192);
        assert_eq!(h.guest_clusters(), 160);
        assert_eq!(h.l1_entries_needed(), 1);
        assert_eq!(h.compression, Compression::Deflate);
        assert!(!h.extended_l2 && !h.is_dirty());
    }

    #[test]
    fn parses_a_v2_header_with_v2_defaults() {
        let h = parse(&Fields::v2(12, 1 << 20).cluster()).unwrap();
        assert_eq!((h.version, h.refcount_order, h.header_length), (2, 4, 72));
        assert_eq!(h.incompatible_features, 0);
    }

    #[test]
    fn v2_ignores_bytes_where_v3_has_feature_fields() {
        let mut c = Fields::v2(16, 1 << 20).cluster();
        c[72..80].copy_from_slice(&u64::MAX.to_be_bytes());
        // The extension area starts at 72 in v2, so these bytes read as an unknown extension
        // whose length runs past the cluster.
        assert_eq!(parse(&c).unwrap_err().kind(), ErrorKind::CorruptImage);
    }

    #[test]
    fn rejects_bad_magic() {
        let mut c = Fields::v3(16, 1 << 20).cluster();
        c[0] = b'X';
        let e = parse(&c).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptImage);
        assert!(e.to_string().contains("magic"), "{e}");
    }

    #[test]
    fn rejects_unknown_versions_and_refuses_qcow1() {
        for v in [0, 4, 0xffff_ffff] {
            let f = Fields {
                version: v,
                ..Fields::v3(16, 1 << 20)
            };
            assert_err(&f, ErrorKind::CorruptImage, "version");
        }
        let f = Fields {
            version: 1,
            ..Fields::v2(16, 1 << 20)
        };
        assert_err(&f, ErrorKind::Unsupported, "qcow version 1");
    }

    #[test]
    fn rejects_cluster_bits_outside_9_to_21() {
        for bits in [0u32, 8, 22, 63, 0xffff_ffff] {
            let mut c = Fields::v3(16, 1 << 20).cluster();
            c[20..24].copy_from_slice(&bits.to_be_bytes());
            let e = parse(&c).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::CorruptImage, "{bits}");
            assert!(e.to_string().contains("cluster_bits"), "{e}");
        }
        for bits in [9, 21] {
            assert!(
                parse(&Fields::v3(bits, 1 << 20).cluster()).is_ok(),
                "{bits}"
            );
        }
    }

    #[test]
    fn rejects_truncated_headers() {
        let c = Fields::v3(16, 1 << 20).cluster();
        for len in [0, 3, 4, 71, 103, 111] {
            let e = parse(&c[..len]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::CorruptImage, "{len}");
            assert!(e.to_string().contains("truncated"), "{len}: {e}");
        }
        // The end marker sits at 112..120.
        assert!(
            parse(&c[..119])
                .unwrap_err()
                .to_string()
                .contains("truncated")
        );
        assert!(parse(&c[..120]).is_ok());
    }

    #[test]
    fn rejects_bad_header_length() {
        let f = Fields {
            header_length: 100,
            ..Fields::v3(16, 1 << 20)
        };
        let mut c = f.cluster();
        c[100..104].copy_from_slice(&100u32.to_be_bytes());
        let e = parse(&c).unwrap_err();
        assert!(e.to_string().contains("header_length"), "{e}");
        let mut c = Fields::v3(9, 1 << 20).cluster();
        c[100..104].copy_from_slice(&1024u32.to_be_bytes());
        let e = parse(&c).unwrap_err();
        assert!(e.to_string().contains("exceeds the cluster size"), "{e}");
    }

    #[test]
    fn refuses_a_backing_file_and_names_it() {
        let mut f = Fields::v3(16, 1 << 20);
        f.extensions.push((ext::BACKING_FORMAT, b"qcow2".to_vec()));
        let mut c = f.cluster();
        let name = b"/images/base.qcow2";
        c[1024..1024 + name.len()].copy_from_slice(name);
        c[8..16].copy_from_slice(&1024u64.to_be_bytes());
        c[16..20].copy_from_slice(&(name.len() as u32).to_be_bytes());
        let e = parse(&c).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        let msg = e.to_string();
        assert!(
            msg.contains("/images/base.qcow2") && msg.contains("backing file"),
            "{msg}"
        );
        assert!(msg.contains("qcow2"), "{msg}");
    }

    #[test]
    fn rejects_a_backing_file_offset_outside_the_first_cluster() {
        let f = Fields {
            backing_offset: 1 << 20,
            backing_size: 4,
            ..Fields::v3(16, 1 << 20)
        };
        assert_err(&f, ErrorKind::CorruptImage, "backing file name offset");
    }

    #[test]
    fn refuses_encryption() {
        for (m, name) in [(1, "AES"), (2, "LUKS"), (7, "method 7")] {
            let f = Fields {
                crypt: m,
                ..Fields::v3(16, 1 << 20)
            };
            assert_err(&f, ErrorKind::Unsupported, name);
            assert_err(&f, ErrorKind::Unsupported, "encrypted");
        }
        let mut f = Fields::v3(16, 1 << 20);
        f.extensions.push((ext::CRYPTO, vec![0; 16]));
        assert_err(&f, ErrorKind::Unsupported, "encrypted");
    }

    #[test]
    fn refuses_an_external_data_file() {
        let f = Fields {
            incompat: incompat::DATA_FILE,
            ..Fields::v3(16, 1 << 20)
        };
        assert_err(&f, ErrorKind::Unsupported, "external data file");
        let mut f = Fields::v3(16, 1 << 20);
        f.extensions.push((ext::DATA_FILE, b"disk.raw".to_vec()));
        assert_err(&f, ErrorKind::Unsupported, "\"disk.raw\"");
    }

    #[test]
    fn refuses_unknown_incompatible_bits_and_names_them() {
        let f = Fields {
            incompat: 1 << 5 | 1 << 40,
            ..Fields::v3(16, 1 << 20)
        };
        assert_err(&f, ErrorKind::Unsupported, "bit 5, bit 40");
        let mut f = Fields {
            incompat: 1 << 9,
            ..Fields::v3(16, 1 << 20)
        };
        let mut entry = vec![0u8, 9];
        entry.extend_from_slice(b"time travel");
        entry.resize(48, 0);
        f.extensions.push((ext::FEATURE_TABLE, entry));
        assert_err(&f, ErrorKind::Unsupported, "bit 9 (time travel)");
    }

    #[test]
    fn tolerates_dirty_and_corrupt_bits() {
        let f = Fields {
            incompat: incompat::DIRTY | incompat::CORRUPT,
            ..Fields::v3(16, 1 << 20)
        };
        let h = parse(&f.cluster()).unwrap();
        assert!(h.is_dirty() && h.is_marked_corrupt());
    }

    #[test]
    fn ignores_unknown_compatible_and_autoclear_bits() {
        let f = Fields {
            compat: u64::MAX,
            autoclear: u64::MAX,
            ..Fields::v3(16, 1 << 20)
        };
        assert!(parse(&f.cluster()).is_ok());
    }

    #[test]
    fn accepts_refcount_orders_0_to_6_only() {
        for order in 0..=6 {
            let f = Fields {
                refcount_order: order,
                ..Fields::v3(16, 1 << 20)
            };
            assert_eq!(parse(&f.cluster()).unwrap().refcount_order, order);
        }
        let f = Fields {
            refcount_order: 7,
            ..Fields::v3(16, 1 << 20)
        };
        assert_err(&f, ErrorKind::CorruptImage, "refcount_order 7");
    }

    #[test]
    fn compression_type_must_agree_with_its_bit() {
        let zstd = Fields {
            incompat: incompat::COMPRESSION,
            compression_type: 1,
            ..Fields::v3(16, 1 << 20)
        };
        assert_eq!(
            parse(&zstd.cluster()).unwrap().compression,
            Compression::Zstd
        );
        let no_bit = Fields {
            incompat: 0,
            ..zstd.clone()
        };
        assert_err(&no_bit, ErrorKind::CorruptImage, "compression");
        let bit_only = Fields {
            compression_type: 0,
            ..zstd.clone()
        };
        assert_err(&bit_only, ErrorKind::CorruptImage, "compression");
        let unknown = Fields {
            compression_type: 2,
            ..zstd
        };
        assert_err(
            &unknown,
            ErrorKind::CorruptImage,
            "unknown compression type 2",
        );
    }

    #[test]
    fn compression_type_needs_a_long_enough_header() {
        // With a 104-byte header there is no compression_type field: it reads as deflate.
        let f = Fields {
            header_length: 104,
            compression_type: 1,
            ..Fields::v3(16, 1 << 20)
        };
        assert_eq!(
            parse(&f.cluster()).unwrap().compression,
            Compression::Deflate
        );
    }

    #[test]
    fn extended_l2_needs_16k_clusters() {
        let f = Fields {
            incompat: incompat::EXTENDED_L2,
            ..Fields::v3(14, 1 << 20)
        };
        let h = parse(&f.cluster()).unwrap();
        assert!(h.extended_l2);
        assert_eq!((h.l2_entries(), h.subclusters()), (1024, 32));
        let f = Fields {
            incompat: incompat::EXTENDED_L2,
            ..Fields::v3(13, 1 << 20)
        };
        assert_err(&f, ErrorKind::CorruptImage, "16 KiB");
    }

    #[test]
    fn rejects_an_absurd_l1_table() {
        let f = Fields {
            l1_size: u32::MAX,
            ..Fields::v3(16, 1 << 20)
        };
        assert_err(&f, ErrorKind::CorruptImage, "too large");
        let f = Fields {
            l1_size: (MAX_L1_BYTES / 8) as u32,
            ..Fields::v3(16, 1 << 20)
        };
        assert!(parse(&f.cluster()).is_ok());
    }

    #[test]
    fn rejects_an_l1_table_too_small_for_the_disk() {
        let f = Fields {
            l1_size: 1,
            ..Fields::v3(9, 1 << 20)
        };
        assert_err(&f, ErrorKind::CorruptImage, "too small");
        let f = Fields {
            l1_size: 0,
            size: u64::MAX,
            ..Fields::v3(16, 0)
        };
        assert_err(&f, ErrorKind::CorruptImage, "too small");
    }

    #[test]
    fn a_header_fault_keeps_its_type_and_place() {
        let f = Fields {
            l1_offset: 0x10200,
            ..Fields::v3(16, 1 << 20)
        };
        let Error::Format(e) = err(&f) else {
            panic!("not a format error")
        };
        assert_eq!(e.offset(), Some(0x10200));
        assert_eq!(
            e.fault::<HeaderError>(),
            Some(&HeaderError::Misaligned {
                what: "L1 table",
                offset: 0x10200
            })
        );
    }

    #[test]
    fn rejects_misplaced_tables() {
        let base = Fields::v3(16, 1 << 20);
        let cases = [
            (
                Fields {
                    l1_offset: 0x10200,
                    ..base.clone()
                },
                "L1 table offset",
            ),
            (
                Fields {
                    l1_offset: 0,
                    ..base.clone()
                },
                "L1 table overlaps the header",
            ),
            (
                Fields {
                    l1_offset: !0xffff,
                    ..base.clone()
                },
                "overflows",
            ),
            (
                Fields {
                    rt_offset: 0x10001,
                    ..base.clone()
                },
                "refcount table offset",
            ),
            (
                Fields {
                    rt_offset: 0,
                    ..base.clone()
                },
                "refcount table overlaps the header",
            ),
            (
                Fields {
                    rt_clusters: 1000,
                    ..base.clone()
                },
                "refcount table of 1000",
            ),
            (
                Fields {
                    rt_offset: 2 << 16,
                    ..base.clone()
                },
                "overlaps the refcount table",
            ),
            (
                Fields {
                    nb_snapshots: 70000,
                    ..base.clone()
                },
                "snapshots",
            ),
            (
                Fields {
                    snapshots_offset: 7,
                    ..base.clone()
                },
                "snapshot table offset",
            ),
        ];
        for (f, needle) in cases {
            assert_err(&f, ErrorKind::CorruptImage, needle);
        }
    }

    #[test]
    fn parses_extensions_until_the_end_marker() {
        let mut f = Fields::v3(16, 1 << 20);
        f.extensions.push((ext::BACKING_FORMAT, b"raw".to_vec()));
        f.extensions.push((0x1234_5678, vec![1, 2, 3]));
        let mut entry = vec![0u8, 0];
        entry.extend_from_slice(b"dirty bit");
        entry.resize(48, 0);
        f.extensions.push((ext::FEATURE_TABLE, entry));
        let mut c = f.cluster();
        // After the end marker, garbage is ignored.
        let end = f.encode().len();
        c[end..end + 8].copy_from_slice(&[0xff; 8]);
        let h = parse(&c).unwrap();
        assert_eq!(h.backing_format.as_deref(), Some("raw"));
        assert_eq!(h.feature_names.len(), 1);
        assert_eq!(h.feature_names[0].name, "dirty bit");
    }

    #[test]
    fn rejects_extensions_running_past_the_cluster() {
        let mut c = Fields::v3(9, 1 << 20).cluster();
        c[112..116].copy_from_slice(&0x1234u32.to_be_bytes());
        c[116..120].copy_from_slice(&400u32.to_be_bytes());
        let e = parse(&c).unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
        let mut c = Fields::v3(9, 1 << 20).cluster();
        c[112..116].copy_from_slice(&0x1234u32.to_be_bytes());
        c[116..120].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse(&c).unwrap_err().kind(), ErrorKind::CorruptImage);
        let mut f = Fields::v3(16, 1 << 20);
        f.extensions.push((ext::BACKING_FORMAT, vec![b'x'; 20]));
        assert_err(&f, ErrorKind::CorruptImage, "backing format");
        // The end marker's length is checked as qemu checks it (before its type): one that
        // runs past the cluster is corrupt, one that fits is the end.
        for (len, ok) in [(0xffff_fff0u32, false), (400, false), (8, true)] {
            let mut c = Fields::v3(9, 1 << 20).cluster();
            c[112..116].copy_from_slice(&0u32.to_be_bytes());
            c[116..120].copy_from_slice(&len.to_be_bytes());
            match parse(&c) {
                Ok(_) => assert!(ok, "end marker of {len} bytes"),
                Err(e) => assert!(!ok && e.to_string().contains("too large"), "{len}: {e}"),
            }
        }
    }

    #[test]
    fn extensions_without_an_end_marker_stop_at_the_cluster_end() {
        let mut c = Fields::v3(9, 1 << 20).cluster();
        // Unknown extensions chained to exactly the end of the cluster, no end marker.
        let mut off = 112;
        while off < 512 {
            let len = (512 - off - 8).min(64) as u32;
            c[off..off + 4].copy_from_slice(&0x99u32.to_be_bytes());
            c[off + 4..off + 8].copy_from_slice(&len.to_be_bytes());
            off += 8 + len as usize;
        }
        assert!(parse(&c).is_ok());
    }
}
