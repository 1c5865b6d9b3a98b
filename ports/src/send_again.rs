//! #36: a subscription's dropped events sent again from its topic's archive.
//!
//! An event given up with no dead-letter destination (L1), or whose dead-letter location was
//! unavailable (L5), is kept nowhere but in its topic's archive, where the topic keeps one
//! (`retentionDays` above 0). The journal says which events a subscription dropped
//! ([`dropped_events`](gridrelay_shared::journal::dropped_events)) and, where it read their
//! publish, when they were published; the archive has the events themselves. Each is found
//! there by its publish time (or the span its subscription's time to live allows) and its id as
//! the subscription receives it, turned into its schema and passed by its filter as a replay
//! turns it, and sent to that subscription alone, as new deliveries.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use gridrelay_shared::archive::windows_for_spans;
use gridrelay_shared::destination::RoutingFields;
use gridrelay_shared::journal::DroppedEvent;
use gridrelay_shared::message::QueuedEvent;
use gridrelay_shared::subscription::{Subscription, Topic};

use crate::fan_out::{FanOutError, replay_shares, send_again_to_subscription};
use crate::{ArchiveSource, MessageQueue, RecordStreamError};

/// Where an event sent again from the archive says it came from (the journal's `redrive`).
pub const FROM_ARCHIVE: &str = "the topic's archive";

/// What a send again from the archive did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SentFromArchive {
    /// The ids of the events sent again, in the order asked for.
    pub sent: Vec<String>,
    /// The ids not found in the archive (published before its retention or the topic's
    /// creation, or not archived: the portal's own test events are not), or no longer passed
    /// by the subscription's filter.
    pub not_found: Vec<String>,
}

/// Why nothing was sent.
#[derive(Debug, thiserror::Error)]
pub enum SendAgainError {
    /// The topic keeps no archive (`retentionDays` 0): its events are kept nowhere.
    #[error("topic {0} keeps no archive (its retentionDays is 0)")]
    NoArchive(String),
    #[error("the topic's archive could not be read: {0}")]
    Read(#[from] RecordStreamError),
    #[error(transparent)]
    Send(#[from] FanOutError),
}

/// Sends `dropped` (events `sub` dropped, each once) to `sub` again from `topic`'s archive.
pub async fn send_dropped_again(
    archive: &dyn ArchiveSource,
    queue: &dyn MessageQueue,
    (topic, sub): (&Topic, &Subscription),
    dropped: &[DroppedEvent],
    now: DateTime<Utc>,
) -> Result<SentFromArchive, SendAgainError> {
    if topic.retention_days == 0 {
        return Err(SendAgainError::NoArchive(topic.name.clone()));
    }
    let ttl = chrono::Duration::minutes(i64::from(sub.retry_policy.event_time_to_live_in_minutes));
    let spans: HashMap<&str, (DateTime<Utc>, DateTime<Utc>)> = dropped
        .iter()
        .map(|d| (d.id.as_str(), d.publish_span(ttl)))
        .collect();
    let windows = windows_for_spans(
        spans.values().copied(),
        now,
        topic.retention_days,
        topic.created_at,
    );
    // Each id's latest event published within its span, in the subscription's form.
    let mut found: HashMap<String, (DateTime<Utc>, QueuedEvent)> = HashMap::new();
    for window in &windows {
        let read = archive.read_window(&topic.name, window).await?;
        if read.skipped > 0 {
            tracing::warn!(topic = %topic.name, skipped = read.skipped,
                "lines of the topic's archive that are not archived events were skipped");
        }
        for archived in read.events {
            let maybe = spans
                .values()
                .any(|(from, to)| *from <= archived.time && archived.time <= *to);
            if !maybe {
                continue;
            }
            let one = std::slice::from_ref(&archived.event);
            let shares = replay_shares(std::slice::from_ref(sub), archived.schema, one, now);
            let Some(event) = shares
                .into_iter()
                .next()
                .and_then(|s| s.events.into_iter().next())
            else {
                continue;
            };
            let id = RoutingFields::of(&event.event, sub.event_delivery_schema).id;
            let within = spans
                .get(id.as_str())
                .is_some_and(|(from, to)| *from <= archived.time && archived.time <= *to);
            let later = found.get(&id).is_none_or(|(at, _)| *at <= archived.time);
            if within && later {
                found.insert(id, (archived.time, event));
            }
        }
    }
    let mut done = SentFromArchive::default();
    let mut events = Vec::new();
    let mut seen = HashSet::new();
    for d in dropped.iter().filter(|d| seen.insert(d.id.as_str())) {
        match found.remove(&d.id) {
            Some((_, event)) => {
                events.push(event);
                done.sent.push(d.id.clone());
            }
            None => done.not_found.push(d.id.clone()),
        }
    }
    if !events.is_empty() {
        send_again_to_subscription(queue, sub, events, FROM_ARCHIVE, now).await?;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::{Duration, TimeZone};
    use gridrelay_shared::archive::archive_lines;
    use gridrelay_shared::filter::EventFilter;
    use gridrelay_shared::message::DeliveryQueueMessage;
    use gridrelay_shared::schema::{DeliverySchema, InputSchema};
    use gridrelay_shared::subscription::SubscriptionRequest;
    use serde_json::value::RawValue;

    use super::*;
    use crate::RecordStream;
    use crate::memory::{ManualClock, MemoryJournal, MemoryQueue};

    fn at(minute: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 28, 10, 0, 0).unwrap() + Duration::minutes(minute)
    }

    fn event(id: &str, kind: &str) -> Box<RawValue> {
        RawValue::from_string(format!(
            r#"{{"id":"{id}","topic":"/topics/orders","eventType":"{kind}","subject":"s","eventTime":"2026-11-28T10:00:00Z","data":{{}},"dataVersion":"1"}}"#
        ))
        .unwrap()
    }

    fn topic(retention_days: u16) -> Topic {
        Topic {
            name: "orders".into(),
            key1: "k1".into(),
            key2: "k2".into(),
            input_schema: InputSchema::EventGridSchema,
            input_mapping: None,
            tags: Default::default(),
            retention_days,
            created_at: at(-600),
        }
    }

    fn dropped(
        id: &str,
        published: Option<DateTime<Utc>>,
        first_seen: DateTime<Utc>,
    ) -> DroppedEvent {
        DroppedEvent {
            id: id.into(),
            reason: "MaxDeliveryAttemptsExceeded".into(),
            dropped_at: first_seen + Duration::minutes(5),
            published,
            first_seen,
            last_status: Some(400),
        }
    }

    /// The delivery messages sent: each one's events' ids and where it says they came from.
    fn sent(queue: &MemoryQueue) -> Vec<(Vec<String>, Option<String>)> {
        queue
            .sent()
            .iter()
            .map(|m| match serde_json::from_str(&m.body).unwrap() {
                DeliveryQueueMessage::Delivery(d) => (
                    d.events
                        .iter()
                        .map(|e| RoutingFields::of(&e.event, d.schema).id)
                        .collect(),
                    d.redriven_from.clone(),
                ),
                other => panic!("not a delivery: {other:?}"),
            })
            .collect()
    }

    /// #36, L1: dropped events are found in the archive by publish time and id and sent to
    /// their subscription alone, in its schema, as from the archive; one published at another
    /// time under the same id, one the filter no longer passes, and one not archived are not.
    #[test]
    fn dropped_events_are_sent_again_from_the_archive_l1() {
        futures::executor::block_on(sends_dropped_events_again());
    }

    async fn sends_dropped_events_again() {
        let archive = MemoryJournal::default();
        let write = |time, events: &[Box<RawValue>]| {
            let lines = archive_lines("orders", InputSchema::EventGridSchema, time, events);
            let archive = &archive;
            async move { archive.put_records(&lines).await }
        };
        write(
            at(0),
            &[event("a", "Order.Created"), event("b", "Order.Paid")],
        )
        .await
        .unwrap();
        // "a" again, published later: not the one dropped.
        let later = event("a", "Order.Created")
            .get()
            .replace(r#""s""#, r#""later""#);
        let later = RawValue::from_string(later).unwrap();
        write(at(3), &[later]).await.unwrap();
        write(
            at(20),
            &[event("c", "Order.Created"), event("x", "Order.Created")],
        )
        .await
        .unwrap();
        write(at(0), &[event("a", "Order.Created")]).await.unwrap();
        archive
            .put_records(&archive_lines(
                "other",
                InputSchema::EventGridSchema,
                at(0),
                &[event("d", "Order.Created")],
            ))
            .await
            .unwrap();
        let mut sub = SubscriptionRequest {
            topic: "orders".into(),
            name: "billing".into(),
            endpoint: "https://example.com/hook".into(),
            ..SubscriptionRequest::default()
        }
        .validate(Default::default(), at(-60))
        .unwrap();
        sub.event_delivery_schema = DeliverySchema::CloudEventSchemaV1_0;
        sub.filter = EventFilter {
            included_event_types: Some(vec!["Order.Created".into()]),
            ..EventFilter::default()
        };
        let queue = MemoryQueue::new(Arc::new(ManualClock::new(at(30))));
        let picks = [
            dropped("a", Some(at(0)), at(0)),
            // Its publish not read: found within its time to live before its first entry.
            dropped("c", None, at(25)),
            // Paid: the filter no longer takes it.
            dropped("b", Some(at(0)), at(0)),
            // Another topic's, and a test event (never archived).
            dropped("d", Some(at(0)), at(0)),
            dropped("t", Some(at(10)), at(10)),
        ];
        let done = send_dropped_again(&archive, &queue, (&topic(1), &sub), &picks, at(30))
            .await
            .unwrap();
        assert_eq!(done.sent, vec!["a", "c"]);
        assert_eq!(done.not_found, vec!["b", "d", "t"]);
        assert_eq!(
            sent(&queue),
            vec![(
                vec!["a".to_string(), "c".to_string()],
                Some(FROM_ARCHIVE.to_string())
            )]
        );
        let body = &queue.sent()[0].body;
        assert!(
            body.contains("specversion"),
            "in the subscription's schema: {body}"
        );
        assert!(
            !body.contains("later"),
            "the copy published when it was: {body}"
        );

        let none = send_dropped_again(&archive, &queue, (&topic(0), &sub), &picks, at(30)).await;
        assert!(
            matches!(none, Err(SendAgainError::NoArchive(_))),
            "{none:?}"
        );
        // Past the retention: nothing found, nothing sent.
        let late = at(30) + Duration::days(2);
        let done = send_dropped_again(&archive, &queue, (&topic(1), &sub), &picks[..1], late)
            .await
            .unwrap();
        assert_eq!((done.sent.len(), done.not_found.len()), (0, 1));
        assert_eq!(queue.sent().len(), 1);
    }
}
