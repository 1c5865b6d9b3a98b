//! `gridrelay replay start|show|list|cancel`: replays of a topic's archive (#35), run in the
//! stack by `deliver` in paced steps (`gridrelay_shared::replay`); the command line stores the
//! replay and sends its first step, and reads and cancels it.

use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use gridrelay_adapters::aws::{DynamoReplayStore, SqsQueue, buffering_interval, load_sdk_config};
use gridrelay_adapters::config::TableNames;
use gridrelay_ports::{MessageQueue, OutgoingMessage, ReplayStore, StoreError};
use gridrelay_shared::journal::{format_time, parse_past_time};
use gridrelay_shared::limits::{LimitError, validate_topic_name};
use gridrelay_shared::message::DeliveryQueueMessage;
use gridrelay_shared::replay::{
    DEFAULT_REPLAY_RATE, Replay, ReplayState, ReplayStep, ReplayTarget, STEP_GRACE, sealed_at,
    step_delay, validate_rate, validate_replay_name,
};
use serde_json::{Value, json};

use crate::topic::{existing_topic, open_store};
use crate::view::table;
use crate::{OutputFormat, OwnQueues, invalid, print_as, store_error};

#[derive(Subcommand)]
pub(super) enum ReplayCommand {
    /// Sends a window of a topic's archived events again, as new deliveries with a
    /// `gridrelay-replay` header, paced to a rate, run in the stack (it survives this command
    /// and the functions' restarts).
    Start(StartReplay),
    /// A replay's state and what it sent.
    Show(NamedReplay),
    /// A topic's replays, newest first.
    List(TopicReplays),
    /// Stops a replay after the step it is in.
    Cancel(NamedReplay),
    /// Sends a running replay's step again: for one `replay show` says is stalled (its step
    /// was lost, or parked on the redrive queue after an outage). Safe at any time: a copy of
    /// a step that is still on its way sends nothing twice.
    Resume(NamedReplay),
}

#[derive(Args)]
pub(super) struct StartReplay {
    #[arg(long)]
    topic_name: String,
    /// The replay's name (1 to 64 letters, digits, '-' and '_'), unique in its topic.
    #[arg(long)]
    name: String,
    /// The window's start (included): a span back from now (90m, 6h, 7d) or an RFC 3339 time.
    #[arg(long)]
    start_time: String,
    /// The window's end (not included), as --start-time. Default: now.
    #[arg(long)]
    end_time: Option<String>,
    /// A subscription to send to (again for more). Default: every subscription of the topic
    /// that receives events now; each gets the events its filter takes.
    #[arg(long = "subscription")]
    subscriptions: Vec<String>,
    /// Events a second, at most (1 to 10000): the replay never takes more of the delivery
    /// path than that from live traffic.
    #[arg(long, default_value_t = i64::from(DEFAULT_REPLAY_RATE), allow_negative_numbers = true)]
    rate: i64,
}

#[derive(Args)]
pub(super) struct NamedReplay {
    #[arg(long)]
    topic_name: String,
    #[arg(long)]
    name: String,
}

#[derive(Args)]
pub(super) struct TopicReplays {
    #[arg(long)]
    topic_name: String,
}

/// Where replays are: their table, the archive's stream (whose buffering says when a window is
/// all written) and the queue their steps go to.
pub(crate) struct ReplayResources<'a> {
    pub tables: TableNames,
    pub replays_table: String,
    /// None where neither given nor found beside the delivery queue: `start` then waits the
    /// longest buffering interval.
    pub archive_stream: Option<String>,
    pub queues: OwnQueues<'a>,
}

/// `gridrelay replay …`.
pub(super) async fn run_replay(
    cmd: ReplayCommand,
    resources: ReplayResources<'_>,
    output: OutputFormat,
) -> anyhow::Result<()> {
    let sdk = load_sdk_config().await;
    let replays = DynamoReplayStore::from_sdk(&sdk, &resources.replays_table);
    match cmd {
        ReplayCommand::Start(args) => start(args, &resources, &sdk, &replays, output).await,
        ReplayCommand::Show(args) => {
            check_names(&args)?;
            let replay = existing(&replays, &args).await?;
            print_as(output, &replay_view(&replay), || replay_rows(&[replay]))
        }
        ReplayCommand::List(args) => {
            validate_topic_name(&args.topic_name).map_err(invalid)?;
            let list = replays
                .list_replays(&args.topic_name)
                .await
                .map_err(replay_store_error)?;
            let value = Value::Array(list.iter().map(replay_view).collect());
            print_as(output, &value, || replay_rows(&list))
        }
        ReplayCommand::Cancel(args) => {
            check_names(&args)?;
            let replay = cancel(&replays, &args).await?;
            print_as(output, &replay_view(&replay), || replay_rows(&[replay]))
        }
        ReplayCommand::Resume(args) => {
            check_names(&args)?;
            let replay = existing(&replays, &args).await?;
            if replay.state != ReplayState::Running {
                bail!(
                    "replay {} is {:?}: only a running replay is resumed",
                    replay.name,
                    replay.state
                );
            }
            let queue = StepQueue::open(&sdk, resources.queues).await?;
            queue.send(&replay, Utc::now()).await?;
            print_as(output, &replay_view(&replay), || replay_rows(&[replay]))
        }
    }
}

/// A replay asked for, as the command line's flags (and the console's form) give it.
pub(crate) struct ReplayRequest<'a> {
    pub topic_name: &'a str,
    pub name: &'a str,
    /// A span back from now (90m, 6h, 7d) or an RFC 3339 time.
    pub start_time: &'a str,
    /// As `start_time`; `None`: now.
    pub end_time: Option<&'a str>,
    /// None: every subscription of the topic that receives events now.
    pub subscriptions: &'a [String],
    pub rate: i64,
}

/// The replay `request` asks for, every setting checked (the window against the topic's
/// retention, its creation and the archives' expiry; the subscriptions against the topic's),
/// its first step due once the archive's stream has written the window. Nothing is stored.
pub(crate) async fn plan_replay(
    request: &ReplayRequest<'_>,
    resources: &ReplayResources<'_>,
    sdk: &aws_config::SdkConfig,
    now: DateTime<Utc>,
) -> anyhow::Result<Replay> {
    validate_topic_name(request.topic_name).map_err(invalid)?;
    validate_replay_name(request.name).map_err(invalid)?;
    let rate = validate_rate(request.rate).map_err(invalid)?;
    let start = parse_past_time("startTime", request.start_time, now).map_err(invalid)?;
    let end = match request.end_time {
        Some(text) => parse_past_time("endTime", text, now).map_err(invalid)?,
        None => now,
    };
    let store = open_store(resources.tables.clone()).await;
    let topic = existing_topic(store.as_ref(), request.topic_name).await?;
    let window = crate::archive::topic_window(&topic, (start, end), now)?;
    let subscriptions = store
        .list_subscriptions(&topic.name)
        .await
        .map_err(store_error)?;
    let targets =
        choose_targets(&topic.name, &subscriptions, request.subscriptions, now).map_err(invalid)?;
    let buffer = archive_buffer(sdk, resources.archive_stream.as_deref()).await;
    let first_step_due = sealed_at(window.end, buffer).max(now);
    Ok(Replay::new(
        &topic.name,
        request.name,
        window,
        targets,
        rate,
        first_step_due,
        now,
    ))
}

/// Stores a planned replay ([`plan_replay`]) and sends its first step.
pub(crate) async fn start_replay(
    replay: &Replay,
    resources: &ReplayResources<'_>,
    sdk: &aws_config::SdkConfig,
    replays: &dyn ReplayStore,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    // What the first step needs, before anything is stored: a replay stored and not started
    // would keep its name.
    let queue = StepQueue::open(sdk, resources.queues).await?;
    match replays.create_replay(replay).await {
        Ok(()) => {}
        // A put the SDK made again after it had been written finds its own record.
        Err(StoreError::AlreadyExists(_))
            if replays
                .get_replay(&replay.topic, &replay.name)
                .await
                .ok()
                .flatten()
                .is_some_and(|stored| &stored == replay) => {}
        Err(StoreError::AlreadyExists(_)) => bail!(
            "topic {} has a replay named {} already (replay show --topic-name {} --name {}); \
             choose another name",
            replay.topic,
            replay.name,
            replay.topic,
            replay.name
        ),
        Err(other) => return Err(replay_store_error(other)),
    }
    queue.send(replay, now).await.with_context(|| {
        format!(
            "replay {} is stored but its first step was not sent: run `gridrelay replay resume \
             --topic-name {} --name {}`",
            replay.name, replay.topic, replay.name
        )
    })
}

async fn start(
    args: StartReplay,
    resources: &ReplayResources<'_>,
    sdk: &aws_config::SdkConfig,
    replays: &DynamoReplayStore,
    output: OutputFormat,
) -> anyhow::Result<()> {
    let request = ReplayRequest {
        topic_name: &args.topic_name,
        name: &args.name,
        start_time: &args.start_time,
        end_time: args.end_time.as_deref(),
        subscriptions: &args.subscriptions,
        rate: args.rate,
    };
    let now = Utc::now();
    let replay = plan_replay(&request, resources, sdk, now).await?;
    start_replay(&replay, resources, sdk, replays, now).await?;
    print_as(output, &replay_view(&replay), || replay_rows(&[replay]))
}

/// The replay's subscriptions: those named (each must be the topic's), or every one that
/// receives events now.
fn choose_targets(
    topic: &str,
    subscriptions: &[gridrelay_shared::subscription::Subscription],
    named: &[String],
    now: DateTime<Utc>,
) -> Result<Vec<ReplayTarget>, LimitError> {
    let target = |s: &gridrelay_shared::subscription::Subscription| ReplayTarget {
        name: s.name.clone(),
        id: s.id.clone(),
    };
    let receiving: Vec<_> = subscriptions.iter().filter(|s| s.receives(now)).collect();
    let names = || {
        let names: Vec<&str> = receiving.iter().map(|s| s.name.as_str()).collect();
        if names.is_empty() {
            format!("a subscription of topic {topic} that receives events (it has none)")
        } else {
            format!(
                "a subscription of topic {topic} that receives events: {}",
                names.join(", ")
            )
        }
    };
    if named.is_empty() {
        if receiving.is_empty() {
            return Err(LimitError::new("subscription", "(every one)", names()));
        }
        return Ok(receiving.into_iter().map(target).collect());
    }
    let mut targets: Vec<ReplayTarget> = Vec::new();
    for name in named {
        match receiving.iter().find(|s| &s.name == name) {
            Some(s) if !targets.iter().any(|t| t.id == s.id) => targets.push(target(s)),
            Some(_) => {}
            None => return Err(LimitError::new("subscription", name, names())),
        }
    }
    Ok(targets)
}

/// The stream whose buffering interval a replay waits past its window's end: any of the
/// archive's (`streams`, `1=name,7=name,…`; the stacks give them all the same interval). None,
/// said on stderr, where `streams` is not such a list.
pub(crate) fn buffering_stream(streams: &str) -> Option<String> {
    let var = gridrelay_adapters::config::ARCHIVE_STREAMS_ENV;
    match gridrelay_shared::archive::parse_archive_streams(var, streams) {
        Ok(streams) => streams.into_values().next(),
        Err(e) => {
            eprintln!("note: {e}");
            None
        }
    }
}

/// How long the archive's stream gathers records before it writes them (its buffering
/// interval): the longest Firehose allows, 900 s, where it cannot be read.
async fn archive_buffer(sdk: &aws_config::SdkConfig, stream: Option<&str>) -> Duration {
    const LONGEST: Duration = Duration::from_secs(900);
    let Some(stream) = stream else {
        eprintln!(
            "note: the archive's streams are not known (set --archive-streams or {} to the \
             stack's ArchiveStreamNames output); the replay waits the longest buffering \
             interval, 900 s, past the window's end",
            gridrelay_adapters::config::ARCHIVE_STREAMS_ENV
        );
        return LONGEST;
    };
    match buffering_interval(sdk, stream).await {
        Ok(interval) => interval.unwrap_or(LONGEST),
        Err(e) => {
            eprintln!(
                "note: the archive's stream {stream} could not be read ({e}); the replay waits \
                 the longest buffering interval, 900 s, past the window's end"
            );
            LONGEST
        }
    }
}

/// The control queue, where replays' steps go, sealed with the installation's key.
struct StepQueue(SqsQueue);

impl StepQueue {
    async fn open(sdk: &aws_config::SdkConfig, queues: OwnQueues<'_>) -> anyhow::Result<Self> {
        let sqs = aws_sdk_sqs::Client::new(sdk);
        let url = queues.control_url(&sqs).await?;
        Ok(Self(SqsQueue::new(sqs, url, queues.key(sdk).await?)))
    }

    /// Sends the step for the record as it is, delayed until it is due (at most the 15
    /// minutes a queue delays: a step due later waits again when it comes).
    async fn send(&self, replay: &Replay, now: DateTime<Utc>) -> anyhow::Result<()> {
        let wait = replay
            .next_step_due
            .map_or(chrono::Duration::zero(), |due| due - now);
        let message = OutgoingMessage {
            body: DeliveryQueueMessage::Replay(ReplayStep::of(replay)).to_body()?,
            delay: step_delay(wait),
            group: None,
        };
        match self.0.send_all(&[message]).await.pop() {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(anyhow::anyhow!(e).context("could not send the replay's step")),
            None => bail!("could not send the replay's step"),
        }
    }
}

fn check_names(args: &NamedReplay) -> anyhow::Result<()> {
    validate_topic_name(&args.topic_name).map_err(invalid)?;
    validate_replay_name(&args.name).map_err(invalid)
}

async fn existing(replays: &dyn ReplayStore, args: &NamedReplay) -> anyhow::Result<Replay> {
    replays
        .get_replay(&args.topic_name, &args.name)
        .await
        .map_err(replay_store_error)?
        .with_context(|| {
            format!(
                "topic {} has no replay named {} (replay list --topic-name {})",
                args.topic_name, args.name, args.topic_name
            )
        })
}

/// Cancels a running replay (read, then written over the version read; again if a step
/// moved it meanwhile). One that already ended is shown as it is.
async fn cancel(replays: &dyn ReplayStore, args: &NamedReplay) -> anyhow::Result<Replay> {
    for _ in 0..5 {
        let replay = existing(replays, args).await?;
        if replay.state != ReplayState::Running {
            return Ok(replay);
        }
        let cancelled = replay.cancelled(Utc::now());
        match replays.update_replay(&cancelled, replay.version).await {
            Ok(()) => return Ok(cancelled),
            Err(StoreError::Conflict(_)) => continue,
            Err(e) => return Err(replay_store_error(e)),
        }
    }
    bail!("replay {} kept moving; try again", args.name)
}

fn replay_store_error(e: StoreError) -> anyhow::Error {
    match e {
        StoreError::Unavailable(msg) => anyhow::anyhow!(
            "the replays' table is not reachable ({msg}); set --replays-table or {} to the \
             stack's ReplaysTableName output",
            gridrelay_adapters::config::REPLAYS_TABLE_ENV
        ),
        other => other.into(),
    }
}

/// Whether a running replay's step is overdue past the grace a lost step is sent again after:
/// it is stalled (`replay resume` sends it).
fn stalled(r: &Replay) -> bool {
    r.state == ReplayState::Running
        && r.next_step_due
            .is_some_and(|due| Utc::now() > due + STEP_GRACE + chrono::Duration::minutes(1))
}

/// A replay as printed.
pub(crate) fn replay_view(r: &Replay) -> Value {
    json!({
        "stalled": stalled(r),
        "topic": r.topic,
        "name": r.name,
        "state": r.state,
        "startTime": format_time(r.start_time),
        "endTime": format_time(r.end_time),
        "subscriptions": r.subscriptions.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        "rate": r.rate,
        "eventsSent": r.events_sent,
        "nextStepDue": r.next_step_due.map(format_time),
        "createdAt": format_time(r.created_at),
        "updatedAt": format_time(r.updated_at),
    })
}

fn replay_rows(replays: &[Replay]) -> String {
    let rows: Vec<Vec<String>> = replays
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                if stalled(r) {
                    "Running (stalled: replay resume)".to_string()
                } else {
                    format!("{:?}", r.state)
                },
                format!(
                    "{} to {}",
                    format_time(r.start_time),
                    format_time(r.end_time)
                ),
                r.subscriptions
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                r.rate.to_string(),
                r.events_sent.to_string(),
                r.next_step_due.map(format_time).unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &[
            "Name",
            "State",
            "Window",
            "Subscriptions",
            "Rate",
            "Events sent",
            "Next step",
        ],
        &rows,
    )
}
