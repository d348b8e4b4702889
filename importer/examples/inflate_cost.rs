//! Decode-only benchmark of a compressed image (qcow2 with compressed clusters, streamOptimized
//! vmdk): inflates every compressed cluster or grain on one thread, writing nothing, and prints
//! one JSON line with the CPU seconds the inflating took. `bench/import_bench.py` divides them by
//! the cores for the image's decode bound. `stretches` lists `[image bytes, written bytes, CPU
//! seconds]` per stretch of the image (`importer::format::cost::STRETCH`), for its phased bound.
//!
//! Usage: `inflate_cost IMAGE [THREADS]`: with THREADS, that many threads each inflate the
//! whole image at the same time, and the report is the mean per thread.

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

/// Measures the image on `threads` threads at once, each inflating all of it, as an import's
/// workers inflate side by side (on this benchmark's VM two cores decoding at once each take
/// 5-10% more CPU than one alone); the mean per thread.
fn measure_side_by_side(path: &std::path::Path, threads: usize) -> importer::Result<InflateCost> {
    let costs = std::thread::scope(|s| {
        let runs: Vec<_> = (0..threads).map(|_| s.spawn(|| measure(path))).collect();
        runs.into_iter()
            .map(|r| r.join().expect("a measuring thread panicked"))
            .collect::<importer::Result<Vec<_>>>()
    })?;
    let mut mean = costs[0].clone();
    let n = costs.len() as u32;
    mean.cpu = costs.iter().map(|c| c.cpu).sum::<std::time::Duration>() / n;
    for (i, stretch) in mean.stretches.iter_mut().enumerate() {
        // the same image: the same stretches, only their CPU differs
        stretch.cpu = costs
            .iter()
            .map(|c| c.stretches[i].cpu)
            .sum::<std::time::Duration>()
            / n;
    }
    Ok(mean)
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let path = args.next().map(std::path::PathBuf::from);
    let threads = args
        .next()
        .map(|t| t.to_str().and_then(|t| t.parse::<usize>().ok()));
    let (Some(path), Some(threads @ 1..)) = (path, threads.unwrap_or(Some(1))) else {
        eprintln!("usage: inflate_cost IMAGE [THREADS]");
        return ExitCode::from(2);
    };
    match measure_side_by_side(&path, threads) {
        Ok(cost) => {
            println!(
                "{}",
                serde_json::json!({
                    "threads": threads,
                    "pieces": cost.pieces,
                    "compressed_bytes": cost.compressed_bytes,
                    "inflated_bytes": cost.inflated_bytes,
                    "cpu_seconds": cost.cpu.as_secs_f64(),
                    "stretches": cost.stretches.iter().map(|s| serde_json::json!([
                        s.image_bytes, s.written_bytes, s.cpu.as_secs_f64()
                    ])).collect::<Vec<_>>(),
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
