//! Event Grid's shared access signatures: `aeg-sas-token: r={resource}&e={expiry}&s={signature}`.
//!
//! The signature is `base64(HMAC-SHA256(base64-decode(key), "r={resource}&e={expiry}"))`, over
//! the token's text exactly as sent (still percent-encoded), as Microsoft's SDKs compute it. A
//! token is accepted when its signature matches either topic key, it has not expired, and its
//! resource is this topic's publish path. Comparison is constant-time.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, NaiveDateTime, Utc};
use hmac::{Hmac, Mac};
use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SasError {
    #[error("the aeg-sas-token is malformed: {0}")]
    Malformed(String),
    #[error("the aeg-sas-token expired at {0}")]
    Expired(DateTime<Utc>),
    #[error("the aeg-sas-token is for {0}, not this topic")]
    WrongResource(String),
    #[error("the aeg-sas-token's signature matches neither topic key")]
    BadSignature,
}

fn sign(key: &str, text: &str) -> Option<Vec<u8>> {
    let key = STANDARD.decode(key.trim()).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(text.as_bytes());
    Some(mac.finalize().into_bytes().to_vec())
}

/// Parses the expiry forms Event Grid's SDKs send: RFC 3339, Python's `str(datetime)`
/// (`2026-11-22 05:00:00+00:00`) and .NET's (`11/22/2026 5:00:00 AM`), all UTC.
fn parse_expiry(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.to_utc());
    }
    for format in ["%Y-%m-%d %H:%M:%S%.f%:z", "%Y-%m-%d %H:%M:%S%:z"] {
        if let Ok(t) = DateTime::parse_from_str(text, format) {
            return Some(t.to_utc());
        }
    }
    for format in [
        "%m/%d/%Y %I:%M:%S %p",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
            return Some(t.and_utc());
        }
    }
    None
}

/// Checks a token against the topic's keys; `topic_path` is `/topics/{name}/api/events`.
pub fn verify_sas_token(
    token: &str,
    keys: [&str; 2],
    topic_path: &str,
    now: DateTime<Utc>,
) -> Result<(), SasError> {
    let malformed = |why: &str| SasError::Malformed(why.to_string());
    let (signed, signature) = token
        .trim()
        .rsplit_once("&s=")
        .ok_or_else(|| malformed("no s= signature"))?;
    let (resource, expiry) = signed
        .strip_prefix("r=")
        .and_then(|rest| rest.split_once("&e="))
        .ok_or_else(|| malformed("expected r=…&e=…&s=…"))?;
    let decode = |part: &str| {
        percent_decode_str(part)
            .decode_utf8()
            .map(|s| s.into_owned())
    };
    let resource = decode(resource).map_err(|_| malformed("resource is not UTF-8"))?;
    let expiry_text = decode(expiry).map_err(|_| malformed("expiry is not UTF-8"))?;
    let signature = decode(signature).map_err(|_| malformed("signature is not UTF-8"))?;
    let signature = STANDARD
        .decode(signature.trim())
        .map_err(|_| malformed("signature is not base64"))?;

    let expires = parse_expiry(&expiry_text).ok_or_else(|| malformed("unreadable expiry"))?;
    if now >= expires {
        return Err(SasError::Expired(expires));
    }
    let path = url::Url::parse(&resource)
        .map(|u| u.path().to_string())
        .unwrap_or_else(|_| resource.split('?').next().unwrap_or_default().to_string());
    if !path.trim_end_matches('/').ends_with(topic_path) {
        return Err(SasError::WrongResource(resource));
    }
    let matches = keys
        .iter()
        .filter_map(|k| sign(k, signed))
        .fold(subtle::Choice::from(0), |acc, expected| {
            acc | expected.ct_eq(&signature)
        });
    if bool::from(matches) {
        Ok(())
    } else {
        Err(SasError::BadSignature)
    }
}

/// Makes a token the way Microsoft's SDKs do (for tools and tests).
pub fn generate_sas_token(resource: &str, key: &str, expires: DateTime<Utc>) -> Option<String> {
    let resource = utf8_percent_encode(resource, NON_ALPHANUMERIC).to_string();
    let expiry = utf8_percent_encode(&expires.to_rfc3339(), NON_ALPHANUMERIC).to_string();
    let signed = format!("r={resource}&e={expiry}");
    let signature = STANDARD.encode(sign(key, &signed)?);
    Some(format!(
        "{signed}&s={}",
        utf8_percent_encode(&signature, NON_ALPHANUMERIC)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "c2VjcmV0LWtleS1ieXRlcy1mb3ItZ3JpZHJlbGF5LXRlc3Q=";
    const OTHER: &str = "b3RoZXIta2V5";
    const URL: &str = "https://api.example.com/topics/orders/api/events?api-version=2018-01-01";

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-22T04:00:00Z")
            .unwrap()
            .to_utc()
    }

    #[test]
    fn valid_token_is_accepted_with_either_key() {
        let t = generate_sas_token(URL, KEY, now() + chrono::Duration::hours(1)).unwrap();
        assert_eq!(
            verify_sas_token(&t, [KEY, OTHER], "/topics/orders/api/events", now()),
            Ok(())
        );
        assert_eq!(
            verify_sas_token(&t, [OTHER, KEY], "/topics/orders/api/events", now()),
            Ok(())
        );
    }

    #[test]
    fn expired_wrong_topic_and_wrong_key_are_refused() {
        let t = generate_sas_token(URL, KEY, now() - chrono::Duration::seconds(1)).unwrap();
        assert!(matches!(
            verify_sas_token(&t, [KEY, OTHER], "/topics/orders/api/events", now()),
            Err(SasError::Expired(_))
        ));
        let t = generate_sas_token(URL, KEY, now() + chrono::Duration::hours(1)).unwrap();
        assert!(matches!(
            verify_sas_token(&t, [KEY, OTHER], "/topics/payments/api/events", now()),
            Err(SasError::WrongResource(_))
        ));
        assert_eq!(
            verify_sas_token(&t, [OTHER, OTHER], "/topics/orders/api/events", now()),
            Err(SasError::BadSignature)
        );
        let tampered = t.replace("orders", "orderz");
        assert!(
            verify_sas_token(&tampered, [KEY, OTHER], "/topics/orderz/api/events", now()).is_err()
        );
        for junk in ["", "r=x", "r=x&e=y", "s=abc", "r=x&e=yesterday&s=AAAA"] {
            assert!(
                verify_sas_token(junk, [KEY, OTHER], "/topics/orders/api/events", now()).is_err(),
                "{junk}"
            );
        }
    }

    #[test]
    fn sdk_expiry_formats_parse() {
        let expected = DateTime::parse_from_rfc3339("2026-11-22T05:00:00Z")
            .unwrap()
            .to_utc();
        for text in [
            "2026-11-22T05:00:00Z",
            "2026-11-22 05:00:00+00:00",
            "2026-11-22 05:00:00.000000+00:00",
            "11/22/2026 5:00:00 AM",
        ] {
            assert_eq!(parse_expiry(text), Some(expected), "{text}");
        }
    }
}
