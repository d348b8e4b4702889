//! The settings in force: the DataVolume controller's [`Config`] and, as pure functions, which
//! CDI CR is active, how its `spec.config` (with CDI's defaults for what it leaves unset) and the
//! flags given on the command line make the [`Config`], and the CDIConfig status CDI publishes
//! for them. [`LiveSettings`] carries them from the CDIConfig reconciler to the reconciles that
//! read them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use api::cdi::{CdiConfigSpec, CdiConfigStatus, ImportProxy, feature_gate};
use api::hostpath::NodePlacement;
use api::hyperconverged::FilesystemOverhead;

/// How often a running import's progress is read by default.
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(3);
/// CDI's default filesystem overhead (`0.055`).
pub const DEFAULT_FILESYSTEM_OVERHEAD: f64 = 0.055;

/// Upload server TLS material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadTls {
    /// One Secret with `tls.crt` and `tls.key`, in the DataVolume's namespace, for every upload
    /// server, and optionally a ConfigMap with the upload proxy's client CA as `ca.crt`.
    Shared {
        secret: String,
        client_ca_config_map: Option<String>,
    },
    /// As CDI does: per upload pod, a serving certificate for its Service issued from the cert
    /// controller's upload server signer in `namespace`, kept with the proxy's client CA bundle
    /// (`ca.crt`) in a Secret named as the pod, owned by the DataVolume ([`upload_secret`]).
    Issued { namespace: String },
}

/// Settings of the DataVolume controller (CDI's CDIConfig, and the pod image): the flags, or the
/// CDI CR's `spec.config` with explicit flags over it ([`effective`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Image with the `quarry` binary, for importer and upload pods.
    pub image: String,
    /// Pull policy of that image.
    pub pull_policy: Option<String>,
    /// Global filesystem overhead.
    pub filesystem_overhead: f64,
    /// Filesystem overhead per StorageClass.
    pub filesystem_overhead_per_class: BTreeMap<String, f64>,
    /// StorageClass for `spec.storage` without one (None: the cluster default).
    pub default_storage_class: Option<String>,
    /// Registries reached without TLS verification (`HOST[:PORT]`).
    pub insecure_registries: Vec<String>,
    /// Resources of importer and upload pods (None: CDI's defaults, [`default_resources`]).
    pub resources: Option<ResourceRequirements>,
    /// Retries of failed pods.
    pub retry: RetryPolicy,
    /// Leave a WaitForFirstConsumer PVC unbound until its consumer appears (CDI's
    /// HonorWaitForFirstConsumer); when false, the importer pod is the first consumer.
    pub honor_wait_for_first_consumer: bool,
    /// TLS of upload servers (None: plain HTTP inside the cluster).
    pub upload_tls: Option<UploadTls>,
    /// How often a running import's progress is read (CDI: every few seconds).
    pub progress_interval: Duration,
    /// Proxy of importer pods (CDI's importProxy; unset fields: none).
    pub import_proxy: ImportProxy,
    /// Preallocate DataVolumes that do not say (CDI's global preallocation).
    pub preallocation: bool,
    /// Pull secrets of importer and upload pods.
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Where importer, upload and clone source pods run (the CDI CR's `spec.workload`).
    pub workload: NodePlacement,
    /// Checks the clone tokens the DataVolume webhook signs (`datavolume::clone::token`); None: a clone
    /// from another namespace is refused.
    pub clone_token_key: Option<token::PublicKey>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            image: api::names::DEFAULT_IMAGE.into(),
            pull_policy: None,
            filesystem_overhead: DEFAULT_FILESYSTEM_OVERHEAD,
            filesystem_overhead_per_class: BTreeMap::new(),
            default_storage_class: None,
            insecure_registries: Vec::new(),
            resources: None,
            retry: RetryPolicy::default(),
            honor_wait_for_first_consumer: true,
            upload_tls: None,
            progress_interval: DEFAULT_PROGRESS_INTERVAL,
            import_proxy: ImportProxy::default(),
            preallocation: false,
            image_pull_secrets: Vec::new(),
            workload: NodePlacement::default(),
            clone_token_key: None,
        }
    }
}

impl Config {
    /// The filesystem overhead for a StorageClass.
    pub fn overhead(&self, class: Option<&str>) -> f64 {
        class
            .and_then(|c| self.filesystem_overhead_per_class.get(c))
            .copied()
            .unwrap_or(self.filesystem_overhead)
    }
}

/// Back-off and bound of retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay before the first retry; doubled for each further one.
    pub base_delay: Duration,
    /// Longest delay between two attempts.
    pub max_delay: Duration,
    /// Attempts after the first one; then the DataVolume fails.
    pub max_restarts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base_delay: Duration::from_secs(10),
            max_delay: Duration::from_secs(300),
            max_restarts: 10,
        }
    }
}

impl RetryPolicy {
    /// Delay before restart number `restart` (1 for the first retry).
    pub fn delay(&self, restart: u32) -> Duration {
        let factor = 1u32
            .checked_shl(restart.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base_delay
            .checked_mul(factor)
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }
}

/// CDI's default podResourceRequirements of importer and upload pods: requests 100m CPU and
/// 60M memory, limits 750m CPU and 600M memory.
pub fn default_resources() -> ResourceRequirements {
    let q = |cpu: &str, mem: &str| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(mem.into())),
        ])
    };
    ResourceRequirements {
        requests: Some(q("100m", "60M")),
        limits: Some(q("750m", "600M")),
        ..Default::default()
    }
}

/// The settings in force, shared: the CDIConfig reconciler sets them, every reconcile reads
/// them; the flags' [`Config`] until the first CDI CR is read.
#[derive(Debug)]
pub struct LiveSettings {
    /// The settings without a CDI CR: the flags and their defaults.
    pub base: Config,
    /// The flags given explicitly: they win over the CDI CR.
    pub overrides: Overrides,
    live: RwLock<Arc<Config>>,
}

impl LiveSettings {
    pub fn new(base: Config, overrides: Overrides) -> Self {
        LiveSettings {
            live: RwLock::new(Arc::new(base.clone())),
            base,
            overrides,
        }
    }

    /// The settings in force.
    pub fn get(&self) -> Arc<Config> {
        self.live.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the settings in force (the CDIConfig reconciler's result).
    pub fn set(&self, config: Config) {
        let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
        if **live != config {
            // Not the settings themselves: proxy URLs may carry credentials.
            tracing::info!("the settings in force changed");
            *live = Arc::new(config);
        }
    }
}

/// StorageClass annotation marking the cluster's default class.
pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// StorageClass annotation marking the default class of virtual machine disks (CDI's, preferred
/// over [`ANN_DEFAULT_CLASS`] for disk images).
pub const ANN_DEFAULT_VIRT_CLASS: &str = "storageclass.kubevirt.io/is-default-virt-class";

/// What the command line set explicitly: it wins over the CDI CR.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// `--filesystem-overhead`.
    pub filesystem_overhead: Option<f64>,
    /// `--storage-class-overhead`, per class.
    pub class_overhead: BTreeMap<String, f64>,
    /// `--insecure-registry`.
    pub insecure_registries: Option<Vec<String>>,
    /// `--no-honor-wait-for-first-consumer` (as Some(false)).
    pub honor_wait_for_first_consumer: Option<bool>,
}

pub use api::cdi::active_cdi;

/// A CDI `Percent` (`"0"`, `"0.055"`, at most three decimals) as a fraction Quarry can use; `"1"`,
/// which CDI's pattern allows, leaves no usable space and is refused too.
pub fn parse_percent(s: &str) -> Option<f64> {
    let decimals = s.strip_prefix("0.").map(str::len);
    let valid = s == "0"
        || decimals
            .is_some_and(|n| (1..=3).contains(&n) && s[2..].bytes().all(|b| b.is_ascii_digit()));
    valid.then(|| s.parse().ok()).flatten()
}

/// A fraction as CDI writes a `Percent`.
fn percent(f: f64) -> String {
    f.to_string()
}

/// Importer and upload pod resources: CDI's defaults, each of cpu and memory of the limits and
/// requests replaced where `given` sets it (CDI's reconcileDefaultPodResourceRequirements).
pub fn pod_resources(given: Option<&ResourceRequirements>) -> ResourceRequirements {
    let mut out = default_resources();
    let Some(given) = given else {
        return out;
    };
    let merge = |into: &mut Option<BTreeMap<String, _>>, from: &Option<BTreeMap<String, _>>| {
        let (Some(into), Some(from)) = (into.as_mut(), from.as_ref()) else {
            return;
        };
        for key in ["cpu", "memory"] {
            if let Some(q) = from.get(key) {
                into.insert(key.to_string(), Clone::clone(q));
            }
        }
    };
    merge(&mut out.limits, &given.limits);
    merge(&mut out.requests, &given.requests);
    out
}

/// The DataVolume controller's settings: `base` (the flags and their defaults) where no CDI CR
/// exists; otherwise the CR's `spec.config` with CDI's defaults for what it leaves unset, and
/// the flags given explicitly over both.
pub fn effective(base: &Config, cdi_config: Option<&CdiConfigSpec>, ov: &Overrides) -> Config {
    let Some(spec) = cdi_config else {
        return base.clone();
    };
    let overhead = spec.filesystem_overhead.as_ref();
    let mut per_class: BTreeMap<String, f64> = overhead
        .map(|o| &o.storage_class)
        .into_iter()
        .flatten()
        .filter_map(|(class, p)| Some((class.clone(), parse_percent(p)?)))
        .collect();
    per_class.extend(ov.class_overhead.clone());
    let gate = |g: &str| spec.feature_gates.iter().any(|f| f == g);
    Config {
        filesystem_overhead: ov
            .filesystem_overhead
            .or_else(|| overhead.and_then(|o| parse_percent(o.global.as_deref()?)))
            .unwrap_or(DEFAULT_FILESYSTEM_OVERHEAD),
        filesystem_overhead_per_class: per_class,
        insecure_registries: ov
            .insecure_registries
            .clone()
            .unwrap_or_else(|| spec.insecure_registries.clone()),
        resources: Some(pod_resources(spec.pod_resource_requirements.as_ref())),
        honor_wait_for_first_consumer: ov
            .honor_wait_for_first_consumer
            .unwrap_or_else(|| gate(feature_gate::HONOR_WAIT_FOR_FIRST_CONSUMER)),
        import_proxy: spec.import_proxy.clone().unwrap_or_default(),
        preallocation: spec.preallocation == Some(true),
        image_pull_secrets: spec.image_pull_secrets.clone(),
        ..base.clone()
    }
}

/// The class a claim without one gets: the default class of virtual machine disks (for disk
/// images), else the cluster's default class (CDI's GetStorageClassByNameWithVirtFallback).
pub fn default_class(classes: &[StorageClass], disk_image: bool) -> Option<&StorageClass> {
    let marked = |ann: &str| {
        classes.iter().find(|c| {
            c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ann))
                .is_some_and(|v| v == "true")
        })
    };
    disk_image
        .then(|| marked(ANN_DEFAULT_VIRT_CLASS))
        .flatten()
        .or_else(|| marked(ANN_DEFAULT_CLASS))
}

/// The upload proxy's host from an Ingress that routes to `service` (CDI's getURLFromIngress).
pub fn url_from_ingress(ing: &Ingress, service: &str) -> Option<String> {
    let spec = ing.spec.as_ref()?;
    let rules = spec.rules.as_deref().unwrap_or_default();
    if let Some(backend) = spec
        .default_backend
        .as_ref()
        .and_then(|b| b.service.as_ref())
    {
        return (backend.name == service)
            .then(|| rules.first()?.host.clone())
            .flatten();
    }
    rules.iter().find_map(|rule| {
        let paths = &rule.http.as_ref()?.paths;
        paths
            .iter()
            .any(|p| {
                p.backend
                    .service
                    .as_ref()
                    .is_some_and(|s| s.name == service)
            })
            .then(|| rule.host.clone().filter(|h| !h.is_empty()))
            .flatten()
    })
}

/// The CDIConfig status for the settings in force (`cfg`), as CDI derives it: the upload proxy
/// URL (the override, else an Ingress to `upload_service`), the overhead of every StorageClass,
/// the pod resources, the import proxy (empty strings when unset), the scratch space class.
pub fn config_status(
    cfg: &Config,
    spec: &CdiConfigSpec,
    classes: &[StorageClass],
    ingresses: &[Ingress],
    upload_service: &str,
) -> CdiConfigStatus {
    let name = |c: &StorageClass| c.metadata.name.clone().unwrap_or_default();
    let scratch = spec
        .scratch_space_storage_class
        .as_ref()
        .filter(|s| classes.iter().any(|c| &name(c) == *s))
        .cloned()
        .or_else(|| default_class(classes, false).map(name));
    let proxy = if cfg.import_proxy == ImportProxy::default() {
        let empty = Some(String::new());
        ImportProxy {
            http_proxy: empty.clone(),
            https_proxy: empty.clone(),
            no_proxy: empty.clone(),
            trusted_ca_proxy: empty,
        }
    } else {
        cfg.import_proxy.clone()
    };
    CdiConfigStatus {
        upload_proxy_url: spec.upload_proxy_url_override.clone().or_else(|| {
            ingresses
                .iter()
                .find_map(|i| url_from_ingress(i, upload_service))
        }),
        upload_proxy_ca: None,
        import_proxy: Some(proxy),
        scratch_space_storage_class: scratch,
        default_pod_resource_requirements: Some(
            cfg.resources.clone().unwrap_or_else(default_resources),
        ),
        filesystem_overhead: Some(FilesystemOverhead {
            global: Some(percent(cfg.filesystem_overhead)),
            storage_class: classes
                .iter()
                .map(|c| (name(c), percent(cfg.overhead(Some(&name(c))))))
                .collect(),
        }),
        preallocation: cfg.preallocation.then_some(true),
        image_pull_secrets: cfg.image_pull_secrets.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    fn class(name: &str, ann: Option<&str>) -> StorageClass {
        let mut sc = StorageClass::default();
        sc.metadata.name = Some(name.into());
        sc.metadata.annotations = ann.map(|a| BTreeMap::from([(a.to_string(), "true".into())]));
        sc
    }

    fn spec(v: serde_json::Value) -> CdiConfigSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn percents_follow_cdis_pattern() {
        assert_eq!(parse_percent("0.055"), Some(0.055));
        assert_eq!(parse_percent("0"), Some(0.0));
        assert_eq!(parse_percent("0.1"), Some(0.1));
        for bad in ["0.0555", "1", "0.", ".5", "-0.1", "0.5a", "abc", ""] {
            assert_eq!(parse_percent(bad), None, "{bad}");
        }
    }

    #[test]
    fn pod_resources_replace_cdis_defaults_key_by_key() {
        assert_eq!(pod_resources(None), default_resources());
        let given: ResourceRequirements = serde_json::from_value(
            json!({"limits": {"cpu": "2", "nvidia.com/gpu": "1"}, "requests": {"memory": "1Gi"}}),
        )
        .unwrap();
        let r = pod_resources(Some(&given));
        let (l, q) = (r.limits.unwrap(), r.requests.unwrap());
        assert_eq!(l["cpu"], Quantity("2".into()));
        assert_eq!(l["memory"], Quantity("600M".into()));
        assert!(
            !l.contains_key("nvidia.com/gpu"),
            "CDI copies cpu and memory only"
        );
        assert_eq!(q["cpu"], Quantity("100m".into()));
        assert_eq!(q["memory"], Quantity("1Gi".into()));
    }

    #[test]
    fn without_a_cdi_cr_the_flags_and_their_defaults_apply() {
        let base = Config {
            filesystem_overhead: 0.2,
            ..Config::default()
        };
        assert_eq!(effective(&base, None, &Overrides::default()), base);
    }

    #[test]
    fn the_cdi_cr_sets_what_it_says_and_cdis_defaults_the_rest() {
        let base = Config {
            filesystem_overhead: 0.2,
            insecure_registries: vec!["flag.local".into()],
            ..Config::default()
        };
        let s = spec(json!({
            "filesystemOverhead": {"global": "0.08", "storageClass": {"fast": "0.1", "bad": "2"}},
            "insecureRegistries": ["registry.local:5000"],
            "importProxy": {"HTTPProxy": "http://proxy:3128"},
            "preallocation": true,
        }));
        let c = effective(&base, Some(&s), &Overrides::default());
        assert_eq!(c.filesystem_overhead, 0.08);
        assert_eq!(c.overhead(Some("fast")), 0.1);
        assert_eq!(
            c.overhead(Some("bad")),
            0.08,
            "an invalid percent is ignored"
        );
        assert_eq!(c.insecure_registries, ["registry.local:5000"]);
        assert_eq!(
            c.import_proxy.http_proxy.as_deref(),
            Some("http://proxy:3128")
        );
        assert!(c.preallocation);
        assert_eq!(c.resources, Some(default_resources()));
        // HonorWaitForFirstConsumer is a feature gate: off unless the CR lists it.
        assert!(!c.honor_wait_for_first_consumer);
        let gated = spec(json!({"featureGates": ["HonorWaitForFirstConsumer"]}));
        let c = effective(&base, Some(&gated), &Overrides::default());
        assert!(c.honor_wait_for_first_consumer);
        // What the CR leaves unset is CDI's default, not the flag's default.
        assert_eq!(c.filesystem_overhead, DEFAULT_FILESYSTEM_OVERHEAD);
        assert!(c.insecure_registries.is_empty());
    }

    #[test]
    fn flags_given_explicitly_win_over_the_cdi_cr() {
        let s = spec(json!({
            "filesystemOverhead": {"global": "0.08", "storageClass": {"fast": "0.1"}},
            "insecureRegistries": ["registry.local:5000"],
            "featureGates": ["HonorWaitForFirstConsumer"],
        }));
        let ov = Overrides {
            filesystem_overhead: Some(0.3),
            class_overhead: BTreeMap::from([("fast".into(), 0.2)]),
            insecure_registries: Some(vec!["mine.local".into()]),
            honor_wait_for_first_consumer: Some(false),
        };
        let c = effective(&Config::default(), Some(&s), &ov);
        assert_eq!(
            (c.filesystem_overhead, c.overhead(Some("fast"))),
            (0.3, 0.2)
        );
        assert_eq!(c.insecure_registries, ["mine.local"]);
        assert!(!c.honor_wait_for_first_consumer);
    }

    #[test]
    fn the_virt_default_class_comes_before_the_cluster_default() {
        let classes = [
            class("plain", None),
            class("k8s-default", Some(ANN_DEFAULT_CLASS)),
            class("virt-default", Some(ANN_DEFAULT_VIRT_CLASS)),
        ];
        let n = |c: Option<&StorageClass>| c.and_then(|c| c.metadata.name.clone());
        assert_eq!(
            n(default_class(&classes, true)).as_deref(),
            Some("virt-default")
        );
        assert_eq!(
            n(default_class(&classes, false)).as_deref(),
            Some("k8s-default")
        );
        assert_eq!(n(default_class(&classes[..1], true)), None);
    }

    #[test]
    fn the_upload_url_comes_from_an_ingress_to_the_upload_proxy() {
        let ing = |v: serde_json::Value| -> Ingress { serde_json::from_value(v).unwrap() };
        let by_rule = ing(json!({"spec": {"rules": [
            {"host": "other.example", "http": {"paths": [{"pathType": "Prefix", "path": "/",
              "backend": {"service": {"name": "elsewhere", "port": {"number": 443}}}}]}},
            {"host": "upload.example", "http": {"paths": [{"pathType": "Prefix", "path": "/",
              "backend": {"service": {"name": "quarry-uploadproxy", "port": {"number": 443}}}}]}}
        ]}}));
        assert_eq!(
            url_from_ingress(&by_rule, "quarry-uploadproxy").as_deref(),
            Some("upload.example")
        );
        let by_default = ing(json!({"spec": {
            "defaultBackend": {"service": {"name": "quarry-uploadproxy", "port": {"number": 443}}},
            "rules": [{"host": "default.example"}]}}));
        assert_eq!(
            url_from_ingress(&by_default, "quarry-uploadproxy").as_deref(),
            Some("default.example")
        );
        assert_eq!(url_from_ingress(&by_default, "elsewhere"), None);
    }

    #[test]
    fn the_status_shows_the_settings_in_force_for_every_class() {
        let classes = [class("fast", Some(ANN_DEFAULT_CLASS)), class("slow", None)];
        let mut cfg = Config::default();
        cfg.filesystem_overhead_per_class.insert("fast".into(), 0.1);
        let s = spec(json!({"uploadProxyURLOverride": "https://upload.example"}));
        let st = config_status(&cfg, &s, &classes, &[], "quarry-uploadproxy");
        assert_eq!(
            st.upload_proxy_url.as_deref(),
            Some("https://upload.example")
        );
        let fo = st.filesystem_overhead.unwrap();
        assert_eq!(fo.global.as_deref(), Some("0.055"));
        assert_eq!(
            fo.storage_class,
            BTreeMap::from([
                ("fast".into(), "0.1".into()),
                ("slow".into(), "0.055".into())
            ])
        );
        assert_eq!(
            st.default_pod_resource_requirements,
            Some(default_resources())
        );
        let proxy = st.import_proxy.unwrap();
        assert_eq!(proxy.http_proxy.as_deref(), Some(""));
        assert_eq!(proxy.trusted_ca_proxy.as_deref(), Some(""));
        assert_eq!(st.scratch_space_storage_class.as_deref(), Some("fast"));
        assert_eq!(st.preallocation, None);
        // Without an override or an Ingress there is no URL to publish.
        let st = config_status(&cfg, &CdiConfigSpec::default(), &classes, &[], "x");
        assert_eq!(st.upload_proxy_url, None);
    }

    #[test]
    fn back_off_doubles_up_to_the_cap() {
        let p = RetryPolicy {
            base_delay: Duration::from_secs(10),
            max_delay: Duration::from_secs(60),
            max_restarts: 5,
        };
        let d: Vec<u64> = (1..=6).map(|n| p.delay(n).as_secs()).collect();
        assert_eq!(d, [10, 20, 40, 60, 60, 60]);
        assert_eq!(p.delay(1000), Duration::from_secs(60));
    }
}
