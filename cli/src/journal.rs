//! `gridrelay event show` and `gridrelay event-subscription attempts`: questions answered from
//! the delivery journal (#35), read from the objects its stream wrote to S3.

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use gridrelay_adapters::aws::{S3JournalSource, load_sdk_config, s3_client};
use gridrelay_ports::{JournalRead, JournalSource};
use gridrelay_shared::journal::{
    EventLife, JOURNAL_PREFIX, JournalEntry, Next, Standing, Step, format_time, latest_attempts,
    parse_since,
};
use gridrelay_shared::limits::{validate_subscription_name, validate_topic_name};

use crate::view::table;
use crate::{OutputFormat, invalid, print_as};

#[derive(Subcommand)]
pub(super) enum EventCommand {
    /// One event's life from the delivery journal: subscription by subscription, every step
    /// and attempt in order, and where it stands now.
    Show(ShowEvent),
}

#[derive(Args)]
pub(super) struct ShowEvent {
    #[arg(long)]
    topic_name: String,
    /// The event's `id`.
    #[arg(long)]
    event_id: String,
    /// How far back to look: a span (90m, 6h, 7d) or an RFC 3339 time.
    #[arg(long, default_value = "24h")]
    since: String,
}

#[derive(Args)]
pub(super) struct ListAttempts {
    #[arg(long)]
    topic_name: String,
    /// The event subscription's name.
    #[arg(long)]
    name: String,
    /// How far back to look: a span (90m, 6h, 7d) or an RFC 3339 time.
    #[arg(long, default_value = "1h")]
    since: String,
    /// Only attempts that did not deliver.
    #[arg(long)]
    failed: bool,
    /// At most this many, newest first.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10000))]
    top: u64,
}

/// Where the journal is: the bucket given, or the one beside a delivery queue named
/// `<prefix>-delivery` (a local installation).
pub(super) fn journal_bucket(given: Option<&str>, delivery_queue: &str) -> anyhow::Result<String> {
    crate::beside_delivery_queue(given, delivery_queue, crate::Beside::JournalBucket)
}

/// Every entry written from `since` until now.
async fn read_since(bucket: &str, since: DateTime<Utc>) -> anyhow::Result<JournalRead> {
    let sdk = load_sdk_config().await;
    let source = S3JournalSource::new(s3_client(&sdk), bucket, JOURNAL_PREFIX);
    let read = source
        .read_hours(since, Utc::now())
        .await
        .with_context(|| format!("could not read the delivery journal in bucket {bucket}"))?;
    if read.skipped > 0 {
        eprintln!(
            "note: {} journal lines of a kind this version does not know were skipped",
            read.skipped
        );
    }
    Ok(read)
}

/// `gridrelay event show`.
pub(super) async fn show_event(
    args: ShowEvent,
    bucket: &str,
    output: OutputFormat,
) -> anyhow::Result<()> {
    validate_topic_name(&args.topic_name).map_err(invalid)?;
    let since = parse_since(&args.since, Utc::now()).map_err(invalid)?;
    let read = read_since(bucket, since).await?;
    let life = EventLife::of(&args.topic_name, &args.event_id, &read.entries);
    if life.subscriptions.is_empty() {
        anyhow::bail!(
            "no journal entry of event {:?} of topic {:?} since {} (try a longer --since; \
             on AWS, entries appear once the journal's stream has written them, within its \
             buffering interval)",
            args.event_id,
            args.topic_name,
            format_time(since)
        );
    }
    print_as(output, &serde_json::to_value(&life)?, || life_table(&life))
}

/// `gridrelay event-subscription attempts`.
pub(super) async fn list_attempts(
    args: ListAttempts,
    bucket: &str,
    output: OutputFormat,
) -> anyhow::Result<()> {
    validate_topic_name(&args.topic_name).map_err(invalid)?;
    validate_subscription_name(&args.name).map_err(invalid)?;
    let since = parse_since(&args.since, Utc::now()).map_err(invalid)?;
    let read = read_since(bucket, since).await?;
    let attempts = latest_attempts(
        &read.entries,
        &args.topic_name,
        &args.name,
        args.failed,
        usize::try_from(args.top).unwrap_or(usize::MAX),
    );
    let value = serde_json::to_value(&attempts)?;
    print_as(output, &value, || {
        let mut header = STEP_COLUMNS.to_vec();
        header[2] = "Attempt";
        table(
            &header[1..],
            &attempts
                .iter()
                .map(|e| step_row(e)[1..].to_vec())
                .collect::<Vec<_>>(),
        )
    })
}

/// An event's life as a table: one row per step, then where it stands (each delivery, where
/// it was sent again: its publish's, a replay's, a redrive's; each step then says whose it is).
fn life_table(life: &EventLife) -> String {
    let rows: Vec<Vec<String>> = life
        .subscriptions
        .iter()
        .flat_map(|s| {
            let several = s.deliveries.len() > 1;
            let steps = s.steps.iter().map(|e| {
                let mut row = step_row(e);
                // A fan-out's row says whose it is already.
                if several && !matches!(e.step, Step::Fanned { .. }) {
                    row[2] = format!("{} ({})", row[2], delivery_text(e.delivery.as_deref()));
                }
                row
            });
            let now: Vec<Vec<String>> = match s.deliveries.as_slice() {
                [_, _, ..] => s
                    .deliveries
                    .iter()
                    .map(|d| {
                        standing_row(
                            &s.subscription,
                            &format!("now: {}", delivery_text(d.delivery.as_deref())),
                            &d.standing,
                        )
                    })
                    .collect(),
                _ => vec![standing_row(&s.subscription, "now", &s.standing)],
            };
            steps.chain(now).collect::<Vec<_>>()
        })
        .collect();
    table(&STEP_COLUMNS, &rows)
}

/// A delivery of an event, for people: `publish`, `replay <name>`, `redrive at <time>`.
pub(crate) fn delivery_text(delivery: Option<&str>) -> String {
    match delivery {
        None => "publish".to_string(),
        Some(name) => match name.split_once(':') {
            Some(("replay", replay)) => format!("replay {replay}"),
            Some(("redrive", at)) => format!("redrive at {at}"),
            _ => name.to_string(),
        },
    }
}

/// The columns of a step's row ([`step_row`]).
pub(crate) const STEP_COLUMNS: [&str; 9] = [
    "Subscription",
    "Time",
    "Step",
    "Events",
    "Status",
    "Outcome",
    "Ms",
    "Next",
    "Error or answer",
];

/// A step as a row: subscription, time, step (an attempt's number), events, status, outcome,
/// milliseconds, what came next, error.
pub(crate) fn step_row(e: &JournalEntry) -> Vec<String> {
    let (step, status, outcome, ms, next, error) = match &e.step {
        Step::Fanned {
            event_type,
            replay,
            redrive,
            ..
        } => (
            match (replay, redrive) {
                (Some(name), _) => format!("replayed by {name}"),
                (None, Some(from)) => format!("redriven from {from}"),
                (None, None) => "published".to_string(),
            },
            String::new(),
            event_type.clone(),
            String::new(),
            String::new(),
            String::new(),
        ),
        Step::Attempt(a) => (
            format!("attempt {}", a.attempt),
            a.status.map(|s| s.to_string()).unwrap_or_default(),
            a.outcome.as_str().to_string(),
            a.ms.to_string(),
            next_text(&a.next),
            // What went wrong, else what the endpoint said, on one line.
            a.error
                .as_deref()
                .or(a.answer.as_deref())
                .unwrap_or_default()
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect(),
        ),
        Step::GaveUp { next } => (
            "given up".to_string(),
            String::new(),
            String::new(),
            String::new(),
            next_text(next),
            String::new(),
        ),
        Step::Held { until, reason } => (
            "held".to_string(),
            String::new(),
            format!("{reason:?}"),
            String::new(),
            format!("until {}", format_time(*until)),
            String::new(),
        ),
        Step::DeadLettered { location } => (
            "dead-lettered".to_string(),
            String::new(),
            String::new(),
            String::new(),
            location.clone(),
            String::new(),
        ),
        Step::LateSuccess { attempt } => (
            format!("attempt {attempt}"),
            String::new(),
            "Succeeded".to_string(),
            String::new(),
            "delivered (answered late; retry not sent)".to_string(),
            String::new(),
        ),
        Step::Dropped { reason } => (
            "dropped".to_string(),
            String::new(),
            String::new(),
            String::new(),
            reason.clone(),
            String::new(),
        ),
    };
    vec![
        e.subscription.clone(),
        format_time(e.time),
        step,
        e.ids.len().to_string(),
        status,
        outcome,
        ms,
        next,
        error,
    ]
}

/// What came next, for people.
fn next_text(next: &Next) -> String {
    match next {
        Next::Delivered => "delivered".to_string(),
        Next::Retry { due } => format!("retry at {}", format_time(*due)),
        Next::DeadLetter { reason } => format!("dead-letter ({reason})"),
        Next::Drop { reason } => format!("drop ({reason})"),
    }
}

/// Where an event stands, for people.
pub(crate) fn standing_text(standing: &Standing) -> String {
    match standing {
        Standing::Waiting => "waiting for its first attempt".to_string(),
        Standing::Delivered { at } => format!("delivered at {}", format_time(*at)),
        Standing::RetryDue { at } => format!("retry due at {}", format_time(*at)),
        Standing::Held { until, reason } => {
            format!("held until {} ({reason:?})", format_time(*until))
        }
        Standing::DeadLettering { reason } => format!("being dead-lettered ({reason})"),
        Standing::DeadLettered { location } => format!("dead-lettered to {location}"),
        Standing::Dropped { reason } => format!("dropped ({reason})"),
    }
}

fn standing_row(subscription: &str, label: &str, standing: &Standing) -> Vec<String> {
    let now = standing_text(standing);
    vec![
        subscription.to_string(),
        String::new(),
        label.to_string(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        now,
        String::new(),
    ]
}
