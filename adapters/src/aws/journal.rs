//! The delivery journal and topic archives on AWS (#35): records put to an Amazon Data
//! Firehose stream, which writes them to S3 under its hour prefix (`<prefix>YYYY/MM/DD/HH/`,
//! UTC); read back from those objects, GZIP members one after another (each record compressed
//! by its writer) or plain lines.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_firehose::primitives::Blob;
use aws_sdk_firehose::types::Record;
use chrono::{DateTime, Duration, Timelike, Utc};
use futures::StreamExt;
use gridrelay_ports::{
    ArchiveRead, ArchiveSource, ArchiveStep, Clock, JournalRead, JournalSource, ObjectStore,
    RecordStream, RecordStreamError, SystemClock,
};
use gridrelay_shared::archive::{
    ARCHIVE_CLASSES, ARCHIVE_PREFIX, TimeWindow, class_of_segment, class_prefix, classes_keeping,
    events_in_window, read_archive_lines,
};
use gridrelay_shared::journal::{hour_prefix, hours_between, read_lines, unpack_object};
use gridrelay_shared::replay::{ArchivePosition, StepBudget};

use super::{S3ObjectStore, describe_error};

/// PutRecordBatch's limits: 500 records and 4 MiB a call.
const RECORDS_PER_CALL: usize = 500;
const BYTES_PER_CALL: usize = 4 * 1024 * 1024;
/// Objects read at once.
const READS_AT_ONCE: usize = 16;
/// The most hours one read covers: the longest retention, 365 days, and an hour for the
/// slack an archive window is read with on either side.
pub const MAX_READ_HOURS: i64 = 365 * 24 + 1;

/// Journal records into a Firehose delivery stream.
#[derive(Debug, Clone)]
pub struct FirehoseStream {
    client: aws_sdk_firehose::Client,
    stream: String,
}

impl FirehoseStream {
    pub fn new(client: aws_sdk_firehose::Client, stream: &str) -> Self {
        Self {
            client,
            stream: stream.to_string(),
        }
    }

    pub fn from_sdk(sdk: &aws_config::SdkConfig, stream: &str) -> Self {
        Self::new(aws_sdk_firehose::Client::new(sdk), stream)
    }

    /// The journal a function writes: the stream named by
    /// [`JOURNAL_STREAM_ENV`](crate::config::JOURNAL_STREAM_ENV), or none where it is unset
    /// or empty (a stack deployed without one).
    pub fn from_env(sdk: &aws_config::SdkConfig) -> std::sync::Arc<dyn RecordStream> {
        Self::named_by(sdk, crate::config::JOURNAL_STREAM_ENV)
    }

    /// The stream named by the environment variable `var`, or none where it is unset or empty.
    pub fn named_by(sdk: &aws_config::SdkConfig, var: &str) -> std::sync::Arc<dyn RecordStream> {
        match std::env::var(var) {
            Ok(stream) if !stream.is_empty() => std::sync::Arc::new(Self::from_sdk(sdk, &stream)),
            _ => std::sync::Arc::new(gridrelay_ports::NoRecordStream),
        }
    }

    /// The archive's streams (#35) named by `streams` (class to stream).
    pub fn archive_streams(
        sdk: &aws_config::SdkConfig,
        streams: &std::collections::BTreeMap<u16, String>,
    ) -> gridrelay_ports::ArchiveStreams {
        gridrelay_ports::ArchiveStreams::new(
            streams
                .iter()
                .map(|(&class, stream)| {
                    let stream: std::sync::Arc<dyn RecordStream> =
                        std::sync::Arc::new(Self::from_sdk(sdk, stream));
                    (class, stream)
                })
                .collect(),
        )
    }

    /// The archive's streams named by
    /// [`ARCHIVE_STREAMS_ENV`](crate::config::ARCHIVE_STREAMS_ENV); none where it is unset or
    /// empty (a stack deployed without an archive). A value that is not a list of classes'
    /// streams is refused, naming the variable and the entry.
    pub fn archive_streams_from_env(
        sdk: &aws_config::SdkConfig,
    ) -> Result<gridrelay_ports::ArchiveStreams, gridrelay_shared::limits::LimitError> {
        let var = crate::config::ARCHIVE_STREAMS_ENV;
        let text = std::env::var(var).unwrap_or_default();
        let streams = gridrelay_shared::archive::parse_archive_streams(var, &text)?;
        Ok(Self::archive_streams(sdk, &streams))
    }

    /// One PutRecordBatch of `records` (their indices in the whole write start at `first`):
    /// the indices it did not take.
    async fn put_batch(
        &self,
        records: &[Vec<u8>],
        first: usize,
    ) -> Result<Vec<usize>, RecordStreamError> {
        let entries = records
            .iter()
            .map(|r| Record::builder().data(Blob::new(r.clone())).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RecordStreamError(e.to_string()))?;
        let out = self
            .client
            .put_record_batch()
            .delivery_stream_name(&self.stream)
            .set_records(Some(entries))
            .send()
            .await
            .map_err(|e| RecordStreamError(describe_error(&e)))?;
        Ok(out
            .request_responses()
            .iter()
            .enumerate()
            .filter(|(_, r)| r.error_code().is_some())
            .map(|(i, _)| first + i)
            .collect())
    }
}

#[async_trait]
impl RecordStream for FirehoseStream {
    async fn put_records(&self, records: &[Vec<u8>]) -> Result<Vec<usize>, RecordStreamError> {
        let mut refused = Vec::new();
        let mut start = 0;
        while start < records.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < records.len()
                && end - start < RECORDS_PER_CALL
                && (end == start || bytes + records[end].len() <= BYTES_PER_CALL)
            {
                bytes += records[end].len();
                end += 1;
            }
            match self.put_batch(&records[start..end], start).await {
                Ok(not_taken) => refused.extend(not_taken),
                Err(e) if start == 0 && end == records.len() => return Err(e),
                // One call of several: its failure loses only its own records.
                Err(e) => {
                    tracing::warn!(error = %e, records = end - start, "journal records not taken");
                    refused.extend(start..end);
                }
            }
            start = end;
        }
        Ok(refused)
    }
}

/// How long a Firehose stream gathers records before it writes them to S3 (its buffering
/// interval), as the stream describes itself; `Ok(None)` when it does not say.
pub async fn buffering_interval(
    sdk: &aws_config::SdkConfig,
    stream: &str,
) -> Result<Option<std::time::Duration>, RecordStreamError> {
    let out = aws_sdk_firehose::Client::new(sdk)
        .describe_delivery_stream()
        .delivery_stream_name(stream)
        .send()
        .await
        .map_err(|e| RecordStreamError(describe_error(&e)))?;
    Ok(out
        .delivery_stream_description()
        .and_then(|d| d.destinations().first())
        .and_then(|d| d.extended_s3_destination_description())
        .and_then(|s3| s3.buffering_hints())
        .and_then(|h| h.interval_in_seconds())
        .and_then(|s| u64::try_from(s).ok())
        .map(std::time::Duration::from_secs))
}

/// The hours a read from `from`'s to `to`'s reads (UTC, both included): at most the last
/// [`MAX_READ_HOURS`].
fn read_hours(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    hours_between(from.max(to - Duration::hours(MAX_READ_HOURS)), to)
}

/// A stream's objects in S3, as it wrote them under `<prefix>YYYY/MM/DD/HH/`: the delivery
/// journal's (`journal/`) or the topic archive's (`archive/`).
#[derive(Debug, Clone)]
pub struct HourlyObjects {
    objects: S3ObjectStore,
    bucket: String,
    /// The stream's prefix.
    prefix: String,
}

impl HourlyObjects {
    pub fn new(client: aws_sdk_s3::Client, bucket: &str, prefix: &str) -> Self {
        Self {
            objects: S3ObjectStore::new(client),
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        }
    }

    /// The keys of the objects written in the hours from `from`'s to `to`'s (UTC, both
    /// included; at most the last [`MAX_READ_HOURS`]), in the order written.
    pub async fn keys(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<String>, RecordStreamError> {
        let mut keys = Vec::new();
        for hour in read_hours(from, to) {
            keys.extend(self.hour_keys(hour).await?);
        }
        Ok(keys)
    }

    /// The keys of the objects written in `hour`, in the order written.
    pub async fn hour_keys(&self, hour: DateTime<Utc>) -> Result<Vec<String>, RecordStreamError> {
        let prefix = format!("{}{}", self.prefix, hour_prefix(hour));
        let mut keys = self
            .objects
            .list(&self.bucket, &prefix)
            .await
            .map_err(|e| RecordStreamError(e.to_string()))?;
        keys.sort_by(|a, b| by_time_written(a).cmp(&by_time_written(b)));
        Ok(keys)
    }

    /// An object's lines, and how many of its parts could not be read.
    pub async fn lines(&self, key: String) -> Result<(Vec<u8>, usize), RecordStreamError> {
        let bytes = self
            .objects
            .get_bytes(&self.bucket, &key)
            .await
            .map_err(|e| RecordStreamError(format!("reading {key}: {e}")))?;
        let (lines, damaged) = unpack_object(&bytes);
        if damaged > 0 {
            tracing::warn!(%key, damaged, "object partly unreadable; read the rest");
        }
        Ok((lines, damaged))
    }

    /// The lines of every object of the hours from `from`'s to `to`'s, object by object, read
    /// [`READS_AT_ONCE`] at a time and parsed by `parse`; returns what `parse` made and the
    /// parts that could not be read.
    async fn read<T>(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        parse: impl FnMut(&[u8]) -> (Vec<T>, usize),
    ) -> Result<(Vec<T>, usize), RecordStreamError> {
        let keys = self.keys(from, to).await?;
        self.read_keys(keys, parse).await
    }

    /// The lines of the objects `keys` of this bucket, read [`READS_AT_ONCE`] at a time and
    /// parsed by `parse`, as [`Self::read`].
    async fn read_keys<T>(
        &self,
        keys: Vec<String>,
        mut parse: impl FnMut(&[u8]) -> (Vec<T>, usize),
    ) -> Result<(Vec<T>, usize), RecordStreamError> {
        let mut objects =
            futures::stream::iter(keys.into_iter().map(|k| self.lines(k))).buffered(READS_AT_ONCE);
        let (mut items, mut skipped) = (Vec::new(), 0);
        while let Some(object) = objects.next().await {
            let (lines, damaged) = object?;
            let (read, unread) = parse(&lines);
            items.extend(read);
            skipped += unread + damaged;
        }
        Ok((items, skipped))
    }
}

/// The journal's objects in S3, as the stream wrote them.
#[derive(Debug, Clone)]
pub struct S3JournalSource(HourlyObjects);

/// One journal object and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalObject {
    pub key: String,
    /// When its name says it was written (to the second); `None` for a name without a time.
    pub written: Option<DateTime<Utc>>,
    pub entries: Vec<gridrelay_shared::journal::JournalEntry>,
    /// Parts and lines that could not be read.
    pub skipped: usize,
}

impl S3JournalSource {
    pub fn new(client: aws_sdk_s3::Client, bucket: &str, prefix: &str) -> Self {
        Self(HourlyObjects::new(client, bucket, prefix))
    }

    /// The objects whose names say they were written at `since` or later (a name without a
    /// time is read too), of the hours from `since`'s to `to`'s, in the order written: how
    /// the console's live page follows the journal. A stream names an object when it starts
    /// to gather it and writes it up to its buffering interval later, so a follower reads again
    /// from that far back and knows objects by key.
    pub async fn objects_written_since(
        &self,
        since: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<JournalObject>, RecordStreamError> {
        let since_second = since.with_nanosecond(0).unwrap_or(since);
        let keys: Vec<(String, Option<DateTime<Utc>>)> = self
            .0
            .keys(since, to)
            .await?
            .into_iter()
            .map(|key| {
                let written = written_at(&key);
                (key, written)
            })
            .filter(|(_, written)| written.is_none_or(|w| w >= since_second))
            .collect();
        let mut objects =
            futures::stream::iter(keys.into_iter().map(|(key, written)| async move {
                let (lines, damaged) = self.0.lines(key.clone()).await?;
                let (entries, unread) = read_lines(&lines);
                Ok::<_, RecordStreamError>(JournalObject {
                    key,
                    written,
                    entries,
                    skipped: unread + damaged,
                })
            }))
            .buffered(READS_AT_ONCE);
        let mut out = Vec::new();
        while let Some(object) = objects.next().await {
            out.push(object?);
        }
        Ok(out)
    }
}

#[async_trait]
impl JournalSource for S3JournalSource {
    async fn read_hours(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<JournalRead, RecordStreamError> {
        let (entries, skipped) = self.0.read(from, to, read_lines).await?;
        Ok(JournalRead { entries, skipped })
    }
}

/// Where an object written by Firehose sorts: by the time in its name
/// (`<stream>-<version>-<YYYY-MM-DD-HH-MM-SS>-<random>[.json.gz]`; a stream's version number
/// growing past 9 would put names out of order as text), then by its whole key.
fn by_time_written(key: &str) -> (&str, &str) {
    let name = key.rsplit('/').next().unwrap_or(key);
    (written_time(name).unwrap_or_default(), key)
}

/// The `YYYY-MM-DD-HH-MM-SS` in an object's name: the last run of six numbers (4, 2, 2, 2, 2,
/// 2 digits) between dashes.
fn written_time(name: &str) -> Option<&str> {
    const SHAPE: &[u8] = b"-dddd-dd-dd-dd-dd-dd-";
    let bytes = name.as_bytes();
    (0..bytes.len().checked_sub(SHAPE.len())? + 1)
        .rev()
        .find(|&at| {
            SHAPE
                .iter()
                .zip(&bytes[at..])
                .all(|(want, got)| match want {
                    b'd' => got.is_ascii_digit(),
                    other => other == got,
                })
        })
        .and_then(|at| name.get(at + 1..at + SHAPE.len() - 1))
}

/// When an object's name says it was written (UTC, to the second).
fn written_at(key: &str) -> Option<DateTime<Utc>> {
    let name = key.rsplit('/').next().unwrap_or(key);
    chrono::NaiveDateTime::parse_from_str(written_time(name)?, "%Y-%m-%d-%H-%M-%S")
        .ok()
        .map(|t| t.and_utc())
}

/// Topic archives' objects in S3, as the archive's streams wrote them: each retention class's
/// under its prefix (`archive/7d/`), and those written before classes under `archive/`.
#[derive(Clone)]
pub struct S3ArchiveSource {
    unclassed: HourlyObjects,
    classes: Vec<(u16, HourlyObjects)>,
    /// What "now" is when deciding which classes still keep an hour.
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for S3ArchiveSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3ArchiveSource")
            .field("unclassed", &self.unclassed)
            .field("classes", &self.classes)
            .finish_non_exhaustive()
    }
}

impl S3ArchiveSource {
    pub fn new(client: aws_sdk_s3::Client, bucket: &str) -> Self {
        Self {
            clock: Arc::new(SystemClock),
            unclassed: HourlyObjects::new(client.clone(), bucket, ARCHIVE_PREFIX),
            classes: ARCHIVE_CLASSES
                .into_iter()
                .map(|class| {
                    let prefix = class_prefix(class);
                    (class, HourlyObjects::new(client.clone(), bucket, &prefix))
                })
                .collect(),
        }
    }

    /// The same source, deciding which classes still keep an hour by `clock`.
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Self { clock, ..self }
    }

    /// The keys of `hour`'s objects, in the order written: those written before classes, and
    /// those of each class that still keeps the hour ([`classes_keeping`]: an older hour's
    /// objects of a class are expired), listed at once.
    async fn hour_keys(&self, hour: DateTime<Utc>) -> Result<Vec<String>, RecordStreamError> {
        let kept = classes_keeping(hour, self.clock.now());
        let listings = std::iter::once(&self.unclassed)
            .chain(
                self.classes
                    .iter()
                    .filter(|(class, _)| kept.contains(class))
                    .map(|(_, objects)| objects),
            )
            .map(|objects| objects.hour_keys(hour));
        let mut keys: Vec<String> = futures::future::try_join_all(listings)
            .await?
            .into_iter()
            .flatten()
            .collect();
        keys.sort_by(|a, b| by_time_written(a).cmp(&by_time_written(b)));
        Ok(keys)
    }
}

#[async_trait]
impl ArchiveSource for S3ArchiveSource {
    async fn read_window(
        &self,
        topic: &str,
        window: &TimeWindow,
    ) -> Result<ArchiveRead, RecordStreamError> {
        let (from, to) = window.hours();
        let mut keys = Vec::new();
        for hour in read_hours(from, to) {
            keys.extend(self.hour_keys(hour).await?);
        }
        let (events, skipped) = self.unclassed.read_keys(keys, read_archive_lines).await?;
        Ok(ArchiveRead {
            events: events_in_window(events, topic, window),
            skipped,
        })
    }

    /// Lists the window's hours one at a time from the cursor's on, and reads their objects
    /// one at a time from the cursor until the step has what its budget allows: an hour not
    /// listed, or an object not read, for want of budget is where the next step starts.
    async fn read_step(
        &self,
        topic: &str,
        window: &TimeWindow,
        from: Option<&ArchivePosition>,
        budget: StepBudget,
    ) -> Result<ArchiveStep, RecordStreamError> {
        let (first_hour, last_hour) = window.hours();
        let first_hour = from
            .and_then(|p| hour_of(&p.key))
            .map_or(first_hour, |h| h.max(first_hour));
        let mut step = ArchiveStep::default();
        let mut objects = 0;
        for (listed, hour) in hours_between(first_hour, last_hour).into_iter().enumerate() {
            if listed == budget.hours {
                step.next = Some(ArchivePosition {
                    key: format!("{ARCHIVE_PREFIX}{}", hour_prefix(hour)),
                    line: 0,
                });
                return Ok(step);
            }
            for key in self.hour_keys(hour).await? {
                if from
                    .is_some_and(|p| archive_order(&key) < archive_order(&p.key) || p.is_past(&key))
                {
                    continue;
                }
                if objects == budget.objects {
                    step.next = Some(ArchivePosition::resume(from, &key));
                    return Ok(step);
                }
                objects += 1;
                let (lines, damaged) = self.unclassed.lines(key.clone()).await?;
                step.skipped += damaged;
                if step.take_from(&key, &lines, from, (topic, window), budget) {
                    return Ok(step);
                }
            }
        }
        step.next = None;
        Ok(step)
    }
}

/// Where an archive object comes in a replay's reading: by its hour, then as
/// [`by_time_written`], whatever its class.
fn archive_order(key: &str) -> (Option<DateTime<Utc>>, (&str, &str)) {
    (hour_of(key), by_time_written(key))
}

/// The hour of an archive object's prefix (`archive/YYYY/MM/DD/HH/…`, or after a class's
/// `archive/7d/`).
fn hour_of(key: &str) -> Option<DateTime<Utc>> {
    let rest = key.strip_prefix(ARCHIVE_PREFIX)?;
    let rest = match rest.split_once('/') {
        Some((class, after)) if class_of_segment(class).is_some() => after,
        _ => rest,
    };
    let hour = rest.get(..13)?;
    chrono::NaiveDateTime::parse_from_str(&format!("{hour}/00"), "%Y/%m/%d/%H/%M")
        .ok()
        .map(|t| t.and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replay's cursor names an object: its hour is where the next step's listing starts,
    /// and objects sort by hour, then by the time they were written.
    #[test]
    fn a_cursors_object_gives_its_hour_and_place() {
        let key = "archive/2026/11/27/13/s-archive-1-2026-11-27-13-59-00-0b0e.json.gz";
        assert_eq!(
            hour_of(key),
            Some(
                DateTime::parse_from_rfc3339("2026-11-27T13:00:00Z")
                    .unwrap()
                    .to_utc()
            )
        );
        assert_eq!(hour_of("journal/2026/11/27/13/x"), None);
        let next_hour = "archive/2026/11/27/14/s-archive-1-2026-11-27-13-59-30-0b0e.json.gz";
        let later_same_hour = "archive/2026/11/27/13/s-archive-1-2026-11-27-14-00-00-0a.json.gz";
        assert!(archive_order(key) < archive_order(later_same_hour));
        assert!(archive_order(later_same_hour) < archive_order(next_hour));
        // A class's object: its hour after the class, and in order with unclassed ones.
        let classed = "archive/30d/2026/11/27/13/s-archive-30d-1-2026-11-27-13-59-10-0c.json.gz";
        assert_eq!(hour_of(classed), hour_of(key));
        assert!(archive_order(key) < archive_order(classed));
        assert!(archive_order(classed) < archive_order(next_hour));
        // Where a step that listed no hour leaves the next: before every object of the hour.
        assert!(archive_order("archive/2026/11/27/13/") < archive_order(key));
        assert!(archive_order("archive/2026/11/27/13/") < archive_order(classed));
    }

    /// Objects are read in the order Firehose wrote them, whatever the stream's version.
    #[test]
    fn objects_sort_by_the_time_in_their_names() {
        let key = |version: u32, time: &str| {
            format!(
                "archive/2026/11/27/12/s-archive-{version}-{time}-0b0e7c8e-1f2a-4b3c-9d4e-5f6a7b8c9d0e.json.gz"
            )
        };
        let mut keys = vec![
            key(10, "2026-11-27-12-05-00"),
            key(9, "2026-11-27-12-01-00"),
            key(10, "2026-11-27-12-03-00"),
        ];
        keys.sort_by(|a, b| by_time_written(a).cmp(&by_time_written(b)));
        assert_eq!(
            keys,
            [
                key(9, "2026-11-27-12-01-00"),
                key(10, "2026-11-27-12-03-00"),
                key(10, "2026-11-27-12-05-00")
            ]
        );
        assert_eq!(
            written_time("s-1-2026-11-27-12-05-59-0b0e7c8e-1f2a-4b3c-9d4e-5f6a7b8c9d0e"),
            Some("2026-11-27-12-05-59")
        );
        assert_eq!(written_time("not-a-firehose-name"), None);
        assert_eq!(
            written_at("journal/2026/11/27/12/s-1-2026-11-27-12-05-59-0b0e7c8e.json.gz"),
            Some(
                DateTime::parse_from_rfc3339("2026-11-27T12:05:59Z")
                    .unwrap()
                    .to_utc()
            )
        );
        assert_eq!(written_at("journal/2026/11/27/12/plain"), None);
    }
}
