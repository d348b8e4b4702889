//! The PVC a DataVolume asks for: `spec.pvc` taken literally, or `spec.storage` completed as
//! CDI does (the class's StorageProfile gives missing access and volume modes; without a cluster,
//! ReadWriteOnce and Filesystem) and its size inflated by the filesystem overhead.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::labels;
use crate::settings::Config;
use api::DataVolume;
use api::cdi::StorageProfileStatus;
use kubekit::error::{Error, Result};

/// CDI aligns requested sizes to this before adding the filesystem overhead.
pub const ALIGN: u64 = 1 << 20;

/// `Filesystem` or `Block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeMode {
    /// A filesystem volume: the disk is `disk.img` on it.
    Filesystem,
    /// A raw block volume.
    Block,
}

impl VolumeMode {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeMode::Filesystem => "Filesystem",
            VolumeMode::Block => "Block",
        }
    }

    pub(crate) fn parse(s: Option<&str>) -> Result<Self> {
        match s {
            None | Some("Filesystem") => Ok(VolumeMode::Filesystem),
            Some("Block") => Ok(VolumeMode::Block),
            Some(other) => Err(Error::invalid(format!(
                "volumeMode {other:?} is not Filesystem or Block"
            ))),
        }
    }
}

/// Space to request so that `requested` bytes stay usable after the filesystem takes its
/// share: CDI's GetRequiredSpace (align to 1 MiB, then divide by `1 - overhead`, rounding up).
pub fn required_space(requested: u64, overhead: f64) -> u64 {
    let aligned = requested.div_ceil(ALIGN) * ALIGN;
    (aligned as f64 / (1.0 - overhead)).ceil() as u64
}

/// The claim's size, StorageClass and mode, as the importer needs them.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The PVC spec to create.
    pub spec: PersistentVolumeClaimSpec,
    /// Requested bytes (after any inflation).
    pub size: u64,
    /// Filesystem or block.
    pub mode: VolumeMode,
    /// The filesystem overhead the importer must keep (0 for block volumes).
    pub overhead: f64,
}

/// What completes a `spec.storage` claim.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum StorageDefaults {
    /// No cluster to ask (`quarry apply`): ReadWriteOnce and Filesystem.
    #[default]
    Builtin,
    /// What the cluster says: the claim's StorageClass (the DataVolume's if it exists, else the
    /// default class; None: neither exists) and that class's StorageProfile status (None: no
    /// profile yet). Once the PVC exists, its own class and modes.
    Cluster {
        /// The StorageClass found.
        class: Option<String>,
        /// Its StorageProfile's status.
        profile: Option<StorageProfileStatus>,
    },
    /// The PVC exists: its class and modes, as created.
    Existing {
        /// Its StorageClass.
        class: Option<String>,
        /// Its access modes.
        access_modes: Vec<String>,
        /// Its volume mode.
        volume_mode: Option<String>,
    },
}

/// CDI's message when a claim without access modes has no StorageClass to take them from.
pub const NO_CLASS_FOR_ACCESS_MODES: &str =
    "PVC spec is missing accessMode and no storageClass to choose profile";

/// Access and volume modes of a `spec.storage` claim, completed from the class's profile as
/// CDI's renderPvcSpecVolumeModeAndAccessModesAndStorageClass does: both missing take the first
/// claim property set; missing access modes take those of the first set with the volume mode
/// (else the first set's); a missing volume mode takes that of the first set sharing an access
/// mode (else the first set's, else Filesystem).
fn complete_modes(
    access: &[String],
    volume: Option<&str>,
    class: &str,
    profile: Option<&StorageProfileStatus>,
) -> Result<(Vec<String>, Option<String>)> {
    let sets = profile.map(|p| p.profile.claim_property_sets.as_slice());
    let with_access = || {
        sets.into_iter()
            .flatten()
            .filter(|s| !s.access_modes.is_empty())
    };
    match (access.is_empty(), volume) {
        (false, Some(v)) => Ok((access.to_vec(), Some(v.to_string()))),
        (true, None) => with_access()
            .next()
            .map(|s| (s.access_modes.clone(), s.volume_mode.clone()))
            .ok_or_else(|| {
                Error::ClaimNotValid(format!(
                    "Spec is missing accessMode and volumeMode, cannot get access mode from StorageProfile {class}"
                ))
            }),
        (true, Some(v)) => with_access()
            .find(|s| s.volume_mode.as_deref() == Some(v))
            .or_else(|| with_access().next())
            .map(|s| (s.access_modes.clone(), Some(v.to_string())))
            .ok_or_else(|| {
                Error::ClaimNotValid(format!(
                    "Spec is missing accessMode and cannot get access mode from StorageProfile {class}"
                ))
            }),
        (false, None) => {
            let sets = sets.ok_or_else(|| {
                Error::ClaimNotValid(format!("cannot get StorageProfile {class}"))
            })?;
            let shared = sets
                .iter()
                .find(|s| s.access_modes.iter().any(|m| access.contains(m)))
                .or(sets.first());
            Ok((access.to_vec(), shared.and_then(|s| s.volume_mode.clone())))
        }
    }
}

fn requested_size(res: Option<&VolumeResourceRequirements>, field: &str) -> Result<u64> {
    let q = res
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .ok_or_else(|| Error::invalid(format!("{field}.resources.requests.storage is required")))?;
    let size = quantity::parse(&q.0)
        .map_err(|e| Error::invalid(format!("{field}.resources.requests.storage: {e}")))?;
    if size == 0 {
        // CDI's webhook refuses a zero size too.
        return Err(Error::invalid(format!(
            "{field}.resources.requests.storage must be greater than 0"
        )));
    }
    Ok(size)
}

/// The access modes a PVC may ask for.
const ACCESS_MODES: [&str; 4] = [
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

/// CDI's access-mode rules: `spec.pvc` is taken literally, so it needs exactly one mode;
/// `spec.storage` may leave them to the defaults or name several. Every mode must be known.
fn check_access_modes(modes: &[String], field: &str, exactly_one: bool) -> Result<()> {
    if exactly_one && modes.len() != 1 {
        return Err(Error::invalid(format!(
            "{field}.accessModes must name exactly one access mode (got {})",
            modes.len()
        )));
    }
    match modes.iter().find(|m| !ACCESS_MODES.contains(&m.as_str())) {
        Some(m) => Err(Error::invalid(format!(
            "{field}.accessModes: {m:?} is not one of {}",
            ACCESS_MODES.join(", ")
        ))),
        None => Ok(()),
    }
}

/// The claim for a DataVolume, from `spec.pvc` or `spec.storage` (completed by `defaults`).
/// [`Error::ClaimNotValid`] when the cluster gives no access modes yet.
pub fn claim(dv: &DataVolume, cfg: &Config, defaults: &StorageDefaults) -> Result<Claim> {
    let c = requested_claim(dv, cfg, defaults)?;
    if c.mode == VolumeMode::Block && super::source::is_archive(&dv.spec) {
        return Err(Error::invalid(
            "contentType archive needs a Filesystem volume: an archive is extracted into files",
        ));
    }
    Ok(c)
}

fn requested_claim(dv: &DataVolume, cfg: &Config, defaults: &StorageDefaults) -> Result<Claim> {
    match (&dv.spec.pvc, &dv.spec.storage) {
        (Some(_), Some(_)) => Err(Error::invalid("spec.pvc and spec.storage are exclusive")),
        (None, None) => Err(Error::invalid("spec.pvc or spec.storage is required")),
        (Some(pvc), None) => {
            let mode = VolumeMode::parse(pvc.volume_mode.as_deref())?;
            let size = requested_size(pvc.resources.as_ref(), "spec.pvc")?;
            check_access_modes(
                pvc.access_modes.as_deref().unwrap_or_default(),
                "spec.pvc",
                true,
            )?;
            let overhead = match mode {
                VolumeMode::Filesystem => cfg.overhead(pvc.storage_class_name.as_deref()),
                VolumeMode::Block => 0.0,
            };
            Ok(Claim {
                spec: pvc.as_ref().clone(),
                size,
                mode,
                overhead,
            })
        }
        (None, Some(st)) => {
            let requested = requested_size(st.resources.as_ref(), "spec.storage")?;
            check_access_modes(&st.access_modes, "spec.storage", false)?;
            let (class, access_modes, volume_mode) = match defaults {
                StorageDefaults::Builtin => {
                    let access = if st.access_modes.is_empty() {
                        vec!["ReadWriteOnce".to_string()]
                    } else {
                        st.access_modes.clone()
                    };
                    let class = st
                        .storage_class_name
                        .clone()
                        .or_else(|| cfg.default_storage_class.clone());
                    (class, access, st.volume_mode.clone())
                }
                StorageDefaults::Existing {
                    class,
                    access_modes,
                    volume_mode,
                } => (class.clone(), access_modes.clone(), volume_mode.clone()),
                StorageDefaults::Cluster { class: None, .. } => {
                    if st.access_modes.is_empty() {
                        return Err(Error::ClaimNotValid(NO_CLASS_FOR_ACCESS_MODES.into()));
                    }
                    let class = st.storage_class_name.clone();
                    (class, st.access_modes.clone(), st.volume_mode.clone())
                }
                StorageDefaults::Cluster {
                    class: Some(class),
                    profile,
                } => {
                    let (access, volume) = complete_modes(
                        &st.access_modes,
                        st.volume_mode.as_deref(),
                        class,
                        profile.as_ref(),
                    )?;
                    (Some(class.clone()), access, volume)
                }
            };
            let mode = VolumeMode::parse(volume_mode.as_deref())?;
            let (size, overhead) = match mode {
                VolumeMode::Filesystem => {
                    let o = cfg.overhead(class.as_deref());
                    (required_space(requested, o), o)
                }
                VolumeMode::Block => (requested.div_ceil(ALIGN) * ALIGN, 0.0),
            };
            let mut requests = BTreeMap::new();
            requests.insert("storage".to_string(), Quantity(size.to_string()));
            Ok(Claim {
                spec: PersistentVolumeClaimSpec {
                    access_modes: Some(access_modes),
                    selector: st.selector.clone(),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(requests),
                        ..Default::default()
                    }),
                    volume_name: st.volume_name.clone(),
                    storage_class_name: class,
                    volume_mode: Some(mode.as_str().into()),
                    data_source: st.data_source.clone(),
                    data_source_ref: st.data_source_ref.clone(),
                    ..Default::default()
                },
                size,
                mode,
                overhead,
            })
        }
    }
}

/// The PVC object: named like the DataVolume (as CDI does), labelled, and owned by it unless
/// the DataVolume asks to retain its PVC (the finalizer deletes an unretained one too).
pub fn desired_pvc(dv: &DataVolume, claim: &Claim) -> PersistentVolumeClaim {
    let mut annotations = BTreeMap::from([(
        super::ANN_OWNED_BY.to_string(),
        format!(
            "{}/{}",
            dv.metadata.namespace.as_deref().unwrap_or_default(),
            super::name(dv)
        ),
    )]);
    // Passed on as CDI does: the populator's pods take them from the PVC.
    annotations.extend(super::pod::passed_annotations(
        dv.metadata.annotations.as_ref(),
    ));
    if dv.spec.source.as_ref().is_some_and(|s| s.upload.is_some()) {
        annotations.insert(super::ANN_UPLOAD_TARGET.to_string(), String::new());
    }
    if super::source::is_archive(&dv.spec) {
        // virtctl image-upload --archive-path checks it, as CDI's upload proxy does.
        annotations.insert(super::ANN_CONTENT_TYPE.to_string(), "archive".into());
    }
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(super::name(dv).to_string()),
            namespace: dv.metadata.namespace.clone(),
            labels: Some(labels(dv)),
            annotations: Some(annotations),
            owner_references: (!retained(dv))
                .then(|| super::owner_ref(dv))
                .flatten()
                .map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(claim.spec.clone()),
        status: None,
    }
}

/// Whether the DataVolume keeps its PVC when deleted.
pub fn retained(dv: &DataVolume) -> bool {
    dv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(super::ANN_RETAIN_PVC))
        .is_some_and(|v| v == "true")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use api::DataVolumeSpec;
    use api::datavolume::StorageSpec;

    fn dv(spec: DataVolumeSpec) -> DataVolume {
        let mut dv = DataVolume::new("disk", spec);
        dv.metadata.namespace = Some("ns".into());
        dv
    }

    fn resources(q: &str) -> Option<VolumeResourceRequirements> {
        Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([("storage".into(), Quantity(q.into()))])),
            ..Default::default()
        })
    }

    #[test]
    fn only_upload_claims_are_upload_targets() {
        use api::datavolume::{DataVolumeSource, Empty};
        let claim = claim(
            &dv(DataVolumeSpec {
                storage: Some(StorageSpec {
                    resources: resources("1Gi"),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            &Config::default(),
            &StorageDefaults::Builtin,
        )
        .unwrap();
        let with = |source: DataVolumeSource| {
            desired_pvc(
                &dv(DataVolumeSpec {
                    source: Some(source),
                    ..Default::default()
                }),
                &claim,
            )
            .metadata
            .annotations
            .unwrap_or_default()
        };
        let upload = with(DataVolumeSource {
            upload: Some(Empty::default()),
            ..Default::default()
        });
        assert_eq!(
            upload
                .get(super::super::ANN_UPLOAD_TARGET)
                .map(String::as_str),
            Some("")
        );
        let blank = with(DataVolumeSource {
            blank: Some(Empty::default()),
            ..Default::default()
        });
        assert!(!blank.contains_key(super::super::ANN_UPLOAD_TARGET));
    }

    #[test]
    fn required_space_matches_cdi() {
        // 1 GiB at CDI's default 5.5 %: ceil(1073741824 / 0.945).
        assert_eq!(required_space(1 << 30, 0.055), 1_136_234_735);
        // Unaligned sizes are rounded up to a MiB first.
        assert_eq!(required_space(1, 0.0), 1 << 20);
        assert_eq!(required_space((1 << 20) + 1, 0.0), 2 << 20);
        // Whatever the overhead, the usable part (floored to a MiB, as the importer computes
        // it) holds the aligned request.
        for o in [0.0, 0.055, 0.06, 0.1, 0.5] {
            for req in [1u64, 999_999, 1 << 30, 10_000_000_007] {
                let size = required_space(req, o);
                let usable = ((1.0 - o) * size as f64) as u64 / ALIGN * ALIGN;
                assert!(usable >= req, "o={o} req={req} size={size} usable={usable}");
            }
        }
    }

    #[test]
    fn storage_gets_cdi_defaults_and_inflation() {
        let cfg = Config::default();
        let d = dv(DataVolumeSpec {
            storage: Some(StorageSpec {
                resources: resources("1Gi"),
                storage_class_name: Some("hostpath-csi".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let c = claim(&d, &cfg, &StorageDefaults::Builtin).unwrap();
        assert_eq!(c.mode, VolumeMode::Filesystem);
        assert_eq!(c.size, 1_136_234_735);
        assert_eq!(
            c.spec.access_modes.as_deref(),
            Some(&["ReadWriteOnce".to_string()][..])
        );
        assert_eq!(c.spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(c.spec.storage_class_name.as_deref(), Some("hostpath-csi"));
        let pvc = desired_pvc(&d, &c);
        assert_eq!(pvc.metadata.name.as_deref(), Some("disk"));
        assert_eq!(
            pvc.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
            "1136234735"
        );
    }

    #[test]
    fn per_class_overhead_and_block_mode() {
        let mut cfg = Config::default();
        cfg.filesystem_overhead_per_class.insert("fast".into(), 0.1);
        let mut d = dv(DataVolumeSpec {
            storage: Some(StorageSpec {
                resources: resources("100Mi"),
                storage_class_name: Some("fast".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let c = claim(&d, &cfg, &StorageDefaults::Builtin).unwrap();
        assert_eq!(c.overhead, 0.1);
        assert_eq!(c.size, ((100u64 << 20) as f64 / 0.9).ceil() as u64);
        d.spec.storage.as_mut().unwrap().volume_mode = Some("Block".into());
        let c = claim(&d, &cfg, &StorageDefaults::Builtin).unwrap();
        assert_eq!(
            (c.mode, c.size, c.overhead),
            (VolumeMode::Block, 100 << 20, 0.0)
        );
    }

    #[test]
    fn pvc_is_taken_literally() {
        let spec = PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteMany".into()]),
            resources: resources("10Gi"),
            volume_mode: Some("Block".into()),
            storage_class_name: Some("ceph".into()),
            ..Default::default()
        };
        let d = dv(DataVolumeSpec {
            pvc: Some(Box::new(spec.clone())),
            ..Default::default()
        });
        let c = claim(&d, &Config::default(), &StorageDefaults::Builtin).unwrap();
        assert_eq!(c.spec, spec);
        assert_eq!((c.size, c.mode), (10 << 30, VolumeMode::Block));
    }

    #[test]
    fn missing_size_bad_mode_and_both_forms_are_refused() {
        let cfg = Config::default();
        let cases = [
            (
                DataVolumeSpec {
                    storage: Some(StorageSpec::default()),
                    ..Default::default()
                },
                "spec.storage.resources.requests.storage is required",
            ),
            (
                DataVolumeSpec {
                    storage: Some(StorageSpec {
                        resources: resources("1Gi"),
                        volume_mode: Some("Tape".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "volumeMode",
            ),
            (
                DataVolumeSpec {
                    storage: Some(StorageSpec {
                        resources: resources("lots"),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "spec.storage.resources.requests.storage:",
            ),
            (
                DataVolumeSpec {
                    storage: Some(StorageSpec::default()),
                    pvc: Some(Default::default()),
                    ..Default::default()
                },
                "exclusive",
            ),
            (DataVolumeSpec::default(), "required"),
        ];
        for (spec, needle) in cases {
            let e = claim(&dv(spec), &cfg, &StorageDefaults::Builtin).unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
        }
    }

    /// A profile status with these (access mode, volume mode) sets.
    pub(crate) fn profile(sets: &[(&str, &str)]) -> StorageProfileStatus {
        StorageProfileStatus {
            profile: api::cdi::StorageProfileSpec {
                claim_property_sets: sets
                    .iter()
                    .map(|(a, v)| api::cdi::ClaimPropertySet {
                        access_modes: vec![a.to_string()],
                        volume_mode: Some(v.to_string()),
                    })
                    .collect(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn modes(
        access: &[&str],
        volume: Option<&str>,
        p: Option<&StorageProfileStatus>,
    ) -> Result<(Vec<String>, Option<String>)> {
        let access: Vec<String> = access.iter().map(|a| a.to_string()).collect();
        complete_modes(&access, volume, "local", p)
    }

    fn ok(access: &str, volume: Option<&str>) -> (Vec<String>, Option<String>) {
        (vec![access.to_string()], volume.map(String::from))
    }

    #[test]
    fn both_modes_missing_take_the_profiles_first_set() {
        let p = profile(&[("ReadWriteMany", "Block"), ("ReadWriteOnce", "Filesystem")]);
        assert_eq!(
            modes(&[], None, Some(&p)).unwrap(),
            ok("ReadWriteMany", Some("Block"))
        );
        let e = modes(&[], None, Some(&profile(&[]))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Spec is missing accessMode and volumeMode, cannot get access mode from StorageProfile local"
        );
        assert!(matches!(
            modes(&[], None, None),
            Err(Error::ClaimNotValid(_))
        ));
    }

    #[test]
    fn missing_access_modes_take_those_of_the_volume_mode_else_the_first() {
        let p = profile(&[("ReadWriteMany", "Block"), ("ReadWriteOnce", "Filesystem")]);
        assert_eq!(
            modes(&[], Some("Filesystem"), Some(&p)).unwrap(),
            ok("ReadWriteOnce", Some("Filesystem"))
        );
        let only_block = profile(&[("ReadWriteMany", "Block")]);
        assert_eq!(
            modes(&[], Some("Filesystem"), Some(&only_block)).unwrap(),
            ok("ReadWriteMany", Some("Filesystem"))
        );
        let e = modes(&[], Some("Block"), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Spec is missing accessMode and cannot get access mode from StorageProfile local"
        );
    }

    #[test]
    fn a_missing_volume_mode_takes_that_of_a_set_sharing_an_access_mode() {
        let p = profile(&[("ReadWriteMany", "Block"), ("ReadWriteOnce", "Filesystem")]);
        assert_eq!(
            modes(&["ReadWriteOnce"], None, Some(&p)).unwrap(),
            ok("ReadWriteOnce", Some("Filesystem"))
        );
        assert_eq!(
            modes(&["ReadOnlyMany"], None, Some(&p)).unwrap(),
            ok("ReadOnlyMany", Some("Block"))
        );
        // An empty profile leaves it to Kubernetes (Filesystem); no profile at all waits.
        assert_eq!(
            modes(&["ReadWriteOnce"], None, Some(&profile(&[]))).unwrap(),
            ok("ReadWriteOnce", None)
        );
        assert!(modes(&["ReadWriteOnce"], None, None).is_err());
    }

    #[test]
    fn the_cluster_class_sets_the_claims_class_and_overhead() {
        let mut cfg = Config::default();
        cfg.filesystem_overhead_per_class.insert("fast".into(), 0.1);
        let d = dv(DataVolumeSpec {
            storage: Some(StorageSpec {
                resources: resources("100Mi"),
                ..Default::default()
            }),
            ..Default::default()
        });
        let defaults = StorageDefaults::Cluster {
            class: Some("fast".into()),
            profile: Some(profile(&[("ReadWriteOnce", "Filesystem")])),
        };
        let c = claim(&d, &cfg, &defaults).unwrap();
        assert_eq!(c.spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(c.overhead, 0.1);
        // Without any class, access modes given by the DataVolume are enough.
        let mut d = d;
        d.spec.storage.as_mut().unwrap().access_modes = vec!["ReadWriteOnce".into()];
        let none = StorageDefaults::Cluster {
            class: None,
            profile: None,
        };
        let c = claim(&d, &cfg, &none).unwrap();
        assert_eq!(
            (c.spec.storage_class_name, c.mode),
            (None, VolumeMode::Filesystem)
        );
    }
}
