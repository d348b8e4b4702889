//! The uploader's subcommands: arguments (clap derive) and entry points, so `quarry`'s main only
//! dispatches.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::client::{Counters, UploadReport, UploadRequest};
use crate::error::{Error, Result};
use crate::{net, proxy, server};

/// `quarry upload-server`: receive one image into a volume, as CDI's upload server pod.
#[derive(clap::Args, Debug, Clone, PartialEq)]
#[command(
    after_help = "The server exits 0 after the first successful upload (as CDI's upload \
server pod), so a second upload meets a closed port; pass --keep-serving to keep answering \
(409 to any further upload)."
)]
pub struct ServerArgs {
    /// The volume's disk.img (or block device) the image is written to; with --archive, the
    /// volume's directory the uploaded tar is extracted into.
    #[arg(long)]
    pub target: PathBuf,
    /// The volume's content is an archive (CDI's `contentType: archive`): every upload is a tar
    /// (optionally gzip/xz/zstd compressed), extracted into the directory --target.
    #[arg(long)]
    pub archive: bool,
    /// Requested volume size (bytes or a quantity such as 10Gi); the image must fit it.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Fraction of a filesystem volume reserved for the filesystem [default: 0.06, 0 for block devices].
    #[arg(long)]
    pub filesystem_overhead: Option<f64>,
    /// Address to listen on, e.g. 0.0.0.0:8443.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Serve TLS with this certificate (PEM; with --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Accept only clients (the upload proxy) with a certificate signed by this CA (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// Allocate the whole target, as CDI's preallocation.
    #[arg(long)]
    pub preallocate: bool,
    /// How long an interrupted upload is held for a resume (e.g. 300s, 5m).
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub resume_window: Duration,
    /// A request body that delivers nothing for this long counts as interrupted.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub idle_timeout: Duration,
    /// Keep serving after a successful upload (answering 409). Without it the server exits 0
    /// once an upload succeeds, as CDI's upload server pod does, and a second upload meets a
    /// closed port.
    #[arg(long)]
    pub keep_serving: bool,
    #[command(flatten)]
    pub connections: ConnectionArgs,
}

/// Connection limits of a listener (see `uploader::limits`).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct ConnectionArgs {
    /// Close a new connection that has not delivered its first request's headers in this long.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub header_read_timeout: Duration,
    /// Close a connection left with no request in flight for this long after a request.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub keep_alive_timeout: Duration,
    /// Open connections at most; at the cap the longest-idle one is closed to make room.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
}

impl ConnectionArgs {
    pub fn limits(&self) -> crate::limits::Limits {
        crate::limits::Limits {
            header_read_timeout: self.header_read_timeout,
            keep_alive_timeout: self.keep_alive_timeout,
            max_connections: self.max_connections as usize,
        }
    }
}

/// `quarry upload-proxy`: check upload tokens and stream uploads to the PVC's upload server.
#[derive(clap::Args, Debug)]
pub struct ProxyArgs {
    /// The RSA public key (PEM) that verifies upload tokens.
    #[arg(long, value_name = "PEM")]
    pub public_key: PathBuf,
    /// Address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The upload server of a PVC; {pvc} and {namespace} come from the token.
    #[arg(long, default_value = proxy::DEFAULT_TEMPLATE)]
    pub upstream_template: String,
    /// A fixed upload server for one PVC, NAMESPACE/PVC=URL; repeatable. When given, only these
    /// PVCs are served (others get 503) and the template is not used.
    #[arg(long = "upstream", value_name = "NS/PVC=URL")]
    pub upstreams: Vec<String>,
    /// Serve TLS with this certificate (PEM; with --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Trust this CA (PEM) for the upload servers' certificates.
    #[arg(long, value_name = "PEM")]
    pub upstream_ca: Option<PathBuf>,
    /// How long a refused connection to an upload server is tried again before the answer is
    /// 503 (a server just started may not listen yet, or not be behind its Service yet).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub upstream_wait: Duration,
    /// Client certificate (PEM) presented to upload servers (mutual TLS; with --client-key).
    #[arg(long, value_name = "PEM", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    #[arg(long, value_name = "PEM", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    #[command(flatten)]
    pub connections: ConnectionArgs,
}

/// `quarry upload-token`: issue an upload token, or (`keygen`) make the signing key pair.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: Option<TokenCommand>,
    /// The PVC's namespace.
    #[arg(long, required = true)]
    pub namespace: Option<String>,
    /// The PVC's name.
    #[arg(long, required = true)]
    pub pvc: Option<String>,
    /// The RSA private key (PEM) that signs the token.
    #[arg(long, value_name = "PEM", required = true)]
    pub key: Option<PathBuf>,
    /// Lifetime of the token (CDI's is 5m).
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub ttl: Duration,
}

#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Generate the RSA key pair (3072 bits) that signs and verifies upload tokens.
    Keygen {
        /// Where to write the private key (PKCS#8 PEM, mode 0600).
        #[arg(long, value_name = "PEM")]
        private: PathBuf,
        /// Where to write the public key (SPKI PEM), for `upload-proxy --public-key`.
        #[arg(long, value_name = "PEM")]
        public: PathBuf,
    },
}

/// `quarry upload`: upload a local image through the upload proxy, resuming after drops.
#[derive(clap::Args, Debug)]
pub struct UploadArgs {
    /// The image file (any format and compression `quarry import` reads).
    pub file: PathBuf,
    /// The upload proxy's URL, e.g. https://cdi-uploadproxy.example:443.
    #[arg(long)]
    pub url: String,
    /// The upload token.
    #[arg(
        long,
        required_unless_present = "token_file",
        conflicts_with = "token_file"
    )]
    pub token: Option<String>,
    /// A file holding the upload token.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Do not verify the proxy's certificate.
    #[arg(long)]
    pub insecure: bool,
    /// Trust this CA (PEM) for the proxy's certificate; repeatable.
    #[arg(long = "ca-cert", value_name = "PEM")]
    pub ca_certs: Vec<PathBuf>,
    /// After a dropped connection, start over from byte 0 (as virtctl) instead of resuming.
    #[arg(long)]
    pub no_resume: bool,
    /// Attempts after a failure before giving up.
    #[arg(long, default_value_t = 5)]
    pub retries: u32,
    /// Checksum of the file, ALG:HEX (md5, sha1, sha256, sha512), verified by the server.
    #[arg(long)]
    pub checksum: Option<String>,
    /// Print a one-line JSON report on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `quarry clone-source`: stream a volume to a target upload server (CDI's cloner).
#[derive(clap::Args, Debug, Clone, PartialEq)]
#[command(
    after_help = "Without the flags, the environment CDI's cloner pod gets is read: \
UPLOAD_URL, SERVER_CA_CERT, CLIENT_CERT and CLIENT_KEY (the last three hold PEM text, not paths)."
)]
pub struct CloneSourceArgs {
    /// A filesystem volume's disk.img, or a block device.
    #[arg(long)]
    pub source: PathBuf,
    /// The target upload server's URL with its path, e.g. https://HOST:8443/v1beta1/upload
    /// [env: UPLOAD_URL].
    #[arg(long)]
    pub upload_url: Option<String>,
    /// filesystem-clone (a tar holding disk.img, holes not sent) or blockdevice-clone (raw bytes).
    #[arg(long, value_enum)]
    pub content_type: crate::clone::CloneKind,
    /// Trust this CA (PEM file) for the upload server's certificate [env: SERVER_CA_CERT, PEM text].
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM file) for the upload server's mutual TLS [env: CLIENT_CERT, PEM text].
    #[arg(long, value_name = "FILE", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// The client certificate's key (PEM file) [env: CLIENT_KEY, PEM text].
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// Attempts after the first when the connection fails or the server is busy.
    #[arg(long, default_value_t = 5)]
    pub retries: u32,
    /// First wait between attempts (doubles up to 30s).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub retry_backoff: Duration,
    /// Before the first attempt, wait up to this long for the upload server to answer (a pod
    /// started beside its server); 0s sends at once.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub server_wait: Duration,
    /// Serve Prometheus metrics (kubevirt_cdi_clone_progress_total, the share of the stream
    /// read) on this address.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// ownerUID label of the progress metric (CDI's cloner reads OWNER_UID) [default: empty].
    #[arg(long, env = "OWNER_UID")]
    pub owner_uid: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `quarry resize-disk`: grow a raw disk image after a clone into a larger volume.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct ResizeDiskArgs {
    /// The volume's disk.img (or block device, which is only checked).
    #[arg(long)]
    pub target: PathBuf,
    /// The volume's size (bytes or a quantity such as 10Gi).
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Fraction of a filesystem volume reserved for the filesystem [default: 0.06].
    #[arg(long)]
    pub filesystem_overhead: Option<f64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of a `quarry` subcommand, parsed as `quarry SUBCOMMAND ARGS` parses them (how
/// a test reads back the arguments a controller gave a pod).
pub fn parse_args<A: clap::Args>(args: &[String]) -> std::result::Result<A, clap::Error> {
    #[derive(clap::Parser)]
    struct Command<A: clap::Args> {
        #[command(flatten)]
        args: A,
    }
    let argv = std::iter::once("quarry".to_string()).chain(args.iter().cloned());
    <Command<A> as clap::Parser>::try_parse_from(argv).map(|c| c.args)
}

/// A duration as [`parse_duration`] reads it back.
fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

impl ServerArgs {
    /// Receive into `target` on `listen`, every other option at its default.
    pub fn new(target: impl Into<PathBuf>, listen: SocketAddr) -> Self {
        let target: PathBuf = target.into();
        let argv = [
            "--target".to_string(),
            target.display().to_string(),
            "--listen".into(),
            listen.to_string(),
        ];
        parse_args(&argv).expect("the required options parse")
    }

    /// The arguments after `quarry upload-server` that parse back to these (defaults left out).
    pub fn to_args(&self) -> Vec<String> {
        let default = ServerArgs::new(&self.target, self.listen);
        let changed = |a: Duration, b: Duration| (a != b).then(|| secs(a));
        let mut a = netkit::argv::Argv::new();
        a.paths("target", [&self.target]);
        a.flag("archive", self.archive);
        a.opt("size", self.size);
        a.opt("filesystem-overhead", self.filesystem_overhead);
        a.opt("listen", Some(self.listen));
        a.paths("tls-cert", &self.tls_cert);
        a.paths("tls-key", &self.tls_key);
        a.paths("client-ca", &self.client_ca);
        a.flag("preallocate", self.preallocate);
        a.opt(
            "resume-window",
            changed(self.resume_window, default.resume_window),
        );
        a.opt(
            "idle-timeout",
            changed(self.idle_timeout, default.idle_timeout),
        );
        a.flag("keep-serving", self.keep_serving);
        let (c, d) = (&self.connections, &default.connections);
        a.opt(
            "header-read-timeout",
            changed(c.header_read_timeout, d.header_read_timeout),
        );
        a.opt(
            "keep-alive-timeout",
            changed(c.keep_alive_timeout, d.keep_alive_timeout),
        );
        a.opt(
            "max-connections",
            (c.max_connections != d.max_connections).then_some(c.max_connections),
        );
        a.into_vec()
    }
}

impl CloneSourceArgs {
    /// Stream `source` as `content_type`, every other option at its default.
    pub fn new(source: impl Into<PathBuf>, content_type: crate::clone::CloneKind) -> Self {
        let source: PathBuf = source.into();
        let argv = [
            "--source".to_string(),
            source.display().to_string(),
            "--content-type".into(),
            content_type.as_str().into(),
        ];
        parse_args(&argv).expect("the required options parse")
    }

    /// The arguments after `quarry clone-source` that parse back to these (defaults left out).
    pub fn to_args(&self) -> Vec<String> {
        let default = CloneSourceArgs::new(&self.source, self.content_type);
        let mut a = netkit::argv::Argv::new();
        a.paths("source", [&self.source]);
        a.opt("upload-url", self.upload_url.as_ref());
        a.opt("content-type", Some(self.content_type.as_str()));
        a.paths("ca-file", &self.ca_file);
        a.paths("client-cert", &self.client_cert);
        a.paths("client-key", &self.client_key);
        a.opt(
            "retries",
            (self.retries != default.retries).then_some(self.retries),
        );
        a.opt(
            "retry-backoff",
            (self.retry_backoff != default.retry_backoff).then(|| secs(self.retry_backoff)),
        );
        a.opt(
            "server-wait",
            (self.server_wait != default.server_wait).then(|| secs(self.server_wait)),
        );
        a.opt("metrics-addr", self.metrics_addr);
        a.opt("owner-uid", self.owner_uid.as_ref());
        a.flag("json", self.json);
        a.into_vec()
    }
}

impl ResizeDiskArgs {
    /// The arguments after `quarry resize-disk` that parse back to these.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = netkit::argv::Argv::new();
        a.paths("target", [&self.target]);
        a.opt("size", Some(self.size));
        a.opt("filesystem-overhead", self.filesystem_overhead);
        a.flag("json", self.json);
        a.into_vec()
    }
}

fn parse_size(s: &str) -> std::result::Result<u64, String> {
    quantity::parse(s).map_err(|e| e.to_string())
}

/// `300`, `300s`, `5m`, `1h`.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("duration {s:?} is not N, Ns, Nm or Nh"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("duration {s:?} is not N, Ns, Nm or Nh")),
    };
    Ok(Duration::from_secs(secs))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new().map_err(|e| Error::io("starting the async runtime", e))
}

pub fn run_server(args: ServerArgs) -> Result<()> {
    if let Some(f) = args.filesystem_overhead
        && !(0.0..1.0).contains(&f)
    {
        return Err(Error::InvalidInput(format!(
            "--filesystem-overhead {f} is not a fraction in [0, 1)"
        )));
    }
    let tls = net::tls_files(args.tls_cert, args.tls_key, args.client_ca)?;
    let config = server::Config {
        target: args.target,
        size: args.size,
        filesystem_overhead: args.filesystem_overhead,
        preallocate: args.preallocate,
        archive: args.archive,
        resume_window: args.resume_window,
        idle_timeout: args.idle_timeout,
    };
    let limits = args.connections.limits();
    runtime()?.block_on(server::run(
        config,
        args.listen,
        tls,
        limits,
        args.keep_serving,
    ))
}

pub fn run_proxy(args: ProxyArgs) -> Result<()> {
    let public_key = token::load_public_key(&args.public_key)?;
    let upstreams = if args.upstreams.is_empty() {
        proxy::Upstreams::Template(args.upstream_template)
    } else {
        proxy::Upstreams::Static(
            args.upstreams
                .iter()
                .map(|r| proxy::Upstreams::parse_route(r))
                .collect::<Result<_>>()?,
        )
    };
    let identity = match (&args.client_cert, &args.client_key) {
        (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
        _ => None,
    };
    let client = crate::reload::ReloadingUpstream::new(args.upstream_ca.as_deref(), identity)?;
    let tls = net::tls_files(args.tls_cert, args.tls_key, None)?;
    let tls = tls.as_ref().map(net::server_config).transpose()?;
    let router = proxy::router(proxy::Proxy {
        public_key,
        upstreams,
        client,
        upstream_wait: args.upstream_wait,
    });
    runtime()?.block_on(async move {
        let listener = net::bind(args.listen).await?;
        tracing::info!(addr = %args.listen, "upload proxy listening");
        net::serve(
            listener,
            tls,
            router,
            args.connections.limits(),
            netkit::runtime::terminated(),
        )
        .await
    })
}

/// Issues a token (printed on stdout) or writes a key pair.
pub fn run_token(args: TokenArgs) -> Result<()> {
    if let Some(TokenCommand::Keygen { private, public }) = args.command {
        let (private_pem, public_pem) = token::generate()?;
        write_private(&private, &private_pem)?;
        std::fs::write(&public, public_pem)
            .map_err(|e| Error::io(format!("writing {}", public.display()), e))?;
        eprintln!(
            "wrote the private key to {} and the public key to {}",
            private.display(),
            public.display()
        );
        return Ok(());
    }
    let (Some(namespace), Some(pvc), Some(key)) = (args.namespace, args.pvc, args.key) else {
        return Err(Error::InvalidInput(
            "--namespace, --pvc and --key are required".into(),
        ));
    };
    let key = token::load_private_key(&key)?;
    let claims = token::Claims::upload(&namespace, &pvc, token::now(), args.ttl);
    println!("{}", token::sign(&claims, &key)?);
    Ok(())
}

fn write_private(path: &std::path::Path, pem: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    f.write_all(pem.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Uploads with a progress bar on a terminal; returns the report.
pub fn run_upload(args: UploadArgs) -> Result<UploadReport> {
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => t.trim().to_string(),
        (None, Some(f)) => String::from_utf8_lossy(&crate::error::read_file(f, "token file")?)
            .trim()
            .to_string(),
        (None, None) => {
            return Err(Error::InvalidInput(
                "--token or --token-file is required".into(),
            ));
        }
    };
    if let Some(sum) = &args.checksum {
        sum.parse::<importer::checksum::Checksum>()?;
    }
    let req = UploadRequest {
        file: args.file,
        url: args.url,
        token,
        ca_certs: args.ca_certs,
        insecure: args.insecure,
        resume: !args.no_resume,
        retries: args.retries,
        checksum: args.checksum,
    };
    let counters = Arc::new(Counters::default());
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .expect("valid template"),
    );
    let rt = runtime()?;
    let follow = {
        let (bar, c) = (bar.clone(), counters.clone());
        rt.spawn(async move {
            loop {
                bar.set_length(c.total.load(Ordering::Relaxed));
                bar.set_position(c.position.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let result = rt.block_on(crate::client::upload(&req, counters));
    follow.abort();
    bar.finish_and_clear();
    result
}

/// A PEM file given by flag, else the PEM text of CDI's environment variable `var`.
fn pem_input(file: Option<&std::path::Path>, var: &str, what: &str) -> Result<Option<Vec<u8>>> {
    match file {
        Some(path) => crate::error::read_file(path, what).map(Some),
        None => Ok(std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(String::into_bytes)),
    }
}

pub fn run_clone_source(args: CloneSourceArgs) -> Result<crate::clone::source::CloneReport> {
    let url = match args.upload_url {
        Some(url) => url,
        None => std::env::var("UPLOAD_URL").map_err(|_| {
            Error::InvalidInput("no --upload-url and no UPLOAD_URL in the environment".into())
        })?,
    };
    let ca_pem = pem_input(args.ca_file.as_deref(), "SERVER_CA_CERT", "server CA")?;
    let cert = pem_input(
        args.client_cert.as_deref(),
        "CLIENT_CERT",
        "client certificate",
    )?;
    let key = pem_input(args.client_key.as_deref(), "CLIENT_KEY", "client key")?;
    let identity_pem = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => {
            return Err(Error::InvalidInput(
                "a client certificate needs its key (CLIENT_CERT with CLIENT_KEY)".into(),
            ));
        }
    };
    let progress = match args.metrics_addr {
        Some(addr) => {
            let progress = std::sync::Arc::new(importer::progress::Progress::default());
            let owner_uid = args.owner_uid.clone().unwrap_or_default();
            let metric = importer::progress::ProgressMetric::Clone;
            let bound =
                importer::progress::serve_progress(addr, metric, owner_uid, progress.clone())?;
            tracing::info!(%bound, "serving clone progress metrics");
            Some(progress)
        }
        None => None,
    };
    let req = crate::clone::source::CloneSourceRequest {
        source: args.source,
        url,
        kind: args.content_type,
        ca_pem,
        identity_pem,
        retries: args.retries,
        backoff: args.retry_backoff,
        server_wait: args.server_wait,
        progress,
    };
    runtime()?.block_on(crate::clone::source::clone_source(&req))
}

/// `quarry resize-disk`; its errors are the importer's, with their exit codes.
pub fn run_resize_disk(args: ResizeDiskArgs) -> importer::Result<importer::resize::ResizeReport> {
    importer::resize::resize_disk(&args.target, args.size, args.filesystem_overhead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("45s").unwrap(), Duration::from_secs(45));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        for bad in ["", "m", "5d", "-1s", "1.5m"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn upload_server_arguments_parse_back() {
        let listen: SocketAddr = "0.0.0.0:8443".parse().unwrap();
        let plain = ServerArgs::new("/data/disk.img", listen);
        assert_eq!(
            plain.to_args(),
            ["--target", "/data/disk.img", "--listen", "0.0.0.0:8443"]
        );
        let mut all = plain.clone();
        all.archive = true;
        all.size = Some(10 << 30);
        all.filesystem_overhead = Some(0.055);
        all.tls_cert = Some("/tls/tls.crt".into());
        all.tls_key = Some("/tls/tls.key".into());
        all.client_ca = Some("/tls/ca.crt".into());
        all.preallocate = true;
        all.resume_window = Duration::from_secs(90);
        all.idle_timeout = Duration::from_secs(7);
        all.keep_serving = true;
        all.connections.header_read_timeout = Duration::from_secs(3);
        all.connections.keep_alive_timeout = Duration::from_secs(4);
        all.connections.max_connections = 5;
        for args in [plain, all] {
            assert_eq!(parse_args::<ServerArgs>(&args.to_args()).unwrap(), args);
        }
    }

    #[test]
    fn clone_source_arguments_parse_back() {
        let plain = CloneSourceArgs::new(
            "/dev/cdi-block-volume",
            crate::clone::CloneKind::Blockdevice,
        );
        let mut all = CloneSourceArgs::new("/data/disk.img", crate::clone::CloneKind::Filesystem);
        all.upload_url = Some("https://cdi-upload-t.ns.svc/v1beta1/upload".into());
        all.ca_file = Some("/tls/ca.crt".into());
        all.client_cert = Some("/tls/tls.crt".into());
        all.client_key = Some("/tls/tls.key".into());
        all.retries = 2;
        all.retry_backoff = Duration::from_secs(3);
        all.metrics_addr = Some("0.0.0.0:8443".parse().unwrap());
        all.owner_uid = Some("-uid-starting-with-a-dash".into());
        all.json = true;
        for args in [plain, all] {
            assert_eq!(
                parse_args::<CloneSourceArgs>(&args.to_args()).unwrap(),
                args
            );
        }
    }

    #[test]
    fn resize_disk_arguments_parse_back() {
        let mut args = ResizeDiskArgs {
            target: "/data/disk.img".into(),
            size: 5 << 30,
            filesystem_overhead: None,
            json: false,
        };
        assert_eq!(parse_args::<ResizeDiskArgs>(&args.to_args()).unwrap(), args);
        (args.filesystem_overhead, args.json) = (Some(0.1), true);
        assert_eq!(parse_args::<ResizeDiskArgs>(&args.to_args()).unwrap(), args);
    }
}
