//! The deliver engine alone: the real handler and HTTP sender over in-memory queues and store,
//! POSTing to a sink in another process, one invocation after another as one Lambda container
//! runs them, on the runtime the function runs on ([`on_function_runtime`]); beside it, wrk
//! against the same sink, the loopback ceiling.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::Utc;
use gridrelay_adapters::aws::sqs_event;
use gridrelay_deliver::{Deliver, DeliverPorts, DeliverySettings};
use gridrelay_ports::fan_out::fan_out;
use gridrelay_ports::memory::{
    MemoryDeliveryCapStore, MemoryDeliveryStateStore, MemoryQueue, MemorySecretStore,
    MemorySubscriptionStore,
};
use gridrelay_ports::{Clock, RandomJitter, SystemClock};
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::subscription::SubscriptionRequest;
use gridrelay_shared::time_scale::TimeScale;

use crate::{Cpu, event_body, events};

/// What one engine run did.
pub struct EngineRun {
    pub delivered: usize,
    pub elapsed: Duration,
    pub cpu: Duration,
    pub invocations: usize,
    /// The sink's adaptive concurrency limit when the run ended.
    pub limit: Option<u32>,
}

impl EngineRun {
    pub fn events_per_second(&self) -> f64 {
        self.delivered as f64 / self.elapsed.as_secs_f64()
    }
}

/// The sink, in a process of its own so it does not share this one's CPU accounting.
pub struct SinkProcess {
    child: Child,
    pub url: String,
}

impl SinkProcess {
    pub fn start(delay_ms: u64) -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["sink", "--delay-ms", &delay_ms.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start the sink")?;
        let stdout = child.stdout.take().context("the sink's stdout")?;
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
        let url = line.trim().to_string();
        if !url.starts_with("http://") {
            bail!("the sink said {line:?}, not its URL");
        }
        Ok(Self { child, url })
    }
}

impl Drop for SinkProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `work` on the runtime a `deliver` function runs on (one thread, as in Lambda), on a
/// thread of its own, beside this process's runtime.
pub async fn on_function_runtime<T, F, Fut>(work: F) -> anyhow::Result<T>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        gridrelay_adapters::runtime::function_runtime()?.block_on(work())
    })
    .await
    .context("the engine's thread")?
}

/// Delivers `count` events of about `event_bytes` each to `sink`, batched up to
/// `max_events_per_batch` (none: one per request), writing the delivery journal (into memory:
/// its entries built, serialized and packed into records as the function does, not sent) or
/// not.
pub async fn deliver_all(
    sink: &str,
    count: usize,
    event_bytes: usize,
    max_events_per_batch: Option<i64>,
    journal: bool,
) -> anyhow::Result<EngineRun> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = Arc::new(MemorySubscriptionStore::default());
    store.insert_validated(
        SubscriptionRequest {
            topic: "bench".into(),
            name: "sink".into(),
            endpoint: sink.into(),
            max_events_per_batch,
            ..SubscriptionRequest::default()
        },
        InputSchema::EventGridSchema,
        clock.now(),
    );
    let delivery = Arc::new(MemoryQueue::new(Arc::clone(&clock)));
    let all = events(count, event_bytes)?;
    for chunk in all.chunks(500) {
        fan_out(
            store.as_ref(),
            delivery.as_ref(),
            "bench",
            InputSchema::EventGridSchema,
            chunk,
            clock.now(),
        )
        .await?;
    }
    let settings = loopback_settings();
    let journaled = journal.then(|| Arc::new(gridrelay_ports::memory::MemoryJournal::default()));
    let ports = DeliverPorts {
        store,
        delivery_queue: delivery.clone(),
        // No handshakes in the benchmark.
        control_queue: delivery.clone(),
        replay_queue: delivery.clone(),
        dead_letter_queue: Arc::new(MemoryQueue::new(Arc::clone(&clock))),
        ordered_queue: delivery.clone(),
        ordered_redrive_queue: None,
        resources: Arc::new(gridrelay_ports::memory::MemoryDestinations::default()),
        clock: Arc::clone(&clock),
        jitter: Arc::new(RandomJitter),
        state: Arc::new(MemoryDeliveryStateStore::default()),
        secrets: Arc::new(MemorySecretStore::default()),
        caps: Arc::new(MemoryDeliveryCapStore::default()),
        journal: match &journaled {
            Some(memory) => memory.clone(),
            None => Arc::new(gridrelay_ports::NoRecordStream),
        },
        replays: Arc::new(gridrelay_ports::NoReplays),
        archive: Arc::new(gridrelay_ports::NoReplays),
    };
    let sender = Arc::new(settings.http_sender()?);
    let deliver = Deliver::new(ports, sender, settings);

    let cpu = Cpu::of_self()?;
    let start = Instant::now();
    let mut delivered = 0;
    let mut invocations = 0;
    loop {
        let received = delivery.receive(10, Duration::from_secs(900));
        if received.is_empty() {
            break;
        }
        invocations += 1;
        let deadline = Utc::now() + chrono::Duration::seconds(900);
        let outcome = deliver.handle_until(sqs_event(&received), deadline).await;
        delivered += outcome.report.delivered;
        if outcome.report.retried + outcome.report.dead_lettered > 0 {
            bail!("the sink failed requests: {:?}", outcome.report);
        }
        for m in &received {
            if !outcome.failed_message_ids.contains(&m.id) {
                delivery.delete(&m.id, m.receipt);
            }
        }
    }
    let elapsed = start.elapsed();
    let cpu = cpu.used()?;
    if delivered != count {
        bail!("{delivered} of {count} events delivered");
    }
    // The journal was written: a published and an attempt line per event, unbatched.
    if let Some(memory) = journaled {
        let lines = memory.entries().len();
        if max_events_per_batch.is_none() && lines < 2 * count {
            bail!("{lines} journal lines for {count} events");
        }
    }
    Ok(EngineRun {
        delivered,
        elapsed,
        cpu,
        invocations,
        limit: deliver.limits.limit_of(sink),
    })
}

/// wrk against the sink with requests of one event: requests per second, or why not.
pub fn wrk_ceiling(sink: &str, event_bytes: usize, connections: usize) -> anyhow::Result<f64> {
    let body = format!("[{}]", event_body(0, event_bytes));
    let script = std::env::temp_dir().join(format!("gridrelay-bench-{}.lua", std::process::id()));
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.body = {}\nwrk.headers[\"Content-Type\"] = \"application/json\"\n",
            serde_json::to_string(&body)?
        ),
    )?;
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            "-d5s",
            "-s",
            &script.to_string_lossy(),
            sink,
        ])
        .output()
        .context("run wrk (infra/local/bench.sh installs it)")?;
    let _ = std::fs::remove_file(&script);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("wrk printed no rate: {text}"))
}

/// The HTTP sender alone: `count` one-event requests to the sink, `in_flight` at
/// a time, as the engine's sender sends them: what the engine could reach if deciding, queueing
/// and settling cost nothing.
pub async fn client_ceiling(
    sink: &str,
    count: usize,
    event_bytes: usize,
    in_flight: usize,
) -> anyhow::Result<f64> {
    use futures::StreamExt;
    let sender = loopback_settings().http_sender()?;
    let body = format!("[{}]", event_body(0, event_bytes));
    let start = Instant::now();
    let results: Vec<_> = futures::stream::iter(0..count)
        .map(|_| {
            let request = gridrelay_ports::DeliveryRequest {
                answer_bytes: 0,
                endpoint: sink.to_string(),
                content_type: "application/json",
                body: body.clone(),
                headers: Vec::new(),
            };
            gridrelay_ports::EventSender::send(&sender, request)
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let failed = results
        .iter()
        .filter(|r| r.result != gridrelay_shared::classify::AttemptResult::Status(200))
        .count();
    if failed > 0 {
        bail!("{failed} requests failed");
    }
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// The deliver worker's settings, allowed to reach the loopback sink.
fn loopback_settings() -> DeliverySettings {
    DeliverySettings {
        outbound: gridrelay_shared::outbound::OutboundPolicy::new(
            gridrelay_shared::outbound::AllowedNetworks::loopback(),
        ),
        ..DeliverySettings::new(TimeScale::REAL)
    }
}
