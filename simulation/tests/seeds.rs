//! The seeded simulation (see the crate's docs), run for many seeds. `SIMULATION_SEEDS=N` sets
//! how many (default 1,000), shared out over the cores; `SIMULATION_SEED=S` replays one.

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
    let seeds = seeds();
    // Each run is its own single-threaded world, a function of its seed alone: the seeds are
    // shared out over the machine's cores (on 2 cores, 1,000 seeds took 287 s on one).
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sums: Vec<Sums> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let mine: Vec<u64> = seeds
                    .iter()
                    .copied()
                    .skip(worker)
                    .step_by(workers)
                    .collect();
                scope.spawn(move || {
                    mine.into_iter()
                        .fold(Sums::default(), |sums, seed| sums.add(seed))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let s = sums.into_iter().fold(Sums::default(), Sums::merge);
    let (total, runs) = (s.total, s.runs);
    println!(
        "{runs} seeds: {} event deliveries owed, {} delivered, {} dead-lettered, 0 lost; {} duplicates; {} invocations, {} crashed, {} rounds of two at once, {} events handed on at a deadline; {} requests hung to the attempt timeout, {} late successes marked (R4), {} events held for a delayed endpoint (D1), {} held by caps",
        total.expected,
        total.delivered,
        total.dead_lettered,
        total.duplicates,
        s.invocations,
        s.crashes,
        s.at_once,
        s.handed_on,
        s.hung,
        s.late,
        s.delayed,
        s.throttled
    );
    if runs > 100 {
        // The faults fired: the guarantee held through them, not around them.
        assert!(s.crashes > runs / 2, "{} crashes in {runs} runs", s.crashes);
        assert!(total.duplicates > 0 && total.dead_lettered > 0 && s.handed_on > 0);
        // The paths that wait and race ran.
        assert!(
            s.at_once > runs && s.hung > runs && s.late > 0 && s.delayed > 0 && s.throttled > 0
        );
    }
}

/// What the runs of many seeds add up to.
#[derive(Default)]
struct Sums {
    total: Tally,
    runs: usize,
    crashes: usize,
    invocations: usize,
    handed_on: usize,
    at_once: usize,
    hung: usize,
    late: usize,
    delayed: usize,
    throttled: usize,
}

impl Sums {
    /// These sums and the run of `seed`, whose check must pass.
    fn add(self, seed: u64) -> Self {
        let run = run(seed, FaultRates::default());
        let tally = run.check().unwrap_or_else(|e| panic!("{e}"));
        let hung = run
            .answered
            .iter()
            .filter(|a| a.result == gridrelay_shared::classify::AttemptResult::TimedOut)
            .count();
        self.merge(Sums {
            total: tally,
            runs: 1,
            crashes: run.crashes,
            invocations: run.invocations,
            handed_on: run.deliver.handed_on,
            at_once: run.rounds_at_once,
            hung,
            late: run.deliver.late_successes,
            delayed: run.deliver.delayed,
            throttled: run.deliver.throttled,
        })
    }

    fn merge(self, other: Sums) -> Self {
        Sums {
            total: Tally {
                expected: self.total.expected + other.total.expected,
                delivered: self.total.delivered + other.total.delivered,
                dead_lettered: self.total.dead_lettered + other.total.dead_lettered,
                duplicates: self.total.duplicates + other.total.duplicates,
            },
            runs: self.runs + other.runs,
            crashes: self.crashes + other.crashes,
            invocations: self.invocations + other.invocations,
            handed_on: self.handed_on + other.handed_on,
            at_once: self.at_once + other.at_once,
            hung: self.hung + other.hung,
            late: self.late + other.late,
            delayed: self.delayed + other.delayed,
            throttled: self.throttled + other.throttled,
        }
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
