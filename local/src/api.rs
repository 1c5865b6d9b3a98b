//! The local stand-in for the front door in front of `ingest` (API Gateway's HTTP API, or a
//! function URL, #38) and for API Gateway in front of the subscribers' portal.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use gridrelay_ingest::Ingest;
use http::StatusCode;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{error, info};

use crate::{FrontDoor, RunnerStats, billed_ms, function_url};

/// API Gateway's payload limit: larger bodies never reach the function.
const MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// The function behind the API, how it is reached, and where its invocations are counted.
#[derive(Clone)]
struct Publish {
    ingest: Arc<Ingest>,
    front_door: FrontDoor,
    /// How long `ingest` may take ([`crate::INGEST_TIMEOUT`] unless a test says otherwise).
    timeout: std::time::Duration,
    stats: Arc<Mutex<RunnerStats>>,
}

impl Publish {
    /// Counts an `ingest` invocation that started at `started`, and its billed time.
    fn counted(&self, started: std::time::Instant) {
        if let Ok(mut s) = self.stats.lock() {
            s.ingest_invocations += 1;
            s.billed.ingest_ms += billed_ms(started);
        }
    }
}

/// Serves the publish API, and the subscribers' portal (#36) on its own path beside it, as
/// the stacks' front door does.
pub(crate) async fn serve(
    listener: TcpListener,
    (ingest, front_door, timeout): (Arc<Ingest>, FrontDoor, std::time::Duration),
    portal: Arc<gridrelay_portal::Portal>,
    stats: Arc<Mutex<RunnerStats>>,
    mut stopped: watch::Receiver<bool>,
) {
    let app = Router::new()
        .fallback(forward)
        .with_state(Publish {
            ingest,
            front_door,
            timeout,
            stats,
        })
        .merge(gridrelay_portal::router(portal));
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "publish API listening");
    }
    let shutdown = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        error!(error = %e, "publish API stopped");
    }
}

/// Turns the HTTP request into what the front door hands a Lambda, and the answer back.
async fn forward(State(publish): State<Publish>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    // A function URL takes at most its event's 6 MB: a larger body never reaches the function.
    let limit = match publish.front_door {
        FrontDoor::HttpApi => MAX_BODY_BYTES,
        FrontDoor::FunctionUrl => function_url::MAX_EVENT_BYTES,
    };
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) if publish.front_door == FrontDoor::FunctionUrl => {
            let (parts, body) = function_url::payload_too_large().into_parts();
            return Response::from_parts(parts, AxumBody::from(body));
        }
        Err(_) => return (StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response(),
    };
    if publish.front_door == FrontDoor::FunctionUrl {
        return through_function_url(&publish, &parts, &bytes).await;
    }
    if !routed_to_ingest(&parts.method, parts.uri.path()) {
        // API Gateway's own answer for a request no route takes: ingest never sees it.
        return (
            StatusCode::NOT_FOUND,
            [("content-type", "application/json")],
            r#"{"message":"Not Found"}"#,
        )
            .into_response();
    }
    let request =
        lambda_http::Request::from_parts(parts, lambda_http::Body::Binary(bytes.to_vec()));
    let started = std::time::Instant::now();
    let handled = tokio::time::timeout(publish.timeout, publish.ingest.handle(request)).await;
    publish.counted(started);
    let Ok(response) = handled else {
        error!(
            timeout_s = publish.timeout.as_secs(),
            "ingest timed out: the publish is answered 500, as API Gateway does"
        );
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "application/json")],
            r#"{"message":"Internal Server Error"}"#,
        )
            .into_response();
    };
    let (parts, body) = response.into_parts();
    let body = match body {
        lambda_http::Body::Empty => AxumBody::empty(),
        lambda_http::Body::Text(t) => AxumBody::from(t),
        lambda_http::Body::Binary(b) => AxumBody::from(b),
        _ => AxumBody::empty(),
    };
    Response::from_parts(parts, body)
}

/// Whether the HTTP API front door's routes take a request to `ingest` (the stacks' two:
/// `POST /topics/{topic}/api/events` and `GET /subscriptions/validate`).
fn routed_to_ingest(method: &http::Method, path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        ["topics", topic, "api", "events"] => !topic.is_empty() && method == http::Method::POST,
        ["subscriptions", "validate"] => method == http::Method::GET,
        _ => false,
    }
}

/// #38: the request as a function URL hands it to `ingest` (its event, through the Lambda
/// runtime's adapter) and `ingest`'s answer as the URL returns it; the URL's own answers for
/// an event past Lambda's payload limit (413) and a function that fails or times out (502).
async fn through_function_url(
    publish: &Publish,
    parts: &http::request::Parts,
    body: &[u8],
) -> Response {
    let event = function_url::event_for(parts, body, chrono::Utc::now());
    let response = if event.len() > function_url::MAX_EVENT_BYTES {
        function_url::payload_too_large()
    } else {
        let started = std::time::Instant::now();
        let ingest = &publish.ingest;
        let invoked = tokio::time::timeout(
            publish.timeout,
            function_url::invoke(&event, |request| ingest.handle(request)),
        )
        .await;
        publish.counted(started);
        match invoked {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                error!(error = %e, "ingest's answer through the function URL: 502");
                function_url::function_error()
            }
            Err(_) => {
                error!(
                    timeout_s = publish.timeout.as_secs(),
                    "ingest timed out: the function URL answers 502"
                );
                function_url::function_error()
            }
        }
    };
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, AxumBody::from(body))
}
