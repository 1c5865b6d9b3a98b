//! Delivery to a subscription's AWS resource (S4): its events as the service's entries, each
//! too large for the service failed without a call, a destination the installation does not
//! allow failed (403) without one, and a call refused as too large together sent again apart.

use std::time::Duration;

use chrono::{DateTime, Utc};
use gridrelay_ports::{ResourceEntry, ResourceRequest};
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::destination::{
    MessageContext, ResourceDestination, RoutingFields, ServiceFailure, entry_bytes,
};
use gridrelay_shared::schema::{delivery_body, event_body};
use tracing::warn;

use crate::{Deliver, Group, MIN_RESOURCE_CALL_TIMEOUT, Pending, subscription_caps};

impl Deliver {
    /// One call to a subscription's AWS resource (S4): its events as entries (a Lambda
    /// function's batch as one), each too large for the service failed at once (413) without
    /// a call, and a destination the installation does not allow failed (403) without one.
    /// What became of each event, in order, and whether a call was made.
    pub(crate) async fn put_resource(
        &self,
        group: &Group,
        events: &[Pending],
        deadline: DateTime<Utc>,
    ) -> (Vec<AttemptResult>, bool) {
        let sub = &group.subscription;
        let every = |result: AttemptResult| (vec![result; events.len()], false);
        let Some(destination) = sub.resource() else {
            return every(AttemptResult::NotSent(format!(
                "the stored endpoint is not {} ARN",
                sub.endpoint_type.as_str()
            )));
        };
        if self.settings.destinations.is_own_queue(&destination) {
            warn!(
                destination = %destination.arn,
                "the destination is one of this installation's own queues: never written (403)"
            );
        }
        if !self.settings.destinations.permits(&destination) {
            return every(AttemptResult::Service(ServiceFailure::of_code(
                "AccessDenied",
                None,
            )));
        }
        let Some(limits) = sub.endpoint_type.call_limits() else {
            return every(AttemptResult::NotSent("not a resource".to_string()));
        };
        let schema = group.history.schema;
        let entries: Vec<ResourceEntry> = if sub.endpoint_type.takes_batches() {
            let (_, body) = delivery_body(events.iter().map(|p| &*p.event.event), schema);
            let fields = match events {
                [only] => RoutingFields::of(&only.event.event, schema),
                _ => RoutingFields::default(),
            };
            vec![ResourceEntry { body, fields }]
        } else {
            events
                .iter()
                .map(|p| ResourceEntry {
                    body: event_body(&p.event.event, schema).to_string(),
                    fields: RoutingFields::of(&p.event.event, schema),
                })
                .collect()
        };
        let context = message_context(group);
        let too_large = entries.iter().any(|e| {
            entry_bytes(sub.endpoint_type, &e.body, &e.fields, &context) > limits.entry_bytes
        });
        // Planned calls hold one event too large for the service alone (a Lambda function's
        // batch: one event larger than its payload).
        if too_large {
            return every(AttemptResult::Service(ServiceFailure::entry_too_large()));
        }
        let request = ResourceRequest {
            destination: ResourceDestination::clone(&destination),
            topic: sub.topic.clone(),
            subscription: sub.name.clone(),
            delivery_count: group.history.attempts,
            entries,
        };
        let results = self.put_apart_if_too_large(request, deadline).await;
        let results = match results.len() {
            // A Lambda function's one result is every event's of its batch (B5).
            1 if sub.endpoint_type.takes_batches() => vec![results[0].clone(); events.len()],
            n if n == events.len() => results,
            _ => vec![
                AttemptResult::NotSent(
                    "the destination's answer did not cover every entry".to_string()
                );
                events.len()
            ],
        };
        (results, true)
    }

    /// One call; if the service refuses it as a whole as too large (413: SQS's
    /// `BatchRequestTooLong` for a queue whose messages are smaller than SQS's largest, say),
    /// its entries are sent again in two halves, one after the other, and so on down to single
    /// entries, so each event answers for itself and the subscription's caps (one call at a
    /// time) still hold. Halves are sent only while a whole call still fits before the
    /// deadline; entries left unsent are failed attempts retried on the ladder.
    async fn put_apart_if_too_large(
        &self,
        request: ResourceRequest,
        deadline: DateTime<Utc>,
    ) -> Vec<AttemptResult> {
        let mut pending = vec![request];
        let mut results = Vec::new();
        // Depth first, in entry order: the results come out in the entries' order.
        while let Some(request) = pending.pop() {
            let count = request.entries.len();
            if !results.is_empty() && self.time_left(deadline) < self.call_limit(deadline) {
                results.extend(vec![
                    AttemptResult::NotSent(
                        "refused as too large together; not sent apart before the deadline"
                            .to_string()
                    );
                    count
                ]);
                continue;
            }
            let answer = self.put_within(request.clone(), deadline).await;
            let too_large_together = count > 1
                && answer.len() == count
                && answer
                    .iter()
                    .all(|r| matches!(r, AttemptResult::Service(f) if f.status == 413));
            if too_large_together {
                let mut first = request.clone();
                let second = ResourceRequest {
                    entries: first.entries.split_off(count / 2),
                    ..request
                };
                pending.push(second);
                pending.push(first);
            } else {
                results.extend(answer);
            }
        }
        results
    }

    /// How long one call may take: the attempt timeout (at least
    /// [`MIN_RESOURCE_CALL_TIMEOUT`]), and never past the deadline less its margin.
    fn call_limit(&self, deadline: DateTime<Utc>) -> Duration {
        self.settings
            .attempt_timeout
            .max(MIN_RESOURCE_CALL_TIMEOUT)
            .min(self.time_left(deadline).max(Duration::from_millis(1)))
    }

    /// One call, given at most the attempt timeout (S2) and never past the invocation's
    /// deadline less its margin: one that takes longer is a timed-out attempt of every entry.
    /// (Without a tokio runtime, as in the deterministic simulation, there is no timer.)
    async fn put_within(
        &self,
        request: ResourceRequest,
        deadline: DateTime<Utc>,
    ) -> Vec<AttemptResult> {
        let count = request.entries.len();
        let call = self.ports.resources.put(request);
        if !subscription_caps::can_wait() {
            return call.await;
        }
        match tokio::time::timeout(self.call_limit(deadline), call).await {
            Ok(results) => results,
            Err(_) => vec![AttemptResult::TimedOut; count],
        }
    }
}

/// What a subscription's messages say besides their bodies.
pub(crate) fn message_context(group: &Group) -> MessageContext<'_> {
    MessageContext {
        topic: &group.subscription.topic,
        subscription: &group.subscription.name,
        delivery_count: group.history.attempts,
    }
}

/// Bytes one event takes as an entry of its subscription's AWS resource.
pub(crate) fn resource_entry_bytes(group: &Group, event: &serde_json::value::RawValue) -> usize {
    let schema = group.history.schema;
    entry_bytes(
        group.subscription.endpoint_type,
        event_body(event, schema),
        &RoutingFields::of(event, schema),
        &message_context(group),
    )
}
