//! Thin adapters from the [`gridrelay_ports`] traits to the official AWS SDK crates.
//!
//! They talk to whatever `AWS_ENDPOINT_URL` names (moto, LocalStack) or to AWS itself.

mod accepted_ids;
mod delivery_state;
mod dynamodb;
mod journal;
mod replays;
mod resources;
mod s3;
mod secrets;
mod sqs;

pub use delivery_state::DynamoDeliveryStateStore;
pub use dynamodb::DynamoSubscriptionStore;
pub use journal::{
    FirehoseStream, HourlyObjects, JournalObject, S3ArchiveSource, S3JournalSource,
    buffering_interval,
};
pub use replays::DynamoReplayStore;
pub use resources::AwsResourceSender;
pub use s3::S3ObjectStore;
pub use secrets::{
    QueueKeyError, SecretsManagerPortalKey, SecretsManagerStore, ensure_local_key,
    function_queue_key, local_queue_key, portal_key, queue_key, rotate_portal_key,
};
pub use sqs::{
    SqsQueue, UNSEALED_METRIC, failed_receipts, fan_out_queues, receive_count, seal_records,
    sealed_records, sqs_event,
};

use aws_config::meta::region::RegionProviderChain;
use aws_config::{BehaviorVersion, SdkConfig};

/// Loads the SDK configuration from the environment, defaulting the region to us-east-1.
pub async fn load_sdk_config() -> SdkConfig {
    let region = RegionProviderChain::default_provider().or_else("us-east-1");
    aws_config::defaults(BehaviorVersion::latest())
        .region(region)
        .load()
        .await
}

/// The subscription store as the functions use it: DynamoDB behind a warm cache that keeps
/// what it read for `keep` ([`gridrelay_ports::cache`]; zero keeps nothing).
pub fn subscription_store(
    sdk: &SdkConfig,
    tables: crate::config::TableNames,
    keep: std::time::Duration,
) -> std::sync::Arc<gridrelay_ports::cache::CachedSubscriptionStore> {
    std::sync::Arc::new(gridrelay_ports::cache::CachedSubscriptionStore::new(
        std::sync::Arc::new(DynamoSubscriptionStore::from_sdk(sdk, tables)),
        std::sync::Arc::new(gridrelay_ports::SystemClock),
        keep,
    ))
}

/// Secrets Manager behind a warm cache that keeps the values it read for `keep`.
pub fn secret_store(
    sdk: &SdkConfig,
    keep: std::time::Duration,
) -> std::sync::Arc<gridrelay_ports::cache::CachedSecretStore> {
    std::sync::Arc::new(gridrelay_ports::cache::CachedSecretStore::new(
        std::sync::Arc::new(SecretsManagerStore::from_sdk(sdk)),
        std::sync::Arc::new(gridrelay_ports::SystemClock),
        keep,
    ))
}

/// The delivery state table behind a warm cache that keeps healthy endpoints' records for
/// `keep` (D1: delays and failures are read every time).
pub fn delivery_state_store(
    sdk: &SdkConfig,
    table: impl Into<String>,
    keep: std::time::Duration,
) -> std::sync::Arc<gridrelay_ports::cache::CachedDeliveryState> {
    std::sync::Arc::new(gridrelay_ports::cache::CachedDeliveryState::new(
        std::sync::Arc::new(DynamoDeliveryStateStore::from_sdk(sdk, table)),
        std::sync::Arc::new(gridrelay_ports::SystemClock),
        keep,
    ))
}

/// An S3 client; path-style addressing when an endpoint override (an emulator) is set.
pub fn s3_client(sdk: &SdkConfig) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::config::Builder::from(sdk)
        .force_path_style(sdk.endpoint_url().is_some())
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// The full text of an SDK error, including the service's own message.
pub fn describe_error<E: std::error::Error>(err: &E) -> String {
    aws_sdk_sqs::error::DisplayErrorContext(err).to_string()
}

/// Whether a conditional DynamoDB write was made (`false`: its condition did not hold); any
/// other failure is the store being unavailable.
pub(crate) fn written<O, E, R>(
    result: Result<O, aws_sdk_dynamodb::error::SdkError<E, R>>,
) -> Result<bool, gridrelay_ports::StoreError>
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match result {
        Ok(_) => Ok(true),
        Err(e) if is_conditional_failure(&e) => Ok(false),
        Err(e) => Err(unavailable(e)),
    }
}

/// Whether a conditional write was refused because its condition did not hold.
pub(crate) fn is_conditional_failure<E, R>(e: &aws_sdk_dynamodb::error::SdkError<E, R>) -> bool
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata,
{
    e.as_service_error()
        .is_some_and(|s| s.code() == Some("ConditionalCheckFailedException"))
}

/// A store call that failed: the store is unavailable, with the SDK's full text.
pub(crate) fn unavailable<E: std::error::Error>(e: E) -> gridrelay_ports::StoreError {
    gridrelay_ports::StoreError::Unavailable(describe_error(&e))
}
