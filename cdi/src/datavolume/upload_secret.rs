//! The TLS Secret of an upload server when certificates are issued per pod
//! ([`super::UploadTls::Issued`]), as CDI's upload controller does: in the pod's namespace,
//! named as the upload pod, owned as the pod (collected with its DataVolume or PVC'), holding a
//! serving certificate for the upload Service's DNS names issued from the cert controller's
//! upload server signer and the upload proxy's client CA bundle (`ca.crt`), which the upload
//! server requires of its clients. What to write is `certs::plan::upload_server_secret`'s.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;

use super::pod::{self, Workload};
use api::names::secret;
use certs::{self, pki::Pair, plan};
use kubekit::error::{Error, Result};
use kubekit::kubeops;

/// Makes sure the upload server of `w` has its Secret, issued from the signer in
/// `signer_namespace`, and that it is current (re-issued when due or when the signer or the
/// client bundle changed). Returns how soon to look again.
pub async fn ensure(
    client: &kube::Client,
    w: &Workload,
    signer_namespace: &str,
    manager: &str,
) -> Result<Duration> {
    let ns = w.namespace.clone().unwrap_or_default();
    let install_secrets: Api<Secret> = Api::namespaced(client.clone(), signer_namespace);
    let install_maps: Api<ConfigMap> = Api::namespaced(client.clone(), signer_namespace);
    let missing = |what: &str| {
        Error::Certificate(format!(
            "{signer_namespace}/{what} is missing or incomplete (is the cert controller running?)"
        ))
    };
    let signer = kubeops::get(&install_secrets, secret::UPLOAD_SERVER_SIGNER)
        .await?
        .and_then(|s| {
            let mut data = certs::text_data(&s);
            Some(Pair {
                cert: data.remove(plan::TLS_CRT)?,
                key: data.remove(plan::TLS_KEY)?,
            })
        })
        .ok_or_else(|| missing(secret::UPLOAD_SERVER_SIGNER))?;
    let bundle = kubeops::get(&install_maps, secret::UPLOAD_SERVER_CLIENT_SIGNER_BUNDLE)
        .await?
        .and_then(|cm| cm.data?.remove(secret::BUNDLE_KEY))
        .ok_or_else(|| missing(secret::UPLOAD_SERVER_CLIENT_SIGNER_BUNDLE))?;
    let durations = certs::durations(client).await?;

    let service = pod::upload_name(&w.name);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let existing = kubeops::get(&secrets, &service)
        .await?
        .map(|s| certs::text_data(&s));
    let now = token::now();
    let plan = plan::upload_server_secret(
        existing.as_ref(),
        &signer,
        &bundle,
        (&service, &ns),
        now,
        &durations,
    )?;
    let next = Duration::from_secs(plan.next.saturating_sub(now).unsigned_abs());
    let Some(data) = plan.write else {
        return Ok(next);
    };
    let s = Secret {
        metadata: ObjectMeta {
            name: Some(service.clone()),
            namespace: Some(ns.clone()),
            labels: Some(w.labels.clone()),
            owner_references: w.owner.clone().map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        type_: Some(plan::TYPE_TLS.into()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Secret::default()
    };
    kubeops::apply(&secrets, &service, &s, manager).await?;
    tracing::info!(secret = %format!("{ns}/{service}"), "upload server certificate issued");
    Ok(next)
}
