//! Decode-only benchmark of a compressed image (qcow2 with compressed clusters, streamOptimized
//! vmdk): inflates every compressed cluster or grain on one thread, writing nothing, and prints
//! one JSON line with the CPU seconds the inflating took. `bench/import_bench.py` divides them by
//! the cores for the image's decode bound.
//!
//! Usage: `inflate_cost IMAGE`

use std::os::unix::fs::FileExt;
use std::process::ExitCode;

use importer::format::cost::InflateCost;
use importer::format::{qcow2, vmdk};

fn measure(path: &std::path::Path) -> importer::Result<InflateCost> {
    let opened = |e| importer::Error::io(format!("opening {}", path.display()), e);
    let file = std::fs::File::open(path).map_err(opened)?;
    let len = file.metadata().map_err(opened)?.len();
    let mut magic = [0u8; 4];
    file.read_exact_at(&mut magic, 0)
        .map_err(|e| importer::Error::from_read(e, "image"))?;
    match &magic {
        b"QFI\xfb" => qcow2::inflate_cost(&file, len),
        b"KDMV" => vmdk::inflate_cost(file),
        _ => Err(importer::Error::InvalidInput(
            "neither a qcow2 image nor a vmdk sparse extent".into(),
        )),
    }
}

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1).map(std::path::PathBuf::from) else {
        eprintln!("usage: inflate_cost IMAGE");
        return ExitCode::from(2);
    };
    match measure(&path) {
        Ok(cost) => {
            println!(
                "{}",
                serde_json::json!({
                    "pieces": cost.pieces,
                    "compressed_bytes": cost.compressed_bytes,
                    "inflated_bytes": cost.inflated_bytes,
                    "cpu_seconds": cost.cpu.as_secs_f64(),
                })
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("inflate_cost: {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}
