//! O1 end to end on the emulator: an ordered subscription's events reach a real webhook on
//! 127.0.0.1 in the order they were accepted, one request per key at a time; a failing event
//! holds back only its own key.

use std::time::Duration;

use gridrelay_e2e::ordered_subscriber::OrderedSubscriber;
use gridrelay_e2e::{TestSystem, eventually, subscription};
use gridrelay_shared::subscription::SubscriptionRequest;
use serde_json::{Value, json};

/// An Event Grid event of id `id` whose subject (the ordering key) is `key`.
fn keyed(id: &str, key: &str) -> Value {
    json!({
        "id": id,
        "subject": key,
        "eventType": "Contoso.Orders.Changed",
        "eventTime": "2026-11-29T06:00:00Z",
        "dataVersion": "1.0",
        "data": {"step": id},
    })
}

/// O1 (with S5, R1): five events of key `orders/a`, published in two publishes among five of
/// `orders/b`, the first failing twice (503): key a's arrive in publish order, its first's
/// two failures and retry before the rest; key b's all arrive before key a's first is taken,
/// not held behind it; and never two requests of one key in flight at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_events_arrive_in_order_behind_its_failing_first_while_another_key_goes_on_o1() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("ordered").await;
    let server = OrderedSubscriber::start().await;
    server.fail("a-0", 2);
    let sub = sys
        .subscribe(SubscriptionRequest {
            ordering_key: Some("subject".to_string()),
            ..subscription("ordered", "sub-1", &server.url)
        })
        .await;
    assert_eq!(
        sub.ordering_key
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("subject")
    );
    let (a, b) = ("orders/a", "orders/b");
    sys.publish(
        &topic,
        &json!([
            keyed("a-0", a),
            keyed("b-0", b),
            keyed("a-1", a),
            keyed("b-1", b),
            keyed("a-2", a),
            keyed("b-2", b),
        ]),
    )
    .await;
    sys.publish(
        &topic,
        &json!([
            keyed("a-3", a),
            keyed("b-3", b),
            keyed("a-4", a),
            keyed("b-4", b)
        ]),
    )
    .await;
    let ids = |k: &str| (0..5).map(|i| format!("{k}-{i}")).collect::<Vec<_>>();
    eventually(Duration::from_secs(60), "both keys delivered", || async {
        (server.delivered(a).len() == 5 && server.delivered(b).len() == 5).then_some(())
    })
    .await;

    let seen = server.requests();
    assert_eq!(
        server.delivered(a),
        ids("a"),
        "key a in publish order: {seen:?}"
    );
    assert_eq!(
        server.delivered(b),
        ids("b"),
        "key b in publish order: {seen:?}"
    );
    let of_a = server.requests_of(a);
    let first_taken = of_a
        .iter()
        .position(|r| r.status == 200)
        .expect("a-0 taken");
    assert_eq!(
        of_a[..=first_taken]
            .iter()
            .map(|r| (r.ids.clone(), r.status))
            .collect::<Vec<_>>(),
        vec![
            (vec!["a-0".to_string()], 503),
            (vec!["a-0".to_string()], 503),
            (vec!["a-0".to_string()], 200),
        ],
        "a-0's retries come before the rest of its key: {of_a:?}"
    );
    let b_done = server
        .requests_of(b)
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.answered)
        .max()
        .expect("b delivered");
    assert!(
        b_done < of_a[first_taken].answered,
        "key b went on while key a waited: b done at {b_done:?}, a-0 taken at {:?}",
        of_a[first_taken].answered
    );
    for (key, most) in server.most_in_flight() {
        assert_eq!(most, 1, "requests of {key} in flight at once");
    }
    sys.shutdown().await;
}

/// O1 relies on SQS's FIFO contract: a message group is held back only while one of its
/// messages is in flight, and once their visibility ends (together, as when an invocation is
/// stopped or a worker killed, or one after another, as deliver holds a key) they come back in
/// the order they were sent. moto's server kept the group held by messages whose visibility
/// had ended and then handed out the last of them first (seen: a key delivered 2, 3, 0, 1, 4);
/// `infra/local/moto_server.py` makes it keep the contract.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_messages_whose_visibility_ends_together_come_back_in_order_o1() {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let sdk = gridrelay_e2e::sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let name = format!("o{}.fifo", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let url = sqs
        .create_queue()
        .queue_name(&name)
        .attributes(A::FifoQueue, "true")
        .send()
        .await
        .expect("a FIFO queue")
        .queue_url
        .expect("its URL");
    for i in 0..3 {
        sqs.send_message()
            .queue_url(&url)
            .message_body(format!("m-{i}"))
            .message_group_id("key")
            .message_deduplication_id(format!("m-{i}"))
            .send()
            .await
            .expect("sent");
    }
    // The messages received until all three are in (in the order they came), each hidden for
    // `visibility` seconds, with their receipts.
    let receive_three = |visibility: i32| {
        let (sqs, url) = (&sqs, &url);
        async move {
            let mut got: Vec<(String, String)> = Vec::new();
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while got.len() < 3 && std::time::Instant::now() < until {
                let messages = sqs
                    .receive_message()
                    .queue_url(url)
                    .max_number_of_messages(10)
                    .visibility_timeout(visibility)
                    .wait_time_seconds(1)
                    .send()
                    .await
                    .expect("received")
                    .messages
                    .unwrap_or_default();
                got.extend(
                    messages
                        .into_iter()
                        .filter_map(|m| Some((m.body?, m.receipt_handle?))),
                );
            }
            got
        }
    };
    let bodies = |got: &[(String, String)]| got.iter().map(|(b, _)| b.clone()).collect::<Vec<_>>();
    assert_eq!(bodies(&receive_three(1).await), ["m-0", "m-1", "m-2"]);
    // Their visibility ends together: back in order, all three.
    let again = receive_three(30).await;
    assert_eq!(
        bodies(&again),
        ["m-0", "m-1", "m-2"],
        "back in order, all three"
    );

    // Back one after another: the first two while the last is still in flight, which holds
    // the group; then all three come, the first first.
    for ((_, receipt), seconds) in again.iter().zip([1, 1, 2]) {
        sqs.change_message_visibility()
            .queue_url(&url)
            .receipt_handle(receipt)
            .visibility_timeout(seconds)
            .send()
            .await
            .expect("held");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        bodies(&receive_three(30).await),
        ["m-0", "m-1", "m-2"],
        "the group's first first"
    );
    sqs.delete_queue().queue_url(&url).send().await.ok();
}
