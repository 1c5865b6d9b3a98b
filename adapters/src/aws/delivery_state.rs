use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};

use super::{is_conditional_failure, unavailable, written};
use gridrelay_ports::{DeliveryCapStore, DeliveryStateStore, StoreError, Versioned};
use gridrelay_shared::caps::{
    RateAllowance, book_events, rate_items, rate_of_item, slot_items, slots_in_item,
};
use gridrelay_shared::health::{EndpointHealth, LastFailure};
use gridrelay_shared::outbound::redact_endpoint;
use rand::Rng;
use rand::seq::SliceRandom;

/// The attribute holding an endpoint health record's version (conditional writes).
const VERSION: &str = "ver";

/// How long a record outlives its last write (DynamoDB's TTL attribute `expiresAt` removes it).
const RECORD_LIFETIME: chrono::Duration = chrono::Duration::hours(48);

/// Tries at booking a subscription's allowance while other instances book it too.
const BOOKING_TRIES: usize = 8;

/// Ended leases removed in one write when a slot item is full.
const EXPIRED_LEASES_PER_WRITE: usize = 50;

/// Endpoint health, late successes and delivery cap allowances in one DynamoDB table: partition
/// key `pk` (`endpoint#SHA-256 OF THE URL`, `late#ATTEMPT`, `ordered#MESSAGE ID` (O1: an ordered
/// message's progress while it waits in flight), `rate#SUBSCRIPTION[#ITEM]`,
/// `slots#SUBSCRIPTION[#ITEM]` or, for topics' accepted event ids, `dedup#TOPIC#DIGEST`), times as epoch milliseconds, `expiresAt` (epoch seconds) as
/// the table's TTL attribute.
#[derive(Debug, Clone)]
pub struct DynamoDeliveryStateStore {
    pub(super) client: aws_sdk_dynamodb::Client,
    pub(super) table: String,
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

pub(super) fn key(pk: String) -> HashMap<String, AttributeValue> {
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

/// An endpoint's record read back from its item.
fn health_of_item(item: &HashMap<String, AttributeValue>) -> Versioned<EndpointHealth> {
    let number = |name: &str| {
        item.get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<u64>().ok())
    };
    Versioned {
        value: EndpointHealth {
            consecutive_failures: number("failures")
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
            delayed_until: time(item, "delayedUntil"),
            probe_until: time(item, "probeUntil"),
            last_failure: time(item, "lastFailureAt").and_then(|at| {
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
    }
}

#[async_trait]
impl DeliveryStateStore for DynamoDeliveryStateStore {
    async fn endpoint_healths(
        &self,
        endpoints: &[String],
    ) -> Result<Vec<EndpointHealth>, StoreError> {
        let pk = |endpoint: &str| {
            endpoint_key(endpoint)
                .remove("pk")
                .and_then(|v| v.as_s().ok().cloned())
                .unwrap_or_default()
        };
        let mut unique: Vec<String> = endpoints.iter().map(|e| pk(e)).collect();
        unique.sort();
        unique.dedup();
        let items = self.read_items(unique).await?;
        Ok(endpoints
            .iter()
            .map(|e| {
                items
                    .get(&pk(e))
                    .map(|item| health_of_item(item).value)
                    .unwrap_or_default()
            })
            .collect())
    }

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
        Ok(out.item.as_ref().map(health_of_item).unwrap_or_default())
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

    async fn late_success(&self, attempt: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(format!("late#{attempt}"))))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        // An item without its time (written before times were kept) was answered by now.
        Ok(out
            .item
            .map(|item| time(&item, "at").unwrap_or_else(Utc::now)))
    }

    async fn ordered_progress(
        &self,
        message_ids: &[String],
    ) -> Result<HashMap<String, String>, StoreError> {
        let pk = |id: &str| format!("ordered#{id}");
        let keys: Vec<String> = message_ids.iter().map(|id| pk(id)).collect();
        let (items, unread) = self.read_items_counted(keys).await?;
        if unread > 0 {
            return Err(StoreError::Unavailable(format!(
                "{unread} ordered messages' progress left unread (throttled)"
            )));
        }
        Ok(message_ids
            .iter()
            .filter_map(|id| {
                let progress = items.get(&pk(id))?.get("progress")?.as_s().ok()?;
                Some((id.clone(), progress.clone()))
            })
            .collect())
    }

    async fn put_ordered_progress(
        &self,
        message_id: &str,
        progress: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut item = key(format!("ordered#{message_id}"));
        item.insert("progress".into(), AttributeValue::S(progress.to_string()));
        item.insert("expiresAt".into(), expires(now));
        self.put(item).await
    }

    /// One conditional put (`claim#KEY`, its token): written if there is none or it is this
    /// token's; refused (taken by another) otherwise.
    async fn claim(
        &self,
        key_of: &str,
        token: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let mut item = key(format!("claim#{key_of}"));
        item.insert("token".into(), AttributeValue::S(token.to_string()));
        item.insert(
            "expiresAt".into(),
            AttributeValue::N(until.timestamp().to_string()),
        );
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            // Free, its own, or ended (its record not deleted yet: TTL deletes within days).
            .condition_expression(
                "attribute_not_exists(pk) OR #token = :token OR #expiresAt <= :now",
            )
            .expression_attribute_names("#token", "token")
            .expression_attribute_names("#expiresAt", "expiresAt")
            .expression_attribute_values(":token", AttributeValue::S(token.to_string()))
            .expression_attribute_values(":now", AttributeValue::N(now.timestamp().to_string()))
            .send()
            .await;
        match put {
            Ok(_) => Ok(true),
            Err(e) if is_conditional_failure(&e) => Ok(false),
            Err(e) => Err(unavailable(e)),
        }
    }
}

/// The key of a subscription's cap item `item` of `kind` (`rate` or `slots`): the first keeps
/// the key a single item had before the allowances were spread over items.
fn cap_item_key(kind: &str, subscription: &str, item: u32) -> String {
    if item == 0 {
        format!("{kind}#{subscription}")
    } else {
        format!("{kind}#{subscription}#{item}")
    }
}

/// The slot item a lease (`ITEM.ID`) is kept in; a lease of another shape (taken before the
/// slots were spread over items) is in the first.
fn lease_item(lease: &str) -> u32 {
    lease
        .split_once('.')
        .and_then(|(item, _)| item.parse().ok())
        .unwrap_or(0)
}

/// Delivery caps, each spread over items of bounded size and load so every accepted cap is
/// within DynamoDB's 1,000 write units a second per item (`gridrelay_shared::caps`, which
/// has the arithmetic). A subscription's events-per-second allowance is [`rate_items`] items,
/// each holding until when its own schedule, at its share of the rate, is booked
/// (microseconds): a batch books one item picked at random, by an atomic `ADD` while that is
/// past now, else a conditional `SET` to now plus the batch's share. Its request slots are
/// [`slot_items`] items of at most 16 leases (under 1 KB, one write unit), each a `leases` map
/// holding each lease's end, grown by a conditional `SET` while it has fewer than its share of
/// the cap. A slot is first asked of one item picked at random; if that one is full, all are
/// read at once, and those with room (a lease ended, its holder died or overran, or no map
/// yet) are made ready and asked in turn.
#[async_trait]
impl DeliveryCapStore for DynamoDeliveryStateStore {
    async fn book_events(
        &self,
        subscription: &str,
        events: u32,
        allowance: RateAllowance,
        now: DateTime<Utc>,
    ) -> Result<DateTime<Utc>, StoreError> {
        let item = rand::rng().random_range(0..rate_items(allowance));
        let pk = cap_item_key("rate", subscription, item);
        let alone = book_events(None, now, events, rate_of_item(allowance, item));
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
        let items = slot_items(max);
        let first = rand::rng().random_range(0..items);
        let take = |item| self.take_slot(subscription, max, item, now, until);
        if let Some(lease) = take(first).await? {
            return Ok(Some(lease));
        }
        let mut with_room = self.slot_items_with_room(subscription, max, now).await?;
        with_room.shuffle(&mut rand::rng());
        for (item, ended) in with_room {
            self.make_room(&cap_item_key("slots", subscription, item), ended, now)
                .await?;
            if let Some(lease) = take(item).await? {
                return Ok(Some(lease));
            }
        }
        Ok(None)
    }

    async fn release_slot(&self, subscription: &str, lease: &str) -> Result<(), StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(cap_item_key(
                "slots",
                subscription,
                lease_item(lease),
            ))))
            .update_expression("REMOVE leases.#lease")
            .condition_expression("attribute_exists(leases)")
            .expression_attribute_names("#lease", lease)
            .send()
            .await;
        written(result).map(drop)
    }
}

/// What a slot item needs before a lease may be added: nothing, its lease map made, or the
/// leases that have ended removed.
#[derive(Debug)]
enum SlotRoom {
    Ready,
    NoMap,
    Ended(Vec<String>),
}

impl DynamoDeliveryStateStore {
    /// Adds a lease to slot item `item` of `subscription` if it has fewer than its share of
    /// `max`; the lease if it did.
    async fn take_slot(
        &self,
        subscription: &str,
        max: u32,
        item: u32,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError> {
        let lease = format!("{item}.{}", uuid::Uuid::new_v4().simple());
        let taken = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(cap_item_key("slots", subscription, item))))
            .update_expression("SET leases.#lease = :until, expiresAt = :expires")
            // DynamoDB finds `size` of a missing map false; moto fails on it, so the map's
            // existence is asked first.
            .condition_expression("attribute_exists(leases) AND size(leases) < :max")
            .expression_attribute_names("#lease", &lease)
            .expression_attribute_values(":until", millis(until))
            .expression_attribute_values(":expires", expires(now))
            .expression_attribute_values(
                ":max",
                AttributeValue::N(slots_in_item(max, item).to_string()),
            )
            .send()
            .await;
        Ok(written(taken)?.then_some(lease))
    }

    /// Reads all of a subscription's slot items at once: those that may take a lease at `now`
    /// (fewer live leases than their share of `max`), with what each needs first.
    async fn slot_items_with_room(
        &self,
        subscription: &str,
        max: u32,
        now: DateTime<Utc>,
    ) -> Result<Vec<(u32, SlotRoom)>, StoreError> {
        let keys: HashMap<String, u32> = (0..slot_items(max))
            .map(|item| (cap_item_key("slots", subscription, item), item))
            .collect();
        let read = self.read_items(keys.keys().cloned().collect()).await?;
        let now_ms = now.timestamp_millis();
        let mut with_room = Vec::new();
        for (pk, &item) in &keys {
            let share = slots_in_item(max, item) as usize;
            let Some(leases) = read
                .get(pk)
                .and_then(|i| i.get("leases"))
                .and_then(|l| l.as_m().ok())
            else {
                with_room.push((item, SlotRoom::NoMap));
                continue;
            };
            let mut ended: Vec<String> = leases
                .iter()
                .filter(|(_, ends)| {
                    ends.as_n()
                        .ok()
                        .and_then(|n| n.parse::<i64>().ok())
                        .is_none_or(|ms| ms <= now_ms)
                })
                .map(|(id, _)| id.clone())
                .collect();
            // Room is counted on every ended lease; one write removes up to 50 of them (an
            // item of the single-item layout may hold many more: each pass removes 50).
            let live = leases.len() - ended.len();
            ended.truncate(EXPIRED_LEASES_PER_WRITE);
            if leases.len() < share {
                with_room.push((item, SlotRoom::Ready));
            } else if live < share {
                with_room.push((item, SlotRoom::Ended(ended)));
            }
        }
        Ok(with_room)
    }

    /// Items by key, read consistently in as few calls as DynamoDB allows (100 keys a call);
    /// missing items are left out. Keys DynamoDB leaves unprocessed are asked again, three
    /// times at most; any still unread are left out too.
    async fn read_items(
        &self,
        keys: Vec<String>,
    ) -> Result<HashMap<String, HashMap<String, AttributeValue>>, StoreError> {
        Ok(self.read_items_counted(keys).await?.0)
    }

    /// [`Self::read_items`], and how many keys were left unread (DynamoDB left them unprocessed
    /// three times: throttled), for a caller to which a missing item and an unread one differ.
    pub(super) async fn read_items_counted(
        &self,
        keys: Vec<String>,
    ) -> Result<(HashMap<String, HashMap<String, AttributeValue>>, usize), StoreError> {
        let mut found = HashMap::new();
        let mut unread = 0;
        for chunk in keys.chunks(100) {
            let mut ask = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
                .set_keys(Some(chunk.iter().map(|pk| key(pk.clone())).collect()))
                .consistent_read(true)
                .build()
                .map_err(unavailable)?;
            let mut left = 0;
            for _ in 0..3 {
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, ask)
                    .send()
                    .await
                    .map_err(unavailable)?;
                for item in out
                    .responses
                    .unwrap_or_default()
                    .remove(&self.table)
                    .unwrap_or_default()
                {
                    if let Some(pk) = item.get("pk").and_then(|v| v.as_s().ok()) {
                        found.insert(pk.clone(), item);
                    }
                }
                match out.unprocessed_keys.and_then(|mut u| u.remove(&self.table)) {
                    Some(rest) if !rest.keys.is_empty() => {
                        left = rest.keys.len();
                        ask = rest;
                    }
                    _ => {
                        left = 0;
                        break;
                    }
                }
            }
            unread += left;
        }
        Ok((found, unread))
    }

    /// Makes a slot item ready for a lease: its map made (if another taker has not meanwhile),
    /// or its ended leases removed.
    async fn make_room(
        &self,
        pk: &str,
        room: SlotRoom,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(pk.to_string())));
        let update = match room {
            SlotRoom::Ready => return Ok(()),
            SlotRoom::NoMap => update
                .update_expression(
                    "SET leases = if_not_exists(leases, :empty), expiresAt = :expires",
                )
                .expression_attribute_values(":empty", AttributeValue::M(HashMap::new()))
                .expression_attribute_values(":expires", expires(now)),
            SlotRoom::Ended(ended) => {
                let mut update = update;
                let mut paths = Vec::new();
                for (i, id) in ended.into_iter().enumerate() {
                    paths.push(format!("leases.#e{i}"));
                    update = update.expression_attribute_names(format!("#e{i}"), id);
                }
                update.update_expression(format!("REMOVE {}", paths.join(", ")))
            }
        };
        update.send().await.map_err(unavailable)?;
        Ok(())
    }
}
