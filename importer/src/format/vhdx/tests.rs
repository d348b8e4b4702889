//! Parser and converter tests on small images built in code: one test per invariant of the
//! header section, the metadata and the BAT, both converters on the same images, and the
//! streaming reader's hold for a BAT that comes after its data.

use super::bat::Geometry;
use super::crc::{crc32c, structure_checksum};
use super::header::{self, BAT_GUID, METADATA_GUID};
use super::metadata::Metadata;
use super::{VhdxError, VhdxReader, VhdxStats};
use crate::error::{ErrorKind, Result};
use crate::format::ReaderOptions;
use crate::format::qcow2::tests::{Chunked, Rec};
use crate::sink::ExtentSink;

const MIB: u64 = 1 << 20;

/// BAT entry states.
const NOT_PRESENT: u64 = 0;
const UNDEFINED: u64 = 1;
const ZERO: u64 = 2;
const UNMAPPED: u64 = 3;
const FULLY_PRESENT: u64 = 6;

/// An image to build: the regions where qemu-img puts them unless a test moves them.
#[derive(Clone)]
pub(crate) struct Image {
    pub block_size: u32,
    pub logical_sector: u32,
    pub virtual_size: u64,
    /// File parameter bits: 1 LeaveBlockAllocated, 2 HasParent.
    pub params: u32,
    pub parent_locator: bool,
    pub log_guid: [u8; 16],
    pub log: (u64, u32),
    pub bat: (u64, u32),
    pub metadata: (u64, u32),
    /// Region table entries added after the BAT and metadata: (guid, offset, length, required).
    pub extra_regions: Vec<([u8; 16], u64, u32, bool)>,
    /// BAT entries by index (the rest are 0, NOT_PRESENT).
    pub entries: Vec<(u64, u64)>,
    /// Payload bytes placed in the file.
    pub payload: Vec<(u64, Vec<u8>)>,
    pub sequences: (u64, u64),
}

impl Default for Image {
    fn default() -> Image {
        Image {
            block_size: MIB as u32,
            logical_sector: 512,
            virtual_size: 3 * MIB + 4096,
            params: 0,
            parent_locator: false,
            log_guid: [0; 16],
            log: (MIB, MIB as u32),
            bat: (2 * MIB, MIB as u32),
            metadata: (3 * MIB, MIB as u32),
            extra_regions: Vec::new(),
            entries: Vec::new(),
            payload: Vec::new(),
            sequences: (1, 2),
        }
    }
}

/// Recognisable bytes for block `n`.
pub(crate) fn pattern(n: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(n) | 1)
        .collect()
}

fn put(img: &mut Vec<u8>, at: u64, bytes: &[u8]) {
    let end = at as usize + bytes.len();
    if img.len() < end {
        img.resize(end, 0);
    }
    img[at as usize..end].copy_from_slice(bytes);
}

fn seal(buf: &mut [u8]) {
    let crc = structure_checksum(buf, 4);
    buf[4..8].copy_from_slice(&crc.to_le_bytes());
}

impl Image {
    /// Block `block` is data at `host` holding `pattern(block)`.
    pub fn data(mut self, block: u64, host: u64) -> Image {
        let g = self.geometry();
        let index = block + block / g.chunk_ratio;
        self.entries.push((index, host | FULLY_PRESENT));
        let len = g.guest_len(block) as usize;
        self.payload.push((host, pattern(block as u8, len)));
        self
    }

    pub fn state(mut self, block: u64, state: u64) -> Image {
        let g = self.geometry();
        self.entries.push((block + block / g.chunk_ratio, state));
        self
    }

    pub fn geometry(&self) -> Geometry {
        Geometry::of(&Metadata {
            block_size: self.block_size,
            leave_blocks_allocated: false,
            virtual_disk_size: self.virtual_size,
            logical_sector_size: self.logical_sector,
            physical_sector_size: 4096,
        })
    }

    /// The guest disk this image should read as.
    pub fn expected(&self) -> Vec<u8> {
        let g = self.geometry();
        let mut disk = vec![0u8; g.disk_size as usize];
        for &(index, e) in &self.entries {
            if e & 7 == FULLY_PRESENT
                && let Some(block) = g.block_of_entry(index)
            {
                let (_, bytes) = self
                    .payload
                    .iter()
                    .find(|(h, _)| *h == e & !0xf_ffff)
                    .expect("payload placed");
                let at = (block * g.block_size) as usize;
                disk[at..at + bytes.len()].copy_from_slice(bytes);
            }
        }
        disk
    }

    pub fn build(&self) -> Vec<u8> {
        let mut img = Vec::new();
        put(&mut img, 0, b"vhdxfile");
        for (at, seq) in [(0x10000u64, self.sequences.0), (0x20000, self.sequences.1)] {
            let mut h = vec![0u8; 4096];
            h[..4].copy_from_slice(b"head");
            h[8..16].copy_from_slice(&seq.to_le_bytes());
            h[48..64].copy_from_slice(&self.log_guid);
            h[66..68].copy_from_slice(&1u16.to_le_bytes());
            h[68..72].copy_from_slice(&self.log.1.to_le_bytes());
            h[72..80].copy_from_slice(&self.log.0.to_le_bytes());
            seal(&mut h);
            put(&mut img, at, &h);
        }
        let mut rt = vec![0u8; 0x10000];
        rt[..4].copy_from_slice(b"regi");
        let mut regions = vec![
            (BAT_GUID, self.bat.0, self.bat.1, true),
            (METADATA_GUID, self.metadata.0, self.metadata.1, true),
        ];
        regions.extend(self.extra_regions.iter().cloned());
        rt[8..12].copy_from_slice(&(regions.len() as u32).to_le_bytes());
        for (i, (g, off, len, req)) in regions.iter().enumerate() {
            let e = &mut rt[16 + 32 * i..48 + 32 * i];
            e[..16].copy_from_slice(g);
            e[16..24].copy_from_slice(&off.to_le_bytes());
            e[24..28].copy_from_slice(&len.to_le_bytes());
            e[28..32].copy_from_slice(&u32::from(*req).to_le_bytes());
        }
        seal(&mut rt);
        put(&mut img, 0x30000, &rt);
        put(&mut img, 0x40000, &rt);
        // Metadata: table, then items from 64 KiB on.
        let m = self.metadata.0;
        let mut table = vec![0u8; 0x10000];
        table[..8].copy_from_slice(b"metadata");
        let mut items: Vec<([u8; 16], Vec<u8>)> = vec![
            (
                super::metadata::FILE_PARAMETERS,
                [self.block_size.to_le_bytes(), self.params.to_le_bytes()].concat(),
            ),
            (
                super::metadata::VIRTUAL_DISK_SIZE,
                self.virtual_size.to_le_bytes().to_vec(),
            ),
            (super::metadata::PAGE_83, vec![7; 16]),
            (
                super::metadata::LOGICAL_SECTOR_SIZE,
                self.logical_sector.to_le_bytes().to_vec(),
            ),
            (
                super::metadata::PHYSICAL_SECTOR_SIZE,
                4096u32.to_le_bytes().to_vec(),
            ),
        ];
        if self.parent_locator {
            items.push((super::metadata::PARENT_LOCATOR, vec![0; 32]));
        }
        table[10..12].copy_from_slice(&(items.len() as u16).to_le_bytes());
        let mut at = 0x10000u32;
        for (i, (g, bytes)) in items.iter().enumerate() {
            let e = &mut table[32 + 32 * i..64 + 32 * i];
            e[..16].copy_from_slice(g);
            e[16..20].copy_from_slice(&at.to_le_bytes());
            e[20..24].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
            e[24..28].copy_from_slice(&4u32.to_le_bytes());
            put(&mut img, m + u64::from(at), bytes);
            at += 4096;
        }
        put(&mut img, m, &table);
        let mut bat = vec![0u8; self.bat.1 as usize];
        for &(i, e) in &self.entries {
            bat[i as usize * 8..i as usize * 8 + 8].copy_from_slice(&e.to_le_bytes());
        }
        put(&mut img, self.bat.0, &bat);
        for (host, bytes) in &self.payload {
            put(&mut img, *host, bytes);
        }
        // Regions end where the file ends at the latest.
        let end = [
            self.bat.0 + u64::from(self.bat.1),
            m + u64::from(self.metadata.1),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        if (img.len() as u64) < end {
            img.resize(end as usize, 0);
        }
        img
    }
}

fn opts(budget: usize, read_ahead: usize) -> ReaderOptions {
    ReaderOptions {
        memory_budget: budget,
        read_ahead,
        ..ReaderOptions::default()
    }
}

/// Streams `img` in `step`-byte reads; returns the disk and the stats.
fn stream_with(img: &[u8], o: &ReaderOptions, step: usize) -> Result<(Vec<u8>, VhdxStats)> {
    let reader = Box::new(Chunked {
        data: img.to_vec(),
        pos: 0,
        step,
    });
    let r = VhdxReader::new(reader, o)?;
    let mut sink = Rec::new(r.geometry().disk_size);
    let stats = r.convert(&mut sink)?;
    sink.assert_complete();
    Ok((sink.bytes, stats))
}

/// Converts `img` from a file by random access.
fn seek(img: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write;
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(img).unwrap();
    let r = VhdxReader::open(f, img.len() as u64)?;
    let mut sink = Rec::new(r.geometry().disk_size);
    r.convert(&mut sink)?;
    sink.assert_complete();
    Ok(sink.bytes)
}

/// Converts `img` with both converters, several read sizes and budgets; all must agree.
fn convert(img: &[u8]) -> Result<Vec<u8>> {
    let (bytes, _) = stream_with(img, &opts(32 << 20, 2 << 20), usize::MAX)?;
    let (small, _) = stream_with(img, &opts(0, 1), 777)?;
    assert_eq!(
        small, bytes,
        "the stream's result depends on read sizes or the budget"
    );
    assert_eq!(seek(img)?, bytes, "the converters disagree");
    Ok(bytes)
}

/// Both converters fail with the same kind; returns the stream's message.
fn fails(img: &[u8], kind: ErrorKind) -> String {
    let e = stream_with(img, &opts(32 << 20, 2 << 20), usize::MAX).unwrap_err();
    assert_eq!(e.kind(), kind, "stream: {e}");
    let s = seek(img).unwrap_err();
    assert_eq!(s.kind(), kind, "seek: {s}");
    e.to_string()
}

/// A dynamic image with every block state: data, zero, unmapped, undefined, not present.
fn mixed() -> Image {
    Image {
        virtual_size: 5 * MIB + 1536,
        ..Image::default()
    }
    .data(0, 4 * MIB)
    .state(1, ZERO)
    .state(2, UNMAPPED)
    .state(3, UNDEFINED)
    .state(4, NOT_PRESENT)
    .data(5, 5 * MIB)
}

#[test]
fn crc32c_is_castagnoli() {
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(crc32c(b""), 0);
}

#[test]
fn every_block_state_reads_as_qemu_reads_it() {
    let image = mixed();
    let disk = convert(&image.build()).unwrap();
    assert_eq!(disk.len() as u64, 5 * MIB + 1536);
    assert_eq!(disk, image.expected());
    assert!(disk[..MIB as usize].iter().all(|&b| b != 0));
    assert!(disk[MIB as usize..5 * MIB as usize].iter().all(|&b| b == 0));
}

#[test]
fn the_disk_size_is_whole_512_byte_sectors_as_in_qemu() {
    let image = Image {
        virtual_size: 2 * MIB + 1000,
        ..Image::default()
    }
    .data(2, 4 * MIB);
    let disk = convert(&image.build()).unwrap();
    assert_eq!(disk.len() as u64, 2 * MIB + 512);
}

#[test]
fn the_current_header_is_the_valid_one_with_the_higher_sequence() {
    // Header 1 newer than header 2.
    let mut image = mixed();
    image.sequences = (9, 2);
    let mut img = image.build();
    let layout = header::parse(&img).unwrap();
    assert_eq!(layout.header.at, 0x10000);
    assert_eq!(layout.header.sequence, 9);
    // A damaged header 1 leaves header 2.
    img[0x10000 + 100] ^= 1;
    assert_eq!(header::parse(&img).unwrap().header.at, 0x20000);
    img[0x20000 + 100] ^= 1;
    assert_eq!(header::parse(&img).unwrap_err(), VhdxError::NoValidHeader);
    assert!(fails(&img, ErrorKind::CorruptImage).contains("neither header"));
}

#[test]
fn equal_sequences_need_identical_headers() {
    let mut image = mixed();
    image.sequences = (4, 4);
    assert!(header::parse(&image.build()).is_ok());
    let mut img = image.build();
    // Make header 2 differ (and re-seal it).
    img[0x20000 + 16] = 0xee;
    seal(&mut img[0x20000..0x21000]);
    assert_eq!(
        header::parse(&img).unwrap_err(),
        VhdxError::HeadersDisagree { sequence: 4 }
    );
}

#[test]
fn a_damaged_first_region_table_falls_back_to_the_second() {
    let image = mixed();
    let mut img = image.build();
    img[0x30000 + 20] ^= 0xff;
    assert_eq!(header::parse(&img).unwrap().region_table, 0x40000);
    assert_eq!(convert(&img).unwrap(), image.expected());
    img[0x40000 + 20] ^= 0xff;
    assert_eq!(
        header::parse(&img).unwrap_err(),
        VhdxError::NoValidRegionTable
    );
}

#[test]
fn regions_may_not_overlap_each_other_or_the_header_section_or_the_log() {
    for (bat, meta) in [
        ((3 * MIB, MIB as u32), (3 * MIB, MIB as u32)),
        ((0x80000, MIB as u32), (3 * MIB, MIB as u32)),
        ((MIB + 4096, 4096), (3 * MIB, MIB as u32)),
        ((2 * MIB, MIB as u32), (u64::MAX - 100, MIB as u32)),
    ] {
        let image = Image {
            bat,
            metadata: meta,
            ..Image::default()
        };
        let img = image.build_without_payload();
        let e = header::parse(&img).unwrap_err();
        assert!(
            matches!(
                e,
                VhdxError::RegionOverlap { .. } | VhdxError::RegionOverflow { .. }
            ),
            "{e}"
        );
    }
}

impl Image {
    /// Only the header section (for regions placed where no file could reach).
    fn build_without_payload(&self) -> Vec<u8> {
        let mut small = self.clone();
        small.bat = (2 * MIB, MIB as u32);
        small.metadata = (3 * MIB, MIB as u32);
        let mut img = small.build();
        img.truncate(header::HEAD_LEN);
        // Rewrite both region tables with this image's regions.
        let mut rt = img[0x30000..0x40000].to_vec();
        for (i, (off, len)) in [self.bat, self.metadata].into_iter().enumerate() {
            rt[16 + 32 * i + 16..16 + 32 * i + 24].copy_from_slice(&off.to_le_bytes());
            rt[16 + 32 * i + 24..16 + 32 * i + 28].copy_from_slice(&len.to_le_bytes());
        }
        seal(&mut rt);
        img[0x30000..0x40000].copy_from_slice(&rt);
        img[0x40000..0x50000].copy_from_slice(&rt);
        img
    }
}

#[test]
fn missing_or_duplicate_regions_are_corrupt_and_unknown_required_ones_refused() {
    let mut image = mixed();
    image.extra_regions = vec![(BAT_GUID, 9 * MIB, MIB as u32, true)];
    assert!(fails(&image.build(), ErrorKind::CorruptImage).contains("lists the BAT twice"));
    image.extra_regions = vec![([9; 16], 9 * MIB, MIB as u32, false)];
    assert_eq!(convert(&image.build()).unwrap(), image.expected());
    image.extra_regions = vec![([9; 16], 9 * MIB, MIB as u32, true)];
    assert!(fails(&image.build(), ErrorKind::Unsupported).contains("requires region"));
}

#[test]
fn a_log_to_replay_is_refused_and_a_misplaced_log_is_corrupt() {
    let mut image = mixed();
    image.log_guid = [1; 16];
    let msg = fails(&image.build(), ErrorKind::Unsupported);
    assert!(msg.contains("qemu-img check -r all"), "{msg}");
    // A log GUID with an empty log has nothing to replay.
    image.log.1 = 0;
    assert_eq!(convert(&image.build()).unwrap(), image.expected());
    image.log = (MIB + 512, MIB as u32);
    image.log_guid = [0; 16];
    assert!(fails(&image.build(), ErrorKind::CorruptImage).contains("log"));
}

#[test]
fn the_block_size_must_be_a_power_of_two_from_1_to_256_mib() {
    for bs in [0, 512 << 10, 3 << 20, 512 << 20, u32::MAX] {
        let image = Image {
            block_size: bs,
            ..Image::default()
        };
        let msg = fails(&image.build(), ErrorKind::CorruptImage);
        assert!(msg.contains("block size"), "{bs}: {msg}");
    }
}

#[test]
fn the_logical_sector_size_is_512_or_4096() {
    for lss in [0, 1024, 8192] {
        let image = Image {
            logical_sector: lss,
            ..Image::default()
        };
        assert!(fails(&image.build(), ErrorKind::CorruptImage).contains("logical sector"));
    }
    let image = Image {
        logical_sector: 4096,
        ..Image::default()
    }
    .data(1, 4 * MIB);
    assert_eq!(convert(&image.build()).unwrap(), image.expected());
}

#[test]
fn differencing_images_are_refused() {
    let mut image = mixed();
    image.params = 2;
    image.parent_locator = true;
    assert!(fails(&image.build(), ErrorKind::Unsupported).contains("differencing"));
    image.parent_locator = false;
    assert!(fails(&image.build(), ErrorKind::CorruptImage).contains("parent locator"));
}

#[test]
fn missing_metadata_items_and_items_outside_the_region_are_corrupt() {
    let img = mixed().build();
    let m = 3 * MIB as usize;
    // The virtual size item's entry (the second) points past the 1 MiB region.
    let mut bad = img.clone();
    bad[m + 64 + 16..m + 64 + 20].copy_from_slice(&(MIB as u32 - 4).to_le_bytes());
    assert!(fails(&bad, ErrorKind::CorruptImage).contains("outside the"));
    // The page 83 item renamed (and not required): missing.
    let mut bad = img.clone();
    bad[m + 96] ^= 0xff;
    bad[m + 96 + 24] = 0;
    assert!(fails(&bad, ErrorKind::CorruptImage).contains("lacks the page 83"));
    // Renamed and required: an item Quarry does not know.
    let mut bad = img.clone();
    bad[m + 96] ^= 0xff;
    assert!(fails(&bad, ErrorKind::Unsupported).contains("requires item"));
    let mut bad = img;
    bad[m] = b'X';
    assert!(fails(&bad, ErrorKind::CorruptImage).contains("signature"));
}

#[test]
fn a_bat_too_short_for_the_disk_is_corrupt() {
    let image = Image {
        virtual_size: 64 << 40,
        ..Image::default()
    };
    assert!(fails(&image.build(), ErrorKind::CorruptImage).contains("too short"));
    let image = Image {
        virtual_size: (64 << 40) + 512,
        ..Image::default()
    };
    assert!(fails(&image.build(), ErrorKind::CorruptImage).contains("64 TiB"));
}

#[test]
fn an_empty_disk_is_corrupt_as_qemu_refuses_it() {
    // A virtual disk size of 0 (an item moved onto zeroes, say) imported as a 0-byte disk.
    let image = Image {
        virtual_size: 0,
        ..Image::default()
    };
    assert!(fails(&image.build(), ErrorKind::CorruptImage).contains("virtual disk size"));
}

#[test]
fn invalid_block_states_are_corrupt() {
    for state in [4, 7] {
        let image = mixed().state(3, state);
        let msg = fails(&image.build(), ErrorKind::CorruptImage);
        assert!(msg.contains("BAT entry 3"), "{msg}");
    }
}

#[test]
fn data_blocks_may_not_overlap_regions_or_each_other() {
    // The header section, the log, the BAT, the metadata (offsets are whole MiB).
    for host in [0, MIB, 2 * MIB, 3 * MIB] {
        let image = Image::default().state(0, host | FULLY_PRESENT);
        let msg = fails(&image.build(), ErrorKind::CorruptImage);
        assert!(msg.contains("BAT entry 0"), "{host:#x}: {msg}");
    }
    let image = Image {
        block_size: 2 * MIB as u32,
        ..Image::default()
    }
    .data(0, 4 * MIB)
    .data(1, 5 * MIB);
    let msg = fails(&image.build(), ErrorKind::CorruptImage);
    assert!(msg.contains("payload block of BAT entry"), "{msg}");
}

#[test]
fn a_payload_block_past_the_end_of_the_file_is_truncation() {
    let image = mixed();
    let mut img = image.build();
    img.truncate(5 * MIB as usize + 1000);
    assert!(fails(&img, ErrorKind::CorruptImage).contains("past the end"));
    let mut img = image.build();
    img.truncate(3 * MIB as usize + 100);
    assert!(fails(&img, ErrorKind::CorruptImage).contains("metadata"));
    let img = image.build();
    assert!(fails(&img[..0x40000], ErrorKind::CorruptImage).contains("header section"));
}

#[test]
fn a_bat_after_its_data_is_held_for_then_spilled_past_the_budget() {
    // Data at 4-6 MiB, the BAT after it at 8 MiB, the metadata first at 2 MiB.
    let image = Image {
        bat: (8 * MIB, MIB as u32),
        metadata: (2 * MIB, MIB as u32),
        ..mixed()
    };
    let image = Image {
        entries: Vec::new(),
        payload: Vec::new(),
        ..image
    }
    .data(0, 4 * MIB)
    .state(1, ZERO)
    .data(5, 5 * MIB);
    let img = image.build();
    assert_eq!(convert(&img).unwrap(), image.expected());
    let (_, stats) = stream_with(&img, &opts(32 << 20, 2 << 20), usize::MAX).unwrap();
    assert!(stats.held_bytes >= 2 * MIB, "{stats:?}");
    assert_eq!(stats.spilled_bytes, 0);
    let (_, stats) = stream_with(&img, &opts(MIB as usize, 2 << 20), usize::MAX).unwrap();
    assert!(stats.spilled_bytes >= MIB, "{stats:?}");
}

#[test]
fn the_metadata_after_the_bat_and_the_data_is_found() {
    let image = Image {
        bat: (2 * MIB, MIB as u32),
        metadata: (9 * MIB, MIB as u32),
        ..Image::default()
    }
    .data(0, 4 * MIB)
    .data(3, 6 * MIB);
    assert_eq!(convert(&image.build()).unwrap(), image.expected());
}

#[test]
fn sector_bitmap_entries_are_skipped_every_chunk_ratio_blocks() {
    // 256 MiB blocks of 512-byte sectors: a bitmap entry after every 16 payload entries.
    let image = Image {
        block_size: 256 << 20,
        virtual_size: 16 * (256 << 20) + MIB,
        ..Image::default()
    };
    let g = image.geometry();
    assert_eq!(g.chunk_ratio, 16);
    assert_eq!(g.bat_entries, 18);
    assert_eq!(g.block_of_entry(15), Some(15));
    assert_eq!(g.block_of_entry(16), None);
    assert_eq!(g.block_of_entry(17), Some(16));
    // Only the last block (1 MiB of guest data) is present; the bitmap entry is garbage that
    // must not be read as a block.
    let mut image = image.data(16, 4 * MIB);
    image.entries.push((16, 6 | (9 * MIB)));
    let img = image.build();
    let mut sink = Extents::default();
    VhdxReader::open(tempfile_with(&img), img.len() as u64)
        .unwrap()
        .convert(&mut sink)
        .unwrap();
    let tail = 16 * (256u64 << 20);
    assert_eq!(sink.zeroes, vec![(0, tail)]);
    assert_eq!(sink.data, vec![(tail, pattern(16, MIB as usize))]);
}

fn tempfile_with(img: &[u8]) -> std::fs::File {
    use std::io::Write;
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(img).unwrap();
    f
}

/// The extents a conversion reports, for disks too large to hold.
#[derive(Default)]
struct Extents {
    zeroes: Vec<(u64, u64)>,
    data: Vec<(u64, Vec<u8>)>,
}

impl ExtentSink for Extents {
    fn write_data(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.data.push((offset, data.to_vec()));
        Ok(())
    }
    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
        self.zeroes.push((offset, len));
        Ok(())
    }
}

#[test]
fn mutated_images_never_panic() {
    // Flip bytes all over the structures of a valid image: every result is a clean error or a
    // disk of the stated size.
    let img = mixed().build();
    let places: Vec<usize> = (0..8)
        .map(|i| 0x10000 + i * 61)
        .chain((0..8).map(|i| 0x30000 + i * 7))
        .chain((0..8).map(|i| 2 * MIB as usize + i * 3))
        .chain((0..8).map(|i| 3 * MIB as usize + i * 5))
        .chain((0..5).map(|i| 3 * MIB as usize + 0x10000 + i * 4096))
        .collect();
    for at in places {
        for flip in [0x01u8, 0xff] {
            let mut bad = img.clone();
            bad[at] ^= flip;
            let _ = stream_with(&bad, &opts(1 << 20, 1 << 16), 4096);
            let _ = seek(&bad);
        }
    }
}

/// The random-access converter reads (and so holds) at most 2 MiB at a time: two adjacent
/// 8 MiB blocks arrive as eight writes, not two of a block each.
#[test]
fn local_blocks_are_read_in_runs_of_at_most_2_mib() {
    use std::io::Write;
    let image = Image {
        block_size: 8 * MIB as u32,
        virtual_size: 16 * MIB,
        ..Image::default()
    }
    .data(0, 4 * MIB)
    .data(1, 12 * MIB);
    let img = image.build();
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(&img).unwrap();
    let r = VhdxReader::open(f, img.len() as u64).unwrap();
    let mut sink = Rec::new(r.geometry().disk_size);
    r.convert(&mut sink).unwrap();
    sink.assert_complete();
    assert_eq!(sink.data_calls, 8);
    assert!(sink.bytes == image.expected());
}
