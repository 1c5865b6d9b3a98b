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
