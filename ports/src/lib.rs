//! The I/O gridrelay does, as small traits: subscription store, message queue, object store,
//! secret store, delivery state store, subscriber endpoints, clock and randomness.
//!
//! It exists so that the handlers can be written against interfaces, not services: the AWS
//! and HTTP implementations are in `gridrelay-adapters` (what the functions and the end-to-end
//! tests run), the in-memory ones in [`memory`] (what unit tests and deterministic simulations
//! run). Handlers take `Arc<dyn …>`.
//!
//! Beside the traits are the workflows that are nothing but calls through them and the rules
//! of `gridrelay-shared`: [`fan_out`] (ingest's and dead-letter's path into the delivery
//! queue), [`registration`] (creating and deleting subscriptions) and [`secret_headers`]; and
//! [`cache`], what a warm function keeps of the stores' records between invocations.

pub mod cache;
pub mod endpoints;
pub mod fan_out;
#[cfg(feature = "log-capture")]
pub mod log_capture;
pub mod memory;
pub mod oauth;
pub mod redrive;
pub mod registration;
pub mod secret_headers;
pub mod send_again;
mod update;

pub use update::{Update, update_endpoint_health, update_subscription};

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use gridrelay_shared::caps::RateAllowance;
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::dedup::EventIdentity;
use gridrelay_shared::delivery_attributes::SecretValue;
use gridrelay_shared::destination::{ResourceDestination, RoutingFields};
use gridrelay_shared::health::EndpointHealth;
use gridrelay_shared::outbound::redact_endpoint;
use gridrelay_shared::subscription::{Subscription, Topic};

/// Failures of the subscription store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("{0} does not exist")]
    NotFound(String),
    /// A conditional write found the record changed since it was read.
    #[error("{0} was changed by someone else meanwhile")]
    Conflict(String),
    #[error("subscription store unavailable: {0}")]
    Unavailable(String),
    #[error("stored record is not readable: {0}")]
    Corrupt(String),
}

/// Topics and subscriptions (DynamoDB on AWS).
#[async_trait]
pub trait SubscriptionStore: Send + Sync {
    async fn get_topic(&self, name: &str) -> Result<Option<Topic>, StoreError>;
    async fn list_topics(&self) -> Result<Vec<Topic>, StoreError>;
    /// Fails with [`StoreError::AlreadyExists`] if the name is taken.
    async fn create_topic(&self, topic: &Topic) -> Result<(), StoreError>;
    /// Replaces an existing topic's record (new keys); fails if it does not exist.
    async fn replace_topic(&self, topic: &Topic) -> Result<(), StoreError>;
    /// Whether a topic was there to delete.
    async fn delete_topic(&self, name: &str) -> Result<bool, StoreError>;
    async fn get_subscription(
        &self,
        topic: &str,
        name: &str,
    ) -> Result<Option<Subscription>, StoreError>;
    async fn list_subscriptions(&self, topic: &str) -> Result<Vec<Subscription>, StoreError>;
    /// Fails with [`StoreError::AlreadyExists`] if the name is taken on that topic.
    async fn create_subscription(&self, subscription: &Subscription) -> Result<(), StoreError>;
    /// Writes `subscription` over the stored record, but only if that is still the record it
    /// was read from: the same subscription (`id`) at the same `version`. The record written
    /// has the next version, and so has `subscription` afterwards. [`StoreError::NotFound`] if
    /// it was deleted, [`StoreError::Conflict`] if it was changed (or deleted and created
    /// again) since it was read. Use [`update_subscription`] for a read-modify-write.
    async fn replace_subscription(&self, subscription: &mut Subscription)
    -> Result<(), StoreError>;
    async fn delete_subscription(&self, topic: &str, name: &str) -> Result<bool, StoreError>;
    /// Deletes the subscription only if the stored record is still `subscription` (the same
    /// `id` at the same `version`), so a change made since (a later expiration time, say) is
    /// not deleted with it. Whether it was deleted.
    async fn delete_subscription_if_unchanged(
        &self,
        subscription: &Subscription,
    ) -> Result<bool, StoreError>;
    /// Says that what was read of `topic` (its record, its subscriptions) may be out of date,
    /// so the next read of it goes to the store. Only a cache in front of the store
    /// ([`cache::CachedSubscriptionStore`]) has anything to forget.
    fn forget(&self, _topic: &str) {}
    /// Says that what was read of one subscription may be out of date (it and its topic's
    /// list are read from the store next time); the rest of the topic is kept.
    fn forget_subscription(&self, _topic: &str, _name: &str) {}
    /// Says that a kept list of `topic`'s subscriptions may be out of date (it holds one whose
    /// expiration has come, which may have been moved since): read again at most once per
    /// [`cache::RECHECK_INTERVAL`].
    fn recheck_list(&self, _topic: &str) {}
    /// As [`SubscriptionStore::forget`] for `topic`'s record alone, when a request nobody
    /// vouches for says it may be out of date (a key that does not match it): at most once per
    /// [`cache::RECHECK_INTERVAL`], so such requests cost at most one read of the store per
    /// interval, however many arrive.
    fn recheck_topic(&self, _topic: &str) {}
    /// As [`SubscriptionStore::recheck_topic`], for one subscription's record (a validation
    /// URL followed).
    fn recheck_subscription(&self, _topic: &str, _name: &str) {}
}

/// What `deliver` remembers between invocations (DynamoDB on AWS): each endpoint's health
/// (D1, R3) and timed-out attempts that later succeeded (R4). Records expire on their own.
#[async_trait]
pub trait DeliveryStateStore: Send + Sync {
    /// The endpoint's record and its version; healthy at version 0 if there is none.
    async fn endpoint_health(
        &self,
        endpoint: &str,
    ) -> Result<Versioned<EndpointHealth>, StoreError>;
    /// The records of many endpoints (or hosts' keys) at once, in their order, each healthy
    /// if there is none: what the console's overview reads for every subscription (#36).
    async fn endpoint_healths(
        &self,
        endpoints: &[String],
    ) -> Result<Vec<EndpointHealth>, StoreError> {
        let mut out = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            out.push(self.endpoint_health(endpoint).await?.value);
        }
        Ok(out)
    }
    /// Writes the record over the one read at `version` (0: none), with the next version (a
    /// healthy record too: deleting it would start its versions again, and a writer that read
    /// before could then write over a newer record of the same version).
    /// [`StoreError::Conflict`] if it changed since it was read, so a
    /// writer that read before another cannot undo what that one wrote (use
    /// [`update_endpoint_health`]).
    async fn put_endpoint_health(
        &self,
        endpoint: &str,
        health: &EndpointHealth,
        version: u64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// Takes the probe lease until `until` if no unexpired lease is held (a write: the
    /// record's version moves on); whether it did.
    async fn acquire_probe(
        &self,
        endpoint: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
    /// R4: records that a timed-out attempt was answered with success after all.
    async fn mark_late_success(&self, attempt: &str, now: DateTime<Utc>) -> Result<(), StoreError>;
    /// R4: when that attempt was answered with success after all, if it was.
    async fn late_success(&self, attempt: &str) -> Result<Option<DateTime<Utc>>, StoreError>;
    /// #35: claims `key` for `token` until `until` if no other token holds it at `now` (a
    /// claim ends at its `until`, whether or not its record is deleted yet); whether `token`
    /// holds it now (claimed before by the same token counts, and its claim is extended).
    async fn claim(
        &self,
        key: &str,
        token: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
    /// O1: the progress kept for each of `message_ids` (ordered messages that waited in
    /// flight: `gridrelay_shared::ordering::progress_text`), by id; ids with none are left
    /// out. Read strongly consistent; an id that could not be read fails the whole read.
    async fn ordered_progress(
        &self,
        message_ids: &[String],
    ) -> Result<std::collections::HashMap<String, String>, StoreError>;
    /// O1: keeps `progress` for the ordered message `message_id`, over what was kept.
    async fn put_ordered_progress(
        &self,
        message_id: &str,
        progress: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// Says that what was read of `endpoint`'s health may be out of date, so the next read
    /// goes to the store. Only a cache in front of the store
    /// ([`cache::CachedDeliveryState`]) has anything to forget.
    fn forget(&self, _endpoint: &str) {}
}

/// What subscriptions' delivery caps (`gridrelay_shared::caps`) have used, shared by every
/// deliver worker so the caps hold across Lambda instances (the delivery state table on AWS):
/// the events-per-second allowance booked so far, and leased request slots. Records expire on
/// their own.
#[async_trait]
pub trait DeliveryCapStore: Send + Sync {
    /// Books `events` of `subscription`'s `allowance` at `now`, after every booking made before
    /// ([`gridrelay_shared::caps::book_events`], atomically); when the batch may start. A store
    /// whose items take only so many writes may spread the allowance over items
    /// ([`gridrelay_shared::caps::rate_items`]), each a schedule of its own at its share.
    async fn book_events(
        &self,
        subscription: &str,
        events: u32,
        allowance: RateAllowance,
        now: DateTime<Utc>,
    ) -> Result<DateTime<Utc>, StoreError>;
    /// Takes one of `subscription`'s `max` request slots until `until`, if one is free at
    /// `now` (a slot whose lease has passed is free: its holder died or overran); the lease,
    /// to give back with [`release_slot`](Self::release_slot), if it did.
    async fn acquire_slot(
        &self,
        subscription: &str,
        max: u32,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError>;
    /// Gives a slot back before its lease ends.
    async fn release_slot(&self, subscription: &str, lease: &str) -> Result<(), StoreError>;
}

/// The event identities topics with a deduplication window accepted (P1,
/// `gridrelay_shared::dedup`), and when: the delivery state table on AWS, one small item per
/// identity, expiring on its own.
#[async_trait]
pub trait AcceptedIds: Send + Sync {
    /// When each of `ids` was last accepted on `topic`, for those marked (read strongly
    /// consistent: a publish retried at once must see its first try's marks).
    async fn accepted_at(
        &self,
        topic: &str,
        ids: &[EventIdentity],
    ) -> Result<std::collections::HashMap<EventIdentity, DateTime<Utc>>, StoreError>;
    /// Marks `ids` accepted on `topic` at `at`, once their events are enqueued.
    async fn mark_accepted(
        &self,
        topic: &str,
        ids: &[EventIdentity],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;
}

/// A stored record and the version it was read at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub version: u64,
}

/// A message to enqueue, visible after `delay` (at most 15 minutes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    pub body: String,
    pub delay: Duration,
    /// O1: its message group on a FIFO queue (`gridrelay_shared::ordering::message_group`),
    /// which keeps the group's messages in the order they were sent and takes no `delay`.
    pub group: Option<String>,
}

/// A received message that failed: its receipt and how often it was received.
#[derive(Debug, Clone, Copy)]
pub struct FailedReceipt<'a> {
    pub receipt_handle: &'a str,
    pub receive_count: u32,
}

/// Item 2 of the life-cycle issue: messages whose records failed (a store or queue that did
/// not answer) come back after a short, growing wait
/// ([`gridrelay_shared::delivery::redelivery_delay`]) instead of the queue's whole visibility
/// timeout. Best effort: where the queue does not take the change, the timeout applies.
pub async fn back_off<'a>(
    queue: &dyn MessageQueue,
    failed: impl IntoIterator<Item = FailedReceipt<'a>>,
    scale: gridrelay_shared::time_scale::TimeScale,
) {
    let changes = failed.into_iter().map(|f| async move {
        let wait = gridrelay_shared::delivery::redelivery_delay(f.receive_count, scale);
        if let Err(e) = queue.retry_after(f.receipt_handle, wait).await {
            tracing::warn!(error = %e, "could not shorten a failed message's wait; it comes back after the visibility timeout");
        }
    });
    futures::future::join_all(changes).await;
}

/// A message the queue did not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("queue refused the message: {0}")]
pub struct QueueError(pub String);

/// A queue (SQS on AWS).
#[async_trait]
pub trait MessageQueue: Send + Sync {
    /// Sends every message, batching requests as the queue allows. The result holds, for each
    /// message in order, whether the queue durably accepted it.
    async fn send_all(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), QueueError>>;
    /// Makes a message received from this queue visible again `after` from now (SQS:
    /// ChangeMessageVisibility), so a record that failed for a passing reason comes back soon
    /// rather than after the whole visibility timeout.
    async fn retry_after(&self, receipt_handle: &str, after: Duration) -> Result<(), QueueError>;
    /// Receives up to `max` visible messages (at most 10), hiding them for `visibility`. For
    /// the operator's tools (`gridrelay redrive`); the functions are invoked with theirs.
    async fn receive_batch(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError>;
    /// Deletes a received message.
    async fn delete_received(&self, receipt_handle: &str) -> Result<(), QueueError>;
}

/// A message received from a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    pub id: String,
    pub body: String,
    pub receipt_handle: String,
    /// Written by gridrelay: sealed under the installation's key, or sent before it was in use
    /// (#34 item 2; [`gridrelay_shared::queue_seal`]). An unsealed message is never acted on.
    pub sealed: bool,
}

/// A call the object store did not answer as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("object store: {message}")]
pub struct ObjectStoreError {
    pub message: String,
    /// The store said the bucket does not exist (S3's `NoSuchBucket`): registration refuses
    /// such a dead-letter location, and L5 counts its drops apart.
    pub bucket_missing: bool,
}

impl ObjectStoreError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            bucket_missing: false,
        }
    }

    pub fn bucket_missing(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            bucket_missing: true,
        }
    }
}

/// Where dead-letter records are written (S3 on AWS).
#[async_trait]
pub trait ObjectStore: Send + Sync {
    async fn put_json(&self, bucket: &str, key: &str, body: String)
    -> Result<(), ObjectStoreError>;
    /// The keys under `prefix`, in key order.
    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, ObjectStoreError>;
    async fn get(&self, bucket: &str, key: &str) -> Result<String, ObjectStoreError>;
    /// Deletes an object; a missing one is not an error.
    async fn delete(&self, bucket: &str, key: &str) -> Result<(), ObjectStoreError>;
}

/// A secret store that did not answer as asked. Never carries a secret value.
///
/// Which of the three it is decides who pays for it: a secret that is missing or malformed is
/// its subscription's problem (its events' attempts fail and follow the retry policy), a store
/// that did not answer is nobody's (the work waits for it, as with any unavailable store).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// No secret has this id (deleted, or never stored).
    #[error("secret {0} does not exist")]
    NotFound(String),
    /// The secret is there, but its value is not one that can be used.
    #[error("secret store: {0}")]
    Invalid(String),
    /// The store did not answer: down, throttling, timed out, or refusing this caller (which
    /// may be the whole installation's problem, so it is waited out, not charged to a
    /// subscription).
    #[error("secret store unavailable: {0}")]
    Unavailable(String),
}

impl SecretError {
    /// Whether the store, not the secret, is at fault: the same read may succeed later.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, SecretError::Unavailable(_))
    }
}

/// Where secret delivery header values are kept (Secrets Manager on AWS).
#[async_trait]
pub trait SecretStore: Send + Sync {
    /// Stores `value` under `name` (replacing an older value) and returns the secret's id.
    async fn put(&self, name: &str, value: &str) -> Result<String, SecretError>;
    async fn get(&self, id: &str) -> Result<SecretValue, SecretError>;
    /// Deletes the secret at once; a missing secret is not an error.
    async fn delete(&self, id: &str) -> Result<(), SecretError>;
}

/// One POST to a subscriber endpoint. Its `Debug` shows neither the endpoint's credentials
/// and query nor header values (they may be secret, H1).
#[derive(Clone)]
pub struct DeliveryRequest {
    pub endpoint: String,
    pub content_type: &'static str,
    pub body: String,
    pub headers: Vec<(String, String)>,
    /// How many of the answer's first body bytes to keep, for the journal (#35).
    pub answer_bytes: usize,
}

/// A validation handshake request: a POST with a body, or an OPTIONS without. `Debug` as
/// [`DeliveryRequest`]'s.
#[derive(Clone)]
pub struct HandshakeRequest {
    pub endpoint: String,
    pub method: HandshakeMethod,
    pub headers: Vec<(String, String)>,
    pub body: Option<(&'static str, String)>,
}

/// Header names, each with its value hidden.
fn header_names(headers: &[(String, String)]) -> Vec<(&str, &str)> {
    headers.iter().map(|(n, _)| (n.as_str(), "***")).collect()
}

impl std::fmt::Debug for DeliveryRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryRequest")
            .field("endpoint", &redact_endpoint(&self.endpoint))
            .field("content_type", &self.content_type)
            .field("body_bytes", &self.body.len())
            .field("headers", &header_names(&self.headers))
            .finish()
    }
}

impl std::fmt::Debug for HandshakeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeRequest")
            .field("endpoint", &redact_endpoint(&self.endpoint))
            .field("method", &self.method)
            .field("headers", &header_names(&self.headers))
            .field("body_bytes", &self.body.as_ref().map(|(_, b)| b.len()))
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeMethod {
    Post,
    Options,
}

/// An endpoint's answer to a handshake request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeReply {
    pub status: u16,
    /// Header names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body, at most 64 KiB of it.
    pub body: Vec<u8>,
}

impl HandshakeReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// R4: the status a timed-out request is answered with after all (`None`: no answer within
/// the late window).
pub type LateAnswer =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<u16>> + Send + Sync>>;

/// What came of one delivery request.
pub struct SentAttempt {
    pub result: AttemptResult,
    /// For a timed-out request that is still waiting for its answer (R4).
    pub late: Option<LateAnswer>,
    /// What the endpoint's `Retry-After` header asked for, on a 429 or 503.
    pub retry_after: Option<Duration>,
    /// The answer's first body bytes, as many as the request asked to keep and came by the
    /// attempt's deadline.
    pub answer: Vec<u8>,
}

impl SentAttempt {
    /// An attempt that ended with `result` and nothing more.
    pub fn of(result: AttemptResult) -> Self {
        Self {
            result,
            late: None,
            retry_after: None,
            answer: Vec::new(),
        }
    }

    /// An attempt that could not be made (nothing was sent).
    pub fn not_sent(why: String) -> Self {
        Self::of(AttemptResult::NotSent(why))
    }
}

/// Subscriber endpoints (HTTP).
#[async_trait]
pub trait EventSender: Send + Sync {
    /// Sends the request and reports what happened; never fails otherwise.
    async fn send(&self, request: DeliveryRequest) -> SentAttempt;
    /// Sends a handshake request; `Err` says why no answer came.
    async fn handshake(&self, request: HandshakeRequest) -> Result<HandshakeReply, String>;
    /// A1: POSTs an OAuth token request (`body` form-encoded, with `authorization`) to `url`
    /// under the same outbound rules and timeout as deliveries: the answer's status and body,
    /// or why none came. A sender that reaches no token endpoints says so.
    async fn request_token(
        &self,
        url: &str,
        authorization: &str,
        body: &str,
    ) -> Result<(u16, Vec<u8>), String> {
        let _ = (url, authorization, body);
        Err("this sender makes no token requests".to_string())
    }
}

/// One event (or, for a Lambda function, one batch) for an AWS resource destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceEntry {
    /// The event in the subscription's delivery schema (a Lambda function's: the batch).
    pub body: String,
    /// What the message carries besides (attributes, `DetailType`, partition key).
    pub fields: RoutingFields,
}

/// One call to an AWS resource destination: entries that fit one call of its service's batch
/// API (`gridrelay_shared::destination::CallLimits`), for one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRequest {
    pub destination: ResourceDestination,
    pub topic: String,
    pub subscription: String,
    /// Attempts before this one (`aeg-delivery-count`).
    pub delivery_count: u32,
    pub entries: Vec<ResourceEntry>,
}

/// Why a destination was not found usable when a subscription was created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    #[error("it does not exist ({0})")]
    NotFound(String),
    #[error("it could not be checked ({0})")]
    Unavailable(String),
}

/// AWS resources events are delivered to: SQS, SNS, Lambda, EventBridge and Kinesis on AWS.
#[async_trait]
pub trait ResourceSender: Send + Sync {
    /// Makes the call and says what became of each entry, in order: `Status(200)` for one the
    /// service took, the error it reported for one it did not (a call that failed as a whole
    /// fails every entry). Never fails otherwise.
    async fn put(&self, request: ResourceRequest) -> Vec<AttemptResult>;
    /// Whether the destination exists (checked when a subscription is created).
    async fn check(&self, destination: &ResourceDestination) -> Result<(), DestinationError>;
}

/// A record stream (the delivery journal's, a topic archive's) did not take what was written,
/// or what it wrote could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RecordStreamError(pub String);

/// Where lines of JSON go to be kept in S3 by the hour: Amazon Data Firehose, on AWS and
/// locally. The delivery journal's records ([`gridrelay_shared::journal`] says what one holds)
/// and the topic archive's ([`gridrelay_shared::archive`]) are written through it.
#[async_trait]
pub trait RecordStream: Send + Sync {
    /// Writes `records` (each a whole number of lines, usually compressed) in as few calls as
    /// the service allows. Returns the indices of the records it did not take; an `Err` took
    /// none.
    async fn put_records(&self, records: &[Vec<u8>]) -> Result<Vec<usize>, RecordStreamError>;
}

/// No stream: takes every record and keeps none (a stack deployed without a journal).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRecordStream;

#[async_trait]
impl RecordStream for NoRecordStream {
    async fn put_records(&self, _records: &[Vec<u8>]) -> Result<Vec<usize>, RecordStreamError> {
        Ok(Vec::new())
    }
}

/// The topic archive's streams (#35): one per retention class
/// ([`gridrelay_shared::archive::ARCHIVE_CLASSES`]), each writing under its class's prefix, whose
/// lifecycle rule expires it.
#[derive(Clone, Default)]
pub struct ArchiveStreams {
    by_class: std::collections::BTreeMap<u16, std::sync::Arc<dyn RecordStream>>,
}

impl ArchiveStreams {
    pub fn new(
        by_class: std::collections::BTreeMap<u16, std::sync::Arc<dyn RecordStream>>,
    ) -> Self {
        Self { by_class }
    }

    /// One stream for every class (tests that look at what was archived, not where).
    pub fn every_class(stream: std::sync::Arc<dyn RecordStream>) -> Self {
        Self::new(
            gridrelay_shared::archive::ARCHIVE_CLASSES
                .into_iter()
                .map(|class| (class, stream.clone()))
                .collect(),
        )
    }

    /// The stream of `class`, if there is one.
    pub fn of_class(&self, class: u16) -> Option<&dyn RecordStream> {
        self.by_class.get(&class).map(AsRef::as_ref)
    }

    /// Whether there are none: a stack deployed without an archive.
    pub fn is_empty(&self) -> bool {
        self.by_class.is_empty()
    }
}

/// What a read of the journal found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalRead {
    pub entries: Vec<gridrelay_shared::journal::JournalEntry>,
    /// Lines that were not entries (a newer writer's), and parts of objects that could not
    /// be unpacked, skipped.
    pub skipped: usize,
}

/// The delivery journal as its readers see it: what was written in an hour range.
#[async_trait]
pub trait JournalSource: Send + Sync {
    /// Every entry written in the hours from `from`'s to `to`'s (UTC, both included).
    async fn read_hours(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<JournalRead, RecordStreamError>;
}

/// Replays of topics' archives (#35, `gridrelay_shared::replay`): a DynamoDB table on AWS.
#[async_trait]
pub trait ReplayStore: Send + Sync {
    /// Stores a new replay; [`StoreError::AlreadyExists`] if its topic has one of its name.
    async fn create_replay(
        &self,
        replay: &gridrelay_shared::replay::Replay,
    ) -> Result<(), StoreError>;
    async fn get_replay(
        &self,
        topic: &str,
        name: &str,
    ) -> Result<Option<gridrelay_shared::replay::Replay>, StoreError>;
    /// The topic's replays, newest first.
    async fn list_replays(
        &self,
        topic: &str,
    ) -> Result<Vec<gridrelay_shared::replay::Replay>, StoreError>;
    /// Writes `replay` only over the record at `read_version` (the version it was read at;
    /// `replay.version` is the one it is written with): [`StoreError::Conflict`] if the record
    /// changed meanwhile, [`StoreError::NotFound`] if there is none.
    async fn update_replay(
        &self,
        replay: &gridrelay_shared::replay::Replay,
        read_version: u64,
    ) -> Result<(), StoreError>;
}

/// No replays: a stack deployed without their table (or its archive's bucket). Every call
/// says so, as an unavailable store does, so a step waits on its queue for the stack to be
/// updated rather than being lost.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReplays;

const NO_REPLAYS: &str = "replays are not set up here (no GRIDRELAY_REPLAYS_TABLE or \
                          GRIDRELAY_JOURNAL_BUCKET): update the stack";

#[async_trait]
impl ReplayStore for NoReplays {
    async fn create_replay(&self, _: &gridrelay_shared::replay::Replay) -> Result<(), StoreError> {
        Err(StoreError::Unavailable(NO_REPLAYS.into()))
    }
    async fn get_replay(
        &self,
        _: &str,
        _: &str,
    ) -> Result<Option<gridrelay_shared::replay::Replay>, StoreError> {
        Err(StoreError::Unavailable(NO_REPLAYS.into()))
    }
    async fn list_replays(
        &self,
        _: &str,
    ) -> Result<Vec<gridrelay_shared::replay::Replay>, StoreError> {
        Err(StoreError::Unavailable(NO_REPLAYS.into()))
    }
    async fn update_replay(
        &self,
        _: &gridrelay_shared::replay::Replay,
        _: u64,
    ) -> Result<(), StoreError> {
        Err(StoreError::Unavailable(NO_REPLAYS.into()))
    }
}

#[async_trait]
impl ArchiveSource for NoReplays {
    async fn read_window(
        &self,
        _: &str,
        _: &gridrelay_shared::archive::TimeWindow,
    ) -> Result<ArchiveRead, RecordStreamError> {
        Err(RecordStreamError(NO_REPLAYS.into()))
    }
    async fn read_step(
        &self,
        _: &str,
        _: &gridrelay_shared::archive::TimeWindow,
        _: Option<&gridrelay_shared::replay::ArchivePosition>,
        _: gridrelay_shared::replay::StepBudget,
    ) -> Result<ArchiveStep, RecordStreamError> {
        Err(RecordStreamError(NO_REPLAYS.into()))
    }
}

/// A replay's write moves it exactly one version on from the version read.
pub fn one_version_on(
    replay: &gridrelay_shared::replay::Replay,
    read_version: u64,
) -> Result<(), StoreError> {
    if replay.version == read_version.saturating_add(1) {
        Ok(())
    } else {
        Err(StoreError::Corrupt(format!(
            "replay {} of topic {} written at version {} over version {read_version}: a write \
             moves a replay one version on",
            replay.name, replay.topic, replay.version
        )))
    }
}

/// What a read of a topic's archive found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArchiveRead {
    /// The topic's events of the window, in publish order.
    pub events: Vec<gridrelay_shared::archive::ArchivedEvent>,
    /// Lines that were not archived events, and parts of objects that could not be unpacked.
    pub skipped: usize,
}

/// Topic archives as their readers see them (#35).
#[async_trait]
pub trait ArchiveSource: Send + Sync {
    /// The archived events of `topic` published in `window`, in publish order.
    async fn read_window(
        &self,
        topic: &str,
        window: &gridrelay_shared::archive::TimeWindow,
    ) -> Result<ArchiveRead, RecordStreamError>;

    /// A replay's step (#35): the archived events of `topic` published in `window` that
    /// `budget` allows, in the order they were archived (objects in the order written, lines
    /// in order), from `from` on (none: the window's first object).
    async fn read_step(
        &self,
        topic: &str,
        window: &gridrelay_shared::archive::TimeWindow,
        from: Option<&gridrelay_shared::replay::ArchivePosition>,
        budget: gridrelay_shared::replay::StepBudget,
    ) -> Result<ArchiveStep, RecordStreamError>;
}

/// What a replay's step read of a topic's archive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArchiveStep {
    pub events: Vec<gridrelay_shared::archive::ArchivedEvent>,
    /// Where the next step reads from; none when the window's objects are all read.
    pub next: Option<gridrelay_shared::replay::ArchivePosition>,
    /// Lines that were not archived events, and parts of objects that could not be unpacked.
    pub skipped: usize,
}

impl ArchiveStep {
    /// Takes what `object` (its key and unpacked lines) holds for the step, from `from`'s line
    /// if it is that object, as far as `budget` allows; whether the step is full (`next` then
    /// says where it stopped; otherwise, past this object).
    pub fn take_from(
        &mut self,
        key: &str,
        lines: &[u8],
        from: Option<&gridrelay_shared::replay::ArchivePosition>,
        (topic, window): (&str, &gridrelay_shared::archive::TimeWindow),
        budget: gridrelay_shared::replay::StepBudget,
    ) -> bool {
        let first = from.filter(|p| p.key == key).map_or(0, |p| p.line);
        let used: usize = self.events.iter().map(|e| e.event.get().len()).sum();
        let taken = gridrelay_shared::archive::take_events(
            lines,
            first,
            topic,
            window,
            (
                budget.events.saturating_sub(self.events.len()),
                budget.bytes.saturating_sub(used),
                // At least one event a step: only the step's first may pass the budget.
                self.events.is_empty(),
            ),
        );
        self.skipped += taken.skipped;
        let full = taken.next_line.is_some();
        self.events.extend(taken.events);
        self.next = Some(match taken.next_line {
            Some(line) => gridrelay_shared::replay::ArchivePosition {
                key: key.to_string(),
                line,
            },
            None => gridrelay_shared::replay::ArchivePosition::past(key),
        });
        full
    }
}

/// How delivery to `sub` goes at `now` (#36), from its endpoint's health record and its
/// host's: what the console and the subscribers' portal show.
pub async fn delivery_state(
    store: &dyn DeliveryStateStore,
    sub: &Subscription,
    now: DateTime<Utc>,
) -> gridrelay_shared::health::DeliveryState {
    use gridrelay_shared::health::{DeliveryState, origin_health_key};
    let keys: Vec<String> = std::iter::once(sub.endpoint.clone())
        .chain(origin_health_key(&sub.endpoint))
        .collect();
    match store.endpoint_healths(&keys).await {
        Ok(read) => DeliveryState::of(sub, read.first(), read.get(1), now),
        Err(_) => DeliveryState::of(sub, None, None, now),
    }
}

/// The key subscribers' portal links are signed with (#36; a Secrets Manager secret the stack
/// generates on AWS). Rotating it revokes every link made before.
#[async_trait]
pub trait PortalKeySource: Send + Sync {
    /// The key now; a source may keep it a while, so a rotation takes effect within that.
    async fn portal_key(&self) -> Result<gridrelay_shared::portal::PortalKey, SecretError>;
}

/// The time now. Injected so decisions can be tested at chosen times.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// The machine's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Draws for the retry randomization (R2), in [0, 1).
pub trait Jitter: Send + Sync {
    fn draw(&self) -> f64;
}

/// Draws from the thread's random generator.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomJitter;

impl Jitter for RandomJitter {
    fn draw(&self) -> f64 {
        rand::random::<f64>()
    }
}
