//! A1: webhook endpoints protected by OAuth 2.0, with the client credentials grant (RFC 6749
//! §4.4). A subscription may name a token endpoint, a client id, a client secret (kept in the
//! secret store, never on the record) and optionally a scope and an audience; `deliver` then
//! asks the token endpoint for an access token and sends it as `Authorization: Bearer`.
//!
//! The rules here are pure: what may be configured, the token request, what a token response
//! means, and how long a token is kept. Fetching and caching are `gridrelay_ports::oauth`'s.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::classify::{AttemptResult, DeliveryOutcome};
use crate::health::{EndpointHealth, LastFailure};
use crate::limits::LimitError;

/// Longest client id, client secret, scope or audience accepted, in bytes.
pub const MAX_CREDENTIAL_FIELD_BYTES: usize = 1024;

/// How long a token is kept when its response does not say (`expires_in` is only
/// RECOMMENDED by RFC 6749 §5.1): short, so a token the server meant to be short-lived is not
/// used long after, and a 401 fetches a new one anyway.
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(300);

/// The longest a token is kept, whatever its response says: a day.
pub const LONGEST_TOKEN_LIFETIME: Duration = Duration::from_secs(86_400);

/// How long before its end a token is fetched again: a tenth of its lifetime, at most a
/// minute, so that a token is never sent in its last seconds (clocks differ, and a request
/// takes time to arrive).
pub const MAX_REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// How a subscription's deliveries prove themselves to its endpoint, besides its headers and
/// signature (A1): shown by `show` as `deliveryAuth`, without the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum DeliveryAuth {
    /// A bearer token from an OAuth 2.0 token endpoint, for the client credentials grant.
    #[serde(rename = "oauth2")]
    OAuth2(ClientCredentials),
}

impl DeliveryAuth {
    /// The client secret's id in the secret store.
    pub fn secret_id(&self) -> &str {
        match self {
            Self::OAuth2(c) => &c.client_secret_id,
        }
    }

    /// The client credentials, for the one kind there is.
    pub fn client_credentials(&self) -> &ClientCredentials {
        match self {
            Self::OAuth2(c) => c,
        }
    }
}

/// A1: OAuth 2.0 client credentials as given to create or update a subscription, with the
/// secret's value (stored by registration, which keeps only its id). `Debug` hides the secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct OAuthRequest {
    pub token_url: String,
    pub client_id: String,
    pub client_secret: String,
    pub scope: Option<String>,
    pub audience: Option<String>,
}

impl std::fmt::Debug for OAuthRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthRequest")
            .field(
                "token_url",
                &crate::outbound::redact_endpoint(&self.token_url),
            )
            .field("client_id", &self.client_id)
            .field("client_secret", &"***")
            .field("scope", &self.scope)
            .field("audience", &self.audience)
            .finish()
    }
}

impl OAuthRequest {
    /// Checks every field; the credentials to store, their secret's id left for
    /// registration to set once the secret is stored.
    pub fn validate(&self) -> Result<ClientCredentials, LimitError> {
        let token_url = validate_token_url(&self.token_url)?;
        validate_client_id(&self.client_id)?;
        validate_client_secret(&self.client_secret)?;
        if let Some(scope) = &self.scope {
            validate_scope(scope)?;
        }
        if let Some(audience) = &self.audience {
            validate_audience(audience)?;
        }
        Ok(ClientCredentials {
            token_url,
            client_id: self.client_id.clone(),
            client_secret_id: String::new(),
            scope: self.scope.clone(),
            audience: self.audience.clone(),
        })
    }
}

/// A1: the token endpoint, an absolute `http://` or `https://` URL with a host and without
/// `user:password@` (the client's own credentials go in `Authorization`). Whether it may be
/// reached is the outbound rules' question, as for endpoints. Errors never show its query.
pub fn validate_token_url(text: &str) -> Result<String, LimitError> {
    let invalid = || {
        LimitError::new(
            "--token-url",
            format!("{:?}", crate::outbound::redact_endpoint(text)),
            "an absolute http:// or https:// URL with a host and no user:password@",
        )
    };
    let url = url::Url::parse(text).map_err(|_| invalid())?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host_str().is_none()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return Err(invalid());
    }
    Ok(url.to_string())
}

/// The secret store name of a subscription's client secret, unique to the write (`now`), so
/// that an update's new secret never replaces the one the record still names.
pub fn oauth_secret_name(
    prefix: &str,
    topic: &str,
    subscription: &str,
    now: DateTime<Utc>,
) -> String {
    crate::signing::secret_name_at(prefix, topic, subscription, "oauth2", now)
}

/// A subscription's OAuth 2.0 client credentials (A1), as stored on its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCredentials {
    /// Where tokens are asked for: held to the same outbound rules as endpoints.
    pub token_url: String,
    pub client_id: String,
    /// The client secret's id in the secret store.
    pub client_secret_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

impl ClientCredentials {
    /// What identifies the tokens these credentials get: a token fetched for other
    /// credentials (another secret, scope or audience) is never sent for these.
    pub fn cache_key(&self, subscription_id: &str) -> String {
        let parts = [
            subscription_id,
            &self.token_url,
            &self.client_id,
            &self.client_secret_id,
            self.scope.as_deref().unwrap_or(""),
            self.audience.as_deref().unwrap_or(""),
        ];
        let mut joined = String::new();
        for p in parts {
            // Lengths first, so that no two different sets of parts join the same.
            joined.push_str(&format!("{}:{p};", p.len()));
        }
        crate::validation::hex(&<sha2::Sha256 as sha2::Digest>::digest(joined.as_bytes()))
    }
}

/// A1: a client id, secret or audience: 1 to 1,024 visible ASCII characters or spaces
/// (RFC 6749 Appendix A's VSCHAR).
fn check_vschars(field: &str, value: &str, shown: &str) -> Result<(), LimitError> {
    let allowed = format!(
        "1 to {MAX_CREDENTIAL_FIELD_BYTES} visible ASCII characters or spaces (RFC 6749 VSCHAR)"
    );
    if value.is_empty()
        || value.len() > MAX_CREDENTIAL_FIELD_BYTES
        || !value.bytes().all(|b| (0x20..=0x7e).contains(&b))
    {
        return Err(LimitError::new(field, shown, allowed));
    }
    Ok(())
}

/// A1: the client id (shown in errors: it is not a secret).
pub fn validate_client_id(value: &str) -> Result<(), LimitError> {
    check_vschars("--client-id", value, &format!("{value:?}"))
}

/// A1: the client secret, as read from its file or standard input, without the line end a
/// file usually has. Never shown in errors: its length is.
pub fn validate_client_secret(value: &str) -> Result<String, LimitError> {
    let trimmed = value.strip_suffix('\n').unwrap_or(value);
    let trimmed = trimmed.strip_suffix('\r').unwrap_or(trimmed);
    check_vschars(
        "--client-secret-file",
        trimmed,
        &format!("a secret of {} bytes", trimmed.len()),
    )?;
    Ok(trimmed.to_string())
}

/// A1: the audience some token endpoints ask for (Auth0's `audience`), sent as given.
pub fn validate_audience(value: &str) -> Result<(), LimitError> {
    check_vschars("--audience", value, &format!("{value:?}"))
}

/// A1: a scope, space-separated tokens of RFC 6749 §3.3's characters (visible ASCII but `"`
/// and `\`), one space between them.
pub fn validate_scope(value: &str) -> Result<(), LimitError> {
    let token_ok = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
    };
    if value.len() > MAX_CREDENTIAL_FIELD_BYTES || !value.split(' ').all(token_ok) {
        return Err(LimitError::new(
            "--scope",
            format!("{value:?}"),
            format!(
                "1 to {MAX_CREDENTIAL_FIELD_BYTES} bytes of space-separated scope tokens \
                 (visible ASCII but '\"' and '\\', RFC 6749 section 3.3)"
            ),
        ));
    }
    Ok(())
}

/// The token request's `Authorization` header (`client_secret_basic`, the method RFC 6749
/// §2.3.1 requires every server to support): the id and secret form-encoded, then Base64.
pub fn basic_authorization(client_id: &str, client_secret: &str) -> String {
    use base64::Engine as _;
    let pair = format!("{}:{}", form_encode(client_id), form_encode(client_secret));
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// The token request's body (`application/x-www-form-urlencoded`).
pub fn token_request_body(credentials: &ClientCredentials) -> String {
    let mut body = String::from("grant_type=client_credentials");
    for (name, value) in [
        ("scope", &credentials.scope),
        ("audience", &credentials.audience),
    ] {
        if let Some(value) = value {
            body.push('&');
            body.push_str(name);
            body.push('=');
            body.push_str(&form_encode(value));
        }
    }
    body
}

/// `application/x-www-form-urlencoded` for one value (RFC 6749 Appendix B).
fn form_encode(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// An access token and when to stop using it. Its value never shows in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken {
    value: String,
    /// When it is fetched again (before it expires: [`MAX_REFRESH_MARGIN`]).
    pub refresh_at: DateTime<Utc>,
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessToken")
            .field("value", &"***")
            .field("refresh_at", &self.refresh_at)
            .finish()
    }
}

impl AccessToken {
    /// The `Authorization` header to send with a delivery.
    pub fn authorization(&self) -> String {
        format!("Bearer {}", self.value)
    }

    /// Whether it may still be sent at `now`.
    pub fn is_fresh(&self, now: DateTime<Utc>) -> bool {
        now < self.refresh_at
    }
}

/// Why no token came from the token endpoint. The text names the status and the OAuth error
/// code where there is one, never the body's other content (it may echo credentials).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenFailure {
    #[error("the token endpoint answered {status}{}", error_code(.error))]
    Refused { status: u16, error: Option<String> },
    #[error("the token endpoint's answer is not a bearer token: {0}")]
    Malformed(String),
    #[error("the token endpoint could not be reached: {0}")]
    Unreachable(String),
    #[error("the client secret could not be read: {0}")]
    SecretUnavailable(String),
}

impl TokenFailure {
    /// What the attempt that got no token is: a client secret that could not be read is the
    /// subscription's (not sent, as for a secret header); anything else is the token
    /// endpoint's ([`AttemptResult::TokenUnavailable`]).
    pub fn attempt_result(&self) -> AttemptResult {
        match self {
            Self::SecretUnavailable(_) => AttemptResult::NotSent(self.to_string()),
            _ => AttemptResult::TokenUnavailable(self.to_string()),
        }
    }

    /// The token endpoint's HTTP status, when it answered with one that is not a token.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A1: the key of a subscription's token record in the delivery state table, which `show`
/// reads as `deliveryStatus.token`. Not a URL, so it is never an endpoint's or a host's.
pub fn token_status_key(subscription_id: &str) -> String {
    format!("oauth-token:{subscription_id}")
}

/// A1: a subscription's token record after a request that got no token: one more failure
/// since the last token, and this one as the last. A token record never delays anything (its
/// D1 fields stay empty): token failures are retried on the ladder, not held.
pub fn after_token_failure(
    record: &EndpointHealth,
    failure: &TokenFailure,
    at: DateTime<Utc>,
) -> EndpointHealth {
    EndpointHealth {
        consecutive_failures: record.consecutive_failures.saturating_add(1),
        last_failure: Some(LastFailure {
            at,
            outcome: DeliveryOutcome::of(&failure.attempt_result()),
            status: failure.status(),
        }),
        ..EndpointHealth::default()
    }
}

fn error_code(error: &Option<String>) -> String {
    error
        .as_ref()
        .map(|e| format!(" ({e})"))
        .unwrap_or_default()
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: Option<String>,
    token_type: Option<String>,
    expires_in: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ErrorResponse {
    error: Option<String>,
}

/// A1: what a token endpoint's answer means (RFC 6749 §5.1 and §5.2). A 2xx with a bearer
/// `access_token` is a token, kept until a margin before `expires_in` (or
/// [`DEFAULT_TOKEN_LIFETIME`] when absent; at most [`LONGEST_TOKEN_LIFETIME`]); anything else
/// is a failure that says why.
pub fn parse_token_response(
    status: u16,
    body: &[u8],
    received_at: DateTime<Utc>,
) -> Result<AccessToken, TokenFailure> {
    if !(200..300).contains(&status) {
        let error = serde_json::from_slice::<ErrorResponse>(body)
            .ok()
            .and_then(|e| e.error)
            .filter(|e| is_error_code(e));
        return Err(TokenFailure::Refused { status, error });
    }
    let response: TokenResponse = serde_json::from_slice(body)
        .map_err(|_| TokenFailure::Malformed("not a JSON object".into()))?;
    let value = response
        .access_token
        .filter(|t| !t.is_empty() && t.bytes().all(|b| (0x21..=0x7e).contains(&b)))
        .ok_or_else(|| TokenFailure::Malformed("no access_token".into()))?;
    match response.token_type.as_deref() {
        Some(t) if t.eq_ignore_ascii_case("bearer") => {}
        Some(_) => {
            return Err(TokenFailure::Malformed(
                "token_type is not Bearer".to_string(),
            ));
        }
        None => return Err(TokenFailure::Malformed("no token_type".into())),
    }
    let lifetime = match response.expires_in {
        None | Some(serde_json::Value::Null) => DEFAULT_TOKEN_LIFETIME,
        Some(v) => {
            // A number, or a number in a string (some servers send "3600").
            let seconds = v
                .as_u64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                .ok_or_else(|| {
                    TokenFailure::Malformed("expires_in is not a whole number".into())
                })?;
            Duration::from_secs(seconds).min(LONGEST_TOKEN_LIFETIME)
        }
    };
    Ok(AccessToken {
        value,
        refresh_at: received_at + refresh_after(lifetime),
    })
}

/// How long after it arrives a token of `lifetime` is fetched again: its lifetime less a
/// tenth of it, at most [`MAX_REFRESH_MARGIN`]. A token of no lifetime is used once.
pub fn refresh_after(lifetime: Duration) -> chrono::Duration {
    let margin = (lifetime / 10).min(MAX_REFRESH_MARGIN);
    chrono::Duration::from_std(lifetime - margin).unwrap_or(chrono::Duration::zero())
}

/// An OAuth error code (RFC 6749 §5.2: `1*( %x20-21 / %x23-5B / %x5D-7E )`), at most 64
/// bytes, so it can be shown; anything else is not.
fn is_error_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= 64
        && code.bytes().all(|b| {
            (0x20..=0x21).contains(&b) || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn credentials() -> ClientCredentials {
        ClientCredentials {
            token_url: "https://login.example.com/oauth/token".into(),
            client_id: "gridrelay".into(),
            client_secret_id: "secret-1".into(),
            scope: None,
            audience: None,
        }
    }

    /// A1: a bearer token is kept until a tenth of its lifetime (at most a minute) before
    /// it expires; without expires_in, it lives five minutes; never more than a day.
    #[test]
    fn a_token_is_kept_until_shortly_before_it_expires_a1() {
        let body = br#"{"access_token":"abc.def","token_type":"Bearer","expires_in":3600}"#;
        let t = parse_token_response(200, body, at(0)).unwrap();
        assert_eq!(t.refresh_at, at(3540));
        assert!(t.is_fresh(at(3539)) && !t.is_fresh(at(3540)));
        assert_eq!(t.authorization(), "Bearer abc.def");

        let short = br#"{"access_token":"x","token_type":"bearer","expires_in":"100"}"#;
        assert_eq!(
            parse_token_response(201, short, at(0)).unwrap().refresh_at,
            at(90)
        );
        let silent = br#"{"access_token":"x","token_type":"Bearer"}"#;
        assert_eq!(
            parse_token_response(200, silent, at(0)).unwrap().refresh_at,
            at(270)
        );
        let long = br#"{"access_token":"x","token_type":"Bearer","expires_in":31536000}"#;
        assert_eq!(
            parse_token_response(200, long, at(0)).unwrap().refresh_at,
            at(86_400 - 60)
        );
        let none = br#"{"access_token":"x","token_type":"Bearer","expires_in":0}"#;
        assert!(
            !parse_token_response(200, none, at(0))
                .unwrap()
                .is_fresh(at(0))
        );
    }

    /// A1: a refusal names the status and the OAuth error code, nothing else of the body;
    /// an answer without a bearer token is malformed and says what is missing, never the
    /// token.
    #[test]
    fn a_token_endpoint_that_fails_says_why_without_its_body_a1() {
        let refused = parse_token_response(
            401,
            br#"{"error":"invalid_client","error_description":"secret s3cr3t is wrong"}"#,
            at(0),
        )
        .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the token endpoint answered 401 (invalid_client)"
        );
        let html = parse_token_response(503, b"<html>down</html>", at(0)).unwrap_err();
        assert_eq!(html.to_string(), "the token endpoint answered 503");
        for (body, why) in [
            ("nope", "not a JSON object"),
            (r#"{"token_type":"Bearer"}"#, "no access_token"),
            (r#"{"access_token":"x"}"#, "no token_type"),
            (
                r#"{"access_token":"x","token_type":"mac"}"#,
                "token_type is not Bearer",
            ),
            (
                r#"{"access_token":"x","token_type":"Bearer","expires_in":-5}"#,
                "expires_in is not a whole number",
            ),
            (
                r#"{"access_token":"a b","token_type":"Bearer"}"#,
                "no access_token",
            ),
        ] {
            let e = parse_token_response(200, body.as_bytes(), at(0)).unwrap_err();
            assert_eq!(e, TokenFailure::Malformed(why.into()), "{body}");
        }
        let t = parse_token_response(
            200,
            br#"{"access_token":"hidden","token_type":"Bearer"}"#,
            at(0),
        )
        .unwrap();
        assert!(!format!("{t:?}").contains("hidden"));
    }

    /// A1: the request carries the grant, the scope and audience form-encoded, and the
    /// client's id and secret in Basic authorization, each form-encoded first.
    #[test]
    fn the_token_request_is_client_credentials_with_basic_authorization_a1() {
        assert_eq!(
            token_request_body(&credentials()),
            "grant_type=client_credentials"
        );
        let scoped = ClientCredentials {
            scope: Some("events:write read".into()),
            audience: Some("https://api.example.com/".into()),
            ..credentials()
        };
        assert_eq!(
            token_request_body(&scoped),
            "grant_type=client_credentials&scope=events%3Awrite+read&audience=https%3A%2F%2Fapi.example.com%2F"
        );
        // RFC 6749 §2.3.1: "a:b" and "c d" are sent as a%3Ab:c+d.
        use base64::Engine as _;
        let header = basic_authorization("a:b", "c d");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(header.strip_prefix("Basic ").unwrap())
            .unwrap();
        assert_eq!(decoded, b"a%3Ab:c+d");
    }

    /// A1: what may be configured, with errors that name the flag, the value (never the
    /// secret's) and the range.
    #[test]
    fn credentials_are_checked_where_they_enter_a1() {
        assert!(validate_client_id("gridrelay-prod").is_ok());
        let e = validate_client_id("").unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.value.as_str()),
            ("--client-id", "\"\"")
        );
        assert!(e.allowed.contains("1 to 1024"));
        assert!(validate_client_id("tab\there").is_err());
        assert!(validate_client_id(&"x".repeat(1025)).is_err());

        assert_eq!(validate_client_secret("s3cr3t\n").unwrap(), "s3cr3t");
        assert_eq!(validate_client_secret("s3cr3t\r\n").unwrap(), "s3cr3t");
        let e = validate_client_secret("bad\u{7f}secret").unwrap_err();
        assert_eq!(e.value, "a secret of 10 bytes");
        assert!(validate_client_secret("\n").is_err());

        assert!(validate_scope("events:write read").is_ok());
        for bad in ["", "two  spaces", " lead", "quote\"", "back\\slash", "é"] {
            let e = validate_scope(bad).unwrap_err();
            assert_eq!(e.field, "--scope", "{bad}");
        }
        assert!(validate_audience("https://api.example.com/").is_ok());
        assert!(validate_audience("").is_err());
    }

    /// A1: a request's token URL must be a URL without credentials in it; `Debug` never
    /// shows the secret; stored credentials wait for their secret's id.
    #[test]
    fn a_request_is_checked_and_hides_its_secret_a1() {
        let request = OAuthRequest {
            token_url: "https://login.example.com/token".into(),
            client_id: "client".into(),
            client_secret: "hunter2\n".into(),
            scope: Some("events".into()),
            audience: None,
        };
        let c = request.validate().unwrap();
        assert_eq!(c.token_url, "https://login.example.com/token");
        assert_eq!(c.client_secret_id, "");
        assert!(!format!("{request:?}").contains("hunter2"));
        for bad in [
            "login.example.com/token",
            "ftp://login.example.com/token",
            "https://user:pw@login.example.com/token",
        ] {
            let e = OAuthRequest {
                token_url: bad.into(),
                ..request.clone()
            }
            .validate()
            .unwrap_err();
            assert_eq!(e.field, "--token-url", "{bad}");
            assert!(!e.value.contains("pw"), "{}", e.value);
        }
        let json = serde_json::to_value(DeliveryAuth::OAuth2(c)).unwrap();
        assert_eq!(json["type"], "oauth2");
        assert_eq!(json["clientId"], "client");
        assert!(json.get("audience").is_none());
    }

    /// A1: tokens are kept per subscription and credentials: a change of any part is
    /// another key.
    #[test]
    fn a_token_is_kept_for_the_credentials_it_was_fetched_with_a1() {
        let base = credentials().cache_key("sub-1");
        assert_eq!(base, credentials().cache_key("sub-1"));
        assert_ne!(base, credentials().cache_key("sub-2"));
        for other in [
            ClientCredentials {
                client_secret_id: "secret-2".into(),
                ..credentials()
            },
            ClientCredentials {
                scope: Some("a".into()),
                ..credentials()
            },
            ClientCredentials {
                audience: Some("a".into()),
                ..credentials()
            },
            ClientCredentials {
                token_url: "https://other.example.com/token".into(),
                ..credentials()
            },
        ] {
            assert_ne!(base, other.cache_key("sub-1"));
        }
    }

    /// A1: each request that got no token adds a failure to the subscription's token record
    /// and becomes its last (the token endpoint's status where it answered; a secret that
    /// could not be read is `GenericError`, as the attempt is); a token then makes it healthy
    /// and keeps the last failure for `show`. It never holds deliveries back.
    #[test]
    fn a_token_record_counts_failures_until_a_token_comes_a1() {
        let at = DateTime::parse_from_rfc3339("2026-11-29T06:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let down = TokenFailure::Refused {
            status: 503,
            error: None,
        };
        let once = after_token_failure(&EndpointHealth::default(), &down, at);
        let twice = after_token_failure(
            &once,
            &TokenFailure::SecretUnavailable("gone".into()),
            at + chrono::Duration::seconds(1),
        );
        assert_eq!(once.consecutive_failures, 1);
        assert_eq!(
            once.last_failure,
            Some(LastFailure {
                at,
                outcome: DeliveryOutcome::TokenUnavailable,
                status: Some(503),
            })
        );
        assert_eq!(twice.consecutive_failures, 2);
        let last = twice.last_failure.unwrap();
        assert_eq!(
            (last.outcome, last.status),
            (DeliveryOutcome::GenericError, None)
        );
        assert!(twice.delayed_until.is_none() && twice.probe_until.is_none());
        let healed = twice.after_success();
        assert!(healed.is_healthy());
        assert_eq!(healed.last_failure, Some(last));
        assert_ne!(token_status_key("sub-1"), token_status_key("sub-2"));
    }
}
