//! Golden images of a HyperConverged: each `spec.dataImportCronTemplates` entry becomes a
//! DataImportCron in the boot image namespace (`spec.commonBootImageNamespace`, else HCO's
//! `openshift-virtualization-os-images`), as HCO has SSP create them. A template annotated
//! `dataimportcrontemplate.kubevirt.io/enable: "false"` is skipped (HCO's way to turn one off).
//! The crons carry HCO's child labels, so crons whose template went away are found and deleted.

use kube::ResourceExt;

use crate::api::HyperConverged;
use crate::api::golden::DataImportCron;

/// HCO's default namespace of golden images.
pub const DEFAULT_NAMESPACE: &str = "openshift-virtualization-os-images";
/// HCO's annotation disabling one template.
pub const ENABLE_ANNOTATION: &str = "dataimportcrontemplate.kubevirt.io/enable";

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
    hc.spec
        .data_import_cron_templates
        .iter()
        .flatten()
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
    use crate::api::HyperConvergedSpec;

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
        let h = hc(serde_json::json!({"dataImportCronTemplates": [template("fedora", None)]}));
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
        assert_eq!(crons(&h)[0].namespace().as_deref(), Some("golden"));
    }

    #[test]
    fn a_disabled_template_makes_no_cron_and_its_old_cron_is_stale() {
        let h = hc(serde_json::json!({"dataImportCronTemplates": [
            template("fedora", Some("false")), template("centos", Some("true"))]}));
        let c = crons(&h);
        assert_eq!(
            c.iter().map(|c| c.name_any()).collect::<Vec<_>>(),
            ["centos"]
        );
        let old = DataImportCron::new("fedora", Default::default());
        assert_eq!(stale(&h, &[old, c[0].clone()]), ["fedora"]);
    }
}
