//! The endpoint validation handshake, run by the deliver worker when a subscription is created
//! (see `gridrelay_shared::validation` for the protocol).
//!
//! It lives here because `deliver` already owns every outbound request to endpoints; the
//! handshake is asked for on the delivery queue, so it runs in the service whoever created
//! the subscription.

use std::time::Duration;

use gridrelay_ports::{HandshakeMethod, HandshakeRequest, OutgoingMessage, StoreError};
use gridrelay_shared::message::{DeliveryQueueMessage, queue_delay};
use gridrelay_shared::schema::{DeliverySchema, JSON_CONTENT_TYPE};
use gridrelay_shared::subscription::{Subscription, topic_resource_id};
use gridrelay_shared::validation::{
    MANUAL_VALIDATION_WINDOW, Provisioning, ProvisioningState, ValidationStep, ValidationTask,
    answers_with_code, code_hash, new_code, origin_allowed, validation_event_body, validation_url,
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
        let Some(mut sub) = self
            .store
            .get_subscription(&task.topic, &task.subscription)
            .await?
        else {
            return Ok(None);
        };
        match (task.step, sub.provisioning.state) {
            (ValidationStep::Handshake, ProvisioningState::Creating) => {
                self.handshake(&mut sub).await
            }
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
                    &mut sub,
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

    async fn handshake(
        &self,
        sub: &mut Subscription,
    ) -> Result<Option<OutgoingMessage>, StoreError> {
        if sub.event_delivery_schema == DeliverySchema::CloudEventSchemaV1_0 {
            return self.cloud_events_handshake(sub).await.map(|()| None);
        }
        let code = new_code();
        let now = self.clock.now();
        let window = self.settings.scale.apply(MANUAL_VALIDATION_WINDOW);
        sub.provisioning.validation_code_sha256 = Some(code_hash(&code));
        sub.provisioning.validation_expires_at =
            Some(now + chrono::Duration::from_std(window).unwrap_or_default());
        // Stored before asking, so the endpoint may call the validation URL at once.
        self.store.replace_subscription(sub).await?;
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
                self.settle_state(
                    sub,
                    ProvisioningState::AwaitingManualAction,
                    "the endpoint accepted the validation event without the code; GET the validationUrl it received to validate",
                )
                .await?;
                Ok(Some(expiry_message(sub, window)?))
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
    async fn cloud_events_handshake(&self, sub: &mut Subscription) -> Result<(), StoreError> {
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

    /// Records the outcome, unless the subscription was validated through its URL meanwhile.
    async fn settle_state(
        &self,
        sub: &mut Subscription,
        state: ProvisioningState,
        why: &str,
    ) -> Result<(), StoreError> {
        if state != ProvisioningState::Succeeded
            && let Some(now) = self.store.get_subscription(&sub.topic, &sub.name).await?
            && now.provisioning.state == ProvisioningState::Succeeded
        {
            return Ok(());
        }
        sub.provisioning = Provisioning {
            state,
            detail: Some(why.to_string()),
            ..sub.provisioning.clone()
        };
        match state {
            ProvisioningState::Failed => {
                warn!(topic = %sub.topic, subscription = %sub.name, reason = why, "endpoint validation failed")
            }
            _ => {
                info!(topic = %sub.topic, subscription = %sub.name, state = ?state, "endpoint validation")
            }
        }
        match self.store.replace_subscription(sub).await {
            Err(StoreError::NotFound(_)) => Ok(()),
            other => other,
        }
    }
}

fn expiry_message(sub: &Subscription, wait: Duration) -> Result<OutgoingMessage, StoreError> {
    let task = ValidationTask::new(&sub.topic, &sub.name, ValidationStep::Expire);
    let body = DeliveryQueueMessage::Validation(task)
        .to_body()
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(OutgoingMessage {
        body,
        delay: queue_delay(wait),
    })
}
