//! The console's pages, rendered on the server from what [`super::sources`] read: plain HTML
//! (maud escapes every value, so an endpoint's answer shown on a page is text, never markup),
//! one style sheet embedded in the binary, and one script, the live page's, which makes every
//! cell as text too.

use axum::http::StatusCode;
use gridrelay_ports::redrive::{DeadLetterRedriveReport, DeadLetteredEvent};
use gridrelay_shared::activity::{Activity, Slice};
use gridrelay_shared::health::DeliveryState;
use gridrelay_shared::journal::{EventLife, JournalEntry, format_time};
use gridrelay_shared::subscription::Subscription;
use maud::{DOCTYPE, Markup, html};
use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

pub(super) use gridrelay_portal::page::{endpoint_text, first_chars, state_badge};

use super::sources::{Overview, SubscriptionRow};
use crate::journal::{STEP_COLUMNS, delivery_text, standing_text, step_row};

/// The live page's script, served at [`SCRIPT_PATH`].
pub(super) const SCRIPT: &str = include_str!("console.js");
pub(super) const SCRIPT_PATH: &str = "/console.js";

/// The style sheet, served at [`STYLE_PATH`].
pub(super) const STYLE: &str = gridrelay_portal::STYLE;
pub(super) const STYLE_PATH: &str = "/console.css";

/// A value for a URL's path segment or query: everything but letters and digits
/// percent-encoded.
pub(super) fn enc(value: &str) -> String {
    utf8_percent_encode(value, NON_ALPHANUMERIC).to_string()
}

/// A dead-lettered record as a form's value: its event's id (encoded: no space in it), a
/// space, its object. `None` for a record whose event has no id.
pub(super) fn pick_value(e: &DeadLetteredEvent) -> Option<String> {
    e.id.as_ref()
        .map(|id| format!("{} {}", enc(id), e.location))
}

/// A record picked in a form ([`pick_value`]): its object and its event's id.
pub(super) fn parse_pick(value: &str) -> Option<(String, String)> {
    let (id, location) = value.split_once(' ')?;
    let id = percent_decode_str(id).decode_utf8().ok()?;
    Some((location.to_string(), id.into_owned()))
}

/// `n` and `what`, singular or plural (`what` takes an s).
fn counted(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// A subscription's page.
pub(super) fn subscription_href(topic: &str, name: &str) -> String {
    format!("/subscriptions/{}/{}", enc(topic), enc(name))
}

pub(super) fn event_href(topic: &str, id: &str) -> String {
    format!("/events?topic={}&id={}", enc(topic), enc(id))
}

/// Every page: its title, the navigation and `body`.
pub(super) fn layout(title: &str, body: Markup) -> Markup {
    layout_with_script(title, body, None)
}

/// A page with a script of the console's own (served at `script`).
fn layout_with_script(title: &str, body: Markup, script: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="same-origin";
                title { (title) " · gridrelay console" }
                link rel="stylesheet" href=(STYLE_PATH);
                @if let Some(src) = script { script src=(src) defer {} }
            }
            body {
                a class="skip" href="#main" { "Skip to the content" }
                header {
                    nav aria-label="Console" {
                        a href="/" { "Overview" }
                        a href="/events" { "Find an event" }
                        a href="/live" { "Live" }
                    }
                }
                main id="main" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// A refused request's page.
pub(super) fn refused(status: StatusCode, why: &str) -> Markup {
    layout(
        status.canonical_reason().unwrap_or("Refused"),
        html! { p { (why) } },
    )
}

/// A page that could not be made: what went wrong.
pub(super) fn failed(title: &str, why: &str) -> Markup {
    layout(title, html! { p class="error" role="alert" { (why) } })
}

/// Milliseconds, for people.
fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1_000.0),
        _ => format!("{:.1} min", ms as f64 / 60_000.0),
    }
}

/// The window's slices as bars: delivered below, failed on top.
fn chart(slices: &[Slice], minutes_each: i64) -> Markup {
    let most = slices
        .iter()
        .map(|s| s.delivered + s.failed)
        .max()
        .unwrap_or(0)
        .max(1);
    let delivered: u64 = slices.iter().map(|s| s.delivered).sum();
    let failed: u64 = slices.iter().map(|s| s.failed).sum();
    let label = format!(
        "{delivered} delivered and {failed} failed, in {} slices of {minutes_each} minutes",
        slices.len()
    );
    let height = 24.0;
    let bar = |n: u64| (n as f64 / most as f64 * height).max(if n > 0 { 1.0 } else { 0.0 });
    html! {
        svg class="chart" role="img" aria-label=(label) width=(slices.len() * 8) height="24"
            viewBox={"0 0 " (slices.len() * 8) " 24"} {
            title { (label) }
            @for (i, s) in slices.iter().enumerate() {
                @let d = bar(s.delivered);
                @let f = bar(s.failed);
                @if d > 0.0 { rect class="delivered" x=(i * 8) y=(height - d) width="7" height=(d) {} }
                @if f > 0.0 { rect class="failed" x=(i * 8) y=(height - d - f) width="7" height=(f) {} }
            }
        }
    }
}

fn last_failure(row: &SubscriptionRow) -> Markup {
    let journal = row.activity.last_failure.as_ref();
    let health = row.health.as_ref().and_then(|h| h.last_failure);
    html! {
        @if let Some(f) = journal {
            (format_time(f.time)) ": "
            strong { (f.status.map(|s| s.to_string()).unwrap_or_else(|| "no answer".into())) }
            " " (f.outcome.as_str())
            @if let Some(detail) = &f.detail { br; span class="answer" { (first_chars(detail, 80)) } }
        } @else if let Some(f) = health {
            (format_time(f.at)) ": "
            strong { (f.status.map(|s| s.to_string()).unwrap_or_else(|| "no answer".into())) }
            " " (f.outcome.as_str())
        } @else {
            "none"
        }
    }
}

fn latency(a: &Activity) -> Markup {
    html! {
        @match &a.latency {
            Some(l) => { (duration(l.p50_ms)) " / " (duration(l.p99_ms)) }
            None => { "–" }
        }
    }
}

/// The overview: every topic's subscriptions at a glance.
pub(super) fn overview(o: &Overview) -> Markup {
    let minutes_each = (o.window.to - o.window.from).num_minutes()
        / i64::try_from(o.window.slices.max(1)).unwrap_or(1);
    layout(
        "Topics and subscriptions",
        html! {
            p class="lede" {
                "The last hour, from " (format_time(o.window.from)) " to " (format_time(o.window.to))
                ", from the delivery journal. Last hour: a bar per " (minutes_each) " minutes, events \
                delivered from the bottom (green) and events in failed attempts stacked on top (red). \
                Latency: from an event's sending (publish, replay or redrive) to its answer, over \
                the events sent and delivered within the journal hours read."
            }
            @if let Some(e) = &o.journal_error {
                p class="error" role="alert" { "The journal could not be read: " (e) }
            }
            @if o.skipped_lines > 0 {
                p { (o.skipped_lines) " journal lines of a kind this version does not know were skipped." }
            }
            p {
                "Delivery queue (all subscriptions): "
                @match &o.queue {
                    Ok(q) => {
                        (count(q.visible)) " waiting, " (count(q.delayed)) " delayed, "
                        (count(q.in_flight)) " in flight"
                    }
                    Err(e) => { "could not be read (" (e) ")" }
                }
            }
            @if o.topics.is_empty() {
                p { "No topics yet: create one with " code { "gridrelay topic create" } "." }
            }
            @for (topic, rows) in &o.topics {
                section aria-labelledby={"topic-" (topic.name)} {
                    h2 id={"topic-" (topic.name)} { "Topic " (topic.name) }
                    @if rows.is_empty() {
                        p { "No event subscriptions." }
                    } @else {
                        table {
                            caption { "Event subscriptions of " (topic.name) }
                            (head(&["Subscription", "Endpoint", "State", "Delivered", "Failed",
                                "Dead-lettered", "Latency p50 / p99", "Last hour", "Last failure"],
                                &["Delivered", "Failed", "Dead-lettered"]))
                            tbody {
                                @for row in rows {
                                    tr {
                                        th scope="row" {
                                            a href=(subscription_href(&row.sub.topic, &row.sub.name)) { (row.sub.name) }
                                        }
                                        td class="endpoint" { (endpoint_text(&row.sub)) }
                                        td { (state_badge(&row.state)) }
                                        td class="num" { (row.activity.delivered) }
                                        td class="num" { (row.activity.failed) }
                                        td class="num" { (row.activity.dead_lettered) }
                                        td { (latency(&row.activity)) }
                                        td { (chart(&row.activity.slices, minutes_each)) }
                                        td { (last_failure(row)) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// A table's header row; the columns named in `numeric` are right-aligned.
fn head(columns: &[&str], numeric: &[&str]) -> Markup {
    html! {
        thead { tr { @for c in columns {
            th scope="col" class=[numeric.contains(c).then_some("num")] { (c) }
        } } }
    }
}

fn count(n: Option<u64>) -> String {
    n.map(|n| n.to_string()).unwrap_or_else(|| "?".into())
}

/// The filters a subscription's page shows: its attempts' outcome and span, and its dead
/// letters' span.
pub(super) struct AttemptFilter {
    pub(super) outcome: String,
    pub(super) since: String,
    pub(super) dead_since: String,
}

/// A subscription's dead letters, as a dry-run redrive found them.
pub(super) struct DeadLetters {
    /// Those listed (at most the page's limit), in the order read.
    pub(super) events: Vec<DeadLetteredEvent>,
    /// How many more there are.
    pub(super) more: usize,
    /// Records left in their objects: unreadable, or another schema's.
    pub(super) left: usize,
    /// Objects of an earlier subscription of the same name: never redriven to this one.
    pub(super) others: usize,
    /// Why none can be redriven to it (no dead-letter destination, not provisioned).
    pub(super) skipped: Option<String>,
}

/// What a subscription's page shows.
pub(super) struct SubscriptionPage<'a> {
    pub(super) sub: &'a Subscription,
    pub(super) state: &'a DeliveryState,
    /// `show`'s JSON, with its `deliveryStatus`.
    pub(super) settings: &'a serde_json::Value,
    pub(super) filter: &'a AttemptFilter,
    pub(super) attempts: Result<&'a [JournalEntry], String>,
    pub(super) dead_letters: Result<&'a DeadLetters, String>,
    pub(super) token: &'a str,
    /// Whether a subscribers' portal link can be made (the portal key's secret is known).
    pub(super) makes_portal_links: bool,
}

/// One subscription: its state and settings, its attempts and its dead letters.
pub(super) fn subscription(p: &SubscriptionPage<'_>) -> Markup {
    let sub = p.sub;
    let href = subscription_href(&sub.topic, &sub.name);
    layout(
        &format!("Subscription {} of topic {}", sub.name, sub.topic),
        html! {
            p { "Endpoint " code { (endpoint_text(sub)) } ". State: " (state_badge(p.state)) }
            section aria-labelledby="attempts" {
                h2 id="attempts" { "Attempts" }
                form method="get" action=(href) class="filter" {
                    label for="outcome" { "Outcome" }
                    select id="outcome" name="outcome" {
                        @for (value, text) in [("all", "All"), ("failed", "Failed"), ("succeeded", "Succeeded")] {
                            option value=(value) selected[p.filter.outcome == value] { (text) }
                        }
                    }
                    label for="since" { "Since (a span such as 90m, 6h, 7d, or an RFC 3339 time)" }
                    input id="since" name="since" value=(p.filter.since);
                    button type="submit" { "Show" }
                }
                @match &p.attempts {
                    Err(e) => { p class="error" role="alert" { (e) } }
                    Ok([]) => { p { "No attempts in this window." } }
                    Ok(attempts) => { (attempts_table(&sub.topic, attempts)) }
                }
            }
            section aria-labelledby="dead-letters" {
                h2 id="dead-letters" { "Dead letters" }
                form method="get" action={(href) "#dead-letters"} class="filter" {
                    input type="hidden" name="outcome" value=(p.filter.outcome);
                    input type="hidden" name="since" value=(p.filter.since);
                    label for="dead_since" { "In objects since (a span such as 6h, 7d, or an RFC 3339 time)" }
                    input id="dead_since" name="dead_since" value=(p.filter.dead_since);
                    button type="submit" { "Show" }
                }
                @match &p.dead_letters {
                    Err(e) => { p class="error" role="alert" { (e) } }
                    Ok(d) => { (dead_letters(sub, d, p.token)) }
                }
            }
            (super::replay::section(sub, p.token, chrono::Utc::now()))
            (super::signing::section(sub, p.token))
            (super::portal_link::section(sub, p.token, p.makes_portal_links))
            section aria-labelledby="settings" {
                h2 id="settings" { "Settings" }
                p { "As " code { "gridrelay event-subscription show" } " prints them." }
                pre class="json" tabindex="0" role="region" aria-label="The subscription's settings, as JSON" {
                    (serde_json::to_string_pretty(p.settings).unwrap_or_default())
                }
            }
        },
    )
}

/// The dead letters' table, each with a box to pick it for a redrive.
fn dead_letters(sub: &Subscription, d: &DeadLetters, token: &str) -> Markup {
    let href = subscription_href(&sub.topic, &sub.name);
    html! {
        @if let Some(why) = &d.skipped {
            p { "None can be redriven: " (why) "." }
        } @else if d.events.is_empty() {
            p { "None in this window." }
        } @else {
            form method="post" action={(href) "/redrive"} {
                input type="hidden" name="token" value=(token);
                table {
                    caption { "Dead-lettered events: pick those to deliver again" }
                    (head(&["Redrive", "Event", "Reason", "Object"], &[]))
                    tbody {
                        @for e in &d.events {
                            tr {
                                td {
                                    @if let (Some(id), Some(value)) = (&e.id, pick_value(e)) {
                                        input type="checkbox" name="pick" value=(value)
                                            aria-label={"Redrive event " (id)};
                                    }
                                }
                                td { @match &e.id {
                                    Some(id) => { a href=(event_href(&sub.topic, id)) { (id) } }
                                    None => { "(no id: redrive it with gridrelay redrive dead-letters)" }
                                } }
                                td { (e.reason) }
                                td class="endpoint" { (e.location) }
                            }
                        }
                    }
                }
                button type="submit" { "Redrive selected…" }
            }
        }
        @if d.more > 0 { p { (counted(d.more, "more event")) " not listed: narrow the window." } }
        @if d.left > 0 { p { (counted(d.left, "record")) " in these objects could not be read as this subscription's." } }
        @if d.others > 0 {
            p { (counted(d.others, "object")) " of an earlier subscription of the same name: never redriven to this one." }
        }
    }
}

fn attempts_table(topic: &str, attempts: &[JournalEntry]) -> Markup {
    html! {
        table {
            caption { "Attempts, newest first" }
            (head(&["Time", "Attempt", "Events", "Status", "Outcome", "Ms", "Next", "Error or answer"], &["Ms"]))
            tbody {
                @for e in attempts {
                    @let row = step_row(e);
                    tr {
                        td { (row[1]) }
                        td { (row[2]) }
                        td {
                            @if let Some(id) = e.ids.first() {
                                a href=(event_href(topic, id)) { (id) }
                                @if e.ids.len() > 1 { " and " (e.ids.len() - 1) " more" }
                            }
                        }
                        td { (row[4]) }
                        td { (row[5]) }
                        td class="num" { (row[6]) }
                        td { (row[7]) }
                        td class="answer" { (first_chars(&row[8], 200)) }
                    }
                }
            }
        }
    }
}

/// What the live page shows.
pub(super) struct LivePage<'a> {
    pub(super) topics: &'a [String],
    pub(super) filter: &'a super::live::LiveFilter,
    pub(super) look: Result<&'a super::live::LiveLook, String>,
    /// The journal's stream, and how long it gathers entries (or why that is not known).
    pub(super) stream: Option<&'a str>,
    pub(super) buffer: &'a Result<Option<std::time::Duration>, String>,
}

/// The live page: the entries written lately, newest first, which its script keeps adding to.
pub(super) fn live(p: &LivePage<'_>) -> Markup {
    let lag = match (p.stream, p.buffer) {
        (Some(stream), Ok(Some(buffer))) => format!(
            "The journal's stream {stream} gathers entries for up to {} s before it writes them \
             (its buffering interval): a step shows here up to that long after it happens.",
            buffer.as_secs()
        ),
        (_, Ok(_)) => "The journal's stream does not say how long it gathers entries.".into(),
        (_, Err(why)) => format!("How far behind the journal is cannot be said: {why}."),
    };
    layout_with_script(
        "Live",
        html! {
            p class="lede" {
                "The journal's entries as they are written: attempts, holds, dead letters and drops. "
                "The page looks again every 3 seconds (without scripts, reload it)."
            }
            p { (lag) }
            form method="get" action="/live" class="filter" {
                label for="topic" { "Topic" }
                select id="topic" name="topic" {
                    option value="" { "All topics" }
                    @for t in p.topics {
                        option value=(t) selected[p.filter.topic.as_deref() == Some(t.as_str())] { (t) }
                    }
                }
                label for="subscription" { "Subscription" }
                input id="subscription" name="subscription"
                    value=(p.filter.subscription.as_deref().unwrap_or_default());
                button type="submit" { "Show" }
            }
            @match &p.look {
                Err(e) => { p class="error" role="alert" { (e) } }
                Ok(look) => {
                    div class="live-controls" {
                        button type="button" id="live-pause" aria-pressed="false" hidden { "Pause" }
                        p id="live-status" role="status" aria-live="polite" {}
                    }
                    p id="live-newest" data-newest=[&look.newest] {
                        @match &look.newest {
                            Some(t) => { "Newest entry read: " (t) "." }
                            None => { "Nothing written in the last 15 minutes." }
                        }
                    }
                    @if look.skipped > 0 { p { (counted(look.skipped, "line")) " could not be read." } }
                    table class="live" {
                        caption { "Journal entries, newest first" }
                        // `event show`'s columns, which `console.js` makes too.
                        (head(&STEP_COLUMNS, &["Ms"]))
                        tbody id="live-rows" data-next=(look.next) data-filter=(p.filter.query())
                            data-kept=(super::live::ROWS_KEPT)
                            data-objects=(serde_json::to_string(&super::live::objects_of(&look.rows)).unwrap_or_default()) {
                            @for r in look.rows.iter().rev().take(super::live::ROWS_KEPT) {
                                tr data-id=(r.id) {
                                    td { a href=(r.subscription_href) { (r.topic) " / " (r.subscription) } }
                                    td { (r.time) }
                                    td { (r.step) }
                                    td {
                                        @if let (Some(id), Some(href)) = (&r.event, &r.event_href) {
                                            a href=(href) { (id) }
                                            @if r.more_events > 0 { " and " (r.more_events) " more" }
                                        }
                                    }
                                    td { (r.status) }
                                    td { (r.outcome) }
                                    td class="num" { (r.ms) }
                                    td class="where" { (r.next) }
                                    td class="answer" { (r.detail) }
                                }
                            }
                        }
                    }
                }
            }
        },
        Some(SCRIPT_PATH),
    )
}

/// The event search's fields.
pub(super) struct EventQuery {
    pub(super) topic: String,
    pub(super) id: String,
    pub(super) since: String,
}

/// Find an event by id, and its life as `event show` tells it.
pub(super) fn event(
    q: &EventQuery,
    topics: &[String],
    life: Option<Result<EventLife, String>>,
) -> Markup {
    layout(
        "Find an event",
        html! {
            form method="get" action="/events" class="filter" {
                label for="topic" { "Topic" }
                select id="topic" name="topic" {
                    @for t in topics { option value=(t) selected[*t == q.topic] { (t) } }
                }
                label for="id" { "Event id" }
                input id="id" name="id" value=(q.id) required;
                label for="since" { "Since (a span such as 90m, 6h, 7d, or an RFC 3339 time)" }
                input id="since" name="since" value=(q.since);
                button type="submit" { "Find" }
            }
            @match life {
                None => {}
                Some(Err(e)) => { p class="error" role="alert" { (e) } }
                Some(Ok(life)) if life.subscriptions.is_empty() => {
                    p role="status" {
                        "No journal entry of event " code { (q.id) } " of topic " (q.topic)
                        " since " (q.since) ". Try a longer span; on AWS, entries appear once the \
                        journal's stream has written them."
                    }
                }
                Some(Ok(life)) => {
                    @for s in &life.subscriptions {
                        section aria-labelledby={"life-" (s.subscription)} {
                            h2 id={"life-" (s.subscription)} {
                                "Subscription "
                                a href=(subscription_href(&life.topic, &s.subscription)) { (s.subscription) }
                            }
                            p { "Now: " strong { (standing_text(&s.standing)) } }
                            @if s.deliveries.len() > 1 {
                                p { "It was sent more than once; each delivery stands on its own steps:" }
                                ul {
                                    @for d in &s.deliveries {
                                        li { (delivery_text(d.delivery.as_deref())) ", since " (format_time(d.since)) ": " strong { (standing_text(&d.standing)) } }
                                    }
                                }
                            }
                            table {
                                caption { "Every step of event " (life.id) " for " (s.subscription) ", in order" }
                                (head(&STEP_COLUMNS[1..], &["Ms"]))
                                tbody {
                                    @for step in &s.steps {
                                        tr { @for (i, cell) in step_row(step)[1..].iter().enumerate() {
                                            td class=[(STEP_COLUMNS[i + 1] == "Ms").then_some("num")] { (first_chars(cell, 200)) }
                                        } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// Asks before a redrive: the events picked, and a button that does it.
pub(super) fn confirm_redrive(
    sub: &Subscription,
    events: &[DeadLetteredEvent],
    token: &str,
) -> Markup {
    let href = subscription_href(&sub.topic, &sub.name);
    layout(
        "Redrive dead-lettered events?",
        html! {
            @if events.is_empty() {
                p role="alert" { "None of the picked events is dead-lettered any more (or none was picked)." }
                p { a href=(href) { "Back to the subscription" } }
            } @else {
                p {
                    "Picked: " (counted(events.len(), "event")) ". Each will be delivered again to "
                    code { (endpoint_text(sub)) } " as new deliveries (attempts and time to \
                    live start again), and taken out of their dead-letter objects:"
                }
                ul { @for e in events { li { (e.id.as_deref().unwrap_or("(no id)")) " (" (e.reason) ")" } } }
                form method="post" action={(href) "/redrive"} {
                    input type="hidden" name="token" value=(token);
                    input type="hidden" name="confirm" value="yes";
                    @for e in events { @if let Some(value) = pick_value(e) { input type="hidden" name="pick" value=(value); } }
                    button type="submit" { "Yes, redrive " (counted(events.len(), "event")) }
                    " "
                    a href=(href) { "Cancel" }
                }
            }
        },
    )
}

/// What a redrive did.
pub(super) fn redrive_done(sub: &Subscription, report: &DeadLetterRedriveReport) -> Markup {
    let href = subscription_href(&sub.topic, &sub.name);
    layout(
        "Redrive done",
        html! {
            p role="status" { (counted(report.events(), "event")) " went back into delivery." }
            @for s in &report.subscriptions {
                @if let Some(why) = &s.skipped { p { "Not redriven: " (why) } }
                ul { @for e in &s.events { li {
                    @match &e.id {
                        Some(id) => { a href=(event_href(&sub.topic, id)) { (id) } }
                        None => { "(no id)" }
                    }
                    " from " (e.location)
                } } }
            }
            p { a href=(href) { "Back to the subscription" } }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridrelay_ports::memory::MemorySubscriptionStore;
    use gridrelay_shared::activity::{LastFailure, Window};
    use gridrelay_shared::classify::DeliveryOutcome;
    use gridrelay_shared::schema::InputSchema;
    use gridrelay_shared::subscription::{SubscriptionRequest, Topic};

    fn overview_of(detail: &str, endpoint: &str) -> String {
        let now = chrono::Utc::now();
        let sub = MemorySubscriptionStore::default().insert_validated(
            SubscriptionRequest {
                topic: "orders".into(),
                name: "audit".into(),
                endpoint: endpoint.into(),
                ..SubscriptionRequest::default()
            },
            InputSchema::EventGridSchema,
            now,
        );
        let activity = Activity {
            failed: 3,
            slices: vec![
                Slice {
                    delivered: 1,
                    failed: 3
                };
                12
            ],
            last_failure: Some(LastFailure {
                time: now,
                status: Some(500),
                outcome: DeliveryOutcome::GenericError,
                detail: Some(detail.into()),
            }),
            ..Activity::default()
        };
        let topic = Topic::with_new_keys("orders", now);
        overview(&Overview {
            window: Window {
                from: now - chrono::Duration::hours(1),
                to: now,
                slices: 12,
            },
            topics: vec![(
                topic,
                vec![SubscriptionRow {
                    sub,
                    state: DeliveryState::Failing { failures: 3 },
                    health: None,
                    activity,
                }],
            )],
            queue: Err("not read in this test".into()),
            journal_error: None,
            skipped_lines: 0,
        })
        .into_string()
    }

    /// #36: what an endpoint answered is shown as text, never as markup: a page of the
    /// console cannot be made to run a subscriber's script.
    #[test]
    fn an_endpoints_answer_is_text_on_the_page() {
        let page = overview_of("<script>alert(1)</script>", "https://example.com/hook");
        assert!(!page.contains("<script>"), "{page}");
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
        assert!(page.contains("Failing (3 failed in a row)"), "{page}");
        assert!(page.contains("<strong>500</strong> GenericError"), "{page}");
        assert!(page.contains("12 delivered and 36 failed, in 12 slices of 5 minutes"));
    }

    /// #36: a value in a link is one value, whatever it holds; a picked record's form value
    /// reads back as its object and id.
    #[test]
    fn links_and_picks_keep_their_values_apart() {
        assert_eq!(
            event_href("orders", "x&topic=other #1"),
            "/events?topic=orders&id=x%26topic%3Dother%20%231"
        );
        assert_eq!(
            subscription_href("a-b", "c/d"),
            "/subscriptions/a%2Db/c%2Fd"
        );
        let e = DeadLetteredEvent {
            id: Some("a b/c".into()),
            reason: "TimeToLiveExceeded".into(),
            location: "s3://bucket/dl/2026/11/28/00/x y.json".into(),
        };
        let value = pick_value(&e).unwrap();
        assert_eq!(
            parse_pick(&value),
            Some((e.location.clone(), "a b/c".to_string()))
        );
        assert_eq!(parse_pick("no-space-here"), None);
    }

    /// #36: an endpoint's secrets (user info, query string) are not shown, as `show` redacts
    /// them.
    #[test]
    fn endpoints_are_redacted() {
        let page = overview_of("x", "https://user:pass@example.com/hook?code=s3cret");
        assert!(
            !page.contains("s3cret") && !page.contains("pass@"),
            "{page}"
        );
        assert!(page.contains("example.com/hook"), "{page}");
    }
}
