//! Registering an event subscription with the service: the one path the command line and the
//! tests take, so both store secrets and records the same way.
//!
//! The subscription is checked against its topic, its secret delivery header values (H1) go
//! to the secret store, the record (which holds only the secrets' ids) is written in state
//! `Creating`, and the service is asked, through the delivery queue, to run the endpoint
//! validation handshake (see [`gridrelay_shared::validation`]); events flow once it succeeds.
//! A dead-letter location must exist and take a write (L5): a subscription whose undeliverable
//! events would have nowhere to go is refused, not stored.

use chrono::{DateTime, Utc};

use crate::endpoints::EndpointGate;
use crate::secret_headers::{secret_ids, store_client_secret, store_secrets, store_signing_secret};
use crate::{
    DestinationError, MessageQueue, ObjectStore, OutgoingMessage, ResourceSender, SecretError,
    SecretStore, StoreError, SubscriptionStore,
};
use crate::{Update, update_subscription};
use gridrelay_shared::destination::{AllowedDestinations, ResourceDestination};
use gridrelay_shared::limits::{LimitError, MAX_SUBSCRIPTIONS_PER_TOPIC};
use gridrelay_shared::message::{DeliveryQueueMessage, ValidationTask, queue_delay};
use gridrelay_shared::oauth::{DeliveryAuth, OAuthRequest, validate_client_secret};
use gridrelay_shared::signing::{Signing, SigningSecret};
use gridrelay_shared::subscription::{
    DeadLetterDestination, Subscription, SubscriptionRequest, SubscriptionUpdate, Updated,
};
use gridrelay_shared::validation::ValidationStep;

/// Why a subscription was not registered.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error(transparent)]
    Invalid(#[from] LimitError),
    #[error("topic {0} does not exist")]
    NoSuchTopic(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("could not store the secret delivery header values: {0}")]
    Secrets(#[from] SecretError),
    #[error(
        "the subscription is stored but its validation could not be started ({0}); delete it and create it again"
    )]
    Handshake(String),
    #[error(
        "the update is stored but the new endpoint's validation could not be started ({0}); run the update again"
    )]
    UpdateHandshake(String),
    #[error(
        "the subscription is stored but its deletion at its expiration time could not be scheduled ({0}); it stops receiving then, and is deleted once its expiration is set again with update"
    )]
    Expiry(String),
    #[error("event subscription {name} on topic {topic} does not exist")]
    NoSuchSubscription { topic: String, name: String },
    #[error(
        "event subscription {name} on topic {topic} has expired and is being deleted; create it again"
    )]
    Expired { topic: String, name: String },
}

/// Where registration writes.
pub struct Registry<'a> {
    pub store: &'a dyn SubscriptionStore,
    pub secrets: &'a dyn SecretStore,
    /// Name prefix of secrets (see `gridrelay_adapters::config::SECRET_PREFIX_ENV`).
    pub secret_prefix: &'a str,
    /// The control queue, where the handshake and expiry steps are asked for (#34 item 12).
    pub control_queue: &'a dyn MessageQueue,
    /// Which endpoints may be registered ([`crate::endpoints`]).
    pub endpoints: &'a dyn EndpointGate,
    /// Where dead-letter locations are checked (S3 on AWS).
    pub dead_letters: &'a dyn ObjectStore,
    /// Where AWS resource destinations are checked (S4).
    pub resources: &'a dyn ResourceSender,
    /// Which AWS resources this installation may deliver to.
    pub allowed_destinations: &'a AllowedDestinations,
}

/// The object a dead-letter location's check writes and deletes, under its prefix.
pub const WRITE_CHECK_OBJECT: &str = ".gridrelay-write-check";

/// L5: refuses a dead-letter location whose bucket does not exist or does not take a write (a
/// small object under the prefix, deleted again), naming the location and why.
pub async fn check_dead_letter_location(
    objects: &dyn ObjectStore,
    destination: &DeadLetterDestination,
) -> Result<(), LimitError> {
    let location = destination.url();
    let refuse = |why: String| LimitError::new("deadLetterDestination", &location, why);
    let key = if destination.prefix.is_empty() {
        WRITE_CHECK_OBJECT.to_string()
    } else {
        format!("{}/{WRITE_CHECK_OBJECT}", destination.prefix)
    };
    match objects
        .put_json(&destination.bucket, &key, "[]".to_string())
        .await
    {
        Ok(()) => {}
        Err(e) if e.bucket_missing => {
            return Err(refuse(format!(
                "an existing S3 bucket (bucket {} does not exist)",
                destination.bucket
            )));
        }
        Err(e) => {
            return Err(refuse(format!(
                "a bucket that takes writes (a test write failed: {e})"
            )));
        }
    }
    // Left behind only if deleting is not allowed: an empty array, which no reader of
    // dead-letter objects takes for a record (and redrive reads only subscription folders).
    if let Err(e) = objects.delete(&destination.bucket, &key).await {
        tracing::warn!(bucket = %destination.bucket, %key, error = %e, "could not delete the dead-letter location's check object");
    }
    Ok(())
}

impl Registry<'_> {
    /// Validates `request` against its topic and stores the subscription.
    pub async fn register(
        &self,
        request: &SubscriptionRequest,
        now: DateTime<Utc>,
    ) -> Result<Subscription, RegistrationError> {
        let topic = self
            .store
            .get_topic(&request.topic)
            .await?
            .ok_or_else(|| RegistrationError::NoSuchTopic(request.topic.clone()))?;
        let mut sub = request.validate(topic.input_schema, now)?;
        self.admit(&sub).await?;
        self.admit_token_url(&sub).await?;
        let existing = self.store.list_subscriptions(&sub.topic).await?;
        if existing.iter().any(|s| s.name == sub.name) {
            return Err(StoreError::AlreadyExists(format!(
                "event subscription {} on topic {}",
                sub.name, sub.topic
            ))
            .into());
        }
        // Event Grid's limit. Two creates racing may pass it by one each; fan-out still
        // delivers to every subscription there is.
        if existing.len() >= MAX_SUBSCRIPTIONS_PER_TOPIC {
            return Err(LimitError::new(
                "event subscriptions",
                format!("{} on topic {}", existing.len(), sub.topic),
                format!("at most {MAX_SUBSCRIPTIONS_PER_TOPIC} per topic"),
            )
            .into());
        }
        if let Some(destination) = &sub.dead_letter_destination {
            check_dead_letter_location(self.dead_letters, destination).await?;
        }
        store_secrets(
            &mut sub,
            &request.delivery_attributes,
            self.secrets,
            self.secret_prefix,
        )
        .await?;
        if let Some(secret) = &request.signing_secret {
            match store_signing_secret(&sub, secret, self.secrets, self.secret_prefix, now).await {
                Ok(id) => sub.signing = Some(Signing::new(id)),
                Err(e) => {
                    self.delete_secrets(secret_ids(&sub)).await;
                    return Err(e.into());
                }
            }
        }
        if let Some(oauth) = &request.oauth
            && let Err(e) = self.store_client_secret(&mut sub, oauth, now).await
        {
            self.delete_secrets(secret_ids(&sub)).await;
            return Err(e.into());
        }
        if let Err(e) = self.store.create_subscription(&sub).await {
            // Nothing names them: the record was not written.
            self.delete_secrets(secret_ids(&sub)).await;
            return Err(e.into());
        }
        if !sub.endpoint_type.is_resource() {
            self.ask(
                ValidationTask::new(&sub, ValidationStep::Handshake),
                now,
                None,
            )
            .await
            .map_err(RegistrationError::Handshake)?;
        }
        self.schedule_expiry(&sub, now).await?;
        Ok(sub)
    }

    /// A1: the token endpoint must be one deliveries may reach, by the same outbound rules as
    /// endpoints.
    async fn admit_token_url(&self, sub: &Subscription) -> Result<(), LimitError> {
        let Some(auth) = &sub.delivery_auth else {
            return Ok(());
        };
        self.endpoints
            .admit(&auth.client_credentials().token_url)
            .await
            .map_err(|e| LimitError {
                field: "--token-url".to_string(),
                ..e
            })
    }

    /// A1: stores the client secret of `oauth` and names it on `sub`'s credentials.
    async fn store_client_secret(
        &self,
        sub: &mut Subscription,
        oauth: &OAuthRequest,
        now: DateTime<Utc>,
    ) -> Result<String, SecretError> {
        let secret = validate_client_secret(&oauth.client_secret)
            .map_err(|e| SecretError::Invalid(e.to_string()))?;
        let id = store_client_secret(sub, &secret, self.secrets, self.secret_prefix, now).await?;
        if let Some(DeliveryAuth::OAuth2(credentials)) = &mut sub.delivery_auth {
            credentials.client_secret_id = id.clone();
        }
        Ok(id)
    }

    /// Whether events may go to the subscription's endpoint: a webhook by the outbound rules
    /// ([`crate::endpoints`]); an AWS resource if the installation allows it and it exists.
    async fn admit(&self, sub: &Subscription) -> Result<(), LimitError> {
        match sub.resource() {
            Some(destination) => self.admit_resource(&destination).await,
            None => self.endpoints.admit(&sub.endpoint).await,
        }
    }

    /// S4: no handshake for an AWS resource; instead it must be one the installation may
    /// deliver to, and exist now.
    async fn admit_resource(&self, destination: &ResourceDestination) -> Result<(), LimitError> {
        self.allowed_destinations.check(destination)?;
        self.resources.check(destination).await.map_err(|e| {
            let what = match &e {
                DestinationError::NotFound(_) => "an existing",
                DestinationError::Unavailable(_) => "a readable",
            };
            LimitError::new(
                "endpoint",
                format!("{:?}", destination.arn),
                format!(
                    "{what} {} this installation may deliver to: {e}",
                    destination.endpoint_type.as_str()
                ),
            )
        })
    }

    /// Changes the settings `update` gives (each checked as at create) and keeps the rest.
    /// A new endpoint is validated with the handshake before it receives anything: for a
    /// validated subscription it waits beside the old one, which receives events meanwhile,
    /// and takes its place once it agrees (see [`gridrelay_shared::subscription::EndpointChange`]).
    /// A changed dead-letter location is checked as at create (L5); delivery headers given
    /// replace the stored ones, and secrets no longer named are deleted. The record as
    /// written, and the handshake asked for.
    pub async fn update(
        &self,
        topic: &str,
        name: &str,
        update: &SubscriptionUpdate,
        now: DateTime<Utc>,
    ) -> Result<Updated, RegistrationError> {
        let topic_record = self
            .store
            .get_topic(topic)
            .await?
            .ok_or_else(|| RegistrationError::NoSuchTopic(topic.to_string()))?;
        let current = self
            .store
            .get_subscription(topic, name)
            .await?
            .ok_or_else(|| RegistrationError::NoSuchSubscription {
                topic: topic.to_string(),
                name: name.to_string(),
            })?;
        if current.is_expired(now) {
            return Err(RegistrationError::Expired {
                topic: topic.to_string(),
                name: name.to_string(),
            });
        }
        let Updated {
            subscription: mut next,
            handshake,
        } = update.apply(&current, topic_record.input_schema, now)?;
        if let Some((endpoint, _)) = handshake.and_then(|h| next.handshake(h)) {
            self.endpoints.admit(endpoint).await?;
        }
        if matches!(update.oauth, Some(Some(_))) {
            self.admit_token_url(&next).await?;
        }
        if next.endpoint != current.endpoint
            && let Some(destination) = next.resource()
        {
            self.admit_resource(&destination).await?;
        }
        if next.dead_letter_destination != current.dead_letter_destination
            && let Some(destination) = &next.dead_letter_destination
        {
            check_dead_letter_location(self.dead_letters, destination).await?;
        }
        // New secrets go under names of this write's own: until the record is written, the
        // subscription goes on with the ones it names.
        let mut stored = match &update.delivery_attributes {
            Some(requests) => {
                store_secrets(&mut next, requests, self.secrets, self.secret_prefix).await?
            }
            None => Vec::new(),
        };
        if let Some(Some(oauth)) = &update.oauth {
            match self.store_client_secret(&mut next, oauth, now).await {
                Ok(id) => stored.push(id),
                Err(e) => {
                    self.delete_secrets(stored.iter().map(String::as_str)).await;
                    return Err(e.into());
                }
            }
        }
        // Over the record as read: an update racing another is refused, not merged.
        if let Err(e) = self.store.replace_subscription(&mut next).await {
            self.delete_secrets(stored.iter().map(String::as_str)).await;
            return Err(match e {
                StoreError::Conflict(what) => StoreError::Conflict(format!(
                    "{what} changed while being updated; run the update again"
                )),
                other => other,
            }
            .into());
        }
        // The record is written: each step it needs is asked for, whatever became of the
        // others (an update given the same endpoint asks again for a handshake that could not
        // be asked), then the secrets it no longer names are deleted (one left behind is only
        // a leftover).
        let asked = match handshake {
            Some(which) => self
                .ask(
                    ValidationTask::of(&next, ValidationStep::Handshake, which),
                    now,
                    None,
                )
                .await
                .map_err(RegistrationError::UpdateHandshake),
            None => Ok(()),
        };
        let scheduled = if next.expiration_time_utc != current.expiration_time_utc {
            self.schedule_expiry(&next, now).await
        } else {
            Ok(())
        };
        let kept = secret_ids(&next);
        self.delete_secrets(
            secret_ids(&current)
                .into_iter()
                .filter(|id| !kept.contains(id)),
        )
        .await;
        asked?;
        scheduled?;
        Ok(Updated {
            subscription: next,
            handshake,
        })
    }

    /// Asks the service for a step of a subscription's life, through the control queue, at
    /// `at` (now if `None`; a later time is asked again by the step until it comes).
    async fn ask(
        &self,
        task: ValidationTask,
        now: DateTime<Utc>,
        at: Option<DateTime<Utc>>,
    ) -> Result<(), String> {
        let body = DeliveryQueueMessage::Validation(task)
            .to_body()
            .map_err(|e| e.to_string())?;
        let wait = at
            .and_then(|at| (at - now).to_std().ok())
            .unwrap_or_default();
        let sent = self
            .control_queue
            .send_all(&[OutgoingMessage {
                body,
                delay: queue_delay(wait),
                group: None,
            }])
            .await;
        match sent.into_iter().next() {
            Some(Err(e)) => Err(e.to_string()),
            _ => Ok(()),
        }
    }

    /// Deletes secrets nothing names any more; one that cannot be deleted is logged and left.
    async fn delete_secrets<'s>(&self, ids: impl IntoIterator<Item = &'s str>) {
        for id in ids {
            if let Err(e) = self.secrets.delete(id).await {
                tracing::warn!(secret = id, error = %e, "could not delete a secret no record names");
            }
        }
    }

    /// `--expiration-date`: asks the service to delete the subscription at its expiration.
    async fn schedule_expiry(
        &self,
        sub: &Subscription,
        now: DateTime<Utc>,
    ) -> Result<(), RegistrationError> {
        let Some(at) = sub.expiration_time_utc else {
            return Ok(());
        };
        self.ask(ValidationTask::expiry(sub, at), now, Some(at))
            .await
            .map_err(RegistrationError::Expiry)
    }

    /// Deletes a subscription and its secrets; whether it existed.
    pub async fn delete(&self, topic: &str, name: &str) -> Result<bool, RegistrationError> {
        let existing = self.store.get_subscription(topic, name).await?;
        for id in existing.iter().flat_map(secret_ids) {
            self.secrets.delete(id).await?;
        }
        Ok(self.store.delete_subscription(topic, name).await?)
    }

    /// [`rotate_signing_secret`] in this installation's store and secrets.
    pub async fn rotate_signing_secret(
        &self,
        topic: &str,
        name: &str,
        secret: &SigningSecret,
        grace: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<Subscription, RegistrationError> {
        let keys = SigningKeys {
            store: self.store,
            secrets: self.secrets,
            secret_prefix: self.secret_prefix,
        };
        rotate_signing_secret(&keys, (topic, name), secret, grace, now).await
    }
}

/// Where subscriptions' signing secrets are kept: the subscription store, and the secret
/// store with the installation's prefix. All a rotation needs (the console rotates with it).
pub struct SigningKeys<'a> {
    pub store: &'a dyn SubscriptionStore,
    pub secrets: &'a dyn SecretStore,
    pub secret_prefix: &'a str,
}

/// Signs the deliveries of subscription `(topic, name)` with `secret` from now on (signing
/// starts if it did not), its current secret signing beside it for `grace`. A secret no longer
/// in use is deleted from the secret store. The record as written.
pub async fn rotate_signing_secret(
    keys: &SigningKeys<'_>,
    (topic, name): (&str, &str),
    secret: &SigningSecret,
    grace: std::time::Duration,
    now: DateTime<Utc>,
) -> Result<Subscription, RegistrationError> {
    let missing = || StoreError::NotFound(format!("event subscription {name} on topic {topic}"));
    let sub = keys
        .store
        .get_subscription(topic, name)
        .await?
        .ok_or_else(missing)?;
    let id = store_signing_secret(&sub, secret, keys.secrets, keys.secret_prefix, now).await?;
    let before = secret_ids(&sub)
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    let update = update_subscription(keys.store, sub, |s| {
        s.signing = Some(match &s.signing {
            Some(signing) => signing.rotated(id.clone(), now, grace),
            None => Signing::new(id.clone()),
        });
        Ok::<(), ()>(())
    })
    .await?;
    let Update::Written(sub) = update else {
        keys.secrets.delete(&id).await?;
        return Err(missing().into());
    };
    // Written: the new secret signs from now on, so the rotation has happened and its caller
    // must be told (and shown the secret). A retired secret that cannot be deleted now is
    // left, and said in the log.
    let kept = secret_ids(&sub);
    for dropped in before.iter().filter(|id| !kept.contains(&id.as_str())) {
        if let Err(e) = keys.secrets.delete(dropped).await {
            tracing::warn!(error = %e, secret = %dropped,
                "a retired signing secret could not be deleted; it is left");
        }
    }
    Ok(*sub)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{
        ManualClock, MemoryObjectStore, MemoryQueue, MemorySecretStore, MemorySubscriptionStore,
    };
    use gridrelay_shared::subscription::Topic;
    use std::sync::Arc;

    /// In-memory stores and queue, and a registry over them that admits every endpoint.
    struct Fixture {
        store: MemorySubscriptionStore,
        secrets: MemorySecretStore,
        queue: MemoryQueue,
        objects: MemoryObjectStore,
        destinations: crate::memory::MemoryDestinations,
        allowed: AllowedDestinations,
    }

    impl Fixture {
        fn new(now: DateTime<Utc>) -> Self {
            Self {
                store: MemorySubscriptionStore::default(),
                secrets: MemorySecretStore::default(),
                queue: MemoryQueue::new(Arc::new(ManualClock::new(now))),
                objects: MemoryObjectStore::default(),
                destinations: crate::memory::MemoryDestinations::default(),
                allowed: AllowedDestinations::any(),
            }
        }

        fn registry(&self) -> Registry<'_> {
            Registry {
                store: &self.store,
                secrets: &self.secrets,
                secret_prefix: "gridrelay",
                control_queue: &self.queue,
                endpoints: &crate::endpoints::AnyEndpoint,
                dead_letters: &self.objects,
                resources: &self.destinations,
                allowed_destinations: &self.allowed,
            }
        }
    }

    /// L5 (#11 item 5): a dead-letter bucket that does not exist, or that does not take a
    /// write, is refused naming the location and why, and nothing is stored; one that takes
    /// writes is accepted, and its check leaves no object behind.
    #[test]
    fn a_dead_letter_bucket_must_exist_and_take_writes_l5() {
        let now = chrono::Utc::now();
        let f = Fixture::new(now);
        let registry = f.registry();
        let request = |name: &str, location: &str| SubscriptionRequest {
            topic: "orders".into(),
            name: name.into(),
            endpoint: "https://example.com/hook".into(),
            dead_letter_destination: Some(location.into()),
            ..SubscriptionRequest::default()
        };
        futures::executor::block_on(async {
            f.store
                .create_topic(&Topic::with_new_keys("orders", now))
                .await
                .unwrap();
            f.objects.delete_bucket("gone");
            let refused = registry
                .register(&request("missing", "s3://gone/dl"), now)
                .await
                .unwrap_err();
            let RegistrationError::Invalid(e) = &refused else {
                panic!("expected a refusal, got {refused}")
            };
            assert_eq!(e.field, "deadLetterDestination");
            assert_eq!(e.value, "s3://gone/dl");
            assert!(e.allowed.contains("bucket gone does not exist"), "{e}");

            f.objects.outage.set(true);
            let refused = registry
                .register(&request("unwritable", "s3://dead/dl"), now)
                .await
                .unwrap_err()
                .to_string();
            assert!(
                refused.contains("s3://dead/dl") && refused.contains("failed"),
                "{refused}"
            );
            f.objects.outage.set(false);
            assert!(
                f.store
                    .list_subscriptions("orders")
                    .await
                    .unwrap()
                    .is_empty()
            );

            registry
                .register(&request("kept", "s3://dead/dl"), now)
                .await
                .unwrap();
            assert!(
                f.objects.objects().is_empty(),
                "the check's object was deleted"
            );
        });
    }

    /// #12 (S4): an AWS resource is registered without a handshake, if the installation may
    /// deliver to it and it exists; otherwise it is refused naming the ARN and why, and
    /// nothing is stored. An update to another ARN is checked the same way.
    #[test]
    fn a_resource_must_be_allowed_and_exist_s4() {
        let now = chrono::Utc::now();
        let mut f = Fixture::new(now);
        f.allowed =
            AllowedDestinations::parse("arn:aws:sqs:us-east-1:123456789012:orders-*").unwrap();
        f.destinations
            .create("arn:aws:sqs:us-east-1:123456789012:orders-a");
        let registry = f.registry();
        let request = |name: &str, queue: &str| SubscriptionRequest {
            topic: "orders".into(),
            name: name.into(),
            endpoint: format!("arn:aws:sqs:us-east-1:123456789012:{queue}"),
            ..SubscriptionRequest::default()
        };
        futures::executor::block_on(async {
            f.store
                .create_topic(&Topic::with_new_keys("orders", now))
                .await
                .unwrap();
            let refusal = |e: RegistrationError| match e {
                RegistrationError::Invalid(e) => e,
                other => panic!("expected a refusal, got {other}"),
            };
            let e = refusal(
                registry
                    .register(&request("elsewhere", "billing"), now)
                    .await
                    .unwrap_err(),
            );
            assert_eq!(e.field, "endpoint");
            assert!(e.allowed.contains("orders-*"), "{e}");
            let e = refusal(
                registry
                    .register(&request("missing", "orders-b"), now)
                    .await
                    .unwrap_err(),
            );
            assert!(e.allowed.contains("an existing SqsQueue"), "{e}");
            assert!(e.allowed.contains("does not exist"), "{e}");
            assert!(
                f.store
                    .list_subscriptions("orders")
                    .await
                    .unwrap()
                    .is_empty()
            );

            let sub = registry
                .register(&request("kept", "orders-a"), now)
                .await
                .unwrap();
            assert!(sub.delivers());
            assert!(f.queue.sent().is_empty(), "no handshake asked for");

            let moved = SubscriptionUpdate {
                endpoint: Some("arn:aws:sqs:us-east-1:123456789012:orders-b".into()),
                ..SubscriptionUpdate::default()
            };
            let e = refusal(
                registry
                    .update("orders", "kept", &moved, now)
                    .await
                    .unwrap_err(),
            );
            assert!(e.allowed.contains("does not exist"), "{e}");
            f.destinations
                .create("arn:aws:sqs:us-east-1:123456789012:orders-b");
            let updated = registry
                .update("orders", "kept", &moved, now)
                .await
                .unwrap();
            assert_eq!(updated.handshake, None);
            assert!(updated.subscription.endpoint.ends_with("orders-b"));
        });
    }

    /// Item 8 of the life-cycle issue: a topic has at most 500 event subscriptions, as in
    /// Event Grid; the 501st is refused naming the limit, and nothing is stored for it.
    #[test]
    fn a_topic_takes_at_most_500_subscriptions() {
        let now = chrono::Utc::now();
        let f = Fixture::new(now);
        let (store, registry) = (&f.store, f.registry());
        futures::executor::block_on(async {
            store
                .create_topic(&Topic::with_new_keys("orders", now))
                .await
                .unwrap();
            let request = |i: usize| SubscriptionRequest {
                topic: "orders".into(),
                name: format!("sub-{i:03}"),
                endpoint: format!("https://example.com/{i}"),
                ..SubscriptionRequest::default()
            };
            for i in 0..MAX_SUBSCRIPTIONS_PER_TOPIC {
                registry.register(&request(i), now).await.unwrap();
            }
            let refused = registry.register(&request(500), now).await.unwrap_err();
            let message = refused.to_string();
            assert!(message.contains("at most 500 per topic"), "{message}");
            assert!(message.contains("500 on topic orders"), "{message}");
            assert_eq!(store.list_subscriptions("orders").await.unwrap().len(), 500);
        });
    }

    /// Issue #10, item 4: a signing secret is kept while a record names it, so a warm
    /// function signing with a record it read before a rotation still finds it; the secret a
    /// second rotation pushes off the record is deleted, and deleting the subscription deletes
    /// the rest.
    #[test]
    fn rotation_keeps_the_secrets_a_record_names_and_deletes_the_one_it_drops() {
        let t0 = chrono::Utc::now();
        let f = Fixture::new(t0);
        let (store, secrets, registry) = (&f.store, &f.secrets, f.registry());
        let later = |ms| t0 + chrono::Duration::milliseconds(ms);
        futures::executor::block_on(async {
            store
                .create_topic(&Topic::with_new_keys("orders", t0))
                .await
                .unwrap();
            let sub = registry
                .register(
                    &SubscriptionRequest {
                        topic: "orders".into(),
                        name: "signed".into(),
                        endpoint: "https://example.com/in".into(),
                        signing_secret: Some(SigningSecret::generate()),
                        ..SubscriptionRequest::default()
                    },
                    t0,
                )
                .await
                .unwrap();
            let first = sub.signing.unwrap().secret_id;
            let next = SigningSecret::generate();
            let rotate = |at| {
                registry.rotate_signing_secret(
                    "orders",
                    "signed",
                    &next,
                    std::time::Duration::ZERO,
                    at,
                )
            };
            let second = rotate(later(1)).await.unwrap().signing.unwrap();
            assert_eq!(second.previous.as_ref().unwrap().secret_id, first);
            assert!(
                secrets.get(&first).await.is_ok(),
                "still named by the record"
            );
            let third = rotate(later(2)).await.unwrap().signing.unwrap();
            assert!(secrets.get(&first).await.is_err(), "dropped: deleted");
            assert!(secrets.get(&second.secret_id).await.is_ok());
            assert!(secrets.get(&third.secret_id).await.is_ok());
            assert!(registry.delete("orders", "signed").await.unwrap());
            assert!(secrets.get(&second.secret_id).await.is_err());
            assert!(secrets.get(&third.secret_id).await.is_err());
        });
    }

    /// #36: a rotation whose record is written has happened, even when the secret it retires
    /// cannot be deleted: its caller gets the record (and shows the new secret), and the old
    /// secret is left.
    #[test]
    fn a_rotation_written_succeeds_when_the_retired_secret_cannot_be_deleted() {
        let t0 = chrono::Utc::now();
        let f = Fixture::new(t0);
        let (store, secrets, registry) = (&f.store, &f.secrets, f.registry());
        futures::executor::block_on(async {
            store
                .create_topic(&Topic::with_new_keys("orders", t0))
                .await
                .unwrap();
            let request = SubscriptionRequest {
                topic: "orders".into(),
                name: "signed".into(),
                endpoint: "https://example.com/in".into(),
                signing_secret: Some(SigningSecret::generate()),
                ..SubscriptionRequest::default()
            };
            let first = registry
                .register(&request, t0)
                .await
                .unwrap()
                .signing
                .unwrap();
            let next = SigningSecret::generate();
            let rotate = |ms| {
                registry.rotate_signing_secret(
                    "orders",
                    "signed",
                    &next,
                    std::time::Duration::ZERO,
                    t0 + chrono::Duration::milliseconds(ms),
                )
            };
            rotate(1).await.unwrap();
            secrets.deletes_down.set(true);
            let third = rotate(2).await.expect("written, so done").signing.unwrap();
            let sub = store
                .get_subscription("orders", "signed")
                .await
                .unwrap()
                .unwrap();
            assert_eq!(sub.signing.unwrap().secret_id, third.secret_id);
            assert!(
                secrets.get(&first.secret_id).await.is_ok(),
                "left, not lost"
            );
        });
    }
}
