//! O1: ordered records, from the ordered (FIFO) queue. Each record holds one event of one key,
//! and SQS hands a key's records over in order, never while one of them is in flight. An
//! invocation takes each key's records in turn: the first of every key goes in one round
//! (through the same steps as any record, [`Deliver::process`]); a key whose record was
//! delivered, dead-lettered or dropped goes on with its next in the next round; a key whose
//! record must wait (a retry, a delayed endpoint, a cap, the deadline) stops there.
//!
//! A record that waits is never enqueued again (it would join the back of its key): what it
//! would have been enqueued as is kept beside it in the delivery state table
//! ([`progress_text`]), and the record itself is held in flight until it is due
//! ([`hold_for`]), which blocks its key in SQS. The records behind it in the invocation are
//! held just as long (not made visible at once: LocalStack's SQS then hands out a group's
//! later messages while its first is still in flight), so the key comes back whole, in order.
//! When a record comes back (received more than once), its kept progress takes the place of
//! its body ([`resume`]). Records not reached before the deadline go back at once.
//!
//! A record that cannot be read fails, and comes back after the failed records' short waits,
//! holding its key; at its [`UNREADABLE_RECEIVES`](gridrelay_shared::ordering::UNREADABLE_RECEIVES)th
//! receive it is parked in the ordered
//! redrive queue (`Deliver::park`) and its key goes on without it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use chrono::{DateTime, Utc};
use gridrelay_adapters::aws::{failed_receipts, receive_count};
use gridrelay_ports::OutgoingMessage;
use gridrelay_ports::back_off;
use gridrelay_shared::delivery::redelivery_delay;
use gridrelay_shared::message::{DeliveryMessage, DeliveryQueueMessage, QueuedEvent};
use gridrelay_shared::ordering::{hold_floor, hold_for, parks_unreadable, progress_text, resume};
use tracing::{error, warn};

use crate::{Deliver, DeliverOutcome, Mode, Plan, Timings, message_ids};

/// The record attribute that names an ordered record's message group.
const MESSAGE_GROUP: &str = "MessageGroupId";

/// Whether a record came from the ordered (FIFO) queue.
pub(crate) fn is_ordered(record: &SqsMessage) -> bool {
    record.attributes.contains_key(MESSAGE_GROUP)
}

/// Ordered messages that could not be read, parked in the ordered redrive queue (a metric of
/// the whole stack; the queue's depth alarm watches what they leave there).
pub const PARKED_METRIC: &str = "OrderedMessagesParked";

/// Whether `body` is not a message `deliver` reads (none, or not a queue message of this
/// version's).
fn unreadable(body: Option<&str>) -> bool {
    !matches!(body.map(DeliveryQueueMessage::from_body), Some(Ok(_)))
}

/// Adds `event` to what `record`'s events would be enqueued as next: `message`'s history.
pub(crate) fn keep_successor(
    successors: &mut BTreeMap<usize, DeliveryMessage>,
    record: usize,
    message: &DeliveryMessage,
    event: QueuedEvent,
) {
    successors
        .entry(record)
        .or_insert_with(|| message.clone_without_events())
        .events
        .push(event);
}

impl Deliver {
    /// Handles a batch of ordered records (see the module's docs), before `deadline`.
    pub(crate) async fn handle_ordered(
        &self,
        event: SqsEvent,
        deadline: DateTime<Utc>,
        started: std::time::Instant,
    ) -> DeliverOutcome {
        let invoked_at = self.ports.clock.now();
        let ids = message_ids(&event);
        let mut plan = Plan::default();
        let mut timings = Timings::default();
        // Each key's records, in the order SQS handed them over.
        let mut keys: Vec<VecDeque<usize>> = Vec::new();
        let mut key_of: HashMap<&str, usize> = HashMap::new();
        for (i, record) in event.records.iter().enumerate() {
            let group = record
                .attributes
                .get(MESSAGE_GROUP)
                .map_or(ids[i].as_str(), String::as_str);
            let k = *key_of.entry(group).or_insert_with(|| {
                keys.push(VecDeque::new());
                keys.len() - 1
            });
            keys[k].push_back(i);
        }
        let mut bodies: Vec<Option<String>> =
            event.records.iter().map(|r| r.body.clone()).collect();
        let unread = self.resume_kept(&event, &ids, &mut bodies, deadline).await;
        // Keys that stopped: a record of theirs waits or failed, and the rest wait as long.
        let mut stopped = vec![false; keys.len()];
        loop {
            // The records behind a key's first that waits or failed, and for how long.
            let mut behind: Vec<(usize, Duration)> = Vec::new();
            // Heads that fail before their round (key, record): unreadable ones not parked,
            // and those whose kept progress could not be read (not attempted as if new).
            let mut failing_heads = self
                .park_unreadable_heads(&event, &bodies, &mut keys, &stopped, &mut plan, deadline)
                .await;
            for (k, key) in keys.iter().enumerate() {
                if let Some(&head) = key.front()
                    && unread.contains(&head)
                    && failing_heads.iter().all(|&(_, h)| h != head)
                {
                    failing_heads.push((k, head));
                }
            }
            for &(k, head) in &failing_heads {
                keys[k].pop_front();
                stopped[k] = true;
                behind.extend(
                    keys[k]
                        .drain(..)
                        .map(|i| (i, self.failed_wait(&event.records[head]))),
                );
            }
            let failing_heads: Vec<usize> = failing_heads.into_iter().map(|(_, i)| i).collect();
            if !failing_heads.is_empty() {
                let failed = failed_receipts(&event, failing_heads.iter().copied());
                let backed_off = back_off(
                    self.ports.ordered_queue.as_ref(),
                    failed,
                    self.settings.scale,
                );
                let _ = self.before_stop(deadline, backed_off).await;
                plan.failed.extend(failing_heads);
            }
            let heads: Vec<(usize, usize)> = keys
                .iter()
                .enumerate()
                .filter(|(k, _)| !stopped[*k])
                .filter_map(|(k, key)| Some((k, *key.front()?)))
                .collect();
            if heads.is_empty() || !self.can_attempt(deadline) {
                self.hold_behind(&event, &behind, deadline).await;
                plan.in_flight.extend(behind.iter().map(|(i, _)| *i));
                break;
            }
            let mut round = SqsEvent::default();
            round.records = heads
                .iter()
                .map(|&(_, i)| {
                    let mut record = event.records[i].clone();
                    record.body = bodies[i].clone();
                    record
                })
                .collect();
            let (mut done, took) = self.process(&round, deadline, Mode::Ordered).await;
            timings.add(took);
            let waiting: Vec<(usize, DeliveryMessage)> = done
                .ordered
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter(|(r, _)| !done.failed.contains(r))
                .collect();
            let held = self
                .hold_ordered(&round, waiting, invoked_at, deadline)
                .await;
            for (r, &(k, i)) in heads.iter().enumerate() {
                keys[k].pop_front();
                let wait = match held.get(&r) {
                    _ if done.failed.contains(&r) => {
                        plan.failed.insert(i);
                        self.failed_wait(&event.records[i])
                    }
                    Some(Held::Until(wait)) => {
                        plan.in_flight.insert(i);
                        *wait
                    }
                    Some(Held::NotKept) => {
                        plan.failed.insert(i);
                        self.failed_wait(&event.records[i])
                    }
                    None => continue,
                };
                stopped[k] = true;
                behind.extend(keys[k].drain(..).map(|j| (j, wait)));
            }
            // Held at once, not after the last round: their key comes back when its first does.
            self.hold_behind(&event, &behind, deadline).await;
            plan.in_flight.extend(behind.iter().map(|(i, _)| *i));
            merge_round(&mut plan, done);
        }
        // Not reached before the deadline: back at once, their key whole, as they were.
        let rest: Vec<(usize, Duration)> = keys
            .into_iter()
            .flatten()
            .map(|i| (i, Duration::ZERO))
            .collect();
        self.hold_behind(&event, &rest, deadline).await;
        plan.in_flight.extend(rest.iter().map(|(i, _)| *i));
        // Every round's journal entries and endpoint health, once, as an unordered
        // invocation writes its whole batch's.
        let journal = std::mem::take(&mut plan.journal);
        let health = self.before_stop(
            deadline,
            self.write_health(std::mem::take(&mut plan.health)),
        );
        let (unwritten, health) = futures::join!(self.write_journal(journal, deadline), health);
        plan.journal_unwritten += unwritten;
        if health.is_none() {
            warn!("endpoint health not recorded: the invocation's deadline came first");
        }
        self.conclude(plan, &ids, deadline, started, timings).await
    }

    /// Puts the kept progress of records received before in place of their bodies. Answers
    /// the records whose progress could not be read (the store did not answer): they are not
    /// attempted. A progress that does not fit its record is left, and the record is
    /// attempted as it was first sent (its attempts count again).
    async fn resume_kept(
        &self,
        event: &SqsEvent,
        ids: &[String],
        bodies: &mut [Option<String>],
        deadline: DateTime<Utc>,
    ) -> BTreeSet<usize> {
        let again: Vec<usize> = (0..event.records.len())
            .filter(|&i| receive_count(&event.records[i]) > 1 && !ids[i].is_empty())
            .collect();
        if again.is_empty() {
            return BTreeSet::new();
        }
        let wanted: Vec<String> = again.iter().map(|&i| ids[i].clone()).collect();
        let kept = match self
            .before_stop(deadline, self.ports.state.ordered_progress(&wanted))
            .await
        {
            Some(Ok(kept)) => kept,
            Some(Err(e)) => {
                error!(error = %e, records = again.len(), "ordered messages' progress could not be read; they come back");
                return again.into_iter().collect();
            }
            None => return again.into_iter().collect(),
        };
        for i in again {
            let Some(progress) = kept.get(&ids[i]) else {
                continue;
            };
            let received = bodies[i].as_deref().map(DeliveryQueueMessage::from_body);
            let Some(Ok(DeliveryQueueMessage::Delivery(message))) = received else {
                continue;
            };
            match resume(progress, message).map(|m| m.to_body()) {
                Ok(Ok(body)) => bodies[i] = Some(body),
                Ok(Err(e)) => {
                    warn!(message_id = %ids[i], error = %e, "a resumed ordered message could not be encoded; attempted as first sent");
                }
                Err(e) => {
                    warn!(message_id = %ids[i], error = %e, "an ordered message's kept progress does not fit it; attempted as first sent");
                }
            }
        }
        BTreeSet::new()
    }

    /// Parks the heads of `keys` (those not stopped) that cannot be read and were received
    /// often enough ([`parks_unreadable`]); a key whose head is parked goes on with its next,
    /// which may be parked in turn. Answers the heads that should have been parked but were
    /// not (key, record): they fail.
    async fn park_unreadable_heads(
        &self,
        event: &SqsEvent,
        bodies: &[Option<String>],
        keys: &mut [VecDeque<usize>],
        stopped: &[bool],
        plan: &mut Plan,
        deadline: DateTime<Utc>,
    ) -> Vec<(usize, usize)> {
        let mut not_parked: Vec<(usize, usize)> = Vec::new();
        if self.ports.ordered_redrive_queue.is_none() {
            return not_parked;
        }
        loop {
            let parkable: Vec<(usize, usize)> = keys
                .iter()
                .enumerate()
                .filter(|(k, _)| !stopped[*k])
                .filter_map(|(k, key)| Some((k, *key.front()?)))
                .filter(|&(_, i)| {
                    not_parked.iter().all(|&(_, h)| h != i)
                        && unreadable(bodies[i].as_deref())
                        && parks_unreadable(receive_count(&event.records[i]))
                })
                .collect();
            if parkable.is_empty() {
                return not_parked;
            }
            let parked = self
                .park(event, parkable.iter().map(|&(_, i)| i), deadline)
                .await;
            for (k, i) in parkable {
                if parked.contains(&i) {
                    keys[k].pop_front();
                    plan.parked += 1;
                } else {
                    not_parked.push((k, i));
                }
            }
        }
    }

    /// Parks `records` (which cannot be read) in the ordered redrive queue, each in its own
    /// message group, sealed as sent; answers those the queue took, which the invocation then
    /// names as done (SQS deletes them from the ordered queue). One taken but not deleted (the
    /// invocation stopped) is parked again when it comes back: the redrive queue may hold it
    /// twice. Those not taken fail, and come back.
    async fn park(
        &self,
        event: &SqsEvent,
        records: impl Iterator<Item = usize>,
        deadline: DateTime<Utc>,
    ) -> BTreeSet<usize> {
        let Some(queue) = self.ports.ordered_redrive_queue.as_deref() else {
            return BTreeSet::new();
        };
        let records: Vec<usize> = records.collect();
        let messages: Vec<OutgoingMessage> = records
            .iter()
            .map(|&i| OutgoingMessage {
                body: event.records[i].body.clone().unwrap_or_default(),
                delay: Duration::ZERO,
                group: event.records[i].attributes.get(MESSAGE_GROUP).cloned(),
            })
            .collect();
        let Some(sent) = self.before_stop(deadline, queue.send_all(&messages)).await else {
            warn!(
                records = records.len(),
                "unreadable ordered messages not parked: the invocation's deadline came first"
            );
            return BTreeSet::new();
        };
        let mut parked = BTreeSet::new();
        for (&i, result) in records.iter().zip(sent) {
            let record = &event.records[i];
            let message_id = record.message_id.as_deref().unwrap_or_default();
            match result {
                Ok(()) => {
                    error!(
                        message_id,
                        group = record.attributes.get(MESSAGE_GROUP).map(String::as_str),
                        receives = receive_count(record),
                        "an ordered message that cannot be read was parked in the ordered redrive queue; its key goes on without it"
                    );
                    parked.insert(i);
                }
                Err(e) => {
                    warn!(message_id, error = %e, "an unreadable ordered message could not be parked; it comes back and holds its key");
                }
            }
        }
        metrics::counter!(PARKED_METRIC).increment(parked.len() as u64);
        parked
    }

    /// How long a failed record stays away: the short, growing wait of
    /// [`redelivery_delay`] by its receive count (what [`back_off`] sets).
    fn failed_wait(&self, record: &SqsMessage) -> Duration {
        redelivery_delay(receive_count(record), self.settings.scale)
    }

    /// Keeps what each waiting record of `round` would be enqueued as beside it, then holds
    /// it in flight until it is due. A record whose progress could not be kept comes back
    /// after a short wait, as failed records do, and is attempted as it was. A hold that SQS
    /// refuses leaves the record to come back after its visibility timeout; its kept progress
    /// then holds it again until due.
    async fn hold_ordered(
        &self,
        round: &SqsEvent,
        waiting: Vec<(usize, DeliveryMessage)>,
        invoked_at: DateTime<Utc>,
        deadline: DateTime<Utc>,
    ) -> BTreeMap<usize, Held> {
        if waiting.is_empty() {
            return BTreeMap::new();
        }
        let now = self.ports.clock.now();
        let holds = waiting.iter().map(|(r, message)| async move {
            let record = &round.records[*r];
            let id = record.message_id.as_deref().unwrap_or_default();
            let kept = match progress_text(message) {
                Ok(text) if !id.is_empty() => self
                    .ports
                    .state
                    .put_ordered_progress(id, &text, now)
                    .await
                    .map_err(|e| e.to_string()),
                Ok(_) => Err("the record has no message id".to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = kept {
                error!(message_id = %id, error = %e, "an ordered message's progress could not be kept; it comes back as it was");
                return (*r, Held::NotKept);
            }
            // Never shorter than its floor: a message held again and again for short waits
            // would reach the redrive count (`ORDERED_MAX_RECEIVE_COUNT`).
            let wait = hold_for(message.not_before, invoked_at, now)
                .max(hold_floor(receive_count(record), self.settings.scale));
            if let Some(receipt) = record.receipt_handle.as_deref()
                && let Err(e) = self.ports.ordered_queue.retry_after(receipt, wait).await
            {
                warn!(message_id = %id, error = %e, "an ordered message could not be held until due; it comes back after the visibility timeout and is held then");
            }
            (*r, Held::Until(wait))
        });
        let held: BTreeMap<usize, Held> = match self
            .before_stop(deadline, futures::future::join_all(holds))
            .await
        {
            Some(results) => results.into_iter().collect(),
            None => waiting.iter().map(|(r, _)| (*r, Held::NotKept)).collect(),
        };
        let not_kept: Vec<usize> = held
            .iter()
            .filter(|(_, h)| matches!(h, Held::NotKept))
            .map(|(r, _)| *r)
            .collect();
        let failed = failed_receipts(round, not_kept.iter().copied());
        let backed_off = back_off(
            self.ports.ordered_queue.as_ref(),
            failed,
            self.settings.scale,
        );
        let _ = self.before_stop(deadline, backed_off).await;
        held
    }

    /// Makes each of `records` (not attempted) visible again after its wait.
    async fn hold_behind(
        &self,
        event: &SqsEvent,
        records: &[(usize, Duration)],
        deadline: DateTime<Utc>,
    ) {
        let queue = self.ports.ordered_queue.as_ref();
        let releases = records.iter().filter_map(|&(i, wait)| {
            let receipt = event.records[i].receipt_handle.as_deref()?;
            Some(queue.retry_after(receipt, wait))
        });
        let done = self
            .before_stop(deadline, futures::future::join_all(releases))
            .await;
        let refused = done.map_or(records.len(), |results| {
            results.iter().filter(|r| r.is_err()).count()
        });
        if refused > 0 {
            warn!(
                refused,
                "ordered messages' waits not set: they come back after the visibility timeout"
            );
        }
    }
}

/// What became of a waiting ordered record's hold.
enum Held {
    /// Its progress is kept, and it stays in flight this long.
    Until(Duration),
    /// Its progress could not be kept: it failed.
    NotKept,
}

/// Adds what one round did to the invocation's plan.
fn merge_round(plan: &mut Plan, done: Plan) {
    for ((topic, subscription), metrics) in done.by_subscription {
        let mine = plan.of(&topic, &subscription);
        mine.counts.add(&metrics.counts);
        mine.latency_ms.extend(metrics.latency_ms);
    }
    plan.late.extend(done.late);
    plan.journal.extend(done.journal);
    plan.health.add(done.health);
    plan.journal_unwritten += done.journal_unwritten;
}
