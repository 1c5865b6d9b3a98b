//! What a subscriber may do from its page (#36): send itself a test event, send
//! dead-lettered events again, and rotate the subscription's signing secret (the new one shown
//! once). Each is a POST of a form of the page, let in only with:
//!
//! - the pass (the link's token, in the cookie scoped to the subscription's path) checked as
//!   a page's is: signed with the key now in use, not expired, for this subscription;
//! - the page's form token, an HMAC of the pass under the portal key
//!   ([`PortalKey::form_token`](gridrelay_shared::portal::PortalKey::form_token)), which a
//!   page of another site cannot know;
//! - where the browser says where the form comes from, this site: `Sec-Fetch-Site` (where
//!   sent) `same-origin`, `Origin` (where sent) this host's or `null` (what a page with
//!   `Referrer-Policy: no-referrer` sends for its own forms).
//!
//! A view-only link's page offers no form, and every change asked with it is refused.
//!
//! The cookie is `SameSite=Lax` besides, so a browser does not send it with another site's
//! POST at all. What the subscriber may act on is the subscription its pass grants: the path
//! names it, and the pass is checked against the path.

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Path, RawForm, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, TimeDelta, Utc};
use gridrelay_ports::fan_out::send_to_subscription;
use gridrelay_ports::redrive::{DeadLetterSelection, DeadLetteredEvent, redrive_subscription};
use gridrelay_ports::registration::{SigningKeys, rotate_signing_secret};
use gridrelay_ports::send_again::{SendAgainPorts, SentFromArchive, send_dropped_again};
use gridrelay_shared::dead_letter::{object_hour, subscription_folder};
use gridrelay_shared::dead_letter_write::UNAVAILABLE_LIMIT;
use gridrelay_shared::decision::to_chrono;
use gridrelay_shared::journal::{DroppedEvent, JournalEntry};
use gridrelay_shared::portal::{
    TEST_EVENT_WINDOW_SECONDS, TestEventClaim, test_event as portal_test_event,
};
use gridrelay_shared::signing::{SigningSecret, grace_of_text};
use gridrelay_shared::subscription::Subscription;
use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use crate::{Portal, Refusal, admit_by_cookie, page, read_subscription, refused};

/// The most dead-lettered events one "send again" takes (a page lists at most this many).
pub const MAX_PICKED: usize = crate::MAX_LISTED;

/// A form's fields, as a POST sends them.
#[derive(Debug, Default)]
struct Form {
    token: Option<String>,
    picks: Vec<String>,
    grace_period_hours: Option<String>,
    /// The span of the page the form was on (`1h`, `6h`, `24h`): where dropped events are
    /// looked for.
    since: Option<String>,
    confirmed: bool,
}

impl Form {
    fn parse(body: &[u8]) -> Self {
        let mut form = Form::default();
        for (field, value) in url::form_urlencoded::parse(body) {
            match field.as_ref() {
                "form_token" => form.token = Some(value.into_owned()),
                "pick" => form.picks.push(value.into_owned()),
                "grace_period_hours" => form.grace_period_hours = Some(value.into_owned()),
                "since" => form.since = Some(value.into_owned()),
                "confirm" => form.confirmed = value == "yes",
                _ => {}
            }
        }
        form
    }
}

/// Whether the browser, where it says so, sends the form from this site.
fn from_this_site(headers: &HeaderMap) -> bool {
    let site_ok = headers
        .get("sec-fetch-site")
        .is_none_or(|s| s.as_bytes() == b"same-origin");
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_ok = headers.get(header::ORIGIN).is_none_or(|o| {
        let o = o.as_bytes();
        o == b"null"
            || host.is_some_and(|h| {
                [format!("https://{h}"), format!("http://{h}")]
                    .iter()
                    .any(|own| own.as_bytes() == o)
            })
    });
    site_ok && origin_ok
}

/// A change let in: its pass (as a page's), its form token and where it comes from checked;
/// its form, and the subscription it acts on; if not, the answer to give.
async fn change_admitted(
    portal: &Portal,
    (topic, name): (&str, &str),
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Form, Subscription), Response> {
    let form = Form::parse(body);
    let now = portal.clock.now();
    let key = crate::current_key(portal).await?;
    let admitted = admit_by_cookie(key, (topic, name), headers, now).map_err(|r| refused(&r))?;
    if admitted.grant.view_only {
        return Err(refused(&Refusal::ViewOnly));
    }
    let token_ok = form
        .token
        .as_deref()
        .is_some_and(|t| admitted.key.form_token_matches(&admitted.pass, t));
    if !token_ok || !from_this_site(headers) {
        return Err(refused(&Refusal::Form));
    }
    let sub = read_subscription(portal, &admitted.grant).await?;
    Ok((form, sub))
}

/// A form of a page, let in ([`change_admitted`]): its fields, and the subscription it acts on.
/// What each form's handler takes; a request not let in is answered by the refusal.
pub(crate) struct Change {
    form: Form,
    sub: Subscription,
}

impl FromRequest<Arc<Portal>> for Change {
    type Rejection = Response;

    async fn from_request(request: Request, portal: &Arc<Portal>) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let Path((topic, name)) = Path::<(String, String)>::from_request_parts(&mut parts, portal)
            .await
            .map_err(IntoResponse::into_response)?;
        let headers = parts.headers.clone();
        let RawForm(body) = RawForm::from_request(Request::from_parts(parts, body), portal)
            .await
            .map_err(IntoResponse::into_response)?;
        let (form, sub) = change_admitted(portal, (&topic, &name), &headers, &body).await?;
        Ok(Self { form, sub })
    }
}

/// `POST /portal/{topic}/{name}/test-event`: one test event to the subscription's endpoint,
/// delivered (and retried, journaled, dead-lettered) as any other.
pub(crate) async fn test_event(
    State(portal): State<Arc<Portal>>,
    Change { sub, .. }: Change,
) -> Response {
    let now = portal.clock.now();
    if !sub.receives(now) {
        return not_receiving();
    }
    // One per subscription per window: the window's first claim wins.
    let claim = TestEventClaim::at(&sub.id, now);
    let token = uuid::Uuid::new_v4().to_string();
    match portal
        .health
        .claim(&claim.key, &token, now, claim.until)
        .await
    {
        Ok(true) => {}
        Ok(false) => return too_soon(claim.next_window, now),
        Err(e) => {
            tracing::error!(error = %e, topic = %sub.topic, name = %sub.name,
                "the portal could not claim a test event's window");
            return crate::unavailable();
        }
    }
    let id = uuid::Uuid::new_v4().to_string();
    let event = portal_test_event(&sub.topic, &sub.name, &id, now);
    match send_to_subscription(portal.delivery_queue.as_ref(), &sub, &event, now).await {
        Ok(()) => {
            tracing::info!(topic = %sub.topic, name = %sub.name, %id, "a test event was sent from the portal");
            page::test_event_sent(&sub, &id).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, topic = %sub.topic, name = %sub.name, "the portal could not send a test event");
            crate::unavailable()
        }
    }
}

/// `POST /portal/{topic}/{name}/send-again`: the picked events back into delivery: each
/// dead-lettered one ([`pick_value`]) through the redrive of the subscription's own
/// dead-letter objects (only records still there, of this subscription, are sent); each
/// dropped one ([`archived_pick_value`]) from the topic's archive, if the journal still says
/// the subscription dropped it in the span of the page the form was on (`since`).
pub(crate) async fn send_again(
    State(portal): State<Arc<Portal>>,
    Change { form, sub }: Change,
) -> Response {
    if form.picks.len() > MAX_PICKED {
        let why = format!(
            "pick: {} events were picked; at most {MAX_PICKED} are sent again at once",
            form.picks.len()
        );
        return (StatusCode::BAD_REQUEST, page::failed("Nothing sent", &why)).into_response();
    }
    let (archived, dead): (Vec<&String>, Vec<&String>) =
        form.picks.iter().partition(|v| archived_pick(v).is_some());
    let dropped_ids: Vec<String> = archived.iter().filter_map(|v| archived_pick(v)).collect();
    let records: Vec<(String, String)> = dead.iter().filter_map(|v| parse_pick(&sub, v)).collect();
    if records.is_empty() && dropped_ids.is_empty() {
        let why = "No event was picked: tick those to send again.";
        return (StatusCode::BAD_REQUEST, page::failed("Nothing sent", why)).into_response();
    }
    let now = portal.clock.now();
    let mut done = page::SentAgain::default();
    // A part that fails after the other sent something is said on the page of what was sent.
    let mut failed = None;
    if !records.is_empty() {
        // Only the objects of the picked records' hours are read, however many the folder
        // holds.
        let hours: Vec<DateTime<Utc>> = dead.iter().filter_map(|v| pick_hour(v)).collect();
        match dead_lettered_again(&portal, &sub, records, &hours, now).await {
            Ok((sent, not_sent)) => {
                done.dead_lettered = sent;
                done.not_sent = not_sent;
            }
            Err(response) => failed = Some(response),
        }
    }
    if !dropped_ids.is_empty() {
        match dropped_again(&portal, &sub, form.since.as_deref(), &dropped_ids, now).await {
            Ok(archived) => {
                done.from_archive = archived.sent;
                done.held = archived.held;
                done.not_read = archived.not_read;
                done.not_sent.extend(archived.not_found);
            }
            Err(response) => failed = failed.or(Some(response)),
        }
    }
    match failed {
        Some(response) if done.dead_lettered.is_empty() && done.from_archive.is_empty() => response,
        failed => {
            done.incomplete = failed.is_some();
            page::sent_again(&sub, &done).into_response()
        }
    }
}

/// The dead-lettered `records` (object and id) of `hours` sent again: the ids sent, and those
/// picked but not sent; if nothing could be, the answer to give.
async fn dead_lettered_again(
    portal: &Portal,
    sub: &Subscription,
    records: Vec<(String, String)>,
    hours: &[DateTime<Utc>],
    now: DateTime<Utc>,
) -> Result<(Vec<String>, Vec<String>), Response> {
    let picked: Vec<String> = records.iter().map(|(_, id)| id.clone()).collect();
    let selection = DeadLetterSelection {
        topic: sub.topic.clone(),
        subscription: Some(sub.name.clone()),
        since: hours.iter().min().copied(),
        until: hours.iter().max().map(|h| *h + TimeDelta::hours(1)),
        records,
        ..DeadLetterSelection::default()
    };
    let queue = portal.delivery_queue.as_ref();
    match redrive_subscription(portal.objects.as_ref(), queue, sub, &selection, false, now).await {
        Ok(done) if done.skipped.is_none() => {
            tracing::info!(topic = %sub.topic, name = %sub.name, events = done.events.len(),
                "dead-lettered events were sent again from the portal");
            let sent: Vec<String> = done.events.into_iter().filter_map(|e| e.id).collect();
            let not_sent = picked.into_iter().filter(|id| !sent.contains(id)).collect();
            Ok((sent, not_sent))
        }
        Ok(done) => {
            tracing::warn!(why = ?done.skipped, topic = %sub.topic, name = %sub.name,
                "the portal sent no dead-lettered event again");
            Err((
                StatusCode::CONFLICT,
                page::failed(
                    "Nothing sent",
                    "Dead-lettered events cannot be sent again now: the subscription does not \
                     receive events (its state is on its page), or they cannot be read.",
                ),
            )
                .into_response())
        }
        Err(e) => {
            tracing::error!(error = %e, topic = %sub.topic, name = %sub.name,
                "the portal could not send dead-lettered events again");
            Err(crate::unavailable())
        }
    }
}

/// The dropped events `ids` sent again from the topic's archive: those the journal of the span
/// `since` says the subscription dropped (their publish found in the journal before the span
/// where need be, as far back as their delivery can have lasted); what was done, the picks it
/// did not drop among the not found; if nothing could be, the answer to give.
async fn dropped_again(
    portal: &Portal,
    sub: &Subscription,
    since: Option<&str>,
    ids: &[String],
    now: DateTime<Utc>,
) -> Result<SentFromArchive, Response> {
    let query = crate::PageQuery {
        since: since.map(str::to_string),
        ..crate::PageQuery::default()
    };
    let filter = crate::Filter::of(&query).map_err(|why| {
        (StatusCode::BAD_REQUEST, page::failed("Nothing sent", &why)).into_response()
    })?;
    if !sub.receives(now) {
        return Err(not_receiving());
    }
    let topic = match portal.store.get_topic(&sub.topic).await {
        Ok(Some(topic)) if topic.retention_days > 0 => topic,
        Ok(_) => {
            let why = "The topic keeps no copy of its events, so dropped events cannot be sent \
                       again.";
            return Err((StatusCode::CONFLICT, page::failed("Nothing sent", why)).into_response());
        }
        Err(e) => {
            tracing::error!(error = %e, topic = %sub.topic, "the portal could not read a topic");
            return Err(crate::unavailable());
        }
    };
    let start = now - TimeDelta::hours(filter.hours);
    let unavailable = |()| crate::unavailable();
    let mut entries = crate::read_journal_between(portal, start, now)
        .await
        .map_err(unavailable)?;
    let picked = |entries: &[JournalEntry]| -> Vec<DroppedEvent> {
        crate::own_dropped_events(entries, sub)
            .into_iter()
            .filter(|d| ids.contains(&d.id))
            .collect()
    };
    let mut dropped = picked(&entries);
    let unknown = dropped.iter().filter(|d| d.published.is_none());
    if let Some(first) = unknown.map(|d| d.first_seen).min() {
        let ttl = TimeDelta::minutes(i64::from(sub.retry_policy.event_time_to_live_in_minutes));
        let back = ttl + to_chrono(UNAVAILABLE_LIMIT) + TimeDelta::minutes(15);
        let from = (first - back).max(sub.created_at);
        if from < start {
            let earlier = crate::read_journal_between(portal, from, start)
                .await
                .map_err(unavailable)?;
            entries.extend(earlier);
            dropped = picked(&entries);
        }
    }
    let ports = SendAgainPorts {
        archive: portal.archive.as_ref(),
        claims: portal.health.as_ref(),
        queue: portal.delivery_queue.as_ref(),
    };
    match send_dropped_again(&ports, (&topic, sub), &dropped, now).await {
        Ok(mut done) => {
            tracing::info!(topic = %sub.topic, name = %sub.name, sent = done.sent.len(),
                held = done.held.len(), not_found = done.not_found.len(),
                not_read = done.not_read.len(), "dropped events were sent again from the portal");
            let not_dropped = ids
                .iter()
                .filter(|id| !dropped.iter().any(|d| &d.id == *id));
            done.not_found.extend(not_dropped.cloned());
            Ok(done)
        }
        Err(e) => {
            tracing::error!(error = %e, topic = %sub.topic, name = %sub.name,
                "the portal could not send dropped events again");
            Err(crate::unavailable())
        }
    }
}

/// The answer to a test event asked for within [`TEST_EVENT_WINDOW_SECONDS`] of another: 429,
/// with when to ask again.
fn too_soon(next_window: DateTime<Utc>, now: DateTime<Utc>) -> Response {
    let wait = (next_window - now).num_seconds().max(1);
    let why = format!(
        "A test event was sent to this subscription in the last {TEST_EVENT_WINDOW_SECONDS} \
         seconds: one is sent per {TEST_EVENT_WINDOW_SECONDS} seconds at most. Send another \
         from {}.",
        gridrelay_shared::journal::format_time(next_window)
    );
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, wait.to_string())],
        page::failed("No test event sent", &why),
    )
        .into_response()
}

/// The answer to a form that would send events to a subscription that receives none now.
fn not_receiving() -> Response {
    (
        StatusCode::CONFLICT,
        page::failed(
            "Nothing sent",
            "This subscription does not receive events now (its state is on its page), so \
             nothing sent to it would be delivered.",
        ),
    )
        .into_response()
}

/// `POST /portal/{topic}/{name}/signing-secret`: asked about first; then the subscription's
/// deliveries are signed with a new random secret, the current one signing beside it for the
/// grace period (`grace_period_hours`, 0 to 168), through the same rotation as the command
/// line's and the console's. The answer shows the new secret once (no answer is cached); the
/// portal keeps it nowhere.
pub(crate) async fn signing_secret(
    State(portal): State<Arc<Portal>>,
    Change { form, sub }: Change,
) -> Response {
    let text = form
        .grace_period_hours
        .clone()
        .unwrap_or_else(|| DEFAULT_GRACE_HOURS.to_string());
    let (hours, grace) = match grace_of_text(&text, "grace_period_hours") {
        Ok(grace) => grace,
        Err(e) => {
            let page = page::failed("Not rotated", &e.to_string());
            return (StatusCode::BAD_REQUEST, page).into_response();
        }
    };
    let form_token = form.token.as_deref().unwrap_or_default();
    if !form.confirmed {
        return page::confirm_rotation(&sub, hours, form_token).into_response();
    }
    let secret = SigningSecret::generate();
    let keys = SigningKeys {
        store: portal.store.as_ref(),
        secrets: portal.secrets.as_ref(),
        secret_prefix: &portal.secret_prefix,
    };
    let now = portal.clock.now();
    match rotate_signing_secret(&keys, (&sub.topic, &sub.name), &secret, grace, now).await {
        Ok(sub) => {
            tracing::info!(topic = %sub.topic, name = %sub.name, hours, "a signing secret was rotated from the portal");
            page::rotated(&sub, hours, &secret).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, topic = %sub.topic, name = %sub.name,
                "the portal could not rotate a signing secret");
            crate::unavailable()
        }
    }
}

/// The grace period the rotation's form offers, in hours (the command line's default).
pub const DEFAULT_GRACE_HOURS: u64 = 24;

/// What a dropped event's pick ends with, after its id.
const ARCHIVED: &str = "archive";

/// A dropped event as a form picks it, to send again from the topic's archive: its id
/// (percent-encoded) and [`ARCHIVED`] (no dead-letter object's key is that).
pub fn archived_pick_value(id: &str) -> String {
    format!("{} {ARCHIVED}", utf8_percent_encode(id, NON_ALPHANUMERIC))
}

/// The id an [`archived_pick_value`] names.
fn archived_pick(value: &str) -> Option<String> {
    let (id, kind) = value.split_once(' ')?;
    (kind == ARCHIVED).then(|| {
        percent_decode_str(id)
            .decode_utf8()
            .ok()
            .map(|id| id.into_owned())
    })?
}

/// A dead-lettered event as a form picks it: its id (percent-encoded) and its object's key
/// under the subscription's dead-letter folder, so the page names no bucket; `None` for an
/// event without an id (it cannot be picked, as in the console).
pub fn pick_value(sub: &Subscription, event: &DeadLetteredEvent) -> Option<String> {
    let id = event.id.as_deref()?;
    let rest = event.location.strip_prefix(&folder_location(sub)?)?;
    Some(format!(
        "{} {rest}",
        utf8_percent_encode(id, NON_ALPHANUMERIC)
    ))
}

/// The record a [`pick_value`] names: its object (`s3://bucket/key`) and its event's id.
/// Anything else names no record of the subscription, and a redrive finds none.
fn parse_pick(sub: &Subscription, value: &str) -> Option<(String, String)> {
    let (id, rest) = value.split_once(' ')?;
    let id = percent_decode_str(id).decode_utf8().ok()?;
    Some((format!("{}{rest}", folder_location(sub)?), id.into_owned()))
}

/// The hour of the object a [`pick_value`] names (its key under the folder begins
/// `YYYY/MM/DD/HH/`).
fn pick_hour(value: &str) -> Option<DateTime<Utc>> {
    let (_, rest) = value.split_once(' ')?;
    object_hour("", rest)
}

/// `s3://bucket/<folder>` of the subscription's dead-letter objects.
fn folder_location(sub: &Subscription) -> Option<String> {
    let destination = sub.dead_letter_destination.as_ref()?;
    Some(format!(
        "s3://{}/{}",
        destination.bucket,
        subscription_folder(destination, &sub.topic, &sub.name)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("portal.example"));
        for (name, value) in pairs {
            h.insert(
                *name,
                HeaderValue::from_str(value).unwrap_or_else(|e| panic!("{e}")),
            );
        }
        h
    }

    #[test]
    fn a_form_counts_as_from_this_site_only_where_the_browser_does_not_say_otherwise() {
        for ok in [
            vec![],
            vec![("sec-fetch-site", "same-origin")],
            vec![("origin", "null"), ("sec-fetch-site", "same-origin")],
            vec![("origin", "https://portal.example")],
            vec![("origin", "http://portal.example")],
        ] {
            assert!(from_this_site(&headers(&ok)), "{ok:?}");
        }
        for refused in [
            vec![("sec-fetch-site", "cross-site")],
            vec![("sec-fetch-site", "same-site")],
            vec![("sec-fetch-site", "none")],
            vec![("origin", "https://evil.example")],
            vec![("origin", "https://portal.example.evil.example")],
            vec![("origin", "null"), ("sec-fetch-site", "cross-site")],
        ] {
            assert!(!from_this_site(&headers(&refused)), "{refused:?}");
        }
    }

    #[test]
    fn a_pick_names_its_record_without_the_bucket_and_reads_back() {
        use gridrelay_shared::subscription::{DeadLetterDestination, SubscriptionRequest};
        let mut sub = SubscriptionRequest {
            topic: "orders".into(),
            name: "billing".into(),
            endpoint: "https://example.com/hook".into(),
            ..SubscriptionRequest::default()
        }
        .validate(Default::default(), chrono::Utc::now())
        .unwrap_or_else(|e| panic!("{e}"));
        let location = "s3://dead-letters/dl/orders/billing/2026/11/28/08/abc.json".to_string();
        let event = DeadLetteredEvent {
            id: Some("id 1/ü".into()),
            reason: "MaxDeliveryAttemptsExceeded".into(),
            location: location.clone(),
        };
        assert_eq!(
            pick_value(&sub, &event),
            None,
            "no destination: nothing to pick"
        );
        sub.dead_letter_destination = Some(DeadLetterDestination {
            bucket: "dead-letters".into(),
            prefix: "dl".into(),
        });
        let value = pick_value(&sub, &event).unwrap_or_default();
        assert!(!value.contains("dead-letters"), "{value}");
        assert_eq!(
            parse_pick(&sub, &value),
            Some((location, "id 1/ü".to_string()))
        );
        assert_eq!(parse_pick(&sub, "no-space"), None);
        assert_eq!(
            pick_hour(&value).map(|h| h.to_rfc3339()),
            Some("2026-11-28T08:00:00+00:00".to_string())
        );
        assert_eq!(pick_hour("id not/an/hour.json"), None);
    }
}
