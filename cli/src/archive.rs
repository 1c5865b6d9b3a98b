//! `gridrelay archive list`: what a topic's archive (#35) holds for a window of publish times,
//! read from the objects its stream wrote to S3: the events a replay of that window sends.

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use gridrelay_adapters::aws::{S3ArchiveSource, S3ObjectStore, load_sdk_config, s3_client};
use gridrelay_adapters::config::TableNames;
use gridrelay_ports::ArchiveSource;
use gridrelay_shared::archive::{ArchivedEvent, TimeWindow, archive_window, class_prefix};
use gridrelay_shared::journal::{format_time, parse_past_time};
use gridrelay_shared::limits::validate_topic_name;
use gridrelay_shared::subscription::Topic;
use serde_json::{Value, json};

use crate::topic::{existing_topic, open_store};
use crate::view::table;
use crate::{OutputFormat, invalid, print_as};

#[derive(Subcommand)]
pub(super) enum ArchiveCommand {
    /// A topic's archived events published in a window, oldest first: what a replay of the
    /// window sends. The topic keeps them for its `--retention-days`.
    List(ListArchived),
}

#[derive(Args)]
pub(super) struct ListArchived {
    #[arg(long)]
    topic_name: String,
    /// The window's start (included): a span back from now (90m, 6h, 7d) or an RFC 3339 time.
    #[arg(long)]
    start_time: String,
    /// The window's end (not included), as --start-time. Default: now.
    #[arg(long)]
    end_time: Option<String>,
    /// Print at most this many events, oldest first (`count` counts them all).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    top: u64,
}

/// How many days the installation keeps the archive class `class`: the days of its journal's
/// `bucket`'s lifecycle rule for the class's prefix (`archive/7d/`). `Ok(None)` where the bucket
/// has no such rule (a stack from before classes); `Err` (said on stderr) where the bucket is
/// unknown or its rules cannot be read.
pub(super) async fn class_expiry(
    sdk: &aws_config::SdkConfig,
    bucket: Option<&str>,
    class: u16,
) -> Result<Option<u16>, ()> {
    let not_checked = "warning: not checked against the archive's lifecycle rules";
    let Some(bucket) = bucket else {
        eprintln!(
            "{not_checked}: set --journal-bucket or GRIDRELAY_JOURNAL_BUCKET to the stack's \
             JournalBucketName output"
        );
        return Err(());
    };
    S3ObjectStore::new(s3_client(sdk))
        .expiration_days(bucket, &class_prefix(class))
        .await
        .map_err(|e| {
            eprintln!(
                "{not_checked}: the lifecycle rules of bucket {bucket} could not be read: {e}"
            );
        })
}

/// The window of `topic`'s archive asked for (`start` to `end`), checked against its retention
/// and its creation.
pub(super) fn topic_window(
    topic: &Topic,
    (start, end): (DateTime<Utc>, DateTime<Utc>),
    now: DateTime<Utc>,
) -> anyhow::Result<TimeWindow> {
    archive_window(start, end, now, topic.retention_days, topic.created_at).map_err(invalid)
}

/// `gridrelay archive list`.
pub(super) async fn list_archived(
    args: ListArchived,
    tables: TableNames,
    bucket: &str,
    output: OutputFormat,
) -> anyhow::Result<()> {
    validate_topic_name(&args.topic_name).map_err(invalid)?;
    let now = Utc::now();
    let start = parse_past_time("startTime", &args.start_time, now).map_err(invalid)?;
    let end = match &args.end_time {
        Some(text) => parse_past_time("endTime", text, now).map_err(invalid)?,
        None => now,
    };
    let store = open_store(tables).await;
    let topic = existing_topic(store.as_ref(), &args.topic_name).await?;
    let sdk = load_sdk_config().await;
    let window = topic_window(&topic, (start, end), now)?;
    let read = S3ArchiveSource::new(s3_client(&sdk), bucket)
        .read_window(&topic.name, &window)
        .await
        .with_context(|| format!("could not read the archive in bucket {bucket}"))?;
    if read.skipped > 0 {
        eprintln!(
            "note: {} archive lines that are not events of this version were skipped",
            read.skipped
        );
    }
    let shown = &read.events[..read
        .events
        .len()
        .min(usize::try_from(args.top).unwrap_or(usize::MAX))];
    let value = json!({
        "topic": topic.name,
        "retentionDays": topic.retention_days,
        "startTime": format_time(window.start),
        "endTime": format_time(window.end),
        "count": read.events.len(),
        "events": shown.iter().map(event_view).collect::<Vec<_>>(),
    });
    print_as(output, &value, || {
        let rows: Vec<Vec<String>> = shown.iter().map(event_row).collect();
        let count = read.events.len();
        format!(
            "{}\n\n{count} event{} published from {} up to {}",
            table(&["Published", "Id", "Type", "Subject", "Bytes"], &rows),
            if count == 1 { "" } else { "s" },
            format_time(window.start),
            format_time(window.end)
        )
    })
}

/// An archived event as printed: its publish time and the event.
fn event_view(archived: &ArchivedEvent) -> Value {
    let event: Value = serde_json::from_str(archived.event.get()).unwrap_or(Value::Null);
    json!({"publishTime": format_time(archived.time), "event": event})
}

/// Published, id, type, subject and size, whichever schema the event is in.
fn event_row(archived: &ArchivedEvent) -> Vec<String> {
    let event: Value = serde_json::from_str(archived.event.get()).unwrap_or(Value::Null);
    let field = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| event.get(*n).and_then(Value::as_str))
            .unwrap_or_default()
            .to_string()
    };
    vec![
        format_time(archived.time),
        field(&["id"]),
        field(&["eventType", "type"]),
        field(&["subject"]),
        archived.event.get().len().to_string(),
    ]
}
