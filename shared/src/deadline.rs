//! An invocation's deadline (#34 item 12): Lambda stops an invocation still running at it, and
//! then every message of its batch comes back, those it settled included (duplicates), after
//! the whole visibility timeout. So every AWS call an invocation makes ends, or is given up,
//! [`REPLY_MARGIN`] before its deadline, however slowly AWS answers; a record whose writes were
//! given up is reported failed and comes back from SQS on its own (G1).

use std::time::Duration;

use chrono::{DateTime, Utc};

/// What an invocation keeps after its last AWS call to build and return its reply.
pub const REPLY_MARGIN: Duration = Duration::from_secs(1);

/// How long an invocation's I/O may still run at `now`: until [`REPLY_MARGIN`] before
/// `deadline` (zero once that has passed). `None` when there is no deadline
/// (`DateTime::<Utc>::MAX_UTC`: the handler called without one, as tests and tools do).
pub fn until_stop(now: DateTime<Utc>, deadline: DateTime<Utc>) -> Option<Duration> {
    if deadline == DateTime::<Utc>::MAX_UTC {
        return None;
    }
    Some(
        (deadline - now)
            .to_std()
            .unwrap_or_default()
            .saturating_sub(REPLY_MARGIN),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_stops_the_reply_margin_before_the_deadline() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let deadline = now + chrono::Duration::seconds(11);
        assert_eq!(until_stop(now, deadline), Some(Duration::from_secs(10)));
    }

    #[test]
    fn past_the_stop_no_time_is_left() {
        let now = DateTime::<Utc>::UNIX_EPOCH;
        let soon = now + chrono::Duration::milliseconds(400);
        assert_eq!(until_stop(now, soon), Some(Duration::ZERO));
        assert_eq!(until_stop(soon, now), Some(Duration::ZERO));
    }

    #[test]
    fn without_a_deadline_io_is_not_bounded() {
        assert_eq!(until_stop(Utc::now(), DateTime::<Utc>::MAX_UTC), None);
    }
}
