//! The sender's file descriptor guard (issue #9 item 3: connections kept, inside Lambda's
//! 1,024 descriptors). In a test binary of its own: it counts the whole process's descriptors,
//! which other tests running beside it would move.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use gridrelay_adapters::descriptors::{FLUSH_AT, RESERVE, open_descriptors};
use gridrelay_adapters::http_sender::{HttpEventSender, SenderConfig};
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::outbound::{AllowedNetworks, OutboundPolicy};
use support::{burst, counting_sink, eventually};

/// Idle connections to one endpoint are closed when another endpoint's new connections find
/// descriptors running short, and within the reserve a new connection is refused as a failed
/// attempt that says why, not opened until the process runs out (the AWS calls need some).
#[tokio::test]
async fn idle_connections_are_closed_when_descriptors_run_short_and_the_reserve_is_kept() {
    let (a, at_a) = counting_sink(Duration::from_millis(100)).await;
    let (b, at_b) = counting_sink(Duration::from_millis(100)).await;
    let before = open_descriptors().expect("this test reads /proc/self/fd");
    // Short of descriptors from 30 more on. This near the limit the guard reads the count at
    // each new connection; here each costs two, both ends being in this process: A's 20
    // stay below the mark, B's find 40 more.
    let limit = before + FLUSH_AT + 30;
    let sender = HttpEventSender::new(with_limit(limit)).unwrap();

    let sent = burst(&sender, &a, 20).await;
    assert!(sent.iter().all(|s| s.result == AttemptResult::Status(200)));
    assert_eq!(
        at_a.open(),
        20,
        "A's connections are kept for its next burst"
    );

    // B's connections bring the count past the mark; a request after that drops the idle pool.
    let sent = burst(&sender, &b, 15).await;
    assert!(sent.iter().all(|s| s.result == AttemptResult::Status(200)));
    let sent = burst(&sender, &b, 1).await;
    assert_eq!(sent[0].result, AttemptResult::Status(200));
    assert!(
        eventually(|| at_a.open() == 0).await,
        "A's idle connections are closed: {} still open",
        at_a.open()
    );

    // Within the reserve, a new connection is refused, and says why.
    let now = open_descriptors().unwrap();
    let tight = HttpEventSender::new(with_limit(now + RESERVE)).unwrap();
    let accepted_at_b = at_b.accepted();
    let refused = burst(&tight, &b, 1).await;
    match &refused[0].result {
        AttemptResult::ConnectionFailed(why) => assert!(
            why.contains("no file descriptor to spare"),
            "the attempt says why: {why}"
        ),
        other => panic!("a refused connection is a failed attempt, not {other:?}"),
    }
    assert_eq!(at_b.accepted(), accepted_at_b, "no connection was opened");
}

/// A sender's settings under `limit` file descriptors, to loopback.
fn with_limit(limit: usize) -> SenderConfig {
    SenderConfig {
        descriptor_limit: limit,
        ..SenderConfig::new(
            Duration::from_secs(10),
            100,
            OutboundPolicy::new(AllowedNetworks::loopback()),
        )
    }
}
