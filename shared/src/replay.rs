//! Replays (#35): a window of a topic's archive sent again, run in the stack in paced steps.
//!
//! A replay is a record (its topic, name, window, chosen subscriptions, rate, state, where it
//! is in the archive, what it sent) advanced by step messages on the control queue. A step
//! message carries the record's version it was sent for; [`step_action`] says what a step
//! does with the record as it finds it, so that a step that comes twice (SQS delivers at least
//! once), or a crash between a step's work and its next message, neither sends a window's
//! events twice nor stops the replay:
//! - the record at the step's version: run it (send the next events from the cursor, then
//!   move the record to the next version, written only over the version read, then send the
//!   next step);
//! - the record one version on: a step for this version ran and moved it, but its next step
//!   may not have been sent (a crash in between): send it again (a second one finds the
//!   record moved on and is dropped);
//! - anything else (further on, or the replay no longer running): drop the step.
//!
//! Two copies of one step that both run send the same events: the deliveries they enqueue
//! name the replay, the version and their part, and only the first copy of each is delivered
//! ([`claim_key`]).

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
/// read in key order; those before `key` are done).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ArchivePosition {
    pub key: String,
    pub line: usize,
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
    #[serde(with = "crate::journal::millis")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::journal::millis")]
    pub updated_at: DateTime<Utc>,
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

    /// The most events one step sends.
    pub fn step_events(&self) -> usize {
        usize::try_from(self.rate.saturating_mul(STEP_SECONDS)).unwrap_or(usize::MAX)
    }
}

/// What a step message sent for `step_version` does with the record as it finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepAction {
    /// Send the next events and move the record on.
    Run,
    /// The step for this version already moved the record; send the next step again.
    SendNext,
    /// Nothing: a later step has run, or the replay is not running.
    Drop,
}

/// See the module's documentation.
pub fn step_action(replay: &Replay, step_version: u64) -> StepAction {
    if replay.state != ReplayState::Running {
        return StepAction::Drop;
    }
    if replay.version == step_version {
        StepAction::Run
    } else if replay.version == step_version.saturating_add(1) {
        StepAction::SendNext
    } else {
        StepAction::Drop
    }
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
            created_at: at,
            updated_at: at,
        }
    }

    /// A step runs once for its version; a step whose version already ran sends the next step
    /// again (it may have been lost), and every other step is dropped.
    #[test]
    fn a_step_runs_at_its_version_resends_the_next_one_after_and_drops_otherwise() {
        let running = replay(ReplayState::Running, 5);
        assert_eq!(step_action(&running, 5), StepAction::Run);
        assert_eq!(step_action(&running, 4), StepAction::SendNext);
        assert_eq!(step_action(&running, 3), StepAction::Drop);
        assert_eq!(step_action(&running, 6), StepAction::Drop);
        for state in [ReplayState::Cancelled, ReplayState::Completed] {
            assert_eq!(step_action(&replay(state, 5), 5), StepAction::Drop);
        }
    }

    #[test]
    fn steps_are_paced_to_the_rate_within_what_a_queue_can_delay() {
        assert_eq!(pause_after(1_000, 100), Duration::from_secs(10));
        assert_eq!(pause_after(0, 100), Duration::ZERO);
        assert_eq!(pause_after(1_000_000, 1), MAX_STEP_DELAY);
        assert_eq!(replay(ReplayState::Running, 0).step_events(), 1_000);
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
