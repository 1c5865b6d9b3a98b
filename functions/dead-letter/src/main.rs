//! Lambda entry point of `dead-letter`: wires S3, SQS and the journal's Firehose stream, answers each SQS batch with its
//! batch-item failures, and writes what it dropped as CloudWatch embedded metric format
//! (`gridrelay_adapters::metrics`).

use std::sync::Arc;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use gridrelay_adapters::aws::{
    FirehoseStream, S3ObjectStore, SqsQueue, fan_out_queues, function_queue_key, load_sdk_config,
    s3_client, sealed_records, subscription_store,
};
use gridrelay_adapters::config::{
    DEAD_LETTER_EVENTS_TOPIC_ENV, DEAD_LETTER_QUEUE_URL_ENV, DELIVERY_QUEUE_URL_ENV, TableNames,
    config_cache_from_env, required,
};
use gridrelay_dead_letter::{DeadLetterNotices, DeadLetterWriter};
use gridrelay_ports::SystemClock;
use gridrelay_shared::dead_letter::DEAD_LETTER_EVENTS_TOPIC;
use gridrelay_shared::time_scale::TimeScale;
use lambda_runtime::{Error, LambdaEvent, service_fn};

fn main() -> Result<(), Error> {
    gridrelay_adapters::runtime::function_runtime()?.block_on(run())
}

async fn run() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let scale = TimeScale::from_env()?;
    let sdk = load_sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let key = function_queue_key(&sdk).await?;
    let writer = Arc::new(DeadLetterWriter {
        objects: Arc::new(S3ObjectStore::new(s3_client(&sdk))),
        dead_letter_queue: Arc::new(SqsQueue::new(
            sqs.clone(),
            required(
                DEAD_LETTER_QUEUE_URL_ENV,
                "the SQS queue of events to dead-letter",
            )?,
            key.clone(),
        )),
        clock: Arc::new(SystemClock),
        scale,
        notices: Some(DeadLetterNotices {
            store: subscription_store(&sdk, TableNames::from_env(), config_cache_from_env()?),
            delivery_queue: fan_out_queues(
                &sqs,
                required(
                    DELIVERY_QUEUE_URL_ENV,
                    "the SQS queue dead-letter announcements are delivered from",
                )?,
                &key,
            ),
            topic: std::env::var(DEAD_LETTER_EVENTS_TOPIC_ENV)
                .unwrap_or_else(|_| DEAD_LETTER_EVENTS_TOPIC.to_string()),
        }),
        journal: FirehoseStream::from_env(&sdk),
    });
    let recorder = gridrelay_adapters::metrics::recorder_from_env()?;
    ::metrics::describe_counter!(
        gridrelay_dead_letter::DROPPED_METRIC,
        ::metrics::Unit::Count,
        "events dropped after their dead-letter location was unavailable for four hours (L5)"
    );
    gridrelay_adapters::journal::describe_unwritten();
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let writer = Arc::clone(&writer);
        // #34 item 2: only messages gridrelay wrote are written out; the others are dropped.
        let deadline = chrono::DateTime::<chrono::Utc>::from(event.context.deadline());
        let event = sealed_records(event.payload, &key, "dead-letter");
        async move {
            let outcome = writer.handle_until(event, deadline).await;
            gridrelay_adapters::metrics::flush(recorder);
            Ok::<SqsBatchResponse, Error>(outcome.into_batch_response())
        }
    }))
    .await
}
