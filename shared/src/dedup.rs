//! Publish deduplication (#39, rule P1 in `docs/delivery-rules.md`): a topic with a window
//! (`topic create|update --dedup-window-seconds N`) answers 200 to an event whose identity it
//! accepted less than N seconds before, and does not deliver it again.
//!
//! - An event's identity is its `id` (Event Grid schema, and custom schema when the topic's
//!   mapping names an id field the event has), or its `source` and `id` together (CloudEvents,
//!   whose spec makes that pair unique). A custom event without a mapped id gets a fresh id at
//!   publish and never dedupes.
//! - An identity is marked once its events are enqueued, with the time it was accepted, so a
//!   publish answered 503 and retried is never swallowed (G1).
//! - Whether a mark is within the window is decided from that stored time, not from DynamoDB's
//!   TTL (which deletes expired items up to days late): a window changed by `topic update`
//!   applies to marks already written.
//!
//! The functions here are pure; `gridrelay_ports::AcceptedIds` keeps the marks.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::limits::LimitError;
use crate::schema::InputSchema;

/// The longest window, as EventBridge's five minutes: a retried publish comes back within
/// seconds to minutes, and a longer window would keep more marks for what it catches.
pub const MAX_DEDUP_WINDOW_SECONDS: u16 = 300;

/// How long a mark is kept (its TTL) after it was written: the longest window and an hour, so a
/// window made longer by `topic update` finds the marks written under the shorter one.
pub const MARK_LIFETIME: Duration = Duration::seconds(MAX_DEDUP_WINDOW_SECONDS as i64 + 3600);

/// Checks `--dedup-window-seconds`: 0 (off) to [`MAX_DEDUP_WINDOW_SECONDS`].
pub fn validate_dedup_window(seconds: i64) -> Result<u16, LimitError> {
    u16::try_from(seconds)
        .ok()
        .filter(|s| *s <= MAX_DEDUP_WINDOW_SECONDS)
        .ok_or_else(|| {
            LimitError::new(
                "dedupWindowSeconds",
                seconds,
                format!("0 (off) to {MAX_DEDUP_WINDOW_SECONDS} seconds"),
            )
        })
}

/// What identifies an event within its topic for deduplication: a SHA-256 digest (hex) of its
/// identity, so every mark has the same small size whatever the ids are.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventIdentity(String);

impl EventIdentity {
    /// The digest, 64 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An identity read back from a store, as [`EventIdentity::as_str`] wrote it.
    pub fn from_digest(digest: impl Into<String>) -> Self {
        Self(digest.into())
    }

    fn of(parts: &[&str]) -> Self {
        let mut hash = Sha256::new();
        for part in parts {
            // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        Self(crate::validation::hex(&hash.finalize()))
    }
}

#[derive(Deserialize)]
struct Ids<'a> {
    #[serde(borrow, default)]
    id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    source: Option<std::borrow::Cow<'a, str>>,
}

/// The identity of one event as ingest keeps it (`crate::publish::parse_publish`'s output) in a
/// topic of `schema`; `generated`: whether an id was made at publish (a custom event whose
/// mapping names no id, or which lacks the field), which never dedupes. `None` when the event
/// has no identity to compare.
pub fn event_identity(
    schema: InputSchema,
    event: &str,
    generated: impl Fn(&str) -> bool,
) -> Option<EventIdentity> {
    let ids: Ids<'_> = serde_json::from_str(event).ok()?;
    let id = ids.id?;
    match schema {
        InputSchema::CloudEventSchemaV1_0 => Some(EventIdentity::of(&[&ids.source?, &id])),
        InputSchema::CustomEventSchema if generated(&id) => None,
        InputSchema::EventGridSchema | InputSchema::CustomEventSchema => {
            Some(EventIdentity::of(&[&id]))
        }
    }
}

/// Whether an identity accepted at `accepted_at` is still within a window of `window_seconds`
/// at `now`. A mark from a clock a little ahead (another function's) counts as within.
pub fn accepted_within(
    accepted_at: DateTime<Utc>,
    now: DateTime<Utc>,
    window_seconds: u16,
) -> bool {
    now - accepted_at < Duration::seconds(i64::from(window_seconds))
}

/// What a publish to a topic with a window does with its events.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DedupPlan {
    /// The events to enqueue, by index in the request, in order.
    pub fresh: Vec<usize>,
    /// Events answered 200 and not enqueued: accepted within the window, or a repeat of an
    /// earlier event in the same request.
    pub duplicates: usize,
    /// The identities to mark once the fresh events are enqueued.
    pub to_mark: Vec<EventIdentity>,
}

/// Splits a request's events (their identities, by index) into the fresh and the duplicates,
/// given when each identity was last accepted (`accepted`, from the store).
pub fn plan_publish(
    identities: &[Option<EventIdentity>],
    accepted: &HashMap<EventIdentity, DateTime<Utc>>,
    now: DateTime<Utc>,
    window_seconds: u16,
) -> DedupPlan {
    let mut plan = DedupPlan::default();
    let mut seen = HashSet::new();
    for (index, identity) in identities.iter().enumerate() {
        match identity {
            None => plan.fresh.push(index),
            Some(identity) => {
                let marked = accepted
                    .get(identity)
                    .is_some_and(|at| accepted_within(*at, now, window_seconds));
                if marked || !seen.insert(identity) {
                    plan.duplicates += 1;
                } else {
                    plan.fresh.push(index);
                    plan.to_mark.push(identity.clone());
                }
            }
        }
    }
    plan
}

/// The distinct identities of a request, to look up.
pub fn distinct(identities: &[Option<EventIdentity>]) -> Vec<EventIdentity> {
    let mut seen = HashSet::new();
    identities
        .iter()
        .flatten()
        .filter(|i| seen.insert(*i))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eg(id: &str) -> String {
        serde_json::json!({"id": id, "subject": "s", "data": {}}).to_string()
    }

    fn never(_: &str) -> bool {
        false
    }

    #[test]
    fn the_window_is_0_to_300_seconds_p1() {
        assert_eq!(validate_dedup_window(0), Ok(0));
        assert_eq!(validate_dedup_window(300), Ok(300));
        let e = validate_dedup_window(301).unwrap_err().to_string();
        assert!(e.contains("dedupWindowSeconds") && e.contains("301") && e.contains("300"));
        assert!(validate_dedup_window(-1).is_err());
    }

    #[test]
    fn event_grid_and_mapped_custom_events_are_known_by_id_p1() {
        let a = event_identity(InputSchema::EventGridSchema, &eg("1"), never);
        assert_eq!(
            a,
            event_identity(InputSchema::EventGridSchema, &eg("1"), never)
        );
        assert_ne!(
            a,
            event_identity(InputSchema::EventGridSchema, &eg("2"), never)
        );
        assert!(a.is_some());
        assert_eq!(
            event_identity(InputSchema::CustomEventSchema, &eg("1"), never),
            a
        );
    }

    #[test]
    fn a_custom_event_with_a_generated_id_never_dedupes_p1() {
        let generated = |id: &str| id == "fresh";
        assert_eq!(
            event_identity(InputSchema::CustomEventSchema, &eg("fresh"), generated),
            None
        );
        // Generated ids only matter where ingest makes them.
        assert!(event_identity(InputSchema::EventGridSchema, &eg("fresh"), generated).is_some());
    }

    #[test]
    fn a_cloud_event_is_known_by_source_and_id_p1() {
        let ce = |source: &str, id: &str| {
            serde_json::json!({"specversion": "1.0", "id": id, "source": source, "type": "t"})
                .to_string()
        };
        let schema = InputSchema::CloudEventSchemaV1_0;
        let a = event_identity(schema, &ce("/a", "1"), never);
        assert!(a.is_some());
        assert_eq!(a, event_identity(schema, &ce("/a", "1"), never));
        assert_ne!(a, event_identity(schema, &ce("/b", "1"), never));
        // The parts are kept apart: ("/a1", "") is not ("/a", "1").
        assert_ne!(a, event_identity(schema, &ce("/a1", ""), never));
    }

    #[test]
    fn a_mark_counts_until_its_window_has_passed_from_the_stored_time_p1() {
        let at = Utc::now();
        assert!(accepted_within(at, at, 60));
        assert!(accepted_within(at, at + Duration::milliseconds(59_999), 60));
        assert!(!accepted_within(at, at + Duration::seconds(60), 60));
        assert!(accepted_within(at + Duration::seconds(1), at, 60));
        assert!(!accepted_within(at, at, 0));
    }

    #[test]
    fn a_request_keeps_the_first_of_each_identity_and_what_the_window_has_not_seen_p1() {
        let now = Utc::now();
        let id = |s: &str| Some(EventIdentity::of(&[s]));
        let identities = vec![id("a"), id("b"), None, id("a"), id("c"), None];
        let accepted = HashMap::from([
            (EventIdentity::of(&["b"]), now - Duration::seconds(10)),
            (EventIdentity::of(&["c"]), now - Duration::seconds(61)),
        ]);
        let plan = plan_publish(&identities, &accepted, now, 60);
        assert_eq!(plan.fresh, vec![0, 2, 4, 5]);
        assert_eq!(plan.duplicates, 2);
        assert_eq!(
            plan.to_mark,
            vec![EventIdentity::of(&["a"]), EventIdentity::of(&["c"])]
        );
        assert_eq!(distinct(&identities).len(), 3);
    }
}
