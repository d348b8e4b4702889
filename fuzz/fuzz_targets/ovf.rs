//! Feeds arbitrary text to the OVF descriptor scanner: it may refuse, never panic or loop.
//!
//! Run: `cargo +nightly fuzz run ovf` from this directory.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(disks) = importer::ova::ovf::disks(text) {
            assert!(!disks.is_empty());
        }
    }
});
