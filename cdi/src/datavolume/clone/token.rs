//! CDI's clone token: after the DataVolume mutating webhook has authorized a clone, it puts a
//! PS256 token signed with the upload token key on the new DataVolume
//! ([`ANN_CLONE_TOKEN`]): operation `Clone`, the source as `namespace`/`name`/`resource`, the
//! target in `params` (`targetNamespace`, `targetName`). The DataVolume controller clones from
//! another namespace only with such a token ([`check`]), so a DataVolume created while the
//! webhook was not registered, or edited afterwards to name another source, clones nothing.
//!
//! Where Quarry differs from CDI: CDI checks the token's 5-minute expiry when it creates the
//! target PVC and then keeps a long-lived token of its own on the PVC. Quarry binds the token
//! to the DataVolume's creation instead: it must have been issued (`iat`) while that very object
//! was admitted (within [`ISSUE_WINDOW`] seconds before its `creationTimestamp`, which the API
//! server sets). A token copied from an older DataVolume of the same name is refused, and a
//! clone that waits for its source longer than 5 minutes still starts.

use std::collections::BTreeMap;
use std::time::Duration;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use token::{self, Claims, OPERATION_CLONE, PublicKey, Resource};

use crate::datavolume::source::CloneSource;
use crate::datavolume::source::CloneSourceKind;
use api::DataVolume;

/// The DataVolume annotation holding the token (CDI's `AnnCloneToken`).
pub const ANN_CLONE_TOKEN: &str = "cdi.kubevirt.io/storage.clone.token";
/// CDI's reason when a clone fails its validation.
pub const CLONE_VALIDATION_FAILED: &str = "CloneValidationFailed";
/// CDI's message for it; Quarry adds why.
pub const CLONE_VALIDATION_FAILED_MESSAGE: &str =
    "The clone doesn't meet the validation requirements";
/// Seconds a token may be issued before its DataVolume's `creationTimestamp` (the admission
/// chain runs between; webhooks time out after at most 30 s).
pub const ISSUE_WINDOW: i64 = 60;
/// The token's lifetime (CDI's, 5 minutes).
pub const TTL: Duration = Duration::from_secs(5 * 60);

const TARGET_NAMESPACE: &str = "targetNamespace";
const TARGET_NAME: &str = "targetName";

/// The resource a token names for a source kind (CDI's token resources).
pub fn resource(kind: CloneSourceKind) -> Resource {
    let (group, resource) = match kind {
        CloneSourceKind::Pvc => ("", token::RESOURCE_PVC),
        CloneSourceKind::Snapshot => ("snapshot.storage.k8s.io", "volumesnapshots"),
    };
    Resource {
        group: group.into(),
        version: "v1".into(),
        resource: resource.into(),
    }
}

/// The claims the webhook signs: a clone of `source` (namespace, name) into DataVolume
/// `target` (namespace, name), issued at `now`.
pub fn claims(
    kind: CloneSourceKind,
    source: (&str, &str),
    target: (&str, &str),
    now: i64,
) -> Claims {
    let mut c = Claims::issued(OPERATION_CLONE, source, resource(kind), now, TTL);
    c.params = BTreeMap::from([
        (TARGET_NAMESPACE.into(), target.0.into()),
        (TARGET_NAME.into(), target.1.into()),
    ]);
    c
}

/// The JSON patch that adds `token` to the DataVolume `dv` (its annotations may be absent).
pub fn patch(dv: &DataVolume, token: String) -> Patch {
    let has_annotations = dv
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| !a.is_empty());
    let (path, value) = if has_annotations {
        (
            PointerBuf::from_tokens(["metadata", "annotations", ANN_CLONE_TOKEN]),
            serde_json::Value::String(token),
        )
    } else {
        (
            PointerBuf::from_tokens(["metadata", "annotations"]),
            serde_json::json!({ ANN_CLONE_TOKEN: token }),
        )
    };
    Patch(vec![PatchOperation::Add(AddOperation { path, value })])
}

/// Whether a clone of `src` into `dv` may go ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenCheck {
    /// Source and target share a namespace: no token is needed (CDI's rule).
    NotNeeded,
    /// The token names this source and target and was issued for this DataVolume.
    Valid,
    /// Refused, with why.
    Refused(String),
}

/// Checks the token of `dv` for a clone of `src` with `key` (CDI's ValidateCloneTokenDV, with
/// the issue time bound to the DataVolume's creation instead of the expiry: see the module).
pub fn check(dv: &DataVolume, src: &CloneSource, key: Option<&PublicKey>) -> TokenCheck {
    let dv_ns = dv.metadata.namespace.as_deref().unwrap_or_default();
    let src_ns = src.namespace_or(dv_ns);
    if src_ns == dv_ns {
        return TokenCheck::NotNeeded;
    }
    let refused = |why: String| TokenCheck::Refused(why);
    let Some(t) = dv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_CLONE_TOKEN))
    else {
        return refused("clone token missing".into());
    };
    let Some(key) = key else {
        return refused(
            "no key to check clone tokens with (the controller's --clone-token-public-key)".into(),
        );
    };
    let c = match token::verify_signed(t, key) {
        Ok(c) => c,
        Err(e) => return refused(format!("error verifying token: {e}")),
    };
    let param = |k: &str| c.params.get(k).map(String::as_str).unwrap_or_default();
    let want = resource(src.kind);
    let mismatch = if c.iss != token::ISSUER {
        Some(format!("issuer {:?}", c.iss))
    } else if c.operation != OPERATION_CLONE {
        Some(format!("operation {:?}", c.operation))
    } else if (c.namespace.as_str(), c.name.as_str()) != (src_ns, src.name.as_str())
        || c.resource.resource != want.resource
    {
        Some(format!(
            "it names {} {}/{}, not {} {src_ns}/{}",
            c.resource.resource, c.namespace, c.name, want.resource, src.name
        ))
    } else if (param(TARGET_NAMESPACE), param(TARGET_NAME)) != (dv_ns, crate::datavolume::name(dv))
    {
        Some(format!(
            "it is for target {}/{}",
            param(TARGET_NAMESPACE),
            param(TARGET_NAME)
        ))
    } else {
        None
    };
    if let Some(why) = mismatch {
        return refused(format!("invalid token: {why}"));
    }
    let Some(created) = dv
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
    else {
        return refused("the DataVolume has no creationTimestamp".into());
    };
    if c.iat < created - ISSUE_WINDOW || c.iat > created + token::LEEWAY_SECONDS {
        return refused(format!(
            "invalid token: issued at {}, not when the DataVolume was created ({created})",
            c.iat
        ));
    }
    TokenCheck::Valid
}

/// Keys and signed DataVolumes for the controller's tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::OnceLock;

    use super::*;
    use token::PrivateKey;

    /// The creation time [`sign_for`] gives a DataVolume without one.
    pub const CREATED: i64 = 1_800_000_000;

    /// Two key pairs (key generation is slow: made once).
    pub fn keys() -> &'static (PrivateKey, PrivateKey) {
        static KEYS: OnceLock<(PrivateKey, PrivateKey)> = OnceLock::new();
        let key = || token::private_key_from_pem(&token::generate().unwrap().0, "test").unwrap();
        KEYS.get_or_init(|| (key(), key()))
    }

    /// The controller settings that check tokens with the first key.
    pub fn config() -> crate::settings::Config {
        crate::settings::Config {
            clone_token_key: Some(keys().0.to_public_key()),
            ..Default::default()
        }
    }

    /// Gives `dv` (created at [`CREATED`] unless it says) the webhook's token for `source`.
    pub fn sign_for(dv: &mut DataVolume, kind: CloneSourceKind, source: (&str, &str)) {
        let created = k8s_openapi::jiff::Timestamp::from_second(CREATED).unwrap();
        let at = dv
            .metadata
            .creation_timestamp
            .get_or_insert(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                created,
            ))
            .0
            .as_second();
        let target = (
            dv.metadata.namespace.clone().unwrap_or_default(),
            crate::datavolume::name(dv).to_string(),
        );
        let c = claims(kind, source, (&target.0, &target.1), at);
        let t = token::sign(&c, &keys().0).unwrap();
        dv.metadata
            .annotations
            .get_or_insert_default()
            .insert(ANN_CLONE_TOKEN.into(), t);
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{CREATED, keys};
    use super::*;

    fn dv(token: Option<String>) -> DataVolume {
        let created = k8s_openapi::jiff::Timestamp::from_second(CREATED).unwrap();
        let mut dv: DataVolume = serde_json::from_value(serde_json::json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "vm", "namespace": "vms", "creationTimestamp": created.to_string()},
            "spec": {"source": {"pvc": {"namespace": "golden", "name": "fedora"}},
                     "storage": {"resources": {"requests": {"storage": "1Gi"}}}}
        }))
        .unwrap();
        if let Some(t) = token {
            dv.metadata
                .annotations
                .get_or_insert_default()
                .insert(ANN_CLONE_TOKEN.into(), t);
        }
        dv
    }

    fn src(ns: &str, name: &str) -> CloneSource {
        CloneSource {
            kind: CloneSourceKind::Pvc,
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn signed(c: &Claims) -> String {
        token::sign(c, &keys().0).unwrap()
    }

    fn good(at: i64) -> Claims {
        claims(
            CloneSourceKind::Pvc,
            ("golden", "fedora"),
            ("vms", "vm"),
            at,
        )
    }

    fn check_with(t: Option<String>, s: &CloneSource) -> TokenCheck {
        check(&dv(t), s, Some(&keys().0.to_public_key()))
    }

    fn refused(r: TokenCheck) -> String {
        match r {
            TokenCheck::Refused(why) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_clone_within_its_namespace_needs_no_token() {
        assert_eq!(
            check_with(None, &src("vms", "fedora")),
            TokenCheck::NotNeeded
        );
        assert_eq!(check_with(None, &src("", "fedora")), TokenCheck::NotNeeded);
    }

    #[test]
    fn a_token_issued_at_admission_for_this_source_and_target_is_valid() {
        let s = src("golden", "fedora");
        assert_eq!(
            check_with(Some(signed(&good(CREATED))), &s),
            TokenCheck::Valid
        );
        // Issued a little before the object was stored, long expired now: still this object's.
        assert_eq!(
            check_with(Some(signed(&good(CREATED - 30))), &s),
            TokenCheck::Valid
        );
    }

    #[test]
    fn a_missing_token_or_key_is_refused() {
        let s = src("golden", "fedora");
        assert_eq!(refused(check_with(None, &s)), "clone token missing");
        let r = check(&dv(Some(signed(&good(CREATED)))), &s, None);
        assert!(refused(r).contains("--clone-token-public-key"));
    }

    #[test]
    fn another_key_or_garbage_is_refused() {
        let s = src("golden", "fedora");
        let other = token::sign(&good(CREATED), &keys().1).unwrap();
        assert!(refused(check_with(Some(other), &s)).starts_with("error verifying token"));
        assert!(refused(check_with(Some("x.y".into()), &s)).starts_with("error verifying token"));
    }

    #[test]
    fn a_token_for_another_source_or_target_is_refused() {
        let t = Some(signed(&good(CREATED)));
        // The DataVolume was edited to name another source.
        let why = refused(check_with(t.clone(), &src("golden", "rhel")));
        assert!(
            why.contains("names persistentvolumeclaims golden/fedora"),
            "{why}"
        );
        let snap = CloneSource {
            kind: CloneSourceKind::Snapshot,
            ..src("golden", "fedora")
        };
        assert!(refused(check_with(t, &snap)).starts_with("invalid token"));
        let other_target = claims(
            CloneSourceKind::Pvc,
            ("golden", "fedora"),
            ("vms", "vm2"),
            CREATED,
        );
        let why = refused(check_with(
            Some(signed(&other_target)),
            &src("golden", "fedora"),
        ));
        assert!(why.contains("for target vms/vm2"), "{why}");
        let mut upload = good(CREATED);
        upload.operation = token::OPERATION_UPLOAD.into();
        let why = refused(check_with(Some(signed(&upload)), &src("golden", "fedora")));
        assert!(why.contains("operation"), "{why}");
    }

    #[test]
    fn a_token_issued_for_an_older_datavolume_of_the_name_is_refused() {
        let s = src("golden", "fedora");
        let why = refused(check_with(Some(signed(&good(CREATED - 3600))), &s));
        assert!(why.contains("not when the DataVolume was created"), "{why}");
        let later = signed(&good(CREATED + 3600));
        assert!(refused(check_with(Some(later), &s)).contains("issued at"));
    }

    #[test]
    fn the_patch_adds_the_annotation_with_or_without_annotations() {
        let bare = serde_json::to_value(patch(&dv(None), "t".into())).unwrap();
        assert_eq!(
            bare,
            serde_json::json!([{"op": "add", "path": "/metadata/annotations",
                                "value": {ANN_CLONE_TOKEN: "t"}}])
        );
        let annotated = serde_json::to_value(patch(&dv(Some("old".into())), "t".into())).unwrap();
        assert_eq!(
            annotated[0]["path"],
            "/metadata/annotations/cdi.kubevirt.io~1storage.clone.token"
        );
    }
}
