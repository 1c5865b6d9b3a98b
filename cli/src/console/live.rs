//! The live page (#36): the journal's entries as they are written, for watching a deploy.
//!
//! The page shows what was written in the last [`FIRST_LOOK`], and its script
//! (`console.js`) asks `/live/entries` every few seconds for what was written since. The
//! journal is a stream's objects in S3: a stream names an object when it starts gathering it
//! and writes it up to its buffering interval later, so each look reads again the objects
//! named in that interval (`next` is that far back). An object is written whole, once, so the
//! script knows which it has shown by key and shows each entry once. On AWS the page says how long the stream gathers, and how old the
//! newest entry read is.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use gridrelay_adapters::aws::JournalObject;
use gridrelay_shared::journal::{Step, format_time};
use gridrelay_shared::limits::{LimitError, validate_subscription_name, validate_topic_name};
use serde::{Deserialize, Serialize};

use super::{Console, pages};
use crate::journal::step_row;

/// What the page shows when it is opened: the entries written this long before.
pub(super) const FIRST_LOOK: chrono::TimeDelta = chrono::TimeDelta::minutes(15);
/// Rows the page keeps (the script drops the oldest past this).
pub(super) const ROWS_KEPT: usize = 200;
/// How long a stream gathers an object when its own setting cannot be read: Firehose's
/// longest buffering interval.
const LONGEST_BUFFER: Duration = Duration::from_secs(900);
/// Added to the buffering interval: an object is listed a little after it is written.
const LISTING_SLACK: Duration = Duration::from_secs(5);
const LISTING_SLACK_DELTA: chrono::TimeDelta = chrono::TimeDelta::seconds(5);

/// The page's filter (and `/live/entries`'s, with `since`).
#[derive(Deserialize, Default)]
pub(super) struct LiveQuery {
    topic: Option<String>,
    subscription: Option<String>,
    /// `/live/entries`: objects named at this time or later (milliseconds since 1970, as the
    /// last answer's `next` gave it).
    since: Option<String>,
}

/// The entries a look shows: of one topic, or of one subscription, or all.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct LiveFilter {
    pub(super) topic: Option<String>,
    pub(super) subscription: Option<String>,
}

impl LiveFilter {
    /// The filter a query names (an empty field is no filter), or the field that is wrong.
    fn of(q: &LiveQuery) -> Result<Self, LimitError> {
        let given = |v: &Option<String>| v.as_deref().filter(|v| !v.is_empty()).map(String::from);
        let filter = Self {
            topic: given(&q.topic),
            subscription: given(&q.subscription),
        };
        if let Some(topic) = &filter.topic {
            validate_topic_name(topic)?;
        }
        if let Some(name) = &filter.subscription {
            validate_subscription_name(name)?;
        }
        Ok(filter)
    }

    fn takes(&self, topic: &str, subscription: &str) -> bool {
        self.topic.as_deref().is_none_or(|t| t == topic)
            && self
                .subscription
                .as_deref()
                .is_none_or(|s| s == subscription)
    }

    /// The filter as a query string (for the script's looks).
    pub(super) fn query(&self) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        if let Some(t) = &self.topic {
            q.append_pair("topic", t);
        }
        if let Some(s) = &self.subscription {
            q.append_pair("subscription", s);
        }
        q.finish()
    }
}

/// One entry as the live page shows it: its place in the journal (object key and line) and
/// the columns of `event show`'s steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct LiveRow {
    /// Its object's key and its place in it: the same entry has the same id at every look.
    pub(super) id: String,
    /// Its object's key: an object is read whole, so one seen is seen entirely.
    pub(super) object: String,
    /// When its object was written (milliseconds since 1970), as its name says: no look from
    /// later than that reads it again (`None`: every look reads it).
    pub(super) written: Option<i64>,
    pub(super) time: String,
    pub(super) topic: String,
    pub(super) subscription: String,
    pub(super) subscription_href: String,
    pub(super) step: String,
    /// The first event's id and its page, and how many more the entry names.
    pub(super) event: Option<String>,
    pub(super) event_href: Option<String>,
    pub(super) more_events: usize,
    pub(super) status: String,
    pub(super) outcome: String,
    pub(super) ms: String,
    pub(super) next: String,
    pub(super) detail: String,
}

/// What a look found: its rows (oldest first), where the next look starts, the newest
/// entry's time.
#[derive(Debug, Serialize)]
pub(super) struct LiveLook {
    pub(super) rows: Vec<LiveRow>,
    /// The next look's `since` (milliseconds since 1970).
    pub(super) next: i64,
    /// The newest entry read (of any topic), RFC 3339.
    pub(super) newest: Option<String>,
    /// Lines and parts of objects that could not be read.
    pub(super) skipped: usize,
}

/// The objects `rows` came from, once each, with when they were written (milliseconds): what
/// the page has shown of the journal.
pub(super) fn objects_of(rows: &[LiveRow]) -> Vec<(&str, Option<i64>)> {
    let mut objects: Vec<(&str, Option<i64>)> = Vec::new();
    for r in rows {
        if objects.last().is_none_or(|(key, _)| *key != r.object) {
            objects.push((&r.object, r.written));
        }
    }
    objects
}

/// The rows of `objects` that `filter` takes: every step but publishing (an event's
/// attempts, holds, dead-lettering, drops), in the order written.
pub(super) fn rows_of(objects: &[JournalObject], filter: &LiveFilter) -> Vec<LiveRow> {
    objects
        .iter()
        .flat_map(|o| o.entries.iter().enumerate().map(move |(i, e)| (o, i, e)))
        .filter(|(_, _, e)| !matches!(e.step, Step::Fanned { .. }))
        .filter(|(_, _, e)| filter.takes(&e.topic, &e.subscription))
        .map(|(o, i, e)| {
            let cells = step_row(e);
            let event = e.ids.first().cloned();
            LiveRow {
                id: format!("{}#{i}", o.key),
                object: o.key.clone(),
                written: o.written.map(|w| w.timestamp_millis()),
                time: format_time(e.time),
                subscription_href: pages::subscription_href(&e.topic, &e.subscription),
                event_href: event.as_deref().map(|id| pages::event_href(&e.topic, id)),
                more_events: e.ids.len().saturating_sub(1),
                event,
                topic: e.topic.clone(),
                subscription: e.subscription.clone(),
                step: cells[2].clone(),
                status: cells[4].clone(),
                outcome: cells[5].clone(),
                ms: cells[6].clone(),
                next: cells[7].clone(),
                detail: pages::first_chars(&cells[8], 200),
            }
        })
        .collect()
}

/// The newest entry's time in `objects`.
fn newest(objects: &[JournalObject]) -> Option<DateTime<Utc>> {
    objects
        .iter()
        .flat_map(|o| &o.entries)
        .map(|e| e.time)
        .max()
}

/// How far back each look reads again: the stream's buffering interval (the longest there is,
/// where it is not known) and a little more.
pub(super) fn reread(buffer: Option<Duration>) -> chrono::TimeDelta {
    let back = buffer.unwrap_or(LONGEST_BUFFER) + LISTING_SLACK;
    chrono::TimeDelta::from_std(back).unwrap_or(FIRST_LOOK)
}

/// A look at the objects written since `since`.
async fn look(
    console: &Console,
    since: DateTime<Utc>,
    filter: &LiveFilter,
) -> Result<LiveLook, String> {
    let now = Utc::now();
    let objects = console
        .sources
        .journal_written_since(since, now)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let back = reread(
        console
            .sources
            .journal_buffer()
            .await
            .1
            .as_ref()
            .ok()
            .copied()
            .flatten(),
    );
    Ok(LiveLook {
        rows: rows_of(&objects, filter),
        next: (now - back).max(since).timestamp_millis(),
        newest: newest(&objects).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        skipped: objects.iter().map(|o| o.skipped).sum(),
    })
}

/// `GET /live`: the page, with what was written in the last [`FIRST_LOOK`].
pub(super) async fn page(
    State(console): State<Arc<Console>>,
    Query(q): Query<LiveQuery>,
) -> Response {
    let topics = match console.sources.topic_names().await {
        Ok(t) => t,
        Err(e) => return super::failed(StatusCode::BAD_GATEWAY, "Live", &e),
    };
    let filter = match LiveFilter::of(&q) {
        Ok(f) => f,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                pages::failed("Live", &e.to_string()),
            )
                .into_response();
        }
    };
    let looked = look(&console, Utc::now() - FIRST_LOOK, &filter).await;
    let (stream, buffer) = console.sources.journal_buffer().await;
    pages::live(&pages::LivePage {
        topics: &topics,
        filter: &filter,
        look: looked.as_ref().map_err(Clone::clone),
        stream,
        buffer,
    })
    .into_response()
}

/// `GET /live/entries?since=…`: what was written since, as JSON for the page's script.
pub(super) async fn entries(
    State(console): State<Arc<Console>>,
    Query(q): Query<LiveQuery>,
) -> Response {
    let refused = |e: LimitError| {
        (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({ "error": e.to_string() })),
        )
            .into_response()
    };
    let filter = match LiveFilter::of(&q) {
        Ok(f) => f,
        Err(e) => return refused(e),
    };
    let given = q.since.unwrap_or_default();
    let now = Utc::now();
    let (earliest, latest) = (now - chrono::TimeDelta::hours(1), now + LISTING_SLACK_DELTA);
    let since = match given
        .parse::<i64>()
        .ok()
        .and_then(DateTime::from_timestamp_millis)
    {
        Some(t) if (earliest..=latest).contains(&t) => t,
        // The script reloads the page on this answer (a page left paused, a computer asleep).
        _ => {
            return refused(LimitError::new(
                "since",
                &given,
                "a time in milliseconds since 1970, within the last hour",
            ));
        }
    };
    match look(&console, since, &filter).await {
        Ok(look) => Json(look).into_response(),
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            Json(serde_json::json!({ "error": e })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridrelay_shared::classify::DeliveryOutcome;
    use gridrelay_shared::journal::{Attempt, JournalEntry, Next};

    fn entry(topic: &str, sub: &str, step: Step) -> JournalEntry {
        JournalEntry {
            topic: topic.into(),
            subscription: sub.into(),
            ids: vec!["e-1".into(), "e-2".into()],
            time: DateTime::from_timestamp_millis(1_790_000_000_000).unwrap_or_default(),
            delivery: None,
            step,
        }
    }

    fn attempt(status: u16) -> Step {
        Step::Attempt(Attempt {
            attempt: 1,
            ms: 12,
            endpoint: "https://example.com/[redacted]".into(),
            status: Some(status),
            outcome: DeliveryOutcome::Busy,
            retry_after_s: None,
            error: None,
            answer: Some("busy\nnow".into()),
            next: Next::Retry {
                due: DateTime::from_timestamp_millis(1_790_000_010_000).unwrap_or_default(),
            },
        })
    }

    /// #36 live: each entry gets its object's key and its line as id, stable from look to
    /// look; publishing steps and other topics' entries are left out.
    #[test]
    fn rows_name_their_place_and_follow_the_filter() {
        let objects = vec![JournalObject {
            key: "journal/2026/11/28/03/s-1-2026-11-28-03-00-00-a".into(),
            written: None,
            entries: vec![
                entry(
                    "orders",
                    "audit",
                    Step::Fanned {
                        event_type: "t".into(),
                        subject: String::new(),
                        bytes: 3,
                        replay: None,
                        redrive: None,
                    },
                ),
                entry("orders", "audit", attempt(503)),
                entry("billing", "audit", attempt(500)),
            ],
            skipped: 0,
        }];
        let filter = LiveFilter {
            topic: Some("orders".into()),
            subscription: None,
        };
        let rows = rows_of(&objects, &filter);
        assert_eq!(rows.len(), 1, "{rows:?}");
        let row = &rows[0];
        assert_eq!(row.id, "journal/2026/11/28/03/s-1-2026-11-28-03-00-00-a#1");
        assert_eq!(
            (row.status.as_str(), row.step.as_str(), row.more_events),
            ("503", "attempt 1", 1)
        );
        assert_eq!(row.detail, "busy now");
        assert_eq!(row.subscription_href, "/subscriptions/orders/audit");
        assert_eq!(
            row.event_href.as_deref(),
            Some("/events?topic=orders&id=e%2D1")
        );
        assert_eq!(rows_of(&objects, &LiveFilter::default()).len(), 2);
    }

    /// Each look reads again what the stream may still be writing: its buffering interval
    /// back, Firehose's longest where it is not known.
    #[test]
    fn a_look_reads_back_the_streams_buffering_interval() {
        assert_eq!(reread(Some(Duration::from_secs(60))).num_seconds(), 65);
        assert_eq!(reread(None).num_seconds(), 905);
    }

    #[test]
    fn a_filter_names_the_field_it_refuses() {
        let q = LiveQuery {
            topic: Some("no spaces".into()),
            ..LiveQuery::default()
        };
        let e = LiveFilter::of(&q).unwrap_err().to_string();
        assert!(e.contains("no spaces"), "{e}");
        let q = LiveQuery {
            topic: Some(String::new()),
            subscription: Some("audit".into()),
            since: None,
        };
        let f = LiveFilter::of(&q).unwrap();
        assert_eq!(f.topic, None);
        assert_eq!(f.query(), "subscription=audit");
    }
}
