//! Custom delivery headers (H1): up to 10 HTTP headers a subscription sends with every
//! delivery, each value at most 4,096 bytes.
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
];

/// One delivery header of a subscription, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryAttributeMapping {
    pub name: String,
    /// Always `Static`: the value is fixed when the subscription is created.
    #[serde(rename = "type")]
    pub kind: String,
    /// The value of a non-secret header; `None` for a secret one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default)]
    pub is_secret: bool,
    /// Where a secret header's value is kept (a Secrets Manager secret id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_id: Option<String>,
}

/// One `--delivery-attribute-mapping NAME static VALUE [secret]`, before the secret is stored.
#[derive(Clone, PartialEq, Eq)]
pub struct DeliveryAttributeRequest {
    pub name: String,
    pub value: String,
    pub is_secret: bool,
}

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
    /// Parses the words of one flag: `NAME static VALUE [secret|true|false]`.
    pub fn parse(words: &[String]) -> Result<Self, LimitError> {
        let usage = "NAME static VALUE [secret]";
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
        if !kind.eq_ignore_ascii_case("static") {
            return Err(LimitError::new(
                "deliveryAttributeMapping",
                format!("type {kind:?} of {name}"),
                "static (dynamic mappings are not supported)",
            ));
        }
        let is_secret = match secret.map(str::to_ascii_lowercase).as_deref() {
            None | Some("false") => false,
            Some("secret" | "true") => true,
            Some(other) => {
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
                "a header gridrelay does not set itself (not aeg-*, content-type, host, webhook-request-*…)",
            ));
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

/// The secret's name in the secret store: `PREFIX/TOPIC/SUBSCRIPTION/HEADER`.
pub fn secret_name(prefix: &str, topic: &str, subscription: &str, header: &str) -> String {
    format!(
        "{}/{topic}/{subscription}/{}",
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
            kind: "Static".into(),
            value: (!r.is_secret).then(|| r.value.clone()),
            is_secret: r.is_secret,
            secret_id: None,
        })
        .collect()
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
            words(&["bad name", "static", "x"]),
            words(&["X-A", "dynamic", "data.x"]),
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
