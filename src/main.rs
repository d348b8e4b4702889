//! `quarry`: the command-line entry point. Thin clap dispatch into the workspace crates, whose
//! `cli` modules hold each subcommand's arguments and implementation; errors end the process
//! through [`exit`] (one exit code and JSON form per error type).

mod exit;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use exit::{done, exit, report};

#[derive(Parser)]
#[command(
    name = "quarry",
    version,
    about = "VM disk import engine, uploader and hostpath CSI driver"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Import a disk image (qcow2, raw, vmdk, vhd, vhdx, vdi or the disk of an OVA, plain or
    /// gzip/xz/zstd compressed) into a volume, or extract a tar archive into one (--archive).
    Import(Box<importer::cli::ImportArgs>),
    /// Serve the CSI hostpath driver (Identity, Controller, Node) on one socket.
    Csi(csi::CsiArgs),
    /// Mount a PVC at a storage pool's path on the node (HPP's mounter of a pvcTemplate pool).
    PoolMount(csi::mounter::PoolMountArgs),
    /// Boot a VM from imported volumes with qemu over QMP and run its lifecycle.
    Launch(Box<launcher::cli::LaunchArgs>),
    /// Hot-plug, unplug, pause or resume a VM run by `quarry launch`.
    Vmctl(launcher::cli::VmctlArgs),
    /// Receive one uploaded image into a volume (CDI's upload server; virtctl-compatible).
    UploadServer(uploader::cli::ServerArgs),
    /// Check upload tokens and stream uploads to each PVC's upload server (CDI's upload proxy).
    UploadProxy(uploader::cli::ProxyArgs),
    /// Issue an upload token for a PVC, or generate the signing key pair (`upload-token keygen`).
    UploadToken(uploader::cli::TokenArgs),
    /// Upload a local image through the upload proxy, resuming after a dropped connection.
    Upload(uploader::cli::UploadArgs),
    /// Stream a volume to a target upload server, as CDI's host-assisted clone source.
    CloneSource(uploader::cli::CloneSourceArgs),
    /// Grow a volume's raw disk image to a larger volume size (never shrinks).
    ResizeDisk(uploader::cli::ResizeDiskArgs),
    /// Run the DataVolume, HyperConverged or HostPathProvisioner controller against a cluster.
    Controller(operators::cli::ControllerArgs),
    /// Run a DataVolume manifest without a cluster: a volume in a local pool, imported in-process.
    Apply(operators::cli::ApplyArgs),
    /// Show local DataVolumes (kubectl-style table, or -o yaml|json).
    Get(operators::cli::GetArgs),
    /// Write the Kubernetes manifests under deploy/ from the Rust types (or --check them).
    GenDeploy(operators::cli::GenDeployArgs),
    /// Serve CDI's upload token API (upload.cdi.kubevirt.io) as an aggregated API server.
    Apiserver(cdi::apiserver::ApiServerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tune_allocator();
    let success = |ok: bool| {
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    };
    match cli.command {
        Command::Import(args) => {
            init_logs("warn");
            let json = args.json;
            report(
                importer::cli::run(&args),
                json,
                importer::cli::Report::summary,
            )
        }
        Command::Csi(args) => {
            init_logs("info");
            serve(csi::run(args))
        }
        Command::PoolMount(args) => {
            init_logs("info");
            serve(csi::mounter::run(args))
        }
        Command::Launch(args) => {
            init_logs("warn");
            done(launcher::cli::run_launch(&args))
        }
        Command::Vmctl(args) => {
            init_logs("warn");
            done(launcher::cli::run_vmctl(args))
        }
        Command::UploadServer(args) => {
            init_logs("info");
            done(uploader::cli::run_server(args))
        }
        Command::UploadProxy(args) => {
            init_logs("info");
            done(uploader::cli::run_proxy(args))
        }
        Command::UploadToken(args) => {
            init_logs("warn");
            done(uploader::cli::run_token(args))
        }
        Command::Upload(args) => {
            init_logs("warn");
            let json = args.json;
            report(
                uploader::cli::run_upload(args),
                json,
                uploader::client::UploadReport::summary,
            )
        }
        Command::CloneSource(args) => {
            init_logs("info");
            let json = args.json;
            report(
                uploader::cli::run_clone_source(args),
                json,
                uploader::clone::source::CloneReport::summary,
            )
        }
        Command::ResizeDisk(args) => {
            init_logs("warn");
            let json = args.json;
            report(
                uploader::cli::run_resize_disk(args),
                json,
                importer::resize::ResizeReport::summary,
            )
        }
        Command::Controller(args) => {
            init_logs("info");
            serve(operators::cli::controller(args))
        }
        Command::Apply(args) => {
            init_logs("warn");
            exit(operators::cli::apply(&args).map(success), false)
        }
        Command::Get(args) => {
            init_logs("warn");
            let result = operators::cli::get(&args).map(|text| {
                print!("{text}");
                ExitCode::SUCCESS
            });
            exit(result, false)
        }
        Command::Apiserver(args) => {
            init_logs("info");
            serve(cdi::apiserver::run(args))
        }
        Command::GenDeploy(args) => {
            init_logs("warn");
            exit(operators::cli::gen_deploy(&args).map(success), false)
        }
    }
}

/// Runs a long-lived service on a multi-threaded runtime until it ends.
fn serve<E: exit::CommandError>(
    service: impl std::future::Future<Output = Result<(), E>>,
) -> ExitCode {
    match tokio::runtime::Runtime::new() {
        Ok(rt) => done(rt.block_on(service)),
        Err(err) => done(Err::<(), _>(err)),
    }
}

/// glibc malloc tuning for streaming. Network buffers (hyper's reads, a few hundred KiB each) are
/// freed on another thread than the one that allocated them; with glibc's defaults each one is a
/// fresh mmap or trimmed heap memory, so every byte received is first page-faulted and zeroed by
/// the kernel: that was a third of the upload server's CPU and half an HTTP raw import's system
/// time. Buffers under 4 MiB are therefore kept in the heap for reuse (up to 64 MiB of free heap
/// before it is trimmed); larger ones (liblzma's 24 MiB blocks) are still mapped and unmapped
/// whole, and two arenas at most keep the per-thread caches from multiplying peak RSS.
fn tune_allocator() {
    // SAFETY: mallopt only changes allocator tuning; it is called before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Logs to stderr, filtered by `QUARRY_LOG` (or `RUST_LOG`), else at `default` level; coloured
/// only on a terminal and without `NO_COLOR` (a pod's log or a file gets plain text).
fn init_logs(default: &str) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("QUARRY_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .init();
}
