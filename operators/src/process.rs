//! The composition roots: what each controller process runs, wired from its parts.

use std::sync::Arc;

use cdi::cdiconfig;
use cdi::datavolume;
use cdi::datavolume::controller::Context;
use cdi::golden;
use cdi::informers::Informers;
use cdi::populator;

/// CDI's controller process (`quarry controller datavolume`), over every namespace (`namespace`
/// None) or one: the DataVolume reconciler with the CDIConfig, StorageProfile, DataSource and
/// DataImportCron reconcilers and the volume populators beside it, as CDI's cdi-deployment
/// runs them; the DataVolume reconciler and the populators share one watch (and store) of PVCs
/// and one of Quarry's pods. The settings the CDIConfig reconciler derives reach the DataVolume
/// reconciles through `ctx.live`.
pub async fn cdi(ctx: Arc<Context>, namespace: Option<&str>) {
    // The neighbours run as tasks of a set that aborts them when dropped: this future is
    // dropped when its leader loses the Lease, and tasks left running would go on beside the
    // ones the next term starts (every populator write made twice) or beside the next leader.
    let mut neighbours = tokio::task::JoinSet::new();
    let config_ctx = Arc::new(cdiconfig::controller::Context {
        client: ctx.client.clone(),
        metrics: ctx.metrics.clone(),
        settings: ctx.live.clone(),
    });
    neighbours.spawn(cdiconfig::controller::run_config(config_ctx.clone()));
    neighbours.spawn(cdiconfig::controller::run_profiles(config_ctx));
    // A DataVolume's sourceRef waits for its DataSource's Ready condition.
    let scope = namespace.map(str::to_string);
    let (client, metrics) = (ctx.client.clone(), ctx.metrics.clone());
    neighbours
        .spawn(async move { golden::controller::run(client, metrics, scope.as_deref()).await });
    let cron_ctx = Arc::new(golden::cron_controller::Context {
        client: ctx.client.clone(),
        metrics: ctx.metrics.clone(),
        insecure_registries: ctx.settings().insecure_registries.clone(),
    });
    let scope = namespace.map(str::to_string);
    neighbours.spawn(async move { golden::cron_controller::run(cron_ctx, scope.as_deref()).await });
    let populator_ctx = Arc::new(populator::controller::Context::new(
        ctx.client.clone(),
        ctx.live.clone(),
        ctx.metrics.clone(),
    ));
    let mut informers = Informers::new(&ctx.client, namespace);
    let (populator_feed, feed) = (informers.feed(), informers.feed());
    neighbours.spawn(informers.run());
    let scope = namespace.map(str::to_string);
    neighbours.spawn(async move {
        populator::controller::run_fed(populator_ctx, scope.as_deref(), populator_feed).await
    });
    datavolume::controller::run_fed(ctx, namespace, feed).await;
}
