//! Cold start of the deployed artifacts (issue #9): each function's `bootstrap` (as `cargo
//! lambda build --release` makes it) started under an emulated Lambda Runtime API
//! (`gridrelay_e2e::runtime_api`), timed from its process's start to its first request for
//! work (Lambda's init duration), beside the start of a process that does nothing (`true`) as
//! the floor of this machine; its size; and `deliver`'s resident memory after init and at its
//! peak while it handles one SQS batch of 5,000 events (10 messages) against a loopback sink,
//! which is what a function's memory size must hold; and warm `ingest`'s CPU and time per
//! publish, one invocation after another, which is what Lambda bills it for.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::Utc;
use gridrelay_adapters::aws::{DynamoSubscriptionStore, local_queue_key, seal_records, sqs_event};
use gridrelay_adapters::config::TableNames;
use gridrelay_e2e::runtime_api::{LambdaProcess, bootstrap_path, publish_event, resident_kib};
use gridrelay_local::{ResourceNames, Resources, provision};
use gridrelay_ports::SubscriptionStore;
use gridrelay_ports::fan_out::fan_out;
use gridrelay_ports::memory::MemoryQueue;
use gridrelay_ports::{Clock, SystemClock};
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::subscription::{SubscriptionRequest, Topic};
use gridrelay_shared::validation::{Provisioning, ProvisioningState};

use crate::{Cpu, events, sink};

/// Starts of each function timed; the median is printed.
const STARTS: usize = 5;

/// Warm publishes `ingest` is timed over (CPU time is counted in ticks of 10 ms).
const PUBLISHES: usize = 1_000;
/// Events in each of them, of 1 KB each.
const EVENTS_PER_PUBLISH: usize = 10;

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// The floor: starting a process that does nothing, on this machine, now.
fn process_floor() -> anyhow::Result<Duration> {
    let times = (0..STARTS)
        .map(|_| {
            let start = Instant::now();
            std::process::Command::new("true").status()?;
            Ok(start.elapsed())
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(median(times))
}

fn megabytes(path: &Path) -> anyhow::Result<f64> {
    let bytes = std::fs::metadata(path)
        .with_context(|| format!("{} (build it: infra/deploy/build.sh)", path.display()))?
        .len();
    Ok(bytes as f64 / 1_048_576.0)
}

/// Prints the cold-start figures; `events` go to `deliver` in one batch of 10 messages.
pub async fn run(events_in_batch: usize) -> anyhow::Result<()> {
    let (resources, store) = stack("bench-cold").await?;
    let floor = process_floor()?;
    println!(
        "cold start: bootstraps (x86_64, release) under an emulated Lambda Runtime API; process start floor (`true`): {:.1} ms",
        floor.as_secs_f64() * 1000.0
    );
    let (hook, counts) = sink::serve("127.0.0.1:0".parse()?, Duration::ZERO).await?;
    let topic = subscribed_topic(&store, "bench", hook).await?;
    for binary in ["gridrelay-ingest", "gridrelay-deliver"] {
        let size = megabytes(&bootstrap_path(binary))?;
        let mut inits = Vec::new();
        for _ in 0..STARTS {
            let f = LambdaProcess::start(binary, &resources, &[]).await;
            inits.push(f.init_duration().await);
            f.stop().await;
        }
        let init = median(inits);
        println!(
            "  {binary:<18} bootstrap {size:>5.1} MB; init {:>6.1} ms (median of {STARTS}) = {:.1}x the process floor",
            init.as_secs_f64() * 1000.0,
            init.as_secs_f64() / floor.as_secs_f64()
        );
    }

    publish_cost(&resources, &topic).await?;

    // deliver with one full batch.
    let FullBatch {
        batch,
        event_bytes,
        messages: in_batch,
    } = full_batch(&resources, &store, "bench", events_in_batch).await?;
    let mut f = LambdaProcess::start("gridrelay-deliver", &resources, &[LOOPBACK_ALLOWED]).await;
    f.init_duration().await;
    let pid = f.pid().context("deliver's pid")?;
    let (after_init, _) = resident_kib(pid).context("deliver's memory (/proc)")?;
    let answer = f.invoke(batch).await;
    let took = f.durations()[0];
    let (_, peak) = resident_kib(pid).context("deliver's memory (/proc)")?;
    f.stop().await;
    if failed_part(&answer) {
        bail!("deliver failed part of the batch: {answer}");
    }
    let delivered = counts.events.load(Ordering::Relaxed);
    if delivered != events_in_batch {
        bail!("{delivered} of {events_in_batch} events reached the sink");
    }
    println!(
        "  gridrelay-deliver  resident {:.1} MB after init, {:.1} MB at peak handling {events_in_batch} events of {event_bytes} B in {in_batch} messages ({:.0} ms) = {:.1}x; functions have 256 MB",
        after_init as f64 / 1024.0,
        peak as f64 / 1024.0,
        took.as_secs_f64() * 1000.0,
        peak as f64 / after_init.max(1) as f64
    );
    Ok(())
}

/// Warm `ingest`'s CPU time and wall time per publish of [`EVENTS_PER_PUBLISH`] events to one
/// subscription, over [`PUBLISHES`] invocations one after another (Lambda bills the wall time).
async fn publish_cost(resources: &Resources, topic: &Topic) -> anyhow::Result<()> {
    let mut f = LambdaProcess::start("gridrelay-ingest", resources, &[]).await;
    f.init_duration().await;
    let pid = f.pid().context("ingest's pid")?;
    let body = serde_json::to_string(&events(EVENTS_PER_PUBLISH, 1_000)?)?;
    let publish = publish_event(&topic.name, &topic.key1, &body);
    // Warm: the topic and subscription cached, the connection to SQS open.
    f.invoke_all(vec![publish.clone(); 10]).await;
    let cpu = Cpu::of_process(pid)?;
    let start = Instant::now();
    let answers = f.invoke_all(vec![publish; PUBLISHES]).await;
    let took = start.elapsed();
    let used = cpu.used()?;
    f.stop().await;
    if let Some(bad) = answers.iter().find(|a| a["statusCode"] != 200) {
        bail!("ingest refused a publish: {bad}");
    }
    println!(
        "  gridrelay-ingest   warm: {:.3} ms CPU and {:.2} ms per publish of {EVENTS_PER_PUBLISH} events of 1 KB ({PUBLISHES} one after another, each one SQS call)",
        used.as_secs_f64() * 1000.0 / PUBLISHES as f64,
        took.as_secs_f64() * 1000.0 / PUBLISHES as f64,
    );
    Ok(())
}

/// Whether `deliver`'s answer reports any of its batch failed (or is no batch answer at all).
pub fn failed_part(answer: &serde_json::Value) -> bool {
    answer["batchItemFailures"]
        .as_array()
        .is_none_or(|failed| !failed.is_empty())
}

/// The sinks are on loopback, which `deliver` refuses unless allowed.
pub const LOOPBACK_ALLOWED: (&str, &str) = ("GRIDRELAY_ALLOWED_NETWORKS", "127.0.0.0/8");

/// Queues and tables of their own for one benchmark (named from `prefix` and a fresh id) at
/// `AWS_ENDPOINT_URL`, and the subscription store of those tables.
pub async fn stack(prefix: &str) -> anyhow::Result<(Resources, DynamoSubscriptionStore)> {
    let sdk = gridrelay_e2e::sdk_config().await;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let names = ResourceNames::with_prefix(&format!("{prefix}-{}", &id[..8]));
    let resources = provision(&sdk, &names, 3).await.context("provision")?;
    let store = DynamoSubscriptionStore::from_sdk(
        &sdk,
        TableNames {
            topics: names.topics_table.clone(),
            subscriptions: names.subscriptions_table.clone(),
        },
    );
    Ok((resources, store))
}

/// Creates topic `name` with one subscription delivering to `hook`, stored as validated (the
/// handshake is not what the benchmarks measure).
pub async fn subscribed_topic(
    store: &DynamoSubscriptionStore,
    name: &str,
    hook: String,
) -> anyhow::Result<Topic> {
    let topic = Topic::with_new_keys(name, Utc::now());
    store.create_topic(&topic).await?;
    add_subscription(store, name, "sink", hook).await?;
    Ok(topic)
}

/// Adds subscription `name` to `topic`, delivering to `hook`, stored as validated.
pub async fn add_subscription(
    store: &DynamoSubscriptionStore,
    topic: &str,
    name: &str,
    hook: String,
) -> anyhow::Result<()> {
    let mut sub = SubscriptionRequest {
        topic: topic.into(),
        name: name.into(),
        endpoint: hook,
        ..SubscriptionRequest::default()
    }
    .validate(InputSchema::EventGridSchema, Utc::now())?;
    sub.provisioning = Provisioning::with_state(ProvisioningState::Succeeded, None);
    store.create_subscription(&sub).await?;
    Ok(())
}

/// One SQS batch for `deliver`, as the event source hands it over.
pub struct FullBatch {
    pub batch: serde_json::Value,
    /// The size of each event, small enough that the messages hold them all.
    pub event_bytes: usize,
    pub messages: usize,
}

/// `events` events published to `topic`, fanned out to its subscriptions, in one batch of 10
/// messages.
pub async fn full_batch(
    resources: &Resources,
    store: &DynamoSubscriptionStore,
    topic: &str,
    events_in_batch: usize,
) -> anyhow::Result<FullBatch> {
    let per_message = events_in_batch.div_ceil(10).max(1);
    // Small enough that a message holds `per_message` of them, as SQS's size allows.
    let event_bytes = (200_000 / per_message).clamp(150, 1_000);
    batch_of(
        resources,
        store,
        topic,
        events_in_batch,
        per_message,
        event_bytes,
    )
    .await
}

/// One SQS batch of `events_in_batch` events of `event_bytes` each, published to `topic` in
/// arrays of `per_message` and fanned out to its subscriptions (one message per array), as
/// the event source hands it over (sealed under the stack's key, as `deliver` takes them).
pub async fn batch_of(
    resources: &Resources,
    store: &DynamoSubscriptionStore,
    topic: &str,
    events_in_batch: usize,
    per_message: usize,
    event_bytes: usize,
) -> anyhow::Result<FullBatch> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let queue = MemoryQueue::new(Arc::clone(&clock));
    for chunk in events(events_in_batch, event_bytes)?.chunks(per_message) {
        fan_out(
            store,
            &queue,
            topic,
            InputSchema::EventGridSchema,
            chunk,
            clock.now(),
        )
        .await?;
    }
    let mut received = Vec::new();
    loop {
        let more = queue.receive(10, Duration::from_secs(900));
        if more.is_empty() {
            break;
        }
        received.extend(more);
    }
    let messages = events_in_batch.div_ceil(per_message);
    if received.len() != messages {
        bail!(
            "{events_in_batch} events of {event_bytes} B in arrays of {per_message} made {} messages, not {messages}",
            received.len()
        );
    }
    let key = local_queue_key(
        &gridrelay_e2e::sdk_config().await,
        &resources.names.queue_key_secret,
    )
    .await?;
    let mut event = sqs_event(&received);
    seal_records(&mut event, &key);
    Ok(FullBatch {
        batch: serde_json::to_value(event)?,
        event_bytes,
        messages: received.len(),
    })
}
