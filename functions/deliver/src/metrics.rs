//! What each subscription's events went through in one invocation, as CloudWatch metrics
//! (issue #9).
//!
//! Why: an operator asks "is subscription X healthy?" before anything else, and the answer
//! must not depend on a log line's layout. Each invocation counts, per topic and subscription,
//! what its report counts in total, plus the time from publish to delivery of each delivered
//! event; [`record`] hands those to the `metrics` facade, which the Lambda's recorder
//! (`gridrelay_adapters::metrics`) writes as CloudWatch embedded metric format once per
//! invocation. Every metric is recorded twice: for the subscription (dimensions `Topic`,
//! `Subscription`) and for the whole stack (no dimension of its own), which the stack's
//! alarms watch. Without a recorder (tests, the local runner) recording does nothing.
//!
//! Counted at least once: an invocation whose enqueueing fails leaves its messages to SQS, and
//! the next one counts their outcome again (as EMF itself delivers metrics at least once).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::DeliveryReport;

/// Events delivered (a 2xx answer, or a late success: R4).
pub const DELIVERED: &str = "EventsDelivered";
/// Delivery attempts that failed (each a request, batched or not).
pub const FAILED_ATTEMPTS: &str = "DeliveryAttemptsFailed";
/// Events scheduled for another attempt.
pub const RETRIED: &str = "EventsRetried";
/// Events sent to the dead-letter function (L1).
pub const DEAD_LETTERED: &str = "EventsDeadLettered";
/// Events given up with no dead-letter location, or no longer for a subscription that
/// receives events.
pub const DROPPED: &str = "EventsDropped";
/// Events held back without an attempt because their endpoint is delayed (D1).
pub const DELAYED: &str = "EventsDelayed";
/// Events held back without an attempt because their subscription's caps left no room.
pub const THROTTLED: &str = "EventsThrottled";
/// Milliseconds from publish to delivery, one value per delivered event (at most
/// [`LATENCY_VALUES`] per subscription and invocation).
pub const LATENCY: &str = "DeliveryLatency";

/// The most values one metric takes per flush (the recorder's and EMF's limit: 100).
pub const LATENCY_VALUES: usize = 100;

/// One subscription's share of an invocation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubscriptionMetrics {
    pub counts: DeliveryReport,
    /// Publish to delivery, in milliseconds, of each event delivered by an attempt of this
    /// invocation.
    pub latency_ms: Vec<f64>,
}

/// Per (topic, subscription).
pub type MetricsBySubscription = BTreeMap<(String, String), SubscriptionMetrics>;

/// Milliseconds from `published` to `delivered` (0 if the clocks disagree).
pub fn latency_ms(published: DateTime<Utc>, delivered: DateTime<Utc>) -> f64 {
    (delivered - published)
        .num_microseconds()
        .unwrap_or(0)
        .max(0) as f64
        / 1000.0
}

/// At most [`LATENCY_VALUES`] values that keep the shape of `values`: all of them if they fit,
/// else evenly spaced order statistics (the smallest and the largest included), so the
/// percentiles CloudWatch computes from one invocation's values are those of all its events.
/// Across invocations each weighs the same, whatever it delivered (the recorder cannot send
/// EMF's value counts).
pub fn representative(values: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    if sorted.len() <= LATENCY_VALUES {
        return sorted;
    }
    sorted.sort_by(f64::total_cmp);
    let last = sorted.len() - 1;
    (0..LATENCY_VALUES)
        .map(|i| sorted[i * last / (LATENCY_VALUES - 1)])
        .collect()
}

/// Says each metric's unit and meaning to the recorder (CloudWatch stores the unit); once,
/// after the recorder is installed.
pub fn describe() {
    use metrics::Unit;
    for (name, what) in [
        (DELIVERED, "events delivered"),
        (FAILED_ATTEMPTS, "delivery attempts that did not deliver"),
        (RETRIED, "events scheduled for another attempt"),
        (DEAD_LETTERED, "events sent to dead-lettering"),
        (DROPPED, "events given up without a dead-letter location"),
        (DELAYED, "events held back for a delayed endpoint"),
        (THROTTLED, "events held back by their subscription's caps"),
    ] {
        metrics::describe_counter!(name, Unit::Count, what);
    }
    metrics::describe_histogram!(LATENCY, Unit::Milliseconds, "publish to delivery");
}

/// Hands one invocation's metrics to the `metrics` facade: each subscription's, and the
/// stack's totals.
pub fn record(by_subscription: &MetricsBySubscription) {
    let mut stack = SubscriptionMetrics::default();
    for ((topic, subscription), m) in by_subscription {
        let labels = [
            ("Topic", topic.to_string()),
            ("Subscription", subscription.to_string()),
        ];
        record_one(m, &labels);
        stack.counts.add(&m.counts);
        stack.latency_ms.extend_from_slice(&m.latency_ms);
    }
    if !by_subscription.is_empty() {
        record_one(&stack, &[]);
    }
}

fn record_one(m: &SubscriptionMetrics, labels: &[(&'static str, String)]) {
    let c = &m.counts;
    for (name, value) in [
        (DELIVERED, c.delivered),
        (FAILED_ATTEMPTS, c.failed_attempts),
        (RETRIED, c.retried),
        (DEAD_LETTERED, c.dead_lettered),
        (DROPPED, c.dropped),
        (DELAYED, c.delayed),
        (THROTTLED, c.throttled),
    ] {
        if value > 0 {
            metrics::counter!(name, labels).increment(value as u64);
        }
    }
    let histogram = metrics::histogram!(LATENCY, labels);
    for v in representative(&m.latency_ms) {
        histogram.record(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_values_are_kept_as_they_are() {
        let values = [3.0, 1.0, 2.0];
        assert_eq!(representative(&values), values);
    }

    /// Many values become 100 evenly spaced order statistics: the smallest, the largest and
    /// the median survive, so a p50 or p99 over them is that of all the values.
    #[test]
    fn many_values_keep_their_percentiles() {
        let values: Vec<f64> = (0..10_000).rev().map(f64::from).collect();
        let kept = representative(&values);
        assert_eq!(kept.len(), LATENCY_VALUES);
        assert_eq!(kept[0], 0.0);
        assert_eq!(kept[LATENCY_VALUES - 1], 9_999.0);
        let p50 = kept[LATENCY_VALUES / 2];
        assert!((p50 - 5_050.0).abs() < 101.0, "p50 {p50}");
        assert!(kept.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn latency_is_milliseconds_and_never_negative() {
        let t: DateTime<Utc> = "2026-11-25T12:00:00Z".parse().unwrap();
        let later = t + chrono::Duration::microseconds(12_500);
        assert_eq!(latency_ms(t, later), 12.5);
        assert_eq!(latency_ms(later, t), 0.0);
    }
}
