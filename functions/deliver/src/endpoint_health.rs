//! Delayed delivery (D1) and best-effort skipping of retries (R3) in the deliver worker: which
//! batches may go to each endpoint in this invocation, holding the others back without counting
//! an attempt (as are those the deadline or a subscription's caps leave), and what the attempts
//! taught about each endpoint's health.
//!
//! The rules are `gridrelay_shared::health`; the records are in the delivery state store.
//! Health is per endpoint URL, so a failing endpoint never holds back another one. If the
//! store cannot be read, delivery goes ahead as if the endpoint were healthy.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use gridrelay_ports::update_endpoint_health;
use gridrelay_shared::classify::{AttemptResult, DeliveryOutcome};
use gridrelay_shared::delivery::hold;
use gridrelay_shared::health::{EndpointHealth, Gate, LastFailure};
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
    ) -> HashMap<String, EndpointGate> {
        let endpoints: BTreeSet<&str> = groups
            .iter()
            .filter(|g| !g.events.is_empty())
            .map(|g| g.subscription.endpoint.as_str())
            .collect();
        let policy = &self.settings.health;
        let reads = endpoints.into_iter().map(|endpoint| (endpoint, async move {
            let now = self.ports.clock.now();
            let health = match self.ports.state.endpoint_health(endpoint).await {
                Ok(h) => h.value,
                Err(e) => {
                    warn!(endpoint = %redact_endpoint(endpoint), error = %e, "endpoint health unreadable; delivering as if healthy");
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
                            warn!(endpoint = %redact_endpoint(endpoint), error = %e, "probe lease unavailable; waiting");
                            EndpointGate::Closed(recheck.min(lease))
                        }
                    }
                }
            }
        }));
        let bounded = reads.map(|(endpoint, read)| async move {
            let gate = self.before_stop(deadline, read).await.unwrap_or_else(|| {
                warn!(endpoint = %redact_endpoint(endpoint), "endpoint health not read before the invocation's deadline; delivering as if healthy");
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
        gates: &HashMap<String, EndpointGate>,
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
                    gates
                        .get(&sub.endpoint)
                        .and_then(EndpointGate::held_until)
                        .unwrap_or(now)
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

    /// Records what this invocation's attempts say about each endpoint: a success clears its
    /// record; failures only add to it, and past the threshold delay it (D1). Each change is
    /// made to the record as it is at the write ([`update_endpoint_health`]), not as it was
    /// read before the attempts, so concurrent invocations add up and none undoes a delay.
    pub(crate) async fn record_health(&self, groups: &[Group], attempted: &[Attempted]) {
        let now = self.ports.clock.now();
        // In endpoint order, so a simulation replays the same writes for the same seed.
        let mut seen: BTreeMap<&str, (u32, bool, Option<LastFailure>)> = BTreeMap::new();
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
            if !a.called || (!took_some && matches!(a.result, AttemptResult::NotSent(_))) {
                continue;
            }
            let endpoint = groups[a.group].subscription.endpoint.as_str();
            let entry = seen.entry(endpoint).or_default();
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
        let policy = &self.settings.health;
        let writes = seen.into_iter().map(|(endpoint, (failures, succeeded, last_failure))| async move {
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
        futures::future::join_all(writes).await;
    }
}
