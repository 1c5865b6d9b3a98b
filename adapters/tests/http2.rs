//! HTTP/2 where the endpoint offers it (issue #9): the sender offers h2 and HTTP/1.1 in TLS's
//! ALPN and speaks what the endpoint picks: h2 to an endpoint that offers it, HTTP/1.1 to one
//! that does not. Its own test binary: it points the platform verifier at a test CA with
//! `SSL_CERT_FILE`.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod support;

use axum::http::Version;
use gridrelay_shared::classify::AttemptResult;
use support::deliver_empty;
use support::tls::{TestCa, sender_resolving};

#[tokio::test]
async fn http2_is_spoken_where_the_endpoint_offers_it_and_http1_where_it_does_not() {
    let ca = TestCa::new("h2");
    let (h2_port, h2_seen) = ca
        .https_subscriber("h2.tls.test", &[b"h2", b"http/1.1"])
        .await;
    let (h1_port, h1_seen) = ca.https_subscriber("h1.tls.test", &[b"http/1.1"]).await;
    // SAFETY: set before any thread of this test binary reads the environment (one test).
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("SSL_CERT_FILE", &ca.file)
    };
    let sender = sender_resolving(&["h2.tls.test", "h1.tls.test"]);

    for (port, host) in [(h2_port, "h2"), (h1_port, "h1")] {
        let url = format!("https://{host}.tls.test:{port}/hook");
        let answers = futures::future::join_all((0..3).map(|_| deliver_empty(&sender, &url))).await;
        assert!(
            answers.iter().all(|a| *a == AttemptResult::Status(200)),
            "{host}: {answers:?}"
        );
    }
    assert_eq!(*h2_seen.lock().unwrap(), vec![Version::HTTP_2; 3]);
    assert_eq!(*h1_seen.lock().unwrap(), vec![Version::HTTP_11; 3]);
}
