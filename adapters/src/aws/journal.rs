//! The delivery journal on AWS (#35): records put to an Amazon Data Firehose stream, which
//! writes them to S3 under its hour prefix (`<prefix>YYYY/MM/DD/HH/`, UTC); read back from
//! those objects, GZIP members one after another (each record compressed by its writer) or
//! plain lines.

use async_trait::async_trait;
use aws_sdk_firehose::primitives::Blob;
use aws_sdk_firehose::types::Record;
use chrono::{DateTime, Duration, Utc};
use futures::StreamExt;
use gridrelay_ports::{JournalError, JournalRead, JournalSink, JournalSource, ObjectStore};
use gridrelay_shared::journal::{hour_prefix, hours_between, read_lines, unpack_object};

use super::{S3ObjectStore, describe_error};

/// PutRecordBatch's limits: 500 records and 4 MiB a call.
const RECORDS_PER_CALL: usize = 500;
const BYTES_PER_CALL: usize = 4 * 1024 * 1024;
/// Objects read at once.
const READS_AT_ONCE: usize = 16;
/// The most hours one read covers (the longest retention, 365 days).
pub const MAX_READ_HOURS: i64 = 365 * 24;

/// Journal records into a Firehose delivery stream.
#[derive(Debug, Clone)]
pub struct FirehoseJournal {
    client: aws_sdk_firehose::Client,
    stream: String,
}

impl FirehoseJournal {
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
    pub fn from_env(sdk: &aws_config::SdkConfig) -> std::sync::Arc<dyn JournalSink> {
        match std::env::var(crate::config::JOURNAL_STREAM_ENV) {
            Ok(stream) if !stream.is_empty() => std::sync::Arc::new(Self::from_sdk(sdk, &stream)),
            _ => std::sync::Arc::new(gridrelay_ports::NoJournal),
        }
    }

    /// One PutRecordBatch of `records` (their indices in the whole write start at `first`):
    /// the indices it did not take.
    async fn put_batch(
        &self,
        records: &[Vec<u8>],
        first: usize,
    ) -> Result<Vec<usize>, JournalError> {
        let entries = records
            .iter()
            .map(|r| Record::builder().data(Blob::new(r.clone())).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| JournalError(e.to_string()))?;
        let out = self
            .client
            .put_record_batch()
            .delivery_stream_name(&self.stream)
            .set_records(Some(entries))
            .send()
            .await
            .map_err(|e| JournalError(describe_error(&e)))?;
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
impl JournalSink for FirehoseJournal {
    async fn put_records(&self, records: &[Vec<u8>]) -> Result<Vec<usize>, JournalError> {
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

/// The journal's objects in S3, as the stream wrote them.
#[derive(Debug, Clone)]
pub struct S3JournalSource {
    objects: S3ObjectStore,
    bucket: String,
    /// The stream's prefix (`journal/`).
    prefix: String,
}

impl S3JournalSource {
    pub fn new(client: aws_sdk_s3::Client, bucket: &str, prefix: &str) -> Self {
        Self {
            objects: S3ObjectStore::new(client),
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        }
    }

    async fn keys_of_hour(&self, hour: DateTime<Utc>) -> Result<Vec<String>, JournalError> {
        let prefix = format!("{}{}", self.prefix, hour_prefix(hour));
        self.objects
            .list(&self.bucket, &prefix)
            .await
            .map_err(|e| JournalError(e.to_string()))
    }

    /// An object's lines, and how many of its parts could not be read.
    async fn object(&self, key: String) -> Result<(Vec<u8>, usize), JournalError> {
        let bytes = self
            .objects
            .get_bytes(&self.bucket, &key)
            .await
            .map_err(|e| JournalError(format!("reading {key}: {e}")))?;
        let (lines, damaged) = unpack_object(&bytes);
        if damaged > 0 {
            tracing::warn!(%key, damaged, "journal object partly unreadable; read the rest");
        }
        Ok((lines, damaged))
    }
}

#[async_trait]
impl JournalSource for S3JournalSource {
    async fn read_hours(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<JournalRead, JournalError> {
        let mut keys = Vec::new();
        let hours = hours_between(from.max(to - Duration::hours(MAX_READ_HOURS)), to);
        for hour in hours {
            keys.extend(self.keys_of_hour(hour).await?);
        }
        let mut objects =
            futures::stream::iter(keys.into_iter().map(|k| self.object(k))).buffered(READS_AT_ONCE);
        let mut read = JournalRead::default();
        while let Some(object) = objects.next().await {
            let (lines, damaged) = object?;
            let (entries, skipped) = read_lines(&lines);
            read.entries.extend(entries);
            read.skipped += skipped + damaged;
        }
        Ok(read)
    }
}
