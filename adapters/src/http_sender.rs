//! Subscriber endpoints over HTTP, with one pooled `hyper` client.
//!
//! Redirects are not followed (S1 counts 3xx as failure). An attempt's status must come within
//! the attempt timeout (S2), and then decides: the answer's body is read for no longer than
//! that, and a body that stalls changes nothing. With [`HttpEventSender::with_late_answers`], a request
//! that timed out stays open for the late window so its answer can still be seen (R4), for as
//! long as its late answer is awaited: dropping the [`LateAnswer`] closes it.
//!
//! `hyper_util`'s pooled client, not `reqwest`: a delivery is one POST of a body already built,
//! so none of `reqwest`'s layers (URL parsing with IDNA, redirect and retry policies, cookie and
//! proxy hooks) has work to do, and per request they cost more CPU than the whole delivery
//! decision (`make bench`, engine: the sender is most of `deliver`'s CPU per event). TLS is
//! `rustls` with the platform's verifier, HTTP/2 where the endpoint offers it (ALPN), as
//! `reqwest` had it.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine as _;
use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderName, RETRY_AFTER, USER_AGENT};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::descriptors::NoDescriptorToSpare;
use crate::descriptors::{DescriptorGuard, GuardedConnector, process_limit};
use crate::outbound::{OutboundConnector, SystemResolver, Unresolved};
use gridrelay_ports::endpoints::AddressResolver;
use gridrelay_ports::{
    DeliveryRequest, EventSender, HandshakeMethod, HandshakeReply, HandshakeRequest, LateAnswer,
    SentAttempt,
};
use gridrelay_shared::classify::{AttemptResult, parse_retry_after};
use gridrelay_shared::outbound::{OutboundPolicy, Refusal};

type Connector = HttpsConnector<GuardedConnector<OutboundConnector>>;
type HyperClient = Client<Connector, Full<Bytes>>;

#[derive(Debug, Clone)]
pub struct HttpEventSender {
    pool: Arc<ConnectionPool>,
    timeout: Duration,
    late_window: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("could not build the HTTP client: {0}")]
pub struct HttpClientError(String);

/// The client whose pool holds the endpoints' connections, built again (its idle connections
/// closed) when new connections find file descriptors running short ([`crate::descriptors`]).
#[derive(Debug)]
struct ConnectionPool {
    client: RwLock<HyperClient>,
    /// What every client built connects with (TLS, the descriptor guard, the outbound policy).
    connector: Connector,
    idle_per_host: usize,
    guard: DescriptorGuard,
    flushed_at: Mutex<Option<Instant>>,
}

/// What a sender is built from.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// S2: an attempt fails after this long.
    pub timeout: Duration,
    /// Open connections kept to each endpoint between requests and warm invocations.
    pub idle_per_host: usize,
    /// Which addresses requests may connect to ([`crate::outbound`]).
    pub policy: OutboundPolicy,
    /// How endpoint names become addresses.
    pub resolver: Arc<dyn AddressResolver>,
    /// The file descriptors the process may open ([`crate::descriptors`]).
    pub descriptor_limit: usize,
}

impl SenderConfig {
    /// With the system's resolver, under the process's file descriptor limit.
    pub fn new(timeout: Duration, idle_per_host: usize, policy: OutboundPolicy) -> Self {
        Self {
            timeout,
            idle_per_host,
            policy,
            resolver: Arc::new(SystemResolver),
            descriptor_limit: process_limit(),
        }
    }
}

/// The least time between two flushes of the idle pool, so a shortage that flushing cannot
/// cure (that many requests in flight) does not close every connection on each new one.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Sent with every request.
const USER_AGENT_VALUE: &str = concat!("gridrelay/", env!("CARGO_PKG_VERSION"));

impl ConnectionPool {
    /// A client with a pool of its own (none of the current one's connections).
    fn client(connector: &Connector, idle_per_host: usize) -> HyperClient {
        Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_max_idle_per_host(idle_per_host)
            .build(connector.clone())
    }

    /// Sends `request` on the current client, or on a new one if a connection asked for the
    /// idle pool to go (the old pool closes its idle connections once its last request ends).
    fn request(&self, request: http::Request<Full<Bytes>>) -> ResponseFuture {
        if self.guard.flush_wanted() {
            let mut flushed_at = self
                .flushed_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if flushed_at.is_none_or(|at| at.elapsed() >= FLUSH_EVERY) {
                let client = Self::client(&self.connector, self.idle_per_host);
                *self.client.write().unwrap_or_else(PoisonError::into_inner) = client;
                *flushed_at = Some(Instant::now());
                tracing::warn!("file descriptors running short: idle endpoint connections closed");
            }
        }
        self.client
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .request(request)
    }
}

impl HttpEventSender {
    /// A sender whose attempts fail after `config.timeout`, keeping up to
    /// `config.idle_per_host` open connections to each endpoint between requests and between
    /// warm invocations, under the file descriptor limit, connecting only where
    /// `config.policy` allows.
    pub fn new(config: SenderConfig) -> Result<Self, HttpClientError> {
        use rustls_platform_verifier::ConfigVerifierExt;
        let tls = rustls::ClientConfig::with_platform_verifier()
            .map_err(|e| HttpClientError(e.to_string()))?;
        let guard = DescriptorGuard::new(config.descriptor_limit);
        let outbound = OutboundConnector::new(Arc::new(config.policy), config.resolver);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_all_versions()
            .wrap_connector(GuardedConnector::new(guard.clone(), outbound));
        Ok(Self {
            pool: Arc::new(ConnectionPool {
                client: RwLock::new(ConnectionPool::client(&connector, config.idle_per_host)),
                connector,
                idle_per_host: config.idle_per_host,
                guard,
                flushed_at: Mutex::new(None),
            }),
            timeout: config.timeout,
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

/// A request to `endpoint` with `headers` and `body`, and the user agent, `Accept: */*` and
/// Basic credentials from the URL's `user:password@` unless `headers` name their own.
fn request(
    method: http::Method,
    endpoint: &str,
    headers: &[(String, String)],
    body: Option<(&str, String)>,
) -> Result<http::Request<Full<Bytes>>, String> {
    let (uri, credentials) = without_credentials(endpoint)?;
    let given = |name: &HeaderName| {
        headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name.as_str()))
    };
    let mut builder = http::Request::builder().method(method).uri(uri);
    if !given(&USER_AGENT) {
        builder = builder.header(USER_AGENT, USER_AGENT_VALUE);
    }
    if !given(&ACCEPT) {
        builder = builder.header(ACCEPT, "*/*");
    }
    if let Some(basic) = credentials.filter(|_| !given(&AUTHORIZATION)) {
        builder = builder.header(AUTHORIZATION, basic);
    }
    let body = match body {
        Some((content_type, body)) => {
            builder = builder.header(CONTENT_TYPE, content_type);
            Bytes::from(body)
        }
        None => Bytes::new(),
    };
    for (name, value) in headers {
        builder = builder.header(name, value);
    }
    builder
        .body(Full::new(body))
        .map_err(|e| format!("the request cannot be built: {}", error_chain(&e)))
}

/// The endpoint's URI without its `user:password@`, and those as a Basic `Authorization`
/// value: they are never sent in the URL (HTTP/2 would carry them in `:authority`). Errors
/// name what is wrong, never the URL (it may hold credentials).
fn without_credentials(endpoint: &str) -> Result<(http::Uri, Option<String>), String> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| format!("the endpoint is not a valid URL: {e}"))?;
    let Some((userinfo, host)) = uri
        .authority()
        .and_then(|a| a.as_str().rsplit_once('@'))
        .map(|(u, h)| (u.to_string(), h.to_string()))
    else {
        return Ok((uri, None));
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let (user, password) = userinfo.split_once(':').unwrap_or((&userinfo, ""));
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            decode(user),
            decode(password)
        ))
    );
    let mut parts = uri.into_parts();
    parts.authority = Some(
        host.parse()
            .map_err(|e| format!("the endpoint's host is not valid: {e}"))?,
    );
    let uri = http::Uri::from_parts(parts)
        .map_err(|e| format!("the endpoint is not a valid URL: {e}"))?;
    Ok((uri, Some(basic)))
}

/// Reads an answer's body to its end or past `most` bytes, handing each chunk to `keep`; then
/// the body is dropped, which closes the connection if it was not read to its end.
async fn read_at_most(
    mut body: hyper::body::Incoming,
    most: usize,
    mut keep: impl FnMut(&Bytes),
) -> Result<(), hyper::Error> {
    let mut read = 0;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            keep(data);
            read += data.len();
            if read > most {
                break;
            }
        }
    }
    Ok(())
}

#[async_trait]
impl EventSender for HttpEventSender {
    async fn send(&self, request: DeliveryRequest) -> SentAttempt {
        let keep = request.answer_bytes;
        let built = self::request(
            http::Method::POST,
            &request.endpoint,
            &request.headers,
            Some((request.content_type, request.body)),
        );
        let request = match built {
            Ok(request) => request,
            Err(why) => return SentAttempt::of(AttemptResult::NotSent(why)),
        };
        let response = self.pool.request(request);
        // S2: the status must come by the attempt's deadline; R4: a request that timed out
        // stays open until the late window's end for its answer.
        let deadline = tokio::time::Instant::now() + self.timeout;
        let late_deadline = deadline + self.late_window;
        let mut response = Box::pin(response);
        let response = match tokio::time::timeout_at(deadline, &mut response).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return SentAttempt::of(failed_attempt(&e)),
            Err(_) if self.late_window.is_zero() => {
                return SentAttempt::of(AttemptResult::TimedOut);
            }
            // In a task of its own from then on (only timed-out requests pay for one).
            Err(_) => {
                let late = tokio::spawn(async move {
                    match tokio::time::timeout_at(late_deadline, response).await {
                        Ok(Ok(response)) => {
                            SentAttempt::of(AttemptResult::Status(response.status().as_u16()))
                        }
                        _ => SentAttempt::of(AttemptResult::TimedOut),
                    }
                });
                return SentAttempt {
                    late: Some(late_answer(late)),
                    ..SentAttempt::of(AttemptResult::TimedOut)
                };
            }
        };
        let status = response.status().as_u16();
        let retry_after = matches!(status, 429 | 503)
            .then(|| response.headers().get(RETRY_AFTER))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, chrono::Utc::now()));
        // The status decides (#34 item 3: whatever the body does, late window or not). A small
        // answer is read to its end so the pooled connection can be reused; past
        // MAX_ANSWER_BODY, or the attempt's deadline, the response is dropped, which closes the
        // connection, so an endpoint streaming a large or slow body cannot fill this
        // function's memory, hold the attempt or undo its status.
        // The journal keeps the first bytes of what came (#35).
        let mut answer = Vec::new();
        let read = read_at_most(response.into_body(), MAX_ANSWER_BODY, |data| {
            let room = keep.saturating_sub(answer.len());
            answer.extend_from_slice(&data[..room.min(data.len())]);
        });
        let _ = tokio::time::timeout_at(deadline, read).await;
        SentAttempt {
            retry_after,
            answer,
            ..SentAttempt::of(AttemptResult::Status(status))
        }
    }

    /// A1: token requests go through the same connections as deliveries, under the same
    /// outbound rules (allowed networks, `https://` outside them) and attempt timeout; the
    /// answer is read as a handshake's, up to [`MAX_ANSWER_BODY`].
    async fn request_token(
        &self,
        url: &str,
        authorization: &str,
        body: &str,
    ) -> Result<(u16, Vec<u8>), String> {
        let reply = self
            .handshake(HandshakeRequest {
                endpoint: url.to_string(),
                method: HandshakeMethod::Post,
                headers: vec![
                    ("authorization".to_string(), authorization.to_string()),
                    ("accept".to_string(), "application/json".to_string()),
                ],
                body: Some(("application/x-www-form-urlencoded", body.to_string())),
            })
            .await?;
        Ok((reply.status, reply.body))
    }

    async fn handshake(&self, request: HandshakeRequest) -> Result<HandshakeReply, String> {
        let method = match request.method {
            HandshakeMethod::Post => http::Method::POST,
            HandshakeMethod::Options => http::Method::OPTIONS,
        };
        let request = self::request(method, &request.endpoint, &request.headers, request.body)?;
        let response = self.pool.request(request);
        let exchange = async move {
            let response = response.await.map_err(|e| in_words(&e))?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
                .collect();
            let mut body = Vec::new();
            read_at_most(response.into_body(), MAX_ANSWER_BODY, |data| {
                body.extend_from_slice(data)
            })
            .await
            .map_err(|e| in_words(&e))?;
            body.truncate(MAX_ANSWER_BODY);
            Ok(HandshakeReply {
                status,
                headers,
                body,
            })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or_else(|_| Err("no answer within the attempt timeout".to_string()))
    }
}

/// The most of an endpoint's answer that is read, to a delivery (then the connection is
/// dropped) or to a handshake (the part the code is looked for in).
pub const MAX_ANSWER_BODY: usize = 64 * 1024;

/// `e` and everything under it: its sources, and what I/O errors wrap (TLS failures come as
/// an I/O error inside an I/O error, and an I/O error's `source` skips what it wraps).
fn causes<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    let mut pending = vec![e];
    std::iter::from_fn(move || {
        let err = pending.pop()?;
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            pending.push(inner);
        }
        pending.extend(err.source());
        Some(err)
    })
}

/// A request that got no answer as a failed attempt: refused by the outbound policy, a name
/// that did not resolve, or a connection that failed, told [`in_words`].
fn failed_attempt(e: &(dyn std::error::Error + 'static)) -> AttemptResult {
    if let Some(refusal) = causes(e).find_map(|c| c.downcast_ref::<Refusal>()) {
        return AttemptResult::Refused(refusal.to_string());
    }
    if causes(e).any(|c| c.is::<Unresolved>()) {
        return AttemptResult::Unresolved(in_words(e));
    }
    AttemptResult::ConnectionFailed(in_words(e))
}

/// What kept a request from its answer, in words a user can act on (a handshake's stored
/// detail, a failed attempt's log line): the outbound policy's refusal, a name that does not
/// resolve, TLS's reason, a refused or broken connection. Never the client's internal error
/// chain, and never an address: a failure detail must not map someone's network.
fn in_words(e: &(dyn std::error::Error + 'static)) -> String {
    use std::io::ErrorKind::*;
    let mut io_kind = None;
    let mut incomplete = false;
    for err in causes(e) {
        if let Some(refusal) = err.downcast_ref::<Refusal>() {
            return refusal.to_string();
        }
        if err.is::<Unresolved>() {
            return "the endpoint's host name could not be resolved".to_string();
        }
        if let Some(short) = err.downcast_ref::<NoDescriptorToSpare>() {
            return short.to_string();
        }
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return format!("TLS error: {tls}");
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() != Other
        {
            io_kind.get_or_insert(io.kind());
        }
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            incomplete |= h.is_incomplete_message() || h.is_canceled();
        }
    }
    match io_kind {
        Some(ConnectionRefused) => "the endpoint refused the connection",
        Some(TimedOut) => "timed out connecting to the endpoint",
        Some(NetworkUnreachable | HostUnreachable) => "the endpoint's network cannot be reached",
        Some(ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof) => {
            "the endpoint closed the connection before answering"
        }
        _ if incomplete => "the endpoint closed the connection before answering",
        _ => "the connection failed before an answer",
    }
    .to_string()
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
