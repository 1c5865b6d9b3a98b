//! Who may send now: a limit per endpoint that follows its answers, under one for the worker.
//!
//! Lambda bills `deliver` for the time it waits on endpoints, so an invocation sends all it can
//! at once: up to [`ConcurrencySettings::max_in_flight`] requests in total (Lambda gives a
//! function 1,024 file descriptors), and to each endpoint as many as its
//! [`ConcurrencyLimit`] allows, which grows while it answers well and halves when it shows
//! overload. A slow endpoint's requests wait for its own permits, not the worker's, and no
//! endpoint gets more than three quarters of the total unless told otherwise, so an endpoint that
//! answers slowly but well (its limit grows to its most) leaves the others at least a quarter. The limits live as long as the worker (a warm Lambda container, the
//! local runner's process), so what one invocation learnt about an endpoint the next one uses.
//!
//! Endpoints are told apart by origin (scheme, host, port): that is the server that carries
//! the load, whatever the path. An AWS resource is told apart by its ARN.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use gridrelay_adapters::descriptors;
use gridrelay_shared::concurrency::{ConcurrencyLimit, LoadSignal};
use gridrelay_shared::limits::LimitError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many requests a worker sends at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencySettings {
    /// Requests in flight at once, across endpoints.
    pub max_in_flight: u32,
    /// Where each endpoint's limit starts (it doubles per round trip of good answers).
    pub initial_per_endpoint: u32,
    /// The most any one endpoint gets (default: three quarters of `max_in_flight`).
    pub max_per_endpoint: u32,
}

/// Where the deliver Lambda reads its total (the local runner: `--max-requests-in-flight`).
pub const MAX_REQUESTS_IN_FLIGHT_ENV: &str = "GRIDRELAY_MAX_REQUESTS_IN_FLIGHT";
/// Where it reads the most one endpoint gets (`--max-requests-per-endpoint`).
pub const MAX_REQUESTS_PER_ENDPOINT_ENV: &str = "GRIDRELAY_MAX_REQUESTS_PER_ENDPOINT";

/// The worker's total: Lambda gives a function 1,024 file descriptors. Requests in flight and
/// the process's own descriptors (the runtime's, the SDK's connections; up to
/// [`descriptors::RESERVE`]) stay below the mark where the sender's descriptor guard flushes
/// its idle connections ([`gridrelay_adapters::descriptors`]).
pub const MAX_REQUESTS_IN_FLIGHT: std::ops::RangeInclusive<u32> =
    1..=(descriptors::DEFAULT_LIMIT - descriptors::FLUSH_AT - descriptors::RESERVE) as u32;
/// The default total.
pub const DEFAULT_MAX_REQUESTS_IN_FLIGHT: u32 = 768;
/// Where each endpoint's limit starts, unless the most it may get is lower.
pub const INITIAL_PER_ENDPOINT: u32 = 16;

impl Default for ConcurrencySettings {
    fn default() -> Self {
        Self {
            max_in_flight: DEFAULT_MAX_REQUESTS_IN_FLIGHT,
            initial_per_endpoint: INITIAL_PER_ENDPOINT,
            max_per_endpoint: default_max_per_endpoint(DEFAULT_MAX_REQUESTS_IN_FLIGHT),
        }
    }
}

/// The most one endpoint gets unless told: three quarters of the total (at least 1), so the
/// others always have a quarter. Measured (`make bench`): at half, one endpoint answering in
/// 50 ms was held to 384 requests and 0.66 of its 0 ms rate.
pub fn default_max_per_endpoint(max_in_flight: u32) -> u32 {
    (max_in_flight - max_in_flight / 4).max(1)
}

impl ConcurrencySettings {
    /// `max_in_flight` in total and at most `max_per_endpoint` (default: three quarters of it) to one
    /// endpoint; refused out of range, naming the setting, the value and the range.
    pub fn new(max_in_flight: u32, max_per_endpoint: Option<u32>) -> Result<Self, LimitError> {
        if !MAX_REQUESTS_IN_FLIGHT.contains(&max_in_flight) {
            return Err(LimitError::new(
                "maxRequestsInFlight",
                max_in_flight,
                format!(
                    "{} to {} (Lambda gives a function 1,024 file descriptors)",
                    MAX_REQUESTS_IN_FLIGHT.start(),
                    MAX_REQUESTS_IN_FLIGHT.end()
                ),
            ));
        }
        let per_endpoint = max_per_endpoint.unwrap_or(default_max_per_endpoint(max_in_flight));
        if !(1..=max_in_flight).contains(&per_endpoint) {
            return Err(LimitError::new(
                "maxRequestsPerEndpoint",
                per_endpoint,
                format!("1 to maxRequestsInFlight ({max_in_flight})"),
            ));
        }
        Ok(Self {
            max_in_flight,
            initial_per_endpoint: INITIAL_PER_ENDPOINT.min(per_endpoint),
            max_per_endpoint: per_endpoint,
        })
    }

    /// From [`MAX_REQUESTS_IN_FLIGHT_ENV`] and [`MAX_REQUESTS_PER_ENDPOINT_ENV`], each
    /// optional.
    pub fn from_env() -> Result<Self, LimitError> {
        let read =
            |name: &str, field: &str| -> Result<Option<u32>, LimitError> {
                match std::env::var(name) {
                    Ok(v) if !v.trim().is_empty() => v.trim().parse().map(Some).map_err(|_| {
                        LimitError::new(format!("{field} ({name})"), v, "a whole number")
                    }),
                    _ => Ok(None),
                }
            };
        Self::new(
            read(MAX_REQUESTS_IN_FLIGHT_ENV, "maxRequestsInFlight")?
                .unwrap_or(DEFAULT_MAX_REQUESTS_IN_FLIGHT),
            read(MAX_REQUESTS_PER_ENDPOINT_ENV, "maxRequestsPerEndpoint")?,
        )
    }
}

/// Endpoints tracked before idle ones are forgotten.
const TRACKED_ENDPOINTS: usize = 4096;

/// The worker's send permits: one pool in total and one per endpoint.
pub struct EndpointLimits {
    settings: ConcurrencySettings,
    total: Arc<Semaphore>,
    endpoints: Mutex<HashMap<String, Arc<Endpoint>>>,
}

/// One endpoint's permits: the semaphore holds as many as its limit, less what it owes after
/// a cut that found permits out.
struct Endpoint {
    permits: Arc<Semaphore>,
    state: Mutex<EndpointState>,
}

struct EndpointState {
    limit: ConcurrencyLimit,
    /// Permits to forget as they come back (the limit was cut while they were out).
    owed: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The key an endpoint's load is counted under: a URL's origin; an AWS resource's ARN (which
/// has no origin: every ARN's would be the same "null") is its own.
fn origin(endpoint: &str) -> String {
    gridrelay_shared::outbound::endpoint_origin(endpoint).unwrap_or_else(|| endpoint.to_string())
}

impl EndpointLimits {
    pub fn new(settings: ConcurrencySettings) -> Self {
        Self {
            settings,
            total: Arc::new(Semaphore::new(settings.max_in_flight.max(1) as usize)),
            endpoints: Mutex::new(HashMap::new()),
        }
    }

    /// An endpoint's limit (during a probe of its no-load time it may have half of it in
    /// flight).
    pub fn limit_of(&self, endpoint: &str) -> Option<u32> {
        lock(&self.endpoints)
            .get(&origin(endpoint))
            .map(|e| lock(&e.state).limit.limit())
    }

    fn endpoint(&self, endpoint: &str) -> Arc<Endpoint> {
        let mut endpoints = lock(&self.endpoints);
        if endpoints.len() >= TRACKED_ENDPOINTS {
            // Forget endpoints with nothing in flight or waiting.
            endpoints.retain(|_, e| Arc::strong_count(e) > 1);
        }
        let s = self.settings;
        Arc::clone(endpoints.entry(origin(endpoint)).or_insert_with(|| {
            let limit = ConcurrencyLimit::new(s.initial_per_endpoint, s.max_per_endpoint);
            Arc::new(Endpoint {
                permits: Arc::new(Semaphore::new(limit.current() as usize)),
                state: Mutex::new(EndpointState { limit, owed: 0 }),
            })
        }))
    }

    /// `endpoint`'s limit, found once for the many requests a group of events makes to it
    /// (finding it parses the URL).
    pub fn limited(&self, endpoint: &str) -> LimitedEndpoint {
        LimitedEndpoint(self.endpoint(endpoint))
    }

    /// Waits until a request to `endpoint` may be sent (first the endpoint's turn, then the
    /// worker's), in the order asked.
    pub async fn acquire(&self, endpoint: &str) -> SendPermit {
        self.acquire_for(&self.limited(endpoint)).await
    }

    /// As [`acquire`](Self::acquire), for an endpoint found with [`limited`](Self::limited).
    pub async fn acquire_for(&self, endpoint: &LimitedEndpoint) -> SendPermit {
        let endpoint = Arc::clone(&endpoint.0);
        // Neither semaphore is ever closed, so acquiring cannot fail.
        let own = Arc::clone(&endpoint.permits)
            .acquire_owned()
            .await
            .expect("endpoint permits are never closed");
        // Held before the wait for the worker's turn: if that wait is given up, the permit
        // still pays what the endpoint owes on its way back.
        let own = EndpointPermit {
            endpoint,
            own: Some(own),
        };
        let total = Arc::clone(&self.total)
            .acquire_owned()
            .await
            .expect("worker permits are never closed");
        let ticket = lock(&own.endpoint.state).limit.ticket();
        SendPermit {
            own,
            total: Some(WorkerPermit { _permit: total }),
            ticket,
        }
    }
}

/// One endpoint's limit, as [`EndpointLimits::limited`] found it (while held, the endpoint is
/// not forgotten).
#[derive(Clone)]
pub struct LimitedEndpoint(Arc<Endpoint>);

/// One request's place among an endpoint's permits.
struct EndpointPermit {
    endpoint: Arc<Endpoint>,
    own: Option<OwnedSemaphorePermit>,
}

impl EndpointPermit {
    /// Gives the permit back after `answer` has moved the limit (under one lock), adding or
    /// forgetting permits so the endpoint's permits match its limit.
    fn give_back(&mut self, answer: impl FnOnce(&mut ConcurrencyLimit)) {
        let Some(own) = self.own.take() else { return };
        let mut state = lock(&self.endpoint.state);
        let before = state.limit.current();
        answer(&mut state.limit);
        let after = state.limit.current();
        if after > before {
            let grown = after - before;
            let repaid = grown.min(state.owed);
            state.owed -= repaid;
            self.endpoint.permits.add_permits((grown - repaid) as usize);
        } else if after < before {
            let cut = before - after;
            let forgotten = self.endpoint.permits.forget_permits(cut as usize);
            // Permits out now are forgotten as they come back.
            state.owed += cut - u32::try_from(forgotten).unwrap_or(cut);
        }
        if state.owed > 0 {
            state.owed -= 1;
            own.forget();
        }
    }
}

impl Drop for EndpointPermit {
    fn drop(&mut self) {
        self.give_back(|_| {});
    }
}

/// One of the worker's permits: a request, or a connection, it has out.
pub struct WorkerPermit {
    _permit: OwnedSemaphorePermit,
}

/// Leave to send one request; give it back with what the answer said ([`SendPermit::finish`]).
/// Dropped unused, it says nothing about the endpoint.
pub struct SendPermit {
    own: EndpointPermit,
    total: Option<WorkerPermit>,
    ticket: u64,
}

impl SendPermit {
    /// Gives the permit back, moving the endpoint's limit by what its answer said and, for a
    /// webhook's answer, how long it took (`rtt`: a round of slower answers can show a queue).
    pub fn finish(mut self, signal: LoadSignal, rtt: Option<Duration>) {
        self.answer(signal, rtt);
    }

    /// As [`finish`](Self::finish), but keeps the worker's permit for a request that is still
    /// open (R4's late answer): its connection counts against the worker's total until the
    /// returned permit is dropped, so timed-out requests cannot pile up past it. The
    /// endpoint's permit goes back now: the endpoint's limit has already been cut.
    pub fn finish_keeping_connection(mut self, signal: LoadSignal) -> WorkerPermit {
        self.answer(signal, None);
        self.total
            .take()
            .expect("a send permit holds the worker's permit until it is finished")
    }

    fn answer(&mut self, signal: LoadSignal, rtt: Option<Duration>) {
        let ticket = self.ticket;
        self.own
            .give_back(|limit| limit.on_timed_answer(ticket, signal, rtt));
    }
}

impl Drop for SendPermit {
    fn drop(&mut self) {
        self.answer(LoadSignal::Silent, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(initial: u32, max_per_endpoint: u32, max_in_flight: u32) -> ConcurrencySettings {
        ConcurrencySettings {
            max_in_flight,
            initial_per_endpoint: initial,
            max_per_endpoint,
        }
    }

    /// How many permits to `endpoint` can be held at once now (taking them, then giving them
    /// back unused).
    async fn available(limits: &EndpointLimits, endpoint: &str) -> usize {
        let mut held = Vec::new();
        while let Ok(p) =
            tokio::time::timeout(Duration::from_millis(20), limits.acquire(endpoint)).await
        {
            held.push(p);
        }
        held.len()
    }

    #[test]
    fn settings_out_of_range_are_refused_with_the_setting_and_range() {
        assert_eq!(
            ConcurrencySettings::new(768, None),
            Ok(ConcurrencySettings::default())
        );
        let small = ConcurrencySettings::new(32, Some(8)).unwrap();
        assert_eq!((small.initial_per_endpoint, small.max_per_endpoint), (8, 8));
        let e = ConcurrencySettings::new(0, None).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("maxRequestsInFlight", "0")
        );
        assert!(e.allowed.starts_with("1 to 832"), "{e}");
        let e = ConcurrencySettings::new(833, None).unwrap_err();
        assert_eq!(
            e.value, "833",
            "near the descriptor guard's flush mark: {e}"
        );
        let e = ConcurrencySettings::new(100, Some(200)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "maxRequestsPerEndpoint is 200; allowed: 1 to maxRequestsInFlight (100)"
        );
    }

    /// A slow endpoint's waiting requests wait for its permits, not the worker's: with a
    /// total of 6 and 4 requests out to a slow server, its further requests hold none of the
    /// other 2, which another server gets.
    #[tokio::test]
    async fn an_endpoint_gets_no_more_than_its_limit_and_its_neighbour_is_not_held_up() {
        let limits = EndpointLimits::new(settings(4, 100, 6));
        assert_eq!(available(&limits, "http://slow.example/a").await, 4);
        let held: Vec<SendPermit> =
            futures::future::join_all((0..4).map(|_| limits.acquire("http://slow.example/a")))
                .await;
        // Another path of the same server shares its limit and waits; three wait at once.
        let mut waiting: Vec<_> = (0..3)
            .map(|i| {
                Box::pin(limits.acquire(if i == 0 {
                    "http://slow.example/b"
                } else {
                    "http://slow.example/a"
                }))
            })
            .collect();
        for w in &mut waiting {
            assert!(
                futures::poll!(w.as_mut()).is_pending(),
                "the server's four permits are out"
            );
        }
        // Another server has its own limit and the worker's other two.
        assert_eq!(available(&limits, "http://fast.example/").await, 2);
        drop(waiting);
        drop(held);
        assert_eq!(available(&limits, "http://fast.example/").await, 4);
    }

    /// A request that gave up waiting for the worker's turn after taking its endpoint's turn
    /// gives the endpoint's permit back as any other: if the endpoint's limit was cut
    /// meanwhile, the permit pays what the cut left owing, and the endpoint never has more out
    /// than its limit.
    #[tokio::test]
    async fn a_request_that_stops_waiting_leaves_the_endpoint_at_its_limit() {
        let endpoint = "http://busy.example/";
        let limits = EndpointLimits::new(settings(4, 100, 4));
        let mut out: Vec<SendPermit> =
            futures::future::join_all((0..3).map(|_| limits.acquire(endpoint))).await;
        let other = limits.acquire("http://other.example/").await;
        // The endpoint's fourth permit is taken; the worker's total is not free.
        let mut waiting = Box::pin(limits.acquire(endpoint));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        // An overload halves the limit to 2 with all four of its permits out.
        out.pop().unwrap().finish(LoadSignal::Overloaded, None);
        assert_eq!(limits.limit_of(endpoint), Some(2));
        drop(waiting);
        drop(other);
        // Two are out: the limit is reached.
        assert_eq!(available(&limits, endpoint).await, 0);
        drop(out);
        assert_eq!(available(&limits, endpoint).await, 2);
    }

    /// R4: a request kept open for its late answer gives back its endpoint's permit but keeps
    /// its place in the worker's total until its late answer is done with.
    #[tokio::test]
    async fn a_request_kept_open_counts_against_the_total_until_it_is_closed() {
        let limits = EndpointLimits::new(settings(4, 4, 4));
        let endpoint = "http://hangs.example/";
        let permits: Vec<SendPermit> =
            futures::future::join_all((0..2).map(|_| limits.acquire(endpoint))).await;
        let connections: Vec<WorkerPermit> = permits
            .into_iter()
            .map(|p| p.finish_keeping_connection(LoadSignal::Overloaded))
            .collect();
        // The endpoint's limit is 2 now, with none out; the worker has 2 of 4 left.
        assert_eq!(limits.limit_of(endpoint), Some(2));
        assert_eq!(available(&limits, "http://other.example/").await, 2);
        drop(connections);
        assert_eq!(available(&limits, "http://other.example/").await, 4);
    }

    #[tokio::test]
    async fn good_answers_raise_the_limit_and_overload_cuts_it_with_requests_still_out() {
        let limits = EndpointLimits::new(settings(4, 100, 100));
        let endpoint = "https://hooks.example/x";
        // Four out; each answer makes room for another request, as a busy worker sends.
        let mut round: std::collections::VecDeque<SendPermit> =
            futures::future::join_all((0..4).map(|_| limits.acquire(endpoint)))
                .await
                .into();
        for _ in 0..4 {
            round.pop_front().unwrap().finish(LoadSignal::Coped, None);
            while let Ok(p) =
                tokio::time::timeout(Duration::from_millis(5), limits.acquire(endpoint)).await
            {
                round.push_back(p);
            }
        }
        assert_eq!(limits.limit_of(endpoint), Some(8));
        drop(round);
        assert_eq!(available(&limits, endpoint).await, 8);

        // Eight out; one says overloaded: the limit is 4 and the permits out are owed back.
        let mut out: Vec<SendPermit> =
            futures::future::join_all((0..8).map(|_| limits.acquire(endpoint))).await;
        out.pop().unwrap().finish(LoadSignal::Overloaded, None);
        assert_eq!(limits.limit_of(endpoint), Some(4));
        // The others were sent before the cut: their overloads do not cut again.
        for p in out {
            p.finish(LoadSignal::Overloaded, None);
        }
        assert_eq!(limits.limit_of(endpoint), Some(4));
        assert_eq!(available(&limits, endpoint).await, 4);
    }

    /// A probe of the no-load time halves what an endpoint may have out for one round and
    /// gives it back after: the endpoint's free permits follow, with none lost or made.
    #[tokio::test]
    async fn a_probe_halves_the_permits_for_a_round_and_gives_them_back() {
        let limits = EndpointLimits::new(settings(64, 64, 100));
        let endpoint = "http://probe.example/";
        let (mut probes, mut probing) = (0, false);
        for _ in 0..3_000 {
            let permit = limits.acquire(endpoint).await;
            permit.finish(LoadSignal::Coped, Some(Duration::from_millis(20)));
            let e = limits.endpoint(endpoint);
            let state = lock(&e.state);
            // Nothing out: every permit the limit allows now is free.
            assert_eq!(
                e.permits.available_permits(),
                state.limit.current() as usize
            );
            assert_eq!(state.owed, 0);
            if state.limit.is_probing() && !probing {
                probes += 1;
                assert_eq!(state.limit.current(), 32);
            }
            probing = state.limit.is_probing();
        }
        assert_eq!(probes, 2);
        assert_eq!(limits.limit_of(endpoint), Some(64));
    }

    /// Each AWS resource has its own limit: a throttled queue does not cut a stream's, though
    /// neither ARN has a URL origin.
    #[tokio::test]
    async fn each_resource_has_its_own_limit() {
        let limits = EndpointLimits::new(settings(8, 100, 100));
        let queue = "arn:aws:sqs:us-east-1:123456789012:orders";
        let stream = "arn:aws:kinesis:us-east-1:123456789012:stream/orders";
        let throttled = limits.acquire(queue).await;
        let other = limits.acquire(stream).await;
        throttled.finish(LoadSignal::Overloaded, None);
        other.finish(LoadSignal::Coped, None);
        assert_eq!(limits.limit_of(queue), Some(4));
        assert_eq!(limits.limit_of(stream), Some(8));
        assert_eq!(available(&limits, stream).await, 8);
        // Two paths of one server still share one.
        assert_eq!(
            origin("https://hooks.example:8443/a?x=1"),
            origin("https://hooks.example:8443/b")
        );
    }

    #[tokio::test]
    async fn the_worker_limit_holds_across_endpoints() {
        let limits = EndpointLimits::new(settings(8, 8, 10));
        let a: Vec<SendPermit> =
            futures::future::join_all((0..8).map(|_| limits.acquire("http://a.example/"))).await;
        assert_eq!(available(&limits, "http://b.example/").await, 2);
        drop(a);
        assert_eq!(available(&limits, "http://b.example/").await, 8);
    }
}
