//! Read-modify-write of one subscription record, safe against concurrent writers.
//!
//! The handshake, the validation URL and (later) updates each change part of a subscription
//! while others may change it too, or delete it and create another under the same name. A plain
//! read and write-back would undo their changes, or resurrect a deleted subscription with its
//! old endpoint. Here a change is written only over the version it was made to; when the record
//! moved on, the change is made again to the fresh record, and a record of another subscription
//! (another `id`) is never touched.

use chrono::{DateTime, Utc};

use crate::{DeliveryStateStore, StoreError, SubscriptionStore};
use gridrelay_shared::health::EndpointHealth;
use gridrelay_shared::outbound::redact_endpoint;
use gridrelay_shared::subscription::Subscription;

/// How often a change is made again after losing a race before giving up with
/// [`StoreError::Conflict`].
const MAX_TRIES: usize = 8;

/// What came of an update.
#[derive(Debug)]
pub enum Update<R> {
    /// The change was written; the record as stored now.
    Written(Box<Subscription>),
    /// The change declined to apply to the record as it is now, saying why.
    Declined(R),
    /// The subscription was deleted, or replaced by another one of the same name.
    Gone,
}

/// Applies `change` to `current` (the record as the caller read it) and writes it over that
/// version. If the record changed meanwhile it is read again and, if it is still the same
/// subscription, `change` is applied to the fresh record. `change` returns `Err` to leave the
/// record as it is (for example: already validated).
pub async fn update_subscription<R>(
    store: &dyn SubscriptionStore,
    current: Subscription,
    mut change: impl FnMut(&mut Subscription) -> Result<(), R>,
) -> Result<Update<R>, StoreError> {
    let id = current.id.clone();
    let mut record = current;
    for _ in 0..MAX_TRIES {
        if let Err(why) = change(&mut record) {
            return Ok(Update::Declined(why));
        }
        match store.replace_subscription(&mut record).await {
            Ok(()) => return Ok(Update::Written(Box::new(record))),
            Err(StoreError::NotFound(_)) => return Ok(Update::Gone),
            Err(StoreError::Conflict(_)) => {
                match store.get_subscription(&record.topic, &record.name).await? {
                    Some(fresh) if fresh.id == id => record = fresh,
                    _ => return Ok(Update::Gone),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Conflict(format!(
        "subscription {} on topic {} (changed {MAX_TRIES} times while being updated)",
        record.name, record.topic
    )))
}

/// Applies `change` to an endpoint's health record as it is at the write (D1): read, change,
/// write over the version read, again on a conflict. So failures counted by concurrent
/// invocations add up, and a delay one of them set is not undone by another that read before
/// it. Returns the record before and after the change that was written.
pub async fn update_endpoint_health(
    store: &dyn DeliveryStateStore,
    endpoint: &str,
    now: DateTime<Utc>,
    change: impl Fn(EndpointHealth) -> EndpointHealth,
) -> Result<(EndpointHealth, EndpointHealth), StoreError> {
    for _ in 0..MAX_TRIES {
        let read = store.endpoint_health(endpoint).await?;
        let after = change(read.value);
        if after == read.value {
            return Ok((read.value, after));
        }
        match store
            .put_endpoint_health(endpoint, &after, read.version, now)
            .await
        {
            Ok(()) => return Ok((read.value, after)),
            Err(StoreError::Conflict(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Conflict(format!(
        "health of endpoint {} (changed {MAX_TRIES} times while being updated)",
        redact_endpoint(endpoint)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemorySubscriptionStore;
    use gridrelay_shared::schema::InputSchema;
    use gridrelay_shared::subscription::SubscriptionRequest;

    fn new_subscription(endpoint: &str) -> Subscription {
        SubscriptionRequest {
            topic: "orders".into(),
            name: "audit".into(),
            endpoint: endpoint.into(),
            ..SubscriptionRequest::default()
        }
        .validate(InputSchema::EventGridSchema, chrono::Utc::now())
        .unwrap()
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        futures::executor::block_on(f)
    }

    /// Item 6: a change made to a stale copy is made again to the fresh record, so the other
    /// writer's change survives.
    #[test]
    fn a_stale_writer_reapplies_its_change_to_the_fresh_record() {
        let store = MemorySubscriptionStore::default();
        let sub = new_subscription("https://a.example/hook");
        block_on(store.create_subscription(&sub)).unwrap();
        let stale = sub.clone();
        let mut other = sub.clone();
        other.retry_policy.max_delivery_attempts = 3;
        block_on(store.replace_subscription(&mut other)).unwrap();
        assert_eq!(other.version, 1);

        let update = block_on(update_subscription(&store, stale, |s| {
            s.batching.max_events_per_batch = 10;
            Ok::<(), ()>(())
        }))
        .unwrap();
        let Update::Written(written) = update else {
            panic!("expected a write, got {update:?}")
        };
        assert_eq!(written.version, 2);
        let stored = block_on(store.get_subscription("orders", "audit"))
            .unwrap()
            .unwrap();
        assert_eq!(stored.retry_policy.max_delivery_attempts, 3);
        assert_eq!(stored.batching.max_events_per_batch, 10);
    }

    /// Items 5 and 6: a subscription deleted and created again under the same name is another
    /// one; a change meant for the old one is not written over it.
    #[test]
    fn a_recreated_subscription_is_not_written_over() {
        let store = MemorySubscriptionStore::default();
        let old = new_subscription("https://old.example/hook");
        block_on(store.create_subscription(&old)).unwrap();
        block_on(store.delete_subscription("orders", "audit")).unwrap();
        let new = new_subscription("https://new.example/hook");
        block_on(store.create_subscription(&new)).unwrap();

        let update = block_on(update_subscription(&store, old, |s| {
            s.provisioning.state = gridrelay_shared::validation::ProvisioningState::Succeeded;
            Ok::<(), ()>(())
        }))
        .unwrap();
        assert!(matches!(update, Update::Gone), "{update:?}");
        let stored = block_on(store.get_subscription("orders", "audit"))
            .unwrap()
            .unwrap();
        assert_eq!(stored, new);
    }
}
