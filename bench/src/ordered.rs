//! O1 (#39): ordered delivery beside unordered delivery on the local stack, in one run (these
//! machines are noisy: only the ratios carry). `gridrelay local` on the emulator, a sink
//! answering at once, events published in arrays of 100 by four publishers:
//!
//! - unordered, the baseline;
//! - ordered by `subject`, every event one key: one request at a time, each after the one
//!   before it was answered;
//! - ordered by `subject`, the events spread over many keys;
//!
//! then one large publish (an array of a thousand smaller events), unordered beside ordered
//! over as many keys, for what `ingest` takes to send one message per keyed event, key by key.
//! Printed per case: events delivered per second, each publish's time, and the SQS and
//! DynamoDB calls per event (every AWS call counted by the `aws_calls` proxy).

use std::path::PathBuf;
use std::time::Duration;

use gridrelay_local::FrontDoor;
use gridrelay_local::batching::EventSourceBatching;

use crate::aws_calls::{AwsCallCounter, CallCounts};
use crate::e2e;

/// How large the run's cases are.
pub struct Sizes {
    /// Events of the unordered and the many-keys cases.
    pub events: usize,
    /// Events of the one-key case (it goes one round trip per event).
    pub one_key_events: usize,
    /// Keys of the many-keys case.
    pub keys: usize,
    /// Events of the large publish.
    pub large_publish: usize,
    pub event_bytes: usize,
}

/// Events per array, as the rest of `make bench` publishes.
const PER_PUBLISH: usize = 100;
/// The large publish's events: a thousand of them stay under a publish's 1 MB.
const LARGE_EVENT_BYTES: usize = 500;

fn case(events: usize, event_bytes: usize, per_publish: usize, keys: Option<usize>) -> e2e::Case {
    e2e::Case {
        events,
        event_bytes,
        per_publish,
        delay_ms: 0,
        max_events_per_batch: None,
        max_in_flight: None,
        front_door: FrontDoor::HttpApi,
        archived: false,
        deduped: false,
        event_source: EventSourceBatching::default(),
        ordered_keys: keys,
    }
}

/// Calls per event of the services whose names start with `prefix` (`sqs:`, `dynamodb:`).
fn per_event(calls: &CallCounts, prefix: &str, events: usize) -> f64 {
    let n: u64 = calls
        .iter()
        .filter(|(op, _)| op.starts_with(prefix))
        .map(|(_, c)| c.calls)
        .sum();
    n as f64 / events as f64
}

/// The calls that took the most time in all, each with its count per event and mean time:
/// where a case's time goes.
fn slowest_calls(calls: &CallCounts, events: usize, top: usize) -> String {
    let mut by_time: Vec<_> = calls.iter().filter(|(_, c)| c.calls > 0).collect();
    by_time.sort_by_key(|(_, c)| std::cmp::Reverse(c.micros));
    by_time
        .into_iter()
        .take(top)
        .map(|(op, c)| {
            format!(
                "{op} {:.2}/event {:.1} ms",
                c.calls as f64 / events as f64,
                c.micros as f64 / c.calls as f64 / 1000.0
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The mean and the longest of `times`, in milliseconds.
fn mean_and_max(times: &[Duration]) -> (f64, f64) {
    let max = times.iter().max().copied().unwrap_or_default();
    let sum: Duration = times.iter().sum();
    (millis(sum) / times.len().max(1) as f64, millis(max))
}

pub async fn run(binary: PathBuf, sizes: Sizes, aws: &AwsCallCounter) -> anyhow::Result<()> {
    println!(
        "ordered delivery (O1): gridrelay local, a sink answering at once, events of {} B in arrays of {PER_PUBLISH}",
        sizes.event_bytes
    );
    let cases = [
        (
            "unordered",
            case(sizes.events, sizes.event_bytes, PER_PUBLISH, None),
        ),
        (
            "ordered, one key",
            case(
                sizes.one_key_events,
                sizes.event_bytes,
                PER_PUBLISH,
                Some(1),
            ),
        ),
        (
            "ordered, many keys",
            case(
                sizes.events,
                sizes.event_bytes,
                PER_PUBLISH,
                Some(sizes.keys),
            ),
        ),
    ];
    let mut baseline = None;
    for (label, case) in cases {
        let run = e2e::run(binary.clone(), crate::prefix(&case), case, aws).await?;
        let rate = case.events as f64 / run.elapsed.as_secs_f64();
        let base = *baseline.get_or_insert(rate);
        let (mean, max) = mean_and_max(&run.publish_times);
        let keys = case
            .ordered_keys
            .map_or(String::new(), |k| format!(", {k} keys"));
        println!(
            "  {label:<19} {:>6} events{keys}: {rate:>7.0} events/s = {:.3} of unordered; publish of {} {mean:.0} ms mean, {max:.0} ms longest; per event {:.2} SQS calls, {:.2} DynamoDB calls",
            case.events,
            rate / base,
            case.per_publish,
            per_event(&run.calls, "sqs:", case.events),
            per_event(&run.calls, "dynamodb:", case.events),
        );
        println!(
            "    most time in: {}",
            slowest_calls(&run.calls, case.events, 5)
        );
    }
    let n = sizes.large_publish;
    let mut unordered_ms = None;
    for (label, keys) in [("unordered", None), ("ordered", Some(n))] {
        let case = case(n, LARGE_EVENT_BYTES, n, keys);
        let run = e2e::run(binary.clone(), crate::prefix(&case), case, aws).await?;
        let (took, _) = mean_and_max(&run.publish_times);
        let base = *unordered_ms.get_or_insert(took);
        let keys = keys.map_or(String::new(), |k| format!(" over {k} keys"));
        println!(
            "  one publish of {n} events of {LARGE_EVENT_BYTES} B, {label}{keys}: answered in {took:.0} ms = {:.2}x unordered; per event {:.2} SQS calls",
            took / base,
            per_event(&run.calls, "sqs:", n),
        );
    }
    Ok(())
}
