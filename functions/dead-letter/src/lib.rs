//! The `dead-letter` function: writes undeliverable events to S3.
//!
//! Invoked by the dead-letter queue's event source; messages arrive there five minutes after
//! the last attempt (L4). Records are written as JSON arrays in the L6 format, one object per
//! subscription and hour: `PREFIX/TOPIC/SUBSCRIPTION/YYYY/MM/DD/HH/<subscription id>.<uuid>.json` (L3). When the
//! bucket cannot be written, the message goes back on the queue with a delay and is tried again,
//! until the location has been unavailable for four hours; then its events are dropped, counted
//! and logged (L5). Every object written is announced as a `Gridrelay.DeadLetter.BlobCreated`
//! event on the system topic `gridrelay-dead-letter-events`, which users subscribe to like any
//! other topic (L7).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use chrono::{DateTime, Utc};
use futures::future::join_all;
use gridrelay_adapters::aws::failed_receipts;
use gridrelay_ports::fan_out::{FanOutError, fan_out};
use gridrelay_ports::{
    Clock, MessageQueue, ObjectStore, OutgoingMessage, SubscriptionStore, back_off,
};
use gridrelay_shared::dead_letter::{
    DeadLetterWrite, FieldNaming, dead_letter_written_event, object_key, object_name,
    render_object, render_record,
};
use gridrelay_shared::decision::to_chrono;
use gridrelay_shared::message::{DeadLetterMessage, queue_delay};
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::time_scale::TimeScale;
use tracing::{error, info, warn};

/// L5: how long a dead-letter location may be unavailable before its events are dropped.
pub const UNAVAILABLE_LIMIT: Duration = Duration::from_secs(4 * 3600);
/// Wait between tries to write to an unavailable location.
pub const WRITE_RETRY_DELAY: Duration = Duration::from_secs(60);

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
    /// L7: announcements enqueued (one per object per subscription of the system topic).
    pub notices_enqueued: usize,
    pub failed_messages: usize,
}

impl DeadLetterReport {
    pub fn add(&mut self, other: &DeadLetterReport) {
        self.objects_written += other.objects_written;
        self.records_written += other.records_written;
        self.records_deferred += other.records_deferred;
        self.records_dropped += other.records_dropped;
        self.notices_enqueued += other.notices_enqueued;
        self.failed_messages += other.failed_messages;
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

/// Records that go into one object: same location, subscription and hour.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ObjectGroup {
    bucket: String,
    prefix: String,
    topic: String,
    subscription: String,
    subscription_id: String,
    hour: String,
}

impl DeadLetterWriter {
    pub async fn handle(&self, event: SqsEvent) -> DeadLetterOutcome {
        let now = self.clock.now();
        let mut report = DeadLetterReport::default();
        let mut failed = Vec::new();
        let mut groups: BTreeMap<ObjectGroup, Vec<(usize, DeadLetterMessage)>> = BTreeMap::new();
        let ids: Vec<String> = event
            .records
            .iter()
            .map(|r| r.message_id.clone().unwrap_or_default())
            .collect();

        for (i, record) in event.records.iter().enumerate() {
            match record.body.as_deref().map(DeadLetterMessage::from_body) {
                Some(Ok(m)) => {
                    let key = ObjectGroup {
                        bucket: m.destination.bucket.clone(),
                        prefix: m.destination.prefix.clone(),
                        topic: m.topic.clone(),
                        subscription: m.subscription.clone(),
                        subscription_id: m.subscription_id.clone(),
                        hour: m.dead_lettered_at.format("%Y%m%d%H").to_string(),
                    };
                    groups.entry(key).or_default().push((i, m));
                }
                _ => {
                    error!(message_id = %ids[i], "unreadable dead-letter message; leaving it to the redrive policy");
                    failed.push(i);
                }
            }
        }

        let writes = groups
            .into_values()
            .map(|messages| self.write_group(messages, now));
        for (group_report, group_failed) in join_all(writes).await {
            report.add(&group_report);
            failed.extend(group_failed);
        }
        back_off(
            self.dead_letter_queue.as_ref(),
            failed_receipts(&event, failed.iter().copied()),
            self.scale,
        )
        .await;
        report.failed_messages = failed.len();
        info!(
            objects_written = report.objects_written,
            records_written = report.records_written,
            records_deferred = report.records_deferred,
            records_dropped = report.records_dropped,
            notices_enqueued = report.notices_enqueued,
            failed_messages = report.failed_messages,
            "dead-letter invocation"
        );
        DeadLetterOutcome {
            failed_message_ids: failed.into_iter().map(|i| ids[i].clone()).collect(),
            report,
        }
    }

    /// Writes one object for the group; on failure, defers or drops each message (L5).
    async fn write_group(
        &self,
        messages: Vec<(usize, DeadLetterMessage)>,
        now: DateTime<Utc>,
    ) -> (DeadLetterReport, Vec<usize>) {
        let mut report = DeadLetterReport::default();
        let mut records = Vec::new();
        for (_, m) in &messages {
            for entry in &m.entries {
                match render_record(entry, FieldNaming::for_schema(m.schema)) {
                    Ok(r) => records.push(r),
                    Err(e) => {
                        // Events were validated as JSON objects on publish; this is a bug.
                        error!(error = %e, "could not render a dead-letter record");
                        return (report, messages.iter().map(|(i, _)| *i).collect());
                    }
                }
            }
        }
        let Some((_, first)) = messages.first() else {
            return (report, Vec::new());
        };
        let key = object_key(
            &first.destination,
            &first.topic,
            &first.subscription,
            first.dead_lettered_at,
            &object_name(&first.subscription_id, &uuid::Uuid::new_v4().to_string()),
        );
        let body = render_object(&records);
        let content_length = body.len();
        match self
            .objects
            .put_json(&first.destination.bucket, &key, body)
            .await
        {
            Ok(()) => {
                info!(bucket = %first.destination.bucket, key = %key, records = records.len(), "dead-lettered");
                report.objects_written = 1;
                report.records_written = records.len();
                let mut reasons = BTreeMap::new();
                for entry in messages.iter().flat_map(|(_, m)| &m.entries) {
                    *reasons.entry(entry.reason.to_string()).or_insert(0) += 1;
                }
                let write = DeadLetterWrite {
                    bucket: &first.destination.bucket,
                    key: &key,
                    content_length,
                    topic: &first.topic,
                    subscription: &first.subscription,
                    reasons,
                };
                match self.announce(&write, now).await {
                    Ok(n) => {
                        report.notices_enqueued = n;
                        (report, Vec::new())
                    }
                    Err(e) => {
                        // SQS redelivers the messages: the object is written again and announced
                        // then (at least once).
                        error!(error = %e, "could not announce a dead-letter write");
                        (report, messages.iter().map(|(i, _)| *i).collect())
                    }
                }
            }
            Err(e) => {
                warn!(bucket = %first.destination.bucket, error = %e, "dead-letter location unavailable");
                self.defer_or_drop(messages, now, &mut report).await
            }
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
        if write.topic == notices.topic {
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

    async fn defer_or_drop(
        &self,
        messages: Vec<(usize, DeadLetterMessage)>,
        now: DateTime<Utc>,
        report: &mut DeadLetterReport,
    ) -> (DeadLetterReport, Vec<usize>) {
        let limit = to_chrono(self.scale.apply(UNAVAILABLE_LIMIT));
        let delay = queue_delay(self.scale.apply(WRITE_RETRY_DELAY));
        let mut retry = Vec::new();
        let mut failed = Vec::new();
        for (i, mut m) in messages {
            let since = *m.first_write_failure.get_or_insert(now);
            if now - since >= limit {
                warn!(
                    topic = %m.topic,
                    subscription = %m.subscription,
                    bucket = %m.destination.bucket,
                    dropped = m.entries.len(),
                    metric = "DeadLetterEventsDropped",
                    "events dropped: dead-letter location unavailable for four hours"
                );
                report.records_dropped += m.entries.len();
                continue;
            }
            match m.to_body() {
                Ok(body) => retry.push((i, m.entries.len(), OutgoingMessage { body, delay })),
                Err(e) => {
                    error!(error = %e, "could not encode a dead-letter message");
                    failed.push(i);
                }
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
        (*report, failed)
    }
}
