//! The bodies of gridrelay's SQS messages.
//!
//! A delivery message carries one or more events for one subscription, with the attempt count
//! and times they share, so one SQS request moves many events. Its `not_before` lets a wait
//! longer than SQS's 15-minute delay cap run as several hops. A dead-letter message carries the
//! records to write for one subscription and where to write them.
//!
//! Every body on the delivery queue is a [`DeliveryQueueMessage`], tagged with its kind; every
//! delivery message is made by [`DeliveryMessage::packed`] from the [`DeliveryHistory`] its
//! events share.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::classify::DeliveryOutcome;
use crate::decision::DeadLetterReason;
use crate::schema::DeliverySchema;
use crate::subscription::{DeadLetterDestination, Handshake, Subscription};
use crate::validation::ValidationStep;

/// SQS's limit on one message and on one SendMessageBatch request is 1 MiB (the queues are
/// made with `MaximumMessageSize` 1,048,576); stay under it with room for the SDK's framing.
pub const MAX_MESSAGE_BYTES: usize = 1_048_576 - 8 * 1024;
/// SQS's longest delivery delay (DelaySeconds).
pub const MAX_QUEUE_DELAY: Duration = Duration::from_secs(900);
/// The tag around a delivery message's body: `{"delivery":` and `}`.
const DELIVERY_TAG_BYTES: usize = "{\"delivery\":}".len();

/// One event waiting for delivery, as published.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueuedEvent {
    /// When gridrelay accepted it: TTL counts from here (R5) and L6 reports it.
    pub publish_time: DateTime<Utc>,
    pub event: Box<RawValue>,
    /// This event's last attempt where it differs from its message's: retries of several
    /// batches that fell due at the same time share one message ([`crate::delivery::merge_retries`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<AttemptRecord>,
}

impl QueuedEvent {
    /// An event as fan-out (or redrive) enqueues it: no attempt yet.
    pub fn new(publish_time: DateTime<Utc>, event: Box<RawValue>) -> Self {
        Self {
            publish_time,
            event,
            last_attempt: None,
        }
    }

    /// The same event with `last_attempt` as its own last attempt.
    pub fn with_last_attempt(self, last_attempt: Option<AttemptRecord>) -> Self {
        Self {
            last_attempt,
            ..self
        }
    }

    /// Its last attempt, given its message's.
    pub fn last_attempt_in(&self, history: &DeliveryHistory) -> Option<AttemptRecord> {
        self.last_attempt.or(history.last_attempt)
    }
}

/// The last attempt made for a message's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub time: DateTime<Utc>,
    pub outcome: DeliveryOutcome,
}

/// A delivery queue message: events for one subscription that share an attempt history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryMessage {
    pub topic: String,
    pub subscription: String,
    /// The id of the subscription the events were fanned out to: they are delivered only to
    /// that subscription, not to one created later under the same name.
    #[serde(default)]
    pub subscription_id: String,
    /// The schema the events are in (fan-out converted them to the subscription's).
    #[serde(default)]
    pub schema: DeliverySchema,
    /// Attempts already made for these events.
    pub attempts: u32,
    /// No attempt before this time.
    pub not_before: DateTime<Utc>,
    #[serde(default)]
    pub last_attempt: Option<AttemptRecord>,
    /// R4: the timed-out attempt this message retries; a late success for it cancels the retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out_attempt: Option<String>,
    /// When its events' next attempt is booked to start in the subscription's events-per-second
    /// allowance (`caps::book_events`): it goes then without booking again. `not_before` is up
    /// to a second earlier, so the queue (whole seconds) brings it in time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_booked_at: Option<DateTime<Utc>>,
    /// D1: its events wait because their endpoint's delivery is delayed; one whose time to
    /// live ends meanwhile is dead-lettered with `lastDeliveryOutcome: Probation` (L6).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub probation: bool,
    /// #35: the replay that sent these events again (they are delivered apart from live
    /// traffic, with a `Gridrelay-Replay` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayTag>,
    /// #35: where a redrive took these events back from (a dead-letter object,
    /// `s3://bucket/key`), until their first attempt journals it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redriven_from: Option<String>,
    /// #35: when a redrive sent these events again; it names their delivery in the journal
    /// ([`DeliveryHistory::delivery_name`]) for every step after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redriven_at: Option<DateTime<Utc>>,
    pub events: Vec<QueuedEvent>,
}

/// Which replay sent a delivery (#35), and, until its first attempt, the claim that keeps a
/// second copy of the replay's step from delivering it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayTag {
    /// The replay's name.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ReplayClaim>,
}

/// A replay delivery's claim (`crate::replay::claim_key`): the first message to claim `key`
/// with its `token` is delivered; another copy of the step, with another token, finds it taken
/// and is dropped. A message handed on before its first attempt keeps its claim (and its token,
/// so it finds the claim its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayClaim {
    pub key: String,
    /// Drawn once per run of a step.
    pub token: String,
}

/// What the events of a delivery message share besides themselves: whom they are for and
/// what was tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryHistory {
    pub topic: String,
    pub subscription: String,
    pub subscription_id: String,
    pub schema: DeliverySchema,
    /// Attempts already made.
    pub attempts: u32,
    pub last_attempt: Option<AttemptRecord>,
    /// R4: the timed-out attempt the events wait to retry.
    pub timed_out_attempt: Option<String>,
    /// When the next attempt is booked to start in the subscription's events-per-second
    /// allowance, if it is.
    pub rate_booked_at: Option<DateTime<Utc>>,
    /// D1: the events wait for their endpoint's delay to end.
    pub probation: bool,
    /// #35: the replay that sent them, if one did.
    pub replay: Option<ReplayTag>,
    /// #35: where a redrive took them back from, until their first attempt.
    pub redriven_from: Option<String>,
    /// #35: when a redrive sent them again, if one did.
    pub redriven_at: Option<DateTime<Utc>>,
}

impl DeliveryHistory {
    /// Events new to a subscription: no attempt yet.
    pub fn new(subscription: &Subscription) -> Self {
        Self {
            topic: subscription.topic.clone(),
            subscription: subscription.name.clone(),
            subscription_id: subscription.id.clone(),
            schema: subscription.event_delivery_schema,
            attempts: 0,
            last_attempt: None,
            timed_out_attempt: None,
            rate_booked_at: None,
            probation: false,
            replay: None,
            redriven_from: None,
            redriven_at: None,
        }
    }

    /// #35: the name the journal gives the delivery these events are part of: `replay:<name>`
    /// for a replay's, `redrive:<time>` for a redrive's (the time it sent them again, in
    /// milliseconds), none for their publish's. Every step of a delivery carries it, so an
    /// event sent again while an earlier delivery of it still retries shows each delivery's
    /// own standing.
    pub fn delivery_name(&self) -> Option<String> {
        delivery_name(self.redriven_at, self.replay.as_ref())
    }

    /// The history after one more attempt; `timed_out_attempt` names it if it timed out and
    /// may still be answered (R4).
    pub fn after_attempt(&self, record: AttemptRecord, timed_out_attempt: Option<String>) -> Self {
        Self {
            attempts: self.attempts + 1,
            last_attempt: Some(record),
            timed_out_attempt,
            // The next attempt books its own share.
            rate_booked_at: None,
            probation: false,
            // Claimed at this attempt: what is retried is this message's own.
            replay: self.replay.as_ref().map(|tag| ReplayTag {
                claim: None,
                ..tag.clone()
            }),
            // Journaled with the first attempt.
            redriven_from: None,
            ..self.clone()
        }
    }
}

/// The journal's name of the delivery begun by a redrive at `redriven_at` or by `replay`
/// (the redrive, where both: it sent the events last); none for a publish's.
fn delivery_name(redriven_at: Option<DateTime<Utc>>, replay: Option<&ReplayTag>) -> Option<String> {
    match (redriven_at, replay) {
        (Some(at), _) => Some(crate::journal::redrive_delivery(at)),
        (None, Some(tag)) => Some(crate::journal::replay_delivery(&tag.name)),
        (None, None) => None,
    }
}

impl DeliveryMessage {
    /// The queue it travels on: a replay's deliveries, retries included, on the replay lane.
    pub fn lane(&self) -> Lane {
        if self.replay.is_some() {
            Lane::Replay
        } else {
            Lane::Delivery
        }
    }

    /// The only way delivery messages are made: `events` with their shared history, due at
    /// `not_before`, split into as many messages as the size limit needs.
    pub fn packed(
        history: &DeliveryHistory,
        not_before: DateTime<Utc>,
        events: Vec<QueuedEvent>,
    ) -> Vec<DeliveryMessage> {
        let message = |events| Self::with_history(history, not_before, events);
        let base = DELIVERY_TAG_BYTES + json_len(&message(Vec::new()));
        pack(base, events).into_iter().map(message).collect()
    }

    /// One message of `events` with `history`, due at `not_before` (no size check: see
    /// [`DeliveryMessage::packed`]).
    fn with_history(
        history: &DeliveryHistory,
        not_before: DateTime<Utc>,
        events: Vec<QueuedEvent>,
    ) -> Self {
        DeliveryMessage {
            topic: history.topic.clone(),
            subscription: history.subscription.clone(),
            subscription_id: history.subscription_id.clone(),
            schema: history.schema,
            attempts: history.attempts,
            not_before,
            last_attempt: history.last_attempt,
            timed_out_attempt: history.timed_out_attempt.clone(),
            rate_booked_at: history.rate_booked_at,
            probation: history.probation,
            replay: history.replay.clone(),
            redriven_from: history.redriven_from.clone(),
            redriven_at: history.redriven_at,
            events,
        }
    }

    /// The history its events share.
    pub fn history(&self) -> DeliveryHistory {
        DeliveryHistory {
            topic: self.topic.clone(),
            subscription: self.subscription.clone(),
            subscription_id: self.subscription_id.clone(),
            schema: self.schema,
            attempts: self.attempts,
            last_attempt: self.last_attempt,
            timed_out_attempt: self.timed_out_attempt.clone(),
            rate_booked_at: self.rate_booked_at,
            probation: self.probation,
            replay: self.replay.clone(),
            redriven_from: self.redriven_from.clone(),
            redriven_at: self.redriven_at,
        }
    }

    /// The journal's name of the delivery its events are part of
    /// ([`DeliveryHistory::delivery_name`]).
    pub fn delivery_name(&self) -> Option<String> {
        delivery_name(self.redriven_at, self.replay.as_ref())
    }

    /// The message with no events: its history and due time.
    pub fn clone_without_events(&self) -> Self {
        Self::with_history(&self.history(), self.not_before, Vec::new())
    }

    /// The body to enqueue: `{"delivery":{…}}`.
    pub fn to_body(&self) -> Result<String, serde_json::Error> {
        DeliveryQueueMessage::body_of("delivery", self)
    }
}

/// Every kind of message on the delivery queue, externally tagged (`{"delivery":{…}}`,
/// `{"validation":{…}}`): the tag says what a body is, and serde's external tagging reads raw
/// events without buffering them.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DeliveryQueueMessage {
    Delivery(DeliveryMessage),
    /// A step of a subscription's validation handshake.
    Validation(ValidationTask),
    /// #35: a step of a replay (on the control queue).
    Replay(crate::replay::ReplayStep),
}

impl DeliveryQueueMessage {
    /// Reads a body. A delivery message without the tag (as enqueued before the tag existed)
    /// is still read, so an upgrade loses nothing in flight.
    pub fn from_body(body: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(body).or_else(|tagged| {
            serde_json::from_str::<DeliveryMessage>(body)
                .map(Self::Delivery)
                .map_err(|_| tagged)
        })
    }

    pub fn to_body(&self) -> Result<String, serde_json::Error> {
        match self {
            Self::Delivery(m) => m.to_body(),
            Self::Validation(t) => Self::body_of("validation", t),
            Self::Replay(step) => Self::body_of("replay", step),
        }
    }

    fn body_of(tag: &str, value: &impl Serialize) -> Result<String, serde_json::Error> {
        Ok(format!("{{\"{tag}\":{}}}", serde_json::to_string(value)?))
    }

    /// The queue it travels on.
    pub fn lane(&self) -> Lane {
        match self {
            Self::Delivery(m) => m.lane(),
            Self::Validation(_) | Self::Replay(_) => Lane::Control,
        }
    }
}

/// Which of an installation's queues a message travels on, so one kind of work never waits
/// behind a backlog of another, nor takes its share of `deliver`'s concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lane {
    /// Live deliveries: what was published, its retries and delays.
    Delivery,
    /// Subscriptions' handshake and expiry steps and replays' steps (#34 item 12): light work
    /// that must not wait behind a backlog of deliveries.
    Control,
    /// #35: what replays send again, and its retries: a replay's backlog never delays live
    /// deliveries, and its invocations are capped apart from theirs.
    Replay,
}

/// A handshake step for one subscription, carried on the delivery queue as
/// [`DeliveryQueueMessage::Validation`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationTask {
    pub topic: String,
    pub subscription: String,
    /// The id of the subscription it was asked for: a subscription created again under the
    /// same name is not validated by the old one's task.
    #[serde(default)]
    pub subscription_id: String,
    pub step: ValidationStep,
    /// Whether it validates the subscription's endpoint change rather than the subscription.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub endpoint_change: bool,
    /// A `SubscriptionExpiry` step: the expiration it was asked for. A step whose expiration
    /// is no longer the subscription's ends (the change asked for its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

impl ValidationTask {
    pub fn new(subscription: &Subscription, step: ValidationStep) -> Self {
        Self::of(subscription, step, Handshake::Subscription)
    }

    /// A step of one of the subscription's handshakes.
    pub fn of(subscription: &Subscription, step: ValidationStep, which: Handshake) -> Self {
        Self {
            topic: subscription.topic.clone(),
            subscription: subscription.name.clone(),
            subscription_id: subscription.id.clone(),
            step,
            endpoint_change: which == Handshake::EndpointChange,
            expires_at: None,
        }
    }

    /// The step that deletes the subscription at its expiration `at`.
    pub fn expiry(subscription: &Subscription, at: DateTime<Utc>) -> Self {
        Self {
            expires_at: Some(at),
            ..Self::new(subscription, ValidationStep::SubscriptionExpiry)
        }
    }

    /// Which handshake it is a step of.
    pub fn handshake(&self) -> Handshake {
        if self.endpoint_change {
            Handshake::EndpointChange
        } else {
            Handshake::Subscription
        }
    }

    /// Whether the task was asked for this subscription (not for an earlier one of the same
    /// name).
    pub fn is_for(&self, subscription: &Subscription) -> bool {
        self.subscription_id == subscription.id
    }
}

/// Splits items into groups that each make a message of at most [`MAX_MESSAGE_BYTES`]: `base`
/// is the size of the message with no items, and each item adds its serialized size and a
/// comma. Sizes are those of the real serialized form, not estimates. An item too large for
/// any message goes alone (the limits on events keep that from happening).
fn pack<T: Serialize>(base: usize, items: Vec<T>) -> Vec<Vec<T>> {
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut current: Vec<T> = Vec::new();
    let mut bytes = base;
    for item in items {
        let size = json_len(&item);
        if !current.is_empty() && bytes + 1 + size > MAX_MESSAGE_BYTES {
            groups.push(std::mem::take(&mut current));
            bytes = base;
        }
        bytes += size + usize::from(!current.is_empty());
        current.push(item);
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

/// The length of a value's JSON text, counted without building it.
fn json_len(value: &impl Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        // Cannot happen for these types; a value that cannot be written goes alone.
        Err(_) => MAX_MESSAGE_BYTES,
    }
}

/// What SQS delay to ask for, given how long until a message is due: at most 15 minutes (the
/// rest is another hop), rounded up to whole seconds so a message is never early.
pub fn queue_delay(until_due: Duration) -> Duration {
    whole_seconds_up(until_due.min(MAX_QUEUE_DELAY))
}

/// `d` rounded up to whole seconds (SQS delays and visibility timeouts are whole seconds; a
/// message must never come back early).
pub fn whole_seconds_up(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// One event that reached a terminal failure, with what L6 reports about it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetterEntry {
    pub reason: DeadLetterReason,
    pub delivery_attempts: u32,
    pub last_outcome: Option<DeliveryOutcome>,
    pub publish_time: DateTime<Utc>,
    pub last_attempt_time: Option<DateTime<Utc>>,
    pub event: Box<RawValue>,
}

/// A dead-letter queue message: records for one subscription, and where they go.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetterMessage {
    pub topic: String,
    pub subscription: String,
    /// The id of the subscription the events were for; it names the objects written, so a
    /// redrive sends them only to that subscription, not to another of the same name.
    #[serde(default)]
    pub subscription_id: String,
    /// The schema the events are in: it decides the names of the L6 fields.
    #[serde(default)]
    pub schema: DeliverySchema,
    pub destination: DeadLetterDestination,
    /// When delivery gave up; the object's hour folder comes from it.
    pub dead_lettered_at: DateTime<Utc>,
    /// When a write to the destination first failed (L5 counts four hours from here).
    #[serde(default)]
    pub first_write_failure: Option<DateTime<Utc>>,
    /// #35: the delivery that gave the events up ([`DeliveryHistory::delivery_name`]), which
    /// the journal's entry of their write names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    pub entries: Vec<DeadLetterEntry>,
}

impl DeadLetterMessage {
    pub fn to_body(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    pub fn from_body(body: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(body)
    }
}

/// Splits dead-letter entries into messages under the size limit.
pub fn pack_dead_letter_messages(
    template: &DeadLetterMessage,
    entries: Vec<DeadLetterEntry>,
) -> Vec<DeadLetterMessage> {
    let message = |entries| DeadLetterMessage {
        entries,
        ..template.clone()
    };
    // Sized as the largest the message becomes: L5 records its first write failure on it.
    let base = json_len(&DeadLetterMessage {
        first_write_failure: Some(template.dead_lettered_at),
        ..message(Vec::new())
    });
    pack(base, entries).into_iter().map(message).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(bytes: usize) -> QueuedEvent {
        let text = format!("{{\"d\":\"{}\"}}", "x".repeat(bytes));
        QueuedEvent::new(Utc::now(), RawValue::from_string(text).unwrap())
    }

    fn template() -> DeliveryMessage {
        DeliveryMessage {
            topic: "t".repeat(50),
            subscription: "s".repeat(64),
            subscription_id: "f".repeat(32),
            schema: DeliverySchema::CloudEventSchemaV1_0,
            attempts: 29,
            not_before: Utc::now(),
            last_attempt: Some(AttemptRecord {
                time: Utc::now(),
                outcome: DeliveryOutcome::ResolutionError,
            }),
            timed_out_attempt: Some("0".repeat(36)),
            rate_booked_at: Some(Utc::now()),
            probation: true,
            replay: Some(ReplayTag {
                name: "r".repeat(64),
                claim: Some(ReplayClaim {
                    // With the part's digest, as deliver makes it.
                    key: crate::replay::claim_key(
                        &"t".repeat(50),
                        &"r".repeat(64),
                        u64::MAX,
                        &"f".repeat(32),
                        usize::MAX,
                    ) + "/0123456789abcdef",
                    token: "0".repeat(36),
                }),
            }),
            // The longest dead-letter location: a bucket's 63 characters and S3's longest key.
            redriven_from: Some(format!("s3://{}/{}", "b".repeat(63), "k".repeat(1024))),
            redriven_at: Some(Utc::now()),
            events: vec![],
        }
    }

    /// #11 item 6: the largest event gridrelay takes (as kept, then converted to CloudEvents,
    /// which adds a few fields) fits one delivery message and one dead-letter message with the
    /// longest names, prefix and every optional field, under SQS's 1 MiB.
    #[test]
    fn the_largest_event_fits_one_message_of_each_kind() {
        use crate::limits::MAX_EVENT_BYTES;
        use crate::schema::{InputSchema, to_delivery_form};
        use crate::subscription::MAX_DEAD_LETTER_PREFIX_BYTES;
        let envelope = serde_json::json!({
            "id": "i".repeat(64), "topic": "/t", "subject": "s", "eventType": "t",
            "eventTime": "2026-11-25T00:00:00Z", "dataVersion": "1", "metadataVersion": "1",
            "data": "",
        })
        .to_string();
        let pad = MAX_EVENT_BYTES - envelope.len();
        let text = envelope.replace(r#""data":"""#, &format!(r#""data":"{}""#, "x".repeat(pad)));
        assert_eq!(text.len(), MAX_EVENT_BYTES);
        let kept = RawValue::from_string(text).unwrap();
        let converted = to_delivery_form(
            &kept,
            InputSchema::EventGridSchema,
            DeliverySchema::CloudEventSchemaV1_0,
        )
        .unwrap()
        .into_owned();
        assert!(converted.get().len() > MAX_EVENT_BYTES - 64);
        let t = template();
        let mut event = QueuedEvent::new(Utc::now(), converted);
        event.last_attempt = t.last_attempt;
        let messages = DeliveryMessage::packed(&t.history(), t.not_before, vec![event.clone()]);
        assert_eq!(messages.len(), 1);
        assert!(messages[0].to_body().unwrap().len() <= MAX_MESSAGE_BYTES);

        let mut dead = DeadLetterMessage {
            topic: "t".repeat(50),
            subscription: "s".repeat(64),
            subscription_id: "f".repeat(32),
            schema: DeliverySchema::CloudEventSchemaV1_0,
            destination: DeadLetterDestination {
                bucket: "b".repeat(63),
                prefix: "p".repeat(MAX_DEAD_LETTER_PREFIX_BYTES),
            },
            dead_lettered_at: Utc::now(),
            first_write_failure: Some(Utc::now()),
            // The longest: a replay's, its name as long as a name can be.
            delivery: Some(crate::journal::replay_delivery(&"r".repeat(64))),
            entries: Vec::new(),
        };
        let entry = DeadLetterEntry {
            reason: DeadLetterReason::MaxDeliveryAttemptsExceeded,
            delivery_attempts: 30,
            last_outcome: Some(DeliveryOutcome::ResolutionError),
            publish_time: Utc::now(),
            last_attempt_time: Some(Utc::now()),
            event: event.event,
        };
        let packed = pack_dead_letter_messages(&dead, vec![entry]);
        assert_eq!(packed.len(), 1);
        dead.entries = packed.into_iter().next().unwrap().entries;
        assert!(dead.to_body().unwrap().len() <= MAX_MESSAGE_BYTES);
    }

    proptest! {
        /// Every message body stays under the SQS limit and no event is lost or reordered.
        #[test]
        fn packed_messages_fit_sqs(sizes in proptest::collection::vec(0usize..150_000, 0..20)) {
            let events: Vec<QueuedEvent> = sizes.iter().map(|&s| event(s)).collect();
            let ids: Vec<String> = events.iter().map(|e| e.event.get().to_string()).collect();
            let t = template();
            let msgs = DeliveryMessage::packed(&t.history(), t.not_before, events);
            let mut seen = Vec::new();
            for m in &msgs {
                prop_assert!(m.to_body().unwrap().len() <= MAX_MESSAGE_BYTES);
                seen.extend(m.events.iter().map(|e| e.event.get().to_string()));
            }
            prop_assert_eq!(seen, ids);
        }

        /// Thousands of small events: the packing is exact, so every message fits and every
        /// message but the last is full (the next event would not have fit).
        #[test]
        fn many_small_events_fill_messages_exactly(sizes in proptest::collection::vec(0usize..400, 1..4_000)) {
            let events: Vec<QueuedEvent> = sizes.iter().map(|&s| event(s)).collect();
            let count = events.len();
            let t = template();
            let msgs = DeliveryMessage::packed(&t.history(), t.not_before, events);
            prop_assert_eq!(msgs.iter().map(|m| m.events.len()).sum::<usize>(), count);
            for pair in msgs.windows(2) {
                let body = pair[0].to_body().unwrap();
                prop_assert!(body.len() <= MAX_MESSAGE_BYTES);
                let next = serde_json::to_string(&pair[1].events[0]).unwrap();
                prop_assert!(body.len() + 1 + next.len() > MAX_MESSAGE_BYTES);
            }
            prop_assert!(msgs.last().unwrap().to_body().unwrap().len() <= MAX_MESSAGE_BYTES);
        }

        /// Dead-letter messages are sized from their real serialized form, for every reason and
        /// outcome and thousands of entries, including after L5 records its first write
        /// failure on them: none exceeds the queue's limit, and no entry is lost.
        #[test]
        fn dead_letter_messages_fit_sqs(
            entries in proptest::collection::vec((0usize..2_000, any::<bool>(), 0usize..14), 1..3_000),
            large in proptest::collection::vec(100_000usize..200_000, 0..4),
        ) {
            let outcomes = [
                None,
                Some(DeliveryOutcome::Succeeded),
                Some(DeliveryOutcome::BadRequest),
                Some(DeliveryOutcome::Unauthorized),
                Some(DeliveryOutcome::Forbidden),
                Some(DeliveryOutcome::NotFound),
                Some(DeliveryOutcome::TimedOut),
                Some(DeliveryOutcome::PayloadTooLarge),
                Some(DeliveryOutcome::Busy),
                Some(DeliveryOutcome::SocketError),
                Some(DeliveryOutcome::ResolutionError),
                Some(DeliveryOutcome::Probation),
                Some(DeliveryOutcome::Delivering),
                Some(DeliveryOutcome::GenericError),
            ];
            let now = Utc::now();
            let mut all: Vec<DeadLetterEntry> = entries
                .iter()
                .map(|&(bytes, expired, outcome)| DeadLetterEntry {
                    reason: if expired {
                        DeadLetterReason::TimeToLiveExceeded
                    } else {
                        DeadLetterReason::MaxDeliveryAttemptsExceeded
                    },
                    delivery_attempts: 30,
                    last_outcome: outcomes[outcome],
                    publish_time: now,
                    last_attempt_time: Some(now),
                    event: event(bytes).event,
                })
                .collect();
            all.extend(large.iter().map(|&bytes| DeadLetterEntry {
                reason: DeadLetterReason::MaxDeliveryAttemptsExceeded,
                delivery_attempts: 1,
                last_outcome: Some(DeliveryOutcome::PayloadTooLarge),
                publish_time: now,
                last_attempt_time: None,
                event: event(bytes).event,
            }));
            let count = all.len();
            let template = DeadLetterMessage {
                topic: "t".repeat(50),
                subscription: "s".repeat(64),
                subscription_id: "f".repeat(32),
                schema: DeliverySchema::CloudEventSchemaV1_0,
                destination: DeadLetterDestination { bucket: "b".repeat(63), prefix: "p".repeat(200) },
                dead_lettered_at: now,
                first_write_failure: None,
                delivery: None,
                entries: Vec::new(),
            };
            let msgs = pack_dead_letter_messages(&template, all);
            prop_assert_eq!(msgs.iter().map(|m| m.entries.len()).sum::<usize>(), count);
            for mut m in msgs {
                m.first_write_failure = Some(now);
                prop_assert!(m.to_body().unwrap().len() <= MAX_MESSAGE_BYTES);
            }
        }
    }

    #[test]
    fn queue_delay_rounds_up_and_caps_at_15_minutes() {
        assert_eq!(
            queue_delay(Duration::from_millis(200)),
            Duration::from_secs(1)
        );
        assert_eq!(queue_delay(Duration::ZERO), Duration::ZERO);
        assert_eq!(
            queue_delay(Duration::from_secs(3600)),
            Duration::from_secs(900)
        );
        assert_eq!(
            queue_delay(Duration::from_secs(10)),
            Duration::from_secs(10)
        );
    }

    fn delivery(body: &str) -> DeliveryMessage {
        match DeliveryQueueMessage::from_body(body).unwrap() {
            DeliveryQueueMessage::Delivery(m) => m,
            other => panic!("expected a delivery message, got {other:?}"),
        }
    }

    #[test]
    fn delivery_message_round_trips_raw_events() {
        let mut m = template();
        m.events = vec![event(3)];
        let body = m.to_body().unwrap();
        assert!(body.starts_with("{\"delivery\":{"), "{body}");
        let back = delivery(&body);
        assert_eq!(back.events[0].event.get(), m.events[0].event.get());
        assert_eq!(back.history(), m.history());
    }

    /// The tag tells a handshake step from a delivery; an untagged delivery body (enqueued
    /// before the tag) still reads as a delivery; a body of neither kind is an error.
    #[test]
    fn queue_messages_are_told_apart_by_their_tag() {
        let task = ValidationTask {
            topic: "t".into(),
            subscription: "s".into(),
            subscription_id: "0123".into(),
            step: ValidationStep::Expire,
            endpoint_change: false,
            expires_at: None,
        };
        let body = DeliveryQueueMessage::Validation(task.clone())
            .to_body()
            .unwrap();
        assert!(matches!(
            DeliveryQueueMessage::from_body(&body).unwrap(),
            DeliveryQueueMessage::Validation(t) if t == task
        ));
        let mut m = template();
        m.events = vec![event(3)];
        let legacy = serde_json::to_string(&m).unwrap();
        assert_eq!(delivery(&legacy).history(), m.history());
        let err = DeliveryQueueMessage::from_body(r#"{"other":{}}"#).unwrap_err();
        assert!(err.to_string().contains("unknown variant"), "{err}");
    }

    /// One constructor: a new history has no attempt; after one it counts it and keeps the
    /// record and the timed-out attempt's name.
    #[test]
    fn history_counts_attempts() {
        let first = template().history();
        let record = AttemptRecord {
            time: Utc::now(),
            outcome: DeliveryOutcome::TimedOut,
        };
        let next = first.after_attempt(record, Some("a".into()));
        assert_eq!(next.attempts, first.attempts + 1);
        assert_eq!(next.last_attempt, Some(record));
        assert_eq!(next.timed_out_attempt.as_deref(), Some("a"));
        assert_eq!(next.subscription, first.subscription);
    }
}
