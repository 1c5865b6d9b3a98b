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
//! booking (`DeliveryHistory::rate_booked_at`): it is due on the queue up to a second early
//! (SQS delays are whole seconds), waits in the worker for its start and goes without booking
//! again, however late it comes back, so a backlog goes round the queue once, not once a
//! second, and stays spaced.
//!
//! A slot's lease lasts as long as its request can be open: the attempt timeout and R4's late
//! window (a timed-out request kept open for its late answer gives its slot back when it is
//! closed), and never past the invocation's deadline. So a slot is never taken over while its
//! request is open, and one that could not be given back (the store failed three times, or
//! the instance died) is free again within minutes.
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
use gridrelay_shared::caps::{RateAllowance, held_until};
use gridrelay_shared::subscription::Subscription;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use tracing::{Instrument, warn};

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

/// A batch's turn under its subscription's caps; give it back with [`CapTurn::release`] when
/// its request is closed (dropped, it is given back in a task of its own; if that is lost too,
/// the slot's lease ends by itself).
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
    pub async fn release(mut self) {
        if let Some((store, key, lease)) = self.slot.take() {
            give_back(store, key, lease).await;
        }
    }
}

async fn give_back(store: Arc<dyn DeliveryCapStore>, key: String, lease: String) {
    let mut pause = SLOT_RETRY_FIRST;
    for tries in 1..=RELEASE_TRIES {
        match store.release_slot(&key, &lease).await {
            Ok(()) => return,
            Err(e) if tries == RELEASE_TRIES => {
                warn!(caps_key = %key, error = %e, "could not give a request slot back; its lease ends by itself");
            }
            Err(_) => {
                if can_wait() {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
    }
}

/// How many times a slot is given back before it is left to its lease: a slot not given back
/// is lost to the subscription for minutes.
const RELEASE_TRIES: u32 = 3;

impl Drop for CapTurn {
    fn drop(&mut self) {
        if let Some((store, key, lease)) = self.slot.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(give_back(store, key, lease).instrument(tracing::Span::current()));
        }
    }
}

/// What a batch of a capped subscription is told.
pub(crate) enum Turn {
    Go(CapTurn),
    /// Hold it and hand it on, due `until`; `booked_at`: its events-per-second share is booked
    /// to start then.
    HoldUntil {
        until: DateTime<Utc>,
        booked_at: Option<DateTime<Utc>>,
    },
}

/// The key a subscription's allowances are kept under: a subscription deleted and created again
/// is another one.
fn key_of(sub: &Subscription) -> String {
    format!("{}/{}/{}", sub.topic, sub.name, sub.id)
}

/// Sleeps when a timer is there to sleep on (not in the deterministic simulation, which waits
/// for nothing: it holds instead).
pub(crate) fn can_wait() -> bool {
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
    /// turn under the caps; `booked_at`: its events-per-second share is booked to start then
    /// (it was held for it). A slot's lease lasts until `lease_until` (when its request is
    /// closed at the latest). Uncapped subscriptions go at once.
    pub(crate) async fn turn(
        &self,
        sub: &Subscription,
        events: u32,
        booked_at: Option<DateTime<Utc>>,
        clock: &dyn Clock,
        wait: Duration,
        lease_until: DateTime<Utc>,
    ) -> Turn {
        let caps = sub.delivery_caps;
        if caps.is_unset() {
            return Turn::Go(CapTurn::free());
        }
        let wait = if can_wait() { wait } else { Duration::ZERO };
        let started = tokio::time::Instant::now();
        let left = || wait.saturating_sub(started.elapsed());
        let in_a_second = |booked_at| Turn::HoldUntil {
            until: clock.now() + chrono::Duration::seconds(1),
            booked_at,
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
                return in_a_second(booked_at);
            };
            turn._local = Some(permit);
            let mut pause = SLOT_RETRY_FIRST;
            loop {
                match self
                    .store
                    .acquire_slot(&key, max, clock.now(), lease_until)
                    .await
                {
                    Ok(Some(id)) => {
                        turn.slot = Some((Arc::clone(&self.store), key.clone(), id));
                        break;
                    }
                    Ok(None) if pause < left() => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(SLOT_RETRY_MAX);
                    }
                    Ok(None) => return in_a_second(booked_at),
                    Err(e) => {
                        warn!(caps_key = %key, error = %e, "delivery cap store unavailable; holding the batch");
                        return in_a_second(booked_at);
                    }
                }
            }
        }

        if let Some(rate) = caps.max_events_per_second {
            // A booking whose start has passed is kept, however late the batch comes back:
            // booking again would waste its share and, under a backlog that keeps every batch
            // late, push the schedule on for ever while nothing goes. Batches that come back
            // late unevenly may go closer together than the rate; over the schedule it holds.
            let start = match booked_at {
                Some(start) => start,
                None => match self
                    .store
                    .book_events(
                        &key,
                        events,
                        RateAllowance::new(rate, &sub.batching),
                        clock.now(),
                    )
                    .await
                {
                    Ok(start) => start,
                    Err(e) => {
                        warn!(caps_key = %key, error = %e, "delivery cap store unavailable; holding the batch");
                        turn.release().await;
                        return in_a_second(None);
                    }
                },
            };
            let now = clock.now();
            let until_start = (start - now).to_std().unwrap_or_default();
            if until_start > left() {
                turn.release().await;
                return Turn::HoldUntil {
                    until: held_until(start, now),
                    booked_at: Some(start),
                };
            }
            if !until_start.is_zero() {
                tokio::time::sleep(until_start).await;
            }
        }
        Turn::Go(turn)
    }
}
