//! End-to-end: the local runner's resources, provisioned again by a later run.

use aws_sdk_sqs::types::QueueAttributeName;
use gridrelay_e2e::sdk_config;
use gridrelay_local::{ResourceNames, provision};

/// Item 9 of the life-cycle issue: `gridrelay local` started again with another
/// `--max-receive-count` reconciles the queues that exist (it used to fail with
/// `QueueNameExists`), keeping their URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_again_with_other_settings_updates_the_queues() {
    let sdk = sdk_config().await;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let names = ResourceNames::with_prefix(&format!("p{}", &id[..12]));
    let first = provision(&sdk, &names, 5).await.expect("first run");
    let again = provision(&sdk, &names, 2)
        .await
        .expect("a second run with another max receive count");
    assert_eq!(first.delivery_queue_url, again.delivery_queue_url);
    assert_eq!(first.dead_letter_queue_url, again.dead_letter_queue_url);

    let sqs = aws_sdk_sqs::Client::new(&sdk);
    for url in [&again.delivery_queue_url, &again.dead_letter_queue_url] {
        let attributes = sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .send()
            .await
            .expect("queue attributes");
        let policy: serde_json::Value = serde_json::from_str(
            attributes
                .attributes()
                .and_then(|a| a.get(&QueueAttributeName::RedrivePolicy))
                .expect("a redrive policy"),
        )
        .expect("JSON policy");
        assert_eq!(
            policy["maxReceiveCount"].to_string().trim_matches('"'),
            "2",
            "{policy}"
        );
    }
}
