//! The pods and Service a DataVolume needs: an importer pod running `quarry import`, or an upload
//! server pod (`quarry upload-server`) with the Service the upload proxy reaches it by. No scratch
//! PVC is ever needed: the import streams straight onto the target volume.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use importer::cli::ImportArgs;
use uploader::cli::ServerArgs;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe, SeccompProfile,
    SecretKeySelector, SecretVolumeSource, SecurityContext, Service, ServicePort, ServiceSpec,
    TCPSocketAction, Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::pvc::{Claim, VolumeMode};
use super::source::{ImportKind, ImportSource};
use super::{labels, name};
use crate::settings::{Config, UploadTls, default_resources};
use api::DataVolume;

/// Whom a pod works for: the claim it fills and the object that owns it, a DataVolume or (for a
/// volume populator) the temporary claim PVC'.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    /// What the pods, the upload Service and their Secrets and ConfigMaps are named after
    /// (`importer-NAME`, `cdi-upload-NAME`): the PVC the upload proxy routes to.
    pub name: String,
    /// The PVC the pod mounts.
    pub claim: String,
    /// Their namespace.
    pub namespace: Option<String>,
    /// The owner's UID: the label of the pod's progress metric.
    pub uid: String,
    /// Labels of every object made.
    pub labels: BTreeMap<String, String>,
    /// The owner reference of every object made.
    pub owner: Option<OwnerReference>,
    /// The pods' priority class.
    pub priority_class: Option<String>,
    /// Preallocation asked by the owner (None: the configured default).
    pub preallocation: Option<bool>,
    /// The owner's annotations the pods take ([`POD_ANNOTATIONS`]).
    pub annotations: BTreeMap<String, String>,
}

/// Annotations of a DataVolume (and of its PVC) its pods take, as CDI passes them: the pod's
/// networks (Multus) and the service meshes' sidecar switches.
pub const POD_ANNOTATIONS: [&str; 4] = [
    "k8s.v1.cni.cncf.io/networks",
    "v1.multus-cni.io/default-network",
    "sidecar.istio.io/inject",
    "linkerd.io/inject",
];

/// Sidecar injection is off unless the owner asks (CDI's defaults): an injected sidecar would
/// keep a finished pod running.
const SIDECARS_OFF: [(&str, &str); 2] = [
    ("sidecar.istio.io/inject", "false"),
    ("linkerd.io/inject", "disabled"),
];

/// The [`POD_ANNOTATIONS`] among `annotations`.
pub fn passed_annotations(
    annotations: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    annotations
        .into_iter()
        .flatten()
        .filter(|(k, _)| POD_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl Workload {
    /// The pods of a DataVolume: its PVC, its labels, owned by it.
    pub fn of(dv: &DataVolume) -> Workload {
        Workload {
            name: name(dv).to_string(),
            claim: name(dv).to_string(),
            namespace: dv.metadata.namespace.clone(),
            uid: dv.metadata.uid.clone().unwrap_or_default(),
            labels: labels(dv),
            owner: super::owner_ref(dv),
            priority_class: dv.spec.priority_class_name.clone(),
            preallocation: dv.spec.preallocation,
            annotations: passed_annotations(dv.metadata.annotations.as_ref()),
        }
    }
}

/// Where a filesystem volume is mounted in the pod.
pub const DATA_DIR: &str = "/data";
/// The disk file on a filesystem volume.
pub const DISK_IMG: &str = "/data/disk.img";
/// Where a block volume appears in the pod (CDI's path).
pub const BLOCK_DEVICE: &str = "/dev/cdi-block-volume";
/// Port of the importer's metrics and of the upload server.
pub const POD_PORT: i32 = 8443;
/// The non-root user and group importer and upload pods run as (CDI's `qemu` user, 107).
pub const POD_UID: i64 = 107;
/// CA certificates of `certConfigMap`.
const CERT_DIR: &str = "/certs";
/// The `secretRef` Secret.
const SECRET_DIR: &str = "/secret";
/// A gcs source's `secretRef` Secret (CDI's path), holding `credentials.json`.
const GCS_SECRET_DIR: &str = "/google";
/// Upload server TLS key pair.
pub(super) const TLS_DIR: &str = "/tls";
/// Upload proxy client CA.
const CLIENT_CA_DIR: &str = "/client-ca";
/// The import proxy's CA bundle (CDI's path), each key of the ConfigMap a file.
const PROXY_CA_DIR: &str = "/proxycerts";

/// Name of the copy of the import proxy's trusted CA ConfigMap next to a PVC (CDI's).
pub fn import_proxy_config_map(pvc: &str) -> String {
    format!("import-proxy-cm-{pvc}")
}

/// The proxy environment of an importer (CDI's variables), for the values that are set.
fn proxy_env(p: &api::cdi::ImportProxy) -> Vec<EnvVar> {
    [
        ("HTTP_PROXY", &p.http_proxy),
        ("HTTPS_PROXY", &p.https_proxy),
        ("NO_PROXY", &p.no_proxy),
    ]
    .into_iter()
    .filter_map(|(name, v)| {
        let v = v.as_deref().filter(|v| !v.is_empty())?;
        Some(EnvVar {
            name: name.into(),
            value: Some(v.into()),
            ..Default::default()
        })
    })
    .collect()
}

/// The trusted CA ConfigMap of the import proxy, when one is set.
pub fn proxy_ca(cfg: &Config) -> Option<&str> {
    cfg.import_proxy
        .trusted_ca_proxy
        .as_deref()
        .filter(|c| !c.is_empty())
}

/// Name of the importer pod of a PVC (CDI's).
pub fn importer_pod_name(pvc: &str) -> String {
    format!("importer-{pvc}")
}

/// Name of the upload server pod and Service of a PVC (CDI's).
pub fn upload_name(pvc: &str) -> String {
    format!("cdi-upload-{pvc}")
}

/// Keys of the objects a source references, read by the controller before rendering the pod:
/// each CA file and each secret header is passed by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourceRefs {
    /// Keys of the `certConfigMap` ConfigMap.
    pub ca_keys: Vec<String>,
    /// For each `secretExtraHeaders` Secret, its keys.
    pub header_secrets: Vec<(String, Vec<String>)>,
    /// Keys of the import proxy's trusted CA ConfigMap.
    pub proxy_ca_keys: Vec<String>,
}

/// Target path of the disk inside the pod.
pub fn target(mode: VolumeMode) -> &'static str {
    match mode {
        VolumeMode::Filesystem => DISK_IMG,
        VolumeMode::Block => BLOCK_DEVICE,
    }
}

/// Target path inside the pod: the disk, or the volume's directory an archive is extracted into
/// (archives need a filesystem volume, [`super::pvc::claim`] checks it).
fn target_of(mode: VolumeMode, archive: bool) -> &'static str {
    if archive { DATA_DIR } else { target(mode) }
}

/// The import the pod runs, with the files it mounts and the environment its `$(VAR)`
/// references read.
fn import_args(
    w: &Workload,
    src: &ImportSource,
    claim: &Claim,
    refs: &SourceRefs,
    cfg: &Config,
) -> (ImportArgs, Vec<EnvVar>) {
    let mut args = src.import_args(
        target_of(claim.mode, src.archive),
        claim,
        &cfg.insecure_registries,
    );
    let mut env = Vec::new();
    args.ca_certs = refs
        .ca_keys
        .iter()
        .map(|key| format!("{CERT_DIR}/{key}").into())
        .collect();
    if let Some(secret) = &src.secret_ref {
        match src.kind {
            ImportKind::S3 => args.s3_credentials = Some(SECRET_DIR.into()),
            ImportKind::Gcs => {
                args.gcs_credentials = Some(format!("{GCS_SECRET_DIR}/credentials.json").into());
            }
            ImportKind::Http | ImportKind::Registry => {
                // The user goes through the environment (kubelet expands `$(VAR)` in args); the
                // password stays in the mounted file, never on a command line.
                env.push(secret_env("IMPORTER_ACCESS_KEY_ID", secret, "accessKeyId"));
                args.user = Some("$(IMPORTER_ACCESS_KEY_ID)".into());
                args.password_file = Some(format!("{SECRET_DIR}/secretKey").into());
            }
        }
    }
    let mut n = 0;
    for (secret, keys) in &refs.header_secrets {
        for key in keys {
            let var = format!("IMPORTER_SECRET_HEADER_{n}");
            env.push(secret_env(&var, secret, key));
            args.headers.push(format!("$({var})"));
            n += 1;
        }
    }
    args.preallocate = preallocate(w, cfg, src.archive);
    args.metrics_addr = Some(SocketAddr::from(([0, 0, 0, 0], POD_PORT as u16)));
    args.owner_uid = Some(w.uid.clone());
    args.json = true;
    (args, env)
}

/// Whether the pod preallocates its disk image: as its owner asks, else the configured default
/// (CDI's global preallocation). An archive's files are written as they are.
fn preallocate(w: &Workload, cfg: &Config, archive: bool) -> bool {
    !archive && w.preallocation.unwrap_or(cfg.preallocation)
}

/// Whether a `docker://HOST/...` image is on one of the insecure registries (`HOST[:PORT]`).
pub(super) fn insecure_registry(url: &str, insecure: &[String]) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split('/').next().unwrap_or_default();
    insecure.iter().any(|r| {
        let r = r.split_once("://").map_or(r.as_str(), |(_, h)| h);
        r.trim_end_matches('/') == host
    })
}

fn secret_env(var: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: var.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn volume(name: &str) -> Volume {
    Volume {
        name: name.into(),
        ..Default::default()
    }
}

pub(super) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// The pod skeleton both kinds share: one container, the PVC attached (plus `extra` volumes),
/// owned by the DataVolume, never restarted in place (the controller decides about retries),
/// meeting Pod Security's `restricted` profile.
pub(super) fn pod(
    w: &Workload,
    pod_name: String,
    claim: &Claim,
    mut c: Container,
    (extra, extra_labels): (Vec<Volume>, BTreeMap<String, String>),
    cfg: &Config,
) -> Pod {
    let mut volumes = vec![Volume {
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: w.claim.clone(),
            read_only: None,
        }),
        ..volume("cdi-data-vol")
    }];
    volumes.extend(extra);
    match claim.mode {
        VolumeMode::Filesystem => {
            c.volume_mounts
                .get_or_insert_default()
                .push(mount("cdi-data-vol", DATA_DIR, false))
        }
        VolumeMode::Block => {
            c.volume_devices = Some(vec![VolumeDevice {
                name: "cdi-data-vol".into(),
                device_path: BLOCK_DEVICE.into(),
            }])
        }
    }
    c.image = Some(cfg.image.clone());
    c.image_pull_policy = cfg.pull_policy.clone();
    c.command = Some(vec!["quarry".into()]);
    c.resources = Some(cfg.resources.clone().unwrap_or_else(default_resources));
    c.termination_message_policy = Some("FallbackToLogsOnError".into());
    c.security_context = Some(restricted_container());
    let mut meta_labels = w.labels.clone();
    meta_labels.extend(extra_labels);
    let mut annotations: BTreeMap<String, String> = SIDECARS_OFF
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    annotations.extend(w.annotations.clone());
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name),
            namespace: w.namespace.clone(),
            labels: Some(meta_labels),
            annotations: Some(annotations),
            owner_references: w.owner.clone().map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![c],
            volumes: Some(volumes),
            restart_policy: Some("Never".into()),
            // None of Quarry's pods talks to the API server: no token is asked for and mounted
            // (one TokenRequest and one projected volume less per pod; CDI's pods mount one).
            automount_service_account_token: Some(false),
            priority_class_name: w.priority_class.clone(),
            image_pull_secrets: (!cfg.image_pull_secrets.is_empty())
                .then(|| cfg.image_pull_secrets.clone()),
            security_context: Some(restricted_pod()),
            node_selector: (!cfg.workload.node_selector.is_empty())
                .then(|| cfg.workload.node_selector.clone()),
            affinity: cfg.workload.affinity.clone(),
            tolerations: (!cfg.workload.tolerations.is_empty())
                .then(|| cfg.workload.tolerations.clone()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The pod side of Pod Security's `restricted` profile, as CDI's pods: a fixed non-root user,
/// RuntimeDefault seccomp, and the volume's files (fsGroup) and block devices (with the
/// runtime's device ownership from the security context) owned by the pod's group.
fn restricted_pod() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(POD_UID),
        run_as_group: Some(POD_UID),
        fs_group: Some(POD_UID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// The container side of `restricted`: no privilege escalation, every capability dropped.
fn restricted_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        run_as_non_root: Some(true),
        ..Default::default()
    }
}

pub(super) fn port(name: &str) -> Option<Vec<ContainerPort>> {
    Some(vec![ContainerPort {
        container_port: POD_PORT,
        name: Some(name.into()),
        protocol: Some("TCP".into()),
        ..Default::default()
    }])
}

fn config_map_volume(vol: &str, config_map: &str) -> Volume {
    Volume {
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.into(),
            ..Default::default()
        }),
        ..volume(vol)
    }
}

pub(super) fn secret_volume(vol: &str, secret: &str) -> Volume {
    Volume {
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            ..Default::default()
        }),
        ..volume(vol)
    }
}

/// The importer pod for an import source: with the import proxy, as CDI's.
pub fn importer_pod(
    w: &Workload,
    src: &ImportSource,
    claim: &Claim,
    refs: &SourceRefs,
    cfg: &Config,
) -> Pod {
    importer_pod_via(w, src, claim, refs, cfg, true)
}

fn importer_pod_via(
    w: &Workload,
    src: &ImportSource,
    claim: &Claim,
    refs: &SourceRefs,
    cfg: &Config,
    proxied: bool,
) -> Pod {
    let (mut args, mut env) = import_args(w, src, claim, refs, cfg);
    let mut mounts = Vec::new();
    let mut volumes = Vec::new();
    if proxied {
        env.extend(proxy_env(&cfg.import_proxy));
        if proxy_ca(cfg).is_some() {
            // Every key (CDI's is `ca.pem`), after the source's own CAs.
            let certs = refs.proxy_ca_keys.iter();
            args.ca_certs
                .extend(certs.map(|key| format!("{PROXY_CA_DIR}/{key}").into()));
            mounts.push(mount("cdi-proxy-cert-vol", PROXY_CA_DIR, true));
            volumes.push(config_map_volume(
                "cdi-proxy-cert-vol",
                &import_proxy_config_map(&w.name),
            ));
        }
    }
    if let Some(cm) = &src.cert_config_map {
        mounts.push(mount("cdi-cert-vol", CERT_DIR, true));
        volumes.push(config_map_volume("cdi-cert-vol", cm));
    }
    if let Some(secret) = &src.secret_ref {
        let dir = match src.kind {
            ImportKind::Gcs => GCS_SECRET_DIR,
            _ => SECRET_DIR,
        };
        mounts.push(mount("cdi-secret-vol", dir, true));
        volumes.push(secret_volume("cdi-secret-vol", secret));
    }
    let c = Container {
        name: "importer".into(),
        args: Some(subcommand("import", args.to_args())),
        env: (!env.is_empty()).then_some(env),
        volume_mounts: Some(mounts),
        // Plain-HTTP Prometheus metrics.
        ports: port("metrics"),
        ..Default::default()
    };
    let pod_name = importer_pod_name(&w.name);
    pod(w, pod_name, claim, c, (volumes, BTreeMap::new()), cfg)
}

/// A container's arguments: `quarry SUBCOMMAND` and the subcommand's.
pub fn subcommand(name: &str, args: Vec<String>) -> Vec<String> {
    std::iter::once(name.to_string()).chain(args).collect()
}

/// The importer pod for a blank disk: an import of an empty source, which leaves a sparse disk
/// of the usable size.
pub fn blank_pod(w: &Workload, claim: &Claim, cfg: &Config) -> Pod {
    let src = ImportSource {
        url: "/dev/null".into(),
        ..Default::default()
    };
    importer_pod_via(w, &src, claim, &SourceRefs::default(), cfg, false)
}

/// The upload server pod: `quarry upload-server` writing into the volume, TLS from the
/// configured Secret, client certificates checked against the upload proxy's CA. Labelled with
/// the UID of the PVC it fills, which its Service selects on. `archive`: the upload is a tar
/// archive extracted into the volume (contentType archive).
pub fn upload_pod(w: &Workload, claim: &Claim, cfg: &Config, pvc_uid: &str, archive: bool) -> Pod {
    let listen = SocketAddr::from(([0, 0, 0, 0], POD_PORT as u16));
    let mut args = ServerArgs::new(target_of(claim.mode, archive), listen);
    args.archive = archive;
    args.size = Some(claim.size);
    args.preallocate = preallocate(w, cfg, archive);
    if claim.mode == VolumeMode::Filesystem {
        args.filesystem_overhead = Some(claim.overhead);
    }
    let mut mounts = Vec::new();
    let mut volumes = Vec::new();
    let tls_args = |args: &mut ServerArgs| {
        args.tls_cert = Some(format!("{TLS_DIR}/tls.crt").into());
        args.tls_key = Some(format!("{TLS_DIR}/tls.key").into());
    };
    match &cfg.upload_tls {
        Some(UploadTls::Shared {
            secret,
            client_ca_config_map,
        }) => {
            tls_args(&mut args);
            mounts.push(mount("cdi-upload-tls", TLS_DIR, true));
            volumes.push(secret_volume("cdi-upload-tls", secret));
            if let Some(ca) = client_ca_config_map {
                args.client_ca = Some(format!("{CLIENT_CA_DIR}/ca.crt").into());
                mounts.push(mount("cdi-client-ca", CLIENT_CA_DIR, true));
                volumes.push(config_map_volume("cdi-client-ca", ca));
            }
        }
        Some(UploadTls::Issued { .. }) => {
            tls_args(&mut args);
            args.client_ca = Some(format!("{TLS_DIR}/ca.crt").into());
            mounts.push(mount("cdi-upload-tls", TLS_DIR, true));
            volumes.push(secret_volume("cdi-upload-tls", &upload_name(&w.name)));
        }
        None => {}
    }
    let c = Container {
        name: "cdi-upload-server".into(),
        args: Some(subcommand("upload-server", args.to_args())),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(POD_PORT),
                host: None,
            }),
            // The kubelet starts probing at a random point of the first period: the shortest
            // period brings the upload server's readiness (and its Service's endpoint) soonest.
            period_seconds: Some(1),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ports: port(if cfg.upload_tls.is_some() {
            "https"
        } else {
            "http"
        }),
        ..Default::default()
    };
    let target = BTreeMap::from([(super::LABEL_TARGET.to_string(), pvc_uid.to_string())]);
    pod(w, upload_name(&w.name), claim, c, (volumes, target), cfg)
}

/// The Service in front of the upload server, as CDI names it: port 443 to the pod's 8443,
/// selecting the upload pod by its PVC's UID.
pub fn upload_service(w: &Workload, pvc_uid: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(upload_name(&w.name)),
            namespace: w.namespace.clone(),
            labels: Some(w.labels.clone()),
            owner_references: w.owner.clone().map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(
                super::LABEL_TARGET.to_string(),
                pvc_uid.to_string(),
            )])),
            ports: Some(vec![ServicePort {
                name: Some("uploadproxy".into()),
                port: 443,
                target_port: Some(IntOrString::Int(POD_PORT)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            // Routed to as soon as the pod has an address, not once its readiness has gone
            // through the endpoints to every node's proxy rules (about a second more): the
            // upload proxy and the clone source pod retry a refused connection until the
            // server listens. The PVC's ready annotation still follows the readiness probe.
            publish_not_ready_addresses: Some(true),
            ..Default::default()
        }),
        status: None,
    }
}
