//! Replays in `deliver` (#35, `gridrelay_shared::replay`): running a replay's steps from the
//! control queue, and claiming a replay's deliveries so a step that ran twice delivers once.
//!
//! A step that runs reads the next events of the window from the archive, turns them into new
//! deliveries for the replay's subscriptions (as fan-out does, tagged with the replay and a
//! claim per part), sends them to the delivery queue, then moves the record one version on
//! (only over the version it read) and only then hands its next step, paced to the replay's
//! rate, to the invocation's control queue sends. What fails before the record's write leaves
//! the step to SQS, which runs it again: the deliveries it sent again carry another claim token,
//! and of the two copies of each part the first to arrive is delivered.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gridrelay_ports::fan_out::replay_shares;
use gridrelay_ports::{OutgoingMessage, StoreError};
use gridrelay_shared::archive::ArchivedEvent;
use gridrelay_shared::message::{
    DeliveryHistory, DeliveryMessage, DeliveryQueueMessage, ReplayClaim, ReplayTag,
};
use gridrelay_shared::replay::{
    CLAIM_LIFETIME, Replay, ReplayState, ReplayStep, StepAction, claim_key, events_per_message,
    step_action, step_delay,
};
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::subscription::Subscription;
use tracing::{Instrument, error, info, info_span, warn};

use crate::{Deliver, Plan, push_encoded};

/// Why a step did not finish: SQS runs it again.
#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error("replay store: {0}")]
    Store(#[from] StoreError),
    #[error("archive: {0}")]
    Archive(String),
    #[error("{0}")]
    Deliveries(String),
    #[error("not finished before the invocation's deadline")]
    Deadline,
}

/// What a step that ran did.
struct StepRun {
    events: usize,
    messages: usize,
    /// The record as this step wrote it; none when another copy (or a cancel) moved it first.
    written: Option<Replay>,
}

impl Deliver {
    /// Runs an invocation's replay steps one after another.
    pub(crate) async fn run_replay_steps(
        &self,
        steps: Vec<(usize, ReplayStep)>,
        plan: &mut Plan,
        deadline: DateTime<Utc>,
    ) {
        for (i, step) in steps {
            let span = info_span!("replay_step", topic = %step.topic, replay = %step.name, version = step.version);
            let records = BTreeSet::from([i]);
            match self
                .replay_step(&step, plan, &records, deadline)
                .instrument(span.clone())
                .await
            {
                Ok(()) => {}
                Err(e) => {
                    let _span = span.entered();
                    error!(error = %e, "replay step failed; SQS will run it again");
                    plan.failed.insert(i);
                }
            }
        }
    }

    async fn replay_step(
        &self,
        step: &ReplayStep,
        plan: &mut Plan,
        records: &BTreeSet<usize>,
        deadline: DateTime<Utc>,
    ) -> Result<(), StepError> {
        let Some(replay) = self
            .before_stop(
                deadline,
                self.ports.replays.get_replay(&step.topic, &step.name),
            )
            .await
            .ok_or(StepError::Deadline)??
        else {
            warn!("the replay no longer exists; its step ends");
            return Ok(());
        };
        let now = self.ports.clock.now();
        match step_action(&replay, step.version, now) {
            StepAction::Drop => info!(
                state = ?replay.state,
                record_version = replay.version,
                "replay step not needed: the replay is not running, or a later step ran"
            ),
            StepAction::WaitUntil(at) => {
                push_step(plan, step, at - now, records);
            }
            StepAction::SendNext => {
                warn!(
                    record_version = replay.version,
                    "the replay's next step is overdue: taken for lost and sent again"
                );
                push_step(
                    plan,
                    &ReplayStep::of(&replay),
                    chrono::Duration::zero(),
                    records,
                );
            }
            StepAction::Run => {
                let run = self.run_step(&replay, now, deadline).await?;
                match run.written {
                    Some(next) => {
                        info!(
                            events = run.events,
                            messages = run.messages,
                            events_sent = next.events_sent,
                            state = ?next.state,
                            "replay step ran"
                        );
                        if next.state == ReplayState::Running {
                            let pause = next
                                .next_step_due
                                .map_or(chrono::Duration::zero(), |due| due - now);
                            push_step(plan, &ReplayStep::of(&next), pause, records);
                        }
                    }
                    // The record moved meanwhile: another copy of this step (which sends the
                    // next), a cancel, or this step's own write retried by the SDK after it
                    // was made. This step goes round again: it then finds the record one
                    // version on and sends the next step if it is overdue (it was this
                    // step's), or finds it further on, or stopped, and ends.
                    None => {
                        info!(
                            events = run.events,
                            messages = run.messages,
                            "the replay moved meanwhile: this step looks again later"
                        );
                        push_step(plan, step, chrono::Duration::zero(), records);
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends the step's deliveries and moves the record on; the record as written, if it is
    /// still running (its next step to send).
    async fn run_step(
        &self,
        replay: &Replay,
        now: DateTime<Utc>,
        deadline: DateTime<Utc>,
    ) -> Result<StepRun, StepError> {
        let subscriptions = self.replay_subscriptions(replay, now, deadline).await?;
        if subscriptions.is_empty() {
            // Nothing would receive the rest: the replay is done.
            warn!("none of the replay's subscriptions receives events any more: it completes");
            let done = replay.after_step(0, None, now);
            return self.write_step(replay, done, 0, 0, deadline).await;
        }
        let window = replay.window();
        let read = self
            .before_stop(
                deadline,
                self.ports.archive.read_step(
                    &replay.topic,
                    &window,
                    replay.cursor.as_ref(),
                    replay.step_budget(subscriptions.len()),
                ),
            )
            .await
            .ok_or(StepError::Deadline)?
            .map_err(|e| StepError::Archive(e.to_string()))?;
        if read.skipped > 0 {
            warn!(
                skipped = read.skipped,
                "archive lines that are not events skipped"
            );
        }
        let messages = replay_messages(replay, &subscriptions, &read.events, now)?;
        let sent = self
            .before_stop(deadline, self.ports.replay_queue.send_all(&messages))
            .await
            .ok_or(StepError::Deadline)?;
        if let Some(Err(e)) = sent.iter().find(|r| r.is_err()) {
            return Err(StepError::Deliveries(format!(
                "{} of {} replay deliveries not enqueued: {e}",
                sent.iter().filter(|r| r.is_err()).count(),
                sent.len()
            )));
        }
        let moved = replay.after_step(read.events.len(), read.next, now);
        self.write_step(replay, moved, read.events.len(), messages.len(), deadline)
            .await
    }

    /// Writes the record a step moved on, over the version it read. Another copy of the step
    /// may have moved it first (its deliveries then compete with this copy's for their
    /// claims), or a cancel (this step's deliveries go out: a cancel stops the steps after it).
    async fn write_step(
        &self,
        read: &Replay,
        moved: Replay,
        events: usize,
        messages: usize,
        deadline: DateTime<Utc>,
    ) -> Result<StepRun, StepError> {
        let written = self
            .before_stop(
                deadline,
                self.ports.replays.update_replay(&moved, read.version),
            )
            .await
            .ok_or(StepError::Deadline)?;
        let written = match written {
            Ok(()) => Some(moved),
            Err(StoreError::Conflict(_)) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(StepRun {
            events,
            messages,
            written,
        })
    }

    /// The replay's subscriptions as they are now: those still there under the id the replay
    /// chose, and receiving events.
    async fn replay_subscriptions(
        &self,
        replay: &Replay,
        now: DateTime<Utc>,
        deadline: DateTime<Utc>,
    ) -> Result<Vec<Subscription>, StepError> {
        let reads = replay.subscriptions.iter().map(|target| {
            self.ports
                .store
                .get_subscription(&replay.topic, &target.name)
        });
        let read = self
            .before_stop(deadline, futures::future::join_all(reads))
            .await
            .ok_or(StepError::Deadline)?;
        let mut subscriptions = Vec::new();
        for (target, found) in replay.subscriptions.iter().zip(read) {
            match found? {
                Some(sub) if sub.id == target.id && sub.receives(now) => subscriptions.push(sub),
                _ => info!(
                    subscription = %target.name,
                    "a subscription of the replay is gone, was created again or receives no events: it gets nothing"
                ),
            }
        }
        Ok(subscriptions)
    }

    /// #35: drops the copies of replay deliveries another copy of their step claimed first;
    /// claims the rest. A claim the store could not take fails the record (SQS redelivers it).
    pub(crate) async fn claim_replay_deliveries(
        &self,
        messages: Vec<(usize, DeliveryMessage)>,
        plan: &mut Plan,
        deadline: DateTime<Utc>,
    ) -> Vec<(usize, DeliveryMessage)> {
        let now = self.ports.clock.now();
        let until = now + CLAIM_LIFETIME;
        let claims = messages.iter().map(|(_, m)| async move {
            let claim = m.replay.as_ref().and_then(|r| r.claim.as_ref())?;
            let taken = self.ports.state.claim(&claim.key, &claim.token, now, until);
            Some(self.before_stop(deadline, taken).await)
        });
        let results = futures::future::join_all(claims).await;
        let mut kept = Vec::with_capacity(messages.len());
        for ((i, message), result) in messages.into_iter().zip(results) {
            match result {
                None | Some(Some(Ok(true))) => kept.push((i, message)),
                Some(Some(Ok(false))) => {
                    info!(
                        topic = %message.topic,
                        subscription = %message.subscription,
                        replay = message.replay.as_ref().map_or("", |r| r.name.as_str()),
                        events = message.events.len(),
                        "a copy of a replay's delivery that another copy of its step sent first: dropped"
                    );
                    plan.count(&message.topic, &message.subscription, |r| {
                        r.replay_copies_dropped += message.events.len()
                    });
                }
                Some(Some(Err(e))) => {
                    error!(error = %e, "replay delivery not claimed; SQS will redeliver it");
                    plan.failed.insert(i);
                }
                Some(None) => {
                    warn!("replay delivery not claimed before the invocation's deadline");
                    plan.failed.insert(i);
                }
            }
        }
        kept
    }
}

/// The step message for `step`, due after `pause` (a queue delays at most 15 minutes: a step
/// due later comes early and waits again).
fn push_step(
    plan: &mut Plan,
    step: &ReplayStep,
    pause: chrono::Duration,
    records: &BTreeSet<usize>,
) {
    let delay = step_delay(pause);
    push_encoded(
        &mut plan.to_control,
        &mut plan.failed,
        std::iter::once(DeliveryQueueMessage::Replay(step.clone()).to_body()),
        records,
        delay,
    );
}

/// The delivery queue messages of a step that read `events`: per subscription, the events its
/// filter takes (in order, in its schema; one its schema cannot take is left out for it and
/// counted), packed, each message claiming its part ([`claim_key`], with a digest of the
/// part's events) with one token for the whole run. Two runs of a step read the same events;
/// their times are stamped to the second, whose text is always as long, so their parts match;
/// were they to differ (a subscription's filter changed between the runs), their keys differ
/// and both are delivered: a duplicate, never a loss.
fn replay_messages(
    replay: &Replay,
    subscriptions: &[Subscription],
    events: &[ArchivedEvent],
    now: DateTime<Utc>,
) -> Result<Vec<OutgoingMessage>, StepError> {
    use chrono::DurationRound;
    // Their time to live counts from here.
    let now = now
        .duration_trunc(chrono::Duration::seconds(1))
        .unwrap_or(now);
    let mut by_subscription: Vec<Vec<_>> = vec![Vec::new(); subscriptions.len()];
    for run in events.chunk_by(|a, b| a.schema == b.schema) {
        let schema: InputSchema = run[0].schema;
        let raws: Vec<_> = run.iter().map(|e| e.event.clone()).collect();
        let shares = replay_shares(subscriptions, schema, &raws, now);
        for ((sub, share), queued) in subscriptions.iter().zip(shares).zip(&mut by_subscription) {
            if share.unconvertible > 0 {
                warn!(
                    subscription = %sub.name,
                    unconvertible = share.unconvertible,
                    "archived events its delivery schema cannot take: left out of its replay"
                );
            }
            queued.extend(share.events);
        }
    }
    let token = uuid::Uuid::new_v4().to_string();
    let claim = |sub: &Subscription, part: usize, digest: &str| ReplayTag {
        name: replay.name.clone(),
        claim: Some(ReplayClaim {
            key: format!(
                "{}/{digest}",
                claim_key(&replay.topic, &replay.name, replay.version, &sub.id, part)
            ),
            token: token.clone(),
        }),
    };
    let mut outgoing = Vec::new();
    for (sub, queued) in subscriptions.iter().zip(by_subscription) {
        if queued.is_empty() {
            continue;
        }
        // Packed as sent, with a claim at least as long as any part's.
        let history = DeliveryHistory {
            replay: Some(claim(sub, usize::MAX, &"0".repeat(16))),
            ..DeliveryHistory::new(sub)
        };
        let per_message = events_per_message(sub.batching.max_events_per_batch);
        let packed = queued
            .chunks(per_message)
            .flat_map(|chunk| DeliveryMessage::packed(&history, now, chunk.to_vec()));
        for (part, mut message) in packed.enumerate() {
            message.replay = Some(claim(sub, part, &part_digest(&message)));
            let body = message
                .to_body()
                .map_err(|e| StepError::Deliveries(e.to_string()))?;
            outgoing.push(OutgoingMessage {
                body,
                delay: Duration::ZERO,
                group: None,
            });
        }
    }
    Ok(outgoing)
}

/// A digest of a part's events (16 hex digits), so two runs' parts that hold different events
/// never share a claim.
fn part_digest(message: &DeliveryMessage) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for e in &message.events {
        hash.update(e.event.get().as_bytes());
        hash.update([0]);
    }
    hash.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}
