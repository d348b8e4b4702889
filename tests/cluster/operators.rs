//! The operators on the node: a HyperConverged making its children and golden images, with the
//! admission webhook guarding its removal.

use crate::support::{DV_LIMIT, FileServer, assert_disk, cluster};
use testkit::cluster::{Cluster, NAMESPACE};

/// The children of a HyperConverged that other operators own (KubeVirt, SSP, the network addons
/// operator): their CRDs, as those operators install them, reduced to what the API server needs
/// to store the objects. Created when missing.
const FOREIGN_CHILDREN: [(&str, &str, &str, &str, &str); 3] = [
    ("kubevirt.io", "v1", "KubeVirt", "kubevirts", "Namespaced"),
    ("ssp.kubevirt.io", "v1beta2", "SSP", "ssps", "Namespaced"),
    (
        "networkaddonsoperator.network.kubevirt.io",
        "v1",
        "NetworkAddonsConfig",
        "networkaddonsconfigs",
        "Cluster",
    ),
];

fn foreign_crds_installed(c: &Cluster) -> bool {
    FOREIGN_CHILDREN.iter().all(|(group, _, _, plural, _)| {
        c.kubectl(&["get", "crd", &format!("{plural}.{group}")])
            .status
            .success()
    })
}

fn install_foreign_crds(c: &Cluster) {
    for (group, version, kind, plural, scope) in FOREIGN_CHILDREN {
        c.apply(&format!(
            "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: {plural}.{group}}}
spec:
  group: {group}
  scope: {scope}
  names: {{kind: {kind}, plural: {plural}, singular: {singular}, listKind: {kind}List}}
  versions:
  - name: {version}
    served: true
    storage: true
    subresources: {{status: {{}}}}
    schema:
      openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
",
            singular = kind.to_ascii_lowercase()
        ));
        c.wait_for(
            "default",
            &format!("crd/{plural}.{group}"),
            "{.status.conditions[?(@.type==\"Established\")].status}",
            "True",
            DV_LIMIT,
        );
    }
}

/// The HyperConverged, as `kubectl get` names it.
const HC: &str = "hyperconverged/kubevirt-hyperconverged";

/// Waits until the HyperConverged's condition `type_`, read as `status reason message`, has
/// `status` (`True`/`False`): that reading.
fn wait_hc_condition(c: &Cluster, type_: &str, status: &str) -> String {
    let field = |f: &str| format!("{{.status.conditions[?(@.type==\"{type_}\")].{f}}}");
    c.wait_until(
        NAMESPACE,
        HC,
        &format!(
            "{} {} {}",
            field("status"),
            field("reason"),
            field("message")
        ),
        &format!("{type_} {status}"),
        DV_LIMIT,
        |v| v.split(' ').next() == Some(status),
    )
}

/// A HyperConverged in Quarry's namespace: without KubeVirt's CRDs it says which is missing;
/// with them its children exist and it completes; the CDI child is marked Available by Quarry's
/// DataVolume controller (as CDI's operator does), so the HyperConverged becomes Available once
/// the other operators' children are; its golden-image template becomes a DataImportCron whose
/// import lands; and the webhook refuses its removal while DataVolumes exist.
#[test]
fn a_hyperconverged_makes_its_children_and_golden_images() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = crate::support::raw_image(dir.path(), "golden.img", 7);
    let server = FileServer::start(c, dir.path());
    let golden = c.namespace("hco-golden", &[]);
    let missing_at_start = !foreign_crds_installed(c);
    c.apply(&format!(
        "apiVersion: hco.kubevirt.io/v1beta1
kind: HyperConverged
metadata: {{name: kubevirt-hyperconverged, namespace: {NAMESPACE}}}
spec:
  commonBootImageNamespace: {golden}
  dataImportCronTemplates:
  - metadata: {{name: tiny-image-cron}}
    spec:
      schedule: '0 */12 * * *'
      managedDataSource: tiny
      template:
        spec:
          source:
            http: {{url: '{url}/golden.img'}}
          storage:
            storageClassName: {class}
            resources: {{requests: {{storage: 32Mi}}}}
",
        url = server.url,
        class = crate::support::CLASS
    ));
    if missing_at_start {
        let v = wait_hc_condition(c, "ReconcileComplete", "False");
        assert!(v.contains("is not installed"), "{v}");
        install_foreign_crds(c);
    }
    wait_hc_condition(c, "ReconcileComplete", "True");
    // The HyperConverged does not ask for a HostPathProvisioner: the default one, and the CSI
    // driver serving every volume, stay.
    c.kubectl_ok(&["get", "hostpathprovisioner", "hostpath-provisioner"]);
    c.kubectl_ok(&["-n", NAMESPACE, "get", "daemonset", "quarry-csi"]);
    for child in [
        "cdi/cdi-kubevirt-hyperconverged",
        "networkaddonsconfig/cluster",
    ] {
        c.kubectl_ok(&["get", child]);
    }
    for child in [
        "kubevirt/kubevirt-kubevirt-hyperconverged",
        "ssp/ssp-kubevirt-hyperconverged",
    ] {
        c.kubectl_ok(&["-n", NAMESPACE, "get", child]);
    }
    let related = c.kubectl_ok(&[
        "-n",
        NAMESPACE,
        "get",
        HC,
        "-o",
        "jsonpath={.status.relatedObjects[*].kind}",
    ]);
    for kind in ["CDI", "KubeVirt", "SSP", "NetworkAddonsConfig"] {
        assert!(related.split(' ').any(|k| k == kind), "{related}");
    }

    // Quarry is CDI here: its DataVolume controller reports the CDI child Deployed.
    c.wait_for(
        "default",
        "cdi/cdi-kubevirt-hyperconverged",
        "{.status.conditions[?(@.type==\"Available\")].status}",
        "True",
        DV_LIMIT,
    );
    c.wait_for(
        "default",
        "cdi/cdi-kubevirt-hyperconverged",
        "{.status.phase}",
        "Deployed",
        DV_LIMIT,
    );
    // The other operators are not installed: the HyperConverged names one of theirs.
    let v = wait_hc_condition(c, "Available", "False");
    assert!(!v.contains("CDINotAvailable"), "{v}");
    for (kind, name, ns) in [
        ("kubevirt", "kubevirt-kubevirt-hyperconverged", NAMESPACE),
        ("ssp", "ssp-kubevirt-hyperconverged", NAMESPACE),
        ("networkaddonsconfig", "cluster", ""),
    ] {
        // What those operators write when they are done.
        let mut args = vec![
            "patch",
            kind,
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[
                {"type":"Available","status":"True","reason":"Done","message":""},
                {"type":"Progressing","status":"False","reason":"Done","message":""},
                {"type":"Degraded","status":"False","reason":"Done","message":""}]}}"#,
        ];
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        c.kubectl_ok(&args);
    }
    wait_hc_condition(c, "Available", "True");

    let pvc = crate::support::data_source_pvc(c, &golden, "tiny", None);
    assert_disk(c, &golden, &pvc, &image, false);

    // The webhook refuses the uninstall while DataVolumes exist (the golden image's, at least).
    let out = c.kubectl(&["-n", NAMESPACE, "delete", HC, "--wait=false"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Rejecting the uninstall request"),
        "{err}"
    );
}
