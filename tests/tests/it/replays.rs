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

/// #35: a replay's steps read a topic's archive in S3 as the archive stream writes it (GZIP
/// records in objects under `archive/YYYY/MM/DD/HH/`, named by the time written), from the
/// cursor each step leaves, within each step's budget of events, bytes, objects and hours: over
/// sparse and busy hours, objects holding other topics' events and events outside the window,
/// the steps together take exactly the window's events of the topic, each once, in the order
/// archived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_read_exactly_the_windows_events_once_within_their_budgets() {
    use gridrelay_adapters::aws::{S3ArchiveSource, s3_client};
    use gridrelay_ports::ArchiveSource;
    use gridrelay_shared::archive::{TimeWindow, archive_lines};
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
    // (minutes after 10:00 the object was written, its events).
    let objects: Vec<(i64, Vec<Archived>)> = vec![
        (
            1,
            vec![("orders", "early".into(), -30), ("orders", "a0".into(), 1)],
        ),
        (5, (1..4).map(|i| ("orders", format!("a{i}"), 5)).collect()),
        (
            7,
            vec![("billing", "other".into(), 7), ("orders", "a4".into(), 7)],
        ),
        // 11:00 holds nothing; 12:00 two objects, one past the window's end.
        (
            125,
            (5..9).map(|i| ("orders", format!("a{i}"), 125)).collect(),
        ),
        (
            130,
            vec![("orders", "a9".into(), 130), ("orders", "late".into(), 200)],
        ),
    ];
    for (n, (written, events)) in objects.iter().enumerate() {
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
            "archive/{}s-archive-1-{}-{n:08x}.json.gz",
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
    let source = S3ArchiveSource::new(s3, &bucket);
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
