//! The populator's registration against the real API server: nothing to do where the volume
//! data source validator's VolumePopulator CRD is missing; with it, one VolumePopulator per
//! source kind, written with the datavolume controller's own RBAC.

use api::names::component;
use api::populator::registration;
use kube::api::{Api, DynamicObject};
use serde_json::json;

use crate::support::{apply, component_client, established, namespace};

#[tokio::test]
async fn the_source_kinds_are_registered_as_volume_populators_where_the_crd_is() {
    let Some(ctl) = component_client(component::DATAVOLUME_CONTROLLER).await else {
        return;
    };
    let (admin, _) = namespace("populator", &[])
        .await
        .expect("the server of component_client");
    let manager = "quarry-populator";
    // No CRD yet: nothing to register, and no error.
    cdi::populator::controller::register(&ctl, manager)
        .await
        .expect("no VolumePopulator CRD is not an error");

    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        // As the validator's own CRD: a *.k8s.io group needs an approval annotation.
        "metadata": {"name": "volumepopulators.populator.storage.k8s.io",
                     "annotations": {"api-approved.kubernetes.io":
                         "https://github.com/kubernetes/enhancements/pull/1495"}},
        "spec": {
            "group": "populator.storage.k8s.io",
            "scope": "Cluster",
            "names": {"kind": "VolumePopulator", "listKind": "VolumePopulatorList",
                      "plural": "volumepopulators", "singular": "volumepopulator"},
            "versions": [{"name": "v1beta1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "required": ["sourceKind"],
                    "properties": {
                        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "sourceKind": {"type": "object", "required": ["kind"],
                            "properties": {"group": {"type": "string"},
                                           "kind": {"type": "string"}}}}}}}]
        }
    });
    apply(&admin, &crd).await.unwrap();
    established(&admin, "volumepopulators.populator.storage.k8s.io").await;
    cdi::populator::controller::register(&ctl, manager)
        .await
        .expect("registering");
    // Again: idempotent.
    cdi::populator::controller::register(&ctl, manager)
        .await
        .expect("registering again");

    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &registration::api_resource());
    let mut found: Vec<(String, String, String)> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| {
            let kind = &o.data["sourceKind"];
            (
                o.metadata.name.unwrap_or_default(),
                kind["group"].as_str().unwrap_or_default().to_string(),
                kind["kind"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    found.sort();
    let want = |name: &str, kind: &str| {
        (
            name.to_string(),
            "cdi.kubevirt.io".to_string(),
            kind.to_string(),
        )
    };
    assert_eq!(
        found,
        [
            want("volumeclonesource-populator", "VolumeCloneSource"),
            want("volumeimportsource-populator", "VolumeImportSource"),
            want("volumeuploadsource-populator", "VolumeUploadSource"),
        ]
    );
}
