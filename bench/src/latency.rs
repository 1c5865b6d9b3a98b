//! Publish to first attempt at a steady rate (issue #9: 1,000 events/s, p50 ≤ 20 ms and p99 ≤
//! 50 ms locally), with where the time goes. `gridrelay local` on the AWS API at
//! `AWS_ENDPOINT_URL` (directly, not through the call-counting proxy); a publisher sends an array of 10 events every 10 ms, each event
//! stamped with its send time (`data.sentAtMicros`), without waiting for earlier publishes;
//! the sink (answering at once) takes each event's arrival minus its stamp. The breakdown:
//! - ingest: the publish request until its answer (G1: the events are enqueued by then);
//! - queue and poll: a message's SQS `SentTimestamp` to the start of the invocation that
//!   received it (the runner's stop report, `latency.queueMs`);
//! - deliver and send: the rest (of the median).
//!
//! The first second is left out of the figures: it holds the connections' and the endpoint
//! limit's start.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::e2e::{Runner, publish};
use crate::sink;

/// Events per publish.
const PER_PUBLISH: usize = 10;
/// Time left out at the start.
const WARM_UP: Duration = Duration::from_secs(1);

/// The value below which `q` of `values` lie (nearest rank); 0 for none.
fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn event(i: usize) -> String {
    format!(
        r#"{{"id":"lat-{i}","subject":"/bench/{i}","eventType":"Bench.Event","eventTime":"2026-11-25T00:00:00Z","dataVersion":"1","data":{{"sentAtMicros":{}}}}}"#,
        sink::now_micros()
    )
}

/// Runs `seconds` of publishing at `rate` events per second and prints the figures.
pub async fn run(
    binary: PathBuf,
    prefix: String,
    rate: usize,
    seconds: u64,
    aws_endpoint: &str,
) -> anyhow::Result<()> {
    if Duration::from_secs(seconds) <= WARM_UP {
        bail!(
            "--seconds {seconds}: give more than the {} s left out at the start",
            WARM_UP.as_secs()
        );
    }
    let (hook, counts) = sink::serve("127.0.0.1:0".parse()?, Duration::ZERO).await?;
    let (runner, key) =
        Runner::with_subscription(binary, prefix, aws_endpoint, None, None, hook).await?;
    let url = runner.publish_url();
    let client = reqwest::Client::new();
    let publishes = (rate * seconds as usize).div_ceil(PER_PUBLISH);
    let every = Duration::from_secs_f64(PER_PUBLISH as f64 / rate as f64);
    let round_trips: Arc<Mutex<Vec<(Duration, f64)>>> = Arc::default();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let start = Instant::now();
    let mut sent = Vec::with_capacity(publishes);
    for p in 0..publishes {
        tick.tick().await;
        let parts: Vec<String> = (0..PER_PUBLISH)
            .map(|i| event(p * PER_PUBLISH + i))
            .collect();
        let body = format!("[{}]", parts.join(","));
        let (client, url, key, round_trips) = (
            client.clone(),
            url.clone(),
            key.clone(),
            Arc::clone(&round_trips),
        );
        sent.push(tokio::spawn(async move {
            let at = start.elapsed();
            let began = Instant::now();
            publish(&client, &url, &key, body).await?;
            let took = began.elapsed().as_secs_f64() * 1000.0;
            if let Ok(mut r) = round_trips.lock() {
                r.push((at, took));
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for s in sent {
        s.await??;
    }
    let expected = publishes * PER_PUBLISH;
    let deadline = Instant::now() + Duration::from_secs(120);
    while counts.events.load(Ordering::Relaxed) < expected {
        if Instant::now() > deadline {
            bail!(
                "{} of {expected} events delivered 2 minutes after the last publish",
                counts.events.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = runner.stop()?;

    let skip = (rate as f64 * WARM_UP.as_secs_f64()) as usize;
    let mut end_to_end: Vec<f64> = counts
        .latencies_ms
        .lock()
        .map(|l| l.clone())
        .unwrap_or_default();
    // Arrival order is near publish order; the first second's worth is left out.
    let mut end_to_end: Vec<f64> = end_to_end.drain(skip.min(end_to_end.len())..).collect();
    let mut ingest: Vec<f64> = round_trips
        .lock()
        .map(|r| {
            r.iter()
                .filter(|(at, _)| *at >= WARM_UP)
                .map(|(_, t)| *t)
                .collect()
        })
        .unwrap_or_default();
    let (p50, p99) = (
        quantile(&mut end_to_end, 0.5),
        quantile(&mut end_to_end, 0.99),
    );
    let (ingest50, ingest99) = (quantile(&mut ingest, 0.5), quantile(&mut ingest, 0.99));
    let queue = &report["latency"]["queueMs"];
    let queue50 = queue["p50"].as_f64().unwrap_or(0.0);
    let queue99 = queue["p99"].as_f64().unwrap_or(0.0);
    println!(
        "latency: {rate} events/s for {seconds} s in arrays of {PER_PUBLISH} (a publish every {:.0} ms), unbatched subscriber answering at once; the first {} s left out",
        every.as_secs_f64() * 1000.0,
        WARM_UP.as_secs()
    );
    println!(
        "  publish -> first attempt at the subscriber: p50 {p50:.1} ms (goal <= 20), p99 {p99:.1} ms (goal <= 50); {} events",
        end_to_end.len()
    );
    println!(
        "  where it goes (p50 / p99): ingest, publish answered {ingest50:.1} / {ingest99:.1} ms; in the queue and waiting for a poll {queue50:.0} / {queue99:.0} ms (SQS SentTimestamp, whole ms); deliver and send, the rest of the p50: {:.1} ms",
        (p50 - ingest50 - queue50).max(0.0)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.5), 50.0);
        assert_eq!(quantile(&mut v, 0.99), 99.0);
        assert_eq!(quantile(&mut [], 0.5), 0.0);
    }
}
