//! The discovery documents of the upload token API (what the aggregator and `kubectl api-resources`
//! read) and its OpenAPI v2 document (which the aggregator merges into the cluster's).

use serde_json::{Value, json};

/// The API group.
use api::names::UPLOAD_API_GROUP as GROUP;
/// The versions served, preferred first.
pub const VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];
/// The one resource.
pub const RESOURCE: &str = "uploadtokenrequests";

fn group_version(v: &str) -> Value {
    json!({ "groupVersion": format!("{GROUP}/{v}"), "version": v })
}

/// `GET /apis/upload.cdi.kubevirt.io`.
pub fn group() -> Value {
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": VERSIONS.iter().map(|v| group_version(v)).collect::<Vec<_>>(),
        "preferredVersion": group_version(VERSIONS[0]),
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": "" }],
    })
}

/// `GET /apis`.
pub fn group_list() -> Value {
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": [group()] })
}

/// `GET /apis/upload.cdi.kubevirt.io/VERSION`; None for a version not served.
pub fn resource_list(version: &str) -> Option<Value> {
    VERSIONS.contains(&version).then(|| {
        json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": format!("{GROUP}/{version}"),
            "resources": [{
                "name": RESOURCE,
                "singularName": "uploadtokenrequest",
                "namespaced": true,
                "group": GROUP,
                "version": version,
                "kind": "UploadTokenRequest",
                "verbs": ["create"],
                "shortNames": ["utr", "utrs"],
            }],
        })
    })
}

/// `GET /`: the paths served.
pub fn root_paths() -> Value {
    let mut paths = vec![
        "/apis".to_string(),
        "/apis/".into(),
        format!("/apis/{GROUP}"),
        "/healthz".into(),
        "/livez".into(),
        "/openapi/v2".into(),
        "/readyz".into(),
    ];
    paths.extend(VERSIONS.iter().map(|v| format!("/apis/{GROUP}/{v}")));
    paths.sort();
    json!({ "paths": paths })
}

/// `GET /openapi/v2`: the UploadTokenRequest definitions and the create operation per version.
pub fn openapi_v2() -> Value {
    let mut definitions = serde_json::Map::new();
    let mut paths = serde_json::Map::new();
    for v in VERSIONS {
        let name = format!("io.kubevirt.cdi.upload.{v}.UploadTokenRequest");
        definitions.insert(
            name.clone(),
            json!({
                "description": "UploadTokenRequest asks for a token to upload an image to a PVC.",
                "type": "object",
                "required": ["spec"],
                "properties": {
                    "apiVersion": { "type": "string" },
                    "kind": { "type": "string" },
                    "metadata": { "$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" },
                    "spec": {
                        "type": "object",
                        "required": ["pvcName"],
                        "properties": { "pvcName": { "type": "string", "description": "The PVC to upload to." } },
                    },
                    "status": {
                        "type": "object",
                        "properties": { "token": { "type": "string", "description": "The upload token (a PS256 JWT)." } },
                    },
                },
                "x-kubernetes-group-version-kind": [{ "group": GROUP, "kind": "UploadTokenRequest", "version": v }],
            }),
        );
        let reference = json!({ "$ref": format!("#/definitions/{name}") });
        paths.insert(
            format!("/apis/{GROUP}/{v}/namespaces/{{namespace}}/{RESOURCE}"),
            json!({
                "post": {
                    "operationId": format!("createNamespacedUploadTokenRequest-{v}"),
                    "consumes": ["application/json"],
                    "produces": ["application/json"],
                    "parameters": [
                        { "name": "namespace", "in": "path", "required": true, "type": "string" },
                        { "name": "body", "in": "body", "required": true, "schema": reference },
                    ],
                    "responses": {
                        "200": { "description": "OK", "schema": reference },
                        "401": { "description": "Unauthorized" },
                    },
                    "x-kubernetes-action": "post",
                    "x-kubernetes-group-version-kind": { "group": GROUP, "kind": "UploadTokenRequest", "version": v },
                },
            }),
        );
    }
    definitions.insert(
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta".into(),
        json!({ "type": "object", "description": "Standard object metadata." }),
    );
    json!({
        "swagger": "2.0",
        "info": { "title": "Quarry upload token API", "version": VERSIONS[0] },
        "paths": paths,
        "definitions": definitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_version_is_discoverable_and_prefers_v1beta1() {
        let g = group();
        assert_eq!(g["preferredVersion"]["version"], "v1beta1");
        assert_eq!(g["versions"].as_array().unwrap().len(), 2);
        for v in VERSIONS {
            let list = resource_list(v).unwrap();
            assert_eq!(list["resources"][0]["kind"], "UploadTokenRequest");
            assert_eq!(list["resources"][0]["verbs"], json!(["create"]));
        }
        assert!(resource_list("v1").is_none());
        assert_eq!(group_list()["groups"][0]["name"], GROUP);
    }

    #[test]
    fn openapi_names_the_create_operation_of_each_version() {
        let doc = openapi_v2();
        for v in VERSIONS {
            let path = format!("/apis/{GROUP}/{v}/namespaces/{{namespace}}/{RESOURCE}");
            assert!(doc["paths"][&path]["post"].is_object(), "{path}");
        }
    }
}
