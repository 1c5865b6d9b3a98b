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
