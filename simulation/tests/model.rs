//! The model of the life cycle (`gridrelay_simulation::model`), checked exhaustively.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use gridrelay_simulation::model::LifeCycle;
use stateright::{Checker, Model};

/// G1 and item 5, for every interleaving of two deliver workers, the dead-letter writer,
/// crashes at every step and visibility timeouts running out (three of each at most): the
/// event is never lost and never reaches a subscription created after it; delivery,
/// dead-lettering and the counted drop are each reached.
#[test]
fn every_interleaving_keeps_the_event_g1() {
    let checker = LifeCycle::default().checker().spawn_bfs().join();
    println!(
        "model: {} states, all checked",
        checker.unique_state_count()
    );
    checker.assert_properties();
    assert!(checker.unique_state_count() > 1_000);
}

/// The property can fail: with the planted bug (delete before enqueueing what follows) the
/// checker finds a run that loses the event.
#[test]
fn deleting_before_enqueueing_loses_the_event() {
    let checker = LifeCycle {
        delete_first: true,
        ..LifeCycle::default()
    }
    .checker()
    .spawn_bfs()
    .join();
    let path = checker.assert_any_discovery("no event is ever lost");
    println!("counterexample: {:?}", path.into_actions());
}

/// Without item 5's identity check, a retry reaches the subscription created again under the
/// name, and the checker finds it.
#[test]
fn without_the_identity_check_a_retry_reaches_the_new_subscription() {
    let checker = LifeCycle {
        ignore_identity: true,
        ..LifeCycle::default()
    }
    .checker()
    .spawn_bfs()
    .join();
    let path = checker.assert_any_discovery("never delivered to another subscription");
    println!("counterexample: {:?}", path.into_actions());
}
