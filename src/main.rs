//! `quarry`: the command-line entry point. Thin clap dispatch into the workspace crates; errors
//! end the process through [`exit`] (one exit code and JSON form per error type). The only place
//! `anyhow` is used.

mod exit;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use importer::checksum::Checksum;
use importer::format::ImageFormat;
use importer::import::{ImportReport, ImportRequest, import};
use importer::progress::{Progress, ProgressBar, serve_metrics};
use importer::source::SourceSpec;

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
    /// Import a disk image (raw or qcow2, optionally gzip/xz/zstd compressed) into a volume.
    Import(Box<ImportArgs>),
    /// Serve the CSI hostpath driver (Identity, Controller, Node) on one socket.
    Csi(csi::CsiArgs),
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
    Apiserver(operators::apiserver::ApiServerArgs),
}

#[derive(clap::Args)]
#[command(after_help = EXIT_CODES)]
struct ImportArgs {
    /// A local path, `-` for standard input, an http:// or https:// URL, a containerDisk image
    /// `docker://HOST[:PORT]/NAME[:TAG|@DIGEST]`, or an S3 object `s3://BUCKET/KEY`.
    source: String,
    /// A file (a filesystem volume's disk.img) or a block device (/dev/...).
    target: PathBuf,
    /// Requested volume size (bytes, or a quantity such as 10Gi); the image must fit it.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Fraction of a filesystem volume reserved for the filesystem [default: 0.06 for files, 0 for block devices].
    #[arg(long)]
    filesystem_overhead: Option<f64>,
    /// Expected checksum of the source as downloaded: md5|sha1|sha256|sha512:HEX.
    #[arg(long, value_parser = parse_checksum)]
    checksum: Option<Checksum>,
    /// Allocate the whole target, as CDI's preallocation does.
    #[arg(long)]
    preallocate: bool,
    /// Block devices: do not zero unused ranges (the device is known to read zeroes).
    #[arg(long)]
    no_zero: bool,
    /// Force the image format instead of detecting it.
    #[arg(long, value_parser = parse_format)]
    format: Option<ImageFormat>,
    /// Trust this CA certificate (PEM) for HTTPS; repeatable.
    #[arg(long = "ca-cert", value_name = "FILE")]
    ca_certs: Vec<PathBuf>,
    /// Do not verify the HTTPS server's certificate (registries: also fall back to plain HTTP).
    #[arg(long)]
    insecure: bool,
    /// Extra HTTP request header, `Name: value`; repeatable.
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// HTTP basic-auth user, or the registry user for docker:// sources (the password comes from
    /// --password-file or --password-env).
    #[arg(long)]
    user: Option<String>,
    /// File holding the basic-auth password.
    #[arg(long, value_name = "FILE", requires = "user")]
    password_file: Option<PathBuf>,
    /// Environment variable holding the basic-auth password.
    #[arg(
        long,
        value_name = "VAR",
        requires = "user",
        conflicts_with = "password_file"
    )]
    password_env: Option<String>,
    /// Registry: the platform an image index resolves to, OS/ARCH[/VARIANT] [default: linux/amd64;
    /// when given, a single-platform image must match it too].
    #[arg(long, value_parser = parse_platform)]
    platform: Option<importer::source::registry::manifest::Platform>,
    /// Registry: a Docker config.json-style credentials file (a pull secret's .dockerconfigjson);
    /// the entry for the image's registry is used unless --user is given.
    #[arg(long, value_name = "FILE")]
    auth_file: Option<PathBuf>,
    /// S3: the service endpoint, http(s)://HOST[:PORT] [default: https://s3.REGION.amazonaws.com].
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// S3: the signing region [default: from an AWS endpoint, else us-east-1].
    #[arg(long)]
    region: Option<String>,
    /// S3: credentials as CDI's Secret holds them (accessKeyId, secretKey): a directory with one
    /// file per key, or a file of key=value lines [default: AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY from the environment, else unsigned requests]. Makes an http(s) URL
    /// an S3 source.
    #[arg(long, value_name = "PATH")]
    s3_credentials: Option<PathBuf>,
    /// Read an http(s)://HOST/BUCKET/KEY URL as an S3 object (CDI's S3 URL form), signed.
    #[arg(long)]
    s3: bool,
    /// Seconds without response headers or a body byte after which an HTTP transfer attempt is
    /// abandoned (and resumed).
    #[arg(long, default_value_t = 60)]
    idle_timeout: u64,
    /// Minimum HTTP body rate (bytes, or a quantity such as 1Ki, per second) over each
    /// --idle-timeout window; a slower transfer attempt is abandoned (and resumed). 0: no minimum.
    #[arg(long, value_parser = parse_size, default_value = "1Ki")]
    min_rate: u64,
    /// Retries (with resume) of a failing HTTP transfer.
    #[arg(long, default_value_t = 5)]
    retries: u32,
    /// Print a one-line JSON result (or error) on stdout.
    #[arg(long)]
    json: bool,
    /// Serve Prometheus metrics (kubevirt_cdi_import_progress_total) on this address.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// ownerUID label of the progress metric (CDI's importer reads OWNER_UID).
    #[arg(long, env = "OWNER_UID", default_value = "")]
    owner_uid: String,
    /// Memory (bytes or quantity) for out-of-order qcow2 data before spilling beside the target.
    #[arg(long, value_parser = parse_size, default_value = "32Mi")]
    memory_budget: u64,
}

const EXIT_CODES: &str = "Exit codes: 0 success; terminal errors (retrying will not help): 10 invalid input, \
11 unsupported image, 12 corrupt image, 13 target too small, 14 checksum mismatch, 15 source refused \
(404/401/403, TLS); retryable errors: 20 source unavailable, 21 local I/O; 1 other failures; 2 usage.";

fn parse_size(s: &str) -> Result<u64, String> {
    importer::size::parse_quantity(s).map_err(|e| e.to_string())
}

fn parse_checksum(s: &str) -> Result<Checksum, String> {
    s.parse().map_err(|e: importer::Error| e.to_string())
}

fn parse_format(s: &str) -> Result<ImageFormat, String> {
    match s {
        "raw" => Ok(ImageFormat::Raw),
        "qcow2" => Ok(ImageFormat::Qcow2),
        other => Err(format!("format {other:?} is not one of raw, qcow2")),
    }
}

fn parse_platform(s: &str) -> Result<importer::source::registry::manifest::Platform, String> {
    importer::source::registry::manifest::Platform::parse(s).map_err(|e| e.to_string())
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("header {s:?} is not of the form 'Name: value'"))?;
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!("header name in {s:?} is empty or has spaces"));
    }
    Ok((name.to_string(), value.trim().to_string()))
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
            report(import_command(*args), json, ImportReport::summary)
        }
        Command::Csi(args) => {
            init_logs("info");
            serve(csi::run(args))
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
            serve(operators::apiserver::run(args))
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

/// Fills the registry and S3 options of `spec` from the arguments; an http(s) URL becomes an S3
/// source with `--s3` or `--s3-credentials`.
fn source_spec(args: &ImportArgs, basic: Option<(String, String)>) -> anyhow::Result<SourceSpec> {
    let mut spec = SourceSpec::parse(&args.source)?;
    if let SourceSpec::Http(url) = &spec
        && (args.s3 || args.s3_credentials.is_some())
    {
        spec = SourceSpec::S3 {
            url: url.clone(),
            options: Default::default(),
        };
    }
    match &mut spec {
        SourceSpec::Registry { options, .. } => {
            options.platform = args.platform.clone();
            options.credentials = basic;
            options.auth_file = args.auth_file.clone();
        }
        SourceSpec::S3 { options, .. } => {
            if basic.is_some() {
                anyhow::bail!(
                    "--user does not apply to S3 sources (use --s3-credentials or AWS_* variables)"
                );
            }
            options.endpoint = args.endpoint.clone();
            options.region = args.region.clone();
            options.credentials = match &args.s3_credentials {
                Some(path) => Some(importer::source::s3::Credentials::from_file(path)?),
                None => importer::source::s3::Credentials::from_env(),
            };
        }
        _ => {
            if args.s3 || args.endpoint.is_some() || args.region.is_some() {
                anyhow::bail!(
                    "--s3, --endpoint and --region apply to s3:// and http(s) sources only"
                );
            }
            if args.platform.is_some() || args.auth_file.is_some() {
                anyhow::bail!("--platform and --auth-file apply to docker:// sources only");
            }
        }
    }
    Ok(spec)
}

fn import_command(args: ImportArgs) -> anyhow::Result<ImportReport> {
    let basic = basic_auth(&args)?;
    let spec = source_spec(&args, basic.clone())?;
    let mut req = ImportRequest::new(spec, &args.target);
    req.size = args.size;
    req.filesystem_overhead = args.filesystem_overhead;
    req.checksum = args.checksum;
    req.preallocate = args.preallocate;
    req.assume_zeroed = args.no_zero;
    req.format = args.format;
    req.memory_budget = usize::try_from(args.memory_budget).unwrap_or(usize::MAX);
    req.http.ca_certs = args.ca_certs;
    req.http.insecure = args.insecure;
    req.http.headers = args.headers;
    req.http.idle_timeout = Duration::from_secs(args.idle_timeout);
    req.http.min_rate = args.min_rate;
    req.http.max_retries = args.retries;
    if !matches!(req.source, SourceSpec::Registry { .. }) {
        req.http.basic_auth = basic;
    }

    let progress = Arc::new(Progress::default());
    if let Some(addr) = args.metrics_addr {
        let bound = serve_metrics(addr, args.owner_uid.clone(), progress.clone())?;
        tracing::info!(%bound, "serving metrics");
    }
    let bar = ProgressBar::start(progress.clone());
    let result = import(&req, progress);
    bar.finish();
    Ok(result?)
}

/// `--user` with its password (from --password-file or --password-env).
fn basic_auth(args: &ImportArgs) -> anyhow::Result<Option<(String, String)>> {
    let Some(user) = args.user.clone() else {
        return Ok(None);
    };
    let password = match (&args.password_file, &args.password_env) {
        (Some(file), _) => std::fs::read_to_string(file)
            .with_context(|| format!("reading the password file {}", file.display()))?
            .trim_end_matches(['\n', '\r'])
            .to_string(),
        (None, Some(var)) => {
            std::env::var(var).with_context(|| format!("reading the password from ${var}"))?
        }
        (None, None) => String::new(),
    };
    Ok(Some((user, password)))
}
