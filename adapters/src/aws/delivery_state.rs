use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};

use super::{is_conditional_failure, unavailable, written};
use gridrelay_ports::{DeliveryCapStore, DeliveryStateStore, StoreError, Versioned};
use gridrelay_shared::caps::book_events;
use gridrelay_shared::health::{EndpointHealth, LastFailure};
use gridrelay_shared::outbound::redact_endpoint;

/// The attribute holding an endpoint health record's version (conditional writes).
const VERSION: &str = "ver";

/// How long a record outlives its last write (DynamoDB's TTL attribute `expiresAt` removes it).
const RECORD_LIFETIME: chrono::Duration = chrono::Duration::hours(48);

/// Tries at booking a subscription's allowance while other instances book it too.
const BOOKING_TRIES: usize = 8;

/// Expired leases removed in one write when a subscription's slots are all taken.
const EXPIRED_LEASES_PER_WRITE: usize = 50;

/// Endpoint health, late successes and delivery cap allowances in one DynamoDB table: partition
/// key `pk` (`endpoint#SHA-256 OF THE URL`, `late#ATTEMPT`, `rate#SUBSCRIPTION` or `slots#SUBSCRIPTION`), times as epoch milliseconds, `expiresAt` (epoch seconds) as the
/// table's TTL attribute.
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
    // The URL's digest, not the URL: it may carry credentials in its userinfo or query.
    key(format!(
        "endpoint#{}",
        gridrelay_shared::outbound::endpoint_digest(endpoint)
    ))
}

fn millis(t: DateTime<Utc>) -> AttributeValue {
    AttributeValue::N(t.timestamp_millis().to_string())
}

fn expires(now: DateTime<Utc>) -> AttributeValue {
    AttributeValue::N((now + RECORD_LIFETIME).timestamp().to_string())
}

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
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
                last_failure: time(&item, "lastFailureAt").and_then(|at| {
                    let outcome = item.get("lastFailureOutcome")?.as_s().ok()?;
                    Some(LastFailure {
                        at,
                        outcome: serde_json::from_value(serde_json::Value::String(outcome.clone()))
                            .ok()?,
                        status: number("lastFailureStatus").and_then(|n| u16::try_from(n).ok()),
                    })
                }),
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
        if let Some(f) = &health.last_failure {
            item.insert("lastFailureAt".into(), millis(f.at));
            if let Ok(serde_json::Value::String(outcome)) = serde_json::to_value(f.outcome) {
                item.insert("lastFailureOutcome".into(), AttributeValue::S(outcome));
            }
            if let Some(status) = f.status {
                item.insert(
                    "lastFailureStatus".into(),
                    AttributeValue::N(status.to_string()),
                );
            }
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
                "health of endpoint {}",
                redact_endpoint(endpoint)
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

/// Delivery caps: a subscription's events-per-second allowance is one item holding until when
/// it is booked (microseconds): an atomic `ADD` while that is past now, else a conditional
/// `SET` to now plus the batch's share; its request slots are one item whose `leases` map
/// holds each lease's end, grown by a conditional `SET` while it has fewer than the cap. When
/// the slots are all taken, the leases that have ended (their holder died or overran) are
/// removed and the write is tried once more.
#[async_trait]
impl DeliveryCapStore for DynamoDeliveryStateStore {
    async fn book_events(
        &self,
        subscription: &str,
        events: u32,
        rate: u32,
        now: DateTime<Utc>,
    ) -> Result<DateTime<Utc>, StoreError> {
        let pk = format!("rate#{subscription}");
        let alone = book_events(None, now, events, rate);
        let takes = (alone.booked_until - alone.start)
            .num_microseconds()
            .unwrap_or(i64::MAX);
        let now_us = micros(now);
        for _ in 0..BOOKING_TRIES {
            // Booked past now: the batch starts where the bookings end, moved on atomically
            // (one write, however many instances book at once).
            let added = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key(pk.clone())))
                .update_expression("SET expiresAt = :expires ADD bookedUntilMicros :takes")
                .condition_expression("bookedUntilMicros >= :now")
                .expression_attribute_values(":takes", AttributeValue::N(takes.to_string()))
                .expression_attribute_values(":now", AttributeValue::N(now_us.to_string()))
                .expression_attribute_values(":expires", expires(now))
                .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew)
                .send()
                .await;
            match added {
                Ok(out) => {
                    let until = out
                        .attributes
                        .as_ref()
                        .and_then(|a| a.get("bookedUntilMicros"))
                        .and_then(|v| v.as_n().ok())
                        .and_then(|n| n.parse::<i64>().ok())
                        .ok_or_else(|| {
                            StoreError::Corrupt(format!("{pk} has no bookedUntilMicros"))
                        })?;
                    return DateTime::from_timestamp_micros(until - takes).ok_or_else(|| {
                        StoreError::Corrupt(format!("{pk}: bookedUntilMicros {until}"))
                    });
                }
                Err(e) if !is_conditional_failure(&e) => return Err(unavailable(e)),
                Err(_) => {}
            }
            // Idle (nothing booked past now): the batch starts now.
            let started = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key(pk.clone())))
                .update_expression("SET bookedUntilMicros = :until, expiresAt = :expires")
                .condition_expression(
                    "attribute_not_exists(bookedUntilMicros) OR bookedUntilMicros < :now",
                )
                .expression_attribute_values(
                    ":until",
                    AttributeValue::N((now_us + takes).to_string()),
                )
                .expression_attribute_values(":now", AttributeValue::N(now_us.to_string()))
                .expression_attribute_values(":expires", expires(now))
                .send()
                .await;
            if written(started)? {
                return Ok(now);
            }
            // Another instance booked in between: book after it.
        }
        Err(StoreError::Conflict(format!(
            "the events-per-second allowance of {subscription} ({BOOKING_TRIES} tries)"
        )))
    }

    async fn acquire_slot(
        &self,
        subscription: &str,
        max: u32,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError> {
        let pk = format!("slots#{subscription}");
        let lease = uuid::Uuid::new_v4().simple().to_string();
        for _ in 0..2 {
            let taken = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key(pk.clone())))
                .update_expression("SET leases.#lease = :until, expiresAt = :expires")
                // DynamoDB finds `size` of a missing map false; moto fails on it, so the
                // map's existence is asked first.
                .condition_expression("attribute_exists(leases) AND size(leases) < :max")
                .expression_attribute_names("#lease", &lease)
                .expression_attribute_values(":until", millis(until))
                .expression_attribute_values(":expires", expires(now))
                .expression_attribute_values(":max", AttributeValue::N(max.to_string()))
                .send()
                .await;
            if written(taken)? {
                return Ok(Some(lease));
            }
            if !self.make_room(&pk, max, now).await? {
                return Ok(None);
            }
        }
        Ok(None)
    }

    async fn release_slot(&self, subscription: &str, lease: &str) -> Result<(), StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(format!("slots#{subscription}"))))
            .update_expression("REMOVE leases.#lease")
            .condition_expression("attribute_exists(leases)")
            .expression_attribute_names("#lease", lease)
            .send()
            .await;
        written(result).map(drop)
    }
}

impl DynamoDeliveryStateStore {
    /// A subscription's slots were all taken, or its item had no lease map yet: makes the map,
    /// or removes leases that ended before `now`. Whether there may be room now: also when
    /// another taker made the map meanwhile and fewer than `max` leases are in it.
    async fn make_room(&self, pk: &str, max: u32, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let item = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(pk.to_string())))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?
            .item;
        let Some(leases) = item
            .as_ref()
            .and_then(|i| i.get("leases"))
            .and_then(|l| l.as_m().ok())
        else {
            self.client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key(pk.to_string())))
                .update_expression(
                    "SET leases = if_not_exists(leases, :empty), expiresAt = :expires",
                )
                .expression_attribute_values(":empty", AttributeValue::M(HashMap::new()))
                .expression_attribute_values(":expires", expires(now))
                .send()
                .await
                .map_err(unavailable)?;
            return Ok(true);
        };
        let now_ms = now.timestamp_millis();
        let ended: Vec<&String> = leases
            .iter()
            .filter(|(_, ends)| {
                ends.as_n()
                    .ok()
                    .and_then(|n| n.parse::<i64>().ok())
                    .is_none_or(|ms| ms <= now_ms)
            })
            .map(|(id, _)| id)
            .take(EXPIRED_LEASES_PER_WRITE)
            .collect();
        if ended.is_empty() {
            return Ok(leases.len() < max as usize);
        }
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(pk.to_string())));
        let mut paths = Vec::new();
        for (i, id) in ended.iter().enumerate() {
            paths.push(format!("leases.#e{i}"));
            update = update.expression_attribute_names(format!("#e{i}"), *id);
        }
        update
            .update_expression(format!("REMOVE {}", paths.join(", ")))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(true)
    }
}
