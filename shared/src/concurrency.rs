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
//! Errors are not the only sign of a full endpoint: one that is busy answers well, only later,
//! each request waiting behind the others (the limit then buys no more throughput, only a longer
//! wait that Lambda bills). So answers may carry their round-trip time, and a round trip whose
//! mean says more than half the limit was waiting ([`is_queueing`], as TCP Vegas reads
//! a rising RTT; at least [`QUEUED_LEAST`] requests, and the mean [`QUEUE_FLOOR`] above the
//! endpoint's no-load time) says requests are queueing: the limit stops growing, ends slow
//! start, and gives back an eighth. The no-load time is the least round-trip time seen,
//! drifting up by 1/[`NO_LOAD_DRIFT`] each round trip that shows nothing lower, so an endpoint
//! that has become slower for good is not held to its old speed. A slow endpoint that is not
//! queueing (50 ms every time, however many at once) keeps growing, and a small limit is never
//! cut for the spread of its answers alone.
//!
//! Pure: the worker asks for the limit, takes a ticket per request, and reports each answer.

use std::time::Duration;

use crate::classify::AttemptResult;

/// A round trip is queueing when the requests it estimates were waiting at the endpoint (as
/// TCP Vegas does: the limit times the share of the mean round trip not explained by the
/// no-load time) are more than half the limit...
pub const QUEUED_SHARE: u32 = 2;

/// ...and more than this many: a small limit is never cut for its answers' spread alone...
pub const QUEUED_LEAST: u32 = 4;

/// ...and its mean more than this above the no-load time: shorter waits are a scheduler's and
/// a network's noise.
pub const QUEUE_FLOOR: Duration = Duration::from_millis(1);

/// The no-load time rises by 1/this each round trip that shows nothing lower (it doubles in
/// about 180 round trips: seconds for an endpoint that answers in tens of milliseconds).
pub const NO_LOAD_DRIFT: u32 = 256;

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
    /// Round-trip times of this round trip's answers that carried one: their sum and count,
    /// and the least.
    round_rtt: RoundTimes,
    /// The least round-trip time seen, drifting up ([`NO_LOAD_DRIFT`]); none before one.
    no_load: Option<Duration>,
    /// Whether the last round trip's answers showed requests queueing at the endpoint.
    queueing: bool,
}

/// What one round trip's answers took.
#[derive(Debug, Clone, Copy, Default)]
struct RoundTimes {
    sum: Duration,
    count: u32,
    least: Option<Duration>,
}

impl RoundTimes {
    fn add(&mut self, rtt: Duration) {
        self.sum = self.sum.saturating_add(rtt);
        self.count += 1;
        self.least = Some(self.least.map_or(rtt, |l| l.min(rtt)));
    }

    fn mean(&self) -> Option<Duration> {
        (self.count > 0).then(|| self.sum / self.count)
    }
}

/// Whether a round trip with `mean`, under `limit`, shows requests queueing at an endpoint
/// whose no-load time is `no_load`.
pub fn is_queueing(mean: Duration, no_load: Duration, limit: u32) -> bool {
    if mean.saturating_sub(no_load) <= QUEUE_FLOOR {
        return false;
    }
    // limit × (mean − no_load) / mean > max(QUEUED_LEAST, limit / QUEUED_SHARE), in whole
    // microseconds.
    let waiting = u128::from(limit) * (mean - no_load).as_micros();
    let most = u128::from(QUEUED_LEAST.max(limit / QUEUED_SHARE)) * mean.as_micros();
    waiting > most
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
            round_rtt: RoundTimes::default(),
            no_load: None,
            queueing: false,
        }
    }

    /// The endpoint's no-load round-trip time as learnt so far.
    pub fn no_load(&self) -> Option<Duration> {
        self.no_load
    }

    /// Whether the last round trip showed requests queueing.
    pub fn is_queueing(&self) -> bool {
        self.queueing
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
    /// only [`LoadSignal::Silent`]), without its round-trip time.
    pub fn on_answer(&mut self, ticket: u64, signal: LoadSignal) {
        self.on_timed_answer(ticket, signal, None);
    }

    /// Takes the answer to the request sent with `ticket`, and how long it took when it was an
    /// answer ([`LoadSignal::Coped`]): a round trip of slower answers can show queueing.
    pub fn on_timed_answer(&mut self, ticket: u64, signal: LoadSignal, rtt: Option<Duration>) {
        let in_use = u64::from(self.busiest) * 2 >= u64::from(self.limit);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.answered += 1;
        if let (LoadSignal::Coped, Some(rtt)) = (signal, rtt) {
            self.round_rtt.add(rtt);
        }
        if self.answered >= self.limit {
            // A round trip's worth of answers: the next one starts from what is out now.
            self.answered = 0;
            self.busiest = self.in_flight;
            self.end_round(in_use);
        }
        match signal {
            LoadSignal::Silent => {}
            // Unused, the limit shows nothing about what the endpoint could take; queueing,
            // more requests would only wait longer.
            LoadSignal::Coped if !in_use || self.queueing => {}
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

    /// Judges the round trip that ended: the no-load time learnt from it, and whether its
    /// answers waited in a queue. A limit in use that queued gives back an eighth.
    fn end_round(&mut self, in_use: bool) {
        let round = std::mem::take(&mut self.round_rtt);
        let (Some(mean), Some(least)) = (round.mean(), round.least) else {
            self.queueing = false;
            return;
        };
        let no_load = match self.no_load {
            Some(known) => least.min(known.saturating_add(known / NO_LOAD_DRIFT)),
            None => least,
        };
        self.no_load = Some(no_load);
        self.queueing = is_queueing(mean, no_load, self.limit);
        if self.queueing && in_use {
            self.limit = self.limit.saturating_sub((self.limit / 8).max(1)).max(1);
            self.credit = 0;
            self.slow_start = false;
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

    /// One round trip as [`round_trip`], each answer good and taking `rtt(in flight when it
    /// was sent)`.
    fn timed_round_trip(limit: &mut ConcurrencyLimit, rtt: impl Fn(u32) -> Duration) {
        let mut out = std::collections::VecDeque::new();
        for _ in 0..limit.current() {
            while out.len() < limit.current() as usize {
                let t = limit.ticket();
                out.push_back((t, rtt(limit.in_flight())));
            }
            let (t, took) = out.pop_front().unwrap();
            limit.on_timed_answer(t, LoadSignal::Coped, Some(took));
        }
        for (t, _) in out {
            limit.on_answer(t, LoadSignal::Silent);
        }
    }

    /// An endpoint that serves `capacity` requests at once in `service`; the rest wait their
    /// turn.
    fn queueing_endpoint(capacity: u32, service: Duration) -> impl Fn(u32) -> Duration {
        move |in_flight| service * in_flight.div_ceil(capacity).max(1)
    }

    #[test]
    fn an_endpoint_whose_answers_slow_as_it_gets_more_stops_growing_near_what_it_serves() {
        // Serves 64 at once in 2 ms; more only wait. No error ever.
        let mut limit = ConcurrencyLimit::new(16, 768);
        let mut seen = Vec::new();
        for _ in 0..300 {
            timed_round_trip(&mut limit, queueing_endpoint(64, Duration::from_millis(2)));
            seen.push(limit.current());
        }
        let settled = &seen[100..];
        let (low, high) = (
            *settled.iter().min().unwrap(),
            *settled.iter().max().unwrap(),
        );
        assert!(
            (48..=128).contains(&low) && (48..=128).contains(&high),
            "settles near 64, not at the max: {low}..{high} ({seen:?})"
        );
        assert_eq!(limit.no_load(), Some(Duration::from_millis(2)));
    }

    #[test]
    fn a_slow_endpoint_that_does_not_queue_grows_to_the_max() {
        // 50 ms, however many at once (the e2e benchmark's subscriber).
        let mut limit = ConcurrencyLimit::new(16, 576);
        for _ in 0..10 {
            timed_round_trip(&mut limit, |_| Duration::from_millis(50));
        }
        assert_eq!(limit.current(), 576);
        assert!(!limit.is_queueing());
    }

    #[test]
    fn a_small_limit_is_not_cut_for_the_spread_of_its_answers() {
        // Answers between 10 and 70 ms whatever the load: the mean (40) is four times the least,
        // but four requests at once cannot show more than four waiting.
        let mut limit = ConcurrencyLimit::new(4, 4);
        let spread = std::cell::Cell::new(0u32);
        for _ in 0..50 {
            timed_round_trip(&mut limit, |_| {
                spread.set(spread.get() + 1);
                Duration::from_millis(if spread.get().is_multiple_of(2) {
                    10
                } else {
                    70
                })
            });
        }
        assert_eq!(limit.current(), 4);
    }

    #[test]
    fn waits_under_the_floor_or_half_the_limit_are_not_queueing() {
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        // Three times the no-load time, but only 0.4 ms above it: noise.
        assert!(!is_queueing(us(600), us(200), 500));
        assert!(is_queueing(us(1_800), us(200), 500));
        // 100 at once, half of the mean unexplained: 50 waiting, not more than half.
        assert!(!is_queueing(ms(80), ms(40), 100));
        // 60 % unexplained: 60 waiting.
        assert!(is_queueing(ms(100), ms(40), 100));
        // 8 at once, half of the mean unexplained: 4 waiting, not more than 4.
        assert!(!is_queueing(ms(20), ms(10), 8));
        assert!(is_queueing(ms(30), ms(10), 8));
    }

    #[test]
    fn an_endpoint_that_became_slower_for_good_is_not_held_to_its_old_speed() {
        let mut limit = ConcurrencyLimit::new(16, 200);
        for _ in 0..10 {
            timed_round_trip(&mut limit, |_| Duration::from_millis(10));
        }
        assert_eq!(limit.current(), 200);
        // From now on 30 ms at any load: at first that reads as a queue and the limit gives
        // way; the no-load time then rises to 30 ms and the limit grows back.
        let mut lowest = limit.current();
        for _ in 0..600 {
            timed_round_trip(&mut limit, |_| Duration::from_millis(30));
            lowest = lowest.min(limit.current());
        }
        assert!(
            lowest < 200,
            "the slower answers were taken for a queue at first"
        );
        assert_eq!(limit.no_load(), Some(Duration::from_millis(30)));
        assert!(!limit.is_queueing());
        assert!(
            limit.current() > lowest,
            "grows again once the new speed is learnt: {lowest} -> {}",
            limit.current()
        );
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
        /// Whatever the answers and however long they took, the limit stays in [1, max], and
        /// an overload from a request sent after the last cut never leaves it higher than half
        /// of what it was (rounded up to 1).
        #[test]
        fn the_limit_stays_in_bounds(
            initial in 0u32..2_000,
            max in 0u32..2_000,
            answers in proptest::collection::vec((0u8..3, any::<bool>(), proptest::option::of(0u64..100_000)), 0..500),
        ) {
            let mut limit = ConcurrencyLimit::new(initial, max);
            let mut tickets = Vec::new();
            for (kind, fresh, rtt) in answers {
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
                limit.on_timed_answer(ticket, signal, rtt.map(Duration::from_micros));
                prop_assert!((1..=max.max(1)).contains(&limit.current()));
                if signal == LoadSignal::Overloaded && was_fresh {
                    prop_assert!(limit.current() <= (before / 2).max(1));
                }
            }
        }
    }
}
