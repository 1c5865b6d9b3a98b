//! O1's test part: a webhook on 127.0.0.1 that records, in the order they arrive, every
//! event request with its key (the events' `subject`) and the status it answered, counts the
//! requests of each key in flight at once, answers the validation handshake, and fails the
//! requests holding a given event id a given number of times (503) before taking them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use crate::{delivered_events, validation_code};

/// One event request, as it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderedRequest {
    /// The key (`subject`) of its events: the first event's.
    pub key: String,
    pub ids: Vec<String>,
    pub status: u16,
    /// When it was answered, since the server started.
    pub answered: Duration,
}

#[derive(Default)]
struct ServerState {
    requests: Vec<OrderedRequest>,
    in_flight: HashMap<String, usize>,
    most_in_flight: HashMap<String, usize>,
    /// Failures left for requests holding an event id.
    fail: HashMap<String, usize>,
}

/// The server; stopped when dropped.
pub struct OrderedSubscriber {
    pub url: String,
    state: Arc<Mutex<ServerState>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for OrderedSubscriber {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// How long each event request is held before its answer, so that requests of one key sent
/// at once would be seen in flight together.
const ANSWER_AFTER: Duration = Duration::from_millis(30);

impl OrderedSubscriber {
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(ServerState::default()));
        let started = tokio::time::Instant::now();
        let app = Router::new()
            .route("/hook", post(hook))
            .with_state((Arc::clone(&state), started));
        let (addr, server) = crate::serve_on_loopback(app, "the ordered subscriber").await;
        Self {
            url: format!("http://{addr}/hook"),
            state,
            server,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut ServerState) -> T) -> T {
        f(&mut self.state.lock().expect("subscriber state"))
    }

    /// Answers 503 to the next `times` requests holding the event `id`.
    pub fn fail(&self, id: &str, times: usize) {
        self.with(|s| s.fail.insert(id.to_string(), times));
    }

    /// Every event request so far, in the order they were answered.
    pub fn requests(&self) -> Vec<OrderedRequest> {
        self.with(|s| s.requests.clone())
    }

    /// The requests of `key`, in order.
    pub fn requests_of(&self, key: &str) -> Vec<OrderedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.key == key)
            .collect()
    }

    /// The most requests of one key that were in flight at once, for every key.
    pub fn most_in_flight(&self) -> HashMap<String, usize> {
        self.with(|s| s.most_in_flight.clone())
    }

    /// The ids taken (answered 200), in order, each once (a copy delivered again, as at least
    /// once allows, is left out).
    pub fn delivered(&self, key: &str) -> Vec<String> {
        let mut ids: Vec<String> = Vec::new();
        for r in self
            .requests_of(key)
            .into_iter()
            .filter(|r| r.status == 200)
        {
            for id in r.ids {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        ids
    }
}

type Shared = (Arc<Mutex<ServerState>>, tokio::time::Instant);

async fn hook(
    State((state, started)): State<Shared>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let events = delivered_events(&body).unwrap_or_default();
    if let Some(code) = validation_code(&headers, &events) {
        return axum::Json(json!({"validationResponse": code})).into_response();
    }
    let key = events
        .first()
        .and_then(|e| e["subject"].as_str())
        .unwrap_or_default()
        .to_string();
    let ids: Vec<String> = events
        .iter()
        .filter_map(|e| e["id"].as_str().map(str::to_string))
        .collect();
    {
        let mut s = state.lock().expect("subscriber state");
        let now = {
            let n = s.in_flight.entry(key.clone()).or_default();
            *n += 1;
            *n
        };
        let most = s.most_in_flight.entry(key.clone()).or_default();
        *most = (*most).max(now);
    }
    tokio::time::sleep(ANSWER_AFTER).await;
    let mut s = state.lock().expect("subscriber state");
    if let Some(n) = s.in_flight.get_mut(&key) {
        *n -= 1;
    }
    let failing = ids
        .iter()
        .find(|id| s.fail.get(*id).is_some_and(|left| *left > 0))
        .cloned();
    let status = match failing {
        Some(id) => {
            if let Some(left) = s.fail.get_mut(&id) {
                *left -= 1;
            }
            503
        }
        None => 200,
    };
    s.requests.push(OrderedRequest {
        key,
        ids,
        status,
        answered: started.elapsed(),
    });
    StatusCode::from_u16(status)
        .unwrap_or(StatusCode::OK)
        .into_response()
}
