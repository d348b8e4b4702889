//! Scale benchmark of CDI's controller process (`quarry controller datavolume`) against a real
//! API server: N DataVolumes created at once, each imported through the volume populator, until
//! every importer pod exists. There is no scheduler or kubelet: the pods stay Pending, so this
//! measures the controllers and the API server only.
//!
//! ```text
//! cargo build --release --bin quarry
//! cargo run --release -p operators --example scale_bench -- --count 1000 --count 5000
//! ```
//!
//! For each count, on a fresh API server (testkit's: etcd and the `kube-apiserver` of
//! `~/.cache/kubelab`, audit-logged at the Metadata level):
//! - a WaitForFirstConsumer StorageClass of a CSI driver no node has, and DataVolumes asking for
//!   immediate binding (CDI's golden-image way): the populator makes PVC' with no node, and its
//!   importer pod at once;
//! - the time from the first create until every importer pod exists (a pod watch);
//! - reconciles per DataVolume (the controller's own counters) and API requests per DataVolume
//!   by verb and resource (the audit log, the controller's user agent only) until the
//!   controllers are quiet (no reconcile for [`QUIET`]);
//! - the controller's peak RSS (`VmHWM`), and reconciles and requests during `--idle` seconds
//!   with nothing changing.
//!
//! `--crons N` instead makes N DataImportCrons polling one nginx every minute (an HTTP source)
//! and, over `--minutes` scheduled runs, counts nginx's requests per second and the
//! controller's API requests per cron and run: whether the polls of one schedule come as a herd.
//!
//! Prints a markdown report; figures go to `bench/results/`, never into tests.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api::datavolume::{DataVolumeSource, SourceHttp, StorageSpec};
use api::golden::DataImportCron;
use api::{DataVolume, DataVolumeSpec, StorageProfile};
use futures_util::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Pod, VolumeResourceRequirements};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use testkit::kube::{KubeApiServer, Options};
use testkit::nginx::{Nginx, NginxConfig};

/// The controllers count as settled once no reconcile ran for this long.
const QUIET: Duration = Duration::from_secs(5);
const DRIVER: &str = "kubevirt.io.hostpath-provisioner";
const CLASS: &str = "scale";
/// The controller's user agent (`kubekit::kubeops::client_for`).
const AGENT: &str = "quarry-datavolume/";

struct Args {
    counts: Vec<usize>,
    idle: Duration,
    quarry: PathBuf,
    creators: usize,
    crons: Option<usize>,
    minutes: u32,
}

fn args() -> Args {
    let mut a = Args {
        counts: Vec::new(),
        idle: Duration::from_secs(60),
        quarry: PathBuf::from("target/release/quarry"),
        creators: 16,
        crons: None,
        minutes: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--count" => a.counts.push(value().parse().expect("--count N")),
            "--idle" => a.idle = Duration::from_secs(value().parse().expect("--idle SECONDS")),
            "--quarry" => a.quarry = value().into(),
            "--creators" => a.creators = value().parse().expect("--creators N"),
            "--crons" => a.crons = Some(value().parse().expect("--crons N")),
            "--minutes" => a.minutes = value().parse().expect("--minutes N"),
            other => panic!("unknown flag {other}"),
        }
    }
    if a.counts.is_empty() {
        a.counts.push(1000);
    }
    a
}

#[tokio::main]
async fn main() {
    let a = args();
    assert!(
        a.quarry.exists(),
        "{} is missing: cargo build --release --bin quarry",
        a.quarry.display()
    );
    if let Some(n) = a.crons {
        return crons(n, &a).await;
    }
    println!(
        "| DataVolumes | all importer pods | reconciles/DV | API writes/DV | API reads/DV | peak RSS MiB | idle reconciles | idle requests |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut details = Vec::new();
    for &n in &a.counts {
        let r = run(n, &a).await;
        println!(
            "| {n} | {:.1} s | {:.2} | {:.2} | {:.2} | {:.0} | {} | {} |",
            r.all_pods.as_secs_f64(),
            r.reconciles as f64 / n as f64,
            r.requests.writes() as f64 / n as f64,
            r.requests.reads() as f64 / n as f64,
            r.peak_rss_kib as f64 / 1024.0,
            r.idle_reconciles,
            r.idle_requests.total(),
        );
        details.push((n, r));
    }
    for (n, r) in details {
        println!("\n### {n} DataVolumes\n");
        println!(
            "Creates done after {:.1} s; first importer pod after {:.2} s; settled after {:.1} s; \
             RSS after the idle time {:.0} MiB.",
            r.created.as_secs_f64(),
            r.first_pod.as_secs_f64(),
            r.settled.as_secs_f64(),
            r.rss_kib as f64 / 1024.0
        );
        println!("Reconciles by controller: {:?}\n", r.by_controller);
        println!("| verb | resource | requests | per DV |\n|---|---|---:|---:|");
        for ((verb, resource), count) in &r.requests.0 {
            println!(
                "| {verb} | {resource} | {count} | {:.2} |",
                *count as f64 / n as f64
            );
        }
        if !r.idle_requests.0.is_empty() {
            println!("\nWhile idle: {:?}", r.idle_requests.0);
        }
    }
}

struct Report {
    created: Duration,
    first_pod: Duration,
    all_pods: Duration,
    settled: Duration,
    reconciles: u64,
    by_controller: BTreeMap<String, u64>,
    requests: Requests,
    peak_rss_kib: u64,
    rss_kib: u64,
    idle_reconciles: u64,
    idle_requests: Requests,
}

/// A fresh API server with the CRDs and class, a namespace, and the controller running.
struct Setup {
    server: KubeApiServer,
    client: Client,
    ns: String,
    audit: PathBuf,
    child: Controller,
    counters: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn setup(a: &Args) -> Setup {
    let dir = tempfile::tempdir().expect("temp dir");
    let (policy, audit) = (dir.path().join("audit.yaml"), dir.path().join("audit.log"));
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n- level: Metadata\n",
    )
    .expect("audit policy");
    let opts = Options {
        extra_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit.display()),
            "--audit-log-maxsize=0".into(),
        ],
    };
    let server = tokio::task::spawn_blocking(move || KubeApiServer::start(&opts))
        .await
        .expect("starting the API server")
        .expect("no kube-apiserver here (see testkit::kube)");
    let client = server.client();
    install(&client).await;
    let ns = server.namespace("scale", &[]).await;

    let metrics = free_port();
    let log = std::fs::File::create(dir.path().join("controller.log")).expect("controller log");
    let mut child = Controller(
        Command::new(&a.quarry)
            .args(["controller", "datavolume", "--image", "quarry:scale"])
            .arg(format!("--metrics-addr=127.0.0.1:{metrics}"))
            .env("KUBECONFIG", server.kubeconfig())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting quarry controller datavolume"),
    );
    // Ready once the profile reconciler made the class's StorageProfile (its watches are up).
    let profiles: Api<StorageProfile> = Api::all(client.clone());
    wait(&mut child, "the StorageProfile of the class", || async {
        profiles.get_opt(CLASS).await.ok().flatten().map(|_| ())
    })
    .await;
    Setup {
        server,
        client,
        ns,
        audit,
        child,
        counters: format!("http://127.0.0.1:{metrics}/metrics"),
        http: reqwest::Client::new(),
        _dir: dir,
    }
}

async fn run(n: usize, a: &Args) -> Report {
    let Setup {
        server: _server,
        client,
        ns,
        audit,
        child,
        counters,
        http,
        _dir,
    } = setup(a).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let seen = tokio::spawn(pod_times(pods, n));
    let before = reconciles(&http, &counters).await;
    let offset = std::fs::metadata(&audit).map_or(0, |m| m.len());
    let start = Instant::now();
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    stream::iter(0..n)
        .map(|i| {
            let dvs = dvs.clone();
            async move { dvs.create(&PostParams::default(), &data_volume(i)).await }
        })
        .buffer_unordered(a.creators)
        .try_collect::<Vec<_>>()
        .await
        .expect("creating DataVolumes");
    let created = start.elapsed();
    let (first_pod, all_pods) = seen.await.expect("pod watch");
    let (first_pod, all_pods) = (first_pod - start, all_pods - start);

    // Settled: the reconcile counters stopped moving.
    let mut last = reconciles(&http, &counters).await;
    let mut still = Instant::now();
    while still.elapsed() < QUIET {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = reconciles(&http, &counters).await;
        if now != last {
            (last, still) = (now, Instant::now());
        }
    }
    let settled = still - start;
    let after = last;
    let mid = std::fs::metadata(&audit).map_or(0, |m| m.len());
    tokio::time::sleep(a.idle).await;
    let idle = reconciles(&http, &counters).await;
    let end = std::fs::metadata(&audit).map_or(0, |m| m.len());
    let peak_rss_kib = status_kib(child.0.id(), "VmHWM:");
    let rss_kib = status_kib(child.0.id(), "VmRSS:");
    drop(child);

    let by_controller: BTreeMap<String, u64> = after
        .iter()
        .map(|(c, v)| (c.clone(), v - before.get(c).copied().unwrap_or(0)))
        .collect();
    Report {
        created,
        first_pod,
        all_pods,
        settled,
        reconciles: by_controller.values().sum(),
        by_controller,
        requests: Requests::read(&audit, offset, mid),
        peak_rss_kib,
        rss_kib,
        idle_reconciles: idle.values().sum::<u64>() - after.values().sum::<u64>(),
        idle_requests: Requests::read(&audit, mid, end),
    }
}

/// The controller process, stopped when dropped.
struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `probe` until it answers, failing at once if the controller exits.
async fn wait<F, Fut>(child: &mut Controller, what: &str, probe: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<()>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while probe().await.is_none() {
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!("the controller exited ({status}) before {what} appeared");
        }
        assert!(Instant::now() < deadline, "{what} did not appear in 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// When the first and the `n`th importer pod appeared.
async fn pod_times(pods: Api<Pod>, n: usize) -> (Instant, Instant) {
    let mut names = BTreeSet::new();
    let mut first = None;
    let events = watcher(pods, watcher::Config::default()).applied_objects();
    let mut events = std::pin::pin!(events);
    while let Some(pod) = events.try_next().await.expect("watching pods") {
        let name = pod.metadata.name.unwrap_or_default();
        if name.starts_with("importer-") && names.insert(name) {
            first.get_or_insert_with(Instant::now);
            if names.len() == n {
                return (first.unwrap_or_else(Instant::now), Instant::now());
            }
        }
    }
    panic!("the pod watch ended");
}

/// `quarry_controller_reconciles_total` by controller.
async fn reconciles(http: &reqwest::Client, url: &str) -> BTreeMap<String, u64> {
    let text = http
        .get(url)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("reading the controller's metrics")
        .text()
        .await
        .expect("the controller's metrics");
    text.lines()
        .filter_map(|l| l.strip_prefix("quarry_controller_reconciles_total{controller=\""))
        .filter_map(|l| {
            let (controller, value) = l.split_once("\"} ")?;
            Some((controller.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The controller's API requests by (verb, resource[/subresource]).
#[derive(Default)]
struct Requests(BTreeMap<(String, String), u64>);

impl Requests {
    /// The audit events in `audit` between byte offsets `from` and `to` made by the controller.
    fn read(audit: &Path, from: u64, to: u64) -> Self {
        let mut file = std::fs::File::open(audit).expect("audit log");
        file.seek(std::io::SeekFrom::Start(from)).expect("seek");
        let mut reader = std::io::BufReader::new(file);
        let (mut at, mut line, mut out) = (from, String::new(), Requests::default());
        while at < to {
            line.clear();
            match reader.read_line(&mut line).expect("reading the audit log") {
                0 => break,
                len => at += len as u64,
            }
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let agent = event["userAgent"].as_str().unwrap_or_default();
            if !agent.starts_with(AGENT) {
                continue;
            }
            let object = &event["objectRef"];
            let mut resource = object["resource"].as_str().unwrap_or("-").to_string();
            if let Some(sub) = object["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            let verb = event["verb"].as_str().unwrap_or("-").to_string();
            *out.0.entry((verb, resource)).or_default() += 1;
        }
        out
    }

    fn count(&self, verbs: &[&str]) -> u64 {
        self.0
            .iter()
            .filter(|((v, _), _)| verbs.contains(&v.as_str()))
            .map(|(_, c)| c)
            .sum()
    }

    fn writes(&self) -> u64 {
        self.count(&["create", "update", "patch", "delete", "deletecollection"])
    }

    fn reads(&self) -> u64 {
        self.count(&["get", "list"])
    }

    fn total(&self) -> u64 {
        self.0.values().sum()
    }
}

/// A `/proc/PID/status` figure in KiB (`VmHWM:`, `VmRSS:`).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The install's CRDs, a CSI driver and its WaitForFirstConsumer class.
async fn install(client: &Client) {
    for (crd, _) in bundle::custom_resource_definitions() {
        testkit::kube::apply_crd(client, &crd, "scale-bench").await;
    }
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    let driver = CSIDriver {
        metadata: ObjectMeta {
            name: Some(DRIVER.into()),
            ..Default::default()
        },
        spec: CSIDriverSpec::default(),
    };
    drivers
        .create(&PostParams::default(), &driver)
        .await
        .expect("creating the CSIDriver");
    let classes: Api<StorageClass> = Api::all(client.clone());
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(CLASS.into()),
            ..Default::default()
        },
        provisioner: DRIVER.into(),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..Default::default()
    };
    classes
        .create(&PostParams::default(), &class)
        .await
        .expect("creating the StorageClass");
}

/// DataVolume `i`: an HTTP qcow2 import asking for immediate binding.
fn data_volume(i: usize) -> DataVolume {
    let mut dv = DataVolume::new(
        &format!("dv-{i:05}"),
        DataVolumeSpec {
            source: Some(DataVolumeSource {
                http: Some(SourceHttp {
                    url: format!("http://images.scale.invalid/disk-{i}.qcow2"),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            storage: Some(StorageSpec {
                storage_class_name: Some(CLASS.into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    dv.metadata.annotations = Some(BTreeMap::from([(
        "cdi.kubevirt.io/storage.bind.immediate.requested".into(),
        "true".into(),
    )]));
    dv
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `--crons N`: N crons of one schedule (every minute) polling one nginx.
async fn crons(n: usize, a: &Args) {
    let root = tempfile::tempdir().expect("nginx root");
    std::fs::write(root.path().join("disk.img"), vec![0u8; 1 << 20]).expect("the image");
    let nginx = Nginx::start(NginxConfig {
        root: root.path().to_path_buf(),
        ranges: true,
        ..Default::default()
    });
    let url = nginx.url("/disk.img");
    let s = setup(a).await;
    let api: Api<DataImportCron> = Api::namespaced(s.client.clone(), &s.ns);
    stream::iter(0..n)
        .map(|i| {
            let (api, url) = (api.clone(), url.clone());
            async move {
                let cron: DataImportCron = serde_json::from_value(serde_json::json!({
                    "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
                    "metadata": {"name": format!("cron-{i:04}")},
                    "spec": {"schedule": "* * * * *", "managedDataSource": format!("golden-{i:04}"),
                        "template": {"spec": {"source": {"http": {"url": url}},
                            "storage": {"storageClassName": CLASS,
                                "resources": {"requests": {"storage": "1Gi"}}}}}}
                }))
                .expect("a DataImportCron");
                api.create(&PostParams::default(), &cron).await
            }
        })
        .buffer_unordered(a.creators)
        .try_collect::<Vec<_>>()
        .await
        .expect("creating DataImportCrons");
    // Observe whole scheduled runs: from the next minute boundary on.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let first = (now / 60 + 1) * 60;
    let end = first + 60 * u64::from(a.minutes);
    tokio::time::sleep(Duration::from_secs(first - now)).await;
    let (audit_from, before) = (
        std::fs::metadata(&s.audit).map_or(0, |m| m.len()),
        reconciles(&s.http, &s.counters).await,
    );
    tokio::time::sleep(Duration::from_secs(end - first + 2)).await;
    let (audit_to, after) = (
        std::fs::metadata(&s.audit).map_or(0, |m| m.len()),
        reconciles(&s.http, &s.counters).await,
    );
    let requests = Requests::read(&s.audit, audit_from, audit_to);
    let reconciled: BTreeMap<_, _> = after
        .iter()
        .map(|(c, v)| (c.clone(), v - before.get(c).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    let log = std::fs::read_to_string(nginx.dir().join("access.log")).expect("nginx's access log");
    let mut per_second = BTreeMap::<u64, usize>::new();
    for line in log.lines() {
        let Some(at) = access_time(line) else {
            continue;
        };
        if (first..end).contains(&at) {
            *per_second.entry(at).or_default() += 1;
        }
    }
    let polls: usize = per_second.values().sum();
    println!(
        "| crons | runs observed | polls | per run | busiest second | seconds with a poll, per run | first..last poll after the minute (s) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let offsets: Vec<u64> = per_second.keys().map(|t| (t - first) % 60).collect();
    println!(
        "| {n} | {} | {polls} | {:.1} | {} | {:.1} | {}..{} |",
        a.minutes,
        polls as f64 / f64::from(a.minutes),
        per_second.values().max().copied().unwrap_or(0),
        per_second.len() as f64 / f64::from(a.minutes),
        offsets.iter().min().copied().unwrap_or(0),
        offsets.iter().max().copied().unwrap_or(0),
    );
    let runs = n as f64 * f64::from(a.minutes);
    println!(
        "\nPer cron and run: {:.2} API writes, {:.2} reads; reconciles in all: {reconciled:?}\n",
        requests.writes() as f64 / runs,
        requests.reads() as f64 / runs,
    );
    println!("| verb | resource | requests |\n|---|---|---:|");
    for ((verb, resource), count) in &requests.0 {
        println!("| {verb} | {resource} | {count} |");
    }
    drop(s);
}

/// The time of an nginx access log line (`[29/Nov/2026:12:03:00 +0000]`), in seconds since
/// the epoch.
fn access_time(line: &str) -> Option<u64> {
    let stamp = line.split_once('[')?.1.split_once(']')?.0;
    let t = k8s_openapi::jiff::fmt::strtime::parse("%d/%b/%Y:%H:%M:%S %z", stamp)
        .ok()?
        .to_timestamp()
        .ok()?;
    u64::try_from(t.as_second()).ok()
}
