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
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = VhdxReader::new(Box::new(Cursor::new(data.to_vec())), &common::options()) {
        common::check(Box::new(reader));
    }
    let file = common::memfd(c"vhdx", data);
    if let Ok(reader) = VhdxReader::open(file, data.len() as u64) {
        common::check(Box::new(reader));
    }
});
