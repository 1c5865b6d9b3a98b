//! Every numeric and naming limit from the spec, checked where data enters.
//!
//! Errors name the field, the value that was given and the range that is allowed, so a user can
//! fix the input without reading the source (B4, R5, and the architecture's validation rule).
//!
//! Limits that bound one module's own data stay beside the code that enforces them, each
//! saying whose limit it is: filters (`filter`: Event Grid's counts and lengths), queue messages
//! (`message`: SQS's size and delay), AWS destinations' entries and fields (`destination`),
//! signing secrets' grace (`signing`), subscriptions' caps (`caps`). Limits of an AWS API or of
//! the wire stay in their adapter (`gridrelay_adapters`: SQS's batch entries and bytes, the
//! bytes of an endpoint's answer read), and the local runner's request body in its API.

use std::fmt;
use std::ops::RangeInclusive;

/// A value outside what a setting allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} is {value}; allowed: {allowed}")]
pub struct LimitError {
    /// The setting, as the spec names it (for example `maxEventsPerBatch`).
    pub field: String,
    /// The value that was given, as text.
    pub value: String,
    /// What the setting accepts.
    pub allowed: String,
}

impl LimitError {
    pub fn new(
        field: impl Into<String>,
        value: impl fmt::Display,
        allowed: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }
}

/// B2: events in one delivery request.
pub const MAX_EVENTS_PER_BATCH: RangeInclusive<i64> = 1..=5000;
/// B3: preferred size of one delivery request, in kilobytes.
pub const PREFERRED_BATCH_SIZE_KB: RangeInclusive<i64> = 1..=1024;
/// R5: attempts before an event is dead-lettered.
pub const MAX_DELIVERY_ATTEMPTS: RangeInclusive<i64> = 1..=30;
/// R5: minutes an event may stay undelivered.
pub const EVENT_TTL_MINUTES: RangeInclusive<i64> = 1..=1440;

/// Largest publish request body, as Event Grid takes it (1 MB).
pub const MAX_PUBLISH_BYTES: usize = 1_048_576;
/// Largest single event, as it is kept (a custom-schema event in its envelope). Event Grid takes
/// 1 MB; gridrelay carries events inside SQS messages of at most 1 MiB, so one event leaves
/// 16 KiB for the message's own fields (delivery or dead-letter) and for conversion to
/// CloudEvents.
pub const MAX_EVENT_BYTES: usize = 1_048_576 - 16 * 1024;

/// Event subscriptions one topic may have (Event Grid: 500).
pub const MAX_SUBSCRIPTIONS_PER_TOPIC: usize = 500;

/// #34 item 9: the most bytes of events one publish may enqueue across its subscriptions (each
/// event counted once per subscription whose filter it passes, in the schema that subscription
/// receives). `ingest` enqueues everything before it answers (G1) and has 15 seconds: at this
/// limit that is 64 `SendMessageBatch` calls of about 1 MiB, 4 in flight at a time, 16 rounds of
/// one call's time (tens of milliseconds on AWS); a publish of 1 MB can go to about 60
/// subscriptions (events gain their `topic` as kept), one of about 130 KB to all 500. More is refused at publish with 413, naming
/// the limit, before anything is enqueued.
pub const MAX_FAN_OUT_BYTES: usize = 64 * 1_048_576;

/// Checks that `value` lies in `range`, naming `field` if it does not.
pub fn check_range(
    field: &str,
    value: i64,
    range: &RangeInclusive<i64>,
) -> Result<u32, LimitError> {
    if range.contains(&value) {
        // The ranges above all fit in u32.
        u32::try_from(value).map_err(|_| range_error(field, value, range))
    } else {
        Err(range_error(field, value, range))
    }
}

fn range_error(field: &str, value: i64, range: &RangeInclusive<i64>) -> LimitError {
    LimitError::new(
        field,
        value,
        format!("{} to {}", range.start(), range.end()),
    )
}

/// Topic names: 3 to 50 characters, letters, digits and hyphens (Event Grid's rule).
pub fn validate_topic_name(name: &str) -> Result<(), LimitError> {
    validate_name("topic name", name, 3, 50)
}

/// Event subscription names: 3 to 64 characters, letters, digits and hyphens.
pub fn validate_subscription_name(name: &str) -> Result<(), LimitError> {
    validate_name("event subscription name", name, 3, 64)
}

fn validate_name(field: &str, name: &str, min: usize, max: usize) -> Result<(), LimitError> {
    let ok_chars = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    let len = name.chars().count();
    if ok_chars && (min..=max).contains(&len) {
        Ok(())
    } else {
        Err(LimitError::new(
            field,
            format!("{name:?}"),
            format!("{min} to {max} characters, letters, digits and '-' only"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// B4, R5: the error names the setting, the value and the range.
    #[test]
    fn out_of_range_names_field_value_and_range_b4_r5() {
        let err = check_range("maxEventsPerBatch", 5001, &MAX_EVENTS_PER_BATCH).unwrap_err();
        assert_eq!(
            err.to_string(),
            "maxEventsPerBatch is 5001; allowed: 1 to 5000"
        );
        assert!(check_range("eventTimeToLiveInMinutes", 0, &EVENT_TTL_MINUTES).is_err());
        assert_eq!(
            check_range("maxDeliveryAttempts", 30, &MAX_DELIVERY_ATTEMPTS),
            Ok(30)
        );
    }

    #[test]
    fn names_follow_event_grid_rules() {
        assert!(validate_topic_name("orders-1").is_ok());
        assert!(validate_topic_name("ab").is_err());
        assert!(validate_topic_name("has space").is_err());
        assert!(validate_subscription_name(&"a".repeat(64)).is_ok());
        assert!(validate_subscription_name(&"a".repeat(65)).is_err());
    }
}
