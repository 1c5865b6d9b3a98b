//! End-to-end, #34 item 12: the settings an invocation's deadline depends on. Every setting the
//! runner accepts must deliver, and no invocation may outlive its deadline (the slow-AWS side of
//! this is in `aws_faults.rs`).

use std::time::Duration;

use gridrelay_e2e::{Reply, Subscriber, TestSystem, eventually, subscription};
use serde_json::{Value, json};

/// At the shortest function timeout the runner accepts, invocations still deliver: the timeout
/// leaves room for the reads before the first attempt, one attempt, and the margin kept to
/// enqueue. Before, the shortest accepted timeout was one attempt plus the margin, which left
/// no time for the reads: every invocation handed its events on, and nothing was delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shortest_accepted_function_timeout_still_delivers() {
    let sys = TestSystem::start_with(0.01, |c| {
        c.function_timeout = c.shortest_function_timeout();
        c.visibility_timeout = c.function_timeout;
        assert!(c.check().is_ok(), "{:?}", c.check());
    })
    .await;
    let topic = sys.topic("short").await;
    let subscriber = Subscriber::start(Vec::new(), Reply::Status(200)).await;
    sys.subscribe(subscription("short", "all", &subscriber.url))
        .await;
    let events: Vec<Value> = (0..10)
        .map(|i| {
            json!({
                "id": format!("short-{i}"),
                "eventType": "Contoso.Short",
                "subject": "/short",
                "eventTime": chrono::Utc::now().to_rfc3339(),
                "data": {},
                "dataVersion": "1"
            })
        })
        .collect();
    sys.publish(&topic, &Value::Array(events)).await;
    eventually(Duration::from_secs(30), "every event delivered", || async {
        let ids: std::collections::BTreeSet<String> =
            subscriber.received().iter().flat_map(|r| r.ids()).collect();
        (ids.len() == 10).then_some(())
    })
    .await;
    let stats = sys.system.stats();
    assert_eq!(
        stats.stopped_invocations, 0,
        "an invocation outlived its deadline: {:?}",
        stats.deliver
    );
    sys.shutdown().await;
}
