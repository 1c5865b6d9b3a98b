//! The endpoint validation handshake, run by the deliver worker when a subscription is created
//! (see `gridrelay_shared::validation` for the protocol).
//!
//! It lives here because `deliver` already owns every outbound request to endpoints; the
//! handshake is asked for on the delivery queue, so it runs in the service whoever created
//! the subscription.

use std::time::Duration;

use gridrelay_ports::{
    HandshakeMethod, HandshakeRequest, OutgoingMessage, StoreError, Update, update_subscription,
};
use gridrelay_shared::message::{DeliveryQueueMessage, ValidationTask, queue_delay};
use gridrelay_shared::schema::{DeliverySchema, JSON_CONTENT_TYPE};
use gridrelay_shared::subscription::{Subscription, topic_resource_id};
use gridrelay_shared::validation::{
    MANUAL_VALIDATION_WINDOW, Provisioning, ProvisioningState, ValidationStep, answers_with_code,
    code_hash, new_code, origin_allowed, validation_event_body, validation_url,
};
use tracing::{info, warn};

use crate::Deliver;

impl Deliver {
    /// Runs one handshake step. Returns a message to enqueue (the manual window's expiry), or
    /// a store error for SQS to retry the step.
    pub(crate) async fn run_validation(
        &self,
        task: &ValidationTask,
    ) -> Result<Option<OutgoingMessage>, StoreError> {
        // A step acts on the subscription's state as it is now, not as a warm function kept
        // it (`gridrelay_ports::cache`); steps are rare.
        self.store
            .forget_subscription(&task.topic, &task.subscription);
        let Some(sub) = self
            .store
            .get_subscription(&task.topic, &task.subscription)
            .await?
        else {
            return Ok(None);
        };
        if !task.is_for(&sub) {
            info!(topic = %task.topic, subscription = %task.subscription, "validation step of a subscription deleted since; the one of that name now is another");
            return Ok(None);
        }
        match (task.step, sub.provisioning.state) {
            (ValidationStep::Handshake, ProvisioningState::Creating) => self.handshake(sub).await,
            (ValidationStep::Expire, ProvisioningState::AwaitingManualAction) => {
                let now = self.clock.now();
                if sub
                    .provisioning
                    .validation_expires_at
                    .is_some_and(|at| now < at)
                {
                    let wait = (sub.provisioning.validation_expires_at.unwrap_or(now) - now)
                        .to_std()
                        .unwrap_or_default();
                    return Ok(Some(expiry_message(&sub, wait)?));
                }
                self.settle_state(
                    sub,
                    ProvisioningState::Failed,
                    "the validation URL was not called within the validation window; create the subscription again",
                )
                .await?;
                Ok(None)
            }
            // Already settled (a repeated message, or validated through the URL meanwhile).
            _ => Ok(None),
        }
    }

    async fn handshake(&self, sub: Subscription) -> Result<Option<OutgoingMessage>, StoreError> {
        if sub.event_delivery_schema == DeliverySchema::CloudEventSchemaV1_0 {
            return self.cloud_events_handshake(sub).await.map(|_| None);
        }
        let code = new_code();
        let now = self.clock.now();
        let window = self.settings.scale.apply(MANUAL_VALIDATION_WINDOW);
        let expires_at = now + chrono::Duration::from_std(window).unwrap_or_default();
        // Stored before asking, so the endpoint may call the validation URL at once.
        let stored = update_subscription(self.store.as_ref(), sub, |s| {
            if s.provisioning.state != ProvisioningState::Creating {
                return Err(());
            }
            s.provisioning.validation_code_sha256 = Some(code_hash(&code));
            s.provisioning.validation_expires_at = Some(expires_at);
            Ok(())
        })
        .await?;
        let Update::Written(sub) = stored else {
            // Deleted, replaced or settled meanwhile: nothing to ask.
            return Ok(None);
        };
        let sub = *sub;
        let url = self
            .settings
            .public_url
            .as_deref()
            .map(|base| validation_url(base, &sub.topic, &sub.name, &code));
        let body = validation_event_body(
            &topic_resource_id(&sub.topic),
            &uuid::Uuid::new_v4().to_string(),
            &code,
            url.as_deref(),
            now,
        );
        let reply = self
            .sender
            .handshake(HandshakeRequest {
                endpoint: sub.endpoint.clone(),
                method: HandshakeMethod::Post,
                headers: vec![
                    ("aeg-event-type".into(), "SubscriptionValidation".into()),
                    ("aeg-subscription-name".into(), sub.name.clone()),
                    ("aeg-delivery-count".into(), "0".into()),
                    ("aeg-metadata-version".into(), "1".into()),
                ],
                body: Some((JSON_CONTENT_TYPE, body)),
            })
            .await;
        match reply {
            Ok(r) if r.status == 200 && answers_with_code(&r.body, &code) => {
                self.settle_state(
                    sub,
                    ProvisioningState::Succeeded,
                    "validated: the endpoint answered with the validation code",
                )
                .await?;
                Ok(None)
            }
            Ok(r) if r.status == 200 && url.is_some() => {
                let awaiting = self.settle_state(
                    sub,
                    ProvisioningState::AwaitingManualAction,
                    "the endpoint accepted the validation event without the code; GET the validationUrl it received to validate",
                )
                .await?;
                awaiting.map(|sub| expiry_message(&sub, window)).transpose()
            }
            Ok(r) => {
                let why = if r.status == 200 {
                    "the endpoint answered 200 without the validation code".to_string()
                } else {
                    format!("the endpoint answered {} to the validation event", r.status)
                };
                self.settle_state(sub, ProvisioningState::Failed, &why)
                    .await?;
                Ok(None)
            }
            Err(e) => {
                let why = format!("the validation event could not be delivered: {e}");
                self.settle_state(sub, ProvisioningState::Failed, &why)
                    .await?;
                Ok(None)
            }
        }
    }

    /// CloudEvents webhook abuse protection: `OPTIONS` with `WebHook-Request-Origin`.
    async fn cloud_events_handshake(
        &self,
        sub: Subscription,
    ) -> Result<Option<Subscription>, StoreError> {
        let origin = &self.settings.webhook_origin;
        let reply = self
            .sender
            .handshake(HandshakeRequest {
                endpoint: sub.endpoint.clone(),
                method: HandshakeMethod::Options,
                headers: vec![
                    ("WebHook-Request-Origin".into(), origin.clone()),
                    ("WebHook-Request-Rate".into(), "120".into()),
                ],
                body: None,
            })
            .await;
        let (state, why) = match reply {
            Ok(r)
                if r.status == 200
                    && origin_allowed(r.header("webhook-allowed-origin"), origin) =>
            {
                (
                    ProvisioningState::Succeeded,
                    "validated: the endpoint allowed this origin (CloudEvents abuse protection)"
                        .to_string(),
                )
            }
            Ok(r) if r.status == 200 => (
                ProvisioningState::Failed,
                format!(
                    "the endpoint answered OPTIONS without WebHook-Allowed-Origin: {origin} (or *)"
                ),
            ),
            Ok(r) => (
                ProvisioningState::Failed,
                format!(
                    "the endpoint answered {} to the abuse-protection OPTIONS request",
                    r.status
                ),
            ),
            Err(e) => (
                ProvisioningState::Failed,
                format!("the abuse-protection OPTIONS request got no answer: {e}"),
            ),
        };
        self.settle_state(sub, state, &why).await
    }

    /// Records the outcome over the record as it is now, unless it was settled meanwhile
    /// (validated through its URL, say) or is no longer this subscription. The record as
    /// written, if it was.
    async fn settle_state(
        &self,
        sub: Subscription,
        state: ProvisioningState,
        why: &str,
    ) -> Result<Option<Subscription>, StoreError> {
        let (topic, name) = (sub.topic.clone(), sub.name.clone());
        let update = update_subscription(self.store.as_ref(), sub, |s| {
            if matches!(
                s.provisioning.state,
                ProvisioningState::Succeeded | ProvisioningState::Failed
            ) {
                return Err(s.provisioning.state);
            }
            s.provisioning = Provisioning {
                state,
                detail: Some(why.to_string()),
                ..s.provisioning.clone()
            };
            Ok(())
        })
        .await?;
        match update {
            Update::Written(sub) => {
                match state {
                    ProvisioningState::Failed => {
                        warn!(topic = %topic, subscription = %name, reason = why, "endpoint validation failed")
                    }
                    _ => {
                        info!(topic = %topic, subscription = %name, state = ?state, "endpoint validation")
                    }
                }
                Ok(Some(*sub))
            }
            Update::Declined(settled) => {
                info!(topic = %topic, subscription = %name, state = ?settled, "validation already settled meanwhile");
                Ok(None)
            }
            Update::Gone => Ok(None),
        }
    }
}

fn expiry_message(sub: &Subscription, wait: Duration) -> Result<OutgoingMessage, StoreError> {
    let task = ValidationTask::new(sub, ValidationStep::Expire);
    let body = DeliveryQueueMessage::Validation(task)
        .to_body()
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(OutgoingMessage {
        body,
        delay: queue_delay(wait),
    })
}
