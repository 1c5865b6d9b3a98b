//! End-to-end: custom delivery headers (H1), with secret values kept in Secrets Manager.

use std::time::Duration;

use gridrelay_e2e::{Reply, Subscriber, TestSystem, events, subscription};
use gridrelay_shared::delivery_attributes::DeliveryAttributeRequest;
use gridrelay_shared::subscription::SubscriptionRequest;

const SECRET: &str = "Bearer gr-test-7f3a9c-not-in-any-record";

/// H1: every delivery carries the subscription's headers, secret ones resolved from the secret
/// store; the stored subscription record holds only the secret's id, never its value; deleting
/// the subscription deletes the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_headers_with_secret_values_h1() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("billing").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    let header = |name: &str, value: &str, is_secret: bool| DeliveryAttributeRequest {
        name: name.into(),
        value: value.into(),
        is_secret,
        dynamic: false,
    };
    let registered = sys
        .subscribe(SubscriptionRequest {
            delivery_attributes: vec![
                header("X-Team", "payments", false),
                header("Authorization", SECRET, true),
            ],
            max_events_per_batch: Some(5),
            ..subscription("billing", "with-headers", &sub.url)
        })
        .await;

    sys.publish(&topic, &events("h", 3)).await;
    let got = sub.wait_for_requests(1, Duration::from_secs(30)).await;
    for r in &got {
        assert_eq!(r.header("x-team"), Some("payments"));
        assert_eq!(r.header("authorization"), Some(SECRET));
        assert_eq!(r.header("aeg-event-type"), Some("Notification"));
    }

    // The record as DynamoDB holds it: the secret's id, not its value.
    let item = aws_sdk_dynamodb::Client::new(&sys.sdk)
        .get_item()
        .table_name(&sys.names.subscriptions_table)
        .key(
            "topic",
            aws_sdk_dynamodb::types::AttributeValue::S("billing".into()),
        )
        .key(
            "name",
            aws_sdk_dynamodb::types::AttributeValue::S("with-headers".into()),
        )
        .send()
        .await
        .expect("get item")
        .item
        .expect("stored");
    let doc = item["doc"].as_s().expect("doc");
    assert!(
        !doc.contains(SECRET),
        "secret value stored in the record: {doc}"
    );
    assert!(
        doc.contains("payments"),
        "non-secret values are kept: {doc}"
    );
    let secret_id = registered.delivery_attribute_mappings[1]
        .secret_id
        .clone()
        .expect("the secret's id");
    assert!(secret_id.contains(&format!(
        "{}/billing/with-headers/authorization",
        sys.names.secret_prefix
    )));
    let shown = serde_json::to_string(&registered).expect("json");
    assert!(!shown.contains(SECRET), "what `show` prints: {shown}");

    assert!(
        sys.registry()
            .delete("billing", "with-headers")
            .await
            .expect("deleted")
    );
    let gone = aws_sdk_secretsmanager::Client::new(&sys.sdk)
        .get_secret_value()
        .secret_id(&secret_id)
        .send()
        .await;
    assert!(gone.is_err(), "the secret is deleted with the subscription");
    sys.shutdown().await;
}

/// #34 item 4, H1: Secrets Manager's answers as the deliver worker reads them: a secret that
/// does not exist is `NotFound` (its subscription's problem), a store that cannot be reached is
/// `Unavailable` (nobody's: the work waits for it, no attempt is spent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_store_answers_tell_a_missing_secret_from_an_unavailable_store_h1() {
    use gridrelay_adapters::aws::SecretsManagerStore;
    use gridrelay_ports::{SecretError, SecretStore};

    let sys = TestSystem::start(0.01).await;
    let id = sys
        .secrets
        .put("gridrelay/e2e/deleted", "Bearer gone")
        .await
        .expect("stored");
    sys.secrets.delete(&id).await.expect("deleted");
    let missing = sys.secrets.get(&id).await.map(|_| ()).unwrap_err();
    assert!(matches!(missing, SecretError::NotFound(_)), "{missing:?}");

    // Nothing listens on port 9 of 127.0.0.1: every call fails to connect.
    let unreachable = SecretsManagerStore::new(aws_sdk_secretsmanager::Client::from_conf(
        aws_sdk_secretsmanager::config::Builder::from(&sys.sdk)
            .endpoint_url("http://127.0.0.1:9")
            .build(),
    ));
    let down = unreachable.get("any").await.map(|_| ()).unwrap_err();
    assert!(down.is_unavailable(), "{down:?}");
    sys.shutdown().await;
}
