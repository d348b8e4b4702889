//! StorageClasses and CSIDrivers by name, read once in a while: a class's provisioner,
//! parameters and binding mode cannot change (the API server refuses such updates), nor can a
//! CSIDriver's name, so the DataVolume and populator controllers need not read them on every
//! reconcile (on a busy node class reads were a quarter of their API requests). An object found
//! is read again after [`TTL`] (it may have been deleted and made anew); one not found is read
//! every time. Annotations, which may change (the default-class ones), are read from a list
//! where they matter, never from here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use kubekit::error::Result;
use kubekit::kubeops;

/// How long an object read is used.
pub const TTL: Duration = Duration::from_secs(60);

/// Cluster-scoped objects read through a client, each kept for [`TTL`].
pub struct SeldomRead<K> {
    api: Api<K>,
    seen: Mutex<HashMap<String, (Instant, K)>>,
}

/// StorageClasses, read once in a while.
pub type StorageClasses = SeldomRead<StorageClass>;

/// CSIDrivers, read once in a while.
pub type CsiDrivers = SeldomRead<CSIDriver>;

impl<K> SeldomRead<K>
where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    /// Objects read with `client`.
    pub fn new(client: Client) -> Self {
        SeldomRead {
            api: Api::all(client),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// The object `name` (None: it does not exist). A name no object can have is none without
    /// a request: a class's provisioner is a CSIDriver's name only if it is one, and in-tree
    /// provisioners (`kubernetes.io/no-provisioner`, local volumes' usual class) are not: their
    /// `/` made the GET one of a subresource, which RBAC refused, on every reconcile.
    pub async fn get(&self, name: &str) -> Result<Option<K>> {
        if !is_object_name(name) {
            return Ok(None);
        }
        if let Some((at, obj)) = self.lock().get(name)
            && at.elapsed() < TTL
        {
            return Ok(Some(obj.clone()));
        }
        let obj = kubeops::get(&self.api, name).await?;
        let mut seen = self.lock();
        match &obj {
            Some(o) => seen.insert(name.to_string(), (Instant::now(), o.clone())),
            None => seen.remove(name),
        };
        Ok(obj)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, K)>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether `name` may name an object: the API server's rule for every name in a path (not
/// empty, `.` or `..`, and no `/` or `%`).
fn is_object_name(name: &str) -> bool {
    !matches!(name, "" | "." | "..") && !name.contains(['/', '%'])
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use kubekit::mockapi;

    fn class_json(provisioner: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "fast"}, "provisioner": provisioner})
    }

    #[tokio::test]
    async fn a_class_is_read_once_and_a_missing_one_every_time() {
        let (client, mut api) = mockapi::pair();
        let classes = std::sync::Arc::new(StorageClasses::new(client));
        let path = "/apis/storage.k8s.io/v1/storageclasses/fast";

        let c = classes.clone();
        let missing = tokio::spawn(async move { c.get("fast").await });
        api.expect(Method::GET, path, 404, mockapi::status(404, "NotFound"))
            .await;
        assert!(missing.await.unwrap().unwrap().is_none());

        let c = classes.clone();
        let found = tokio::spawn(async move { c.get("fast").await });
        api.expect(Method::GET, path, 200, class_json("example.com/fast"))
            .await;
        assert_eq!(
            found.await.unwrap().unwrap().unwrap().provisioner,
            "example.com/fast"
        );
        // Read again within the TTL: no request (the mock answers none).
        let again = classes.get("fast").await.unwrap().unwrap();
        assert_eq!(again.provisioner, "example.com/fast");
    }

    #[tokio::test]
    async fn an_in_tree_provisioner_is_no_csi_driver_and_is_not_asked_for() {
        let (client, mut api) = mockapi::pair();
        let drivers = CsiDrivers::new(client);
        let reads = tokio::spawn(async move {
            let names = [
                "kubernetes.io/no-provisioner",
                "k8s.io/minikube-hostpath",
                "a%2Fb",
                "..",
            ];
            for name in names {
                assert!(drivers.get(name).await.unwrap().is_none(), "{name}");
            }
        });
        api.silence().await;
        reads.await.unwrap();
        assert!(is_object_name("kubevirt.io.hostpath-provisioner"));
    }
}
