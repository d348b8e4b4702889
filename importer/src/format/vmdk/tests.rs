//! Byte-vector tests of the VMDK parsers and both converters, one per invariant: images are
//! built here field by field, so each test breaks exactly one rule.

use std::io::Cursor;

use super::header::{
    GD_AT_END, GRAIN_MARKER_LEN, GrainEntry, Marker, flags, grain_entry, parse_marker,
};
use super::*;
use crate::error::{ErrorKind, FormatFault};

const S: usize = 512;

/// Header fields, VMware's defaults scaled down: 4 KiB grains, 4 entries per grain table.
#[derive(Clone)]
struct H {
    version: u32,
    flags: u32,
    capacity: u64,
    granularity: u64,
    desc: (u64, u64),
    gtes: u32,
    gd: u64,
    grain_offset: u64,
    compress: u16,
}

impl Default for H {
    fn default() -> H {
        H {
            version: 1,
            flags: flags::REDUNDANT_GD | 1,
            capacity: 43,
            granularity: 8,
            desc: (0, 0),
            gtes: 4,
            gd: 1,
            grain_offset: 4,
            compress: 0,
        }
    }
}

impl H {
    fn stream_optimized() -> H {
        H {
            version: 3,
            flags: flags::COMPRESSED | flags::MARKERS | 1,
            gd: GD_AT_END,
            grain_offset: 1,
            compress: 1,
            ..H::default()
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; S];
        b[..4].copy_from_slice(b"KDMV");
        b[4..8].copy_from_slice(&self.version.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..20].copy_from_slice(&self.capacity.to_le_bytes());
        b[20..28].copy_from_slice(&self.granularity.to_le_bytes());
        b[28..36].copy_from_slice(&self.desc.0.to_le_bytes());
        b[36..44].copy_from_slice(&self.desc.1.to_le_bytes());
        b[44..48].copy_from_slice(&self.gtes.to_le_bytes());
        b[56..64].copy_from_slice(&self.gd.to_le_bytes());
        b[64..72].copy_from_slice(&self.grain_offset.to_le_bytes());
        b[73..77].copy_from_slice(b"\n \r\n");
        b[77..79].copy_from_slice(&self.compress.to_le_bytes());
        b
    }

    fn parse(&self) -> Result<SparseHeader, VmdkError> {
        SparseHeader::parse(&self.bytes())
    }
}

fn put32(img: &mut Vec<u8>, at: usize, v: u32) {
    if img.len() < at + 4 {
        img.resize(at + 4, 0);
    }
    img[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put(img: &mut Vec<u8>, at: usize, data: &[u8]) {
    if img.len() < at + data.len() {
        img.resize(at + data.len(), 0);
    }
    img[at..at + data.len()].copy_from_slice(data);
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// The guest disk, checking that every byte is reported exactly once.
struct Disk {
    bytes: Vec<u8>,
    seen: Vec<bool>,
}

impl Disk {
    fn new(len: usize) -> Disk {
        Disk {
            bytes: vec![0xee; len],
            seen: vec![false; len],
        }
    }

    fn claim(&mut self, offset: u64, len: usize) {
        for i in offset as usize..offset as usize + len {
            assert!(!self.seen[i], "byte {i} reported twice");
            self.seen[i] = true;
        }
    }
}

impl ExtentSink for Disk {
    fn write_data(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.claim(offset, data.len());
        self.bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
        self.claim(offset, len as usize);
        self.bytes[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
}

fn opts() -> ReaderOptions {
    ReaderOptions {
        read_ahead: 4096,
        ..ReaderOptions::default()
    }
}

/// Converts `img` from a stream; the disk, or the error.
fn convert(img: &[u8]) -> Result<Vec<u8>> {
    let r = VmdkReader::new(Box::new(Cursor::new(img.to_vec())), &opts())?;
    let size = r.virtual_size as usize;
    let mut disk = Disk::new(size);
    r.convert(&mut disk)?;
    assert!(disk.seen.iter().all(|&s| s), "bytes not reported");
    Ok(disk.bytes)
}

fn kind(r: Result<Vec<u8>>) -> ErrorKind {
    match r {
        Ok(_) => panic!("converted"),
        Err(e) => e.kind(),
    }
}

// ---- header ----

#[test]
fn a_valid_header_gives_its_geometry() {
    let h = H::default().parse().unwrap();
    assert_eq!(h.virtual_size(), 43 * 512);
    assert_eq!(h.grain_size(), 4096);
    assert_eq!(h.grains(), 6);
    assert_eq!(h.gd_entries(), 2);
    assert_eq!(h.grain_len(5), 3 * 512);
    assert_eq!(h.layout(), Ok(Layout::Tables));
    assert_eq!(
        H::stream_optimized().parse().unwrap().layout(),
        Ok(Layout::Markers)
    );
}

#[test]
fn a_truncated_header_is_corrupt() {
    let b = H::default().bytes();
    let e = SparseHeader::parse(&b[..100]).unwrap_err();
    assert_eq!(e, VmdkError::TruncatedHeader { len: 100 });
    assert!(!e.is_refusal());
    assert_eq!(kind(convert(&b[..100])), ErrorKind::CorruptImage);
}

#[test]
fn versions_after_3_are_refused() {
    let e = H {
        version: 4,
        ..H::default()
    }
    .parse()
    .unwrap_err();
    assert!(e.is_refusal(), "{e}");
}

#[test]
fn grain_tables_hold_1_to_512_entries() {
    for gtes in [0, 513, u32::MAX] {
        let e = H {
            gtes,
            ..H::default()
        }
        .parse()
        .unwrap_err();
        assert_eq!(e, VmdkError::GrainTableTooBig { gtes });
    }
    assert!(
        H {
            gtes: 512,
            ..H::default()
        }
        .parse()
        .is_ok()
    );
}

#[test]
fn absurd_grain_sizes_are_corrupt_and_large_ones_refused() {
    for granularity in [0, 0x20_0001, u64::MAX] {
        let e = H {
            granularity,
            ..H::default()
        }
        .parse()
        .unwrap_err();
        assert!(!e.is_refusal(), "{granularity}: {e}");
    }
    let e = H {
        granularity: 8192,
        ..H::default()
    }
    .parse()
    .unwrap_err();
    assert!(e.is_refusal(), "{e}");
}

#[test]
fn absurd_capacities_are_corrupt_and_huge_directories_refused() {
    for capacity in [u64::MAX, 1 << 60] {
        let e = H {
            capacity,
            ..H::default()
        }
        .parse()
        .unwrap_err();
        assert!(!e.is_refusal(), "{capacity}: {e}");
    }
    // 2M grain tables: within qemu's limit, past this reader's.
    let e = H {
        capacity: 32 * (2 << 20),
        ..H::default()
    }
    .parse()
    .unwrap_err();
    assert!(matches!(e, VmdkError::GrainDirectoryTooBig { .. }), "{e}");
    assert!(e.is_refusal());
}

#[test]
fn compression_needs_markers_and_deflate() {
    let e = H {
        compress: 1,
        ..H::default()
    }
    .parse()
    .unwrap_err();
    assert_eq!(e, VmdkError::CompressedWithoutMarkers);
    let e = H {
        compress: 7,
        ..H::default()
    }
    .parse()
    .unwrap_err();
    assert_eq!(e, VmdkError::UnknownCompression { algorithm: 7 });
}

#[test]
fn directory_placement_is_checked() {
    let e = H {
        gd: GD_AT_END,
        ..H::default()
    }
    .parse()
    .unwrap_err();
    assert_eq!(e, VmdkError::UncompressedGdAtEnd);
    let e = H {
        gd: 0,
        ..H::default()
    }
    .parse()
    .unwrap_err();
    assert!(matches!(e, VmdkError::MetadataInHeader { .. }), "{e}");
    let e = H {
        grain_offset: 0,
        ..H::stream_optimized()
    }
    .parse()
    .unwrap_err();
    assert!(matches!(e, VmdkError::MetadataInHeader { .. }), "{e}");
    for gd in [u64::MAX - 1, 1 << 60] {
        let e = H { gd, ..H::default() }.parse().unwrap_err();
        assert!(matches!(e, VmdkError::OffsetOutOfRange { .. }), "{e}");
    }
    let e = H {
        grain_offset: u64::MAX,
        ..H::stream_optimized()
    }
    .parse()
    .unwrap_err();
    assert!(matches!(e, VmdkError::OffsetOutOfRange { .. }), "{e}");
}

#[test]
fn grain_entry_one_is_zeroed_only_with_the_flag() {
    assert_eq!(grain_entry(0, true), GrainEntry::Unallocated);
    assert_eq!(grain_entry(1, true), GrainEntry::Zeroed);
    assert_eq!(grain_entry(1, false), GrainEntry::Data(1));
    assert_eq!(grain_entry(77, true), GrainEntry::Data(77));
}

#[test]
fn markers_decode_by_size_then_type() {
    let m = |val: u64, size: u32, ty: u32| {
        let mut b = val.to_le_bytes().to_vec();
        b.extend(size.to_le_bytes());
        b.extend(ty.to_le_bytes());
        parse_marker(&b, 0)
    };
    assert_eq!(
        m(128, 300, 99),
        Ok(Marker::Grain {
            lba: 128,
            size: 300
        })
    );
    assert_eq!(m(0, 0, 0), Ok(Marker::EndOfStream));
    assert_eq!(m(4, 0, 1), Ok(Marker::GrainTable { sectors: 4 }));
    assert_eq!(m(1, 0, 2), Ok(Marker::GrainDirectory { sectors: 1 }));
    assert_eq!(m(1, 0, 3), Ok(Marker::Footer { sectors: 1 }));
    assert!(m(0, 0, 4).is_err());
    assert!(m(5, 0, 0).is_err());
}

// ---- descriptor ----

const FLAT: &str = "# Disk DescriptorFile\nversion=1\nCID=12345678\nparentCID=ffffffff\n\
    createType=\"twoGbMaxExtentFlat\"\n\n# Extent description\nRW 4192256 FLAT \"d-f001.vmdk\" 0\n\
    RDONLY 8 FLAT \"ro.vmdk\" 0\nRW 100 FLAT \"d-f002.vmdk\" 0\n\n# The Disk Data Base\n#DDB\n\
    ddb.adapterType = \"ide\"\nchangeTrackPath=\"d-ctk.vmdk\"\n";

#[test]
fn a_descriptor_lists_its_rw_extents_in_order() {
    let d = Descriptor::parse(FLAT.as_bytes());
    assert_eq!(d.create_type(), Ok("twoGbMaxExtentFlat"));
    assert_eq!(d.get("ddb.adapterType"), Some("ide"));
    d.check_parent().unwrap();
    let e = d.extents().unwrap();
    assert_eq!(e.len(), 2, "{e:?}");
    assert_eq!(e[0].file, "d-f001.vmdk");
    assert_eq!(e[0].sectors, 4192256);
    assert_eq!(e[1].kind, ExtentKind::Flat { offset: 0 });
    let at =
        Descriptor::parse(b"createType=\"monolithicFlat\"\nRW 2048 FLAT \"x-flat.vmdk\" 512\n");
    assert_eq!(
        at.extents().unwrap()[0].kind,
        ExtentKind::Flat { offset: 512 }
    );
}

#[test]
fn a_descriptor_with_a_parent_is_refused() {
    let snap = FLAT.replace("parentCID=ffffffff", "parentCID=a1b2c3d4");
    let e = Descriptor::parse(snap.as_bytes())
        .check_parent()
        .unwrap_err();
    assert!(e.is_refusal() && e.to_string().contains("a1b2c3d4"), "{e}");
    let hint = format!("{FLAT}parentFileNameHint=\"base.vmdk\"\n");
    let e = Descriptor::parse(hint.as_bytes())
        .check_parent()
        .unwrap_err();
    assert!(e.to_string().contains("base.vmdk"), "{e}");
}

#[test]
fn only_flat_and_split_create_types_are_read_from_a_descriptor() {
    for ct in [
        "monolithicSparse",
        "streamOptimized",
        "vmfsSparse",
        "seSparse",
    ] {
        let d = FLAT.replace("twoGbMaxExtentFlat", ct);
        let e = Descriptor::parse(d.as_bytes()).create_type().unwrap_err();
        assert!(e.is_refusal(), "{ct}: {e}");
    }
    let none = FLAT.replace("createType", "kind");
    assert!(
        !Descriptor::parse(none.as_bytes())
            .create_type()
            .unwrap_err()
            .is_refusal()
    );
}

#[test]
fn extents_must_lie_beside_the_descriptor_and_be_flat_or_sparse() {
    for (line, refusal) in [
        ("RW 8 FLAT \"../etc/x\" 0", true),
        ("RW 8 FLAT \"/etc/passwd\" 0", true),
        ("RW 8 VMFSSPARSE \"d-delta.vmdk\"", true),
        ("RW 8 SESPARSE \"d-sesparse.vmdk\"", true),
        ("RW 8 ZERO \"z\"", true),
        ("RW 8 FLAT \"d.vmdk\"", false),
        ("RW 0 SPARSE \"d.vmdk\"", false),
        ("RW 8 SPARSE d.vmdk", false),
        // An offset that would put the extent's end past what a file can address.
        ("RW 8 FLAT \"d-flat.vmdk\" 18014398509481977", false),
        ("RW 8 FLAT \"d-flat.vmdk\" -1", false),
    ] {
        let d = format!("createType=\"monolithicFlat\"\n{line}\n");
        let e = Descriptor::parse(d.as_bytes()).extents().unwrap_err();
        assert_eq!(e.is_refusal(), refusal, "{line}: {e}");
    }
}

// ---- tables (monolithicSparse) ----

/// The data of grains 0, 3 and 5 (the last, 3 sectors) of both test images, and the disk they
/// make (everything else zero).
fn three_grains() -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
    let (a, b, c) = (pattern(4096, 1), pattern(4096, 2), pattern(1536, 3));
    let mut disk = vec![0u8; 43 * S];
    disk[..4096].copy_from_slice(&a);
    disk[3 * 4096..4 * 4096].copy_from_slice(&b);
    disk[5 * 4096..].copy_from_slice(&c);
    (a, b, c, disk)
}

/// 43 sectors in 4 KiB grains: grain 0 data, 1 unallocated, 2 zeroed, 3 data (grain table 0);
/// 4 unallocated and 5, the last, 3 sectors of data (grain table 1).
fn sparse_image() -> (Vec<u8>, Vec<u8>) {
    let h = H {
        flags: flags::ZERO_GRAIN,
        ..H::default()
    };
    let mut img = h.bytes();
    put32(&mut img, S, 2); // GD: grain tables at sectors 2 and 3
    put32(&mut img, S + 4, 3);
    for (j, e) in [4u32, 0, 1, 12].iter().enumerate() {
        put32(&mut img, 2 * S + 4 * j, *e);
    }
    put32(&mut img, 3 * S + 4, 20);
    let (a, b, c, disk) = three_grains();
    put(&mut img, 4 * S, &a);
    put(&mut img, 12 * S, &b);
    put(&mut img, 20 * S, &c);
    (img, disk)
}

#[test]
fn a_sparse_extent_converts_data_holes_zeroed_grains_and_a_partial_last_grain() {
    let (img, disk) = sparse_image();
    assert_eq!(convert(&img).unwrap(), disk);
}

#[test]
fn a_last_grain_cut_short_by_the_end_of_the_file_reads_as_zeroes() {
    let (img, mut disk) = sparse_image();
    disk[5 * 4096 + 1000..].fill(0);
    assert_eq!(convert(&img[..20 * S + 1000]).unwrap(), disk);
}

#[test]
fn a_grain_past_the_end_is_truncation() {
    let (img, _) = sparse_image();
    assert_eq!(kind(convert(&img[..20 * S])), ErrorKind::CorruptImage);
    assert_eq!(kind(convert(&img[..S + 4])), ErrorKind::CorruptImage);
    assert_eq!(kind(convert(&img[..3 * S + 8])), ErrorKind::CorruptImage);
}

#[test]
fn two_entries_for_one_grain_are_corrupt() {
    let (mut img, _) = sparse_image();
    put32(&mut img, 2 * S + 12, 4); // grain 3 also at sector 4
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
}

#[test]
fn overlapping_grains_are_corrupt() {
    let (mut img, _) = sparse_image();
    put32(&mut img, 2 * S + 12, 8); // grain 3 starts inside grain 0
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
}

#[test]
fn a_grain_inside_metadata_is_corrupt() {
    for sector in [2, 3] {
        let (mut img, _) = sparse_image();
        put32(&mut img, 2 * S, sector);
        assert_eq!(
            kind(convert(&img)),
            ErrorKind::CorruptImage,
            "sector {sector}"
        );
    }
}

#[test]
fn a_grain_overlapping_a_later_grain_table_is_corrupt() {
    let (mut img, _) = sparse_image();
    put32(&mut img, S + 4, 22); // grain table 1 after grain 5... and inside grain 5's sectors
    put32(&mut img, 2 * S + 12, 20); // grain 3 at 20..28 overlaps table 1 at 22
    put32(&mut img, 22 * S + 4, 30);
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
}

#[test]
fn shared_or_overlapping_grain_tables_are_corrupt() {
    let (mut img, _) = sparse_image();
    put32(&mut img, S + 4, 2); // both directory entries use one table: a loop
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
    let (mut img, _) = sparse_image();
    put32(&mut img, S + 4, 1); // a grain table inside the directory
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
}

#[test]
fn a_grain_table_before_the_directory_cannot_be_streamed() {
    let h = H {
        gd: 3,
        flags: flags::ZERO_GRAIN,
        ..H::default()
    };
    let mut img = h.bytes();
    put32(&mut img, 3 * S, 2);
    put32(&mut img, 3 * S + 4, 0);
    put32(&mut img, 2 * S, 4);
    put(&mut img, 4 * S, &pattern(4096, 1));
    assert_eq!(kind(convert(&img)), ErrorKind::Unsupported);
}

#[test]
fn an_unallocated_directory_entry_covers_its_whole_span_with_zeroes() {
    let (mut img, mut disk) = sparse_image();
    put32(&mut img, S, 0);
    disk[..4 * 4096].fill(0);
    assert_eq!(convert(&img).unwrap(), disk);
}

#[test]
fn a_parent_in_the_embedded_descriptor_is_refused() {
    let h = H {
        desc: (1, 1),
        gd: 2,
        grain_offset: 5,
        ..H::default()
    };
    let mut img = h.bytes();
    put(
        &mut img,
        S,
        b"# Disk DescriptorFile\nparentCID=12345678\ncreateType=\"monolithicSparse\"\n",
    );
    put32(&mut img, 2 * S, 0);
    put32(&mut img, 2 * S + 4, 0);
    let e = convert(&img).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("parent"), "{e}");
}

// ---- markers (streamOptimized) ----

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut c = flate2::Compress::new(flate2::Compression::default(), true);
    let mut out = Vec::with_capacity(data.len() + 64);
    c.compress_vec(data, &mut out, flate2::FlushCompress::Finish)
        .unwrap();
    out
}

/// Appends a grain marker for sector `lba` with `z` after it, padded to a sector.
fn grain(img: &mut Vec<u8>, lba: u64, z: &[u8]) {
    img.extend(lba.to_le_bytes());
    img.extend((z.len() as u32).to_le_bytes());
    img.extend(z);
    img.resize(img.len().next_multiple_of(S), 0);
}

/// Appends VMware's trailer to the grains of a stream: a grain table marker and table per
/// directory entry (pointing at the grain markers found), the directory, the footer and the end
/// marker.
fn trailer(img: &mut Vec<u8>, h: &H) {
    let gtes = u64::from(h.gtes);
    let tables = h.capacity.div_ceil(h.granularity).div_ceil(gtes);
    let mut entries = vec![0u32; (tables * gtes) as usize];
    let mut at = h.grain_offset as usize * S;
    while at + 16 <= img.len() {
        let lba = u64::from_le_bytes(img[at..at + 8].try_into().unwrap());
        let size = u32::from_le_bytes(img[at + 8..at + 12].try_into().unwrap()) as usize;
        if size == 0 {
            break;
        }
        entries[(lba / h.granularity) as usize] = (at / S) as u32;
        at = (at + GRAIN_MARKER_LEN + size).next_multiple_of(S);
    }
    let mut directory = Vec::new();
    for table in entries.chunks(gtes as usize) {
        marker(img, (gtes * 4).div_ceil(S as u64), 1);
        directory.push((img.len() / S) as u32);
        table.iter().for_each(|e| img.extend(e.to_le_bytes()));
        img.resize(img.len().next_multiple_of(S), 0);
    }
    marker(img, (tables * 4).div_ceil(S as u64), 2);
    let gd = (img.len() / S) as u64;
    directory.iter().for_each(|e| img.extend(e.to_le_bytes()));
    img.resize(img.len().next_multiple_of(S), 0);
    marker(img, 1, 3);
    img.extend(H { gd, ..h.clone() }.bytes());
    marker(img, 0, 0);
}

/// A metadata marker of `sectors` sectors and type `ty` (its metadata not written).
fn marker(img: &mut Vec<u8>, sectors: u64, ty: u32) {
    img.extend(sectors.to_le_bytes());
    img.extend(0u32.to_le_bytes());
    img.extend(ty.to_le_bytes());
    img.resize(img.len() + S - 16, 0);
}

/// Grains 3 then 0 (out of order), the last partial grain 5, then VMware's trailer.
fn stream_image() -> (Vec<u8>, Vec<u8>) {
    let h = H::stream_optimized();
    let mut img = h.bytes();
    let (a, b, c, disk) = three_grains();
    grain(&mut img, 24, &zlib(&b));
    grain(&mut img, 0, &zlib(&a));
    grain(&mut img, 40, &zlib(&c));
    trailer(&mut img, &h);
    (img, disk)
}

#[test]
fn stream_optimized_grains_land_at_their_marker_lba_in_any_order() {
    let (img, disk) = stream_image();
    assert_eq!(convert(&img).unwrap(), disk);
}

#[test]
fn a_stream_that_ends_before_its_footer_and_end_marker_is_truncation() {
    let (img, _) = stream_image();
    // Every cut: at each sector boundary (after a grain, a table, the directory, the footer) and
    // inside each sector.
    for len in (S..img.len()).step_by(S / 2) {
        let e = convert(&img[..len]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptImage, "cut at {len}: {e}");
        assert!(e.to_string().contains("truncated"), "cut at {len}: {e}");
    }
    let mut longer = img.clone();
    longer.extend([0u8; S]);
    assert_eq!(kind(convert(&longer)), ErrorKind::CorruptImage);
}

#[test]
fn an_end_marker_before_the_footer_is_corrupt() {
    let (img, _) = stream_image();
    let mut early = img[..4 * S].to_vec();
    early.extend([0u8; S]);
    let e = convert(&early).unwrap_err();
    assert!(e.to_string().contains("before the footer"), "{e}");
}

#[test]
fn a_grain_marker_that_disagrees_with_the_tables_after_it_is_corrupt() {
    let (img, _) = stream_image();
    // The first grain (for sector 24) says sector 16 instead, and the second (sector 0) says 8.
    for (at, lba) in [(S, 16u64), (2 * S, 8), (S, 32)] {
        let mut bad = img.clone();
        bad[at..at + 8].copy_from_slice(&lba.to_le_bytes());
        let e = convert(&bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptImage, "{e}");
        assert!(e.to_string().contains("disagree"), "{e}");
    }
}

/// qemu's layout: the directory at sector 1, grain tables at 2 and 3, grains from sector 4 with
/// `gap` zero sectors before each (what appending in several sessions leaves), each marker
/// saying the sector its table entry says.
fn tables_first_image(gap: usize) -> (Vec<u8>, Vec<u8>, Vec<usize>) {
    let h = H {
        gd: 1,
        grain_offset: 4,
        ..H::stream_optimized()
    };
    let mut img = h.bytes();
    put32(&mut img, S, 2);
    put32(&mut img, S + 4, 3);
    img.resize(4 * S, 0);
    let (a, b, c, disk) = three_grains();
    let mut at = Vec::new();
    for (g, data) in [(3u64, &b), (0, &a), (5, &c)] {
        img.resize(img.len() + gap * S, 0);
        at.push(img.len());
        let table = 2 * S + (g / 4) as usize * S + (g % 4) as usize * 4;
        let sector = (img.len() / S) as u32;
        put32(&mut img, table, sector);
        grain(&mut img, g * 8, &zlib(data));
    }
    (img, disk, at)
}

#[test]
fn with_the_tables_first_grains_are_read_where_the_tables_say_whatever_lies_between() {
    for gap in [0, 1, 8] {
        let (img, disk, _) = tables_first_image(gap);
        assert_eq!(convert(&img).unwrap(), disk, "gap {gap}");
    }
}

#[test]
fn with_the_tables_first_a_marker_sector_is_not_trusted_over_them() {
    let (mut img, disk, at) = tables_first_image(1);
    img[at[0]..at[0] + 8].copy_from_slice(&16u64.to_le_bytes());
    assert_eq!(convert(&img).unwrap(), disk);
}

#[test]
fn with_the_tables_first_a_marker_size_too_large_swallows_nothing() {
    let (mut img, disk, at) = tables_first_image(0);
    // Two grains' worth: past the next grain's marker, as qemu allows (it inflates to the end
    // of the zlib stream).
    img[at[0] + 8..at[0] + 12].copy_from_slice(&8192u32.to_le_bytes());
    img.resize(at[2] + 8192 + S, 0);
    assert_eq!(convert(&img).unwrap(), disk);
    // Over two grains, or none: corrupt.
    for size in [0u32, 8193] {
        let (mut img, _, at) = tables_first_image(0);
        img[at[1] + 8..at[1] + 12].copy_from_slice(&size.to_le_bytes());
        assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage, "size {size}");
    }
}

#[test]
fn with_the_tables_first_a_stream_without_a_grain_they_map_is_truncation() {
    let (img, _, at) = tables_first_image(1);
    for len in [at[1] - S, at[2] + 6] {
        let e = convert(&img[..len]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptImage, "cut at {len}: {e}");
        assert!(e.to_string().contains("truncated"), "cut at {len}: {e}");
    }
}

#[test]
fn an_image_shorter_than_its_header_s_grain_offset_is_truncation_as_in_qemu() {
    // qemu refuses to open it ("File truncated"), whatever its tables map.
    let (mut img, disk, _) = tables_first_image(0);
    let end = (img.len() as u64).div_ceil(S as u64);
    for (grain_offset, ok) in [(end, true), (end + 1, false), (1 << 40, false)] {
        img[64..72].copy_from_slice(&grain_offset.to_le_bytes());
        match convert(&img) {
            Ok(got) => assert!(ok && got == disk, "overHead {grain_offset}"),
            Err(e) => {
                assert!(!ok, "overHead {grain_offset}: {e}");
                assert_eq!(e.kind(), ErrorKind::CorruptImage, "{e}");
                assert!(e.to_string().contains("overHead"), "{e}");
            }
        }
    }
}

#[test]
fn with_the_tables_first_two_entries_for_one_grain_are_corrupt() {
    let (mut img, _, _) = tables_first_image(0);
    let first = u32::from_le_bytes(img[2 * S + 12..2 * S + 16].try_into().unwrap());
    put32(&mut img, 2 * S + 4, first);
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
}

#[test]
fn a_grain_cut_short_is_truncation() {
    let (img, _) = stream_image();
    assert_eq!(kind(convert(&img[..S + 20])), ErrorKind::CorruptImage);
}

#[test]
fn a_grain_twice_is_corrupt() {
    let h = H::stream_optimized();
    let mut img = h.bytes();
    grain(&mut img, 8, &zlib(&pattern(4096, 1)));
    grain(&mut img, 8, &zlib(&pattern(4096, 2)));
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
}

#[test]
fn a_grain_off_a_grain_boundary_or_outside_the_disk_is_corrupt() {
    for lba in [4, 48, u64::MAX - 7] {
        let mut img = H::stream_optimized().bytes();
        grain(&mut img, lba, &zlib(&pattern(4096, 1)));
        assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage, "lba {lba}");
    }
}

#[test]
fn a_grain_must_inflate_to_its_bytes_and_no_more_than_a_grain() {
    for data in [pattern(4000, 1), pattern(4097, 1)] {
        let mut img = H::stream_optimized().bytes();
        grain(&mut img, 0, &zlib(&data));
        let e = convert(&img).unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::CorruptImage,
            "{} bytes: {e}",
            data.len()
        );
    }
    // The partial last grain needs only its 1536 bytes.
    let h = H::stream_optimized();
    let mut img = h.bytes();
    grain(&mut img, 40, &zlib(&pattern(2000, 1)));
    trailer(&mut img, &h);
    assert!(convert(&img).is_ok());
}

#[test]
fn garbage_or_oversized_compressed_grains_are_corrupt() {
    let mut img = H::stream_optimized().bytes();
    grain(&mut img, 0, &[0xff; 100]);
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
    let mut z = zlib(&pattern(4096, 1));
    let last = z.len() - 1;
    z[last] ^= 0xff; // the adler-32 checksum
    let mut img = H::stream_optimized().bytes();
    grain(&mut img, 0, &z);
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
    let mut img = H::stream_optimized().bytes();
    img.extend(0u64.to_le_bytes());
    img.extend((3 * 4096u32).to_le_bytes());
    img.resize(img.len() + 3 * 4096 + S, 0);
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
}

#[test]
fn a_footer_that_disagrees_with_the_header_is_corrupt() {
    let (img, _) = stream_image();
    let footer_at = img.len() - 2 * S;
    let mut bad = img.clone();
    bad[footer_at + 12..footer_at + 20].copy_from_slice(&44u64.to_le_bytes());
    assert_eq!(kind(convert(&bad)), ErrorKind::CorruptImage);
}

#[test]
fn huge_metadata_markers_are_skipped_or_truncation_without_allocating() {
    let mut img = H::stream_optimized().bytes();
    marker(&mut img, 0, 1);
    let at = img.len() - S;
    img[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert_eq!(kind(convert(&img)), ErrorKind::CorruptImage);
}

// ---- what is not a disk ----

#[test]
fn a_descriptor_cowd_or_unknown_bytes_in_a_stream_are_refused() {
    for head in [FLAT.as_bytes(), &b"COWD\x01\0\0\0"[..], &[0x42u8; 600][..]] {
        let e = convert(head).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    }
    let e = convert(FLAT.as_bytes()).unwrap_err();
    assert!(e.to_string().contains("local"), "{e}");
}

// ---- the decode bound (inflate_cost) ----

fn temp_file(img: &[u8]) -> std::fs::File {
    use std::io::Write;
    let mut file = tempfile::tempfile().expect("temp file");
    file.write_all(img).expect("writing the image");
    file
}

#[test]
fn the_inflate_cost_counts_every_grain_and_skips_the_metadata() {
    let (img, _) = stream_image();
    let (a, b, c, _) = three_grains();
    let cost = super::inflate_cost(temp_file(&img)).unwrap();
    assert_eq!(cost.pieces, 3);
    assert_eq!(cost.inflated_bytes, (a.len() + b.len() + c.len()) as u64);
    let compressed = [&a, &b, &c].map(|g| zlib(g).len()).iter().sum::<usize>();
    assert_eq!(cost.compressed_bytes, compressed as u64);
}

#[test]
fn the_inflate_cost_of_a_corrupt_grain_is_its_error() {
    let h = H::stream_optimized();
    let mut img = h.bytes();
    grain(&mut img, 0, &zlib(&pattern(4096, 1)));
    let second = img.len();
    grain(&mut img, 8, &[0xff; 40]);
    let e = super::inflate_cost(temp_file(&img)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CorruptImage);
    // Named as the import names it: its guest offset and its place.
    let named = format!("the grain for guest offset 0x1000 at {second:#x}");
    assert!(e.to_string().contains(&named), "{e}");
}

#[test]
fn the_inflate_cost_of_an_uncompressed_extent_is_refused() {
    let (img, _) = sparse_image();
    let e = super::inflate_cost(temp_file(&img)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("not a streamOptimized"), "{e}");
}

// ---- batches inflated on two threads ----

/// 40 grains of 64 KiB, each behind its marker in guest order (a batch of 2.5 MiB: two halves,
/// the second inflated by the helper thread); the disk, and where each grain's marker is.
fn large_stream_image() -> (Vec<u8>, Vec<u8>, Vec<usize>) {
    let h = H {
        capacity: 40 * 128,
        granularity: 128,
        gtes: 512,
        ..H::stream_optimized()
    };
    let mut img = h.bytes();
    let mut disk = Vec::new();
    let mut at = Vec::new();
    for g in 0..40u64 {
        let data = pattern(64 << 10, g as u8 + 1);
        at.push(img.len());
        grain(&mut img, g * 128, &zlib(&data));
        disk.extend(data);
    }
    trailer(&mut img, &h);
    (img, disk, at)
}

fn convert_in_large_batches(img: &[u8]) -> Result<Vec<u8>> {
    let opts = ReaderOptions {
        read_ahead: 4 << 20,
        ..ReaderOptions::default()
    };
    let r = VmdkReader::new(Box::new(Cursor::new(img.to_vec())), &opts)?;
    let mut disk = Disk::new(r.virtual_size as usize);
    r.convert(&mut disk)?;
    Ok(disk.bytes)
}

#[test]
fn both_halves_of_a_large_batch_land_at_their_grains() {
    let (img, disk, _) = large_stream_image();
    assert_eq!(convert_in_large_batches(&img).unwrap(), disk);
}

#[test]
fn a_corrupt_grain_in_either_half_of_a_batch_is_named() {
    for bad in [5usize, 30] {
        let (mut img, _, at) = large_stream_image();
        // The grain's zlib header, broken.
        img[at[bad] + GRAIN_MARKER_LEN] = 0xff;
        let e = convert_in_large_batches(&img).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::CorruptImage);
        let named = format!("guest offset {:#x} at {:#x}", bad << 16, at[bad]);
        assert!(e.to_string().contains(&named), "grain {bad}: {e}");
    }
}
