//! The deployed artifacts as Lambda runs them: a `bootstrap` binary (from `cargo lambda build`,
//! infra/deploy/build.sh) started as a process under an emulated Lambda Runtime API, the HTTP interface
//! Lambda's own runtime serves (`/next` hands out an invocation, `/response` and `/error` take
//! its result). Used by the bootstrap tests and by `make bench`'s cold-start figures (init time
//! as Lambda measures it: from the process's start to its first request for work; warm
//! `ingest`'s cost per publish) and memory-size figures (each invocation's billed duration).

use std::collections::{HashMap, VecDeque};
use std::path::{Path as FsPath, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post};
use chrono::Utc;
use gridrelay_local::Resources;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use crate::eventually;

/// What the emulated Runtime API hands out and what it was told.
struct RuntimeState {
    started: Instant,
    /// When the process first asked for work: its init is over.
    first_next: Option<Duration>,
    pending: VecDeque<(String, Value)>,
    /// When each invocation under way was handed out.
    handed_out: HashMap<String, Instant>,
    responses: Vec<(String, Value)>,
    /// Each answered invocation's duration, from its hand-out to its answer (what Lambda
    /// bills), in the order answered.
    durations: Vec<Duration>,
    errors: Vec<String>,
}

type Shared = Arc<Mutex<RuntimeState>>;

async fn next(State(state): State<Shared>) -> (HeaderMap, String) {
    if let Ok(mut s) = state.lock()
        && s.first_next.is_none()
    {
        s.first_next = Some(s.started.elapsed());
    }
    loop {
        let job = state.lock().ok().and_then(|mut s| {
            let job = s.pending.pop_front();
            if let Some((id, _)) = &job {
                s.handed_out.insert(id.clone(), Instant::now());
            }
            job
        });
        if let Some((id, event)) = job {
            let mut headers = HeaderMap::new();
            let deadline = (Utc::now().timestamp_millis() + 120_000).to_string();
            let pairs = [
                ("lambda-runtime-aws-request-id", id.clone()),
                ("lambda-runtime-deadline-ms", deadline),
                (
                    "lambda-runtime-invoked-function-arn",
                    "arn:aws:lambda:us-east-1:123456789012:function:gridrelay".to_string(),
                ),
                (
                    "lambda-runtime-trace-id",
                    "Root=1-5759e988-bd862e3fe1be46a994272793".to_string(),
                ),
            ];
            for (name, value) in pairs {
                if let Ok(v) = HeaderValue::from_str(&value) {
                    headers.insert(name, v);
                }
            }
            return (headers, event.to_string());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn response(State(state): State<Shared>, Path(id): Path<String>, body: String) -> StatusCode {
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    if let Ok(mut s) = state.lock() {
        if let Some(at) = s.handed_out.remove(&id) {
            s.durations.push(at.elapsed());
        }
        s.responses.push((id, value));
    }
    StatusCode::ACCEPTED
}

async fn error(State(state): State<Shared>, id: Option<Path<String>>, body: String) -> StatusCode {
    if let Ok(mut s) = state.lock() {
        if let Some(Path(id)) = id {
            s.handed_out.remove(&id);
        }
        s.errors.push(body);
    }
    StatusCode::ACCEPTED
}

/// An API Gateway HTTP API (v2) event publishing `body` to `topic` with `key`, as `ingest` is
/// invoked behind the stack's API.
pub fn publish_event(topic: &str, key: &str, body: &str) -> Value {
    json!({
        "version": "2.0",
        "routeKey": "POST /topics/{topic}/api/events",
        "rawPath": format!("/topics/{topic}/api/events"),
        "rawQueryString": "api-version=2018-01-01",
        "headers": {"aeg-sas-key": key, "content-type": "application/json", "host": "abc.execute-api.us-east-1.amazonaws.com"},
        "queryStringParameters": {"api-version": "2018-01-01"},
        "pathParameters": {"topic": topic},
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc",
            "domainName": "abc.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "abc",
            "http": {"method": "POST", "path": format!("/topics/{topic}/api/events"), "protocol": "HTTP/1.1",
                     "sourceIp": "127.0.0.1", "userAgent": "test"},
            "requestId": "req-1",
            "routeKey": "POST /topics/{topic}/api/events",
            "stage": "$default",
            "time": "22/Nov/2026:04:00:00 +0000",
            "timeEpoch": 1795320000000i64
        },
        "body": body,
        "isBase64Encoded": false
    })
}

/// A Lambda function URL event (#38) for `POST path` with `key` and `body`, as `ingest` is
/// invoked behind the function URL front door: payload format 2.0 with the `$default` route,
/// no path parameters, the URL's own host, and an anonymous caller.
pub fn function_url_event(path: &str, key: &str, body: &str) -> Value {
    let host = "abcdefghijklmnopqrstuvwxyz012345.lambda-url.us-east-1.on.aws";
    json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "api-version=2018-01-01",
        "headers": {"aeg-sas-key": key, "content-type": "application/json", "host": host,
                    "x-forwarded-proto": "https", "x-amzn-trace-id": "Root=1-5f84c7a9-0e5b1e7e0d0c1c1c1c1c1c1c"},
        "queryStringParameters": {"api-version": "2018-01-01"},
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "abcdefghijklmnopqrstuvwxyz012345",
            "domainName": host,
            "domainPrefix": "abcdefghijklmnopqrstuvwxyz012345",
            "http": {"method": "POST", "path": path, "protocol": "HTTP/1.1",
                     "sourceIp": "203.0.113.7", "userAgent": "azsdk-python-eventgrid"},
            "requestId": "req-url-1",
            "routeKey": "$default",
            "stage": "$default",
            "time": "28/Nov/2026:12:00:00 +0000",
            "timeEpoch": 1_795_867_200_000i64
        },
        "body": body,
        "isBase64Encoded": false
    })
}

/// Where `cargo lambda build` (infra/deploy/build.sh) puts a function's `bootstrap`.
pub fn bootstrap_path(binary: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../target/lambda/{binary}/bootstrap"))
}

/// One function binary under an emulated Runtime API.
pub struct LambdaProcess {
    state: Shared,
    child: Child,
    /// What the process logs on stdout, read as it comes so a full pipe never blocks it.
    stdout: tokio::task::JoinHandle<Vec<u8>>,
    _server: tokio::task::JoinHandle<()>,
}

impl LambdaProcess {
    /// Starts `binary`'s bootstrap with the environment SAM gives it, pointed at `resources`
    /// (and at `AWS_ENDPOINT_URL`, inherited), with `extra` variables on top.
    pub async fn start(binary: &str, resources: &Resources, extra: &[(&str, &str)]) -> Self {
        let path = bootstrap_path(binary);
        assert!(
            path.exists(),
            "{} is missing: build the deployable binaries with infra/deploy/build.sh (make test does)",
            path.display()
        );
        let state: Shared = Arc::new(Mutex::new(RuntimeState {
            started: Instant::now(),
            first_next: None,
            pending: VecDeque::new(),
            handed_out: HashMap::new(),
            responses: Vec::new(),
            durations: Vec::new(),
            errors: Vec::new(),
        }));
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(error))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind runtime API");
        let addr = listener.local_addr().expect("runtime API address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let names = &resources.names;
        let env_or = |name: &str, default: &str| std::env::var(name).unwrap_or(default.into());
        let mut command = Command::new(&path);
        command
            .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", binary)
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{binary}"))
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "test")
            .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
            .env("GRIDRELAY_TOPICS_TABLE", &names.topics_table)
            .env("GRIDRELAY_SUBSCRIPTIONS_TABLE", &names.subscriptions_table)
            .env(
                "GRIDRELAY_DELIVERY_QUEUE_URL",
                &resources.delivery_queue_url,
            )
            .env("GRIDRELAY_CONTROL_QUEUE_URL", &resources.control_queue_url)
            .env("GRIDRELAY_REPLAY_QUEUE_URL", &resources.replay_queue_url)
            .env(
                "GRIDRELAY_DEAD_LETTER_QUEUE_URL",
                &resources.dead_letter_queue_url,
            )
            .env("GRIDRELAY_TIME_SCALE", "0.01")
            .env("GRIDRELAY_QUEUE_KEY_SECRET", &names.queue_key_secret)
            .env(
                "GRIDRELAY_DELIVERY_STATE_TABLE",
                &names.delivery_state_table,
            )
            .env("AWS_REGION", env_or("AWS_REGION", "us-east-1"))
            .env("AWS_ACCESS_KEY_ID", env_or("AWS_ACCESS_KEY_ID", "testing"))
            .env(
                "AWS_SECRET_ACCESS_KEY",
                env_or("AWS_SECRET_ACCESS_KEY", "testing"),
            )
            .envs(extra.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("bootstrap starts");
        let mut out = child.stdout.take().expect("piped stdout");
        let stdout = tokio::spawn(async move {
            let mut logged = Vec::new();
            let _ = out.read_to_end(&mut logged).await;
            logged
        });
        Self {
            state,
            child,
            stdout,
            _server: server,
        }
    }

    /// The process's id (for its memory figures in `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// How long the process took from its start to its first request for work (Lambda's
    /// init duration), waiting for it up to 30 s.
    pub async fn init_duration(&self) -> Duration {
        let state = Arc::clone(&self.state);
        eventually(Duration::from_secs(30), "the function's init", || {
            let state = Arc::clone(&state);
            async move { state.lock().ok()?.first_next }
        })
        .await
    }

    /// Invokes the function with `event` and returns its answer, waiting up to 30 s.
    pub async fn invoke(&mut self, event: Value) -> Value {
        let mut answers = self
            .invoke_within(vec![event], Duration::from_secs(30))
            .await;
        answers.pop().expect("one answer")
    }

    /// Invokes the function with each of `events` in turn, as fast as it takes them, and
    /// returns their answers in order, waiting up to 120 s for them all.
    pub async fn invoke_all(&mut self, events: Vec<Value>) -> Vec<Value> {
        self.invoke_within(events, Duration::from_secs(120)).await
    }

    async fn invoke_within(&mut self, events: Vec<Value>, timeout: Duration) -> Vec<Value> {
        let ids: Vec<String> = (0..events.len())
            .map(|_| uuid::Uuid::new_v4().to_string())
            .collect();
        self.state
            .lock()
            .expect("state")
            .pending
            .extend(ids.iter().cloned().zip(events));
        let deadline = Instant::now() + timeout;
        loop {
            {
                let s = self.state.lock().expect("state");
                assert!(
                    s.errors.is_empty(),
                    "the function reported an error: {:?}",
                    s.errors
                );
                if s.responses.len() >= ids.len() {
                    let answers: HashMap<&str, &Value> =
                        s.responses.iter().map(|(r, v)| (r.as_str(), v)).collect();
                    if let Some(all) = ids
                        .iter()
                        .map(|id| answers.get(id.as_str()).map(|v| (*v).clone()))
                        .collect::<Option<Vec<_>>>()
                    {
                        return all;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {} answers",
                ids.len()
            );
            assert!(
                self.child.try_wait().ok().flatten().is_none(),
                "bootstrap exited"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Each invocation answered since the process started: its duration as Lambda bills it
    /// (from its hand-out to its answer), in the order answered.
    pub fn durations(&self) -> Vec<Duration> {
        self.state.lock().expect("state").durations.clone()
    }

    /// Stops the process and returns what it logged on stdout.
    pub async fn stop(mut self) -> String {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        let logged = self.stdout.await.expect("bootstrap output");
        String::from_utf8_lossy(&logged).to_string()
    }
}

/// A process's resident memory from `/proc/PID/status`: (now, peak), in KiB. Linux only.
pub fn resident_kib(pid: u32) -> Option<(u64, u64)> {
    let status =
        std::fs::read_to_string(FsPath::new("/proc").join(pid.to_string()).join("status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}
