//! Event schemas: what a topic takes (F1 Event Grid, F2 CloudEvents 1.0, F3 custom), what a
//! subscription receives, and the conversions between them.
//!
//! Every event is kept in the form its topic takes until fan-out; there it is turned into the
//! form its subscription receives, once per schema. A custom-schema event is kept as the Event
//! Grid envelope its topic's mapping makes, with the original event as `data`: that envelope is
//! what a dead-letter record holds (L6), and a custom-schema subscriber gets `data` back.
//!
//! Which pairs work follows Event Grid: Event Grid input → Event Grid or CloudEvents delivery;
//! CloudEvents input → CloudEvents delivery; custom input → any of the three.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::limits::LimitError;
use crate::raw_json::append_raw_field;

/// What a topic's publishers send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InputSchema {
    #[default]
    EventGridSchema,
    #[serde(rename = "CloudEventSchemaV1_0")]
    CloudEventSchemaV1_0,
    CustomEventSchema,
}

/// What a subscription's endpoint receives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeliverySchema {
    #[default]
    EventGridSchema,
    #[serde(rename = "CloudEventSchemaV1_0")]
    CloudEventSchemaV1_0,
    CustomInputSchema,
}

impl InputSchema {
    pub const ALLOWED: &'static str = "eventgridschema, cloudeventschemav1_0 or customeventschema";

    pub fn as_str(self) -> &'static str {
        match self {
            Self::EventGridSchema => "EventGridSchema",
            Self::CloudEventSchemaV1_0 => "CloudEventSchemaV1_0",
            Self::CustomEventSchema => "CustomEventSchema",
        }
    }

    /// The delivery schema a subscription gets when it names none: its topic's own.
    pub fn default_delivery(self) -> DeliverySchema {
        match self {
            Self::EventGridSchema => DeliverySchema::EventGridSchema,
            Self::CloudEventSchemaV1_0 => DeliverySchema::CloudEventSchemaV1_0,
            Self::CustomEventSchema => DeliverySchema::CustomInputSchema,
        }
    }

    /// The delivery schemas events of this schema can be turned into.
    pub fn deliverable_as(self) -> &'static [DeliverySchema] {
        use DeliverySchema as D;
        match self {
            Self::EventGridSchema => &[D::EventGridSchema, D::CloudEventSchemaV1_0],
            Self::CloudEventSchemaV1_0 => &[D::CloudEventSchemaV1_0],
            Self::CustomEventSchema => &[
                D::CustomInputSchema,
                D::EventGridSchema,
                D::CloudEventSchemaV1_0,
            ],
        }
    }

    /// The fields the subscription filters read for the event type and the subject.
    pub fn filter_fields(self) -> FilterFields {
        match self {
            Self::CloudEventSchemaV1_0 => FilterFields {
                event_type: "type",
                subject: "subject",
            },
            Self::EventGridSchema | Self::CustomEventSchema => FilterFields {
                event_type: "eventType",
                subject: "subject",
            },
        }
    }
}

/// Where an event's type and subject are, for the filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterFields {
    pub event_type: &'static str,
    pub subject: &'static str,
}

impl Default for FilterFields {
    fn default() -> Self {
        InputSchema::EventGridSchema.filter_fields()
    }
}

impl DeliverySchema {
    pub const ALLOWED: &'static str = "eventgridschema, cloudeventschemav1_0 or custominputschema";

    pub fn as_str(self) -> &'static str {
        match self {
            Self::EventGridSchema => "EventGridSchema",
            Self::CloudEventSchemaV1_0 => "CloudEventSchemaV1_0",
            Self::CustomInputSchema => "CustomInputSchema",
        }
    }

    /// Refuses a delivery schema the topic's events cannot be turned into.
    pub fn check_compatible(self, input: InputSchema) -> Result<(), LimitError> {
        if input.deliverable_as().contains(&self) {
            return Ok(());
        }
        let allowed: Vec<&str> = input.deliverable_as().iter().map(|d| d.as_str()).collect();
        Err(LimitError::new(
            "eventDeliverySchema",
            self,
            format!(
                "{} for a topic whose input schema is {}",
                allowed.join(" or "),
                input.as_str()
            ),
        ))
    }
}

impl fmt::Display for InputSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for DeliverySchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InputSchema {
    type Err = LimitError;
    fn from_str(s: &str) -> Result<Self, LimitError> {
        match s.to_ascii_lowercase().as_str() {
            "eventgridschema" => Ok(Self::EventGridSchema),
            "cloudeventschemav1_0" => Ok(Self::CloudEventSchemaV1_0),
            "customeventschema" => Ok(Self::CustomEventSchema),
            _ => Err(LimitError::new(
                "inputSchema",
                format!("{s:?}"),
                Self::ALLOWED,
            )),
        }
    }
}

impl FromStr for DeliverySchema {
    type Err = LimitError;
    fn from_str(s: &str) -> Result<Self, LimitError> {
        match s.to_ascii_lowercase().as_str() {
            "eventgridschema" => Ok(Self::EventGridSchema),
            "cloudeventschemav1_0" => Ok(Self::CloudEventSchemaV1_0),
            "custominputschema" => Ok(Self::CustomInputSchema),
            _ => Err(LimitError::new(
                "eventDeliverySchema",
                format!("{s:?}"),
                Self::ALLOWED,
            )),
        }
    }
}

/// F3: how a custom-schema event's fields fill the Event Grid envelope. Each `*_field` names a
/// top-level field of the published event; `subject`, `eventType` and `dataVersion` fall back to
/// a default value when the event lacks the field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InputMapping {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_version_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_event_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_data_version: Option<String>,
}

/// Longest field name or default value in a mapping.
pub const MAX_MAPPING_VALUE_CHARS: usize = 256;

impl InputMapping {
    /// Builds a mapping from `az`-style `key=value` pairs: fields from `id`, `topic`,
    /// `eventtime`, `subject`, `eventtype`, `dataversion`; defaults for `subject`, `eventtype`,
    /// `dataversion`.
    pub fn from_pairs(fields: &[String], defaults: &[String]) -> Result<Self, LimitError> {
        let mut m = Self::default();
        for pair in fields {
            let (key, value) = split_pair("inputMappingFields", pair)?;
            let slot = match key.to_ascii_lowercase().as_str() {
                "id" => &mut m.id_field,
                "topic" => &mut m.topic_field,
                "eventtime" => &mut m.event_time_field,
                "subject" => &mut m.subject_field,
                "eventtype" => &mut m.event_type_field,
                "dataversion" => &mut m.data_version_field,
                _ => {
                    return Err(LimitError::new(
                        "inputMappingFields",
                        format!("{key:?}"),
                        "one of id, topic, eventtime, subject, eventtype, dataversion",
                    ));
                }
            };
            *slot = Some(value);
        }
        for pair in defaults {
            let (key, value) = split_pair("inputMappingDefaultValues", pair)?;
            let slot = match key.to_ascii_lowercase().as_str() {
                "subject" => &mut m.default_subject,
                "eventtype" => &mut m.default_event_type,
                "dataversion" => &mut m.default_data_version,
                _ => {
                    return Err(LimitError::new(
                        "inputMappingDefaultValues",
                        format!("{key:?}"),
                        "one of subject, eventtype, dataversion",
                    ));
                }
            };
            *slot = Some(value);
        }
        Ok(m)
    }

    /// F3: the Event Grid envelope of one custom event, whose `data` is the event itself.
    /// `generated_id` and `now` fill `id` and `eventTime` when the mapping names no field.
    pub fn envelope(
        &self,
        event: &Map<String, Value>,
        raw: &RawValue,
        topic_resource_id: &str,
        generated_id: &str,
        now: &str,
    ) -> Result<Box<RawValue>, MappingError> {
        let read =
            |field: &Option<String>, name: &'static str| -> Result<Option<String>, MappingError> {
                let Some(f) = field else { return Ok(None) };
                match event.get(f) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    Some(Value::Number(n)) => Ok(Some(n.to_string())),
                    Some(other) => Err(MappingError {
                        field: name,
                        problem: format!("mapped from {f:?}, which is {other}; must be a string"),
                    }),
                }
            };
        let id = read(&self.id_field, "id")?.unwrap_or_else(|| generated_id.to_string());
        if id.is_empty() {
            return Err(MappingError {
                field: "id",
                problem: "must not be empty".into(),
            });
        }
        if let Some(topic) = read(&self.topic_field, "topic")?
            && topic != topic_resource_id
        {
            return Err(MappingError {
                field: "topic",
                problem: format!("is {topic:?}; allowed: {topic_resource_id:?} or absent"),
            });
        }
        let event_time = match read(&self.event_time_field, "eventTime")? {
            Some(t) if chrono::DateTime::parse_from_rfc3339(&t).is_ok() => t,
            Some(t) => {
                return Err(MappingError {
                    field: "eventTime",
                    problem: format!("{t:?} is not an RFC 3339 date-time"),
                });
            }
            None => now.to_string(),
        };
        let subject = read(&self.subject_field, "subject")?
            .or_else(|| self.default_subject.clone())
            .unwrap_or_default();
        let event_type = read(&self.event_type_field, "eventType")?
            .or_else(|| self.default_event_type.clone())
            .ok_or_else(|| MappingError {
                field: "eventType",
                problem: match &self.event_type_field {
                    Some(f) => format!("field {f:?} is missing and the topic has no default"),
                    None => "the topic maps no field and has no default".to_string(),
                },
            })?;
        let data_version = read(&self.data_version_field, "dataVersion")?
            .or_else(|| self.default_data_version.clone())
            .unwrap_or_default();
        let head = serde_json::json!({
            "id": id,
            "topic": topic_resource_id,
            "subject": subject,
            "eventType": event_type,
            "eventTime": event_time,
            "dataVersion": data_version,
            "metadataVersion": "1",
        })
        .to_string();
        append_raw_field(&head, "data", raw.get()).map_err(|e| MappingError {
            field: "data",
            problem: e.to_string(),
        })
    }
}

fn split_pair(field: &str, pair: &str) -> Result<(String, String), LimitError> {
    let (k, v) = pair
        .split_once('=')
        .ok_or_else(|| LimitError::new(field, format!("{pair:?}"), "KEY=VALUE pairs"))?;
    if v.is_empty() || v.chars().count() > MAX_MAPPING_VALUE_CHARS {
        return Err(LimitError::new(
            field,
            format!("{pair:?}"),
            format!("a value of 1 to {MAX_MAPPING_VALUE_CHARS} characters after '='"),
        ));
    }
    Ok((k.trim().to_string(), v.to_string()))
}

/// A custom event the topic's mapping cannot turn into an envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct MappingError {
    pub field: &'static str,
    pub problem: String,
}

/// An event that cannot be turned into its subscription's schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot deliver {input} events as {delivery}: {reason}")]
pub struct ConversionError {
    pub input: InputSchema,
    pub delivery: DeliverySchema,
    pub reason: String,
}

/// Turns a kept event (see the module docs) into the form its subscription receives: the
/// event itself where the schemas agree (no copy), a new one where it is converted. The result
/// still holds the envelope for custom-schema delivery; [`delivery_body`] unwraps it.
pub fn to_delivery_form(
    event: &RawValue,
    input: InputSchema,
    delivery: DeliverySchema,
) -> Result<Cow<'_, RawValue>, ConversionError> {
    use DeliverySchema as D;
    use InputSchema as I;
    let fail = |reason: String| ConversionError {
        input,
        delivery,
        reason,
    };
    match (input, delivery) {
        (I::EventGridSchema, D::EventGridSchema)
        | (I::CustomEventSchema, D::EventGridSchema | D::CustomInputSchema)
        | (I::CloudEventSchemaV1_0, D::CloudEventSchemaV1_0) => Ok(Cow::Borrowed(event)),
        (I::EventGridSchema | I::CustomEventSchema, D::CloudEventSchemaV1_0) => {
            event_grid_to_cloud_event(event)
                .map(Cow::Owned)
                .map_err(fail)
        }
        _ => Err(fail("Event Grid does not convert between these".into())),
    }
}

/// The Event Grid envelope as a CloudEvent: `id`, `topic` → `source`, `eventType` → `type`,
/// `subject`, `eventTime` → `time`, `data` (JSON, so `datacontenttype` is application/json).
fn event_grid_to_cloud_event(event: &RawValue) -> Result<Box<RawValue>, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Envelope<'a> {
        id: String,
        topic: String,
        subject: Option<String>,
        event_type: String,
        event_time: String,
        #[serde(borrow)]
        data: Option<&'a RawValue>,
    }
    let e: Envelope<'_> = serde_json::from_str(event.get()).map_err(|e| e.to_string())?;
    let mut head = serde_json::json!({
        "specversion": "1.0",
        "id": e.id,
        "source": e.topic,
        "type": e.event_type,
        "time": e.event_time,
    });
    if let Some(subject) = e.subject.filter(|s| !s.is_empty()) {
        head["subject"] = Value::String(subject);
    }
    let Some(data) = e.data else {
        return RawValue::from_string(head.to_string()).map_err(|e| e.to_string());
    };
    head["datacontenttype"] = Value::String("application/json".into());
    append_raw_field(&head.to_string(), "data", data.get()).map_err(|e| e.to_string())
}

/// Content types of delivery requests.
pub const JSON_CONTENT_TYPE: &str = "application/json; charset=utf-8";
pub const CLOUD_EVENT_CONTENT_TYPE: &str = "application/cloudevents+json; charset=utf-8";
pub const CLOUD_EVENT_BATCH_CONTENT_TYPE: &str =
    "application/cloudevents-batch+json; charset=utf-8";

/// The content type and body of one delivery request: a JSON array for Event Grid and custom
/// schemas (custom subscribers get each envelope's `data`: their own events); for CloudEvents,
/// the structured mode of the HTTP binding: one event as an object, more as a batch array.
pub fn delivery_body<'a>(
    events: impl ExactSizeIterator<Item = &'a RawValue>,
    schema: DeliverySchema,
) -> (&'static str, String) {
    let count = events.len();
    let events: Vec<&str> = events
        .map(|e| match schema {
            DeliverySchema::CustomInputSchema => envelope_data(e),
            _ => e.get(),
        })
        .collect();
    // Sized once: the events, their commas and the brackets.
    let mut body = String::with_capacity(events.iter().map(|e| e.len() + 1).sum::<usize>() + 2);
    let single_cloud_event = schema == DeliverySchema::CloudEventSchemaV1_0 && count == 1;
    if !single_cloud_event {
        body.push('[');
    }
    for (i, e) in events.into_iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(e);
    }
    if !single_cloud_event {
        body.push(']');
    }
    let content_type = match schema {
        DeliverySchema::CloudEventSchemaV1_0 if count == 1 => CLOUD_EVENT_CONTENT_TYPE,
        DeliverySchema::CloudEventSchemaV1_0 => CLOUD_EVENT_BATCH_CONTENT_TYPE,
        _ => JSON_CONTENT_TYPE,
    };
    (content_type, body)
}

/// One event as a message body in `schema`, for destinations that take one message per event
/// (an SQS queue, say): the event itself, not an array (a custom-schema event: its own event,
/// the envelope's `data`).
pub fn event_body(event: &RawValue, schema: DeliverySchema) -> &str {
    match schema {
        DeliverySchema::CustomInputSchema => envelope_data(event),
        _ => event.get(),
    }
}

/// H2: the `aeg-data-version` header of a request carrying `events` (in `schema`): their
/// `dataVersion` (`dataversion` for CloudEvents), when every one has the same and a header can
/// carry it (visible ASCII); `None` otherwise (each event's own is in the body).
pub fn batch_data_version<'a>(
    mut events: impl Iterator<Item = &'a RawValue>,
    schema: DeliverySchema,
) -> Option<String> {
    #[derive(Deserialize)]
    struct Versions<'a> {
        #[serde(borrow, rename = "dataVersion")]
        camel: Option<Cow<'a, str>>,
        #[serde(borrow, rename = "dataversion")]
        lower: Option<Cow<'a, str>>,
    }
    let version = |e: &'a RawValue| {
        let v: Versions<'a> = serde_json::from_str(e.get()).ok()?;
        match schema {
            DeliverySchema::CloudEventSchemaV1_0 => v.lower,
            DeliverySchema::EventGridSchema | DeliverySchema::CustomInputSchema => v.camel,
        }
    };
    let first = version(events.next()?)?;
    // Only what an HTTP header value can carry; anything else stays in the body alone.
    let header_safe = first
        .bytes()
        .all(|b| b == b'\t' || (0x20..=0x7e).contains(&b));
    (header_safe && events.all(|e| version(e).as_deref() == Some(first.as_ref())))
        .then(|| first.into_owned())
}

/// The raw `data` of an envelope (the envelope itself if it has none, which fan-out never
/// produces).
fn envelope_data(envelope: &RawValue) -> &str {
    #[derive(Deserialize)]
    struct Data<'a> {
        #[serde(borrow)]
        data: Option<&'a RawValue>,
    }
    match serde_json::from_str::<Data<'_>>(envelope.get()) {
        Ok(Data { data: Some(d) }) => d.get(),
        _ => envelope.get(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TOPIC: &str = "/gridrelay/topics/orders";

    fn raw(v: &Value) -> Box<RawValue> {
        RawValue::from_string(v.to_string()).unwrap()
    }

    /// F2: an Event Grid event becomes a CloudEvent with Event Grid's attribute mapping.
    #[test]
    fn event_grid_events_convert_to_cloud_events_f2() {
        let e = raw(
            &json!({"id": "1", "topic": TOPIC, "subject": "a/b", "eventType": "T",
            "eventTime": "2026-11-22T03:00:00Z", "data": {"x": 1}, "dataVersion": "", "metadataVersion": "1"}),
        );
        let out = to_delivery_form(
            &e,
            InputSchema::EventGridSchema,
            DeliverySchema::CloudEventSchemaV1_0,
        )
        .unwrap();
        let v: Value = serde_json::from_str(out.get()).unwrap();
        assert_eq!(
            v,
            json!({"specversion": "1.0", "id": "1", "source": TOPIC, "type": "T", "subject": "a/b",
                "time": "2026-11-22T03:00:00Z", "datacontenttype": "application/json", "data": {"x": 1}})
        );
        assert!(
            to_delivery_form(
                &out,
                InputSchema::CloudEventSchemaV1_0,
                DeliverySchema::EventGridSchema
            )
            .is_err()
        );
    }

    /// Event Grid's pairs of input and delivery schema, checked when a subscription is made.
    #[test]
    fn delivery_schema_must_suit_the_topic() {
        use DeliverySchema as D;
        use InputSchema as I;
        assert!(
            D::CloudEventSchemaV1_0
                .check_compatible(I::EventGridSchema)
                .is_ok()
        );
        let err = D::EventGridSchema
            .check_compatible(I::CloudEventSchemaV1_0)
            .unwrap_err();
        assert_eq!(err.field, "eventDeliverySchema");
        assert!(err.allowed.contains("CloudEventSchemaV1_0"), "{err}");
        assert!(
            D::CustomInputSchema
                .check_compatible(I::EventGridSchema)
                .is_err()
        );
        for d in [
            D::CustomInputSchema,
            D::EventGridSchema,
            D::CloudEventSchemaV1_0,
        ] {
            assert!(d.check_compatible(I::CustomEventSchema).is_ok());
        }
        assert_eq!(
            "CLOUDEVENTSCHEMAV1_0".parse::<D>().unwrap(),
            D::CloudEventSchemaV1_0
        );
        assert_eq!("bogus".parse::<I>().unwrap_err().field, "inputSchema");
    }

    /// F3: fields are mapped, defaults fill gaps, and the original event becomes `data`.
    #[test]
    fn custom_events_are_wrapped_in_an_envelope_f3() {
        let m = InputMapping::from_pairs(
            &[
                "id=orderId".into(),
                "eventtype=kind".into(),
                "eventtime=at".into(),
            ],
            &["subject=orders".into(), "dataversion=2.0".into()],
        )
        .unwrap();
        let original =
            json!({"orderId": 42, "kind": "Created", "at": "2026-11-22T03:00:00Z", "n": [1]});
        let obj = original.as_object().unwrap();
        let out = m
            .envelope(
                obj,
                &raw(&original),
                TOPIC,
                "generated",
                "2026-01-01T00:00:00Z",
            )
            .unwrap();
        let v: Value = serde_json::from_str(out.get()).unwrap();
        assert_eq!(v["id"], "42");
        assert_eq!(v["eventType"], "Created");
        assert_eq!(v["subject"], "orders");
        assert_eq!(v["dataVersion"], "2.0");
        assert_eq!(v["eventTime"], "2026-11-22T03:00:00Z");
        assert_eq!(v["topic"], TOPIC);
        assert_eq!(v["data"], original);

        let no_type = json!({"orderId": 1});
        let err = m
            .envelope(
                no_type.as_object().unwrap(),
                &raw(&no_type),
                TOPIC,
                "g",
                "2026-01-01T00:00:00Z",
            )
            .unwrap_err();
        assert_eq!(err.field, "eventType");

        let bad = InputMapping::from_pairs(&["color=x".into()], &[]).unwrap_err();
        assert_eq!(bad.field, "inputMappingFields");
        let bad = InputMapping::from_pairs(&[], &["id=x".into()]).unwrap_err();
        assert_eq!(bad.field, "inputMappingDefaultValues");
        assert!(InputMapping::from_pairs(&["id".into()], &[]).is_err());
    }

    /// H2: a request's `aeg-data-version` is its events' `dataVersion` (`dataversion` for
    /// CloudEvents) when they agree, none when one lacks it or they differ.
    #[test]
    fn batch_data_version_h2() {
        let v = |events: &[Value], schema| {
            let raw: Vec<Box<RawValue>> = events.iter().map(raw).collect();
            batch_data_version(raw.iter().map(|e| &**e), schema)
        };
        let eg = DeliverySchema::EventGridSchema;
        assert_eq!(
            v(&[json!({"dataVersion": "2.0"})], eg).as_deref(),
            Some("2.0")
        );
        assert_eq!(
            v(
                &[json!({"dataVersion": "1"}), json!({"dataVersion": "1"})],
                eg
            )
            .as_deref(),
            Some("1")
        );
        assert_eq!(
            v(
                &[json!({"dataVersion": "1"}), json!({"dataVersion": "2"})],
                eg
            ),
            None
        );
        assert_eq!(
            v(&[json!({"dataVersion": "1"}), json!({"id": "x"})], eg),
            None
        );
        assert_eq!(v(&[json!({"id": "x"})], eg), None);
        assert_eq!(
            v(&[json!({"dataVersion": "a\\u00e9"})], eg).as_deref(),
            Some("a\\u00e9")
        );
        // A version no header value can carry does not block the delivery.
        assert_eq!(v(&[json!({"dataVersion": "1\n2"})], eg), None);
        assert_eq!(v(&[json!({"dataVersion": "é"})], eg), None);
        let ce = DeliverySchema::CloudEventSchemaV1_0;
        assert_eq!(
            v(&[json!({"specversion": "1.0", "dataversion": "1.0"})], ce).as_deref(),
            Some("1.0")
        );
        assert_eq!(
            v(&[json!({"specversion": "1.0", "dataVersion": "1.0"})], ce),
            None
        );
        assert_eq!(
            v(
                &[json!({"dataVersion": "3", "data": {"a": 1}})],
                DeliverySchema::CustomInputSchema
            )
            .as_deref(),
            Some("3")
        );
    }

    /// F2 HTTP binding: one CloudEvent is an object, more are a batch; custom subscribers get
    /// their own events back.
    #[test]
    fn delivery_bodies_follow_the_schema() {
        let ce = raw(&json!({"specversion": "1.0", "id": "1"}));
        let (ct, body) = delivery_body([&*ce].into_iter(), DeliverySchema::CloudEventSchemaV1_0);
        assert_eq!(ct, CLOUD_EVENT_CONTENT_TYPE);
        assert!(body.starts_with('{'));
        let (ct, body) = delivery_body(
            [&*ce, &*ce].into_iter(),
            DeliverySchema::CloudEventSchemaV1_0,
        );
        assert_eq!(ct, CLOUD_EVENT_BATCH_CONTENT_TYPE);
        assert!(body.starts_with('['));
        let env = raw(&json!({"id": "1", "data": {"mine": true}}));
        let (ct, body) = delivery_body([&*env].into_iter(), DeliverySchema::CustomInputSchema);
        assert_eq!(ct, JSON_CONTENT_TYPE);
        assert_eq!(body, r#"[{"mine":true}]"#);
    }
}
