//! The `deliver` function: one worker that owns dispatch, classification and retry.
//!
//! Invoked by the delivery queue's event source with up to N messages. For each message that is
//! due, its events are checked against their TTL (R6), cut into batches per subscription (B1 to
//! B6) and POSTed (different subscriptions concurrently). Each batch's response is classified
//! with the subscription's status table (S1 to S6) and every event in it shares the outcome
//! (B5): delivered, re-enqueued with the next wait (R1, R2, R5), or handed to the dead-letter
//! queue with the five-minute delay (L2, L4), or dropped when no dead-letter location is set up
//! (L1). A message that is not yet due is re-enqueued for the rest of its wait, at most 15
//! minutes a hop.
//!
//! A message is reported as a batch-item failure unless every event in it reached a durable
//! next state, so SQS redelivers it (duplicates are allowed, loss is not: G1).
//!
//! The handler reads as decide → act → settle: every decision about an event is a pure
//! function of `gridrelay_shared::delivery` ([`on_arrival`], [`settle_attempt`], [`hold`]),
//! returning a typed outcome; this module does the I/O around them (read subscriptions and
//! endpoint health, POST, enqueue) and turns the outcomes into messages and counts.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use chrono::{DateTime, Utc};
use gridrelay_adapters::aws::failed_receipts;
use gridrelay_adapters::http_sender::{HttpClientError, HttpEventSender, SenderConfig};
use gridrelay_adapters::outbound::SystemResolver;
use gridrelay_adapters::runtime::before_stop;
use gridrelay_ports::endpoints::AddressResolver;
use gridrelay_ports::oauth::TokenCache;
use gridrelay_ports::secret_headers::{resolve_headers, resolve_signing};
use gridrelay_ports::{
    Clock, DeliveryStateStore, EventSender, Jitter, LateAnswer, MessageQueue, OutgoingMessage,
    ResourceSender, SecretError, SecretStore, SubscriptionStore, back_off,
};
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::deadline::reply_margin;
use gridrelay_shared::delivery::{
    ATTEMPT_TIMEOUT, Arrival, BatchAttempt, DeliveryRules, GiveUp, LATE_ANSWER_WINDOW, Settlement,
    merge_retries, on_arrival, settle_attempt,
};
use gridrelay_shared::destination::AllowedDestinations;
use gridrelay_shared::health::HealthPolicy;
use gridrelay_shared::journal::{
    AttemptFacts, JournalEntry, Next, answer_text, attempt_entry, gave_up_entry,
    not_deliverable_entry,
};
use gridrelay_shared::message::ValidationTask;
use gridrelay_shared::message::{
    DeadLetterMessage, DeliveryHistory, DeliveryMessage, DeliveryQueueMessage, Lane, QueuedEvent,
};
use gridrelay_shared::outbound::OutboundPolicy;
use gridrelay_shared::schedule::RetrySchedule;
use gridrelay_shared::schema::DeliverySchema;
use gridrelay_shared::signing::SigningSecret;
use gridrelay_shared::subscription::Subscription;
use gridrelay_shared::time_scale::TimeScale;
use gridrelay_shared::validation::DEFAULT_WEBHOOK_ORIGIN;
use tracing::{Instrument, Span, error, info, info_span, warn};

pub use crate::endpoint_health::HostWatch;
pub use crate::endpoint_limits::{
    ConcurrencySettings, DEFAULT_MAX_REQUESTS_IN_FLIGHT, EndpointLimits, LimitedEndpoint,
    MAX_REQUESTS_IN_FLIGHT_ENV, MAX_REQUESTS_PER_ENDPOINT_ENV,
};
use crate::metrics::{MetricsBySubscription, SubscriptionMetrics};
pub use crate::subscription_caps::{CAP_WAIT, SubscriptionCaps};
pub use gridrelay_adapters::journal::JOURNAL_WRITE_BUDGET;

mod attempt;
mod endpoint_health;
pub mod endpoint_limits;
mod handshake;
mod journal;
mod late_answers;
pub mod metrics;
mod ordered;
mod replay;
mod resources;
mod subscription_caps;

/// Tunables of the deliver worker.
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    pub scale: TimeScale,
    pub schedule: RetrySchedule,
    /// Requests in flight at once, in total and per endpoint ([`EndpointLimits`]).
    pub concurrency: ConcurrencySettings,
    /// The publish API's public base URL, for validation URLs (none: only the synchronous
    /// handshake works).
    pub public_url: Option<String>,
    /// The origin named in CloudEvents abuse-protection requests.
    pub webhook_origin: String,
    /// D1: when delivery to a failing endpoint is delayed.
    pub health: HealthPolicy,
    /// R4: how long after its timeout an attempt's answer is still awaited (the sender's
    /// late window).
    pub late_answer_window: Duration,
    /// R4: how long an invocation waits, after its work, for the late answers of its timed-out
    /// attempts (at most `late_answer_window`; keep it under the queue's visibility timeout).
    pub late_answer_wait: Duration,
    /// S2: the longest one attempt takes (the sender's timeout). No attempt starts unless it
    /// can end this long before the invocation's deadline, less `deadline_margin`.
    pub attempt_timeout: Duration,
    /// Time kept before the deadline to settle, enqueue and report (real time, not scaled).
    pub deadline_margin: Duration,
    /// How long a batch of a capped subscription waits in the worker for its turn before it is
    /// held and handed on ([`SubscriptionCaps`]; real time: caps count real seconds).
    pub cap_wait: Duration,
    /// Where requests may connect: by default only public addresses, over `https://`.
    pub outbound: OutboundPolicy,
    /// Which AWS resources events may be written to (S4): a destination outside them, or one
    /// of the installation's own queues, is a failed attempt (403) without a call. Every one
    /// by default; the function and the local runner read theirs, naming their own queues.
    pub destinations: AllowedDestinations,
    /// The control queue's name (#34 item 12), to tell which records came from it (their
    /// `eventSourceArn` ends with it): a failed record's wait is shortened on the queue it came
    /// from. Without it (or a record without a source), the kind decides: steps came from the
    /// control queue, deliveries from the delivery queue.
    pub control_queue_name: Option<String>,
    /// The replay queue's name (#35), as the control queue's: a failed replay delivery's wait
    /// is shortened there.
    pub replay_queue_name: Option<String>,
}

impl DeliverySettings {
    pub fn new(scale: TimeScale) -> Self {
        Self {
            scale,
            schedule: RetrySchedule::event_grid(),
            concurrency: ConcurrencySettings::default(),
            public_url: None,
            webhook_origin: DEFAULT_WEBHOOK_ORIGIN.to_string(),
            health: HealthPolicy::event_grid(scale),
            late_answer_window: scale.apply(LATE_ANSWER_WINDOW),
            late_answer_wait: scale.apply(LATE_ANSWER_WINDOW),
            attempt_timeout: scale.apply(ATTEMPT_TIMEOUT),
            deadline_margin: DEADLINE_MARGIN,
            cap_wait: CAP_WAIT,
            outbound: OutboundPolicy::default(),
            destinations: AllowedDestinations::any(),
            control_queue_name: None,
            replay_queue_name: None,
        }
    }

    /// The HTTP sender these settings describe: S2's timeout, R4's late window, idle
    /// connections kept for as many requests as one endpoint may have in flight, and the
    /// outbound policy.
    pub fn http_sender(&self) -> Result<HttpEventSender, HttpClientError> {
        self.http_sender_with(Arc::new(SystemResolver))
    }

    /// As [`DeliverySettings::http_sender`], resolving endpoint names with `resolver`.
    pub fn http_sender_with(
        &self,
        resolver: Arc<dyn AddressResolver>,
    ) -> Result<HttpEventSender, HttpClientError> {
        let config = SenderConfig {
            resolver,
            ..SenderConfig::new(
                self.attempt_timeout,
                self.concurrency.max_per_endpoint as usize,
                self.outbound.clone(),
            )
        };
        Ok(HttpEventSender::new(config)?.with_late_answers(self.late_answer_window))
    }

    /// The send permits these settings describe, for one worker's lifetime.
    pub fn endpoint_limits(&self) -> Arc<EndpointLimits> {
        Arc::new(EndpointLimits::new(self.concurrency))
    }

    /// What the pure decisions read.
    pub fn rules(&self) -> DeliveryRules<'_> {
        DeliveryRules {
            schedule: &self.schedule,
            scale: self.scale,
        }
    }
}

/// The least time an AWS resource call is given, however the schedule is scaled: the time
/// scale shortens the waits gridrelay imposes, not how fast AWS answers.
pub const MIN_RESOURCE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What a deliver invocation keeps, by default, between its last work and its deadline: enough
/// for two batched SQS sends and the reply.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(10);

/// What `deliver` needs.
#[derive(Clone)]
pub struct Deliver {
    /// The stores, queues and senders shared with other workers.
    pub ports: DeliverPorts,
    pub sender: Arc<dyn EventSender>,
    /// Who may send now; kept for the worker's lifetime (`settings.endpoint_limits()`).
    pub limits: Arc<EndpointLimits>,
    /// Subscriptions' caps, shared with every other worker through their store.
    pub caps: Arc<SubscriptionCaps>,
    /// What this worker has seen of each host since it last answered (#34 item 8).
    pub hosts: Arc<HostWatch>,
    /// A1: the OAuth tokens this worker keeps for its subscriptions' endpoints (a warm Lambda
    /// instance's own).
    pub tokens: Arc<TokenCache>,
    pub settings: DeliverySettings,
}

/// The stores, queues and senders a [`Deliver`] worker does its I/O through (what is not its
/// own: another worker, another Lambda instance, shares them).
#[derive(Clone)]
pub struct DeliverPorts {
    pub store: Arc<dyn SubscriptionStore>,
    pub delivery_queue: Arc<dyn MessageQueue>,
    /// Where subscriptions' handshake and expiry steps go (#34 item 12: control work never
    /// waits behind a bulk backlog of deliveries); the delivery queue where there is none.
    pub control_queue: Arc<dyn MessageQueue>,
    /// Where replays' deliveries and their retries go (#35: a replay's backlog never delays
    /// live deliveries, and its own event source caps its invocations); the delivery queue
    /// where there is none.
    pub replay_queue: Arc<dyn MessageQueue>,
    pub dead_letter_queue: Arc<dyn MessageQueue>,
    /// O1: the FIFO queue ordered subscriptions' events come from; `deliver` only holds and
    /// releases its messages (never sends to it). The delivery queue where there is none.
    pub ordered_queue: Arc<dyn MessageQueue>,
    /// O1: where an ordered message that cannot be read is parked after
    /// [`gridrelay_shared::ordering::UNREADABLE_RECEIVES`] receives, so its key goes on; none
    /// on a stack made before it (the message then holds its key).
    pub ordered_redrive_queue: Option<Arc<dyn MessageQueue>>,
    /// AWS resource destinations (S4).
    pub resources: Arc<dyn ResourceSender>,
    pub clock: Arc<dyn Clock>,
    pub jitter: Arc<dyn Jitter>,
    /// D1, R4: endpoint health and late successes.
    pub state: Arc<dyn DeliveryStateStore>,
    /// H1: where secret delivery header values are.
    pub secrets: Arc<dyn SecretStore>,
    /// Where subscriptions' caps are kept.
    pub caps: Arc<dyn gridrelay_ports::DeliveryCapStore>,
    /// The delivery journal (#35): each invocation's steps, written in one call.
    pub journal: Arc<dyn gridrelay_ports::RecordStream>,
    /// Replays' records (#35), which their steps move on.
    pub replays: Arc<dyn gridrelay_ports::ReplayStore>,
    /// Topics' archives, which replays' steps read.
    pub archive: Arc<dyn gridrelay_ports::ArchiveSource>,
}

impl DeliverPorts {
    /// The queue of `lane`.
    pub fn queue(&self, lane: Lane) -> &dyn MessageQueue {
        match lane {
            Lane::Delivery => self.delivery_queue.as_ref(),
            Lane::Control => self.control_queue.as_ref(),
            Lane::Replay => self.replay_queue.as_ref(),
        }
    }
}

impl Deliver {
    /// A worker, as one Lambda instance is: `ports`, the `sender` its requests go through, and
    /// `settings`; its endpoint limits and its share of the subscriptions' caps are its own.
    /// The Lambda function, the local runner, the simulation, the benchmark and the tests all
    /// make theirs here.
    pub fn new(
        ports: DeliverPorts,
        sender: Arc<dyn EventSender>,
        settings: DeliverySettings,
    ) -> Self {
        Self {
            sender,
            limits: settings.endpoint_limits(),
            caps: Arc::new(SubscriptionCaps::new(Arc::clone(&ports.caps))),
            hosts: Arc::default(),
            tokens: Arc::default(),
            ports,
            settings,
        }
    }

    /// Another instance beside this one in the same process (`gridrelay local` runs as many
    /// as invocations run at once): its own `sender` and endpoint limits, everything else
    /// shared, the caps' local share included.
    pub fn beside(&self, sender: Arc<dyn EventSender>) -> Self {
        Self {
            sender,
            limits: self.settings.endpoint_limits(),
            hosts: Arc::default(),
            tokens: Arc::default(),
            ..self.clone()
        }
    }
}

/// Delivery headers (H1) and signing secrets resolved for one invocation, or why they could
/// not be.
type Headers = Arc<Result<Resolved, String>>;

/// What a subscription's secrets resolve to for one invocation.
struct Resolved {
    headers: Vec<(String, String)>,
    /// The secrets its deliveries are signed with (none: not signed).
    signing: Vec<SigningSecret>,
}

/// A subscription as read for one invocation, with its delivery headers resolved (H1).
struct Target {
    subscription: Arc<Subscription>,
    headers: Headers,
}

/// Counts of what one invocation did, logged and returned for the runner and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryReport {
    pub attempts: usize,
    /// Attempts that did not deliver (retried or given up).
    pub failed_attempts: usize,
    pub delivered: usize,
    pub retried: usize,
    pub dead_lettered: usize,
    /// L1: terminal failures with no dead-letter location.
    pub dropped: usize,
    /// Messages not yet due, sent on for the rest of their wait.
    pub deferred: usize,
    /// D1, R3: events held back (not attempted) because their endpoint is delayed.
    pub delayed: usize,
    /// R4: events whose pending retry was cancelled because the timed-out attempt succeeded.
    pub late_successes: usize,
    /// Events not attempted because the invocation's deadline was near, handed on (due at
    /// once, history unchanged) to the next invocation.
    pub handed_on: usize,
    /// Events not attempted yet because their subscription's caps left no room, handed on
    /// (history unchanged) for when there should be.
    pub throttled: usize,
    /// Messages left for SQS to redeliver.
    pub failed_messages: usize,
    /// Journal entries the journal did not take (delivery went on without them).
    pub journal_unwritten: usize,
    /// #35: events of replay deliveries dropped because another copy of their replay's step
    /// claimed them first.
    pub replay_copies_dropped: usize,
    /// O1: ordered messages left in the queue on purpose: held until due, or behind one of
    /// their key that is.
    pub ordered_waiting: usize,
    /// O1: ordered messages that could not be read, parked in the ordered redrive queue.
    pub ordered_parked: usize,
}

impl DeliveryReport {
    pub fn add(&mut self, other: &DeliveryReport) {
        self.attempts += other.attempts;
        self.failed_attempts += other.failed_attempts;
        self.delivered += other.delivered;
        self.retried += other.retried;
        self.dead_lettered += other.dead_lettered;
        self.dropped += other.dropped;
        self.deferred += other.deferred;
        self.delayed += other.delayed;
        self.late_successes += other.late_successes;
        self.handed_on += other.handed_on;
        self.throttled += other.throttled;
        self.failed_messages += other.failed_messages;
        self.journal_unwritten += other.journal_unwritten;
        self.replay_copies_dropped += other.replay_copies_dropped;
        self.ordered_waiting += other.ordered_waiting;
        self.ordered_parked += other.ordered_parked;
    }
}

/// The result of one invocation.
#[derive(Debug, Clone, Default)]
pub struct DeliverOutcome {
    /// SQS message IDs to report as batch-item failures.
    pub failed_message_ids: Vec<String>,
    pub report: DeliveryReport,
    /// The report's counts by topic and subscription, and delivery latencies.
    pub by_subscription: MetricsBySubscription,
}

impl DeliverOutcome {
    pub fn into_batch_response(self) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        response.set_failures(self.failed_message_ids);
        response
    }
}

/// One event waiting for an attempt, and the SQS record it came from.
struct Pending {
    record: usize,
    event: QueuedEvent,
    /// The history of the message it came in, kept for events that wait without an attempt
    /// (D1).
    history: Arc<DeliveryHistory>,
}

/// Events of one subscription with the same attempt count: they can share a batch.
struct Group {
    subscription: Arc<Subscription>,
    /// An unreadable secret header makes every attempt of the group a failed one that sends
    /// nothing (`AttemptResult::NotSent`).
    headers: Headers,
    /// The history its events share for the next attempt (schema and attempt count).
    history: Arc<DeliveryHistory>,
    events: Vec<Pending>,
}

/// One batch's attempt and what came of it.
struct Attempted {
    group: usize,
    events: Vec<Pending>,
    time: DateTime<Utc>,
    /// When the answer (or its absence) was known: a delivered event's latency ends here.
    answered: DateTime<Utc>,
    result: AttemptResult,
    /// R4: a timed-out request still open for its late answer.
    late: Option<LateAnswer>,
    /// What the endpoint's `Retry-After` asked for.
    retry_after: Option<Duration>,
    /// The answer's first body bytes the subscription keeps (#35).
    answer: Vec<u8>,
    /// An AWS resource's call: what became of each event (in `events`' order), where the
    /// service said it per entry; `result` is then the first failure, or the success.
    per_event: Option<Vec<AttemptResult>>,
    /// Whether a request or call was made: not for an event too large for its AWS resource,
    /// which fails on its own without one (it counts as no request and says nothing of the
    /// endpoint's health).
    called: bool,
}

/// A message to send and the SQS records whose events it carries.
struct Outgoing {
    message: OutgoingMessage,
    records: BTreeSet<usize>,
}

/// Work collected during an invocation.
#[derive(Default)]
struct Plan {
    failed: BTreeSet<usize>,
    to_delivery: Vec<Outgoing>,
    /// Handshake and expiry steps, for the control queue.
    to_control: Vec<Outgoing>,
    /// Replays' deliveries, for the replay queue.
    to_replay: Vec<Outgoing>,
    to_dead_letter: Vec<Outgoing>,
    /// What happened to each subscription's events; the invocation's report is their sum.
    by_subscription: MetricsBySubscription,
    /// R4: timed-out attempts whose retries were enqueued, their late answers, and the span
    /// of their attempt.
    late: Vec<(String, LateAnswer, Span)>,
    /// The invocation's steps for the delivery journal, and how many it did not take.
    journal: Vec<JournalEntry>,
    journal_unwritten: usize,
    /// O1: set for ordered records, whose events are never enqueued again: what each record's
    /// events would be enqueued as (by record), kept beside it while it waits in flight
    /// (`ordered.rs`).
    ordered: Option<BTreeMap<usize, DeliveryMessage>>,
    /// O1: ordered records left in the queue on purpose (held until due, or behind one of
    /// their key that is): named to SQS as failures so they stay, counted apart.
    in_flight: BTreeSet<usize>,
    /// O1: ordered records that could not be read, parked in the ordered redrive queue.
    parked: usize,
    /// O1: what an ordered invocation's rounds said about endpoint health, written once at
    /// its end.
    health: endpoint_health::HealthSeen,
}

impl Plan {
    /// Counts what happened to a subscription's events.
    fn count(&mut self, topic: &str, subscription: &str, add: impl FnOnce(&mut DeliveryReport)) {
        add(&mut self.of(topic, subscription).counts);
    }

    /// The invocation's report: every subscription's counts, and the messages left to SQS.
    fn report(&self) -> DeliveryReport {
        let mut report = DeliveryReport::default();
        for m in self.by_subscription.values() {
            report.add(&m.counts);
        }
        report.failed_messages = self.failed.len();
        report.journal_unwritten = self.journal_unwritten;
        report.ordered_waiting = self.in_flight.len();
        report.ordered_parked = self.parked;
        report
    }

    fn of(&mut self, topic: &str, subscription: &str) -> &mut SubscriptionMetrics {
        self.by_subscription
            .entry((topic.to_string(), subscription.to_string()))
            .or_default()
    }

    fn enqueue_delivery(
        &mut self,
        messages: Vec<DeliveryMessage>,
        records: &BTreeSet<usize>,
        delay: Duration,
    ) {
        if let Some(successors) = &mut self.ordered {
            // A message not yet due: its record's, whole.
            for mut message in messages {
                let events = std::mem::take(&mut message.events);
                for (event, &record) in events.into_iter().zip(records.iter().cycle()) {
                    ordered::keep_successor(successors, record, &message, event);
                }
            }
            return;
        }
        for message in messages {
            let to = match message.lane() {
                Lane::Replay => &mut self.to_replay,
                Lane::Delivery | Lane::Control => &mut self.to_delivery,
            };
            push_encoded(
                to,
                &mut self.failed,
                std::iter::once(message.to_body()),
                records,
                delay,
            );
        }
    }

    /// Enqueues packed delivery messages, each tagged with the records of its own events
    /// (`event_records` has one per event, in order), so a failed send fails only those.
    fn enqueue_packed(
        &mut self,
        messages: Vec<DeliveryMessage>,
        event_records: Vec<usize>,
        delay: Duration,
    ) {
        if let Some(successors) = &mut self.ordered {
            let mut event_records = event_records.into_iter();
            for mut message in messages {
                let events = std::mem::take(&mut message.events);
                for (event, record) in events.into_iter().zip(event_records.by_ref()) {
                    ordered::keep_successor(successors, record, &message, event);
                }
            }
            return;
        }
        let mut event_records = event_records.into_iter();
        for message in messages {
            let records = event_records.by_ref().take(message.events.len()).collect();
            self.enqueue_delivery(vec![message], &records, delay);
        }
    }

    /// L1, L2, L4: dead-letter with the delay, or drop (counted and logged) without a location.
    fn give_up(&mut self, sub: &Subscription, give_up: GiveUp, records: &BTreeSet<usize>) {
        match give_up {
            GiveUp::Drop { entries } => {
                for e in &entries {
                    warn!(
                        reason = %e.reason,
                        delivery_attempts = e.delivery_attempts,
                        dropped = 1,
                        "event dropped: no dead-letter destination"
                    );
                }
                let n = entries.len();
                self.count(&sub.topic, &sub.name, |r| r.dropped += n);
            }
            GiveUp::DeadLetter {
                messages,
                delay,
                events,
            } => {
                self.count(&sub.topic, &sub.name, |r| r.dead_lettered += events);
                let encoded = messages.iter().map(DeadLetterMessage::to_body);
                push_encoded(
                    &mut self.to_dead_letter,
                    &mut self.failed,
                    encoded,
                    records,
                    delay,
                );
            }
        }
    }
}

/// Adds encoded messages to a queue's outgoing list; a message that could not be encoded
/// fails the records whose events it carries, so SQS redelivers them.
fn push_encoded(
    outgoing: &mut Vec<Outgoing>,
    failed: &mut BTreeSet<usize>,
    encoded: impl Iterator<Item = Result<String, serde_json::Error>>,
    records: &BTreeSet<usize>,
    delay: Duration,
) {
    for body in encoded {
        match body {
            Ok(body) => outgoing.push(Outgoing {
                message: OutgoingMessage {
                    body,
                    delay,
                    group: None,
                },
                records: records.clone(),
            }),
            Err(e) => {
                error!(error = %e, "could not encode a queue message");
                failed.extend(records);
            }
        }
    }
}

impl Deliver {
    /// A subscription's delivery headers and signing secrets, read from the secret store:
    /// `Ok(Err(why))` when a secret is missing or unusable (the subscription's problem, settled
    /// as failed attempts), `Err` when the store did not answer (its records wait for it, as
    /// with any unavailable store).
    async fn resolve_secrets(
        &self,
        sub: &Subscription,
    ) -> Result<Result<Resolved, String>, SecretError> {
        let subscriptions_problem = |what: &str, e: SecretError| {
            if e.is_unavailable() {
                Err(e)
            } else {
                Ok(format!("{what} could not be read: {e}"))
            }
        };
        let headers = match resolve_headers(sub, self.ports.secrets.as_ref()).await {
            Ok(headers) => headers,
            Err(e) => return subscriptions_problem("a delivery header", e).map(Err),
        };
        let signing =
            match resolve_signing(sub, self.ports.secrets.as_ref(), self.ports.clock.now()).await {
                Ok(signing) => signing,
                Err(e) => return subscriptions_problem("a signing secret", e).map(Err),
            };
        Ok(Ok(Resolved { headers, signing }))
    }

    /// Handles one batch of delivery queue messages, with no deadline but the attempts' own
    /// timeouts.
    pub async fn handle(&self, event: SqsEvent) -> DeliverOutcome {
        self.handle_until(event, DateTime::<Utc>::MAX_UTC).await
    }

    /// Handles one batch of delivery queue messages before `deadline` (a Lambda's: its start
    /// plus its timeout). No attempt starts unless it can end, with the margin kept for
    /// enqueueing, before the deadline; events left unattempted are handed on to the next
    /// invocation, and the late-answer wait (R4) ends in time too. So a timeout never turns
    /// into a redelivered batch.
    pub async fn handle_until(&self, event: SqsEvent, deadline: DateTime<Utc>) -> DeliverOutcome {
        let span = info_span!("deliver", records = event.records.len());
        self.handle_records(event, deadline).instrument(span).await
    }

    /// [`Deliver::handle_until`], in the invocation's span.
    async fn handle_records(&self, event: SqsEvent, deadline: DateTime<Utc>) -> DeliverOutcome {
        // Real time, for the invocation's log line: what its reads, its attempts and its
        // writes took (what the deadline margin has to cover).
        let started = std::time::Instant::now();
        if event.records.iter().any(ordered::is_ordered) {
            return self.handle_ordered(event, deadline, started).await;
        }
        let (plan, timings) = self.process(&event, deadline, Mode::Unordered).await;
        let ids = message_ids(&event);
        self.conclude(plan, &ids, deadline, started, timings).await
    }

    /// Everything an invocation does with `event`'s records up to their sends and the short
    /// waits of those that failed; what is left is the late answers' wait and the report
    /// ([`Deliver::conclude`]). An ordered round (`mode`) keeps its records' next states in the
    /// plan instead of enqueueing them.
    async fn process(
        &self,
        event: &SqsEvent,
        deadline: DateTime<Utc>,
        mode: Mode,
    ) -> (Plan, Timings) {
        let started = std::time::Instant::now();
        let mut plan = Plan {
            ordered: (mode == Mode::Ordered).then(BTreeMap::new),
            ..Plan::default()
        };
        let ids = message_ids(event);

        let mut messages = Vec::new();
        let mut validations = Vec::new();
        let mut replay_steps = Vec::new();
        // Each record's lane, by what it is (an unreadable one: the delivery lane).
        let mut lanes = vec![Lane::Delivery; event.records.len()];
        for (i, record) in event.records.iter().enumerate() {
            let message = record.body.as_deref().map(DeliveryQueueMessage::from_body);
            if let Some(Ok(m)) = &message {
                lanes[i] = m.lane();
            }
            match message {
                Some(Ok(DeliveryQueueMessage::Delivery(m))) => messages.push((i, m)),
                Some(Ok(DeliveryQueueMessage::Validation(task))) => validations.push((i, task)),
                Some(Ok(DeliveryQueueMessage::Replay(step))) => replay_steps.push((i, step)),
                Some(Err(e)) => {
                    error!(message_id = %ids[i], error = %e, "unreadable delivery queue message; leaving it to the redrive policy");
                    plan.failed.insert(i);
                }
                None => {
                    error!(message_id = %ids[i], "delivery queue message without a body");
                    plan.failed.insert(i);
                }
            }
        }

        self.run_validations(&validations, &mut plan, deadline)
            .await;
        self.run_replay_steps(replay_steps, &mut plan, deadline)
            .await;
        let messages = self
            .claim_replay_deliveries(messages, &mut plan, deadline)
            .await;
        let messages = self
            .cancel_late_successes(messages, &mut plan, deadline)
            .await;
        let subscriptions = self
            .load_subscriptions(&messages, &mut plan, deadline)
            .await;
        let mut groups = self.sort_due_events(messages, &subscriptions, &mut plan);
        let mut gates = self.endpoint_gates(&groups, deadline).await;
        let prepared = started.elapsed();
        let (attempted, held) = self.attempt_all(&mut groups, &mut gates, deadline).await;
        let attempts_done = started.elapsed();
        self.hold(&groups, held, &gates, &mut plan);
        let seen = self.health_seen(&groups, &attempted, &gates);
        if mode == Mode::Ordered && gates.all_open() && seen.origins_unchanged() {
            // O1: an ordered invocation adds up its rounds' outcomes at healthy endpoints and
            // writes them once, at its end. A round that probed a delayed endpoint or origin,
            // or found a host hung, is written at once: the next round's gates must see it.
            plan.health.add(seen);
        } else if self
            .before_stop(deadline, self.write_health(seen))
            .await
            .is_none()
        {
            warn!("endpoint health not recorded: the invocation's deadline came first");
        }
        self.settle(&groups, attempted, &mut plan);
        self.send(&mut plan, deadline).await;
        if mode == Mode::Ordered {
            // Every record of an ordered round came from the ordered queue.
            let failed = failed_receipts(event, plan.failed.iter().copied());
            let backed_off = back_off(
                self.ports.ordered_queue.as_ref(),
                failed,
                self.settings.scale,
            );
            if self.before_stop(deadline, backed_off).await.is_none() {
                warn!("failed ordered records come back after the visibility timeout");
            }
        } else {
            self.back_off_failed(event, &plan.failed, &lanes, deadline)
                .await;
        }
        (
            plan,
            Timings {
                prepare: prepared,
                attempts: attempts_done - prepared,
                settle: started.elapsed() - attempts_done,
            },
        )
    }

    /// The end of an invocation: the late answers awaited (R4), the report logged, and the
    /// records that failed named for SQS.
    async fn conclude(
        &self,
        mut plan: Plan,
        ids: &[String],
        deadline: DateTime<Utc>,
        started: std::time::Instant,
        timings: Timings,
    ) -> DeliverOutcome {
        let late_wait = self.settings.late_answer_wait.min(self.time_left(deadline));
        let late = self.await_late_answers(std::mem::take(&mut plan.late), late_wait);
        if self.before_stop(deadline, late).await.is_none() {
            warn!(
                "late answers not recorded: the invocation's deadline came first; their retries stay"
            );
        }
        let report = plan.report();
        if report != DeliveryReport::default() {
            info!(
                attempts = report.attempts,
                failed_attempts = report.failed_attempts,
                delivered = report.delivered,
                retried = report.retried,
                dead_lettered = report.dead_lettered,
                dropped = report.dropped,
                deferred = report.deferred,
                delayed = report.delayed,
                late_successes = report.late_successes,
                handed_on = report.handed_on,
                throttled = report.throttled,
                failed_messages = report.failed_messages,
                journal_unwritten = report.journal_unwritten,
                replay_copies_dropped = report.replay_copies_dropped,
                ordered_waiting = report.ordered_waiting,
                ordered_parked = report.ordered_parked,
                prepare_ms = timings.prepare.as_millis() as u64,
                attempts_ms = timings.attempts.as_millis() as u64,
                settle_ms = timings.settle.as_millis() as u64,
                total_ms = started.elapsed().as_millis() as u64,
                "deliver invocation"
            );
        }
        DeliverOutcome {
            failed_message_ids: plan
                .failed
                .union(&plan.in_flight)
                .map(|&i| ids[i].clone())
                .collect(),
            report,
            by_subscription: plan.by_subscription,
        }
    }

    /// Failed records come back after their short wait, not the whole visibility timeout, each
    /// from the queue it came from: by its source's name, or where that is unknown by its
    /// `lanes` entry (what it is). A message written to the delivery queue before the control
    /// or replay queue existed is received from the delivery queue, and its wait is shortened
    /// there.
    async fn back_off_failed(
        &self,
        event: &SqsEvent,
        failed: &BTreeSet<usize>,
        lanes: &[Lane],
        deadline: DateTime<Utc>,
    ) {
        let came_from = |i: usize| {
            let source = event.records[i].event_source_arn.as_deref();
            match source.and_then(|arn| arn.rsplit(':').next()) {
                Some(name) if self.settings.control_queue_name.as_deref() == Some(name) => {
                    Lane::Control
                }
                Some(name) if self.settings.replay_queue_name.as_deref() == Some(name) => {
                    Lane::Replay
                }
                Some(_)
                    if self.settings.control_queue_name.is_some()
                        || self.settings.replay_queue_name.is_some() =>
                {
                    Lane::Delivery
                }
                _ => lanes[i],
            }
        };
        let of_lane = |lane: Lane| {
            let records: Vec<usize> = failed
                .iter()
                .copied()
                .filter(|&i| came_from(i) == lane)
                .collect();
            back_off(
                self.ports.queue(lane),
                failed_receipts(event, records),
                self.settings.scale,
            )
        };
        let backed_off = futures::future::join3(
            of_lane(Lane::Delivery),
            of_lane(Lane::Control),
            of_lane(Lane::Replay),
        );
        if self.before_stop(deadline, backed_off).await.is_none() {
            warn!(
                "failed records come back after the visibility timeout: the invocation's deadline came before their shorter wait was set"
            );
        }
    }

    /// Runs the handshake steps, all at the same time; a step that could not reach the store is
    /// left for SQS to redeliver.
    /// Steps left too near the deadline to finish a handshake are handed on unchanged.
    async fn run_validations(
        &self,
        validations: &[(usize, ValidationTask)],
        plan: &mut Plan,
        deadline: DateTime<Utc>,
    ) {
        if !self.can_attempt(deadline) {
            for (i, task) in validations {
                let body = DeliveryQueueMessage::Validation(task.clone()).to_body();
                push_encoded(
                    &mut plan.to_control,
                    &mut plan.failed,
                    std::iter::once(body),
                    &BTreeSet::from([*i]),
                    Duration::ZERO,
                );
            }
            return;
        }
        let steps = validations.iter().map(|(i, task)| {
            let span = subscription_span(&task.topic, &task.subscription);
            let step = self.run_validation(task).instrument(span.clone());
            async move { (*i, span, self.before_stop(deadline, step).await) }
        });
        for (i, span, result) in futures::future::join_all(steps).await {
            let _span = span.entered();
            match result {
                Some(Ok(Some(next))) => plan.to_control.push(Outgoing {
                    message: next,
                    records: BTreeSet::from([i]),
                }),
                Some(Ok(None)) => {}
                Some(Err(e)) => {
                    error!(error = %e, "validation step failed; SQS will retry it");
                    plan.failed.insert(i);
                }
                None => {
                    warn!(
                        "validation step not finished before the invocation's deadline; SQS will retry it"
                    );
                    plan.failed.insert(i);
                }
            }
        }
    }

    /// Reads each distinct subscription once, all at the same time, with its secret header
    /// values. `None` means it no longer exists; a subscription that could not be read fails
    /// every record that needs it.
    async fn load_subscriptions(
        &self,
        messages: &[(usize, DeliveryMessage)],
        plan: &mut Plan,
        deadline: DateTime<Utc>,
    ) -> HashMap<(String, String), Option<Target>> {
        let mut keys: BTreeMap<(String, String), BTreeSet<&str>> = BTreeMap::new();
        for (_, m) in messages {
            keys.entry((m.topic.clone(), m.subscription.clone()))
                .or_default()
                .insert(&m.subscription_id);
        }
        let lookups = keys.into_iter().map(|(key, ids)| {
            let span = subscription_span(&key.0, &key.1);
            let lookup = self.load_subscription(key.clone(), ids).instrument(span);
            async move {
                self.before_stop(deadline, lookup).await.unwrap_or_else(|| {
                    (
                        key,
                        Err("not read before the invocation's deadline".to_string()),
                    )
                })
            }
        });
        let mut found = HashMap::new();
        for (key, result) in futures::future::join_all(lookups).await {
            match result {
                Ok(s) => {
                    found.insert(key, s);
                }
                Err(e) => {
                    let _span = subscription_span(&key.0, &key.1).entered();
                    error!(error = %e, "subscription lookup failed");
                    plan.failed.extend(
                        messages
                            .iter()
                            .filter(|(_, m)| m.topic == key.0 && m.subscription == key.1)
                            .map(|(i, _)| *i),
                    );
                }
            }
        }
        found
    }

    /// One subscription as [`Deliver::load_subscriptions`] reads it, for messages that name
    /// `ids`.
    async fn load_subscription(
        &self,
        key: (String, String),
        ids: BTreeSet<&str>,
    ) -> ((String, String), Result<Option<Target>, String>) {
        let mut read = self.ports.store.get_subscription(&key.0, &key.1).await;
        // A warm function may keep a subscription that was deleted and created again since
        // (`gridrelay_ports::cache`): a message fanned out for another id than the one read
        // has it read again, so events for the new one are never taken for the old one's.
        // Only that subscription is read again; messages without an id (written before
        // ids existed) are matched by time (`is_replaced`) and ask for nothing. A kept
        // record without an id and a message with one: it was created again since.
        // An expired record kept by a warm function may have been given a later expiration
        // since: dropping its events cannot be undone, so it is read again first (at most
        // once per recheck interval).
        let read_again = match &read {
            Ok(Some(sub)) if ids.iter().any(|id| !id.is_empty() && *id != sub.id) => {
                self.ports.store.forget_subscription(&key.0, &key.1);
                true
            }
            Ok(Some(sub)) if sub.is_expired(self.ports.clock.now()) => {
                self.ports.store.recheck_subscription(&key.0, &key.1);
                true
            }
            _ => false,
        };
        if read_again {
            read = self.ports.store.get_subscription(&key.0, &key.1).await;
        }
        let result = match read {
            // `--expiration-date`: an expired subscription receives nothing, as if deleted
            // (its expiry step deletes it).
            Ok(Some(sub)) if sub.is_expired(self.ports.clock.now()) => Ok(None),
            // Item 2: a missing or unusable secret is the subscription's problem, settled
            // as a failed attempt of its events, not a failure of the records around them.
            // A secret store that did not answer is nobody's (#34 item 4): the records
            // that need it go back to SQS, as when the subscription store is down.
            Ok(Some(mut sub)) => {
                let mut headers = self.resolve_secrets(&sub).await;
                // A record a warm function kept may name secrets an update has replaced
                // and deleted since: the record is read again before the events are
                // charged a failed attempt (always: this runs only after a failure).
                if matches!(headers, Ok(Err(_))) {
                    self.ports.store.forget_subscription(&key.0, &key.1);
                    if let Ok(Some(fresh)) = self.ports.store.get_subscription(&key.0, &key.1).await
                        && fresh.id == sub.id
                        && fresh.version != sub.version
                    {
                        headers = self.resolve_secrets(&fresh).await;
                        sub = fresh;
                    }
                }
                headers
                    .map(|headers| {
                        Some(Target {
                            headers: Arc::new(headers),
                            subscription: Arc::new(sub),
                        })
                    })
                    .map_err(|e| e.to_string())
            }
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        };
        (key, result)
    }

    /// Decides for each message on arrival ([`on_arrival`]) and groups the due events.
    fn sort_due_events(
        &self,
        messages: Vec<(usize, DeliveryMessage)>,
        subscriptions: &HashMap<(String, String), Option<Target>>,
        plan: &mut Plan,
    ) -> Vec<Group> {
        let now = self.ports.clock.now();
        let rules = self.settings.rules();
        let mut groups: Vec<Group> = Vec::new();
        // Events booked in their subscription's events-per-second allowance go in batches of
        // their own, which do not book again; a replay's events (#35) go in batches of their
        // own too, which carry its header (the parts of one replay may share one), and so do
        // a redrive's, whose first attempt journals where they came back from and whose every
        // step names its delivery.
        type GroupKey = (
            String,
            String,
            DeliverySchema,
            u32,
            Option<DateTime<Utc>>,
            (Option<String>, Option<String>, Option<DateTime<Utc>>),
        );
        let mut index: HashMap<GroupKey, usize> = HashMap::new();
        for (i, message) in messages {
            if plan.failed.contains(&i) {
                continue;
            }
            let key = (message.topic.clone(), message.subscription.clone());
            let _span = subscription_span(&key.0, &key.1).entered();
            let target = subscriptions.get(&key).and_then(Option::as_ref);
            let records = BTreeSet::from([i]);
            match on_arrival(message, target.map(|t| &*t.subscription), rules, now) {
                Arrival::NotDeliverable {
                    events,
                    schema,
                    delivery,
                    reason,
                } => {
                    let dropped = events.len();
                    warn!(
                        dropped,
                        reason = reason.as_str(),
                        detail = ?reason,
                        "events dropped: not for a subscription that receives events"
                    );
                    plan.count(&key.0, &key.1, |r| r.dropped += dropped);
                    plan.journal.push(not_deliverable_entry(
                        (&key.0, &key.1),
                        schema,
                        &events,
                        delivery,
                        now,
                        reason.as_str(),
                    ));
                }
                Arrival::NotYetDue { message, delay } => {
                    plan.count(&key.0, &key.1, |r| r.deferred += 1);
                    plan.enqueue_delivery(vec![message], &records, delay);
                }
                Arrival::Due {
                    history,
                    live,
                    expired,
                } => {
                    // `on_arrival` said Due, so the subscription was found.
                    let Some(target) = target else { continue };
                    if let Some(expired) = expired {
                        plan.journal.push(gave_up_entry(
                            &target.subscription,
                            &history,
                            &expired,
                            now,
                        ));
                        plan.give_up(&target.subscription, expired, &records);
                    }
                    if live.is_empty() {
                        continue;
                    }
                    let history = Arc::new(history);
                    let slot = *index
                        .entry((
                            key.0,
                            key.1,
                            history.schema,
                            history.attempts,
                            history.rate_booked_at,
                            (
                                history.replay.as_ref().map(|r| r.name.clone()),
                                history.redriven_from.clone(),
                                history.redriven_at,
                            ),
                        ))
                        .or_insert_with(|| {
                            groups.push(Group {
                                subscription: Arc::clone(&target.subscription),
                                headers: Arc::clone(&target.headers),
                                history: Arc::clone(&history),
                                events: Vec::new(),
                            });
                            groups.len() - 1
                        });
                    groups[slot]
                        .events
                        .extend(live.into_iter().map(|event| Pending {
                            record: i,
                            event,
                            history: Arc::clone(&history),
                        }));
                }
            }
        }
        groups
    }

    /// Whether an attempt started now can end, with the margin kept, before `deadline`.
    fn can_attempt(&self, deadline: DateTime<Utc>) -> bool {
        self.time_left(deadline) >= self.settings.attempt_timeout
    }

    /// Until when a subscription's request slot is leased: as long as a request started now
    /// can be open (its timeout, then R4's late window, and the margin), and not past the
    /// invocation's deadline, after which none of its requests is open.
    fn slot_lease_until(&self, deadline: DateTime<Utc>, sub: &Subscription) -> DateTime<Utc> {
        // A1: an attempt to an OAuth endpoint may wait for a token, send, wait for another
        // after a 401, and send again: four calls of up to one attempt timeout each.
        let calls = if sub.delivery_auth.is_some() { 4 } else { 1 };
        let open = self.settings.attempt_timeout * calls
            + self.settings.late_answer_window
            + self.settings.deadline_margin;
        let most = self.ports.clock.now() + chrono::Duration::from_std(open).unwrap_or_default();
        deadline.min(most)
    }

    /// Runs `step` until the reply margin ([`reply_margin`] of the deadline margin) before
    /// `deadline` (#34 item 12); `None` (and `step` dropped) if that came first. Without a
    /// deadline, `step` runs to its end.
    pub(crate) async fn before_stop<T>(
        &self,
        deadline: DateTime<Utc>,
        step: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let margin = reply_margin(self.settings.deadline_margin);
        before_stop(self.ports.clock.now(), deadline, margin, step).await
    }

    /// What is left before `deadline`, less the margin kept for enqueueing.
    fn time_left(&self, deadline: DateTime<Utc>) -> Duration {
        (deadline - self.ports.clock.now())
            .to_std()
            .unwrap_or_default()
            .saturating_sub(self.settings.deadline_margin)
    }

    /// Settles every attempted batch ([`settle_attempt`]; B5: its events share one outcome).
    /// A group's retries share one random draw (R2), so those due at the same time travel in
    /// one message ([`merge_retries`]): jitter spreads retries across invocations, not the
    /// batches of one subscription within one.
    fn settle(&self, groups: &[Group], attempted: Vec<Attempted>, plan: &mut Plan) {
        let now = self.ports.clock.now();
        let rules = self.settings.rules();
        let mut draws: HashMap<usize, f64> = HashMap::new();
        let mut retries = Vec::new();
        for (counts, a) in attempted.into_iter().flat_map(split_by_entry) {
            let group = &groups[a.group];
            let sub = &group.subscription;
            let _span = attempt_span(group).entered();
            if counts.request {
                plan.count(&sub.topic, &sub.name, |r| r.attempts += 1);
            }
            let published: Vec<DateTime<Utc>> =
                a.events.iter().map(|p| p.event.publish_time).collect();
            let records: BTreeSet<usize> = a.events.iter().map(|p| p.record).collect();
            // R4: the retry of a timed-out attempt names it, so a late success can cancel it.
            let mut late = a.late;
            let timed_out_attempt = late.as_ref().map(|_| uuid::Uuid::new_v4().to_string());
            let attempt = BatchAttempt {
                history: &group.history,
                time: a.time,
                result: &a.result,
                timed_out_attempt: timed_out_attempt.clone(),
                retry_after: a.retry_after,
            };
            let event_records: Vec<usize> = a.events.iter().map(|p| p.record).collect();
            let ids = self.journal_events(group, &a.events, plan);
            let events = a.events.into_iter().map(|p| p.event).collect();
            let draw = *draws
                .entry(a.group)
                .or_insert_with(|| self.ports.jitter.draw());
            let settlement = settle_attempt(sub, attempt, events, rules, now, draw);
            let facts = AttemptFacts {
                subscription: sub,
                attempt: group.history.attempts + 1,
                sent: a.time,
                answered: a.answered,
                result: &a.result,
                retry_after: a.retry_after,
                answer: answer_text(&a.answer),
                delivery: group.history.delivery_name(),
            };
            plan.journal
                .push(attempt_entry(facts, ids, Next::after(&settlement)));
            match settlement {
                Settlement::Delivered { events } => {
                    plan.count(&sub.topic, &sub.name, |r| r.delivered += events);
                    let delivered_at = a.answered;
                    plan.of(&sub.topic, &sub.name).latency_ms.extend(
                        published
                            .iter()
                            .map(|&p| metrics::latency_ms(p, delivered_at)),
                    );
                }
                Settlement::Retry(retry) => {
                    if counts.failure {
                        plan.count(&sub.topic, &sub.name, |r| r.failed_attempts += 1);
                    }
                    match &a.result {
                        AttemptResult::ConnectionFailed(reason)
                        | AttemptResult::Unresolved(reason) => {
                            warn!(error = %reason, "delivery attempt could not connect");
                        }
                        AttemptResult::Refused(reason) => {
                            warn!(error = %reason, "delivery attempt refused before connecting; retried on the schedule");
                        }
                        AttemptResult::NotSent(reason) => {
                            warn!(error = %reason, "delivery attempt not made; retried on the schedule");
                        }
                        AttemptResult::TokenUnavailable(reason) => {
                            warn!(error = %reason, "delivery attempt not made: no OAuth token; retried on the schedule");
                        }
                        _ => {}
                    }
                    let n = retry.events.len();
                    plan.count(&sub.topic, &sub.name, |r| r.retried += n);
                    if let (Some(id), Some(answer)) = (timed_out_attempt, late.take()) {
                        plan.late.push((id, answer, Span::current()));
                    }
                    retries.extend(retry.within_ttl(
                        event_records,
                        &sub.retry_policy,
                        rules.scale,
                        now,
                    ));
                }
                Settlement::GaveUp(give_up) => {
                    if counts.failure {
                        plan.count(&sub.topic, &sub.name, |r| r.failed_attempts += 1);
                    }
                    plan.give_up(sub, give_up, &records);
                }
            }
        }
        for (retry, event_records) in merge_retries(retries) {
            let (messages, delay) = retry.packed(now);
            plan.enqueue_packed(messages, event_records, delay);
        }
    }

    /// Sends everything planned; a record whose events could not all be sent, or not before
    /// the deadline's stop, is failed.
    async fn send(&self, plan: &mut Plan, deadline: DateTime<Utc>) {
        let delivery: Vec<OutgoingMessage> =
            plan.to_delivery.iter().map(|o| o.message.clone()).collect();
        let control: Vec<OutgoingMessage> =
            plan.to_control.iter().map(|o| o.message.clone()).collect();
        let replay: Vec<OutgoingMessage> =
            plan.to_replay.iter().map(|o| o.message.clone()).collect();
        let dead: Vec<OutgoingMessage> = plan
            .to_dead_letter
            .iter()
            .map(|o| o.message.clone())
            .collect();
        // O1: an ordered invocation's rounds keep their entries for one write at its end
        // (`handle_ordered`), not a call per round.
        let journal = if plan.ordered.is_some() {
            Vec::new()
        } else {
            std::mem::take(&mut plan.journal)
        };
        let (sent_delivery, sent_control, sent_replay, sent_dead, unwritten) = futures::join!(
            self.send_before_stop(self.ports.delivery_queue.as_ref(), &delivery, deadline),
            self.send_before_stop(self.ports.control_queue.as_ref(), &control, deadline),
            self.send_before_stop(self.ports.replay_queue.as_ref(), &replay, deadline),
            self.send_before_stop(self.ports.dead_letter_queue.as_ref(), &dead, deadline),
            self.write_journal(journal, deadline)
        );
        plan.journal_unwritten += unwritten;
        let outcomes = plan
            .to_delivery
            .iter()
            .zip(sent_delivery)
            .chain(plan.to_control.iter().zip(sent_control))
            .chain(plan.to_replay.iter().zip(sent_replay))
            .chain(plan.to_dead_letter.iter().zip(sent_dead));
        let mut failed = Vec::new();
        for (outgoing, result) in outcomes {
            if let Err(e) = result {
                error!(error = %e, "could not enqueue; the source messages will be redelivered");
                failed.extend(outgoing.records.iter().copied());
            }
        }
        plan.failed.extend(failed);
    }

    /// `queue.send_all(messages)`, each message refused if the deadline's stop comes first
    /// (some may have been sent: their records come back, a duplicate at worst).
    async fn send_before_stop(
        &self,
        queue: &dyn MessageQueue,
        messages: &[OutgoingMessage],
        deadline: DateTime<Utc>,
    ) -> Vec<Result<(), gridrelay_ports::QueueError>> {
        if messages.is_empty() {
            return Vec::new();
        }
        match self.before_stop(deadline, queue.send_all(messages)).await {
            Some(sent) => sent,
            None => {
                let stop = gridrelay_ports::QueueError(
                    "not accepted before the invocation's deadline".to_string(),
                );
                vec![Err(stop); messages.len()]
            }
        }
    }
}

/// Whether records are handled as ordered ones (O1: their next states kept beside them, not
/// enqueued) or as any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Unordered,
    Ordered,
}

/// What an invocation's steps took, for its log line.
#[derive(Debug, Clone, Copy, Default)]
struct Timings {
    prepare: Duration,
    attempts: Duration,
    settle: Duration,
}

impl Timings {
    fn add(&mut self, other: Timings) {
        self.prepare += other.prepare;
        self.attempts += other.attempts;
        self.settle += other.settle;
    }
}

/// The records' SQS message ids, in order.
fn message_ids(event: &SqsEvent) -> Vec<String> {
    event
        .records
        .iter()
        .map(|r| r.message_id.clone().unwrap_or_default())
        .collect()
}

/// What one part of an attempt adds to the report: the request (once per request or call),
/// and the failed attempt (once per request or call that failed, in whole or in part).
#[derive(Debug, Clone, Copy)]
struct Counts {
    request: bool,
    failure: bool,
}

/// An attempt as the parts it settles in. A request, or an AWS resource's call that answered
/// as a whole, is one part. A call that answered per entry is split by result: the events
/// the service took are delivered, each failure settles its own events (B5: never counted
/// delivered in part); the call counts once, and as one failed attempt if any part failed. An
/// answer that does not cover every event fails them all (nothing is taken for delivered).
/// An event that was never sent (too large) is no request and no failed request.
fn split_by_entry(mut a: Attempted) -> Vec<(Counts, Attempted)> {
    let Some(results) = a.per_event.take() else {
        let counts = Counts {
            request: a.called,
            failure: a.called,
        };
        return vec![(counts, a)];
    };
    let results = if results.len() == a.events.len() {
        results
    } else {
        vec![
            AttemptResult::NotSent("the destination's answer did not cover every entry".into());
            a.events.len()
        ]
    };
    let mut parts: Vec<(AttemptResult, Vec<Pending>)> = Vec::new();
    for (event, result) in std::mem::take(&mut a.events).into_iter().zip(results) {
        match parts.iter_mut().find(|(r, _)| *r == result) {
            Some((_, events)) => events.push(event),
            None => parts.push((result, vec![event])),
        }
    }
    let first_failure = parts.iter().position(|(r, _)| !is_delivered(r));
    parts
        .into_iter()
        .enumerate()
        .map(|(i, (result, events))| {
            let counts = Counts {
                request: a.called && i == 0,
                failure: a.called && Some(i) == first_failure,
            };
            let part = Attempted {
                group: a.group,
                events,
                time: a.time,
                answered: a.answered,
                result,
                late: None,
                retry_after: None,
                answer: Vec::new(),
                per_event: None,
                called: a.called,
            };
            (counts, part)
        })
        .collect()
}

/// Whether an attempt's result is a delivery (S1).
fn is_delivered(result: &AttemptResult) -> bool {
    matches!(result, AttemptResult::Status(s) if gridrelay_shared::classify::is_success(*s))
}

/// The span of work on one subscription's events: its lines name the topic and the
/// subscription through it.
fn subscription_span(topic: &str, subscription: &str) -> Span {
    info_span!("subscription", topic, subscription)
}

/// The span of one attempt of a group's events: its topic, subscription and attempt number
/// (the first is 1).
fn attempt_span(group: &Group) -> Span {
    info_span!(
        "attempt",
        topic = %group.subscription.topic,
        subscription = %group.subscription.name,
        attempt = group.history.attempts + 1,
    )
}
