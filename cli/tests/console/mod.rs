//! `gridrelay console` (#36) over HTTP, as a browser uses it: the binary run against a local
//! system on the emulator, its pages fetched with the cookie its URL's token is exchanged for.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gridrelay_e2e::{Reply, Subscriber, TestSystem, events, eventually, subscription};

pub(crate) mod browser;
use gridrelay_shared::signing::SigningSecret;
use gridrelay_shared::subscription::{SubscriptionRequest, Topic};
use reqwest::StatusCode;
use reqwest::header::{COOKIE, HOST, LOCATION, ORIGIN, SET_COOKIE};

/// A console started with `gridrelay console --listen 127.0.0.1:0`, stopped when dropped.
pub struct Console {
    child: Child,
    /// The URL it printed, with its token.
    pub url: String,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub token: String,
    client: reqwest::Client,
}

impl Console {
    /// `gridrelay console` over `sys`, its portal links pointing at `sys`'s front door.
    pub fn start(sys: &TestSystem) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gridrelay"))
            .args(["console", "--listen", "127.0.0.1:0"])
            .envs(sys.names.cli_env())
            .env(
                "GRIDRELAY_PUBLISH_URL",
                format!("http://{}", sys.system.listen),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("gridrelay console runs");
        let url = gridrelay_e2e::printed_console_url(&mut child).expect("it prints its URL");
        let (base, token) = url.split_once("/?token=").expect("a URL with a token");
        Self {
            base: base.to_string(),
            token: token.to_string(),
            url: url.clone(),
            child,
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        }
    }

    /// The cookie its URL's token is exchanged for.
    pub async fn sign_in(&self) -> String {
        let r = self.client.get(&self.url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert_eq!(r.headers()[LOCATION], "/");
        let cookie = r.headers()[SET_COOKIE].to_str().unwrap().to_string();
        assert!(cookie.contains("HttpOnly"), "{cookie}");
        assert!(cookie.contains("SameSite=Strict"), "{cookie}");
        cookie.split(';').next().unwrap().to_string()
    }

    /// GET `path` with `cookie`: status and body.
    pub async fn get(&self, path: &str, cookie: Option<&str>) -> (StatusCode, String) {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(cookie) = cookie {
            request = request.header(COOKIE, cookie);
        }
        let r = request.send().await.unwrap();
        (r.status(), r.text().await.unwrap())
    }

    /// POST a form to `path` with `cookie` and the extra headers.
    pub async fn post(
        &self,
        path: &str,
        cookie: Option<&str>,
        headers: &[(reqwest::header::HeaderName, &str)],
        form: &[(&str, &str)],
    ) -> (StatusCode, String) {
        let body = form
            .iter()
            .map(|(k, v)| format!("{k}={}", url_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(cookie) = cookie {
            request = request.header(COOKIE, cookie);
        }
        for (name, value) in headers {
            request = request.header(name, *value);
        }
        let r = request.send().await.unwrap();
        (r.status(), r.text().await.unwrap())
    }
}

fn url_encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// #36, L2, L3, D1: the console, as an operator uses it. Without the token printed in its URL
/// nothing is shown (401), and a request naming another host is refused (403: DNS rebinding);
/// the token is exchanged for an HttpOnly cookie. The overview shows a subscription whose
/// endpoint answers 503 as Failing with that status, beside a healthy one, with their counts.
/// The failing subscription's page lists its attempt and its dead-lettered event; a redrive of
/// it without the form's token, or from another origin, is refused and moves nothing; with
/// them it asks first (nothing moves), and once confirmed the event reaches the endpoint,
/// which now answers 200. The event is found by id, its life showing the dead letter and the
/// redrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_failing_subscriptions_and_redrives_the_picked_dead_letters_l2_l3() {
    // Changes take effect at once (the signing secret's rotation is checked on a delivery).
    let sys =
        TestSystem::start_with_own_journal_and(0.01, |c| c.config_cache = Duration::ZERO).await;
    let (topic, failing, healthy) = failing_and_healthy(&sys).await;

    let console = Console::start(&sys);
    // Nothing without the token; nothing for another host, whatever it carries.
    assert_eq!(console.get("/", None).await.0, StatusCode::UNAUTHORIZED);
    let cookie = console.sign_in().await;
    let rebound = console
        .client
        .get(format!("{}/", console.base))
        .header(HOST, "attacker.example:80")
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::FORBIDDEN);

    // The overview: audit Failing with its 503, ledger Healthy; the journal's counts.
    let page = eventually(
        Duration::from_secs(15),
        "both dead letters journaled",
        || async {
            let (status, page) = console.get("/", Some(&cookie)).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            (row(&page, "audit").contains(COUNTS_0_2_2) && row(&page, "ledger").contains("Healthy"))
                .then_some(page)
        },
    )
    .await;
    let audit = row(&page, "audit");
    assert!(audit.contains("Failing"), "{audit}");
    assert!(audit.contains("<strong>503</strong> Busy"), "{audit}");
    assert!(audit.contains("0 delivered and 2 failed"), "{audit}");
    let ledger = row(&page, "ledger");
    assert!(ledger.contains("2 delivered and 0 failed"), "{ledger}");
    assert!(!ledger.contains("Failing"), "{ledger}");

    // The subscription's page: its attempt (503) and its dead letters.
    let path = "/subscriptions/consoled/audit";
    let (status, page) = console.get(path, Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("<td>503</td>"), "{page}");
    // Each dead letter is picked by its event's id and its object.
    let c0 = pick_of(&page, "c-0");
    assert!(c0.starts_with("c%2D0 s3://"), "{c0}");
    pick_of(&page, "c-1");
    let (_, succeeded_only) = console
        .get(&format!("{path}?outcome=succeeded&since=1h"), Some(&cookie))
        .await;
    assert!(
        succeeded_only.contains("No attempts in this window."),
        "{succeeded_only}"
    );
    let (_, ledger_failed) = console
        .get(
            "/subscriptions/consoled/ledger?outcome=failed&since=1h",
            Some(&cookie),
        )
        .await;
    assert!(
        ledger_failed.contains("No attempts in this window."),
        "{ledger_failed}"
    );
    let (_, bad) = console
        .get(&format!("{path}?outcome=sometimes"), Some(&cookie))
        .await;
    assert!(
        bad.contains("is not one of all, failed, succeeded"),
        "{bad}"
    );

    // A change without the form's token, without the cookie, or from another origin: refused.
    let redrive = format!("{path}/redrive");
    let pick = [("pick", c0.as_str()), ("confirm", "yes")];
    let with_token = [
        ("token", console.token.as_str()),
        ("pick", c0.as_str()),
        ("confirm", "yes"),
    ];
    assert_eq!(
        console.post(&redrive, Some(&cookie), &[], &pick).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        console.post(&redrive, None, &[], &with_token).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        console
            .post(
                &redrive,
                Some(&cookie),
                &[(ORIGIN, "https://attacker.example")],
                &with_token
            )
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    // Asked first: nothing moves.
    failing.answer_path("/hook", Reply::Status(200));
    let (status, ask) = console
        .post(
            &redrive,
            Some(&cookie),
            &[(ORIGIN, &console.base)],
            &[("token", &console.token), ("pick", &c0)],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{ask}");
    assert!(ask.contains("Yes, redrive 1 event<"), "{ask}");
    // Asking moved nothing: c-0 is still listed.
    let (_, page) = console.get(path, Some(&cookie)).await;
    assert_eq!(pick_of(&page, "c-0"), c0);

    // Confirmed: c-0, and only it, reaches the endpoint.
    let (status, done) = console
        .post(
            &redrive,
            Some(&cookie),
            &[(ORIGIN, &console.base)],
            &with_token,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("1 event went back into delivery."), "{done}");
    let received = failing.wait_for_requests(3, Duration::from_secs(15)).await;
    let ids = received.last().unwrap().ids();
    assert_eq!(ids, ["c-0"]);
    assert_eq!(failing.event_count(), 3, "c-0 once more, and nothing else");
    let (_, page) = console.get(path, Some(&cookie)).await;
    assert!(!page.contains(r#"value="c%2D0 "#), "{page}");
    pick_of(&page, "c-1");

    // The event, found by id: dead-lettered, then redriven and delivered.
    let found = eventually(Duration::from_secs(15), "the redrive journaled", || async {
        let (status, page) = console
            .get("/events?topic=consoled&id=c-0&since=1h", Some(&cookie))
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page.contains("delivered at").then_some(page)
    })
    .await;
    assert!(found.contains("dead-lettered"), "{found}");
    assert!(found.contains("redriven from s3://"), "{found}");
    // #35: each delivery stands on its own steps: the publish's dead-lettered, the redrive's
    // delivered.
    assert!(
        found.contains("each delivery stands on its own steps"),
        "{found}"
    );
    assert!(found.contains("<li>publish, since "), "{found}");
    assert!(found.contains("<li>redrive at "), "{found}");
    let (_, unknown) = console
        .get("/events?topic=consoled&id=nope&since=1h", Some(&cookie))
        .await;
    assert!(unknown.contains("No journal entry of event"), "{unknown}");

    // The live page's feed: the journal's entries since a time, each named by its object and
    // line; a bad `since` named; nothing without the cookie.
    let since = (chrono::Utc::now() - chrono::TimeDelta::minutes(10)).timestamp_millis();
    let feed = format!("/live/entries?topic=consoled&since={since}");
    assert_eq!(console.get(&feed, None).await.0, StatusCode::UNAUTHORIZED);
    let (status, body) = console.get(&feed, Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let look: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = look["rows"].as_array().unwrap();
    assert!(
        rows.iter()
            .any(|r| r["subscription"] == "audit" && r["status"] == "503"),
        "{body}"
    );
    assert!(rows.iter().all(|r| r["topic"] == "consoled"), "{body}");
    assert!(look["next"].as_i64().unwrap() >= since, "{body}");
    let (status, body) = console
        .get("/live/entries?since=yesterday", Some(&cookie))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("since") && body.contains("yesterday"),
        "{body}"
    );

    // ledger's signing secret, rotated: refused without the form's token, a grace period out
    // of range named; asked first (nothing changes); then a new secret, shown once, signs
    // ledger's next delivery.
    let rotate = "/subscriptions/consoled/ledger/signing-secret";
    let same_origin = [(ORIGIN, console.base.as_str())];
    let without_token = [("grace_period_hours", "0")];
    assert_eq!(
        console
            .post(rotate, Some(&cookie), &same_origin, &without_token)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    let too_long = [
        ("token", console.token.as_str()),
        ("grace_period_hours", "169"),
    ];
    let (status, body) = console
        .post(rotate, Some(&cookie), &same_origin, &too_long)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("gracePeriodHours") && body.contains("169"),
        "{body}"
    );
    let ask = [
        ("token", console.token.as_str()),
        ("grace_period_hours", "0"),
    ];
    let (status, body) = console
        .post(rotate, Some(&cookie), &same_origin, &ask)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("Yes, rotate the signing secret"), "{body}");
    let (_, page) = console
        .get("/subscriptions/consoled/ledger", Some(&cookie))
        .await;
    assert!(
        page.contains("Deliveries are not signed"),
        "asking changed nothing"
    );
    let confirmed = [
        ("token", console.token.as_str()),
        ("grace_period_hours", "0"),
        ("confirm", "yes"),
    ];
    let (status, body) = console
        .post(rotate, Some(&cookie), &same_origin, &confirmed)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let shown = super::shown(&body, "new-secret");
    let secret = SigningSecret::parse(&shown).unwrap();
    sys.publish(&topic, &events("s", 1)).await;
    let signed = eventually(
        Duration::from_secs(15),
        "s-0 delivered to ledger",
        || async { healthy.received().into_iter().find(|r| r.ids() == ["s-0"]) },
    )
    .await;
    let (id, at) = (
        signed.header("webhook-id").unwrap(),
        signed.header("webhook-timestamp").unwrap(),
    );
    let expected = secret.sign(id, at.parse().unwrap(), signed.body.as_bytes());
    assert_eq!(signed.header("webhook-signature"), Some(expected.as_str()));
    let (_, page) = console
        .get("/subscriptions/consoled/ledger", Some(&cookie))
        .await;
    assert!(page.contains("Deliveries are signed"), "{page}");
    assert!(!page.contains(&shown), "the secret is shown once");

    // A portal link for ledger's subscriber: refused without the token; a life out of range
    // named; made, it opens ledger's portal page.
    let make = "/subscriptions/consoled/ledger/portal-link";
    let (status, _) = console
        .post(make, Some(&cookie), &same_origin, &[("expires_in", "1h")])
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = console
        .post(
            make,
            Some(&cookie),
            &same_origin,
            &[("token", console.token.as_str()), ("expires_in", "31d")],
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("expires_in") && body.contains("31d"),
        "{body}"
    );
    let (status, body) = console
        .post(
            make,
            Some(&cookie),
            &same_origin,
            &[("token", console.token.as_str()), ("expires_in", "1h")],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let link = super::shown(&body, "portal-link").replace("&amp;", "&");
    let opened = console.client.get(&link).send().await.unwrap();
    assert_eq!(opened.status(), StatusCode::SEE_OTHER, "{link}");
    assert_eq!(opened.headers()[LOCATION], "/portal/consoled/ledger");
    // Ticked "to look only": the link's grant is view-only, and the page says what it allows.
    let (status, body) = console
        .post(
            make,
            Some(&cookie),
            &same_origin,
            &[
                ("token", console.token.as_str()),
                ("expires_in", "1h"),
                ("view_only", "yes"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body.contains("it sends nothing and changes nothing"),
        "{body}"
    );
    let view_link = super::shown(&body, "portal-link").replace("&amp;", "&");
    let key = gridrelay_adapters::aws::portal_key(&sys.sdk, &sys.names.portal_key_secret)
        .await
        .unwrap();
    let token = view_link.split_once("token=").unwrap().1;
    let grant = gridrelay_shared::portal::read_token(token, &key, chrono::Utc::now()).unwrap();
    assert!(grant.view_only, "{grant:?}");

    // A replay to one subscription of a topic with an archive: a rate out of range named;
    // asked first (nothing starts); then started, and the event reaches the endpoint again
    // with the replay's header.
    let kept = Topic {
        retention_days: 1,
        ..Topic::with_new_keys("kept", chrono::Utc::now())
    };
    sys.system.store.create_topic(&kept).await.unwrap();
    let copy = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(subscription("kept", "copy", &copy.url)).await;
    sys.publish(&kept, &events("k", 1)).await;
    copy.wait_for_requests(1, Duration::from_secs(15)).await;
    let replay = "/subscriptions/kept/copy/replay";
    let asked = |rate: &str| {
        vec![
            ("token", console.token.clone()),
            ("name", "again".to_string()),
            ("start_time", "10m".to_string()),
            ("end_time", String::new()),
            ("rate", rate.to_string()),
        ]
    };
    let post = |fields: Vec<(&'static str, String)>| {
        let console = &console;
        let cookie = cookie.clone();
        async move {
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            console
                .post(
                    replay,
                    Some(&cookie),
                    &[(ORIGIN, console.base.as_str())],
                    &fields,
                )
                .await
        }
    };
    let (status, body) = post(asked("0")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("rate") && body.contains("10000"), "{body}");
    let (status, ask) = post(asked("10")).await;
    assert_eq!(status, StatusCode::OK, "{ask}");
    assert!(ask.contains("Yes, start replay again"), "{ask}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(copy.event_count(), 1, "asking sent nothing");
    let hidden = |name: &str| {
        let at = format!(r#"name="{name}" value=""#);
        let start = ask.find(&at).unwrap_or_else(|| panic!("no {name}: {ask}")) + at.len();
        ask[start..start + ask[start..].find('"').unwrap()].to_string()
    };
    let confirmed = vec![
        ("token", console.token.clone()),
        ("name", hidden("name")),
        ("start_time", hidden("start_time")),
        ("end_time", hidden("end_time")),
        ("rate", hidden("rate")),
        ("confirm", "yes".to_string()),
    ];
    let (status, done) = post(confirmed).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(done.contains("Replay started"), "{done}");
    let again = &copy.wait_for_requests(2, Duration::from_secs(20)).await[1];
    assert_eq!(again.ids(), ["k-0"]);
    assert_eq!(again.header("gridrelay-replay"), Some("again"));
    drop(console);
    sys.shutdown().await;
}

/// Topic `consoled` with subscription `audit`, whose endpoint answers 503 (one attempt, then
/// dead-lettered: L3), and `ledger`, whose endpoint answers 200; events c-0 and c-1 published
/// to both, dead-lettered for audit and delivered to ledger.
pub(crate) async fn failing_and_healthy(
    sys: &TestSystem,
) -> (
    gridrelay_shared::subscription::Topic,
    Subscriber,
    Subscriber,
) {
    let topic = sys.topic("consoled").await;
    let failing = Subscriber::start(vec![], Reply::Status(503)).await;
    let healthy = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(SubscriptionRequest {
        dead_letter_destination: Some(sys.dead_letter_url("consoled")),
        max_delivery_attempts: Some(1),
        ..subscription("consoled", "audit", &failing.url)
    })
    .await;
    sys.subscribe(subscription("consoled", "ledger", &healthy.url))
        .await;
    sys.publish(&topic, &events("c", 2)).await;
    sys.wait_for_dead_letters("consoled/", Duration::from_secs(30))
        .await;
    healthy.wait_for_requests(1, Duration::from_secs(10)).await;
    (topic, failing, healthy)
}

/// #36, L2, L3: the console in Chromium, as an operator clicks through it, each page passing
/// axe-core's WCAG 2.1 AA checks and kept as a screenshot: the overview shows audit Failing
/// with its 503; the first Tab reaches the skip link; audit's page lists its attempt; the
/// dead-lettered c-0, ticked and redriven (asked first), reaches the endpoint; c-0, searched
/// for with the keyboard, shows its life; the live page shows a new attempt. Then the
/// subscribers' portal: audit's link, made on its console page, lands on its page (the token
/// gone from the address), its
/// signing secret is rotated (asked, then shown once), its test event and its dead-lettered
/// c-1, sent again from its forms, reach its endpoint; ledger's page refuses the browser that
/// holds it, and an expired link and a tampered one are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_the_console_shows_redrives_and_finds_events_accessibly_l2_l3() {
    use fantoccini::key::Key;
    let sys = TestSystem::start_with_own_journal(0.01).await;
    let (topic, failing, _healthy) = failing_and_healthy(&sys).await;
    let console = Console::start(&sys);
    let browser = browser::Browser::start().await;

    // The printed URL signs the browser in and lands on the overview.
    browser.open(&console.url).await;
    assert_eq!(browser.client.current_url().await.unwrap().path(), "/");
    let overview = eventually(Duration::from_secs(15), "audit's row complete", || async {
        browser.open(&format!("{}/", console.base)).await;
        let page = browser.client.source().await.unwrap();
        row(&page, "audit").contains(COUNTS_0_2_2).then_some(page)
    })
    .await;
    let audit = row(&overview, "audit");
    assert!(
        audit.contains("Failing") && audit.contains("<strong>503</strong>"),
        "{audit}"
    );
    browser.check_page("overview").await;
    browser.press(Key::Tab, 1).await;
    assert_eq!(browser.focused().await, "Skip to the content");

    browser
        .click(r#"a[href="/subscriptions/consoled/audit"]"#)
        .await;
    let text = browser.text().await;
    assert!(
        text.contains("Subscription audit of topic consoled"),
        "{text}"
    );
    assert!(text.contains("503"), "{text}");
    browser.check_page("subscription").await;

    // Tick c-0, ask, confirm.
    browser
        .click(r#"input[name="pick"][value^="c%2D0 "]"#)
        .await;
    browser
        .click(r#"form[action$="/redrive"] button[type="submit"]"#)
        .await;
    let text = browser.text().await;
    assert!(text.contains("Yes, redrive 1 event"), "{text}");
    browser.check_page("redrive-confirm").await;
    failing.answer_path("/hook", Reply::Status(200));
    browser
        .click(r#"form[action$="/redrive"] button[type="submit"]"#)
        .await;
    let text = browser.text().await;
    assert!(text.contains("1 event went back into delivery."), "{text}");
    browser.check_page("redrive-done").await;
    let received = failing.wait_for_requests(3, Duration::from_secs(15)).await;
    assert_eq!(received.last().unwrap().ids(), ["c-0"]);

    // Find c-0 with the keyboard: its id typed, Enter.
    let life = eventually(Duration::from_secs(15), "c-0 delivered again", || async {
        browser.click(r#"nav a[href="/events"]"#).await;
        let id = browser
            .client
            .find(fantoccini::Locator::Id("id"))
            .await
            .unwrap();
        id.click().await.unwrap();
        id.send_keys("c-0").await.unwrap();
        browser.mark_page().await;
        browser.press(Key::Enter, 1).await;
        browser.wait_for_new_page().await;
        browser
            .client
            .wait()
            .for_element(fantoccini::Locator::Css("main"))
            .await
            .unwrap();
        let text = browser.text().await;
        text.contains("delivered at").then_some(text)
    })
    .await;
    assert!(life.contains("redriven from s3://"), "{life}");
    browser.check_page("event").await;

    // The live page shows an attempt made after it opened, without a reload.
    browser.click(r#"nav a[href="/live"]"#).await;
    browser.mark_page().await;
    sys.publish(&topic, &events("l", 1)).await;
    let delivered = |rows: &[String], sub: &str| {
        rows.iter()
            .filter(|r| r.contains(&format!("consoled / {sub}")) && r.contains("Succeeded"))
            .count()
    };
    eventually(Duration::from_secs(20), "l-0's attempts shown", || async {
        let rows = live_rows(&browser, "l-0").await;
        (delivered(&rows, "audit") > 0 && delivered(&rows, "ledger") > 0).then_some(())
    })
    .await;
    // Each look reads the last minute's objects again: each attempt is still shown once.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let rows = live_rows(&browser, "l-0").await;
    assert_eq!(
        (delivered(&rows, "audit"), delivered(&rows, "ledger")),
        (1, 1),
        "{rows:?}"
    );
    assert!(browser.still_marked().await, "the live page was reloaded");
    assert!(browser.text().await.contains("new entr"), "announced");
    let pause = browser
        .client
        .find(fantoccini::Locator::Id("live-pause"))
        .await
        .unwrap();
    pause.click().await.unwrap();
    assert_eq!(
        pause.attr("aria-pressed").await.unwrap().as_deref(),
        Some("true")
    );
    assert!(browser.text().await.contains("Paused"), "pausing is said");
    browser.check_page("live").await;

    // The subscribers' portal: audit's link lands on its page; ledger's page refuses it.
    // The link is made on audit's console page.
    let base = format!("http://{}", sys.system.listen);
    browser
        .open(&format!("{}/subscriptions/consoled/audit", console.base))
        .await;
    browser
        .click(r#"form[action$="/portal-link"] button"#)
        .await;
    let made = browser.text().await;
    assert!(made.contains("Send it to the subscriber"), "{made}");
    browser.check_page("portal-link").await;
    let link = browser
        .client
        .find(fantoccini::Locator::Css("#portal-link"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        link.starts_with(&format!("{base}/portal/consoled/audit?token=")),
        "{link}"
    );
    browser.open(link.trim()).await;
    let landed = browser.client.current_url().await.unwrap();
    assert_eq!(landed.path(), "/portal/consoled/audit");
    assert_eq!(landed.query(), None, "the token left the address bar");
    let text = browser.text().await;
    assert!(
        text.contains("Deliveries to audit") && text.contains("503"),
        "{text}"
    );
    browser.check_page("portal").await;
    // The signing secret rotated from the page: asked, then shown once.
    browser
        .click(r#"form[action$="/signing-secret"] button"#)
        .await;
    assert!(browser.text().await.contains("Rotate the signing secret?"));
    browser.click(r#"button[type="submit"]"#).await;
    let text = browser.text().await;
    assert!(text.contains("It is shown once"), "{text}");
    browser.check_page("portal-rotated").await;
    browser.open(&format!("{base}/portal/consoled/audit")).await;
    // From the page: a test event, as Chromium posts the form (its own Origin and
    // Sec-Fetch-Site), reaches audit's endpoint; then c-1, ticked, is sent again.
    browser.click(r#"form[action$="/test-event"] button"#).await;
    let text = browser.text().await;
    assert!(text.contains("Test event sent"), "{text}");
    browser.check_page("portal-test-event").await;
    eventually(
        Duration::from_secs(20),
        "the test event at audit's endpoint",
        || async {
            failing
                .received()
                .iter()
                .any(|r| r.body.contains("Gridrelay.Portal.TestEvent"))
                .then_some(())
        },
    )
    .await;
    let c1_before = failing
        .received()
        .iter()
        .filter(|r| r.ids().contains(&"c-1".to_string()))
        .count();
    browser.open(&format!("{base}/portal/consoled/audit")).await;
    browser
        .click(r#"input[name="pick"][value^="c%2D1 "]"#)
        .await;
    browser.click(r#"form[action$="/send-again"] button"#).await;
    let text = browser.text().await;
    assert!(
        text.contains("on their way again") && text.contains("c-1"),
        "{text}"
    );
    browser.check_page("portal-sent-again").await;
    eventually(
        Duration::from_secs(20),
        "c-1 at audit's endpoint again",
        || async {
            let now = failing
                .received()
                .iter()
                .filter(|r| r.ids().contains(&"c-1".to_string()))
                .count();
            (now > c1_before).then_some(())
        },
    )
    .await;
    browser
        .open(&format!("{base}/portal/consoled/ledger"))
        .await;
    let text = browser.text().await;
    assert!(
        text.contains("Open this page with the link you were given"),
        "{text}"
    );
    browser.check_page("portal-refused").await;
    // A link signed with the real key that expired a minute ago, and one with a changed
    // signature: refused, saying so.
    let expired = super::portal::expired_token(&sys, "audit").await;
    browser
        .open(&format!("{base}/portal/consoled/audit?token={expired}"))
        .await;
    let text = browser.text().await;
    assert!(text.contains("This link expired at"), "{text}");
    let link = super::portal::link(&sys, "audit", "1h");
    let last = link.len() - 2;
    let changed = if &link[last..=last] == "A" { "B" } else { "A" };
    let tampered = format!("{}{changed}{}", &link[..last], &link[last + 1..]);
    browser.open(&tampered).await;
    let text = browser.text().await;
    assert!(text.contains("This link cannot be used here"), "{text}");
    browser.end().await;
    drop(console);
    sys.shutdown().await;
}

/// The text of the live page's rows that name `text`.
async fn live_rows(browser: &browser::Browser, text: &str) -> Vec<String> {
    let rows = browser
        .client
        .execute(
            "return Array.from(document.querySelectorAll('#live-rows tr'), tr => tr.innerText)
               .filter(t => t.includes(arguments[0]));",
            vec![serde_json::json!(text)],
        )
        .await
        .unwrap();
    serde_json::from_value(rows).unwrap()
}

/// Delivered 0, failed 2, dead-lettered 2, as the overview's cells.
const COUNTS_0_2_2: &str = r#"<td class="num">0</td><td class="num">2</td><td class="num">2</td>"#;

/// The value of the box that picks dead-lettered event `id` on a subscription's page.
fn pick_of(page: &str, id: &str) -> String {
    let encoded = id.replace('-', "%2D");
    let start = page
        .find(&format!(r#"name="pick" value="{encoded} "#))
        .unwrap_or_else(|| panic!("no box for {id}: {page}"))
        + r#"name="pick" value=""#.len();
    let end = start + page[start..].find('"').unwrap();
    page[start..end].to_string()
}

/// The overview's row of subscription `name`.
fn row<'a>(page: &'a str, name: &str) -> &'a str {
    let start = page
        .find(&format!(">{name}</a>"))
        .unwrap_or_else(|| panic!("no row of {name}: {page}"));
    let end = page[start..]
        .find("</tr>")
        .map_or(page.len(), |e| start + e);
    &page[start..end]
}
