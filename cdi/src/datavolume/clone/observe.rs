//! What the controller reads for a clone ([`CloneObserved`]): the source PVC or snapshot, the
//! smart clone's temporary snapshot, the clone source and resize pods, and the strategy facts
//! (CDI CR override, StorageProfile, StorageClasses, VolumeSnapshotClasses); and the clone
//! source pod's client certificate, issued as the upload proxy's is.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};

use super::flow::CloneObserved;
use super::objects::{self as objects};
use super::{CloneFacts, Strategy};
use crate::datavolume::source::CloneSource;
use crate::datavolume::source::CloneSourceKind;
use api::names::secret;
use api::snapshot::{self, VolumeSnapshot};
use api::{Cdi, DataVolume, StorageProfile};
use certs::{self, pki, plan};
use kubekit::error::{Error, Result};
use kubekit::kubeops;

/// The default VolumeSnapshotClass annotation.
const ANN_DEFAULT_SNAPSHOT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
/// How long a clone source pod's client certificate is valid (a clone runs minutes to hours).
const CLIENT_CERT_LIFETIME: i64 = 24 * 3600;

/// Reads what a clone of `c` into `dv` (target PVC `target`, of StorageClass `target_class`)
/// needs.
/// The node a snapshot's data is on (where a node-local driver restores it): the selected node
/// of the PVC it was taken of while that PVC exists, else the node Quarry recorded on the
/// snapshot when it took it (a DataImportCron deletes its import once the snapshot is ready).
pub(crate) async fn snapshot_node(
    client: &Client,
    ns: &str,
    snap: &VolumeSnapshot,
) -> Result<Option<String>> {
    if let Some(origin) = &snap.spec.source.persistent_volume_claim_name {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        let node = kubeops::get(&api, origin).await?;
        if let Some(node) = node.as_ref().and_then(objects::node_of) {
            return Ok(Some(node.to_string()));
        }
    }
    Ok(snap.annotations().get(snapshot::ANN_SOURCE_NODE).cloned())
}

pub async fn observe(
    client: &Client,
    dv: &DataVolume,
    c: &CloneSource,
    target: Option<&PersistentVolumeClaim>,
    target_class: Option<&str>,
) -> Result<CloneObserved> {
    let dv_ns = dv.namespace().unwrap_or_default();
    let src_ns = c.namespace_or(&dv_ns).to_string();
    let mut o = CloneObserved::default();
    match c.kind {
        CloneSourceKind::Pvc => {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &src_ns);
            o.source_pvc = kubeops::get(&api, &c.name).await?;
            let api: Api<VolumeSnapshot> = Api::namespaced(client.clone(), &dv_ns);
            o.temp_snapshot = kubeops::get(&api, &objects::temp_snapshot_name(dv))
                .await
                .unwrap_or(None);
        }
        CloneSourceKind::Snapshot => {
            let api: Api<VolumeSnapshot> = Api::namespaced(client.clone(), &src_ns);
            o.source_snapshot = kubeops::get(&api, &c.name).await?;
            if let Some(s) = &o.source_snapshot {
                o.snapshot_node = snapshot_node(client, &src_ns, s).await?;
            }
            // A host-assisted copy of a snapshot reads it restored (its target records the
            // strategy: nothing to read before).
            if target.and_then(|t| t.annotations().get(objects::ANN_CLONE_TYPE))
                == Some(&Strategy::HostAssisted.as_str().to_string())
            {
                let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &src_ns);
                o.restore = kubeops::get(&pvcs, &objects::restore_name(dv)).await?;
                if o.restore.is_none()
                    && let Some(s) = &o.source_snapshot
                {
                    o.restore_class = restore_class(client, s, target_class).await?;
                }
            }
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &dv_ns);
    o.resize_pod = kubeops::get(&pods, &objects::resize_pod_name(dv)).await?;
    if let Some(uid) = target.and_then(|t| t.metadata.uid.as_deref()) {
        let src_pods: Api<Pod> = Api::namespaced(client.clone(), &src_ns);
        o.source_pod = kubeops::get(&src_pods, &objects::source_pod_name(uid)).await?;
    }
    if target.is_none() {
        o.facts = facts(client, &o, target_class).await?;
    }
    Ok(o)
}

async fn facts(
    client: &Client,
    o: &CloneObserved,
    target_class: Option<&str>,
) -> Result<CloneFacts> {
    let classes: Api<StorageClass> = Api::all(client.clone());
    let mut f = CloneFacts::default();
    if let Some(class) = target_class {
        if let Some(sc) = kubeops::get(&classes, class).await? {
            f.target_driver = Some(sc.provisioner);
            f.allow_expansion = sc.allow_volume_expansion == Some(true);
        }
        let profiles: Api<StorageProfile> = Api::all(client.clone());
        f.profile_strategy = kubeops::get(&profiles, class)
            .await?
            .and_then(|p| p.status?.profile.clone_strategy);
    }
    let cdis: Api<Cdi> = Api::all(client.clone());
    f.global_override = cdis
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find_map(|c| c.spec.clone_strategy_override);
    let snapshot_classes = snapshot_classes(client).await;
    f.source_driver = match (&o.source_pvc, &o.source_snapshot) {
        (Some(p), _) => match p
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
        {
            Some(class) => kubeops::get(&classes, class).await?.map(|c| c.provisioner),
            None => None,
        },
        (None, Some(s)) => s.spec.volume_snapshot_class_name.as_ref().and_then(|n| {
            snapshot_classes
                .iter()
                .find(|c| &c.name_any() == n)
                .and_then(driver)
        }),
        (None, None) => None,
    };
    f.snapshot_class = f.source_driver.as_deref().and_then(|d| {
        let of_driver: Vec<_> = snapshot_classes
            .iter()
            .filter(|c| driver(c).as_deref() == Some(d))
            .collect();
        let default = of_driver.iter().find(|c| {
            c.annotations()
                .get(ANN_DEFAULT_SNAPSHOT_CLASS)
                .is_some_and(|v| v == "true")
        });
        default.or(of_driver.first()).map(|c| c.name_any())
    });
    Ok(f)
}

/// A StorageClass of `snap`'s driver to restore it with: the target's when it is one (CDI picks
/// the first of the driver's).
async fn restore_class(
    client: &Client,
    snap: &VolumeSnapshot,
    target_class: Option<&str>,
) -> Result<Option<String>> {
    let snapshot_classes = snapshot_classes(client).await;
    let Some(driver) = snap.spec.volume_snapshot_class_name.as_ref().and_then(|n| {
        snapshot_classes
            .iter()
            .find(|c| &c.name_any() == n)
            .and_then(driver)
    }) else {
        return Ok(None);
    };
    let classes: Api<StorageClass> = Api::all(client.clone());
    let mut of_driver: Vec<String> = classes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.provisioner == driver)
        .map(|c| c.name_any())
        .collect();
    of_driver.sort();
    Ok(match target_class {
        Some(t) if of_driver.iter().any(|c| c == t) => Some(t.to_string()),
        _ => of_driver.into_iter().next(),
    })
}

/// The VolumeSnapshotClasses (none when the cluster does not serve the snapshot API).
pub(crate) async fn snapshot_classes(client: &Client) -> Vec<DynamicObject> {
    let gvk = GroupVersionKind::gvk(snapshot::GROUP, "v1", "VolumeSnapshotClass");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "volumesnapshotclasses");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    match api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => {
            tracing::debug!("no VolumeSnapshotClasses: {e}");
            Vec::new()
        }
    }
}

fn driver(c: &DynamicObject) -> Option<String> {
    c.data.get("driver")?.as_str().map(String::from)
}

/// Makes sure the clone source pod's client certificate Secret `meta` (made by
/// [`objects::client_secret_meta`], in the source namespace) exists: a certificate the upload
/// server accepts, issued from the cert controller's upload server client signer in `signer_ns`
/// (the upload proxy's client certificate comes from it too), with the upload server signer's
/// bundle as `ca.crt`. Returns the Secret's name.
pub async fn ensure_client_secret(
    client: &Client,
    meta: ObjectMeta,
    signer_ns: &str,
    manager: &str,
) -> Result<String> {
    let secret_name = meta.name.clone().unwrap_or_default();
    let src_ns = meta.namespace.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &src_ns);
    if kubeops::get(&secrets, &secret_name).await?.is_some() {
        return Ok(secret_name);
    }
    let missing = |what: &str| {
        Error::Certificate(format!(
            "{signer_ns}/{what} is missing or incomplete (is the cert controller running?)"
        ))
    };
    let install: Api<Secret> = Api::namespaced(client.clone(), signer_ns);
    let signer = kubeops::get(&install, secret::UPLOAD_SERVER_CLIENT_SIGNER)
        .await?
        .and_then(|s| {
            let mut data = certs::text_data(&s);
            Some(pki::Pair {
                cert: data.remove(plan::TLS_CRT)?,
                key: data.remove(plan::TLS_KEY)?,
            })
        })
        .ok_or_else(|| missing(secret::UPLOAD_SERVER_CLIENT_SIGNER))?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), signer_ns);
    let server_bundle = kubeops::get(&maps, secret::UPLOAD_SERVER_SIGNER_BUNDLE)
        .await?
        .and_then(|cm| cm.data?.remove(secret::BUNDLE_KEY))
        .ok_or_else(|| missing(secret::UPLOAD_SERVER_SIGNER_BUNDLE))?;
    let now = token::now();
    let usage = pki::Usage::Client(plan::UPLOAD_PROXY_CLIENT_NAME.into());
    let made = pki::make_signed(&signer, &usage, now, now + CLIENT_CERT_LIFETIME)?;
    let data = BTreeMap::from([
        (plan::TLS_CRT.to_string(), made.cert),
        (plan::TLS_KEY.to_string(), made.key),
        ("ca.crt".to_string(), server_bundle),
    ]);
    let s = Secret {
        metadata: meta,
        type_: Some(plan::TYPE_TLS.into()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    };
    kubeops::create(&secrets, &s, manager).await?;
    tracing::info!(secret = %format!("{src_ns}/{secret_name}"),
        "clone source client certificate issued");
    Ok(secret_name)
}
