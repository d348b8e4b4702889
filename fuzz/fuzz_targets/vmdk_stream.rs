//! Feeds arbitrary bytes through the vmdk stream reader (sparse extents, monolithicSparse and
//! streamOptimized): it may not panic, hang or allocate without bound, and when it succeeds it
//! must have reported every guest byte exactly once, within the virtual size.
//!
//! Run: `cargo +nightly fuzz run vmdk_stream` from this directory (seed the corpus with images
//! from `qemu-img convert -O vmdk -o subformat=monolithicSparse|streamOptimized`).

#![no_main]

use std::io::Cursor;

use importer::format::vmdk::VmdkReader;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;
use common::{CheckingSink, assert_complete, reader_options};

fuzz_target!(|data: &[u8]| {
    let opts = reader_options();
    let Ok(reader) = VmdkReader::new(Box::new(Cursor::new(data.to_vec())), &opts) else {
        return;
    };
    let vsize = reader
        .header()
        .expect("a stream is one sparse extent")
        .virtual_size();
    // The import driver refuses disks larger than the target before converting.
    if vsize > 1 << 30 {
        return;
    }
    let mut sink = CheckingSink::new(vsize);
    if reader.convert(&mut sink).is_ok() {
        assert_complete(&sink);
    }
});
