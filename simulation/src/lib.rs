//! A seeded simulation of the whole delivery life cycle, with faults at every I/O step.
//!
//! It exists to show G1 (at-least-once, nothing lost) and the absence of misdelivery under the
//! failures a real deployment meets, which the end-to-end tests cannot provoke at will. The real
//! `ingest`, `deliver` and `dead-letter` handlers run over the in-memory ports (SQS's contract:
//! visibility timeouts, redelivery until deleted with the current receipt), driven like Lambda
//! event sources drive them (two invocations at once, each on a worker of its own), on tokio's
//! paused clock (`SimClock`), so every wait takes the simulated time it says. One seed
//! decides everything: what the subscribers answer and when (at once, after a hang to the
//! attempt timeout, late), when an endpoint or the whole host is down, which store, queue or
//! object-store call fails, which queue send is made twice, which message two invocations
//! receive at once, which delete the event source skips, and at which I/O step an invocation's
//! process dies (its future is dropped there, as a killed process stops; its messages come
//! back after their visibility timeout).
//!
//! After the run settles, [`Run::check`] holds every published event against every
//! subscription: each event a subscription's filter passes was delivered to it (a 2xx answer)
//! or written to its dead-letter location; nothing reached a subscription it was not for; and
//! nothing was dropped (no subscription here ends in a drop). Duplicates are allowed and
//! counted. The same seed replays the same run.

pub mod model;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::channel::oneshot;
use futures::future::{Either, select};
use gridrelay_adapters::aws::sqs_event;
use gridrelay_dead_letter::{DeadLetterReport, DeadLetterWriter};
use gridrelay_deliver::{Deliver, DeliverPorts, DeliveryReport, DeliverySettings};
use gridrelay_ingest::{Ingest, PublishRequest};
use gridrelay_ports::memory::{
    FixedJitter, MemoryDeliveryCapStore, MemoryDeliveryStateStore, MemoryObjectStore, MemoryQueue,
    MemorySecretStore, MemorySubscriptionStore, QueuedMessage, ScriptedSender,
};
use gridrelay_ports::registration::Registry;
use gridrelay_ports::{
    Clock, DeliveryCapStore, DeliveryRequest, DeliveryStateStore, EventSender, HandshakeReply,
    HandshakeRequest, MessageQueue, ObjectStore, ObjectStoreError, OutgoingMessage, QueueError,
    ReceivedMessage, SentAttempt, StoreError, SubscriptionStore, Versioned,
};
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::filter::EventFilter;
use gridrelay_shared::health::EndpointHealth;
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::subscription::{Subscription, SubscriptionRequest, Topic};
use gridrelay_shared::time_scale::TimeScale;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TOPIC: &str = "orders";
/// The delivery queue's visibility timeout on AWS.
const VISIBILITY: Duration = Duration::from_secs(1800);
const DEAD_LETTER_VISIBILITY: Duration = Duration::from_secs(360);
const BUCKET: &str = "dead";
/// Longer than any event can live (24 h TTL, L5's four hours, hops).
const SIMULATED_TIME_LIMIT: chrono::Duration = chrono::Duration::days(4);

/// The simulation's clock: tokio's paused clock, read as a date. Every wait in the handlers
/// (a hung request, a permit, the caps' turn, R4's late answers, the deadline's bound on I/O)
/// is a tokio timer, and the paused runtime moves time on only when every task waits, to the
/// next timer: so waits take the time they say, in order, and the run stays a function of the
/// seed. The driver moves it on by hand between invocations (to the next visible message).
struct SimClock {
    start: DateTime<Utc>,
    origin: tokio::time::Instant,
}

impl SimClock {
    fn new(start: DateTime<Utc>) -> Self {
        Self {
            start,
            origin: tokio::time::Instant::now(),
        }
    }

    async fn advance(&self, by: Duration) {
        tokio::time::advance(by).await;
    }

    async fn set(&self, to: DateTime<Utc>) {
        if let Ok(by) = (to - self.now()).to_std() {
            self.advance(by).await;
        }
    }
}

impl Clock for SimClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = tokio::time::Instant::now() - self.origin;
        self.start + chrono::Duration::from_std(elapsed).unwrap_or(chrono::Duration::MAX)
    }
}

tokio::task_local! {
    /// Which invocation an I/O step belongs to (invocations run at once; each may die).
    static INVOCATION: u64;
}

/// How often each fault strikes.
#[derive(Debug, Clone, Copy)]
pub struct FaultRates {
    /// A store, queue or object-store call fails.
    pub call_fails: f64,
    /// A queue send is made twice.
    pub send_twice: f64,
    /// An invocation's process dies at some I/O step.
    pub crash: f64,
    /// A message is received by two invocations at once.
    pub received_twice: f64,
    /// The event source does not delete a message its invocation settled.
    pub delete_lost: f64,
    /// Not a fault of the world but a bug planted to show the check can fail: the event source
    /// deletes messages even when their invocation reported them failed. Zero in real runs.
    pub planted_bug_delete_failed: f64,
}

impl Default for FaultRates {
    fn default() -> Self {
        Self {
            call_fails: 0.05,
            send_twice: 0.03,
            crash: 0.1,
            received_twice: 0.03,
            delete_lost: 0.02,
            planted_bug_delete_failed: 0.0,
        }
    }
}

/// The seeded source of every fault, shared by the faulty ports.
struct Faults {
    rng: Mutex<StdRng>,
    rates: Mutex<FaultRates>,
    /// Per invocation that is to die: its I/O steps left before it does, and who hears of it.
    crash: Mutex<BTreeMap<u64, (u64, oneshot::Sender<()>)>>,
}

impl Faults {
    fn chance(&self, p: f64) -> bool {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        rng.random_bool(p.clamp(0.0, 1.0))
    }

    fn below(&self, n: u64) -> u64 {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        rng.random_range(0..n.max(1))
    }

    fn rates(&self) -> FaultRates {
        *self.rates.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One I/O step: the process of the invocation it belongs to may die here (this never
    /// returns), or the call may fail.
    async fn step(&self) -> bool {
        let dies = INVOCATION.try_with(|&invocation| {
            let mut crash = self.crash.lock().unwrap_or_else(|e| e.into_inner());
            match crash.get_mut(&invocation) {
                Some((0, _)) => crash.remove(&invocation).map(|(_, tell)| tell),
                Some((left, _)) => {
                    *left -= 1;
                    None
                }
                None => None,
            }
        });
        if let Ok(Some(tell)) = dies {
            let _ = tell.send(());
            std::future::pending::<()>().await;
        }
        self.chance(self.rates().call_fails)
    }

    /// The process of `invocation` dies at one of its next `within` steps.
    fn arm_crash(&self, invocation: u64, within: u64) -> oneshot::Receiver<()> {
        let (tell, hear) = oneshot::channel();
        let left = self.below(within);
        self.crash
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(invocation, (left, tell));
        hear
    }

    fn disarm(&self, invocation: u64) {
        self.crash
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&invocation);
    }
}

fn injected() -> String {
    "injected fault".to_string()
}

struct FaultyStore(Arc<MemorySubscriptionStore>, Arc<Faults>);

#[async_trait]
impl SubscriptionStore for FaultyStore {
    async fn get_topic(&self, name: &str) -> Result<Option<Topic>, StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0.get_topic(name).await
    }
    async fn list_topics(&self) -> Result<Vec<Topic>, StoreError> {
        self.0.list_topics().await
    }
    async fn create_topic(&self, topic: &Topic) -> Result<(), StoreError> {
        self.0.create_topic(topic).await
    }
    async fn replace_topic(&self, topic: &Topic) -> Result<(), StoreError> {
        self.0.replace_topic(topic).await
    }
    async fn delete_topic(&self, name: &str) -> Result<bool, StoreError> {
        self.0.delete_topic(name).await
    }
    async fn get_subscription(
        &self,
        topic: &str,
        name: &str,
    ) -> Result<Option<Subscription>, StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0.get_subscription(topic, name).await
    }
    async fn list_subscriptions(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0.list_subscriptions(topic).await
    }
    async fn create_subscription(&self, subscription: &Subscription) -> Result<(), StoreError> {
        self.0.create_subscription(subscription).await
    }
    async fn replace_subscription(
        &self,
        subscription: &mut Subscription,
    ) -> Result<(), StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0.replace_subscription(subscription).await
    }
    async fn delete_subscription(&self, topic: &str, name: &str) -> Result<bool, StoreError> {
        self.0.delete_subscription(topic, name).await
    }
    async fn delete_subscription_if_unchanged(
        &self,
        subscription: &Subscription,
    ) -> Result<bool, StoreError> {
        self.0.delete_subscription_if_unchanged(subscription).await
    }
}

struct FaultyQueue(Arc<MemoryQueue>, Arc<Faults>);

#[async_trait]
impl MessageQueue for FaultyQueue {
    async fn send_all(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), QueueError>> {
        if self.1.step().await {
            return messages
                .iter()
                .map(|_| Err(QueueError(injected())))
                .collect();
        }
        let sent = self.0.send_all(messages).await;
        if self.1.chance(self.1.rates().send_twice) {
            self.0.send_all(messages).await;
        }
        sent
    }
    async fn retry_after(&self, receipt_handle: &str, after: Duration) -> Result<(), QueueError> {
        if self.1.step().await {
            return Err(QueueError(injected()));
        }
        self.0.retry_after(receipt_handle, after).await
    }
    async fn receive_batch(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        self.0.receive_batch(max, visibility).await
    }
    async fn delete_received(&self, receipt_handle: &str) -> Result<(), QueueError> {
        self.0.delete_received(receipt_handle).await
    }
}

struct FaultyState(Arc<MemoryDeliveryStateStore>, Arc<Faults>);

#[async_trait]
impl DeliveryStateStore for FaultyState {
    async fn endpoint_health(
        &self,
        endpoint: &str,
    ) -> Result<Versioned<EndpointHealth>, StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0.endpoint_health(endpoint).await
    }
    async fn put_endpoint_health(
        &self,
        endpoint: &str,
        health: &EndpointHealth,
        version: u64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0
            .put_endpoint_health(endpoint, health, version, now)
            .await
    }
    async fn acquire_probe(
        &self,
        endpoint: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0.acquire_probe(endpoint, now, until).await
    }
    async fn mark_late_success(&self, attempt: &str, now: DateTime<Utc>) -> Result<(), StoreError> {
        self.0.mark_late_success(attempt, now).await
    }
    async fn late_success(&self, attempt: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.0.late_success(attempt).await
    }
    async fn ordered_progress(
        &self,
        message_ids: &[String],
    ) -> Result<std::collections::HashMap<String, String>, StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0.ordered_progress(message_ids).await
    }
    async fn put_ordered_progress(
        &self,
        message_id: &str,
        progress: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0.put_ordered_progress(message_id, progress, now).await
    }
    async fn claim(
        &self,
        key: &str,
        token: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.0.claim(key, token, now, until).await
    }
}

struct FaultyCaps(Arc<MemoryDeliveryCapStore>, Arc<Faults>);

#[async_trait]
impl DeliveryCapStore for FaultyCaps {
    async fn book_events(
        &self,
        subscription: &str,
        events: u32,
        allowance: gridrelay_shared::caps::RateAllowance,
        now: DateTime<Utc>,
    ) -> Result<DateTime<Utc>, StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0
            .book_events(subscription, events, allowance, now)
            .await
    }
    async fn acquire_slot(
        &self,
        subscription: &str,
        max: u32,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0.acquire_slot(subscription, max, now, until).await
    }
    async fn release_slot(&self, subscription: &str, lease: &str) -> Result<(), StoreError> {
        if self.1.step().await {
            return Err(StoreError::Unavailable(injected()));
        }
        self.0.release_slot(subscription, lease).await
    }
}

struct FaultyObjects(Arc<MemoryObjectStore>, Arc<Faults>);

#[async_trait]
impl ObjectStore for FaultyObjects {
    async fn put_json(
        &self,
        bucket: &str,
        key: &str,
        body: String,
    ) -> Result<(), ObjectStoreError> {
        if self.1.step().await {
            return Err(ObjectStoreError::new(injected()));
        }
        self.0.put_json(bucket, key, body).await
    }
    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, ObjectStoreError> {
        self.0.list(bucket, prefix).await
    }
    async fn get(&self, bucket: &str, key: &str) -> Result<String, ObjectStoreError> {
        self.0.get(bucket, key).await
    }
    async fn delete(&self, bucket: &str, key: &str) -> Result<(), ObjectStoreError> {
        self.0.delete(bucket, key).await
    }
}

/// One request a subscriber answered, and how.
#[derive(Debug, Clone)]
pub struct Answered {
    pub endpoint: String,
    pub subscription_header: Option<String>,
    pub ids: Vec<String>,
    pub result: AttemptResult,
}

/// The subscribers: answers drawn from the seed (most succeed, after up to 200 ms; some fail for
/// a while; the `created` endpoint sometimes answers 400, which is not retried). A request
/// that times out hangs for the attempt timeout (30 s), so invocations meet their deadlines
/// and their permits' and caps' waits; half of them answer late (R4), 200 or 500, within 4
/// minutes, which the invocation may still be waiting for. The process may die after a
/// request went out, before its answer is recorded.
struct Subscribers {
    inner: ScriptedSender,
    faults: Arc<Faults>,
    answered: Arc<Mutex<Vec<Answered>>>,
    clock: Arc<SimClock>,
    outages: Vec<Outage>,
}

/// A stretch of time in which an endpoint (or the whole host) answers one way only: long
/// enough to have endpoints delayed (D1) and the host found hung (#34 item 8).
struct Outage {
    /// The endpoints' common end (`/all`), or `""` for every endpoint of the host.
    endpoint_ends: &'static str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    answer: AttemptResult,
}

impl Outage {
    fn covers(&self, endpoint: &str, at: DateTime<Utc>) -> bool {
        endpoint.ends_with(self.endpoint_ends) && self.from <= at && at < self.to
    }

    /// The seed's outages: in half the seeds the `all` endpoint answers 503 for 5 to 35
    /// minutes, starting in the first 10; in a quarter, the whole host hangs for 1 to 16
    /// minutes in the first 20.
    fn drawn(faults: &Faults) -> Vec<Self> {
        let minutes = |n: u64| chrono::Duration::seconds(i64::try_from(n * 60).unwrap_or(0));
        let stretch = |from: u64, length: u64| {
            let from = t0() + minutes(from);
            (from, from + minutes(length))
        };
        let mut outages = Vec::new();
        if faults.chance(0.5) {
            let (from, to) = stretch(faults.below(10), 5 + faults.below(30));
            outages.push(Self {
                endpoint_ends: "/all",
                from,
                to,
                answer: AttemptResult::Status(503),
            });
        }
        if faults.chance(0.25) {
            let (from, to) = stretch(faults.below(20), 1 + faults.below(15));
            outages.push(Self {
                endpoint_ends: "",
                from,
                to,
                answer: AttemptResult::TimedOut,
            });
        }
        outages
    }
}

#[async_trait]
impl EventSender for Subscribers {
    async fn send(&self, request: DeliveryRequest) -> SentAttempt {
        let now = self.clock.now();
        let down = self
            .outages
            .iter()
            .find(|o| o.covers(&request.endpoint, now));
        let roll = self.faults.below(100);
        let result = match roll {
            _ if down.is_some() => down
                .map(|o| o.answer.clone())
                .unwrap_or(AttemptResult::TimedOut),
            0..=59 => AttemptResult::Status(200),
            60..=74 => AttemptResult::Status(503),
            75..=84 => AttemptResult::Status(500),
            85..=87 => AttemptResult::TimedOut,
            _ if request.endpoint.ends_with("/created") => AttemptResult::Status(400),
            _ => AttemptResult::ConnectionFailed("connection refused".into()),
        };
        let ids = serde_json::from_str::<Vec<serde_json::Value>>(&request.body)
            .unwrap_or_default()
            .iter()
            .filter_map(|e| e["id"].as_str().map(str::to_string))
            .collect();
        let answer = Answered {
            endpoint: request.endpoint.clone(),
            subscription_header: request
                .headers
                .iter()
                .find(|(n, _)| n == "aeg-subscription-name")
                .map(|(_, v)| v.clone()),
            ids,
            result: result.clone(),
        };
        let mut sent = SentAttempt::of(result.clone());
        if result == AttemptResult::TimedOut {
            tokio::time::sleep(Duration::from_secs(30)).await;
            if down.is_none() && self.faults.chance(0.5) {
                let after = Duration::from_secs(1 + self.faults.below(240));
                let status = if self.faults.chance(0.7) { 200 } else { 500 };
                let late = Answered {
                    result: AttemptResult::Status(status),
                    ..answer.clone()
                };
                let answered = Arc::clone(&self.answered);
                sent.late = Some(Box::pin(async move {
                    tokio::time::sleep(after).await;
                    answered
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(late);
                    Some(status)
                }));
            }
        } else {
            tokio::time::sleep(Duration::from_millis(self.faults.below(200))).await;
        }
        self.answered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(answer);
        // The request reached the endpoint; the process may die before it hears the answer.
        let _ = self.faults.step().await;
        sent
    }

    async fn handshake(&self, request: HandshakeRequest) -> Result<HandshakeReply, String> {
        self.inner.handshake(request).await
    }
}

/// What one seed's run came to.
#[derive(Debug)]
pub struct Run {
    pub seed: u64,
    /// Event ids whose publish was answered 200, and every id ever sent in a publish.
    pub accepted: BTreeSet<String>,
    pub published: BTreeMap<String, serde_json::Value>,
    pub subscriptions: Vec<Subscription>,
    pub answered: Vec<Answered>,
    /// Dead-letter records per subscription name: event ids.
    pub dead_lettered: BTreeMap<String, Vec<String>>,
    pub deliver: DeliveryReport,
    pub dead_letter: DeadLetterReport,
    /// Handler invocations (deliver and dead-letter, setup included), and how many died.
    pub invocations: usize,
    pub crashes: usize,
    /// Rounds of the deliver event source that ran two invocations at once.
    pub rounds_at_once: usize,
    pub settled: bool,
    pub simulated: chrono::Duration,
}

/// The whole system for one seed.
struct World {
    clock: Arc<SimClock>,
    faults: Arc<Faults>,
    memory_store: Arc<MemorySubscriptionStore>,
    delivery: Arc<MemoryQueue>,
    dead: Arc<MemoryQueue>,
    objects: Arc<MemoryObjectStore>,
    subscribers: Arc<Subscribers>,
    ingest: Ingest,
    /// Two deliver workers (Lambda instances): each has its own endpoint limits and host watch,
    /// and shares the stores, queues and caps.
    workers: [Deliver; 2],
    writer: DeadLetterWriter,
    topic: Topic,
    invocations: AtomicU64,
    crashes: AtomicU64,
    rounds_at_once: AtomicU64,
}

fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-23T00:00:00Z")
        .map(|t| t.to_utc())
        .unwrap_or_default()
}

impl World {
    fn new(seed: u64, rates: FaultRates) -> Self {
        let clock = Arc::new(SimClock::new(t0()));
        let faults = Arc::new(Faults {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            rates: Mutex::new(rates),
            crash: Mutex::new(BTreeMap::new()),
        });
        let memory_store = Arc::new(MemorySubscriptionStore::default());
        let delivery = Arc::new(MemoryQueue::new(clock.clone()));
        let dead = Arc::new(MemoryQueue::new(clock.clone()));
        let objects = Arc::new(MemoryObjectStore::default());
        let subscribers = Arc::new(Subscribers {
            inner: ScriptedSender::status(200),
            faults: faults.clone(),
            answered: Arc::new(Mutex::new(Vec::new())),
            clock: clock.clone(),
            outages: Outage::drawn(&faults),
        });
        let store: Arc<dyn SubscriptionStore> =
            Arc::new(FaultyStore(memory_store.clone(), faults.clone()));
        let delivery_queue: Arc<dyn MessageQueue> =
            Arc::new(FaultyQueue(delivery.clone(), faults.clone()));
        let dead_queue: Arc<dyn MessageQueue> = Arc::new(FaultyQueue(dead.clone(), faults.clone()));
        let ingest = Ingest {
            store: store.clone(),
            delivery_queue: delivery_queue.clone(),
            archives: gridrelay_ports::ArchiveStreams::default(),
            accepted_ids: Arc::new(gridrelay_ports::memory::MemoryAcceptedIds::default()),
            clock: clock.clone(),
        };
        let ports = DeliverPorts {
            store: store.clone(),
            delivery_queue: delivery_queue.clone(),
            // One queue for deliveries and handshake steps here, as before the control queue:
            // what reads one reads both.
            control_queue: delivery_queue.clone(),
            // No replays in the simulation.
            replay_queue: delivery_queue.clone(),
            dead_letter_queue: dead_queue.clone(),
            ordered_queue: delivery_queue.clone(),
            ordered_redrive_queue: None,
            resources: Arc::new(gridrelay_ports::memory::MemoryDestinations::default()),
            clock: clock.clone(),
            jitter: Arc::new(FixedJitter(0.5)),
            state: Arc::new(FaultyState(
                Arc::new(MemoryDeliveryStateStore::default()),
                faults.clone(),
            )),
            secrets: Arc::new(MemorySecretStore::default()),
            caps: Arc::new(FaultyCaps(
                Arc::new(MemoryDeliveryCapStore::default()),
                faults.clone(),
            )),
            journal: Arc::new(gridrelay_ports::memory::MemoryJournal::default()),
            replays: Arc::new(gridrelay_ports::NoReplays),
            archive: Arc::new(gridrelay_ports::NoReplays),
        };
        let deliver = Deliver::new(
            ports,
            subscribers.clone(),
            DeliverySettings::new(TimeScale::REAL),
        );
        let writer = DeadLetterWriter {
            objects: Arc::new(FaultyObjects(objects.clone(), faults.clone())),
            dead_letter_queue: dead_queue,
            clock: clock.clone(),
            scale: TimeScale::REAL,
            notices: None,
            journal: Arc::new(gridrelay_ports::NoRecordStream),
        };
        let workers = [deliver.beside(subscribers.clone()), deliver];
        Self {
            clock,
            faults,
            memory_store,
            delivery,
            dead,
            objects,
            subscribers,
            ingest,
            workers,
            writer,
            topic: Topic::with_new_keys(TOPIC, t0()),
            invocations: AtomicU64::new(0),
            crashes: AtomicU64::new(0),
            rounds_at_once: AtomicU64::new(0),
        }
    }

    /// Three subscriptions, validated with faults off: `all` (every event, dead-letters to
    /// `s3://dead/all`), `created` (event type `created`, 5 attempts, dead-letters) and `plain`
    /// (subjects under `/a/`, dead-letters too, capped at 2 requests at once and 3 events a
    /// second, so its events are also held by caps and by a cap store that fails).
    async fn subscribe(&self) {
        let off = self.faults.rates();
        *self.faults.rates.lock().unwrap_or_else(|e| e.into_inner()) = FaultRates {
            call_fails: 0.0,
            send_twice: 0.0,
            crash: 0.0,
            received_twice: 0.0,
            delete_lost: 0.0,
            planted_bug_delete_failed: 0.0,
        };
        let _ = self.memory_store.create_topic(&self.topic).await;
        let secrets = MemorySecretStore::default();
        let destinations = gridrelay_ports::memory::MemoryDestinations::default();
        let allowed = gridrelay_shared::destination::AllowedDestinations::default();
        let registry = Registry {
            store: self.memory_store.as_ref(),
            secrets: &secrets,
            secret_prefix: "gridrelay",
            control_queue: self.delivery.as_ref(),
            endpoints: &gridrelay_ports::endpoints::AnyEndpoint,
            dead_letters: self.objects.as_ref(),
            resources: &destinations,
            allowed_destinations: &allowed,
        };
        let request =
            |name: &str, filter: EventFilter, attempts: Option<i64>| SubscriptionRequest {
                topic: TOPIC.into(),
                name: name.into(),
                endpoint: format!("https://subscriber.example/{name}"),
                max_delivery_attempts: attempts,
                dead_letter_destination: Some(format!("s3://{BUCKET}/{name}")),
                filter,
                ..SubscriptionRequest::default()
            };
        for r in [
            request("all", EventFilter::default(), None),
            request(
                "created",
                EventFilter {
                    included_event_types: Some(vec!["created".into()]),
                    ..EventFilter::default()
                },
                Some(5),
            ),
            SubscriptionRequest {
                max_concurrent_requests: Some(2),
                max_events_per_second: Some(3),
                ..request(
                    "plain",
                    EventFilter {
                        subject_begins_with: Some("/a/".into()),
                        ..EventFilter::default()
                    },
                    None,
                )
            },
        ] {
            let _ = registry.register(&r, self.clock.now()).await;
        }
        while !self.delivery.is_empty() {
            self.invoke_deliver(false).await;
        }
        *self.faults.rates.lock().unwrap_or_else(|e| e.into_inner()) = off;
    }

    /// Publishes one request of `count` events, retrying (as a publisher does) until it is
    /// answered 200 or 20 tries failed.
    async fn publish(&self, batch: usize, count: usize, run: &mut Run) {
        let events: Vec<serde_json::Value> = (0..count)
            .map(|i| {
                let id = format!("e{batch}-{i}");
                let event_type = if (batch + i).is_multiple_of(3) {
                    "created"
                } else {
                    "updated"
                };
                let subject = if i.is_multiple_of(2) { "/a/x" } else { "/b/y" };
                serde_json::json!({
                    "id": id, "subject": subject, "eventType": event_type,
                    "eventTime": "2026-11-23T00:00:00Z", "data": {"n": i},
                })
            })
            .collect();
        for e in &events {
            run.published
                .insert(e["id"].as_str().unwrap_or_default().to_string(), e.clone());
        }
        let body = serde_json::Value::Array(events.clone()).to_string();
        for _ in 0..20 {
            let answer = self
                .ingest
                .publish(PublishRequest {
                    topic: TOPIC,
                    api_version: Some("2018-01-01"),
                    sas_key: Some(&self.topic.key1),
                    sas_token: None,
                    content_type: Some("application/json"),
                    ce_headers: &[],
                    body: body.as_bytes(),
                })
                .await;
            if answer.status == 200 {
                run.accepted.extend(
                    events
                        .iter()
                        .filter_map(|e| e["id"].as_str().map(str::to_string)),
                );
                return;
            }
            self.clock.advance(Duration::from_secs(1)).await;
        }
    }

    /// Receives what is visible on `queue` for the invocations the event source runs at once:
    /// two pollers, as Lambda's run several (sometimes a message twice, for both).
    async fn receive(&self, queue: &MemoryQueue, visibility: Duration) -> Vec<Vec<QueuedMessage>> {
        let first = queue.receive(10, visibility);
        if first.is_empty() {
            return Vec::new();
        }
        let rates = self.faults.rates();
        if self.faults.chance(rates.received_twice) {
            // Its visibility ran out while the first invocation still had it.
            let again = &first[self.faults.below(first.len() as u64) as usize];
            let handle = again.receipt.to_string();
            let _ = queue.retry_after(&handle, Duration::ZERO).await;
        }
        let second = queue.receive(10, visibility);
        if second.is_empty() {
            return vec![first];
        }
        vec![first, second]
    }

    /// Deletes the settled messages, as the event source does (sometimes not).
    fn settle(&self, queue: &MemoryQueue, received: &[QueuedMessage], failed: &[String]) {
        let rates = self.faults.rates();
        for m in received {
            let deleted_anyway = self.faults.chance(rates.planted_bug_delete_failed);
            if (failed.contains(&m.id) && !deleted_anyway) || self.faults.chance(rates.delete_lost)
            {
                continue;
            }
            queue.delete(&m.id, m.receipt);
        }
    }

    /// One round of the deliver event source: its invocations run at once, each on a worker of
    /// its own, as Lambda's instances; whether anything was received.
    async fn invoke_deliver(&self, may_crash: bool) -> (bool, Option<DeliveryReport>) {
        let batches = self.receive(&self.delivery, VISIBILITY).await;
        if batches.len() > 1 {
            self.rounds_at_once.fetch_add(1, Ordering::SeqCst);
        }
        // A function timeout of two minutes: a few timed-out attempts reach it.
        let deadline = self.clock.now() + chrono::Duration::seconds(120);
        let invocations = batches.iter().zip(&self.workers).map(|(received, worker)| {
            let handled = worker.handle_until(sqs_event(received), deadline);
            self.run_or_die(handled, may_crash, 40)
        });
        let outcomes = futures::future::join_all(invocations).await;
        let mut report = None;
        for (received, outcome) in batches.iter().zip(outcomes) {
            // The process died: nothing is deleted; the messages come back.
            if let Some(o) = outcome {
                self.settle(&self.delivery, received, &o.failed_message_ids);
                report
                    .get_or_insert_with(DeliveryReport::default)
                    .add(&o.report);
            }
        }
        (!batches.is_empty(), report)
    }

    /// Runs an invocation whose process may die at one of its next `within` I/O steps; `None`
    /// if it did (its future is dropped there, as a killed process stops).
    async fn run_or_die<F: Future>(
        &self,
        handled: F,
        may_crash: bool,
        within: u64,
    ) -> Option<F::Output> {
        let invocation = self.invocations.fetch_add(1, Ordering::SeqCst);
        let outcome = if may_crash && self.faults.chance(self.faults.rates().crash) {
            let dies = self.faults.arm_crash(invocation, within);
            let handled = INVOCATION.scope(invocation, handled);
            match select(Box::pin(handled), dies).await {
                Either::Left((outcome, _)) => Some(outcome),
                Either::Right(_) => None,
            }
        } else {
            Some(INVOCATION.scope(invocation, handled).await)
        };
        self.faults.disarm(invocation);
        if outcome.is_none() {
            self.crashes.fetch_add(1, Ordering::SeqCst);
        }
        outcome
    }

    async fn invoke_dead_letter(&self, run: &mut Run) -> bool {
        let batches = self.receive(&self.dead, DEAD_LETTER_VISIBILITY).await;
        let mut any = false;
        for received in batches {
            if received.is_empty() {
                continue;
            }
            any = true;
            // The dead-letter function's timeout (60 s in the stacks).
            let deadline = self.clock.now() + chrono::Duration::seconds(60);
            let handled = self.writer.handle_until(sqs_event(&received), deadline);
            if let Some(o) = self.run_or_die(handled, true, 10).await {
                self.settle(&self.dead, &received, &o.failed_message_ids);
                run.dead_letter.add(&o.report);
            }
        }
        any
    }
}

/// Runs one seed to quiet (both queues empty) or to the time limit.
pub fn run(seed: u64, rates: FaultRates) -> Run {
    // One thread and a paused clock: the handlers' timers (their deadline's bound on I/O)
    // only fire if every task waits, and the run stays a function of the seed.
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime with timers starts")
        .block_on(run_async(seed, rates))
}

async fn run_async(seed: u64, rates: FaultRates) -> Run {
    let world = World::new(seed, rates);
    world.subscribe().await;
    let mut run = Run {
        seed,
        accepted: BTreeSet::new(),
        published: BTreeMap::new(),
        subscriptions: world
            .memory_store
            .list_subscriptions(TOPIC)
            .await
            .unwrap_or_default(),
        answered: Vec::new(),
        dead_lettered: BTreeMap::new(),
        deliver: DeliveryReport::default(),
        dead_letter: DeadLetterReport::default(),
        invocations: 0,
        crashes: 0,
        rounds_at_once: 0,
        settled: false,
        simulated: chrono::Duration::zero(),
    };
    let batches = 4;
    let mut published = 0;
    let start = world.clock.now();
    loop {
        if published < batches && world.faults.below(4) == 0 {
            world.publish(published, 8, &mut run).await;
            published += 1;
        }
        let (delivered_any, report) = world.invoke_deliver(true).await;
        if let Some(r) = report {
            run.deliver.add(&r);
        }
        let dead_any = world.invoke_dead_letter(&mut run).await;
        if published == batches && world.delivery.is_empty() && world.dead.is_empty() {
            run.settled = true;
            break;
        }
        if world.clock.now() - start > SIMULATED_TIME_LIMIT {
            break;
        }
        if !delivered_any && !dead_any {
            // Nothing visible: move to the next message's time (or a second, while publishing).
            let next = [
                world.delivery.next_visible_at(),
                world.dead.next_visible_at(),
            ]
            .into_iter()
            .flatten()
            .min();
            match next {
                Some(at) if at > world.clock.now() && published == batches => {
                    world.clock.set(at).await;
                }
                _ => world.clock.advance(Duration::from_secs(1)).await,
            }
        } else {
            world.clock.advance(Duration::from_millis(100)).await;
        }
    }
    run.simulated = world.clock.now() - start;
    let count = |n: &AtomicU64| usize::try_from(n.load(Ordering::SeqCst)).unwrap_or(usize::MAX);
    run.invocations = count(&world.invocations);
    run.crashes = count(&world.crashes);
    run.rounds_at_once = count(&world.rounds_at_once);
    run.answered = world
        .subscribers
        .answered
        .lock()
        .map(|a| a.clone())
        .unwrap_or_default();
    for ((bucket, key), body) in world.objects.objects() {
        if bucket != BUCKET {
            continue;
        }
        let name = key.split('/').next().unwrap_or_default().to_string();
        let records: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap_or_default();
        run.dead_lettered.entry(name).or_default().extend(
            records
                .iter()
                .filter_map(|r| r["id"].as_str().map(str::to_string)),
        );
    }
    run
}

/// What [`Run::check`] found, for the report line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub expected: usize,
    pub delivered: usize,
    pub dead_lettered: usize,
    pub duplicates: usize,
}

impl Run {
    /// The guarantee, for every event and subscription; `Err` says what broke.
    pub fn check(&self) -> Result<Tally, String> {
        let replay = format!(
            "(replay: SIMULATION_SEED={} cargo test -p gridrelay-simulation)",
            self.seed
        );
        if !self.settled {
            return Err(format!(
                "seed {} did not settle within {} simulated hours {replay}",
                self.seed,
                self.simulated.num_hours()
            ));
        }
        let dropped = self.deliver.dropped + self.dead_letter.records_dropped;
        if dropped > 0 {
            return Err(format!(
                "seed {}: {dropped} events dropped, where every subscription has a dead-letter location {replay}",
                self.seed
            ));
        }
        let mut tally = Tally::default();
        for sub in &self.subscriptions {
            let endpoint = &sub.endpoint;
            let passes = |id: &str| {
                self.published.get(id).is_some_and(|e| {
                    sub.filter
                        .matches(e, InputSchema::EventGridSchema.filter_fields())
                })
            };
            let mut got: BTreeMap<&str, usize> = BTreeMap::new();
            for a in self.answered.iter().filter(|a| &a.endpoint == endpoint) {
                if a.subscription_header.as_deref() != Some(sub.name.as_str()) {
                    return Err(format!(
                        "seed {}: a request to {endpoint} named subscription {:?} {replay}",
                        self.seed, a.subscription_header
                    ));
                }
                if matches!(a.result, AttemptResult::Status(200..=204)) {
                    for id in &a.ids {
                        *got.entry(id.as_str()).or_default() += 1;
                    }
                }
                for id in &a.ids {
                    if !passes(id) {
                        return Err(format!(
                            "seed {}: event {id} was sent to subscription {}, whose filter it does not pass {replay}",
                            self.seed, sub.name
                        ));
                    }
                }
            }
            let dead: BTreeSet<&str> = self
                .dead_lettered
                .get(&sub.name)
                .map(|ids| ids.iter().map(String::as_str).collect())
                .unwrap_or_default();
            for id in &dead {
                if !passes(id) {
                    return Err(format!(
                        "seed {}: event {id} was dead-lettered for subscription {}, whose filter it does not pass {replay}",
                        self.seed, sub.name
                    ));
                }
            }
            for id in self.accepted.iter().filter(|id| passes(id)) {
                tally.expected += 1;
                match (got.get(id.as_str()), dead.contains(id.as_str())) {
                    (Some(n), _) => {
                        tally.delivered += 1;
                        tally.duplicates += n - 1;
                    }
                    (None, true) => tally.dead_lettered += 1,
                    (None, false) => {
                        return Err(format!(
                            "seed {}: event {id}, accepted with 200, was neither delivered to nor dead-lettered for subscription {} {replay}",
                            self.seed, sub.name
                        ));
                    }
                }
            }
        }
        Ok(tally)
    }
}
