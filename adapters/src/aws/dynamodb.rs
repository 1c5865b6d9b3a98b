use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{unavailable, written};
use crate::config::TableNames;
use gridrelay_ports::{StoreError, SubscriptionStore};
use gridrelay_shared::subscription::{Subscription, Topic};

/// Topics and subscriptions in two DynamoDB tables.
///
/// - topics: partition key `name`; the record as JSON in `doc`.
/// - subscriptions: partition key `topic`, sort key `name`; the record as JSON in `doc`, so one
///   Query returns every subscription of a topic for fan-out.
#[derive(Debug, Clone)]
pub struct DynamoSubscriptionStore {
    client: aws_sdk_dynamodb::Client,
    tables: TableNames,
}

type Item = HashMap<String, AttributeValue>;

pub(super) fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

pub(super) fn decode<T: DeserializeOwned>(item: &Item) -> Result<T, StoreError> {
    let doc = item
        .get("doc")
        .and_then(|v| v.as_s().ok())
        .ok_or_else(|| StoreError::Corrupt("item has no doc attribute".to_string()))?;
    serde_json::from_str(doc).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Puts `item` under a condition on whether an item of its key exists (every table here has a
/// `name` in its key); whether the condition held and it was written.
pub(super) async fn put_where(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    item: Item,
    exists: bool,
) -> Result<bool, StoreError> {
    let condition = if exists {
        "attribute_exists(#n)"
    } else {
        "attribute_not_exists(#n)"
    };
    let result = client
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression(condition)
        .expression_attribute_names("#n", "name")
        .send()
        .await;
    written(result)
}

/// Top-level copies of a subscription's id and version, for conditional writes.
const ID_ATTRIBUTE: &str = "subscriptionId";
const VERSION_ATTRIBUTE: &str = "version";

fn subscription_key(topic: &str, name: &str) -> Item {
    HashMap::from([
        ("topic".to_string(), s(topic)),
        ("name".to_string(), s(name)),
    ])
}

fn version_attributes(sub: &Subscription) -> Vec<(String, AttributeValue)> {
    let mut attributes = vec![(
        VERSION_ATTRIBUTE.to_string(),
        AttributeValue::N(sub.version.to_string()),
    )];
    if !sub.id.is_empty() {
        attributes.push((ID_ATTRIBUTE.to_string(), s(&sub.id)));
    }
    attributes
}

fn describe_subscription(sub: &Subscription) -> String {
    format!("event subscription {} on topic {}", sub.name, sub.topic)
}

pub(super) fn encode<T: Serialize>(record: &T) -> Result<AttributeValue, StoreError> {
    serde_json::to_string(record)
        .map(AttributeValue::S)
        .map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl DynamoSubscriptionStore {
    pub fn new(client: aws_sdk_dynamodb::Client, tables: TableNames) -> Self {
        Self { client, tables }
    }

    pub fn from_sdk(sdk: &aws_config::SdkConfig, tables: TableNames) -> Self {
        Self::new(aws_sdk_dynamodb::Client::new(sdk), tables)
    }

    /// Creates a subscription whose name is free on its topic.
    async fn create_subscription_record(&self, sub: &Subscription) -> Result<(), StoreError> {
        let mut item = subscription_key(&sub.topic, &sub.name);
        item.extend(version_attributes(sub));
        let conflict = StoreError::AlreadyExists(describe_subscription(sub));
        self.put_if(
            &self.tables.subscriptions,
            item,
            encode(sub)?,
            false,
            conflict,
        )
        .await
    }

    /// Writes `sub` over the record it was read from (same `subscriptionId` and `version`
    /// attributes), with the next version. Records written before these attributes existed
    /// have neither, and are matched by that.
    async fn replace_subscription_record(&self, sub: &mut Subscription) -> Result<(), StoreError> {
        let mut next = sub.clone();
        next.version += 1;
        let mut item = subscription_key(&sub.topic, &sub.name);
        item.extend(version_attributes(&next));
        item.insert("doc".to_string(), encode(&next)?);
        let mut request = self
            .client
            .put_item()
            .table_name(&self.tables.subscriptions)
            .set_item(Some(item))
            .expression_attribute_names("#n", "name")
            .expression_attribute_names("#ver", VERSION_ATTRIBUTE)
            .expression_attribute_names("#sid", ID_ATTRIBUTE)
            .expression_attribute_values(":ver", AttributeValue::N(sub.version.to_string()));
        request = if sub.id.is_empty() {
            request.condition_expression(
                "attribute_exists(#n) AND attribute_not_exists(#sid) AND (attribute_not_exists(#ver) OR #ver = :ver)",
            )
        } else {
            request
                .condition_expression("attribute_exists(#n) AND #sid = :sid AND #ver = :ver")
                .expression_attribute_values(":sid", s(&sub.id))
        };
        if written(request.send().await)? {
            *sub = next;
            return Ok(());
        }
        let what = describe_subscription(sub);
        let key = subscription_key(&sub.topic, &sub.name);
        match self.get(&self.tables.subscriptions, key).await? {
            Some(_) => Err(StoreError::Conflict(what)),
            None => Err(StoreError::NotFound(what)),
        }
    }

    /// Writes a record (its key and any other attributes in `item`, the JSON in `doc`) under a
    /// condition on whether its key exists; `conflict` is the error when the condition fails.
    async fn put_if(
        &self,
        table: &str,
        mut item: Item,
        doc: AttributeValue,
        exists: bool,
        conflict: StoreError,
    ) -> Result<(), StoreError> {
        item.insert("doc".to_string(), doc);
        if put_where(&self.client, table, item, exists).await? {
            Ok(())
        } else {
            Err(conflict)
        }
    }

    async fn delete(&self, table: &str, key: Item) -> Result<bool, StoreError> {
        let out = self
            .client
            .delete_item()
            .table_name(table)
            .set_key(Some(key))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out.attributes().is_some_and(|a| !a.is_empty()))
    }

    async fn get(&self, table: &str, key: Item) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out.item)
    }
}

#[async_trait]
impl SubscriptionStore for DynamoSubscriptionStore {
    async fn get_topic(&self, name: &str) -> Result<Option<Topic>, StoreError> {
        let key = HashMap::from([("name".to_string(), s(name))]);
        self.get(&self.tables.topics, key)
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    async fn list_topics(&self) -> Result<Vec<Topic>, StoreError> {
        let mut topics = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let out = self
                .client
                .scan()
                .table_name(&self.tables.topics)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(unavailable)?;
            for item in out.items() {
                topics.push(decode(item)?);
            }
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        topics.sort_by(|a: &Topic, b| a.name.cmp(&b.name));
        Ok(topics)
    }

    async fn create_topic(&self, topic: &Topic) -> Result<(), StoreError> {
        let key = HashMap::from([("name".to_string(), s(&topic.name))]);
        let conflict = StoreError::AlreadyExists(format!("topic {}", topic.name));
        self.put_if(&self.tables.topics, key, encode(topic)?, false, conflict)
            .await
    }

    async fn replace_topic(&self, topic: &Topic) -> Result<(), StoreError> {
        let key = HashMap::from([("name".to_string(), s(&topic.name))]);
        let conflict = StoreError::Unavailable(format!("topic {} does not exist", topic.name));
        self.put_if(&self.tables.topics, key, encode(topic)?, true, conflict)
            .await
    }

    async fn delete_topic(&self, name: &str) -> Result<bool, StoreError> {
        let key = HashMap::from([("name".to_string(), s(name))]);
        self.delete(&self.tables.topics, key).await
    }

    async fn replace_subscription(&self, sub: &mut Subscription) -> Result<(), StoreError> {
        self.replace_subscription_record(sub).await
    }

    async fn get_subscription(
        &self,
        topic: &str,
        name: &str,
    ) -> Result<Option<Subscription>, StoreError> {
        let key = subscription_key(topic, name);
        self.get(&self.tables.subscriptions, key)
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    async fn list_subscriptions(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        let mut subs = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.tables.subscriptions)
                .key_condition_expression("#t = :t")
                .expression_attribute_names("#t", "topic")
                .expression_attribute_values(":t", s(topic))
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(unavailable)?;
            for item in out.items() {
                subs.push(decode(item)?);
            }
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        Ok(subs)
    }

    async fn create_subscription(&self, sub: &Subscription) -> Result<(), StoreError> {
        self.create_subscription_record(sub).await
    }

    async fn delete_subscription(&self, topic: &str, name: &str) -> Result<bool, StoreError> {
        let key = subscription_key(topic, name);
        self.delete(&self.tables.subscriptions, key).await
    }

    async fn delete_subscription_if_unchanged(
        &self,
        sub: &Subscription,
    ) -> Result<bool, StoreError> {
        let mut request = self
            .client
            .delete_item()
            .table_name(&self.tables.subscriptions)
            .set_key(Some(subscription_key(&sub.topic, &sub.name)))
            .expression_attribute_names("#n", "name")
            .expression_attribute_names("#ver", VERSION_ATTRIBUTE)
            .expression_attribute_names("#sid", ID_ATTRIBUTE)
            .expression_attribute_values(":ver", AttributeValue::N(sub.version.to_string()));
        // Records written before ids existed have no id attribute, and before versions no
        // version attribute (version 0), as `replace_subscription_record` reads them.
        let id = if sub.id.is_empty() {
            "attribute_not_exists(#sid)"
        } else {
            request = request.expression_attribute_values(":sid", s(&sub.id));
            "#sid = :sid"
        };
        let version = if sub.version == 0 {
            "(attribute_not_exists(#ver) OR #ver = :ver)"
        } else {
            "#ver = :ver"
        };
        let condition = format!("attribute_exists(#n) AND {id} AND {version}");
        written(request.condition_expression(condition).send().await)
    }
}
