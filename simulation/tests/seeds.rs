//! The seeded simulation (see the crate's docs), run for many seeds. `SIMULATION_SEEDS=N` sets
//! how many (default 1,000); `SIMULATION_SEED=S` replays one.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use gridrelay_simulation::{FaultRates, Tally, run};

fn seeds() -> Vec<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    match var("SIMULATION_SEED") {
        Some(seed) => vec![seed],
        None => (0..var("SIMULATION_SEEDS").unwrap_or(1_000)).collect(),
    }
}

/// G1, L2, L5 and no misdelivery, under crashes at any I/O step, failed store, queue and
/// object-store calls, queue sends made twice, messages received by two invocations at once,
/// lost deletes and subscribers that fail, hang until the attempt timeout, answer late (R4)
/// or refuse (the `created` one answers 400 at times, which is not retried), on tokio's paused
/// clock so the paths that wait (permits, caps, late answers, delays, the deadline) run:
/// every event accepted with 200 reaches every subscription whose filter it passes, or its
/// dead-letter location; nothing reaches a subscription it is not for; nothing is dropped.
#[test]
fn every_seed_keeps_the_delivery_guarantee_g1_l2() {
    let mut total = Tally::default();
    let (mut crashes, mut invocations, mut runs, mut handed_on) = (0, 0, 0, 0);
    let (mut at_once, mut hung, mut late, mut delayed, mut throttled) = (0, 0, 0, 0, 0);
    for seed in seeds() {
        let run = run(seed, FaultRates::default());
        let tally = run.check().unwrap_or_else(|e| panic!("{e}"));
        total.expected += tally.expected;
        total.delivered += tally.delivered;
        total.dead_lettered += tally.dead_lettered;
        total.duplicates += tally.duplicates;
        crashes += run.crashes;
        invocations += run.invocations;
        handed_on += run.deliver.handed_on;
        at_once += run.rounds_at_once;
        hung += run
            .answered
            .iter()
            .filter(|a| a.result == gridrelay_shared::classify::AttemptResult::TimedOut)
            .count();
        late += run.deliver.late_successes;
        delayed += run.deliver.delayed;
        throttled += run.deliver.throttled;
        runs += 1;
    }
    println!(
        "{runs} seeds: {} event deliveries owed, {} delivered, {} dead-lettered, 0 lost; {} duplicates; {invocations} invocations, {crashes} crashed, {at_once} rounds of two at once, {handed_on} events handed on at a deadline; {hung} requests hung to the attempt timeout, {late} late successes marked (R4), {delayed} events held for a delayed endpoint (D1), {throttled} held by caps",
        total.expected, total.delivered, total.dead_lettered, total.duplicates
    );
    if runs > 100 {
        // The faults fired: the guarantee held through them, not around them.
        assert!(crashes > runs / 2, "{crashes} crashes in {runs} runs");
        assert!(total.duplicates > 0 && total.dead_lettered > 0 && handed_on > 0);
        // The paths that wait and race ran.
        assert!(at_once > runs && hung > runs && late > 0 && delayed > 0 && throttled > 0);
    }
}

/// The check is not vacuous: with a bug planted in the event source (it deletes messages
/// whose invocation reported them failed), events are lost, and the check says which seed
/// and event.
#[test]
fn the_check_catches_a_planted_loss() {
    let rates = FaultRates {
        planted_bug_delete_failed: 1.0,
        ..FaultRates::default()
    };
    let caught = (0..50)
        .map(|seed| run(seed, rates).check())
        .find_map(Result::err)
        .expect("a lost event in 50 seeds");
    assert!(
        caught.contains("was neither delivered to nor dead-lettered"),
        "{caught}"
    );
    assert!(caught.contains("SIMULATION_SEED="), "{caught}");
}

/// A seed replays: the same seed makes the same run, fault for fault.
#[test]
fn a_seed_replays_the_same_run() {
    for seed in [7, 1234] {
        let (a, b) = (
            run(seed, FaultRates::default()),
            run(seed, FaultRates::default()),
        );
        assert_eq!(a.check(), b.check());
        assert_eq!(
            (
                a.invocations,
                a.crashes,
                a.answered.len(),
                a.deliver,
                a.simulated
            ),
            (
                b.invocations,
                b.crashes,
                b.answered.len(),
                b.deliver,
                b.simulated
            )
        );
    }
}
