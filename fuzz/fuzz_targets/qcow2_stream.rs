//! Feeds arbitrary bytes through both qcow2 readers, the streaming one and the random-access one
//! (the bytes written to a memfd): neither may panic, hang or allocate without bound, and when
//! one succeeds it must have reported every guest byte exactly once, within the virtual size.
//!
//! Run: `cargo +nightly fuzz run qcow2_stream` from this directory (seed the corpus with
//! `testdata/make-images.sh corpus/qcow2_stream`).

#![no_main]

use std::collections::BTreeMap;
use std::io::{Cursor, Write};

use importer::format::ReaderOptions;
use importer::format::qcow2::{Qcow2FileReader, Qcow2Reader};
use importer::sink::ExtentSink;
use libfuzzer_sys::fuzz_target;

/// Checks bounds and the exactly-once contract without storing the disk.
struct CheckingSink {
    vsize: u64,
    /// Reported ranges, merged when adjacent.
    extents: BTreeMap<u64, u64>,
}

impl CheckingSink {
    fn claim(&mut self, off: u64, len: u64) {
        assert!(len > 0, "empty extent");
        let end = off.checked_add(len).expect("extent overflows");
        assert!(end <= self.vsize, "extent {off:#x}+{len:#x} past {:#x}", self.vsize);
        let mut start = off;
        let mut stop = end;
        if let Some((&s, &e)) = self.extents.range(..=off).next_back() {
            assert!(e <= off, "overlap with {s:#x}..{e:#x}");
            if e == off {
                self.extents.remove(&s);
                start = s;
            }
        }
        if let Some((&s, &e)) = self.extents.range(off..).next() {
            assert!(s >= end, "overlap with {s:#x}..{e:#x}");
            if s == end {
                self.extents.remove(&s);
                stop = e;
            }
        }
        self.extents.insert(start, stop);
    }
}

impl ExtentSink for CheckingSink {
    fn write_data(&mut self, offset: u64, data: &[u8]) -> importer::Result<()> {
        self.claim(offset, data.len() as u64);
        Ok(())
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) -> importer::Result<()> {
        self.claim(offset, len);
        Ok(())
    }
}

/// Every guest byte reported exactly once.
fn assert_complete(sink: &CheckingSink) {
    if sink.vsize == 0 {
        assert!(sink.extents.is_empty());
    } else {
        assert_eq!(sink.extents.len(), 1, "guest bytes not reported");
        assert_eq!(sink.extents.get(&0), Some(&sink.vsize), "guest bytes not reported");
    }
}

fuzz_target!(|data: &[u8]| {
    let opts = ReaderOptions {
        spill_dir: std::env::temp_dir(),
        memory_budget: 64 << 10,
        ..ReaderOptions::default()
    };
    let Ok(reader) = Qcow2Reader::new(Box::new(Cursor::new(data.to_vec())), &opts) else {
        return;
    };
    let vsize = reader.header().virtual_size;
    // The import driver refuses disks larger than the target before converting.
    if vsize > 1 << 30 {
        return;
    }
    let mut sink = CheckingSink {
        vsize,
        extents: BTreeMap::new(),
    };
    if reader.convert(&mut sink).is_ok() {
        assert_complete(&sink);
    }

    let mut file: std::fs::File =
        nix::sys::memfd::memfd_create(c"qcow2", nix::sys::memfd::MFdFlags::empty())
            .expect("memfd")
            .into();
    file.write_all(data).expect("memfd write");
    let Ok(reader) = Qcow2FileReader::open(file, data.len() as u64) else {
        return;
    };
    let mut sink = CheckingSink {
        vsize,
        extents: BTreeMap::new(),
    };
    if reader.convert(&mut sink).is_ok() {
        assert_complete(&sink);
    }
});
