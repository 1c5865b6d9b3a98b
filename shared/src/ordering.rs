//! O1: ordered delivery per key. A subscription with an ordering key (`subject`, or a field
//! under `data`) receives the events that share a value of it in the order gridrelay accepted
//! them: within one publish, their order in it; between publishes, the order their enqueue
//! completed. Each key is an SQS FIFO message group of its own ([`message_group`]), so one
//! key's failing event holds back only that key.
//!
//! A FIFO queue takes no per-message delay and keeps a group's order only while its head
//! stays in the queue, so an ordered event that must wait (a retry, a delayed endpoint) is not
//! sent again as a new message, as unordered ones are: its message is kept in flight for the
//! wait ([`hold_for`]), and what its attempts were is kept beside it in the delivery state
//! table. Every such wait is a receive of the message, counted by SQS towards the queue's
//! redrive policy; [`ORDERED_MAX_RECEIVE_COUNT`] keeps that policy out of the ladder's reach.
//!
//! These are the rules; `deliver` and `ingest` do the I/O.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::limits::LimitError;
use crate::message::{DeliveryMessage, QueuedEvent};
use serde_json::value::RawValue;

/// The longest path under `data` an ordering key may name, in bytes.
pub const MAX_KEY_PATH_BYTES: usize = 256;

/// SQS's longest visibility timeout, counted from the receive.
pub const MAX_HOLD: Duration = Duration::from_secs(12 * 60 * 60);

/// What a hold leaves of [`MAX_HOLD`] for the time between the receive and the invocation's
/// start, which `deliver` does not see.
pub const HOLD_MARGIN: Duration = Duration::from_secs(5 * 60);

/// The ordered queue's redrive `maxReceiveCount`, SQS's most. A message is received once per
/// attempt (30 at most, R5), once per hold (a delayed endpoint (D1), a subscription's caps,
/// the invocation's deadline, the rest of a wait longer than [`MAX_HOLD`]), and once for each
/// time an event before it in the same batch was held. Holds can be short (a cap's turn comes
/// in a second), so [`hold_floor`] stretches them once a message has been received
/// [`FREE_RECEIVES`] times: a message then takes at most about 80 receives of its own in the
/// 24 hours an event may live, and one batch's ten at most about 800 together, below this.
pub const ORDERED_MAX_RECEIVE_COUNT: u32 = 1000;

/// Receives an ordered message takes at the pace its holds ask for, before [`hold_floor`]
/// stretches them.
pub const FREE_RECEIVES: u32 = 20;

/// The longest [`hold_floor`] asks for.
pub const LONGEST_FLOOR: Duration = Duration::from_secs(30 * 60);

/// The receive at which an ordered message that cannot be read (sealed by gridrelay, so not
/// dropped as forged, but not a message this version of `deliver` reads: sent by a later
/// version of `ingest`, as during a rollback or a deployment not yet everywhere) is parked in the
/// ordered redrive queue, so its key goes on without it. Before that it comes back after the
/// failed records' short waits (30 s, 90 s, 4.5 min, 13.5 min: about 20 minutes in all, time
/// for a deployment that is rolling out to reach every function), holding its key. SQS's
/// own redrive would take [`ORDERED_MAX_RECEIVE_COUNT`] receives: weeks at 30 minutes each,
/// past the queue's 14-day retention.
pub const UNREADABLE_RECEIVES: u32 = 5;

/// O1: whether an ordered message that cannot be read, received `receive_count` times, is
/// parked now ([`UNREADABLE_RECEIVES`]). Every receive counts, whatever caused it (SQS cannot
/// tell them apart): one held behind earlier events of its key, or held and retried by a
/// version that could read it before a rollback, may be parked sooner, even at once.
pub fn parks_unreadable(receive_count: u32) -> bool {
    receive_count >= UNREADABLE_RECEIVES
}

/// O1: which value of an event orders its delivery.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OrderingKey {
    /// The event's `subject`.
    Subject,
    /// A field under the event's `data`, by its dotted path (`data.order.id` is `order.id`).
    Data(String),
}

impl OrderingKey {
    /// The key's value in `event` (kept in the subscription's delivery schema: Event Grid
    /// and CloudEvents both name them `subject` and `data`): a string as it is, a number or a
    /// boolean as its JSON text. An event without one (absent, `null`, an object or an
    /// array) has no key, and is delivered without order.
    pub fn value_in(&self, event: &Value) -> Option<String> {
        let value = match self {
            Self::Subject => event.get("subject"),
            Self::Data(path) => path
                .split('.')
                .try_fold(event.get("data")?, |v, part| v.get(part)),
        }?;
        match value {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }
}

impl FromStr for OrderingKey {
    type Err = LimitError;

    /// `subject` or `data.FIELD[.FIELD…]`, each field not empty, the path at most
    /// [`MAX_KEY_PATH_BYTES`].
    fn from_str(text: &str) -> Result<Self, LimitError> {
        let refused = || {
            LimitError::new(
                "orderingKey",
                format!("{text:?}"),
                format!(
                    "subject, or data.FIELD[.FIELD...] with no empty field and a path of at most {MAX_KEY_PATH_BYTES} bytes"
                ),
            )
        };
        if text == "subject" {
            return Ok(Self::Subject);
        }
        let path = text.strip_prefix("data.").ok_or_else(refused)?;
        if path.is_empty()
            || path.len() > MAX_KEY_PATH_BYTES
            || path.split('.').any(|part| part.trim().is_empty())
            || path.chars().any(char::is_control)
        {
            return Err(refused());
        }
        Ok(Self::Data(path.to_string()))
    }
}

impl fmt::Display for OrderingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Subject => f.write_str("subject"),
            Self::Data(path) => write!(f, "data.{path}"),
        }
    }
}

impl Serialize for OrderingKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for OrderingKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// O1: the SQS message group of a subscription's events with key value `key`: the
/// subscription's id and a digest of the value (any length and any characters, where a group
/// id takes 128 of SQS's few). Two values whose digests' first 128 bits meet would share a
/// group: delivered in one order together, never out of their own.
pub fn message_group(subscription_id: &str, key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{subscription_id}:{hex}")
}

/// O1: an ordered message's progress as the delivery state table keeps it beside the message:
/// its delivery message as it would be enqueued again (attempts, due time, last attempt), the
/// events' bodies left out (the queue keeps them, and they may be larger than a table item).
pub fn progress_text(message: &DeliveryMessage) -> Result<String, serde_json::Error> {
    let null = || RawValue::from_string("null".to_string());
    let events = message
        .events
        .iter()
        .map(|e| Ok(QueuedEvent::new(e.publish_time, null()?).with_last_attempt(e.last_attempt)))
        .collect::<Result<Vec<_>, serde_json::Error>>()?;
    serde_json::to_string(&DeliveryMessage {
        events,
        ..message.clone_without_events()
    })
}

/// Why a kept progress does not fit the message it was kept for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgressError {
    #[error("the kept progress is not readable: {0}")]
    Unreadable(String),
    #[error("the kept progress has {kept} events, its message {received}")]
    Events { kept: usize, received: usize },
}

/// O1: the message as its attempts left it: `progress` ([`progress_text`]) with the events of
/// `received` (the message as the queue holds it, unchanged since it was first sent) put back.
pub fn resume(progress: &str, received: DeliveryMessage) -> Result<DeliveryMessage, ProgressError> {
    let mut kept: DeliveryMessage =
        serde_json::from_str(progress).map_err(|e| ProgressError::Unreadable(e.to_string()))?;
    if kept.events.len() != received.events.len() {
        return Err(ProgressError::Events {
            kept: kept.events.len(),
            received: received.events.len(),
        });
    }
    for (k, r) in kept.events.iter_mut().zip(received.events) {
        k.event = r.event;
    }
    Ok(kept)
}

/// O1: how long to keep a received ordered message in flight so it comes back at `until`: the
/// time left until then, in whole seconds rounded up (never early), at most what is left of
/// [`MAX_HOLD`] less [`HOLD_MARGIN`] since the invocation that received it began at
/// `invoked_at` (a longer wait is held again when it comes back, its due time kept beside
/// it). Zero when `until` has come.
pub fn hold_for(until: DateTime<Utc>, invoked_at: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    let left = (until - now).to_std().unwrap_or(Duration::ZERO);
    let allowed = (MAX_HOLD - HOLD_MARGIN)
        .saturating_sub((now - invoked_at).to_std().unwrap_or(Duration::ZERO));
    let whole = Duration::from_secs(left.as_secs() + u64::from(left.subsec_nanos() > 0));
    whole.min(allowed)
}

/// O1: the least an ordered message received `receive_count` times is held, whatever the hold
/// asked for: nothing for its first [`FREE_RECEIVES`] receives, then 2 s, 4 s, 8 s ... doubling
/// up to [`LONGEST_FLOOR`] (scaled), so short holds repeated for hours (a subscription's cap
/// contended, invocations out of time) never take it to [`ORDERED_MAX_RECEIVE_COUNT`], where
/// SQS would move it to the redrive queue and its key would go on without it.
pub fn hold_floor(receive_count: u32, scale: crate::time_scale::TimeScale) -> Duration {
    let Some(over) = receive_count.checked_sub(FREE_RECEIVES).filter(|n| *n > 0) else {
        return Duration::ZERO;
    };
    let doubled = Duration::from_secs(1u64 << over.min(20));
    crate::message::whole_seconds_up(scale.apply(doubled.min(LONGEST_FLOOR)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    /// O1: the flag takes `subject` or a path under `data`; anything else is refused naming
    /// the setting, the value and what is allowed; it reads back as it was given.
    #[test]
    fn an_ordering_key_is_subject_or_a_data_field_o1() {
        assert_eq!("subject".parse(), Ok(OrderingKey::Subject));
        assert_eq!(
            "data.order.id".parse(),
            Ok(OrderingKey::Data("order.id".into()))
        );
        for bad in [
            "",
            "Subject",
            "data",
            "data.",
            "data.a..b",
            "data.a. ",
            "id",
            "eventType",
            "data.a\nb",
        ] {
            let e = bad.parse::<OrderingKey>().unwrap_err();
            assert_eq!(e.field, "orderingKey", "{bad:?}");
            assert!(e.allowed.contains("subject"), "{e}");
        }
        let long = format!("data.{}", "a".repeat(MAX_KEY_PATH_BYTES + 1));
        assert!(long.parse::<OrderingKey>().is_err());
        let longest = format!("data.{}", "a".repeat(MAX_KEY_PATH_BYTES));
        assert!(longest.parse::<OrderingKey>().is_ok());
        for text in ["subject", "data.order.id"] {
            let key: OrderingKey = text.parse().unwrap();
            assert_eq!(key.to_string(), text);
            let json = serde_json::to_value(&key).unwrap();
            assert_eq!(json, json!(text));
            assert_eq!(serde_json::from_value::<OrderingKey>(json).unwrap(), key);
        }
        assert!(serde_json::from_value::<OrderingKey>(json!("data.")).is_err());
    }

    /// O1: the key's value is a string as it is, a number or boolean as its text; an event
    /// without one (absent, null, object, array) has none.
    #[test]
    fn the_key_is_read_from_the_subject_or_data_o1() {
        let event = json!({
            "subject": "orders/17",
            "data": {"order": {"id": "o-17", "n": 17, "paid": true, "lines": [1], "none": null}},
        });
        let data = |p: &str| OrderingKey::Data(p.into()).value_in(&event);
        assert_eq!(
            OrderingKey::Subject.value_in(&event).as_deref(),
            Some("orders/17")
        );
        assert_eq!(data("order.id").as_deref(), Some("o-17"));
        assert_eq!(data("order.n").as_deref(), Some("17"));
        assert_eq!(data("order.paid").as_deref(), Some("true"));
        for none in ["order", "order.lines", "order.none", "order.missing", "x.y"] {
            assert_eq!(data(none), None, "{none}");
        }
        assert_eq!(OrderingKey::Subject.value_in(&json!({"data": 1})), None);
        assert_eq!(
            OrderingKey::Data("a".into()).value_in(&json!({"data_base64": "AA=="})),
            None
        );
    }

    /// O1: one group per subscription and key value, within SQS's 128 characters whatever
    /// the value.
    #[test]
    fn each_subscription_and_key_is_a_group_of_its_own_o1() {
        let id = "0b5a6c1e-8a35-4c8f-9f0e-6f2d4f1d2a10";
        let group = message_group(id, "o-17");
        assert_eq!(group, message_group(id, "o-17"));
        assert_ne!(group, message_group(id, "o-18"));
        assert_ne!(
            group,
            message_group("1b5a6c1e-8a35-4c8f-9f0e-6f2d4f1d2a10", "o-17")
        );
        let long = message_group(id, &"ключ\u{1F600}".repeat(10_000));
        for g in [&group, &long] {
            assert!(g.len() <= 128, "{g}");
            assert!(g.chars().all(|c| c.is_ascii_graphic()), "{g}");
        }
    }

    /// O1: the kept progress holds the message's history and due time, never its events'
    /// bodies; put together with the message as received it is the message as its attempts
    /// left it. A progress kept for another number of events is refused.
    #[test]
    fn progress_is_kept_without_the_events_and_resumed_with_them_o1() {
        use crate::classify::DeliveryOutcome;
        use crate::message::{AttemptRecord, DeliveryHistory};
        use crate::subscription::{Subscription, SubscriptionRequest};
        let sub: Subscription = SubscriptionRequest {
            topic: "orders".into(),
            name: "ordered".into(),
            endpoint: "https://example.com/hook".into(),
            ordering_key: Some("subject".into()),
            ..SubscriptionRequest::default()
        }
        .validate(
            crate::schema::InputSchema::EventGridSchema,
            at("2026-11-29T06:00:00Z"),
        )
        .unwrap();
        let event = RawValue::from_string(r#"{"id":"e-1","secret":"body"}"#.into()).unwrap();
        let published = at("2026-11-29T06:00:00Z");
        let sent = DeliveryMessage::packed(
            &DeliveryHistory::new(&sub),
            published,
            vec![QueuedEvent::new(published, event)],
        )
        .remove(0);
        let failed = AttemptRecord {
            time: at("2026-11-29T06:00:01Z"),
            outcome: DeliveryOutcome::Busy,
        };
        let retried = DeliveryMessage::packed(
            &sent.history().after_attempt(failed, None),
            at("2026-11-29T06:00:31Z"),
            vec![sent.events[0].clone()],
        )
        .remove(0);
        let text = progress_text(&retried).unwrap();
        assert!(!text.contains("secret"), "{text}");
        let resumed = resume(&text, sent.clone()).unwrap();
        assert_eq!(resumed.to_body().unwrap(), retried.to_body().unwrap());
        assert_eq!(resumed.attempts, 1);
        assert_eq!(resumed.not_before, at("2026-11-29T06:00:31Z"));
        let two = DeliveryMessage {
            events: vec![sent.events[0].clone(), sent.events[0].clone()],
            ..sent.clone()
        };
        assert_eq!(
            resume(&text, two).unwrap_err(),
            ProgressError::Events {
                kept: 1,
                received: 2
            }
        );
        assert!(matches!(
            resume("{", sent),
            Err(ProgressError::Unreadable(_))
        ));
    }

    /// O1: holds that ask for nothing, repeated for an event's longest life (24 hours), take a
    /// message at most 100 receives, so one batch's ten (each received with every hold of
    /// those before it) stay below the redrive count; the floor doubles from 2 s to 30 minutes
    /// after the free receives, and scales.
    #[test]
    fn short_holds_repeated_all_day_stay_below_the_redrive_count_o1() {
        use crate::time_scale::TimeScale;
        assert_eq!(hold_floor(FREE_RECEIVES, TimeScale::REAL), Duration::ZERO);
        assert_eq!(
            hold_floor(FREE_RECEIVES + 1, TimeScale::REAL),
            Duration::from_secs(2)
        );
        assert_eq!(
            hold_floor(FREE_RECEIVES + 3, TimeScale::REAL),
            Duration::from_secs(8)
        );
        assert_eq!(hold_floor(999, TimeScale::REAL), LONGEST_FLOOR);
        assert_eq!(
            hold_floor(999, TimeScale::new(0.01).unwrap()),
            Duration::from_secs(18)
        );
        let life = Duration::from_secs(24 * 60 * 60);
        let (mut receives, mut lived) = (0u32, Duration::ZERO);
        while lived < life {
            receives += 1;
            lived += hold_floor(receives, TimeScale::REAL);
        }
        assert!(receives <= 100, "{receives} receives in a day");
        assert!(receives * 10 < ORDERED_MAX_RECEIVE_COUNT);
    }

    /// O1: an ordered message that cannot be read holds its key through four short waits
    /// (about 20 minutes), then is parked at its fifth receive, far below the redrive count.
    #[test]
    fn an_unreadable_ordered_message_is_parked_at_its_fifth_receive_o1() {
        use crate::delivery::redelivery_delay;
        use crate::time_scale::TimeScale;
        assert!(!parks_unreadable(1));
        assert!(!parks_unreadable(UNREADABLE_RECEIVES - 1));
        assert!(parks_unreadable(UNREADABLE_RECEIVES));
        assert!(parks_unreadable(ORDERED_MAX_RECEIVE_COUNT));
        let held: Duration = (1..UNREADABLE_RECEIVES)
            .map(|n| redelivery_delay(n, TimeScale::REAL))
            .sum();
        assert_eq!(held, Duration::from_secs(20 * 60));
    }

    /// Parking comes long before SQS's own redrive of the ordered queue would.
    const _: () = assert!(UNREADABLE_RECEIVES * 100 < ORDERED_MAX_RECEIVE_COUNT);

    /// O1: a hold lasts until the due time, rounded up to whole seconds, and never past
    /// twelve hours from the receive; nothing once due.
    #[test]
    fn a_hold_lasts_until_due_within_twelve_hours_of_the_receive_o1() {
        let received = at("2026-11-29T06:00:00Z");
        let now = at("2026-11-29T06:00:02Z");
        assert_eq!(
            hold_for(at("2026-11-29T06:00:12.2Z"), received, now),
            Duration::from_secs(11)
        );
        assert_eq!(hold_for(now, received, now), Duration::ZERO);
        assert_eq!(
            hold_for(at("2026-11-29T05:00:00Z"), received, now),
            Duration::ZERO
        );
        assert_eq!(
            hold_for(at("2026-11-30T06:00:00Z"), received, now),
            MAX_HOLD - HOLD_MARGIN - Duration::from_secs(2)
        );
    }
}
