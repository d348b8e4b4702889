//! CDI's DataVolume admission (its `datavolume-validate` webhook), served by `quarry apiserver`
//! at [`api::names::webhook::DATAVOLUME_PATH`]:
//! - UPDATE: the spec may not change ("Cannot update DataVolume Spec", CDI's words), except the
//!   checkpoints of a multi-stage (vddk, imageio) import; metadata edits pass;
//! - CREATE: the name (at most 253 characters), a PVC of the same name that belongs to
//!   something else, and the spec, with the controller's own checks ([`super::validate`]).
//!
//! CDI's `datavolume-mutate` webhook, at [`api::names::webhook::DATAVOLUME_MUTATE_PATH`]:
//! - CREATE of a clone (`spec.source.pvc|snapshot`, or a `sourceRef` through its DataSource,
//!   [`clone_source`]): from another namespace, CDI's SubjectAccessReviews for the requesting
//!   user ([`authorize_clone`]), refused with CDI's message when denied; then the signed clone
//!   token is added ([`super::clone::token`]), which the controller checks. A `sourceRef` whose
//!   DataSource does not exist is refused (CDI answers NotFound).
//!
//! Unlike CDI, an UPDATE does not check an unchanged spec again: a DataVolume created before the
//! webhook was registered (or one Quarry cannot import) must still be able to lose its
//! finalizer, or it could never be deleted.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::Value;

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;

use super::clone::{clone_authorized, clone_reviews};
use super::source::CloneSourceKind;
use super::validate;
use crate::settings::Config;
use api::DataVolume;

/// CDI's message for a changed spec.
pub const SPEC_CHANGE_REFUSED: &str = "Cannot update DataVolume Spec";
pub use super::adopt::ANN_POPULATED_FOR;
/// Longest DataVolume name (a DNS-1123 subdomain, CDI's limit).
const MAX_NAME: usize = 253;

/// The PVC a CREATE must look up first (`namespace`, `name`): a DataVolume's PVC has its name.
pub fn target_pvc(req: &AdmissionRequest<DynamicObject>) -> Option<(String, String)> {
    if req.operation != Operation::Create {
        return None;
    }
    let obj = req.object.as_ref()?;
    let name = obj.metadata.name.clone().filter(|n| !n.is_empty())?;
    let namespace = obj
        .metadata
        .namespace
        .clone()
        .or_else(|| req.namespace.clone())?;
    Some((namespace, name))
}

/// The admission decision for one review. `existing_pvc` is the PVC [`target_pvc`] named, if it
/// exists.
pub fn review(
    req: &AdmissionRequest<DynamicObject>,
    existing_pvc: Option<&PersistentVolumeClaim>,
    cfg: &Config,
) -> AdmissionResponse {
    let resp = AdmissionResponse::from(req);
    let refused = match decide(req, existing_pvc, cfg) {
        Ok(()) => return resp,
        Err(causes) => causes,
    };
    // CDI answers 422 with every cause in the message.
    let mut resp = resp.deny(refused.join("; "));
    resp.result.code = 422;
    resp.result.reason = "Invalid".into();
    resp
}

fn decide(
    req: &AdmissionRequest<DynamicObject>,
    existing_pvc: Option<&PersistentVolumeClaim>,
    cfg: &Config,
) -> Result<(), Vec<String>> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Ok(());
    }
    let Some(obj) = &req.object else {
        return Err(vec!["the request carries no object".into()]);
    };
    if req.operation == Operation::Update {
        let old = req.old_object.as_ref().map(|o| &o.data["spec"]);
        return match old {
            Some(old) if !spec_changed(old, &obj.data["spec"]) => Ok(()),
            _ => Err(vec![SPEC_CHANGE_REFUSED.into()]),
        };
    }
    let dv: DataVolume = serde_json::to_value(obj)
        .and_then(serde_json::from_value)
        .map_err(|e| vec![format!("not a DataVolume: {e}")])?;
    let name = super::name(&dv);
    if name.len() > MAX_NAME {
        return Err(vec![format!(
            "Name of data volume cannot be more than {MAX_NAME} characters"
        )]);
    }
    if let Some(pvc) = existing_pvc
        && !prepared_for(pvc, name)
    {
        return Err(vec![format!(
            "Destination PVC {}/{name} already exists",
            pvc.metadata.namespace.as_deref().unwrap_or_default()
        )]);
    }
    validate(&dv, cfg)
}

/// Whether an existing PVC may become the DataVolume's: annotated as prepared for it, or
/// controlled by a DataVolume (CDI's rule).
fn prepared_for(pvc: &PersistentVolumeClaim, dv: &str) -> bool {
    let annotated = super::adopt::populated_for(pvc, dv);
    let owned = pvc
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "DataVolume");
    annotated || owned
}

/// Whether two specs differ as CDI compares them (Kubernetes' semantic equality: quantities by
/// value, absent and empty lists alike). Only the checkpoints of a multi-stage import may move.
fn spec_changed(old: &Value, new: &Value) -> bool {
    let (mut old, mut new) = (canonical(old), canonical(new));
    let multi_stage = |s: &Value| {
        s.get("checkpoints").is_some()
            && (s.pointer("/source/vddk").is_some() || s.pointer("/source/imageio").is_some())
    };
    if multi_stage(&new) {
        for s in [&mut old, &mut new] {
            if let Some(m) = s.as_object_mut() {
                m.remove("checkpoints");
                m.remove("finalCheckpoint");
            }
        }
    }
    old != new
}

/// `v` without nulls and empty lists, and with resource quantities as byte counts.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("requests" | "limits", Value::Object(q)) => {
                            Value::Object(q.iter().map(|(r, q)| (r.clone(), quantity(q))).collect())
                        }
                        _ => canonical(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

fn quantity(q: &Value) -> Value {
    q.as_str()
        .and_then(|s| quantity::parse(s).ok())
        .map_or_else(|| q.clone(), Value::from)
}

/// What a new DataVolume clones, as the mutating webhook resolves it: (kind, namespace, name),
/// the namespace filled in. A `spec.sourceRef` goes through its DataSource (`data_source` gives
/// those the webhook read), whether Ready or not, one DataSource-to-DataSource step deep as the
/// controller follows it. `Ok(None)`: it clones nothing (an import, or a DataSource without a
/// source yet: CDI adds no token then). `Err`: a DataSource named does not exist, with the API
/// server's NotFound message (CDI's webhook refuses with it).
pub fn clone_source<'a>(
    dv: &DataVolume,
    request_namespace: &str,
    data_source: impl Fn(&str, &str) -> Option<&'a api::DataSource>,
) -> Result<Option<(CloneSourceKind, String, String)>, String> {
    let ns = dv
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| request_namespace.to_string());
    let in_ns = |at: &str, p: &api::datavolume::SourcePvc| {
        let pns = if p.namespace.is_empty() {
            at
        } else {
            p.namespace.as_str()
        };
        (pns.to_string(), p.name.clone())
    };
    let (kind, (source_ns, name)) = match (&dv.spec.source, &dv.spec.source_ref) {
        (Some(src), _) => match (&src.pvc, &src.snapshot) {
            (Some(p), _) => (CloneSourceKind::Pvc, in_ns(&ns, p)),
            (None, Some(p)) => (CloneSourceKind::Snapshot, in_ns(&ns, p)),
            (None, None) => return Ok(None),
        },
        (None, Some(r)) if r.kind == "DataSource" => {
            let not_found = |ns: &str, n: &str| {
                format!("datasources.cdi.kubevirt.io \"{n}\" not found (in namespace {ns})")
            };
            let mut at = (
                r.namespace.clone().unwrap_or_else(|| ns.clone()),
                r.name.clone(),
            );
            let mut ds = data_source(&at.0, &at.1).ok_or_else(|| not_found(&at.0, &at.1))?;
            if let Some(next) = &ds.spec.source.data_source {
                at = in_ns(&at.0, next);
                ds = data_source(&at.0, &at.1).ok_or_else(|| not_found(&at.0, &at.1))?;
            }
            match (&ds.spec.source.pvc, &ds.spec.source.snapshot) {
                (Some(p), _) => (CloneSourceKind::Pvc, in_ns(&at.0, p)),
                (None, Some(p)) => (CloneSourceKind::Snapshot, in_ns(&at.0, p)),
                (None, None) => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    Ok(Some((kind, source_ns, name)))
}

/// Sends CDI's clone SubjectAccessReviews ([`clone_reviews`]) for `user` and decides
/// ([`clone_authorized`]): `Ok(Err(message))` when the user may not clone the source.
pub async fn authorize_clone(
    client: &kube::Client,
    (kind, namespace, name): (CloneSourceKind, &str, &str),
    user: &UserInfo,
) -> kubekit::error::Result<Result<(), String>> {
    let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
    let reviews = clone_reviews(kind, namespace, name, user);
    let allowed = |r: SubjectAccessReview| r.status.is_some_and(|s| s.allowed);
    let pp = kube::api::PostParams::default();
    if allowed(api.create(&pp, &reviews.explicit).await?) {
        return Ok(Ok(()));
    }
    let mut implicit = Vec::new();
    for r in &reviews.implicit {
        implicit.push(allowed(api.create(&pp, r).await?));
    }
    Ok(clone_authorized(false, &implicit, user, namespace))
}

/// The refusal of an unauthorized clone (CDI's: 422 Invalid, the reason as message).
pub fn refuse_clone(req: &AdmissionRequest<DynamicObject>, message: String) -> AdmissionResponse {
    let mut resp = AdmissionResponse::from(req).deny(message);
    resp.result.code = 422;
    resp.result.reason = "Invalid".into();
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(op: &str, object: Value, old: Option<Value>) -> AdmissionRequest<DynamicObject> {
        let review: kube::core::admission::AdmissionReview<DynamicObject> =
            serde_json::from_value(json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u1",
                    "kind": {"group": "cdi.kubevirt.io", "version": "v1beta1", "kind": "DataVolume"},
                    "resource": {"group": "cdi.kubevirt.io", "version": "v1beta1", "resource": "datavolumes"},
                    "name": "fedora", "namespace": "vms", "operation": op,
                    "userInfo": {}, "dryRun": false, "object": object, "oldObject": old}
            }))
            .unwrap();
        review.try_into().unwrap()
    }

    fn dv(url: &str, size: &str) -> Value {
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
               "metadata": {"name": "fedora", "namespace": "vms"},
               "spec": {"source": {"http": {"url": url}},
                        "storage": {"resources": {"requests": {"storage": size}}}}})
    }

    fn refusal(r: &AdmissionResponse) -> Option<(&str, u16)> {
        (!r.allowed).then_some((r.result.message.as_str(), r.result.code))
    }

    fn update(old: Value, new: Value) -> AdmissionResponse {
        review(&request("UPDATE", new, Some(old)), None, &Config::default())
    }

    const URL: &str = "https://images.example/fedora.qcow2";

    #[test]
    fn a_changed_spec_is_refused_with_cdis_message() {
        let old = dv(URL, "1Gi");
        for new in [
            dv("https://images.example/other.qcow2", "1Gi"),
            dv(URL, "2Gi"),
            {
                let mut v = dv(URL, "1Gi");
                v["spec"]["preallocation"] = json!(true);
                v
            },
        ] {
            assert_eq!(
                refusal(&update(old.clone(), new)),
                Some((SPEC_CHANGE_REFUSED, 422))
            );
        }
    }

    #[test]
    fn metadata_edits_and_semantically_equal_specs_pass() {
        let old = dv(URL, "1Gi");
        let mut labelled = old.clone();
        labelled["metadata"]["labels"] = json!({"team": "storage"});
        labelled["metadata"]["finalizers"] = json!([]);
        assert!(update(old.clone(), labelled).allowed);
        // 1Gi written out in bytes, an empty list for an absent one, a null field.
        let mut same = dv(URL, "1073741824");
        same["spec"]["checkpoints"] = json!([]);
        same["spec"]["priorityClassName"] = Value::Null;
        assert!(update(old.clone(), same).allowed);
        // Even a spec Quarry cannot import may lose its finalizer.
        let bad = dv("ftp://x", "1Gi");
        assert!(update(bad.clone(), bad).allowed);
    }

    #[test]
    fn multi_stage_checkpoints_may_move() {
        let stage = |checkpoints: Value, last: bool| {
            json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                   "metadata": {"name": "fedora", "namespace": "vms"},
                   "spec": {"source": {"vddk": {"url": "https://vcenter"}},
                            "checkpoints": checkpoints, "finalCheckpoint": last,
                            "storage": {"resources": {"requests": {"storage": "1Gi"}}}}})
        };
        let one = json!([{"previous": "", "current": "s1"}]);
        let two = json!([{"previous": "", "current": "s1"}, {"previous": "s1", "current": "s2"}]);
        assert!(update(stage(one.clone(), false), stage(two, true)).allowed);
        // Not for an import without checkpoints.
        let mut http = dv(URL, "1Gi");
        http["spec"]["finalCheckpoint"] = json!(true);
        assert!(!update(dv(URL, "1Gi"), http).allowed);
    }

    #[test]
    fn create_runs_the_controllers_validation() {
        let create = |v: Value, pvc: Option<&PersistentVolumeClaim>| {
            review(&request("CREATE", v, None), pvc, &Config::default())
        };
        assert!(create(dv(URL, "1Gi"), None).allowed);
        let bad = create(dv("ftp://images.example/x", "0"), None);
        let (msg, code) = refusal(&bad).unwrap();
        assert_eq!(code, 422);
        // Both problems, each once.
        assert!(
            msg.contains("must start with http:// or https://")
                && msg.contains("must be greater than 0"),
            "{msg}"
        );
        let mut long = dv(URL, "1Gi");
        long["metadata"]["name"] = json!("a".repeat(254));
        assert!(
            refusal(&create(long, None))
                .unwrap()
                .0
                .contains("cannot be more than 253")
        );
        let mut two_modes = dv(URL, "1Gi");
        two_modes["spec"] = json!({"source": {"blank": {}},
            "pvc": {"accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                    "resources": {"requests": {"storage": "1Gi"}}}});
        assert!(
            refusal(&create(two_modes, None))
                .unwrap()
                .0
                .contains("exactly one access mode")
        );
    }

    /// CDI's `source.gcs`: a `gs://` or `http(s)://HOST/BUCKET/OBJECT` URL is admitted (with or
    /// without a Secret), any other scheme refused with the schemes named.
    #[test]
    fn a_gcs_source_is_admitted_and_its_url_checked() {
        let gcs = |gcs: Value| {
            let mut v = dv(URL, "1Gi");
            v["spec"]["source"] = json!({ "gcs": gcs });
            review(&request("CREATE", v, None), None, &Config::default())
        };
        for source in [
            json!({"url": "gs://images/fedora.qcow2", "secretRef": "sa-key"}),
            json!({"url": "https://storage.googleapis.com/images/fedora.qcow2"}),
        ] {
            let r = gcs(source.clone());
            assert!(r.allowed, "{source}: {:?}", refusal(&r));
        }
        let refused = gcs(json!({"url": "s3://images/fedora.qcow2"}));
        let (msg, code) = refusal(&refused).unwrap();
        assert_eq!(code, 422);
        assert!(
            msg.contains("must start with gs:// or http:// or https://"),
            "{msg}"
        );
        let both = {
            let mut v = dv(URL, "1Gi");
            v["spec"]["source"]["gcs"] = json!({"url": "gs://images/fedora.qcow2"});
            review(&request("CREATE", v, None), None, &Config::default())
        };
        assert!(refusal(&both).unwrap().0.contains("exactly one"));
    }

    #[test]
    fn a_pvc_of_the_same_name_must_be_prepared_for_the_datavolume() {
        let pvc = |annotations: Value, owner: Option<&str>| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": {"name": "fedora", "namespace": "vms",
                "annotations": annotations,
                "ownerReferences": owner.map(|k| vec![json!({"apiVersion": "v1", "kind": k,
                    "name": "fedora", "uid": "u", "controller": true})])}}))
            .unwrap()
        };
        let req = request("CREATE", dv(URL, "1Gi"), None);
        assert_eq!(target_pvc(&req), Some(("vms".into(), "fedora".into())));
        let cfg = Config::default();
        let foreign = pvc(json!({}), None);
        assert_eq!(
            refusal(&review(&req, Some(&foreign), &cfg)).unwrap().0,
            "Destination PVC vms/fedora already exists"
        );
        let not_a_dv = pvc(json!({}), Some("StatefulSet"));
        assert!(!review(&req, Some(&not_a_dv), &cfg).allowed);
        let prepared = pvc(json!({ANN_POPULATED_FOR: "fedora"}), None);
        assert!(review(&req, Some(&prepared), &cfg).allowed);
        let owned = pvc(json!({}), Some("DataVolume"));
        assert!(review(&req, Some(&owned), &cfg).allowed);
        // UPDATEs look nothing up.
        assert_eq!(
            target_pvc(&request("UPDATE", dv(URL, "1Gi"), Some(dv(URL, "1Gi")))),
            None
        );
    }

    fn clone_dv(source: Value) -> DataVolume {
        serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "vm", "namespace": "vms"},
            "spec": {"source": source, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}))
        .unwrap()
    }

    #[test]
    fn pvc_and_snapshot_sources_are_admitted() {
        for src in [
            json!({"pvc": {"namespace": "golden", "name": "fedora"}}),
            json!({"snapshot": {"namespace": "vms", "name": "fedora-snap"}}),
        ] {
            let obj = serde_json::to_value(clone_dv(src)).unwrap();
            let r = review(&request("CREATE", obj, None), None, &Config::default());
            assert_eq!(refusal(&r), None);
        }
    }

    #[test]
    fn pvc_and_snapshot_sources_are_resolved_in_their_namespace() {
        let none = |_: &str, _: &str| None;
        let other = clone_dv(json!({"pvc": {"namespace": "golden", "name": "fedora"}}));
        assert_eq!(
            clone_source(&other, "vms", none),
            Ok(Some((
                CloneSourceKind::Pvc,
                "golden".into(),
                "fedora".into()
            )))
        );
        let same = clone_dv(json!({"snapshot": {"namespace": "", "name": "fedora-snap"}}));
        assert_eq!(
            clone_source(&same, "vms", none),
            Ok(Some((
                CloneSourceKind::Snapshot,
                "vms".into(),
                "fedora-snap".into()
            )))
        );
        let import = clone_dv(json!({"http": {"url": URL}}));
        assert_eq!(clone_source(&import, "vms", none), Ok(None));
    }

    fn data_source(name: &str, source: Value) -> api::DataSource {
        serde_json::from_value(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
            "metadata": {"name": name, "namespace": "golden"},
            "spec": {"source": source}
        }))
        .unwrap()
    }

    #[test]
    fn a_source_ref_resolves_through_its_data_source_ready_or_not() {
        let mut dv = clone_dv(json!({"blank": {}}));
        dv.spec.source = None;
        dv.spec.source_ref = Some(api::datavolume::DataVolumeSourceRef {
            kind: "DataSource".into(),
            namespace: Some("golden".into()),
            name: "fedora".into(),
        });
        let snap = data_source(
            "fedora",
            json!({"snapshot": {"namespace": "", "name": "fedora-v1"}}),
        );
        let found = |ns: &str, n: &str| (ns == "golden" && n == "fedora").then_some(&snap);
        assert_eq!(
            clone_source(&dv, "vms", found),
            Ok(Some((
                CloneSourceKind::Snapshot,
                "golden".into(),
                "fedora-v1".into()
            )))
        );
        // One step to another DataSource, as the controller follows it.
        let alias = data_source(
            "fedora",
            json!({"dataSource": {"namespace": "", "name": "fedora-latest"}}),
        );
        let latest = data_source(
            "fedora-latest",
            json!({"pvc": {"namespace": "", "name": "fedora-v2"}}),
        );
        let found = |_: &str, n: &str| match n {
            "fedora" => Some(&alias),
            "fedora-latest" => Some(&latest),
            _ => None,
        };
        assert_eq!(
            clone_source(&dv, "vms", found),
            Ok(Some((
                CloneSourceKind::Pvc,
                "golden".into(),
                "fedora-v2".into()
            )))
        );
        // A DataSource without a source yet: nothing to authorize or sign (CDI's noClone).
        let empty = data_source("fedora", json!({}));
        assert_eq!(clone_source(&dv, "vms", |_, _| Some(&empty)), Ok(None));
    }

    #[test]
    fn a_source_ref_to_a_missing_data_source_is_refused_as_not_found() {
        let mut dv = clone_dv(json!({"blank": {}}));
        dv.spec.source = None;
        dv.spec.source_ref = Some(api::datavolume::DataVolumeSourceRef {
            kind: "DataSource".into(),
            namespace: None,
            name: "fedora".into(),
        });
        assert_eq!(
            clone_source(&dv, "vms", |_, _| None),
            Err(r#"datasources.cdi.kubevirt.io "fedora" not found (in namespace vms)"#.into())
        );
    }
}
