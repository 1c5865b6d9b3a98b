//! The local stand-in for an SQS event-source mapping with `ReportBatchItemFailures`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage, SqsMessageAttribute};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName};
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use gridrelay_adapters::aws::describe_error;
use gridrelay_shared::queue_seal::SEAL_ATTRIBUTE;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::{error, warn};

use crate::RunnerConfig;
use crate::batching::{EventSourceBatching, Gather, fitting};

/// A function invoked with a batch and its deadline; answers the message IDs that failed.
pub(crate) type Invoke =
    Arc<dyn Fn(SqsEvent, DateTime<Utc>) -> BoxFuture<'static, Vec<String>> + Send + Sync>;

/// Called when an invocation was stopped at its deadline.
pub(crate) type OnStopped = Arc<dyn Fn() + Send + Sync>;

/// A queue and what the event records say about it.
#[derive(Clone)]
pub(crate) struct Source {
    sqs: aws_sdk_sqs::Client,
    url: String,
    arn: String,
    region: String,
    /// Called when a receive fails while a batch is gathering (it is invoked with what it
    /// holds, and the rest waits for a batch of its own).
    on_cut_short: Arc<dyn Fn() + Send + Sync>,
}

impl Source {
    pub(crate) fn new(sqs: aws_sdk_sqs::Client, url: &str, arn: &str, region: &str) -> Self {
        Self {
            sqs,
            url: url.to_string(),
            arn: arn.to_string(),
            region: region.to_string(),
            on_cut_short: Arc::new(|| {}),
        }
    }

    /// The same source, telling `on_cut_short` of each batch a failed receive cut short.
    pub(crate) fn counting_cut_short(self, on_cut_short: Arc<dyn Fn() + Send + Sync>) -> Self {
        Self {
            on_cut_short,
            ..self
        }
    }

    fn record(&self, m: &Message) -> SqsMessage {
        let mut r = SqsMessage::default();
        r.message_id = m.message_id.clone();
        r.receipt_handle = m.receipt_handle.clone();
        r.body = m.body.clone();
        r.md5_of_body = m.md5_of_body.clone();
        r.attributes = m
            .attributes()
            .map(|a| {
                a.iter()
                    .map(|(k, v)| (k.as_str().to_string(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        // As Lambda hands them over: string attributes (the seal, #34 item 2).
        r.message_attributes = m
            .message_attributes()
            .map(|a| {
                a.iter()
                    .map(|(k, v)| {
                        let mut attribute = SqsMessageAttribute::default();
                        attribute.string_value = v.string_value().map(str::to_string);
                        attribute.data_type = Some(v.data_type().to_string());
                        (k.clone(), attribute)
                    })
                    .collect()
            })
            .unwrap_or_default();
        r.event_source = Some("aws:sqs".to_string());
        r.event_source_arn = Some(self.arn.clone());
        r.aws_region = Some(self.region.clone());
        r
    }

    /// Receives up to `max` messages (at most 10), waiting up to `wait_seconds` for the first.
    async fn receive(
        &self,
        max: usize,
        wait_seconds: u64,
        visibility: i32,
    ) -> Result<Vec<Message>, String> {
        self.sqs
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(i32::try_from(max).unwrap_or(10))
            .wait_time_seconds(i32::try_from(wait_seconds).unwrap_or(20))
            .visibility_timeout(visibility)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names(SEAL_ATTRIBUTE)
            .send()
            .await
            .map(|out| out.messages.unwrap_or_default())
            .map_err(|e| describe_error(&e))
    }

    /// Each message's share of an invocation's payload: its record as the event carries it.
    fn payload_size(&self, m: &Message) -> usize {
        serde_json::to_vec(&self.record(m)).map_or(0, |v| v.len())
    }

    /// Fills a batch begun with `held` as the event source's `batching` says (#38): more
    /// receives until the batch size, the window or the payload limit is reached. A receive
    /// that fails, or a stop, ends the gathering: what is held is invoked. Answers the
    /// messages and each one's payload size.
    async fn gather(
        &self,
        batching: EventSourceBatching,
        mut held: Vec<Message>,
        visibility: i32,
        stopped: &mut watch::Receiver<bool>,
    ) -> (Vec<Message>, Vec<usize>) {
        let first = Instant::now();
        let mut sizes: Vec<usize> = held.iter().map(|m| self.payload_size(m)).collect();
        loop {
            let payload = sizes.iter().sum();
            let (max, wait_seconds) = match batching.next(held.len(), payload, first.elapsed()) {
                Gather::Invoke => return (held, sizes),
                Gather::Receive { max, wait_seconds } => (max, wait_seconds),
                Gather::SleepThenReceive { sleep, max } => {
                    tokio::select! {
                        () = tokio::time::sleep(sleep) => {}
                        _ = stopped.wait_for(|s| *s) => return (held, sizes),
                    }
                    (max, 0)
                }
            };
            let received = tokio::select! {
                r = self.receive(max, wait_seconds, visibility) => r,
                _ = stopped.wait_for(|s| *s) => return (held, sizes),
            };
            match received {
                Ok(more) => {
                    sizes.extend(more.iter().map(|m| self.payload_size(m)));
                    held.extend(more);
                }
                Err(error) => {
                    warn!(queue = %self.url, %error, held = held.len(), "receive failed while gathering a batch; invoking with what is held");
                    (self.on_cut_short)();
                    return (held, sizes);
                }
            }
        }
    }

    /// Deletes the messages that did not fail, at most [`DELETE_BATCH_MAX`] in each
    /// `DeleteMessageBatch` (a window's batch holds up to 10,000).
    async fn delete(&self, messages: &[Message], failed: &[String]) {
        let entries: Vec<DeleteMessageBatchRequestEntry> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| {
                !m.message_id()
                    .is_some_and(|id| failed.iter().any(|f| f == id))
            })
            .filter_map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle()?)
                    .build()
                    .ok()
            })
            .collect();
        let deletes = entries
            .chunks(DELETE_BATCH_MAX)
            .map(|chunk| self.delete_batch(chunk.to_vec()));
        futures::future::join_all(deletes).await;
    }

    async fn delete_batch(&self, entries: Vec<DeleteMessageBatchRequestEntry>) {
        let result = self
            .sqs
            .delete_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await;
        match result {
            Ok(out) if !out.failed().is_empty() => {
                warn!(queue = %self.url, failed = out.failed().len(), "some messages were not deleted and will be redelivered");
            }
            Ok(_) => {}
            Err(e) => {
                warn!(queue = %self.url, error = %describe_error(&e), "delete failed; messages will be redelivered")
            }
        }
    }
}

/// The most entries one `DeleteMessageBatch` takes: SQS refuses more
/// (`TooManyEntriesInBatchRequest`).
const DELETE_BATCH_MAX: usize = 10;

/// Receives and invokes until told to stop, with at most `concurrency` invocations at once.
pub(crate) async fn poll(
    source: Source,
    config: RunnerConfig,
    mut stopped: watch::Receiver<bool>,
    on_stopped: OnStopped,
    invoke: Invoke,
) {
    let permits = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let mut running = JoinSet::new();
    let visibility = i32::try_from(config.visibility_timeout.as_secs().max(1)).unwrap_or(43_200);
    let batching = config.batching;
    // Messages received for a batch that reached the payload limit: the next batch's first.
    let mut carried: Vec<Message> = Vec::new();
    loop {
        if *stopped.borrow() {
            break;
        }
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        while running.try_join_next().is_some() {}
        let mut messages = std::mem::take(&mut carried);
        if messages.is_empty() {
            let receive = source.receive(batching.first_receive(), 1, visibility);
            let received = tokio::select! {
                r = receive => r,
                _ = stopped.wait_for(|s| *s) => break,
            };
            messages = match received {
                Ok(messages) => messages,
                Err(error) => {
                    error!(queue = %source.url, %error, "receive failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if messages.is_empty() {
                continue;
            }
        }
        let (mut messages, sizes) = source
            .gather(batching, messages, visibility, &mut stopped)
            .await;
        carried = messages.split_off(fitting(&sizes));
        let event = {
            let mut e = SqsEvent::default();
            e.records = messages.iter().map(|m| source.record(m)).collect();
            e
        };
        let source = source.clone();
        let invoke = Arc::clone(&invoke);
        let timeout = config.function_timeout;
        let on_stopped = Arc::clone(&on_stopped);
        running.spawn(async move {
            let deadline = Utc::now() + chrono::Duration::from_std(timeout).unwrap_or_default();
            // As Lambda does: an invocation still running at its deadline is stopped, and none
            // of its messages is deleted (they come back after the visibility timeout).
            match tokio::time::timeout(timeout, invoke(event, deadline)).await {
                Ok(failed) => source.delete(&messages, &failed).await,
                Err(_) => {
                    on_stopped();
                    error!(queue = %source.url, messages = messages.len(), timeout = ?timeout, "invocation timed out and was stopped; its messages come back after the visibility timeout");
                }
            }
            drop(permit);
        });
    }
    while running.join_next().await.is_some() {}
}
