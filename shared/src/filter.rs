//! Which events a subscription receives: Event Grid's subscription filters.
//!
//! - `includedEventTypes`: the event's type is one of these (case-insensitive). Unset, or `All`
//!   among them: all types.
//! - `subjectBeginsWith` / `subjectEndsWith`: prefix and suffix of the subject,
//!   case-insensitive unless `isSubjectCaseSensitive`.
//! - `advancedFilters`: up to 25, each on an envelope field (`id`, `topic`, `subject`,
//!   `eventType`, `dataVersion`) or a `data.` path, with one of Event Grid's 19 operators and up
//!   to 25 values across all of them, strings at most 512 characters. All filters must match
//!   (AND), two on the same key included; the values of one filter are alternatives (OR).
//!   String comparisons are case-insensitive. A `Not` operator is the negation of its positive
//!   form on a value that is there. A missing key matches only `IsNullOrUndefined`,
//!   `NumberNotIn`, `NumberNotInRange` and `StringNotIn` (the Event Grid simulator's truth
//!   table; Microsoft documents no row for `NumberNotInRange`, which the simulator answers as
//!   `NumberNotIn`: a reading, not a documented rule).
//! - Arrays: with `enableAdvancedFilteringOnArrays` (off by default, as in Event Grid) a positive
//!   operator matches an array if any element matches, a `Not` operator if no element matches
//!   the positive form. Without it an array is one value, which no string, number or boolean
//!   comparison matches (so a `Not` operator does).
//! - Filters read events in their topic's input schema: for CloudEvents topics the event type is
//!   `type`, and advanced filter keys are CloudEvents attribute names (`source`, `type`, an
//!   extension, `data.…`); custom-schema events are filtered on their mapped envelope.
//!
//! Pure: validated when a subscription is created, evaluated on ingest for each event.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::limits::LimitError;
use crate::schema::FilterFields;

/// Event Grid's limit of advanced filters per subscription.
pub const MAX_ADVANCED_FILTERS: usize = 25;
/// Event Grid's limit of values across all advanced filters of a subscription (and so in one).
pub const MAX_FILTER_VALUES: usize = 25;
/// Event Grid's limit on the length of one string value of an advanced filter.
pub const MAX_FILTER_STRING_CHARS: usize = 512;
/// The `includedEventTypes` entry that means every type.
pub const ALL_EVENT_TYPES: &str = "All";

/// A subscription's filter; the default lets every event through.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub included_event_types: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_begins_with: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_ends_with: Option<String>,
    #[serde(default)]
    pub is_subject_case_sensitive: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advanced_filters: Vec<AdvancedFilter>,
    /// Whether an advanced filter looks into an array value element by element. Off for new
    /// subscriptions, as in Event Grid; a stored filter without the field was made when
    /// gridrelay always looked into arrays, and keeps doing so.
    #[serde(default = "EventFilter::stored_before_the_flag")]
    pub enable_advanced_filtering_on_arrays: bool,
}

impl EventFilter {
    /// What a stored filter without `enableAdvancedFilteringOnArrays` means: on.
    fn stored_before_the_flag() -> bool {
        true
    }
}

/// One advanced filter: a key and a condition on its value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdvancedFilter {
    pub key: String,
    #[serde(flatten)]
    pub condition: Condition,
}

/// Event Grid's advanced filter operators, with their typed values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "operatorType", content = "values")]
pub enum Condition {
    NumberIn(Vec<f64>),
    NumberNotIn(Vec<f64>),
    NumberLessThan(f64),
    NumberGreaterThan(f64),
    NumberLessThanOrEquals(f64),
    NumberGreaterThanOrEquals(f64),
    NumberInRange(Vec<(f64, f64)>),
    NumberNotInRange(Vec<(f64, f64)>),
    BoolEquals(bool),
    StringContains(Vec<String>),
    StringNotContains(Vec<String>),
    StringBeginsWith(Vec<String>),
    StringNotBeginsWith(Vec<String>),
    StringEndsWith(Vec<String>),
    StringNotEndsWith(Vec<String>),
    StringIn(Vec<String>),
    StringNotIn(Vec<String>),
    IsNullOrUndefined,
    IsNotNull,
}

impl Condition {
    /// Whether it is a `Not` operator: the negation of a positive one on a value that is there.
    fn is_negation(&self) -> bool {
        matches!(
            self,
            Self::NumberNotIn(_)
                | Self::NumberNotInRange(_)
                | Self::StringNotContains(_)
                | Self::StringNotBeginsWith(_)
                | Self::StringNotEndsWith(_)
                | Self::StringNotIn(_)
        )
    }
}

const OPERATORS: &str = "NumberIn, NumberNotIn, NumberLessThan, NumberGreaterThan, NumberLessThanOrEquals, \
NumberGreaterThanOrEquals, NumberInRange, NumberNotInRange, BoolEquals, StringContains, StringNotContains, \
StringBeginsWith, StringNotBeginsWith, StringEndsWith, StringNotEndsWith, StringIn, StringNotIn, \
IsNullOrUndefined, IsNotNull";

const ENVELOPE_KEYS: [&str; 5] = ["id", "topic", "subject", "eventType", "dataVersion"];

impl AdvancedFilter {
    /// Parses `KEY OPERATOR VALUES…` as the command line gives it.
    pub fn parse(key: &str, operator: &str, values: &[String]) -> Result<Self, LimitError> {
        let field = format!("advancedFilter {key} {operator}");
        if !(ENVELOPE_KEYS.contains(&key)
            || key.strip_prefix("data.").is_some_and(|p| !p.is_empty())
            || key == "data")
        {
            return Err(LimitError::new(
                "advancedFilter key",
                format!("{key:?}"),
                "id, topic, subject, eventType, dataVersion, data or data.<path>",
            ));
        }
        if values.len() > MAX_FILTER_VALUES {
            return Err(LimitError::new(
                format!("{field} values"),
                values.len(),
                format!("at most {MAX_FILTER_VALUES} values"),
            ));
        }
        let numbers = || -> Result<Vec<f64>, LimitError> {
            let parsed: Result<Vec<f64>, _> = values.iter().map(|v| v.parse::<f64>()).collect();
            match parsed {
                Ok(n) if !n.is_empty() && n.iter().all(|x| x.is_finite()) => Ok(n),
                _ => Err(LimitError::new(
                    &field,
                    values.join(" "),
                    "one or more numbers",
                )),
            }
        };
        let one_number = || -> Result<f64, LimitError> {
            match numbers().as_deref() {
                Ok([n]) => Ok(*n),
                _ => Err(LimitError::new(
                    &field,
                    values.join(" "),
                    "exactly one number",
                )),
            }
        };
        let ranges = || -> Result<Vec<(f64, f64)>, LimitError> {
            values
                .iter()
                .map(|v| {
                    let (lo, hi) = v.split_once(',').unwrap_or((v, ""));
                    match (lo.trim().parse::<f64>(), hi.trim().parse::<f64>()) {
                        (Ok(lo), Ok(hi)) if lo <= hi => Ok((lo, hi)),
                        _ => Err(LimitError::new(
                            &field,
                            v,
                            "ranges written MIN,MAX with MIN <= MAX",
                        )),
                    }
                })
                .collect::<Result<Vec<_>, _>>()
                .and_then(|r| {
                    if r.is_empty() {
                        Err(LimitError::new(
                            &field,
                            "nothing",
                            "one or more MIN,MAX ranges",
                        ))
                    } else {
                        Ok(r)
                    }
                })
        };
        let strings = || -> Result<Vec<String>, LimitError> {
            if values.is_empty() {
                return Err(LimitError::new(&field, "nothing", "one or more strings"));
            }
            if let Some(long) = values
                .iter()
                .find(|v| v.chars().count() > MAX_FILTER_STRING_CHARS)
            {
                return Err(LimitError::new(
                    format!("{field} value"),
                    format!("{} characters", long.chars().count()),
                    format!("at most {MAX_FILTER_STRING_CHARS} characters"),
                ));
            }
            Ok(values.to_vec())
        };
        let none = |c: Condition| -> Result<Condition, LimitError> {
            if values.is_empty() {
                Ok(c)
            } else {
                Err(LimitError::new(&field, values.join(" "), "no values"))
            }
        };
        let condition = match operator {
            "NumberIn" => Condition::NumberIn(numbers()?),
            "NumberNotIn" => Condition::NumberNotIn(numbers()?),
            "NumberLessThan" => Condition::NumberLessThan(one_number()?),
            "NumberGreaterThan" => Condition::NumberGreaterThan(one_number()?),
            "NumberLessThanOrEquals" => Condition::NumberLessThanOrEquals(one_number()?),
            "NumberGreaterThanOrEquals" => Condition::NumberGreaterThanOrEquals(one_number()?),
            "NumberInRange" => Condition::NumberInRange(ranges()?),
            "NumberNotInRange" => Condition::NumberNotInRange(ranges()?),
            "BoolEquals" => match values {
                [v] if v.eq_ignore_ascii_case("true") => Condition::BoolEquals(true),
                [v] if v.eq_ignore_ascii_case("false") => Condition::BoolEquals(false),
                _ => {
                    return Err(LimitError::new(
                        &field,
                        values.join(" "),
                        "exactly one of true or false",
                    ));
                }
            },
            "StringContains" => Condition::StringContains(strings()?),
            "StringNotContains" => Condition::StringNotContains(strings()?),
            "StringBeginsWith" => Condition::StringBeginsWith(strings()?),
            "StringNotBeginsWith" => Condition::StringNotBeginsWith(strings()?),
            "StringEndsWith" => Condition::StringEndsWith(strings()?),
            "StringNotEndsWith" => Condition::StringNotEndsWith(strings()?),
            "StringIn" => Condition::StringIn(strings()?),
            "StringNotIn" => Condition::StringNotIn(strings()?),
            "IsNullOrUndefined" => none(Condition::IsNullOrUndefined)?,
            "IsNotNull" => none(Condition::IsNotNull)?,
            other => {
                return Err(LimitError::new(
                    "advancedFilter operator",
                    format!("{other:?}"),
                    OPERATORS,
                ));
            }
        };
        Ok(Self {
            key: key.to_string(),
            condition,
        })
    }

    /// Whether the event's value at the key satisfies the condition; `on_arrays`: whether an
    /// array value is looked into element by element (`enableAdvancedFilteringOnArrays`).
    pub fn matches(&self, event: &Value, on_arrays: bool) -> bool {
        use Condition as C;
        let Some(value) = lookup(event, &self.key) else {
            // Only these match an event without the key.
            return matches!(
                self.condition,
                C::IsNullOrUndefined
                    | C::NumberNotIn(_)
                    | C::NumberNotInRange(_)
                    | C::StringNotIn(_)
            );
        };
        let any_element = || elements(value, on_arrays).any(|e| self.positive_matches(e));
        match &self.condition {
            C::IsNullOrUndefined => value.is_null(),
            C::IsNotNull => !value.is_null(),
            c if c.is_negation() => !any_element(),
            _ => any_element(),
        }
    }

    /// How many values it holds (Event Grid counts them across a subscription's filters).
    pub fn value_count(&self) -> usize {
        use Condition as C;
        match &self.condition {
            C::NumberIn(v) | C::NumberNotIn(v) => v.len(),
            C::NumberInRange(r) | C::NumberNotInRange(r) => r.len(),
            C::StringContains(v)
            | C::StringNotContains(v)
            | C::StringBeginsWith(v)
            | C::StringNotBeginsWith(v)
            | C::StringEndsWith(v)
            | C::StringNotEndsWith(v)
            | C::StringIn(v)
            | C::StringNotIn(v) => v.len(),
            C::NumberLessThan(_)
            | C::NumberGreaterThan(_)
            | C::NumberLessThanOrEquals(_)
            | C::NumberGreaterThanOrEquals(_)
            | C::BoolEquals(_) => 1,
            C::IsNullOrUndefined | C::IsNotNull => 0,
        }
    }

    /// The operator without its negation, on one element.
    fn positive_matches(&self, e: &Value) -> bool {
        use Condition as C;
        let number = e.as_f64();
        let text = e.as_str().map(str::to_lowercase);
        let any_str = |values: &[String], test: &dyn Fn(&str, &str) -> bool| {
            text.as_deref()
                .is_some_and(|t| values.iter().any(|v| test(t, &v.to_lowercase())))
        };
        match &self.condition {
            C::NumberIn(vs) | C::NumberNotIn(vs) => number.is_some_and(|n| vs.contains(&n)),
            C::NumberLessThan(v) => number.is_some_and(|n| n < *v),
            C::NumberGreaterThan(v) => number.is_some_and(|n| n > *v),
            C::NumberLessThanOrEquals(v) => number.is_some_and(|n| n <= *v),
            C::NumberGreaterThanOrEquals(v) => number.is_some_and(|n| n >= *v),
            C::NumberInRange(rs) | C::NumberNotInRange(rs) => {
                number.is_some_and(|n| rs.iter().any(|(lo, hi)| *lo <= n && n <= *hi))
            }
            C::BoolEquals(b) => e.as_bool() == Some(*b),
            C::StringContains(vs) | C::StringNotContains(vs) => any_str(vs, &|t, v| t.contains(v)),
            C::StringBeginsWith(vs) | C::StringNotBeginsWith(vs) => {
                any_str(vs, &|t, v| t.starts_with(v))
            }
            C::StringEndsWith(vs) | C::StringNotEndsWith(vs) => any_str(vs, &|t, v| t.ends_with(v)),
            C::StringIn(vs) | C::StringNotIn(vs) => any_str(vs, &|t, v| t == v),
            C::IsNullOrUndefined | C::IsNotNull => false,
        }
    }
}

/// The value at `key`: an envelope field, or a dotted path under `data`.
fn lookup<'a>(event: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(event, |v, part| v.get(part))
}

/// An array's elements when arrays are looked into, or the value itself.
fn elements(v: &Value, on_arrays: bool) -> Box<dyn Iterator<Item = &Value> + '_> {
    match v {
        Value::Array(items) if on_arrays => Box::new(items.iter()),
        other => Box::new(std::iter::once(other)),
    }
}

impl EventFilter {
    /// Checks the limits (25 advanced filters, 25 values across them, non-empty lists).
    pub fn validate(&self) -> Result<(), LimitError> {
        if self.advanced_filters.len() > MAX_ADVANCED_FILTERS {
            return Err(LimitError::new(
                "advancedFilters",
                format!("{} filters", self.advanced_filters.len()),
                format!("at most {MAX_ADVANCED_FILTERS}"),
            ));
        }
        let values: usize = self
            .advanced_filters
            .iter()
            .map(AdvancedFilter::value_count)
            .sum();
        if values > MAX_FILTER_VALUES {
            return Err(LimitError::new(
                "advancedFilters values",
                format!("{values} values"),
                format!("at most {MAX_FILTER_VALUES} values across all advanced filters"),
            ));
        }
        if let Some(types) = &self.included_event_types
            && (types.is_empty() || types.iter().any(String::is_empty))
        {
            return Err(LimitError::new(
                "includedEventTypes",
                "an empty type",
                "one or more non-empty types",
            ));
        }
        Ok(())
    }

    /// Whether the filter lets every event through (so events need not be parsed).
    pub fn is_empty(&self) -> bool {
        self.included_event_types.is_none()
            && self.subject_begins_with.is_none()
            && self.subject_ends_with.is_none()
            && self.advanced_filters.is_empty()
    }

    /// Whether an event (parsed, in its topic's input schema) passes this filter; `fields`
    /// says where that schema keeps the event type and subject (`type` for CloudEvents).
    pub fn matches(&self, event: &Value, fields: FilterFields) -> bool {
        if let Some(types) = &self.included_event_types {
            let event_type = event
                .get(fields.event_type)
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !types.iter().any(|t| {
                t.eq_ignore_ascii_case(ALL_EVENT_TYPES) || t.eq_ignore_ascii_case(event_type)
            }) {
                return false;
            }
        }
        let subject = event
            .get(fields.subject)
            .and_then(Value::as_str)
            .unwrap_or_default();
        let fold = |s: &str| {
            if self.is_subject_case_sensitive {
                s.to_string()
            } else {
                s.to_lowercase()
            }
        };
        let subject = fold(subject);
        if let Some(prefix) = &self.subject_begins_with
            && !subject.starts_with(&fold(prefix))
        {
            return false;
        }
        if let Some(suffix) = &self.subject_ends_with
            && !subject.ends_with(&fold(suffix))
        {
            return false;
        }
        let on_arrays = self.enable_advanced_filtering_on_arrays;
        self.advanced_filters
            .iter()
            .all(|f| f.matches(event, on_arrays))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn f(key: &str, op: &str, values: &[&str]) -> AdvancedFilter {
        let values: Vec<String> = values.iter().map(|s| s.to_string()).collect();
        AdvancedFilter::parse(key, op, &values).unwrap()
    }

    fn event() -> Value {
        json!({
            "id": "1", "subject": "/Blobs/Photos/cat.JPG", "eventType": "Storage.BlobCreated",
            "dataVersion": "1.0",
            "data": {"size": 1500, "tags": ["red", "big"], "public": true, "url": "https://x/cat.jpg",
                     "owner": null, "nested": {"level": 3}}
        })
    }

    #[test]
    fn included_event_types_and_subject_filters() {
        let e = event();
        let types = EventFilter {
            included_event_types: Some(vec!["storage.blobcreated".into()]),
            ..EventFilter::default()
        };
        assert!(types.matches(&e, FilterFields::default()));
        let other = EventFilter {
            included_event_types: Some(vec!["Storage.BlobDeleted".into()]),
            ..EventFilter::default()
        };
        assert!(!other.matches(&e, FilterFields::default()));
        let prefix = EventFilter {
            subject_begins_with: Some("/blobs/photos".into()),
            subject_ends_with: Some(".jpg".into()),
            ..EventFilter::default()
        };
        assert!(
            prefix.matches(&e, FilterFields::default()),
            "case-insensitive by default"
        );
        let sensitive = EventFilter {
            is_subject_case_sensitive: true,
            ..prefix.clone()
        };
        assert!(!sensitive.matches(&e, FilterFields::default()));
        assert!(EventFilter::default().matches(&e, FilterFields::default()));

        // F2: a CloudEvents topic's events are filtered on `type`.
        let cloud_event = json!({"type": "Storage.BlobCreated", "subject": "/blobs/photos/a.jpg"});
        let ce_fields = crate::schema::InputSchema::CloudEventSchemaV1_0.filter_fields();
        assert!(types.matches(&cloud_event, ce_fields));
        assert!(!types.matches(&cloud_event, FilterFields::default()));
        assert!(prefix.matches(&cloud_event, ce_fields));
    }

    /// Every operator, matching and not matching.
    #[test]
    fn advanced_operators() {
        let e = event();
        let cases: &[(&str, &str, &[&str], bool)] = &[
            ("data.size", "NumberIn", &["1500", "2"], true),
            ("data.size", "NumberIn", &["1"], false),
            ("data.size", "NumberNotIn", &["1"], true),
            ("data.size", "NumberNotIn", &["1500"], false),
            ("data.size", "NumberLessThan", &["2000"], true),
            ("data.size", "NumberLessThan", &["1500"], false),
            ("data.size", "NumberGreaterThan", &["1000"], true),
            ("data.size", "NumberLessThanOrEquals", &["1500"], true),
            ("data.size", "NumberGreaterThanOrEquals", &["1501"], false),
            ("data.size", "NumberInRange", &["0,10", "1000,2000"], true),
            ("data.size", "NumberNotInRange", &["0,10"], true),
            ("data.size", "NumberNotInRange", &["1000,2000"], false),
            ("data.public", "BoolEquals", &["true"], true),
            ("data.public", "BoolEquals", &["false"], false),
            ("data.url", "StringContains", &["CAT"], true),
            ("data.url", "StringNotContains", &["dog"], true),
            ("data.url", "StringBeginsWith", &["https://"], true),
            ("data.url", "StringNotBeginsWith", &["https://"], false),
            ("subject", "StringEndsWith", &[".jpg"], true),
            ("subject", "StringNotEndsWith", &[".png"], true),
            ("eventType", "StringIn", &["storage.blobcreated"], true),
            ("eventType", "StringNotIn", &["Storage.BlobCreated"], false),
            ("data.tags", "StringIn", &["big"], true),
            ("data.tags", "StringNotIn", &["red"], false),
            ("data.owner", "IsNullOrUndefined", &[], true),
            ("data.missing", "IsNullOrUndefined", &[], true),
            ("data.size", "IsNullOrUndefined", &[], false),
            ("data.size", "IsNotNull", &[], true),
            ("data.owner", "IsNotNull", &[], false),
            ("data.nested.level", "NumberIn", &["3"], true),
            ("data.missing", "StringIn", &["x"], false),
        ];
        for (key, op, values, expected) in cases {
            assert_eq!(
                f(key, op, values).matches(&e, true),
                *expected,
                "{key} {op} {values:?}"
            );
        }
    }

    /// Item 8, and #34 item 11: on a missing key only `IsNullOrUndefined`, `NumberNotIn`,
    /// `NumberNotInRange` and `StringNotIn` match (the Event Grid simulator's truth table; the
    /// `NumberNotInRange` row is a reading of it, not a documented rule); the other `Not`
    /// operators and every positive one do not.
    #[test]
    fn a_missing_key_matches_only_four_operators() {
        let e = event();
        let cases: &[(&str, &[&str], bool)] = &[
            ("IsNullOrUndefined", &[], true),
            ("NumberNotIn", &["1"], true),
            ("StringNotIn", &["x"], true),
            ("NumberNotInRange", &["0,1"], true),
            ("StringNotContains", &["x"], false),
            ("StringNotBeginsWith", &["x"], false),
            ("StringNotEndsWith", &["x"], false),
            ("IsNotNull", &[], false),
            ("StringIn", &["x"], false),
            ("NumberLessThan", &["1"], false),
            ("BoolEquals", &["false"], false),
        ];
        for (op, values, expected) in cases {
            for on_arrays in [false, true] {
                assert_eq!(
                    f("data.missing", op, values).matches(&e, on_arrays),
                    *expected,
                    "{op} on a missing key"
                );
            }
        }
    }

    /// Item 10: without `enableAdvancedFilteringOnArrays` an array is one value, which no
    /// comparison matches (so a `Not` does); with it, any element may match, and a `Not`
    /// matches when none does.
    #[test]
    fn arrays_are_looked_into_only_when_enabled() {
        let e = event(); // data.tags = ["red", "big"]
        let cases: &[(&str, &[&str], bool, bool)] = &[
            // operator, values, without the flag, with it
            ("StringIn", &["big"], false, true),
            ("StringNotIn", &["big"], true, false),
            ("StringNotIn", &["blue"], true, true),
            ("StringContains", &["ig"], false, true),
            ("StringBeginsWith", &["re"], false, true),
            ("StringNotEndsWith", &["ed"], true, false),
            ("IsNotNull", &[], true, true),
        ];
        for (op, values, off, on) in cases {
            let filter = f("data.tags", op, values);
            assert_eq!(
                filter.matches(&e, false),
                *off,
                "{op} {values:?} without the flag"
            );
            assert_eq!(
                filter.matches(&e, true),
                *on,
                "{op} {values:?} with the flag"
            );
        }
        let numbers = json!({"data": {"n": [1, 5, 9]}});
        let in_range = f("data.n", "NumberInRange", &["4,6"]);
        assert!(!in_range.matches(&numbers, false));
        assert!(in_range.matches(&numbers, true));
        // Off for a new filter; stored with it, both ways; a stored filter from before the
        // flag keeps looking into arrays, as it did.
        let new = EventFilter {
            advanced_filters: vec![f("data.tags", "StringIn", &["big"])],
            ..EventFilter::default()
        };
        assert!(!new.matches(&e, FilterFields::default()));
        let text = serde_json::to_string(&new).unwrap();
        assert!(
            text.contains(r#""enableAdvancedFilteringOnArrays":false"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<EventFilter>(&text).unwrap(), new);
        let older: EventFilter = serde_json::from_value(json!({
            "advancedFilters": [{"key": "data.tags", "operatorType": "StringIn", "values": ["big"]}]
        }))
        .unwrap();
        assert!(older.enable_advanced_filtering_on_arrays);
        assert!(older.matches(&e, FilterFields::default()));
    }

    /// Item 7: two advanced filters on the same key must both match (AND), as any two do.
    #[test]
    fn filters_on_the_same_key_must_all_match() {
        let e = event(); // data.size = 1500
        let both = |lo: &str, hi: &str| EventFilter {
            advanced_filters: vec![
                f("data.size", "NumberGreaterThan", &[lo]),
                f("data.size", "NumberLessThan", &[hi]),
            ],
            ..EventFilter::default()
        };
        assert!(both("1000", "2000").matches(&e, FilterFields::default()));
        assert!(
            !both("1000", "1200").matches(&e, FilterFields::default()),
            "only the first matches"
        );
        assert!(
            !both("1600", "2000").matches(&e, FilterFields::default()),
            "only the second matches"
        );
    }

    /// Item 9: `All` among the included event types lets every type through.
    #[test]
    fn included_event_types_all_means_every_type() {
        for all in ["All", "all"] {
            let filter = EventFilter {
                included_event_types: Some(vec![all.into()]),
                ..EventFilter::default()
            };
            assert!(filter.matches(&event(), FilterFields::default()));
            assert!(filter.matches(
                &json!({"eventType": "Anything.Else"}),
                FilterFields::default()
            ));
        }
    }

    /// Limits and malformed values are refused, naming the filter.
    #[test]
    fn invalid_filters_are_refused() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(AdvancedFilter::parse("data.x", "NumberLessThan", &s(&["1", "2"])).is_err());
        assert!(AdvancedFilter::parse("data.x", "NumberIn", &s(&["abc"])).is_err());
        assert!(AdvancedFilter::parse("data.x", "NumberInRange", &s(&["5,1"])).is_err());
        assert!(AdvancedFilter::parse("data.x", "BoolEquals", &s(&["yes"])).is_err());
        assert!(AdvancedFilter::parse("data.x", "IsNotNull", &s(&["1"])).is_err());
        assert!(AdvancedFilter::parse("data.x", "StringIn", &[]).is_err());
        assert!(AdvancedFilter::parse("other", "StringIn", &s(&["a"])).is_err());
        let err = AdvancedFilter::parse("data.x", "Like", &s(&["a"])).unwrap_err();
        assert!(err.allowed.contains("StringNotEndsWith"));
        let many: Vec<String> = (0..26).map(|i| i.to_string()).collect();
        let err = AdvancedFilter::parse("data.x", "NumberIn", &many).unwrap_err();
        assert_eq!(err.value, "26");
        let filter = EventFilter {
            advanced_filters: vec![f("data.x", "IsNotNull", &[]); 26],
            ..EventFilter::default()
        };
        assert_eq!(filter.validate().unwrap_err().field, "advancedFilters");
        // 25 values across all filters: 13 + 12 pass, 13 + 13 do not.
        let values = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
        let spread = |a: usize, b: usize| EventFilter {
            advanced_filters: vec![
                AdvancedFilter::parse("data.x", "NumberIn", &values(a)).unwrap(),
                AdvancedFilter::parse("data.y", "StringIn", &values(b)).unwrap(),
            ],
            ..EventFilter::default()
        };
        assert!(spread(13, 12).validate().is_ok());
        let err = spread(13, 13).validate().unwrap_err();
        assert_eq!(err.field, "advancedFilters values");
        assert_eq!(err.value, "26 values");
        assert!(err.allowed.contains("25"), "{err}");
        // Strings at most 512 characters.
        assert!(AdvancedFilter::parse("data.x", "StringIn", &s(&[&"a".repeat(512)])).is_ok());
        let err =
            AdvancedFilter::parse("data.x", "StringContains", &s(&[&"é".repeat(513)])).unwrap_err();
        assert_eq!(err.value, "513 characters");
        assert!(
            err.field
                .starts_with("advancedFilter data.x StringContains"),
            "{err}"
        );
        assert!(err.allowed.contains("512"), "{err}");
    }

    #[test]
    fn stored_form_round_trips() {
        let filter = EventFilter {
            included_event_types: Some(vec!["A".into()]),
            advanced_filters: vec![
                f("data.size", "NumberInRange", &["1,2"]),
                f("data.a", "IsNotNull", &[]),
            ],
            ..EventFilter::default()
        };
        let text = serde_json::to_string(&filter).unwrap();
        assert!(text.contains(r#""operatorType":"NumberInRange""#), "{text}");
        assert_eq!(serde_json::from_str::<EventFilter>(&text).unwrap(), filter);
    }

    proptest! {
        /// A Not operator is the exact negation of its positive form when the key is present.
        #[test]
        fn not_operators_negate(n in -1000i64..1000, v in -1000i64..1000, word in "[a-z]{1,6}", s in "[a-z]{0,8}") {
            let e = json!({"data": {"n": n, "s": s}});
            let pairs = [
                ("data.n", "NumberIn", "NumberNotIn", v.to_string()),
                ("data.n", "NumberInRange", "NumberNotInRange", format!("{},{}", v.min(0), v.max(0))),
                ("data.s", "StringContains", "StringNotContains", word.clone()),
                ("data.s", "StringBeginsWith", "StringNotBeginsWith", word.clone()),
                ("data.s", "StringEndsWith", "StringNotEndsWith", word.clone()),
                ("data.s", "StringIn", "StringNotIn", word.clone()),
            ];
            for (key, pos, neg, value) in pairs {
                let p = AdvancedFilter::parse(key, pos, std::slice::from_ref(&value)).unwrap();
                let q = AdvancedFilter::parse(key, neg, std::slice::from_ref(&value)).unwrap();
                for on_arrays in [false, true] {
                    prop_assert_eq!(p.matches(&e, on_arrays), !q.matches(&e, on_arrays));
                }
            }
        }
    }
}
