//! Creates gridrelay's queues, tables, bucket and queue key where they are missing.
//!
//! On AWS the SAM or CDK stack creates them; locally the runner and the tests do.

use std::collections::HashMap;

use anyhow::Context;
use aws_config::SdkConfig;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;
use gridrelay_adapters::aws::{
    S3ObjectStore, describe_error, ensure_local_key, local_queue_key, s3_client,
};
use gridrelay_adapters::config::{
    ARCHIVE_STREAMS_ENV, CONTROL_QUEUE_URL_ENV, DELIVERY_QUEUE_URL_ENV, DELIVERY_STATE_TABLE_ENV,
    JOURNAL_BUCKET_ENV, ORDERED_QUEUE_URL_ENV, PORTAL_KEY_SECRET_ENV, QUEUE_KEY_SECRET_ENV,
    REPLAY_QUEUE_URL_ENV, REPLAYS_TABLE_ENV, SECRET_PREFIX_ENV, SUBSCRIPTIONS_TABLE_ENV,
    TOPICS_TABLE_ENV,
};
use gridrelay_shared::archive::{
    ARCHIVE_CLASSES, DEFAULT_UNCLASSED_EXPIRY_DAYS, UNCLASSED_PREFIX, class_expiry_days,
    class_prefix, format_archive_streams,
};
use gridrelay_shared::journal::JOURNAL_PREFIX;
use gridrelay_shared::ordering::ORDERED_MAX_RECEIVE_COUNT;

/// Names of every resource, all derived from one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceNames {
    pub topics_table: String,
    pub subscriptions_table: String,
    pub delivery_queue: String,
    /// Subscriptions' handshake and expiry steps, apart from the deliveries (#34 item 12).
    pub control_queue: String,
    /// Replays' deliveries and their retries, apart from live ones (#35).
    pub replay_queue: String,
    pub dead_letter_queue: String,
    /// O1: ordered subscriptions' events, a FIFO queue with a message group per key.
    pub ordered_queue: String,
    /// Where SQS moves ordered messages that keep failing (a FIFO queue's must be FIFO).
    pub ordered_redrive_queue: String,
    /// Where SQS moves delivery messages that keep failing (poison messages).
    pub delivery_redrive_queue: String,
    pub dead_letter_redrive_queue: String,
    /// The default dead-letter bucket the demo and tests point subscriptions at.
    pub dead_letter_bucket: String,
    /// H1: the name prefix of secret delivery header values in Secrets Manager.
    pub secret_prefix: String,
    /// D1, R4: endpoint health and late successes.
    pub delivery_state_table: String,
    /// The secret holding the key queue messages are sealed with (#34 item 2); outside the
    /// secret prefix, so no subscription's header can name it.
    pub queue_key_secret: String,
    /// The secret holding the key subscribers' portal links are signed with (#36); outside
    /// the secret prefix too.
    pub portal_key_secret: String,
    /// The delivery journal (#35): the Firehose stream `deliver` writes to, and the bucket it
    /// writes into (under `journal/`).
    pub journal_stream: String,
    pub journal_bucket: String,
    /// Topic archives (#35): the Firehose streams `ingest` writes accepted events to, one per
    /// retention class (`<prefix>-archive-7d`), into the journal's bucket under the class's
    /// prefix (`archive/7d/`).
    pub archive_streams: std::collections::BTreeMap<u16, String>,
    /// Replays of topics' archives (#35), by topic and name.
    pub replays_table: String,
}

impl ResourceNames {
    pub fn with_prefix(prefix: &str) -> Self {
        Self {
            topics_table: format!("{prefix}-topics"),
            subscriptions_table: format!("{prefix}-subscriptions"),
            delivery_queue: format!("{prefix}-delivery"),
            control_queue: format!("{prefix}-control"),
            replay_queue: format!("{prefix}-replay"),
            dead_letter_queue: format!("{prefix}-dead-letter"),
            ordered_queue: format!("{prefix}-ordered.fifo"),
            ordered_redrive_queue: format!("{prefix}-ordered-redrive.fifo"),
            delivery_redrive_queue: format!("{prefix}-delivery-redrive"),
            dead_letter_redrive_queue: format!("{prefix}-dead-letter-redrive"),
            dead_letter_bucket: format!("{prefix}-dead-letters"),
            secret_prefix: prefix.to_string(),
            delivery_state_table: format!("{prefix}-delivery-state"),
            queue_key_secret: format!("{prefix}-queue-key"),
            portal_key_secret: format!("{prefix}-portal-key"),
            journal_stream: format!("{prefix}-journal"),
            journal_bucket: format!("{prefix}-journal"),
            archive_streams: ARCHIVE_CLASSES
                .into_iter()
                .map(|class| (class, format!("{prefix}-archive-{class}d")))
                .collect(),
            replays_table: format!("{prefix}-replays"),
        }
    }

    /// The names of the resources beside a delivery queue (its name or URL) named as
    /// [`Self::with_prefix`] names them (`<prefix>-delivery`); `None` for another name.
    pub fn beside_delivery_queue(queue: &str) -> Option<Self> {
        let name = queue.rsplit('/').next().unwrap_or(queue);
        let prefix = name.strip_suffix("-delivery")?;
        (!prefix.is_empty()).then(|| Self::with_prefix(prefix))
    }

    /// The environment that points the `gridrelay` command line at these resources: its
    /// tables, its delivery, control and replay queues (by name), its secret prefix, its queue
    /// key and its portal key, its journal's bucket, its replays' table and its archive's
    /// streams.
    pub fn cli_env(&self) -> [(&'static str, String); 13] {
        [
            (TOPICS_TABLE_ENV, self.topics_table.clone()),
            (SUBSCRIPTIONS_TABLE_ENV, self.subscriptions_table.clone()),
            (DELIVERY_QUEUE_URL_ENV, self.delivery_queue.clone()),
            (CONTROL_QUEUE_URL_ENV, self.control_queue.clone()),
            (REPLAY_QUEUE_URL_ENV, self.replay_queue.clone()),
            (ORDERED_QUEUE_URL_ENV, self.ordered_queue.clone()),
            (SECRET_PREFIX_ENV, self.secret_prefix.clone()),
            (DELIVERY_STATE_TABLE_ENV, self.delivery_state_table.clone()),
            (QUEUE_KEY_SECRET_ENV, self.queue_key_secret.clone()),
            (PORTAL_KEY_SECRET_ENV, self.portal_key_secret.clone()),
            (JOURNAL_BUCKET_ENV, self.journal_bucket.clone()),
            (REPLAYS_TABLE_ENV, self.replays_table.clone()),
            (
                ARCHIVE_STREAMS_ENV,
                format_archive_streams(&self.archive_streams),
            ),
        ]
    }
}

impl Default for ResourceNames {
    fn default() -> Self {
        Self::with_prefix("gridrelay")
    }
}

/// What [`provision`] found or created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    pub names: ResourceNames,
    pub delivery_queue_url: String,
    pub delivery_queue_arn: String,
    pub control_queue_url: String,
    pub control_queue_arn: String,
    pub replay_queue_url: String,
    pub replay_queue_arn: String,
    pub dead_letter_queue_url: String,
    pub dead_letter_queue_arn: String,
    pub ordered_queue_url: String,
    pub ordered_queue_arn: String,
    pub delivery_redrive_queue_url: String,
    pub dead_letter_redrive_queue_url: String,
    pub ordered_redrive_queue_url: String,
}

impl Resources {
    /// The URLs of the installation's own queues, which no subscription may deliver to.
    pub fn queue_urls(&self) -> [&str; 8] {
        [
            &self.delivery_queue_url,
            &self.control_queue_url,
            &self.replay_queue_url,
            &self.dead_letter_queue_url,
            &self.ordered_queue_url,
            &self.delivery_redrive_queue_url,
            &self.dead_letter_redrive_queue_url,
            &self.ordered_redrive_queue_url,
        ]
    }
}

/// Creates whatever is missing; leaves what exists alone. The journal's bucket's lifecycle
/// rules are set each time, as a stack update sets them.
pub async fn provision(
    sdk: &SdkConfig,
    names: &ResourceNames,
    max_receive_count: u32,
) -> anyhow::Result<Resources> {
    let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
    create_table(&dynamodb, &names.topics_table, &[("name", KeyType::Hash)]).await?;
    create_table(
        &dynamodb,
        &names.subscriptions_table,
        &[("topic", KeyType::Hash), ("name", KeyType::Range)],
    )
    .await?;
    create_table(
        &dynamodb,
        &names.delivery_state_table,
        &[("pk", KeyType::Hash)],
    )
    .await?;
    create_table(
        &dynamodb,
        &names.replays_table,
        &[("topic", KeyType::Hash), ("name", KeyType::Range)],
    )
    .await?;
    // Records expire on their own (DynamoDB TTL on `expiresAt`).
    let ttl = dynamodb
        .update_time_to_live()
        .table_name(&names.delivery_state_table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name("expiresAt")
                .enabled(true)
                .build()?,
        )
        .send()
        .await;
    if let Err(e) = ttl {
        // Already enabled is fine; anything else is worth knowing, not fatal.
        tracing::debug!(error = %describe_error(&e), "time to live not changed");
    }

    let sqs = aws_sdk_sqs::Client::new(sdk);
    let (delivery_redrive_queue_url, delivery_redrive_arn) =
        create_queue(&sqs, &names.delivery_redrive_queue, None).await?;
    let (dead_letter_redrive_queue_url, dead_letter_redrive_arn) =
        create_queue(&sqs, &names.dead_letter_redrive_queue, None).await?;
    let (delivery_queue_url, delivery_queue_arn) = create_queue(
        &sqs,
        &names.delivery_queue,
        Some((&delivery_redrive_arn, max_receive_count)),
    )
    .await?;
    // Its poison messages are parked with the delivery queue's: `gridrelay redrive queue` puts
    // each kind back where it belongs.
    let (control_queue_url, control_queue_arn) = create_queue(
        &sqs,
        &names.control_queue,
        Some((&delivery_redrive_arn, max_receive_count)),
    )
    .await?;
    let (replay_queue_url, replay_queue_arn) = create_queue(
        &sqs,
        &names.replay_queue,
        Some((&delivery_redrive_arn, max_receive_count)),
    )
    .await?;
    let (dead_letter_queue_url, dead_letter_queue_arn) = create_queue(
        &sqs,
        &names.dead_letter_queue,
        Some((&dead_letter_redrive_arn, max_receive_count)),
    )
    .await?;
    // O1: its redrive count is out of the ladder's reach whatever the runner's: every hold
    // of an ordered message is a receive.
    let (ordered_redrive_queue_url, ordered_redrive_arn) =
        create_queue(&sqs, &names.ordered_redrive_queue, None).await?;
    let (ordered_queue_url, ordered_queue_arn) = create_queue(
        &sqs,
        &names.ordered_queue,
        Some((&ordered_redrive_arn, ORDERED_MAX_RECEIVE_COUNT)),
    )
    .await?;

    // #34 item 2: the key every message on these queues is sealed with.
    local_queue_key(sdk, &names.queue_key_secret)
        .await
        .context("could not make or read the queue key")?;
    // #36: the key subscribers' portal links are signed with.
    ensure_local_key(
        sdk,
        &names.portal_key_secret,
        "gridrelay: the key subscribers' portal links are signed with",
    )
    .await
    .context("could not make the portal key")?;

    let s3 = s3_client(sdk);
    create_bucket(&s3, &names.dead_letter_bucket).await?;
    create_bucket(&s3, &names.journal_bucket).await?;
    // As the stacks' rules: the journal kept 7 days (their default), each archive class its
    // days (`topic create --retention-days` checks its class has one), and archives written
    // before classes the stacks' `ArchiveRetentionDays` default.
    let class_rules: Vec<(String, String, u16)> = ARCHIVE_CLASSES
        .into_iter()
        .map(|class| {
            let days = class_expiry_days(class);
            (format!("ExpireArchive{class}d"), class_prefix(class), days)
        })
        .collect();
    let mut rules: Vec<(&str, &str, u16)> = vec![
        ("ExpireJournal", JOURNAL_PREFIX, 7),
        (
            "ExpireArchive",
            UNCLASSED_PREFIX,
            DEFAULT_UNCLASSED_EXPIRY_DAYS,
        ),
    ];
    rules.extend(
        class_rules
            .iter()
            .map(|(id, prefix, days)| (id.as_str(), prefix.as_str(), *days)),
    );
    S3ObjectStore::new(s3.clone())
        .set_expirations(&names.journal_bucket, &rules)
        .await
        .with_context(|| format!("could not set bucket {}'s lifecycle", names.journal_bucket))?;
    create_stream(
        sdk,
        &names.journal_stream,
        &names.journal_bucket,
        JOURNAL_PREFIX,
        60,
    )
    .await?;
    // The emulators write each batch as it comes: said so, a replay waits no buffering
    // interval past its window's end (`replay start` reads it).
    for (class, stream) in &names.archive_streams {
        create_stream(sdk, stream, &names.journal_bucket, &class_prefix(*class), 0).await?;
    }

    Ok(Resources {
        names: names.clone(),
        delivery_queue_url,
        delivery_queue_arn,
        control_queue_url,
        control_queue_arn,
        replay_queue_url,
        replay_queue_arn,
        dead_letter_queue_url,
        dead_letter_queue_arn,
        ordered_queue_url,
        ordered_queue_arn,
        delivery_redrive_queue_url,
        dead_letter_redrive_queue_url,
        ordered_redrive_queue_url,
    })
}

/// Creates a bucket (idempotent).
async fn create_bucket(s3: &aws_sdk_s3::Client, bucket: &str) -> anyhow::Result<()> {
    match s3.create_bucket().bucket(bucket).send().await {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error().is_some_and(|s| {
                s.is_bucket_already_owned_by_you() || s.is_bucket_already_exists()
            }) =>
        {
            Ok(())
        }
        Err(e) => anyhow::bail!("could not create bucket {bucket}: {}", describe_error(&e)),
    }
}

/// A Firehose stream into `bucket` (idempotent), as the stack makes the journal's and the
/// archive's: under `prefix` and the stream's own hour prefix, keeping the records as their
/// writers compressed them. The emulator writes each put at once; AWS buffers them (60 s here).
async fn create_stream(
    sdk: &SdkConfig,
    stream: &str,
    bucket: &str,
    prefix: &str,
    buffer_seconds: i32,
) -> anyhow::Result<()> {
    use aws_sdk_firehose::types::{
        BufferingHints, CompressionFormat, DeliveryStreamType, ExtendedS3DestinationConfiguration,
    };
    let firehose = aws_sdk_firehose::Client::new(sdk);
    let destination = ExtendedS3DestinationConfiguration::builder()
        .bucket_arn(format!("arn:aws:s3:::{bucket}"))
        // Not used by the emulator; the stack's stream has a role of its own.
        .role_arn(format!("arn:aws:iam::123456789012:role/{stream}"))
        .prefix(prefix)
        .compression_format(CompressionFormat::Uncompressed)
        .file_extension(".json.gz")
        .buffering_hints(
            BufferingHints::builder()
                .interval_in_seconds(buffer_seconds)
                .size_in_mbs(64)
                .build(),
        )
        .build()?;
    match firehose
        .create_delivery_stream()
        .delivery_stream_name(stream)
        .delivery_stream_type(DeliveryStreamType::DirectPut)
        .extended_s3_destination_configuration(destination)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception()) =>
        {
            Ok(())
        }
        Err(e) => anyhow::bail!(
            "could not create the stream {stream} into {bucket}: {}",
            describe_error(&e)
        ),
    }
}

async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    name: &str,
    keys: &[(&str, KeyType)],
) -> anyhow::Result<()> {
    let mut request = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest);
    for (attr, kind) in keys {
        request = request
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(*attr)
                    .attribute_type(ScalarAttributeType::S)
                    .build()?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(*attr)
                    .key_type(kind.clone())
                    .build()?,
            );
    }
    match request.send().await {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception()) =>
        {
            Ok(())
        }
        Err(e) => anyhow::bail!("could not create table {name}: {}", describe_error(&e)),
    }
}

/// Creates a queue (idempotent) and returns its URL and ARN.
async fn create_queue(
    client: &aws_sdk_sqs::Client,
    name: &str,
    redrive: Option<(&str, u32)>,
) -> anyhow::Result<(String, String)> {
    let mut attributes = HashMap::new();
    // Messages up to SQS's 1 MiB, so events up to Event Grid's 1 MB fit in one.
    attributes.insert(
        QueueAttributeName::MaximumMessageSize,
        "1048576".to_string(),
    );
    // O1: a FIFO queue (its name says so), in high-throughput mode: each message group (a
    // key) has its own throughput, and deduplication is per group. Kept 14 days, SQS's
    // most: a key whose first event waits holds the rest in the queue.
    let fifo = name.ends_with(".fifo");
    if fifo {
        attributes.insert(QueueAttributeName::FifoQueue, "true".to_string());
        attributes.insert(
            QueueAttributeName::DeduplicationScope,
            "messageGroup".to_string(),
        );
        attributes.insert(
            QueueAttributeName::FifoThroughputLimit,
            "perMessageGroupId".to_string(),
        );
        attributes.insert(
            QueueAttributeName::MessageRetentionPeriod,
            "1209600".to_string(),
        );
    }
    if let Some((arn, max)) = redrive {
        attributes.insert(
            QueueAttributeName::RedrivePolicy,
            serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": max.to_string()})
                .to_string(),
        );
    }
    let created = client
        .create_queue()
        .queue_name(name)
        .set_attributes(Some(attributes.clone()))
        .send()
        .await;
    let url = match created {
        Ok(out) => out.queue_url().context("queue has no URL")?.to_string(),
        // It exists with other settings (an earlier run with another --max-receive-count):
        // reconcile them rather than fail.
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_queue_name_exists()) =>
        {
            let url = client
                .get_queue_url()
                .queue_name(name)
                .send()
                .await
                .map_err(|e| {
                    anyhow::anyhow!("could not find queue {name}: {}", describe_error(&e))
                })?
                .queue_url()
                .context("queue has no URL")?
                .to_string();
            // A queue's kind is fixed when it is made.
            attributes.remove(&QueueAttributeName::FifoQueue);
            client
                .set_queue_attributes()
                .queue_url(&url)
                .set_attributes(Some(attributes))
                .send()
                .await
                .map_err(|e| {
                    anyhow::anyhow!("could not update queue {name}: {}", describe_error(&e))
                })?;
            tracing::info!(
                queue = name,
                "queue existed with other settings; updated them"
            );
            url
        }
        Err(e) => anyhow::bail!("could not create queue {name}: {}", describe_error(&e)),
    };
    let attrs = client
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("could not read queue {name}: {}", describe_error(&e)))?;
    let arn = attrs
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .context("queue has no ARN")?
        .to_string();
    Ok((url, arn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resources_beside_a_delivery_queue_share_its_prefix() {
        let names = ResourceNames::beside_delivery_queue(
            "http://127.0.0.1:5056/123456789012/chaos-7-delivery",
        );
        assert_eq!(names, Some(ResourceNames::with_prefix("chaos-7")));
        assert_eq!(
            ResourceNames::beside_delivery_queue("gridrelay-delivery"),
            Some(ResourceNames::default())
        );
        assert_eq!(ResourceNames::beside_delivery_queue("my-queue"), None);
        assert_eq!(ResourceNames::beside_delivery_queue("-delivery"), None);
    }
}
