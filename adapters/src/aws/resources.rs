//! AWS resources as destinations ([`gridrelay_ports::ResourceSender`]): each call is one
//! call of the service's batch API (SQS `SendMessageBatch`, SNS `PublishBatch`, EventBridge
//! `PutEvents`, Kinesis `PutRecords`; a Lambda function's asynchronous `Invoke` with the batch
//! as its payload), and each entry's outcome is what the service said of it, mapped to the
//! status it means (S4, [`ServiceFailure::of_code`]).
//!
//! What goes in a message besides its body (attributes, `Source`, `DetailType`, partition
//! key) is decided in `gridrelay_shared::destination`; this module only builds the SDK calls.
//! Clients are made per region, for destinations outside the function's own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use aws_config::SdkConfig;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};

use super::describe_error;
use aws_sdk_sqs::error::BuildError;
use gridrelay_ports::{DestinationError, ResourceEntry, ResourceRequest, ResourceSender};
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::destination::{
    EndpointType, MessageContext, ResourceDestination, ServiceFailure, eventbridge_detail_type,
    eventbridge_source, fifo_deduplication_id, fifo_group_id, kinesis_partition_key,
    message_attributes,
};
use gridrelay_shared::queue_text::escape_for_sqs;

/// The clients of one region.
struct Clients {
    sqs: aws_sdk_sqs::Client,
    sns: aws_sdk_sns::Client,
    events: aws_sdk_eventbridge::Client,
    kinesis: aws_sdk_kinesis::Client,
    lambda: aws_sdk_lambda::Client,
}

impl Clients {
    fn new(sdk: &SdkConfig) -> Self {
        Self {
            sqs: aws_sdk_sqs::Client::new(sdk),
            sns: aws_sdk_sns::Client::new(sdk),
            events: aws_sdk_eventbridge::Client::new(sdk),
            kinesis: aws_sdk_kinesis::Client::new(sdk),
            lambda: aws_sdk_lambda::Client::new(sdk),
        }
    }
}

/// Writes to SQS queues, SNS topics, EventBridge buses, Kinesis streams and Lambda functions.
pub struct AwsResourceSender {
    sdk: SdkConfig,
    /// The longest one call may take, the SDK's own retries included (S2).
    timeout: std::time::Duration,
    clients: Mutex<HashMap<String, Arc<Clients>>>,
    /// SQS queue URLs by ARN (`GetQueueUrl` once per queue; forgotten when one is not found).
    queue_urls: Mutex<HashMap<String, String>>,
}

impl AwsResourceSender {
    /// A sender whose calls take at most S2's 30 seconds each.
    pub fn from_sdk(sdk: &SdkConfig) -> Self {
        Self::with_timeout(sdk, gridrelay_shared::delivery::ATTEMPT_TIMEOUT)
    }

    /// A sender whose calls take at most `timeout` each.
    pub fn with_timeout(sdk: &SdkConfig, timeout: std::time::Duration) -> Self {
        Self {
            sdk: sdk.clone(),
            timeout,
            clients: Mutex::new(HashMap::new()),
            queue_urls: Mutex::new(HashMap::new()),
        }
    }

    fn clients(&self, region: &str) -> Arc<Clients> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(clients.entry(region.to_string()).or_insert_with(|| {
            let sdk = self
                .sdk
                .to_builder()
                .region(aws_config::Region::new(region.to_string()))
                .timeout_config(
                    aws_config::timeout::TimeoutConfig::builder()
                        .operation_timeout(self.timeout)
                        .build(),
                )
                .build();
            Arc::new(Clients::new(&sdk))
        }))
    }

    async fn queue_url(
        &self,
        clients: &Clients,
        destination: &ResourceDestination,
    ) -> Result<String, AttemptResult> {
        if let Some(url) = self
            .queue_urls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&destination.arn)
        {
            return Ok(url.clone());
        }
        let out = clients
            .sqs
            .get_queue_url()
            .queue_name(&destination.name)
            .queue_owner_aws_account_id(&destination.account)
            .send()
            .await
            .map_err(|e| failure(&e))?;
        // A reply without a URL is not one to keep: the queue is taken as not found.
        let Some(url) = out
            .queue_url()
            .filter(|u| !u.is_empty())
            .map(str::to_string)
        else {
            return Err(AttemptResult::Service(ServiceFailure::of_code(
                "QueueDoesNotExist",
                None,
            )));
        };
        self.queue_urls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(destination.arn.clone(), url.clone());
        Ok(url)
    }

    async fn put_sqs(&self, clients: &Clients, request: &ResourceRequest) -> Vec<AttemptResult> {
        let every = |r: AttemptResult| vec![r; request.entries.len()];
        let url = match self.queue_url(clients, &request.destination).await {
            Ok(url) => url,
            Err(e) => return every(e),
        };
        let entries = match messages(
            request,
            |id, entry, attributes, fifo| {
                let mut b = aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                    .id(id)
                    // U+FFFE and U+FFFF, which SQS refuses, written escaped.
                    .message_body(escape_for_sqs(&entry.body))
                    .set_message_group_id(fifo.as_ref().map(|f| f.0.clone()))
                    .set_message_deduplication_id(fifo.map(|f| f.1));
                for (name, value) in attributes {
                    b = b.message_attributes(name, value);
                }
                b.build()
            },
            |value| {
                aws_sdk_sqs::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(value)
                    .build()
            },
        ) {
            Ok(entries) => entries,
            Err(e) => return every(e),
        };
        let sent = clients
            .sqs
            .send_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries))
            .send()
            .await;
        match sent {
            Err(e) => {
                let result = failure(&e);
                self.forget_missing_queue(&request.destination, &result);
                every(result)
            }
            Ok(out) => batch_answer(
                request.entries.len(),
                out.failed()
                    .iter()
                    .map(|f| (f.id(), f.code(), f.sender_fault())),
                out.successful().iter().map(|s| s.id()),
            ),
        }
    }

    fn forget_missing_queue(&self, destination: &ResourceDestination, result: &AttemptResult) {
        if matches!(result, AttemptResult::Service(f) if f.status == 404) {
            self.queue_urls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&destination.arn);
        }
    }

    async fn put_sns(&self, clients: &Clients, request: &ResourceRequest) -> Vec<AttemptResult> {
        let every = |r: AttemptResult| vec![r; request.entries.len()];
        let entries = match messages(
            request,
            |id, entry, attributes, fifo| {
                let mut b = aws_sdk_sns::types::PublishBatchRequestEntry::builder()
                    .id(id)
                    // As for SQS, which SNS often fans out to.
                    .message(escape_for_sqs(&entry.body))
                    .set_message_group_id(fifo.as_ref().map(|f| f.0.clone()))
                    .set_message_deduplication_id(fifo.map(|f| f.1));
                for (name, value) in attributes {
                    b = b.message_attributes(name, value);
                }
                b.build()
            },
            |value| {
                aws_sdk_sns::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(value)
                    .build()
            },
        ) {
            Ok(entries) => entries,
            Err(e) => return every(e),
        };
        let sent = clients
            .sns
            .publish_batch()
            .topic_arn(&request.destination.arn)
            .set_publish_batch_request_entries(Some(entries))
            .send()
            .await;
        match sent {
            Err(e) => every(failure(&e)),
            Ok(out) => batch_answer(
                request.entries.len(),
                out.failed()
                    .iter()
                    .map(|f| (f.id(), f.code(), f.sender_fault())),
                out.successful().iter().filter_map(|s| s.id()),
            ),
        }
    }

    async fn put_eventbridge(
        &self,
        clients: &Clients,
        request: &ResourceRequest,
    ) -> Vec<AttemptResult> {
        let context = context(request);
        let entries = request
            .entries
            .iter()
            .map(|entry| {
                aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                    .event_bus_name(&request.destination.arn)
                    .source(eventbridge_source(&entry.fields, &context))
                    .detail_type(eventbridge_detail_type(&entry.fields))
                    .detail(&entry.body)
                    .build()
            })
            .collect();
        let sent = clients
            .events
            .put_events()
            .set_entries(Some(entries))
            .send()
            .await;
        match sent {
            Err(e) => vec![failure(&e); request.entries.len()],
            Ok(out) => in_order(request.entries.len(), out.entries(), |r| {
                r.error_code()
                    .map(|code| ServiceFailure::of_code(code, None))
            }),
        }
    }

    async fn put_kinesis(
        &self,
        clients: &Clients,
        request: &ResourceRequest,
    ) -> Vec<AttemptResult> {
        let context = context(request);
        let mut records = Vec::with_capacity(request.entries.len());
        for entry in &request.entries {
            let record = aws_sdk_kinesis::types::PutRecordsRequestEntry::builder()
                .data(aws_sdk_kinesis::primitives::Blob::new(
                    entry.body.as_bytes(),
                ))
                .partition_key(kinesis_partition_key(&entry.fields, &context))
                .build();
            match record {
                Ok(r) => records.push(r),
                Err(e) => {
                    return vec![AttemptResult::NotSent(e.to_string()); request.entries.len()];
                }
            }
        }
        let sent = clients
            .kinesis
            .put_records()
            .stream_arn(&request.destination.arn)
            .set_records(Some(records))
            .send()
            .await;
        match sent {
            Err(e) => vec![failure(&e); request.entries.len()],
            Ok(out) => in_order(request.entries.len(), out.records(), |r| {
                r.error_code()
                    .map(|code| ServiceFailure::of_code(code, None))
            }),
        }
    }

    async fn put_lambda(&self, clients: &Clients, request: &ResourceRequest) -> Vec<AttemptResult> {
        let mut results = Vec::with_capacity(request.entries.len());
        for entry in &request.entries {
            // By ARN (with its version or alias, if it has one): a name alone would be looked
            // up in the caller's account.
            let invoke = clients
                .lambda
                .invoke()
                .function_name(&request.destination.arn)
                .invocation_type(aws_sdk_lambda::types::InvocationType::Event)
                .payload(aws_sdk_lambda::primitives::Blob::new(entry.body.as_bytes()));
            // Asynchronous: Lambda took the payload (202); what the function does with it is
            // the function's.
            results.push(match invoke.send().await {
                Ok(out) => AttemptResult::Status(u16::try_from(out.status_code()).unwrap_or(500)),
                Err(e) => failure(&e),
            });
        }
        results
    }
}

#[async_trait]
impl ResourceSender for AwsResourceSender {
    async fn put(&self, request: ResourceRequest) -> Vec<AttemptResult> {
        let clients = self.clients(&request.destination.region);
        match request.destination.endpoint_type {
            EndpointType::Sqs => self.put_sqs(&clients, &request).await,
            EndpointType::Sns => self.put_sns(&clients, &request).await,
            EndpointType::EventBridge => self.put_eventbridge(&clients, &request).await,
            EndpointType::Kinesis => self.put_kinesis(&clients, &request).await,
            EndpointType::Lambda => self.put_lambda(&clients, &request).await,
            EndpointType::WebHook => {
                vec![
                    AttemptResult::NotSent("a webhook is not an AWS resource".to_string());
                    request.entries.len()
                ]
            }
        }
    }

    async fn check(&self, destination: &ResourceDestination) -> Result<(), DestinationError> {
        let clients = self.clients(&destination.region);
        let d = destination;
        let checked = match d.endpoint_type {
            EndpointType::Sqs => self.queue_url(&clients, d).await.map(drop),
            EndpointType::Sns => clients
                .sns
                .get_topic_attributes()
                .topic_arn(&d.arn)
                .send()
                .await
                .map(drop)
                .map_err(|e| failure(&e)),
            EndpointType::EventBridge => clients
                .events
                .describe_event_bus()
                .name(&d.arn)
                .send()
                .await
                .map(drop)
                .map_err(|e| failure(&e)),
            EndpointType::Kinesis => clients
                .kinesis
                .describe_stream_summary()
                .stream_arn(&d.arn)
                .send()
                .await
                .map(drop)
                .map_err(|e| failure(&e)),
            EndpointType::Lambda => clients
                .lambda
                .get_function()
                .function_name(&d.arn)
                .send()
                .await
                .map(drop)
                .map_err(|e| failure(&e)),
            EndpointType::WebHook => return Ok(()),
        };
        match checked {
            Ok(()) => Ok(()),
            Err(AttemptResult::Service(f)) if f.status == 404 => {
                Err(DestinationError::NotFound(f.code))
            }
            Err(AttemptResult::Service(f)) => Err(DestinationError::Unavailable(f.code)),
            Err(other) => Err(DestinationError::Unavailable(format!("{other:?}"))),
        }
    }
}

/// SQS's or SNS's batch entries for a request: each entry built by `entry` from its batch id
/// (its index), the entry, its message attributes as built by `value`, and for a FIFO queue or
/// topic its message group and deduplication ids; an entry that cannot be built fails the call
/// unsent.
fn messages<E, V>(
    request: &ResourceRequest,
    entry: impl Fn(
        String,
        &ResourceEntry,
        Vec<(&'static str, V)>,
        Option<(String, String)>,
    ) -> Result<E, BuildError>,
    value: impl Fn(String) -> Result<V, BuildError>,
) -> Result<Vec<E>, AttemptResult> {
    let context = context(request);
    let fifo = request.destination.is_fifo();
    let unsent = |e: BuildError| AttemptResult::NotSent(e.to_string());
    request
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let attributes = message_attributes(&e.fields, &context)
                .into_iter()
                .map(|(name, v)| value(v).map(|v| (name, v)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(unsent)?;
            let ids = fifo.then(|| {
                (
                    fifo_group_id(&e.fields, &context),
                    fifo_deduplication_id(&e.fields, &context, &e.body),
                )
            });
            entry(i.to_string(), e, attributes, ids).map_err(unsent)
        })
        .collect()
}

/// What a request's messages say besides their bodies.
fn context(request: &ResourceRequest) -> MessageContext<'_> {
    MessageContext {
        topic: &request.topic,
        subscription: &request.subscription,
        delivery_count: request.delivery_count,
    }
}

/// A batch entry the service refused: its code, as a sender's fault (400) or the service's
/// (500) when the code itself does not say.
fn batch_entry_failure(code: &str, sender_fault: bool) -> AttemptResult {
    AttemptResult::Service(ServiceFailure::of_code(
        code,
        Some(if sender_fault { 400 } else { 500 }),
    ))
}

/// Each entry's result from an SQS or SNS batch answer, which names entries by their batch id
/// (their index): one it refused by its code (`failed`: id, code, sender's fault), one it took
/// delivered, one it does not mention failed.
fn batch_answer<'a>(
    count: usize,
    failed: impl Iterator<Item = (&'a str, &'a str, bool)>,
    taken: impl Iterator<Item = &'a str>,
) -> Vec<AttemptResult> {
    let failed: HashMap<&str, (&str, bool)> = failed.map(|(id, c, s)| (id, (c, s))).collect();
    let taken: std::collections::HashSet<&str> = taken.collect();
    per_entry(count, |id| match failed.get(id) {
        Some(&(code, sender_fault)) => Some(batch_entry_failure(code, sender_fault)),
        None => taken.contains(id).then_some(AttemptResult::Status(200)),
    })
}

/// Each entry's result by its batch id (its index); one the answer does not mention failed.
fn per_entry(count: usize, result: impl Fn(&str) -> Option<AttemptResult>) -> Vec<AttemptResult> {
    (0..count)
        .map(|i| {
            result(&i.to_string()).unwrap_or_else(|| {
                AttemptResult::NotSent("the service did not report the entry".to_string())
            })
        })
        .collect()
}

/// Each entry's result from answers given in the entries' order (EventBridge, Kinesis): an
/// error code is a failure; an answer missing is too.
fn in_order<T>(
    count: usize,
    answers: &[T],
    error: impl Fn(&T) -> Option<ServiceFailure>,
) -> Vec<AttemptResult> {
    (0..count)
        .map(|i| match answers.get(i) {
            Some(a) => error(a).map_or(AttemptResult::Status(200), AttemptResult::Service),
            None => AttemptResult::NotSent("the service did not report the entry".to_string()),
        })
        .collect()
}

/// A call that failed as a whole: the service's error as the status it means (S4), a timeout,
/// or a connection that failed.
fn failure<E>(e: &SdkError<E, aws_sdk_sqs::config::http::HttpResponse>) -> AttemptResult
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match e {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let code = service.err().code().unwrap_or("UnknownError");
            AttemptResult::Service(ServiceFailure::of_code(code, Some(status)))
        }
        SdkError::TimeoutError(_) => AttemptResult::TimedOut,
        SdkError::DispatchFailure(d) if d.is_timeout() => AttemptResult::TimedOut,
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            AttemptResult::ConnectionFailed(describe_error(e))
        }
        _ => AttemptResult::NotSent(describe_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries the answer does not mention are failures, never deliveries (B5).
    #[test]
    fn unreported_entries_are_not_delivered_b5() {
        let r = per_entry(3, |id| (id == "1").then_some(AttemptResult::Status(200)));
        assert_eq!(r[1], AttemptResult::Status(200));
        assert!(matches!(r[0], AttemptResult::NotSent(_)));
        let answers = [None, Some("ThrottlingException")];
        let r = in_order(3, &answers, |a| a.map(|c| ServiceFailure::of_code(c, None)));
        assert_eq!(r[0], AttemptResult::Status(200));
        assert!(matches!(&r[1], AttemptResult::Service(f) if f.status == 503));
        assert!(matches!(r[2], AttemptResult::NotSent(_)));
        assert!(
            matches!(batch_entry_failure("InvalidParameterValue", true), AttemptResult::Service(f) if f.status == 400)
        );
        assert!(
            matches!(batch_entry_failure("InternalError", false), AttemptResult::Service(f) if f.status == 500)
        );
        // An SQS/SNS answer: refused by its code, taken delivered, unmentioned failed.
        let r = batch_answer(
            3,
            [("2", "InvalidParameterValue", true)].into_iter(),
            ["0"].into_iter(),
        );
        assert_eq!(r[0], AttemptResult::Status(200));
        assert!(matches!(r[1], AttemptResult::NotSent(_)));
        assert!(matches!(&r[2], AttemptResult::Service(f) if f.status == 400));
    }
}
