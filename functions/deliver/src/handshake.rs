//! The endpoint validation handshake, run by the deliver worker when a subscription is created
//! and when `update` gives it a new endpoint (see `gridrelay_shared::validation` for the
//! protocol). A new endpoint of a validated subscription is an endpoint change, validated
//! apart: events go on to the old endpoint until the new one agrees.
//!
//! It lives here because `deliver` already owns every outbound request to endpoints; the
//! handshake is asked for on the delivery queue, so it runs in the service whoever created
//! the subscription.

use chrono::{DateTime, Utc};
use std::time::Duration;

use gridrelay_ports::secret_headers::secret_ids;
use gridrelay_ports::{
    HandshakeMethod, HandshakeRequest, OutgoingMessage, StoreError, Update, update_subscription,
};
use gridrelay_shared::message::{DeliveryQueueMessage, ValidationTask, queue_delay};
use gridrelay_shared::schema::{DeliverySchema, JSON_CONTENT_TYPE};
use gridrelay_shared::subscription::{Handshake, Subscription, topic_resource_id};
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
        self.ports
            .store
            .forget_subscription(&task.topic, &task.subscription);
        let Some(sub) = self
            .ports
            .store
            .get_subscription(&task.topic, &task.subscription)
            .await?
        else {
            return Ok(None);
        };
        if !task.is_for(&sub) {
            info!(
                "validation step of a subscription deleted since; the one of that name now is another"
            );
            return Ok(None);
        }
        if task.step == ValidationStep::SubscriptionExpiry {
            return self.expire_subscription(sub, task.expires_at).await;
        }
        let which = task.handshake();
        let Some((_, provisioning)) = sub.handshake(which) else {
            // An endpoint change that was dropped or settled meanwhile.
            return Ok(None);
        };
        let (state, expires_at) = (provisioning.state, provisioning.validation_expires_at);
        match (task.step, state) {
            (ValidationStep::Handshake, ProvisioningState::Creating) => {
                self.handshake(sub, which).await
            }
            (ValidationStep::Expire, ProvisioningState::AwaitingManualAction) => {
                let now = self.ports.clock.now();
                if let Some(at) = expires_at.filter(|at| now < *at) {
                    let wait = (at - now).to_std().unwrap_or_default();
                    return Ok(Some(expiry_message(&sub, which, wait)?));
                }
                let why = match which {
                    Handshake::Subscription => {
                        "the validation URL was not called within the validation window; create the subscription again"
                    }
                    Handshake::EndpointChange => {
                        "the validation URL was not called within the validation window; the subscription keeps its endpoint (update it again to retry)"
                    }
                };
                self.settle_state(sub, which, ProvisioningState::Failed, why)
                    .await?;
                Ok(None)
            }
            // Already settled (a repeated message, or validated through the URL meanwhile).
            _ => Ok(None),
        }
    }

    async fn handshake(
        &self,
        sub: Subscription,
        which: Handshake,
    ) -> Result<Option<OutgoingMessage>, StoreError> {
        if sub.event_delivery_schema == DeliverySchema::CloudEventSchemaV1_0 {
            return self.cloud_events_handshake(sub, which).await.map(|_| None);
        }
        let code = new_code();
        let now = self.ports.clock.now();
        let window = self.settings.scale.apply(MANUAL_VALIDATION_WINDOW);
        let expires_at = now + chrono::Duration::from_std(window).unwrap_or_default();
        // Stored before asking, so the endpoint may call the validation URL at once.
        let stored = update_subscription(self.ports.store.as_ref(), sub, |s| {
            let Some(p) = s
                .handshake_provisioning_mut(which)
                .filter(|p| p.state == ProvisioningState::Creating)
            else {
                return Err(());
            };
            p.validation_code_sha256 = Some(code_hash(&code));
            p.validation_expires_at = Some(expires_at);
            Ok(())
        })
        .await?;
        let Update::Written(sub) = stored else {
            // Deleted, replaced or settled meanwhile: nothing to ask.
            return Ok(None);
        };
        let sub = *sub;
        let Some((endpoint, _)) = sub.handshake(which) else {
            return Ok(None);
        };
        let endpoint = endpoint.to_string();
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
        let mut headers = vec![
            ("aeg-event-type".into(), "SubscriptionValidation".into()),
            ("aeg-subscription-name".into(), sub.name.clone()),
            ("aeg-delivery-count".into(), "0".into()),
            ("aeg-metadata-version".into(), "1".into()),
        ];
        match self.bearer_token(&sub).await {
            Ok(token) => headers.extend(token),
            Err(why) => {
                self.settle_state(sub, which, ProvisioningState::Failed, &why)
                    .await?;
                return Ok(None);
            }
        }
        let reply = self
            .sender
            .handshake(HandshakeRequest {
                endpoint,
                method: HandshakeMethod::Post,
                headers,
                body: Some((JSON_CONTENT_TYPE, body)),
            })
            .await;
        match reply {
            Ok(r) if r.status == 200 && answers_with_code(&r.body, &code) => {
                self.settle_state(
                    sub,
                    which,
                    ProvisioningState::Succeeded,
                    "validated: the endpoint answered with the validation code",
                )
                .await?;
                Ok(None)
            }
            Ok(r) if r.status == 200 && url.is_some() => {
                let awaiting = self.settle_state(
                    sub,
                    which,
                    ProvisioningState::AwaitingManualAction,
                    "the endpoint accepted the validation event without the code; GET the validationUrl it received to validate",
                )
                .await?;
                awaiting
                    .map(|sub| expiry_message(&sub, which, window))
                    .transpose()
            }
            Ok(r) => {
                let why = if r.status == 200 {
                    "the endpoint answered 200 without the validation code".to_string()
                } else {
                    format!("the endpoint answered {} to the validation event", r.status)
                };
                self.settle_state(sub, which, ProvisioningState::Failed, &why)
                    .await?;
                Ok(None)
            }
            Err(e) => {
                let why = format!("the validation event could not be delivered: {e}");
                self.settle_state(sub, which, ProvisioningState::Failed, &why)
                    .await?;
                Ok(None)
            }
        }
    }

    /// A1: the `Authorization` a handshake goes with, for a subscription whose endpoint takes
    /// OAuth tokens (an endpoint that wants a token for every request gets one for its
    /// validation too); why none came, as the handshake's failure.
    async fn bearer_token(&self, sub: &Subscription) -> Result<Option<(String, String)>, String> {
        let Some(auth) = &sub.delivery_auth else {
            return Ok(None);
        };
        self.oauth_token(sub, auth.client_credentials(), None)
            .await
            .map(|t| Some(("authorization".to_string(), t.authorization())))
            .map_err(|e| format!("no OAuth token for the endpoint: {e}"))
    }

    /// CloudEvents webhook abuse protection: `OPTIONS` with `WebHook-Request-Origin`.
    async fn cloud_events_handshake(
        &self,
        sub: Subscription,
        which: Handshake,
    ) -> Result<Option<Subscription>, StoreError> {
        let origin = &self.settings.webhook_origin;
        let Some((endpoint, _)) = sub.handshake(which) else {
            return Ok(None);
        };
        let mut headers = vec![
            ("WebHook-Request-Origin".into(), origin.clone()),
            ("WebHook-Request-Rate".into(), "120".into()),
        ];
        let token = self.bearer_token(&sub).await;
        let reply = match token {
            Ok(token) => {
                headers.extend(token);
                self.sender
                    .handshake(HandshakeRequest {
                        endpoint: endpoint.to_string(),
                        method: HandshakeMethod::Options,
                        headers,
                        body: None,
                    })
                    .await
            }
            Err(why) => Err(why),
        };
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
        self.settle_state(sub, which, state, &why).await
    }

    /// Records the outcome over the record as it is now, unless it was settled meanwhile
    /// (validated through its URL, say), is no longer this subscription, or now asks about
    /// another endpoint than the one `sub` (the record the step read) asked: an answer only
    /// ever settles the endpoint that gave it. The record as written, if it was.
    async fn settle_state(
        &self,
        sub: Subscription,
        which: Handshake,
        state: ProvisioningState,
        why: &str,
    ) -> Result<Option<Subscription>, StoreError> {
        // What this step asked: the endpoint, and the code it sent (none for CloudEvents).
        let asked = sub
            .handshake(which)
            .map(|(endpoint, p)| (endpoint.to_string(), p.validation_code_sha256.clone()));
        let update = update_subscription(self.ports.store.as_ref(), sub, |s| {
            let Some((endpoint, p)) = s.handshake(which) else {
                return Err(None);
            };
            if asked.as_ref() != Some(&(endpoint.to_string(), p.validation_code_sha256.clone())) {
                // Asked again meanwhile (an update, perhaps of the same endpoint): that
                // request's own step settles it.
                return Err(None);
            }
            if matches!(
                p.state,
                ProvisioningState::Succeeded | ProvisioningState::Failed
            ) {
                return Err(Some(p.state));
            }
            let settled = Provisioning {
                state,
                detail: Some(why.to_string()),
                ..p.clone()
            };
            s.settle_handshake(which, settled);
            Ok(())
        })
        .await?;
        match update {
            Update::Written(sub) => {
                match state {
                    ProvisioningState::Failed => {
                        warn!(handshake = ?which, reason = why, "endpoint validation failed")
                    }
                    _ => {
                        info!(handshake = ?which, state = ?state, "endpoint validation")
                    }
                }
                Ok(Some(*sub))
            }
            Update::Declined(settled) => {
                info!(state = ?settled, "validation already settled meanwhile");
                Ok(None)
            }
            Update::Gone => Ok(None),
        }
    }
}

impl Deliver {
    /// `--expiration-date`: once the subscription's expiration time has come, deletes it (and
    /// its secrets), unless it changed since it was read (then it is read again). Asked again
    /// until then; nothing, if the expiration was taken away. (From that time on it receives
    /// nothing anyway: fan-out and delivery treat an expired subscription as deleted.)
    async fn expire_subscription(
        &self,
        sub: Subscription,
        asked_for: Option<DateTime<Utc>>,
    ) -> Result<Option<OutgoingMessage>, StoreError> {
        let now = self.ports.clock.now();
        let Some(at) = sub.expiration_time_utc else {
            return Ok(None);
        };
        if asked_for.is_some_and(|asked| asked != at) {
            // The expiration was changed since: the change asked for its own step.
            return Ok(None);
        }
        let task = ValidationTask::expiry(&sub, at);
        if now < at {
            return task_message(task, (at - now).to_std().unwrap_or_default()).map(Some);
        }
        if !self
            .ports
            .store
            .delete_subscription_if_unchanged(&sub)
            .await?
        {
            // Changed meanwhile (perhaps given a later expiration): decided again on the
            // record as it is then, a little later, so a condition that keeps failing does not
            // spin.
            return task_message(task, EXPIRY_RETRY).map(Some);
        }
        for id in secret_ids(&sub) {
            if let Err(e) = self.ports.secrets.delete(id).await {
                warn!(error = %e, "could not delete a secret of an expired subscription");
            }
        }
        info!(expired_at = %at.to_rfc3339(), "expired event subscription deleted");
        Ok(None)
    }
}

/// How soon an expiry step whose delete was refused (the record changed meanwhile) looks again.
const EXPIRY_RETRY: Duration = Duration::from_secs(60);

fn expiry_message(
    sub: &Subscription,
    which: Handshake,
    wait: Duration,
) -> Result<OutgoingMessage, StoreError> {
    task_message(ValidationTask::of(sub, ValidationStep::Expire, which), wait)
}

/// A step on the delivery queue, due after `wait` (asked again when longer than SQS delays).
fn task_message(task: ValidationTask, wait: Duration) -> Result<OutgoingMessage, StoreError> {
    let body = DeliveryQueueMessage::Validation(task)
        .to_body()
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(OutgoingMessage {
        body,
        delay: queue_delay(wait),
        group: None,
    })
}
