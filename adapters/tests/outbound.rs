//! Outbound safety at connect time (issue #10, item 1 and 2): the sender connects only to
//! addresses the outbound policy allows, checked on the address it is about to connect to,
//! whatever the URL's spelling and whatever the name resolved to before.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use gridrelay_adapters::http_sender::{HttpEventSender, SenderConfig};
use gridrelay_ports::memory::MemoryResolver;
use gridrelay_ports::{EventSender, HandshakeMethod, HandshakeRequest};
use gridrelay_shared::classify::AttemptResult;
use gridrelay_shared::outbound::{AllowedNetworks, OutboundPolicy};
use support::{counting_sink_on, deliver_empty};

fn sender(allowed: &str, resolver: Option<Arc<MemoryResolver>>) -> HttpEventSender {
    let allowed: AllowedNetworks = allowed.parse().unwrap();
    let mut config = SenderConfig::new(Duration::from_secs(5), 8, OutboundPolicy::new(allowed));
    if let Some(resolver) = resolver {
        config.resolver = resolver;
    }
    HttpEventSender::new(config).unwrap()
}

/// The port of a sink's `http://ADDRESS:PORT/hook` URL.
fn port_of(url: &str) -> u16 {
    url.rsplit_once(':')
        .and_then(|(_, p)| p.strip_suffix("/hook"))
        .and_then(|p| p.parse().ok())
        .expect("a sink URL")
}

fn refused_because(result: &AttemptResult, why: &str) -> bool {
    matches!(result, AttemptResult::Refused(text) if text.starts_with("refused:") && text.contains(why))
}

/// Every spelling of loopback (decimal, hex, octal, short forms, a trailing dot, IPv4-mapped
/// IPv6, the name `localhost`, over http and https) is refused without a connection when
/// loopback is not allowed; the same endpoint is delivered to when it is.
#[tokio::test]
async fn every_spelling_of_loopback_is_refused_before_connecting() {
    let (url, connections) = counting_sink_on("127.0.0.1:0", Duration::ZERO, false).await;
    let port = port_of(&url);
    let strict = sender("", None);
    for host in [
        "127.0.0.1",
        "2130706433",
        "0x7f000001",
        "0x7f.1",
        "0177.0.0.1",
        "127.1",
        "127.0.0.1.",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "localhost",
    ] {
        let endpoint = format!("http://{host}:{port}/hook");
        let result = deliver_empty(&strict, &endpoint).await;
        assert!(
            refused_because(&result, "loopback"),
            "{endpoint}: {result:?}"
        );
    }
    // Over https, TLS refuses the odd spellings as server names first; the usual ones reach
    // the policy. Either way nothing connects.
    for host in ["127.0.0.1", "[::ffff:127.0.0.1]", "localhost"] {
        let endpoint = format!("https://{host}:{port}/hook");
        let result = deliver_empty(&strict, &endpoint).await;
        assert!(
            refused_because(&result, "loopback"),
            "{endpoint}: {result:?}"
        );
    }
    for host in ["2130706433", "0x7f.1", "127.0.0.1."] {
        let endpoint = format!("https://{host}:{port}/hook");
        let result = deliver_empty(&strict, &endpoint).await;
        assert!(
            !matches!(result, AttemptResult::Status(_)),
            "{endpoint}: {result:?}"
        );
    }
    assert_eq!(connections.accepted(), 0, "no connection was made");

    let local = sender("127.0.0.0/8,::1/128", None);
    assert_eq!(
        deliver_empty(&local, &format!("http://0x7f.1:{port}/hook")).await,
        AttemptResult::Status(200)
    );
    assert_eq!(connections.accepted(), 1);
}

/// DNS rebinding: a name allowed on its first connection and pointed at loopback afterwards is
/// refused on its next connection (the sink closes each connection, so each request opens
/// one); the loopback server it now names gets nothing.
#[tokio::test]
async fn a_name_rebound_to_loopback_is_refused_on_its_next_connection() {
    let (subscriber, at_subscriber) = counting_sink_on("127.0.0.2:0", Duration::ZERO, true).await;
    let port = port_of(&subscriber);
    // What the rebinding aims at: another server on the same port, on 127.0.0.1.
    let (_, at_target) =
        counting_sink_on(&format!("127.0.0.1:{port}"), Duration::ZERO, false).await;
    let resolver = Arc::new(MemoryResolver::default());
    resolver.set("hooks.rebind.test", &["127.0.0.2"]);
    let sender = sender("127.0.0.2/32", Some(resolver.clone()));
    let endpoint = format!("http://hooks.rebind.test:{port}/hook");

    assert_eq!(
        deliver_empty(&sender, &endpoint).await,
        AttemptResult::Status(200)
    );
    resolver.set("hooks.rebind.test", &["127.0.0.1"]);
    let result = deliver_empty(&sender, &endpoint).await;
    assert!(refused_because(&result, "loopback"), "{result:?}");
    resolver.set("hooks.rebind.test", &["::1"]);
    let result = deliver_empty(&sender, &endpoint).await;
    assert!(refused_because(&result, "loopback"), "{result:?}");
    resolver.set("hooks.rebind.test", &["127.0.0.2"]);
    assert_eq!(
        deliver_empty(&sender, &endpoint).await,
        AttemptResult::Status(200)
    );

    assert_eq!(at_subscriber.accepted(), 2);
    assert_eq!(
        at_target.accepted(),
        0,
        "the rebound address got no connection"
    );
}

/// A name that resolves to refused and allowed addresses is connected to on the allowed ones
/// only: the loopback server first in its answer gets no connection.
#[tokio::test]
async fn only_the_allowed_addresses_of_a_name_are_connected_to() {
    let (subscriber, at_subscriber) = counting_sink_on("127.0.0.2:0", Duration::ZERO, false).await;
    let port = port_of(&subscriber);
    let (_, at_loopback) =
        counting_sink_on(&format!("127.0.0.1:{port}"), Duration::ZERO, false).await;
    let resolver = Arc::new(MemoryResolver::default());
    resolver.set(
        "mixed.test",
        &["127.0.0.1", "169.254.169.254", "10.255.255.1", "127.0.0.2"],
    );
    let sender = sender("127.0.0.2/32", Some(resolver));
    let sent = deliver_empty(&sender, &format!("http://mixed.test:{port}/hook")).await;
    assert_eq!(sent, AttemptResult::Status(200));
    assert_eq!(at_subscriber.accepted(), 1);
    assert_eq!(at_loopback.accepted(), 0, "the refused address got nothing");
}

/// Item 2: plain http:// to a public address is refused (endpoints must be https://) before
/// anything is sent; the same address in the allowed networks may be reached over http.
#[tokio::test]
async fn plain_http_to_a_public_address_is_refused() {
    let resolver = Arc::new(MemoryResolver::default());
    resolver.set("public.test", &["52.95.110.1"]);
    let strict = sender("", Some(resolver.clone()));
    let result = deliver_empty(&strict, "http://public.test/hook").await;
    assert!(refused_because(&result, "must be https://"), "{result:?}");
    let result = deliver_empty(&strict, "http://52.95.110.1/hook").await;
    assert!(refused_because(&result, "must be https://"), "{result:?}");
}

/// Item 3, in part: a refused handshake says why in words a user can act on, without the
/// address or the client's internal error chain.
#[tokio::test]
async fn a_refused_handshake_says_why_without_the_address() {
    let (url, connections) = counting_sink_on("127.0.0.1:0", Duration::ZERO, false).await;
    let resolver = Arc::new(MemoryResolver::default());
    resolver.set("metadata.test", &["169.254.169.254"]);
    let strict = sender("", Some(resolver));
    for (endpoint, why) in [
        (url.as_str(), "loopback"),
        ("https://metadata.test/latest/meta-data", "link-local"),
    ] {
        let e = strict
            .handshake(HandshakeRequest {
                method: HandshakeMethod::Options,
                endpoint: endpoint.to_string(),
                headers: Vec::new(),
                body: None,
            })
            .await
            .unwrap_err();
        assert!(e.starts_with("refused:") && e.contains(why), "{e}");
        assert!(!e.contains("127.0.0.1") && !e.contains("169.254"), "{e}");
        assert!(!e.contains("client error"), "{e}");
    }
    assert_eq!(connections.accepted(), 0);
}

/// Item 3: a failed request says what happened in words (a refused connection, a name that
/// does not resolve), never the client's error chain or the address it tried.
#[tokio::test]
async fn failures_are_told_in_words_without_addresses() {
    // A port nothing listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let resolver = Arc::new(MemoryResolver::default());
    resolver.set("closed.test", &["127.0.0.1"]);
    let local = sender("127.0.0.0/8", Some(resolver));
    let refused = deliver_empty(&local, &format!("http://closed.test:{port}/hook")).await;
    assert_eq!(
        refused,
        AttemptResult::ConnectionFailed("the endpoint refused the connection".into())
    );
    let unresolved = deliver_empty(&local, "https://nowhere.test/hook").await;
    assert_eq!(
        unresolved,
        AttemptResult::Unresolved("the endpoint's host name could not be resolved".into())
    );
    let e = local
        .handshake(HandshakeRequest {
            method: HandshakeMethod::Options,
            endpoint: format!("http://closed.test:{port}/hook"),
            headers: Vec::new(),
            body: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e, "the endpoint refused the connection");
}
