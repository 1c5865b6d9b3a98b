//! The delivery journal (#35): every step of an event's life, as one JSON line per step.
//!
//! `deliver` writes what it learns in one invocation (an event reaching a subscription's
//! delivery for the first time, each attempt and what was decided after it, events held back)
//! in one call, packed by [`pack_records`] into as few records as fit. The lines land in object storage (Amazon Data Firehose into
//! S3 on AWS and locally), one object holding many lines, so the journal is queried with the
//! tools AWS users know (Athena, or by reading an hour's objects), and [`EventLife`] reads an
//! event's whole life back from them.
//!
//! An entry is small: an attempt of one event to a typical endpoint is under 320 bytes
//! ([`ATTEMPT_ENTRY_BUDGET`]); an attempt of a batch lists its events' ids once.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::classify::{AttemptResult, DeliveryOutcome};
use crate::delivery::{GiveUp, Settlement};
use crate::destination::RoutingFields;
use crate::message::{
    DeadLetterEntry, DeadLetterMessage, DeliveryHistory, DeliveryMessage, QueuedEvent,
};
use crate::outbound::redact_endpoint;
use crate::schema::DeliverySchema;
use crate::subscription::Subscription;

/// The bytes a typical attempt entry stays under: one event with a 36-character id, a
/// 50-character endpoint, a status and the retry it was given (two times take 48 bytes of it).
/// With the event's [`Step::Fanned`] entry (about 170 bytes), the ten one-event messages of an
/// invocation fill one of the 5 KB steps Firehose bills records in.
pub const ATTEMPT_ENTRY_BUDGET: usize = 320;

/// Where the journal's objects are in its bucket: below this, the stream's hour prefix
/// ([`hour_prefix`]).
pub const JOURNAL_PREFIX: &str = "journal/";

/// The most characters of an event's `type` and `subject` a [`Step::Fanned`] entry keeps, so
/// one entry always fits a record.
pub const MAX_FIELD_CHARS: usize = 256;

/// The largest record [`pack_records`] makes: under Firehose's 1,000 KiB a record.
pub const MAX_RECORD_BYTES: usize = 1_000 * 1024 - 1024;

/// One step of the life of one or more events (a batch's, for an attempt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub topic: String,
    /// The subscription the step is for.
    pub subscription: String,
    /// The events' ids (each event's `id`; empty for a custom-schema event without one).
    pub ids: Vec<String>,
    /// When the step happened (an attempt: when its request was sent; [`Step::Fanned`]: when
    /// the event was published).
    #[serde(with = "millis")]
    pub time: DateTime<Utc>,
    /// The delivery the step is part of, where the events were sent again after their
    /// publish: `replay:<name>` or `redrive:<time>` ([`replay_delivery`], [`redrive_delivery`]);
    /// none for their publish's. An event sent again while an earlier delivery of it still
    /// retries has each delivery's steps told apart by it ([`DeliveryLife`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    #[serde(flatten)]
    pub step: Step,
}

/// The name of replay `name`'s delivery of an event ([`JournalEntry::delivery`]).
pub fn replay_delivery(name: &str) -> String {
    format!("replay:{name}")
}

/// The name of the delivery a redrive began at `at` ([`JournalEntry::delivery`]): the time in
/// milliseconds, as the journal writes times.
pub fn redrive_delivery(at: DateTime<Utc>) -> String {
    format!(
        "redrive:{}",
        at.to_rfc3339_opts(SecondsFormat::Millis, true)
    )
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// The events were published (accepted at the topic) at the entry's time and fanned out to
    /// this subscription; written when they reach its delivery for the first time.
    Fanned {
        /// The event's type (`eventType`, or CloudEvents' `type`).
        #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
        event_type: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        subject: String,
        /// The event's size as delivered, in bytes.
        bytes: u64,
        /// The replay that sent it again (#35): the attempts after this entry are the
        /// replay's delivery, with numbers from 1 again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replay: Option<String>,
        /// Where a redrive took it back from (#35; a dead-letter object, `s3://bucket/key`;
        /// or, #36, `the topic's archive`: a dropped event the portal sent again):
        /// the attempts after this entry are the redriven delivery's, with numbers from 1
        /// again, and the entry's time is the redrive's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        redrive: Option<String>,
    },
    /// A request (or an AWS resource's call) was made, or failed to be made.
    Attempt(Attempt),
    /// The events wait without an attempt until `until`.
    Held {
        #[serde(with = "millis")]
        until: DateTime<Utc>,
        reason: HeldReason,
    },
    /// The dead-letter function wrote the events to `location` (`s3://bucket/key`).
    DeadLettered { location: String },
    /// The events were dropped, kept nowhere: their dead-letter location was unavailable for
    /// four hours (L5), or their subscription was deleted, replaced or does not receive events
    /// when they came due.
    Dropped { reason: String },
    /// Attempt `attempt`, which had timed out, was answered with success after all, so its
    /// retry was not sent (R4): the events are delivered.
    LateSuccess { attempt: u32 },
    /// The events were given up without another attempt: their time to live ended while they
    /// waited (R6). `next` says where they went.
    GaveUp {
        #[serde(flatten)]
        next: Next,
    },
}

/// One attempt and what was decided after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// Its number among the events' attempts, from 1.
    pub attempt: u32,
    /// How long it took, sent to answered (or given up), in milliseconds.
    pub ms: u64,
    /// The endpoint, redacted as everywhere (`crate::outbound::redact_endpoint`).
    pub endpoint: String,
    /// The HTTP status, where the endpoint answered with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub outcome: DeliveryOutcome,
    /// What the endpoint's `Retry-After` asked for, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    /// Why no answer came, or none was asked for (a connection refused, a name not resolved,
    /// a secret header not read), as the attempt's log line says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The first bytes of the answer's body (`journalAnswerBytes` of them at most; none by
    /// an AWS resource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    #[serde(flatten)]
    pub next: Next,
}

/// What was decided for the events after an attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "next", rename_all = "snake_case")]
pub enum Next {
    Delivered,
    /// Attempted again at `due`.
    Retry {
        #[serde(with = "millis")]
        due: DateTime<Utc>,
    },
    /// Handed to the dead-letter function, for the subscription's dead-letter location.
    DeadLetter {
        reason: String,
    },
    /// Given up with no dead-letter location: dropped and counted (L1).
    Drop {
        reason: String,
    },
}

/// Why events wait without an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeldReason {
    /// D1, R3: their endpoint's delivery is delayed.
    EndpointDelayed,
    /// The subscription's caps left no room now.
    Capped,
    /// The invocation's deadline came first: handed on to the next one.
    Deadline,
}

impl Next {
    /// What a settlement decided for the events of an attempt.
    pub fn after(settlement: &Settlement) -> Self {
        match settlement {
            Settlement::Delivered { .. } => Self::Delivered,
            Settlement::Retry(retry) => Self::Retry { due: retry.at },
            Settlement::GaveUp(give_up) => Self::given_up(give_up),
        }
    }

    /// Where given-up events went.
    pub fn given_up(give_up: &GiveUp) -> Self {
        match give_up {
            GiveUp::DeadLetter { messages, .. } => Self::DeadLetter {
                reason: messages
                    .iter()
                    .flat_map(|m| m.entries.first())
                    .map(|e| e.reason.to_string())
                    .next()
                    .unwrap_or_default(),
            },
            GiveUp::Drop { entries } => Self::Drop {
                reason: entries
                    .first()
                    .map(|e| e.reason.to_string())
                    .unwrap_or_default(),
            },
        }
    }
}

/// How many bytes of an answer's body an attempt entry may keep (`journalAnswerBytes`).
pub const ANSWER_BYTES: std::ops::RangeInclusive<i64> = 0..=1024;
/// What a subscription keeps unless told: enough for an error's first words, little enough
/// that an attempt entry stays small and holds little of what an endpoint says.
pub const DEFAULT_ANSWER_BYTES: u16 = 64;

/// Checks a subscription's `journalAnswerBytes`.
pub fn validate_answer_bytes(bytes: Option<i64>) -> Result<Option<u16>, crate::limits::LimitError> {
    match bytes {
        None => Ok(None),
        Some(n) if ANSWER_BYTES.contains(&n) => Ok(u16::try_from(n).ok()),
        Some(n) => Err(crate::limits::LimitError::new(
            "journalAnswerBytes",
            n,
            format!(
                "{} to {} (0 keeps none)",
                ANSWER_BYTES.start(),
                ANSWER_BYTES.end()
            ),
        )),
    }
}

impl Subscription {
    /// How many bytes of each answer's body its attempts' entries keep.
    pub fn answer_bytes_kept(&self) -> usize {
        usize::from(self.journal_answer_bytes.unwrap_or(DEFAULT_ANSWER_BYTES))
    }
}

/// The first bytes of an answer's body as an entry keeps them: text (bytes that are not
/// UTF-8 replaced), empty for none.
pub fn answer_text(bytes: &[u8]) -> Option<String> {
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(bytes).into_owned())
}

/// What the journal records of one attempt, besides what came after it.
#[derive(Debug)]
pub struct AttemptFacts<'a> {
    pub subscription: &'a Subscription,
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// When the request was sent, and when it was answered (or given up).
    pub sent: DateTime<Utc>,
    pub answered: DateTime<Utc>,
    pub result: &'a AttemptResult,
    pub retry_after: Option<std::time::Duration>,
    /// The first bytes of the answer's body, as many as the subscription keeps.
    pub answer: Option<String>,
    /// The delivery the attempt is part of ([`JournalEntry::delivery`]).
    pub delivery: Option<String>,
}

/// The entry of an attempt of events with `ids`, and what came `next`.
pub fn attempt_entry(facts: AttemptFacts<'_>, ids: Vec<String>, next: Next) -> JournalEntry {
    let (status, error) = match facts.result {
        AttemptResult::Status(code) => (Some(*code), None),
        AttemptResult::TimedOut => (None, None),
        AttemptResult::ConnectionFailed(why)
        | AttemptResult::Unresolved(why)
        | AttemptResult::Refused(why)
        | AttemptResult::NotSent(why)
        | AttemptResult::TokenUnavailable(why) => (None, Some(why.clone())),
        AttemptResult::Service(failure) => (Some(failure.status), Some(failure.code.clone())),
    };
    JournalEntry {
        topic: facts.subscription.topic.clone(),
        subscription: facts.subscription.name.clone(),
        ids,
        time: facts.sent,
        delivery: facts.delivery,
        step: Step::Attempt(Attempt {
            attempt: facts.attempt,
            ms: (facts.answered - facts.sent).num_milliseconds().max(0) as u64,
            endpoint: if facts.subscription.endpoint_type.is_resource() {
                // An ARN: it holds no secret.
                facts.subscription.endpoint.clone()
            } else {
                redact_endpoint(&facts.subscription.endpoint)
            },
            status,
            outcome: DeliveryOutcome::of(facts.result),
            retry_after_s: facts.retry_after.map(|d| d.as_secs()),
            error,
            answer: facts.answer,
            next,
        }),
    }
}

/// What the journal reads of an event in `schema`: its id (empty for a custom-schema event
/// without one), type and subject.
pub fn event_fields(event: &QueuedEvent, schema: DeliverySchema) -> RoutingFields {
    RoutingFields::of(&event.event, schema)
}

/// Who sent a delivery of an event, besides its publish: a replay (its name), or a redrive
/// (where it took the event back from); and the delivery's name ([`JournalEntry::delivery`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SentBy<'a> {
    pub replay: Option<&'a str>,
    pub redrive: Option<&'a str>,
    pub delivery: Option<&'a str>,
}

/// The entry saying `event` (with its `fields`) was published and fanned out to
/// `subscription` (or, as `sent_by` says, sent again by a replay or a redrive).
pub fn fanned_entry(
    subscription: &Subscription,
    event: &QueuedEvent,
    fields: RoutingFields,
    sent_by: SentBy<'_>,
) -> JournalEntry {
    JournalEntry {
        topic: subscription.topic.clone(),
        subscription: subscription.name.clone(),
        ids: vec![fields.id],
        time: event.publish_time,
        delivery: sent_by.delivery.map(str::to_string),
        step: Step::Fanned {
            event_type: clipped(fields.event_type),
            subject: clipped(fields.subject),
            bytes: event.event.get().len() as u64,
            replay: sent_by.replay.map(str::to_string),
            redrive: sent_by.redrive.map(str::to_string),
        },
    }
}

/// `text`, cut to [`MAX_FIELD_CHARS`] characters.
fn clipped(text: String) -> String {
    match text.char_indices().nth(MAX_FIELD_CHARS) {
        Some((end, _)) => text[..end].to_string(),
        None => text,
    }
}

/// The entry saying events with `ids` of `subscription`'s `delivery` wait without an attempt
/// until `until`.
pub fn held_entry(
    subscription: &Subscription,
    ids: Vec<String>,
    delivery: Option<String>,
    now: DateTime<Utc>,
    (until, reason): (DateTime<Utc>, HeldReason),
) -> JournalEntry {
    JournalEntry {
        topic: subscription.topic.clone(),
        subscription: subscription.name.clone(),
        ids,
        time: now,
        delivery,
        step: Step::Held { until, reason },
    }
}

/// Where the events of a subscription stand after the steps the journal holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum Standing {
    /// Fanned out, no attempt recorded yet.
    Waiting,
    /// An attempt was answered with success (B5), or a timed-out one after all (R4).
    Delivered {
        #[serde(with = "millis")]
        at: DateTime<Utc>,
    },
    /// The next attempt is due then.
    RetryDue {
        #[serde(with = "millis")]
        at: DateTime<Utc>,
    },
    /// Held without an attempt until then.
    Held {
        #[serde(with = "millis")]
        until: DateTime<Utc>,
        reason: HeldReason,
    },
    /// Given up, on its way to the dead-letter location.
    DeadLettering { reason: String },
    /// Written to the dead-letter location.
    DeadLettered { location: String },
    /// Dropped and kept nowhere: given up with no dead-letter location (L1), its dead-letter
    /// location unavailable for four hours (L5), or its subscription gone when it came due.
    Dropped { reason: String },
}

/// One subscription's part of an event's life.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionLife {
    pub subscription: String,
    /// Every step, in the order they happened.
    pub steps: Vec<JournalEntry>,
    /// Where the latest delivery stands (its publish's, or the latest replay's or redrive's).
    pub standing: Standing,
    /// Each delivery of the event to the subscription, in the order they began: its
    /// publish's, then each replay's and redrive's. More than one may be under way at once.
    pub deliveries: Vec<DeliveryLife>,
}

/// One delivery of an event to a subscription and where it stands on its own steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryLife {
    /// Its name ([`JournalEntry::delivery`]); none for the publish's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// When it began: its first step's time.
    #[serde(with = "millis")]
    pub since: DateTime<Utc>,
    pub standing: Standing,
}

/// An event's life, subscription by subscription, as the journal has it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventLife {
    pub topic: String,
    pub id: String,
    pub subscriptions: Vec<SubscriptionLife>,
}

impl EventLife {
    /// The life of event `id` of `topic` in `entries` (any order; an entry written twice, as a
    /// redelivered invocation writes it, counts once).
    pub fn of<'a>(
        topic: &str,
        id: &str,
        entries: impl IntoIterator<Item = &'a JournalEntry>,
    ) -> Self {
        let mut by_subscription: BTreeMap<&str, Vec<&JournalEntry>> = BTreeMap::new();
        for entry in entries {
            if entry.topic == topic && entry.ids.iter().any(|i| i == id) {
                by_subscription
                    .entry(entry.subscription.as_str())
                    .or_default()
                    .push(entry);
            }
        }
        let subscriptions = by_subscription
            .into_iter()
            .map(|(subscription, mut steps)| {
                steps.sort_by_key(|e| (e.time, step_order(&e.step)));
                once_each(&mut steps);
                let deliveries: Vec<DeliveryLife> = deliveries_of(&steps)
                    .iter()
                    .filter_map(|d| {
                        Some(DeliveryLife {
                            delivery: delivery_name_of(d.first()?),
                            since: d.first()?.time,
                            standing: standing(d),
                        })
                    })
                    .collect();
                SubscriptionLife {
                    subscription: subscription.to_string(),
                    standing: deliveries
                        .last()
                        .map_or(Standing::Waiting, |d| d.standing.clone()),
                    deliveries,
                    steps: steps
                        .into_iter()
                        .map(|e| JournalEntry {
                            ids: vec![id.to_string()],
                            ..e.clone()
                        })
                        .collect(),
                }
            })
            .collect();
        Self {
            topic: topic.to_string(),
            id: id.to_string(),
            subscriptions,
        }
    }
}

/// The attempts of `subscription` of `topic` in `entries`, newest first (each once), only the
/// failed ones (any but a success) if `failed`, at most `top`.
pub fn latest_attempts<'a>(
    entries: impl IntoIterator<Item = &'a JournalEntry>,
    topic: &str,
    subscription: &str,
    failed: bool,
    top: usize,
) -> Vec<&'a JournalEntry> {
    let mut attempts: Vec<&JournalEntry> = entries
        .into_iter()
        .filter(|e| e.topic == topic && e.subscription == subscription)
        .filter(|e| match &e.step {
            Step::Attempt(a) => !failed || a.outcome != DeliveryOutcome::Succeeded,
            _ => false,
        })
        .collect();
    attempts.sort_by_key(|e| std::cmp::Reverse(e.time));
    once_each(&mut attempts);
    attempts.truncate(top);
    attempts
}

/// #36: an event whose latest delivery to a subscription ended without it, kept nowhere: given
/// up with no dead-letter destination (L1), its dead-letter location unavailable for four
/// hours (L5), or dropped when it came due. What the portal sends again from the topic's
/// archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedEvent {
    pub id: String,
    /// Why, as the journal says it.
    pub reason: String,
    pub dropped_at: DateTime<Utc>,
    /// When it was published, where the entries hold its publish's fan-out.
    pub published: Option<DateTime<Utc>>,
    /// Its earliest entry of those read.
    pub first_seen: DateTime<Utc>,
    /// Its last attempt's HTTP status, where one answered with one.
    pub last_status: Option<u16>,
}

/// The events of `subscription` of `topic` whose latest delivery in `entries` was dropped
/// ([`DroppedEvent`]), the latest dropped first. An event without an id is left out: nothing
/// could find it again.
pub fn dropped_events<'a>(
    entries: impl IntoIterator<Item = &'a JournalEntry>,
    topic: &str,
    subscription: &str,
) -> Vec<DroppedEvent> {
    let mut by_id: BTreeMap<&str, Vec<&JournalEntry>> = BTreeMap::new();
    for entry in entries {
        if entry.topic == topic && entry.subscription == subscription {
            for id in entry.ids.iter().filter(|id| !id.is_empty()) {
                by_id.entry(id.as_str()).or_default().push(entry);
            }
        }
    }
    let mut dropped: Vec<DroppedEvent> = by_id
        .into_iter()
        .filter_map(|(id, mut steps)| {
            steps.sort_by_key(|e| (e.time, step_order(&e.step)));
            once_each(&mut steps);
            let latest = deliveries_of(&steps).pop()?;
            let Standing::Dropped { reason } = standing(&latest) else {
                return None;
            };
            let published = steps.iter().find_map(|e| match &e.step {
                Step::Fanned {
                    replay: None,
                    redrive: None,
                    ..
                } => Some(e.time),
                _ => None,
            });
            // The latest delivery's: an earlier one may still be retrying.
            let last_status = latest.iter().rev().find_map(|e| match &e.step {
                Step::Attempt(a) => Some(a.status),
                _ => None,
            });
            Some(DroppedEvent {
                id: id.to_string(),
                reason,
                dropped_at: latest.last()?.time,
                published,
                first_seen: steps.first()?.time,
                last_status: last_status.flatten(),
            })
        })
        .collect();
    dropped.sort_by_key(|d| std::cmp::Reverse(d.dropped_at));
    dropped
}

/// The deliveries `steps` (in order, each once) hold, each its steps, in the order they began.
/// A fan-out begins one; any other step joins the latest begun before it that it is part of
/// ([`part_of`]), or begins one if none is (its fan-out not read: before the span read, or
/// not written). So entries written before deliveries were named split at each fan-out, as
/// they did then.
fn deliveries_of<'a>(steps: &[&'a JournalEntry]) -> Vec<Vec<&'a JournalEntry>> {
    let mut deliveries: Vec<Vec<&JournalEntry>> = Vec::new();
    for &step in steps {
        let fanned = matches!(step.step, Step::Fanned { .. });
        let joins = (!fanned)
            .then(|| {
                deliveries
                    .iter_mut()
                    .rev()
                    .find(|d| d.first().is_some_and(|first| part_of(step, first)))
            })
            .flatten();
        match joins {
            Some(delivery) => delivery.push(step),
            // The publish's delivery, its fan-out not read: it began before any sent again.
            None if !fanned && step.delivery.is_none() => deliveries.insert(0, vec![step]),
            None => deliveries.push(vec![step]),
        }
    }
    deliveries
}

/// Whether `step` is part of the delivery that begins with `first`: a named step, of the
/// delivery of its name (one begun by an entry written before deliveries were named
/// included, as a replay under way across the upgrade is); an unnamed one, of a delivery
/// begun by an unnamed entry.
fn part_of(step: &JournalEntry, first: &JournalEntry) -> bool {
    match &step.delivery {
        Some(name) => delivery_name_of(first).as_ref() == Some(name),
        None => first.delivery.is_none(),
    }
}

/// The name of the delivery that begins with `first`: its own, or, for an entry written
/// before deliveries were named, its fan-out's replay or redrive.
fn delivery_name_of(first: &JournalEntry) -> Option<String> {
    first.delivery.clone().or_else(|| match &first.step {
        Step::Fanned {
            replay: Some(name), ..
        } => Some(replay_delivery(name)),
        Step::Fanned {
            redrive: Some(_), ..
        } => Some(redrive_delivery(first.time)),
        _ => None,
    })
}

/// Keeps the first of entries written more than once (a redelivered message's invocation
/// writes the same lines again).
fn once_each(entries: &mut Vec<&JournalEntry>) {
    let mut seen = std::collections::HashSet::new();
    entries.retain(|e| seen.insert(line_of(e)));
}

/// The hours (each its first instant) from the one `from` is in to the one `to` is in: those
/// whose objects hold what was written between them. None if `to` is before `from`.
pub fn hours_between(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    use chrono::{DurationRound, TimeDelta};
    let hour = TimeDelta::hours(1);
    let (Ok(first), Ok(last)) = (from.duration_trunc(hour), to.duration_trunc(hour)) else {
        return Vec::new();
    };
    let count = (last - first).num_hours();
    (0..=count).map(|h| first + TimeDelta::hours(h)).collect()
}

/// Steps at the same millisecond in the order they happen.
pub(crate) fn step_order(step: &Step) -> u8 {
    match step {
        Step::Fanned { .. } => 0,
        Step::Held { .. } => 1,
        Step::Attempt(_) => 2,
        Step::LateSuccess { .. } | Step::GaveUp { .. } => 3,
        Step::DeadLettered { .. } => 4,
        Step::Dropped { .. } => 5,
    }
}

/// The entry saying the events of `give_up` (of a delivery with `history`) of `subscription`
/// were given up at `now` without another attempt (R6).
pub fn gave_up_entry(
    subscription: &Subscription,
    history: &DeliveryHistory,
    give_up: &GiveUp,
    now: DateTime<Utc>,
) -> JournalEntry {
    let schema = history.schema;
    let ids = match give_up {
        GiveUp::DeadLetter { messages, .. } => {
            dead_letter_ids(messages.iter().flat_map(|m| &m.entries), schema)
        }
        GiveUp::Drop { entries } => dead_letter_ids(entries, schema),
    };
    JournalEntry {
        topic: subscription.topic.clone(),
        subscription: subscription.name.clone(),
        ids,
        time: now,
        delivery: history.delivery_name(),
        step: Step::GaveUp {
            next: Next::given_up(give_up),
        },
    }
}

/// The entry saying `events` (in `schema`, of `delivery`) fanned out to `subscription` of
/// `topic` were dropped at `now`, never sent: `reason` says why (the subscription was deleted,
/// replaced, or does not receive events).
pub fn not_deliverable_entry(
    (topic, subscription): (&str, &str),
    schema: DeliverySchema,
    events: &[QueuedEvent],
    delivery: Option<String>,
    now: DateTime<Utc>,
    reason: &str,
) -> JournalEntry {
    JournalEntry {
        topic: topic.to_string(),
        subscription: subscription.to_string(),
        ids: queued_ids(events, schema),
        time: now,
        delivery,
        step: Step::Dropped {
            reason: reason.to_string(),
        },
    }
}

/// The entry saying the timed-out attempt of `message` was answered with success after all at
/// `answered`, so its retry was not sent (R4).
pub fn late_success_entry(message: &DeliveryMessage, answered: DateTime<Utc>) -> JournalEntry {
    JournalEntry {
        topic: message.topic.clone(),
        subscription: message.subscription.clone(),
        ids: queued_ids(&message.events, message.schema),
        time: answered,
        delivery: message.delivery_name(),
        step: Step::LateSuccess {
            attempt: message.attempts,
        },
    }
}

/// The entry saying what became of the events of dead-letter `message` at `at`: written
/// ([`Step::DeadLettered`]) or dropped ([`Step::Dropped`]).
pub fn dead_letter_entry(
    message: &DeadLetterMessage,
    at: DateTime<Utc>,
    step: Step,
) -> JournalEntry {
    JournalEntry {
        topic: message.topic.clone(),
        subscription: message.subscription.clone(),
        ids: dead_letter_ids(&message.entries, message.schema),
        time: at,
        delivery: message.delivery.clone(),
        step,
    }
}

/// The ids of queued `events` in `schema`.
fn queued_ids(events: &[QueuedEvent], schema: DeliverySchema) -> Vec<String> {
    events.iter().map(|e| event_fields(e, schema).id).collect()
}

/// The ids of the events of dead-letter `entries` in `schema`.
fn dead_letter_ids<'a>(
    entries: impl IntoIterator<Item = &'a DeadLetterEntry>,
    schema: DeliverySchema,
) -> Vec<String> {
    entries
        .into_iter()
        .map(|e| RoutingFields::of(&e.event, schema).id)
        .collect()
}

/// Where a subscription's copy stands after `steps` (in order): a success or a dead-letter
/// write ends its life whatever a redelivered copy did after; otherwise the last step says.
fn standing<E: std::borrow::Borrow<JournalEntry>>(steps: &[E]) -> Standing {
    let delivered = steps.iter().map(E::borrow).find_map(|e| match &e.step {
        Step::Attempt(Attempt {
            next: Next::Delivered,
            ..
        })
        | Step::LateSuccess { .. } => Some(e.time),
        _ => None,
    });
    if let Some(at) = delivered {
        return Standing::Delivered { at };
    }
    let written = steps.iter().map(E::borrow).find_map(|e| match &e.step {
        Step::DeadLettered { location } => Some(location.clone()),
        _ => None,
    });
    if let Some(location) = written {
        return Standing::DeadLettered { location };
    }
    match steps.last().map(|e| &e.borrow().step) {
        None
        | Some(Step::Fanned { .. })
        | Some(Step::DeadLettered { .. })
        | Some(Step::LateSuccess { .. }) => Standing::Waiting,
        Some(Step::Dropped { reason }) => Standing::Dropped {
            reason: reason.clone(),
        },
        Some(Step::Held { until, reason }) => Standing::Held {
            until: *until,
            reason: *reason,
        },
        Some(Step::Attempt(Attempt { next, .. }) | Step::GaveUp { next }) => match next {
            Next::Delivered => Standing::Waiting,
            Next::Retry { due } => Standing::RetryDue { at: *due },
            Next::DeadLetter { reason } => Standing::DeadLettering {
                reason: reason.clone(),
            },
            Next::Drop { reason } => Standing::Dropped {
                reason: reason.clone(),
            },
        },
    }
}

/// A record as it is sent: its lines GZIP-compressed (fast), a member of its own. Firehose bills
/// the bytes it takes, so a large invocation's journal costs about a fifth; the stream writes
/// the members one after another, which is still one GZIP file (RFC 1952), read by
/// [`unpack_object`] and by Athena from its `.gz` name.
pub fn compress_record(lines: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gzip = flate2::write::GzEncoder::new(
        Vec::with_capacity(lines.len() / 4 + 32),
        flate2::Compression::fast(),
    );
    // Writing into memory cannot fail.
    let _ = gzip.write_all(lines);
    gzip.finish().unwrap_or_default()
}

/// The bytes a GZIP member starts with.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A journal object's lines, and how many of its parts could not be read. The object is what
/// the stream concatenated: GZIP members (compressed records, or a compressing stream's whole
/// object) unpacked one by one, and plain lines (an older writer's, or an emulator's) taken as
/// they are, in any mix, so one record an upgrade left uncompressed, or a member cut short,
/// costs only itself. JSON lines never hold the byte `0x1f`, so a member starts where a line
/// ends and `0x1f 0x8b` follows.
pub fn unpack_object(bytes: &[u8]) -> (Vec<u8>, usize) {
    use std::io::Read;
    let mut out = Vec::with_capacity(bytes.len() * 4);
    let mut damaged = 0;
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.starts_with(&GZIP_MAGIC) {
            let mut reader = rest;
            let mut member = Vec::new();
            let read = flate2::bufread::GzDecoder::new(&mut reader).read_to_end(&mut member);
            match read {
                Ok(_) if reader.len() < rest.len() => {
                    out.extend_from_slice(&member);
                    rest = reader;
                }
                _ => {
                    // Cut short or damaged: go on from the next member, if any.
                    damaged += 1;
                    match find(&rest[1..], &GZIP_MAGIC) {
                        Some(at) => rest = &rest[1 + at..],
                        None => break,
                    }
                }
            }
        } else {
            let end = find(rest, b"\n\x1f\x8b").map_or(rest.len(), |at| at + 1);
            out.extend_from_slice(&rest[..end]);
            rest = &rest[end..];
        }
    }
    (out, damaged)
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The journal's lines for `entries`, packed into records of at most `max_bytes` (each line
/// ends with a newline, so records joined end to end, as Firehose writes them, stay lines). An
/// entry whose line alone is longer (an attempt of a batch with very many ids) is split by its
/// ids. Fewer, fuller records cost less: Firehose bills each record in 5 KB steps.
pub fn pack_records(entries: &[JournalEntry], max_bytes: usize) -> Vec<Vec<u8>> {
    pack_lines(
        entries.iter().flat_map(|e| lines_of(e, max_bytes)),
        max_bytes,
    )
}

/// `lines` (each ending with a newline) packed in order into records of at most `max_bytes`;
/// a line longer than that is a record of its own.
pub fn pack_lines(lines: impl IntoIterator<Item = Vec<u8>>, max_bytes: usize) -> Vec<Vec<u8>> {
    let mut records: Vec<Vec<u8>> = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    for line in lines {
        if !current.is_empty() && current.len() + line.len() > max_bytes {
            records.push(std::mem::take(&mut current));
        }
        current.extend_from_slice(&line);
    }
    if !current.is_empty() {
        records.push(current);
    }
    records
}

/// `entry`'s line, or the lines of its halves (by ids) where it is longer than `max_bytes`.
fn lines_of(entry: &JournalEntry, max_bytes: usize) -> Vec<Vec<u8>> {
    let line = line_of(entry);
    if line.len() <= max_bytes || entry.ids.len() < 2 {
        return vec![line];
    }
    let (first, second) = entry.ids.split_at(entry.ids.len() / 2);
    [first, second]
        .into_iter()
        .flat_map(|ids| {
            lines_of(
                &JournalEntry {
                    ids: ids.to_vec(),
                    ..entry.clone()
                },
                max_bytes,
            )
        })
        .collect()
}

/// One entry as a line of JSON.
pub fn line_of(entry: &JournalEntry) -> Vec<u8> {
    // A struct of strings, numbers and enums always serializes.
    let mut line = serde_json::to_vec(entry).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The entries in an object of the journal (lines, as Firehose writes them); a line that is
/// not an entry (a newer writer's kind of step) is skipped and counted.
pub fn read_lines(object: &[u8]) -> (Vec<JournalEntry>, usize) {
    read_json_lines(object)
}

/// The values of JSON lines (blank lines ignored); a line that is not a `T` is skipped and
/// counted.
pub fn read_json_lines<T: serde::de::DeserializeOwned>(lines: &[u8]) -> (Vec<T>, usize) {
    let mut skipped = 0;
    let values = lines
        .split(|b| *b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .filter_map(|line| match serde_json::from_slice(line) {
            Ok(value) => Some(value),
            Err(_) => {
                skipped += 1;
                None
            }
        })
        .collect();
    (values, skipped)
}

/// Times as RFC 3339 in milliseconds (`2026-11-27T12:00:00.123Z`): what Athena reads as a
/// timestamp, shorter than nanoseconds.
pub(crate) mod millis {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_time(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}

/// The longest look back a journal query takes: the longest retention (365 days).
pub const MAX_LOOK_BACK_DAYS: i64 = 365;

/// A query's `--since`: a span back from `now` (`90m`, `6h`, `7d`) or an RFC 3339 time, not
/// more than [`MAX_LOOK_BACK_DAYS`] back and not after `now`.
pub fn parse_since(
    text: &str,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, crate::limits::LimitError> {
    parse_past_time("since", text, now)
}

/// A past time given as a span back from `now` (`90m`, `6h`, `7d`) or an RFC 3339 time, not
/// more than [`MAX_LOOK_BACK_DAYS`] back and not after `now`; `field` names it in the error.
pub fn parse_past_time(
    field: &str,
    text: &str,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, crate::limits::LimitError> {
    let refuse = || {
        crate::limits::LimitError::new(
            field,
            format!("{text:?}"),
            format!(
                "a span back from now, such as 90m, 6h or 7d (at most {MAX_LOOK_BACK_DAYS}d), \
                 or an RFC 3339 time within it, such as 2026-11-27T10:00:00Z"
            ),
        )
    };
    let earliest = now - chrono::Duration::days(MAX_LOOK_BACK_DAYS);
    let at = if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        t.with_timezone(&Utc)
    } else {
        let span = parse_span(text).ok_or_else(refuse)?;
        now.checked_sub_signed(span).ok_or_else(refuse)?
    };
    if at < earliest || at > now {
        return Err(refuse());
    }
    Ok(at)
}

/// A span as the command line takes it: a positive whole number of minutes, hours or days
/// (`90m`, `6h`, `7d`).
pub(crate) fn parse_span(text: &str) -> Option<chrono::Duration> {
    let unit = text.chars().last()?;
    let n: i64 = text[..text.len() - unit.len_utf8()].parse().ok()?;
    match unit {
        'm' => chrono::Duration::try_minutes(n),
        'h' => chrono::Duration::try_hours(n),
        'd' => chrono::Duration::try_days(n),
        _ => None,
    }
    .filter(|d| *d > chrono::Duration::zero())
}

/// The journal's object key prefix for the hour `at` is in, below the journal's own prefix:
/// `YYYY/MM/DD/HH/`, as Firehose names the objects it writes (UTC).
pub fn hour_prefix(at: DateTime<Utc>) -> String {
    at.format("%Y/%m/%d/%H/").to_string()
}

/// A time as the journal writes it.
pub fn format_time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(second: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 27, 12, 0, 0).unwrap() + chrono::Duration::seconds(second)
    }

    fn attempt(n: u32, time: DateTime<Utc>, status: u16, next: Next) -> JournalEntry {
        JournalEntry {
            topic: "orders".into(),
            subscription: "billing".into(),
            ids: vec!["9b2f3c4e-5d6a-4b7c-8d9e-0f1a2b3c4d5e".into()],
            time,
            delivery: None,
            step: Step::Attempt(Attempt {
                attempt: n,
                ms: 35,
                endpoint: "https://hooks.example.com/services/T000/B000/***".into(),
                status: Some(status),
                outcome: DeliveryOutcome::of_status(status),
                retry_after_s: None,
                error: None,
                answer: None,
                next,
            }),
        }
    }

    /// The entry of event `9b2f…` published (or sent again by `replay` or `redrive`) at `time`.
    fn fanned(time: DateTime<Utc>, replay: Option<&str>, redrive: Option<&str>) -> JournalEntry {
        JournalEntry {
            time,
            step: Step::Fanned {
                event_type: "Order.Created".into(),
                subject: String::new(),
                bytes: 100,
                replay: replay.map(str::to_string),
                redrive: redrive.map(str::to_string),
            },
            ..attempt(1, time, 200, Next::Delivered)
        }
    }

    /// Every field a journal line can hold is a column of the stacks' Athena table (SAM's
    /// `JournalTable`, CDK's `JOURNAL_COLUMNS`), so a new field is never silently missing
    /// from queries.
    #[test]
    fn every_field_the_journal_writes_is_a_column_of_its_athena_table() {
        let attempt_with_all = JournalEntry {
            step: Step::Attempt(Attempt {
                status: Some(503),
                retry_after_s: Some(30),
                error: Some("e".into()),
                answer: Some("a".into()),
                ..match attempt(1, at(0), 503, Next::Retry { due: at(1) }).step {
                    Step::Attempt(a) => a,
                    _ => unreachable!(),
                }
            }),
            delivery: Some("replay:r".into()),
            ..attempt(1, at(0), 503, Next::Retry { due: at(1) })
        };
        let with = |step: Step| JournalEntry {
            step,
            ..attempt_with_all.clone()
        };
        let entries = [
            attempt_with_all.clone(),
            with(Step::Fanned {
                event_type: "t".into(),
                subject: "s".into(),
                bytes: 1,
                replay: Some("r".into()),
                redrive: Some("s3://b/k".into()),
            }),
            with(Step::Held {
                until: at(2),
                reason: HeldReason::EndpointDelayed,
            }),
            with(Step::DeadLettered {
                location: "s3://b/k".into(),
            }),
            with(Step::Dropped { reason: "r".into() }),
            with(Step::LateSuccess { attempt: 1 }),
            with(Step::GaveUp {
                next: Next::DeadLetter { reason: "r".into() },
            }),
        ];
        let mut fields = std::collections::BTreeSet::new();
        for entry in &entries {
            let value = serde_json::to_value(entry).unwrap();
            fields.extend(value.as_object().unwrap().keys().cloned());
        }
        let template = include_str!("../../infra/template.yaml");
        let table = &template[template.find("  JournalTable:").unwrap()..];
        let table = &table[..table.find("\n  # ----").unwrap_or(table.len())];
        let sam: std::collections::BTreeSet<String> = table
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- { Name: "))
            .map(|l| l.split(',').next().unwrap().to_string())
            .collect();
        let cdk_source = include_str!("../../infra/cdk/lib/gridrelay.ts");
        let cdk_list = &cdk_source[cdk_source
            .find("JOURNAL_COLUMNS: [string, string][] = [")
            .unwrap()..];
        let cdk_list = &cdk_list[..cdk_list.find("];").unwrap()];
        let cdk: std::collections::BTreeSet<String> = cdk_list
            .split("['")
            .skip(1)
            .map(|c| c.split('\'').next().unwrap().to_string())
            .collect();
        let missing_sam: Vec<_> = fields.difference(&sam).collect();
        let missing_cdk: Vec<_> = fields.difference(&cdk).collect();
        assert!(
            missing_sam.is_empty(),
            "not in SAM's JournalTable: {missing_sam:?}"
        );
        assert!(
            missing_cdk.is_empty(),
            "not in CDK's JOURNAL_COLUMNS: {missing_cdk:?}"
        );
        assert_eq!(sam, cdk, "SAM's and CDK's columns");
    }

    #[test]
    fn a_typical_attempt_entry_stays_within_its_byte_budget() {
        let entry = attempt(3, at(1), 503, Next::Retry { due: at(31) });
        let line = line_of(&entry);
        assert!(
            line.len() <= ATTEMPT_ENTRY_BUDGET,
            "{} bytes: {}",
            line.len(),
            String::from_utf8_lossy(&line)
        );
        let fanned = line_of(&JournalEntry {
            time: at(0),
            step: Step::Fanned {
                event_type: "Contoso.Orders.Created".into(),
                subject: "/orders/1234".into(),
                bytes: 420,
                replay: None,
                redrive: None,
            },
            ..entry
        });
        assert!(
            10 * (line.len() + fanned.len()) <= 5 * 1024,
            "{} bytes: {}",
            fanned.len(),
            String::from_utf8_lossy(&fanned)
        );
    }

    #[test]
    fn entries_read_back_as_written() {
        let entries = vec![
            JournalEntry {
                topic: "orders".into(),
                subscription: "billing".into(),
                ids: vec!["a".into(), "b".into()],
                time: at(0),
                delivery: None,
                step: Step::Fanned {
                    event_type: "Order.Created".into(),
                    subject: "/orders/7".into(),
                    bytes: 310,
                    replay: None,
                    redrive: None,
                },
            },
            attempt(1, at(1), 500, Next::Retry { due: at(11) }),
            attempt(
                2,
                at(11),
                400,
                Next::DeadLetter {
                    reason: "MaxDeliveryAttemptsExceeded".into(),
                },
            ),
            JournalEntry {
                topic: "orders".into(),
                subscription: "billing".into(),
                ids: vec!["a".into()],
                time: at(12),
                delivery: None,
                step: Step::Held {
                    until: at(72),
                    reason: HeldReason::EndpointDelayed,
                },
            },
            JournalEntry {
                topic: "orders".into(),
                subscription: "billing".into(),
                ids: vec!["a".into()],
                time: at(13),
                delivery: None,
                step: Step::DeadLettered {
                    location: "s3://dead/orders/billing/a.json".into(),
                },
            },
        ];
        let object: Vec<u8> = pack_records(&entries, MAX_RECORD_BYTES).concat();
        let (read, skipped) = read_lines(&object);
        assert_eq!(read, entries);
        assert_eq!(skipped, 0);
    }

    #[test]
    fn lines_of_a_newer_kind_are_skipped_and_counted() {
        let mut object = line_of(&attempt(1, at(1), 200, Next::Delivered));
        object.extend_from_slice(b"{\"step\":\"teleported\",\"topic\":\"orders\"}\n\n");
        let (read, skipped) = read_lines(&object);
        assert_eq!(read.len(), 1);
        assert_eq!(skipped, 1);
    }

    #[test]
    fn records_are_filled_up_to_their_size_and_never_past_it() {
        let entries: Vec<JournalEntry> = (0..100)
            .map(|i| attempt(1, at(i % 60), 200, Next::Delivered))
            .collect();
        let line = line_of(&entries[0]).len();
        let max = 5 * 1024;
        let records = pack_records(&entries, max);
        assert!(records.iter().all(|r| r.len() <= max));
        assert_eq!(records.len(), (100 * line).div_ceil(max / line * line));
        assert_eq!(records.concat().len(), 100 * line);
    }

    #[test]
    fn an_entry_longer_than_a_record_is_split_by_its_ids() {
        let mut entry = attempt(1, at(1), 200, Next::Delivered);
        entry.ids = (0..1000).map(|i| format!("event-{i:05}")).collect();
        let records = pack_records(std::slice::from_ref(&entry), 4 * 1024);
        assert!(records.len() > 1);
        assert!(records.iter().all(|r| r.len() <= 4 * 1024));
        let (read, _) = read_lines(&records.concat());
        let ids: Vec<String> = read.into_iter().flat_map(|e| e.ids).collect();
        assert_eq!(ids, entry.ids);
    }

    #[test]
    fn an_event_that_failed_twice_then_succeeded_shows_three_attempts_and_is_delivered() {
        let mut other = attempt(1, at(2), 200, Next::Delivered);
        other.ids = vec!["another".into()];
        let entries = [
            attempt(3, at(40), 200, Next::Delivered),
            attempt(1, at(1), 500, Next::Retry { due: at(11) }),
            other,
            attempt(2, at(11), 503, Next::Retry { due: at(40) }),
            // The same attempt written again by a redelivered invocation.
            attempt(2, at(11), 503, Next::Retry { due: at(40) }),
        ];
        let life = EventLife::of("orders", "9b2f3c4e-5d6a-4b7c-8d9e-0f1a2b3c4d5e", &entries);
        assert_eq!(life.subscriptions.len(), 1);
        let billing = &life.subscriptions[0];
        let statuses: Vec<(u32, Option<u16>)> = billing
            .steps
            .iter()
            .map(|e| match &e.step {
                Step::Attempt(a) => (a.attempt, a.status),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(statuses, [(1, Some(500)), (2, Some(503)), (3, Some(200))]);
        assert_eq!(billing.standing, Standing::Delivered { at: at(40) });
    }

    #[test]
    fn where_an_event_stands_is_its_last_step_unless_it_was_delivered_or_written() {
        let id = "9b2f3c4e-5d6a-4b7c-8d9e-0f1a2b3c4d5e";
        let standing_after = |entries: &[JournalEntry]| {
            EventLife::of("orders", id, entries).subscriptions[0]
                .standing
                .clone()
        };
        let retry = attempt(1, at(1), 500, Next::Retry { due: at(11) });
        assert_eq!(
            standing_after(std::slice::from_ref(&retry)),
            Standing::RetryDue { at: at(11) }
        );
        let given_up = attempt(
            2,
            at(11),
            500,
            Next::DeadLetter {
                reason: "MaxDeliveryAttemptsExceeded".into(),
            },
        );
        assert_eq!(
            standing_after(&[retry.clone(), given_up.clone()]),
            Standing::DeadLettering {
                reason: "MaxDeliveryAttemptsExceeded".into()
            }
        );
        let written = JournalEntry {
            time: at(12),
            step: Step::DeadLettered {
                location: "s3://dead/k".into(),
            },
            ..retry.clone()
        };
        assert_eq!(
            standing_after(&[retry.clone(), given_up, written]),
            Standing::DeadLettered {
                location: "s3://dead/k".into()
            }
        );
        // A copy redelivered after its success (a lost delete) was attempted again: still
        // delivered.
        let delivered = attempt(2, at(11), 200, Next::Delivered);
        let again = attempt(2, at(50), 500, Next::Retry { due: at(60) });
        assert_eq!(
            standing_after(&[retry.clone(), delivered, again]),
            Standing::Delivered { at: at(11) }
        );
        // R4: a timed-out attempt answered with success after all.
        let timed_out = attempt(1, at(1), 408, Next::Retry { due: at(11) });
        let late = JournalEntry {
            time: at(11),
            step: Step::LateSuccess { attempt: 1 },
            ..retry.clone()
        };
        assert_eq!(
            standing_after(&[timed_out, late]),
            Standing::Delivered { at: at(11) }
        );
        // L5: the dead-letter location unavailable for four hours.
        let dropped = JournalEntry {
            time: at(4 * 3600),
            step: Step::Dropped {
                reason: "DeadLetterLocationUnavailable".into(),
            },
            ..retry.clone()
        };
        assert_eq!(
            standing_after(&[retry, dropped]),
            Standing::Dropped {
                reason: "DeadLetterLocationUnavailable".into()
            }
        );
    }

    /// #35: an event sent again (by a redrive or a replay) stands where its latest delivery
    /// does: a dead-lettered event redriven and retrying is due for its retry, not dead-lettered,
    /// then delivered once the redrive's attempt succeeds; a delivered event replayed and
    /// retrying is due for the replay's retry, not delivered.
    #[test]
    fn an_event_sent_again_stands_where_its_latest_delivery_does() {
        let id = "9b2f3c4e-5d6a-4b7c-8d9e-0f1a2b3c4d5e";
        let standing_after = |entries: &[JournalEntry]| {
            EventLife::of("orders", id, entries).subscriptions[0]
                .standing
                .clone()
        };
        let written = JournalEntry {
            time: at(12),
            step: Step::DeadLettered {
                location: "s3://dead/k".into(),
            },
            ..attempt(1, at(12), 200, Next::Delivered)
        };
        let dead_lettered = [
            fanned(at(0), None, None),
            attempt(
                1,
                at(1),
                400,
                Next::DeadLetter {
                    reason: "DeliveryFailed".into(),
                },
            ),
            written,
        ];
        let mut redriven = dead_lettered.to_vec();
        redriven.push(fanned(at(100), None, Some("s3://dead/k")));
        assert_eq!(standing_after(&redriven), Standing::Waiting);
        redriven.push(attempt(1, at(101), 503, Next::Retry { due: at(111) }));
        assert_eq!(
            standing_after(&redriven),
            Standing::RetryDue { at: at(111) }
        );
        redriven.push(attempt(2, at(111), 200, Next::Delivered));
        assert_eq!(
            standing_after(&redriven),
            Standing::Delivered { at: at(111) }
        );
        // The whole life is still shown, in order.
        let life = EventLife::of("orders", id, &redriven);
        assert_eq!(life.subscriptions[0].steps.len(), 6);

        let replayed = [
            fanned(at(0), None, None),
            attempt(1, at(1), 200, Next::Delivered),
            fanned(at(200), Some("night"), None),
            attempt(1, at(201), 500, Next::Retry { due: at(211) }),
        ];
        assert_eq!(
            standing_after(&replayed),
            Standing::RetryDue { at: at(211) }
        );
    }

    /// #35: an event sent again while an earlier delivery of it still retries: each delivery
    /// stands on its own steps, named by their `delivery`. The publish's delivery succeeding
    /// after a replay began does not make the replay's delivered, nor does a replay's
    /// success end the publish's retries.
    #[test]
    fn each_delivery_of_an_event_stands_on_its_own_steps() {
        let id = "9b2f3c4e-5d6a-4b7c-8d9e-0f1a2b3c4d5e";
        let replay = Some("replay:night".to_string());
        let of = |delivery: &Option<String>, entry: JournalEntry| JournalEntry {
            delivery: delivery.clone(),
            ..entry
        };
        let mut entries = vec![
            fanned(at(0), None, None),
            attempt(1, at(1), 500, Next::Retry { due: at(30) }),
            of(&replay, fanned(at(10), Some("night"), None)),
            of(
                &replay,
                attempt(1, at(11), 503, Next::Retry { due: at(40) }),
            ),
            // The publish's retry, after the replay began.
            attempt(2, at(30), 200, Next::Delivered),
        ];
        let life = EventLife::of("orders", id, &entries);
        let sub = &life.subscriptions[0];
        assert_eq!(sub.standing, Standing::RetryDue { at: at(40) });
        let deliveries: Vec<(Option<&str>, DateTime<Utc>, &Standing)> = sub
            .deliveries
            .iter()
            .map(|d| (d.delivery.as_deref(), d.since, &d.standing))
            .collect();
        assert_eq!(
            deliveries,
            [
                (None, at(0), &Standing::Delivered { at: at(30) }),
                (
                    Some("replay:night"),
                    at(10),
                    &Standing::RetryDue { at: at(40) }
                ),
            ]
        );
        assert_eq!(sub.steps.len(), 5);

        // And the other way round: the replay is delivered while the publish's delivery
        // still retries.
        entries.pop();
        entries.push(of(&replay, attempt(2, at(40), 200, Next::Delivered)));
        entries.push(attempt(2, at(30), 500, Next::Retry { due: at(90) }));
        let life = EventLife::of("orders", id, &entries);
        let sub = &life.subscriptions[0];
        assert_eq!(sub.standing, Standing::Delivered { at: at(40) });
        assert_eq!(
            sub.deliveries[0].standing,
            Standing::RetryDue { at: at(90) }
        );
        assert!(dropped_events(&entries, "orders", "billing").is_empty());
    }

    /// #35: where the journal read does not hold every step: a publish's delivery whose fan-out
    /// was not read still began before the replay, which stays the latest; a replay under way
    /// across the upgrade (its fan-out written unnamed, its retries named) is one delivery; a
    /// replay dropped while the publish's delivery retries is listed as dropped with its own
    /// time and status.
    #[test]
    fn deliveries_read_from_part_of_the_journal_keep_their_order() {
        let id = "9b2f3c4e-5d6a-4b7c-8d9e-0f1a2b3c4d5e";
        let named = |entry: JournalEntry| JournalEntry {
            delivery: Some("replay:night".into()),
            ..entry
        };
        let entries = [
            named(fanned(at(10), Some("night"), None)),
            named(attempt(1, at(11), 503, Next::Retry { due: at(40) })),
            // The publish's second attempt; its fan-out and first attempt were not read.
            attempt(2, at(30), 200, Next::Delivered),
        ];
        let sub = &EventLife::of("orders", id, &entries).subscriptions[0];
        assert_eq!(sub.standing, Standing::RetryDue { at: at(40) });
        assert_eq!(sub.deliveries[0].delivery, None);
        assert_eq!(
            sub.deliveries[0].standing,
            Standing::Delivered { at: at(30) }
        );

        let across_the_upgrade = [
            fanned(at(0), None, None),
            fanned(at(10), Some("night"), None),
            attempt(1, at(11), 503, Next::Retry { due: at(40) }),
            named(attempt(2, at(40), 200, Next::Delivered)),
        ];
        let sub = &EventLife::of("orders", id, &across_the_upgrade).subscriptions[0];
        assert_eq!(sub.deliveries.len(), 2, "{:?}", sub.deliveries);
        assert_eq!(sub.deliveries[1].delivery.as_deref(), Some("replay:night"));
        assert_eq!(sub.standing, Standing::Delivered { at: at(40) });

        let dropped = [
            fanned(at(0), None, None),
            attempt(1, at(1), 500, Next::Retry { due: at(60) }),
            named(fanned(at(10), Some("night"), None)),
            named(attempt(
                1,
                at(11),
                400,
                Next::Drop {
                    reason: "MaxDeliveryAttemptsExceeded".into(),
                },
            )),
            attempt(2, at(60), 503, Next::Retry { due: at(120) }),
        ];
        let listed = dropped_events(&dropped, "orders", "billing");
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(
            (
                listed[0].dropped_at,
                listed[0].last_status,
                listed[0].published
            ),
            (at(11), Some(400), Some(at(0)))
        );
    }

    /// #35: entries written before deliveries were named (no `delivery`) still read: each
    /// fan-out begins a delivery, named after its replay or redrive.
    #[test]
    fn unnamed_entries_split_into_deliveries_at_each_fan_out() {
        let id = "9b2f3c4e-5d6a-4b7c-8d9e-0f1a2b3c4d5e";
        let entries = [
            fanned(at(0), None, None),
            attempt(1, at(1), 200, Next::Delivered),
            fanned(at(100), None, Some("s3://dead/k")),
            attempt(1, at(101), 503, Next::Retry { due: at(111) }),
            fanned(at(200), Some("night"), None),
        ];
        let life = EventLife::of("orders", id, &entries);
        let names: Vec<Option<&str>> = life.subscriptions[0]
            .deliveries
            .iter()
            .map(|d| d.delivery.as_deref())
            .collect();
        assert_eq!(
            names,
            [
                None,
                Some("redrive:2026-11-27T12:01:40.000Z"),
                Some("replay:night")
            ]
        );
        assert_eq!(life.subscriptions[0].standing, Standing::Waiting);
        assert_eq!(
            life.subscriptions[0].deliveries[1].standing,
            Standing::RetryDue { at: at(111) }
        );
    }

    #[test]
    fn latest_attempts_are_newest_first_and_failed_ones_only_if_asked() {
        let mut other = attempt(1, at(5), 500, Next::Retry { due: at(9) });
        other.subscription = "shipping".into();
        let entries = [
            attempt(1, at(1), 500, Next::Retry { due: at(11) }),
            attempt(3, at(40), 200, Next::Delivered),
            attempt(2, at(11), 503, Next::Retry { due: at(40) }),
            attempt(2, at(11), 503, Next::Retry { due: at(40) }),
            other,
        ];
        let numbers = |failed, top| -> Vec<u32> {
            latest_attempts(&entries, "orders", "billing", failed, top)
                .into_iter()
                .map(|e| match &e.step {
                    Step::Attempt(a) => a.attempt,
                    _ => 0,
                })
                .collect()
        };
        assert_eq!(numbers(false, 10), [3, 2, 1]);
        assert_eq!(numbers(true, 10), [2, 1]);
        assert_eq!(numbers(false, 1), [3]);
    }

    #[test]
    fn since_is_a_span_back_or_a_time_within_the_longest_retention() {
        let now = at(3600);
        assert_eq!(
            parse_since("90m", now).unwrap(),
            now - chrono::Duration::minutes(90)
        );
        assert_eq!(
            parse_since("6h", now).unwrap(),
            now - chrono::Duration::hours(6)
        );
        assert_eq!(
            parse_since("365d", now).unwrap(),
            now - chrono::Duration::days(365)
        );
        assert_eq!(parse_since("2026-11-27T12:30:00Z", now).unwrap(), at(1800));
        for bad in [
            "",
            "h",
            "0h",
            "-1h",
            "366d",
            "7w",
            "1.5h",
            "2026-11-27T14:00:00Z",
            "yesterday",
        ] {
            let e = parse_since(bad, now).unwrap_err();
            assert_eq!(e.field, "since", "{bad}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn the_hours_read_run_from_the_one_since_is_in_to_the_one_now_is_in() {
        let now = at(2 * 3600 + 600); // 14:10
        let hours: Vec<String> = hours_between(now - chrono::Duration::minutes(90), now)
            .into_iter()
            .map(hour_prefix)
            .collect();
        assert_eq!(
            hours,
            ["2026/11/27/12/", "2026/11/27/13/", "2026/11/27/14/"]
        );
        assert_eq!(hours_between(at(5), at(50)).len(), 1);
        assert!(hours_between(at(3600), at(0)).is_empty());
    }

    #[test]
    fn a_long_subject_is_cut_so_one_entry_always_fits_a_record() {
        let subscription: crate::subscription::Subscription =
            serde_json::from_value(serde_json::json!({
                "topic": "orders",
                "name": "billing",
                "endpoint": "https://hooks.example.com/h",
                "id": "0123456789abcdef",
                "createdAt": "2026-11-23T00:00:00Z",
                "statusTable": "Latest",
                "provisioning": { "state": "Succeeded" },
            }))
            .unwrap();
        let event = QueuedEvent::new(
            at(0),
            serde_json::value::RawValue::from_string(format!(
                r#"{{"id":"a","eventType":"t","subject":"{}","data":{{}}}}"#,
                "é".repeat(600_000)
            ))
            .unwrap(),
        );
        let fields = event_fields(&event, DeliverySchema::default());
        let entry = fanned_entry(&subscription, &event, fields, SentBy::default());
        let Step::Fanned { subject, .. } = &entry.step else {
            panic!()
        };
        assert_eq!(subject.chars().count(), MAX_FIELD_CHARS);
        assert!(line_of(&entry).len() < 1024);
    }

    #[test]
    fn an_hour_prefix_is_firehoses_utc_hour() {
        assert_eq!(hour_prefix(at(5)), "2026/11/27/12/");
        assert_eq!(format_time(at(5)), "2026-11-27T12:00:05.000Z");
    }

    #[test]
    fn compressed_records_written_one_after_another_read_back_as_their_lines() {
        let first = b"{\"a\":1}\n{\"a\":2}\n".repeat(50);
        let second = b"{\"b\":3}\n".to_vec();
        let (gz1, gz2) = (compress_record(&first), compress_record(&second));
        assert!(gz1.len() * 5 < first.len(), "compressed");
        let both = [first.clone(), second.clone()].concat();
        assert_eq!(
            unpack_object(&[gz1.clone(), gz2.clone()].concat()),
            (both.clone(), 0)
        );
        // Plain lines (an emulator's, or an older writer's) read as they are, in any mix with
        // members: an upgrade puts both in one object.
        assert_eq!(unpack_object(&second), (second.clone(), 0));
        assert_eq!(
            unpack_object(&[gz1.clone(), second.clone()].concat()),
            (both.clone(), 0)
        );
        assert_eq!(
            unpack_object(&[second.clone(), gz1.clone()].concat()),
            ([second.clone(), first.clone()].concat(), 0)
        );
        // A member cut short costs only itself.
        let cut = &gz1[..gz1.len() / 2];
        assert_eq!(
            unpack_object(&[cut, &gz2[..]].concat()),
            (second.clone(), 1)
        );
        assert_eq!(unpack_object(cut), (Vec::new(), 1));
    }

    /// #36: the events the portal offers to send again from the archive: those whose latest
    /// delivery to the subscription was dropped (L1, L5), with their publish time where the
    /// entries hold it; not one delivered after a send again, dead-lettered, still retrying,
    /// nor another subscription's.
    #[test]
    fn dropped_events_are_those_whose_latest_delivery_was_dropped_l1() {
        let of = |id: &str, sub: &str, time, step: Step| JournalEntry {
            topic: "orders".into(),
            subscription: sub.into(),
            ids: vec![id.into()],
            time,
            delivery: None,
            step,
        };
        let fanned = |redrive: Option<&str>| Step::Fanned {
            event_type: "t".into(),
            subject: String::new(),
            bytes: 10,
            replay: None,
            redrive: redrive.map(str::to_string),
        };
        let tried = |id: &str, n, time, status, next| JournalEntry {
            ids: vec![id.into()],
            ..attempt(n, time, status, next)
        };
        let drop = || Next::Drop {
            reason: "MaxDeliveryAttemptsExceeded".into(),
        };
        let retry = Next::Retry { due: at(100) };
        let d_dropped = of(
            "d",
            "billing",
            at(40),
            Step::Dropped {
                reason: "deleted".into(),
            },
        );
        let entries = vec![
            // a: published, retried, dropped.
            of("a", "billing", at(0), fanned(None)),
            tried("a", 1, at(1), 503, retry.clone()),
            tried("a", 2, at(10), 400, drop()),
            // b: dropped, sent again and delivered.
            of("b", "billing", at(0), fanned(None)),
            tried("b", 1, at(2), 400, drop()),
            of("b", "billing", at(20), fanned(Some("the topic's archive"))),
            tried("b", 1, at(21), 200, Next::Delivered),
            // c: dead-lettered; e: still retrying; f: another subscription's.
            tried("c", 1, at(3), 400, Next::DeadLetter { reason: "r".into() }),
            tried("e", 1, at(4), 503, retry),
            of("f", "shipping", at(5), Step::Dropped { reason: "r".into() }),
            // d: its publish not read; dropped when it came due, written twice.
            tried("d", 1, at(30), 503, Next::Retry { due: at(40) }),
            d_dropped.clone(),
            d_dropped,
            // no id: nothing could find it again.
            tried("", 1, at(50), 400, drop()),
        ];
        let dropped = dropped_events(&entries, "orders", "billing");
        assert_eq!(
            dropped,
            vec![
                DroppedEvent {
                    id: "d".into(),
                    reason: "deleted".into(),
                    dropped_at: at(40),
                    published: None,
                    first_seen: at(30),
                    last_status: Some(503),
                },
                DroppedEvent {
                    id: "a".into(),
                    reason: "MaxDeliveryAttemptsExceeded".into(),
                    dropped_at: at(10),
                    published: Some(at(0)),
                    first_seen: at(0),
                    last_status: Some(400),
                },
            ]
        );
        assert!(dropped_events(&entries, "other", "billing").is_empty());
    }
}
