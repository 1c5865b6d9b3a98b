//! What a publish request must hold (F1), and what gridrelay stamps onto each event.
//!
//! Events stay raw JSON: only the envelope fields are read to validate them, and missing
//! `topic`, `metadataVersion` and `dataVersion` fields are spliced into the raw text, so the
//! publisher's `data` is never parsed into a tree and re-serialized.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::limits::{MAX_EVENT_BYTES, MAX_PUBLISH_BYTES};

/// Why a publish request was refused. Each maps to one HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// 413: the body is larger than Event Grid takes.
    #[error("request body is {size} bytes; allowed: at most {MAX_PUBLISH_BYTES} bytes")]
    TooLarge { size: usize },
    /// 413: one event is larger than gridrelay can carry.
    #[error("events[{index}] is {size} bytes; allowed: at most {MAX_EVENT_BYTES} bytes per event")]
    EventTooLarge { index: usize, size: usize },
    /// 400: the body is not a JSON array of objects.
    #[error("request body must be a JSON array of events: {reason}")]
    Malformed { reason: String },
    /// 400: one event misses a field or has a wrong value.
    #[error("events[{index}].{field}: {problem}")]
    InvalidEvent {
        index: usize,
        field: &'static str,
        problem: String,
    },
}

impl PublishError {
    pub fn http_status(&self) -> u16 {
        match self {
            Self::TooLarge { .. } | Self::EventTooLarge { .. } => 413,
            Self::Malformed { .. } | Self::InvalidEvent { .. } => 400,
        }
    }
}

/// The envelope fields, read without touching `data`.
#[derive(Deserialize)]
struct Envelope {
    id: Option<Value>,
    subject: Option<Value>,
    #[serde(rename = "eventType")]
    event_type: Option<Value>,
    #[serde(rename = "eventTime")]
    event_time: Option<Value>,
    #[serde(rename = "dataVersion")]
    data_version: Option<Value>,
    #[serde(rename = "metadataVersion")]
    metadata_version: Option<Value>,
    topic: Option<Value>,
}

/// Validates an Event Grid schema publish body and returns each event, stamped, as raw JSON.
pub fn parse_event_grid_batch(
    body: &[u8],
    topic_resource_id: &str,
) -> Result<Vec<Box<RawValue>>, PublishError> {
    if body.len() > MAX_PUBLISH_BYTES {
        return Err(PublishError::TooLarge { size: body.len() });
    }
    let text = std::str::from_utf8(body).map_err(|e| PublishError::Malformed {
        reason: format!("not UTF-8 ({e})"),
    })?;
    let events: Vec<&RawValue> =
        serde_json::from_str(text).map_err(|e| PublishError::Malformed {
            reason: e.to_string(),
        })?;
    events
        .iter()
        .enumerate()
        .map(|(index, raw)| validate_and_stamp(index, raw, topic_resource_id))
        .collect()
}

fn validate_and_stamp(
    index: usize,
    raw: &RawValue,
    topic_resource_id: &str,
) -> Result<Box<RawValue>, PublishError> {
    let invalid = |field: &'static str, problem: &str| PublishError::InvalidEvent {
        index,
        field,
        problem: problem.to_string(),
    };
    let text = raw.get();
    if !text.starts_with('{') {
        return Err(PublishError::Malformed {
            reason: format!("events[{index}] is not a JSON object"),
        });
    }
    if text.len() > MAX_EVENT_BYTES {
        return Err(PublishError::EventTooLarge {
            index,
            size: text.len(),
        });
    }
    let env: Envelope = serde_json::from_str(text).map_err(|e| PublishError::Malformed {
        reason: format!("events[{index}]: {e}"),
    })?;

    require_string(env.id.as_ref(), true).map_err(|p| invalid("id", p))?;
    require_string(env.subject.as_ref(), false).map_err(|p| invalid("subject", p))?;
    require_string(env.event_type.as_ref(), true).map_err(|p| invalid("eventType", p))?;
    let time =
        require_string(env.event_time.as_ref(), true).map_err(|p| invalid("eventTime", p))?;
    if chrono::DateTime::parse_from_rfc3339(time).is_err() {
        return Err(invalid(
            "eventTime",
            &format!("{time:?} is not an RFC 3339 date-time"),
        ));
    }

    let mut stamps: Vec<(&str, String)> = Vec::new();
    match &env.data_version {
        None => stamps.push(("dataVersion", String::new())),
        Some(Value::String(_)) => {}
        Some(_) => return Err(invalid("dataVersion", "must be a string")),
    }
    match &env.metadata_version {
        None => stamps.push(("metadataVersion", "1".to_string())),
        Some(Value::String(v)) if v == "1" => {}
        Some(other) => {
            return Err(invalid(
                "metadataVersion",
                &format!("is {other}; allowed: \"1\" or absent"),
            ));
        }
    }
    match &env.topic {
        None => stamps.push(("topic", topic_resource_id.to_string())),
        Some(Value::String(t)) if t == topic_resource_id => {}
        Some(other) => {
            return Err(invalid(
                "topic",
                &format!("is {other}; allowed: \"{topic_resource_id}\" or absent"),
            ));
        }
    }
    insert_fields(text, &stamps).map_err(|e| PublishError::Malformed {
        reason: format!("events[{index}]: {e}"),
    })
}

fn require_string(value: Option<&Value>, non_empty: bool) -> Result<&str, &'static str> {
    match value {
        None | Some(Value::Null) => Err("is required"),
        Some(Value::String(s)) if non_empty && s.is_empty() => Err("must not be empty"),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err("must be a string"),
    }
}

/// Adds string fields at the front of a raw JSON object, without re-serializing the rest.
pub fn insert_fields(
    object: &str,
    fields: &[(&str, String)],
) -> Result<Box<RawValue>, serde_json::Error> {
    insert_raw_fields(
        object,
        &fields
            .iter()
            .map(|(k, v)| (*k, Value::String(v.clone())))
            .collect::<Vec<_>>(),
        Placement::Front,
    )
}

/// Where [`insert_raw_fields`] puts the new fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Front,
    Back,
}

/// Adds fields to a raw JSON object (which must start with `{` and end with `}`).
pub fn insert_raw_fields(
    object: &str,
    fields: &[(&str, Value)],
    placement: Placement,
) -> Result<Box<RawValue>, serde_json::Error> {
    let object = object.trim();
    if fields.is_empty() {
        return RawValue::from_string(object.to_string());
    }
    let added = fields
        .iter()
        .map(|(k, v)| format!("{}:{}", Value::String((*k).to_string()), v))
        .collect::<Vec<_>>()
        .join(",");
    let inner = object
        .strip_prefix('{')
        .and_then(|o| o.strip_suffix('}'))
        .map(str::trim)
        .ok_or_else(|| <serde_json::Error as serde::de::Error>::custom("not a JSON object"))?;
    let text = match (inner.is_empty(), placement) {
        (true, _) => format!("{{{added}}}"),
        (false, Placement::Front) => format!("{{{added},{inner}}}"),
        (false, Placement::Back) => format!("{{{inner},{added}}}"),
    };
    // Parsing again proves the result is one JSON value; it costs one scan of the text.
    RawValue::from_string(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TOPIC: &str = "/gridrelay/topics/orders";

    fn event() -> Value {
        json!({"id": "1", "subject": "s", "eventType": "t", "eventTime": "2026-11-22T03:00:00Z", "data": {"a": 1}})
    }

    fn parse(v: &Value) -> Result<Vec<Box<RawValue>>, PublishError> {
        parse_event_grid_batch(v.to_string().as_bytes(), TOPIC)
    }

    /// F1: a valid event is accepted and stamped with topic, metadataVersion and dataVersion.
    #[test]
    fn valid_event_is_stamped_f1() {
        let out = parse(&json!([event()])).unwrap();
        let v: Value = serde_json::from_str(out[0].get()).unwrap();
        assert_eq!(v["topic"], TOPIC);
        assert_eq!(v["metadataVersion"], "1");
        assert_eq!(v["dataVersion"], "");
        assert_eq!(v["data"], json!({"a": 1}));
        assert_eq!(v["id"], "1");
    }

    /// The error names the event's index and the field.
    #[test]
    fn missing_field_names_index_and_field() {
        let mut bad = event();
        bad.as_object_mut().unwrap().remove("eventType");
        let err = parse(&json!([event(), bad])).unwrap_err();
        assert_eq!(err.to_string(), "events[1].eventType: is required");
        assert_eq!(err.http_status(), 400);

        let mut bad = event();
        bad["eventTime"] = json!("yesterday");
        assert!(matches!(
            parse(&json!([bad])).unwrap_err(),
            PublishError::InvalidEvent {
                field: "eventTime",
                ..
            }
        ));

        let mut bad = event();
        bad["topic"] = json!("/other");
        assert!(matches!(
            parse(&json!([bad])).unwrap_err(),
            PublishError::InvalidEvent { field: "topic", .. }
        ));
    }

    #[test]
    fn malformed_bodies_are_refused() {
        for body in ["{}", "[1]", "not json", "[{\"id\":"] {
            let err = parse_event_grid_batch(body.as_bytes(), TOPIC).unwrap_err();
            assert_eq!(err.http_status(), 400, "{body}");
        }
    }

    #[test]
    fn size_limits_are_413() {
        let big = vec![b' '; MAX_PUBLISH_BYTES + 1];
        assert_eq!(
            parse_event_grid_batch(&big, TOPIC)
                .unwrap_err()
                .http_status(),
            413
        );
        let mut e = event();
        e["data"] = json!("x".repeat(MAX_EVENT_BYTES));
        let err = parse(&json!([e])).unwrap_err();
        assert!(matches!(err, PublishError::EventTooLarge { index: 0, .. }));
    }

    #[test]
    fn insert_raw_fields_keeps_the_original_text() {
        let out =
            insert_raw_fields(r#"{"a": [1, 2]}"#, &[("b", json!(3))], Placement::Back).unwrap();
        assert_eq!(out.get(), r#"{"a": [1, 2],"b":3}"#);
        let out = insert_raw_fields("{ }", &[("b", json!(3))], Placement::Front).unwrap();
        assert_eq!(out.get(), r#"{"b":3}"#);
        assert!(insert_raw_fields("[1]", &[("b", json!(3))], Placement::Front).is_err());
    }
}
