//! The portal's pages, and the parts the operator console draws the same way.

use chrono::{DateTime, Utc};
use gridrelay_shared::classify::DeliveryOutcome;
use gridrelay_shared::health::DeliveryState;
use gridrelay_shared::journal::{DroppedEvent, JournalEntry, Next, Step, format_time};
use gridrelay_shared::outbound::redact_endpoint;
use gridrelay_shared::subscription::Subscription;
use maud::{DOCTYPE, Markup, html};

use crate::actions::{DEFAULT_GRACE_HOURS, archived_pick_value, pick_value};
use crate::{DeadLetters, Dropped, Filter, OUTCOMES, SPANS, STYLE_PATH, page_path};
use gridrelay_shared::signing::{MAX_GRACE_HOURS, SigningSecret};

/// At most `n` characters of `text`, on one line.
pub fn first_chars(text: &str, n: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(n)
        .collect();
    if text.chars().count() > n {
        out.push('…');
    }
    out
}

/// A subscription's delivery state as a badge.
pub fn state_badge(state: &DeliveryState) -> Markup {
    let (class, extra) = match state {
        DeliveryState::Healthy => ("ok", String::new()),
        DeliveryState::Failing { failures } => ("bad", format!(" ({failures} failed in a row)")),
        DeliveryState::Delayed { until } => ("warn", format!(" until {}", format_time(*until))),
        DeliveryState::NotProvisioned { state, detail } => (
            "warn",
            format!(
                ": {state}{}",
                detail
                    .as_deref()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            ),
        ),
        DeliveryState::Expired { at } => (
            "warn",
            format!(" at {}: it receives nothing", format_time(*at)),
        ),
        DeliveryState::Unknown => ("warn", " (its health could not be read)".to_string()),
    };
    html! { span class={"state " (class)} { (state.label()) (extra) } }
}

/// Every portal page: its title and `body`.
fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · gridrelay" }
                link rel="stylesheet" href=(STYLE_PATH);
            }
            body {
                a class="skip" href="#main" { "Skip to the content" }
                header { p class="brand" { "gridrelay · deliveries" } }
                main id="main" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// A page that says why it shows nothing.
pub fn failed(title: &str, why: &str) -> Markup {
    layout(title, html! { p class="error" role="alert" { (why) } })
}

/// What a subscription's page shows.
pub struct SubscriptionPage<'a> {
    pub sub: &'a Subscription,
    pub state: &'a DeliveryState,
    pub filter: &'a Filter,
    /// `Err`: the journal could not be read.
    pub attempts: Result<&'a [JournalEntry], &'a ()>,
    /// Its dead-lettered events in the span.
    pub dead_letters: &'a DeadLetters,
    /// Its dropped events in the span.
    pub dropped: &'a Dropped,
    /// What its forms carry ([`PortalKey::form_token`](gridrelay_shared::portal::PortalKey::form_token)).
    pub form_token: &'a str,
    /// Whether its link may change anything (it is not view-only): if not, no form is shown.
    pub can_change: bool,
    /// When the link that opened it expires.
    pub expires_at: DateTime<Utc>,
}

/// One subscription's deliveries, as its subscriber sees them.
pub fn subscription(p: &SubscriptionPage<'_>) -> Markup {
    let sub = p.sub;
    layout(
        &format!("Deliveries to {}", sub.name),
        html! {
            p {
                "Events of topic " code { (sub.topic) } " to " code { (endpoint_text(sub)) }
                ". State: " (state_badge(p.state))
            }
            section aria-labelledby="attempts" {
                h2 id="attempts" { "Attempts" }
                form method="get" action=(page_path(&sub.topic, &sub.name)) class="filter" {
                    label for="since" { "Since" }
                    select id="since" name="since" {
                        @for (value, text, _) in SPANS {
                            option value=(value) selected[p.filter.since == value] { (text) }
                        }
                    }
                    label for="outcome" { "Outcome" }
                    select id="outcome" name="outcome" {
                        @for (value, text) in OUTCOMES {
                            option value=(value) selected[p.filter.failed == (value == "failed")] { (text) }
                        }
                    }
                    button type="submit" { "Show" }
                }
                @match p.attempts {
                    Err(()) => {
                        p class="error" role="alert" {
                            "The deliveries cannot be read now. Try again in a minute."
                        }
                    }
                    Ok([]) => { p { "No attempts in this span." } }
                    Ok(attempts) => { (attempts_table(attempts)) }
                }
            }
            section aria-labelledby="dead-letters" {
                h2 id="dead-letters" { "Dead-lettered events" }
                (dead_letters(p))
            }
            section aria-labelledby="dropped" {
                h2 id="dropped" { "Dropped events" }
                (dropped(p))
            }
            section aria-labelledby="signing" {
                h2 id="signing" { "Signing secret" }
                (signing_state(sub))
                @if p.can_change { form method="post" action={(page_path(&sub.topic, &sub.name)) "/signing-secret"} class="filter" {
                    input type="hidden" name="form_token" value=(p.form_token);
                    label for="grace_period_hours" {
                        "Hours the current secret keeps signing beside the new one (0 to "
                        (MAX_GRACE_HOURS) ")"
                    }
                    input id="grace_period_hours" name="grace_period_hours" inputmode="numeric"
                        value=(DEFAULT_GRACE_HOURS);
                    button type="submit" { "Rotate the signing secret…" }
                } }
            }
            @if p.can_change { section aria-labelledby="test-event" {
                h2 id="test-event" { "Test event" }
                p {
                    "Sends one event of type " code { (gridrelay_shared::portal::TEST_EVENT_TYPE) }
                    " to the endpoint now (one per " (gridrelay_shared::portal::TEST_EVENT_WINDOW_SECONDS)
                    " seconds at most). It is delivered, retried and listed above like any other."
                }
                form method="post" action={(page_path(&sub.topic, &sub.name)) "/test-event"} {
                    input type="hidden" name="form_token" value=(p.form_token);
                    button type="submit" { "Send a test event" }
                }
            } }
            p class="lede" {
                "This page shows this subscription only. The link that opened it works until "
                (format_time(p.expires_at))
                @if !p.can_change { ", to look only: it sends nothing and changes nothing" }
                "."
            }
        },
    )
}

/// The dead-lettered events of a page's span, each to be picked and sent again.
fn dead_letters(p: &SubscriptionPage<'_>) -> Markup {
    let sub = p.sub;
    html! {
        @match p.dead_letters {
            DeadLetters::NotKept => {
                p { "This subscription keeps no dead-lettered events: what cannot be delivered is dropped." }
            }
            DeadLetters::Unavailable => {
                p class="error" role="alert" {
                    "The dead-lettered events cannot be read or sent again now. Try again in a minute."
                }
            }
            DeadLetters::Listed { events, .. } if events.is_empty() => {
                p { "None in this span." }
            }
            DeadLetters::Listed { events, total } if !p.can_change => {
                (dead_letter_list(events, *total))
            }
            DeadLetters::Listed { events, total } => {
                form method="post" action={(page_path(&sub.topic, &sub.name)) "/send-again"} {
                    input type="hidden" name="form_token" value=(p.form_token);
                    table {
                        caption { "Dead-lettered events: pick those to deliver again" }
                        thead { tr {
                            @for c in ["Send again", "Event", "Reason"] { th scope="col" { (c) } }
                        } }
                        tbody {
                            @for (i, e) in events.iter().enumerate() {
                                @let pick = pick_value(sub, e);
                                tr {
                                    td {
                                        @if let Some(value) = &pick {
                                            input type="checkbox" name="pick" value=(value)
                                                id={"pick-" (i)};
                                        }
                                    }
                                    td {
                                        @if pick.is_some() {
                                            label for={"pick-" (i)} { code { (e.id.as_deref().unwrap_or_default()) } }
                                        } @else {
                                            "(no id: cannot be picked)"
                                        }
                                    }
                                    td { (e.reason) }
                                }
                            }
                        }
                    }
                    @if *total > events.len() {
                        p { "The first " (events.len()) " of " (total) " are listed." }
                    }
                    button type="submit" { "Send the picked events again" }
                }
            }
        }
    }
}

/// The dropped events of a page's span (given up and kept nowhere), each to be picked and
/// sent again from the topic's archive where it keeps one.
fn dropped(p: &SubscriptionPage<'_>) -> Markup {
    let sub = p.sub;
    html! {
        @match p.dropped {
            Dropped::Unavailable => {
                p class="error" role="alert" {
                    "The dropped events cannot be read now. Try again in a minute."
                }
            }
            Dropped::Listed { events, .. } if events.is_empty() => {
                p { "None in this span." }
            }
            Dropped::Listed { events, total, from_archive: kept } => {
                p {
                    "These were given up and kept nowhere (the reason says why). "
                    @if !*kept {
                        "The topic keeps no copy of its events, so they cannot be sent again from here."
                    } @else if !p.can_change {
                        "The topic keeps a copy of its events: a link that may change things sends them again."
                    } @else {
                        "The topic keeps a copy of its events: pick those to deliver again."
                    }
                }
                @let pickable = *kept && p.can_change;
                @let table = dropped_table(events, *total, pickable);
                @if pickable {
                    form method="post" action={(page_path(&sub.topic, &sub.name)) "/send-again"} {
                        input type="hidden" name="form_token" value=(p.form_token);
                        input type="hidden" name="since" value=(p.filter.since);
                        (table)
                        button type="submit" { "Send the picked events again" }
                    }
                } @else {
                    (table)
                }
            }
        }
    }
}

/// Dropped events' table, each with a box to pick it if `pickable`.
fn dropped_table(events: &[DroppedEvent], total: usize, pickable: bool) -> Markup {
    html! {
        table {
            caption { "Dropped events, the latest first" }
            thead { tr {
                @if pickable { th scope="col" { "Send again" } }
                @for c in ["Event", "Dropped at", "Why", "Last status"] { th scope="col" { (c) } }
            } }
            tbody {
                @for (i, e) in events.iter().enumerate() {
                    tr {
                        @if pickable {
                            td {
                                input type="checkbox" name="pick"
                                    value=(archived_pick_value(&e.id)) id={"dropped-" (i)};
                            }
                            td { label for={"dropped-" (i)} { code { (e.id) } } }
                        } @else {
                            td { code { (e.id) } }
                        }
                        td { (format_time(e.dropped_at)) }
                        td { (e.reason) }
                        td class="num" { (e.last_status.map(|s| s.to_string()).unwrap_or_default()) }
                    }
                }
            }
        }
        @if total > events.len() {
            p { "The latest " (events.len()) " of " (total) " are listed." }
        }
    }
}

/// Dead-lettered events as a view-only link's page lists them: nothing to pick.
fn dead_letter_list(
    events: &[gridrelay_ports::redrive::DeadLetteredEvent],
    total: usize,
) -> Markup {
    html! {
        table {
            caption { "Dead-lettered events" }
            thead { tr { @for c in ["Event", "Reason"] { th scope="col" { (c) } } } }
            tbody {
                @for e in events {
                    tr { td { code { (e.id.as_deref().unwrap_or("(no id)")) } } td { (e.reason) } }
                }
            }
        }
        @if total > events.len() {
            p { "The first " (events.len()) " of " (total) " are listed." }
        }
    }
}

/// Whether a subscription's deliveries are signed, and with a previous secret until when (the
/// console says it the same way).
pub fn signing_state(sub: &Subscription) -> Markup {
    html! {
        @match &sub.signing {
            Some(s) => p {
                "Deliveries are signed (Standard Webhooks headers)"
                @if let Some(previous) = &s.previous {
                    ", with the previous secret beside the current one until "
                    (format_time(previous.until))
                }
                "."
            },
            None => p { "Deliveries are not signed: a rotation starts signing them." },
        }
    }
}

/// What a rotation with `hours` of grace does to the secret signing now (the console asks the
/// same way).
pub fn rotation_effect(sub: &Subscription, hours: u64) -> String {
    match (&sub.signing, hours) {
        (None, _) => "Deliveries are not signed now: they will be from now on.".to_string(),
        (Some(_), 0) => "The current secret stops signing at once.".to_string(),
        (Some(_), h) => format!(
            "The current secret keeps signing beside the new one for {h} hours, so the \
             endpoint can switch without missing a delivery."
        ),
    }
}

/// Asks before rotating the signing secret.
pub fn confirm_rotation(sub: &Subscription, hours: u64, form_token: &str) -> Markup {
    let path = page_path(&sub.topic, &sub.name);
    let beside = rotation_effect(sub, hours);
    layout(
        "Rotate the signing secret?",
        html! {
            p {
                "Deliveries to " code { (endpoint_text(sub)) } " will be signed with a new random secret. "
                (beside) " The new secret is shown once, on the next page."
            }
            form method="post" action={(path) "/signing-secret"} {
                input type="hidden" name="form_token" value=(form_token);
                input type="hidden" name="grace_period_hours" value=(hours);
                input type="hidden" name="confirm" value="yes";
                button type="submit" { "Yes, rotate the signing secret" }
                " "
                a href=(path) { "Cancel" }
            }
        },
    )
}

/// The new signing secret, shown once.
pub fn rotated(sub: &Subscription, hours: u64, secret: &SigningSecret) -> Markup {
    layout(
        "New signing secret",
        html! {
            p role="status" {
                "Deliveries are signed with this secret from now on"
                @if hours > 0 && sub.signing.as_ref().is_some_and(|s| s.previous.is_some()) {
                    " (and with the previous one for " (hours) " more hours)"
                }
                ":"
            }
            pre id="new-secret" tabindex="0" role="region" aria-label="The new signing secret" {
                (secret.to_text())
            }
            p {
                strong { "It is shown once:" } " keep it where your endpoint reads it now. "
                "This page is not kept by your browser, and the secret is shown nowhere else; a lost "
                "secret is replaced by another rotation."
            }
            p { a href=(page_path(&sub.topic, &sub.name)) { "Back to the deliveries" } }
        },
    )
}

/// After a test event was sent.
pub fn test_event_sent(sub: &Subscription, id: &str) -> Markup {
    layout(
        "Test event sent",
        html! {
            p role="status" {
                "A test event, id " code { (id) } ", is on its way to " code { (endpoint_text(sub)) }
                ". Its attempts show on the page within a minute."
            }
            p { a href=(page_path(&sub.topic, &sub.name)) { "Back to the deliveries" } }
        },
    )
}

/// What a send again did: the ids of the events sent, from where, and of those not sent.
#[derive(Debug, Default)]
pub struct SentAgain {
    pub dead_lettered: Vec<String>,
    pub from_archive: Vec<String>,
    /// Sent again from the archive in the last 20 minutes already: not sent twice.
    pub held: Vec<String>,
    /// Published in more hours of the archive than one send reads.
    pub not_read: Vec<String>,
    /// Picked, but no longer dead-lettered or dropped (sent again already, delivered, expired),
    /// or not found in the topic's archive.
    pub not_sent: Vec<String>,
    /// Some picks could not be sent now (the store could not be read or written).
    pub incomplete: bool,
}

/// After picked events were sent again: those that were, and those that were not.
pub fn sent_again(sub: &Subscription, done: &SentAgain) -> Markup {
    let sent = done.dead_lettered.len() + done.from_archive.len();
    let ids = |ids: &[String]| {
        html! { ul { @for id in ids { li { code { (id) } } } } }
    };
    layout(
        "Sent again",
        html! {
            @if sent == 0 {
                p role="status" { "None of the picked events could be sent again: nothing was sent." }
            } @else {
                p role="status" {
                    (sent) " " (if sent == 1 { "event is" } else { "events are" })
                    " on their way again. Their attempts show on the page as they are delivered."
                }
                @if !done.dead_lettered.is_empty() {
                    h2 { "From the dead-letter location" }
                    (ids(&done.dead_lettered))
                }
                @if !done.from_archive.is_empty() {
                    h2 { "From the topic's archive" }
                    (ids(&done.from_archive))
                }
            }
            @if done.incomplete {
                p class="error" role="alert" {
                    "Some of the picked events could not be sent now. Try again in a minute."
                }
            }
            @if !done.held.is_empty() {
                h2 { "Sent again already" }
                p {
                    "Sent again from the topic's archive in the last "
                    (gridrelay_shared::portal::SEND_AGAIN_HOLD.num_minutes())
                    " minutes; their attempts show on the page as they are made:"
                }
                (ids(&done.held))
            }
            @if !done.not_read.is_empty() {
                h2 { "Not sent yet" }
                p { "Published in too many different hours to read at once: pick these again." }
                (ids(&done.not_read))
            }
            @if !done.not_sent.is_empty() {
                h2 { "Not sent" }
                p {
                    "No longer dead-lettered or dropped (sent again already, delivered, or expired), "
                    "or not in the topic's archive (published before it keeps events, or a test event):"
                }
                (ids(&done.not_sent))
            }
            p { a href=(page_path(&sub.topic, &sub.name)) { "Back to the deliveries" } }
        },
    )
}

/// A subscription's endpoint as `show` prints it: an HTTP endpoint redacted as everywhere (no
/// query, no credentials); an AWS resource's ARN as it is.
pub fn endpoint_text(sub: &Subscription) -> String {
    if sub.endpoint_type.is_resource() {
        sub.endpoint.clone()
    } else {
        redact_endpoint(&sub.endpoint)
    }
}

fn attempts_table(attempts: &[JournalEntry]) -> Markup {
    html! {
        table {
            caption { "Attempts, newest first" }
            thead { tr {
                @for c in ["Time", "Events", "Attempt", "Status", "Outcome", "Took", "Then", "Answer or error"] {
                    th scope="col" { (c) }
                }
            } }
            tbody {
                @for e in attempts {
                    @if let Step::Attempt(a) = &e.step {
                        tr {
                            td { (format_time(e.time)) }
                            td {
                                @if let Some(id) = e.ids.first() {
                                    code { (id) }
                                    @if e.ids.len() > 1 { " and " (e.ids.len() - 1) " more" }
                                }
                            }
                            td class="num" { (a.attempt) }
                            td class="num" { (a.status.map(|s| s.to_string()).unwrap_or_default()) }
                            td { (a.outcome.as_str()) }
                            td class="num" { (a.ms) " ms" }
                            td { (then_text(&a.next)) }
                            td class="answer" { (first_chars(&answer_text(a), 200)) }
                        }
                    }
                }
            }
        }
    }
}

/// What happened after an attempt, for its subscriber.
fn then_text(next: &Next) -> String {
    match next {
        Next::Delivered => "delivered".to_string(),
        Next::Retry { due } => format!("retried at {}", format_time(*due)),
        Next::DeadLetter { reason } => format!("dead-lettered ({reason})"),
        Next::Drop { reason } => format!("given up ({reason})"),
    }
}

/// What the endpoint answered; where it did not, why, when that is about the endpoint (a
/// connection, a name, a timeout). gridrelay's own failures (a secret header it could not
/// read) name the stack's resources, which the portal never shows.
fn answer_text(a: &gridrelay_shared::journal::Attempt) -> String {
    if let Some(answer) = &a.answer {
        return answer.clone();
    }
    match a.outcome {
        DeliveryOutcome::SocketError
        | DeliveryOutcome::ResolutionError
        | DeliveryOutcome::TimedOut => a.error.clone().unwrap_or_default(),
        _ => String::new(),
    }
}
