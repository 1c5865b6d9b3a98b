//! A subscription's caps in the deliver worker: when a batch of its events may go.
//!
//! The caps (`gridrelay_shared::caps`) are upper bounds a user sets; the allowance is kept in
//! the [`DeliveryCapStore`] so every worker (each Lambda instance) shares it. A batch of a
//! capped subscription first takes one of the subscription's request slots (a lease, given
//! back after the answer, or ending by itself if the worker dies), then books its events in
//! the events-per-second schedule, which says when it may start. What does not get its turn
//! soon waits on the queue instead of in the worker (Lambda bills the wait): it is held and
//! handed on, due when its booking starts (or a second later, for a slot), with its delivery
//! count unchanged, so waiting is never an attempt and never a drop. A held batch keeps its
//! booking (`DeliveryHistory::rate_booked`) and goes without booking again, so a backlog goes
//! round the queue once, not once a second.
//!
//! Within a worker, at most the cap's batches of one subscription ask the store for a slot at
//! once (the others wait on a local semaphore, which costs nothing), so a backlog does not
//! turn into a storm of refused store writes.
//!
//! If the store cannot be reached the batch is held (the caps protect the subscriber; holding
//! costs a moment, not an event).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gridrelay_ports::{Clock, DeliveryCapStore};
use gridrelay_shared::subscription::Subscription;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::warn;

/// How long a batch that found no room waits before it is held, unless the invocation has
/// less time left: a moment, as Lambda bills every millisecond of it.
pub const CAP_WAIT: Duration = Duration::from_secs(2);

/// How long a batch refused a slot waits before asking again, at first (it doubles, up to
/// [`SLOT_RETRY_MAX`]).
const SLOT_RETRY_FIRST: Duration = Duration::from_millis(20);
const SLOT_RETRY_MAX: Duration = Duration::from_millis(400);

/// The caps' allowances as this worker sees them.
pub struct SubscriptionCaps {
    store: Arc<dyn DeliveryCapStore>,
    /// Per subscription and cap: this worker's batches that may ask the store for a slot.
    local: Mutex<HashMap<(String, u32), Arc<Semaphore>>>,
}

/// A batch's turn under its subscription's caps; give it back with [`CapTurn::release`] after
/// the attempt (if it is lost, its slot's lease ends by itself).
#[must_use]
pub struct CapTurn {
    slot: Option<(Arc<dyn DeliveryCapStore>, String, String)>,
    _local: Option<OwnedSemaphorePermit>,
}

impl CapTurn {
    fn free() -> Self {
        Self {
            slot: None,
            _local: None,
        }
    }

    /// Gives the slot back.
    pub async fn release(self) {
        if let Some((store, key, lease)) = &self.slot
            && let Err(e) = store.release_slot(key, lease).await
        {
            warn!(subscription = %key, error = %e, "could not give a request slot back; its lease ends by itself");
        }
    }
}

/// What a batch of a capped subscription is told.
pub(crate) enum Turn {
    Go(CapTurn),
    /// Hold it and hand it on, due then; `booked`: its events-per-second share is booked for
    /// then.
    HoldUntil {
        until: DateTime<Utc>,
        booked: bool,
    },
}

/// The key a subscription's allowances are kept under: a subscription deleted and created again
/// is another one.
fn key_of(sub: &Subscription) -> String {
    format!("{}/{}/{}", sub.topic, sub.name, sub.id)
}

/// Sleeps when a timer is there to sleep on (not in the deterministic simulation, which waits
/// for nothing: it holds instead).
fn can_wait() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

impl SubscriptionCaps {
    pub fn new(store: Arc<dyn DeliveryCapStore>) -> Self {
        Self {
            store,
            local: Mutex::new(HashMap::new()),
        }
    }

    fn local(&self, key: &str, cap: u32) -> Arc<Semaphore> {
        let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        if local.len() >= 4096 {
            local.retain(|_, s| Arc::strong_count(s) > 1);
        }
        Arc::clone(
            local
                .entry((key.to_string(), cap))
                .or_insert_with(|| Arc::new(Semaphore::new(cap as usize))),
        )
    }

    /// Waits, at most `wait` (real time), for a batch of `events` events of `sub` to have its
    /// turn under the caps; `booked` says its events-per-second share is booked for now
    /// already (it was held for it). A slot's lease lasts `lease`. Uncapped subscriptions go
    /// at once.
    pub(crate) async fn turn(
        &self,
        sub: &Subscription,
        events: u32,
        booked: bool,
        clock: &dyn Clock,
        wait: Duration,
        lease: Duration,
    ) -> Turn {
        let caps = sub.delivery_caps;
        if caps.is_unset() {
            return Turn::Go(CapTurn::free());
        }
        let wait = if can_wait() { wait } else { Duration::ZERO };
        let started = tokio::time::Instant::now();
        let left = || wait.saturating_sub(started.elapsed());
        let in_a_second = |booked| Turn::HoldUntil {
            until: clock.now() + chrono::Duration::seconds(1),
            booked,
        };
        let key = key_of(sub);

        let mut turn = CapTurn::free();
        if let Some(max) = caps.max_concurrent_requests {
            let local = self.local(&key, max);
            let permit = if left().is_zero() {
                local.try_acquire_owned().ok()
            } else {
                tokio::time::timeout(left(), local.acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok)
            };
            let Some(permit) = permit else {
                return in_a_second(booked);
            };
            turn._local = Some(permit);
            let mut pause = SLOT_RETRY_FIRST;
            loop {
                let now = clock.now();
                let until = now + chrono::Duration::from_std(lease).unwrap_or_default();
                match self.store.acquire_slot(&key, max, now, until).await {
                    Ok(Some(id)) => {
                        turn.slot = Some((Arc::clone(&self.store), key.clone(), id));
                        break;
                    }
                    Ok(None) if pause < left() => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(SLOT_RETRY_MAX);
                    }
                    Ok(None) => return in_a_second(booked),
                    Err(e) => {
                        warn!(subscription = %key, error = %e, "delivery cap store unavailable; holding the batch");
                        return in_a_second(booked);
                    }
                }
            }
        }

        if let Some(rate) = caps.max_events_per_second
            && !booked
        {
            let now = clock.now();
            match self.store.book_events(&key, events, rate, now).await {
                Ok(start) => {
                    let until_start = (start - now).to_std().unwrap_or_default();
                    if until_start > left() {
                        turn.release().await;
                        return Turn::HoldUntil {
                            until: start,
                            booked: true,
                        };
                    }
                    if !until_start.is_zero() {
                        tokio::time::sleep(until_start).await;
                    }
                }
                Err(e) => {
                    warn!(subscription = %key, error = %e, "delivery cap store unavailable; holding the batch");
                    turn.release().await;
                    return in_a_second(false);
                }
            }
        }
        Turn::Go(turn)
    }
}
