//! The console in a real browser (#36): Debian's Chromium driven through ChromeDriver
//! (WebDriver), with axe-core checking each page's accessibility and a screenshot of each page
//! kept under `target/tmp/console-screenshots/`. `infra/local/browser.sh` (run by `make test`)
//! installs all three.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// A program on PATH (Debian's packages put both in /usr/bin).
fn on_path(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!("{name} is not on PATH: run infra/local/browser.sh (make test does)")
        })
}

/// A headless Chromium session: ended by [`Browser::end`]; its driver (and with it
/// Chromium) stopped and its profile removed when dropped, also when a test fails.
pub struct Browser {
    pub client: Client,
    driver: Child,
    profile: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Browser {
    pub async fn start() -> Self {
        let (chromium, chromedriver) = (on_path("chromium"), on_path("chromedriver"));
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs");
        let profile =
            std::env::temp_dir().join(format!("gridrelay-chromium-{}", uuid::Uuid::new_v4()));
        // The flags that keep Chromium off this machine's closed network, headless, as root.
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1000",
        ]
        .into_iter()
        .map(str::to_string)
        .chain([format!("--user-data-dir={}", profile.display())])
        .collect::<Vec<_>>();
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({ "binary": chromium, "args": args }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let client =
            gridrelay_e2e::eventually(Duration::from_secs(20), "chromedriver answers", || {
                let capabilities = capabilities.clone();
                let url = url.clone();
                async move {
                    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                        .capabilities(capabilities)
                        .connect(&url)
                        .await
                        .ok()
                }
            })
            .await;
        Self {
            client,
            driver,
            profile,
        }
    }

    /// Goes to `url` and waits for its `<main>`.
    pub async fn open(&self, url: &str) {
        self.client.goto(url).await.unwrap();
        self.client
            .wait()
            .for_element(Locator::Css("main"))
            .await
            .unwrap();
    }

    /// The page's text, as a reader sees it.
    pub async fn text(&self) -> String {
        self.client
            .find(Locator::Css("body"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Clicks what `css` finds, and waits for the page it leads to.
    pub async fn click(&self, css: &str) {
        let target = self
            .client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"));
        let leaves = target
            .tag_name()
            .await
            .is_ok_and(|tag| tag == "a" || tag == "button");
        if leaves {
            self.mark_page().await;
        }
        target.click().await.unwrap();
        if leaves {
            self.wait_for_new_page().await;
        }
    }

    /// Marks the page shown, so that [`Browser::wait_for_new_page`] can tell the next one.
    pub async fn mark_page(&self) {
        self.client
            .execute("document.documentElement.dataset.left = 'yes';", vec![])
            .await
            .unwrap();
    }

    /// Whether the page marked is still the one shown.
    pub async fn still_marked(&self) -> bool {
        self.client
            .execute(
                "return document.documentElement.dataset.left === 'yes';",
                vec![],
            )
            .await
            .ok()
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    }

    /// Waits until a page other than the one marked has loaded.
    pub async fn wait_for_new_page(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let loaded = self
                .client
                .execute(
                    "return document.documentElement.dataset.left === undefined \
                     && document.readyState === 'complete';",
                    vec![],
                )
                .await
                .ok()
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            if loaded {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no new page within 15 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Keeps a screenshot of the page as `name.png`, and checks it with axe-core (WCAG 2.1 A
    /// and AA, contrast included): fails naming each violation.
    pub async fn check_page(&self, name: &str) {
        let violations = self.violations(name).await;
        assert!(violations.is_empty(), "{name}: {violations:#?}");
    }

    async fn violations(&self, name: &str) -> Vec<String> {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
        let axe = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/browser/node_modules/axe-core/axe.min.js"),
        )
        .expect("axe-core is installed: run infra/local/browser.sh (make test does)");
        self.client
            .execute(&format!("{axe}\nreturn true;"), vec![])
            .await
            .unwrap();
        let found = self
            .client
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 axe.run(document, { runOnly: { type: 'tag',
                     values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } })
                   .then(r => done(r.violations.map(v => v.id + ': ' + v.help + ' at ' +
                       v.nodes.map(n => n.target.join(' ')).join(', '))))
                   .catch(e => done(['axe failed: ' + e]));",
                vec![],
            )
            .await
            .unwrap();
        match found {
            Value::Array(items) => items
                .into_iter()
                .map(|v| v.as_str().unwrap_or_default().to_string())
                .collect(),
            other => vec![format!("axe answered {other}")],
        }
    }

    /// Presses `key` `times` times, as a keyboard does.
    pub async fn press(&self, key: Key, times: usize) {
        let mut keys = KeyActions::new("keyboard".into());
        for _ in 0..times {
            keys = keys
                .then(KeyAction::Down { value: key.into() })
                .then(KeyAction::Up { value: key.into() });
        }
        self.client.perform_actions(keys).await.unwrap();
    }

    /// The focused element's text, or its tag if it has none.
    pub async fn focused(&self) -> String {
        let focused = self.client.active_element().await.unwrap();
        let text = focused.text().await.unwrap();
        if text.is_empty() {
            focused.tag_name().await.unwrap()
        } else {
            text
        }
    }

    /// Ends the session; dropped, the driver stops.
    pub async fn end(self) {
        let _ = self.client.clone().close().await;
    }
}
