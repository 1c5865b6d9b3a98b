use std::time::Duration;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    MessageAttributeValue, MessageSystemAttributeName, SendMessageBatchRequestEntry,
};
use futures::future::join_all;

use super::describe_error;
use gridrelay_ports::memory::QueuedMessage;
use gridrelay_ports::{FailedReceipt, MessageQueue, OutgoingMessage, QueueError, ReceivedMessage};
use gridrelay_shared::queue_seal::{QueueKey, SEAL_ATTRIBUTE, SealCheck};
use gridrelay_shared::queue_text::{escape_for_sqs, first_refused};

/// The record attribute that says how often SQS has handed the message out.
const RECEIVE_COUNT: &str = "ApproximateReceiveCount";

/// SQS's limit of entries in one SendMessageBatch request.
const MAX_BATCH_ENTRIES: usize = 10;
/// SQS's limit on one SendMessageBatch request's total payload.
const MAX_BATCH_BYTES: usize = 1_048_576;
/// What the seal attribute adds to a message's size as SQS counts it: its name, its type and
/// its value (the base64 of 32 bytes).
const SEAL_BYTES: usize = SEAL_ATTRIBUTE.len() + "String".len() + 44;
/// The system attribute SQS stamps each message with when it is sent (epoch milliseconds).
const SENT_TIMESTAMP: &str = "SentTimestamp";

/// One of gridrelay's own SQS queues, sent to with SendMessageBatch (10 entries a request).
/// Every message it sends is sealed with the installation's key, and what it receives is
/// checked against it ([`gridrelay_shared::queue_seal`]).
#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
    url: String,
    key: QueueKey,
}

impl SqsQueue {
    pub fn new(client: aws_sdk_sqs::Client, url: impl Into<String>, key: QueueKey) -> Self {
        Self {
            client,
            url: url.into(),
            key,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    async fn send_chunk(
        &self,
        chunk: &[(usize, &OutgoingMessage)],
    ) -> Vec<(usize, Result<(), QueueError>)> {
        let mut entries = Vec::with_capacity(chunk.len());
        let mut refused = Vec::new();
        for (i, m) in chunk {
            // A JSON writer leaves U+FFFE and U+FFFF raw, which SQS refuses: written escaped
            // (the same JSON value). Anything else SQS refuses is checked here, so a test on
            // moto sees what SQS would answer (`gridrelay_shared::queue_text`).
            let body = escape_for_sqs(&m.body);
            if let Some((at, c)) = first_refused(&body) {
                refused.push((
                    *i,
                    Err(QueueError(format!(
                        "the message body holds U+{:04X} at byte {at}, which SQS refuses",
                        u32::from(c)
                    ))),
                ));
                continue;
            }
            let delay = i32::try_from(m.delay.as_secs().min(900)).unwrap_or(900);
            let seal = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(self.key.seal(&body))
                .build();
            let entry = seal.and_then(|seal| {
                let entry = SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(body)
                    .message_attributes(SEAL_ATTRIBUTE, seal);
                match &m.group {
                    // O1: a FIFO queue takes no per-message delay, and would drop a message
                    // whose deduplication id it saw in the last five minutes: each is new
                    // (a publish sent again may arrive twice, as G1 allows).
                    Some(group) => entry
                        .message_group_id(group)
                        .message_deduplication_id(uuid::Uuid::new_v4().simple().to_string()),
                    None => entry.delay_seconds(delay),
                }
                .build()
            });
            match entry {
                Ok(e) => entries.push(e),
                Err(e) => return all_failed(chunk, &e.to_string()),
            }
        }
        if entries.is_empty() {
            return refused;
        }
        let chunk: Vec<_> = chunk
            .iter()
            .filter(|(i, _)| !refused.iter().any(|(r, _)| r == i))
            .copied()
            .collect();
        let sent = self
            .client
            .send_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await;
        let mut results = match sent {
            Err(e) => all_failed(&chunk, &describe_error(&e)),
            Ok(out) => chunk
                .iter()
                .map(|(i, _)| {
                    let id = i.to_string();
                    let result = match out.failed().iter().find(|f| f.id() == id) {
                        Some(f) => Err(QueueError(format!(
                            "{}: {}",
                            f.code(),
                            f.message().unwrap_or("no message")
                        ))),
                        None if out.successful().iter().any(|s| s.id() == id) => Ok(()),
                        None => Err(QueueError("not reported as sent".to_string())),
                    };
                    (*i, result)
                })
                .collect(),
        };
        results.extend(refused);
        results
    }
}

fn all_failed(
    chunk: &[(usize, &OutgoingMessage)],
    reason: &str,
) -> Vec<(usize, Result<(), QueueError>)> {
    chunk
        .iter()
        .map(|(i, _)| (*i, Err(QueueError(reason.to_string()))))
        .collect()
}

impl SqsQueue {
    /// O1: sends messages with groups (to a FIFO queue) so each group's arrive in the order
    /// given: a group's messages go in requests one after another (a FIFO queue keeps the
    /// order of one request's entries), in one of [`ORDERED_SEND_LANES`] lanes that run at
    /// once. After a message is refused, its group's later ones are not sent (refused too,
    /// saying why): sent again, they would arrive after them.
    async fn send_in_order(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), QueueError>> {
        let mut lanes: Vec<std::collections::VecDeque<usize>> =
            vec![std::collections::VecDeque::new(); ORDERED_SEND_LANES];
        for (i, m) in messages.iter().enumerate() {
            lanes[lane_of(m.group.as_deref())].push_back(i);
        }
        let sent = join_all(lanes.into_iter().map(|lane| self.send_lane(messages, lane))).await;
        let mut results: Vec<Result<(), QueueError>> =
            vec![Err(QueueError("not sent".to_string())); messages.len()];
        for (i, r) in sent.into_iter().flatten() {
            results[i] = r;
        }
        results
    }

    /// One lane of [`SqsQueue::send_in_order`]: its messages in requests one after another.
    async fn send_lane(
        &self,
        messages: &[OutgoingMessage],
        mut lane: std::collections::VecDeque<usize>,
    ) -> Vec<(usize, Result<(), QueueError>)> {
        let mut results = Vec::new();
        let mut stopped: std::collections::HashSet<&str> = std::collections::HashSet::new();
        while !lane.is_empty() {
            let mut chunk = Vec::new();
            let mut bytes = 0;
            while let Some(&i) = lane.front() {
                let m = &messages[i];
                if m.group.as_deref().is_some_and(|g| stopped.contains(g)) {
                    lane.pop_front();
                    results.push((
                        i,
                        Err(QueueError(
                            "not sent: an earlier message of its group was refused, and order is kept (O1)"
                                .to_string(),
                        )),
                    ));
                    continue;
                }
                let size = m.body.len() + SEAL_BYTES;
                if batch_is_full(chunk.len(), bytes, size) {
                    break;
                }
                bytes += size;
                chunk.push((i, m));
                lane.pop_front();
            }
            if chunk.is_empty() {
                continue;
            }
            let sent = self.send_chunk(&chunk).await;
            for (i, r) in &sent {
                if let (Err(_), Some(group)) = (r, messages[*i].group.as_deref()) {
                    stopped.insert(group);
                }
            }
            results.extend(sent);
        }
        results
    }
}

/// O1: the queues a function's fan-out sends to: the delivery queue at `delivery_queue_url`,
/// and the ordered queue where `GRIDRELAY_ORDERED_QUEUE_URL` names one (without it, events
/// for an ordered subscription are refused, never delivered out of order).
pub fn fan_out_queues(
    sqs: &aws_sdk_sqs::Client,
    delivery_queue_url: String,
    key: &QueueKey,
) -> std::sync::Arc<dyn MessageQueue> {
    let ordered = std::env::var(crate::config::ORDERED_QUEUE_URL_ENV)
        .ok()
        .filter(|url| !url.is_empty())
        .map(|url| {
            std::sync::Arc::new(SqsQueue::new(sqs.clone(), url, key.clone()))
                as std::sync::Arc<dyn MessageQueue>
        });
    std::sync::Arc::new(gridrelay_ports::fan_out::DeliveryQueues {
        delivery: std::sync::Arc::new(SqsQueue::new(sqs.clone(), delivery_queue_url, key.clone())),
        ordered,
    })
}

/// O1: lanes of requests an ordered send makes at once.
const ORDERED_SEND_LANES: usize = 4;

/// The lane of a message group: always the same for one group.
fn lane_of(group: Option<&str>) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    group.hash(&mut hasher);
    usize::try_from(hasher.finish() % ORDERED_SEND_LANES as u64).unwrap_or(0)
}

/// Whether a SendMessageBatch request of `entries` entries and `bytes` bytes must be sent
/// before a message of `size` bytes joins it: at most 10 entries and 1 MiB each (a request of
/// none takes any message).
fn batch_is_full(entries: usize, bytes: usize, size: usize) -> bool {
    entries > 0 && (entries == MAX_BATCH_ENTRIES || bytes + size > MAX_BATCH_BYTES)
}

/// Groups messages into SendMessageBatch requests: at most 10 entries and 1 MiB each.
fn chunks(messages: &[OutgoingMessage]) -> Vec<Vec<(usize, &OutgoingMessage)>> {
    let mut out: Vec<Vec<(usize, &OutgoingMessage)>> = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0;
    for (i, m) in messages.iter().enumerate() {
        let size = m.body.len() + SEAL_BYTES;
        if batch_is_full(current.len(), bytes, size) {
            out.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += size;
        current.push((i, m));
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[async_trait]
impl MessageQueue for SqsQueue {
    async fn send_all(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), QueueError>> {
        if messages.iter().any(|m| m.group.is_some()) {
            return self.send_in_order(messages).await;
        }
        let groups = chunks(messages);
        let sent = join_all(groups.iter().map(|c| self.send_chunk(c))).await;
        let mut results: Vec<Result<(), QueueError>> =
            vec![Err(QueueError("not sent".to_string())); messages.len()];
        for (i, r) in sent.into_iter().flatten() {
            results[i] = r;
        }
        results
    }

    async fn receive_batch(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        let max = i32::try_from(max.clamp(1, 10)).unwrap_or(10);
        let visibility = visibility_seconds(visibility);
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max)
            .visibility_timeout(visibility)
            .wait_time_seconds(1)
            .message_attribute_names(SEAL_ATTRIBUTE)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .send()
            .await
            .map_err(|e| QueueError(describe_error(&e)))?;
        Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| {
                let body = m.body.unwrap_or_default();
                let seal = m
                    .message_attributes
                    .as_ref()
                    .and_then(|a| a.get(SEAL_ATTRIBUTE))
                    .and_then(|v| v.string_value());
                let sent_at = m
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
                    .and_then(|t| sent_at(t));
                let sealed = self.key.check(&body, seal, sent_at).is_taken();
                Some(ReceivedMessage {
                    id: m.message_id?,
                    body,
                    receipt_handle: m.receipt_handle?,
                    sealed,
                })
            })
            .collect())
    }

    async fn delete_received(&self, receipt_handle: &str) -> Result<(), QueueError> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(receipt_handle)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| QueueError(describe_error(&e)))
    }

    async fn retry_after(&self, receipt_handle: &str, after: Duration) -> Result<(), QueueError> {
        self.client
            .change_message_visibility()
            .queue_url(&self.url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(visibility_seconds(after))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| QueueError(describe_error(&e)))
    }
}

/// SQS's `SentTimestamp` (epoch milliseconds) as a time.
fn sent_at(millis: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp_millis(millis.parse().ok()?)
}

/// The records of an SQS event (as Lambda hands it over) that gridrelay wrote, sealed under
/// `key` or sent before it; the others are dropped, each logged by message id and counted in
/// [`UNSEALED_METRIC`] (#34 item 2). A dropped record is not a failure: it is
/// deleted with the batch, never acted on.
pub fn sealed_records(mut event: SqsEvent, key: &QueueKey, queue: &'static str) -> SqsEvent {
    event.records.retain(|r| {
        let seal = r
            .message_attributes
            .get(SEAL_ATTRIBUTE)
            .and_then(|a| a.string_value.as_deref());
        let sent = r.attributes.get(SENT_TIMESTAMP).and_then(|t| sent_at(t));
        let body = r.body.as_deref().unwrap_or_default();
        match key.check(body, seal, sent) {
            SealCheck::Sealed | SealCheck::SentBeforeKey => true,
            SealCheck::Refused(why) => {
                tracing::error!(
                    message_id = r.message_id.as_deref().unwrap_or_default(),
                    queue,
                    why = why.as_str(),
                    "dropped a message gridrelay did not write (no valid seal)"
                );
                metrics::counter!(UNSEALED_METRIC).increment(1);
                false
            }
        }
    });
    event
}

/// Messages on gridrelay's own queues dropped for want of a valid seal (#34 item 2): someone
/// other than gridrelay wrote to them. The stack alarms on any.
pub const UNSEALED_METRIC: &str = "UnsealedMessagesDropped";

/// A visibility timeout in SQS's whole seconds, at most its 12 hours.
fn visibility_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().min(43_200)).unwrap_or(43_200)
}

/// The receipts of an SQS event's records at `failed` (their indexes), and how often each was
/// received, for [`gridrelay_ports::back_off`].
pub fn failed_receipts<'a>(
    event: &'a SqsEvent,
    failed: impl IntoIterator<Item = usize> + 'a,
) -> impl Iterator<Item = FailedReceipt<'a>> + 'a {
    failed.into_iter().filter_map(|i| {
        let record = event.records.get(i)?;
        Some(FailedReceipt {
            receipt_handle: record.receipt_handle.as_deref()?,
            receive_count: receive_count(record),
        })
    })
}

/// How often SQS has handed a record's message out (`ApproximateReceiveCount`; 1 if the
/// record does not say).
pub fn receive_count(record: &SqsMessage) -> u32 {
    record
        .attributes
        .get(RECEIVE_COUNT)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// The SQS event an event-source mapping hands a function for messages received from an
/// in-memory queue ([`gridrelay_ports::memory::MemoryQueue`]): ids, receipts, bodies and
/// receive counts, as [`failed_receipts`] reads them back. For tests and the simulation,
/// which hand it to the functions' handlers directly (the seal is checked before them, by
/// [`sealed_records`]).
pub fn sqs_event(received: &[QueuedMessage]) -> SqsEvent {
    let mut event = SqsEvent::default();
    event.records = received
        .iter()
        .map(|m| {
            let mut r = SqsMessage::default();
            r.message_id = Some(m.id.clone());
            r.receipt_handle = Some(m.receipt.to_string());
            r.body = Some(m.body.clone());
            r.attributes
                .insert(RECEIVE_COUNT.into(), m.receive_count.to_string());
            r
        })
        .collect();
    event
}

/// Seals every record of an event made by [`sqs_event`] under `key`, as the records of
/// messages [`SqsQueue`] sent arrive: for whatever hands such an event to a function's entry
/// point, which checks the seal ([`sealed_records`]).
pub fn seal_records(event: &mut SqsEvent, key: &QueueKey) {
    for r in &mut event.records {
        let mut seal = aws_lambda_events::sqs::SqsMessageAttribute::default();
        seal.string_value = Some(key.seal(r.body.as_deref().unwrap_or_default()));
        seal.data_type = Some("String".to_string());
        r.message_attributes
            .insert(SEAL_ATTRIBUTE.to_string(), seal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridrelay_shared::message::MAX_MESSAGE_BYTES;
    use std::time::Duration;

    fn msg(bytes: usize) -> OutgoingMessage {
        OutgoingMessage {
            body: "x".repeat(bytes),
            delay: Duration::ZERO,
            group: None,
        }
    }

    #[test]
    fn batches_hold_ten_entries_and_1_mib_at_most() {
        let messages: Vec<_> = (0..23).map(|_| msg(10)).collect();
        let sizes: Vec<usize> = chunks(&messages).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![10, 10, 3]);
        let messages: Vec<_> = (0..7).map(|_| msg(400_000)).collect();
        let sizes: Vec<usize> = chunks(&messages).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![2, 2, 2, 1]);
        let messages: Vec<_> = (0..3).map(|_| msg(MAX_MESSAGE_BYTES)).collect();
        let sizes: Vec<usize> = chunks(&messages).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1, 1, 1], "a full message goes alone");
    }
}
