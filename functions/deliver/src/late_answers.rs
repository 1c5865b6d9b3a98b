//! R4: an endpoint that answers a timed-out attempt with success within 3 minutes has its
//! pending retry removed, on a best-effort basis (duplicates may still happen).
//!
//! The sender keeps a timed-out request open for the late window. Its retry is enqueued as
//! usual, naming the attempt; the invocation then waits (at most `late_answer_wait`) for the
//! late answers and records each success in the delivery state store. When a retry comes due
//! and its attempt succeeded late, the retry is not sent and its events count as delivered.

use chrono::{DateTime, Utc};
use gridrelay_ports::LateAnswer;
use gridrelay_shared::journal::late_success_entry;
use gridrelay_shared::message::DeliveryMessage;
use tracing::{Instrument, info, warn};

use crate::{Deliver, Plan, subscription_span};

impl Deliver {
    /// Drops due retries whose timed-out attempt was answered with success after all.
    pub(crate) async fn cancel_late_successes(
        &self,
        messages: Vec<(usize, DeliveryMessage)>,
        plan: &mut Plan,
        deadline: DateTime<Utc>,
    ) -> Vec<(usize, DeliveryMessage)> {
        let checks = messages.into_iter().map(|(i, m)| {
            let span = subscription_span(&m.topic, &m.subscription);
            self.was_answered_late(i, m, deadline).instrument(span)
        });
        let mut keep = Vec::new();
        for (i, m, answered) in futures::future::join_all(checks).await {
            if let Some(answered) = answered {
                let _span = subscription_span(&m.topic, &m.subscription).entered();
                info!(
                    events = m.events.len(),
                    "retry cancelled: the timed-out attempt was answered with success (R4)"
                );
                plan.journal.push(late_success_entry(&m, answered));
                let n = m.events.len();
                plan.count(&m.topic, &m.subscription, |r| {
                    r.delivered += n;
                    r.late_successes += n;
                });
            } else {
                keep.push((i, m));
            }
        }
        keep
    }

    /// When the timed-out attempt of due retry `m` succeeded late, if it did.
    async fn was_answered_late(
        &self,
        i: usize,
        m: DeliveryMessage,
        deadline: DateTime<Utc>,
    ) -> (usize, DeliveryMessage, Option<DateTime<Utc>>) {
        let now = self.ports.clock.now();
        let answered = match &m.timed_out_attempt {
            Some(id) if m.not_before <= now => {
                match self
                    .before_stop(deadline, self.ports.state.late_success(id))
                    .await
                {
                    Some(Ok(answered)) => answered,
                    Some(Err(e)) => {
                        warn!(error = %e, "could not check for a late success; retrying anyway");
                        None
                    }
                    None => {
                        warn!("no time left to check for a late success; retrying anyway");
                        None
                    }
                }
            }
            _ => None,
        };
        (i, m, answered)
    }

    /// Waits, at most `wait`, for the late answers of this invocation's timed-out attempts and
    /// records the successes.
    pub(crate) async fn await_late_answers(
        &self,
        late: Vec<(String, LateAnswer, tracing::Span)>,
        wait: std::time::Duration,
    ) {
        if late.is_empty() {
            return;
        }
        let answers = late.into_iter().map(|(id, answer, span)| {
            async move {
            match tokio::time::timeout(wait, answer).await {
                Ok(Some(status)) if (200..=204).contains(&status) => {
                    match self
                        .ports
                        .state
                        .mark_late_success(&id, self.ports.clock.now())
                        .await
                    {
                        Ok(()) => true,
                        Err(e) => {
                            warn!(error = %e, "could not record a late success; the retry stays");
                            false
                        }
                    }
                }
                _ => false,
            }
            }
            .instrument(span)
        });
        let recorded = futures::future::join_all(answers)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count();
        if recorded > 0 {
            info!(
                attempts = recorded,
                "timed-out attempts answered with success late (R4)"
            );
        }
    }
}
