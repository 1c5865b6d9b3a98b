//! End to end, P1 (#39): publish deduplication per topic, against the emulator's DynamoDB and
//! SQS, with subscribers on 127.0.0.1. The window is real time (it is not a delivery schedule,
//! so `GRIDRELAY_TIME_SCALE` does not shorten it): the tests use windows of a few seconds.

use std::time::{Duration, Instant};

use chrono::Utc;
use gridrelay_e2e::fault_proxy::{FaultProxy, FaultRule};
use gridrelay_e2e::{Reply, Subscriber, TestSystem, events, eventually, subscription};
use gridrelay_shared::subscription::Topic;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// Creates `name` with a deduplication window of `seconds`.
async fn topic_with_window(sys: &TestSystem, name: &str, seconds: u16) -> Topic {
    let topic = Topic {
        dedup_window_seconds: seconds,
        ..Topic::with_new_keys(name, Utc::now())
    };
    sys.system
        .store
        .create_topic(&topic)
        .await
        .expect("topic created");
    topic
}

/// How many times `id` reached `subscriber`, once `sentinel` (published after) has: what was
/// enqueued before the sentinel has had its chance to arrive.
async fn deliveries_of(
    sys: &TestSystem,
    topic: &Topic,
    subscriber: &Subscriber,
    id: &str,
    sentinel: &str,
) -> usize {
    sys.publish(topic, &events(sentinel, 1)).await;
    let sentinel = format!("{sentinel}-0");
    eventually(WAIT, "the sentinel delivered", || async {
        subscriber
            .received()
            .iter()
            .any(|r| r.ids().contains(&sentinel))
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    subscriber
        .received()
        .iter()
        .flat_map(|r| r.ids())
        .filter(|i| i == id)
        .count()
}

/// P1: an event id published again within the topic's window is answered 200 and delivered
/// once; published again once the window has passed, it is delivered again. A topic without a
/// window delivers every publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_id_within_the_window_is_delivered_once_and_after_it_twice_p1() {
    const WINDOW: u16 = 3;
    let sys = TestSystem::start(0.01).await;
    let topic = topic_with_window(&sys, "deduped", WINDOW).await;
    let plain = sys.topic("plain").await;
    let subscriber = Subscriber::start(vec![], Reply::Status(200)).await;
    let other = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("deduped", "sub", &subscriber.url))
        .await;
    sys.subscribe(subscription("plain", "sub", &other.url))
        .await;

    let started = Instant::now();
    sys.publish(&topic, &events("order", 1)).await;
    // The first copy was accepted before its publish returned: the window has passed a
    // window after this, whatever the emulator's pace.
    let accepted_by = Instant::now();
    sys.publish(&topic, &events("order", 1)).await;
    let within = started.elapsed();
    assert!(
        within < Duration::from_secs(WINDOW.into()),
        "the publishes took {within:?}: not within the window, the test proves nothing"
    );
    assert_eq!(
        deliveries_of(&sys, &topic, &subscriber, "order-0", "first").await,
        1,
        "within the window"
    );

    let passed = Duration::from_secs(WINDOW.into()) + Duration::from_millis(500);
    tokio::time::sleep(passed.saturating_sub(accepted_by.elapsed())).await;
    sys.publish(&topic, &events("order", 1)).await;
    assert_eq!(
        deliveries_of(&sys, &topic, &subscriber, "order-0", "second").await,
        2,
        "after the window"
    );

    sys.publish(&plain, &events("order", 1)).await;
    sys.publish(&plain, &events("order", 1)).await;
    assert_eq!(
        deliveries_of(&sys, &plain, &other, "order-0", "plain").await,
        2,
        "no window: every publish"
    );
    sys.shutdown().await;
}

/// P1, G1: an id is marked only once its events are enqueued. A publish answered 503, because
/// the marks could not be read (DynamoDB failing) or because the delivery queue refused the
/// events (SQS failing), is sent again by the publisher and delivered, once; sent again after
/// that, within the window, it is not delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_answered_503_and_retried_is_delivered_once_p1_g1() {
    let proxy = FaultProxy::start(rand::random()).await;
    let sys = TestSystem::start_behind(&proxy, 0.01, |_| {}).await;
    let topic = topic_with_window(&sys, "retried", 300).await;
    let subscriber = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("retried", "sub", &subscriber.url))
        .await;

    // As many failures as the SDK's own tries of one call (3): the first publishes are
    // answered 503.
    proxy.set_rules(vec![
        FaultRule::server_error("dynamodb", 1.0)
            .only("BatchGetItem")
            .first(3),
        FaultRule::server_error("sqs", 1.0)
            .only("SendMessageBatch")
            .first(3),
    ]);
    let body: Value = events("pay", 1);
    let refused = sys.publish_until_accepted(&topic, &body).await;
    assert!(
        refused >= 1,
        "no publish was answered 503\n{}",
        proxy.report()
    );
    assert!(proxy.refused("dynamodb") >= 1, "{}", proxy.report());
    assert!(proxy.refused("sqs") >= 1, "{}", proxy.report());
    sys.publish(&topic, &body).await;
    assert_eq!(
        deliveries_of(&sys, &topic, &subscriber, "pay-0", "after").await,
        1,
        "{refused} publishes answered 5xx, then one accepted, then one duplicate"
    );
    sys.shutdown().await;
}
