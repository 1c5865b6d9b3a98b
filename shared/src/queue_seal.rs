//! Sealed queue messages (#34 item 2): `deliver` and `dead-letter` act only on messages
//! gridrelay itself wrote.
//!
//! A delivery queue message names a subscription and carries events; whoever can put one on
//! the delivery queue can make gridrelay POST chosen events to any subscriber, with that
//! subscriber's secret headers and signature. SQS cannot tell who wrote a message
//! (`SenderId` is the role, and `deliver` writes its re-enqueues and its subscribers' SQS
//! destinations under the same one), so every message gridrelay writes to its own queues
//! carries a seal: the base64 HMAC-SHA256 of the body as SQS stores it, under a key only the
//! functions read (a Secrets Manager secret the stack generates), in the message attribute
//! [`SEAL_ATTRIBUTE`]. A message without a valid seal is dropped and counted, never acted on.
//!
//! Upgrading a stack that had no key: messages written before the key existed carry no seal.
//! SQS stamps each message with the time it was sent (`SentTimestamp`, which a sender cannot
//! choose), so an unsealed message sent before [`QueueKey::unsealed_before`] is still taken;
//! the stack sets that to the key's creation plus [`UPGRADE_GRACE`] (functions of the old
//! version may still be running while the stack updates).

use std::time::Duration;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The SQS message attribute (a String) that holds a message's seal.
pub const SEAL_ATTRIBUTE: &str = "gridrelay-seal";
/// The fewest characters a key's text may have (the stack generates 64).
pub const MIN_KEY_CHARS: usize = 32;
/// How long after the key's creation an unsealed message is still taken (upgrades only): a
/// Lambda function's longest run, so the old version's last writes are not lost.
pub const UPGRADE_GRACE: Duration = Duration::from_secs(15 * 60);

/// The key messages are sealed with.
#[derive(Clone)]
pub struct QueueKey {
    key: Vec<u8>,
    unsealed_before: DateTime<Utc>,
}

impl std::fmt::Debug for QueueKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueKey")
            .field("key", &"<redacted>")
            .field("unsealed_before", &self.unsealed_before)
            .finish()
    }
}

/// A key's text that cannot be one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the queue key has {chars} characters; at least {MIN_KEY_CHARS} are needed (the stack generates 64)"
)]
pub struct KeyTooShort {
    pub chars: usize,
}

impl QueueKey {
    /// A key from its secret text. Unsealed messages sent before `unsealed_before` are taken
    /// (see the module's docs; a key that was never without messages sealed takes none: pass
    /// its creation time).
    pub fn new(text: &str, unsealed_before: DateTime<Utc>) -> Result<Self, KeyTooShort> {
        let chars = text.chars().count();
        if chars < MIN_KEY_CHARS {
            return Err(KeyTooShort { chars });
        }
        Ok(Self {
            key: text.as_bytes().to_vec(),
            unsealed_before,
        })
    }

    /// A new random key's text (64 alphanumeric characters), as the stack generates one.
    pub fn generate_text() -> String {
        use rand::Rng as _;
        rand::rng()
            .sample_iter(rand::distr::Alphanumeric)
            .take(64)
            .map(char::from)
            .collect()
    }

    /// Until when unsealed messages are taken.
    pub fn unsealed_before(&self) -> DateTime<Utc> {
        self.unsealed_before
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        <Hmac<Sha256>>::new_from_slice(&self.key).expect("HMAC accepts every key length")
    }

    /// The seal of a body, exactly as it is sent to SQS.
    pub fn seal(&self, body: &str) -> String {
        let mut mac = self.mac();
        mac.update(body.as_bytes());
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    }

    /// Whether a received message is one gridrelay wrote: its body, its seal attribute (if
    /// any) and when SQS says it was sent (if it says).
    pub fn check(
        &self,
        body: &str,
        seal: Option<&str>,
        sent_at: Option<DateTime<Utc>>,
    ) -> SealCheck {
        match seal {
            Some(seal) => {
                let expected = self.seal(body);
                if bool::from(expected.as_bytes().ct_eq(seal.as_bytes())) {
                    SealCheck::Sealed
                } else {
                    SealCheck::Refused(Refusal::WrongSeal)
                }
            }
            None => match sent_at {
                Some(at) if at < self.unsealed_before => SealCheck::SentBeforeKey,
                _ => SealCheck::Refused(Refusal::Unsealed),
            },
        }
    }
}

/// What [`QueueKey::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealCheck {
    /// Written by gridrelay under this key.
    Sealed,
    /// Unsealed, but sent before the key was in use (an upgrade's messages in flight).
    SentBeforeKey,
    /// Not gridrelay's: dropped and counted.
    Refused(Refusal),
}

impl SealCheck {
    pub fn is_taken(self) -> bool {
        !matches!(self, SealCheck::Refused(_))
    }
}

/// Why a message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No seal, and sent after the key was in use.
    Unsealed,
    /// A seal that is not this body's under this key (another key, or a changed body).
    WrongSeal,
}

impl Refusal {
    /// The metric label and log wording.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Unsealed => "unsealed",
            Refusal::WrongSeal => "wrong seal",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + secs, 0).unwrap()
    }

    fn key() -> QueueKey {
        QueueKey::new(&"k".repeat(64), at(0)).unwrap()
    }

    #[test]
    fn a_sealed_body_is_taken_and_any_change_to_it_is_refused() {
        let key = key();
        let body = r#"{"kind":"delivery","topic":"orders"}"#;
        let seal = key.seal(body);
        assert_eq!(
            key.check(body, Some(&seal), Some(at(10))),
            SealCheck::Sealed
        );
        let changed = r#"{"kind":"delivery","topic":"orderz"}"#;
        assert_eq!(
            key.check(changed, Some(&seal), Some(at(10))),
            SealCheck::Refused(Refusal::WrongSeal)
        );
    }

    #[test]
    fn a_seal_made_under_another_key_is_refused() {
        let other = QueueKey::new(&"o".repeat(64), at(0)).unwrap();
        let body = "{}";
        assert_eq!(
            key().check(body, Some(&other.seal(body)), None),
            SealCheck::Refused(Refusal::WrongSeal)
        );
        assert_eq!(
            key().check(body, Some(""), None),
            SealCheck::Refused(Refusal::WrongSeal)
        );
    }

    #[test]
    fn an_unsealed_message_is_taken_only_if_sqs_says_it_was_sent_before_the_key() {
        let key = key();
        assert_eq!(
            key.check("{}", None, Some(at(-1))),
            SealCheck::SentBeforeKey
        );
        assert_eq!(
            key.check("{}", None, Some(at(0))),
            SealCheck::Refused(Refusal::Unsealed)
        );
        assert_eq!(
            key.check("{}", None, None),
            SealCheck::Refused(Refusal::Unsealed),
            "no sent time: not shown to be old"
        );
    }

    #[test]
    fn a_short_key_is_refused_naming_its_length_and_the_least() {
        let e = QueueKey::new("short", at(0)).unwrap_err();
        assert_eq!(e, KeyTooShort { chars: 5 });
        assert!(e.to_string().contains("5 characters; at least 32"), "{e}");
        let generated = QueueKey::generate_text();
        assert_eq!(generated.len(), 64);
        assert!(QueueKey::new(&generated, at(0)).is_ok());
        assert_ne!(generated, QueueKey::generate_text());
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let shown = format!("{:?}", key());
        assert!(!shown.contains("kkkk"), "{shown}");
    }
}
