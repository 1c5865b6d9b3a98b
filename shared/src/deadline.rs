//! An invocation's deadline (#34 item 12): Lambda stops an invocation still running at it, and
//! then every message of its batch comes back, those it settled included (duplicates), after
//! the whole visibility timeout. So every AWS call an invocation makes ends, or is given up,
//! [`REPLY_MARGIN`] before its deadline, however slowly AWS answers; a record whose writes were
//! given up is reported failed and comes back from SQS on its own (G1).

use std::time::Duration;

use chrono::{DateTime, Utc};

/// What an invocation keeps after its last AWS call to build and return its reply.
pub const REPLY_MARGIN: Duration = Duration::from_secs(1);

/// The reply margin of an invocation that keeps `deadline_margin` before its deadline for its
/// writes after the last attempt: [`REPLY_MARGIN`], or a quarter of that margin if it is
/// shorter, so the writes always keep most of their time (10 s keeps 9 s for them; the 1 s
/// the end-to-end tests keep, 750 ms).
pub fn reply_margin(deadline_margin: Duration) -> Duration {
    REPLY_MARGIN.min(deadline_margin / 4)
}

/// How long an invocation's I/O may still run at `now`: until `reply_margin` before
/// `deadline` (zero once that has passed). `None` when there is no deadline
/// (`DateTime::<Utc>::MAX_UTC`: the handler called without one, as tests and tools do).
pub fn until_stop(
    now: DateTime<Utc>,
    deadline: DateTime<Utc>,
    reply_margin: Duration,
) -> Option<Duration> {
    if deadline == DateTime::<Utc>::MAX_UTC {
        return None;
    }
    Some(
        (deadline - now)
            .to_std()
            .unwrap_or_default()
            .saturating_sub(reply_margin),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_stops_the_reply_margin_before_the_deadline() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let deadline = now + chrono::Duration::seconds(11);
        assert_eq!(
            until_stop(now, deadline, REPLY_MARGIN),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn past_the_stop_no_time_is_left() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let soon = now + chrono::Duration::milliseconds(400);
        assert_eq!(until_stop(now, soon, REPLY_MARGIN), Some(Duration::ZERO));
        assert_eq!(until_stop(soon, now, REPLY_MARGIN), Some(Duration::ZERO));
    }

    #[test]
    fn without_a_deadline_io_is_not_bounded() {
        assert_eq!(
            until_stop(Utc::now(), DateTime::<Utc>::MAX_UTC, REPLY_MARGIN),
            None
        );
    }

    /// The writes after the last attempt keep most of the deadline margin: a short margin
    /// (the end-to-end tests keep 1 s) is not used up by the reply margin.
    #[test]
    fn the_reply_margin_leaves_the_writes_most_of_the_deadline_margin() {
        assert_eq!(reply_margin(Duration::from_secs(10)), REPLY_MARGIN);
        assert_eq!(
            reply_margin(Duration::from_secs(1)),
            Duration::from_millis(250)
        );
    }
}
