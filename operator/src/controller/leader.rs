//! Leader election on a `coordination.k8s.io/v1` Lease, so only one of several operator
//! replicas reconciles at a time (kube-rs has no elector of its own).
//!
//! The protocol is client-go's (`tools/leaderelection`): the holder renews `renewTime`
//! every retry period; a candidate takes the lease over only when the record has not
//! changed for a whole `leaseDurationSeconds` as measured by its *own* clock since it last
//! saw it change, so clock skew between nodes does not matter. Writes use the lease's
//! `resourceVersion`, so two candidates cannot both win. A leader that stops gives the
//! lease up (holder cleared) so another replica takes over at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

/// client-go's defaults (`leaderelection.LeaderElectionConfig` as used by
/// controller-manager: 15 s lease, 10 s renew deadline, 2 s retry period).
#[derive(Clone, Copy, Debug)]
pub struct LeaseTiming {
    /// How long a lease holds without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leading.
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
    /// The last lease record seen and when (on our clock) it was first seen.
    observed: Option<(LeaseSpec, Instant)>,
}

impl LeaderElector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, timing: LeaseTiming) -> Self {
        Self {
            api,
            name: name.into(),
            identity: identity.into(),
            timing,
            observed: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One attempt: takes the lease if it is free, expired or ours, and renews it.
    /// Returns whether this identity holds it afterwards.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let lease = match self.api.get_opt(&self.name).await? {
            Some(lease) => lease,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.record(None, now)),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(created) => {
                        self.observe(created.spec.unwrap_or_default());
                        Ok(true)
                    }
                    // Another candidate created it first.
                    Err(e) if is_conflict(&e) => Ok(false),
                    Err(e) => Err(e),
                };
            }
        };
        let current = lease.spec.clone().unwrap_or_default();
        self.observe(current.clone());
        let holder = current.holder_identity.as_deref().unwrap_or_default();
        if !holder.is_empty() && holder != self.identity && !self.expired(&current) {
            return Ok(false);
        }
        let mut updated = lease;
        updated.spec = Some(self.record(Some(&current), now));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &updated)
            .await
        {
            Ok(replaced) => {
                self.observe(replaced.spec.unwrap_or_default());
                Ok(true)
            }
            // Someone else wrote the lease since we read it.
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up if this identity holds it, so another replica need not wait for
    /// it to expire.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        // client-go's release: no holder, and a 1 s duration so no one waits on it.
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }

    /// Waits until this identity holds the lease.
    pub async fn acquire(&mut self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, lease = %self.name, "acquiring the lease"),
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Renews the lease every retry period; returns when it was not renewed within the
    /// renew deadline (lost to another replica or the API server unreachable).
    pub async fn hold(&mut self) {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.timing.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewed = Instant::now(),
                Ok(false) => return,
                Err(e) => tracing::warn!(error = %e, lease = %self.name, "renewing the lease"),
            }
            if last_renewed.elapsed() >= self.timing.renew_deadline {
                return;
            }
        }
    }

    /// The record this identity writes, continuing `current` when it already holds it.
    fn record(&self, current: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
        let ours = current.and_then(|c| c.holder_identity.as_deref()) == Some(&self.identity);
        let transitions = current.and_then(|c| c.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.timing.lease_duration.as_secs().max(1) as i32),
            acquire_time: if ours {
                current.and_then(|c| c.acquire_time.clone())
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if ours || current.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..LeaseSpec::default()
        }
    }

    fn observe(&mut self, record: LeaseSpec) {
        if self
            .observed
            .as_ref()
            .is_none_or(|(seen, _)| *seen != record)
        {
            self.observed = Some((record, Instant::now()));
        }
    }

    /// Whether `record` has gone unchanged, on our clock, for its lease duration.
    fn expired(&self, record: &LeaseSpec) -> bool {
        let duration = record
            .lease_duration_seconds
            .map_or(self.timing.lease_duration, |s| {
                Duration::from_secs(s.max(0) as u64)
            });
        self.observed
            .as_ref()
            .is_some_and(|(seen, at)| seen == record && at.elapsed() >= duration)
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}
