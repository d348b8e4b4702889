//! Leader election on a real Lease: of two candidates exactly one leads; when the leader
//! releases the Lease or stops renewing it, the other takes over; a leader whose Lease is taken
//! stops its work.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kubekit::leader::{Elector, Timing};
use serde_json::json;

use crate::support::namespace;

const LEASE: &str = "quarry-test-leader";

/// Short enough for a test; the same proportions as client-go's defaults.
fn timing() -> Timing {
    Timing {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
    }
}

fn candidate(client: &Client, ns: &str, id: &str) -> Elector {
    Elector::new(client.clone(), ns, LEASE, id, timing())
}

async fn holder(client: &Client, ns: &str) -> (Option<String>, i32) {
    let l: Lease = Api::namespaced(client.clone(), ns)
        .get(LEASE)
        .await
        .unwrap();
    let spec = l.spec.unwrap();
    (spec.holder_identity, spec.lease_transitions.unwrap_or(0))
}

/// A hang guard, not a measure.
async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

#[tokio::test]
async fn one_of_two_candidates_leads_and_the_other_takes_over_on_release_or_silence() {
    let Some((client, ns)) = namespace("lease", &[]).await else {
        return;
    };
    let (mut a, mut b) = (candidate(&client, &ns, "a"), candidate(&client, &ns, "b"));
    // Both race for the missing Lease: one creates it, the other loses (409 or a live holder).
    let (ra, rb) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(ra ^ rb, "exactly one leads: a {ra}, b {rb}");
    let (mut leader, mut follower) = if ra { (a, b) } else { (b, a) };
    assert_eq!(
        holder(&client, &ns).await.0.as_deref(),
        Some(leader.identity())
    );
    // The leader renews; the follower keeps following while it does.
    assert!(leader.try_acquire_or_renew().await.unwrap());
    assert!(!follower.try_acquire_or_renew().await.unwrap());

    // Released: the follower takes over at once.
    leader.release().await.unwrap();
    within("takeover after release", follower.acquire()).await;
    let (h, transitions) = holder(&client, &ns).await;
    assert_eq!(h.as_deref(), Some(follower.identity()));
    assert_eq!(transitions, 1);

    // The new leader runs its work under the Lease, then stops without releasing (a killed
    // pod): a third candidate takes over once the record has been still for the lease duration.
    let (working, started) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(follower.lead(async move {
        let _ = working.send(());
        std::future::pending::<()>().await;
        Ok(())
    }));
    within("the leader's work starting", started).await.unwrap();
    let mut c = candidate(&client, &ns, "c");
    assert!(!c.try_acquire_or_renew().await.unwrap());
    task.abort();
    within("takeover after silence", c.acquire()).await;
    let (h, transitions) = holder(&client, &ns).await;
    assert_eq!(h.as_deref(), Some("c"));
    assert_eq!(transitions, 2);
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops_its_work() {
    let Some((client, ns)) = namespace("lease-lost", &[]).await else {
        return;
    };
    let mut a = candidate(&client, &ns, "a");
    assert!(a.try_acquire_or_renew().await.unwrap());
    let stopped = Arc::new(AtomicBool::new(false));
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let flag = Flag(stopped.clone());
    let (working, started) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(a.lead(async move {
        let _flag = flag;
        let _ = working.send(());
        std::future::pending::<()>().await;
        Ok(())
    }));
    within("the leader's work starting", started).await.unwrap();
    // Someone else writes the Lease as theirs (an admin, or a candidate with a skewed view).
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    api.patch(
        LEASE,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 3600}}),
        ),
    )
    .await
    .unwrap();
    let outcome = within("the leader noticing", task).await.unwrap();
    let err = outcome.unwrap_err();
    assert!(matches!(err, kubekit::Error::LeaseLost { .. }), "{err}");
    assert!(err.to_string().contains(LEASE), "{err}");
    assert!(stopped.load(Ordering::SeqCst), "the work was stopped");
}

/// `lead_on`: a lost leadership stops the work, and once the Lease is free again the same
/// process leads and starts new work (what a controller does after an API server restart).
#[tokio::test]
async fn a_leader_that_lost_its_lease_campaigns_again_in_process() {
    let Some((client, ns)) = namespace("lease-again", &[]).await else {
        return;
    };
    let a = candidate(&client, &ns, "a");
    let (starts_tx, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(a.lead_on(
        move || {
            let starts_tx = starts_tx.clone();
            async move {
                let _ = starts_tx.send(());
                std::future::pending::<()>().await;
                Ok(())
            }
        },
        std::future::pending(),
    ));
    within("the first work", starts.recv()).await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let set = |holder: serde_json::Value, seconds: i32| {
        let api = api.clone();
        async move {
            api.patch(
                LEASE,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"holderIdentity": holder,
                    "leaseDurationSeconds": seconds,
                    "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                        k8s_openapi::jiff::Timestamp::now())}})),
            )
            .await
            .unwrap();
        }
    };
    set(json!("intruder"), 3600).await;
    // The leader notices and stops; while the intruder holds the Lease no work starts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(starts.try_recv().is_err(), "work ran under another holder");
    set(serde_json::Value::Null, 1).await;
    within("the work starting again", starts.recv())
        .await
        .unwrap();
    assert!(!task.is_finished(), "lead_on returned");
    task.abort();
}

/// `lead_on` stops on its `stop` signal while campaigning too: a replica that lost its Lease (or
/// never had it) and waits for it must not ignore SIGTERM, and one leading releases the Lease.
#[tokio::test]
async fn a_candidate_stops_when_told_whether_it_leads_or_waits() {
    let Some((client, ns)) = namespace("lease-stop", &[]).await else {
        return;
    };
    // b waits behind a, which leads.
    let (a_stop, a_stopped) = tokio::sync::oneshot::channel::<()>();
    let (a_started, mut a_starts) = tokio::sync::mpsc::unbounded_channel();
    let a = tokio::spawn(candidate(&client, &ns, "a").lead_on(
        move || {
            let a_started = a_started.clone();
            async move {
                let _ = a_started.send(());
                std::future::pending::<()>().await;
                Ok(())
            }
        },
        async move {
            let _ = a_stopped.await;
        },
    ));
    within("a leading", a_starts.recv()).await.unwrap();
    let (b_stop, b_stopped) = tokio::sync::oneshot::channel::<()>();
    let b_led = Arc::new(AtomicBool::new(false));
    let led = b_led.clone();
    let b = tokio::spawn(candidate(&client, &ns, "b").lead_on(
        move || {
            led.store(true, Ordering::SeqCst);
            std::future::pending()
        },
        async move {
            let _ = b_stopped.await;
        },
    ));
    // Told to stop while campaigning: b ends, and the Lease is still a's.
    b_stop.send(()).unwrap();
    within("b stopping", b).await.unwrap().unwrap();
    assert!(
        !b_led.load(Ordering::SeqCst),
        "b led while a held the Lease"
    );
    assert_eq!(holder(&client, &ns).await.0.as_deref(), Some("a"));
    // Told to stop while leading: a ends and gives the Lease up.
    a_stop.send(()).unwrap();
    within("a stopping", a).await.unwrap().unwrap();
    assert_eq!(holder(&client, &ns).await.0, None);
}
