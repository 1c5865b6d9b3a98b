//! In-memory implementations of every port, for unit tests and deterministic simulations.
//!
//! They keep the contracts the AWS implementations keep (a queue hides a received message until
//! its visibility timeout and redelivers it until it is deleted; a conditional write refuses a
//! taken name; a lease is held until it expires), read time from an injected [`Clock`] so a
//! test moves time by hand, and each can be told to fail ([`Outage`]) so a test can ask what
//! happens when a call fails. End-to-end tests do not use them: they run the real adapters
//! against an AWS API.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use gridrelay_shared::caps::RateAllowance;
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::dedup::EventIdentity;
use gridrelay_shared::delivery_attributes::SecretValue;
use gridrelay_shared::health::EndpointHealth;
use gridrelay_shared::outbound::redact_endpoint;
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::subscription::{Subscription, SubscriptionRequest, Topic};
use gridrelay_shared::validation::{Provisioning, ProvisioningState};

use crate::{
    Clock, DeliveryCapStore, DeliveryRequest, DeliveryStateStore, EventSender, HandshakeReply,
    HandshakeRequest, Jitter, JournalRead, JournalSource, LateAnswer, MessageQueue, ObjectStore,
    ObjectStoreError, OutgoingMessage, QueueError, ReceivedMessage, RecordStream,
    RecordStreamError, SecretError, SecretStore, SentAttempt, StoreError, SubscriptionStore,
    Versioned,
};

/// Locks a mutex, going on with the data if a panicking test thread poisoned it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A switch that makes a port's calls fail while it is on.
#[derive(Debug, Default)]
pub struct Outage(AtomicBool);

impl Outage {
    pub fn set(&self, down: bool) {
        self.0.store(down, Ordering::SeqCst);
    }

    pub fn is_down(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// `Err("{port} is down")` while the switch is on: each port wraps it in its own error.
    fn check(&self, port: &str) -> Result<(), String> {
        if self.is_down() {
            return Err(format!("{port} is down"));
        }
        Ok(())
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        Self(Mutex::new(start))
    }

    pub fn advance(&self, by: Duration) {
        let mut now = lock(&self.0);
        *now += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
    }

    pub fn set(&self, to: DateTime<Utc>) {
        *lock(&self.0) = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *lock(&self.0)
    }
}

/// The same draw every time (R2's randomization pinned for a test).
#[derive(Debug, Clone, Copy)]
pub struct FixedJitter(pub f64);

impl Jitter for FixedJitter {
    fn draw(&self) -> f64 {
        self.0
    }
}

/// Topics and subscriptions in maps.
#[derive(Debug, Default)]
pub struct MemorySubscriptionStore {
    topics: Mutex<BTreeMap<String, Topic>>,
    subscriptions: Mutex<BTreeMap<(String, String), Subscription>>,
    reads: AtomicUsize,
    pub outage: Outage,
    /// Run once before the next `replace_subscription`, as another writer that got there
    /// first.
    before_replace: OneShotHook,
}

/// A test's action run once at some point of a store's work.
#[derive(Default)]
struct OneShotHook(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl std::fmt::Debug for OneShotHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OneShotHook")
    }
}

impl MemorySubscriptionStore {
    /// Runs `writer` once, just before the next `replace_subscription` writes (a concurrent
    /// writer winning the race).
    pub fn before_replace(&self, writer: impl FnOnce() + Send + 'static) {
        *lock(&self.before_replace.0) = Some(Box::new(writer));
    }

    /// Stores the subscription `request` describes as one whose handshake has succeeded, for
    /// tests of what comes after it (publish, delivery, redrive), and returns it.
    ///
    /// # Panics
    /// If the request is not valid or the name is taken: a test's own setup is wrong.
    pub fn insert_validated(
        &self,
        request: SubscriptionRequest,
        input: InputSchema,
        now: DateTime<Utc>,
    ) -> Subscription {
        let mut sub = request.validate(input, now).expect("a valid subscription");
        sub.provisioning = Provisioning::with_state(ProvisioningState::Succeeded, None);
        let key = (sub.topic.clone(), sub.name.clone());
        let taken = lock(&self.subscriptions).insert(key, sub.clone());
        assert!(taken.is_none(), "subscription {} already stored", sub.name);
        sub
    }

    /// Reads made so far (topics, subscriptions, lists), as a cache in front would save them.
    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    fn check(&self) -> Result<(), StoreError> {
        self.outage
            .check("in-memory store")
            .map_err(StoreError::Unavailable)
    }

    fn check_read(&self) -> Result<(), StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.check()
    }
}

#[async_trait]
impl SubscriptionStore for MemorySubscriptionStore {
    async fn get_topic(&self, name: &str) -> Result<Option<Topic>, StoreError> {
        self.check_read()?;
        Ok(lock(&self.topics).get(name).cloned())
    }

    async fn list_topics(&self) -> Result<Vec<Topic>, StoreError> {
        self.check()?;
        Ok(lock(&self.topics).values().cloned().collect())
    }

    async fn create_topic(&self, topic: &Topic) -> Result<(), StoreError> {
        self.check()?;
        let mut topics = lock(&self.topics);
        if topics.contains_key(&topic.name) {
            return Err(StoreError::AlreadyExists(format!("topic {}", topic.name)));
        }
        topics.insert(topic.name.clone(), topic.clone());
        Ok(())
    }

    async fn replace_topic(&self, topic: &Topic) -> Result<(), StoreError> {
        self.check()?;
        match lock(&self.topics).get_mut(&topic.name) {
            Some(t) => {
                *t = topic.clone();
                Ok(())
            }
            None => Err(StoreError::NotFound(format!("topic {}", topic.name))),
        }
    }

    async fn delete_topic(&self, name: &str) -> Result<bool, StoreError> {
        self.check()?;
        Ok(lock(&self.topics).remove(name).is_some())
    }

    async fn get_subscription(
        &self,
        topic: &str,
        name: &str,
    ) -> Result<Option<Subscription>, StoreError> {
        self.check_read()?;
        Ok(lock(&self.subscriptions)
            .get(&(topic.to_string(), name.to_string()))
            .cloned())
    }

    async fn list_subscriptions(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        self.check_read()?;
        Ok(lock(&self.subscriptions)
            .values()
            .filter(|s| s.topic == topic)
            .cloned()
            .collect())
    }

    async fn create_subscription(&self, subscription: &Subscription) -> Result<(), StoreError> {
        self.check()?;
        let key = (subscription.topic.clone(), subscription.name.clone());
        let mut subs = lock(&self.subscriptions);
        if subs.contains_key(&key) {
            return Err(StoreError::AlreadyExists(format!(
                "subscription {}",
                subscription.name
            )));
        }
        subs.insert(key, subscription.clone());
        Ok(())
    }

    async fn replace_subscription(
        &self,
        subscription: &mut Subscription,
    ) -> Result<(), StoreError> {
        self.check()?;
        let first = lock(&self.before_replace.0).take();
        if let Some(writer) = first {
            writer();
        }
        let key = (subscription.topic.clone(), subscription.name.clone());
        let what = format!(
            "subscription {} on topic {}",
            subscription.name, subscription.topic
        );
        match lock(&self.subscriptions).get_mut(&key) {
            Some(s) if s.id == subscription.id && s.version == subscription.version => {
                subscription.version += 1;
                *s = subscription.clone();
                Ok(())
            }
            Some(_) => Err(StoreError::Conflict(what)),
            None => Err(StoreError::NotFound(what)),
        }
    }

    async fn delete_subscription(&self, topic: &str, name: &str) -> Result<bool, StoreError> {
        self.check()?;
        Ok(lock(&self.subscriptions)
            .remove(&(topic.to_string(), name.to_string()))
            .is_some())
    }

    async fn delete_subscription_if_unchanged(
        &self,
        subscription: &Subscription,
    ) -> Result<bool, StoreError> {
        self.check()?;
        let mut subs = lock(&self.subscriptions);
        let key = (subscription.topic.clone(), subscription.name.clone());
        let unchanged = subs
            .get(&key)
            .is_some_and(|s| s.id == subscription.id && s.version == subscription.version);
        Ok(unchanged && subs.remove(&key).is_some())
    }
}

/// A message as [`MemoryQueue`] holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedMessage {
    pub id: String,
    pub body: String,
    /// Hidden until then (its delay, or the visibility timeout of the last receive).
    pub visible_at: DateTime<Utc>,
    pub receive_count: u32,
    /// Changes on every receive; deleting needs the latest one.
    pub receipt: u64,
}

/// A queue with SQS's contract: delays, visibility timeouts, redelivery until deleted, and a
/// record of every message ever sent.
pub struct MemoryQueue {
    clock: Arc<dyn Clock>,
    messages: Mutex<VecDeque<QueuedMessage>>,
    sent: Mutex<Vec<OutgoingMessage>>,
    send_calls: Mutex<Vec<usize>>,
    next: AtomicU64,
    /// Entries whose body contains this are refused, as SQS refuses single entries of a batch.
    refused: Mutex<Option<String>>,
    pub outage: Outage,
}

impl MemoryQueue {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            messages: Mutex::new(VecDeque::new()),
            sent: Mutex::new(Vec::new()),
            send_calls: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            refused: Mutex::new(None),
            outage: Outage::default(),
        }
    }

    /// From now on, refuses each sent entry whose body contains `needle` (a batch call that
    /// fails for some of its entries), or none with `None`.
    pub fn refuse_entries_containing(&self, needle: Option<&str>) {
        *lock(&self.refused) = needle.map(str::to_string);
    }

    /// Every message accepted so far, in order, whether or not it was received since.
    pub fn sent(&self) -> Vec<OutgoingMessage> {
        lock(&self.sent).clone()
    }

    /// The bytes of message bodies handed over in each `send_all` call so far.
    pub fn send_calls(&self) -> Vec<usize> {
        lock(&self.send_calls).clone()
    }

    /// Messages in the queue, visible or not.
    pub fn len(&self) -> usize {
        lock(&self.messages).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The messages visible now, without receiving them.
    pub fn visible(&self) -> Vec<QueuedMessage> {
        let now = self.clock.now();
        lock(&self.messages)
            .iter()
            .filter(|m| m.visible_at <= now)
            .cloned()
            .collect()
    }

    /// When the next hidden message becomes visible (`None`: the queue is empty).
    pub fn next_visible_at(&self) -> Option<DateTime<Utc>> {
        lock(&self.messages).iter().map(|m| m.visible_at).min()
    }

    /// Up to `max` visible messages, hidden for `visibility` from now.
    pub fn receive(&self, max: usize, visibility: Duration) -> Vec<QueuedMessage> {
        let now = self.clock.now();
        let hidden_until = now + chrono::Duration::from_std(visibility).unwrap_or_default();
        let mut out = Vec::new();
        for m in lock(&self.messages).iter_mut() {
            if out.len() >= max {
                break;
            }
            if m.visible_at <= now {
                m.visible_at = hidden_until;
                m.receive_count += 1;
                m.receipt = self.next.fetch_add(1, Ordering::SeqCst);
                out.push(m.clone());
            }
        }
        out
    }

    /// Deletes a received message; whether its receipt was still current (a message received
    /// again after its visibility timeout has a newer receipt).
    pub fn delete(&self, id: &str, receipt: u64) -> bool {
        let mut messages = lock(&self.messages);
        let before = messages.len();
        messages.retain(|m| !(m.id == id && m.receipt == receipt));
        messages.len() < before
    }
}

impl MemoryQueue {
    fn check(&self) -> Result<(), QueueError> {
        self.outage.check("in-memory queue").map_err(QueueError)
    }

    /// A received message's receipt, as [`MessageQueue`] hands it out.
    fn receipt(handle: &str) -> Result<u64, QueueError> {
        handle
            .parse()
            .map_err(|_| QueueError(format!("not a receipt handle: {handle}")))
    }
}

#[async_trait]
impl MessageQueue for MemoryQueue {
    async fn send_all(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), QueueError>> {
        lock(&self.send_calls).push(messages.iter().map(|m| m.body.len()).sum());
        if let Err(down) = self.check() {
            return messages.iter().map(|_| Err(down.clone())).collect();
        }
        let now = self.clock.now();
        let refused = lock(&self.refused).clone();
        let mut queue = lock(&self.messages);
        let mut sent = lock(&self.sent);
        messages
            .iter()
            .map(|m| {
                if refused.as_deref().is_some_and(|n| m.body.contains(n)) {
                    return Err(QueueError("in-memory queue refused the entry".into()));
                }
                let id = format!("m-{}", self.next.fetch_add(1, Ordering::SeqCst));
                queue.push_back(QueuedMessage {
                    id,
                    body: m.body.clone(),
                    visible_at: now + chrono::Duration::from_std(m.delay).unwrap_or_default(),
                    receive_count: 0,
                    receipt: 0,
                });
                sent.push(m.clone());
                Ok(())
            })
            .collect()
    }

    async fn receive_batch(
        &self,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        self.check()?;
        Ok(self
            .receive(max.min(10), visibility)
            .into_iter()
            .map(|m| ReceivedMessage {
                id: m.id,
                body: m.body,
                receipt_handle: m.receipt.to_string(),
                // Only gridrelay's code writes to an in-memory queue.
                sealed: true,
            })
            .collect())
    }

    async fn delete_received(&self, receipt_handle: &str) -> Result<(), QueueError> {
        self.check()?;
        let receipt = Self::receipt(receipt_handle)?;
        let mut messages = lock(&self.messages);
        messages.retain(|m| m.receipt != receipt);
        Ok(())
    }

    async fn retry_after(&self, receipt_handle: &str, after: Duration) -> Result<(), QueueError> {
        self.check()?;
        let receipt = Self::receipt(receipt_handle)?;
        let visible_at = self.clock.now() + chrono::Duration::from_std(after).unwrap_or_default();
        match lock(&self.messages)
            .iter_mut()
            .find(|m| m.receipt == receipt)
        {
            Some(m) => {
                m.visible_at = visible_at;
                Ok(())
            }
            None => Err(QueueError(format!("no message with receipt {receipt}"))),
        }
    }
}

/// Objects in a map, keyed by bucket and key.
#[derive(Debug, Default)]
pub struct MemoryObjectStore {
    objects: Mutex<BTreeMap<(String, String), String>>,
    /// Buckets that do not exist (every other one does).
    missing: Mutex<BTreeSet<String>>,
    pub outage: Outage,
}

impl MemoryObjectStore {
    pub fn objects(&self) -> BTreeMap<(String, String), String> {
        lock(&self.objects).clone()
    }

    /// Deletes `bucket` with its objects: from then on it does not exist.
    pub fn delete_bucket(&self, bucket: &str) {
        lock(&self.objects).retain(|(b, _), _| b != bucket);
        lock(&self.missing).insert(bucket.to_string());
    }

    fn existing(&self, bucket: &str) -> Result<(), ObjectStoreError> {
        if lock(&self.missing).contains(bucket) {
            return Err(ObjectStoreError::bucket_missing(format!(
                "NoSuchBucket: {bucket}"
            )));
        }
        Ok(())
    }

    fn check(&self) -> Result<(), ObjectStoreError> {
        self.outage
            .check("in-memory object store")
            .map_err(ObjectStoreError::new)
    }
}

#[async_trait]
impl ObjectStore for MemoryObjectStore {
    async fn put_json(
        &self,
        bucket: &str,
        key: &str,
        body: String,
    ) -> Result<(), ObjectStoreError> {
        self.check()?;
        self.existing(bucket)?;
        lock(&self.objects).insert((bucket.to_string(), key.to_string()), body);
        Ok(())
    }

    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, ObjectStoreError> {
        self.check()?;
        self.existing(bucket)?;
        Ok(lock(&self.objects)
            .keys()
            .filter(|(b, k)| b == bucket && k.starts_with(prefix))
            .map(|(_, k)| k.clone())
            .collect())
    }

    async fn get(&self, bucket: &str, key: &str) -> Result<String, ObjectStoreError> {
        self.check()?;
        lock(&self.objects)
            .get(&(bucket.to_string(), key.to_string()))
            .cloned()
            .ok_or_else(|| ObjectStoreError::new(format!("no object {key} in {bucket}")))
    }

    async fn delete(&self, bucket: &str, key: &str) -> Result<(), ObjectStoreError> {
        self.check()?;
        lock(&self.objects).remove(&(bucket.to_string(), key.to_string()));
        Ok(())
    }
}

/// The delivery journal in memory: records as written. It keeps no hours: a read returns all.
#[derive(Debug, Default)]
pub struct MemoryJournal {
    records: Mutex<Vec<Vec<u8>>>,
    pub outage: Outage,
}

impl MemoryJournal {
    /// The entries of the records written so far, read as the stream's objects are, and the
    /// lines that were not entries.
    fn lines(&self) -> (Vec<gridrelay_shared::journal::JournalEntry>, usize) {
        let (lines, damaged) =
            gridrelay_shared::journal::unpack_object(&lock(&self.records).concat());
        let (entries, skipped) = gridrelay_shared::journal::read_lines(&lines);
        (entries, skipped + damaged)
    }

    /// Every entry written so far.
    pub fn entries(&self) -> Vec<gridrelay_shared::journal::JournalEntry> {
        self.lines().0
    }

    /// The lines of every record written so far, unpacked as the stream's objects are read
    /// (for a stream of other lines than journal entries: a topic archive's).
    pub fn written_lines(&self) -> Vec<u8> {
        gridrelay_shared::journal::unpack_object(&lock(&self.records).concat()).0
    }
}

#[async_trait]
impl RecordStream for MemoryJournal {
    async fn put_records(&self, records: &[Vec<u8>]) -> Result<Vec<usize>, RecordStreamError> {
        self.outage
            .check("in-memory journal")
            .map_err(RecordStreamError)?;
        lock(&self.records).extend(records.iter().cloned());
        Ok(Vec::new())
    }
}

#[async_trait]
impl JournalSource for MemoryJournal {
    async fn read_hours(
        &self,
        _from: DateTime<Utc>,
        _to: DateTime<Utc>,
    ) -> Result<JournalRead, RecordStreamError> {
        self.outage
            .check("in-memory journal")
            .map_err(RecordStreamError)?;
        let (entries, skipped) = self.lines();
        Ok(JournalRead { entries, skipped })
    }
}

#[async_trait]
impl crate::ArchiveSource for MemoryJournal {
    async fn read_window(
        &self,
        topic: &str,
        window: &gridrelay_shared::archive::TimeWindow,
    ) -> Result<crate::ArchiveRead, RecordStreamError> {
        self.outage
            .check("in-memory archive")
            .map_err(RecordStreamError)?;
        let (events, skipped) =
            gridrelay_shared::archive::read_archive_lines(&self.written_lines());
        Ok(crate::ArchiveRead {
            events: gridrelay_shared::archive::events_in_window(events, topic, window),
            skipped,
        })
    }

    /// Each record written is an object of its own, named by its place (`memory/0000000007`);
    /// the budget's objects count, its hours do not (there are none).
    async fn read_step(
        &self,
        topic: &str,
        window: &gridrelay_shared::archive::TimeWindow,
        from: Option<&gridrelay_shared::replay::ArchivePosition>,
        budget: gridrelay_shared::replay::StepBudget,
    ) -> Result<crate::ArchiveStep, RecordStreamError> {
        self.outage
            .check("in-memory archive")
            .map_err(RecordStreamError)?;
        let records = lock(&self.records).clone();
        let mut step = crate::ArchiveStep::default();
        let mut objects = 0;
        for (i, record) in records.iter().enumerate() {
            let key = format!("memory/{i:010}");
            if from.is_some_and(|p| key < p.key || p.is_past(&key)) {
                continue;
            }
            if objects == budget.objects {
                step.next = Some(gridrelay_shared::replay::ArchivePosition::resume(
                    from, &key,
                ));
                return Ok(step);
            }
            objects += 1;
            let (lines, damaged) = gridrelay_shared::journal::unpack_object(record);
            step.skipped += damaged;
            if step.take_from(&key, &lines, from, (topic, window), budget) {
                return Ok(step);
            }
        }
        step.next = None;
        Ok(step)
    }
}

/// Replays in a map, by topic and name.
#[derive(Debug, Default)]
pub struct MemoryReplayStore {
    replays: Mutex<BTreeMap<(String, String), gridrelay_shared::replay::Replay>>,
    pub outage: Outage,
}

#[async_trait]
impl crate::ReplayStore for MemoryReplayStore {
    async fn create_replay(
        &self,
        replay: &gridrelay_shared::replay::Replay,
    ) -> Result<(), StoreError> {
        self.outage
            .check("in-memory replays")
            .map_err(StoreError::Unavailable)?;
        let key = (replay.topic.clone(), replay.name.clone());
        let mut replays = lock(&self.replays);
        if replays.contains_key(&key) {
            return Err(StoreError::AlreadyExists(format!(
                "replay {} of topic {}",
                replay.name, replay.topic
            )));
        }
        replays.insert(key, replay.clone());
        Ok(())
    }

    async fn get_replay(
        &self,
        topic: &str,
        name: &str,
    ) -> Result<Option<gridrelay_shared::replay::Replay>, StoreError> {
        self.outage
            .check("in-memory replays")
            .map_err(StoreError::Unavailable)?;
        Ok(lock(&self.replays)
            .get(&(topic.to_string(), name.to_string()))
            .cloned())
    }

    async fn list_replays(
        &self,
        topic: &str,
    ) -> Result<Vec<gridrelay_shared::replay::Replay>, StoreError> {
        self.outage
            .check("in-memory replays")
            .map_err(StoreError::Unavailable)?;
        let mut replays: Vec<_> = lock(&self.replays)
            .values()
            .filter(|r| r.topic == topic)
            .cloned()
            .collect();
        replays.sort_by_key(|r| std::cmp::Reverse(r.created_at));
        Ok(replays)
    }

    async fn update_replay(
        &self,
        replay: &gridrelay_shared::replay::Replay,
        read_version: u64,
    ) -> Result<(), StoreError> {
        self.outage
            .check("in-memory replays")
            .map_err(StoreError::Unavailable)?;
        crate::one_version_on(replay, read_version)?;
        let what = format!("replay {} of topic {}", replay.name, replay.topic);
        let mut replays = lock(&self.replays);
        match replays.get_mut(&(replay.topic.clone(), replay.name.clone())) {
            None => Err(StoreError::NotFound(what)),
            Some(stored) if stored.version != read_version => Err(StoreError::Conflict(what)),
            Some(stored) => {
                *stored = replay.clone();
                Ok(())
            }
        }
    }
}

/// Secrets in a map; a secret's id is its name.
#[derive(Debug, Default)]
pub struct MemorySecretStore {
    secrets: Mutex<HashMap<String, String>>,
    reads: AtomicUsize,
    pub outage: Outage,
    /// While on, deletes fail (and only they).
    pub deletes_down: Outage,
}

impl MemorySecretStore {
    /// Secrets stored now.
    pub fn len(&self) -> usize {
        lock(&self.secrets).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values read so far.
    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl SecretStore for MemorySecretStore {
    async fn put(&self, name: &str, value: &str) -> Result<String, SecretError> {
        self.outage
            .check("in-memory secret store")
            .map_err(SecretError::Unavailable)?;
        lock(&self.secrets).insert(name.to_string(), value.to_string());
        Ok(name.to_string())
    }

    async fn get(&self, id: &str) -> Result<SecretValue, SecretError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.outage
            .check("in-memory secret store")
            .map_err(SecretError::Unavailable)?;
        lock(&self.secrets)
            .get(id)
            .map(SecretValue::new)
            .ok_or_else(|| SecretError::NotFound(id.to_string()))
    }

    async fn delete(&self, id: &str) -> Result<(), SecretError> {
        self.deletes_down
            .check("in-memory secret store's deletes")
            .map_err(SecretError::Unavailable)?;
        lock(&self.secrets).remove(id);
        Ok(())
    }
}

/// Yields to the executor once, woken at once: what a port's call that waits on I/O does, so
/// that calls made at the same time overlap (tests of what happens meanwhile).
pub async fn yield_once() {
    let mut yielded = false;
    futures::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await;
}

/// Topics' accepted event identities in a map (P1).
#[derive(Debug, Default)]
pub struct MemoryAcceptedIds {
    marks: Mutex<HashMap<(String, EventIdentity), DateTime<Utc>>>,
    pub outage: Outage,
}

impl MemoryAcceptedIds {
    /// Identities marked so far, over every topic.
    pub fn marked(&self) -> usize {
        lock(&self.marks).len()
    }

    fn check(&self) -> Result<(), StoreError> {
        self.outage
            .check("in-memory accepted ids")
            .map_err(StoreError::Unavailable)
    }
}

#[async_trait]
impl crate::AcceptedIds for MemoryAcceptedIds {
    async fn accepted_at(
        &self,
        topic: &str,
        ids: &[EventIdentity],
    ) -> Result<HashMap<EventIdentity, DateTime<Utc>>, StoreError> {
        self.check()?;
        let marks = lock(&self.marks);
        Ok(ids
            .iter()
            .filter_map(|id| {
                let at = marks.get(&(topic.to_string(), id.clone()))?;
                Some((id.clone(), *at))
            })
            .collect())
    }

    async fn mark_accepted(
        &self,
        topic: &str,
        ids: &[EventIdentity],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.check()?;
        let mut marks = lock(&self.marks);
        for id in ids {
            marks.insert((topic.to_string(), id.clone()), at);
        }
        Ok(())
    }
}

/// Endpoint health, probe leases and late successes in maps.
#[derive(Debug, Default)]
pub struct MemoryDeliveryStateStore {
    health: Mutex<HashMap<String, Versioned<EndpointHealth>>>,
    late: Mutex<HashMap<String, DateTime<Utc>>>,
    /// O1: ordered messages' kept progress, by message id.
    ordered: Mutex<HashMap<String, String>>,
    /// Each claim's token and until when it holds.
    claims: Mutex<HashMap<String, (String, DateTime<Utc>)>>,
    health_reads: AtomicUsize,
    pub outage: Outage,
    /// While on, every health write loses its race, as if another writer always got there
    /// first ([`StoreError::Conflict`]).
    pub contended: Outage,
}

impl MemoryDeliveryStateStore {
    /// Endpoint health records read so far.
    pub fn health_reads(&self) -> usize {
        self.health_reads.load(Ordering::SeqCst)
    }

    fn check(&self) -> Result<(), StoreError> {
        self.outage
            .check("in-memory delivery state store")
            .map_err(StoreError::Unavailable)
    }
}

#[async_trait]
impl DeliveryStateStore for MemoryDeliveryStateStore {
    async fn endpoint_health(
        &self,
        endpoint: &str,
    ) -> Result<Versioned<EndpointHealth>, StoreError> {
        self.health_reads.fetch_add(1, Ordering::SeqCst);
        self.check()?;
        Ok(lock(&self.health)
            .get(endpoint)
            .copied()
            .unwrap_or_default())
    }

    async fn put_endpoint_health(
        &self,
        endpoint: &str,
        health: &EndpointHealth,
        version: u64,
        _now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.check()?;
        let mut map = lock(&self.health);
        let stored = map.get(endpoint).map_or(0, |r| r.version);
        if stored != version || self.contended.is_down() {
            return Err(StoreError::Conflict(format!(
                "health of endpoint {}",
                redact_endpoint(endpoint)
            )));
        }
        // A healthy record is kept (it expires on AWS) so its version never starts again.
        map.insert(
            endpoint.to_string(),
            Versioned {
                value: *health,
                version: version + 1,
            },
        );
        Ok(())
    }

    async fn acquire_probe(
        &self,
        endpoint: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.check()?;
        let mut map = lock(&self.health);
        let Some(record) = map.get_mut(endpoint) else {
            return Ok(false);
        };
        if record.value.probe_until.is_some_and(|t| t > now) {
            return Ok(false);
        }
        record.value.probe_until = Some(until);
        record.version += 1;
        Ok(true)
    }

    async fn mark_late_success(&self, attempt: &str, now: DateTime<Utc>) -> Result<(), StoreError> {
        self.check()?;
        lock(&self.late).insert(attempt.to_string(), now);
        Ok(())
    }

    async fn late_success(&self, attempt: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.check()?;
        Ok(lock(&self.late).get(attempt).copied())
    }

    async fn ordered_progress(
        &self,
        message_ids: &[String],
    ) -> Result<HashMap<String, String>, StoreError> {
        self.check()?;
        let kept = lock(&self.ordered);
        Ok(message_ids
            .iter()
            .filter_map(|id| Some((id.clone(), kept.get(id)?.clone())))
            .collect())
    }

    async fn put_ordered_progress(
        &self,
        message_id: &str,
        progress: &str,
        _now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.check()?;
        lock(&self.ordered).insert(message_id.to_string(), progress.to_string());
        Ok(())
    }

    async fn claim(
        &self,
        key: &str,
        token: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.check()?;
        let mut claims = lock(&self.claims);
        let holder = claims
            .entry(key.to_string())
            .or_insert_with(|| (token.to_string(), until));
        if holder.0 != token && holder.1 > now {
            return Ok(false);
        }
        *holder = (token.to_string(), until);
        Ok(true)
    }
}

/// How a [`ScriptedSender`] answers a delivery request.
pub type Script = Box<dyn Fn(&DeliveryRequest) -> AttemptResult + Send + Sync>;

/// A subscriber whose answers a test writes: every request is recorded, and answered by the
/// script (a status, a timeout, a refused connection). Handshakes are answered with the code
/// when the body carries one, as a well-behaved Event Grid endpoint does, unless a test gives
/// a handshake script ([`ScriptedSender::on_handshake`]).
pub struct ScriptedSender {
    script: Script,
    requests: Mutex<Vec<DeliveryRequest>>,
    handshake_script: Mutex<Option<Arc<HandshakeScript>>>,
    /// R4: whether a timed-out request stays open for a late answer (one that never comes).
    keeps_timed_out_open: AtomicBool,
    /// What each delivery request waits for before it is answered (a timer of the test's
    /// runtime: this crate has none).
    wait: Mutex<Option<Arc<AnswerWait>>>,
    /// What 429 and 503 answers say in `Retry-After`.
    retry_after: Mutex<Option<Duration>>,
    /// Per endpoint: requests in flight now, and the most there were at once.
    in_flight: Mutex<HashMap<String, (usize, usize)>>,
}

/// What a [`ScriptedSender`] waits for before answering.
pub type AnswerWait = dyn Fn() -> BoxFuture<'static, ()> + Send + Sync;

/// How a [`ScriptedSender`] answers a handshake request, when a test says.
pub type HandshakeScript =
    dyn Fn(&HandshakeRequest) -> Result<HandshakeReply, String> + Send + Sync;

impl ScriptedSender {
    pub fn new(script: impl Fn(&DeliveryRequest) -> AttemptResult + Send + Sync + 'static) -> Self {
        Self {
            script: Box::new(script),
            requests: Mutex::new(Vec::new()),
            handshake_script: Mutex::new(None),
            keeps_timed_out_open: AtomicBool::new(false),
            wait: Mutex::new(None),
            retry_after: Mutex::new(None),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// From now on each delivery request is answered when the future `wait` makes is done
    /// (a sleep, as a slow endpoint takes).
    pub fn answer_after(&self, wait: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static) {
        *lock(&self.wait) = Some(Arc::new(wait));
    }

    /// From now on 429 and 503 answers carry `Retry-After` with this wait.
    pub fn retry_after(&self, wait: Option<Duration>) {
        *lock(&self.retry_after) = wait;
    }

    /// The most requests `endpoint` had in flight at once so far.
    pub fn peak_in_flight(&self, endpoint: &str) -> usize {
        lock(&self.in_flight).get(endpoint).map_or(0, |c| c.1)
    }

    /// R4: from now on a timed-out request stays open for its late answer, as the HTTP sender
    /// keeps it, and the answer never comes.
    pub fn keep_timed_out_requests_open(&self) {
        self.keeps_timed_out_open.store(true, Ordering::SeqCst);
    }

    /// Answers handshakes with `script` from now on (it may act on the world first, as a
    /// concurrent user would during the round trip).
    pub fn on_handshake(
        &self,
        script: impl Fn(&HandshakeRequest) -> Result<HandshakeReply, String> + Send + Sync + 'static,
    ) {
        *lock(&self.handshake_script) = Some(Arc::new(script));
    }

    /// A well-behaved Event Grid endpoint's answer: the code back, when the body carries one;
    /// any origin allowed.
    pub fn answer_with_code(request: &HandshakeRequest) -> HandshakeReply {
        let code = request
            .body
            .as_ref()
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(body).ok())
            .and_then(|v| v[0]["data"]["validationCode"].as_str().map(str::to_string));
        HandshakeReply {
            status: 200,
            headers: vec![("webhook-allowed-origin".into(), "*".into())],
            body: code
                .map(|c| format!("{{\"validationResponse\":\"{c}\"}}").into_bytes())
                .unwrap_or_default(),
        }
    }

    /// Answers every request with this status.
    pub fn status(status: u16) -> Self {
        Self::new(move |_| AttemptResult::Status(status))
    }

    /// Every delivery request so far, in the order they were sent.
    pub fn requests(&self) -> Vec<DeliveryRequest> {
        lock(&self.requests).clone()
    }
}

#[async_trait]
impl EventSender for ScriptedSender {
    async fn send(&self, request: DeliveryRequest) -> SentAttempt {
        let endpoint = request.endpoint.clone();
        {
            let mut in_flight = lock(&self.in_flight);
            let count = in_flight.entry(endpoint.clone()).or_default();
            count.0 += 1;
            count.1 = count.1.max(count.0);
        }
        let wait = lock(&self.wait).clone();
        if let Some(wait) = wait {
            wait().await;
        }
        let result = (self.script)(&request);
        lock(&self.requests).push(request);
        if let Some(count) = lock(&self.in_flight).get_mut(&endpoint) {
            count.0 -= 1;
        }
        let late: Option<LateAnswer> = (result == AttemptResult::TimedOut
            && self.keeps_timed_out_open.load(Ordering::SeqCst))
        .then(|| Box::pin(std::future::pending()) as LateAnswer);
        let retry_after = matches!(result, AttemptResult::Status(429 | 503))
            .then(|| *lock(&self.retry_after))
            .flatten();
        SentAttempt {
            result,
            late,
            retry_after,
            answer: Vec::new(),
        }
    }

    async fn handshake(&self, request: HandshakeRequest) -> Result<HandshakeReply, String> {
        let script = lock(&self.handshake_script).clone();
        match script {
            Some(script) => script(&request),
            None => Ok(Self::answer_with_code(&request)),
        }
    }
}

/// Delivery cap allowances in memory: one process's workers share them exactly.
#[derive(Debug, Default)]
pub struct MemoryDeliveryCapStore {
    /// Until when each subscription's events-per-second allowance is booked.
    booked: Mutex<HashMap<String, DateTime<Utc>>>,
    /// Leases held, by subscription: lease id and when it ends.
    slots: Mutex<HashMap<String, HashMap<String, DateTime<Utc>>>>,
    leases: AtomicU64,
    pub outage: Outage,
}

impl MemoryDeliveryCapStore {
    fn check(&self) -> Result<(), StoreError> {
        self.outage
            .check("in-memory delivery cap store")
            .map_err(StoreError::Unavailable)
    }

    /// Until when `subscription`'s allowance is booked.
    pub fn booked_until(&self, subscription: &str) -> Option<DateTime<Utc>> {
        lock(&self.booked).get(subscription).copied()
    }

    /// Slots of `subscription` leased now (passed leases included until someone needs them).
    pub fn slots_held(&self, subscription: &str) -> usize {
        lock(&self.slots).get(subscription).map_or(0, HashMap::len)
    }
}

#[async_trait]
impl DeliveryCapStore for MemoryDeliveryCapStore {
    async fn book_events(
        &self,
        subscription: &str,
        events: u32,
        allowance: RateAllowance,
        now: DateTime<Utc>,
    ) -> Result<DateTime<Utc>, StoreError> {
        self.check()?;
        let rate = allowance.events_per_second;
        let mut booked = lock(&self.booked);
        let before = booked.get(subscription).copied();
        let booking = gridrelay_shared::caps::book_events(before, now, events, rate);
        booked.insert(subscription.to_string(), booking.booked_until);
        Ok(booking.start)
    }

    async fn acquire_slot(
        &self,
        subscription: &str,
        max: u32,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError> {
        self.check()?;
        let mut slots = lock(&self.slots);
        let held = slots.entry(subscription.to_string()).or_default();
        if held.len() >= max as usize {
            held.retain(|_, ends| *ends > now);
        }
        if held.len() >= max as usize {
            return Ok(None);
        }
        let lease = format!("lease-{}", self.leases.fetch_add(1, Ordering::SeqCst));
        held.insert(lease.clone(), until);
        Ok(Some(lease))
    }

    async fn release_slot(&self, subscription: &str, lease: &str) -> Result<(), StoreError> {
        self.check()?;
        if let Some(held) = lock(&self.slots).get_mut(subscription) {
            held.remove(lease);
        }
        Ok(())
    }
}

/// A resolver with names set by the test, changeable at any time (DNS rebinding).
#[derive(Debug, Default)]
pub struct MemoryResolver {
    names: std::sync::Mutex<HashMap<String, Vec<std::net::IpAddr>>>,
}

impl MemoryResolver {
    /// `host` resolves to `addresses` from now on.
    pub fn set(&self, host: &str, addresses: &[&str]) {
        let addresses = addresses
            .iter()
            .map(|a| a.parse().expect("an IP address"))
            .collect();
        self.names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(host.to_string(), addresses);
    }
}

#[async_trait]
impl crate::endpoints::AddressResolver for MemoryResolver {
    async fn resolve(&self, host: &str, _port: u16) -> Result<Vec<std::net::IpAddr>, String> {
        self.names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(host)
            .cloned()
            .ok_or_else(|| format!("no address for {host}"))
    }
}

/// AWS resource destinations in memory: the ARNs that exist, what each call carried, and an
/// optional script of per-entry results (by default every entry of an existing destination is
/// taken, and a missing one answers 404 as the services do).
#[derive(Default)]
pub struct MemoryDestinations {
    existing: Mutex<std::collections::BTreeSet<String>>,
    calls: Mutex<Vec<crate::ResourceRequest>>,
    taken: Mutex<Vec<(String, crate::ResourceEntry)>>,
    #[allow(clippy::type_complexity)]
    script:
        Mutex<Option<Box<dyn Fn(&crate::ResourceEntry) -> Option<AttemptResult> + Send + Sync>>>,
    #[allow(clippy::type_complexity)]
    call_script:
        Mutex<Option<Box<dyn Fn(&crate::ResourceRequest) -> Option<AttemptResult> + Send + Sync>>>,
    /// Calls never answer (a service that hangs).
    hang: AtomicBool,
}

impl MemoryDestinations {
    /// Makes a destination exist.
    pub fn create(&self, arn: &str) {
        lock(&self.existing).insert(arn.to_string());
    }

    pub fn delete(&self, arn: &str) {
        lock(&self.existing).remove(arn);
    }

    /// Answers an entry with the script's result where it gives one.
    pub fn script(
        &self,
        script: impl Fn(&crate::ResourceEntry) -> Option<AttemptResult> + Send + Sync + 'static,
    ) {
        *lock(&self.script) = Some(Box::new(script));
    }

    /// Fails a whole call with the script's result where it gives one (before any entry's).
    pub fn script_call(
        &self,
        script: impl Fn(&crate::ResourceRequest) -> Option<AttemptResult> + Send + Sync + 'static,
    ) {
        *lock(&self.call_script) = Some(Box::new(script));
    }

    /// From now on calls never answer, until set back.
    pub fn hang(&self, hang: bool) {
        self.hang.store(hang, Ordering::SeqCst);
    }

    /// Every call made, in order.
    pub fn calls(&self) -> Vec<crate::ResourceRequest> {
        lock(&self.calls).clone()
    }

    /// The entries a destination took.
    pub fn taken(&self, arn: &str) -> Vec<crate::ResourceEntry> {
        let taken = lock(&self.taken);
        taken
            .iter()
            .filter(|(a, _)| a == arn)
            .map(|(_, e)| e.clone())
            .collect()
    }

    fn result(&self, arn: &str, entry: &crate::ResourceEntry) -> AttemptResult {
        if !lock(&self.existing).contains(arn) {
            return AttemptResult::Service(gridrelay_shared::destination::ServiceFailure::of_code(
                "ResourceNotFoundException",
                Some(400),
            ));
        }
        lock(&self.script)
            .as_ref()
            .and_then(|s| s(entry))
            .unwrap_or(AttemptResult::Status(200))
    }
}

#[async_trait]
impl crate::ResourceSender for MemoryDestinations {
    async fn put(&self, request: crate::ResourceRequest) -> Vec<AttemptResult> {
        if self.hang.load(Ordering::SeqCst) {
            lock(&self.calls).push(request);
            return futures::future::pending().await;
        }
        let arn = request.destination.arn.clone();
        let whole = lock(&self.call_script).as_ref().and_then(|s| s(&request));
        let results: Vec<AttemptResult> = request
            .entries
            .iter()
            .map(|e| whole.clone().unwrap_or_else(|| self.result(&arn, e)))
            .collect();
        {
            let mut taken = lock(&self.taken);
            for (entry, result) in request.entries.iter().zip(&results) {
                if matches!(result, AttemptResult::Status(200)) {
                    taken.push((arn.clone(), entry.clone()));
                }
            }
        }
        lock(&self.calls).push(request);
        results
    }

    async fn check(
        &self,
        destination: &gridrelay_shared::destination::ResourceDestination,
    ) -> Result<(), crate::DestinationError> {
        if lock(&self.existing).contains(&destination.arn) {
            Ok(())
        } else {
            Err(crate::DestinationError::NotFound(format!(
                "no {} {}",
                destination.endpoint_type.as_str(),
                destination.name
            )))
        }
    }
}
