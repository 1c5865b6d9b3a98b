//! One invocation's attempts, in the steps a reader follows (as svix's worker cuts a
//! dispatch): plan the calls ([`Deliver::plan_calls`]: batches, endpoint gates, events too
//! large to send), then for each batch take its turn ([`Deliver::take_turn`]: the
//! subscription's caps, the endpoint's permit, the deadline), make the call
//! ([`Deliver::call`]), and keep open what a late answer still needs ([`Deliver::finish`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use gridrelay_ports::update_endpoint_health;
use gridrelay_ports::{DeliveryRequest, LateAnswer, SentAttempt};
use gridrelay_shared::batching::plan_batches;
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::concurrency::LoadSignal;
use gridrelay_shared::delivery_attributes::dynamic_headers;
use gridrelay_shared::destination::{CallLimits, ServiceFailure};
use gridrelay_shared::oauth::{
    AccessToken, ClientCredentials, DeliveryAuth, TokenFailure, after_token_failure,
    token_status_key,
};
use gridrelay_shared::replay::REPLAY_HEADER;
use gridrelay_shared::schema::{batch_data_version, delivery_body};
use gridrelay_shared::signing::{signature_header, webhook_id};
use gridrelay_shared::subscription::Subscription;

use crate::endpoint_health::{EndpointGates, Held, HoldReason};
use crate::endpoint_limits::{LimitedEndpoint, SendPermit};
use crate::resources::resource_entry_bytes;
use crate::subscription_caps::{self, CapTurn, Turn};
use tracing::{Instrument, Span, info, warn};

use crate::{Attempted, Deliver, Group, Pending, Resolved, attempt_span, is_delivered};

/// One planned call: a batch of a group's events and the endpoint it goes to.
struct Batch {
    group: usize,
    events: Vec<Pending>,
    endpoint: LimitedEndpoint,
}

/// What one invocation's planning decided for its groups' events.
#[derive(Default)]
struct CallPlan {
    batches: Vec<Batch>,
    /// Batches to a delayed endpoint (D1), held without a call.
    held: Vec<Held>,
    /// S4, B3: events too large for their service's message, failed without a call.
    too_large: Vec<(usize, Pending)>,
}

/// What one call came to, before its permit and caps' turn are given back.
struct Called {
    sent: SentAttempt,
    /// An AWS resource's answer per event (see [`Attempted::per_event`]).
    per_event: Option<Vec<AttemptResult>>,
    called: bool,
    /// A webhook's round-trip time (see [`SendPermit::finish`]).
    rtt: Option<Duration>,
}

impl Deliver {
    /// POSTs every batch of every group, as many at a time as the endpoints' limits allow (G3:
    /// nothing waits to fill a batch).
    /// The events move out of their groups into the batches.
    /// Batches to a delayed endpoint are held instead (D1), except one probe when it is due; a
    /// batch whose turn comes too near the deadline to finish is held and handed on.
    pub(crate) async fn attempt_all(
        &self,
        groups: &mut [Group],
        gates: &mut EndpointGates,
        deadline: DateTime<Utc>,
    ) -> (Vec<Attempted>, Vec<Held>) {
        let CallPlan {
            batches,
            mut held,
            too_large,
        } = self.plan_calls(groups, gates);
        let groups = &*groups;
        // Every batch waits for its endpoint's turn, then the worker's ([`EndpointLimits`]):
        // as many in flight as the endpoints take, a slow one holding up only itself.
        let attempts = batches.into_iter().map(|batch| {
            let span = attempt_span(&groups[batch.group]);
            self.attempt(groups, batch, deadline).instrument(span)
        });
        let results = futures::future::join_all(attempts).await;
        let now = self.ports.clock.now();
        let mut attempted: Vec<Attempted> = too_large
            .into_iter()
            .map(|(group, event)| Attempted::too_large(group, event, now))
            .collect();
        for result in results {
            match result {
                Ok(a) => attempted.push(a),
                Err(h) => held.push(h),
            }
        }
        (attempted, held)
    }

    /// Cuts every group into its calls, admitting each through its endpoint's gate (D1).
    fn plan_calls(&self, groups: &mut [Group], gates: &mut EndpointGates) -> CallPlan {
        let mut plan = CallPlan::default();
        for (g, group) in groups.iter_mut().enumerate() {
            let (calls, too_large) = calls_of(group);
            let mut events: Vec<Option<Pending>> = std::mem::take(&mut group.events)
                .into_iter()
                .map(Some)
                .collect();
            // S4, B3: an event larger than its service's message is never sent; it fails on
            // its own (413), without a call, a turn of the caps or an endpoint permit.
            plan.too_large.extend(
                too_large
                    .iter()
                    .filter_map(|&i| events[i].take())
                    .map(|p| (g, p)),
            );
            let sub = &group.subscription;
            // The endpoint's limit, found once for all the group's batches.
            let mut endpoint = None;
            for call in calls {
                let events: Vec<Pending> = call.iter().filter_map(|&i| events[i].take()).collect();
                if gates.admit(&sub.endpoint) {
                    let endpoint =
                        endpoint.get_or_insert_with(|| self.limits.limited(&sub.endpoint));
                    plan.batches.push(Batch {
                        group: g,
                        events,
                        endpoint: endpoint.clone(),
                    });
                } else {
                    plan.held.push(Held {
                        group: g,
                        events,
                        reason: HoldReason::EndpointDelayed,
                    });
                }
            }
        }
        plan
    }

    /// One batch: its turn, its call, and what its answer leaves open; or held, with why.
    async fn attempt(
        &self,
        groups: &[Group],
        batch: Batch,
        deadline: DateTime<Utc>,
    ) -> Result<Attempted, Held> {
        let Batch {
            group: g,
            events,
            endpoint,
        } = batch;
        let group = &groups[g];
        let (cap_turn, permit) = match self.take_turn(group, &events, &endpoint, deadline).await {
            Ok(turn) => turn,
            Err(reason) => {
                return Err(Held {
                    group: g,
                    events,
                    reason,
                });
            }
        };
        let time = self.ports.clock.now();
        let Called {
            sent,
            per_event,
            called,
            rtt,
        } = self.call(group, &events, time, deadline).await;
        let answered = self.ports.clock.now();
        if called {
            let endpoint = &group.subscription.endpoint;
            let policy = &self.settings.health;
            (self.hosts).saw(endpoint, time, answered, &sent.result, policy);
        }
        let signal = LoadSignal::of(&sent.result);
        let late = Self::finish(sent.late, permit, cap_turn, signal, rtt).await;
        Ok(Attempted {
            group: g,
            events,
            time,
            answered,
            result: sent.result,
            late,
            retry_after: sent.retry_after,
            answer: sent.answer,
            per_event,
            called,
        })
    }

    /// The batch's turn: the subscription's caps first (a batch they hold waits on the queue,
    /// not here), then the endpoint's permit, then the deadline, decided when the turn comes,
    /// not when the batch was planned.
    async fn take_turn(
        &self,
        group: &Group,
        events: &[Pending],
        endpoint: &LimitedEndpoint,
        deadline: DateTime<Utc>,
    ) -> Result<(CapTurn, SendPermit), HoldReason> {
        // A turn that comes too late for an attempt is not waited for: permits held by
        // requests open for late answers come back only after the attempts.
        // (Without a tokio runtime, as in the deterministic simulation, there is no timer
        // and the turn is waited for: nothing there holds permits past its attempt.)
        // Asked at each step: the caps' turn may have waited.
        let last_start = || {
            self.time_left(deadline)
                .saturating_sub(self.settings.attempt_timeout)
        };
        let cap_turn = match self
            .caps
            .turn(
                &group.subscription,
                u32::try_from(events.len()).unwrap_or(u32::MAX),
                group.history.rate_booked_at,
                self.ports.clock.as_ref(),
                self.settings.cap_wait.min(last_start()),
                self.slot_lease_until(deadline, &group.subscription),
            )
            .await
        {
            Turn::Go(turn) => turn,
            Turn::HoldUntil { until, booked_at } => {
                return Err(HoldReason::Capped { until, booked_at });
            }
        };
        let acquire = self.limits.acquire_for(endpoint);
        let permit = if subscription_caps::can_wait() {
            tokio::time::timeout(last_start(), acquire)
                .await
                .map_err(drop)
        } else {
            Ok(acquire.await)
        };
        // #34 item 8: the host was found hung while this batch waited for its turn.
        if self.hosts.is_hung(&group.subscription.endpoint) {
            cap_turn.release().await;
            return Err(HoldReason::EndpointDelayed);
        }
        match permit {
            Ok(permit) if self.can_attempt(deadline) => Ok((cap_turn, permit)),
            _ => {
                cap_turn.release().await;
                Err(HoldReason::Deadline)
            }
        }
    }

    /// The call itself: an AWS resource's put, or the webhook's POST (a subscription whose
    /// secrets could not be read sends nothing and fails).
    async fn call(
        &self,
        group: &Group,
        events: &[Pending],
        time: DateTime<Utc>,
        deadline: DateTime<Utc>,
    ) -> Called {
        if group.subscription.endpoint_type.is_resource() {
            let (results, called) = self.put_resource(group, events, deadline).await;
            let first_failure = results.iter().find(|r| !is_delivered(r)).cloned();
            let summary = first_failure.unwrap_or(AttemptResult::Status(200));
            return Called {
                sent: SentAttempt::of(summary),
                per_event: Some(results),
                called,
                rtt: None,
            };
        }
        // A webhook's round-trip time can show a queue at the endpoint (the send alone, on
        // the runtime's monotonic clock); an AWS call's says little about the resource.
        let (sent, rtt) = match group.headers.as_ref() {
            Ok(resolved) => {
                let request = delivery_request(group, resolved, events, time);
                match &group.subscription.delivery_auth {
                    None => self.timed_send(request).await,
                    Some(auth) => {
                        self.send_authorized(&group.subscription, auth, request, deadline)
                            .await
                    }
                }
            }
            Err(why) => (SentAttempt::not_sent(why.clone()), None),
        };
        Called {
            sent,
            per_event: None,
            called: true,
            rtt,
        }
    }

    /// A1: a token for `sub`'s `credentials` from this worker's token cache
    /// ([`gridrelay_ports::oauth::TokenCache`]), kept or fetched (not `rejected`), through its
    /// secret store, sender and clock: for deliveries and handshakes alike.
    pub(crate) async fn oauth_token(
        &self,
        sub: &Subscription,
        credentials: &ClientCredentials,
        rejected: Option<&AccessToken>,
    ) -> Result<AccessToken, TokenFailure> {
        let answer = self
            .tokens
            .token(
                &sub.id,
                credentials,
                rejected,
                self.ports.secrets.as_ref(),
                self.sender.as_ref(),
                self.ports.clock.as_ref(),
            )
            .await;
        if answer.fetched {
            self.record_token_answer(sub, &answer.token).await;
        }
        answer.token
    }

    /// A1: what a request to the subscription's token endpoint got, in its token record
    /// (`show`'s `deliveryStatus.token`): a failure always; a token only if the record says
    /// failing (a read per token fetched, a write only then). A record that cannot be
    /// written is logged: delivery goes on.
    async fn record_token_answer(
        &self,
        sub: &Subscription,
        answer: &Result<AccessToken, TokenFailure>,
    ) {
        let key = token_status_key(&sub.id);
        let now = self.ports.clock.now();
        let recorded = match answer {
            Err(failure) => {
                update_endpoint_health(self.ports.state.as_ref(), &key, now, |record| {
                    after_token_failure(&record, failure, now)
                })
                .await
            }
            Ok(_) => {
                // A failure another instance recorded may be newer than what this one read.
                self.ports.state.forget(&key);
                update_endpoint_health(self.ports.state.as_ref(), &key, now, |record| {
                    record.after_success()
                })
                .await
            }
        };
        match (recorded, answer) {
            (Err(e), _) => {
                warn!(subscription = %sub.id, error = %e, "could not record the token endpoint's answer");
            }
            (Ok((before, _)), Ok(_)) if !before.is_healthy() => {
                info!(subscription = %sub.id, "the token endpoint gives tokens again");
            }
            (Ok((_, after)), Err(failure)) => {
                warn!(subscription = %sub.id, failures = after.consecutive_failures, error = %failure, "no token from the token endpoint (A1)");
            }
            _ => {}
        }
    }

    /// The request sent, and its round-trip time.
    async fn timed_send(&self, request: DeliveryRequest) -> (SentAttempt, Option<Duration>) {
        let sent_at = tokio::time::Instant::now();
        let sent = self.sender.send(request).await;
        (sent, Some(sent_at.elapsed()))
    }

    /// A1: the request with a bearer token from the subscription's token endpoint (the one
    /// this worker keeps while fresh), and the round-trip time of the last request sent. A
    /// token must come while the invocation still has time to send; an endpoint that answers
    /// 401 gets the request once more with a token fetched again if the invocation has time
    /// for both (otherwise the rejected token is forgotten, for the next attempt to fetch
    /// another). No token is a failed attempt that says why
    /// ([`AttemptResult::TokenUnavailable`]), and nothing is sent.
    async fn send_authorized(
        &self,
        sub: &Subscription,
        auth: &DeliveryAuth,
        request: DeliveryRequest,
        deadline: DateTime<Utc>,
    ) -> (SentAttempt, Option<Duration>) {
        let credentials = auth.client_credentials();
        let timeout = self.settings.attempt_timeout;
        // Waits for the token at most until one attempt's time before the deadline.
        let token = |rejected: Option<AccessToken>| async move {
            let budget = self.time_left(deadline).saturating_sub(timeout);
            let fetched = self.oauth_token(sub, credentials, rejected.as_ref());
            match tokio::time::timeout(budget, fetched).await {
                Ok(fetched) => fetched.map_err(|failure| failure.attempt_result()),
                Err(_) => Err(AttemptResult::TokenUnavailable(
                    "no token before the invocation's deadline".to_string(),
                )),
            }
        };
        let first = match token(None).await {
            Ok(token) => token,
            Err(result) => return (SentAttempt::of(result), None),
        };
        let (sent, rtt) = self.timed_send(authorized(request.clone(), &first)).await;
        if sent.result != AttemptResult::Status(401) {
            return (sent, rtt);
        }
        if self.time_left(deadline) < timeout * 2 {
            self.tokens.forget(&sub.id, credentials, &first).await;
            return (sent, rtt);
        }
        info!(
            "the endpoint answered 401: its OAuth token is fetched again and the request sent once more"
        );
        match token(Some(first)).await {
            Ok(second) => self.timed_send(authorized(request, &second)).await,
            Err(result) => (SentAttempt::of(result), rtt),
        }
    }

    /// Gives back the endpoint's permit and the caps' turn, or, R4, keeps them while a request
    /// is still open for its late answer: it keeps its place in the worker's total, and its
    /// subscription's slot, until the answer is in or no longer awaited (which closes it).
    async fn finish(
        late: Option<LateAnswer>,
        permit: SendPermit,
        cap_turn: CapTurn,
        signal: LoadSignal,
        rtt: Option<Duration>,
    ) -> Option<LateAnswer> {
        match late {
            Some(answer) => {
                let connection = permit.finish_keeping_connection(signal);
                // (`SyncFuture`: a late answer is `Sync`, the slot store's release is not.)
                let open = async move {
                    let _connection = connection;
                    let answer = answer.await;
                    cap_turn.release().await;
                    answer
                };
                Some(Box::pin(sync_wrapper::SyncFuture::new(
                    open.instrument(Span::current()),
                )) as LateAnswer)
            }
            None => {
                permit.finish(signal, rtt);
                cap_turn.release().await;
                None
            }
        }
    }
}

impl Attempted {
    /// An event too large for its service's message (S4, B3): failed (413) without a call.
    fn too_large(group: usize, event: Pending, now: DateTime<Utc>) -> Self {
        Attempted {
            group,
            events: vec![event],
            time: now,
            answered: now,
            result: AttemptResult::Service(ServiceFailure::entry_too_large()),
            late: None,
            retry_after: None,
            answer: Vec::new(),
            per_event: None,
            called: false,
        }
    }
}

/// A1: `request` with `token` as its `Authorization` (in place of any other).
fn authorized(mut request: DeliveryRequest, token: &AccessToken) -> DeliveryRequest {
    request
        .headers
        .retain(|(name, _)| !name.eq_ignore_ascii_case("authorization"));
    request
        .headers
        .push(("authorization".to_string(), token.authorization()));
    request
}

/// A group's calls, as indexes into its events, and the events too large to send at all.
fn calls_of(group: &Group) -> (Vec<Vec<usize>>, Vec<usize>) {
    let sub = &*group.subscription;
    let sizes: Vec<usize> = group
        .events
        .iter()
        .map(|p| p.event.event.get().len())
        .collect();
    match sub.endpoint_type.call_limits() {
        // One message per event: as many to a call as the service takes, and no more than the
        // subscription's events per second allow in one go.
        Some(limits) if !sub.endpoint_type.takes_batches() => {
            let sizes: Vec<usize> = group
                .events
                .iter()
                .map(|p| resource_entry_bytes(group, &p.event.event))
                .collect();
            let limits = CallLimits {
                entries: sub
                    .delivery_caps
                    .max_events_per_second
                    .map_or(limits.entries, |rate| limits.entries.min(rate as usize)),
                ..limits
            };
            limits.pack(&sizes)
        }
        other => {
            let batching = sub.delivery_caps.batching(&sub.batching);
            let (calls, too_large): (Vec<Vec<usize>>, Vec<Vec<usize>>) =
                plan_batches(&sizes, &batching)
                    .into_iter()
                    .map(|range| range.collect::<Vec<usize>>())
                    // A Lambda function's batch of one event larger than its payload (the
                    // body's brackets included) is not sent either.
                    .partition(|batch| match (other, batch.as_slice()) {
                        (Some(limits), [i]) => sizes[*i] + 2 <= limits.entry_bytes,
                        _ => true,
                    });
            (calls, too_large.into_iter().flatten().collect())
        }
    }
}

/// The request for one batch, in the subscription's schema, with Event Grid's headers, the
/// subscription's own, and its Standard Webhooks signature when it signs (the id the same for
/// every attempt of these events, the timestamp `now`).
fn delivery_request(
    group: &Group,
    resolved: &Resolved,
    events: &[Pending],
    now: DateTime<Utc>,
) -> DeliveryRequest {
    let sub = &group.subscription;
    let (content_type, body) =
        delivery_body(events.iter().map(|p| &*p.event.event), group.history.schema);
    let signature = (!resolved.signing.is_empty()).then(|| {
        // A replay's delivery is a delivery of its own (#35): a receiver that drops a
        // webhook-id it has seen takes it.
        let id = match &group.history.replay {
            None => webhook_id(&sub.id, events.iter().map(|p| p.event.event.get())),
            Some(replay) => webhook_id(
                &format!("{}/replay/{}", sub.id, replay.name),
                events.iter().map(|p| p.event.event.get()),
            ),
        };
        let timestamp = now.timestamp();
        let signature = signature_header(&resolved.signing, &id, timestamp, body.as_bytes());
        [
            ("webhook-id".to_string(), id),
            ("webhook-timestamp".to_string(), timestamp.to_string()),
            ("webhook-signature".to_string(), signature),
        ]
    });
    DeliveryRequest {
        endpoint: sub.endpoint.clone(),
        content_type,
        body,
        answer_bytes: sub.answer_bytes_kept(),
        headers: vec![
            ("aeg-event-type".into(), "Notification".to_string()),
            ("aeg-subscription-name".into(), sub.name.clone()),
            (
                "aeg-delivery-count".into(),
                group.history.attempts.to_string(),
            ),
            ("aeg-metadata-version".into(), "1".to_string()),
        ]
        .into_iter()
        .chain(
            batch_data_version(events.iter().map(|p| &*p.event.event), group.history.schema)
                .map(|v| ("aeg-data-version".to_string(), v)),
        )
        .chain(resolved.headers.iter().cloned())
        .chain(dynamic_headers(
            &sub.delivery_attribute_mappings,
            events.iter().map(|p| &*p.event.event),
        ))
        .chain(signature.into_iter().flatten())
        .chain(
            group
                .history
                .replay
                .as_ref()
                .map(|r| (REPLAY_HEADER.to_string(), r.name.clone())),
        )
        .collect(),
    }
}
