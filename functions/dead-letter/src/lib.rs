//! The `dead-letter` function: writes undeliverable events to S3.
//!
//! Invoked by the dead-letter queue's event source; messages arrive there five minutes after
//! the last attempt (L4). Records are written as JSON arrays in the L6 format, one object per
//! subscription and hour: `PREFIX/TOPIC/SUBSCRIPTION/YYYY/MM/DD/HH/<subscription id>.<uuid>.json` (L3). When the
//! bucket cannot be written, the message goes back on the queue with a delay and is tried again,
//! until the location has been unavailable for four hours; then its events are dropped, counted
//! and logged (L5). A bucket that no longer exists (subscriptions are refused one that does not
//! exist when created) is such an unavailable location, counted and logged apart. Every object written is announced as a `Gridrelay.DeadLetter.BlobCreated`
//! event on the system topic `gridrelay-dead-letter-events`, which users subscribe to like any
//! other topic (L7). What became of each message's events (written where, or dropped) goes to the
//! delivery journal (#35) in one call per invocation, never at the cost of a write.

use std::sync::Arc;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use chrono::{DateTime, Utc};
use futures::future::join_all;
use gridrelay_adapters::aws::failed_receipts;
use gridrelay_adapters::journal::write_entries;
use gridrelay_ports::fan_out::{FanOutError, fan_out};
use gridrelay_ports::{
    Clock, MessageQueue, ObjectStore, OutgoingMessage, RecordStream, SubscriptionStore, back_off,
};
use gridrelay_shared::dead_letter::{
    DeadLetterWrite, dead_letter_written_event, object_key, object_name,
};
use gridrelay_shared::dead_letter_write::{
    AfterWriteFailure, ObjectMessages, after_write_failure, is_announced, plan_writes,
    reason_counts, render_object_of,
};
use gridrelay_shared::deadline::REPLY_MARGIN;
use gridrelay_shared::journal::{JournalEntry, Step, dead_letter_entry};
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::time_scale::TimeScale;
use tracing::{Instrument, Span, error, info, info_span, warn};

/// L5: events dropped after their dead-letter location was unavailable for four hours, as a
/// CloudWatch metric (namespace `Gridrelay`; per topic and subscription, and for the stack).
pub const DROPPED_METRIC: &str = "DeadLetterEventsDropped";
/// L5: of those, the events whose bucket no longer existed (also in [`DROPPED_METRIC`]).
pub const BUCKET_MISSING_METRIC: &str = "DeadLetterEventsDroppedBucketMissing";

/// L7: where dead-letter writes are announced: the subscriptions of a system topic.
pub struct DeadLetterNotices {
    pub store: Arc<dyn SubscriptionStore>,
    pub delivery_queue: Arc<dyn MessageQueue>,
    /// Usually [`DEAD_LETTER_EVENTS_TOPIC`].
    pub topic: String,
}

/// What `dead-letter` needs.
pub struct DeadLetterWriter {
    pub objects: Arc<dyn ObjectStore>,
    /// The dead-letter queue itself, for messages whose write must be tried again.
    pub dead_letter_queue: Arc<dyn MessageQueue>,
    pub clock: Arc<dyn Clock>,
    pub scale: TimeScale,
    /// L7: announce each write; `None` announces nothing.
    pub notices: Option<DeadLetterNotices>,
    /// The delivery journal (#35): where each message's events went (written, or dropped).
    pub journal: Arc<dyn RecordStream>,
}

/// What writing one object's messages did.
#[derive(Default)]
struct GroupDone {
    report: DeadLetterReport,
    /// The positions of the messages SQS is to redeliver.
    failed: Vec<usize>,
    /// What became of the messages' events, for the journal.
    journal: Vec<JournalEntry>,
}

impl GroupDone {
    fn failed(failed: Vec<usize>) -> Self {
        Self {
            failed,
            ..Self::default()
        }
    }
}

/// Counts of what one invocation did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadLetterReport {
    pub objects_written: usize,
    pub records_written: usize,
    /// Records whose write will be tried again.
    pub records_deferred: usize,
    /// L5: records dropped after four hours of an unavailable location.
    pub records_dropped: usize,
    /// Of those, records whose bucket no longer existed.
    pub records_dropped_bucket_missing: usize,
    /// L7: announcements enqueued (one per object per subscription of the system topic).
    pub notices_enqueued: usize,
    pub failed_messages: usize,
    /// Journal entries the journal did not take (#35; written or dropped all the same).
    pub journal_unwritten: usize,
}

impl DeadLetterReport {
    pub fn add(&mut self, other: &DeadLetterReport) {
        self.objects_written += other.objects_written;
        self.records_written += other.records_written;
        self.records_deferred += other.records_deferred;
        self.records_dropped += other.records_dropped;
        self.records_dropped_bucket_missing += other.records_dropped_bucket_missing;
        self.notices_enqueued += other.notices_enqueued;
        self.failed_messages += other.failed_messages;
        self.journal_unwritten += other.journal_unwritten;
    }
}

#[derive(Debug, Clone, Default)]
pub struct DeadLetterOutcome {
    pub failed_message_ids: Vec<String>,
    pub report: DeadLetterReport,
}

impl DeadLetterOutcome {
    pub fn into_batch_response(self) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        response.set_failures(self.failed_message_ids);
        response
    }
}

impl DeadLetterWriter {
    /// Writes one batch of dead-letter queue messages, with no deadline.
    pub async fn handle(&self, event: SqsEvent) -> DeadLetterOutcome {
        self.handle_until(event, DateTime::<Utc>::MAX_UTC).await
    }

    /// Writes one batch of dead-letter queue messages before `deadline` (a Lambda's: its start
    /// plus its timeout), in the invocation's span. A write not finished
    /// [`REPLY_MARGIN`](gridrelay_shared::deadline::REPLY_MARGIN)
    /// before it is given up and its messages come back from SQS (the object may then be
    /// written twice: at least once), so the invocation always returns in time (#34 item 12).
    pub async fn handle_until(
        &self,
        event: SqsEvent,
        deadline: DateTime<Utc>,
    ) -> DeadLetterOutcome {
        let span = info_span!("dead_letter", records = event.records.len());
        self.handle_records(event, deadline).instrument(span).await
    }

    /// Runs `step` until [`REPLY_MARGIN`] before `deadline`; `None` if that came first.
    async fn before_stop<T>(
        &self,
        deadline: DateTime<Utc>,
        step: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        gridrelay_adapters::runtime::before_stop(self.clock.now(), deadline, REPLY_MARGIN, step)
            .await
    }

    /// [`DeadLetterWriter::handle_until`], in its span.
    async fn handle_records(&self, event: SqsEvent, deadline: DateTime<Utc>) -> DeadLetterOutcome {
        let now = self.clock.now();
        let mut report = DeadLetterReport::default();
        let mut failed = Vec::new();
        let ids: Vec<String> = event
            .records
            .iter()
            .map(|r| r.message_id.clone().unwrap_or_default())
            .collect();
        let plan = plan_writes(event.records.iter().map(|r| r.body.as_deref()));
        for &i in &plan.unreadable {
            error!(message_id = %ids[i], "unreadable dead-letter message; leaving it to the redrive policy");
        }
        failed.extend(plan.unreadable);

        let writes = plan.objects.into_iter().map(|messages| {
            let span = match messages.first() {
                Some((_, m)) => {
                    info_span!("subscription", topic = %m.topic, subscription = %m.subscription)
                }
                None => Span::none(),
            };
            let positions: Vec<usize> = messages.iter().map(|(i, _)| *i).collect();
            let write = self.write_group(messages, now).instrument(span.clone());
            async move {
                self.before_stop(deadline, write).await.unwrap_or_else(|| {
                    span.in_scope(|| warn!("dead-letter write not finished before the invocation's deadline; SQS will redeliver its messages"));
                    GroupDone::failed(positions)
                })
            }
        });
        let mut journal = Vec::new();
        for done in join_all(writes).await {
            report.add(&done.report);
            failed.extend(done.failed);
            journal.extend(done.journal);
        }
        let backed_off = back_off(
            self.dead_letter_queue.as_ref(),
            failed_receipts(&event, failed.iter().copied()),
            self.scale,
        );
        let journaled = write_entries(
            self.journal.as_ref(),
            &journal,
            self.clock.now(),
            deadline,
            REPLY_MARGIN,
        );
        let (backed_off, unwritten) =
            futures::join!(self.before_stop(deadline, backed_off), journaled);
        report.journal_unwritten = unwritten;
        if backed_off.is_none() {
            warn!(
                "failed messages come back after the visibility timeout: the invocation's deadline came before their shorter wait was set"
            );
        }
        report.failed_messages = failed.len();
        info!(
            objects_written = report.objects_written,
            records_written = report.records_written,
            records_deferred = report.records_deferred,
            records_dropped = report.records_dropped,
            notices_enqueued = report.notices_enqueued,
            failed_messages = report.failed_messages,
            journal_unwritten = report.journal_unwritten,
            "dead-letter invocation"
        );
        DeadLetterOutcome {
            failed_message_ids: failed.into_iter().map(|i| ids[i].clone()).collect(),
            report,
        }
    }

    /// Writes one object for the group; on failure, defers or drops each message (L5).
    async fn write_group(&self, messages: ObjectMessages, now: DateTime<Utc>) -> GroupDone {
        let mut report = DeadLetterReport::default();
        let positions = |messages: &ObjectMessages| messages.iter().map(|(i, _)| *i).collect();
        let (body, records) = match render_object_of(&messages) {
            Ok(rendered) => rendered,
            Err(e) => {
                // Events were validated as JSON objects on publish; this is a bug.
                error!(error = %e, "could not render a dead-letter record");
                return GroupDone::failed(positions(&messages));
            }
        };
        let Some((_, first)) = messages.first() else {
            return GroupDone::default();
        };
        let key = object_key(
            &first.destination,
            &first.topic,
            &first.subscription,
            first.dead_lettered_at,
            &object_name(&first.subscription_id, &uuid::Uuid::new_v4().to_string()),
        );
        let content_length = body.len();
        if let Err(e) = self
            .objects
            .put_json(&first.destination.bucket, &key, body)
            .await
        {
            // Told apart: a bucket deleted since the subscription was made.
            warn!(bucket = %first.destination.bucket, bucket_missing = e.bucket_missing, error = %e, "dead-letter location unavailable");
            return self.defer_or_drop(messages, now, e.bucket_missing).await;
        }
        info!(bucket = %first.destination.bucket, key = %key, records, "dead-lettered");
        report.objects_written = 1;
        report.records_written = records;
        let location = format!("s3://{}/{key}", first.destination.bucket);
        let journal = messages
            .iter()
            .map(|(_, m)| {
                let step = Step::DeadLettered {
                    location: location.clone(),
                };
                dead_letter_entry(m, now, step)
            })
            .collect();
        let write = DeadLetterWrite {
            bucket: &first.destination.bucket,
            key: &key,
            content_length,
            topic: &first.topic,
            subscription: &first.subscription,
            reasons: reason_counts(messages.iter().flat_map(|(_, m)| &m.entries)),
        };
        let failed = match self.announce(&write, now).await {
            Ok(n) => {
                report.notices_enqueued = n;
                Vec::new()
            }
            Err(e) => {
                // SQS redelivers the messages: the object is written again and announced
                // then (at least once); the journal says where both copies are.
                error!(error = %e, "could not announce a dead-letter write");
                positions(&messages)
            }
        };
        GroupDone {
            report,
            failed,
            journal,
        }
    }

    /// L7: enqueues the announcement for the system topic's subscriptions. The system topic's own
    /// dead-letters are not announced, so a failing notification subscriber cannot loop.
    async fn announce(
        &self,
        write: &DeadLetterWrite<'_>,
        now: DateTime<Utc>,
    ) -> Result<usize, FanOutError> {
        let Some(notices) = &self.notices else {
            return Ok(0);
        };
        if !is_announced(write.topic, &notices.topic) {
            return Ok(0);
        }
        let event = dead_letter_written_event(write, &uuid::Uuid::new_v4().to_string(), now)
            .map_err(|e| FanOutError::Encode(e.to_string()))?;
        let done = fan_out(
            notices.store.as_ref(),
            notices.delivery_queue.as_ref(),
            &notices.topic,
            InputSchema::EventGridSchema,
            &[event],
            now,
        )
        .await?;
        Ok(done.enqueued)
    }

    /// L5: sends each message back for another try, or drops its events after four hours;
    /// `bucket_missing`: the write failed because the bucket does not exist.
    async fn defer_or_drop(
        &self,
        messages: ObjectMessages,
        now: DateTime<Utc>,
        bucket_missing: bool,
    ) -> GroupDone {
        let mut report = DeadLetterReport::default();
        let mut retry = Vec::new();
        let mut failed = Vec::new();
        let mut journal = Vec::new();
        // Codes, as deliver's drops are named (`SubscriptionDeleted`): Athena groups by them.
        let reason = if bucket_missing {
            "DeadLetterBucketMissing"
        } else {
            "DeadLetterLocationUnavailable"
        };
        for (i, m) in messages {
            let dropped = dead_letter_entry(
                &m,
                now,
                Step::Dropped {
                    reason: reason.to_string(),
                },
            );
            let (topic, subscription, bucket) = (
                m.topic.clone(),
                m.subscription.clone(),
                m.destination.bucket.clone(),
            );
            match after_write_failure(m, now, self.scale) {
                AfterWriteFailure::Drop { events } => {
                    warn!(
                        %bucket,
                        dropped = events,
                        bucket_missing,
                        "events dropped: dead-letter location unavailable for four hours"
                    );
                    // A metric for the subscription and one for the stack (the alarm's).
                    let labels = [
                        ("Topic", topic.clone()),
                        ("Subscription", subscription.clone()),
                    ];
                    metrics::counter!(DROPPED_METRIC, &labels).increment(events as u64);
                    metrics::counter!(DROPPED_METRIC).increment(events as u64);
                    report.records_dropped += events;
                    journal.push(dropped);
                    if bucket_missing {
                        metrics::counter!(BUCKET_MISSING_METRIC, &labels).increment(events as u64);
                        report.records_dropped_bucket_missing += events;
                    }
                }
                AfterWriteFailure::TryAgain { message, delay } => match message.to_body() {
                    Ok(body) => retry.push((
                        i,
                        message.entries.len(),
                        OutgoingMessage {
                            body,
                            delay,
                            group: None,
                        },
                    )),
                    Err(e) => {
                        error!(error = %e, "could not encode a dead-letter message");
                        failed.push(i);
                    }
                },
            }
        }
        let outgoing: Vec<OutgoingMessage> = retry.iter().map(|(_, _, o)| o.clone()).collect();
        let sent = self.dead_letter_queue.send_all(&outgoing).await;
        for ((i, count, _), result) in retry.into_iter().zip(sent) {
            match result {
                Ok(()) => report.records_deferred += count,
                Err(e) => {
                    error!(error = %e, "could not re-enqueue a dead-letter message; SQS will redeliver it");
                    failed.push(i);
                }
            }
        }
        GroupDone {
            report,
            failed,
            journal,
        }
    }
}

#[cfg(test)]
mod tests {
    //! The shell over in-memory ports: what the writer does with a batch, a failing bucket and an
    //! unreadable message.

    use super::*;
    use chrono::TimeZone;
    use gridrelay_adapters::aws::sqs_event;
    use gridrelay_ports::memory::{
        ManualClock, MemoryJournal, MemoryObjectStore, MemoryQueue, QueuedMessage,
    };
    use gridrelay_shared::classify::DeliveryOutcome;
    use gridrelay_shared::decision::DeadLetterReason;
    use gridrelay_shared::message::{DeadLetterEntry, DeadLetterMessage};
    use gridrelay_shared::schema::DeliverySchema;
    use gridrelay_shared::subscription::DeadLetterDestination;
    use serde_json::value::RawValue;

    struct Fixture {
        clock: Arc<ManualClock>,
        objects: Arc<MemoryObjectStore>,
        queue: Arc<MemoryQueue>,
        journal: Arc<MemoryJournal>,
        writer: DeadLetterWriter,
    }

    fn fixture() -> Fixture {
        let start = Utc.with_ymd_and_hms(2026, 11, 23, 10, 0, 0).unwrap();
        let clock = Arc::new(ManualClock::new(start));
        let objects = Arc::new(MemoryObjectStore::default());
        let queue = Arc::new(MemoryQueue::new(clock.clone()));
        let journal = Arc::new(MemoryJournal::default());
        let writer = DeadLetterWriter {
            objects: objects.clone(),
            dead_letter_queue: queue.clone(),
            clock: clock.clone(),
            scale: TimeScale::REAL,
            notices: None,
            journal: journal.clone(),
        };
        Fixture {
            clock,
            objects,
            queue,
            journal,
            writer,
        }
    }

    fn message(event_id: &str, at: DateTime<Utc>) -> String {
        DeadLetterMessage {
            topic: "orders".into(),
            subscription: "billing".into(),
            subscription_id: "0f0f".into(),
            schema: DeliverySchema::EventGridSchema,
            destination: DeadLetterDestination {
                bucket: "dead".into(),
                prefix: "dl".into(),
            },
            dead_lettered_at: at,
            first_write_failure: None,
            delivery: Some("replay:night".into()),
            entries: vec![DeadLetterEntry {
                reason: DeadLetterReason::MaxDeliveryAttemptsExceeded,
                delivery_attempts: 30,
                last_outcome: Some(DeliveryOutcome::Busy),
                publish_time: at,
                last_attempt_time: Some(at),
                event: RawValue::from_string(format!(r#"{{"id":"{event_id}"}}"#)).unwrap(),
            }],
        }
        .to_body()
        .unwrap()
    }

    /// The event for `bodies` received once each, ids `m0`, `m1`, ….
    fn batch(bodies: &[String]) -> SqsEvent {
        let received: Vec<QueuedMessage> = bodies
            .iter()
            .enumerate()
            .map(|(i, body)| QueuedMessage {
                id: format!("m{i}"),
                body: body.clone(),
                visible_at: Utc::now(),
                receive_count: 1,
                receipt: i as u64,
            })
            .collect();
        sqs_event(&received)
    }

    /// L3 + L6: messages of one subscription and hour go into one object; an unreadable message
    /// is failed alone and does not hold back the others.
    #[tokio::test]
    async fn l3_writes_one_object_and_fails_only_the_unreadable_message() {
        let f = fixture();
        let now = f.clock.now();
        let outcome = f
            .writer
            .handle(batch(&[
                message("e1", now),
                "not json".into(),
                message("e2", now),
            ]))
            .await;
        assert_eq!(outcome.failed_message_ids, vec!["m1".to_string()]);
        assert_eq!(outcome.report.objects_written, 1);
        assert_eq!(outcome.report.records_written, 2);
        let objects = f.objects.objects();
        let ((bucket, key), body) = objects.iter().next().unwrap();
        assert_eq!(bucket, "dead");
        assert!(
            key.starts_with("dl/orders/billing/2026/11/23/10/0f0f."),
            "{key}"
        );
        assert!(body.contains("\"e1\"") && body.contains("\"e2\""), "{body}");
    }

    /// L5: while the bucket fails, messages go back on the queue a minute later, stamped with
    /// their first failure; four hours after it, their events are dropped and counted (in the
    /// report, and as a metric for the subscription and for the stack: issue #9).
    #[tokio::test]
    async fn l5_defers_while_the_bucket_fails_then_drops_after_four_hours() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // The test's runtime runs on this thread.
        let _recording = metrics::set_default_local_recorder(&recorder);
        let f = fixture();
        f.objects.outage.set(true);
        let now = f.clock.now();
        let outcome = f.writer.handle(batch(&[message("e1", now)])).await;
        assert!(outcome.failed_message_ids.is_empty());
        assert_eq!(outcome.report.records_deferred, 1);
        let sent = f.queue.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].delay, std::time::Duration::from_secs(60));
        let deferred = DeadLetterMessage::from_body(&sent[0].body).unwrap();
        assert_eq!(deferred.first_write_failure, Some(now));

        f.clock.advance(std::time::Duration::from_secs(4 * 3600));
        let outcome = f.writer.handle(batch(&[sent[0].body.clone()])).await;
        assert_eq!(outcome.report.records_dropped, 1);
        assert_eq!(outcome.report.records_deferred, 0);
        assert_eq!(f.queue.sent().len(), 1, "nothing more is sent back");
        assert!(f.objects.objects().is_empty());
        let counted: Vec<(Vec<String>, String)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == DROPPED_METRIC)
            .map(|(key, _, _, value)| {
                let labels = key.key().labels().map(|l| l.value().to_string()).collect();
                (labels, format!("{value:?}"))
            })
            .collect();
        let deferred_topic = deferred.topic.clone();
        let mut expected = vec![
            (vec![], "Counter(1)".to_string()),
            (
                vec![deferred_topic, deferred.subscription.clone()],
                "Counter(1)".to_string(),
            ),
        ];
        let mut counted = counted;
        counted.sort();
        expected.sort();
        assert_eq!(counted, expected);
        assert_eq!(
            outcome.report.records_dropped_bucket_missing, 0,
            "the bucket exists"
        );
    }

    /// #37 item 4: the drop's warning names its topic and subscription through the span of the
    /// subscription's write, inside the invocation's span, not by fields of its own.
    #[tokio::test]
    async fn l5_the_drop_names_its_subscription_through_its_spans() {
        let logs = gridrelay_ports::log_capture::CapturedLogs::start();
        let f = fixture();
        f.objects.outage.set(true);
        let now = f.clock.now();
        f.writer.handle(batch(&[message("e1", now)])).await;
        let body = f.queue.sent()[0].body.clone();
        let sent = DeadLetterMessage::from_body(&body).unwrap();
        f.clock.advance(std::time::Duration::from_secs(4 * 3600));
        f.writer.handle(batch(&[body])).await;

        let line = logs
            .json_lines()
            .into_iter()
            .find(|l| {
                l["fields"]["message"]
                    == "events dropped: dead-letter location unavailable for four hours"
            })
            .unwrap_or_else(|| panic!("no drop line: {}", logs.text()));
        let spans = line["spans"].as_array().unwrap();
        assert_eq!(spans[0]["name"], "dead_letter", "{line}");
        assert_eq!(spans[1]["topic"], sent.topic.as_str(), "{line}");
        assert_eq!(
            spans[1]["subscription"],
            sent.subscription.as_str(),
            "{line}"
        );
        assert!(line["fields"].get("topic").is_none(), "{line}");
    }

    /// L5 (#11 item 5): a bucket deleted after its subscription was made is an unavailable
    /// location (retried for four hours, then dropped), its drops counted apart as well.
    #[tokio::test]
    async fn l5_a_bucket_that_disappeared_is_unavailable_and_counted_apart() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _recording = metrics::set_default_local_recorder(&recorder);
        let f = fixture();
        f.objects.delete_bucket("dead");
        let now = f.clock.now();
        let outcome = f.writer.handle(batch(&[message("e1", now)])).await;
        assert_eq!(outcome.report.records_deferred, 1);
        let body = f.queue.sent()[0].body.clone();
        f.clock.advance(std::time::Duration::from_secs(4 * 3600));
        let outcome = f.writer.handle(batch(&[body])).await;
        assert_eq!(outcome.report.records_dropped, 1);
        assert_eq!(outcome.report.records_dropped_bucket_missing, 1);
        let missing: u64 = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == BUCKET_MISSING_METRIC)
            .map(|(.., value)| match value {
                metrics_util::debugging::DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum();
        assert_eq!(missing, 1);
    }

    /// L3 + #35: the journal says where each written event went (the object's `s3://` address,
    /// at the write's time), in one entry per message, named for the delivery that gave the
    /// events up.
    #[tokio::test]
    async fn l3_the_journal_says_which_object_each_event_went_to() {
        let f = fixture();
        let now = f.clock.now();
        f.writer
            .handle(batch(&[message("e1", now), message("e2", now)]))
            .await;
        let objects = f.objects.objects();
        let ((bucket, key), _) = objects.iter().next().unwrap();
        let location = format!("s3://{bucket}/{key}");
        let entries = f.journal.entries();
        let mut ids: Vec<&str> = entries
            .iter()
            .flat_map(|e| e.ids.iter().map(String::as_str))
            .collect();
        ids.sort();
        assert_eq!(ids, ["e1", "e2"]);
        for e in &entries {
            assert_eq!(
                (e.topic.as_str(), e.subscription.as_str()),
                ("orders", "billing")
            );
            assert_eq!(e.time, now);
            assert_eq!(e.delivery.as_deref(), Some("replay:night"));
            assert_eq!(
                e.step,
                Step::DeadLettered {
                    location: location.clone()
                }
            );
        }
    }

    /// L5 + #35: a drop after four hours is journaled as one (nothing while the write is only
    /// deferred), so `event show` says the event is gone, and why.
    #[tokio::test]
    async fn l5_a_drop_is_journaled_with_its_reason() {
        let f = fixture();
        f.objects.outage.set(true);
        let now = f.clock.now();
        f.writer.handle(batch(&[message("e1", now)])).await;
        assert!(
            f.journal.entries().is_empty(),
            "a deferred write is no step yet"
        );
        let body = f.queue.sent()[0].body.clone();
        f.clock.advance(std::time::Duration::from_secs(4 * 3600));
        f.writer.handle(batch(&[body])).await;
        let entries = f.journal.entries();
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].ids, ["e1"]);
        assert_eq!(entries[0].delivery.as_deref(), Some("replay:night"));
        assert_eq!(
            entries[0].step,
            Step::Dropped {
                reason: "DeadLetterLocationUnavailable".into()
            }
        );
    }

    /// #35: a journal that is down costs no dead-letter write: the object is written, no
    /// message fails, and the entries it did not take are counted.
    #[tokio::test]
    async fn a_journal_that_is_down_costs_no_dead_letter_write() {
        let f = fixture();
        f.journal.outage.set(true);
        let now = f.clock.now();
        let outcome = f.writer.handle(batch(&[message("e1", now)])).await;
        assert!(outcome.failed_message_ids.is_empty());
        assert_eq!(outcome.report.records_written, 1);
        assert_eq!(outcome.report.journal_unwritten, 1);
        assert_eq!(f.objects.objects().len(), 1);
    }
}
