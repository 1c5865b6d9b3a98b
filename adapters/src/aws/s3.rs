use async_trait::async_trait;
use aws_sdk_s3::primitives::ByteStream;

use super::describe_error;
use gridrelay_ports::{ObjectStore, ObjectStoreError};

/// An S3 error as the object store's, telling a missing bucket (`NoSuchBucket`) apart.
fn object_store_error<E, R>(e: &aws_sdk_s3::error::SdkError<E, R>) -> ObjectStoreError
where
    E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let message = describe_error(e);
    match e.as_service_error().and_then(|s| s.code()) {
        Some("NoSuchBucket") => ObjectStoreError::bucket_missing(message),
        _ => ObjectStoreError::new(message),
    }
}

/// Dead-letter objects in S3.
#[derive(Debug, Clone)]
pub struct S3ObjectStore {
    client: aws_sdk_s3::Client,
}

impl S3ObjectStore {
    pub fn new(client: aws_sdk_s3::Client) -> Self {
        Self { client }
    }

    /// An object's bytes, as stored (compressed or not).
    pub async fn get_bytes(&self, bucket: &str, key: &str) -> Result<Vec<u8>, ObjectStoreError> {
        let out = self
            .client
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| object_store_error(&e))?;
        Ok(out
            .body
            .collect()
            .await
            .map_err(|e| ObjectStoreError::new(e.to_string()))?
            .into_bytes()
            .to_vec())
    }

    /// The days after which the objects under `prefix` in `bucket` expire, as the bucket's
    /// lifecycle configuration says in an enabled rule for exactly that prefix; `None` when it
    /// has no such rule (or no configuration).
    pub async fn expiration_days(
        &self,
        bucket: &str,
        prefix: &str,
    ) -> Result<Option<u16>, ObjectStoreError> {
        let out = match self
            .client
            .get_bucket_lifecycle_configuration()
            .bucket(bucket)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e)
                if e.as_service_error()
                    .and_then(aws_sdk_s3::error::ProvideErrorMetadata::code)
                    == Some("NoSuchLifecycleConfiguration") =>
            {
                return Ok(None);
            }
            Err(e) => return Err(object_store_error(&e)),
        };
        // A rule names its prefix in its filter, or (as older configurations do) on itself.
        #[allow(deprecated)]
        let prefix_of = |r: &aws_sdk_s3::types::LifecycleRule| {
            r.filter()
                .and_then(|f| f.prefix())
                .or_else(|| r.prefix())
                .map(str::to_string)
        };
        Ok(out
            .rules()
            .iter()
            .filter(|r| *r.status() == aws_sdk_s3::types::ExpirationStatus::Enabled)
            .filter(|r| prefix_of(r).as_deref() == Some(prefix))
            .find_map(|r| r.expiration()?.days())
            .and_then(|days| u16::try_from(days).ok()))
    }

    /// Sets `bucket`'s lifecycle configuration to expire each of `rules`' prefixes after its
    /// days (replacing what it had), as the stacks' rules do.
    pub async fn set_expirations(
        &self,
        bucket: &str,
        rules: &[(&str, &str, u16)],
    ) -> Result<(), ObjectStoreError> {
        use aws_sdk_s3::types::{
            BucketLifecycleConfiguration, ExpirationStatus, LifecycleExpiration, LifecycleRule,
            LifecycleRuleFilter,
        };
        let rules = rules
            .iter()
            .map(|(id, prefix, days)| {
                LifecycleRule::builder()
                    .id(*id)
                    .status(ExpirationStatus::Enabled)
                    .filter(LifecycleRuleFilter::builder().prefix(*prefix).build())
                    .expiration(
                        LifecycleExpiration::builder()
                            .days(i32::from(*days))
                            .build(),
                    )
                    .build()
                    .map_err(|e| ObjectStoreError::new(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let configuration = BucketLifecycleConfiguration::builder()
            .set_rules(Some(rules))
            .build()
            .map_err(|e| ObjectStoreError::new(e.to_string()))?;
        self.client
            .put_bucket_lifecycle_configuration()
            .bucket(bucket)
            .lifecycle_configuration(configuration)
            .send()
            .await
            .map_err(|e| object_store_error(&e))?;
        Ok(())
    }
}

#[async_trait]
impl ObjectStore for S3ObjectStore {
    async fn put_json(
        &self,
        bucket: &str,
        key: &str,
        body: String,
    ) -> Result<(), ObjectStoreError> {
        self.client
            .put_object()
            .bucket(bucket)
            .key(key)
            .content_type("application/json")
            .body(ByteStream::from(body.into_bytes()))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| object_store_error(&e))
    }

    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, ObjectStoreError> {
        let mut keys = Vec::new();
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| object_store_error(&e))?;
            keys.extend(
                page.contents()
                    .iter()
                    .filter_map(|o| o.key().map(str::to_string)),
            );
        }
        Ok(keys)
    }

    async fn get(&self, bucket: &str, key: &str) -> Result<String, ObjectStoreError> {
        let bytes = self.get_bytes(bucket, key).await?;
        String::from_utf8(bytes).map_err(|e| ObjectStoreError::new(e.to_string()))
    }

    async fn delete(&self, bucket: &str, key: &str) -> Result<(), ObjectStoreError> {
        self.client
            .delete_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| object_store_error(&e))
    }
}
