//! Golden images of a HyperConverged: HCO's common templates (when
//! `spec.enableCommonBootImageImport` is true; HCO's CRD defaults it to true, Quarry's leaves it
//! unset, so a cluster imports from the internet only when told to) and each
//! `spec.dataImportCronTemplates` entry become DataImportCrons in the boot image namespace
//! (`spec.commonBootImageNamespace`, else HCO's `openshift-virtualization-os-images`), as HCO has
//! SSP create them. A user template named as a common one replaces it; one annotated
//! `dataimportcrontemplate.kubevirt.io/enable: "false"` is skipped (HCO's way to turn a common
//! one off). The crons carry HCO's child labels, so crons whose template went away are found and
//! deleted.

use kube::ResourceExt;

use api::HyperConverged;
use api::golden::DataImportCron;
use api::hyperconverged::DataImportCronTemplate;

/// HCO's default namespace of golden images.
pub const DEFAULT_NAMESPACE: &str = "openshift-virtualization-os-images";
/// HCO's annotation disabling one template.
pub const ENABLE_ANNOTATION: &str = "dataimportcrontemplate.kubevirt.io/enable";

/// HCO's common golden images (its `dataImportCronTemplates.yaml` asset): name, managed
/// DataSource, containerDisk and requested size. Each polls every 12 hours and keeps one import.
const COMMON: [(&str, &str, &str, &str); 3] = [
    (
        "centos-stream9-image-cron",
        "centos-stream9",
        "docker://quay.io/containerdisks/centos-stream:9",
        "10Gi",
    ),
    (
        "centos-stream10-image-cron",
        "centos-stream10",
        "docker://quay.io/containerdisks/centos-stream:10",
        "10Gi",
    ),
    (
        "fedora-image-cron",
        "fedora",
        "docker://quay.io/containerdisks/fedora:latest",
        "5Gi",
    ),
];

/// HCO's common templates, as a user would write them.
pub fn common_templates() -> Vec<DataImportCronTemplate> {
    COMMON
        .iter()
        .map(|(name, source, url, size)| {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "annotations": {
                    "cdi.kubevirt.io/storage.bind.immediate.requested": "true"}},
                "spec": {
                    "garbageCollect": "Outdated",
                    "managedDataSource": source,
                    "schedule": "0 */12 * * *",
                    "importsToKeep": 1,
                    "template": {"spec": {
                        "source": {"registry": {"url": url}},
                        "storage": {"resources": {"requests": {"storage": size}}}}}}
            }))
            .expect("the common templates are valid DataImportCronTemplates")
        })
        .collect()
}

/// The templates in force, HCO's way: the common ones (unless turned off) with user templates of
/// the same name in their place, then the other user templates.
fn templates(hc: &HyperConverged) -> Vec<DataImportCronTemplate> {
    let name = |t: &DataImportCronTemplate| t.metadata.as_ref().and_then(|m| m.name.clone());
    let user = hc
        .spec
        .data_import_cron_templates
        .clone()
        .unwrap_or_default();
    let mut out = Vec::new();
    if hc.spec.enable_common_boot_image_import == Some(true) {
        for common in common_templates() {
            let mine = user.iter().find(|u| name(u) == name(&common));
            out.push(mine.cloned().unwrap_or(common));
        }
    }
    let taken: Vec<Option<String>> = out.iter().map(name).collect();
    out.extend(user.into_iter().filter(|u| !taken.contains(&name(u))));
    out
}

/// The namespace the crons live in.
pub fn namespace(hc: &HyperConverged) -> String {
    hc.spec
        .common_boot_image_namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.into())
}

/// The DataImportCrons the HyperConverged asks for (templates without a name are skipped).
pub fn crons(hc: &HyperConverged) -> Vec<DataImportCron> {
    let ns = namespace(hc);
    templates(hc)
        .iter()
        .filter_map(|t| {
            let meta = t.metadata.clone().unwrap_or_default();
            let name = meta.name.clone().filter(|n| !n.is_empty())?;
            let off = meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ENABLE_ANNOTATION))
                .is_some_and(|v| v == "false");
            if off {
                return None;
            }
            let mut cron = DataImportCron::new(&name, t.spec.clone());
            cron.metadata.namespace = Some(ns.clone());
            cron.metadata.annotations = meta.annotations;
            let mut labels = meta.labels.unwrap_or_default();
            labels.extend(super::children::child_labels());
            cron.metadata.labels = Some(labels);
            Some(cron)
        })
        .collect()
}

/// The names among `existing` (crons with HCO's labels) that no template asks for any more.
pub fn stale(hc: &HyperConverged, existing: &[DataImportCron]) -> Vec<String> {
    let wanted: Vec<String> = crons(hc).iter().map(|c| c.name_any()).collect();
    existing
        .iter()
        .map(|c| c.name_any())
        .filter(|n| !wanted.contains(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::HyperConvergedSpec;

    fn hc(spec: serde_json::Value) -> HyperConverged {
        let spec: HyperConvergedSpec = serde_json::from_value(spec).unwrap();
        HyperConverged::new("kubevirt-hyperconverged", spec)
    }

    fn template(name: &str, enable: Option<&str>) -> serde_json::Value {
        let mut meta = serde_json::json!({"name": name, "labels": {"os": name}});
        if let Some(e) = enable {
            meta["annotations"] = serde_json::json!({ENABLE_ANNOTATION: e});
        }
        serde_json::json!({"metadata": meta, "spec": {
            "schedule": "0 */12 * * *", "managedDataSource": name,
            "template": {"spec": {"source": {"registry": {"url": "docker://quay.io/containerdisks/fedora:latest"}},
                                  "storage": {"resources": {"requests": {"storage": "5Gi"}}}}}}})
    }

    #[test]
    fn templates_become_crons_in_hcos_default_namespace_with_hcos_labels() {
        let h = hc(serde_json::json!({"enableCommonBootImageImport": false,
            "dataImportCronTemplates": [template("fedora", None)]}));
        let c = crons(&h);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].name_any(), "fedora");
        assert_eq!(c[0].namespace().as_deref(), Some(DEFAULT_NAMESPACE));
        assert_eq!(c[0].labels()["os"], "fedora");
        assert_eq!(
            c[0].labels()["app.kubernetes.io/managed-by"],
            "hco-operator"
        );
        assert_eq!(c[0].spec.managed_data_source, "fedora");
    }

    #[test]
    fn the_common_boot_image_namespace_is_where_crons_go() {
        let h = hc(serde_json::json!({"commonBootImageNamespace": "golden",
            "dataImportCronTemplates": [template("fedora", None)]}));
        assert!(
            crons(&h)
                .iter()
                .all(|c| c.namespace().as_deref() == Some("golden"))
        );
    }

    #[test]
    fn a_disabled_template_makes_no_cron_and_its_old_cron_is_stale() {
        let h = hc(serde_json::json!({"enableCommonBootImageImport": false,
            "dataImportCronTemplates": [
            template("fedora", Some("false")), template("centos", Some("true"))]}));
        let c = crons(&h);
        assert_eq!(
            c.iter().map(|c| c.name_any()).collect::<Vec<_>>(),
            ["centos"]
        );
        let old = DataImportCron::new("fedora", Default::default());
        assert_eq!(stale(&h, &[old, c[0].clone()]), ["fedora"]);
    }

    fn names(h: &HyperConverged) -> Vec<String> {
        crons(h).iter().map(|c| c.name_any()).collect()
    }

    #[test]
    fn hcos_common_images_are_imported_when_enabled_and_only_then() {
        assert!(crons(&hc(serde_json::json!({}))).is_empty());
        let c = crons(&hc(
            serde_json::json!({"enableCommonBootImageImport": true}),
        ));
        assert_eq!(
            c.iter().map(|c| c.name_any()).collect::<Vec<_>>(),
            [
                "centos-stream9-image-cron",
                "centos-stream10-image-cron",
                "fedora-image-cron"
            ]
        );
        let fedora = &c[2].spec;
        assert_eq!(fedora.managed_data_source, "fedora");
        assert_eq!(fedora.schedule, "0 */12 * * *");
        assert_eq!(fedora.imports_to_keep, Some(1));
        let url =
            serde_json::to_value(&fedora.template).unwrap()["spec"]["source"]["registry"]["url"]
                .clone();
        assert_eq!(url, "docker://quay.io/containerdisks/fedora:latest");
    }

    #[test]
    fn turning_common_images_off_leaves_only_the_users_templates() {
        let h = hc(serde_json::json!({"enableCommonBootImageImport": false}));
        assert!(crons(&h).is_empty());
        let h = hc(serde_json::json!({"enableCommonBootImageImport": false,
            "dataImportCronTemplates": [template("win", None)]}));
        assert_eq!(names(&h), ["win"]);
    }

    #[test]
    fn a_users_template_named_as_a_common_one_replaces_it() {
        let h = hc(serde_json::json!({"enableCommonBootImageImport": true,
            "dataImportCronTemplates": [
            template("fedora-image-cron", None), template("win", None)]}));
        let c = crons(&h);
        assert_eq!(
            names(&h),
            [
                "centos-stream9-image-cron",
                "centos-stream10-image-cron",
                "fedora-image-cron",
                "win"
            ]
        );
        assert_eq!(c[2].spec.managed_data_source, "fedora-image-cron");
    }

    #[test]
    fn a_common_image_is_turned_off_by_a_disabled_template_of_its_name() {
        let h = hc(serde_json::json!({"enableCommonBootImageImport": true,
            "dataImportCronTemplates": [
            template("centos-stream9-image-cron", Some("false"))]}));
        assert_eq!(
            names(&h),
            ["centos-stream10-image-cron", "fedora-image-cron"]
        );
    }
}
