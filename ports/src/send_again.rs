//! #36: a subscription's dropped events sent again from its topic's archive.
//!
//! An event given up with no dead-letter destination (L1), or whose dead-letter location was
//! unavailable (L5), is kept nowhere but in its topic's archive, where the topic keeps one
//! (`retentionDays` above 0). The journal says which events a subscription dropped
//! ([`dropped_events`](gridrelay_shared::journal::dropped_events)) and when each was
//! published; the archive has the events themselves. Each is found there at its publish time
//! (the hours around it only, at most [`MAX_ARCHIVE_HOURS`] of them per send) by its id as
//! the subscription receives it, turned into its schema and passed by its filter as a replay
//! turns it, claimed for [`SEND_AGAIN_HOLD`](gridrelay_shared::portal::SEND_AGAIN_HOLD) (so sending it again once more before the journal
//! shows its new delivery finds it taken), and sent to that subscription alone, as a new
//! delivery.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use gridrelay_shared::archive::{TimeWindow, windows_for_spans};
use gridrelay_shared::destination::RoutingFields;
use gridrelay_shared::journal::{DroppedEvent, hours_between};
use gridrelay_shared::message::QueuedEvent;
use gridrelay_shared::portal::send_again_claim;
use gridrelay_shared::subscription::{Subscription, Topic};

use crate::fan_out::{FanOutError, replay_shares, send_again_to_subscription};
use crate::{ArchiveSource, DeliveryStateStore, MessageQueue, RecordStreamError, StoreError};

/// Where an event sent again from the archive says it came from (the journal's `redrive`).
pub const FROM_ARCHIVE: &str = "the topic's archive";

/// The most hours of the archive one send again reads (each hour's objects hold every topic's
/// events): picks published in more hours than this are left for another send.
pub const MAX_ARCHIVE_HOURS: usize = 24;

/// What a send again from the archive did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SentFromArchive {
    /// The ids of the events sent again, in the order asked for.
    pub sent: Vec<String>,
    /// Sent again in the last [`SEND_AGAIN_HOLD`](gridrelay_shared::portal::SEND_AGAIN_HOLD) already: not sent twice.
    pub held: Vec<String>,
    /// Not found in the archive: published before the subscription, the topic's creation or
    /// its retention, not archived (the portal's own test events are not), no longer passed by
    /// the subscription's filter, or their publish time not known (not in the journal read).
    pub not_found: Vec<String>,
    /// Published in hours past the [`MAX_ARCHIVE_HOURS`] read: pick fewer at once.
    pub not_read: Vec<String>,
}

/// Why nothing was sent.
#[derive(Debug, thiserror::Error)]
pub enum SendAgainError {
    /// The topic keeps no archive (`retentionDays` 0): its events are kept nowhere.
    #[error("topic {0} keeps no archive (its retentionDays is 0)")]
    NoArchive(String),
    #[error("the topic's archive could not be read: {0}")]
    Read(#[from] RecordStreamError),
    #[error("a send again could not be claimed: {0}")]
    Claim(#[from] StoreError),
    #[error(transparent)]
    Send(#[from] FanOutError),
}

/// Where a send again reads, claims and sends.
pub struct SendAgainPorts<'a> {
    pub archive: &'a dyn ArchiveSource,
    pub claims: &'a dyn DeliveryStateStore,
    pub queue: &'a dyn MessageQueue,
}

/// Sends `dropped` (events `sub` dropped) to `sub` again from `topic`'s archive.
pub async fn send_dropped_again(
    ports: &SendAgainPorts<'_>,
    (topic, sub): (&Topic, &Subscription),
    dropped: &[DroppedEvent],
    now: DateTime<Utc>,
) -> Result<SentFromArchive, SendAgainError> {
    if topic.retention_days == 0 {
        return Err(SendAgainError::NoArchive(topic.name.clone()));
    }
    let mut done = SentFromArchive::default();
    let mut seen = HashSet::new();
    let picked: Vec<&DroppedEvent> = dropped.iter().filter(|d| seen.insert(&d.id)).collect();
    // Each id's publish time: the archive is read at those instants only.
    let published: HashMap<&str, DateTime<Utc>> = picked
        .iter()
        .filter_map(|d| Some((d.id.as_str(), d.published?)))
        .collect();
    // The publish times whose hours fit the budget, earliest first; the rest are left.
    let mut times: Vec<DateTime<Utc>> = published.values().copied().collect();
    times.sort();
    times.dedup();
    let mut hours = HashSet::new();
    let mut unread = HashSet::new();
    let admitted: Vec<DateTime<Utc>> = times
        .into_iter()
        .filter(|at| {
            let window = TimeWindow::new(*at, *at + chrono::Duration::milliseconds(1), "at");
            let needed = window
                .map(|w| {
                    let (first, last) = w.hours();
                    hours_between(first, last)
                })
                .unwrap_or_default();
            let more = needed.iter().filter(|h| !hours.contains(*h)).count();
            if hours.len() + more > MAX_ARCHIVE_HOURS {
                unread.insert(*at);
                return false;
            }
            hours.extend(needed);
            true
        })
        .collect();
    // Who dropped what is the journal's to say (the caller's picks); the archive is read from
    // the topic's creation on.
    let windows = windows_for_spans(
        admitted.iter().map(|at| (*at, *at)),
        now,
        topic.retention_days,
        topic.created_at,
    );
    let mut found: HashMap<String, QueuedEvent> = HashMap::new();
    for window in &windows {
        let read = ports.archive.read_window(&topic.name, window).await?;
        if read.skipped > 0 {
            tracing::warn!(topic = %topic.name, skipped = read.skipped,
                "lines of the topic's archive that are not archived events were skipped");
        }
        for archived in read.events {
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
            if published.get(id.as_str()) == Some(&archived.time) {
                found.insert(id, event);
            }
        }
    }
    let token = uuid::Uuid::new_v4().to_string();
    let mut events = Vec::new();
    for d in picked {
        let Some(event) = found.remove(&d.id) else {
            let left = d.published.is_some_and(|at| unread.contains(&at));
            match left {
                true => done.not_read.push(d.id.clone()),
                false => done.not_found.push(d.id.clone()),
            }
            continue;
        };
        let (key, until) = send_again_claim(&sub.id, &d.id, now);
        if ports.claims.claim(&key, &token, now, until).await? {
            events.push(event);
            done.sent.push(d.id.clone());
        } else {
            done.held.push(d.id.clone());
        }
    }
    if !events.is_empty() {
        send_again_to_subscription(ports.queue, sub, events, FROM_ARCHIVE, now).await?;
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
    use crate::memory::{ManualClock, MemoryDeliveryStateStore, MemoryJournal, MemoryQueue};

    fn at(minute: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 28, 10, 0, 0).unwrap() + Duration::minutes(minute)
    }

    fn event(id: &str, kind: &str) -> Box<RawValue> {
        RawValue::from_string(format!(
            r#"{{"id":"{id}","topic":"/topics/orders","eventType":"{kind}","subject":"s","eventTime":"2026-11-28T10:00:00Z","data":{{}},"dataVersion":"1"}}"#
        ))
        .unwrap()
    }

    /// Subscription billing of topic orders, made an hour before the events.
    fn billing() -> Subscription {
        SubscriptionRequest {
            topic: "orders".into(),
            name: "billing".into(),
            endpoint: "https://example.com/hook".into(),
            ..SubscriptionRequest::default()
        }
        .validate(Default::default(), at(-60))
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
            dedup_window_seconds: 0,
            created_at: at(-600),
        }
    }

    fn dropped(id: &str, published: Option<DateTime<Utc>>) -> DroppedEvent {
        let first_seen = published.unwrap_or(at(25));
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
        let mut sub = billing();
        sub.event_delivery_schema = DeliverySchema::CloudEventSchemaV1_0;
        sub.filter = EventFilter {
            included_event_types: Some(vec!["Order.Created".into()]),
            ..EventFilter::default()
        };
        let queue = MemoryQueue::new(Arc::new(ManualClock::new(at(30))));
        let claims = MemoryDeliveryStateStore::default();
        let ports = SendAgainPorts {
            archive: &archive,
            claims: &claims,
            queue: &queue,
        };
        let picks = [
            dropped("a", Some(at(0))),
            dropped("c", Some(at(20))),
            // Its publish not in the journal read: not looked for.
            dropped("x", None),
            // Paid: the filter no longer takes it.
            dropped("b", Some(at(0))),
            // Another topic's, and a test event (never archived).
            dropped("d", Some(at(0))),
            dropped("t", Some(at(10))),
        ];
        let done = send_dropped_again(&ports, (&topic(1), &sub), &picks, at(30))
            .await
            .unwrap();
        assert_eq!(done.sent, vec!["a", "c"]);
        assert_eq!(done.not_found, vec!["x", "b", "d", "t"]);
        assert!(done.held.is_empty() && done.not_read.is_empty(), "{done:?}");
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

        // Asked again before the journal shows the new delivery: held, not sent twice.
        let again = send_dropped_again(&ports, (&topic(1), &sub), &picks[..2], at(31))
            .await
            .unwrap();
        assert_eq!(again.held, vec!["a", "c"]);
        assert!(again.sent.is_empty(), "{again:?}");
        assert_eq!(queue.sent().len(), 1);
        // Once the hold ends (dropped again, say), it is sent again.
        let later = at(30) + gridrelay_shared::portal::SEND_AGAIN_HOLD;
        let after = send_dropped_again(&ports, (&topic(1), &sub), &picks[..1], later)
            .await
            .unwrap();
        assert_eq!(after.sent, vec!["a"]);
        assert_eq!(queue.sent().len(), 2);

        let none = send_dropped_again(&ports, (&topic(0), &sub), &picks, at(30)).await;
        assert!(
            matches!(none, Err(SendAgainError::NoArchive(_))),
            "{none:?}"
        );
        // Past the retention: nothing found.
        let late = at(30) + Duration::days(2);
        let done = send_dropped_again(&ports, (&topic(1), &sub), &picks[..1], late)
            .await
            .unwrap();
        assert_eq!(done.not_found, vec!["a"]);
        assert_eq!(queue.sent().len(), 2);
    }

    /// #36: picks published in more hours of the archive than one send reads are left and
    /// named, not read.
    #[test]
    fn a_send_again_reads_at_most_its_hours_of_the_archive() {
        futures::executor::block_on(async {
            let archive = MemoryJournal::default();
            let hour = |h: i64| at(60 * h);
            let ids: Vec<String> = (0..16).map(|i| format!("e{i}")).collect();
            for (i, id) in ids.iter().enumerate() {
                let lines = archive_lines(
                    "orders",
                    InputSchema::EventGridSchema,
                    hour(2 * i as i64),
                    &[event(id, "Order.Created")],
                );
                archive.put_records(&lines).await.unwrap();
            }
            let sub = billing();
            let now = hour(40);
            let queue = MemoryQueue::new(Arc::new(ManualClock::new(now)));
            let claims = MemoryDeliveryStateStore::default();
            let ports = SendAgainPorts {
                archive: &archive,
                claims: &claims,
                queue: &queue,
            };
            let picks: Vec<DroppedEvent> = ids
                .iter()
                .enumerate()
                .map(|(i, id)| dropped(id, Some(hour(2 * i as i64))))
                .collect();
            let done = send_dropped_again(&ports, (&topic(3), &sub), &picks, now)
                .await
                .unwrap();
            // Each is read in two hours of its own (its object can be named 15 minutes
            // earlier): 12 fit in 24.
            assert_eq!(done.sent, ids[..12].to_vec());
            assert_eq!(done.not_read, ids[12..].to_vec());
            // Hourly, each shares an hour with the one before: 23 fit, however the windows
            // merge.
            let hourly: Vec<DroppedEvent> = (0..31)
                .map(|h| dropped(&format!("h{h}"), Some(hour(h))))
                .collect();
            let done = send_dropped_again(&ports, (&topic(3), &sub), &hourly, now)
                .await
                .unwrap();
            assert_eq!(done.sent.len() + done.not_found.len(), 23, "{done:?}");
            assert_eq!(done.not_read.len(), 8, "{done:?}");
        });
    }
}
