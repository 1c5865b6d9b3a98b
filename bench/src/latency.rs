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
//!
//! With `--held N` (#34 item 1: a sick endpoint never slows a healthy one), the same is
//! measured twice in one run, after a first phase that warms up: alone, then while N events
//! published to another topic are held for a delayed endpoint (a sink answering 503), and the
//! ratios are printed. With `--replay N` (#35: a replay never takes the delivery path from live
//! traffic), the same, while a replay of N archived events of another topic runs at
//! `--replay-rate` to a subscriber of its own.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;

use crate::e2e::{Runner, TopicSettings, publish};
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

/// Where the figures of one phase came from.
struct Phase {
    /// Publish to arrival, milliseconds, the warm-up left out.
    end_to_end: Vec<f64>,
    /// Publish round trips, milliseconds, the warm-up left out.
    ingest: Vec<f64>,
}

impl Phase {
    /// Prints the phase's figures as one line; answers its p50 and p99.
    fn print(&mut self, name: &str) -> (f64, f64) {
        let (p50, p99, i50, i99) = self.quantiles();
        println!(
            "  publish -> first attempt, {name:<20} p50 {p50:.1} ms, p99 {p99:.1} ms (publish answered {i50:.1} / {i99:.1} ms); {} events",
            self.end_to_end.len()
        );
        (p50, p99)
    }

    fn quantiles(&mut self) -> (f64, f64, f64, f64) {
        (
            quantile(&mut self.end_to_end, 0.5),
            quantile(&mut self.end_to_end, 0.99),
            quantile(&mut self.ingest, 0.5),
            quantile(&mut self.ingest, 0.99),
        )
    }
}

/// What the healthy subscription is measured beside, after it was measured alone.
#[derive(Debug, Clone, Copy)]
pub enum Neighbour {
    /// This many events of another topic held for a delayed endpoint (#34 item 1).
    Held(usize),
    /// A replay of this many archived events of another topic, at `rate` a second (#35).
    Replay { events: usize, rate: u32 },
}

/// Runs `seconds` of publishing at `rate` events per second and prints the figures; with a
/// `neighbour`, measures the same again beside it.
pub async fn run(
    binary: PathBuf,
    prefix: String,
    rate: usize,
    seconds: u64,
    aws_endpoint: &str,
    neighbour: Option<Neighbour>,
) -> anyhow::Result<()> {
    if Duration::from_secs(seconds) <= WARM_UP {
        bail!(
            "--seconds {seconds}: give more than the {} s left out at the start",
            WARM_UP.as_secs()
        );
    }
    let (hook, counts) = sink::serve("127.0.0.1:0".parse()?, Duration::ZERO).await?;
    let (runner, key) =
        // Not archived: the latency measured is delivery's (an archived topic adds a Firehose
        // call to each publish, which moto serves slowly; `e2e` prices it).
        Runner::with_subscription(
            binary,
            prefix,
            aws_endpoint,
            Default::default(),
            None,
            hook,
            TopicSettings::default(),
        )
            .await?;
    let publisher = Publisher {
        client: reqwest::Client::new(),
        url: runner.publish_url(),
        key,
        rate,
        seconds,
    };
    if let Some(neighbour) = neighbour {
        // A first phase, not counted, warms the emulator's new queues and the connections; the
        // second and third are the same case twice, whose ratio is this run's noise.
        publisher.measure(&counts, 0).await?;
        let mut first = publisher.measure(&counts, 1).await?;
        let mut alone = publisher.measure(&counts, 2).await?;
        let (what, setting) = match neighbour {
            Neighbour::Held(held) => {
                let backlog = hold_backlog(&runner, &publisher.client, held).await?;
                (
                    "the backlog",
                    format!(
                        "{held} events of another topic are held for a delayed endpoint ({backlog})"
                    ),
                )
            }
            Neighbour::Replay { events, rate } => (
                "the replay",
                replay_beside(&runner, &publisher.client, events, rate).await?,
            ),
        };
        let mut beside = publisher.measure(&counts, 3).await?;
        let after = match neighbour {
            Neighbour::Replay { events, .. } => replay_progress(&runner, events)?,
            Neighbour::Held(_) => String::new(),
        };
        runner.stop()?;
        println!(
            "neighbour of {what}: {rate} events/s for {seconds} s in arrays of {PER_PUBLISH} to a healthy unbatched subscriber, alone twice, then while {setting}; the first {} s of each left out{after}",
            WARM_UP.as_secs()
        );
        let first = first.print("alone");
        let alone = alone.print("alone again");
        let beside = beside.print(&format!("beside {what}"));
        println!(
            "  alone again / alone (the noise): p50 {:.2}x, p99 {:.2}x; beside {what} / alone again: p50 {:.2}x, p99 {:.2}x (goal <= 1.2x)",
            alone.0 / first.0.max(f64::MIN_POSITIVE),
            alone.1 / first.1.max(f64::MIN_POSITIVE),
            beside.0 / alone.0.max(f64::MIN_POSITIVE),
            beside.1 / alone.1.max(f64::MIN_POSITIVE),
        );
        return Ok(());
    }
    let mut alone = publisher.measure(&counts, 0).await?;
    let report = runner.stop()?;
    let (p50, p99, ingest50, ingest99) = alone.quantiles();
    let queue = &report["latency"]["queueMs"];
    let queue50 = queue["p50"].as_f64().unwrap_or(0.0);
    let queue99 = queue["p99"].as_f64().unwrap_or(0.0);
    println!(
        "latency: {rate} events/s for {seconds} s in arrays of {PER_PUBLISH} (a publish every {:.0} ms), unbatched subscriber answering at once; the first {} s left out",
        publisher.every().as_secs_f64() * 1000.0,
        WARM_UP.as_secs()
    );
    println!(
        "  publish -> first attempt at the subscriber: p50 {p50:.1} ms (goal <= 20), p99 {p99:.1} ms (goal <= 50); {} events",
        alone.end_to_end.len()
    );
    println!(
        "  where it goes (p50 / p99): ingest, publish answered {ingest50:.1} / {ingest99:.1} ms; in the queue and waiting for a poll {queue50:.0} / {queue99:.0} ms (SQS SentTimestamp, whole ms); deliver and send, the rest of the p50: {:.1} ms",
        (p50 - ingest50 - queue50).max(0.0)
    );
    Ok(())
}

/// Publishes stamped events to the measured topic at a steady rate.
struct Publisher {
    client: reqwest::Client,
    url: String,
    key: String,
    rate: usize,
    seconds: u64,
}

impl Publisher {
    fn every(&self) -> Duration {
        Duration::from_secs_f64(PER_PUBLISH as f64 / self.rate as f64)
    }

    /// One phase: publishes for `seconds` without waiting for earlier publishes, waits for
    /// every event at the sink, and answers what this phase measured (`phase` keeps the ids of
    /// phases apart).
    async fn measure(&self, counts: &sink::Counts, phase: usize) -> anyhow::Result<Phase> {
        let publishes = (self.rate * self.seconds as usize).div_ceil(PER_PUBLISH);
        let seen_before = counts.latencies_ms.lock().map(|l| l.len()).unwrap_or(0);
        let events_before = counts.events.load(Ordering::Relaxed);
        let round_trips: Arc<Mutex<Vec<(Duration, f64)>>> = Arc::default();
        let mut tick = tokio::time::interval(self.every());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let start = Instant::now();
        let mut sent = Vec::with_capacity(publishes);
        for p in 0..publishes {
            tick.tick().await;
            let first = (phase * publishes + p) * PER_PUBLISH;
            let parts: Vec<String> = (first..first + PER_PUBLISH).map(event).collect();
            let body = format!("[{}]", parts.join(","));
            let (client, url, key, round_trips) = (
                self.client.clone(),
                self.url.clone(),
                self.key.clone(),
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
        let expected = events_before + publishes * PER_PUBLISH;
        let deadline = Instant::now() + Duration::from_secs(120);
        while counts.events.load(Ordering::Relaxed) < expected {
            if Instant::now() > deadline {
                bail!(
                    "{} of {} events delivered 2 minutes after the last publish",
                    counts.events.load(Ordering::Relaxed) - events_before,
                    publishes * PER_PUBLISH
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let skip = (self.rate as f64 * WARM_UP.as_secs_f64()) as usize;
        // Arrival order is near publish order; the first second's worth is left out.
        let end_to_end = counts
            .latencies_ms
            .lock()
            .map(|l| l.iter().skip(seen_before + skip).copied().collect())
            .unwrap_or_default();
        let ingest = round_trips
            .lock()
            .map(|r| {
                r.iter()
                    .filter(|(at, _)| *at >= WARM_UP)
                    .map(|(_, t)| *t)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Phase { end_to_end, ingest })
    }
}

/// Events per publish to the sick topic (the largest array Event Grid takes is 1 MB; these are
/// small).
const HELD_PER_PUBLISH: usize = 100;

/// The replayed topic and the replay's name.
const REPLAYED: &str = "replayed";

/// Archives `events` events of topic `replayed` (no subscription yet: nothing is delivered),
/// subscribes a sink of its own, and starts a replay of them at `rate` a second; waits until
/// it sends (its window sealed: 20 s locally). Answers what runs.
async fn replay_beside(
    runner: &Runner,
    client: &reqwest::Client,
    events: usize,
    rate: u32,
) -> anyhow::Result<String> {
    let key = runner.topic(REPLAYED, TopicSettings::archived(1))?;
    let url = runner.topic_url(REPLAYED);
    let start = chrono::Utc::now() - chrono::Duration::seconds(1);
    publish_many(client, (&url, &key), "archived", events).await?;
    let end = chrono::Utc::now();
    let (hook, _replayed) = sink::serve("127.0.0.1:0".parse()?, Duration::ZERO).await?;
    runner.subscription(REPLAYED, "sink", &hook, None).await?;
    let time =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (start, end, rate_text) = (time(start), time(end), rate.to_string());
    runner.cli(&[
        "replay",
        "start",
        "--topic-name",
        REPLAYED,
        "--name",
        REPLAYED,
        "--start-time",
        &start,
        "--end-time",
        &end,
        "--rate",
        &rate_text,
    ])?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let shown = replay_shown(runner)?;
        if shown["eventsSent"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("the replay did not start within 2 minutes: {shown}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(format!(
        "a replay of {events} archived events of another topic runs at {rate} events/s to a subscriber of its own"
    ))
}

fn replay_shown(runner: &Runner) -> anyhow::Result<serde_json::Value> {
    runner.cli(&[
        "replay",
        "show",
        "--topic-name",
        REPLAYED,
        "--name",
        REPLAYED,
    ])
}

/// How far the replay got by the end of the measure; it must still have been running.
fn replay_progress(runner: &Runner, events: usize) -> anyhow::Result<String> {
    let sent = replay_shown(runner)?["eventsSent"].as_u64().unwrap_or(0);
    if sent >= events as u64 {
        bail!(
            "the replay ended before the measure did ({sent} of {events} sent): give it more events"
        );
    }
    Ok(format!(
        " (the replay had sent {sent} of {events} when the measure ended)"
    ))
}
/// The least wait before a 503 is retried (R2), and a little more: the sick endpoint's first
/// failures are retried (and then held) after this.
const FIRST_RETRY: Duration = Duration::from_secs(32);

/// Creates topic `sick` with a subscription whose endpoint answers 503 and holds `held` events
/// for it, so that nothing of the backlog moves while the neighbour is measured:
/// 1. one array of 100 events fails at once (delivered unbatched, in parallel), which delays
///    the endpoint for the longest step of the ladder (D1: 4 hours after 100 failures); their
///    retries come back after 30 s and are held;
/// 2. then `held` events are published: each is received once and held until the delay ends
///    (in 15-minute hops, the longest SQS delay), none sent.
///
/// Answers how the delivery queue holds the backlog.
async fn hold_backlog(
    runner: &Runner,
    client: &reqwest::Client,
    held: usize,
) -> anyhow::Result<String> {
    let (hook, sick) = sink::serve_answering(
        "127.0.0.1:0".parse()?,
        Duration::ZERO,
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
    )
    .await?;
    let key = runner
        .topic_with_subscription(("sick", TopicSettings::default()), "sick", &hook, None)
        .await?;
    let url = runner.topic_url("sick");
    let queue = DeliveryQueue::of(runner).await?;

    publish(client, &url, &key, held_events("fail", HELD_PER_PUBLISH)).await?;
    let failed_at = Instant::now();
    queue.wait_until_quiet().await?;
    tokio::time::sleep(FIRST_RETRY.saturating_sub(failed_at.elapsed())).await;
    queue.wait_until_quiet().await?;
    let failures = sick.requests.load(Ordering::Relaxed);

    publish_many(client, (&url, &key), "held", held).await?;
    let delayed = queue.wait_until_quiet().await?;
    let sent_since = sick.requests.load(Ordering::Relaxed) - failures;
    if sent_since > 0 {
        bail!("{sent_since} requests reached the delayed endpoint while its backlog was published");
    }
    Ok(format!(
        "{delayed} delayed messages on the delivery queue; {failures} requests failed before the endpoint was delayed, none since"
    ))
}

/// Publishes `events` small events to `url` in arrays of [`HELD_PER_PUBLISH`], eight
/// publishes at a time, with ids starting `prefix`.
async fn publish_many(
    client: &reqwest::Client,
    (url, key): (&str, &str),
    prefix: &str,
    events: usize,
) -> anyhow::Result<()> {
    let bodies = (0..events.div_ceil(HELD_PER_PUBLISH)).map(|p| {
        held_events(
            &format!("{prefix}-{p}"),
            HELD_PER_PUBLISH.min(events - p * HELD_PER_PUBLISH),
        )
    });
    futures::stream::iter(bodies)
        .map(|body| publish(client, url, key, body))
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// `n` small events in one array, with ids starting `prefix`.
fn held_events(prefix: &str, n: usize) -> String {
    let parts: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"id":"{prefix}-{i}","subject":"/bench/held","eventType":"Bench.Held","eventTime":"2026-11-25T00:00:00Z","dataVersion":"1","data":{{"order":{i}}}}}"#
            )
        })
        .collect();
    format!("[{}]", parts.join(","))
}

/// The runner's delivery queue, watched through SQS's approximate counts.
struct DeliveryQueue {
    sqs: aws_sdk_sqs::Client,
    url: String,
}

impl DeliveryQueue {
    async fn of(runner: &Runner) -> anyhow::Result<Self> {
        let sdk = gridrelay_e2e::sdk_config().await;
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let url = sqs
            .get_queue_url()
            .queue_name(&runner.names().delivery_queue)
            .send()
            .await?
            .queue_url
            .context("no delivery queue URL")?;
        Ok(Self { sqs, url })
    }

    /// Waits until no message is visible or in flight (twice in a row, a second apart: the
    /// counts are approximate); answers how many are delayed.
    async fn wait_until_quiet(&self) -> anyhow::Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut quiet_before = false;
        loop {
            let c = gridrelay_e2e::queue_counts(&self.sqs, &self.url).await?;
            let quiet = c.visible == 0 && c.in_flight == 0;
            if quiet && quiet_before {
                return Ok(c.delayed);
            }
            quiet_before = quiet;
            if Instant::now() > deadline {
                bail!(
                    "the delivery queue did not settle within 5 minutes: {} visible, {} in flight, {} delayed",
                    c.visible,
                    c.in_flight,
                    c.delayed
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
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
