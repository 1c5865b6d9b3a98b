//! The local stand-in for a Lambda function URL in front of `ingest` (#38): what AWS does
//! between a publisher's request and the function, and back, when the stack's
//! `PublishFrontDoor` is `FunctionUrl`.
//!
//! The request becomes the function URL's event (payload format 2.0, as JSON), which the
//! function reads with `lambda_http`'s own adapter, the one `lambda_http::run` wraps the
//! handler in on AWS; its answer, serialized as the runtime sends it, is read back as the
//! function URL's response (status, headers, cookies, a text or base64 body). So the publish
//! path through the function URL is the handler's, event and response included, not a
//! shortcut past them. What the URL itself answers is here too: 413 past Lambda's 6 MB
//! invocation payload, 502 for a function that fails or times out.

use std::convert::Infallible;

use aws_lambda_events::lambda_function_urls::{
    LambdaFunctionUrlRequest, LambdaFunctionUrlRequestContext,
    LambdaFunctionUrlRequestContextHttpDescription, LambdaFunctionUrlResponse,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use http::header::{COOKIE, HOST, SET_COOKIE, USER_AGENT};
use http::{HeaderMap, HeaderValue, StatusCode};
use lambda_http::lambda_runtime::{Context, LambdaEvent};
use lambda_http::request::LambdaRequest;
use lambda_http::{Adapter, Service as _, service_fn};

/// Lambda's payload limit for a synchronous invocation (`BUFFERED` function URLs): the event
/// as JSON, body included (base64 for a binary body), at most 6 MB.
pub const MAX_EVENT_BYTES: usize = 6 * 1024 * 1024;

/// What the function URL answers for a function that failed or ran out of time.
pub fn function_error() -> http::Response<Vec<u8>> {
    json_answer(
        StatusCode::BAD_GATEWAY,
        r#"{"Message":"Internal Server Error"}"#,
    )
}

/// What the function URL answers for a request whose event passes [`MAX_EVENT_BYTES`].
pub fn payload_too_large() -> http::Response<Vec<u8>> {
    let message = format!(
        r#"{{"Message":"Request must be smaller than {MAX_EVENT_BYTES} bytes for the InvokeFunction operation"}}"#
    );
    json_answer(StatusCode::PAYLOAD_TOO_LARGE, &message)
}

fn json_answer(status: StatusCode, body: &str) -> http::Response<Vec<u8>> {
    let mut response = http::Response::new(body.as_bytes().to_vec());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    response
}

/// The function URL's event for a request: headers in lower case (a repeated one joined with
/// commas, cookies apart), the raw path and query, the body as text or in base64 by its type
/// (`arrives_as_text`), and a request context naming the URL's host.
pub fn event_for(parts: &http::request::Parts, body: &[u8], now: DateTime<Utc>) -> String {
    let mut headers = HeaderMap::new();
    for name in parts.headers.keys() {
        if name == COOKIE {
            continue;
        }
        let joined: Vec<&str> = parts
            .headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if let Ok(value) = HeaderValue::from_str(&joined.join(",")) {
            headers.insert(name.clone(), value);
        }
    }
    let cookies: Vec<String> = parts
        .headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';').map(|c| c.trim().to_string()))
        .filter(|c| !c.is_empty())
        .collect();
    let host = parts
        .headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost")
        .to_string();
    let query = parts.uri.query().unwrap_or_default().to_string();
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let (text, base64) = match std::str::from_utf8(body) {
        Ok(text) if arrives_as_text(content_type) => (text.to_string(), false),
        _ => (BASE64.encode(body), true),
    };

    let mut http = LambdaFunctionUrlRequestContextHttpDescription::default();
    http.method = Some(parts.method.to_string());
    http.path = Some(parts.uri.path().to_string());
    http.protocol = Some("HTTP/1.1".into());
    http.source_ip = Some("127.0.0.1".into());
    http.user_agent = parts
        .headers
        .get(USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut context = LambdaFunctionUrlRequestContext::default();
    context.account_id = Some("anonymous".into());
    context.request_id = Some(uuid::Uuid::new_v4().to_string());
    context.apiid = Some("local".into());
    context.domain_prefix = host.split('.').next().map(str::to_string);
    context.domain_name = Some(host);
    context.time = Some(now.format("%d/%b/%Y:%H:%M:%S %z").to_string());
    context.time_epoch = now.timestamp_millis();
    context.http = http;

    let mut event = LambdaFunctionUrlRequest::default();
    event.version = Some("2.0".into());
    event.raw_path = Some(parts.uri.path().to_string());
    event.query_string_parameters = url_pairs(&query);
    event.raw_query_string = Some(query);
    event.cookies = (!cookies.is_empty()).then_some(cookies);
    event.headers = headers;
    event.request_context = context;
    event.body = (!body.is_empty()).then_some(text);
    event.is_base64_encoded = base64;
    // Plain strings, a header map and numbers always serialize.
    let mut json = serde_json::to_value(&event).unwrap_or_default();
    // Function URLs' events name their route `$default`, as an HTTP API's default route.
    if let Some(map) = json.as_object_mut() {
        map.insert("routeKey".into(), "$default".into());
    }
    json.to_string()
}

/// Whether a function URL hands a body of `content_type` to the function as text: `text/*`,
/// JSON, XML and JavaScript; any other type, or none, arrives in base64 (CloudEvents' own
/// `application/cloudevents-batch+json` and form posts included).
fn arrives_as_text(content_type: Option<&str>) -> bool {
    let Some(essence) = content_type
        .and_then(|t| t.split(';').next())
        .map(|t| t.trim().to_ascii_lowercase())
    else {
        return false;
    };
    essence.starts_with("text/")
        || matches!(
            essence.as_str(),
            "application/json" | "application/xml" | "application/javascript"
        )
}

/// A query string's pairs, decoded, as the event carries them: a repeated name's values
/// joined with commas.
fn url_pairs(query: &str) -> std::collections::HashMap<String, String> {
    let mut pairs = std::collections::HashMap::<String, String>::new();
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()).into_owned() {
        pairs
            .entry(name)
            .and_modify(|joined| {
                joined.push(',');
                joined.push_str(&value);
            })
            .or_insert(value);
    }
    pairs
}

/// Why an invocation through the function URL did not give a response.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("the function URL's event is not one lambda_http reads: {0}")]
    Event(serde_json::Error),
    #[error("the function's answer is not a function URL response: {0}")]
    Answer(serde_json::Error),
    #[error("the function URL response's body is not base64: {0}")]
    Body(base64::DecodeError),
}

/// Runs `handler` on the function URL's `event` as the Lambda runtime does, and returns the
/// HTTP response the function URL makes of its answer.
pub async fn invoke<F, Fut>(event: &str, handler: F) -> Result<http::Response<Vec<u8>>, InvokeError>
where
    F: Fn(lambda_http::Request) -> Fut + Send,
    Fut: std::future::Future<Output = http::Response<lambda_http::Body>> + Send,
{
    let payload: LambdaRequest = serde_json::from_str(event).map_err(InvokeError::Event)?;
    let mut adapter = Adapter::from(service_fn(|request: lambda_http::Request| {
        let answer = handler(request);
        async move { Ok::<_, Infallible>(answer.await) }
    }));
    let Ok(answer) = adapter
        .call(LambdaEvent::new(payload, Context::default()))
        .await;
    let answer = serde_json::to_value(&answer).map_err(InvokeError::Answer)?;
    let answer: LambdaFunctionUrlResponse =
        serde_json::from_value(answer).map_err(InvokeError::Answer)?;
    response_of(answer)
}

/// The HTTP response a function URL makes of the function's answer.
fn response_of(answer: LambdaFunctionUrlResponse) -> Result<http::Response<Vec<u8>>, InvokeError> {
    let body = match (answer.body, answer.is_base64_encoded) {
        (None, _) => Vec::new(),
        (Some(text), false) => text.into_bytes(),
        (Some(encoded), true) => BASE64.decode(encoded).map_err(InvokeError::Body)?,
    };
    let mut response = http::Response::new(body);
    *response.status_mut() = u16::try_from(answer.status_code)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    *response.headers_mut() = answer.headers;
    for cookie in answer.cookies {
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(SET_COOKIE, value);
        }
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut request = http::Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).expect("request").into_parts().0
    }

    /// #38: what the handler sees through the function URL's event is the request: method,
    /// path, query, headers (a repeated one joined), cookies, and the body, text or binary.
    #[tokio::test]
    async fn the_handler_sees_the_request_through_the_function_urls_event() {
        let now = Utc::now();
        let request = parts(
            "POST",
            "/topics/orders/api/events?api-version=2018-01-01&x=a%20b",
            &[
                ("host", "abc123.lambda-url.eu-west-1.on.aws"),
                ("aeg-sas-key", "k"),
                ("x-many", "1"),
                ("x-many", "2"),
                ("cookie", "a=1; b=2"),
            ],
        );
        let binary = [0xff_u8, 0, 1];
        for body in [&b"[{\"id\":\"1\"}]"[..], &binary[..]] {
            let event = event_for(&request, body, now);
            let seen = std::sync::Mutex::new(None);
            let answer = invoke(&event, |r: lambda_http::Request| {
                let header = |n: &str| {
                    r.headers()
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                };
                *seen.lock().expect("lock") = Some((
                    r.method().to_string(),
                    r.uri().path().to_string(),
                    r.uri().query().map(str::to_string),
                    header("aeg-sas-key"),
                    header("x-many"),
                    header("cookie"),
                    r.body().to_vec(),
                ));
                async {
                    let mut response = http::Response::new(lambda_http::Body::from("ok"));
                    *response.status_mut() = StatusCode::CREATED;
                    response
                }
            })
            .await
            .expect("invoked");
            assert_eq!(answer.status(), StatusCode::CREATED);
            assert_eq!(answer.body(), b"ok");
            let seen = seen.lock().expect("lock").take().expect("handler ran");
            assert_eq!(seen.0, "POST");
            assert_eq!(seen.1, "/topics/orders/api/events");
            let query = seen.2.unwrap_or_default();
            assert!(query.contains("api-version=2018-01-01"), "{query}");
            assert_eq!(seen.3.as_deref(), Some("k"));
            assert_eq!(seen.4.as_deref(), Some("1,2"));
            assert_eq!(seen.5.as_deref(), Some("a=1; b=2"));
            assert_eq!(seen.6, body, "the body arrives as it was sent");
        }
    }

    /// #38: the function's cookies and a binary body come back as the function URL sends
    /// them: `Set-Cookie` headers and the bytes.
    #[tokio::test]
    async fn the_answer_comes_back_with_its_cookies_and_bytes() {
        let event = event_for(&parts("GET", "/portal/t/s", &[]), b"", Utc::now());
        let answer = invoke(&event, |_| async {
            http::Response::builder()
                .status(303)
                .header(SET_COOKIE, "p=1; HttpOnly")
                .header(SET_COOKIE, "q=2")
                .header("content-type", "application/octet-stream")
                .body(lambda_http::Body::from(vec![0xff_u8, 0]))
                .expect("response")
        })
        .await
        .expect("invoked");
        assert_eq!(answer.status(), StatusCode::SEE_OTHER);
        let cookies: Vec<_> = answer.headers().get_all(SET_COOKIE).iter().collect();
        assert_eq!(cookies, ["p=1; HttpOnly", "q=2"]);
        assert_eq!(answer.body(), &[0xff_u8, 0]);
    }

    /// #38: as on AWS, JSON and text arrive as text; anything else (CloudEvents' batch type,
    /// a form post, no type) in base64, which the handler sees decoded all the same; a
    /// repeated query name's values are joined.
    #[tokio::test]
    async fn bodies_arrive_as_text_or_base64_by_their_type() {
        let body = br#"[{"id":"1"}]"#;
        for (content_type, base64) in [
            (Some("application/json; charset=utf-8"), false),
            (Some("text/plain"), false),
            (Some("application/cloudevents-batch+json"), true),
            (Some("application/x-www-form-urlencoded"), true),
            (None, true),
        ] {
            let headers: Vec<(&str, &str)> = content_type
                .map(|t| ("content-type", t))
                .into_iter()
                .collect();
            let request = parts("POST", "/topics/t/api/events?a=1&a=2", &headers);
            let event = event_for(&request, body, Utc::now());
            let json: serde_json::Value = serde_json::from_str(&event).expect("event");
            assert_eq!(json["isBase64Encoded"], base64, "{content_type:?}");
            assert_eq!(json["queryStringParameters"]["a"], "1,2");
            let seen = std::sync::Mutex::new(Vec::new());
            invoke(&event, |r: lambda_http::Request| {
                *seen.lock().expect("lock") = r.body().to_vec();
                async { http::Response::new(lambda_http::Body::Empty) }
            })
            .await
            .expect("invoked");
            assert_eq!(
                seen.lock().expect("lock").as_slice(),
                body,
                "{content_type:?}"
            );
        }
    }

    #[test]
    fn the_urls_own_answers_say_what_happened() {
        let too_large = payload_too_large();
        assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let text = String::from_utf8_lossy(too_large.body()).to_string();
        assert!(text.contains("6291456"), "{text}");
        assert_eq!(function_error().status(), StatusCode::BAD_GATEWAY);
    }
}
