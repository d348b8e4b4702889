//! StorageProfiles as pure functions: what Quarry knows of a provisioner (CDI's table of
//! capabilities, with Quarry's own hostpath driver), and the status CDI publishes for a
//! StorageClass with the profile's spec applied.

use k8s_openapi::api::storage::v1::StorageClass;

use api::cdi::{ClaimPropertySet, StorageProfileSpec, StorageProfileStatus};

/// StorageClass annotation choosing the clone strategy (CDI's).
pub const ANN_CLONE_STRATEGY: &str = "cdi.kubevirt.io/clone-strategy";
/// Host-assisted copy, CDI's fallback.
pub const CLONE_COPY: &str = "copy";
/// A CSI volume clone.
pub const CLONE_CSI: &str = "csi-clone";

fn set(access: &str, volume: &str) -> ClaimPropertySet {
    ClaimPropertySet {
        access_modes: vec![access.into()],
        volume_mode: Some(volume.into()),
    }
}

/// Access and volume modes of known provisioners, most preferred first. Quarry's hostpath
/// driver serves both volume modes; the rest are CDI's entries.
pub fn known_claim_property_sets(provisioner: &str) -> Vec<ClaimPropertySet> {
    const RWO: &str = "ReadWriteOnce";
    const RWX: &str = "ReadWriteMany";
    match provisioner {
        p if p == provisioner::DRIVER_NAME => {
            vec![set(RWO, "Filesystem"), set(RWO, "Block")]
        }
        "kubevirt.io/hostpath-provisioner" | "k8s.io/minikube-hostpath" => {
            vec![set(RWO, "Filesystem")]
        }
        "nfs.csi.k8s.io" | "k8s-sigs.io/nfs-subdir-external-provisioner" => {
            vec![set(RWX, "Filesystem")]
        }
        _ => Vec::new(),
    }
}

/// The clone strategy advised for known provisioners.
pub fn advised_clone_strategy(provisioner: &str) -> Option<&'static str> {
    (provisioner == provisioner::DRIVER_NAME).then_some(CLONE_CSI)
}

/// The profile status of `sc`, as CDI's storageprofile-controller computes it: the spec's claim
/// property sets (each must name both modes) or the known ones; the clone strategy from the
/// spec, the class's annotation, the known provisioner, else `copy` (Quarry detects no
/// VolumeSnapshotClasses, so it never picks `snapshot` itself); DataImportCron sources as PVCs.
pub fn profile_status(
    sc: &StorageClass,
    spec: &StorageProfileSpec,
) -> Result<StorageProfileStatus, String> {
    if spec
        .claim_property_sets
        .iter()
        .any(|s| s.volume_mode.is_none() || s.access_modes.is_empty())
    {
        return Err("each ClaimPropertySet must provide both volume mode and access modes".into());
    }
    let claim_property_sets = if spec.claim_property_sets.is_empty() {
        known_claim_property_sets(&sc.provisioner)
    } else {
        spec.claim_property_sets.clone()
    };
    let annotated = sc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_CLONE_STRATEGY))
        .map(|v| match v.as_str() {
            "copy" | "snapshot" | "csi-clone" => v.clone(),
            // CDI turns an unknown value into the empty strategy.
            _ => String::new(),
        });
    let clone_strategy = spec
        .clone_strategy
        .clone()
        .or(annotated)
        .or_else(|| advised_clone_strategy(&sc.provisioner).map(String::from))
        .unwrap_or_else(|| CLONE_COPY.into());
    Ok(StorageProfileStatus {
        storage_class: sc.metadata.name.clone(),
        provisioner: Some(sc.provisioner.clone()),
        profile: StorageProfileSpec {
            clone_strategy: Some(clone_strategy),
            claim_property_sets,
            data_import_cron_source_format: Some(
                spec.data_import_cron_source_format
                    .clone()
                    .unwrap_or_else(|| "pvc".into()),
            ),
            snapshot_class: spec.snapshot_class.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn sc(provisioner: &str, strategy: Option<&str>) -> StorageClass {
        let mut sc = StorageClass {
            provisioner: provisioner.into(),
            ..Default::default()
        };
        sc.metadata.name = Some("class".into());
        sc.metadata.annotations =
            strategy.map(|s| BTreeMap::from([(ANN_CLONE_STRATEGY.to_string(), s.to_string())]));
        sc
    }

    #[test]
    fn quarrys_hostpath_classes_get_rwo_filesystem_and_block_and_csi_clone() {
        let st = profile_status(&sc(provisioner::DRIVER_NAME, None), &Default::default()).unwrap();
        assert_eq!(st.storage_class.as_deref(), Some("class"));
        assert_eq!(
            st.provisioner.as_deref(),
            Some("kubevirt.io.hostpath-provisioner")
        );
        assert_eq!(
            st.profile.claim_property_sets,
            [
                set("ReadWriteOnce", "Filesystem"),
                set("ReadWriteOnce", "Block")
            ]
        );
        assert_eq!(st.profile.clone_strategy.as_deref(), Some("csi-clone"));
        assert_eq!(
            st.profile.data_import_cron_source_format.as_deref(),
            Some("pvc")
        );
    }

    #[test]
    fn unknown_provisioners_get_no_claim_properties_and_copy() {
        let st = profile_status(&sc("example.com/unknown", None), &Default::default()).unwrap();
        assert!(st.profile.claim_property_sets.is_empty());
        assert_eq!(st.profile.clone_strategy.as_deref(), Some("copy"));
    }

    #[test]
    fn the_spec_overrides_what_is_known_and_the_annotation_the_default() {
        let spec = StorageProfileSpec {
            claim_property_sets: vec![set("ReadWriteMany", "Block")],
            clone_strategy: Some("snapshot".into()),
            ..Default::default()
        };
        let st = profile_status(&sc(provisioner::DRIVER_NAME, Some("copy")), &spec).unwrap();
        assert_eq!(
            st.profile.claim_property_sets,
            [set("ReadWriteMany", "Block")]
        );
        assert_eq!(st.profile.clone_strategy.as_deref(), Some("snapshot"));
        let st = profile_status(
            &sc("example.com/unknown", Some("csi-clone")),
            &Default::default(),
        )
        .unwrap();
        assert_eq!(st.profile.clone_strategy.as_deref(), Some("csi-clone"));
    }

    #[test]
    fn a_claim_property_set_needs_both_modes() {
        let spec = StorageProfileSpec {
            claim_property_sets: vec![ClaimPropertySet {
                access_modes: vec!["ReadWriteOnce".into()],
                volume_mode: None,
            }],
            ..Default::default()
        };
        let e = profile_status(&sc(provisioner::DRIVER_NAME, None), &spec).unwrap_err();
        assert_eq!(
            e,
            "each ClaimPropertySet must provide both volume mode and access modes"
        );
    }
}
