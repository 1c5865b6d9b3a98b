//! Portal links (#36): how a subscriber sees one subscription's deliveries without an AWS
//! account.
//!
//! The operator hands the subscriber a link whose token grants one subscription until a time.
//! The token is `v1.<grant>.<tag>`: the grant is the base64url (unpadded) JSON of the topic,
//! the subscription and the expiry (Unix seconds); the tag is the base64url HMAC-SHA256 of
//! `gridrelay-portal-link.v1.<grant>` under the portal key, a secret the stack generates and
//! only the portal and the operator's command line read. A token is read only after its tag
//! checks (compared in constant time), so a forged grant is never parsed; it is refused after
//! its expiry, and every link ever made is refused once the key is rotated. Nothing in the
//! token is secret (the subscription's names and the expiry are readable): what it proves is
//! that whoever holds the key made it.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::limits::LimitError;

/// The fewest characters the portal key's text may have (the stack generates 64).
pub const MIN_KEY_CHARS: usize = 32;
/// The shortest life a link may be given.
pub const MIN_LINK_LIFETIME: chrono::TimeDelta = chrono::TimeDelta::minutes(5);
/// The longest life a link may be given: a link in a mailbox is a standing pass, and rotating
/// the key (which revokes every link) should rarely be needed to end one.
pub const MAX_LINK_LIFETIME: chrono::TimeDelta = chrono::TimeDelta::days(30);
/// The most characters a token read from a request may have (real ones have about 200): longer
/// ones are refused before anything is decoded.
pub const MAX_TOKEN_CHARS: usize = 1024;

const VERSION: &str = "v1";
const TAG_CONTEXT: &str = "gridrelay-portal-link";
const FORM_CONTEXT: &str = "gridrelay-portal-form";
/// The event type of the test events a subscriber sends itself from the portal.
pub const TEST_EVENT_TYPE: &str = "Gridrelay.Portal.TestEvent";
const BASE64URL: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The key links are signed with.
#[derive(Clone)]
pub struct PortalKey {
    key: Vec<u8>,
}

impl std::fmt::Debug for PortalKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PortalKey(<redacted>)")
    }
}

/// A key's text that cannot be one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the portal key has {chars} characters; at least {MIN_KEY_CHARS} are needed (the stack generates 64)"
)]
pub struct PortalKeyTooShort {
    pub chars: usize,
}

impl PortalKey {
    /// A key from its secret text.
    pub fn new(text: &str) -> Result<Self, PortalKeyTooShort> {
        let chars = text.chars().count();
        if chars < MIN_KEY_CHARS {
            return Err(PortalKeyTooShort { chars });
        }
        Ok(Self {
            key: text.as_bytes().to_vec(),
        })
    }

    /// A new random key's text (64 alphanumeric characters), as the stack generates one.
    pub fn generate_text() -> String {
        crate::queue_seal::QueueKey::generate_text()
    }

    fn mac(&self, grant: &str) -> Hmac<Sha256> {
        self.mac_in(TAG_CONTEXT, grant)
    }

    /// The HMAC of `text` under the key, in `context` (so a tag made for one use is never
    /// taken for another).
    fn mac_in(&self, context: &str, text: &str) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        let mut mac =
            <Hmac<Sha256>>::new_from_slice(&self.key).expect("HMAC accepts every key length");
        mac.update(format!("{context}.{VERSION}.{text}").as_bytes());
        mac
    }

    /// The token the forms of a page carry for `pass` (the link's token its browser holds in
    /// the cookie): a page of another site can send the cookie's holder's browser to post a
    /// form, but cannot know this. It dies with the pass, and with the key.
    pub fn form_token(&self, pass: &str) -> String {
        BASE64URL.encode(self.mac_in(FORM_CONTEXT, pass).finalize().into_bytes())
    }

    /// Whether `given` is [`PortalKey::form_token`] of `pass` (compared in constant time).
    pub fn form_token_matches(&self, pass: &str, given: &str) -> bool {
        BASE64URL
            .decode(given)
            .is_ok_and(|tag| self.mac_in(FORM_CONTEXT, pass).verify_slice(&tag).is_ok())
    }
}

/// How often a subscription may be sent a test event from the portal: once per window of this
/// many seconds (windows counted from the Unix epoch), so a link's holder cannot flood the
/// delivery queue and the endpoint.
pub const TEST_EVENT_WINDOW_SECONDS: i64 = 10;

/// The claim a test event to the subscription with id `subscription_id` takes at `now`: the key
/// of its window (the first claim of a key wins; another in the same window is refused), when
/// the claim may be forgotten (a minute past the window), and when the next window starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestEventClaim {
    pub key: String,
    pub until: DateTime<Utc>,
    pub next_window: DateTime<Utc>,
}

impl TestEventClaim {
    pub fn at(subscription_id: &str, now: DateTime<Utc>) -> Self {
        let window = now.timestamp().div_euclid(TEST_EVENT_WINDOW_SECONDS);
        let next = (window + 1) * TEST_EVENT_WINDOW_SECONDS;
        let next_window = DateTime::from_timestamp(next, 0).unwrap_or(now);
        Self {
            key: format!("portal-test#{subscription_id}#{window}"),
            until: next_window + chrono::Duration::minutes(1),
            next_window,
        }
    }
}

/// How long a dropped event sent again from the portal cannot be sent again: until the
/// journal shows its new delivery (the stream writes within its buffering interval, 15
/// minutes at most), so the page no longer offers it, with room for its first attempt.
pub const SEND_AGAIN_HOLD: chrono::Duration = chrono::Duration::minutes(20);

/// The claim a dropped event `event_id` of the subscription with id `subscription_id` takes
/// when the portal sends it again at `now`: its key (the event's id as a digest, so any id
/// fits a key) and until when it holds. A second send again of it meanwhile finds it taken.
pub fn send_again_claim(
    subscription_id: &str,
    event_id: &str,
    now: DateTime<Utc>,
) -> (String, DateTime<Utc>) {
    use sha2::Digest;
    let digest = crate::validation::hex(&sha2::Sha256::digest(event_id.as_bytes()));
    (
        format!("portal-again#{subscription_id}#{digest}"),
        now + SEND_AGAIN_HOLD,
    )
}

/// The test event a subscriber sends itself from the portal, in the Event Grid schema (each
/// subscription gets it in its own delivery schema): type [`TEST_EVENT_TYPE`], subject
/// `/portal/<topic>/<subscription>`.
pub fn test_event(
    topic: &str,
    subscription: &str,
    id: &str,
    now: DateTime<Utc>,
) -> Box<serde_json::value::RawValue> {
    let event = serde_json::json!({
        "id": id,
        "topic": crate::subscription::topic_resource_id(topic),
        "subject": format!("/portal/{topic}/{subscription}"),
        "eventType": TEST_EVENT_TYPE,
        "eventTime": crate::dead_letter::timestamp(now),
        "dataVersion": "1",
        "metadataVersion": "1",
        "data": {
            "message": "A test event, sent from gridrelay's subscribers' portal.",
            "topic": topic,
            "subscription": subscription,
        }
    });
    // A tree of strings always serializes to valid JSON.
    serde_json::value::to_raw_value(&event).expect("a JSON tree serializes")
}

/// What a link lets its holder see and do: one subscription, until a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortalGrant {
    #[serde(rename = "t")]
    pub topic: String,
    #[serde(rename = "s")]
    pub subscription: String,
    /// The subscription's id: a subscription deleted and made again under the same name is
    /// another one, which a link to the first does not open.
    #[serde(rename = "i")]
    pub subscription_id: String,
    #[serde(rename = "e", with = "chrono::serde::ts_seconds")]
    pub expires_at: DateTime<Utc>,
    /// A link to look only: its page offers no form, and the portal refuses every change
    /// asked with it (a grant without it, as every link before it, may change things).
    #[serde(rename = "v", default, skip_serializing_if = "std::ops::Not::not")]
    pub view_only: bool,
}

impl PortalGrant {
    /// A grant of `sub` for `lifetime` from `now` (whole seconds), which must be within
    /// [`MIN_LINK_LIFETIME`] and [`MAX_LINK_LIFETIME`]; `field` names it in the error.
    pub fn new(
        sub: &crate::subscription::Subscription,
        now: DateTime<Utc>,
        lifetime: chrono::TimeDelta,
        field: &str,
    ) -> Result<Self, LimitError> {
        if !(MIN_LINK_LIFETIME..=MAX_LINK_LIFETIME).contains(&lifetime) {
            return Err(LimitError::new(
                field,
                format!("{} s", lifetime.num_seconds()),
                format!(
                    "{} to {} days",
                    lifetime_text(MIN_LINK_LIFETIME),
                    MAX_LINK_LIFETIME.num_days()
                ),
            ));
        }
        let expires_at = DateTime::from_timestamp((now + lifetime).timestamp(), 0)
            .ok_or_else(|| LimitError::new(field, format!("{lifetime}"), "a time after now"))?;
        Ok(Self {
            topic: sub.topic.clone(),
            subscription: sub.name.clone(),
            subscription_id: sub.id.clone(),
            expires_at,
            view_only: false,
        })
    }

    /// The token that carries this grant, signed with `key`.
    pub fn token(&self, key: &PortalKey) -> String {
        // A struct of strings and a time always serializes.
        let json = serde_json::to_vec(self).unwrap_or_default();
        let grant = BASE64URL.encode(json);
        let tag = BASE64URL.encode(key.mac(&grant).finalize().into_bytes());
        format!("{VERSION}.{grant}.{tag}")
    }

    /// Whether it names `subscription` of `topic` (what a request's path is checked against).
    pub fn covers(&self, topic: &str, subscription: &str) -> bool {
        self.topic == topic && self.subscription == subscription
    }

    /// Whether it grants `sub` itself: its names and its id (not another subscription made
    /// since under the same names).
    pub fn is_for(&self, sub: &crate::subscription::Subscription) -> bool {
        self.covers(&sub.topic, &sub.name) && self.subscription_id == sub.id
    }
}

/// Why a token was refused. What a refusal page says: never more than that the link cannot be
/// used (or has expired), so a guesser learns nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkRefusal {
    /// Not a token of this form (or longer than [`MAX_TOKEN_CHARS`]).
    #[error("this is not a portal link")]
    Malformed,
    /// Its tag does not check under the current key: altered, made with another key, or made
    /// before the key was rotated.
    #[error("this portal link is not valid (altered, or revoked)")]
    Forged,
    /// Signed, but past its expiry.
    #[error("this portal link expired at {at}")]
    Expired { at: DateTime<Utc> },
}

/// The grant a token carries, if `key` signed it and it has not expired at `now`.
pub fn read_token(
    token: &str,
    key: &PortalKey,
    now: DateTime<Utc>,
) -> Result<PortalGrant, LinkRefusal> {
    if token.len() > MAX_TOKEN_CHARS {
        return Err(LinkRefusal::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(VERSION), Some(grant), Some(tag), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(LinkRefusal::Malformed);
    };
    let tag = BASE64URL.decode(tag).map_err(|_| LinkRefusal::Malformed)?;
    // An HMAC-SHA256 tag is 32 bytes.
    if tag.len() != 32 {
        return Err(LinkRefusal::Malformed);
    }
    // `verify_slice` compares in constant time.
    key.mac(grant)
        .verify_slice(&tag)
        .map_err(|_| LinkRefusal::Forged)?;
    // Signed by the key: only gridrelay wrote this, so it parses; if not, it is still refused.
    let json = BASE64URL
        .decode(grant)
        .map_err(|_| LinkRefusal::Malformed)?;
    let grant: PortalGrant = serde_json::from_slice(&json).map_err(|_| LinkRefusal::Malformed)?;
    if now >= grant.expires_at {
        return Err(LinkRefusal::Expired {
            at: grant.expires_at,
        });
    }
    Ok(grant)
}

/// A link's life as `--expires-in` takes it: a whole number of minutes, hours or days (`30m`,
/// `24h`, `7d`), within [`MIN_LINK_LIFETIME`] and [`MAX_LINK_LIFETIME`].
pub fn parse_link_lifetime(text: &str, field: &str) -> Result<chrono::TimeDelta, LimitError> {
    let refuse = || {
        LimitError::new(
            field,
            format!("{text:?}"),
            format!(
                "a whole number of minutes, hours or days, such as 30m, 24h or 7d, from {} to \
                 {} days",
                lifetime_text(MIN_LINK_LIFETIME),
                MAX_LINK_LIFETIME.num_days()
            ),
        )
    };
    let span = crate::journal::parse_span(text).ok_or_else(refuse)?;
    if !(MIN_LINK_LIFETIME..=MAX_LINK_LIFETIME).contains(&span) {
        return Err(refuse());
    }
    Ok(span)
}

fn lifetime_text(d: chrono::TimeDelta) -> String {
    format!("{} minutes", d.num_minutes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// #36: one test event per subscription per window: the same key within a window, another
    /// in the next one and for another subscription; the refusal says when the next starts.
    #[test]
    fn test_events_are_claimed_once_per_window_and_subscription() {
        use chrono::TimeZone;
        let at = |s| Utc.with_ymd_and_hms(2026, 11, 28, 10, 0, s).unwrap();
        let first = TestEventClaim::at("sub-1", at(0));
        assert_eq!(TestEventClaim::at("sub-1", at(9)).key, first.key);
        assert_eq!(first.next_window, at(10));
        assert_eq!(first.until, at(10) + chrono::Duration::minutes(1));
        assert_ne!(TestEventClaim::at("sub-1", at(10)).key, first.key);
        assert_ne!(TestEventClaim::at("sub-2", at(0)).key, first.key);
        assert!(first.key.starts_with("portal-test#sub-1#"), "{}", first.key);
    }

    /// #36: a dropped event sent again holds its claim for the hold, per subscription and
    /// event, whatever the id's length.
    #[test]
    fn a_send_again_claims_its_event_of_its_subscription_for_the_hold() {
        let (key, until) = send_again_claim("sub-1", &"x".repeat(5000), now());
        assert!(
            key.starts_with("portal-again#sub-1#") && key.len() < 100,
            "{key}"
        );
        assert_eq!(until, now() + SEND_AGAIN_HOLD);
        assert_ne!(
            send_again_claim("sub-2", "e", now()).0,
            send_again_claim("sub-1", "e", now()).0
        );
        assert_ne!(
            send_again_claim("sub-1", "f", now()).0,
            send_again_claim("sub-1", "e", now()).0
        );
    }

    fn key(c: char) -> PortalKey {
        PortalKey::new(&c.to_string().repeat(64)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default()
    }

    fn subscription(topic: &str, name: &str) -> crate::subscription::Subscription {
        crate::subscription::SubscriptionRequest {
            topic: topic.into(),
            name: name.into(),
            endpoint: "https://example.com/hook".into(),
            ..Default::default()
        }
        .validate(Default::default(), now())
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn grant() -> PortalGrant {
        PortalGrant::new(
            &subscription("orders", "billing"),
            now(),
            chrono::TimeDelta::hours(24),
            "f",
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_grant_is_for_its_subscription_not_another_made_under_its_names() {
        let sub = subscription("orders", "billing");
        let g = PortalGrant::new(&sub, now(), chrono::TimeDelta::hours(1), "f")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(g.is_for(&sub));
        let again = subscription("orders", "billing");
        assert_ne!(again.id, sub.id);
        assert!(g.covers("orders", "billing") && !g.is_for(&again));
    }

    #[test]
    fn a_token_reads_back_as_its_grant_until_it_expires() {
        let (k, g) = (key('a'), grant());
        let token = g.token(&k);
        assert_eq!(read_token(&token, &k, now()), Ok(g.clone()));
        let last = g.expires_at - chrono::TimeDelta::seconds(1);
        assert_eq!(read_token(&token, &k, last), Ok(g.clone()));
        assert_eq!(
            read_token(&token, &k, g.expires_at),
            Err(LinkRefusal::Expired { at: g.expires_at })
        );
        assert!(g.covers("orders", "billing"));
        assert!(!g.covers("orders", "shipping") && !g.covers("refunds", "billing"));
    }

    /// #36: a view-only grant reads back view-only; a grant without the field (every link
    /// before it) may change things; the field cannot be dropped from a view-only link's grant
    /// under its tag.
    #[test]
    fn a_view_only_grant_reads_back_and_cannot_be_widened() {
        let k = key('a');
        let view = PortalGrant {
            view_only: true,
            ..grant()
        };
        let token = view.token(&k);
        assert_eq!(read_token(&token, &k, now()), Ok(view.clone()));
        let full = grant();
        let json = String::from_utf8(serde_json::to_vec(&full).unwrap()).unwrap();
        assert!(!json.contains("\"v\""), "{json}");
        assert!(!read_token(&full.token(&k), &k, now()).unwrap().view_only);
        let parts: Vec<&str> = token.split('.').collect();
        let widened = format!(
            "{}.{}.{}",
            parts[0],
            BASE64URL.encode(serde_json::to_vec(&full).unwrap()),
            parts[2]
        );
        assert_eq!(read_token(&widened, &k, now()), Err(LinkRefusal::Forged));
    }

    #[test]
    fn a_token_under_another_key_is_refused_as_after_a_rotation() {
        let token = grant().token(&key('a'));
        assert_eq!(
            read_token(&token, &key('b'), now()),
            Err(LinkRefusal::Forged)
        );
    }

    #[test]
    fn a_grant_altered_in_any_part_is_refused() {
        let k = key('a');
        let token = grant().token(&k);
        let parts: Vec<&str> = token.split('.').collect();
        // Another subscription, or a later expiry, with the original tag.
        let other = PortalGrant {
            subscription: "shipping".into(),
            ..grant()
        };
        let later = PortalGrant {
            expires_at: grant().expires_at + chrono::TimeDelta::days(365),
            ..grant()
        };
        for forged in [other, later] {
            let theirs = forged.token(&k);
            let grant_part = theirs.split('.').nth(1).unwrap_or_default();
            let spliced = format!("v1.{grant_part}.{}", parts[2]);
            assert_eq!(read_token(&spliced, &k, now()), Err(LinkRefusal::Forged));
        }
        // Every single character changed, one at a time.
        for i in 0..token.len() {
            let mut bytes = token.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let changed = String::from_utf8(bytes).unwrap_or_default();
            if changed != token {
                assert!(read_token(&changed, &k, now()).is_err(), "{changed}");
            }
        }
    }

    #[test]
    fn what_is_not_a_token_is_refused_as_malformed() {
        let k = key('a');
        let token = grant().token(&k);
        let too_long = format!("{token}{}", "A".repeat(MAX_TOKEN_CHARS));
        for text in [
            "",
            "v1",
            "v1..",
            "v2.abc.def",
            "v1.abc.def.ghi",
            "v1.abc.!!!",
            too_long.as_str(),
        ] {
            assert_eq!(
                read_token(text, &k, now()),
                Err(LinkRefusal::Malformed),
                "{text}"
            );
        }
        let unversioned = token.replacen("v1.", "v2.", 1);
        assert_eq!(
            read_token(&unversioned, &k, now()),
            Err(LinkRefusal::Malformed)
        );
    }

    #[test]
    fn a_short_key_is_refused() {
        assert_eq!(
            PortalKey::new("short").err(),
            Some(PortalKeyTooShort { chars: 5 })
        );
        assert!(PortalKey::new(&PortalKey::generate_text()).is_ok());
    }

    #[test]
    fn lifetimes_outside_five_minutes_to_thirty_days_are_named_and_refused() {
        assert_eq!(
            parse_link_lifetime("24h", "--expires-in"),
            Ok(chrono::TimeDelta::hours(24))
        );
        assert_eq!(
            parse_link_lifetime("30d", "--expires-in"),
            Ok(chrono::TimeDelta::days(30))
        );
        for text in ["4m", "31d", "0h", "-1h", "24", "1w", "h", "1.5h"] {
            let e = parse_link_lifetime(text, "--expires-in").err();
            let e = e.unwrap_or_else(|| panic!("{text} accepted"));
            assert_eq!(e.field, "--expires-in");
            assert!(e.value.contains(text), "{e}");
            assert!(e.allowed.contains("5 minutes to 30 days"), "{e}");
        }
        let e = PortalGrant::new(
            &subscription("orders", "billing"),
            now(),
            chrono::TimeDelta::days(31),
            "--expires-in",
        );
        assert!(e.is_err());
    }

    #[test]
    fn a_form_token_holds_for_its_pass_under_its_key_only() {
        let (k, token) = (key('a'), grant().token(&key('a')));
        let form = k.form_token(&token);
        assert!(k.form_token_matches(&token, &form));
        assert!(
            !key('b').form_token_matches(&token, &form),
            "another key (a rotation)"
        );
        let other = PortalGrant::new(
            &subscription("orders", "audit"),
            now(),
            chrono::TimeDelta::hours(1),
            "f",
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .token(&k);
        assert!(!k.form_token_matches(&other, &form), "another link's pass");
        // The link's own tag is made in another context: it is no form token.
        let tag = token.rsplit('.').next().unwrap_or_default();
        assert!(!k.form_token_matches(&token, tag));
        for given in ["", "not base64!", &form[1..], &format!("{form}A")] {
            assert!(!k.form_token_matches(&token, given), "{given:?}");
        }
    }

    #[test]
    fn a_test_event_is_an_event_grid_event_every_schema_takes() {
        use crate::schema::{DeliverySchema, InputSchema, to_delivery_form};
        let event = test_event("orders", "billing", "t-1", now());
        let v: serde_json::Value =
            serde_json::from_str(event.get()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v["eventType"], TEST_EVENT_TYPE);
        assert_eq!(v["subject"], "/portal/orders/billing");
        assert_eq!(v["id"], "t-1");
        let cloud = to_delivery_form(
            &event,
            InputSchema::EventGridSchema,
            DeliverySchema::CloudEventSchemaV1_0,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let c: serde_json::Value =
            serde_json::from_str(cloud.get()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (c["type"].as_str(), c["id"].as_str()),
            (Some(TEST_EVENT_TYPE), Some("t-1"))
        );
    }
}
