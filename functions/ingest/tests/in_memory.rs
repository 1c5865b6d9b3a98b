//! The ingest handler on in-memory ports: publish requests whose problem is the same every
//! time they are sent are refused (400/413) with nothing enqueued, instead of a 503 that
//! invites a retry that fails again and duplicates what was enqueued for other subscriptions.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use chrono::Utc;
use gridrelay_ingest::{Ingest, PublishRequest, PublishResponse};
use gridrelay_ports::SubscriptionStore;
use gridrelay_ports::memory::{
    ManualClock, MemoryAcceptedIds, MemoryJournal, MemoryQueue, MemorySubscriptionStore,
};
use gridrelay_shared::archive::read_archive_lines;
use gridrelay_shared::schema::{InputMapping, InputSchema};
use gridrelay_shared::subscription::{SubscriptionRequest, Topic};

struct World {
    store: Arc<MemorySubscriptionStore>,
    queue: Arc<MemoryQueue>,
    archive: Arc<MemoryJournal>,
    accepted_ids: Arc<MemoryAcceptedIds>,
    clock: Arc<ManualClock>,
    ingest: Ingest,
    topic: Topic,
}

impl World {
    /// A topic with two validated subscriptions: one receives Event Grid events, one
    /// CloudEvents (so every event is converted at fan-out).
    async fn new(topic: Topic) -> Self {
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let store = Arc::new(MemorySubscriptionStore::default());
        let queue = Arc::new(MemoryQueue::new(clock.clone()));
        store.create_topic(&topic).await.unwrap();
        for (name, schema) in [("plain", None), ("cloud", Some("cloudeventschemav1_0"))] {
            let request = SubscriptionRequest {
                topic: topic.name.clone(),
                name: name.into(),
                endpoint: format!("https://example.com/{name}"),
                event_delivery_schema: schema.map(str::to_string),
                ..SubscriptionRequest::default()
            };
            store.insert_validated(request, topic.input_schema, Utc::now());
        }
        let archive = Arc::new(MemoryJournal::default());
        let accepted_ids = Arc::new(MemoryAcceptedIds::default());
        let ingest = Ingest {
            store: store.clone(),
            delivery_queue: queue.clone(),
            archives: gridrelay_ports::ArchiveStreams::every_class(archive.clone()),
            accepted_ids: accepted_ids.clone(),
            clock: clock.clone(),
        };
        Self {
            store,
            queue,
            archive,
            accepted_ids,
            clock,
            ingest,
            topic,
        }
    }

    async fn publish(&self, body: &str) -> PublishResponse {
        self.ingest
            .publish(PublishRequest::json_with_key(&self.topic, body.as_bytes()))
            .await
    }
}

/// Item 8: an event with its `data` field twice is refused with a 400 naming it, and nothing
/// of the request is enqueued for any subscription (it used to be a 503, after which every
/// retry failed the same way).
#[tokio::test]
async fn a_duplicate_field_is_refused_and_nothing_is_enqueued() {
    let w = World::new(Topic::with_new_keys("orders", Utc::now())).await;
    let body = r#"[{"id":"1","subject":"s","eventType":"t","eventTime":"2026-11-23T00:00:00Z","data":{}},
        {"id":"2","subject":"s","eventType":"t","eventTime":"2026-11-23T00:00:00Z","data":{"a":1},"data":{"a":2}}]"#;
    let answer = w.publish(body).await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("events[1].data"), "{}", answer.body);
    assert!(w.queue.sent().is_empty());
    assert_eq!(w.store.list_subscriptions("orders").await.unwrap().len(), 2);
}

/// Item 8: a custom-schema event whose envelope (mapped fields are copied into it) would not
/// fit a queue message is refused with 413 naming it, and nothing is enqueued.
#[tokio::test]
async fn a_custom_envelope_too_large_to_enqueue_is_refused() {
    let mapping = InputMapping {
        subject_field: Some("note".into()),
        default_event_type: Some("t".into()),
        ..InputMapping::default()
    };
    let topic = Topic::with_new_keys("custom", Utc::now())
        .with_input_schema(InputSchema::CustomEventSchema, Some(mapping))
        .unwrap();
    let w = World::new(topic).await;
    // 600 KB of note: the event fits the limit, its envelope (the note twice) does not.
    let note = "n".repeat(600_000);
    let answer = w
        .publish(&format!(r#"[{{"small":1}},{{"note":"{note}"}}]"#))
        .await;
    assert_eq!(answer.status, 413, "{answer:?}");
    assert!(answer.body.contains("events[1]"), "{}", answer.body);
    assert!(w.queue.sent().is_empty());
    assert_eq!(w.publish(r#"[{"small":1}]"#).await.status, 200);
    assert_eq!(w.queue.sent().len(), 2, "one message for each subscription");
}

/// Issue #9, warm caches: ingest in front of a cache, and the store behind it.
struct Warm {
    store: Arc<MemorySubscriptionStore>,
    queue: Arc<MemoryQueue>,
    clock: Arc<ManualClock>,
    ingest: Ingest,
}

const CACHE_TIME: std::time::Duration = std::time::Duration::from_secs(10);

async fn warm(topic: &Topic) -> Warm {
    let w = World::new(topic.clone()).await;
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let cached = gridrelay_ports::cache::CachedSubscriptionStore::new(
        w.store.clone(),
        clock.clone(),
        CACHE_TIME,
    );
    Warm {
        store: w.store,
        queue: w.queue.clone(),
        clock: clock.clone(),
        ingest: Ingest {
            store: Arc::new(cached),
            delivery_queue: w.queue,
            archives: gridrelay_ports::ArchiveStreams::default(),
            accepted_ids: Arc::new(MemoryAcceptedIds::default()),
            clock,
        },
    }
}

const ONE_EVENT: &str =
    r#"[{"id":"1","subject":"s","eventType":"t","eventTime":"2026-11-23T00:00:00Z","data":{}}]"#;

/// Issue #9: a warm ingest serving a stream of publishes reads the topic and its
/// subscriptions once per cache period; each publish is then one queue call (G1: still
/// enqueued before the 200).
#[tokio::test]
async fn a_warm_ingest_reads_the_store_once_per_period_g1() {
    let topic = Topic::with_new_keys("orders", Utc::now());
    let w = warm(&topic).await;
    let reads_before = w.store.reads();
    for _ in 0..50 {
        let answer = w
            .ingest
            .publish(PublishRequest::json_with_key(&topic, ONE_EVENT.as_bytes()))
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        w.clock.advance(std::time::Duration::from_millis(100));
    }
    assert_eq!(w.store.reads() - reads_before, 2, "topic and list, once");
    assert_eq!(w.queue.send_calls().len(), 50, "one queue call per publish");
    assert_eq!(w.queue.sent().len(), 100, "two subscriptions, 50 publishes");
    w.clock.advance(CACHE_TIME);
    w.ingest
        .publish(PublishRequest::json_with_key(&topic, ONE_EVENT.as_bytes()))
        .await;
    assert_eq!(
        w.store.reads() - reads_before,
        4,
        "read again after the period"
    );
}

/// Issue #9: a key regenerated while ingest keeps the topic works at once: a key that does
/// not match what was kept is checked against the topic read again before it is refused; a
/// wrong key is still refused.
#[tokio::test]
async fn a_regenerated_key_works_at_once_despite_the_cache() {
    let topic = Topic::with_new_keys("orders", Utc::now());
    let w = warm(&topic).await;
    let publish = |key: String| {
        let ingest = &w.ingest;
        let topic = topic.clone();
        async move {
            let request = PublishRequest {
                sas_key: Some(&key),
                ..PublishRequest::json_with_key(&topic, ONE_EVENT.as_bytes())
            };
            ingest.publish(request).await.status
        }
    };
    assert_eq!(publish(topic.key1.clone()).await, 200);
    let regenerated = Topic {
        key1: Topic::new_key(),
        ..topic.clone()
    };
    w.store.replace_topic(&regenerated).await.unwrap();
    assert_eq!(publish(regenerated.key1.clone()).await, 200);
    assert_eq!(publish("not-a-key".into()).await, 401);
    assert_eq!(
        publish(topic.key1.clone()).await,
        401,
        "the old key, once read again"
    );
}

/// Issue #9: anyone who knows a topic's name can send wrong keys; each is refused, and a
/// flood of them reads the topic's record once per recheck interval, not once per request,
/// and never the subscription list a good publish uses.
#[tokio::test]
async fn a_flood_of_wrong_keys_reads_the_topic_once_per_interval() {
    let topic = Topic::with_new_keys("orders", Utc::now());
    let w = warm(&topic).await;
    let good = w
        .ingest
        .publish(PublishRequest::json_with_key(&topic, ONE_EVENT.as_bytes()))
        .await;
    assert_eq!(good.status, 200);
    let reads_before = w.store.reads();
    let wrong_key = || async {
        let request = PublishRequest {
            sas_key: Some("not-a-key"),
            ..PublishRequest::json_with_key(&topic, ONE_EVENT.as_bytes())
        };
        w.ingest.publish(request).await.status
    };
    for _ in 0..200 {
        assert_eq!(wrong_key().await, 401);
    }
    assert_eq!(
        w.store.reads() - reads_before,
        1,
        "one recheck of the topic"
    );
    let good = w
        .ingest
        .publish(PublishRequest::json_with_key(&topic, ONE_EVENT.as_bytes()))
        .await;
    assert_eq!(good.status, 200);
    assert_eq!(
        w.store.reads() - reads_before,
        1,
        "the list a good publish reads is still kept"
    );
    w.clock.advance(gridrelay_ports::cache::RECHECK_INTERVAL);
    assert_eq!(wrong_key().await, 401);
    assert_eq!(
        w.store.reads() - reads_before,
        2,
        "again after the interval"
    );
}

/// #11 item 12: the validation URL sent to a new endpoint of a validated subscription (an
/// endpoint change) validates that change: a wrong code changes nothing, the right one makes
/// the new endpoint the subscription's, and a second call finds nothing waiting.
#[tokio::test]
async fn the_validation_url_validates_an_endpoint_change() {
    use gridrelay_shared::subscription::EndpointChange;
    use gridrelay_shared::validation::{Provisioning, ProvisioningState, code_hash, new_code};
    let w = World::new(Topic::with_new_keys("orders", Utc::now())).await;
    let now = Utc::now();
    let code = new_code();
    let mut sub = w
        .store
        .get_subscription("orders", "plain")
        .await
        .unwrap()
        .unwrap();
    sub.endpoint_change = Some(EndpointChange {
        endpoint: "https://example.com/new".into(),
        provisioning: Provisioning {
            validation_code_sha256: Some(code_hash(&code)),
            validation_expires_at: Some(now + chrono::Duration::minutes(10)),
            ..Provisioning::with_state(ProvisioningState::AwaitingManualAction, None)
        },
        requested_at: now,
    });
    w.store.replace_subscription(&mut sub).await.unwrap();

    let wrong = w
        .ingest
        .validate_subscription("orders", "plain", "not-the-code")
        .await;
    assert_eq!(wrong.status, 400, "{}", wrong.body);
    let stored = w
        .store
        .get_subscription("orders", "plain")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.endpoint, "https://example.com/plain");

    let right = w
        .ingest
        .validate_subscription("orders", "plain", &code)
        .await;
    assert_eq!(right.status, 200, "{}", right.body);
    let stored = w
        .store
        .get_subscription("orders", "plain")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.endpoint, "https://example.com/new");
    assert_eq!(stored.endpoint_change, None);
    assert_eq!(stored.provisioning.state, ProvisioningState::Succeeded);
    let again = w
        .ingest
        .validate_subscription("orders", "plain", &code)
        .await;
    assert!(again.body.contains("already validated"), "{}", again.body);
}

fn with_retention(name: &str, days: u16) -> Topic {
    Topic {
        retention_days: days,
        ..Topic::with_new_keys(name, Utc::now())
    }
}

const TWO_EVENTS: &str = r#"[{"id":"a","subject":"s","eventType":"t","eventTime":"2026-11-23T00:00:00Z","data":{"n":1}},
    {"id":"b","subject":"s","eventType":"t","eventTime":"2026-11-23T00:00:00Z","data":{"n":2}}]"#;

/// #35, the archive: a topic with a retention archives each event it accepted, as it was
/// fanned out (stamped with its topic), at its publish time, once it is enqueued.
#[tokio::test]
async fn a_topic_with_a_retention_archives_what_it_accepted() {
    let w = World::new(with_retention("orders", 7)).await;
    assert_eq!(w.publish(TWO_EVENTS).await.status, 200);
    let (archived, skipped) = read_archive_lines(&w.archive.written_lines());
    assert_eq!(skipped, 0);
    assert_eq!(archived.len(), 2);
    let now = gridrelay_ports::Clock::now(w.clock.as_ref());
    for (event, id) in archived.iter().zip(["a", "b"]) {
        assert_eq!(event.topic, "orders");
        assert_eq!(event.schema, InputSchema::EventGridSchema);
        assert_eq!(
            event.time.timestamp_millis(),
            now.timestamp_millis(),
            "the publish time"
        );
        let value: serde_json::Value = serde_json::from_str(event.event.get()).unwrap();
        assert_eq!(value["id"], id);
        assert!(
            value["topic"].as_str().unwrap().ends_with("/topics/orders"),
            "stamped as fanned out: {value}"
        );
    }
}

/// #35: a topic's events go to the stream of its retention's class (10 days: the 30-day
/// class's), and to no other; a class without a stream (a stack deployed with some) archives
/// nothing and counts its events as not written, and the publish still succeeds.
#[tokio::test]
async fn a_topics_events_go_to_the_stream_of_its_retention_class() {
    use std::collections::BTreeMap;
    let mut w = World::new(with_retention("orders", 10)).await;
    let streams: BTreeMap<u16, Arc<MemoryJournal>> = [7, 30, 365]
        .into_iter()
        .map(|class| (class, Arc::new(MemoryJournal::default())))
        .collect();
    w.ingest.archives = gridrelay_ports::ArchiveStreams::new(
        streams
            .iter()
            .map(|(&class, s)| {
                let s: Arc<dyn gridrelay_ports::RecordStream> = s.clone();
                (class, s)
            })
            .collect(),
    );
    assert_eq!(w.publish(TWO_EVENTS).await.status, 200);
    let lines = |class: u16| read_archive_lines(&streams[&class].written_lines()).0.len();
    assert_eq!((lines(7), lines(30), lines(365)), (0, 2, 0));

    let mut w = World::new(with_retention("daily", 1)).await;
    w.ingest.archives = gridrelay_ports::ArchiveStreams::new(BTreeMap::from([(
        30,
        streams[&30].clone() as Arc<dyn gridrelay_ports::RecordStream>,
    )]));
    assert_eq!(w.publish(TWO_EVENTS).await.status, 200);
    assert_eq!(w.queue.sent().len(), 2, "enqueued all the same");
    assert_eq!(lines(30), 2, "nothing of the 1-day class's");
}

/// #35: a topic without a retention (0, the default) archives nothing; nor does a refused
/// publish or one whose events could not all be enqueued (not accepted: the publisher
/// retries it, and the retry is what is archived).
#[tokio::test]
async fn only_accepted_events_of_a_topic_with_a_retention_are_archived() {
    let w = World::new(Topic::with_new_keys("plain", Utc::now())).await;
    assert_eq!(w.publish(TWO_EVENTS).await.status, 200);
    assert!(w.archive.written_lines().is_empty());

    let w = World::new(with_retention("orders", 1)).await;
    assert_eq!(w.publish(r#"[{"id":"x"}]"#).await.status, 400);
    w.queue.outage.set(true);
    assert_eq!(w.publish(TWO_EVENTS).await.status, 503);
    assert!(w.archive.written_lines().is_empty());
}

/// #35: an archive that is down costs no publish: the events are enqueued and the publisher
/// is answered 200 (what was not archived is counted in the publish's log line).
#[tokio::test]
async fn an_archive_that_is_down_costs_no_publish() {
    let w = World::new(with_retention("orders", 7)).await;
    w.archive.outage.set(true);
    assert_eq!(w.publish(TWO_EVENTS).await.status, 200);
    assert_eq!(w.queue.sent().len(), 2, "one message for each subscription");
    assert!(w.archive.written_lines().is_empty());
}

/// P1: a topic with a deduplication window of `seconds`.
fn with_window(topic: Topic, seconds: u16) -> Topic {
    Topic {
        dedup_window_seconds: seconds,
        ..topic
    }
}

/// The ids of the events enqueued for the subscription `plain`, in order.
fn enqueued_ids(w: &World) -> Vec<String> {
    use gridrelay_shared::message::DeliveryQueueMessage;
    w.queue
        .sent()
        .iter()
        .filter_map(|m| match DeliveryQueueMessage::from_body(&m.body).ok()? {
            DeliveryQueueMessage::Delivery(d) if d.subscription == "plain" => Some(d),
            _ => None,
        })
        .flat_map(|d| d.events)
        .map(|e| {
            let value: serde_json::Value = serde_json::from_str(e.event.get()).unwrap();
            value["id"].as_str().unwrap().to_string()
        })
        .collect()
}

fn event_grid(ids: &[&str]) -> String {
    let events: Vec<_> = ids
        .iter()
        .map(|id| {
            serde_json::json!({"id": id, "subject": "s", "eventType": "t",
                "eventTime": "2026-11-28T00:00:00Z", "data": {}, "dataVersion": "1"})
        })
        .collect();
    serde_json::Value::Array(events).to_string()
}

/// P1: within the window an id is delivered once (a repeat in the same request too), and the
/// publish is answered 200; once the window has passed from the stored time, it is delivered
/// again. Without a window nothing is read or marked.
#[tokio::test]
async fn an_id_accepted_within_the_window_is_answered_200_and_not_enqueued_again_p1() {
    let w = World::new(with_window(Topic::with_new_keys("orders", Utc::now()), 60)).await;
    assert_eq!(w.publish(&event_grid(&["a", "b", "a"])).await.status, 200);
    assert_eq!(enqueued_ids(&w), ["a", "b"]);
    w.clock.advance(std::time::Duration::from_secs(59));
    assert_eq!(w.publish(&event_grid(&["b", "c"])).await.status, 200);
    assert_eq!(enqueued_ids(&w), ["a", "b", "c"]);
    assert_eq!(w.publish(&event_grid(&["a"])).await.status, 200);
    assert_eq!(enqueued_ids(&w), ["a", "b", "c"], "nothing enqueued");
    w.clock.advance(std::time::Duration::from_secs(1));
    assert_eq!(w.publish(&event_grid(&["a", "b"])).await.status, 200);
    // Both were accepted 60 s ago: the window runs from the acceptance, as SQS FIFO's
    // deduplication interval does; a duplicate answered 200 at 59 s does not extend it.
    assert_eq!(enqueued_ids(&w), ["a", "b", "c", "a", "b"]);

    let off = World::new(Topic::with_new_keys("plain", Utc::now())).await;
    off.accepted_ids.outage.set(true);
    assert_eq!(off.publish(&event_grid(&["a"])).await.status, 200);
    assert_eq!(off.publish(&event_grid(&["a"])).await.status, 200);
    assert_eq!(enqueued_ids(&off), ["a", "a"]);
    assert_eq!(off.accepted_ids.marked(), 0);
}

/// P1, G1: an id is marked only once its events are enqueued. A publish the queue refused
/// (503) is delivered when it is sent again; one whose marks could not be read is answered 503
/// and enqueues nothing; marks that cannot be written cost no publish.
#[tokio::test]
async fn a_publish_answered_503_and_retried_is_delivered_p1_g1() {
    let w = World::new(with_window(Topic::with_new_keys("orders", Utc::now()), 300)).await;
    w.queue.outage.set(true);
    assert_eq!(w.publish(&event_grid(&["a"])).await.status, 503);
    assert_eq!(w.accepted_ids.marked(), 0);
    w.queue.outage.set(false);
    assert_eq!(w.publish(&event_grid(&["a"])).await.status, 200);
    assert_eq!(enqueued_ids(&w), ["a"]);

    w.accepted_ids.outage.set(true);
    let answer = w.publish(&event_grid(&["b"])).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(answer.body.contains("deduplication"), "{}", answer.body);
    assert_eq!(enqueued_ids(&w), ["a"]);

    // Read, then the write fails: enqueued and answered 200, unmarked.
    let w = World::new(with_window(Topic::with_new_keys("orders", Utc::now()), 300)).await;
    struct ReadOnly(Arc<MemoryAcceptedIds>);
    #[async_trait::async_trait]
    impl gridrelay_ports::AcceptedIds for ReadOnly {
        async fn accepted_at(
            &self,
            topic: &str,
            ids: &[gridrelay_shared::dedup::EventIdentity],
        ) -> Result<
            std::collections::HashMap<
                gridrelay_shared::dedup::EventIdentity,
                chrono::DateTime<Utc>,
            >,
            gridrelay_ports::StoreError,
        > {
            self.0.accepted_at(topic, ids).await
        }
        async fn mark_accepted(
            &self,
            _: &str,
            _: &[gridrelay_shared::dedup::EventIdentity],
            _: chrono::DateTime<Utc>,
        ) -> Result<(), gridrelay_ports::StoreError> {
            Err(gridrelay_ports::StoreError::Unavailable("throttled".into()))
        }
    }
    let ingest = Ingest {
        accepted_ids: Arc::new(ReadOnly(w.accepted_ids.clone())),
        store: w.store.clone(),
        delivery_queue: w.queue.clone(),
        archives: gridrelay_ports::ArchiveStreams::default(),
        clock: w.clock.clone(),
    };
    let body = event_grid(&["c"]);
    for _ in 0..2 {
        let answer = ingest
            .publish(PublishRequest::json_with_key(&w.topic, body.as_bytes()))
            .await;
        assert_eq!(answer.status, 200);
    }
    assert_eq!(
        enqueued_ids(&w),
        ["c", "c"],
        "unmarked: delivered again, as without a window"
    );
}

/// P1: a CloudEvent is known by its source and id; a custom event by its mapped id, and one
/// without (a fresh id made at publish) never dedupes.
#[tokio::test]
async fn cloud_events_dedupe_by_source_and_id_and_unmapped_custom_events_never_p1() {
    let topic = Topic::with_new_keys("cloud", Utc::now())
        .with_input_schema(InputSchema::CloudEventSchemaV1_0, None)
        .unwrap();
    let w = World::new(with_window(topic, 300)).await;
    let publish = |body: String| {
        let w = &w;
        async move {
            w.ingest
                .publish(PublishRequest {
                    content_type: Some("application/cloudevents-batch+json"),
                    ..PublishRequest::json_with_key(&w.topic, body.as_bytes())
                })
                .await
        }
    };
    let ce = |source: &str, id: &str| {
        serde_json::json!([{"specversion": "1.0", "id": id, "source": source, "type": "t"}])
            .to_string()
    };
    for (source, id) in [("/a", "1"), ("/b", "1"), ("/a", "1"), ("/a", "2")] {
        assert_eq!(publish(ce(source, id)).await.status, 200);
    }
    assert_eq!(enqueued_ids(&w), ["1", "1", "2"]);

    let custom = |id_field: Option<&str>| {
        let mapping = InputMapping {
            id_field: id_field.map(str::to_string),
            default_event_type: Some("t".into()),
            default_subject: Some("s".into()),
            ..InputMapping::default()
        };
        with_window(
            Topic::with_new_keys("custom", Utc::now())
                .with_input_schema(InputSchema::CustomEventSchema, Some(mapping))
                .unwrap(),
            300,
        )
    };
    let w = World::new(custom(Some("orderId"))).await;
    for _ in 0..2 {
        assert_eq!(w.publish(r#"[{"orderId":"o-1"}]"#).await.status, 200);
    }
    assert_eq!(enqueued_ids(&w), ["o-1"]);
    // Mapped, but this event lacks the field: a fresh id each time.
    for _ in 0..2 {
        assert_eq!(w.publish(r#"[{"other":1}]"#).await.status, 200);
    }
    assert_eq!(enqueued_ids(&w).len(), 3);
    let w = World::new(custom(None)).await;
    for _ in 0..2 {
        assert_eq!(w.publish(r#"[{"orderId":"o-1"}]"#).await.status, 200);
    }
    assert_eq!(enqueued_ids(&w).len(), 2);
    assert_eq!(w.accepted_ids.marked(), 0, "nothing to mark");
}

/// P1, #35: a duplicate is not archived either: a topic's archive holds what it accepted, so
/// a replay sends each event once.
#[tokio::test]
async fn a_duplicate_is_not_archived_p1() {
    let w = World::new(with_window(with_retention("orders", 7), 300)).await;
    assert_eq!(w.publish(&event_grid(&["a", "b", "a"])).await.status, 200);
    assert_eq!(w.publish(&event_grid(&["b", "c"])).await.status, 200);
    let (archived, skipped) = read_archive_lines(&w.archive.written_lines());
    assert_eq!(skipped, 0);
    let ids: Vec<String> = archived
        .iter()
        .map(|e| {
            let value: serde_json::Value = serde_json::from_str(e.event.get()).unwrap();
            value["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
}
