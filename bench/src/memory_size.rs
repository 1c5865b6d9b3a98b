//! Which memory size `deliver` costs least at (issue #9). Lambda gives a function CPU in
//! proportion to its memory, one vCPU's worth at 1,769 MB, and bills milliseconds times
//! memory: a function that waits on endpoints pays less at a smaller size, until its share of
//! a CPU is what it waits for. This puts the `deliver` bootstrap, under the emulated Runtime
//! API, in a CPU cgroup with the share Lambda gives each size (a CFS quota of size / 1,769 MB
//! of one CPU in each period of 10 ms, short enough to hold an invocation of a few
//! milliseconds to it; 14 ms at 128 MB, the kernel's least quota being 1 ms), times warm invocations of one full batch against a subscriber that
//! answers at once and one that answers after 50 ms, and prices the billed time at list
//! prices, per million events. Needs root and the cgroup v1 `cpu` controller; says why and
//! skips when it cannot make a cgroup.
//!
//! Then `ingest` (#38), under the same shares: its billed time per warm publish of one event
//! through a function URL, priced per million publishes, and the largest publish the fan-out
//! limit allows (about 1 MB to 64 subscriptions: 64 MiB of `SendMessageBatch`), its time beside
//! `ingest`'s 15 s timeout and its peak memory beside the size, so that a size that costs less
//! for the common publish is not one that fails the largest.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use gridrelay_adapters::aws::DynamoSubscriptionStore;
use gridrelay_e2e::runtime_api::{LambdaProcess, function_url_event, resident_kib};
use gridrelay_local::{INGEST_TIMEOUT, Resources};

use crate::cold_start::{
    FullBatch, LOOPBACK_ALLOWED, add_subscription, failed_part, full_batch, stack, subscribed_topic,
};
use crate::cost::LIST_PRICES;
use crate::{event_body, sink};

/// The sizes tried, in MB; 1,769 MB is one whole vCPU.
pub const SIZES: [u32; 5] = [128, 256, 512, 1024, 1769];
/// A whole vCPU's worth of memory.
const ONE_VCPU_MB: u64 = 1769;
/// The shortest CFS period used, in microseconds.
const SHORTEST_PERIOD_US: u64 = 10_000;
/// The least CFS quota the kernel accepts, in microseconds.
const MIN_QUOTA_US: u64 = 1_000;
/// Invocations per size: the first warms the function up (connections, the endpoint's limit),
/// the rest are timed.
const INVOCATIONS: usize = 4;
const CGROUP_CPU: &str = "/sys/fs/cgroup/cpu";

/// A CPU cgroup holding a process to `memory_mb / 1769` of one CPU, over a period of 10 ms (14 ms
/// at 128 MB, where 10 ms would need a quota under the kernel's least); removed on drop.
struct CpuShare {
    dir: PathBuf,
}

impl CpuShare {
    fn new(memory_mb: u32) -> anyhow::Result<Self> {
        let dir = PathBuf::from(CGROUP_CPU).join(format!(
            "gridrelay-bench-{memory_mb}-{}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
        let share = Self { dir };
        // A short period, so that even an invocation of a few milliseconds is held to the share
        // instead of running through one period's quota at full speed; long enough that the
        // quota is at least the 1 ms the kernel accepts.
        let period = (MIN_QUOTA_US * ONE_VCPU_MB)
            .div_ceil(u64::from(memory_mb))
            .max(SHORTEST_PERIOD_US);
        let quota = period * u64::from(memory_mb) / ONE_VCPU_MB;
        share.write("cpu.cfs_period_us", period)?;
        share.write("cpu.cfs_quota_us", quota)?;
        Ok(share)
    }

    fn write(&self, file: &str, value: impl ToString) -> anyhow::Result<()> {
        std::fs::write(self.dir.join(file), value.to_string())
            .with_context(|| format!("write {}/{file}", self.dir.display()))
    }

    /// Moves `pid`, with all its threads, into the share.
    fn hold(&self, pid: u32) -> anyhow::Result<()> {
        self.write("cgroup.procs", pid)
    }
}

impl Drop for CpuShare {
    /// Moves whatever is still in the share (a process killed but not yet gone, after a
    /// failure) back to the root cgroup, so the share can be removed.
    fn drop(&mut self) {
        if let Ok(pids) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in pids.split_whitespace() {
                let _ = std::fs::write(PathBuf::from(CGROUP_CPU).join("cgroup.procs"), pid);
            }
        }
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("could not remove {}: {e}", self.dir.display());
        }
    }
}

/// The queues and tables (named from `prefix`) for a benchmark of `deliver` under CPU shares,
/// and their store; `None`, said and skipped before anything is made, when this machine cannot
/// give a process a share of a CPU (no cgroup v1 `cpu` controller, not root, or a read-only
/// hierarchy).
pub async fn stack_for_shares(
    benchmark: &str,
    prefix: &str,
) -> anyhow::Result<Option<(Resources, DynamoSubscriptionStore)>> {
    if let Err(e) = CpuShare::new(SIZES[0]) {
        println!(
            "{benchmark}: skipped (cannot make a cgroup to give deliver a share of a CPU: {e:#})"
        );
        return Ok(None);
    }
    stack(prefix).await.map(Some)
}

/// `deliver` under the CPU share of `memory_mb`, handed `batch` (of `events_in_batch` events for
/// the sink counted by `counts`) [`INVOCATIONS`] times: its billed milliseconds per warm
/// invocation, on average. Fails when any event is not delivered.
pub async fn warm_billed_ms(
    resources: &Resources,
    memory_mb: u32,
    batch: &serde_json::Value,
    events_in_batch: usize,
    counts: &sink::Counts,
) -> anyhow::Result<f64> {
    let (share, mut f) = started_in_share(
        "gridrelay-deliver",
        resources,
        memory_mb,
        &[LOOPBACK_ALLOWED],
    )
    .await?;
    let before = counts.events.load(Ordering::Relaxed);
    let answers = f.invoke_all(vec![batch.clone(); INVOCATIONS]).await;
    let durations = f.durations();
    f.stop().await;
    drop(share);
    if let Some(bad) = answers.iter().find(|a| failed_part(a)) {
        bail!("deliver at {memory_mb} MB failed part of a batch: {bad}");
    }
    let delivered = counts.events.load(Ordering::Relaxed) - before;
    if delivered != INVOCATIONS * events_in_batch {
        bail!(
            "deliver at {memory_mb} MB: {delivered} of {} events reached the sink",
            INVOCATIONS * events_in_batch
        );
    }
    let warm = &durations[1..];
    Ok(warm.iter().map(billed_ms).sum::<f64>() / warm.len() as f64)
}

/// `binary`'s bootstrap started under the CPU share of `memory_mb` (and `extra` in its
/// environment), initialised; the share holds it until dropped.
async fn started_in_share(
    binary: &str,
    resources: &Resources,
    memory_mb: u32,
    extra: &[(&str, &str)],
) -> anyhow::Result<(CpuShare, LambdaProcess)> {
    let share = CpuShare::new(memory_mb)?;
    let memory = memory_mb.to_string();
    // What Lambda sets; gridrelay does not read it, the cgroup is what limits.
    let mut env = extra.to_vec();
    env.push(("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", memory.as_str()));
    let f = LambdaProcess::start(binary, resources, &env).await;
    share.hold(f.pid().with_context(|| format!("{binary}'s pid"))?)?;
    f.init_duration().await;
    Ok((share, f))
}

/// An invocation's duration as Lambda bills it: whole milliseconds, rounded up.
fn billed_ms(duration: &Duration) -> f64 {
    duration.as_micros().div_ceil(1000) as f64
}

/// What a function costs per million events on arm64 at list prices, each invocation of
/// `events_per_invocation` events billed `billed_ms` at `memory_mb`: duration and request.
pub fn cost_per_million(billed_ms: f64, memory_mb: u32, events_per_invocation: usize) -> f64 {
    let per_invocation = billed_ms / 1000.0 * f64::from(memory_mb) / 1024.0
        * LIST_PRICES.lambda_gb_second_arm
        + LIST_PRICES.lambda_request;
    per_invocation / events_per_invocation as f64 * 1e6
}

/// Prints, for each subscriber latency and memory size, `deliver`'s billed time per warm batch
/// of `events_in_batch` events and what that costs per million events.
pub async fn run(events_in_batch: usize) -> anyhow::Result<()> {
    let Some((resources, store)) = stack_for_shares("memory size", "bench-mem").await? else {
        return Ok(());
    };
    println!(
        "memory size: deliver under the CPU share Lambda gives each size (size / {ONE_VCPU_MB} MB of a CPU), {} warm invocations of {events_in_batch} events in 10 messages each, unbatched; billed time priced at arm64 list prices",
        INVOCATIONS - 1
    );
    for delay_ms in [0, 50] {
        let (hook, counts) =
            sink::serve("127.0.0.1:0".parse()?, Duration::from_millis(delay_ms)).await?;
        let topic = format!("bench-{delay_ms}");
        subscribed_topic(&store, &topic, hook).await?;
        let FullBatch { batch, .. } =
            full_batch(&resources, &store, &topic, events_in_batch).await?;
        let mut rows = Vec::new();
        for memory_mb in SIZES {
            let billed_ms =
                warm_billed_ms(&resources, memory_mb, &batch, events_in_batch, &counts).await?;
            rows.push((
                memory_mb,
                billed_ms,
                cost_per_million(billed_ms, memory_mb, events_in_batch),
            ));
        }
        let at_256 = rows
            .iter()
            .find(|(m, ..)| *m == 256)
            .map_or(f64::NAN, |(_, _, cost)| *cost);
        for (memory_mb, billed_ms, cost) in rows {
            println!(
                "  subscriber {delay_ms:>2} ms, {memory_mb:>4} MB: {billed_ms:>7.0} ms per batch ({:>6.0} events/s); deliver ${cost:.4} per million events = {:.2}x 256 MB",
                events_in_batch as f64 / (billed_ms / 1000.0),
                cost / at_256
            );
        }
    }
    ingest(&resources, &store).await
}

/// Warm one-event publishes timed at each size.
const ONE_EVENT_PUBLISHES: usize = 40;
/// Subscriptions of the topic the largest publish goes to: as many as the fan-out limit
/// allows for a publish of about 1 MB (`tests/tests/fan_out_limit.rs`).
const WIDEST_FAN_OUT: usize = 64;

/// What `ingest` measured at one size.
struct IngestAtSize {
    memory_mb: u32,
    one_event_ms: f64,
    largest_ms: f64,
    peak_mb: f64,
}

/// Prints, for each memory size, `ingest`'s billed time per warm one-event publish through a
/// function URL and its cost per million publishes, and the largest publish's time and peak
/// memory.
async fn ingest(resources: &Resources, store: &DynamoSubscriptionStore) -> anyhow::Result<()> {
    // ingest only enqueues: the subscriber is never called.
    let (hook, _) = sink::serve("127.0.0.1:0".parse()?, Duration::ZERO).await?;
    let one = subscribed_topic(store, "ingest-one", hook.clone()).await?;
    let wide = subscribed_topic(store, "ingest-wide", hook.clone()).await?;
    for i in 1..WIDEST_FAN_OUT {
        add_subscription(store, &wide.name, &format!("sink-{i:02}"), hook.clone()).await?;
    }
    let path = |topic: &str| format!("/topics/{topic}/api/events");
    let one_event = function_url_event(
        &path(&one.name),
        &one.key1,
        &format!("[{}]", event_body(0, 1_000)),
    );
    // 1,000 events of about 975 bytes, about 1,040 each as kept (ingest adds the topic and
    // its own fields): 64 copies fit in the fan-out limit (about 66.5 of its 67.1 MB).
    let largest: Vec<String> = (0..1_000).map(|i| event_body(i, 960)).collect();
    let largest_body = format!("[{}]", largest.join(","));
    let largest = function_url_event(&path(&wide.name), &wide.key1, &largest_body);
    let warm_wide = function_url_event(
        &path(&wide.name),
        &wide.key1,
        &format!("[{}]", event_body(0, 200)),
    );
    println!(
        "memory size, ingest (#38): {ONE_EVENT_PUBLISHES} warm publishes of one 1 KB event through a function URL (topic without an archive), one after another; then the largest publish the fan-out limit allows ({} bytes to {WIDEST_FAN_OUT} subscriptions), warm; billed time priced at arm64 list prices per million publishes",
        largest_body.len()
    );
    let mut rows = Vec::new();
    for memory_mb in SIZES {
        let (share, mut f) =
            started_in_share("gridrelay-ingest", resources, memory_mb, &[]).await?;
        let pid = f.pid().context("ingest's pid")?;
        // Warm: both topics and their subscriptions cached, the connection to SQS open.
        let mut events = vec![one_event.clone(), warm_wide.clone()];
        events.extend(std::iter::repeat_n(one_event.clone(), ONE_EVENT_PUBLISHES));
        events.push(largest.clone());
        let answers = f.invoke_all(events).await;
        let durations = f.durations();
        let (_, peak_kib) = resident_kib(pid).context("ingest's memory (/proc)")?;
        f.stop().await;
        drop(share);
        if let Some(bad) = answers.iter().find(|a| a["statusCode"] != 200) {
            let shown: String = bad.to_string().chars().take(300).collect();
            bail!("ingest at {memory_mb} MB refused a publish: {shown}");
        }
        let timed = &durations[2..2 + ONE_EVENT_PUBLISHES];
        rows.push(IngestAtSize {
            memory_mb,
            one_event_ms: timed.iter().map(billed_ms).sum::<f64>() / timed.len() as f64,
            largest_ms: durations.last().map_or(f64::NAN, billed_ms),
            peak_mb: peak_kib as f64 / 1024.0,
        });
    }
    let cost = |r: &IngestAtSize| cost_per_million(r.one_event_ms, r.memory_mb, 1);
    let at_256 = rows
        .iter()
        .find(|r| r.memory_mb == 256)
        .map_or(f64::NAN, cost);
    for r in &rows {
        println!(
            "  {:>4} MB: {:>6.1} ms per one-event publish; ingest ${:.4} per million publishes = {:.2}x 256 MB; largest publish {:>6.0} ms = {:.2} of the timeout, {:.1} MB at peak = {:.2} of the size",
            r.memory_mb,
            r.one_event_ms,
            cost(r),
            cost(r) / at_256,
            r.largest_ms,
            r.largest_ms / (INGEST_TIMEOUT.as_secs_f64() * 1000.0),
            r.peak_mb,
            r.peak_mb / f64::from(r.memory_mb)
        );
    }
    Ok(())
}
