//! Lambda entry point of `ingest`: wires the AWS clients and serves API Gateway requests.

use std::sync::Arc;

use gridrelay_adapters::aws::{
    DynamoDeliveryStateStore, FirehoseStream, fan_out_queues, function_queue_key, load_sdk_config,
    subscription_store,
};
use gridrelay_adapters::config::{
    DELIVERY_QUEUE_URL_ENV, DELIVERY_STATE_TABLE_ENV, TableNames, config_cache_from_env, required,
};
use gridrelay_ingest::Ingest;
use gridrelay_ports::SystemClock;
use lambda_http::{Error, Request, service_fn};

fn main() -> Result<(), Error> {
    gridrelay_adapters::runtime::function_runtime()?.block_on(run())
}

async fn run() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let sdk = load_sdk_config().await;
    let queue_url = required(
        DELIVERY_QUEUE_URL_ENV,
        "the SQS queue events are delivered from",
    )?;
    let state_table = required(
        DELIVERY_STATE_TABLE_ENV,
        "the DynamoDB table where topics with a deduplication window mark accepted event ids (P1)",
    )?;
    let key = function_queue_key(&sdk).await?;
    let ingest = Arc::new(Ingest {
        store: subscription_store(&sdk, TableNames::from_env(), config_cache_from_env()?),
        delivery_queue: fan_out_queues(&aws_sdk_sqs::Client::new(&sdk), queue_url, &key),
        archives: FirehoseStream::archive_streams_from_env(&sdk)?,
        accepted_ids: Arc::new(DynamoDeliveryStateStore::from_sdk(&sdk, state_table)),
        clock: Arc::new(SystemClock),
    });
    // #35: what the archive's stream did not take is counted, per request.
    let recorder = gridrelay_adapters::metrics::recorder_from_env()?;
    gridrelay_ingest::describe_metrics();
    lambda_http::run(service_fn(move |request: Request| {
        let ingest = Arc::clone(&ingest);
        async move {
            let response = ingest.handle(request).await;
            gridrelay_adapters::metrics::flush(recorder);
            Ok::<_, Error>(response)
        }
    }))
    .await
}
