//! The CSI driver objects a HostPathProvisioner asks for: the per-node DaemonSet (`quarry csi`
//! with the node-driver-registrar, csi-provisioner, csi-snapshotter and csi-resizer sidecars),
//! the CSIDriver, one StorageClass per pool, the pool ConfigMap and RBAC, all owned by the CR.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, Deployment, DeploymentSpec, DeploymentStrategy,
};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMap, ConfigMapVolumeSource, Container, EnvVar, EnvVarSource,
    HostPathVolumeSource, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, SecurityContext, ServiceAccount,
    Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Resource;
use sha2::{Digest, Sha256};

use api::HostPathProvisioner;
use api::hostpath::StoragePool;
use api::names::csi::{CLUSTER_ROLE, DRIVER_APP, POOLS_CONFIG_MAP};
use api::rbac::rule;
use csi::mounter::Backing;
use kubekit::error::{Error, Result};

/// Images and namespace of the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Namespace of the DaemonSet, ConfigMap and ServiceAccount.
    pub namespace: String,
    /// Image with the `quarry` binary.
    pub image: String,
    /// node-driver-registrar image.
    pub registrar_image: String,
    /// csi-provisioner image.
    pub provisioner_image: String,
    /// csi-snapshotter image (snapshots and group snapshots).
    pub snapshotter_image: String,
    /// csi-resizer image (expansion, and ModifyVolume for VolumeAttributesClasses).
    pub resizer_image: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            namespace: "quarry".into(),
            image: api::names::DEFAULT_IMAGE.into(),
            registrar_image: "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0".into(),
            provisioner_image: "registry.k8s.io/sig-storage/csi-provisioner:v5.2.0".into(),
            snapshotter_image: "registry.k8s.io/sig-storage/csi-snapshotter:v8.2.1".into(),
            resizer_image: "registry.k8s.io/sig-storage/csi-resizer:v1.13.2".into(),
        }
    }
}

/// StorageClass name of a pool.
pub fn storage_class_name(pool: &str) -> String {
    format!("hostpath-csi-{pool}")
}

/// Everything the driver needs, in apply order.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverObjects {
    /// The driver's ServiceAccount.
    pub service_account: ServiceAccount,
    /// What csi-provisioner may do.
    pub cluster_role: ClusterRole,
    /// Binds the role to the ServiceAccount.
    pub cluster_role_binding: ClusterRoleBinding,
    /// `pools.json` for `quarry csi --pools`.
    pub pools: ConfigMap,
    /// One driver pod per node.
    pub daemon_set: DaemonSet,
    /// The CSIDriver object.
    pub csi_driver: CSIDriver,
    /// One StorageClass per pool.
    pub storage_classes: Vec<StorageClass>,
}

/// The pools of a HostPathProvisioner (the legacy `pathConfig` is a pool named `legacy`),
/// checked: at least one, valid and unique names, absolute paths, no `snapshotProvider` but
/// `reflink`.
pub fn pools(hpp: &HostPathProvisioner) -> Result<Vec<StoragePool>> {
    let mut pools = hpp.spec.storage_pools.clone();
    if let Some(pc) = &hpp.spec.path_config {
        pools.push(StoragePool {
            name: "legacy".into(),
            path: pc.path.clone(),
            ..Default::default()
        });
    }
    let mut problems: Vec<String> = pools
        .iter()
        .filter(|p| !p.name.is_empty() && !pool_name_ok(&p.name))
        .map(|p| {
            format!(
                "pool name {:?} must be lowercase letters, digits and '-', starting and ending \
                 with a letter or digit, at most {MAX_POOL_NAME} characters",
                p.name
            )
        })
        .collect();
    let configs: Vec<provisioner::PoolConfig> = pools
        .iter()
        .map(|p| provisioner::PoolConfig {
            mounted: p.pvc_template.is_some(),
            name: p.name.clone(),
            path: p.path.clone().into(),
            quota: Default::default(),
        })
        .collect();
    if let Err(e) = provisioner::config::validate(&configs) {
        problems.push(e.to_string());
    }
    // HPP's driver exits on any other provider; Quarry snapshots on every pool anyway
    let providers = pools.iter().filter_map(|p| {
        // "" is no provider, as HPP's driver flag takes it
        let provider = p.snapshot_provider.as_deref()?;
        (!provider.is_empty() && provider != SNAPSHOT_PROVIDER).then(|| {
            format!(
                "pool {:?}: snapshotProvider {provider:?} is not supported (only \"{SNAPSHOT_PROVIDER}\")",
                p.name
            )
        })
    });
    problems.extend(providers);
    if problems.is_empty() {
        Ok(pools)
    } else {
        Err(Error::invalid(format!(
            "spec.storagePools: {}",
            problems.join("; ")
        )))
    }
}

/// The one `snapshotProvider` a pool may name (HPP's).
const SNAPSHOT_PROVIDER: &str = "reflink";

/// Longest pool name: the DaemonSet's volume `pool-<name>` must stay a DNS-1123 label.
const MAX_POOL_NAME: usize = 63 - "pool-".len();

/// Whether a pool name makes valid object names (`pool-<name>` volumes, `hostpath-csi-<name>`
/// StorageClasses): a DNS-1123 label, short enough for the prefix.
fn pool_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    name.len() <= MAX_POOL_NAME
        && b.first().is_some_and(inner)
        && b.last().is_some_and(inner)
        && b.iter().all(|c| inner(c) || *c == b'-')
}

fn meta(name: &str, namespace: Option<&str>, hpp: &HostPathProvisioner) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        labels: Some(BTreeMap::from([
            ("app".to_string(), DRIVER_APP.to_string()),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "quarry-hpp-operator".to_string(),
            ),
        ])),
        owner_references: hpp.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    }
}

fn host_path(name: &str, path: &str, type_: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some(type_.into()),
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, bidirectional: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        mount_propagation: bidirectional.then(|| "Bidirectional".into()),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The directory a `pvcTemplate` pool's path is in.
fn pool_parent(path: &str) -> String {
    let parent = std::path::Path::new(path).parent();
    parent.map_or("/".into(), |p| p.display().to_string())
}

/// Label of a pool's PVC and mounter (HPP's): the pool's name.
pub const POOL_LABEL: &str = "kubevirt.io.hostpath-provisioner/storagePool";
/// Label of a mounter's pods: the pool and node it serves.
const MOUNTER_LABEL: &str = "quarry.kubevirt.io/pool-mount";

/// Where a mounter pod has a Block PVC's device (HPP's mounter's path).
pub const POOL_DEVICE: &str = "/dev/data";

/// What backs a `pvcTemplate` pool on one node: the PVC made from the template and the
/// Deployment of the pod that mounts it at the pool's path (`quarry pool-mount`), HPP's way.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolMount {
    /// The pool.
    pub pool: String,
    /// The node.
    pub node: String,
    /// Its PVC (never owned by the CR: deleting the CR must not take the pool's data).
    pub pvc: PersistentVolumeClaim,
    /// The mounter.
    pub deployment: Deployment,
}

/// Name of the PVC and the mounter of `pool` on `node` (HPP's `hpp-pool-<pool>-<node>`).
pub fn pool_mount_name(pool: &str, node: &str) -> String {
    format!("hpp-pool-{pool}-{node}")
}

/// The PVC and mounter of every `pvcTemplate` pool on every node of `nodes` (those the driver
/// runs on).
pub fn pool_mounts(
    hpp: &HostPathProvisioner,
    s: &Settings,
    nodes: &[String],
) -> Result<Vec<PoolMount>> {
    let mut out = Vec::new();
    for p in pools(hpp)? {
        let Some(template) = &p.pvc_template else {
            continue;
        };
        for node in nodes {
            out.push(pool_mount(hpp, s, &p, template, node));
        }
    }
    Ok(out)
}

fn pool_mount(
    hpp: &HostPathProvisioner,
    s: &Settings,
    p: &StoragePool,
    template: &PersistentVolumeClaimSpec,
    node: &str,
) -> PoolMount {
    let name = pool_mount_name(&p.name, node);
    let ns = Some(s.namespace.as_str());
    let mut pvc_meta = meta(&name, ns, hpp);
    pvc_meta.owner_references = None;
    pvc_meta
        .labels
        .get_or_insert_default()
        .insert(POOL_LABEL.into(), p.name.clone());
    let pvc = PersistentVolumeClaim {
        metadata: pvc_meta,
        spec: Some(template.clone()),
        status: None,
    };
    // One label value per pool and node (a node name may be longer than a label value).
    let digest = Sha256::digest(format!("{}/{node}", p.name));
    let selector = BTreeMap::from([(MOUNTER_LABEL.to_string(), hex::encode(&digest[..16]))]);
    let mut labels = selector.clone();
    labels.insert(POOL_LABEL.into(), p.name.clone());
    let mut dep_meta = meta(&name, ns, hpp);
    dep_meta
        .labels
        .get_or_insert_default()
        .extend(labels.clone());
    let parent = pool_parent(&p.path);
    let node_root = "/node";
    // A Block PVC is a device in the pod (HPP's path), a Filesystem one a mount.
    let block = template.volume_mode.as_deref() == Some("Block");
    let (backing, data_mount, data_device) = if block {
        let device = VolumeDevice {
            name: "data".into(),
            device_path: POOL_DEVICE.into(),
        };
        (Backing::Device(POOL_DEVICE.into()), None, Some(device))
    } else {
        let source = "/source";
        let m = mount("data", source, false);
        (Backing::Dir(source.into()), Some(m), None)
    };
    let args = csi::mounter::PoolMountArgs::new(backing, format!("{node_root}{}", p.path).into());
    let container = Container {
        name: "mounter".into(),
        image: Some(s.image.clone()),
        image_pull_policy: hpp.spec.image_pull_policy.clone(),
        args: Some(
            std::iter::once("pool-mount".to_string())
                .chain(args.to_args())
                .collect(),
        ),
        // Mounting on the node takes a privileged root container, as HPP's mounter.
        security_context: Some(SecurityContext {
            privileged: Some(true),
            run_as_user: Some(0),
            ..Default::default()
        }),
        volume_mounts: Some(
            data_mount
                .into_iter()
                .chain([mount("pool-parent", &format!("{node_root}{parent}"), true)])
                .collect(),
        ),
        volume_devices: data_device.map(|d| vec![d]),
        ..Default::default()
    };
    let on_node = Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "kubernetes.io/hostname".into(),
                        operator: "In".into(),
                        values: Some(vec![node.into()]),
                    }]),
                    match_fields: None,
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod = PodSpec {
        containers: vec![container],
        // the scheduler places it (and so binds a WaitForFirstConsumer PVC) on its node
        affinity: Some(on_node),
        service_account_name: Some(DRIVER_APP.into()),
        volumes: Some(vec![
            Volume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: name.clone(),
                    read_only: None,
                }),
                ..Default::default()
            },
            host_path("pool-parent", &parent, "DirectoryOrCreate"),
        ]),
        ..Default::default()
    };
    let deployment = Deployment {
        metadata: dep_meta,
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            // never two mounters of one PVC
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                rolling_update: None,
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        status: None,
    };
    PoolMount {
        pool: p.name.clone(),
        node: node.into(),
        pvc,
        deployment,
    }
}

/// The driver objects for a HostPathProvisioner.
pub fn driver_objects(hpp: &HostPathProvisioner, s: &Settings) -> Result<DriverObjects> {
    let pools = pools(hpp)?;
    let ns = Some(s.namespace.as_str());
    let socket_dir = format!("/var/lib/kubelet/plugins/{}", provisioner::DRIVER_NAME);
    let pull = hpp.spec.image_pull_policy.clone();

    let pool_json: Vec<_> = pools
        .iter()
        .map(|p| {
            let mounted = p.pvc_template.is_some();
            serde_json::json!({"name": p.name, "path": p.path, "quota": "auto", "mounted": mounted})
        })
        .collect();
    let config_map = ConfigMap {
        metadata: meta(POOLS_CONFIG_MAP, ns, hpp),
        data: Some(BTreeMap::from([(
            "pools.json".to_string(),
            serde_json::to_string(&pool_json).expect("pools serialise") + "\n",
        )])),
        ..Default::default()
    };

    let mut driver_mounts = vec![
        mount("socket-dir", "/csi", false),
        mount("pools-config", "/etc/quarry", false),
        mount("mountpoint-dir", "/var/lib/kubelet/pods", true),
        mount("plugins-dir", "/var/lib/kubelet/plugins", true),
        mount("dev-dir", "/dev", false),
    ];
    let mut volumes = vec![
        host_path("socket-dir", &socket_dir, "DirectoryOrCreate"),
        host_path(
            "registration-dir",
            "/var/lib/kubelet/plugins_registry",
            "Directory",
        ),
        host_path(
            "mountpoint-dir",
            "/var/lib/kubelet/pods",
            "DirectoryOrCreate",
        ),
        host_path("plugins-dir", "/var/lib/kubelet/plugins", "Directory"),
        host_path("dev-dir", "/dev", "Directory"),
        Volume {
            name: "pools-config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: POOLS_CONFIG_MAP.into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let mut mounted_parents: Vec<String> = Vec::new();
    for p in pools.iter().filter(|p| p.pvc_template.is_some()) {
        // The mounter's mount at the pool path reaches the driver only from under a
        // Bidirectional mount of its parent (a mount at a hostPath's own root does not).
        let parent = pool_parent(&p.path);
        if !mounted_parents.contains(&parent) {
            let vol = format!("pool-{}", p.name);
            driver_mounts.push(mount(&vol, &parent, true));
            volumes.push(host_path(&vol, &parent, "DirectoryOrCreate"));
            mounted_parents.push(parent);
        }
    }
    let under_a_parent = |path: &str| {
        mounted_parents
            .iter()
            .any(|parent| parent != "/" && std::path::Path::new(path).starts_with(parent))
    };
    for p in pools.iter().filter(|p| p.pvc_template.is_none()) {
        // A plain pool under a parent mounted Bidirectional is seen through it. Mounted again
        // inside it, the runtime's bind of the pool would propagate back to the node through
        // the parent: one more mount of the pool on itself at every start of the driver.
        if under_a_parent(&p.path) {
            continue;
        }
        let vol = format!("pool-{}", p.name);
        driver_mounts.push(mount(&vol, &p.path, true));
        volumes.push(host_path(&vol, &p.path, "DirectoryOrCreate"));
    }
    let containers = vec![
        Container {
            name: DRIVER_APP.into(),
            image: Some(s.image.clone()),
            image_pull_policy: pull.clone(),
            args: Some(vec![
                "csi".into(),
                "--endpoint=unix:///csi/csi.sock".into(),
                "--node-id=$(NODE_NAME)".into(),
                "--pools=@/etc/quarry/pools.json".into(),
            ]),
            env: Some(vec![field_env("NODE_NAME", "spec.nodeName")]),
            // The image's default user is the unprivileged 107: the driver mounts and attaches
            // loop devices, so it runs as root, privileged.
            security_context: Some(SecurityContext {
                privileged: Some(true),
                run_as_user: Some(0),
                ..Default::default()
            }),
            volume_mounts: Some(driver_mounts),
            ..Default::default()
        },
        Container {
            name: "node-driver-registrar".into(),
            image: Some(s.registrar_image.clone()),
            image_pull_policy: pull.clone(),
            args: Some(vec![
                "--csi-address=/csi/csi.sock".into(),
                format!("--kubelet-registration-path={socket_dir}/csi.sock"),
            ]),
            volume_mounts: Some(vec![
                mount("socket-dir", "/csi", false),
                mount("registration-dir", "/registration", false),
            ]),
            ..Default::default()
        },
        Container {
            name: "csi-provisioner".into(),
            image: Some(s.provisioner_image.clone()),
            image_pull_policy: pull.clone(),
            args: Some(vec![
                "--csi-address=/csi/csi.sock".into(),
                "--node-deployment=true".into(),
                "--enable-capacity=true".into(),
                "--capacity-ownerref-level=0".into(),
                "--extra-create-metadata=true".into(),
                "--feature-gates=Topology=true".into(),
                "--strict-topology=true".into(),
            ]),
            env: Some(vec![
                field_env("NODE_NAME", "spec.nodeName"),
                field_env("NAMESPACE", "metadata.namespace"),
                field_env("POD_NAME", "metadata.name"),
            ]),
            volume_mounts: Some(vec![mount("socket-dir", "/csi", false)]),
            ..Default::default()
        },
        // each node's snapshotter handles the snapshots of its own volumes: the
        // snapshot-controller must run with --enable-distributed-snapshotting to label them
        Container {
            name: "csi-snapshotter".into(),
            image: Some(s.snapshotter_image.clone()),
            image_pull_policy: pull.clone(),
            args: Some(vec![
                "--csi-address=/csi/csi.sock".into(),
                "--node-deployment=true".into(),
                "--leader-election=false".into(),
                "--extra-create-metadata=true".into(),
                // no CSIVolumeGroupSnapshot gate: with it, csi-snapshotter v8 handles nothing
                // until the groupsnapshot.storage.k8s.io CRDs exist, and many clusters lack them
            ]),
            env: Some(vec![field_env("NODE_NAME", "spec.nodeName")]),
            volume_mounts: Some(vec![mount("socket-dir", "/csi", false)]),
            ..Default::default()
        },
        // csi-resizer has no per-node mode yet: each node's resizer also tries other nodes'
        // volumes, which this driver answers with NOT_FOUND, and the volume's own node does it
        Container {
            name: "csi-resizer".into(),
            image: Some(s.resizer_image.clone()),
            image_pull_policy: pull,
            args: Some(vec![
                "--csi-address=/csi/csi.sock".into(),
                "--leader-election=false".into(),
                "--handle-volume-inuse-error=false".into(),
                // no VolumeAttributesClass gate: the API is v1beta1 from 1.31 and off by
                // default until 1.34, and the resizer logs list errors where it is absent
            ]),
            volume_mounts: Some(vec![mount("socket-dir", "/csi", false)]),
            ..Default::default()
        },
    ];
    let app_labels = BTreeMap::from([("app".to_string(), DRIVER_APP.to_string())]);
    let workload = hpp.spec.workload.clone().unwrap_or_default();
    let daemon_set = DaemonSet {
        metadata: meta(DRIVER_APP, ns, hpp),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(app_labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(app_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(DRIVER_APP.into()),
                    containers,
                    volumes: Some(volumes),
                    node_selector: (!workload.node_selector.is_empty())
                        .then_some(workload.node_selector),
                    tolerations: (!workload.tolerations.is_empty()).then_some(workload.tolerations),
                    affinity: workload.affinity,
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    };

    let csi_driver = CSIDriver {
        metadata: meta(provisioner::DRIVER_NAME, None, hpp),
        spec: CSIDriverSpec {
            attach_required: Some(false),
            pod_info_on_mount: Some(true),
            storage_capacity: Some(true),
            fs_group_policy: Some("File".into()),
            volume_lifecycle_modes: Some(vec!["Persistent".into(), "Ephemeral".into()]),
            ..Default::default()
        },
    };
    let storage_classes = pools
        .iter()
        .map(|p| StorageClass {
            metadata: meta(&storage_class_name(&p.name), None, hpp),
            provisioner: provisioner::DRIVER_NAME.into(),
            parameters: Some(BTreeMap::from([(
                provisioner::POOL_PARAMETER.to_string(),
                p.name.clone(),
            )])),
            reclaim_policy: Some("Delete".into()),
            volume_binding_mode: Some("WaitForFirstConsumer".into()),
            allow_volume_expansion: Some(true),
            ..Default::default()
        })
        .collect();

    let service_account = ServiceAccount {
        metadata: meta(DRIVER_APP, ns, hpp),
        ..Default::default()
    };
    let cluster_role = ClusterRole {
        metadata: meta(CLUSTER_ROLE, None, hpp),
        rules: Some(vec![
            rule(
                &[""],
                &["persistentvolumes"],
                &["get", "list", "watch", "create", "delete", "patch"],
            ),
            rule(
                &[""],
                &["persistentvolumeclaims"],
                &["get", "list", "watch", "update"],
            ),
            rule(
                &[""],
                &["persistentvolumeclaims/status"],
                &["update", "patch"],
            ),
            rule(
                &["storage.k8s.io"],
                &["volumeattributesclasses"],
                &["get", "list", "watch"],
            ),
            rule(
                &["storage.k8s.io"],
                &["storageclasses", "csinodes", "volumeattachments"],
                &["get", "list", "watch"],
            ),
            rule(
                &[""],
                &["events"],
                &["list", "watch", "create", "update", "patch"],
            ),
            rule(&[""], &["nodes"], &["get", "list", "watch"]),
            rule(
                &["snapshot.storage.k8s.io"],
                &["volumesnapshots"],
                &["get", "list", "watch"],
            ),
            rule(
                &["snapshot.storage.k8s.io"],
                &["volumesnapshotclasses"],
                &["get", "list", "watch"],
            ),
            rule(
                &["snapshot.storage.k8s.io"],
                &["volumesnapshotcontents"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            rule(
                &["snapshot.storage.k8s.io"],
                &["volumesnapshotcontents/status"],
                &["update", "patch"],
            ),
            // group snapshots live in their own API group (external-snapshotter v8)
            rule(
                &["groupsnapshot.storage.k8s.io"],
                &["volumegroupsnapshotclasses", "volumegroupsnapshots"],
                &["get", "list", "watch"],
            ),
            rule(
                &["groupsnapshot.storage.k8s.io"],
                &["volumegroupsnapshotcontents"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            rule(
                &["groupsnapshot.storage.k8s.io"],
                &["volumegroupsnapshotcontents/status"],
                &["update", "patch"],
            ),
            rule(
                &["storage.k8s.io"],
                &["csistoragecapacities"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            rule(&[""], &["pods"], &["get", "list", "watch"]),
            rule(&["apps"], &["daemonsets", "replicasets"], &["get"]),
        ]),
        ..Default::default()
    };
    let cluster_role_binding = ClusterRoleBinding {
        metadata: meta(CLUSTER_ROLE, None, hpp),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: CLUSTER_ROLE.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: DRIVER_APP.into(),
            namespace: Some(s.namespace.clone()),
            ..Default::default()
        }]),
    };
    Ok(DriverObjects {
        service_account,
        cluster_role,
        cluster_role_binding,
        pools: config_map,
        daemon_set,
        csi_driver,
        storage_classes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::HostPathProvisionerSpec;
    use api::hostpath::{NodePlacement, PathConfig};

    fn hpp(pools: &[(&str, &str)]) -> HostPathProvisioner {
        let mut h = HostPathProvisioner::new(
            "hostpath-provisioner",
            HostPathProvisionerSpec {
                image_pull_policy: Some("IfNotPresent".into()),
                storage_pools: pools
                    .iter()
                    .map(|(n, p)| StoragePool {
                        name: n.to_string(),
                        path: p.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
        );
        h.metadata.uid = Some("hpp-uid".into());
        h
    }

    fn with_pvc_pool(mode: &str) -> HostPathProvisioner {
        let mut h = hpp(&[("local", "/var/hpvolumes/csi")]);
        h.spec.storage_pools.push(StoragePool {
            name: "onpvc".into(),
            path: "/var/hpvolumes/onpvc".into(),
            pvc_template: Some(PersistentVolumeClaimSpec {
                storage_class_name: Some("local-disks".into()),
                volume_mode: Some(mode.into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        h
    }

    #[test]
    fn a_pvc_template_pool_gets_a_pvc_and_a_mounter_per_node_and_the_driver_sees_its_mount() {
        let h = with_pvc_pool("Filesystem");
        let s = Settings::default();
        let nodes = ["n1".to_string(), "n2".to_string()];
        let mounts = pool_mounts(&h, &s, &nodes).unwrap();
        assert_eq!(mounts.len(), 2, "one per node, none for the plain pool");
        let m = &mounts[0];
        assert_eq!(m.pvc.metadata.name.as_deref(), Some("hpp-pool-onpvc-n1"));
        assert_eq!(
            m.pvc.spec.as_ref().unwrap().storage_class_name.as_deref(),
            Some("local-disks")
        );
        assert!(
            m.pvc.metadata.owner_references.is_none(),
            "the pool's data outlives the CR"
        );
        let pod = m
            .deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        let c = &pod.containers[0];
        let args = c.args.clone().unwrap();
        assert_eq!(args[0], "pool-mount");
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: csi::mounter::PoolMountArgs,
        }
        let parsed = <Cli as clap::Parser>::try_parse_from(args.iter())
            .unwrap()
            .a;
        assert_eq!(
            parsed.target,
            std::path::PathBuf::from("/node/var/hpvolumes/onpvc")
        );
        let parent = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "pool-parent")
            .unwrap();
        assert_eq!(parent.mount_path, "/node/var/hpvolumes");
        assert_eq!(parent.mount_propagation.as_deref(), Some("Bidirectional"));
        let term = &pod
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms[0];
        assert_eq!(
            term.match_expressions.as_ref().unwrap()[0]
                .values
                .as_deref(),
            Some(&["n1".to_string()][..])
        );
        // Two nodes' mounters never select each other's pods.
        let sel = |m: &PoolMount| {
            m.deployment
                .spec
                .as_ref()
                .unwrap()
                .selector
                .match_labels
                .clone()
        };
        assert_ne!(sel(&mounts[0]), sel(&mounts[1]));

        // The driver: the pool marked mounted, its parent mounted Bidirectional.
        let o = driver_objects(&h, &s).unwrap();
        let pools_json: serde_json::Value =
            serde_json::from_str(&o.pools.data.as_ref().unwrap()["pools.json"]).unwrap();
        assert_eq!(pools_json[1]["mounted"], true);
        assert_eq!(pools_json[0]["mounted"], false);
        let ds = o
            .daemon_set
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        let driver = &ds.containers[0];
        let paths: Vec<_> = driver
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        // The plain pool is seen through its parent's mount, not mounted again inside it (that
        // bind would propagate back to the node, a mount on itself per driver start).
        assert!(
            paths.contains(&"/var/hpvolumes") && !paths.contains(&"/var/hpvolumes/csi"),
            "{paths:?}"
        );
    }

    /// The mounter's container and pod of the first node's mount of `h`'s `onpvc` pool.
    fn mounter(h: &HostPathProvisioner) -> (Container, PodSpec) {
        let mounts = pool_mounts(h, &Settings::default(), &["n1".to_string()]).unwrap();
        let pod = mounts[0]
            .deployment
            .spec
            .clone()
            .unwrap()
            .template
            .spec
            .unwrap();
        (pod.containers[0].clone(), pod)
    }

    fn backing(c: &Container) -> csi::mounter::Backing {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: csi::mounter::PoolMountArgs,
        }
        let args = c.args.clone().unwrap();
        <Cli as clap::Parser>::try_parse_from(args.iter())
            .unwrap()
            .a
            .backing()
    }

    #[test]
    fn a_block_pvc_template_is_the_mounters_device_and_a_filesystem_one_its_mount() {
        let (c, pod) = mounter(&with_pvc_pool("Block"));
        assert_eq!(backing(&c), Backing::Device("/dev/data".into()));
        let devices = c.volume_devices.clone().unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(
            (devices[0].name.as_str(), devices[0].device_path.as_str()),
            ("data", POOL_DEVICE)
        );
        let mounts: Vec<_> = c.volume_mounts.iter().flatten().map(|m| &m.name).collect();
        assert_eq!(mounts, ["pool-parent"], "no mount of the device's claim");
        let claim = |pod: &PodSpec| {
            let v = pod.volumes.as_ref().unwrap();
            let data = v.iter().find(|v| v.name == "data").unwrap();
            data.persistent_volume_claim.clone().unwrap().claim_name
        };
        assert_eq!(claim(&pod), "hpp-pool-onpvc-n1");
        // privileged: the device is opened, formatted when blank, and mounted on the node
        let sec = c.security_context.clone().unwrap();
        assert_eq!((sec.privileged, sec.run_as_user), (Some(true), Some(0)));

        for mode in ["Filesystem", ""] {
            let mut h = with_pvc_pool(mode);
            if mode.is_empty() {
                let t = h.spec.storage_pools[1].pvc_template.as_mut().unwrap();
                t.volume_mode = None;
            }
            let (c, pod) = mounter(&h);
            assert_eq!(backing(&c), Backing::Dir("/source".into()), "{mode:?}");
            assert!(c.volume_devices.is_none(), "{mode:?}");
            let data = c.volume_mounts.iter().flatten().find(|m| m.name == "data");
            assert_eq!(data.unwrap().mount_path, "/source");
            assert_eq!(claim(&pod), "hpp-pool-onpvc-n1");
        }
        // the driver sees either kind alike: a mounted pool
        let o = driver_objects(&with_pvc_pool("Block"), &Settings::default()).unwrap();
        let pools_json: serde_json::Value =
            serde_json::from_str(&o.pools.data.as_ref().unwrap()["pools.json"]).unwrap();
        assert_eq!(pools_json[1]["mounted"], true);
    }

    #[test]
    fn only_the_reflink_snapshot_provider_is_accepted_and_others_are_named_with_their_pool() {
        let with = |providers: &[Option<&str>]| {
            let mut h = hpp(&[("a", "/a"), ("b", "/b"), ("c", "/c")]);
            for (p, provider) in h.spec.storage_pools.iter_mut().zip(providers) {
                p.snapshot_provider = provider.map(Into::into);
            }
            pools(&h)
        };
        let ok = with(&[Some("reflink"), None, Some("")]).unwrap();
        assert_eq!(ok[0].snapshot_provider.as_deref(), Some("reflink"));
        let e = with(&[Some("zfs"), Some("reflink"), Some("Reflink")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(r#"pool "a": snapshotProvider "zfs" is not supported"#),
            "{e}"
        );
        assert!(e.contains(r#"pool "c": snapshotProvider "Reflink""#), "{e}");
        assert!(!e.contains(r#"pool "b""#), "{e}");
        // reported with the other problems of the pools
        let mut h = hpp(&[("Bad_Name", "/x")]);
        h.spec.storage_pools[0].snapshot_provider = Some("lvm".into());
        let e = pools(&h).unwrap_err().to_string();
        assert!(
            e.contains("\"Bad_Name\" must be lowercase") && e.contains("\"lvm\""),
            "{e}"
        );
    }

    #[test]
    fn pool_names_are_checked_up_front_and_every_problem_named_once() {
        let mut hpp = HostPathProvisioner::new("hpp", Default::default());
        for (name, path) in [("Fast_Pool", "/a"), ("ok", "/b"), ("-x", "relative")] {
            hpp.spec.storage_pools.push(StoragePool {
                name: name.into(),
                path: path.into(),
                ..Default::default()
            });
        }
        let msg = pools(&hpp).unwrap_err().to_string();
        assert!(msg.contains("\"Fast_Pool\" must be lowercase"), "{msg}");
        assert!(msg.contains("\"-x\" must be lowercase"), "{msg}");
        assert!(msg.contains("not absolute"), "{msg}");
        assert!(!msg.contains("\"ok\""), "{msg}");
        assert!(msg.len() < 400, "{msg}");
        assert!(pool_name_ok("fast-1") && !pool_name_ok(&"a".repeat(59)));
    }

    #[test]
    fn one_storage_class_per_pool_with_the_hpp_names() {
        let o = driver_objects(
            &hpp(&[("local", "/var/hpvolumes"), ("fast", "/mnt/nvme")]),
            &Settings::default(),
        )
        .unwrap();
        let names: Vec<_> = o
            .storage_classes
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["hostpath-csi-local", "hostpath-csi-fast"]);
        for (sc, pool) in o.storage_classes.iter().zip(["local", "fast"]) {
            assert_eq!(sc.provisioner, "kubevirt.io.hostpath-provisioner");
            assert_eq!(
                sc.volume_binding_mode.as_deref(),
                Some("WaitForFirstConsumer")
            );
            assert_eq!(sc.parameters.as_ref().unwrap()["storagePool"], pool);
        }
        assert_eq!(o.csi_driver.spec.storage_capacity, Some(true));
        assert_eq!(o.csi_driver.spec.attach_required, Some(false));
        assert_eq!(
            o.csi_driver.metadata.owner_references.as_ref().unwrap()[0].uid,
            "hpp-uid"
        );
        let pools = &o.pools.data.as_ref().unwrap()["pools.json"];
        let parsed = provisioner::parse_pools(pools.trim()).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[1].path, std::path::PathBuf::from("/mnt/nvme"));
    }

    #[test]
    fn the_daemonset_runs_quarry_csi_and_its_sidecars_with_every_pool_mounted() {
        let mut h = hpp(&[("local", "/var/hpvolumes")]);
        h.spec.workload = Some(NodePlacement {
            node_selector: [("kubevirt.io/schedulable".to_string(), "true".to_string())].into(),
            ..Default::default()
        });
        let o = driver_objects(&h, &Settings::default()).unwrap();
        let pod = o.daemon_set.spec.unwrap().template.spec.unwrap();
        let names: Vec<_> = pod.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "quarry-csi",
                "node-driver-registrar",
                "csi-provisioner",
                "csi-snapshotter",
                "csi-resizer"
            ]
        );
        let args = |i: usize| pod.containers[i].args.clone().unwrap();
        assert!(args(3).contains(&"--node-deployment=true".to_string()));
        // gates for APIs that Kubernetes 1.28 does not serve stay off
        assert!(!(args(3).iter().chain(&args(4))).any(|a| a.starts_with("--feature-gates")));
        assert_eq!(pod.containers[0].args.as_ref().unwrap()[0], "csi");
        // The image runs as 107 by default; the driver needs root.
        let driver = pod.containers[0].security_context.clone().unwrap();
        assert_eq!(
            (driver.run_as_user, driver.privileged),
            (Some(0), Some(true))
        );
        assert!(
            pod.containers
                .iter()
                .all(|c| c.image_pull_policy.as_deref() == Some("IfNotPresent"))
        );
        let m = pod.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "pool-local")
            .unwrap();
        assert_eq!(
            (m.mount_path.as_str(), m.mount_propagation.as_deref()),
            ("/var/hpvolumes", Some("Bidirectional"))
        );
        assert_eq!(
            pod.node_selector.unwrap()["kubevirt.io/schedulable"],
            "true"
        );
        assert!(
            pod.containers[1].args.as_ref().unwrap()[1]
                .ends_with("/kubevirt.io.hostpath-provisioner/csi.sock")
        );
    }

    #[test]
    fn legacy_path_config_and_bad_pools() {
        let mut h = hpp(&[]);
        h.spec.path_config = Some(PathConfig {
            path: "/var/hpvolumes".into(),
            use_naming_prefix: None,
        });
        let o = driver_objects(&h, &Settings::default()).unwrap();
        assert_eq!(
            o.storage_classes[0].metadata.name.as_deref(),
            Some("hostpath-csi-legacy")
        );
        for (pools, needle) in [
            (vec![], "at least one"),
            (vec![("a", "relative")], "not absolute"),
            (vec![("a", "/x"), ("a", "/y")], "used twice"),
        ] {
            let e = driver_objects(&hpp(&pools), &Settings::default()).unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
        }
    }
}
