//! Existing Event Grid clients work against gridrelay unchanged.

use std::path::PathBuf;
use std::time::Duration;

use gridrelay_e2e::{Reply, Subscriber, TestSystem, eventually, subscription};
use gridrelay_shared::subscription::SubscriptionRequest;

/// The project's virtualenv Python, where `make test` installs `azure-eventgrid`.
fn venv_python() -> PathBuf {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make test` (or infra/local/moto.sh install), which installs azure-eventgrid",
        python.display()
    );
    python
}

/// F1, G1: Microsoft's `EventGridPublisherClient` with an `AzureKeyCredential` publishes to a
/// gridrelay topic endpoint without changes, and its events are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_event_grid_sdk_publishes_unmodified_f1() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("sdk").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(SubscriptionRequest {
        max_events_per_batch: Some(10),
        ..subscription("sdk", "sdk-sub", &sub.url)
    })
    .await;

    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/publish_with_azure_sdk.py");
    let endpoint = sys.system.publish_endpoint("sdk");
    let key = topic.key2.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(venv_python())
            .arg(script)
            .args([endpoint.as_str(), key.as_str(), "4"])
            .output()
    })
    .await
    .expect("join")
    .expect("python runs");
    assert!(
        out.status.success(),
        "SDK publish failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    eventually(Duration::from_secs(30), "4 SDK events", || async {
        (sub.event_count() >= 4).then_some(())
    })
    .await;
    let events: Vec<_> = sub.received().into_iter().flat_map(|r| r.events).collect();
    let mut subjects: Vec<String> = events
        .iter()
        .map(|e| e["subject"].as_str().unwrap_or_default().to_string())
        .collect();
    subjects.sort();
    assert_eq!(subjects, vec!["door/0", "door/1", "door/2", "door/3"]);
    for e in &events {
        assert_eq!(e["eventType"], "Contoso.Items.ItemReceived");
        assert_eq!(e["dataVersion"], "2.0");
        assert_eq!(e["topic"], "/gridrelay/topics/sdk");
        assert!(e["id"].as_str().is_some_and(|id| !id.is_empty()));
    }
    sys.shutdown().await;
}
