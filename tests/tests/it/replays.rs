//! Replays' records (#35) in DynamoDB: created once under a name, read back as written, listed
//! newest first, and moved on only over the version read, so two copies of one step cannot
//! both move a replay.

use chrono::{Duration, Utc};
use gridrelay_adapters::aws::DynamoReplayStore;
use gridrelay_e2e::TestSystem;
use gridrelay_ports::{ReplayStore, StoreError};
use gridrelay_shared::replay::{ArchivePosition, Replay, ReplayState, ReplayTarget};

fn replay(name: &str, minutes_ago: i64) -> Replay {
    use chrono::DurationRound;
    // Kept to the millisecond.
    let now = (Utc::now() - Duration::minutes(minutes_ago))
        .duration_trunc(Duration::milliseconds(1))
        .unwrap();
    Replay {
        topic: "orders".into(),
        name: name.into(),
        start_time: now - Duration::hours(2),
        end_time: now - Duration::hours(1),
        subscriptions: vec![ReplayTarget {
            name: "billing".into(),
            id: "b-1".into(),
        }],
        rate: 100,
        state: ReplayState::Running,
        version: 0,
        cursor: None,
        events_sent: 0,
        next_step_due: None,
        created_at: now,
        updated_at: now,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_moves_on_only_over_the_version_it_was_read_at() {
    let sys = TestSystem::start(0.01).await;
    let store = DynamoReplayStore::new(
        aws_sdk_dynamodb::Client::new(&sys.sdk),
        &sys.names.replays_table,
    );
    let first = replay("first", 10);
    store.create_replay(&first).await.unwrap();
    assert!(matches!(
        store.create_replay(&first).await,
        Err(StoreError::AlreadyExists(_))
    ));
    store.create_replay(&replay("second", 1)).await.unwrap();
    assert_eq!(
        store.get_replay("orders", "first").await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(store.get_replay("orders", "none").await.unwrap(), None);
    let names: Vec<String> = store
        .list_replays("orders")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["second", "first"], "newest first");
    assert!(store.list_replays("other").await.unwrap().is_empty());

    // A step at version 0 moves it to 1; a twin that read version 0 too is refused.
    let moved = Replay {
        version: 1,
        cursor: Some(ArchivePosition {
            key: "archive/2026/11/27/12/a".into(),
            line: 40,
        }),
        events_sent: 40,
        ..first.clone()
    };
    store.update_replay(&moved, 0).await.unwrap();
    let twin = Replay {
        version: 1,
        events_sent: 41,
        ..first.clone()
    };
    assert!(matches!(
        store.update_replay(&twin, 0).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        store.get_replay("orders", "first").await.unwrap(),
        Some(moved)
    );
    let missing = Replay {
        version: 1,
        ..replay("missing", 0)
    };
    assert!(matches!(
        store.update_replay(&missing, 0).await,
        Err(StoreError::NotFound(_))
    ));
    // A write moves a replay exactly one version on.
    let leap = Replay {
        version: 3,
        ..first.clone()
    };
    assert!(matches!(
        store.update_replay(&leap, 1).await,
        Err(StoreError::Corrupt(_))
    ));
    sys.shutdown().await;
}

/// #35: a replay's steps read a topic's archive in S3 as the archive streams write it (GZIP
/// records in objects under each retention class's `archive/<days>d/YYYY/MM/DD/HH/`, or
/// `archive/YYYY/…` for those written before classes, named by the time written), from the
/// cursor each step leaves, within each step's budget of events, bytes, objects and hours: over
/// sparse and busy hours, objects of several classes in one hour (a topic whose retention
/// changed), objects holding other topics' events and events outside the window, the steps
/// together take exactly the window's events of the topic, each once, in the order archived.
/// A class's hours older than it keeps (here the 1-day class's, five days on) are not read:
/// S3 has expired them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_read_exactly_the_windows_events_once_within_their_budgets() {
    use gridrelay_adapters::aws::{S3ArchiveSource, s3_client};
    use gridrelay_ports::ArchiveSource;
    use gridrelay_ports::memory::ManualClock;
    use gridrelay_shared::archive::{TimeWindow, archive_lines, class_prefix};
    use gridrelay_shared::journal::compress_record;
    use gridrelay_shared::replay::StepBudget;
    use gridrelay_shared::schema::InputSchema;
    use serde_json::value::RawValue;

    let sys = TestSystem::start_with_own_journal(0.01).await;
    let s3 = s3_client(&sys.sdk);
    let bucket = sys.names.journal_bucket.clone();
    let base = chrono::DateTime::parse_from_rfc3339("2026-11-20T10:00:00Z")
        .unwrap()
        .to_utc();
    let at = |minutes: i64| base + Duration::minutes(minutes);
    // An archived event: its topic, id and minutes after 10:00 it was published.
    type Archived<'a> = (&'a str, String, i64);
    // (minutes after 10:00 the object was written, its retention class (none: written before
    // classes), its events).
    let objects: Vec<(i64, Option<u16>, Vec<Archived>)> = vec![
        (
            1,
            None,
            vec![("orders", "early".into(), -30), ("orders", "a0".into(), 1)],
        ),
        (
            5,
            Some(7),
            (1..4).map(|i| ("orders", format!("a{i}"), 5)).collect(),
        ),
        (6, Some(1), vec![("orders", "expired".into(), 6)]),
        (
            7,
            Some(30),
            vec![("billing", "other".into(), 7), ("orders", "a4".into(), 7)],
        ),
        // 11:00 holds nothing; 12:00 two objects, one past the window's end.
        (
            125,
            Some(7),
            (5..9).map(|i| ("orders", format!("a{i}"), 125)).collect(),
        ),
        (
            130,
            None,
            vec![("orders", "a9".into(), 130), ("orders", "late".into(), 200)],
        ),
    ];
    for (n, (written, class, events)) in objects.iter().enumerate() {
        let time = at(*written);
        let body: Vec<u8> = events
            .iter()
            .flat_map(|(topic, id, published)| {
                let raw = RawValue::from_string(format!(r#"{{"id":"{id}"}}"#)).unwrap();
                archive_lines(topic, InputSchema::EventGridSchema, at(*published), &[raw])
            })
            .flat_map(|line| compress_record(&line))
            .collect();
        let key = format!(
            "{}{}s-archive-1-{}-{n:08x}.json.gz",
            class.map_or("archive/".to_string(), class_prefix),
            gridrelay_shared::journal::hour_prefix(time),
            time.format("%Y-%m-%d-%H-%M-%S")
        );
        s3.put_object()
            .bucket(&bucket)
            .key(&key)
            .body(body.into())
            .send()
            .await
            .unwrap();
    }
    let window = TimeWindow::new(at(0), at(180), "endTime").unwrap();
    let source = S3ArchiveSource::new(s3, &bucket)
        .with_clock(std::sync::Arc::new(ManualClock::new(at(5 * 24 * 60))));
    let expected: Vec<String> = (0..10).map(|i| format!("a{i}")).collect();
    for budget in [
        StepBudget {
            events: 3,
            bytes: usize::MAX,
            objects: 2,
            hours: 1,
        },
        StepBudget {
            events: 1_000,
            bytes: 20,
            objects: 8,
            hours: 48,
        },
        StepBudget {
            events: 1_000,
            bytes: usize::MAX,
            objects: 1,
            hours: 1,
        },
    ] {
        let (mut cursor, mut ids, mut steps) = (None, Vec::new(), 0);
        loop {
            steps += 1;
            assert!(steps < 50, "{budget:?}: the steps never end");
            let step = source
                .read_step("orders", &window, cursor.as_ref(), budget)
                .await
                .unwrap();
            assert!(step.events.len() <= budget.events, "{budget:?}");
            ids.extend(step.events.iter().map(|e| {
                serde_json::from_str::<serde_json::Value>(e.event.get()).unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            }));
            match step.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        assert_eq!(ids, expected, "{budget:?}");
        assert!(steps > 2, "{budget:?}: {steps} steps");
    }
    sys.shutdown().await;
}

/// #35: a replay's backlog never delays a live event. The replay's deliveries (30 messages of
/// 10 events, to a subscriber that holds every request) travel on the replay queue, whose two
/// invocations they fill; an event published meanwhile to a healthy subscription is delivered
/// at once by the delivery queue's own invocations, while the replay's backlog is still there.
/// (On one queue, the live event waited behind the held requests: the attempt timeout, 30 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replays_backlog_never_delays_a_live_event() {
    use gridrelay_e2e::{Reply, Subscriber, events, subscription};
    use gridrelay_ports::OutgoingMessage;
    use gridrelay_shared::archive::TimeWindow;
    use gridrelay_shared::message::DeliveryQueueMessage;
    use gridrelay_shared::replay::ReplayStep;
    use gridrelay_shared::subscription::Topic;

    // The real attempt timeout (30 s); two invocations for each of the two queues.
    let sys = gridrelay_e2e::TestSystem::start_with_own_journal_and(1.0, |c| {
        c.concurrency = 2;
        c.replay_concurrency = 2;
    })
    .await;
    let topic = Topic {
        retention_days: 1,
        ..Topic::with_new_keys("backlog", Utc::now())
    };
    sys.system.store.create_topic(&topic).await.unwrap();
    let healthy = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("backlog", "healthy", &healthy.url))
        .await;
    let start = Utc::now();
    sys.publish(&topic, &events("archived", 300)).await;
    let end = Utc::now();
    healthy
        .wait_for_requests(300, std::time::Duration::from_secs(60))
        .await;

    // The replay's subscriber holds every request longer than the attempt timeout.
    let held = Subscriber::start(vec![], Reply::Hang(std::time::Duration::from_secs(120))).await;
    let target = sys
        .subscribe(gridrelay_shared::subscription::SubscriptionRequest {
            max_events_per_batch: Some(10),
            ..subscription("backlog", "held", &held.url)
        })
        .await;
    let store = DynamoReplayStore::new(
        aws_sdk_dynamodb::Client::new(&sys.sdk),
        &sys.names.replays_table,
    );
    // Due at once: the window's events were archived as their publish was accepted.
    let replay = Replay::new(
        "backlog",
        "all-at-once",
        TimeWindow::new(start, end, "endTime").unwrap(),
        vec![ReplayTarget {
            name: target.name.clone(),
            id: target.id.clone(),
        }],
        10_000,
        Utc::now(),
        Utc::now(),
    );
    store.create_replay(&replay).await.unwrap();
    let step = DeliveryQueueMessage::Replay(ReplayStep::of(&replay));
    let sent = sys
        .system
        .control_queue
        .send_all(&[OutgoingMessage {
            body: step.to_body().unwrap(),
            delay: std::time::Duration::ZERO,
            group: None,
        }])
        .await;
    assert!(sent.iter().all(Result::is_ok), "{sent:?}");
    let first = held
        .wait_for_requests(1, std::time::Duration::from_secs(60))
        .await;
    assert_eq!(first[0].header("gridrelay-replay"), Some("all-at-once"));
    // Its replayed requests so far (it is subscribed, so it is sent the live event too).
    let replayed = || {
        held.received()
            .iter()
            .filter(|r| r.header("gridrelay-replay") == Some("all-at-once"))
            .count()
    };

    sys.publish(&topic, &events("live", 1)).await;
    let delivered = gridrelay_e2e::eventually(
        std::time::Duration::from_secs(15),
        "the live event delivered while the replay's requests are held",
        || async {
            healthy
                .received()
                .iter()
                .any(|r| r.ids() == ["live-0"])
                .then(replayed)
        },
    )
    .await;
    // Its backlog was still there: messages not yet received, which on one queue the live
    // event would have waited behind.
    let backlog = gridrelay_e2e::queue_counts(
        &aws_sdk_sqs::Client::new(&sys.sdk),
        &sys.system.resources.replay_queue_url,
    )
    .await
    .expect("queue attributes");
    assert!(backlog.visible > 0, "{backlog:?}");
    eprintln!(
        "live event delivered with {delivered} of the replay's 30 requests made, {} of its messages waiting",
        backlog.visible
    );
    // Not shut down: that would wait out the held requests' 30 s timeout and late answers (R4);
    // the test's runtime ends the runner.
}
