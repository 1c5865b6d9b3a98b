//! The deployed artifacts run: the `bootstrap` binaries that `cargo lambda build --release`
//! produces are started as processes under an emulated Lambda Runtime API (the HTTP interface
//! Lambda's own runtime serves), invoked with an API Gateway v2 event and SQS events, and their
//! answers and effects checked against the AWS API at `AWS_ENDPOINT_URL`.

use std::time::Duration;

use chrono::Utc;
use gridrelay_adapters::aws::{DynamoSubscriptionStore, local_queue_key, s3_client};
use gridrelay_adapters::config::TableNames;
use gridrelay_e2e::runtime_api::{LambdaProcess, function_url_event, publish_event};
use gridrelay_e2e::{Reply, Subscriber, eventually, sdk_config, subscription};
use gridrelay_local::{ResourceNames, Resources, provision};
use gridrelay_ports::SubscriptionStore;
use gridrelay_shared::message::{DeadLetterMessage, DeliveryQueueMessage};
use gridrelay_shared::queue_seal::{QueueKey, SEAL_ATTRIBUTE};
use gridrelay_shared::subscription::{Subscription, Topic};
use gridrelay_shared::validation::{Provisioning, ProvisioningState};
use serde_json::{Value, json};

struct Setup {
    resources: Resources,
    /// What the functions seal and check their queue messages with (#34 item 2).
    key: QueueKey,
    store: DynamoSubscriptionStore,
    sdk: aws_config::SdkConfig,
}

impl Setup {
    /// Stores subscription `sub-1` on topic `boot`, delivering to `endpoint`.
    async fn subscribe(&self, endpoint: &str) -> Subscription {
        let mut sub = subscription("boot", "sub-1", endpoint)
            .validate(Default::default(), Utc::now())
            .expect("valid");
        // These tests are about the bootstrap binaries, not the handshake: stored as validated.
        sub.provisioning = Provisioning::with_state(ProvisioningState::Succeeded, None);
        self.store
            .create_subscription(&sub)
            .await
            .expect("subscription");
        sub
    }
}

async fn setup() -> Setup {
    let sdk = sdk_config().await;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let names = ResourceNames::with_prefix(&format!("b{}", &id[..12]));
    let resources = provision(&sdk, &names, 3).await.expect("provision");
    let key = local_queue_key(&sdk, &names.queue_key_secret)
        .await
        .expect("the queue key");
    let store = DynamoSubscriptionStore::from_sdk(
        &sdk,
        TableNames {
            topics: names.topics_table.clone(),
            subscriptions: names.subscriptions_table.clone(),
        },
    );
    Setup {
        resources,
        key,
        store,
        sdk,
    }
}

async fn receive_one(sdk: &aws_config::SdkConfig, url: &str) -> String {
    let sqs = aws_sdk_sqs::Client::new(sdk);
    eventually(Duration::from_secs(20), "a queued message", || async {
        let out = sqs
            .receive_message()
            .queue_url(url)
            .wait_time_seconds(1)
            .send()
            .await
            .ok()?;
        out.messages()
            .first()
            .and_then(|m| m.body())
            .map(str::to_string)
    })
    .await
}

/// An SQS event as Lambda hands it over; each record sealed under its key, if it has one.
fn sqs_event(records: &[(&str, String, Option<&QueueKey>)]) -> Value {
    json!({"Records": records.iter().map(|(id, body, key)| json!({
        "messageId": id,
        "receiptHandle": format!("handle-{id}"),
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": match key {
            Some(key) => json!({SEAL_ATTRIBUTE: {"stringValue": key.seal(body), "dataType": "String"}}),
            None => json!({}),
        },
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:queue",
        "awsRegion": "us-east-1"
    })).collect::<Vec<_>>()})
}

/// The ingest bootstrap answers API Gateway v2 events: 200 and a queued message for a good
/// publish, 401 for a wrong key; it logs JSON when Lambda asks for it. #38: it answers a
/// function URL's events as well: 200 for a good publish, 401 for a wrong key, and 404 naming
/// the publish path for a path no HTTP API route would have let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_bootstrap_serves_api_gateway_events() {
    let s = setup().await;
    let topic = Topic {
        key1: "k1-secret".into(),
        key2: "k2-secret".into(),
        ..Topic::with_new_keys("boot", Utc::now())
    };
    s.store.create_topic(&topic).await.expect("topic");
    s.subscribe("http://127.0.0.1:9/hook").await;
    let mut f = LambdaProcess::start("gridrelay-ingest", &s.resources, &[]).await;

    let body = json!([{"id": "b-1", "subject": "s", "eventType": "t", "eventTime": "2026-11-22T04:00:00Z", "data": {"x": 1}}]);
    let ok = f
        .invoke(publish_event("boot", "k1-secret", &body.to_string()))
        .await;
    assert_eq!(ok["statusCode"], 200, "{ok}");
    let denied = f
        .invoke(publish_event("boot", "wrong", &body.to_string()))
        .await;
    assert_eq!(denied["statusCode"], 401, "{denied}");
    let path = "/topics/boot/api/events";
    let url_body = json!([{"id": "b-2", "subject": "s", "eventType": "t", "eventTime": "2026-11-22T04:00:00Z", "data": {"x": 2}}]);
    let through_url = f
        .invoke(function_url_event(path, "k2-secret", &url_body.to_string()))
        .await;
    assert_eq!(through_url["statusCode"], 200, "{through_url}");
    let url_denied = f.invoke(function_url_event(path, "wrong", "[]")).await;
    assert_eq!(url_denied["statusCode"], 401, "{url_denied}");
    let nowhere = f
        .invoke(function_url_event("/admin", "k2-secret", "[]"))
        .await;
    assert_eq!(nowhere["statusCode"], 404, "{nowhere}");
    assert!(
        nowhere["body"]
            .as_str()
            .unwrap_or_default()
            .contains("/topics/{topic}/api/events"),
        "{nowhere}"
    );

    // Both publishes are queued: the HTTP API's and the function URL's.
    let mut ids = Vec::new();
    while ids.len() < 2 {
        let body = receive_one(&s.sdk, &s.resources.delivery_queue_url).await;
        let Ok(DeliveryQueueMessage::Delivery(queued)) = DeliveryQueueMessage::from_body(&body)
        else {
            panic!("expected a delivery message, got {body}")
        };
        assert_eq!(
            (queued.topic.as_str(), queued.subscription.as_str()),
            ("boot", "sub-1")
        );
        let event: Value = serde_json::from_str(queued.events[0].event.get()).expect("event");
        let id = event["id"].as_str().unwrap_or_default().to_string();
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids.sort();
    assert_eq!(ids, ["b-1", "b-2"]);
    let logs = f.stop().await;
    assert!(
        logs.lines().any(|l| serde_json::from_str::<Value>(l)
            .is_ok_and(|v| v["fields"]["message"] == "published")),
        "JSON log lines expected, got: {logs}"
    );
}

/// The deliver bootstrap answers SQS events with batch-item failures: the unreadable record
/// only; the good record's event is POSTed to the subscriber. A record gridrelay did not write
/// (no seal) is neither: dropped unseen and counted (#34 item 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_bootstrap_reports_batch_item_failures() {
    let s = setup().await;
    let subscriber = Subscriber::start(vec![], Reply::Status(200)).await;
    let sub = s.subscribe(&subscriber.url).await;
    let message = json!({
        "topic": "boot", "subscription": "sub-1", "subscription_id": sub.id,
        "attempts": 0, "not_before": Utc::now(),
        "events": [{"publish_time": Utc::now(), "event": {"id": "d-1", "data": {}}}]
    });
    let mut f = LambdaProcess::start(
        "gridrelay-deliver",
        &s.resources,
        &[
            ("GRIDRELAY_STACK_NAME", "boot-stack"),
            // The subscriber is on loopback, which the function refuses unless allowed.
            ("GRIDRELAY_ALLOWED_NETWORKS", "127.0.0.0/8"),
        ],
    )
    .await;

    let forged = message.to_string().replace("d-1", "forged-1");
    let answer = f
        .invoke(sqs_event(&[
            ("good", message.to_string(), Some(&s.key)),
            ("poison", "not json".into(), Some(&s.key)),
            ("forged", forged, None),
        ]))
        .await;
    assert_eq!(
        answer,
        json!({"batchItemFailures": [{"itemIdentifier": "poison"}]})
    );
    let received: Vec<String> = subscriber.received().iter().flat_map(|r| r.ids()).collect();
    assert_eq!(received, ["d-1"]);

    // Issue #9: after the invocation, its metrics in CloudWatch embedded metric format, one
    // document for the subscription and one for the stack, each with its dimensions.
    let logged = f.stop().await;
    let documents: Vec<Value> = logged
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Gridrelay")
        .collect();
    let dimensions = |d: &Value| -> Vec<String> {
        let mut names: Vec<String> = d["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        names.sort();
        names
    };
    let metric_names = |d: &Value| -> Vec<String> {
        d["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["Name"].as_str().map(str::to_string))
            .collect()
    };
    let of_subscription = documents
        .iter()
        .find(|d| d["Subscription"] == "sub-1")
        .unwrap_or_else(|| panic!("no metrics for sub-1 in {logged}"));
    assert_eq!(
        dimensions(of_subscription),
        ["Stack", "Subscription", "Topic"]
    );
    assert_eq!(of_subscription["Stack"], "boot-stack");
    assert_eq!(of_subscription["Topic"], "boot");
    assert_eq!(of_subscription["EventsDelivered"], 1);
    assert!(metric_names(of_subscription).contains(&"DeliveryLatency".to_string()));
    let latency = of_subscription["DeliveryLatency"][0]
        .as_f64()
        .or_else(|| of_subscription["DeliveryLatency"].as_f64())
        .expect("a latency value");
    assert!((0.0..60_000.0).contains(&latency), "latency {latency} ms");
    let of_stack = documents
        .iter()
        .find(|d| dimensions(d) == ["Stack"])
        .unwrap_or_else(|| panic!("no metrics for the stack in {logged}"));
    assert_eq!(of_stack["EventsDelivered"], 1);
    assert!(
        documents
            .iter()
            .any(|d| dimensions(d) == ["Stack"] && d["UnsealedMessagesDropped"] == 1),
        "UnsealedMessagesDropped for the stack in {logged}"
    );
}

/// An API Gateway v2 event of `GET path?query` carrying `cookies` as API Gateway does: in
/// their own field, not a header.
fn get_event(path: &str, query: &str, cookies: &[String]) -> Value {
    let route = if path.ends_with(".css") {
        "GET /portal/gridrelay.css"
    } else {
        "GET /portal/{topic}/{name}"
    };
    portal_event(route, path, query, cookies)
}

/// An API Gateway v2 event of a form `POST path` (its body base64-encoded, as API Gateway
/// passes form bodies) from a page of the same site, carrying `cookies`.
fn post_event(route: &str, path: &str, cookies: &[String], form: &str) -> Value {
    use base64::Engine;
    let mut event = portal_event(route, path, "", cookies);
    event["requestContext"]["http"]["method"] = json!("POST");
    event["headers"]["content-type"] = json!("application/x-www-form-urlencoded");
    event["headers"]["origin"] = json!("null");
    event["headers"]["sec-fetch-site"] = json!("same-origin");
    event["body"] = json!(base64::engine::general_purpose::STANDARD.encode(form));
    event["isBase64Encoded"] = json!(true);
    event
}

/// #38: `event` as a function URL hands it over instead of the HTTP API: the `$default`
/// route, the URL's own host, an anonymous caller.
fn via_function_url(mut event: Value) -> Value {
    let host = "abcdefghijklmnopqrstuvwxyz012345.lambda-url.us-east-1.on.aws";
    event["routeKey"] = json!("$default");
    event["requestContext"]["routeKey"] = json!("$default");
    event["requestContext"]["accountId"] = json!("anonymous");
    event["requestContext"]["domainName"] = json!(host);
    event["headers"]["host"] = json!(host);
    event
}

fn portal_event(route: &str, path: &str, query: &str, cookies: &[String]) -> Value {
    json!({
        "version": "2.0",
        "routeKey": route,
        "rawPath": path,
        "rawQueryString": query,
        "cookies": cookies,
        "headers": {"host": "abc.execute-api.us-east-1.amazonaws.com", "accept": "text/html"},
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc",
            "domainName": "abc.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "abc",
            "http": {"method": "GET", "path": path, "protocol": "HTTP/1.1",
                     "sourceIp": "127.0.0.1", "userAgent": "test"},
            "requestId": "req-portal",
            "routeKey": route,
            "stage": "$default",
            "time": "28/Nov/2026:08:00:00 +0000",
            "timeEpoch": 1795852800000i64
        },
        "isBase64Encoded": false
    })
}

/// A Lambda proxy answer's body as text, whether or not it came base64-encoded.
fn body_text(answer: &Value) -> String {
    use base64::Engine;
    let body = answer["body"].as_str().unwrap_or_default();
    if answer["isBase64Encoded"] == true {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(body)
            .expect("base64 body");
        String::from_utf8_lossy(&bytes).into_owned()
    } else {
        body.to_string()
    }
}

/// #36: the portal bootstrap serves a subscription's page behind API Gateway. A link's token
/// is exchanged for a `Secure` cookie handed back in the proxy answer's `cookies` (where API
/// Gateway v2 takes them from) and a 303 to the page; the page, asked with that cookie as API
/// Gateway passes it, shows the attempt the deliver bootstrap journaled (a 503, read from the
/// journal's bucket); another subscription's link is refused; the style sheet is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portal_bootstrap_serves_a_subscriptions_page_behind_api_gateway() {
    use gridrelay_shared::portal::PortalGrant;
    let s = setup().await;
    let subscriber = Subscriber::start(vec![], Reply::Status(503)).await;
    let sub = s.subscribe(&subscriber.url).await;
    let message = json!({
        "topic": "boot", "subscription": "sub-1", "subscription_id": sub.id,
        "attempts": 0, "not_before": Utc::now(),
        "events": [{"publish_time": Utc::now(), "event": {"id": "p-1", "data": {}}}]
    });
    let names = &s.resources.names;
    let mut deliver = LambdaProcess::start(
        "gridrelay-deliver",
        &s.resources,
        &[
            ("GRIDRELAY_ALLOWED_NETWORKS", "127.0.0.0/8"),
            ("GRIDRELAY_JOURNAL_STREAM", &names.journal_stream),
        ],
    )
    .await;
    let answer = deliver
        .invoke(sqs_event(&[("m1", message.to_string(), Some(&s.key))]))
        .await;
    assert_eq!(
        answer,
        json!({"batchItemFailures": []}),
        "retried, not failed"
    );
    deliver.stop().await;
    assert_eq!(subscriber.received().len(), 1, "one attempt, answered 503");

    let mut portal = LambdaProcess::start(
        "gridrelay-portal",
        &s.resources,
        &[
            ("GRIDRELAY_JOURNAL_BUCKET", &names.journal_bucket),
            ("GRIDRELAY_PORTAL_KEY_SECRET", &names.portal_key_secret),
        ],
    )
    .await;
    let key = gridrelay_adapters::aws::portal_key(&s.sdk, &names.portal_key_secret)
        .await
        .expect("the portal key");
    let link = |sub: &Subscription| {
        PortalGrant::new(sub, Utc::now(), chrono::TimeDelta::hours(1), "--expires-in")
            .expect("a grant")
            .token(&key)
    };
    let token = link(&sub);
    let first = portal
        .invoke(get_event(
            "/portal/boot/sub-1",
            &format!("token={token}"),
            &[],
        ))
        .await;
    assert_eq!(first["statusCode"], 303, "{first}");
    assert_eq!(
        first["headers"]["location"], "/portal/boot/sub-1",
        "{first}"
    );
    let cookies: Vec<&str> = first["cookies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let [cookie] = cookies[..] else {
        panic!("one cookie in the answer's cookies, got {first}")
    };
    for attribute in [
        "HttpOnly",
        "Secure",
        "SameSite=Lax",
        "Path=/portal/boot/sub-1",
    ] {
        assert!(cookie.contains(attribute), "{attribute} in {cookie}");
    }
    let pair = cookie.split(';').next().expect("name=value").to_string();
    assert_eq!(pair, format!("gridrelay_portal={token}"));

    // The journal's object is written as the stream takes the record: moto's at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let page = loop {
        let page = portal
            .invoke(get_event(
                "/portal/boot/sub-1",
                "",
                std::slice::from_ref(&pair),
            ))
            .await;
        // The attempt's row: its event and status, from the journal (not the health badge).
        if page["statusCode"] == 200 && body_text(&page).contains("<code>p-1</code>") {
            break page;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the journaled attempt on the page within 20 s: {page}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let html = body_text(&page);
    assert!(html.contains("Deliveries to sub-1"), "{html}");
    assert!(html.contains(r#"<td class="num">503</td>"#), "{html}");
    assert!(
        !html.contains(&names.journal_bucket),
        "the stack's names stay out: {html}"
    );
    assert_eq!(page["headers"]["referrer-policy"], "no-referrer", "{page}");

    let other = portal
        .invoke(get_event(
            "/portal/boot/sub-1",
            &format!(
                "token={}",
                link(
                    &subscription("boot", "sub-2", &subscriber.url)
                        .validate(Default::default(), Utc::now())
                        .expect("valid")
                )
            ),
            &[],
        ))
        .await;
    assert_eq!(other["statusCode"], 403, "{other}");
    assert!(
        other["cookies"].as_array().is_none_or(Vec::is_empty),
        "{other}"
    );

    // #38: behind a function URL, the same link becomes the same cookie (in the answer's
    // cookies, where a function URL takes them from too), and the page shows the attempt.
    let first_url = portal
        .invoke(via_function_url(get_event(
            "/portal/boot/sub-1",
            &format!("token={token}"),
            &[],
        )))
        .await;
    assert_eq!(first_url["statusCode"], 303, "{first_url}");
    let url_cookie = first_url["cookies"][0].as_str().unwrap_or_default();
    assert!(
        url_cookie.starts_with(&format!("{pair};")) && url_cookie.contains("Secure"),
        "{first_url}"
    );
    let page_url = portal
        .invoke(via_function_url(get_event(
            "/portal/boot/sub-1",
            "",
            std::slice::from_ref(&pair),
        )))
        .await;
    assert_eq!(page_url["statusCode"], 200, "{page_url}");
    assert!(
        body_text(&page_url).contains("<code>p-1</code>"),
        "{page_url}"
    );

    // The page's form sends a test event into the delivery queue (sealed, as every message).
    let form_token = html
        .split(r#"name="form_token" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page's form token")
        .to_string();
    let sent = portal
        .invoke(post_event(
            "POST /portal/{topic}/{name}/test-event",
            "/portal/boot/sub-1/test-event",
            std::slice::from_ref(&pair),
            &format!("form_token={form_token}"),
        ))
        .await;
    assert_eq!(sent["statusCode"], 200, "{sent}");
    assert!(body_text(&sent).contains("Test event sent"), "{sent}");
    let sqs = aws_sdk_sqs::Client::new(&s.sdk);
    let queued = eventually(Duration::from_secs(20), "the test event queued", || async {
        let out = sqs
            .receive_message()
            .queue_url(&s.resources.delivery_queue_url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .wait_time_seconds(1)
            .send()
            .await
            .ok()?;
        out.messages()
            .iter()
            .find(|m| {
                m.body()
                    .is_some_and(|b| b.contains("Gridrelay.Portal.TestEvent"))
            })
            .cloned()
    })
    .await;
    let body = queued.body().unwrap_or_default();
    let seal = queued
        .message_attributes()
        .and_then(|a| a.get(SEAL_ATTRIBUTE))
        .and_then(|v| v.string_value())
        .expect("a sealed message");
    assert_eq!(seal, s.key.seal(body));
    let Ok(DeliveryQueueMessage::Delivery(message)) = DeliveryQueueMessage::from_body(body) else {
        panic!("a delivery message: {body}")
    };
    assert_eq!(message.subscription, "sub-1");

    let style = portal
        .invoke(get_event("/portal/gridrelay.css", "", &[]))
        .await;
    assert_eq!(style["statusCode"], 200, "{style}");
    assert!(
        style["headers"]["content-type"]
            .as_str()
            .is_some_and(|t| t.starts_with("text/css")),
        "{style}"
    );
    portal.stop().await;
}

/// The dead-letter bootstrap writes the records of an SQS event to S3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_bootstrap_writes_to_s3() {
    let s = setup().await;
    let bucket = s.resources.names.dead_letter_bucket.clone();
    let message = json!({
        "topic": "boot", "subscription": "sub-1",
        "destination": {"bucket": bucket, "prefix": "dl"},
        "dead_lettered_at": Utc::now(),
        "entries": [{"reason": "MaxDeliveryAttemptsExceeded", "delivery_attempts": 30, "last_outcome": "Busy",
                     "publish_time": Utc::now(), "last_attempt_time": Utc::now(), "event": {"id": "z-1", "data": {}}}]
    });
    DeadLetterMessage::from_body(&message.to_string()).expect("a valid dead-letter message");
    let mut f = LambdaProcess::start("gridrelay-dead-letter", &s.resources, &[]).await;

    let answer = f
        .invoke(sqs_event(&[("m1", message.to_string(), Some(&s.key))]))
        .await;
    assert_eq!(answer, json!({"batchItemFailures": []}));
    let s3 = s3_client(&s.sdk);
    let listed = s3
        .list_objects_v2()
        .bucket(&bucket)
        .prefix("dl/boot/sub-1/")
        .send()
        .await
        .expect("list");
    assert_eq!(listed.contents().len(), 1);
    f.stop().await;
}
