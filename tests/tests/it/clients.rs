//! Existing Event Grid clients work against gridrelay unchanged.

use std::path::PathBuf;
use std::time::Duration;

use cloudevents::AttributesReader;
use gridrelay_e2e::{Reply, Subscriber, TestSystem, events, eventually, subscription};
use gridrelay_local::FrontDoor;
use gridrelay_shared::sas::generate_sas_token;
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::subscription::SubscriptionRequest;

/// The project's virtualenv Python, where `make test` installs `azure-eventgrid`.
fn venv_python() -> PathBuf {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make test` (or infra/local/moto.sh install), which installs azure-eventgrid",
        python.display()
    );
    python
}

/// Publishes `count` events to topic `sdk` with Microsoft's SDK, authenticating by `mode`
/// (`key` or `sas`; `cloudevents` sends CloudEvents with the key to a CloudEvents topic), and
/// returns the subjects the subscriber received.
async fn publish_with_sdk(mode: &str) -> Vec<String> {
    publish_with_sdk_through(mode, FrontDoor::HttpApi).await
}

/// [`publish_with_sdk`] through `front_door` (#38).
async fn publish_with_sdk_through(mode: &str, front_door: FrontDoor) -> Vec<String> {
    let sys = TestSystem::start_with(0.01, |c| c.front_door = front_door).await;
    let schema = if mode == "cloudevents" {
        InputSchema::CloudEventSchemaV1_0
    } else {
        InputSchema::EventGridSchema
    };
    let topic = sys.topic_with_schema("sdk", schema, None).await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(SubscriptionRequest {
        max_events_per_batch: Some(10),
        ..subscription("sdk", "sdk-sub", &sub.url)
    })
    .await;

    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/publish_with_azure_sdk.py");
    let args = [
        sys.system.publish_endpoint("sdk"),
        topic.key2.clone(),
        "4".into(),
        mode.into(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(venv_python())
            .arg(script)
            .args(args)
            .output()
    })
    .await
    .expect("join")
    .expect("python runs");
    assert!(
        out.status.success(),
        "SDK publish failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    eventually(Duration::from_secs(30), "4 SDK events", || async {
        (sub.event_count() >= 4).then_some(())
    })
    .await;
    let events: Vec<_> = sub.received().into_iter().flat_map(|r| r.events).collect();
    if schema == InputSchema::CloudEventSchemaV1_0 {
        let mut subjects = Vec::new();
        for e in events {
            let event: cloudevents::Event =
                serde_json::from_value(e).expect("the CloudEvents SDK reads the event");
            assert_eq!(event.ty(), "Contoso.Items.ItemReceived");
            assert_eq!(event.source().to_string(), "/contoso/doors");
            subjects.push(event.subject().unwrap_or_default().to_string());
        }
        subjects.sort();
        sys.shutdown().await;
        return subjects;
    }
    for e in &events {
        assert_eq!(e["eventType"], "Contoso.Items.ItemReceived");
        assert_eq!(e["dataVersion"], "2.0");
        assert_eq!(e["topic"], "/gridrelay/topics/sdk");
        assert!(e["id"].as_str().is_some_and(|id| !id.is_empty()));
    }
    let mut subjects: Vec<String> = events
        .iter()
        .map(|e| e["subject"].as_str().unwrap_or_default().to_string())
        .collect();
    subjects.sort();
    sys.shutdown().await;
    subjects
}

/// F1, G1: Microsoft's `EventGridPublisherClient` with an `AzureKeyCredential` publishes to a
/// gridrelay topic endpoint without changes, and its events are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_event_grid_sdk_publishes_unmodified_f1() {
    assert_eq!(
        publish_with_sdk("key").await,
        vec!["door/0", "door/1", "door/2", "door/3"]
    );
}

/// SAS tokens (issue: Event Grid's subscriber surface, part 6): the SDK's own `generate_sas`
/// and `AzureSasCredential` (the `aeg-sas-token` header) publish without changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_event_grid_sdk_publishes_with_a_sas_token() {
    assert_eq!(
        publish_with_sdk("sas").await,
        vec!["door/0", "door/1", "door/2", "door/3"]
    );
}

/// F2: the SDK's `CloudEvent`s (sent as `application/cloudevents-batch+json`) publish to a
/// CloudEvents topic without changes and reach a CloudEvents subscriber intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_event_grid_sdk_publishes_cloud_events_f2() {
    assert_eq!(
        publish_with_sdk("cloudevents").await,
        vec!["door/0", "door/1", "door/2", "door/3"]
    );
}

/// #38, F1, F2: through a Lambda function URL front door (the request as its event, the answer
/// as its response format, through the Lambda runtime's adapter), Microsoft's SDK publishes
/// unchanged, with a key, a SAS token and CloudEvents, and the events are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_event_grid_sdk_publishes_through_a_function_url_f1_f2() {
    for mode in ["key", "sas", "cloudevents"] {
        assert_eq!(
            publish_with_sdk_through(mode, FrontDoor::FunctionUrl).await,
            vec!["door/0", "door/1", "door/2", "door/3"],
            "{mode}"
        );
    }
}

/// #38: a publisher gets the same answers, status and body, from either front door: a wrong
/// key (401), a body past the 1 MB publish limit (413, naming it), malformed JSON (400), and
/// the same 200 for a good publish. What no route takes differs as on AWS: the HTTP API
/// answers a path that is no publish endpoint and a GET itself (404, its own body), while
/// behind a function URL ingest answers them (404 naming the publish path, 405 naming POST).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_front_doors_give_a_publisher_the_same_answers() {
    let mut answers = Vec::new();
    for front_door in [FrontDoor::HttpApi, FrontDoor::FunctionUrl] {
        let sys = TestSystem::start_with(0.01, |c| c.front_door = front_door).await;
        let topic = sys.topic("doors").await;
        let url = format!(
            "{}?api-version=2018-01-01",
            sys.system.publish_endpoint("doors")
        );
        let http = reqwest::Client::new();
        let big = format!(r#"[{{"id":"1","data":"{}"}}]"#, "x".repeat(1_100_000));
        let cases = [
            (
                "wrong key",
                http.post(&url).header("aeg-sas-key", "bm90LWl0"),
            ),
            (
                "too big",
                http.post(&url).header("aeg-sas-key", &topic.key1).body(big),
            ),
            (
                "malformed",
                http.post(&url)
                    .header("aeg-sas-key", &topic.key1)
                    .body("[{"),
            ),
            (
                "no such path",
                http.post(url.replace("/api/events", "/api/nothing")),
            ),
            ("a GET", http.get(&url).header("aeg-sas-key", &topic.key1)),
            (
                "good",
                http.post(&url)
                    .header("aeg-sas-key", &topic.key1)
                    .body(events("s", 1).to_string()),
            ),
        ];
        let mut seen = Vec::new();
        for (case, request) in cases {
            let response = request.send().await.expect("answer");
            let status = response.status().as_u16();
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            seen.push((
                case,
                status,
                content_type,
                response.text().await.unwrap_or_default(),
            ));
        }
        sys.shutdown().await;
        answers.push(seen);
    }
    let statuses = |door: usize| -> Vec<_> {
        answers[door]
            .iter()
            .map(|(case, s, _, _)| (*case, *s))
            .collect()
    };
    let same = [("wrong key", 401), ("too big", 413), ("malformed", 400)];
    assert_eq!(
        statuses(0),
        [
            &same[..],
            &[("no such path", 404), ("a GET", 404), ("good", 200)]
        ]
        .concat()
    );
    assert_eq!(
        statuses(1),
        [
            &same[..],
            &[("no such path", 404), ("a GET", 405), ("good", 200)]
        ]
        .concat()
    );
    let too_big = &answers[0][1].3;
    assert!(too_big.contains("1048576"), "the limit is named: {too_big}");
    for case in [0, 1, 2, 5] {
        assert_eq!(
            answers[0][case], answers[1][case],
            "HTTP API, then function URL"
        );
    }
    assert_eq!(
        answers[0][3].3, r#"{"message":"Not Found"}"#,
        "API Gateway's own"
    );
    let (no_path, get) = (&answers[1][3].3, &answers[1][4].3);
    assert!(
        no_path.contains("/topics/{topic}/api/events"),
        "ingest's 404: {no_path}"
    );
    assert!(get.contains("publish with POST"), "ingest's 405: {get}");
}

/// A token that expired, was made for another topic, or was signed with another key is refused
/// with 401 and a reason, and nothing is enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sas_tokens_are_refused() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("guarded").await;
    sys.topic("other").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("guarded", "sub-1", &sub.url))
        .await;
    let url = |t: &str| format!("{}?api-version=2018-01-01", sys.system.publish_endpoint(t));
    let soon = chrono::Utc::now() + chrono::Duration::hours(1);
    let cases = [
        (
            generate_sas_token(
                &url("guarded"),
                &topic.key1,
                chrono::Utc::now() - chrono::Duration::minutes(1),
            ),
            "expired",
        ),
        (
            generate_sas_token(&url("other"), &topic.key1, soon),
            "not this topic",
        ),
        (
            generate_sas_token(&url("guarded"), "b3RoZXIta2V5LW5vdC10aGUtdG9waWNz", soon),
            "neither topic key",
        ),
        (Some("r=x&e=y".to_string()), "malformed"),
    ];
    let http = reqwest::Client::new();
    let publish = |token: String| {
        http.post(url("guarded"))
            .header("aeg-sas-token", token)
            .body(events("s", 1).to_string())
            .send()
    };
    for (token, reason) in cases {
        let response = publish(token.expect("token")).await.expect("answer");
        assert_eq!(response.status().as_u16(), 401);
        let body = response.text().await.unwrap_or_default();
        assert!(body.contains(reason), "{reason}: {body}");
    }
    let good = generate_sas_token(&url("guarded"), &topic.key2, soon).expect("token");
    let response = publish(good).await.expect("answer");
    assert_eq!(response.status().as_u16(), 200);
    sub.wait_for_requests(1, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sub.received().len(), 1, "only the good request delivered");
    sys.shutdown().await;
}
