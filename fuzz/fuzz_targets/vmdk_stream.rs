//! Feeds arbitrary bytes through the vmdk stream reader (sparse extents, monolithicSparse and
//! streamOptimized): it may not panic, hang or allocate without bound, and when it succeeds it
//! must have reported every guest byte exactly once, within the virtual size.
//!
//! Run: `fuzz/run.sh 300 vmdk_stream` after `fuzz/seed.sh` (the README's Fuzzing section).

#![no_main]

use std::io::Cursor;

use importer::format::vmdk::VmdkReader;
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = VmdkReader::new(Box::new(Cursor::new(data.to_vec())), &common::options()) {
        common::check(Box::new(reader));
    }
});
