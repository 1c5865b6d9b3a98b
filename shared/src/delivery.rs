//! The deliver worker's decisions: what happens to a delivery message when it arrives, and
//! to a batch's events after its attempt.
//!
//! Pure: the worker reads the subscription, the clock and the random draw, calls these, and
//! carries out what they return (enqueue, dead-letter, drop, count). Every outcome is a typed
//! value, so each rule can be tested without a queue, a store or an endpoint.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::classify::{AttemptResult, DeliveryOutcome, EndpointKind, classify_status};
use crate::decision::{
    AfterAttempt, DeadLetterReason, RetryRules, after_attempt, due_within_ttl, to_chrono,
    ttl_expired, until,
};
use crate::message::{
    AttemptRecord, DeadLetterEntry, DeadLetterMessage, DeliveryHistory, DeliveryMessage,
    QueuedEvent, pack_dead_letter_messages, queue_delay, whole_seconds_up,
};
use crate::schedule::RetrySchedule;
use crate::schema::DeliverySchema;
use crate::subscription::{RetryPolicy, Subscription};
use crate::time_scale::TimeScale;
use crate::validation::ProvisioningState;

/// S2: a request with no response after this long has failed.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// R4: how long after its timeout an attempt's answer is still awaited.
pub const LATE_ANSWER_WINDOW: Duration = Duration::from_secs(180);

/// L4: the wait between the last attempt and the write to the dead-letter location.
pub const DEAD_LETTER_DELAY: Duration = Duration::from_secs(300);

/// The first wait before a queue message whose record failed (a store or queue that did not
/// answer) is tried again; each further receive waits three times longer.
pub const REDELIVERY_FIRST_WAIT: Duration = Duration::from_secs(30);
/// The longest such wait (the delivery queue's visibility timeout on AWS).
pub const REDELIVERY_MAX_WAIT: Duration = Duration::from_secs(1800);

/// How long a message whose record failed waits before it is received again, given how often it
/// was received: 30 s, 90 s, 4.5 min, 13.5 min, then 30 min (scaled, whole seconds, at least
/// one). A passing failure costs seconds, not the whole visibility timeout; one that repeats
/// backs off until the redrive policy parks the message.
pub fn redelivery_delay(receive_count: u32, scale: TimeScale) -> Duration {
    let factor = 3u32.saturating_pow(receive_count.saturating_sub(1).min(10));
    let wait = REDELIVERY_FIRST_WAIT
        .saturating_mul(factor)
        .min(REDELIVERY_MAX_WAIT);
    whole_seconds_up(scale.apply(wait)).max(Duration::from_secs(1))
}

/// The worker's settings that the decisions read.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryRules<'a> {
    pub schedule: &'a RetrySchedule,
    pub scale: TimeScale,
}

impl DeliveryRules<'_> {
    /// L4, scaled.
    pub fn dead_letter_delay(&self) -> Duration {
        self.scale.apply(DEAD_LETTER_DELAY)
    }
}

/// What becomes of a delivery message when it arrives.
#[derive(Debug)]
pub enum Arrival {
    /// Its events are not for any subscription that receives events: dropped (counted and
    /// logged under `reason`), never sent.
    NotDeliverable {
        /// The message's events, the schema they are in and the delivery they are part of
        /// (`DeliveryMessage::delivery_name`), for the journal.
        events: Vec<QueuedEvent>,
        schema: DeliverySchema,
        delivery: Option<String>,
        reason: NotDeliverable,
    },
    /// Not due yet: sent on for the rest of its wait (at most 15 minutes a hop).
    NotYetDue {
        message: DeliveryMessage,
        delay: Duration,
    },
    /// Due: `live` events are attempted; those whose TTL ran out (R6) end in `expired`.
    Due {
        history: DeliveryHistory,
        live: Vec<QueuedEvent>,
        expired: Option<GiveUp>,
    },
}

/// Why a message's events are delivered to nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotDeliverable {
    /// The subscription no longer exists.
    SubscriptionDeleted,
    /// A subscription of the same name exists, but it is another one (deleted and created
    /// again since the events were fanned out): its endpoint and filter are not theirs.
    SubscriptionReplaced,
    /// The subscription does not receive events (its endpoint is not, or no longer,
    /// validated).
    NotValidated(ProvisioningState),
}

impl NotDeliverable {
    /// The name logs and counts use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SubscriptionDeleted => "SubscriptionDeleted",
            Self::SubscriptionReplaced => "SubscriptionReplaced",
            Self::NotValidated(_) => "SubscriptionNotValidated",
        }
    }
}

/// Decides what a message that arrived at `now` is for. Its events go only to the
/// subscription they were fanned out to (same id), and only while it receives events.
pub fn on_arrival(
    message: DeliveryMessage,
    subscription: Option<&Subscription>,
    rules: DeliveryRules<'_>,
    now: DateTime<Utc>,
) -> Arrival {
    let refused = match subscription {
        None => Err(NotDeliverable::SubscriptionDeleted),
        Some(s) if is_replaced(s, &message) => Err(NotDeliverable::SubscriptionReplaced),
        Some(s) if !s.delivers() => Err(NotDeliverable::NotValidated(s.provisioning.state)),
        Some(s) => Ok(s),
    };
    let subscription = match refused {
        Ok(s) => s,
        Err(reason) => {
            return Arrival::NotDeliverable {
                delivery: message.delivery_name(),
                events: message.events,
                schema: message.schema,
                reason,
            };
        }
    };
    if message.not_before > now {
        let delay = queue_delay(until(message.not_before, now));
        return Arrival::NotYetDue { message, delay };
    }
    let history = message.history();
    let policy = &subscription.retry_policy;
    let (expired, live): (Vec<QueuedEvent>, Vec<QueuedEvent>) = message
        .events
        .into_iter()
        .partition(|e| ttl_expired(e.publish_time, now, policy, rules.scale));
    let expired = (!expired.is_empty()).then(|| {
        let entries = expired
            .into_iter()
            .map(|e| {
                let last = e.last_attempt_in(&history);
                let mut entry = dead_letter_entry(
                    e,
                    DeadLetterReason::TimeToLiveExceeded,
                    history.attempts,
                    last,
                );
                // L6, D1: its life ended while its endpoint's delivery was delayed.
                if history.probation {
                    entry.last_outcome = Some(DeliveryOutcome::Probation);
                }
                entry
            })
            .collect();
        give_up(subscription, &history, entries, rules, now)
    });
    Arrival::Due {
        history,
        live,
        expired,
    }
}

/// Whether the message's events were for another subscription of the same name. Where either
/// side has no id (written before ids existed, or by an older version during an upgrade), the
/// events are the subscription's unless they were published before it was created.
fn is_replaced(subscription: &Subscription, message: &DeliveryMessage) -> bool {
    if subscription.id.is_empty() {
        return false;
    }
    if message.subscription_id.is_empty() {
        return message
            .events
            .iter()
            .any(|e| e.publish_time < subscription.created_at);
    }
    subscription.id != message.subscription_id
}

/// Events delivery stopped trying (L1, L2, L4).
#[derive(Debug)]
pub enum GiveUp {
    /// To the dead-letter queue, visible after the five-minute delay (L4).
    DeadLetter {
        messages: Vec<DeadLetterMessage>,
        delay: Duration,
        events: usize,
    },
    /// L1: no dead-letter location; each entry says why, for the log.
    Drop { entries: Vec<DeadLetterEntry> },
}

impl GiveUp {
    pub fn events(&self) -> usize {
        match self {
            Self::DeadLetter { events, .. } => *events,
            Self::Drop { entries } => entries.len(),
        }
    }
}

/// Dead-letters `entries` (of a delivery with `history`) to the subscription's location, or
/// drops them without one.
pub fn give_up(
    subscription: &Subscription,
    history: &DeliveryHistory,
    entries: Vec<DeadLetterEntry>,
    rules: DeliveryRules<'_>,
    now: DateTime<Utc>,
) -> GiveUp {
    let Some(destination) = &subscription.dead_letter_destination else {
        return GiveUp::Drop { entries };
    };
    let events = entries.len();
    let template = DeadLetterMessage {
        topic: subscription.topic.clone(),
        subscription: subscription.name.clone(),
        subscription_id: subscription.id.clone(),
        schema: history.schema,
        destination: destination.clone(),
        dead_lettered_at: now,
        first_write_failure: None,
        delivery: history.delivery_name(),
        entries: Vec::new(),
    };
    GiveUp::DeadLetter {
        messages: pack_dead_letter_messages(&template, entries),
        delay: queue_delay(rules.dead_letter_delay()),
        events,
    }
}

/// What came of one batch's attempt, for every event in it (B5).
#[derive(Debug)]
pub enum Settlement {
    Delivered {
        events: usize,
    },
    /// Re-enqueued for the next attempt (R1, R2, S5). Boxed: a history is far larger than
    /// the other outcomes.
    Retry(Box<Retry>),
    GaveUp(GiveUp),
}

/// Events to attempt again at `at`, with the history they share after their last attempt.
#[derive(Debug)]
pub struct Retry {
    pub history: DeliveryHistory,
    pub at: DateTime<Utc>,
    pub events: Vec<QueuedEvent>,
}

impl Retry {
    /// R1: the retry as it goes on the queue at `now`: no event is due past its time to live's
    /// end. Events whose end comes before `at` are due at their end instead (where R6 finds
    /// them expired and they are dead-lettered, not attempted), each end its own retry. A retry
    /// that waits for a timed-out attempt's late answer (R4) is not due before that wait is
    /// over, so a late success is seen before the event could be dead-lettered. `tags` (one
    /// per event, what the caller tracks) follow their events.
    pub fn within_ttl<T>(
        self,
        tags: Vec<T>,
        policy: &RetryPolicy,
        scale: TimeScale,
        now: DateTime<Utc>,
    ) -> Vec<(Retry, Vec<T>)> {
        assert_eq!(self.events.len(), tags.len(), "one tag per event");
        let late_answer_over = self
            .history
            .timed_out_attempt
            .is_some()
            .then(|| (now + to_chrono(scale.apply(LATE_ANSWER_WINDOW))).min(self.at));
        let mut out: Vec<(Retry, Vec<T>)> = Vec::new();
        for (event, tag) in self.events.into_iter().zip(tags) {
            let cut = due_within_ttl(self.at, event.publish_time, policy, scale);
            let at = late_answer_over.map_or(cut, |floor| cut.max(floor));
            match out.iter_mut().find(|(r, _)| r.at == at) {
                Some((retry, tags)) => {
                    retry.events.push(event);
                    tags.push(tag);
                }
                None => out.push((
                    Retry {
                        history: self.history.clone(),
                        at,
                        events: vec![event],
                    },
                    vec![tag],
                )),
            }
        }
        out
    }

    /// The messages that carry it, and the SQS delay to send them with.
    pub fn packed(self, now: DateTime<Utc>) -> (Vec<DeliveryMessage>, Duration) {
        (
            DeliveryMessage::packed(&self.history, self.at, self.events),
            queue_delay(until(self.at, now)),
        )
    }

    /// Whether `other`'s events can ride in the same messages: due at the same time, neither
    /// waiting for a late answer (R4: a late success cancels its own retry, not its
    /// neighbours'), and the same history but for the last attempt, which each event keeps.
    fn can_share(&self, other: &Retry) -> bool {
        let shared = |h: &DeliveryHistory| DeliveryHistory {
            last_attempt: None,
            ..h.clone()
        };
        self.at == other.at
            && self.history.timed_out_attempt.is_none()
            && other.history.timed_out_attempt.is_none()
            && shared(&self.history) == shared(&other.history)
    }
}

/// Merges retries that can share messages ([`Retry::can_share`]), so the retries of an
/// invocation's failed batches cost one SQS message per due time, not one per batch. The first
/// retry's last attempt becomes the message's; an event whose last attempt differs carries its
/// own (L6 reports it). Each retry comes with one `T` per event (what the caller tracks, such
/// as the SQS record it came from), kept beside its event in the merged retry.
pub fn merge_retries<T>(retries: Vec<(Retry, Vec<T>)>) -> Vec<(Retry, Vec<T>)> {
    let mut merged: Vec<(Retry, Vec<T>)> = Vec::new();
    for (retry, tags) in retries {
        match merged.iter_mut().find(|(m, _)| m.can_share(&retry)) {
            Some((into, into_tags)) => {
                let shared = into.history.last_attempt;
                into.events.extend(retry.events.into_iter().map(|mut e| {
                    let own = e.last_attempt_in(&retry.history);
                    e.last_attempt = if own == shared { None } else { own };
                    e
                }));
                into_tags.extend(tags);
            }
            None => merged.push((retry, tags)),
        }
    }
    merged
}

/// One batch's attempt, as the worker saw it.
#[derive(Debug)]
pub struct BatchAttempt<'a> {
    /// The history the batch's events shared before the attempt.
    pub history: &'a DeliveryHistory,
    /// When the request was sent.
    pub time: DateTime<Utc>,
    pub result: &'a AttemptResult,
    /// R4: the name given to a timed-out attempt still open for its late answer.
    pub timed_out_attempt: Option<String>,
    /// What the endpoint's `Retry-After` asked for (429, 503).
    pub retry_after: Option<Duration>,
}

/// Applies the subscription's status table (S1 to S6) with its retry ladder, retry policy (R1,
/// R5) and dead-lettering (L1, L2) to a batch's events after their attempt. `draw` is R2's
/// random draw in [0, 1). A retry goes on the queue through [`Retry::within_ttl`] (R1).
pub fn settle_attempt(
    subscription: &Subscription,
    attempt: BatchAttempt<'_>,
    events: Vec<QueuedEvent>,
    rules: DeliveryRules<'_>,
    now: DateTime<Utc>,
    draw: f64,
) -> Settlement {
    let verdict = classify_status(
        subscription.status_table.table(),
        if subscription.endpoint_type.is_resource() {
            EndpointKind::Resource
        } else {
            EndpointKind::Webhook
        },
        attempt.result,
        subscription.dead_letter_destination.is_some(),
    );
    let attempts_made = attempt.history.attempts + 1;
    let retry_rules = RetryRules {
        policy: &subscription.retry_policy,
        schedule: subscription
            .status_table
            .own_schedule()
            .unwrap_or(rules.schedule),
        scale: rules.scale,
    };
    let record = AttemptRecord {
        time: attempt.time,
        outcome: DeliveryOutcome::of(attempt.result),
    };
    match after_attempt(
        retry_rules,
        verdict,
        attempt.retry_after,
        attempts_made,
        now,
        draw,
    ) {
        AfterAttempt::Delivered => Settlement::Delivered {
            events: events.len(),
        },
        AfterAttempt::RetryAt(at) => Settlement::Retry(Box::new(Retry {
            history: attempt
                .history
                .after_attempt(record, attempt.timed_out_attempt),
            at,
            // The attempt just made is every event's last one now.
            events: events
                .into_iter()
                .map(|e| QueuedEvent {
                    last_attempt: None,
                    ..e
                })
                .collect(),
        })),
        AfterAttempt::GiveUp(reason) => {
            let entries = events
                .into_iter()
                .map(|e| dead_letter_entry(e, reason, attempts_made, Some(record)))
                .collect();
            Settlement::GaveUp(give_up(subscription, attempt.history, entries, rules, now))
        }
    }
}

/// Events held back without an attempt wait until `until_at` with their history unchanged (a
/// delay is not an attempt); like a retry, they go on the queue through [`Retry::within_ttl`],
/// so none waits past its time to live's end (R1). `probation` says they wait for their
/// endpoint's delay to end (D1, R3): one whose life ends meanwhile is dead-lettered with
/// `lastDeliveryOutcome: Probation`; held for another reason, it is not on probation,
/// whatever it waited for before.
pub fn hold(
    history: &DeliveryHistory,
    events: Vec<QueuedEvent>,
    until_at: DateTime<Utc>,
    probation: bool,
) -> Retry {
    Retry {
        history: DeliveryHistory {
            probation,
            ..history.clone()
        },
        at: until_at,
        events,
    }
}

/// The L6 facts of an event delivery stopped trying.
pub fn dead_letter_entry(
    event: QueuedEvent,
    reason: DeadLetterReason,
    attempts: u32,
    last: Option<AttemptRecord>,
) -> DeadLetterEntry {
    DeadLetterEntry {
        reason,
        delivery_attempts: attempts,
        last_outcome: last.map(|l| l.outcome),
        publish_time: event.publish_time,
        last_attempt_time: last.map(|l| l.time),
        event: event.event,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::DeliveryQueueMessage;
    use crate::subscription::{DeadLetterDestination, RetryPolicy};
    use serde_json::value::RawValue;

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-23T00:00:00Z")
            .unwrap()
            .to_utc()
    }

    fn subscription(dead_letter: bool) -> Subscription {
        let mut s: Subscription = serde_json::from_value(serde_json::json!({
            "topic": "orders",
            "name": "s1",
            "endpoint": "http://127.0.0.1:1/hook",
            "id": "0123456789abcdef",
            "createdAt": "2026-11-23T00:00:00Z",
            "statusTable": "Latest",
            "provisioning": { "state": "Succeeded" },
        }))
        .expect("a minimal subscription record");
        if dead_letter {
            s.dead_letter_destination =
                Some(DeadLetterDestination::parse("s3://dead/orders").unwrap());
        }
        s
    }

    fn event(id: &str, published: DateTime<Utc>) -> QueuedEvent {
        QueuedEvent::new(
            published,
            RawValue::from_string(format!("{{\"id\":\"{id}\"}}")).unwrap(),
        )
    }

    fn message(sub: &Subscription, attempts: u32, not_before: DateTime<Utc>) -> DeliveryMessage {
        let history = DeliveryHistory {
            attempts,
            ..DeliveryHistory::new(sub)
        };
        DeliveryMessage::packed(
            &history,
            not_before,
            vec![event("a", t0()), event("b", t0())],
        )
        .remove(0)
    }

    fn rules(schedule: &RetrySchedule) -> DeliveryRules<'_> {
        DeliveryRules {
            schedule,
            scale: TimeScale::REAL,
        }
    }

    /// Item 2 of the life-cycle issue: a record that failed for a passing reason comes back
    /// after 30 s, then waits three times longer each receive, up to 30 minutes.
    #[test]
    fn failed_records_back_off_from_thirty_seconds() {
        let waits: Vec<u64> = (1..=7)
            .map(|n| redelivery_delay(n, TimeScale::REAL).as_secs())
            .collect();
        assert_eq!(waits, vec![30, 90, 270, 810, 1800, 1800, 1800]);
        assert_eq!(redelivery_delay(0, TimeScale::REAL).as_secs(), 30);
        let scaled = TimeScale::new(0.01).unwrap();
        assert_eq!(redelivery_delay(1, scaled), Duration::from_secs(1));
        assert_eq!(redelivery_delay(4, scaled), Duration::from_secs(9));
    }

    #[test]
    fn a_message_for_a_deleted_subscription_is_dropped_and_counted() {
        let schedule = RetrySchedule::event_grid();
        let sub = subscription(false);
        let arrival = on_arrival(message(&sub, 0, t0()), None, rules(&schedule), t0());
        assert!(matches!(
            arrival,
            Arrival::NotDeliverable {
                ref events,
                reason: NotDeliverable::SubscriptionDeleted,
                ..
            } if events.len() == 2
        ));
    }

    /// Item 5 of the life-cycle issue: events fanned out to one subscription never reach
    /// another created later under the same name, nor one that does not receive events.
    #[test]
    fn events_go_only_to_their_own_validated_subscription() {
        let schedule = RetrySchedule::event_grid();
        let sub = subscription(false);
        let mut again = subscription(false);
        again.id = "another".into();
        let arrival = on_arrival(message(&sub, 3, t0()), Some(&again), rules(&schedule), t0());
        assert!(matches!(
            arrival,
            Arrival::NotDeliverable {
                ref events,
                reason: NotDeliverable::SubscriptionReplaced,
                ..
            } if events.len() == 2
        ));
        let mut failed = sub.clone();
        failed.provisioning.state = ProvisioningState::Failed;
        let arrival = on_arrival(
            message(&sub, 0, t0()),
            Some(&failed),
            rules(&schedule),
            t0(),
        );
        assert!(matches!(
            arrival,
            Arrival::NotDeliverable {
                reason: NotDeliverable::NotValidated(ProvisioningState::Failed),
                ..
            }
        ));
        let arrival = on_arrival(message(&sub, 0, t0()), Some(&sub), rules(&schedule), t0());
        assert!(matches!(arrival, Arrival::Due { .. }), "{arrival:?}");

        // A message from before ids (or from an older version mid-upgrade): the subscription's
        // unless its events are older than the subscription.
        let mut unnamed = message(&sub, 0, t0());
        unnamed.subscription_id.clear();
        let arrival = on_arrival(unnamed.clone(), Some(&sub), rules(&schedule), t0());
        assert!(matches!(arrival, Arrival::Due { .. }), "{arrival:?}");
        let mut younger = sub.clone();
        younger.created_at = t0() + chrono::Duration::seconds(1);
        let arrival = on_arrival(unnamed, Some(&younger), rules(&schedule), t0());
        assert!(matches!(
            arrival,
            Arrival::NotDeliverable {
                reason: NotDeliverable::SubscriptionReplaced,
                ..
            }
        ));
    }

    /// A message not yet due goes back for the rest of its wait, at most 15 minutes a hop.
    #[test]
    fn a_message_not_yet_due_waits_for_the_rest_in_hops() {
        let schedule = RetrySchedule::event_grid();
        let sub = subscription(false);
        let due = t0() + chrono::Duration::hours(3);
        let arrival = on_arrival(message(&sub, 7, due), Some(&sub), rules(&schedule), t0());
        let Arrival::NotYetDue { message, delay } = arrival else {
            panic!("expected NotYetDue, got {arrival:?}")
        };
        assert_eq!(delay, Duration::from_secs(900));
        assert_eq!(message.not_before, due);
        assert_eq!(message.attempts, 7);
    }

    /// R6, L2: TTL is checked when an attempt comes due; expired events are dead-lettered as
    /// TimeToLiveExceeded with the attempts and outcome they had, the rest are attempted.
    #[test]
    fn expired_events_are_dead_lettered_when_due_r6_l2() {
        let schedule = RetrySchedule::event_grid();
        let mut sub = subscription(true);
        sub.retry_policy = RetryPolicy {
            max_delivery_attempts: 30,
            event_time_to_live_in_minutes: 1,
        };
        let now = t0() + chrono::Duration::seconds(61);
        let mut m = message(&sub, 3, now);
        m.events.push(event("fresh", now));
        m.last_attempt = Some(AttemptRecord {
            time: t0(),
            outcome: DeliveryOutcome::Busy,
        });
        let Arrival::Due {
            live,
            expired: Some(GiveUp::DeadLetter { messages, .. }),
            ..
        } = on_arrival(m, Some(&sub), rules(&schedule), now)
        else {
            panic!("expected due events and a dead-letter")
        };
        assert_eq!(live.len(), 1);
        assert_eq!(messages[0].entries.len(), 2);
        let entry = &messages[0].entries[0];
        assert_eq!(entry.reason, DeadLetterReason::TimeToLiveExceeded);
        assert_eq!(entry.delivery_attempts, 3);
        assert_eq!(entry.last_outcome, Some(DeliveryOutcome::Busy));
    }

    fn settle(sub: &Subscription, attempts: u32, result: AttemptResult) -> Settlement {
        let schedule = RetrySchedule::event_grid();
        let history = DeliveryHistory {
            attempts,
            ..DeliveryHistory::new(sub)
        };
        settle_attempt(
            sub,
            BatchAttempt {
                history: &history,
                time: t0(),
                result: &result,
                timed_out_attempt: None,
                retry_after: None,
            },
            vec![event("a", t0()), event("b", t0())],
            rules(&schedule),
            t0(),
            0.0,
        )
    }

    /// S6: a subscription on the 2019 table retries on its own ladder (hourly after the first
    /// hour) and keeps 2019's rules (a 404 is retried); the default table follows R1's ladder
    /// and S3 (a 401 is not retried, a 404 is).
    #[test]
    fn the_2019_table_brings_its_own_ladder_s6_r1() {
        let mut sub = subscription(true);
        let at = |s: &Subscription, attempts, status| match settle(
            s,
            attempts,
            AttemptResult::Status(status),
        ) {
            Settlement::Retry(r) => (r.at - t0()).num_seconds(),
            other => panic!("expected a retry, got {other:?}"),
        };
        // The eighth failure: 3 h on the current ladder, 1 h on 2019's.
        assert_eq!(at(&sub, 7, 500), 3 * 3600);
        assert_eq!(at(&sub, 7, 404), 3 * 3600);
        assert!(matches!(
            settle(&sub, 0, AttemptResult::Status(401)),
            Settlement::GaveUp(_)
        ));
        sub.status_table = crate::classify::StatusTableName::Legacy2019;
        assert_eq!(at(&sub, 7, 500), 3600);
        assert_eq!(at(&sub, 7, 404), 3600);
        assert_eq!(at(&sub, 12, 401), 3600);
    }

    /// S1, B5: a success delivers every event of the batch.
    #[test]
    fn success_delivers_the_whole_batch_s1_b5() {
        let sub = subscription(false);
        assert!(matches!(
            settle(&sub, 0, AttemptResult::Status(204)),
            Settlement::Delivered { events: 2 }
        ));
    }

    /// R1, S5: a 503 re-enqueues the batch with one more attempt, its outcome, and a 30 s wait.
    #[test]
    fn busy_endpoint_retries_after_thirty_seconds_r1_s5() {
        let sub = subscription(false);
        let Settlement::Retry(retry) = settle(&sub, 0, AttemptResult::Status(503)) else {
            panic!("expected a retry")
        };
        let (messages, delay) = retry.packed(t0());
        assert_eq!(delay, Duration::from_secs(30));
        assert_eq!(messages[0].events.len(), 2);
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].attempts, 1);
        assert_eq!(messages[0].not_before, t0() + chrono::Duration::seconds(30));
        assert_eq!(
            messages[0].last_attempt.map(|l| l.outcome),
            Some(DeliveryOutcome::Busy)
        );
    }

    /// S3, L2, L6: a 400 dead-letters at once with one attempt (attempts exhausted); without a location the events
    /// are dropped (L1).
    #[test]
    fn non_retried_status_dead_letters_or_drops_s3_l1_l2() {
        let Settlement::GaveUp(GiveUp::DeadLetter {
            messages, delay, ..
        }) = settle(&subscription(true), 0, AttemptResult::Status(400))
        else {
            panic!("expected a dead-letter")
        };
        assert_eq!(delay, DEAD_LETTER_DELAY);
        assert_eq!(messages[0].entries.len(), 2);
        assert_eq!(
            messages[0].entries[0].reason,
            DeadLetterReason::MaxDeliveryAttemptsExceeded
        );
        assert_eq!(messages[0].entries[0].delivery_attempts, 1);
        assert!(matches!(
            settle(&subscription(false), 0, AttemptResult::Status(400)),
            Settlement::GaveUp(GiveUp::Drop { entries }) if entries.len() == 2
        ));
    }

    /// R5: the last allowed attempt failing gives up with MaxDeliveryAttemptsExceeded.
    #[test]
    fn last_attempt_gives_up_r5() {
        let mut sub = subscription(true);
        sub.retry_policy.max_delivery_attempts = 2;
        let Settlement::GaveUp(GiveUp::DeadLetter { messages, .. }) =
            settle(&sub, 1, AttemptResult::TimedOut)
        else {
            panic!("expected a dead-letter")
        };
        let entry = &messages[0].entries[0];
        assert_eq!(entry.reason, DeadLetterReason::MaxDeliveryAttemptsExceeded);
        assert_eq!(entry.delivery_attempts, 2);
        assert_eq!(entry.last_outcome, Some(DeliveryOutcome::TimedOut));
    }

    fn retry_after(sub: &Subscription, result: AttemptResult, time: DateTime<Utc>) -> Retry {
        let schedule = RetrySchedule::event_grid();
        let history = DeliveryHistory::new(sub);
        match settle_attempt(
            sub,
            BatchAttempt {
                history: &history,
                time,
                result: &result,
                timed_out_attempt: None,
                retry_after: None,
            },
            vec![event(&time.to_rfc3339(), t0())],
            rules(&schedule),
            t0(),
            0.0,
        ) {
            Settlement::Retry(r) => *r,
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    /// R1, R2, L6: retries of several batches due at the same time share one message; each
    /// event keeps its own last attempt, and an expired one is dead-lettered with it.
    #[test]
    fn retries_due_together_share_a_message_and_keep_their_last_attempt_r1_r2_l6() {
        let sub = subscription(true);
        let later = t0() + chrono::Duration::milliseconds(700);
        let first = retry_after(&sub, AttemptResult::Status(500), t0());
        let second = retry_after(&sub, AttemptResult::Status(502), later);
        // 503 waits at least 30 s (S5), so it is due at another time.
        let busy = retry_after(&sub, AttemptResult::Status(503), t0());
        let merged = merge_retries(vec![
            (first, vec!['a']),
            (busy, vec!['b']),
            (second, vec!['c']),
        ]);
        assert_eq!(merged.len(), 2);
        let (retry, tags) = &merged[0];
        assert_eq!(tags, &['a', 'c']);
        assert_eq!(retry.events.len(), 2);
        assert_eq!(retry.events[0].last_attempt, None);
        let own = retry.events[1]
            .last_attempt
            .expect("the second batch's own attempt");
        assert_eq!(
            (own.time, own.outcome),
            (later, DeliveryOutcome::GenericError)
        );

        // Read back after the TTL: each event is reported with its own last attempt (L6).
        let (mut messages, _) = merged.into_iter().next().unwrap().0.packed(t0());
        let message = messages.remove(0);
        let body = message.to_body().unwrap();
        let Ok(DeliveryQueueMessage::Delivery(message)) = DeliveryQueueMessage::from_body(&body)
        else {
            panic!("a delivery message reads back")
        };
        let mut short = sub.clone();
        short.retry_policy.event_time_to_live_in_minutes = 1;
        let now = t0() + chrono::Duration::minutes(2);
        let schedule = RetrySchedule::event_grid();
        let Arrival::Due {
            expired: Some(GiveUp::DeadLetter { messages: dead, .. }),
            ..
        } = on_arrival(message, Some(&short), rules(&schedule), now)
        else {
            panic!("expected the expired events dead-lettered")
        };
        let times: Vec<_> = dead[0]
            .entries
            .iter()
            .map(|e| e.last_attempt_time)
            .collect();
        assert_eq!(times, [Some(t0()), Some(later)]);

        // The next attempt is every event's last one again.
        let again = settle_attempt(
            &sub,
            BatchAttempt {
                history: &DeliveryHistory {
                    attempts: 1,
                    ..DeliveryHistory::new(&sub)
                },
                time: now,
                result: &AttemptResult::Status(500),
                timed_out_attempt: None,
                retry_after: None,
            },
            vec![QueuedEvent {
                last_attempt: Some(own),
                ..event("x", t0())
            }],
            rules(&schedule),
            now,
            0.0,
        );
        let Settlement::Retry(again) = again else {
            panic!("expected a retry")
        };
        assert_eq!(again.events[0].last_attempt, None);
    }

    /// R4: a retry that waits for a timed-out attempt's late answer keeps its own message, so
    /// a late success cancels only its events.
    #[test]
    fn retries_waiting_for_a_late_answer_are_not_merged_r4() {
        let sub = subscription(true);
        let mut waiting = retry_after(&sub, AttemptResult::TimedOut, t0());
        waiting.history.timed_out_attempt = Some("attempt-1".into());
        let plain = retry_after(&sub, AttemptResult::TimedOut, t0());
        assert_eq!(waiting.at, plain.at);
        let merged = merge_retries(vec![(waiting, vec![1]), (plain, vec![2])]);
        assert_eq!(merged.len(), 2);
    }

    /// D1: held events keep their attempt count and wait until the endpoint's delay ends.
    #[test]
    fn held_events_keep_their_history_d1() {
        let sub = subscription(false);
        let history = DeliveryHistory {
            attempts: 4,
            ..DeliveryHistory::new(&sub)
        };
        let until_at = t0() + chrono::Duration::seconds(90);
        let policy = RetryPolicy::default();
        let held = hold(&history, vec![event("a", t0())], until_at, false).within_ttl(
            vec![7],
            &policy,
            TimeScale::REAL,
            t0(),
        );
        let [(retry, tags)] = <[_; 1]>::try_from(held).expect("one retry");
        assert_eq!(tags, vec![7]);
        let (messages, delay) = retry.packed(t0());
        assert_eq!(delay, Duration::from_secs(90));
        assert_eq!(messages[0].history(), history);
        assert_eq!(messages[0].not_before, until_at);
    }

    /// R1: a retry is cut per event at its TTL's end; events whose end is later keep the
    /// ladder's time, and their tags follow them.
    #[test]
    fn retries_are_cut_at_each_events_ttl_end_r1() {
        let sub = subscription(true);
        let policy = RetryPolicy {
            max_delivery_attempts: 30,
            event_time_to_live_in_minutes: 60,
        };
        let at = t0() + chrono::Duration::minutes(30);
        let old = t0() - chrono::Duration::minutes(45);
        let retry = Retry {
            history: DeliveryHistory::new(&sub),
            at,
            events: vec![event("new", t0()), event("old", old), event("new2", t0())],
        };
        let cut = retry.within_ttl(vec!["n", "o", "n2"], &policy, TimeScale::REAL, t0());
        assert_eq!(cut.len(), 2);
        assert_eq!(cut[0].0.at, at);
        assert_eq!(cut[0].1, vec!["n", "n2"]);
        assert_eq!(cut[0].0.events.len(), 2);
        assert_eq!(cut[1].0.at, t0() + chrono::Duration::minutes(15));
        assert_eq!(cut[1].1, vec!["o"]);
    }

    /// R1, R4: a retry waiting for a timed-out attempt's late answer is cut at the TTL's end
    /// no earlier than the late-answer window's end (so a late success is seen first), and
    /// never later than the ladder's time.
    #[test]
    fn a_retry_waiting_for_a_late_answer_is_not_cut_before_the_window_r1_r4() {
        let sub = subscription(true);
        let policy = RetryPolicy {
            max_delivery_attempts: 30,
            event_time_to_live_in_minutes: 60,
        };
        let published = t0() - chrono::Duration::minutes(59);
        // When a retry due at `at` goes on the queue now.
        let due = |at, timed_out: Option<&str>| {
            let retry = Retry {
                history: DeliveryHistory {
                    timed_out_attempt: timed_out.map(str::to_string),
                    ..DeliveryHistory::new(&sub)
                },
                at,
                events: vec![event("a", published)],
            };
            retry.within_ttl(vec![()], &policy, TimeScale::REAL, t0())[0]
                .0
                .at
        };
        let minutes = |m| t0() + chrono::Duration::minutes(m);
        assert_eq!(
            due(minutes(10), Some("attempt-1")),
            minutes(3),
            "not at the TTL's end, a minute from now"
        );
        let soon = t0() + chrono::Duration::seconds(30);
        assert_eq!(
            due(soon, Some("attempt-1")),
            soon,
            "never later than the ladder"
        );
        assert_eq!(due(minutes(10), None), minutes(1), "the TTL's end");
    }

    /// D1, L6: probation is the current hold's reason only: an event held on probation and
    /// then held for another reason (a cap, a deadline) is not on probation any more.
    #[test]
    fn probation_does_not_outlive_its_hold_d1_l6() {
        let sub = subscription(true);
        let policy = sub.retry_policy;
        let on_probation = DeliveryHistory {
            probation: true,
            ..DeliveryHistory::new(&sub)
        };
        let held = hold(&on_probation, vec![event("a", t0())], t0(), false).within_ttl(
            vec![()],
            &policy,
            TimeScale::REAL,
            t0(),
        );
        assert!(!held[0].0.history.probation);
        let held = hold(
            &DeliveryHistory::new(&sub),
            vec![event("a", t0())],
            t0(),
            true,
        )
        .within_ttl(vec![()], &policy, TimeScale::REAL, t0());
        assert!(held[0].0.history.probation);
    }

    /// R1, R6, L6, D1: an event held for a delayed endpoint past its TTL's end is due at the
    /// end, and arrives expired: dead-lettered `TimeToLiveExceeded` with `Probation` as its
    /// last outcome; one that was never attempted nor held reads `Delivering`.
    #[test]
    fn an_event_whose_life_ends_on_probation_says_probation_r1_r6_l6_d1() {
        let sub = subscription(true);
        let schedule = RetrySchedule::event_grid();
        let policy = sub.retry_policy;
        let published = t0() - chrono::Duration::hours(23) - chrono::Duration::minutes(59);
        let ttl_end = published + chrono::Duration::hours(24);
        let history = DeliveryHistory::new(&sub);
        let until_at = t0() + chrono::Duration::hours(4);
        let held = hold(&history, vec![event("a", published)], until_at, true).within_ttl(
            vec![()],
            &policy,
            TimeScale::REAL,
            t0(),
        );
        let (retry, _) = held.into_iter().next().unwrap();
        assert_eq!(
            retry.at, ttl_end,
            "cut at the TTL's end, not after the delay"
        );
        let (messages, _) = retry.packed(t0());
        let message = messages.into_iter().next().unwrap();
        let arrival = on_arrival(message, Some(&sub), rules(&schedule), ttl_end);
        let Arrival::Due {
            live,
            expired: Some(GiveUp::DeadLetter { messages, .. }),
            ..
        } = arrival
        else {
            panic!("expected the event dead-lettered")
        };
        assert!(live.is_empty());
        let entry = &messages[0].entries[0];
        assert_eq!(entry.reason, DeadLetterReason::TimeToLiveExceeded);
        assert_eq!(entry.last_outcome, Some(DeliveryOutcome::Probation));

        // Not held: no attempt made, nothing to report but that it was still being delivered.
        let plain = DeliveryMessage::packed(&history, t0(), vec![event("b", published)]).remove(0);
        let arrival = on_arrival(plain, Some(&sub), rules(&schedule), ttl_end);
        let Arrival::Due {
            expired: Some(GiveUp::DeadLetter { messages, .. }),
            ..
        } = arrival
        else {
            panic!("expected the event dead-lettered")
        };
        assert_eq!(messages[0].entries[0].last_outcome, None);
    }
}
