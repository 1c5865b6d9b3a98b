//! The dead-letter format (L6) and where records are written (L3).
//!
//! A dead-lettered event is the original event, as raw JSON, with the L6 fields appended; an
//! object holds a JSON array of such records for one subscription and hour.

use chrono::{DateTime, Utc};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::classify::DeliveryOutcome;
use crate::message::DeadLetterEntry;
use crate::raw_json::{Placement, insert_raw_fields};
use crate::schema::DeliverySchema;
use crate::subscription::DeadLetterDestination;

/// Field names of the added fields: camelCase for the Event Grid schema, lowercase for
/// CloudEvents 1.0 (L6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldNaming {
    EventGrid,
    CloudEvents,
}

impl FieldNaming {
    /// L6: CloudEvents records use lowercase names; the others (custom ones wrapped in an Event
    /// Grid envelope) camelCase.
    pub fn for_schema(schema: DeliverySchema) -> Self {
        match schema {
            DeliverySchema::CloudEventSchemaV1_0 => Self::CloudEvents,
            DeliverySchema::EventGridSchema | DeliverySchema::CustomInputSchema => Self::EventGrid,
        }
    }
}

/// The L6 fields' names: reason, attempts, last outcome, publish time, last attempt time.
fn l6_names(naming: FieldNaming) -> [&'static str; 5] {
    match naming {
        FieldNaming::EventGrid => [
            "deadLetterReason",
            "deliveryAttempts",
            "lastDeliveryOutcome",
            "publishTime",
            "lastDeliveryAttemptTime",
        ],
        FieldNaming::CloudEvents => [
            "deadletterreason",
            "deliveryattempts",
            "lastdeliveryoutcome",
            "publishtime",
            "lastdeliveryattempttime",
        ],
    }
}

/// Renders one record: the original event plus the L6 fields.
pub fn render_record(
    entry: &DeadLetterEntry,
    naming: FieldNaming,
) -> Result<Box<RawValue>, serde_json::Error> {
    let names = l6_names(naming);
    let mut fields = vec![
        (names[0], Value::String(entry.reason.to_string())),
        (names[1], Value::from(entry.delivery_attempts)),
        (
            names[2],
            Value::String(
                // No attempt was made: it was still being delivered when it ended.
                entry
                    .last_outcome
                    .unwrap_or(DeliveryOutcome::Delivering)
                    .as_str()
                    .to_string(),
            ),
        ),
        (names[3], Value::String(timestamp(entry.publish_time))),
    ];
    if let Some(at) = entry.last_attempt_time {
        fields.push((names[4], Value::String(timestamp(at))));
    }
    insert_raw_fields(entry.event.get(), &fields, Placement::Back)
}

/// Renders one object's body: a JSON array of records.
pub fn render_object(records: &[Box<RawValue>]) -> String {
    let mut out =
        String::with_capacity(records.iter().map(|r| r.get().len() + 1).sum::<usize>() + 2);
    out.push('[');
    for (i, r) in records.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(r.get());
    }
    out.push(']');
    out
}

/// `PREFIX/TOPIC/SUBSCRIPTION/YYYY/MM/DD/HH/<id>.json`, grouped per subscription and hour.
pub fn object_key(
    destination: &DeadLetterDestination,
    topic: &str,
    subscription: &str,
    at: DateTime<Utc>,
    id: &str,
) -> String {
    format!(
        "{}{}/{id}.json",
        subscription_folder(destination, topic, subscription),
        at.format("%Y/%m/%d/%H")
    )
}

/// An object's file name: `<subscription id>.<unique>` (just `<unique>` for a subscription
/// without an id), so what is read back can be told to be this subscription's.
pub fn object_name(subscription_id: &str, unique: &str) -> String {
    if subscription_id.is_empty() {
        unique.to_string()
    } else {
        format!("{subscription_id}.{unique}")
    }
}

/// Whether the object at `key` was written for the subscription with this id.
pub fn object_is_for(key: &str, subscription_id: &str) -> bool {
    let file = key.rsplit('/').next().unwrap_or_default();
    !subscription_id.is_empty() && file.starts_with(&format!("{subscription_id}."))
}

/// The folder of one subscription's dead-letter objects: `PREFIX/TOPIC/SUBSCRIPTION/`.
pub fn subscription_folder(
    destination: &DeadLetterDestination,
    topic: &str,
    subscription: &str,
) -> String {
    if destination.prefix.is_empty() {
        format!("{topic}/{subscription}/")
    } else {
        format!("{}/{topic}/{subscription}/", destination.prefix)
    }
}

/// The hour an object under `folder` holds records of, read from its key
/// (`FOLDER/YYYY/MM/DD/HH/<id>.json`).
pub fn object_hour(folder: &str, key: &str) -> Option<DateTime<Utc>> {
    let rest = key.strip_prefix(folder)?;
    let mut parts = rest.split('/');
    let mut next = || parts.next().and_then(|p| p.parse::<u32>().ok());
    let (year, month, day, hour) = (next()?, next()?, next()?, next()?);
    chrono::NaiveDate::from_ymd_opt(i32::try_from(year).ok()?, month, day)?
        .and_hms_opt(hour, 0, 0)
        .map(|t| t.and_utc())
}

/// A dead-letter record read back: the event as its subscription receives it (the L6 fields
/// taken off, everything else as it was written), and why it was dead-lettered.
#[derive(Debug)]
pub struct ReadBack {
    pub event: Box<RawValue>,
    /// `deadLetterReason` (`deadletterreason` for CloudEvents).
    pub reason: String,
}

/// Takes the L6 fields off a record (see [`render_record`]).
pub fn read_record(record: &RawValue, naming: FieldNaming) -> Result<ReadBack, serde_json::Error> {
    let names = l6_names(naming);
    let fields: OrderedFields<'_> = serde_json::from_str(record.get())?;
    let mut reason = None;
    let mut out = String::with_capacity(record.get().len());
    out.push('{');
    for (name, value) in fields.0 {
        if name == names[0] {
            reason = serde_json::from_str::<String>(value.get()).ok();
        }
        if names.contains(&name.as_ref()) {
            continue;
        }
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(&name)?);
        out.push(':');
        out.push_str(value.get());
    }
    out.push('}');
    // A record in another naming (another schema) is not read as this one.
    let reason = reason.ok_or_else(|| {
        <serde_json::Error as serde::de::Error>::custom(format!("the record has no {}", names[0]))
    })?;
    Ok(ReadBack {
        event: RawValue::from_string(out)?,
        reason,
    })
}

/// An object's fields in their order, values as raw text, names borrowed where they can be.
struct OrderedFields<'a>(Vec<(std::borrow::Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for OrderedFields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = OrderedFields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut fields = Vec::new();
                while let Some(name) = map.next_key_seed(crate::readable::Key)? {
                    fields.push((name, map.next_value::<&'de RawValue>()?));
                }
                Ok(OrderedFields(fields))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// L7: the system topic that announces every dead-letter write. Subscribe to it like any topic.
pub const DEAD_LETTER_EVENTS_TOPIC: &str = "gridrelay-dead-letter-events";
/// L7: the event type of those announcements.
pub const DEAD_LETTER_EVENT_TYPE: &str = "Gridrelay.DeadLetter.BlobCreated";

/// What one dead-letter write put where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterWrite<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
    pub content_length: usize,
    pub topic: &'a str,
    pub subscription: &'a str,
    /// How many records the object holds, per `deadLetterReason`.
    pub reasons: std::collections::BTreeMap<String, usize>,
}

/// L7: the Event Grid schema event announcing a dead-letter write, shaped like
/// `Microsoft.Storage.BlobCreated`.
pub fn dead_letter_written_event(
    write: &DeadLetterWrite<'_>,
    id: &str,
    now: DateTime<Utc>,
) -> Result<Box<RawValue>, serde_json::Error> {
    let event = serde_json::json!({
        "id": id,
        "topic": crate::subscription::topic_resource_id(DEAD_LETTER_EVENTS_TOPIC),
        "subject": format!("/buckets/{}/objects/{}", write.bucket, write.key),
        "eventType": DEAD_LETTER_EVENT_TYPE,
        "eventTime": timestamp(now),
        "dataVersion": "1",
        "metadataVersion": "1",
        "data": {
            "api": "PutObject",
            "bucket": write.bucket,
            "key": write.key,
            "url": format!("s3://{}/{}", write.bucket, write.key),
            "contentType": "application/json",
            "contentLength": write.content_length,
            "sourceTopic": write.topic,
            "sourceSubscription": write.subscription,
            "eventCount": write.reasons.values().sum::<usize>(),
            "deadLetterReasons": write.reasons,
        }
    });
    RawValue::from_string(event.to_string())
}

/// RFC 3339 with fixed seven fractional digits, as Event Grid writes times.
pub fn timestamp(t: DateTime<Utc>) -> String {
    format!(
        "{}.{:07}Z",
        t.format("%Y-%m-%dT%H:%M:%S"),
        t.timestamp_subsec_nanos() / 100
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::DeadLetterReason;
    use chrono::Timelike;
    use serde_json::json;

    fn entry() -> DeadLetterEntry {
        let t = DateTime::parse_from_rfc3339("2020-08-13T17:18:14.0265758Z")
            .unwrap()
            .to_utc();
        DeadLetterEntry {
            reason: DeadLetterReason::MaxDeliveryAttemptsExceeded,
            delivery_attempts: 1,
            last_outcome: Some(DeliveryOutcome::NotFound),
            publish_time: t,
            last_attempt_time: Some(t + chrono::Duration::milliseconds(20)),
            event: RawValue::from_string(
                r#"{"id":"9","eventType":"x","data":{"a":[1,2]}}"#.to_string(),
            )
            .unwrap(),
        }
    }

    /// L6: the record is the original event plus the five camelCase fields, as in the seeds.
    #[test]
    fn event_grid_record_adds_l6_fields() {
        let v: Value = serde_json::from_str(
            render_record(&entry(), FieldNaming::EventGrid)
                .unwrap()
                .get(),
        )
        .unwrap();
        assert_eq!(v["id"], "9");
        assert_eq!(v["data"], json!({"a": [1, 2]}));
        assert_eq!(v["deadLetterReason"], "MaxDeliveryAttemptsExceeded");
        assert_eq!(v["deliveryAttempts"], 1);
        assert_eq!(v["lastDeliveryOutcome"], "NotFound");
        assert_eq!(v["publishTime"], "2020-08-13T17:18:14.0265758Z");
        assert_eq!(v["lastDeliveryAttemptTime"], "2020-08-13T17:18:14.0465758Z");
    }

    /// L6: CloudEvents records use lowercase names.
    #[test]
    fn cloud_events_record_uses_lowercase_l6() {
        let v: Value = serde_json::from_str(
            render_record(&entry(), FieldNaming::CloudEvents)
                .unwrap()
                .get(),
        )
        .unwrap();
        assert_eq!(v["deadletterreason"], "MaxDeliveryAttemptsExceeded");
        assert_eq!(v["deliveryattempts"], 1);
        assert!(v.get("deadLetterReason").is_none());
    }

    /// L3: objects are grouped per subscription and hour under the prefix.
    #[test]
    fn object_key_groups_by_subscription_and_hour_l3() {
        let d = DeadLetterDestination::parse("s3://bkt/dl").unwrap();
        let at = DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .to_utc();
        assert_eq!(
            object_key(&d, "orders", "audit", at, "u1"),
            "dl/orders/audit/2026/01/02/03/u1.json"
        );
        let d = DeadLetterDestination::parse("s3://bkt").unwrap();
        assert_eq!(
            object_key(&d, "orders", "audit", at, "u1"),
            "orders/audit/2026/01/02/03/u1.json"
        );
    }

    /// Redrive: a record read back is the event exactly as it was, without the L6 fields, in
    /// both namings; the reason is read from it.
    #[test]
    fn a_record_reads_back_as_its_event() {
        let original = entry();
        for naming in [FieldNaming::EventGrid, FieldNaming::CloudEvents] {
            let record = render_record(&original, naming).unwrap();
            let back = read_record(&record, naming).unwrap();
            assert_eq!(back.event.get(), original.event.get());
            assert_eq!(back.reason, "MaxDeliveryAttemptsExceeded");
        }
    }

    /// Redrive: a record in the other naming is not read back as this one.
    #[test]
    fn a_record_of_another_naming_is_not_read_back() {
        let record = render_record(&entry(), FieldNaming::EventGrid).unwrap();
        assert!(read_record(&record, FieldNaming::CloudEvents).is_err());
    }

    /// Redrive: object names carry the subscription id.
    #[test]
    fn object_names_carry_the_subscription_id() {
        let name = object_name("abc", "u1");
        assert_eq!(name, "abc.u1");
        assert!(object_is_for(
            &format!("dl/orders/audit/2026/01/02/03/{name}.json"),
            "abc"
        ));
        assert!(!object_is_for(
            "dl/orders/audit/2026/01/02/03/abd.u1.json",
            "abc"
        ));
        assert!(!object_is_for(
            "dl/orders/audit/2026/01/02/03/u1.json",
            "abc"
        ));
        assert!(!object_is_for("dl/orders/audit/2026/01/02/03/u1.json", ""));
    }

    /// Redrive: an object's hour is read from its key under the subscription's folder.
    #[test]
    fn object_hour_is_read_from_the_key_l3() {
        let d = DeadLetterDestination::parse("s3://bkt/dl").unwrap();
        let at = DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .to_utc();
        let folder = subscription_folder(&d, "orders", "audit");
        assert_eq!(folder, "dl/orders/audit/");
        let key = object_key(&d, "orders", "audit", at, "u1");
        assert_eq!(
            object_hour(&folder, &key),
            Some(at.with_minute(0).unwrap().with_second(0).unwrap())
        );
        assert_eq!(object_hour(&folder, "dl/orders/audit/junk.json"), None);
        assert_eq!(object_hour("dl/orders/other/", &key), None);
    }

    /// L7: the announcement names the object, its source and what it holds.
    #[test]
    fn dead_letter_written_event_names_the_object_l7() {
        let write = DeadLetterWrite {
            bucket: "bkt",
            key: "dl/orders/audit/2026/01/02/03/u1.json",
            content_length: 512,
            topic: "orders",
            subscription: "audit",
            reasons: [("TimeToLiveExceeded".to_string(), 2)]
                .into_iter()
                .collect(),
        };
        let at = DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .to_utc();
        let v: Value =
            serde_json::from_str(dead_letter_written_event(&write, "id-1", at).unwrap().get())
                .unwrap();
        assert_eq!(v["eventType"], DEAD_LETTER_EVENT_TYPE);
        assert_eq!(
            v["subject"],
            "/buckets/bkt/objects/dl/orders/audit/2026/01/02/03/u1.json"
        );
        assert_eq!(
            v["data"]["url"],
            "s3://bkt/dl/orders/audit/2026/01/02/03/u1.json"
        );
        assert_eq!(v["data"]["eventCount"], 2);
        assert_eq!(v["data"]["deadLetterReasons"]["TimeToLiveExceeded"], 2);
        assert_eq!(v["data"]["sourceSubscription"], "audit");
        assert_eq!(v["eventTime"], "2026-01-02T03:04:05.0000000Z");
    }

    #[test]
    fn object_is_a_json_array_of_records() {
        let r = render_record(&entry(), FieldNaming::EventGrid).unwrap();
        let body = render_object(&[r.clone(), r]);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 2);
    }
}
