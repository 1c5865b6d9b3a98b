//! Lambda entry point of the subscribers' portal (#36): the stack's front door sends
//! `/portal/...` here, and the same [`router`](gridrelay_portal::router) `gridrelay local`
//! serves answers it. Its cookies are `Secure`: the front door is HTTPS.

use std::sync::Arc;

use gridrelay_adapters::aws::{
    DynamoDeliveryStateStore, S3ArchiveSource, S3JournalSource, S3ObjectStore,
    SecretsManagerPortalKey, SecretsManagerStore, SqsQueue, function_queue_key, load_sdk_config,
    s3_client, subscription_store,
};
use gridrelay_adapters::config::{
    DEFAULT_SECRET_PREFIX, DELIVERY_QUEUE_URL_ENV, DELIVERY_STATE_TABLE_ENV, JOURNAL_BUCKET_ENV,
    PORTAL_KEY_SECRET_ENV, SECRET_PREFIX_ENV, TableNames, config_cache_from_env, required,
};
use gridrelay_portal::Portal;
use gridrelay_ports::SystemClock;
use gridrelay_shared::journal::JOURNAL_PREFIX;
use lambda_http::Error;

fn main() -> Result<(), Error> {
    gridrelay_adapters::runtime::function_runtime()?.block_on(run())
}

async fn run() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let sdk = load_sdk_config().await;
    let keep = config_cache_from_env()?;
    let state_table = required(
        DELIVERY_STATE_TABLE_ENV,
        "the DynamoDB table of endpoint health the page shows",
    )?;
    let journal_bucket = required(
        JOURNAL_BUCKET_ENV,
        "the S3 bucket of the delivery journal the page lists attempts from",
    )?;
    let key_secret = required(
        PORTAL_KEY_SECRET_ENV,
        "the Secrets Manager secret portal links are signed with",
    )?;
    let delivery_queue_url = required(
        DELIVERY_QUEUE_URL_ENV,
        "the SQS queue test events and events sent again go to",
    )?;
    let queue_key = function_queue_key(&sdk).await?;
    let portal = Arc::new(Portal {
        store: subscription_store(&sdk, TableNames::from_env(), keep),
        // Read as it is (one BatchGetItem), not through the functions' cache: a person reads
        // the page to see the endpoint's state now.
        health: Arc::new(DynamoDeliveryStateStore::from_sdk(&sdk, state_table)),
        journal: Arc::new(S3JournalSource::new(
            s3_client(&sdk),
            &journal_bucket,
            JOURNAL_PREFIX,
        )),
        // Topics' archives are in the same bucket, under archive/.
        archive: Arc::new(S3ArchiveSource::new(s3_client(&sdk), &journal_bucket)),
        keys: Arc::new(SecretsManagerPortalKey::new(&sdk, &key_secret, keep)),
        objects: Arc::new(S3ObjectStore::new(s3_client(&sdk))),
        // Not cached: the portal writes secrets (a rotation), it never reads one.
        secrets: Arc::new(SecretsManagerStore::from_sdk(&sdk)),
        secret_prefix: std::env::var(SECRET_PREFIX_ENV)
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_SECRET_PREFIX.to_string()),
        delivery_queue: Arc::new(SqsQueue::new(
            aws_sdk_sqs::Client::new(&sdk),
            delivery_queue_url,
            queue_key,
        )),
        clock: Arc::new(SystemClock),
        secure_cookies: true,
    });
    lambda_http::run(gridrelay_portal::router(portal)).await
}
