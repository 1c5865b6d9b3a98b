//! `gridrelay`: manage topics and event subscriptions (mirroring `az eventgrid`), and run the
//! whole system locally.
//!
//! Every limit is checked before any AWS call, and a refused value is reported with its flag,
//! the value and the allowed range.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use gridrelay_adapters::aws::{
    AwsResourceSender, DynamoDeliveryStateStore, DynamoSubscriptionStore, S3ObjectStore,
    SecretsManagerStore, SqsQueue, describe_error, load_sdk_config, queue_key, s3_client,
};
use gridrelay_adapters::config::{self, TableNames};
use gridrelay_adapters::outbound::SystemResolver;
use gridrelay_local::{LocalSystem, ResourceNames, RunnerConfig};
use gridrelay_ports::endpoints::EndpointCheck;
use gridrelay_ports::redrive::{
    DeadLetterSelection, QueueKind, redrive_dead_letters, redrive_queue,
};
use gridrelay_ports::registration::{RegistrationError, Registry};
use gridrelay_ports::{
    DeliveryStateStore, MessageQueue, OutgoingMessage, QueueError, ReceivedMessage, StoreError,
    SubscriptionStore,
};
use gridrelay_shared::delivery_attributes::DeliveryAttributeRequest;
use gridrelay_shared::destination::AllowedDestinations;
use gridrelay_shared::filter::{AdvancedFilter, EventFilter};
use gridrelay_shared::limits::{LimitError, validate_subscription_name, validate_topic_name};
use gridrelay_shared::outbound::{AllowedNetworks, OutboundPolicy, redact_endpoint};
use gridrelay_shared::queue_seal::QueueKey;
use gridrelay_shared::schema::{InputMapping, InputSchema};
use gridrelay_shared::signing::SigningSecret;
use gridrelay_shared::subscription::{
    Handshake, Subscription, SubscriptionRequest, SubscriptionUpdate, Topic, Updated,
    parse_expiration, parse_tags,
};
use gridrelay_shared::validation::ProvisioningState;

mod view;
use gridrelay_shared::time_scale::TimeScale;
use serde_json::json;
use view::{subscription_view, subscriptions_table, topic_view, topics_table};

#[derive(Parser)]
#[command(
    name = "gridrelay",
    version,
    about = "Event Grid's delivery contract on AWS: topics, subscriptions and a local runner"
)]
struct Cli {
    /// DynamoDB table of topics.
    #[arg(
        long,
        global = true,
        env = config::TOPICS_TABLE_ENV,
        default_value = config::DEFAULT_TOPICS_TABLE
    )]
    topics_table: String,
    /// DynamoDB table of event subscriptions.
    #[arg(
        long,
        global = true,
        env = config::SUBSCRIPTIONS_TABLE_ENV,
        default_value = config::DEFAULT_SUBSCRIPTIONS_TABLE
    )]
    subscriptions_table: String,
    /// Base URL of the publish API (API Gateway's URL on AWS, `gridrelay local`'s locally).
    #[arg(
        long,
        global = true,
        env = "GRIDRELAY_PUBLISH_URL",
        default_value = "http://127.0.0.1:7071"
    )]
    publish_url: String,
    /// DynamoDB table of endpoint health, where `event-subscription show` reads how delivery
    /// to the endpoint goes.
    #[arg(
        long,
        global = true,
        env = config::DELIVERY_STATE_TABLE_ENV,
        default_value = config::DEFAULT_DELIVERY_STATE_TABLE
    )]
    delivery_state_table: String,
    /// Name prefix of the Secrets Manager secrets holding secret delivery header values.
    #[arg(
        long,
        global = true,
        env = config::SECRET_PREFIX_ENV,
        default_value = config::DEFAULT_SECRET_PREFIX
    )]
    secret_prefix: String,
    /// The delivery queue (a URL, or a queue name to look up), where `event-subscription
    /// create` asks the service for the endpoint validation handshake.
    #[arg(
        long,
        global = true,
        env = config::DELIVERY_QUEUE_URL_ENV,
        default_value = "gridrelay-delivery"
    )]
    delivery_queue: String,
    /// The Secrets Manager secret (ARN or name) holding the key gridrelay seals its queue
    /// messages with: the stack's QueueKeySecret output. What the command line sends to the
    /// delivery queue (handshake steps, redriven messages) must carry its seal. Default:
    /// `<prefix>-queue-key` beside a delivery queue named `<prefix>-delivery` (a local
    /// installation).
    #[arg(long, global = true, env = config::QUEUE_KEY_SECRET_ENV)]
    queue_key_secret: Option<String>,
    /// Networks (comma-separated CIDRs) endpoints may be in although not public, where plain
    /// http:// is allowed too. Default for `local`: loopback. Default for `event-subscription
    /// create`: loopback when AWS_ENDPOINT_URL is on this machine (a local stack), else none;
    /// give the stack's AllowedNetworks on AWS.
    #[arg(long, global = true, env = config::ALLOWED_NETWORKS_ENV)]
    allowed_networks: Option<String>,
    /// AWS resources (ARNs or ARN patterns, `*` and `?` as in IAM, comma-separated) events
    /// may be delivered to: an `--endpoint-type` other than webhook must name one. Default:
    /// every one when AWS_ENDPOINT_URL is on this machine (a local stack), else none; give
    /// the stack's DeliveryDestinationArns on AWS.
    #[arg(long, global = true, env = config::DELIVERY_DESTINATIONS_ENV)]
    delivery_destinations: Option<String>,
    /// What topics and event subscriptions are printed as: json (shaped like `az
    /// eventgrid`'s) or table.
    #[arg(long, short = 'o', global = true, value_enum, default_value = "json")]
    output: OutputFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Topics: named publish endpoints with two keys.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Event subscriptions: which endpoint gets a topic's events, and how.
    #[command(subcommand, name = "event-subscription")]
    EventSubscription(SubscriptionCommand),
    /// Run the publish API and the delivery and dead-letter workers against AWS_ENDPOINT_URL.
    Local(LocalArgs),
    /// Move parked or dead-lettered events back into delivery.
    #[command(subcommand)]
    Redrive(RedriveCommand),
}

#[derive(Subcommand)]
enum RedriveCommand {
    /// Move the messages of a redrive queue (where SQS parks messages whose processing kept
    /// failing) back to the queue they came from; messages that cannot be read stay.
    Queue(RedriveQueueArgs),
    /// Deliver dead-lettered events again: read a topic's dead-letter objects, pick records by
    /// subscription, time and reason, enqueue their events as new deliveries (attempts and TTL
    /// start again), and take them out of their objects.
    DeadLetters(RedriveDeadLettersArgs),
}

#[derive(Args)]
struct RedriveQueueArgs {
    /// Redrive the dead-letter queue's redrive queue (dead-letter messages back to the
    /// dead-letter queue) instead of the delivery queue's.
    #[arg(long)]
    dead_letter: bool,
    /// The redrive queue: a URL, or a name to look up (default <prefix>-delivery-redrive, or
    /// <prefix>-dead-letter-redrive with --dead-letter, where the delivery queue is
    /// <prefix>-delivery).
    #[arg(long)]
    from: Option<String>,
    /// Where its messages go back to (a URL or name); default: the delivery queue
    /// (--delivery-queue), or <prefix>-dead-letter with --dead-letter.
    #[arg(long)]
    to: Option<String>,
    /// Report what would move; move nothing.
    #[arg(long)]
    dry_run: bool,
    /// Move at most this many messages.
    #[arg(long, default_value_t = 10_000)]
    max_messages: usize,
}

#[derive(Args)]
struct RedriveDeadLettersArgs {
    #[arg(long)]
    topic_name: String,
    /// One subscription (default: every subscription of the topic with a dead-letter
    /// destination).
    #[arg(long)]
    name: Option<String>,
    /// Only objects of hours that end after this time (RFC 3339, e.g. 2026-11-23T10:00:00Z).
    #[arg(long)]
    since: Option<String>,
    /// Only objects of hours that begin before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    /// Only records with this deadLetterReason (e.g. MaxDeliveryAttemptsExceeded); repeat for
    /// more.
    #[arg(long)]
    reason: Vec<String>,
    /// Report what would move; change nothing.
    #[arg(long)]
    dry_run: bool,
}

impl RedriveDeadLettersArgs {
    fn selection(&self) -> Result<DeadLetterSelection, LimitError> {
        validate_topic_name(&self.topic_name)?;
        let time = |flag: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|v| {
                    chrono::DateTime::parse_from_rfc3339(v)
                        .map(|t| t.to_utc())
                        .map_err(|_| {
                            LimitError::new(
                                flag,
                                format!("{v:?}"),
                                "an RFC 3339 time, e.g. 2026-11-23T10:00:00Z",
                            )
                        })
                })
                .transpose()
        };
        let since = time("since", &self.since)?;
        let until = time("until", &self.until)?;
        if let (Some(s), Some(u)) = (since, until)
            && s >= u
        {
            return Err(LimitError::new(
                "until",
                u.to_rfc3339(),
                format!("a time after --since ({})", s.to_rfc3339()),
            ));
        }
        Ok(DeadLetterSelection {
            topic: self.topic_name.clone(),
            subscription: self.name.clone(),
            since,
            until,
            reasons: self.reason.clone(),
        })
    }
}

#[derive(Subcommand)]
enum TopicCommand {
    /// Create a topic; prints its publish endpoint and keys.
    Create(CreateTopic),
    /// Change a topic's tags (its schema and keys have their own commands: a topic's input
    /// schema is fixed, as in Event Grid).
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
enum KeyCommand {
    /// Print both keys of a topic.
    List(TopicName),
    /// Replace one key with a new random one (the other keeps working meanwhile); prints both.
    Regenerate(RegenerateKey),
}

#[derive(Args)]
struct RegenerateKey {
    #[arg(long)]
    name: String,
    /// Which key to replace.
    #[arg(long, value_parser = ["key1", "key2"])]
    key_name: String,
}

#[derive(Args)]
struct CreateTopic {
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
}

#[derive(Args)]
struct UpdateTopic {
    #[arg(long)]
    name: String,
    /// The topic's tags from now on, KEY=VALUE (replacing the stored ones; the flag alone
    /// removes them).
    #[arg(long, num_args = 0.., required = true)]
    tags: Vec<String>,
}

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
        Ok(Topic {
            tags,
            ..Topic::with_new_keys(&self.name, chrono::Utc::now())
                .with_input_schema(schema, mapping)?
        })
    }
}

#[derive(Args)]
struct TopicName {
    /// Topic name: 3 to 50 letters, digits and '-'.
    #[arg(long)]
    name: String,
}

#[derive(Subcommand)]
enum SubscriptionCommand {
    /// Create an event subscription.
    Create(Box<CreateSubscription>),
    /// Change an event subscription: each setting given replaces the stored one (as `create`
    /// takes it); the rest stay.
    Update(Box<UpdateSubscription>),
    /// Show an event subscription.
    Show(SubscriptionName),
    /// List a topic's event subscriptions.
    List(ListSubscriptions),
    /// Delete an event subscription.
    Delete(SubscriptionName),
    /// Signed deliveries (Standard Webhooks).
    #[command(subcommand)]
    SigningSecret(SigningSecretCommand),
}

#[derive(Args)]
struct ListSubscriptions {
    #[arg(long)]
    topic_name: String,
    /// At most this many, in name order (a page); a note on stderr gives the --skip-token of
    /// the next page.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    top: Option<u64>,
    /// Start after this subscription name (the note of the page before gives it).
    #[arg(long)]
    skip_token: Option<String>,
}

/// One page of a list: its items, and where the next page starts if there is one.
struct Page<T> {
    items: Vec<T>,
    next: Option<String>,
}

/// The subscriptions after `skip_token` (names in order), at most `top` of them.
fn list_page(
    subs: Vec<Subscription>,
    skip_token: Option<&str>,
    top: Option<u64>,
) -> Page<Subscription> {
    let top = top.map(|t| usize::try_from(t).unwrap_or(usize::MAX));
    let mut rest: Vec<Subscription> = subs
        .into_iter()
        .filter(|s| skip_token.is_none_or(|after| s.name.as_str() > after))
        .collect();
    let next = match top {
        Some(top) if rest.len() > top => {
            rest.truncate(top);
            rest.last().map(|s| s.name.clone())
        }
        _ => None,
    };
    Page { items: rest, next }
}

/// What `--output` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OutputFormat {
    /// JSON shaped like `az eventgrid`'s.
    Json,
    /// A table, for people.
    Table,
}

#[derive(Subcommand)]
enum SigningSecretCommand {
    /// Sign with a new secret from now on; the current one keeps signing beside it for the
    /// grace period, so subscribers can switch without missing a delivery. Starts signing a
    /// subscription that did not sign. Prints the new secret.
    Rotate(RotateSigningSecret),
}

#[derive(Args)]
struct RotateSigningSecret {
    #[arg(long)]
    topic_name: String,
    #[arg(long)]
    name: String,
    /// The new secret: generate (default), or a whsec_… value.
    #[arg(long, default_value = gridrelay_shared::signing::GENERATE)]
    signing_secret: String,
    /// Hours the current secret keeps signing beside the new one, 0 to 168.
    #[arg(long, default_value_t = 24)]
    grace_period_hours: u64,
}

#[derive(Args)]
struct SubscriptionName {
    #[arg(long)]
    topic_name: String,
    #[arg(long)]
    name: String,
}

#[derive(Args)]
struct CreateSubscription {
    #[arg(long)]
    topic_name: String,
    /// Subscription name: 3 to 64 letters, digits and '-'.
    #[arg(long)]
    name: String,
    /// Webhook URL events are POSTed to, or the ARN of the AWS resource they are written to
    /// (see --endpoint-type).
    #[arg(long)]
    endpoint: String,
    /// Return at once, without waiting for the endpoint validation handshake to end.
    #[arg(long)]
    no_wait: bool,
    #[command(flatten)]
    settings: SubscriptionSettings,
    /// Sign every delivery (Standard Webhooks: webhook-id, webhook-timestamp,
    /// webhook-signature): generate, or a whsec_… secret. Kept in Secrets Manager; a generated
    /// one is printed once, here.
    #[arg(long)]
    signing_secret: Option<String>,
}

#[derive(Args)]
struct UpdateSubscription {
    #[arg(long)]
    topic_name: String,
    #[arg(long)]
    name: String,
    /// A new webhook URL. It is validated with the handshake first: a subscription that has a
    /// validated endpoint keeps receiving there until the new one agrees, then switches.
    #[arg(long)]
    endpoint: Option<String>,
    /// Return at once, without waiting for a new endpoint's handshake to end.
    #[arg(long)]
    no_wait: bool,
    #[command(flatten)]
    settings: SubscriptionSettings,
}

/// What `create` and `update` both take. At `update`, each setting given replaces the stored
/// one and the rest stay.
#[derive(Args)]
struct SubscriptionSettings {
    /// What --endpoint is: webhook (default), or an AWS resource's ARN: sqs, sns, lambda,
    /// eventbridge or kinesis (unset, an ARN's service says). Resources have no validation
    /// handshake; they must exist and be among the installation's --delivery-destinations.
    /// An update keeps the type.
    #[arg(long)]
    endpoint_type: Option<String>,
    /// Events per delivery request, 1 to 5000 (default 1: batching off).
    #[arg(long, allow_negative_numbers = true)]
    max_events_per_batch: Option<i64>,
    /// Preferred size of a delivery request in kilobytes, 1 to 1024 (default 64).
    #[arg(long, allow_negative_numbers = true)]
    preferred_batch_size_in_kilobytes: Option<i64>,
    /// Attempts before giving up, 1 to 30 (default 30).
    #[arg(long, allow_negative_numbers = true)]
    max_delivery_attempts: Option<i64>,
    /// Event time to live in minutes, 1 to 1440 (default 1440).
    #[arg(long, allow_negative_numbers = true)]
    event_ttl: Option<i64>,
    /// The most requests in flight to this subscription at once, 1 to 1000 (default: no cap;
    /// each endpoint's own limit follows its answers). Held across every worker; delivery
    /// beyond it waits, is never dropped, and is not an attempt.
    #[arg(long, allow_negative_numbers = true)]
    max_concurrent_requests: Option<i64>,
    /// The most events delivered to this subscription per second, 1 to 100000 (default: no
    /// cap). Batches are spaced evenly by a schedule shared by every worker and hold at most
    /// this many events; delivery beyond it waits, is never dropped, and is not an attempt.
    #[arg(long, allow_negative_numbers = true)]
    max_events_per_second: Option<i64>,
    /// Where undeliverable events are written: s3://BUCKET[/PREFIX]. Unset: they are dropped
    /// (at update, "" removes it).
    #[arg(long)]
    deadletter_endpoint: Option<String>,
    /// Status-code classification table (S6): Latest (the newest revision, default),
    /// Revision2020 or Legacy2019 (which comes with its own retry ladder).
    #[arg(long)]
    status_table: Option<String>,
    /// The schema the endpoint receives: eventgridschema, cloudeventschemav1_0 or
    /// custominputschema (default: the topic's input schema).
    #[arg(long)]
    event_delivery_schema: Option<String>,
    /// Deliver only these event types (case-insensitive).
    #[arg(long, num_args = 1..)]
    included_event_types: Option<Vec<String>>,
    /// Deliver only events whose subject begins with this.
    #[arg(long)]
    subject_begins_with: Option<String>,
    /// Deliver only events whose subject ends with this.
    #[arg(long)]
    subject_ends_with: Option<String>,
    /// Compare subjects case-sensitively: true or false (default false).
    #[arg(long)]
    subject_case_sensitive: Option<bool>,
    /// An advanced filter, KEY OPERATOR [VALUE ...] (e.g. data.size NumberGreaterThan 1000);
    /// repeat the flag for more, at most 25, all must match (two on one key included); at most
    /// 25 values across all of them, strings at most 512 characters. The filter's words end at
    /// the next word starting with -- (values such as -5 or -50,-1 are values).
    #[arg(long, num_args = 2.., value_names = ["KEY", "OPERATOR"], action = clap::ArgAction::Append)]
    advanced_filter: Vec<String>,
    /// Let advanced filters look into array values element by element: true or false (default
    /// false, as in Event Grid; the flag alone means true).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    enable_advanced_filtering_on_arrays: Option<bool>,
    /// `--advanced-filter` occurrences, one per flag (filled from the matches after parsing).
    #[arg(skip)]
    advanced_filter_groups: Vec<Vec<String>>,
    /// A header sent with every delivery: NAME static VALUE [secret] (e.g. Authorization
    /// static "Bearer abc" secret); at most 10, values at most 4096 bytes. Secret values are
    /// kept in Secrets Manager and never shown.
    #[arg(long, num_args = 3..=4, value_names = ["NAME", "TYPE", "VALUE"],
          action = clap::ArgAction::Append)]
    delivery_attribute_mapping: Vec<String>,
    /// `--delivery-attribute-mapping` occurrences, one per flag.
    #[arg(skip)]
    delivery_attribute_groups: Vec<Vec<String>>,
    /// The user's own tags, kept and shown: at most 25, each 1 to 256 characters (at update,
    /// the flag alone removes them).
    #[arg(long, num_args = 0..)]
    labels: Option<Vec<String>>,
    /// When the subscription ends: it receives nothing from then on and is deleted, as in
    /// Event Grid. A date (2026-12-31, midnight UTC) or a time (2026-12-31T18:00:00Z); in the
    /// future (at update, "" removes it).
    #[arg(long)]
    expiration_date: Option<String>,
}

impl SubscriptionSettings {
    fn delivery_attributes(&self) -> Result<Vec<DeliveryAttributeRequest>, LimitError> {
        self.delivery_attribute_groups
            .iter()
            .map(|words| DeliveryAttributeRequest::parse(words))
            .collect()
    }

    fn advanced_filters(&self) -> Result<Vec<AdvancedFilter>, LimitError> {
        self.advanced_filter_groups
            .iter()
            .map(|words| match words.as_slice() {
                [key, operator, values @ ..] => AdvancedFilter::parse(key, operator, values),
                _ => Err(LimitError::new(
                    "advancedFilter",
                    words.join(" "),
                    "KEY OPERATOR [VALUE ...]",
                )),
            })
            .collect()
    }

    fn labels(&self) -> Vec<String> {
        self.labels.clone().unwrap_or_default()
    }

    /// The expiration given: `Some(None)` for "" (remove it).
    fn expiration(&self) -> Result<Option<Option<chrono::DateTime<chrono::Utc>>>, LimitError> {
        self.expiration_date
            .as_deref()
            .map(|text| {
                if text.trim().is_empty() {
                    Ok(None)
                } else {
                    parse_expiration(text).map(Some)
                }
            })
            .transpose()
    }

    /// The settings as a create asks for them.
    fn request(
        &self,
        topic: &str,
        name: &str,
        endpoint: &str,
        signing_secret: Option<&str>,
    ) -> Result<SubscriptionRequest, LimitError> {
        Ok(SubscriptionRequest {
            topic: topic.to_string(),
            name: name.to_string(),
            endpoint: endpoint.to_string(),
            endpoint_type: self.endpoint_type.clone(),
            max_events_per_batch: self.max_events_per_batch,
            preferred_batch_size_in_kilobytes: self.preferred_batch_size_in_kilobytes,
            max_delivery_attempts: self.max_delivery_attempts,
            event_ttl_minutes: self.event_ttl,
            max_concurrent_requests: self.max_concurrent_requests,
            max_events_per_second: self.max_events_per_second,
            dead_letter_destination: self.deadletter_endpoint.clone(),
            status_table: self.status_table.clone(),
            filter: self.filter()?,
            event_delivery_schema: self.event_delivery_schema.clone(),
            delivery_attributes: self.delivery_attributes()?,
            signing_secret: signing_secret.map(SigningSecret::from_flag).transpose()?,
            labels: self.labels(),
            expiration_time_utc: self.expiration()?.flatten(),
        })
    }

    /// The settings as an update gives them: only those on the command line.
    fn update(&self, endpoint: Option<&str>) -> Result<SubscriptionUpdate, LimitError> {
        Ok(SubscriptionUpdate {
            endpoint: endpoint.map(str::to_string),
            endpoint_type: self.endpoint_type.clone(),
            max_events_per_batch: self.max_events_per_batch,
            preferred_batch_size_in_kilobytes: self.preferred_batch_size_in_kilobytes,
            max_delivery_attempts: self.max_delivery_attempts,
            event_ttl_minutes: self.event_ttl,
            max_concurrent_requests: self.max_concurrent_requests,
            max_events_per_second: self.max_events_per_second,
            dead_letter_destination: self.deadletter_endpoint.clone(),
            status_table: self.status_table.clone(),
            event_delivery_schema: self.event_delivery_schema.clone(),
            included_event_types: self.included_event_types.clone(),
            subject_begins_with: self.subject_begins_with.clone(),
            subject_ends_with: self.subject_ends_with.clone(),
            subject_case_sensitive: self.subject_case_sensitive,
            advanced_filters: (!self.advanced_filter_groups.is_empty())
                .then(|| self.advanced_filters())
                .transpose()?,
            enable_advanced_filtering_on_arrays: self.enable_advanced_filtering_on_arrays,
            delivery_attributes: (!self.delivery_attribute_groups.is_empty())
                .then(|| self.delivery_attributes())
                .transpose()?,
            labels: self.labels.clone(),
            expiration_time_utc: self.expiration()?,
        })
    }

    fn filter(&self) -> Result<EventFilter, LimitError> {
        let advanced_filters = self.advanced_filters()?;
        Ok(EventFilter {
            included_event_types: self.included_event_types.clone(),
            subject_begins_with: self.subject_begins_with.clone(),
            subject_ends_with: self.subject_ends_with.clone(),
            is_subject_case_sensitive: self.subject_case_sensitive.unwrap_or(false),
            advanced_filters,
            enable_advanced_filtering_on_arrays: self
                .enable_advanced_filtering_on_arrays
                .unwrap_or(false),
        })
    }
}

#[derive(Args)]
struct LocalArgs {
    /// Address of the publish API.
    #[arg(long, default_value = "127.0.0.1:7071")]
    listen: SocketAddr,
    /// Prefix of every queue, table and bucket name.
    #[arg(long, default_value = "gridrelay")]
    prefix: String,
    /// Seconds a received message stays hidden while its handler runs; at least the function
    /// timeout.
    #[arg(long, default_value_t = gridrelay_local::DEFAULT_VISIBILITY_TIMEOUT_SECS)]
    visibility_timeout: u64,
    /// Receives before a message that keeps failing moves to its redrive queue.
    #[arg(long, default_value_t = gridrelay_local::DEFAULT_MAX_RECEIVE_COUNT)]
    max_receive_count: u32,
    /// Seconds one handler invocation may run, as a Lambda function's timeout (deliver's is
    /// 300 on AWS): the handler plans against it and is stopped at it.
    #[arg(long, default_value_t = gridrelay_local::DEFAULT_FUNCTION_TIMEOUT_SECS)]
    function_timeout: u64,
    /// Delivery requests each deliver instance has in flight at once, across endpoints (1 to
    /// 832; the deliver Lambda reads GRIDRELAY_MAX_REQUESTS_IN_FLIGHT). The runner runs one
    /// instance per concurrent invocation, as Lambda does.
    #[arg(long, env = gridrelay_local::MAX_REQUESTS_IN_FLIGHT_ENV, default_value_t = gridrelay_local::DEFAULT_MAX_REQUESTS_IN_FLIGHT)]
    max_requests_in_flight: u32,
    /// The most one endpoint gets at once (1 to the total; default: three quarters of the total); below it
    /// each endpoint's limit follows its answers.
    #[arg(long, env = gridrelay_local::MAX_REQUESTS_PER_ENDPOINT_ENV)]
    max_requests_per_endpoint: Option<u32>,
    /// Seconds the functions keep the topics, subscriptions and secret values they read (0 to
    /// 300, 0 keeps nothing; the Lambdas read GRIDRELAY_CONFIG_CACHE_SECONDS). A change made
    /// with this command line is in effect within this time.
    #[arg(long, env = gridrelay_ports::cache::CONFIG_CACHE_ENV, default_value = "10")]
    config_cache_seconds: String,
}

/// The flag a setting is given with.
fn flag_of(field: &str) -> &str {
    match field {
        "maxEventsPerBatch" => "--max-events-per-batch",
        "preferredBatchSizeInKilobytes" => "--preferred-batch-size-in-kilobytes",
        "maxDeliveryAttempts" => "--max-delivery-attempts",
        "eventTimeToLiveInMinutes" => "--event-ttl",
        "maxConcurrentRequests" => "--max-concurrent-requests",
        "maxEventsPerSecond" => "--max-events-per-second",
        "deadLetterDestination" => "--deadletter-endpoint",
        "statusTable" => "--status-table",
        "endpoint" => "--endpoint",
        "endpointType" => "--endpoint-type",
        "deliveryDestinations" => "--delivery-destinations",
        "topic name" => "--topic-name / --name",
        "event subscription name" => "--name",
        "includedEventTypes" => "--included-event-types",
        "inputSchema" => "--input-schema",
        "inputMappingFields" => "--input-mapping-fields",
        "inputMappingDefaultValues" => "--input-mapping-default-values",
        "eventDeliverySchema" => "--event-delivery-schema",
        f if f.starts_with("advancedFilter") => "--advanced-filter",
        "deliveryAttributeMapping" => "--delivery-attribute-mapping",
        "since" => "--since",
        "until" => "--until",
        "maxRequestsInFlight" => "--max-requests-in-flight",
        "maxRequestsPerEndpoint" => "--max-requests-per-endpoint",
        "signingSecret" => "--signing-secret",
        "labels" => "--labels",
        "expirationTimeUtc" => "--expiration-date",
        "tags" => "--tags",
        "gracePeriodHours" => "--grace-period-hours",
        gridrelay_shared::outbound::ALLOWED_NETWORKS_FIELD => "--allowed-networks",
        f if f.starts_with("configCacheSeconds") => "--config-cache-seconds",
        other => other,
    }
}

/// An input the command refuses; exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("invalid {flag}: {problem}")]
struct InvalidInput {
    flag: String,
    problem: LimitError,
}

fn invalid(e: LimitError) -> anyhow::Error {
    InvalidInput {
        flag: flag_of(&e.field).to_string(),
        problem: e,
    }
    .into()
}

/// Takes every `--advanced-filter` occurrence out of the command line, each with its words:
/// up to the next word that starts with `--` (another flag), so flags work in any order as in
/// `az`, while values that start with one `-` (`-5`, `-50,-1`, `-beta`) stay values. The rest
/// of the command line is returned for clap.
fn take_advanced_filters(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> (Vec<std::ffi::OsString>, Vec<Vec<String>>) {
    let mut rest = Vec::new();
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut in_filter = false;
    for arg in args {
        let word = arg.to_string_lossy();
        if word == "--advanced-filter" {
            groups.push(Vec::new());
            in_filter = true;
        } else if in_filter && !word.starts_with("--") {
            if let Some(group) = groups.last_mut() {
                group.push(word.into_owned());
            }
        } else {
            in_filter = false;
            rest.push(arg);
        }
    }
    (rest, groups)
}

/// Parses the command line, keeping the words of each `--advanced-filter` and
/// `--delivery-attribute-mapping` occurrence together.
fn parse_cli() -> Cli {
    let (args, advanced_filters) = take_advanced_filters(std::env::args_os());
    let matches = Cli::command().get_matches_from(args);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let takes_filters = matches!(
        cli.command,
        Command::EventSubscription(SubscriptionCommand::Create(_) | SubscriptionCommand::Update(_))
    );
    if !advanced_filters.is_empty() && !takes_filters {
        Cli::command()
            .error(
                clap::error::ErrorKind::UnknownArgument,
                "--advanced-filter is taken by `event-subscription create` and `update` only",
            )
            .exit();
    }
    let (command, settings) = match &mut cli.command {
        Command::EventSubscription(SubscriptionCommand::Create(c)) => ("create", &mut c.settings),
        Command::EventSubscription(SubscriptionCommand::Update(u)) => ("update", &mut u.settings),
        _ => return cli,
    };
    settings.advanced_filter_groups = advanced_filters;
    // Each occurrence of the flag, its words kept together.
    settings.delivery_attribute_groups = matches
        .subcommand_matches("event-subscription")
        .and_then(|m| m.subcommand_matches(command))
        .and_then(|m| m.get_occurrences::<String>("delivery_attribute_mapping"))
        .map(|groups| groups.map(|g| g.cloned().collect()).collect())
        .unwrap_or_default();
    cli
}

fn main() -> ExitCode {
    let cli = parse_cli();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,aws_config=warn")),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<InvalidInput>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let tables = TableNames {
        topics: cli.topics_table.clone(),
        subscriptions: cli.subscriptions_table.clone(),
    };
    let own = OwnQueues {
        delivery: &cli.delivery_queue,
        key_secret: cli.queue_key_secret.as_deref(),
    };
    match cli.command {
        Command::Local(args) => run_local(args, cli.allowed_networks.as_deref()).await,
        Command::Redrive(cmd) => redrive_command(cmd, tables, own).await,
        Command::Topic(cmd) => {
            if let TopicCommand::Show(t) | TopicCommand::Delete(t) = &cmd {
                validate_topic_name(&t.name).map_err(invalid)?;
            }
            if let TopicCommand::Update(t) = &cmd {
                validate_topic_name(&t.name).map_err(invalid)?;
            }
            let new_topic = match &cmd {
                TopicCommand::Create(c) => Some(c.topic().map_err(invalid)?),
                _ => None,
            };
            let store = open_store(tables).await;
            topic_command(store.as_ref(), &cli.publish_url, cli.output, cmd, new_topic).await
        }
        Command::EventSubscription(cmd) => {
            let request = match &cmd {
                SubscriptionCommand::Create(c) => Some(
                    c.settings
                        .request(
                            &c.topic_name,
                            &c.name,
                            &c.endpoint,
                            c.signing_secret.as_deref(),
                        )
                        .map_err(invalid)?,
                ),
                _ => None,
            };
            let update = match &cmd {
                SubscriptionCommand::Update(u) => {
                    validate_topic_name(&u.topic_name).map_err(invalid)?;
                    validate_subscription_name(&u.name).map_err(invalid)?;
                    Some(u.settings.update(u.endpoint.as_deref()).map_err(invalid)?)
                }
                _ => None,
            };
            if let Some(r) = &request {
                // Everything that does not depend on the topic, before the store is opened
                // (a custom-schema topic takes every delivery schema).
                r.validate(InputSchema::CustomEventSchema, chrono::Utc::now())
                    .map_err(invalid)?;
            }
            let sdk = load_sdk_config().await;
            let store = DynamoSubscriptionStore::from_sdk(&sdk, tables);
            let secrets = SecretsManagerStore::from_sdk(&sdk);
            let sqs = aws_sdk_sqs::Client::new(&sdk);
            let queue_url = if matches!(
                cmd,
                SubscriptionCommand::Create(_) | SubscriptionCommand::Update(_)
            ) {
                delivery_queue_url(&sqs, &cli.delivery_queue).await?
            } else {
                cli.delivery_queue.clone()
            };
            // Only create and update send to the delivery queue (handshake and expiry steps);
            // the other commands need no key.
            let queue: Box<dyn MessageQueue> = if matches!(
                cmd,
                SubscriptionCommand::Create(_) | SubscriptionCommand::Update(_)
            ) {
                Box::new(SqsQueue::new(sqs.clone(), &queue_url, own.key(&sdk).await?))
            } else {
                Box::new(NoDeliveryQueue)
            };
            let endpoints = EndpointCheck {
                policy: OutboundPolicy::new(create_allowed_networks(
                    cli.allowed_networks.as_deref(),
                )?),
                resolver: Arc::new(SystemResolver),
            };
            let objects = S3ObjectStore::new(s3_client(&sdk));
            let resources = AwsResourceSender::from_sdk(&sdk);
            let allowed_destinations =
                create_delivery_destinations(cli.delivery_destinations.as_deref(), &queue_url)?;
            let registry = Registry {
                store: &store,
                secrets: &secrets,
                secret_prefix: &cli.secret_prefix,
                delivery_queue: queue.as_ref(),
                endpoints: &endpoints,
                dead_letters: &objects,
                resources: &resources,
                allowed_destinations: &allowed_destinations,
            };
            let health = DynamoDeliveryStateStore::from_sdk(&sdk, &cli.delivery_state_table);
            let status = StatusSources {
                health: &health,
                sqs: &sqs,
                delivery_queue: &cli.delivery_queue,
            };
            subscription_command(&registry, &status, cli.output, cmd, request, update).await
        }
    }
}

/// The installation's delivery queue, as given, and the secret of the key its messages are
/// sealed with, if given.
#[derive(Clone, Copy)]
struct OwnQueues<'a> {
    delivery: &'a str,
    key_secret: Option<&'a str>,
}

impl OwnQueues<'_> {
    /// The key the installation seals its queue messages with (#34 item 2): given, or the one
    /// beside a delivery queue named `<prefix>-delivery`.
    async fn key(&self, sdk: &aws_config::SdkConfig) -> anyhow::Result<QueueKey> {
        let secret = match self.key_secret {
            Some(secret) => secret.to_string(),
            None => ResourceNames::beside_delivery_queue(self.delivery)
                .map(|names| names.queue_key_secret)
                .with_context(|| {
                    format!(
                        "set --queue-key-secret or {} to the stack's QueueKeySecret output (the \
                         delivery queue {:?} is not named <prefix>-delivery, so its key's secret \
                         is unknown)",
                        config::QUEUE_KEY_SECRET_ENV,
                        self.delivery
                    )
                })?,
        };
        queue_key(sdk, &secret, Duration::ZERO)
            .await
            .with_context(|| {
                format!(
                    "no queue key: what is sent to the delivery queue is sealed with the key in \
                 secret {secret:?}; set --queue-key-secret or {} to the stack's QueueKeySecret \
                 output",
                    config::QUEUE_KEY_SECRET_ENV
                )
            })
    }
}

/// The delivery queue of the commands that send nothing to it: a send is a bug, refused.
struct NoDeliveryQueue;

#[async_trait::async_trait]
impl MessageQueue for NoDeliveryQueue {
    async fn send_all(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), QueueError>> {
        messages.iter().map(|_| Err(Self::refused())).collect()
    }
    async fn retry_after(&self, _: &str, _: Duration) -> Result<(), QueueError> {
        Err(Self::refused())
    }
    async fn receive_batch(
        &self,
        _: usize,
        _: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        Err(Self::refused())
    }
    async fn delete_received(&self, _: &str) -> Result<(), QueueError> {
        Err(Self::refused())
    }
}

impl NoDeliveryQueue {
    fn refused() -> QueueError {
        QueueError("this command does not use the delivery queue".to_string())
    }
}

async fn redrive_command(
    cmd: RedriveCommand,
    tables: TableNames,
    queues: OwnQueues<'_>,
) -> anyhow::Result<()> {
    match cmd {
        RedriveCommand::Queue(args) => redrive_queue_command(args, queues).await,
        RedriveCommand::DeadLetters(args) => {
            redrive_dead_letters_command(args, tables, queues).await
        }
    }
}

/// `gridrelay redrive queue`: parked messages back to the queue they came from.
async fn redrive_queue_command(
    args: RedriveQueueArgs,
    queues: OwnQueues<'_>,
) -> anyhow::Result<()> {
    let delivery_queue = queues.delivery;
    // Unnamed queues are the ones beside the delivery queue, named with its prefix.
    let beside = || {
        ResourceNames::beside_delivery_queue(delivery_queue).with_context(|| {
            format!(
                "the delivery queue {delivery_queue:?} is not named <prefix>-delivery, so the \
                 queues beside it are unknown: pass --from and --to"
            )
        })
    };
    let sdk = load_sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let kind = if args.dead_letter {
        QueueKind::DeadLetter
    } else {
        QueueKind::Delivery
    };
    let from = match (&args.from, kind) {
        (Some(from), _) => from.clone(),
        (None, QueueKind::DeadLetter) => beside()?.dead_letter_redrive_queue,
        (None, QueueKind::Delivery) => beside()?.delivery_redrive_queue,
    };
    let from = queue_url(&sqs, &from, "--from").await?;
    let to = match (&args.to, kind) {
        (Some(to), _) => queue_url(&sqs, to, "--to").await?,
        (None, QueueKind::DeadLetter) => {
            queue_url(&sqs, &beside()?.dead_letter_queue, "--to").await?
        }
        (None, QueueKind::Delivery) => delivery_queue_url(&sqs, delivery_queue).await?,
    };
    let key = queues.key(&sdk).await?;
    let report = redrive_queue(
        &SqsQueue::new(sqs.clone(), &from, key.clone()),
        &SqsQueue::new(sqs, &to, key),
        kind,
        args.dry_run,
        args.max_messages,
    )
    .await?;
    print(&json!({
        "dryRun": report.dry_run,
        "from": from,
        "to": to,
        "messages": report.messages(),
        "moved": report.moved.iter().map(|(whose, m)| {
            (whose.clone(), json!({"messages": m.messages, "events": m.events}))
        }).collect::<serde_json::Map<_, _>>(),
        "leftUnreadableOrOfAnotherKind": report.unreadable,
        "leftUnsealed": report.unsealed,
    }))
}

/// `gridrelay redrive dead-letters`: dead-lettered events delivered again.
async fn redrive_dead_letters_command(
    args: RedriveDeadLettersArgs,
    tables: TableNames,
    queues: OwnQueues<'_>,
) -> anyhow::Result<()> {
    let delivery_queue = queues.delivery;
    let selection = args.selection().map_err(invalid)?;
    let sdk = load_sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let store = DynamoSubscriptionStore::from_sdk(&sdk, tables);
    let objects = S3ObjectStore::new(s3_client(&sdk));
    let queue = SqsQueue::new(
        sqs.clone(),
        delivery_queue_url(&sqs, delivery_queue).await?,
        queues.key(&sdk).await?,
    );
    let report = redrive_dead_letters(
        &store,
        &objects,
        &queue,
        &selection,
        args.dry_run,
        chrono::Utc::now(),
    )
    .await?;
    print(&json!({
        "dryRun": report.dry_run,
        "events": report.events(),
        "subscriptions": report.subscriptions.iter().map(|s| json!({
            "name": s.subscription,
            "skipped": s.skipped,
            "objectsRead": s.objects_read,
            "objectsDeleted": s.objects_deleted,
            "objectsRewritten": s.objects_rewritten,
            "moved": s.moved,
            "recordsLeft": s.left,
            "objectsOfOtherSubscriptions": s.objects_of_other_subscriptions,
        })).collect::<Vec<_>>(),
    }))
}

/// The delivery queue's URL: given, or looked up by name.
async fn delivery_queue_url(sqs: &aws_sdk_sqs::Client, queue: &str) -> anyhow::Result<String> {
    queue_url(sqs, queue, "--delivery-queue")
        .await
        .with_context(|| {
            format!(
                "set --delivery-queue or {} to the delivery queue's URL",
                config::DELIVERY_QUEUE_URL_ENV
            )
        })
}

/// A queue's URL: given, or looked up by name.
async fn queue_url(sqs: &aws_sdk_sqs::Client, queue: &str, flag: &str) -> anyhow::Result<String> {
    if queue.starts_with("http://") || queue.starts_with("https://") {
        return Ok(queue.to_string());
    }
    let found = sqs
        .get_queue_url()
        .queue_name(queue)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!(describe_error(&e)))
        .with_context(|| format!("could not find the queue {queue:?} ({flag})"))?;
    found
        .queue_url()
        .map(str::to_string)
        .with_context(|| format!("SQS returned no URL for {queue:?}"))
}

async fn open_store(tables: TableNames) -> Arc<dyn SubscriptionStore> {
    let sdk = load_sdk_config().await;
    Arc::new(DynamoSubscriptionStore::from_sdk(&sdk, tables))
}

fn print(value: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
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
        TopicCommand::Update(UpdateTopic { name, tags }) => {
            let tags = parse_tags(&tags).map_err(invalid)?;
            let mut topic = existing_topic(store, &name).await?;
            topic.tags = tags;
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

async fn existing_topic(store: &dyn SubscriptionStore, name: &str) -> anyhow::Result<Topic> {
    store
        .get_topic(name)
        .await
        .map_err(store_error)?
        .with_context(|| format!("topic {name} does not exist"))
}

/// Where `show` reads how delivery goes: endpoint health and the delivery queue.
struct StatusSources<'a> {
    health: &'a dyn DeliveryStateStore,
    sqs: &'a aws_sdk_sqs::Client,
    delivery_queue: &'a str,
}

/// What `show` says of delivery to a subscription (#11 item 14): its endpoint's health (failures
/// since the last success, delayed until, the last failure) and the events in the delivery
/// queue (for every subscription: per-subscription counts are not kept). What cannot be read
/// is `null`, with a note on stderr; `show` still prints the subscription.
async fn delivery_status(sources: &StatusSources<'_>, sub: &Subscription) -> serde_json::Value {
    let health = match sources.health.endpoint_health(&sub.endpoint).await {
        Ok(h) => Some(h.value),
        Err(e) => {
            eprintln!(
                "note: endpoint health could not be read ({e}); is --delivery-state-table right?"
            );
            None
        }
    };
    let queue = match queue_counts(sources.sqs, sources.delivery_queue).await {
        Ok(counts) => Some(counts),
        Err(e) => {
            eprintln!("note: the delivery queue could not be read ({e:#})");
            None
        }
    };
    view::delivery_status_view(health.as_ref(), queue.as_ref(), chrono::Utc::now())
}

/// SQS's approximate counts of a queue's messages: waiting, delayed and being handled.
async fn queue_counts(sqs: &aws_sdk_sqs::Client, queue: &str) -> anyhow::Result<view::QueueCounts> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let out = sqs
        .get_queue_attributes()
        .queue_url(queue_url(sqs, queue, "--delivery-queue").await?)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesDelayed)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!(describe_error(&e)))?;
    let count = |name: A| {
        out.attributes()
            .and_then(|a| a.get(&name))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Ok(view::QueueCounts {
        visible: count(A::ApproximateNumberOfMessages),
        delayed: count(A::ApproximateNumberOfMessagesDelayed),
        in_flight: count(A::ApproximateNumberOfMessagesNotVisible),
    })
}

async fn subscription_command(
    registry: &Registry<'_>,
    status: &StatusSources<'_>,
    output: OutputFormat,
    cmd: SubscriptionCommand,
    request: Option<SubscriptionRequest>,
    update: Option<SubscriptionUpdate>,
) -> anyhow::Result<()> {
    let store = registry.store;
    // `extra`: a secret shown once (a signing secret), in the JSON and under the table.
    let one = |sub: &Subscription, extra: Option<(&str, String)>| {
        let mut view = subscription_view(sub);
        if let Some((name, value)) = &extra {
            view[*name] = value.clone().into();
        }
        print_as(output, &view, || {
            let table = subscriptions_table(std::slice::from_ref(sub));
            match &extra {
                Some((name, value)) => format!("{table}\n\n{name}: {value}"),
                None => table,
            }
        })
    };
    match (cmd, request) {
        (SubscriptionCommand::Update(u), _) => {
            let update = update.context("update was not validated")?;
            let Updated {
                subscription: mut sub,
                handshake,
            } = registry
                .update(&u.topic_name, &u.name, &update, chrono::Utc::now())
                .await
                .map_err(registration_error)?;
            let mut failure = None;
            if let Some(which) = handshake.filter(|_| !u.no_wait) {
                sub = wait_for_provisioning(store, sub, which).await?;
                failure = handshake_failure(&sub, which);
            }
            one(&sub, None)?;
            failure.map_or(Ok(()), |why| Err(anyhow::anyhow!(why)))
        }
        (SubscriptionCommand::Create(c), Some(request)) => {
            let mut sub = registry
                .register(&request, chrono::Utc::now())
                .await
                .map_err(registration_error)?;
            let mut failure = None;
            if !c.no_wait {
                sub = wait_for_provisioning(store, sub, Handshake::Subscription).await?;
                failure = handshake_failure(&sub, Handshake::Subscription);
            }
            // A signing secret is shown once: verify deliveries with it.
            one(
                &sub,
                request
                    .signing_secret
                    .as_ref()
                    .map(|s| ("signingSecret", s.to_text())),
            )?;
            failure.map_or(Ok(()), |why| Err(anyhow::anyhow!(why)))
        }
        (SubscriptionCommand::SigningSecret(SigningSecretCommand::Rotate(r)), _) => {
            let secret = SigningSecret::from_flag(&r.signing_secret).map_err(invalid)?;
            let grace =
                gridrelay_shared::signing::grace_hours(r.grace_period_hours).map_err(invalid)?;
            let sub = registry
                .rotate_signing_secret(&r.topic_name, &r.name, &secret, grace, chrono::Utc::now())
                .await
                .map_err(registration_error)?;
            one(&sub, Some(("signingSecret", secret.to_text())))
        }
        (SubscriptionCommand::Show(SubscriptionName { topic_name, name }), _) => {
            let sub = store
                .get_subscription(&topic_name, &name)
                .await
                .map_err(store_error)?
                .with_context(|| {
                    format!("event subscription {name} on topic {topic_name} does not exist")
                })?;
            let mut view = subscription_view(&sub);
            view["deliveryStatus"] = delivery_status(status, &sub).await;
            print_as(output, &view, || {
                subscriptions_table(std::slice::from_ref(&sub))
            })
        }
        (SubscriptionCommand::List(l), _) => {
            existing_topic(store, &l.topic_name).await?;
            let mut subs = store
                .list_subscriptions(&l.topic_name)
                .await
                .map_err(store_error)?;
            subs.sort_by(|a, b| a.name.cmp(&b.name));
            let page = list_page(subs, l.skip_token.as_deref(), l.top);
            if let Some(next) = &page.next {
                eprintln!("note: more event subscriptions follow; add --skip-token {next}");
            }
            let views: Vec<_> = page.items.iter().map(subscription_view).collect();
            print_as(output, &json!(views), || subscriptions_table(&page.items))
        }
        (SubscriptionCommand::Delete(SubscriptionName { topic_name, name }), _) => {
            if !registry
                .delete(&topic_name, &name)
                .await
                .map_err(registration_error)?
            {
                bail!("event subscription {name} on topic {topic_name} does not exist");
            }
            print(&json!({"deleted": name, "topic": topic_name}))
        }
        (SubscriptionCommand::Create(_), None) => bail!("subscription was not validated"),
    }
}

/// Prints `value` as JSON, or `rows()` as a table with `--output table`.
fn print_as(
    output: OutputFormat,
    value: &serde_json::Value,
    rows: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json => print(value),
        OutputFormat::Table => {
            println!("{}", rows());
            Ok(())
        }
    }
}

/// How long `create` and `update` wait for the handshake before they say it is still going.
const PROVISIONING_WAIT: Duration = Duration::from_secs(120);

/// Waits until `which` handshake of the subscription has ended (as `az` waits for a terminal
/// provisioning state): the record then, or as it was when the wait ran out (said on stderr).
/// A failed handshake is an error after the record is printed.
async fn wait_for_provisioning(
    store: &dyn SubscriptionStore,
    sub: Subscription,
    which: Handshake,
) -> anyhow::Result<Subscription> {
    let waiting = |s: &Subscription| {
        s.handshake(which)
            .is_some_and(|(_, p)| p.state == ProvisioningState::Creating)
    };
    let started = std::time::Instant::now();
    let mut current = sub;
    while waiting(&current) {
        if started.elapsed() > PROVISIONING_WAIT {
            // Still `Creating`: `handshake_failure` says so.
            return Ok(current);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        match store
            .get_subscription(&current.topic, &current.name)
            .await
            .map_err(store_error)?
        {
            Some(fresh) if fresh.id == current.id => current = fresh,
            _ => bail!(
                "event subscription {} on topic {} was deleted while its handshake ran",
                current.name,
                current.topic
            ),
        }
    }
    Ok(current)
}

/// Why the handshake `create` or `update` waited for did not succeed, if it did not (still
/// asking after the wait counts: a script must not go on as if it were validated).
fn handshake_failure(sub: &Subscription, which: Handshake) -> Option<String> {
    let (endpoint, p) = sub.handshake(which)?;
    match p.state {
        ProvisioningState::Creating => Some(format!(
            "the endpoint validation handshake of {} has not ended after {} s (is the deliver function running?); the subscription is stored: see `event-subscription show`",
            redact_endpoint(endpoint),
            PROVISIONING_WAIT.as_secs()
        )),
        ProvisioningState::Failed => Some(format!(
            "the endpoint validation handshake of {} failed: {}",
            redact_endpoint(endpoint),
            p.detail.as_deref().unwrap_or("no detail")
        )),
        ProvisioningState::AwaitingManualAction => {
            let until = p
                .validation_expires_at
                .map(|t| format!(" before {}", t.to_rfc3339()))
                .unwrap_or_default();
            eprintln!(
                "note: waiting for a manual validation: GET the validationUrl the endpoint received{until}"
            );
            None
        }
        _ => None,
    }
}

fn registration_error(e: RegistrationError) -> anyhow::Error {
    match e {
        RegistrationError::Invalid(e) => invalid(e),
        RegistrationError::Store(e) => store_error(e),
        other => other.into(),
    }
}

fn store_error(e: StoreError) -> anyhow::Error {
    match e {
        StoreError::Unavailable(msg) => anyhow::anyhow!(
            "the subscription store is not reachable ({msg}); is `gridrelay local` running, or are the table names and AWS_ENDPOINT_URL right?"
        ),
        other => other.into(),
    }
}

/// The networks `event-subscription create` admits endpoints in: those given, else loopback
/// when the AWS API is on this machine (the stack is `gridrelay local`'s, which allows it),
/// else none (the deliver function checks every connection again with the stack's own).
fn create_allowed_networks(given: Option<&str>) -> anyhow::Result<AllowedNetworks> {
    if let Some(given) = given {
        return given.parse().map_err(invalid);
    }
    Ok(if local_stack() {
        AllowedNetworks::loopback()
    } else {
        AllowedNetworks::none()
    })
}

/// The AWS resources `event-subscription create` admits: those given, else every one when
/// the AWS API is on this machine, else none (on AWS the deliver function's IAM policy names
/// the stack's own); never the installation's own queues (#34 item 2): `delivery_queue` (its
/// URL), the queues `gridrelay local` names beside it, and `GRIDRELAY_OWN_QUEUES`.
fn create_delivery_destinations(
    given: Option<&str>,
    delivery_queue: &str,
) -> anyhow::Result<AllowedDestinations> {
    let allowed = match given {
        Some(given) => AllowedDestinations::parse(given).map_err(invalid)?,
        None if local_stack() => AllowedDestinations::any(),
        None => AllowedDestinations::default(),
    };
    let mut own = vec![delivery_queue.to_string()];
    if let (Some(names), Some((base, _))) = (
        ResourceNames::beside_delivery_queue(delivery_queue),
        delivery_queue.rsplit_once('/'),
    ) {
        own.extend(
            [
                names.dead_letter_queue,
                names.delivery_redrive_queue,
                names.dead_letter_redrive_queue,
            ]
            .map(|name| format!("{base}/{name}")),
        );
    }
    allowed
        .refusing_own_queues(own.iter().map(String::as_str))
        .refusing_listed_queues(
            config::OWN_QUEUES_ENV,
            &std::env::var(config::OWN_QUEUES_ENV).unwrap_or_default(),
        )
        .map_err(invalid)
}

/// Why `gridrelay local` did not start, first; where it is known that the AWS API did not
/// answer (a connection refused or timed out), where to look.
fn not_started(e: anyhow::Error, endpoint: Option<&str>) -> anyhow::Error {
    let unreachable = e.chain().any(|cause| {
        let text = cause.to_string();
        // The SDK's words for a request that reached no answer (refused, timed out,
        // unresolved), kept in the text of the errors provisioning wraps.
        text.contains("dispatch failure") || text.contains("Connection refused")
    });
    match (unreachable, endpoint) {
        (true, Some(url)) => e.context(format!(
            "could not start: the AWS API at {url} (AWS_ENDPOINT_URL) did not answer; is the \
             emulator running? (`infra/local/moto.sh start`)"
        )),
        (true, None) => e.context("could not start: the AWS API did not answer"),
        (false, _) => e.context("could not start"),
    }
}

/// Whether AWS_ENDPOINT_URL names this machine (an emulator: `gridrelay local`'s stack).
fn local_stack() -> bool {
    std::env::var("AWS_ENDPOINT_URL")
        .ok()
        .and_then(|u| url::Url::parse(&u).ok())
        .is_some_and(|u| match u.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        })
}

async fn run_local(args: LocalArgs, allowed_networks: Option<&str>) -> anyhow::Result<()> {
    let scale = TimeScale::from_env().map_err(invalid)?;
    let allowed_networks: AllowedNetworks = allowed_networks
        .unwrap_or(gridrelay_shared::outbound::LOCAL_ALLOWED_NETWORKS)
        .parse()
        .map_err(invalid)?;
    let sdk = load_sdk_config().await;
    let names = ResourceNames::with_prefix(&args.prefix);
    let config = RunnerConfig {
        listen: args.listen,
        scale,
        visibility_timeout: Duration::from_secs(args.visibility_timeout),
        max_receive_count: args.max_receive_count,
        function_timeout: Duration::from_secs(args.function_timeout),
        delivery_concurrency: gridrelay_local::ConcurrencySettings::new(
            args.max_requests_in_flight,
            args.max_requests_per_endpoint,
        )
        .map_err(invalid)?,
        config_cache: gridrelay_ports::cache::config_cache_time(&args.config_cache_seconds)
            .map_err(invalid)?,
        allowed_networks: allowed_networks.clone(),
        ..RunnerConfig::default()
    };
    // The settings first: an error names what is wrong before anything is tried.
    config.check().map_err(invalid)?;
    let config_cache = config.config_cache;
    let system = LocalSystem::start(&sdk, &names, config)
        .await
        .map_err(|e| not_started(e, sdk.endpoint_url()))?;
    print(&json!({
        "publishEndpoint": system.publish_endpoint("{topic}"),
        "awsEndpoint": sdk.endpoint_url(),
        "timeScale": scale.factor(),
        "configCacheSeconds": config_cache.as_secs(),
        "allowedNetworks": allowed_networks.to_string(),
        "topicsTable": names.topics_table,
        "subscriptionsTable": names.subscriptions_table,
        "deliveryQueue": system.resources.delivery_queue_url,
        "deadLetterQueue": system.resources.dead_letter_queue_url,
        "deadLetterBucket": names.dead_letter_bucket,
    }))?;
    wait_for_stop_signal().await;
    tracing::info!("stopping");
    let stats = system.shutdown().await;
    print(&json!({ "stopped": stop_report(&stats) }))
}

/// What the run did, printed when `gridrelay local` stops: each function's invocations and the
/// milliseconds Lambda would bill for them, and what delivery did.
fn stop_report(stats: &gridrelay_local::RunnerStats) -> serde_json::Value {
    let d = &stats.deliver;
    let l = &stats.dead_letter;
    json!({
        "ingest": {
            "invocations": stats.ingest_invocations,
            "billedMs": stats.billed.ingest_ms,
        },
        "deliver": {
            "invocations": stats.deliver_invocations,
            "billedMs": stats.billed.deliver_ms,
            "attempts": d.attempts,
            "failedAttempts": d.failed_attempts,
            "delivered": d.delivered,
            "retried": d.retried,
            "deadLettered": d.dead_lettered,
            "dropped": d.dropped,
            "delayed": d.delayed,
            "throttled": d.throttled,
        },
        "deadLetter": {
            "invocations": stats.dead_letter_invocations,
            "billedMs": stats.billed.dead_letter_ms,
            "recordsWritten": l.records_written,
            "recordsDropped": l.records_dropped,
        },
        "stoppedInvocations": stats.stopped_invocations,
        "unsealedDropped": stats.unsealed_dropped,
        "latency": {
            "queueMs": percentiles(&stats.latencies.queue_ms, "messages"),
            "publishToAnswerMs": percentiles(&stats.latencies.publish_to_answer_ms, "events"),
        },
    })
}

/// p50, p99 and the most of a latency histogram, and how many it counted.
fn percentiles(h: &hdrhistogram::Histogram<u64>, counted: &str) -> serde_json::Value {
    json!({
        "p50": h.value_at_quantile(0.5),
        "p99": h.value_at_quantile(0.99),
        "max": h.max(),
        counted: h.len(),
    })
}

async fn wait_for_stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::take_advanced_filters;

    /// #11 item 11: an `--advanced-filter` ends at the next `--` flag, wherever it is; words
    /// with one leading `-` are values.
    #[test]
    fn advanced_filters_end_at_the_next_flag() {
        let line = "gridrelay event-subscription create --advanced-filter data.amount NumberGreaterThan 100 \
            --delivery-attribute-mapping X static a --advanced-filter data.n NumberInRange -50,-1 -5,5 \
            --advanced-filter subject StringBeginsWith -beta --name s";
        let (rest, groups) = take_advanced_filters(line.split_whitespace().map(Into::into));
        let rest: Vec<String> = rest
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            rest,
            "gridrelay event-subscription create --delivery-attribute-mapping X static a --name s"
                .split(' ')
                .collect::<Vec<_>>()
        );
        assert_eq!(
            groups,
            vec![
                vec!["data.amount", "NumberGreaterThan", "100"],
                vec!["data.n", "NumberInRange", "-50,-1", "-5,5"],
                vec!["subject", "StringBeginsWith", "-beta"],
            ]
        );
    }
}
