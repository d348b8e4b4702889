//! The CDIConfig and StorageProfile reconcilers. Each reconciles everything it keeps at once
//! (one CDIConfig; a handful of StorageClasses), whenever an object it watches changes and every
//! few minutes; changes that arrive together make one pass. Decisions are [`crate::settings`]'
//! and [`super::profile`]'s; this module reads, writes and hands the settings in force to the
//! DataVolume reconciles ([`LiveSettings::set`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{BoxStream, select_all};
use futures_util::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::cdi_status::{COMPONENTS, cdi_status};
use super::profile::profile_status;
use crate::settings::LiveSettings;
use crate::settings::{active_cdi, config_status, effective};
use api::cdi::{CDI_CONFIG_NAME, StorageProfileSpec, cdi_labels};
use api::names;
use api::{Cdi, CdiConfig, StorageProfile};
use kubekit::error::{Error, ErrorKind, Result};
use kubekit::kubeops;
use kubekit::metrics::Metrics;

/// Name of the CDIConfig reconciler in metrics, its field manager and logs.
pub const CONFIG_CONTROLLER: &str = "cdiconfig";
/// Name of the StorageProfile reconciler.
pub const PROFILE_CONTROLLER: &str = "storageprofile";
/// A pass even without a change (the watches may have missed one).
const RESYNC: Duration = Duration::from_secs(300);
/// The wait after a failed pass.
const RETRY: Duration = Duration::from_secs(5);

/// What both reconcilers share.
pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    /// Where the CDIConfig reconciler puts the settings in force, for the DataVolume reconciles.
    pub settings: Arc<LiveSettings>,
}

/// One trigger per change of `api`'s objects.
fn changes<K>(api: Api<K>) -> BoxStream<'static, ()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .map(|_| ())
        .boxed()
}

/// Runs `pass` on every batch of triggers (and every [`RESYNC`]) until the triggers end; a pass
/// that failed transiently runs again after [`RETRY`], one refused for what the objects say
/// waits for them to change.
async fn drive<F, Fut>(ctx: &Context, name: &str, triggers: Vec<BoxStream<'static, ()>>, pass: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut triggers = select_all(triggers);
    let mut again = false;
    loop {
        if !again {
            tokio::select! {
                t = triggers.next() => if t.is_none() { return },
                _ = tokio::time::sleep(RESYNC) => {}
            }
        }
        while let Some(Some(())) = triggers.next().now_or_never() {}
        let outcome = {
            let _measure = ctx.metrics.reconcile(name);
            pass().await
        };
        again = false;
        if let Err(e) = outcome {
            tracing::warn!(controller = name, error = %e, "reconcile failed");
            ctx.metrics.failure(name, &e);
            if e.kind() == ErrorKind::Transient {
                again = true;
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Keeps the CDIConfig `config` as CDI does: its spec is the active CDI CR's `spec.config`
/// (left as written where no CR exists), its status the settings in force, which the
/// DataVolume reconciles use from then on.
pub async fn reconcile_config(ctx: &Context) -> Result<()> {
    let client = ctx.client.clone();
    let crs = Api::<Cdi>::all(client.clone())
        .list(&Default::default())
        .await?
        .items;
    let active = active_cdi(&crs).map_err(Error::InvalidSpec)?;
    let configs: Api<CdiConfig> = Api::all(client.clone());
    let existing = kubeops::get(&configs, CDI_CONFIG_NAME).await?;
    let spec = match active {
        Some(cr) => cr.spec.config.clone().unwrap_or_default(),
        None => existing
            .as_ref()
            .map(|c| c.spec.clone())
            .unwrap_or_default(),
    };
    let mut settings = effective(
        &ctx.settings.base,
        active.map(|_| &spec),
        &ctx.settings.overrides,
    );
    // The CR's placement of workload pods (HCO's `spec.workloads` lands there).
    if let Some(placement) = active.and_then(|cr| cr.spec.workload.clone()) {
        match serde_json::from_value(placement) {
            Ok(p) => settings.workload = p,
            Err(e) => {
                tracing::warn!(error = %e, "the CDI CR's spec.workload is not a placement; ignored")
            }
        }
    }
    let classes = Api::<StorageClass>::all(client.clone())
        .list(&Default::default())
        .await?
        .items;
    let ingresses: Api<Ingress> = Api::namespaced(client, names::NAMESPACE);
    let ingresses = ingresses.list(&Default::default()).await?.items;
    let status = config_status(
        &settings,
        &spec,
        &classes,
        &ingresses,
        names::service::UPLOAD_PROXY,
    );
    ctx.settings.set(settings);
    if let Some(cr) = active {
        reconcile_cdi_status(&ctx.client, cr).await?;
    }

    let manager = kubeops::manager(CONFIG_CONTROLLER);
    let current_status = match existing {
        None => {
            let mut obj = CdiConfig::new(CDI_CONFIG_NAME, spec);
            obj.metadata.labels = Some(cdi_labels());
            kubeops::create(&configs, &obj, &manager).await?;
            None
        }
        Some(mut obj) => {
            if active.is_some() && obj.spec != spec {
                obj.spec = spec;
                let params = PostParams {
                    field_manager: Some(manager.clone()),
                    ..Default::default()
                };
                configs.replace(CDI_CONFIG_NAME, &params, &obj).await?;
            }
            obj.status
        }
    };
    if current_status.as_ref() != Some(&status) {
        let doc = serde_json::json!({
            "apiVersion": CdiConfig::api_version(&()),
            "kind": CdiConfig::kind(&()),
            "status": status,
        });
        kubeops::apply_status(&configs, CDI_CONFIG_NAME, doc, &manager).await?;
    }
    Ok(())
}

/// Writes the active CDI CR's status from the availability of Quarry's CDI Deployments
/// ([`cdi_status`]), when it changed.
async fn reconcile_cdi_status(client: &Client, cr: &Cdi) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), names::NAMESPACE);
    let mut unready = Vec::new();
    for name in COMPONENTS {
        let available = kubeops::get(&deployments, name).await?.is_some_and(|d| {
            d.status
                .and_then(|s| s.available_replicas)
                .is_some_and(|n| n > 0)
        });
        if !available {
            unready.push(name.to_string());
        }
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let Some(status) = cdi_status(cr.status.as_ref(), &unready, env!("CARGO_PKG_VERSION"), now)
    else {
        return Ok(());
    };
    let doc = serde_json::json!({
        "apiVersion": Cdi::api_version(&()),
        "kind": Cdi::kind(&()),
        "status": status,
    });
    let name = cr.metadata.name.as_deref().unwrap_or_default();
    let manager = kubeops::manager(CONFIG_CONTROLLER);
    kubeops::apply_status(&Api::<Cdi>::all(client.clone()), name, doc, &manager).await?;
    Ok(())
}

/// Keeps one StorageProfile per StorageClass, named like it: created when the class appears,
/// its status recomputed from the class and the profile's spec, deleted (if Quarry made it)
/// when the class is gone.
pub async fn reconcile_profiles(client: &Client) -> Result<()> {
    let classes = Api::<StorageClass>::all(client.clone())
        .list(&Default::default())
        .await?
        .items;
    let profiles: Api<StorageProfile> = Api::all(client.clone());
    let existing = profiles.list(&Default::default()).await?.items;
    let manager = kubeops::manager(PROFILE_CONTROLLER);
    let mut invalid = Vec::new();
    for sc in &classes {
        let name = sc.metadata.name.clone().unwrap_or_default();
        let current = existing
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(&name));
        let spec = current.map(|p| p.spec.clone()).unwrap_or_default();
        let status = match profile_status(sc, &spec) {
            Ok(s) => s,
            Err(e) => {
                invalid.push(format!("StorageProfile {name}: {e}"));
                continue;
            }
        };
        if current.is_none() {
            let obj = StorageProfile {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(cdi_labels()),
                    ..Default::default()
                },
                spec: StorageProfileSpec::default(),
                status: None,
            };
            kubeops::create(&profiles, &obj, &manager).await?;
        }
        if current.and_then(|p| p.status.as_ref()) != Some(&status) {
            let doc = serde_json::json!({
                "apiVersion": StorageProfile::api_version(&()),
                "kind": StorageProfile::kind(&()),
                "status": status,
            });
            kubeops::apply_status(&profiles, &name, doc, &manager).await?;
        }
    }
    let ours = cdi_labels();
    for p in &existing {
        let name = p.metadata.name.as_deref().unwrap_or_default();
        let made_by_us = p
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| ours.iter().all(|(k, v)| l.get(k) == Some(v)));
        let class_gone = !classes
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(name));
        if made_by_us && class_gone {
            kubeops::delete(&profiles, name).await?;
        }
    }
    match invalid.is_empty() {
        true => Ok(()),
        false => Err(Error::InvalidSpec(invalid.join("; "))),
    }
}

/// Runs the CDIConfig reconciler until the process stops.
pub async fn run_config(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let triggers = vec![
        changes(Api::<Cdi>::all(client.clone())),
        changes(Api::<CdiConfig>::all(client.clone())),
        changes(Api::<StorageClass>::all(client.clone())),
        changes(Api::<Ingress>::namespaced(client.clone(), names::NAMESPACE)),
        changes(Api::<Deployment>::namespaced(client, names::NAMESPACE)),
    ];
    drive(&ctx, CONFIG_CONTROLLER, triggers, || reconcile_config(&ctx)).await
}

/// Runs the StorageProfile reconciler until the process stops.
pub async fn run_profiles(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let triggers = vec![
        changes(Api::<StorageClass>::all(client.clone())),
        changes(Api::<StorageProfile>::all(client.clone())),
    ];
    drive(&ctx, PROFILE_CONTROLLER, triggers, || {
        reconcile_profiles(&client)
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::settings::Config;

    #[tokio::test]
    async fn a_transient_failure_runs_again_without_a_new_trigger() {
        let ctx = Context {
            client: kubekit::mockapi::pair().0,
            metrics: Arc::default(),
            settings: Arc::new(LiveSettings::new(Config::default(), Default::default())),
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let outcomes = Mutex::new(vec![
            Ok(()),
            Err(Error::InvalidSpec("two active CDI CRs".into())),
            Err(Error::io("listing", std::io::ErrorKind::TimedOut.into())),
        ]);
        // One trigger, then none: only the retry can cause the second pass.
        let triggers = vec![
            futures_util::stream::iter([()])
                .chain(futures_util::stream::pending())
                .boxed(),
        ];
        let run = drive(&ctx, "test", triggers, || {
            let outcome = outcomes.lock().unwrap().pop().unwrap_or(Ok(()));
            let failed = outcome.is_err();
            tx.send(failed).unwrap();
            async move { outcome }
        });
        let passes = async {
            assert_eq!(rx.recv().await, Some(true), "first pass fails transiently");
            assert_eq!(rx.recv().await, Some(true), "retried: refused as invalid");
        };
        tokio::select! {
            _ = run => panic!("the driver ended"),
            _ = passes => {}
        }
        let metrics = ctx.metrics.render();
        assert!(metrics.contains("kind=\"transient\"} 1"), "{metrics}");
        assert!(metrics.contains("kind=\"invalid\"} 1"), "{metrics}");
    }
}
