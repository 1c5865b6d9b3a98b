//! The endpoint validation handshake: nobody can point gridrelay at a URL that did not agree to
//! receive events.
//!
//! A new subscription is `Creating` and receives nothing. The `deliver` worker (the service,
//! not the command line) then asks its endpoint:
//!
//! - Event Grid and custom schema: a POST of a `Microsoft.EventGrid.SubscriptionValidationEvent`
//!   with `aeg-event-type: SubscriptionValidation`. A 200 whose body holds
//!   `{"validationResponse": CODE}` validates at once (`Succeeded`); any other 200 means the
//!   owner will validate by hand (`AwaitingManualAction`): a GET of the event's `validationUrl`
//!   within 10 minutes validates it, else it ends `Failed`. Any other answer: `Failed`.
//! - CloudEvents: the CloudEvents webhook abuse-protection `OPTIONS` request with
//!   `WebHook-Request-Origin`; a 200 with a matching `WebHook-Allowed-Origin` (or `*`)
//!   validates; anything else: `Failed`.
//!
//! Only a hash of the validation code is stored, so `show` can print the whole record.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// How long a manual validation may take (Event Grid: 10 minutes).
pub const MANUAL_VALIDATION_WINDOW: Duration = Duration::from_secs(600);
/// The origin gridrelay names in CloudEvents abuse-protection requests. Event Grid's, so
/// subscribers written for Event Grid answer unchanged.
pub const DEFAULT_WEBHOOK_ORIGIN: &str = "eventgrid.azure.net";
/// The event type of the validation event.
pub const VALIDATION_EVENT_TYPE: &str = "Microsoft.EventGrid.SubscriptionValidationEvent";
/// The path of the manual validation endpoint, served by the publish API.
pub const VALIDATION_PATH: &str = "/subscriptions/validate";

/// Where a subscription is in its life (Event Grid's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProvisioningState {
    Creating,
    AwaitingManualAction,
    Succeeded,
    Failed,
}

/// A subscription's provisioning state, why, and what a manual validation must show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provisioning {
    pub state: ProvisioningState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// SHA-256 (hex) of the validation code sent to the endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_code_sha256: Option<String>,
    /// A manual validation after this is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_expires_at: Option<DateTime<Utc>>,
}

impl Provisioning {
    pub fn with_state(state: ProvisioningState, detail: Option<String>) -> Self {
        Self {
            state,
            detail,
            validation_code_sha256: None,
            validation_expires_at: None,
        }
    }

    /// What a record without a provisioning state has: it was never validated, so it receives
    /// nothing until it is created again.
    pub fn unrecorded() -> Self {
        Self::with_state(
            ProvisioningState::Failed,
            Some(
                "the record has no provisioning state, so its endpoint was never validated; delete the subscription and create it again"
                    .into(),
            ),
        )
    }

    /// A new subscription, waiting for its handshake.
    pub fn creating() -> Self {
        Self::with_state(
            ProvisioningState::Creating,
            Some("waiting for the endpoint validation handshake".into()),
        )
    }

    /// Whether `code` is the one sent, and it is still in time.
    pub fn accepts_manual_code(&self, code: &str, now: DateTime<Utc>) -> Result<(), &'static str> {
        if !matches!(
            self.state,
            ProvisioningState::AwaitingManualAction | ProvisioningState::Creating
        ) {
            return Err("the subscription is not waiting for validation");
        }
        let expected = self
            .validation_code_sha256
            .as_deref()
            .ok_or("no validation code was sent")?;
        if !bool::from(code_hash(code).as_bytes().ct_eq(expected.as_bytes())) {
            return Err("the validation code does not match");
        }
        if self.validation_expires_at.is_some_and(|at| now > at) {
            return Err("the validation window has passed; create the subscription again");
        }
        Ok(())
    }
}

/// A fresh validation code: 32 random bytes as hex.
pub fn new_code() -> String {
    hex(&rand::random::<[u8; 32]>())
}

/// What is stored of a code: its SHA-256, as hex.
pub fn code_hash(code: &str) -> String {
    hex(&Sha256::digest(code.as_bytes()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The validation event's body: an Event Grid array with one event.
pub fn validation_event_body(
    topic_resource_id: &str,
    id: &str,
    code: &str,
    validation_url: Option<&str>,
    now: DateTime<Utc>,
) -> String {
    let mut data = serde_json::json!({ "validationCode": code });
    if let Some(url) = validation_url {
        data["validationUrl"] = serde_json::Value::String(url.to_string());
    }
    serde_json::json!([{
        "id": id,
        "topic": topic_resource_id,
        "subject": "",
        "data": data,
        "eventType": VALIDATION_EVENT_TYPE,
        "eventTime": now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "metadataVersion": "1",
        "dataVersion": "1",
    }])
    .to_string()
}

/// `PUBLIC_URL/subscriptions/validate?topic=…&name=…&code=…`.
pub fn validation_url(public_url: &str, topic: &str, subscription: &str, code: &str) -> String {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("topic", topic)
        .append_pair("name", subscription)
        .append_pair("code", code)
        .finish();
    format!(
        "{}{VALIDATION_PATH}?{query}",
        public_url.trim_end_matches('/')
    )
}

/// Whether a 200's body answers with the code (`validationResponse`, any letter case).
pub fn answers_with_code(body: &[u8], code: &str) -> bool {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(body) else {
        return false;
    };
    map.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("validationResponse")
            && v.as_str()
                .is_some_and(|given| bool::from(given.as_bytes().ct_eq(code.as_bytes())))
    })
}

/// Whether a `WebHook-Allowed-Origin` answer allows `origin`: `*`, the origin, or a list with it.
pub fn origin_allowed(allowed: Option<&str>, origin: &str) -> bool {
    allowed.is_some_and(|a| {
        a.split(',')
            .map(str::trim)
            .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    })
}

/// A handshake step, carried on the delivery queue (see [`crate::message::ValidationTask`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValidationStep {
    /// Ask the endpoint.
    Handshake,
    /// The manual validation window has passed: fail if still waiting.
    Expire,
    /// Not a handshake step but the subscription's end, carried the same way: once its
    /// `expirationTimeUtc` has come, delete it (asked again until then).
    SubscriptionExpiry,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_must_match_and_be_in_time() {
        let code = new_code();
        let now = Utc::now();
        let p = Provisioning {
            validation_code_sha256: Some(code_hash(&code)),
            validation_expires_at: Some(now + chrono::Duration::minutes(10)),
            ..Provisioning::with_state(ProvisioningState::AwaitingManualAction, None)
        };
        assert!(p.accepts_manual_code(&code, now).is_ok());
        assert!(p.accepts_manual_code("other", now).is_err());
        assert!(
            p.accepts_manual_code(&code, now + chrono::Duration::minutes(11))
                .is_err()
        );
        let done = Provisioning {
            state: ProvisioningState::Failed,
            ..p.clone()
        };
        assert!(done.accepts_manual_code(&code, now).is_err());
    }

    #[test]
    fn answers_and_origins() {
        assert!(answers_with_code(br#"{"validationResponse":"abc"}"#, "abc"));
        assert!(answers_with_code(br#"{"ValidationResponse":"abc"}"#, "abc"));
        assert!(!answers_with_code(
            br#"{"validationResponse":"abd"}"#,
            "abc"
        ));
        assert!(!answers_with_code(b"ok", "abc"));
        assert!(origin_allowed(Some("*"), "eventgrid.azure.net"));
        assert!(origin_allowed(
            Some("a.example, EventGrid.Azure.Net"),
            "eventgrid.azure.net"
        ));
        assert!(!origin_allowed(Some("a.example"), "eventgrid.azure.net"));
        assert!(!origin_allowed(None, "eventgrid.azure.net"));
    }

    #[test]
    fn validation_urls_encode_their_query() {
        let url = validation_url("http://h:1/", "t", "s", "c&d");
        assert_eq!(
            url,
            "http://h:1/subscriptions/validate?topic=t&name=s&code=c%26d"
        );
    }
}
