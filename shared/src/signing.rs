//! Signed deliveries: the Standard Webhooks scheme (<https://www.standardwebhooks.com>), opt-in
//! per subscription, so a subscriber can check that a request came from gridrelay and was not
//! replayed. Event Grid has no payload signature; this is what webhook services have settled
//! on, with verifiers in every language.
//!
//! Every delivery of a signing subscription carries `webhook-id` (the same for every attempt
//! of the same batch of events: [`webhook_id`]), `webhook-timestamp` (Unix seconds, at the
//! attempt) and `webhook-signature`: `v1,` and the base64 HMAC-SHA256 of
//! `{id}.{timestamp}.{body}` under each secret in use, space-separated. A rotation keeps the old
//! secret signing beside the new one for a grace period ([`Signing::rotated`]), so subscribers
//! can switch without losing a delivery.
//!
//! Secrets are `whsec_` and the base64 of 24 to 64 random bytes; gridrelay keeps them in the
//! secret store, the record only their ids.

use std::time::Duration;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::limits::LimitError;

/// Where a secret's text starts.
pub const SECRET_PREFIX: &str = "whsec_";
/// Key bytes a secret may have.
pub const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;
/// How long a rotated-out secret keeps signing, unless told otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(24 * 3600);
/// The longest grace period a rotation may give, in hours (a week).
pub const MAX_GRACE_HOURS: u64 = 168;

/// The flag value that asks for a new random secret.
pub const GENERATE: &str = "generate";

/// A signing key. `Debug` prints `<secret>`.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(Vec<u8>);

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningSecret(<secret>)")
    }
}

impl SigningSecret {
    /// A `whsec_…` text, or [`GENERATE`] for a new random secret.
    pub fn from_flag(text: &str) -> Result<Self, LimitError> {
        if text == GENERATE {
            return Ok(Self::generate());
        }
        Self::parse(text)
    }

    /// Reads a `whsec_…` secret; the error never repeats the value.
    pub fn parse(text: &str) -> Result<Self, LimitError> {
        let invalid = || {
            LimitError::new(
                "signingSecret",
                "the given value",
                format!(
                    "{GENERATE}, or {SECRET_PREFIX} followed by the base64 of {} to {} bytes",
                    SECRET_BYTES.start(),
                    SECRET_BYTES.end()
                ),
            )
        };
        let encoded = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or_else(invalid)?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| invalid())?;
        if !SECRET_BYTES.contains(&key.len()) {
            return Err(invalid());
        }
        Ok(Self(key))
    }

    /// 32 random bytes.
    pub fn generate() -> Self {
        Self(rand::random::<[u8; 32]>().to_vec())
    }

    /// The `whsec_…` text a subscriber verifies with.
    pub fn to_text(&self) -> String {
        format!(
            "{SECRET_PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(&self.0)
        )
    }

    /// `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = <Hmac<Sha256>>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
        )
    }
}

/// The `webhook-signature` value: one signature per secret in use, space-separated.
pub fn signature_header(
    secrets: &[SigningSecret],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    secrets
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `webhook-id` of a batch: the same for every attempt of the same events to the same
/// subscription (so a subscriber can drop a retry it already processed), another for any
/// other batch.
pub fn webhook_id<'a>(
    subscription_id: &str,
    event_ids: impl IntoIterator<Item = &'a str>,
) -> String {
    let mut hash = Sha256::new();
    hash.update(subscription_id.as_bytes());
    for id in event_ids {
        hash.update([0]);
        hash.update(id.as_bytes());
    }
    format!("msg_{}", &crate::validation::hex(&hash.finalize())[..32])
}

/// A subscription's signing secrets, as its record keeps them: ids in the secret store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Signing {
    pub secret_id: String,
    /// The secret a rotation replaced, still signing until `until`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<PreviousSecret>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviousSecret {
    pub secret_id: String,
    pub until: DateTime<Utc>,
}

impl Signing {
    pub fn new(secret_id: impl Into<String>) -> Self {
        Self {
            secret_id: secret_id.into(),
            previous: None,
        }
    }

    /// The ids of the secrets that sign at `now`: the current one, and the previous one during
    /// its grace period.
    pub fn secret_ids_at(&self, now: DateTime<Utc>) -> Vec<&str> {
        let mut ids = vec![self.secret_id.as_str()];
        if let Some(p) = self.previous.as_ref().filter(|p| now < p.until) {
            ids.push(&p.secret_id);
        }
        ids
    }

    /// After a rotation to `new_secret_id` at `now`: the current secret signs beside it for
    /// `grace` (with no grace, not at all), and stays on the record until the next rotation,
    /// so it is not deleted while a warm function may still sign with it; the secret it
    /// replaces as previous is dropped.
    pub fn rotated(
        &self,
        new_secret_id: impl Into<String>,
        now: DateTime<Utc>,
        grace: Duration,
    ) -> Self {
        let until = now + chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::zero());
        Self {
            secret_id: new_secret_id.into(),
            previous: Some(PreviousSecret {
                secret_id: self.secret_id.clone(),
                until,
            }),
        }
    }
}

/// The secret store name of a subscription's signing secret made at `now`: each secret gets
/// its own, so a rotated-out one signs beside its successor. Under the secret prefix, which
/// the deliver function may read.
pub fn signing_secret_name(
    prefix: &str,
    topic: &str,
    subscription: &str,
    now: DateTime<Utc>,
) -> String {
    secret_name_at(prefix, topic, subscription, "signing", now)
}

/// The secret store name of a subscription's secret of `kind` written at `now`: unique to the
/// write, so that a new secret never replaces one a record still names.
pub fn secret_name_at(
    prefix: &str,
    topic: &str,
    subscription: &str,
    kind: &str,
    now: DateTime<Utc>,
) -> String {
    format!(
        "{}/{topic}/{subscription}/{kind}/{}",
        prefix.trim_end_matches('/'),
        now.timestamp_millis()
    )
}

/// A grace period as a form gives it (`text`, whole hours, 0 to [`MAX_GRACE_HOURS`]): its
/// hours and its length, or the error naming `field`, the value and the range.
pub fn grace_of_text(text: &str, field: &str) -> Result<(u64, Duration), LimitError> {
    let hours = text.trim().parse::<u64>().map_err(|_| {
        LimitError::new(
            field,
            text,
            format!("a whole number of hours, 0 to {MAX_GRACE_HOURS}"),
        )
    })?;
    let grace = grace_hours(hours)
        .map_err(|_| LimitError::new(field, text, format!("0 to {MAX_GRACE_HOURS} hours")))?;
    Ok((hours, grace))
}

/// A grace period given in hours, 0 to [`MAX_GRACE_HOURS`].
pub fn grace_hours(hours: u64) -> Result<Duration, LimitError> {
    if hours > MAX_GRACE_HOURS {
        return Err(LimitError::new(
            "gracePeriodHours",
            hours,
            format!("0 to {MAX_GRACE_HOURS}"),
        ));
    }
    Ok(Duration::from_secs(hours * 3600))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification (its reference test vector).
    #[test]
    fn signs_the_specifications_example() {
        let secret = SigningSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets_are_read_generated_and_refused_without_repeating_them() {
        let generated = SigningSecret::from_flag(GENERATE).unwrap();
        assert!(generated.to_text().starts_with("whsec_"));
        assert_eq!(
            SigningSecret::parse(&generated.to_text()).unwrap(),
            generated
        );
        assert_ne!(SigningSecret::generate(), generated);
        assert_eq!(format!("{generated:?}"), "SigningSecret(<secret>)");
        for bad in [
            "whsec_c2hvcnQ=",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_!!!",
        ] {
            let e = SigningSecret::parse(bad).unwrap_err();
            assert_eq!(e.field, "signingSecret");
            assert!(!e.to_string().contains(bad), "{e}");
            assert!(e.allowed.contains("24 to 64 bytes"), "{e}");
        }
    }

    #[test]
    fn a_batch_keeps_its_id_across_attempts_and_another_batch_gets_another() {
        let a = webhook_id("sub-1", ["e1", "e2"]);
        assert_eq!(a, webhook_id("sub-1", ["e1", "e2"]));
        assert!(a.starts_with("msg_") && a.len() == 36, "{a}");
        assert_ne!(a, webhook_id("sub-1", ["e1"]));
        assert_ne!(a, webhook_id("sub-2", ["e1", "e2"]));
        assert_ne!(webhook_id("s", ["ab", "c"]), webhook_id("s", ["a", "bc"]));
    }

    #[test]
    fn a_rotated_secret_signs_beside_the_new_one_for_its_grace_period() {
        let t0: DateTime<Utc> = "2026-11-25T00:00:00Z".parse().unwrap();
        let signing = Signing::new("old").rotated("new", t0, DEFAULT_GRACE);
        assert_eq!(signing.secret_ids_at(t0), vec!["new", "old"]);
        assert_eq!(
            signing.secret_ids_at(t0 + chrono::Duration::hours(23)),
            vec!["new", "old"]
        );
        assert_eq!(
            signing.secret_ids_at(t0 + chrono::Duration::hours(24)),
            vec!["new"]
        );
        // A rotation without grace stops signing with the old secret at once (it stays on the
        // record, to be deleted at the next rotation).
        let at_once = Signing::new("old").rotated("new", t0, Duration::ZERO);
        assert_eq!(at_once.secret_ids_at(t0), vec!["new"]);
        assert!(at_once.previous.is_some());
        // Two rotations in a row: only the last replaced secret stays in grace.
        let twice = signing.rotated("newer", t0, DEFAULT_GRACE);
        assert_eq!(twice.secret_ids_at(t0), vec!["newer", "new"]);
        assert!(grace_hours(169).is_err());
        assert_eq!(grace_hours(24).unwrap(), DEFAULT_GRACE);
    }

    #[test]
    fn every_secret_in_use_signs() {
        let (a, b) = (SigningSecret::generate(), SigningSecret::generate());
        let header = signature_header(&[a.clone(), b.clone()], "msg_1", 5, b"[]");
        assert_eq!(
            header,
            format!(
                "{} {}",
                a.sign("msg_1", 5, b"[]"),
                b.sign("msg_1", 5, b"[]")
            )
        );
    }
}
