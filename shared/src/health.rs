//! Endpoint health: delayed delivery (D1) and best-effort skipping of retries (R3).
//!
//! Each endpoint URL has a record of its consecutive failed attempts. Once they reach
//! [`HealthPolicy::failure_threshold`] (Event Grid's example: the first 10 events all fail),
//! the endpoint is *delayed*: every new delivery and every retry to it waits until
//! `delayed_until`, and is re-enqueued without counting an attempt. When the delay ends, one
//! batch (the probe, guarded by a lease so only one invocation sends it) tests the endpoint:
//! success clears the record and everything waiting flows; failure doubles the delay, up to
//! [`HealthPolicy::max_delay`]. An endpoint that answers (whatever the status) never affects
//! another: health is per URL.
//!
//! A host that stops answering altogether is another matter (#34 item 8): behind per-tenant
//! paths (`hooks.example.com/services/T1/...`) it would cost 10 timeouts per URL before any is
//! delayed, while its origin's concurrency limit fell to 1 and batches waited for its permits.
//! So an origin has a record of its own ([`origin_health_key`]), delayed like a URL's when a
//! worker sees it hung ([`HostSilence`]: the threshold's worth of timeouts and failed
//! connections, across at least [`HUNG_HOST_URLS`] of its URLs, with no answer from any of
//! them in between). While it is delayed every URL of it waits; when the delay ends, one
//! invocation probes it (one batch per URL it holds) and any answer, whatever its status,
//! clears it. One URL that hangs on a host that answers the others is that URL's problem
//! only: its answers never come, the others' do.
//!
//! Pure rules here; the record lives in DynamoDB (see [`crate::ports::DeliveryStateStore`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::classify::AttemptResult;
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

/// The key an origin's health record is kept under, beside its URLs' (with a space, which no
/// URL has); `None` for an endpoint without an origin (an AWS resource).
pub fn origin_health_key(endpoint: &str) -> Option<String> {
    crate::outbound::endpoint_origin(endpoint).map(|origin| format!("{ORIGIN_KEY}{origin}"))
}

/// What an origin's health key starts with.
const ORIGIN_KEY: &str = "origin ";

/// The origin a health record's key names (`None`: the key is an endpoint's).
pub fn origin_of_health_key(key: &str) -> Option<&str> {
    key.strip_prefix(ORIGIN_KEY)
}

/// Whether an attempt's result says its host answered: any HTTP status.
pub fn host_answered(result: &AttemptResult) -> bool {
    matches!(result, AttemptResult::Status(_))
}

/// Whether an attempt's result says its host did not answer at all: no answer in time, a
/// connection that failed, a name that did not resolve. Any HTTP status is an answer.
pub fn host_did_not_answer(result: &AttemptResult) -> bool {
    matches!(
        result,
        AttemptResult::TimedOut | AttemptResult::ConnectionFailed(_) | AttemptResult::Unresolved(_)
    )
}

/// Distinct URLs of an origin that must have gone unanswered before the origin is taken for
/// hung: one or two URLs that hang on a host that answers others are those URLs' own problem.
pub const HUNG_HOST_URLS: usize = 3;

/// What one worker has seen of an origin since it last answered: attempts its host did not
/// answer that were sent after that answer came, and which of its URLs they went to. A request
/// sent before an answer came proves nothing against the host (a hung path that times out
/// after its host answered another), so it is not counted; a worker sees its own sends and
/// answers in order, so this is exact for what it sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSilence {
    last_answer: Option<DateTime<Utc>>,
    unanswered: u32,
    urls: std::collections::BTreeSet<String>,
}

impl HostSilence {
    /// The host answered (any status) at `at`.
    pub fn answered(&mut self, at: DateTime<Utc>) {
        *self = Self {
            last_answer: self.last_answer.max(Some(at)),
            ..Self::default()
        };
    }

    /// A request to `url`, sent at `sent_at`, got no answer from the host.
    pub fn unanswered(&mut self, url: &str, sent_at: DateTime<Utc>) {
        if self.last_answer.is_some_and(|answer| sent_at < answer) {
            return;
        }
        self.unanswered = self.unanswered.saturating_add(1);
        if self.urls.len() < HUNG_HOST_URLS {
            self.urls.insert(crate::outbound::endpoint_digest(url));
        }
    }

    /// Whether the origin is taken for hung: the threshold's worth of unanswered attempts
    /// across at least [`HUNG_HOST_URLS`] URLs since its last answer.
    pub fn is_hung(&self, policy: &HealthPolicy) -> bool {
        self.unanswered >= policy.failure_threshold && self.urls.len() >= HUNG_HOST_URLS
    }
}

impl EndpointHealth {
    /// An origin's record once a worker finds it hung: delayed as an endpoint is at the
    /// threshold (the first delay), unless it already is.
    pub fn after_hang(&self, now: DateTime<Utc>, policy: &HealthPolicy) -> Self {
        if self.is_delayed() {
            return *self;
        }
        let to_threshold = policy
            .failure_threshold
            .saturating_sub(self.consecutive_failures)
            .max(1);
        self.after_failures(to_threshold, now, policy)
    }
}

fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// How delivery to a subscription goes, as the console and the subscribers' portal say it
/// (#36).
#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryState {
    /// Its handshake has not succeeded: the provisioning state, and why.
    NotProvisioned {
        state: String,
        detail: Option<String>,
    },
    Healthy,
    /// Attempts have failed since the last success.
    Failing {
        failures: u32,
    },
    /// Deliveries wait until then (D1).
    Delayed {
        until: DateTime<Utc>,
    },
    /// Its expiration time has passed: it receives nothing.
    Expired {
        at: DateTime<Utc>,
    },
    /// A health record could not be read.
    Unknown,
}

impl DeliveryState {
    /// The state of a subscription whose health records (its endpoint's, its host's) are
    /// these, at `now`: as `event-subscription show` says it.
    /// (`None`: a record that could not be read; an AWS resource has no host record).
    pub fn of(
        sub: &crate::subscription::Subscription,
        endpoint: Option<&EndpointHealth>,
        host: Option<&EndpointHealth>,
        now: DateTime<Utc>,
    ) -> Self {
        if !sub.delivers() {
            return Self::NotProvisioned {
                state: format!("{:?}", sub.provisioning.state),
                detail: sub.provisioning.detail.clone(),
            };
        }
        if let Some(at) = sub.expiration_time_utc.filter(|_| sub.is_expired(now)) {
            return Self::Expired { at };
        }
        let Some(endpoint) = endpoint else {
            return Self::Unknown;
        };
        // A host found hung holds every URL of it.
        let until = [endpoint, host.unwrap_or(endpoint)]
            .iter()
            .filter_map(|h| h.delayed_until)
            .filter(|t| *t > now)
            .max();
        match until {
            Some(until) => Self::Delayed { until },
            None if endpoint.is_healthy() => Self::Healthy,
            None => Self::Failing {
                failures: endpoint.consecutive_failures,
            },
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            Self::NotProvisioned { .. } => "Not provisioned",
            Self::Healthy => "Healthy",
            Self::Failing { .. } => "Failing",
            Self::Delayed { .. } => "Delayed",
            Self::Expired { .. } => "Expired",
            Self::Unknown => "Unknown",
        }
    }
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

    /// #34 item 8, D1: an origin is taken for hung after the threshold's worth of unanswered
    /// attempts across three of its URLs, sent after its last answer came; an answer (any
    /// status) clears what was seen; one or two hanging URLs never make it hung.
    #[test]
    fn a_host_is_hung_only_when_three_of_its_urls_go_unanswered_d1() {
        let p = policy();
        let url = |i: u32| format!("https://hooks.example.com/services/T{i}?token=s3cret");
        let t0 = Utc::now();
        let at = |s: i64| t0 + chrono::Duration::seconds(s);
        let mut seen = HostSilence::default();
        for i in 0..20 {
            seen.unanswered(&url(i % 2), at(1));
        }
        assert!(
            !seen.is_hung(&p),
            "20 timeouts on two URLs: those URLs' problem"
        );
        seen.unanswered(&url(2), at(1));
        assert!(seen.is_hung(&p), "then a third URL: the host");
        seen.answered(at(5));
        assert!(!seen.is_hung(&p), "an answer clears it");
        for i in 0..30 {
            seen.unanswered(&url(i % 5), at(4));
        }
        assert!(
            !seen.is_hung(&p),
            "requests sent before the last answer came say nothing against the host"
        );
        for i in 0..9 {
            seen.unanswered(&url(i % 3), at(5));
        }
        assert!(!seen.is_hung(&p), "below the threshold");
        seen.unanswered(&url(0), at(6));
        assert!(seen.is_hung(&p));

        assert!(host_did_not_answer(&AttemptResult::TimedOut));
        assert!(host_did_not_answer(&AttemptResult::ConnectionFailed(
            "reset".into()
        )));
        assert!(!host_did_not_answer(&AttemptResult::Status(503)));
        assert!(!host_did_not_answer(&AttemptResult::Status(408)));
        assert!(!host_did_not_answer(&AttemptResult::Refused(
            "private".into()
        )));
        assert!(host_answered(&AttemptResult::Status(503)));
        assert!(!host_answered(&AttemptResult::TimedOut));

        let now = Utc::now();
        let hung = EndpointHealth::default().after_hang(now, &p);
        assert_eq!(
            hung.delayed_until,
            Some(now + chrono::Duration::seconds(60))
        );
        let later = now + chrono::Duration::seconds(5);
        assert_eq!(
            hung.after_hang(later, &p),
            hung,
            "a delay already set stays as it is"
        );
        assert_eq!(
            origin_health_key("https://user:pw@Hooks.Example.com/services/T1?token=x").as_deref(),
            Some("origin https://hooks.example.com")
        );
        assert_eq!(
            origin_health_key("http://127.0.0.1:8080/hook/a"),
            origin_health_key("http://127.0.0.1:8080/hook/b")
        );
        assert_eq!(
            origin_health_key("arn:aws:sqs:us-east-1:123456789012:q"),
            None
        );
        let key = origin_health_key("https://hooks.example.com/T1").unwrap_or_default();
        assert_eq!(
            origin_of_health_key(&key),
            Some("https://hooks.example.com")
        );
        assert_eq!(origin_of_health_key("https://hooks.example.com/T1"), None);
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
