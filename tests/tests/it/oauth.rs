//! End to end, A1 (#39): webhooks protected by OAuth 2.0 client credentials, against the
//! emulator's stores and Secrets Manager, with a real token endpoint and webhook on 127.0.0.1
//! (`gridrelay_e2e::oauth_server`). Tokens expire in real time (their lifetime is the token
//! endpoint's, not a delivery schedule).

use std::time::Duration;

use gridrelay_e2e::oauth_server::{CLIENT_ID, CLIENT_SECRET, OAuthServer, expected_basic};
use gridrelay_e2e::{TestSystem, events, eventually, subscription};
use gridrelay_shared::oauth::OAuthRequest;
use gridrelay_shared::subscription::SubscriptionRequest;

const WAIT: Duration = Duration::from_secs(30);

fn oauth(server: &OAuthServer) -> OAuthRequest {
    OAuthRequest {
        token_url: server.token_url.clone(),
        client_id: CLIENT_ID.to_string(),
        client_secret: CLIENT_SECRET.to_string(),
        scope: Some("events:write".to_string()),
        audience: None,
    }
}

/// Waits until the server's webhook took every id in `ids`.
async fn delivered(server: &OAuthServer, ids: &[String]) {
    eventually(WAIT, "the events delivered", || async {
        let got = server.delivered_ids();
        ids.iter().all(|id| got.contains(id)).then_some(())
    })
    .await;
}

/// A1: the endpoint receives every delivery, and its validation handshake, with a bearer
/// token from the token endpoint, asked for with the client's id and secret in Basic
/// authorization and the scope in the form. A warm function keeps its token: 40 deliveries
/// (one event each) cost at most one token request per function instance, not one each.
/// The secret is in Secrets Manager, never on the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_behind_oauth_gets_bearer_tokens_and_a_warm_function_keeps_one_a1() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("secured").await;
    let server = OAuthServer::start(3600).await;
    let sub = sys
        .subscribe(SubscriptionRequest {
            oauth: Some(oauth(&server)),
            ..subscription("secured", "sub-1", &server.hook_url)
        })
        .await;
    let stored = serde_json::to_string(&sub).expect("the record as JSON");
    assert!(!stored.contains(CLIENT_SECRET), "{stored}");
    assert!(stored.contains("\"clientSecretId\""), "{stored}");
    assert_eq!(
        server.validations(),
        vec![Some("Bearer tok-1".to_string())],
        "the handshake carried a token"
    );

    let published = events("o", 40);
    for chunk in published.as_array().expect("an array").chunks(10) {
        sys.publish(&topic, &serde_json::Value::from(chunk.to_vec()))
            .await;
    }
    let ids: Vec<String> = (0..40).map(|i| format!("o-{i}")).collect();
    delivered(&server, &ids).await;

    let requests = server.hook_requests();
    assert!(requests.len() >= 40, "{} requests", requests.len());
    assert!(
        requests
            .iter()
            .all(|(authorization, status, _)| *status == 200
                && authorization
                    .as_deref()
                    .is_some_and(|a| a.starts_with("Bearer tok-"))),
        "every delivery carried a token the server issued: {:?}",
        requests.iter().map(|r| (&r.0, r.1)).collect::<Vec<_>>()
    );
    let tokens = server.token_requests();
    // The handshake's instance and each delivery instance that ran: at most one each.
    assert!(
        tokens.len() <= 1 + 4,
        "{} token requests for 40 deliveries",
        tokens.len()
    );
    for t in &tokens {
        assert_eq!(t.authorization.as_deref(), Some(expected_basic().as_str()));
        assert_eq!(t.body, "grant_type=client_credentials&scope=events%3Awrite");
    }
    sys.shutdown().await;
}

/// A1: an endpoint that rejects a token (401) gets the request once more with a token fetched
/// again, and the event is delivered by that same attempt: one 401, then a 200 with the new
/// token, and one more token request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_token_is_fetched_again_once_and_the_request_sent_again_a1() {
    let sys = TestSystem::start_with(0.01, |c| c.concurrency = 1).await;
    let topic = sys.topic("rotated").await;
    let server = OAuthServer::start(3600).await;
    sys.subscribe(SubscriptionRequest {
        oauth: Some(oauth(&server)),
        ..subscription("rotated", "sub-1", &server.hook_url)
    })
    .await;
    sys.publish(&topic, &events("before", 1)).await;
    delivered(&server, &["before-0".to_string()]).await;
    let tokens_before = server.token_requests().len();

    server.revoke_all();
    sys.publish(&topic, &events("after", 1)).await;
    delivered(&server, &["after-0".to_string()]).await;

    let for_after: Vec<_> = server
        .hook_requests()
        .into_iter()
        .filter(|(_, _, events)| events.iter().any(|e| e["id"] == "after-0"))
        .collect();
    // Its first two requests (a copy delivered again later, as at least once allows, would
    // come after them).
    let statuses: Vec<u16> = for_after.iter().map(|r| r.1).collect();
    assert!(
        statuses.starts_with(&[401, 200]),
        "rejected once, then delivered: {statuses:?}"
    );
    assert_ne!(for_after[0].0, for_after[1].0, "with another token");
    assert_eq!(
        server.token_requests().len(),
        tokens_before + 1,
        "one token request for the 401"
    );
    sys.shutdown().await;
}

/// A1, R5, L6: a token endpoint that is down fails each attempt as TokenUnavailable, retried
/// on the schedule, and the event is dead-lettered with that outcome once its attempts are
/// spent; nothing reaches the endpoint. Once the token endpoint is back, the next event is
/// delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_endpoint_that_is_down_is_retried_then_dead_lettered_with_its_outcome_a1() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("tokenless").await;
    // Tokens of one second: whichever instance ran the handshake, no instance holds a fresh
    // token when the events come.
    let server = OAuthServer::start(1).await;
    sys.subscribe(SubscriptionRequest {
        oauth: Some(oauth(&server)),
        max_delivery_attempts: Some(3),
        dead_letter_destination: Some(sys.dead_letter_url("tokenless")),
        ..subscription("tokenless", "sub-1", &server.hook_url)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    server.answer_tokens_with(Some(503));
    let before = server.token_requests().len();

    sys.publish(&topic, &events("down", 1)).await;
    let objects = sys.wait_for_dead_letters("tokenless/", WAIT).await;
    let record = &objects[0].1[0];
    assert_eq!(record["deadLetterReason"], "MaxDeliveryAttemptsExceeded");
    assert_eq!(record["deliveryAttempts"], 3);
    assert_eq!(record["lastDeliveryOutcome"], "TokenUnavailable");
    assert!(
        server.hook_requests().is_empty(),
        "nothing was sent without a token"
    );
    // One per attempt (more only if an attempt were made again, as at least once allows).
    let asked = server.token_requests().len() - before;
    assert!(asked >= 3, "a token request for each attempt: {asked}");

    server.answer_tokens_with(None);
    sys.publish(&topic, &events("back", 1)).await;
    delivered(&server, &["back-0".to_string()]).await;
    sys.shutdown().await;
}
