//! The subscribers' portal (#36): one subscription's deliveries, for whoever holds a link the
//! operator made for it (`gridrelay event-subscription portal-link`), with no AWS account.
//!
//! A link is `/portal/<topic>/<subscription>?token=<token>` ([`gridrelay_shared::portal`]:
//! signed with the stack's portal key, expiring). Its first load exchanges the token for an
//! HttpOnly cookie scoped to that subscription's path and sends the browser on to the same
//! path without the token (so it stays out of the history, and of any `Referer`: no page
//! sends one). Every request is checked again: the token must be signed by the key now in use
//! (a rotation revokes every link), not expired, and for the subscription the path names; if
//! not, 403, saying no more than that. The pages show that subscription only, and nothing of the
//! stack: not its settings, its resources' names, nor why a store could not be read (that goes
//! to the log).
//!
//! The same [`router`] is served by `gridrelay local` beside its publish API, and on AWS by
//! the stack's front door on `/portal`.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, TimeDelta, Utc};
use gridrelay_ports::redrive::{DeadLetterSelection, DeadLetteredEvent, redrive_subscription};
use gridrelay_ports::{
    ArchiveSource, Clock, DeliveryStateStore, JournalSource, MessageQueue, ObjectStore,
    PortalKeySource, SecretStore, SubscriptionStore,
};
use gridrelay_shared::delivery::NotDeliverable;
use gridrelay_shared::journal::{DroppedEvent, JournalEntry, dropped_events, latest_attempts};
use gridrelay_shared::portal::{LinkRefusal, PortalGrant, PortalKey, read_token};
use gridrelay_shared::subscription::Subscription;
use serde::Deserialize;

mod actions;
pub mod page;

/// The style sheet (the console's too), served at [`STYLE_PATH`].
pub const STYLE: &str = include_str!("gridrelay.css");
/// Where the portal's pages are.
pub const PORTAL_PATH: &str = "/portal";
pub const STYLE_PATH: &str = "/portal/gridrelay.css";
/// The cookie a link's token is kept in, scoped to its subscription's path.
pub const COOKIE: &str = "gridrelay_portal";
/// The most attempts a page lists.
pub const MAX_LISTED: usize = 100;

/// What the portal reads.
pub struct Portal {
    pub store: Arc<dyn SubscriptionStore>,
    pub health: Arc<dyn DeliveryStateStore>,
    pub journal: Arc<dyn JournalSource>,
    /// Topics' archives, where dropped events are sent again from.
    pub archive: Arc<dyn ArchiveSource>,
    pub keys: Arc<dyn PortalKeySource>,
    /// Where subscriptions' dead-lettered events are, read and sent again from.
    pub objects: Arc<dyn ObjectStore>,
    /// Where test events and events sent again go: the stack's delivery queue (sealed).
    pub delivery_queue: Arc<dyn MessageQueue>,
    /// Where a rotation keeps the subscription's new signing secret, and the installation's
    /// prefix of such secrets' names.
    pub secrets: Arc<dyn SecretStore>,
    pub secret_prefix: String,
    pub clock: Arc<dyn Clock>,
    /// Whether its cookie is sent over HTTPS only: on AWS, whose front door is HTTPS; not on
    /// `gridrelay local`'s `http://127.0.0.1`.
    pub secure_cookies: bool,
}

/// The portal's routes, under [`PORTAL_PATH`].
pub fn router(portal: Arc<Portal>) -> Router {
    Router::new()
        .route(STYLE_PATH, get(style))
        .route("/portal/{topic}/{name}", get(subscription))
        .route(
            "/portal/{topic}/{name}/test-event",
            post(actions::test_event),
        )
        .route(
            "/portal/{topic}/{name}/send-again",
            post(actions::send_again),
        )
        .route(
            "/portal/{topic}/{name}/signing-secret",
            post(actions::signing_secret),
        )
        .with_state(portal)
        .layer(axum::middleware::map_response(guarded))
}

/// Every answer: no referrer, nothing from elsewhere, never framed, never cached.
async fn guarded(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::REFERRER_POLICY, "no-referrer"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; \
             base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// Why a request was refused: never more than this is said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A token that is not one, is forged or revoked, or has expired.
    Link(LinkRefusal),
    /// A valid token for another subscription.
    OtherSubscription,
    /// No token in the URL nor in a cookie.
    NoPass,
    /// A change asked for without the page's form token, or from another site.
    Form,
    /// A change asked for with a view-only link.
    ViewOnly,
}

impl Refusal {
    /// What the refusal page says.
    pub fn text(&self) -> String {
        match self {
            Refusal::Link(LinkRefusal::Expired { at }) => format!(
                "This link expired at {}. Ask whoever sent it for a new one.",
                gridrelay_shared::journal::format_time(*at)
            ),
            Refusal::Link(_) | Refusal::OtherSubscription => {
                "This link cannot be used here. Open the link you were given, or ask whoever \
                 sent it for a new one."
                    .to_string()
            }
            Refusal::NoPass => "Open this page with the link you were given.".to_string(),
            Refusal::Form => "This form cannot be sent from here. Open the page again from the \
                              link you were given, and use its buttons."
                .to_string(),
            Refusal::ViewOnly => "This link lets you see the deliveries, not change anything. \
                                  Ask whoever sent it for a link that does."
                .to_string(),
        }
    }
}

/// The grant of `token` if `key` signed it, it has not expired at `now`, and it is for
/// `subscription` of `topic`.
pub fn admit(
    token: &str,
    key: &PortalKey,
    (topic, subscription): (&str, &str),
    now: DateTime<Utc>,
) -> Result<PortalGrant, Refusal> {
    let grant = read_token(token, key, now).map_err(Refusal::Link)?;
    if !grant.covers(topic, subscription) {
        return Err(Refusal::OtherSubscription);
    }
    Ok(grant)
}

/// What a path segment keeps as it is: names are letters, digits and `-`, so a page's path is
/// the one a person would type, and its cookie's `Path` (compared as written) matches it.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC.remove(b'-');

/// The URL of a subscription's portal page under `portal_url`, where the portal's pages are
/// (the stacks' `PortalUrl`: the front door's base URL and [`PORTAL_PATH`]).
pub fn page_url(portal_url: &str, topic: &str, subscription: &str) -> String {
    let path = page_path(topic, subscription);
    format!(
        "{}{}",
        portal_url.trim_end_matches('/'),
        path.strip_prefix(PORTAL_PATH).unwrap_or(&path)
    )
}

/// The path of subscription `(topic, subscription)`'s page: `/portal/<topic>/<subscription>`,
/// each percent-encoded.
pub fn page_path(topic: &str, subscription: &str) -> String {
    use percent_encoding::utf8_percent_encode;
    format!(
        "{PORTAL_PATH}/{}/{}",
        utf8_percent_encode(topic, SEGMENT),
        utf8_percent_encode(subscription, SEGMENT)
    )
}

/// What a page's form asks for.
#[derive(Debug, Default, Deserialize)]
pub struct PageQuery {
    /// A link's token, on its first load.
    pub token: Option<String>,
    /// How far back: `1h`, `6h` or `24h`.
    pub since: Option<String>,
    /// `all` or `failed`.
    pub outcome: Option<String>,
}

/// The spans a page looks back over, and the attempts' outcomes it filters by.
pub const SPANS: [(&str, &str, i64); 3] = [
    ("1h", "The last hour", 1),
    ("6h", "The last 6 hours", 6),
    ("24h", "The last 24 hours", 24),
];
pub const OUTCOMES: [(&str, &str); 2] = [("all", "All"), ("failed", "Failed only")];

/// A page's filter, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub since: &'static str,
    pub hours: i64,
    pub failed: bool,
}

impl Filter {
    /// The filter `query` asks for; the error names the field, the value and what it takes.
    pub fn of(query: &PageQuery) -> Result<Self, String> {
        let since = query.since.as_deref().unwrap_or("1h");
        let Some(&(since, _, hours)) = SPANS.iter().find(|(v, _, _)| *v == since) else {
            return Err(format!("since: {since:?} is not one of 1h, 6h, 24h"));
        };
        let failed = match query.outcome.as_deref().unwrap_or("all") {
            "all" => false,
            "failed" => true,
            other => return Err(format!("outcome: {other:?} is not one of all, failed")),
        };
        Ok(Self {
            since,
            hours,
            failed,
        })
    }
}

/// A request let in: the key now, and the grant and the pass (its token) that let it in.
pub(crate) struct Admitted {
    pub(crate) key: PortalKey,
    pub(crate) grant: PortalGrant,
    pub(crate) pass: String,
}

/// The portal key now; if it cannot be read, the answer to give.
async fn current_key(portal: &Portal) -> Result<PortalKey, Response> {
    portal.keys.portal_key().await.map_err(|e| {
        tracing::error!(error = %e, "the portal key could not be read");
        unavailable()
    })
}

/// The request in, by a pass for `(topic, name)` in its cookies; if not, why not (the last
/// cookie's refusal).
pub(crate) fn admit_by_cookie(
    key: PortalKey,
    (topic, name): (&str, &str),
    headers: &HeaderMap,
    now: DateTime<Utc>,
) -> Result<Admitted, Refusal> {
    let mut refusal = Refusal::NoPass;
    for pass in cookies(headers, COOKIE) {
        match admit(&pass, &key, (topic, name), now) {
            Ok(grant) => return Ok(Admitted { key, grant, pass }),
            Err(why) => refusal = why,
        }
    }
    Err(refusal)
}

/// The subscription `grant` is for; if it is gone, another one has its names now, or it
/// cannot be read, the answer to give.
pub(crate) async fn read_subscription(
    portal: &Portal,
    grant: &PortalGrant,
) -> Result<Subscription, Response> {
    let (topic, name) = (&grant.topic, &grant.subscription);
    match portal.store.get_subscription(topic, name).await {
        Ok(Some(sub)) if grant.is_for(&sub) => Ok(sub),
        // Deleted, and made again under the same names since the link was made: not its.
        Ok(Some(_)) => Err(refused(&Refusal::OtherSubscription)),
        Ok(None) => Err((
            StatusCode::NOT_FOUND,
            page::failed(
                "No such subscription",
                "This subscription no longer exists.",
            ),
        )
            .into_response()),
        Err(e) => {
            tracing::error!(error = %e, %topic, %name, "the portal could not read a subscription");
            Err(unavailable())
        }
    }
}

async fn subscription(
    State(portal): State<Arc<Portal>>,
    Path((topic, name)): Path<(String, String)>,
    Query(query): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    let now = portal.clock.now();
    let key = match current_key(&portal).await {
        Ok(key) => key,
        Err(response) => return response,
    };
    if let Some(token) = query.token.as_deref() {
        return match admit(token, &key, (&topic, &name), now) {
            Ok(grant) => exchange(token, &grant, now, portal.secure_cookies),
            Err(refusal) => refused(&refusal),
        };
    }
    let admitted = match admit_by_cookie(key, (&topic, &name), &headers, now) {
        Ok(admitted) => admitted,
        Err(refusal) => return refused(&refusal),
    };
    let filter = match Filter::of(&query) {
        Ok(filter) => filter,
        Err(why) => {
            return (StatusCode::BAD_REQUEST, page::failed("Not a filter", &why)).into_response();
        }
    };
    let sub = match read_subscription(&portal, &admitted.grant).await {
        Ok(sub) => sub,
        Err(response) => return response,
    };
    let state = gridrelay_ports::delivery_state(portal.health.as_ref(), &sub, now).await;
    let journal = read_journal(&portal, &filter, now).await;
    let attempts = match &journal {
        Ok(entries) => Ok(attempts(entries, &sub, &filter, now)),
        Err(()) => Err(()),
    };
    let dead_letters = dead_letters(&portal, &sub, &filter, now).await;
    let dropped = match &journal {
        Ok(entries) => dropped(&portal, &sub, entries).await,
        Err(()) => Dropped::Unavailable,
    };
    page::subscription(&page::SubscriptionPage {
        sub: &sub,
        state: &state,
        filter: &filter,
        attempts: attempts.as_deref(),
        dead_letters: &dead_letters,
        dropped: &dropped,
        form_token: &admitted.key.form_token(&admitted.pass),
        can_change: !admitted.grant.view_only,
        expires_at: admitted.grant.expires_at,
    })
    .into_response()
}

/// A subscription's dead-lettered events, as its page lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetters {
    /// It has no dead-letter destination: what cannot be delivered is dropped.
    NotKept,
    /// They cannot be read or sent again now (why is logged, not shown).
    Unavailable,
    /// Those of the span's hours, at most [`MAX_LISTED`], and how many there are in all.
    Listed {
        events: Vec<DeadLetteredEvent>,
        total: usize,
    },
}

/// The dead-lettered events of `sub` in the filter's span (its objects' hours), read as a
/// redrive's dry run reads them: exactly what "send again" can send.
async fn dead_letters(
    portal: &Portal,
    sub: &Subscription,
    filter: &Filter,
    now: DateTime<Utc>,
) -> DeadLetters {
    if sub.dead_letter_destination.is_none() {
        return DeadLetters::NotKept;
    }
    let selection = DeadLetterSelection {
        topic: sub.topic.clone(),
        subscription: Some(sub.name.clone()),
        since: Some(now - TimeDelta::hours(filter.hours)),
        ..DeadLetterSelection::default()
    };
    // A dry run sends nothing.
    let queue = portal.delivery_queue.as_ref();
    match redrive_subscription(portal.objects.as_ref(), queue, sub, &selection, true, now).await {
        Ok(done) if done.skipped.is_none() => {
            let total = done.events.len();
            let mut events = done.events;
            events.truncate(MAX_LISTED);
            DeadLetters::Listed { events, total }
        }
        Ok(done) => {
            tracing::warn!(why = ?done.skipped, topic = %sub.topic, name = %sub.name,
                "the portal lists no dead-lettered events");
            DeadLetters::Unavailable
        }
        Err(e) => {
            tracing::error!(error = %e, topic = %sub.topic, name = %sub.name,
                "the portal could not read dead-lettered events");
            DeadLetters::Unavailable
        }
    }
}

/// A subscription's dropped events ([`DroppedEvent`]), as its page lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dropped {
    /// The journal or the topic could not be read (why is logged, not shown).
    Unavailable,
    /// Those of the span, the latest first, at most [`MAX_LISTED`]; how many there are in all;
    /// whether the topic keeps an archive they can be sent again from.
    Listed {
        events: Vec<DroppedEvent>,
        total: usize,
        from_archive: bool,
    },
}

/// The journal's entries of the filter's span; `Err(())` if it could not be read (why is
/// logged, not shown).
pub(crate) async fn read_journal(
    portal: &Portal,
    filter: &Filter,
    now: DateTime<Utc>,
) -> Result<Vec<JournalEntry>, ()> {
    read_journal_between(portal, now - TimeDelta::hours(filter.hours), now).await
}

/// The journal's entries written from `from` to `to`; `Err(())` as [`read_journal`].
pub(crate) async fn read_journal_between(
    portal: &Portal,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<JournalEntry>, ()> {
    match portal.journal.read_hours(from, to).await {
        Ok(read) => Ok(read.entries),
        Err(e) => {
            tracing::error!(error = %e, "the portal could not read the delivery journal");
            Err(())
        }
    }
}

/// The subscription's attempts of `entries` in the filter's span, newest first, at most
/// [`MAX_LISTED`].
fn attempts(
    entries: &[JournalEntry],
    sub: &Subscription,
    filter: &Filter,
    now: DateTime<Utc>,
) -> Vec<JournalEntry> {
    let since = now - TimeDelta::hours(filter.hours);
    let own = entries.iter().filter(|e| e.time >= sub.created_at);
    latest_attempts(own, &sub.topic, &sub.name, filter.failed, usize::MAX)
        .into_iter()
        .filter(|e| e.time >= since)
        .take(MAX_LISTED)
        .cloned()
        .collect()
}

/// The dropped events of `sub` in `entries`: those it dropped, not an earlier subscription of
/// the same names (dropped before it was made, or its events found replaced by it when they
/// came due). The entries of such an event's life are read whole: it may have been published
/// a moment before the subscription was made.
pub(crate) fn own_dropped_events(
    entries: &[JournalEntry],
    sub: &Subscription,
) -> Vec<DroppedEvent> {
    dropped_events(entries, &sub.topic, &sub.name)
        .into_iter()
        .filter(|d| d.dropped_at >= sub.created_at)
        .filter(|d| d.reason != NotDeliverable::SubscriptionReplaced.as_str())
        .collect()
}

/// The subscription's dropped events in `entries`, and whether its topic keeps an archive.
async fn dropped(portal: &Portal, sub: &Subscription, entries: &[JournalEntry]) -> Dropped {
    let mut events = own_dropped_events(entries, sub);
    let from_archive = match portal.store.get_topic(&sub.topic).await {
        Ok(topic) => topic.is_some_and(|t| t.retention_days > 0),
        Err(e) => {
            tracing::error!(error = %e, topic = %sub.topic, "the portal could not read a topic");
            return Dropped::Unavailable;
        }
    };
    let total = events.len();
    events.truncate(MAX_LISTED);
    Dropped::Listed {
        events,
        total,
        from_archive,
    }
}

/// A link's first load: its token into a cookie for its subscription's path only, until it
/// expires, and on to the page without the token.
fn exchange(token: &str, grant: &PortalGrant, now: DateTime<Utc>, secure: bool) -> Response {
    let path = page_path(&grant.topic, &grant.subscription);
    let max_age = (grant.expires_at - now).num_seconds().max(0);
    // Lax, not Strict: a link opened from a mail or a chat is a navigation from another site,
    // and the page it is sent on to must get the cookie. Nothing a GET does changes anything.
    let cookie = format!(
        "{COOKIE}={token}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Lax{}",
        if secure { "; Secure" } else { "" }
    );
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, path)]).into_response();
    match HeaderValue::from_str(&cookie) {
        Ok(value) => {
            response.headers_mut().insert(header::SET_COOKIE, value);
            response
        }
        // A token read and checked is base64url and dots: this cannot happen.
        Err(_) => refused(&Refusal::Link(LinkRefusal::Malformed)),
    }
}

/// The values of the cookies named `name` (a browser sends each path's of the same name).
pub fn cookies(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(n, _)| *n == name)
        .map(|(_, v)| v.to_string())
        .collect()
}

pub(crate) fn refused(refusal: &Refusal) -> Response {
    (
        StatusCode::FORBIDDEN,
        page::failed("This link cannot be used", &refusal.text()),
    )
        .into_response()
}

pub(crate) fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        page::failed(
            "Not available",
            "The portal cannot show this now. Try again in a minute.",
        ),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PortalKey {
        PortalKey::new(&"k".repeat(64)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Subscription billing of topic orders, made at `now`.
    fn billing(now: DateTime<Utc>) -> Subscription {
        gridrelay_shared::subscription::SubscriptionRequest {
            topic: "orders".into(),
            name: "billing".into(),
            endpoint: "https://example.com/hook".into(),
            ..Default::default()
        }
        .validate(Default::default(), now)
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_token_is_admitted_for_its_own_subscription_only() {
        let now = Utc::now();
        let sub = billing(now);
        let grant =
            PortalGrant::new(&sub, now, TimeDelta::hours(1), "f").unwrap_or_else(|e| panic!("{e}"));
        let token = grant.token(&key());
        assert_eq!(admit(&token, &key(), ("orders", "billing"), now), Ok(grant));
        assert_eq!(
            admit(&token, &key(), ("orders", "shipping"), now),
            Err(Refusal::OtherSubscription)
        );
        assert!(matches!(
            admit(
                &token,
                &key(),
                ("orders", "billing"),
                now + TimeDelta::hours(2)
            ),
            Err(Refusal::Link(LinkRefusal::Expired { .. }))
        ));
    }

    /// #36: a subscription's page and send again take only the drops that are its own: not
    /// one before it was made, nor its predecessor's events found replaced by it; one
    /// published a moment before it was made and dropped by it is.
    #[test]
    fn only_its_own_drops_are_a_subscriptions() {
        use gridrelay_shared::journal::Step;
        let now = Utc::now();
        let sub = billing(now);
        let entry = |id: &str, seconds: i64, step: Step| JournalEntry {
            topic: "orders".into(),
            subscription: "billing".into(),
            ids: vec![id.into()],
            time: now + TimeDelta::seconds(seconds),
            delivery: None,
            step,
        };
        let dropped = |reason: &str| Step::Dropped {
            reason: reason.into(),
        };
        let entries = [
            entry("old", -60, dropped("SubscriptionDeleted")),
            entry("replaced", 5, dropped("SubscriptionReplaced")),
            entry(
                "edge",
                -1,
                Step::Fanned {
                    event_type: "t".into(),
                    subject: String::new(),
                    bytes: 1,
                    replay: None,
                    redrive: None,
                },
            ),
            entry("edge", 10, dropped("SubscriptionNotValidated")),
        ];
        let own = own_dropped_events(&entries, &sub);
        let ids: Vec<&str> = own.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["edge"]);
        assert_eq!(own[0].published, Some(now - TimeDelta::seconds(1)));
    }

    #[test]
    fn filters_outside_the_choices_are_named() {
        let q = |since: &str, outcome: &str| PageQuery {
            token: None,
            since: Some(since.into()),
            outcome: Some(outcome.into()),
        };
        assert_eq!(
            Filter::of(&q("6h", "failed")),
            Ok(Filter {
                since: "6h",
                hours: 6,
                failed: true
            })
        );
        assert_eq!(
            Filter::of(&PageQuery::default()).map(|f| (f.hours, f.failed)),
            Ok((1, false))
        );
        let e = Filter::of(&q("7d", "all")).err().unwrap_or_default();
        assert!(
            e.contains("since") && e.contains("7d") && e.contains("24h"),
            "{e}"
        );
        let e = Filter::of(&q("1h", "ok")).err().unwrap_or_default();
        assert!(
            e.contains("outcome") && e.contains("\"ok\"") && e.contains("failed"),
            "{e}"
        );
    }

    #[test]
    fn a_pages_path_keeps_names_as_they_are_written() {
        assert_eq!(
            page_path("order-events", "billing-v2"),
            "/portal/order-events/billing-v2"
        );
        assert_eq!(page_path("a/b", "c d"), "/portal/a%2Fb/c%20d");
    }

    #[test]
    fn cookies_of_a_name_are_read_from_every_header() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; gridrelay_portal=x"),
        );
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("gridrelay_portal=y"),
        );
        assert_eq!(cookies(&headers, COOKIE), vec!["x", "y"]);
    }
}
