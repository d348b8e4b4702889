//! `quarry`: the command-line entry point (thin clap dispatch into the crates).

fn main() {
    println!("quarry {}", env!("CARGO_PKG_VERSION"));
}
