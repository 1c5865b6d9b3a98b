//! A1's test parts: an OAuth 2.0 token endpoint and the webhook it protects, one real HTTP
//! server on 127.0.0.1. `POST /token` issues `tok-1`, `tok-2`, ... for the client credentials
//! grant to the one client it knows (HTTP Basic, as RFC 6749 §2.3.1 encodes it), or answers
//! as told (down: 503); `POST /hook` takes events only with a bearer token it issued and has
//! not revoked, and answers the validation handshake (with a token too).

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use serde_json::{Value, json};

use crate::{delivered_events, validation_code};

/// The client the token endpoint knows.
pub const CLIENT_ID: &str = "gridrelay-test";
/// Its secret: with characters form-encoding changes, so that encoding is tested too.
pub const CLIENT_SECRET: &str = "s3cr3t:with space+plus";

#[derive(Default)]
struct ServerState {
    issued: Vec<String>,
    revoked: Vec<String>,
    token_requests: Vec<TokenRequest>,
    /// What `/token` answers instead of a token (503: down).
    token_status: Option<u16>,
    expires_in: u64,
    /// Event requests: the `Authorization` each came with, and the status answered.
    hook_requests: Vec<(Option<String>, u16, Vec<Value>)>,
    validations: Vec<Option<String>>,
}

/// One request to the token endpoint.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    pub authorization: Option<String>,
    pub body: String,
}

/// The server; stopped when dropped.
pub struct OAuthServer {
    pub token_url: String,
    pub hook_url: String,
    state: Arc<Mutex<ServerState>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for OAuthServer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl OAuthServer {
    /// Issues tokens that expire after `expires_in` seconds.
    pub async fn start(expires_in: u64) -> Self {
        let state = Arc::new(Mutex::new(ServerState {
            expires_in,
            ..ServerState::default()
        }));
        let app = Router::new()
            .route("/token", post(token))
            .route("/hook", post(hook))
            .with_state(Arc::clone(&state));
        let (addr, server) = crate::serve_on_loopback(app, "the OAuth server").await;
        Self {
            token_url: format!("http://{addr}/token"),
            hook_url: format!("http://{addr}/hook"),
            state,
            server,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut ServerState) -> T) -> T {
        f(&mut self.state.lock().expect("OAuth server state"))
    }

    /// Makes `/token` answer `status` (503: down), or tokens again (`None`).
    pub fn answer_tokens_with(&self, status: Option<u16>) {
        self.with(|s| s.token_status = status);
    }

    /// Every token issued so far stops being accepted by `/hook` (it answers 401).
    pub fn revoke_all(&self) {
        self.with(|s| s.revoked = s.issued.clone());
    }

    pub fn token_requests(&self) -> Vec<TokenRequest> {
        self.with(|s| s.token_requests.clone())
    }

    /// Event requests to `/hook`: the `Authorization` each came with, the status answered and
    /// its events.
    pub fn hook_requests(&self) -> Vec<(Option<String>, u16, Vec<Value>)> {
        self.with(|s| s.hook_requests.clone())
    }

    /// The ids of the events `/hook` took (answered 200).
    pub fn delivered_ids(&self) -> Vec<String> {
        self.hook_requests()
            .into_iter()
            .filter(|(_, status, _)| *status == 200)
            .flat_map(|(_, _, events)| events)
            .map(|e| e["id"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The `Authorization` of each validation handshake.
    pub fn validations(&self) -> Vec<Option<String>> {
        self.with(|s| s.validations.clone())
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// `Basic base64(form(id):form(secret))` for the known client.
pub fn expected_basic() -> String {
    let form = |s: &str| url_form(s);
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            form(CLIENT_ID),
            form(CLIENT_SECRET)
        ))
    )
}

/// `application/x-www-form-urlencoded`, as RFC 6749 Appendix B has it.
fn url_form(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

async fn token(
    State(state): State<Arc<Mutex<ServerState>>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut s = state.lock().expect("OAuth server state");
    let authorization = header(&headers, "authorization");
    s.token_requests.push(TokenRequest {
        authorization: authorization.clone(),
        body: body.clone(),
    });
    if let Some(status) = s.token_status {
        return (
            StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            "token service down",
        )
            .into_response();
    }
    if authorization.as_deref() != Some(expected_basic().as_str())
        || !body
            .split('&')
            .any(|p| p == "grant_type=client_credentials")
    {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": "invalid_client"})),
        )
            .into_response();
    }
    let token = format!("tok-{}", s.issued.len() + 1);
    s.issued.push(token.clone());
    axum::Json(json!({
        "access_token": token,
        "token_type": "Bearer",
        "expires_in": s.expires_in,
    }))
    .into_response()
}

async fn hook(
    State(state): State<Arc<Mutex<ServerState>>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut s = state.lock().expect("OAuth server state");
    let authorization = header(&headers, "authorization");
    let valid = authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "))
        .is_some_and(|t| s.issued.iter().any(|i| i == t) && !s.revoked.iter().any(|r| r == t));
    let events = delivered_events(&body).unwrap_or_default();
    if let Some(code) = validation_code(&headers, &events) {
        s.validations.push(authorization);
        if !valid {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        return axum::Json(json!({"validationResponse": code})).into_response();
    }
    let status = if valid { 200 } else { 401 };
    s.hook_requests.push((authorization, status, events));
    StatusCode::from_u16(status)
        .unwrap_or(StatusCode::UNAUTHORIZED)
        .into_response()
}
