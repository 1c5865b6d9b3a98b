//! Custom delivery headers (H1): up to 10 HTTP headers a subscription sends with every
//! delivery, each value at most 4,096 bytes: static (a value fixed by the subscription) or
//! dynamic (taken from a field of the delivered event, as `az`'s `NAME dynamic data.field`).
//!
//! A secret value never reaches the subscription record: the command line puts it in the
//! secret store (`gridrelay_ports::SecretStore`, Secrets Manager on AWS) and the record keeps
//! only the secret's id, which `deliver` resolves when it sends. `show` therefore cannot print
//! a secret, and nothing logs header values.

use serde::{Deserialize, Serialize};

use crate::limits::LimitError;

/// H1: headers per subscription.
pub const MAX_DELIVERY_ATTRIBUTES: usize = 10;
/// H1: bytes per header value.
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 4096;

/// Headers gridrelay sets itself, which a mapping may not replace.
const RESERVED: &[&str] = &[
    "content-type",
    "content-length",
    "host",
    "connection",
    "transfer-encoding",
    "webhook-request-origin",
    "webhook-request-callback",
    "webhook-request-rate",
    // Standard Webhooks signing (`crate::signing`).
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    // #35: which replay sent a delivery.
    crate::replay::REPLAY_HEADER,
];

/// One delivery header of a subscription, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryAttributeMapping {
    pub name: String,
    /// `Static` (the value is fixed by the subscription) or `Dynamic` (taken from the
    /// event's `source_field`).
    #[serde(rename = "type")]
    pub kind: String,
    /// A dynamic header's field of the delivered event: an envelope field or a dotted path
    /// (`data.tenant`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_field: Option<String>,
    /// The value of a non-secret header; `None` for a secret one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default)]
    pub is_secret: bool,
    /// Where a secret header's value is kept (a Secrets Manager secret id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_id: Option<String>,
}

/// The `type` of a dynamic mapping.
pub const DYNAMIC: &str = "Dynamic";

impl DeliveryAttributeMapping {
    pub fn is_dynamic(&self) -> bool {
        self.kind.eq_ignore_ascii_case(DYNAMIC)
    }
}

/// One `--delivery-attribute-mapping NAME static VALUE [secret]` or `NAME dynamic FIELD`,
/// before the secret is stored. For a dynamic one, `value` is the source field.
#[derive(Clone, PartialEq, Eq)]
pub struct DeliveryAttributeRequest {
    pub name: String,
    pub value: String,
    pub is_secret: bool,
    pub dynamic: bool,
}

/// The longest source field of a dynamic mapping.
pub const MAX_SOURCE_FIELD_CHARS: usize = 256;

impl std::fmt::Debug for DeliveryAttributeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryAttributeRequest")
            .field("name", &self.name)
            .field(
                "value",
                &if self.is_secret {
                    "<secret>"
                } else {
                    &self.value
                },
            )
            .field("is_secret", &self.is_secret)
            .field("dynamic", &self.dynamic)
            .finish()
    }
}

/// A secret header value read back from the secret store. Its `Debug` prints `<secret>`, and
/// it has no `Display` or `Serialize`: the value leaves it only through [`SecretValue::expose`],
/// where a request is built.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, to put in a request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretValue(<secret>)")
    }
}

impl DeliveryAttributeRequest {
    /// Parses the words of one flag: `NAME static VALUE [secret|true|false]` or
    /// `NAME dynamic FIELD`.
    pub fn parse(words: &[String]) -> Result<Self, LimitError> {
        let usage = "NAME static VALUE [secret] or NAME dynamic FIELD";
        let (name, kind, value, secret) = match words {
            [n, k, v] => (n, k, v, None),
            [n, k, v, s] => (n, k, v, Some(s.as_str())),
            _ => {
                return Err(LimitError::new(
                    "deliveryAttributeMapping",
                    format!("{} words", words.len()),
                    usage,
                ));
            }
        };
        let dynamic = match kind.to_ascii_lowercase().as_str() {
            "static" => false,
            "dynamic" => true,
            _ => {
                return Err(LimitError::new(
                    "deliveryAttributeMapping",
                    format!("type {kind:?} of {name}"),
                    "static or dynamic",
                ));
            }
        };
        let is_secret = match (dynamic, secret.map(str::to_ascii_lowercase).as_deref()) {
            (_, None) | (_, Some("false")) => false,
            (false, Some("secret" | "true")) => true,
            (true, Some(other)) => {
                return Err(LimitError::new(
                    "deliveryAttributeMapping",
                    format!("{other:?} after the source field of {name}"),
                    "nothing: a dynamic value comes from the event and cannot be secret",
                ));
            }
            (false, Some(other)) => {
                return Err(LimitError::new(
                    "deliveryAttributeMapping",
                    format!("{other:?} after the value of {name}"),
                    "secret, true or false",
                ));
            }
        };
        let request = Self {
            name: name.clone(),
            value: value.clone(),
            is_secret,
            dynamic,
        };
        request.check()?;
        Ok(request)
    }

    fn check(&self) -> Result<(), LimitError> {
        let token = !self.name.is_empty()
            && self.name.len() <= 256
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(LimitError::new(
                "deliveryAttributeMapping",
                format!("header name {:?}", self.name),
                "an HTTP header name: letters, digits and !#$%&'*+-.^_`|~",
            ));
        }
        let lower = self.name.to_ascii_lowercase();
        if lower.starts_with("aeg-") || RESERVED.contains(&lower.as_str()) {
            return Err(LimitError::new(
                "deliveryAttributeMapping",
                format!("header name {:?}", self.name),
                "a header gridrelay does not set itself (not aeg-*, content-type, host, webhook-*, gridrelay-replay…)",
            ));
        }
        if self.dynamic {
            let field_ok = !self.value.is_empty()
                && self.value.chars().count() <= MAX_SOURCE_FIELD_CHARS
                && self.value.split('.').all(|part| {
                    !part.is_empty() && !part.chars().any(|c| c.is_control() || c.is_whitespace())
                });
            if !field_ok {
                return Err(LimitError::new(
                    "deliveryAttributeMapping",
                    format!("source field {:?} of {}", self.value, self.name),
                    format!(
                        "an event field or dotted path such as data.tenant, at most {MAX_SOURCE_FIELD_CHARS} characters"
                    ),
                ));
            }
            return Ok(());
        }
        let shown = if self.is_secret {
            format!("the secret value of {}", self.name)
        } else {
            format!("the value of {}", self.name)
        };
        if self.value.len() > MAX_ATTRIBUTE_VALUE_BYTES {
            return Err(LimitError::new(
                "deliveryAttributeMapping",
                format!("{shown} ({} bytes)", self.value.len()),
                format!("at most {MAX_ATTRIBUTE_VALUE_BYTES} bytes"),
            ));
        }
        if self
            .value
            .bytes()
            .any(|b| b == b'\r' || b == b'\n' || b == 0)
        {
            return Err(LimitError::new(
                "deliveryAttributeMapping",
                shown,
                "a header value without line breaks",
            ));
        }
        Ok(())
    }
}

/// Checks a subscription's whole list: at most 10, names unique (case-insensitive).
pub fn check_all(requests: &[DeliveryAttributeRequest]) -> Result<(), LimitError> {
    if requests.len() > MAX_DELIVERY_ATTRIBUTES {
        return Err(LimitError::new(
            "deliveryAttributeMapping",
            format!("{} mappings", requests.len()),
            format!("at most {MAX_DELIVERY_ATTRIBUTES}"),
        ));
    }
    for (i, r) in requests.iter().enumerate() {
        r.check()?;
        if requests[..i]
            .iter()
            .any(|o| o.name.eq_ignore_ascii_case(&r.name))
        {
            return Err(LimitError::new(
                "deliveryAttributeMapping",
                format!("header name {:?} twice", r.name),
                "each header once",
            ));
        }
    }
    Ok(())
}

/// The secret's name in the secret store: `PREFIX/TOPIC/SUBSCRIPTION/HEADER.WRITE`, where
/// `write` names the one write that stored it (the subscription's id and when). No two
/// writes share a secret, so storing a value never changes one a record already names (an
/// update refused over a changed record, or a subscription created again under the name while
/// an expired one's secrets are deleted, leaves the other's secrets alone).
pub fn secret_name(
    prefix: &str,
    topic: &str,
    subscription: &str,
    header: &str,
    write: &str,
) -> String {
    format!(
        "{}/{topic}/{subscription}/{}.{write}",
        prefix.trim_end_matches('/'),
        header.to_ascii_lowercase()
    )
}

/// The stored form of validated requests: non-secret values kept, secret ones left for
/// `gridrelay_ports::secret_headers::store_secrets`.
pub fn mappings(requests: &[DeliveryAttributeRequest]) -> Vec<DeliveryAttributeMapping> {
    requests
        .iter()
        .map(|r| DeliveryAttributeMapping {
            name: r.name.clone(),
            kind: if r.dynamic { DYNAMIC } else { "Static" }.into(),
            source_field: r.dynamic.then(|| r.value.clone()),
            value: (!r.is_secret && !r.dynamic).then(|| r.value.clone()),
            is_secret: r.is_secret,
            secret_id: None,
        })
        .collect()
}

/// H1: the dynamic headers of a request carrying `events` (each in its delivery form): for
/// each dynamic mapping, its source field's value when every event has the same one and it
/// is a string, number or boolean (as Event Grid takes them) that a header can carry (visible
/// ASCII, at most 4,096 bytes). Otherwise the header is left out: the events keep their own
/// values in the body.
pub fn dynamic_headers<'a>(
    mappings: &[DeliveryAttributeMapping],
    events: impl Iterator<Item = &'a serde_json::value::RawValue>,
) -> Vec<(String, String)> {
    let dynamic: Vec<(&str, &str)> = mappings
        .iter()
        .filter(|m| m.is_dynamic())
        .filter_map(|m| Some((m.name.as_str(), m.source_field.as_deref()?)))
        .collect();
    if dynamic.is_empty() {
        return Vec::new();
    }
    // Per mapping: the value all events so far agree on (`None` once they disagree).
    let mut agreed: Vec<Option<Option<String>>> = vec![None; dynamic.len()];
    let mut first = true;
    for event in events {
        let parsed: serde_json::Value = serde_json::from_str(event.get()).unwrap_or_default();
        for ((_, field), agreed) in dynamic.iter().zip(agreed.iter_mut()) {
            let value = header_value(&parsed, field);
            if first {
                *agreed = Some(value);
            } else if agreed.as_ref().is_some_and(|a| *a != value) {
                *agreed = Some(None);
            }
        }
        first = false;
    }
    dynamic
        .iter()
        .zip(agreed)
        .filter_map(|((name, _), value)| Some((name.to_string(), value.flatten()?)))
        .collect()
}

/// A source field's value as a header carries it, if it can.
fn header_value(event: &serde_json::Value, field: &str) -> Option<String> {
    let value = field.split('.').try_fold(event, |v, part| v.get(part))?;
    let text = match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::Bool(b) => b.to_string(),
        _ => return None,
    };
    let header_safe = text.len() <= MAX_ATTRIBUTE_VALUE_BYTES
        && text
            .bytes()
            .all(|b| b == b'\t' || (0x20..=0x7e).contains(&b));
    header_safe.then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    /// H1: the flag's forms, and its limits named in the error.
    #[test]
    fn mappings_are_parsed_and_limited_h1() {
        let r = DeliveryAttributeRequest::parse(&words(&["X-Api-Key", "static", "k", "secret"]))
            .unwrap();
        assert!(r.is_secret);
        assert!(!format!("{r:?}").contains("\"k\""), "Debug hides secrets");
        assert!(
            !DeliveryAttributeRequest::parse(&words(&["X-Team", "Static", "blue"]))
                .unwrap()
                .is_secret
        );
        let long = "v".repeat(MAX_ATTRIBUTE_VALUE_BYTES + 1);
        let err = DeliveryAttributeRequest::parse(&words(&["X-Big", "static", &long])).unwrap_err();
        assert_eq!(err.allowed, "at most 4096 bytes");
        assert!(
            DeliveryAttributeRequest::parse(&words(&[
                "X-Ok",
                "static",
                &"v".repeat(MAX_ATTRIBUTE_VALUE_BYTES)
            ]))
            .is_ok()
        );
        for bad in [
            words(&["aeg-event-type", "static", "x"]),
            words(&["Content-Type", "static", "x"]),
            // #35: a live delivery may not pass for a replay's.
            words(&["Gridrelay-Replay", "dynamic", "data.x"]),
            words(&["bad name", "static", "x"]),
            words(&["X-A", "dynamic", "data..x"]),
            words(&["X-A", "dynamic", "data.x", "secret"]),
            words(&["X-A", "computed", "data.x"]),
            words(&["X-A", "static", "x", "maybe"]),
            words(&["X-A", "static"]),
            words(&["X-A", "static", "a\r\nInjected: 1"]),
        ] {
            assert!(DeliveryAttributeRequest::parse(&bad).is_err(), "{bad:?}");
        }
        let eleven: Vec<DeliveryAttributeRequest> = (0..11)
            .map(|i| DeliveryAttributeRequest {
                name: format!("X-{i}"),
                value: "v".into(),
                is_secret: false,
                dynamic: false,
            })
            .collect();
        assert_eq!(check_all(&eleven).unwrap_err().allowed, "at most 10");
        assert!(check_all(&eleven[..10]).is_ok());
        let twice = [
            eleven[0].clone(),
            DeliveryAttributeRequest {
                name: "x-0".into(),
                ..eleven[0].clone()
            },
        ];
        assert!(check_all(&twice).is_err());
    }

    /// H1 (#11 item 12): `NAME dynamic FIELD` takes the header's value from the delivered
    /// event: strings, numbers and booleans; a batch gets the header only when every event
    /// has the same value; a missing field, an object or a value a header cannot carry leaves
    /// the header out.
    #[test]
    fn dynamic_headers_take_the_events_field_h1() {
        let m =
            |words_: &[&str]| mappings(&[DeliveryAttributeRequest::parse(&words(words_)).unwrap()]);
        let tenant = m(&["X-Tenant", "Dynamic", "data.tenant"]);
        assert_eq!(tenant[0].kind, "Dynamic");
        assert_eq!(tenant[0].source_field.as_deref(), Some("data.tenant"));
        assert_eq!(tenant[0].value, None);
        let raw = |v: serde_json::Value| serde_json::value::to_raw_value(&v).unwrap();
        let ev = |data: serde_json::Value| raw(serde_json::json!({"subject": "s/1", "data": data}));
        let a = ev(serde_json::json!({"tenant": "acme", "n": 7, "ok": true, "o": {"x": 1}}));
        let b = ev(serde_json::json!({"tenant": "acme"}));
        let c = ev(serde_json::json!({"tenant": "globex"}));
        let crlf = ev(serde_json::json!({"tenant": "a\r\nInjected: 1"}));
        let headers = |m: &[DeliveryAttributeMapping], events: &[&serde_json::value::RawValue]| {
            dynamic_headers(m, events.iter().copied())
        };
        let one = [a.as_ref()];
        assert_eq!(
            headers(&tenant, &one),
            vec![("X-Tenant".to_string(), "acme".to_string())]
        );
        assert_eq!(headers(&m(&["X-N", "dynamic", "data.n"]), &one)[0].1, "7");
        assert_eq!(
            headers(&m(&["X-Ok", "dynamic", "data.ok"]), &one)[0].1,
            "true"
        );
        assert_eq!(
            headers(&m(&["X-S", "dynamic", "subject"]), &one)[0].1,
            "s/1"
        );
        assert!(headers(&m(&["X-O", "dynamic", "data.o"]), &one).is_empty());
        assert!(headers(&m(&["X-M", "dynamic", "data.missing"]), &one).is_empty());
        assert!(headers(&tenant, &[crlf.as_ref()]).is_empty());
        assert_eq!(headers(&tenant, &[a.as_ref(), b.as_ref()]).len(), 1);
        assert!(headers(&tenant, &[a.as_ref(), b.as_ref(), c.as_ref()]).is_empty());
        // Static mappings are not dynamic headers.
        assert!(headers(&m(&["X-Team", "static", "blue"]), &one).is_empty());
    }

    #[test]
    fn a_secret_value_is_never_printed_by_debug() {
        let v = SecretValue::new("Bearer s3cret");
        assert_eq!(format!("{v:?}"), "SecretValue(<secret>)");
        assert_eq!(
            format!("{:?}", Some(vec![v.clone()])),
            "Some([SecretValue(<secret>)])"
        );
        assert_eq!(v.expose(), "Bearer s3cret");
    }
}
