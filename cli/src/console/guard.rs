//! Who may use the console (#36). It acts with the operator's AWS credentials from a page on
//! 127.0.0.1, so any web page the operator's browser opens could try it:
//!
//! - DNS rebinding (a page whose host name is made to resolve to 127.0.0.1): every request's
//!   `Host` must be the console's own address, else 403;
//! - any other local program or page without the run's token: the token printed in the URL
//!   `gridrelay console` opens is exchanged on first load for an HttpOnly, SameSite=Strict
//!   cookie named after the console's port (browsers keep cookies by host, not port: two
//!   consoles must not overwrite each other's); a request without it is refused (401);
//! - cross-site requests that would change something (CSRF): a POST must also carry the token
//!   in its form, and come from the console's own origin where the browser says where it comes
//!   from (`Origin`, `Sec-Fetch-Site`).
//!
//! The token is compared in constant time.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use subtle::ConstantTimeEq;

/// The console's run: its token and the addresses it answers as.
#[derive(Clone)]
pub(super) struct Guard {
    token: Arc<str>,
    /// `Host` values requests may carry: its address (`127.0.0.1:<port>` or `[::1]:<port>`)
    /// and `localhost:<port>`; the first is the one its URL names.
    hosts: Arc<[String]>,
    /// The cookie the token is kept in: `gridrelay_console_<port>`.
    cookie: Arc<str>,
}

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Its `Host` is not the console's (403).
    Host,
    /// It carries no token, or a wrong one (401).
    Token,
    /// A change asked for from another site (403).
    CrossSite,
}

impl Guard {
    /// The guard of a console listening at `addr` (127.0.0.1 or ::1).
    pub(super) fn new(token: &str, addr: SocketAddr) -> Self {
        let port = addr.port();
        Self {
            token: token.into(),
            hosts: vec![addr.to_string(), format!("localhost:{port}")].into(),
            cookie: format!("gridrelay_console_{port}").into(),
        }
    }

    /// The URL that opens the console, with the run's token.
    pub(super) fn url(&self) -> String {
        format!("http://{}/?token={}", self.hosts[0], self.token)
    }

    /// A new run's token: 32 random bytes, as hex.
    pub(super) fn new_token() -> String {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The run's token, for the forms of the pages.
    pub(super) fn token(&self) -> &str {
        &self.token
    }

    /// Whether `given` is the run's token.
    pub(super) fn token_matches(&self, given: &str) -> bool {
        given.as_bytes().ct_eq(self.token.as_bytes()).into()
    }

    fn host_allowed(&self, headers: &HeaderMap) -> bool {
        headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|h| self.hosts.iter().any(|allowed| allowed == h))
    }

    /// Whether the request's cookie holds the token.
    fn cookie_matches(&self, headers: &HeaderMap) -> bool {
        gridrelay_portal::cookies(headers, &self.cookie)
            .iter()
            .any(|value| self.token_matches(value))
    }

    /// Whether a request that changes something comes from the console's own pages, as far
    /// as the browser says: `Sec-Fetch-Site` (where sent) is same-origin, and `Origin` (where
    /// sent) is the console's (its pages' referrer policy, same-origin, has the browser send
    /// their forms' real origin).
    fn same_origin(&self, headers: &HeaderMap) -> bool {
        let site_ok = headers
            .get("sec-fetch-site")
            .is_none_or(|s| s.as_bytes() == b"same-origin" || s.as_bytes() == b"none");
        let origin_ok = headers.get(header::ORIGIN).is_none_or(|o| {
            o.to_str().is_ok_and(|o| {
                self.hosts
                    .iter()
                    .any(|h| o.strip_prefix("http://") == Some(h.as_str()))
            })
        });
        origin_ok && site_ok
    }

    /// What becomes of a request: refused, let through, or (the token in its URL, right) the
    /// token set as the cookie and the browser sent on to the URL without it.
    pub(super) fn check(
        &self,
        method: &Method,
        headers: &HeaderMap,
        path: &str,
        query: Option<&str>,
    ) -> Result<Option<Response>, Refusal> {
        if !self.host_allowed(headers) {
            return Err(Refusal::Host);
        }
        if let Some(query) = query {
            let mut token = None;
            let mut rest = url::form_urlencoded::Serializer::new(String::new());
            for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
                if name == "token" {
                    token = Some(value.into_owned());
                } else {
                    rest.append_pair(&name, &value);
                }
            }
            if let Some(token) = token {
                if *method != Method::GET || !self.token_matches(&token) {
                    return Err(Refusal::Token);
                }
                let rest = rest.finish();
                // Only ever to a path of the console (never `//elsewhere`).
                let path = format!("/{}", path.trim_start_matches('/'));
                let to = if rest.is_empty() {
                    path
                } else {
                    format!("{path}?{rest}")
                };
                let mut response = Redirect::to(&to).into_response();
                let cookie = format!(
                    "{}={}; HttpOnly; SameSite=Strict; Path=/",
                    self.cookie, self.token
                );
                if let Ok(value) = HeaderValue::from_str(&cookie) {
                    response.headers_mut().insert(header::SET_COOKIE, value);
                }
                return Ok(Some(response));
            }
        }
        if !self.cookie_matches(headers) {
            return Err(Refusal::Token);
        }
        if !matches!(*method, Method::GET | Method::HEAD) && !self.same_origin(headers) {
            return Err(Refusal::CrossSite);
        }
        Ok(None)
    }
}

/// The middleware every request goes through: [`Guard::check`], and the headers every answer
/// carries (no referrer, no framing, no caching, nothing fetched from elsewhere).
pub(super) async fn guard(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let uri = request.uri().clone();
    let mut response =
        match guard.check(request.method(), request.headers(), uri.path(), uri.query()) {
            Ok(Some(redirect)) => redirect,
            Ok(None) => next.run(request).await,
            Err(refusal) => refused(&refusal),
        };
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            // Scripts: the console's own file only (the live page's), which reads from the
            // console only; no inline script runs.
            "default-src 'none'; style-src 'self'; img-src 'self' data:; script-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        // Never the token's URL to another site (it is gone from the URL after the first
        // load anyway); the console's own forms carry their origin.
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn refused(refusal: &Refusal) -> Response {
    let (status, why) = match refusal {
        Refusal::Host => (
            StatusCode::FORBIDDEN,
            "This console answers only at 127.0.0.1 or localhost, on the port it printed.",
        ),
        Refusal::Token => (
            StatusCode::UNAUTHORIZED,
            "Open the console with the URL `gridrelay console` printed: it holds this run's \
             token.",
        ),
        Refusal::CrossSite => (
            StatusCode::FORBIDDEN,
            "A change may be asked for only from the console's own pages.",
        ),
    };
    (status, super::pages::refused(status, why)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_str(value).unwrap());
        }
        h
    }

    fn guard() -> Guard {
        Guard::new("abc123", "127.0.0.1:7072".parse().unwrap())
    }

    const COOKIE_OK: &str = "other=1; gridrelay_console_7072=abc123";

    /// #36: a request whose Host is not the console's is refused, whatever it carries (DNS
    /// rebinding).
    #[test]
    fn a_foreign_host_is_refused() {
        let g = guard();
        for host in ["evil.example:7072", "127.0.0.1:80", "127.0.0.1", ""] {
            let h = headers(&[("host", host), ("cookie", COOKIE_OK)]);
            assert_eq!(
                g.check(&Method::GET, &h, "/", None).err(),
                Some(Refusal::Host),
                "{host}"
            );
        }
        for host in ["127.0.0.1:7072", "localhost:7072"] {
            let h = headers(&[("host", host), ("cookie", COOKIE_OK)]);
            assert!(matches!(g.check(&Method::GET, &h, "/", None), Ok(None)));
        }
    }

    /// #36: no cookie, or a wrong token anywhere, is refused; the right token in the URL sets
    /// the HttpOnly cookie and sends the browser on without it.
    #[test]
    fn the_token_is_exchanged_for_a_cookie_and_required_after() {
        let g = guard();
        let host = ("host", "127.0.0.1:7072");
        assert_eq!(
            g.check(&Method::GET, &headers(&[host]), "/", None).err(),
            Some(Refusal::Token)
        );
        let wrong = headers(&[host, ("cookie", "gridrelay_console_7072=abc124")]);
        assert_eq!(
            g.check(&Method::GET, &wrong, "/", None).err(),
            Some(Refusal::Token)
        );
        // Another console's cookie (another port) is not this one's.
        let wrong = headers(&[host, ("cookie", "gridrelay_console_7073=abc123")]);
        assert_eq!(
            g.check(&Method::GET, &wrong, "/", None).err(),
            Some(Refusal::Token)
        );
        assert_eq!(
            g.check(&Method::GET, &headers(&[host]), "/", Some("token=nope"))
                .err(),
            Some(Refusal::Token)
        );
        let response = g
            .check(
                &Method::GET,
                &headers(&[host]),
                "/events",
                Some("id=e1&token=abc123"),
            )
            .unwrap()
            .unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        assert_eq!(response.headers()[header::LOCATION], "/events?id=e1");
        let cookie = response.headers()[header::SET_COOKIE].to_str().unwrap();
        assert!(
            cookie.starts_with("gridrelay_console_7072=abc123;"),
            "{cookie}"
        );
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        // Never sent on to another host, whatever the path asked.
        let response = g
            .check(
                &Method::GET,
                &headers(&[host]),
                "//evil.example",
                Some("token=abc123"),
            )
            .unwrap()
            .unwrap();
        assert_eq!(response.headers()[header::LOCATION], "/evil.example");
        // The token in a change's URL is refused.
        assert_eq!(
            g.check(&Method::POST, &headers(&[host]), "/", Some("token=abc123"))
                .err(),
            Some(Refusal::Token)
        );
        assert_eq!(g.url(), "http://127.0.0.1:7072/?token=abc123");
        let v6 = Guard::new("abc123", "[::1]:7072".parse().unwrap());
        assert_eq!(v6.url(), "http://[::1]:7072/?token=abc123");
        let h = headers(&[("host", "[::1]:7072"), ("cookie", COOKIE_OK)]);
        assert!(matches!(v6.check(&Method::GET, &h, "/", None), Ok(None)));
    }

    /// #36: a change asked for from another origin is refused even with the cookie (CSRF).
    #[test]
    fn a_change_from_another_site_is_refused() {
        let g = guard();
        let base = [("host", "127.0.0.1:7072"), ("cookie", COOKIE_OK)];
        let post = |extra: &[(&'static str, &str)]| {
            let mut pairs = base.to_vec();
            pairs.extend_from_slice(extra);
            g.check(&Method::POST, &headers(&pairs), "/x", None)
        };
        assert!(matches!(post(&[]), Ok(None)));
        assert!(matches!(
            post(&[
                ("origin", "http://127.0.0.1:7072"),
                ("sec-fetch-site", "same-origin")
            ]),
            Ok(None)
        ));
        assert_eq!(
            post(&[("origin", "https://evil.example")]).err(),
            Some(Refusal::CrossSite)
        );
        assert_eq!(
            post(&[("sec-fetch-site", "cross-site")]).err(),
            Some(Refusal::CrossSite)
        );
        // Another page on this machine (another port) is another site; so is `null`.
        assert_eq!(
            post(&[
                ("origin", "http://127.0.0.1:3000"),
                ("sec-fetch-site", "same-site")
            ])
            .err(),
            Some(Refusal::CrossSite)
        );
        assert_eq!(
            post(&[("origin", "null"), ("sec-fetch-site", "same-origin")]).err(),
            Some(Refusal::CrossSite)
        );
        // Reads are let through (the cookie is SameSite=Strict: a cross-site page's request
        // carries none).
        let h = headers(&[base[0], base[1], ("sec-fetch-site", "cross-site")]);
        assert!(matches!(g.check(&Method::GET, &h, "/", None), Ok(None)));
    }
}
