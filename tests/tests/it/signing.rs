//! Signed deliveries (issue #10, item 4), checked with the Standard Webhooks project's own
//! verifier (the `standardwebhooks` crate), not with gridrelay's signing code.

use std::time::Duration;

use gridrelay_e2e::{Received, Reply, Subscriber, TestSystem, events, subscription};
use gridrelay_shared::signing::SigningSecret;
use gridrelay_shared::subscription::SubscriptionRequest;
use standardwebhooks::Webhook;

const WAIT: Duration = Duration::from_secs(30);

fn verifies(secret: &SigningSecret, request: &Received) -> bool {
    Webhook::new(&secret.to_text())
        .expect("a whsec_ secret")
        .verify(request.body.as_bytes(), &request.headers)
        .is_ok()
}

/// Every delivery of a signing subscription verifies with its secret; a retry of the same
/// events keeps its `webhook-id`; another secret does not verify it; a subscription that does
/// not sign sends no signature headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_signed_and_a_retry_keeps_its_webhook_id() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("orders").await;
    let signed = Subscriber::start(vec![Reply::Status(500)], Reply::Status(200)).await;
    let plain = Subscriber::start(vec![], Reply::Status(200)).await;
    let secret = SigningSecret::generate();
    sys.subscribe(SubscriptionRequest {
        signing_secret: Some(secret.clone()),
        ..subscription("orders", "signed", &signed.url)
    })
    .await;
    sys.subscribe(subscription("orders", "plain", &plain.url))
        .await;

    sys.publish(&topic, &events("s", 1)).await;
    let requests = signed.wait_for_requests(2, WAIT).await;
    let (first, retry) = (&requests[0], &requests[1]);
    assert_eq!(first.header("aeg-delivery-count"), Some("0"));
    assert_eq!(retry.header("aeg-delivery-count"), Some("1"));
    assert!(verifies(&secret, first) && verifies(&secret, retry));
    assert!(!verifies(&SigningSecret::generate(), first));
    assert!(
        first
            .header("webhook-id")
            .is_some_and(|id| id.starts_with("msg_"))
    );
    assert_eq!(first.header("webhook-id"), retry.header("webhook-id"));

    sys.publish(&topic, &events("t", 1)).await;
    let next = &signed.wait_for_requests(3, WAIT).await[2];
    assert!(verifies(&secret, next));
    assert_ne!(next.header("webhook-id"), first.header("webhook-id"));

    let unsigned = &plain.wait_for_requests(2, WAIT).await[0];
    assert!(unsigned.header("webhook-signature").is_none());
    assert!(unsigned.header("webhook-id").is_none());
    sys.shutdown().await;
}

/// A rotation signs with the old and the new secret side by side during its grace period
/// (either verifies), and with the new one only after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_signs_beside_the_new_one_until_its_grace_period_ends() {
    // Nothing kept between invocations: the rotation is seen by the next delivery.
    let sys = TestSystem::start_with(0.01, |c| c.config_cache = Duration::ZERO).await;
    let topic = sys.topic("orders").await;
    let subscriber = Subscriber::start(vec![], Reply::Status(200)).await;
    let old = SigningSecret::generate();
    sys.subscribe(SubscriptionRequest {
        signing_secret: Some(old.clone()),
        ..subscription("orders", "rotating", &subscriber.url)
    })
    .await;

    let new = SigningSecret::generate();
    let grace = Duration::from_secs(8);
    let rotated = sys
        .registry()
        .rotate_signing_secret("orders", "rotating", &new, grace, chrono::Utc::now())
        .await
        .expect("rotated");
    let rotated_at = std::time::Instant::now();
    assert!(
        rotated
            .signing
            .as_ref()
            .is_some_and(|s| s.previous.is_some())
    );

    sys.publish(&topic, &events("during", 1)).await;
    let during = &subscriber.wait_for_requests(1, WAIT).await[0];
    assert!(
        during.at < rotated_at + grace,
        "sent within the grace period"
    );
    let signatures = during.header("webhook-signature").unwrap_or_default();
    assert_eq!(signatures.split(' ').count(), 2, "{signatures}");
    assert!(verifies(&old, during) && verifies(&new, during));

    tokio::time::sleep((rotated_at + grace).saturating_duration_since(std::time::Instant::now()))
        .await;
    sys.publish(&topic, &events("after", 1)).await;
    let after = &subscriber.wait_for_requests(2, WAIT).await[1];
    let signatures = after.header("webhook-signature").unwrap_or_default();
    assert_eq!(signatures.split(' ').count(), 1, "{signatures}");
    assert!(verifies(&new, after));
    assert!(!verifies(&old, after), "the old secret no longer signs");
    sys.shutdown().await;
}
