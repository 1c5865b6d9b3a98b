//! The deliver worker on in-memory ports: the real handler, registration and fan-out, with a
//! queue that keeps SQS's contract, stores in maps, a scripted subscriber and a clock moved by
//! hand. What the end-to-end tests show against moto and real HTTP, these show for each rule in
//! milliseconds, and for faults (a store or queue that fails) that an emulator cannot be told
//! to produce.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use chrono::{DateTime, Utc};
use gridrelay_deliver::{Deliver, DeliverOutcome, DeliverySettings};
use gridrelay_ports::fan_out::fan_out;
use gridrelay_ports::memory::{
    FixedJitter, ManualClock, MemoryDeliveryStateStore, MemoryQueue, MemorySecretStore,
    MemorySubscriptionStore, ScriptedSender,
};
use gridrelay_ports::registration::Registry;
use gridrelay_ports::{
    Clock, DeliveryRequest, DeliveryStateStore, MessageQueue, OutgoingMessage, SubscriptionStore,
};
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::decision::DeadLetterReason;
use gridrelay_shared::delivery::DEAD_LETTER_DELAY;
use gridrelay_shared::message::DeadLetterMessage;
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::subscription::{SubscriptionRequest, Topic};
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
    state: Arc<MemoryDeliveryStateStore>,
    secrets: Arc<MemorySecretStore>,
    deliver: Deliver,
}

impl World {
    fn new(sender: ScriptedSender) -> Self {
        let clock = Arc::new(ManualClock::new(t0()));
        let store = Arc::new(MemorySubscriptionStore::default());
        let delivery = Arc::new(MemoryQueue::new(clock.clone()));
        let dead = Arc::new(MemoryQueue::new(clock.clone()));
        let sender = Arc::new(sender);
        let state = Arc::new(MemoryDeliveryStateStore::default());
        let secrets = Arc::new(MemorySecretStore::default());
        let deliver = Deliver {
            store: store.clone(),
            delivery_queue: delivery.clone(),
            dead_letter_queue: dead.clone(),
            sender: sender.clone(),
            clock: clock.clone(),
            jitter: Arc::new(FixedJitter(0.0)),
            state: state.clone(),
            secrets: secrets.clone(),
            settings: DeliverySettings::new(TimeScale::REAL),
        };
        Self {
            clock,
            store,
            delivery,
            dead,
            sender,
            state,
            secrets,
            deliver,
        }
    }

    /// Creates the topic and a subscription through registration, and runs its handshake.
    async fn subscribe(&self, request: SubscriptionRequest) {
        if self.store.get_topic(TOPIC).await.unwrap().is_none() {
            let topic = Topic::with_new_keys(TOPIC, t0());
            self.store.create_topic(&topic).await.unwrap();
        }
        let registry = Registry {
            store: self.store.as_ref(),
            secrets: self.secrets.as_ref(),
            secret_prefix: "gridrelay",
            delivery_queue: self.delivery.as_ref(),
        };
        registry
            .register(
                &SubscriptionRequest {
                    topic: TOPIC.into(),
                    ..request
                },
                self.clock.now(),
            )
            .await
            .expect("registered");
        self.run().await;
    }

    /// Publishes events through the real fan-out.
    async fn publish(&self, ids: &[&str]) {
        let events: Vec<Box<RawValue>> = ids
            .iter()
            .map(|id| {
                RawValue::from_string(format!(
                    r#"{{"id":"{id}","subject":"s","eventType":"t","eventTime":"2026-11-23T00:00:00Z","data":{{}},"dataVersion":"1","metadataVersion":"1","topic":"/t"}}"#
                ))
                .unwrap()
            })
            .collect();
        fan_out(
            self.store.as_ref(),
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
        let received = self.delivery.receive(10, VISIBILITY);
        let mut event = SqsEvent::default();
        event.records = received
            .iter()
            .map(|m| {
                let mut r = SqsMessage::default();
                r.message_id = Some(m.id.clone());
                r.body = Some(m.body.clone());
                r
            })
            .collect();
        let outcome = self.deliver.handle(event).await;
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
    let sub = w
        .store
        .get_subscription(TOPIC, "sub-1")
        .await
        .unwrap()
        .unwrap();
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
        DeadLetterReason::NonRetriableStatus(400)
    );
    assert_eq!(dead[0].entries[0].delivery_attempts, 1);
    assert!(w.delivery.is_empty());
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
    });
    w.delivery.send_all(&bad).await;
    let outcome = w.run().await;
    assert_eq!(outcome.report.delivered, 1);
    assert_eq!(outcome.failed_message_ids.len(), 2);
}

/// Events of a deleted subscription are dropped and counted, not retried forever.
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
    let w = World::new(ScriptedSender::new(|r| {
        if r.endpoint.ends_with("/sick") {
            AttemptResult::Status(503)
        } else {
            AttemptResult::Status(200)
        }
    }));
    w.subscribe(request("sick")).await;
    w.subscribe(request("well")).await;
    let ids: Vec<String> = (0..10).map(|i| format!("e{i}")).collect();
    w.publish(&ids.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    while w.sender.requests().len() < 20 {
        assert!(w.run().await.report.attempts > 0);
    }
    let health = w
        .state
        .endpoint_health("http://127.0.0.1:9/sick")
        .await
        .unwrap();
    assert!(health.is_delayed(), "{health:?}");

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
