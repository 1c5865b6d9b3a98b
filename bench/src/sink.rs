//! A subscriber that only counts: answers Event Grid's validation handshake, then 200 (or a
//! chosen status) to every delivery after an optional delay, counting requests and events,
//! and, for events that carry the time they were published at (`data.sentAtMicros`,
//! microseconds since the epoch), the time from then to their arrival.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::Value;

/// What the sink has seen.
#[derive(Debug, Default)]
pub struct Counts {
    pub requests: AtomicUsize,
    pub events: AtomicUsize,
    /// Deliveries received and not yet answered.
    pub in_flight: AtomicUsize,
    /// Milliseconds from `data.sentAtMicros` to arrival, per event that has it.
    pub latencies_ms: std::sync::Mutex<Vec<f64>>,
}

/// Microseconds since the epoch, now: what publishers put in `data.sentAtMicros`.
pub fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

struct Sink {
    delay: Duration,
    status: StatusCode,
    counts: Arc<Counts>,
}

/// Serves the sink on `addr` (port 0: any free one) in this runtime; returns its hook URL.
pub async fn serve(addr: SocketAddr, delay: Duration) -> anyhow::Result<(String, Arc<Counts>)> {
    serve_answering(addr, delay, StatusCode::OK).await
}

/// As [`serve`], answering every delivery (not the handshake) with `status`: a sick endpoint.
pub async fn serve_answering(
    addr: SocketAddr,
    delay: Duration,
    status: StatusCode,
) -> anyhow::Result<(String, Arc<Counts>)> {
    let counts = Arc::new(Counts::default());
    let sink = Arc::new(Sink {
        delay,
        status,
        counts: Arc::clone(&counts),
    });
    let app = Router::new()
        .route("/hook", axum::routing::post(receive).options(allow_origin))
        .with_state(sink);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}/hook"), counts))
}

async fn receive(
    State(sink): State<Arc<Sink>>,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let validation = headers
        .get("aeg-event-type")
        .is_some_and(|v| v == "SubscriptionValidation");
    if validation {
        let code = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v[0]["data"]["validationCode"].as_str().map(str::to_string))
            .unwrap_or_default();
        return (
            StatusCode::OK,
            serde_json::json!({ "validationResponse": code }).to_string(),
        );
    }
    let _in_flight = InFlight::count(&sink.counts);
    if !sink.delay.is_zero() {
        tokio::time::sleep(sink.delay).await;
    }
    let arrived = now_micros();
    // An array of events (Event Grid schema), or one event.
    let events = match serde_json::from_slice::<Vec<TimedEvent>>(&body) {
        Ok(list) => {
            let sent: Vec<f64> = list
                .iter()
                .filter_map(|e| e.data.as_ref()?.sent_at_micros)
                .map(|sent| (arrived - sent) as f64 / 1000.0)
                .collect();
            if !sent.is_empty()
                && let Ok(mut l) = sink.counts.latencies_ms.lock()
            {
                l.extend(sent);
            }
            list.len()
        }
        Err(_) => 1,
    };
    sink.counts.requests.fetch_add(1, Ordering::Relaxed);
    sink.counts.events.fetch_add(events, Ordering::Relaxed);
    (sink.status, String::new())
}

/// What the sink reads of a delivered event: when it was published, if it says.
#[derive(serde::Deserialize)]
struct TimedEvent {
    data: Option<TimedData>,
}

#[derive(serde::Deserialize)]
struct TimedData {
    #[serde(rename = "sentAtMicros")]
    sent_at_micros: Option<i64>,
}

/// One request in flight, counted until it is answered or given up.
struct InFlight(Arc<Counts>);

impl InFlight {
    fn count(counts: &Arc<Counts>) -> Self {
        counts.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(counts))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn allow_origin() -> impl IntoResponse {
    (StatusCode::OK, [("webhook-allowed-origin", "*")])
}
