//! Runs gridrelay on one machine against any AWS API.
//!
//! An emulator such as moto provides SQS, S3 and DynamoDB but not the two parts of AWS that
//! invoke functions. This crate plays them, calling the very handlers the Lambda binaries call:
//!
//! - API Gateway: an HTTP listener that turns each request into a `lambda_http::Request` for
//!   [`gridrelay_ingest::Ingest::handle`].
//! - The SQS event-source mappings: pollers that gather a batch as the stacks' batch size and
//!   window say ([`batching`]; by default what one receive of up to ten messages finds), invoke
//!   `deliver` or `dead-letter` with an `SqsEvent`, and delete every message the handler did
//!   not report as a batch-item failure (what `ReportBatchItemFailures` does on AWS).
//!
//! [`provision`] creates the queues (each with a redrive queue for poison messages), tables and
//! bucket when they are missing.

mod api;
pub mod batching;
pub mod function_url;
mod instances;
mod poller;
mod provision;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use aws_config::SdkConfig;
use aws_lambda_events::sqs::SqsEvent;
use batching::EventSourceBatching;
use chrono::{DateTime, Utc};
use gridrelay_adapters::aws::{
    AwsResourceSender, DynamoDeliveryStateStore, DynamoReplayStore, FirehoseStream,
    S3ArchiveSource, S3JournalSource, S3ObjectStore, SecretsManagerPortalKey, SqsQueue,
    delivery_state_store, queue_key, s3_client, sealed_records, secret_store, subscription_store,
};
use gridrelay_adapters::config::TableNames;
use gridrelay_adapters::outbound::SystemResolver;
use gridrelay_dead_letter::{DeadLetterNotices, DeadLetterReport, DeadLetterWriter};
pub use gridrelay_deliver::{
    ConcurrencySettings, DEFAULT_MAX_REQUESTS_IN_FLIGHT, MAX_REQUESTS_IN_FLIGHT_ENV,
    MAX_REQUESTS_PER_ENDPOINT_ENV,
};
use gridrelay_deliver::{Deliver, DeliverOutcome, DeliverPorts, DeliveryReport, DeliverySettings};
use gridrelay_ingest::Ingest;
use gridrelay_ports::endpoints::AddressResolver;
use gridrelay_ports::fan_out::DeliveryQueues;
use gridrelay_ports::{MessageQueue, RandomJitter, StoreError, SubscriptionStore, SystemClock};
use gridrelay_shared::dead_letter::DEAD_LETTER_EVENTS_TOPIC;
use gridrelay_shared::destination::AllowedDestinations;
use gridrelay_shared::journal::JOURNAL_PREFIX;
use gridrelay_shared::limits::LimitError;
use gridrelay_shared::outbound::{AllowedNetworks, OutboundPolicy};
use gridrelay_shared::queue_seal::QueueKey;
use gridrelay_shared::subscription::{Topic, publish_path};
use gridrelay_shared::time_scale::TimeScale;
use hdrhistogram::Histogram;
use instances::Instances;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::warn;

pub use provision::{ResourceNames, Resources, provision};

/// Descriptors kept beyond the instances' connections: the AWS clients, the listener, DNS.
const SPARE_DESCRIPTORS: u64 = 256;

/// Raises the process's soft limit on open files to what `instances` deliver instances need to
/// each hold their total of connections, up to the hard limit (a shell's soft limit is often 1,024,
/// one Lambda instance's whole allowance). Where it cannot be raised far enough, says so: new
/// connections past it are refused as failed attempts, and retried ([`gridrelay_adapters::descriptors`]).
fn raise_open_file_limit(instances: usize, limits: &ConcurrencySettings) {
    let wanted = (instances as u64) * u64::from(limits.max_in_flight) + SPARE_DESCRIPTORS;
    match rlimit::increase_nofile_limit(wanted) {
        Ok(soft) if soft >= wanted => {}
        Ok(soft) => warn!(
            open_files = soft,
            wanted,
            "the limit on open files is below what the deliver instances may use; raise it (ulimit -n) or lower --max-requests-in-flight"
        ),
        Err(e) => warn!(error = %e, wanted, "could not raise the limit on open files"),
    }
}

/// `deliver`'s Lambda timeout in SAM and CDK, and the runner's default.
pub const DEFAULT_FUNCTION_TIMEOUT_SECS: u64 = 300;
/// `ingest`'s Lambda timeout (`Timeout: 15` in `infra/template.yaml`, 15 s in the CDK stack):
/// an invocation still running then is stopped, and API Gateway answers 500, as the runner
/// does. Whatever it had enqueued stays enqueued; the publisher retries (G1 allows the
/// duplicates).
pub const INGEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);
/// The runner's default visibility timeout: longer than an invocation may run.
pub const DEFAULT_VISIBILITY_TIMEOUT_SECS: u64 = 360;
/// Receives before a message moves to its redrive queue, as SAM and CDK default it (failed
/// records back off from 30 s to 30 min: about 3.3 hours).
pub const DEFAULT_MAX_RECEIVE_COUNT: u32 = 10;

/// `deliver` invocations on the control queue at once: the stacks' second event source's
/// MaximumConcurrency (the least SQS event sources allow).
pub const CONTROL_CONCURRENCY: usize = 2;

/// `deliver` invocations on the replay queue at once by default: the stacks'
/// `ReplayMaximumConcurrency` default (the least SQS event sources allow).
pub const DEFAULT_REPLAY_CONCURRENCY: usize = 2;

/// How the runner behaves.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Where the publish API listens; port 0 picks a free port.
    pub listen: SocketAddr,
    pub scale: TimeScale,
    /// How long a received message stays hidden while its handler runs (the queue's visibility
    /// timeout on AWS). A failed message comes back after this long.
    pub visibility_timeout: Duration,
    /// Receives before SQS moves a message to its redrive queue.
    pub max_receive_count: u32,
    /// Handler invocations in flight at once, per queue (but the control and replay queues).
    pub concurrency: usize,
    /// `deliver` invocations on the replay queue at once (#35): what replays may take of the
    /// delivery capacity, whatever their rate (the stacks' `ReplayMaximumConcurrency`).
    pub replay_concurrency: usize,
    /// How long one invocation may run (a Lambda function's timeout; SAM and CDK give
    /// `deliver` 300 s). Each handler is told its deadline, and one still running at it is
    /// stopped, its messages left to come back after the visibility timeout, as Lambda does.
    pub function_timeout: Duration,
    /// How long `ingest` may take with a publish (its timeout in the stacks,
    /// [`INGEST_TIMEOUT`]); one still running then is stopped and the publish answered 500
    /// (502 behind a function URL), as on AWS.
    pub ingest_timeout: Duration,
    /// What the deliver worker keeps before its deadline to settle and enqueue.
    pub deadline_margin: Duration,
    /// Requests each deliver instance has in flight, in total and per endpoint.
    pub delivery_concurrency: ConcurrencySettings,
    /// How long the functions keep the topics, subscriptions and secret values they read
    /// (`gridrelay_ports::cache`; zero keeps nothing). One cache serves the three functions
    /// here; on AWS each function instance has its own.
    pub config_cache: Duration,
    /// Networks deliveries and handshakes may reach although not public (loopback unless
    /// told otherwise, so subscribers on this machine work).
    pub allowed_networks: AllowedNetworks,
    /// How endpoint names become addresses (the system's resolver; tests give their own).
    pub resolver: Arc<dyn AddressResolver>,
    /// Whether `deliver` writes the delivery journal (#35) to its stream, as the stack's does.
    pub journal: bool,
    /// What publishers reach `ingest` through (#38), as the stacks' `PublishFrontDoor`.
    pub front_door: FrontDoor,
    /// How the delivery and replay queues' event sources gather a batch (#38): the stacks'
    /// `DeliveryBatchSize` and `DeliveryBatchingWindowSeconds`. The control queue's and the
    /// dead-letter queue's take AWS's default, 10 messages and no window.
    pub batching: EventSourceBatching,
}

/// The publish API's front door (#38): the stacks' `PublishFrontDoor`, and what the runner
/// plays in front of `ingest`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FrontDoor {
    /// API Gateway's HTTP API (the default): the request reaches the handler as it came.
    #[default]
    HttpApi,
    /// A Lambda function URL: the request goes through the function URL's event and its
    /// response format, as on AWS ([`function_url`]).
    FunctionUrl,
}

impl RunnerConfig {
    /// Refuses settings that do not work together, saying which flags and why: an invocation
    /// may not outlive its messages' visibility (AWS refuses the same of an SQS event source),
    /// and must leave room for one attempt.
    pub fn check(&self) -> Result<(), LimitError> {
        let (visibility, function) = (self.visibility_timeout, self.function_timeout);
        if visibility < function {
            return Err(LimitError::new(
                "--visibility-timeout",
                format!("{} s", visibility.as_secs_f64()),
                format!(
                    "at least --function-timeout ({} s): an invocation could outlive its \
                     messages' visibility and they would be delivered twice (AWS requires the \
                     same of SQS event sources)",
                    function.as_secs_f64()
                ),
            ));
        }
        // A batch's first message is hidden while the window fills and the invocation runs.
        let window = self.batching.window();
        if visibility < function + window {
            return Err(LimitError::new(
                "--visibility-timeout",
                format!("{} s", visibility.as_secs_f64()),
                format!(
                    "at least --function-timeout plus --delivery-batching-window-seconds \
                     ({} s): a batch's first message is hidden from its receive until its \
                     invocation ends, and would come back and be delivered twice (AWS asks the \
                     same of SQS event sources with a window)",
                    (function + window).as_secs_f64()
                ),
            ));
        }
        let settings = self.delivery_settings();
        let (attempt, margin) = (settings.attempt_timeout, settings.deadline_margin);
        let shortest = self.shortest_function_timeout();
        if function < shortest {
            return Err(LimitError::new(
                "--function-timeout",
                format!("{} s", function.as_secs_f64()),
                format!(
                    "at least {} s: the reads before the first attempt and the writes after the \
                     last ({} s each, the deadline margin) plus one attempt ({} s at this time \
                     scale), or invocations could only hand their events on",
                    shortest.as_secs_f64(),
                    margin.as_secs_f64(),
                    attempt.as_secs_f64()
                ),
            ));
        }
        Ok(())
    }

    /// The shortest function timeout [`RunnerConfig::check`] accepts at this time scale and
    /// deadline margin: the margin for the reads before the first attempt (subscriptions,
    /// endpoint health, late successes), one attempt, and the margin again for the writes
    /// after the last (#34 item 12). With one margin only, an invocation's reads used the time
    /// its attempt needed, so no attempt or handshake ever started.
    pub fn shortest_function_timeout(&self) -> Duration {
        let settings = self.delivery_settings();
        settings.deadline_margin + settings.attempt_timeout + settings.deadline_margin
    }

    /// The deliver worker's settings at this time scale, with this deadline margin.
    fn delivery_settings(&self) -> DeliverySettings {
        DeliverySettings {
            deadline_margin: self.deadline_margin,
            concurrency: self.delivery_concurrency,
            outbound: OutboundPolicy::new(self.allowed_networks.clone()),
            ..DeliverySettings::new(self.scale)
        }
    }
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7071)),
            scale: TimeScale::REAL,
            visibility_timeout: Duration::from_secs(DEFAULT_VISIBILITY_TIMEOUT_SECS),
            max_receive_count: DEFAULT_MAX_RECEIVE_COUNT,
            concurrency: 4,
            replay_concurrency: DEFAULT_REPLAY_CONCURRENCY,
            function_timeout: Duration::from_secs(DEFAULT_FUNCTION_TIMEOUT_SECS),
            ingest_timeout: INGEST_TIMEOUT,
            deadline_margin: gridrelay_deliver::DEADLINE_MARGIN,
            delivery_concurrency: ConcurrencySettings::default(),
            config_cache: gridrelay_ports::cache::DEFAULT_CONFIG_CACHE,
            allowed_networks: AllowedNetworks::loopback(),
            resolver: Arc::new(SystemResolver),
            journal: true,
            front_door: FrontDoor::HttpApi,
            batching: EventSourceBatching::default(),
        }
    }
}

/// What the handlers did since the runner started.
#[derive(Debug, Clone, Default)]
pub struct RunnerStats {
    pub deliver: DeliveryReport,
    pub dead_letter: DeadLetterReport,
    pub deliver_invocations: usize,
    /// The most delivery queue messages one `deliver` invocation was given (a batching
    /// window's batch holds up to its batch size).
    pub largest_deliver_batch: usize,
    pub dead_letter_invocations: usize,
    /// Publish requests handled by `ingest`.
    pub ingest_invocations: usize,
    /// Each function's invocations' wall time, each rounded up to the millisecond (at least
    /// 1), as Lambda bills it; an invocation stopped at its timeout bills the whole timeout.
    pub billed: BilledTime,
    /// Invocations still running at their deadline, stopped (their messages come back after
    /// the visibility timeout). Counted apart from each function's (finished) invocations.
    pub stopped_invocations: usize,
    /// Messages on the runner's queues that gridrelay did not write (no valid seal, #34 item
    /// 2): dropped before any function saw them.
    pub unsealed_dropped: usize,
    /// Batches a failed receive cut short while they gathered for a batching window (#38):
    /// invoked with what they held, as Lambda does; the rest waited for a window of its own.
    pub batches_cut_short: usize,
    pub latencies: Latencies,
}

/// Where delivered events' time went, as the runner saw it (issue #9's latency figures).
#[derive(Debug, Clone)]
pub struct Latencies {
    /// Per delivery queue message, in milliseconds: from its send (SQS `SentTimestamp`) to the
    /// start of the invocation that received it: waiting in the queue and for a poll.
    pub queue_ms: Histogram<u64>,
    /// Per delivered event, in milliseconds: from its publish (ingest accepting it) to its
    /// subscriber's answer.
    pub publish_to_answer_ms: Histogram<u64>,
}

/// The most a latency is recorded as: the retry ladder's whole day, in milliseconds.
const LONGEST_LATENCY_MS: u64 = 86_400_000;

impl Default for Latencies {
    fn default() -> Self {
        let histogram = || {
            Histogram::new_with_max(LONGEST_LATENCY_MS, 2)
                .expect("two significant digits up to a day is a valid histogram")
        };
        Self {
            queue_ms: histogram(),
            publish_to_answer_ms: histogram(),
        }
    }
}

impl Latencies {
    /// Each message's time in the queue, if an invocation with `event` starts at `started`.
    fn queue_waits(event: &SqsEvent, started: DateTime<Utc>) -> Vec<u64> {
        event
            .records
            .iter()
            .filter_map(|r| r.attributes.get("SentTimestamp")?.parse::<i64>().ok())
            .map(|sent| (started.timestamp_millis() - sent).max(0).unsigned_abs())
            .collect()
    }

    /// Records what one delivery invocation saw: its messages' time in the queue and its
    /// delivered events' time from publish to answer.
    fn record(&mut self, queue_waits: &[u64], outcome: &DeliverOutcome) {
        for &ms in queue_waits {
            self.queue_ms.saturating_record(ms);
        }
        for m in outcome.by_subscription.values() {
            for ms in &m.latency_ms {
                self.publish_to_answer_ms
                    .saturating_record(ms.round() as u64);
            }
        }
    }
}

/// Milliseconds of each function's invocations, as Lambda would bill them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BilledTime {
    pub ingest_ms: u64,
    pub deliver_ms: u64,
    pub dead_letter_ms: u64,
}

/// Lambda bills an invocation's duration rounded up to the millisecond, and at least one.
pub(crate) fn billed_ms(started: std::time::Instant) -> u64 {
    whole_ms(started.elapsed())
}

fn whole_ms(d: Duration) -> u64 {
    u64::try_from(d.as_micros().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// L7: creates the system topic that announces dead-letter writes, so users can subscribe to it.
pub async fn ensure_dead_letter_events_topic(store: &dyn SubscriptionStore) -> anyhow::Result<()> {
    let topic = Topic::with_new_keys(DEAD_LETTER_EVENTS_TOPIC, chrono::Utc::now());
    match store.create_topic(&topic).await {
        Ok(()) | Err(StoreError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// As the Lambda functions do (#34 item 2): only the records gridrelay wrote reach a handler;
/// the others are dropped, and counted in the runner's stats.
fn sealed(
    event: SqsEvent,
    key: &QueueKey,
    queue: &'static str,
    stats: &Mutex<RunnerStats>,
) -> SqsEvent {
    let received = event.records.len();
    let event = sealed_records(event, key, queue);
    if let Ok(mut s) = stats.lock() {
        s.unsealed_dropped += received - event.records.len();
    }
    event
}

/// A running local system. Dropping it without [`LocalSystem::shutdown`] leaves tasks running
/// until the runtime ends.
pub struct LocalSystem {
    pub resources: Resources,
    pub listen: SocketAddr,
    pub store: Arc<dyn SubscriptionStore>,
    pub delivery_queue: Arc<dyn MessageQueue>,
    /// The control queue, where subscription registration asks for the handshake.
    pub control_queue: Arc<dyn MessageQueue>,
    /// The replay queue, where replays' deliveries go (#35).
    pub replay_queue: Arc<dyn MessageQueue>,
    /// The key the runner's queue messages are sealed with (#34 item 2).
    pub queue_key: QueueKey,
    stats: Arc<Mutex<RunnerStats>>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl LocalSystem {
    /// Provisions what is missing and starts the publish API and both pollers.
    pub async fn start(
        sdk: &SdkConfig,
        names: &ResourceNames,
        config: RunnerConfig,
    ) -> anyhow::Result<Self> {
        config.check()?;
        let resources = provision(sdk, names, config.max_receive_count)
            .await
            .context("could not create or find the runner's queues, tables and bucket")?;
        let sqs = aws_sdk_sqs::Client::new(sdk);
        let store: Arc<dyn SubscriptionStore> = subscription_store(
            sdk,
            TableNames {
                topics: names.topics_table.clone(),
                subscriptions: names.subscriptions_table.clone(),
            },
            config.config_cache,
        );
        let (key, queues) = sealed_queues(sdk, &sqs, &resources).await?;
        let SealedQueues {
            delivery: delivery_queue,
            control: control_queue,
            replay: replay_queue,
            dead_letter: dead_letter_queue,
            ordered: ordered_queue,
            ..
        } = queues.clone();
        let clock = Arc::new(SystemClock);
        // O1: fan-out sends ordered subscriptions' events to the ordered queue.
        let fan_out_queues: Arc<dyn MessageQueue> = Arc::new(DeliveryQueues {
            delivery: delivery_queue.clone(),
            ordered: Some(ordered_queue.clone()),
        });

        let ingest = Arc::new(Ingest {
            store: Arc::clone(&store),
            delivery_queue: fan_out_queues.clone(),
            archives: FirehoseStream::archive_streams(sdk, &names.archive_streams),
            accepted_ids: Arc::new(DynamoDeliveryStateStore::from_sdk(
                sdk,
                &names.delivery_state_table,
            )),
            clock: clock.clone(),
        });
        // Bound first: the deliver worker puts the API's address in validation URLs.
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("could not listen on {}", config.listen))?;
        let listen = listener.local_addr()?;
        let ports = deliver_ports(sdk, names, &config, &store, &queues, &clock);
        let settings = DeliverySettings {
            public_url: Some(format!("http://{listen}")),
            // #34 item 2: never into the runner's own queues.
            destinations: AllowedDestinations::any().refusing_own_queues(resources.queue_urls()),
            control_queue_name: Some(names.control_queue.clone()),
            replay_queue_name: Some(names.replay_queue.clone()),
            ..config.delivery_settings()
        };
        // `deliver`'s queues, each with instances and invocations of its own, as the stacks'
        // event sources: control work (at most two at once) never waits for a free one behind
        // a backlog; replays' deliveries (#35) never delay live ones, and take at most
        // `replay_concurrency` invocations.
        let with_concurrency = |concurrency| RunnerConfig {
            concurrency,
            ..config.clone()
        };
        let lanes = [
            (
                &resources.delivery_queue_url,
                &resources.delivery_queue_arn,
                config.clone(),
            ),
            (
                &resources.control_queue_url,
                &resources.control_queue_arn,
                RunnerConfig {
                    batching: EventSourceBatching::default(),
                    ..with_concurrency(CONTROL_CONCURRENCY)
                },
            ),
            (
                &resources.replay_queue_url,
                &resources.replay_queue_arn,
                with_concurrency(config.replay_concurrency),
            ),
            // O1: a FIFO queue's event source takes batches of up to 10 and no window.
            (
                &resources.ordered_queue_url,
                &resources.ordered_queue_arn,
                RunnerConfig {
                    batching: EventSourceBatching::default(),
                    ..config.clone()
                },
            ),
        ];
        let mut lane_instances = Vec::with_capacity(lanes.len());
        for (_, _, lane_config) in &lanes {
            lane_instances.push(deliver_instances(
                ports.clone(),
                settings.clone(),
                lane_config,
            )?);
        }
        ensure_dead_letter_events_topic(store.as_ref()).await?;
        let writer = Arc::new(DeadLetterWriter {
            objects: Arc::new(S3ObjectStore::new(s3_client(sdk))),
            dead_letter_queue,
            clock: clock.clone(),
            scale: config.scale,
            notices: Some(dead_letter_notices(&store, &fan_out_queues)),
            journal: journal_sink(sdk, names, &config),
        });

        let (stop, stopped) = watch::channel(false);
        let stats = Arc::new(Mutex::new(RunnerStats::default()));
        let mut tasks = JoinSet::new();
        let portal = Arc::new(gridrelay_portal::Portal {
            store: Arc::clone(&store),
            health: Arc::clone(&ports.state),
            journal: Arc::new(S3JournalSource::new(
                s3_client(sdk),
                &names.journal_bucket,
                JOURNAL_PREFIX,
            )),
            archive: Arc::new(S3ArchiveSource::new(s3_client(sdk), &names.journal_bucket)),
            keys: Arc::new(SecretsManagerPortalKey::new(
                sdk,
                &names.portal_key_secret,
                config.config_cache,
            )),
            objects: Arc::new(S3ObjectStore::new(s3_client(sdk))),
            delivery_queue: delivery_queue.clone(),
            secrets: Arc::clone(&ports.secrets),
            secret_prefix: names.secret_prefix.clone(),
            clock,
            secure_cookies: false,
        });
        tasks.spawn(api::serve(
            listener,
            (ingest, config.front_door, config.ingest_timeout),
            portal,
            Arc::clone(&stats),
            stopped.clone(),
        ));
        let region = sdk.region().map(|r| r.to_string()).unwrap_or_default();
        // A stopped invocation ran its whole timeout, and Lambda bills all of it.
        let timeout_ms = whole_ms(config.function_timeout);
        for ((url, arn, lane_config), instances) in lanes.into_iter().zip(lane_instances) {
            let stats_cut = Arc::clone(&stats);
            let cut_short = Arc::new(move || {
                if let Ok(mut s) = stats_cut.lock() {
                    s.batches_cut_short += 1;
                }
            });
            tasks.spawn(poller::poll(
                poller::Source::new(sqs.clone(), url, arn, &region).counting_cut_short(cut_short),
                lane_config,
                stopped.clone(),
                billing_stopped(&stats, timeout_ms, |b| &mut b.deliver_ms),
                invoke_deliver(instances, Arc::clone(&stats), key.clone()),
            ));
        }
        tasks.spawn(poller::poll(
            poller::Source::new(
                sqs,
                &resources.dead_letter_queue_url,
                &resources.dead_letter_queue_arn,
                &region,
            ),
            // The stacks' dead-letter event source waits up to 30 s to group writes into
            // fewer objects; the runner does not, so dead letters are seen at once here.
            RunnerConfig {
                batching: EventSourceBatching::default(),
                ..config
            },
            stopped,
            billing_stopped(&stats, timeout_ms, |b| &mut b.dead_letter_ms),
            invoke_dead_letter(writer, Arc::clone(&stats), key.clone()),
        ));

        Ok(Self {
            resources,
            listen,
            store,
            delivery_queue,
            control_queue,
            replay_queue,
            queue_key: key,
            stats,
            stop,
            tasks,
        })
    }

    /// `http://HOST:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.listen)
    }

    /// The publish endpoint of a topic.
    pub fn publish_endpoint(&self, topic: &str) -> String {
        format!("{}{}", self.base_url(), publish_path(topic))
    }

    pub fn stats(&self) -> RunnerStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops everything at once, wherever it is, as a crash would: no handler in flight
    /// finishes, deletes its messages or answers.
    pub fn kill(&mut self) {
        self.tasks.abort_all();
    }

    /// Stops polling and serving, waits for handlers in flight to finish, and says what the
    /// handlers did in all, those included.
    pub async fn shutdown(mut self) -> RunnerStats {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
        self.stats()
    }
}

/// The ports of the runner's `deliver` instances: the subscriptions store, the delivery and
/// dead-letter queues and the clock its functions share, and its own AWS clients.
fn deliver_ports(
    sdk: &SdkConfig,
    names: &ResourceNames,
    config: &RunnerConfig,
    store: &Arc<dyn SubscriptionStore>,
    queues: &SealedQueues,
    clock: &Arc<SystemClock>,
) -> DeliverPorts {
    DeliverPorts {
        store: Arc::clone(store),
        delivery_queue: queues.delivery.clone(),
        control_queue: queues.control.clone(),
        replay_queue: queues.replay.clone(),
        dead_letter_queue: queues.dead_letter.clone(),
        ordered_queue: queues.ordered.clone(),
        ordered_redrive_queue: Some(queues.ordered_redrive.clone()),
        resources: Arc::new(AwsResourceSender::from_sdk(sdk)),
        clock: clock.clone(),
        jitter: Arc::new(RandomJitter),
        secrets: secret_store(sdk, config.config_cache),
        state: delivery_state_store(sdk, &names.delivery_state_table, config.config_cache),
        caps: Arc::new(DynamoDeliveryStateStore::from_sdk(
            sdk,
            &names.delivery_state_table,
        )),
        journal: journal_sink(sdk, names, config),
        replays: Arc::new(DynamoReplayStore::new(
            aws_sdk_dynamodb::Client::new(sdk),
            &names.replays_table,
        )),
        archive: Arc::new(S3ArchiveSource::new(s3_client(sdk), &names.journal_bucket)),
    }
}

/// The journal `deliver` and `dead-letter` write, as the stack's do (none with `journal` off).
fn journal_sink(
    sdk: &SdkConfig,
    names: &ResourceNames,
    config: &RunnerConfig,
) -> Arc<dyn gridrelay_ports::RecordStream> {
    if config.journal {
        Arc::new(FirehoseStream::from_sdk(sdk, &names.journal_stream))
    } else {
        Arc::new(gridrelay_ports::NoRecordStream)
    }
}

/// L7: dead-letter writes announced on the system topic, through the delivery queue.
fn dead_letter_notices(
    store: &Arc<dyn SubscriptionStore>,
    delivery_queue: &Arc<dyn MessageQueue>,
) -> DeadLetterNotices {
    DeadLetterNotices {
        store: Arc::clone(store),
        delivery_queue: delivery_queue.clone(),
        topic: DEAD_LETTER_EVENTS_TOPIC.to_string(),
    }
}

/// The runner's queues, whose messages are sealed with its queue key (#34 item 2).
#[derive(Clone)]
struct SealedQueues {
    delivery: Arc<SqsQueue>,
    control: Arc<SqsQueue>,
    replay: Arc<SqsQueue>,
    dead_letter: Arc<SqsQueue>,
    /// O1.
    ordered: Arc<SqsQueue>,
    /// O1: where `deliver` parks ordered messages that cannot be read.
    ordered_redrive: Arc<SqsQueue>,
}

/// The runner's queue key and its queues, sealed with it.
async fn sealed_queues(
    sdk: &SdkConfig,
    sqs: &aws_sdk_sqs::Client,
    resources: &Resources,
) -> anyhow::Result<(QueueKey, SealedQueues)> {
    // `provision` made it if it was missing.
    let key = queue_key(sdk, &resources.names.queue_key_secret, Duration::ZERO)
        .await
        .context("could not read the runner's queue key")?;
    let sealed_with = |url: &str| Arc::new(SqsQueue::new(sqs.clone(), url, key.clone()));
    let queues = SealedQueues {
        delivery: sealed_with(&resources.delivery_queue_url),
        control: sealed_with(&resources.control_queue_url),
        replay: sealed_with(&resources.replay_queue_url),
        dead_letter: sealed_with(&resources.dead_letter_queue_url),
        ordered: sealed_with(&resources.ordered_queue_url),
        ordered_redrive: sealed_with(&resources.ordered_redrive_queue_url),
    };
    Ok((key, queues))
}

/// The runner's `deliver` instances: as many as invocations run at once, each with its own
/// request limits and connection pool (a pool keeps one instance's most per endpoint idle);
/// they share the caches, the stores and the subscriptions' caps (whose slots are in the table
/// anyway).
fn deliver_instances(
    ports: DeliverPorts,
    settings: DeliverySettings,
    config: &RunnerConfig,
) -> anyhow::Result<Arc<Instances<Deliver>>> {
    let count = config.concurrency.max(1);
    // Each file descriptor a connection; every instance may hold its total of them.
    raise_open_file_limit(count, &config.delivery_concurrency);
    let sender = Arc::new(settings.http_sender_with(config.resolver.clone())?);
    let first = Deliver::new(ports, sender, settings);
    let mut all = Vec::with_capacity(count);
    for _ in 1..count {
        let sender = first.settings.http_sender_with(config.resolver.clone())?;
        all.push(Arc::new(first.beside(Arc::new(sender))));
    }
    all.push(Arc::new(first));
    Ok(Instances::new(all))
}

/// Counts an invocation stopped at its deadline, billed for its whole timeout (`timeout_ms`)
/// as Lambda bills it, on the function's line of `BilledTime`.
fn billing_stopped(
    stats: &Arc<Mutex<RunnerStats>>,
    timeout_ms: u64,
    bill: fn(&mut BilledTime) -> &mut u64,
) -> poller::OnStopped {
    let stats = Arc::clone(stats);
    Arc::new(move || {
        if let Ok(mut s) = stats.lock() {
            s.stopped_invocations += 1;
            *bill(&mut s.billed) += timeout_ms;
        }
    })
}

/// One `deliver` invocation of the runner: a free instance handles the batch before its
/// deadline, and the runner's stats count what it did.
fn invoke_deliver(
    instances: Arc<Instances<Deliver>>,
    stats: Arc<Mutex<RunnerStats>>,
    key: QueueKey,
) -> poller::Invoke {
    Arc::new(move |event, deadline| {
        let instances = Arc::clone(&instances);
        let stats = Arc::clone(&stats);
        let event = sealed(event, &key, "delivery", &stats);
        Box::pin(async move {
            let deliver = instances.take().await;
            let started = std::time::Instant::now();
            let queue_waits = Latencies::queue_waits(&event, Utc::now());
            let messages = event.records.len();
            let outcome = deliver.handle_until(event, deadline).await;
            if let Ok(mut s) = stats.lock() {
                s.latencies.record(&queue_waits, &outcome);
                s.deliver.add(&outcome.report);
                s.deliver_invocations += 1;
                s.largest_deliver_batch = s.largest_deliver_batch.max(messages);
                s.billed.deliver_ms += billed_ms(started);
            }
            outcome.failed_message_ids
        })
    })
}

/// One `dead-letter` invocation of the runner, counted in its stats.
fn invoke_dead_letter(
    writer: Arc<DeadLetterWriter>,
    stats: Arc<Mutex<RunnerStats>>,
    key: QueueKey,
) -> poller::Invoke {
    Arc::new(move |event, deadline| {
        let writer = Arc::clone(&writer);
        let stats = Arc::clone(&stats);
        let event = sealed(event, &key, "dead-letter", &stats);
        Box::pin(async move {
            let started = std::time::Instant::now();
            let outcome = writer.handle_until(event, deadline).await;
            if let Ok(mut s) = stats.lock() {
                s.dead_letter.add(&outcome.report);
                s.dead_letter_invocations += 1;
                s.billed.dead_letter_ms += billed_ms(started);
            }
            outcome.failed_message_ids
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// #9, latency figures: a message's time in the queue runs from its SQS `SentTimestamp`
    /// to its invocation's start (never negative: clocks differ); a delivered event's from its
    /// publish to its answer, as deliver measured it.
    #[test]
    fn latencies_are_queue_waits_and_publish_to_answer() {
        let started: DateTime<Utc> = "2026-11-25T12:00:00.250Z".parse().unwrap();
        let mut event = SqsEvent::default();
        for sent in [
            "1795608000000",
            "1795608000240",
            "1795608001000",
            "not a time",
        ] {
            let mut r = aws_lambda_events::sqs::SqsMessage::default();
            r.attributes.insert("SentTimestamp".into(), sent.into());
            event.records.push(r);
        }
        let waits = Latencies::queue_waits(&event, started);
        assert_eq!(waits, [250, 10, 0]);
        let mut outcome = DeliverOutcome::default();
        outcome.by_subscription.insert(
            ("orders".into(), "audit".into()),
            gridrelay_deliver::metrics::SubscriptionMetrics {
                latency_ms: vec![12.4, 30.0],
                ..Default::default()
            },
        );
        let mut latencies = Latencies::default();
        latencies.record(&waits, &outcome);
        assert_eq!(latencies.queue_ms.len(), 3);
        assert_eq!(latencies.queue_ms.max(), 250);
        assert_eq!(latencies.publish_to_answer_ms.len(), 2);
        assert_eq!(latencies.publish_to_answer_ms.min(), 12);
    }

    /// #9: Lambda bills each invocation rounded up to the millisecond, never less than one.
    #[test]
    fn billed_time_is_whole_milliseconds_rounded_up_and_at_least_one() {
        assert_eq!(whole_ms(Duration::ZERO), 1);
        assert_eq!(whole_ms(Duration::from_micros(1)), 1);
        assert_eq!(whole_ms(Duration::from_micros(1000)), 1);
        assert_eq!(whole_ms(Duration::from_micros(1001)), 2);
        assert_eq!(whole_ms(Duration::from_secs(300)), 300_000);
    }

    /// Item 9 of the life-cycle issue: the runner behaves like the Lambda it stands in for. Its
    /// defaults let an invocation run its whole function timeout within its messages'
    /// visibility; settings where it could not are refused, naming the flags.
    #[test]
    fn an_invocation_never_outlives_its_messages_visibility() {
        let defaults = RunnerConfig::default();
        assert!(defaults.check().is_ok());
        assert!(defaults.visibility_timeout >= defaults.function_timeout);

        let short = RunnerConfig {
            visibility_timeout: Duration::from_secs(60),
            ..RunnerConfig::default()
        };
        let message = short.check().unwrap_err().to_string();
        assert!(
            message.contains("--visibility-timeout is 60 s")
                && message.contains("--function-timeout (300 s)"),
            "{message}"
        );

        // #34 item 12: a margin for the reads, one attempt (30 s), a margin for the writes.
        let tiny = RunnerConfig {
            function_timeout: Duration::from_secs(45),
            ..RunnerConfig::default()
        };
        let message = tiny.check().unwrap_err().to_string();
        assert!(message.contains("at least 50 s"), "{message}");
    }

    /// The first number set as `key` under `resource` in the SAM template.
    fn sam_number(resource: &str, key: &str) -> Option<u64> {
        let template = include_str!("../../infra/template.yaml");
        let start = template.find(&format!("\n  {resource}:\n"))?;
        template[start..]
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))?
            .trim()
            .parse()
            .ok()
    }

    /// The timeout `infra/cdk/lib/gridrelay.ts` gives function `name`, in seconds.
    fn cdk_timeout(name: &str) -> Option<u64> {
        let stack = include_str!("../../infra/cdk/lib/gridrelay.ts");
        let call = stack.split(&format!("fn('{name}', ")).nth(1)?;
        call.split("Duration.seconds(")
            .nth(1)?
            .split(')')
            .next()?
            .parse()
            .ok()
    }

    /// The runner stops `ingest` and `deliver` where Lambda would stop the stacks' functions:
    /// its timeouts are the SAM template's and the CDK stack's (#38: the memory benchmark holds
    /// the largest publish to `INGEST_TIMEOUT`). The delivery queue's visibility outlasts the
    /// longest window and an invocation, as `RunnerConfig::check` asks of the runner.
    #[test]
    fn the_runners_timeouts_are_the_stacks() {
        let timeout = |resource| sam_number(resource, "Timeout");
        assert_eq!(timeout("IngestFunction"), Some(INGEST_TIMEOUT.as_secs()));
        assert_eq!(cdk_timeout("Ingest"), Some(INGEST_TIMEOUT.as_secs()));
        assert_eq!(
            timeout("DeliverFunction"),
            Some(DEFAULT_FUNCTION_TIMEOUT_SECS)
        );
        assert_eq!(cdk_timeout("Deliver"), Some(DEFAULT_FUNCTION_TIMEOUT_SECS));
        let visibility = sam_number("DeliveryQueue", "VisibilityTimeout");
        assert!(
            visibility >= Some(DEFAULT_FUNCTION_TIMEOUT_SECS + batching::MAX_WINDOW_SECONDS),
            "{visibility:?}"
        );
    }

    /// #38: with a batching window a batch's first message stays hidden while the window fills
    /// and then while the invocation runs; a visibility that could end before both is refused.
    #[test]
    fn a_batching_window_fits_in_its_messages_visibility_with_the_invocation() {
        let windowed = |visibility: u64| RunnerConfig {
            visibility_timeout: Duration::from_secs(visibility),
            batching: EventSourceBatching::new(100, 60).unwrap(),
            ..RunnerConfig::default()
        };
        let message = windowed(330).check().unwrap_err().to_string();
        assert!(
            message.contains("--visibility-timeout is 330 s")
                && message.contains("--delivery-batching-window-seconds (360 s)"),
            "{message}"
        );
        assert!(windowed(360).check().is_ok());
    }
}
