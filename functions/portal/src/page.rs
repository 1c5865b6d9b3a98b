//! The portal's pages, and the parts the operator console draws the same way.

use chrono::{DateTime, Utc};
use gridrelay_shared::classify::DeliveryOutcome;
use gridrelay_shared::health::DeliveryState;
use gridrelay_shared::journal::{JournalEntry, Next, Step, format_time};
use gridrelay_shared::outbound::redact_endpoint;
use gridrelay_shared::subscription::Subscription;
use maud::{DOCTYPE, Markup, html};

use crate::{Filter, OUTCOMES, SPANS, STYLE_PATH, page_path};

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
            p class="lede" {
                "This page shows this subscription only. The link that opened it works until "
                (format_time(p.expires_at)) "."
            }
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
