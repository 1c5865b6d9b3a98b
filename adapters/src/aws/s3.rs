use async_trait::async_trait;
use aws_sdk_s3::primitives::ByteStream;

use super::describe_error;
use gridrelay_ports::{ObjectStore, ObjectStoreError};

/// Dead-letter objects in S3.
#[derive(Debug, Clone)]
pub struct S3ObjectStore {
    client: aws_sdk_s3::Client,
}

impl S3ObjectStore {
    pub fn new(client: aws_sdk_s3::Client) -> Self {
        Self { client }
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
            .map_err(|e| ObjectStoreError(describe_error(&e)))
    }
}
