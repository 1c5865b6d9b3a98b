//! End-to-end, #34 item 10: AWS throttling and failing on the wire. A [`FaultProxy`] in front of
//! the emulator answers chosen calls with each service's own throttling or internal error (or
//! holds them); every other call reaches the emulator. The SDK retries some of these itself
//! (three attempts by default), the rest reach gridrelay's code, which must lose nothing (G1).

use std::collections::BTreeSet;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_sdk_sqs::error::ProvideErrorMetadata;
use gridrelay_e2e::fault_proxy::{FaultProxy, FaultRule, SERVICES};
use gridrelay_e2e::{Reply, Subscriber, TestSystem, eventually, sdk_config_through, subscription};
use gridrelay_local::RunnerStats;
use gridrelay_shared::delivery_attributes::DeliveryAttributeRequest;
use gridrelay_shared::filter::EventFilter;
use gridrelay_shared::subscription::SubscriptionRequest;
use serde_json::{Value, json};

/// The services the stack itself calls (the destinations' are throttled in `resources.rs`).
const STACK_SERVICES: [&str; 4] = ["sqs", "dynamodb", "s3", "secretsmanager"];

/// A seed for the proxy's draws: `FAULT_SEED` to repeat a run, or a new one (printed).
fn seed() -> u64 {
    let seed = std::env::var("FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("FAULT_SEED={seed}");
    seed
}

/// The error code and HTTP status of a failed SDK call.
fn code_and_status<E: ProvideErrorMetadata, R>(
    result: Result<R, aws_sdk_sqs::error::SdkError<E, aws_sdk_sqs::config::http::HttpResponse>>,
) -> (String, u16) {
    match result {
        Ok(_) => ("went through".to_string(), 200),
        Err(e) => (
            e.code().unwrap_or("no code").to_string(),
            e.raw_response().map_or(0, |r| r.status().as_u16()),
        ),
    }
}

/// The proxy answers each service's calls with the error that service sends when it throttles
/// or fails, in its own protocol, so the SDK reads the code AWS would give: SQS (JSON,
/// query-compatible) `RequestThrottled`, DynamoDB and Kinesis
/// `ProvisionedThroughputExceededException`, Secrets Manager and EventBridge
/// `ThrottlingException` (400), SNS (query/XML) `Throttled` (429), S3 (REST/XML) `SlowDown`
/// (503), Lambda (REST/JSON) `TooManyRequestsException` (429) and Firehose
/// `ServiceUnavailableException` (503); and 5xx internal errors. With
/// no rule, the same calls reach the emulator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_gets_its_own_throttling_and_internal_errors() {
    let proxy = FaultProxy::start(seed()).await;
    let sdk = sdk_config_through(&proxy.url())
        .await
        .to_builder()
        .retry_config(RetryConfig::disabled())
        .build();
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
    let s3 = gridrelay_adapters::aws::s3_client(&sdk);
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let sns = aws_sdk_sns::Client::new(&sdk);
    let events = aws_sdk_eventbridge::Client::new(&sdk);
    let kinesis = aws_sdk_kinesis::Client::new(&sdk);
    let lambda = aws_sdk_lambda::Client::new(&sdk);
    let firehose = aws_sdk_firehose::Client::new(&sdk);

    // One call of each service, as its error: (code, HTTP status).
    macro_rules! calls {
        () => {
            [
                code_and_status(sqs.list_queues().send().await),
                code_and_status(dynamodb.list_tables().send().await),
                code_and_status(s3.list_buckets().send().await),
                code_and_status(secrets.list_secrets().send().await),
                code_and_status(sns.list_topics().send().await),
                code_and_status(events.list_event_buses().send().await),
                code_and_status(kinesis.list_streams().send().await),
                code_and_status(lambda.list_functions().send().await),
                code_and_status(firehose.list_delivery_streams().send().await),
            ]
        };
    }
    proxy.set_rules(SERVICES.map(|s| FaultRule::throttle(s, 1.0)).to_vec());
    let throttled = calls!();
    let expected = [
        ("RequestThrottled", 400),
        ("ProvisionedThroughputExceededException", 400),
        ("SlowDown", 503),
        ("ThrottlingException", 400),
        ("Throttled", 429),
        ("ThrottlingException", 400),
        ("ProvisionedThroughputExceededException", 400),
        ("TooManyRequestsException", 429),
        ("ServiceUnavailableException", 503),
    ]
    .map(|(c, s)| (c.to_string(), s));
    assert_eq!(throttled, expected);

    proxy.set_rules(SERVICES.map(|s| FaultRule::server_error(s, 1.0)).to_vec());
    let failed = calls!();
    let expected = [
        ("InternalFailure", 500),
        ("InternalServerError", 500),
        ("InternalError", 500),
        ("InternalFailure", 500),
        ("InternalError", 500),
        ("InternalFailure", 500),
        ("InternalFailure", 500),
        ("ServiceException", 500),
        ("InternalFailure", 500),
    ]
    .map(|(c, s)| (c.to_string(), s));
    assert_eq!(failed, expected);

    proxy.set_rules(Vec::new());
    sqs.list_queues()
        .send()
        .await
        .expect("through to the emulator");
    dynamodb
        .list_tables()
        .send()
        .await
        .expect("through to the emulator");
    for service in SERVICES {
        assert_eq!(proxy.refused(service), 2, "{service}:\n{}", proxy.report());
    }
    let passed: u64 = proxy.counts().values().map(|c| c.passed).sum();
    assert_eq!(passed, 2, "{}", proxy.report());
}

/// G1 under AWS faults: with a fifth of the stack's SQS, DynamoDB, S3 and Secrets Manager calls
/// throttled, a twentieth failing with a 5xx and some held for 300 ms, every event a publish
/// was answered 200 for is delivered to the healthy subscriber (whose delivery header is a
/// secret, read on every invocation), and every one a subscriber that refuses (400) filters in
/// is dead-lettered to S3. A publish answered 5xx is sent again whole, as a publisher does; duplicates are
/// allowed, loss is not. Faults must have been injected on every one of the four services, or
/// the test proves nothing and fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stack_whose_aws_calls_are_throttled_or_fail_loses_no_event_g1() {
    let proxy = FaultProxy::start(seed()).await;
    let sys = TestSystem::start_behind(&proxy, 0.01, |c| {
        // Every invocation reads the subscription and its secret again.
        c.config_cache = Duration::ZERO;
        // Long enough for the SDK's three attempts and their backoff (about 1 s, then 2 s) to
        // end inside an invocation, so a refused write is handled, not cut at the deadline.
        c.visibility_timeout = Duration::from_secs(8);
        c.function_timeout = Duration::from_secs(8);
        // The stack's receive count before a message is parked: with a fifth of all calls
        // refused, a message whose invocations fail a few times (a re-enqueue refused, a
        // deadline reached on a loaded machine) is parked in the redrive queue, which keeps it
        // but does not deliver it. A CI run of tests/it, six at a time, with the test system's
        // 2 then, had f-0-0 not dead-lettered after 120 s, as a parked message would be.
        c.max_receive_count = gridrelay_local::DEFAULT_MAX_RECEIVE_COUNT;
    })
    .await;
    let topic = sys.topic("orders").await;
    let healthy = Subscriber::start(Vec::new(), Reply::Status(200)).await;
    let refusing = Subscriber::start(Vec::new(), Reply::Status(400)).await;
    sys.subscribe(SubscriptionRequest {
        delivery_attributes: vec![DeliveryAttributeRequest {
            name: "Authorization".into(),
            value: "Bearer s3cret".into(),
            is_secret: true,
            dynamic: false,
        }],
        ..subscription("orders", "healthy", &healthy.url)
    })
    .await;
    // One event of each publish (six in all): fewer failures than delay an endpoint (D1), so
    // each is dead-lettered at its first attempt rather than held.
    sys.subscribe(SubscriptionRequest {
        dead_letter_destination: Some(sys.dead_letter_url("refused")),
        filter: EventFilter {
            subject_begins_with: Some("/orders/0".into()),
            ..EventFilter::default()
        },
        ..subscription("orders", "refusing", &refusing.url)
    })
    .await;

    let held = Duration::from_millis(300);
    // The first three of some calls are refused: as many as the SDK's own attempts, so the
    // error surely reaches gridrelay's code (a publish answered 503, a dead-letter write
    // deferred; a read of a subscription, its secret or an endpoint's health that failed).
    let mut rules = vec![
        FaultRule::throttle("sqs", 1.0)
            .only("SendMessageBatch")
            .first(3),
        FaultRule::throttle("dynamodb", 1.0)
            .only("GetItem")
            .first(3),
        FaultRule::server_error("secretsmanager", 1.0).first(3),
        // Dead-letter writes run side by side (up to six here): enough refusals that the
        // first ones all exhaust the SDK's attempts.
        FaultRule::throttle("s3", 1.0).only("PutObject").first(18),
    ];
    rules.extend(STACK_SERVICES.into_iter().flat_map(|s| {
        [
            FaultRule::throttle(s, 0.2),
            FaultRule::server_error(s, 0.05),
            FaultRule::delay(s, held, 0.05),
        ]
    }));
    proxy.set_rules(rules);
    let mut accepted = BTreeSet::new();
    let mut answered_5xx = 0;
    for round in 0..6 {
        let batch: Vec<Value> = (0..10)
            .map(|i| {
                json!({
                    "id": format!("f-{round}-{i}"),
                    "eventType": "Contoso.Orders.Created",
                    "subject": format!("/orders/{i}"),
                    "eventTime": chrono::Utc::now().to_rfc3339(),
                    "data": {"order": i},
                    "dataVersion": "1"
                })
            })
            .collect();
        // Sent again until accepted, as a publisher does with a 5xx.
        loop {
            let body = serde_json::to_vec(&batch).expect("JSON");
            let (status, _) = sys.publish_raw(&topic.name, Some(&topic.key1), body).await;
            assert!(status == 200 || status >= 500, "publish answered {status}");
            if status == 200 {
                break;
            }
            answered_5xx += 1;
            assert!(
                answered_5xx < 20,
                "publishes kept failing\n{}",
                proxy.report()
            );
        }
        accepted.extend(batch.iter().map(|e| e["id"].as_str().unwrap().to_string()));
    }

    let delivered = eventually(
        Duration::from_secs(120),
        "every event delivered",
        || async {
            let got: BTreeSet<String> = healthy.received().iter().flat_map(|r| r.ids()).collect();
            accepted.is_subset(&got).then_some(got)
        },
    )
    .await;
    assert!(
        healthy
            .received()
            .iter()
            .all(|r| r.header("authorization") == Some("Bearer s3cret")),
        "every delivery carried the secret header"
    );
    let dead_lettered = || async {
        sys.dead_letter_objects("refused")
            .await
            .into_iter()
            .flat_map(|(_, records)| records)
            .filter_map(|r| r["id"].as_str().map(str::to_string))
            .collect::<BTreeSet<String>>()
    };
    let refused: BTreeSet<String> = accepted
        .iter()
        .filter(|id| id.ends_with("-0"))
        .cloned()
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut dead = dead_lettered().await;
    while !refused.is_subset(&dead) {
        if std::time::Instant::now() >= deadline {
            let resources = &sys.system.resources;
            panic!(
                "not dead-lettered: {:?}\nparked: {} delivery, {} dead-letter messages\n{:?}\n{:?}\n{}",
                refused.difference(&dead).collect::<Vec<_>>(),
                sys.queue_depth(&resources.delivery_redrive_queue_url).await,
                sys.queue_depth(&resources.dead_letter_redrive_queue_url)
                    .await,
                sys.system.stats().deliver,
                sys.system.stats().dead_letter,
                proxy.report()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        dead = dead_lettered().await;
    }
    println!("{}", proxy.report());
    for service in STACK_SERVICES {
        assert!(
            proxy.refused(service) > 0,
            "no {service} call was refused: the test proved nothing\n{}",
            proxy.report()
        );
    }
    // The faults reached gridrelay's own handling, not only the SDK's retries. (An
    // invocation's counts are added when it returns, after its writes.)
    let stats = sys
        .wait_for_stats("the dead-letter writes counted", |s| {
            s.dead_letter.records_written >= refused.len()
        })
        .await;
    assert!(answered_5xx > 0, "no publish was answered 5xx");
    // A refused write is deferred (L5), or, when the SDK's backoff ran into the invocation's
    // deadline, given up and its message failed to come back: either way the refusal reached
    // gridrelay, and nothing was lost (above).
    assert!(proxy.refused("s3") >= 18, "{}", proxy.report());
    assert!(
        stats.dead_letter.records_deferred
            + stats.dead_letter.failed_messages
            + stats.stopped_invocations
            > 0,
        "no dead-letter write failed: {:?}",
        stats.dead_letter
    );
    println!(
        "accepted {}, delivered {}, dead-lettered {}; publishes answered 5xx {answered_5xx}",
        accepted.len(),
        delivered.len(),
        dead.len()
    );
    sys.shutdown().await;
}

/// A system whose invocations may run 4 s (their messages hidden as long), its AWS calls
/// through a fault proxy with no rule yet.
async fn behind_proxy_with_4_s_invocations() -> (FaultProxy, TestSystem) {
    let proxy = FaultProxy::start(seed()).await;
    let sys = TestSystem::start_behind(&proxy, 0.01, |c| {
        c.function_timeout = Duration::from_secs(4);
        c.visibility_timeout = Duration::from_secs(4);
    })
    .await;
    (proxy, sys)
}

/// One Event Grid event, `id`, in a publish's array.
fn one_event(id: &str) -> Value {
    json!([{
        "id": id,
        "eventType": "Contoso.Slow",
        "subject": "/slow",
        "eventTime": chrono::Utc::now().to_rfc3339(),
        "data": {},
        "dataVersion": "1"
    }])
}

/// Waits until a record was given up at its invocation's deadline (`failed`: the function's
/// failed messages) or an invocation was stopped there, and asserts none was stopped.
async fn given_up_not_stopped(sys: &TestSystem, failed: fn(&RunnerStats) -> usize) {
    let stats = sys
        .wait_for_stats("a record given up at the deadline", |s| {
            failed(s) >= 1 || s.stopped_invocations > 0
        })
        .await;
    assert_eq!(
        stats.stopped_invocations, 0,
        "an invocation outlived its deadline: {:?}\n{:?}",
        stats.deliver, stats.dead_letter
    );
}

/// #34 item 12, G1: a `deliver` invocation returns before its deadline however slowly SQS
/// answers. The re-enqueue of a failed attempt's retry is held by SQS for longer than the
/// invocation has left: the invocation gives the write up one second (`REPLY_MARGIN`) before
/// its deadline and fails the record, which SQS gives back and the next invocation delivers.
/// Before, the invocation was stopped at its deadline and its whole batch came back after the
/// visibility timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deliver_invocation_whose_enqueue_is_slow_returns_before_its_deadline_g1() {
    let (proxy, sys) = behind_proxy_with_4_s_invocations().await;
    let topic = sys.topic("slow-sqs").await;
    let subscriber = Subscriber::start(vec![Reply::Status(500)], Reply::Status(200)).await;
    sys.subscribe(subscription("slow-sqs", "flaky", &subscriber.url))
        .await;
    // The publish's write and the retry's are held 6 s: longer than the invocation's 4 s.
    proxy.set_rules(vec![
        FaultRule::delay("sqs", Duration::from_secs(6), 1.0)
            .only("SendMessageBatch")
            .first(2),
    ]);
    sys.publish(&topic, &one_event("slow-1")).await;
    eventually(Duration::from_secs(60), "the event delivered", || async {
        subscriber
            .received()
            .iter()
            .any(|r| r.reply == Reply::Status(200) && r.ids().iter().any(|id| id == "slow-1"))
            .then_some(())
    })
    .await;
    let delayed: u64 = proxy.counts().values().map(|c| c.delayed).sum();
    assert_eq!(delayed, 2, "{}", proxy.report());
    given_up_not_stopped(&sys, |s| s.deliver.failed_messages).await;
    sys.shutdown().await;
}

/// #34 item 12, L3, G1: a `dead-letter` invocation returns before its deadline however slowly
/// S3 answers. Its first object write is held for longer than the invocation has left: the
/// write is given up one second before the deadline and its message fails, comes back from
/// SQS and is written by the next invocation. Before, the invocation was stopped at its
/// deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_invocation_whose_write_is_slow_returns_before_its_deadline_g1() {
    let (proxy, sys) = behind_proxy_with_4_s_invocations().await;
    let topic = sys.topic("slow-s3").await;
    let refusing = Subscriber::start(Vec::new(), Reply::Status(400)).await;
    sys.subscribe(SubscriptionRequest {
        dead_letter_destination: Some(sys.dead_letter_url("slow")),
        ..subscription("slow-s3", "refusing", &refusing.url)
    })
    .await;
    proxy.set_rules(vec![
        FaultRule::delay("s3", Duration::from_secs(6), 1.0)
            .only("PutObject")
            .first(1),
    ]);
    sys.publish(&topic, &one_event("slow-dead-1")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let written: Vec<String> = sys
            .dead_letter_objects("slow")
            .await
            .into_iter()
            .flat_map(|(_, records)| records)
            .filter_map(|r| r["id"].as_str().map(str::to_string))
            .collect();
        if written.iter().any(|id| id == "slow-dead-1") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not dead-lettered: {:?}\n{}",
            sys.system.stats().dead_letter,
            proxy.report()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    given_up_not_stopped(&sys, |s| s.dead_letter.failed_messages).await;
    assert_eq!(
        proxy.counts().values().map(|c| c.delayed).sum::<u64>(),
        1,
        "{}",
        proxy.report()
    );
    sys.shutdown().await;
}
