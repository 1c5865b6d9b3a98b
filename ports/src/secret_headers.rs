//! Secret delivery header values (H1) and signing secrets in and out of the secret store.
//!
//! The rules of delivery headers are `gridrelay_shared::delivery_attributes`; this is the I/O:
//! registration puts each secret value in the secret store and keeps only its id on the
//! record, and `deliver` reads the values back when it sends.

use chrono::{DateTime, Utc};
use gridrelay_shared::delivery_attributes::{DeliveryAttributeRequest, secret_name};
use gridrelay_shared::oauth::{DeliveryAuth, oauth_secret_name};
use gridrelay_shared::signing::{Signing, SigningSecret, signing_secret_name};
use gridrelay_shared::subscription::Subscription;

use crate::{SecretError, SecretStore};

/// Puts each secret value in the secret store, under a name of this write's own (see
/// [`secret_name`]: the subscription's id and a random part), and records its id on the
/// subscription. The ids stored, so a caller that does not keep the record can delete them
/// again.
pub async fn store_secrets(
    subscription: &mut Subscription,
    requests: &[DeliveryAttributeRequest],
    secrets: &dyn SecretStore,
    prefix: &str,
) -> Result<Vec<String>, SecretError> {
    let write = format!(
        "{}.{}",
        subscription.id,
        &gridrelay_shared::subscription::new_subscription_id()[..16]
    );
    let mut stored: Vec<String> = Vec::new();
    for request in requests.iter().filter(|r| r.is_secret) {
        let name = secret_name(
            prefix,
            &subscription.topic,
            &subscription.name,
            &request.name,
            &write,
        );
        let id = match secrets.put(&name, &request.value).await {
            Ok(id) => id,
            Err(e) => {
                // Nothing will name those stored so far.
                for id in &stored {
                    let _ = secrets.delete(id).await;
                }
                return Err(e);
            }
        };
        stored.push(id.clone());
        if let Some(m) = subscription
            .delivery_attribute_mappings
            .iter_mut()
            .find(|m| m.name == request.name)
        {
            m.secret_id = Some(id);
        }
    }
    Ok(stored)
}

/// The static headers to send, with secret values read from the secret store (dynamic ones
/// come from each request's events: `gridrelay_shared::delivery_attributes::dynamic_headers`).
pub async fn resolve_headers(
    subscription: &Subscription,
    secrets: &dyn SecretStore,
) -> Result<Vec<(String, String)>, SecretError> {
    let mut headers = Vec::with_capacity(subscription.delivery_attribute_mappings.len());
    for m in subscription
        .delivery_attribute_mappings
        .iter()
        .filter(|m| !m.is_dynamic())
    {
        let value = match (&m.value, &m.secret_id) {
            (Some(v), _) => v.clone(),
            (None, Some(id)) => secrets.get(id).await?.expose().to_string(),
            (None, None) => {
                return Err(SecretError::Invalid(format!(
                    "header {} is secret but has no stored value",
                    m.name
                )));
            }
        };
        headers.push((m.name.clone(), value));
    }
    Ok(headers)
}

/// Puts a signing secret in the secret store; its id.
pub async fn store_signing_secret(
    subscription: &Subscription,
    secret: &SigningSecret,
    secrets: &dyn SecretStore,
    prefix: &str,
    now: DateTime<Utc>,
) -> Result<String, SecretError> {
    let name = signing_secret_name(prefix, &subscription.topic, &subscription.name, now);
    secrets.put(&name, &secret.to_text()).await
}

/// A1: stores a subscription's OAuth 2.0 client secret under a name of this write's own
/// ([`oauth_secret_name`]); its id.
pub async fn store_client_secret(
    subscription: &Subscription,
    secret: &str,
    secrets: &dyn SecretStore,
    prefix: &str,
    now: DateTime<Utc>,
) -> Result<String, SecretError> {
    let name = oauth_secret_name(prefix, &subscription.topic, &subscription.name, now);
    secrets.put(&name, secret).await
}

/// The secrets that sign a delivery at `now` (none for a subscription that does not sign).
pub async fn resolve_signing(
    subscription: &Subscription,
    secrets: &dyn SecretStore,
    now: DateTime<Utc>,
) -> Result<Vec<SigningSecret>, SecretError> {
    let Some(signing) = &subscription.signing else {
        return Ok(Vec::new());
    };
    let mut keys = Vec::new();
    for (i, id) in signing.secret_ids_at(now).into_iter().enumerate() {
        let read = secrets.get(id).await.and_then(|value| {
            SigningSecret::parse(value.expose()).map_err(|_| {
                SecretError::Invalid(format!("signing secret {id} is not a whsec_ value"))
            })
        });
        match read {
            Ok(key) => keys.push(key),
            // The current secret signs every delivery: without it nothing is sent. A store
            // that did not answer is waited for, not taken for a rotation's removal.
            Err(e) if i == 0 || e.is_unavailable() => return Err(e),
            // A rotated-out secret a newer rotation removed meanwhile: the current one signs.
            Err(e) => tracing::warn!(
                topic = %subscription.topic,
                subscription = %subscription.name,
                error = %e,
                "the previous signing secret could not be read; signing with the current one"
            ),
        }
    }
    Ok(keys)
}

/// Every secret id a subscription's record holds: its headers' and its signing secrets'.
pub fn secret_ids(subscription: &Subscription) -> Vec<&str> {
    let headers = subscription
        .delivery_attribute_mappings
        .iter()
        .filter_map(|m| m.secret_id.as_deref());
    let signing = subscription.signing.iter().flat_map(|s: &Signing| {
        std::iter::once(s.secret_id.as_str()).chain(s.previous.iter().map(|p| p.secret_id.as_str()))
    });
    let oauth = subscription
        .delivery_auth
        .iter()
        .map(DeliveryAuth::secret_id)
        .filter(|id| !id.is_empty());
    headers.chain(signing).chain(oauth).collect()
}
