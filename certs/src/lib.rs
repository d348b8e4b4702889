//! `quarry controller certs`: the TLS of a cluster install, made and rotated as CDI's cert
//! manager does. In its namespace it keeps the signers (self-signed CAs), the serving and client
//! certificates they sign and the bundle ConfigMaps clients trust (`names::secret`), plus the
//! upload token key pair; it puts the API server signer's bundle into the `caBundle` of the
//! token API's APIServices and of both validating webhook configurations, and looks again when
//! the next certificate is due. Lifetimes come from the `CDI` CR's `spec.certConfig` (which the
//! HyperConverged controller fills from its own). The decisions are [`plan::plan`]'s; this
//! module reads and writes the objects.

pub mod pki;
pub mod plan;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use api::Cdi;
use api::cdi::active_cdi;
use api::hyperconverged::CertConfig;
use api::names::{self, secret};
use kubekit::error::Result;
use kubekit::kubeops;
use plan::{Current, Data, Durations, Plan, SecretWrite};

/// The controller's name: field manager and User-Agent `quarry-certs`.
pub const CONTROLLER: &str = "certs";
/// How long to wait after a failed reconcile.
const RETRY: Duration = Duration::from_secs(10);
/// How soon to look again while an APIService or webhook configuration is not there yet.
const WAIT_FOR_TARGETS: Duration = Duration::from_secs(30);

/// What one reconcile did.
#[derive(Debug)]
pub struct Outcome {
    pub plan: Plan,
    /// The APIServices and webhook configurations whose `caBundle` was changed.
    pub injected: Vec<String>,
    /// Those that do not exist (yet).
    pub missing: Vec<String>,
}

/// Runs the controller in `namespace`: reconciles, then sleeps until the next renewal (at most
/// `resync`, so a changed certConfig or a deleted Secret is seen), until SIGTERM.
pub async fn run(client: kube::Client, namespace: String, resync: Duration) -> Result<()> {
    let work = async {
        loop {
            let wait = match reconcile(&client, &namespace, token::now()).await {
                Ok(out) => {
                    let until = out.plan.next.saturating_sub(token::now()).max(1);
                    let mut wait = resync.min(Duration::from_secs(until.unsigned_abs()));
                    if !out.missing.is_empty() {
                        wait = wait.min(WAIT_FOR_TARGETS);
                    }
                    wait
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cert reconcile failed");
                    RETRY
                }
            };
            tracing::debug!(?wait, "next cert reconcile");
            tokio::time::sleep(wait).await;
        }
    };
    tokio::select! {
        () = work => Ok(()),
        () = netkit::runtime::terminated() => Ok(()),
    }
}

/// One pass: reads the lifetimes, the Secrets and bundles, writes what [`plan::plan`] says at
/// `now` (Unix seconds), and puts the API server signer's bundle into the `caBundle`s.
pub async fn reconcile(client: &kube::Client, namespace: &str, now: i64) -> Result<Outcome> {
    let durations = durations(client).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut current = Current::default();
    for name in plan::secret_names() {
        if let Some(s) = kubeops::get(&secrets, name).await? {
            current.secrets.insert(name.into(), text_data(&s));
        }
    }
    for name in plan::bundle_names() {
        if let Some(text) = kubeops::get(&config_maps, name)
            .await?
            .and_then(|cm| cm.data?.remove(secret::BUNDLE_KEY))
        {
            current.bundles.insert(name.into(), text);
        }
    }
    let plan = plan::plan(&current, now, &durations, namespace)?;
    let manager = kubeops::manager(CONTROLLER);
    for write in &plan.signers {
        write_secret(&secrets, namespace, write, &manager).await?;
    }
    for (name, text) in &plan.bundles {
        let cm = ConfigMap {
            metadata: meta(name, namespace),
            data: Some(BTreeMap::from([(secret::BUNDLE_KEY.into(), text.clone())])),
            ..ConfigMap::default()
        };
        kubeops::apply(&config_maps, name, &cm, &manager).await?;
        tracing::info!(bundle = %name, "CA bundle written");
    }
    let (injected, missing) = inject(client, plan.api_ca_bundle.as_bytes()).await?;
    for write in &plan.certs {
        write_secret(&secrets, namespace, write, &manager).await?;
    }
    Ok(Outcome {
        plan,
        injected,
        missing,
    })
}

fn meta(name: &str, namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".into(),
            names::component::CERT_CONTROLLER.into(),
        )])),
        ..ObjectMeta::default()
    }
}

/// A Secret's data as text (values that are not UTF-8 are left out: no PEM is lost).
pub fn text_data(s: &Secret) -> Data {
    s.data
        .iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.0.clone()).ok()?)))
        .collect()
}

async fn write_secret(
    api: &Api<Secret>,
    namespace: &str,
    write: &SecretWrite,
    manager: &str,
) -> Result<()> {
    let s = Secret {
        metadata: meta(&write.name, namespace),
        type_: Some(write.type_.into()),
        data: Some(
            write
                .data
                .iter()
                .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    };
    kubeops::apply(api, &write.name, &s, manager).await?;
    tracing::info!(secret = %write.name, why = write.why, "certificate written");
    Ok(())
}

/// The lifetimes the CDI CRs ask for: the active one's `spec.certConfig` (the CR CDI's operator
/// serves: the only one, or the only one whose phase is not `Error`, [`active_cdi`]), the
/// defaults without one. Err: why the defaults are to be used instead (several active CRs, or
/// a certConfig that cannot be honoured).
pub fn durations_of(crs: &[Cdi]) -> std::result::Result<Durations, String> {
    let Some(cdi) = active_cdi(crs)? else {
        return Ok(Durations::default());
    };
    let given = cdi.spec.cert_config.clone().unwrap_or_default();
    let config = CertConfig {
        ca: given.ca,
        server: given.server,
    };
    Durations::from_cert_config(&config).map_err(|e| {
        let name = cdi.metadata.name.as_deref().unwrap_or_default();
        format!("CDI {name}: {e}")
    })
}

/// The lifetimes of the active `CDI` CR's `spec.certConfig` ([`durations_of`]; the defaults
/// without a CR or its CRD, or when they cannot be honoured, which is logged).
pub async fn durations(client: &kube::Client) -> Result<Durations> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<Cdi>(&()));
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Durations::default()),
        Err(e) => return Err(e.into()),
    };
    // Read one by one: a CR that does not parse is skipped, with a warning, instead of
    // leaving every certificate unrenewed.
    let mut crs = Vec::new();
    for o in list.items {
        let name = o.metadata.name.clone().unwrap_or_default();
        match o.try_parse::<Cdi>() {
            Ok(c) => crs.push(c),
            Err(e) => tracing::warn!(cdi = %name, error = %e, "CDI CR not understood, skipped"),
        }
    }
    Ok(durations_of(&crs).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "certConfig ignored, using the defaults");
        Durations::default()
    }))
}

/// The names of the webhooks whose `caBundle` is not `bundle`.
fn stale_hooks<'a>(
    hooks: impl Iterator<Item = (&'a String, &'a WebhookClientConfig)>,
    bundle: &[u8],
) -> Vec<String> {
    hooks
        .filter(|(_, c)| c.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(bundle))
        .map(|(name, _)| name.clone())
        .collect()
}

/// Sets the `caBundle` (base64 `encoded`) of configuration `name`'s webhooks (as `webhooks`
/// lists them: name and client config) whose bundle is not `bundle`, recording the
/// configuration as injected, or as missing when it does not exist.
async fn patch_ca<K>(
    api: &Api<K>,
    name: &str,
    webhooks: impl FnOnce(K) -> Vec<(String, WebhookClientConfig)>,
    (bundle, encoded): (&[u8], &str),
    params: &PatchParams,
    (injected, missing): (&mut Vec<String>, &mut Vec<String>),
) -> Result<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let what = format!("{}/{name}", K::kind(&()));
    let stale = kubeops::get(api, name).await?.map(|c| {
        let hooks = webhooks(c);
        stale_hooks(hooks.iter().map(|(n, c)| (n, c)), bundle)
    });
    let Some(stale) = stale else {
        missing.push(what);
        return Ok(());
    };
    if !stale.is_empty() {
        let hooks: Vec<_> = stale
            .iter()
            .map(|w| json!({"name": w, "clientConfig": {"caBundle": encoded}}))
            .collect();
        api.patch(
            name,
            params,
            &Patch::Strategic(&json!({ "webhooks": hooks })),
        )
        .await?;
        injected.push(what);
    }
    Ok(())
}

/// Puts `bundle` into the `caBundle` of the token API's APIServices and of the webhook
/// configurations, patching only that field where it differs. Returns the objects changed and
/// those missing.
async fn inject(client: &kube::Client, bundle: &[u8]) -> Result<(Vec<String>, Vec<String>)> {
    let encoded = STANDARD.encode(bundle);
    let (mut injected, mut missing) = (Vec::new(), Vec::new());
    let params = PatchParams {
        field_manager: Some(kubeops::manager(CONTROLLER)),
        ..PatchParams::default()
    };
    let api_services: Api<APIService> = Api::all(client.clone());
    for name in names::API_SERVICES {
        let Some(svc) = kubeops::get(&api_services, name).await? else {
            missing.push(format!("APIService/{name}"));
            continue;
        };
        let has = svc.spec.and_then(|s| s.ca_bundle).map(|b| b.0);
        if has.as_deref() != Some(bundle) {
            let patch = json!({"spec": {"caBundle": encoded}});
            api_services
                .patch(name, &params, &Patch::Merge(&patch))
                .await?;
            injected.push(format!("APIService/{name}"));
        }
    }
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for name in [
        names::webhook::HYPERCONVERGED_CONFIG,
        names::webhook::DATAVOLUME_CONFIG,
    ] {
        let webhooks = |c: ValidatingWebhookConfiguration| {
            let hooks = c.webhooks.unwrap_or_default();
            hooks
                .into_iter()
                .map(|w| (w.name, w.client_config))
                .collect()
        };
        let out = (&mut injected, &mut missing);
        patch_ca(
            &validating,
            name,
            webhooks,
            (bundle, &encoded),
            &params,
            out,
        )
        .await?;
    }
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let webhooks = |c: MutatingWebhookConfiguration| {
        let hooks = c.webhooks.unwrap_or_default();
        hooks
            .into_iter()
            .map(|w| (w.name, w.client_config))
            .collect()
    };
    let name = names::webhook::DATAVOLUME_MUTATE_CONFIG;
    let out = (&mut injected, &mut missing);
    patch_ca(&mutating, name, webhooks, (bundle, &encoded), &params, out).await?;
    for what in &injected {
        tracing::info!(%what, "caBundle injected");
    }
    Ok((injected, missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CDI CR `name` in `phase` whose certConfig gives the CA `ca_hours` hours.
    fn cdi(name: &str, phase: Option<&str>, ca_hours: u64) -> Cdi {
        serde_json::from_value(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
            "metadata": {"name": name},
            "spec": {"certConfig": {"ca": {"duration": format!("{ca_hours}h0m0s"),
                                           "renewBefore": "1h0m0s"}}},
            "status": {"phase": phase}}))
        .unwrap()
    }

    fn ca_hours(d: Durations) -> u64 {
        d.ca.duration.as_secs() / 3600
    }

    #[test]
    fn durations_come_from_the_active_cdi_not_the_first_listed() {
        assert_eq!(durations_of(&[]), Ok(Durations::default()));
        assert_eq!(
            durations_of(&[cdi("only", Some("Error"), 72)]).map(ca_hours),
            Ok(72)
        );
        // The first listed is in Error: the one CDI's operator serves is the other.
        let crs = [
            cdi("cdi", Some("Error"), 100),
            cdi("cdi-kubevirt-hyperconverged", Some("Deployed"), 72),
        ];
        assert_eq!(durations_of(&crs).map(ca_hours), Ok(72));
        // Two active ones: neither is taken (the caller logs why and uses the defaults).
        let crs = [cdi("cdi", None, 100), cdi("other", Some("Deployed"), 72)];
        let e = durations_of(&crs).unwrap_err();
        assert!(
            e.contains("invalid number of active CDI resources: 2"),
            "{e}"
        );
        // A certConfig that cannot be honoured names its CR.
        let e = durations_of(&[cdi("cdi", None, 0)]).unwrap_err();
        assert!(e.starts_with("CDI cdi: certConfig.ca"), "{e}");
    }
}
