//! Secret delivery header values (H1) in and out of the secret store.
//!
//! The rules of delivery headers are `gridrelay_shared::delivery_attributes`; this is the I/O:
//! registration puts each secret value in the secret store and keeps only its id on the
//! record, and `deliver` reads the values back when it sends.

use gridrelay_shared::delivery_attributes::{DeliveryAttributeRequest, secret_name};
use gridrelay_shared::subscription::Subscription;

use crate::{SecretError, SecretStore};

/// Puts each secret value in the secret store and records its id on the subscription.
pub async fn store_secrets(
    subscription: &mut Subscription,
    requests: &[DeliveryAttributeRequest],
    secrets: &dyn SecretStore,
    prefix: &str,
) -> Result<(), SecretError> {
    for request in requests.iter().filter(|r| r.is_secret) {
        let name = secret_name(
            prefix,
            &subscription.topic,
            &subscription.name,
            &request.name,
        );
        let id = secrets.put(&name, &request.value).await?;
        if let Some(m) = subscription
            .delivery_attribute_mappings
            .iter_mut()
            .find(|m| m.name == request.name)
        {
            m.secret_id = Some(id);
        }
    }
    Ok(())
}

/// The headers to send, with secret values read from the secret store.
pub async fn resolve_headers(
    subscription: &Subscription,
    secrets: &dyn SecretStore,
) -> Result<Vec<(String, String)>, SecretError> {
    let mut headers = Vec::with_capacity(subscription.delivery_attribute_mappings.len());
    for m in &subscription.delivery_attribute_mappings {
        let value = match (&m.value, &m.secret_id) {
            (Some(v), _) => v.clone(),
            (None, Some(id)) => secrets.get(id).await?,
            (None, None) => {
                return Err(SecretError(format!(
                    "header {} is secret but has no stored value",
                    m.name
                )));
            }
        };
        headers.push((m.name.clone(), value));
    }
    Ok(headers)
}
