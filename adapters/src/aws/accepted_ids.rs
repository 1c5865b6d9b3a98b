//! Topics' accepted event identities (P1) in the delivery state table: one item per identity,
//! `pk` `dedup#TOPIC#DIGEST`, `acceptedAt` (epoch milliseconds, what the window is compared
//! with) and `expiresAt` (the table's TTL attribute, [`MARK_LIFETIME`] on, so items go away
//! by themselves). About 160 bytes each: one read unit to read strongly, one write unit to
//! write.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use chrono::{DateTime, Utc};

use super::delivery_state::key;
use super::{DynamoDeliveryStateStore, unavailable};
use gridrelay_ports::{AcceptedIds, StoreError};
use gridrelay_shared::dedup::{EventIdentity, MARK_LIFETIME};

/// Items in one `BatchWriteItem` (DynamoDB's limit).
const WRITE_BATCH: usize = 25;
/// Calls for what a `BatchWriteItem` left unprocessed (throttled) before the store counts as
/// unavailable; they wait 20, 40, 80 ms between.
const UNPROCESSED_TRIES: u32 = 4;

const PREFIX: &str = "dedup#";

fn pk(topic: &str, id: &EventIdentity) -> String {
    format!("{PREFIX}{topic}#{}", id.as_str())
}

fn pause(try_number: u32) -> Duration {
    Duration::from_millis(20 << try_number.min(4))
}

#[async_trait]
impl AcceptedIds for DynamoDeliveryStateStore {
    async fn accepted_at(
        &self,
        topic: &str,
        ids: &[EventIdentity],
    ) -> Result<HashMap<EventIdentity, DateTime<Utc>>, StoreError> {
        let topic_prefix = format!("{PREFIX}{topic}#");
        let (items, unread) = self
            .read_items_counted(ids.iter().map(|id| pk(topic, id)).collect())
            .await?;
        // An unread mark is not an absent one: the publish is answered 503 and retried,
        // rather than its events delivered again.
        if unread > 0 {
            return Err(StoreError::Unavailable(format!(
                "{}: {unread} accepted ids left unread (throttled)",
                self.table
            )));
        }
        Ok(items
            .iter()
            .filter_map(|(pk, item)| {
                let digest = pk.strip_prefix(&topic_prefix)?;
                let at = item
                    .get("acceptedAt")
                    .and_then(|v| v.as_n().ok())
                    .and_then(|n| n.parse::<i64>().ok())
                    .and_then(DateTime::from_timestamp_millis)?;
                Some((EventIdentity::from_digest(digest), at))
            })
            .collect())
    }

    async fn mark_accepted(
        &self,
        topic: &str,
        ids: &[EventIdentity],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let accepted = AttributeValue::N(at.timestamp_millis().to_string());
        let expires = AttributeValue::N((at + MARK_LIFETIME).timestamp().to_string());
        let mut calls = Vec::new();
        for chunk in ids.chunks(WRITE_BATCH) {
            let writes = chunk
                .iter()
                .map(|id| {
                    let mut item = key(pk(topic, id));
                    item.insert("acceptedAt".into(), accepted.clone());
                    item.insert("expiresAt".into(), expires.clone());
                    let put = PutRequest::builder()
                        .set_item(Some(item))
                        .build()
                        .map_err(unavailable)?;
                    Ok(WriteRequest::builder().put_request(put).build())
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            calls.push(self.write_all(writes));
        }
        // At once: a publish of 100 events waits for one call's time, not four. Each call
        // runs to its end: one that fails does not cancel the others' marks.
        let results = futures::future::join_all(calls).await;
        let failed = results.iter().filter(|r| r.is_err()).count();
        match results.into_iter().find_map(Result::err) {
            None => Ok(()),
            Some(e) => Err(StoreError::Unavailable(format!(
                "{failed} of the marks' writes failed, the first: {e}"
            ))),
        }
    }
}

impl DynamoDeliveryStateStore {
    /// One `BatchWriteItem` of `writes` (at most 25), and again for what it left unprocessed.
    async fn write_all(&self, mut writes: Vec<WriteRequest>) -> Result<(), StoreError> {
        for try_number in 0..UNPROCESSED_TRIES {
            let out = self
                .client
                .batch_write_item()
                .request_items(&self.table, writes)
                .send()
                .await
                .map_err(unavailable)?;
            match out
                .unprocessed_items
                .and_then(|mut left| left.remove(&self.table))
                .filter(|left| !left.is_empty())
            {
                None => return Ok(()),
                Some(left) if try_number + 1 < UNPROCESSED_TRIES => {
                    tokio::time::sleep(pause(try_number)).await;
                    writes = left;
                }
                Some(_) => break,
            }
        }
        Err(StoreError::Unavailable(format!(
            "{}: accepted ids left unmarked after {UNPROCESSED_TRIES} tries",
            self.table
        )))
    }
}
