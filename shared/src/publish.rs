//! What a publish request must hold, in each input schema a topic can take, and what
//! gridrelay stamps onto each event.
//!
//! - Event Grid schema (F1): a JSON array; missing `topic`, `metadataVersion` and
//!   `dataVersion` fields are spliced into the raw text, so the publisher's `data` is never
//!   parsed into a tree and re-serialized.
//! - CloudEvents 1.0 (F2), in the three modes of the HTTP binding: structured
//!   (`application/cloudevents+json`, one event), batched (`application/cloudevents-batch+json`,
//!   an array) and binary (`ce-*` headers, the body is `data`). Events are kept as structured
//!   JSON, unchanged.
//! - Custom schema (F3): any JSON object (or array of them), kept as the Event Grid envelope the
//!   topic's mapping makes (see [`crate::schema`]).
//!
//! A request in a schema its topic does not take is refused with a 400 that names the schema
//! the topic takes.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::limits::{MAX_EVENT_BYTES, MAX_PUBLISH_BYTES};
use crate::queue_text::escape_for_sqs;
use crate::raw_json::{append_raw_field, insert_fields};
use crate::readable::check_readable;
use crate::schema::{InputMapping, InputSchema};

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
        field: String,
        problem: String,
    },
    /// 400: the request is in a schema the topic does not take.
    #[error("topic {topic:?} takes {takes} events; this request is {got}. {hint}")]
    WrongSchema {
        topic: String,
        takes: InputSchema,
        got: &'static str,
        hint: &'static str,
    },
}

impl PublishError {
    pub fn http_status(&self) -> u16 {
        match self {
            Self::TooLarge { .. } | Self::EventTooLarge { .. } => 413,
            Self::Malformed { .. } | Self::InvalidEvent { .. } | Self::WrongSchema { .. } => 400,
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
    let invalid = |field: &str, problem: &str| PublishError::InvalidEvent {
        index,
        field: field.to_string(),
        problem: problem.to_string(),
    };
    let text = object_within_limit(index, raw)?;
    let env: Envelope = serde_json::from_str(text).map_err(|e| PublishError::Malformed {
        reason: format!("events[{index}]: {e}"),
    })?;
    if env.event_type.is_none() && text.contains("\"specversion\"") {
        return Err(invalid(
            "eventType",
            "is required; this looks like a CloudEvent, but the topic takes EventGridSchema events",
        ));
    }

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

/// One event's text, if it is a JSON object no larger than one event may be.
fn object_within_limit(index: usize, raw: &RawValue) -> Result<&str, PublishError> {
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
    Ok(text)
}

fn require_string(value: Option<&Value>, non_empty: bool) -> Result<&str, &'static str> {
    match value {
        None | Some(Value::Null) => Err("is required"),
        Some(Value::String(s)) if non_empty && s.is_empty() => Err("must not be empty"),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err("must be a string"),
    }
}

/// How a publish request presents its events, as its headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// A JSON body: an Event Grid array, or custom events.
    Json,
    /// `application/cloudevents+json`: one structured CloudEvent.
    CloudEvent,
    /// `application/cloudevents-batch+json`: an array of structured CloudEvents.
    CloudEventBatch,
    /// `ce-specversion` and the other attributes in `ce-*` headers; the body is `data`.
    CloudEventBinary,
}

impl Framing {
    fn describe(self) -> &'static str {
        match self {
            Self::Json => "plain JSON",
            Self::CloudEvent => "a structured CloudEvent (application/cloudevents+json)",
            Self::CloudEventBatch => "a CloudEvents batch (application/cloudevents-batch+json)",
            Self::CloudEventBinary => "a binary-mode CloudEvent (ce-* headers)",
        }
    }
}

/// A publish request's body and the headers that say how to read it.
#[derive(Debug, Clone, Copy)]
pub struct PublishBody<'a> {
    pub content_type: Option<&'a str>,
    /// Every `ce-*` header, names lowercase.
    pub ce_headers: &'a [(String, String)],
    pub body: &'a [u8],
}

impl PublishBody<'_> {
    pub fn framing(&self) -> Framing {
        match self.media_type().as_str() {
            "application/cloudevents+json" => Framing::CloudEvent,
            "application/cloudevents-batch+json" => Framing::CloudEventBatch,
            _ if self.ce_headers.iter().any(|(n, _)| n == "ce-specversion") => {
                Framing::CloudEventBinary
            }
            _ => Framing::Json,
        }
    }

    fn media_type(&self) -> String {
        self.content_type
            .and_then(|c| c.split(';').next())
            .map(|c| c.trim().to_ascii_lowercase())
            .unwrap_or_default()
    }
}

/// What a topic needs to read a publish request: its name, resource path, schema and mapping.
#[derive(Debug, Clone, Copy)]
pub struct TopicSchema<'a> {
    pub name: &'a str,
    pub resource_id: &'a str,
    pub input_schema: InputSchema,
    pub mapping: Option<&'a InputMapping>,
}

/// Validates a publish request in its topic's input schema and returns each event as it is
/// kept (see the module docs). `new_id` makes ids for custom events that map none.
pub fn parse_publish(
    request: &PublishBody<'_>,
    topic: TopicSchema<'_>,
    now: chrono::DateTime<chrono::Utc>,
    new_id: &mut dyn FnMut() -> String,
) -> Result<Vec<Box<RawValue>>, PublishError> {
    if request.body.len() > MAX_PUBLISH_BYTES {
        return Err(PublishError::TooLarge {
            size: request.body.len(),
        });
    }
    let mut events = parse_framed(request, topic, now, new_id)?;
    for (index, event) in events.iter_mut().enumerate() {
        // #34 item 7: U+FFFE and U+FFFF, which SQS refuses, as escapes (the same JSON value),
        // before the size is checked: the event travels, and is measured, as written.
        if let Cow::Owned(escaped) = escape_for_sqs(event.get()) {
            *event = RawValue::from_string(escaped).map_err(|e| PublishError::InvalidEvent {
                index,
                field: "(event)".to_string(),
                problem: e.to_string(),
            })?;
        }
        // As kept: a custom event's envelope may be larger than the event (mapped fields are
        // copied into it); it still has to fit a queue message, or it could never be enqueued.
        if event.get().len() > MAX_EVENT_BYTES {
            return Err(PublishError::EventTooLarge {
                index,
                size: event.get().len(),
            });
        }
        // What is accepted can be read by every filter, and read the same way by all.
        check_readable(event.get()).map_err(|e| PublishError::InvalidEvent {
            index,
            field: e.field,
            problem: e.problem,
        })?;
    }
    Ok(events)
}

/// The events of a request in the framing it came in, checked against the topic's schema.
fn parse_framed(
    request: &PublishBody<'_>,
    topic: TopicSchema<'_>,
    now: chrono::DateTime<chrono::Utc>,
    new_id: &mut dyn FnMut() -> String,
) -> Result<Vec<Box<RawValue>>, PublishError> {
    let framing = request.framing();
    let wrong = |hint: &'static str| PublishError::WrongSchema {
        topic: topic.name.to_string(),
        takes: topic.input_schema,
        got: framing.describe(),
        hint,
    };
    match (topic.input_schema, framing) {
        (InputSchema::EventGridSchema, Framing::Json) => {
            parse_event_grid_batch(request.body, topic.resource_id)
        }
        (InputSchema::EventGridSchema, _) => Err(wrong(
            "Send a JSON array of Event Grid events with content type application/json.",
        )),
        (InputSchema::CustomEventSchema, Framing::Json) => parse_custom_events(
            request.body,
            topic.mapping.unwrap_or(&InputMapping::default()),
            topic.resource_id,
            now,
            new_id,
        ),
        (InputSchema::CustomEventSchema, _) => Err(wrong(
            "Send your events as JSON (one object or an array) with content type application/json.",
        )),
        (InputSchema::CloudEventSchemaV1_0, Framing::CloudEvent) => {
            let text = utf8(request.body)?;
            let raw: &RawValue =
                serde_json::from_str(text).map_err(|e| PublishError::Malformed {
                    reason: format!("not one JSON CloudEvent: {e}"),
                })?;
            Ok(vec![validate_cloud_event(0, raw)?])
        }
        (InputSchema::CloudEventSchemaV1_0, Framing::CloudEventBatch) => {
            let text = utf8(request.body)?;
            let events: Vec<&RawValue> =
                serde_json::from_str(text).map_err(|e| PublishError::Malformed {
                    reason: format!("not a JSON array of CloudEvents: {e}"),
                })?;
            events
                .iter()
                .enumerate()
                .map(|(i, raw)| validate_cloud_event(i, raw))
                .collect()
        }
        (InputSchema::CloudEventSchemaV1_0, Framing::CloudEventBinary) => {
            let raw = binary_cloud_event(request)?;
            Ok(vec![validate_cloud_event(0, &raw)?])
        }
        (InputSchema::CloudEventSchemaV1_0, Framing::Json) => Err(wrong(
            "Send application/cloudevents+json, application/cloudevents-batch+json, or a binary-mode event with ce-* headers.",
        )),
    }
}

fn utf8(body: &[u8]) -> Result<&str, PublishError> {
    std::str::from_utf8(body).map_err(|e| PublishError::Malformed {
        reason: format!("not UTF-8 ({e})"),
    })
}

/// F2: checks one structured CloudEvent: required `specversion` "1.0", `id`, `source`, `type`;
/// optional `subject`, `time` (RFC 3339), `datacontenttype`, `dataschema`; `data` or
/// `data_base64` (not both); extension names of lowercase letters and digits, with simple
/// values.
fn validate_cloud_event(index: usize, raw: &RawValue) -> Result<Box<RawValue>, PublishError> {
    let invalid = |field: &str, problem: String| PublishError::InvalidEvent {
        index,
        field: field.to_string(),
        problem,
    };
    let text = object_within_limit(index, raw)?;
    let fields: serde_json::Map<String, Value> = {
        let all: std::collections::BTreeMap<String, &RawValue> = serde_json::from_str(text)
            .map_err(|e| PublishError::Malformed {
                reason: format!("events[{index}]: {e}"),
            })?;
        let mut attributes = serde_json::Map::new();
        for (name, value) in all {
            if name == "data" {
                attributes.insert(name, Value::Bool(true));
                continue;
            }
            let v: Value =
                serde_json::from_str(value.get()).map_err(|e| PublishError::Malformed {
                    reason: format!("events[{index}].{name}: {e}"),
                })?;
            attributes.insert(name, v);
        }
        attributes
    };
    let string = |name: &str, required: bool| -> Result<Option<&str>, PublishError> {
        match fields.get(name) {
            None | Some(Value::Null) if required => Err(invalid(name, "is required".into())),
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => {
                Err(invalid(name, "must not be empty".into()))
            }
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(invalid(name, "must be a string".into())),
        }
    };
    match string("specversion", true)? {
        Some("1.0") => {}
        Some(other) => {
            return Err(invalid(
                "specversion",
                format!("is {other:?}; allowed: \"1.0\""),
            ));
        }
        None => return Err(invalid("specversion", "is required".into())),
    }
    for name in ["id", "source", "type"] {
        string(name, true)?;
    }
    for name in ["subject", "datacontenttype", "dataschema"] {
        string(name, false)?;
    }
    if let Some(time) = string("time", false)?
        && chrono::DateTime::parse_from_rfc3339(time).is_err()
    {
        return Err(invalid(
            "time",
            format!("{time:?} is not an RFC 3339 date-time"),
        ));
    }
    if let Some(b64) = string("data_base64", false)? {
        use base64::Engine;
        if fields.contains_key("data") {
            return Err(invalid(
                "data_base64",
                "an event carries data or data_base64, not both".into(),
            ));
        }
        if base64::engine::general_purpose::STANDARD
            .decode(b64)
            .is_err()
        {
            return Err(invalid("data_base64", "is not base64".into()));
        }
    }
    for (name, value) in &fields {
        if name == "data" || name == "data_base64" {
            continue;
        }
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return Err(invalid(
                name,
                "attribute names are lowercase letters a-z and digits 0-9 (CloudEvents 1.0)".into(),
            ));
        }
        if matches!(value, Value::Object(_) | Value::Array(_)) {
            return Err(invalid(
                name,
                "attribute values are strings, numbers or booleans".into(),
            ));
        }
    }
    RawValue::from_string(text.trim().to_string()).map_err(|e| PublishError::Malformed {
        reason: format!("events[{index}]: {e}"),
    })
}

/// F2 binary mode: attributes from the `ce-*` headers (percent-decoded), `datacontenttype` from
/// `content-type`, and the body as `data`: JSON for JSON media types, a string for text, else
/// `data_base64`.
fn binary_cloud_event(request: &PublishBody<'_>) -> Result<Box<RawValue>, PublishError> {
    use base64::Engine;
    let mut head = serde_json::Map::new();
    for (name, value) in request.ce_headers {
        let Some(attribute) = name.strip_prefix("ce-") else {
            continue;
        };
        let decoded = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|e| PublishError::InvalidEvent {
                index: 0,
                field: attribute.to_string(),
                problem: format!("header {name} is not UTF-8 after percent-decoding: {e}"),
            })?;
        head.insert(attribute.to_string(), Value::String(decoded.into_owned()));
    }
    let media = request.media_type();
    if let Some(ct) = request.content_type {
        head.insert("datacontenttype".into(), Value::String(ct.to_string()));
    }
    let head = Value::Object(head).to_string();
    let malformed = |e: serde_json::Error| PublishError::Malformed {
        reason: e.to_string(),
    };
    if request.body.is_empty() {
        return RawValue::from_string(head).map_err(malformed);
    }
    let is_json = media == "application/json" || media.ends_with("+json");
    let (name, value) = if is_json {
        let raw: &RawValue =
            serde_json::from_slice(request.body).map_err(|e| PublishError::InvalidEvent {
                index: 0,
                field: "data".into(),
                problem: format!("content type is {media} but the body is not JSON: {e}"),
            })?;
        ("data", raw.get().to_string())
    } else if let (true, Ok(s)) = (
        media.starts_with("text/") || media.is_empty(),
        std::str::from_utf8(request.body),
    ) {
        ("data", Value::String(s.to_string()).to_string())
    } else {
        let encoded = base64::engine::general_purpose::STANDARD.encode(request.body);
        ("data_base64", Value::String(encoded).to_string())
    };
    append_raw_field(&head, name, &value).map_err(malformed)
}

/// F3: custom events (one JSON object or an array of them), each wrapped in the envelope the
/// topic's mapping makes.
fn parse_custom_events(
    body: &[u8],
    mapping: &InputMapping,
    topic_resource_id: &str,
    now: chrono::DateTime<chrono::Utc>,
    new_id: &mut dyn FnMut() -> String,
) -> Result<Vec<Box<RawValue>>, PublishError> {
    let text = utf8(body)?.trim();
    let events: Vec<&RawValue> = if text.starts_with('[') {
        serde_json::from_str(text)
    } else {
        serde_json::from_str::<&RawValue>(text).map(|one| vec![one])
    }
    .map_err(|e| PublishError::Malformed {
        reason: format!("not a JSON event or array of events: {e}"),
    })?;
    let now = now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    events
        .iter()
        .enumerate()
        .map(|(index, raw)| {
            if raw.get().len() > MAX_EVENT_BYTES {
                return Err(PublishError::EventTooLarge {
                    index,
                    size: raw.get().len(),
                });
            }
            let object: serde_json::Map<String, Value> =
                serde_json::from_str(raw.get()).map_err(|_| PublishError::Malformed {
                    reason: format!("events[{index}] is not a JSON object"),
                })?;
            mapping
                .envelope(&object, raw, topic_resource_id, &new_id(), &now)
                .map_err(|e| PublishError::InvalidEvent {
                    index,
                    field: e.field.to_string(),
                    problem: e.problem,
                })
        })
        .collect()
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
            PublishError::InvalidEvent { ref field, .. } if field == "eventTime"
        ));

        let mut bad = event();
        bad["topic"] = json!("/other");
        assert!(matches!(
            parse(&json!([bad])).unwrap_err(),
            PublishError::InvalidEvent { ref field, .. } if field == "topic"
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

    /// #34 item 7: raw U+FFFE and U+FFFF are kept as their escapes, and the size limit is
    /// measured on the event as kept: one that fits raw but not escaped is refused with 413.
    #[test]
    fn raw_noncharacters_are_kept_escaped_and_measured_so() {
        let publish = |e: &Value| {
            let topic = TopicSchema {
                input_schema: InputSchema::EventGridSchema,
                ..ce_topic()
            };
            let body = json!([e]).to_string();
            let request = PublishBody {
                content_type: Some("application/json"),
                ce_headers: &[],
                body: body.as_bytes(),
            };
            parse_publish(&request, topic, chrono::Utc::now(), &mut || "id".into())
        };
        let mut e = event();
        e["data"] = json!("a\u{FFFF}b\u{FFFE}");
        let kept = publish(&e).unwrap();
        assert!(
            kept[0].get().contains("a\\uffffb\\ufffe"),
            "{}",
            kept[0].get()
        );
        let v: Value = serde_json::from_str(kept[0].get()).unwrap();
        assert_eq!(v["data"], e["data"], "the same JSON value");

        // 3 bytes raw, 6 escaped: 200,000 of them fit raw (600,000 bytes), not escaped.
        e["data"] = json!("\u{FFFF}".repeat(200_000));
        let err = publish(&e).unwrap_err();
        assert!(
            matches!(err, PublishError::EventTooLarge { index: 0, size } if size > MAX_EVENT_BYTES),
            "{err}"
        );
    }

    fn ce_topic() -> TopicSchema<'static> {
        TopicSchema {
            name: "orders",
            resource_id: TOPIC,
            input_schema: InputSchema::CloudEventSchemaV1_0,
            mapping: None,
        }
    }

    fn publish_ce(
        content_type: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Vec<Box<RawValue>>, PublishError> {
        let request = PublishBody {
            content_type: Some(content_type),
            ce_headers: headers,
            body,
        };
        parse_publish(&request, ce_topic(), chrono::Utc::now(), &mut || {
            "id".into()
        })
    }

    /// F2: structured events are checked attribute by attribute.
    #[test]
    fn cloud_events_are_validated_f2() {
        let good = json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "ext1": 3});
        let ok = publish_ce(
            "application/cloudevents+json",
            &[],
            good.to_string().as_bytes(),
        );
        assert_eq!(ok.unwrap().len(), 1);
        let cases = [
            (
                json!({"specversion": "1.0", "id": "1", "type": "t"}),
                "source",
            ),
            (
                json!({"specversion": "1.0", "id": "", "source": "/s", "type": "t"}),
                "id",
            ),
            (
                json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "time": "noon"}),
                "time",
            ),
            (
                json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "Bad_Name": "x"}),
                "Bad_Name",
            ),
            (
                json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "data": 1, "data_base64": "AA=="}),
                "data_base64",
            ),
        ];
        for (event, field) in cases {
            let err = publish_ce(
                "application/cloudevents-batch+json",
                &[],
                json!([event]).to_string().as_bytes(),
            )
            .unwrap_err();
            assert!(
                matches!(&err, PublishError::InvalidEvent { field: f, .. } if f == field),
                "{field}: {err}"
            );
        }
    }

    /// F2 binary mode: attributes from headers, the body as data (JSON, text or base64).
    #[test]
    fn binary_mode_builds_a_structured_event_f2() {
        let headers: Vec<(String, String)> = [
            ("ce-specversion", "1.0"),
            ("ce-id", "9"),
            ("ce-source", "/s"),
            ("ce-type", "t"),
            ("ce-subject", "a%20b"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let out = publish_ce("application/json", &headers, br#"{"n":1}"#).unwrap();
        let v: Value = serde_json::from_str(out[0].get()).unwrap();
        assert_eq!(v["data"], json!({"n": 1}));
        assert_eq!(v["subject"], "a b");
        assert_eq!(v["datacontenttype"], "application/json");
        let out = publish_ce("application/octet-stream", &headers, &[0xff, 0x00]).unwrap();
        let v: Value = serde_json::from_str(out[0].get()).unwrap();
        assert_eq!(v["data_base64"], "/wA=");
        let out = publish_ce("text/plain", &headers, b"hi").unwrap();
        let v: Value = serde_json::from_str(out[0].get()).unwrap();
        assert_eq!(v["data"], "hi");
    }

    /// A request in another schema is refused naming the schema the topic takes.
    #[test]
    fn wrong_schema_names_the_topics_schema() {
        let err = publish_ce("application/json", &[], b"[]").unwrap_err();
        assert_eq!(err.http_status(), 400);
        assert!(
            err.to_string().contains("takes CloudEventSchemaV1_0"),
            "{err}"
        );
        let eg = TopicSchema {
            input_schema: InputSchema::EventGridSchema,
            ..ce_topic()
        };
        let request = PublishBody {
            content_type: Some("application/cloudevents+json"),
            ce_headers: &[],
            body: b"{}",
        };
        let err = parse_publish(&request, eg, chrono::Utc::now(), &mut || "id".into()).unwrap_err();
        assert!(err.to_string().contains("takes EventGridSchema"), "{err}");
    }
}
