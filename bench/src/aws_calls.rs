//! Counts the AWS API calls the local stack makes: a pass-through proxy in front of the AWS API
//! (moto), which `gridrelay local` is pointed at instead. Each call is counted by service and
//! operation, with the 64 KB chunks SQS would bill for it (the larger of request and response
//! payload). Counting on the wire, not in gridrelay's code, counts every call the SDK makes,
//! retries included.
//!
//! For emulators only: the proxy passes requests on to another host, so a SigV4 signature
//! (which covers `Host`) would not hold against real AWS; moto and LocalStack do not check
//! signatures. Calls of a service with an endpoint of its own (the SDK's
//! `AWS_ENDPOINT_URL_<SERVICE>`, as `infra/local/localstack.sh env` sets for DynamoDB on moto)
//! are passed on there, so a mixed stack is counted whole.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::cost::{firehose_steps, sqs_chunks};

/// Calls of one operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calls {
    pub calls: u64,
    /// SQS: 64 KB chunks billed; Firehose: 5 KB steps of its records; DynamoDB's batch calls:
    /// their items (each a request unit at least); other services: equal to `calls`.
    pub billed_units: u64,
    /// Firehose: its records' bytes, as the stack's stream stores them (the writers compress
    /// each record; the stream keeps them as they are). Other services: 0.
    pub stored_bytes: u64,
    /// Time from the request's arrival at the proxy to the whole answer, summed over calls.
    pub micros: u64,
    /// The longest of those.
    pub max_micros: u64,
}

/// Calls by `service:Operation` (S3: `s3:GET`, `s3:PUT`, `s3:LIST`, …).
pub type CallCounts = BTreeMap<String, Calls>;

struct Proxy {
    target: String,
    /// Services (as an operation's name has them: `dynamodb`) passed on elsewhere.
    routes: BTreeMap<String, String>,
    client: reqwest::Client,
    counts: Mutex<CallCounts>,
}

/// A running proxy: its URL and what it has counted.
pub struct AwsCallCounter {
    pub url: String,
    proxy: Arc<Proxy>,
}

impl AwsCallCounter {
    /// Starts a proxy to `target` (the AWS API's base URL) on a free loopback port, with the
    /// calls of each service in `routes` passed on to its own base URL instead.
    pub async fn start(target: &str, routes: BTreeMap<String, String>) -> anyhow::Result<Self> {
        let proxy = Arc::new(Proxy::new(target, routes)?);
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let app = Router::new()
            .fallback(forward)
            .with_state(Arc::clone(&proxy));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { url, proxy })
    }

    /// Counts so far, and starts counting afresh.
    pub fn take(&self) -> CallCounts {
        self.proxy
            .counts
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }
}

/// The SDK's per-service endpoint variables for the services the stack calls, by the service
/// names [`operation`] gives.
pub const SERVICE_ENDPOINT_VARS: [(&str, &str); 5] = [
    ("dynamodb", "AWS_ENDPOINT_URL_DYNAMODB"),
    ("sqs", "AWS_ENDPOINT_URL_SQS"),
    ("s3", "AWS_ENDPOINT_URL_S3"),
    ("firehose", "AWS_ENDPOINT_URL_FIREHOSE"),
    ("secretsmanager", "AWS_ENDPOINT_URL_SECRETS_MANAGER"),
];

/// The services given endpoints of their own by `var` (the environment, in use).
pub fn routes_from(var: impl Fn(&str) -> Option<String>) -> BTreeMap<String, String> {
    SERVICE_ENDPOINT_VARS
        .iter()
        .filter_map(|(service, name)| Some((service.to_string(), var(name)?)))
        .collect()
}

impl Proxy {
    fn new(target: &str, routes: BTreeMap<String, String>) -> anyhow::Result<Self> {
        Ok(Self {
            target: target.trim_end_matches('/').to_string(),
            routes: routes
                .into_iter()
                .map(|(service, url)| (service, url.trim_end_matches('/').to_string()))
                .collect(),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                // A redirect is the AWS API's answer to pass back, not to follow.
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
            counts: Mutex::new(CallCounts::new()),
        })
    }

    /// Where a call of `op` (`service:Operation`) is passed on to.
    fn target_of(&self, op: &str) -> &str {
        let service = op.split_once(':').map_or(op, |(service, _)| service);
        self.routes.get(service).unwrap_or(&self.target)
    }
}

/// What a request is: `service:Operation`, from its `X-Amz-Target`, method, path and query
/// (S3's REST API) or form body (the query protocol).
pub fn operation(
    target: Option<&str>,
    method: &str,
    path_and_query: &str,
    form_body: &[u8],
) -> String {
    if let Some(target) = target {
        // awsJson: `AmazonSQS.SendMessageBatch`, `DynamoDB_20120810.GetItem`,
        // `secretsmanager.GetSecretValue`.
        let (service, op) = target.split_once('.').unwrap_or(("unknown", target));
        let service = match service {
            s if s.starts_with("AmazonSQS") => "sqs",
            s if s.starts_with("DynamoDB") => "dynamodb",
            s if s.eq_ignore_ascii_case("secretsmanager") => "secretsmanager",
            s if s.starts_with("Firehose") => "firehose",
            other => other,
        };
        return format!("{service}:{op}");
    }
    // The query protocol names its action in the form body.
    let form = String::from_utf8_lossy(form_body);
    if let Some(action) = form
        .split('&')
        .find_map(|pair| pair.strip_prefix("Action="))
    {
        return format!("query:{action}");
    }
    // Everything else the stack calls is S3's REST API, where listing a bucket (a GET of
    // the bucket, not of a key) is priced with PUTs.
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let of_bucket = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .count()
        <= 1;
    if method == "GET" && (of_bucket || query.split('&').any(|q| q == "list-type=2")) {
        return "s3:LIST".to_string();
    }
    format!("s3:{method}")
}

/// Whether `stream` is one of a topic archive's streams, as `gridrelay local` names them
/// (`<prefix>-archive-7d`: one per retention class).
fn is_archive_stream(stream: &str) -> bool {
    stream
        .rsplit_once("-archive-")
        .is_some_and(|(_, class)| gridrelay_shared::archive::class_of_segment(class).is_some())
}

/// What a PutRecordBatch to a topic archive's stream (`<prefix>-archive-7d`) is counted as, apart
/// from the delivery journal's.
pub const ARCHIVE_PUT: &str = "firehose:PutRecordBatch(archive)";

/// The stream a Firehose request names.
pub fn firehose_stream(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Named {
        #[serde(rename = "DeliveryStreamName", default)]
        name: String,
    }
    serde_json::from_slice::<Named>(body)
        .map(|n| n.name)
        .unwrap_or_default()
}

/// The items a DynamoDB `BatchGetItem` (keys) or `BatchWriteItem` (put and delete requests)
/// names, over its tables: each is billed a request unit at least (the stack's items are under
/// 1 KB). At least 1 for a body that cannot be read.
pub fn dynamodb_items(body: &[u8]) -> u64 {
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(body) else {
        return 1;
    };
    let items: usize = request["RequestItems"]
        .as_object()
        .map(|tables| {
            tables
                .values()
                .map(|t| t["Keys"].as_array().or(t.as_array()).map_or(0, Vec::len))
                .sum()
        })
        .unwrap_or(0);
    (items as u64).max(1)
}

/// A PutRecordBatch request's records: the 5 KB steps Firehose bills them in, and their bytes.
pub fn firehose_records(body: &[u8]) -> (u64, u64) {
    use base64::Engine;

    #[derive(serde::Deserialize)]
    struct Batch {
        #[serde(rename = "Records", default)]
        records: Vec<Record>,
    }
    #[derive(serde::Deserialize)]
    struct Record {
        #[serde(rename = "Data")]
        data: String,
    }
    let Ok(batch) = serde_json::from_slice::<Batch>(body) else {
        return (0, 0);
    };
    let (mut steps, mut bytes) = (0, 0);
    for record in batch.records {
        let data = base64::engine::general_purpose::STANDARD
            .decode(record.data)
            .unwrap_or_default();
        steps += firehose_steps(data.len());
        bytes += data.len() as u64;
    }
    (steps, bytes)
}

/// Headers that belong to one connection, not to the message (RFC 9110 7.6.1): a proxy does
/// not pass them on. `content-length` is set again for the body as passed on.
fn passed_on(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

async fn forward(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    match relay(&proxy, request).await {
        Ok(response) => response,
        Err(e) => (StatusCode::BAD_GATEWAY, format!("{e:#}")).into_response(),
    }
}

async fn relay(proxy: &Proxy, request: Request) -> anyhow::Result<Response> {
    let started = std::time::Instant::now();
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 64 * 1024 * 1024)
        .await
        .context("request body")?;
    let target = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok());
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut op = operation(target, parts.method.as_str(), path, &body);
    if op == "firehose:PutRecordBatch" && is_archive_stream(&firehose_stream(&body)) {
        op = ARCHIVE_PUT.to_string();
    }
    let mut outgoing = proxy.client.request(
        parts.method.clone(),
        format!("{}{path}", proxy.target_of(&op)),
    );
    for (name, value) in &parts.headers {
        if passed_on(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    let answer = outgoing.body(body.clone()).send().await?;
    let status = answer.status();
    let headers = answer.headers().clone();
    let answer_body = answer.bytes().await?;

    let (billed, stored) = if op.starts_with("sqs:") {
        (sqs_chunks(body.len().max(answer_body.len())), 0)
    } else if op == "firehose:PutRecordBatch" || op == ARCHIVE_PUT {
        firehose_records(&body)
    } else if op == "dynamodb:BatchGetItem" || op == "dynamodb:BatchWriteItem" {
        (dynamodb_items(&body), 0)
    } else {
        (1, 0)
    };
    if let Ok(mut counts) = proxy.counts.lock() {
        let entry = counts.entry(op).or_default();
        entry.calls += 1;
        entry.billed_units += billed;
        entry.stored_bytes += stored;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        entry.micros = entry.micros.saturating_add(micros);
        entry.max_micros = entry.max_micros.max(micros);
    }

    let mut response = Response::builder().status(status);
    for (name, value) in &headers {
        // A HEAD answer has no body: its content-length is the object's, passed on as is.
        let head_length = parts.method == axum::http::Method::HEAD && name == "content-length";
        if passed_on(name) || head_length {
            response = response.header(name, value);
        }
    }
    Ok(response.body(Body::from(answer_body))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_named_by_service_and_operation() {
        assert_eq!(
            operation(Some("AmazonSQS.SendMessageBatch"), "POST", "/", b""),
            "sqs:SendMessageBatch"
        );
        assert_eq!(
            operation(Some("DynamoDB_20120810.GetItem"), "POST", "/", b""),
            "dynamodb:GetItem"
        );
        assert_eq!(
            operation(Some("secretsmanager.GetSecretValue"), "POST", "/", b""),
            "secretsmanager:GetSecretValue"
        );
        assert_eq!(
            operation(
                None,
                "POST",
                "/",
                b"Action=ReceiveMessage&Version=2012-11-05"
            ),
            "query:ReceiveMessage"
        );
        assert_eq!(operation(None, "PUT", "/dl/a/b.json", b"[{}]"), "s3:PUT");
        assert_eq!(operation(None, "GET", "/dl/a/b.json", b""), "s3:GET");
        assert_eq!(operation(None, "HEAD", "/dl/a/b.json", b""), "s3:HEAD");
        // Listing is priced as PUTs are.
        assert_eq!(
            operation(None, "GET", "/dl?list-type=2&prefix=a", b""),
            "s3:LIST"
        );
        assert_eq!(operation(None, "GET", "/dl/", b""), "s3:LIST");
    }

    /// A mixed stack (LocalStack, DynamoDB on moto) is counted whole: each call goes where
    /// the SDK would send it without the proxy.
    #[test]
    fn a_service_with_an_endpoint_of_its_own_is_passed_on_there() {
        let routes = routes_from(|name| {
            (name == "AWS_ENDPOINT_URL_DYNAMODB").then(|| "http://127.0.0.1:5058/".to_string())
        });
        assert_eq!(routes.len(), 1);
        let proxy = Proxy::new("http://127.0.0.1:4566/", routes).unwrap();
        assert_eq!(proxy.target_of("dynamodb:GetItem"), "http://127.0.0.1:5058");
        assert_eq!(
            proxy.target_of("sqs:SendMessageBatch"),
            "http://127.0.0.1:4566"
        );
        assert_eq!(proxy.target_of(ARCHIVE_PUT), "http://127.0.0.1:4566");
        assert_eq!(proxy.target_of("s3:PUT"), "http://127.0.0.1:4566");
    }

    #[test]
    fn an_archive_streams_records_are_told_from_the_journals() {
        assert_eq!(
            firehose_stream(br#"{"DeliveryStreamName":"bench-archive-7d","Records":[]}"#),
            "bench-archive-7d"
        );
        assert_eq!(firehose_stream(b"not json"), "");
        assert!(is_archive_stream("bench-archive-7d"));
        assert!(is_archive_stream("b-archive-365d"));
        assert!(!is_archive_stream("bench-journal"));
        assert!(!is_archive_stream("bench-archive-d"));
        assert!(!is_archive_stream("bench-archive"));
    }

    #[test]
    fn a_dynamodb_batch_call_is_billed_by_its_items() {
        let get = serde_json::json!({"RequestItems": {"state": {
            "Keys": [{"pk": {"S": "a"}}, {"pk": {"S": "b"}}, {"pk": {"S": "c"}}],
            "ConsistentRead": true}}});
        assert_eq!(dynamodb_items(get.to_string().as_bytes()), 3);
        let write = serde_json::json!({"RequestItems": {"state": [
            {"PutRequest": {"Item": {"pk": {"S": "a"}}}},
            {"PutRequest": {"Item": {"pk": {"S": "b"}}}}]}});
        assert_eq!(dynamodb_items(write.to_string().as_bytes()), 2);
        assert_eq!(dynamodb_items(b"not json"), 1);
    }

    #[test]
    fn firehose_records_are_counted_in_5_kb_steps_and_bytes() {
        use base64::Engine;
        let line = b"{\"topic\":\"orders\",\"step\":\"attempt\"}\n".repeat(200);
        let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let body = serde_json::json!({
            "DeliveryStreamName": "j",
            "Records": [{"Data": encode(&line)}, {"Data": encode(b"{}\n")}],
        });
        assert_eq!(
            operation(Some("Firehose_20150804.PutRecordBatch"), "POST", "/", b""),
            "firehose:PutRecordBatch"
        );
        let (steps, stored) = firehose_records(body.to_string().as_bytes());
        // 7,200 bytes take two 5 KB steps; 3 bytes, one.
        assert_eq!(line.len(), 7_200);
        assert_eq!(steps, 3);
        assert_eq!(stored, 7_203);
    }

    #[test]
    fn connection_headers_are_not_passed_on() {
        for h in [
            "connection",
            "keep-alive",
            "transfer-encoding",
            "upgrade",
            "host",
        ] {
            assert!(!passed_on(&HeaderName::from_static(h)), "{h}");
        }
        for h in [
            "authorization",
            "x-amz-target",
            "content-type",
            "x-amz-date",
        ] {
            assert!(passed_on(&HeaderName::from_static(h)), "{h}");
        }
    }
}
