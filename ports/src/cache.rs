//! Warm-invocation caches in front of the subscription store, the secret store and the
//! delivery state store (issue #9).
//!
//! Why: topics, subscriptions and secret header values change rarely, yet every publish read
//! its topic and its subscriptions (two DynamoDB calls beside the one SQS call that matters),
//! and every `deliver` invocation read each subscription, its secrets and its endpoint's
//! health again. A warm Lambda
//! keeps what it read for a short time ([`CONFIG_CACHE_ENV`], 10 s by default), so a steady
//! stream of publishes costs one AWS call each.
//!
//! What that costs in freshness, and what bounds it:
//! - a change made elsewhere (the command line, another function) reaches a warm function
//!   within the cache's time; a change written through the cache is seen by it at once, and a
//!   read that overlapped a write through it is not kept;
//! - only what exists and receives events is kept: a topic or subscription that was missing,
//!   a subscription still waiting for its handshake, and a list holding one, are read again
//!   every time, so a topic just created is found at once and a subscription validated by
//!   another function receives at once; a list is kept as a whole (an empty one too, so a
//!   topic's first subscription, created elsewhere, is seen within the cache's time);
//! - callers that learn that what they read is out of date say so, for what they read and no
//!   more: `deliver` reads a subscription again when its id is not the one a message was fanned
//!   out for (deleted and created again: its identity,
//!   [`SubscriptionStore::forget_subscription`]) and an endpoint's health before a success
//!   clears it; `ingest` reads a topic again before refusing a key (a regenerated key works at
//!   once) and a subscription before a validation URL is checked against it. Those two come
//!   from requests anyone can send, so they are rechecks ([`SubscriptionStore::recheck_topic`]):
//!   a record is read again at most once per [`RECHECK_INTERVAL`], so the first request with
//!   a new key reads the topic again and a flood of wrong keys costs one read a second per
//!   topic, not one per request.
//!
//! Time is the injected [`Clock`], so tests move it by hand.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gridrelay_shared::delivery_attributes::SecretValue;

use crate::{
    Clock, DeliveryStateStore, SecretError, SecretStore, StoreError, SubscriptionStore, Versioned,
};
use gridrelay_shared::health::EndpointHealth;
use gridrelay_shared::limits::LimitError;
use gridrelay_shared::subscription::{Subscription, Topic};

/// Where the functions read how long they keep what they read (`gridrelay local
/// --config-cache-seconds`).
pub const CONFIG_CACHE_ENV: &str = "GRIDRELAY_CONFIG_CACHE_SECONDS";
/// How long, by default: short enough that a change made with the command line is in effect
/// before anyone could check it by hand, long enough that a function serving a publish every
/// few seconds reads the store once per period.
pub const DEFAULT_CONFIG_CACHE: Duration = Duration::from_secs(10);
/// What [`CONFIG_CACHE_ENV`] accepts, in seconds; 0 keeps nothing.
pub const CONFIG_CACHE_SECONDS: RangeInclusive<u64> = 0..=300;

/// How often a request nobody vouches for may have a kept record read again
/// ([`SubscriptionStore::recheck_topic`]).
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The cache time `seconds` gives, or an error naming the setting, the value and the range.
pub fn config_cache_time(seconds: &str) -> Result<Duration, LimitError> {
    let refuse = || {
        LimitError::new(
            format!("configCacheSeconds ({CONFIG_CACHE_ENV})"),
            seconds,
            format!(
                "a whole number of seconds from {} to {}",
                CONFIG_CACHE_SECONDS.start(),
                CONFIG_CACHE_SECONDS.end()
            ),
        )
    };
    let value: u64 = seconds.trim().parse().map_err(|_| refuse())?;
    if !CONFIG_CACHE_SECONDS.contains(&value) {
        return Err(refuse());
    }
    Ok(Duration::from_secs(value))
}

/// Entries a cache holds before it drops the expired ones (only what exists is kept, so the
/// keys are the topics, subscriptions, secrets and endpoints a function has used).
const KEPT_BEFORE_EVICTING: usize = 1024;

/// Values read at a time, each kept until the cache's time has passed since.
struct Kept<K, V> {
    entries: Mutex<HashMap<K, (V, DateTime<Utc>)>>,
}

impl<K: Eq + Hash, V: Clone> Kept<K, V> {
    fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, (V, DateTime<Utc>)>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The value kept for `key` if it was read less than `ttl` before `now` (a clock that went
    /// back counts as expired).
    fn fresh(&self, key: &K, now: DateTime<Utc>, ttl: Duration) -> Option<V> {
        let entries = self.lock();
        let (value, read_at) = entries.get(key)?;
        let age = (now - *read_at).to_std().ok()?;
        (age < ttl).then(|| value.clone())
    }

    /// Keeps `value` unless `stale` says, under the map's lock, that it may be out of date.
    /// Past [`KEPT_BEFORE_EVICTING`] entries, those older than `ttl` are dropped first.
    fn keep_unless(
        &self,
        key: K,
        value: V,
        read_at: DateTime<Utc>,
        ttl: Duration,
        stale: impl FnOnce() -> bool,
    ) {
        let mut entries = self.lock();
        if stale() {
            return;
        }
        if entries.len() >= KEPT_BEFORE_EVICTING {
            entries.retain(|_, (_, at)| (read_at - *at).to_std().map_or(true, |age| age < ttl));
        }
        entries.insert(key, (value, read_at));
    }

    fn forget_where(&self, mut matches: impl FnMut(&K) -> bool) {
        self.lock().retain(|k, _| !matches(k));
    }

    fn forget(&self, key: &K) {
        self.lock().remove(key);
    }

    /// Whether anything is kept for `key`, fresh or not.
    fn holds(&self, key: &K) -> bool {
        self.lock().contains_key(key)
    }
}

/// A record a recheck is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Recheck {
    Topic(String),
    Subscription(String, String),
    List(String),
}

/// When each kept record was last rechecked on behalf of a request nobody vouches for, so
/// that such requests read a record at most once per [`RECHECK_INTERVAL`]. Only kept records
/// are rechecked (what is not kept is read anyway), so made-up names are never remembered.
struct Rechecks {
    last: Mutex<HashMap<Recheck, DateTime<Utc>>>,
}

/// Rechecks remembered before those older than the interval are dropped.
const RECHECKS_REMEMBERED: usize = 1024;

impl Rechecks {
    fn new() -> Self {
        Self {
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `key` may be read again now; if so, counts this as its recheck.
    fn due(&self, key: Recheck, now: DateTime<Utc>) -> bool {
        let recent =
            |at: &DateTime<Utc>| (now - *at).to_std().is_ok_and(|age| age < RECHECK_INTERVAL);
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.get(&key).is_some_and(recent) {
            return false;
        }
        if last.len() >= RECHECKS_REMEMBERED {
            last.retain(|_, at| recent(at));
        }
        last.insert(key, now);
        true
    }
}

/// When kept values may be used: the clock, the cache's time, and a count of writes, so that
/// a read which overlapped a write is not kept (it may have read the record as it was before).
struct Freshness {
    clock: Arc<dyn Clock>,
    ttl: Duration,
    writes: AtomicU64,
}

impl Freshness {
    fn new(clock: Arc<dyn Clock>, ttl: Duration) -> Self {
        Self {
            clock,
            ttl,
            writes: AtomicU64::new(0),
        }
    }

    fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::SeqCst);
    }

    /// Reads through `read` unless `kept` has a fresh value for `key`, and keeps what exists.
    async fn read<K: Eq + Hash, V: Clone, E>(
        &self,
        kept: &Kept<K, V>,
        key: K,
        read: impl std::future::Future<Output = Result<Option<V>, E>>,
    ) -> Result<Option<V>, E> {
        self.read_keeping(kept, key, read, |_| true).await
    }

    /// As [`Freshness::read`], keeping only what `worth_keeping` says.
    async fn read_keeping<K: Eq + Hash, V: Clone, E>(
        &self,
        kept: &Kept<K, V>,
        key: K,
        read: impl std::future::Future<Output = Result<Option<V>, E>>,
        worth_keeping: impl Fn(&V) -> bool,
    ) -> Result<Option<V>, E> {
        if self.ttl.is_zero() {
            return read.await;
        }
        let now = self.clock.now();
        if let Some(value) = kept.fresh(&key, now, self.ttl) {
            return Ok(Some(value));
        }
        let writes = self.writes.load(Ordering::SeqCst);
        let value = read.await?;
        if let Some(value) = &value
            && worth_keeping(value)
        {
            // Checked under the map's lock, which a write's forgetting takes after counting,
            // so a write that began after the read is either seen here or forgets this.
            kept.keep_unless(key, value.clone(), now, self.ttl, || {
                self.writes.load(Ordering::SeqCst) != writes
            });
        }
        Ok(value)
    }
}

/// Runs `write` with what it may change forgotten before it starts (so a read overlapping it
/// is not kept) and after it ends (so what was read meanwhile is read again).
async fn forgetting_around<T>(forget: impl Fn(), write: impl std::future::Future<Output = T>) -> T {
    forget();
    let result = write.await;
    forget();
    result
}

/// A [`SubscriptionStore`] that keeps the topics, subscription lists and subscriptions it
/// read for `ttl` (see the module's docs for what that means for freshness).
pub struct CachedSubscriptionStore {
    store: Arc<dyn SubscriptionStore>,
    freshness: Freshness,
    topics: Kept<String, Topic>,
    lists: Kept<String, Vec<Subscription>>,
    subscriptions: Kept<(String, String), Subscription>,
    rechecks: Rechecks,
}

impl CachedSubscriptionStore {
    /// In front of `store`; a `ttl` of zero keeps nothing.
    pub fn new(store: Arc<dyn SubscriptionStore>, clock: Arc<dyn Clock>, ttl: Duration) -> Self {
        Self {
            store,
            freshness: Freshness::new(clock, ttl),
            topics: Kept::new(),
            lists: Kept::new(),
            subscriptions: Kept::new(),
            rechecks: Rechecks::new(),
        }
    }

    /// A write to `topic` or one of its subscriptions is about to happen or has happened.
    fn wrote(&self, topic: &str) {
        SubscriptionStore::forget(self, topic);
    }
}

#[async_trait]
impl SubscriptionStore for CachedSubscriptionStore {
    async fn get_topic(&self, name: &str) -> Result<Option<Topic>, StoreError> {
        self.freshness
            .read(&self.topics, name.to_string(), self.store.get_topic(name))
            .await
    }

    async fn list_topics(&self) -> Result<Vec<Topic>, StoreError> {
        self.store.list_topics().await
    }

    async fn create_topic(&self, topic: &Topic) -> Result<(), StoreError> {
        forgetting_around(|| self.wrote(&topic.name), self.store.create_topic(topic)).await
    }

    async fn replace_topic(&self, topic: &Topic) -> Result<(), StoreError> {
        forgetting_around(|| self.wrote(&topic.name), self.store.replace_topic(topic)).await
    }

    async fn delete_topic(&self, name: &str) -> Result<bool, StoreError> {
        forgetting_around(|| self.wrote(name), self.store.delete_topic(name)).await
    }

    async fn get_subscription(
        &self,
        topic: &str,
        name: &str,
    ) -> Result<Option<Subscription>, StoreError> {
        // Only subscriptions that receive events are kept: one waiting for its handshake is
        // validated by another function, and must be seen to receive at once.
        self.freshness
            .read_keeping(
                &self.subscriptions,
                (topic.to_string(), name.to_string()),
                self.store.get_subscription(topic, name),
                Subscription::delivers,
            )
            .await
    }

    async fn list_subscriptions(&self, topic: &str) -> Result<Vec<Subscription>, StoreError> {
        let list = self.store.list_subscriptions(topic);
        let read = async { list.await.map(Some) };
        // Kept only if every subscription in it receives events (see get_subscription).
        let all_deliver = |list: &Vec<Subscription>| list.iter().all(Subscription::delivers);
        Ok(self
            .freshness
            .read_keeping(&self.lists, topic.to_string(), read, all_deliver)
            .await?
            .unwrap_or_default())
    }

    async fn create_subscription(&self, subscription: &Subscription) -> Result<(), StoreError> {
        let write = self.store.create_subscription(subscription);
        forgetting_around(|| self.wrote(&subscription.topic), write).await
    }

    async fn replace_subscription(
        &self,
        subscription: &mut Subscription,
    ) -> Result<(), StoreError> {
        let topic = subscription.topic.clone();
        let write = self.store.replace_subscription(subscription);
        forgetting_around(|| self.wrote(&topic), write).await
    }

    async fn delete_subscription(&self, topic: &str, name: &str) -> Result<bool, StoreError> {
        let write = self.store.delete_subscription(topic, name);
        forgetting_around(|| self.wrote(topic), write).await
    }

    async fn delete_subscription_if_unchanged(
        &self,
        subscription: &Subscription,
    ) -> Result<bool, StoreError> {
        let write = self.store.delete_subscription_if_unchanged(subscription);
        forgetting_around(|| self.wrote(&subscription.topic), write).await
    }

    fn forget(&self, topic: &str) {
        self.freshness.wrote();
        let topic = topic.to_string();
        self.topics.forget(&topic);
        self.lists.forget(&topic);
        self.subscriptions.forget_where(|(t, _)| *t == topic);
    }

    fn forget_subscription(&self, topic: &str, name: &str) {
        self.freshness.wrote();
        self.lists.forget(&topic.to_string());
        self.subscriptions
            .forget(&(topic.to_string(), name.to_string()));
    }

    fn recheck_topic(&self, topic: &str) {
        let key = topic.to_string();
        let now = self.freshness.clock.now();
        if self.topics.holds(&key) && self.rechecks.due(Recheck::Topic(key.clone()), now) {
            // A read in flight since before this must not keep what it read.
            self.freshness.wrote();
            self.topics.forget(&key);
        }
    }

    fn recheck_list(&self, topic: &str) {
        let key = topic.to_string();
        let now = self.freshness.clock.now();
        if self.lists.holds(&key) && self.rechecks.due(Recheck::List(key.clone()), now) {
            self.freshness.wrote();
            self.lists.forget(&key);
        }
    }

    fn recheck_subscription(&self, topic: &str, name: &str) {
        let key = (topic.to_string(), name.to_string());
        let now = self.freshness.clock.now();
        let recheck = Recheck::Subscription(key.0.clone(), key.1.clone());
        if self.subscriptions.holds(&key) && self.rechecks.due(recheck, now) {
            self.freshness.wrote();
            self.subscriptions.forget(&key);
        }
    }
}

/// A [`SecretStore`] that keeps the values it read for `ttl`; values it writes or deletes are
/// forgotten.
pub struct CachedSecretStore {
    secrets: Arc<dyn SecretStore>,
    freshness: Freshness,
    values: Kept<String, SecretValue>,
}

impl CachedSecretStore {
    /// In front of `secrets`; a `ttl` of zero keeps nothing.
    pub fn new(secrets: Arc<dyn SecretStore>, clock: Arc<dyn Clock>, ttl: Duration) -> Self {
        Self {
            secrets,
            freshness: Freshness::new(clock, ttl),
            values: Kept::new(),
        }
    }

    fn wrote(&self) {
        self.freshness.wrote();
        self.values.forget_where(|_| true);
    }
}

#[async_trait]
impl SecretStore for CachedSecretStore {
    async fn put(&self, name: &str, value: &str) -> Result<String, SecretError> {
        forgetting_around(|| self.wrote(), self.secrets.put(name, value)).await
    }

    async fn get(&self, id: &str) -> Result<SecretValue, SecretError> {
        let read = async { self.secrets.get(id).await.map(Some) };
        let value = self
            .freshness
            .read(&self.values, id.to_string(), read)
            .await?;
        value.ok_or_else(|| SecretError::Unavailable(format!("no value read for secret {id}")))
    }

    async fn delete(&self, id: &str) -> Result<(), SecretError> {
        forgetting_around(|| self.wrote(), self.secrets.delete(id)).await
    }
}

/// A [`DeliveryStateStore`] that keeps healthy endpoints' records (no failures, no delay, no
/// probe) for `ttl`, so a warm `deliver` reads the health of an endpoint that answers well
/// once per period. Anything else is read every time, so a delay or its end (D1) is seen at
/// once; a write (a failure counted, a probe taken) forgets the endpoint's record first and
/// after, so an invocation that fails on an endpoint another one found failing reads its
/// record as it is from then on.
pub struct CachedDeliveryState {
    state: Arc<dyn DeliveryStateStore>,
    freshness: Freshness,
    healthy: Kept<String, Versioned<EndpointHealth>>,
}

impl CachedDeliveryState {
    /// In front of `state`; a `ttl` of zero keeps nothing.
    pub fn new(state: Arc<dyn DeliveryStateStore>, clock: Arc<dyn Clock>, ttl: Duration) -> Self {
        Self {
            state,
            freshness: Freshness::new(clock, ttl),
            healthy: Kept::new(),
        }
    }

    fn wrote(&self, endpoint: &str) {
        self.freshness.wrote();
        self.healthy.forget(&endpoint.to_string());
    }
}

#[async_trait]
impl DeliveryStateStore for CachedDeliveryState {
    async fn endpoint_health(
        &self,
        endpoint: &str,
    ) -> Result<Versioned<EndpointHealth>, StoreError> {
        let read = async {
            let record = self.state.endpoint_health(endpoint).await?;
            Ok::<_, StoreError>(Some(record))
        };
        let kept = self
            .freshness
            .read_keeping(&self.healthy, endpoint.to_string(), read, |r| {
                r.value.is_healthy()
            })
            .await?;
        kept.ok_or_else(|| {
            StoreError::Unavailable(format!(
                "no health read for {}",
                gridrelay_shared::outbound::redact_endpoint(endpoint)
            ))
        })
    }

    async fn put_endpoint_health(
        &self,
        endpoint: &str,
        health: &EndpointHealth,
        version: u64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let write = self
            .state
            .put_endpoint_health(endpoint, health, version, now);
        forgetting_around(|| self.wrote(endpoint), write).await
    }

    async fn acquire_probe(
        &self,
        endpoint: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let write = self.state.acquire_probe(endpoint, now, until);
        forgetting_around(|| self.wrote(endpoint), write).await
    }

    async fn mark_late_success(&self, attempt: &str, now: DateTime<Utc>) -> Result<(), StoreError> {
        self.state.mark_late_success(attempt, now).await
    }

    async fn late_success(&self, attempt: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.state.late_success(attempt).await
    }

    async fn ordered_progress(
        &self,
        message_ids: &[String],
    ) -> Result<std::collections::HashMap<String, String>, StoreError> {
        self.state.ordered_progress(message_ids).await
    }

    async fn put_ordered_progress(
        &self,
        message_id: &str,
        progress: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.state
            .put_ordered_progress(message_id, progress, now)
            .await
    }

    async fn claim(
        &self,
        key: &str,
        token: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.state.claim(key, token, now, until).await
    }

    fn forget(&self, endpoint: &str) {
        self.wrote(endpoint);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{ManualClock, MemorySecretStore, MemorySubscriptionStore};
    use futures::executor::block_on;
    use gridrelay_shared::schema::InputSchema;
    use gridrelay_shared::subscription::SubscriptionRequest;
    use gridrelay_shared::validation::{Provisioning, ProvisioningState};

    const TTL: Duration = Duration::from_secs(10);

    fn at_start() -> DateTime<Utc> {
        "2026-11-25T12:00:00Z".parse().unwrap()
    }

    struct Fixture {
        store: Arc<MemorySubscriptionStore>,
        clock: Arc<ManualClock>,
        cached: CachedSubscriptionStore,
    }

    impl Fixture {
        /// The subscription `name` of topic orders, as the cache answers.
        async fn kept(&self, name: &str) -> Option<Subscription> {
            self.cached.get_subscription("orders", name).await.unwrap()
        }

        /// Reads topic orders through the cache, then gives it a new key1 in the store behind
        /// it; answers the topic as read and as it now is.
        async fn regenerate_key_elsewhere(&self) -> (Topic, Topic) {
            let before = self.cached.get_topic("orders").await.unwrap().unwrap();
            let mut regenerated = before.clone();
            regenerated.key1 = Topic::new_key();
            self.store.replace_topic(&regenerated).await.unwrap();
            (before, regenerated)
        }

        /// The names of topic orders' subscriptions, as the cache answers.
        async fn listed(&self) -> Vec<String> {
            let list = self.cached.list_subscriptions("orders").await.unwrap();
            list.into_iter().map(|s| s.name).collect()
        }
    }

    fn fixture(ttl: Duration) -> Fixture {
        let store = Arc::new(MemorySubscriptionStore::default());
        let clock = Arc::new(ManualClock::new(at_start()));
        block_on(store.create_topic(&Topic::with_new_keys("orders", at_start()))).unwrap();
        let cached = CachedSubscriptionStore::new(store.clone(), clock.clone(), ttl);
        Fixture {
            store,
            clock,
            cached,
        }
    }

    /// A subscription waiting for its handshake.
    fn pending(name: &str) -> Subscription {
        SubscriptionRequest {
            topic: "orders".into(),
            name: name.into(),
            endpoint: format!("https://example.com/{name}"),
            ..SubscriptionRequest::default()
        }
        .validate(InputSchema::EventGridSchema, at_start())
        .unwrap()
    }

    /// A subscription that receives events.
    fn subscription(name: &str) -> Subscription {
        Subscription {
            provisioning: Provisioning::with_state(ProvisioningState::Succeeded, None),
            ..pending(name)
        }
    }

    /// Issue #9: a warm function serving many publishes reads the topic and its subscriptions
    /// once per period, and again once the period has passed.
    #[test]
    fn a_topic_and_its_subscriptions_are_read_once_per_period() {
        let f = fixture(TTL);
        block_on(async {
            for _ in 0..100 {
                assert!(f.cached.get_topic("orders").await.unwrap().is_some());
                assert!(f.listed().await.is_empty());
                f.clock.advance(Duration::from_millis(99));
            }
            assert_eq!(f.store.reads(), 2, "one topic read and one list read");
            f.clock.set(at_start() + TTL);
            f.cached.get_topic("orders").await.unwrap();
            f.cached.list_subscriptions("orders").await.unwrap();
            assert_eq!(f.store.reads(), 4, "read again once the period has passed");
        });
    }

    /// What is missing is not kept: a topic or subscription created elsewhere is found at once.
    #[test]
    fn what_is_missing_is_read_every_time() {
        let f = fixture(TTL);
        block_on(async {
            assert!(f.cached.get_topic("payments").await.unwrap().is_none());
            assert!(f.kept("audit").await.is_none());
            f.store
                .create_topic(&Topic::with_new_keys("payments", at_start()))
                .await
                .unwrap();
            f.store
                .create_subscription(&subscription("audit"))
                .await
                .unwrap();
            assert!(f.cached.get_topic("payments").await.unwrap().is_some());
            assert!(f.kept("audit").await.is_some());
        });
    }

    /// A change written through the cache is seen by it at once; one made elsewhere within the
    /// period, and not before it has passed.
    #[test]
    fn changes_through_the_cache_are_seen_at_once_and_others_within_the_period() {
        let f = fixture(TTL);
        block_on(async {
            assert!(f.listed().await.is_empty());
            f.cached
                .create_subscription(&subscription("audit"))
                .await
                .unwrap();
            assert_eq!(f.listed().await, ["audit"]);

            f.store
                .create_subscription(&subscription("billing"))
                .await
                .unwrap();
            f.clock.advance(TTL - Duration::from_millis(1));
            assert_eq!(
                f.listed().await,
                ["audit"],
                "kept until the period has passed"
            );
            f.clock.advance(Duration::from_millis(1));
            assert_eq!(f.listed().await, ["audit", "billing"]);

            let mut audit = f.kept("audit").await.unwrap();
            audit.endpoint = "https://example.com/moved".into();
            f.cached.replace_subscription(&mut audit).await.unwrap();
            let read = f.kept("audit").await.unwrap();
            assert_eq!(read.endpoint, "https://example.com/moved");
            f.cached
                .delete_subscription("orders", "audit")
                .await
                .unwrap();
            assert!(f.kept("audit").await.is_none());
        });
    }

    /// A subscription waiting for its handshake, and a list holding one, are read every time:
    /// the handshake (or the validation URL) runs in another function, and the subscription
    /// must receive events as soon as it is validated there.
    #[test]
    fn a_subscription_waiting_for_its_handshake_is_not_kept() {
        let f = fixture(TTL);
        block_on(async {
            f.store
                .create_subscription(&pending("audit"))
                .await
                .unwrap();
            assert!(f.kept("audit").await.is_some_and(|s| !s.delivers()));
            assert_eq!(f.listed().await, ["audit"]);
            let mut validated = f
                .store
                .get_subscription("orders", "audit")
                .await
                .unwrap()
                .unwrap();
            validated.provisioning = Provisioning::with_state(ProvisioningState::Succeeded, None);
            f.store.replace_subscription(&mut validated).await.unwrap();
            assert!(f.kept("audit").await.is_some_and(|s| s.delivers()));
            let list = f.cached.list_subscriptions("orders").await.unwrap();
            assert!(list.iter().all(Subscription::delivers));
        });
    }

    /// `forget` sends the next read of the topic to the store (what a write elsewhere in
    /// the same process asks for).
    #[test]
    fn a_forgotten_topic_is_read_again() {
        let f = fixture(TTL);
        block_on(async {
            let (before, regenerated) = f.regenerate_key_elsewhere().await;
            assert_eq!(
                f.cached.get_topic("orders").await.unwrap().unwrap().key1,
                before.key1
            );
            f.cached.forget("orders");
            let after = f.cached.get_topic("orders").await.unwrap().unwrap();
            assert_eq!(after.key1, regenerated.key1);
        });
    }

    /// Deliver's identity check (a message fanned out for another id) forgets the one
    /// subscription and its topic's list: the topic and its other subscriptions stay kept.
    #[test]
    fn a_forgotten_subscription_is_read_again_and_the_rest_of_its_topic_stays_kept() {
        let f = fixture(TTL);
        block_on(async {
            for name in ["audit", "billing"] {
                f.store
                    .create_subscription(&subscription(name))
                    .await
                    .unwrap();
            }
            f.cached.get_topic("orders").await.unwrap();
            f.listed().await;
            f.kept("audit").await;
            f.kept("billing").await;
            let reads = f.store.reads();
            f.cached.forget_subscription("orders", "audit");
            f.cached.get_topic("orders").await.unwrap();
            f.kept("billing").await;
            assert_eq!(f.store.reads(), reads, "the topic and billing stay kept");
            f.kept("audit").await;
            assert_eq!(f.store.reads(), reads + 1, "audit is read again");
            f.listed().await;
            assert_eq!(f.store.reads(), reads + 2, "and the list that holds it");
        });
    }

    /// Rechecks come from requests anyone can send (a wrong key, a validation URL): the first
    /// reads the record again, so a regenerated key works at once; a flood of them reads it
    /// once per interval, not once per request.
    #[test]
    fn rechecks_read_a_record_again_at_most_once_per_interval() {
        let f = fixture(TTL);
        block_on(async {
            let (_, regenerated) = f.regenerate_key_elsewhere().await;
            let reads = f.store.reads();
            f.cached.recheck_topic("orders");
            let after = f.cached.get_topic("orders").await.unwrap().unwrap();
            assert_eq!(
                after.key1, regenerated.key1,
                "the first recheck reads again"
            );
            for _ in 0..100 {
                f.cached.recheck_topic("orders");
                f.cached.get_topic("orders").await.unwrap();
            }
            assert_eq!(
                f.store.reads(),
                reads + 1,
                "a flood reads once per interval"
            );
            f.clock.advance(RECHECK_INTERVAL);
            f.cached.recheck_topic("orders");
            f.cached.get_topic("orders").await.unwrap();
            assert_eq!(f.store.reads(), reads + 2, "and again after it");

            f.store
                .create_subscription(&subscription("audit"))
                .await
                .unwrap();
            f.kept("audit").await;
            let reads = f.store.reads();
            for _ in 0..100 {
                f.cached.recheck_subscription("orders", "audit");
                f.kept("audit").await;
            }
            assert_eq!(f.store.reads(), reads + 1, "subscriptions alike");
        });
    }

    /// Expired entries are dropped once a cache holds many: a function that has served
    /// thousands of topics does not keep them all for its life.
    #[test]
    fn expired_entries_are_dropped_once_many_are_kept() {
        let f = fixture(TTL);
        block_on(async {
            for i in 0..KEPT_BEFORE_EVICTING {
                let name = format!("topic-{i}");
                f.store
                    .create_topic(&Topic::with_new_keys(&name, at_start()))
                    .await
                    .unwrap();
                f.cached.get_topic(&name).await.unwrap();
            }
            assert_eq!(f.cached.topics.lock().len(), KEPT_BEFORE_EVICTING);
            f.clock.advance(TTL);
            f.cached.get_topic("orders").await.unwrap();
            assert_eq!(f.cached.topics.lock().len(), 1, "only the one just read");
        });
    }

    /// Only kept records are rechecked, so made-up names (a validation URL anyone can follow,
    /// with any name or none) are never remembered and never hold back a topic's own recheck:
    /// a regenerated key still works at once after a flood of them.
    #[test]
    fn rechecks_of_names_not_kept_are_not_remembered_and_hold_nothing_back() {
        let f = fixture(TTL);
        block_on(async {
            f.cached.get_topic("orders").await.unwrap();
            for i in 0..RECHECKS_REMEMBERED * 3 {
                f.cached
                    .recheck_subscription("orders", &format!("made-up-{i}"));
            }
            f.cached.recheck_subscription("orders", "");
            assert!(f.cached.rechecks.last.lock().unwrap().is_empty());
            let (_, regenerated) = f.regenerate_key_elsewhere().await;
            f.cached.recheck_topic("orders");
            let after = f.cached.get_topic("orders").await.unwrap().unwrap();
            assert_eq!(after.key1, regenerated.key1);
        });
    }

    /// A cache time of zero keeps nothing, and a clock that went back does not make a kept
    /// value fresh.
    #[test]
    fn nothing_is_kept_at_zero_and_a_clock_gone_back_expires() {
        let f = fixture(Duration::ZERO);
        block_on(async {
            f.cached.get_topic("orders").await.unwrap();
            f.cached.get_topic("orders").await.unwrap();
            assert_eq!(f.store.reads(), 2);
        });
        let f = fixture(TTL);
        block_on(async {
            f.cached.get_topic("orders").await.unwrap();
            f.clock.set(at_start() - Duration::from_secs(1));
            f.cached.get_topic("orders").await.unwrap();
            assert_eq!(f.store.reads(), 2);
        });
    }

    /// Secret header values are read once per period; a value written through the cache is
    /// read again.
    #[test]
    fn secret_values_are_read_once_per_period() {
        let secrets = Arc::new(MemorySecretStore::default());
        let clock = Arc::new(ManualClock::new(at_start()));
        let cached = CachedSecretStore::new(secrets.clone(), clock.clone(), TTL);
        block_on(async {
            let id = cached
                .put("gridrelay/orders/audit/x-key", "one")
                .await
                .unwrap();
            for _ in 0..10 {
                assert_eq!(cached.get(&id).await.unwrap().expose(), "one");
            }
            assert_eq!(secrets.reads(), 1);
            cached
                .put("gridrelay/orders/audit/x-key", "two")
                .await
                .unwrap();
            assert_eq!(cached.get(&id).await.unwrap().expose(), "two");
            clock.advance(TTL);
            cached.get(&id).await.unwrap();
            assert_eq!(secrets.reads(), 3);
            assert!(cached.get("missing").await.is_err(), "errors are not kept");
        });
    }

    /// A secret store whose reads pause after reading, until told to go on.
    struct PausedSecrets {
        secrets: MemorySecretStore,
        gate: Mutex<Option<futures::channel::oneshot::Receiver<()>>>,
    }

    #[async_trait]
    impl SecretStore for PausedSecrets {
        async fn put(&self, name: &str, value: &str) -> Result<String, SecretError> {
            self.secrets.put(name, value).await
        }
        async fn get(&self, id: &str) -> Result<SecretValue, SecretError> {
            let value = self.secrets.get(id).await;
            let gate = self.gate.lock().unwrap().take();
            if let Some(gate) = gate {
                let _ = gate.await;
            }
            value
        }
        async fn delete(&self, id: &str) -> Result<(), SecretError> {
            self.secrets.delete(id).await
        }
    }

    /// A read that overlapped a write through the cache is not kept: it may hold the value
    /// from before the write, which would then be served for a whole period.
    #[test]
    fn a_read_that_overlapped_a_write_is_not_kept() {
        let (go_on, gate) = futures::channel::oneshot::channel();
        let paused = Arc::new(PausedSecrets {
            secrets: MemorySecretStore::default(),
            gate: Mutex::new(Some(gate)),
        });
        let clock = Arc::new(ManualClock::new(at_start()));
        let cached = CachedSecretStore::new(paused.clone(), clock, TTL);
        block_on(async {
            paused.secrets.put("s", "old").await.unwrap();
            let read = cached.get("s");
            let write = async {
                cached.put("s", "new").await.unwrap();
                go_on.send(()).unwrap();
            };
            let (old, ()) = futures::join!(read, write);
            assert_eq!(
                old.unwrap().expose(),
                "old",
                "the read began before the write"
            );
            assert_eq!(
                cached.get("s").await.unwrap().expose(),
                "new",
                "and was not kept"
            );
        });
    }

    /// D1 with a warm cache: a healthy endpoint's record is read once per period; one with
    /// failures is read every time; a failure counted through the cache on a record another
    /// invocation moved on meanwhile (the kept healthy record is then out of date) is counted
    /// on the record as it is, not lost to conflicts.
    #[test]
    fn only_healthy_endpoints_are_kept_and_a_stale_one_does_not_block_a_write_d1() {
        use crate::memory::MemoryDeliveryStateStore;
        use crate::update_endpoint_health;
        let state = Arc::new(MemoryDeliveryStateStore::default());
        let clock = Arc::new(ManualClock::new(at_start()));
        let cached = CachedDeliveryState::new(state.clone(), clock.clone(), TTL);
        let failed = |h: EndpointHealth| EndpointHealth {
            consecutive_failures: h.consecutive_failures + 1,
            ..h
        };
        block_on(async {
            for _ in 0..5 {
                assert_eq!(
                    cached.endpoint_health("a").await.unwrap().value,
                    EndpointHealth::default()
                );
            }
            assert_eq!(state.health_reads(), 1, "healthy: kept");

            // Another invocation counts two failures; this one still keeps "healthy".
            for _ in 0..2 {
                update_endpoint_health(state.as_ref(), "a", at_start(), failed)
                    .await
                    .unwrap();
            }
            assert_eq!(cached.endpoint_health("a").await.unwrap().version, 0);
            // Its own failure, counted through the cache, lands on the record as it is.
            let (before, after) = update_endpoint_health(&cached, "a", at_start(), failed)
                .await
                .unwrap();
            assert_eq!(before.consecutive_failures, 2);
            assert_eq!(after.consecutive_failures, 3);
            let reads = state.health_reads();
            for _ in 0..3 {
                assert_eq!(
                    cached
                        .endpoint_health("a")
                        .await
                        .unwrap()
                        .value
                        .consecutive_failures,
                    3
                );
            }
            assert_eq!(state.health_reads(), reads + 3, "failing: read every time");
        });
    }

    /// The setting is refused out of range, naming it, the value and the range.
    #[test]
    fn the_cache_time_is_validated() {
        assert_eq!(config_cache_time("0"), Ok(Duration::ZERO));
        assert_eq!(config_cache_time(" 10 "), Ok(TTL));
        assert_eq!(config_cache_time("300"), Ok(Duration::from_secs(300)));
        for bad in ["301", "-1", "ten", "1.5", ""] {
            let e = config_cache_time(bad).unwrap_err().to_string();
            assert!(e.contains("GRIDRELAY_CONFIG_CACHE_SECONDS"), "{e}");
            assert!(e.contains(&format!("is {bad};")), "{e}");
            assert!(e.contains("from 0 to 300"), "{e}");
        }
    }
}
