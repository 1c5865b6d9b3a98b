//! End-to-end: bad input is refused whole and loses nothing; a poison message blocks nothing;
//! an unavailable dead-letter location is retried, then given up after four hours (L5).

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use gridrelay_adapters::aws::{SqsQueue, s3_client};
use gridrelay_adapters::http_sender::{HttpEventSender, SenderConfig};
use gridrelay_deliver::{Deliver, DeliverPorts, DeliverySettings};
use gridrelay_e2e::{
    Reply, Subscriber, TestSystem, delivery_message_for, events, eventually, payout_event,
    subscription,
};
use gridrelay_ports::{MessageQueue, OutgoingMessage, RandomJitter, SystemClock};
use gridrelay_shared::outbound::{AllowedNetworks, OutboundPolicy};
use gridrelay_shared::subscription::SubscriptionRequest;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// Publish errors: 401 for a missing or wrong key, 400 naming the event index and field, 413
/// past 1 MB, 404 for an unknown topic; a refused request enqueues nothing (F1, G1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_publish_requests_enqueue_nothing() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("guarded").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("guarded", "sub-1", &sub.url))
        .await;
    let good = events("g", 2).to_string().into_bytes();

    // The handshake ran through the deliver worker; count invocations from here.
    let invocations = sys.system.stats().deliver_invocations;
    let (status, body) = sys.publish_raw("guarded", None, good.clone()).await;
    assert_eq!(status, 401, "{body}");
    let (status, _) = sys
        .publish_raw("guarded", Some("wrong-key"), good.clone())
        .await;
    assert_eq!(status, 401);
    let (status, _) = sys
        .publish_raw("missing", Some(&topic.key1), good.clone())
        .await;
    assert_eq!(status, 404);

    let (status, body) = sys
        .publish_raw("guarded", Some(&topic.key1), b"[{\"id\": ".to_vec())
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("JSON array"), "{body}");

    let mut bad = events("g", 3);
    bad[2].as_object_mut().map(|o| o.remove("subject"));
    let (status, body) = sys
        .publish_raw("guarded", Some(&topic.key1), bad.to_string().into_bytes())
        .await;
    assert_eq!(status, 400);
    assert!(
        body.contains("events[2].subject"),
        "names index and field: {body}"
    );

    let mut big = events("g", 1);
    big[0]["data"] = json!({"blob": "x".repeat(1_100_000)});
    let (status, body) = sys
        .publish_raw("guarded", Some(&topic.key2), big.to_string().into_bytes())
        .await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("1048576"), "names the limit: {body}");

    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        sub.received().is_empty(),
        "a refused request delivered something"
    );
    assert_eq!(
        sys.queue_depth(&sys.system.resources.delivery_queue_url)
            .await,
        0
    );
    assert_eq!(
        sys.system.stats().deliver_invocations,
        invocations,
        "nothing was enqueued"
    );

    // The second key works too, and the same events go through once the request is good.
    let (status, _) = sys.publish_raw("guarded", Some(&topic.key2), good).await;
    assert_eq!(status, 200);
    sub.wait_for_requests(2, WAIT).await;
    sys.shutdown().await;
}

/// A message the handler cannot read is reported failed on its own; the good messages in the
/// same invocation are delivered and deleted, and SQS's redrive policy moves the poison aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_message_blocks_nothing_and_is_moved_aside() {
    // Moved aside after its second receive.
    let sys = TestSystem::start_with(0.01, |c| c.max_receive_count = 2).await;
    let topic = sys.topic("mixed").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("mixed", "sub-1", &sub.url))
        .await;

    let sqs = aws_sdk_sqs::Client::new(&sys.sdk);
    // Sealed, as gridrelay writes (an older version's body, say): one that is not is dropped
    // unseen (#34 item 2).
    let sent = SqsQueue::new(
        sqs.clone(),
        &sys.system.resources.delivery_queue_url,
        sys.system.queue_key.clone(),
    )
    .send_all(&[OutgoingMessage {
        body: "{not a delivery message".into(),
        delay: Duration::ZERO,
        group: None,
    }])
    .await;
    assert!(sent[0].is_ok(), "send poison: {sent:?}");
    sys.publish(&topic, &events("p", 3)).await;

    eventually(WAIT, "the good events", || async {
        (sub.event_count() >= 3).then_some(())
    })
    .await;
    let redrive = sys.system.resources.delivery_redrive_queue_url.clone();
    eventually(WAIT, "the poison message in the redrive queue", || async {
        (sys.queue_depth(&redrive).await == 1).then_some(())
    })
    .await;
    let moved = sqs
        .receive_message()
        .queue_url(&redrive)
        .send()
        .await
        .expect("receive from redrive queue");
    assert_eq!(moved.messages()[0].body(), Some("{not a delivery message"));
    assert_eq!(
        sys.queue_depth(&sys.system.resources.delivery_queue_url)
            .await,
        0
    );
    sys.shutdown().await;
}

/// The deliver handler, called directly with an SqsEvent (as Lambda calls it): only the
/// unreadable record is a batch-item failure; the good record's events are delivered (G1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_handler_reports_only_the_unreadable_record() {
    let sys = TestSystem::start(0.01).await;
    sys.topic("direct").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    let registered = sys
        .subscribe(subscription("direct", "sub-1", &sub.url))
        .await;
    let sqs = aws_sdk_sqs::Client::new(&sys.sdk);
    let state = || {
        Arc::new(gridrelay_adapters::aws::DynamoDeliveryStateStore::from_sdk(
            &sys.sdk,
            &sys.names.delivery_state_table,
        ))
    };
    let ports = DeliverPorts {
        store: Arc::clone(&sys.system.store),
        delivery_queue: Arc::new(SqsQueue::new(
            sqs.clone(),
            &sys.system.resources.delivery_queue_url,
            sys.system.queue_key.clone(),
        )),
        control_queue: Arc::new(SqsQueue::new(
            sqs.clone(),
            &sys.system.resources.control_queue_url,
            sys.system.queue_key.clone(),
        )),
        replay_queue: Arc::new(SqsQueue::new(
            sqs.clone(),
            &sys.system.resources.replay_queue_url,
            sys.system.queue_key.clone(),
        )),
        dead_letter_queue: Arc::new(SqsQueue::new(
            sqs.clone(),
            &sys.system.resources.dead_letter_queue_url,
            sys.system.queue_key.clone(),
        )),
        ordered_queue: Arc::new(SqsQueue::new(
            sqs,
            &sys.system.resources.ordered_queue_url,
            sys.system.queue_key.clone(),
        )),
        ordered_redrive_queue: None,
        resources: Arc::new(gridrelay_ports::memory::MemoryDestinations::default()),
        clock: Arc::new(SystemClock),
        jitter: Arc::new(RandomJitter),
        secrets: Arc::new(gridrelay_adapters::aws::SecretsManagerStore::from_sdk(
            &sys.sdk,
        )),
        state: state(),
        caps: state(),
        journal: Arc::new(gridrelay_ports::NoRecordStream),
        replays: Arc::new(gridrelay_ports::NoReplays),
        archive: Arc::new(gridrelay_ports::NoReplays),
    };
    let sender = HttpEventSender::new(SenderConfig::new(
        Duration::from_secs(5),
        32,
        OutboundPolicy::new(AllowedNetworks::loopback()),
    ))
    .expect("client");
    let deliver = Deliver::new(ports, Arc::new(sender), DeliverySettings::new(sys.scale));
    let good = delivery_message_for(
        &registered,
        serde_json::value::RawValue::from_string(r#"{"id":"direct-1","data":{}}"#.into())
            .expect("json"),
    );
    let record = |id: &str, body: String| {
        let mut m = SqsMessage::default();
        m.message_id = Some(id.to_string());
        m.body = Some(body);
        m
    };
    let mut event = SqsEvent::default();
    event.records = vec![
        record("poison", "[]".to_string()),
        record("good", good.to_body().expect("encode")),
        record("empty", String::new()),
    ];

    let outcome = deliver.handle(event).await;

    assert_eq!(
        outcome.failed_message_ids,
        vec!["poison".to_string(), "empty".to_string()]
    );
    assert_eq!(outcome.report.delivered, 1);
    assert_eq!(sub.received()[0].ids(), vec!["direct-1"]);
    let response = outcome.into_batch_response();
    assert_eq!(response.batch_item_failures.len(), 2);
    sys.shutdown().await;
}

/// #34 item 7, G1: JSON allows a raw U+FFFE or U+FFFF in a string, and SQS refuses message
/// bodies that hold one (the SQS adapter checks SQS's documented character set, as moto does
/// not). Such an event, and one whose string spells the character as an escape (which becomes
/// raw wherever an event is written again), is delivered with the same JSON value: as
/// published, converted to CloudEvents, and after a retry through the delivery queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn characters_sqs_refuses_are_delivered_as_the_same_json_value() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("nonchars").await;
    let as_is = Subscriber::start(vec![], Reply::Status(200)).await;
    let as_ce = Subscriber::start(vec![], Reply::Status(200)).await;
    let retried = Subscriber::start(vec![Reply::Status(500)], Reply::Status(200)).await;
    sys.subscribe(subscription("nonchars", "as-is", &as_is.url))
        .await;
    sys.subscribe(SubscriptionRequest {
        event_delivery_schema: Some("cloudeventschemav1_0".into()),
        ..subscription("nonchars", "as-ce", &as_ce.url)
    })
    .await;
    sys.subscribe(subscription("nonchars", "retried", &retried.url))
        .await;
    let mut published = events("nc", 1);
    published[0]["data"] = json!({ "raw": "a\u{FFFF}b\u{FFFE}", "escaped": "ESCAPED" });
    let body = published.to_string().replace("ESCAPED", "\\uFFFF");
    assert!(
        body.contains('\u{FFFF}') && body.contains("\\uFFFF"),
        "{body}"
    );
    let (status, answer) = sys
        .publish_raw("nonchars", Some(&topic.key1), body.into_bytes())
        .await;
    assert_eq!(status, 200, "{answer}");

    let data = |event: &serde_json::Value| {
        (
            event["data"]["raw"].as_str().map(str::to_string),
            event["data"]["escaped"].as_str().map(str::to_string),
        )
    };
    let expected = (
        Some("a\u{FFFF}b\u{FFFE}".to_string()),
        Some("\u{FFFF}".to_string()),
    );
    let got = as_is.wait_for_requests(1, WAIT).await;
    assert_eq!(data(&got[0].events[0]), expected);
    let got = as_ce.wait_for_requests(1, WAIT).await;
    assert_eq!(data(&got[0].events[0]), expected);
    let got = retried.wait_for_requests(2, WAIT).await;
    assert_eq!(data(&got[1].events[0]), expected, "after the retry");
    sys.shutdown().await;
}

/// #11 item 6: an event of 1 MB (as Event Grid takes them) is delivered whole, to an Event
/// Grid subscription and, converted, to a CloudEvents one, through SQS messages of up to
/// 1 MiB; one past the event limit is refused with 413 naming it, and nothing is enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_of_one_megabyte_is_delivered_whole() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("large").await;
    let eg = Subscriber::start(vec![], Reply::Status(200)).await;
    let ce = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("large", "as-is", &eg.url)).await;
    sys.subscribe(SubscriptionRequest {
        event_delivery_schema: Some("cloudeventschemav1_0".into()),
        ..subscription("large", "as-ce", &ce.url)
    })
    .await;
    let blob = "x".repeat(1_000_000);
    let mut big = events("mb", 1);
    big[0]["data"] = json!({ "blob": blob });
    assert!(big[0].to_string().len() > 1_000_000);
    sys.publish(&topic, &big).await;
    let got = eg.wait_for_requests(1, Duration::from_secs(30)).await;
    assert_eq!(
        got[0].events[0]["data"]["blob"].as_str().map(str::len),
        Some(1_000_000)
    );
    let got = ce.wait_for_requests(1, Duration::from_secs(30)).await;
    let body: serde_json::Value = serde_json::from_str(&got[0].body).expect("a CloudEvent");
    assert_eq!(body["data"]["blob"].as_str().map(str::len), Some(1_000_000));

    let mut too_big = events("over", 1);
    too_big[0]["data"] = json!({ "blob": "x".repeat(1_040_000) });
    let (status, answer) = sys
        .publish_raw("large", Some(&topic.key1), too_big.to_string().into_bytes())
        .await;
    assert_eq!(status, 413, "{answer}");
    let limit = gridrelay_shared::limits::MAX_EVENT_BYTES.to_string();
    assert!(
        answer.contains("events[0]") && answer.contains(&limit),
        "{answer}"
    );
    sys.shutdown().await;
}

/// Creates a bucket of its own, subscribes with it as the dead-letter location (registration
/// checks that it exists and takes a write), then deletes it: a location that disappeared.
async fn subscribe_then_delete_the_bucket(sys: &TestSystem, topic: &str, endpoint: &str) -> String {
    let s3 = s3_client(&sys.sdk);
    let bucket = format!("gone-{}", uuid::Uuid::new_v4().simple());
    s3.create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("create bucket");
    sys.subscribe(SubscriptionRequest {
        dead_letter_destination: Some(format!("s3://{bucket}/dl")),
        ..subscription(topic, "sub-1", endpoint)
    })
    .await;
    s3.delete_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("the check left the bucket empty, so it can be deleted");
    bucket
}

/// L5 (#11 item 5): a dead-letter bucket that does not exist is refused when the subscription
/// is created, naming the location, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_bucket_that_does_not_exist_is_refused_l5() {
    let sys = TestSystem::start(0.01).await;
    sys.topic("nowhere").await;
    let location = format!("s3://missing-{}/dl", uuid::Uuid::new_v4().simple());
    let refused = sys
        .registry()
        .register(
            &SubscriptionRequest {
                dead_letter_destination: Some(location.clone()),
                ..subscription("nowhere", "sub-1", "http://127.0.0.1:9/hook")
            },
            chrono::Utc::now(),
        )
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        refused.contains(&location) && refused.contains("does not exist"),
        "{refused}"
    );
    let stored = sys
        .system
        .store
        .list_subscriptions("nowhere")
        .await
        .expect("list");
    assert!(stored.is_empty());
    sys.shutdown().await;
}

/// L5: while the dead-letter location cannot be written (its bucket was deleted after the
/// subscription was made), the write is retried; once it has been unavailable for (scaled)
/// four hours, the events are dropped and counted, apart as a missing bucket too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_dead_letter_location_is_retried_then_dropped_after_four_hours_l5() {
    let scale = 0.001; // four hours → 14.4 s; write retries every second
    let sys = TestSystem::start(scale).await;
    let topic = sys.topic("lost").await;
    let sub = Subscriber::start(vec![], Reply::Status(400)).await;
    subscribe_then_delete_the_bucket(&sys, "lost", &sub.url).await;

    sys.publish(&topic, &events("u", 1)).await;
    sub.wait_for_requests(1, WAIT).await;
    sys.wait_for_stats("a deferred dead-letter write", |s| {
        s.dead_letter.records_deferred >= 1
    })
    .await;
    let deferred_at = std::time::Instant::now();
    let four_hours = Duration::from_secs_f64(4.0 * 3600.0 * scale);
    tokio::time::sleep(four_hours / 2).await;
    assert_eq!(
        sys.system.stats().dead_letter.records_dropped,
        0,
        "dropped before four hours"
    );
    assert!(
        sys.system.stats().dead_letter.records_deferred >= 2,
        "kept retrying"
    );

    eventually(
        Duration::from_secs(60),
        "the drop after four hours",
        || async { (sys.system.stats().dead_letter.records_dropped == 1).then_some(()) },
    )
    .await;
    assert_eq!(
        sys.system
            .stats()
            .dead_letter
            .records_dropped_bucket_missing,
        1
    );
    assert!(deferred_at.elapsed() >= four_hours - Duration::from_secs(2));
    sys.shutdown().await;
}

/// L5: a write that failed succeeds on a later try once the location is back; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_write_recovers_when_the_location_returns_l5() {
    let sys = TestSystem::start(0.001).await;
    let topic = sys.topic("later").await;
    let sub = Subscriber::start(vec![], Reply::Status(413)).await;
    let bucket = subscribe_then_delete_the_bucket(&sys, "later", &sub.url).await;

    sys.publish(&topic, &events("r", 1)).await;
    sys.wait_for_stats("a deferred dead-letter write", |s| {
        s.dead_letter.records_deferred >= 1
    })
    .await;
    let s3 = s3_client(&sys.sdk);
    s3.create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("create bucket");

    let found = eventually(WAIT, "the dead-letter object", || async {
        let listed = s3.list_objects_v2().bucket(&bucket).send().await.ok()?;
        let key = listed.contents().first()?.key()?.to_string();
        Some(key)
    })
    .await;
    assert!(found.starts_with("dl/later/sub-1/"), "{found}");
    // The object is visible in S3 a moment before the runner counts the write.
    let stats = sys
        .wait_for_stats("the write counted", |s| s.dead_letter.records_written >= 1)
        .await;
    assert_eq!(stats.dead_letter.records_written, 1);
    assert_eq!(stats.dead_letter.records_dropped, 0);
    sys.shutdown().await;
}

/// Item 2 of the life-cycle issue, on SQS: a received message handed to `retry_after` is
/// received again after that wait, not after its (here 60 s) visibility timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_message_comes_back_after_its_short_wait() {
    let sys = TestSystem::start(0.01).await;
    let sqs = aws_sdk_sqs::Client::new(&sys.sdk);
    let url = sys.system.resources.delivery_redrive_queue_url.clone();
    let queue = SqsQueue::new(sqs.clone(), &url, sys.system.queue_key.clone());
    let sent = queue
        .send_all(&[OutgoingMessage {
            body: "{}".into(),
            delay: Duration::ZERO,
            group: None,
        }])
        .await;
    assert!(sent[0].is_ok());
    let receive = || async {
        sqs.receive_message()
            .queue_url(&url)
            .visibility_timeout(60)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("receive")
            .messages
            .unwrap_or_default()
    };
    let first = receive().await;
    let receipt = first[0].receipt_handle().expect("receipt").to_string();
    queue
        .retry_after(&receipt, Duration::from_secs(1))
        .await
        .expect("visibility changed");
    let again = eventually(Duration::from_secs(10), "the message again", || async {
        let got = receive().await;
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(again[0].message_id(), first[0].message_id());
    sys.shutdown().await;
}

/// #34 item 2: `deliver` and `dead-letter` act only on messages gridrelay wrote. A delivery
/// message for a real subscription, written to the delivery queue by anyone but gridrelay
/// (no seal, or a seal under another key), and a dead-letter message written to the
/// dead-letter queue the same way, are dropped and counted: the subscriber never receives the
/// forged event, no dead-letter object is written, and neither message is left on its queue;
/// what gridrelay itself writes around them is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_gridrelay_did_not_write_are_dropped_unseen() {
    use gridrelay_shared::decision::DeadLetterReason;
    use gridrelay_shared::message::{DeadLetterEntry, DeadLetterMessage};
    use gridrelay_shared::queue_seal::{QueueKey, SEAL_ATTRIBUTE};
    use gridrelay_shared::subscription::DeadLetterDestination;

    let sys = TestSystem::start(0.01).await;
    let billing = sys.topic("billing").await;
    let payouts = Subscriber::start(vec![], Reply::Status(200)).await;
    let target = sys
        .subscribe(subscription("billing", "payouts", &payouts.url))
        .await;
    let forged = |id: &str| {
        delivery_message_for(&target, payout_event(id))
            .to_body()
            .expect("encode")
    };
    let dead_letter = DeadLetterMessage {
        topic: "billing".into(),
        subscription: "payouts".into(),
        subscription_id: target.id.clone(),
        schema: Default::default(),
        destination: DeadLetterDestination {
            bucket: sys.names.dead_letter_bucket.clone(),
            prefix: "forged".into(),
        },
        dead_lettered_at: chrono::Utc::now(),
        first_write_failure: None,
        delivery: None,
        entries: vec![DeadLetterEntry {
            reason: DeadLetterReason::MaxDeliveryAttemptsExceeded,
            delivery_attempts: 1,
            last_outcome: None,
            publish_time: chrono::Utc::now(),
            last_attempt_time: None,
            event: payout_event("forged-dead-letter"),
        }],
    }
    .to_body()
    .expect("encode");

    let sqs = aws_sdk_sqs::Client::new(&sys.sdk);
    let send = |queue: String, body: String, seal: Option<String>| {
        let request = sqs.send_message().queue_url(queue).message_body(body);
        let request = match seal {
            Some(seal) => request.message_attributes(
                SEAL_ATTRIBUTE,
                aws_sdk_sqs::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(seal)
                    .build()
                    .expect("attribute"),
            ),
            None => request,
        };
        async move { request.send().await.expect("sent") }
    };
    let resources = &sys.system.resources;
    send(
        resources.delivery_queue_url.clone(),
        forged("unsealed"),
        None,
    )
    .await;
    let other_key = QueueKey::new(&QueueKey::generate_text(), chrono::Utc::now()).expect("key");
    let body = forged("sealed-by-another-key");
    let seal = other_key.seal(&body);
    send(resources.delivery_queue_url.clone(), body, Some(seal)).await;
    send(resources.dead_letter_queue_url.clone(), dead_letter, None).await;

    // What gridrelay writes around them goes through; they never do.
    sys.publish(&billing, &events("real", 1)).await;
    payouts.wait_for_requests(1, WAIT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ids: Vec<String> = payouts.received().iter().flat_map(|r| r.ids()).collect();
    assert_eq!(ids, ["real-0"], "only the real event");
    let stats = sys
        .wait_for_stats("the three messages dropped", |s| s.unsealed_dropped >= 3)
        .await;
    assert_eq!(stats.unsealed_dropped, 3);
    assert!(sys.dead_letter_objects("forged").await.is_empty());
    for queue in [
        &resources.delivery_queue_url,
        &resources.dead_letter_queue_url,
        &resources.delivery_redrive_queue_url,
        &resources.dead_letter_redrive_queue_url,
    ] {
        assert_eq!(
            sys.queue_depth(queue).await,
            0,
            "{queue}: dropped, not left"
        );
    }
    assert_eq!(sys.system.stats().unsealed_dropped, 3);
    sys.shutdown().await;
}

/// #35: a journal that is down costs no delivery. With every journal write answered 500 (the
/// SDK's own retries included), every event is still delivered, and the entries not written
/// are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_that_is_down_costs_no_delivery_g1() {
    let proxy = gridrelay_e2e::fault_proxy::FaultProxy::start(rand::random()).await;
    proxy.set_rules(vec![
        gridrelay_e2e::fault_proxy::FaultRule::server_error("firehose", 1.0).only("PutRecordBatch"),
    ]);
    let sys = TestSystem::start_behind(&proxy, 0.01, |_| {}).await;
    let topic = sys.topic("unjournaled").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("unjournaled", "sub-1", &sub.url))
        .await;

    sys.publish(&topic, &events("u", 20)).await;
    eventually(WAIT, "20 events delivered", || async {
        (sub.event_count() >= 20).then_some(())
    })
    .await;
    let stats = sys
        .wait_for_stats("the unwritten entries counted", |s| {
            s.deliver.delivered >= 20 && s.deliver.journal_unwritten >= 40
        })
        .await;
    assert_eq!(stats.deliver.delivered, 20);
    assert_eq!(stats.deliver.failed_messages, 0);
    assert!(proxy.refused("firehose") > 0, "{}", proxy.report());
    sys.shutdown().await;
}
