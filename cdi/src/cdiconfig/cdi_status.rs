//! The active CDI CR's status, as CDI's operator writes it: phase `Deployed` with Available
//! True (`DeployCompleted`), Progressing and Degraded False, once Quarry's CDI components (the
//! Deployments that do cdi-deployment's, cdi-apiserver's and cdi-uploadproxy's work) are
//! available; until then `Deploying` with Progressing True naming the ones not ready, and once
//! deployed, Degraded naming them. HCO (Quarry's or KubeVirt's) reads these conditions for its
//! own Available: without them a HyperConverged never becomes Available.

use k8s_openapi::jiff::Timestamp;

use api::cdi::CdiStatus;
use api::hostpath::OperatorCondition;

/// The Deployments whose availability is CDI's, in the controller's namespace.
pub const COMPONENTS: [&str; 3] = [
    api::names::component::DATAVOLUME_CONTROLLER,
    api::names::component::APISERVER,
    api::names::component::UPLOAD_PROXY,
];

/// The status for `previous` when `unready` names the components not available (empty: all
/// are), or `None` when only heartbeats would change (nothing to write).
pub fn cdi_status(
    previous: Option<&CdiStatus>,
    unready: &[String],
    version: &str,
    now: Timestamp,
) -> Option<CdiStatus> {
    let mut st = previous.cloned().unwrap_or_default();
    let mut conds: Vec<OperatorCondition> = st
        .conditions
        .iter()
        .filter_map(|c| serde_json::from_value(c.clone()).ok())
        .collect();
    let was_deployed = st.phase.as_deref() == Some("Deployed");
    let set = |c: &mut Vec<OperatorCondition>, t: &str, on: bool, reason: &str, m: &str| {
        OperatorCondition::set(c, t, on, reason, m, now)
    };
    if unready.is_empty() {
        set(
            &mut conds,
            "Available",
            true,
            "DeployCompleted",
            "Deployment Completed",
        );
        set(&mut conds, "Progressing", false, "DeployCompleted", "");
        set(&mut conds, "Degraded", false, "DeployCompleted", "");
        st.phase = Some("Deployed".into());
        st.observed_version = Some(version.into());
    } else {
        let m = format!("not available yet: {}", unready.join(", "));
        set(&mut conds, "Available", false, "DeploymentsNotReady", &m);
        // After a deployment, components going away is a degradation, not progress.
        set(
            &mut conds,
            "Progressing",
            !was_deployed,
            "DeploymentsNotReady",
            &m,
        );
        set(
            &mut conds,
            "Degraded",
            was_deployed,
            "DeploymentsNotReady",
            &m,
        );
        if !was_deployed {
            st.phase = Some("Deploying".into());
        }
    }
    st.operator_version = Some(version.into());
    st.target_version = Some(version.into());
    let same_but_heartbeats = |a: &[OperatorCondition], b: &[serde_json::Value]| {
        let strip = |c: &OperatorCondition| OperatorCondition {
            last_heartbeat_time: None,
            ..c.clone()
        };
        let b: Vec<OperatorCondition> = b
            .iter()
            .filter_map(|c| serde_json::from_value(c.clone()).ok())
            .collect();
        a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| strip(x) == strip(y))
    };
    let unchanged = previous.is_some_and(|p| {
        p.phase == st.phase
            && p.operator_version == st.operator_version
            && p.target_version == st.target_version
            && p.observed_version == st.observed_version
            && same_but_heartbeats(&conds, &p.conditions)
    });
    st.conditions = conds
        .iter()
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    (!unchanged).then_some(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn cond(st: &CdiStatus, t: &str) -> (String, String) {
        let c = st
            .conditions
            .iter()
            .find(|c| c["type"] == t)
            .unwrap_or_else(|| panic!("no {t}: {st:?}"));
        (
            c["status"].as_str().unwrap().into(),
            c["reason"].as_str().unwrap().into(),
        )
    }

    #[test]
    fn deploying_then_deployed_then_degraded_then_quiet() {
        let unready = vec!["quarry-apiserver".to_string()];
        let st = cdi_status(None, &unready, "1.2.3", now(0)).unwrap();
        assert_eq!(st.phase.as_deref(), Some("Deploying"));
        assert_eq!(cond(&st, "Available").0, "False");
        assert_eq!(cond(&st, "Progressing").0, "True");
        assert_eq!(cond(&st, "Degraded").0, "False");
        assert_eq!(st.observed_version, None);

        let st = cdi_status(Some(&st), &[], "1.2.3", now(1)).unwrap();
        assert_eq!(st.phase.as_deref(), Some("Deployed"));
        assert_eq!(
            cond(&st, "Available"),
            ("True".into(), "DeployCompleted".into())
        );
        assert_eq!(cond(&st, "Progressing").0, "False");
        assert_eq!(cond(&st, "Degraded").0, "False");
        assert_eq!(st.observed_version.as_deref(), Some("1.2.3"));

        // Nothing changed but the clock: nothing to write.
        assert_eq!(cdi_status(Some(&st), &[], "1.2.3", now(60)), None);

        let st = cdi_status(Some(&st), &unready, "1.2.3", now(2)).unwrap();
        assert_eq!(st.phase.as_deref(), Some("Deployed"));
        assert_eq!(cond(&st, "Available").0, "False");
        assert_eq!(cond(&st, "Progressing").0, "False");
        assert_eq!(cond(&st, "Degraded").0, "True");
        let message = st.conditions[0]["message"].as_str().unwrap();
        assert!(message.contains("quarry-apiserver"), "{message}");
    }
}
