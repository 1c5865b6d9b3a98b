//! What happens to an event after an attempt, and whether it may be attempted at all.
//!
//! Pure: the caller passes the clock's reading and the random draw.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::classify::Verdict;
use crate::schedule::RetrySchedule;
use crate::subscription::RetryPolicy;
use crate::time_scale::TimeScale;

/// Why an event stopped being delivered (L2, L6 `deadLetterReason`): its attempts ran out or
/// its time to live did. A status that is not retried (S3, S4) ends the attempts at once, so
/// it reads `MaxDeliveryAttemptsExceeded`, as in the seeds' example (1 attempt, `NotFound`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredReason")]
pub enum DeadLetterReason {
    MaxDeliveryAttemptsExceeded,
    TimeToLiveExceeded,
}

/// A reason as queue messages hold it, including `NonRetriableStatus(code)` from messages
/// written before L6 followed the newest revision: read as attempts exhausted.
#[derive(Deserialize)]
enum StoredReason {
    MaxDeliveryAttemptsExceeded,
    TimeToLiveExceeded,
    NonRetriableStatus(#[allow(dead_code)] u16),
}

impl From<StoredReason> for DeadLetterReason {
    fn from(stored: StoredReason) -> Self {
        match stored {
            StoredReason::TimeToLiveExceeded => Self::TimeToLiveExceeded,
            StoredReason::MaxDeliveryAttemptsExceeded | StoredReason::NonRetriableStatus(_) => {
                Self::MaxDeliveryAttemptsExceeded
            }
        }
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::MaxDeliveryAttemptsExceeded => "MaxDeliveryAttemptsExceeded",
            Self::TimeToLiveExceeded => "TimeToLiveExceeded",
        })
    }
}

/// The next state of an event after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterAttempt {
    Delivered,
    /// Attempt again, not before this time.
    RetryAt(DateTime<Utc>),
    /// Dead-letter it (or drop it when no dead-letter location is set up, L1).
    GiveUp(DeadLetterReason),
}

/// The rules that set when the next attempt comes: a subscription's policy, the ladder and the
/// time scale.
#[derive(Debug, Clone, Copy)]
pub struct RetryRules<'a> {
    pub policy: &'a RetryPolicy,
    pub schedule: &'a RetrySchedule,
    pub scale: TimeScale,
}

/// Decides what follows an attempt.
///
/// - `attempts_made` counts the attempt just made.
/// - R5: when the attempts reach the maximum, a retryable failure becomes terminal.
/// - R1: otherwise the next attempt waits the schedule's step or the status minimum, whichever
///   is larger, plus randomization (`draw` in [0, 1)), scaled. An endpoint's `Retry-After`
///   (`retry_after`, on 429 and 503) raises the status minimum, up to the ladder's longest step:
///   never sooner than the schedule and S5, never beyond the ladder.
/// - S3/S4: a status that is not retried ends the attempts at once (L6: attempts exhausted).
/// - R6: the TTL is *not* checked here; it is checked when the next attempt comes due. R1's
///   cut at the TTL's end is per event ([`due_within_ttl`]).
pub fn after_attempt(
    rules: RetryRules<'_>,
    verdict: Verdict,
    retry_after: Option<Duration>,
    attempts_made: u32,
    now: DateTime<Utc>,
    draw: f64,
) -> AfterAttempt {
    match verdict {
        Verdict::Delivered => AfterAttempt::Delivered,
        Verdict::NotRetried => AfterAttempt::GiveUp(DeadLetterReason::MaxDeliveryAttemptsExceeded),
        Verdict::Retry { .. } if attempts_made >= rules.policy.max_delivery_attempts => {
            AfterAttempt::GiveUp(DeadLetterReason::MaxDeliveryAttemptsExceeded)
        }
        Verdict::Retry { min_wait } => {
            let asked =
                retry_after.map_or(Duration::ZERO, |w| w.min(rules.schedule.longest_step()));
            let wait =
                rules
                    .schedule
                    .next_wait(attempts_made, min_wait.max(asked), draw, rules.scale);
            AfterAttempt::RetryAt(now + to_chrono(wait))
        }
    }
}

/// R5: when an event's time to live ends.
pub fn ttl_end(
    publish_time: DateTime<Utc>,
    policy: &RetryPolicy,
    scale: TimeScale,
) -> DateTime<Utc> {
    let ttl = scale.apply(Duration::from_secs(
        u64::from(policy.event_time_to_live_in_minutes) * 60,
    ));
    publish_time + to_chrono(ttl)
}

/// R5, R6: whether an event's time to live has run out. Called only when an attempt comes due.
pub fn ttl_expired(
    publish_time: DateTime<Utc>,
    now: DateTime<Utc>,
    policy: &RetryPolicy,
    scale: TimeScale,
) -> bool {
    now >= ttl_end(publish_time, policy, scale)
}

/// R1: when an event scheduled for `at` is due: no scheduled attempt lies past its TTL's end,
/// so a wait that would pass it is cut to end there (where R6 finds it expired and it is
/// dead-lettered, not attempted).
pub fn due_within_ttl(
    at: DateTime<Utc>,
    publish_time: DateTime<Utc>,
    policy: &RetryPolicy,
    scale: TimeScale,
) -> DateTime<Utc> {
    at.min(ttl_end(publish_time, policy, scale))
}

/// Converts a wait to chrono's type; waits here are at most days, far inside its range.
pub fn to_chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// How long from `now` until `at`, zero if `at` has passed.
pub fn until(at: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (at - now).to_std().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{AttemptResult, EndpointKind, LATEST, classify_status};
    use proptest::prelude::*;

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-22T00:00:00Z")
            .unwrap()
            .to_utc()
    }

    /// What the default table says of a webhook's answer.
    fn verdict(status: u16) -> Verdict {
        classify_status(
            &LATEST,
            EndpointKind::Webhook,
            &AttemptResult::Status(status),
            true,
        )
    }

    fn decide(status: u16, attempts: u32, policy: &RetryPolicy) -> AfterAttempt {
        let verdict = verdict(status);
        let schedule = RetrySchedule::event_grid();
        let rules = RetryRules {
            policy,
            schedule: &schedule,
            scale: TimeScale::REAL,
        };
        after_attempt(rules, verdict, None, attempts, t0(), 0.0)
    }

    /// Retry-After on a 503: honoured when longer than the ladder's step and S5's minimum,
    /// ignored when shorter, and never beyond the ladder's longest step (12 h).
    #[test]
    fn retry_after_raises_the_wait_within_the_ladder_r1_s5() {
        let policy = RetryPolicy::default();
        let schedule = RetrySchedule::event_grid();
        let rules = RetryRules {
            policy: &policy,
            schedule: &schedule,
            scale: TimeScale::REAL,
        };
        let verdict = verdict(503);
        let after = |asked: u64| {
            let asked = Some(Duration::from_secs(asked));
            match after_attempt(rules, verdict, asked, 1, t0(), 0.0) {
                AfterAttempt::RetryAt(at) => (at - t0()).num_seconds(),
                other => panic!("expected a retry, got {other:?}"),
            }
        };
        assert_eq!(after(120), 120, "longer than 30 s: honoured");
        assert_eq!(after(5), 30, "shorter than S5's 30 s: the minimum");
        assert_eq!(after(7 * 24 * 3600), 12 * 3600, "at most the longest step");
    }

    /// R1, S5: a 503 after the first attempt waits 30 s (larger than the 10 s step).
    #[test]
    fn busy_endpoint_waits_thirty_seconds_r1_s5() {
        let next = decide(503, 1, &RetryPolicy::default());
        assert_eq!(
            next,
            AfterAttempt::RetryAt(t0() + chrono::Duration::seconds(30))
        );
        let next = decide(500, 1, &RetryPolicy::default());
        assert_eq!(
            next,
            AfterAttempt::RetryAt(t0() + chrono::Duration::seconds(10))
        );
    }

    /// L2, S3, L6: a 400 gives up at once, as attempts exhausted (the seeds' example: 1
    /// attempt, `MaxDeliveryAttemptsExceeded`); messages written with the older
    /// `NonRetriableStatus` reason read the same way.
    #[test]
    fn non_retried_status_gives_up_at_once_l2_s3_l6() {
        let next = decide(400, 1, &RetryPolicy::default());
        assert_eq!(
            next,
            AfterAttempt::GiveUp(DeadLetterReason::MaxDeliveryAttemptsExceeded)
        );
        assert_eq!(
            DeadLetterReason::MaxDeliveryAttemptsExceeded.to_string(),
            "MaxDeliveryAttemptsExceeded"
        );
        let old: DeadLetterReason = serde_json::from_str(r#"{"NonRetriableStatus":404}"#).unwrap();
        assert_eq!(old, DeadLetterReason::MaxDeliveryAttemptsExceeded);
        let ttl: DeadLetterReason = serde_json::from_str(r#""TimeToLiveExceeded""#).unwrap();
        assert_eq!(ttl, DeadLetterReason::TimeToLiveExceeded);
    }

    /// R1: no scheduled attempt past the TTL's end. 003's example: TTL 30 minutes, 10
    /// attempts; the sixth failure comes at ~16.7 min and the next step (30 min) would pass
    /// the end, so the event is due at 30 minutes, where R6 finds it expired.
    #[test]
    fn a_step_past_the_ttl_is_cut_to_its_end_r1_r6() {
        let policy = RetryPolicy {
            max_delivery_attempts: 10,
            event_time_to_live_in_minutes: 30,
        };
        let publish = t0();
        // Attempts at 0, 10 s, 40 s, 1:40, 6:40, 16:40 (steps 10 s, 30 s, 1 m, 5 m, 10 m).
        let sixth = t0() + chrono::Duration::seconds(1000);
        let schedule = RetrySchedule::event_grid();
        let rules = RetryRules {
            policy: &policy,
            schedule: &schedule,
            scale: TimeScale::REAL,
        };
        let verdict = verdict(500);
        let AfterAttempt::RetryAt(at) = after_attempt(rules, verdict, None, 6, sixth, 0.0) else {
            panic!("expected a retry")
        };
        assert_eq!(
            at,
            sixth + chrono::Duration::seconds(1800),
            "the ladder's step"
        );
        let due = due_within_ttl(at, publish, &policy, TimeScale::REAL);
        assert_eq!(due, t0() + chrono::Duration::minutes(30));
        assert!(ttl_expired(publish, due, &policy, TimeScale::REAL));
        // A step that ends inside the TTL is kept.
        let early = t0() + chrono::Duration::minutes(5);
        assert_eq!(
            due_within_ttl(early, publish, &policy, TimeScale::REAL),
            early
        );
    }

    /// R5, L2: reaching the maximum attempts gives up with MaxDeliveryAttemptsExceeded.
    #[test]
    fn max_attempts_gives_up_r5_l2() {
        let policy = RetryPolicy {
            max_delivery_attempts: 3,
            ..RetryPolicy::default()
        };
        assert!(matches!(decide(500, 2, &policy), AfterAttempt::RetryAt(_)));
        assert_eq!(
            decide(500, 3, &policy),
            AfterAttempt::GiveUp(DeadLetterReason::MaxDeliveryAttemptsExceeded)
        );
    }

    /// R6: a TTL that runs out between attempts does not end delivery at the failure; the next
    /// attempt is still scheduled, and expiry is seen only when that attempt comes due.
    #[test]
    fn ttl_checked_only_when_next_attempt_is_due_r6() {
        let policy = RetryPolicy {
            max_delivery_attempts: 30,
            event_time_to_live_in_minutes: 1,
        };
        let publish = t0() - chrono::Duration::seconds(55);
        // Fifth failure at t0: the next step is 10 minutes, far past the TTL's end at t0+5s.
        let next = decide(500, 5, &policy);
        let AfterAttempt::RetryAt(due) = next else {
            panic!("expected a retry, got {next:?}")
        };
        assert!(!ttl_expired(publish, t0(), &policy, TimeScale::REAL));
        assert!(ttl_expired(publish, due, &policy, TimeScale::REAL));
    }

    proptest! {
        /// R5: TTL in scaled minutes from the publish time.
        #[test]
        fn ttl_boundary_r5(minutes in 1u32..=1440, offset_ms in -5_000i64..5_000, scale in 0.001f64..1.0) {
            let policy = RetryPolicy { max_delivery_attempts: 30, event_time_to_live_in_minutes: minutes };
            let s = TimeScale::new(scale).unwrap();
            let ttl = to_chrono(s.apply(Duration::from_secs(u64::from(minutes) * 60)));
            let now = t0() + ttl + chrono::Duration::milliseconds(offset_ms);
            prop_assert_eq!(ttl_expired(t0(), now, &policy, s), offset_ms >= 0);
        }

        /// R1, R5: a retryable failure below the maximum always schedules a later attempt.
        #[test]
        fn retry_is_always_in_the_future(attempts in 1u32..30, status in 405u16..600, draw in 0.0f64..1.0) {
            let policy = RetryPolicy::default();
            let schedule = RetrySchedule::event_grid();
            let rules = RetryRules { policy: &policy, schedule: &schedule, scale: TimeScale::REAL };
            let verdict = verdict(status);
            let next = after_attempt(rules, verdict, None, attempts, t0(), draw);
            match next {
                AfterAttempt::RetryAt(at) => prop_assert!(at >= t0() + chrono::Duration::seconds(10)),
                AfterAttempt::GiveUp(r) => {
                    prop_assert_eq!(r, DeadLetterReason::MaxDeliveryAttemptsExceeded);
                    prop_assert_eq!(status, 413, "only 413 is not retried in 405..600");
                }
                AfterAttempt::Delivered => prop_assert!(false),
            }
        }
    }
}
