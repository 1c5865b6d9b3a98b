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
//! A good answer grows the limit only while the limit is in use (at least half of it in
//! flight at some moment of the current round trip): an endpoint sent one request at a time
//! proves nothing about a hundred, and a limit that grew unused would let a sudden burst
//! through at once.
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
    /// Nothing reached it (the request was never sent, or its name did not resolve).
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
            // A throttled AWS service (and a queue that is full) is overloaded; any other
            // error was an answer.
            AttemptResult::Service(f) if f.status == 503 => Self::Overloaded,
            AttemptResult::Service(_) => Self::Coped,
            AttemptResult::NotSent(_)
            | AttemptResult::Refused(_)
            | AttemptResult::Unresolved(_) => Self::Silent,
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
    /// Requests with a ticket and no answer yet.
    in_flight: u32,
    /// The most in flight at once this round trip (the last `limit` answers' worth).
    busiest: u32,
    /// Answers this round trip.
    answered: u32,
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
            in_flight: 0,
            busiest: 0,
            answered: 0,
        }
    }

    /// Requests the endpoint may have in flight now.
    pub fn current(&self) -> u32 {
        self.limit
    }

    /// Requests sent and not answered yet.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The ticket of a request sent now.
    pub fn ticket(&mut self) -> u64 {
        self.issued += 1;
        self.in_flight = self.in_flight.saturating_add(1);
        self.busiest = self.busiest.max(self.in_flight);
        self.issued
    }

    /// Takes the answer to the request sent with `ticket` (every ticket gets one answer, if
    /// only [`LoadSignal::Silent`]).
    pub fn on_answer(&mut self, ticket: u64, signal: LoadSignal) {
        let in_use = u64::from(self.busiest) * 2 >= u64::from(self.limit);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.answered += 1;
        if self.answered >= self.limit {
            // A round trip's worth of answers: the next one starts from what is out now.
            self.answered = 0;
            self.busiest = self.in_flight;
        }
        match signal {
            LoadSignal::Silent => {}
            // Unused, the limit shows nothing about what the endpoint could take.
            LoadSignal::Coped if !in_use => {}
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

    /// One round trip of a sender with more work than the limit: as many answers as the
    /// limit was when it began, each `signal`, with the limit's worth in flight before each
    /// (every answer makes room for the next request). Ends with nothing in flight.
    fn round_trip(limit: &mut ConcurrencyLimit, signal: LoadSignal) {
        let mut out = std::collections::VecDeque::new();
        for _ in 0..limit.current() {
            while out.len() < limit.current() as usize {
                out.push_back(limit.ticket());
            }
            let t = out.pop_front().unwrap();
            limit.on_answer(t, signal);
        }
        // Unanswered requests say nothing.
        for t in out {
            limit.on_answer(t, LoadSignal::Silent);
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
    fn a_limit_grows_only_while_it_is_in_use() {
        let mut limit = ConcurrencyLimit::new(16, 1000);
        // One request at a time, a thousand times: nothing learnt about sixteen at once.
        for _ in 0..1000 {
            let t = limit.ticket();
            limit.on_answer(t, LoadSignal::Coped);
        }
        assert_eq!(limit.current(), 16);
        assert_eq!(limit.in_flight(), 0);
        // Eight at once is half the limit: their answers grow it.
        let tickets: Vec<u64> = (0..8).map(|_| limit.ticket()).collect();
        limit.on_answer(tickets[0], LoadSignal::Coped);
        assert_eq!(limit.current(), 17);
        // Seven left out of seventeen: under half, the rest grow nothing.
        for t in &tickets[1..] {
            limit.on_answer(*t, LoadSignal::Coped);
        }
        assert_eq!(limit.current(), 17);
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
