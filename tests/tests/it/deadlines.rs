//! End-to-end, #34 item 12: deadlines and control work. Every setting the runner accepts must
//! deliver, no invocation may outlive its deadline (the slow-AWS side of this is in
//! `aws_faults.rs`), and a subscription's handshake never waits behind a backlog of deliveries.

use std::time::{Duration, Instant};

use gridrelay_adapters::aws::SqsQueue;
use gridrelay_e2e::{Reply, Subscriber, TestSystem, subscription};
use gridrelay_ports::{MessageQueue, OutgoingMessage};
use gridrelay_shared::message::{DeliveryHistory, DeliveryMessage, QueuedEvent};
use serde_json::value::RawValue;
use serde_json::{Value, json};

/// At the shortest function timeout the runner accepts, invocations still deliver: the timeout
/// leaves room for the reads before the first attempt, one attempt, and the margin kept to
/// enqueue. Before, the shortest accepted timeout was one attempt plus the margin, which left
/// no time for the reads: every invocation handed its events on, and nothing was delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shortest_accepted_function_timeout_still_delivers() {
    let sys = TestSystem::start_with(0.01, |c| {
        // The margin covers the reads before the first attempt. The test system's 1 s did not
        // always on a loaded emulator: a CI run of tests/it, six tests at a time against one
        // moto, had not delivered the 10 events after 30 s. 3 s, as the product's 10 s, leaves
        // reads that take milliseconds on AWS ample room.
        c.deadline_margin = Duration::from_secs(3);
        c.function_timeout = c.shortest_function_timeout();
        // A second longer, as the test system keeps it (tests/src/lib.rs says why).
        c.visibility_timeout = c.function_timeout + Duration::from_secs(1);
        assert!(c.check().is_ok(), "{:?}", c.check());
    })
    .await;
    let topic = sys.topic("short").await;
    let subscriber = Subscriber::start(Vec::new(), Reply::Status(200)).await;
    sys.subscribe(subscription("short", "all", &subscriber.url))
        .await;
    let events: Vec<Value> = (0..10)
        .map(|i| {
            json!({
                "id": format!("short-{i}"),
                "eventType": "Contoso.Short",
                "subject": "/short",
                "eventTime": chrono::Utc::now().to_rfc3339(),
                "data": {},
                "dataVersion": "1"
            })
        })
        .collect();
    sys.publish(&topic, &Value::Array(events)).await;
    let delivered = || {
        let ids: std::collections::BTreeSet<String> =
            subscriber.received().iter().flat_map(|r| r.ids()).collect();
        ids.len()
    };
    let waiting = Instant::now();
    while delivered() < 10 && waiting.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        delivered(),
        10,
        "events delivered in 30 s; the invocations' report: {:?}",
        sys.system.stats().deliver
    );
    let stats = sys.system.stats();
    assert_eq!(
        stats.stopped_invocations, 0,
        "an invocation outlived its deadline: {:?}",
        stats.deliver
    );
    sys.shutdown().await;
}

/// Control work never waits behind a bulk backlog: with 5,000 events queued for an endpoint
/// that takes 250 ms a request and gets one at a time (so every invocation is busy with them
/// until its deadline), a new subscription's validation handshake still completes at once: it
/// travels on the control queue, whose invocations are its own. Before, the handshake step was
/// queued behind the deliveries and the subscription stayed unvalidated for minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_does_not_wait_behind_a_backlog_of_deliveries() {
    let sys = TestSystem::start_with(0.01, |c| {
        c.delivery_concurrency =
            gridrelay_local::ConcurrencySettings::new(8, Some(1)).expect("valid limits");
    })
    .await;
    sys.topic("bulk").await;
    let slow = Subscriber::start(Vec::new(), Reply::Hang(Duration::from_millis(250))).await;
    let bulk = sys.subscribe(subscription("bulk", "slow", &slow.url)).await;
    let queue = SqsQueue::new(
        aws_sdk_sqs::Client::new(&sys.sdk),
        &sys.system.resources.delivery_queue_url,
        sys.system.queue_key.clone(),
    );
    // 500 messages of ten events each (as a fan-out packs them): few sends to the emulator,
    // and more than the invocations can get through in a minute.
    let now = chrono::Utc::now();
    let backlog: Vec<OutgoingMessage> = (0..500)
        .flat_map(|m| {
            let events = (0..10)
                .map(|e| {
                    let event = RawValue::from_string(format!(
                        r#"{{"id":"bulk-{m}-{e}","eventType":"Contoso.Bulk","subject":"/bulk","eventTime":"2026-11-27T00:00:00Z","data":{{}},"dataVersion":"1"}}"#
                    ))
                    .expect("JSON");
                    QueuedEvent::new(now, event)
                })
                .collect();
            DeliveryMessage::packed(&DeliveryHistory::new(&bulk), now, events)
        })
        .map(|message| OutgoingMessage {
            body: message.to_body().expect("body"),
            delay: Duration::ZERO,
            group: None,
        })
        .collect();
    let enqueueing = Instant::now();
    for result in queue.send_all(&backlog).await {
        result.expect("backlog enqueued");
    }
    println!("backlog enqueued in {:?}", enqueueing.elapsed());

    sys.topic("orders").await;
    let fresh = Subscriber::start(Vec::new(), Reply::Status(200)).await;
    let asked = Instant::now();
    sys.subscribe(subscription("orders", "fresh", &fresh.url))
        .await;
    let took = asked.elapsed();
    let left = sys
        .queue_depth(&sys.system.resources.delivery_queue_url)
        .await;
    println!("handshake after {took:?}, {left} deliveries still queued");
    let stopping = Instant::now();
    assert!(
        took < Duration::from_secs(10),
        "the handshake waited {took:?} behind the backlog"
    );
    assert!(
        left > 100,
        "the backlog was gone before the handshake ({left} left): the test proved nothing"
    );
    sys.shutdown().await;
    println!("stopped in {:?}", stopping.elapsed());
}
