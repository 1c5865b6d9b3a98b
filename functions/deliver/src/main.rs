//! Lambda entry point of `deliver`: wires the AWS clients and the HTTP sender, answers each
//! SQS batch with its batch-item failures (`ReportBatchItemFailures`), and writes each
//! invocation's per-subscription metrics in CloudWatch embedded metric format
//! ([`gridrelay_deliver::metrics`]).

use std::sync::Arc;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use gridrelay_adapters::aws::{
    AwsResourceSender, DynamoDeliveryStateStore, DynamoReplayStore, FirehoseStream, SqsQueue,
    delivery_state_store, function_queue_key, load_sdk_config, sealed_records, secret_store,
    subscription_store,
};
use gridrelay_adapters::config::{
    CONTROL_QUEUE_URL_ENV, DEAD_LETTER_QUEUE_URL_ENV, DELIVERY_QUEUE_URL_ENV,
    DELIVERY_STATE_TABLE_ENV, ORDERED_QUEUE_URL_ENV, ORDERED_REDRIVE_QUEUE_URL_ENV, PUBLIC_URL_ENV,
    REPLAY_QUEUE_URL_ENV, TableNames, WEBHOOK_ORIGIN_ENV, allowed_networks_from_env,
    config_cache_from_env, delivery_destinations_from_env, required,
};
use gridrelay_deliver::{ConcurrencySettings, Deliver, DeliverPorts, DeliverySettings, metrics};
use gridrelay_ports::{MessageQueue, RandomJitter, SystemClock};
use gridrelay_shared::outbound::OutboundPolicy;
use gridrelay_shared::time_scale::TimeScale;
use gridrelay_shared::validation::DEFAULT_WEBHOOK_ORIGIN;
use lambda_runtime::{Error, LambdaEvent, service_fn};

fn main() -> Result<(), Error> {
    gridrelay_adapters::runtime::function_runtime()?.block_on(run())
}

async fn run() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let scale = TimeScale::from_env()?;
    let sdk = load_sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let keep = config_cache_from_env()?;
    let delivery_queue_url = required(
        DELIVERY_QUEUE_URL_ENV,
        "the SQS queue events are delivered from",
    )?;
    let dead_letter_queue_url = required(
        DEAD_LETTER_QUEUE_URL_ENV,
        "the SQS queue of events to dead-letter",
    )?;
    // A stack made before the control or replay queue has none: the delivery queue serves.
    let or_delivery_queue = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| delivery_queue_url.clone())
    };
    let control_queue_url = or_delivery_queue(CONTROL_QUEUE_URL_ENV);
    let replay_queue_url = or_delivery_queue(REPLAY_QUEUE_URL_ENV);
    // O1: a stack without an ordered queue sends nothing to it.
    let ordered_queue_url = or_delivery_queue(ORDERED_QUEUE_URL_ENV);
    let ordered_redrive_queue_url = std::env::var(ORDERED_REDRIVE_QUEUE_URL_ENV)
        .ok()
        .filter(|v| !v.is_empty());
    let settings = DeliverySettings {
        public_url: std::env::var(PUBLIC_URL_ENV).ok().filter(|v| !v.is_empty()),
        webhook_origin: std::env::var(WEBHOOK_ORIGIN_ENV)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| DEFAULT_WEBHOOK_ORIGIN.to_string()),
        concurrency: ConcurrencySettings::from_env()?,
        outbound: OutboundPolicy::new(allowed_networks_from_env()?),
        destinations: delivery_destinations_from_env(&[
            &delivery_queue_url,
            &control_queue_url,
            &replay_queue_url,
            &dead_letter_queue_url,
            &ordered_queue_url,
            ordered_redrive_queue_url.as_deref().unwrap_or_default(),
        ])?,
        control_queue_name: queue_name(&control_queue_url),
        replay_queue_name: queue_name(&replay_queue_url),
        ..DeliverySettings::new(scale)
    };
    let state_table = required(
        DELIVERY_STATE_TABLE_ENV,
        "the DynamoDB table of endpoint health (D1), late successes (R4) and delivery caps",
    )?;
    let key = function_queue_key(&sdk).await?;
    let (replays, archive) = DynamoReplayStore::with_archive_from_env(&sdk);
    let ports = DeliverPorts {
        store: subscription_store(&sdk, TableNames::from_env(), keep),
        delivery_queue: Arc::new(SqsQueue::new(sqs.clone(), delivery_queue_url, key.clone())),
        control_queue: Arc::new(SqsQueue::new(sqs.clone(), control_queue_url, key.clone())),
        replay_queue: Arc::new(SqsQueue::new(sqs.clone(), replay_queue_url, key.clone())),
        dead_letter_queue: Arc::new(SqsQueue::new(
            sqs.clone(),
            dead_letter_queue_url,
            key.clone(),
        )),
        ordered_queue: Arc::new(SqsQueue::new(sqs.clone(), ordered_queue_url, key.clone())),
        ordered_redrive_queue: ordered_redrive_queue_url
            .map(|url| Arc::new(SqsQueue::new(sqs, url, key.clone())) as Arc<dyn MessageQueue>),
        resources: Arc::new(AwsResourceSender::from_sdk(&sdk)),
        clock: Arc::new(SystemClock),
        jitter: Arc::new(RandomJitter),
        secrets: secret_store(&sdk, keep),
        state: delivery_state_store(&sdk, &state_table, keep),
        // Not cached: the caps' allowances are shared with every other instance as they are.
        caps: Arc::new(DynamoDeliveryStateStore::from_sdk(&sdk, &state_table)),
        journal: FirehoseStream::from_env(&sdk),
        replays,
        archive,
    };
    let sender = Arc::new(settings.http_sender()?);
    let deliver = Arc::new(Deliver::new(ports, sender, settings));
    let recorder = gridrelay_adapters::metrics::recorder_from_env()?;
    metrics::describe();
    gridrelay_adapters::journal::describe_unwritten();
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let deliver = Arc::clone(&deliver);
        // #34 item 2: only messages gridrelay wrote are acted on; the others are dropped.
        let event = LambdaEvent {
            payload: sealed_records(event.payload, &key, "delivery"),
            context: event.context,
        };
        // The invocation plans against the time Lambda gives it.
        let deadline = chrono::DateTime::<chrono::Utc>::from(event.context.deadline());
        async move {
            let outcome = deliver.handle_until(event.payload, deadline).await;
            metrics::record(&outcome.by_subscription);
            gridrelay_adapters::metrics::flush(recorder);
            Ok::<SqsBatchResponse, Error>(outcome.into_batch_response())
        }
    }))
    .await
}

/// A queue's name: the last part of its URL.
fn queue_name(url: &str) -> Option<String> {
    url.rsplit('/')
        .next()
        .filter(|name| !name.is_empty())
        .map(str::to_string)
}
