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
//! Errors are not the only sign of a full endpoint. One that is busy answers well, only later:
//! each request waits behind the others, and a higher limit buys no throughput, only a longer
//! wait that Lambda bills. So an answer may carry its round-trip time, and the limit reads a
//! queue from them as TCP Vegas does: requests waiting at the endpoint are estimated as the
//! most in flight times the share of the mean round trip not explained by the no-load time
//! (nothing, within [`QUEUE_FLOOR`]). More than a sixth of the limit waiting (and more than
//! 2) holds the limit where it is and ends slow start; more than a third ([`QUEUED_SHARE`],
//! and more than [`QUEUED_LEAST`]), with the limit in use, cuts it by an eighth. Means are over
//! rounds of at least [`ROUND_LEAST`] answers to requests sent after the round began, so one
//! slow answer, or an endpoint whose answers differ from one request to the next, is not read
//! as a queue. An overload's halving starts a new round: the old one was sent under the old
//! limit.
//!
//! The no-load time is not the least time ever seen: an endpoint that became slower for good
//! would be held to its old speed, and a baseline that drifts up lets a limit that grows as
//! slowly as the queue creep to its most. It is measured as BBR's ProbeRTT measures it: every
//! [`PROBE_EVERY`] rounds, and in the round after a queue cut, one round is sent at half the
//! limit (beginning once no more than that is out), and its mean is the no-load time until the
//! next probe; until the first, it is the first round's. Half the limit empties a queue at an
//! endpoint that serves at least that many at once; one that serves fewer shows a queue again
//! and is cut again. At a limit of 64 or more a probe costs an endpoint that does not queue
//! (50 ms however many at once) a round at half speed in every seventeen; below, its 32
//! answers take longer, and at 8 or fewer (where a queue cut takes off one request) there are
//! no probes. Only webhooks are timed (an AWS call's time says little about the resource), so
//! resources never probe.
//!
//! Pure: the worker asks for the limit, takes a ticket per request, and reports each answer.

use std::time::Duration;

use crate::classify::AttemptResult;

/// A round is judged on the mean of at least this many timed answers.
pub const ROUND_LEAST: u32 = 32;

/// Rounds between probes of the no-load time.
pub const PROBE_EVERY: u32 = 16;

/// A round shows a queue when more than 1/this of the limit was waiting at the endpoint...
pub const QUEUED_SHARE: u32 = 3;

/// ...and more than this many: a small limit is never cut for its answers' spread alone.
pub const QUEUED_LEAST: u32 = 4;

/// A round whose mean is within this of the no-load time shows no queue: shorter waits are a
/// scheduler's and a network's noise.
pub const QUEUE_FLOOR: Duration = Duration::from_millis(1);

/// What the last judged round said about a queue at the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueVerdict {
    /// No queue worth the name (or nothing known yet): the limit may grow.
    None,
    /// Some requests waited: the limit stays where it is.
    Forming,
    /// Many waited: the limit was cut.
    Queueing,
}

/// Whether a round whose answers took `mean` on average, with at most `in_flight` at once, at an
/// endpoint whose no-load time is `no_load`, shows a queue under `limit`.
pub fn queue_verdict(
    mean: Duration,
    no_load: Duration,
    in_flight: u32,
    limit: u32,
) -> QueueVerdict {
    if mean.saturating_sub(no_load) <= QUEUE_FLOOR {
        return QueueVerdict::None;
    }
    // Waiting = in_flight × (mean − no_load) / mean, compared in whole microseconds.
    let waiting = u128::from(in_flight) * (mean - no_load).as_micros();
    let mean = mean.as_micros();
    let over = |share: u32, least: u32| waiting > u128::from((limit / share).max(least)) * mean;
    if over(QUEUED_SHARE, QUEUED_LEAST) {
        QueueVerdict::Queueing
    } else if over(2 * QUEUED_SHARE, QUEUED_LEAST / 2) {
        QueueVerdict::Forming
    } else {
        QueueVerdict::None
    }
}

/// The round-trip times of the round under way and what the last ones said.
#[derive(Debug, Clone)]
struct QueueWatch {
    /// Whether the round has begun: a probe begins once no more than half the limit is out,
    /// or a round's worth of answers after it was due (whatever is still out by then).
    open: bool,
    /// Answers since the probe was due and not begun.
    waited: u32,
    /// Requests with a ticket above this were sent during the round.
    from: u64,
    /// Timed answers that end the round.
    size: u32,
    sum: Duration,
    count: u32,
    /// The most in flight when one of the round's requests was sent.
    busiest: u32,
    /// Whether the round is sent at half the limit to measure the no-load time.
    probing: bool,
    /// Rounds since the last probe.
    since_probe: u32,
    /// The mean of the last probe (or of the first round), once there is one.
    no_load: Option<Duration>,
    verdict: QueueVerdict,
}

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
            | AttemptResult::TokenUnavailable(_)
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
    watch: QueueWatch,
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
            watch: QueueWatch {
                open: true,
                waited: 0,
                from: 0,
                size: ROUND_LEAST,
                sum: Duration::ZERO,
                count: 0,
                busiest: 0,
                probing: false,
                since_probe: 0,
                no_load: None,
                verdict: QueueVerdict::None,
            },
        }
    }

    /// Requests the endpoint may have in flight now: its limit, or half of it while the
    /// no-load time is probed.
    pub fn current(&self) -> u32 {
        if self.watch.probing {
            (self.limit / 2).max(1)
        } else {
            self.limit
        }
    }

    /// The limit outside probes.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The endpoint's no-load round-trip time as last measured.
    pub fn no_load(&self) -> Option<Duration> {
        self.watch.no_load
    }

    /// What the last judged round said about a queue.
    pub fn queue_verdict(&self) -> QueueVerdict {
        self.watch.verdict
    }

    /// Whether the round under way probes the no-load time.
    pub fn is_probing(&self) -> bool {
        self.watch.probing
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
        let current = self.current();
        let w = &mut self.watch;
        if !w.open && (self.in_flight <= current || w.waited >= self.limit) {
            // The probe's round begins with the first request sent at half the limit: the
            // requests still out from before were sent at the whole of it.
            w.open = true;
            w.from = self.issued - 1;
            w.busiest = 0;
        }
        w.busiest = w.busiest.max(self.in_flight);
        self.issued
    }

    /// Takes the answer to the request sent with `ticket` (every ticket gets one answer, if
    /// only [`LoadSignal::Silent`]), without its round-trip time.
    pub fn on_answer(&mut self, ticket: u64, signal: LoadSignal) {
        self.on_timed_answer(ticket, signal, None);
    }

    /// Takes the answer to the request sent with `ticket`, and how long it took when it was an
    /// answer ([`LoadSignal::Coped`]): the round-trip times of a round can show a queue.
    pub fn on_timed_answer(&mut self, ticket: u64, signal: LoadSignal, rtt: Option<Duration>) {
        let in_use = u64::from(self.busiest) * 2 >= u64::from(self.limit);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.answered += 1;
        if self.answered >= self.limit {
            // A round trip's worth of answers: the next one starts from what is out now.
            self.answered = 0;
            self.busiest = self.in_flight;
        }
        if !self.watch.open {
            self.watch.waited = self.watch.waited.saturating_add(1);
        }
        if let (LoadSignal::Coped, Some(rtt)) = (signal, rtt)
            && self.watch.open
            && ticket > self.watch.from
        {
            self.watch.sum = self.watch.sum.saturating_add(rtt);
            self.watch.count += 1;
            if self.watch.count >= self.watch.size {
                self.end_round(in_use);
            }
        }
        // Unused, the limit shows nothing about what the endpoint could take; probing, the
        // answers come from half of it; with a queue forming, more requests would only wait.
        let may_grow = in_use && !self.watch.probing && self.watch.verdict == QueueVerdict::None;
        match signal {
            LoadSignal::Silent => {}
            LoadSignal::Coped if !may_grow => {}
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
                // The round's answers and its most in flight were under the old limit: the
                // queue is judged afresh under the new one.
                self.watch.verdict = QueueVerdict::None;
                self.start_round();
            }
            // Sent before the last cut: that cut already answered for it.
            LoadSignal::Overloaded => {}
        }
    }

    /// Judges the round that ended and starts the next. A probe (or the first round) sets the
    /// no-load time; any other round is held against it, and a queue cuts the limit by an
    /// eighth and probes in the next round, as a cut that did not empty the queue shows there.
    fn end_round(&mut self, in_use: bool) {
        let w = &mut self.watch;
        let mean = w.sum / w.count.max(1);
        match w.no_load {
            Some(no_load) if !w.probing => {
                w.verdict = queue_verdict(mean, no_load, w.busiest, self.limit);
                w.since_probe += 1;
                // At a limit this small a queue cut takes off one request and a probe would
                // send 4 or fewer: no probes.
                let may_cut = self.limit > 2 * QUEUED_LEAST;
                if w.verdict == QueueVerdict::Queueing && in_use {
                    self.limit = self.limit.saturating_sub((self.limit / 8).max(1)).max(1);
                    self.credit = 0;
                    self.slow_start = false;
                    w.probing = may_cut;
                } else {
                    if w.verdict == QueueVerdict::Forming {
                        // As Vegas: once a queue forms, the limit no longer doubles.
                        self.slow_start = false;
                    }
                    w.probing = may_cut && w.since_probe >= PROBE_EVERY;
                }
            }
            // The round measured the no-load time.
            _ => {
                w.no_load = Some(mean);
                w.probing = false;
                w.since_probe = 0;
                w.verdict = QueueVerdict::None;
            }
        }
        self.start_round();
    }

    /// Starts a round of the watch: a probe's once no more than half the limit is out.
    fn start_round(&mut self) {
        let size = self.current().max(ROUND_LEAST);
        let w = &mut self.watch;
        w.open = !w.probing;
        w.waited = 0;
        w.from = self.issued;
        w.size = size;
        w.sum = Duration::ZERO;
        w.count = 0;
        w.busiest = 0;
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

    /// A sender with more work than the limit, against an endpoint whose answer to a request
    /// sent at `now` with `in_flight` out takes `rtt(now, in_flight)`: answers come back in the
    /// order they are ready. Returns the limit (outside probes) after each of `answers` answers.
    fn drive(
        limit: &mut ConcurrencyLimit,
        answers: usize,
        mut rtt: impl FnMut(Duration, u32) -> Duration,
    ) -> Vec<u32> {
        use std::cmp::Reverse;
        let mut now = Duration::ZERO;
        let mut out = std::collections::BinaryHeap::new();
        let mut seen = Vec::with_capacity(answers);
        for _ in 0..answers {
            while (out.len() as u32) < limit.current() {
                let ticket = limit.ticket();
                let took = rtt(now, limit.in_flight());
                out.push(Reverse((now + took, ticket, took)));
            }
            let Reverse((ready, ticket, took)) = out.pop().expect("the limit is at least 1");
            now = ready;
            limit.on_timed_answer(ticket, LoadSignal::Coped, Some(took));
            seen.push(limit.limit());
        }
        // Unanswered requests say nothing.
        for Reverse((_, ticket, _)) in out {
            limit.on_answer(ticket, LoadSignal::Silent);
        }
        seen
    }

    /// An endpoint that serves `capacity` requests at once in `service` each; the rest wait
    /// their turn, first come first served.
    fn queueing_endpoint(
        capacity: u32,
        service: Duration,
    ) -> impl FnMut(Duration, u32) -> Duration {
        use std::cmp::Reverse;
        let mut free: std::collections::BinaryHeap<Reverse<Duration>> = (0..capacity.max(1))
            .map(|_| Reverse(Duration::ZERO))
            .collect();
        move |now, _| {
            let Reverse(at) = free.pop().expect("at least one server");
            let done = at.max(now) + service;
            free.push(Reverse(done));
            done - now
        }
    }

    fn range(seen: &[u32]) -> (u32, u32) {
        let low = seen.iter().copied().min().unwrap_or(0);
        let high = seen.iter().copied().max().unwrap_or(0);
        (low, high)
    }

    #[test]
    fn a_slow_endpoint_that_does_not_queue_grows_to_the_max_and_keeps_it() {
        // 50 ms however many at once (the e2e benchmark's subscriber).
        let mut limit = ConcurrencyLimit::new(16, 576);
        let seen = drive(&mut limit, 60_000, |_, _| Duration::from_millis(50));
        let grown = seen
            .iter()
            .position(|&l| l == 576)
            .expect("reaches the max");
        assert!(grown < 2_000, "in slow start: {grown} answers");
        assert_eq!(range(&seen[grown..]), (576, 576));
        assert_eq!(limit.no_load(), Some(Duration::from_millis(50)));
        assert_eq!(limit.queue_verdict(), QueueVerdict::None);
    }

    #[test]
    fn an_endpoint_whose_answers_slow_as_it_gets_more_settles_near_what_it_serves() {
        // Serves 64 at once in 2 ms; more only wait. Never an error.
        let mut limit = ConcurrencyLimit::new(16, 768);
        let seen = drive(
            &mut limit,
            200_000,
            queueing_endpoint(64, Duration::from_millis(2)),
        );
        let (low, high) = range(&seen[50_000..]);
        assert!(
            low >= 64 && high <= 96,
            "settles between what it serves and half as much again (a sixth to a third of the \
             limit waiting), not at the max: {low}..{high}"
        );
        assert_eq!(limit.no_load(), Some(Duration::from_millis(2)));
    }

    #[test]
    fn a_limit_far_above_what_the_endpoint_serves_comes_down() {
        // Starts at 576 against an endpoint that serves 32 at once: a queue of 544 from the
        // first request, which the probes show however deep it is.
        let mut limit = ConcurrencyLimit::new(576, 576);
        let seen = drive(
            &mut limit,
            200_000,
            queueing_endpoint(32, Duration::from_millis(5)),
        );
        let (low, high) = range(&seen[100_000..]);
        assert!(
            low >= 32 && high <= 48,
            "comes down to between 32 and half as much again: {low}..{high}"
        );
    }

    #[test]
    fn an_endpoint_whose_answers_differ_from_one_request_to_the_next_is_not_taken_for_a_queue() {
        // 10 ms or 70 ms at random, however many at once: the mean is four times the least.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut limit = ConcurrencyLimit::new(16, 256);
        let seen = drive(&mut limit, 100_000, |_, _| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            Duration::from_millis(if state.is_multiple_of(2) { 10 } else { 70 })
        });
        // It is cut now and then (a round of mostly slow answers looks like a queue) and grows
        // back: on average it keeps more than half of the most, and never less than a quarter.
        let settled = &seen[50_000..];
        let (low, _) = range(settled);
        let mean = settled.iter().map(|&l| u64::from(l)).sum::<u64>() / settled.len() as u64;
        assert!(
            low >= 64 && mean >= 128,
            "not held down by the spread: {low} at least, {mean} on average"
        );
    }

    #[test]
    fn an_endpoint_that_became_slower_for_good_is_not_held_to_its_old_speed() {
        let mut limit = ConcurrencyLimit::new(16, 200);
        drive(&mut limit, 5_000, |_, _| Duration::from_millis(10));
        assert_eq!(limit.limit(), 200);
        // From now on 30 ms at any load: the next probe learns it, at the cost of a cut or two.
        let seen = drive(&mut limit, 20_000, |_, _| Duration::from_millis(30));
        let (low, _) = range(&seen);
        assert!(low >= 150, "one or two cuts at most: {low}");
        assert_eq!(limit.limit(), 200);
        assert_eq!(limit.no_load(), Some(Duration::from_millis(30)));
    }

    #[test]
    fn a_probe_sends_half_the_limit_for_one_round_every_probe_every_rounds() {
        // One request at a time, 20 ms each: the first round (ROUND_LEAST answers) measures the
        // no-load time; after PROBE_EVERY rounds of 64, a probe round of 32 at half the limit.
        let mut limit = ConcurrencyLimit::new(64, 64);
        let mut probes = Vec::new();
        for answer in 1..=3_000u32 {
            let t = limit.ticket();
            let was_probing = limit.is_probing();
            limit.on_timed_answer(t, LoadSignal::Coped, Some(Duration::from_millis(20)));
            if limit.is_probing() && !was_probing {
                assert_eq!(limit.current(), 32);
                probes.push(answer);
            }
            assert_eq!(limit.limit(), 64);
        }
        let round = 64;
        let first = ROUND_LEAST + round * PROBE_EVERY;
        assert_eq!(probes, [first, first + 32 + round * PROBE_EVERY]);
    }

    #[test]
    fn a_probe_begins_even_if_requests_sent_before_it_never_come_back() {
        let mut limit = ConcurrencyLimit::new(64, 64);
        // Forty requests whose answers never come (a worker never does this: a dropped
        // request answers Silent; still, a lost answer must not hold a probe open for ever).
        for _ in 0..40 {
            limit.ticket();
        }
        let mut probes_ended = 0;
        for _ in 0..3_000 {
            let was_probing = limit.is_probing();
            let t = limit.ticket();
            limit.on_timed_answer(t, LoadSignal::Coped, Some(Duration::from_millis(20)));
            if was_probing && !limit.is_probing() {
                probes_ended += 1;
            }
        }
        assert_eq!(probes_ended, 2);
        assert_eq!(limit.current(), 64);
    }

    #[test]
    fn waits_under_the_floor_or_a_share_of_the_limit_are_not_a_queue() {
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        // Three times the no-load time, but only 0.4 ms above it: noise.
        assert_eq!(
            queue_verdict(us(600), us(200), 500, 500),
            QueueVerdict::None
        );
        assert_eq!(
            queue_verdict(us(1_800), us(200), 500, 500),
            QueueVerdict::Queueing
        );
        // 120 at once, a quarter of the mean unexplained: 30 waiting, more than a sixth of
        // 120, not more than a third.
        assert_eq!(
            queue_verdict(ms(80), ms(60), 120, 120),
            QueueVerdict::Forming
        );
        // Half unexplained: 60 waiting.
        assert_eq!(
            queue_verdict(ms(120), ms(60), 120, 120),
            QueueVerdict::Queueing
        );
        // A tenth unexplained: 12 waiting, under a sixth.
        assert_eq!(queue_verdict(ms(100), ms(90), 120, 120), QueueVerdict::None);
        // The same mean with only 12 sent at once: not the limit's queue.
        assert_eq!(queue_verdict(ms(120), ms(60), 12, 120), QueueVerdict::None);
        // 8 at once, half unexplained: 4 waiting, not more than 4.
        assert_eq!(queue_verdict(ms(20), ms(10), 8, 8), QueueVerdict::Forming);
        assert_eq!(queue_verdict(ms(30), ms(10), 8, 8), QueueVerdict::Queueing);
    }

    #[test]
    fn answers_without_a_time_never_probe() {
        // An AWS resource's calls: overload is all the limit reads.
        let mut limit = ConcurrencyLimit::new(8, 500);
        for _ in 0..10 {
            round_trip(&mut limit, LoadSignal::Coped);
            assert!(!limit.is_probing());
        }
        assert_eq!(limit.current(), 500);
        assert_eq!(limit.no_load(), None);
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
        /// Whatever the answers and however long they took, the limit stays in [1, max] (and
        /// what may be sent now in [1, limit]), and an overload from a request sent after the
        /// last cut never leaves it higher than half of what it was (rounded up to 1).
        #[test]
        fn the_limit_stays_in_bounds(
            initial in 0u32..2_000,
            max in 0u32..2_000,
            answers in proptest::collection::vec((0u8..3, any::<bool>(), proptest::option::of(0u64..100_000)), 0..2_000),
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
                prop_assert!((1..=max.max(1)).contains(&limit.limit()));
                prop_assert!((1..=limit.limit()).contains(&limit.current()));
                if signal == LoadSignal::Overloaded && was_fresh {
                    prop_assert_eq!(limit.current(), (before / 2).max(1));
                }
            }
        }
    }
}
