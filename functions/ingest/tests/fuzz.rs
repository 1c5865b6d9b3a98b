//! Fuzzing publish parsing and fan-out (#8, item 3; G1, F1, B1): the real `ingest` handler on
//! in-memory ports, fed arbitrary bytes, arbitrary JSON (numbers no `f64` holds, nesting past
//! serde_json's limit, duplicate keys, odd strings) and Event Grid events with arbitrary fields.
//!
//! For every input: no panic; the answer is 200, 400 or 413 (nothing in these inputs is a
//! reason to ask for a retry); a refused request enqueues nothing; and an accepted one has
//! enqueued each of its events for exactly the subscriptions whose filter it passes — read
//! independently here from the request body — and for no other (200 means delivered, G1).
//!
//! `make test` runs `FUZZ_CASES` (default 3,000) inputs per strategy; `make soak` a million.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Utc;
use gridrelay_ingest::{Ingest, PublishRequest};
use gridrelay_ports::SubscriptionStore;
use gridrelay_ports::memory::{ManualClock, MemoryQueue, MemorySubscriptionStore};
use gridrelay_shared::filter::{AdvancedFilter, EventFilter};
use gridrelay_shared::message::DeliveryQueueMessage;
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::subscription::{Subscription, SubscriptionRequest, Topic};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;
use serde_json::value::RawValue;

/// A topic with four validated subscriptions: everything; by type and subject; by advanced
/// filters on `data` (numbers, strings, presence); and everything as CloudEvents (every event
/// converted at fan-out).
struct World {
    store: Arc<MemorySubscriptionStore>,
    clock: Arc<ManualClock>,
    topic: Topic,
    subscriptions: Vec<Subscription>,
    runtime: tokio::runtime::Runtime,
    /// Inputs checked, and how many of them were accepted.
    checked: std::cell::Cell<(usize, usize)>,
}

impl World {
    fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let store = Arc::new(MemorySubscriptionStore::default());
        let topic = Topic::with_new_keys("orders", Utc::now());
        let advanced = |key: &str, op: &str, values: &[&str]| {
            let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
            AdvancedFilter::parse(key, op, &values).expect("a valid advanced filter")
        };
        let filters = [
            ("everything", EventFilter::default(), None),
            (
                "typed",
                EventFilter {
                    included_event_types: Some(vec!["Contoso.A".into()]),
                    subject_begins_with: Some("/a".into()),
                    ..EventFilter::default()
                },
                None,
            ),
            (
                "advanced",
                EventFilter {
                    advanced_filters: vec![
                        advanced("data.n", "NumberGreaterThan", &["10"]),
                        advanced("data.s", "StringContains", &["x"]),
                        advanced("data.deep", "IsNullOrUndefined", &[]),
                    ],
                    ..EventFilter::default()
                },
                None,
            ),
            (
                "cloud",
                EventFilter::default(),
                Some("cloudeventschemav1_0".to_string()),
            ),
        ];
        let subscriptions = runtime.block_on(async {
            store.create_topic(&topic).await.expect("topic");
            let mut subscriptions = Vec::new();
            for (name, filter, schema) in filters {
                let request = SubscriptionRequest {
                    topic: topic.name.clone(),
                    name: name.into(),
                    endpoint: format!("https://example.com/{name}"),
                    filter,
                    event_delivery_schema: schema,
                    ..SubscriptionRequest::default()
                };
                subscriptions.push(store.insert_validated(
                    request,
                    InputSchema::EventGridSchema,
                    Utc::now(),
                ));
            }
            subscriptions
        });
        Self {
            store,
            clock,
            topic,
            subscriptions,
            runtime,
            checked: std::cell::Cell::new((0, 0)),
        }
    }

    /// Publishes `body` on a fresh queue and checks the answer and what was enqueued.
    fn check(&self, body: &[u8]) -> Result<(), TestCaseError> {
        let queue = Arc::new(MemoryQueue::new(self.clock.clone()));
        let ingest = Ingest {
            store: self.store.clone(),
            delivery_queue: queue.clone(),
            archives: gridrelay_ports::ArchiveStreams::default(),
            accepted_ids: Arc::new(gridrelay_ports::memory::MemoryAcceptedIds::default()),
            clock: self.clock.clone(),
        };
        let answer = self
            .runtime
            .block_on(ingest.publish(PublishRequest::json_with_key(&self.topic, body)));
        prop_assert!(
            [200, 400, 413].contains(&answer.status),
            "answer {} ({}) to {}",
            answer.status,
            answer.body,
            String::from_utf8_lossy(body)
        );
        let sent = queue.sent();
        let (checked, accepted) = self.checked.get();
        self.checked
            .set((checked + 1, accepted + usize::from(answer.status == 200)));
        if answer.status != 200 {
            prop_assert!(
                sent.is_empty(),
                "refused with {} but enqueued",
                answer.status
            );
            return Ok(());
        }
        // Accepted: each event of the body is one that a `Value` holds (item 3).
        let events = events_of(body)?;
        let mut enqueued: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for message in &sent {
            match DeliveryQueueMessage::from_body(&message.body) {
                Ok(DeliveryQueueMessage::Delivery(m)) => {
                    let ids = enqueued.entry(m.subscription.clone()).or_default();
                    for queued in &m.events {
                        let event: Value = serde_json::from_str(queued.event.get())
                            .map_err(|e| TestCaseError::fail(format!("unreadable event: {e}")))?;
                        ids.push(event["id"].to_string());
                    }
                }
                other => return Err(TestCaseError::fail(format!("not a delivery: {other:?}"))),
            }
        }
        let fields = InputSchema::EventGridSchema.filter_fields();
        for sub in &self.subscriptions {
            let expected: Vec<String> = events
                .iter()
                .filter(|e| sub.filter.matches(e, fields))
                .map(|e| e["id"].to_string())
                .collect();
            let mut got = enqueued.remove(&sub.name).unwrap_or_default();
            let mut want = expected;
            got.sort();
            want.sort();
            prop_assert_eq!(got, want, "events enqueued for {}", sub.name);
        }
        prop_assert!(
            enqueued.is_empty(),
            "enqueued for no subscription: {:?}",
            enqueued
        );
        Ok(())
    }
}

/// The published events as `Value`s, each read on its own (an event may be nested up to the
/// limit, so the array around it may not be).
fn events_of(body: &[u8]) -> Result<Vec<Value>, TestCaseError> {
    let unreadable = |e: serde_json::Error| {
        TestCaseError::fail(format!("accepted an event serde_json cannot read ({e})"))
    };
    match serde_json::from_slice::<Vec<&RawValue>>(body) {
        Ok(raw) => raw
            .iter()
            .map(|e| serde_json::from_str(e.get()).map_err(unreadable))
            .collect(),
        Err(_) => Ok(vec![serde_json::from_slice(body).map_err(unreadable)?]),
    }
}

/// How many inputs each strategy gets: `FUZZ_CASES`, default 3,000.
fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000)
}

/// Checks `cases()` inputs of `strategy`; returns how many were checked and how many accepted.
fn run(strategy: impl Strategy<Value = Vec<u8>>) -> (usize, usize) {
    let world = World::new();
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, |body| world.check(&body)) {
        panic!("{e}");
    }
    let (checked, accepted) = world.checked.get();
    println!("fuzz: {checked} inputs, {accepted} accepted");
    (checked, accepted)
}

/// Numbers as they may be written, including ones no `f64` holds.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| f.to_string()),
        (-20i32..20).prop_map(|n| n.to_string()),
        Just("1e400".to_string()),
        Just("-1e400".to_string()),
        Just("1e-400".to_string()),
        Just("-0".to_string()),
        Just("123456789012345678901234567890".to_string()),
        Just("1.7976931348623157e308".to_string()),
    ]
}

/// A JSON string literal, with escapes and characters beyond ASCII.
fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z/x.]{0,8}".prop_map(|s| format!("\"{s}\"")),
        any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
        Just(r#""\u0000\ud83d\ude00\n""#.to_string()),
        Just(r#""\ud800""#.to_string()),
    ]
}

/// Keys drawn from a small set, so objects repeat them.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("\"id\"".to_string()),
        Just("\"data\"".to_string()),
        Just("\"n\"".to_string()),
        Just("\"s\"".to_string()),
        Just("\"deep\"".to_string()),
        Just("\"eventType\"".to_string()),
        string(),
    ]
}

/// Any JSON text (and some that is nearly JSON).
fn json() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        number(),
        string(),
    ];
    leaf.prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5)
                .prop_map(|items| format!("[{}]", items.join(","))),
            prop::collection::vec((key(), inner), 0..5).prop_map(|fields| {
                let fields: Vec<String> = fields
                    .into_iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect();
                format!("{{{}}}", fields.join(","))
            }),
        ]
    })
}

/// Nesting around serde_json's limit of 128.
fn deep() -> impl Strategy<Value = String> {
    (100usize..140, any::<bool>()).prop_map(|(depth, arrays)| {
        if arrays {
            format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
        } else {
            format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
        }
    })
}

/// An Event Grid event whose fields are each well formed or arbitrary, sometimes missing or
/// given twice.
fn event() -> impl Strategy<Value = String> {
    let id = prop_oneof![4 => (0u32..50).prop_map(|n| format!("\"e{n}\"")), 1 => json()];
    let subject = prop_oneof![
        4 => "/[ab][a-z/]{0,6}".prop_map(|s| format!("\"{s}\"")),
        1 => json(),
    ];
    let event_type = prop_oneof![
        2 => Just("\"Contoso.A\"".to_string()),
        2 => Just("\"contoso.a\"".to_string()),
        2 => Just("\"Contoso.B\"".to_string()),
        1 => json(),
    ];
    let time = prop_oneof![4 => Just("\"2026-11-23T20:00:00Z\"".to_string()), 1 => json()];
    let data = prop_oneof![
        3 => (number(), string(), prop::option::of(json())).prop_map(|(n, s, deep)| match deep {
            Some(d) => format!("{{\"n\":{n},\"s\":{s},\"deep\":{d}}}"),
            None => format!("{{\"n\":{n},\"s\":{s}}}"),
        }),
        1 => deep(),
        1 => json(),
    ];
    (
        id,
        subject,
        event_type,
        time,
        data,
        prop::option::weighted(0.9, Just("\"dataVersion\":\"1\"")),
        prop::option::weighted(0.05, (key(), json())),
        prop::option::weighted(0.03, Just(())),
    )
        .prop_map(
            |(id, subject, event_type, time, data, version, extra, drop_id)| {
                let mut fields = vec![
                    format!("\"subject\":{subject}"),
                    format!("\"eventType\":{event_type}"),
                    format!("\"eventTime\":{time}"),
                    format!("\"data\":{data}"),
                ];
                if drop_id.is_none() {
                    fields.insert(0, format!("\"id\":{id}"));
                }
                fields.extend(version.map(str::to_string));
                fields.extend(extra.map(|(k, v)| format!("{k}:{v}")));
                format!("{{{}}}", fields.join(","))
            },
        )
}

/// G1, B1, F1, item 3: arbitrary bytes.
#[test]
fn arbitrary_bytes_never_panic_and_a_refusal_enqueues_nothing() {
    run(prop::collection::vec(any::<u8>(), 0..256));
}

/// G1, F1, item 3: arbitrary JSON, including numbers no `f64` holds and nesting past 128.
#[test]
fn arbitrary_json_is_refused_or_reaches_every_matching_subscription() {
    run(prop_oneof![3 => json(), 1 => deep()].prop_map(String::into_bytes));
}

/// G1, F1, item 3: arrays of events with arbitrary fields: an accepted request has put each
/// event in the queue for exactly the subscriptions whose filter it passes.
#[test]
fn accepted_events_reach_exactly_the_subscriptions_whose_filter_they_pass() {
    let body =
        prop::collection::vec(event(), 0..6).prop_map(|events| format!("[{}]", events.join(",")));
    let (checked, accepted) = run(body.prop_map(String::into_bytes));
    // The property is about accepted requests: enough of them must be among the inputs.
    assert!(
        accepted * 10 >= checked,
        "only {accepted} of {checked} inputs were accepted"
    );
}
