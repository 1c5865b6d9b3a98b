//! The dead-letter function's decisions: which messages go into which object (L3), and what
//! becomes of a message whose object could not be written (L5).
//!
//! Pure, like [`crate::delivery`] for the deliver worker: the function reads its queue batch and
//! the clock, calls these, and carries out what they return (write, announce, send back, drop and
//! count). Each rule is tested here without a bucket or a queue.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;

use crate::dead_letter::{FieldNaming, render_object, render_record};
use crate::decision::to_chrono;
use crate::message::{DeadLetterEntry, DeadLetterMessage, queue_delay};
use crate::time_scale::TimeScale;

/// L5: how long a dead-letter location may be unavailable before its events are dropped.
pub const UNAVAILABLE_LIMIT: Duration = Duration::from_secs(4 * 3600);
/// L5: the wait between tries to write to an unavailable location.
pub const WRITE_RETRY_DELAY: Duration = Duration::from_secs(60);

/// L3: what records share an object: the same location, subscription and hour.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectGroup {
    pub bucket: String,
    pub prefix: String,
    pub topic: String,
    pub subscription: String,
    pub subscription_id: String,
    /// `YYYYMMDDHH` of the time delivery gave up.
    pub hour: String,
}

impl ObjectGroup {
    pub fn of(message: &DeadLetterMessage) -> Self {
        Self {
            bucket: message.destination.bucket.clone(),
            prefix: message.destination.prefix.clone(),
            topic: message.topic.clone(),
            subscription: message.subscription.clone(),
            subscription_id: message.subscription_id.clone(),
            hour: message.dead_lettered_at.format("%Y%m%d%H").to_string(),
        }
    }
}

/// The messages of one object to write, each with its position in the queue batch.
pub type ObjectMessages = Vec<(usize, DeadLetterMessage)>;

/// What to do with one queue batch.
#[derive(Debug, Default)]
pub struct WritePlan {
    /// One entry per object, in a stable order.
    pub objects: Vec<ObjectMessages>,
    /// Positions of bodies that are not dead-letter messages: left to the queue's redrive policy,
    /// never mixed into an object.
    pub unreadable: Vec<usize>,
}

/// Groups a batch's message bodies (`None`: a record without a body) into the objects to write.
pub fn plan_writes<'a>(bodies: impl IntoIterator<Item = Option<&'a str>>) -> WritePlan {
    let mut groups: BTreeMap<ObjectGroup, ObjectMessages> = BTreeMap::new();
    let mut unreadable = Vec::new();
    for (i, body) in bodies.into_iter().enumerate() {
        match body.map(DeadLetterMessage::from_body) {
            Some(Ok(m)) => groups.entry(ObjectGroup::of(&m)).or_default().push((i, m)),
            _ => unreadable.push(i),
        }
    }
    WritePlan {
        objects: groups.into_values().collect(),
        unreadable,
    }
}

/// The object's body (an L6 JSON array) and how many records it holds.
pub fn render_object_of(
    messages: &[(usize, DeadLetterMessage)],
) -> Result<(String, usize), serde_json::Error> {
    let records = messages
        .iter()
        .flat_map(|(_, m)| {
            let naming = FieldNaming::for_schema(m.schema);
            m.entries.iter().map(move |e| render_record(e, naming))
        })
        .collect::<Result<Vec<Box<RawValue>>, _>>()?;
    Ok((render_object(&records), records.len()))
}

/// L7: how many records an object holds, per `deadLetterReason`.
pub fn reason_counts<'a>(
    entries: impl IntoIterator<Item = &'a DeadLetterEntry>,
) -> BTreeMap<String, usize> {
    let mut reasons = BTreeMap::new();
    for entry in entries {
        *reasons.entry(entry.reason.to_string()).or_insert(0) += 1;
    }
    reasons
}

/// L7: whether a write for `topic` is announced on the system topic. The system topic's own
/// dead-letters are not, so a failing notification subscriber cannot loop.
pub fn is_announced(topic: &str, system_topic: &str) -> bool {
    topic != system_topic
}

/// What becomes of a message whose object could not be written.
#[derive(Debug)]
pub enum AfterWriteFailure {
    /// Sent back to the dead-letter queue, to be written after `delay`; the message carries
    /// when its writes began to fail.
    TryAgain {
        message: Box<DeadLetterMessage>,
        delay: Duration,
    },
    /// L5: the location has been unavailable for four hours: `events` are dropped and counted.
    Drop { events: usize },
}

/// L5: a message whose write failed at `now` is tried again a minute later, until four hours
/// (scaled) have passed since its first failed write; then its events are dropped.
pub fn after_write_failure(
    mut message: DeadLetterMessage,
    now: DateTime<Utc>,
    scale: TimeScale,
) -> AfterWriteFailure {
    let since = *message.first_write_failure.get_or_insert(now);
    if now - since >= to_chrono(scale.apply(UNAVAILABLE_LIMIT)) {
        AfterWriteFailure::Drop {
            events: message.entries.len(),
        }
    } else {
        AfterWriteFailure::TryAgain {
            message: Box::new(message),
            delay: queue_delay(scale.apply(WRITE_RETRY_DELAY)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::DeliveryOutcome;
    use crate::decision::DeadLetterReason;
    use crate::schema::DeliverySchema;
    use crate::subscription::DeadLetterDestination;
    use chrono::TimeZone;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 23, h, m, 0).unwrap()
    }

    fn entry(reason: DeadLetterReason) -> DeadLetterEntry {
        DeadLetterEntry {
            reason,
            delivery_attempts: 3,
            last_outcome: Some(DeliveryOutcome::Busy),
            publish_time: at(9, 0),
            last_attempt_time: Some(at(9, 30)),
            event: RawValue::from_string(r#"{"id":"e1","data":{}}"#.into()).unwrap(),
        }
    }

    fn message(
        subscription: &str,
        bucket: &str,
        dead_lettered_at: DateTime<Utc>,
    ) -> DeadLetterMessage {
        DeadLetterMessage {
            topic: "orders".into(),
            subscription: subscription.into(),
            subscription_id: format!("{subscription}-id"),
            schema: DeliverySchema::EventGridSchema,
            destination: DeadLetterDestination {
                bucket: bucket.into(),
                prefix: "dl".into(),
            },
            dead_lettered_at,
            first_write_failure: None,
            delivery: None,
            entries: vec![entry(DeadLetterReason::MaxDeliveryAttemptsExceeded)],
        }
    }

    fn body(m: &DeadLetterMessage) -> String {
        m.to_body().unwrap()
    }

    /// L3: one object per location, subscription and hour; unreadable bodies stay apart.
    #[test]
    fn l3_groups_by_location_subscription_and_hour() {
        let bodies = [
            Some(body(&message("a", "b1", at(10, 5)))),
            Some(body(&message("a", "b1", at(10, 55)))),
            Some("{\"not\":\"a dead-letter message\"}".to_string()),
            Some(body(&message("a", "b1", at(11, 0)))),
            Some(body(&message("b", "b1", at(10, 5)))),
            None,
            Some(body(&message("a", "b2", at(10, 5)))),
        ];
        let plan = plan_writes(bodies.iter().map(|b| b.as_deref()));
        assert_eq!(plan.unreadable, vec![2, 5]);
        let mut positions: Vec<Vec<usize>> = plan
            .objects
            .iter()
            .map(|o| o.iter().map(|(i, _)| *i).collect())
            .collect();
        positions.sort();
        assert_eq!(positions, vec![vec![0, 1], vec![3], vec![4], vec![6]]);
    }

    /// L6 + L7: the object holds every entry of its messages; the reasons are counted.
    #[test]
    fn l6_l7_object_holds_every_entry_and_counts_reasons() {
        let mut first = message("a", "b1", at(10, 5));
        first
            .entries
            .push(entry(DeadLetterReason::TimeToLiveExceeded));
        let second = message("a", "b1", at(10, 6));
        let messages = vec![(0, first), (1, second)];
        let (object, records) = render_object_of(&messages).unwrap();
        assert_eq!(records, 3);
        let parsed: Vec<serde_json::Value> = serde_json::from_str(&object).unwrap();
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[1]["deadLetterReason"], "TimeToLiveExceeded");
        let counts = reason_counts(messages.iter().flat_map(|(_, m)| &m.entries));
        assert_eq!(counts.get("MaxDeliveryAttemptsExceeded"), Some(&2));
        assert_eq!(counts.get("TimeToLiveExceeded"), Some(&1));
    }

    /// L7: the system topic's own dead-letters are not announced.
    #[test]
    fn l7_system_topic_is_not_announced() {
        assert!(is_announced("orders", "gridrelay-dead-letter-events"));
        assert!(!is_announced(
            "gridrelay-dead-letter-events",
            "gridrelay-dead-letter-events"
        ));
    }

    /// L5: a failed write is tried again a minute later, stamped with its first failure; after
    /// four hours of failures the events are dropped and counted.
    #[test]
    fn l5_retries_for_four_hours_then_drops() {
        let scale = TimeScale::REAL;
        let AfterWriteFailure::TryAgain { message, delay } =
            after_write_failure(message("a", "b1", at(10, 0)), at(10, 1), scale)
        else {
            panic!("the first failure is tried again");
        };
        assert_eq!(delay, Duration::from_secs(60));
        assert_eq!(message.first_write_failure, Some(at(10, 1)));
        // A later failure keeps the first stamp.
        let AfterWriteFailure::TryAgain { message, .. } =
            after_write_failure(*message, at(14, 0), scale)
        else {
            panic!("3 h 59 min is within the limit");
        };
        assert_eq!(message.first_write_failure, Some(at(10, 1)));
        match after_write_failure(*message, at(14, 1), scale) {
            AfterWriteFailure::Drop { events } => assert_eq!(events, 1),
            other => panic!("four hours after the first failure the events drop: {other:?}"),
        }
    }

    /// L5 under a scaled clock: the limit and the wait shrink together.
    #[test]
    fn l5_limit_follows_the_time_scale() {
        let scale = TimeScale::new(0.001).unwrap();
        let mut m = message("a", "b1", at(10, 0));
        m.first_write_failure = Some(at(10, 0));
        let later = at(10, 0) + chrono::Duration::seconds(15);
        assert!(matches!(
            after_write_failure(m, later, scale),
            AfterWriteFailure::Drop { .. }
        ));
    }
}
