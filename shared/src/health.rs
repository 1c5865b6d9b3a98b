//! Endpoint health: delayed delivery (D1) and best-effort skipping of retries (R3).
//!
//! Each endpoint URL has a record of its consecutive failed attempts. Once they reach
//! [`HealthPolicy::failure_threshold`] (Event Grid's example: the first 10 events all fail),
//! the endpoint is *delayed*: every new delivery and every retry to it waits until
//! `delayed_until`, and is re-enqueued without counting an attempt. When the delay ends, one
//! batch (the probe, guarded by a lease so only one invocation sends it) tests the endpoint:
//! success clears the record and everything waiting flows; failure doubles the delay, up to
//! [`HealthPolicy::max_delay`]. Other endpoints are never affected: health is per URL.
//!
//! Pure rules here; the record lives in DynamoDB (see [`crate::ports::DeliveryStateStore`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::time_scale::TimeScale;

/// What is known of one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointHealth {
    /// Failed attempts since the last success.
    pub consecutive_failures: u32,
    /// Deliveries wait until then.
    pub delayed_until: Option<DateTime<Utc>>,
    /// A probe is in flight until then (its lease).
    pub probe_until: Option<DateTime<Utc>>,
    /// The most recent failed attempt, kept across successes so `show` can say what went
    /// wrong last (it plays no part in delivery).
    #[serde(default)]
    pub last_failure: Option<LastFailure>,
}

/// What the most recent failed attempt to an endpoint was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastFailure {
    pub at: DateTime<Utc>,
    pub outcome: crate::classify::DeliveryOutcome,
    /// The HTTP status, when the endpoint answered.
    pub status: Option<u16>,
}

/// When and how delivery to a failing endpoint is delayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    pub failure_threshold: u32,
    pub first_delay: Duration,
    pub max_delay: Duration,
    /// How long one probe may take before another may be sent.
    pub probe_lease: Duration,
    /// After the delay, the longest an event waiting for the probe's answer sleeps before
    /// looking at the endpoint's health again.
    pub recheck: Duration,
}

impl HealthPolicy {
    /// Event Grid's behaviour: 10 failures, then 1 minute, doubling up to 4 hours.
    pub fn event_grid(scale: TimeScale) -> Self {
        Self {
            failure_threshold: 10,
            first_delay: scale.apply(Duration::from_secs(60)),
            max_delay: scale.apply(Duration::from_secs(4 * 3600)),
            // The attempt timeout (S2) and some room.
            probe_lease: scale.apply(Duration::from_secs(45)),
            recheck: scale.apply(Duration::from_secs(10)),
        }
    }

    /// The delay after `failures` consecutive failures (none below the threshold).
    pub fn delay_for(&self, failures: u32) -> Option<Duration> {
        let beyond = failures.checked_sub(self.failure_threshold)?;
        let factor = 2u32.checked_pow(beyond.min(30)).unwrap_or(u32::MAX);
        Some(self.first_delay.saturating_mul(factor).min(self.max_delay))
    }
}

/// What may happen to a batch for an endpoint now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Healthy: send.
    Open,
    /// The delay is over: one batch may probe, if it wins the lease.
    Probe,
    /// Wait until then (not an attempt).
    Wait(DateTime<Utc>),
}

impl EndpointHealth {
    pub fn is_delayed(&self) -> bool {
        self.delayed_until.is_some()
    }

    /// No failure since the last success, no delay, no probe: delivery goes ahead, whatever
    /// failed before.
    pub fn is_healthy(&self) -> bool {
        self.consecutive_failures == 0 && self.delayed_until.is_none() && self.probe_until.is_none()
    }

    /// The record after a success: healthy, the last failure kept for `show`.
    pub fn after_success(&self) -> Self {
        Self {
            last_failure: self.last_failure,
            ..Self::default()
        }
    }

    /// D1: whether a batch may be sent now.
    pub fn gate(&self, now: DateTime<Utc>, policy: &HealthPolicy) -> Gate {
        let Some(until) = self.delayed_until else {
            return Gate::Open;
        };
        // #34 item 1: events wait out the delay (SQS takes them back after at most 15 minutes,
        // so a 4-hour delay is 16 hops), not coming back every recheck to be held again.
        if now < until {
            return Gate::Wait(until);
        }
        match self.probe_until {
            Some(lease) if now < lease => {
                Gate::Wait(lease.min(now + chrono_duration(policy.recheck)))
            }
            _ => Gate::Probe,
        }
    }

    /// The record after `failures` more failed attempts and no success.
    pub fn after_failures(&self, failures: u32, now: DateTime<Utc>, policy: &HealthPolicy) -> Self {
        let consecutive_failures = self.consecutive_failures.saturating_add(failures);
        Self {
            consecutive_failures,
            delayed_until: policy
                .delay_for(consecutive_failures)
                .map(|d| now + chrono_duration(d)),
            probe_until: None,
            last_failure: self.last_failure,
        }
    }
}

fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> HealthPolicy {
        HealthPolicy::event_grid(TimeScale::default())
    }

    /// D1: no delay below 10 failures; then 1 min, doubling, capped at 4 h.
    #[test]
    fn delay_grows_with_continued_failure_d1() {
        let p = policy();
        assert_eq!(p.delay_for(9), None);
        assert_eq!(p.delay_for(10), Some(Duration::from_secs(60)));
        assert_eq!(p.delay_for(11), Some(Duration::from_secs(120)));
        assert_eq!(p.delay_for(14), Some(Duration::from_secs(960)));
        assert_eq!(p.delay_for(30), Some(Duration::from_secs(4 * 3600)));
        assert_eq!(p.delay_for(u32::MAX), Some(Duration::from_secs(4 * 3600)));
    }

    /// D1, R3: a delayed endpoint makes batches wait; when the delay ends one probe may go,
    /// and the others wait for its lease.
    #[test]
    fn gate_delays_then_allows_one_probe_d1_r3() {
        let p = policy();
        let now = Utc::now();
        let healthy = EndpointHealth::default();
        assert_eq!(healthy.gate(now, &p), Gate::Open);
        let nine = healthy.after_failures(9, now, &p);
        assert_eq!(nine.gate(now, &p), Gate::Open, "below the threshold");
        let sick = nine.after_failures(1, now, &p);
        let until = now + chrono::Duration::seconds(60);
        assert_eq!(sick.delayed_until, Some(until));
        match sick.gate(now, &p) {
            Gate::Wait(t) => assert!(t <= until && t > now),
            other => panic!("{other:?}"),
        }
        assert_eq!(sick.gate(until, &p), Gate::Probe);
        let probing = EndpointHealth {
            probe_until: Some(until + chrono::Duration::seconds(45)),
            ..sick
        };
        assert!(matches!(probing.gate(until, &p), Gate::Wait(_)));
        let worse = sick.after_failures(1, until, &p);
        assert_eq!(
            worse.delayed_until,
            Some(until + chrono::Duration::seconds(120)),
            "a failed probe doubles the delay"
        );
    }
}
