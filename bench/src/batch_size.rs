//! Which event-source batch size `deliver` costs least at, and what a batching window would buy
//! (issue #9). The SQS event source hands `deliver` up to `BatchSize` messages per invocation;
//! Lambda bills each invocation's request and its milliseconds, and an invocation that sends
//! many requests at once waits for them together, so more messages per invocation cost less per
//! event. Above 10 messages AWS requires a batching window of at least 1 s, which holds events
//! back while traffic is light: an artificial wait that G3 rules out. This times warm
//! invocations of the `deliver` bootstrap, under the emulated Runtime API and the CPU share of a
//! 256 MB function (the memory benchmark's cgroup), for batch sizes from 1 to 1,000 messages,
//! of one event each (one event per publish, where batch size matters most) and of 100 (arrays
//! of 100), against subscribers answering at once and after 50 ms, and prices them per million
//! events at list prices.

use std::time::Duration;

use crate::cold_start::{batch_of, subscribed_topic};
use crate::memory_size::{cost_per_million, stack_for_shares, warm_billed_ms};
use crate::sink;

/// `deliver`'s default memory size (chosen by the memory benchmark).
const MEMORY_MB: u32 = 256;
/// The template's and the CDK construct's default batch size: the most AWS allows without a
/// batching window.
const DEFAULT_BATCH: usize = 10;
/// Events of each, small enough that 100 messages of 100 of them stay under the 6 MB Lambda
/// accepts in one invocation.
const EVENT_BYTES: usize = 400;
/// Lambda's limit on an invocation's payload; the event source hands no more in one batch.
const LAMBDA_PAYLOAD_BYTES: usize = 6 * 1024 * 1024;

/// The cases: events per message (the publisher's array) and the batch sizes tried with it.
const CASES: [(usize, &[usize]); 2] = [(1, &[1, 10, 100, 1_000]), (100, &[1, 10, 100])];

/// Prints, for each subscriber latency, publish shape and batch size, `deliver`'s billed time
/// per warm invocation and its cost per million events beside the default batch size's.
pub async fn run() -> anyhow::Result<()> {
    let Some((resources, store)) = stack_for_shares("batch size", "bench-bs").await? else {
        return Ok(());
    };
    println!(
        "batch size: deliver at {MEMORY_MB} MB (its CPU share), warm invocations of each batch size, events of {EVENT_BYTES} B, unbatched subscription; deliver's Lambda cost (duration and request) at arm64 list prices"
    );
    for delay_ms in [0, 50] {
        let (hook, counts) =
            sink::serve("127.0.0.1:0".parse()?, Duration::from_millis(delay_ms)).await?;
        let topic = format!("bench-{delay_ms}");
        subscribed_topic(&store, &topic, hook).await?;
        for (per_message, sizes) in CASES {
            let mut rows = Vec::new();
            for &messages in sizes {
                let events_in_batch = messages * per_message;
                let batch = batch_of(
                    &resources,
                    &store,
                    &topic,
                    events_in_batch,
                    per_message,
                    EVENT_BYTES,
                )
                .await?;
                let payload = serde_json::to_vec(&batch.batch)?.len();
                let billed_ms = warm_billed_ms(
                    &resources,
                    MEMORY_MB,
                    &batch.batch,
                    events_in_batch,
                    &counts,
                )
                .await?;
                let cost = cost_per_million(billed_ms, MEMORY_MB, events_in_batch);
                rows.push((messages, payload, billed_ms, cost));
            }
            let at_default = rows
                .iter()
                .find(|(m, ..)| *m == DEFAULT_BATCH)
                .map_or(f64::NAN, |(.., cost)| *cost);
            let shape = if per_message == 1 {
                "one event per message".to_string()
            } else {
                format!("{per_message} events per message")
            };
            for (messages, payload, billed_ms, cost) in rows {
                let needs = if messages > DEFAULT_BATCH {
                    ", needs a batching window >= 1 s (G3)"
                } else {
                    ""
                };
                let too_big = if payload > LAMBDA_PAYLOAD_BYTES {
                    ", over Lambda's 6 MB payload"
                } else {
                    ""
                };
                println!(
                    "  subscriber {delay_ms:>2} ms, {shape}, {messages:>4} messages ({:.2} MB): {billed_ms:>6.0} ms per invocation; deliver ${cost:.4} per million events = {:.2}x batch size {DEFAULT_BATCH}{needs}{too_big}",
                    payload as f64 / 1_048_576.0,
                    cost / at_default
                );
            }
        }
    }
    Ok(())
}
