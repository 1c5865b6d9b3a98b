//! What `deliver` writes to the delivery journal (#35): each invocation's steps, in one call
//! beside its queue sends, and never at the cost of a delivery.
//!
//! An event's first attempt also records that it was published and fanned out to the
//! subscription (what `ingest` knew, read from the message), so the journal costs `ingest`
//! nothing. A journal that is down, slow or refusing loses only its own entries: its write has
//! [`JOURNAL_WRITE_BUDGET`](gridrelay_adapters::journal::JOURNAL_WRITE_BUDGET) of its own, so a hanging stream never takes the time the
//! invocation keeps for its queue sends, failed records' short waits and late answers (R4);
//! what it did not take is counted in the invocation's report (`journal_unwritten`) and log
//! line.

use chrono::{DateTime, Utc};
use gridrelay_adapters::journal::write_entries;
use gridrelay_shared::deadline::reply_margin;
use gridrelay_shared::journal::{JournalEntry, SentBy, event_fields, fanned_entry};

use crate::{Deliver, Group, Pending, Plan};

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
        let delivery = group.history.delivery_name();
        let sent_by = SentBy {
            replay: group.history.replay.as_ref().map(|r| r.name.as_str()),
            redrive: group.history.redriven_from.as_deref(),
            delivery: delivery.as_deref(),
        };
        events
            .iter()
            .map(|p| {
                let fields = event_fields(&p.event, schema);
                let id = fields.id.clone();
                if first {
                    plan.journal
                        .push(fanned_entry(&group.subscription, &p.event, fields, sent_by));
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
        write_entries(
            self.ports.journal.as_ref(),
            &entries,
            self.ports.clock.now(),
            deadline,
            reply_margin(self.settings.deadline_margin),
        )
        .await
    }
}
