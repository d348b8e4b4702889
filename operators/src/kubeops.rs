//! The few API calls the controllers make, with the conflicts that are normal in a level-driven
//! controller (already exists, already gone) treated as success.

use std::fmt::Debug;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use kube::runtime::controller::Action as Requeue;

use crate::error::{Error, ErrorKind, Result};
use crate::metrics::Metrics;

/// Field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "quarry-operators";

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Creates `obj`; an object of that name that already exists counts as created.
pub async fn create<K>(api: &Api<K>, obj: &K) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(e) if status_code(&e) == Some(409) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes `name`; an object already gone counts as deleted.
pub async fn delete<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(e) if status_code(&e) == Some(404) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reads `name`, None when it does not exist.
pub async fn get<K>(api: &Api<K>, name: &str) -> Result<Option<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    Ok(api.get_opt(name).await?)
}

/// Server-side applies `obj` (the whole desired object), taking over conflicting fields: what
/// someone else edits in the fields we own is put back.
pub async fn apply<K>(api: &Api<K>, name: &str, obj: &K) -> Result<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    Ok(api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await?)
}

/// Server-side applies the `status` of `name` (apiVersion and kind must be in `status_doc`).
pub async fn apply_status<K>(api: &Api<K>, name: &str, status_doc: serde_json::Value) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(status_doc),
    )
    .await?;
    Ok(())
}

/// The error policy all controllers share: count the failure, retry transient errors after 5 s
/// and invalid objects after `invalid`.
pub fn requeue_after(
    controller: &str,
    name: &str,
    err: &Error,
    metrics: &Metrics,
    invalid: Duration,
) -> Requeue {
    tracing::warn!(controller, name, error = %err, "reconcile failed");
    metrics.failure(controller, err);
    match err.kind() {
        ErrorKind::Transient => Requeue::requeue(Duration::from_secs(5)),
        ErrorKind::Invalid => Requeue::requeue(invalid),
    }
}

/// Drains a controller's result stream until shutdown (failures are logged by the policy).
pub async fn drain<T, E: std::fmt::Display>(
    results: impl Stream<Item = std::result::Result<T, E>>,
) {
    results
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile error");
            }
        })
        .await;
}
