use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};

use super::{unavailable, written};
use gridrelay_ports::{DeliveryStateStore, StoreError, Versioned};
use gridrelay_shared::health::EndpointHealth;

/// The attribute holding an endpoint health record's version (conditional writes).
const VERSION: &str = "ver";

/// How long a record outlives its last write (DynamoDB's TTL attribute `expiresAt` removes it).
const RECORD_LIFETIME: chrono::Duration = chrono::Duration::hours(48);

/// Endpoint health and late successes in one DynamoDB table: partition key `pk`
/// (`endpoint#URL` or `late#ATTEMPT`), times as epoch milliseconds, `expiresAt` (epoch
/// seconds) as the table's TTL attribute.
#[derive(Debug, Clone)]
pub struct DynamoDeliveryStateStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl DynamoDeliveryStateStore {
    pub fn new(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    pub fn from_sdk(sdk: &aws_config::SdkConfig, table: impl Into<String>) -> Self {
        Self::new(aws_sdk_dynamodb::Client::new(sdk), table)
    }
}

fn key(pk: String) -> HashMap<String, AttributeValue> {
    HashMap::from([("pk".to_string(), AttributeValue::S(pk))])
}

fn endpoint_key(endpoint: &str) -> HashMap<String, AttributeValue> {
    key(format!("endpoint#{endpoint}"))
}

fn millis(t: DateTime<Utc>) -> AttributeValue {
    AttributeValue::N(t.timestamp_millis().to_string())
}

fn expires(now: DateTime<Utc>) -> AttributeValue {
    AttributeValue::N((now + RECORD_LIFETIME).timestamp().to_string())
}

fn time(item: &HashMap<String, AttributeValue>, name: &str) -> Option<DateTime<Utc>> {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse::<i64>().ok())
        .and_then(DateTime::from_timestamp_millis)
}

impl DynamoDeliveryStateStore {
    async fn put(&self, item: HashMap<String, AttributeValue>) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}

#[async_trait]
impl DeliveryStateStore for DynamoDeliveryStateStore {
    async fn endpoint_health(
        &self,
        endpoint: &str,
    ) -> Result<Versioned<EndpointHealth>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(endpoint_key(endpoint)))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        let Some(item) = out.item else {
            return Ok(Versioned::default());
        };
        let number = |name: &str| {
            item.get(name)
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse::<u64>().ok())
        };
        Ok(Versioned {
            value: EndpointHealth {
                consecutive_failures: number("failures")
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
                delayed_until: time(&item, "delayedUntil"),
                probe_until: time(&item, "probeUntil"),
            },
            // Records written before versions existed read as version 0.
            version: number(VERSION).unwrap_or(0),
        })
    }

    async fn put_endpoint_health(
        &self,
        endpoint: &str,
        health: &EndpointHealth,
        version: u64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        // Over the record read: none (or one from before versions) at 0, else that version.
        let (condition, value) = if version == 0 {
            (
                "attribute_not_exists(pk) OR attribute_not_exists(#ver)",
                None,
            )
        } else {
            ("#ver = :ver", Some(AttributeValue::N(version.to_string())))
        };
        let values = value.map(|v| HashMap::from([(":ver".to_string(), v)]));
        // A healthy record is written too (and expires): deleting it would start its versions
        // again, and a writer that read before could write over a newer record.
        let mut item = endpoint_key(endpoint);
        item.insert(
            "failures".into(),
            AttributeValue::N(health.consecutive_failures.to_string()),
        );
        if let Some(t) = health.delayed_until {
            item.insert("delayedUntil".into(), millis(t));
        }
        if let Some(t) = health.probe_until {
            item.insert("probeUntil".into(), millis(t));
        }
        item.insert("expiresAt".into(), expires(now));
        item.insert(VERSION.into(), AttributeValue::N((version + 1).to_string()));
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .expression_attribute_names("#ver", VERSION)
            .set_expression_attribute_values(values)
            .send()
            .await;
        if written(result)? {
            Ok(())
        } else {
            Err(StoreError::Conflict(format!(
                "health of endpoint {endpoint}"
            )))
        }
    }

    async fn acquire_probe(
        &self,
        endpoint: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(endpoint_key(endpoint)))
            .update_expression("SET probeUntil = :until ADD #ver :one")
            .expression_attribute_names("#ver", VERSION)
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .condition_expression(
                "attribute_exists(pk) AND (attribute_not_exists(probeUntil) OR probeUntil < :now)",
            )
            .expression_attribute_values(":until", millis(until))
            .expression_attribute_values(":now", millis(now))
            .send()
            .await;
        written(result)
    }

    async fn mark_late_success(&self, attempt: &str, now: DateTime<Utc>) -> Result<(), StoreError> {
        let mut item = key(format!("late#{attempt}"));
        item.insert("at".into(), millis(now));
        item.insert("expiresAt".into(), expires(now));
        self.put(item).await
    }

    async fn late_success(&self, attempt: &str) -> Result<bool, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(format!("late#{attempt}"))))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out.item.is_some())
    }
}
