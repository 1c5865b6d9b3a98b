//! End-to-end: publish → fan-out → deliver → classify → retry → dead-letter, through the local
//! runner's real handlers, against the AWS API at `AWS_ENDPOINT_URL`, with real subscribers.

use std::collections::BTreeSet;
use std::time::Duration;

use gridrelay_e2e::{Reply, Subscriber, TestSystem, events, subscription};
use gridrelay_shared::subscription::SubscriptionRequest;

const WAIT: Duration = Duration::from_secs(30);

/// G1, B1, B2, B5, B6: every event reaches every subscription; a batching subscription gets at
/// most `maxEventsPerBatch` events a request, a default one exactly one; headers as Event Grid
/// sends them; events arrive as published, stamped with `topic` and `metadataVersion`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_every_event_to_every_subscription_in_bounded_batches_g1_b1_b2_h2() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("orders").await;
    let batched = Subscriber::start(vec![], Reply::Status(200)).await;
    let single = Subscriber::start(vec![], Reply::Status(202)).await;
    sys.subscribe(SubscriptionRequest {
        max_events_per_batch: Some(10),
        ..subscription("orders", "batched", &batched.url)
    })
    .await;
    sys.subscribe(subscription("orders", "single", &single.url))
        .await;

    sys.publish(&topic, &events("e", 25)).await;

    gridrelay_e2e::eventually(WAIT, "25 events at each subscriber", || async {
        (batched.event_count() >= 25 && single.event_count() >= 25).then_some(())
    })
    .await;
    let expected: BTreeSet<String> = (0..25).map(|i| format!("e-{i}")).collect();

    let requests = batched.received();
    assert!(
        requests
            .iter()
            .all(|r| !r.events.is_empty() && r.events.len() <= 10),
        "B2"
    );
    assert!(
        requests.len() >= 3,
        "25 events need at least 3 batches of 10"
    );
    let ids: BTreeSet<String> = requests.iter().flat_map(|r| r.ids()).collect();
    assert_eq!(ids, expected, "G1: every event delivered");
    let first = &requests[0];
    assert_eq!(first.header("aeg-event-type"), Some("Notification"));
    assert_eq!(first.header("aeg-subscription-name"), Some("batched"));
    assert_eq!(first.header("aeg-delivery-count"), Some("0"));
    assert_eq!(first.header("aeg-metadata-version"), Some("1"));
    // H2: the events' dataVersion, the same for the whole batch.
    assert_eq!(first.header("aeg-data-version"), Some("1.0"));
    assert_eq!(
        first.header("content-type"),
        Some("application/json; charset=utf-8")
    );
    let e = &first.events[0];
    assert_eq!(e["topic"], "/gridrelay/topics/orders");
    assert_eq!(e["metadataVersion"], "1");
    assert_eq!(e["dataVersion"], "1.0");
    assert_eq!(e["eventType"], "Contoso.Orders.Created");
    assert!(e["data"]["order"].is_number());

    let singles = single.received();
    assert!(
        singles.iter().all(|r| r.events.len() == 1),
        "B1: one event per request by default"
    );
    let ids: BTreeSet<String> = singles.iter().flat_map(|r| r.ids()).collect();
    assert_eq!(ids, expected);

    // An invocation's counts are added when it returns, which may be after its requests.
    let stats = sys
        .wait_for_stats("50 deliveries counted", |s| s.deliver.delivered >= 50)
        .await;
    assert_eq!(stats.deliver.delivered, 50);
    assert_eq!(stats.deliver.retried, 0);
    sys.shutdown().await;
}

/// S5, R1: a 503 is retried no sooner than the (scaled) 30 seconds, then delivered; the retry
/// carries `aeg-delivery-count: 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_endpoint_is_retried_after_thirty_scaled_seconds_s5_r1() {
    // 30 s → 6 s, clearly apart from the 10 s step (2 s) even with SQS's whole-second delays.
    let scale = 0.2;
    let sys = TestSystem::start(scale).await;
    let topic = sys.topic("busy").await;
    let sub = Subscriber::start(vec![Reply::Status(503)], Reply::Status(200)).await;
    sys.subscribe(subscription("busy", "sub-1", &sub.url)).await;

    sys.publish(&topic, &events("b", 1)).await;
    let r = sub.wait_for_requests(2, WAIT).await;

    let gap = r[1].at - r[0].at;
    assert!(
        gap >= Duration::from_secs_f64(30.0 * scale),
        "waited only {gap:?}"
    );
    assert_eq!(r[0].header("aeg-delivery-count"), Some("0"));
    assert_eq!(r[1].header("aeg-delivery-count"), Some("1"));
    assert_eq!(r[1].ids(), vec!["b-0"]);
    sys.wait_for_stats("delivery counted", |s| s.deliver.delivered == 1)
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(sub.received().len(), 2, "no attempt after success");
    sys.shutdown().await;
}

/// S2, R1: an attempt with no response within the (scaled) 30 s timeout fails and is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_attempt_is_retried_s2() {
    let scale = 0.02; // timeout 0.6 s, first step 0.2 s
    let sys = TestSystem::start(scale).await;
    let topic = sys.topic("slow").await;
    let sub = Subscriber::start(
        vec![Reply::Hang(Duration::from_secs(5))],
        Reply::Status(200),
    )
    .await;
    sys.subscribe(subscription("slow", "sub-1", &sub.url)).await;

    sys.publish(&topic, &events("t", 1)).await;
    let r = sub.wait_for_requests(2, WAIT).await;

    let gap = r[1].at - r[0].at;
    assert!(
        gap >= Duration::from_secs_f64((30.0 + 10.0) * scale),
        "retried after {gap:?}"
    );
    assert!(
        gap < Duration::from_secs(5),
        "retry did not wait for the hung response"
    );
    assert_eq!(r[1].header("aeg-delivery-count"), Some("1"));
    sys.wait_for_stats("delivery counted", |s| s.deliver.delivered == 1)
        .await;
    sys.shutdown().await;
}

/// S3, L2, L4, L6, L3: a 400 is not retried; after the (scaled) five-minute delay the event is
/// written to S3 under PREFIX/TOPIC/SUBSCRIPTION/YYYY/MM/DD/HH/<uuid>.json with the L6 fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_request_is_dead_lettered_at_once_with_l6_fields_s3_l2_l4_l6() {
    let scale = 0.01; // dead-letter delay 3 s
    let sys = TestSystem::start(scale).await;
    let topic = sys.topic("orders").await;
    let sub = Subscriber::start(vec![], Reply::Status(400)).await;
    let registered = sys
        .subscribe(SubscriptionRequest {
            dead_letter_destination: Some(sys.dead_letter_url("dl")),
            ..subscription("orders", "audit", &sub.url)
        })
        .await;

    sys.publish(&topic, &events("d", 1)).await;
    let first = sub.wait_for_requests(1, WAIT).await;

    // L4: nothing is written before the delay has passed.
    tokio::time::sleep(
        Duration::from_secs_f64(300.0 * scale / 2.0).saturating_sub(first[0].at.elapsed()),
    )
    .await;
    assert!(
        sys.dead_letter_objects("dl/").await.is_empty(),
        "written before the L4 delay"
    );

    let objects = sys.wait_for_dead_letters("dl/", WAIT).await;
    assert_eq!(sub.received().len(), 1, "S3: 400 is not retried");
    assert_eq!(objects.len(), 1);
    let (key, records) = &objects[0];
    let parts: Vec<&str> = key.split('/').collect();
    assert_eq!(&parts[..3], &["dl", "orders", "audit"], "{key}");
    assert_eq!(
        parts.len(),
        8,
        "PREFIX/TOPIC/SUB/YYYY/MM/DD/HH/<subscription id>.<uuid>.json: {key}"
    );
    let now = chrono::Utc::now();
    assert_eq!(parts[3], now.format("%Y").to_string());
    let unique = parts[7]
        .strip_prefix(&format!("{}.", registered.id))
        .and_then(|rest| rest.strip_suffix(".json"));
    assert!(
        unique.is_some_and(|u| uuid::Uuid::parse_str(u).is_ok()),
        "{key}"
    );

    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r["id"], "d-0");
    assert_eq!(r["data"]["note"], "hello");
    assert_eq!(r["eventType"], "Contoso.Orders.Created");
    assert_eq!(r["deadLetterReason"], "MaxDeliveryAttemptsExceeded");
    assert_eq!(r["deliveryAttempts"], 1);
    assert_eq!(r["lastDeliveryOutcome"], "BadRequest");
    for field in ["publishTime", "lastDeliveryAttemptTime"] {
        let text = r[field].as_str().unwrap_or_default();
        assert!(
            chrono::DateTime::parse_from_rfc3339(text).is_ok(),
            "{field}: {text}"
        );
    }
    sys.shutdown().await;
}

/// R5, L2: when `maxDeliveryAttempts` is reached the event is dead-lettered with
/// MaxDeliveryAttemptsExceeded, after exactly that many attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_attempts_exhausted_is_dead_lettered_r5_l2() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("flaky").await;
    let sub = Subscriber::start(vec![], Reply::Status(500)).await;
    sys.subscribe(SubscriptionRequest {
        max_delivery_attempts: Some(3),
        dead_letter_destination: Some(sys.dead_letter_url("max")),
        ..subscription("flaky", "sub-1", &sub.url)
    })
    .await;

    sys.publish(&topic, &events("m", 1)).await;
    let objects = sys.wait_for_dead_letters("max/", WAIT).await;

    let r = sub.received();
    assert_eq!(r.len(), 3, "exactly maxDeliveryAttempts attempts");
    let counts: Vec<_> = r
        .iter()
        .map(|x| x.header("aeg-delivery-count").unwrap_or(""))
        .collect();
    assert_eq!(counts, vec!["0", "1", "2"]);
    let record = &objects[0].1[0];
    assert_eq!(record["deadLetterReason"], "MaxDeliveryAttemptsExceeded");
    assert_eq!(record["deliveryAttempts"], 3);
    assert_eq!(record["lastDeliveryOutcome"], "GenericError");
    sys.shutdown().await;
}

/// R5, R6: an event whose TTL runs out between attempts is dead-lettered with
/// TimeToLiveExceeded when its next attempt comes due, and no attempt is made after the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_exceeded_is_dead_lettered_at_the_next_attempt_r5_r6() {
    let scale = 0.02; // TTL 1 min → 1.2 s; steps 0.2 s, 0.6 s, 1.2 s (each at least 1 s in SQS)
    let sys = TestSystem::start(scale).await;
    let topic = sys.topic("ttl").await;
    let sub = Subscriber::start(vec![], Reply::Status(500)).await;
    sys.subscribe(SubscriptionRequest {
        event_ttl_minutes: Some(1),
        dead_letter_destination: Some(sys.dead_letter_url("ttl")),
        ..subscription("ttl", "sub-1", &sub.url)
    })
    .await;

    let published = std::time::Instant::now();
    sys.publish(&topic, &events("x", 1)).await;
    let objects = sys.wait_for_dead_letters("ttl/", WAIT).await;

    let attempts = sub.received();
    let ttl = Duration::from_secs_f64(60.0 * scale);
    assert!(!attempts.is_empty());
    for a in &attempts {
        assert!(
            a.at - published < ttl + Duration::from_millis(200),
            "attempt after the TTL"
        );
    }
    let record = &objects[0].1[0];
    assert_eq!(record["deadLetterReason"], "TimeToLiveExceeded");
    assert_eq!(record["deliveryAttempts"], attempts.len());
    assert!((attempts.len() as u64) < 30);
    sys.shutdown().await;
}

/// L1: with no dead-letter destination, a terminal failure is dropped and counted; nothing is
/// dead-lettered and nothing is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_failure_without_dead_letter_is_dropped_l1() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("nodl").await;
    let sub = Subscriber::start(vec![], Reply::Status(401)).await;
    sys.subscribe(subscription("nodl", "sub-1", &sub.url)).await;

    sys.publish(&topic, &events("n", 2)).await;
    sys.wait_for_stats("two drops", |s| s.deliver.dropped == 2)
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    assert_eq!(
        sub.received().len(),
        2,
        "one attempt per event, none retried"
    );
    let stats = sys.system.stats();
    assert_eq!(stats.deliver.dead_lettered, 0);
    assert_eq!(stats.dead_letter.records_written, 0);
    assert_eq!(
        sys.queue_depth(&sys.system.resources.delivery_queue_url)
            .await,
        0
    );
    assert_eq!(
        sys.queue_depth(&sys.system.resources.dead_letter_queue_url)
            .await,
        0
    );
    sys.shutdown().await;
}

/// S6: a subscription can select the 2019 table, under which a 401 is retried (the current
/// table would not retry it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_status_table_retries_401_s6() {
    let sys = TestSystem::start(0.001).await;
    let topic = sys.topic("legacy").await;
    let sub = Subscriber::start(vec![Reply::Status(401)], Reply::Status(200)).await;
    sys.subscribe(SubscriptionRequest {
        status_table: Some("Legacy2019".to_string()),
        ..subscription("legacy", "sub-1", &sub.url)
    })
    .await;

    sys.publish(&topic, &events("l", 1)).await;
    let r = sub.wait_for_requests(2, WAIT).await;
    assert_eq!(r[1].header("aeg-delivery-count"), Some("1"));
    sys.wait_for_stats("delivery counted", |s| s.deliver.delivered == 1)
        .await;
    sys.shutdown().await;
}
