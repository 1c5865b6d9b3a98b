//! The portal's pages, and the parts the operator console draws the same way.

use chrono::{DateTime, Utc};
use gridrelay_shared::classify::DeliveryOutcome;
use gridrelay_shared::health::DeliveryState;
use gridrelay_shared::journal::{JournalEntry, Next, Step, format_time};
use gridrelay_shared::outbound::redact_endpoint;
use gridrelay_shared::subscription::Subscription;
use maud::{DOCTYPE, Markup, html};

use crate::actions::pick_value;
use crate::{DeadLetters, Filter, OUTCOMES, SPANS, STYLE_PATH, page_path};
use gridrelay_ports::redrive::DeadLetteredEvent;

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
    /// What its forms carry ([`PortalKey::form_token`](gridrelay_shared::portal::PortalKey::form_token)).
    pub form_token: &'a str,
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
            section aria-labelledby="test-event" {
                h2 id="test-event" { "Test event" }
                p {
                    "Sends one event of type " code { (gridrelay_shared::portal::TEST_EVENT_TYPE) }
                    " to the endpoint now. It is delivered, retried and listed above like any other."
                }
                form method="post" action={(page_path(&sub.topic, &sub.name)) "/test-event"} {
                    input type="hidden" name="form_token" value=(p.form_token);
                    button type="submit" { "Send a test event" }
                }
            }
            p class="lede" {
                "This page shows this subscription only. The link that opened it works until "
                (format_time(p.expires_at)) "."
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

/// After dead-lettered events were sent again: those that were.
pub fn sent_again(sub: &Subscription, events: &[DeadLetteredEvent]) -> Markup {
    layout(
        "Sent again",
        html! {
            @if events.is_empty() {
                p role="status" {
                    "None of the picked events is dead-lettered any more (sent again already, or expired): nothing was sent."
                }
            } @else {
                p role="status" {
                    (events.len()) " dead-lettered "
                    (if events.len() == 1 { "event is" } else { "events are" })
                    " on their way again. Their attempts show on the page as they are delivered."
                }
                ul {
                    @for e in events {
                        li { code { (e.id.as_deref().unwrap_or_default()) } }
                    }
                }
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
