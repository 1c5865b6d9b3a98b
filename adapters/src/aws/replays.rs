//! Replays (#35) in a DynamoDB table: partition key `topic`, sort key `name`; the record as JSON
//! in `doc`, and its version in `version` for conditional writes, so a step's write is made only
//! over the version it read (`gridrelay_shared::replay`).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use gridrelay_ports::{ReplayStore, StoreError};
use gridrelay_shared::replay::Replay;

use super::dynamodb::{decode, encode, put_where, s};
use super::{unavailable, written};

/// Where a replay's version is kept beside its record, for conditional writes.
const VERSION_ATTRIBUTE: &str = "version";

/// Replays in one DynamoDB table.
#[derive(Debug, Clone)]
pub struct DynamoReplayStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl DynamoReplayStore {
    pub fn new(client: aws_sdk_dynamodb::Client, table: &str) -> Self {
        Self {
            client,
            table: table.to_string(),
        }
    }

    pub fn from_sdk(sdk: &aws_config::SdkConfig, table: &str) -> Self {
        Self::new(aws_sdk_dynamodb::Client::new(sdk), table)
    }

    /// The replays and the archive a function runs replays' steps with: the table named by
    /// [`REPLAYS_TABLE_ENV`](crate::config::REPLAYS_TABLE_ENV) and the archive in the bucket
    /// named by [`JOURNAL_BUCKET_ENV`](crate::config::JOURNAL_BUCKET_ENV); neither where
    /// either is unset or empty (a stack deployed without them).
    pub fn with_archive_from_env(
        sdk: &aws_config::SdkConfig,
    ) -> (
        std::sync::Arc<dyn ReplayStore>,
        std::sync::Arc<dyn gridrelay_ports::ArchiveSource>,
    ) {
        let named = |var| std::env::var(var).ok().filter(|v: &String| !v.is_empty());
        match (
            named(crate::config::REPLAYS_TABLE_ENV),
            named(crate::config::JOURNAL_BUCKET_ENV),
        ) {
            (Some(table), Some(bucket)) => (
                std::sync::Arc::new(Self::new(aws_sdk_dynamodb::Client::new(sdk), &table)),
                std::sync::Arc::new(super::S3ArchiveSource::new(super::s3_client(sdk), &bucket)),
            ),
            _ => (
                std::sync::Arc::new(gridrelay_ports::NoReplays),
                std::sync::Arc::new(gridrelay_ports::NoReplays),
            ),
        }
    }

    fn item(replay: &Replay) -> Result<HashMap<String, AttributeValue>, StoreError> {
        Ok(HashMap::from([
            ("topic".to_string(), s(&replay.topic)),
            ("name".to_string(), s(&replay.name)),
            (
                VERSION_ATTRIBUTE.to_string(),
                AttributeValue::N(replay.version.to_string()),
            ),
            ("doc".to_string(), encode(replay)?),
        ]))
    }
}

fn what(replay: &Replay) -> String {
    format!("replay {} of topic {}", replay.name, replay.topic)
}

#[async_trait]
impl ReplayStore for DynamoReplayStore {
    async fn create_replay(&self, replay: &Replay) -> Result<(), StoreError> {
        if put_where(&self.client, &self.table, Self::item(replay)?, false).await? {
            Ok(())
        } else {
            Err(StoreError::AlreadyExists(what(replay)))
        }
    }

    async fn get_replay(&self, topic: &str, name: &str) -> Result<Option<Replay>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("topic", s(topic))
            .key("name", s(name))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        out.item.as_ref().map(decode).transpose()
    }

    async fn list_replays(&self, topic: &str) -> Result<Vec<Replay>, StoreError> {
        let mut replays: Vec<Replay> = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("#t = :t")
                .expression_attribute_names("#t", "topic")
                .expression_attribute_values(":t", s(topic))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(unavailable)?;
            for item in out.items() {
                replays.push(decode(item)?);
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
        replays.sort_by_key(|r| std::cmp::Reverse(r.created_at));
        Ok(replays)
    }

    async fn update_replay(&self, replay: &Replay, read_version: u64) -> Result<(), StoreError> {
        gridrelay_ports::one_version_on(replay, read_version)?;
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(Self::item(replay)?))
            .condition_expression("attribute_exists(#n) AND #v = :read")
            .expression_attribute_names("#n", "name")
            .expression_attribute_names("#v", VERSION_ATTRIBUTE)
            .expression_attribute_values(":read", AttributeValue::N(read_version.to_string()))
            .send()
            .await;
        if written(result)? {
            return Ok(());
        }
        match self.get_replay(&replay.topic, &replay.name).await? {
            Some(_) => Err(StoreError::Conflict(what(replay))),
            None => Err(StoreError::NotFound(what(replay))),
        }
    }
}
