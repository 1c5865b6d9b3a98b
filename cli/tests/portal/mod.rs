//! The subscribers' portal (#36) over HTTP, as a subscriber's browser uses it: a link made with
//! `gridrelay event-subscription portal-link` against a local system on the emulator, served
//! by `gridrelay local`'s front door.

use std::time::Duration;

use gridrelay_e2e::{TestSystem, eventually};
use gridrelay_shared::portal::PortalGrant;
use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, REFERRER_POLICY, SET_COOKIE};

use super::{gridrelay, json, stderr};

/// A subscriber's browser, without its cookie jar: each request says what it carries.
struct Visitor {
    client: reqwest::Client,
    base: String,
}

impl Visitor {
    fn new(sys: &TestSystem) -> Self {
        Self {
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            base: format!("http://{}", sys.system.listen),
        }
    }

    /// GET `path_or_url` with `cookie`: the answer.
    async fn get(&self, path_or_url: &str, cookie: Option<&str>) -> reqwest::Response {
        let url = if path_or_url.starts_with("http") {
            path_or_url.to_string()
        } else {
            format!("{}{path_or_url}", self.base)
        };
        let mut request = self.client.get(url);
        if let Some(cookie) = cookie {
            request = request.header(COOKIE, cookie);
        }
        request.send().await.unwrap()
    }

    /// GET: the status and the page.
    async fn page(&self, path_or_url: &str, cookie: Option<&str>) -> (StatusCode, String) {
        let r = self.get(path_or_url, cookie).await;
        (r.status(), r.text().await.unwrap())
    }

    /// The cookie a link's first load sets (`name=value`).
    async fn cookie_of(&self, link: &str) -> String {
        let first = self.get(link, None).await;
        assert_eq!(first.status(), StatusCode::SEE_OTHER);
        let set = first.headers()[SET_COOKIE].to_str().unwrap();
        set.split(';').next().unwrap().to_string()
    }

    /// POST `form` (pairs, form-encoded) to `path` with `cookie` and `headers`, as a page's
    /// form: the status and the page.
    async fn post(
        &self,
        path: &str,
        cookie: &str,
        headers: &[(&str, &str)],
        form: &[(&str, &str)],
    ) -> (StatusCode, String) {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header(COOKIE, cookie)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(
                url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(form)
                    .finish(),
            );
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let r = request.send().await.unwrap();
        (r.status(), r.text().await.unwrap())
    }
}

/// The values of the `name` inputs of `page` (`name="…" value="…"`, as maud writes them).
fn input_values(page: &str, name: &str) -> Vec<String> {
    page.split("<input ")
        .skip(1)
        .filter(|tag| tag.contains(&format!(r#"name="{name}""#)))
        .filter_map(|tag| {
            let value = tag.split_once(r#"value=""#)?.1;
            Some(value.split_once('"')?.0.replace("&amp;", "&"))
        })
        .collect()
}

/// `event-subscription portal-link` for `name` of topic consoled, with `extra` flags.
pub(crate) fn portal_link(sys: &TestSystem, name: &str, extra: &[&str]) -> std::process::Output {
    portal_link_of(sys, ("consoled", name), extra)
}

/// `event-subscription portal-link` for `name` of `topic`, with `extra` flags.
fn portal_link_of(
    sys: &TestSystem,
    (topic, name): (&str, &str),
    extra: &[&str],
) -> std::process::Output {
    let base = format!("http://{}", sys.system.listen);
    let args = [
        "event-subscription",
        "portal-link",
        "--topic-name",
        topic,
        "--name",
        name,
        "--publish-url",
        &base,
    ];
    gridrelay(&[&args[..], extra].concat(), Some(&sys.names))
}

/// A token for `name` of topic consoled signed with the real key, but expired a minute ago.
pub(crate) async fn expired_token(sys: &TestSystem, name: &str) -> String {
    let key = gridrelay_adapters::aws::portal_key(&sys.sdk, &sys.names.portal_key_secret)
        .await
        .unwrap();
    let sub = sys
        .system
        .store
        .get_subscription("consoled", name)
        .await
        .unwrap()
        .unwrap();
    PortalGrant {
        expires_at: chrono::Utc::now() - chrono::TimeDelta::minutes(1),
        ..PortalGrant::new(
            &sub,
            chrono::Utc::now(),
            chrono::TimeDelta::hours(1),
            "test",
        )
        .unwrap()
    }
    .token(&key)
}

/// The link `portal-link` prints for `name` of topic consoled.
pub(crate) fn link(sys: &TestSystem, name: &str, expires_in: &str) -> String {
    link_of(sys, ("consoled", name), expires_in)
}

/// The link `portal-link` prints for `name` of `topic`.
fn link_of(sys: &TestSystem, (topic, name): (&str, &str), expires_in: &str) -> String {
    let view = json(&portal_link_of(
        sys,
        (topic, name),
        &["--expires-in", expires_in],
    ));
    assert_eq!(view["subscription"], name);
    view["url"].as_str().unwrap().to_string()
}

/// #36: a portal link, as a subscriber opens it. Its token is exchanged for an HttpOnly
/// cookie scoped to the subscription's path, and the browser sent on without it; every answer
/// sends no referrer. The page shows that subscription's attempts (the endpoint's 503) and
/// nothing of another subscription or of the stack (no bucket, no secret). Refused with 403:
/// the link on another subscription's path, its cookie sent there, a grant altered to another
/// subscription under the original signature, an expired link signed with the real key, no
/// link at all, every link once the portal key is rotated, and a link to a subscription deleted
/// and made again under the same names. A view-only link's page offers no form, and its
/// changes are refused (403) even with its own form token. A link's life outside 5 minutes to
/// 30 days is refused when it is made, naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_link_shows_its_own_subscription_only_until_it_expires_or_is_revoked() {
    // The portal key is read at each request, so a rotation shows at once.
    let sys =
        TestSystem::start_with_own_journal_and(0.01, |c| c.config_cache = Duration::ZERO).await;
    let (_topic, _failing, _healthy) = super::console::failing_and_healthy(&sys).await;
    let visitor = Visitor::new(&sys);
    let url = link(&sys, "audit", "1h");
    let path = "/portal/consoled/audit";
    assert!(
        url.starts_with(&format!("{}{path}?token=v1.", visitor.base)),
        "{url}"
    );
    // #38: with a function URL front door the portal has a URL of its own (the stack's
    // PortalUrl): --portal-url puts the links there.
    let elsewhere = json(&portal_link_of(
        &sys,
        ("consoled", "audit"),
        &[
            "--portal-url",
            "https://abc.lambda-url.eu-west-1.on.aws/portal/",
        ],
    ));
    let moved = elsewhere["url"].as_str().unwrap();
    assert!(
        moved
            .starts_with("https://abc.lambda-url.eu-west-1.on.aws/portal/consoled/audit?token=v1."),
        "{moved}"
    );

    // The first load: the token into a cookie for this path only, and on without it.
    let first = visitor.get(&url, None).await;
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    assert_eq!(first.headers()[LOCATION], path);
    assert_eq!(first.headers()[REFERRER_POLICY], "no-referrer");
    let set = first.headers()[SET_COOKIE].to_str().unwrap().to_string();
    for part in [
        "HttpOnly",
        "SameSite=Lax",
        &format!("Path={path}"),
        "Max-Age=",
    ] {
        assert!(set.contains(part), "{set} lacks {part}");
    }
    let cookie = set.split(';').next().unwrap().to_string();

    // The page: its attempts, the 503 among them, and nothing else's.
    let page = eventually(
        Duration::from_secs(20),
        "audit's attempts shown",
        || async {
            let (status, page) = visitor.page(path, Some(&cookie)).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            page.contains(r#"<td class="num">503</td>"#).then_some(page)
        },
    )
    .await;
    assert!(page.contains("Deliveries to audit"), "{page}");
    assert!(page.contains("c-0") || page.contains("c-1"), "{page}");
    for foreign in [
        "ledger",
        sys.names.journal_bucket.as_str(),
        sys.names.dead_letter_bucket.as_str(),
        sys.names.portal_key_secret.as_str(),
        sys.names.subscriptions_table.as_str(),
    ] {
        assert!(!page.contains(foreign), "the page shows {foreign}: {page}");
    }
    let (status, failed_only) = visitor
        .page(&format!("{path}?since=6h&outcome=failed"), Some(&cookie))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(failed_only.contains("503"), "{failed_only}");
    let (status, bad) = visitor
        .page(&format!("{path}?since=7d"), Some(&cookie))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(bad.contains("since") && bad.contains("7d"), "{bad}");

    // Another subscription: not with this link, not with its cookie.
    let token = url.split_once("?token=").unwrap().1.to_string();
    let ledger = "/portal/consoled/ledger";
    let (status, refused) = visitor.page(&format!("{ledger}?token={token}"), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(refused.contains("cannot be used here"), "{refused}");
    assert_eq!(
        visitor.get(ledger, Some(&cookie)).await.status(),
        StatusCode::FORBIDDEN
    );
    // ledger's own grant under audit's signature.
    let ledger_url = link(&sys, "ledger", "1h");
    let ledger_token = ledger_url.split_once("?token=").unwrap().1;
    let ledger_grant = ledger_token.split('.').nth(1).unwrap().to_string();
    let parts: Vec<&str> = token.split('.').collect();
    let spliced = format!("v1.{ledger_grant}.{}", parts[2]);
    assert_ne!(spliced, token);
    assert_eq!(
        visitor
            .get(&format!("{ledger}?token={spliced}"), None)
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    // One character of the signature changed.
    let mut tampered = token.clone().into_bytes();
    let last = tampered.len() - 2;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    assert_eq!(
        visitor
            .get(&format!("{path}?token={tampered}"), None)
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    // Signed with the real key, but expired a minute ago.
    let key = gridrelay_adapters::aws::portal_key(&sys.sdk, &sys.names.portal_key_secret)
        .await
        .unwrap();
    let expired = expired_token(&sys, "audit").await;
    let (status, page) = visitor.page(&format!("{path}?token={expired}"), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    assert!(page.contains("expired"), "{page}");
    // No link at all.
    assert_eq!(
        visitor.get(path, None).await.status(),
        StatusCode::FORBIDDEN
    );

    // A view-only link: the page shows audit's deliveries and offers no form; a change asked
    // with it, even with its own form token, is refused (403).
    let made = json(&portal_link(
        &sys,
        "audit",
        &["--expires-in", "1h", "--view-only"],
    ));
    assert_eq!(made["viewOnly"], true, "{made}");
    let view_cookie = visitor.cookie_of(made["url"].as_str().unwrap()).await;
    let (status, page) = visitor.page(path, Some(&view_cookie)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("to look only") && page.contains("503"),
        "{page}"
    );
    assert!(
        input_values(&page, "form_token").is_empty() && !page.contains(r#"method="post""#),
        "no form: {page}"
    );
    let own_token = key.form_token(view_cookie.split_once('=').unwrap().1);
    for action in ["test-event", "send-again", "signing-secret"] {
        let (status, page) = visitor
            .post(
                &format!("{path}/{action}"),
                &view_cookie,
                &[("sec-fetch-site", "same-origin")],
                &[("form_token", &own_token), ("confirm", "yes")],
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{action}: {page}");
        assert!(page.contains("not change anything"), "{action}: {page}");
    }

    // The link's life is checked where it is made.
    let out = portal_link(&sys, "audit", &["--expires-in", "31d"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--expires-in") && err.contains("31d") && err.contains("5 minutes to 30 days"),
        "{err}"
    );
    let out = portal_link(&sys, "nobody", &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));

    // Rotating the key revokes every link: the cookie held is refused from then on.
    assert_eq!(
        visitor.get(path, Some(&cookie)).await.status(),
        StatusCode::OK
    );
    json(&gridrelay(&["portal-key", "rotate"], Some(&sys.names)));
    let (status, page) = visitor.page(path, Some(&cookie)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    let fresh = link(&sys, "audit", "30m");
    assert_eq!(
        visitor.get(&fresh, None).await.status(),
        StatusCode::SEE_OTHER
    );

    // A link is for the subscription it was made for: ledger deleted and made again under
    // the same names is another subscription, which the old link does not open.
    let ledger_link = link(&sys, "ledger", "1h");
    let ledger_cookie = visitor.get(&ledger_link, None).await.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(
        visitor.get(ledger, Some(&ledger_cookie)).await.status(),
        StatusCode::OK
    );
    let deleted = gridrelay(
        &[
            "event-subscription",
            "delete",
            "--topic-name",
            "consoled",
            "--name",
            "ledger",
        ],
        Some(&sys.names),
    );
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let again = gridrelay_e2e::Subscriber::start(vec![], gridrelay_e2e::Reply::Status(200)).await;
    sys.subscribe(gridrelay_e2e::subscription(
        "consoled", "ledger", &again.url,
    ))
    .await;
    let (status, page) = visitor.page(ledger, Some(&ledger_cookie)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    assert!(page.contains("cannot be used here"), "{page}");
    sys.shutdown().await;
}

/// #36: from its page, a subscriber rotates its signing secret (asked first, shown once, a
/// grace period out of range named), and sends itself a test event, which reaches its
/// endpoint signed with the new secret and no other subscription's endpoint (another at once
/// is refused: one per 10 s); and sends a
/// dead-lettered event again, which reaches the endpoint again. A change is refused (403) without the page's
/// form token, with another page's, from another site (`Sec-Fetch-Site: cross-site`, another
/// `Origin`), and with no pass; a pick naming a record outside the subscription's
/// dead-letter folder sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_its_portal_a_subscriber_rotates_its_signing_secret_sends_a_test_event_and_dead_letters_again()
 {
    let sys = TestSystem::start_with_own_journal(0.01).await;
    let (_topic, failing, healthy) = super::console::failing_and_healthy(&sys).await;
    let visitor = Visitor::new(&sys);
    let cookie = visitor.cookie_of(&link(&sys, "audit", "1h")).await;
    let path = "/portal/consoled/audit";

    // The page lists audit's dead-lettered c-0 and c-1, to pick, and carries its form token.
    let page = eventually(
        Duration::from_secs(20),
        "audit's dead-lettered events listed",
        || async {
            let (status, page) = visitor.page(path, Some(&cookie)).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            (input_values(&page, "pick").len() == 2).then_some(page)
        },
    )
    .await;
    let form_token = input_values(&page, "form_token")[0].clone();
    let picks = input_values(&page, "pick");
    assert!(
        !picks
            .iter()
            .any(|p| p.contains(&sys.names.dead_letter_bucket)),
        "a pick names no bucket: {picks:?}"
    );
    let c0 = picks
        .iter()
        .find(|p| p.starts_with("c%2D0 ") || p.starts_with("c-0 "))
        .unwrap_or_else(|| panic!("c-0 among {picks:?}"))
        .clone();

    // Refused: no form token, a wrong one, another page's, another site, no pass.
    let ledger_cookie = visitor.cookie_of(&link(&sys, "ledger", "1h")).await;
    let (_, ledger_page) = visitor
        .page("/portal/consoled/ledger", Some(&ledger_cookie))
        .await;
    let ledger_token = input_values(&ledger_page, "form_token")[0].clone();
    assert_ne!(ledger_token, form_token);
    let test_event = format!("{path}/test-event");
    let token_field = [("form_token", form_token.as_str())];
    for (why, cookie, headers, form) in [
        ("no form token", cookie.as_str(), vec![], vec![]),
        (
            "a wrong form token",
            &cookie,
            vec![],
            vec![("form_token", "AAAA")],
        ),
        (
            "ledger's form token",
            &cookie,
            vec![],
            vec![("form_token", ledger_token.as_str())],
        ),
        (
            "from another site",
            &cookie,
            vec![("sec-fetch-site", "cross-site")],
            token_field.to_vec(),
        ),
        (
            "another origin",
            &cookie,
            vec![("origin", "https://evil.example")],
            token_field.to_vec(),
        ),
        (
            "ledger's pass",
            &ledger_cookie,
            vec![],
            token_field.to_vec(),
        ),
    ] {
        let (status, page) = visitor.post(&test_event, cookie, &headers, &form).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{why}: {page}");
    }
    assert!(
        !failing
            .received()
            .iter()
            .any(|r| r.body.contains("Gridrelay.Portal.TestEvent")),
        "a refused form sent nothing"
    );

    // The signing secret, rotated from the page: a grace period out of range named; asked
    // first (nothing changes); then a new secret, shown once, signs what audit gets next.
    let browser = [("sec-fetch-site", "same-origin"), ("origin", "null")];
    let rotate = format!("{path}/signing-secret");
    let (status, body) = visitor
        .post(
            &rotate,
            &cookie,
            &browser,
            &[("form_token", &form_token), ("grace_period_hours", "169")],
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("grace_period_hours") && body.contains("169"),
        "{body}"
    );
    let (status, body) = visitor
        .post(
            &rotate,
            &cookie,
            &browser,
            &[("form_token", &form_token), ("grace_period_hours", "0")],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("Yes, rotate the signing secret"), "{body}");
    let (_, page) = visitor.page(path, Some(&cookie)).await;
    assert!(
        page.contains("Deliveries are not signed"),
        "asking changed nothing: {page}"
    );
    let confirmed = [
        ("form_token", form_token.as_str()),
        ("grace_period_hours", "0"),
        ("confirm", "yes"),
    ];
    let (status, body) = visitor
        .post(&rotate, &ledger_cookie, &browser, &confirmed)
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "not with ledger's pass: {body}"
    );
    let (status, body) = visitor.post(&rotate, &cookie, &browser, &confirmed).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let shown = super::shown(&body, "new-secret");
    let secret = gridrelay_shared::signing::SigningSecret::parse(&shown).unwrap();
    let (_, page) = visitor.page(path, Some(&cookie)).await;
    assert!(page.contains("Deliveries are signed"), "{page}");
    assert!(!page.contains(&shown), "the secret is shown once");

    // A test event, from the page as a browser sends its form: signed with the new secret.
    let (status, sent) = visitor
        .post(&test_event, &cookie, &browser, &token_field)
        .await;
    assert_eq!(status, StatusCode::OK, "{sent}");
    assert!(sent.contains("Test event sent"), "{sent}");
    // One per subscription per 10 s window: of two more asked for right after, one at most
    // opens the next window; the other is refused (429), saying when to ask again.
    let mut refused = 0;
    for _ in 0..2 {
        let (status, again) = visitor
            .post(&test_event, &cookie, &browser, &token_field)
            .await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert!(again.contains("one is sent per 10 seconds"), "{again}");
            refused += 1;
        } else {
            assert_eq!(status, StatusCode::OK, "{again}");
        }
    }
    assert!(
        refused >= 1,
        "a test event at once after another was refused"
    );
    let tested = eventually(
        Duration::from_secs(20),
        "the test event at audit's endpoint",
        || async {
            failing
                .received()
                .into_iter()
                .find(|r| r.body.contains("Gridrelay.Portal.TestEvent"))
        },
    )
    .await;
    assert!(
        tested.body.contains("/portal/consoled/audit"),
        "{}",
        tested.body
    );
    let (id, at) = (
        tested.header("webhook-id").unwrap(),
        tested.header("webhook-timestamp").unwrap(),
    );
    let expected = secret.sign(id, at.parse().unwrap(), tested.body.as_bytes());
    assert_eq!(tested.header("webhook-signature"), Some(expected.as_str()));
    assert!(
        !healthy
            .received()
            .iter()
            .any(|r| r.body.contains("Gridrelay.Portal.TestEvent")),
        "ledger gets no test event of audit's"
    );

    // c-0 sent again: it reaches the endpoint a second time.
    let c0_requests = || {
        failing
            .received()
            .iter()
            .filter(|r| r.ids().contains(&"c-0".to_string()))
            .count()
    };
    assert_eq!(c0_requests(), 1);
    let send_again = format!("{path}/send-again");
    let (status, done) = visitor
        .post(
            &send_again,
            &cookie,
            &browser,
            &[("form_token", &form_token), ("pick", &c0)],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(
        done.contains("on their way again") && done.contains("c-0"),
        "{done}"
    );
    eventually(
        Duration::from_secs(20),
        "c-0 at the endpoint again",
        || async { (c0_requests() == 2).then_some(()) },
    )
    .await;

    // A pick outside audit's folder names no record of audit's: nothing is sent.
    let (id, _) = c0.split_once(' ').unwrap();
    let outside = format!("{id} ../ledger/2026/11/28/08/x.json");
    let (status, done) = visitor
        .post(
            &send_again,
            &cookie,
            &browser,
            &[("form_token", &form_token), ("pick", &outside)],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("nothing was sent"), "{done}");
    sys.shutdown().await;
}

/// Topic kept (keeping a day) with subscription hooked (no dead-letter destination), whose
/// endpoint gives `answers` in turn (then 200), and k-0 published to it: its first answer, 400,
/// is not retried, so k-0 is dropped (L1). The endpoint, and the topic's key.
async fn a_dropped_event(
    sys: &TestSystem,
    answers: Vec<gridrelay_e2e::Reply>,
) -> (gridrelay_e2e::Subscriber, String) {
    use gridrelay_e2e::{Reply, Subscriber, events, subscription};
    assert_eq!(answers.first(), Some(&Reply::Status(400)));
    let created = json(&gridrelay(
        &["topic", "create", "--name", "kept", "--retention-days", "1"],
        Some(&sys.names),
    ));
    let key = created["key1"].as_str().unwrap().to_string();
    let endpoint = Subscriber::start(answers, Reply::Status(200)).await;
    sys.subscribe(subscription("kept", "hooked", &endpoint.url))
        .await;
    let body = events("k", 1).to_string().into_bytes();
    let (status, answer) = sys.publish_raw("kept", Some(&key), body).await;
    assert_eq!(status, 200, "{answer}");
    endpoint.wait_for_requests(1, Duration::from_secs(20)).await;
    (endpoint, key)
}

/// #36, L1, in Chromium: a dropped event on its subscriber's page, shown through a view-only
/// link with no form, then through a full link ticked and sent again from the topic's
/// archive, reaches the endpoint; axe passes on each page, and each is kept as a screenshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_dropped_event_is_sent_again_and_a_view_only_page_has_no_form_l1() {
    use gridrelay_e2e::Reply;
    let sys = TestSystem::start_with_own_journal(0.01).await;
    let (endpoint, _) = a_dropped_event(&sys, vec![Reply::Status(400)]).await;
    let browser = super::console::browser::Browser::start().await;
    let page = format!("http://{}/portal/kept/hooked", sys.system.listen);
    let pick = r#"input[name="pick"][value="k%2D0 archive"]"#;

    // Through a view-only link: k-0 listed, with nothing to tick or press.
    let view = json(&portal_link_of(
        &sys,
        ("kept", "hooked"),
        &["--expires-in", "1h", "--view-only"],
    ));
    browser.open(view["url"].as_str().unwrap()).await;
    let text = eventually(Duration::from_secs(30), "k-0 listed as dropped", || async {
        browser.open(&page).await;
        let text = browser.text().await;
        text.contains("k-0").then_some(text)
    })
    .await;
    assert!(text.contains("to look only"), "{text}");
    let forms = browser
        .client
        .find_all(fantoccini::Locator::Css(r#"form[method="post"]"#))
        .await
        .unwrap();
    assert!(forms.is_empty(), "a view-only page has no form");
    browser.check_page("portal-view-only").await;

    // Through a link that may change things (its cookie replaces the other's): ticked and
    // sent again.
    browser.open(&link_of(&sys, ("kept", "hooked"), "1h")).await;
    assert!(
        browser
            .client
            .find(fantoccini::Locator::Css(pick))
            .await
            .is_ok(),
        "{}",
        browser.text().await
    );
    browser.check_page("portal-dropped").await;
    browser.click(pick).await;
    browser.click(r#"form[action$="/send-again"] button"#).await;
    let sent = browser.text().await;
    assert!(
        sent.contains("From the topic's archive") && sent.contains("k-0"),
        "{sent}"
    );
    browser.check_page("portal-sent-again").await;
    endpoint.wait_for_requests(2, Duration::from_secs(20)).await;
    browser.end().await;
    sys.shutdown().await;
}

/// #36, L1: an event given up with no dead-letter destination is dropped, kept nowhere but in
/// its topic's archive; its subscriber sees it on its page (with the endpoint's 400) and sends
/// it again from there (twice at once: sent once), and it is delivered, journaled as sent again
/// from the archive. The same pick again sends nothing (no longer dropped), nor does a pick of
/// an event the subscription did not drop (a sibling subscription did); once the topic keeps
/// no archive, the page says so and offers no box, and a send again is refused (409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_event_is_sent_again_from_its_topics_archive_l1() {
    use gridrelay_e2e::{Reply, events};
    let sys = TestSystem::start_with_own_journal(0.01).await;
    let names = sys.names.clone();
    let answers = vec![Reply::Status(400), Reply::Status(200), Reply::Status(400)];
    let (endpoint, key) = a_dropped_event(&sys, answers).await;
    let publish = |body: serde_json::Value| {
        let (sys, key) = (&sys, key.clone());
        async move {
            let (status, answer) = sys
                .publish_raw("kept", Some(&key), body.to_string().into_bytes())
                .await;
            assert_eq!(status, 200, "{answer}");
        }
    };

    let visitor = Visitor::new(&sys);
    let cookie = visitor
        .cookie_of(&link_of(&sys, ("kept", "hooked"), "1h"))
        .await;
    let path = "/portal/kept/hooked";
    let k0 = "k%2D0 archive";
    let page = eventually(Duration::from_secs(30), "k-0 listed as dropped", || async {
        let (status, page) = visitor.page(path, Some(&cookie)).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        input_values(&page, "pick")
            .contains(&k0.to_string())
            .then_some(page)
    })
    .await;
    let dropped = &page[page.find(r#"id="dropped""#).unwrap()..];
    assert!(
        dropped.contains("<code>k-0</code>") && dropped.contains(">400<"),
        "{dropped}"
    );
    let form_token = input_values(&page, "form_token")[0].clone();
    let browser = [("sec-fetch-site", "same-origin")];
    let send_again = format!("{path}/send-again");
    let form = |pick: &'static str| {
        [
            ("form_token", form_token.clone()),
            ("since", "1h".to_string()),
            ("pick", pick.to_string()),
        ]
    };
    let post = |pick: &'static str| {
        let (visitor, cookie, send_again) = (&visitor, &cookie, &send_again);
        let form = form(pick);
        async move {
            let form: Vec<(&str, &str)> = form.iter().map(|(n, v)| (*n, v.as_str())).collect();
            visitor.post(send_again, cookie, &browser, &form).await
        }
    };

    // Sent again from the archive, twice at once (two tabs): sent once, delivered this time.
    let ((status, first), (again, second)) = tokio::join!(post(k0), post(k0));
    assert_eq!((status, again), (StatusCode::OK, StatusCode::OK));
    let from_archive = |page: &str| {
        page.contains("From the topic&#39;s archive") || page.contains("From the topic's archive")
    };
    assert!(
        from_archive(&first) != from_archive(&second),
        "one of the two sent it: {first}\n{second}"
    );
    let done = if from_archive(&first) { first } else { second };
    assert!(done.contains("<code>k-0</code>"), "{done}");
    let k0_requests = || {
        endpoint
            .received()
            .iter()
            .filter(|r| r.ids().contains(&"k-0".to_string()))
            .count()
    };
    eventually(
        Duration::from_secs(20),
        "k-0 at the endpoint again",
        || async { (k0_requests() == 2).then_some(()) },
    )
    .await;
    let life = eventually(
        Duration::from_secs(30),
        "k-0's delivery journaled",
        || async {
            let life = sys.event_life("kept", "k-0").await;
            let steps = serde_json::to_string(&life).unwrap();
            steps.contains("the topic's archive").then_some(steps)
        },
    )
    .await;
    assert!(life.contains(r#""state":"delivered""#), "{life}");
    eventually(Duration::from_secs(30), "k-0 no longer listed", || async {
        let (_, page) = visitor.page(path, Some(&cookie)).await;
        (!input_values(&page, "pick").contains(&k0.to_string())).then_some(())
    })
    .await;

    // m-0 is dropped (the third answer, 400); n-0 is delivered. A sibling subscription of the
    // topic drops both.
    let sibling = gridrelay_e2e::Subscriber::start(vec![], Reply::Status(400)).await;
    sys.subscribe(gridrelay_e2e::subscription("kept", "sibling", &sibling.url))
        .await;
    publish(events("m", 1)).await;
    endpoint.wait_for_requests(3, Duration::from_secs(20)).await;
    publish(events("n", 1)).await;
    endpoint.wait_for_requests(4, Duration::from_secs(20)).await;
    sibling.wait_for_requests(2, Duration::from_secs(20)).await;
    // Not sent: k-0 again (no longer dropped), nor n-0, which hooked did not drop (its sibling
    // did).
    for pick in [k0, "n%2D0 archive"] {
        let (status, done) = post(pick).await;
        assert_eq!(status, StatusCode::OK, "{pick}: {done}");
        assert!(
            done.contains("nothing was sent") && done.contains("Not sent"),
            "{pick}: {done}"
        );
    }
    assert_eq!(k0_requests(), 2, "k-0 was not sent a third time");
    assert_eq!(endpoint.received().len(), 4, "nothing was sent");
    assert_eq!(sibling.received().len(), 2, "nor to the sibling");

    // The topic keeps no archive: m-0 is listed, with nothing to pick; a send again is
    // refused.
    let updated = gridrelay(
        &["topic", "update", "--name", "kept", "--retention-days", "0"],
        Some(&names),
    );
    assert!(updated.status.success(), "{}", stderr(&updated));
    let page = eventually(Duration::from_secs(30), "no archive said", || async {
        let (_, page) = visitor.page(path, Some(&cookie)).await;
        page.contains("keeps no copy of its events").then_some(page)
    })
    .await;
    assert!(page.contains("<code>m-0</code>"), "{page}");
    assert!(input_values(&page, "pick").is_empty(), "{page}");
    let (status, done) = post("m%2D0 archive").await;
    assert_eq!(status, StatusCode::CONFLICT, "{done}");
    assert!(done.contains("keeps no copy"), "{done}");
    sys.shutdown().await;
}
