//! Where a PVC' is made when its target asks for immediate binding on a WaitForFirstConsumer
//! class and no consumer has chosen a node: one the driver runs on, where the workload pods may
//! run (CDI's external population picks a schedulable Ready node likewise). Giving PVC' its node
//! lets the driver provision it at once; a pod as its first consumer would wait for the
//! scheduler, which polls the binding every second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use k8s_openapi::api::storage::v1::CSINode;

use api::hostpath::NodePlacement;

/// How long the candidates found for a driver are used.
pub const CANDIDATES_TTL: Duration = Duration::from_secs(10);

/// How long finding none is believed: a node may be joining, so not long, but DataVolumes made
/// by the hundred for a driver no node reports (a static local-volume class) would otherwise
/// each list every Node and CSINode.
pub const NONE_FOUND_TTL: Duration = Duration::from_secs(2);

/// The candidates of each driver (and placement), kept for [`CANDIDATES_TTL`] (none found, for
/// [`NONE_FOUND_TTL`]).
#[derive(Default)]
pub struct Candidates {
    seen: Mutex<HashMap<String, Found>>,
}

/// When the nodes of a driver were found, and for which placement.
type Found = (Instant, NodePlacement, Vec<String>);

impl Candidates {
    /// The candidates of `driver` for `placement` found within the TTL.
    pub fn get(&self, driver: &str, placement: &NodePlacement) -> Option<Vec<String>> {
        self.get_at(driver, placement, Instant::now())
    }

    fn get_at(&self, driver: &str, placement: &NodePlacement, now: Instant) -> Option<Vec<String>> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (at, p, names) = seen.get(driver)?;
        let ttl = if names.is_empty() {
            NONE_FOUND_TTL
        } else {
            CANDIDATES_TTL
        };
        (now.saturating_duration_since(*at) < ttl && p == placement).then(|| names.clone())
    }

    /// Records what was found.
    pub fn put(&self, driver: &str, placement: &NodePlacement, names: &[String]) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let entry = (Instant::now(), placement.clone(), names.to_vec());
        seen.insert(driver.to_string(), entry);
    }
}

/// The nodes PVC' may be made on, by name: Ready, schedulable, running `driver`, matching the
/// placement's node selector and tolerating every NoSchedule or NoExecute taint.
pub fn candidates(
    nodes: &[Node],
    csi_nodes: &[CSINode],
    driver: &str,
    placement: &NodePlacement,
) -> Vec<String> {
    let runs_driver = |name: &str| {
        csi_nodes.iter().any(|c| {
            c.metadata.name.as_deref() == Some(name)
                && c.spec.drivers.iter().any(|d| d.name == driver)
        })
    };
    let mut out: Vec<String> = nodes
        .iter()
        .filter(|n| {
            ready(n)
                && !n
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false)
        })
        .filter(|n| {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            placement
                .node_selector
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
        })
        .filter(|n| {
            let taints = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            taints
                .iter()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .all(|t| placement.tolerations.iter().any(|tol| tolerates(tol, t)))
        })
        .filter_map(|n| n.metadata.name.clone())
        .filter(|n| runs_driver(n))
        .collect();
    out.sort();
    out
}

fn ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Kubernetes' toleration rule: the effect matches (or is empty), and the key with `Exists`
/// (an empty key with `Exists` tolerates everything) or the key and value with `Equal`.
fn tolerates(tol: &Toleration, t: &Taint) -> bool {
    let effect = tol
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == t.effect);
    let key = tol.key.as_deref().unwrap_or_default();
    let matches = match tol.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == t.key,
        _ => {
            key == t.key
                && tol.value.as_deref().unwrap_or_default()
                    == t.value.as_deref().unwrap_or_default()
        }
    };
    effect && matches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_found_are_kept_per_driver_and_placement_and_none_found_briefly() {
        let cache = Candidates::default();
        let anywhere = NodePlacement::default();
        cache.put("hpp", &anywhere, &[]);
        let now = Instant::now();
        assert_eq!(cache.get_at("hpp", &anywhere, now), Some(vec![]));
        let later = now + NONE_FOUND_TTL;
        assert_eq!(cache.get_at("hpp", &anywhere, later), None);
        cache.put("hpp", &anywhere, &["node-a".to_string()]);
        let found = Some(vec!["node-a".to_string()]);
        let now = Instant::now();
        assert_eq!(cache.get_at("hpp", &anywhere, now + NONE_FOUND_TTL), found);
        assert_eq!(cache.get_at("hpp", &anywhere, now + CANDIDATES_TTL), None);
        assert_eq!(cache.get("other", &anywhere), None);
        let mut selected = NodePlacement::default();
        selected.node_selector.insert("disk".into(), "ssd".into());
        assert_eq!(cache.get("hpp", &selected), None);
    }

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    fn csi(name: &str, driver: &str) -> CSINode {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}, "spec": {"drivers": [{"name": driver, "nodeID": name}]}
        }))
        .unwrap()
    }

    const DRIVER: &str = "kubevirt.io.hostpath-provisioner";

    #[test]
    fn only_ready_schedulable_nodes_running_the_driver_and_matching_the_placement() {
        let ready = serde_json::json!({"conditions": [{"type": "Ready", "status": "True"}]});
        let nodes = [
            node(
                serde_json::json!({"metadata": {"name": "b", "labels": {"disk": "ssd"}}, "status": ready}),
            ),
            node(
                serde_json::json!({"metadata": {"name": "a", "labels": {"disk": "ssd"}}, "status": ready}),
            ),
            node(
                serde_json::json!({"metadata": {"name": "no-driver", "labels": {"disk": "ssd"}}, "status": ready}),
            ),
            node(
                serde_json::json!({"metadata": {"name": "not-ready", "labels": {"disk": "ssd"}},
                "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            ),
            node(
                serde_json::json!({"metadata": {"name": "cordoned", "labels": {"disk": "ssd"}},
                "spec": {"unschedulable": true}, "status": ready}),
            ),
            node(
                serde_json::json!({"metadata": {"name": "hdd", "labels": {"disk": "hdd"}}, "status": ready}),
            ),
            node(
                serde_json::json!({"metadata": {"name": "tainted", "labels": {"disk": "ssd"}},
                "spec": {"taints": [{"key": "storage", "value": "x", "effect": "NoSchedule"}]},
                "status": ready}),
            ),
        ];
        let csi_nodes: Vec<CSINode> = ["a", "b", "not-ready", "cordoned", "hdd", "tainted"]
            .iter()
            .map(|n| csi(n, DRIVER))
            .chain([csi("no-driver", "other.csi")])
            .collect();
        let mut placement = NodePlacement::default();
        assert_eq!(
            candidates(&nodes, &csi_nodes, DRIVER, &placement),
            ["a", "b", "hdd"]
        );
        placement.node_selector.insert("disk".into(), "ssd".into());
        assert_eq!(
            candidates(&nodes, &csi_nodes, DRIVER, &placement),
            ["a", "b"]
        );
        // Tolerated, the tainted node is one too.
        placement.tolerations = vec![
            serde_json::from_value(serde_json::json!({"key": "storage", "operator": "Exists"}))
                .unwrap(),
        ];
        assert_eq!(
            candidates(&nodes, &csi_nodes, DRIVER, &placement),
            ["a", "b", "tainted"]
        );
        assert!(candidates(&nodes, &csi_nodes, "other.driver", &placement).is_empty());
    }
}
