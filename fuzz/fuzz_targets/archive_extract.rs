//! Feeds arbitrary bytes to `quarry import --archive` as a tar: whatever the archive holds,
//! nothing may be written outside the target directory, a failed extraction must leave the
//! target empty, and nothing may panic.
//!
//! Run: `fuzz/run.sh 300 archive_extract` after `fuzz/seed.sh` (the README's Fuzzing section).

#![no_main]

use std::sync::Arc;

use importer::import::ImportRequest;
use importer::progress::Progress;
use importer::source::SourceSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("in.tar");
    std::fs::write(&source, data).unwrap();
    let target = dir.path().join("target");
    let mut req = ImportRequest::new(SourceSpec::File(source), &target);
    req.size = Some(64 << 20);
    let result = importer::archive::extract(&req, Arc::new(Progress::default()));
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    // The target is created once the compression layers are peeled: an earlier failure leaves none.
    names.retain(|n| n != "target");
    assert_eq!(names, ["in.tar"], "something was written beside the target");
    if result.is_err() {
        assert_eq!(
            std::fs::read_dir(&target).map_or(0, |d| d.count()),
            0,
            "a failed extraction left files"
        );
    }
});
