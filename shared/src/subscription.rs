//! Topics and event subscriptions: what a user configures, validated on the way in.
//!
//! These are the records kept in the subscription store and printed by the command line, with
//! Event Grid's field names (camelCase) so `show` output reads like `az eventgrid`'s.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::caps::DeliveryCaps;
use crate::classify::StatusTableName;
use crate::delivery_attributes::{self, DeliveryAttributeMapping, DeliveryAttributeRequest};
use crate::destination::{EndpointType, ResourceDestination};
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
    /// The user's own tags (`--tags KEY=VALUE`), kept and shown, as on an Azure resource.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tags: std::collections::BTreeMap<String, String>,
    /// Days the topic's archive keeps what it accepted, for replays (#35): 0 (none) to 365
    /// ([`crate::archive::RETENTION_DAYS`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retention_days: u16,
    /// P1: seconds within which an event id the topic accepted is not delivered again: 0
    /// (off) to [`crate::dedup::MAX_DEDUP_WINDOW_SECONDS`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dedup_window_seconds: u16,
    pub created_at: DateTime<Utc>,
}

fn is_zero(days: &u16) -> bool {
    *days == 0
}

/// Tags per topic (as on an Azure resource).
pub const MAX_TAGS: usize = 50;
/// Characters per tag name.
pub const MAX_TAG_NAME_CHARS: usize = 512;
/// Characters per tag value.
pub const MAX_TAG_VALUE_CHARS: usize = 256;

/// Parses `KEY=VALUE` words into tags: at most 50, names of 1 to 512 characters, values of at
/// most 256, each name once.
pub fn parse_tags(
    words: &[String],
) -> Result<std::collections::BTreeMap<String, String>, LimitError> {
    if words.len() > MAX_TAGS {
        return Err(LimitError::new(
            "tags",
            format!("{} tags", words.len()),
            format!("at most {MAX_TAGS}"),
        ));
    }
    let mut tags = std::collections::BTreeMap::new();
    for word in words {
        let (name, value) = word.split_once('=').unwrap_or((word, ""));
        let name_chars = name.chars().count();
        if name_chars == 0 || name_chars > MAX_TAG_NAME_CHARS || name.chars().any(char::is_control)
        {
            return Err(LimitError::new(
                "tags",
                format!("{word:?}"),
                format!("KEY=VALUE with a key of 1 to {MAX_TAG_NAME_CHARS} characters"),
            ));
        }
        if value.chars().count() > MAX_TAG_VALUE_CHARS || value.chars().any(char::is_control) {
            return Err(LimitError::new(
                "tags",
                format!("the value of {name} ({} characters)", value.chars().count()),
                format!("at most {MAX_TAG_VALUE_CHARS} characters, without control characters"),
            ));
        }
        if tags.insert(name.to_string(), value.to_string()).is_some() {
            return Err(LimitError::new(
                "tags",
                format!("{name:?} twice"),
                "each key once",
            ));
        }
    }
    Ok(tags)
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
            tags: Default::default(),
            retention_days: 0,
            dedup_window_seconds: 0,
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
    /// Where events go: a webhook's URL, or an AWS resource's ARN (`endpoint_type`).
    pub endpoint: String,
    /// What kind of endpoint it is (S4); webhook in records written before there were others.
    #[serde(default, skip_serializing_if = "is_webhook")]
    pub endpoint_type: EndpointType,
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
    /// A new endpoint asked for by `update`, waiting for its own handshake: events go on to
    /// the validated `endpoint` until the new one agrees and takes its place. A change that
    /// failed stays here, saying why, and changes nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_change: Option<EndpointChange>,
    /// The user's own tags, kept and shown (`--labels`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// When the subscription ends: from then on it receives nothing, and it is deleted
    /// (`--expiration-date`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_time_utc: Option<DateTime<Utc>>,
    /// How many bytes of each answer's body the delivery journal keeps (#35,
    /// `--journal-answer-bytes`); unset: [`crate::journal::DEFAULT_ANSWER_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_answer_bytes: Option<u16>,
    /// A1: a bearer token from an OAuth 2.0 token endpoint with every delivery (webhooks
    /// only; the client secret is in the secret store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_auth: Option<crate::oauth::DeliveryAuth>,
    /// O1: the events that share this key's value are delivered in the order they were
    /// accepted (`--ordering-key`); unset, no order is kept (G2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<crate::ordering::OrderingKey>,
    pub created_at: DateTime<Utc>,
}

/// A new endpoint for a subscription that has a validated one, and its handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointChange {
    pub endpoint: String,
    pub provisioning: Provisioning,
    pub requested_at: DateTime<Utc>,
}

/// Which handshake of a subscription: its own (at create) or its endpoint change's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    Subscription,
    EndpointChange,
}

fn is_webhook(t: &EndpointType) -> bool {
    *t == EndpointType::WebHook
}

impl Subscription {
    /// Its AWS resource destination, if it delivers to one (a record that does not parse as
    /// one, which validation never writes, is `None`).
    pub fn resource(&self) -> Option<ResourceDestination> {
        self.endpoint_type
            .is_resource()
            .then(|| ResourceDestination::parse(self.endpoint_type, &self.endpoint).ok())
            .flatten()
    }

    /// Whether events are delivered to it: only once its endpoint is validated.
    pub fn delivers(&self) -> bool {
        self.provisioning.state == ProvisioningState::Succeeded
    }

    /// Whether its expiration time has come.
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.expiration_time_utc.is_some_and(|at| now >= at)
    }

    /// Whether events published at `now` go to it: validated and not expired.
    pub fn receives(&self, now: DateTime<Utc>) -> bool {
        self.delivers() && !self.is_expired(now)
    }

    /// The endpoint a handshake asks, and its provisioning state.
    pub fn handshake(&self, which: Handshake) -> Option<(&str, &Provisioning)> {
        match which {
            Handshake::Subscription => Some((&self.endpoint, &self.provisioning)),
            Handshake::EndpointChange => self
                .endpoint_change
                .as_ref()
                .map(|c| (c.endpoint.as_str(), &c.provisioning)),
        }
    }

    /// The provisioning a handshake writes.
    pub fn handshake_provisioning_mut(&mut self, which: Handshake) -> Option<&mut Provisioning> {
        match which {
            Handshake::Subscription => Some(&mut self.provisioning),
            Handshake::EndpointChange => self.endpoint_change.as_mut().map(|c| &mut c.provisioning),
        }
    }

    /// Records where a handshake ended. An endpoint change that succeeded takes the place of
    /// the endpoint; one that did not stays beside it, saying why.
    pub fn settle_handshake(&mut self, which: Handshake, provisioning: Provisioning) {
        match which {
            Handshake::Subscription => self.provisioning = provisioning,
            Handshake::EndpointChange => {
                let Some(change) = self.endpoint_change.take() else {
                    return;
                };
                if provisioning.state == ProvisioningState::Succeeded {
                    self.endpoint = change.endpoint;
                    self.provisioning.detail = Some(format!(
                        "endpoint changed at {}: {}",
                        change.requested_at.to_rfc3339(),
                        provisioning.detail.unwrap_or_default()
                    ));
                } else {
                    self.endpoint_change = Some(EndpointChange {
                        provisioning,
                        ..change
                    });
                }
            }
        }
    }
}

/// What a user asks for when creating a subscription, before validation.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionRequest {
    pub topic: String,
    pub name: String,
    pub endpoint: String,
    /// `--endpoint-type`; unset, an ARN's service names it and anything else is a webhook.
    pub endpoint_type: Option<String>,
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
    pub labels: Vec<String>,
    pub expiration_time_utc: Option<DateTime<Utc>>,
    /// Bytes of each answer's body the journal keeps (#35).
    pub journal_answer_bytes: Option<i64>,
    /// A1: OAuth 2.0 client credentials (webhooks only); registration stores the secret.
    pub oauth: Option<crate::oauth::OAuthRequest>,
    /// O1: `subject` or `data.FIELD`.
    pub ordering_key: Option<String>,
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
        let endpoint_type = match &self.endpoint_type {
            Some(t) => t.parse::<EndpointType>()?,
            None => EndpointType::of_arn(&self.endpoint).unwrap_or_default(),
        };
        let endpoint = if endpoint_type.is_resource() {
            ResourceDestination::parse(endpoint_type, &self.endpoint)?.arn
        } else {
            validate_endpoint(&self.endpoint)?
        };
        self.filter.validate()?;
        let event_delivery_schema = match &self.event_delivery_schema {
            Some(s) => s.parse::<DeliverySchema>()?,
            None => input.default_delivery(),
        };
        event_delivery_schema.check_compatible(input)?;
        delivery_attributes::check_all(&self.delivery_attributes)?;
        check_labels(&self.labels)?;
        if let Some(at) = self.expiration_time_utc
            && at <= now
        {
            return Err(LimitError::new(
                "expirationTimeUtc",
                at.to_rfc3339(),
                format!("a time in the future (now: {})", now.to_rfc3339()),
            ));
        }
        let batching = BatchPolicy::from_settings(
            self.max_events_per_batch,
            self.preferred_batch_size_in_kilobytes,
        )?;
        if endpoint_type.is_resource() {
            check_resource_settings(self, endpoint_type, &batching)?;
        }
        let sub = Subscription {
            topic: self.topic.clone(),
            name: self.name.clone(),
            id: new_subscription_id(),
            version: 0,
            endpoint,
            endpoint_type,
            batching,
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
            // An AWS resource has no handshake: it was checked when the subscription was
            // registered (it exists, and the installation may deliver to it).
            provisioning: if endpoint_type.is_resource() {
                Provisioning::with_state(
                    ProvisioningState::Succeeded,
                    Some(format!(
                        "{} destination: no validation handshake",
                        endpoint_type.as_str()
                    )),
                )
            } else {
                Provisioning::creating()
            },
            endpoint_change: None,
            labels: self.labels.clone(),
            expiration_time_utc: self.expiration_time_utc,
            journal_answer_bytes: crate::journal::validate_answer_bytes(self.journal_answer_bytes)?,
            // Its secret's id is set by registration once the secret is stored.
            delivery_auth: self
                .oauth
                .as_ref()
                .map(|o| o.validate().map(crate::oauth::DeliveryAuth::OAuth2))
                .transpose()?,
            ordering_key: self.ordering_key.as_deref().map(str::parse).transpose()?,
            created_at: now,
        };
        check_delivery_auth(&sub)?;
        Ok(sub)
    }
}

/// What an AWS resource destination does not take: batching settings (one message per event,
/// except a Lambda function, which takes a batch), delivery headers and signatures (HTTP
/// only).
fn check_resource_settings(
    request: &SubscriptionRequest,
    endpoint_type: EndpointType,
    batching: &BatchPolicy,
) -> Result<(), LimitError> {
    let not_here = |field: &str, value: String, what: &str| {
        LimitError::new(
            field,
            value,
            format!(
                "unset for a {} endpoint ({what})",
                endpoint_type.flag_name()
            ),
        )
    };
    if !endpoint_type.takes_batches() && *batching != BatchPolicy::default() {
        let (field, value) = match request.max_events_per_batch {
            Some(n) if n != 1 => ("maxEventsPerBatch", n),
            _ => (
                "preferredBatchSizeInKilobytes",
                request
                    .preferred_batch_size_in_kilobytes
                    .unwrap_or_default(),
            ),
        };
        return Err(not_here(
            field,
            value.to_string(),
            "it receives one message per event; batching applies to webhook and lambda endpoints",
        ));
    }
    if let Some(first) = request.delivery_attributes.first() {
        return Err(not_here(
            "deliveryAttributeMappings",
            format!("{:?}", first.name),
            "delivery headers are sent to webhooks only; event type, subject and id ride as message attributes",
        ));
    }
    if request.signing_secret.is_some() {
        return Err(not_here(
            "signingSecret",
            "(given)".to_string(),
            "signatures are for webhooks; IAM decides who may write to the resource",
        ));
    }
    if request.oauth.is_some() {
        return Err(not_here(
            "--delivery-auth",
            "\"oauth2\"".to_string(),
            "OAuth tokens are for webhooks; IAM decides who may write to the resource",
        ));
    }
    Ok(())
}

/// A1: a subscription whose deliveries carry OAuth bearer tokens has no other credentials
/// that would go in the same `Authorization` header: no delivery header of that name and no
/// `user:password@` in its endpoint (either would be dropped without a word).
fn check_delivery_auth(sub: &Subscription) -> Result<(), LimitError> {
    if sub.delivery_auth.is_none() {
        return Ok(());
    }
    let allowed =
        "unset with --delivery-auth oauth2 (its bearer token is the Authorization header)";
    if let Some(m) = sub
        .delivery_attribute_mappings
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case("authorization"))
    {
        return Err(LimitError::new(
            "deliveryAttributeMappings",
            format!("{:?}", m.name),
            allowed,
        ));
    }
    let endpoints =
        std::iter::once(&sub.endpoint).chain(sub.endpoint_change.iter().map(|c| &c.endpoint));
    for endpoint in endpoints {
        if url::Url::parse(endpoint)
            .is_ok_and(|u| !u.username().is_empty() || u.password().is_some())
        {
            return Err(LimitError::new(
                "endpoint",
                format!("{:?}", crate::outbound::redact_endpoint(endpoint)),
                format!("a URL without user:password@, {allowed}"),
            ));
        }
    }
    Ok(())
}

/// Labels per subscription.
pub const MAX_LABELS: usize = 25;
/// Characters per label.
pub const MAX_LABEL_CHARS: usize = 256;

/// At most 25 labels of 1 to 256 characters, without control characters.
pub fn check_labels(labels: &[String]) -> Result<(), LimitError> {
    if labels.len() > MAX_LABELS {
        return Err(LimitError::new(
            "labels",
            format!("{} labels", labels.len()),
            format!("at most {MAX_LABELS}"),
        ));
    }
    for label in labels {
        let chars = label.chars().count();
        if chars == 0 || chars > MAX_LABEL_CHARS || label.chars().any(char::is_control) {
            return Err(LimitError::new(
                "labels",
                format!("{label:?} ({chars} characters)"),
                format!("1 to {MAX_LABEL_CHARS} characters without control characters"),
            ));
        }
    }
    Ok(())
}

/// Parses an expiration as `az` takes it: an RFC 3339 time, a date and time without a zone
/// (UTC), or a date (its midnight, UTC).
pub fn parse_expiration(text: &str) -> Result<DateTime<Utc>, LimitError> {
    let t = text.trim();
    if let Ok(at) = DateTime::parse_from_rfc3339(t) {
        return Ok(at.to_utc());
    }
    for form in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M"] {
        if let Ok(at) = chrono::NaiveDateTime::parse_from_str(t, form) {
            return Ok(at.and_utc());
        }
    }
    if let Ok(day) = chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return Ok(day.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    Err(LimitError::new(
        "expirationTimeUtc",
        format!("{text:?}"),
        "a date (2026-12-31) or a time (2026-12-31T18:00:00Z; without a zone: UTC)",
    ))
}

/// What `event-subscription update` changes: each setting given replaces the stored one; the
/// rest stay. Every value is checked as at create.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionUpdate {
    pub endpoint: Option<String>,
    /// Must be the subscription's own: an update does not change the kind of endpoint.
    pub endpoint_type: Option<String>,
    pub max_events_per_batch: Option<i64>,
    pub preferred_batch_size_in_kilobytes: Option<i64>,
    pub max_delivery_attempts: Option<i64>,
    pub event_ttl_minutes: Option<i64>,
    pub max_concurrent_requests: Option<i64>,
    pub max_events_per_second: Option<i64>,
    /// `Some("")` removes the dead-letter destination.
    pub dead_letter_destination: Option<String>,
    pub status_table: Option<String>,
    pub event_delivery_schema: Option<String>,
    pub included_event_types: Option<Vec<String>>,
    pub subject_begins_with: Option<String>,
    pub subject_ends_with: Option<String>,
    pub subject_case_sensitive: Option<bool>,
    pub advanced_filters: Option<Vec<crate::filter::AdvancedFilter>>,
    pub enable_advanced_filtering_on_arrays: Option<bool>,
    /// Replaces every delivery header.
    pub delivery_attributes: Option<Vec<DeliveryAttributeRequest>>,
    pub labels: Option<Vec<String>>,
    /// `Some(None)` removes the expiration.
    pub expiration_time_utc: Option<Option<DateTime<Utc>>>,
    pub journal_answer_bytes: Option<i64>,
    /// A1: `Some(Some(_))` replaces the OAuth 2.0 client credentials whole (the secret given
    /// again), `Some(None)` removes them; `None` keeps them.
    pub oauth: Option<Option<crate::oauth::OAuthRequest>>,
    /// O1: a new ordering key; `Some("none")` removes it, `None` keeps it.
    pub ordering_key: Option<String>,
}

/// A subscription as `update` leaves it, and the handshake it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Updated {
    pub subscription: Subscription,
    /// A new endpoint to validate: the subscription's own (it had no validated endpoint) or an
    /// endpoint change (it goes on delivering to the validated one meanwhile).
    pub handshake: Option<Handshake>,
}

impl SubscriptionUpdate {
    /// The request that would create the subscription as updated: the stored settings with the
    /// given ones in their place. Delivery headers are left out unless given (stored secret
    /// values are not readable here): see [`SubscriptionUpdate::apply`].
    fn request(&self, current: &Subscription) -> SubscriptionRequest {
        let f = &current.filter;
        let caps = current.delivery_caps;
        let or = |given: Option<i64>, stored: Option<u32>| given.or(stored.map(i64::from));
        SubscriptionRequest {
            topic: current.topic.clone(),
            name: current.name.clone(),
            endpoint: self
                .endpoint
                .clone()
                .unwrap_or_else(|| current.endpoint.clone()),
            endpoint_type: Some(current.endpoint_type.flag_name().to_string()),
            max_events_per_batch: or(
                self.max_events_per_batch,
                Some(current.batching.max_events_per_batch),
            ),
            preferred_batch_size_in_kilobytes: or(
                self.preferred_batch_size_in_kilobytes,
                Some(current.batching.preferred_batch_size_in_kilobytes),
            ),
            max_delivery_attempts: or(
                self.max_delivery_attempts,
                Some(current.retry_policy.max_delivery_attempts),
            ),
            event_ttl_minutes: or(
                self.event_ttl_minutes,
                Some(current.retry_policy.event_time_to_live_in_minutes),
            ),
            max_concurrent_requests: or(self.max_concurrent_requests, caps.max_concurrent_requests),
            max_events_per_second: or(self.max_events_per_second, caps.max_events_per_second),
            dead_letter_destination: match &self.dead_letter_destination {
                Some(given) if given.is_empty() => None,
                Some(given) => Some(given.clone()),
                None => current
                    .dead_letter_destination
                    .as_ref()
                    .map(DeadLetterDestination::url),
            },
            status_table: Some(
                self.status_table
                    .clone()
                    .unwrap_or_else(|| format!("{:?}", current.status_table)),
            ),
            filter: EventFilter {
                included_event_types: self
                    .included_event_types
                    .clone()
                    .or_else(|| f.included_event_types.clone()),
                subject_begins_with: self
                    .subject_begins_with
                    .clone()
                    .or_else(|| f.subject_begins_with.clone()),
                subject_ends_with: self
                    .subject_ends_with
                    .clone()
                    .or_else(|| f.subject_ends_with.clone()),
                is_subject_case_sensitive: self
                    .subject_case_sensitive
                    .unwrap_or(f.is_subject_case_sensitive),
                advanced_filters: self
                    .advanced_filters
                    .clone()
                    .unwrap_or_else(|| f.advanced_filters.clone()),
                enable_advanced_filtering_on_arrays: self
                    .enable_advanced_filtering_on_arrays
                    .unwrap_or(f.enable_advanced_filtering_on_arrays),
            },
            event_delivery_schema: Some(
                self.event_delivery_schema
                    .clone()
                    .unwrap_or_else(|| current.event_delivery_schema.as_str().to_string()),
            ),
            delivery_attributes: self.delivery_attributes.clone().unwrap_or_default(),
            signing_secret: None,
            labels: self
                .labels
                .clone()
                .unwrap_or_else(|| current.labels.clone()),
            expiration_time_utc: self
                .expiration_time_utc
                .unwrap_or(current.expiration_time_utc),
            journal_answer_bytes: self
                .journal_answer_bytes
                .or(current.journal_answer_bytes.map(i64::from)),
            // Given, checked as at create; kept, see `apply` (the secret is not readable here).
            oauth: self.oauth.clone().flatten(),
            ordering_key: match self.ordering_key.as_deref() {
                Some("none") => None,
                Some(given) => Some(given.to_string()),
                None => current.ordering_key.as_ref().map(ToString::to_string),
            },
        }
    }

    /// Checks the update against a topic whose events are in `input` and gives the record as
    /// updated: the same subscription (id, version, signing, creation time), its settings
    /// changed. A new endpoint of a subscription that has a validated one becomes an
    /// [`EndpointChange`], validated apart while events go on to the old one; without a
    /// validated endpoint, the new one replaces it and is validated as at create (given the
    /// same endpoint, it is asked again: how a failed handshake is retried). Given the
    /// endpoint it has, a validated subscription drops a pending change. Delivery headers
    /// given replace the stored ones (their secrets stored by the caller).
    pub fn apply(
        &self,
        current: &Subscription,
        input: InputSchema,
        now: DateTime<Utc>,
    ) -> Result<Updated, LimitError> {
        // The type asked for: given, or the one a new ARN names.
        let asked = match (&self.endpoint_type, &self.endpoint) {
            (Some(given), _) => Some((given.parse::<EndpointType>()?, given.clone())),
            (None, Some(endpoint)) => EndpointType::of_arn(endpoint)
                .filter(|_| !current.endpoint_type.is_resource())
                .map(|t| (t, t.flag_name().to_string())),
            (None, None) => None,
        };
        if let Some((asked, given)) = asked
            && asked != current.endpoint_type
        {
            return Err(LimitError::new(
                "endpointType",
                format!("{given:?}"),
                format!(
                    "{} (an update keeps the kind of endpoint; delete the subscription and create it again)",
                    current.endpoint_type.flag_name()
                ),
            ));
        }
        let mut next = self.request(current).validate(input, now)?;
        next.id = current.id.clone();
        next.version = current.version;
        next.created_at = current.created_at;
        next.signing = current.signing.clone();
        next.provisioning = current.provisioning.clone();
        next.endpoint_change = current.endpoint_change.clone();
        if self.delivery_attributes.is_none() {
            next.delivery_attribute_mappings = current.delivery_attribute_mappings.clone();
        }
        if self.oauth.is_none() {
            next.delivery_auth = current.delivery_auth.clone();
        }
        check_delivery_auth(&next)?;
        let mut handshake = None;
        if next.endpoint_type.is_resource() {
            // No handshake: a new ARN (checked by registration) takes over at once.
            next.endpoint_change = None;
        } else if next.endpoint == current.endpoint {
            if self.endpoint.is_some() && current.delivers() {
                next.endpoint_change = None;
            } else if self.endpoint.is_some() {
                // Never validated (still asking, or failed): given again, it is asked again.
                next.provisioning = Provisioning::creating();
                next.endpoint_change = None;
                handshake = Some(Handshake::Subscription);
            }
        } else if current.delivers() {
            next.endpoint_change = Some(EndpointChange {
                endpoint: std::mem::replace(&mut next.endpoint, current.endpoint.clone()),
                provisioning: Provisioning::creating(),
                requested_at: now,
            });
            handshake = Some(Handshake::EndpointChange);
        } else {
            next.provisioning = Provisioning::creating();
            next.endpoint_change = None;
            handshake = Some(Handshake::Subscription);
        }
        Ok(Updated {
            subscription: next,
            handshake,
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

    /// A1: OAuth tokens go in `Authorization`, so a subscription that takes them may not
    /// also send a delivery header of that name or carry `user:password@` in its endpoint, at
    /// create or when an update brings either together (the other kept).
    #[test]
    fn oauth_refuses_other_authorization_at_create_and_update_a1() {
        let oauth = crate::oauth::OAuthRequest {
            token_url: "https://login.example.com/token".into(),
            client_id: "c".into(),
            client_secret: "s".into(),
            ..Default::default()
        };
        let request = SubscriptionRequest {
            topic: "orders".into(),
            name: "audit".into(),
            endpoint: "https://example.com/hook".into(),
            oauth: Some(oauth.clone()),
            ..SubscriptionRequest::default()
        };
        let now = Utc::now();
        let header = DeliveryAttributeRequest::parse(&[
            "Authorization".to_string(),
            "static".to_string(),
            "Basic abc".to_string(),
        ])
        .unwrap();
        let e = SubscriptionRequest {
            delivery_attributes: vec![header.clone()],
            ..request.clone()
        }
        .validate(InputSchema::EventGridSchema, now)
        .unwrap_err();
        assert_eq!(e.field, "deliveryAttributeMappings");
        assert!(
            e.allowed.contains("--delivery-auth oauth2"),
            "{}",
            e.allowed
        );
        let e = SubscriptionRequest {
            endpoint: "https://user:pw@example.com/hook".into(),
            ..request.clone()
        }
        .validate(InputSchema::EventGridSchema, now)
        .unwrap_err();
        assert_eq!(e.field, "endpoint");
        assert!(!e.value.contains("pw"), "{}", e.value);

        // A subscription with the header, updated to take tokens; one with tokens, given the
        // header.
        let with_header = SubscriptionRequest {
            oauth: None,
            delivery_attributes: vec![header.clone()],
            ..request.clone()
        }
        .validate(InputSchema::EventGridSchema, now)
        .unwrap();
        let e = SubscriptionUpdate {
            oauth: Some(Some(oauth)),
            ..SubscriptionUpdate::default()
        }
        .apply(&with_header, InputSchema::EventGridSchema, now)
        .unwrap_err();
        assert_eq!(e.field, "deliveryAttributeMappings");
        let with_tokens = request.validate(InputSchema::EventGridSchema, now).unwrap();
        let e = SubscriptionUpdate {
            delivery_attributes: Some(vec![header]),
            ..SubscriptionUpdate::default()
        }
        .apply(&with_tokens, InputSchema::EventGridSchema, now)
        .unwrap_err();
        assert_eq!(e.field, "deliveryAttributeMappings");
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

    fn validated(request: &SubscriptionRequest, now: DateTime<Utc>) -> Subscription {
        let mut sub = request.validate(InputSchema::EventGridSchema, now).unwrap();
        sub.provisioning = Provisioning::with_state(ProvisioningState::Succeeded, None);
        sub.version = 3;
        sub
    }

    /// #12 (S4): an AWS resource's ARN names its type (or `--endpoint-type` does, and must
    /// agree); it needs no handshake; batching applies to webhooks and Lambda functions only,
    /// and delivery headers and signatures to webhooks only, each refusal naming the field.
    #[test]
    fn resource_endpoints_are_typed_by_their_arn_and_need_no_handshake_s4() {
        let now = Utc::now();
        let request = |endpoint: &str, endpoint_type: Option<&str>| SubscriptionRequest {
            topic: "orders".into(),
            name: "to-queue".into(),
            endpoint: endpoint.into(),
            endpoint_type: endpoint_type.map(str::to_string),
            ..SubscriptionRequest::default()
        };
        let queue = "arn:aws:sqs:us-east-1:123456789012:orders";
        let sub = request(queue, None)
            .validate(InputSchema::EventGridSchema, now)
            .unwrap();
        assert_eq!(sub.endpoint_type, EndpointType::Sqs);
        assert!(sub.delivers(), "no handshake for a resource");
        assert_eq!(sub.resource().unwrap().name, "orders");
        let stored: Subscription =
            serde_json::from_str(&serde_json::to_string(&sub).unwrap()).unwrap();
        assert_eq!(stored.endpoint_type, EndpointType::Sqs);

        let webhook = request("https://hooks.example.com/in", None)
            .validate(InputSchema::EventGridSchema, now)
            .unwrap();
        assert_eq!(webhook.endpoint_type, EndpointType::WebHook);
        assert!(!webhook.delivers());
        assert!(
            !serde_json::to_string(&webhook)
                .unwrap()
                .contains("endpointType"),
            "webhook records stay as they were"
        );

        let e = request(queue, Some("sns"))
            .validate(InputSchema::EventGridSchema, now)
            .unwrap_err();
        assert_eq!(e.field, "endpoint");
        assert!(e.allowed.contains("SNS"), "{e}");
        let e = request("https://hooks.example.com/in", Some("kinesis"))
            .validate(InputSchema::EventGridSchema, now)
            .unwrap_err();
        assert!(e.allowed.contains("Kinesis stream ARN"), "{e}");
        let e = request(queue, Some("queue"))
            .validate(InputSchema::EventGridSchema, now)
            .unwrap_err();
        assert_eq!(e.field, "endpointType");

        let batched = SubscriptionRequest {
            max_events_per_batch: Some(10),
            ..request(queue, None)
        };
        let e = batched
            .validate(InputSchema::EventGridSchema, now)
            .unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("maxEventsPerBatch", "10")
        );
        assert!(e.allowed.contains("one message per event"), "{e}");
        let function = SubscriptionRequest {
            max_events_per_batch: Some(10),
            ..request("arn:aws:lambda:us-east-1:123456789012:function:f", None)
        };
        assert_eq!(
            function
                .validate(InputSchema::EventGridSchema, now)
                .unwrap()
                .batching
                .max_events_per_batch,
            10
        );
        let headers = SubscriptionRequest {
            delivery_attributes: vec![
                DeliveryAttributeRequest::parse(&["X-A".into(), "static".into(), "v".into()])
                    .unwrap(),
            ],
            ..request(queue, None)
        };
        let e = headers
            .validate(InputSchema::EventGridSchema, now)
            .unwrap_err();
        assert_eq!(e.field, "deliveryAttributeMappings");
    }

    /// #12: an update may move a resource subscription to another ARN of its type (at once:
    /// no handshake) but not change its type.
    #[test]
    fn an_update_keeps_the_endpoint_type_s4() {
        let now = Utc::now();
        let current = SubscriptionRequest {
            topic: "orders".into(),
            name: "to-queue".into(),
            endpoint: "arn:aws:sqs:us-east-1:123456789012:a".into(),
            ..SubscriptionRequest::default()
        }
        .validate(InputSchema::EventGridSchema, now)
        .unwrap();
        let moved = SubscriptionUpdate {
            endpoint: Some("arn:aws:sqs:us-east-1:123456789012:b".into()),
            ..SubscriptionUpdate::default()
        }
        .apply(&current, InputSchema::EventGridSchema, now)
        .unwrap();
        assert_eq!(
            moved.subscription.endpoint,
            "arn:aws:sqs:us-east-1:123456789012:b"
        );
        assert_eq!(moved.handshake, None);
        assert!(moved.subscription.delivers());
        assert_eq!(moved.subscription.id, current.id);
        let e = SubscriptionUpdate {
            endpoint_type: Some("webhook".into()),
            endpoint: Some("https://hooks.example.com/in".into()),
            ..SubscriptionUpdate::default()
        }
        .apply(&current, InputSchema::EventGridSchema, now)
        .unwrap_err();
        assert_eq!(e.field, "endpointType");
        assert!(e.allowed.contains("keeps the kind of endpoint"), "{e}");
        let e = SubscriptionUpdate {
            endpoint: Some("arn:aws:sns:us-east-1:123456789012:t".into()),
            ..SubscriptionUpdate::default()
        }
        .apply(&current, InputSchema::EventGridSchema, now)
        .unwrap_err();
        assert_eq!(e.field, "endpoint");
        // A webhook subscription given an ARN is told that the type stays.
        let webhook = SubscriptionRequest {
            topic: "orders".into(),
            name: "hook".into(),
            endpoint: "https://hooks.example.com/in".into(),
            ..SubscriptionRequest::default()
        }
        .validate(InputSchema::EventGridSchema, now)
        .unwrap();
        let e = SubscriptionUpdate {
            endpoint: Some("arn:aws:sqs:us-east-1:123456789012:a".into()),
            ..SubscriptionUpdate::default()
        }
        .apply(&webhook, InputSchema::EventGridSchema, now)
        .unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("endpointType", "\"sqs\"")
        );
    }

    /// #11 item 12: an update changes the settings it gives, each checked as at create, and
    /// keeps the rest and the subscription's identity.
    #[test]
    fn an_update_changes_what_it_gives_and_keeps_the_rest() {
        let now = Utc::now();
        let current = validated(
            &SubscriptionRequest {
                topic: "orders".into(),
                name: "audit".into(),
                endpoint: "https://example.com/hook".into(),
                max_delivery_attempts: Some(5),
                max_concurrent_requests: Some(8),
                dead_letter_destination: Some("s3://dead/orders".into()),
                status_table: Some("2020".into()),
                labels: vec!["a".into()],
                filter: EventFilter {
                    subject_begins_with: Some("/orders".into()),
                    ..EventFilter::default()
                },
                ..SubscriptionRequest::default()
            },
            now,
        );
        let update = SubscriptionUpdate {
            max_events_per_batch: Some(10),
            subject_ends_with: Some(".json".into()),
            ..SubscriptionUpdate::default()
        };
        let Updated {
            subscription: next,
            handshake,
        } = update
            .apply(&current, InputSchema::EventGridSchema, now)
            .unwrap();
        assert_eq!(handshake, None);
        assert_eq!(next.batching.max_events_per_batch, 10);
        assert_eq!(next.filter.subject_ends_with.as_deref(), Some(".json"));
        let unchanged = Subscription {
            batching: current.batching,
            filter: current.filter.clone(),
            ..next.clone()
        };
        assert_eq!(unchanged, current, "everything else as it was");

        // Checked as at create, naming the setting.
        let e = SubscriptionUpdate {
            max_delivery_attempts: Some(31),
            ..SubscriptionUpdate::default()
        }
        .apply(&current, InputSchema::EventGridSchema, now)
        .unwrap_err();
        assert_eq!(e.field, "maxDeliveryAttempts");
        // "" removes the dead-letter destination; an expiration in the past is refused.
        let removed = SubscriptionUpdate {
            dead_letter_destination: Some(String::new()),
            ..SubscriptionUpdate::default()
        }
        .apply(&current, InputSchema::EventGridSchema, now)
        .unwrap();
        assert_eq!(removed.subscription.dead_letter_destination, None);
        let past = SubscriptionUpdate {
            expiration_time_utc: Some(Some(now - chrono::Duration::minutes(1))),
            ..SubscriptionUpdate::default()
        }
        .apply(&current, InputSchema::EventGridSchema, now)
        .unwrap_err();
        assert_eq!(past.field, "expirationTimeUtc");
    }

    /// #11 item 12: a new endpoint of a validated subscription waits beside it as an endpoint
    /// change until its handshake succeeds, then takes its place; a failed one stays beside
    /// it. Without a validated endpoint the new one replaces it and is validated as at create.
    #[test]
    fn a_new_endpoint_is_validated_before_it_takes_over() {
        let now = Utc::now();
        let request = SubscriptionRequest {
            topic: "orders".into(),
            name: "audit".into(),
            endpoint: "https://example.com/old".into(),
            ..SubscriptionRequest::default()
        };
        let current = validated(&request, now);
        let to_new = SubscriptionUpdate {
            endpoint: Some("https://example.com/new".into()),
            ..SubscriptionUpdate::default()
        };
        let updated = to_new
            .apply(&current, InputSchema::EventGridSchema, now)
            .unwrap();
        assert_eq!(updated.handshake, Some(Handshake::EndpointChange));
        let mut next = updated.subscription;
        assert_eq!(next.endpoint, "https://example.com/old");
        assert!(next.delivers());
        assert_eq!(
            next.handshake(Handshake::EndpointChange)
                .map(|(e, p)| (e, p.state)),
            Some(("https://example.com/new", ProvisioningState::Creating))
        );

        let mut failed = next.clone();
        failed.settle_handshake(
            Handshake::EndpointChange,
            Provisioning::with_state(ProvisioningState::Failed, Some("403".into())),
        );
        assert_eq!(failed.endpoint, "https://example.com/old");
        assert_eq!(
            failed
                .endpoint_change
                .as_ref()
                .map(|c| c.provisioning.state),
            Some(ProvisioningState::Failed)
        );
        // Given its own endpoint again, the pending change is dropped.
        let back = SubscriptionUpdate {
            endpoint: Some("https://example.com/old".into()),
            ..SubscriptionUpdate::default()
        }
        .apply(&failed, InputSchema::EventGridSchema, now)
        .unwrap();
        assert_eq!(
            (back.handshake, back.subscription.endpoint_change),
            (None, None)
        );

        next.settle_handshake(
            Handshake::EndpointChange,
            Provisioning::with_state(ProvisioningState::Succeeded, Some("validated".into())),
        );
        assert_eq!(next.endpoint, "https://example.com/new");
        assert_eq!(next.endpoint_change, None);
        assert!(next.delivers());

        let creating = request.validate(InputSchema::EventGridSchema, now).unwrap();
        let replaced = to_new
            .apply(&creating, InputSchema::EventGridSchema, now)
            .unwrap();
        assert_eq!(replaced.handshake, Some(Handshake::Subscription));
        assert_eq!(replaced.subscription.endpoint, "https://example.com/new");
        assert_eq!(
            replaced.subscription.provisioning.state,
            ProvisioningState::Creating
        );
    }

    /// #11 item 12: expirations as `az` takes them, labels and tags with their limits named.
    #[test]
    fn expirations_labels_and_tags_are_parsed_and_limited() {
        let at = |s: &str| parse_expiration(s).map(|t| t.to_rfc3339());
        assert_eq!(at("2026-12-31").unwrap(), "2026-12-31T00:00:00+00:00");
        assert_eq!(
            at("2026-12-31T18:30:00").unwrap(),
            "2026-12-31T18:30:00+00:00"
        );
        assert_eq!(
            at("2026-12-31T18:30:00+02:00").unwrap(),
            "2026-12-31T16:30:00+00:00"
        );
        let e = at("next tuesday").unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("expirationTimeUtc", "\"next tuesday\"")
        );

        assert!(check_labels(&vec!["x".into(); MAX_LABELS]).is_ok());
        let e = check_labels(&vec!["x".into(); MAX_LABELS + 1]).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.allowed.as_str()),
            ("labels", "at most 25")
        );
        assert!(check_labels(&["".into()]).is_err());
        assert!(check_labels(&["l".repeat(MAX_LABEL_CHARS + 1)]).is_err());

        let tags = parse_tags(&["env=prod".into(), "owner=".into()]).unwrap();
        assert_eq!(tags.get("env").map(String::as_str), Some("prod"));
        assert_eq!(tags.get("owner").map(String::as_str), Some(""));
        assert!(parse_tags(&["=x".into()]).is_err());
        assert!(parse_tags(&["a=1".into(), "a=2".into()]).is_err());
        let long = format!("k={}", "v".repeat(MAX_TAG_VALUE_CHARS + 1));
        assert!(
            parse_tags(&[long])
                .unwrap_err()
                .allowed
                .contains("at most 256")
        );
        assert!(parse_tags(&vec!["k=v".to_string(); MAX_TAGS + 1]).is_err());
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
