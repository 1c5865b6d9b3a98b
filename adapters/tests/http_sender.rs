//! The HTTP sender against real HTTP servers on 127.0.0.1.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::routing::post;
use futures::StreamExt;
use gridrelay_adapters::http_sender::{HttpEventSender, MAX_ANSWER_BODY, SenderConfig};
use gridrelay_ports::{DeliveryRequest, EventSender};
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::outbound::{AllowedNetworks, OutboundPolicy};

/// What the endpoint offers: 512 chunks of 1 MiB.
const CHUNK: usize = 1 << 20;
const CHUNKS: usize = 512;

/// Issue #8 item 7, S1: an endpoint that answers 200 with an endless-looking body cannot make
/// the sender read it: the status decides, at most a small bounded amount is read, and the
/// connection is dropped. Before the bound, the whole 512 MiB was pulled through.
#[tokio::test]
async fn a_huge_answer_body_is_not_read_the_status_decides() {
    let streamed = Arc::new(AtomicUsize::new(0));
    let counter = streamed.clone();
    let app = Router::new().route(
        "/hook",
        post(move || {
            let counter = counter.clone();
            async move {
                let chunks = futures::stream::iter(0..CHUNKS).map(move |_| {
                    counter.fetch_add(CHUNK, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; CHUNK]))
                });
                Body::from_stream(chunks)
            }
        }),
    );
    let (addr, server) = serve(app).await;
    let sender = sender_with_timeout(Duration::from_secs(30));
    let sent = sender.send(empty_batch(addr)).await;
    assert_eq!(sent.result, AttemptResult::Status(200));
    // Give the server a moment to notice the dropped connection, then see how much it sent:
    // what the client read plus what the sockets' buffers held, far below the whole body.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent_bytes = streamed.load(Ordering::SeqCst);
    assert!(
        sent_bytes < 64 * CHUNK,
        "the server streamed {sent_bytes} bytes; the client should stop after {MAX_ANSWER_BODY}"
    );
    server.abort();
}

/// R1, S5: the sender reads `Retry-After` on 429 and 503 (seconds or an HTTP date), and only
/// there; the decision to honour it is the retry rules'.
#[tokio::test]
async fn retry_after_is_read_from_429_and_503_answers() {
    use axum::http::{StatusCode, header::RETRY_AFTER};
    let in_a_minute = (chrono::Utc::now() + chrono::Duration::seconds(61)).to_rfc2822();
    let app = Router::new()
        .route(
            "/busy",
            post(|| async { (StatusCode::SERVICE_UNAVAILABLE, [(RETRY_AFTER, "120")]) }),
        )
        .route(
            "/slow-down",
            post(move || {
                let at = in_a_minute.clone();
                async move { (StatusCode::TOO_MANY_REQUESTS, [(RETRY_AFTER, at)]) }
            }),
        )
        .route(
            "/error",
            post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, [(RETRY_AFTER, "120")]) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let sender = HttpEventSender::new(SenderConfig::new(
        Duration::from_secs(30),
        32,
        OutboundPolicy::new(AllowedNetworks::loopback()),
    ))
    .unwrap();
    let send = |path: &str| {
        sender.send(DeliveryRequest {
            answer_bytes: 0,
            endpoint: format!("http://{addr}/{path}"),
            content_type: "application/json",
            body: "[]".into(),
            headers: Vec::new(),
        })
    };

    let busy = send("busy").await;
    assert_eq!(busy.result, AttemptResult::Status(503));
    assert_eq!(busy.retry_after, Some(Duration::from_secs(120)));
    let slow = send("slow-down").await;
    assert_eq!(slow.result, AttemptResult::Status(429));
    let wait = slow.retry_after.expect("an HTTP date is read");
    assert!(
        (Duration::from_secs(55)..=Duration::from_secs(61)).contains(&wait),
        "{wait:?}"
    );
    let error = send("error").await;
    assert_eq!(error.result, AttemptResult::Status(500));
    assert_eq!(error.retry_after, None, "only 429 and 503 ask to wait");
    server.abort();
}

/// R4 with the worker's total: a timed-out request stays open while its late answer is
/// awaited, and is closed as soon as the late answer is dropped, so a worker's open
/// connections never outlive the permits that count them.
#[tokio::test]
async fn a_timed_out_request_is_closed_when_its_late_answer_is_no_longer_awaited() {
    use tokio::io::AsyncReadExt;
    // An endpoint that reads the request and never answers; it reports when the client closes
    // the connection (a read of 0 bytes).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let closed_tx = closed_tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 {
                        let _ = closed_tx.send(());
                        return;
                    }
                }
            });
        }
    });
    let sender = HttpEventSender::new(SenderConfig::new(
        Duration::from_millis(200),
        32,
        OutboundPolicy::new(AllowedNetworks::loopback()),
    ))
    .unwrap()
    .with_late_answers(Duration::from_secs(60));
    let send = || {
        sender.send(DeliveryRequest {
            answer_bytes: 0,
            endpoint: format!("http://{addr}/hook"),
            content_type: "application/json",
            body: "[]".into(),
            headers: Vec::new(),
        })
    };

    let kept = send().await;
    assert_eq!(kept.result, AttemptResult::TimedOut);
    let kept_late = kept
        .late
        .expect("a timed-out request waits for its late answer");
    // Awaited (held), it stays open well past the attempt timeout.
    assert!(
        tokio::time::timeout(Duration::from_millis(600), closed.recv())
            .await
            .is_err(),
        "the request was closed while its late answer was still awaited"
    );

    let dropped = send().await;
    assert_eq!(dropped.result, AttemptResult::TimedOut);
    drop(dropped.late);
    tokio::time::timeout(Duration::from_secs(5), closed.recv())
        .await
        .expect("dropping the late answer closes its request")
        .expect("the server is running");
    drop(kept_late);
    tokio::time::timeout(Duration::from_secs(5), closed.recv())
        .await
        .expect("and so does the first one's")
        .expect("the server is running");
    server.abort();
}

/// A delivery of an empty array to `addr`'s hook.
fn empty_batch(addr: std::net::SocketAddr) -> DeliveryRequest {
    DeliveryRequest {
        answer_bytes: 0,
        endpoint: format!("http://{addr}/hook"),
        content_type: "application/json",
        body: "[]".into(),
        headers: Vec::new(),
    }
}

/// Serves `app` on a new port; returns its address and the server task.
async fn serve(app: Router) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, server)
}

/// An endpoint that keeps the headers of every request it gets.
fn header_echo(seen: Arc<std::sync::Mutex<Vec<axum::http::HeaderMap>>>) -> Router {
    Router::new().route(
        "/hook",
        post(move |headers: axum::http::HeaderMap| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(headers);
                "ok"
            }
        }),
    )
}

/// Credentials in an endpoint URL (`https://user:pass@host/…`, which Event Grid users put
/// there) go as Basic authorization, percent-decoded, never in the URL or the Host header; a
/// subscription's own `Authorization` header wins. The subscription's own `User-Agent` replaces
/// gridrelay's instead of going beside it.
#[tokio::test]
async fn url_credentials_go_as_basic_authorization_and_own_headers_win() {
    use base64::Engine as _;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (addr, server) = serve(header_echo(seen.clone())).await;
    let sender = HttpEventSender::new(SenderConfig::new(
        Duration::from_secs(30),
        32,
        OutboundPolicy::new(AllowedNetworks::loopback()),
    ))
    .unwrap();
    let send = |endpoint: String, headers: Vec<(String, String)>| {
        sender.send(DeliveryRequest {
            answer_bytes: 0,
            endpoint,
            content_type: "application/json",
            body: "[]".into(),
            headers,
        })
    };

    let with_credentials = format!("http://us%40er:p%3Ass@{addr}/hook");
    let sent = send(with_credentials.clone(), Vec::new()).await;
    assert_eq!(sent.result, AttemptResult::Status(200));
    let own = vec![
        ("Authorization".to_string(), "Bearer own".to_string()),
        ("user-agent".to_string(), "their-agent/1".to_string()),
    ];
    let sent = send(with_credentials, own).await;
    assert_eq!(sent.result, AttemptResult::Status(200));

    let seen = seen.lock().unwrap();
    let basic = base64::engine::general_purpose::STANDARD.encode("us@er:p:ss");
    assert_eq!(seen[0]["authorization"], format!("Basic {basic}").as_str());
    assert_eq!(
        seen[0]["host"],
        addr.to_string().as_str(),
        "no credentials in Host"
    );
    assert!(
        seen[0]["user-agent"]
            .to_str()
            .unwrap()
            .starts_with("gridrelay/")
    );
    let authorization: Vec<_> = seen[1].get_all("authorization").iter().collect();
    assert_eq!(authorization, ["Bearer own"]);
    let agents: Vec<_> = seen[1].get_all("user-agent").iter().collect();
    assert_eq!(agents, ["their-agent/1"]);
    server.abort();
}

/// S1, S2: once the status is in, it decides, even if the body then stalls past the attempt
/// timeout: a 200 whose body never ends is delivered, not retried (and delivered twice).
#[tokio::test]
async fn a_status_that_came_in_time_decides_though_its_body_stalls() {
    let sender = HttpEventSender::new(SenderConfig::new(
        Duration::from_millis(300),
        32,
        OutboundPolicy::new(AllowedNetworks::loopback()),
    ))
    .unwrap();
    the_status_decides_though_the_body_stalls(sender).await;
}

/// Issue #34 item 3, S1, S2, R4: the same with the late-answer window on, as in production.
/// The window kept the whole exchange, body read included, under the attempt timeout, so a
/// 200 whose body stalled was turned into `TimedOut`: a duplicate delivery, a D1 failure and a
/// halved concurrency limit.
#[tokio::test]
async fn a_status_that_came_in_time_decides_though_its_body_stalls_with_late_answers_on() {
    let sender = HttpEventSender::new(SenderConfig::new(
        Duration::from_millis(300),
        32,
        OutboundPolicy::new(AllowedNetworks::loopback()),
    ))
    .unwrap()
    .with_late_answers(Duration::from_secs(60));
    the_status_decides_though_the_body_stalls(sender).await;
}

/// `sender` posts to an endpoint that answers 200 at once and then stalls its body for 30 s.
async fn the_status_decides_though_the_body_stalls(sender: HttpEventSender) {
    let app = Router::new().route(
        "/hook",
        post(|| async {
            let chunks = futures::stream::iter(0..2).then(|i| async move {
                if i > 0 {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                Ok::<_, std::io::Error>(Bytes::from_static(b"partial"))
            });
            Body::from_stream(chunks)
        }),
    );
    let (addr, server) = serve(app).await;
    let started = std::time::Instant::now();
    let sent = sender.send(empty_batch(addr)).await;
    assert_eq!(sent.result, AttemptResult::Status(200));
    assert!(sent.late.is_none(), "an answer in time awaits no late one");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the body is read until the attempt's deadline only"
    );
    server.abort();
}

/// #35: the journal keeps the first bytes of an answer's body, as many as the subscription
/// asks for, across the chunks they came in; none when it asks for none.
#[tokio::test]
async fn the_first_bytes_of_an_answer_are_kept_as_many_as_asked() {
    let app = Router::new().route(
        "/hook",
        post(|| async {
            let chunks =
                futures::stream::iter(["invalid sig", "nature: expected v1,", " got none"])
                    .map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
            (
                axum::http::StatusCode::UNAUTHORIZED,
                Body::from_stream(chunks),
            )
        }),
    );
    let (addr, server) = serve(app).await;
    let sender = sender_with_timeout(Duration::from_secs(30));
    for (keep, expected) in [
        (17, "invalid signature"),
        (1024, "invalid signature: expected v1, got none"),
        (0, ""),
    ] {
        let sent = sender
            .send(DeliveryRequest {
                answer_bytes: keep,
                ..empty_batch(addr)
            })
            .await;
        assert_eq!(sent.result, AttemptResult::Status(401));
        assert_eq!(String::from_utf8_lossy(&sent.answer), expected, "{keep}");
    }
    server.abort();
}

/// A sender to loopback endpoints with attempts of `timeout`.
fn sender_with_timeout(timeout: Duration) -> HttpEventSender {
    HttpEventSender::new(SenderConfig::new(
        timeout,
        32,
        OutboundPolicy::new(AllowedNetworks::loopback()),
    ))
    .unwrap()
}
