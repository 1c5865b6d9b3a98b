use std::time::Duration;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};

use async_trait::async_trait;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use futures::future::join_all;

use super::describe_error;
use gridrelay_ports::memory::QueuedMessage;
use gridrelay_ports::{FailedReceipt, MessageQueue, OutgoingMessage, QueueError, ReceivedMessage};
use gridrelay_shared::queue_text::{escape_for_sqs, first_refused};

/// The record attribute that says how often SQS has handed the message out.
const RECEIVE_COUNT: &str = "ApproximateReceiveCount";

/// SQS's limit of entries in one SendMessageBatch request.
const MAX_BATCH_ENTRIES: usize = 10;
/// SQS's limit on one SendMessageBatch request's total payload.
const MAX_BATCH_BYTES: usize = 1_048_576;

/// An SQS queue, sent to with SendMessageBatch (10 entries a request).
#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl SqsQueue {
    pub fn new(client: aws_sdk_sqs::Client, url: impl Into<String>) -> Self {
        Self {
            client,
            url: url.into(),
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
            let entry = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(body)
                .delay_seconds(delay)
                .build();
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

/// Groups messages into SendMessageBatch requests: at most 10 entries and 1 MiB each.
fn chunks(messages: &[OutgoingMessage]) -> Vec<Vec<(usize, &OutgoingMessage)>> {
    let mut out: Vec<Vec<(usize, &OutgoingMessage)>> = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0;
    for (i, m) in messages.iter().enumerate() {
        let size = m.body.len();
        if !current.is_empty()
            && (current.len() == MAX_BATCH_ENTRIES || bytes + size > MAX_BATCH_BYTES)
        {
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
            .send()
            .await
            .map_err(|e| QueueError(describe_error(&e)))?;
        Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| {
                Some(ReceivedMessage {
                    id: m.message_id?,
                    body: m.body.unwrap_or_default(),
                    receipt_handle: m.receipt_handle?,
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
            receive_count: record
                .attributes
                .get(RECEIVE_COUNT)
                .and_then(|n| n.parse().ok())
                .unwrap_or(1),
        })
    })
}

/// The SQS event an event-source mapping hands a function for messages received from an
/// in-memory queue ([`gridrelay_ports::memory::MemoryQueue`]): ids, receipts, bodies and
/// receive counts, as [`failed_receipts`] reads them back. For tests and the simulation.
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

#[cfg(test)]
mod tests {
    use super::*;
    use gridrelay_shared::message::MAX_MESSAGE_BYTES;
    use std::time::Duration;

    fn msg(bytes: usize) -> OutgoingMessage {
        OutgoingMessage {
            body: "x".repeat(bytes),
            delay: Duration::ZERO,
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
