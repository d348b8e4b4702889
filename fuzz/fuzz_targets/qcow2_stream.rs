//! Feeds arbitrary bytes through both qcow2 readers, the streaming one and the random-access one
//! (the bytes written to a memfd): neither may panic, hang or allocate without bound, and when
//! one succeeds it must have reported every guest byte exactly once, within the virtual size.
//!
//! Run: `cargo +nightly fuzz run qcow2_stream` from this directory (seed the corpus with
//! `testdata/make-images.sh corpus/qcow2_stream`).

#![no_main]

use std::io::{Cursor, Write};

use importer::format::qcow2::{Qcow2FileReader, Qcow2Reader};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;
use common::{CheckingSink, assert_complete, reader_options};

fuzz_target!(|data: &[u8]| {
    let opts = reader_options();
    let Ok(reader) = Qcow2Reader::new(Box::new(Cursor::new(data.to_vec())), &opts) else {
        return;
    };
    let vsize = reader.header().virtual_size;
    // The import driver refuses disks larger than the target before converting.
    if vsize > 1 << 30 {
        return;
    }
    let mut sink = CheckingSink::new(vsize);
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
    let mut sink = CheckingSink::new(vsize);
    if reader.convert(&mut sink).is_ok() {
        assert_complete(&sink);
    }
});
