//! Replays (#35): a window of a topic's archive sent again, run in the stack in paced steps.
//!
//! A replay is a record (its topic, name, window, chosen subscriptions, rate, state, where it
//! is in the archive, what it sent) advanced by step messages on the control queue. A step
//! message carries the record's version it was sent for; [`step_action`] says what a step does
//! with the record as it finds it, so that a step that comes twice (SQS delivers at least
//! once), or a crash between a step's work and its next message, neither sends a window's
//! events twice nor stops the replay, and copies of steps do not live on:
//! - the record at the step's version: run it (send the next events from the cursor, move the
//!   record to the next version with the time its next step is due, written only over the
//!   version read, and only then send the next step: of two copies that both ran, the one whose
//!   write was refused sends nothing);
//! - the record one version on: this step ran and moved it. Usually its next step is on its
//!   way and this is a copy; but a crash between the write and the send would have lost it. So
//!   the step waits (goes back on the queue) until [`STEP_GRACE`] past the next step's due
//!   time, and then, if the record has still not moved, sends the next step itself;
//! - anything else (further on, or the replay no longer running): drop the step.
//!
//! Two copies of one step that both run send the same events: the deliveries they enqueue
//! name the replay, the version and their part, and only the first copy of each is delivered
//! ([`claim_key`]). A replay reads only windows whose objects are all written (its end at
//! least the stream's buffering interval past), so both copies read the same objects.

use std::ops::RangeInclusive;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::archive::TimeWindow;
use crate::limits::LimitError;

/// Events a replay sends per second, at most (`--rate`): it never takes more of the delivery
/// path than that from live traffic.
pub const REPLAY_RATE: RangeInclusive<i64> = 1..=10_000;
/// A replay's rate unless told.
pub const DEFAULT_REPLAY_RATE: u32 = 100;
/// How many seconds of a replay's rate one step sends: fewer, larger steps read the archive
/// less often; smaller ones follow the rate more closely.
pub const STEP_SECONDS: u32 = 10;
/// The longest an SQS message can be delayed, and so the longest pause between steps.
pub const MAX_STEP_DELAY: Duration = Duration::from_secs(900);
/// The header naming the replay that sent a delivery.
pub const REPLAY_HEADER: &str = "gridrelay-replay";
/// How long a replay delivery's claim is kept: longer than any copy of a step's message can
/// live on a queue (SQS keeps a message at most 14 days).
pub const CLAIM_LIFETIME: chrono::Duration = chrono::Duration::days(14);
/// The most events one step sends, whatever the rate: what one `deliver` invocation reads
/// from the archive and enqueues comfortably within its time (a higher rate takes shorter
/// pauses instead).
pub const MAX_STEP_EVENTS: usize = 1_000;
/// The most events of a replay one delivery message carries (at least one batch of its
/// subscription's, at most 100): a step's deliveries spread over invocations as a publish's
/// do, instead of one invocation taking a thousand events while live messages received with
/// them wait for it.
pub fn events_per_message(max_events_per_batch: u32) -> usize {
    usize::try_from(max_events_per_batch.clamp(10, 100)).unwrap_or(10)
}

/// The most bytes of archived events one step takes, shared by its subscriptions (each gets a
/// copy): what a `deliver` invocation holds and enqueues at once stays bounded whatever the
/// events' sizes and the subscriptions' number. A step always takes at least one event.
pub const MAX_STEP_BYTES: usize = 8 * 1_048_576;
/// The most archive objects one step reads, and the most hours it lists: a step over a window
/// of sparse or busy hours ends in time and leaves the rest to the next.
pub const MAX_STEP_OBJECTS: usize = 8;
pub const MAX_STEP_HOURS: usize = 48;
/// How long after its publish time an event is surely in the archive's stream: `ingest`
/// writes it before it answers, and its function runs at most 15 s (then 5 s to spare).
pub const ARCHIVE_ARRIVAL_BOUND: Duration = Duration::from_secs(20);
/// How long past its due time a step may be late (queued behind live traffic, retried after a
/// failed invocation) before a copy of the step before it takes it for lost and sends it again.
pub const STEP_GRACE: chrono::Duration = chrono::Duration::minutes(15);

/// A replay's name: 1 to 64 letters, digits, `-` and `_`.
pub fn validate_replay_name(name: &str) -> Result<(), LimitError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(LimitError::new(
            "replay name",
            format!("{name:?}"),
            "1 to 64 letters, digits, '-' and '_'",
        ))
    }
}

/// Checks a replay's `rate`.
pub fn validate_rate(rate: i64) -> Result<u32, LimitError> {
    if REPLAY_RATE.contains(&rate) {
        Ok(u32::try_from(rate).unwrap_or(DEFAULT_REPLAY_RATE))
    } else {
        Err(LimitError::new(
            "rate",
            rate,
            format!(
                "{} to {} events a second",
                REPLAY_RATE.start(),
                REPLAY_RATE.end()
            ),
        ))
    }
}

/// Where a replay is in the archive: the next line to read of the object `key` (objects are
/// read in the order written; those before `key` are done).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ArchivePosition {
    pub key: String,
    pub line: usize,
}

impl ArchivePosition {
    /// Past the object `key`: it was read to its end.
    pub fn past(key: &str) -> Self {
        Self {
            key: key.to_string(),
            line: usize::MAX,
        }
    }

    /// Where a step that stops before reading object `key` leaves the next: at the line the
    /// cursor `from` says if it is in that object, else at its start.
    pub fn resume(from: Option<&ArchivePosition>, key: &str) -> Self {
        from.filter(|p| p.key == key)
            .cloned()
            .unwrap_or_else(|| Self {
                key: key.to_string(),
                line: 0,
            })
    }

    /// Whether the object `key` was read to its end.
    pub fn is_past(&self, key: &str) -> bool {
        self.key == key && self.line == usize::MAX
    }
}

/// What one step may take: events, bytes of them, objects read and hours listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    pub events: usize,
    pub bytes: usize,
    pub objects: usize,
    pub hours: usize,
}

/// What a replay is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplayState {
    Running,
    Completed,
    Cancelled,
}

/// A replay, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Replay {
    pub topic: String,
    pub name: String,
    #[serde(with = "crate::journal::millis")]
    pub start_time: DateTime<Utc>,
    #[serde(with = "crate::journal::millis")]
    pub end_time: DateTime<Utc>,
    /// The subscriptions it sends to (their names and ids when it started: one created again
    /// since under the same name is another, and gets nothing).
    pub subscriptions: Vec<ReplayTarget>,
    /// Events a second, at most.
    pub rate: u32,
    pub state: ReplayState,
    /// Moved on by every step; a step's write is made only over the version it read.
    pub version: u64,
    /// The next event to read; none before the first step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<ArchivePosition>,
    /// Archived events of the window sent so far (each to every chosen subscription whose
    /// filter takes it).
    pub events_sent: u64,
    /// When the step for the current version is due (written with the version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_step_due: Option<DateTime<Utc>>,
    #[serde(with = "crate::journal::millis")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::journal::millis")]
    pub updated_at: DateTime<Utc>,
}

/// A step message (on the control queue): run replay `name` of `topic` at `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayStep {
    pub topic: String,
    pub name: String,
    pub version: u64,
}

impl ReplayStep {
    /// The step for the record as it is.
    pub fn of(replay: &Replay) -> Self {
        Self {
            topic: replay.topic.clone(),
            name: replay.name.clone(),
            version: replay.version,
        }
    }
}

/// When a replay of a window ending at `end` may read it: once every event published in it is
/// surely in an object of the archive (arrived at the stream within [`ARCHIVE_ARRIVAL_BOUND`],
/// written out within the stream's `buffer` interval), so every read of a step finds the same
/// objects.
pub fn sealed_at(end: DateTime<Utc>, buffer: Duration) -> DateTime<Utc> {
    end + chrono::Duration::from_std(ARCHIVE_ARRIVAL_BOUND + buffer).unwrap_or(STEP_GRACE)
}

/// A subscription a replay sends to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayTarget {
    pub name: String,
    pub id: String,
}

impl Replay {
    pub fn window(&self) -> TimeWindow {
        TimeWindow {
            start: self.start_time,
            end: self.end_time,
        }
    }

    /// The most events one step sends: [`STEP_SECONDS`] of its rate, at most
    /// [`MAX_STEP_EVENTS`].
    pub fn step_events(&self) -> usize {
        usize::try_from(self.rate.saturating_mul(STEP_SECONDS))
            .unwrap_or(usize::MAX)
            .min(MAX_STEP_EVENTS)
    }

    /// What a step that sends to `targets` subscriptions may take: [`Replay::step_events`]
    /// events, [`MAX_STEP_BYTES`] shared by the targets, [`MAX_STEP_OBJECTS`] objects and
    /// [`MAX_STEP_HOURS`] hours.
    pub fn step_budget(&self, targets: usize) -> StepBudget {
        StepBudget {
            events: self.step_events(),
            bytes: MAX_STEP_BYTES / targets.max(1),
            objects: MAX_STEP_OBJECTS,
            hours: MAX_STEP_HOURS,
        }
    }

    /// A new replay, running, its first step due at `first_step_due` (times kept to the
    /// millisecond, as stored).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        topic: &str,
        name: &str,
        window: TimeWindow,
        subscriptions: Vec<ReplayTarget>,
        rate: u32,
        first_step_due: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Self {
        use crate::archive::to_millis;
        let (first_step_due, now) = (to_millis(first_step_due), to_millis(now));
        Self {
            topic: topic.to_string(),
            name: name.to_string(),
            start_time: window.start,
            end_time: window.end,
            subscriptions,
            rate,
            state: ReplayState::Running,
            version: 0,
            cursor: None,
            events_sent: 0,
            next_step_due: Some(first_step_due),
            created_at: now,
            updated_at: now,
        }
    }

    /// The record after a step at `now` that sent `sent` events and stopped at `next` (none:
    /// the window is done, and the replay completed), with its next step due after the pause
    /// the rate asks for.
    pub fn after_step(
        &self,
        sent: usize,
        next: Option<ArchivePosition>,
        now: DateTime<Utc>,
    ) -> Replay {
        let pause = chrono::Duration::from_std(pause_after(sent, self.rate))
            .unwrap_or(chrono::Duration::zero());
        Replay {
            version: self.version + 1,
            state: if next.is_some() {
                ReplayState::Running
            } else {
                ReplayState::Completed
            },
            next_step_due: next.as_ref().map(|_| now + pause),
            cursor: next,
            events_sent: self.events_sent + sent as u64,
            updated_at: now,
            ..self.clone()
        }
    }

    /// The record cancelled at `now` (its next step finds it so and stops).
    pub fn cancelled(&self, now: DateTime<Utc>) -> Replay {
        Replay {
            version: self.version + 1,
            state: ReplayState::Cancelled,
            next_step_due: None,
            updated_at: now,
            ..self.clone()
        }
    }
}

/// What a step message sent for `step_version` does with the record as it finds it at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepAction {
    /// Send the next events and move the record on.
    Run,
    /// Go back on the queue until then, and look again.
    WaitUntil(DateTime<Utc>),
    /// This step moved the record long ago and the next has not run: it was lost; send it.
    SendNext,
    /// Nothing: a later step has run, or the replay is not running.
    Drop,
}

/// See the module's documentation.
pub fn step_action(replay: &Replay, step_version: u64, now: DateTime<Utc>) -> StepAction {
    if replay.state != ReplayState::Running {
        return StepAction::Drop;
    }
    if replay.version == step_version {
        // Early (its due time is past what a queue's delay reaches, or it is the first step
        // of a window not yet sealed): it waits.
        return match replay.next_step_due {
            Some(due) if now + chrono::Duration::seconds(1) < due => StepAction::WaitUntil(due),
            _ => StepAction::Run,
        };
    }
    if replay.version != step_version.saturating_add(1) {
        return StepAction::Drop;
    }
    let lost_after = replay.next_step_due.unwrap_or(replay.updated_at) + STEP_GRACE;
    if now < lost_after {
        StepAction::WaitUntil(lost_after)
    } else {
        StepAction::SendNext
    }
}

/// The queue delay of a step message due after `wait`: none if it is due, at most the 15
/// minutes a queue delays (a step due later comes early and waits again, [`step_action`]).
pub fn step_delay(wait: chrono::Duration) -> Duration {
    wait.to_std()
        .unwrap_or(Duration::ZERO)
        .min(crate::message::MAX_QUEUE_DELAY)
}

/// How long to wait before the next step after one that sent `events` at `rate` a second
/// (at most [`MAX_STEP_DELAY`]).
pub fn pause_after(events: usize, rate: u32) -> Duration {
    let seconds = events as f64 / f64::from(rate.max(1));
    Duration::from_secs_f64(seconds).min(MAX_STEP_DELAY)
}

/// The key under which the first copy of one delivery of a replay's step claims to be
/// delivered: the replay, the record's version the step ran at, the subscription and the
/// part (a step's events for one subscription packed into messages in a fixed order). A second
/// copy, sent by the same step run twice, finds it taken.
pub fn claim_key(
    topic: &str,
    replay: &str,
    version: u64,
    subscription_id: &str,
    part: usize,
) -> String {
    format!("replay/{topic}/{replay}/{version}/{subscription_id}/{part}")
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn replay(state: ReplayState, version: u64) -> Replay {
        let at = Utc.with_ymd_and_hms(2026, 11, 27, 12, 0, 0).unwrap();
        Replay {
            topic: "orders".into(),
            name: "r1".into(),
            start_time: at,
            end_time: at + chrono::Duration::hours(1),
            subscriptions: vec![ReplayTarget {
                name: "billing".into(),
                id: "s1".into(),
            }],
            rate: 100,
            state,
            version,
            cursor: None,
            events_sent: 0,
            next_step_due: Some(at),
            created_at: at,
            updated_at: at,
        }
    }

    /// A step runs once for its version; a step whose version already ran waits until its
    /// next step is overdue by the grace, then sends it (it was lost); every other step is
    /// dropped.
    #[test]
    fn a_step_runs_at_its_version_resends_an_overdue_next_one_and_drops_otherwise() {
        let running = replay(ReplayState::Running, 5);
        let due = running.next_step_due.unwrap();
        assert_eq!(step_action(&running, 5, due), StepAction::Run);
        assert_eq!(
            step_action(&running, 4, due),
            StepAction::WaitUntil(due + STEP_GRACE)
        );
        assert_eq!(
            step_action(&running, 4, due + STEP_GRACE),
            StepAction::SendNext
        );
        assert_eq!(step_action(&running, 3, due), StepAction::Drop);
        assert_eq!(step_action(&running, 6, due), StepAction::Drop);
        for state in [ReplayState::Cancelled, ReplayState::Completed] {
            assert_eq!(step_action(&replay(state, 5), 5, due), StepAction::Drop);
        }
    }

    /// The sequences SQS and crashes make, played on the record: a copy of a step dies out
    /// instead of starting a chain of its own, and a lost step is sent again.
    #[test]
    fn copies_of_steps_die_out_and_a_lost_step_is_sent_again() {
        let t0 = replay(ReplayState::Running, 0).created_at;
        let pause = chrono::Duration::seconds(10);
        // The record as a run at `version` at `at` leaves it.
        let after_run = |version: u64, at: DateTime<Utc>| Replay {
            version: version + 1,
            next_step_due: Some(at + pause),
            updated_at: at,
            ..replay(ReplayState::Running, 0)
        };
        // Step 0 comes twice: the first runs (record at 1, step 1 sent); the copy waits, and
        // when it looks again step 1 has run (record at 2): dropped, no chain of its own.
        let record = after_run(0, t0);
        let copy = step_action(&record, 0, t0 + chrono::Duration::seconds(1));
        let StepAction::WaitUntil(again) = copy else {
            panic!("{copy:?}")
        };
        let record = after_run(1, t0 + pause);
        assert_eq!(step_action(&record, 0, again), StepAction::Drop);
        // A crash between the write and the send: step 1 was never sent. The redelivered step
        // 0 waits, then sends step 1, which runs.
        let record = after_run(0, t0);
        let redelivered = step_action(&record, 0, t0 + chrono::Duration::minutes(5));
        let StepAction::WaitUntil(again) = redelivered else {
            panic!("{redelivered:?}")
        };
        assert_eq!(step_action(&record, 0, again), StepAction::SendNext);
        assert_eq!(step_action(&record, 1, again), StepAction::Run);
    }

    /// A step moves the record one version on with its count and cursor, due after the
    /// pause its rate asks for; one that read to the window's end completes it. A step that
    /// comes before its record's due time (a first step before its window is sealed, a
    /// pause longer than a queue's delay) waits.
    #[test]
    fn a_step_moves_the_record_on_and_an_early_step_waits() {
        let r = replay(ReplayState::Running, 0);
        let now = r.created_at;
        let at = ArchivePosition {
            key: "k".into(),
            line: 7,
        };
        let moved = r.after_step(1_000, Some(at.clone()), now);
        assert_eq!(moved.version, 1);
        assert_eq!(moved.state, ReplayState::Running);
        assert_eq!(moved.cursor, Some(at));
        assert_eq!(moved.events_sent, 1_000);
        assert_eq!(
            moved.next_step_due,
            Some(now + chrono::Duration::seconds(10))
        );
        let done = moved.after_step(3, None, now);
        assert_eq!(
            (done.state, done.events_sent, done.version),
            (ReplayState::Completed, 1_003, 2)
        );
        assert_eq!(step_action(&done, 2, now), StepAction::Drop);

        let due = now + chrono::Duration::minutes(20);
        let sealed_later = Replay {
            next_step_due: Some(due),
            ..r.clone()
        };
        assert_eq!(
            step_action(&sealed_later, 0, now),
            StepAction::WaitUntil(due)
        );
        assert_eq!(step_action(&sealed_later, 0, due), StepAction::Run);
        assert_eq!(
            sealed_at(now, Duration::from_secs(300)),
            now + chrono::Duration::seconds(320)
        );
        let cancelled = r.cancelled(now);
        assert_eq!(
            (cancelled.state, cancelled.version),
            (ReplayState::Cancelled, 1)
        );
    }

    #[test]
    fn steps_are_paced_to_the_rate_within_what_a_queue_can_delay() {
        assert_eq!(pause_after(1_000, 100), Duration::from_secs(10));
        assert_eq!(pause_after(0, 100), Duration::ZERO);
        assert_eq!(pause_after(1_000_000, 1), MAX_STEP_DELAY);
        assert_eq!(step_delay(chrono::Duration::seconds(-5)), Duration::ZERO);
        assert_eq!(
            step_delay(chrono::Duration::seconds(7)),
            Duration::from_secs(7)
        );
        assert_eq!(step_delay(chrono::Duration::hours(2)), MAX_STEP_DELAY);
        assert_eq!(replay(ReplayState::Running, 0).step_events(), 1_000);
        let fast = Replay {
            rate: 10_000,
            ..replay(ReplayState::Running, 0)
        };
        assert_eq!(fast.step_events(), MAX_STEP_EVENTS);
        // A step's deliveries spread over messages of a batch or more, at most 100 events.
        assert_eq!(events_per_message(1), 10);
        assert_eq!(events_per_message(50), 50);
        assert_eq!(events_per_message(5_000), 100);
    }

    #[test]
    fn names_and_rates_are_checked_naming_the_field_value_and_range() {
        assert!(validate_replay_name("night-of-27_11").is_ok());
        for bad in ["", "a b", &"x".repeat(65)] {
            assert_eq!(validate_replay_name(bad).unwrap_err().field, "replay name");
        }
        assert_eq!(validate_rate(100), Ok(100));
        let e = validate_rate(0).unwrap_err();
        assert_eq!((e.field.as_str(), e.value.as_str()), ("rate", "0"));
        assert!(e.allowed.contains("1 to 10000"), "{e}");
        assert!(validate_rate(10_001).is_err());
    }

    #[test]
    fn a_records_times_are_kept_to_the_millisecond_and_read_back() {
        let r = replay(ReplayState::Running, 2);
        let text = serde_json::to_string(&r).unwrap();
        assert!(
            text.contains(r#""startTime":"2026-11-27T12:00:00.000Z""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Replay>(&text).unwrap(), r);
    }
}
