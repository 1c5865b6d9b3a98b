//! What an attempt's result means: delivered, retry after some minimum wait, or not retried.
//!
//! The rules are a data table (S6) so that a subscription can select another one: the default
//! follows the newest revision (S1, S3, S4, S5); `Revision2020` and `Legacy2019` the older ones.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::limits::LimitError;

/// What kind of endpoint an attempt went to: a webhook, or an AWS resource (S3, S4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointKind {
    Webhook,
    Resource,
}

/// What happened to one delivery attempt, before any rule is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// The endpoint answered with this HTTP status.
    Status(u16),
    /// No response within the attempt timeout (S2).
    TimedOut,
    /// The request could not be sent or the connection broke.
    ConnectionFailed(String),
    /// The endpoint's host name could not be resolved (DNS).
    Unresolved(String),
    /// No connection was made: every address the endpoint resolves to is one gridrelay may not
    /// reach ([`crate::outbound::OutboundPolicy`]). A failed attempt, retried on the schedule
    /// (the name may resolve elsewhere later); the text says why, never the address.
    Refused(String),
    /// The request was not made: something the subscription needs to send it (a secret
    /// delivery header's value) could not be read. A failed attempt like any other, so it
    /// follows the retry policy and ends in the dead-letter location or a counted drop; it
    /// says nothing about the endpoint's health.
    NotSent(String),
    /// A1: the request was not made: the subscription's OAuth token endpoint gave no token
    /// (it refused, failed, or could not be reached; the text says which, never the
    /// credentials). A failed attempt like any other, retried on the schedule, that says
    /// nothing about the endpoint's health.
    TokenUnavailable(String),
    /// An AWS resource destination's service refused the entry or the call (S4): the status
    /// its error means and the outcome it is recorded as.
    Service(crate::destination::ServiceFailure),
}

/// The `lastDeliveryOutcome` vocabulary of dead-letter records (L6): the newest revision's
/// values, and one of gridrelay's own, `GenericError`, for a failure none of them names (an
/// HTTP status other than those below, a redirect, a request not made).
///
/// Queue messages written before these names keep reading: the older names are aliases
/// (`RequestEntityTooLarge` → `PayloadTooLarge`, `ConnectionFailed` → `SocketError`,
/// `Redirected` → `GenericError`, `AddressRefused` → `Forbidden`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryOutcome {
    /// Never a dead-letter record's: the attempt was delivered.
    Succeeded,
    /// 400.
    BadRequest,
    /// 401.
    Unauthorized,
    /// 403, or gridrelay refused to connect: the endpoint resolves only to addresses outside
    /// the allowed networks.
    #[serde(alias = "AddressRefused")]
    Forbidden,
    /// 404 or 410.
    NotFound,
    /// No answer within the attempt timeout (S2), or 408.
    TimedOut,
    /// 413.
    #[serde(alias = "RequestEntityTooLarge")]
    PayloadTooLarge,
    /// 429 or 503.
    Busy,
    /// The connection was refused, reset or closed before an answer, or TLS failed.
    #[serde(alias = "ConnectionFailed")]
    SocketError,
    /// The endpoint's host name could not be resolved.
    ResolutionError,
    /// An AWS resource destination cannot take more now (an SQS queue with too many
    /// messages in flight).
    Full,
    /// An AWS resource destination is disabled (its KMS key, or a Lambda function not ready).
    Disabled,
    /// The event's time to live ended while delivery to its endpoint was delayed (D1).
    Probation,
    /// The event's time to live ended before any attempt of it was made.
    Delivering,
    /// gridrelay's own (A1): the subscription's OAuth token endpoint gave no token, so
    /// nothing was sent.
    TokenUnavailable,
    /// gridrelay's own: any other failure.
    #[serde(alias = "Redirected")]
    GenericError,
}

impl DeliveryOutcome {
    pub fn of(result: &AttemptResult) -> Self {
        match result {
            AttemptResult::TimedOut => Self::TimedOut,
            AttemptResult::ConnectionFailed(_) => Self::SocketError,
            AttemptResult::Unresolved(_) => Self::ResolutionError,
            AttemptResult::Refused(_) => Self::Forbidden,
            AttemptResult::NotSent(_) => Self::GenericError,
            AttemptResult::TokenUnavailable(_) => Self::TokenUnavailable,
            AttemptResult::Service(failure) => failure.outcome,
            AttemptResult::Status(code) => Self::of_status(*code),
        }
    }

    /// What an HTTP status is recorded as.
    pub fn of_status(code: u16) -> Self {
        match code {
            200..=204 => Self::Succeeded,
            400 => Self::BadRequest,
            401 => Self::Unauthorized,
            403 => Self::Forbidden,
            404 | 410 => Self::NotFound,
            408 => Self::TimedOut,
            413 => Self::PayloadTooLarge,
            429 | 503 => Self::Busy,
            _ => Self::GenericError,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Succeeded => "Succeeded",
            Self::BadRequest => "BadRequest",
            Self::Unauthorized => "Unauthorized",
            Self::Forbidden => "Forbidden",
            Self::NotFound => "NotFound",
            Self::TimedOut => "TimedOut",
            Self::PayloadTooLarge => "PayloadTooLarge",
            Self::Busy => "Busy",
            Self::SocketError => "SocketError",
            Self::ResolutionError => "ResolutionError",
            Self::Full => "Full",
            Self::Disabled => "Disabled",
            Self::Probation => "Probation",
            Self::Delivering => "Delivering",
            Self::TokenUnavailable => "TokenUnavailable",
            Self::GenericError => "GenericError",
        }
    }
}

/// What a table says to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// S1: the endpoint took the batch.
    Delivered,
    /// Retry, waiting at least this long (before time scaling) (S5).
    Retry { min_wait: Duration },
    /// S3, S4: retrying cannot help; dead-letter at once, or drop without a dead-letter location.
    NotRetried,
}

/// One rule of a table, for one kind of endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    NotRetried,
    RetryAfter(Duration),
    /// 2019 revision: dead-letter at once when dead-lettering is set up, otherwise retry.
    DeadLetterAtOnceElseRetryAfter(Duration),
}

/// A status code and what it means for webhooks and for resource endpoints.
#[derive(Debug, Clone, Copy)]
pub struct StatusRule {
    pub status: u16,
    pub webhook: Rule,
    pub resource: Rule,
}

/// A classification table (S6).
#[derive(Debug, Clone, Copy)]
pub struct StatusTable {
    pub name: StatusTableName,
    pub rules: &'static [StatusRule],
    /// Wait for every failure the rules do not name (S5: 10 s).
    pub other_failures: Duration,
}

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const fn same(status: u16, rule: Rule) -> StatusRule {
    StatusRule {
        status,
        webhook: rule,
        resource: rule,
    }
}

/// The newest revision (`003_*`), the default: webhooks do not retry 400, 401, 413; resources
/// do not retry 400, 413 (S3, S4); 408 and 503 wait longer (S5).
pub const LATEST: StatusTable = StatusTable {
    name: StatusTableName::Latest,
    rules: &[
        same(400, Rule::NotRetried),
        StatusRule {
            status: 401,
            webhook: Rule::NotRetried,
            resource: Rule::RetryAfter(secs(10)),
        },
        same(408, Rule::RetryAfter(secs(120))),
        same(413, Rule::NotRetried),
        same(503, Rule::RetryAfter(secs(30))),
    ],
    other_failures: secs(10),
};

/// The 2020 revision (`004_*`, S6): webhooks do not retry 400, 401, 403, 404, 413; resources
/// do not retry 400, 403, 413 and retry 401 and 404 after 5 minutes or more.
pub const REVISION_2020: StatusTable = StatusTable {
    name: StatusTableName::Revision2020,
    rules: &[
        same(400, Rule::NotRetried),
        StatusRule {
            status: 401,
            webhook: Rule::NotRetried,
            resource: Rule::RetryAfter(secs(300)),
        },
        same(403, Rule::NotRetried),
        StatusRule {
            status: 404,
            webhook: Rule::NotRetried,
            resource: Rule::RetryAfter(secs(300)),
        },
        same(408, Rule::RetryAfter(secs(120))),
        same(413, Rule::NotRetried),
        same(503, Rule::RetryAfter(secs(30))),
    ],
    other_failures: secs(10),
};

/// The 2019 revision (`002_*`, S6); its retry ladder goes hourly after the first hour
/// ([`crate::schedule::RetrySchedule::event_grid_2019`]).
pub const LEGACY_2019: StatusTable = StatusTable {
    name: StatusTableName::Legacy2019,
    rules: &[
        same(400, Rule::DeadLetterAtOnceElseRetryAfter(secs(300))),
        same(401, Rule::RetryAfter(secs(300))),
        same(403, Rule::RetryAfter(secs(300))),
        same(404, Rule::RetryAfter(secs(300))),
        same(408, Rule::RetryAfter(secs(120))),
        same(413, Rule::DeadLetterAtOnceElseRetryAfter(secs(10))),
        same(503, Rule::RetryAfter(secs(30))),
    ],
    other_failures: secs(10),
};

/// The name a subscription stores to select a table (S6). A subscription keeps the table it
/// was created with: records written when the 2020 revision was the default say `Current`,
/// read as [`StatusTableName::Revision2020`], and records without the field are read the same
/// way ([`StatusTableName::unrecorded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum StatusTableName {
    #[default]
    Latest,
    #[serde(alias = "Current")]
    Revision2020,
    Legacy2019,
}

impl StatusTableName {
    pub fn table(&self) -> &'static StatusTable {
        match self {
            Self::Latest => &LATEST,
            Self::Revision2020 => &REVISION_2020,
            Self::Legacy2019 => &LEGACY_2019,
        }
    }

    /// The table of a stored subscription that names none: it was created before tables
    /// were selectable, under the 2020 revision.
    pub fn unrecorded() -> Self {
        Self::Revision2020
    }

    /// The retry ladder that comes with the table, where it has its own (the 2019 revision's
    /// went hourly after the first hour); `None` for Event Grid's current ladder (R1). Built
    /// once, not per attempt.
    pub fn own_schedule(&self) -> Option<&'static crate::schedule::RetrySchedule> {
        static LADDER_2019: std::sync::LazyLock<crate::schedule::RetrySchedule> =
            std::sync::LazyLock::new(crate::schedule::RetrySchedule::event_grid_2019);
        match self {
            Self::Legacy2019 => Some(&LADDER_2019),
            Self::Latest | Self::Revision2020 => None,
        }
    }
}

impl FromStr for StatusTableName {
    type Err = LimitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "latest" => Ok(Self::Latest),
            // `Current` named the 2020 revision while it was the default.
            "revision2020" | "2020" | "current" => Ok(Self::Revision2020),
            "legacy2019" | "revision2019" | "2019" => Ok(Self::Legacy2019),
            _ => Err(LimitError::new(
                "statusTable",
                format!("{s:?}"),
                "Latest (the default), Revision2020 or Legacy2019",
            )),
        }
    }
}

/// What an endpoint's `Retry-After` header asks for, read at `now`: a number of seconds, or an
/// HTTP date in any of the three forms HTTP allows (IMF-fixdate, RFC 850, asctime) or, as
/// some servers send it, an RFC 2822 date with a numeric zone; a date already past asks for
/// no wait. `None` for anything else.
pub fn parse_retry_after(value: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = match httpdate::parse_http_date(value) {
        Ok(at) => at,
        Err(_) => chrono::DateTime::parse_from_rfc2822(value).ok()?.into(),
    };
    Some(
        at.duration_since(std::time::SystemTime::from(now))
            .unwrap_or(Duration::ZERO),
    )
}

/// S1: only 200 to 204 are success.
pub fn is_success(status: u16) -> bool {
    (200..=204).contains(&status)
}

/// Applies `table` to an attempt's result (S1 to S6).
pub fn classify_status(
    table: &StatusTable,
    kind: EndpointKind,
    result: &AttemptResult,
    dead_letter_configured: bool,
) -> Verdict {
    let status = match result {
        AttemptResult::Status(s) if is_success(*s) => return Verdict::Delivered,
        AttemptResult::Status(s) => *s,
        AttemptResult::Service(failure) => failure.status,
        // S2: a timeout or a broken connection is an ordinary failure.
        AttemptResult::TimedOut
        | AttemptResult::ConnectionFailed(_)
        | AttemptResult::Unresolved(_)
        | AttemptResult::Refused(_)
        | AttemptResult::NotSent(_)
        | AttemptResult::TokenUnavailable(_) => {
            return Verdict::Retry {
                min_wait: table.other_failures,
            };
        }
    };
    let rule = table
        .rules
        .iter()
        .find(|r| r.status == status)
        .map(|r| match kind {
            EndpointKind::Webhook => r.webhook,
            EndpointKind::Resource => r.resource,
        });
    match rule {
        Some(Rule::NotRetried) => Verdict::NotRetried,
        Some(Rule::RetryAfter(min_wait)) => Verdict::Retry { min_wait },
        Some(Rule::DeadLetterAtOnceElseRetryAfter(min_wait)) => {
            if dead_letter_configured {
                Verdict::NotRetried
            } else {
                Verdict::Retry { min_wait }
            }
        }
        None => Verdict::Retry {
            min_wait: table.other_failures,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn webhook(status: u16) -> Verdict {
        classify_status(
            &LATEST,
            EndpointKind::Webhook,
            &AttemptResult::Status(status),
            true,
        )
    }

    /// Retry-After in seconds or as an HTTP date; a past date asks for no wait; anything
    /// else is ignored.
    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-24T08:00:00Z")
            .unwrap()
            .to_utc();
        let read = |v| parse_retry_after(v, now);
        assert_eq!(read("120"), Some(Duration::from_secs(120)));
        assert_eq!(read(" 5 "), Some(Duration::from_secs(5)));
        assert_eq!(
            read("Tue, 24 Nov 2026 08:01:30 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(read("Tue, 24 Nov 2026 07:00:00 GMT"), Some(Duration::ZERO));
        // The obsolete forms HTTP still asks recipients to read (RFC 9110 5.6.7).
        assert_eq!(
            read("Tuesday, 24-Nov-26 08:02:00 GMT"),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            read("Tue Nov 24 08:00:10 2026"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            read("Tue, 24 Nov 2026 09:00:30 +0100"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(read("-3"), None);
        assert_eq!(read("soon"), None);
    }

    /// S1: 200-204 succeed; every other status fails (including 205-299 and 3xx).
    #[test]
    fn only_200_to_204_succeed_s1() {
        for s in 200..=204 {
            assert_eq!(webhook(s), Verdict::Delivered);
        }
        for s in [205, 206, 299, 301, 302, 304] {
            assert!(matches!(webhook(s), Verdict::Retry { .. }), "{s}");
        }
    }

    fn classify(table: &StatusTable, kind: EndpointKind, status: u16) -> Verdict {
        classify_status(table, kind, &AttemptResult::Status(status), true)
    }

    /// S3 (newest revision, the default): webhooks do not retry 400, 401, 413; 403 and 404
    /// are retried like any other failure.
    #[test]
    fn webhook_non_retried_codes_s3() {
        for s in [400, 401, 413] {
            assert_eq!(webhook(s), Verdict::NotRetried, "{s}");
        }
        for s in [403, 404] {
            assert_eq!(webhook(s), Verdict::Retry { min_wait: secs(10) }, "{s}");
        }
        assert_eq!(StatusTableName::default(), StatusTableName::Latest);
    }

    /// S4 (newest revision): resource endpoints do not retry 400 and 413; 401, 403 and 404
    /// are retried like any other failure.
    #[test]
    fn resource_codes_s4() {
        let r = |s| classify(&LATEST, EndpointKind::Resource, s);
        for s in [400, 413] {
            assert_eq!(r(s), Verdict::NotRetried);
        }
        for s in [401, 403, 404] {
            assert_eq!(r(s), Verdict::Retry { min_wait: secs(10) }, "{s}");
        }
    }

    /// S6, the 2020 revision: webhooks do not retry 400, 401, 403, 404, 413; resources do not
    /// retry 400, 403, 413 and wait 5 minutes after 401 and 404.
    #[test]
    fn revision_2020_table_s6() {
        for s in [400, 401, 403, 404, 413] {
            let v = classify(&REVISION_2020, EndpointKind::Webhook, s);
            assert_eq!(v, Verdict::NotRetried, "{s}");
        }
        let r = |s| classify(&REVISION_2020, EndpointKind::Resource, s);
        for s in [400, 403, 413] {
            assert_eq!(r(s), Verdict::NotRetried);
        }
        for s in [401, 404] {
            assert_eq!(
                r(s),
                Verdict::Retry {
                    min_wait: secs(300)
                }
            );
        }
    }

    /// S6: a stored subscription keeps the table it was created with: `Current` (the 2020
    /// revision's name while it was the default) and a record without a table read as the
    /// 2020 revision; names parse in any case, and an unknown one names the allowed values.
    #[test]
    fn stored_table_names_keep_their_meaning_s6() {
        let read = |v: &str| serde_json::from_str::<StatusTableName>(v).unwrap();
        assert_eq!(read("\"Current\""), StatusTableName::Revision2020);
        assert_eq!(read("\"Latest\""), StatusTableName::Latest);
        assert_eq!(StatusTableName::unrecorded(), StatusTableName::Revision2020);
        for (text, name) in [
            ("latest", StatusTableName::Latest),
            ("2020", StatusTableName::Revision2020),
            ("Revision2020", StatusTableName::Revision2020),
            ("2019", StatusTableName::Legacy2019),
        ] {
            assert_eq!(text.parse::<StatusTableName>().unwrap(), name);
            let again = serde_json::to_string(&name).unwrap();
            assert_eq!(read(&again), name, "round trip");
        }
        let e = "2021".parse::<StatusTableName>().unwrap_err().to_string();
        assert!(
            e.contains("statusTable") && e.contains("2021") && e.contains("Latest"),
            "{e}"
        );
        assert!(StatusTableName::Legacy2019.own_schedule().is_some());
        assert!(StatusTableName::Latest.own_schedule().is_none());
    }

    /// L6: attempt results in the newest revision's `lastDeliveryOutcome` values; anything
    /// none of them names is gridrelay's `GenericError`.
    #[test]
    fn outcomes_use_the_newest_vocabulary_l6() {
        let of = |r: AttemptResult| DeliveryOutcome::of(&r).as_str();
        assert_eq!(of(AttemptResult::Status(400)), "BadRequest");
        assert_eq!(of(AttemptResult::Status(401)), "Unauthorized");
        assert_eq!(of(AttemptResult::Status(403)), "Forbidden");
        assert_eq!(of(AttemptResult::Status(404)), "NotFound");
        assert_eq!(of(AttemptResult::Status(408)), "TimedOut");
        assert_eq!(of(AttemptResult::Status(413)), "PayloadTooLarge");
        assert_eq!(of(AttemptResult::Status(429)), "Busy");
        assert_eq!(of(AttemptResult::Status(503)), "Busy");
        assert_eq!(of(AttemptResult::Status(500)), "GenericError");
        assert_eq!(of(AttemptResult::Status(302)), "GenericError");
        assert_eq!(of(AttemptResult::TimedOut), "TimedOut");
        assert_eq!(
            of(AttemptResult::ConnectionFailed("refused".into())),
            "SocketError"
        );
        assert_eq!(
            of(AttemptResult::Unresolved("no such name".into())),
            "ResolutionError"
        );
        assert_eq!(
            of(AttemptResult::Refused("private address".into())),
            "Forbidden"
        );
        assert_eq!(
            of(AttemptResult::NotSent("no secret".into())),
            "GenericError"
        );
        // Queue messages written with the older names still read.
        for (old, new) in [
            ("RequestEntityTooLarge", DeliveryOutcome::PayloadTooLarge),
            ("ConnectionFailed", DeliveryOutcome::SocketError),
            ("Redirected", DeliveryOutcome::GenericError),
            ("AddressRefused", DeliveryOutcome::Forbidden),
        ] {
            let read: DeliveryOutcome = serde_json::from_str(&format!("\"{old}\"")).unwrap();
            assert_eq!(read, new, "{old}");
        }
    }

    /// S5: 408 waits 2 minutes, 503 30 seconds, everything else 10 seconds; S2 timeouts too.
    #[test]
    fn minimum_waits_s5_s2() {
        assert_eq!(
            webhook(408),
            Verdict::Retry {
                min_wait: secs(120)
            }
        );
        assert_eq!(webhook(503), Verdict::Retry { min_wait: secs(30) });
        assert_eq!(webhook(500), Verdict::Retry { min_wait: secs(10) });
        let t = classify_status(
            &LATEST,
            EndpointKind::Webhook,
            &AttemptResult::TimedOut,
            false,
        );
        assert_eq!(t, Verdict::Retry { min_wait: secs(10) });
    }

    /// S6: the 2019 table retries 401/403/404 after 5 minutes and dead-letters 400/413 at once
    /// only when dead-lettering is set up.
    #[test]
    fn legacy_2019_table_s6() {
        let c = |s, dl| {
            classify_status(
                &LEGACY_2019,
                EndpointKind::Webhook,
                &AttemptResult::Status(s),
                dl,
            )
        };
        for s in [401, 403, 404] {
            assert_eq!(
                c(s, true),
                Verdict::Retry {
                    min_wait: secs(300)
                }
            );
        }
        assert_eq!(c(400, true), Verdict::NotRetried);
        assert_eq!(
            c(400, false),
            Verdict::Retry {
                min_wait: secs(300)
            }
        );
        assert_eq!(c(413, true), Verdict::NotRetried);
        assert_eq!(c(413, false), Verdict::Retry { min_wait: secs(10) });
        assert_eq!(
            "Legacy2019"
                .parse::<StatusTableName>()
                .unwrap()
                .table()
                .name,
            StatusTableName::Legacy2019
        );
    }

    proptest! {
        /// S1 over every status code, every table, both endpoint kinds.
        #[test]
        fn success_iff_200_to_204_s1(status in 100u16..600, table in 0usize..3, resource: bool, dl: bool) {
            let table = [&LATEST, &REVISION_2020, &LEGACY_2019][table];
            let kind = if resource { EndpointKind::Resource } else { EndpointKind::Webhook };
            let v = classify_status(table, kind, &AttemptResult::Status(status), dl);
            prop_assert_eq!(v == Verdict::Delivered, (200..=204).contains(&status));
            if let Verdict::Retry { min_wait } = v {
                prop_assert!(min_wait >= secs(10));
            }
        }
    }
}
