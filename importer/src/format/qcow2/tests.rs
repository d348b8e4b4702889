//! Streaming tests on small images built in code, a naive random-access reference reader, and a
//! property test feeding mutated images through the streaming reader.

use std::collections::BTreeMap;
use std::io::{self, Read};

use proptest::prelude::*;

use super::header::tests::Fields;
use super::header::{self, incompat};
use super::inflate::Inflater;
use super::inflate::tests::{deflate, zstd};
use super::l2::{self, Mapping, OFLAG_COMPRESSED, OFLAG_COPIED, OFLAG_ZERO};
use super::{Qcow2Reader, Qcow2Stats};
use crate::error::{ErrorKind, Result};
use crate::format::ReaderOptions;
use crate::sink::ExtentSink;

/// A sink that keeps the guest disk in memory and asserts the exactly-once contract.
pub(crate) struct Rec {
    pub vsize: u64,
    pub bytes: Vec<u8>,
    extents: BTreeMap<u64, u64>,
    pub data_calls: usize,
    pub zero_calls: usize,
}

impl Rec {
    pub fn new(vsize: u64) -> Rec {
        Rec {
            vsize,
            // Not zero: a range never reported would not read as zero by accident.
            bytes: vec![0x5a; vsize as usize],
            extents: BTreeMap::new(),
            data_calls: 0,
            zero_calls: 0,
        }
    }

    fn claim(&mut self, off: u64, len: u64) {
        assert!(len > 0, "empty extent at {off:#x}");
        let end = off.checked_add(len).expect("extent overflows");
        assert!(
            end <= self.vsize,
            "extent {off:#x}+{len:#x} past {:#x}",
            self.vsize
        );
        if let Some((&s, &e)) = self.extents.range(..=off).next_back() {
            assert!(e <= off, "extent {off:#x}+{len:#x} overlaps {s:#x}..{e:#x}");
        }
        if let Some((&s, &e)) = self.extents.range(off..).next() {
            assert!(s >= end, "extent {off:#x}+{len:#x} overlaps {s:#x}..{e:#x}");
        }
        self.extents.insert(off, end);
    }

    pub fn assert_complete(&self) {
        let mut at = 0;
        for (&s, &e) in &self.extents {
            assert_eq!(s, at, "guest bytes {at:#x}..{s:#x} never reported");
            at = e;
        }
        assert_eq!(at, self.vsize, "guest bytes {at:#x}.. never reported");
    }
}

impl ExtentSink for Rec {
    fn write_data(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.claim(offset, data.len() as u64);
        self.bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        self.data_calls += 1;
        Ok(())
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
        self.claim(offset, len);
        self.bytes[offset as usize..(offset + len) as usize].fill(0);
        self.zero_calls += 1;
        Ok(())
    }
}

/// A plain reader that hands out at most `step` bytes per call.
pub(crate) struct Chunked {
    pub data: Vec<u8>,
    pub pos: usize,
    pub step: usize,
}

impl Read for Chunked {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn opts(budget: usize) -> ReaderOptions {
    ReaderOptions {
        memory_budget: budget,
        ..ReaderOptions::default()
    }
}

/// Streams `img` (in `step`-byte reads) and returns the guest disk, asserting the sink contract.
fn stream_with(img: &[u8], o: &ReaderOptions, step: usize) -> Result<(Vec<u8>, Qcow2Stats, Rec)> {
    let reader = Box::new(Chunked {
        data: img.to_vec(),
        pos: 0,
        step,
    });
    let r = Qcow2Reader::new(reader, o)?;
    let mut sink = Rec::new(r.header().virtual_size);
    let stats = r.convert(&mut sink)?;
    sink.assert_complete();
    Ok((sink.bytes.clone(), stats, sink))
}

fn stream(img: &[u8]) -> Result<Vec<u8>> {
    let (bytes, ..) = stream_with(img, &opts(32 << 20), usize::MAX)?;
    // Same answer with tiny reads and with no memory for holding.
    let (small, ..) = stream_with(img, &opts(0), 1000)?;
    assert_eq!(
        small, bytes,
        "result depends on read sizes or the memory budget"
    );
    // A read-ahead smaller than a cluster still reads whole clusters (once hung here).
    let tiny = ReaderOptions {
        read_ahead: 1,
        ..opts(32 << 20)
    };
    let (short, ..) = stream_with(img, &tiny, usize::MAX)?;
    assert_eq!(short, bytes, "result depends on the read-ahead");
    Ok(bytes)
}

/// A random-access reader straight from the spec, to compare the streaming reader with.
pub(crate) fn reference(img: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let h = header::parse(img).map_err(|e| e.to_string())?;
    let cb = h.cluster_bits;
    let cs = h.cluster_size();
    let mut out = vec![0u8; h.virtual_size as usize];
    let get = |off: u64, len: u64| -> std::result::Result<&[u8], String> {
        let end = off.checked_add(len).ok_or("overflow")?;
        img.get(off as usize..end as usize)
            .ok_or_else(|| format!("{off:#x} past the end"))
    };
    let be64 = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap());
    let mut inflater = Inflater::new(h.compression);
    let mut cluster = vec![0u8; cs as usize];
    for gc in 0..h.guest_clusters() {
        let l1e = be64(get(h.l1_offset + gc / h.l2_entries() * 8, 8)?);
        let Some(l2) = l2::l1_entry(l1e, cb)? else {
            continue;
        };
        let at = l2 + gc % h.l2_entries() * h.l2_entry_size();
        let raw = be64(get(at, 8)?);
        let bitmap = if h.extended_l2 {
            Some(be64(get(at + 8, 8)?))
        } else {
            None
        };
        let goff = gc << cb;
        let glen = cs.min(h.virtual_size - goff) as usize;
        match l2::l2_entry(raw, bitmap, cb)? {
            Mapping::Zero => {}
            Mapping::Data { host, data_mask } => {
                let sc = u64::from(h.subclusters());
                let scs = cs / sc;
                // Only the bytes the guest reads must exist (past the end reads as zero).
                let last = u64::from(31 - data_mask.leading_zeros());
                let needed = ((last + 1) * scs).min(glen as u64);
                get(host, needed)?;
                let avail = img.len().min((host + cs) as usize);
                let mut src = img[host as usize..avail].to_vec();
                src.resize(cs as usize, 0);
                for i in 0..sc {
                    if data_mask >> i & 1 == 1 {
                        let a = (i * scs) as usize;
                        let b = (a + scs as usize).min(glen);
                        if a < b {
                            out[goff as usize + a..goff as usize + b].copy_from_slice(&src[a..b]);
                        }
                    }
                }
            }
            Mapping::Compressed(c) => {
                if c.offset >= img.len() as u64 {
                    return Err("compressed past the end".into());
                }
                let mut src = img[c.offset as usize..(c.end() as usize).min(img.len())].to_vec();
                src.resize(c.len as usize, 0);
                inflater.inflate(&src, &mut cluster)?;
                out[goff as usize..goff as usize + glen].copy_from_slice(&cluster[..glen]);
            }
        }
    }
    Ok(out)
}

fn pat(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| seed.wrapping_add((i % 251) as u8) ^ ((i / 251) as u8).wrapping_mul(3))
        .collect()
}

/// An image under construction: the header cluster, then whatever is put where.
struct Img {
    f: Fields,
    b: Vec<u8>,
}

impl Img {
    fn new(f: Fields) -> Img {
        let cs = 1u64 << f.cluster_bits;
        let mut b = f.cluster();
        let l1_end = (f.l1_offset + u64::from(f.l1_size) * 8).next_multiple_of(cs);
        let rt_end = f.rt_offset + u64::from(f.rt_clusters) * cs;
        b.resize(b.len().max(l1_end as usize).max(rt_end as usize), 0);
        Img { f, b }
    }

    /// A v3 image: refcount table in cluster 1, L1 in cluster 2.
    fn v3(cb: u32, vsize: u64) -> Img {
        Img::new(Fields::v3(cb, vsize))
    }

    fn cs(&self) -> u64 {
        1 << self.f.cluster_bits
    }

    fn put(&mut self, off: u64, d: &[u8]) {
        let end = off as usize + d.len();
        if self.b.len() < end {
            self.b.resize(end, 0);
        }
        self.b[off as usize..end].copy_from_slice(d);
    }

    fn set(&mut self, off: u64, v: u64) {
        self.put(off, &v.to_be_bytes());
    }

    fn l1(&mut self, i: u64, l2: u64) {
        self.set(self.f.l1_offset + 8 * i, l2 | OFLAG_COPIED);
    }

    fn l2(&mut self, table: u64, j: u64, entry: u64) {
        let esize = if self.f.incompat & incompat::EXTENDED_L2 != 0 {
            16
        } else {
            8
        };
        self.set(table + esize * j, entry);
        // Make sure the whole table exists in the stream.
        let end = table + self.cs();
        if (self.b.len() as u64) < end {
            self.b.resize(end as usize, 0);
        }
    }

    fn l2x(&mut self, table: u64, j: u64, entry: u64, bitmap: u64) {
        self.set(table + 16 * j, entry);
        self.set(table + 16 * j + 8, bitmap);
    }

    /// Puts a cluster of pattern bytes at `off` and returns them.
    fn data(&mut self, off: u64, seed: u8) -> Vec<u8> {
        let d = pat(seed, self.cs() as usize);
        self.put(off, &d);
        d
    }

    /// Puts `compressed` at `off` and returns the L2 entry describing it.
    fn compressed(&mut self, off: u64, compressed: &[u8]) -> u64 {
        self.put(off, compressed);
        compressed_entry(self.f.cluster_bits, off, compressed.len() as u64)
    }
}

fn compressed_entry(cb: u32, off: u64, len: u64) -> u64 {
    let sectors = ((off + len - 1) >> 9) - (off >> 9);
    OFLAG_COMPRESSED | (sectors << (62 - (cb - 8))) | off
}

fn expect_err(img: &[u8], kind: ErrorKind, needle: &str) {
    let e = match stream_with(img, &opts(32 << 20), usize::MAX) {
        Ok(_) => panic!("image streamed without error; expected {needle:?}"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), kind, "{e}");
    assert!(e.to_string().contains(needle), "{e} lacks {needle:?}");
}

/// [`expect_err`] for an image that is corrupt whatever the order it is read in (metadata used
/// as guest data, tables inside the header): the random-access converter must refuse it too,
/// so a file and a stream of the same image get the same verdict. (Images only a single pass
/// cannot convert, such as a data cluster mapped again after it passed, are not among them.)
fn expect_refused_by_both(img: &[u8], needle: &str) {
    expect_err(img, ErrorKind::CorruptImage, needle);
    match from_file(img) {
        Ok(_) => panic!("the random-access converter took an image the stream refuses"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::CorruptImage, "random access: {e}"),
    }
}

/// Converts `img` with the random-access converter, from a temporary file.
fn from_file(img: &[u8]) -> Result<Vec<u8>> {
    from_file_rec(img).map(|rec| rec.bytes)
}

/// [`from_file`], with the record of the sink's calls.
fn from_file_rec(img: &[u8]) -> Result<Rec> {
    let file = temp_file(img);
    let reader = super::Qcow2FileReader::open(file, img.len() as u64)?;
    let mut rec = Rec::new(reader.header.virtual_size);
    reader.convert(&mut rec)?;
    rec.assert_complete();
    Ok(rec)
}

fn temp_file(img: &[u8]) -> std::fs::File {
    use std::io::Write;
    let mut file = tempfile::tempfile().expect("temp file");
    file.write_all(img).expect("writing the image");
    file
}

/// 512-byte clusters, 6 guest clusters: data, unallocated, zero, zero-allocated, data, data.
fn basic(f: Fields) -> (Img, Vec<u8>) {
    let mut img = Img::new(f);
    let cs = img.cs();
    let l2 = 3 * cs;
    img.l1(0, l2);
    let mut want = vec![0u8; img.f.size as usize];
    let d0 = img.data(4 * cs, 1);
    img.l2(l2, 0, (4 * cs) | OFLAG_COPIED);
    img.l2(l2, 2, OFLAG_ZERO);
    img.data(5 * cs, 9); // allocated but reads as zero
    img.l2(l2, 3, (5 * cs) | OFLAG_ZERO);
    let d4 = img.data(6 * cs, 4);
    img.l2(l2, 4, 6 * cs);
    let d5 = img.data(7 * cs, 5);
    img.l2(l2, 5, 7 * cs);
    want[..cs as usize].copy_from_slice(&d0);
    want[4 * cs as usize..5 * cs as usize].copy_from_slice(&d4);
    let tail = img.f.size as usize - 5 * cs as usize;
    want[5 * cs as usize..].copy_from_slice(&d5[..tail]);
    (img, want)
}

#[test]
fn streams_data_zero_and_unallocated_clusters() {
    let (img, want) = basic(Fields::v3(9, 6 * 512));
    assert_eq!(stream(&img.b).unwrap(), want);
    assert_eq!(reference(&img.b).unwrap(), want);
}

#[test]
fn streams_a_v2_image() {
    let (img, want) = basic(Fields::v2(9, 6 * 512));
    assert_eq!(stream(&img.b).unwrap(), want);
}

#[test]
fn a_partial_last_cluster_is_cut_at_the_virtual_size() {
    // 512-byte clusters cannot leave a partial sector: 4 KiB ones with a size of 5.5 KiB can.
    let (img, want) = basic(Fields::v3(12, 5 * 4096 + 1536));
    assert_eq!(want.len(), 5 * 4096 + 1536);
    assert_eq!(stream(&img.b).unwrap(), want);
}

#[test]
fn contiguous_data_is_written_in_one_call_and_zeros_are_coalesced() {
    let mut img = Img::v3(9, 16 * 512);
    let l2 = 3 * 512;
    img.l1(0, l2);
    for j in 0..4 {
        img.data((4 + j) * 512, j as u8);
        img.l2(l2, j, (4 + j) * 512);
    }
    // Guest clusters 4..16 unallocated or zero: one zero range.
    img.l2(l2, 6, OFLAG_ZERO);
    let (_, _, rec) = stream_with(&img.b, &opts(1 << 20), usize::MAX).unwrap();
    assert_eq!((rec.data_calls, rec.zero_calls), (1, 1));
}

#[test]
fn a_data_cluster_before_its_l2_table_is_held_then_written() {
    let mut img = Img::v3(9, 4 * 512);
    let cs = 512;
    let d = img.data(3 * cs, 7); // data first
    img.l1(0, 5 * cs);
    img.l2(5 * cs, 1, 3 * cs);
    let mut want = vec![0u8; 4 * 512];
    want[512..1024].copy_from_slice(&d);
    let (out, stats, _) = stream_with(&img.b, &opts(1 << 20), usize::MAX).unwrap();
    assert_eq!(out, want);
    assert!(stats.held_bytes >= 512, "{stats:?}");
    assert_eq!(stats.spilled_bytes, 0);
}

#[test]
fn held_data_spills_to_a_file_when_the_budget_is_tiny() {
    let mut img = Img::v3(12, 64 * 4096);
    let cs = 4096;
    let mut want = vec![0u8; 64 * 4096];
    // 40 data clusters first, in reverse guest order, then their L2 table.
    for j in 0..40u64 {
        let d = img.data((3 + j) * cs, j as u8);
        let g = 63 - j;
        want[(g * cs) as usize..((g + 1) * cs) as usize].copy_from_slice(&d);
    }
    let table = 50 * cs;
    img.l1(0, table);
    for j in 0..40u64 {
        img.l2(table, 63 - j, (3 + j) * cs);
    }
    let (out, stats, _) = stream_with(&img.b, &opts(3 * 4096), 777).unwrap();
    assert_eq!(out, want);
    assert!(stats.spilled_bytes >= 30 * 4096, "{stats:?}");
    assert_eq!(reference(&img.b).unwrap(), want);
}

#[test]
fn an_l1_table_after_its_l2_tables_and_data_is_resolved_from_the_hold() {
    // As after `qemu-img resize` grows the L1 table: it moves to the end of the file.
    let mut f = Fields::v3(9, 2 * 64 * 512 + 1024);
    f.l1_offset = 20 * 512;
    f.l1_size = 3;
    let mut img = Img::new(f);
    let cs = 512;
    let mut want = vec![0u8; img.f.size as usize];
    let a = img.data(2 * cs, 1);
    img.l2(3 * cs, 5, 2 * cs);
    let b = img.data(4 * cs, 2);
    img.l2(5 * cs, 0, 4 * cs);
    let c = img.data(6 * cs, 3);
    img.l2(5 * cs, 1, 6 * cs);
    // L2 for the third L1 entry lies after the L1 table, with its data after it.
    img.l2(22 * cs, 0, (23 * cs) | OFLAG_COPIED);
    let d = img.data(23 * cs, 4);
    img.l1(0, 3 * cs);
    img.l1(1, 5 * cs);
    img.l1(2, 22 * cs);
    want[5 * 512..6 * 512].copy_from_slice(&a);
    want[64 * 512..65 * 512].copy_from_slice(&b);
    want[65 * 512..66 * 512].copy_from_slice(&c);
    want[128 * 512..129 * 512].copy_from_slice(&d);
    let (out, stats, _) = stream_with(&img.b, &opts(1 << 20), usize::MAX).unwrap();
    assert_eq!(out, want);
    assert!(stats.held_bytes >= 5 * 512);
    assert_eq!(stream(&img.b).unwrap(), want);
    assert_eq!(reference(&img.b).unwrap(), want);
}

#[test]
fn a_shared_data_cluster_is_written_to_every_guest_cluster() {
    let mut img = Img::v3(9, 4 * 512);
    img.l1(0, 3 * 512);
    let d = img.data(4 * 512, 3);
    img.l2(3 * 512, 0, 4 * 512);
    img.l2(3 * 512, 2, 4 * 512);
    let mut want = vec![0u8; 4 * 512];
    want[..512].copy_from_slice(&d);
    want[1024..1536].copy_from_slice(&d);
    assert_eq!(stream(&img.b).unwrap(), want);
}

#[test]
fn a_shared_l2_table_maps_each_l1_range() {
    let mut f = Fields::v3(9, 2 * 64 * 512);
    f.l1_size = 2;
    let mut img = Img::new(f);
    img.l1(0, 3 * 512);
    img.l1(1, 3 * 512);
    let d = img.data(4 * 512, 3);
    img.l2(3 * 512, 1, 4 * 512);
    let mut want = vec![0u8; 128 * 512];
    want[512..1024].copy_from_slice(&d);
    want[65 * 512..66 * 512].copy_from_slice(&d);
    assert_eq!(stream(&img.b).unwrap(), want);
}

#[test]
fn a_data_cluster_mapped_again_after_it_passed_is_refused() {
    let mut f = Fields::v3(9, 2 * 64 * 512);
    f.l1_size = 2;
    let mut img = Img::new(f);
    img.l1(0, 3 * 512);
    img.l1(1, 5 * 512);
    img.data(4 * 512, 3);
    img.l2(3 * 512, 0, 4 * 512);
    img.l2(5 * 512, 0, 4 * 512);
    expect_err(&img.b, ErrorKind::CorruptImage, "already passed");
}

fn compressed_image(zstd_clusters: bool, tail_past_eof: bool) -> (Img, Vec<u8>) {
    let mut f = Fields::v3(16, 3 * 65536);
    if zstd_clusters {
        f.incompat = incompat::COMPRESSION;
        f.compression_type = 1;
    }
    let mut img = Img::new(f);
    let cs = 65536u64;
    img.l1(0, 3 * cs);
    let c0 = pat(1, cs as usize);
    let mut c1 = vec![0xab; cs as usize];
    c1[100..200].copy_from_slice(&pat(9, 100));
    let c2 = pat(2, cs as usize);
    let z = |d: &[u8]| if zstd_clusters { zstd(d) } else { deflate(d) };
    // Packed back to back, the second one starting mid-sector.
    let (z0, z1, z2) = (z(&c0), z(&c1), z(&c2));
    let at0 = 4 * cs;
    let e0 = img.compressed(at0, &z0);
    let at1 = at0 + z0.len() as u64;
    let e1 = img.compressed(at1, &z1);
    let at2 = at1 + z1.len() as u64;
    let e2 = img.compressed(at2, &z2);
    img.l2(3 * cs, 0, e0);
    img.l2(3 * cs, 1, e1);
    img.l2(3 * cs, 2, e2);
    if !tail_past_eof {
        let n = img.b.len().next_multiple_of(512);
        img.b.resize(n, 0);
    }
    let mut want = c0;
    want.extend(c1);
    want.extend(c2);
    (img, want)
}

#[test]
fn streams_deflate_compressed_clusters() {
    let (img, want) = compressed_image(false, false);
    assert_eq!(stream(&img.b).unwrap(), want);
    assert_eq!(reference(&img.b).unwrap(), want);
}

#[test]
fn streams_zstd_compressed_clusters() {
    let (img, want) = compressed_image(true, false);
    assert_eq!(stream(&img.b).unwrap(), want);
}

#[test]
fn a_compressed_cluster_ending_mid_sector_at_eof_reads_like_qemu() {
    for z in [false, true] {
        let (img, want) = compressed_image(z, true);
        assert_ne!(img.b.len() % 512, 0);
        assert_eq!(stream(&img.b).unwrap(), want);
    }
}

#[test]
fn compressed_clusters_crossing_read_chunks() {
    // Clusters of 2 MiB compressed incompressibly straddle the 4 MiB read window.
    let mut f = Fields::v3(21, 3 << 21);
    f.l1_size = 1;
    let mut img = Img::new(f);
    let cs = 1u64 << 21;
    img.l1(0, 3 * cs);
    let mut want = Vec::new();
    let mut at = 4 * cs + 1000;
    for j in 0..3u64 {
        let d: Vec<u8> = (0..cs)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8 ^ j as u8)
            .collect();
        let z = deflate(&d);
        let e = img.compressed(at, &z);
        img.l2(3 * cs, j, e);
        at += z.len() as u64;
        want.extend(d);
    }
    assert_eq!(stream(&img.b).unwrap(), want);
}

#[test]
fn a_compressed_cluster_before_its_l2_table_comes_from_the_hold() {
    let mut f = Fields::v3(16, 2 * 65536);
    f.l1_size = 1;
    let mut img = Img::new(f);
    let cs = 65536u64;
    let c0 = pat(5, cs as usize);
    let c1 = pat(6, cs as usize);
    // Two compressed clusters sharing a host cluster: the first mapped by a table that comes
    // before them, the second (starting in the first one's last sector) by one after.
    let z0 = deflate(&c0);
    let e0 = img.compressed(3 * cs + 8, &z0);
    let z1 = deflate(&c1);
    let e1 = img.compressed(3 * cs + 8 + z0.len() as u64, &z1);
    img.l2(5 * cs, 0, e0);
    img.l2(5 * cs, 1, e1);
    img.l1(0, 5 * cs);
    let mut want = c0;
    want.extend(c1);
    let (out, stats, _) = stream_with(&img.b, &opts(1 << 20), usize::MAX).unwrap();
    assert_eq!(out, want);
    assert!(stats.held_bytes > 0);
    assert_eq!(stream(&img.b).unwrap(), want);
}

#[test]
fn compressed_clusters_split_across_two_l2_tables_share_a_sector() {
    // Guest cluster 8191 is mapped by the first L2 table and 8192 by the second, which is
    // written after the host cluster holding both: 8192 begins in 8191's last sector.
    let cs = 4096u64;
    let mut f = Fields::v3(12, 513 * cs);
    f.l1_size = 2;
    let mut img = Img::new(f);
    let mut a = vec![0x11; cs as usize];
    a[..300].copy_from_slice(&pat(1, 300));
    let mut b = vec![0x22; cs as usize];
    b[1000..1400].copy_from_slice(&pat(2, 400));
    img.l1(0, 3 * cs);
    let za = deflate(&a);
    let ea = img.compressed(4 * cs + 100, &za);
    let zb = deflate(&b);
    let eb = img.compressed(4 * cs + 100 + za.len() as u64, &zb);
    assert!(za.len() + zb.len() + 100 < cs as usize);
    img.l2(3 * cs, 511, ea);
    img.l1(1, 5 * cs);
    img.l2(5 * cs, 0, eb);
    let out = stream(&img.b).unwrap();
    assert_eq!(&out[(511 * cs) as usize..(512 * cs) as usize], &a[..]);
    assert_eq!(&out[(512 * cs) as usize..], &b[..]);
    assert!(out[..(511 * cs) as usize].iter().all(|&x| x == 0));
    assert_eq!(reference(&img.b).unwrap(), out);
}

#[test]
fn extended_l2_entries_read_subclusters() {
    let cs = 16384u64;
    let scs = cs / 32;
    let mut f = Fields::v3(14, 3 * cs - 1024);
    f.incompat = incompat::EXTENDED_L2;
    let mut img = Img::new(f);
    img.l1(0, 3 * cs);
    let d0 = img.data(4 * cs, 1);
    let d2 = img.data(5 * cs, 2);
    // Cluster 0: subclusters 0, 1 and 5 allocated, 2 zero, the rest unallocated (zero).
    img.l2x(3 * cs, 0, 4 * cs, 0b10_0011 | 1 << (32 + 2));
    // Cluster 1: unallocated, all subclusters zero.
    img.l2x(3 * cs, 1, 0, 0xffff_ffff_0000_0000);
    // Cluster 2 (partial): everything allocated.
    img.l2x(3 * cs, 2, 5 * cs, 0xffff_ffff);
    let mut want = vec![0u8; img.f.size as usize];
    for i in [0usize, 1, 5] {
        let s = i * scs as usize;
        want[s..s + scs as usize].copy_from_slice(&d0[s..s + scs as usize]);
    }
    let tail = want.len() - 2 * cs as usize;
    want[2 * cs as usize..].copy_from_slice(&d2[..tail]);
    assert_eq!(stream(&img.b).unwrap(), want);
    assert_eq!(reference(&img.b).unwrap(), want);
}

#[test]
fn a_data_cluster_may_end_at_eof_after_the_bytes_the_guest_reads() {
    // qemu writes only allocated subclusters, so the last cluster of the file can be short.
    let cs = 16384u64;
    let scs = cs / 32;
    let mut f = Fields::v3(14, 2 * cs);
    f.incompat = incompat::EXTENDED_L2;
    let mut img = Img::new(f);
    img.l1(0, 3 * cs);
    img.l2x(3 * cs, 1, 4 * cs, 0b110);
    let d = pat(3, 3 * scs as usize);
    img.put(4 * cs, &d);
    assert_eq!(img.b.len() as u64, 4 * cs + 3 * scs);
    let mut want = vec![0u8; 2 * cs as usize];
    let at = (cs + scs) as usize;
    want[at..at + 2 * scs as usize].copy_from_slice(&d[scs as usize..]);
    assert_eq!(stream(&img.b).unwrap(), want);
    assert_eq!(reference(&img.b).unwrap(), want);
    // One byte fewer and the guest would read past the end: truncated.
    let short = &img.b[..img.b.len() - 1];
    let e = stream_with(short, &opts(0), usize::MAX).err().unwrap();
    assert!(e.to_string().contains("truncated: the data cluster"), "{e}");
    // Same for the partial last guest cluster of a standard image.
    let mut img = Img::v3(12, 4096 + 512);
    img.l1(0, 3 * 4096);
    img.l2(3 * 4096, 1, 4 * 4096);
    img.put(4 * 4096, &[7; 512]);
    let out = stream(&img.b).unwrap();
    assert_eq!(&out[4096..], &[7; 512]);
}

#[test]
fn extended_l2_contradictory_bitmap_is_corrupt() {
    let mut f = Fields::v3(14, 16384);
    f.incompat = incompat::EXTENDED_L2;
    let mut img = Img::new(f);
    img.l1(0, 3 * 16384);
    img.l2x(3 * 16384, 0, 4 * 16384, 1 | 1 << 32);
    img.data(4 * 16384, 0);
    expect_err(&img.b, ErrorKind::CorruptImage, "both allocated and zero");
}

#[test]
fn an_empty_disk_needs_no_tables() {
    let f = Fields {
        l1_size: 0,
        ..Fields::v3(16, 0)
    };
    let img = Img::new(f);
    assert_eq!(stream(&img.b).unwrap(), Vec::<u8>::new());
}

#[test]
fn an_unallocated_disk_is_all_zeroes() {
    let img = Img::v3(16, 10 << 20);
    let (out, _, rec) = stream_with(&img.b, &opts(1 << 20), usize::MAX).unwrap();
    assert!(out.iter().all(|&b| b == 0));
    assert_eq!((rec.data_calls, rec.zero_calls), (0, 1));
}

/// A reader that serves `data` and then fails: the converter must not need more.
struct ThenFail(io::Cursor<Vec<u8>>);

impl Read for ThenFail {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.0.read(buf)? {
            0 => Err(io::Error::other("read past what the converter needed")),
            n => Ok(n),
        }
    }
}

#[test]
fn stops_reading_once_every_guest_byte_is_reported() {
    // The image followed by an endless stream: the converter must finish on its own.
    let (img, want) = basic(Fields::v3(9, 6 * 512));
    let endless = io::Cursor::new(img.b.clone()).chain(io::repeat(0xee));
    let r = Qcow2Reader::new(Box::new(endless), &opts(0)).unwrap();
    let mut sink = Rec::new(6 * 512);
    let stats = r.convert(&mut sink).unwrap();
    sink.assert_complete();
    assert_eq!(sink.bytes, want);
    assert!(stats.bytes_read <= (img.b.len() + opts(0).read_ahead) as u64);
}

#[test]
fn a_read_error_is_reported_with_its_kind() {
    let (img, _) = basic(Fields::v3(9, 6 * 512));
    let cut = img.b[..5 * 512].to_vec();
    let r = Qcow2Reader::new(Box::new(ThenFail(io::Cursor::new(cut))), &opts(0)).unwrap();
    let e = r.convert(&mut Rec::new(6 * 512)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
}

// ---- corrupt and hostile images ----

#[test]
fn data_clusters_inside_the_l1_or_refcount_table_are_corrupt() {
    // (Host offset 0, the header, means "unallocated" in a standard L2 entry.)
    let mut img = Img::v3(9, 4 * 512);
    img.l1(0, 3 * 512);
    img.l2(3 * 512, 0, 2 * 512);
    expect_err(&img.b, ErrorKind::CorruptImage, "which is the L1 table");
    let mut img = Img::v3(9, 4 * 512);
    img.l1(0, 3 * 512);
    img.l2(3 * 512, 0, 512);
    expect_err(
        &img.b,
        ErrorKind::CorruptImage,
        "which is the refcount table",
    );
}

#[test]
fn an_l2_table_pointing_at_the_header_or_the_l1_table_is_corrupt() {
    let mut img = Img::v3(9, 4 * 512);
    // An L1 entry of exactly 0x200 with 512-byte clusters is the header's... cluster 1 is the
    // refcount table, cluster 2 the L1 table.
    img.l1(0, 2 * 512);
    expect_refused_by_both(&img.b, "inside the L1 table");
    let mut img = Img::v3(9, 4 * 512);
    img.l1(0, 512);
    expect_refused_by_both(&img.b, "inside the refcount table");
}

#[test]
fn compressed_data_in_the_header_is_corrupt() {
    let mut img = Img::v3(16, 65536);
    img.l1(0, 3 * 65536);
    img.l2(3 * 65536, 0, compressed_entry(16, 200, 300));
    expect_refused_by_both(&img.b, "overlaps the header");
}

#[test]
fn compressed_data_overlapping_its_own_l2_table_is_corrupt() {
    let mut img = Img::v3(16, 65536);
    img.l1(0, 3 * 65536);
    img.l2(3 * 65536, 0, compressed_entry(16, 3 * 65536 + 4096, 300));
    expect_refused_by_both(&img.b, "the L2 table that maps it");
}

#[test]
fn an_l2_table_mapping_itself_is_corrupt() {
    let mut img = Img::v3(9, 4 * 512);
    img.l1(0, 3 * 512);
    img.l2(3 * 512, 0, 3 * 512);
    expect_refused_by_both(&img.b, "the L2 table that maps it");
}

#[test]
fn l2_tables_mapping_each_other_as_data_are_corrupt() {
    let mut f = Fields::v3(9, 2 * 64 * 512);
    f.l1_size = 2;
    let mut img = Img::new(f);
    img.l1(0, 3 * 512);
    img.l1(1, 4 * 512);
    img.l2(3 * 512, 0, 4 * 512);
    img.l2(4 * 512, 0, 3 * 512);
    expect_refused_by_both(&img.b, "an L2 table");
    // The same loop with the L1 table last (both tables come from the hold).
    let mut f = Fields::v3(9, 2 * 64 * 512);
    f.l1_size = 2;
    f.l1_offset = 10 * 512;
    let mut img = Img::new(f);
    img.l2(3 * 512, 0, 4 * 512);
    img.l2(4 * 512, 0, 3 * 512);
    img.l1(0, 3 * 512);
    img.l1(1, 4 * 512);
    expect_refused_by_both(&img.b, "an L2 table");
}

#[test]
fn an_l2_table_past_the_end_is_truncation() {
    let mut img = Img::v3(9, 4 * 512);
    img.l1(0, 100 * 512);
    expect_err(
        &img.b,
        ErrorKind::CorruptImage,
        "truncated: the L2 table at 0xc800",
    );
}

#[test]
fn a_data_cluster_past_the_end_is_truncation() {
    let (img, _) = basic(Fields::v3(9, 6 * 512));
    for cut in [7 * 512, 7 * 512 + 100, 4 * 512] {
        let e = stream_with(&img.b[..cut], &opts(1 << 20), usize::MAX)
            .err()
            .unwrap();
        assert_eq!(e.kind(), ErrorKind::CorruptImage);
        assert!(e.to_string().contains("truncated"), "{e}");
    }
}

#[test]
fn an_l1_table_past_the_end_is_truncation() {
    let (img, _) = basic(Fields::v3(9, 6 * 512));
    expect_err(
        &img.b[..2 * 512 + 4],
        ErrorKind::CorruptImage,
        "truncated: the L1 table",
    );
    expect_err(
        &img.b[..512],
        ErrorKind::CorruptImage,
        "truncated: the L1 table",
    );
}

#[test]
fn a_compressed_cluster_past_the_end_is_truncation() {
    let (img, _) = compressed_image(false, false);
    let e = stream_with(&img.b[..4 * 65536], &opts(1 << 20), usize::MAX)
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("truncated: the compressed cluster"),
        "{e}"
    );
}

#[test]
fn garbage_compressed_data_is_corrupt() {
    for z in [false, true] {
        let (mut img, _) = compressed_image(z, false);
        let at = 4 * 65536 + 3;
        img.put(at, &[0xff; 64]);
        expect_err(
            &img.b,
            ErrorKind::CorruptImage,
            "compressed cluster at 0x40000",
        );
    }
}

#[test]
fn many_compressed_clusters_inflate_in_parallel_and_errors_name_the_cluster() {
    let cs = 65536u64;
    let n = 40u64;
    let mut img = Img::v3(16, n * cs);
    img.l1(0, 3 * cs);
    let mut at = 4 * cs;
    let mut want = Vec::new();
    let mut offsets = Vec::new();
    for j in 0..n {
        let d = pat(j as u8, cs as usize);
        let z = deflate(&d);
        let e = img.compressed(at, &z);
        img.l2(3 * cs, j, e);
        offsets.push(at);
        at += z.len() as u64;
        want.extend(d);
    }
    assert_eq!(stream(&img.b).unwrap(), want);
    // Corrupt one cluster in the first half (inflated and written by the reading thread), then
    // one in the second (inflated by the helper thread).
    for bad in [5usize, 30] {
        let mut b = img.b.clone();
        let at = offsets[bad] as usize;
        b[at..at + 16].copy_from_slice(&[0xff; 16]);
        let e = stream_with(&b, &opts(1 << 20), usize::MAX).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::CorruptImage);
        assert!(
            e.to_string().contains(&format!(
                "compressed cluster at {:#x} (guest offset {:#x})",
                offsets[bad],
                bad << 16
            )),
            "{e}"
        );
    }
}

/// 48 guest clusters of 64 KiB, the last one partial: 36 compressed clusters back to back (more
/// than one batch), an unallocated one, a data cluster, 4 compressed clusters stored in reverse
/// host order, and 6 more back to back. Returns the image, the guest disk and the host offset of
/// each compressed cluster.
fn batched_image() -> (Img, Vec<u8>, BTreeMap<u64, u64>) {
    let cs = 65536u64;
    // A whole number of sectors, as qcow2 sizes are; the last cluster stays partial.
    let vsize = 48 * cs - 1024;
    let mut img = Img::v3(16, vsize);
    img.l1(0, 3 * cs);
    let mut want = vec![0u8; vsize as usize];
    let mut offsets = BTreeMap::new();
    let content = |j: u64, want: &mut Vec<u8>| {
        let d = pat(j as u8, cs as usize);
        let from = (j * cs) as usize;
        let to = (from + cs as usize).min(want.len());
        want[from..to].copy_from_slice(&d[..to - from]);
        d
    };
    let mut place = |img: &mut Img, j: u64, at: u64, want: &mut Vec<u8>| {
        let z = deflate(&content(j, want));
        let e = img.compressed(at, &z);
        img.l2(3 * cs, j, e);
        offsets.insert(j, at);
        at + z.len() as u64
    };
    let mut at = 4 * cs + 77;
    for j in 0..36 {
        at = place(&mut img, j, at, &mut want);
    }
    let data_at = at.next_multiple_of(cs);
    let d = img.data(data_at, 37);
    want[(37 * cs) as usize..(38 * cs) as usize].copy_from_slice(&d);
    img.l2(3 * cs, 37, data_at);
    let reversed = data_at + cs;
    let sizes: Vec<u64> = (38..42)
        .map(|j| deflate(&pat(j as u8, cs as usize)).len() as u64)
        .collect();
    let mut at = reversed;
    for j in (38..42).rev() {
        place(&mut img, j, at, &mut want);
        at += sizes[(j - 38) as usize];
    }
    for j in 42..48 {
        at = place(&mut img, j, at, &mut want);
    }
    let n = img.b.len().next_multiple_of(512);
    img.b.resize(n, 0);
    (img, want, offsets)
}

#[test]
fn compressed_clusters_from_a_file_are_written_in_guest_contiguous_batches() {
    let (img, want, _) = batched_image();
    assert_eq!(reference(&img.b).unwrap(), want);
    let rec = from_file_rec(&img.b).unwrap();
    assert!(
        rec.bytes == want,
        "random access differs from the guest disk"
    );
    // One write per batch: clusters 0-31 and 32-35, the data cluster, 38, 39 and 40 (each
    // stored before the one it follows), and 41-47.
    assert_eq!(rec.data_calls, 7);
}

#[test]
fn a_corrupt_cluster_inside_a_batch_is_named() {
    let (mut img, _, offsets) = batched_image();
    img.put(offsets[&20], &[0xff; 16]);
    let e = from_file(&img.b).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CorruptImage);
    assert!(
        e.to_string().contains(&format!(
            "compressed cluster at {:#x} (guest offset 0x140000)",
            offsets[&20]
        )),
        "{e}"
    );
}

#[test]
fn the_inflate_cost_counts_every_compressed_cluster() {
    let (img, _, offsets) = batched_image();
    let cost = super::inflate_cost(&temp_file(&img.b), img.b.len() as u64).unwrap();
    assert_eq!(cost.pieces, offsets.len() as u64);
    assert_eq!(cost.inflated_bytes, 46 * 65536 - 1024);
    assert!(cost.compressed_bytes > 0 && cost.cpu > std::time::Duration::ZERO);
}

#[test]
fn the_inflate_cost_of_a_corrupt_cluster_is_its_error() {
    let (mut img, _, offsets) = batched_image();
    img.put(offsets[&40], &[0xff; 16]);
    let e = super::inflate_cost(&temp_file(&img.b), img.b.len() as u64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CorruptImage);
    assert!(
        e.to_string()
            .contains(&format!("compressed cluster at {:#x}", offsets[&40])),
        "{e}"
    );
}

#[test]
fn unaligned_entries_are_corrupt() {
    let mut img = Img::v3(12, 4 * 4096);
    img.l1(0, 3 * 4096 + 512);
    expect_err(&img.b, ErrorKind::CorruptImage, "L1 entry 0");
    let mut img = Img::v3(12, 4 * 4096);
    img.l1(0, 3 * 4096);
    img.l2(3 * 4096, 1, 4 * 4096 + 512);
    expect_err(
        &img.b,
        ErrorKind::CorruptImage,
        "entry 1 (guest offset 0x1000)",
    );
}

#[test]
fn offsets_at_the_top_of_the_range_do_not_overflow() {
    let top = l2::L2E_OFFSET_MASK & !0x1fffff;
    let mut img = Img::v3(21, 1 << 21);
    img.l1(0, 3 << 21);
    img.l2(3 << 21, 0, top);
    expect_err(&img.b, ErrorKind::CorruptImage, "truncated");
    let mut img = Img::v3(21, 1 << 21);
    img.l1(0, top);
    expect_err(&img.b, ErrorKind::CorruptImage, "truncated");
    let mut img = Img::v3(9, 512);
    img.l1(0, 3 * 512);
    img.l2(3 * 512, 0, u64::MAX);
    // All bits: compressed, offset at the top of its range, past the end.
    expect_err(&img.b, ErrorKind::CorruptImage, "truncated");
}

#[test]
fn an_absurd_l1_size_is_refused_before_reading_on() {
    let f = Fields {
        l1_size: u32::MAX,
        ..Fields::v3(16, 1 << 30)
    };
    let e = Qcow2Reader::new(Box::new(io::Cursor::new(f.cluster())), &opts(0))
        .err()
        .unwrap();
    assert!(e.to_string().contains("too large"), "{e}");
}

#[test]
fn a_header_alone_is_truncation_not_a_panic() {
    for len in [0, 50, 200, 512, 4096] {
        let f = Fields::v3(12, 1 << 20);
        let b = f.cluster();
        let r = stream_with(&b[..len.min(b.len())], &opts(0), usize::MAX);
        assert_eq!(r.err().unwrap().kind(), ErrorKind::CorruptImage);
    }
}

#[test]
fn snapshot_only_clusters_are_dropped_once_all_l2_tables_passed() {
    // A stale L2 table and data (as a snapshot leaves) before the active ones; the active L2
    // reuses one old data cluster.
    let mut img = Img::v3(9, 4 * 512);
    let cs = 512;
    img.l2(3 * cs, 0, 4 * cs); // stale table, never referenced by the active L1
    let kept = img.data(4 * cs, 1);
    img.data(5 * cs, 2); // snapshot-only data
    img.l1(0, 6 * cs);
    img.l2(6 * cs, 0, 4 * cs);
    let fresh = img.data(7 * cs, 3);
    img.l2(6 * cs, 1, 7 * cs);
    img.data(8 * cs, 4); // garbage after everything
    let mut want = kept;
    want.extend(fresh);
    want.resize(4 * 512, 0);
    let (out, stats, _) = stream_with(&img.b, &opts(1 << 20), usize::MAX).unwrap();
    assert_eq!(out, want);
    assert!(stats.held_bytes >= 3 * 512);
}

// ---- property test: mutated images never panic, hang or disagree with the reference ----

fn seeds() -> Vec<Vec<u8>> {
    let mut v = vec![
        basic(Fields::v3(9, 6 * 512)).0.b,
        basic(Fields::v2(9, 5 * 512 + 7)).0.b,
        compressed_image(false, true).0.b,
        compressed_image(true, false).0.b,
    ];
    let mut f = Fields::v3(14, 3 * 16384);
    f.incompat = incompat::EXTENDED_L2;
    let mut img = Img::new(f);
    img.l1(0, 3 * 16384);
    img.data(4 * 16384, 1);
    img.l2x(3 * 16384, 0, 4 * 16384, 0x0000_00f0_0000_000f);
    img.l2x(3 * 16384, 2, 4 * 16384, 0xffff_ffff);
    v.push(img.b);
    v
}

/// Streams a possibly hostile image; on success the output must match the reference reader.
fn check_mutant(img: &[u8]) {
    if header::parse(img).is_ok_and(|h| h.virtual_size > 16 << 20) {
        return; // the import driver refuses disks larger than the target first
    }
    match stream_with(img, &opts(4096), 4096) {
        Ok((out, ..)) => {
            let want = reference(img).expect("the stream converted an image the reference refuses");
            assert!(out == want, "stream and reference disagree");
        }
        Err(e) => {
            let k = e.kind();
            assert!(
                matches!(k, ErrorKind::CorruptImage | ErrorKind::Unsupported),
                "{e}"
            );
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Byte(usize, u8),
    Word(usize, u64),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0usize..1 << 20, any::<u8>()).prop_map(|(a, b)| Mutation::Byte(a, b)),
        (0usize..1 << 17, any::<u64>()).prop_map(|(a, w)| Mutation::Word(a * 8, w)),
        (
            0usize..1 << 20,
            prop_oneof![Just(0u64), Just(1), Just(OFLAG_COPIED), any::<u64>()]
        )
            .prop_map(|(a, w)| Mutation::Word(a & !7, w)),
        (0usize..1 << 20).prop_map(Mutation::Truncate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn mutated_images_never_panic_and_agree_with_the_reference(
        seed in 0usize..5,
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        let mut img = seeds().swap_remove(seed);
        for m in muts {
            let len = img.len();
            match m {
                Mutation::Byte(a, b) => img[a % len] = b,
                Mutation::Word(a, w) => {
                    // Bias towards the metadata: the first few clusters.
                    let a = (a % len.min(4 * 65536)) & !7;
                    if a + 8 <= len {
                        img[a..a + 8].copy_from_slice(&w.to_be_bytes());
                    }
                }
                Mutation::Truncate(n) => img.truncate(n % (len + 1)),
            }
            if img.is_empty() {
                break;
            }
        }
        check_mutant(&img);
    }
}
