//! CDI's volume populators on the node: PVCs whose `dataSourceRef` names a VolumeImportSource,
//! a VolumeUploadSource or a VolumeCloneSource, filled through a PVC' whose volume is then
//! rebound to them.

use std::time::Instant;

use testkit::cluster::Cluster;

use crate::support::{
    CLASS, DV_LIMIT, FileServer, SNAPSHOT_CLASS, assert_disk, event_reasons, post_upload,
    qcow2_image, snapshot_class, upload_token,
};

/// A PVC of the bundle's class filled by `kind`/`source`, with `annotations` (YAML lines).
fn populated_pvc(ns: &str, name: &str, kind: &str, source: &str, annotations: &str) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
  namespace: {ns}
  annotations: {{{annotations}}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: {CLASS}
  resources: {{requests: {{storage: 64Mi}}}}
  dataSourceRef: {{apiGroup: cdi.kubevirt.io, kind: {kind}, name: {source}}}
"
    )
}

fn import_source(ns: &str, name: &str, url: &str) -> String {
    format!(
        "apiVersion: cdi.kubevirt.io/v1beta1
kind: VolumeImportSource
metadata: {{name: {name}, namespace: {ns}}}
spec:
  source:
    http: {{url: '{url}'}}
"
    )
}

/// Waits until PVC' of `pvc` is gone (deleted once its volume was rebound).
fn wait_prime_gone(c: &Cluster, ns: &str, pvc: &str) {
    let prime = crate::support::prime_of(c, ns, pvc);
    c.wait_until(
        ns,
        "pvc",
        "{.items[*].metadata.name}",
        "no PVC'",
        DV_LIMIT,
        |names| !names.split_whitespace().any(|n| n == prime),
    );
}

/// With WaitForFirstConsumer (the bundle's class) nothing happens until a pod uses the PVC;
/// then PVC' is made on the chosen node, the importer fills it, its volume is rebound to the
/// PVC and the consumer reads qemu-img's bytes. PVC' goes; the PVC says 100% and CDI's events.
#[test]
fn a_volume_import_source_fills_a_wait_for_first_consumer_pvc_for_its_consumer() {
    let Some(c) = crate::support::cluster() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &["xz", "-c"]);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("populate", &[]);
    let url = format!("{}/disk.qcow2.xz", server.url);
    c.apply(&import_source(&ns, "web", &url));
    c.apply(&populated_pvc(&ns, "disk", "VolumeImportSource", "web", ""));
    // The PV controller says the claim waits for its consumer; no PVC' before one comes.
    c.wait_until(
        &ns,
        "events",
        "{.items[*].reason}",
        "WaitForFirstConsumer",
        DV_LIMIT,
        |r| r.split_whitespace().any(|r| r == "WaitForFirstConsumer"),
    );
    let claims = c.kubectl_ok(&["-n", &ns, "get", "pvc", "-o", "name"]);
    assert_eq!(
        claims.trim(),
        "persistentvolumeclaim/disk",
        "PVC' before a consumer"
    );

    let start = Instant::now();
    assert_disk(c, &ns, "disk", &image, false);
    eprintln!(
        "populated WaitForFirstConsumer PVC read by its consumer after {:.1?}",
        start.elapsed()
    );
    wait_prime_gone(c, &ns, "disk");
    let progress = crate::support::pvc_field(
        c,
        &ns,
        "disk",
        "{.metadata.annotations.cdi\\.kubevirt\\.io/storage\\.populator\\.progress}",
    );
    assert_eq!(progress, "100.0%");
    let reasons = event_reasons(c, &ns, "PersistentVolumeClaim", "disk");
    for r in ["CreatedPVCPrimeSuccessfully", "importSucceeded"] {
        assert!(reasons.iter().any(|x| x == r), "{r} missing: {reasons:?}");
    }
}

/// `storage.bind.immediate.requested` populates at once, with no consumer: the PVC is Bound
/// with the disk before any pod uses it (how DataImportCrons land golden images); and a
/// DataVolume whose claim names the source is filled the same way.
#[test]
fn immediate_binding_populates_with_no_consumer() {
    let Some(c) = crate::support::cluster() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("populate-now", &[]);
    c.apply(&import_source(
        &ns,
        "src",
        &format!("{}/disk.qcow2", server.url),
    ));
    c.apply(&populated_pvc(
        &ns,
        "now",
        "VolumeImportSource",
        "src",
        "cdi.kubevirt.io/storage.bind.immediate.requested: 'true'",
    ));
    c.wait_for(&ns, "pvc/now", "{.status.phase}", "Bound", DV_LIMIT);
    wait_prime_gone(c, &ns, "now");
    assert_disk(c, &ns, "now", &image, false);

    // A DataVolume with no source whose claim names the same VolumeImportSource (CDI's
    // external population): its PVC carries the reference, the populator fills it, and the
    // DataVolume is Succeeded once it is bound.
    let start = Instant::now();
    c.apply(&format!(
        "apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: external
  namespace: {ns}
  annotations: {{cdi.kubevirt.io/storage.bind.immediate.requested: 'true'}}
spec:
  storage:
    storageClassName: {CLASS}
    resources: {{requests: {{storage: 64Mi}}}}
    dataSourceRef: {{apiGroup: cdi.kubevirt.io, kind: VolumeImportSource, name: src}}
"
    ));
    crate::support::wait_succeeded(c, &ns, "external", start);
    assert_disk(c, &ns, "external", &image, false);
    let reasons = event_reasons(c, &ns, "DataVolume", "external");
    assert!(
        reasons.iter().any(|r| r == "ExternalPopulationSucceeded"),
        "{reasons:?}"
    );
}

/// A VolumeUploadSource: the token API issues a token for the PVC, the upload proxy routes to
/// the upload server filling PVC', and the PVC is bound with the uploaded disk.
#[test]
fn a_volume_upload_source_is_filled_through_the_proxy() {
    let Some(c) = crate::support::cluster() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let ns = c.namespace("populate-up", &[]);
    c.apply(&format!(
        "apiVersion: cdi.kubevirt.io/v1beta1
kind: VolumeUploadSource
metadata: {{name: up, namespace: {ns}}}
spec: {{contentType: kubevirt}}
"
    ));
    c.apply(&populated_pvc(
        &ns,
        "target",
        "VolumeUploadSource",
        "up",
        "cdi.kubevirt.io/storage.bind.immediate.requested: 'true'",
    ));
    c.wait_for(
        &ns,
        "pvc/target",
        "{.metadata.annotations.cdi\\.kubevirt\\.io/storage\\.pod\\.phase}",
        "Running",
        DV_LIMIT,
    );
    let pod = c.kubectl_ok(&["-n", &ns, "get", "pods", "-o", "name"]);
    c.wait_for(
        &ns,
        pod.trim(),
        "{.status.containerStatuses[0].ready}",
        "true",
        DV_LIMIT,
    );
    let token = upload_token(c, &ns, "target");
    assert_eq!(
        post_upload(c, &token, &image.path),
        "200",
        "the proxy's answer"
    );
    c.wait_for(&ns, "pvc/target", "{.status.phase}", "Bound", DV_LIMIT);
    wait_prime_gone(c, &ns, "target");
    assert_disk(c, &ns, "target", &image, false);
    let reasons = event_reasons(c, &ns, "PersistentVolumeClaim", "target");
    assert!(
        reasons.iter().any(|r| r == "UploadSucceeded"),
        "{reasons:?}"
    );
}

/// VolumeCloneSources: a populated PVC cloned by the CSI driver, and a snapshot of it restored,
/// each into a PVC that binds with the source's disk (no pod copies anything); and the same PVC
/// cloned into a Block volume, which the driver cannot: copied host-assisted (an upload server
/// fills PVC', a clone source pod streams the source's disk to it).
#[test]
fn a_volume_clone_source_clones_a_pvc_and_restores_a_snapshot() {
    let Some(c) = crate::support::cluster() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let image = qcow2_image(dir.path(), &[]);
    let server = FileServer::start(c, dir.path());
    let ns = c.namespace("populate-clone", &[]);
    let immediate = "cdi.kubevirt.io/storage.bind.immediate.requested: 'true'";
    c.apply(&import_source(
        &ns,
        "src",
        &format!("{}/disk.qcow2", server.url),
    ));
    c.apply(&populated_pvc(
        &ns,
        "golden",
        "VolumeImportSource",
        "src",
        immediate,
    ));
    c.wait_for(&ns, "pvc/golden", "{.status.phase}", "Bound", DV_LIMIT);
    snapshot_class(c);
    c.apply(&format!(
        "apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {{name: snap, namespace: {ns}}}
spec:
  volumeSnapshotClassName: {SNAPSHOT_CLASS}
  source: {{persistentVolumeClaimName: golden}}
---
apiVersion: cdi.kubevirt.io/v1beta1
kind: VolumeCloneSource
metadata: {{name: from-pvc, namespace: {ns}}}
spec:
  source: {{kind: PersistentVolumeClaim, name: golden}}
---
apiVersion: cdi.kubevirt.io/v1beta1
kind: VolumeCloneSource
metadata: {{name: from-snap, namespace: {ns}}}
spec:
  source: {{apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}}
"
    ));
    c.apply(&populated_pvc(
        &ns,
        "copy",
        "VolumeCloneSource",
        "from-pvc",
        immediate,
    ));
    c.apply(&populated_pvc(
        &ns,
        "restored",
        "VolumeCloneSource",
        "from-snap",
        immediate,
    ));
    let block = populated_pvc(
        &ns,
        "block-copy",
        "VolumeCloneSource",
        "from-pvc",
        immediate,
    )
    .replace("spec:\n", "spec:\n  volumeMode: Block\n");
    c.apply(&block);
    for pvc in ["copy", "restored", "block-copy"] {
        c.wait_for(
            &ns,
            &format!("pvc/{pvc}"),
            "{.status.phase}",
            "Bound",
            DV_LIMIT,
        );
        wait_prime_gone(c, &ns, pvc);
        assert_disk(c, &ns, pvc, &image, pvc == "block-copy");
        let reasons = event_reasons(c, &ns, "PersistentVolumeClaim", pvc);
        assert!(
            reasons.iter().any(|r| r == "CloneSucceeded"),
            "{pvc}: {reasons:?}"
        );
    }
    let pods = c.kubectl_ok(&["-n", &ns, "get", "pods", "-o", "name"]);
    assert!(
        !pods.contains("importer-prime"),
        "a clone ran a pod: {pods}"
    );
}
