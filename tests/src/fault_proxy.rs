//! A fault-injecting HTTP proxy in front of the AWS API (#34 item 10).
//!
//! moto and LocalStack answer every call at once and never throttle. This proxy sits between
//! gridrelay's SDK clients and the emulator: every call it lets through reaches the emulator
//! unchanged, and a [`FaultRule`] picks calls (by service and operation, at a rate) that are
//! answered instead with the error the real service sends when it throttles or fails, in that
//! service's protocol (JSON, query/XML, REST/XML or REST/JSON), or held for a while before they
//! go through. It is test infrastructure, not a stand-in for the services.
//!
//! The service is read from the request's SigV4 credential scope; the operation from
//! `X-Amz-Target` (JSON protocols), the `Action` form field (query protocol), or the method and
//! path (S3, Lambda). Each call goes on to where the SDK would have sent it without the proxy:
//! `AWS_ENDPOINT_URL`, or the service's own `AWS_ENDPOINT_URL_<SERVICE>` where one is set (as
//! `make test-localstack` sets DynamoDB's and Lambda's to moto beside LocalStack).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

/// The services (signing names) whose own throttling and internal errors the proxy answers
/// with ([`throttling_error`], [`server_error`]).
pub const SERVICES: [&str; 9] = [
    "sqs",
    "dynamodb",
    "s3",
    "secretsmanager",
    "sns",
    "events",
    "kinesis",
    "lambda",
    "firehose",
];

/// Where each service's calls go on to: the emulator of the environment, service by service.
#[derive(Debug, Clone)]
pub struct Upstreams {
    default: String,
    /// By signing name, for the services that have an endpoint of their own.
    by_service: BTreeMap<String, String>,
}

impl Upstreams {
    /// `AWS_ENDPOINT_URL`, and each `AWS_ENDPOINT_URL_<SERVICE>` the environment sets, as the
    /// SDK reads them.
    pub fn from_environment() -> Self {
        let variable = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| v.trim_end_matches('/').to_string())
        };
        let default = variable("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL names the emulator");
        let by_service = SERVICES
            .into_iter()
            .filter_map(|service| {
                variable(&format!("AWS_ENDPOINT_URL_{}", service_id(service)))
                    .map(|url| (service.to_string(), url))
            })
            .collect();
        Self {
            default,
            by_service,
        }
    }

    fn of(&self, service: &str) -> &str {
        self.by_service.get(service).unwrap_or(&self.default)
    }
}

/// The `AWS_ENDPOINT_URL_<SERVICE>` variables of [`SERVICES`] that the environment sets. A
/// process sent through the proxy gets each of them pointed at the proxy too: otherwise those
/// services' calls would go around it (as DynamoDB's do to moto beside LocalStack).
pub fn per_service_endpoint_variables() -> Vec<String> {
    SERVICES
        .into_iter()
        .map(|service| format!("AWS_ENDPOINT_URL_{}", service_id(service)))
        .filter(|name| std::env::var(name).is_ok_and(|v| !v.is_empty()))
        .collect()
}

/// The SDK's name of a service in its `AWS_ENDPOINT_URL_<SERVICE>` variable, from its signing
/// name.
fn service_id(signing_name: &str) -> String {
    match signing_name {
        "secretsmanager" => "SECRETS_MANAGER".to_string(),
        "events" => "EVENTBRIDGE".to_string(),
        other => other.to_uppercase(),
    }
}

/// What a rule does to a call it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The service's throttling error ([`throttling_error`]).
    Throttle,
    /// The service's internal error, a 5xx ([`server_error`]).
    ServerError,
    /// Holds the call this long, then passes it on.
    Delay(Duration),
}

/// Which of the calls a rule matches it picks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick {
    /// Each at random with this probability, from 0 to 1 (the proxy's seeded draws).
    Share(f64),
    /// The first `n`: a fault a test can count on, however few calls. Three or more outlast
    /// the SDK's own attempts (three by default), so the error reaches gridrelay's code.
    First(u64),
}

/// Which calls a fault applies to, and how often.
#[derive(Debug, Clone)]
pub struct FaultRule {
    /// The service's signing name: `sqs`, `dynamodb`, `s3`, `secretsmanager`, `sns`, `events`,
    /// `kinesis`, `lambda`, `firehose`.
    pub service: &'static str,
    /// One operation (`SendMessageBatch`, `UpdateItem`, `PutObject`...), or every one.
    pub operation: Option<&'static str>,
    pub fault: Fault,
    pub pick: Pick,
}

impl FaultRule {
    /// Every operation of `service`, throttled at `rate`.
    pub fn throttle(service: &'static str, rate: f64) -> Self {
        Self {
            service,
            operation: None,
            fault: Fault::Throttle,
            pick: Pick::Share(rate),
        }
    }

    /// Every operation of `service`, failing with a 5xx at `rate`.
    pub fn server_error(service: &'static str, rate: f64) -> Self {
        Self {
            fault: Fault::ServerError,
            ..Self::throttle(service, rate)
        }
    }

    /// Every operation of `service`, held for `by` at `rate`.
    pub fn delay(service: &'static str, by: Duration, rate: f64) -> Self {
        Self {
            fault: Fault::Delay(by),
            ..Self::throttle(service, rate)
        }
    }

    /// The first `n` matching calls, instead of a share.
    pub fn first(self, n: u64) -> Self {
        Self {
            pick: Pick::First(n),
            ..self
        }
    }

    /// Only `operation` of the rule's service.
    pub fn only(self, operation: &'static str) -> Self {
        Self {
            operation: Some(operation),
            ..self
        }
    }

    fn matches(&self, call: &Call) -> bool {
        self.service == call.service && self.operation.is_none_or(|op| op == call.operation)
    }
}

/// A call as the proxy tells it apart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Call {
    pub service: String,
    pub operation: String,
}

/// What became of the calls of one service and operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Passed on to the emulator (delayed ones included).
    pub passed: u64,
    pub throttled: u64,
    pub failed: u64,
    pub delayed: u64,
}

impl CallCounts {
    /// Calls answered with an error instead of reaching the emulator.
    pub fn refused(&self) -> u64 {
        self.throttled + self.failed
    }
}

struct Proxy {
    upstreams: Upstreams,
    /// Each rule, and how many calls it matched.
    rules: Mutex<Vec<(FaultRule, u64)>>,
    rng: Mutex<StdRng>,
    counts: Mutex<BTreeMap<Call, CallCounts>>,
    http: reqwest::Client,
}

/// A running proxy on 127.0.0.1; stopped when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    proxy: Arc<Proxy>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy in front of the environment's emulator ([`Upstreams::from_environment`]) that
    /// passes every call on until rules are set. Its random draws are seeded with `seed`, so a
    /// run can be repeated.
    pub async fn start(seed: u64) -> Self {
        let proxy = Arc::new(Proxy {
            upstreams: Upstreams::from_environment(),
            rules: Mutex::new(Vec::new()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            counts: Mutex::new(BTreeMap::new()),
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("an HTTP client"),
        });
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&proxy));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("the proxy binds a port");
        let addr = listener.local_addr().expect("a bound address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, proxy, task }
    }

    /// The URL to give the SDK as its endpoint.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the rules; the first that matches a call and draws it decides.
    pub fn set_rules(&self, rules: Vec<FaultRule>) {
        *self.proxy.rules.lock().expect("rules") = rules.into_iter().map(|r| (r, 0)).collect();
    }

    /// What became of every call so far, by service and operation.
    pub fn counts(&self) -> BTreeMap<Call, CallCounts> {
        self.proxy.counts.lock().expect("counts").clone()
    }

    /// The calls of `service` answered with an error instead of reaching the emulator.
    pub fn refused(&self, service: &str) -> u64 {
        self.counts()
            .iter()
            .filter(|(call, _)| call.service == service)
            .map(|(_, c)| c.refused())
            .sum()
    }

    /// One line per service and operation, for a test's output.
    pub fn report(&self) -> String {
        self.counts()
            .iter()
            .map(|(call, c)| {
                format!(
                    "{}.{}: {} passed, {} throttled, {} failed, {} delayed",
                    call.service, call.operation, c.passed, c.throttled, c.failed, c.delayed
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return plain(StatusCode::BAD_REQUEST, "unreadable request body");
    };
    let call = identify(&parts.method, parts.uri.path(), &parts.headers, &body);
    let fault = proxy.draw(&call);
    proxy.count(&call, fault);
    match fault {
        Some(Fault::Throttle) => return throttling_error(&call, &parts.headers),
        Some(Fault::ServerError) => return server_error(&call, &parts.headers),
        Some(Fault::Delay(by)) => tokio::time::sleep(by).await,
        None => {}
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut forward = proxy
        .http
        .request(
            parts.method.clone(),
            format!("{}{path}", proxy.upstreams.of(&call.service)),
        )
        .body(body);
    for (name, value) in &parts.headers {
        if !is_hop_by_hop(name.as_str()) {
            forward = forward.header(name, value);
        }
    }
    let answer = match forward.send().await {
        Ok(answer) => answer,
        Err(e) => {
            return plain(
                StatusCode::BAD_GATEWAY,
                &format!("emulator unreachable: {e}"),
            );
        }
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    let body = answer.bytes().await.unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    for (name, value) in &headers {
        if !is_hop_by_hop(name.as_str()) {
            response.headers_mut().append(name, value.clone());
        }
    }
    response
}

impl Proxy {
    fn draw(&self, call: &Call) -> Option<Fault> {
        let mut rules = self.rules.lock().expect("rules");
        let mut rng = self.rng.lock().expect("rng");
        for (rule, matched) in rules.iter_mut().filter(|(rule, _)| rule.matches(call)) {
            *matched += 1;
            let picked = match rule.pick {
                Pick::Share(rate) => rng.random::<f64>() < rate,
                Pick::First(n) => *matched <= n,
            };
            if picked {
                return Some(rule.fault);
            }
        }
        None
    }

    fn count(&self, call: &Call, fault: Option<Fault>) {
        let mut counts = self.counts.lock().expect("counts");
        let c = counts.entry(call.clone()).or_default();
        match fault {
            Some(Fault::Throttle) => c.throttled += 1,
            Some(Fault::ServerError) => c.failed += 1,
            Some(Fault::Delay(_)) => {
                c.delayed += 1;
                c.passed += 1;
            }
            None => c.passed += 1,
        }
    }
}

/// Headers that belong to one connection, not to the call.
fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "transfer-encoding" | "content-length" | "host" | "upgrade"
    )
}

/// The service (from the SigV4 credential scope) and operation of a call.
fn identify(method: &Method, path: &str, headers: &HeaderMap, body: &[u8]) -> Call {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    // `Credential=AKID/20261127/us-east-1/sqs/aws4_request`
    let service = header("authorization")
        .and_then(|a| a.split("Credential=").nth(1))
        .and_then(|c| c.split('/').nth(3))
        .unwrap_or("unknown")
        .to_string();
    let operation = if let Some(target) = header("x-amz-target") {
        target.rsplit('.').next().unwrap_or(target).to_string()
    } else if header("content-type")
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"))
    {
        form_action(body).unwrap_or_else(|| method.to_string())
    } else if service == "s3" {
        s3_operation(method, path)
    } else if service == "lambda" && method == Method::POST && path.ends_with("/invocations") {
        "Invoke".to_string()
    } else {
        method.to_string()
    };
    Call { service, operation }
}

/// The `Action` field of a query-protocol body.
fn form_action(body: &[u8]) -> Option<String> {
    std::str::from_utf8(body)
        .ok()?
        .split('&')
        .find_map(|pair| pair.strip_prefix("Action="))
        .map(str::to_string)
}

/// An S3 call's operation, from its method and whether its path names an object (path-style
/// addressing, as the SDK uses against an emulator).
fn s3_operation(method: &Method, path: &str) -> String {
    let object = path
        .trim_start_matches('/')
        .split_once('/')
        .is_some_and(|(_, key)| !key.is_empty());
    let name = match (method.as_str(), object) {
        ("PUT", true) => "PutObject",
        ("GET", true) => "GetObject",
        ("HEAD", true) => "HeadObject",
        ("DELETE", true) => "DeleteObject",
        ("PUT", false) => "CreateBucket",
        ("HEAD", false) => "HeadBucket",
        ("GET", false) => "ListObjects",
        ("DELETE", false) => "DeleteBucket",
        (other, _) => other,
    };
    name.to_string()
}

/// The error `call`'s service answers when it throttles, as the service sends it.
fn throttling_error(call: &Call, request: &HeaderMap) -> Response {
    match call.service.as_str() {
        // SQS (JSON protocol, query-compatible): `RequestThrottled`, 400.
        "sqs" => json_error(
            request,
            StatusCode::BAD_REQUEST,
            "com.amazonaws.sqs#RequestThrottled",
            Some("RequestThrottled;Sender"),
            "Rate exceeded",
        ),
        // DynamoDB: the table's throughput exceeded, 400.
        "dynamodb" => json_error(
            request,
            StatusCode::BAD_REQUEST,
            "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
            None,
            "The level of configured provisioned throughput for the table was exceeded.",
        ),
        // Kinesis: the shard's throughput exceeded, 400.
        "kinesis" => json_error(
            request,
            StatusCode::BAD_REQUEST,
            "ProvisionedThroughputExceededException",
            None,
            "Rate exceeded for shard shardId-000000000000 in stream.",
        ),
        // Firehose: `ServiceUnavailableException`, 503 (its word for a stream over its limits).
        "firehose" => json_error(
            request,
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableException",
            None,
            "Slow down.",
        ),
        // Secrets Manager and EventBridge: `ThrottlingException`, 400.
        "secretsmanager" | "events" => json_error(
            request,
            StatusCode::BAD_REQUEST,
            "ThrottlingException",
            None,
            "Rate exceeded",
        ),
        // SNS (query protocol): `ThrottledException`, whose code is `Throttled`, 429.
        "sns" => query_error(
            StatusCode::TOO_MANY_REQUESTS,
            "Sender",
            "Throttled",
            "Rate exceeded",
        ),
        // S3: 503 `SlowDown`.
        "s3" => s3_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "SlowDown",
            "Please reduce your request rate.",
        ),
        // Lambda (REST/JSON): 429 `TooManyRequestsException`.
        "lambda" => lambda_error(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequestsException",
            r#"{"Reason":"CallerRateLimitExceeded","Type":"User","message":"Rate Exceeded."}"#,
        ),
        other => plain(
            StatusCode::TOO_MANY_REQUESTS,
            &format!("no throttling error known for {other}"),
        ),
    }
}

/// The error `call`'s service answers when it fails inside, as the service sends it.
fn server_error(call: &Call, request: &HeaderMap) -> Response {
    match call.service.as_str() {
        "sqs" => json_error(
            request,
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalFailure",
            None,
            "We encountered an internal error. Please try again.",
        ),
        "dynamodb" => json_error(
            request,
            StatusCode::INTERNAL_SERVER_ERROR,
            "com.amazonaws.dynamodb.v20120810#InternalServerError",
            None,
            "Internal server error",
        ),
        "secretsmanager" | "events" | "kinesis" | "firehose" => json_error(
            request,
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalFailure",
            None,
            "The request processing has failed because of an unknown error.",
        ),
        "sns" => query_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Receiver",
            "InternalError",
            "Internal error",
        ),
        "s3" => s3_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "We encountered an internal error. Please try again.",
        ),
        "lambda" => lambda_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "ServiceException",
            r#"{"Type":"Service","message":"An internal error occurred."}"#,
        ),
        other => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("no internal error known for {other}"),
        ),
    }
}

/// An error of the JSON protocols, in the request's own content type.
fn json_error(
    request: &HeaderMap,
    status: StatusCode,
    kind: &str,
    query_error: Option<&str>,
    message: &str,
) -> Response {
    let content_type = request
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/x-amz-json-1.0"));
    let body = serde_json::json!({ "__type": kind, "message": message }).to_string();
    let mut response = with_request_id(status, Body::from(body));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    if let Some(code) = query_error.and_then(|q| HeaderValue::from_str(q).ok()) {
        response.headers_mut().insert("x-amzn-query-error", code);
    }
    response
}

/// An error of the query protocol (SNS).
fn query_error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response {
    let body = format!(
        "<ErrorResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><Error>\
         <Type>{kind}</Type><Code>{code}</Code><Message>{message}</Message></Error>\
         <RequestId>{}</RequestId></ErrorResponse>",
        request_id()
    );
    xml(status, body)
}

/// An error of S3's REST/XML protocol.
fn s3_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
         <Message>{message}</Message><RequestId>{}</RequestId></Error>",
        request_id()
    );
    xml(status, body)
}

/// An error of Lambda's REST/JSON protocol: the type in `x-amzn-ErrorType`.
fn lambda_error(status: StatusCode, kind: &'static str, body: &'static str) -> Response {
    let mut response = with_request_id(status, Body::from(body));
    let headers = response.headers_mut();
    headers.insert("x-amzn-errortype", HeaderValue::from_static(kind));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn xml(status: StatusCode, body: String) -> Response {
    let mut response = with_request_id(status, Body::from(body));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/xml"));
    response
}

fn plain(status: StatusCode, text: &str) -> Response {
    let mut response = Response::new(Body::from(text.to_string()));
    *response.status_mut() = status;
    response
}

fn with_request_id(status: StatusCode, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    if let Ok(id) = HeaderValue::from_str(&request_id()) {
        response.headers_mut().insert("x-amzn-requestid", id);
    }
    response
}

fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}
