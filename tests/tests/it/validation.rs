//! End-to-end: the endpoint validation handshake (issue: Event Grid's subscriber surface,
//! part 4), run by the service when a subscription is registered.

use std::time::Duration;

use gridrelay_e2e::{Handshake, Reply, Subscriber, TestSystem, events, subscription};
use gridrelay_ports::StoreError;
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::validation::ProvisioningState;

/// Event Grid schema: the endpoint gets a `Microsoft.EventGrid.SubscriptionValidationEvent`
/// with `aeg-event-type: SubscriptionValidation`, a validation code and URL; answering with the
/// code validates at once, and events flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_handshake_validates_the_endpoint() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("handshake").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    let registered = sys
        .subscribe(subscription("handshake", "sync", &sub.url))
        .await;
    assert_eq!(registered.provisioning.state, ProvisioningState::Succeeded);
    let asked = sub.validations();
    assert_eq!(asked.len(), 1);
    assert_eq!(
        asked[0].header("aeg-event-type"),
        Some("SubscriptionValidation")
    );
    let event = &asked[0].events[0];
    assert_eq!(
        event["eventType"],
        "Microsoft.EventGrid.SubscriptionValidationEvent"
    );
    assert_eq!(event["topic"], topic.resource_id());
    assert_eq!(
        event["data"]["validationCode"].as_str().map(str::len),
        Some(64)
    );
    assert!(
        event["data"]["validationUrl"]
            .as_str()
            .is_some_and(|u| u.starts_with(&sys.system.base_url()))
    );
    assert!(
        sub.received().is_empty(),
        "the handshake is not an event delivery"
    );

    sys.publish(&topic, &events("v", 1)).await;
    sub.wait_for_requests(1, Duration::from_secs(30)).await;
    sys.shutdown().await;
}

/// A 200 without the code leaves the subscription `AwaitingManualAction`, delivering nothing;
/// a GET of the validation URL (with the right code) validates it, and later events flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_validation_through_the_validation_url() {
    let sys = TestSystem::start(0.05).await;
    let topic = sys.topic("manual").await;
    let sub = Subscriber::start_with_handshake(vec![], Reply::Status(200), Handshake::Manual).await;
    sys.register(subscription("manual", "by-hand", &sub.url))
        .await;
    let waiting = sys
        .wait_for_provisioning("manual", "by-hand", ProvisioningState::AwaitingManualAction)
        .await;
    assert!(
        waiting
            .provisioning
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("validationUrl")),
        "{waiting:?}"
    );
    assert!(
        !serde_json::to_string(&waiting).expect("json").contains(
            sub.validations()[0].events[0]["data"]["validationCode"]
                .as_str()
                .unwrap_or("?")
        ),
        "only a hash of the code is stored"
    );

    sys.publish(&topic, &events("before", 1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        sub.received().is_empty(),
        "nothing is delivered before validation"
    );

    let url = sub.validations()[0].events[0]["data"]["validationUrl"]
        .as_str()
        .expect("validation URL")
        .to_string();
    let http = reqwest::Client::new();
    let wrong = http
        .get(url.replace("code=", "code=0"))
        .send()
        .await
        .expect("answer");
    assert_eq!(wrong.status().as_u16(), 400);
    let right = http.get(&url).send().await.expect("answer");
    assert_eq!(right.status().as_u16(), 200);
    sys.wait_for_provisioning("manual", "by-hand", ProvisioningState::Succeeded)
        .await;

    sys.publish(&topic, &events("after", 1)).await;
    let got = sub.wait_for_requests(1, Duration::from_secs(30)).await;
    assert_eq!(
        got[0].ids(),
        ["after-0"],
        "events published before validation are not delivered"
    );
    sys.shutdown().await;
}

/// An endpoint that refuses the validation event ends `Failed` with the reason; one that never
/// calls its validation URL ends `Failed` when the (scaled) 10-minute window passes; neither
/// gets events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_or_unfinished_validation_fails() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("refused").await;
    let refusing =
        Subscriber::start_with_handshake(vec![], Reply::Status(200), Handshake::Refuse(403)).await;
    let silent =
        Subscriber::start_with_handshake(vec![], Reply::Status(200), Handshake::Manual).await;
    sys.register(subscription("refused", "refusing", &refusing.url))
        .await;
    sys.register(subscription("refused", "silent", &silent.url))
        .await;
    let failed = sys
        .wait_for_provisioning("refused", "refusing", ProvisioningState::Failed)
        .await;
    assert!(
        failed
            .provisioning
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("403")),
        "{failed:?}"
    );
    sys.wait_for_provisioning("refused", "silent", ProvisioningState::AwaitingManualAction)
        .await;
    // 10 minutes at scale 0.01: 6 s.
    let expired = sys
        .wait_for_provisioning("refused", "silent", ProvisioningState::Failed)
        .await;
    assert!(
        expired
            .provisioning
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("not called")),
        "{expired:?}"
    );
    sys.publish(&topic, &events("x", 2)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(refusing.received().is_empty() && silent.received().is_empty());
    sys.shutdown().await;
}

/// CloudEvents: the abuse-protection `OPTIONS` request with `WebHook-Request-Origin`; a
/// matching `WebHook-Allowed-Origin` validates, anything else fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_events_abuse_protection() {
    let sys = TestSystem::start(0.01).await;
    sys.topic_with_schema("ce-guarded", InputSchema::CloudEventSchemaV1_0, None)
        .await;
    let allowing = Subscriber::start(vec![], Reply::Status(200)).await;
    let refusing =
        Subscriber::start_with_handshake(vec![], Reply::Status(200), Handshake::Refuse(405)).await;
    let silent =
        Subscriber::start_with_handshake(vec![], Reply::Status(200), Handshake::Manual).await;
    sys.subscribe(subscription("ce-guarded", "allowing", &allowing.url))
        .await;
    let asked = allowing.validations();
    assert_eq!(
        asked[0].header("webhook-request-origin"),
        Some("eventgrid.azure.net")
    );
    sys.register(subscription("ce-guarded", "refusing", &refusing.url))
        .await;
    sys.register(subscription("ce-guarded", "silent", &silent.url))
        .await;
    let refused = sys
        .wait_for_provisioning("ce-guarded", "refusing", ProvisioningState::Failed)
        .await;
    assert!(
        refused
            .provisioning
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("405"))
    );
    let silent = sys
        .wait_for_provisioning("ce-guarded", "silent", ProvisioningState::Failed)
        .await;
    assert!(
        silent
            .provisioning
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("WebHook-Allowed-Origin"))
    );
    sys.shutdown().await;
}

/// Items 5 and 6 of the life-cycle issue, on DynamoDB: a subscription record is written only
/// over the version it was read at, and never over another subscription of the same name; the
/// stored version moves on with every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_writes_are_conditional_on_identity_and_version() {
    let sys = TestSystem::start(0.01).await;
    sys.topic("versions").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    let store = &sys.system.store;
    let first = sys
        .subscribe(subscription("versions", "audit", &sub.url))
        .await;
    assert_eq!(first.id.len(), 32);

    let mut fresh = first.clone();
    fresh.retry_policy.max_delivery_attempts = 3;
    store.replace_subscription(&mut fresh).await.expect("write");
    assert_eq!(fresh.version, first.version + 1);

    let mut stale = first.clone();
    stale.retry_policy.max_delivery_attempts = 7;
    let err = store.replace_subscription(&mut stale).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    let stored = store
        .get_subscription("versions", "audit")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.retry_policy.max_delivery_attempts, 3);
    assert_eq!(stored.version, fresh.version);

    // Deleted and created again: the old record's writer finds another subscription there.
    store
        .delete_subscription("versions", "audit")
        .await
        .unwrap();
    let again = sys
        .subscribe(subscription("versions", "audit", &sub.url))
        .await;
    assert_ne!(again.id, first.id);
    let err = store.replace_subscription(&mut fresh).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    store
        .delete_subscription("versions", "audit")
        .await
        .unwrap();
    let err = store.replace_subscription(&mut fresh).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{err}");
    sys.shutdown().await;
}

/// #11 item 12, on DynamoDB: an expired subscription is deleted only if it is still the
/// record that was read (same id, same version), so a later expiration set meanwhile, or a
/// subscription created again under the name, is not deleted; a record written before ids
/// existed can be deleted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_deletes_spare_a_changed_subscription() {
    let sys = TestSystem::start(0.01).await;
    sys.topic("expiring").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    let store = &sys.system.store;
    let read = sys
        .subscribe(subscription("expiring", "audit", &sub.url))
        .await;
    let mut changed = read.clone();
    changed.labels = vec!["changed".into()];
    store
        .replace_subscription(&mut changed)
        .await
        .expect("write");
    assert!(
        !store.delete_subscription_if_unchanged(&read).await.unwrap(),
        "changed since it was read"
    );
    assert!(
        store
            .get_subscription("expiring", "audit")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .delete_subscription_if_unchanged(&changed)
            .await
            .unwrap()
    );
    assert!(
        store
            .get_subscription("expiring", "audit")
            .await
            .unwrap()
            .is_none()
    );

    // A record of before ids: no id attribute, version 0.
    let legacy = gridrelay_shared::subscription::Subscription {
        id: String::new(),
        version: 0,
        ..read.clone()
    };
    store
        .create_subscription(&legacy)
        .await
        .expect("legacy record");
    assert!(
        !store.delete_subscription_if_unchanged(&read).await.unwrap(),
        "another subscription (an id) than the one stored (none)"
    );
    assert!(
        store
            .delete_subscription_if_unchanged(&legacy)
            .await
            .unwrap()
    );
    assert!(
        store
            .get_subscription("expiring", "audit")
            .await
            .unwrap()
            .is_none()
    );
    sys.shutdown().await;
}
