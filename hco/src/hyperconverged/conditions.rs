//! HCO's aggregated conditions: Available, Progressing, Degraded, ReconcileComplete and
//! Upgradeable, computed from the children's own conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// What is known of one child.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildStatus {
    /// Its kind (`CDI`, `KubeVirt`, ...), used in reasons.
    pub kind: String,
    /// Its `status.conditions` as (type, status, message), if it reported any.
    pub conditions: Vec<(String, String, String)>,
}

impl ChildStatus {
    /// Reads `status.conditions[{type, status, message}]` of a child object.
    pub fn from_object(kind: &str, obj: &Value) -> Self {
        let conditions = obj
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| {
                Some((
                    c.get("type")?.as_str()?.to_string(),
                    c.get("status")?.as_str()?.to_string(),
                    c.get("message")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                ))
            })
            .collect();
        ChildStatus {
            kind: kind.into(),
            conditions,
        }
    }

    fn is(&self, type_: &str) -> Option<bool> {
        self.conditions
            .iter()
            .find(|(t, _, _)| t == type_)
            .map(|(_, s, _)| s == "True")
    }

    /// `"{kind} is {what}"`, followed by the child's own message for `type_` when it has one
    /// (as HCO passes its components' messages on).
    fn says(&self, type_: &str, what: &str) -> String {
        let own = self
            .conditions
            .iter()
            .find(|(t, _, m)| t == type_ && !m.is_empty())
            .map(|(_, _, m)| m.as_str());
        match own {
            Some(m) => format!("{} is {what}: {m}", self.kind),
            None => format!("{} is {what}", self.kind),
        }
    }
}

/// The outcome of a reconcile, for ReconcileComplete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// Every child was applied.
    Complete,
    /// Applying failed, with the message.
    Failed(String),
}

fn set(
    conds: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" };
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status.into();
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = generation;
        }
        None => conds.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(now),
            observed_generation: generation,
        }),
    }
}

/// Reason of the Warning event of a failed reconcile (a child CRD missing, an apply refused).
pub const RECONCILE_FAILED: &str = "ReconcileFailed";

/// The message of the Warning event a reconcile calls for: a failure other than the one
/// ReconcileComplete already reports, so a lasting failure is told once, not at every resync.
pub fn failure_event<'a>(previous: &[Condition], reconciled: &'a Reconciled) -> Option<&'a str> {
    let Reconciled::Failed(m) = reconciled else {
        return None;
    };
    let told = previous
        .iter()
        .any(|c| c.type_ == "ReconcileComplete" && c.status == "False" && c.message == *m);
    (!told).then_some(m.as_str())
}

/// The aggregated conditions and `systemHealthStatus` (`healthy`, `warning` or `error`).
pub fn aggregate(
    previous: &[Condition],
    children: &[ChildStatus],
    reconciled: &Reconciled,
    generation: Option<i64>,
    now: Timestamp,
) -> (Vec<Condition>, String) {
    let mut c = previous.to_vec();
    let first = |pred: &dyn Fn(&ChildStatus) -> bool| children.iter().find(|s| pred(s));
    match reconciled {
        Reconciled::Complete => set(
            &mut c,
            "ReconcileComplete",
            true,
            "ReconcileCompleted",
            "Reconcile completed successfully",
            generation,
            now,
        ),
        Reconciled::Failed(m) => set(
            &mut c,
            "ReconcileComplete",
            false,
            "ReconcileFailed",
            m,
            generation,
            now,
        ),
    }
    let not_available = first(&|s| s.is("Available") != Some(true));
    let progressing = first(&|s| s.is("Progressing") != Some(false));
    let degraded = first(&|s| s.is("Degraded") == Some(true));
    match (reconciled, not_available) {
        (Reconciled::Failed(m), _) => set(
            &mut c,
            "Available",
            false,
            "ReconcileFailed",
            m,
            generation,
            now,
        ),
        (_, Some(s)) => {
            let m = s.says("Available", "not available");
            set(
                &mut c,
                "Available",
                false,
                &format!("{}NotAvailable", s.kind),
                &m,
                generation,
                now,
            )
        }
        _ => set(
            &mut c,
            "Available",
            true,
            "ReconcileCompleted",
            "Reconcile completed successfully",
            generation,
            now,
        ),
    }
    match (reconciled, progressing) {
        // Nothing moves while the children cannot be applied.
        (Reconciled::Failed(m), _) => set(
            &mut c,
            "Progressing",
            false,
            "ReconcileFailed",
            m,
            generation,
            now,
        ),
        (_, Some(s)) => {
            let m = s.says("Progressing", "progressing");
            set(
                &mut c,
                "Progressing",
                true,
                &format!("{}Progressing", s.kind),
                &m,
                generation,
                now,
            )
        }
        (_, None) => set(
            &mut c,
            "Progressing",
            false,
            "ReconcileCompleted",
            "Reconcile completed successfully",
            generation,
            now,
        ),
    }
    match (reconciled, degraded) {
        (Reconciled::Failed(m), _) => set(
            &mut c,
            "Degraded",
            true,
            "ReconcileFailed",
            m,
            generation,
            now,
        ),
        (_, Some(s)) => {
            let m = s.says("Degraded", "degraded");
            set(
                &mut c,
                "Degraded",
                true,
                &format!("{}Degraded", s.kind),
                &m,
                generation,
                now,
            )
        }
        (_, None) => set(
            &mut c,
            "Degraded",
            false,
            "ReconcileCompleted",
            "Reconcile completed successfully",
            generation,
            now,
        ),
    }
    let failed = matches!(reconciled, Reconciled::Failed(_));
    let upgradeable = progressing.is_none() && degraded.is_none() && !failed;
    if upgradeable {
        set(
            &mut c,
            "Upgradeable",
            true,
            "ReconcileCompleted",
            "Reconcile completed successfully",
            generation,
            now,
        );
    } else {
        set(
            &mut c,
            "Upgradeable",
            false,
            "Progressing",
            "components are progressing or degraded",
            generation,
            now,
        );
    }
    let health = if degraded.is_some() || matches!(reconciled, Reconciled::Failed(_)) {
        "error"
    } else if not_available.is_some() || progressing.is_some() {
        "warning"
    } else {
        "healthy"
    };
    (c, health.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_told_by_an_event_once() {
        let missing = Reconciled::Failed(
            "the CustomResourceDefinition cdis.cdi.kubevirt.io is not installed".into(),
        );
        let (after, _) = aggregate(&[], &[], &missing, Some(1), Timestamp::now());
        assert_eq!(
            failure_event(&[], &missing),
            Some("the CustomResourceDefinition cdis.cdi.kubevirt.io is not installed")
        );
        // The same failure at the next resync: already in ReconcileComplete.
        assert_eq!(failure_event(&after, &missing), None);
        // Another one is told again; success is never told.
        let other = Reconciled::Failed("another".into());
        assert_eq!(failure_event(&after, &other), Some("another"));
        assert_eq!(failure_event(&after, &Reconciled::Complete), None);
    }

    fn child(kind: &str, avail: &str, prog: &str, degr: &str) -> ChildStatus {
        ChildStatus {
            kind: kind.into(),
            conditions: vec![
                ("Available".into(), avail.into(), String::new()),
                ("Progressing".into(), prog.into(), String::new()),
                ("Degraded".into(), degr.into(), format!("{kind} says why")),
            ],
        }
    }

    fn get<'a>(c: &'a [Condition], t: &str) -> (&'a str, &'a str) {
        let c = c.iter().find(|c| c.type_ == t).unwrap();
        (c.status.as_str(), c.reason.as_str())
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    #[test]
    fn all_children_healthy_is_available_and_upgradeable() {
        let kids = [
            child("CDI", "True", "False", "False"),
            child("KubeVirt", "True", "False", "False"),
        ];
        let (c, health) = aggregate(&[], &kids, &Reconciled::Complete, Some(3), now());
        assert_eq!(get(&c, "Available"), ("True", "ReconcileCompleted"));
        assert_eq!(get(&c, "Progressing").0, "False");
        assert_eq!(get(&c, "Degraded").0, "False");
        assert_eq!(get(&c, "Upgradeable").0, "True");
        assert_eq!(get(&c, "ReconcileComplete").0, "True");
        assert_eq!(health, "healthy");
        assert!(c.iter().all(|c| c.observed_generation == Some(3)));
    }

    #[test]
    fn a_child_without_status_is_progressing_and_not_available() {
        let kids = [
            child("CDI", "True", "False", "False"),
            ChildStatus {
                kind: "SSP".into(),
                conditions: vec![],
            },
        ];
        let (c, health) = aggregate(&[], &kids, &Reconciled::Complete, None, now());
        assert_eq!(get(&c, "Available"), ("False", "SSPNotAvailable"));
        assert_eq!(get(&c, "Progressing"), ("True", "SSPProgressing"));
        assert_eq!(get(&c, "Upgradeable").0, "False");
        assert_eq!(health, "warning");
    }

    #[test]
    fn a_degraded_child_or_failed_reconcile_is_an_error() {
        let kids = [child("KubeVirt", "True", "False", "True")];
        let (c, health) = aggregate(&[], &kids, &Reconciled::Complete, None, now());
        assert_eq!(get(&c, "Degraded"), ("True", "KubeVirtDegraded"));
        let msg = &c.iter().find(|c| c.type_ == "Degraded").unwrap().message;
        assert_eq!(msg, "KubeVirt is degraded: KubeVirt says why");
        assert_eq!(health, "error");
        let (c, health) = aggregate(&c, &[], &Reconciled::Failed("boom".into()), None, now());
        assert_eq!(get(&c, "ReconcileComplete"), ("False", "ReconcileFailed"));
        assert_eq!(get(&c, "Available"), ("False", "ReconcileFailed"));
        // A failed reconcile never reads as success anywhere.
        assert_eq!(get(&c, "Degraded"), ("True", "ReconcileFailed"));
        assert_eq!(get(&c, "Progressing"), ("False", "ReconcileFailed"));
        assert_eq!(get(&c, "Upgradeable").0, "False");
        assert_eq!(health, "error");
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let kids = [child("CDI", "True", "False", "False")];
        let (c1, _) = aggregate(&[], &kids, &Reconciled::Complete, None, now());
        let later = Timestamp::from_second(1_800_000_100).unwrap();
        let (c2, _) = aggregate(&c1, &kids, &Reconciled::Complete, None, later);
        assert_eq!(c1, c2);
        let (c3, _) = aggregate(
            &c2,
            &[child("CDI", "False", "True", "False")],
            &Reconciled::Complete,
            None,
            later,
        );
        let a = c3.iter().find(|c| c.type_ == "Available").unwrap();
        assert_eq!(a.last_transition_time, Time(later));
    }
}
