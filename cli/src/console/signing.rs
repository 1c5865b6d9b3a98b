//! A subscription's signing-secret rotation from the console (#36), through the command line's
//! own code (`event-subscription signing-secret rotate`, [`gridrelay_ports::registration`]):
//! asked first, then done with a new random secret, which the answering page shows once. The
//! console keeps it nowhere, and no page is cached.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use gridrelay_shared::limits::LimitError;
use gridrelay_shared::signing::{MAX_GRACE_HOURS, SigningSecret};
use gridrelay_shared::subscription::Subscription;
use maud::{Markup, html};

use super::change::Change;
use super::{Console, pages};

/// The grace period the form offers, in hours (the command line's default).
pub(super) const DEFAULT_GRACE_HOURS: u64 = 24;

/// The grace period a form gives (`gracePeriodHours`, 0 to 168), or what is wrong with it.
fn grace_of(text: &str) -> Result<(u64, std::time::Duration), LimitError> {
    gridrelay_shared::signing::grace_of_text(text, "gracePeriodHours")
}

/// `POST /subscriptions/{topic}/{name}/signing-secret`: asked about first; rotated once
/// `confirm=yes` comes with the form.
pub(super) async fn rotate(
    State(console): State<Arc<Console>>,
    Change { form, sub }: Change,
) -> Response {
    let confirmed = form.says_yes("confirm");
    let text = form
        .value("grace_period_hours")
        .map_or_else(|| DEFAULT_GRACE_HOURS.to_string(), str::to_string);
    let (hours, grace) = match grace_of(&text) {
        Ok(g) => g,
        Err(e) => {
            let page = pages::failed("Rotate the signing secret", &e.to_string());
            return (StatusCode::BAD_REQUEST, page).into_response();
        }
    };
    if !confirmed {
        return confirm(&sub, hours, console.guard.token()).into_response();
    }
    match console
        .sources
        .rotate_signing_secret(&sub, grace, Utc::now())
        .await
    {
        Ok((sub, secret)) => rotated(&sub, hours, &secret).into_response(),
        Err(e) => super::failed(StatusCode::BAD_GATEWAY, "Rotate the signing secret", &e),
    }
}

/// The subscription page's section: whether it signs, and the rotation's form.
pub(super) fn section(sub: &Subscription, token: &str) -> Markup {
    let href = pages::subscription_href(&sub.topic, &sub.name);
    html! {
        section aria-labelledby="signing" {
            h2 id="signing" { "Signing secret" }
            (gridrelay_portal::page::signing_state(sub))
            form method="post" action={(href) "/signing-secret"} class="filter" {
                input type="hidden" name="token" value=(token);
                label for="grace_period_hours" {
                    "Hours the current secret keeps signing beside the new one (0 to " (MAX_GRACE_HOURS) ")"
                }
                input id="grace_period_hours" name="grace_period_hours" inputmode="numeric"
                    value=(DEFAULT_GRACE_HOURS);
                button type="submit" { "Rotate the signing secret…" }
            }
        }
    }
}

/// Asks before rotating.
fn confirm(sub: &Subscription, hours: u64, token: &str) -> Markup {
    let href = pages::subscription_href(&sub.topic, &sub.name);
    let beside = gridrelay_portal::page::rotation_effect(sub, hours);
    pages::layout(
        "Rotate the signing secret?",
        html! {
            p {
                "Deliveries of subscription " strong { (sub.name) } " of topic " strong { (sub.topic) }
                " will be signed with a new random secret. " (beside)
                " The new secret is shown once, on the next page."
            }
            form method="post" action={(href) "/signing-secret"} {
                input type="hidden" name="token" value=(token);
                input type="hidden" name="grace_period_hours" value=(hours);
                input type="hidden" name="confirm" value="yes";
                button type="submit" { "Yes, rotate the signing secret" }
                " "
                a href=(href) { "Cancel" }
            }
        },
    )
}

/// The new secret, shown once.
fn rotated(sub: &Subscription, hours: u64, secret: &SigningSecret) -> Markup {
    let href = pages::subscription_href(&sub.topic, &sub.name);
    pages::layout(
        "New signing secret",
        html! {
            p role="status" {
                "Deliveries of " strong { (sub.name) } " are signed with this secret from now on"
                @if hours > 0 && sub.signing.as_ref().is_some_and(|s| s.previous.is_some()) {
                    " (and with the previous one for " (hours) " more hours)"
                }
                ":"
            }
            pre class="json" id="new-secret" tabindex="0" role="region" aria-label="The new signing secret" {
                (secret.to_text())
            }
            p {
                strong { "It is shown once:" } " give it to the subscriber now. gridrelay keeps it in "
                "Secrets Manager and shows it nowhere else; a lost secret is replaced by another rotation."
            }
            p { a href=(href) { "Back to the subscription" } }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// #36: the grace period's field is checked where it enters, named with its value and range.
    #[test]
    fn a_grace_period_is_hours_within_the_limit() {
        assert_eq!(grace_of("24").unwrap().0, 24);
        assert_eq!(grace_of(" 0 ").unwrap().1, std::time::Duration::ZERO);
        for bad in ["", "-1", "1.5", "169", "a day"] {
            let e = grace_of(bad).unwrap_err().to_string();
            assert!(e.contains("gracePeriodHours"), "{bad}: {e}");
            assert!(e.contains("168"), "{bad}: {e}");
        }
    }
}
