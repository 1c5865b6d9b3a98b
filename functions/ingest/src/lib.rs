//! The `ingest` function: Event Grid's publish endpoint.
//!
//! `POST /topics/{topic}/api/events?api-version=2018-01-01` with an `aeg-sas-key` (or
//! `aeg-sas-token`) header and events in the topic's input schema: an Event Grid JSON array
//! (F1), CloudEvents in structured, batch or binary mode (F2), or custom JSON (F3). The request is checked completely before anything is
//! enqueued, so a refused request enqueues nothing; a 200 is returned only after every event is
//! durably in the delivery queue for every subscription of the topic (G1).
//!
//! [`Ingest::publish`] does the work on plain values; [`Ingest::handle`] adapts an HTTP request
//! (from API Gateway through `lambda_http`, or from the local runner) to it.

use std::collections::HashSet;
use std::sync::Arc;

use gridrelay_adapters::journal::{Budget, Stream, write_lines};
use gridrelay_ports::fan_out::{FanOutError, fan_out};
use gridrelay_ports::{
    AcceptedIds, ArchiveStreams, Clock, MessageQueue, SubscriptionStore, Update,
    update_subscription,
};
use gridrelay_shared::archive::{archive_class, archive_lines};
use gridrelay_shared::dedup::{EventIdentity, distinct, event_identity, plan_publish};
use gridrelay_shared::publish::{PublishBody, PublishError, TopicSchema, parse_publish};
use gridrelay_shared::sas::verify_sas_token;
use gridrelay_shared::subscription::{Handshake, Topic, publish_path};
use gridrelay_shared::validation::{Provisioning, ProvisioningState, VALIDATION_PATH};
use lambda_http::{Body, Request, Response};
use serde_json::json;
use subtle::ConstantTimeEq;
use tracing::{Instrument, error, info, info_span, warn};

/// What `ingest` needs: where topics and subscriptions are, the delivery queue, and the
/// stream topics' archives are written to.
pub struct Ingest {
    pub store: Arc<dyn SubscriptionStore>,
    pub delivery_queue: Arc<dyn MessageQueue>,
    /// Where the events of topics with a retention go once they are accepted (#35): the
    /// stream of the retention's class.
    pub archives: ArchiveStreams,
    /// The event ids topics with a deduplication window accepted (P1).
    pub accepted_ids: Arc<dyn AcceptedIds>,
    pub clock: Arc<dyn Clock>,
}

/// P1: events a topic with a deduplication window answered 200 for and did not enqueue again.
pub const DUPLICATES_METRIC: &str = "PublishDuplicates";
/// P1: identities of enqueued events whose publish's marks could not all be written within
/// [`MARK_WRITE_BUDGET`] (a retry of their publish within the window would be delivered
/// again, as without one).
pub const UNMARKED_METRIC: &str = "PublishIdsUnmarked";

/// The longest a publish waits for its marks (P1): a hanging store delays the answer by at
/// most this, and never fails the publish, whose events are enqueued.
pub const MARK_WRITE_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

/// Says the metrics `ingest` records to the recorder; once, after it is installed.
pub fn describe_metrics() {
    gridrelay_adapters::journal::describe_unwritten();
    metrics::describe_counter!(
        DUPLICATES_METRIC,
        metrics::Unit::Count,
        "events answered 200 and not delivered again: accepted within their topic's deduplication window"
    );
    metrics::describe_counter!(
        UNMARKED_METRIC,
        metrics::Unit::Count,
        "accepted event ids of publishes whose deduplication marks could not all be written"
    );
}

/// A publish's events, less the duplicates a topic with a window drops (P1), and the
/// identities to mark once they are enqueued.
struct Fresh {
    events: Vec<Box<serde_json::value::RawValue>>,
    to_mark: Vec<EventIdentity>,
}

/// The longest a publish waits for its archive write: a hanging archive stream delays a
/// publish by at most this, and never fails it.
pub const ARCHIVE_WRITE_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

/// A publish request, as plain values.
#[derive(Debug, Clone, Copy)]
pub struct PublishRequest<'a> {
    pub topic: &'a str,
    pub api_version: Option<&'a str>,
    pub sas_key: Option<&'a str>,
    pub sas_token: Option<&'a str>,
    pub content_type: Option<&'a str>,
    /// Every `ce-*` header (binary-mode CloudEvents), names lowercase.
    pub ce_headers: &'a [(String, String)],
    pub body: &'a [u8],
}

impl<'a> PublishRequest<'a> {
    /// A JSON body published to `topic` with its first key (as most clients publish).
    pub fn json_with_key(topic: &'a Topic, body: &'a [u8]) -> Self {
        Self {
            topic: &topic.name,
            api_version: Some("2018-01-01"),
            sas_key: Some(&topic.key1),
            sas_token: None,
            content_type: Some("application/json"),
            ce_headers: &[],
            body,
        }
    }
}

/// The answer to a publish request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishResponse {
    pub status: u16,
    /// Empty on success; otherwise Event Grid's error shape `{"error":{"code","message"}}`.
    pub body: String,
}

impl PublishResponse {
    fn ok() -> Self {
        Self {
            status: 200,
            body: String::new(),
        }
    }

    fn text(status: u16, message: &str) -> Self {
        Self {
            status,
            body: json!({"message": message}).to_string(),
        }
    }

    fn error(status: u16, code: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            status,
            body: json!({"error": {"code": code, "message": message}}).to_string(),
        }
    }
}

/// The publish path: `/topics/{topic}/api/events`, optionally behind a stage prefix.
pub fn topic_from_path(path: &str) -> Option<&str> {
    let rest = path.trim_end_matches('/').strip_suffix("/api/events")?;
    let (before, topic) = rest.rsplit_once('/')?;
    (before == "/topics" || before.ends_with("/topics")).then_some(topic)
}

impl Ingest {
    /// Adapts an HTTP request to [`Ingest::publish`] or, for the validation URL,
    /// [`Ingest::validate_subscription`].
    pub async fn handle(&self, request: Request) -> Response<Body> {
        let path = request.uri().path().to_string();
        if path.trim_end_matches('/').ends_with(VALIDATION_PATH)
            && request.method() == http::Method::GET
        {
            let query = request.uri().query().unwrap_or_default();
            let value = |name: &str| url_query_value(query, name).unwrap_or_default();
            return to_http(
                self.validate_subscription(&value("topic"), &value("name"), &value("code"))
                    .await,
            );
        }
        let Some(topic) = topic_from_path(&path) else {
            return to_http(PublishResponse::error(
                404,
                "NotFound",
                format!("no publish endpoint at {path}; publish to /topics/{{topic}}/api/events"),
            ));
        };
        if request.method() != http::Method::POST {
            return to_http(PublishResponse::error(
                405,
                "MethodNotAllowed",
                format!("{} is not allowed; publish with POST", request.method()),
            ));
        }
        let api_version = request
            .uri()
            .query()
            .and_then(|q| url_query_value(q, "api-version"));
        let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
        let ce_headers: Vec<(String, String)> = request
            .headers()
            .iter()
            .filter(|(name, _)| name.as_str().starts_with("ce-"))
            .filter_map(|(name, value)| {
                Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
            })
            .collect();
        let publish = PublishRequest {
            topic,
            api_version: api_version.as_deref(),
            sas_key: header("aeg-sas-key"),
            sas_token: header("aeg-sas-token"),
            content_type: header("content-type"),
            ce_headers: &ce_headers,
            body: request.body().as_ref(),
        };
        to_http(self.publish(publish).await)
    }

    /// Validates, authorizes and fans out one publish request, in a span naming its topic.
    pub async fn publish(&self, request: PublishRequest<'_>) -> PublishResponse {
        let span = info_span!("publish", topic = request.topic);
        self.publish_to_topic(request).instrument(span).await
    }

    /// [`Ingest::publish`], in its span.
    async fn publish_to_topic(&self, request: PublishRequest<'_>) -> PublishResponse {
        let mut topic = match self.read_topic(request.topic).await {
            Ok(topic) => topic,
            Err(refused) => return refused,
        };
        let credentials = request.sas_key.is_some() || request.sas_token.is_some();
        if credentials && self.authorize(&topic, &request).is_err() {
            // The topic may have been read before its keys were regenerated (a warm function
            // keeps what it read, `gridrelay_ports::cache`): read it again before refusing, so
            // a new key works at once; a recheck, as anyone can send a wrong key.
            self.store.recheck_topic(request.topic);
            topic = match self.read_topic(request.topic).await {
                Ok(topic) => topic,
                Err(refused) => return refused,
            };
        }
        if let Err(why) = self.authorize(&topic, &request) {
            return PublishResponse::error(401, "Unauthorized", why);
        }
        if request.api_version.is_none_or(str::is_empty) {
            return PublishResponse::error(
                400,
                "BadRequest",
                "the api-version query parameter is required (api-version=2018-01-01)",
            );
        }
        let resource_id = topic.resource_id();
        let body = PublishBody {
            content_type: request.content_type,
            ce_headers: request.ce_headers,
            body: request.body,
        };
        let schema = TopicSchema {
            name: &topic.name,
            resource_id: &resource_id,
            input_schema: topic.input_schema,
            mapping: topic.input_mapping.as_ref(),
        };
        // P1: ids made here (custom events that map none) never dedupe.
        let mut generated = HashSet::new();
        let mut new_id = || {
            let id = uuid::Uuid::new_v4().to_string();
            if topic.dedup_window_seconds > 0 {
                generated.insert(id.clone());
            }
            id
        };
        let now = self.clock.now();
        let events = match parse_publish(&body, schema, now, &mut new_id) {
            Ok(events) => events,
            Err(e) => return refused(&e),
        };
        let fresh = match self
            .without_duplicates(&topic, events, &generated, now)
            .await
        {
            Ok(fresh) => fresh,
            Err(unavailable) => return unavailable,
        };
        self.fan_out(&topic, fresh, now).await
    }

    /// P1: the events of a publish to a topic with a deduplication window that it has not
    /// accepted within the window (nor earlier in the same request); all of them without one.
    /// A store that cannot be read answers 503: the publisher retries, and nothing is delivered
    /// twice or lost.
    async fn without_duplicates(
        &self,
        topic: &Topic,
        events: Vec<Box<serde_json::value::RawValue>>,
        generated: &HashSet<String>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Fresh, PublishResponse> {
        let window = topic.dedup_window_seconds;
        if window == 0 {
            return Ok(Fresh {
                events,
                to_mark: Vec::new(),
            });
        }
        let identities: Vec<Option<EventIdentity>> = events
            .iter()
            .map(|e| event_identity(topic.input_schema, e.get(), |id| generated.contains(id)))
            .collect();
        let lookup = distinct(&identities);
        let accepted = if lookup.is_empty() {
            Default::default()
        } else {
            self.accepted_ids
                .accepted_at(&topic.name, &lookup)
                .await
                .map_err(|e| {
                    error!(error = %e, "accepted ids could not be read");
                    PublishResponse::error(
                        503,
                        "ServiceUnavailable",
                        "the topic's deduplication store is unavailable; retry the request",
                    )
                })?
        };
        let plan = plan_publish(&identities, &accepted, now, window);
        if plan.duplicates > 0 {
            info!(
                duplicates = plan.duplicates,
                window_seconds = window,
                "events accepted within the deduplication window are not delivered again"
            );
            metrics::counter!(DUPLICATES_METRIC).increment(plan.duplicates as u64);
        }
        let mut events: Vec<Option<_>> = events.into_iter().map(Some).collect();
        Ok(Fresh {
            events: plan
                .fresh
                .iter()
                .filter_map(|i| events.get_mut(*i).and_then(Option::take))
                .collect(),
            to_mark: plan.to_mark,
        })
    }

    /// P1: marks the identities of enqueued events. A mark that cannot be written is logged
    /// and counted; the publish still succeeds, its events are on their way (a retry of it
    /// within the window would be delivered again, as without a window: G1).
    async fn mark_accepted(
        &self,
        topic: &Topic,
        ids: &[EventIdentity],
        now: chrono::DateTime<chrono::Utc>,
    ) {
        if ids.is_empty() {
            return;
        }
        let marked = tokio::time::timeout(
            MARK_WRITE_BUDGET,
            self.accepted_ids.mark_accepted(&topic.name, ids, now),
        )
        .await;
        let why = match marked {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("not written within {MARK_WRITE_BUDGET:?}"),
        };
        warn!(error = %why, ids = ids.len(), "accepted ids could not be marked");
        metrics::counter!(UNMARKED_METRIC).increment(ids.len() as u64);
    }

    /// The manual validation handshake: a GET of the `validationUrl` sent to the endpoint
    /// validates the subscription if the code matches and the window has not passed.
    pub async fn validate_subscription(
        &self,
        topic: &str,
        name: &str,
        code: &str,
    ) -> PublishResponse {
        let span = info_span!("validation", topic, subscription = name);
        self.validate(topic, name, code).instrument(span).await
    }

    /// [`Ingest::validate_subscription`], in its span.
    async fn validate(&self, topic: &str, name: &str, code: &str) -> PublishResponse {
        // Checked against the subscription as it is now, not as a warm function kept it
        // (`gridrelay_ports::cache`): its code and window were written by the handshake. (A
        // subscription waiting for its handshake is never kept; this is for one kept as
        // validated and created again since. A recheck, as anyone can follow the URL.)
        self.store.recheck_subscription(topic, name);
        let sub = match self.store.get_subscription(topic, name).await {
            Ok(Some(s)) => s,
            Ok(None) => return no_such_subscription(topic, name),
            Err(e) => {
                error!(error = %e, "subscription lookup failed");
                return PublishResponse::error(503, "ServiceUnavailable", "retry the request");
            }
        };
        let now = self.clock.now();
        // Checked and written against the record as it is at the write, so a handshake step or
        // a delete-and-create meanwhile is neither undone nor validated by mistake.
        // The subscription's own handshake, or, once it is validated, its endpoint change's.
        let update = update_subscription(self.store.as_ref(), sub, |s| {
            let which = if s.provisioning.state != ProvisioningState::Succeeded {
                Handshake::Subscription
            } else if s
                .endpoint_change
                .as_ref()
                .is_some_and(|c| c.provisioning.state != ProvisioningState::Succeeded)
            {
                Handshake::EndpointChange
            } else {
                return Err(None::<&str>);
            };
            let Some((_, waiting)) = s.handshake(which) else {
                return Err(None);
            };
            waiting.accepts_manual_code(code, now).map_err(Some)?;
            s.settle_handshake(
                which,
                Provisioning {
                    validation_code_sha256: None,
                    ..Provisioning::with_state(
                        ProvisioningState::Succeeded,
                        Some("validated through the validation URL".into()),
                    )
                },
            );
            Ok(())
        })
        .await;
        match update {
            Ok(Update::Written(_)) => {
                info!("subscription validated through its validation URL");
                PublishResponse::text(
                    200,
                    "the event subscription is validated; events will be delivered",
                )
            }
            Ok(Update::Declined(None)) => {
                PublishResponse::text(200, "the event subscription is already validated")
            }
            Ok(Update::Declined(Some(why))) => {
                warn!(reason = why, "manual validation refused");
                PublishResponse::error(400, "BadRequest", why)
            }
            Ok(Update::Gone) => no_such_subscription(topic, name),
            Err(e) => {
                error!(error = %e, "could not record the validation");
                PublishResponse::error(503, "ServiceUnavailable", "retry the request")
            }
        }
    }

    /// The topic, or the answer to a publish to a topic that does not exist or cannot be read.
    async fn read_topic(&self, name: &str) -> Result<Topic, PublishResponse> {
        match self.store.get_topic(name).await {
            Ok(Some(t)) => Ok(t),
            Ok(None) => Err(PublishResponse::error(
                404,
                "NotFound",
                format!("topic {name:?} does not exist"),
            )),
            Err(e) => {
                error!(error = %e, "topic lookup failed");
                Err(PublishResponse::error(
                    503,
                    "ServiceUnavailable",
                    "topic store unavailable; retry the request",
                ))
            }
        }
    }

    /// A key (`aeg-sas-key`) or a shared access signature (`aeg-sas-token`) made with a key.
    fn authorize(&self, topic: &Topic, request: &PublishRequest<'_>) -> Result<(), String> {
        match (request.sas_key, request.sas_token) {
            (Some(key), _) => key_matches(topic, Some(key)).then_some(()).ok_or_else(|| {
                "the aeg-sas-key does not match either of the topic's keys".to_string()
            }),
            (None, Some(token)) => verify_sas_token(
                token,
                [&topic.key1, &topic.key2],
                &publish_path(&topic.name),
                self.clock.now(),
            )
            .map_err(|e| e.to_string()),
            (None, None) => Err(
                "send the topic's key in aeg-sas-key or a signature in aeg-sas-token".to_string(),
            ),
        }
    }

    async fn fan_out(
        &self,
        topic: &Topic,
        fresh: Fresh,
        now: chrono::DateTime<chrono::Utc>,
    ) -> PublishResponse {
        let Fresh { events, to_mark } = fresh;
        if events.is_empty() {
            // Every event was a duplicate (P1).
            return PublishResponse::ok();
        }
        match fan_out(
            self.store.as_ref(),
            self.delivery_queue.as_ref(),
            &topic.name,
            topic.input_schema,
            &events,
            now,
        )
        .await
        {
            Ok(done) => {
                let (archive_unwritten, ()) = tokio::join!(
                    self.archive(topic, &events, now),
                    self.mark_accepted(topic, &to_mark, now)
                );
                info!(
                    events = events.len(),
                    subscriptions = done.subscriptions,
                    enqueued = done.enqueued,
                    messages = done.messages,
                    archive_unwritten,
                    "published"
                );
                PublishResponse::ok()
            }
            Err(e @ FanOutError::Unconvertible { .. }) => {
                warn!(error = %e, "publish refused");
                PublishResponse::error(400, "BadRequest", e.to_string())
            }
            Err(e @ FanOutError::TooLarge { .. }) => {
                warn!(error = %e, "publish refused");
                PublishResponse::error(413, "PayloadTooLarge", e.to_string())
            }
            Err(e) => {
                error!(error = %e, "fan-out failed");
                PublishResponse::error(
                    503,
                    "ServiceUnavailable",
                    "the events could not all be enqueued; retry the request (some may be delivered twice)",
                )
            }
        }
    }

    /// Writes accepted `events` to the topic's archive if it keeps one (its retention is above
    /// 0), once they are durably fanned out: an archived event was accepted. Returns how many
    /// were not written (logged; the publish succeeds: its events are on their way).
    async fn archive(
        &self,
        topic: &Topic,
        events: &[Box<serde_json::value::RawValue>],
        now: chrono::DateTime<chrono::Utc>,
    ) -> usize {
        let Some(class) = archive_class(topic.retention_days) else {
            return 0;
        };
        let Some(stream) = self.archives.of_class(class) else {
            if self.archives.is_empty() {
                // A stack deployed without an archive.
                return 0;
            }
            error!(
                class,
                retention_days = topic.retention_days,
                "no archive stream for the topic's retention class; its events are not archived"
            );
            return events.len();
        };
        let lines = archive_lines(&topic.name, topic.input_schema, now, events);
        write_lines(
            stream,
            lines,
            Budget::own(ARCHIVE_WRITE_BUDGET),
            Stream::Archive,
        )
        .await
    }
}

/// The answer to a publish its topic refuses (logged in the publish span, which names the topic).
fn refused(e: &PublishError) -> PublishResponse {
    warn!(error = %e, "publish refused");
    let code = if e.http_status() == 413 {
        "PayloadTooLarge"
    } else {
        "BadRequest"
    };
    PublishResponse::error(e.http_status(), code, e.to_string())
}

/// 404 for a subscription that does not exist.
fn no_such_subscription(topic: &str, name: &str) -> PublishResponse {
    PublishResponse::error(
        404,
        "NotFound",
        format!("event subscription {name:?} on topic {topic:?} does not exist"),
    )
}

/// Compares the given key with both topic keys in constant time.
fn key_matches(topic: &Topic, given: Option<&str>) -> bool {
    let Some(given) = given else { return false };
    let given = given.trim().as_bytes();
    let one = topic.key1.as_bytes().ct_eq(given);
    let two = topic.key2.as_bytes().ct_eq(given);
    bool::from(one | two)
}

fn url_query_value(query: &str, name: &str) -> Option<String> {
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

fn to_http(response: PublishResponse) -> Response<Body> {
    let mut builder = Response::builder().status(response.status);
    if !response.body.is_empty() {
        builder = builder.header("content-type", "application/json");
    }
    let body = if response.body.is_empty() {
        Body::Empty
    } else {
        Body::Text(response.body)
    };
    builder
        .body(body)
        .unwrap_or_else(|_| Response::new(Body::Empty))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_is_read_from_the_publish_path() {
        assert_eq!(topic_from_path("/topics/orders/api/events"), Some("orders"));
        assert_eq!(
            topic_from_path("/prod/topics/orders/api/events"),
            Some("orders")
        );
        assert_eq!(topic_from_path("/topics/orders"), None);
        assert_eq!(topic_from_path("/other/orders/api/events"), None);
        assert_eq!(topic_from_path("/mytopics/orders/api/events"), None);
    }

    #[test]
    fn either_key_authorizes_in_constant_time() {
        let t = Topic {
            key1: "k1".into(),
            key2: "k2".into(),
            ..Topic::with_new_keys("t", chrono::Utc::now())
        };
        assert!(key_matches(&t, Some("k1")));
        assert!(key_matches(&t, Some("k2")));
        assert!(!key_matches(&t, Some("k3")));
        assert!(!key_matches(&t, Some("")));
        assert!(!key_matches(&t, None));
    }
}
