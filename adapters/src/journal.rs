//! Writing the delivery journal (#35) from a function that has other work to finish: one call
//! per invocation, bounded by a budget of its own and by the invocation's deadline, and never
//! at the cost of that work.

use std::time::Duration;

use chrono::{DateTime, Utc};
use gridrelay_shared::deadline::until_stop;
use gridrelay_shared::journal::{JournalEntry, MAX_RECORD_BYTES, compress_record, pack_records};
use tracing::warn;

use gridrelay_ports::JournalSink;

/// The longest one invocation's journal write may take, beside its queue sends: a hanging
/// stream never takes the time an invocation keeps for its own work.
pub const JOURNAL_WRITE_BUDGET: Duration = Duration::from_secs(2);

/// Writes `entries` packed into as few records as fit, each compressed
/// ([`compress_record`], before the call and its budget), in one call that ends within
/// [`JOURNAL_WRITE_BUDGET`] and `reply_margin` (usually
/// [`REPLY_MARGIN`](gridrelay_shared::deadline::REPLY_MARGIN)) before `deadline`
/// (`now` is the time now). Returns how many entries the journal did not take, each cause logged; never fails.
pub async fn write_entries(
    sink: &dyn JournalSink,
    entries: &[JournalEntry],
    now: DateTime<Utc>,
    deadline: DateTime<Utc>,
    reply_margin: Duration,
) -> usize {
    if entries.is_empty() {
        return 0;
    }
    let left = until_stop(now, deadline, reply_margin).unwrap_or(JOURNAL_WRITE_BUDGET);
    let (budget, limit) = if left < JOURNAL_WRITE_BUDGET {
        (left, "the invocation's deadline")
    } else {
        (JOURNAL_WRITE_BUDGET, "their budget")
    };
    let packed = pack_records(entries, MAX_RECORD_BYTES);
    let lines: Vec<usize> = packed
        .iter()
        .map(|record| record.iter().filter(|b| **b == b'\n').count())
        .collect();
    let records: Vec<Vec<u8>> = packed.iter().map(|r| compress_record(r)).collect();
    let unwritten = match tokio::time::timeout(budget, sink.put_records(&records)).await {
        Ok(Ok(refused)) => refused.iter().map(|&i| lines[i]).sum(),
        Ok(Err(e)) => {
            warn!(error = %e, entries = entries.len(), "journal entries not written; the work goes on without them");
            entries.len()
        }
        Err(_) => {
            warn!(
                entries = entries.len(),
                budget_ms = budget.as_millis() as u64,
                "journal entries not written within {limit}; the work goes on without them"
            );
            entries.len()
        }
    };
    if unwritten > 0 && unwritten < entries.len() {
        warn!(
            unwritten,
            "some journal entries not taken; the work goes on without them"
        );
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
    use gridrelay_ports::JournalError;

    /// Keeps the records as sent.
    #[derive(Default)]
    struct Sent(Mutex<Vec<Vec<u8>>>);

    #[async_trait]
    impl JournalSink for Sent {
        async fn put_records(&self, records: &[Vec<u8>]) -> Result<Vec<usize>, JournalError> {
            self.0.lock().unwrap().extend(records.iter().cloned());
            Ok(Vec::new())
        }
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
