//! How many requests one endpoint gets at once: a limit that follows its answers.
//!
//! Lambda bills `deliver` for every millisecond it waits, so requests to an endpoint that
//! answers well should all be in flight together, and an endpoint that struggles should get
//! fewer. [`ConcurrencyLimit`] is additive-increase, multiplicative-decrease (AIMD), as TCP
//! congestion control: it starts small and doubles per round trip while every answer is good
//! (slow start); the first sign of overload (429, 503, 504, a timeout, a refused connection)
//! halves it and ends slow start; after that it grows by one per round trip of good answers.
//! A burst of failures from requests sent before a cut counts as one sign, not many (each
//! request carries the ticket it was sent with), so one bad moment halves the limit once.
//!
//! Pure: the worker asks for the limit, takes a ticket per request, and reports each answer.

use crate::classify::AttemptResult;

/// What an answer says about the endpoint's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadSignal {
    /// It answered, whatever it said: it had room for the request.
    Coped,
    /// It said it is overloaded, or did not answer in time, or refused the connection.
    Overloaded,
    /// Nothing reached it (the request was never sent).
    Silent,
}

impl LoadSignal {
    /// What an attempt's result says.
    pub fn of(result: &AttemptResult) -> Self {
        match result {
            AttemptResult::Status(429 | 503 | 504)
            | AttemptResult::TimedOut
            | AttemptResult::ConnectionFailed(_) => Self::Overloaded,
            AttemptResult::Status(_) => Self::Coped,
            AttemptResult::NotSent(_) => Self::Silent,
        }
    }
}

/// One endpoint's concurrency limit (AIMD with slow start).
#[derive(Debug, Clone)]
pub struct ConcurrencyLimit {
    limit: u32,
    max: u32,
    /// Good answers since the limit last grew, out of slow start: at `limit` of them (one round
    /// trip's worth) it grows by one.
    credit: u32,
    slow_start: bool,
    /// Tickets issued so far; a request's ticket is the count when it was sent.
    issued: u64,
    /// Requests with a ticket below this were sent before the last cut.
    cut_at: u64,
}

impl ConcurrencyLimit {
    /// Starts at `initial` (at least 1), never above `max` (at least 1).
    pub fn new(initial: u32, max: u32) -> Self {
        let max = max.max(1);
        Self {
            limit: initial.clamp(1, max),
            max,
            credit: 0,
            slow_start: true,
            issued: 0,
            cut_at: 0,
        }
    }

    /// Requests the endpoint may have in flight now.
    pub fn current(&self) -> u32 {
        self.limit
    }

    /// The ticket of a request sent now.
    pub fn ticket(&mut self) -> u64 {
        self.issued += 1;
        self.issued
    }

    /// Takes the answer to the request sent with `ticket`.
    pub fn on_answer(&mut self, ticket: u64, signal: LoadSignal) {
        match signal {
            LoadSignal::Silent => {}
            LoadSignal::Coped if self.slow_start => self.limit = (self.limit + 1).min(self.max),
            LoadSignal::Coped => {
                self.credit += 1;
                if self.credit >= self.limit {
                    self.credit = 0;
                    self.limit = (self.limit + 1).min(self.max);
                }
            }
            LoadSignal::Overloaded if ticket > self.cut_at => {
                self.limit = (self.limit / 2).max(1);
                self.credit = 0;
                self.slow_start = false;
                self.cut_at = self.issued;
            }
            // Sent before the last cut: that cut already answered for it.
            LoadSignal::Overloaded => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One round trip at the current limit: as many requests as it allows, each answered with
    /// `signal`.
    fn round_trip(limit: &mut ConcurrencyLimit, signal: LoadSignal) {
        let tickets: Vec<u64> = (0..limit.current()).map(|_| limit.ticket()).collect();
        for t in tickets {
            limit.on_answer(t, signal);
        }
    }

    #[test]
    fn an_endpoint_that_copes_gets_twice_as_many_requests_each_round_trip_until_the_max() {
        let mut limit = ConcurrencyLimit::new(8, 500);
        let mut seen = vec![limit.current()];
        for _ in 0..8 {
            round_trip(&mut limit, LoadSignal::Coped);
            seen.push(limit.current());
        }
        assert_eq!(seen, [8, 16, 32, 64, 128, 256, 500, 500, 500]);
    }

    #[test]
    fn overload_halves_the_limit_once_per_round_trip_then_it_grows_by_one() {
        let mut limit = ConcurrencyLimit::new(64, 1000);
        // Every request of the round trip says overloaded: one cut, not 64.
        round_trip(&mut limit, LoadSignal::Overloaded);
        assert_eq!(limit.current(), 32);
        round_trip(&mut limit, LoadSignal::Overloaded);
        assert_eq!(limit.current(), 16);
        // Out of slow start: one more per round trip of good answers.
        round_trip(&mut limit, LoadSignal::Coped);
        assert_eq!(limit.current(), 17);
        round_trip(&mut limit, LoadSignal::Coped);
        assert_eq!(limit.current(), 18);
    }

    #[test]
    fn a_request_sent_after_a_cut_can_cut_again() {
        let mut limit = ConcurrencyLimit::new(40, 100);
        let before = limit.ticket();
        let also_before = limit.ticket();
        limit.on_answer(before, LoadSignal::Overloaded);
        assert_eq!(limit.current(), 20);
        limit.on_answer(also_before, LoadSignal::Overloaded);
        assert_eq!(
            limit.current(),
            20,
            "sent before the cut: already answered for"
        );
        let after = limit.ticket();
        limit.on_answer(after, LoadSignal::Overloaded);
        assert_eq!(limit.current(), 10);
    }

    #[test]
    fn what_each_answer_says_about_load() {
        let overloaded = [
            AttemptResult::Status(429),
            AttemptResult::Status(503),
            AttemptResult::Status(504),
            AttemptResult::TimedOut,
            AttemptResult::ConnectionFailed("refused".into()),
        ];
        for r in &overloaded {
            assert_eq!(LoadSignal::of(r), LoadSignal::Overloaded, "{r:?}");
        }
        for s in [200, 400, 404, 500, 302] {
            assert_eq!(
                LoadSignal::of(&AttemptResult::Status(s)),
                LoadSignal::Coped,
                "{s}"
            );
        }
        assert_eq!(
            LoadSignal::of(&AttemptResult::NotSent("no secret".into())),
            LoadSignal::Silent
        );
    }

    proptest! {
        /// Whatever the answers, the limit stays in [1, max], and an overload from a request
        /// sent after the last cut never leaves it higher than half of what it was (rounded
        /// up to 1).
        #[test]
        fn the_limit_stays_in_bounds(
            initial in 0u32..2_000,
            max in 0u32..2_000,
            answers in proptest::collection::vec((0u8..3, any::<bool>()), 0..500),
        ) {
            let mut limit = ConcurrencyLimit::new(initial, max);
            let mut tickets = Vec::new();
            for (kind, fresh) in answers {
                let ticket = if fresh || tickets.is_empty() {
                    let t = limit.ticket();
                    tickets.push(t);
                    t
                } else {
                    tickets[tickets.len() / 2]
                };
                let signal = [LoadSignal::Coped, LoadSignal::Overloaded, LoadSignal::Silent][usize::from(kind)];
                let before = limit.current();
                let was_fresh = ticket > limit.cut_at;
                limit.on_answer(ticket, signal);
                prop_assert!((1..=max.max(1)).contains(&limit.current()));
                if signal == LoadSignal::Overloaded && was_fresh {
                    prop_assert_eq!(limit.current(), (before / 2).max(1));
                }
            }
        }
    }
}
