//! Topics and event subscriptions: what a user configures, validated on the way in.
//!
//! These are the records kept in the subscription store and printed by the command line, with
//! Event Grid's field names (camelCase) so `show` output reads like `az eventgrid`'s.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::caps::DeliveryCaps;
use crate::classify::StatusTableName;
use crate::delivery_attributes::{self, DeliveryAttributeMapping, DeliveryAttributeRequest};
use crate::filter::EventFilter;
use crate::limits::{
    EVENT_TTL_MINUTES, LimitError, MAX_DELIVERY_ATTEMPTS, MAX_EVENTS_PER_BATCH,
    PREFERRED_BATCH_SIZE_KB, check_range, validate_subscription_name, validate_topic_name,
};
use crate::schema::{DeliverySchema, InputMapping, InputSchema};
use crate::signing::{Signing, SigningSecret};
use crate::validation::{Provisioning, ProvisioningState};

/// A topic: a named publish endpoint with two keys (either one authorizes a publish).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Topic {
    pub name: String,
    pub key1: String,
    pub key2: String,
    /// What publishers send (F1, F2, F3).
    #[serde(default)]
    pub input_schema: InputSchema,
    /// F3: how custom events fill the Event Grid envelope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_mapping: Option<InputMapping>,
    pub created_at: DateTime<Utc>,
}

impl Topic {
    /// A topic with two fresh keys.
    pub fn with_new_keys(name: &str, now: DateTime<Utc>) -> Self {
        Self {
            name: name.to_string(),
            key1: Self::new_key(),
            key2: Self::new_key(),
            input_schema: InputSchema::default(),
            input_mapping: None,
            created_at: now,
        }
    }

    /// Sets the input schema and, for the custom schema, its mapping; a mapping for another
    /// schema is refused.
    pub fn with_input_schema(
        mut self,
        schema: InputSchema,
        mapping: Option<InputMapping>,
    ) -> Result<Self, LimitError> {
        if mapping.is_some() && schema != InputSchema::CustomEventSchema {
            return Err(LimitError::new(
                "inputMappingFields",
                format!("a mapping for inputSchema {schema}"),
                "mappings only with inputSchema customeventschema",
            ));
        }
        self.input_schema = schema;
        self.input_mapping = mapping;
        Ok(self)
    }

    /// A key as Event Grid makes them: base64 of 32 random bytes (SAS signing decodes it).
    pub fn new_key() -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>())
    }

    /// The `topic` field stamped on every event published to this topic.
    pub fn resource_id(&self) -> String {
        topic_resource_id(&self.name)
    }
}

/// The path of a topic's publish endpoint, as Event Grid's publish protocol has it.
pub fn publish_path(topic: &str) -> String {
    format!("/topics/{topic}/api/events")
}

/// The resource path of a topic, as events carry it in their `topic` field (F1).
pub fn topic_resource_id(name: &str) -> String {
    format!("/gridrelay/topics/{name}")
}

/// Batching settings of one subscription (B1 to B4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchPolicy {
    pub max_events_per_batch: u32,
    pub preferred_batch_size_in_kilobytes: u32,
}

impl BatchPolicy {
    /// B1: batching off, one event per request.
    pub const DEFAULT_MAX_EVENTS: u32 = 1;
    /// B3: default preferred size when only the event count is given.
    pub const DEFAULT_PREFERRED_KB: u32 = 64;

    /// B1, B4: an unset setting takes its default; out-of-range values are refused.
    pub fn from_settings(
        max_events: Option<i64>,
        preferred_kb: Option<i64>,
    ) -> Result<Self, LimitError> {
        let max_events_per_batch = match max_events {
            Some(v) => check_range("maxEventsPerBatch", v, &MAX_EVENTS_PER_BATCH)?,
            None => Self::DEFAULT_MAX_EVENTS,
        };
        let preferred_batch_size_in_kilobytes = match preferred_kb {
            Some(v) => check_range("preferredBatchSizeInKilobytes", v, &PREFERRED_BATCH_SIZE_KB)?,
            None => Self::DEFAULT_PREFERRED_KB,
        };
        Ok(Self {
            max_events_per_batch,
            preferred_batch_size_in_kilobytes,
        })
    }

    pub fn preferred_bytes(&self) -> usize {
        self.preferred_batch_size_in_kilobytes as usize * 1024
    }
}

impl Default for BatchPolicy {
    fn default() -> Self {
        Self {
            max_events_per_batch: Self::DEFAULT_MAX_EVENTS,
            preferred_batch_size_in_kilobytes: Self::DEFAULT_PREFERRED_KB,
        }
    }
}

/// Retry policy of one subscription (R5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    pub max_delivery_attempts: u32,
    pub event_time_to_live_in_minutes: u32,
}

impl RetryPolicy {
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 30;
    pub const DEFAULT_TTL_MINUTES: u32 = 1440;

    pub fn from_settings(
        max_attempts: Option<i64>,
        ttl_minutes: Option<i64>,
    ) -> Result<Self, LimitError> {
        Ok(Self {
            max_delivery_attempts: match max_attempts {
                Some(v) => check_range("maxDeliveryAttempts", v, &MAX_DELIVERY_ATTEMPTS)?,
                None => Self::DEFAULT_MAX_ATTEMPTS,
            },
            event_time_to_live_in_minutes: match ttl_minutes {
                Some(v) => check_range("eventTimeToLiveInMinutes", v, &EVENT_TTL_MINUTES)?,
                None => Self::DEFAULT_TTL_MINUTES,
            },
        })
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_delivery_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            event_time_to_live_in_minutes: Self::DEFAULT_TTL_MINUTES,
        }
    }
}

/// The longest dead-letter key prefix.
pub const MAX_DEAD_LETTER_PREFIX_BYTES: usize = 512;

/// Where undeliverable events of a subscription are written (L3): an S3 bucket and key prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterDestination {
    pub bucket: String,
    pub prefix: String,
}

impl DeadLetterDestination {
    /// Parses `s3://BUCKET` or `s3://BUCKET/PREFIX`.
    pub fn parse(text: &str) -> Result<Self, LimitError> {
        let allowed = "s3://BUCKET[/PREFIX] with a bucket name of 3 to 63 lowercase letters, digits, '.' and '-', and a prefix of at most 512 bytes";
        let invalid = || LimitError::new("deadLetterDestination", format!("{text:?}"), allowed);
        let rest = text.strip_prefix("s3://").ok_or_else(invalid)?;
        let (bucket, prefix) = match rest.split_once('/') {
            Some((b, p)) => (b, p.trim_matches('/')),
            None => (rest, ""),
        };
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
            && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
            && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
        // S3 keys take 1,024 bytes; the rest of a key is topic, subscription, hour and ids.
        if !bucket_ok || prefix.len() > MAX_DEAD_LETTER_PREFIX_BYTES {
            return Err(invalid());
        }
        Ok(Self {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// An event subscription: which endpoint gets a topic's events, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscription {
    pub topic: String,
    pub name: String,
    /// Which subscription this is: made new for every subscription created, so a subscription
    /// deleted and created again under the same name is another one. Every message for it
    /// carries the id, and events of another id are not delivered to it. Empty in records
    /// written before ids existed.
    #[serde(default)]
    pub id: String,
    /// Bumped by every write after the first; a write is made only over the version it read
    /// (see `SubscriptionStore::replace_subscription`), so concurrent writers cannot undo
    /// each other's changes.
    #[serde(default)]
    pub version: u64,
    pub endpoint: String,
    #[serde(default)]
    pub batching: BatchPolicy,
    #[serde(default)]
    pub retry_policy: RetryPolicy,
    /// Requests in flight and events per second it may be sent at most, whatever is waiting.
    #[serde(default, skip_serializing_if = "DeliveryCaps::is_unset")]
    pub delivery_caps: DeliveryCaps,
    #[serde(default)]
    pub dead_letter_destination: Option<DeadLetterDestination>,
    /// S6: which status-code classification table applies (a record without one was made
    /// under the 2020 revision and keeps it).
    #[serde(default = "StatusTableName::unrecorded")]
    pub status_table: StatusTableName,
    /// Which events this subscription receives.
    #[serde(default)]
    pub filter: EventFilter,
    /// The schema its endpoint receives events in.
    #[serde(default)]
    pub event_delivery_schema: DeliverySchema,
    /// H1: headers sent with every delivery (secret values are in the secret store).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delivery_attribute_mappings: Vec<DeliveryAttributeMapping>,
    /// Signed deliveries (Standard Webhooks): the ids of its signing secrets in the secret store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing: Option<Signing>,
    /// Whether its endpoint agreed to receive events (the validation handshake). A record
    /// without one was never validated, and receives nothing.
    #[serde(default = "Provisioning::unrecorded")]
    pub provisioning: Provisioning,
    pub created_at: DateTime<Utc>,
}

impl Subscription {
    /// Whether events are delivered to it: only once its endpoint is validated.
    pub fn delivers(&self) -> bool {
        self.provisioning.state == ProvisioningState::Succeeded
    }
}

/// What a user asks for when creating a subscription, before validation.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionRequest {
    pub topic: String,
    pub name: String,
    pub endpoint: String,
    pub max_events_per_batch: Option<i64>,
    pub preferred_batch_size_in_kilobytes: Option<i64>,
    pub max_delivery_attempts: Option<i64>,
    pub event_ttl_minutes: Option<i64>,
    pub max_concurrent_requests: Option<i64>,
    pub max_events_per_second: Option<i64>,
    pub dead_letter_destination: Option<String>,
    pub status_table: Option<String>,
    pub filter: EventFilter,
    /// Defaults to the topic's input schema.
    pub event_delivery_schema: Option<String>,
    /// H1: delivery headers.
    pub delivery_attributes: Vec<DeliveryAttributeRequest>,
    /// Sign every delivery with this secret (Standard Webhooks); registration stores it.
    pub signing_secret: Option<SigningSecret>,
}

impl SubscriptionRequest {
    /// Validates every field and builds the subscription record, for a topic whose events
    /// are in `input`.
    pub fn validate(
        &self,
        input: InputSchema,
        now: DateTime<Utc>,
    ) -> Result<Subscription, LimitError> {
        validate_topic_name(&self.topic)?;
        validate_subscription_name(&self.name)?;
        let endpoint = validate_endpoint(&self.endpoint)?;
        self.filter.validate()?;
        let event_delivery_schema = match &self.event_delivery_schema {
            Some(s) => s.parse::<DeliverySchema>()?,
            None => input.default_delivery(),
        };
        event_delivery_schema.check_compatible(input)?;
        delivery_attributes::check_all(&self.delivery_attributes)?;
        Ok(Subscription {
            topic: self.topic.clone(),
            name: self.name.clone(),
            id: new_subscription_id(),
            version: 0,
            endpoint,
            batching: BatchPolicy::from_settings(
                self.max_events_per_batch,
                self.preferred_batch_size_in_kilobytes,
            )?,
            retry_policy: RetryPolicy::from_settings(
                self.max_delivery_attempts,
                self.event_ttl_minutes,
            )?,
            delivery_caps: DeliveryCaps::from_settings(
                self.max_concurrent_requests,
                self.max_events_per_second,
            )?,
            dead_letter_destination: self
                .dead_letter_destination
                .as_deref()
                .map(DeadLetterDestination::parse)
                .transpose()?,
            status_table: match &self.status_table {
                Some(t) => t.parse()?,
                None => StatusTableName::default(),
            },
            filter: self.filter.clone(),
            event_delivery_schema,
            delivery_attribute_mappings: delivery_attributes::mappings(&self.delivery_attributes),
            // Set by registration once the secret is stored.
            signing: None,
            provisioning: Provisioning::creating(),
            created_at: now,
        })
    }
}

/// A fresh subscription id: 16 random bytes as hex.
pub fn new_subscription_id() -> String {
    crate::validation::hex(&rand::random::<[u8; 16]>())
}

/// A webhook endpoint must be an absolute http or https URL with a host.
pub fn validate_endpoint(text: &str) -> Result<String, LimitError> {
    // Never the URL as given: it may hold credentials.
    let invalid = || {
        LimitError::new(
            "endpoint",
            format!("{:?}", crate::outbound::redact_endpoint(text)),
            "an absolute http:// or https:// URL",
        )
    };
    let url = url::Url::parse(text).map_err(|_| invalid())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(invalid());
    }
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// B1, B4: unset settings take their defaults.
    #[test]
    fn batching_defaults_b1_b4() {
        assert_eq!(
            BatchPolicy::from_settings(None, None).unwrap(),
            BatchPolicy::default()
        );
        let p = BatchPolicy::from_settings(Some(100), None).unwrap();
        assert_eq!(
            (p.max_events_per_batch, p.preferred_batch_size_in_kilobytes),
            (100, 64)
        );
        let p = BatchPolicy::from_settings(None, Some(512)).unwrap();
        assert_eq!(
            (p.max_events_per_batch, p.preferred_batch_size_in_kilobytes),
            (1, 512)
        );
    }

    /// B4: out-of-range settings are refused, naming the setting and range.
    #[test]
    fn batching_out_of_range_is_refused_b4() {
        let err = BatchPolicy::from_settings(Some(0), None).unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.value.as_str()),
            ("maxEventsPerBatch", "0")
        );
        let err = BatchPolicy::from_settings(None, Some(1025)).unwrap_err();
        assert_eq!(err.field, "preferredBatchSizeInKilobytes");
        assert_eq!(err.allowed, "1 to 1024");
    }

    /// R5: defaults 30 attempts and 1440 minutes; limits enforced.
    #[test]
    fn retry_policy_defaults_and_limits_r5() {
        assert_eq!(
            RetryPolicy::from_settings(None, None).unwrap(),
            RetryPolicy::default()
        );
        assert_eq!(RetryPolicy::default().max_delivery_attempts, 30);
        assert_eq!(RetryPolicy::default().event_time_to_live_in_minutes, 1440);
        assert_eq!(
            RetryPolicy::from_settings(Some(31), None)
                .unwrap_err()
                .field,
            "maxDeliveryAttempts"
        );
        assert_eq!(
            RetryPolicy::from_settings(None, Some(1441))
                .unwrap_err()
                .field,
            "eventTimeToLiveInMinutes"
        );
    }

    /// L3: the dead-letter destination is an S3 bucket and prefix.
    #[test]
    fn dead_letter_destination_parses_s3_urls_l3() {
        let d = DeadLetterDestination::parse("s3://my-bucket/dead/letters/").unwrap();
        assert_eq!(
            (d.bucket.as_str(), d.prefix.as_str()),
            ("my-bucket", "dead/letters")
        );
        assert_eq!(
            DeadLetterDestination::parse("s3://my-bucket")
                .unwrap()
                .prefix,
            ""
        );
        for bad in [
            "my-bucket",
            "s3://",
            "s3://UPPER/x",
            "https://x/y",
            "s3://ab",
        ] {
            assert!(DeadLetterDestination::parse(bad).is_err(), "{bad}");
        }
        let longest = format!("s3://b-1/{}", "p".repeat(MAX_DEAD_LETTER_PREFIX_BYTES));
        assert!(DeadLetterDestination::parse(&longest).is_ok());
        let e = DeadLetterDestination::parse(&format!("{longest}q")).unwrap_err();
        assert!(e.allowed.contains("at most 512 bytes"), "{e}");
    }

    /// Item 5 of the life-cycle issue: a record written without a provisioning state was never
    /// validated, so it does not receive events (it used to default to `Succeeded`).
    #[test]
    fn a_record_without_provisioning_state_does_not_deliver() {
        let sub: Subscription = serde_json::from_value(serde_json::json!({
            "topic": "orders",
            "name": "s1",
            "endpoint": "https://example.com/hook",
            "createdAt": "2026-11-23T00:00:00Z",
        }))
        .unwrap();
        assert!(!sub.delivers());
        assert_eq!(sub.provisioning.state, ProvisioningState::Failed);
        assert_eq!((sub.id.as_str(), sub.version), ("", 0));
    }

    /// Every subscription created gets an id of its own.
    #[test]
    fn every_new_subscription_has_its_own_id() {
        let request = SubscriptionRequest {
            topic: "orders".into(),
            name: "audit".into(),
            endpoint: "https://example.com/hook".into(),
            ..SubscriptionRequest::default()
        };
        let now = Utc::now();
        let a = request.validate(InputSchema::EventGridSchema, now).unwrap();
        let b = request.validate(InputSchema::EventGridSchema, now).unwrap();
        assert_eq!(a.id.len(), 32);
        assert_ne!(a.id, b.id);
        assert_eq!(a.version, 0);
    }

    #[test]
    fn endpoint_must_be_http_url() {
        // The form only: where it may point is the outbound policy's (`outbound`).
        assert!(validate_endpoint("https://hooks.example.com/hook").is_ok());
        assert_eq!(
            validate_endpoint("http://0x7f.1:8080/hook").as_deref(),
            Ok("http://127.0.0.1:8080/hook"),
            "stored in its one spelling"
        );
        assert!(validate_endpoint("ftp://x").is_err());
        assert!(validate_endpoint("not a url").is_err());
    }
}
