use async_trait::async_trait;

use super::describe_error;
use gridrelay_ports::{SecretError, SecretStore};
use gridrelay_shared::delivery_attributes::SecretValue;

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
