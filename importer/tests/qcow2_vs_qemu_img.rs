//! Every image made by `testdata/make-images.sh`, streamed through `Qcow2Reader` and read by
//! random access through `Qcow2FileReader`, must equal `qemu-img convert -O raw` byte for byte;
//! the refused ones must be refused by name by both.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use importer::format::qcow2::{Qcow2FileReader, Qcow2Reader, Qcow2Stats};
use importer::format::{FormatReader, ImageFormat, ReaderOptions};
use importer::sink::ExtentSink;
use importer::{ErrorKind, Result};
use testkit::qemu;

/// A file sink: data is written in place, zero ranges are left as holes. Counts what it was told
/// so the test can check that every guest byte was reported once.
struct FileSink {
    file: File,
    reported: u64,
}

impl ExtentSink for FileSink {
    fn write_data(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.file.write_all_at(data, offset).unwrap();
        self.reported += data.len() as u64;
        Ok(())
    }

    fn write_zeroes(&mut self, _offset: u64, len: u64) -> Result<()> {
        self.reported += len;
        Ok(())
    }
}

/// Hides everything but `Read`, so the reader cannot seek.
struct PlainRead(File);

impl Read for PlainRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

fn open(image: &Path, budget: usize, spill: &Path) -> Result<Qcow2Reader> {
    let opts = ReaderOptions {
        spill_dir: spill.to_path_buf(),
        memory_budget: budget,
        ..ReaderOptions::default()
    };
    Qcow2Reader::new(Box::new(PlainRead(File::open(image).unwrap())), &opts)
}

/// Converts `image` into `out` by random access.
fn seek(image: &Path, out: &Path) -> Qcow2Stats {
    let file = File::open(image).unwrap();
    let len = file.metadata().unwrap().len();
    let reader = Qcow2FileReader::open(file, len).unwrap();
    let vsize = reader.virtual_size().unwrap();
    let mut sink = FileSink {
        file: File::create(out).unwrap(),
        reported: 0,
    };
    let stats = reader
        .convert(&mut sink)
        .unwrap_or_else(|e| panic!("{}: {e}", image.display()));
    sink.file.set_len(vsize).unwrap();
    assert_eq!(sink.reported, vsize, "{}: bytes reported", image.display());
    stats
}

/// Streams `image` into `out` and returns the stats.
fn stream(image: &Path, out: &Path, budget: usize, spill: &Path) -> Qcow2Stats {
    let reader = open(image, budget, spill).unwrap();
    assert_eq!(reader.format(), ImageFormat::Qcow2);
    let vsize = reader.virtual_size().unwrap();
    let mut sink = FileSink {
        file: File::create(out).unwrap(),
        reported: 0,
    };
    let stats = reader
        .convert(&mut sink)
        .unwrap_or_else(|e| panic!("{}: {e}", image.display()));
    sink.file.set_len(vsize).unwrap();
    assert_eq!(sink.reported, vsize, "{}: bytes reported", image.display());
    stats
}

#[test]
fn qcow2_images_convert_exactly_like_qemu_img() {
    let dir = tempfile::tempdir().unwrap();
    let images = qemu::make_images(dir.path());
    assert!(images.len() >= 15, "{images:?}");
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    let mut converted = 0;
    for img in &images {
        let name = img.path.file_name().unwrap().to_string_lossy().into_owned();
        match img.expect.as_str() {
            "convert" => {
                let want_path = dir.path().join(format!("{name}.ref.raw"));
                qemu::convert_to_raw(&img.path, &want_path);
                let want = std::fs::read(&want_path).unwrap();
                assert_eq!(want.len() as u64, qemu::virtual_size(&img.path), "{name}");
                // With the default budget, and with no memory at all (everything held spills).
                for budget in [32 << 20, 0] {
                    let got_path = dir.path().join(format!("{name}.{budget}.raw"));
                    let stats = stream(&img.path, &got_path, budget, &spill);
                    let got = std::fs::read(&got_path).unwrap();
                    assert_eq!(got.len(), want.len(), "{name}: length");
                    if let Some(at) = qemu::first_difference(&got, &want) {
                        panic!(
                            "{name} ({}), budget {budget}: differs from qemu-img at byte {at:#x}",
                            img.what
                        );
                    }
                    if name == "snapshot.qcow2" || name == "resized.qcow2" {
                        // These images put data before the tables that map it: the hold was used.
                        assert!(stats.held_bytes > 0, "{name}: {stats:?}");
                        if budget == 0 {
                            assert!(stats.spilled_bytes > 0, "{name}: {stats:?}");
                        }
                    }
                    std::fs::remove_file(&got_path).unwrap();
                }
                let got_path = dir.path().join(format!("{name}.seek.raw"));
                let stats = seek(&img.path, &got_path);
                let got = std::fs::read(&got_path).unwrap();
                if let Some(at) = qemu::first_difference(&got, &want) {
                    panic!("{name}: random access differs from qemu-img at byte {at:#x}");
                }
                assert_eq!(stats.held_bytes, 0, "{name}: nothing is held");
                converted += 1;
            }
            "unsupported" => {
                let err = match open(&img.path, 1 << 20, &spill) {
                    Err(e) => e,
                    Ok(r) => r
                        .convert(&mut FileSink {
                            file: tempfile::tempfile().unwrap(),
                            reported: 0,
                        })
                        .expect_err(&name),
                };
                assert_eq!(err.kind(), ErrorKind::Unsupported, "{name}: {err}");
                let file = File::open(&img.path).unwrap();
                let len = file.metadata().unwrap().len();
                let seek_err = Qcow2FileReader::open(file, len).err().expect(&name);
                assert_eq!(seek_err.to_string(), err.to_string(), "{name}");
                let needle = match name.as_str() {
                    "backing.qcow2" => "default.qcow2",
                    "luks.qcow2" => "LUKS",
                    "datafile.qcow2" => "datafile.raw",
                    other => panic!("no expectation for {other}"),
                };
                assert!(err.to_string().contains(needle), "{name}: {err}");
            }
            other => panic!("{name}: unknown expectation {other}"),
        }
    }
    assert!(converted >= 12);
    // Spill files are anonymous: nothing is left behind.
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0);
}
