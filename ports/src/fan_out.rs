//! Fan-out: a topic's events become delivery messages for every subscription whose filter they
//! pass, durably enqueued before anyone is told they were accepted (G1).
//!
//! Used by `ingest` for published events and by `dead-letter` for its notifications (L7), so
//! both go through the same filters and the same queue.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::value::RawValue;

use crate::{MessageQueue, OutgoingMessage, QueueError, StoreError, SubscriptionStore};
use gridrelay_shared::limits::{MAX_FAN_OUT_BYTES, MAX_PUBLISH_BYTES};
use gridrelay_shared::message::{DeliveryHistory, DeliveryMessage, QueuedEvent};
use gridrelay_shared::ordering::{OrderingKey, message_group};
use gridrelay_shared::schema::{DeliverySchema, InputSchema, to_delivery_form};
use gridrelay_shared::subscription::Subscription;

/// Why a fan-out did not complete; the caller may retry (duplicates are allowed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FanOutError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("could not encode a delivery message: {0}")]
    Encode(String),
    /// An event that cannot be turned into a subscription's schema: the same every time, so
    /// the publisher is told (400), and nothing is enqueued.
    #[error("events[{index}]: {reason}")]
    Unconvertible { index: usize, reason: String },
    /// #34 item 9: more than `ingest` can enqueue before its deadline; refused (413) before
    /// anything is enqueued, the same every time.
    #[error(
        "the events would be enqueued as {bytes} bytes for {subscriptions} subscriptions; allowed: at most {MAX_FAN_OUT_BYTES} bytes (each event counted once per subscription it goes to): publish fewer or smaller events per request"
    )]
    TooLarge { bytes: usize, subscriptions: usize },
    #[error("{failed} of {total} delivery messages were not enqueued: {first}")]
    Enqueue {
        failed: usize,
        total: usize,
        first: String,
    },
}

/// What a fan-out enqueued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FanOut {
    pub subscriptions: usize,
    /// Events enqueued, counted once per subscription.
    pub enqueued: usize,
    pub messages: usize,
}

/// Enqueues `events` (raw JSON, as kept for the topic's `input` schema) for every matching
/// subscription of `topic`, each turned into the schema its subscription receives.
pub async fn fan_out(
    store: &dyn SubscriptionStore,
    queue: &dyn MessageQueue,
    topic: &str,
    input: InputSchema,
    events: &[Box<RawValue>],
    now: DateTime<Utc>,
) -> Result<FanOut, FanOutError> {
    let subscriptions = receiving_subscriptions(store, topic, now).await?;
    let converted = delivery_forms(&subscriptions, input, events)?;
    let (plan, bytes) = plan_shares(&subscriptions, &converted, input, events);
    if bytes > MAX_FAN_OUT_BYTES {
        return Err(FanOutError::TooLarge {
            bytes,
            subscriptions: plan.len(),
        });
    }
    let (enqueued, messages) = enqueue_shares(queue, plan, now).await?;
    Ok(FanOut {
        subscriptions: subscriptions.len(),
        enqueued,
        messages,
    })
}

/// #36: `event` (in the Event Grid schema) for `sub` alone, whatever its filter, turned into
/// its delivery schema: the portal's test event, then delivered, retried, journaled and
/// dead-lettered as any other.
pub async fn send_to_subscription(
    queue: &dyn MessageQueue,
    sub: &Subscription,
    event: &RawValue,
    now: DateTime<Utc>,
) -> Result<(), FanOutError> {
    let form = to_delivery_form(
        event,
        InputSchema::EventGridSchema,
        sub.event_delivery_schema,
    )
    .map_err(|e| FanOutError::Unconvertible {
        index: 0,
        reason: e.to_string(),
    })?;
    let queued = vec![QueuedEvent::new(now, form.into_owned())];
    send_deliveries(queue, &DeliveryHistory::new(sub), queued, now).await
}

/// #36: `events`, already in `sub`'s delivery form, for it alone, sent again from `from`
/// (journaled with their first attempt as a redrive from there).
pub async fn send_again_to_subscription(
    queue: &dyn MessageQueue,
    sub: &Subscription,
    events: Vec<QueuedEvent>,
    from: &str,
    now: DateTime<Utc>,
) -> Result<(), FanOutError> {
    let history = DeliveryHistory {
        redriven_from: Some(from.to_string()),
        redriven_at: Some(now),
        ..DeliveryHistory::new(sub)
    };
    send_deliveries(queue, &history, events, now).await
}

/// `events` with `history`, packed and sent to the delivery queue.
async fn send_deliveries(
    queue: &dyn MessageQueue,
    history: &DeliveryHistory,
    events: Vec<QueuedEvent>,
    now: DateTime<Utc>,
) -> Result<(), FanOutError> {
    let messages =
        new_deliveries(history, now, events).map_err(|e| FanOutError::Encode(e.to_string()))?;
    let mut sent = Sent::default();
    sent.add(send_messages(queue, messages).await);
    sent.result()
}

/// The subscriptions of `topic` that receive events at `now`.
async fn receiving_subscriptions(
    store: &dyn SubscriptionStore,
    topic: &str,
    now: DateTime<Utc>,
) -> Result<Vec<Subscription>, FanOutError> {
    let mut subscriptions = store.list_subscriptions(topic).await?;
    // A list kept by a warm function may hold an expiration changed since: the list is read
    // again before an expired one's events are left out (at most once per recheck interval,
    // so a record waiting for its deletion does not turn the cache off).
    if subscriptions
        .iter()
        .any(|s| s.delivers() && s.is_expired(now))
    {
        store.recheck_list(topic);
        subscriptions = store.list_subscriptions(topic).await?;
    }
    Ok(subscriptions
        .into_iter()
        .filter(|s| s.receives(now))
        .collect())
}

/// Each event in each delivery schema some subscription wants, converted once (borrowed where
/// no conversion is needed, so each subscription's copy is the only one).
fn delivery_forms<'e>(
    subscriptions: &[Subscription],
    input: InputSchema,
    events: &'e [Box<RawValue>],
) -> Result<HashMap<DeliverySchema, Vec<Cow<'e, RawValue>>>, FanOutError> {
    let mut converted: HashMap<DeliverySchema, Vec<Cow<'_, RawValue>>> = HashMap::new();
    for schema in subscriptions.iter().map(|s| s.event_delivery_schema) {
        if converted.contains_key(&schema) {
            continue;
        }
        let forms = events
            .iter()
            .enumerate()
            .map(|(index, e)| {
                to_delivery_form(e, input, schema).map_err(|e| FanOutError::Unconvertible {
                    index,
                    reason: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        converted.insert(schema, forms);
    }
    Ok(converted)
}

/// #35: what a replay's step sends of `events` (archived in the `input` schema) to one of its
/// subscriptions (one the replay chose that still receives events).
#[derive(Debug, Clone)]
pub struct ReplayShare {
    /// The events its filter takes, turned into its schema as fan-out turns them, in order,
    /// as new deliveries published `now` (fresh attempts and time to live).
    pub events: Vec<QueuedEvent>,
    /// Events its schema cannot take (a custom-schema event without the fields a CloudEvent
    /// needs, say): left out for it alone, and counted.
    pub unconvertible: usize,
}

/// Each of `subscriptions`' share of a replay's step, in their order.
pub fn replay_shares(
    subscriptions: &[Subscription],
    input: InputSchema,
    events: &[Box<RawValue>],
    now: DateTime<Utc>,
) -> Vec<ReplayShare> {
    let fields = input.filter_fields();
    let parsed = parsed_for_filters(subscriptions, events);
    subscriptions
        .iter()
        .map(|sub| {
            let mut share = ReplayShare {
                events: Vec::new(),
                unconvertible: 0,
            };
            for (i, event) in events.iter().enumerate() {
                let taken = sub.filter.is_empty()
                    || parsed[i]
                        .as_ref()
                        .is_some_and(|v| sub.filter.matches(v, fields));
                if !taken {
                    continue;
                }
                match to_delivery_form(event, input, sub.event_delivery_schema) {
                    Ok(form) => share.events.push(QueuedEvent::new(now, form.into_owned())),
                    Err(_) => share.unconvertible += 1,
                }
            }
            share
        })
        .collect()
}

/// The events as trees, for the subscriptions' filters: parsed only if some subscription
/// filters on their fields (empty otherwise); one that does not parse is `None`.
fn parsed_for_filters(
    subscriptions: &[Subscription],
    events: &[Box<RawValue>],
) -> Vec<Option<serde_json::Value>> {
    if subscriptions.iter().all(|s| s.filter.is_empty()) {
        return Vec::new();
    }
    events
        .iter()
        .map(|e| serde_json::from_str(e.get()).ok())
        .collect()
}

/// Which events each subscription receives, and the bytes that comes to (a publish too large
/// to enqueue in time is refused whole before anything is sent: #34 item 9).
fn plan_shares<'s, 'e>(
    subscriptions: &'s [Subscription],
    converted: &'s HashMap<DeliverySchema, Vec<Cow<'e, RawValue>>>,
    input: InputSchema,
    events: &[Box<RawValue>],
) -> (Vec<Share<'s, 'e>>, usize) {
    let fields = input.filter_fields();
    let parsed = parsed_for_filters(subscriptions, events);
    let mut plan: Vec<Share<'_, '_>> = Vec::new();
    let mut bytes = 0;
    for sub in subscriptions {
        let Some(forms) = converted.get(&sub.event_delivery_schema) else {
            continue;
        };
        // Indices only for a filtered subscription: 500 unfiltered ones keep nothing per event.
        let chosen = if sub.filter.is_empty() {
            bytes += forms.iter().map(|e| e.get().len()).sum::<usize>();
            None
        } else {
            let chosen: Vec<usize> = (0..forms.len())
                .filter(|i| {
                    parsed[*i]
                        .as_ref()
                        .is_some_and(|v| sub.filter.matches(v, fields))
                })
                .collect();
            if chosen.is_empty() {
                continue;
            }
            bytes += chosen.iter().map(|i| forms[*i].get().len()).sum::<usize>();
            Some(chosen)
        };
        plan.push(Share { sub, forms, chosen });
    }
    (plan, bytes)
}

/// Sends every share's delivery messages as they are built, about one publish request's bytes
/// at a time with a few such sends in flight, so memory holds a few batches and one
/// subscription's messages, not every subscription's copy of the events at once. Returns the
/// events enqueued (once per subscription) and the messages sent.
async fn enqueue_shares(
    queue: &dyn MessageQueue,
    plan: Vec<Share<'_, '_>>,
    now: DateTime<Utc>,
) -> Result<(usize, usize), FanOutError> {
    let mut outbox = Outbox::default();
    let mut sends = FuturesUnordered::new();
    let mut sent = Sent::default();
    let mut enqueued = 0;
    // O1: ordered messages are sent together at the end, in one send that keeps each
    // group's order (the outbox's sends run at once).
    let mut ordered = Vec::new();
    for share in plan {
        let sub = share.sub;
        let queued = share.queued(now);
        enqueued += queued.len();
        let encode = |e: serde_json::Error| FanOutError::Encode(e.to_string());
        let messages = match &sub.ordering_key {
            Some(key) => {
                let (keyed, unkeyed) = ordered_deliveries(sub, key, now, queued).map_err(encode)?;
                ordered.extend(keyed);
                unkeyed
            }
            None => new_deliveries(&DeliveryHistory::new(sub), now, queued).map_err(encode)?,
        };
        for message in messages {
            outbox.push(message);
        }
        if outbox.is_full() {
            sends.push(send_messages(queue, outbox.take()));
            if sends.len() >= SENDS_IN_FLIGHT
                && let Some(done) = sends.next().await
            {
                sent.add(done);
                // After a refused send no other starts, and those in flight are given up: the
                // publish is answered 503 and sent again whole (what was enqueued may then
                // arrive twice, which G1 allows).
                sent.result()?;
            }
        }
    }
    if !outbox.messages.is_empty() {
        sends.push(send_messages(queue, outbox.take()));
    }
    if !ordered.is_empty() {
        sends.push(send_messages(queue, ordered));
    }
    while let Some(done) = sends.next().await {
        sent.add(done);
        sent.result()?;
    }
    Ok((enqueued, sent.messages))
}

/// What one subscription receives of a publish: the events in its delivery schema (`forms`)
/// its filter passes, by index (`None`: it has no filter, so all of them).
struct Share<'s, 'e> {
    sub: &'s Subscription,
    forms: &'s [Cow<'e, RawValue>],
    chosen: Option<Vec<usize>>,
}

impl Share<'_, '_> {
    /// Its events, as new deliveries published `now`.
    fn queued(self, now: DateTime<Utc>) -> Vec<QueuedEvent> {
        match self.chosen {
            None => self
                .forms
                .iter()
                .map(|e| QueuedEvent::new(now, e.clone().into_owned()))
                .collect(),
            Some(chosen) => chosen
                .into_iter()
                .map(|i| QueuedEvent::new(now, self.forms[i].clone().into_owned()))
                .collect(),
        }
    }
}

/// The queue messages that deliver `events` to `sub` as new deliveries (no attempt made yet,
/// due now), packed under the message size limit. Fan-out and redrive enqueue these.
pub(crate) fn new_deliveries(
    history: &DeliveryHistory,
    now: DateTime<Utc>,
    events: Vec<QueuedEvent>,
) -> Result<Vec<OutgoingMessage>, serde_json::Error> {
    DeliveryMessage::packed(history, now, events)
        .into_iter()
        .map(|message| {
            Ok(OutgoingMessage {
                body: message.to_body()?,
                delay: Duration::ZERO,
                group: None,
            })
        })
        .collect()
}

/// O1: the messages of an ordered subscription: each event with a key in a message of its own
/// in its key's group ([`message_group`]), in the order given; the events without one
/// packed as any subscription's, without order.
fn ordered_deliveries(
    sub: &Subscription,
    key: &OrderingKey,
    now: DateTime<Utc>,
    events: Vec<QueuedEvent>,
) -> Result<(Vec<OutgoingMessage>, Vec<OutgoingMessage>), serde_json::Error> {
    let history = DeliveryHistory::new(sub);
    let mut ordered = Vec::new();
    let mut unkeyed = Vec::new();
    for event in events {
        let value: serde_json::Value = serde_json::from_str(event.event.get())?;
        match key.value_in(&value) {
            Some(k) => {
                for message in new_deliveries(&history, now, vec![event])? {
                    ordered.push(OutgoingMessage {
                        group: Some(message_group(&sub.id, &k)),
                        ..message
                    });
                }
            }
            None => unkeyed.push(event),
        }
    }
    Ok((ordered, new_deliveries(&history, now, unkeyed)?))
}

/// O1: the queues fan-out sends to, as one: messages with a group go to the ordered (FIFO)
/// queue, the others to the delivery queue. Without an ordered queue, a message with a group
/// is refused saying so (the publish is answered 503 and nothing is delivered out of order).
pub struct DeliveryQueues {
    pub delivery: std::sync::Arc<dyn MessageQueue>,
    pub ordered: Option<std::sync::Arc<dyn MessageQueue>>,
}

#[async_trait::async_trait]
impl MessageQueue for DeliveryQueues {
    async fn send_all(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), QueueError>> {
        let (ordered, unordered): (Vec<usize>, Vec<usize>) =
            (0..messages.len()).partition(|&i| messages[i].group.is_some());
        if ordered.is_empty() {
            return self.delivery.send_all(messages).await;
        }
        let pick = |indexes: &[usize]| -> Vec<OutgoingMessage> {
            indexes.iter().map(|&i| messages[i].clone()).collect()
        };
        let to_ordered = pick(&ordered);
        let to_delivery = pick(&unordered);
        let ordered_sent = async {
            match &self.ordered {
                Some(queue) => queue.send_all(&to_ordered).await,
                None => vec![
                    Err(QueueError(
                        "this installation has no ordered delivery queue (O1): deploy one that has"
                            .to_string()
                    ));
                    to_ordered.len()
                ],
            }
        };
        let delivery_sent = async {
            if to_delivery.is_empty() {
                Vec::new()
            } else {
                self.delivery.send_all(&to_delivery).await
            }
        };
        let (ordered_sent, delivery_sent) = futures::join!(ordered_sent, delivery_sent);
        let mut results = vec![Err(QueueError("not sent".to_string())); messages.len()];
        for (i, r) in ordered.into_iter().zip(ordered_sent) {
            results[i] = r;
        }
        for (i, r) in unordered.into_iter().zip(delivery_sent) {
            results[i] = r;
        }
        results
    }

    async fn retry_after(&self, receipt_handle: &str, after: Duration) -> Result<(), QueueError> {
        self.delivery.retry_after(receipt_handle, after).await
    }

    async fn receive_batch(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<crate::ReceivedMessage>, QueueError> {
        self.delivery.receive_batch(max, visibility).await
    }

    async fn delete_received(&self, receipt_handle: &str) -> Result<(), QueueError> {
        self.delivery.delete_received(receipt_handle).await
    }
}

/// Sends of about one publish request's bytes each that may be in flight at once.
const SENDS_IN_FLIGHT: usize = 4;

/// Messages waiting to be sent.
#[derive(Default)]
struct Outbox {
    messages: Vec<OutgoingMessage>,
    bytes: usize,
}

impl Outbox {
    /// Sent once it holds this many bytes (one publish request's worth); the queue splits a
    /// send into its own batches and sends those at once.
    const BYTES: usize = MAX_PUBLISH_BYTES;

    fn push(&mut self, message: OutgoingMessage) {
        self.bytes += message.body.len();
        self.messages.push(message);
    }

    fn is_full(&self) -> bool {
        self.bytes >= Self::BYTES
    }

    fn take(&mut self) -> Vec<OutgoingMessage> {
        self.bytes = 0;
        std::mem::take(&mut self.messages)
    }
}

/// What one send did: how many messages it held, and the errors of those refused.
struct SendResult {
    messages: usize,
    failures: Vec<String>,
}

async fn send_messages(queue: &dyn MessageQueue, messages: Vec<OutgoingMessage>) -> SendResult {
    let failures = queue
        .send_all(&messages)
        .await
        .into_iter()
        .filter_map(Result::err)
        .map(|e| e.to_string())
        .collect();
    SendResult {
        messages: messages.len(),
        failures,
    }
}

/// What every send of a fan-out did.
#[derive(Default)]
struct Sent {
    messages: usize,
    failed: usize,
    first: Option<String>,
}

impl Sent {
    fn add(&mut self, done: SendResult) {
        self.messages += done.messages;
        self.failed += done.failures.len();
        if self.first.is_none() {
            self.first = done.failures.into_iter().next();
        }
    }

    /// Fails if any message was refused (the publisher retries, and what was enqueued before
    /// may then arrive twice, which G1 allows).
    fn result(&self) -> Result<(), FanOutError> {
        match &self.first {
            Some(first) => Err(FanOutError::Enqueue {
                failed: self.failed,
                total: self.messages,
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::QueueError;
    use crate::memory::{ManualClock, MemoryQueue, MemorySubscriptionStore};
    use gridrelay_shared::subscription::SubscriptionRequest;
    use std::sync::Arc;

    /// #35: a replay's step gives each subscription the archived events its filter takes, in
    /// its schema; an event one subscription's schema cannot take is left out for it alone,
    /// and counted, not the step's failure.
    #[test]
    fn a_replay_share_leaves_out_only_what_its_subscription_cannot_take() {
        let now = Utc::now();
        let store = MemorySubscriptionStore::default();
        let sub = |name: &str, schema: &str| {
            store.insert_validated(
                SubscriptionRequest {
                    topic: "custom".into(),
                    name: name.into(),
                    endpoint: format!("https://example.com/{name}"),
                    event_delivery_schema: Some(schema.into()),
                    ..SubscriptionRequest::default()
                },
                InputSchema::CustomEventSchema,
                now,
            )
        };
        let subscriptions = [
            sub("as-is", "CustomInputSchema"),
            sub("cloud", "CloudEventSchemaV1_0"),
        ];
        let raw = |text: &str| RawValue::from_string(text.to_string()).unwrap();
        let events = [
            raw(
                r#"{"id":"1","topic":"/t","eventType":"t","eventTime":"2026-11-27T00:00:00Z","data":{}}"#,
            ),
            raw(r#"{"order":2}"#),
        ];
        let shares = replay_shares(&subscriptions, InputSchema::CustomEventSchema, &events, now);
        assert_eq!(shares.len(), 2);
        assert_eq!((shares[0].events.len(), shares[0].unconvertible), (2, 0));
        assert_eq!((shares[1].events.len(), shares[1].unconvertible), (1, 1));
        assert!(
            shares[1].events[0]
                .event
                .get()
                .contains(r#""specversion":"1.0""#)
        );
        assert!(
            shares
                .iter()
                .flat_map(|s| &s.events)
                .all(|e| e.publish_time == now)
        );
    }

    /// #36: the portal's test event goes to its one subscription, in its delivery schema,
    /// even when its filter would not take it.
    #[test]
    fn an_event_sent_to_one_subscription_skips_its_filter_and_takes_its_schema() {
        let now = Utc::now();
        let store = MemorySubscriptionStore::default();
        let sub = store.insert_validated(
            SubscriptionRequest {
                topic: "orders".into(),
                name: "cloud".into(),
                endpoint: "https://example.com/cloud".into(),
                event_delivery_schema: Some("CloudEventSchemaV1_0".into()),
                filter: gridrelay_shared::filter::EventFilter {
                    included_event_types: Some(vec!["Orders.Created".into()]),
                    ..Default::default()
                },
                ..SubscriptionRequest::default()
            },
            InputSchema::EventGridSchema,
            now,
        );
        let queue = MemoryQueue::new(Arc::new(ManualClock::new(now)));
        assert!(
            !sub.filter.is_empty(),
            "a filter the test event does not pass"
        );
        let event = gridrelay_shared::portal::test_event("orders", "cloud", "t-1", now);
        futures::executor::block_on(send_to_subscription(&queue, &sub, &event, now))
            .unwrap_or_else(|e| panic!("{e}"));
        let sent = queue.sent();
        assert_eq!(sent.len(), 1);
        let Ok(gridrelay_shared::message::DeliveryQueueMessage::Delivery(message)) =
            gridrelay_shared::message::DeliveryQueueMessage::from_body(&sent[0].body)
        else {
            panic!("a delivery message: {}", sent[0].body)
        };
        assert_eq!(
            (message.topic.as_str(), message.subscription.as_str()),
            ("orders", "cloud")
        );
        assert_eq!(message.attempts, 0);
        let delivered = message.events[0].event.get();
        assert!(delivered.contains(r#""specversion":"1.0""#), "{delivered}");
        assert!(
            delivered.contains(gridrelay_shared::portal::TEST_EVENT_TYPE),
            "{delivered}"
        );
    }

    fn store_with(subscriptions: usize, now: DateTime<Utc>) -> MemorySubscriptionStore {
        let store = MemorySubscriptionStore::default();
        for i in 0..subscriptions {
            let request = SubscriptionRequest {
                topic: "orders".into(),
                name: format!("sub-{i:03}"),
                endpoint: format!("https://example.com/{i}"),
                ..SubscriptionRequest::default()
            };
            store.insert_validated(request, InputSchema::EventGridSchema, now);
        }
        store
    }

    fn run(
        store: &MemorySubscriptionStore,
        queue: &dyn MessageQueue,
        events: &[Box<RawValue>],
        now: DateTime<Utc>,
    ) -> Result<FanOut, FanOutError> {
        futures::executor::block_on(fan_out(
            store,
            queue,
            "orders",
            InputSchema::EventGridSchema,
            events,
            now,
        ))
    }

    /// `count` events of `bytes` bytes each.
    fn events_of(count: usize, bytes: usize) -> Vec<Box<RawValue>> {
        (0..count)
            .map(|i| {
                let bare = format!(r#"{{"id":"{i:06}","data":""}}"#);
                let padding = "x".repeat(bytes.saturating_sub(bare.len()));
                RawValue::from_string(format!(r#"{{"id":"{i:06}","data":"{padding}"}}"#)).unwrap()
            })
            .collect()
    }

    /// #34 item 9: a publish whose events, times the subscriptions they go to, come to more
    /// than `MAX_FAN_OUT_BYTES` is refused whole, naming the size and the limit, before
    /// anything is enqueued (a client's retry then duplicates nothing); one at the limit goes
    /// through. 1 MiB of events to 64 subscriptions is the limit; to 65 it is over.
    #[test]
    fn a_fan_out_over_the_limit_is_refused_before_anything_is_enqueued() {
        let now = chrono::Utc::now();
        // 1 MiB of events exactly: 1,024 events of 1,024 bytes.
        let events = events_of(1024, 1024);
        assert_eq!(
            events.iter().map(|e| e.get().len()).sum::<usize>(),
            MAX_PUBLISH_BYTES
        );
        let over = store_with(65, now);
        let queue = MemoryQueue::new(Arc::new(ManualClock::new(now)));
        let refused = run(&over, &queue, &events, now).unwrap_err();
        assert_eq!(
            refused,
            FanOutError::TooLarge {
                bytes: 65 * MAX_PUBLISH_BYTES,
                subscriptions: 65
            }
        );
        let text = refused.to_string();
        assert!(
            text.contains(&(65 * MAX_PUBLISH_BYTES).to_string())
                && text.contains(&MAX_FAN_OUT_BYTES.to_string()),
            "{text}"
        );
        assert!(queue.send_calls().is_empty(), "nothing was sent");

        let at = store_with(64, now);
        let done = run(&at, &queue, &events, now).unwrap();
        assert_eq!(done.enqueued, 64 * 1024);
        assert_eq!(queue.len(), done.messages);
    }

    /// A queue whose sends take a while (each waits for the executor to come back once), counting
    /// how many are in flight at once.
    struct SlowQueue {
        inner: MemoryQueue,
        in_flight: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl MessageQueue for SlowQueue {
        async fn send_all(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), QueueError>> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.in_flight.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            crate::memory::yield_once().await;
            self.in_flight.fetch_sub(1, SeqCst);
            self.inner.send_all(messages).await
        }
        async fn retry_after(&self, handle: &str, after: Duration) -> Result<(), QueueError> {
            self.inner.retry_after(handle, after).await
        }
        async fn receive_batch(
            &self,
            max: usize,
            visibility: Duration,
        ) -> Result<Vec<crate::ReceivedMessage>, QueueError> {
            self.inner.receive_batch(max, visibility).await
        }
        async fn delete_received(&self, handle: &str) -> Result<(), QueueError> {
            self.inner.delete_received(handle).await
        }
    }

    /// #34 item 9: fan-out keeps several sends in flight (not one after another, which could not
    /// finish 64 MiB within ingest's 15 s), and never more than `SENDS_IN_FLIGHT`; and after a
    /// refused send it starts no other (the publisher's retry may duplicate what was enqueued,
    /// G1). The first send here holds the refused subscription's messages.
    #[test]
    fn fan_out_sends_a_few_batches_at_once_and_stops_after_a_failure() {
        let now = chrono::Utc::now();
        let store = store_with(32, now);
        let events = events_of(512, 1024);
        let queue = SlowQueue {
            inner: MemoryQueue::new(Arc::new(ManualClock::new(now))),
            in_flight: Default::default(),
            most: Default::default(),
        };
        let done = run(&store, &queue, &events, now).unwrap();
        assert_eq!(done.enqueued, 32 * 512);
        let most = queue.most.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(most, SENDS_IN_FLIGHT, "sends in flight at once");

        let failing = MemoryQueue::new(Arc::new(ManualClock::new(now)));
        failing.refuse_entries_containing(Some("sub-000"));
        let refused = run(&store, &failing, &events, now).unwrap_err();
        assert!(matches!(refused, FanOutError::Enqueue { .. }), "{refused}");
        assert_eq!(
            failing.send_calls().len(),
            1,
            "no send started after the first was refused"
        );
    }

    /// Item 8 of the life-cycle issue: ingest's memory is bounded whatever the number of
    /// subscriptions: fan-out sends as it goes, never more than about one publish request's
    /// bytes (plus one subscription's messages) at once, yet every subscription gets every event.
    #[test]
    fn fan_out_sends_as_it_goes() {
        let now = chrono::Utc::now();
        let store = store_with(50, now);
        let queue = MemoryQueue::new(Arc::new(ManualClock::new(now)));
        let events = events_of(200, 1030);
        let done = run(&store, &queue, &events, now).unwrap();
        assert_eq!(done.enqueued, 50 * 200);
        let calls = queue.send_calls();
        let total: usize = calls.iter().sum();
        assert!(total > 10_000_000, "sent {total} bytes");
        let largest = calls.iter().max().copied().unwrap_or_default();
        assert!(
            largest <= MAX_PUBLISH_BYTES + 300_000,
            "one send held {largest} bytes of {total}"
        );
    }
}
