//! `make bench`'s measurements beyond the per-event CPU work (`shared/benches/hot_path.rs`):
//!
//! - `engine`: the deliver handler over in-memory ports against a loopback sink, beside wrk's
//!   ceiling on the same sink: events/s as a ratio of the ceiling (goal ≥ 0.6 unbatched).
//! - `e2e`: the local stack (moto at `AWS_ENDPOINT_URL`, `gridrelay local`) with subscribers
//!   that answer at once and after 50 ms: events/s, the runner's CPU and AWS calls per event
//!   (goal: the 50 ms case within 20 % of the 0 ms case); then the cost per million events on
//!   AWS, from counted calls and billed time at list prices (goal: <= $0.10 at 50 ms, arrays
//!   of 100, batching off).
//! - `latency`: publish to first attempt at 1,000 events/s, and where the time goes.
//! - `cold-start`: each bootstrap's init time, size, and memory for a full batch.
//! - `memory-size` and `batch-size`: `deliver`'s billed time per warm invocation under the CPU
//!   share Lambda gives a memory size, for each size and for each event-source batch size: what
//!   the template's defaults were chosen by.
//! - `console`: the operator console's overview with 1 and with 500 subscriptions (goal:
//!   under a second).
//! - `sink`: the subscriber they use, in a process of its own.
//!
//! Figures are printed beside their baselines from the same run: these machines are noisy, so
//! only ratios carry from one run to another.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use gridrelay_local::FrontDoor;
use gridrelay_local::batching::EventSourceBatching;
use serde_json::value::RawValue;

mod aws_calls;
mod batch_size;
mod cold_start;
mod console;
mod cost;
mod e2e;
mod engine;
mod latency;
mod memory_size;
mod ordered;
mod sink;

#[derive(Parser)]
#[command(name = "gridrelay-bench", about = "gridrelay's delivery benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// The deliver engine against a loopback sink, beside wrk's ceiling.
    Engine {
        #[arg(long, default_value_t = 50_000)]
        events: usize,
        #[arg(long, default_value_t = 1_000)]
        event_bytes: usize,
    },
    /// The local stack end to end (needs AWS_ENDPOINT_URL and a built `gridrelay`).
    E2e {
        #[arg(long, default_value_t = 100_000)]
        events: usize,
        /// Events in each case of the cost table.
        #[arg(long, default_value_t = 20_000)]
        cost_events: usize,
        #[arg(long, default_value_t = 1_000)]
        event_bytes: usize,
        /// The `gridrelay` binary (default: beside this one).
        #[arg(long)]
        gridrelay: Option<PathBuf>,
        /// Also print each case's sink, every 100 ms: requests in flight, events delivered.
        #[arg(long)]
        timeline: bool,
        /// Only the first part (rates), not the cost table.
        #[arg(long)]
        no_cost: bool,
        /// Which rows of the cost table: all of them, or one group (to measure it again).
        #[arg(long, value_enum, default_value_t = CostRows::All)]
        cost_rows: CostRows,
    },
    /// Publish to first attempt at a steady rate, with where the time goes (needs
    /// AWS_ENDPOINT_URL and a built `gridrelay`).
    Latency {
        #[arg(long, default_value_t = 1_000)]
        rate: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Measure again while this many events are held for a delayed endpoint of another
        /// topic, and print both and their ratio.
        #[arg(long, default_value_t = 0)]
        held: usize,
        /// Measure again while a replay (#35) of this many archived events of another topic
        /// runs at --replay-rate, and print both and their ratio.
        #[arg(long, default_value_t = 0)]
        replay: usize,
        /// The replay's rate, events a second.
        #[arg(long, default_value_t = 1_000)]
        replay_rate: u32,
        /// The `gridrelay` binary (default: beside this one).
        #[arg(long)]
        gridrelay: Option<PathBuf>,
    },
    /// Ordered delivery (O1) beside unordered: one key, many keys, and a large publish (needs
    /// AWS_ENDPOINT_URL and a built `gridrelay`).
    Ordered {
        /// Events of the unordered and the many-keys cases.
        #[arg(long, default_value_t = 2_000)]
        events: usize,
        /// Events of the one-key case (one round trip each).
        #[arg(long, default_value_t = 300)]
        one_key_events: usize,
        /// Keys of the many-keys case.
        #[arg(long, default_value_t = 100)]
        keys: usize,
        /// Events of the large publish (of 500 B each).
        #[arg(long, default_value_t = 1_000)]
        large_publish: usize,
        #[arg(long, default_value_t = 1_000)]
        event_bytes: usize,
        /// The `gridrelay` binary (default: beside this one).
        #[arg(long)]
        gridrelay: Option<PathBuf>,
    },
    /// Each function's bootstrap: init time, size, and deliver's memory handling one full
    /// batch (needs AWS_ENDPOINT_URL and the bootstraps from infra/deploy/build.sh).
    ColdStart {
        #[arg(long, default_value_t = 5_000)]
        events: usize,
    },
    /// Which memory size deliver costs least at: warm full batches under the CPU share Lambda
    /// gives each size (needs root, cgroup v1, AWS_ENDPOINT_URL and infra/deploy/build.sh).
    MemorySize {
        #[arg(long, default_value_t = 5_000)]
        events: usize,
    },
    /// Which event-source batch size deliver costs least at: warm invocations of 1 to 1,000
    /// messages under a 256 MB function's CPU share (needs root, cgroup v1, AWS_ENDPOINT_URL and
    /// infra/deploy/build.sh).
    BatchSize,
    /// The operator console's overview (#36): its time with one subscription and with
    /// `--subscriptions`, each with an hour of journal (needs AWS_ENDPOINT_URL and a built
    /// `gridrelay`).
    Console {
        #[arg(long, default_value_t = 500)]
        subscriptions: usize,
        /// The `gridrelay` binary (default: beside this one).
        #[arg(long)]
        gridrelay: Option<PathBuf>,
    },
    /// A counting subscriber; prints its hook URL, then serves until killed.
    Sink {
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Bench::Engine {
            events,
            event_bytes,
        } => engine_bench(events, event_bytes).await,
        Bench::E2e {
            events,
            cost_events,
            event_bytes,
            gridrelay,
            timeline,
            no_cost,
            cost_rows,
        } => {
            let binary = gridrelay_binary(gridrelay)?;
            let shown = E2eShown {
                timeline,
                no_cost,
                cost_rows,
            };
            e2e_bench(binary, events, cost_events, event_bytes, shown).await
        }
        Bench::Ordered {
            events,
            one_key_events,
            keys,
            large_publish,
            event_bytes,
            gridrelay,
        } => {
            let binary = gridrelay_binary(gridrelay)?;
            let routes = aws_calls::routes_from(|name| std::env::var(name).ok());
            let aws = aws_calls::AwsCallCounter::start(&aws_endpoint()?, routes).await?;
            let sizes = ordered::Sizes {
                events,
                one_key_events,
                keys,
                large_publish,
                event_bytes,
            };
            ordered::run(binary, sizes, &aws).await
        }
        Bench::ColdStart { events } => cold_start::run(events).await,
        Bench::MemorySize { events } => memory_size::run(events).await,
        Bench::BatchSize => batch_size::run().await,
        Bench::Console {
            subscriptions,
            gridrelay,
        } => console::run(&gridrelay_binary(gridrelay)?, subscriptions).await,
        Bench::Latency {
            rate,
            seconds,
            held,
            replay,
            replay_rate,
            gridrelay,
        } => {
            let binary = gridrelay_binary(gridrelay)?;
            let aws_endpoint = aws_endpoint()?;
            let id = uuid::Uuid::new_v4().simple().to_string();
            let neighbour = match (held, replay) {
                (0, 0) => None,
                (held, 0) => Some(latency::Neighbour::Held(held)),
                (0, events) => Some(latency::Neighbour::Replay {
                    events,
                    rate: replay_rate,
                }),
                _ => anyhow::bail!("--held and --replay: measure one neighbour at a time"),
            };
            latency::run(
                binary,
                format!("bench-lat-{}", &id[..8]),
                rate,
                seconds,
                &aws_endpoint,
                neighbour,
            )
            .await
        }
        Bench::Sink { delay_ms } => {
            let (url, _) =
                sink::serve("127.0.0.1:0".parse()?, Duration::from_millis(delay_ms)).await?;
            println!("{url}");
            std::future::pending::<()>().await;
            Ok(())
        }
    }
}

/// The AWS API the local stack runs against (moto by default).
fn aws_endpoint() -> anyhow::Result<String> {
    std::env::var("AWS_ENDPOINT_URL").context("set AWS_ENDPOINT_URL (infra/local/moto.sh env)")
}

/// The `gridrelay` binary given, or the one beside this benchmark.
fn gridrelay_binary(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match given {
        Some(b) => Ok(b),
        None => Ok(std::env::current_exe()?.with_file_name("gridrelay")),
    }
}

async fn engine_bench(events: usize, event_bytes: usize) -> anyhow::Result<()> {
    let sink = engine::SinkProcess::start(0)?;
    let ceiling = engine::wrk_ceiling(&sink.url, event_bytes, 256)?;
    println!("engine: {events} events of {event_bytes} B, sink answering at once, 2 cores shared");
    println!("  wrk ceiling (1 event per request, 256 connections): {ceiling:>9.0} requests/s");
    let url = sink.url.clone();
    let client = engine::on_function_runtime(move || async move {
        engine::client_ceiling(&url, events, event_bytes, 256).await
    })
    .await?;
    println!(
        "  gridrelay's HTTP sender alone, 256 in flight:      {client:>9.0} requests/s = {:.2} of the ceiling",
        client / ceiling
    );
    for batch in [None, Some(100)] {
        let url = sink.url.clone();
        let run = engine::on_function_runtime(move || async move {
            engine::deliver_all(&url, events, event_bytes, batch, true).await
        })
        .await?;
        let rate = run.events_per_second();
        let label = match batch {
            None => "unbatched".to_string(),
            Some(n) => format!("batches of {n}"),
        };
        let goal = if batch.is_none() {
            "  (goal >= 0.60)"
        } else {
            ""
        };
        println!(
            "  deliver engine, {label:<15} {rate:>9.0} events/s = {:.2} of the ceiling{goal}; {:.3} ms CPU/event; {} invocations; limit at the end {}",
            rate / ceiling,
            run.cpu.as_secs_f64() * 1000.0 / events as f64,
            run.invocations,
            run.limit.map_or("-".to_string(), |l| l.to_string()),
        );
    }
    journal_cpu(&sink.url, events, event_bytes).await
}

/// #35: `deliver`'s CPU per event with the delivery journal on beside it off, unbatched (the
/// most entries per event), in turns so drift in the machine falls on both alike.
async fn journal_cpu(sink: &str, events: usize, event_bytes: usize) -> anyhow::Result<()> {
    const TURNS: usize = 3;
    let mut cpu = [Duration::ZERO; 2];
    for _ in 0..TURNS {
        for (i, journal) in [false, true].into_iter().enumerate() {
            let url = sink.to_string();
            let run = engine::on_function_runtime(move || async move {
                engine::deliver_all(&url, events, event_bytes, None, journal).await
            })
            .await?;
            cpu[i] += run.cpu;
        }
    }
    let per_event = |d: Duration| d.as_secs_f64() * 1000.0 / (events * TURNS) as f64;
    println!(
        "  deliver engine, unbatched, journal off {:.4} ms CPU/event, on {:.4} ms: {:.3}x (goal <= 1.10; {TURNS} turns each)",
        per_event(cpu[0]),
        per_event(cpu[1]),
        cpu[1].as_secs_f64() / cpu[0].as_secs_f64(),
    );
    Ok(())
}

/// What `e2e` prints beyond the rates.
struct E2eShown {
    timeline: bool,
    no_cost: bool,
    cost_rows: CostRows,
}

/// The groups of the cost table's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CostRows {
    All,
    /// Topics without an archive, the event source's default: both front doors, one event
    /// and arrays of 100, batching off and 100.
    Default,
    /// Topics archived for 7 days.
    Archived,
    /// One event behind the function URL with a batching window.
    Windowed,
    /// Topics with a deduplication window (P1); alone, beside the same rows without one.
    Deduped,
}

/// One row of the cost table.
#[derive(Debug, Clone, Copy)]
struct CostCase {
    per_publish: usize,
    front_door: FrontDoor,
    batch: Option<u32>,
    delay_ms: u64,
    archived: bool,
    deduped: bool,
    event_source: EventSourceBatching,
}

impl CostCase {
    /// A topic as created by default: no archive, no deduplication; the event source's
    /// defaults.
    fn plain(per_publish: usize, front_door: FrontDoor, batch: Option<u32>, delay_ms: u64) -> Self {
        Self {
            per_publish,
            front_door,
            batch,
            delay_ms,
            archived: false,
            deduped: false,
            event_source: EventSourceBatching::default(),
        }
    }
}

impl CostRows {
    fn take(self, group: CostRows) -> bool {
        self == CostRows::All || self == group
    }
}

async fn e2e_bench(
    binary: PathBuf,
    events: usize,
    cost_events: usize,
    event_bytes: usize,
    shown: E2eShown,
) -> anyhow::Result<()> {
    let aws_endpoint = aws_endpoint()?;
    let routes = aws_calls::routes_from(|name| std::env::var(name).ok());
    let aws = aws_calls::AwsCallCounter::start(&aws_endpoint, routes.clone()).await?;
    let elsewhere: String = routes
        .iter()
        .map(|(service, url)| format!(", {service} on {url}"))
        .collect();
    println!(
        "end to end: gridrelay local on {aws_endpoint}{elsewhere} (AWS calls counted on the way), {events} events of {event_bytes} B published in arrays of 500"
    );
    let mut at_once = std::collections::HashMap::new();
    let mut cases = Vec::new();
    for batch in [None, Some(100)] {
        for delay_ms in [0, 50] {
            cases.push((batch, delay_ms, None));
        }
    }
    // The baseline of #9: the runner's 4 concurrent invocations sent at most 32 requests at
    // once each, whoever the endpoint: 128 in all, here as each of its 4 instances' total of
    // 32 that the endpoint may all take (its adaptive limit still starts at 16 and grows).
    cases.push((None, 50, Some(32)));
    let mut adaptive_50ms = None;
    for (batch, delay_ms, max_in_flight) in cases {
        let case = e2e::Case {
            events,
            event_bytes,
            per_publish: 500,
            delay_ms,
            max_events_per_batch: batch,
            max_in_flight,
            front_door: FrontDoor::HttpApi,
            // As these rates were measured since #35: arrays of 500 make the archive's one
            // call per publish a small share of ingest's work.
            archived: true,
            deduped: false,
            event_source: EventSourceBatching::default(),
            ordered_keys: None,
        };
        let run = e2e::run(binary.clone(), prefix(&case), case, &aws).await?;
        let rate = events as f64 / run.elapsed.as_secs_f64();
        let label = match (batch, max_in_flight) {
            (_, Some(n)) => format!("{n} in flight"),
            (None, None) => "unbatched".to_string(),
            (Some(n), None) => format!("batches of {n}"),
        };
        let versus = match (max_in_flight, at_once.get(&batch), adaptive_50ms) {
            (Some(_), _, Some(adaptive)) => format!(
                " (4 instances x 32, as before #9; each adaptive limit still grows to it); adaptive = {:.1}x this (goal >= 3)",
                adaptive / rate
            ),
            (None, Some(base), _) => {
                format!(" = {:.2} of the 0 ms case (goal >= 0.80)", rate / base)
            }
            _ => String::new(),
        };
        if delay_ms == 0 {
            at_once.insert(batch, rate);
        } else if batch.is_none() && max_in_flight.is_none() {
            adaptive_50ms = Some(rate);
        }
        println!(
            "  {label:<15} subscriber {delay_ms:>2} ms: {rate:>7.0} events/s{versus}; {:.3} ms gridrelay CPU/event; {} requests; {:.4} AWS calls/event",
            run.cpu.as_secs_f64() * 1000.0 / events as f64,
            run.requests,
            calls_per_event(&run),
        );
        let (during, after) = run.rates_by_phase();
        let after = after.map_or("-".to_string(), |r| format!("{r:.0}"));
        println!(
            "  {:<15} published in {:.1} s ({during:.0} events/s delivered meanwhile), the rest delivered in {:.1} s more ({after} events/s); {:.0} requests in flight at the sink on average",
            "",
            run.published.as_secs_f64(),
            (run.elapsed.saturating_sub(run.published)).as_secs_f64(),
            run.mean_in_flight(),
        );
        if shown.timeline {
            for (op, c) in &run.calls {
                println!(
                    "    {op}: {} calls, {:.1} ms on average, {:.1} ms at most",
                    c.calls,
                    c.micros as f64 / 1000.0 / c.calls.max(1) as f64,
                    c.max_micros as f64 / 1000.0
                );
            }
            for s in &run.timeline {
                println!(
                    "    {:>6.1} s {:>5} in flight {:>8} delivered",
                    s.at.as_secs_f64(),
                    s.in_flight,
                    s.delivered
                );
            }
        }
    }
    if shown.no_cost {
        return Ok(());
    }

    println!(
        "\ncost per million events on AWS: up to {cost_events} events of {event_bytes} B per case (2,000 publishes at most); counted AWS calls and billed ms priced at us-east-1 list prices (checked 2025-06), functions at {} MB",
        e2e::FUNCTION_MEMORY_MB
    );
    println!(
        "  a topic keeps no archive unless created with --retention-days (#35): the rows price that default, and the rows marked {days} d price a topic archived for {days} days, its ingest calls and storage included (stored {stored} days: its retention class)",
        days = cost::ARCHIVE_RETENTION_DAYS,
        stored = cost::archive_stored_days()
    );
    println!(
        "  the topic column: 'off' is a topic as created by default; '{days} d' keeps an archive; 'dedup' has --dedup-window-seconds {window} (P1): ingest reads and writes a DynamoDB item per event, in batch calls",
        days = cost::ARCHIVE_RETENTION_DAYS,
        window = cost::DEDUP_WINDOW_SECONDS
    );
    println!(
        "  the window column is the delivery queue's event source (DeliveryBatchSize and DeliveryBatchingWindowSeconds): '-' is the default, 10 messages and no window (G3); events/inv is events per deliver invocation"
    );
    println!(
        "  {:<9} {:<12} {:<10} {:<7} {:<9} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "publish",
        "front door",
        "batching",
        "topic",
        "window",
        "subscriber",
        "events/inv",
        "API GW",
        "Lambda",
        "SQS",
        "DynamoDB",
        "other",
        "journal",
        "archive",
        "x86_64",
        "arm64"
    );
    let mut breakdowns = Vec::new();
    let no_window = EventSourceBatching::default();
    let cases = [1, 100].into_iter().flat_map(|per_publish| {
        [FrontDoor::HttpApi, FrontDoor::FunctionUrl]
            .into_iter()
            .flat_map(move |door| {
                [None, Some(100)].into_iter().flat_map(move |batch| {
                    [1, 50]
                        .into_iter()
                        .map(move |delay_ms| CostCase::plain(per_publish, door, batch, delay_ms))
                })
            })
    });
    // What an archive adds (#35), beside the same cases without one.
    let archived = [
        (1, FrontDoor::HttpApi, 1),
        (1, FrontDoor::FunctionUrl, 1),
        (100, FrontDoor::HttpApi, 50),
    ]
    .map(|(per_publish, door, delay_ms)| CostCase {
        archived: true,
        ..CostCase::plain(per_publish, door, None, delay_ms)
    });
    // What a batching window saves one-event publishes (#38), at the price of holding events
    // back up to a second (giving up G3): 10 and 100 messages an invocation at most.
    let windowed = [10, 100].into_iter().flat_map(|batch_size| {
        [1, 50].into_iter().map(move |delay_ms| {
            let window = EventSourceBatching::new(batch_size, 1)
                .expect("a window of 1 s allows up to 10,000 messages");
            CostCase {
                event_source: window,
                ..CostCase::plain(1, FrontDoor::FunctionUrl, None, delay_ms)
            }
        })
    });
    // What deduplication adds (P1): a read and a write of each event's id. Run alone
    // (`--cost-rows deduped`), the group measures the same cases without it too, beside them.
    let rows = shown.cost_rows;
    let deduped = [(1, FrontDoor::FunctionUrl), (100, FrontDoor::HttpApi)]
        .into_iter()
        .flat_map(|(per_publish, door)| {
            let plain = CostCase::plain(per_publish, door, None, 50);
            let baseline = (rows == CostRows::Deduped).then_some(plain);
            baseline.into_iter().chain([CostCase {
                deduped: true,
                ..plain
            }])
        });
    let cases = cases.filter(|_| rows.take(CostRows::Default));
    let archived = archived
        .into_iter()
        .filter(|_| rows.take(CostRows::Archived));
    let windowed = windowed.filter(|_| rows.take(CostRows::Windowed));
    let deduped = deduped.filter(|_| rows.take(CostRows::Deduped));
    for row in cases.chain(archived).chain(windowed).chain(deduped) {
        let CostCase {
            per_publish,
            front_door,
            batch,
            delay_ms,
            archived,
            deduped,
            event_source,
        } = row;
        // Publishing one event per request is bound by the emulator (~100 requests/s
        // here); the counts per event settle within a few thousand.
        let events = cost_events.min(per_publish * 2_000);
        let case = e2e::Case {
            events,
            event_bytes,
            per_publish,
            delay_ms,
            max_events_per_batch: batch,
            max_in_flight: None,
            front_door,
            archived,
            deduped,
            event_source,
            ordered_keys: None,
        };
        let run = e2e::run(binary.clone(), prefix(&case), case, &aws).await?;
        let window = if event_source == no_window {
            "-".to_string()
        } else {
            format!(
                "{} s x{}",
                event_source.window().as_secs(),
                event_source.batch_size()
            )
        };
        // Where the money goes: arrays of 100 behind the HTTP API, one event behind the
        // function URL with and without a window.
        let broken_down = match (per_publish, front_door) {
            (100, FrontDoor::HttpApi) => delay_ms == 1 || deduped,
            (1, FrontDoor::FunctionUrl) => delay_ms == 50,
            _ => false,
        };
        if batch.is_none() && !archived && broken_down {
            let label = format!(
                "arrays of {per_publish}, {}, window {window}{}",
                door_label(front_door),
                if deduped { ", dedup" } else { "" }
            );
            breakdowns.push((label, run.calls.clone(), run.usage));
        }
        let x86 = run
            .usage
            .per_million(&cost::LIST_PRICES, cost::Architecture::X86);
        let arm = run
            .usage
            .per_million(&cost::LIST_PRICES, cost::Architecture::Arm);
        let events_per_invocation =
            run.usage.events as f64 / run.usage.deliver.invocations.max(1) as f64;
        let goal = match (per_publish, front_door, batch, delay_ms, archived) {
            _ if deduped => "",
            (1, FrontDoor::FunctionUrl, _, _, false) => "  (goal <= $1.00)",
            (100, FrontDoor::HttpApi, None, 50, false) => "  (goal <= $0.10; journal <= $0.01)",
            (100, FrontDoor::HttpApi, None, _, false) => "  (journal goal <= $0.01)",
            (1, FrontDoor::HttpApi, None, _, false) => "  (journal goal <= $0.03)",
            (100, _, _, _, true) => "  (journal and archive goal <= $0.05)",
            (1, _, _, _, true) => "  (journal and archive goal <= $0.20)",
            _ => "",
        };
        let archive = if archived {
            format!("{:.4}", x86.archive)
        } else {
            "-".to_string()
        };
        println!(
            "  {:<9} {:<12} {:<10} {:<7} {window:<9} {:>7} ms {events_per_invocation:>10.1} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {archive:>9} {:>10.4} {:>10.4}{goal}",
            format!("array {per_publish}"),
            door_label(front_door),
            batch.map_or("off".to_string(), |n| format!("{n}")),
            match (archived, deduped) {
                (true, _) => format!("{} d", cost::ARCHIVE_RETENTION_DAYS),
                (false, true) => "dedup".to_string(),
                (false, false) => "off".to_string(),
            },
            delay_ms,
            x86.api_gateway,
            x86.lambda,
            x86.sqs,
            x86.dynamodb,
            x86.other,
            x86.journal,
            x86.total(),
            arm.total(),
        );
    }
    for (peer, price) in cost::PEERS {
        println!("  beside: {peer}: ${price:.2} per million");
    }
    let parts = cost::STACK_IDLE_PARTS;
    let idle = parts.per_month(&cost::LIST_PRICES);
    println!(
        "  idle: a deployed stack that receives nothing pays ${:.2} a month: SQS polling ${:.2} ({} event sources, {} of them FIFO, x {} long polls every {} s), alarms ${:.2} ({}), secrets ${:.2} ({}); either front door adds nothing; beside: EventBridge and Event Grid $0.00",
        idle.total(),
        idle.sqs_polling,
        parts.event_sources + parts.fifo_event_sources,
        parts.fifo_event_sources,
        cost::IDLE_POLLERS,
        cost::LONG_POLL_SECONDS,
        idle.alarms,
        parts.alarms,
        idle.secrets,
        parts.secrets,
    );
    for (label, calls, usage) in breakdowns {
        let events = usage.events.max(1) as f64;
        let by_op: Vec<String> = calls
            .iter()
            .map(|(op, c)| {
                format!(
                    "{op} {:.3} ({:.1} ms)",
                    c.calls as f64 / events,
                    c.micros as f64 / 1000.0 / c.calls.max(1) as f64
                )
            })
            .collect();
        // Each call's mean time as the emulator answered it: what of the functions' billed
        // time is the emulator's wait (#38).
        println!(
            "  AWS calls per event (each one's mean time), {label}: {}",
            by_op.join(", ")
        );
        // Where the Lambda column goes: each function's invocations and billed time.
        let function = |name: &str, f: cost::FunctionTime| {
            format!(
                "{name} {:.3} invocations and {:.1} billed ms per event ({:.1} ms each)",
                f.invocations as f64 / events,
                f.billed_ms as f64 / events,
                f.billed_ms as f64 / f.invocations.max(1) as f64
            )
        };
        println!(
            "  Lambda per event, {label}: {}; {}; {}",
            function("ingest", usage.ingest),
            function("deliver", usage.deliver),
            function("dead-letter", usage.dead_letter)
        );
    }
    Ok(())
}

/// How the cost table names a front door.
fn door_label(door: FrontDoor) -> &'static str {
    match door {
        FrontDoor::HttpApi => "HTTP API",
        FrontDoor::FunctionUrl => "function URL",
    }
}

/// Resources of their own for each case.
fn prefix(case: &e2e::Case) -> String {
    format!(
        "bench-{}{}{}{}{}-{}-{}-{}-{}",
        std::process::id(),
        case.ordered_keys.map_or(String::new(), |k| format!("o{k}")),
        match case.front_door {
            FrontDoor::HttpApi => "",
            FrontDoor::FunctionUrl => "u",
        },
        match (case.archived, case.deduped) {
            (true, _) => "a",
            (false, true) => "d",
            (false, false) => "",
        },
        if case.event_source == EventSourceBatching::default() {
            String::new()
        } else {
            format!("w{}", case.event_source.batch_size())
        },
        case.per_publish,
        case.max_events_per_batch.unwrap_or(1),
        case.delay_ms,
        case.max_in_flight.unwrap_or(0)
    )
}

fn calls_per_event(run: &e2e::E2eRun) -> f64 {
    let calls: u64 = run.calls.values().map(|c| c.calls).sum();
    calls as f64 / run.usage.events.max(1) as f64
}

/// One event in the Event Grid schema with about `bytes` bytes of data.
fn event_body(i: usize, bytes: usize) -> String {
    subject_event_body(i, i, bytes)
}

/// [`event_body`] with the subject `/bench/{subject}`.
fn subject_event_body(i: usize, subject: usize, bytes: usize) -> String {
    format!(
        r#"{{"id":"ev-{i}","subject":"/bench/{subject}","eventType":"Bench.Event","eventTime":"2026-11-24T00:00:00Z","dataVersion":"1","data":{{"pad":"{}"}}}}"#,
        "x".repeat(bytes.saturating_sub(120))
    )
}

fn events(count: usize, bytes: usize) -> anyhow::Result<Vec<Box<RawValue>>> {
    keyed_events(count, bytes, None)
}

/// `count` events whose subjects are `keys` values in turn (event `i`'s is `i % keys`), or
/// each its own.
fn keyed_events(
    count: usize,
    bytes: usize,
    keys: Option<usize>,
) -> anyhow::Result<Vec<Box<RawValue>>> {
    (0..count)
        .map(|i| {
            let subject = keys.map_or(i, |k| i % k.max(1));
            RawValue::from_string(subject_event_body(i, subject, bytes)).context("an event")
        })
        .collect()
}

/// A process's CPU time (user + system) from a starting point.
struct Cpu {
    pid: u32,
    start: Duration,
}

impl Cpu {
    fn of_self() -> anyhow::Result<Self> {
        Self::of_process(std::process::id())
    }

    fn of_process(pid: u32) -> anyhow::Result<Self> {
        Ok(Self {
            pid,
            start: cpu_time(pid)?,
        })
    }

    fn used(&self) -> anyhow::Result<Duration> {
        Ok(cpu_time(self.pid)?.saturating_sub(self.start))
    }
}

/// utime + stime from /proc/<pid>/stat (Linux; clock ticks of 1/100 s).
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("/proc stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .context("/proc stat field")?
            .parse::<u64>()
            .context("/proc stat number")
    };
    // utime and stime are fields 14 and 15; after the name, the state is field 3 (index 0).
    let total = ticks(11)? + ticks(12)?;
    Ok(Duration::from_millis(total * 10))
}
