//! Outbound safety end to end (issue #10, items 1 and 2): the whole system on the AWS API,
//! subscribers as real HTTP servers on loopback addresses, names resolved by a test resolver.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gridrelay_e2e::{Subscriber, TestSystem, events, subscription};
use gridrelay_ports::memory::MemoryResolver;
use gridrelay_ports::registration::RegistrationError;
use gridrelay_shared::subscription::SubscriptionRequest;

const WAIT: Duration = Duration::from_secs(30);

/// Two servers on one port: the subscriber on 127.0.0.2 (the one allowed network here, so it
/// plays the public address) and, on 127.0.0.1, what a rebinding would aim at.
async fn subscriber_and_target() -> (Subscriber, Subscriber) {
    for _ in 0..20 {
        let subscriber = Subscriber::start_on_closing(SocketAddr::from(([127, 0, 0, 2], 0)))
            .await
            .expect("bind 127.0.0.2");
        let port = subscriber.addr().port();
        if let Some(target) =
            Subscriber::start_on_closing(SocketAddr::from(([127, 0, 0, 1], port))).await
        {
            return (subscriber, target);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

/// Item 1, DNS rebinding: a name that resolved to an allowed address when its subscription was
/// validated, and to loopback afterwards, is refused at connect time: each attempt is a failed
/// attempt (outcome `Forbidden`), retried, then dead-lettered, never a silent
/// drop; the loopback server gets nothing. (The subscriber closes each connection, so every
/// attempt connects anew, as after a cold start.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_rebound_to_loopback_after_validation_is_refused_and_dead_lettered() {
    let (subscriber, target) = subscriber_and_target().await;
    let resolver = Arc::new(MemoryResolver::default());
    resolver.set("hooks.rebind.test", &["127.0.0.2"]);
    let sys = TestSystem::start_with(0.01, |c| {
        c.allowed_networks = "127.0.0.2/32".parse().expect("a network");
        c.resolver = resolver.clone();
    })
    .await;
    let topic = sys.topic("orders").await;
    let endpoint = format!("http://hooks.rebind.test:{}/hook", subscriber.addr().port());
    sys.subscribe(SubscriptionRequest {
        max_delivery_attempts: Some(2),
        dead_letter_destination: Some(sys.dead_letter_url("rebind")),
        ..subscription("orders", "audit", &endpoint)
    })
    .await;
    sys.publish(&topic, &events("before", 1)).await;
    subscriber.wait_for_requests(1, WAIT).await;

    resolver.set("hooks.rebind.test", &["127.0.0.1"]);
    sys.publish(&topic, &events("after", 1)).await;
    let objects = sys.wait_for_dead_letters("rebind/", WAIT).await;
    let record = &objects[0].1[0];
    assert_eq!(record["id"], "after-0");
    assert_eq!(record["lastDeliveryOutcome"], "Forbidden");
    assert_eq!(record["deliveryAttempts"], 2);
    assert_eq!(record["deadLetterReason"], "MaxDeliveryAttemptsExceeded");

    let delivered: Vec<String> = subscriber.received().iter().flat_map(|r| r.ids()).collect();
    assert_eq!(delivered, vec!["before-0".to_string()]);
    assert_eq!(subscriber.validations().len(), 1);
    assert!(
        target.received().is_empty() && target.validations().is_empty(),
        "the rebound address got nothing"
    );
    sys.shutdown().await;
}

/// Items 1 and 2 at create: an endpoint that names or resolves to an address outside the
/// allowed networks, or plain http:// outside them, is refused at once, naming the endpoint
/// flag, the host and why, and nothing is stored or asked of the deliver function.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_outside_the_allowed_networks_are_refused_at_create() {
    let sys = TestSystem::start(0.01).await; // loopback allowed, as `gridrelay local`
    sys.topic("orders").await;
    for (endpoint, says) in [
        ("https://169.254.169.254/latest/meta-data", "link-local"),
        ("https://[::ffff:a9fe:a9fe]/latest", "link-local"),
        ("http://10.0.0.1/hook", "private"),
        ("https://[fd00:ec2::254]/", "private"),
        ("https://100.64.0.1/", "carrier-grade NAT"),
        ("https://0.0.0.0/", "unspecified"),
        ("http://192.0.2.1/hook", "reserved"),
        ("http://8.8.8.8/hook", "plain http://"),
    ] {
        let refused = sys
            .registry()
            .register(
                &subscription("orders", "refused", endpoint),
                chrono::Utc::now(),
            )
            .await;
        let Err(RegistrationError::Invalid(e)) = refused else {
            panic!("{endpoint}: {refused:?}");
        };
        assert_eq!(e.field, "endpoint");
        assert!(e.value.contains(says), "{endpoint}: {e}");
        assert!(e.allowed.contains("127.0.0.0/8,::1/128"), "{endpoint}: {e}");
    }
    let stored = sys
        .system
        .store
        .list_subscriptions("orders")
        .await
        .expect("list");
    assert!(stored.is_empty(), "nothing stored: {stored:?}");
    sys.shutdown().await;
}
