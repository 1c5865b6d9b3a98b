//! Delayed delivery (D1) and best-effort skipping of retries (R3) in the deliver worker: which
//! batches may go to each endpoint in this invocation, holding the others back without counting
//! an attempt (as are those the deadline or a subscription's caps leave), and what the attempts
//! taught about each endpoint's health.
//!
//! The rules are `gridrelay_shared::health`; the records are in the delivery state store.
//! Health is per endpoint URL, so a failing endpoint never holds back another one; and per
//! origin for a host that stops answering across its URLs (#34 item 8): each worker watches
//! what its invocations saw of each origin ([`HostWatch`]), and the first to find one hung
//! delays it for all. If the store cannot be read, delivery goes ahead as if the endpoint were
//! healthy.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use gridrelay_ports::update_endpoint_health;
use gridrelay_shared::classify::{AttemptResult, DeliveryOutcome};
use gridrelay_shared::delivery::hold;
use gridrelay_shared::health::{
    EndpointHealth, Gate, HealthPolicy, HostSilence, LastFailure, host_answered,
    host_did_not_answer, origin_health_key, origin_of_health_key,
};
use gridrelay_shared::journal::{HeldReason, event_fields, held_entry};
use gridrelay_shared::message::DeliveryHistory;
use gridrelay_shared::outbound::redact_endpoint;
use tracing::{info, warn};

use crate::{Attempted, Deliver, Group, Pending, Plan};

/// What one endpoint may receive in this invocation.
pub(crate) enum EndpointGate {
    /// Every batch.
    All,
    /// One probe batch (this invocation holds the lease), then hold the rest until then.
    OneProbe {
        sent: bool,
        rest_until: DateTime<Utc>,
    },
    /// Nothing until then.
    Closed(DateTime<Utc>),
}

impl EndpointGate {
    /// Whether the next batch may be sent.
    pub(crate) fn admit(&mut self) -> bool {
        match self {
            Self::All => true,
            Self::OneProbe { sent, .. } if !*sent => {
                *sent = true;
                true
            }
            _ => false,
        }
    }

    fn held_until(&self) -> Option<DateTime<Utc>> {
        match *self {
            Self::All => None,
            Self::OneProbe { rest_until, .. } => Some(rest_until),
            Self::Closed(t) => Some(t),
        }
    }
}

/// What every endpoint and origin may receive in this invocation.
#[derive(Default)]
pub(crate) struct EndpointGates {
    /// By endpoint URL (or ARN).
    urls: HashMap<String, EndpointGate>,
    /// By origin health key ([`origin_health_key`]): a hung host's gate over all its URLs.
    origins: HashMap<String, EndpointGate>,
    /// Each URL's origin health key, found once per invocation, not per batch.
    origin_of: HashMap<String, String>,
    /// URLs that sent their batch of their origin's probe in this invocation.
    probed: HashSet<String>,
}

impl EndpointGates {
    /// Whether the next batch to `endpoint` may be sent: its origin's gate and its own both
    /// let it. A probing origin lets one batch go to each of its URLs, so a host that answers
    /// some of them clears at once.
    pub(crate) fn admit(&mut self, endpoint: &str) -> bool {
        let origin = self.origin_gate(endpoint);
        let origin_probing = match origin {
            Some(EndpointGate::Closed(_)) => return false,
            Some(EndpointGate::OneProbe { .. }) if self.probed.contains(endpoint) => return false,
            Some(EndpointGate::OneProbe { .. }) => true,
            _ => false,
        };
        let admitted = self.urls.get_mut(endpoint).is_none_or(EndpointGate::admit);
        if admitted && origin_probing {
            self.probed.insert(endpoint.to_string());
        }
        admitted
    }

    /// Until when `endpoint`'s held events wait: the later of its own gate and its origin's.
    fn held_until(&self, endpoint: &str) -> Option<DateTime<Utc>> {
        let own = self.urls.get(endpoint).and_then(EndpointGate::held_until);
        let origin = self
            .origin_gate(endpoint)
            .and_then(EndpointGate::held_until);
        own.max(origin)
    }

    /// The gate of `endpoint`'s origin, if it has one.
    fn origin_gate(&self, endpoint: &str) -> Option<&EndpointGate> {
        self.origin_of
            .get(endpoint)
            .and_then(|key| self.origins.get(key))
    }

    /// Whether every endpoint's and origin's gate was open (none delayed or probing).
    pub(crate) fn all_open(&self) -> bool {
        self.urls
            .values()
            .chain(self.origins.values())
            .all(|g| matches!(g, EndpointGate::All))
    }

    /// Whether the origin's gate was open in this invocation (or it was not read).
    fn origin_open(&self, origin: &str) -> bool {
        self.origins
            .get(origin)
            .is_none_or(|g| matches!(g, EndpointGate::All))
    }
}

/// What a worker (one Lambda instance) has seen of each origin since it last answered, as its
/// attempts end: kept for the worker's lifetime, as its endpoint limits are. When it finds a
/// host hung, its batches to that host still waiting for their turn in this invocation are
/// held, and the invocation delays the host for every worker.
#[derive(Debug, Default)]
pub struct HostWatch {
    origins: Mutex<HashMap<String, Watched>>,
}

#[derive(Debug, Default)]
struct Watched {
    silence: HostSilence,
    /// Found hung, not yet recorded in the store.
    hung: bool,
}

/// Origins a worker keeps watching at once; past it, what was seen is forgotten (a hung host
/// then takes another threshold's worth of timeouts to be found).
const WATCHED_ORIGINS: usize = 4096;

impl HostWatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.origins.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What an attempt to `endpoint`, sent at `sent_at`, came to at `answered_at`.
    pub(crate) fn saw(
        &self,
        endpoint: &str,
        sent_at: DateTime<Utc>,
        answered_at: DateTime<Utc>,
        result: &AttemptResult,
        policy: &HealthPolicy,
    ) {
        let Some(origin) = origin_health_key(endpoint) else {
            return;
        };
        let answered = host_answered(result);
        if !answered && !host_did_not_answer(result) {
            return;
        }
        let mut origins = self.lock();
        if origins.len() >= WATCHED_ORIGINS && !origins.contains_key(&origin) {
            origins.retain(|_, w| w.hung);
        }
        let watched = origins.entry(origin).or_default();
        if answered {
            watched.silence.answered(answered_at);
            watched.hung = false;
        } else {
            watched.silence.unanswered(endpoint, sent_at);
            watched.hung |= watched.silence.is_hung(policy);
        }
    }

    /// A new invocation starts: a host found hung in an earlier one is the store's to hold now
    /// (its record was written, or, if that failed or was cut off, it is found again by what
    /// is sent), never this worker's for good.
    fn new_invocation(&self) {
        for watched in self.lock().values_mut() {
            watched.hung = false;
        }
    }

    /// Whether this worker found `endpoint`'s host hung (and has not recorded it yet).
    pub(crate) fn is_hung(&self, endpoint: &str) -> bool {
        origin_health_key(endpoint)
            .is_some_and(|origin| self.lock().get(&origin).is_some_and(|w| w.hung))
    }

    /// Whether `origin` was found hung since last asked; what was seen of it is cleared, so it
    /// is found again only after as many unanswered attempts again.
    fn take_hung(&self, origin: &str) -> bool {
        let mut origins = self.lock();
        match origins.get_mut(origin) {
            Some(w) if w.hung => {
                w.hung = false;
                w.silence = HostSilence::default();
                true
            }
            _ => false,
        }
    }
}

/// What an invocation's attempts saw of one origin.
#[derive(Default)]
struct OriginSeen {
    answered: bool,
    unanswered: u32,
}

/// Events not attempted in this invocation, and why.
pub(crate) struct Held {
    pub(crate) group: usize,
    pub(crate) events: Vec<Pending>,
    pub(crate) reason: HoldReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldReason {
    /// D1, R3: their endpoint is delayed; they wait until it may be tried.
    EndpointDelayed,
    /// The invocation's deadline is too near to finish an attempt: handed on to the next
    /// invocation at once.
    Deadline,
    /// The subscription's caps left no room: handed on, due `until`; `booked_at`: its
    /// events-per-second share is booked to start then.
    Capped {
        until: DateTime<Utc>,
        booked_at: Option<DateTime<Utc>>,
    },
}

/// #34 item 1: the events of one subscription held for the same reason travel together, packed
/// into as few messages as fit, not one message per batch (an unbatched publish of 100 events
/// held for a delayed endpoint went back as 100 messages, each received and held again).
fn merge_held(held: Vec<Held>) -> Vec<Held> {
    let mut merged: Vec<Held> = Vec::new();
    for h in held {
        match merged
            .iter_mut()
            .find(|m| m.group == h.group && m.reason == h.reason)
        {
            Some(m) => m.events.extend(h.events),
            None => merged.push(h),
        }
    }
    merged
}

impl Deliver {
    /// Reads the health of every endpoint in `groups` and decides what each may receive; a
    /// delayed endpoint whose delay is over gets one probe, if this invocation wins the lease.
    /// A read or lease not answered before the deadline's stop delivers as if healthy, as an
    /// unreadable one does.
    pub(crate) async fn endpoint_gates(
        &self,
        groups: &[Group],
        deadline: DateTime<Utc>,
    ) -> EndpointGates {
        self.hosts.new_invocation();
        let endpoints: BTreeSet<&str> = groups
            .iter()
            .filter(|g| !g.events.is_empty())
            .map(|g| g.subscription.endpoint.as_str())
            .collect();
        let origin_of: HashMap<String, String> = endpoints
            .iter()
            .filter_map(|e| Some((e.to_string(), origin_health_key(e)?)))
            .collect();
        let origins: BTreeSet<String> = origin_of.values().cloned().collect();
        let (urls, origins) = futures::future::join(
            self.gates_of(endpoints.into_iter().map(str::to_string), deadline),
            self.gates_of(origins.into_iter(), deadline),
        )
        .await;
        EndpointGates {
            urls,
            origins,
            origin_of,
            probed: HashSet::new(),
        }
    }

    /// The gates of health records `keys` (endpoints, or origins' keys).
    async fn gates_of(
        &self,
        keys: impl Iterator<Item = String>,
        deadline: DateTime<Utc>,
    ) -> HashMap<String, EndpointGate> {
        let policy = &self.settings.health;
        let keys: Vec<String> = keys.collect();
        let reads = keys.iter().map(|endpoint| (endpoint.as_str(), async move {
            let now = self.ports.clock.now();
            let health = match self.ports.state.endpoint_health(endpoint).await {
                Ok(h) => h.value,
                Err(e) => {
                    warn!(endpoint = %shown(endpoint), error = %e, "endpoint health unreadable; delivering as if healthy");
                    EndpointHealth::default()
                }
            };
            match health.gate(now, policy) {
                Gate::Open => EndpointGate::All,
                Gate::Wait(t) => EndpointGate::Closed(t),
                Gate::Probe => {
                    let lease = now + chrono::Duration::from_std(policy.probe_lease).unwrap_or_default();
                    let recheck = now + chrono::Duration::from_std(policy.recheck).unwrap_or_default();
                    match self.ports.state.acquire_probe(endpoint, now, lease).await {
                        Ok(true) => EndpointGate::OneProbe {
                            sent: false,
                            rest_until: recheck.min(lease),
                        },
                        Ok(false) => EndpointGate::Closed(recheck.min(lease)),
                        Err(e) => {
                            warn!(endpoint = %shown(endpoint), error = %e, "probe lease unavailable; waiting");
                            EndpointGate::Closed(recheck.min(lease))
                        }
                    }
                }
            }
        }));
        let bounded = reads.map(|(endpoint, read)| async move {
            let gate = self.before_stop(deadline, read).await.unwrap_or_else(|| {
                warn!(endpoint = %shown(endpoint), "endpoint health not read before the invocation's deadline; delivering as if healthy");
                EndpointGate::All
            });
            (endpoint.to_string(), gate)
        });
        futures::future::join_all(bounded)
            .await
            .into_iter()
            .collect()
    }

    /// Held events are re-enqueued with their attempt count and last attempt unchanged (not
    /// attempting is not an attempt): D1, R3: those of a delayed endpoint wait until it may be
    /// tried; those the deadline left are due at once.
    pub(crate) fn hold(
        &self,
        groups: &[Group],
        held: Vec<Held>,
        gates: &EndpointGates,
        plan: &mut Plan,
    ) {
        let now = self.ports.clock.now();
        for h in merge_held(held) {
            let group = &groups[h.group];
            let sub = &group.subscription;
            let until_at = match h.reason {
                HoldReason::EndpointDelayed => {
                    let n = h.events.len();
                    plan.count(&sub.topic, &sub.name, |r| r.delayed += n);
                    gates.held_until(&sub.endpoint).unwrap_or_else(|| {
                        // Held because this worker found the host hung just now: the delay
                        // this invocation records for it.
                        chrono::Duration::from_std(self.settings.health.first_delay)
                            .map_or(now, |d| now + d)
                    })
                }
                HoldReason::Deadline => {
                    let n = h.events.len();
                    plan.count(&sub.topic, &sub.name, |r| r.handed_on += n);
                    now
                }
                HoldReason::Capped { until, .. } => {
                    let n = h.events.len();
                    plan.count(&sub.topic, &sub.name, |r| r.throttled += n);
                    until
                }
            };
            let ids = h
                .events
                .iter()
                .map(|p| event_fields(&p.event, group.history.schema).id)
                .collect();
            let reason = match h.reason {
                HoldReason::EndpointDelayed => HeldReason::EndpointDelayed,
                HoldReason::Deadline => HeldReason::Deadline,
                HoldReason::Capped { .. } => HeldReason::Capped,
            };
            plan.journal.push(held_entry(
                sub,
                ids,
                group.history.delivery_name(),
                now,
                (until_at, reason),
            ));
            // Events of one batch may carry different histories; keep each one's.
            let mut by_history: Vec<(Arc<DeliveryHistory>, Vec<Pending>)> = Vec::new();
            for p in h.events {
                match by_history.iter_mut().find(|(k, _)| *k == p.history) {
                    Some((_, list)) => list.push(p),
                    None => by_history.push((Arc::clone(&p.history), vec![p])),
                }
            }
            for (history, events) in by_history {
                let history = match h.reason {
                    HoldReason::Capped { booked_at, .. } if booked_at != history.rate_booked_at => {
                        Arc::new(DeliveryHistory {
                            rate_booked_at: booked_at,
                            ..(*history).clone()
                        })
                    }
                    _ => history,
                };
                let records = events.iter().map(|p| p.record).collect();
                let events = events.into_iter().map(|p| p.event).collect();
                let probation = matches!(h.reason, HoldReason::EndpointDelayed);
                let policy = &sub.retry_policy;
                let scale = self.settings.scale;
                let held = hold(&history, events, until_at, probation);
                for (retry, records) in held.within_ttl(records, policy, scale, now) {
                    let (messages, delay) = retry.packed(now);
                    plan.enqueue_packed(messages, records, delay);
                }
            }
        }
    }

    /// What `attempted` says about each endpoint and origin, for [`Deliver::write_health`].
    pub(crate) fn health_seen(
        &self,
        groups: &[Group],
        attempted: &[Attempted],
        gates: &EndpointGates,
    ) -> HealthSeen {
        let now = self.ports.clock.now();
        let mut seen = HealthSeen {
            origins: self.origin_changes(groups, attempted, gates),
            ..HealthSeen::default()
        };
        for a in attempted {
            // An AWS resource that took some of a call's entries is working: the others were
            // throttled, refused or left unreported one by one, which the retries handle, not
            // a delay.
            let took_some = a.per_event.as_ref().is_some_and(|results| {
                results
                    .iter()
                    .any(|r| DeliveryOutcome::of(r) == DeliveryOutcome::Succeeded)
            });
            // Not the endpoint's doing: nothing was sent to it.
            let unsent = matches!(
                a.result,
                AttemptResult::NotSent(_) | AttemptResult::TokenUnavailable(_)
            );
            if !a.called || (!took_some && unsent) {
                continue;
            }
            let endpoint = &groups[a.group].subscription.endpoint;
            let entry = seen.endpoints.entry(endpoint.clone()).or_default();
            let outcome = DeliveryOutcome::of(&a.result);
            if outcome == DeliveryOutcome::Succeeded || took_some {
                entry.1 = true;
            } else {
                entry.0 += 1;
                entry.2 = Some(LastFailure {
                    at: now,
                    outcome,
                    status: match &a.result {
                        AttemptResult::Status(s) => Some(*s),
                        AttemptResult::Service(f) => Some(f.status),
                        _ => None,
                    },
                });
            }
        }
        seen
    }

    /// Records what an invocation's attempts said ([`Deliver::health_seen`]) about each
    /// endpoint: a success clears its record; failures only add to it, and past the threshold
    /// delay it (D1). Each change is made to the record as it is at the write
    /// ([`update_endpoint_health`]), not as it was read before the attempts, so concurrent
    /// invocations add up and none undoes a delay. Origins likewise.
    pub(crate) async fn write_health(&self, seen: HealthSeen) {
        let now = self.ports.clock.now();
        let origins = seen
            .origins
            .into_iter()
            .map(|(origin, change)| self.record_origin(origin, change, now));
        let policy = &self.settings.health;
        let writes = seen.endpoints.into_iter().map(|(endpoint, (failures, succeeded, last_failure))| async move {
            let endpoint = endpoint.as_str();
            let change = |before: EndpointHealth| {
                let after = if succeeded {
                    before.after_success()
                } else {
                    before.after_failures(failures, now, policy)
                };
                EndpointHealth {
                    last_failure: last_failure.or(after.last_failure),
                    ..after
                }
            };
            // A success clears the record as it is, not as a warm function kept it: a kept
            // "healthy" would make clearing it look like no change, and failures or a delay
            // another invocation stored meanwhile would stay (`gridrelay_ports::cache`).
            if succeeded {
                self.ports.state.forget(endpoint);
            }
            match update_endpoint_health(self.ports.state.as_ref(), endpoint, now, change).await {
                Ok((before, after)) => {
                    if after.is_delayed() && !before.is_delayed() {
                        warn!(endpoint = %redact_endpoint(endpoint), failures = after.consecutive_failures, delayed_until = ?after.delayed_until, "endpoint keeps failing: delivery to it is delayed (D1)");
                    } else if succeeded && before.is_delayed() {
                        info!(endpoint = %redact_endpoint(endpoint), "endpoint recovered: delayed delivery ends");
                    }
                }
                Err(e) => warn!(endpoint = %redact_endpoint(endpoint), error = %e, "could not record endpoint health"),
            }
        });
        futures::future::join(
            futures::future::join_all(writes),
            futures::future::join_all(origins),
        )
        .await;
    }

    /// #34 item 8: what this invocation's attempts say about each origin (a host behind
    /// several URLs). An origin delayed or probing in this invocation is cleared by any answer
    /// from it, or stays delayed for longer if it sent none; an open one is delayed when this
    /// worker finds its host hung ([`HostWatch`]).
    fn origin_changes(
        &self,
        groups: &[Group],
        attempted: &[Attempted],
        gates: &EndpointGates,
    ) -> BTreeMap<String, OriginChange> {
        let mut seen: BTreeMap<String, OriginSeen> = BTreeMap::new();
        for a in attempted.iter().filter(|a| a.called) {
            let endpoint = groups[a.group].subscription.endpoint.as_str();
            let Some(origin) = origin_health_key(endpoint) else {
                continue;
            };
            let entry = seen.entry(origin).or_default();
            if host_did_not_answer(&a.result) {
                entry.unanswered += 1;
            } else if host_answered(&a.result) {
                entry.answered = true;
            }
        }
        seen.into_iter()
            .filter_map(|(origin, seen)| {
                let hung = self.hosts.take_hung(&origin);
                let change = if !gates.origin_open(&origin) {
                    if seen.answered {
                        OriginChange::Answered
                    } else if seen.unanswered > 0 {
                        OriginChange::ProbeUnanswered
                    } else {
                        return None;
                    }
                } else if hung {
                    OriginChange::Hung
                } else {
                    return None;
                };
                Some((origin, change))
            })
            .collect()
    }

    /// Writes what became of an origin to its health record.
    async fn record_origin(&self, origin: String, change: OriginChange, now: DateTime<Utc>) {
        let policy = &self.settings.health;
        let shown_origin = origin_of_health_key(&origin).unwrap_or(&origin);
        if change == OriginChange::Answered {
            // As an endpoint's success: cleared as stored, not as a warm function kept it.
            self.ports.state.forget(&origin);
        }
        let update = |before: EndpointHealth| match change {
            OriginChange::Answered => before.after_success(),
            // One probe round, however many of its URLs it went to.
            OriginChange::ProbeUnanswered => before.after_failures(1, now, policy),
            OriginChange::Hung => before.after_hang(now, policy),
        };
        match update_endpoint_health(self.ports.state.as_ref(), &origin, now, update).await {
            Ok((before, after)) => {
                if after.is_delayed() && !before.is_delayed() {
                    warn!(origin = %shown_origin, delayed_until = ?after.delayed_until, "host does not answer across its URLs: delivery to every URL of it is delayed (D1)");
                } else if !after.is_delayed() && before.is_delayed() {
                    info!(origin = %shown_origin, "host answers again: delayed delivery to its URLs ends");
                }
            }
            Err(e) => {
                warn!(origin = %shown_origin, error = %e, "could not record host health");
            }
        }
    }
}

/// What an invocation's attempts said about endpoints and origins, to be written to their
/// health records ([`Deliver::write_health`]). An ordered invocation adds up its rounds' and
/// writes once, at its end, as an unordered invocation writes once for its whole batch.
#[derive(Debug, Default)]
pub(crate) struct HealthSeen {
    /// Per endpoint (in order, so a simulation replays the same writes for the same seed):
    /// its failed attempts, whether one succeeded, and the last failure.
    endpoints: BTreeMap<String, (u32, bool, Option<LastFailure>)>,
    /// What became of each origin; a later round's word over an earlier one's.
    origins: BTreeMap<String, OriginChange>,
}

impl HealthSeen {
    /// Whether it changes no origin's record (none probed, none found hung).
    pub(crate) fn origins_unchanged(&self) -> bool {
        self.origins.is_empty()
    }

    /// Adds what a later round of the same invocation saw.
    pub(crate) fn add(&mut self, later: HealthSeen) {
        for (endpoint, (failures, succeeded, last_failure)) in later.endpoints {
            let entry = self.endpoints.entry(endpoint).or_default();
            entry.0 += failures;
            entry.1 |= succeeded;
            entry.2 = last_failure.or(entry.2);
        }
        self.origins.extend(later.origins);
    }
}

/// What an invocation's attempts did to an origin's health record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OriginChange {
    /// It was delayed or probing, and answered: cleared.
    Answered,
    /// Its probe round got no answer: delayed for longer.
    ProbeUnanswered,
    /// This worker found it hung: delayed.
    Hung,
}

/// A health record's key as logs show it: an endpoint redacted, an origin as it is (it has no
/// credentials, path or query).
fn shown(key: &str) -> String {
    if origin_of_health_key(key).is_some() {
        key.to_string()
    } else {
        redact_endpoint(key)
    }
}
