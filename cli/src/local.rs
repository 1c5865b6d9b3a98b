//! `gridrelay local`: the publish API and the delivery and dead-letter workers run on this
//! machine against AWS_ENDPOINT_URL.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use gridrelay_adapters::aws::load_sdk_config;
use gridrelay_local::batching::EventSourceBatching;
use gridrelay_local::{FrontDoor, LocalSystem, ResourceNames, RunnerConfig};
use gridrelay_shared::outbound::AllowedNetworks;
use gridrelay_shared::time_scale::TimeScale;
use serde_json::json;

use crate::{invalid, print};

#[derive(Args)]
pub(super) struct LocalArgs {
    /// Address of the publish API.
    #[arg(long, default_value = "127.0.0.1:7071")]
    listen: SocketAddr,
    /// Prefix of every queue, table and bucket name.
    #[arg(long, default_value = "gridrelay")]
    prefix: String,
    /// Seconds a received message stays hidden while its handler runs; at least the function
    /// timeout.
    #[arg(long, default_value_t = gridrelay_local::DEFAULT_VISIBILITY_TIMEOUT_SECS)]
    visibility_timeout: u64,
    /// Receives before a message that keeps failing moves to its redrive queue.
    #[arg(long, default_value_t = gridrelay_local::DEFAULT_MAX_RECEIVE_COUNT)]
    max_receive_count: u32,
    /// Seconds one handler invocation may run, as a Lambda function's timeout (deliver's is
    /// 300 on AWS): the handler plans against it and is stopped at it. At least twice the
    /// 10 s deadline margin plus the 30 s attempt timeout (scaled by GRIDRELAY_TIME_SCALE).
    #[arg(long, default_value_t = gridrelay_local::DEFAULT_FUNCTION_TIMEOUT_SECS)]
    function_timeout: u64,
    /// Delivery requests each deliver instance has in flight at once, across endpoints (1 to
    /// 832; the deliver Lambda reads GRIDRELAY_MAX_REQUESTS_IN_FLIGHT). The runner runs one
    /// instance per concurrent invocation, as Lambda does.
    #[arg(long, env = gridrelay_local::MAX_REQUESTS_IN_FLIGHT_ENV, default_value_t = gridrelay_local::DEFAULT_MAX_REQUESTS_IN_FLIGHT)]
    max_requests_in_flight: u32,
    /// The most one endpoint gets at once (1 to the total; default: three quarters of the total); below it
    /// each endpoint's limit follows its answers.
    #[arg(long, env = gridrelay_local::MAX_REQUESTS_PER_ENDPOINT_ENV)]
    max_requests_per_endpoint: Option<u32>,
    /// Seconds the functions keep the topics, subscriptions and secret values they read (0 to
    /// 300, 0 keeps nothing; the Lambdas read GRIDRELAY_CONFIG_CACHE_SECONDS). A change made
    /// with this command line is in effect within this time.
    #[arg(long, env = gridrelay_ports::cache::CONFIG_CACHE_ENV, default_value = "10")]
    config_cache_seconds: String,
    /// Run `deliver` without writing the delivery journal (#35): `event show` and
    /// `event-subscription attempts` then find nothing. For measuring what the journal costs.
    #[arg(long)]
    no_journal: bool,
    /// `deliver` invocations on the replay queue at once (2 to 1000; the stack's
    /// ReplayMaximumConcurrency): what replays may take of the delivery capacity, whatever
    /// their rate.
    #[arg(long, default_value_t = gridrelay_local::DEFAULT_REPLAY_CONCURRENCY as u16, value_parser = clap::value_parser!(u16).range(2..=1000))]
    replay_concurrency: u16,
    /// Address of the operator console (#36; `gridrelay console` on this system): a loopback
    /// address, port 0 for a free one. Its URL, with this run's token, is printed.
    #[arg(long, default_value = "127.0.0.1:7072")]
    console_listen: SocketAddr,
    /// Start no console.
    #[arg(long)]
    no_console: bool,
    /// What publishers reach `ingest` through (#38; the stack's PublishFrontDoor):
    /// `http-api` (API Gateway's HTTP API; the request reaches `ingest` as it came) or
    /// `function-url` (a Lambda function URL: the request goes through the function URL's event
    /// and response format, as on AWS, with its 6 MB payload limit).
    #[arg(long, value_enum, default_value = "http-api")]
    front_door: FrontDoorArg,
    /// Delivery and replay queue messages per deliver invocation (#38; the stack's
    /// DeliveryBatchSize): 1 to 10, or up to 10000 with a batching window.
    #[arg(long, default_value_t = 10)]
    delivery_batch_size: u32,
    /// Seconds the delivery and replay event sources may wait to fill a batch (0 to 300; the
    /// stack's DeliveryBatchingWindowSeconds). 0 invokes with what each receive finds (G3:
    /// nothing held back); a window holds events back up to this long when traffic is light.
    #[arg(long, default_value_t = 0)]
    delivery_batching_window_seconds: u64,
}

/// `--front-door`'s values.
#[derive(Clone, Copy, clap::ValueEnum)]
enum FrontDoorArg {
    HttpApi,
    FunctionUrl,
}

impl From<FrontDoorArg> for FrontDoor {
    fn from(arg: FrontDoorArg) -> Self {
        match arg {
            FrontDoorArg::HttpApi => FrontDoor::HttpApi,
            FrontDoorArg::FunctionUrl => FrontDoor::FunctionUrl,
        }
    }
}

/// `gridrelay local`: the system started, where it answers printed, and what it did printed
/// when a stop signal ends it.
pub(super) async fn run_local(
    args: LocalArgs,
    allowed_networks: Option<&str>,
) -> anyhow::Result<()> {
    let scale = TimeScale::from_env().map_err(invalid)?;
    let allowed_networks: AllowedNetworks = allowed_networks
        .unwrap_or(gridrelay_shared::outbound::LOCAL_ALLOWED_NETWORKS)
        .parse()
        .map_err(invalid)?;
    let sdk = load_sdk_config().await;
    let names = ResourceNames::with_prefix(&args.prefix);
    let config = RunnerConfig {
        listen: args.listen,
        scale,
        visibility_timeout: Duration::from_secs(args.visibility_timeout),
        max_receive_count: args.max_receive_count,
        function_timeout: Duration::from_secs(args.function_timeout),
        delivery_concurrency: gridrelay_local::ConcurrencySettings::new(
            args.max_requests_in_flight,
            args.max_requests_per_endpoint,
        )
        .map_err(invalid)?,
        config_cache: gridrelay_ports::cache::config_cache_time(&args.config_cache_seconds)
            .map_err(invalid)?,
        allowed_networks: allowed_networks.clone(),
        journal: !args.no_journal,
        replay_concurrency: usize::from(args.replay_concurrency),
        front_door: args.front_door.into(),
        batching: EventSourceBatching::new(
            args.delivery_batch_size,
            args.delivery_batching_window_seconds,
        )
        .map_err(invalid)?,
        ..RunnerConfig::default()
    };
    // The settings first: an error names what is wrong before anything is tried.
    config.check().map_err(invalid)?;
    crate::console::check_listen(args.console_listen, "--console-listen")?;
    let config_cache = config.config_cache;
    let system = LocalSystem::start(&sdk, &names, config)
        .await
        .map_err(|e| not_started(e, sdk.endpoint_url()))?;
    let console = if args.no_console {
        None
    } else {
        console_on(&system, &names, args.console_listen).await
    };
    print(&json!({
        "publishEndpoint": system.publish_endpoint("{topic}"),
        "frontDoor": match args.front_door {
            FrontDoorArg::HttpApi => "HttpApi",
            FrontDoorArg::FunctionUrl => "FunctionUrl",
        },
        "console": console.as_ref().map(|c| &c.url),
        "awsEndpoint": sdk.endpoint_url(),
        "deliveryBatchSize": args.delivery_batch_size,
        "deliveryBatchingWindowSeconds": args.delivery_batching_window_seconds,
        "timeScale": scale.factor(),
        "configCacheSeconds": config_cache.as_secs(),
        "allowedNetworks": allowed_networks.to_string(),
        "topicsTable": names.topics_table,
        "subscriptionsTable": names.subscriptions_table,
        "deliveryQueue": system.resources.delivery_queue_url,
        "controlQueue": system.resources.control_queue_url,
        "replayQueue": system.resources.replay_queue_url,
        "orderedQueue": system.resources.ordered_queue_url,
        "deadLetterQueue": system.resources.dead_letter_queue_url,
        "deadLetterBucket": names.dead_letter_bucket,
    }))?;
    wait_for_stop_signal().await;
    tracing::info!("stopping");
    if let Some(console) = console {
        console.served.abort();
    }
    let stats = system.shutdown().await;
    print(&json!({ "stopped": stop_report(&stats) }))
}

/// The console over the local system; `None`, said on stderr, where it could not start (its
/// port taken, say): the system runs without it.
async fn console_on(
    system: &LocalSystem,
    names: &ResourceNames,
    listen: SocketAddr,
) -> Option<crate::console::Started> {
    let resources = crate::console::ConsoleResources {
        tables: gridrelay_adapters::config::TableNames {
            topics: names.topics_table.clone(),
            subscriptions: names.subscriptions_table.clone(),
        },
        delivery_state_table: names.delivery_state_table.clone(),
        delivery_queue: system.resources.delivery_queue_url.clone(),
        queue_key_secret: Some(names.queue_key_secret.clone()),
        journal_bucket: names.journal_bucket.clone(),
        journal_stream: Some(names.journal_stream.clone()),
        secret_prefix: names.secret_prefix.clone(),
        replays: crate::console::ReplayPlaces {
            table: Some(names.replays_table.clone()),
            archive_stream: names.archive_streams.values().next().cloned(),
            control_queue: Some(names.control_queue.clone()),
            replay_queue: Some(names.replay_queue.clone()),
        },
        portal: Some(crate::console::PortalLinks {
            portal_url: format!("http://{}/portal", system.listen),
            key_secret: names.portal_key_secret.clone(),
        }),
    };
    match crate::console::start(listen, resources).await {
        Ok(started) => Some(started),
        Err(e) => {
            eprintln!(
                "note: the console did not start ({e:#}); give --console-listen another address"
            );
            None
        }
    }
}

/// Why `gridrelay local` did not start, first; where it is known that the AWS API did not
/// answer (a connection refused or timed out), where to look.
fn not_started(e: anyhow::Error, endpoint: Option<&str>) -> anyhow::Error {
    let unreachable = e.chain().any(|cause| {
        let text = cause.to_string();
        // The SDK's words for a request that reached no answer (refused, timed out,
        // unresolved), kept in the text of the errors provisioning wraps.
        text.contains("dispatch failure") || text.contains("Connection refused")
    });
    match (unreachable, endpoint) {
        (true, Some(url)) => e.context(format!(
            "could not start: the AWS API at {url} (AWS_ENDPOINT_URL) did not answer; is the \
             emulator running? (`infra/local/moto.sh start`)"
        )),
        (true, None) => e.context("could not start: the AWS API did not answer"),
        (false, _) => e.context("could not start"),
    }
}

/// What the run did, printed when `gridrelay local` stops: each function's invocations and the
/// milliseconds Lambda would bill for them, and what delivery did.
fn stop_report(stats: &gridrelay_local::RunnerStats) -> serde_json::Value {
    let d = &stats.deliver;
    let l = &stats.dead_letter;
    json!({
        "ingest": {
            "invocations": stats.ingest_invocations,
            "billedMs": stats.billed.ingest_ms,
        },
        "deliver": {
            "invocations": stats.deliver_invocations,
            "billedMs": stats.billed.deliver_ms,
            "attempts": d.attempts,
            "failedAttempts": d.failed_attempts,
            "delivered": d.delivered,
            "retried": d.retried,
            "deadLettered": d.dead_lettered,
            "dropped": d.dropped,
            "delayed": d.delayed,
            "throttled": d.throttled,
        },
        "deadLetter": {
            "invocations": stats.dead_letter_invocations,
            "billedMs": stats.billed.dead_letter_ms,
            "recordsWritten": l.records_written,
            "recordsDropped": l.records_dropped,
        },
        "stoppedInvocations": stats.stopped_invocations,
        "unsealedDropped": stats.unsealed_dropped,
        "latency": {
            "queueMs": percentiles(&stats.latencies.queue_ms, "messages"),
            "publishToAnswerMs": percentiles(&stats.latencies.publish_to_answer_ms, "events"),
        },
    })
}

/// p50, p99 and the most of a latency histogram, and how many it counted.
fn percentiles(h: &hdrhistogram::Histogram<u64>, counted: &str) -> serde_json::Value {
    json!({
        "p50": h.value_at_quantile(0.5),
        "p99": h.value_at_quantile(0.99),
        "max": h.max(),
        counted: h.len(),
    })
}

pub(crate) async fn wait_for_stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
