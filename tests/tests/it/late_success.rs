//! End-to-end: R4, a timed-out attempt answered with success within 3 minutes cancels its
//! pending retry.

use std::time::Duration;

use gridrelay_e2e::{Reply, Subscriber, TestSystem, events, subscription};
use gridrelay_shared::classify::DeliveryOutcome;
use gridrelay_shared::journal::{Attempt, Standing, Step};

/// R4, S2, at scale 0.1 (timeout 3 s, first retry step 1 s, late window 18 s): the endpoint
/// answers 200 half a second after the attempt timed out. The retry was enqueued as usual, but
/// the late success is recorded before it comes due, so it is never sent and the event counts
/// as delivered: the endpoint sees exactly one request. The delivery journal (#35) shows the
/// timed-out attempt, then the late success, and the event stands delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_success_cancels_the_pending_retry_r4() {
    let sys = TestSystem::start_with_own_journal_and(0.1, |c| {
        c.visibility_timeout = Duration::from_secs(30);
        c.function_timeout = Duration::from_secs(30);
    })
    .await;
    let topic = sys.topic("late").await;
    let sub = Subscriber::start(
        vec![Reply::Hang(Duration::from_millis(3_500))],
        Reply::Status(200),
    )
    .await;
    sys.subscribe(subscription("late", "sub-1", &sub.url)).await;

    sys.publish(&topic, &events("l", 1)).await;
    let stats = sys
        .wait_for_stats("the retry cancelled", |s| s.deliver.late_successes == 1)
        .await;
    assert_eq!(
        stats.deliver.retried, 1,
        "the timeout was retried as usual (S2)"
    );
    assert_eq!(stats.deliver.delivered, 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sub.received().len(), 1, "the retry was never sent");
    let life = sys.event_life("late", "l-0").await;
    let steps: Vec<&Step> = life.subscriptions[0]
        .steps
        .iter()
        .map(|e| &e.step)
        .collect();
    assert!(
        matches!(
            steps[..],
            [
                Step::Fanned { .. },
                Step::Attempt(Attempt {
                    attempt: 1,
                    outcome: DeliveryOutcome::TimedOut,
                    ..
                }),
                Step::LateSuccess { attempt: 1 },
            ]
        ),
        "{steps:?}"
    );
    assert!(
        matches!(life.subscriptions[0].standing, Standing::Delivered { .. }),
        "{life:?}"
    );
    sys.shutdown().await;
}

/// Item 1 of the life-cycle issue, on the local stack: the runner gives each invocation a
/// Lambda's deadline (function timeout 6 s here) and stops one still running at it. The worker
/// plans against it: after an attempt that timed out (3 s at scale 0.1) it waits for the late
/// answer (R4) only for the time left before the deadline, less its margin, so the invocation
/// ends in time and its retry is enqueued, instead of being stopped with nothing recorded and
/// its message coming back after the visibility timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invocation_waiting_for_a_late_answer_ends_before_its_deadline_r4() {
    let sys = TestSystem::start_with(0.1, |c| {
        c.visibility_timeout = Duration::from_secs(30);
        c.function_timeout = Duration::from_secs(6);
        c.deadline_margin = Duration::from_secs(1);
    })
    .await;
    let topic = sys.topic("deadline").await;
    let sub = Subscriber::start(
        vec![Reply::Hang(Duration::from_secs(20))],
        Reply::Status(200),
    )
    .await;
    sys.subscribe(subscription("deadline", "sub-1", &sub.url))
        .await;

    sys.publish(&topic, &events("d", 1)).await;
    let stats = sys
        .wait_for_stats("the timed-out attempt's retry", |s| {
            s.deliver.retried == 1 || s.stopped_invocations > 0
        })
        .await;
    assert_eq!(stats.stopped_invocations, 0, "{stats:?}");
    let stats = sys
        .wait_for_stats("the retry delivered", |s| s.deliver.delivered == 1)
        .await;
    assert_eq!(stats.stopped_invocations, 0, "{stats:?}");
    sys.shutdown().await;
}
