//! `gridrelay redrive`: parked or dead-lettered events moved back into delivery.

use anyhow::Context;
use clap::{Args, Subcommand};
use gridrelay_adapters::aws::{
    DynamoSubscriptionStore, S3ObjectStore, SqsQueue, load_sdk_config, s3_client,
};
use gridrelay_adapters::config::TableNames;
use gridrelay_local::ResourceNames;
use gridrelay_ports::redrive::{
    DeadLetterSelection, QueueKind, RedriveTargets, redrive_dead_letters, redrive_queue,
};
use gridrelay_shared::limits::{LimitError, validate_topic_name};
use serde_json::json;

use crate::{OwnQueues, delivery_queue_url, invalid, print, queue_url};

#[derive(Subcommand)]
pub(super) enum RedriveCommand {
    /// Move the messages of a redrive queue (where SQS parks messages whose processing kept
    /// failing) back to the queue they came from; messages that cannot be read stay.
    Queue(RedriveQueueArgs),
    /// Deliver dead-lettered events again: read a topic's dead-letter objects, pick records by
    /// subscription, time and reason, enqueue their events as new deliveries (attempts and TTL
    /// start again), and take them out of their objects.
    DeadLetters(RedriveDeadLettersArgs),
}

#[derive(Args)]
pub(super) struct RedriveQueueArgs {
    /// Redrive the dead-letter queue's redrive queue (dead-letter messages back to the
    /// dead-letter queue) instead of the delivery queue's.
    #[arg(long)]
    dead_letter: bool,
    /// The redrive queue: a URL, or a name to look up (default <prefix>-delivery-redrive, or
    /// <prefix>-dead-letter-redrive with --dead-letter, where the delivery queue is
    /// <prefix>-delivery).
    #[arg(long)]
    from: Option<String>,
    /// Where its messages go back to (a URL or name); default: the delivery queue
    /// (--delivery-queue), or <prefix>-dead-letter with --dead-letter.
    #[arg(long)]
    to: Option<String>,
    /// Report what would move; move nothing.
    #[arg(long)]
    dry_run: bool,
    /// Move at most this many messages.
    #[arg(long, default_value_t = 10_000)]
    max_messages: usize,
}

#[derive(Args)]
pub(super) struct RedriveDeadLettersArgs {
    #[arg(long)]
    topic_name: String,
    /// One subscription (default: every subscription of the topic with a dead-letter
    /// destination).
    #[arg(long)]
    name: Option<String>,
    /// Only objects of hours that end after this time (RFC 3339, e.g. 2026-11-23T10:00:00Z).
    #[arg(long)]
    since: Option<String>,
    /// Only objects of hours that begin before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    /// Only records with this deadLetterReason (e.g. MaxDeliveryAttemptsExceeded); repeat for
    /// more.
    #[arg(long)]
    reason: Vec<String>,
    /// Only the event with this `id`; repeat for more.
    #[arg(long)]
    event_id: Vec<String>,
    /// Report what would move; change nothing.
    #[arg(long)]
    dry_run: bool,
}

impl RedriveDeadLettersArgs {
    fn selection(&self) -> Result<DeadLetterSelection, LimitError> {
        validate_topic_name(&self.topic_name)?;
        let time = |flag: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|v| {
                    chrono::DateTime::parse_from_rfc3339(v)
                        .map(|t| t.to_utc())
                        .map_err(|_| {
                            LimitError::new(
                                flag,
                                format!("{v:?}"),
                                "an RFC 3339 time, e.g. 2026-11-23T10:00:00Z",
                            )
                        })
                })
                .transpose()
        };
        let since = time("since", &self.since)?;
        let until = time("until", &self.until)?;
        if let (Some(s), Some(u)) = (since, until)
            && s >= u
        {
            return Err(LimitError::new(
                "until",
                u.to_rfc3339(),
                format!("a time after --since ({})", s.to_rfc3339()),
            ));
        }
        Ok(DeadLetterSelection {
            topic: self.topic_name.clone(),
            subscription: self.name.clone(),
            since,
            until,
            reasons: self.reason.clone(),
            ids: self.event_id.clone(),
            records: Vec::new(),
        })
    }
}

/// `gridrelay redrive`: the subcommand given.
pub(super) async fn redrive_command(
    cmd: RedriveCommand,
    tables: TableNames,
    queues: OwnQueues<'_>,
) -> anyhow::Result<()> {
    match cmd {
        RedriveCommand::Queue(args) => redrive_queue_command(args, queues).await,
        RedriveCommand::DeadLetters(args) => {
            redrive_dead_letters_command(args, tables, queues).await
        }
    }
}

/// `gridrelay redrive queue`: parked messages back to the queue they came from.
async fn redrive_queue_command(
    args: RedriveQueueArgs,
    queues: OwnQueues<'_>,
) -> anyhow::Result<()> {
    let delivery_queue = queues.delivery;
    // Unnamed queues are the ones beside the delivery queue, named with its prefix.
    let beside = || {
        ResourceNames::beside_delivery_queue(delivery_queue).with_context(|| {
            format!(
                "the delivery queue {delivery_queue:?} is not named <prefix>-delivery, so the \
                 queues beside it are unknown: pass --from and --to"
            )
        })
    };
    let sdk = load_sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let kind = if args.dead_letter {
        QueueKind::DeadLetter
    } else {
        QueueKind::Delivery
    };
    let from = match (&args.from, kind) {
        (Some(from), _) => from.clone(),
        (None, QueueKind::DeadLetter) => beside()?.dead_letter_redrive_queue,
        (None, QueueKind::Delivery) => beside()?.delivery_redrive_queue,
    };
    let from = queue_url(&sqs, &from, "--from").await?;
    let to = match (&args.to, kind) {
        (Some(to), _) => queue_url(&sqs, to, "--to").await?,
        (None, QueueKind::DeadLetter) => {
            queue_url(&sqs, &beside()?.dead_letter_queue, "--to").await?
        }
        (None, QueueKind::Delivery) => delivery_queue_url(&sqs, delivery_queue).await?,
    };
    // Handshake, expiry and replay steps parked with the deliveries go back to the control
    // queue, replays' deliveries to the replay queue.
    let (control_url, replay_url) = match kind {
        QueueKind::Delivery => {
            // A stack made before the replay queue has none: its replays' deliveries travel
            // on the delivery queue, as its deliver function sends them.
            let replay_url = match queues.replay_url(&sqs).await {
                Ok(url) => url,
                Err(e) => {
                    eprintln!(
                        "note: replays' deliveries go back to the delivery queue: no replay \
                         queue found ({e:#})"
                    );
                    to.clone()
                }
            };
            (queues.control_url(&sqs).await?, replay_url)
        }
        QueueKind::DeadLetter => (to.clone(), to.clone()),
    };
    let key = queues.key(&sdk).await?;
    let sealed = |url: &str| SqsQueue::new(sqs.clone(), url, key.clone());
    let (delivery, control, replay) = (sealed(&to), sealed(&control_url), sealed(&replay_url));
    let report = redrive_queue(
        &sealed(&from),
        RedriveTargets {
            delivery: &delivery,
            control: &control,
            replay: &replay,
        },
        kind,
        args.dry_run,
        args.max_messages,
    )
    .await?;
    print(&json!({
        "dryRun": report.dry_run,
        "from": from,
        "to": to,
        "messages": report.messages(),
        "moved": report.moved.iter().map(|(whose, m)| {
            (whose.clone(), json!({"messages": m.messages, "events": m.events}))
        }).collect::<serde_json::Map<_, _>>(),
        "leftUnreadableOrOfAnotherKind": report.unreadable,
        "leftUnsealed": report.unsealed,
    }))
}

/// `gridrelay redrive dead-letters`: dead-lettered events delivered again.
async fn redrive_dead_letters_command(
    args: RedriveDeadLettersArgs,
    tables: TableNames,
    queues: OwnQueues<'_>,
) -> anyhow::Result<()> {
    let delivery_queue = queues.delivery;
    let selection = args.selection().map_err(invalid)?;
    let sdk = load_sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let store = DynamoSubscriptionStore::from_sdk(&sdk, tables);
    let objects = S3ObjectStore::new(s3_client(&sdk));
    let queue = SqsQueue::new(
        sqs.clone(),
        delivery_queue_url(&sqs, delivery_queue).await?,
        queues.key(&sdk).await?,
    );
    let report = redrive_dead_letters(
        &store,
        &objects,
        &queue,
        &selection,
        args.dry_run,
        chrono::Utc::now(),
    )
    .await?;
    print(&json!({
        "dryRun": report.dry_run,
        "events": report.events(),
        "subscriptions": report.subscriptions.iter().map(|s| json!({
            "name": s.subscription,
            "skipped": s.skipped,
            "objectsRead": s.objects_read,
            "objectsDeleted": s.objects_deleted,
            "objectsRewritten": s.objects_rewritten,
            "moved": s.moved,
            "recordsLeft": s.left,
            "objectsOfOtherSubscriptions": s.objects_of_other_subscriptions,
            "events": s.events.iter().map(|e| json!({
                "id": e.id,
                "deadLetterReason": e.reason,
                "location": e.location,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    }))
}
