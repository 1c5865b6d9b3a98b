//! `gridrelay topic`: topics, the named publish endpoints with two keys, and their keys.

use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use gridrelay_adapters::aws::{DynamoSubscriptionStore, load_sdk_config};
use gridrelay_adapters::config::TableNames;
use gridrelay_ports::SubscriptionStore;
use gridrelay_shared::archive::{archive_class, validate_retention_class, validate_retention_days};
use gridrelay_shared::dedup::validate_dedup_window;
use gridrelay_shared::limits::{LimitError, validate_topic_name};
use gridrelay_shared::schema::{InputMapping, InputSchema};
use gridrelay_shared::subscription::{Topic, parse_tags};
use serde_json::json;

use crate::view::{topic_view, topics_table};
use crate::{OutputFormat, invalid, print, print_as, store_error};

#[derive(Subcommand)]
pub(super) enum TopicCommand {
    /// Create a topic; prints its publish endpoint and keys.
    Create(CreateTopic),
    /// Change a topic's tags, archive retention or deduplication window (its keys have their own commands; a topic's
    /// input schema is fixed, as in Event Grid).
    Update(UpdateTopic),
    /// Show a topic.
    Show(TopicName),
    /// List topics.
    List,
    /// Delete a topic.
    Delete(TopicName),
    /// Topic keys.
    #[command(subcommand)]
    Key(KeyCommand),
}

#[derive(Subcommand)]
pub(super) enum KeyCommand {
    /// Print both keys of a topic.
    List(TopicName),
    /// Replace one key with a new random one (the other keeps working meanwhile); prints both.
    Regenerate(RegenerateKey),
}

#[derive(Args)]
pub(super) struct RegenerateKey {
    #[arg(long)]
    name: String,
    /// Which key to replace.
    #[arg(long, value_parser = ["key1", "key2"])]
    key_name: String,
}

#[derive(Args)]
pub(super) struct CreateTopic {
    /// Topic name: 3 to 50 letters, digits and '-'.
    #[arg(long)]
    name: String,
    /// What publishers send: eventgridschema (default), cloudeventschemav1_0 or
    /// customeventschema.
    #[arg(long)]
    input_schema: Option<String>,
    /// Custom schema: which field of your events fills each envelope field, as KEY=FIELD with
    /// KEY one of id, topic, eventtime, subject, eventtype, dataversion.
    #[arg(long, num_args = 1..)]
    input_mapping_fields: Vec<String>,
    /// Custom schema: values used when an event lacks the mapped field, as KEY=VALUE with KEY
    /// one of subject, eventtype, dataversion.
    #[arg(long, num_args = 1..)]
    input_mapping_default_values: Vec<String>,
    /// Tags, KEY=VALUE: at most 50, keys of 1 to 512 characters, values of at most 256.
    #[arg(long, num_args = 1..)]
    tags: Vec<String>,
    /// Days the topic's archive keeps what it accepts, for `gridrelay replay`: 0 (no archive,
    /// the default) to 365.
    #[arg(long, allow_negative_numbers = true)]
    retention_days: Option<i64>,
    /// Seconds within which an event id the topic accepted is answered 200 and not delivered
    /// again (P1): 0 (off, the default) to 300. A CloudEvent is known by its source and id;
    /// custom events only by a mapped id.
    #[arg(long, allow_negative_numbers = true)]
    dedup_window_seconds: Option<i64>,
}

#[derive(Args)]
#[group(id = "change", required = true, multiple = true, args = ["tags", "retention_days", "dedup_window_seconds"])]
pub(super) struct UpdateTopic {
    #[arg(long)]
    name: String,
    /// The topic's tags from now on, KEY=VALUE (replacing the stored ones; the flag alone
    /// removes them).
    #[arg(long, num_args = 0..)]
    tags: Option<Vec<String>>,
    /// Days the topic's archive keeps what it accepts from now on: 0 (stop archiving) to 365.
    /// A shorter retention also shortens what a replay can reach.
    #[arg(long, allow_negative_numbers = true)]
    retention_days: Option<i64>,
    /// The deduplication window from now on: 0 (off) to 300 seconds. It applies to the ids
    /// already marked (each keeps the time it was accepted); ids accepted while it was off
    /// were not marked.
    #[arg(long, allow_negative_numbers = true)]
    dedup_window_seconds: Option<i64>,
}

/// What `topic update` changes, checked.
struct TopicChanges {
    tags: Option<Tags>,
    retention_days: Option<u16>,
    dedup_window_seconds: Option<u16>,
}

impl UpdateTopic {
    /// The new settings, checked.
    fn changes(&self) -> Result<TopicChanges, LimitError> {
        Ok(TopicChanges {
            tags: self.tags.as_deref().map(parse_tags).transpose()?,
            retention_days: self
                .retention_days
                .map(validate_retention_days)
                .transpose()?,
            dedup_window_seconds: self
                .dedup_window_seconds
                .map(validate_dedup_window)
                .transpose()?,
        })
    }
}

type Tags = std::collections::BTreeMap<String, String>;

impl CreateTopic {
    fn topic(&self) -> Result<Topic, LimitError> {
        validate_topic_name(&self.name)?;
        let schema = match &self.input_schema {
            Some(s) => s.parse()?,
            None => InputSchema::default(),
        };
        let mapping = (!self.input_mapping_fields.is_empty()
            || !self.input_mapping_default_values.is_empty())
        .then(|| {
            InputMapping::from_pairs(
                &self.input_mapping_fields,
                &self.input_mapping_default_values,
            )
        })
        .transpose()?;
        let tags = parse_tags(&self.tags)?;
        let retention_days = self
            .retention_days
            .map(validate_retention_days)
            .transpose()?
            .unwrap_or(0);
        let dedup_window_seconds = self
            .dedup_window_seconds
            .map(validate_dedup_window)
            .transpose()?
            .unwrap_or(0);
        Ok(Topic {
            tags,
            retention_days,
            dedup_window_seconds,
            ..Topic::with_new_keys(&self.name, chrono::Utc::now())
                .with_input_schema(schema, mapping)?
        })
    }
}

#[derive(Args)]
pub(super) struct TopicName {
    /// Topic name: 3 to 50 letters, digits and '-'.
    #[arg(long)]
    name: String,
}

/// `gridrelay topic`: the names and a new topic checked before the store is opened (a
/// retention against how long the installation keeps archives, read from `journal_bucket`),
/// then the command run against the store.
pub(super) async fn run_topic(
    cmd: TopicCommand,
    tables: TableNames,
    publish_url: &str,
    output: OutputFormat,
    journal_bucket: Option<String>,
) -> anyhow::Result<()> {
    if let TopicCommand::Show(t) | TopicCommand::Delete(t) = &cmd {
        validate_topic_name(&t.name).map_err(invalid)?;
    }
    let mut retention = None;
    if let TopicCommand::Update(t) = &cmd {
        validate_topic_name(&t.name).map_err(invalid)?;
        retention = t.changes().map_err(invalid)?.retention_days;
    }
    let new_topic = match &cmd {
        TopicCommand::Create(c) => Some(c.topic().map_err(invalid)?),
        _ => None,
    };
    if let Some(days) = retention.or(new_topic.as_ref().map(|t| t.retention_days)) {
        check_archive_class(days, journal_bucket.as_deref()).await?;
    }
    let store = open_store(tables).await;
    topic_command(store.as_ref(), publish_url, output, cmd, new_topic).await
}

/// A topic's retention of `days` against the installation: its journal bucket must expire the
/// retention's archive class ([`crate::archive::class_expiry`]); unchecked where the rules
/// cannot be read.
async fn check_archive_class(days: u16, bucket: Option<&str>) -> anyhow::Result<()> {
    let Some(class) = archive_class(days) else {
        return Ok(());
    };
    let sdk = load_sdk_config().await;
    match crate::archive::class_expiry(&sdk, bucket, class).await {
        Ok(kept) => validate_retention_class(days, kept).map_err(invalid),
        Err(()) => Ok(()),
    }
}

pub(super) async fn open_store(tables: TableNames) -> Arc<dyn SubscriptionStore> {
    let sdk = load_sdk_config().await;
    Arc::new(DynamoSubscriptionStore::from_sdk(&sdk, tables))
}

async fn topic_command(
    store: &dyn SubscriptionStore,
    publish_url: &str,
    output: OutputFormat,
    cmd: TopicCommand,
    new_topic: Option<Topic>,
) -> anyhow::Result<()> {
    let one = |topic: &Topic, with_keys: bool| {
        print_as(output, &topic_view(topic, publish_url, with_keys), || {
            let table = topics_table(std::slice::from_ref(topic), publish_url);
            if with_keys {
                format!("{table}\n\nkey1: {}\nkey2: {}", topic.key1, topic.key2)
            } else {
                table
            }
        })
    };
    match cmd {
        TopicCommand::Create(_) => {
            let topic = new_topic.context("topic was not validated")?;
            store.create_topic(&topic).await.map_err(store_error)?;
            one(&topic, true)
        }
        TopicCommand::Show(TopicName { name }) => {
            let topic = existing_topic(store, &name).await?;
            one(&topic, false)
        }
        TopicCommand::Update(update) => {
            let changes = update.changes().map_err(invalid)?;
            let mut topic = existing_topic(store, &update.name).await?;
            if let Some(tags) = changes.tags {
                topic.tags = tags;
            }
            if let Some(days) = changes.retention_days {
                topic.retention_days = days;
            }
            if let Some(seconds) = changes.dedup_window_seconds {
                topic.dedup_window_seconds = seconds;
            }
            store.replace_topic(&topic).await.map_err(store_error)?;
            one(&topic, false)
        }
        TopicCommand::Key(KeyCommand::List(TopicName { name })) => {
            let topic = existing_topic(store, &name).await?;
            print(&json!({"key1": topic.key1, "key2": topic.key2}))
        }
        TopicCommand::Key(KeyCommand::Regenerate(RegenerateKey { name, key_name })) => {
            let mut topic = existing_topic(store, &name).await?;
            if key_name == "key1" {
                topic.key1 = Topic::new_key();
            } else {
                topic.key2 = Topic::new_key();
            }
            store.replace_topic(&topic).await.map_err(store_error)?;
            print(&json!({"key1": topic.key1, "key2": topic.key2}))
        }
        TopicCommand::List => {
            let topics = store.list_topics().await.map_err(store_error)?;
            let views: Vec<_> = topics
                .iter()
                .map(|t| topic_view(t, publish_url, false))
                .collect();
            print_as(output, &json!(views), || topics_table(&topics, publish_url))
        }
        TopicCommand::Delete(TopicName { name }) => {
            if !store
                .list_subscriptions(&name)
                .await
                .map_err(store_error)?
                .is_empty()
            {
                bail!("topic {name} still has event subscriptions; delete them first");
            }
            if !store.delete_topic(&name).await.map_err(store_error)? {
                bail!("topic {name} does not exist");
            }
            print(&json!({"deleted": name}))
        }
    }
}

pub(super) async fn existing_topic(
    store: &dyn SubscriptionStore,
    name: &str,
) -> anyhow::Result<Topic> {
    store
        .get_topic(name)
        .await
        .map_err(store_error)?
        .with_context(|| format!("topic {name} does not exist"))
}
