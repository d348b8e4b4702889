//! Feeds arbitrary bytes through both vhd readers, the streaming one and the random-access one
//! (the bytes written to a memfd), dynamic and fixed: neither may panic, hang or allocate without
//! bound, and when one succeeds it must have reported every guest byte exactly once, within the
//! virtual size.
//!
//! Run: `fuzz/run.sh 300 vpc_stream` after `fuzz/seed.sh` (the README's Fuzzing section).

#![no_main]

use std::io::Cursor;

use importer::format::vpc::VpcReader;
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = VpcReader::new(Box::new(Cursor::new(data.to_vec())), &common::options()) {
        common::check(Box::new(reader));
    }
    let file = common::memfd(c"vpc", data);
    if let Ok(reader) = VpcReader::open(file, data.len() as u64) {
        common::check(Box::new(reader));
    }
});
