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
use gridrelay_shared::message::{DeliveryHistory, DeliveryMessage, QueuedEvent};
use gridrelay_shared::schema::{DeliverySchema, InputSchema, to_delivery_form};

/// Why a fan-out did not complete; the caller may retry (duplicates are allowed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FanOutError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("could not encode a delivery message: {0}")]
    Encode(String),
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
    let subscriptions: Vec<_> = store
        .list_subscriptions(topic)
        .await?
        .into_iter()
        .filter(|s| s.delivers())
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
            .map(|e| to_delivery_form(e, input, schema))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| FanOutError::Encode(e.to_string()))?;
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
    let mut outgoing = Vec::new();
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
            .map(|(_, e)| QueuedEvent {
                publish_time: now,
                event: e.clone().into_owned(),
            })
            .collect();
        if queued.is_empty() {
            continue;
        }
        enqueued += queued.len();
        for message in DeliveryMessage::packed(&DeliveryHistory::new(sub), now, queued) {
            let body = message
                .to_body()
                .map_err(|e| FanOutError::Encode(e.to_string()))?;
            outgoing.push(OutgoingMessage {
                body,
                delay: Duration::ZERO,
            });
        }
    }
    let failures: Vec<String> = queue
        .send_all(&outgoing)
        .await
        .into_iter()
        .filter_map(Result::err)
        .map(|e| e.to_string())
        .collect();
    if let Some(first) = failures.first() {
        return Err(FanOutError::Enqueue {
            failed: failures.len(),
            total: outgoing.len(),
            first: first.clone(),
        });
    }
    Ok(FanOut {
        subscriptions: subscriptions.len(),
        enqueued,
        messages: outgoing.len(),
    })
}
