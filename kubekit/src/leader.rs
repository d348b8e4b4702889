//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it,
//! so that two replicas of a controller are safe: only the holder of the Lease reconciles, and a
//! holder that cannot renew within the renew deadline (or finds the Lease taken) stops.
//!
//! A candidate trusts its own clock only: a Lease held by another is taken over once its record
//! has stayed unchanged, as this candidate observed it, for the lease duration (client-go's
//! rule; clocks of different nodes need not agree). [`decide`] is the whole policy, a pure
//! function of what was read; [`Elector`] carries it out with optimistic concurrency (every
//! write names the resourceVersion it read, so of two candidates one wins and one gets 409).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;

use crate::error::{Error, Result};

/// client-go's defaults (`LeaseDuration`, `RenewDeadline`, `RetryPeriod`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a record must stay unchanged before another candidate takes the Lease.
    pub lease_duration: Duration,
    /// How long the holder keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// Time between attempts (acquire and renew).
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What a candidate does after reading the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// There is no Lease: create it, holding it.
    Create,
    /// Take the Lease over (it is free, released, or its holder stopped renewing).
    Take,
    /// We hold it: renew.
    Renew,
    /// Another candidate holds a live Lease: wait and read again.
    Follow { holder: String },
}

/// The policy: `lease` as read, `unchanged_for` how long this candidate has seen its record
/// unchanged, `me` this candidate's identity.
pub fn decide(lease: Option<&LeaseSpec>, unchanged_for: Duration, me: &str, t: &Timing) -> Action {
    let Some(spec) = lease else {
        return Action::Create;
    };
    match spec.holder_identity.as_deref().filter(|h| !h.is_empty()) {
        None => Action::Take,
        Some(h) if h == me => Action::Renew,
        Some(h) => {
            // The holder's declared duration when it gave one, else ours.
            let duration = spec
                .lease_duration_seconds
                .filter(|s| *s > 0)
                .map_or(t.lease_duration, |s| {
                    Duration::from_secs(s.unsigned_abs().into())
                });
            if unchanged_for >= duration {
                Action::Take
            } else {
                Action::Follow { holder: h.into() }
            }
        }
    }
}

/// Whether a holder whose last successful renewal was `since_renewal` ago must stop leading.
pub fn lost(since_renewal: Duration, t: &Timing) -> bool {
    since_renewal >= t.renew_deadline
}

/// The part of a Lease record whose change shows its holder alive (client-go compares the
/// whole record).
type Record = (Option<String>, Option<MicroTime>, Option<i32>, Option<i32>);

fn record(spec: Option<&LeaseSpec>) -> Option<Record> {
    spec.map(|s| {
        (
            s.holder_identity.clone(),
            s.renew_time.clone(),
            s.lease_transitions,
            s.lease_duration_seconds,
        )
    })
}

/// When this candidate last saw the Lease record change (its local clock).
#[derive(Debug, Default)]
pub struct Observer {
    last: Option<(Option<Record>, Instant)>,
}

impl Observer {
    /// Notes the record read at `now`; returns how long it has been unchanged.
    pub fn observe(&mut self, spec: Option<&LeaseSpec>, now: Instant) -> Duration {
        let rec = record(spec);
        match &self.last {
            Some((seen, at)) if *seen == rec => now.saturating_duration_since(*at),
            _ => {
                self.last = Some((rec, now));
                Duration::ZERO
            }
        }
    }
}

/// One candidate for one Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    observer: Observer,
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

impl Elector {
    /// A candidate `identity` (the pod name) for Lease `namespace/name`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: Timing,
    ) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            timing,
            observer: Observer::default(),
        }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One round: read the Lease, act on [`decide`]; Ok(true) when this candidate holds it
    /// afterwards. A lost race (409) or another live holder is Ok(false).
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        let lease = self.api.get_opt(&self.name).await?;
        let spec = lease.as_ref().and_then(|l| l.spec.as_ref());
        let unchanged_for = self.observer.observe(spec, Instant::now());
        let now = MicroTime(Timestamp::now());
        let ours = |prev: Option<&LeaseSpec>, taking: bool| LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(seconds(self.timing.lease_duration)),
            acquire_time: if taking {
                Some(now.clone())
            } else {
                prev.and_then(|p| p.acquire_time.clone())
            },
            renew_time: Some(now.clone()),
            lease_transitions: Some(
                prev.and_then(|p| p.lease_transitions).unwrap_or(0)
                    + i32::from(taking && prev.is_some()),
            ),
            ..Default::default()
        };
        let result = match decide(spec, unchanged_for, &self.identity, &self.timing) {
            Action::Follow { holder } => {
                tracing::debug!(lease = %self.name, %holder, "another candidate leads");
                return Ok(false);
            }
            Action::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(ours(None, true)),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            action => {
                let mut lease = lease.expect("Take and Renew follow a read Lease");
                let spec = ours(lease.spec.as_ref(), action == Action::Take);
                lease.spec = Some(spec);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match result {
            Ok(l) => {
                self.observer.observe(l.spec.as_ref(), Instant::now());
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until this candidate holds the Lease (API errors are logged and retried).
    pub async fn acquire(&mut self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                    return;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "acquiring the lease"),
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Renews every retry period while leading; returns the error that ended the leadership
    /// (the Lease taken by another, or no renewal within the renew deadline).
    pub async fn hold(&mut self) -> Error {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.timing.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => renewed = Instant::now(),
                Ok(false) => {
                    return Error::LeaseLost {
                        lease: self.name.clone(),
                        why: "another candidate holds it".into(),
                    };
                }
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "renewing the lease"),
            }
            if lost(renewed.elapsed(), &self.timing) {
                return Error::LeaseLost {
                    lease: self.name.clone(),
                    why: format!("not renewed within {:?}", self.timing.renew_deadline),
                };
            }
        }
    }

    /// Gives the Lease up (client-go's ReleaseOnCancel), so another candidate takes over at
    /// once; a Lease held by another is left alone.
    pub async fn release(&mut self) -> Result<()> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                tracing::info!(lease = %self.name, "released the lease");
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Runs `work` while this candidate leads: waits for the Lease, then runs `work` until it
    /// ends (then releases the Lease) or the leadership is lost (then drops `work` and returns
    /// the error, so that the process exits and its pod restarts as a candidate).
    pub async fn lead<F: std::future::Future<Output = Result<()>>>(
        mut self,
        work: F,
    ) -> Result<()> {
        self.acquire().await;
        let mut ended = true;
        let outcome = tokio::select! {
            r = work => r,
            e = self.hold() => {
                ended = false;
                Err(e)
            }
        };
        if ended && let Err(e) = self.release().await {
            tracing::warn!(lease = %self.name, error = %e, "releasing the lease");
        }
        outcome
    }

    /// Like [`Elector::lead`], but a lost leadership (the API server away past the renew
    /// deadline, say) stops the work and campaigns again in the same process, starting a new
    /// `work()` once the Lease is held again: no container restart for an API server's. `stop`
    /// (SIGTERM) ends it in every state: leading, the work is dropped and the Lease released;
    /// campaigning, it returns at once (a process waiting for the Lease must not ignore the
    /// signal that asks it to go).
    pub async fn lead_on<F, W>(
        mut self,
        mut work: W,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<()>
    where
        F: std::future::Future<Output = Result<()>>,
        W: FnMut() -> F,
    {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = self.acquire() => {}
                () = &mut stop => return Ok(()),
            }
            let lost = tokio::select! {
                r = work() => Ok(r),
                () = &mut stop => Ok(Ok(())),
                e = self.hold() => Err(e),
            };
            match lost {
                Ok(outcome) => {
                    if let Err(e) = self.release().await {
                        tracing::warn!(lease = %self.name, error = %e, "releasing the lease");
                    }
                    return outcome;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leadership lost: work stopped, campaigning again")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(by: &str, duration: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(by.into()),
            lease_duration_seconds: duration,
            ..Default::default()
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn decide_follows_client_go() {
        let t = Timing::default();
        assert_eq!(decide(None, S(0), "a", &t), Action::Create);
        assert_eq!(
            decide(Some(&held("a", Some(15))), S(100), "a", &t),
            Action::Renew
        );
        // Released (empty holder) or never held: taken at once.
        assert_eq!(
            decide(Some(&held("", Some(1))), S(0), "b", &t),
            Action::Take
        );
        assert_eq!(
            decide(Some(&LeaseSpec::default()), S(0), "b", &t),
            Action::Take
        );
        // Another holder: followed until its record has been still for its duration.
        let other = held("a", Some(15));
        assert_eq!(
            decide(Some(&other), S(14), "b", &t),
            Action::Follow { holder: "a".into() }
        );
        assert_eq!(decide(Some(&other), S(15), "b", &t), Action::Take);
        // The holder's duration counts, ours when it gave none.
        assert_eq!(
            decide(Some(&held("a", Some(3))), S(3), "b", &t),
            Action::Take
        );
        assert_eq!(
            decide(Some(&held("a", None)), S(14), "b", &t),
            Action::Follow { holder: "a".into() }
        );
    }

    #[test]
    fn a_holder_is_lost_at_the_renew_deadline() {
        let t = Timing::default();
        assert!(!lost(S(9), &t));
        assert!(lost(S(10), &t));
    }

    #[test]
    fn the_observer_measures_from_the_last_change_on_its_own_clock() {
        let mut o = Observer::default();
        let t0 = Instant::now();
        let a = held("a", Some(15));
        assert_eq!(o.observe(Some(&a), t0), S(0));
        assert_eq!(o.observe(Some(&a), t0 + S(5)), S(5));
        // A renewal (any change of the record) restarts the count.
        let mut renewed = a.clone();
        renewed.renew_time = Some(MicroTime(Timestamp::now()));
        assert_eq!(o.observe(Some(&renewed), t0 + S(6)), S(0));
        assert_eq!(o.observe(Some(&renewed), t0 + S(20)), S(14));
        assert_eq!(o.observe(None, t0 + S(21)), S(0));
    }
}
