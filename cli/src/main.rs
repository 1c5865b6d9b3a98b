//! `gridrelay`: manage topics and event subscriptions (mirroring `az eventgrid`), and run the
//! whole system locally.
//!
//! Every limit is checked before any AWS call, and a refused value is reported with its flag,
//! the value and the allowed range.
//!
//! This file holds the command line, its parsing and what every command shares; each command
//! is in its own module: `topic`, `subscription` (`event-subscription`), `redrive` and
//! `local`, and `view` shapes what they print.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use gridrelay_adapters::aws::{describe_error, queue_key};
use gridrelay_adapters::config::{self, TableNames};
use gridrelay_local::ResourceNames;
use gridrelay_ports::StoreError;
use gridrelay_shared::limits::LimitError;
use gridrelay_shared::queue_seal::QueueKey;

mod archive;
mod console;
mod journal;
mod local;
mod portal;
mod redrive;
mod replay;
mod subscription;
mod topic;
mod view;

use local::LocalArgs;
use redrive::RedriveCommand;
use subscription::{GlobalFlags, SubscriptionCommand};
use topic::TopicCommand;

#[derive(Parser)]
#[command(
    name = "gridrelay",
    version,
    about = "Event Grid's delivery contract on AWS: topics, subscriptions and a local runner"
)]
struct Cli {
    /// DynamoDB table of topics.
    #[arg(
        long,
        global = true,
        env = config::TOPICS_TABLE_ENV,
        default_value = config::DEFAULT_TOPICS_TABLE
    )]
    topics_table: String,
    /// DynamoDB table of event subscriptions.
    #[arg(
        long,
        global = true,
        env = config::SUBSCRIPTIONS_TABLE_ENV,
        default_value = config::DEFAULT_SUBSCRIPTIONS_TABLE
    )]
    subscriptions_table: String,
    /// Base URL of the publish API (API Gateway's URL on AWS, `gridrelay local`'s locally).
    #[arg(
        long,
        global = true,
        env = "GRIDRELAY_PUBLISH_URL",
        default_value = "http://127.0.0.1:7071"
    )]
    publish_url: String,
    /// Where the subscribers' portal's pages are (the stack's PortalUrl output): the links
    /// `event-subscription portal-link` and the console make point there. Default: the
    /// publish URL's /portal (right for the HTTP API front door; a function URL front door
    /// gives the portal a URL of its own).
    #[arg(long, global = true, env = "GRIDRELAY_PORTAL_URL")]
    portal_url: Option<String>,
    /// DynamoDB table of endpoint health, where `event-subscription show` reads how delivery
    /// to the endpoint goes.
    #[arg(
        long,
        global = true,
        env = config::DELIVERY_STATE_TABLE_ENV,
        default_value = config::DEFAULT_DELIVERY_STATE_TABLE
    )]
    delivery_state_table: String,
    /// Name prefix of the Secrets Manager secrets holding secret delivery header values.
    #[arg(
        long,
        global = true,
        env = config::SECRET_PREFIX_ENV,
        default_value = config::DEFAULT_SECRET_PREFIX
    )]
    secret_prefix: String,
    /// The delivery queue (a URL, or a queue name to look up), where `event-subscription
    /// create` asks the service for the endpoint validation handshake.
    #[arg(
        long,
        global = true,
        env = config::DELIVERY_QUEUE_URL_ENV,
        default_value = "gridrelay-delivery"
    )]
    delivery_queue: String,
    /// The control queue (a URL, or a queue name to look up), where `event-subscription
    /// create` and `update` ask the service for the handshake and expiry steps: the stack's
    /// ControlQueueUrl output. Default: `<prefix>-control` beside a delivery queue named
    /// `<prefix>-delivery`.
    #[arg(long, global = true, env = config::CONTROL_QUEUE_URL_ENV)]
    control_queue: Option<String>,
    /// The replay queue (a URL, or a queue name to look up), where `redrive queue` puts back
    /// the parked deliveries of replays: the stack's ReplayQueueUrl output. Default:
    /// `<prefix>-replay` beside a delivery queue named `<prefix>-delivery`.
    #[arg(long, global = true, env = config::REPLAY_QUEUE_URL_ENV)]
    replay_queue: Option<String>,
    /// The ordered (FIFO) queue ordered subscriptions' events go to (O1): the stack's
    /// OrderedQueueUrl output. `event-subscription create|update --ordering-key` needs it, so
    /// an installation without one never gets an ordered subscription. Default:
    /// `<prefix>-ordered.fifo` beside a delivery queue named `<prefix>-delivery`.
    #[arg(long, global = true, env = config::ORDERED_QUEUE_URL_ENV)]
    ordered_queue: Option<String>,
    /// The Secrets Manager secret (ARN or name) holding the key gridrelay seals its queue
    /// messages with: the stack's QueueKeySecret output. What the command line sends to the
    /// delivery queue (handshake steps, redriven messages) must carry its seal. Default:
    /// `<prefix>-queue-key` beside a delivery queue named `<prefix>-delivery` (a local
    /// installation).
    #[arg(long, global = true, env = config::QUEUE_KEY_SECRET_ENV)]
    queue_key_secret: Option<String>,
    /// The bucket the delivery journal and topic archives are written to (the stack's
    /// JournalBucket output), read by `event show`, `event-subscription attempts` and
    /// `archive list`. Default: `<prefix>-journal` beside a
    /// delivery queue named `<prefix>-delivery` (a local installation).
    #[arg(long, global = true, env = config::JOURNAL_BUCKET_ENV)]
    journal_bucket: Option<String>,
    /// The DynamoDB table of replays (the stack's ReplaysTableName output), for `replay`.
    /// Default: `<prefix>-replays` beside a delivery queue named `<prefix>-delivery`.
    #[arg(long, global = true, env = config::REPLAYS_TABLE_ENV)]
    replays_table: Option<String>,
    /// The topic archive's Firehose streams, one per retention class, as `1=name,7=name,…`
    /// (the stack's ArchiveStreamNames output): `replay start` reads their buffering interval
    /// to know when a window is all written. Default: `<prefix>-archive-1d` and so on beside a
    /// delivery queue named `<prefix>-delivery`.
    #[arg(long, global = true, env = config::ARCHIVE_STREAMS_ENV)]
    archive_streams: Option<String>,
    /// The delivery journal's Firehose stream (the stack's JournalStreamName output): the
    /// console reads its buffering interval to say how far behind the journal can be.
    /// Default: `<prefix>-journal` beside a delivery queue named `<prefix>-delivery`.
    #[arg(long, global = true, env = config::JOURNAL_STREAM_ENV)]
    journal_stream: Option<String>,
    /// The Secrets Manager secret (ARN or name) holding the key subscribers' portal links are
    /// signed with: the stack's PortalKeySecret output. Default: `<prefix>-portal-key` beside
    /// a delivery queue named `<prefix>-delivery` (a local installation).
    #[arg(long, global = true, env = config::PORTAL_KEY_SECRET_ENV)]
    portal_key_secret: Option<String>,
    /// Networks (comma-separated CIDRs) endpoints may be in although not public, where plain
    /// http:// is allowed too. Default for `local`: loopback. Default for `event-subscription
    /// create`: loopback when AWS_ENDPOINT_URL is on this machine (a local stack), else none;
    /// give the stack's AllowedNetworks on AWS.
    #[arg(long, global = true, env = config::ALLOWED_NETWORKS_ENV)]
    allowed_networks: Option<String>,
    /// AWS resources (ARNs or ARN patterns, `*` and `?` as in IAM, comma-separated) events
    /// may be delivered to: an `--endpoint-type` other than webhook must name one. Default:
    /// every one when AWS_ENDPOINT_URL is on this machine (a local stack), else none; give
    /// the stack's DeliveryDestinationArns on AWS.
    #[arg(long, global = true, env = config::DELIVERY_DESTINATIONS_ENV)]
    delivery_destinations: Option<String>,
    /// What topics and event subscriptions are printed as: json (shaped like `az
    /// eventgrid`'s) or table.
    #[arg(long, short = 'o', global = true, value_enum, default_value = "json")]
    output: OutputFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Topics: named publish endpoints with two keys.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Event subscriptions: which endpoint gets a topic's events, and how.
    #[command(subcommand, name = "event-subscription")]
    EventSubscription(SubscriptionCommand),
    /// Run the publish API and the delivery and dead-letter workers against AWS_ENDPOINT_URL.
    Local(LocalArgs),
    /// Move parked or dead-lettered events back into delivery.
    #[command(subcommand)]
    Redrive(RedriveCommand),
    /// Events as the delivery journal saw them.
    #[command(subcommand)]
    Event(journal::EventCommand),
    /// What topics with a retention archived, for replays.
    #[command(subcommand)]
    Archive(archive::ArchiveCommand),
    /// Send a window of a topic's archive again: start, show, list and cancel replays.
    #[command(subcommand)]
    Replay(replay::ReplayCommand),
    /// Serve the operator console on 127.0.0.1: subscriptions at a glance, their attempts and
    /// dead letters, and events' lives, in a browser. Prints the URL to open (it holds this
    /// run's token).
    Console(console::ConsoleArgs),
    /// The key subscribers' portal links are signed with.
    #[command(subcommand, name = "portal-key")]
    PortalKey(portal::PortalKeyCommand),
}

/// What `--output` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OutputFormat {
    /// JSON shaped like `az eventgrid`'s.
    Json,
    /// A table, for people.
    Table,
}

/// The flag a setting is given with.
fn flag_of(field: &str) -> &str {
    match field {
        "maxEventsPerBatch" => "--max-events-per-batch",
        "preferredBatchSizeInKilobytes" => "--preferred-batch-size-in-kilobytes",
        "maxDeliveryAttempts" => "--max-delivery-attempts",
        "eventTimeToLiveInMinutes" => "--event-ttl",
        "maxConcurrentRequests" => "--max-concurrent-requests",
        "maxEventsPerSecond" => "--max-events-per-second",
        "deadLetterDestination" => "--deadletter-endpoint",
        "statusTable" => "--status-table",
        "endpoint" => "--endpoint",
        "endpointType" => "--endpoint-type",
        "deliveryDestinations" => "--delivery-destinations",
        "topic name" => "--topic-name / --name",
        "event subscription name" => "--name",
        "includedEventTypes" => "--included-event-types",
        "inputSchema" => "--input-schema",
        "inputMappingFields" => "--input-mapping-fields",
        "inputMappingDefaultValues" => "--input-mapping-default-values",
        "eventDeliverySchema" => "--event-delivery-schema",
        f if f.starts_with("advancedFilter") => "--advanced-filter",
        "deliveryAttributeMapping" => "--delivery-attribute-mapping",
        "since" => "--since",
        "until" => "--until",
        "maxRequestsInFlight" => "--max-requests-in-flight",
        "maxRequestsPerEndpoint" => "--max-requests-per-endpoint",
        "signingSecret" => "--signing-secret",
        "labels" => "--labels",
        "expirationTimeUtc" => "--expiration-date",
        "tags" => "--tags",
        "retentionDays" => "--retention-days",
        "dedupWindowSeconds" => "--dedup-window-seconds",
        "journalAnswerBytes" => "--journal-answer-bytes",
        "orderingKey" => "--ordering-key",
        "startTime" => "--start-time",
        "replay name" => "--name",
        "rate" => "--rate",
        "subscription" => "--subscription",
        "endTime" => "--end-time",
        "gracePeriodHours" => "--grace-period-hours",
        gridrelay_shared::outbound::ALLOWED_NETWORKS_FIELD => "--allowed-networks",
        f if f.starts_with("configCacheSeconds") => "--config-cache-seconds",
        other => other,
    }
}

/// An input the command refuses; exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("invalid {flag}: {problem}")]
struct InvalidInput {
    flag: String,
    problem: LimitError,
}

fn invalid(e: LimitError) -> anyhow::Error {
    InvalidInput {
        flag: flag_of(&e.field).to_string(),
        problem: e,
    }
    .into()
}

/// Takes every `--advanced-filter` occurrence out of the command line, each with its words:
/// up to the next word that starts with `--` (another flag), so flags work in any order as in
/// `az`, while values that start with one `-` (`-5`, `-50,-1`, `-beta`) stay values. The rest
/// of the command line is returned for clap.
fn take_advanced_filters(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> (Vec<std::ffi::OsString>, Vec<Vec<String>>) {
    let mut rest = Vec::new();
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut in_filter = false;
    for arg in args {
        let word = arg.to_string_lossy();
        if word == "--advanced-filter" {
            groups.push(Vec::new());
            in_filter = true;
        } else if in_filter && !word.starts_with("--") {
            if let Some(group) = groups.last_mut() {
                group.push(word.into_owned());
            }
        } else {
            in_filter = false;
            rest.push(arg);
        }
    }
    (rest, groups)
}

/// Parses the command line, keeping the words of each `--advanced-filter` and
/// `--delivery-attribute-mapping` occurrence together.
fn parse_cli() -> Cli {
    let (args, advanced_filters) = take_advanced_filters(std::env::args_os());
    let matches = Cli::command().get_matches_from(args);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let takes_filters = matches!(
        cli.command,
        Command::EventSubscription(SubscriptionCommand::Create(_) | SubscriptionCommand::Update(_))
    );
    if !advanced_filters.is_empty() && !takes_filters {
        Cli::command()
            .error(
                clap::error::ErrorKind::UnknownArgument,
                "--advanced-filter is taken by `event-subscription create` and `update` only",
            )
            .exit();
    }
    let (command, settings) = match &mut cli.command {
        Command::EventSubscription(SubscriptionCommand::Create(c)) => ("create", &mut c.settings),
        Command::EventSubscription(SubscriptionCommand::Update(u)) => ("update", &mut u.settings),
        _ => return cli,
    };
    settings.advanced_filter_groups = advanced_filters;
    // Each occurrence of the flag, its words kept together.
    settings.delivery_attribute_groups = matches
        .subcommand_matches("event-subscription")
        .and_then(|m| m.subcommand_matches(command))
        .and_then(|m| m.get_occurrences::<String>("delivery_attribute_mapping"))
        .map(|groups| groups.map(|g| g.cloned().collect()).collect())
        .unwrap_or_default();
    cli
}

/// Where the portal's pages are: `--portal-url`, or the publish URL's `/portal`.
fn portal_pages(portal_url: Option<&str>, publish_url: &str) -> String {
    portal_url.map_or_else(
        || {
            format!(
                "{}{}",
                publish_url.trim_end_matches('/'),
                gridrelay_portal::PORTAL_PATH
            )
        },
        str::to_string,
    )
}

fn main() -> ExitCode {
    let cli = parse_cli();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,aws_config=warn")),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<InvalidInput>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Runs the command given; each command is run by its own module.
async fn run(cli: Cli) -> anyhow::Result<()> {
    let tables = TableNames {
        topics: cli.topics_table.clone(),
        subscriptions: cli.subscriptions_table.clone(),
    };
    let own = OwnQueues {
        delivery: &cli.delivery_queue,
        control: cli.control_queue.as_deref(),
        replay: cli.replay_queue.as_deref(),
        key_secret: cli.queue_key_secret.as_deref(),
    };
    match cli.command {
        Command::Console(args) => {
            let beside = |given: Option<&str>, what: Beside| {
                beside_delivery_queue(given, &cli.delivery_queue, what)
            };
            let resources = console::ConsoleResources {
                tables,
                delivery_state_table: cli.delivery_state_table.clone(),
                delivery_queue: cli.delivery_queue.clone(),
                queue_key_secret: cli.queue_key_secret.clone(),
                journal_bucket: journal::journal_bucket(
                    cli.journal_bucket.as_deref(),
                    &cli.delivery_queue,
                )?,
                journal_stream: beside_delivery_queue(
                    cli.journal_stream.as_deref(),
                    &cli.delivery_queue,
                    Beside::JournalStream,
                )
                .ok(),
                secret_prefix: cli.secret_prefix.clone(),
                replays: console::ReplayPlaces {
                    table: beside(cli.replays_table.as_deref(), Beside::ReplaysTable).ok(),
                    archive_stream: beside(cli.archive_streams.as_deref(), Beside::ArchiveStreams)
                        .ok()
                        .and_then(|streams| replay::buffering_stream(&streams)),
                    control_queue: cli.control_queue.clone(),
                    replay_queue: cli.replay_queue.clone(),
                },
                portal: beside(cli.portal_key_secret.as_deref(), Beside::PortalKeySecret)
                    .ok()
                    .map(|key_secret| console::PortalLinks {
                        portal_url: portal_pages(cli.portal_url.as_deref(), &cli.publish_url),
                        key_secret,
                    }),
            };
            console::run_console(args, resources).await
        }
        Command::Local(args) => local::run_local(args, cli.allowed_networks.as_deref()).await,
        Command::Redrive(cmd) => redrive::redrive_command(cmd, tables, own).await,
        Command::Topic(cmd) => {
            let journal_bucket =
                journal::journal_bucket(cli.journal_bucket.as_deref(), &cli.delivery_queue).ok();
            topic::run_topic(cmd, tables, &cli.publish_url, cli.output, journal_bucket).await
        }
        Command::Event(journal::EventCommand::Show(args)) => {
            let bucket =
                journal::journal_bucket(cli.journal_bucket.as_deref(), &cli.delivery_queue)?;
            journal::show_event(args, &bucket, cli.output).await
        }
        Command::Replay(cmd) => {
            let beside = |given: Option<&str>, what: Beside| {
                beside_delivery_queue(given, &cli.delivery_queue, what)
            };
            let resources = replay::ReplayResources {
                tables,
                replays_table: beside(cli.replays_table.as_deref(), Beside::ReplaysTable)?,
                archive_stream: beside(cli.archive_streams.as_deref(), Beside::ArchiveStreams)
                    .ok()
                    .and_then(|streams| replay::buffering_stream(&streams)),
                queues: own,
            };
            replay::run_replay(cmd, resources, cli.output).await
        }
        Command::Archive(archive::ArchiveCommand::List(args)) => {
            let bucket =
                journal::journal_bucket(cli.journal_bucket.as_deref(), &cli.delivery_queue)?;
            archive::list_archived(args, tables, &bucket, cli.output).await
        }
        Command::EventSubscription(SubscriptionCommand::PortalLink(args)) => {
            let key_secret = beside_delivery_queue(
                cli.portal_key_secret.as_deref(),
                &cli.delivery_queue,
                Beside::PortalKeySecret,
            )?;
            let portal_url = portal_pages(cli.portal_url.as_deref(), &cli.publish_url);
            let places = portal::PortalPlaces {
                tables,
                portal_url: &portal_url,
                key_secret: &key_secret,
            };
            portal::portal_link(&args, &places, cli.output).await
        }
        Command::PortalKey(portal::PortalKeyCommand::Rotate) => {
            let key_secret = beside_delivery_queue(
                cli.portal_key_secret.as_deref(),
                &cli.delivery_queue,
                Beside::PortalKeySecret,
            )?;
            portal::rotate_key(&key_secret, cli.output).await
        }
        Command::EventSubscription(SubscriptionCommand::Attempts(args)) => {
            let bucket =
                journal::journal_bucket(cli.journal_bucket.as_deref(), &cli.delivery_queue)?;
            journal::list_attempts(args, &bucket, cli.output).await
        }
        Command::EventSubscription(cmd) => {
            let flags = GlobalFlags {
                tables,
                queues: own,
                secret_prefix: &cli.secret_prefix,
                delivery_state_table: &cli.delivery_state_table,
                allowed_networks: cli.allowed_networks.as_deref(),
                delivery_destinations: cli.delivery_destinations.as_deref(),
                ordered_queue: beside_delivery_queue(
                    cli.ordered_queue.as_deref(),
                    &cli.delivery_queue,
                    Beside::OrderedQueue,
                )
                .map_err(|e| e.to_string()),
                output: cli.output,
            };
            subscription::run_event_subscription(cmd, flags).await
        }
    }
}

/// A resource of the installation the command line can find beside its delivery queue.
#[derive(Clone, Copy)]
enum Beside {
    JournalBucket,
    ReplaysTable,
    ArchiveStreams,
    JournalStream,
    ControlQueue,
    ReplayQueue,
    OrderedQueue,
    PortalKeySecret,
}

impl Beside {
    /// Its flag, its environment variable, the stack's output that names it, and its name
    /// beside a delivery queue named `<prefix>-delivery`.
    fn describe(
        self,
        names: Option<ResourceNames>,
    ) -> (&'static str, &'static str, &'static str, Option<String>) {
        match self {
            Self::JournalBucket => (
                "--journal-bucket",
                config::JOURNAL_BUCKET_ENV,
                "JournalBucket",
                names.map(|n| n.journal_bucket),
            ),
            Self::ReplaysTable => (
                "--replays-table",
                config::REPLAYS_TABLE_ENV,
                "ReplaysTableName",
                names.map(|n| n.replays_table),
            ),
            Self::ArchiveStreams => (
                "--archive-streams",
                config::ARCHIVE_STREAMS_ENV,
                "ArchiveStreamNames",
                names
                    .map(|n| gridrelay_shared::archive::format_archive_streams(&n.archive_streams)),
            ),
            Self::JournalStream => (
                "--journal-stream",
                config::JOURNAL_STREAM_ENV,
                "JournalStreamName",
                names.map(|n| n.journal_stream),
            ),
            Self::ControlQueue => (
                "--control-queue",
                config::CONTROL_QUEUE_URL_ENV,
                "ControlQueueUrl",
                names.map(|n| n.control_queue),
            ),
            Self::ReplayQueue => (
                "--replay-queue",
                config::REPLAY_QUEUE_URL_ENV,
                "ReplayQueueUrl",
                names.map(|n| n.replay_queue),
            ),
            Self::OrderedQueue => (
                "--ordered-queue",
                config::ORDERED_QUEUE_URL_ENV,
                "OrderedQueueUrl",
                names.map(|n| n.ordered_queue),
            ),
            Self::PortalKeySecret => (
                "--portal-key-secret",
                config::PORTAL_KEY_SECRET_ENV,
                "PortalKeySecret",
                names.map(|n| n.portal_key_secret),
            ),
        }
    }
}

/// `given`, or `what` beside `delivery_queue` when that is named `<prefix>-delivery`.
fn beside_delivery_queue(
    given: Option<&str>,
    delivery_queue: &str,
    what: Beside,
) -> anyhow::Result<String> {
    if let Some(given) = given {
        return Ok(given.to_string());
    }
    let (flag, env, output, found) =
        what.describe(ResourceNames::beside_delivery_queue(delivery_queue));
    found.with_context(|| {
        format!(
            "set {flag} or {env} to the stack's {output} output (the delivery queue \
             {delivery_queue:?} is not named <prefix>-delivery, so the one beside it is unknown)"
        )
    })
}

/// The installation's delivery queue, as given, its control and replay queues and the secret
/// of the key their messages are sealed with, if given.
#[derive(Clone, Copy)]
struct OwnQueues<'a> {
    delivery: &'a str,
    control: Option<&'a str>,
    replay: Option<&'a str>,
    key_secret: Option<&'a str>,
}

impl OwnQueues<'_> {
    /// The control queue's URL: given, or the one beside a delivery queue named
    /// `<prefix>-delivery`, looked up by name.
    async fn control_url(&self, sqs: &aws_sdk_sqs::Client) -> anyhow::Result<String> {
        self.url_beside(sqs, self.control, Beside::ControlQueue)
            .await
    }

    /// The replay queue's URL, as the control queue's.
    async fn replay_url(&self, sqs: &aws_sdk_sqs::Client) -> anyhow::Result<String> {
        self.url_beside(sqs, self.replay, Beside::ReplayQueue).await
    }

    async fn url_beside(
        &self,
        sqs: &aws_sdk_sqs::Client,
        given: Option<&str>,
        what: Beside,
    ) -> anyhow::Result<String> {
        let queue = beside_delivery_queue(given, self.delivery, what)?;
        let (flag, env, output, _) = what.describe(None);
        queue_url(sqs, &queue, flag).await.with_context(|| {
            format!(
                "set {flag} or {env} to the queue's URL (the stack's {output} output; a stack \
                 made before the queue has none until it is updated: give it the delivery \
                 queue's URL meanwhile)"
            )
        })
    }

    /// The key the installation seals its queue messages with (#34 item 2): given, or the one
    /// beside a delivery queue named `<prefix>-delivery`.
    async fn key(&self, sdk: &aws_config::SdkConfig) -> anyhow::Result<QueueKey> {
        let secret = match self.key_secret {
            Some(secret) => secret.to_string(),
            None => ResourceNames::beside_delivery_queue(self.delivery)
                .map(|names| names.queue_key_secret)
                .with_context(|| {
                    format!(
                        "set --queue-key-secret or {} to the stack's QueueKeySecret output (the \
                         delivery queue {:?} is not named <prefix>-delivery, so its key's secret \
                         is unknown)",
                        config::QUEUE_KEY_SECRET_ENV,
                        self.delivery
                    )
                })?,
        };
        queue_key(sdk, &secret, Duration::ZERO)
            .await
            .with_context(|| {
                format!(
                    "no queue key: what is sent to the delivery queue is sealed with the key in \
                 secret {secret:?}; set --queue-key-secret or {} to the stack's QueueKeySecret \
                 output",
                    config::QUEUE_KEY_SECRET_ENV
                )
            })
    }
}

/// The delivery queue's URL: given, or looked up by name.
async fn delivery_queue_url(sqs: &aws_sdk_sqs::Client, queue: &str) -> anyhow::Result<String> {
    queue_url(sqs, queue, "--delivery-queue")
        .await
        .with_context(|| {
            format!(
                "set --delivery-queue or {} to the delivery queue's URL",
                config::DELIVERY_QUEUE_URL_ENV
            )
        })
}

/// A queue's URL: given, or looked up by name.
async fn queue_url(sqs: &aws_sdk_sqs::Client, queue: &str, flag: &str) -> anyhow::Result<String> {
    if queue.starts_with("http://") || queue.starts_with("https://") {
        return Ok(queue.to_string());
    }
    let found = sqs
        .get_queue_url()
        .queue_name(queue)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!(describe_error(&e)))
        .with_context(|| format!("could not find the queue {queue:?} ({flag})"))?;
    found
        .queue_url()
        .map(str::to_string)
        .with_context(|| format!("SQS returned no URL for {queue:?}"))
}

fn print(value: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints `value` as JSON, or `rows()` as a table with `--output table`.
fn print_as(
    output: OutputFormat,
    value: &serde_json::Value,
    rows: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json => print(value),
        OutputFormat::Table => {
            println!("{}", rows());
            Ok(())
        }
    }
}

fn store_error(e: StoreError) -> anyhow::Error {
    match e {
        StoreError::Unavailable(msg) => anyhow::anyhow!(
            "the subscription store is not reachable ({msg}); is `gridrelay local` running, or are the table names and AWS_ENDPOINT_URL right?"
        ),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::take_advanced_filters;

    /// #11 item 11: an `--advanced-filter` ends at the next `--` flag, wherever it is; words
    /// with one leading `-` are values.
    #[test]
    fn advanced_filters_end_at_the_next_flag() {
        let line = "gridrelay event-subscription create --advanced-filter data.amount NumberGreaterThan 100 \
            --delivery-attribute-mapping X static a --advanced-filter data.n NumberInRange -50,-1 -5,5 \
            --advanced-filter subject StringBeginsWith -beta --name s";
        let (rest, groups) = take_advanced_filters(line.split_whitespace().map(Into::into));
        let rest: Vec<String> = rest
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            rest,
            "gridrelay event-subscription create --delivery-attribute-mapping X static a --name s"
                .split(' ')
                .collect::<Vec<_>>()
        );
        assert_eq!(
            groups,
            vec![
                vec!["data.amount", "NumberGreaterThan", "100"],
                vec!["data.n", "NumberInRange", "-50,-1", "-5,5"],
                vec!["subject", "StringBeginsWith", "-beta"],
            ]
        );
    }
}
