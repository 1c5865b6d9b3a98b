//! Fan-out: a topic's events become delivery messages for every subscription whose filter they
//! pass, durably enqueued before anyone is told they were accepted (G1).
//!
//! Used by `ingest` for published events and by `dead-letter` for its notifications (L7), so
//! both go through the same filters and the same queue.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;

use crate::{MessageQueue, OutgoingMessage, StoreError, SubscriptionStore};
use gridrelay_shared::limits::MAX_PUBLISH_BYTES;
use gridrelay_shared::message::{DeliveryHistory, DeliveryMessage, QueuedEvent};
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
    let subscriptions: Vec<_> = subscriptions
        .into_iter()
        .filter(|s| s.receives(now))
        .collect();
    let fields = input.filter_fields();
    // Each event in each delivery schema some subscription wants, converted once (borrowed
    // where no conversion is needed, so each subscription's copy is the only one).
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
    // Events are parsed into trees only if some subscription filters on their fields.
    let parsed: Vec<Option<serde_json::Value>> =
        if subscriptions.iter().all(|s| s.filter.is_empty()) {
            Vec::new()
        } else {
            events
                .iter()
                .map(|e| serde_json::from_str(e.get()).ok())
                .collect()
        };
    // Sent as it is built, a batch at a time, so memory holds one subscription's messages and
    // one batch, not every subscription's copy of the events at once.
    let mut batch = Outbox::default();
    let mut enqueued = 0;
    for sub in &subscriptions {
        let Some(forms) = converted.get(&sub.event_delivery_schema) else {
            continue;
        };
        let queued: Vec<QueuedEvent> = forms
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                sub.filter.is_empty()
                    || parsed[*i]
                        .as_ref()
                        .is_some_and(|v| sub.filter.matches(v, fields))
            })
            .map(|(_, e)| QueuedEvent::new(now, e.clone().into_owned()))
            .collect();
        if queued.is_empty() {
            continue;
        }
        enqueued += queued.len();
        for message in
            new_deliveries(sub, now, queued).map_err(|e| FanOutError::Encode(e.to_string()))?
        {
            batch.push(message);
        }
        if batch.is_full() {
            batch.send(queue).await?;
        }
    }
    batch.send(queue).await?;
    Ok(FanOut {
        subscriptions: subscriptions.len(),
        enqueued,
        messages: batch.sent,
    })
}

/// The queue messages that deliver `events` to `sub` as new deliveries (no attempt made yet,
/// due now), packed under the message size limit. Fan-out and redrive enqueue these.
pub(crate) fn new_deliveries(
    sub: &Subscription,
    now: DateTime<Utc>,
    events: Vec<QueuedEvent>,
) -> Result<Vec<OutgoingMessage>, serde_json::Error> {
    DeliveryMessage::packed(&DeliveryHistory::new(sub), now, events)
        .into_iter()
        .map(|message| {
            Ok(OutgoingMessage {
                body: message.to_body()?,
                delay: Duration::ZERO,
            })
        })
        .collect()
}

/// Messages waiting to be sent, and how many were sent before.
#[derive(Default)]
struct Outbox {
    messages: Vec<OutgoingMessage>,
    bytes: usize,
    sent: usize,
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

    /// Sends what it holds; fails if any message was refused (the publisher retries, and what
    /// was enqueued before may then arrive twice, which G1 allows).
    async fn send(&mut self, queue: &dyn MessageQueue) -> Result<(), FanOutError> {
        if self.messages.is_empty() {
            return Ok(());
        }
        let messages = std::mem::take(&mut self.messages);
        self.bytes = 0;
        let total = self.sent + messages.len();
        let failures: Vec<String> = queue
            .send_all(&messages)
            .await
            .into_iter()
            .filter_map(Result::err)
            .map(|e| e.to_string())
            .collect();
        self.sent = total;
        match failures.first() {
            Some(first) => Err(FanOutError::Enqueue {
                failed: failures.len(),
                total,
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{ManualClock, MemoryQueue, MemorySubscriptionStore};
    use gridrelay_shared::subscription::SubscriptionRequest;
    use std::sync::Arc;

    /// Item 8 of the life-cycle issue: ingest's memory is bounded whatever the number of
    /// subscriptions: fan-out sends as it goes, never more than about one publish request's
    /// bytes (plus one subscription's messages) at once, yet every subscription gets every event.
    #[test]
    fn fan_out_sends_as_it_goes() {
        let now = chrono::Utc::now();
        let store = MemorySubscriptionStore::default();
        let queue = MemoryQueue::new(Arc::new(ManualClock::new(now)));
        for i in 0..50 {
            let request = SubscriptionRequest {
                topic: "orders".into(),
                name: format!("sub-{i:03}"),
                endpoint: format!("https://example.com/{i}"),
                ..SubscriptionRequest::default()
            };
            store.insert_validated(request, InputSchema::EventGridSchema, now);
        }
        let padding = "x".repeat(1000);
        let events: Vec<Box<RawValue>> = (0..200)
            .map(|i| {
                RawValue::from_string(format!(r#"{{"id":"{i}","data":"{padding}"}}"#)).unwrap()
            })
            .collect();
        let done = futures::executor::block_on(fan_out(
            &store,
            &queue,
            "orders",
            InputSchema::EventGridSchema,
            &events,
            now,
        ))
        .unwrap();
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
