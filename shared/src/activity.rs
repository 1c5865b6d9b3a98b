//! How delivery to each subscription went over a window, from the delivery journal (#36): what
//! the console's overview draws for every subscription (counts, publish-to-delivery latency,
//! the window cut into slices for its charts, and the last failure).

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::classify::DeliveryOutcome;
use crate::journal::{JournalEntry, Step, line_of, step_order};

/// One slice of the window: events delivered and events in failed attempts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Slice {
    pub delivered: u64,
    pub failed: u64,
}

/// The latest attempt that did not deliver.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastFailure {
    pub time: DateTime<Utc>,
    pub status: Option<u16>,
    pub outcome: DeliveryOutcome,
    /// Why no answer came, else the answer's first bytes.
    pub detail: Option<String>,
}

/// Publish-to-delivery latency percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Latency {
    pub p50_ms: u64,
    pub p99_ms: u64,
    /// How many deliveries they are taken over.
    pub samples: u64,
}

/// How delivery to one subscription went over the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Activity {
    /// Events delivered (answered with success, or a timed-out attempt answered late: R4).
    pub delivered: u64,
    /// Events in attempts that did not deliver (each attempt counts its events).
    pub failed: u64,
    /// Events the dead-letter function wrote to the dead-letter location (L3).
    pub dead_lettered: u64,
    /// From publish (or the replay's or redrive's sending) to the answer, over the events
    /// delivered in the window whose sending is in it too; `None` if there are none.
    pub latency: Option<Latency>,
    /// The window cut into equal slices, oldest first.
    pub slices: Vec<Slice>,
    pub last_failure: Option<LastFailure>,
}

/// The window [`activity`] summarises: `slices` equal slices from `from` to `to`.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub slices: usize,
}

impl Window {
    /// The slice `at` falls in, if it is in the window.
    fn slice_of(&self, at: DateTime<Utc>) -> Option<usize> {
        if at < self.from || at >= self.to || self.slices == 0 {
            return None;
        }
        let span = (self.to - self.from).num_milliseconds().max(1);
        let into = (at - self.from).num_milliseconds();
        let slices = i64::try_from(self.slices).unwrap_or(i64::MAX);
        usize::try_from(into.saturating_mul(slices) / span).ok()
    }
}

/// What `entries` (any order; an entry written twice counts once) say of each subscription's
/// deliveries in `window`, keyed by (topic, subscription). Entries outside the window count
/// only as the sending a delivery in it is measured from.
pub fn activity<'a>(
    entries: impl IntoIterator<Item = &'a JournalEntry>,
    window: Window,
) -> BTreeMap<(String, String), Activity> {
    let mut seen = HashSet::new();
    let mut entries: Vec<&JournalEntry> = entries
        .into_iter()
        .filter(|e| seen.insert(line_of(e)))
        .collect();
    // In the order they happened; a sending before its attempt in the same millisecond.
    entries.sort_by_key(|e| (e.time, step_order(&e.step)));
    // When each event was last sent to each subscription, as the entries go by in time order.
    let mut sent: HashMap<(&str, &str, &str), DateTime<Utc>> = HashMap::new();
    let mut latencies: HashMap<(&str, &str), Vec<u64>> = HashMap::new();
    let mut out: BTreeMap<(String, String), Activity> = BTreeMap::new();
    for e in entries {
        let key = (e.topic.as_str(), e.subscription.as_str());
        if let Step::Fanned { .. } = e.step {
            for id in &e.ids {
                sent.insert((key.0, key.1, id), e.time);
            }
            continue;
        }
        let slice = window.slice_of(e.time);
        if slice.is_none() {
            continue;
        }
        let activity = out
            .entry((e.topic.clone(), e.subscription.clone()))
            .or_insert_with(|| Activity {
                slices: vec![Slice::default(); window.slices],
                ..Activity::default()
            });
        let events = u64::try_from(e.ids.len()).unwrap_or(u64::MAX);
        let delivered_at = match &e.step {
            Step::Attempt(a) if a.outcome == DeliveryOutcome::Succeeded => {
                Some(e.time + chrono::Duration::milliseconds(i64::try_from(a.ms).unwrap_or(0)))
            }
            Step::LateSuccess { .. } => Some(e.time),
            Step::Attempt(a) => {
                activity.failed += events;
                if let Some(s) = slice.and_then(|i| activity.slices.get_mut(i)) {
                    s.failed += events;
                }
                if activity
                    .last_failure
                    .as_ref()
                    .is_none_or(|f| f.time <= e.time)
                {
                    activity.last_failure = Some(LastFailure {
                        time: e.time,
                        status: a.status,
                        outcome: a.outcome,
                        detail: a.error.clone().or_else(|| a.answer.clone()),
                    });
                }
                None
            }
            Step::DeadLettered { .. } => {
                activity.dead_lettered += events;
                None
            }
            _ => None,
        };
        if let Some(at) = delivered_at {
            activity.delivered += events;
            if let Some(s) = slice.and_then(|i| activity.slices.get_mut(i)) {
                s.delivered += events;
            }
            let waits = latencies.entry(key).or_default();
            for id in &e.ids {
                if let Some(from) = sent.remove(&(key.0, key.1, id.as_str())) {
                    waits.push(u64::try_from((at - from).num_milliseconds()).unwrap_or(0));
                }
            }
        }
    }
    for ((topic, subscription), mut waits) in latencies {
        if let Some(a) = out.get_mut(&(topic.to_string(), subscription.to_string())) {
            a.latency = percentiles(&mut waits);
        }
    }
    out
}

/// p50 and p99 by nearest rank.
fn percentiles(samples: &mut [u64]) -> Option<Latency> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let rank = |p: usize| {
        let n = samples.len();
        samples[(n * p).div_ceil(100).clamp(1, n) - 1]
    };
    Some(Latency {
        p50_ms: rank(50),
        p99_ms: rank(99),
        samples: u64::try_from(samples.len()).unwrap_or(u64::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Attempt, Next};

    fn at(minute: i64) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-28T10:00:00Z")
            .unwrap()
            .to_utc()
            + chrono::Duration::minutes(minute)
    }

    fn entry(sub: &str, ids: &[&str], minute: i64, step: Step) -> JournalEntry {
        JournalEntry {
            topic: "orders".into(),
            subscription: sub.into(),
            ids: ids.iter().map(|s| s.to_string()).collect(),
            time: at(minute),
            delivery: None,
            step,
        }
    }

    fn fanned() -> Step {
        Step::Fanned {
            event_type: "t".into(),
            subject: String::new(),
            bytes: 10,
            replay: None,
            redrive: None,
        }
    }

    fn attempt(status: Option<u16>, outcome: DeliveryOutcome, ms: u64, next: Next) -> Step {
        Step::Attempt(Attempt {
            attempt: 1,
            ms,
            endpoint: "https://example.com/".into(),
            status,
            outcome,
            retry_after_s: None,
            error: None,
            answer: Some(format!("answer {status:?}")),
            next,
        })
    }

    fn window() -> Window {
        Window {
            from: at(0),
            to: at(60),
            slices: 12,
        }
    }

    /// #36: delivered, failed and dead-lettered events are counted per subscription and per
    /// five-minute slice; the last failure is the latest attempt that did not deliver (B5, L3).
    #[test]
    fn counts_each_subscriptions_deliveries_failures_and_dead_letters_by_slice() {
        let retry = Next::Retry { due: at(30) };
        let entries = vec![
            entry("audit", &["a", "b"], 1, fanned()),
            entry(
                "audit",
                &["a", "b"],
                2,
                attempt(Some(200), DeliveryOutcome::Succeeded, 40, Next::Delivered),
            ),
            entry("audit", &["c"], 7, fanned()),
            entry(
                "audit",
                &["c"],
                8,
                attempt(Some(500), DeliveryOutcome::GenericError, 5, retry.clone()),
            ),
            entry(
                "audit",
                &["c"],
                20,
                attempt(Some(503), DeliveryOutcome::Busy, 5, retry),
            ),
            entry(
                "audit",
                &["c"],
                21,
                Step::DeadLettered {
                    location: "s3://b/k".into(),
                },
            ),
            // Written twice (a redelivered invocation): counted once.
            entry(
                "audit",
                &["c"],
                20,
                attempt(
                    Some(503),
                    DeliveryOutcome::Busy,
                    5,
                    Next::Retry { due: at(30) },
                ),
            ),
            entry(
                "other",
                &["a"],
                3,
                attempt(Some(200), DeliveryOutcome::Succeeded, 1, Next::Delivered),
            ),
        ];
        let all = activity(&entries, window());
        let audit = &all[&("orders".to_string(), "audit".to_string())];
        assert_eq!(
            (audit.delivered, audit.failed, audit.dead_lettered),
            (2, 2, 1)
        );
        assert_eq!(audit.slices.len(), 12);
        assert_eq!(
            audit.slices[0],
            Slice {
                delivered: 2,
                failed: 0
            }
        );
        assert_eq!(audit.slices[1].failed, 1);
        assert_eq!(audit.slices[4].failed, 1);
        let last = audit.last_failure.as_ref().unwrap();
        assert_eq!((last.time, last.status), (at(20), Some(503)));
        assert_eq!(last.outcome, DeliveryOutcome::Busy);
        assert_eq!(last.detail.as_deref(), Some("answer Some(503)"));
        assert_eq!(
            all[&("orders".to_string(), "other".to_string())].delivered,
            1
        );
    }

    /// #36: latency runs from the event's sending (its `fanned` entry) to the answer, also
    /// for a sending before the window or in the same millisecond as its answer; a delivery
    /// whose sending is not in the entries has none, and entries before or after the window
    /// are not counted.
    #[test]
    fn latency_runs_from_sending_to_answer_over_the_window() {
        let mut entries = Vec::new();
        // 100 events, each delivered i seconds after it was sent.
        for i in 1..=100_i64 {
            let id = format!("e{i}");
            entries.push(entry("audit", &[&id], 10, fanned()));
            let mut answered = entry(
                "audit",
                &[&id],
                10,
                attempt(Some(200), DeliveryOutcome::Succeeded, 0, Next::Delivered),
            );
            answered.time += chrono::Duration::seconds(i);
            entries.push(answered);
        }
        // Sent and answered in the same millisecond, written in the other order: 0 ms.
        entries.push(entry(
            "audit",
            &["tie"],
            20,
            attempt(Some(200), DeliveryOutcome::Succeeded, 0, Next::Delivered),
        ));
        entries.push(entry("audit", &["tie"], 20, fanned()));
        // Before the window: not counted, but the sending a delivery in it is measured from.
        entries.push(entry("audit", &["early"], -10, fanned()));
        entries.push(entry(
            "audit",
            &["early"],
            -5,
            attempt(
                Some(500),
                DeliveryOutcome::GenericError,
                0,
                Next::Retry { due: at(5) },
            ),
        ));
        let mut early = entry(
            "audit",
            &["early"],
            5,
            attempt(Some(200), DeliveryOutcome::Succeeded, 0, Next::Delivered),
        );
        early.time += chrono::Duration::milliseconds(500);
        entries.push(early);
        // Sent before the entries begin: delivered, but no latency.
        entries.push(entry(
            "audit",
            &["old"],
            30,
            attempt(Some(200), DeliveryOutcome::Succeeded, 0, Next::Delivered),
        ));
        // After the window: not counted.
        entries.push(entry(
            "audit",
            &["late"],
            61,
            attempt(Some(500), DeliveryOutcome::GenericError, 0, Next::Delivered),
        ));
        let all = activity(&entries, window());
        let audit = &all[&("orders".to_string(), "audit".to_string())];
        assert_eq!(audit.delivered, 103);
        assert_eq!(
            audit.failed, 0,
            "the failure before the window is not counted"
        );
        // 100 of 1..=100 s, 0 ms (tie) and 15 min 0.5 s (early): the median is the 51st of 102.
        assert_eq!(
            audit.latency,
            Some(Latency {
                p50_ms: 50_000,
                p99_ms: 100_000,
                samples: 102
            })
        );
        assert!(audit.last_failure.is_none());
    }
}
