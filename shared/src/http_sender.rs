//! Subscriber endpoints over HTTP, with one pooled `reqwest` client.
//!
//! Redirects are not followed (S1 counts 3xx as failure), and every attempt has the attempt
//! timeout (S2) on its whole exchange.

use std::time::Duration;

use async_trait::async_trait;

use crate::classify::AttemptResult;
use crate::ports::{DeliveryRequest, EventSender};

/// S2: a request with no response after this long has failed.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct HttpEventSender {
    client: reqwest::Client,
    timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("could not build the HTTP client: {0}")]
pub struct HttpClientError(#[from] reqwest::Error);

impl HttpEventSender {
    /// A sender whose attempts fail after `timeout`.
    pub fn new(timeout: Duration) -> Result<Self, HttpClientError> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(32)
            .user_agent(concat!("gridrelay/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { client, timeout })
    }
}

#[async_trait]
impl EventSender for HttpEventSender {
    async fn send(&self, request: DeliveryRequest) -> AttemptResult {
        let mut builder = self
            .client
            .post(&request.endpoint)
            .timeout(self.timeout)
            .header("content-type", request.content_type)
            .body(request.body);
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        match builder.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                // Reading the (small) answer lets the pooled connection be reused; the status
                // stands whatever happens to the body.
                let _ = response.bytes().await;
                AttemptResult::Status(status)
            }
            Err(e) if e.is_timeout() => AttemptResult::TimedOut,
            Err(e) => AttemptResult::ConnectionFailed(error_chain(&e)),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
