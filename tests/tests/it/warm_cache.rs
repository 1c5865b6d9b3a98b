//! End-to-end: what the functions keep of topics between invocations (issue #9,
//! `gridrelay_ports::cache`) never refuses a publish with a key regenerated elsewhere.

use std::time::Duration;

use gridrelay_adapters::aws::DynamoSubscriptionStore;
use gridrelay_adapters::config::TableNames;
use gridrelay_e2e::{Reply, Subscriber, TestSystem, events, subscription};
use gridrelay_ports::SubscriptionStore;
use gridrelay_shared::subscription::Topic;

/// A runner that keeps what it read for five minutes serves a publish (the topic is kept);
/// the topic's first key is then regenerated from another process, straight in the table, as
/// `gridrelay topic key regenerate` does. A publish with the new key is accepted at once (the
/// topic is read again before a key is refused) and delivered; the old key is refused once the
/// topic was read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_regenerated_elsewhere_works_at_once_on_a_warm_runner() {
    let sys = TestSystem::start_with(0.01, |c| c.config_cache = Duration::from_secs(300)).await;
    let topic = sys.topic("warm").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("warm", "audit", &sub.url)).await;
    sys.publish(&topic, &events("kept", 1)).await;

    let elsewhere = DynamoSubscriptionStore::from_sdk(
        &sys.sdk,
        TableNames {
            topics: sys.names.topics_table.clone(),
            subscriptions: sys.names.subscriptions_table.clone(),
        },
    );
    let regenerated = Topic {
        key1: Topic::new_key(),
        ..topic.clone()
    };
    elsewhere.replace_topic(&regenerated).await.unwrap();

    let body = || events("new", 1).to_string().into_bytes();
    let (status, answer) = sys
        .publish_raw("warm", Some(&regenerated.key1), body())
        .await;
    assert_eq!(status, 200, "{answer}");
    let (status, _) = sys.publish_raw("warm", Some(&topic.key1), body()).await;
    assert_eq!(status, 401, "the old key, after the topic was read again");
    let received = sub.wait_for_requests(2, Duration::from_secs(30)).await;
    assert_eq!(received.len(), 2);
    sys.shutdown().await;
}
