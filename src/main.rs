//! `quarry`: the command-line entry point (thin clap dispatch into the crates).

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "quarry", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the CSI hostpath driver (Identity, Controller, Node) on one socket.
    Csi(csi::CsiArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Csi(args)) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .init();
            tokio::runtime::Runtime::new()?.block_on(csi::run(args))?;
        }
        None => println!("quarry {}", env!("CARGO_PKG_VERSION")),
    }
    Ok(())
}
