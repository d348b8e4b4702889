//! Arguments and entry points of `quarry controller`, `quarry apply`, `quarry get` and `quarry
//! gen-deploy` (main.rs only dispatches here).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use cdi::local::datavolume::{self as local, ApplyOptions, Store};
use cdi::settings::Overrides;
use cdi::settings::{Config, LiveSettings, RetryPolicy, UploadTls};
use hco::hostpath::objects::Settings;
use kubekit::error::{Error, Result};
use kubekit::metrics::Metrics;

/// `quarry controller`.
#[derive(clap::Args, Debug)]
pub struct ControllerArgs {
    /// Which controller to run.
    #[command(subcommand)]
    pub which: Which,
    /// Serve Prometheus reconcile metrics on this address (`/metrics`).
    #[arg(long, global = true, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Reconcile only while holding the controller's Lease (`<component>-leader`), so that
    /// several replicas are safe; the identity is $POD_NAME (else the host name).
    #[arg(long, global = true)]
    pub leader_elect: bool,
    /// Namespace of the Lease [default: $POD_NAMESPACE, else `quarry`].
    #[arg(long, global = true)]
    pub leader_elect_namespace: Option<String>,
}

impl ControllerArgs {
    /// The component (Deployment, ServiceAccount and Lease name) of the chosen controller.
    pub fn component(&self) -> &'static str {
        use api::names::component;
        match self.which {
            Which::Datavolume(_) => component::DATAVOLUME_CONTROLLER,
            Which::Hyperconverged(_) => component::HYPERCONVERGED_CONTROLLER,
            Which::Hostpath(_) => component::HOSTPATH_CONTROLLER,
            Which::Certs(_) => component::CERT_CONTROLLER,
            Which::Datasource => component::DATASOURCE_CONTROLLER,
        }
    }

    /// The leader-election candidate, when asked for.
    fn elector(&self, client: &kube::Client) -> Option<kubekit::leader::Elector> {
        if !self.leader_elect {
            return None;
        }
        let namespace = self
            .leader_elect_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| api::names::NAMESPACE.into());
        let identity = std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("{}-{}", self.component(), std::process::id()));
        Some(kubekit::leader::Elector::new(
            client.clone(),
            &namespace,
            &api::names::lease(self.component()),
            &identity,
            kubekit::leader::Timing::default(),
        ))
    }
}

/// The controllers.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Which {
    /// DataVolumes (cdi.kubevirt.io/v1beta1): PVC, importer or upload pod, status.
    #[command(visible_alias = "dv")]
    Datavolume(DataVolumeArgs),
    /// The HyperConverged singleton (hco.kubevirt.io/v1beta1) and its validating webhook.
    #[command(visible_alias = "hco")]
    Hyperconverged(HyperConvergedArgs),
    /// HostPathProvisioners (hostpathprovisioner.kubevirt.io/v1beta1): the CSI driver objects.
    #[command(visible_alias = "hpp")]
    Hostpath(HostPathArgs),
    /// The install's TLS: signers, serving/client certificates, bundles, the upload token key,
    /// and the APIServices' and webhooks' caBundle, rotated by the CDI CR's certConfig.
    Certs(CertsArgs),
    /// DataSources (cdi.kubevirt.io/v1beta1): the Ready condition follows the source.
    #[command(visible_alias = "das")]
    Datasource,
}

/// `quarry controller certs`.
#[derive(clap::Args, Debug, Clone)]
pub struct CertsArgs {
    /// Namespace of the Secrets and bundle ConfigMaps (the install's).
    #[arg(long, default_value = api::names::NAMESPACE)]
    pub namespace: String,
    /// Look again at least this often, in seconds (a changed certConfig, a deleted Secret).
    #[arg(long, default_value_t = 300)]
    pub resync: u64,
}

/// `quarry controller datavolume`.
#[derive(clap::Args, Debug, Clone)]
pub struct DataVolumeArgs {
    /// Image with the quarry binary, for importer and upload pods [default: the image of this
    /// controller's own pod ($POD_NAME), else quay.io/quarry/quarry:latest].
    #[arg(long)]
    pub image: Option<String>,
    /// Pull policy of that image.
    #[arg(long)]
    pub pull_policy: Option<String>,
    /// Global filesystem overhead [default: the CDI CR's, else 0.055]. The flags below that
    /// CDI's CR also sets win over the CR when given.
    #[arg(long)]
    pub filesystem_overhead: Option<f64>,
    /// Per-StorageClass overhead, CLASS=FRACTION; repeatable.
    #[arg(long = "storage-class-overhead", value_name = "CLASS=F", value_parser = parse_class_overhead)]
    pub class_overhead: Vec<(String, f64)>,
    /// Registry reached without TLS verification (HOST[:PORT]); repeatable.
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// Retries of a retryable import failure before the DataVolume fails.
    #[arg(long, default_value_t = RetryPolicy::default().max_restarts)]
    pub max_restarts: u32,
    /// First retry delay in seconds (doubled for each further one).
    #[arg(long, default_value_t = RetryPolicy::default().base_delay.as_secs())]
    pub retry_delay: u64,
    /// Longest retry delay in seconds.
    #[arg(long, default_value_t = RetryPolicy::default().max_delay.as_secs())]
    pub retry_max_delay: u64,
    /// Let the importer pod bind WaitForFirstConsumer PVCs instead of waiting for a consumer
    /// [default: the CDI CR's HonorWaitForFirstConsumer gate, else waiting].
    #[arg(long)]
    pub no_honor_wait_for_first_consumer: bool,
    /// Secret (tls.crt, tls.key) for upload servers; without it they listen in plain HTTP.
    #[arg(long)]
    pub upload_tls_secret: Option<String>,
    /// ConfigMap with the upload proxy's client CA as ca.crt.
    #[arg(long, requires = "upload_tls_secret")]
    pub upload_client_ca_configmap: Option<String>,
    /// Issue each upload server a certificate from the cert controller's upload server signer
    /// in this namespace (the install's), as CDI does, and require the proxy's client
    /// certificate.
    #[arg(long, value_name = "NAMESPACE", conflicts_with = "upload_tls_secret")]
    pub upload_tls_signer_namespace: Option<String>,
    /// The upload token key's public half (PEM): it checks the clone tokens the DataVolume
    /// webhook signs; without it, clones from another namespace are refused.
    #[arg(long, value_name = "PEM")]
    pub clone_token_public_key: Option<PathBuf>,
}

/// `quarry controller hyperconverged`.
#[derive(clap::Args, Debug, Clone)]
pub struct HyperConvergedArgs {
    /// Namespace of the HyperConverged (HCO's default).
    #[arg(long, default_value = "kubevirt-hyperconverged")]
    pub namespace: String,
    /// Serve the validating webhook (AdmissionReview) on this address.
    #[arg(long)]
    pub webhook_addr: Option<SocketAddr>,
    /// Webhook server certificate (PEM); with --webhook-tls-key the webhook speaks HTTPS, as the
    /// API server requires (plain HTTP without).
    #[arg(long, requires_all = ["webhook_addr", "webhook_tls_key"])]
    pub webhook_tls_cert: Option<PathBuf>,
    /// Webhook server key (PEM).
    #[arg(long, requires = "webhook_tls_cert")]
    pub webhook_tls_key: Option<PathBuf>,
}

/// `quarry controller hostpath`.
#[derive(clap::Args, Debug, Clone)]
pub struct HostPathArgs {
    /// Namespace of the driver's DaemonSet.
    #[arg(long, default_value = "quarry")]
    pub namespace: String,
    /// Image with the quarry binary [default: the image of this controller's own pod
    /// ($POD_NAME), else quay.io/quarry/quarry:latest].
    #[arg(long)]
    pub image: Option<String>,
    /// The pool of the HostPathProvisioner made at start when there is none (NAME=PATH), so
    /// that the bundle alone gives a working driver; empty: make none.
    #[arg(long, default_value = bundle::DEFAULT_POOL, value_parser = parse_default_pool)]
    pub default_pool: DefaultPool,
    /// node-driver-registrar image.
    #[arg(long, default_value_t = Settings::default().registrar_image)]
    pub registrar_image: String,
    /// csi-provisioner image.
    #[arg(long, default_value_t = Settings::default().provisioner_image)]
    pub provisioner_image: String,
    /// csi-snapshotter image.
    #[arg(long, default_value_t = Settings::default().snapshotter_image)]
    pub snapshotter_image: String,
    /// csi-resizer image.
    #[arg(long, default_value_t = Settings::default().resizer_image)]
    pub resizer_image: String,
}

/// `--default-pool`: a pool's name and path, or none.
#[derive(Clone, Debug)]
pub struct DefaultPool(pub Option<(String, String)>);

/// `NAME=PATH`, or none for an empty value.
fn parse_default_pool(s: &str) -> std::result::Result<DefaultPool, String> {
    if s.is_empty() {
        return Ok(DefaultPool(None));
    }
    s.split_once('=')
        .map(|(n, p)| DefaultPool(Some((n.to_string(), p.to_string()))))
        .ok_or_else(|| format!("{s:?} is not NAME=PATH"))
}

fn parse_class_overhead(s: &str) -> std::result::Result<(String, f64), String> {
    let (class, f) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not CLASS=FRACTION"))?;
    let f: f64 = f.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !(0.0..1.0).contains(&f) {
        return Err(format!("{s:?}: the overhead must be in [0, 1)"));
    }
    Ok((class.to_string(), f))
}

impl DataVolumeArgs {
    /// The controller configuration.
    pub fn config(&self) -> Config {
        Config {
            image: self
                .image
                .clone()
                .unwrap_or_else(|| api::names::DEFAULT_IMAGE.into()),
            pull_policy: self.pull_policy.clone(),
            filesystem_overhead: self
                .filesystem_overhead
                .unwrap_or(cdi::settings::DEFAULT_FILESYSTEM_OVERHEAD),
            filesystem_overhead_per_class: self.class_overhead.iter().cloned().collect(),
            default_storage_class: None,
            insecure_registries: self.insecure_registries.clone(),
            resources: None,
            retry: RetryPolicy {
                base_delay: Duration::from_secs(self.retry_delay),
                max_delay: Duration::from_secs(self.retry_max_delay),
                max_restarts: self.max_restarts,
            },
            honor_wait_for_first_consumer: !self.no_honor_wait_for_first_consumer,
            upload_tls: match (&self.upload_tls_secret, &self.upload_tls_signer_namespace) {
                (Some(secret), _) => Some(UploadTls::Shared {
                    secret: secret.clone(),
                    client_ca_config_map: self.upload_client_ca_configmap.clone(),
                }),
                (None, Some(namespace)) => Some(UploadTls::Issued {
                    namespace: namespace.clone(),
                }),
                (None, None) => None,
            },
            ..Config::default()
        }
    }

    /// The settings given explicitly, which win over the CDI CR.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            filesystem_overhead: self.filesystem_overhead,
            class_overhead: self.class_overhead.iter().cloned().collect(),
            insecure_registries: (!self.insecure_registries.is_empty())
                .then(|| self.insecure_registries.clone()),
            honor_wait_for_first_consumer: self.no_honor_wait_for_first_consumer.then_some(false),
        }
    }
}

/// Runs a controller against the cluster of the kubeconfig (or the pod's service account).
pub async fn controller(args: ControllerArgs) -> Result<()> {
    let controller = match &args.which {
        Which::Datavolume(_) => cdi::datavolume::controller::CONTROLLER,
        Which::Hyperconverged(_) => hco::hyperconverged::controller::CONTROLLER,
        Which::Hostpath(_) => hco::hostpath::controller::CONTROLLER,
        Which::Certs(_) => certs::CONTROLLER,
        Which::Datasource => cdi::golden::controller::CONTROLLER,
    };
    let client = kubekit::kubeops::cluster_client(controller).await?;
    let metrics = Arc::new(Metrics::default());
    let bound = kubekit::metrics::serve(args.metrics_addr, metrics.clone()).await?;
    tracing::info!(%bound, "serving metrics");
    // Every replica serves the webhook (its Service reaches any of them); only the leader
    // reconciles.
    if let Which::Hyperconverged(a) = &args.which
        && let Some(addr) = a.webhook_addr
    {
        let tls = a.webhook_tls_cert.clone().zip(a.webhook_tls_key.clone());
        let settings = hco::hyperconverged::webhook::Settings {
            namespace: Some(a.namespace.clone()),
            client: Some(client.clone()),
        };
        let bound = hco::hyperconverged::webhook::serve(addr, tls, settings).await?;
        tracing::info!(%bound, "serving the HyperConverged webhook");
    }
    let elector = args.elector(&client);
    // SIGTERM ends the work at once (reconciles are level-driven and idempotent): kube-runtime's
    // graceful shutdown can wait forever (while a watch of a missing CRD is not ready), and a
    // leader must get to release its Lease before the kubelet's SIGKILL.
    let work = || run_controller(args.which.clone(), client.clone(), metrics.clone());
    match elector {
        Some(elector) => elector.lead_on(work, netkit::runtime::terminated()).await,
        None => tokio::select! {
            r = work() => r,
            () = netkit::runtime::terminated() => Ok(()),
        },
    }
}

/// The image of this process's own pod ($POD_NAMESPACE/$POD_NAME, from the downward API), so
/// that the pods a controller makes run the image it runs: the bundle's one image setting
/// (kustomize `images:`) then reaches them too. None outside a pod.
async fn own_image(client: &kube::Client) -> Option<String> {
    let (name, ns) = (
        std::env::var("POD_NAME").ok()?,
        std::env::var("POD_NAMESPACE").ok()?,
    );
    kubekit::kubeops::pod_image(client, &ns, &name).await
}

/// Runs the chosen controller until the process is stopped.
async fn run_controller(which: Which, client: kube::Client, metrics: Arc<Metrics>) -> Result<()> {
    match which {
        Which::Datavolume(mut a) => {
            if a.image.is_none() {
                a.image = own_image(&client).await;
            }
            let (mut config, overrides) = (a.config(), a.overrides());
            if let Some(path) = &a.clone_token_public_key {
                let key = token::load_public_key(path)
                    .map_err(|e| kubekit::Error::Config(netkit::error::chain(&e)))?;
                config.clone_token_key = Some(key);
            }
            let live = Arc::new(LiveSettings::new(config, overrides));
            let ctx = cdi::datavolume::controller::Context::with_settings(client, live, metrics);
            crate::process::cdi(Arc::new(ctx), None).await
        }
        Which::Hyperconverged(a) => {
            hco::hyperconverged::controller::run(client, a.namespace, metrics).await
        }
        Which::Hostpath(a) => {
            let image = match a.image {
                Some(i) => Some(i),
                None => own_image(&client).await,
            };
            let settings = Settings {
                namespace: a.namespace,
                image: image.unwrap_or_else(|| api::names::DEFAULT_IMAGE.into()),
                registrar_image: a.registrar_image,
                provisioner_image: a.provisioner_image,
                snapshotter_image: a.snapshotter_image,
                resizer_image: a.resizer_image,
            };
            if let Some(pool) = a.default_pool.0 {
                hco::hostpath::controller::ensure_one(&client, pool).await?;
            }
            hco::hostpath::controller::run(client, settings, metrics).await
        }
        Which::Certs(a) => {
            certs::run(client, a.namespace, Duration::from_secs(a.resync)).await?;
        }
        Which::Datasource => cdi::golden::controller::run(client, metrics, None).await,
    }
    Ok(())
}

/// `quarry apply -f dv.yaml`.
#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    /// The DataVolume manifest (YAML or JSON, as written for CDI).
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// Pool directory the volume is created in.
    #[arg(long)]
    pub pool: PathBuf,
    /// Where DataVolume statuses are kept [default: $QUARRY_STATE_DIR or /var/lib/quarry].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Secrets and ConfigMaps the source references, as DIR/NAME/KEY files.
    #[arg(long)]
    pub secrets_dir: Option<PathBuf>,
    /// Retries of a retryable failure before the DataVolume fails.
    #[arg(long, default_value_t = 3)]
    pub max_restarts: u32,
    /// First retry delay in seconds (doubled for each further one, at most 60).
    #[arg(long, default_value_t = 2)]
    pub retry_delay: u64,
    /// A registry (HOST[:PORT]) reached over plain HTTP or without verifying TLS; repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registries: Vec<String>,
}

impl ApplyArgs {
    /// The local-mode options.
    pub fn options(&self) -> ApplyOptions {
        ApplyOptions {
            pool: self.pool.clone(),
            state_dir: self
                .state_dir
                .clone()
                .unwrap_or_else(local::default_state_dir),
            secrets_dir: self.secrets_dir.clone(),
            retry: RetryPolicy {
                base_delay: Duration::from_secs(self.retry_delay),
                max_delay: Duration::from_secs(60),
                max_restarts: self.max_restarts,
            },
            insecure_registries: self.insecure_registries.clone(),
        }
    }

    /// Reads the manifest.
    pub fn manifest(&self) -> Result<api::DataVolume> {
        let text = std::fs::read_to_string(&self.file)
            .map_err(|e| Error::io(format!("reading {}", self.file.display()), e))?;
        local::parse(&text, &self.file.display().to_string())
    }
}

/// `quarry apply`: runs the DataVolume with a terminal progress bar and prints its final phase
/// (and, when it failed, its Ready condition's reason and message) on stderr. True when it
/// succeeded.
pub fn apply(args: &ApplyArgs) -> Result<bool> {
    match manifest_kind(&args.file)?.as_deref() {
        Some("DataImportCron") => return apply_cron(args),
        Some("DataSource") => {
            return cdi::local::datasource::apply_manifest(&args.file, &args.options());
        }
        Some("StorageProfile") => return Err(storage_profile_refused(&args.file)),
        _ => {}
    }
    let dv = args.manifest()?;
    let progress = Arc::new(importer::progress::Progress::default());
    let bar = importer::progress::ProgressBar::start(progress.clone());
    let result = local::apply(dv, &args.options(), progress);
    bar.finish();
    let dv = result?;
    let status = dv.status.clone().unwrap_or_default();
    let phase = status.phase.map(|p| p.as_str()).unwrap_or("Unknown");
    let name = dv.metadata.name.as_deref().unwrap_or_default();
    if status.phase == Some(api::Phase::Succeeded) {
        eprintln!("datavolume/{name} {phase}");
        return Ok(true);
    }
    let why = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| api::reason_and_message(c.reason.as_deref(), c.message.as_deref()))
        .unwrap_or_default();
    eprintln!("datavolume/{name} {phase}: {why}");
    Ok(false)
}

/// Local mode keeps no StorageProfiles (they describe a cluster's StorageClasses): the error
/// saying so, and, for a profile asking for the snapshot format, that local mode keeps every
/// DataImportCron import as a pool volume.
fn storage_profile_refused(file: &std::path::Path) -> Error {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let v: serde_json::Value = serde_saphyr::from_str(&text).unwrap_or_default();
    let what = file.display();
    if v["spec"]["dataImportCronSourceFormat"] == "snapshot" {
        Error::invalid(format!(
            "{what}: local mode keeps no StorageProfiles, and keeps every DataImportCron import \
             as a pool volume (the pvc format): dataImportCronSourceFormat: snapshot needs a \
             cluster (quarry controller datavolume)"
        ))
    } else {
        Error::invalid(format!(
            "{what}: local mode keeps no StorageProfiles (they describe a cluster's StorageClasses)"
        ))
    }
}

/// The `kind` a manifest file names, if it can be read.
fn manifest_kind(file: &std::path::Path) -> Result<Option<String>> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
    let v: serde_json::Value = serde_saphyr::from_str(&text).unwrap_or_default();
    Ok(v["kind"].as_str().map(str::to_string))
}

/// `quarry apply -f cron.yaml`: one poll-and-import cycle of a DataImportCron; prints what it
/// did on stderr. True when the cron is up to date.
fn apply_cron(args: &ApplyArgs) -> Result<bool> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| Error::io(format!("reading {}", args.file.display()), e))?;
    let cron = cdi::local::cron::parse(&text, &args.file.display().to_string())?;
    let progress = Arc::new(importer::progress::Progress::default());
    let bar = importer::progress::ProgressBar::start(progress.clone());
    let result = cdi::local::cron::apply(cron, &args.options(), progress);
    bar.finish();
    let report = result?;
    let name = report.cron.metadata.name.clone().unwrap_or_default();
    match &report.imported {
        Some(dv) => {
            let phase = dv
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .map(|p| p.as_str())
                .unwrap_or("Unknown");
            eprintln!(
                "dataimportcron/{name}: version {} imported into datavolume/{} {phase}",
                report.digest,
                dv.metadata.name.as_deref().unwrap_or_default()
            );
        }
        None => eprintln!("dataimportcron/{name}: version {} unchanged", report.digest),
    }
    for d in &report.deleted {
        eprintln!("datavolume/{d} deleted (beyond importsToKeep)");
    }
    let up_to_date = report.cron.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == api::golden::condition::UP_TO_DATE && c.status == "True")
    });
    Ok(up_to_date)
}

/// Output formats of `quarry get`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The objects as YAML.
    Yaml,
    /// The objects as JSON.
    Json,
}

/// `quarry get dv [NAME]`.
#[derive(clap::Args, Debug)]
pub struct GetArgs {
    /// The kind: dv, dvs, datavolume(s); dic, dics, dataimportcron(s); das, datasource(s).
    #[arg(value_parser = ["dv", "dvs", "datavolume", "datavolumes", "dic", "dics",
        "dataimportcron", "dataimportcrons", "das", "datasource", "datasources"])]
    pub kind: String,
    /// One object (all of the namespace when omitted).
    pub name: Option<String>,
    /// Namespace.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Print the objects instead of the table.
    #[arg(short = 'o', long)]
    pub output: Option<Output>,
    /// Where DataVolume statuses are kept [default: $QUARRY_STATE_DIR or /var/lib/quarry].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

/// What `quarry get` prints.
pub fn get(args: &GetArgs) -> Result<String> {
    let dir = args
        .state_dir
        .clone()
        .unwrap_or_else(local::default_state_dir);
    match args.kind.as_str() {
        "dic" | "dics" | "dataimportcron" | "dataimportcrons" => {
            return get_golden(args, dir, cdi::local::cron::cron_table);
        }
        "das" | "datasource" | "datasources" => {
            return get_golden(args, dir, cdi::local::cron::data_source_table);
        }
        _ => {}
    }
    let store = Store::new(dir);
    let dvs = match &args.name {
        Some(n) => vec![store.load(&args.namespace, n)?],
        None => store.list(&args.namespace)?,
    };
    Ok(match args.output {
        None => local::table(&dvs, Timestamp::now()),
        Some(Output::Yaml) => {
            let docs: Result<Vec<String>> = dvs.iter().map(local::to_yaml).collect();
            docs?.join("---\n")
        }
        Some(Output::Json) => {
            let v = if dvs.len() == 1 && args.name.is_some() {
                serde_json::to_value(&dvs[0])
            } else {
                serde_json::to_value(
                    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": dvs}),
                )
            };
            serde_json::to_string_pretty(&v.map_err(|e| Error::Yaml {
                context: "JSON".into(),
                message: e.to_string(),
            })?)
            .expect("a Value serialises")
                + "\n"
        }
    })
}

/// `quarry get` of local DataImportCrons or DataSources: the table, or the objects.
fn get_golden<K>(args: &GetArgs, dir: PathBuf, table: fn(&[K]) -> String) -> Result<String>
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned,
{
    let store = cdi::local::store::ObjectStore::<K>::new(dir);
    let objs = match &args.name {
        Some(n) => vec![store.get(&args.namespace, n)?.ok_or_else(|| {
            Error::invalid(format!(
                "{} {}/{n} not found",
                K::kind(&()).to_lowercase(),
                args.namespace
            ))
        })?],
        None => store.list(&args.namespace)?,
    };
    let json = |v: serde_json::Result<serde_json::Value>| -> Result<serde_json::Value> {
        v.map_err(|e| Error::Yaml {
            context: "JSON".into(),
            message: e.to_string(),
        })
    };
    Ok(match args.output {
        None => table(&objs),
        Some(Output::Yaml) => {
            let mut docs = Vec::new();
            for o in &objs {
                let v = json(serde_json::to_value(o))?;
                docs.push(serde_saphyr::to_string(&v).map_err(|e| Error::Yaml {
                    context: "writing YAML".into(),
                    message: e.to_string(),
                })?);
            }
            docs.join("---\n")
        }
        Some(Output::Json) => {
            let v = if objs.len() == 1 && args.name.is_some() {
                json(serde_json::to_value(&objs[0]))?
            } else {
                serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objs})
            };
            serde_json::to_string_pretty(&v).expect("a Value serialises") + "\n"
        }
    })
}

/// `quarry gen-deploy`.
#[derive(clap::Args, Debug)]
pub struct GenDeployArgs {
    /// Repository root the `deploy/` files are written under.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Only check that the committed files are current (exit 1 when stale).
    #[arg(long)]
    pub check: bool,
    /// The image of every component (kustomize `images:` can override it later).
    #[arg(long, default_value = api::names::DEFAULT_IMAGE)]
    pub image: String,
}

/// Writes (or checks) the generated manifests, naming each file written or found stale on stdout;
/// false when `--check` found stale files.
pub fn gen_deploy(args: &GenDeployArgs) -> Result<bool> {
    let files = if args.check {
        bundle::stale(&args.root, &args.image)?
    } else {
        bundle::write(&args.root, &args.image)?
    };
    for f in &files {
        let what = if args.check { "stale: " } else { "wrote " };
        println!("{what}{}", f.display());
    }
    Ok(!args.check || files.is_empty())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        dv: DataVolumeArgs,
    }

    fn parse(args: &[&str]) -> DataVolumeArgs {
        Cmd::parse_from(std::iter::once("dv").chain(args.iter().copied())).dv
    }

    #[test]
    fn only_flags_given_explicitly_override_the_cdi_cr() {
        let none = parse(&[]);
        assert_eq!(none.overrides(), Overrides::default());
        assert_eq!(
            none.config().filesystem_overhead,
            cdi::settings::DEFAULT_FILESYSTEM_OVERHEAD
        );
        let given = parse(&[
            "--filesystem-overhead",
            "0.1",
            "--storage-class-overhead",
            "fast=0.2",
            "--insecure-registry",
            "registry.local:5000",
            "--no-honor-wait-for-first-consumer",
        ]);
        let o = given.overrides();
        assert_eq!(o.filesystem_overhead, Some(0.1));
        assert_eq!(o.class_overhead["fast"], 0.2);
        assert_eq!(
            o.insecure_registries.as_deref(),
            Some(&["registry.local:5000".to_string()][..])
        );
        assert_eq!(o.honor_wait_for_first_consumer, Some(false));
        assert_eq!(given.config().filesystem_overhead, 0.1);
    }
}
