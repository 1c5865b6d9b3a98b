//! The `gridrelay` command line, run as a user runs it.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::Duration;

use gridrelay_adapters::aws::SqsQueue;
use gridrelay_e2e::{Reply, Subscriber, TestSystem, events, subscription};
use gridrelay_local::ResourceNames;
use gridrelay_ports::{MessageQueue, OutgoingMessage};
use gridrelay_shared::message::{DeliveryHistory, DeliveryMessage, QueuedEvent};
use gridrelay_shared::subscription::SubscriptionRequest;
use serde_json::Value;

mod console;
mod portal;

/// The command line; with `resources`, pointed at them as an operator's environment would.
fn gridrelay(args: &[&str], resources: Option<&ResourceNames>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gridrelay"));
    cmd.args(args);
    if let Some(names) = resources {
        cmd.envs(names.cli_env());
    }
    cmd.output().expect("gridrelay runs")
}

/// What `page` shows in its `<pre id="{id}">` (a rotation's new secret, a portal link).
fn shown(page: &str, id: &str) -> String {
    page.split_once(&format!(r#"id="{id}""#))
        .and_then(|(_, rest)| rest.split_once('>'))
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(secret, _)| secret.trim().to_string())
        .unwrap_or_else(|| panic!("no #{id} shown: {page}"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "failed: {}", stderr(o));
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

/// #37 item 6: `gridrelay local`'s errors say what is wrong first. A setting it refuses is named
/// (exit 2) with no guess about the emulator, which is not even tried; an emulator that does
/// not answer is named by its URL, and only then is the user sent to start it.
#[test]
fn local_names_what_is_wrong_before_guessing_at_the_emulator() {
    let local = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gridrelay"));
        cmd.args(["local", "--listen", "127.0.0.1:0"])
            .args(extra)
            // Nothing listens on port 9 of 127.0.0.1.
            .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing");
        cmd.output().expect("gridrelay runs")
    };
    let out = local(&["--visibility-timeout", "5"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("invalid --visibility-timeout: --visibility-timeout is 5 s")
            && err.contains("--function-timeout (300 s)"),
        "{err}"
    );
    assert!(!err.contains("AWS API"), "{err}");

    // #38: a batch AWS's event source would refuse.
    let out = local(&["--delivery-batch-size", "100"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--delivery-batch-size is 100")
            && err.contains("1 to 10 with a batching window of 0 s"),
        "{err}"
    );
    assert!(!err.contains("AWS API"), "{err}");

    let out = local(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the AWS API at http://127.0.0.1:9 (AWS_ENDPOINT_URL) did not answer"),
        "{err}"
    );
}

/// B4, R5: out-of-range values are refused before anything is stored, and the error names the
/// flag, the value and the allowed range.
#[test]
fn out_of_range_flags_are_refused_with_flag_value_and_range_b4_r5() {
    let base = create_args("audit", "http://127.0.0.1:9/hook");
    let cases: [(&str, &str, &str); 19] = [
        // O1.
        ("--ordering-key", "id", "subject, or data.FIELD"),
        ("--ordering-key", "data.a..b", "subject, or data.FIELD"),
        ("--max-concurrent-requests", "0", "1 to 1000"),
        ("--max-concurrent-requests", "1001", "1 to 1000"),
        ("--max-events-per-second", "-1", "1 to 100000"),
        ("--max-events-per-second", "100001", "1 to 100000"),
        ("--event-delivery-schema", "xml", "custominputschema"),
        ("--max-events-per-batch", "0", "1 to 5000"),
        ("--max-events-per-batch", "5001", "1 to 5000"),
        ("--preferred-batch-size-in-kilobytes", "1025", "1 to 1024"),
        ("--preferred-batch-size-in-kilobytes", "-4", "1 to 1024"),
        ("--max-delivery-attempts", "31", "1 to 30"),
        ("--event-ttl", "0", "1 to 1440"),
        ("--event-ttl", "1441", "1 to 1440"),
        ("--journal-answer-bytes", "1025", "0 to 1024"),
        ("--journal-answer-bytes", "-1", "0 to 1024"),
        (
            "--deadletter-endpoint",
            "https://example.com/x",
            "s3://BUCKET",
        ),
        ("--advanced-filter", "NumberLessThan", "exactly one number"),
        ("--advanced-filter", "Like", "StringNotEndsWith"),
    ];
    for (flag, value, range) in cases {
        let mut args = base.clone();
        if flag == "--advanced-filter" {
            args.extend([flag, "data.size", value, "1", "2"]);
        } else {
            args.extend([flag, value]);
        }
        let out = gridrelay(&args, None);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag), "names the flag: {err}");
        assert!(err.contains(value), "names the value: {err}");
        assert!(err.contains(range), "names the range: {err}");
    }
    // H1: at most 10 headers, values at most 4096 bytes.
    let long = "v".repeat(4097);
    let mut eleven = base.clone();
    let names: Vec<String> = (0..11).map(|i| format!("X-{i}")).collect();
    for n in &names {
        eleven.extend(["--delivery-attribute-mapping", n, "static", "v"]);
    }
    let mut too_long = base.clone();
    too_long.extend(["--delivery-attribute-mapping", "X-Big", "static", &long]);
    for (args, allowed) in [(eleven, "at most 10"), (too_long, "at most 4096 bytes")] {
        let out = gridrelay(&args, None);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("--delivery-attribute-mapping") && err.contains(allowed),
            "{err}"
        );
    }
    let topic_cases: [(&[&str], &str, &str); 5] = [
        (&["--retention-days", "366"], "--retention-days", "0 to 365"),
        // P1.
        (
            &["--dedup-window-seconds", "301"],
            "--dedup-window-seconds",
            "0 (off) to 300 seconds",
        ),
        (
            &["--input-schema", "yaml"],
            "--input-schema",
            "customeventschema",
        ),
        (
            &[
                "--input-schema",
                "customeventschema",
                "--input-mapping-fields",
                "color=c",
            ],
            "--input-mapping-fields",
            "eventtype",
        ),
        (
            &["--input-mapping-default-values", "subject=s"],
            "--input-mapping-fields",
            "only with inputSchema customeventschema",
        ),
    ];
    for (extra, flag, allowed) in topic_cases {
        let mut args = vec!["topic", "create", "--name", "orders"];
        args.extend(extra);
        let out = gridrelay(&args, None);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(flag) && err.contains(allowed), "{err}");
    }
}

/// Topics and subscriptions through the command line, stored in DynamoDB (the emulator).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_and_subscription_lifecycle_c1() {
    let sdk = gridrelay_e2e::sdk_config().await;
    let prefix = format!("c{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let names = ResourceNames::with_prefix(&prefix);
    gridrelay_local::provision(&sdk, &names, 5)
        .await
        .expect("provision");
    let resources = Some(&names);

    let topic = json(&gridrelay(
        &["topic", "create", "--name", "orders"],
        resources,
    ));
    assert_eq!(
        topic["endpoint"],
        "http://127.0.0.1:7071/topics/orders/api/events"
    );
    assert_eq!(topic["key1"].as_str().map(str::len), Some(44));
    assert_ne!(topic["key1"], topic["key2"]);
    let again = gridrelay(&["topic", "create", "--name", "orders"], resources);
    assert!(!again.status.success() && stderr(&again).contains("already exists"));

    let shown = json(&gridrelay(
        &["topic", "show", "--name", "orders"],
        resources,
    ));
    assert!(shown.get("key1").is_none(), "show does not print keys");
    let keys = json(&gridrelay(
        &["topic", "key", "list", "--name", "orders"],
        resources,
    ));
    assert_eq!(keys["key1"], topic["key1"]);

    let sub = json(&gridrelay(
        &[
            "event-subscription",
            "create",
            "--topic-name",
            "orders",
            "--name",
            "audit",
            "--endpoint",
            "https://hooks.example.com/audit",
            "--no-wait",
            "--max-events-per-batch",
            "100",
            "--max-delivery-attempts",
            "5",
            "--event-ttl",
            "60",
            "--max-concurrent-requests",
            "8",
            "--max-events-per-second",
            "250",
            "--deadletter-endpoint",
            &format!("s3://{}/orders", names.dead_letter_bucket),
            "--delivery-attribute-mapping",
            "X-Team",
            "static",
            "payments",
            "--delivery-attribute-mapping",
            "Authorization",
            "static",
            "Bearer cli-secret-value",
            "secret",
        ],
        resources,
    ));
    // H1: a secret value is never printed.
    assert!(!sub.to_string().contains("cli-secret-value"), "{sub}");
    let mappings = &sub["destination"]["deliveryAttributeMappings"];
    assert_eq!(mappings[0]["value"], "payments");
    assert_eq!(mappings[1]["isSecret"], true);
    // The handshake is the service's: the CLI stores `Creating` and asks on the control queue
    // (#34 item 12; with --no-wait it does not wait for the answer).
    assert_eq!(sub["provisioningState"], "Creating");
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue_url = sqs
        .get_queue_url()
        .queue_name(&names.control_queue)
        .send()
        .await
        .expect("queue")
        .queue_url
        .expect("url");
    let asked = sqs
        .receive_message()
        .queue_url(&queue_url)
        .wait_time_seconds(2)
        .send()
        .await
        .expect("receive");
    let body = asked.messages()[0].body().unwrap_or_default();
    assert!(
        body.starts_with(r#"{"validation":"#) && body.contains("Handshake"),
        "{body}"
    );
    assert_eq!(sub["destination"]["maxEventsPerBatch"], 100);
    assert_eq!(
        sub["destination"]["preferredBatchSizeInKilobytes"], 64,
        "B4 default"
    );
    assert_eq!(sub["retryPolicy"]["maxDeliveryAttempts"], 5);
    assert_eq!(sub["retryPolicy"]["eventTimeToLiveInMinutes"], 60);
    assert_eq!(
        sub["deliveryCaps"],
        serde_json::json!({"maxConcurrentRequests": 8, "maxEventsPerSecond": 250})
    );
    assert_eq!(
        sub["deadLetterDestination"]["bucket"],
        names.dead_letter_bucket.as_str()
    );
    // L5: a dead-letter bucket that does not exist is refused, naming the flag and the value.
    let missing = gridrelay(
        &[
            "event-subscription",
            "create",
            "--topic-name",
            "orders",
            "--name",
            "nowhere",
            "--endpoint",
            "https://hooks.example.com/audit",
            "--deadletter-endpoint",
            "s3://no-such-bucket-gridrelay/x",
        ],
        resources,
    );
    let err = stderr(&missing);
    assert_eq!(missing.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--deadletter-endpoint")
            && err.contains("s3://no-such-bucket-gridrelay/x")
            && err.contains("does not exist"),
        "{err}"
    );

    let missing_topic = gridrelay(
        &[
            "event-subscription",
            "create",
            "--topic-name",
            "nope",
            "--name",
            "x-1",
            "--endpoint",
            "http://h/x",
        ],
        resources,
    );
    assert!(stderr(&missing_topic).contains("topic nope does not exist"));

    // F2: a CloudEvents topic's subscriptions cannot ask for the Event Grid schema.
    let ce_topic = json(&gridrelay(
        &[
            "topic",
            "create",
            "--name",
            "ce-orders",
            "--input-schema",
            "CloudEventSchemaV1_0",
        ],
        resources,
    ));
    assert_eq!(ce_topic["inputSchema"], "CloudEventSchemaV1_0");
    let mismatch = gridrelay(
        &[
            "event-subscription",
            "create",
            "--topic-name",
            "ce-orders",
            "--name",
            "eg-sub",
            "--endpoint",
            "http://h/x",
            "--event-delivery-schema",
            "eventgridschema",
        ],
        resources,
    );
    assert_eq!(mismatch.status.code(), Some(2));
    assert!(
        stderr(&mismatch).contains("--event-delivery-schema")
            && stderr(&mismatch).contains("CloudEventSchemaV1_0"),
        "{}",
        stderr(&mismatch)
    );
    json(&gridrelay(
        &["topic", "delete", "--name", "ce-orders"],
        resources,
    ));

    let shown = json(&gridrelay(
        &[
            "event-subscription",
            "show",
            "--topic-name",
            "orders",
            "--name",
            "audit",
        ],
        resources,
    ));
    // `show` adds how delivery goes (#11 item 14); the rest is what `create` printed.
    let mut shown = shown;
    assert_eq!(
        shown["deliveryStatus"]["endpoint"]["state"], "Healthy",
        "{shown}"
    );
    assert_eq!(
        shown["deliveryStatus"]["host"]["state"], "Healthy",
        "{shown}"
    );
    shown
        .as_object_mut()
        .expect("an object")
        .remove("deliveryStatus");
    assert_eq!(shown, sub);
    let listed = json(&gridrelay(
        &["event-subscription", "list", "--topic-name", "orders"],
        resources,
    ));
    assert_eq!(listed.as_array().map(Vec::len), Some(1));

    let busy = gridrelay(&["topic", "delete", "--name", "orders"], resources);
    assert!(stderr(&busy).contains("still has event subscriptions"));
    json(&gridrelay(
        &[
            "event-subscription",
            "delete",
            "--topic-name",
            "orders",
            "--name",
            "audit",
        ],
        resources,
    ));
    json(&gridrelay(
        &["topic", "delete", "--name", "orders"],
        resources,
    ));
    let listed = json(&gridrelay(&["topic", "list"], resources));
    assert_eq!(listed, serde_json::json!([]));
}

/// Item 2 of the life-cycle issue, L2, G1: `gridrelay redrive`, as an operator runs it against
/// a running system. An event dead-lettered after its one allowed attempt failed is, once the
/// subscriber is fixed, delivered again by `redrive dead-letters` (its dry run moving
/// nothing), and its object is gone; a message parked in the delivery redrive queue is moved
/// back by `redrive queue` and delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_puts_parked_and_dead_lettered_events_back_into_delivery_l2_g1() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("redo").await;
    let sub = Subscriber::start(vec![Reply::Status(503)], Reply::Status(200)).await;
    let registered = sys
        .subscribe(SubscriptionRequest {
            dead_letter_destination: Some(sys.dead_letter_url("redo")),
            max_delivery_attempts: Some(1),
            ..subscription("redo", "audit", &sub.url)
        })
        .await;
    sys.publish(&topic, &events("r", 1)).await;
    sys.wait_for_dead_letters("redo/", Duration::from_secs(30))
        .await;

    let bad = gridrelay(
        &[
            "redrive",
            "dead-letters",
            "--topic-name",
            "redo",
            "--since",
            "yesterday",
        ],
        Some(&sys.names),
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("invalid --since") && stderr(&bad).contains("RFC 3339"));
    let dry = json(&gridrelay(
        &[
            "redrive",
            "dead-letters",
            "--topic-name",
            "redo",
            "--dry-run",
        ],
        Some(&sys.names),
    ));
    assert_eq!(dry["events"], 1, "{dry}");
    assert_eq!(
        dry["subscriptions"][0]["moved"]["MaxDeliveryAttemptsExceeded"],
        1
    );
    assert_eq!(sys.dead_letter_objects("redo/").await.len(), 1);
    let done = json(&gridrelay(
        &[
            "redrive",
            "dead-letters",
            "--topic-name",
            "redo",
            "--name",
            "audit",
            "--reason",
            "MaxDeliveryAttemptsExceeded",
        ],
        Some(&sys.names),
    ));
    assert_eq!(done["events"], 1, "{done}");
    let delivered = sub.wait_for_requests(2, Duration::from_secs(30)).await;
    assert_eq!(delivered[1].ids(), vec!["r-0"]);
    assert_eq!(delivered[1].reply, Reply::Status(200));
    assert_eq!(delivered[1].header("aeg-delivery-count"), Some("0"));
    assert!(sys.dead_letter_objects("redo/").await.is_empty());

    // A delivery message that SQS parked in the redrive queue.
    let parked = DeliveryMessage::packed(
        &DeliveryHistory::new(&registered),
        chrono::Utc::now(),
        vec![QueuedEvent::new(chrono::Utc::now(), serde_json::value::RawValue::from_string(
                r#"{"id":"parked-1","subject":"s","eventType":"t","eventTime":"2026-11-23T00:00:00Z","data":{}}"#
                    .into(),
            )
            .expect("json"))],
    );
    let redrive_url = sys.system.resources.delivery_redrive_queue_url.clone();
    let redrive = SqsQueue::new(
        aws_sdk_sqs::Client::new(&sys.sdk),
        &redrive_url,
        sys.system.queue_key.clone(),
    );
    let sent = redrive
        .send_all(&[OutgoingMessage {
            body: parked[0].to_body().expect("body"),
            delay: Duration::ZERO,
            group: None,
        }])
        .await;
    assert!(sent[0].is_ok());
    // #34 item 2: one that gridrelay did not write (no seal) stays where it is.
    aws_sdk_sqs::Client::new(&sys.sdk)
        .send_message()
        .queue_url(&redrive_url)
        .message_body(
            parked[0]
                .to_body()
                .expect("body")
                .replace("parked-1", "forged-1"),
        )
        .send()
        .await
        .expect("sent");
    let moved = json(&gridrelay(
        &["redrive", "queue", "--from", &redrive_url],
        Some(&sys.names),
    ));
    assert_eq!(moved["messages"], 1, "{moved}");
    assert_eq!(moved["moved"]["redo/audit"]["events"], 1);
    assert_eq!(moved["leftUnsealed"], 1, "{moved}");
    let delivered = sub.wait_for_requests(3, Duration::from_secs(30)).await;
    assert_eq!(delivered[2].ids(), vec!["parked-1"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(sub.received().len(), 3, "never the unsealed one");
    sys.shutdown().await;
}

/// `gridrelay local` stopped with SIGTERM (as `kill` or a service manager stops it) shuts down
/// and prints what it did: each function's invocations and the milliseconds Lambda would bill
/// for them (each invocation rounded up to a whole millisecond, so never fewer than one each).
/// Started, it printed the URL of the console it runs (#36).
#[test]
fn local_prints_invocations_and_billed_time_when_it_stops() {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::process::Stdio;

    let prefix = format!("stop-{}", uuid::Uuid::new_v4().simple());
    let listen = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gridrelay"))
        .args([
            "local",
            "--listen",
            &listen.to_string(),
            "--prefix",
            &prefix,
            "--console-listen",
            "127.0.0.1:0",
        ])
        .envs(ResourceNames::with_prefix(&prefix).cli_env())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gridrelay local starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "gridrelay local did not listen within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Three publishes to a topic that does not exist: three ingest invocations (404 each).
    for _ in 0..3 {
        use std::io::Write;
        let mut conn = TcpStream::connect(listen).expect("connect");
        conn.write_all(
            b"POST /topics/missing/api/events?api-version=2018-01-01 HTTP/1.1\r\nHost: local\r\n\
              aeg-sas-key: nope\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\
              Connection: close\r\n\r\n[]",
        )
        .expect("send");
        let mut answer = String::new();
        conn.read_to_string(&mut answer).expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    }
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(term.success());
    assert!(child.wait().expect("it stops").success(), "exit status");
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("stdout read");
    let printed: Vec<Value> = serde_json::Deserializer::from_str(&out)
        .into_iter::<Value>()
        .filter_map(Result::ok)
        .collect();
    // #36: it started a console and printed the URL that opens it.
    let console = printed
        .iter()
        .find_map(|v| v.get("console").and_then(Value::as_str))
        .unwrap_or_else(|| panic!("no console URL in {out}"));
    assert!(
        console.starts_with("http://127.0.0.1:") && console.contains("/?token="),
        "{console}"
    );
    let report = printed
        .iter()
        .find_map(|v| v.get("stopped").cloned())
        .unwrap_or_else(|| panic!("no stop report in {out}"));
    assert_eq!(report["ingest"]["invocations"], 3, "{report}");
    let billed = report["ingest"]["billedMs"].as_u64().expect("billedMs");
    assert!(billed >= 3, "each invocation bills at least 1 ms: {report}");
    assert_eq!(report["deliver"]["delivered"], 0, "{report}");
    assert!(report["deliver"]["billedMs"].as_u64().is_some(), "{report}");
    assert_eq!(
        report["latency"]["publishToAnswerMs"]["events"], 0,
        "{report}"
    );
    assert_eq!(report["latency"]["queueMs"]["messages"], 0, "{report}");
}

/// Outbound safety (issue #10, items 1 and 2) at the command line: `event-subscription create`
/// refuses an endpoint outside the allowed networks at once (exit 2, naming the flag, the host
/// and why) and stores nothing; against a local stack loopback is allowed with no setting, as
/// `gridrelay local` allows it; `--allowed-networks` widens it and is itself validated. What
/// it prints of an endpoint has no credentials or query string (item 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_refuses_endpoints_outside_the_allowed_networks() {
    let names = provisioned_with_orders_topic().await;
    let resources = Some(&names);
    let create = |name: &'static str, endpoint: &'static str, extra: &[&'static str]| {
        let mut args = create_args(name, endpoint);
        args.extend(extra);
        gridrelay(&args, resources)
    };

    for (endpoint, why) in [
        ("https://169.254.169.254/latest/meta-data", "link-local"),
        ("http://0xa9fea9fe/latest", "link-local"),
        ("http://10.1.2.3/hook", "private"),
        ("http://203.0.113.9/hook", "reserved"),
    ] {
        let out = create("refused", endpoint, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{endpoint}: {err}");
        assert!(
            err.contains("--endpoint") && err.contains(why) && err.contains("allowed networks"),
            "{endpoint}: {err}"
        );
    }
    let listed = json(&gridrelay(
        &["event-subscription", "list", "--topic-name", "orders"],
        resources,
    ));
    assert_eq!(listed, serde_json::json!([]), "nothing stored");

    // The local stack (AWS_ENDPOINT_URL on loopback) allows loopback, as `gridrelay local`.
    let local = json(&create("local", "http://127.0.0.1:9/hook", &[]));
    assert_eq!(
        local["destination"]["endpointUrl"],
        "http://127.0.0.1:9/hook"
    );
    // Item 3: what the command line prints of an endpoint holds neither its credentials nor
    // its query string, and says that they are there.
    let secret = json(&create(
        "secret",
        "http://hook-user:s3cret@127.0.0.1:9/hook?code=s3cret",
        &[],
    ));
    assert_eq!(
        secret["destination"]["endpointUrl"],
        "http://***@127.0.0.1:9/hook?***"
    );
    assert_eq!(
        secret["destination"]["endpointBaseUrl"],
        "http://127.0.0.1:9/hook"
    );
    for shown in [
        gridrelay(
            &[
                "event-subscription",
                "show",
                "--topic-name",
                "orders",
                "--name",
                "secret",
            ],
            resources,
        ),
        gridrelay(
            &["event-subscription", "list", "--topic-name", "orders"],
            resources,
        ),
    ] {
        let out = String::from_utf8_lossy(&shown.stdout).to_string();
        assert!(
            shown.status.success() && out.contains("http://***@127.0.0.1:9/hook?***"),
            "{out}"
        );
        assert!(
            !out.contains("s3cret") && !out.contains("hook-user"),
            "{out}"
        );
    }
    let widened = json(&create(
        "office",
        "http://10.1.2.3/hook",
        &["--allowed-networks", "10.0.0.0/8"],
    ));
    assert_eq!(
        widened["destination"]["endpointUrl"],
        "http://10.1.2.3/hook"
    );
    let out = create(
        "bad",
        "http://10.1.2.3/hook",
        &["--allowed-networks", "10.0.0.0/33"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--allowed-networks") && err.contains("10.0.0.0/33"),
        "{err}"
    );
}

/// Signed deliveries (issue #10, item 4) at the command line: `--signing-secret generate`
/// prints a new `whsec_` secret once; `signing-secret rotate` prints the next one and keeps the
/// old one in grace; a bad secret or grace period is refused naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_secrets_are_generated_and_rotated_from_the_command_line() {
    let names = provisioned_with_orders_topic().await;
    let resources = Some(&names);
    let mut base = create_args("signed", "http://127.0.0.1:9/hook");
    base.push("--signing-secret");
    let bad = gridrelay(&[&base[..], &["whsec_short"]].concat(), resources);
    let err = stderr(&bad);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--signing-secret") && !err.contains("whsec_short"),
        "{err}"
    );

    let created = json(&gridrelay(&[&base[..], &["generate"]].concat(), resources));
    let first = created["signingSecret"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(first.starts_with("whsec_"), "{created}");
    assert!(created["signing"]["secretId"].is_string(), "{created}");
    let shown = gridrelay(
        &[
            "event-subscription",
            "show",
            "--topic-name",
            "orders",
            "--name",
            "signed",
        ],
        resources,
    );
    assert!(
        !String::from_utf8_lossy(&shown.stdout).contains(&first),
        "show never prints it"
    );

    let rotate = |extra: &[&str]| {
        let mut args = vec![
            "event-subscription",
            "signing-secret",
            "rotate",
            "--topic-name",
            "orders",
            "--name",
            "signed",
        ];
        args.extend(extra);
        gridrelay(&args, resources)
    };
    let rotated = json(&rotate(&["--grace-period-hours", "2"]));
    let second = rotated["signingSecret"].as_str().unwrap_or_default();
    assert!(second.starts_with("whsec_") && second != first, "{rotated}");
    let until: chrono::DateTime<chrono::Utc> = rotated["signing"]["previous"]["until"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("the old secret's grace period");
    let minutes = (until - chrono::Utc::now()).num_minutes();
    assert!((115..=120).contains(&minutes), "{minutes} minutes of grace");
    let out = rotate(&["--grace-period-hours", "169"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--grace-period-hours") && err.contains("0 to 168"),
        "{err}"
    );
}

/// A1 from the command line: `--delivery-auth oauth2` takes the secret from a file or
/// standard input (never the command line), stores it in Secrets Manager and never prints it;
/// the flags without `--delivery-auth oauth2`, or it without them, are refused naming the flag;
/// `update --delivery-auth none` removes the credentials, and an update without the flag
/// keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_credentials_are_set_from_a_file_or_stdin_kept_secret_and_removed_a1() {
    use std::io::Write as _;
    let names = provisioned_with_orders_topic().await;
    let resources = Some(&names);
    let secret = "cli-s3cret value";
    let file = std::env::temp_dir().join(format!("gridrelay-client-secret-{}", std::process::id()));
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    let path = file.to_string_lossy().to_string();
    let oauth = [
        "--delivery-auth",
        "oauth2",
        "--token-url",
        "http://127.0.0.1:9/token?tenant=t1",
        "--client-id",
        "gridrelay-cli",
        "--scope",
        "events:write",
    ];

    let alone = gridrelay(
        &[
            &create_args("lonely", "http://127.0.0.1:9/hook")[..],
            &["--client-id", "x"],
        ]
        .concat(),
        resources,
    );
    assert_eq!(alone.status.code(), Some(2), "{}", stderr(&alone));
    assert!(
        stderr(&alone).contains("--client-id") && stderr(&alone).contains("--delivery-auth oauth2"),
        "{}",
        stderr(&alone)
    );
    let without_secret = gridrelay(
        &[
            &create_args("lonely", "http://127.0.0.1:9/hook")[..],
            &oauth[..],
        ]
        .concat(),
        resources,
    );
    assert_eq!(without_secret.status.code(), Some(2));
    assert!(
        stderr(&without_secret).contains("--client-secret-file"),
        "{}",
        stderr(&without_secret)
    );

    let created = gridrelay(
        &[
            &create_args("secured", "http://127.0.0.1:9/hook")[..],
            &oauth[..],
            &["--client-secret-file", &path],
        ]
        .concat(),
        resources,
    );
    let printed = String::from_utf8_lossy(&created.stdout).to_string();
    assert!(created.status.success(), "{}", stderr(&created));
    assert!(!printed.contains(secret), "{printed}");
    let auth = &json(&created)["deliveryAuth"];
    assert_eq!(auth["type"], "oauth2", "{printed}");
    assert_eq!(auth["clientId"], "gridrelay-cli");
    assert_eq!(auth["scope"], "events:write");
    assert!(
        !auth["tokenUrl"].as_str().unwrap_or_default().contains("t1"),
        "{auth}"
    );
    let secret_id = auth["clientSecretId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!secret_id.is_empty(), "{auth}");
    let sdk = gridrelay_e2e::sdk_config().await;
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let stored = secrets
        .get_secret_value()
        .secret_id(&secret_id)
        .send()
        .await
        .expect("the client secret is in Secrets Manager");
    assert_eq!(
        stored.secret_string(),
        Some(secret),
        "stored without its line end"
    );
    let exists = |id: String| {
        let secrets = secrets.clone();
        async move {
            secrets
                .get_secret_value()
                .secret_id(id)
                .send()
                .await
                .is_ok()
        }
    };

    // The token endpoint is held to the endpoints' outbound rules.
    let outside = gridrelay(
        &[
            &create_args("outside", "http://127.0.0.1:9/hook")[..],
            &[
                "--delivery-auth",
                "oauth2",
                "--token-url",
                "http://10.20.30.40/token",
                "--client-id",
                "c",
                "--client-secret-file",
                &path,
            ],
        ]
        .concat(),
        resources,
    );
    assert_eq!(outside.status.code(), Some(2), "{}", stderr(&outside));
    assert!(
        stderr(&outside).contains("--token-url") && stderr(&outside).contains("10.20.30.40"),
        "{}",
        stderr(&outside)
    );

    // From standard input, at update: the credentials replaced whole, the old secret deleted.
    let update_args = [
        "event-subscription",
        "update",
        "--topic-name",
        "orders",
        "--name",
        "secured",
    ];
    let mut update = std::process::Command::new(env!("CARGO_BIN_EXE_gridrelay"))
        .args(update_args)
        .args(oauth)
        .args(["--client-secret-file", "-"])
        .envs(names.cli_env())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    update
        .stdin
        .take()
        .unwrap()
        .write_all(b"another-secret")
        .unwrap();
    let updated = update.wait_with_output().unwrap();
    assert!(updated.status.success(), "{}", stderr(&updated));
    let new_id = json(&updated)["deliveryAuth"]["clientSecretId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!new_id.is_empty() && new_id != secret_id, "{new_id}");
    assert!(
        !exists(secret_id.clone()).await,
        "the replaced secret is deleted"
    );

    let update = |extra: &[&str]| gridrelay(&[&update_args[..], extra].concat(), resources);
    let kept = json(&update(&["--labels", "team:billing"]));
    assert_eq!(
        kept["deliveryAuth"]["clientSecretId"],
        new_id.as_str(),
        "{kept}"
    );
    let removed = json(&update(&["--delivery-auth", "none"]));
    assert!(removed.get("deliveryAuth").is_none(), "{removed}");
    assert!(
        !exists(new_id.clone()).await,
        "the removed credentials' secret is deleted"
    );
    let bad = update(&["--delivery-auth", "basic"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("oauth2, or none"), "{}", stderr(&bad));
    let _ = std::fs::remove_file(&file);
}

/// `event-subscription create` of `name` on the topic `orders`, sending to `endpoint`.
fn create_args<'a>(name: &'a str, endpoint: &'a str) -> Vec<&'a str> {
    vec![
        "event-subscription",
        "create",
        "--topic-name",
        "orders",
        "--name",
        name,
        "--endpoint",
        endpoint,
        "--no-wait",
    ]
}

/// Fresh resources of their own, with a topic `orders` made by the command line.
async fn provisioned_with_orders_topic() -> ResourceNames {
    let sdk = gridrelay_e2e::sdk_config().await;
    let prefix = format!("o{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let names = ResourceNames::with_prefix(&prefix);
    gridrelay_local::provision(&sdk, &names, 5)
        .await
        .expect("provision");
    json(&gridrelay(
        &["topic", "create", "--name", "orders"],
        Some(&names),
    ));
    names
}

/// #11 items 7, 9, 10, 11 and S6 as a user types them: flags in any order (an
/// `--advanced-filter` ends at the next flag; negative numbers stay values), two filters on one
/// key, `--included-event-types All`, `--enable-advanced-filtering-on-arrays` alone meaning
/// true, a status table by its short name; and the filter limits refused naming the flag, the
/// value and the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_flags_work_in_any_order_and_limits_are_named() {
    let names = provisioned_with_orders_topic().await;
    let resources = Some(&names);
    let base = |name: &'static str| create_args(name, "http://127.0.0.1:9/hook");
    let mut args = base("amounts");
    args.extend([
        "--advanced-filter",
        "data.amount",
        "NumberGreaterThan",
        "-100",
        "--delivery-attribute-mapping",
        "X-Team",
        "static",
        "a",
        "--advanced-filter",
        "data.amount",
        "NumberInRange",
        "-50,-1",
        "0,100",
        "--enable-advanced-filtering-on-arrays",
        "--included-event-types",
        "All",
        "--status-table",
        "2020",
    ]);
    let sub = json(&gridrelay(&args, resources));
    let filters = &sub["filter"]["advancedFilters"];
    assert_eq!(filters.as_array().map(Vec::len), Some(2), "{sub}");
    assert_eq!(filters[0]["key"], "data.amount");
    assert_eq!(filters[0]["value"], -100.0, "one value: az's `value`");
    assert_eq!(
        filters[1]["values"],
        serde_json::json!([[-50.0, -1.0], [0.0, 100.0]])
    );
    assert_eq!(sub["filter"]["enableAdvancedFilteringOnArrays"], true);
    assert_eq!(
        sub["filter"]["includedEventTypes"],
        serde_json::json!(["All"])
    );
    assert_eq!(
        sub["destination"]["deliveryAttributeMappings"][0]["name"],
        "X-Team"
    );
    assert_eq!(sub["statusTable"], "Revision2020");

    // The default table is the newest revision's.
    let plain = json(&gridrelay(&base("plain"), resources));
    assert_eq!(plain["statusTable"], "Latest");
    assert_eq!(plain["filter"]["enableAdvancedFilteringOnArrays"], false);

    // Limits: 25 values across all filters; strings at most 512 characters.
    let thirteen: Vec<String> = (0..13).map(|i| i.to_string()).collect();
    let mut too_many = base("too-many");
    for key in ["data.a", "data.b"] {
        too_many.extend(["--advanced-filter", key, "NumberIn"]);
        too_many.extend(thirteen.iter().map(String::as_str));
    }
    let long = "x".repeat(513);
    let mut too_long = base("too-long");
    too_long.extend(["--advanced-filter", "data.s", "StringContains", &long]);
    for (args, value, limit) in [
        (too_many, "26 values", "at most 25 values"),
        (too_long, "513 characters", "at most 512 characters"),
    ] {
        let out = gridrelay(&args, resources);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("--advanced-filter") && err.contains(value) && err.contains(limit),
            "{err}"
        );
    }
}

/// #11 item 12 as a user types it, against a running system: `create` with `--labels`, a
/// dynamic `--delivery-attribute-mapping` and `--expiration-date`; `update` of settings and of
/// the endpoint (the new one is validated with the handshake while the old one keeps
/// receiving, then takes over); `update` refusing an out-of-range value naming the flag;
/// `topic update --tags`; and an expired subscription deleted by the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_labels_dynamic_headers_and_expiration_from_the_command_line() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("life").await;
    let resources = Some(&sys.names);
    let first = Subscriber::start(vec![], Reply::Status(200)).await;
    let second = Subscriber::start(vec![], Reply::Status(200)).await;
    let in_two_hours = (chrono::Utc::now() + chrono::Duration::hours(2)).to_rfc3339();
    let created = json(&gridrelay(
        &[
            "event-subscription",
            "create",
            "--topic-name",
            "life",
            "--name",
            "audit",
            "--endpoint",
            &first.url,
            "--labels",
            "team:payments",
            "tier-1",
            "--delivery-attribute-mapping",
            "X-Order",
            "dynamic",
            "data.order",
            "--expiration-date",
            &in_two_hours,
        ],
        resources,
    ));
    assert_eq!(
        created["labels"],
        serde_json::json!(["team:payments", "tier-1"])
    );
    let mapping = &created["destination"]["deliveryAttributeMappings"][0];
    assert_eq!(mapping["type"], "Dynamic");
    assert_eq!(mapping["sourceField"], "data.order");
    assert!(created["expirationTimeUtc"].is_string(), "{created}");
    // #11 item 14: create waited for the handshake, as `az` waits for a terminal state.
    assert_eq!(created["provisioningState"], "Succeeded", "{created}");
    assert_eq!(first.validations().len(), 1);
    sys.publish(&topic, &events("one", 1)).await;
    let got = first.wait_for_requests(1, Duration::from_secs(30)).await;
    assert_eq!(
        got[0].header("X-Order"),
        Some("0"),
        "the event's data.order"
    );

    // Out of range: refused before anything changes, naming the flag.
    let refused = gridrelay(
        &[
            "event-subscription",
            "update",
            "--topic-name",
            "life",
            "--name",
            "audit",
            "--max-delivery-attempts",
            "31",
        ],
        resources,
    );
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("--max-delivery-attempts")
            && stderr(&refused).contains("1 to 30")
    );
    let missing = gridrelay(
        &[
            "event-subscription",
            "update",
            "--topic-name",
            "life",
            "--name",
            "nope",
            "--labels",
        ],
        resources,
    );
    assert!(stderr(&missing).contains("event subscription nope on topic life does not exist"));

    // A new endpoint that refuses the handshake: update waits, says why and fails; the
    // subscription keeps its endpoint, the failed change beside it.
    let refusing = gridrelay_e2e::Subscriber::start_with_handshake(
        vec![],
        Reply::Status(200),
        gridrelay_e2e::Handshake::Refuse(403),
    )
    .await;
    let update = |endpoint: &str, extra: &[&str]| {
        let mut args = vec![
            "event-subscription",
            "update",
            "--topic-name",
            "life",
            "--name",
            "audit",
            "--endpoint",
        ];
        args.push(endpoint);
        args.extend(extra);
        gridrelay(&args, resources)
    };
    let failed = update(&refusing.url, &[]);
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    assert!(stderr(&failed).contains("403"), "{}", stderr(&failed));
    let printed: serde_json::Value = serde_json::from_slice(&failed.stdout).expect("printed");
    assert_eq!(printed["destination"]["endpointUrl"], first.url.as_str());
    assert_eq!(printed["endpointChange"]["provisioningState"], "Failed");
    assert_eq!(
        printed["provisioningState"], "Succeeded",
        "still delivering"
    );

    // --no-wait prints the record as written: the change waits beside the old endpoint.
    let pending = json(&update(
        &second.url,
        &["--no-wait", "--max-events-per-batch", "10", "--labels"],
    ));
    assert_eq!(
        pending["destination"]["endpointUrl"],
        first.url.as_str(),
        "{pending}"
    );
    assert_eq!(
        pending["endpointChange"]["endpointUrl"],
        second.url.as_str()
    );
    assert_eq!(pending["endpointChange"]["provisioningState"], "Creating");
    assert_eq!(pending["destination"]["maxEventsPerBatch"], 10);
    assert_eq!(
        pending["labels"],
        serde_json::Value::Null,
        "the flag alone removes them"
    );
    assert_eq!(
        pending["destination"]["deliveryAttributeMappings"],
        created["destination"]["deliveryAttributeMappings"]
    );
    let switched =
        gridrelay_e2e::eventually(Duration::from_secs(30), "the endpoint change", || async {
            let shown = json(&gridrelay(
                &[
                    "event-subscription",
                    "show",
                    "--topic-name",
                    "life",
                    "--name",
                    "audit",
                ],
                resources,
            ));
            (shown["destination"]["endpointUrl"] == second.url.as_str()).then_some(shown)
        })
        .await;
    assert!(switched.get("endpointChange").is_none(), "{switched}");
    assert_eq!(second.validations().len(), 1, "the new endpoint was asked");
    assert!(
        refusing.received().is_empty(),
        "no event to a refusing endpoint"
    );
    sys.publish(&topic, &events("two", 3)).await;
    let got = second.wait_for_requests(1, Duration::from_secs(30)).await;
    assert_eq!(
        got[0].ids(),
        ["two-0", "two-1", "two-2"],
        "batched as updated"
    );
    assert_eq!(
        first.received().len(),
        1,
        "the old endpoint got nothing more"
    );

    let tagged = json(&gridrelay(
        &[
            "topic",
            "update",
            "--name",
            "life",
            "--tags",
            "env=test",
            "owner=payments",
            "--dedup-window-seconds",
            "120",
        ],
        resources,
    ));
    assert_eq!(
        tagged["tags"],
        serde_json::json!({"env": "test", "owner": "payments"})
    );
    // P1: shown, and kept by an update that does not name it.
    assert_eq!(tagged["dedupWindowInSeconds"], 120, "{tagged}");
    let retagged = json(&gridrelay(
        &["topic", "update", "--name", "life", "--tags", "env=test"],
        resources,
    ));
    assert_eq!(retagged["dedupWindowInSeconds"], 120, "{retagged}");
    let bad_tag = gridrelay(
        &["topic", "update", "--name", "life", "--tags", "=x"],
        resources,
    );
    assert_eq!(bad_tag.status.code(), Some(2));
    assert!(stderr(&bad_tag).contains("--tags"), "{}", stderr(&bad_tag));

    // Expiring in a few seconds: the service deletes it then.
    let soon = (chrono::Utc::now() + chrono::Duration::seconds(3)).to_rfc3339();
    json(&gridrelay(
        &[
            "event-subscription",
            "update",
            "--topic-name",
            "life",
            "--name",
            "audit",
            "--expiration-date",
            &soon,
        ],
        resources,
    ));
    gridrelay_e2e::eventually(
        Duration::from_secs(60),
        "the expired subscription deleted",
        || async {
            let listed = json(&gridrelay(
                &["event-subscription", "list", "--topic-name", "life"],
                resources,
            ));
            (listed == serde_json::json!([])).then_some(())
        },
    )
    .await;
    sys.publish(&topic, &events("three", 1)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(second.received().len(), 1, "nothing after the expiration");
    sys.shutdown().await;
}

/// #11 item 13: `list` pages (`--top`, and the `--skip-token` a note gives), and
/// `--output table` prints a table for people.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_and_prints_tables() {
    let names = provisioned_with_orders_topic().await;
    let resources = Some(&names);
    for name in ["sub-c", "sub-a", "sub-b"] {
        json(&gridrelay(
            &create_args(name, "http://127.0.0.1:9/hook"),
            resources,
        ));
    }
    let list = |extra: &[&str]| {
        let mut args = vec!["event-subscription", "list", "--topic-name", "orders"];
        args.extend(extra);
        gridrelay(&args, resources)
    };
    let names_of = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let first = list(&["--top", "2"]);
    assert_eq!(names_of(&json(&first)), ["sub-a", "sub-b"]);
    assert!(
        stderr(&first).contains("--skip-token sub-b"),
        "{}",
        stderr(&first)
    );
    let rest = list(&["--top", "2", "--skip-token", "sub-b"]);
    assert_eq!(names_of(&json(&rest)), ["sub-c"]);
    assert!(!stderr(&rest).contains("--skip-token"), "the last page");
    assert_eq!(names_of(&json(&list(&[]))).len(), 3);

    let table = list(&["--output", "table"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = String::from_utf8_lossy(&table.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("Name") && lines[0].contains("ProvisioningState"),
        "{text}"
    );
    assert!(lines[1].starts_with("-----"), "{text}");
    assert!(
        lines[2].starts_with("sub-a") && lines[2].contains("Creating"),
        "{text}"
    );
    assert_eq!(lines.len(), 5, "{text}");
    let topics = gridrelay(&["topic", "list", "-o", "table"], resources);
    let text = String::from_utf8_lossy(&topics.stdout).to_string();
    assert!(text.lines().any(|l| l.starts_with("orders")), "{text}");
}

/// #11 item 14: `show` says how delivery to the subscription goes: after a 503 and then a
/// success, its endpoint is healthy again, and the last failure (when, `Busy`, 503) is kept;
/// the delivery queue's counts are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_says_how_delivery_goes() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("status").await;
    let hook = Subscriber::start(vec![Reply::Status(503)], Reply::Status(200)).await;
    let resources = Some(&sys.names);
    let created = json(&gridrelay(
        &[
            "event-subscription",
            "create",
            "--topic-name",
            "status",
            "--name",
            "audit",
            "--endpoint",
            &hook.url,
        ],
        resources,
    ));
    assert_eq!(created["provisioningState"], "Succeeded", "{created}");
    sys.publish(&topic, &events("s", 1)).await;
    hook.wait_for_requests(2, Duration::from_secs(30)).await;
    let shown = gridrelay_e2e::eventually(Duration::from_secs(30), "health recorded", || async {
        let shown = json(&gridrelay(
            &[
                "event-subscription",
                "show",
                "--topic-name",
                "status",
                "--name",
                "audit",
            ],
            resources,
        ));
        (shown["deliveryStatus"]["endpoint"]["state"] == "Healthy"
            && shown["deliveryStatus"]["endpoint"]["lastFailure"].is_object())
        .then_some(shown)
    })
    .await;
    let status = &shown["deliveryStatus"];
    assert_eq!(status["endpoint"]["consecutiveFailures"], 0, "{shown}");
    assert_eq!(status["endpoint"]["lastFailure"]["outcome"], "Busy");
    assert_eq!(status["endpoint"]["lastFailure"]["status"], 503);
    assert!(
        status["deliveryQueue"]["approximateMessages"].is_u64(),
        "{shown}"
    );
    sys.shutdown().await;
}

/// O1: `--ordering-key` is stored and shown (`orderingKey`); an update without it keeps it,
/// with it replaces it, and `none` removes it (`null`: no order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordering_key_is_set_kept_replaced_and_removed_o1() {
    let names = provisioned_with_orders_topic().await;
    let resources = Some(&names);
    let shown = |out: &Output| json(out)["orderingKey"].clone();
    let created = gridrelay(
        &[
            &create_args("ordered", "http://127.0.0.1:9/hook")[..],
            &["--ordering-key", "data.order.id"],
        ]
        .concat(),
        resources,
    );
    assert_eq!(shown(&created), "data.order.id");
    let update = |extra: &[&str]| {
        let mut args = vec![
            "event-subscription",
            "update",
            "--topic-name",
            "orders",
            "--name",
            "ordered",
            "--no-wait",
        ];
        args.extend(extra);
        gridrelay(&args, resources)
    };
    assert_eq!(
        shown(&update(&["--max-delivery-attempts", "5"])),
        "data.order.id"
    );
    assert_eq!(shown(&update(&["--ordering-key", "subject"])), "subject");
    assert_eq!(shown(&update(&["--ordering-key", "none"])), Value::Null);
    let refused = update(&["--ordering-key", "data"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("--ordering-key"),
        "{}",
        stderr(&refused)
    );

    // An installation without an ordered queue (a stack made before it: its delivery queue
    // not named <prefix>-delivery, and no OrderedQueueUrl given) never gets an ordered
    // subscription, whose events ingest could not enqueue.
    let without = Command::new(env!("CARGO_BIN_EXE_gridrelay"))
        .args(
            [
                &create_args("elsewhere", "http://127.0.0.1:9/hook")[..],
                &[
                    "--ordering-key",
                    "subject",
                    "--delivery-queue",
                    "https://sqs.us-east-1.amazonaws.com/123456789012/events",
                ],
            ]
            .concat(),
        )
        .env_remove("GRIDRELAY_ORDERED_QUEUE_URL")
        .output()
        .expect("gridrelay runs");
    let err = stderr(&without);
    assert_eq!(without.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--ordering-key")
            && err.contains("GRIDRELAY_ORDERED_QUEUE_URL")
            && err.contains("OrderedQueueUrl"),
        "{err}"
    );
}

/// A1: `show` says when an OAuth subscription's token endpoint fails: `deliveryStatus.token`
/// is `Failing`, with its failures and the last one (`TokenUnavailable`, 503), while the
/// endpoint's own health is untouched; once tokens come again it is `Healthy`, the last
/// failure kept, and the event held by the failures is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_says_when_the_token_endpoint_fails_a1() {
    use gridrelay_e2e::oauth_server::{CLIENT_ID, CLIENT_SECRET, OAuthServer};
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("tokens").await;
    let resources = Some(&sys.names);
    // Tokens of one second: the event's attempts each ask for one.
    let server = OAuthServer::start(1).await;
    let file = std::env::temp_dir().join(format!("gridrelay-show-token-{}", std::process::id()));
    std::fs::write(&file, CLIENT_SECRET).unwrap();
    let created = json(&gridrelay(
        &[
            "event-subscription",
            "create",
            "--topic-name",
            "tokens",
            "--name",
            "audit",
            "--endpoint",
            &server.hook_url,
            "--delivery-auth",
            "oauth2",
            "--token-url",
            &server.token_url,
            "--client-id",
            CLIENT_ID,
            "--client-secret-file",
            &file.to_string_lossy(),
        ],
        resources,
    ));
    std::fs::remove_file(&file).ok();
    assert_eq!(created["provisioningState"], "Succeeded", "{created}");
    let show = || {
        json(&gridrelay(
            &[
                "event-subscription",
                "show",
                "--topic-name",
                "tokens",
                "--name",
                "audit",
            ],
            resources,
        ))
    };
    let status = show()["deliveryStatus"].clone();
    assert_eq!(status["token"]["state"], "Healthy", "{status}");

    tokio::time::sleep(Duration::from_millis(1100)).await;
    server.answer_tokens_with(Some(503));
    sys.publish(&topic, &events("held", 1)).await;
    let failing = gridrelay_e2e::eventually(Duration::from_secs(30), "token failures", || async {
        let shown = show();
        (shown["deliveryStatus"]["token"]["consecutiveFailures"].as_u64() >= Some(2))
            .then_some(shown)
    })
    .await;
    let status = &failing["deliveryStatus"];
    assert_eq!(status["token"]["state"], "Failing", "{failing}");
    assert_eq!(
        status["token"]["lastFailure"]["outcome"],
        "TokenUnavailable"
    );
    assert_eq!(status["token"]["lastFailure"]["status"], 503);
    assert_eq!(
        status["endpoint"]["consecutiveFailures"], 0,
        "token failures are not the endpoint's: {failing}"
    );
    assert!(server.delivered_ids().is_empty());

    server.answer_tokens_with(None);
    let healed = gridrelay_e2e::eventually(Duration::from_secs(60), "tokens again", || async {
        let shown = show();
        (shown["deliveryStatus"]["token"]["state"] == "Healthy").then_some(shown)
    })
    .await;
    assert_eq!(healed["deliveryStatus"]["token"]["consecutiveFailures"], 0);
    assert_eq!(
        healed["deliveryStatus"]["token"]["lastFailure"]["status"], 503,
        "the last failure is kept: {healed}"
    );
    gridrelay_e2e::eventually(Duration::from_secs(30), "the event delivered", || async {
        server
            .delivered_ids()
            .contains(&"held-0".to_string())
            .then_some(())
    })
    .await;
    sys.shutdown().await;
}

/// #12 (S4) as a user types it: `create --endpoint-type sqs --endpoint ARN` makes a
/// subscription that needs no handshake (`Succeeded` at once), prints the queue as
/// `destination.resourceId`, and delivers every event to the queue as a message; an ARN of
/// another service, batching settings for a queue, a queue outside `--delivery-destinations`
/// and the stack's own queues are refused naming the flag, the value and what is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_a_subscription_to_an_sqs_queue_s4() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("orders").await;
    let resources = Some(&sys.names);
    let sqs = aws_sdk_sqs::Client::new(&sys.sdk);
    let url = sqs
        .create_queue()
        .queue_name(format!("{}-in", sys.names.secret_prefix))
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    // ARNs in the account and region the emulator gives its queues (moto and LocalStack differ).
    let (arn_base, _) = sys
        .system
        .resources
        .delivery_queue_arn
        .rsplit_once(':')
        .unwrap();
    let arn = format!("{arn_base}:{}-in", sys.names.secret_prefix);
    let mut args = create_args("to-queue", &arn);
    args.extend(["--endpoint-type", "sqs"]);

    let refused = |extra: &[&str]| {
        let mut a = args.clone();
        a.extend(extra);
        let out = gridrelay(&a, resources);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        stderr(&out)
    };
    let err = refused(&["--max-events-per-batch", "10"]);
    assert!(
        err.contains("--max-events-per-batch") && err.contains("one message per event"),
        "{err}"
    );
    let err = refused(&["--delivery-destinations", "arn:aws:sqs:*:*:billing-*"]);
    assert!(
        err.contains("--endpoint") && err.contains("billing-*"),
        "{err}"
    );
    // #34 item 2: the stack's own queues, whatever every ARN being allowed says.
    for own in [
        "delivery",
        "dead-letter",
        "delivery-redrive",
        "dead-letter-redrive",
    ] {
        let own = format!("{arn_base}:{}-{own}", sys.names.secret_prefix);
        let mut to_own = create_args("to-own", &own);
        to_own.extend(["--endpoint-type", "sqs", "--delivery-destinations", "*"]);
        let out = gridrelay(&to_own, resources);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&own) && err.contains("not one of this installation's own"),
            "{err}"
        );
    }
    let mut wrong = create_args("to-topic", &arn);
    wrong.extend(["--endpoint-type", "sns"]);
    let out = gridrelay(&wrong, resources);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("SNS topic ARN"), "{}", stderr(&out));

    let created = json(&gridrelay(&args, resources));
    assert_eq!(created["provisioningState"], "Succeeded", "{created}");
    assert_eq!(created["destination"]["endpointType"], "SqsQueue");
    assert_eq!(created["destination"]["resourceId"], arn.as_str());

    sys.publish(&topic, &events("c", 3)).await;
    let mut ids = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while ids.len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "3 messages in the queue: {ids:?}"
        );
        let out = sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .visibility_timeout(60)
            .send()
            .await
            .unwrap();
        for m in out.messages() {
            let event: Value = serde_json::from_str(m.body().unwrap()).unwrap();
            assert_eq!(event["eventType"], "Contoso.Orders.Created");
            ids.insert(event["id"].as_str().unwrap().to_string());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let show = |extra: &[&str]| {
        let mut a = vec![
            "event-subscription",
            "show",
            "--topic-name",
            "orders",
            "--name",
            "to-queue",
        ];
        a.extend(extra);
        gridrelay(&a, resources)
    };
    let shown = json(&show(&[]));
    assert_eq!(shown["destination"]["endpointType"], "SqsQueue");
    let table = show(&["-o", "table"]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains(&arn),
        "{table:?}"
    );
    sys.shutdown().await;
}

/// What `event show` (the command `show`) prints once `done` holds of it (`what`, within 10 s):
/// a journal entry is written as its invocation ends.
async fn life_once(
    show: &[&str],
    names: &ResourceNames,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    gridrelay_e2e::eventually(Duration::from_secs(10), what, || async {
        let out = gridrelay(show, Some(names));
        let life = out.status.success().then(|| json(&out))?;
        done(&life).then_some(life)
    })
    .await
}

/// The names of the steps of a subscription's life, as `event show` prints it.
fn step_names(life: &Value) -> Vec<&str> {
    life["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect()
}

/// #35, L3, L4: a dead-lettered event's life ends with the object it went to: `event show`
/// lists its one attempt (503, handed to dead-lettering), then the dead-letter function's
/// write with the object's `s3://` address, and the event stands dead-lettered there. Redriven
/// from it (L2), its life goes on: sent again from that object, delivered, the redrive's steps
/// named as its own delivery and each delivery standing on its own steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_event_shows_the_object_it_went_to_and_its_redrive_l2_l3() {
    let sys = TestSystem::start_with_own_journal(0.01).await;
    let topic = sys.topic("lastrites").await;
    let sub = Subscriber::start(vec![], Reply::Status(503)).await;
    sys.subscribe(SubscriptionRequest {
        dead_letter_destination: Some(sys.dead_letter_url("lastrites")),
        max_delivery_attempts: Some(1),
        ..subscription("lastrites", "audit", &sub.url)
    })
    .await;
    sys.publish(&topic, &events("d", 1)).await;
    let objects = sys
        .wait_for_dead_letters("lastrites/", Duration::from_secs(30))
        .await;
    let location = format!("s3://{}/{}", sys.names.dead_letter_bucket, objects[0].0);

    let show = [
        "event",
        "show",
        "--topic-name",
        "lastrites",
        "--event-id",
        "d-0",
    ];
    // The write's entry goes out as the dead-letter invocation ends.
    let life = life_once(
        &show,
        &sys.names,
        "the dead-letter write journaled",
        |life| life["subscriptions"][0]["standing"]["state"] == "deadLettered",
    )
    .await;
    let audit = &life["subscriptions"][0];
    let steps = step_names(audit);
    assert_eq!(steps, ["fanned", "attempt", "dead_lettered"], "{life}");
    assert_eq!(audit["steps"][1]["status"], 503, "{life}");
    assert_eq!(audit["steps"][1]["next"], "dead_letter", "{life}");
    assert_eq!(
        audit["steps"][1]["reason"], "MaxDeliveryAttemptsExceeded",
        "{life}"
    );
    assert_eq!(audit["steps"][2]["location"], location.as_str(), "{life}");
    assert_eq!(audit["standing"]["location"], location.as_str(), "{life}");

    // #35: redriven once the subscriber is fixed, the event's life goes on from the object it
    // came back from: a `fanned` entry naming it, the redrive's attempt numbered 1 again, and
    // it stands delivered.
    sub.answer_path("/hook", Reply::Status(200));
    let redriven = json(&gridrelay(
        &["redrive", "dead-letters", "--topic-name", "lastrites"],
        Some(&sys.names),
    ));
    assert_eq!(redriven["events"], 1, "{redriven}");
    let life = life_once(
        &show,
        &sys.names,
        "the redriven delivery journaled",
        |life| life["subscriptions"][0]["standing"]["state"] == "delivered",
    )
    .await;
    let audit = &life["subscriptions"][0];
    let steps = step_names(audit);
    assert_eq!(
        steps,
        ["fanned", "attempt", "dead_lettered", "fanned", "attempt"],
        "{life}"
    );
    assert_eq!(audit["steps"][3]["redrive"], location.as_str(), "{life}");
    assert_eq!(audit["steps"][4]["attempt"], 1, "{life}");
    assert_eq!(audit["steps"][4]["status"], 200, "{life}");
    let redrive = audit["steps"][4]["delivery"].as_str().unwrap_or_default();
    assert!(redrive.starts_with("redrive:"), "{life}");
    assert_eq!(audit["steps"][3]["delivery"], redrive, "{life}");
    assert_eq!(audit["steps"][1].get("delivery"), None, "{life}");
    let deliveries = audit["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 2, "{life}");
    assert_eq!(deliveries[0].get("delivery"), None, "{life}");
    assert_eq!(deliveries[0]["standing"]["state"], "deadLettered", "{life}");
    assert_eq!(deliveries[1]["delivery"], redrive, "{life}");
    assert_eq!(deliveries[1]["standing"]["state"], "delivered", "{life}");
    let mut table_args = show.to_vec();
    table_args.extend(["-o", "table"]);
    let table =
        String::from_utf8_lossy(&gridrelay(&table_args, Some(&sys.names)).stdout).to_string();
    assert!(
        table.contains(&format!("redriven from {location}")),
        "{table}"
    );
    assert!(table.contains("now: publish"), "{table}");
    assert!(table.contains("attempt 1 (publish)"), "{table}");
    assert!(table.contains("attempt 1 (redrive at "), "{table}");
    assert!(
        table.contains(&format!(
            "now: redrive at {}",
            redrive.trim_start_matches("redrive:")
        )),
        "{table}"
    );
    sys.shutdown().await;
}

/// #35: `event show` answers "what happened to this event?" from the delivery journal, as an
/// operator runs it: an event that failed twice (500, then 503: S5, R1) and then succeeded
/// shows, for its subscription, that it was published, then three attempts in order with
/// their statuses, and stands delivered; `event-subscription attempts --failed` lists exactly
/// the two failed attempts, newest first; `-o table` prints them for people, and a bad
/// `--since` is refused naming the flag, the value and what it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_shows_each_attempt_of_an_event_and_where_it_stands_r1_s5() {
    let sys = TestSystem::start_with_own_journal(0.01).await;
    let topic = sys.topic("journal").await;
    let sub = Subscriber::start(
        vec![Reply::Status(500), Reply::Status(503)],
        Reply::Status(200),
    )
    .await;
    sys.subscribe(subscription("journal", "billing", &sub.url))
        .await;
    sys.publish(&topic, &events("j", 1)).await;
    sub.wait_for_requests(3, Duration::from_secs(30)).await;

    let show = [
        "event",
        "show",
        "--topic-name",
        "journal",
        "--event-id",
        "j-0",
    ];
    // The last attempt's entry is written as its invocation ends.
    let life = life_once(&show, &sys.names, "three attempts journaled", |life| {
        life["subscriptions"][0]["steps"]
            .as_array()
            .is_some_and(|steps| steps.iter().filter(|s| s["step"] == "attempt").count() == 3)
    })
    .await;
    let billing = &life["subscriptions"][0];
    assert_eq!(billing["subscription"], "billing");
    let steps = billing["steps"].as_array().unwrap();
    assert_eq!(steps[0]["step"], "fanned", "{life}");
    assert_eq!(steps[0]["type"], "Contoso.Orders.Created");
    let attempts: Vec<(u64, u64, &str)> = steps[1..]
        .iter()
        .map(|s| {
            (
                s["attempt"].as_u64().unwrap(),
                s["status"].as_u64().unwrap(),
                s["next"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [(1, 500, "retry"), (2, 503, "retry"), (3, 200, "delivered")],
        "{life}"
    );
    assert_eq!(billing["standing"]["state"], "delivered", "{life}");
    // What the endpoint answered, its first bytes (64 by default).
    assert_eq!(
        steps[1]["answer"], "refused with 500 by the test subscriber",
        "{life}"
    );
    assert!(
        steps[1]["endpoint"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );

    let attempts_failed = [
        "event-subscription",
        "attempts",
        "--topic-name",
        "journal",
        "--name",
        "billing",
        "--failed",
    ];
    let failed = json(&gridrelay(&attempts_failed, Some(&sys.names)));
    let statuses: Vec<u64> = failed
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [503, 500], "{failed}");
    let failed_table = gridrelay(
        &[&attempts_failed[..], &["-o", "table"]].concat(),
        Some(&sys.names),
    );
    assert!(
        String::from_utf8_lossy(&failed_table.stdout).contains("refused with 503"),
        "{}",
        String::from_utf8_lossy(&failed_table.stdout)
    );

    let table = gridrelay(&[&show[..], &["-o", "table"]].concat(), Some(&sys.names));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{}", stderr(&table));
    assert!(
        text.contains("attempt 3") && text.contains("delivered at"),
        "{text}"
    );

    let bad = gridrelay(&[&show[..], &["--since", "2w"]].concat(), Some(&sys.names));
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("--since")
            && stderr(&bad).contains("\"2w\"")
            && stderr(&bad).contains("7d"),
        "{}",
        stderr(&bad)
    );
    let unknown = gridrelay(
        &[
            "event",
            "show",
            "--topic-name",
            "journal",
            "--event-id",
            "never-published",
        ],
        Some(&sys.names),
    );
    assert!(!unknown.status.success());
    assert!(
        stderr(&unknown).contains("no journal entry"),
        "{}",
        stderr(&unknown)
    );
    sys.shutdown().await;
}

/// #35, the archive, as an operator runs it: a topic created with `--retention-days 7` shows
/// it, and `archive list` finds exactly its accepted events of a window, oldest first and as
/// they were fanned out (none of another topic's, none outside the window); a topic without a
/// retention has no archive to list, and a retention, window start or end outside what is
/// allowed is refused naming the flag's field, the value and the range. Each topic's events
/// are stored in its retention's class (7 days under `archive/7d/`, 10 days in the 30-day
/// class under `archive/30d/`), which the journal bucket's rule of that class expires; a
/// retention whose class the bucket has no rule for (a stack from before classes) is refused
/// naming the prefix; and after a topic's retention changes, its window is read across both
/// classes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_a_retention_lists_exactly_what_it_accepted_in_a_window() {
    use gridrelay_ports::ObjectStore as _;
    // Topics cached a second, so a warm ingest sees a retention changed below soon.
    let sys = TestSystem::start_with_own_journal_and(0.01, |c| {
        c.config_cache = Duration::from_secs(1);
    })
    .await;
    let names = Some(&sys.names);
    let created = json(&gridrelay(
        &["topic", "create", "--name", "kept", "--retention-days", "7"],
        names,
    ));
    assert_eq!(created["eventRetentionInDays"], 7, "{created}");
    let key = created["key1"].as_str().unwrap().to_string();
    let plain = json(&gridrelay(&["topic", "create", "--name", "plain"], names));
    assert_eq!(plain["eventRetentionInDays"], 0, "{plain}");
    let plain_key = plain["key1"].as_str().unwrap().to_string();
    let long = json(&gridrelay(
        &[
            "topic",
            "create",
            "--name",
            "long",
            "--retention-days",
            "10",
        ],
        names,
    ));
    let long_key = long["key1"].as_str().unwrap().to_string();

    let time =
        |at: chrono::DateTime<chrono::Utc>| at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let publish = |topic: &'static str, key: String, body: Value| {
        let sys = &sys;
        async move {
            let (status, answer) = sys
                .publish_raw(topic, Some(&key), body.to_string().into_bytes())
                .await;
            assert_eq!(status, 200, "{answer}");
        }
    };
    let start = chrono::Utc::now();
    publish("kept", key.clone(), events("first", 2)).await;
    publish("plain", plain_key, events("elsewhere", 1)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let middle = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    publish("kept", key.clone(), events("second", 1)).await;
    publish("long", long_key, events("long", 1)).await;

    let list = |extra: &[&str]| {
        let mut args = vec!["archive", "list", "--topic-name"];
        args.extend_from_slice(extra);
        gridrelay(&args, names)
    };
    let ids = |listed: &Value| -> Vec<String> {
        listed["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event"]["id"].as_str().unwrap().to_string())
            .collect()
    };
    // Once the stream has written them (at once on moto; LocalStack's may take a moment).
    let all = gridrelay_e2e::eventually(
        Duration::from_secs(20),
        "the three archived events listed",
        || async {
            let listed = json(&list(&["kept", "--start-time", &time(start)]));
            (listed["count"] == 3).then_some(listed)
        },
    )
    .await;
    assert_eq!(ids(&all), ["first-0", "first-1", "second-0"], "{all}");
    assert_eq!(all["count"], 3, "{all}");
    assert_eq!(all["retentionDays"], 7, "{all}");
    assert!(
        all["events"][0]["event"]["topic"]
            .as_str()
            .unwrap()
            .ends_with("/topics/kept"),
        "as fanned out: {all}"
    );
    let first = json(&list(&[
        "kept",
        "--start-time",
        &time(start),
        "--end-time",
        &time(middle),
    ]));
    assert_eq!(ids(&first), ["first-0", "first-1"], "{first}");
    let second = json(&list(&[
        "kept",
        "--start-time",
        &time(middle),
        "-o",
        "json",
    ]));
    assert_eq!(ids(&second), ["second-0"], "{second}");
    let table = list(&["kept", "--start-time", "1h", "-o", "table"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.status.success() && text.contains("second-0") && text.contains("3 events"),
        "{text} {}",
        stderr(&table)
    );

    for (args, field, value) in [
        (vec!["plain", "--start-time", "1h"], "retentionDays", "0"),
        (
            vec!["kept", "--start-time", "8d"],
            "startTime",
            "or later (the topic keeps 7 days)",
        ),
    ] {
        let out = list(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(field) && err.contains(value), "{err}");
    }
    let out = gridrelay(
        &[
            "topic",
            "update",
            "--name",
            "kept",
            "--retention-days",
            "366",
        ],
        names,
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("retentionDays") && err.contains("366") && err.contains("0 to 365"),
        "{err}"
    );
    // Stored by class: kept's 7 days under archive/7d/, long's 10 in the 30-day class; none
    // in another class nor where archives were written before classes. Each class's objects
    // expire with the bucket's rule of its days.
    let objects =
        gridrelay_adapters::aws::S3ObjectStore::new(gridrelay_adapters::aws::s3_client(&sys.sdk));
    let bucket = &sys.names.journal_bucket;
    let archived_ids = |prefix: &'static str| {
        let objects = &objects;
        async move {
            let mut ids = Vec::new();
            for key in objects.list(bucket, prefix).await.unwrap() {
                let bytes = objects.get_bytes(bucket, &key).await.unwrap();
                let (lines, _) = gridrelay_shared::journal::unpack_object(&bytes);
                let (events, _) = gridrelay_shared::archive::read_archive_lines(&lines);
                ids.extend(events.iter().map(|e| {
                    let event: Value = serde_json::from_str(e.event.get()).unwrap();
                    format!("{}:{}", e.topic, event["id"].as_str().unwrap())
                }));
            }
            ids.sort();
            ids
        }
    };
    assert_eq!(
        archived_ids("archive/7d/").await,
        ["kept:first-0", "kept:first-1", "kept:second-0"]
    );
    assert_eq!(archived_ids("archive/30d/").await, ["long:long-0"]);
    for elsewhere in ["archive/1d/", "archive/90d/", "archive/365d/", "archive/2"] {
        assert!(archived_ids(elsewhere).await.is_empty(), "{elsewhere}");
    }
    for class in gridrelay_shared::archive::ARCHIVE_CLASSES {
        let prefix = gridrelay_shared::archive::class_prefix(class);
        assert_eq!(
            objects.expiration_days(bucket, &prefix).await.unwrap(),
            Some(class + 1),
            "{prefix}: a day past the class"
        );
    }

    // A bucket without the rule of a retention's class (as a stack from before classes):
    // refused on update and on create alike, naming the class's prefix; a class it has is
    // taken.
    objects
        .set_expirations(
            bucket,
            &[
                ("ExpireJournal", "journal/", 7),
                ("ExpireArchive7d", "archive/7d/", 8),
                ("ExpireArchive30d", "archive/30d/", 31),
            ],
        )
        .await
        .expect("rules set");
    for args in [
        vec![
            "topic",
            "update",
            "--name",
            "kept",
            "--retention-days",
            "60",
        ],
        vec![
            "topic",
            "create",
            "--name",
            "longer",
            "--retention-days",
            "1",
        ],
    ] {
        let out = gridrelay(&args, names);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("retentionDays") && err.contains("has no lifecycle rule for archive/"),
            "{err}"
        );
    }
    // kept's retention raised to 30: what it accepts from then on goes to the 30-day class,
    // and its window is read across both.
    let updated = json(&gridrelay(
        &[
            "topic",
            "update",
            "--name",
            "kept",
            "--retention-days",
            "30",
        ],
        names,
    ));
    assert_eq!(updated["eventRetentionInDays"], 30, "{updated}");
    // A warm ingest sees the change within its configuration cache.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    publish("kept", key, events("third", 1)).await;
    let across = gridrelay_e2e::eventually(
        Duration::from_secs(20),
        "four archived events listed",
        || async {
            let listed = json(&list(&["kept", "--start-time", &time(start)]));
            (listed["count"] == 4).then_some(listed)
        },
    )
    .await;
    assert_eq!(
        ids(&across),
        ["first-0", "first-1", "second-0", "third-0"],
        "{across}"
    );
    assert_eq!(
        archived_ids("archive/30d/").await,
        ["kept:third-0", "long:long-0"]
    );
    sys.shutdown().await;
}
/// #35, a replay as an operator runs it: `replay start` of a window sends exactly the topic's
/// archived events of that window again to the subscription, paced to its rate (1 a second:
/// steps of 10, 10 s apart), each with the replay's `gridrelay-replay` header and journaled as
/// the replay's; the runner is killed between steps and started again, and the replay goes on
/// from where its record says and completes with its count (each event counted once: a step
/// is recorded once, whatever SQS redelivers). `replay show`, `list` and `cancel` print it;
/// a second replay of the same name, a rate out of range and a subscription the topic does not
/// have are refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_sends_its_window_again_paced_and_survives_a_kill() {
    let sys = TestSystem::start_with_own_journal(0.01).await;
    let names = sys.names.clone();
    let created = json(&gridrelay(
        &[
            "topic",
            "create",
            "--name",
            "again",
            "--retention-days",
            "1",
        ],
        Some(&names),
    ));
    let key = created["key1"].as_str().unwrap().to_string();
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("again", "billing", &sub.url))
        .await;
    let time =
        |at: chrono::DateTime<chrono::Utc>| at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let publish = |body: Value| {
        let (sys, key) = (&sys, key.clone());
        async move {
            let (status, answer) = sys
                .publish_raw("again", Some(&key), body.to_string().into_bytes())
                .await;
            assert_eq!(status, 200, "{answer}");
        }
    };
    publish(events("before", 2)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let start = chrono::Utc::now();
    publish(events("w", 25)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let end = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    publish(events("after", 2)).await;
    sub.wait_for_requests(29, Duration::from_secs(30)).await;

    let replay = |args: &[&str]| {
        let mut all = vec!["replay"];
        all.extend_from_slice(args);
        gridrelay(&all, Some(&names))
    };
    let window = [
        "--topic-name",
        "again",
        "--start-time",
        &time(start),
        "--end-time",
        &time(end),
    ];
    let mut start_args = vec!["start", "--name", "night", "--rate", "1"];
    start_args.extend_from_slice(&window);
    let started = json(&replay(&start_args));
    assert_eq!(started["state"], "Running", "{started}");
    assert_eq!(started["subscriptions"][0], "billing", "{started}");
    assert_eq!(started["eventsSent"], 0, "{started}");
    let out = replay(&start_args);
    assert!(
        !out.status.success() && stderr(&out).contains("already"),
        "{}",
        stderr(&out)
    );
    for (flags, field) in [
        (vec!["--name", "x", "--rate", "0"], "rate"),
        (
            vec!["--name", "x", "--subscription", "nobody"],
            "subscription",
        ),
        (vec!["--name", "bad name"], "--name"),
    ] {
        let mut args = vec!["start"];
        args.extend_from_slice(&flags);
        args.extend_from_slice(&window);
        let out = replay(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(field), "{err}");
    }

    let show = ["show", "--topic-name", "again", "--name", "night"];
    // The window is sealed 20 s past its end (the local archive stream writes at once), then
    // a step of 10 runs.
    gridrelay_e2e::eventually(Duration::from_secs(60), "the first step", || async {
        let shown = json(&replay(&show));
        (shown["eventsSent"].as_u64() >= Some(10)).then_some(())
    })
    .await;
    let sys = sys.killed_and_restarted().await;
    let done = gridrelay_e2e::eventually(Duration::from_secs(90), "the replay done", || async {
        let shown = json(&replay(&show));
        (shown["state"] == "Completed").then_some(shown)
    })
    .await;
    assert_eq!(done["eventsSent"], 25, "{done}");

    // Completed means all 25 are on the delivery queue; their delivery follows.
    let replayed_ids = || -> Vec<String> {
        sub.received()
            .iter()
            .filter(|r| r.header("gridrelay-replay") == Some("night"))
            .flat_map(|r| r.ids())
            .collect()
    };
    let mut window_ids: Vec<String> = (0..25).map(|i| format!("w-{i}")).collect();
    window_ids.sort();
    gridrelay_e2e::eventually(Duration::from_secs(60), "the window delivered", || async {
        let mut once = replayed_ids();
        once.sort();
        once.dedup();
        (once.len() >= window_ids.len()).then_some(())
    })
    .await;
    let replayed = replayed_ids();
    let mut once: Vec<String> = replayed.clone();
    once.sort();
    once.dedup();
    assert_eq!(once, window_ids, "exactly the window's events");
    eprintln!(
        "replay: {} deliveries of 25 events ({} redelivered after the kill)",
        replayed.len(),
        replayed.len() - 25
    );
    let life = life_once(
        &[
            "event",
            "show",
            "--topic-name",
            "again",
            "--event-id",
            "w-3",
        ],
        &names,
        "the replayed delivery journaled",
        |life| {
            life["subscriptions"][0]["steps"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["replay"] == "night"))
        },
    )
    .await;
    assert!(life.to_string().contains("\"night\""), "{life}");

    let list = json(&replay(&["list", "--topic-name", "again"]));
    assert_eq!(list[0]["name"], "night", "{list}");
    assert_eq!(done["stalled"], false, "{done}");
    let out = replay(&["resume", "--topic-name", "again", "--name", "night"]);
    assert!(
        !out.status.success() && stderr(&out).contains("only a running replay"),
        "{}",
        stderr(&out)
    );
    let cancelled = json(&replay(&[
        "cancel",
        "--topic-name",
        "again",
        "--name",
        "night",
    ]));
    assert_eq!(
        cancelled["state"], "Completed",
        "an ended replay stays as it ended"
    );
    let table = replay(&["list", "--topic-name", "again", "-o", "table"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("night") && text.contains("Completed"),
        "{text}"
    );
    sys.shutdown().await;
}
