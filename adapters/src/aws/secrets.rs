use std::time::Duration;

use async_trait::async_trait;

use super::describe_error;
use gridrelay_ports::{PortalKeySource, SecretError, SecretStore};
use gridrelay_shared::delivery_attributes::SecretValue;
use gridrelay_shared::portal::PortalKey;
use gridrelay_shared::queue_seal::QueueKey;

/// Secret delivery header values in AWS Secrets Manager, one secret each.
#[derive(Debug, Clone)]
pub struct SecretsManagerStore {
    client: aws_sdk_secretsmanager::Client,
}

impl SecretsManagerStore {
    pub fn new(client: aws_sdk_secretsmanager::Client) -> Self {
        Self { client }
    }

    pub fn from_sdk(sdk: &aws_config::SdkConfig) -> Self {
        Self::new(aws_sdk_secretsmanager::Client::new(sdk))
    }
}

#[async_trait]
impl SecretStore for SecretsManagerStore {
    async fn put(&self, name: &str, value: &str) -> Result<String, SecretError> {
        let created = self
            .client
            .create_secret()
            .name(name)
            .description("gridrelay delivery header value")
            .secret_string(value)
            .send()
            .await;
        match created {
            Ok(out) => Ok(out.arn().unwrap_or(name).to_string()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_exists_exception()) =>
            {
                let out = self
                    .client
                    .put_secret_value()
                    .secret_id(name)
                    .secret_string(value)
                    .send()
                    .await
                    .map_err(|e| SecretError::Unavailable(describe_error(&e)))?;
                Ok(out.arn().unwrap_or(name).to_string())
            }
            Err(e) => Err(SecretError::Unavailable(describe_error(&e))),
        }
    }

    /// A secret that does not exist, or is scheduled for deletion, is `NotFound`; an id the
    /// service calls invalid is `Invalid`; any other failure (throttling, a 5xx, a timeout,
    /// access or KMS refused) is the store's, which can be undone: access denied may be the
    /// whole installation's (a role or secret prefix changed), and its events wait for the fix
    /// instead of being dropped.
    async fn get(&self, id: &str) -> Result<SecretValue, SecretError> {
        let out = self
            .client
            .get_secret_value()
            .secret_id(id)
            .send()
            .await
            .map_err(|e| match e.as_service_error() {
                Some(s) if s.is_resource_not_found_exception() => {
                    SecretError::NotFound(id.to_string())
                }
                // Secrets Manager's answer for a secret scheduled for deletion.
                Some(s) if s.is_invalid_request_exception() => {
                    SecretError::NotFound(id.to_string())
                }
                Some(s) if s.is_invalid_parameter_exception() => {
                    SecretError::Invalid(format!("secret id {id}: {}", describe_error(&e)))
                }
                _ => SecretError::Unavailable(describe_error(&e)),
            })?;
        out.secret_string()
            .map(SecretValue::new)
            .ok_or_else(|| SecretError::Invalid(format!("secret {id} holds no string")))
    }

    async fn delete(&self, id: &str) -> Result<(), SecretError> {
        match self
            .client
            .delete_secret()
            .secret_id(id)
            .force_delete_without_recovery(true)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(SecretError::Unavailable(describe_error(&e))),
        }
    }
}

/// The installation's queue key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum QueueKeyError {
    #[error(transparent)]
    NotSet(#[from] crate::config::MissingSetting),
    #[error("could not read the queue key secret {secret}: {reason}")]
    Unreadable { secret: String, reason: String },
    #[error("the queue key secret {secret}: {source}")]
    Invalid {
        secret: String,
        source: gridrelay_shared::queue_seal::KeyTooShort,
    },
}

/// The key the functions seal their queue messages with (#34 item 2), read from the secret
/// the stack generated. Unsealed messages are taken if SQS sent them before the key's version
/// was made plus `grace`: the functions give [`UPGRADE_GRACE`] (see
/// [`gridrelay_shared::queue_seal`]); the command line none, so a redrive never re-seals a
/// message written after the key.
pub async fn queue_key(
    sdk: &aws_config::SdkConfig,
    secret: &str,
    grace: Duration,
) -> Result<QueueKey, QueueKeyError> {
    read_queue_key(&aws_sdk_secretsmanager::Client::new(sdk), secret, grace).await
}

/// The functions' queue key: the secret [`crate::config::QUEUE_KEY_SECRET_ENV`] names (the
/// stack sets it), with [`gridrelay_shared::queue_seal::UPGRADE_GRACE`].
pub async fn function_queue_key(sdk: &aws_config::SdkConfig) -> Result<QueueKey, QueueKeyError> {
    let secret = crate::config::required(
        crate::config::QUEUE_KEY_SECRET_ENV,
        "the key queue messages are sealed with",
    )?;
    queue_key(sdk, &secret, gridrelay_shared::queue_seal::UPGRADE_GRACE).await
}

/// The queue key of a local installation (`gridrelay local`, the tests), made in the emulator
/// under `name` if it is not there. Its queues never held unsealed messages, so none is taken.
pub async fn local_queue_key(
    sdk: &aws_config::SdkConfig,
    name: &str,
) -> Result<QueueKey, QueueKeyError> {
    ensure_local_key(
        sdk,
        name,
        "gridrelay: the key its functions seal their queue messages with",
    )
    .await
    .map_err(|e| QueueKeyError::Unreadable {
        secret: name.to_string(),
        reason: e.to_string(),
    })?;
    let client = aws_sdk_secretsmanager::Client::new(sdk);
    read_queue_key(&client, name, Duration::ZERO).await
}

async fn read_queue_key(
    client: &aws_sdk_secretsmanager::Client,
    secret: &str,
    grace: Duration,
) -> Result<QueueKey, QueueKeyError> {
    let out = client
        .get_secret_value()
        .secret_id(secret)
        .send()
        .await
        .map_err(|e| QueueKeyError::Unreadable {
            secret: secret.to_string(),
            reason: describe_error(&e),
        })?;
    let text = out
        .secret_string()
        .ok_or_else(|| QueueKeyError::Unreadable {
            secret: secret.to_string(),
            reason: "it holds no string".to_string(),
        })?;
    // Without it, every cold start would open a new window for unsealed messages.
    let created = out
        .created_date()
        .and_then(|d| chrono::DateTime::from_timestamp(d.secs(), d.subsec_nanos()))
        .ok_or_else(|| QueueKeyError::Unreadable {
            secret: secret.to_string(),
            reason: "Secrets Manager did not say when its value was made".to_string(),
        })?;
    let unsealed_before = created + chrono::Duration::from_std(grace).unwrap_or_default();
    QueueKey::new(text, unsealed_before).map_err(|source| QueueKeyError::Invalid {
        secret: secret.to_string(),
        source,
    })
}

/// The key subscribers' portal links are signed with (#36), read from the secret the stack
/// generated and kept for `keep`: a rotation revokes every link within that.
pub struct SecretsManagerPortalKey {
    store: SecretsManagerStore,
    secret: String,
    keep: Duration,
    kept: tokio::sync::Mutex<Option<(std::time::Instant, PortalKey)>>,
}

impl SecretsManagerPortalKey {
    pub fn new(sdk: &aws_config::SdkConfig, secret: &str, keep: Duration) -> Self {
        Self {
            store: SecretsManagerStore::from_sdk(sdk),
            secret: secret.to_string(),
            keep,
            kept: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait]
impl PortalKeySource for SecretsManagerPortalKey {
    async fn portal_key(&self) -> Result<PortalKey, SecretError> {
        let mut kept = self.kept.lock().await;
        if let Some((read_at, key)) = kept.as_ref()
            && read_at.elapsed() < self.keep
        {
            return Ok(key.clone());
        }
        let key = read_portal_key(&self.store, &self.secret).await?;
        *kept = Some((std::time::Instant::now(), key.clone()));
        Ok(key)
    }
}

/// The portal key in `secret`, read as every secret is ([`SecretsManagerStore`]'s `get`).
async fn read_portal_key(
    store: &SecretsManagerStore,
    secret: &str,
) -> Result<PortalKey, SecretError> {
    let value = store.get(secret).await?;
    PortalKey::new(value.expose()).map_err(|e| SecretError::Invalid(format!("{secret}: {e}")))
}

/// Makes the secret `name` with a new random key (64 characters) if it is not there: the
/// local installation's keys (`gridrelay local`, the tests), as the stack generates its own.
pub async fn ensure_local_key(
    sdk: &aws_config::SdkConfig,
    name: &str,
    description: &str,
) -> Result<(), SecretError> {
    let created = aws_sdk_secretsmanager::Client::new(sdk)
        .create_secret()
        .name(name)
        .description(description)
        .secret_string(PortalKey::generate_text())
        .send()
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_exists_exception()) =>
        {
            Ok(())
        }
        Err(e) => Err(SecretError::Unavailable(describe_error(&e))),
    }
}

/// Puts a new random key in the portal key's secret (`gridrelay portal rotate-key`): every
/// link made before is refused once the portal reads it.
pub async fn rotate_portal_key(
    sdk: &aws_config::SdkConfig,
    secret: &str,
) -> Result<(), SecretError> {
    aws_sdk_secretsmanager::Client::new(sdk)
        .put_secret_value()
        .secret_id(secret)
        .secret_string(PortalKey::generate_text())
        .send()
        .await
        .map_err(|e| SecretError::Unavailable(describe_error(&e)))?;
    Ok(())
}

/// The portal key now, read past any keeping: what `event-subscription portal-link` signs with.
pub async fn portal_key(
    sdk: &aws_config::SdkConfig,
    secret: &str,
) -> Result<PortalKey, SecretError> {
    read_portal_key(&SecretsManagerStore::from_sdk(sdk), secret).await
}
