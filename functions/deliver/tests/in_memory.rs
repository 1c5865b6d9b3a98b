//! The deliver worker on in-memory ports: the real handler, registration and fan-out, with a
//! queue that keeps SQS's contract, stores in maps, a scripted subscriber and a clock moved by
//! hand. What the end-to-end tests show against moto and real HTTP, these show for each rule in
//! milliseconds, and for faults (a store or queue that fails) that an emulator cannot be told
//! to produce.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gridrelay_adapters::aws::sqs_event;
use gridrelay_deliver::{
    ConcurrencySettings, Deliver, DeliverOutcome, DeliverPorts, DeliverySettings, EndpointLimits,
};
use gridrelay_ports::cache::{CachedDeliveryState, CachedSubscriptionStore};
use gridrelay_ports::fan_out::fan_out;
use gridrelay_ports::log_capture::CapturedLogs;
use gridrelay_ports::memory::{
    FixedJitter, ManualClock, MemoryDeliveryCapStore, MemoryDeliveryStateStore, MemoryDestinations,
    MemoryJournal, MemoryObjectStore, MemoryQueue, MemoryReplayStore, MemorySecretStore,
    MemorySubscriptionStore, ScriptedSender,
};
use gridrelay_ports::registration::Registry;
use gridrelay_ports::{
    Clock, DeliveryCapStore, DeliveryRequest, DeliveryStateStore, HandshakeReply, MessageQueue,
    OutgoingMessage, SecretStore, SubscriptionStore,
};
use gridrelay_shared::classify::{AttemptResult, DeliveryOutcome};
use gridrelay_shared::decision::DeadLetterReason;
use gridrelay_shared::delivery::DEAD_LETTER_DELAY;
use gridrelay_shared::delivery_attributes::DeliveryAttributeRequest;
use gridrelay_shared::health::EndpointHealth;
use gridrelay_shared::journal::{EventLife, Next, Standing, Step};
use gridrelay_shared::message::{DeadLetterMessage, DeliveryMessage, DeliveryQueueMessage};
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::subscription::{
    Subscription, SubscriptionRequest, SubscriptionUpdate, Topic,
};
use gridrelay_shared::time_scale::TimeScale;
use gridrelay_shared::validation::ProvisioningState;
use serde_json::value::RawValue;

const TOPIC: &str = "orders";
/// Long enough that a received message stays hidden for the whole test step.
const VISIBILITY: Duration = Duration::from_secs(1800);

fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-23T00:00:00Z")
        .unwrap()
        .to_utc()
}

/// A deliver worker wired to in-memory ports.
struct World {
    clock: Arc<ManualClock>,
    store: Arc<MemorySubscriptionStore>,
    delivery: Arc<MemoryQueue>,
    dead: Arc<MemoryQueue>,
    sender: Arc<ScriptedSender>,
    resources: Arc<MemoryDestinations>,
    state: Arc<MemoryDeliveryStateStore>,
    secrets: Arc<MemorySecretStore>,
    caps: Arc<MemoryDeliveryCapStore>,
    journal: Arc<MemoryJournal>,
    replays: Arc<MemoryReplayStore>,
    /// Topics' archives, as `ingest` writes them.
    archive: Arc<MemoryJournal>,
    deliver: Deliver,
}

impl World {
    fn new(sender: ScriptedSender) -> Self {
        Self::with_sender(|_, _| sender)
    }

    /// A world whose subscriber is made with the world's clock and delivery state (to take
    /// time, as a slow endpoint does, or to act as a concurrent invocation would).
    fn with_sender(
        make: impl FnOnce(Arc<ManualClock>, Arc<MemoryDeliveryStateStore>) -> ScriptedSender,
    ) -> Self {
        let clock = Arc::new(ManualClock::new(t0()));
        let state = Arc::new(MemoryDeliveryStateStore::default());
        let sender = make(clock.clone(), state.clone());
        let store = Arc::new(MemorySubscriptionStore::default());
        let delivery = Arc::new(MemoryQueue::new(clock.clone()));
        let dead = Arc::new(MemoryQueue::new(clock.clone()));
        let sender = Arc::new(sender);
        let secrets = Arc::new(MemorySecretStore::default());
        let caps = Arc::new(MemoryDeliveryCapStore::default());
        let journal = Arc::new(MemoryJournal::default());
        let replays = Arc::new(MemoryReplayStore::default());
        let archive = Arc::new(MemoryJournal::default());
        let resources = Arc::new(MemoryDestinations::default());
        let ports = DeliverPorts {
            store: store.clone(),
            delivery_queue: delivery.clone(),
            // One queue for deliveries, handshake and replay steps and replays' deliveries here,
            // as before the control and replay queues: what reads one reads all
            // (`replays::a_replays_deliveries_and_retries_keep_to_the_replay_queue` has three).
            control_queue: delivery.clone(),
            replay_queue: delivery.clone(),
            dead_letter_queue: dead.clone(),
            ordered_queue: delivery.clone(),
            ordered_redrive_queue: None,
            resources: resources.clone(),
            clock: clock.clone(),
            jitter: Arc::new(FixedJitter(0.0)),
            state: state.clone(),
            secrets: secrets.clone(),
            caps: caps.clone(),
            journal: journal.clone(),
            replays: replays.clone(),
            archive: archive.clone(),
        };
        let deliver = Deliver::new(
            ports,
            sender.clone(),
            DeliverySettings::new(TimeScale::REAL),
        );
        Self {
            clock,
            store,
            delivery,
            dead,
            sender,
            resources,
            state,
            secrets,
            caps,
            journal,
            replays,
            archive,
            deliver,
        }
    }

    /// Deletes the subscription of `request`'s name on the topic and stores a validated one in
    /// its place (another id), as another process would, behind any cache.
    async fn create_again(&self, request: SubscriptionRequest) -> Subscription {
        self.store
            .delete_subscription(TOPIC, &request.name)
            .await
            .unwrap();
        self.store.insert_validated(
            SubscriptionRequest {
                topic: TOPIC.into(),
                ..request
            },
            InputSchema::EventGridSchema,
            self.clock.now(),
        )
    }

    /// Puts a warm function's cache in front of the subscription store.
    fn keep_subscriptions_for(&mut self, ttl: Duration) {
        self.deliver.ports.store = Arc::new(CachedSubscriptionStore::new(
            self.store.clone(),
            self.clock.clone(),
            ttl,
        ));
    }

    /// Creates the topic and a subscription through registration, and runs its handshake.
    async fn subscribe(&self, request: SubscriptionRequest) {
        register(
            &self.store,
            &self.secrets,
            &self.delivery,
            request,
            self.clock.now(),
        )
        .await;
        self.run().await;
    }

    /// The subscription's record as stored now.
    async fn stored(&self, name: &str) -> Subscription {
        self.store
            .get_subscription(TOPIC, name)
            .await
            .unwrap()
            .expect("the subscription exists")
    }

    /// Publishes events through the real fan-out.
    async fn publish(&self, ids: &[&str]) {
        self.publish_sized(ids, 0).await;
    }

    /// Publishes `count` events with ids `{prefix}0`, `{prefix}1`, ...
    async fn publish_numbered(&self, prefix: &str, count: usize) {
        let ids: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
        self.publish(&ids.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
    }

    /// Publishes events whose data holds a string of `padding` bytes.
    async fn publish_sized(&self, ids: &[&str], padding: usize) {
        self.publish_through(self.store.as_ref(), ids, padding)
            .await;
    }

    /// Publishes through `store` (a warm `ingest`'s cache in front of the store, say).
    async fn publish_through(&self, store: &dyn SubscriptionStore, ids: &[&str], padding: usize) {
        let events: Vec<Box<RawValue>> = ids.iter().map(|id| grid_event(id, padding)).collect();
        fan_out(
            store,
            self.delivery.as_ref(),
            TOPIC,
            InputSchema::EventGridSchema,
            &events,
            self.clock.now(),
        )
        .await
        .expect("fanned out");
    }

    /// One invocation over the visible messages, deleting those not reported as failed (what
    /// an event-source mapping with ReportBatchItemFailures does).
    async fn run(&self) -> DeliverOutcome {
        self.run_until(DateTime::<Utc>::MAX_UTC).await
    }

    /// One invocation that must end by `deadline`.
    async fn run_until(&self, deadline: DateTime<Utc>) -> DeliverOutcome {
        let received = self.delivery.receive(10, VISIBILITY);
        let outcome = self
            .deliver
            .handle_until(sqs_event(&received), deadline)
            .await;
        for m in &received {
            if !outcome.failed_message_ids.contains(&m.id) {
                assert!(self.delivery.delete(&m.id, m.receipt));
            }
        }
        outcome
    }

    /// Moves the clock a minute at a time until a message is visible, then runs once.
    async fn run_next(&self) -> DeliverOutcome {
        for _ in 0..24 * 60 {
            if !self.delivery.visible().is_empty() {
                return self.run().await;
            }
            self.clock.advance(Duration::from_secs(60));
        }
        panic!("no message became visible within a day")
    }

    /// The dead-letter queue's messages so far.
    fn dead_letters(&self) -> Vec<DeadLetterMessage> {
        self.dead
            .sent()
            .iter()
            .map(|m| DeadLetterMessage::from_body(&m.body).expect("dead-letter message"))
            .collect()
    }
}

/// Registers a subscription on the topic (creating the topic if needed), as the command line
/// does, without running its handshake.
async fn register(
    store: &MemorySubscriptionStore,
    secrets: &MemorySecretStore,
    delivery: &MemoryQueue,
    request: SubscriptionRequest,
    now: DateTime<Utc>,
) -> Subscription {
    if store.get_topic(TOPIC).await.unwrap().is_none() {
        let topic = Topic::with_new_keys(TOPIC, t0());
        store.create_topic(&topic).await.unwrap();
    }
    registry(store, secrets, delivery)
        .register(
            &SubscriptionRequest {
                topic: TOPIC.into(),
                ..request
            },
            now,
        )
        .await
        .expect("registered")
}

fn registry<'a>(
    store: &'a MemorySubscriptionStore,
    secrets: &'a MemorySecretStore,
    delivery: &'a MemoryQueue,
) -> Registry<'a> {
    // Every bucket exists in a store of its own.
    static BUCKETS: std::sync::LazyLock<MemoryObjectStore> =
        std::sync::LazyLock::new(MemoryObjectStore::default);
    // Registration's checks of AWS resources are the registration tests'; here every one
    // exists (see `resource_world`).
    static DESTINATIONS: std::sync::LazyLock<MemoryDestinations> =
        std::sync::LazyLock::new(MemoryDestinations::default);
    static ALLOWED: std::sync::LazyLock<gridrelay_shared::destination::AllowedDestinations> =
        std::sync::LazyLock::new(gridrelay_shared::destination::AllowedDestinations::any);
    Registry {
        store,
        secrets,
        secret_prefix: "gridrelay",
        control_queue: delivery,
        endpoints: &gridrelay_ports::endpoints::AnyEndpoint,
        dead_letters: &*BUCKETS,
        resources: &*DESTINATIONS,
        allowed_destinations: &ALLOWED,
    }
}

/// A sender that answers 503 for endpoints ending in `suffix`, 200 for all others.
fn busy_at(suffix: &'static str) -> ScriptedSender {
    ScriptedSender::new(move |r| {
        if r.endpoint.ends_with(suffix) {
            AttemptResult::Status(503)
        } else {
            AttemptResult::Status(200)
        }
    })
}

/// An Event Grid event with id `id` whose data holds a string of `padding` bytes.
fn grid_event(id: &str, padding: usize) -> Box<RawValue> {
    let pad = "x".repeat(padding);
    RawValue::from_string(format!(
        r#"{{"id":"{id}","subject":"s","eventType":"t","eventTime":"2026-11-23T00:00:00Z","data":{{"pad":"{pad}"}},"dataVersion":"1","metadataVersion":"1","topic":"/t"}}"#
    ))
    .unwrap()
}

fn request(name: &str) -> SubscriptionRequest {
    SubscriptionRequest {
        name: name.into(),
        endpoint: format!("http://127.0.0.1:9/{name}"),
        ..SubscriptionRequest::default()
    }
}

fn with_dead_letter(request: SubscriptionRequest) -> SubscriptionRequest {
    SubscriptionRequest {
        dead_letter_destination: Some("s3://dead/orders".into()),
        ..request
    }
}

fn header<'a>(r: &'a DeliveryRequest, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// G1, B1, S1, H2: after the handshake, each event goes out alone in its own request with
/// Event Grid's headers, and a success deletes the message.
#[tokio::test]
async fn delivers_each_event_and_deletes_the_message_g1_b1_s1_h2() {
    let w = World::new(ScriptedSender::status(200));
    w.subscribe(request("sub-1")).await;
    let sub = w.stored("sub-1").await;
    assert_eq!(sub.provisioning.state, ProvisioningState::Succeeded);

    w.publish(&["a", "b"]).await;
    let outcome = w.run().await;
    assert_eq!(outcome.report.delivered, 2);
    assert!(outcome.failed_message_ids.is_empty());
    assert!(w.delivery.is_empty(), "the message was deleted");
    let requests = w.sender.requests();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body.as_array().map(Vec::len), Some(1));
        assert_eq!(header(r, "aeg-event-type"), Some("Notification"));
        assert_eq!(header(r, "aeg-subscription-name"), Some("sub-1"));
        assert_eq!(header(r, "aeg-delivery-count"), Some("0"));
        assert_eq!(header(r, "aeg-metadata-version"), Some("1"));
        assert_eq!(header(r, "aeg-data-version"), Some("1"));
    }
}

/// R1, S5, H2: a 503 re-enqueues the events with a 30 s delay; after 30 s they are attempted
/// again, counted as the second delivery, and then delivered.
#[tokio::test]
async fn busy_endpoint_is_retried_after_thirty_seconds_r1_s5() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let w = World::new(ScriptedSender::new(move |_| {
        match seen.fetch_add(1, Ordering::SeqCst) {
            0 => AttemptResult::Status(503),
            _ => AttemptResult::Status(200),
        }
    }));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a"]).await;

    let first = w.run().await;
    assert_eq!((first.report.retried, first.report.delivered), (1, 0));
    let retries = w.delivery.sent();
    let retry = retries.last().unwrap();
    assert_eq!(retry.delay, Duration::from_secs(30));

    w.clock.advance(Duration::from_secs(29));
    assert_eq!(w.run().await.report.attempts, 0, "not visible before 30 s");
    w.clock.advance(Duration::from_secs(1));
    let second = w.run().await;
    assert_eq!(second.report.delivered, 1);
    let requests = w.sender.requests();
    assert_eq!(header(&requests[1], "aeg-delivery-count"), Some("1"));
    assert!(w.delivery.is_empty());
}

/// S3, L2, L4, L6: a 400 sends the event to the dead-letter queue at once, visible after five
/// minutes, with one attempt and the reason.
#[tokio::test]
async fn bad_request_is_dead_lettered_after_five_minutes_s3_l2_l4() {
    let w = World::new(ScriptedSender::status(400));
    w.subscribe(with_dead_letter(request("sub-1"))).await;
    w.publish(&["a"]).await;
    let outcome = w.run().await;
    assert_eq!(outcome.report.dead_lettered, 1);
    assert_eq!(w.dead.sent()[0].delay, DEAD_LETTER_DELAY);
    let dead = w.dead_letters();
    assert_eq!(dead[0].entries.len(), 1);
    assert_eq!(
        dead[0].entries[0].reason,
        DeadLetterReason::MaxDeliveryAttemptsExceeded
    );
    assert_eq!(dead[0].entries[0].delivery_attempts, 1);
    assert!(w.delivery.is_empty());
}

/// R1, R6, L6: with the default policy an always-failing event is attempted 11 times in the
/// first ~22.8 hours; the 12th step (12 h) would pass the TTL, so it is cut to the TTL's end,
/// where the event is dead-lettered as `TimeToLiveExceeded` at 24 hours, not ~35.
#[tokio::test]
async fn an_always_failing_event_is_dead_lettered_at_24_hours_not_35_r1_r6_l6() {
    let w = World::new(ScriptedSender::status(500));
    w.subscribe(with_dead_letter(request("sub-1"))).await;
    let published = w.clock.now();
    w.publish(&["a"]).await;
    while w.dead.sent().is_empty() {
        w.run_next().await;
    }
    let dead = w.dead_letters();
    let entry = &dead[0].entries[0];
    assert_eq!(entry.reason, DeadLetterReason::TimeToLiveExceeded);
    assert_eq!(entry.delivery_attempts, 11);
    assert_eq!(w.sender.requests().len(), 11);
    let lived = dead[0].dead_lettered_at - published;
    assert!(
        lived >= chrono::Duration::hours(24)
            && lived <= chrono::Duration::hours(24) + chrono::Duration::minutes(2),
        "dead-lettered after {lived}"
    );
    assert_eq!(entry.last_outcome.map(|o| o.as_str()), Some("GenericError"));
    // #35: the journal shows the eleven attempts, then the event given up without a twelfth.
    let life = EventLife::of(TOPIC, "a", &w.journal.entries());
    let steps = &life.subscriptions[0].steps;
    let attempts = steps
        .iter()
        .filter(|e| matches!(e.step, Step::Attempt(_)))
        .count();
    assert_eq!(attempts, 11);
    assert_eq!(
        steps.last().map(|e| &e.step),
        Some(&Step::GaveUp {
            next: Next::DeadLetter {
                reason: "TimeToLiveExceeded".into()
            }
        }),
        "{steps:?}"
    );
    assert_eq!(
        life.subscriptions[0].standing,
        Standing::DeadLettering {
            reason: "TimeToLiveExceeded".into()
        }
    );
}

/// L1: without a dead-letter location a terminal failure is dropped and counted.
#[tokio::test]
async fn terminal_failure_without_location_is_dropped_and_counted_l1() {
    let w = World::new(ScriptedSender::status(413));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a", "b"]).await;
    let outcome = w.run().await;
    assert_eq!(outcome.report.dropped, 2);
    assert!(w.dead.sent().is_empty());
    assert!(w.delivery.is_empty());
}

/// G1: when the retry cannot be enqueued, the message is not deleted: SQS redelivers it
/// after its visibility timeout and the events are attempted again.
#[tokio::test]
async fn a_retry_the_queue_refuses_leaves_the_message_for_redelivery_g1() {
    let w = World::new(ScriptedSender::status(500));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a"]).await;
    w.delivery.outage.set(true);
    let outcome = w.run().await;
    assert_eq!(outcome.failed_message_ids.len(), 1);
    assert_eq!(w.delivery.len(), 1, "the message is still in the queue");
    w.delivery.outage.set(false);
    w.clock.advance(VISIBILITY);
    let again = w.run().await;
    assert_eq!(
        again.report.attempts, 1,
        "the events came back and were tried again"
    );
    assert!(again.failed_message_ids.is_empty());
}

/// G1: a dead-letter queue that refuses the events keeps their message for redelivery.
#[tokio::test]
async fn a_dead_letter_the_queue_refuses_leaves_the_message_for_redelivery_g1() {
    let w = World::new(ScriptedSender::status(400));
    w.subscribe(with_dead_letter(request("sub-1"))).await;
    w.publish(&["a"]).await;
    w.dead.outage.set(true);
    let outcome = w.run().await;
    assert_eq!(outcome.failed_message_ids.len(), 1);
    assert_eq!(w.delivery.len(), 1);
}

/// G1: a subscription store that cannot be read fails the records that need it, without an
/// attempt.
#[tokio::test]
async fn an_unreadable_subscription_leaves_the_message_for_redelivery_g1() {
    let w = World::new(ScriptedSender::status(200));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a"]).await;
    w.store.outage.set(true);
    let outcome = w.run().await;
    assert_eq!(outcome.failed_message_ids.len(), 1);
    assert!(w.sender.requests().is_empty());
    assert_eq!(w.delivery.len(), 1);
}

/// A malformed message fails alone; the good ones in the same invocation are delivered.
#[tokio::test]
async fn a_malformed_message_does_not_block_its_neighbours() {
    let w = World::new(ScriptedSender::status(200));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a"]).await;
    let bad = ["{\"delivery\":{\"topic\":1}}", "not json"].map(|body| OutgoingMessage {
        body: body.into(),
        delay: Duration::ZERO,
        group: None,
    });
    w.delivery.send_all(&bad).await;
    let outcome = w.run().await;
    assert_eq!(outcome.report.delivered, 1);
    assert_eq!(outcome.failed_message_ids.len(), 2);
}

/// Events of a deleted subscription are dropped and counted, not retried forever; the
/// delivery journal (#35) says so, and why.
#[tokio::test]
async fn events_of_a_deleted_subscription_are_dropped_and_counted() {
    let w = World::new(ScriptedSender::status(200));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a", "b"]).await;
    w.store.delete_subscription(TOPIC, "sub-1").await.unwrap();
    let outcome = w.run().await;
    assert_eq!(outcome.report.dropped, 2);
    assert!(outcome.failed_message_ids.is_empty());
    assert!(w.sender.requests().is_empty());
    for id in ["a", "b"] {
        let life = EventLife::of(TOPIC, id, &w.journal.entries());
        assert_eq!(
            life.subscriptions[0].standing,
            Standing::Dropped {
                reason: "SubscriptionDeleted".into()
            },
            "{life:?}"
        );
    }
}

/// R1: a wait longer than SQS's 15-minute delay runs in hops; each early arrival is sent on
/// without an attempt, and the attempt comes when the wait is over.
#[tokio::test]
async fn long_waits_run_in_fifteen_minute_hops_r1() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let w = World::new(ScriptedSender::new(move |_| {
        // Six failures: waits of 10 s, 30 s, 1, 5, 10 and 30 minutes (past one hop).
        if seen.fetch_add(1, Ordering::SeqCst) < 6 {
            AttemptResult::Status(500)
        } else {
            AttemptResult::Status(200)
        }
    }));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a"]).await;
    let mut deferred = 0;
    while w.sender.requests().len() < 7 {
        deferred += w.run_next().await.report.deferred;
    }
    // 10 s + 30 s + 1 min + 5 min + 10 min + 30 min: the last wait took a second hop.
    assert!(
        deferred >= 1,
        "the 30-minute wait was sent on at least once"
    );
    assert_eq!(
        header(&w.sender.requests()[6], "aeg-delivery-count"),
        Some("6")
    );
}

/// D1, R3: after ten consecutive failures the endpoint is delayed; the next event is held
/// without an attempt (and without counting one), while another endpoint is not held.
#[tokio::test]
async fn a_failing_endpoint_is_delayed_and_its_neighbour_is_not_d1() {
    let w = World::new(busy_at("/sick"));
    w.subscribe(request("sick")).await;
    w.subscribe(request("well")).await;
    w.publish_numbered("e", 10).await;
    while w.sender.requests().len() < 20 {
        assert!(w.run().await.report.attempts > 0);
    }
    let health = w
        .state
        .endpoint_health("http://127.0.0.1:9/sick")
        .await
        .unwrap();
    assert!(health.value.is_delayed(), "{health:?}");

    w.publish(&["late"]).await;
    let before = w.sender.requests().len();
    let mut outcome = w.run().await;
    while outcome.report.delayed == 0 {
        outcome = w.run().await;
    }
    let sent_now: Vec<String> = w.sender.requests()[before..]
        .iter()
        .map(|r| r.endpoint.clone())
        .collect();
    assert!(
        sent_now.iter().all(|e| e.ends_with("/well")),
        "only the healthy endpoint was called: {sent_now:?}"
    );
    assert_eq!(outcome.report.delayed, 1);
}

/// #34 item 1, D1: the events a delayed endpoint holds travel together. One publish of 100 events
/// to an unbatched subscription is one delivery queue message; held, it stays one message (it
/// was 100: each batch went back on its own), and none of the events is attempted or lost. It
/// waits out the delay in SQS's longest hops (15 minutes; it came back every 10 s).
#[tokio::test]
async fn held_events_of_one_subscription_go_back_as_one_message_d1() {
    let w = World::new(busy_at("/sick"));
    w.subscribe(request("sick")).await;
    // Ten failures delayed it (D1) for an hour.
    let delayed = EndpointHealth {
        consecutive_failures: 10,
        delayed_until: Some(w.clock.now() + chrono::Duration::hours(1)),
        ..EndpointHealth::default()
    };
    w.state
        .put_endpoint_health("http://127.0.0.1:9/sick", &delayed, 0, w.clock.now())
        .await
        .unwrap();
    let attempts = w.sender.requests().len();

    w.publish_numbered("held-", 100).await;
    assert_eq!(w.delivery.visible().len(), 1, "fan-out: one message");
    let sent_before = w.delivery.sent().len();
    let outcome = w.run().await;
    assert_eq!(outcome.report.delayed, 100, "{:?}", outcome.report);
    assert_eq!(outcome.report.attempts, 0);
    let held = &w.delivery.sent()[sent_before..];
    assert_eq!(
        held.len(),
        1,
        "the 100 held events went back as {} messages",
        held.len()
    );
    let Ok(DeliveryQueueMessage::Delivery(message)) =
        DeliveryQueueMessage::from_body(&held[0].body)
    else {
        panic!("a delivery message: {}", held[0].body)
    };
    assert_eq!(message.events.len(), 100);
    assert_eq!(
        w.sender.requests().len(),
        attempts,
        "nothing sent to the delayed endpoint"
    );
    assert_eq!(
        held[0].delay,
        Duration::from_secs(900),
        "the longest hop SQS allows"
    );
    // Three more hops wait out the hour: the one message is received each time, not yet due
    // (deferred, the endpoint's health not read); then the probe goes.
    for _ in 0..3 {
        w.clock.advance(Duration::from_secs(900));
        let report = w.run().await.report;
        assert_eq!((report.deferred, report.attempts), (1, 0), "{report:?}");
    }
    assert_eq!(w.sender.requests().len(), attempts);
    w.clock.advance(Duration::from_secs(900));
    assert_eq!(
        w.run().await.report.attempts,
        1,
        "the probe, when the hour is over"
    );
}

/// Item 5 of the life-cycle issue: a subscription deleted and created again under the same name
/// with another endpoint is another subscription. The old one's pending retry is dropped and
/// counted when it comes due; it never reaches the new endpoint.
#[tokio::test]
async fn old_retries_never_reach_a_subscription_created_again_under_the_name() {
    let w = World::new(busy_at("/old"));
    w.subscribe(SubscriptionRequest {
        endpoint: "http://127.0.0.1:9/old".into(),
        ..request("sub-1")
    })
    .await;
    w.publish(&["a"]).await;
    assert_eq!(w.run().await.report.retried, 1);

    registry(&w.store, &w.secrets, &w.delivery)
        .delete(TOPIC, "sub-1")
        .await
        .unwrap();
    w.subscribe(SubscriptionRequest {
        endpoint: "http://127.0.0.1:9/new".into(),
        ..request("sub-1")
    })
    .await;
    let again = w.stored("sub-1").await;
    assert_eq!(again.provisioning.state, ProvisioningState::Succeeded);

    w.clock.advance(Duration::from_secs(30));
    let outcome = w.run().await;
    assert_eq!(outcome.report.dropped, 1, "{:?}", outcome.report);
    assert_eq!(outcome.report.attempts, 0);
    assert!(
        w.sender
            .requests()
            .iter()
            .all(|r| !r.endpoint.ends_with("/new")),
        "the old subscription's event went to the new endpoint"
    );
    assert!(w.delivery.is_empty());

    // Events published now are the new subscription's, and reach it.
    w.publish(&["b"]).await;
    assert_eq!(w.run().await.report.delivered, 1);
}

/// Issue #9, warm caches: an invocation in front of a cache reads a subscription once per
/// cache period, and a message fanned out for another id than the one kept (the subscription
/// was deleted and created again under its name) has it read again: its events reach the new
/// subscription instead of being dropped as the old one's.
#[tokio::test]
async fn a_kept_subscription_is_read_again_when_a_message_names_another_id() {
    let mut w = World::new(ScriptedSender::status(200));
    w.keep_subscriptions_for(Duration::from_secs(10));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a"]).await;
    assert_eq!(w.run().await.report.delivered, 1);
    for id in ["b", "c", "d"] {
        w.publish(&[id]).await;
        let reads = w.store.reads();
        assert_eq!(w.run().await.report.delivered, 1);
        assert_eq!(w.store.reads(), reads, "the subscription was kept");
        w.clock.advance(Duration::from_secs(1));
    }

    let again = w
        .create_again(SubscriptionRequest {
            endpoint: "http://127.0.0.1:9/new".into(),
            ..request("sub-1")
        })
        .await;
    w.publish(&["e"]).await;
    let outcome = w.run().await;
    assert_eq!(outcome.report.dropped, 0, "{:?}", outcome.report);
    assert_eq!(outcome.report.delivered, 1, "{:?}", outcome.report);
    let last = w.sender.requests().pop().unwrap();
    assert_eq!(last.endpoint, again.endpoint);
}

/// Issue #9, warm caches: a subscription created again is read again alone; the topic's
/// other subscriptions stay kept (a retry of the old one's events, up to a day later, costs
/// one read, not the whole topic's).
#[tokio::test]
async fn a_subscription_created_again_is_read_again_alone() {
    let mut w = World::new(ScriptedSender::status(200));
    w.keep_subscriptions_for(Duration::from_secs(10));
    w.subscribe(request("sub-1")).await;
    w.subscribe(request("sub-2")).await;
    w.publish(&["a"]).await;
    assert_eq!(w.run().await.report.delivered, 2);
    w.create_again(request("sub-1")).await;
    w.publish(&["b"]).await;
    let reads = w.store.reads();
    let outcome = w.run().await;
    assert_eq!(outcome.report.delivered, 2, "{:?}", outcome.report);
    assert_eq!(w.store.reads() - reads, 1, "sub-1 alone is read again");
}

/// Subscribes `sub-1` with endpoint `/old`, delivers one event published through
/// `warm_ingest` (which keeps the list from then on), deletes and creates `sub-1` again with
/// endpoint `/new`, and moves the clock to a second before `warm_ingest`'s period `ttl` ends.
async fn re_create_within_the_period(
    w: &World,
    warm_ingest: &CachedSubscriptionStore,
    ttl: Duration,
) {
    w.subscribe(SubscriptionRequest {
        endpoint: "http://127.0.0.1:9/old".into(),
        ..request("sub-1")
    })
    .await;
    w.publish_through(warm_ingest, &["a"], 0).await;
    assert_eq!(w.run().await.report.delivered, 1);

    w.create_again(SubscriptionRequest {
        endpoint: "http://127.0.0.1:9/new".into(),
        ..request("sub-1")
    })
    .await;
    w.clock.advance(ttl - Duration::from_secs(1));
}

/// Issue #9, warm caches: a re-created subscription is, for a warm `ingest`, like any new one:
/// it receives what is published from at most one cache period after it was created. Within
/// the period the kept list still names the old subscription, so events fan out under the old
/// id; a `deliver` that reads the store drops them, counted, and never sends them to the new
/// endpoint (the life-cycle issue's item 6). After the period they fan out under the new id
/// and reach it.
#[tokio::test]
async fn a_warm_ingest_keeping_a_re_created_subscription_drops_its_events_for_one_period() {
    let w = World::new(ScriptedSender::status(200));
    let ttl = Duration::from_secs(10);
    let warm_ingest = CachedSubscriptionStore::new(w.store.clone(), w.clock.clone(), ttl);
    re_create_within_the_period(&w, &warm_ingest, ttl).await;
    w.publish_through(&warm_ingest, &["b"], 0).await;
    let within = w.run().await.report;
    assert_eq!((within.dropped, within.attempts), (1, 0), "{within:?}");
    assert!(w.delivery.is_empty());

    w.clock.advance(Duration::from_secs(1));
    w.publish_through(&warm_ingest, &["c"], 0).await;
    assert_eq!(w.run().await.report.delivered, 1);
    let to_new: Vec<_> = w
        .sender
        .requests()
        .into_iter()
        .filter(|r| r.endpoint.ends_with("/new"))
        .collect();
    assert_eq!(to_new.len(), 1, "only c reached the new endpoint");
    assert!(to_new[0].body.contains(r#""id":"c""#), "{to_new:?}");
}

/// Issue #9, warm caches, both functions warm: within one cache period of a subscription being
/// deleted and created again, events that a warm `ingest` fans out under the old id reach a
/// `deliver` that still keeps the old record, and go to the old endpoint, as the configuration
/// was when they were published; never to the new one. Events fanned out after the period
/// carry the new id, which makes `deliver` read the subscription again, and reach the new one.
#[tokio::test]
async fn warm_functions_send_a_re_created_subscriptions_events_as_it_was_for_one_period() {
    let mut w = World::new(ScriptedSender::status(200));
    let ttl = Duration::from_secs(10);
    w.keep_subscriptions_for(ttl);
    let warm_ingest = CachedSubscriptionStore::new(w.store.clone(), w.clock.clone(), ttl);
    re_create_within_the_period(&w, &warm_ingest, ttl).await;
    w.publish_through(&warm_ingest, &["b"], 0).await;
    assert_eq!(w.run().await.report.delivered, 1);
    w.clock.advance(Duration::from_secs(1));
    w.publish_through(&warm_ingest, &["c"], 0).await;
    assert_eq!(w.run().await.report.delivered, 1);

    let sent: Vec<(String, String)> = w
        .sender
        .requests()
        .into_iter()
        .map(|r| (r.endpoint, r.body))
        .collect();
    let to = |path: &str, id: &str| {
        sent.iter()
            .any(|(e, b)| e.ends_with(path) && b.contains(&format!(r#""id":"{id}""#)))
    };
    assert!(to("/old", "b"), "b as the configuration was: {sent:?}");
    assert!(to("/new", "c"), "c to the new subscription: {sent:?}");
    assert!(!to("/new", "b") && !to("/old", "c"), "{sent:?}");
}

/// Issue #9, warm caches: a kept subscription written before ids existed (no id), deleted and
/// created again, is read again when a message names the new one's id: its events go to the
/// new endpoint, not the old one's.
#[tokio::test]
async fn a_kept_subscription_without_an_id_is_read_again_for_a_message_with_one() {
    let mut w = World::new(ScriptedSender::status(200));
    w.keep_subscriptions_for(Duration::from_secs(10));
    let mut old = SubscriptionRequest {
        topic: TOPIC.into(),
        ..request("sub-1")
    }
    .validate(InputSchema::EventGridSchema, w.clock.now())
    .unwrap();
    old.id = String::new();
    old.provisioning =
        gridrelay_shared::validation::Provisioning::with_state(ProvisioningState::Succeeded, None);
    w.store
        .create_topic(&Topic::with_new_keys(TOPIC, w.clock.now()))
        .await
        .ok();
    w.store.create_subscription(&old).await.unwrap();
    w.publish(&["a"]).await;
    assert_eq!(w.run().await.report.delivered, 1);

    let again = w
        .create_again(SubscriptionRequest {
            endpoint: "http://127.0.0.1:9/new".into(),
            ..request("sub-1")
        })
        .await;
    w.publish(&["b"]).await;
    assert_eq!(w.run().await.report.delivered, 1);
    let last = w.sender.requests().pop().unwrap();
    assert_eq!(last.endpoint, again.endpoint, "not the old endpoint");
}

/// D1 with a warm cache: an invocation keeping an endpoint's record as healthy, whose
/// delivery succeeds after another invocation stored failures for it, clears those failures in
/// the store (a success is recorded on the record as it is, not as it was kept).
#[tokio::test]
async fn a_success_clears_failures_stored_meanwhile_despite_the_cache_d1() {
    let mut w = World::new(ScriptedSender::status(200));
    w.deliver.ports.state = Arc::new(CachedDeliveryState::new(
        w.state.clone(),
        w.clock.clone(),
        Duration::from_secs(10),
    ));
    w.subscribe(request("sub-1")).await;
    let endpoint = w.stored("sub-1").await.endpoint;
    w.publish(&["a"]).await;
    assert_eq!(w.run().await.report.delivered, 1);

    // Another invocation counts nine failures.
    gridrelay_ports::update_endpoint_health(w.state.as_ref(), &endpoint, w.clock.now(), |h| {
        EndpointHealth {
            consecutive_failures: 9,
            ..h
        }
    })
    .await
    .unwrap();
    w.publish(&["b"]).await;
    assert_eq!(w.run().await.report.delivered, 1);
    let stored = w.state.endpoint_health(&endpoint).await.unwrap().value;
    assert_eq!(
        stored,
        EndpointHealth::default(),
        "the success cleared them"
    );
}

/// Item 6 of the life-cycle issue: a subscription deleted and created again (another endpoint)
/// while the old one's handshake is in flight is not overwritten by the old handshake's outcome:
/// the new one keeps its endpoint and waits for its own handshake, which then validates it.
#[tokio::test]
async fn a_handshake_does_not_overwrite_a_subscription_created_again_meanwhile() {
    let w = World::new(ScriptedSender::status(200));
    let (store, secrets, delivery, clock) = (
        w.store.clone(),
        w.secrets.clone(),
        w.delivery.clone(),
        w.clock.clone(),
    );
    w.sender.on_handshake(move |asked| {
        if asked.endpoint.ends_with("/old") {
            // During the round trip, a user deletes the subscription and creates it again.
            futures::executor::block_on(async {
                registry(&store, &secrets, &delivery)
                    .delete(TOPIC, "sub-1")
                    .await
                    .unwrap();
                register(
                    &store,
                    &secrets,
                    &delivery,
                    SubscriptionRequest {
                        endpoint: "http://127.0.0.1:9/new".into(),
                        ..request("sub-1")
                    },
                    clock.now(),
                )
                .await;
            });
        }
        Ok(ScriptedSender::answer_with_code(asked))
    });
    w.subscribe(SubscriptionRequest {
        endpoint: "http://127.0.0.1:9/old".into(),
        ..request("sub-1")
    })
    .await;

    let stored = w.stored("sub-1").await;
    assert_eq!(stored.endpoint, "http://127.0.0.1:9/new");
    assert_eq!(
        stored.provisioning.state,
        ProvisioningState::Creating,
        "the old handshake's outcome was written over the new subscription"
    );

    w.run().await;
    let stored = w.stored("sub-1").await;
    assert_eq!(stored.endpoint, "http://127.0.0.1:9/new");
    assert_eq!(stored.provisioning.state, ProvisioningState::Succeeded);
}

/// Item 1 of the life-cycle issue: an invocation plans against its deadline. With an endpoint
/// that hangs until each attempt times out (30 s), attempts start only while one can still end
/// with the margin kept before the deadline; the events not attempted are handed on, due at
/// once with their delivery count unchanged, and the invocation ends in time with its message
/// settled (not left to come back after the visibility timeout).
#[tokio::test]
async fn attempts_stop_before_the_deadline_and_the_rest_is_handed_on() {
    let mut w = World::with_sender(|clock, _| {
        ScriptedSender::new(move |_| {
            clock.advance(Duration::from_secs(30));
            AttemptResult::TimedOut
        })
    });
    w.deliver.limits = Arc::new(EndpointLimits::new(ConcurrencySettings {
        max_in_flight: 1,
        ..ConcurrencySettings::default()
    }));
    assert_eq!(w.deliver.settings.attempt_timeout, Duration::from_secs(30));
    assert_eq!(w.deliver.settings.deadline_margin, Duration::from_secs(10));
    w.subscribe(request("sub-1")).await;
    w.publish_numbered("e", 10).await;

    let deadline = w.clock.now() + chrono::Duration::seconds(100);
    let outcome = w.run_until(deadline).await;
    // Starts at 0, 30 and 60 s end by 90 s = deadline - margin; a fourth would end at 120 s.
    assert_eq!(outcome.report.attempts, 3, "{:?}", outcome.report);
    assert_eq!(outcome.report.retried, 3);
    assert_eq!(outcome.report.handed_on, 7);
    assert!(outcome.failed_message_ids.is_empty());
    assert!(w.clock.now() <= deadline - chrono::Duration::seconds(10));

    let handed_on: Vec<_> = w
        .delivery
        .visible()
        .iter()
        .map(
            |m| match DeliveryQueueMessage::from_body(&m.body).unwrap() {
                DeliveryQueueMessage::Delivery(d) => d,
                other => panic!("{other:?}"),
            },
        )
        .collect();
    assert_eq!(
        handed_on.iter().map(|m| m.events.len()).sum::<usize>(),
        7,
        "handed on, due now"
    );
    assert!(
        handed_on
            .iter()
            .all(|m| m.attempts == 0 && m.last_attempt.is_none())
    );
}

/// Item 1, R4: the wait for late answers ends with the time left before the deadline (less the
/// margin), not after the whole 3-minute late window.
#[tokio::test(start_paused = true)]
async fn the_late_answer_wait_ends_before_the_deadline_r4() {
    let w = World::new(ScriptedSender::new(|_| AttemptResult::TimedOut));
    w.sender.keep_timed_out_requests_open();
    w.subscribe(request("sub-1")).await;
    w.publish(&["a"]).await;
    let deadline = w.clock.now() + chrono::Duration::seconds(60);
    let started = tokio::time::Instant::now();
    let outcome = w.run_until(deadline).await;
    assert_eq!(outcome.report.retried, 1, "{:?}", outcome.report);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(49) && waited <= Duration::from_secs(50),
        "waited {waited:?} for the late answer; 50 s were left"
    );
}

/// R4 under the worker's total: a timed-out request held open for its late answer keeps its
/// place among the requests in flight (so open connections stay under the total), and batches
/// that find no place before their last chance to start are handed on, not left waiting past
/// the deadline for places that come back only after the attempts.
#[tokio::test(start_paused = true)]
async fn requests_open_for_late_answers_fill_the_total_and_the_rest_is_handed_on_r4() {
    let mut w = World::new(ScriptedSender::new(|_| AttemptResult::TimedOut));
    w.sender.keep_timed_out_requests_open();
    w.deliver.limits = Arc::new(EndpointLimits::new(ConcurrencySettings {
        max_in_flight: 2,
        ..ConcurrencySettings::default()
    }));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a", "b", "c", "d", "e"]).await;
    let deadline = w.clock.now() + chrono::Duration::seconds(60);
    let outcome = tokio::time::timeout(Duration::from_secs(120), w.run_until(deadline))
        .await
        .expect("the invocation ends by its deadline");
    assert_eq!(outcome.report.attempts, 2, "{:?}", outcome.report);
    assert_eq!(outcome.report.retried, 2);
    assert_eq!(outcome.report.handed_on, 3);
    assert!(outcome.failed_message_ids.is_empty());
}

/// Item 6 of the life-cycle issue, D1: endpoint health is changed as it is at the write, not as
/// it was read before the attempts. While this invocation's attempt is in flight another one
/// delays the endpoint; this invocation's failure adds to that record instead of writing its
/// own stale view (one failure, no delay) over it.
#[tokio::test]
async fn a_stale_health_writer_does_not_undo_a_delay_d1() {
    const SICK: &str = "http://127.0.0.1:9/sick";
    let w = World::with_sender(|clock, state| {
        ScriptedSender::new(move |_| {
            futures::executor::block_on(async {
                // Another invocation's tenth failure, written during this attempt.
                let read = state.endpoint_health(SICK).await.unwrap();
                let delayed = EndpointHealth {
                    consecutive_failures: 10,
                    delayed_until: Some(clock.now() + chrono::Duration::minutes(1)),
                    probe_until: None,
                    last_failure: None,
                };
                state
                    .put_endpoint_health(SICK, &delayed, read.version, clock.now())
                    .await
                    .unwrap();
            });
            AttemptResult::Status(503)
        })
    });
    w.subscribe(request("sick")).await;
    w.publish(&["a"]).await;
    assert_eq!(w.run().await.report.retried, 1);
    let health = w.state.endpoint_health(SICK).await.unwrap().value;
    assert!(health.is_delayed(), "the delay was undone: {health:?}");
    assert_eq!(health.consecutive_failures, 11);
}

/// Item 2 of the life-cycle issue, G1: a record that failed because a store did not answer
/// comes back after 30 s, then 90 s (not after the queue's 30-minute visibility timeout), and
/// its events are delivered once the store answers again.
#[tokio::test]
async fn a_failed_record_comes_back_after_a_short_growing_wait_g1() {
    let w = World::new(ScriptedSender::status(200));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a"]).await;
    w.store.outage.set(true);
    assert_eq!(w.run().await.failed_message_ids.len(), 1);
    w.clock.advance(Duration::from_secs(29));
    assert!(w.delivery.visible().is_empty(), "back before 30 s");
    w.clock.advance(Duration::from_secs(1));
    assert_eq!(
        w.run().await.failed_message_ids.len(),
        1,
        "received again at 30 s"
    );
    w.clock.advance(Duration::from_secs(89));
    assert!(w.delivery.visible().is_empty(), "the second wait is 90 s");
    w.clock.advance(Duration::from_secs(1));
    w.store.outage.set(false);
    let outcome = w.run().await;
    assert_eq!(outcome.report.delivered, 1);
    assert!(w.delivery.is_empty());
}

/// Item 2 of the life-cycle issue, H1, R5, L2: a secret delivery header whose value no longer
/// exists is the subscription's problem, not its records': its events are settled as failed
/// attempts that send nothing (retried after 10 s), and when the attempts run out they are
/// dead-lettered. The message is never left to SQS's redelivery, and no request goes out
/// without the header.
#[tokio::test]
async fn a_missing_secret_header_follows_the_retry_policy_h1_r5_l2() {
    let w = World::new(ScriptedSender::status(200));
    w.subscribe(with_dead_letter(SubscriptionRequest {
        max_delivery_attempts: Some(2),
        delivery_attributes: vec![secret_authorization()],
        ..request("sub-1")
    }))
    .await;
    w.publish(&["a"]).await;
    let secret_id = w.stored("sub-1").await.delivery_attribute_mappings[0]
        .secret_id
        .clone()
        .expect("a secret");
    w.secrets.delete(&secret_id).await.unwrap();

    let first = w.run().await;
    assert!(first.failed_message_ids.is_empty(), "{first:?}");
    assert_eq!((first.report.attempts, first.report.retried), (1, 1));
    assert_eq!(
        w.delivery.sent().last().unwrap().delay,
        Duration::from_secs(10)
    );
    w.clock.advance(Duration::from_secs(10));
    let second = w.run().await;
    assert!(second.failed_message_ids.is_empty());
    assert_eq!(second.report.dead_lettered, 1);
    assert!(
        w.sender.requests().is_empty(),
        "nothing was sent without its header"
    );
    let dead = w.dead_letters();
    assert_eq!(
        dead[0].entries[0].reason,
        DeadLetterReason::MaxDeliveryAttemptsExceeded
    );
    assert_eq!(dead[0].entries[0].delivery_attempts, 2);
    let health = w
        .state
        .endpoint_health("http://127.0.0.1:9/sub-1")
        .await
        .unwrap();
    assert_eq!(
        health.value,
        EndpointHealth::default(),
        "not the endpoint's failure"
    );
}

/// Issue #34 item 4, G1, R5, L1: a secret store that does not answer (down, throttling) spends
/// no attempt. With one attempt allowed and no dead-letter location, an outage used to settle
/// the event as a failed attempt and drop it unsent; now its message goes back to SQS, as with
/// any unavailable store, and is delivered, with its header, once the store answers.
#[tokio::test]
async fn a_secret_store_outage_spends_no_attempt_g1_r5_l1() {
    let w = World::new(ScriptedSender::status(200));
    w.subscribe(SubscriptionRequest {
        max_delivery_attempts: Some(1),
        delivery_attributes: vec![secret_authorization()],
        ..request("sub-1")
    })
    .await;
    w.publish(&["a"]).await;
    w.secrets.outage.set(true);

    let during = w.run().await;
    assert_eq!(during.failed_message_ids.len(), 1, "{during:?}");
    assert_eq!(
        (during.report.attempts, during.report.dropped),
        (0, 0),
        "{during:?}"
    );
    assert!(w.sender.requests().is_empty());

    w.secrets.outage.set(false);
    w.clock.advance(Duration::from_secs(30));
    let after = w.run().await;
    assert_eq!(after.report.delivered, 1, "{after:?}");
    let requests = w.sender.requests();
    assert_eq!(header(&requests[0], "Authorization"), Some("Bearer s3cret"));
}

/// A secret `Authorization` delivery header (H1).
fn secret_authorization() -> DeliveryAttributeRequest {
    DeliveryAttributeRequest {
        name: "Authorization".into(),
        value: "Bearer s3cret".into(),
        is_secret: true,
        dynamic: false,
    }
}

/// R1, R2, S5: the retries of an invocation's failed batches travel in one message per due
/// time, not one per batch (each a paid SQS request): twenty unbatched events failing with
/// 500 (10 s) or 503 (30 s) come back in two messages, and every event is delivered later.
#[tokio::test]
async fn retries_due_together_share_one_message_r1_r2_s5() {
    let first_tries = Arc::new(AtomicUsize::new(0));
    let tries = first_tries.clone();
    let w = World::new(ScriptedSender::new(move |r: &DeliveryRequest| {
        if header(r, "aeg-delivery-count") != Some("0") {
            return AttemptResult::Status(200);
        }
        match tries.fetch_add(1, Ordering::SeqCst) % 2 {
            0 => AttemptResult::Status(500),
            _ => AttemptResult::Status(503),
        }
    }));
    w.subscribe(request("sub-1")).await;
    w.publish_numbered("e", 20).await;
    let sent_before = w.delivery.sent().len();

    let first = w.run().await;
    assert_eq!((first.report.attempts, first.report.retried), (20, 20));
    let retries = &w.delivery.sent()[sent_before..];
    let mut shape: Vec<(Duration, usize)> = retries
        .iter()
        .map(|m| match DeliveryQueueMessage::from_body(&m.body) {
            Ok(DeliveryQueueMessage::Delivery(d)) => (m.delay, d.events.len()),
            other => panic!("expected a delivery message, got {other:?}"),
        })
        .collect();
    shape.sort();
    assert_eq!(
        shape,
        [(Duration::from_secs(10), 10), (Duration::from_secs(30), 10)]
    );

    // The endpoint is delayed after so many failures (D1); its events follow when it is due.
    let mut delivered = 0;
    while !w.delivery.is_empty() {
        delivered += w.run_next().await.report.delivered;
    }
    assert_eq!(delivered, 20);
}

/// G1: a merged retry too large for one message goes in several, each tagged with its own
/// events' records: when the queue refuses one of them, only the records whose events it
/// carries are redelivered, and the others are deleted.
#[tokio::test]
async fn a_refused_retry_message_fails_only_the_records_it_carries_g1_r2() {
    let w = World::new(ScriptedSender::status(500));
    w.subscribe(request("sub-1")).await;
    // Three records of 400 KB events: their retries need two messages (1 MiB each at most).
    for id in ["first", "second", "third"] {
        w.publish_sized(&[id], 400_000).await;
    }
    let sent_before = w.delivery.sent().len();
    w.delivery
        .refuse_entries_containing(Some(r#""id":"third""#));
    let outcome = w.run().await;
    assert_eq!(outcome.report.attempts, 3);
    let retries: Vec<usize> = w.delivery.sent()[sent_before..]
        .iter()
        .map(|m| match DeliveryQueueMessage::from_body(&m.body) {
            Ok(DeliveryQueueMessage::Delivery(d)) => d.events.len(),
            other => panic!("expected a delivery message, got {other:?}"),
        })
        .collect();
    assert_eq!(retries, [2], "the first two events' message was accepted");
    assert_eq!(
        outcome.failed_message_ids.len(),
        1,
        "only the third event's record is left for redelivery"
    );
}

/// G3 and the cost of waiting (#9): an endpoint that answers well gets its requests together —
/// its limit doubles each round trip, far past the 32 the worker once sent at once — while an
/// endpoint that answers 503 gets fewer and fewer (AIMD), and neither holds up the other.
/// Every event of both is attempted in the invocation.
#[tokio::test(start_paused = true)]
async fn a_healthy_endpoint_gets_many_requests_at_once_and_an_overloaded_one_few() {
    let w = World::new(ScriptedSender::new(|r: &DeliveryRequest| {
        if r.endpoint.contains("busy") {
            AttemptResult::Status(503)
        } else {
            AttemptResult::Status(200)
        }
    }));
    let fast = "http://127.0.0.2:9/fast";
    let busy = "http://127.0.0.3:9/busy";
    for (name, endpoint) in [("fast", fast), ("busy", busy)] {
        w.subscribe(SubscriptionRequest {
            endpoint: endpoint.into(),
            ..request(name)
        })
        .await;
    }
    w.sender
        .answer_after(|| Box::pin(tokio::time::sleep(Duration::from_millis(50))));
    w.publish_numbered("e", 1000).await;

    let outcome = w.run().await;
    assert_eq!(outcome.report.attempts, 2000);
    assert_eq!(outcome.report.delivered, 1000);
    let initial = ConcurrencySettings::default().initial_per_endpoint as usize;
    // 16, 32, 64, 128, 256, then the rest (504) in the sixth round trip.
    assert!(
        w.sender.peak_in_flight(fast) >= 256,
        "the healthy endpoint had at most {} in flight",
        w.sender.peak_in_flight(fast)
    );
    assert!(w.sender.peak_in_flight(busy) <= initial);
    assert_eq!(w.deliver.limits.limit_of(busy), Some(1));
    assert!(w.deliver.limits.limit_of(fast) > Some(256));
}

/// G3 and the cost of waiting (#9): an endpoint that answers every request well, but serves
/// only 32 at once in 20 ms and queues the rest, is not sent the most the worker allows (576):
/// its answers' round-trip times (timed on the runtime's clock, paused here) show the queue,
/// and its limit comes down to near what it serves, while a 50 ms endpoint that serves any
/// number at once keeps growing (the test above). Every event is delivered.
#[tokio::test(start_paused = true)]
async fn an_endpoint_that_queues_what_it_cannot_serve_gets_about_what_it_serves() {
    let w = World::new(ScriptedSender::status(200));
    let server = Arc::new(tokio::sync::Semaphore::new(32));
    w.sender.answer_after(move || {
        let server = server.clone();
        Box::pin(async move {
            let _serving = server.acquire_owned().await.expect("never closed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        })
    });
    w.subscribe(request("sub-1")).await;
    w.publish_numbered("e", 20_000).await;

    let mut delivered = 0;
    while !w.delivery.visible().is_empty() {
        delivered += w.run().await.report.delivered;
    }
    assert_eq!(delivered, 20_000);
    let endpoint = &w.sender.requests()[0].endpoint;
    let limit = w.deliver.limits.limit_of(endpoint).expect("tracked");
    assert!(
        (32..=64).contains(&limit),
        "ends near the 32 it serves, not the most (576): {limit}"
    );
}

/// R1, S5: a 503's `Retry-After` longer than the schedule's step and S5's minimum sets the
/// retry's wait; a shorter one does not shorten it.
#[tokio::test]
async fn retry_after_on_503_is_honoured_within_the_ladder_r1_s5() {
    let w = World::new(ScriptedSender::status(503));
    w.subscribe(request("sub-1")).await;
    for (asked, waited) in [(120, 120), (3, 30)] {
        w.sender.retry_after(Some(Duration::from_secs(asked)));
        let before = w.delivery.sent().len();
        w.publish(&["a"]).await;
        w.run().await;
        let retries: Vec<Duration> = w.delivery.sent()[before + 1..]
            .iter()
            .map(|m| m.delay)
            .collect();
        assert_eq!(
            retries,
            [Duration::from_secs(waited)],
            "Retry-After {asked}"
        );
        w.clock.advance(Duration::from_secs(3600));
        w.delivery.receive(10, VISIBILITY);
    }
}

/// Issue #9, per-subscription metrics: an invocation counts what each subscription's events
/// went through, and the time from publish to delivery of each delivered event; recorded,
/// each subscription's metrics carry its topic and name, and the stack's (no dimension of
/// its own) are their sum.
#[tokio::test]
async fn each_subscription_has_its_own_metrics_and_the_stack_their_sum() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let w = World::new(busy_at("/sub-2"));
    w.subscribe(request("sub-1")).await;
    w.subscribe(request("sub-2")).await;
    w.publish(&["a", "b"]).await;
    w.clock.advance(Duration::from_millis(1_500));
    let outcome = w.run().await;

    let key = |name: &str| (TOPIC.to_string(), name.to_string());
    let delivered = &outcome.by_subscription[&key("sub-1")];
    assert_eq!(delivered.counts.delivered, 2);
    assert_eq!(delivered.counts.failed_attempts, 0);
    assert_eq!(delivered.latency_ms, [1_500.0, 1_500.0]);
    let failing = &outcome.by_subscription[&key("sub-2")];
    assert_eq!(failing.counts.delivered, 0);
    assert_eq!(
        failing.counts.failed_attempts, 2,
        "one attempt per event, unbatched"
    );
    assert_eq!(failing.counts.retried, 2);
    assert!(failing.latency_ms.is_empty());

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        gridrelay_deliver::metrics::record(&outcome.by_subscription);
    });
    let recorded = snapshotter.snapshot().into_vec();
    let value = |name: &str, subscription: Option<&str>| {
        recorded.iter().find_map(|(key, _, _, value)| {
            let labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            let wanted = match subscription {
                Some(s) => vec![
                    ("Topic".to_string(), TOPIC.to_string()),
                    ("Subscription".to_string(), s.to_string()),
                ],
                None => vec![],
            };
            (key.key().name() == name && labels == wanted).then_some(value)
        })
    };
    use gridrelay_deliver::metrics::{DELIVERED, FAILED_ATTEMPTS, LATENCY, RETRIED};
    assert_eq!(
        value(DELIVERED, Some("sub-1")),
        Some(&DebugValue::Counter(2))
    );
    assert_eq!(
        value(FAILED_ATTEMPTS, Some("sub-2")),
        Some(&DebugValue::Counter(2))
    );
    assert_eq!(value(RETRIED, Some("sub-2")), Some(&DebugValue::Counter(2)));
    assert_eq!(value(DELIVERED, Some("sub-2")), None, "nothing to say");
    assert_eq!(value(DELIVERED, None), Some(&DebugValue::Counter(2)));
    assert_eq!(value(RETRIED, None), Some(&DebugValue::Counter(2)));
    match value(LATENCY, Some("sub-1")) {
        Some(DebugValue::Histogram(values)) => {
            assert_eq!(
                values.iter().map(|v| v.into_inner()).collect::<Vec<_>>(),
                [1_500.0, 1_500.0]
            );
        }
        other => panic!("no latency recorded: {other:?}"),
    }
}

/// The delivery messages sent since the first `from` were, with their delays.
fn delivery_messages_since(w: &World, from: usize) -> Vec<(DeliveryMessage, Duration)> {
    w.delivery.sent()[from..]
        .iter()
        .filter_map(
            |m| match DeliveryQueueMessage::from_body(&m.body).unwrap() {
                DeliveryQueueMessage::Delivery(d) => Some((d, m.delay)),
                DeliveryQueueMessage::Validation(_) | DeliveryQueueMessage::Replay(_) => None,
            },
        )
        .collect()
}

/// A second deliver worker (another Lambda instance): the same stores, queues and endpoint,
/// its own process memory (endpoint limits, caps' local share).
fn another_worker(w: &World) -> Deliver {
    let ports = DeliverPorts {
        store: w.store.clone(),
        delivery_queue: w.delivery.clone(),
        // One queue for deliveries and handshake steps here.
        control_queue: w.delivery.clone(),
        replay_queue: w.delivery.clone(),
        dead_letter_queue: w.dead.clone(),
        ordered_queue: w.delivery.clone(),
        ordered_redrive_queue: None,
        resources: w.resources.clone(),
        clock: w.clock.clone(),
        jitter: Arc::new(FixedJitter(0.0)),
        state: w.state.clone(),
        secrets: w.secrets.clone(),
        caps: w.caps.clone(),
        journal: w.journal.clone(),
        replays: w.replays.clone(),
        archive: w.archive.clone(),
    };
    Deliver::new(
        ports,
        w.sender.clone(),
        DeliverySettings::new(TimeScale::REAL),
    )
}

fn capped(name: &str, concurrent: Option<i64>, per_second: Option<i64>) -> SubscriptionRequest {
    SubscriptionRequest {
        max_concurrent_requests: concurrent,
        max_events_per_second: per_second,
        ..request(name)
    }
}

/// `--max-concurrent-requests` holds across workers: two workers (two Lambda instances, each
/// with its own memory) deliver 60 events to an endpoint that answers in 50 ms, and it never
/// has more than 3 requests in flight, though the adaptive limit alone would send 16 at once.
/// Waiting for a slot is not an attempt: every event is delivered by its first and only one.
#[tokio::test(start_paused = true)]
async fn max_concurrent_requests_holds_across_workers_and_waiting_is_no_attempt() {
    let w = World::new(ScriptedSender::status(200));
    w.subscribe(capped("sub-1", Some(3), None)).await;
    w.sender
        .answer_after(|| Box::pin(tokio::time::sleep(Duration::from_millis(50))));
    let second = another_worker(&w);
    for half in 0..2 {
        w.publish_numbered(&format!("e{half}-"), 30).await;
    }
    let received = w.delivery.receive(10, VISIBILITY);
    assert_eq!(received.len(), 2, "one message per publish");
    let (a, b) = futures::join!(
        w.deliver.handle(sqs_event(&received[..1])),
        second.handle(sqs_event(&received[1..]))
    );
    let endpoint = w.stored("sub-1").await.endpoint;
    assert_eq!(w.sender.peak_in_flight(&endpoint), 3);
    for outcome in [&a, &b] {
        assert_eq!(outcome.report.attempts, 30, "{:?}", outcome.report);
        assert_eq!(outcome.report.delivered, 30);
        assert_eq!(outcome.report.throttled, 0);
    }
    assert!(
        w.sender
            .requests()
            .iter()
            .all(|r| header(r, "aeg-delivery-count") == Some("0"))
    );
    let sub = w.stored("sub-1").await;
    assert_eq!(
        w.caps
            .slots_held(&format!("{}/{}/{}", sub.topic, sub.name, sub.id)),
        0,
        "every slot given back"
    );
}

/// `--max-events-per-second`: an invocation with 35 events for a subscription allowed 10 per
/// second books each batch in the schedule (100 ms per event). It sends those due within the
/// 2 s it may wait, 100 ms apart, and hands the rest on with their delivery count unchanged
/// (not an attempt), each due a second before its booked start (the queue's delays are whole
/// seconds). When they come back they wait for their start and go without booking again: the
/// backlog goes round the queue once, stays spaced, and the schedule ends where the 35
/// bookings put it (3.5 s).
#[tokio::test(start_paused = true)]
async fn max_events_per_second_books_a_schedule_and_hands_the_rest_on_without_attempts() {
    let sent_at = Arc::new(std::sync::Mutex::new(Vec::new()));
    let times = sent_at.clone();
    let w = World::new(ScriptedSender::new(move |_| {
        times.lock().unwrap().push(tokio::time::Instant::now());
        AttemptResult::Status(200)
    }));
    w.subscribe(capped("sub-1", None, Some(10))).await;
    w.publish_numbered("e", 35).await;
    let sent_before = w.delivery.sent().len();
    // Requests sent in one invocation are 100 ms apart (the injected clock stands still while
    // the runtime's paused timer moves).
    let spaced = |from: usize| {
        let times = sent_at.lock().unwrap();
        let mut run: Vec<_> = times[from..].to_vec();
        run.sort();
        run.windows(2)
            .all(|w| w[1] - w[0] >= Duration::from_millis(99))
    };

    let first = w.run().await;
    assert_eq!(first.report.attempts, 21, "{:?}", first.report);
    assert_eq!(first.report.delivered, 21);
    assert_eq!(first.report.throttled, 14);
    assert!(spaced(0));
    let mut by_second = std::collections::BTreeMap::new();
    for (m, delay) in delivery_messages_since(&w, sent_before) {
        assert_eq!((m.attempts, m.last_attempt), (0, None), "history unchanged");
        let start = m.rate_booked_at.expect("booked");
        assert_eq!(
            start - m.not_before,
            chrono::Duration::seconds(1),
            "due a second early"
        );
        *by_second.entry(delay.as_secs()).or_insert(0) += m.events.len();
    }
    assert_eq!(
        by_second,
        std::collections::BTreeMap::from([(2, 10), (3, 4)]),
        "starts 2.1-3.0 s and 3.1-3.4 s, due a second early, delays rounded up"
    );

    let mut delivered = first.report.delivered;
    for (advance, expected) in [(2, 10), (1, 4)] {
        w.clock.advance(Duration::from_secs(advance));
        let before = sent_at.lock().unwrap().len();
        let next = w.run().await;
        assert_eq!(
            (next.report.delivered, next.report.throttled),
            (expected, 0),
            "{:?}",
            next.report
        );
        assert!(spaced(before));
        delivered += next.report.delivered;
    }
    assert_eq!(delivered, 35);
    assert_eq!(w.sender.requests().len(), 35, "one attempt per event");
    let sub = w.stored("sub-1").await;
    let key = format!("{}/{}/{}", sub.topic, sub.name, sub.id);
    assert_eq!(
        w.caps.booked_until(&key),
        Some(t0() + chrono::Duration::milliseconds(3_500)),
        "booked once each"
    );
}

/// A batch held for its booking that comes back long after its start (the queue or the worker
/// was slow) goes without booking again: booking again would waste its share, and under a
/// backlog that keeps every batch late it would push the schedule on while nothing goes.
#[tokio::test]
async fn a_booking_long_past_goes_without_booking_again() {
    let mut w = World::new(ScriptedSender::status(200));
    w.deliver.settings.cap_wait = Duration::ZERO;
    w.subscribe(capped("sub-1", None, Some(1))).await;
    w.publish(&["a", "b"]).await;
    let first = w.run().await;
    assert_eq!((first.report.delivered, first.report.throttled), (1, 1));
    let sub = w.stored("sub-1").await;
    let key = format!("{}/{}/{}", sub.topic, sub.name, sub.id);
    let booked = Some(t0() + chrono::Duration::seconds(2));
    assert_eq!(w.caps.booked_until(&key), booked);
    // Back 5 s late: sent on its old booking; the schedule is where it was.
    w.clock.advance(Duration::from_secs(6));
    let late = w.run().await;
    assert_eq!((late.report.delivered, late.report.throttled), (1, 0));
    assert_eq!(w.caps.booked_until(&key), booked);
}

/// A batch never holds more events than one second allows, so batching and the cap agree:
/// `--max-events-per-batch 100` with 5 per second sends batches of 5.
#[tokio::test]
async fn batches_hold_no_more_events_than_a_second_allows_b2() {
    let mut w = World::new(ScriptedSender::status(200));
    w.deliver.settings.cap_wait = Duration::ZERO;
    w.subscribe(SubscriptionRequest {
        max_events_per_batch: Some(100),
        ..capped("sub-1", None, Some(5))
    })
    .await;
    w.publish_numbered("e", 12).await;
    let outcome = w.run().await;
    assert_eq!(outcome.report.attempts, 1);
    assert_eq!(outcome.report.delivered, 5);
    assert_eq!(outcome.report.throttled, 7);
    let body = &w.sender.requests()[0].body;
    let events: Vec<serde_json::Value> = serde_json::from_str(body).unwrap();
    assert_eq!(events.len(), 5);
}

/// Faults: a worker that died holding a slot blocks it only until its lease ends; while the
/// cap store cannot be reached, batches of a capped subscription are held (a second later, no
/// attempt, nothing lost) and delivered once it is back. Uncapped subscriptions never ask it.
#[tokio::test]
async fn a_dead_holder_and_an_unreachable_cap_store_hold_events_without_loss() {
    let mut w = World::new(ScriptedSender::status(200));
    w.deliver.settings.cap_wait = Duration::ZERO;
    w.subscribe(capped("sub-1", Some(1), None)).await;
    w.subscribe(request("free")).await;
    let sub = w.stored("sub-1").await;
    let key = format!("{}/{}/{}", sub.topic, sub.name, sub.id);
    // A worker took the only slot for 40 s and died.
    let now = w.clock.now();
    w.caps
        .acquire_slot(&key, 1, now, now + chrono::Duration::seconds(40))
        .await
        .unwrap()
        .expect("a free slot");
    w.publish(&["a"]).await;
    let outcome = w.run().await;
    assert_eq!(outcome.report.attempts, 1, "only the uncapped one");
    assert_eq!(outcome.report.throttled, 1);
    assert!(outcome.failed_message_ids.is_empty());
    w.clock.advance(Duration::from_secs(1));
    assert_eq!(w.run().await.report.throttled, 1, "the lease still holds");
    w.clock.advance(Duration::from_secs(40));
    let outcome = w.run().await;
    assert_eq!((outcome.report.delivered, outcome.report.throttled), (1, 0));

    w.caps.outage.set(true);
    w.publish(&["b"]).await;
    let outcome = w.run().await;
    assert_eq!(outcome.report.attempts, 1, "the uncapped one goes");
    assert_eq!(outcome.report.throttled, 1);
    assert!(outcome.failed_message_ids.is_empty());
    w.caps.outage.set(false);
    w.clock.advance(Duration::from_secs(1));
    let outcome = w.run().await;
    assert_eq!((outcome.report.delivered, outcome.report.attempts), (1, 1));
    assert!(
        w.sender
            .requests()
            .iter()
            .all(|r| header(r, "aeg-delivery-count") == Some("0"))
    );
}

/// R4 with a cap: a timed-out request kept open for its late answer keeps its subscription's
/// slot until it is closed, so with `--max-concurrent-requests 1` nothing else is sent to the
/// subscription meanwhile; once the invocation stops waiting for the answer (closing the
/// request), the slot is free again.
#[tokio::test(start_paused = true)]
async fn a_request_open_for_its_late_answer_keeps_its_slot_r4() {
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    let w = World::new(ScriptedSender::new(move |_| {
        if count.fetch_add(1, Ordering::SeqCst) == 0 {
            AttemptResult::TimedOut
        } else {
            AttemptResult::Status(200)
        }
    }));
    w.sender.keep_timed_out_requests_open();
    w.subscribe(capped("sub-1", Some(1), None)).await;
    w.publish(&["a", "b"]).await;
    let sub = w.stored("sub-1").await;
    let key = format!("{}/{}/{}", sub.topic, sub.name, sub.id);

    let outcome = w.run().await;
    assert_eq!(outcome.report.attempts, 1, "{:?}", outcome.report);
    assert_eq!(outcome.report.retried, 1);
    assert_eq!(outcome.report.throttled, 1, "the slot stayed taken");
    // The late answer was given up at the end of the wait: the request is closed, and its
    // slot given back.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(w.caps.slots_held(&key), 0);
    w.clock.advance(Duration::from_secs(1));
    let next = w.run().await;
    assert_eq!(next.report.delivered, 1, "{:?}", next.report);
}

/// #11 item 12: `update` with a new endpoint runs the handshake again, and nothing is lost or
/// sent to an endpoint that did not agree. While the new endpoint is asked, events go on to
/// the validated one; a new endpoint that refuses changes nothing (the change stays beside the
/// subscription, saying why); one that agrees takes over. Other settings change at once.
#[tokio::test]
async fn an_endpoint_change_is_validated_before_it_receives_anything() {
    let w = World::new(ScriptedSender::status(200));
    w.sender.on_handshake(|asked| {
        if asked.endpoint.ends_with("/refuses") {
            Ok(HandshakeReply {
                status: 403,
                headers: vec![],
                body: vec![],
            })
        } else {
            Ok(ScriptedSender::answer_with_code(asked))
        }
    });
    w.subscribe(request("sub-1")).await;
    let old = "http://127.0.0.1:9/sub-1";
    let update = |endpoint: &str| SubscriptionUpdate {
        endpoint: Some(endpoint.into()),
        max_events_per_batch: Some(5),
        labels: Some(vec!["team:payments".into()]),
        ..SubscriptionUpdate::default()
    };
    let updated = registry(&w.store, &w.secrets, &w.delivery)
        .update(
            TOPIC,
            "sub-1",
            &update("http://127.0.0.1:9/refuses"),
            w.clock.now(),
        )
        .await
        .expect("updated")
        .subscription;
    assert_eq!(
        updated.endpoint, old,
        "the validated endpoint stays until the new one agrees"
    );
    assert_eq!(
        updated.batching.max_events_per_batch, 5,
        "other settings at once"
    );
    assert_eq!(updated.labels, ["team:payments"]);
    let change = updated.endpoint_change.as_ref().expect("a change waits");
    assert_eq!(change.provisioning.state, ProvisioningState::Creating);

    w.publish(&["a"]).await;
    w.run().await;
    let stored = w.stored("sub-1").await;
    assert_eq!(stored.endpoint, old);
    assert!(stored.delivers());
    let change = stored
        .endpoint_change
        .as_ref()
        .expect("the failed change stays");
    assert_eq!(change.provisioning.state, ProvisioningState::Failed);
    assert!(
        change
            .provisioning
            .detail
            .as_deref()
            .unwrap_or_default()
            .contains("403"),
        "{change:?}"
    );
    let sent: Vec<String> = w
        .sender
        .requests()
        .iter()
        .map(|r| r.endpoint.clone())
        .collect();
    assert_eq!(sent, [old], "the event went to the validated endpoint only");

    registry(&w.store, &w.secrets, &w.delivery)
        .update(
            TOPIC,
            "sub-1",
            &update("http://127.0.0.1:9/agrees"),
            w.clock.now(),
        )
        .await
        .expect("updated");
    w.run().await;
    let stored = w.stored("sub-1").await;
    assert_eq!(stored.endpoint, "http://127.0.0.1:9/agrees");
    assert_eq!(stored.endpoint_change, None);
    assert_eq!(stored.provisioning.state, ProvisioningState::Succeeded);
    w.publish(&["b"]).await;
    w.run().await;
    let last = w.sender.requests().pop().expect("a request");
    assert_eq!(last.endpoint, "http://127.0.0.1:9/agrees");
    assert!(last.body.contains("\"b\""));
}

/// #11 item 12, H1: a dynamic delivery attribute takes its value from each event's field; a
/// batch gets it when every event has the same value.
#[tokio::test]
async fn dynamic_delivery_attributes_take_the_events_field_h1() {
    let w = World::new(ScriptedSender::status(200));
    let dynamic = |words: &[&str]| {
        DeliveryAttributeRequest::parse(&words.iter().map(|w| w.to_string()).collect::<Vec<_>>())
            .unwrap()
    };
    w.subscribe(SubscriptionRequest {
        delivery_attributes: vec![
            dynamic(&["X-Event-Id", "dynamic", "id"]),
            dynamic(&["X-Pad", "dynamic", "data.pad"]),
            dynamic(&["X-Missing", "dynamic", "data.nothing"]),
        ],
        ..request("sub-1")
    })
    .await;
    w.publish(&["a"]).await;
    w.run().await;
    let r = w.sender.requests().pop().expect("a request");
    assert_eq!(header(&r, "X-Event-Id"), Some("a"));
    assert_eq!(header(&r, "X-Pad"), Some(""));
    assert_eq!(header(&r, "X-Missing"), None);
}

/// #11 item 12: at its expiration time a subscription stops receiving (events published from
/// then on are not enqueued for it, and those already queued are dropped as for a deleted
/// one), and the service deletes it with its secrets, unless it was given a later expiration
/// meanwhile.
#[tokio::test]
async fn an_expired_subscription_receives_nothing_and_is_deleted() {
    let w = World::new(ScriptedSender::status(200));
    let at = w.clock.now() + chrono::Duration::hours(2);
    w.subscribe(SubscriptionRequest {
        expiration_time_utc: Some(at),
        delivery_attributes: vec![DeliveryAttributeRequest {
            name: "Authorization".into(),
            value: "Bearer s3cret".into(),
            is_secret: true,
            dynamic: false,
        }],
        ..request("sub-1")
    })
    .await;
    let secret_id = w.stored("sub-1").await.delivery_attribute_mappings[0]
        .secret_id
        .clone()
        .expect("a secret");
    w.publish(&["before"]).await;
    w.run().await;
    assert_eq!(w.sender.requests().len(), 1);

    // Queued before the expiration, attempted after it: dropped.
    w.publish(&["queued"]).await;
    w.clock.advance(Duration::from_secs(2 * 3600));
    let outcome = w.run().await;
    assert_eq!(outcome.report.dropped, 1, "{:?}", outcome.report);
    let sent = w.delivery.sent().len();
    w.publish(&["after"]).await;
    assert_eq!(
        w.delivery.sent().len(),
        sent,
        "fan-out enqueues nothing for an expired subscription"
    );
    assert_eq!(w.sender.requests().len(), 1, "nothing after the expiration");
    // The expiry step has been asking again every 15 minutes; it deletes now.
    for _ in 0..10 {
        if w.store
            .get_subscription(TOPIC, "sub-1")
            .await
            .unwrap()
            .is_none()
        {
            break;
        }
        w.run_next().await;
    }
    assert!(
        w.store
            .get_subscription(TOPIC, "sub-1")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        w.secrets.get(&secret_id).await.is_err(),
        "its secret is deleted too"
    );
}

/// #11 item 12: an expiration moved later before it comes keeps the subscription; the step
/// of the earlier one does not delete it, and ends (one step waits, the later one's).
#[tokio::test]
async fn a_later_expiration_keeps_the_subscription() {
    let w = World::new(ScriptedSender::status(200));
    let first = w.clock.now() + chrono::Duration::minutes(30);
    w.subscribe(SubscriptionRequest {
        expiration_time_utc: Some(first),
        ..request("sub-1")
    })
    .await;
    let later = w.clock.now() + chrono::Duration::days(2);
    registry(&w.store, &w.secrets, &w.delivery)
        .update(
            TOPIC,
            "sub-1",
            &SubscriptionUpdate {
                expiration_time_utc: Some(Some(later)),
                ..SubscriptionUpdate::default()
            },
            w.clock.now(),
        )
        .await
        .expect("updated");
    assert_eq!(w.delivery.len(), 2, "two expiry steps");
    for _ in 0..4 {
        w.run_next().await;
    }
    assert!(w.clock.now() > first);
    assert_eq!(w.delivery.len(), 1, "the earlier expiration's step ended");
    let stored = w.stored("sub-1").await;
    assert_eq!(stored.expiration_time_utc, Some(later));
    w.publish(&["a"]).await;
    w.run().await;
    assert_eq!(w.sender.requests().len(), 1, "still receiving");
}

/// #11 item 12: a handshake's answer settles only the endpoint it asked. An endpoint change
/// replaced by another (a second update) during the first one's round trip is not validated
/// by the first endpoint's answer; the second endpoint is asked itself, and only its answer
/// makes it the subscription's.
#[tokio::test]
async fn an_answer_never_validates_an_endpoint_it_did_not_come_from() {
    let w = World::new(ScriptedSender::status(200));
    w.subscribe(request("sub-1")).await;
    let (store, secrets, delivery, clock) = (
        w.store.clone(),
        w.secrets.clone(),
        w.delivery.clone(),
        w.clock.clone(),
    );
    let asked = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = asked.clone();
    w.sender.on_handshake(move |request| {
        seen.lock().unwrap().push(request.endpoint.clone());
        if request.endpoint.ends_with("/first") {
            // During the round trip, the user changes the endpoint again.
            futures::executor::block_on(async {
                registry(&store, &secrets, &delivery)
                    .update(
                        TOPIC,
                        "sub-1",
                        &SubscriptionUpdate {
                            endpoint: Some("http://127.0.0.1:9/second".into()),
                            ..SubscriptionUpdate::default()
                        },
                        clock.now(),
                    )
                    .await
                    .unwrap();
            });
        }
        Ok(ScriptedSender::answer_with_code(request))
    });
    registry(&w.store, &w.secrets, &w.delivery)
        .update(
            TOPIC,
            "sub-1",
            &SubscriptionUpdate {
                endpoint: Some("http://127.0.0.1:9/first".into()),
                ..SubscriptionUpdate::default()
            },
            w.clock.now(),
        )
        .await
        .unwrap();
    w.run().await;
    let stored = w.stored("sub-1").await;
    assert_eq!(stored.endpoint, "http://127.0.0.1:9/sub-1");
    let change = stored.endpoint_change.expect("the second change waits");
    assert_eq!(change.endpoint, "http://127.0.0.1:9/second");
    assert_ne!(
        change.provisioning.state,
        ProvisioningState::Succeeded,
        "validated by the first endpoint's answer"
    );
    w.run().await;
    let stored = w.stored("sub-1").await;
    assert_eq!(stored.endpoint, "http://127.0.0.1:9/second");
    assert_eq!(
        *asked.lock().unwrap(),
        ["http://127.0.0.1:9/first", "http://127.0.0.1:9/second"]
    );
}

/// #11 item 12: `update` of delivery headers stores new secret values under names of its own:
/// a secret still named is kept, one no longer named is deleted, and an update refused
/// because the record changed meanwhile changes no secret the subscription sends.
#[tokio::test]
async fn an_update_replaces_header_secrets_without_touching_live_ones() {
    let w = World::new(ScriptedSender::status(200));
    let secret = |name: &str, value: &str| DeliveryAttributeRequest {
        name: name.into(),
        value: value.into(),
        is_secret: true,
        dynamic: false,
    };
    w.subscribe(SubscriptionRequest {
        delivery_attributes: vec![secret("Authorization", "Bearer one")],
        ..request("sub-1")
    })
    .await;
    let first_id = w.stored("sub-1").await.delivery_attribute_mappings[0]
        .secret_id
        .clone()
        .unwrap();
    let headers = |value: &str| SubscriptionUpdate {
        delivery_attributes: Some(vec![secret("Authorization", value)]),
        ..SubscriptionUpdate::default()
    };

    // Refused: another writer changed the record between the read and the write.
    let (store, clock) = (w.store.clone(), w.clock.clone());
    w.store.before_replace(move || {
        futures::executor::block_on(async {
            let mut s = store
                .get_subscription(TOPIC, "sub-1")
                .await
                .unwrap()
                .unwrap();
            s.labels = vec![format!("raced at {}", clock.now())];
            store.replace_subscription(&mut s).await.unwrap();
        })
    });
    let refused = registry(&w.store, &w.secrets, &w.delivery)
        .update(TOPIC, "sub-1", &headers("Bearer refused"), w.clock.now())
        .await;
    assert!(refused.is_err());
    assert_eq!(
        w.secrets.get(&first_id).await.unwrap().expose(),
        "Bearer one"
    );
    assert_eq!(
        w.secrets.len(),
        1,
        "the refused update's secret is deleted again"
    );

    let updated = registry(&w.store, &w.secrets, &w.delivery)
        .update(TOPIC, "sub-1", &headers("Bearer two"), w.clock.now())
        .await
        .unwrap()
        .subscription;
    let second_id = updated.delivery_attribute_mappings[0]
        .secret_id
        .clone()
        .unwrap();
    assert_ne!(second_id, first_id);
    assert_eq!(
        w.secrets.get(&second_id).await.unwrap().expose(),
        "Bearer two"
    );
    assert!(
        w.secrets.get(&first_id).await.is_err(),
        "no longer named: deleted"
    );
    w.publish(&["a"]).await;
    w.run().await;
    let r = w.sender.requests().pop().unwrap();
    assert_eq!(header(&r, "Authorization"), Some("Bearer two"));

    // Headers not given: the secret stays.
    registry(&w.store, &w.secrets, &w.delivery)
        .update(
            TOPIC,
            "sub-1",
            &SubscriptionUpdate {
                max_events_per_batch: Some(2),
                ..SubscriptionUpdate::default()
            },
            w.clock.now(),
        )
        .await
        .unwrap();
    assert!(w.secrets.get(&second_id).await.is_ok());
}

/// #11 item 14, D1: each endpoint's health record keeps its last failure (when, the outcome,
/// the status) for `show`, and keeps it after a success clears the failures; a record with
/// only a last failure is healthy and delays nothing.
#[tokio::test]
async fn the_last_failure_is_kept_for_show_after_the_endpoint_recovers_d1() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let w = World::new(ScriptedSender::new(move |_| {
        match seen.fetch_add(1, Ordering::SeqCst) {
            0 => AttemptResult::Status(503),
            _ => AttemptResult::Status(200),
        }
    }));
    w.subscribe(request("sub-1")).await;
    let endpoint = w.stored("sub-1").await.endpoint;
    w.publish(&["a"]).await;
    let failed_at = w.clock.now();
    w.run().await;
    let health = w.state.endpoint_health(&endpoint).await.unwrap().value;
    assert_eq!(health.consecutive_failures, 1);
    let last = health.last_failure.expect("recorded");
    assert_eq!(
        (last.at, last.outcome, last.status),
        (
            failed_at,
            gridrelay_shared::classify::DeliveryOutcome::Busy,
            Some(503)
        )
    );

    w.clock.advance(Duration::from_secs(30));
    assert_eq!(w.run().await.report.delivered, 1);
    let health = w.state.endpoint_health(&endpoint).await.unwrap().value;
    assert!(health.is_healthy());
    assert_eq!(health.last_failure, Some(last), "kept after the success");
    w.publish(&["b"]).await;
    assert_eq!(w.run().await.report.delivered, 1, "nothing delayed");
}

/// #11 item 12: a warm function that kept a subscription whose expiration has since been moved
/// later reads it again before dropping its events (which cannot be undone): they are
/// delivered.
#[tokio::test]
async fn a_kept_record_past_its_old_expiration_is_read_again() {
    let mut w = World::new(ScriptedSender::status(200));
    w.keep_subscriptions_for(Duration::from_secs(4 * 3600));
    let first = w.clock.now() + chrono::Duration::hours(1);
    w.subscribe(SubscriptionRequest {
        expiration_time_utc: Some(first),
        ..request("sub-1")
    })
    .await;
    w.publish(&["a"]).await;
    w.run().await;
    registry(&w.store, &w.secrets, &w.delivery)
        .update(
            TOPIC,
            "sub-1",
            &SubscriptionUpdate {
                expiration_time_utc: Some(Some(first + chrono::Duration::hours(2))),
                ..SubscriptionUpdate::default()
            },
            w.clock.now(),
        )
        .await
        .unwrap();
    w.publish(&["b"]).await;
    w.clock.advance(Duration::from_secs(3601));
    let outcome = w.run().await;
    assert_eq!(outcome.report.dropped, 0, "{:?}", outcome.report);
    assert!(w.sender.requests().iter().any(|r| r.body.contains("\"b\"")));
}

/// #11 item 12, H1: a warm function that kept a record naming a secret an update has replaced
/// and deleted reads the record again instead of charging the events a failed attempt.
#[tokio::test]
async fn a_kept_record_naming_a_replaced_secret_is_read_again_h1() {
    let mut w = World::new(ScriptedSender::status(200));
    w.keep_subscriptions_for(Duration::from_secs(600));
    let secret = |value: &str| DeliveryAttributeRequest {
        name: "Authorization".into(),
        value: value.into(),
        is_secret: true,
        dynamic: false,
    };
    w.subscribe(SubscriptionRequest {
        delivery_attributes: vec![secret("Bearer one")],
        ..request("sub-1")
    })
    .await;
    w.publish(&["a"]).await;
    w.run().await;
    registry(&w.store, &w.secrets, &w.delivery)
        .update(
            TOPIC,
            "sub-1",
            &SubscriptionUpdate {
                delivery_attributes: Some(vec![secret("Bearer two")]),
                ..SubscriptionUpdate::default()
            },
            w.clock.now(),
        )
        .await
        .unwrap();
    w.clock.advance(Duration::from_secs(2));
    w.publish(&["b"]).await;
    let outcome = w.run().await;
    assert_eq!(
        (outcome.report.delivered, outcome.report.failed_attempts),
        (1, 0),
        "{:?}",
        outcome.report
    );
    let r = w.sender.requests().pop().unwrap();
    assert_eq!(header(&r, "Authorization"), Some("Bearer two"));
}

/// #12: AWS resource destinations (S4), on in-memory ports.
mod resources {
    use super::*;
    use gridrelay_shared::classify::{AttemptResult, DeliveryOutcome};
    use gridrelay_shared::destination::{AllowedDestinations, ServiceFailure};

    const QUEUE: &str = "arn:aws:sqs:us-east-1:123456789012:orders";
    const TOPIC_ARN: &str = "arn:aws:sns:us-east-1:123456789012:orders";
    const FUNCTION: &str = "arn:aws:lambda:us-east-1:123456789012:function:orders";

    /// A world with a validated subscription `name` to `endpoint` (no handshake: a
    /// resource's is done at create), its destination existing.
    async fn world_with(request: SubscriptionRequest) -> World {
        let w = World::new(ScriptedSender::status(200));
        w.resources.create(&request.endpoint);
        w.store
            .create_topic(&Topic::with_new_keys(TOPIC, t0()))
            .await
            .unwrap();
        w.store.insert_validated(
            SubscriptionRequest {
                topic: TOPIC.into(),
                ..request
            },
            InputSchema::EventGridSchema,
            t0(),
        );
        w
    }

    fn to(endpoint: &str) -> SubscriptionRequest {
        SubscriptionRequest {
            name: "to-resource".into(),
            endpoint: endpoint.into(),
            ..SubscriptionRequest::default()
        }
    }

    /// The last delivery message sent.
    fn last_delivery_message(w: &World) -> DeliveryMessage {
        match DeliveryQueueMessage::from_body(&w.delivery.sent().last().unwrap().body).unwrap() {
            DeliveryQueueMessage::Delivery(m) => m,
            other => panic!("not a delivery message: {other:?}"),
        }
    }

    fn id_of(body: &str) -> String {
        serde_json::from_str::<serde_json::Value>(body).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// S4, B1: one message per event, its body the event itself (not an array) and its
    /// routing fields beside it; as many to a call as SQS takes (10), not one call each.
    #[tokio::test]
    async fn a_queue_gets_one_message_per_event_ten_to_a_call_s4() {
        let w = world_with(to(QUEUE)).await;
        w.publish_numbered("e", 25).await;
        let mut report = gridrelay_deliver::DeliveryReport::default();
        while !w.delivery.visible().is_empty() {
            report.add(&w.run().await.report);
        }
        assert_eq!(report.delivered, 25);
        assert_eq!(report.failed_attempts, 0);
        let calls = w.resources.calls();
        assert!(calls.iter().all(|c| c.entries.len() <= 10));
        assert_eq!(calls.iter().map(|c| c.entries.len()).sum::<usize>(), 25);
        assert!(calls.len() <= 4, "{} calls for 25 events", calls.len());
        assert_eq!(report.attempts, calls.len(), "one attempt per call");
        let taken = w.resources.taken(QUEUE);
        let first = &taken[0];
        assert!(first.body.starts_with('{'), "{}", first.body);
        assert_eq!(first.fields.event_type, "t");
        assert_eq!(first.fields.subject, "s");
        assert_eq!(first.fields.id, id_of(&first.body));
        assert_eq!(calls[0].subscription, "to-resource");
        assert_eq!(calls[0].delivery_count, 0);
    }

    /// B5, S4: in a call that partly fails, the events the service took are delivered and the
    /// others are a failed attempt, retried on the ladder and never counted delivered.
    #[tokio::test]
    async fn a_partly_failed_call_retries_only_the_events_that_failed_b5_s4() {
        let w = world_with(to(TOPIC_ARN)).await;
        let throttled = Arc::new(AtomicUsize::new(0));
        let counter = throttled.clone();
        w.resources.script(move |entry| {
            (entry.fields.id == "e1" && counter.fetch_add(1, Ordering::SeqCst) == 0)
                .then(|| AttemptResult::Service(ServiceFailure::of_code("Throttling", Some(400))))
        });
        w.publish_numbered("e", 5).await;
        let first = w.run().await.report;
        assert_eq!((first.attempts, first.delivered, first.retried), (1, 4, 1));
        assert_eq!(first.failed_attempts, 1);
        // D1: a destination that took most of a call is working, not failing.
        let health = w.state.endpoint_health(TOPIC_ARN).await.unwrap().value;
        assert_eq!(health.consecutive_failures, 0);
        assert!(health.last_failure.is_none());
        let retry = last_delivery_message(&w);
        assert_eq!(retry.events.len(), 1);
        assert_eq!(id_of(retry.events[0].event.get()), "e1");
        assert_eq!(retry.history().attempts, 1);
        assert_eq!(
            retry.history().last_attempt.map(|a| a.outcome),
            Some(DeliveryOutcome::Busy)
        );
        let second = w.run_next().await.report;
        assert_eq!(second.delivered, 1);
        let mut ids: Vec<String> = w
            .resources
            .taken(TOPIC_ARN)
            .iter()
            .map(|e| e.fields.id.clone())
            .collect();
        ids.sort();
        assert_eq!(ids, ["e0", "e1", "e2", "e3", "e4"]);
        assert_eq!(w.resources.calls().last().unwrap().delivery_count, 1);
    }

    /// S4: a call of several entries refused as a whole as too large (a queue whose messages
    /// are smaller than the service's largest) is made again in halves, one after the other,
    /// so the events that fit are delivered and only the one that does not is dead-lettered.
    #[tokio::test]
    async fn a_call_refused_as_too_large_is_made_again_in_halves_s4() {
        let w = world_with(SubscriptionRequest {
            dead_letter_destination: Some("s3://dead/orders".into()),
            ..to(QUEUE)
        })
        .await;
        w.resources.script_call(|call| {
            let too_big = call.entries.iter().any(|e| e.body.len() > 2000);
            (call.entries.len() > 1 || too_big).then(|| {
                AttemptResult::Service(ServiceFailure::of_code(
                    "AWS.SimpleQueueService.BatchRequestTooLong",
                    Some(400),
                ))
            })
        });
        w.publish(&["a", "b"]).await;
        w.publish_sized(&["big"], 4000).await;
        let mut report = gridrelay_deliver::DeliveryReport::default();
        while !w.delivery.visible().is_empty() {
            report.add(&w.run().await.report);
        }
        assert_eq!((report.delivered, report.dead_lettered), (2, 1));
        let entry = &w.dead_letters()[0].entries[0];
        assert_eq!(id_of(entry.event.get()), "big");
        assert_eq!(entry.last_outcome, Some(DeliveryOutcome::PayloadTooLarge));
        let calls = w.resources.calls();
        let singles = calls.iter().filter(|c| c.entries.len() == 1).count();
        assert!(singles >= 2, "each entry sent again alone");
        assert!(
            calls.len() <= 6,
            "halves, not a call per entry and more: {}",
            calls.len()
        );
    }

    /// S2: a call that does not answer within the attempt timeout is a timed-out attempt of
    /// every event in it, retried; the invocation does not wait for it past its deadline.
    #[tokio::test(start_paused = true)]
    async fn a_call_that_hangs_times_out_and_is_retried_s2() {
        let w = world_with(to(QUEUE)).await;
        w.resources.hang(true);
        w.publish(&["a", "b"]).await;
        // (Without the call's own timeout, this one would end the test as a failure.)
        let report = tokio::time::timeout(Duration::from_secs(600), w.run())
            .await
            .expect("the invocation ended: the hung call timed out")
            .report;
        assert_eq!((report.delivered, report.retried), (0, 2));
        let retry = last_delivery_message(&w);
        assert_eq!(
            retry.history().last_attempt.map(|a| a.outcome),
            Some(DeliveryOutcome::TimedOut)
        );
        w.resources.hang(false);
        assert_eq!(w.run_next().await.report.delivered, 2);
    }

    /// `--max-events-per-second` bounds a call as it bounds a webhook batch: no more events in
    /// one go than a second's allowance.
    #[tokio::test]
    async fn calls_hold_no_more_than_a_seconds_allowance() {
        let w = world_with(SubscriptionRequest {
            max_events_per_second: Some(3),
            ..to(QUEUE)
        })
        .await;
        w.publish_numbered("e", 7).await;
        w.run().await;
        let calls = w.resources.calls();
        assert!(!calls.is_empty());
        assert!(
            calls.iter().all(|c| c.entries.len() <= 3),
            "{:?}",
            calls.iter().map(|c| c.entries.len()).collect::<Vec<_>>()
        );
    }

    /// S4, L2, L6: a destination that does not exist (404) is retried, then dead-lettered
    /// when the attempts run out, with `NotFound`.
    #[tokio::test]
    async fn a_missing_destination_is_retried_then_dead_lettered_s4() {
        let w = world_with(SubscriptionRequest {
            max_delivery_attempts: Some(2),
            dead_letter_destination: Some("s3://dead/orders".into()),
            ..to(QUEUE)
        })
        .await;
        w.resources.delete(QUEUE);
        w.publish(&["a"]).await;
        let first = w.run().await.report;
        assert_eq!((first.retried, first.dead_lettered), (1, 0));
        let second = w.run_next().await.report;
        assert_eq!(second.dead_lettered, 1);
        let dead = w.dead_letters();
        let entry = &dead[0].entries[0];
        assert_eq!(entry.delivery_attempts, 2);
        assert_eq!(entry.last_outcome, Some(DeliveryOutcome::NotFound));
    }

    /// S4, B3: an event larger than one message of the service is not sent; it is a failed
    /// attempt of its own (413, not retried: dead-lettered at once), and the events around it
    /// are delivered.
    #[tokio::test]
    async fn an_event_too_large_for_the_service_is_dead_lettered_at_once_s4() {
        let w = world_with(SubscriptionRequest {
            dead_letter_destination: Some("s3://dead/orders".into()),
            ..to(TOPIC_ARN)
        })
        .await;
        // Alone in its invocation first: no request is made for it, and its endpoint is not
        // marked failing.
        w.publish_sized(&["big"], 300 * 1024).await;
        let alone = w.run().await.report;
        assert_eq!(
            (alone.attempts, alone.failed_attempts, alone.dead_lettered),
            (0, 0, 1)
        );
        assert!(w.resources.calls().is_empty());
        let health = w.state.endpoint_health(TOPIC_ARN).await.unwrap().value;
        assert_eq!(health.consecutive_failures, 0);
        assert!(health.last_failure.is_none());
        w.publish(&["small"]).await;
        let mut report = alone;
        while !w.delivery.visible().is_empty() {
            report.add(&w.run().await.report);
        }
        assert_eq!((report.delivered, report.dead_lettered), (1, 1));
        let taken = w.resources.taken(TOPIC_ARN);
        assert_eq!(taken.len(), 1);
        assert!(
            w.resources
                .calls()
                .iter()
                .all(|c| c.entries.iter().all(|e| e.body.len() < 256 * 1024)),
            "the large event was never sent"
        );
        let entry = &w.dead_letters()[0].entries[0];
        assert_eq!(entry.last_outcome, Some(DeliveryOutcome::PayloadTooLarge));
        assert_eq!(entry.delivery_attempts, 1);
        assert_eq!(report.attempts, w.resources.calls().len());
        assert_eq!(report.failed_attempts, 0);
    }

    /// A Lambda function takes a batch (B2) as one payload: the events as a JSON array.
    #[tokio::test]
    async fn a_function_gets_the_batch_as_one_payload_b2() {
        let w = world_with(SubscriptionRequest {
            max_events_per_batch: Some(10),
            ..to(FUNCTION)
        })
        .await;
        w.publish_numbered("e", 5).await;
        let report = w.run().await.report;
        assert_eq!((report.attempts, report.delivered), (1, 5));
        let calls = w.resources.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].entries.len(), 1);
        let payload: Vec<serde_json::Value> =
            serde_json::from_str(&calls[0].entries[0].body).unwrap();
        assert_eq!(payload.len(), 5);
    }

    /// S4: a destination the installation does not allow is never written to: a failed
    /// attempt (403 `Forbidden`, retried under the newest revision), without a call.
    #[tokio::test]
    async fn a_destination_outside_the_allowed_set_is_not_written_s4() {
        never_written(AllowedDestinations::parse("arn:aws:sqs:*:123456789012:other-*").unwrap())
            .await;
    }

    /// #34 item 2, S4: a subscription stored with one of the installation's own queues as its
    /// destination (as a version that did not refuse it could have stored) is never written to,
    /// though every destination is allowed: the same failed attempt (403), without a call.
    /// Events written there would be read as gridrelay's own messages.
    #[tokio::test]
    async fn the_installations_own_queue_is_never_written_s4() {
        never_written(AllowedDestinations::any().refusing_own_queues([QUEUE])).await;
    }

    /// An event for a subscription to [`QUEUE`], under `destinations`, is attempted without a
    /// call: 403 `Forbidden`, retried.
    async fn never_written(destinations: AllowedDestinations) {
        let mut w = world_with(to(QUEUE)).await;
        w.deliver.settings.destinations = destinations;
        w.publish(&["a"]).await;
        let report = w.run().await.report;
        assert_eq!((report.delivered, report.retried), (0, 1));
        assert!(w.resources.calls().is_empty());
        let retry = last_delivery_message(&w);
        assert_eq!(
            retry.history().last_attempt.map(|a| a.outcome),
            Some(DeliveryOutcome::Forbidden)
        );
    }
}

/// Issue #34 item 6: an endpoint's credentials (`user:pass@`) and query (`?code=`) reach no
/// log line, even where a health update gives up after losing every race: its error named the
/// endpoint as it is. Every log line of the run is captured, at every level.
#[tokio::test]
async fn an_endpoints_credentials_reach_no_log_line_under_contention() {
    let logs = CapturedLogs::start();
    let w = World::new(ScriptedSender::status(500));
    w.state.contended.set(true);
    w.subscribe(SubscriptionRequest {
        endpoint: "http://gridrelay-user:s3cretpass@127.0.0.1:9/hook?code=s3cretcode".into(),
        ..request("sub-1")
    })
    .await;
    w.publish(&["a"]).await;
    assert_eq!(w.run().await.report.failed_attempts, 1);

    let text = logs.text();
    assert!(
        text.contains("could not record endpoint health"),
        "the contended update gave up and said so: {text}"
    );
    assert!(
        !text.contains("s3cret"),
        "a secret reached a log line: {text}"
    );
}

/// #37 item 4: every log line of an invocation runs in its `deliver` span, and every line about
/// one subscription's events in a span that carries the topic and the subscription (an
/// attempt's, its attempt number too), so no line repeats them by hand and none lacks them.
/// The run: a subscription whose endpoint cannot be connected to (the attempt's warning), one
/// whose endpoint refuses the event (400) without a dead-letter location (the drop), and one
/// deleted before its events came (the drop on arrival).
#[tokio::test]
async fn every_log_line_names_its_subscription_through_its_spans() {
    let logs = CapturedLogs::start();
    let w = World::new(ScriptedSender::new(|r| {
        if r.endpoint.ends_with("sub-1") {
            AttemptResult::ConnectionFailed("connection refused".into())
        } else {
            AttemptResult::Status(400)
        }
    }));
    for name in ["sub-1", "sub-2", "sub-3"] {
        w.subscribe(request(name)).await;
    }
    w.publish(&["a"]).await;
    w.store.delete_subscription(TOPIC, "sub-2").await.unwrap();
    let report = w.run().await.report;
    assert_eq!((report.retried, report.dropped), (1, 2));

    let lines = logs.json_lines();
    let with_message = |m: &str| {
        lines
            .iter()
            .find(|l| l["fields"]["message"] == m)
            .unwrap_or_else(|| panic!("no line says {m:?}: {lines:#?}"))
    };
    // The field `name` has in the innermost span of `line` that has it.
    let from_spans = |line: &serde_json::Value, name: &str| {
        line["spans"]
            .as_array()
            .into_iter()
            .flatten()
            .rev()
            .find_map(|span| span.get(name).cloned())
    };
    for (message, subscription) in [
        ("delivery attempt could not connect", "sub-1"),
        ("event dropped: no dead-letter destination", "sub-3"),
        (
            "events dropped: not for a subscription that receives events",
            "sub-2",
        ),
    ] {
        let line = with_message(message);
        assert_eq!(from_spans(line, "topic"), Some(TOPIC.into()), "{line}");
        assert_eq!(
            from_spans(line, "subscription"),
            Some(subscription.into()),
            "{line}"
        );
    }
    let attempt = with_message("delivery attempt could not connect");
    assert_eq!(from_spans(attempt, "attempt"), Some(1.into()), "{attempt}");
    for line in &lines {
        let spans: Vec<&str> = line["spans"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["name"].as_str())
            .collect();
        assert_eq!(
            spans.first(),
            Some(&"deliver"),
            "outside the invocation's span: {line}"
        );
        for repeated in ["topic", "subscription"] {
            assert!(
                line["fields"].get(repeated).is_none(),
                "{repeated} repeated by hand: {line}"
            );
        }
    }
}

/// #34 item 12: a failed record's wait is shortened on the queue it came from, told by its
/// source (`eventSourceArn` names the control queue): a message received from the control queue
/// that cannot be read comes back from the control queue after its short wait, not after the
/// whole visibility timeout. (Told by kind, it was taken for a delivery and its wait was asked
/// of the delivery queue, which refused the receipt.)
#[tokio::test]
async fn a_failed_record_comes_back_early_from_the_queue_it_came_from() {
    let w = World::new(ScriptedSender::status(200));
    let control = Arc::new(MemoryQueue::new(w.clock.clone()));
    let deliver = Deliver::new(
        DeliverPorts {
            control_queue: control.clone(),
            ..w.deliver.ports.clone()
        },
        w.sender.clone(),
        DeliverySettings {
            control_queue_name: Some("t-control".to_string()),
            ..DeliverySettings::new(TimeScale::REAL)
        },
    );
    control
        .send_all(&[OutgoingMessage {
            body: "not a message".to_string(),
            delay: Duration::ZERO,
            group: None,
        }])
        .await;
    let received = control.receive(10, Duration::from_secs(1800));
    let mut event = sqs_event(&received);
    event.records[0].event_source_arn =
        Some("arn:aws:sqs:us-east-1:123456789012:t-control".to_string());

    let outcome = deliver.handle(event).await;

    assert_eq!(outcome.failed_message_ids.len(), 1);
    let back_at = control
        .next_visible_at()
        .expect("still on the control queue");
    assert!(
        back_at < t0() + chrono::Duration::minutes(5),
        "back at {back_at}, not after its short wait"
    );
}

/// #35: each invocation journals what it did: the first attempt also says the event was
/// published and fanned out; each attempt its number, status, outcome and what came next (a
/// retry due 30 s on for a 503, R1), so the event's life reads back in order and stands
/// delivered.
#[tokio::test]
async fn each_attempt_is_journaled_with_what_came_next_r1_s5() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let w = World::new(ScriptedSender::new(move |_| {
        match seen.fetch_add(1, Ordering::SeqCst) {
            0 => AttemptResult::Status(500),
            1 => AttemptResult::Status(503),
            _ => AttemptResult::Status(200),
        }
    }));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a"]).await;
    w.run().await;
    w.run_next().await;
    w.run_next().await;

    let entries = w.journal.entries();
    let life = EventLife::of(TOPIC, "a", &entries);
    assert_eq!(life.subscriptions.len(), 1);
    let sub = &life.subscriptions[0];
    assert_eq!(sub.subscription, "sub-1");
    assert!(
        matches!(sub.steps[0].step, Step::Fanned { .. }),
        "{:?}",
        sub.steps
    );
    let attempts: Vec<(u32, Option<u16>, DeliveryOutcome, &Next)> = sub.steps[1..]
        .iter()
        .map(|e| match &e.step {
            Step::Attempt(a) => (a.attempt, a.status, a.outcome, &a.next),
            other => panic!("not an attempt: {other:?}"),
        })
        .collect();
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    assert_eq!(
        attempts.iter().map(|a| (a.0, a.1)).collect::<Vec<_>>(),
        [(1, Some(500)), (2, Some(503)), (3, Some(200))]
    );
    assert_eq!(attempts[1].2, DeliveryOutcome::Busy);
    let Next::Retry { due } = attempts[1].3 else {
        panic!("a 503 is retried: {:?}", attempts[1].3)
    };
    assert_eq!(
        *due - sub.steps[2].time,
        chrono::Duration::seconds(30),
        "R1, S5"
    );
    assert!(matches!(sub.standing, Standing::Delivered { .. }));
    assert!(
        entries.iter().all(|e| e.ids == ["a"]),
        "only the event's own entries"
    );
}

/// #35: an event sent again while its publish's delivery still retries: every step of the
/// second delivery (its retries too) names it, so each delivery stands on its own steps. While
/// both retry, each is due for its own retry; then both are delivered.
#[tokio::test]
async fn an_event_sent_again_while_it_retries_has_each_delivery_journaled_apart() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let w = World::new(ScriptedSender::new(move |_| {
        match seen.fetch_add(1, Ordering::SeqCst) {
            0 => AttemptResult::Status(503),
            1 => AttemptResult::Status(500),
            _ => AttemptResult::Status(200),
        }
    }));
    w.subscribe(request("sub-1")).await;
    w.publish(&["a"]).await;
    w.run().await;
    let redriven_at = w.clock.now();
    gridrelay_ports::fan_out::send_again_to_subscription(
        w.delivery.as_ref(),
        &w.stored("sub-1").await,
        vec![gridrelay_shared::message::QueuedEvent::new(
            redriven_at,
            grid_event("a", 0),
        )],
        "s3://dead/orders/a.json",
        redriven_at,
    )
    .await
    .unwrap();
    w.run().await;
    let redrive = gridrelay_shared::journal::redrive_delivery(redriven_at);

    let life = EventLife::of(TOPIC, "a", &w.journal.entries());
    let sub = &life.subscriptions[0];
    let retry_due = |standing: &Standing| matches!(standing, Standing::RetryDue { .. });
    assert!(retry_due(&sub.standing), "{:?}", sub.standing);
    assert_eq!(sub.deliveries.len(), 2, "{:?}", sub.deliveries);
    assert_eq!(sub.deliveries[0].delivery, None);
    assert!(retry_due(&sub.deliveries[0].standing));
    assert_eq!(
        sub.deliveries[1].delivery.as_deref(),
        Some(redrive.as_str())
    );

    // Both retries fall due in the next minute, and go in one invocation.
    w.run_next().await;
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let entries = w.journal.entries();
    let life = EventLife::of(TOPIC, "a", &entries);
    let sub = &life.subscriptions[0];
    assert!(
        sub.deliveries
            .iter()
            .all(|d| matches!(d.standing, Standing::Delivered { .. })),
        "{:?}",
        sub.deliveries
    );
    let attempts_of = |delivery: Option<&str>| -> Vec<u32> {
        entries
            .iter()
            .filter(|e| e.delivery.as_deref() == delivery)
            .filter_map(|e| match &e.step {
                Step::Attempt(a) => Some(a.attempt),
                _ => None,
            })
            .collect()
    };
    assert_eq!(attempts_of(None), [1, 2], "the publish's own");
    assert_eq!(
        attempts_of(Some(&redrive)),
        [1, 2],
        "the redrive's, its retry included"
    );
}

/// #35: a journal that is down costs no delivery: the events go out and the message is
/// deleted as always, and the entries it did not take are counted.
#[tokio::test]
async fn a_journal_that_is_down_costs_no_delivery() {
    let w = World::new(ScriptedSender::status(200));
    w.subscribe(request("sub-1")).await;
    w.journal.outage.set(true);
    w.publish(&["a", "b"]).await;
    let outcome = w.run().await;
    assert_eq!(outcome.report.delivered, 2);
    assert!(outcome.failed_message_ids.is_empty());
    assert!(w.delivery.is_empty(), "the message was deleted");
    // Two fanned-out entries and two attempts.
    assert_eq!(outcome.report.journal_unwritten, 4);
    assert!(w.journal.entries().is_empty());
}

/// A journal that never answers.
struct HangingJournal;

#[async_trait::async_trait]
impl gridrelay_ports::RecordStream for HangingJournal {
    async fn put_records(
        &self,
        _records: &[Vec<u8>],
    ) -> Result<Vec<usize>, gridrelay_ports::RecordStreamError> {
        futures::future::pending().await
    }
}

/// #35: a journal that hangs costs no delivery and no more than its own budget: the
/// invocation ends, its events delivered and its message deleted, and the entries are counted
/// unwritten.
#[tokio::test(start_paused = true)]
async fn a_journal_that_hangs_costs_only_its_budget() {
    let mut w = World::new(ScriptedSender::status(200));
    w.subscribe(request("sub-1")).await;
    w.deliver.ports.journal = Arc::new(HangingJournal);
    w.publish(&["a"]).await;
    let started = tokio::time::Instant::now();
    let outcome = w.run().await;
    assert_eq!(outcome.report.delivered, 1);
    assert!(w.delivery.is_empty(), "the message was deleted");
    assert_eq!(outcome.report.journal_unwritten, 2);
    assert_eq!(
        started.elapsed(),
        gridrelay_deliver::JOURNAL_WRITE_BUDGET,
        "the journal's budget, no more"
    );
}

/// #35: replays on in-memory ports: the archive as `ingest` writes it, the replay's record and
/// its steps on the (one) queue, run by the real handler.
mod replays {
    use super::*;
    use gridrelay_ports::{RecordStream, ReplayStore, StoreError};
    use gridrelay_shared::archive::{TimeWindow, archive_lines};
    use gridrelay_shared::journal::compress_record;
    use gridrelay_shared::replay::{REPLAY_HEADER, Replay, ReplayState, ReplayStep, ReplayTarget};

    /// Archives events of `topic` published at `at`, as `ingest` does (a compressed record per
    /// event), into one object of the in-memory archive, as the stream gathers them.
    async fn archive(w: &World, topic: &str, ids: &[&str], at: DateTime<Utc>) {
        let events: Vec<Box<RawValue>> = ids.iter().map(|id| grid_event(id, 0)).collect();
        let object: Vec<u8> = archive_lines(topic, InputSchema::EventGridSchema, at, &events)
            .iter()
            .flat_map(|line| compress_record(line))
            .collect();
        assert!(w.archive.put_records(&[object]).await.unwrap().is_empty());
    }

    /// Stores a replay of sub-1 at `rate` and sends its first step, due now.
    async fn start(w: &World, name: &str, rate: u32, window: TimeWindow) -> Replay {
        let sub = w.stored("sub-1").await;
        let now = w.clock.now();
        let replay = Replay::new(
            TOPIC,
            name,
            window,
            vec![ReplayTarget {
                name: sub.name,
                id: sub.id,
            }],
            rate,
            now,
            now,
        );
        w.replays.create_replay(&replay).await.unwrap();
        send_step(w, &ReplayStep::of(&replay)).await;
        replay
    }

    async fn send_step(w: &World, step: &ReplayStep) {
        let body = DeliveryQueueMessage::Replay(step.clone())
            .to_body()
            .unwrap();
        w.delivery
            .send_all(&[OutgoingMessage {
                body,
                delay: Duration::ZERO,
                group: None,
            }])
            .await;
    }

    /// Runs invocations, moving the clock on as messages wait, until the queue is empty.
    async fn run_all(w: &World) -> gridrelay_deliver::DeliveryReport {
        let mut report = gridrelay_deliver::DeliveryReport::default();
        while !w.delivery.is_empty() {
            report.add(&w.run_next().await.report);
        }
        report
    }

    /// The ids of the events POSTed, in order, each with the replay header it carried.
    fn posted(w: &World) -> Vec<(String, Option<String>)> {
        w.sender
            .requests()
            .iter()
            .flat_map(|r| {
                let replay = r
                    .headers
                    .iter()
                    .find(|(n, _)| n == REPLAY_HEADER)
                    .map(|(_, v)| v.clone());
                let events: Vec<serde_json::Value> = serde_json::from_str(&r.body).unwrap();
                events
                    .into_iter()
                    .map(move |e| (e["id"].as_str().unwrap().to_string(), replay.clone()))
            })
            .collect()
    }

    fn window(from_minutes_ago: i64, to_minutes_ago: i64) -> TimeWindow {
        TimeWindow::new(
            t0() - chrono::Duration::minutes(from_minutes_ago),
            t0() - chrono::Duration::minutes(to_minutes_ago),
            "endTime",
        )
        .unwrap()
    }

    /// A replay sends exactly the topic's archived events of its window, as new deliveries
    /// with the replay's header, journals them as replayed, and completes with its count.
    #[tokio::test]
    async fn a_replay_sends_exactly_its_windows_events_with_its_header() {
        let w = World::new(ScriptedSender::status(200));
        w.subscribe(request("sub-1")).await;
        let minutes_ago = |m| t0() - chrono::Duration::minutes(m);
        archive(&w, TOPIC, &["before"], minutes_ago(61)).await;
        archive(&w, TOPIC, &["a", "b"], minutes_ago(50)).await;
        archive(&w, "billing", &["other-topic"], minutes_ago(40)).await;
        archive(&w, TOPIC, &["c"], minutes_ago(11)).await;
        archive(&w, TOPIC, &["at-the-end"], minutes_ago(10)).await;

        start(&w, "night", 100, window(60, 10)).await;
        run_all(&w).await;

        let night = Some("night".to_string());
        assert_eq!(
            posted(&w),
            [
                ("a".to_string(), night.clone()),
                ("b".to_string(), night.clone()),
                ("c".to_string(), night.clone())
            ]
        );
        let record = w.replays.get_replay(TOPIC, "night").await.unwrap().unwrap();
        assert_eq!(record.state, ReplayState::Completed);
        assert_eq!(record.events_sent, 3);
        let replayed = w
            .journal
            .entries()
            .into_iter()
            .filter(|e| matches!(&e.step, Step::Fanned { replay: Some(r), .. } if r == "night"))
            .count();
        assert_eq!(replayed, 3, "each replayed event journaled as the replay's");
        assert!(
            w.journal
                .entries()
                .iter()
                .all(|e| e.delivery.as_deref() == Some("replay:night")),
            "every step of the replay's delivery names it"
        );
    }

    /// A replay's steps take STEP_SECONDS of its rate each and wait for the rest of that
    /// time before the next: 25 events at 1 a second go out in steps of 10, 10 and 5, 10 s
    /// apart, and each event once.
    #[tokio::test]
    async fn a_replay_is_paced_to_its_rate() {
        let w = World::new(ScriptedSender::status(200));
        w.subscribe(request("sub-1")).await;
        let ids: Vec<String> = (0..25).map(|i| format!("e{i:02}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        archive(&w, TOPIC, &refs, t0() - chrono::Duration::minutes(30)).await;
        start(&w, "slow", 1, window(60, 10)).await;

        w.run().await;
        let step = w.delivery.sent().last().cloned().unwrap();
        assert!(
            matches!(DeliveryQueueMessage::from_body(&step.body).unwrap(), DeliveryQueueMessage::Replay(s) if s.version == 1)
        );
        assert_eq!(
            step.delay,
            Duration::from_secs(10),
            "10 events at 1 a second"
        );
        let record = w.replays.get_replay(TOPIC, "slow").await.unwrap().unwrap();
        assert_eq!((record.version, record.events_sent), (1, 10));

        run_all(&w).await;
        let record = w.replays.get_replay(TOPIC, "slow").await.unwrap().unwrap();
        assert_eq!(record.state, ReplayState::Completed);
        assert_eq!(record.events_sent, 25);
        let mut got: Vec<String> = posted(&w).into_iter().map(|(id, _)| id).collect();
        got.sort();
        assert_eq!(got, ids);
    }

    /// What a [`FirstWrite`] store does with its first update.
    #[derive(Clone, Copy)]
    enum FirstWriteIs {
        /// Refused, unmade: as if the process died between a step's sends and its write.
        Lost,
        /// Made, then answered as refused: as when the SDK sends a write again after it was
        /// made and its condition then fails.
        AnsweredConflict,
    }

    /// A replay store whose first update goes wrong as its mode says.
    struct FirstWrite(Arc<MemoryReplayStore>, FirstWriteIs, AtomicUsize);

    #[async_trait::async_trait]
    impl ReplayStore for FirstWrite {
        async fn create_replay(&self, replay: &Replay) -> Result<(), StoreError> {
            self.0.create_replay(replay).await
        }
        async fn get_replay(&self, topic: &str, name: &str) -> Result<Option<Replay>, StoreError> {
            self.0.get_replay(topic, name).await
        }
        async fn list_replays(&self, topic: &str) -> Result<Vec<Replay>, StoreError> {
            self.0.list_replays(topic).await
        }
        async fn update_replay(&self, replay: &Replay, read: u64) -> Result<(), StoreError> {
            let first = self.2.fetch_add(1, Ordering::SeqCst) == 0;
            match self.1 {
                FirstWriteIs::Lost if first => Err(StoreError::Unavailable("lost".into())),
                FirstWriteIs::AnsweredConflict if first => {
                    self.0.update_replay(replay, read).await?;
                    Err(StoreError::Conflict("written, then refused".into()))
                }
                _ => self.0.update_replay(replay, read).await,
            }
        }
    }

    /// A step that sent its deliveries but did not move the record runs again (SQS redelivers
    /// it): its deliveries are sent twice, and the copies of each part claim it, so every
    /// event is delivered once by the replay and the other copies are dropped and counted.
    #[tokio::test]
    async fn a_step_run_twice_delivers_each_event_once() {
        let mut w = World::new(ScriptedSender::status(200));
        w.subscribe(request("sub-1")).await;
        archive(
            &w,
            TOPIC,
            &["a", "b", "c"],
            t0() - chrono::Duration::minutes(30),
        )
        .await;
        w.deliver.ports.replays = Arc::new(FirstWrite(
            w.replays.clone(),
            FirstWriteIs::Lost,
            AtomicUsize::new(0),
        ));
        start(&w, "twice", 100, window(60, 10)).await;

        let first = w.run().await;
        assert_eq!(first.failed_message_ids.len(), 1, "the step is left to SQS");
        let report = run_all(&w).await;

        let mut got: Vec<String> = posted(&w).into_iter().map(|(id, _)| id).collect();
        got.sort();
        assert_eq!(got, ["a", "b", "c"], "each event once");
        assert_eq!(report.replay_copies_dropped, 3, "the other copies dropped");
        let record = w.replays.get_replay(TOPIC, "twice").await.unwrap().unwrap();
        assert_eq!(
            (record.state, record.events_sent),
            (ReplayState::Completed, 3)
        );
    }

    /// A cancelled replay's next step does nothing; a step whose version another copy already
    /// moved on waits, and then dies out (no chain of its own). Each event here is an object of
    /// its own, so the first step stops at its budget of objects.
    #[tokio::test]
    async fn a_cancelled_replay_stops_and_a_stale_step_dies_out() {
        let w = World::new(ScriptedSender::status(200));
        w.subscribe(request("sub-1")).await;
        for i in 0..15 {
            archive(
                &w,
                TOPIC,
                &[&format!("e{i}")],
                t0() - chrono::Duration::minutes(30),
            )
            .await;
        }
        let replay = start(&w, "stop", 1, window(60, 10)).await;
        w.run().await;
        assert_eq!(posted(&w).len(), 0, "delivered on the next run");
        // A copy of the first step, as SQS may deliver one.
        send_step(&w, &ReplayStep::of(&replay)).await;
        let record = w.replays.get_replay(TOPIC, "stop").await.unwrap().unwrap();
        w.replays
            .update_replay(&record.cancelled(w.clock.now()), record.version)
            .await
            .unwrap();
        run_all(&w).await;

        let first_step = gridrelay_shared::replay::MAX_STEP_OBJECTS;
        assert_eq!(posted(&w).len(), first_step, "the first step's events only");
        let record = w.replays.get_replay(TOPIC, "stop").await.unwrap().unwrap();
        assert_eq!(
            (record.state, record.events_sent),
            (ReplayState::Cancelled, first_step as u64)
        );
    }

    /// A replay's deliveries and live ones to the same batched subscription, received
    /// together, go in batches of their own: only the replay's carry its header.
    #[tokio::test]
    async fn replayed_and_live_events_never_share_a_batch() {
        let w = World::new(ScriptedSender::status(200));
        w.subscribe(SubscriptionRequest {
            max_events_per_batch: Some(100),
            ..request("sub-1")
        })
        .await;
        archive(
            &w,
            TOPIC,
            &["r-1", "r-2"],
            t0() - chrono::Duration::minutes(30),
        )
        .await;
        start(&w, "apart", 100, window(60, 10)).await;
        w.run().await;
        w.publish(&["live-1", "live-2"]).await;
        w.run().await;

        let batches: Vec<(Vec<String>, Option<String>)> = w
            .sender
            .requests()
            .iter()
            .map(|r| {
                let events: Vec<serde_json::Value> = serde_json::from_str(&r.body).unwrap();
                let ids = events
                    .iter()
                    .map(|e| e["id"].as_str().unwrap().to_string())
                    .collect();
                let replay = r
                    .headers
                    .iter()
                    .find(|(n, _)| n == REPLAY_HEADER)
                    .map(|(_, v)| v.clone());
                (ids, replay)
            })
            .collect();
        assert_eq!(batches.len(), 2, "{batches:?}");
        for (ids, replay) in &batches {
            let replayed = ids.iter().all(|id| id.starts_with("r-"));
            let live = ids.iter().all(|id| id.starts_with("live-"));
            assert!(replayed || live, "mixed: {ids:?}");
            assert_eq!(replay.is_some(), replayed, "{ids:?} {replay:?}");
        }
    }

    /// A step whose own write is reported as a conflict does not end the replay: it looks
    /// again, finds the record one version on and no next step run, and after the grace sends
    /// it, so the replay completes with each event once.
    #[tokio::test]
    async fn a_write_reported_refused_after_it_was_made_does_not_stall_the_replay() {
        let mut w = World::new(ScriptedSender::status(200));
        w.subscribe(request("sub-1")).await;
        let ids: Vec<String> = (0..15).map(|i| format!("e{i:02}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        archive(&w, TOPIC, &refs, t0() - chrono::Duration::minutes(30)).await;
        w.deliver.ports.replays = Arc::new(FirstWrite(
            w.replays.clone(),
            FirstWriteIs::AnsweredConflict,
            AtomicUsize::new(0),
        ));
        start(&w, "retried", 1, window(60, 10)).await;
        run_all(&w).await;

        let record = w
            .replays
            .get_replay(TOPIC, "retried")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (record.state, record.events_sent),
            (ReplayState::Completed, 15)
        );
        let mut got: Vec<String> = posted(&w).into_iter().map(|(id, _)| id).collect();
        got.sort();
        assert_eq!(got, ids);
    }

    /// A subscription deleted and created again under the replay's subscription's name gets
    /// nothing: the replay chose the old one; with none of its subscriptions left, the replay
    /// completes without reading on.
    #[tokio::test]
    async fn a_subscription_created_again_gets_nothing_of_an_older_replay() {
        let w = World::new(ScriptedSender::status(200));
        w.subscribe(request("sub-1")).await;
        archive(&w, TOPIC, &["a"], t0() - chrono::Duration::minutes(30)).await;
        start(&w, "old", 100, window(60, 10)).await;
        w.create_again(request("sub-1")).await;
        run_all(&w).await;
        assert!(posted(&w).is_empty());
        let record = w.replays.get_replay(TOPIC, "old").await.unwrap().unwrap();
        assert_eq!(
            (record.state, record.events_sent),
            (ReplayState::Completed, 0)
        );
    }

    /// One invocation over `queue`'s visible messages, received as from the queue named
    /// `name` (their `eventSourceArn`), deleting those not reported as failed.
    async fn run_from(deliver: &Deliver, queue: &MemoryQueue, name: &str) -> DeliverOutcome {
        let received = queue.receive(10, VISIBILITY);
        let mut event = sqs_event(&received);
        for r in &mut event.records {
            r.event_source_arn = Some(format!("arn:aws:sqs:us-east-1:123456789012:{name}"));
        }
        let outcome = deliver.handle(event).await;
        for m in &received {
            if !outcome.failed_message_ids.contains(&m.id) {
                assert!(queue.delete(&m.id, m.receipt));
            }
        }
        outcome
    }

    /// The delivery messages sent to `queue` so far: each one's event ids and replay name.
    fn deliveries_sent(queue: &MemoryQueue) -> Vec<(Vec<String>, Option<String>)> {
        queue
            .sent()
            .iter()
            .filter_map(|m| match DeliveryQueueMessage::from_body(&m.body).ok()? {
                DeliveryQueueMessage::Delivery(d) => Some((
                    d.events
                        .iter()
                        .map(|e| {
                            let event: serde_json::Value =
                                serde_json::from_str(e.event.get()).unwrap();
                            event["id"].as_str().unwrap().to_string()
                        })
                        .collect(),
                    d.replay.map(|r| r.name),
                )),
                _ => None,
            })
            .collect()
    }

    /// A replay's deliveries, and their retries, travel on the replay queue and never on the
    /// delivery queue, so a replay's backlog never delays a live event (and the stacks cap the
    /// replay queue's invocations apart from the delivery queue's). A record received from the
    /// replay queue that fails comes back from it after its short wait; a live event published
    /// meanwhile keeps to the delivery queue.
    #[tokio::test]
    async fn a_replays_deliveries_and_retries_keep_to_the_replay_queue() {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        // The replay's first request fails (R1: retried), every other succeeds.
        let w = World::new(ScriptedSender::new(move |_| {
            match seen.fetch_add(1, Ordering::SeqCst) {
                0 => AttemptResult::Status(500),
                _ => AttemptResult::Status(200),
            }
        }));
        let replay_queue = Arc::new(MemoryQueue::new(w.clock.clone()));
        let deliver = Deliver::new(
            DeliverPorts {
                replay_queue: replay_queue.clone(),
                ..w.deliver.ports.clone()
            },
            w.sender.clone(),
            DeliverySettings {
                replay_queue_name: Some("t-replay".to_string()),
                ..DeliverySettings::new(TimeScale::REAL)
            },
        );
        w.subscribe(request("sub-1")).await;
        archive(&w, TOPIC, &["a", "b"], t0() - chrono::Duration::minutes(50)).await;
        start(&w, "night", 100, window(60, 10)).await;

        // The step (on the delivery queue here, which serves as the control queue too).
        run_from(&deliver, &w.delivery, "t-delivery").await;
        let night = Some("night".to_string());
        assert_eq!(
            deliveries_sent(&replay_queue),
            [(vec!["a".to_string(), "b".to_string()], night.clone())]
        );
        assert!(deliveries_sent(&w.delivery).is_empty());

        // A live event, then the replay's delivery (a batch an event, the default): the first
        // attempt fails.
        w.publish(&["live"]).await;
        let failed = run_from(&deliver, &replay_queue, "t-replay").await;
        assert_eq!((failed.report.retried, failed.report.delivered), (1, 1));
        assert_eq!(
            deliveries_sent(&replay_queue)[1..],
            [(vec!["a".to_string()], night.clone())],
            "the retry is on the replay queue"
        );
        assert_eq!(
            deliveries_sent(&w.delivery),
            [(vec!["live".to_string()], None)],
            "only the live event is on the delivery queue"
        );

        // A record from the replay queue that fails comes back from it early.
        replay_queue
            .send_all(&[OutgoingMessage {
                body: "not a message".to_string(),
                delay: Duration::ZERO,
                group: None,
            }])
            .await;
        let unreadable = run_from(&deliver, &replay_queue, "t-replay").await;
        assert_eq!(unreadable.failed_message_ids.len(), 1);
        let back_at = replay_queue
            .next_visible_at()
            .expect("still on the replay queue");
        assert!(
            back_at < t0() + chrono::Duration::minutes(5),
            "back at {back_at}, not after the visibility timeout"
        );

        // Both queues drained: the live event once, plain; the replayed ones once, tagged.
        run_from(&deliver, &w.delivery, "t-delivery").await;
        w.clock.advance(Duration::from_secs(60));
        run_from(&deliver, &replay_queue, "t-replay").await;
        let mut got = posted(&w);
        got.sort();
        assert_eq!(
            got,
            [
                ("a".to_string(), night.clone()),
                ("a".to_string(), night.clone()),
                ("b".to_string(), night.clone()),
                ("live".to_string(), None),
            ],
            "a twice (failed, then delivered), b and the live event once"
        );
    }
}

/// O1: an ordered record that cannot be read fails (and comes back, holding its key: the next
/// record of its key is held, not attempted) while it was received fewer than five times; at
/// its fifth receive it is parked in the ordered redrive queue, in its message group, and the
/// invocation names it done, so SQS deletes it and its key goes on in the same invocation (the
/// next record is attempted: being unreadable too, at its first receive, it fails); where the
/// redrive queue refuses it, it fails and its key is held.
#[tokio::test]
async fn an_unreadable_ordered_record_is_parked_at_its_fifth_receive_o1() {
    let w = World::new(ScriptedSender::status(200));
    let ordered = Arc::new(MemoryQueue::new(w.clock.clone()));
    let redrive = Arc::new(MemoryQueue::new(w.clock.clone()));
    let deliver = Deliver::new(
        DeliverPorts {
            ordered_queue: ordered.clone(),
            ordered_redrive_queue: Some(redrive.clone()),
            ..w.deliver.ports.clone()
        },
        w.sender.clone(),
        DeliverySettings::new(TimeScale::REAL),
    );
    let group = "a-subscription-id:00112233445566778899aabbccddeeff";
    // One invocation of an unreadable record of `group` received `receives` times, and the
    // key's next record (as unreadable, received once) behind it. Answers the outcome and the
    // first record's message id.
    let invoke = |receives: u32| {
        let (ordered, deliver) = (ordered.clone(), &deliver);
        async move {
            let message = |body: &str| OutgoingMessage {
                body: body.to_string(),
                delay: Duration::ZERO,
                group: None,
            };
            ordered
                .send_all(&[message("not a message"), message("not one either")])
                .await;
            let mut event = sqs_event(&ordered.receive(10, Duration::from_secs(1800)));
            for (record, count) in event.records.iter_mut().zip([receives, 1]) {
                let attributes = &mut record.attributes;
                attributes.insert("MessageGroupId".to_string(), group.to_string());
                attributes.insert("ApproximateReceiveCount".to_string(), count.to_string());
            }
            let first = event.records[0].message_id.clone().unwrap_or_default();
            (deliver.handle(event).await, first)
        }
    };

    let (fourth, first) = invoke(4).await;
    assert!(fourth.failed_message_ids.contains(&first), "comes back");
    assert_eq!(fourth.report.ordered_waiting, 1, "its key's next held");
    assert_eq!(fourth.report.ordered_parked, 0);
    assert!(redrive.sent().is_empty());

    let (fifth, first) = invoke(5).await;
    assert!(
        !fifth.failed_message_ids.contains(&first),
        "done: SQS deletes it"
    );
    assert_eq!(fifth.report.ordered_parked, 1);
    assert_eq!(fifth.report.ordered_waiting, 0, "its key went on");
    assert_eq!(
        fifth.failed_message_ids.len(),
        1,
        "the next, attempted in the same invocation, failed"
    );
    assert_eq!(
        redrive.sent(),
        vec![OutgoingMessage {
            body: "not a message".to_string(),
            delay: Duration::ZERO,
            group: Some(group.to_string()),
        }]
    );

    redrive.refuse_entries_containing(Some("not a message"));
    let (refused, first) = invoke(5).await;
    assert!(
        refused.failed_message_ids.contains(&first),
        "not parked: comes back"
    );
    assert_eq!(refused.report.ordered_waiting, 1, "its key's next held");
    assert_eq!(refused.report.ordered_parked, 0);
    assert_eq!(redrive.sent().len(), 1);
}
