//! HostPathProvisioner status from its DaemonSet: Available / Progressing / Degraded and one
//! entry per pool (every driver pod serves every pool; a `pvcTemplate` pool is ready where its
//! mounters are, and lists its PVCs).

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::jiff::Timestamp;

use api::hostpath::{ClaimStatus, OperatorCondition, StoragePool, StoragePoolStatus};
use api::{HostPathProvisioner, HostPathProvisionerStatus};

fn set(
    conds: &mut Vec<OperatorCondition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    OperatorCondition::set(conds, type_, status, reason, message, now)
}

/// The one HostPathProvisioner served when several exist (the driver objects are cluster-wide,
/// so two would fight over them): the oldest, by creation time and then name.
pub fn active<'a>(all: impl IntoIterator<Item = &'a HostPathProvisioner>) -> Option<String> {
    all.into_iter()
        .filter(|h| h.metadata.deletion_timestamp.is_none())
        .min_by(|a, b| {
            let key = |h: &'a HostPathProvisioner| {
                (
                    h.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    h.metadata.name.as_deref(),
                )
            };
            key(a).cmp(&key(b))
        })
        .and_then(|h| h.metadata.name.clone())
}

/// The status of a HostPathProvisioner that is not [`active`]: Degraded, naming the one served;
/// nothing is deployed for it.
pub fn inactive(
    previous: Option<&HostPathProvisionerStatus>,
    active: &str,
    now: Timestamp,
) -> HostPathProvisionerStatus {
    let mut st = previous.cloned().unwrap_or_default();
    let m = format!(
        "only one HostPathProvisioner is served: {active:?} (the oldest); delete this one or that"
    );
    let c = &mut st.conditions;
    set(
        c,
        "Available",
        false,
        "AnotherHostPathProvisionerActive",
        &m,
        now,
    );
    set(
        c,
        "Progressing",
        false,
        "AnotherHostPathProvisionerActive",
        &m,
        now,
    );
    set(
        c,
        "Degraded",
        true,
        "AnotherHostPathProvisionerActive",
        &m,
        now,
    );
    st
}

/// The status for `pools`, given the DaemonSet as last seen (None: not created yet) and the
/// previous status (for transition times).
/// A `pvcTemplate` pool's PVC and mounter on one node, as read.
#[derive(Debug, Clone)]
pub struct ObservedMount {
    /// The pool.
    pub pool: String,
    /// Its PVC.
    pub pvc: PersistentVolumeClaim,
    /// Its mounter.
    pub deployment: Deployment,
}

pub fn status(
    previous: Option<&HostPathProvisionerStatus>,
    pools: &[StoragePool],
    ds: Option<&DaemonSet>,
    mounts: &[ObservedMount],
    error: Option<&str>,
    now: Timestamp,
) -> HostPathProvisionerStatus {
    let mut st = previous.cloned().unwrap_or_default();
    let (desired, ready) = ds
        .and_then(|d| d.status.as_ref())
        .map(|s| (s.desired_number_scheduled, s.number_ready))
        .unwrap_or((0, 0));
    let c = &mut st.conditions;
    if let Some(e) = error {
        set(c, "Available", false, "DeployFailed", e, now);
        set(c, "Progressing", false, "DeployFailed", e, now);
        set(c, "Degraded", true, "DeployFailed", e, now);
    } else if desired > 0 && ready == desired {
        let m = format!("{ready} of {desired} driver pods ready");
        set(c, "Available", true, "Complete", &m, now);
        set(c, "Progressing", false, "Complete", &m, now);
        set(c, "Degraded", false, "Complete", &m, now);
    } else {
        let m = format!("{ready} of {desired} driver pods ready");
        set(c, "Available", ready > 0, "Deploying", &m, now);
        set(c, "Progressing", true, "Deploying", &m, now);
        set(c, "Degraded", false, "Deploying", &m, now);
    }
    st.storage_pool_statuses = pools
        .iter()
        .map(|p| {
            // A pvcTemplate pool is ready where its mounters are: one per driver node.
            let (mut current, mut wanted, mut claims) = (ready, desired, Vec::new());
            if p.pvc_template.is_some() {
                let of_pool: Vec<_> = mounts.iter().filter(|m| m.pool == p.name).collect();
                wanted = of_pool.len() as i32;
                current = of_pool
                    .iter()
                    .filter(|m| {
                        let st = m.deployment.status.as_ref();
                        st.and_then(|s| s.ready_replicas).unwrap_or(0) >= 1
                    })
                    .count() as i32;
                claims = of_pool
                    .iter()
                    .map(|m| ClaimStatus {
                        name: m.pvc.metadata.name.clone().unwrap_or_default(),
                        status: m.pvc.status.clone().unwrap_or_default(),
                    })
                    .collect();
            }
            let pool_ready = desired > 0 && ready == desired && wanted > 0 && current == wanted;
            // HPP's phase while a pool's PVCs are being mounted.
            let waiting = if p.pvc_template.is_some() {
                "Mounting"
            } else {
                "NotReady"
            };
            StoragePoolStatus {
                name: p.name.clone(),
                phase: Some(if pool_ready { "Ready" } else { waiting }.into()),
                current_ready: Some(current),
                desired_ready: Some(wanted),
                claim_statuses: claims,
            }
        })
        .collect();
    st.observed_version = Some(env!("CARGO_PKG_VERSION").into());
    st.operator_version = Some(env!("CARGO_PKG_VERSION").into());
    st.target_version = Some(env!("CARGO_PKG_VERSION").into());
    st
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::DaemonSetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn ds(desired: i32, ready: i32) -> DaemonSet {
        DaemonSet {
            status: Some(DaemonSetStatus {
                desired_number_scheduled: desired,
                number_ready: ready,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn cond<'a>(s: &'a HostPathProvisionerStatus, t: &str) -> &'a str {
        &s.conditions.iter().find(|c| c.type_ == t).unwrap().status
    }

    #[test]
    fn pools_are_ready_when_every_driver_pod_is() {
        let pools = [StoragePool {
            name: "local".into(),
            path: "/p".into(),
            ..Default::default()
        }];
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let s = status(None, &pools, Some(&ds(3, 1)), &[], None, now);
        assert_eq!(
            (cond(&s, "Available"), cond(&s, "Progressing")),
            ("True", "True")
        );
        assert_eq!(
            s.storage_pool_statuses[0].phase.as_deref(),
            Some("NotReady")
        );
        let s = status(Some(&s), &pools, Some(&ds(3, 3)), &[], None, now);
        assert_eq!(
            (
                cond(&s, "Available"),
                cond(&s, "Progressing"),
                cond(&s, "Degraded")
            ),
            ("True", "False", "False")
        );
        assert_eq!(s.storage_pool_statuses[0].phase.as_deref(), Some("Ready"));
        assert_eq!(s.storage_pool_statuses[0].current_ready, Some(3));
        let s = status(Some(&s), &pools, None, &[], Some("bad pools"), now);
        assert_eq!(
            (cond(&s, "Available"), cond(&s, "Degraded")),
            ("False", "True")
        );
        let s = status(None, &pools, None, &[], None, now);
        assert_eq!(cond(&s, "Available"), "False");
    }

    #[test]
    fn a_pvc_pool_is_ready_when_its_mounters_are_and_lists_its_claims() {
        use k8s_openapi::api::apps::v1::DeploymentStatus;
        use k8s_openapi::api::core::v1::PersistentVolumeClaimStatus;
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let pools = vec![StoragePool {
            name: "onpvc".into(),
            path: "/var/hpvolumes/onpvc".into(),
            pvc_template: Some(Default::default()),
            ..Default::default()
        }];
        let mount = |node: &str, ready: i32| ObservedMount {
            pool: "onpvc".into(),
            pvc: PersistentVolumeClaim {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(format!("hpp-pool-onpvc-{node}")),
                    ..Default::default()
                },
                spec: None,
                status: Some(PersistentVolumeClaimStatus {
                    phase: Some("Bound".into()),
                    ..Default::default()
                }),
            },
            deployment: Deployment {
                status: Some(DeploymentStatus {
                    ready_replicas: Some(ready),
                    ..Default::default()
                }),
                ..Default::default()
            },
        };
        let s = status(
            None,
            &pools,
            Some(&ds(2, 2)),
            &[mount("a", 1), mount("b", 0)],
            None,
            now,
        );
        let p = &s.storage_pool_statuses[0];
        assert_eq!(p.phase.as_deref(), Some("Mounting"));
        assert_eq!((p.current_ready, p.desired_ready), (Some(1), Some(2)));
        let claims: Vec<_> = p
            .claim_statuses
            .iter()
            .map(|c| (c.name.as_str(), c.status.phase.as_deref()))
            .collect();
        assert_eq!(
            claims,
            [
                ("hpp-pool-onpvc-a", Some("Bound")),
                ("hpp-pool-onpvc-b", Some("Bound"))
            ]
        );
        let s = status(
            None,
            &pools,
            Some(&ds(2, 2)),
            &[mount("a", 1), mount("b", 1)],
            None,
            now,
        );
        assert_eq!(s.storage_pool_statuses[0].phase.as_deref(), Some("Ready"));
    }

    #[test]
    fn the_oldest_cr_is_served_and_the_others_say_which() {
        let at = |name: &str, secs: i64| {
            let mut h = HostPathProvisioner::new(name, Default::default());
            h.metadata.creation_timestamp = Some(Time(Timestamp::from_second(secs).unwrap()));
            h
        };
        let all = [at("b", 5), at("a", 9), at("c", 5)];
        assert_eq!(active(&all).as_deref(), Some("b"));
        let st = inactive(None, "b", Timestamp::from_second(10).unwrap());
        let d = st
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .unwrap();
        assert_eq!(d.status, "True");
        assert!(d.message.as_deref().unwrap().contains("\"b\""));
        assert!(d.last_transition_time.is_some());
    }
}
