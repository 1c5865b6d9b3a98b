//! End-to-end: input and delivery schemas (F2 CloudEvents 1.0, F3 custom), publish in every
//! CloudEvents mode, deliveries parsed by the CloudEvents SDK, schema mismatches refused, and
//! dead-letter records in each schema's naming (L6).

use std::time::Duration;

use cloudevents::AttributesReader;
use gridrelay_e2e::{Received, Reply, Subscriber, TestSystem, events, subscription};
use gridrelay_shared::schema::{InputMapping, InputSchema};
use gridrelay_shared::subscription::SubscriptionRequest;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// Parses one delivery request with the CloudEvents SDK's HTTP binding, as a subscriber would.
fn parse_cloud_event(r: &Received) -> cloudevents::Event {
    cloudevents::binding::http::to_event(&r.headers, r.body.clone().into_bytes())
        .unwrap_or_else(|e| panic!("the CloudEvents SDK reads the delivery: {e}\n{}", r.body))
}

fn cloud_event(id: &str, kind: &str) -> Value {
    json!({"specversion": "1.0", "id": id, "source": "/shop/checkout", "type": kind,
           "subject": format!("orders/{id}"), "time": "2026-11-22T05:00:00Z",
           "datacontenttype": "application/json", "data": {"order": id}, "tenant": "north"})
}

/// F2: a CloudEvents topic takes structured, batched and binary-mode requests; a CloudEvents
/// subscription gets the HTTP binding's structured mode (one event: `application/cloudevents+json`
/// object; a batch: `application/cloudevents-batch+json` array), readable by the CloudEvents SDK;
/// filters read CloudEvents attributes; requests in another schema get a 400 naming the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_events_in_and_out_f2() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys
        .topic_with_schema("checkout", InputSchema::CloudEventSchemaV1_0, None)
        .await;
    let single = Subscriber::start(vec![], Reply::Status(200)).await;
    let batched = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(SubscriptionRequest {
        filter: gridrelay_shared::filter::EventFilter {
            included_event_types: Some(vec!["shop.paid".into()]),
            ..Default::default()
        },
        ..subscription("checkout", "single", &single.url)
    })
    .await;
    sys.subscribe(SubscriptionRequest {
        max_events_per_batch: Some(10),
        ..subscription("checkout", "batched", &batched.url)
    })
    .await;

    let key = Some(topic.key1.as_str());
    let structured = cloud_event("s-1", "Shop.Paid").to_string().into_bytes();
    let (status, body) = sys
        .publish_with_headers(
            "checkout",
            key,
            &[(
                "content-type",
                "application/cloudevents+json; charset=utf-8",
            )],
            structured,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let batch = json!([
        cloud_event("b-1", "Shop.Paid"),
        cloud_event("b-2", "Shop.Refunded")
    ]);
    let (status, body) = sys
        .publish_with_headers(
            "checkout",
            key,
            &[("content-type", "application/cloudevents-batch+json")],
            batch.to_string().into_bytes(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = sys
        .publish_with_headers(
            "checkout",
            key,
            &[
                ("content-type", "application/json"),
                ("ce-specversion", "1.0"),
                ("ce-id", "bin-1"),
                ("ce-source", "/shop/checkout"),
                ("ce-type", "Shop.Paid"),
                ("ce-subject", "orders%2Fbin-1"),
                ("ce-tenant", "south"),
            ],
            br#"{"order": "bin-1"}"#.to_vec(),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Schema mismatches and bad CloudEvents: 400s that say what the topic takes, or which field.
    let (status, body) = sys
        .publish_raw("checkout", key, events("eg", 1).to_string().into_bytes())
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("takes CloudEventSchemaV1_0 events"), "{body}");
    let mut bad = cloud_event("bad", "Shop.Paid");
    bad["specversion"] = json!("0.3");
    let (status, body) = sys
        .publish_with_headers(
            "checkout",
            key,
            &[("content-type", "application/cloudevents-batch+json")],
            json!([cloud_event("ok-but-refused", "Shop.Paid"), bad])
                .to_string()
                .into_bytes(),
        )
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("events[1].specversion"), "{body}");

    // The filtered subscription gets the three Shop.Paid events, one structured event each.
    let got = single.wait_for_requests(3, WAIT).await;
    let mut ids = Vec::new();
    for r in &got {
        assert_eq!(
            r.header("content-type"),
            Some("application/cloudevents+json; charset=utf-8")
        );
        let event = parse_cloud_event(r);
        assert_eq!(event.ty(), "Shop.Paid");
        assert_eq!(event.source().to_string(), "/shop/checkout");
        ids.push(event.id().to_string());
    }
    ids.sort();
    assert_eq!(ids, ["b-1", "bin-1", "s-1"]);
    let binary = got
        .iter()
        .map(parse_cloud_event)
        .find(|e| e.id() == "bin-1")
        .expect("the binary-mode event");
    assert_eq!(
        binary.subject(),
        Some("orders/bin-1"),
        "ce-* headers are percent-decoded"
    );
    assert_eq!(
        binary.extension("tenant").map(|v| v.to_string()),
        Some("south".into())
    );

    // The batching subscription gets every event; a batch of more than one is a CloudEvents batch.
    let batches = gridrelay_e2e::eventually(WAIT, "all four events", || async {
        let r = batched.received();
        (r.iter().map(|x| x.events.len()).sum::<usize>() == 4).then_some(r)
    })
    .await;
    for r in &batches {
        if r.events.len() > 1 {
            assert_eq!(
                r.header("content-type"),
                Some("application/cloudevents-batch+json; charset=utf-8")
            );
            let parsed: Vec<cloudevents::Event> =
                serde_json::from_str(&r.body).expect("the SDK reads each event of the batch");
            assert!(parsed.iter().all(|e| e.source() == "/shop/checkout"));
        } else {
            assert_eq!(parse_cloud_event(r).source().to_string(), "/shop/checkout");
        }
    }
    assert!(
        batches.iter().all(|r| !r.body.contains("ok-but-refused")),
        "a refused request enqueues nothing"
    );
    sys.shutdown().await;
}

/// F2: an Event Grid topic can deliver to a CloudEvents subscriber (Event Grid's mapping:
/// `topic` → `source`, `eventType` → `type`, `eventTime` → `time`) while an Event Grid
/// subscriber of the same topic gets the events unchanged; CloudEvents requests to an Event Grid
/// topic are refused naming the schema; a CloudEvents dead-letter record uses lowercase names (L6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_grid_topic_delivers_cloud_events_and_dead_letters_lowercase_f2_l6() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("orders").await;
    let ce = Subscriber::start(vec![Reply::Status(400)], Reply::Status(200)).await;
    let eg = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(SubscriptionRequest {
        event_delivery_schema: Some("cloudeventschemav1_0".into()),
        dead_letter_destination: Some(sys.dead_letter_url("ce")),
        ..subscription("orders", "as-cloud-events", &ce.url)
    })
    .await;
    sys.subscribe(subscription("orders", "as-event-grid", &eg.url))
        .await;

    let (status, body) = sys
        .publish_with_headers(
            "orders",
            Some(&topic.key1),
            &[("content-type", "application/cloudevents+json")],
            cloud_event("x", "T").to_string().into_bytes(),
        )
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("takes EventGridSchema events"), "{body}");

    sys.publish(&topic, &events("o", 2)).await;
    let plain = eg.wait_for_requests(2, WAIT).await;
    assert!(
        plain
            .iter()
            .all(|r| r.events[0]["eventType"] == "Contoso.Orders.Created")
    );
    assert_eq!(
        plain[0].header("content-type"),
        Some("application/json; charset=utf-8")
    );

    let got = ce.wait_for_requests(2, WAIT).await;
    let delivered = got
        .iter()
        .find(|r| r.reply == Reply::Status(200))
        .expect("a 200");
    let event = parse_cloud_event(delivered);
    assert_eq!(event.ty(), "Contoso.Orders.Created");
    assert_eq!(event.source().to_string(), topic.resource_id());
    assert!(event.subject().is_some_and(|s| s.starts_with("/orders/")));
    assert!(event.time().is_some());
    let data: Value = match event.data() {
        Some(cloudevents::Data::Json(v)) => v.clone(),
        other => panic!("JSON data expected, got {other:?}"),
    };
    assert_eq!(data["note"], "hello");

    let objects = sys.wait_for_dead_letters("ce/", WAIT).await;
    let record = &objects[0].1[0];
    assert_eq!(
        record["specversion"], "1.0",
        "the record is the CloudEvent as delivered"
    );
    assert_eq!(record["deadletterreason"], "MaxDeliveryAttemptsExceeded");
    assert_eq!(record["deliveryattempts"], 1);
    assert_eq!(record["lastdeliveryoutcome"], "BadRequest");
    assert!(record["publishtime"].is_string());
    assert!(record.get("deadLetterReason").is_none());
    sys.shutdown().await;
}

/// F3: a custom-schema topic maps its events' fields into the envelope (with defaults); a
/// custom-schema subscriber gets its own events back, an Event Grid subscriber the envelope, a
/// CloudEvents subscriber the CloudEvent; filters read the mapped fields; a dead-lettered custom
/// event is the Event Grid envelope with the original as `data` (L6); events the mapping cannot
/// fill are refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_input_schema_is_mapped_f3_l6() {
    let sys = TestSystem::start(0.01).await;
    let mapping = InputMapping::from_pairs(
        &[
            "id=orderId".into(),
            "eventtype=kind".into(),
            "subject=path".into(),
        ],
        &["subject=orders/unknown".into(), "dataversion=2".into()],
    )
    .expect("mapping");
    let topic = sys
        .topic_with_schema("legacy", InputSchema::CustomEventSchema, Some(mapping))
        .await;
    let own = Subscriber::start(vec![Reply::Status(413)], Reply::Status(200)).await;
    let envelope = Subscriber::start(vec![], Reply::Status(200)).await;
    let ce = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(SubscriptionRequest {
        dead_letter_destination: Some(sys.dead_letter_url("custom")),
        ..subscription("legacy", "own", &own.url)
    })
    .await;
    sys.subscribe(SubscriptionRequest {
        event_delivery_schema: Some("eventgridschema".into()),
        filter: gridrelay_shared::filter::EventFilter {
            included_event_types: Some(vec!["Shipped".into()]),
            ..Default::default()
        },
        ..subscription("legacy", "envelope", &envelope.url)
    })
    .await;
    sys.subscribe(SubscriptionRequest {
        event_delivery_schema: Some("cloudeventschemav1_0".into()),
        ..subscription("legacy", "as-ce", &ce.url)
    })
    .await;

    let first = json!({"orderId": "A1", "kind": "Placed", "path": "orders/A1", "lines": [1, 2]});
    let second = json!({"orderId": 7, "kind": "Shipped", "carrier": "x"});
    let (status, body) = sys
        .publish_raw(
            "legacy",
            Some(&topic.key1),
            json!([first, second]).to_string().into_bytes(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = sys
        .publish_raw(
            "legacy",
            Some(&topic.key1),
            json!({"orderId": "no-kind"}).to_string().into_bytes(),
        )
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("events[0].eventType"), "{body}");

    let got = own.wait_for_requests(2, WAIT).await;
    let delivered: Vec<&Value> = got
        .iter()
        .filter(|r| r.reply == Reply::Status(200))
        .flat_map(|r| &r.events)
        .collect();
    assert_eq!(delivered.len(), 1);
    assert!(
        *delivered[0] == first || *delivered[0] == second,
        "custom subscribers get their events unchanged: {delivered:?}"
    );

    let wrapped = envelope.wait_for_requests(1, WAIT).await;
    let e = &wrapped[0].events[0];
    assert_eq!(e["id"], "7", "numbers become strings");
    assert_eq!(e["eventType"], "Shipped");
    assert_eq!(
        e["subject"], "orders/unknown",
        "default when the field is missing"
    );
    assert_eq!(e["dataVersion"], "2");
    assert_eq!(e["topic"], topic.resource_id());
    assert_eq!(e["data"], second);

    let as_ce = ce.wait_for_requests(2, WAIT).await;
    let mut types: Vec<String> = as_ce
        .iter()
        .map(|r| parse_cloud_event(r).ty().to_string())
        .collect();
    types.sort();
    assert_eq!(types, ["Placed", "Shipped"]);

    let objects = sys.wait_for_dead_letters("custom/", WAIT).await;
    let record = &objects[0].1[0];
    assert_eq!(record["deadLetterReason"], "MaxDeliveryAttemptsExceeded");
    assert_eq!(record["lastDeliveryOutcome"], "PayloadTooLarge");
    assert_eq!(record["metadataVersion"], "1");
    assert!(record["eventType"].is_string() && record["eventTime"].is_string());
    assert!(
        record["data"] == first || record["data"] == second,
        "the original event is the envelope's data: {record}"
    );
    sys.shutdown().await;
}
