//! What the stream fuzz targets share: their reader options, and the sink they convert into,
//! which checks bounds and the exactly-once contract of [`ExtentSink`] without storing the disk.

use std::collections::BTreeMap;

use importer::format::ReaderOptions;
use importer::sink::ExtentSink;

/// A small memory budget, so that held data reaches the spill file.
pub fn reader_options() -> ReaderOptions {
    ReaderOptions {
        spill_dir: std::env::temp_dir(),
        memory_budget: 64 << 10,
        ..ReaderOptions::default()
    }
}

/// Checks bounds and the exactly-once contract without storing the disk.
pub struct CheckingSink {
    vsize: u64,
    /// Reported ranges, merged when adjacent.
    extents: BTreeMap<u64, u64>,
}

impl CheckingSink {
    pub fn new(vsize: u64) -> CheckingSink {
        CheckingSink {
            vsize,
            extents: BTreeMap::new(),
        }
    }

    fn claim(&mut self, off: u64, len: u64) {
        assert!(len > 0, "empty extent");
        let end = off.checked_add(len).expect("extent overflows");
        assert!(
            end <= self.vsize,
            "extent {off:#x}+{len:#x} past {:#x}",
            self.vsize
        );
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
pub fn assert_complete(sink: &CheckingSink) {
    if sink.vsize == 0 {
        assert!(sink.extents.is_empty());
    } else {
        assert_eq!(sink.extents.len(), 1, "guest bytes not reported");
        assert_eq!(
            sink.extents.get(&0),
            Some(&sink.vsize),
            "guest bytes not reported"
        );
    }
}
