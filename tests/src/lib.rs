//! Harness for gridrelay's end-to-end tests.
//!
//! Each test starts its own [`TestSystem`]: the real handlers behind the local runner, with
//! resource names of its own, against the AWS API that `AWS_ENDPOINT_URL` names (moto, started
//! by `make test`, or LocalStack, or AWS). Subscribers are real HTTP servers on 127.0.0.1 that
//! answer from a script and record what they received.

pub mod fault_proxy;
pub mod oauth_server;
pub mod ordered_subscriber;
pub mod runtime_api;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_config::{BehaviorVersion, SdkConfig};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::Utc;
use gridrelay_adapters::aws::{AwsResourceSender, S3ObjectStore, SecretsManagerStore, s3_client};
use gridrelay_local::{LocalSystem, ResourceNames, RunnerConfig, RunnerStats};
use gridrelay_ports::endpoints::EndpointCheck;
use gridrelay_ports::registration::Registry;
use gridrelay_shared::delivery::ATTEMPT_TIMEOUT;
use gridrelay_shared::destination::AllowedDestinations;
use gridrelay_shared::outbound::OutboundPolicy;
use gridrelay_shared::schema::{InputMapping, InputSchema};
use gridrelay_shared::subscription::{Subscription, SubscriptionRequest, Topic};
use gridrelay_shared::time_scale::TimeScale;
use gridrelay_shared::validation::ProvisioningState;
use serde_json::{Value, json};

/// The delivery journal's stream and bucket the [`TestSystem`]s without one of their own write
/// to.
pub const SHARED_JOURNAL: &str = "e2e-journal";
/// The topic archive streams of the test systems that share [`SHARED_JOURNAL`] (into its
/// bucket): this, then the class (`e2e-archive-7d`).
pub const SHARED_ARCHIVE: &str = "e2e-archive";

/// Whose delivery journal a [`TestSystem`] writes to.
#[derive(Debug, Clone, Copy)]
enum Journal {
    Shared,
    Own,
}

/// The SDK configuration for the emulator (or AWS) named by `AWS_ENDPOINT_URL`.
pub async fn sdk_config() -> SdkConfig {
    assert!(
        std::env::var("AWS_ENDPOINT_URL").is_ok_and(|v| !v.is_empty()),
        "AWS_ENDPOINT_URL is not set: run the end-to-end tests with `make test`, which starts moto \
         and sets it, or export it (see `infra/local/moto.sh env`)"
    );
    load_sdk_config(None).await
}

/// As [`sdk_config`], with every service's calls sent to `url` (a [`fault_proxy::FaultProxy`]):
/// set in code, it takes precedence over `AWS_ENDPOINT_URL` and the per-service variables, as
/// an endpoint set on a built configuration would not.
pub async fn sdk_config_through(url: &str) -> SdkConfig {
    load_sdk_config(Some(url)).await
}

async fn load_sdk_config(endpoint_url: Option<&str>) -> SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).region(
        aws_config::meta::region::RegionProviderChain::default_provider().or_else("us-east-1"),
    );
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        loader = loader.credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "testing",
            "testing",
            None,
            None,
            "gridrelay-tests",
        ));
    }
    if let Some(url) = endpoint_url {
        loader = loader.endpoint_url(url);
    }
    loader.load().await
}

/// Waits until `check` returns `Some`, polling every 100 ms; panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A whole gridrelay for one test.
pub struct TestSystem {
    pub system: LocalSystem,
    pub sdk: SdkConfig,
    pub names: ResourceNames,
    pub scale: TimeScale,
    pub secrets: SecretsManagerStore,
    /// What `event-subscription create` checks endpoints against: the runner's allowed
    /// networks, the system's resolver.
    pub endpoints: EndpointCheck,
    /// Where `event-subscription create` checks dead-letter locations.
    pub objects: S3ObjectStore,
    /// Where `event-subscription create` checks AWS resource destinations (S4).
    pub resources: AwsResourceSender,
    /// The AWS resources the command line admits here: every one (a local stack).
    pub allowed_destinations: AllowedDestinations,
    http: reqwest::Client,
    /// What the runner was started with, to start it again.
    config: RunnerConfig,
    system_sdk: SdkConfig,
}

impl TestSystem {
    /// Starts a system whose every wait is multiplied by `scale`.
    pub async fn start(scale: f64) -> Self {
        Self::start_with(scale, |_| {}).await
    }

    /// As [`TestSystem::start`], with the queues' visibility timeout (for tests whose
    /// invocations run longer than the default 3 s).
    pub async fn start_with_visibility(scale: f64, visibility_timeout: Duration) -> Self {
        Self::start_with(scale, |c| {
            c.visibility_timeout = visibility_timeout;
            c.function_timeout = visibility_timeout;
        })
        .await
    }

    /// As [`TestSystem::start`], with the runner's settings changed by `configure`.
    pub async fn start_with(scale: f64, configure: impl FnOnce(&mut RunnerConfig)) -> Self {
        let sdk = sdk_config().await;
        Self::start_on(sdk.clone(), sdk, scale, Journal::Shared, configure).await
    }

    /// A system with a delivery journal of its own (its prefix's stream and bucket), for a test
    /// that reads the journal back: no other test's entries are in it.
    pub async fn start_with_own_journal(scale: f64) -> Self {
        Self::start_with_own_journal_and(scale, |_| {}).await
    }

    /// As [`TestSystem::start_with_own_journal`], with the runner's settings changed by
    /// `configure`.
    pub async fn start_with_own_journal_and(
        scale: f64,
        configure: impl FnOnce(&mut RunnerConfig),
    ) -> Self {
        let sdk = sdk_config().await;
        Self::start_on(sdk.clone(), sdk, scale, Journal::Own, configure).await
    }

    /// The life of event `id` of `topic` as this system's delivery journal has it (written in
    /// the last hour), read from its bucket as `gridrelay event show` reads it.
    pub async fn event_life(&self, topic: &str, id: &str) -> gridrelay_shared::journal::EventLife {
        use gridrelay_ports::JournalSource;
        let source = gridrelay_adapters::aws::S3JournalSource::new(
            s3_client(&self.sdk),
            &self.names.journal_bucket,
            gridrelay_shared::journal::JOURNAL_PREFIX,
        );
        let read = source
            .read_hours(Utc::now() - chrono::Duration::hours(1), Utc::now())
            .await
            .expect("read the journal");
        gridrelay_shared::journal::EventLife::of(topic, id, &read.entries)
    }

    /// As [`TestSystem::start_with`], with the system's AWS calls going through `proxy` (the
    /// test's own calls, to set up and check, go straight to the AWS API).
    pub async fn start_behind(
        proxy: &fault_proxy::FaultProxy,
        scale: f64,
        configure: impl FnOnce(&mut RunnerConfig),
    ) -> Self {
        let proxied = sdk_config_through(&proxy.url()).await;
        Self::start_on(
            proxied,
            sdk_config().await,
            scale,
            Journal::Shared,
            configure,
        )
        .await
    }

    /// A system whose functions call AWS with `system_sdk`; `sdk` is the test's own.
    async fn start_on(
        system_sdk: SdkConfig,
        sdk: SdkConfig,
        scale: f64,
        journal: Journal,
        configure: impl FnOnce(&mut RunnerConfig),
    ) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let own = ResourceNames::with_prefix(&format!("t{}", &id[..12]));
        let names = match journal {
            Journal::Own => own,
            // One delivery journal for the other test systems, as one stack's topics share
            // theirs: moto, as AWS by default, allows 50 Firehose streams to an account and
            // region.
            Journal::Shared => ResourceNames {
                journal_stream: SHARED_JOURNAL.to_string(),
                journal_bucket: SHARED_JOURNAL.to_string(),
                archive_streams: gridrelay_shared::archive::ARCHIVE_CLASSES
                    .into_iter()
                    .map(|class| (class, format!("{SHARED_ARCHIVE}-{class}d")))
                    .collect(),
                ..own
            },
        };
        let scale = TimeScale::new(scale).expect("valid scale");
        // An invocation may run 3 s, or one attempt and twice the margin if that is longer (the
        // shortest the runner accepts). Its messages stay hidden a second longer: the poller
        // starts the invocation's clock after the receive returns and deletes after it ends, and
        // on a loaded emulator those take time (as on AWS, where the visibility timeout should
        // exceed the function's); equal, a delete could come after the message was received
        // again, a duplicate.
        let margin = Duration::from_secs(1);
        let invocation = Duration::from_secs(3).max(scale.apply(ATTEMPT_TIMEOUT) + margin * 2);
        let mut config = RunnerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            scale,
            visibility_timeout: invocation + Duration::from_secs(1),
            // A message is parked after 5 failed receives. With 2, as before, two invocations
            // that fail (out of time on a loaded emulator, tests/it six at a time) park its
            // events for good: three different tests timed out waiting for events in three
            // runs, as parked events would make them. The tests of parking itself set 2.
            max_receive_count: 5,
            concurrency: 4,
            function_timeout: invocation,
            deadline_margin: margin,
            ..RunnerConfig::default()
        };
        configure(&mut config);
        let endpoints = EndpointCheck {
            policy: OutboundPolicy::new(config.allowed_networks.clone()),
            resolver: config.resolver.clone(),
        };
        let system = LocalSystem::start(&system_sdk, &names, config.clone())
            .await
            .expect("local system starts");
        let secrets = SecretsManagerStore::from_sdk(&sdk);
        let objects = S3ObjectStore::new(s3_client(&sdk));
        // As the command line admits them: never the system's own queues.
        let allowed_destinations =
            AllowedDestinations::any().refusing_own_queues(system.resources.queue_urls());
        Self {
            system,
            sdk: sdk.clone(),
            names,
            scale,
            secrets,
            endpoints,
            objects,
            resources: AwsResourceSender::from_sdk(&sdk),
            allowed_destinations,
            http: reqwest::Client::new(),
            config,
            system_sdk,
        }
    }

    /// Kills the runner as a crash would (its tasks dropped wherever they are: no invocation
    /// in flight finishes or deletes its messages), then starts another on the same resources
    /// (on another port).
    pub async fn killed_and_restarted(mut self) -> Self {
        self.system.kill();
        self.system = LocalSystem::start(&self.system_sdk, &self.names, self.config.clone())
            .await
            .expect("local system starts again");
        self
    }

    /// Creates a topic with fresh keys.
    pub async fn topic(&self, name: &str) -> Topic {
        self.topic_with_schema(name, InputSchema::EventGridSchema, None)
            .await
    }

    /// Creates a topic that takes `schema` (with `mapping` for the custom schema).
    pub async fn topic_with_schema(
        &self,
        name: &str,
        schema: InputSchema,
        mapping: Option<InputMapping>,
    ) -> Topic {
        let topic = Topic::with_new_keys(name, Utc::now())
            .with_input_schema(schema, mapping)
            .expect("valid input schema");
        self.system
            .store
            .create_topic(&topic)
            .await
            .expect("topic created");
        topic
    }

    /// Registers a subscription, as `gridrelay event-subscription create` does, and waits
    /// until the service validated its endpoint.
    pub async fn subscribe(&self, request: SubscriptionRequest) -> Subscription {
        let sub = self.register(request).await;
        self.wait_for_provisioning(&sub.topic, &sub.name, ProvisioningState::Succeeded)
            .await
    }

    /// Registers a subscription without waiting for its validation.
    pub async fn register(&self, request: SubscriptionRequest) -> Subscription {
        self.registry()
            .register(&request, Utc::now())
            .await
            .expect("subscription registered")
    }

    /// Waits until the subscription's provisioning state is `state`.
    pub async fn wait_for_provisioning(
        &self,
        topic: &str,
        name: &str,
        state: ProvisioningState,
    ) -> Subscription {
        eventually(
            Duration::from_secs(30),
            &format!("subscription {name} {state:?}"),
            || async {
                self.system
                    .store
                    .get_subscription(topic, name)
                    .await
                    .ok()
                    .flatten()
                    .filter(|s| s.provisioning.state == state)
            },
        )
        .await
    }

    /// Where this system's subscriptions and their secrets are registered.
    pub fn registry(&self) -> Registry<'_> {
        Registry {
            store: self.system.store.as_ref(),
            secrets: &self.secrets,
            secret_prefix: &self.names.secret_prefix,
            control_queue: self.system.control_queue.as_ref(),
            endpoints: &self.endpoints,
            dead_letters: &self.objects,
            resources: &self.resources,
            allowed_destinations: &self.allowed_destinations,
        }
    }

    /// `s3://BUCKET/PREFIX` in this system's dead-letter bucket.
    pub fn dead_letter_url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.names.dead_letter_bucket)
    }

    /// POSTs `body` to the topic's publish endpoint with `key`; returns status and body.
    pub async fn publish_raw(
        &self,
        topic: &str,
        key: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, String) {
        self.publish_with_headers(topic, key, &[("content-type", "application/json")], body)
            .await
    }

    /// POSTs `body` with the given headers (content type, `ce-*`…) and `key`.
    pub async fn publish_with_headers(
        &self,
        topic: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (u16, String) {
        let url = format!(
            "{}?api-version=2018-01-01",
            self.system.publish_endpoint(topic)
        );
        let mut request = self.http.post(url).body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(k) = key {
            request = request.header("aeg-sas-key", k);
        }
        let response = request.send().await.expect("publish API answers");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    /// Publishes events with the topic's first key and expects 200.
    pub async fn publish(&self, topic: &Topic, events: &Value) {
        let (status, body) = self.publish_with_key(topic, events).await;
        assert_eq!(status, 200, "publish failed: {body}");
    }

    /// Publishes events with the topic's first key: the answer's status and body.
    async fn publish_with_key(&self, topic: &Topic, events: &Value) -> (u16, String) {
        self.publish_raw(
            &topic.name,
            Some(&topic.key1),
            events.to_string().into_bytes(),
        )
        .await
    }

    /// Publishes `events`, sending them again whole while the answer is a 5xx, as a publisher
    /// does (what reached some subscriptions may then arrive twice); how many 5xx answers came
    /// before the 200. Any other answer fails the test, as do 20 5xx in a row.
    pub async fn publish_until_accepted(&self, topic: &Topic, events: &Value) -> usize {
        let mut refused = 0;
        loop {
            let (status, body) = self.publish_with_key(topic, events).await;
            match status {
                200 => return refused,
                500..=599 if refused < 20 => refused += 1,
                _ => panic!("publish answered {status} after {refused} 5xx: {body}"),
            }
        }
    }

    /// Every dead-letter object under `prefix`, as (key, parsed JSON array).
    pub async fn dead_letter_objects(&self, prefix: &str) -> Vec<(String, Vec<Value>)> {
        let s3 = gridrelay_adapters::aws::s3_client(&self.sdk);
        let listed = s3
            .list_objects_v2()
            .bucket(&self.names.dead_letter_bucket)
            .prefix(prefix)
            .send()
            .await
            .expect("list objects");
        let mut out = Vec::new();
        for object in listed.contents() {
            let key = object.key().unwrap_or_default().to_string();
            let body = s3
                .get_object()
                .bucket(&self.names.dead_letter_bucket)
                .key(&key)
                .send()
                .await
                .expect("get object")
                .body
                .collect()
                .await
                .expect("read object")
                .into_bytes();
            let records: Vec<Value> =
                serde_json::from_slice(&body).expect("object is a JSON array");
            out.push((key, records));
        }
        out
    }

    /// Waits for the first dead-letter object under `prefix`.
    pub async fn wait_for_dead_letters(
        &self,
        prefix: &str,
        timeout: Duration,
    ) -> Vec<(String, Vec<Value>)> {
        eventually(timeout, "a dead-letter object", || async {
            let objects = self.dead_letter_objects(prefix).await;
            (!objects.is_empty()).then_some(objects)
        })
        .await
    }

    /// Messages in a queue, visible, in flight or delayed.
    pub async fn queue_depth(&self, url: &str) -> usize {
        let counts = queue_counts(&aws_sdk_sqs::Client::new(&self.sdk), url)
            .await
            .expect("queue attributes");
        counts.visible + counts.in_flight + counts.delayed
    }

    /// Waits until the runner's counters satisfy `done`.
    pub async fn wait_for_stats(
        &self,
        what: &str,
        done: impl Fn(&RunnerStats) -> bool,
    ) -> RunnerStats {
        self.wait_for_stats_within(Duration::from_secs(30), what, done)
            .await
    }

    /// Waits up to `timeout` until the runner's counters satisfy `done`.
    pub async fn wait_for_stats_within(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&RunnerStats) -> bool,
    ) -> RunnerStats {
        eventually(timeout, what, || async {
            let stats = self.system.stats();
            done(&stats).then_some(stats)
        })
        .await
    }

    /// Stops the runner; a system with a journal of its own deletes its journal's and
    /// archive's streams (what they wrote stays in the bucket), so the account's 50 streams
    /// (moto's limit, as AWS's by default) last a whole test run.
    pub async fn shutdown(self) {
        self.system.shutdown().await;
        if self.names.journal_stream != SHARED_JOURNAL {
            let firehose = aws_sdk_firehose::Client::new(&self.sdk);
            let streams = std::iter::once(&self.names.journal_stream)
                .chain(self.names.archive_streams.values());
            for stream in streams {
                if let Err(e) = firehose
                    .delete_delivery_stream()
                    .delivery_stream_name(stream)
                    .send()
                    .await
                {
                    eprintln!("note: stream {stream} was not deleted: {e:?}");
                }
            }
        }
    }
}

/// The URL a `gridrelay console` (or `gridrelay local`) child prints as `"console"`, read
/// from its piped stdout; the rest of what it prints is read and dropped, as a closed pipe
/// would end it. `None` if it ends without printing one.
pub fn printed_console_url(child: &mut std::process::Child) -> Option<String> {
    use std::io::{BufRead, BufReader};
    let mut lines = BufReader::new(child.stdout.take()?).lines();
    let url = lines.by_ref().map_while(Result::ok).find_map(|line| {
        let (_, rest) = line.split_once(r#""console": ""#)?;
        Some(rest.trim_end_matches(['"', ',']).to_string())
    })?;
    std::thread::spawn(move || lines.for_each(drop));
    Some(url)
}

/// A queue's messages as SQS counts them (approximately).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueCounts {
    pub visible: usize,
    pub in_flight: usize,
    pub delayed: usize,
}

/// Reads the queue at `url`'s approximate counts.
pub async fn queue_counts(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
) -> Result<QueueCounts, aws_sdk_sqs::Error> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .attribute_names(A::ApproximateNumberOfMessagesDelayed)
        .send()
        .await?;
    let attrs = out.attributes().cloned().unwrap_or_default();
    let count = |a: A| -> usize {
        attrs
            .get(&a)
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0)
    };
    Ok(QueueCounts {
        visible: count(A::ApproximateNumberOfMessages),
        in_flight: count(A::ApproximateNumberOfMessagesNotVisible),
        delayed: count(A::ApproximateNumberOfMessagesDelayed),
    })
}

/// Creates an SQS queue `name` (a destination, or what a topic or bus feeds); its URL and ARN.
pub async fn create_queue(sqs: &aws_sdk_sqs::Client, name: &str) -> (String, String) {
    let url = sqs
        .create_queue()
        .queue_name(name)
        .send()
        .await
        .expect("queue created")
        .queue_url()
        .expect("a queue URL")
        .to_string();
    let arn = queue_arn(sqs, &url).await;
    (url, arn)
}

/// A queue's ARN, as SQS names it (the account differs between emulators and AWS).
pub async fn queue_arn(sqs: &aws_sdk_sqs::Client, url: &str) -> String {
    sqs.get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("queue attributes")
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn))
        .expect("a queue ARN")
        .clone()
}

/// Serves `app` on a free port of 127.0.0.1 (`what` names it if the bind fails): its address,
/// and the task serving it, which stops the server when aborted.
pub async fn serve_on_loopback(
    app: Router,
    what: &str,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind {what}: {e}"));
    let addr = listener.local_addr().expect("its address");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, server)
}

/// A subscription request with defaults for everything but the names and endpoint.
pub fn subscription(topic: &str, name: &str, endpoint: &str) -> SubscriptionRequest {
    SubscriptionRequest {
        topic: topic.to_string(),
        name: name.to_string(),
        endpoint: endpoint.to_string(),
        ..SubscriptionRequest::default()
    }
}

/// A payout event of id `id`, as a publisher would send one: what #34 item 2's forged
/// deliveries carry.
pub fn payout_event(id: &str) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(
        json!({"id": id, "subject": "/pay", "eventType": "Payout",
               "eventTime": "2026-11-26T00:00:00Z", "data": {"to": "mallory"}})
        .to_string(),
    )
    .expect("json")
}

/// A delivery queue message for `sub` carrying `event`, made as fan-out makes one: what anyone
/// who could write to the delivery queue would send to have gridrelay POST it (#34 item 2).
pub fn delivery_message_for(
    sub: &Subscription,
    event: Box<serde_json::value::RawValue>,
) -> gridrelay_shared::message::DeliveryMessage {
    use gridrelay_shared::message::{DeliveryHistory, DeliveryMessage, QueuedEvent};
    DeliveryMessage::packed(
        &DeliveryHistory::new(sub),
        Utc::now(),
        vec![QueuedEvent::new(Utc::now(), event)],
    )
    .remove(0)
}

/// Events in the Event Grid schema, with ids `{prefix}-0`, `{prefix}-1`, ….
pub fn events(prefix: &str, count: usize) -> Value {
    Value::Array(
        (0..count)
            .map(|i| {
                json!({
                    "id": format!("{prefix}-{i}"),
                    "subject": format!("/orders/{i}"),
                    "eventType": "Contoso.Orders.Created",
                    "eventTime": "2026-11-22T03:00:00Z",
                    "dataVersion": "1.0",
                    "data": {"order": i, "note": "hello"}
                })
            })
            .collect(),
    )
}

/// How a subscriber answers one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Status(u16),
    /// Wait this long, then answer 200 (to test the attempt timeout).
    Hang(Duration),
}

/// One request a subscriber received.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    /// The path it was sent to (`/hook`, or `/hook/...` for a URL beneath it).
    pub path: String,
    pub headers: HeaderMap,
    /// The body as sent.
    pub body: String,
    /// The events: the array's elements, or the one object (a structured CloudEvent).
    pub events: Vec<Value>,
    pub reply: Reply,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn ids(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|e| e["id"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

/// How a subscriber answers the endpoint validation handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Handshake {
    /// Echo the validation code / allow the origin, as Event Grid handlers do.
    #[default]
    Answer,
    /// Answer 200 without the code (the owner will GET the validation URL).
    Manual,
    /// Answer the validation request with this status.
    Refuse(u16),
}

#[derive(Default)]
struct SubscriberState {
    /// Replies for paths beneath `/hook` (`/hook/stuck`), before the script.
    by_path: HashMap<String, Reply>,
    script: VecDeque<Reply>,
    otherwise: Option<Reply>,
    handshake: Handshake,
    received: Vec<Received>,
    validations: Vec<Received>,
    /// Event requests being answered now, and the most there were at once.
    in_flight: usize,
    most_in_flight: usize,
}

/// A webhook endpoint on 127.0.0.1 that answers from a script.
pub struct Subscriber {
    pub url: String,
    state: Arc<Mutex<SubscriberState>>,
    server: tokio::task::JoinHandle<()>,
}

impl Subscriber {
    /// Answers events with `script` in order, then with `otherwise` for every later request;
    /// answers the validation handshake.
    pub async fn start(script: Vec<Reply>, otherwise: Reply) -> Self {
        Self::start_with_handshake(script, otherwise, Handshake::Answer).await
    }

    /// As [`Subscriber::start`], answering the validation handshake as `handshake` says.
    pub async fn start_with_handshake(
        script: Vec<Reply>,
        otherwise: Reply,
        handshake: Handshake,
    ) -> Self {
        let state = Arc::new(Mutex::new(SubscriberState {
            script: script.into(),
            otherwise: Some(otherwise),
            handshake,
            ..SubscriberState::default()
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind subscriber");
        Self::serve(listener, state, false)
    }

    /// A subscriber on `listen` that answers 200 and the handshake, and closes each
    /// connection after its answer, so every request opens a new one. `None` if the address
    /// cannot be bound.
    pub async fn start_on_closing(listen: SocketAddr) -> Option<Self> {
        let state = Arc::new(Mutex::new(SubscriberState {
            otherwise: Some(Reply::Status(200)),
            handshake: Handshake::Answer,
            ..SubscriberState::default()
        }));
        let listener = tokio::net::TcpListener::bind(listen).await.ok()?;
        Some(Self::serve(listener, state, true))
    }

    fn serve(
        listener: tokio::net::TcpListener,
        state: Arc<Mutex<SubscriberState>>,
        close_connections: bool,
    ) -> Self {
        let mut app = Router::new()
            .route(
                "/hook",
                axum::routing::post(receive).options(abuse_protection),
            )
            .route(
                "/hook/{*rest}",
                axum::routing::post(receive).options(abuse_protection),
            )
            .with_state(Arc::clone(&state));
        if close_connections {
            app = app.layer(axum::middleware::map_response(
                |mut response: axum::response::Response| async move {
                    response.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                    response
                },
            ));
        }
        let addr = listener.local_addr().expect("subscriber address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url: format!("http://{addr}/hook"),
            state,
            server,
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.url
            .trim_start_matches("http://")
            .trim_end_matches("/hook")
            .parse()
            .expect("the subscriber's address")
    }

    /// Answers event requests to `path` (beneath `/hook`: `/hook/stuck`) with `reply`, whatever
    /// the script says; the handshake is answered as before.
    pub fn answer_path(&self, path: &str, reply: Reply) {
        if let Ok(mut s) = self.state.lock() {
            s.by_path.insert(path.to_string(), reply);
        }
    }

    /// Every request so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.state
            .lock()
            .map(|s| s.received.clone())
            .unwrap_or_default()
    }

    /// The validation handshake requests (POSTed validation events and OPTIONS requests).
    pub fn validations(&self) -> Vec<Received> {
        self.state
            .lock()
            .map(|s| s.validations.clone())
            .unwrap_or_default()
    }

    /// The most event requests it was answering at once so far.
    pub fn most_in_flight(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.most_in_flight)
            .unwrap_or_default()
    }

    /// Events received so far, across requests.
    pub fn event_count(&self) -> usize {
        self.received().iter().map(|r| r.events.len()).sum()
    }

    /// Waits until at least `n` requests arrived.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<Received> {
        eventually(
            timeout,
            &format!("{n} requests at {}", self.url),
            || async {
                let r = self.received();
                (r.len() >= n).then_some(r)
            },
        )
        .await
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The events of a delivery request's body: a JSON array of them, or one event (CloudEvents
/// structured mode); `None` for anything else.
pub fn delivered_events(body: &str) -> Option<Vec<Value>> {
    match serde_json::from_str(body) {
        Ok(Value::Array(items)) => Some(items),
        Ok(object @ Value::Object(_)) => Some(vec![object]),
        _ => None,
    }
}

/// The origin a CloudEvents abuse-protection request asks to be allowed.
pub fn request_origin(headers: &HeaderMap) -> String {
    headers
        .get("webhook-request-origin")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// The validation code of an Event Grid validation handshake request, or `None` for any other
/// request.
pub fn validation_code(headers: &HeaderMap, events: &[Value]) -> Option<String> {
    let validation = headers.get("aeg-event-type").and_then(|v| v.to_str().ok())
        == Some("SubscriptionValidation");
    validation.then(|| {
        events
            .first()
            .and_then(|e| e["data"]["validationCode"].as_str())
            .unwrap_or_default()
            .to_string()
    })
}

async fn receive(
    State(state): State<Arc<Mutex<SubscriberState>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let at = Instant::now();
    let path = uri.path().to_string();
    let events = delivered_events(&body).unwrap_or_else(|| vec![json!({"unparsed": body})]);
    if let Some(code) = validation_code(&headers, &events) {
        let mut s = state.lock().expect("subscriber state");
        let handshake = s.handshake;
        s.validations.push(Received {
            at,
            path,
            headers,
            body,
            events,
            reply: Reply::Status(200),
        });
        return match handshake {
            Handshake::Answer => axum::Json(json!({"validationResponse": code})).into_response(),
            Handshake::Manual => StatusCode::OK.into_response(),
            Handshake::Refuse(status) => status_code(status).into_response(),
        };
    }
    let reply = {
        let mut s = state.lock().expect("subscriber state");
        let reply = match s.by_path.get(&path) {
            Some(reply) => *reply,
            None => s
                .script
                .pop_front()
                .or(s.otherwise)
                .unwrap_or(Reply::Status(200)),
        };
        s.received.push(Received {
            at,
            path,
            headers,
            body,
            events,
            reply,
        });
        s.in_flight += 1;
        s.most_in_flight = s.most_in_flight.max(s.in_flight);
        reply
    };
    // Counted out when answered, or when the client gave up and the answer was dropped.
    let _answering = Answering(state);
    match reply {
        // A failure says what it is in its body, as endpoints do (the journal keeps its first
        // bytes: #35).
        Reply::Status(code) if code >= 400 => (
            status_code(code),
            format!("refused with {code} by the test subscriber"),
        )
            .into_response(),
        Reply::Status(code) => status_code(code).into_response(),
        Reply::Hang(d) => {
            tokio::time::sleep(d).await;
            StatusCode::OK.into_response()
        }
    }
}

/// An event request being answered.
struct Answering(Arc<Mutex<SubscriberState>>);

impl Drop for Answering {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.lock() {
            s.in_flight -= 1;
        }
    }
}

fn status_code(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// CloudEvents webhook abuse protection: allow the requesting origin.
async fn abuse_protection(
    State(state): State<Arc<Mutex<SubscriberState>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let origin = request_origin(&headers);
    let mut s = state.lock().expect("subscriber state");
    let handshake = s.handshake;
    s.validations.push(Received {
        at: Instant::now(),
        path: uri.path().to_string(),
        headers,
        body: String::new(),
        events: Vec::new(),
        reply: Reply::Status(200),
    });
    match handshake {
        Handshake::Answer => (StatusCode::OK, [("WebHook-Allowed-Origin", origin)]).into_response(),
        Handshake::Manual => StatusCode::OK.into_response(),
        Handshake::Refuse(status) => status_code(status).into_response(),
    }
}
