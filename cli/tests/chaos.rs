//! Chaos on the real local stack (#8; G1 at-least-once, L2 dead-lettering, F1 filters, O1
//! ordered delivery).
//!
//! `gridrelay local` runs as its own process against the AWS API at `AWS_ENDPOINT_URL` (moto),
//! as a user runs it. Five subscriptions (one event per request, batches of ten, a filter, the
//! CloudEvents schema, and batches of ten ordered by a key in `data`) point at real HTTP
//! subscribers on 127.0.0.1 that fail about 30 % of the requests: 500, 503, or hang past the
//! attempt timeout.
//! The ordered one's events have a key each (`CHAOS_ORDERED_KEYS`, by default one per 25
//! events). No event may first reach it after a later event of its key did, nor while an
//! earlier event of its key that reached it was neither answered 2xx nor dead-lettered (O1; an
//! event may come again after later ones: G1's duplicates). In long runs (`CHAOS_RESOURCES=1`)
//! four more give the even events to an SQS queue, an SNS topic, an EventBridge bus and a
//! Kinesis stream (S4), read as they arrive. While events are published the process
//! is killed with SIGKILL several times (during publishing and during delivery) and restarted.
//! When it is quiet, every published event must have reached every subscription whose filter it
//! passes — answered 2xx, or written to the subscription's dead-letter objects — and nothing may
//! reach a subscription it is not for. Duplicates are allowed (at-least-once) and reported.
//!
//! `make test` runs a short run (400 events, 3 kills; `CHAOS_RUST_LOG` sets the runner's log level,
//! warn by default). `make soak` runs the same test with
//! `CHAOS_EVENTS=5000 CHAOS_KILLS=2`, once for each of its 20 segments, each on a fresh moto,
//! and prints the figures. `CHAOS_SEED` fixes the
//! subscribers' failures (the process's timing stays the machine's). `CHAOS_JOURNAL=0` runs the
//! runner with `--no-journal`, to measure what the delivery journal costs the run.
//!
//! Once the subscriptions are validated, the runner is started again behind the fault proxy
//! (`gridrelay_e2e::fault_proxy`, #34 item 10): a share `CHAOS_AWS_FAULTS` (default 0.05; 0
//! for none) of its SQS, DynamoDB, S3, Secrets Manager, SNS, EventBridge, Kinesis and Firehose
//! (the journal's) calls is
//! answered with the service's throttling error, and a quarter of that share with its internal
//! error.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::OpenOptions;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use gridrelay_adapters::aws::{S3ObjectStore, s3_client};
use gridrelay_e2e::fault_proxy::{FaultProxy, FaultRule, SERVICES, per_service_endpoint_variables};
use gridrelay_e2e::{
    create_queue, delivered_events, eventually, request_origin, sdk_config, validation_code,
};
use gridrelay_local::ResourceNames;
use gridrelay_ports::ObjectStore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// Every wait of the delivery contract, multiplied: attempts time out after 0.6 s, the late-answer
/// window is 3.6 s, dead-letter writes follow the last attempt by 6 s.
const TIME_SCALE: &str = "0.02";
/// Attempts per event before it is dead-lettered: with 30 % failures about 1 % of events are.
const MAX_DELIVERY_ATTEMPTS: &str = "4";
/// How long a hanging subscriber waits before it answers 503 (past the scaled attempt timeout).
const HANG: Duration = Duration::from_secs(1);
const TOPIC: &str = "chaos";
const EVEN: &str = "Chaos.Even";

/// How big a run is.
struct RunSize {
    events: usize,
    kills: usize,
    /// Events per publish request.
    per_request: usize,
    /// Pause between publish requests, so kills land while publishing.
    pace: Duration,
    /// The runner's function timeout and visibility timeout (seconds): what a killed
    /// invocation's messages wait before they are received again (`CHAOS_FUNCTION_TIMEOUT`;
    /// 21 in short runs, the shortest the runner accepts at this time scale, 60 in long ones).
    /// The worker keeps 10 s for its reads and 10 s for its writes, so short ones hand most
    /// events of a large run on, over and over.
    function_timeout: u64,
    seed: u64,
    /// The share of the runner's AWS calls throttled (`CHAOS_AWS_FAULTS`, default 0.05); 0:
    /// no proxy.
    aws_faults: f64,
    /// Whether four more subscriptions deliver to AWS resources (`CHAOS_RESOURCES`, 1 or 0;
    /// by default in long runs only: `make test`'s end-to-end suite throttles them apart).
    resources: bool,
    /// Whether `deliver` writes the delivery journal (`CHAOS_JOURNAL`, 1 or 0; default 1), so
    /// a run can measure what the journal costs.
    journal: bool,
    /// How many keys the ordered subscription's events have (`CHAOS_ORDERED_KEYS`; by default
    /// one per 25 events): event `i`'s is `i % ordered_keys`.
    ordered_keys: usize,
}

impl RunSize {
    fn from_env() -> Self {
        let number = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .map(|v| {
                    v.parse::<u64>()
                        .unwrap_or_else(|_| panic!("{name}={v}: expected a whole number"))
                })
                .unwrap_or(default)
        };
        let events = number("CHAOS_EVENTS", 400) as usize;
        let short = events <= 2_000;
        Self {
            events,
            kills: number("CHAOS_KILLS", 3) as usize,
            per_request: if short { 10 } else { 100 },
            pace: if short {
                Duration::from_millis(100)
            } else {
                Duration::ZERO
            },
            function_timeout: number("CHAOS_FUNCTION_TIMEOUT", if short { 21 } else { 60 }),
            seed: number("CHAOS_SEED", rand::rng().random()),
            aws_faults: std::env::var("CHAOS_AWS_FAULTS")
                .ok()
                .map(|v| {
                    v.parse::<f64>()
                        .ok()
                        .filter(|r| (0.0..=1.0).contains(r))
                        .unwrap_or_else(|| panic!("CHAOS_AWS_FAULTS={v}: expected 0 to 1"))
                })
                .unwrap_or(0.05),
            resources: number("CHAOS_RESOURCES", u64::from(!short)) == 1,
            journal: number("CHAOS_JOURNAL", 1) == 1,
            ordered_keys: number("CHAOS_ORDERED_KEYS", events.div_ceil(25).max(1) as u64).max(1)
                as usize,
        }
    }

    /// How long after publishing the run may take to become quiet before what is missing counts
    /// as lost.
    fn settle_timeout(&self) -> Duration {
        Duration::from_secs(240 + (self.events / 100) as u64)
    }
}

/// A subscription of the run and what its subscriber saw.
struct Endpoint {
    name: &'static str,
    /// Only events of this type are for it (its filter), if set.
    only_type: Option<&'static str>,
    rng: Mutex<StdRng>,
    /// Times each event id was answered 2xx.
    delivered: Mutex<HashMap<String, u32>>,
    /// Events it received that were not for it.
    misdelivered: AtomicUsize,
    requests: AtomicUsize,
    /// For the ordered subscription (O1): the order in which each key's events first arrived.
    order: Option<Mutex<KeyOrder>>,
}

/// What reached an ordered subscription, key by key (O1).
#[derive(Default)]
struct KeyOrder {
    /// Events that arrived at least once (answered or not).
    arrived: HashSet<usize>,
    /// Events that first arrived after a later event of their key.
    reordered: Vec<String>,
    /// Each key's arrivals, in order (event numbers), to show what happened to a key.
    arrivals: HashMap<u64, Vec<usize>>,
    /// Each key's events that arrived, in the order they first did.
    first_arrivals: HashMap<u64, Vec<usize>>,
    /// (earlier, later) of one key: the later first arrived while the earlier had arrived
    /// but was not answered 2xx (allowed only if the earlier was dead-lettered).
    overtaken: Vec<(usize, usize)>,
}

impl KeyOrder {
    /// Notes the arrival of `events` (a request's, answered or not); `delivered` holds the
    /// events answered 2xx so far.
    fn arrive(&mut self, events: &[Value], delivered: &HashMap<String, u32>) {
        for event in events {
            let n = event["id"]
                .as_str()
                .and_then(|id| id.strip_prefix("ev-"))
                .and_then(|n| n.parse::<usize>().ok());
            let (Some(n), Some(key)) = (n, event["data"]["key"].as_u64()) else {
                self.reordered.push(format!("not the run's: {event}"));
                continue;
            };
            self.arrivals.entry(key).or_default().push(n);
            if !self.arrived.insert(n) {
                continue;
            }
            let earlier = self.first_arrivals.entry(key).or_default();
            if let Some(latest) = earlier.iter().max().filter(|&&latest| latest > n) {
                self.reordered.push(format!(
                    "key {key}: ev-{n} first arrived after ev-{latest} (arrivals: {:?})",
                    self.arrivals[&key]
                ));
            }
            self.overtaken.extend(
                earlier
                    .iter()
                    .filter(|&&m| m < n && !delivered.contains_key(&format!("ev-{m}")))
                    .map(|&m| (m, n)),
            );
            earlier.push(n);
        }
    }
}

impl Endpoint {
    fn new(name: &'static str, only_type: Option<&'static str>, seed: u64) -> Self {
        Self {
            name,
            only_type,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            delivered: Mutex::new(HashMap::new()),
            misdelivered: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            order: None,
        }
    }

    /// An endpoint that checks the order of each key's events (O1).
    fn ordered(mut self) -> Self {
        self.order = Some(Mutex::new(KeyOrder::default()));
        self
    }

    fn is_for(&self, event_type: &str) -> bool {
        self.only_type.is_none_or(|t| t == event_type)
    }

    /// Counts `events` as received by this subscription (Event Grid schema or CloudEvents),
    /// and as misdelivered those that are not the run's or not for it.
    fn record(&self, events: &[Value]) {
        let mut delivered = self.delivered.lock().expect("subscriber state");
        for event in events {
            let id = event["id"].as_str().unwrap_or_default();
            let event_type = event["eventType"]
                .as_str()
                .or(event["type"].as_str())
                .unwrap_or_default();
            if !id.starts_with("ev-") || !self.is_for(event_type) {
                self.misdelivered.fetch_add(1, Ordering::Relaxed);
            }
            *delivered.entry(id.to_string()).or_insert(0) += 1;
        }
    }
}

/// An AWS resource a subscription of the run delivers to (S4), and where the test reads what
/// reached it: a queue (the SNS topic's and the EventBridge bus's each feed one) or the stream.
enum Resource {
    Queue { url: String },
    Topic { url: String },
    Bus { url: String },
    Stream { name: String },
}

/// Creates the run's four AWS resource destinations: their ARNs and how to read them.
async fn resources(
    sdk: &aws_config::SdkConfig,
    prefix: &str,
) -> Vec<(&'static str, String, Resource)> {
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let queue = |name: String| {
        let sqs = sqs.clone();
        async move { create_queue(&sqs, &name).await }
    };
    let (queue_url, queue_arn) = queue(format!("{prefix}-to-queue")).await;

    let sns = aws_sdk_sns::Client::new(sdk);
    let topic_arn = sns
        .create_topic()
        .name(format!("{prefix}-topic"))
        .send()
        .await
        .expect("topic created")
        .topic_arn()
        .expect("a topic ARN")
        .to_string();
    let (topic_url, topic_queue) = queue(format!("{prefix}-from-topic")).await;
    sns.subscribe()
        .topic_arn(&topic_arn)
        .protocol("sqs")
        .endpoint(&topic_queue)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .expect("queue subscribed to the topic");

    let events = aws_sdk_eventbridge::Client::new(sdk);
    let bus = format!("{prefix}-bus");
    let bus_arn = events
        .create_event_bus()
        .name(&bus)
        .send()
        .await
        .expect("bus created")
        .event_bus_arn()
        .expect("a bus ARN")
        .to_string();
    let (bus_url, bus_queue) = queue(format!("{prefix}-from-bus")).await;
    events
        .put_rule()
        .name("chaos")
        .event_bus_name(&bus)
        .event_pattern(json!({"detail-type": [EVEN]}).to_string())
        .send()
        .await
        .expect("rule");
    events
        .put_targets()
        .rule("chaos")
        .event_bus_name(&bus)
        .targets(
            aws_sdk_eventbridge::types::Target::builder()
                .id("queue")
                .arn(&bus_queue)
                .build()
                .expect("a target"),
        )
        .send()
        .await
        .expect("target");

    let kinesis = aws_sdk_kinesis::Client::new(sdk);
    let stream = format!("{prefix}-stream");
    kinesis
        .create_stream()
        .stream_name(&stream)
        .shard_count(1)
        .send()
        .await
        .expect("stream created");
    let stream_arn = eventually(Duration::from_secs(60), "the stream active", || async {
        kinesis
            .describe_stream_summary()
            .stream_name(&stream)
            .send()
            .await
            .ok()
            .and_then(|d| d.stream_description_summary().cloned())
            .filter(|d| d.stream_status() == &aws_sdk_kinesis::types::StreamStatus::Active)
            .map(|d| d.stream_arn().to_string())
    })
    .await;
    vec![
        ("to-queue", queue_arn, Resource::Queue { url: queue_url }),
        ("to-topic", topic_arn, Resource::Topic { url: topic_url }),
        ("to-bus", bus_arn, Resource::Bus { url: bus_url }),
        ("to-stream", stream_arn, Resource::Stream { name: stream }),
    ]
}

/// Reads what reaches `resource`, for as long as the run lasts, into `endpoint`'s counts.
async fn drain(sdk: aws_config::SdkConfig, resource: Resource, endpoint: Arc<Endpoint>) {
    let url = match resource {
        Resource::Stream { name } => return drain_stream(sdk, name, endpoint).await,
        Resource::Queue { url } | Resource::Topic { url } | Resource::Bus { url } => url,
    };
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    loop {
        let Ok(out) = sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        for m in out.messages() {
            let body: Value =
                serde_json::from_str(m.body().unwrap_or_default()).unwrap_or_default();
            // The bus's messages are EventBridge's envelope, the event its `detail`.
            let event = if body.get("detail-type").is_some() {
                body["detail"].clone()
            } else {
                body
            };
            endpoint.record(&[event]);
            if let Some(receipt) = m.receipt_handle() {
                let _ = sqs
                    .delete_message()
                    .queue_url(&url)
                    .receipt_handle(receipt)
                    .send()
                    .await;
            }
        }
    }
}

/// Reads the run's one-shard stream from its start, for as long as the run lasts.
async fn drain_stream(sdk: aws_config::SdkConfig, name: String, endpoint: Arc<Endpoint>) {
    let kinesis = aws_sdk_kinesis::Client::new(&sdk);
    let mut iterator = kinesis
        .get_shard_iterator()
        .stream_name(&name)
        .shard_id("shardId-000000000000")
        .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
        .send()
        .await
        .expect("a shard iterator")
        .shard_iterator()
        .map(str::to_string);
    while let Some(current) = iterator.take() {
        let Ok(read) = kinesis.get_records().shard_iterator(&current).send().await else {
            iterator = Some(current);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let events: Vec<Value> = read
            .records()
            .iter()
            .filter_map(|r| serde_json::from_slice(r.data().as_ref()).ok())
            .collect();
        endpoint.record(&events);
        if events.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        iterator = read.next_shard_iterator().map(str::to_string);
    }
}

/// A real subscriber on 127.0.0.1: answers the validation handshakes, then fails about 30 % of
/// the requests.
async fn serve(endpoint: Arc<Endpoint>) -> String {
    let app = Router::new()
        .route("/hook", axum::routing::post(receive).options(allow_origin))
        .with_state(endpoint);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a subscriber");
    let addr = listener.local_addr().expect("subscriber address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/hook")
}

async fn receive(
    State(endpoint): State<Arc<Endpoint>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let Some(events) = delivered_events(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    if let Some(code) = validation_code(&headers, &events) {
        return axum::Json(json!({"validationResponse": code})).into_response();
    }
    endpoint.requests.fetch_add(1, Ordering::Relaxed);
    if let Some(order) = &endpoint.order {
        let delivered = endpoint.delivered.lock().expect("subscriber state");
        order
            .lock()
            .expect("subscriber state")
            .arrive(&events, &delivered);
    }
    let roll = endpoint
        .rng
        .lock()
        .map(|mut r| r.random_range(0..100u32))
        .unwrap_or(0);
    match roll {
        0..10 => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        10..20 => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        20..30 => {
            tokio::time::sleep(HANG).await;
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        _ => {}
    }
    endpoint.record(&events);
    StatusCode::OK.into_response()
}

/// CloudEvents webhook abuse protection.
async fn allow_origin(headers: HeaderMap) -> Response {
    let origin = request_origin(&headers);
    (StatusCode::OK, [("WebHook-Allowed-Origin", origin)]).into_response()
}

/// `gridrelay local` as a child process that can be killed and started again.
struct LocalProcess {
    prefix: String,
    listen: SocketAddr,
    log: PathBuf,
    child: Option<Child>,
    starts: usize,
    /// Seconds, for both the function and the visibility timeout.
    function_timeout: String,
    /// Where the runner's AWS calls go instead of `AWS_ENDPOINT_URL` (the fault proxy); the
    /// test's own commands always go straight to the emulator.
    aws_endpoint: Option<String>,
    /// Whether the runner writes the delivery journal (`--no-journal` when not).
    journal: bool,
}

impl LocalProcess {
    fn new(prefix: &str, function_timeout: u64) -> Self {
        let listen = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{prefix}.log"));
        Self {
            prefix: prefix.to_string(),
            listen,
            log,
            child: None,
            starts: 0,
            function_timeout: function_timeout.to_string(),
            aws_endpoint: None,
            journal: true,
        }
    }

    fn env(&self, cmd: &mut Command) {
        cmd.envs(ResourceNames::with_prefix(&self.prefix).cli_env())
            .env("GRIDRELAY_TIME_SCALE", TIME_SCALE);
    }

    /// Starts the runner and waits until its publish API accepts connections. Behind the fault
    /// proxy a start can fail (a throttled call its SDK gave up on while it provisions): it is
    /// started again, as a supervisor would, up to five times.
    fn start(&mut self) {
        for tries in 1.. {
            match self.try_start() {
                Ok(()) => return,
                Err(why) if self.aws_endpoint.is_some() && tries < 5 => {
                    eprintln!("chaos: start {tries} failed ({why}); starting again");
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    fn try_start(&mut self) -> Result<(), String> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the runner's log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gridrelay"));
        cmd.args([
            "local",
            "--no-console",
            "--listen",
            &self.listen.to_string(),
            "--prefix",
            &self.prefix,
            "--function-timeout",
            &self.function_timeout,
            "--visibility-timeout",
            &self.function_timeout,
        ]);
        if !self.journal {
            cmd.arg("--no-journal");
        }
        // `CHAOS_RUST_LOG=info` keeps every invocation's line (its phases' times) in the log.
        cmd.env(
            "RUST_LOG",
            std::env::var("CHAOS_RUST_LOG").unwrap_or_else(|_| "warn".to_string()),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log);
        self.env(&mut cmd);
        if let Some(endpoint) = &self.aws_endpoint {
            cmd.env("AWS_ENDPOINT_URL", endpoint);
            for variable in per_service_endpoint_variables() {
                cmd.env(variable, endpoint);
            }
        }
        let mut child = cmd.spawn().expect("gridrelay local starts");
        self.starts += 1;
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect_timeout(&self.listen, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "gridrelay local exited with {status}; see {}",
                    self.log.display()
                ));
            }
            assert!(
                Instant::now() < deadline,
                "gridrelay local did not listen within 60 s; see {}",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL: no shutdown, no flush; whatever was in flight is left to the queues.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn cli(&self, args: &[&str]) -> Value {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gridrelay"));
        cmd.args(args);
        self.env(&mut cmd);
        let out: Output = cmd.output().expect("gridrelay runs");
        assert!(
            out.status.success(),
            "gridrelay {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON on stdout")
    }
}

impl Drop for LocalProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn event_type(i: usize) -> &'static str {
    if i.is_multiple_of(2) {
        EVEN
    } else {
        "Chaos.Odd"
    }
}

/// The ids of the events (of `0..events`) that `endpoint` is owed.
fn owed_ids(endpoint: &Endpoint, events: usize) -> impl Iterator<Item = String> + '_ {
    (0..events)
        .filter(|i| endpoint.is_for(event_type(*i)))
        .map(|i| format!("ev-{i}"))
}

/// Event `i` of the run; its key (for the ordered subscription) is `i % keys`.
fn event(i: usize, keys: usize) -> Value {
    json!({
        "id": format!("ev-{i}"),
        "subject": format!("/chaos/{i}"),
        "eventType": event_type(i),
        "eventTime": "2026-11-23T20:00:00Z",
        "dataVersion": "1",
        "data": {"n": i, "key": i % keys}
    })
}

/// Deliveries owed for the first `published` events but not yet answered 2xx, beyond which the
/// publisher waits: a large run is a sustained load, not one burst whose backlog the emulator
/// (whose SQS slows with every message it holds) would take hours to drain. Dead-lettered
/// events count as outstanding, so the window grows with the run (about 1 % are).
fn outstanding_limit(owed: usize) -> usize {
    2_000 + owed / 50
}

/// Publishes every event, each request retried until it is answered 200 (through kills),
/// keeping at most [`outstanding_limit`] deliveries outstanding.
async fn publish_all(
    url: String,
    key: String,
    size: RunSize,
    published: Arc<AtomicUsize>,
    endpoints: Vec<Arc<Endpoint>>,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client");
    let mut start = 0;
    // Deliveries owed for the events published so far.
    let mut owed: usize = 0;
    while start < size.events {
        loop {
            let answered: usize = endpoints
                .iter()
                .map(|e| e.delivered.lock().map(|d| d.len()).unwrap_or(0))
                .sum();
            if owed.saturating_sub(answered) <= outstanding_limit(owed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let end = (start + size.per_request).min(size.events);
        let body =
            Value::Array((start..end).map(|i| event(i, size.ordered_keys)).collect()).to_string();
        loop {
            let sent = http
                .post(&url)
                .header("aeg-sas-key", &key)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            match sent.map(|r| r.status().as_u16()) {
                Ok(200) => break,
                Ok(status) if (400..500).contains(&status) => {
                    panic!("publish refused with {status}: the run's events are valid")
                }
                // Killed mid-request, restarting, or a 5xx: publish again.
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        owed += (start..end)
            .map(|i| endpoints.iter().filter(|e| e.is_for(event_type(i))).count())
            .sum::<usize>();
        start = end;
        published.store(start, Ordering::SeqCst);
        tokio::time::sleep(size.pace).await;
    }
}

/// Event ids in every dead-letter object under `prefix`, each object read once.
async fn dead_lettered(
    objects: &S3ObjectStore,
    bucket: &str,
    prefix: &str,
    seen: &mut HashMap<String, Vec<String>>,
) -> HashSet<String> {
    for key in objects.list(bucket, prefix).await.unwrap_or_default() {
        if seen.contains_key(&key) {
            continue;
        }
        let Ok(body) = objects.get(bucket, &key).await else {
            continue;
        };
        let records: Vec<Value> =
            serde_json::from_str(&body).expect("a dead-letter object is a JSON array");
        let ids = records
            .iter()
            .map(|r| r["id"].as_str().unwrap_or_default().to_string())
            .collect();
        seen.insert(key, ids);
    }
    seen.values().flatten().cloned().collect()
}

/// G1, L2, F1, O1: through SIGKILLs of the whole runner, every published event reaches every
/// subscription it is for (2xx or dead-lettered), none reaches one it is not for, and the
/// ordered subscription never gets an event of a key before one published earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_runner_loses_nothing_g1_l2_o1() {
    let size = RunSize::from_env();
    let prefix = format!("chaos-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let began = Instant::now();
    let mut local = LocalProcess::new(&prefix, size.function_timeout);
    local.journal = size.journal;
    local.start();

    let bucket = format!("{prefix}-dead-letters");
    let mut endpoints = vec![
        Arc::new(Endpoint::new("single", None, size.seed)),
        Arc::new(Endpoint::new("batched", None, size.seed ^ 1)),
        Arc::new(Endpoint::new("filtered", Some(EVEN), size.seed ^ 2)),
        Arc::new(Endpoint::new("cloudevents", None, size.seed ^ 3)),
        Arc::new(Endpoint::new("ordered", None, size.seed ^ 4).ordered()),
    ];
    let topic = local.cli(&["topic", "create", "--name", TOPIC]);
    let key = topic["key1"].as_str().expect("topic key").to_string();
    let sdk = sdk_config().await;
    // S4: an SQS queue, an SNS topic, an EventBridge bus and a Kinesis stream, each given the
    // even events, and read by the test as they arrive.
    let mut endpoint_urls = BTreeMap::new();
    let destinations = if size.resources {
        resources(&sdk, &prefix).await
    } else {
        Vec::new()
    };
    for (name, arn, resource) in destinations {
        let endpoint = Arc::new(Endpoint::new(name, Some(EVEN), size.seed));
        tokio::spawn(drain(sdk.clone(), resource, Arc::clone(&endpoint)));
        endpoint_urls.insert(name, arn);
        endpoints.push(endpoint);
    }
    for endpoint in &endpoints {
        let url = match endpoint_urls.get(endpoint.name) {
            Some(arn) => arn.clone(),
            None => serve(Arc::clone(endpoint)).await,
        };
        let dead_letters = format!("s3://{bucket}/{}", endpoint.name);
        let mut args = vec![
            "event-subscription",
            "create",
            "--topic-name",
            TOPIC,
            "--name",
            endpoint.name,
            "--endpoint",
            &url,
            "--max-delivery-attempts",
            MAX_DELIVERY_ATTEMPTS,
            "--deadletter-endpoint",
            &dead_letters,
        ];
        match endpoint.name {
            "batched" => args.extend(["--max-events-per-batch", "10"]),
            "filtered" | "to-queue" | "to-topic" | "to-bus" | "to-stream" => {
                args.extend(["--included-event-types", EVEN])
            }
            "cloudevents" => args.extend(["--event-delivery-schema", "cloudeventschemav1_0"]),
            "ordered" => {
                args.extend(["--ordering-key", "data.key", "--max-events-per-batch", "10"])
            }
            _ => {}
        }
        local.cli(&args);
    }
    for endpoint in &endpoints {
        let show = [
            "event-subscription",
            "show",
            "--topic-name",
            TOPIC,
            "--name",
            endpoint.name,
        ];
        let what = format!("{} validated", endpoint.name);
        eventually(Duration::from_secs(60), &what, || async {
            (local.cli(&show)["provisioningState"] == "Succeeded").then_some(())
        })
        .await;
    }

    // From here on, behind the fault proxy if asked: the runner is started again through it.
    let proxy = if size.aws_faults > 0.0 {
        let proxy = FaultProxy::start(size.seed).await;
        proxy.set_rules(
            // Every service the proxy knows: the stack's own and those of the run's AWS
            // resource destinations (no Lambda function here: its rules pick nothing).
            SERVICES
                .into_iter()
                .flat_map(|s| {
                    [
                        FaultRule::throttle(s, size.aws_faults),
                        FaultRule::server_error(s, size.aws_faults / 4.0),
                    ]
                })
                .collect(),
        );
        local.kill();
        local.aws_endpoint = Some(proxy.url());
        local.start();
        Some(proxy)
    } else {
        None
    };

    // Publish, and kill the runner at even steps of the publishing, the last right after it.
    let published = Arc::new(AtomicUsize::new(0));
    let url = format!(
        "http://{}/topics/{TOPIC}/api/events?api-version=2018-01-01",
        local.listen
    );
    let (events, kills, seed, keys) = (size.events, size.kills, size.seed, size.ordered_keys);
    let settle = size.settle_timeout();
    let publisher = tokio::spawn(publish_all(
        url,
        key,
        size,
        Arc::clone(&published),
        endpoints.to_vec(),
    ));
    let mut rng = StdRng::seed_from_u64(seed);
    for k in 1..=kills {
        let at = events * k / kills;
        while published.load(Ordering::SeqCst) < at {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..400))).await;
        local.kill();
        local.start();
    }
    publisher.await.expect("the publisher finished");
    let published_after = began.elapsed();

    // Wait until every event is accounted for, or the settle time is up.
    let s3 = S3ObjectStore::new(s3_client(&sdk));
    let mut objects: HashMap<String, Vec<String>> = HashMap::new();
    let deadline = Instant::now() + settle;
    let missing = loop {
        let mut missing: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for endpoint in &endpoints {
            let dead =
                dead_lettered(&s3, &bucket, &format!("{}/", endpoint.name), &mut objects).await;
            let delivered = endpoint.delivered.lock().expect("subscriber state").clone();
            let lost: Vec<String> = owed_ids(endpoint, events)
                .filter(|id| !delivered.contains_key(id) && !dead.contains(id))
                .collect();
            if !lost.is_empty() {
                missing.insert(endpoint.name, lost);
            }
        }
        if missing.is_empty() || Instant::now() > deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    let mut owed: usize = 0;
    let mut delivered_events = 0;
    let mut duplicates = 0;
    let mut misdelivered = 0;
    let mut requests = 0;
    for endpoint in &endpoints {
        owed += owed_ids(endpoint, events).count();
        let delivered = endpoint.delivered.lock().expect("subscriber state");
        delivered_events += delivered.len();
        duplicates += delivered.values().map(|n| (n - 1) as usize).sum::<usize>();
        misdelivered += endpoint.misdelivered.load(Ordering::Relaxed);
        requests += endpoint.requests.load(Ordering::Relaxed);
    }
    let dead_lettered_records: usize = objects.values().map(Vec::len).sum();
    let aws_faults: BTreeMap<String, u64> = proxy
        .as_ref()
        .map(|p| {
            SERVICES
                .into_iter()
                .map(|s| (s.to_string(), p.refused(s)))
                .collect()
        })
        .unwrap_or_default();
    let lost: usize = missing.values().map(Vec::len).sum();
    let mut reordered: Vec<String> = Vec::new();
    for endpoint in &endpoints {
        let Some(order) = &endpoint.order else {
            continue;
        };
        let dead = dead_lettered(&s3, &bucket, &format!("{}/", endpoint.name), &mut objects).await;
        let order = order.lock().expect("subscriber state");
        reordered.extend(order.reordered.iter().cloned());
        reordered.extend(
            order
                .overtaken
                .iter()
                .filter(|(m, _)| !dead.contains(&format!("ev-{m}")))
                .map(|(m, n)| format!("ev-{n} first arrived while ev-{m} of its key waited")),
        );
    }
    // #34 item 12: invocations the runner stopped at their deadline, across its restarts.
    let runner_log = std::fs::read_to_string(&local.log).unwrap_or_default();
    let stopped = runner_log
        .lines()
        .filter(|l| l.contains("invocation timed out and was stopped"))
        .count();
    let report = json!({
        "events": events,
        "subscriptions": endpoints.len(),
        "owed": owed,
        "delivered": delivered_events,
        "deadLetteredRecords": dead_lettered_records,
        "lost": lost,
        "duplicates": duplicates,
        "misdelivered": misdelivered,
        "orderedKeys": keys,
        "reordered": reordered.len(),
        "requests": requests,
        "kills": kills,
        "stoppedAtDeadline": stopped,
        "starts": local.starts,
        "seed": seed,
        "journal": local.journal,
        "awsCallsRefused": aws_faults,
        "publishedAfterSeconds": published_after.as_secs_f64().round(),
        "quietAfterSeconds": began.elapsed().as_secs_f64().round(),
        "runnerLog": local.log.display().to_string(),
    });
    println!("chaos: {report}");
    assert_eq!(
        misdelivered, 0,
        "events reached a subscription they are not for: {report}"
    );
    assert!(
        missing.is_empty(),
        "lost (neither delivered nor dead-lettered) after {settle:?}: {:?}; {report}",
        missing
            .iter()
            .map(|(name, ids)| (name, ids.len(), ids.iter().take(5).collect::<Vec<_>>()))
            .collect::<Vec<_>>()
    );
    assert!(
        reordered.is_empty(),
        "events reached the ordered subscription before an earlier one of their key: {:?}; {report}",
        reordered.iter().take(5).collect::<Vec<_>>()
    );
    assert_eq!(
        stopped, 0,
        "invocations ran into their deadline and were stopped: {report}"
    );
    local.kill();
}

/// O1's check itself: an event first arriving after a later one of its key, or while an
/// earlier one of its key waits unanswered, is noted; duplicates and answered ones are not.
#[test]
fn the_order_check_notes_what_o1_forbids() {
    let ev = |n: usize| json!({"id": format!("ev-{n}"), "data": {"key": n % 2}});
    let mut order = KeyOrder::default();
    let mut delivered = HashMap::new();
    order.arrive(&[ev(0)], &delivered);
    delivered.insert("ev-0".to_string(), 1);
    order.arrive(&[ev(2), ev(1)], &delivered);
    // ev-2 fails; ev-2 again and then ev-4 once answered: allowed, and a copy of ev-0 too.
    order.arrive(&[ev(2)], &delivered);
    delivered.insert("ev-2".to_string(), 1);
    order.arrive(&[ev(4), ev(0)], &delivered);
    assert!(order.reordered.is_empty() && order.overtaken.is_empty());
    // Key 1: ev-3 goes while ev-1 was not answered; ev-5's first arrival after ev-7's.
    order.arrive(&[ev(3)], &delivered);
    order.arrive(&[ev(7)], &delivered);
    order.arrive(&[ev(5)], &delivered);
    assert_eq!(order.overtaken[..2], [(1, 3), (1, 7)]);
    assert_eq!(order.reordered.len(), 1, "{:?}", order.reordered);
}
