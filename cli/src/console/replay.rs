//! A replay of a time window to one subscription from the console (#36, #35), through the
//! command line's own code (`replay start`: [`crate::replay::plan_replay`] and
//! [`crate::replay::start_replay`]): the window checked and shown first, then started.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use gridrelay_shared::journal::format_time;
use gridrelay_shared::replay::{DEFAULT_REPLAY_RATE, Replay};
use gridrelay_shared::subscription::Subscription;
use maud::{Markup, html};

use super::change::{Change, Form};
use super::{Console, pages};
use crate::replay::ReplayRequest;

/// The replay form's fields.
#[derive(Debug, Default, PartialEq)]
struct ReplayForm<'a> {
    name: &'a str,
    start_time: &'a str,
    end_time: &'a str,
    rate: &'a str,
    confirmed: bool,
}

impl<'a> ReplayForm<'a> {
    fn of(form: &'a Form) -> Self {
        let field = |name| form.value(name).unwrap_or_default();
        Self {
            name: field("name"),
            start_time: field("start_time"),
            end_time: field("end_time"),
            rate: field("rate"),
            confirmed: form.says_yes("confirm"),
        }
    }
}

/// A replay's default name: the console's, and when it was asked for.
fn default_name(now: DateTime<Utc>) -> String {
    format!("console-{}", now.format("%Y%m%d-%H%M%S"))
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// `POST /subscriptions/{topic}/{name}/replay`: the replay checked and shown first; started
/// once `confirm=yes` comes with the form (whose window is then the one shown, to the
/// millisecond).
pub(super) async fn replay(
    State(console): State<Arc<Console>>,
    Change { form, sub }: Change,
) -> Response {
    let form = ReplayForm::of(&form);
    let title = "Replay";
    let Ok(rate) = form.rate.trim().parse::<i64>() else {
        let why = format!(
            "rate: {:?} is not a whole number of events a second (1 to 10000)",
            form.rate
        );
        return (StatusCode::BAD_REQUEST, pages::failed(title, &why)).into_response();
    };
    let targets = [sub.name.clone()];
    let request = ReplayRequest {
        topic_name: &sub.topic,
        name: form.name.trim(),
        start_time: form.start_time.trim(),
        end_time: Some(form.end_time.trim()).filter(|t| !t.is_empty()),
        subscriptions: &targets,
        rate,
    };
    let now = Utc::now();
    let planned = match console.sources.plan_replay(&request, now).await {
        Ok(r) => r,
        Err(e) => return super::failed(StatusCode::BAD_REQUEST, title, &e),
    };
    if !form.confirmed {
        return confirm(&sub, &planned, console.guard.token()).into_response();
    }
    match console.sources.start_replay(&planned, now).await {
        Ok(()) => started(&sub, &planned).into_response(),
        Err(e) => super::failed(StatusCode::BAD_GATEWAY, title, &e),
    }
}

/// The subscription page's section: a replay's form.
pub(super) fn section(sub: &Subscription, token: &str, now: DateTime<Utc>) -> Markup {
    let href = pages::subscription_href(&sub.topic, &sub.name);
    html! {
        section aria-labelledby="replay" {
            h2 id="replay" { "Replay" }
            p {
                "Send the events published to topic " (sub.topic) " in a window again to this \
                 subscription only, as new deliveries marked with a " code { "gridrelay-replay" }
                " header, paced to a rate. The topic's archive holds them when it has a retention."
            }
            form method="post" action={(href) "/replay"} class="filter" {
                input type="hidden" name="token" value=(token);
                label for="replay_name" { "Name" }
                input id="replay_name" name="name" value=(default_name(now));
                label for="start_time" { "From (a span back, such as 2h, or an RFC 3339 time)" }
                input id="start_time" name="start_time" value="1h";
                label for="end_time" { "To (empty: now)" }
                input id="end_time" name="end_time" value="";
                label for="rate" { "Events a second, at most" }
                input id="rate" name="rate" inputmode="numeric" value=(DEFAULT_REPLAY_RATE);
                button type="submit" { "Replay…" }
            }
        }
    }
}

/// Asks before starting, with the window as checked.
fn confirm(sub: &Subscription, replay: &Replay, token: &str) -> Markup {
    let href = pages::subscription_href(&sub.topic, &sub.name);
    pages::layout(
        "Start this replay?",
        html! {
            p {
                "Replay " strong { (replay.name) } " sends the events published to topic "
                strong { (replay.topic) } " from " (format_time(replay.start_time)) " to "
                (format_time(replay.end_time)) " (not included) again to subscription "
                strong { (sub.name) } ", at most " (replay.rate) " a second, as new deliveries. "
                "Its first step is due at " (replay.next_step_due.map(format_time).unwrap_or_default())
                " (once the archive has written the window)."
            }
            form method="post" action={(href) "/replay"} {
                input type="hidden" name="token" value=(token);
                input type="hidden" name="name" value=(replay.name);
                input type="hidden" name="start_time" value=(rfc3339(replay.start_time));
                input type="hidden" name="end_time" value=(rfc3339(replay.end_time));
                input type="hidden" name="rate" value=(replay.rate);
                input type="hidden" name="confirm" value="yes";
                button type="submit" { "Yes, start replay " (replay.name) }
                " "
                a href=(href) { "Cancel" }
            }
        },
    )
}

/// What was started, as `replay show` prints it.
fn started(sub: &Subscription, replay: &Replay) -> Markup {
    let href = pages::subscription_href(&sub.topic, &sub.name);
    pages::layout(
        "Replay started",
        html! {
            p role="status" { "Replay " strong { (replay.name) } " is running in the stack." }
            p {
                "Follow it on the " a href={"/live?topic=" (pages::enc(&sub.topic))} { "live page" }
                ", or with " code { "gridrelay replay show --topic-name " (replay.topic) " --name " (replay.name) }
                "; stop it with " code { "gridrelay replay cancel" } "."
            }
            pre class="json" tabindex="0" role="region" aria-label="The replay, as replay show prints it" {
                (serde_json::to_string_pretty(&crate::replay::replay_view(replay)).unwrap_or_default())
            }
            p { a href=(href) { "Back to the subscription" } }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forms_fields_are_read_by_name() {
        let form =
            Form::parse(b"token=t&name=night&start_time=2h&end_time=&rate=50&confirm=yes&other=x");
        assert_eq!(
            ReplayForm::of(&form),
            ReplayForm {
                name: "night",
                start_time: "2h",
                end_time: "",
                rate: "50",
                confirmed: true,
            }
        );
        let name = default_name(
            DateTime::parse_from_rfc3339("2026-11-28T03:04:05Z")
                .unwrap()
                .to_utc(),
        );
        assert_eq!(name, "console-20261128-030405");
        gridrelay_shared::replay::validate_replay_name(&name).unwrap();
    }
}
