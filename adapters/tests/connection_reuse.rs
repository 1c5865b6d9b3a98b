//! The sender keeps an endpoint's connections for its next burst (issue #9 item 3:
//! connections kept alive across invocations).

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use gridrelay_adapters::http_sender::{HttpEventSender, SenderConfig};
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::outbound::{AllowedNetworks, OutboundPolicy};
use support::{burst, counting_sink};

async fn all_answered(sender: &HttpEventSender, endpoint: &str, requests: usize) {
    let sent = burst(sender, endpoint, requests).await;
    assert!(sent.iter().all(|s| s.result == AttemptResult::Status(200)));
}

/// A burst of 200 requests at once to an endpoint that answers after 100 ms needs 200
/// connections; the next burst (the next warm invocation) finds them all open and opens none.
/// With idle connections capped at 64 per endpoint, it opened 136 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_burst_reuses_every_connection_the_last_one_opened() {
    let (endpoint, connections) = counting_sink(Duration::from_millis(100)).await;
    let sender = HttpEventSender::new(SenderConfig::new(
        Duration::from_secs(10),
        576,
        OutboundPolicy::new(AllowedNetworks::loopback()),
    ))
    .unwrap();

    all_answered(&sender, &endpoint, 200).await;
    let first = connections.accepted();
    assert!(first >= 150, "{first} connections for 200 requests at once");
    all_answered(&sender, &endpoint, 200).await;
    let opened_again = connections.accepted() - first;
    assert!(
        opened_again <= 5,
        "the second burst opened {opened_again} connections; the first left {first} open"
    );
}
