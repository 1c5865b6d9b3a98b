//! What the console reads and does, through the same code as the command line: the stores
//! `event-subscription show` reads, the journal `event show` and `attempts` read, and the
//! redrive `redrive dead-letters` runs.

use anyhow::Context;
use chrono::{DateTime, Utc};
use gridrelay_adapters::aws::{
    DynamoDeliveryStateStore, DynamoReplayStore, DynamoSubscriptionStore, JournalObject,
    S3JournalSource, S3ObjectStore, SecretsManagerStore, SqsQueue, buffering_interval,
    load_sdk_config, s3_client,
};
use gridrelay_adapters::config::TableNames;
use gridrelay_ports::redrive::{
    DeadLetterRedriveReport, DeadLetterSelection, redrive_dead_letters,
};
use gridrelay_ports::registration::{SigningKeys, rotate_signing_secret};
use gridrelay_ports::{DeliveryStateStore, JournalRead, JournalSource, SubscriptionStore};
use gridrelay_shared::activity::{Activity, Window, activity};
pub(in crate::console) use gridrelay_shared::health::DeliveryState;
use gridrelay_shared::health::EndpointHealth;
use gridrelay_shared::journal::{EventLife, JOURNAL_PREFIX, JournalEntry, latest_attempts};
use gridrelay_shared::replay::Replay;

use crate::replay::{ReplayRequest, ReplayResources, plan_replay, start_replay};
use gridrelay_shared::signing::SigningSecret;
use gridrelay_shared::subscription::{Subscription, Topic};

use crate::view::QueueCounts;
use crate::{OwnQueues, delivery_queue_url, store_error};

/// The installation the console looks at, as the global flags name it.
pub(crate) struct ConsoleResources {
    pub(crate) tables: TableNames,
    pub(crate) delivery_state_table: String,
    pub(crate) delivery_queue: String,
    pub(crate) queue_key_secret: Option<String>,
    pub(crate) journal_bucket: String,
    /// The journal's Firehose stream, whose buffering interval says how far behind the
    /// journal can be (`None`: not known).
    pub(crate) journal_stream: Option<String>,
    /// The name prefix of the installation's secrets (signing secrets among them).
    pub(crate) secret_prefix: String,
    /// Where replays are kept and sent from, as `replay start` finds them.
    pub(crate) replays: ReplayPlaces,
    /// Where subscribers' portal links point and what signs them (`None`: not known).
    pub(crate) portal: Option<PortalLinks>,
}

/// Where subscribers' portal links point (the portal's pages), and the secret whose key signs
/// them.
pub(crate) struct PortalLinks {
    pub(crate) portal_url: String,
    pub(crate) key_secret: String,
}

/// The replays' table (`None`: not known), the archive's stream, and the queues their steps
/// and deliveries go to (`None`: beside the delivery queue).
#[derive(Default)]
pub(crate) struct ReplayPlaces {
    pub(crate) table: Option<String>,
    pub(crate) archive_stream: Option<String>,
    pub(crate) control_queue: Option<String>,
    pub(crate) replay_queue: Option<String>,
}

/// The clients the console's pages read with.
pub(in crate::console) struct Sources {
    sdk: aws_config::SdkConfig,
    store: DynamoSubscriptionStore,
    health: DynamoDeliveryStateStore,
    sqs: aws_sdk_sqs::Client,
    journal: S3JournalSource,
    objects: S3ObjectStore,
    delivery_queue: String,
    queue_key_secret: Option<String>,
    journal_stream: Option<String>,
    secrets: SecretsManagerStore,
    secret_prefix: String,
    tables: TableNames,
    replays: ReplayPlaces,
    portal: Option<PortalLinks>,
    /// How long the journal's stream gathers entries before it writes them, as it says
    /// (`Ok(None)`: it does not say), or why that could not be read.
    /// Read at the live page's first look, not at start (a start reads nothing it need not).
    journal_buffer: tokio::sync::OnceCell<Result<Option<std::time::Duration>, String>>,
}

/// One subscription as the overview draws it.
pub(in crate::console) struct SubscriptionRow {
    pub(in crate::console) sub: Subscription,
    pub(in crate::console) state: DeliveryState,
    pub(in crate::console) health: Option<EndpointHealth>,
    pub(in crate::console) activity: Activity,
}

/// Every topic with its subscriptions, and what the overview says of them.
pub(in crate::console) struct Overview {
    pub(in crate::console) window: Window,
    pub(in crate::console) topics: Vec<(Topic, Vec<SubscriptionRow>)>,
    /// The delivery queue's counts, or why they could not be read.
    pub(in crate::console) queue: Result<QueueCounts, String>,
    /// Why the journal could not be read, if it could not.
    pub(in crate::console) journal_error: Option<String>,
    pub(in crate::console) skipped_lines: usize,
}

impl Sources {
    pub(in crate::console) async fn new(resources: ConsoleResources) -> Self {
        let sdk = load_sdk_config().await;
        Self {
            store: DynamoSubscriptionStore::from_sdk(&sdk, resources.tables.clone()),
            health: DynamoDeliveryStateStore::from_sdk(&sdk, resources.delivery_state_table),
            sqs: aws_sdk_sqs::Client::new(&sdk),
            journal: S3JournalSource::new(
                s3_client(&sdk),
                &resources.journal_bucket,
                JOURNAL_PREFIX,
            ),
            objects: S3ObjectStore::new(s3_client(&sdk)),
            delivery_queue: resources.delivery_queue,
            queue_key_secret: resources.queue_key_secret,
            journal_stream: resources.journal_stream,
            journal_buffer: tokio::sync::OnceCell::new(),
            secrets: SecretsManagerStore::from_sdk(&sdk),
            secret_prefix: resources.secret_prefix,
            tables: resources.tables.clone(),
            replays: resources.replays,
            portal: resources.portal,
            sdk,
        }
    }

    /// What the journal holds from `since` to `now`.
    pub(in crate::console) async fn journal(
        &self,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> anyhow::Result<JournalRead> {
        self.journal
            .read_hours(since, now)
            .await
            .context("could not read the delivery journal")
    }

    /// The journal's objects written since `since` (as their names say), in the order
    /// written: what the live page follows.
    pub(in crate::console) async fn journal_written_since(
        &self,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> anyhow::Result<Vec<JournalObject>> {
        self.journal
            .objects_written_since(since, now)
            .await
            .context("could not read the delivery journal")
    }

    /// The journal's stream, if known, and how long it gathers entries before it writes
    /// them (its buffering interval), or why that is not known.
    pub(in crate::console) async fn journal_buffer(
        &self,
    ) -> (Option<&str>, &Result<Option<std::time::Duration>, String>) {
        let stream = self.journal_stream.as_deref();
        let buffer = self
            .journal_buffer
            .get_or_init(|| async {
                match stream {
                    None => Err(
                        "the journal's stream is not known (give --journal-stream, or \
                         set GRIDRELAY_JOURNAL_STREAM to the stack's JournalStreamName output)"
                            .to_string(),
                    ),
                    Some(stream) => buffering_interval(&self.sdk, stream).await.map_err(|e| {
                        format!("the journal's stream {stream} could not be read: {e}")
                    }),
                }
            })
            .await;
        (stream, buffer)
    }

    /// The overview: every topic's subscriptions, their state and their last hour.
    pub(in crate::console) async fn overview(
        &self,
        now: DateTime<Utc>,
    ) -> anyhow::Result<Overview> {
        let window = Window {
            from: now - chrono::Duration::hours(1),
            to: now,
            slices: 12,
        };
        let mut topics = self.store.list_topics().await.map_err(store_error)?;
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        let (read, journal_error) = match self.journal(window.from, now).await {
            Ok(read) => (read, None),
            Err(e) => (JournalRead::default(), Some(format!("{e:#}"))),
        };
        let mut activities = activity(&read.entries, window);
        let mut out = Vec::new();
        for topic in topics {
            let mut subs = self
                .store
                .list_subscriptions(&topic.name)
                .await
                .map_err(store_error)?;
            subs.sort_by(|a, b| a.name.cmp(&b.name));
            let healths = self.healths_of(&subs).await;
            let rows = subs
                .into_iter()
                .zip(healths)
                .map(|(sub, (endpoint, host))| {
                    let activity = activities
                        .remove(&(sub.topic.clone(), sub.name.clone()))
                        .unwrap_or_else(|| Activity {
                            slices: vec![Default::default(); window.slices],
                            ..Activity::default()
                        });
                    SubscriptionRow {
                        state: DeliveryState::of(&sub, endpoint.as_ref(), host.as_ref(), now),
                        health: endpoint,
                        sub,
                        activity,
                    }
                })
                .collect();
            out.push((topic, rows));
        }
        let queue = crate::subscription::queue_counts(&self.sqs, &self.delivery_queue)
            .await
            .map_err(|e| format!("{e:#}"));
        Ok(Overview {
            window,
            topics: out,
            queue,
            journal_error,
            skipped_lines: read.skipped,
        })
    }

    /// Every topic's name, in order.
    pub(in crate::console) async fn topic_names(&self) -> anyhow::Result<Vec<String>> {
        let mut names: Vec<String> = self
            .store
            .list_topics()
            .await
            .map_err(store_error)?
            .into_iter()
            .map(|t| t.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// The health records of each subscription's endpoint and of its host, read together
    /// (`None` for both where they could not be read).
    async fn healths_of(
        &self,
        subs: &[Subscription],
    ) -> Vec<(Option<EndpointHealth>, Option<EndpointHealth>)> {
        let hosts: Vec<Option<String>> = subs
            .iter()
            .map(|s| gridrelay_shared::health::origin_health_key(&s.endpoint))
            .collect();
        let keys: Vec<String> = subs
            .iter()
            .map(|s| s.endpoint.clone())
            .chain(hosts.iter().flatten().cloned())
            .collect();
        let Ok(read) = self.health.endpoint_healths(&keys).await else {
            return vec![(None, None); subs.len()];
        };
        let (endpoints, mut host_records) = read.split_at(subs.len());
        endpoints
            .iter()
            .zip(&hosts)
            .map(|(endpoint, host)| {
                let host = host.as_ref().and_then(|_| {
                    let (first, rest) = host_records.split_first()?;
                    host_records = rest;
                    Some(*first)
                });
                (Some(*endpoint), host)
            })
            .collect()
    }

    /// One subscription, or `None` if it does not exist.
    pub(in crate::console) async fn subscription(
        &self,
        topic: &str,
        name: &str,
    ) -> anyhow::Result<Option<Subscription>> {
        self.store
            .get_subscription(topic, name)
            .await
            .map_err(store_error)
    }

    /// `show`'s `deliveryStatus` of a subscription.
    pub(in crate::console) async fn delivery_status(
        &self,
        sub: &Subscription,
    ) -> serde_json::Value {
        let status = crate::subscription::StatusSources {
            health: &self.health,
            sqs: &self.sqs,
            delivery_queue: &self.delivery_queue,
        };
        crate::subscription::delivery_status(&status, sub).await
    }

    /// The health records behind a subscription's state.
    pub(in crate::console) async fn state_of(
        &self,
        sub: &Subscription,
        now: DateTime<Utc>,
    ) -> DeliveryState {
        gridrelay_ports::delivery_state(&self.health, sub, now).await
    }

    /// A subscription's attempts since `since`, newest first, as `event-subscription
    /// attempts` lists them.
    pub(in crate::console) async fn attempts(
        &self,
        topic: &str,
        name: &str,
        since: DateTime<Utc>,
        failed: bool,
        top: usize,
        now: DateTime<Utc>,
    ) -> anyhow::Result<Vec<JournalEntry>> {
        let read = self.journal(since, now).await?;
        Ok(
            latest_attempts(&read.entries, topic, name, failed, usize::MAX)
                .into_iter()
                .filter(|e| e.time >= since)
                .take(top)
                .cloned()
                .collect(),
        )
    }

    /// An event's life, as `event show` tells it.
    pub(in crate::console) async fn event_life(
        &self,
        topic: &str,
        id: &str,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> anyhow::Result<EventLife> {
        let read = self.journal(since, now).await?;
        Ok(EventLife::of(topic, id, &read.entries))
    }

    /// `event-subscription signing-secret rotate` with a new random secret: the subscription
    /// as written and the secret (shown once; the console keeps it nowhere).
    pub(in crate::console) async fn rotate_signing_secret(
        &self,
        sub: &Subscription,
        grace: std::time::Duration,
        now: DateTime<Utc>,
    ) -> anyhow::Result<(Subscription, SigningSecret)> {
        let secret = SigningSecret::generate();
        let keys = SigningKeys {
            store: &self.store,
            secrets: &self.secrets,
            secret_prefix: &self.secret_prefix,
        };
        let sub = rotate_signing_secret(&keys, (&sub.topic, &sub.name), &secret, grace, now)
            .await
            .map_err(crate::subscription::registration_error)?;
        Ok((sub, secret))
    }

    /// Whether portal links can be made (the portal key's secret is known).
    pub(in crate::console) fn makes_portal_links(&self) -> bool {
        self.portal.is_some()
    }

    /// `event-subscription portal-link` for `sub`, `lifetime` (checked already) and
    /// `view_only`: the signed link and its grant.
    pub(in crate::console) async fn portal_link(
        &self,
        sub: &Subscription,
        terms: (chrono::TimeDelta, bool),
    ) -> anyhow::Result<(String, gridrelay_shared::portal::PortalGrant)> {
        let places = self.portal.as_ref().context(
            "the portal key's secret is not known: give --portal-key-secret (or set \
             GRIDRELAY_PORTAL_KEY_SECRET) to the stack's PortalKeySecret output",
        )?;
        crate::portal::signed_link(
            &self.sdk,
            &self.store,
            (&places.portal_url, &places.key_secret),
            (&sub.topic, &sub.name),
            terms,
        )
        .await
    }

    /// Where `replay start` finds what it needs, or why replays cannot be started.
    fn replay_resources(&self) -> anyhow::Result<ReplayResources<'_>> {
        let table = self.replays.table.clone().context(
            "the replays' table is not known: give --replays-table (or set \
             GRIDRELAY_REPLAYS_TABLE) to the stack's ReplaysTableName output",
        )?;
        Ok(ReplayResources {
            tables: self.tables.clone(),
            replays_table: table,
            archive_stream: self.replays.archive_stream.clone(),
            queues: OwnQueues {
                delivery: &self.delivery_queue,
                control: self.replays.control_queue.as_deref(),
                replay: self.replays.replay_queue.as_deref(),
                key_secret: self.queue_key_secret.as_deref(),
            },
        })
    }

    /// `replay start`'s checks of `request`: the replay it would start (nothing stored).
    pub(in crate::console) async fn plan_replay(
        &self,
        request: &ReplayRequest<'_>,
        now: DateTime<Utc>,
    ) -> anyhow::Result<Replay> {
        let resources = self.replay_resources()?;
        plan_replay(request, &resources, &self.sdk, now).await
    }

    /// `replay start` of a planned replay: stored, its first step sent.
    pub(in crate::console) async fn start_replay(
        &self,
        replay: &Replay,
        now: DateTime<Utc>,
    ) -> anyhow::Result<()> {
        let resources = self.replay_resources()?;
        let replays = DynamoReplayStore::from_sdk(&self.sdk, &resources.replays_table);
        start_replay(replay, &resources, &self.sdk, &replays, now).await
    }

    /// `redrive dead-letters` of what `selection` picks (a dry run lists it).
    pub(in crate::console) async fn redrive(
        &self,
        selection: &DeadLetterSelection,
        dry_run: bool,
    ) -> anyhow::Result<DeadLetterRedriveReport> {
        let now = Utc::now();
        // A dry run sends nothing: no key is needed for it.
        if dry_run {
            let queue = crate::subscription::NoControlQueue;
            return Ok(redrive_dead_letters(
                &self.store,
                &self.objects,
                &queue,
                selection,
                true,
                now,
            )
            .await?);
        }
        let queues = OwnQueues {
            delivery: &self.delivery_queue,
            control: None,
            replay: None,
            key_secret: self.queue_key_secret.as_deref(),
        };
        let queue = SqsQueue::new(
            self.sqs.clone(),
            delivery_queue_url(&self.sqs, &self.delivery_queue).await?,
            queues.key(&self.sdk).await?,
        );
        Ok(redrive_dead_letters(&self.store, &self.objects, &queue, selection, false, now).await?)
    }
}
