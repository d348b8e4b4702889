//! What every format fuzz target checks of a conversion that succeeded: every guest byte reported
//! exactly once, within the virtual size (without storing the disk).

use std::collections::BTreeMap;

use importer::sink::ExtentSink;

/// Checks bounds and the exactly-once contract without storing the disk.
pub struct CheckingSink {
    vsize: u64,
    /// Reported ranges, merged when adjacent.
    extents: BTreeMap<u64, u64>,
}

impl CheckingSink {
    pub fn new(vsize: u64) -> Self {
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

    /// Every guest byte reported exactly once.
    pub fn assert_complete(&self) {
        if self.vsize == 0 {
            assert!(self.extents.is_empty());
        } else {
            assert_eq!(self.extents.len(), 1, "guest bytes not reported");
            assert_eq!(
                self.extents.get(&0),
                Some(&self.vsize),
                "guest bytes not reported"
            );
        }
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

/// The fuzz input as a local file (a memfd), for the random-access readers.
// vmdk_stream has none (a local vmdk is a descriptor naming its extents).
#[allow(dead_code)]
pub fn memfd(name: &std::ffi::CStr, data: &[u8]) -> std::fs::File {
    use std::io::Write;
    let mut file: std::fs::File =
        nix::sys::memfd::memfd_create(name, nix::sys::memfd::MFdFlags::empty())
            .expect("memfd")
            .into();
    file.write_all(data).expect("memfd write");
    file
}

/// Readers' options for fuzzing: a small memory budget, so that holding spills.
pub fn options() -> importer::format::ReaderOptions {
    importer::format::ReaderOptions {
        spill_dir: std::env::temp_dir(),
        memory_budget: 64 << 10,
        ..importer::format::ReaderOptions::default()
    }
}

/// The import driver refuses disks larger than the target before converting; the fuzz targets
/// skip them likewise (converting them would only take time).
pub const MAX_VSIZE: u64 = 1 << 30;

/// Converts with `reader` into a [`CheckingSink`] and checks a success reported every byte.
/// A reader that states no size up front (a fixed vhd stream) is checked against the size it
/// returns.
pub fn check(reader: Box<dyn importer::format::FormatReader>) {
    let vsize = reader.virtual_size().unwrap_or(MAX_VSIZE);
    if vsize > MAX_VSIZE {
        return;
    }
    let mut sink = CheckingSink::new(vsize);
    if let Ok(size) = reader.copy_to(&mut sink) {
        sink.vsize = size;
        sink.assert_complete();
    }
}
