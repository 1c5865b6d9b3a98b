//! End-to-end: dead-letter writes are announced on a system topic (L7).

use std::collections::BTreeMap;
use std::time::Duration;

use gridrelay_e2e::{Reply, Subscriber, TestSystem, events, eventually, subscription};
use gridrelay_shared::dead_letter::{DEAD_LETTER_EVENT_TYPE, DEAD_LETTER_EVENTS_TOPIC};
use gridrelay_shared::subscription::SubscriptionRequest;

const WAIT: Duration = Duration::from_secs(30);

/// L7: every dead-letter object is announced to the subscribers of the system topic as a
/// `Gridrelay.DeadLetter.BlobCreated` event naming the object and what it holds; the system
/// topic's own dead-letters are not announced, so a failing subscriber there cannot loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_writes_are_announced_on_the_system_topic_l7() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("orders").await;
    let failing = Subscriber::start(vec![], Reply::Status(400)).await;
    sys.subscribe(SubscriptionRequest {
        dead_letter_destination: Some(sys.dead_letter_url("dl")),
        ..subscription("orders", "audit", &failing.url)
    })
    .await;
    let watcher = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription(
        DEAD_LETTER_EVENTS_TOPIC,
        "watcher",
        &watcher.url,
    ))
    .await;
    let broken_watcher = Subscriber::start(vec![], Reply::Status(400)).await;
    sys.subscribe(SubscriptionRequest {
        dead_letter_destination: Some(sys.dead_letter_url("sys")),
        ..subscription(
            DEAD_LETTER_EVENTS_TOPIC,
            "broken-watcher",
            &broken_watcher.url,
        )
    })
    .await;

    sys.publish(&topic, &events("n", 2)).await;
    // The broken watcher's own dead-letters land under sys/ and must not be announced.
    sys.wait_for_dead_letters("sys/", WAIT).await;
    // Every dl/ object is announced with its own count of records, and the objects hold both
    // events. A dead-letter message handled twice (its invocation slower than its visibility
    // under load: G1's at-least-once) writes a second object, announced as well, so the wait
    // is for the objects as they are, not for a fixed total.
    let objects = eventually(
        WAIT,
        "every dl/ object announced with its count",
        || async {
            let objects = sys.dead_letter_objects("dl/").await;
            let records: usize = objects.iter().map(|(_, r)| r.len()).sum();
            let expected: BTreeMap<String, u64> = objects
                .iter()
                .map(|(key, r)| (key.clone(), r.len() as u64))
                .collect();
            let announced: BTreeMap<String, u64> = watcher
                .received()
                .iter()
                .flat_map(|r| r.events.clone())
                .map(|e| {
                    let key = e["data"]["key"].as_str().unwrap_or_default().to_string();
                    (key, e["data"]["eventCount"].as_u64().unwrap_or(0))
                })
                .collect();
            (records >= 2 && announced == expected).then_some(objects)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let objects = {
        let all = sys.dead_letter_objects("dl/").await;
        assert!(all.len() >= objects.len());
        all
    };
    let notices: Vec<_> = watcher
        .received()
        .into_iter()
        .flat_map(|r| r.events)
        .collect();
    assert_eq!(
        notices.len(),
        objects.len(),
        "one announcement per dl/ object, none for sys/ objects"
    );
    for notice in &notices {
        assert_eq!(notice["eventType"], DEAD_LETTER_EVENT_TYPE);
        let key = notice["data"]["key"].as_str().unwrap_or_default();
        assert!(
            objects.iter().any(|(k, _)| k == key),
            "announced {key}, which does not exist"
        );
        assert_eq!(
            notice["data"]["bucket"],
            sys.names.dead_letter_bucket.as_str()
        );
        assert_eq!(notice["data"]["sourceTopic"], "orders");
        assert_eq!(notice["data"]["sourceSubscription"], "audit");
        assert!(
            notice["data"]["deadLetterReasons"]["MaxDeliveryAttemptsExceeded"]
                .as_u64()
                .is_some()
        );
        assert_eq!(
            notice["topic"],
            format!("/gridrelay/topics/{DEAD_LETTER_EVENTS_TOPIC}")
        );
    }
    // An invocation's counts are added when it returns, which may be after its writes.
    sys.wait_for_stats("two notices counted", |s| {
        s.dead_letter.notices_enqueued >= 2
    })
    .await;
    sys.shutdown().await;
}
