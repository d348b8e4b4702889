//! What the API server calls back: the token API's `APIService`s, the two validating
//! webhook configurations and the DataVolume mutating one. Their `caBundle`s are left out: the cert controller injects them
//! (and an apply of the bundle, not owning that field, leaves them in place).

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use serde_json::json;

use api::names::UPLOAD_API_GROUP as GROUP;
use api::names::{self, NAMESPACE, component, service, webhook};

use api::rbac::meta;

/// One `APIService` per version of `upload.cdi.kubevirt.io`, with CDI's priorities.
pub fn api_services() -> Vec<APIService> {
    names::API_SERVICES
        .iter()
        .map(|name| {
            let version = name.split('.').next().expect("VERSION.GROUP");
            serde_json::from_value(json!({
                "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": meta(name, None, component::APISERVER),
                "spec": {
                    "group": GROUP,
                    "version": version,
                    "service": {"name": service::APISERVER, "namespace": NAMESPACE, "port": 443},
                    "groupPriorityMinimum": 1000,
                    "versionPriority": 15,
                }
            }))
            .expect("an APIService")
        })
        .collect()
}

/// A configuration with one webhook (failurePolicy Fail, as HCO's and CDI's).
fn config(
    name: &str,
    component: &str,
    webhook_name: &str,
    service: &str,
    path: &str,
    rule: serde_json::Value,
) -> ValidatingWebhookConfiguration {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": meta(name, None, component),
        "webhooks": [{
            "name": webhook_name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "clientConfig": {"service": {"name": service, "namespace": NAMESPACE, "path": path, "port": 443}},
            "rules": [rule],
        }]
    }))
    .expect("a ValidatingWebhookConfiguration")
}

/// HCO's HyperConverged validator and CDI's DataVolume validator.
pub fn webhooks() -> Vec<ValidatingWebhookConfiguration> {
    vec![
        config(
            webhook::HYPERCONVERGED_CONFIG,
            component::HYPERCONVERGED_CONTROLLER,
            "validate-hco.kubevirt.io",
            service::HYPERCONVERGED_WEBHOOK,
            api::names::webhook::HYPERCONVERGED_PATH,
            json!({"apiGroups": ["hco.kubevirt.io"], "apiVersions": ["v1beta1"],
                   "operations": ["CREATE", "UPDATE", "DELETE"],
                   "resources": ["hyperconvergeds"], "scope": "Namespaced"}),
        ),
        config(
            webhook::DATAVOLUME_CONFIG,
            component::APISERVER,
            "datavolume-validate.cdi.kubevirt.io",
            service::APISERVER,
            webhook::DATAVOLUME_PATH,
            json!({"apiGroups": ["cdi.kubevirt.io"], "apiVersions": ["v1beta1"],
                   "operations": ["CREATE", "UPDATE"],
                   "resources": ["datavolumes"], "scope": "Namespaced"}),
        ),
    ]
}

/// CDI's DataVolume mutating webhook: on CREATE it authorizes a clone and adds the clone token
/// (`failurePolicy: Fail`: a clone is never created unauthorized while it is registered).
pub fn mutating_webhooks() -> Vec<MutatingWebhookConfiguration> {
    let mut config = serde_json::to_value(config(
        webhook::DATAVOLUME_MUTATE_CONFIG,
        component::APISERVER,
        "datavolume-mutate.cdi.kubevirt.io",
        service::APISERVER,
        webhook::DATAVOLUME_MUTATE_PATH,
        json!({"apiGroups": ["cdi.kubevirt.io"], "apiVersions": ["v1beta1"],
               "operations": ["CREATE"],
               "resources": ["datavolumes"], "scope": "Namespaced"}),
    ))
    .expect("serialisable");
    config["kind"] = json!("MutatingWebhookConfiguration");
    vec![serde_json::from_value(config).expect("a MutatingWebhookConfiguration")]
}
