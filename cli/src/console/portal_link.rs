//! A subscribers' portal link made from the console (#36), as `event-subscription
//! portal-link` makes it ([`crate::portal::signed_link`]): a POST with the run's token (it
//! hands out a credential), answered with the link to copy and until when it works.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gridrelay_shared::journal::format_time;
use gridrelay_shared::portal::{PortalGrant, parse_link_lifetime};
use gridrelay_shared::subscription::Subscription;
use maud::{Markup, html};

use super::change::Change;
use super::{Console, pages};

/// The life the form offers a link (the command line's default).
const DEFAULT_EXPIRES_IN: &str = "24h";

/// `POST /subscriptions/{topic}/{name}/portal-link`: a link for the subscription's subscriber,
/// working for `expires_in` (5 minutes to 30 days), to look only if `view_only` is `yes`.
pub(super) async fn make(
    State(console): State<Arc<Console>>,
    Change { form, sub }: Change,
) -> Response {
    let view_only = form.says_yes("view_only");
    let title = "Portal link";
    let text = form.value("expires_in").unwrap_or(DEFAULT_EXPIRES_IN);
    let lifetime = match parse_link_lifetime(text, "expires_in") {
        Ok(lifetime) => lifetime,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                pages::failed(title, &e.to_string()),
            )
                .into_response();
        }
    };
    match console
        .sources
        .portal_link(&sub, (lifetime, view_only))
        .await
    {
        Ok((url, grant)) => made(&sub, &grant, &url).into_response(),
        Err(e) => super::failed(StatusCode::BAD_GATEWAY, title, &e),
    }
}

/// The subscription page's section: the form that makes a link, or why none can be made.
pub(super) fn section(sub: &Subscription, token: &str, makes_links: bool) -> Markup {
    let href = pages::subscription_href(&sub.topic, &sub.name);
    html! {
        section aria-labelledby="portal" {
            h2 id="portal" { "Subscriber's portal" }
            p {
                "A link for this subscription's subscriber: its deliveries, a test event, its "
                "dead-lettered events sent again and its signing secret's rotation, and nothing else."
            }
            @if makes_links {
                form method="post" action={(href) "/portal-link"} class="filter" {
                    input type="hidden" name="token" value=(token);
                    label for="expires_in" { "Works for (5m to 30d, such as 30m, 24h, 7d)" }
                    input id="expires_in" name="expires_in" value=(DEFAULT_EXPIRES_IN);
                    input type="checkbox" id="view_only" name="view_only" value="yes";
                    label for="view_only" { "To look only (no test event, send again or rotation)" }
                    button type="submit" { "Make a portal link" }
                }
            } @else {
                p {
                    "No link can be made: give " code { "--portal-key-secret" }
                    " (the stack's PortalKeySecret output)."
                }
            }
        }
    }
}

/// The link made.
fn made(sub: &Subscription, grant: &PortalGrant, url: &str) -> Markup {
    let href = pages::subscription_href(&sub.topic, &sub.name);
    pages::layout(
        "Portal link",
        html! {
            p role="status" {
                "The link to " strong { (sub.name) } "'s page works until "
                (format_time(grant.expires_at)) ". Send it to the subscriber:"
            }
            pre id="portal-link" tabindex="0" role="region" aria-label="The portal link" { (url) }
            p {
                "Whoever holds it sees this subscription's deliveries"
                @if grant.view_only {
                    ", and nothing else: it sends nothing and changes nothing. "
                } @else {
                    ", and can send it a test event, send its failed events again and rotate its "
                    "signing secret. "
                }
                code { "gridrelay portal-key rotate" } " revokes every link."
            }
            p { a href=(href) { "Back to the subscription" } }
        },
    )
}
