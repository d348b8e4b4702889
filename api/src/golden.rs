//! CDI's golden-image objects in `cdi.kubevirt.io/v1beta1`, with CDI's field names: the
//! [`DataSource`] (a named pointer to a PVC or VolumeSnapshot that DataVolumes clone through
//! `spec.sourceRef`) and the [`DataImportCron`] (polls a source on a cron schedule, imports each
//! new version into a DataVolume and points its managed DataSource at the newest).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::datavolume::{DataVolumeCondition, DataVolumeSpec, SourcePvc};

/// A condition of a DataSource or DataImportCron: CDI's `ConditionState` with a type, the same
/// shape as a DataVolume's.
pub type Condition = DataVolumeCondition;

/// Where a DataSource points: one of a PVC, a VolumeSnapshot or another DataSource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataSourceSource {
    /// A PVC (usually the DataVolume of the same name) in any namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<SourcePvc>,
    /// A VolumeSnapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SourcePvc>,
    /// Another DataSource (a chain at most one deep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_source: Option<SourcePvc>,
}

/// A named import or clone source for DataVolumes' `spec.sourceRef`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "DataSource",
    plural = "datasources",
    shortname = "das",
    category = "all",
    namespaced,
    status = "DataSourceStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct DataSourceSpec {
    /// What the DataSource points to.
    #[serde(default)]
    pub source: DataSourceSource,
}

/// The observed state of a DataSource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataSourceStatus {
    /// The source in force (a `dataSource` reference resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<DataSourceSource>,
    /// `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A DataVolume as a DataImportCron's template: metadata and spec.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct DataVolumeTemplate {
    /// Labels and annotations given to each import DataVolume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::cdi::preserved")]
    pub metadata: Option<ObjectMeta>,
    /// The import DataVolume's spec (its source is what is polled).
    pub spec: DataVolumeSpec,
}

/// Whether old imports are deleted once a newer one succeeded.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum GarbageCollect {
    /// Keep only `importsToKeep` imports (CDI's default).
    #[default]
    Outdated,
    /// Keep every import.
    Never,
}

/// Whether the cron's DataVolumes and DataSource outlive it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RetentionPolicy {
    /// Keep them (CDI's default).
    #[default]
    All,
    /// Delete them with the cron.
    None,
}

/// CDI's default of `importsToKeep`.
pub const DEFAULT_IMPORTS_TO_KEEP: i32 = 3;

/// Polls a disk image source on a schedule and imports each new version.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "DataImportCron",
    plural = "dataimportcrons",
    shortname = "dic",
    shortname = "dics",
    category = "all",
    namespaced,
    status = "DataImportCronStatus",
    printcolumn = r#"{"name":"Format","type":"string","jsonPath":".status.sourceFormat","description":"The format in which created sources are saved"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DataImportCronSpec {
    /// The DataVolume each import creates.
    pub template: DataVolumeTemplate,
    /// When to poll, in 5-field cron syntax (empty: never).
    pub schedule: String,
    /// `Outdated` (default) or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub garbage_collect: Option<GarbageCollect>,
    /// Imports kept by garbage collection (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imports_to_keep: Option<i32>,
    /// The DataSource (same namespace) pointed at the newest import.
    pub managed_data_source: String,
    /// `All` (default) or `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<RetentionPolicy>,
    /// The creator's UserInfo as JSON (set by CDI's webhook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

impl DataImportCronSpec {
    /// `garbageCollect` with CDI's default.
    pub fn garbage_collect(&self) -> GarbageCollect {
        self.garbage_collect.unwrap_or_default()
    }

    /// `importsToKeep` with CDI's default (a negative value also means the default).
    pub fn imports_to_keep(&self) -> usize {
        match self.imports_to_keep {
            Some(n) if n >= 0 => n as usize,
            _ => DEFAULT_IMPORTS_TO_KEEP as usize,
        }
    }

    /// `retentionPolicy` with CDI's default.
    pub fn retention_policy(&self) -> RetentionPolicy {
        self.retention_policy.unwrap_or_default()
    }
}

/// An import in progress (CDI spells these fields with capitals).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ImportStatus {
    /// The import DataVolume.
    #[serde(rename = "DataVolumeName")]
    pub data_volume_name: String,
    /// The source version it imports.
    #[serde(rename = "Digest")]
    pub digest: String,
}

/// The observed state of a DataImportCron.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataImportCronStatus {
    /// The import in progress (at most one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub current_imports: Vec<ImportStatus>,
    /// The newest import that succeeded.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "lastImportedPVC"
    )]
    pub last_imported_pvc: Option<SourcePvc>,
    /// When the source was last polled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_execution_timestamp: Option<Time>,
    /// When the last import succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_import_timestamp: Option<Time>,
    /// `pvc` or `snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_format: Option<String>,
    /// `UpToDate` and `Progressing`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Condition types of DataSources and DataImportCrons.
pub mod condition {
    /// DataSource: its source can be cloned.
    pub const READY: &str = "Ready";
    /// DataImportCron: the newest import is of the source's current version.
    pub const UP_TO_DATE: &str = "UpToDate";
    /// DataImportCron: an import runs.
    pub const PROGRESSING: &str = "Progressing";
}

/// The label CDI puts on a cron's DataVolumes, PVCs and DataSource (the cron's name).
pub const DATA_IMPORT_CRON_LABEL: &str = "cdi.kubevirt.io/dataImportCron";

impl DataSource {
    /// Whether it is Ready (what a DataVolume's `sourceRef` waits for).
    pub fn is_ready(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == condition::READY && c.status == "True")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA_SOURCE: &str = r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataSource
metadata:
  name: fedora
  namespace: golden-images
  labels:
    cdi.kubevirt.io/dataImportCron: fedora-image-cron
spec:
  source:
    pvc:
      namespace: golden-images
      name: fedora-3d8e5b5ff4b1
status:
  source:
    pvc:
      namespace: golden-images
      name: fedora-3d8e5b5ff4b1
  conditions:
  - type: Ready
    status: "True"
    reason: Ready
    message: DataSource is ready to be consumed
    lastHeartbeatTime: "2024-05-02T10:00:05Z"
    lastTransitionTime: "2024-05-02T10:00:05Z"
"#;

    const CRON: &str = r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataImportCron
metadata:
  name: fedora-image-cron
  namespace: golden-images
  annotations:
    cdi.kubevirt.io/storage.bind.immediate.requested: "true"
spec:
  template:
    metadata: {}
    spec:
      source:
        registry:
          url: "docker://quay.io/containerdisks/fedora:latest"
      storage:
        resources:
          requests:
            storage: 5Gi
  schedule: "30 1 * * 1"
  garbageCollect: Outdated
  importsToKeep: 2
  managedDataSource: fedora
  retentionPolicy: None
status:
  currentImports:
  - DataVolumeName: fedora-3d8e5b5ff4b1
    Digest: sha256:3d8e5b5ff4b1c8f2a0e4d6c9b7a5e3f1d2c4b6a8e0f2d4c6b8a0e2f4d6c8b0a2
  lastImportedPVC:
    namespace: golden-images
    name: fedora-0a1b2c3d4e5f
  lastExecutionTimestamp: "2024-05-06T01:30:00Z"
  lastImportTimestamp: "2024-04-29T01:31:12Z"
  sourceFormat: pvc
  conditions:
  - type: UpToDate
    status: "False"
    reason: ImportProgressing
    message: Import is progressing
  - type: Progressing
    status: "True"
    reason: ImportProgressing
    message: Import is progressing
"#;

    #[test]
    fn a_cdi_data_source_parses_and_round_trips() {
        let ds: DataSource = serde_saphyr::from_str(DATA_SOURCE).unwrap();
        let pvc = ds.spec.source.pvc.as_ref().unwrap();
        assert_eq!(
            (pvc.namespace.as_str(), pvc.name.as_str()),
            ("golden-images", "fedora-3d8e5b5ff4b1")
        );
        let status = ds.status.as_ref().unwrap();
        assert_eq!(status.conditions[0].type_, condition::READY);
        assert_eq!(status.conditions[0].reason.as_deref(), Some("Ready"));
        let back: DataSource = serde_json::from_value(serde_json::to_value(&ds).unwrap()).unwrap();
        assert_eq!((back.spec, back.status), (ds.spec, ds.status));
    }

    #[test]
    fn a_cdi_data_import_cron_parses_with_cdi_spellings_and_round_trips() {
        let cron: DataImportCron = serde_saphyr::from_str(CRON).unwrap();
        let s = &cron.spec;
        assert_eq!(s.schedule, "30 1 * * 1");
        assert_eq!(s.garbage_collect(), GarbageCollect::Outdated);
        assert_eq!(s.imports_to_keep(), 2);
        assert_eq!(s.retention_policy(), RetentionPolicy::None);
        assert_eq!(s.managed_data_source, "fedora");
        let reg = s.template.spec.source.as_ref().unwrap().registry.as_ref();
        assert!(
            reg.unwrap()
                .url
                .as_deref()
                .unwrap()
                .ends_with("fedora:latest")
        );
        let st = cron.status.as_ref().unwrap();
        assert_eq!(
            st.current_imports[0].data_volume_name,
            "fedora-3d8e5b5ff4b1"
        );
        assert_eq!(
            st.last_imported_pvc.as_ref().unwrap().name,
            "fedora-0a1b2c3d4e5f"
        );
        let json = serde_json::to_value(&cron).unwrap();
        assert_eq!(
            json["status"]["currentImports"][0]["DataVolumeName"],
            "fedora-3d8e5b5ff4b1"
        );
        assert!(json["status"]["lastImportedPVC"].is_object());
        let back: DataImportCron = serde_json::from_value(json).unwrap();
        assert_eq!((back.spec, back.status), (cron.spec, cron.status));
    }

    #[test]
    fn cron_defaults_are_cdis() {
        let s = DataImportCronSpec::default();
        assert_eq!(s.garbage_collect(), GarbageCollect::Outdated);
        assert_eq!(s.imports_to_keep(), 3);
        assert_eq!(s.retention_policy(), RetentionPolicy::All);
        let negative = DataImportCronSpec {
            imports_to_keep: Some(-1),
            ..Default::default()
        };
        assert_eq!(negative.imports_to_keep(), 3);
    }
}
