//! Feeds arbitrary text to the OVF descriptor scanner: it may refuse, never panic or loop.
//!
//! Run: `fuzz/run.sh 300 ovf` after `fuzz/seed.sh` (the README's Fuzzing section).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(disks) = importer::ova::ovf::disks(text) {
            assert!(!disks.is_empty());
        }
    }
});
