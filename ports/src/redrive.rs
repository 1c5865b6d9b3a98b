//! `gridrelay redrive`: what was parked or given up goes back into delivery, on an operator's
//! word.
//!
//! Two places hold such events. A *redrive queue* is where SQS parks a message whose record kept
//! failing (a store that was down for long, a body no version can read): [`redrive_queue`] moves
//! the messages it can read back to the queue they came from, and leaves the others (and says
//! so). *Dead-letter objects* hold the events delivery gave up on (L2): [`redrive_dead_letters`]
//! reads a topic's (or one subscription's) objects, picks records by time and reason, and
//! enqueues their events for delivery again as new deliveries of the subscription as it is now
//! (attempts and TTL start again); an object whose records all moved is deleted, one with
//! records left is written again with those. Both have a dry run that reads and reports what
//! would move, and changes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;

use crate::fan_out::new_deliveries;
use crate::{
    MessageQueue, ObjectStore, ObjectStoreError, OutgoingMessage, QueueError, ReceivedMessage,
    StoreError, SubscriptionStore,
};
use gridrelay_shared::dead_letter::{
    FieldNaming, ReadBack, object_hour, object_is_for, read_record, render_object,
    subscription_folder,
};
use gridrelay_shared::message::{
    DeadLetterMessage, DeliveryHistory, DeliveryQueueMessage, Lane, QueuedEvent,
};
use gridrelay_shared::subscription::Subscription;

/// How long a message read by a redrive stays hidden while it runs; those it does not move are
/// made visible again when it ends.
const SCAN_VISIBILITY: Duration = Duration::from_secs(120);

/// Why a redrive stopped.
#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Objects(#[from] ObjectStoreError),
    #[error("{0}")]
    NotFound(String),
}

/// Messages and events, per `topic/subscription`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    pub messages: usize,
    pub events: usize,
}

/// What a queue redrive moved (or, in a dry run, would move).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueRedriveReport {
    pub dry_run: bool,
    /// Per `topic/subscription` (handshake steps under `topic/subscription (validation)`).
    pub moved: BTreeMap<String, Moved>,
    /// Bodies that are not messages of the queue's kind: left where they are.
    pub unreadable: usize,
    /// Messages gridrelay did not write (no valid seal, #34 item 2): never moved, left where
    /// they are.
    pub unsealed: usize,
}

impl QueueRedriveReport {
    pub fn messages(&self) -> usize {
        self.moved.values().map(|m| m.messages).sum()
    }

    fn count(&mut self, (whose, events): (String, usize)) {
        let moved = self.moved.entry(whose).or_default();
        moved.messages += 1;
        moved.events += events;
    }
}

/// Which queue's messages a redrive queue holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueKind {
    Delivery,
    DeadLetter,
}

/// The queues a redrive queue's messages go back to, by the lane each travels on: the
/// delivery queue's redrive queue also holds the control and replay queues' poison messages.
/// A dead-letter redrive queue's all go to `delivery` (the dead-letter queue, given there).
#[derive(Clone, Copy)]
pub struct RedriveTargets<'a> {
    pub delivery: &'a dyn MessageQueue,
    pub control: &'a dyn MessageQueue,
    pub replay: &'a dyn MessageQueue,
}

impl<'a> RedriveTargets<'a> {
    /// Every message back to `queue`.
    pub fn one(queue: &'a dyn MessageQueue) -> Self {
        Self {
            delivery: queue,
            control: queue,
            replay: queue,
        }
    }

    fn of(&self, lane: Lane) -> &'a dyn MessageQueue {
        match lane {
            Lane::Delivery => self.delivery,
            Lane::Control => self.control,
            Lane::Replay => self.replay,
        }
    }
}

/// What one message of `kind` is for (whose, how many events), and the lane it goes back to
/// (a subscription's handshake or expiry step or a replay's step: control; a replay's
/// delivery: replay); `None` for a body that is not one.
fn describe(kind: QueueKind, body: &str) -> Option<((String, usize), Lane)> {
    match kind {
        QueueKind::Delivery => {
            let message = DeliveryQueueMessage::from_body(body).ok()?;
            let whose = match &message {
                DeliveryQueueMessage::Delivery(m) => {
                    let replay = m
                        .replay
                        .as_ref()
                        .map(|r| format!(" (replay {})", r.name))
                        .unwrap_or_default();
                    (
                        format!("{}/{}{replay}", m.topic, m.subscription),
                        m.events.len(),
                    )
                }
                DeliveryQueueMessage::Validation(t) => {
                    (format!("{}/{} (validation)", t.topic, t.subscription), 0)
                }
                DeliveryQueueMessage::Replay(step) => {
                    (format!("{} (replay {})", step.topic, step.name), 0)
                }
            };
            Some((whose, message.lane()))
        }
        QueueKind::DeadLetter => DeadLetterMessage::from_body(body).ok().map(|m| {
            (
                (format!("{}/{}", m.topic, m.subscription), m.entries.len()),
                Lane::Delivery,
            )
        }),
    }
}

/// Moves up to `max_messages` messages of `kind` from a redrive queue back to the queue each
/// came from (`to`, by its lane); bodies of another kind, or none, stay.
pub async fn redrive_queue(
    from: &dyn MessageQueue,
    to: RedriveTargets<'_>,
    kind: QueueKind,
    dry_run: bool,
    max_messages: usize,
) -> Result<QueueRedriveReport, RedriveError> {
    let mut report = QueueRedriveReport {
        dry_run,
        ..QueueRedriveReport::default()
    };
    let mut left = Vec::new();
    let mut seen = 0;
    let result = async {
        while seen < max_messages {
            let batch = from
                .receive_batch((max_messages - seen).min(10), SCAN_VISIBILITY)
                .await?;
            if batch.is_empty() {
                break;
            }
            seen += batch.len();
            let mut movable = Vec::new();
            for message in batch {
                if !message.sealed {
                    report.unsealed += 1;
                    left.push(message.receipt_handle);
                    continue;
                }
                match describe(kind, &message.body) {
                    Some((about, lane)) if !dry_run => movable.push((about, lane, message)),
                    Some((about, _)) => {
                        report.count(about);
                        left.push(message.receipt_handle);
                    }
                    None => {
                        report.unreadable += 1;
                        left.push(message.receipt_handle);
                    }
                }
            }
            // One send for the batch (SQS: one SendMessageBatch) to each queue, then each
            // accepted message is deleted from the redrive queue.
            let lanes = [Lane::Delivery, Lane::Control, Lane::Replay];
            let by_lane: Vec<Vec<_>> = lanes
                .iter()
                .map(|lane| movable.iter().filter(|(_, l, _)| l == lane).collect())
                .collect();
            let sent = futures::future::join_all(
                lanes
                    .iter()
                    .zip(&by_lane)
                    .map(|(&lane, messages)| send_back(to.of(lane), messages)),
            )
            .await;
            let moved = by_lane
                .into_iter()
                .zip(sent)
                .flat_map(|(m, s)| m.into_iter().zip(s));
            let mut refused = None;
            for ((about, _, message), result) in moved {
                match result {
                    Ok(()) => {
                        from.delete_received(&message.receipt_handle).await?;
                        report.count(about.clone());
                    }
                    Err(e) => {
                        left.push(message.receipt_handle.clone());
                        refused.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = refused {
                return Err(RedriveError::Queue(e));
            }
        }
        Ok::<(), RedriveError>(())
    }
    .await;
    // What was read but not moved is visible again at once.
    for receipt in left {
        from.retry_after(&receipt, Duration::ZERO).await?;
    }
    result.map(|()| report)
}

/// Sends the bodies of `messages` to `queue` as they are, due at once.
async fn send_back<T>(
    queue: &dyn MessageQueue,
    messages: &[&(T, Lane, ReceivedMessage)],
) -> Vec<Result<(), QueueError>> {
    if messages.is_empty() {
        return Vec::new();
    }
    let outgoing: Vec<OutgoingMessage> = messages
        .iter()
        .map(|(_, _, m)| OutgoingMessage {
            body: m.body.clone(),
            delay: Duration::ZERO,
            group: None,
        })
        .collect();
    queue.send_all(&outgoing).await
}

/// Which dead-lettered events to redrive.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterSelection {
    pub topic: String,
    /// One subscription; `None`: every subscription of the topic.
    pub subscription: Option<String>,
    /// Objects of hours that end after this.
    pub since: Option<DateTime<Utc>>,
    /// Objects of hours that begin before this.
    pub until: Option<DateTime<Utc>>,
    /// `deadLetterReason`s to take; empty: every reason.
    pub reasons: Vec<String>,
    /// Only the events with these ids; empty: every event.
    pub ids: Vec<String>,
    /// Only these records, each named by its object (`s3://bucket/key`) and its event's id
    /// (#36: the rows picked in the console, which a record of the same id written elsewhere
    /// since is not); empty: every record.
    pub records: Vec<(String, String)>,
}

/// One dead-lettered event a redrive moves (in a dry run: would move).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetteredEvent {
    /// Its `id`, where it has one.
    pub id: Option<String>,
    /// Its `deadLetterReason`.
    pub reason: String,
    /// The object it is in, `s3://bucket/key`.
    pub location: String,
}

/// What a dead-letter redrive did for one subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriptionRedrive {
    pub subscription: String,
    /// Why nothing was read for it, if so.
    pub skipped: Option<String>,
    pub objects_read: usize,
    pub objects_deleted: usize,
    pub objects_rewritten: usize,
    /// Events moved (in a dry run: that would move), per reason.
    pub moved: BTreeMap<String, usize>,
    /// The events moved (in a dry run: that would move), each.
    pub events: Vec<DeadLetteredEvent>,
    /// Records left in their objects: another reason, or unreadable.
    pub left: usize,
    /// Objects in the folder written for another subscription of the same name (or before
    /// subscriptions had ids): never redriven to this one.
    pub objects_of_other_subscriptions: usize,
}

/// What a dead-letter redrive did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterRedriveReport {
    pub dry_run: bool,
    pub subscriptions: Vec<SubscriptionRedrive>,
}

impl DeadLetterRedriveReport {
    pub fn events(&self) -> usize {
        self.subscriptions
            .iter()
            .flat_map(|s| s.moved.values())
            .sum()
    }
}

/// Redrives the selected dead-lettered events of a topic's subscriptions into `delivery_queue`.
pub async fn redrive_dead_letters(
    store: &dyn SubscriptionStore,
    objects: &dyn ObjectStore,
    delivery_queue: &dyn MessageQueue,
    selection: &DeadLetterSelection,
    dry_run: bool,
    now: DateTime<Utc>,
) -> Result<DeadLetterRedriveReport, RedriveError> {
    let subscriptions: Vec<Subscription> = store
        .list_subscriptions(&selection.topic)
        .await?
        .into_iter()
        .filter(|s| selection.subscription.as_ref().is_none_or(|n| *n == s.name))
        .collect();
    if subscriptions.is_empty() {
        return Err(RedriveError::NotFound(match &selection.subscription {
            Some(name) => format!(
                "event subscription {name} on topic {} does not exist",
                selection.topic
            ),
            None => format!("topic {} has no event subscriptions", selection.topic),
        }));
    }
    let mut report = DeadLetterRedriveReport {
        dry_run,
        subscriptions: Vec::new(),
    };
    for sub in &subscriptions {
        let done =
            redrive_subscription(objects, delivery_queue, sub, selection, dry_run, now).await?;
        report.subscriptions.push(done);
    }
    Ok(report)
}

/// [`redrive_dead_letters`] of one subscription, read already: what the subscribers' portal
/// sends again (#36), with nothing of the topic's other subscriptions listed or read.
pub async fn redrive_subscription(
    objects: &dyn ObjectStore,
    delivery_queue: &dyn MessageQueue,
    sub: &Subscription,
    selection: &DeadLetterSelection,
    dry_run: bool,
    now: DateTime<Utc>,
) -> Result<SubscriptionRedrive, RedriveError> {
    let mut done = SubscriptionRedrive {
        subscription: sub.name.clone(),
        ..SubscriptionRedrive::default()
    };
    let Some(destination) = &sub.dead_letter_destination else {
        done.skipped = Some("it has no dead-letter destination".into());
        return Ok(done);
    };
    if !sub.delivers() {
        done.skipped = Some(format!(
            "it is {:?}, not Succeeded: events sent to it now would be dropped",
            sub.provisioning.state
        ));
        return Ok(done);
    }
    let folder = subscription_folder(destination, &sub.topic, &sub.name);
    let naming = FieldNaming::for_schema(sub.event_delivery_schema);
    let keys = match objects.list(&destination.bucket, &folder).await {
        Ok(keys) => keys,
        // One subscription's deleted bucket does not stop the others' redrive.
        Err(e) if e.bucket_missing => {
            done.skipped = Some(format!(
                "its dead-letter bucket {} no longer exists",
                destination.bucket
            ));
            return Ok(done);
        }
        Err(e) => return Err(e.into()),
    };
    for key in keys {
        let Some(hour) = object_hour(&folder, &key) else {
            continue;
        };
        // Objects of an earlier subscription of the same name (or from before ids) are not
        // this one's: its endpoint, filter and schema may differ.
        if !object_is_for(&key, &sub.id) {
            done.objects_of_other_subscriptions += 1;
            continue;
        }
        let hour_end = hour + chrono::Duration::hours(1);
        if selection.since.is_some_and(|t| hour_end <= t)
            || selection.until.is_some_and(|t| hour >= t)
        {
            continue;
        }
        let body = objects.get(&destination.bucket, &key).await?;
        done.objects_read += 1;
        let Ok(records) = serde_json::from_str::<Vec<Box<RawValue>>>(&body) else {
            done.left += 1;
            continue;
        };
        let from = format!("s3://{}/{key}", destination.bucket);
        let mut moving = Vec::new();
        let mut keep = Vec::new();
        for record in records {
            match read_record(&record, naming) {
                Ok(back) if selection.takes(&back, &from) => {
                    *done.moved.entry(back.reason.clone()).or_default() += 1;
                    done.events.push(DeadLetteredEvent {
                        id: event_id(&back.event),
                        reason: back.reason,
                        location: from.clone(),
                    });
                    moving.push(QueuedEvent::new(now, back.event));
                }
                _ => keep.push(record),
            }
        }
        done.left += keep.len();
        if dry_run || moving.is_empty() {
            continue;
        }
        enqueue(delivery_queue, sub, &from, moving, now).await?;
        if keep.is_empty() {
            objects.delete(&destination.bucket, &key).await?;
            done.objects_deleted += 1;
        } else {
            objects
                .put_json(&destination.bucket, &key, render_object(&keep))
                .await?;
            done.objects_rewritten += 1;
        }
    }
    Ok(done)
}

impl DeadLetterSelection {
    /// Whether a record read back from object `from` is selected: its reason, its id where
    /// ids are given, and its object and id where records are.
    fn takes(&self, back: &ReadBack, from: &str) -> bool {
        let reason = self.reasons.is_empty()
            || self
                .reasons
                .iter()
                .any(|r| r.eq_ignore_ascii_case(&back.reason));
        let id = event_id(&back.event);
        let by_id = self.ids.is_empty() || id.as_ref().is_some_and(|id| self.ids.contains(id));
        let by_record = self.records.is_empty()
            || id.is_some_and(|id| self.records.iter().any(|(o, i)| o == from && *i == id));
        reason && by_id && by_record
    }
}

/// An event's `id` (Event Grid's and CloudEvents' field), where it is a string.
fn event_id(event: &RawValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Id {
        id: Option<String>,
    }
    serde_json::from_str::<Id>(event.get())
        .ok()
        .and_then(|e| e.id)
}

/// Enqueues events as new deliveries of `sub` (attempts and TTL start again).
async fn enqueue(
    queue: &dyn MessageQueue,
    sub: &Subscription,
    from: &str,
    events: Vec<QueuedEvent>,
    now: DateTime<Utc>,
) -> Result<(), RedriveError> {
    // New deliveries, whose first attempt journals where they came back from (#35).
    let history = DeliveryHistory {
        redriven_from: Some(from.to_string()),
        redriven_at: Some(now),
        ..DeliveryHistory::new(sub)
    };
    let outgoing = new_deliveries(&history, now, events)
        .map_err(|e| QueueError(format!("could not encode a delivery message: {e}")))?;
    for result in queue.send_all(&outgoing).await {
        result?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{ManualClock, MemoryObjectStore, MemoryQueue, MemorySubscriptionStore};
    use gridrelay_shared::classify::DeliveryOutcome;
    use gridrelay_shared::dead_letter::{object_key, render_record};
    use gridrelay_shared::decision::DeadLetterReason;
    use gridrelay_shared::message::{DeadLetterEntry, DeliveryHistory, DeliveryMessage};
    use gridrelay_shared::schema::InputSchema;
    use gridrelay_shared::subscription::SubscriptionRequest;
    use std::sync::Arc;

    fn at(hour: u32) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(&format!("2026-11-23T{hour:02}:30:00Z"))
            .unwrap()
            .to_utc()
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        futures::executor::block_on(f)
    }

    struct World {
        store: MemorySubscriptionStore,
        objects: MemoryObjectStore,
        queue: MemoryQueue,
        sub: Subscription,
    }

    /// A subscription with dead-letter objects at 10:00 (records a: attempts exhausted, b: TTL)
    /// and at 12:00 (c: attempts exhausted).
    fn world() -> World {
        let store = MemorySubscriptionStore::default();
        let sub = store.insert_validated(
            SubscriptionRequest {
                topic: "orders".into(),
                name: "audit".into(),
                endpoint: "https://example.com/hook".into(),
                dead_letter_destination: Some("s3://dead/dl".into()),
                ..SubscriptionRequest::default()
            },
            InputSchema::EventGridSchema,
            at(9),
        );
        let objects = MemoryObjectStore::default();
        let record = |id: &str, reason| {
            render_record(
                &DeadLetterEntry {
                    reason,
                    delivery_attempts: 30,
                    last_outcome: Some(DeliveryOutcome::Busy),
                    publish_time: at(8),
                    last_attempt_time: Some(at(9)),
                    event: RawValue::from_string(format!(
                        r#"{{"id":"{id}","data":{{"n":12345678901234567890}}}}"#
                    ))
                    .unwrap(),
                },
                FieldNaming::EventGrid,
            )
            .unwrap()
        };
        let destination = sub.dead_letter_destination.clone().unwrap();
        for (hour, records) in [
            (
                10,
                vec![
                    record("a", DeadLetterReason::MaxDeliveryAttemptsExceeded),
                    record("b", DeadLetterReason::TimeToLiveExceeded),
                ],
            ),
            (
                12,
                vec![record("c", DeadLetterReason::MaxDeliveryAttemptsExceeded)],
            ),
        ] {
            let key = object_key(
                &destination,
                "orders",
                "audit",
                at(hour),
                &gridrelay_shared::dead_letter::object_name(&sub.id, "x"),
            );
            block_on(objects.put_json("dead", &key, render_object(&records))).unwrap();
        }
        // Written for an earlier subscription of the same name.
        let foreign = object_key(
            &destination,
            "orders",
            "audit",
            at(10),
            &gridrelay_shared::dead_letter::object_name("0e1d", "y"),
        );
        let old_record = record("z", DeadLetterReason::MaxDeliveryAttemptsExceeded);
        block_on(objects.put_json("dead", &foreign, render_object(&[old_record]))).unwrap();
        let queue = MemoryQueue::new(Arc::new(ManualClock::new(at(13))));
        World {
            store,
            objects,
            queue,
            sub,
        }
    }

    fn redrive(
        w: &World,
        selection: DeadLetterSelection,
        dry_run: bool,
    ) -> DeadLetterRedriveReport {
        block_on(redrive_dead_letters(
            &w.store,
            &w.objects,
            &w.queue,
            &DeadLetterSelection {
                topic: "orders".into(),
                ..selection
            },
            dry_run,
            at(13),
        ))
        .unwrap()
    }

    fn queued_ids(w: &World) -> Vec<String> {
        w.queue
            .sent()
            .iter()
            .flat_map(
                |m| match DeliveryQueueMessage::from_body(&m.body).unwrap() {
                    DeliveryQueueMessage::Delivery(d) => {
                        assert_eq!(d.subscription_id, w.sub.id);
                        assert_eq!((d.attempts, d.not_before), (0, at(13)));
                        // #35: its first attempt journals the object it came back from.
                        let hour = if d.events[0].event.get().contains(r#""id":"c""#) {
                            12
                        } else {
                            10
                        };
                        let object = object_key(
                            &w.sub.dead_letter_destination.clone().unwrap(),
                            "orders",
                            "audit",
                            at(hour),
                            &gridrelay_shared::dead_letter::object_name(&w.sub.id, "x"),
                        );
                        assert_eq!(
                            d.redriven_from.as_deref(),
                            Some(format!("s3://dead/{object}").as_str())
                        );
                        d.events
                            .iter()
                            .map(|e| {
                                assert_eq!(e.publish_time, at(13), "the TTL starts again");
                                let v: serde_json::Value =
                                    serde_json::from_str(e.event.get()).unwrap();
                                assert!(v.get("deadLetterReason").is_none());
                                assert!(e.event.get().contains("12345678901234567890"));
                                v["id"].as_str().unwrap().to_string()
                            })
                            .collect::<Vec<_>>()
                    }
                    other => panic!("{other:?}"),
                },
            )
            .collect()
    }

    /// A dry run reads and reports what would move, and changes nothing.
    #[test]
    fn a_dry_run_moves_nothing() {
        let w = world();
        let before = w.objects.objects();
        let report = redrive(
            &w,
            DeadLetterSelection {
                reasons: vec!["MaxDeliveryAttemptsExceeded".into()],
                ..DeadLetterSelection::default()
            },
            true,
        );
        let sub = &report.subscriptions[0];
        assert_eq!(sub.moved.get("MaxDeliveryAttemptsExceeded"), Some(&2));
        assert_eq!((sub.left, sub.objects_read), (1, 2));
        assert_eq!(sub.objects_of_other_subscriptions, 1);
        assert_eq!(w.objects.objects(), before);
        assert!(w.queue.sent().is_empty());
    }

    /// #36, L2: a redrive of the events picked by id moves those and leaves the rest of their
    /// object; one by object and id takes no record of another object or another reason; the
    /// dry run lists each event it would move, with its reason and object.
    #[test]
    fn a_redrive_by_id_moves_only_the_picked_events() {
        let w = world();
        let listed = redrive(&w, DeadLetterSelection::default(), true);
        let mut ids: Vec<_> = listed.subscriptions[0]
            .events
            .iter()
            .map(|e| {
                (
                    e.id.clone().unwrap(),
                    e.reason.clone(),
                    e.location.starts_with("s3://dead/dl/orders/audit/"),
                )
            })
            .collect();
        ids.sort();
        assert_eq!(
            ids,
            [
                ("a".into(), "MaxDeliveryAttemptsExceeded".into(), true),
                ("b".into(), "TimeToLiveExceeded".into(), true),
                ("c".into(), "MaxDeliveryAttemptsExceeded".into(), true),
            ]
        );
        let report = redrive(
            &w,
            DeadLetterSelection {
                ids: vec!["b".into()],
                ..DeadLetterSelection::default()
            },
            false,
        );
        assert_eq!(report.events(), 1);
        assert_eq!(queued_ids(&w), ["b"]);
        // A record picked by object and id: not one of the same id in another object, nor
        // one whose reason is not asked for.
        let c = listed.subscriptions[0]
            .events
            .iter()
            .find(|e| e.id.as_deref() == Some("c"))
            .unwrap();
        let none = redrive(
            &w,
            DeadLetterSelection {
                records: vec![(c.location.clone(), "a".into())],
                ..DeadLetterSelection::default()
            },
            true,
        );
        assert_eq!(none.events(), 0, "a is not in c's object");
        let none = redrive(
            &w,
            DeadLetterSelection {
                records: vec![(c.location.clone(), "c".into())],
                reasons: vec!["TimeToLiveExceeded".into()],
                ..DeadLetterSelection::default()
            },
            true,
        );
        assert_eq!(none.events(), 0, "c's reason is not asked for");
        // a stays in its object, c in its own.
        let left = redrive(&w, DeadLetterSelection::default(), true);
        let mut left: Vec<_> = left.subscriptions[0]
            .events
            .iter()
            .filter_map(|e| e.id.clone())
            .collect();
        left.sort();
        assert_eq!(left, ["a", "c"]);
    }

    /// A subscription whose dead-letter bucket no longer exists is skipped, saying so; the
    /// redrive of the topic's other subscriptions goes on (#11 item 5).
    #[test]
    fn a_deleted_bucket_skips_its_subscription_only() {
        let w = world();
        w.store.insert_validated(
            SubscriptionRequest {
                topic: "orders".into(),
                name: "gone".into(),
                endpoint: "https://example.com/other".into(),
                dead_letter_destination: Some("s3://gone/dl".into()),
                ..SubscriptionRequest::default()
            },
            InputSchema::EventGridSchema,
            at(9),
        );
        w.objects.delete_bucket("gone");
        let report = redrive(&w, DeadLetterSelection::default(), true);
        let by_name = |n: &str| {
            report
                .subscriptions
                .iter()
                .find(|s| s.subscription == n)
                .unwrap_or_else(|| panic!("{n} reported"))
        };
        assert_eq!(
            by_name("gone").skipped.as_deref(),
            Some("its dead-letter bucket gone no longer exists")
        );
        assert_eq!(by_name("audit").moved.values().sum::<usize>(), 3);
    }

    /// Records picked by time and reason go back to delivery as the events they were (the L6
    /// fields off, numbers untouched), for the subscription as it is now; an object whose
    /// records all moved is deleted, one with records left keeps only those; objects of an
    /// earlier subscription of the same name are never sent to this one.
    #[test]
    fn picked_records_are_delivered_again_and_leave_their_objects() {
        let w = world();
        let report = redrive(
            &w,
            DeadLetterSelection {
                since: Some(at(11)),
                ..DeadLetterSelection::default()
            },
            false,
        );
        assert_eq!(report.events(), 1);
        assert_eq!(queued_ids(&w), vec!["c"]);
        assert_eq!(w.objects.objects().len(), 2, "the 12:00 object was deleted");

        let report = redrive(
            &w,
            DeadLetterSelection {
                subscription: Some("audit".into()),
                reasons: vec!["maxdeliveryattemptsexceeded".into()],
                ..DeadLetterSelection::default()
            },
            false,
        );
        assert_eq!(report.subscriptions[0].objects_rewritten, 1);
        assert_eq!(
            queued_ids(&w),
            vec!["c", "a"],
            "never z: another subscription's"
        );
        let left: Vec<String> = w.objects.objects().into_values().collect();
        assert_eq!(
            left.len(),
            2,
            "the rewritten object and the other subscription's"
        );
        assert!(
            left.iter()
                .any(|o| o.contains(r#""id":"b""#) && !o.contains(r#""id":"a""#))
        );
        assert!(left.iter().any(|o| o.contains(r#""id":"z""#)));
    }

    /// The body of a delivery message of one event for the world's subscription.
    fn one_delivery(w: &World) -> String {
        let message = DeliveryMessage::packed(
            &DeliveryHistory::new(&w.sub),
            at(13),
            vec![QueuedEvent::new(
                at(13),
                RawValue::from_string(r#"{"id":"p"}"#.into()).unwrap(),
            )],
        );
        message[0].to_body().unwrap()
    }

    /// A redrive queue holding `bodies`.
    fn parked_with(clock: Arc<ManualClock>, bodies: &[String]) -> MemoryQueue {
        let parked = MemoryQueue::new(clock);
        let outgoing: Vec<OutgoingMessage> = bodies
            .iter()
            .map(|b| OutgoingMessage {
                body: b.clone(),
                delay: Duration::ZERO,
                group: None,
            })
            .collect();
        block_on(parked.send_all(&outgoing));
        parked
    }

    /// A queue redrive moves the messages of its queue's kind back to their queue, and leaves
    /// (visible again) those it cannot read or that are of another kind; its dry run moves
    /// nothing.
    #[test]
    fn a_redrive_queue_goes_back_to_its_queue() {
        let clock = Arc::new(ManualClock::new(at(13)));
        let delivery = MemoryQueue::new(clock.clone());
        let w = world();
        let bodies = [one_delivery(&w), "not a message".to_string()];
        let parked = parked_with(clock, &bodies);

        let dry = block_on(redrive_queue(
            &parked,
            RedriveTargets::one(&delivery),
            QueueKind::Delivery,
            true,
            100,
        ))
        .unwrap();
        assert_eq!((dry.messages(), dry.unreadable), (1, 1));
        assert_eq!(
            dry.moved["orders/audit"],
            Moved {
                messages: 1,
                events: 1
            }
        );
        assert!(delivery.is_empty());
        assert_eq!(parked.visible().len(), 2, "all visible again");

        // Delivery messages are not what a dead-letter queue takes: they stay.
        let wrong = block_on(redrive_queue(
            &parked,
            RedriveTargets::one(&delivery),
            QueueKind::DeadLetter,
            false,
            100,
        ))
        .unwrap();
        assert_eq!((wrong.messages(), wrong.unreadable), (0, 2));
        assert!(delivery.is_empty());

        let done = block_on(redrive_queue(
            &parked,
            RedriveTargets::one(&delivery),
            QueueKind::Delivery,
            false,
            100,
        ))
        .unwrap();
        assert_eq!((done.messages(), done.unreadable), (1, 1));
        assert_eq!(delivery.visible()[0].body, bodies[0]);
        let left = parked.visible();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].body, "not a message");
    }

    /// #34 item 12, #35: a subscription's handshake or expiry step parked with the delivery
    /// queue's messages goes back to the control queue, a replay's delivery to the replay
    /// queue, the other deliveries to the delivery queue.
    #[test]
    fn a_parked_message_goes_back_to_its_lanes_queue() {
        use gridrelay_shared::message::{ReplayTag, ValidationTask};
        use gridrelay_shared::validation::ValidationStep;
        let clock = Arc::new(ManualClock::new(at(13)));
        let delivery = MemoryQueue::new(clock.clone());
        let control = MemoryQueue::new(clock.clone());
        let replay = MemoryQueue::new(clock.clone());
        let w = world();
        let step =
            DeliveryQueueMessage::Validation(ValidationTask::new(&w.sub, ValidationStep::Expire));
        let mut replayed = match DeliveryQueueMessage::from_body(&one_delivery(&w)).unwrap() {
            DeliveryQueueMessage::Delivery(m) => m,
            other => panic!("not a delivery: {other:?}"),
        };
        replayed.replay = Some(ReplayTag {
            name: "night".to_string(),
            claim: None,
        });
        let bodies = [
            one_delivery(&w),
            step.to_body().unwrap(),
            replayed.to_body().unwrap(),
        ];
        let parked = parked_with(clock, &bodies);

        let done = block_on(redrive_queue(
            &parked,
            RedriveTargets {
                delivery: &delivery,
                control: &control,
                replay: &replay,
            },
            QueueKind::Delivery,
            false,
            100,
        ))
        .unwrap();
        assert_eq!(done.messages(), 3);
        let bodies_of =
            |q: &MemoryQueue| -> Vec<String> { q.visible().into_iter().map(|m| m.body).collect() };
        assert_eq!(bodies_of(&delivery), [bodies[0].clone()]);
        assert_eq!(bodies_of(&control), [bodies[1].clone()]);
        assert_eq!(bodies_of(&replay), [bodies[2].clone()]);
        assert!(done.moved.keys().any(|k| k.ends_with("(replay night)")));
        assert!(parked.visible().is_empty());
    }
}
