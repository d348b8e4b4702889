//! `quarry import`'s arguments, [`ImportArgs`]: the one typed form of an import request. The CLI
//! parses it from argv (options CDI's importer pod sets by environment read the same variables);
//! the DataVolume controller builds one for the importer pod and writes it back to argv with
//! [`ImportArgs::to_args`]; local mode builds one and imports [`ImportArgs::to_request`] in-process,
//! as the CLI does.
//!
//! Values the user writes as text with a grammar (checksums, headers, platforms) are kept as
//! written, checked when argv is parsed and converted by [`ImportArgs::to_request`]: the importer
//! pod passes some of them as `$(VAR)` references the kubelet expands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::BoolishValueParser;

use crate::archive::{ArchiveReport, extract};
use crate::checksum::Checksum;
use crate::error::{Error, Result};
use crate::format::ImageFormat;
use crate::import::{ImportReport, ImportRequest, import};
use crate::ova::DiskChoice;
use crate::progress::{Progress, ProgressBar, serve_metrics};
use crate::source::SourceSpec;
use crate::source::gcs::ServiceAccountKey;
use crate::source::registry::manifest::Platform;
use crate::source::s3::Credentials;

/// `--idle-timeout` when not given, in seconds.
pub const DEFAULT_IDLE_TIMEOUT: u64 = 60;
/// `--min-rate` when not given (`1Ki`), in bytes per second.
pub const DEFAULT_MIN_RATE: u64 = 1 << 10;
/// `--retries` when not given.
pub const DEFAULT_RETRIES: u32 = 5;
/// `--memory-budget` when not given (`32Mi`).
pub const DEFAULT_MEMORY_BUDGET: u64 = 32 << 20;

/// The exit codes, as `quarry import --help` lists them.
pub const EXIT_CODES: &str = "Exit codes: 0 success; terminal errors (retrying will not help): 10 invalid input, \
11 unsupported image, 12 corrupt image, 13 target too small, 14 checksum mismatch, 15 source refused \
(404/401/403, TLS); retryable errors: 20 source unavailable, 21 local I/O; 1 other failures; 2 usage.";

/// One import as `quarry import` takes it.
#[derive(clap::Args, Debug, Clone, PartialEq)]
#[command(after_help = EXIT_CODES)]
pub struct ImportArgs {
    /// A local path, `-` for standard input, an http:// or https:// URL, a containerDisk image
    /// `docker://HOST[:PORT]/NAME[:TAG|@DIGEST]`, an S3 object `s3://BUCKET/KEY`, or a GCS
    /// object `gs://BUCKET/OBJECT` (STORAGE_EMULATOR_HOST points it at an emulator).
    pub source: String,
    /// A file (a filesystem volume's disk.img) or a block device (/dev/...); with --archive, the
    /// directory (a filesystem volume) the archive is extracted into.
    pub target: PathBuf,
    /// SOURCE is a tar archive (optionally gzip/xz/zstd compressed): extract it into the
    /// directory TARGET instead of writing a disk image (CDI's `contentType: archive`).
    #[arg(long)]
    pub archive: bool,
    /// Requested volume size (bytes, or a quantity such as 10Gi); the image must fit it.
    #[arg(long, env = "IMPORTER_IMAGE_SIZE", value_parser = parse_size)]
    pub size: Option<u64>,
    /// Fraction of a filesystem volume reserved for the filesystem [default: 0.06 for files, 0 for block devices].
    #[arg(long, env = "FILESYSTEM_OVERHEAD")]
    pub filesystem_overhead: Option<f64>,
    /// Expected checksum of the source as downloaded: md5|sha1|sha256|sha512:HEX.
    #[arg(long, value_parser = checked(|s| s.parse::<Checksum>().map(drop)))]
    pub checksum: Option<String>,
    /// Allocate the whole target, as CDI's preallocation does.
    #[arg(long, env = "PREALLOCATION", value_parser = BoolishValueParser::new())]
    pub preallocate: bool,
    /// Block devices: do not zero unused ranges (the device is known to read zeroes).
    #[arg(long)]
    pub no_zero: bool,
    /// Force the image format (raw, qcow2, vmdk, vpc, vdi or vhdx) instead of detecting it.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<ImageFormat>,
    /// OVA sources: the disk to import, its number in the OVF descriptor's order (from 1) or
    /// its file name (ovf:href) or disk id [default: the descriptor's first disk].
    #[arg(long, value_name = "N|NAME", value_parser = checked(|s| s.parse::<DiskChoice>().map(drop)))]
    pub disk: Option<String>,
    /// Trust this CA certificate (PEM) for HTTPS; repeatable.
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_certs: Vec<PathBuf>,
    /// Do not verify the HTTPS server's certificate (registries: also fall back to plain HTTP).
    #[arg(long, env = "INSECURE_TLS", value_parser = BoolishValueParser::new())]
    pub insecure: bool,
    /// Extra HTTP request header, `Name: value`; repeatable.
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = checked(|s| parse_header(s).map(drop)))]
    pub headers: Vec<String>,
    /// HTTP basic-auth user, or the registry user for docker:// sources (the password comes from
    /// --password-file or --password-env).
    #[arg(long, env = "IMPORTER_ACCESS_KEY_ID")]
    pub user: Option<String>,
    /// File holding the basic-auth password.
    #[arg(long, value_name = "FILE", requires = "user")]
    pub password_file: Option<PathBuf>,
    /// Environment variable holding the basic-auth password.
    #[arg(
        long,
        value_name = "VAR",
        requires = "user",
        conflicts_with = "password_file"
    )]
    pub password_env: Option<String>,
    /// Registry: the platform an image index resolves to, OS/ARCH[/VARIANT] [default: linux/amd64;
    /// when given, a single-platform image must match it too].
    #[arg(long, value_parser = checked(|s| Platform::parse(s).map(drop)))]
    pub platform: Option<String>,
    /// Registry: a Docker config.json-style credentials file (a pull secret's .dockerconfigjson);
    /// the entry for the image's registry is used unless --user is given.
    #[arg(long, value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// S3: the service endpoint, http(s)://HOST[:PORT] [default: https://s3.REGION.amazonaws.com].
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// S3: the signing region [default: from an AWS endpoint, else us-east-1].
    #[arg(long)]
    pub region: Option<String>,
    /// S3: credentials as CDI's Secret holds them (accessKeyId, secretKey): a directory with one
    /// file per key, or a file of key=value lines [default: AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY from the environment, else unsigned requests]. Makes an http(s) URL
    /// an S3 source.
    #[arg(long, value_name = "PATH")]
    pub s3_credentials: Option<PathBuf>,
    /// Read an http(s)://HOST/BUCKET/KEY URL as an S3 object (CDI's S3 URL form), signed.
    #[arg(long)]
    pub s3: bool,
    /// GCS: a Google service-account key file (CDI's Secret key credentials.json), whose tokens
    /// authorise the requests [default: anonymous requests]. Makes an http(s) URL a GCS source.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["s3", "s3_credentials"])]
    pub gcs_credentials: Option<PathBuf>,
    /// Read an http(s)://HOST/BUCKET/OBJECT URL as a GCS object (CDI's GCS URL form).
    #[arg(long, conflicts_with_all = ["s3", "s3_credentials"])]
    pub gcs: bool,
    /// Seconds without response headers or a body byte after which an HTTP transfer attempt is
    /// abandoned (and resumed).
    #[arg(long, default_value_t = DEFAULT_IDLE_TIMEOUT)]
    pub idle_timeout: u64,
    /// Minimum HTTP body rate (bytes, or a quantity such as 1Ki, per second) over each
    /// --idle-timeout window; a slower transfer attempt is abandoned (and resumed). 0: no minimum.
    #[arg(long, value_parser = parse_size, default_value = "1Ki")]
    pub min_rate: u64,
    /// Retries (with resume) of a failing HTTP transfer.
    #[arg(long, default_value_t = DEFAULT_RETRIES)]
    pub retries: u32,
    /// Print a one-line JSON result (or error) on stdout.
    #[arg(long)]
    pub json: bool,
    /// Serve Prometheus metrics (kubevirt_cdi_import_progress_total) on this address.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// ownerUID label of the progress metric (CDI's importer reads OWNER_UID) [default: empty].
    #[arg(long, env = "OWNER_UID")]
    pub owner_uid: Option<String>,
    /// Memory (bytes or quantity) for out-of-order qcow2 or vhdx data before spilling beside the target.
    #[arg(long, value_parser = parse_size, default_value = "32Mi")]
    pub memory_budget: u64,
}

/// Why `quarry import`'s arguments make no request. Option clashes and password reads exit 1
/// without a kind (as usage-like failures); import errors keep their kind.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// Options that do not go together.
    #[error("{0}")]
    Options(&'static str),
    #[error("reading the password file {}", path.display())]
    PasswordFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the password from ${var}")]
    PasswordEnv {
        var: String,
        #[source]
        source: std::env::VarError,
    },
    #[error(transparent)]
    Import(#[from] Error),
}

fn parse_size(s: &str) -> Result<u64> {
    crate::size::parse_quantity(s)
}

fn parse_format(s: &str) -> Result<ImageFormat, String> {
    match s {
        "raw" => Ok(ImageFormat::Raw),
        "qcow2" => Ok(ImageFormat::Qcow2),
        "vpc" | "vhd" => Ok(ImageFormat::Vpc),
        "vdi" => Ok(ImageFormat::Vdi),
        "vhdx" => Ok(ImageFormat::Vhdx),
        "vmdk" => Ok(ImageFormat::Vmdk),
        other => Err(format!(
            "format {other:?} is not one of raw, qcow2, vmdk, vpc (vhd), vdi, vhdx"
        )),
    }
}

/// A value parser that keeps the text as written once `check` accepts it.
fn checked(check: fn(&str) -> Result<()>) -> impl Fn(&str) -> Result<String> + Clone {
    move |s| check(s).map(|()| s.to_string())
}

/// Splits an HTTP header line `Name: value` (CDI's `extraHeaders` form), both sides trimmed.
pub fn parse_header(line: &str) -> Result<(String, String)> {
    let (name, value) = line.split_once(':').ok_or_else(|| {
        Error::InvalidInput(format!("header {line:?} is not of the form 'Name: value'"))
    })?;
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(Error::InvalidInput(format!(
            "header name in {line:?} is empty or has spaces"
        )));
    }
    Ok((name.to_string(), value.trim().to_string()))
}

impl ImportArgs {
    /// An import of `source` into `target` with every option at its default (as if parsed from
    /// `quarry import SOURCE TARGET` without environment).
    pub fn new(source: impl Into<String>, target: impl Into<PathBuf>) -> Self {
        ImportArgs {
            source: source.into(),
            target: target.into(),
            archive: false,
            size: None,
            filesystem_overhead: None,
            checksum: None,
            preallocate: false,
            no_zero: false,
            format: None,
            disk: None,
            ca_certs: Vec::new(),
            insecure: false,
            headers: Vec::new(),
            user: None,
            password_file: None,
            password_env: None,
            platform: None,
            auth_file: None,
            endpoint: None,
            region: None,
            s3_credentials: None,
            s3: false,
            gcs_credentials: None,
            gcs: false,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            min_rate: DEFAULT_MIN_RATE,
            retries: DEFAULT_RETRIES,
            json: false,
            metrics_addr: None,
            owner_uid: None,
            memory_budget: DEFAULT_MEMORY_BUDGET,
        }
    }

    /// The arguments after `quarry import` that parse back to these, options at their default
    /// left out. A value starting with `-` is written `--option=VALUE`, and positionals starting
    /// with `-` (other than `-`, standard input) come last after `--`.
    pub fn to_args(&self) -> Vec<String> {
        let target = self.target.to_string_lossy().into_owned();
        let dashed = |s: &str| s.starts_with('-') && s != "-";
        let positionals_last = dashed(&self.source) || dashed(&target);
        let mut a = netkit::argv::Argv::new();
        if !positionals_last {
            a.positional(self.source.clone());
            a.positional(target.clone());
        }
        a.flag("archive", self.archive);
        a.opt("size", self.size);
        a.opt("filesystem-overhead", self.filesystem_overhead);
        a.opt("checksum", self.checksum.as_ref());
        a.paths("ca-cert", &self.ca_certs);
        a.paths("s3-credentials", &self.s3_credentials);
        a.opt("user", self.user.as_ref());
        a.paths("password-file", &self.password_file);
        a.opt("password-env", self.password_env.as_ref());
        a.flag("s3", self.s3);
        a.paths("gcs-credentials", &self.gcs_credentials);
        a.flag("gcs", self.gcs);
        for h in &self.headers {
            a.opt("header", Some(h));
        }
        a.opt("platform", self.platform.as_ref());
        a.flag("insecure", self.insecure);
        a.flag("preallocate", self.preallocate);
        a.flag("no-zero", self.no_zero);
        a.opt("format", self.format.map(ImageFormat::as_str));
        a.opt("disk", self.disk.as_ref());
        a.paths("auth-file", &self.auth_file);
        a.opt("endpoint", self.endpoint.as_ref());
        a.opt("region", self.region.as_ref());
        let changed = |value, default| Some(value).filter(|v| *v != default);
        a.opt(
            "idle-timeout",
            changed(self.idle_timeout, DEFAULT_IDLE_TIMEOUT),
        );
        a.opt("min-rate", changed(self.min_rate, DEFAULT_MIN_RATE));
        a.opt(
            "retries",
            changed(self.retries.into(), DEFAULT_RETRIES.into()),
        );
        a.opt(
            "memory-budget",
            changed(self.memory_budget, DEFAULT_MEMORY_BUDGET),
        );
        a.opt("metrics-addr", self.metrics_addr);
        a.opt("owner-uid", self.owner_uid.as_ref());
        a.flag("json", self.json);
        if positionals_last {
            a.positional("--");
            a.positional(self.source.clone());
            a.positional(target);
        }
        a.into_vec()
    }

    /// The import these arguments ask for: the source with its registry, S3 or GCS options, the
    /// password read, the text values parsed. An http(s) URL becomes an S3 source with `--s3` or
    /// `--s3-credentials`, a GCS source with `--gcs` or `--gcs-credentials`.
    pub fn to_request(&self) -> Result<ImportRequest, ArgsError> {
        let basic = self.basic_auth()?;
        let spec = self.source_spec(basic.clone())?;
        let mut req = ImportRequest::new(spec, &self.target);
        req.size = self.size;
        req.filesystem_overhead = self.filesystem_overhead;
        req.checksum = self.checksum.as_deref().map(str::parse).transpose()?;
        req.preallocate = self.preallocate;
        req.assume_zeroed = self.no_zero;
        req.format = self.format;
        req.disk = self.disk.as_deref().map(str::parse).transpose()?;
        req.memory_budget = usize::try_from(self.memory_budget).unwrap_or(usize::MAX);
        req.http.ca_certs = self.ca_certs.clone();
        req.http.insecure = self.insecure;
        req.http.headers = self
            .headers
            .iter()
            .map(|h| parse_header(h))
            .collect::<Result<_>>()?;
        req.http.idle_timeout = Duration::from_secs(self.idle_timeout);
        req.http.min_rate = self.min_rate;
        req.http.max_retries = self.retries;
        Ok(req.with_basic_auth(basic))
    }

    /// The source with the registry, S3 and GCS options filled in.
    fn source_spec(&self, basic: Option<(String, String)>) -> Result<SourceSpec, ArgsError> {
        let mut spec = SourceSpec::parse(&self.source)?;
        if let SourceSpec::Http(url) = &spec {
            let url = url.clone();
            if self.s3 || self.s3_credentials.is_some() {
                spec = SourceSpec::S3 {
                    url,
                    options: Default::default(),
                };
            } else if self.gcs || self.gcs_credentials.is_some() {
                spec = SourceSpec::Gcs {
                    url,
                    options: Default::default(),
                };
            }
        }
        if !matches!(spec, SourceSpec::Gcs { .. }) && (self.gcs || self.gcs_credentials.is_some()) {
            return Err(ArgsError::Options(
                "--gcs and --gcs-credentials apply to gs:// and http(s) sources only",
            ));
        }
        match &mut spec {
            SourceSpec::Registry { options, .. } => {
                options.platform = self.platform.as_deref().map(Platform::parse).transpose()?;
                options.auth_file = self.auth_file.clone();
            }
            SourceSpec::S3 { options, .. } => {
                if basic.is_some() {
                    return Err(ArgsError::Options(
                        "--user does not apply to S3 sources (use --s3-credentials or AWS_* variables)",
                    ));
                }
                options.endpoint = self.endpoint.clone();
                options.region = self.region.clone();
                options.credentials = match &self.s3_credentials {
                    Some(path) => Some(Credentials::from_file(path)?),
                    None => Credentials::from_env(),
                };
            }
            SourceSpec::Gcs { options, .. } => {
                if basic.is_some() {
                    return Err(ArgsError::Options(
                        "--user does not apply to GCS sources (use --gcs-credentials)",
                    ));
                }
                if self.s3
                    || self.s3_credentials.is_some()
                    || self.endpoint.is_some()
                    || self.region.is_some()
                {
                    return Err(ArgsError::Options(
                        "--s3, --s3-credentials, --endpoint and --region apply to S3 sources (gs:// takes STORAGE_EMULATOR_HOST)",
                    ));
                }
                options.credentials = self
                    .gcs_credentials
                    .as_deref()
                    .map(ServiceAccountKey::from_file)
                    .transpose()?;
            }
            _ => {
                if self.s3 || self.endpoint.is_some() || self.region.is_some() {
                    return Err(ArgsError::Options(
                        "--s3, --endpoint and --region apply to s3:// and http(s) sources only",
                    ));
                }
                if self.platform.is_some() || self.auth_file.is_some() {
                    return Err(ArgsError::Options(
                        "--platform and --auth-file apply to docker:// sources only",
                    ));
                }
            }
        }
        Ok(spec)
    }

    /// `--user` with its password (from --password-file or --password-env).
    fn basic_auth(&self) -> Result<Option<(String, String)>, ArgsError> {
        let Some(user) = self.user.clone() else {
            return Ok(None);
        };
        let password = match (&self.password_file, &self.password_env) {
            (Some(path), _) => std::fs::read_to_string(path)
                .map_err(|source| ArgsError::PasswordFile {
                    path: path.clone(),
                    source,
                })?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
            (None, Some(var)) => std::env::var(var).map_err(|source| ArgsError::PasswordEnv {
                var: var.clone(),
                source,
            })?,
            (None, None) => String::new(),
        };
        Ok(Some((user, password)))
    }
}

/// What `quarry import` did: an image imported, or an archive extracted.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum Report {
    Image(ImportReport),
    Archive(ArchiveReport),
}

impl Report {
    /// The one-line summary printed without `--json`.
    pub fn summary(&self) -> String {
        match self {
            Report::Image(r) => r.summary(),
            Report::Archive(r) => r.summary(),
        }
    }
}

/// `quarry import`: the import with a progress bar on a terminal, and Prometheus metrics when
/// `--metrics-addr` is given.
pub fn run(args: &ImportArgs) -> Result<Report, ArgsError> {
    if args.archive
        && (args.preallocate || args.no_zero || args.format.is_some() || args.disk.is_some())
    {
        return Err(ArgsError::Options(
            "--preallocate, --no-zero, --format and --disk apply to disk images, not to --archive",
        ));
    }
    let req = args.to_request()?;
    let progress = Arc::new(Progress::default());
    if let Some(addr) = args.metrics_addr {
        let owner_uid = args.owner_uid.clone().unwrap_or_default();
        let bound = serve_metrics(addr, owner_uid, progress.clone())?;
        tracing::info!(%bound, "serving metrics");
    }
    let bar = ProgressBar::start(progress.clone());
    let result = if args.archive {
        extract(&req, progress).map(Report::Archive)
    } else {
        import(&req, progress).map(Report::Image)
    };
    bar.finish();
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::{IpAddr, SocketAddr};

    use clap::Parser;
    use proptest::prelude::*;

    use super::*;

    #[derive(Parser, Debug)]
    #[command(name = "import")]
    struct Import {
        #[command(flatten)]
        args: ImportArgs,
    }

    fn parse(args: &[String]) -> Result<ImportArgs, clap::Error> {
        let argv = std::iter::once("import".to_string()).chain(args.iter().cloned());
        Import::try_parse_from(argv).map(|i| i.args)
    }

    /// What the kubelet does to a container's args: `$(VAR)` becomes the variable's value.
    fn expand(args: &[String], env: &BTreeMap<String, String>) -> Vec<String> {
        args.iter()
            .map(|a| {
                env.iter()
                    .fold(a.clone(), |a, (k, v)| a.replace(&format!("$({k})"), v))
            })
            .collect()
    }

    fn text() -> impl Strategy<Value = String> {
        "-?[A-Za-z0-9_./:@=-]{0,12}"
    }

    fn path() -> impl Strategy<Value = PathBuf> {
        "-?[A-Za-z0-9_./ -]{1,12}".prop_map(PathBuf::from)
    }

    fn checksum() -> impl Strategy<Value = String> {
        let alg = prop::sample::select(vec![
            ("md5", 16),
            ("SHA1", 20),
            ("sha256", 32),
            ("sha512", 64),
        ]);
        (alg, any::<bool>()).prop_flat_map(|((name, len), upper)| {
            prop::collection::vec(any::<u8>(), len).prop_map(move |digest| {
                let hex = hex::encode(digest);
                format!("{name}:{}", if upper { hex.to_uppercase() } else { hex })
            })
        })
    }

    /// A header line, or a reference to a secret one the kubelet expands.
    fn header() -> impl Strategy<Value = (String, Option<String>)> {
        let line =
            ("[A-Za-z][A-Za-z0-9-]{0,8}", "[ -~]{0,12}").prop_map(|(n, v)| format!("{n}: {v}"));
        prop_oneof![
            line.clone().prop_map(|l| (l, None)),
            line.prop_map(|l| (String::new(), Some(l))),
        ]
    }

    fn metrics_addr() -> impl Strategy<Value = SocketAddr> {
        (any::<IpAddr>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::new(ip, port))
    }

    /// Every option at an arbitrary (valid) value, with the environment its `$(VAR)` references
    /// read: `to_args` is what the pod writes, expanding is what the kubelet does.
    fn import_args() -> impl Strategy<Value = (ImportArgs, BTreeMap<String, String>)> {
        let source = prop_oneof![
            Just("-".to_string()),
            "https?://[a-z]{1,8}(:[0-9]{2,5})?/[a-z%0-9]{1,8}(\\.img)?",
            "docker://[a-z]{1,8}(:5000)?/[a-z]{1,8}(:v1|@sha256:[0-9a-f]{64})?",
            "s3://[a-z]{3,8}/[a-z/]{1,12}",
            "gs://[a-z]{3,8}/[a-z/]{1,12}",
            path().prop_map(|p| p.display().to_string()),
        ];
        let target = (source, path());
        let sizes = (
            prop::option::of(any::<u64>()),
            prop::option::of(-1e6..1e6f64),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u64>(),
        );
        let auth = (
            prop::option::of((prop::option::of(text()), any::<bool>())),
            0..3u8,
            path(),
            "[A-Z_]{1,10}",
            prop::option::of(path()),
        );
        let http = (
            prop::option::of(checksum()),
            prop::collection::vec(path(), 0..3),
            prop::collection::vec(header(), 0..4),
            any::<bool>(),
            prop::option::of("(linux|windows)/(amd64|arm64)(/v8)?"),
            prop::option::of(path()),
        );
        let s3 = (
            prop::option::of("https?://[a-z]{1,8}(:[0-9]{2,5})?"),
            prop::option::of(text()),
            any::<bool>(),
        );
        let gcs = (prop::option::of(path()), any::<bool>());
        let rest = (
            any::<[bool; 4]>(),
            prop::option::of(prop::sample::select(vec![
                ImageFormat::Raw,
                ImageFormat::Qcow2,
                ImageFormat::Vpc,
                ImageFormat::Vdi,
            ])),
            prop::option::of(metrics_addr()),
            prop::option::of(text()),
            prop::option::of("[1-9]|[a-z][a-z0-9.]{0,8}"),
        );
        (target, sizes, auth, http, s3, gcs, rest).prop_map(
            |((source, target), sizes, auth, http, s3, gcs, rest)| {
                let mut env = BTreeMap::new();
                let mut a = ImportArgs::new(source, target);
                (a.size, a.filesystem_overhead) = (sizes.0, sizes.1);
                (a.idle_timeout, a.min_rate, a.retries, a.memory_budget) =
                    (sizes.2, sizes.3, sizes.4, sizes.5);
                let (user, password, password_file, password_env, s3_credentials) = auth;
                if let Some((user, from_secret)) = user {
                    let user = user.unwrap_or_default();
                    a.user = Some(if from_secret {
                        env.insert("IMPORTER_ACCESS_KEY_ID".to_string(), user);
                        "$(IMPORTER_ACCESS_KEY_ID)".to_string()
                    } else {
                        user
                    });
                    match password {
                        1 => a.password_file = Some(password_file),
                        2 => a.password_env = Some(password_env),
                        _ => {}
                    }
                }
                a.s3_credentials = s3_credentials;
                let (checksum, ca_certs, headers, insecure, platform, auth_file) = http;
                (a.checksum, a.ca_certs, a.insecure) = (checksum, ca_certs, insecure);
                (a.platform, a.auth_file) = (platform, auth_file);
                for (line, secret) in headers {
                    a.headers.push(match secret {
                        None => line,
                        Some(secret) => {
                            let var = format!("IMPORTER_SECRET_HEADER_{}", env.len());
                            env.insert(var.clone(), secret);
                            format!("$({var})")
                        }
                    });
                }
                (a.endpoint, a.region, a.s3) = s3;
                // The GCS options conflict with the S3 ones (clap refuses them together).
                if !a.s3 && a.s3_credentials.is_none() {
                    (a.gcs_credentials, a.gcs) = gcs;
                }
                let ([preallocate, no_zero, json, archive], format, metrics_addr, owner_uid, disk) =
                    rest;
                (a.archive, a.disk) = (archive, disk);
                (a.preallocate, a.no_zero, a.json, a.format) = (preallocate, no_zero, json, format);
                (a.metrics_addr, a.owner_uid) = (metrics_addr, owner_uid);
                (a, env)
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// `to_args`, then the kubelet's expansion, then parsing gives the same arguments, and so
        /// the same request, for every option.
        #[test]
        fn to_args_parses_back_to_the_same_request((args, env) in import_args()) {
            let argv = expand(&args.to_args(), &env);
            let parsed = parse(&argv).map_err(|e| TestCaseError::fail(format!("{argv:?}: {e}")))?;
            let mut expected = args.clone();
            expected.user = expected.user.map(|u| expand(&[u], &env).remove(0));
            expected.headers = expand(&expected.headers, &env);
            prop_assert_eq!(&parsed, &expected, "{:?}", argv);
            let (a, b) = (parsed.to_request(), expected.to_request());
            prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
        }
    }

    #[test]
    fn the_defaults_are_clap_s_and_to_args_leaves_them_out() {
        let args = ImportArgs::new("https://h/d.img", "disk.img");
        assert_eq!(args.to_args(), ["https://h/d.img", "disk.img"]);
        assert_eq!(parse(&args.to_args()).unwrap(), args);
    }

    #[test]
    fn vhd_is_qemu_s_vpc() {
        assert_eq!(parse_format("vhd"), Ok(ImageFormat::Vpc));
        assert_eq!(parse_format("vpc"), Ok(ImageFormat::Vpc));
        assert_eq!(parse_format("vdi"), Ok(ImageFormat::Vdi));
        assert_eq!(parse_format("vhdx"), Ok(ImageFormat::Vhdx));
        assert!(parse_format("qed").is_err());
    }

    #[test]
    fn values_that_look_like_options_are_written_so_they_parse() {
        let mut args = ImportArgs::new("-", "-disk.img");
        args.user = Some("-alice".into());
        assert_eq!(args.to_args(), ["--user=-alice", "--", "-", "-disk.img"]);
    }

    #[test]
    fn the_request_has_every_option() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "s3cret\r\n").unwrap();
        let mut args = ImportArgs::new("docker://registry.local:5000/vm/disk:v1", "/dev/vdb");
        args.user = Some("alice".into());
        args.password_file = Some(password);
        args.platform = Some("linux/arm64".into());
        args.checksum = Some(format!("SHA256:{}", "AB".repeat(32)));
        args.headers = vec!["X-Token :  t1 ".into()];
        (args.size, args.retries, args.memory_budget) = (Some(1 << 30), 2, 1 << 20);
        let req = args.to_request().unwrap();
        let SourceSpec::Registry { options, .. } = &req.source else {
            panic!("{:?}", req.source)
        };
        assert_eq!(
            options.credentials,
            Some(("alice".to_string(), "s3cret".to_string()))
        );
        assert_eq!(options.platform.as_ref().unwrap().architecture, "arm64");
        assert_eq!(
            req.http.basic_auth, None,
            "registry credentials go to the registry"
        );
        assert_eq!(
            req.checksum.unwrap().to_string(),
            format!("sha256:{}", "ab".repeat(32))
        );
        assert_eq!(
            req.http.headers,
            [("X-Token".to_string(), "t1".to_string())]
        );
        assert_eq!(
            (req.size, req.http.max_retries, req.memory_budget),
            (Some(1 << 30), 2, 1 << 20)
        );
    }

    /// An http(s) URL is a GCS object with `--gcs` or a key file, read from the file; the key
    /// file goes with GCS sources only, and not with S3's options.
    #[test]
    fn gcs_sources_take_their_key_file() {
        let endpoint =
            testkit::gcs::TokenEndpoint::start(testkit::gcs::Grant::Verify { expires_in: 3600 });
        let dir = tempfile::tempdir().unwrap();
        let key = endpoint.write_key_file(dir.path());
        let mut args = ImportArgs::new("https://storage.cloud.google.com/b/disk.qcow2", "d.img");
        args.gcs_credentials = Some(key.clone());
        let req = args.to_request().unwrap();
        let SourceSpec::Gcs { url, options } = &req.source else {
            panic!("{:?}", req.source)
        };
        assert_eq!(url, "https://storage.cloud.google.com/b/disk.qcow2");
        let creds = options.credentials.as_ref().unwrap();
        assert_eq!(creds.client_email, testkit::gcs::CLIENT_EMAIL);
        assert_eq!(args.to_args()[2..], ["--gcs-credentials", arg(&key)]);

        let mut anonymous = ImportArgs::new("http://127.0.0.1:1/b/o", "d.img");
        anonymous.gcs = true;
        let req = anonymous.to_request().unwrap();
        assert!(
            matches!(&req.source, SourceSpec::Gcs { options, .. } if options.credentials.is_none())
        );

        let mut docker = ImportArgs::new("docker://r/i:1", "d.img");
        docker.gcs_credentials = Some(key.clone());
        assert!(matches!(docker.to_request(), Err(ArgsError::Options(_))));
        let both = ["gs://b/o", "d.img", "--gcs-credentials", "k", "--s3"];
        assert!(parse(&both.map(String::from)).is_err());
        let mut s3_options = ImportArgs::new("gs://b/o", "d.img");
        s3_options.s3 = true;
        assert!(matches!(
            s3_options.to_request(),
            Err(ArgsError::Options(_))
        ));
        std::fs::write(&key, "{}").unwrap();
        let e = args.to_request().unwrap_err();
        assert!(e.to_string().contains("client_email is missing"), "{e}");
    }

    fn arg(p: &std::path::Path) -> &str {
        p.to_str().unwrap()
    }

    #[test]
    fn a_header_needs_a_name_and_a_colon() {
        assert_eq!(
            parse_header(" X-A : b: c ").unwrap(),
            ("X-A".to_string(), "b: c".to_string())
        );
        for bad in ["no colon", ": v", "X Y: v"] {
            assert_eq!(
                parse_header(bad).unwrap_err().kind(),
                crate::ErrorKind::InvalidInput
            );
        }
        assert!(parse(&["-".into(), "t".into(), "--header".into(), "bad".into()]).is_err());
    }
}
