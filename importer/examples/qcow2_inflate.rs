//! Decode-only benchmark of a compressed qcow2 image: inflates every compressed cluster on one
//! thread, writing nothing, and prints one JSON line with the CPU seconds the inflating took.
//! `bench/import_bench.py` divides them by the cores for the image's decode bound.
//!
//! Usage: `qcow2_inflate IMAGE.qcow2`

use std::process::ExitCode;

use importer::format::qcow2;

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1).map(std::path::PathBuf::from) else {
        eprintln!("usage: qcow2_inflate IMAGE.qcow2");
        return ExitCode::from(2);
    };
    let measured = std::fs::File::open(&path)
        .and_then(|f| Ok((f.metadata()?.len(), f)))
        .map_err(|e| importer::Error::io(format!("opening {}", path.display()), e))
        .and_then(|(len, file)| qcow2::inflate_cost(&file, len));
    match measured {
        Ok(cost) => {
            println!(
                "{}",
                serde_json::json!({
                    "clusters": cost.clusters,
                    "compressed_bytes": cost.compressed_bytes,
                    "inflated_bytes": cost.inflated_bytes,
                    "cpu_seconds": cost.cpu.as_secs_f64(),
                })
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("qcow2_inflate: {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}
