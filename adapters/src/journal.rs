//! Writing to a record stream (the delivery journal's, #35, or a topic archive's) from a
//! function that has other work to finish: one call per invocation, bounded by a budget of its
//! own and by the invocation's deadline, and never at the cost of that work.

use std::time::Duration;

use chrono::{DateTime, Utc};
use gridrelay_shared::deadline::until_stop;
use gridrelay_shared::journal::{
    JournalEntry, MAX_RECORD_BYTES, compress_record, pack_lines, pack_records,
};
use tracing::warn;

use gridrelay_ports::RecordStream;

/// Which stream a write goes to: it names the lines in log lines and the metric's dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The delivery journal (`deliver`, `dead-letter`).
    Journal,
    /// A topic archive (`ingest`).
    Archive,
}

impl Stream {
    /// The `Stream` dimension of [`UNWRITTEN_METRIC`].
    pub fn name(self) -> &'static str {
        match self {
            Self::Journal => "journal",
            Self::Archive => "archive",
        }
    }

    fn lines(self) -> &'static str {
        match self {
            Self::Journal => "journal entries",
            Self::Archive => "archived events",
        }
    }
}

/// Lines a stream did not take (down, throttling, too slow for the write's budget), with the
/// dimension `Stream` ([`Stream::name`]): the journal's or an archive's gap, counted.
pub const UNWRITTEN_METRIC: &str = "StreamLinesUnwritten";

/// Says [`UNWRITTEN_METRIC`]'s unit and meaning to the recorder; once, after it is installed.
pub fn describe_unwritten() {
    metrics::describe_counter!(
        UNWRITTEN_METRIC,
        metrics::Unit::Count,
        "lines the journal's or an archive's stream did not take"
    );
}

/// The longest one invocation's journal write may take, beside its queue sends: a hanging
/// stream never takes the time an invocation keeps for its own work.
pub const JOURNAL_WRITE_BUDGET: Duration = Duration::from_secs(2);

/// Writes `entries` packed into as few records as fit, each compressed
/// ([`compress_record`], before the call and its budget), in one call that ends within
/// [`JOURNAL_WRITE_BUDGET`] and `reply_margin` (usually
/// [`REPLY_MARGIN`](gridrelay_shared::deadline::REPLY_MARGIN)) before `deadline`
/// (`now` is the time now). Returns how many entries the journal did not take, each cause logged; never fails.
pub async fn write_entries(
    sink: &dyn RecordStream,
    entries: &[JournalEntry],
    now: DateTime<Utc>,
    deadline: DateTime<Utc>,
    reply_margin: Duration,
) -> usize {
    if entries.is_empty() {
        return 0;
    }
    let left = until_stop(now, deadline, reply_margin).unwrap_or(JOURNAL_WRITE_BUDGET);
    let budget = if left < JOURNAL_WRITE_BUDGET {
        Budget::deadline(left)
    } else {
        Budget::own(JOURNAL_WRITE_BUDGET)
    };
    let records = pack_records(entries, MAX_RECORD_BYTES);
    let unwritten = write_records(sink, records, budget, Stream::Journal).await;
    // An entry split by its ids (a batch too large for one record) counts once.
    unwritten.min(entries.len())
}

/// How long a write may take, and what set that.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub time: Duration,
    /// For the log: `their budget` or `the invocation's deadline`.
    pub limit: &'static str,
}

impl Budget {
    /// The write's own budget.
    pub fn own(time: Duration) -> Self {
        Self {
            time,
            limit: "their budget",
        }
    }

    /// What is left before the invocation's deadline.
    pub fn deadline(time: Duration) -> Self {
        Self {
            time,
            limit: "the invocation's deadline",
        }
    }
}

/// Writes `lines` (each ending with a newline) packed into as few records as fit, each
/// compressed, in one call that ends within `budget`. Returns how many lines the stream did
/// not take, each cause logged and counted ([`UNWRITTEN_METRIC`]); never fails.
pub async fn write_lines(
    sink: &dyn RecordStream,
    lines: Vec<Vec<u8>>,
    budget: Budget,
    stream: Stream,
) -> usize {
    if lines.is_empty() {
        return 0;
    }
    write_records(sink, pack_lines(lines, MAX_RECORD_BYTES), budget, stream).await
}

/// Compresses and writes packed `records`; returns how many of their lines were not taken.
async fn write_records(
    sink: &dyn RecordStream,
    packed: Vec<Vec<u8>>,
    budget: Budget,
    stream: Stream,
) -> usize {
    let what = stream.lines();
    let lines: Vec<usize> = packed
        .iter()
        .map(|record| record.iter().filter(|b| **b == b'\n').count())
        .collect();
    let total: usize = lines.iter().sum();
    let records: Vec<Vec<u8>> = packed.iter().map(|r| compress_record(r)).collect();
    let unwritten = match tokio::time::timeout(budget.time, sink.put_records(&records)).await {
        Ok(Ok(refused)) => refused.iter().map(|&i| lines[i]).sum(),
        Ok(Err(e)) => {
            warn!(error = %e, lines = total, "{what} not written; the work goes on without them");
            total
        }
        Err(_) => {
            warn!(
                lines = total,
                budget_ms = budget.time.as_millis() as u64,
                "{what} not written within {}; the work goes on without them",
                budget.limit
            );
            total
        }
    };
    if unwritten > 0 && unwritten < total {
        warn!(
            unwritten,
            "some {what} not taken; the work goes on without them"
        );
    }
    if unwritten > 0 {
        metrics::counter!(UNWRITTEN_METRIC, "Stream" => stream.name()).increment(unwritten as u64);
    }
    unwritten
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use chrono::TimeZone;
    use gridrelay_shared::journal::{Step, read_lines, unpack_object};

    use super::*;
    use gridrelay_ports::RecordStreamError;

    /// Keeps the records as sent.
    #[derive(Default)]
    struct Sent(Mutex<Vec<Vec<u8>>>);

    #[async_trait]
    impl RecordStream for Sent {
        async fn put_records(&self, records: &[Vec<u8>]) -> Result<Vec<usize>, RecordStreamError> {
            self.0.lock().unwrap().extend(records.iter().cloned());
            Ok(Vec::new())
        }
    }

    /// Refuses every write.
    struct Down;

    #[async_trait]
    impl RecordStream for Down {
        async fn put_records(&self, _: &[Vec<u8>]) -> Result<Vec<usize>, RecordStreamError> {
            Err(RecordStreamError("down".into()))
        }
    }

    /// #35: lines a stream does not take are counted in a metric named for the stream, so an
    /// operator sees the journal's or an archive's gap; a write that succeeds counts nothing.
    #[tokio::test]
    async fn lines_not_written_are_counted_by_stream() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _recording = metrics::set_default_local_recorder(&recorder);
        let lines = || vec![b"{}\n".to_vec(); 3];
        let budget = Budget::own(Duration::from_secs(1));
        assert_eq!(
            write_lines(&Down, lines(), budget, Stream::Archive).await,
            3
        );
        assert_eq!(
            write_lines(&Sent::default(), lines(), budget, Stream::Journal).await,
            0
        );
        let counted: Vec<(String, Vec<String>, String)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let labels = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (key.key().name().to_string(), labels, format!("{value:?}"))
            })
            .collect();
        assert_eq!(
            counted,
            [(
                UNWRITTEN_METRIC.to_string(),
                vec!["Stream=archive".to_string()],
                "Counter(3)".to_string()
            )]
        );
    }

    /// #35: what is sent is compressed (Firehose bills its bytes) and reads back as the
    /// entries written.
    #[tokio::test]
    async fn records_are_sent_compressed_and_read_back_as_written() {
        let at = Utc.with_ymd_and_hms(2026, 11, 27, 12, 0, 0).unwrap();
        let entries: Vec<JournalEntry> = (0..100)
            .map(|i| JournalEntry {
                topic: "orders".into(),
                subscription: "billing".into(),
                ids: vec![format!("event-{i}")],
                time: at,
                delivery: None,
                step: Step::Dropped {
                    reason: "SubscriptionDeleted".into(),
                },
            })
            .collect();
        let sent = Sent::default();
        let unwritten = write_entries(
            &sent,
            &entries,
            at,
            DateTime::<Utc>::MAX_UTC,
            Duration::ZERO,
        )
        .await;
        assert_eq!(unwritten, 0);
        let records = sent.0.into_inner().unwrap();
        let bytes: usize = records.iter().map(Vec::len).sum();
        assert!(records.iter().all(|r| r.starts_with(&[0x1f, 0x8b])), "GZIP");
        let (lines, damaged) = unpack_object(&records.concat());
        assert_eq!(damaged, 0);
        assert!(
            bytes * 5 < lines.len(),
            "{bytes} bytes for {} of lines",
            lines.len()
        );
        assert_eq!(read_lines(&lines).0, entries);
    }
}
