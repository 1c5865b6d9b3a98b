//! The local stack end to end, as a user runs it: `gridrelay local` in its own process against
//! the AWS API at `AWS_ENDPOINT_URL` (moto), a topic and a subscription made with the command
//! line, events published over HTTP in arrays, delivered to a sink in this process. Measured:
//! events per second from the first publish to the last delivery, the runner's CPU time per
//! event (its process only: not the emulator's, the sink's or the publisher's), every AWS API
//! call it made (through `aws_calls`' counting proxy) and each function's billed time (the
//! runner's stop report), which `cost` prices.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gridrelay_local::batching::EventSourceBatching;
use gridrelay_local::{FrontDoor, ResourceNames};
use serde_json::Value;

use crate::aws_calls::{ARCHIVE_PUT, AwsCallCounter, CallCounts};
use crate::cost::{FunctionTime, Usage, http_api_units};
use crate::{Cpu, keyed_events, sink};

/// Memory of each function, as `infra/template.yaml` sets it.
pub const FUNCTION_MEMORY_MB: u32 = 256;

/// One end-to-end case.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub events: usize,
    pub event_bytes: usize,
    pub per_publish: usize,
    pub delay_ms: u64,
    pub max_events_per_batch: Option<u32>,
    /// The runner's `--max-requests-in-flight`, per deliver instance (none: its default).
    pub max_in_flight: Option<u32>,
    /// What publishes reach `ingest` through (#38): with a function URL, no API Gateway
    /// request is priced.
    pub front_door: FrontDoor,
    /// Whether the topic keeps an archive (#35), for [`crate::cost::ARCHIVE_RETENTION_DAYS`].
    /// A topic keeps none unless it is created with `--retention-days`: a run without one
    /// prices what a topic costs by default, and `ingest` makes no archive call.
    pub archived: bool,
    /// Whether the topic has a deduplication window (P1, #39), of
    /// [`crate::cost::DEDUP_WINDOW_SECONDS`]: `ingest` reads and marks each event's id.
    pub deduped: bool,
    /// The delivery queue's event source (#38): its batch size and window.
    pub event_source: EventSourceBatching,
    /// O1 (#39): the subscription ordered by `subject`, the events' subjects this many keys
    /// (none: unordered, each event a subject of its own).
    pub ordered_keys: Option<usize>,
}

/// How a case's topic is created.
#[derive(Debug, Clone, Copy, Default)]
pub struct TopicSettings {
    /// `--retention-days` (#35; 0: no archive).
    pub retention_days: u16,
    /// `--dedup-window-seconds` (P1; 0: off).
    pub dedup_window_seconds: u16,
}

impl TopicSettings {
    /// A topic archived for `days`.
    pub fn archived(days: u16) -> Self {
        Self {
            retention_days: days,
            ..Self::default()
        }
    }
}

/// The runner's settings a case changes.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunnerFlags {
    /// `--max-requests-in-flight` and `--max-requests-per-endpoint` (none: the defaults).
    pub max_in_flight: Option<u32>,
    /// `--front-door`.
    pub front_door: FrontDoor,
    /// `--delivery-batch-size` and `--delivery-batching-window-seconds`.
    pub event_source: EventSourceBatching,
}

/// What one case measured.
pub struct E2eRun {
    pub elapsed: Duration,
    pub cpu: Duration,
    pub requests: usize,
    /// AWS API calls from the first publish to the last delivery.
    pub calls: CallCounts,
    pub usage: Usage,
    /// When the last publish was answered, from the first publish.
    pub published: Duration,
    /// The sink every [`SAMPLE_EVERY`]: requests in flight and events delivered so far.
    pub timeline: Vec<Sample>,
    /// How long each publish took to be answered, in the order they were answered.
    pub publish_times: Vec<Duration>,
}

/// How often the timeline samples the sink.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// One look at the sink.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: Duration,
    pub in_flight: usize,
    pub delivered: usize,
}

impl E2eRun {
    /// Requests in flight at the sink, averaged over the samples from the first delivery to
    /// the last.
    pub fn mean_in_flight(&self) -> f64 {
        let busy: Vec<&Sample> = self.timeline.iter().filter(|s| s.delivered > 0).collect();
        if busy.is_empty() {
            return 0.0;
        }
        busy.iter().map(|s| s.in_flight as f64).sum::<f64>() / busy.len() as f64
    }

    /// Events delivered per second while publishing went on, and after it ended (none: it
    /// ended within a sample of the last publish).
    pub fn rates_by_phase(&self) -> (f64, Option<f64>) {
        let at_publish = self
            .timeline
            .iter()
            .take_while(|s| s.at <= self.published)
            .last()
            .map_or((Duration::ZERO, 0), |s| (s.at, s.delivered));
        let during = at_publish.1 as f64 / at_publish.0.as_secs_f64().max(1e-3);
        let total = self.timeline.last().map_or(0, |s| s.delivered);
        let after = self.elapsed.saturating_sub(at_publish.0);
        let after =
            (after > SAMPLE_EVERY * 2).then(|| (total - at_publish.1) as f64 / after.as_secs_f64());
        (during, after)
    }
}

pub(crate) struct Runner {
    child: Child,
    listen: SocketAddr,
    prefix: String,
    binary: PathBuf,
}

impl Runner {
    fn start(
        binary: PathBuf,
        prefix: String,
        aws_endpoint: &str,
        flags: RunnerFlags,
    ) -> anyhow::Result<Self> {
        let listen = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut cmd = Command::new(&binary);
        cmd.args([
            "local",
            "--no-console",
            "--listen",
            &listen.to_string(),
            "--prefix",
            &prefix,
        ]);
        if flags.front_door == FrontDoor::FunctionUrl {
            cmd.args(["--front-door", "function-url"]);
        }
        if flags.event_source != EventSourceBatching::default() {
            cmd.args([
                "--delivery-batch-size",
                &flags.event_source.batch_size().to_string(),
                "--delivery-batching-window-seconds",
                &flags.event_source.window().as_secs().to_string(),
            ]);
        }
        // A fixed total is the old shape: all of it for one endpoint.
        if let Some(n) = flags.max_in_flight {
            let n = n.to_string();
            cmd.args([
                "--max-requests-in-flight",
                &n,
                "--max-requests-per-endpoint",
                &n,
            ]);
        }
        // Every call through the counting proxy, which passes each service's on to where
        // the environment sends it.
        for (_, var) in crate::aws_calls::SERVICE_ENDPOINT_VARS {
            cmd.env_remove(var);
        }
        // BENCH_RUNNER_LOG: the runner's log filter, to see where a case's time goes.
        let log = std::env::var("BENCH_RUNNER_LOG").unwrap_or_else(|_| "warn".to_string());
        cmd.env("RUST_LOG", log)
            .env("AWS_ENDPOINT_URL", aws_endpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .envs(ResourceNames::with_prefix(&prefix).cli_env());
        let mut child = cmd.spawn().context("start gridrelay local")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_err() {
            if let Some(status) = child.try_wait()? {
                bail!("gridrelay local exited with {status}");
            }
            if Instant::now() > deadline {
                bail!("gridrelay local did not listen within 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Self {
            child,
            listen,
            prefix,
            binary,
        })
    }

    pub(crate) fn cli(&self, args: &[&str]) -> anyhow::Result<Value> {
        let out = Command::new(&self.binary)
            .args(args)
            .envs(ResourceNames::with_prefix(&self.prefix).cli_env())
            .output()?;
        if !out.status.success() {
            bail!(
                "gridrelay {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

impl Runner {
    /// Starts a runner, creates topic `bench` and its subscription `sink` to `hook` with the
    /// command line, and waits for its handshake; answers the runner and the topic's key.
    pub(crate) async fn with_subscription(
        binary: PathBuf,
        prefix: String,
        aws_endpoint: &str,
        flags: RunnerFlags,
        max_events_per_batch: Option<u32>,
        hook: String,
        settings: TopicSettings,
    ) -> anyhow::Result<(Self, String)> {
        let runner = Runner::start(binary, prefix, aws_endpoint, flags)?;
        let key = runner
            .topic_with_subscription(("bench", settings), "sink", &hook, max_events_per_batch)
            .await?;
        Ok((runner, key))
    }

    /// Creates `topic` (with `settings`) and its subscription `name` to `hook` with the
    /// command line, and waits for its handshake; answers the topic's key.
    pub(crate) async fn topic_with_subscription(
        &self,
        (topic, settings): (&str, TopicSettings),
        name: &str,
        hook: &str,
        max_events_per_batch: Option<u32>,
    ) -> anyhow::Result<String> {
        let key = self.topic(topic, settings)?;
        self.subscription(topic, name, hook, max_events_per_batch)
            .await?;
        Ok(key)
    }

    /// Creates `topic` with `settings`; answers its key.
    pub(crate) fn topic(&self, topic: &str, settings: TopicSettings) -> anyhow::Result<String> {
        let days = settings.retention_days.to_string();
        let window = settings.dedup_window_seconds.to_string();
        let created = self.cli(&[
            "topic",
            "create",
            "--name",
            topic,
            "--retention-days",
            &days,
            "--dedup-window-seconds",
            &window,
        ])?;
        Ok(created["key1"]
            .as_str()
            .context("topic create printed no key1")?
            .to_string())
    }

    /// Creates `topic`'s subscription `name` to `hook` and waits for its handshake.
    pub(crate) async fn subscription(
        &self,
        topic: &str,
        name: &str,
        hook: &str,
        max_events_per_batch: Option<u32>,
    ) -> anyhow::Result<()> {
        let mut create = vec![
            "event-subscription".to_string(),
            "create".into(),
            "--topic-name".into(),
            topic.into(),
            "--name".into(),
            name.into(),
            "--endpoint".into(),
            hook.into(),
        ];
        if let Some(n) = max_events_per_batch {
            create.extend(["--max-events-per-batch".into(), n.to_string()]);
        }
        self.cli(&create.iter().map(String::as_str).collect::<Vec<_>>())?;
        let show = [
            "event-subscription",
            "show",
            "--topic-name",
            topic,
            "--name",
            name,
        ];
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.cli(&show)?["provisioningState"] != "Succeeded" {
            if Instant::now() > deadline {
                bail!("subscription {topic}/{name} was not validated within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Where topic `bench` is published to.
    pub(crate) fn publish_url(&self) -> String {
        self.topic_url("bench")
    }

    /// Where `topic` is published to.
    pub(crate) fn topic_url(&self, topic: &str) -> String {
        format!(
            "http://{}/topics/{topic}/api/events?api-version=2018-01-01",
            self.listen
        )
    }

    /// The resources' names.
    pub(crate) fn names(&self) -> ResourceNames {
        ResourceNames::with_prefix(&self.prefix)
    }

    /// Stops the runner as a user would (SIGTERM) and reads its stop report.
    pub(crate) fn stop(mut self) -> anyhow::Result<Value> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status()?;
        if !sent.success() {
            bail!("kill -TERM {pid} failed");
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("gridrelay local did not stop within 60 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut out = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            std::io::Read::read_to_string(&mut stdout, &mut out)?;
        }
        serde_json::Deserializer::from_str(&out)
            .into_iter::<Value>()
            .filter_map(Result::ok)
            .find_map(|v| v.get("stopped").cloned())
            .with_context(|| format!("no stop report from gridrelay local: {out}"))
    }
}

fn function_time(report: &Value, function: &str) -> FunctionTime {
    FunctionTime {
        invocations: report[function]["invocations"].as_u64().unwrap_or(0),
        billed_ms: report[function]["billedMs"].as_u64().unwrap_or(0),
        memory_mb: FUNCTION_MEMORY_MB,
    }
}

/// What was counted, as the cost model takes it.
fn usage(events: usize, publish_units: u64, calls: &CallCounts, report: &Value) -> Usage {
    let sum = |pred: &dyn Fn(&str) -> bool, billed: bool| -> u64 {
        calls
            .iter()
            .filter(|(op, _)| pred(op))
            .map(|(_, c)| if billed { c.billed_units } else { c.calls })
            .sum()
    };
    let dynamo_read = |op: &str| {
        [
            "GetItem",
            "BatchGetItem",
            "Query",
            "Scan",
            "TransactGetItems",
        ]
        .iter()
        .any(|r| op == format!("dynamodb:{r}"))
    };
    Usage {
        events: events as u64,
        http_api_units: publish_units,
        ingest: function_time(report, "ingest"),
        deliver: function_time(report, "deliver"),
        dead_letter: function_time(report, "deadLetter"),
        sqs_chunks: sum(&|op| op.starts_with("sqs:"), true),
        // Billed units: a batch call's items each.
        dynamodb_reads: sum(&|op| dynamo_read(op), true),
        dynamodb_writes: sum(
            &|op| op.starts_with("dynamodb:") && !dynamo_read(op) && !op.contains("Describe"),
            true,
        ),
        // S3 prices LIST with PUT, COPY and POST.
        s3_puts: sum(
            &|op| op == "s3:PUT" || op == "s3:POST" || op == "s3:LIST",
            false,
        ),
        s3_gets: sum(&|op| op == "s3:GET" || op == "s3:HEAD", false),
        secrets_calls: sum(&|op| op.starts_with("secretsmanager:"), false),
        firehose_steps: sum(&|op| op == "firehose:PutRecordBatch", true),
        journal_stored_bytes: calls
            .iter()
            .filter(|(op, _)| op.as_str() == "firehose:PutRecordBatch")
            .map(|(_, c)| c.stored_bytes)
            .sum(),
        archive_steps: sum(&|op| op == ARCHIVE_PUT, true),
        archive_stored_bytes: calls
            .iter()
            .filter(|(op, _)| op.as_str() == ARCHIVE_PUT)
            .map(|(_, c)| c.stored_bytes)
            .sum(),
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one case on a fresh set of resources (named with `prefix`).
pub async fn run(
    binary: PathBuf,
    prefix: String,
    case: Case,
    aws: &AwsCallCounter,
) -> anyhow::Result<E2eRun> {
    let (hook, counts) =
        sink::serve("127.0.0.1:0".parse()?, Duration::from_millis(case.delay_ms)).await?;
    // The stop report covers the runner's whole life, so the calls do too: its setup (a
    // topic, a subscription and its handshake) and its polling are part of the count.
    aws.take();
    let (runner, key) = Runner::with_subscription(
        binary,
        prefix,
        &aws.url,
        RunnerFlags {
            max_in_flight: case.max_in_flight,
            front_door: case.front_door,
            event_source: case.event_source,
        },
        case.max_events_per_batch,
        hook,
        // Archived for 7 days (#35), deduplicated within 5 minutes (P1), where the case says
        // so: the cost table prices it.
        TopicSettings {
            retention_days: if case.archived {
                crate::cost::ARCHIVE_RETENTION_DAYS as u16
            } else {
                0
            },
            dedup_window_seconds: if case.deduped {
                crate::cost::DEDUP_WINDOW_SECONDS
            } else {
                0
            },
        },
    )
    .await?;
    if case.ordered_keys.is_some() {
        // Before the first publish: `ingest` reads the subscription once it is published to.
        runner.cli(&[
            "event-subscription",
            "update",
            "--topic-name",
            "bench",
            "--name",
            "sink",
            "--ordering-key",
            "subject",
        ])?;
    }

    let bodies: Vec<String> = keyed_events(case.events, case.event_bytes, case.ordered_keys)?
        .chunks(case.per_publish)
        .map(|chunk| {
            let parts: Vec<&str> = chunk.iter().map(|e| e.get()).collect();
            format!("[{}]", parts.join(","))
        })
        .collect();
    let url = runner.publish_url();
    // A function URL has no price of its own: only the HTTP API meters publishes.
    let publish_units: u64 = match case.front_door {
        FrontDoor::HttpApi => bodies.iter().map(|b| http_api_units(b.len())).sum(),
        FrontDoor::FunctionUrl => 0,
    };
    let client = reqwest::Client::new();
    let cpu = Cpu::of_process(runner.child.id())?;
    let start = Instant::now();
    let sampler = {
        let counts = Arc::clone(&counts);
        tokio::spawn(async move {
            let mut timeline = Vec::new();
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            loop {
                tick.tick().await;
                let delivered = counts.events.load(Ordering::Relaxed);
                timeline.push(Sample {
                    at: start.elapsed(),
                    in_flight: counts.in_flight.load(Ordering::Relaxed),
                    delivered,
                });
                if delivered >= case.events {
                    return timeline;
                }
            }
        })
    };
    // Four publishers, as a busy application would have.
    let queue = Arc::new(std::sync::Mutex::new(bodies.into_iter()));
    let publish_times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let publishers = (0..4).map(|_| {
        let (client, url, key, queue) = (client.clone(), url.clone(), key.clone(), queue.clone());
        let publish_times = Arc::clone(&publish_times);
        tokio::spawn(async move {
            loop {
                let next = queue.lock().map(|mut q| q.next()).unwrap_or(None);
                let Some(body) = next else {
                    return Ok::<(), anyhow::Error>(());
                };
                let began = Instant::now();
                publish(&client, &url, &key, body).await?;
                if let Ok(mut times) = publish_times.lock() {
                    times.push(began.elapsed());
                }
            }
        })
    });
    for p in futures_join(publishers.collect()).await {
        p??;
    }
    let published = start.elapsed();
    let deadline = Instant::now() + Duration::from_secs(900);
    while counts.events.load(Ordering::Relaxed) < case.events {
        if Instant::now() > deadline {
            bail!(
                "{} of {} events delivered after 15 minutes",
                counts.events.load(Ordering::Relaxed),
                case.events
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = start.elapsed();
    let cpu = cpu.used()?;
    let timeline = sampler.await?;
    let calls = aws.take();
    let names = runner.names();
    let report = runner.stop()?;
    delete_streams(&names).await?;
    Ok(E2eRun {
        elapsed,
        cpu,
        requests: counts.requests.load(Ordering::Relaxed),
        usage: usage(case.events, publish_units, &calls, &report),
        calls,
        published,
        timeline,
        publish_times: publish_times.lock().map(|t| t.clone()).unwrap_or_default(),
    })
}

/// Deletes a finished case's Firehose streams (its journal's and its archive classes'),
/// straight at the emulator, not through the counting proxy: `make bench` runs many cases on
/// one moto, and moto's server allows 1,000 streams.
async fn delete_streams(names: &ResourceNames) -> anyhow::Result<()> {
    let firehose = aws_sdk_firehose::Client::new(&gridrelay_e2e::sdk_config().await);
    for stream in std::iter::once(&names.journal_stream).chain(names.archive_streams.values()) {
        let deleted = firehose
            .delete_delivery_stream()
            .delivery_stream_name(stream)
            .send()
            .await;
        if let Err(e) = deleted
            && !e
                .as_service_error()
                .is_some_and(|e| e.is_resource_not_found_exception())
        {
            return Err(anyhow::Error::new(e).context(format!("delete the stream {stream}")));
        }
    }
    Ok(())
}

/// Publishes `body` (a JSON array of events) with the topic's key; an answer other than 2xx is
/// an error.
pub(crate) async fn publish(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: String,
) -> anyhow::Result<()> {
    let response = client
        .post(url)
        .header("aeg-sas-key", key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("publish answered {}", response.status());
    }
    Ok(())
}

async fn futures_join<T>(
    handles: Vec<tokio::task::JoinHandle<T>>,
) -> Vec<Result<T, tokio::task::JoinError>> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await);
    }
    out
}
