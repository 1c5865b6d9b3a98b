//! `gridrelay console` (#36): an operator console on 127.0.0.1, served by this binary with the
//! operator's own AWS credentials, against a deployed stack or `gridrelay local`.
//!
//! Pages: the overview (every topic's subscriptions, their state, counts, latency and last
//! failure over the last hour), one subscription (its attempts, its dead letters with a redrive
//! of the picked ones, its settings) and one event (found by id, its life as `event show`
//! tells it), and the live page ([`live`]: the journal's entries as they are written). What
//! the pages read and do goes through the command line's own code
//! ([`sources`]); who may use them is [`guard`]'s to say.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::Utc;
use clap::Args;
use gridrelay_ports::redrive::DeadLetterSelection;
use gridrelay_shared::journal::parse_since;
use gridrelay_shared::limits::{validate_subscription_name, validate_topic_name};
use serde::Deserialize;

mod change;
mod guard;
mod live;
mod pages;
mod portal_link;
mod replay;
mod signing;
mod sources;

use sources::Sources;
pub(super) use sources::{ConsoleResources, PortalLinks, ReplayPlaces};

#[derive(Args)]
pub(super) struct ConsoleArgs {
    /// Address the console answers at: a loopback address (it acts with your AWS
    /// credentials); port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:7072")]
    pub(super) listen: SocketAddr,
}

/// What every handler shares.
struct Console {
    sources: Sources,
    guard: guard::Guard,
}

type Shared = State<Arc<Console>>;

/// A console started: its address and the URL that opens it (with the run's token).
pub(super) struct Started {
    pub(super) url: String,
    pub(super) served: tokio::task::JoinHandle<()>,
}

/// Starts the console on `listen` (loopback only) over `resources`.
pub(super) async fn start(
    listen: SocketAddr,
    resources: ConsoleResources,
) -> anyhow::Result<Started> {
    check_listen(listen, "--listen")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("could not listen at {listen}"))?;
    let addr = listener.local_addr()?;
    let guard = guard::Guard::new(&guard::Guard::new_token(), addr);
    let console = Arc::new(Console {
        sources: Sources::new(resources).await,
        guard: guard.clone(),
    });
    let app = Router::new()
        .route("/", get(overview))
        .route(pages::STYLE_PATH, get(style))
        .route("/subscriptions/{topic}/{name}", get(subscription))
        .route(
            "/subscriptions/{topic}/{name}/redrive",
            axum::routing::post(redrive),
        )
        .route("/events", get(event))
        .route(
            "/subscriptions/{topic}/{name}/signing-secret",
            axum::routing::post(signing::rotate),
        )
        .route(
            "/subscriptions/{topic}/{name}/replay",
            axum::routing::post(replay::replay),
        )
        .route(
            "/subscriptions/{topic}/{name}/portal-link",
            axum::routing::post(portal_link::make),
        )
        .route("/live", get(live::page))
        .route("/live/entries", get(live::entries))
        .route(pages::SCRIPT_PATH, get(script))
        .with_state(console)
        .layer(axum::middleware::from_fn_with_state(
            guard.clone(),
            guard::guard,
        ));
    let served = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the console stopped");
        }
    });
    Ok(Started {
        url: guard.url(),
        served,
    })
}

/// The console listens on 127.0.0.1 or ::1 only: it acts with the operator's AWS
/// credentials, and answers only requests naming its address or `localhost`.
/// (`flag`: the flag it was given with).
pub(super) fn check_listen(listen: SocketAddr, flag: &str) -> anyhow::Result<()> {
    let loopback: [std::net::IpAddr; 2] = [
        std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::Ipv6Addr::LOCALHOST.into(),
    ];
    if loopback.contains(&listen.ip()) {
        return Ok(());
    }
    Err(crate::invalid(gridrelay_shared::limits::LimitError::new(
        flag,
        listen.to_string(),
        "127.0.0.1:<port> or [::1]:<port>: the console acts with your AWS credentials",
    )))
}

/// `gridrelay console`: started, its URL printed, served until stopped.
pub(super) async fn run_console(
    args: ConsoleArgs,
    resources: ConsoleResources,
) -> anyhow::Result<()> {
    let started = start(args.listen, resources).await?;
    crate::print(&serde_json::json!({ "console": started.url }))?;
    eprintln!("open {} (stop with Ctrl-C)", started.url);
    tokio::select! {
        _ = crate::local::wait_for_stop_signal() => Ok(()),
        _ = started.served => anyhow::bail!("the console stopped serving (see the log above)"),
    }
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        pages::STYLE,
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        pages::SCRIPT,
    )
        .into_response()
}

fn failed(status: StatusCode, title: &str, e: &anyhow::Error) -> Response {
    (status, pages::failed(title, &format!("{e:#}"))).into_response()
}

async fn overview(State(console): Shared) -> Response {
    match console.sources.overview(Utc::now()).await {
        Ok(o) => pages::overview(&o).into_response(),
        Err(e) => failed(StatusCode::BAD_GATEWAY, "Topics and subscriptions", &e),
    }
}

#[derive(Deserialize)]
struct AttemptQuery {
    outcome: Option<String>,
    since: Option<String>,
    dead_since: Option<String>,
}

/// Attempts listed on a subscription's page at most.
const ATTEMPTS_SHOWN: usize = 100;
/// Dead-lettered events listed on a subscription's page at most.
const DEAD_LETTERS_SHOWN: usize = 200;
/// The outcomes the attempts can be filtered by.
const OUTCOMES: [&str; 3] = ["all", "failed", "succeeded"];

async fn subscription(
    State(console): Shared,
    Path((topic, name)): Path<(String, String)>,
    Query(q): Query<AttemptQuery>,
) -> Response {
    let now = Utc::now();
    let sub = match existing(&console, &topic, &name).await {
        Ok(sub) => sub,
        Err(response) => return response,
    };
    let filter = pages::AttemptFilter {
        outcome: q.outcome.unwrap_or_else(|| "all".into()),
        since: q.since.unwrap_or_else(|| "1h".into()),
        dead_since: q.dead_since.unwrap_or_else(|| "7d".into()),
    };
    let attempts = match parse_since(&filter.since, now) {
        Err(e) => Err(format!("Since: {e}")),
        Ok(_) if !OUTCOMES.contains(&filter.outcome.as_str()) => Err(format!(
            "Outcome: {:?} is not one of {}",
            filter.outcome,
            OUTCOMES.join(", ")
        )),
        Ok(since) => {
            let (failed, succeeded) = (filter.outcome == "failed", filter.outcome == "succeeded");
            console
                .sources
                .attempts(&topic, &name, since, failed, usize::MAX, now)
                .await
                .map(|all| {
                    all.into_iter()
                        .filter(|e| !succeeded || is_success(e))
                        .take(ATTEMPTS_SHOWN)
                        .collect::<Vec<_>>()
                })
                .map_err(|e| format!("{e:#}"))
        }
    };
    let dead_letters = dead_letters(&console, &sub, &filter.dead_since, now).await;
    let mut settings = crate::view::subscription_view(&sub);
    settings["deliveryStatus"] = console.sources.delivery_status(&sub).await;
    let state = console.sources.state_of(&sub, now).await;
    pages::subscription(&pages::SubscriptionPage {
        sub: &sub,
        state: &state,
        settings: &settings,
        filter: &filter,
        attempts: attempts.as_deref().map_err(Clone::clone),
        dead_letters: dead_letters.as_ref().map_err(Clone::clone),
        token: console.guard.token(),
        makes_portal_links: console.sources.makes_portal_links(),
    })
    .into_response()
}

/// The subscription's dead-lettered events in objects of the hours since `since`, as a dry
/// run of `redrive dead-letters` lists them (at most [`DEAD_LETTERS_SHOWN`]).
async fn dead_letters(
    console: &Console,
    sub: &gridrelay_shared::subscription::Subscription,
    since: &str,
    now: chrono::DateTime<Utc>,
) -> Result<pages::DeadLetters, String> {
    let since = parse_since(since, now).map_err(|e| format!("Since: {e}"))?;
    let selection = DeadLetterSelection {
        topic: sub.topic.clone(),
        subscription: Some(sub.name.clone()),
        since: Some(since),
        ..DeadLetterSelection::default()
    };
    let report = console
        .sources
        .redrive(&selection, true)
        .await
        .map_err(|e| format!("The dead letters could not be read: {e:#}"))?;
    let mut found = report.subscriptions.into_iter().next().unwrap_or_default();
    let more = found.events.len().saturating_sub(DEAD_LETTERS_SHOWN);
    found.events.truncate(DEAD_LETTERS_SHOWN);
    Ok(pages::DeadLetters {
        more,
        left: found.left,
        others: found.objects_of_other_subscriptions,
        skipped: found.skipped,
        events: found.events,
    })
}

fn is_success(e: &gridrelay_shared::journal::JournalEntry) -> bool {
    matches!(&e.step, gridrelay_shared::journal::Step::Attempt(a)
        if a.outcome == gridrelay_shared::classify::DeliveryOutcome::Succeeded)
}

/// The subscription named in a page's path, or the page that says why not.
async fn existing(
    console: &Console,
    topic: &str,
    name: &str,
) -> Result<gridrelay_shared::subscription::Subscription, Response> {
    let title = "Subscription";
    if let Err(e) = validate_topic_name(topic).and_then(|()| validate_subscription_name(name)) {
        return Err((
            StatusCode::BAD_REQUEST,
            pages::failed(title, &e.to_string()),
        )
            .into_response());
    }
    match console.sources.subscription(topic, name).await {
        Ok(Some(sub)) => Ok(sub),
        Ok(None) => Err((
            StatusCode::NOT_FOUND,
            pages::failed(
                title,
                &format!("Event subscription {name} on topic {topic} does not exist."),
            ),
        )
            .into_response()),
        Err(e) => Err(failed(StatusCode::BAD_GATEWAY, title, &e)),
    }
}

/// The answer to a change whose form does not carry this run's token (the cookie came with
/// it: the guard checked), or `None` when it does.
fn without_token(console: &Console, token: Option<&str>) -> Option<Response> {
    if token.is_some_and(|t| console.guard.token_matches(t)) {
        return None;
    }
    let why = "A change must carry this run's token in its form.";
    Some(
        (
            StatusCode::FORBIDDEN,
            pages::refused(StatusCode::FORBIDDEN, why),
        )
            .into_response(),
    )
}

/// `POST /subscriptions/{topic}/{name}/redrive`: the picked records (`pick`: each its
/// event's id and its object, [`pages::pick_value`]), asked about first; redriven once
/// `confirm=yes` comes with them.
async fn redrive(State(console): Shared, change::Change { form, sub }: change::Change) -> Response {
    let records: Vec<_> = form.values("pick").filter_map(pages::parse_pick).collect();
    let confirmed = form.says_yes("confirm");
    if records.is_empty() {
        return pages::confirm_redrive(&sub, &[], console.guard.token()).into_response();
    }
    let selection = DeadLetterSelection {
        topic: sub.topic.clone(),
        subscription: Some(sub.name.clone()),
        records,
        ..DeadLetterSelection::default()
    };
    match console.sources.redrive(&selection, !confirmed).await {
        Ok(report) if !confirmed => {
            let events: Vec<_> = report
                .subscriptions
                .into_iter()
                .flat_map(|s| s.events)
                .collect();
            pages::confirm_redrive(&sub, &events, console.guard.token()).into_response()
        }
        Ok(report) => pages::redrive_done(&sub, &report).into_response(),
        Err(e) => failed(StatusCode::BAD_GATEWAY, "Redrive", &e),
    }
}

#[derive(Deserialize)]
struct EventForm {
    topic: Option<String>,
    id: Option<String>,
    since: Option<String>,
}

async fn event(State(console): Shared, Query(q): Query<EventForm>) -> Response {
    let now = Utc::now();
    let topics = match console.sources.topic_names().await {
        Ok(t) => t,
        Err(e) => return failed(StatusCode::BAD_GATEWAY, "Find an event", &e),
    };
    let query = pages::EventQuery {
        topic: q
            .topic
            .or_else(|| topics.first().cloned())
            .unwrap_or_default(),
        id: q.id.unwrap_or_default(),
        since: q.since.unwrap_or_else(|| "24h".into()),
    };
    let life = if query.id.is_empty() {
        None
    } else {
        Some(match parse_since(&query.since, now) {
            Err(e) => Err(format!("Since: {e}")),
            Ok(since) => console
                .sources
                .event_life(&query.topic, &query.id, since, now)
                .await
                .map_err(|e| format!("{e:#}")),
        })
    };
    pages::event(&query, &topics, life).into_response()
}
