//! Feeds arbitrary bytes through both vhdx readers, the streaming one and the random-access one
//! (the bytes written to a memfd): neither may panic, hang or allocate without bound, and when
//! one succeeds it must have reported every guest byte exactly once, within the virtual size.
//!
//! Run: `cargo +nightly fuzz run vhdx_stream` from this directory (seed the corpus with small
//! images: `qemu-img create -f vhdx -o block_size=1M corpus/vhdx_stream/a.vhdx 8M`, plus a few
//! `qemu-io -c 'write ...'` on it).

#![no_main]

use std::io::Cursor;

use importer::format::vhdx::VhdxReader;
use importer::format::{FormatReader, ReaderOptions};
use libfuzzer_sys::fuzz_target;
use quarry_fuzz::{CheckingSink, assert_complete, memfd_with};

/// The import driver refuses disks larger than the target before converting.
const LARGEST: u64 = 1 << 30;

fuzz_target!(|data: &[u8]| {
    let opts = ReaderOptions {
        spill_dir: std::env::temp_dir(),
        memory_budget: 64 << 10,
        ..ReaderOptions::default()
    };
    if let Ok(reader) = VhdxReader::new(Box::new(Cursor::new(data.to_vec())), &opts) {
        let vsize = reader.virtual_size().unwrap_or(0);
        if vsize <= LARGEST {
            let mut sink = CheckingSink::new(vsize);
            if reader.convert(&mut sink).is_ok() {
                assert_complete(&sink);
            }
        }
    }
    let file = memfd_with(c"vhdx", data);
    if let Ok(reader) = VhdxReader::open(file, data.len() as u64) {
        let vsize = reader.virtual_size().unwrap_or(0);
        if vsize <= LARGEST {
            let mut sink = CheckingSink::new(vsize);
            if reader.convert(&mut sink).is_ok() {
                assert_complete(&sink);
            }
        }
    }
});
