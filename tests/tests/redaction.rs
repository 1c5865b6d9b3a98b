//! No secrets in logs or records (issue #10, item 3): an endpoint URL's credentials
//! (`user:password@`) and query string reach no log line, dead-letter record or stored key,
//! through a handshake and a delivery that fails until it is dead-lettered. Its own test
//! binary: it captures every log line of the process (debug level, every crate).

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gridrelay_e2e::{Subscriber, TestSystem, events, subscription};
use gridrelay_shared::subscription::SubscriptionRequest;

const WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoints_credentials_reach_no_log_line_record_or_key() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .init();

    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("orders").await;
    // Answers the handshake, then goes away: every delivery attempt finds the port closed.
    let subscriber = Subscriber::start_on_closing(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("bind");
    let endpoint = format!(
        "http://gridrelay-user:s3cretpass@{}/hook?code=s3cretcode",
        subscriber.addr()
    );
    sys.subscribe(SubscriptionRequest {
        max_delivery_attempts: Some(2),
        dead_letter_destination: Some(sys.dead_letter_url("redact")),
        ..subscription("orders", "audit", &endpoint)
    })
    .await;
    let handshake = &subscriber.validations()[0];
    assert!(
        handshake.header("authorization").is_some(),
        "the credentials went as Basic authorization"
    );
    drop(subscriber);

    sys.publish(&topic, &events("r", 1)).await;
    let objects = sys.wait_for_dead_letters("redact/", WAIT).await;
    let record = &objects[0].1[0];
    assert_eq!(record["lastDeliveryOutcome"], "SocketError");

    // Endpoint health was recorded (two failures) under a key that holds no part of the URL.
    let state = aws_sdk_dynamodb::Client::new(&sys.sdk)
        .scan()
        .table_name(&sys.names.delivery_state_table)
        .send()
        .await
        .expect("scan the delivery state table");
    let keys: Vec<String> = state
        .items()
        .iter()
        .filter_map(|item| item.get("pk")?.as_s().ok().cloned())
        .collect();
    assert!(keys.iter().any(|k| k.starts_with("endpoint#")), "{keys:?}");

    let logged = logs.text();
    assert!(
        logged.contains("the endpoint refused the connection"),
        "the failing attempts were logged"
    );
    let records = serde_json::to_string(&objects).expect("records as JSON");
    for secret in ["s3cretpass", "s3cretcode", "gridrelay-user"] {
        assert!(!logged.contains(secret), "{secret} in a log line");
        assert!(
            !records.contains(secret),
            "{secret} in a dead-letter record"
        );
        assert!(
            keys.iter().all(|k| !k.contains(secret)),
            "{secret} in a stored key: {keys:?}"
        );
    }
    sys.shutdown().await;
}
