//! Subscriber endpoints over HTTP, with one pooled `reqwest` client.
//!
//! Redirects are not followed (S1 counts 3xx as failure), and every attempt has the attempt
//! timeout (S2) on its whole exchange. With [`HttpEventSender::with_late_answers`], a request
//! that timed out stays open for the late window so its answer can still be seen (R4), for as
//! long as its late answer is awaited: dropping the [`LateAnswer`] closes it.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::descriptors::{DescriptorGuard, process_limit};
use gridrelay_ports::{
    DeliveryRequest, EventSender, HandshakeMethod, HandshakeReply, HandshakeRequest, LateAnswer,
    SentAttempt,
};
use gridrelay_shared::classify::{AttemptResult, parse_retry_after};

#[derive(Debug, Clone)]
pub struct HttpEventSender {
    pool: Arc<ConnectionPool>,
    timeout: Duration,
    late_window: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("could not build the HTTP client: {0}")]
pub struct HttpClientError(#[from] reqwest::Error);

/// The client whose pool holds the endpoints' connections, built again (its idle connections
/// closed) when new connections find file descriptors running short ([`crate::descriptors`]).
#[derive(Debug)]
struct ConnectionPool {
    client: RwLock<reqwest::Client>,
    idle_per_host: usize,
    guard: DescriptorGuard,
    flushed_at: Mutex<Option<Instant>>,
}

/// The least time between two flushes of the idle pool, so a shortage that flushing cannot
/// cure (that many requests in flight) does not close every connection on each new one.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

impl ConnectionPool {
    fn build(
        idle_per_host: usize,
        guard: &DescriptorGuard,
    ) -> Result<reqwest::Client, HttpClientError> {
        Ok(reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_max_idle_per_host(idle_per_host)
            .user_agent(concat!("gridrelay/", env!("CARGO_PKG_VERSION")))
            .connector_layer(guard.clone())
            .build()?)
    }

    /// The client to send with: the current one, or a new one if a connection asked for the
    /// idle pool to go (the old pool closes its idle connections once its last request ends).
    fn client(&self) -> reqwest::Client {
        if self.guard.flush_wanted() {
            let mut flushed_at = self
                .flushed_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if flushed_at.is_none_or(|at| at.elapsed() >= FLUSH_EVERY) {
                match Self::build(self.idle_per_host, &self.guard) {
                    Ok(client) => {
                        *self.client.write().unwrap_or_else(PoisonError::into_inner) = client;
                        *flushed_at = Some(Instant::now());
                        tracing::warn!(
                            "file descriptors running short: idle endpoint connections closed"
                        );
                    }
                    Err(e) => tracing::warn!(error = %e, "could not flush idle connections"),
                }
            }
        }
        self.client
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl HttpEventSender {
    /// A sender whose attempts fail after `timeout`, keeping up to `idle_per_host` open
    /// connections to each endpoint between requests and between warm invocations, under the
    /// process's file descriptor limit.
    pub fn new(timeout: Duration, idle_per_host: usize) -> Result<Self, HttpClientError> {
        Self::with_descriptor_limit(timeout, idle_per_host, process_limit())
    }

    /// As [`HttpEventSender::new`], under `limit` file descriptors instead of the process's.
    pub fn with_descriptor_limit(
        timeout: Duration,
        idle_per_host: usize,
        limit: usize,
    ) -> Result<Self, HttpClientError> {
        let guard = DescriptorGuard::new(limit);
        Ok(Self {
            pool: Arc::new(ConnectionPool {
                client: RwLock::new(ConnectionPool::build(idle_per_host, &guard)?),
                idle_per_host,
                guard,
                flushed_at: Mutex::new(None),
            }),
            timeout,
            late_window: Duration::ZERO,
        })
    }

    /// R4: after an attempt times out, keep its request open this much longer for a late
    /// answer.
    pub fn with_late_answers(mut self, window: Duration) -> Self {
        self.late_window = window;
        self
    }
}

/// How long an idle pooled connection is kept.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A spawned exchange that is aborted, closing its connection, when its late answer is no
/// longer awaited.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The late answer of an exchange that goes on in `task`.
fn late_answer(task: tokio::task::JoinHandle<SentAttempt>) -> LateAnswer {
    let mut task = AbortOnDrop(task);
    Box::pin(async move {
        match (&mut task.0).await {
            Ok(SentAttempt {
                result: AttemptResult::Status(status),
                ..
            }) => Some(status),
            _ => None,
        }
    })
}

#[async_trait]
impl EventSender for HttpEventSender {
    async fn send(&self, request: DeliveryRequest) -> SentAttempt {
        let mut builder = self
            .pool
            .client()
            .post(&request.endpoint)
            .timeout(self.timeout + self.late_window)
            .header("content-type", request.content_type)
            .body(request.body);
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        let exchange = async move {
            match builder.send().await {
                Ok(mut response) => {
                    let status = response.status().as_u16();
                    let retry_after = matches!(status, 429 | 503)
                        .then(|| response.headers().get(reqwest::header::RETRY_AFTER))
                        .flatten()
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| parse_retry_after(v, chrono::Utc::now()));
                    // The status decides. A small answer is read to its end so the pooled
                    // connection can be reused; past MAX_ANSWER_BODY the response is
                    // dropped, which closes the connection, so an endpoint streaming a large
                    // body cannot fill this function's memory or hold the attempt.
                    let mut read = 0;
                    while let Ok(Some(chunk)) = response.chunk().await {
                        read += chunk.len();
                        if read > MAX_ANSWER_BODY {
                            break;
                        }
                    }
                    SentAttempt {
                        retry_after,
                        ..SentAttempt::of(AttemptResult::Status(status))
                    }
                }
                Err(e) if e.is_timeout() => SentAttempt::of(AttemptResult::TimedOut),
                Err(e) => SentAttempt::of(AttemptResult::ConnectionFailed(error_chain(&e))),
            }
        };
        if self.late_window.is_zero() {
            return exchange.await;
        }
        // S2 at the attempt timeout; the request itself stays open for R4's late window, in a
        // task of its own from then on (only timed-out requests pay for one).
        let mut exchange = Box::pin(exchange);
        match tokio::time::timeout(self.timeout, &mut exchange).await {
            Ok(sent) => sent,
            Err(_) => SentAttempt {
                late: Some(late_answer(tokio::spawn(exchange))),
                ..SentAttempt::of(AttemptResult::TimedOut)
            },
        }
    }

    async fn handshake(&self, request: HandshakeRequest) -> Result<HandshakeReply, String> {
        let method = match request.method {
            HandshakeMethod::Post => reqwest::Method::POST,
            HandshakeMethod::Options => reqwest::Method::OPTIONS,
        };
        let mut builder = self
            .pool
            .client()
            .request(method, &request.endpoint)
            .timeout(self.timeout);
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        if let Some((content_type, body)) = request.body {
            builder = builder.header("content-type", content_type).body(body);
        }
        let mut response = builder.send().await.map_err(|e| {
            if e.is_timeout() {
                "no answer within the attempt timeout".to_string()
            } else {
                error_chain(&e)
            }
        })?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| error_chain(&e))? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_ANSWER_BODY {
                body.truncate(MAX_ANSWER_BODY);
                break;
            }
        }
        Ok(HandshakeReply {
            status,
            headers,
            body,
        })
    }
}

/// The most of an endpoint's answer that is read, to a delivery (then the connection is
/// dropped) or to a handshake (the part the code is looked for in).
pub const MAX_ANSWER_BODY: usize = 64 * 1024;

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
