//! `console`: how long the operator console (#36) takes to answer its overview, with one
//! subscription (the baseline) and then with many (500 by default: the goal is under a
//! second), each with an hour of journal entries, against the emulator at AWS_ENDPOINT_URL.
//!
//! The subscriptions are stored as validated (no handshake: the overview reads the same
//! records either way) and their journal is written through the journal's own stream, as
//! `deliver` writes it: per subscription, `DELIVERIES` events sent and answered in the last
//! hour, one subscription in ten failing with 503s.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::Utc;
use futures::StreamExt;
use gridrelay_adapters::aws::{DynamoSubscriptionStore, FirehoseStream, load_sdk_config};
use gridrelay_adapters::config::TableNames;
use gridrelay_local::ResourceNames;
use gridrelay_ports::SubscriptionStore;
use gridrelay_ports::memory::MemorySubscriptionStore;
use gridrelay_shared::classify::DeliveryOutcome;
use gridrelay_shared::journal::{Attempt, JournalEntry, Next, Step};
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::subscription::{SubscriptionRequest, Topic};

/// Events each subscription was sent, and answered, in the hour before the measurement.
const DELIVERIES: usize = 12;
/// Overview requests timed in each case (after one not timed).
const REQUESTS: usize = 10;

pub async fn run(binary: &Path, subscriptions: usize) -> anyhow::Result<()> {
    let prefix = format!("bcon{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let names = ResourceNames::with_prefix(&prefix);
    let sdk = load_sdk_config().await;
    gridrelay_local::provision(&sdk, &names, 5).await?;
    let store = DynamoSubscriptionStore::from_sdk(
        &sdk,
        TableNames {
            topics: names.topics_table.clone(),
            subscriptions: names.subscriptions_table.clone(),
        },
    );
    let now = Utc::now();
    store
        .create_topic(&Topic::with_new_keys("bench", now))
        .await?;
    let journal = FirehoseStream::from_sdk(&sdk, &names.journal_stream);
    let console = ConsoleProcess::start(binary, &names)?;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let cookie = console.sign_in(&client).await?;

    println!(
        "console: the overview (GET /), {REQUESTS} requests after one not timed, each \
         subscription with {DELIVERIES} deliveries in the last hour in the journal"
    );
    add_subscriptions(&store, &journal, 0..1).await?;
    let one = console.time_overview(&client, &cookie, 1).await?;
    add_subscriptions(&store, &journal, 1..subscriptions).await?;
    let many = console
        .time_overview(&client, &cookie, subscriptions)
        .await?;
    println!(
        "  {subscriptions} subscriptions: p50 {:.0} ms, {:.1}x the 1-subscription p50 (goal: \
         under 1,000 ms)",
        many.p50_ms,
        many.p50_ms / one.p50_ms.max(0.001)
    );
    Ok(())
}

/// The overview's times over one run's requests.
struct Timed {
    p50_ms: f64,
}

/// Stores subscriptions `range` of topic `bench` and writes their hour of journal.
async fn add_subscriptions(
    store: &DynamoSubscriptionStore,
    journal: &FirehoseStream,
    range: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    let now = Utc::now();
    let records = MemorySubscriptionStore::default();
    let subs: Vec<_> = range
        .clone()
        .map(|i| {
            records.insert_validated(
                SubscriptionRequest {
                    topic: "bench".into(),
                    name: format!("sub-{i:04}"),
                    endpoint: format!("https://hooks.example.com/{i}"),
                    ..SubscriptionRequest::default()
                },
                InputSchema::EventGridSchema,
                now,
            )
        })
        .collect();
    let stored: Vec<_> = futures::stream::iter(subs.iter())
        .map(|sub| store.create_subscription(sub))
        .buffer_unordered(16)
        .collect()
        .await;
    for result in stored {
        result?;
    }
    let entries: Vec<JournalEntry> = range.flat_map(|i| hour_of(i, now)).collect();
    let unwritten = gridrelay_adapters::journal::write_entries(
        journal,
        &entries,
        now,
        now + chrono::Duration::hours(1),
        Duration::ZERO,
    )
    .await;
    if unwritten > 0 {
        bail!(
            "{unwritten} of {} journal entries were not written",
            entries.len()
        );
    }
    Ok(())
}

/// Subscription `i`'s last hour: `DELIVERIES` events sent, each answered 200 in 40 ms, or
/// 503 for every tenth subscription.
fn hour_of(i: usize, now: chrono::DateTime<Utc>) -> Vec<JournalEntry> {
    let failing = i % 10 == 9;
    (0..DELIVERIES)
        .flat_map(|n| {
            let id = format!("e-{i}-{n}");
            let sent = now - chrono::Duration::minutes(55 - 4 * n as i64);
            let entry = |time, step| JournalEntry {
                topic: "bench".into(),
                subscription: format!("sub-{i:04}"),
                ids: vec![id.clone()],
                time,
                delivery: None,
                step,
            };
            let (status, outcome, next, answer) = if failing {
                (
                    503,
                    DeliveryOutcome::Busy,
                    Next::Retry {
                        due: sent + chrono::Duration::seconds(30),
                    },
                    Some("upstream unavailable".to_string()),
                )
            } else {
                (200, DeliveryOutcome::Succeeded, Next::Delivered, None)
            };
            [
                entry(
                    sent,
                    Step::Fanned {
                        event_type: "Bench.Created".into(),
                        subject: String::new(),
                        bytes: 400,
                        replay: None,
                        redrive: None,
                    },
                ),
                entry(
                    sent + chrono::Duration::milliseconds(120),
                    Step::Attempt(Attempt {
                        attempt: 1,
                        ms: 40,
                        endpoint: format!("https://hooks.example.com/{i}"),
                        status: Some(status),
                        outcome,
                        retry_after_s: None,
                        error: None,
                        answer,
                        next,
                    }),
                ),
            ]
        })
        .collect()
}

/// `gridrelay console` on the bench's resources, stopped when dropped.
struct ConsoleProcess {
    child: Child,
    url: String,
}

impl ConsoleProcess {
    fn start(binary: &Path, names: &ResourceNames) -> anyhow::Result<Self> {
        let mut child = Command::new(binary)
            .args(["console", "--listen", "127.0.0.1:0"])
            .envs(names.cli_env())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("start gridrelay console")?;
        let url = gridrelay_e2e::printed_console_url(&mut child)
            .context("gridrelay console printed no URL")?;
        Ok(Self { child, url })
    }

    fn base(&self) -> &str {
        self.url.split("/?token=").next().unwrap_or(&self.url)
    }

    /// The cookie the URL's token is exchanged for.
    async fn sign_in(&self, client: &reqwest::Client) -> anyhow::Result<String> {
        let r = client.get(&self.url).send().await?;
        let cookie = r
            .headers()
            .get(reqwest::header::SET_COOKIE)
            .context("the console set no cookie")?
            .to_str()?;
        Ok(cookie.split(';').next().unwrap_or_default().to_string())
    }

    /// Times the overview of `subscriptions` subscriptions, and prints it.
    async fn time_overview(
        &self,
        client: &reqwest::Client,
        cookie: &str,
        subscriptions: usize,
    ) -> anyhow::Result<Timed> {
        let url = format!("{}/", self.base());
        let mut times = Vec::new();
        let mut bytes = 0;
        for i in 0..=REQUESTS {
            let started = Instant::now();
            let r = client
                .get(&url)
                .header(reqwest::header::COOKIE, cookie)
                .send()
                .await?;
            if !r.status().is_success() {
                bail!("the overview answered {}", r.status());
            }
            let page = r.text().await?;
            let took = started.elapsed().as_secs_f64() * 1000.0;
            let rows = page.matches("<th scope=\"row\">").count();
            if rows != subscriptions {
                bail!("the overview shows {rows} subscriptions, not {subscriptions}");
            }
            bytes = page.len();
            if i > 0 {
                times.push(took);
            }
        }
        times.sort_by(f64::total_cmp);
        let p50 = times[times.len() / 2];
        let max = times.last().copied().unwrap_or_default();
        println!(
            "  {subscriptions:>3} subscription(s): p50 {p50:>6.0} ms, max {max:>6.0} ms, page \
             {:.0} KB",
            bytes as f64 / 1024.0
        );
        Ok(Timed { p50_ms: p50 })
    }
}

impl Drop for ConsoleProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
