//! Lambda entry point of `dead-letter`: wires S3 and SQS and answers each SQS batch with its
//! batch-item failures.

use std::sync::Arc;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use gridrelay_dead_letter::DeadLetterWriter;
use gridrelay_shared::aws::{S3ObjectStore, SqsQueue, load_sdk_config, s3_client};
use gridrelay_shared::config::{DEAD_LETTER_QUEUE_URL_ENV, required};
use gridrelay_shared::ports::SystemClock;
use gridrelay_shared::time_scale::TimeScale;
use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let scale = TimeScale::from_env()?;
    let sdk = load_sdk_config().await;
    let writer = Arc::new(DeadLetterWriter {
        objects: Arc::new(S3ObjectStore::new(s3_client(&sdk))),
        dead_letter_queue: Arc::new(SqsQueue::new(
            aws_sdk_sqs::Client::new(&sdk),
            required(
                DEAD_LETTER_QUEUE_URL_ENV,
                "the SQS queue of events to dead-letter",
            )?,
        )),
        clock: Arc::new(SystemClock),
        scale,
    });
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let writer = Arc::clone(&writer);
        async move {
            Ok::<SqsBatchResponse, Error>(writer.handle(event.payload).await.into_batch_response())
        }
    }))
    .await
}
