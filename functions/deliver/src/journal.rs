//! What `deliver` writes to the delivery journal (#35): each invocation's steps, in one call
//! beside its queue sends, and never at the cost of a delivery.
//!
//! An event's first attempt also records that it was published and fanned out to the
//! subscription (what `ingest` knew, read from the message), so the journal costs `ingest`
//! nothing. A journal that is down, slow or refusing loses only its own entries: its write has
//! [`JOURNAL_WRITE_BUDGET`] of its own, so a hanging stream never takes the time the
//! invocation keeps for its queue sends, failed records' short waits and late answers (R4);
//! what it did not take is counted in the invocation's report (`journal_unwritten`) and log
//! line.

use std::time::Duration;

use chrono::{DateTime, Utc};
use gridrelay_shared::journal::{
    JournalEntry, MAX_RECORD_BYTES, event_fields, fanned_entry, pack_records,
};
use tracing::warn;

use crate::{Deliver, Group, Pending, Plan};

/// The longest one invocation's journal write may take, beside its queue sends.
pub const JOURNAL_WRITE_BUDGET: Duration = Duration::from_secs(2);

impl Deliver {
    /// The journal's ids of `events`, an attempt's (in order); an event's first attempt also
    /// records its publish and fan-out.
    pub(crate) fn journal_events(
        &self,
        group: &Group,
        events: &[Pending],
        plan: &mut Plan,
    ) -> Vec<String> {
        let schema = group.history.schema;
        let first = group.history.attempts == 0;
        events
            .iter()
            .map(|p| {
                let fields = event_fields(&p.event, schema);
                let id = fields.id.clone();
                if first {
                    plan.journal
                        .push(fanned_entry(&group.subscription, &p.event, fields));
                }
                id
            })
            .collect()
    }

    /// Writes `entries` in one call, before the invocation's stop; returns how many the
    /// journal did not take.
    pub(crate) async fn write_journal(
        &self,
        entries: Vec<JournalEntry>,
        deadline: DateTime<Utc>,
    ) -> usize {
        if entries.is_empty() {
            return 0;
        }
        let records = pack_records(&entries, MAX_RECORD_BYTES);
        let lines_in = |record: &Vec<u8>| record.iter().filter(|b| **b == b'\n').count();
        let put = tokio::time::timeout(
            JOURNAL_WRITE_BUDGET,
            self.ports.journal.put_records(&records),
        );
        let unwritten = match self.before_stop(deadline, put).await {
            Some(Ok(Ok(refused))) => refused.iter().map(|&i| lines_in(&records[i])).sum(),
            Some(Ok(Err(e))) => {
                warn!(error = %e, entries = entries.len(), "journal entries not written; delivery goes on without them");
                entries.len()
            }
            Some(Err(_)) => {
                warn!(
                    entries = entries.len(),
                    budget_ms = JOURNAL_WRITE_BUDGET.as_millis() as u64,
                    "journal entries not written within their budget; delivery goes on without them"
                );
                entries.len()
            }
            None => {
                warn!(
                    entries = entries.len(),
                    "journal entries not written before the invocation's deadline"
                );
                entries.len()
            }
        };
        if unwritten > 0 && unwritten < entries.len() {
            warn!(
                unwritten,
                "some journal entries not taken; delivery goes on without them"
            );
        }
        unwritten
    }
}
