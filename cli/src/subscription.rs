//! `gridrelay event-subscription`: which endpoint gets a topic's events, and how; mirrors `az
//! eventgrid event-subscription`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use gridrelay_adapters::aws::{
    AwsResourceSender, DynamoDeliveryStateStore, DynamoSubscriptionStore, S3ObjectStore,
    SecretsManagerStore, SqsQueue, describe_error, load_sdk_config, s3_client,
};
use gridrelay_adapters::config::{self, TableNames};
use gridrelay_adapters::outbound::SystemResolver;
use gridrelay_local::ResourceNames;
use gridrelay_ports::endpoints::EndpointCheck;
use gridrelay_ports::registration::{RegistrationError, Registry};
use gridrelay_ports::{
    DeliveryStateStore, MessageQueue, OutgoingMessage, QueueError, ReceivedMessage,
    SubscriptionStore,
};
use gridrelay_shared::delivery_attributes::DeliveryAttributeRequest;
use gridrelay_shared::destination::AllowedDestinations;
use gridrelay_shared::filter::{AdvancedFilter, EventFilter};
use gridrelay_shared::limits::{LimitError, validate_subscription_name, validate_topic_name};
use gridrelay_shared::oauth::OAuthRequest;
use gridrelay_shared::outbound::{AllowedNetworks, OutboundPolicy, redact_endpoint};
use gridrelay_shared::schema::InputSchema;
use gridrelay_shared::signing::SigningSecret;
use gridrelay_shared::subscription::{
    Handshake, Subscription, SubscriptionRequest, SubscriptionUpdate, Updated, parse_expiration,
};
use gridrelay_shared::validation::ProvisioningState;
use serde_json::json;

use crate::topic::existing_topic;
use crate::view::{self, subscription_view, subscriptions_table};
use crate::{
    OutputFormat, OwnQueues, delivery_queue_url, invalid, print, print_as, queue_url, store_error,
};

#[derive(Subcommand)]
pub(super) enum SubscriptionCommand {
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
    /// The subscription's latest delivery attempts from the delivery journal, newest first:
    /// status, duration and what came next.
    Attempts(crate::journal::ListAttempts),
    /// A link for the subscriber: a page of this subscription's deliveries and attempts, with
    /// no AWS account, until it expires (signed with the stack's portal key). Prints the URL.
    PortalLink(crate::portal::PortalLink),
}

#[derive(Args)]
pub(super) struct ListSubscriptions {
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

#[derive(Subcommand)]
pub(super) enum SigningSecretCommand {
    /// Sign with a new secret from now on; the current one keeps signing beside it for the
    /// grace period, so subscribers can switch without missing a delivery. Starts signing a
    /// subscription that did not sign. Prints the new secret.
    Rotate(RotateSigningSecret),
}

#[derive(Args)]
pub(super) struct RotateSigningSecret {
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
pub(super) struct SubscriptionName {
    #[arg(long)]
    topic_name: String,
    #[arg(long)]
    name: String,
}

#[derive(Args)]
pub(super) struct CreateSubscription {
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
    pub(super) settings: SubscriptionSettings,
    /// Sign every delivery (Standard Webhooks: webhook-id, webhook-timestamp,
    /// webhook-signature): generate, or a whsec_… secret. Kept in Secrets Manager; a generated
    /// one is printed once, here.
    #[arg(long)]
    signing_secret: Option<String>,
}

#[derive(Args)]
pub(super) struct UpdateSubscription {
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
    pub(super) settings: SubscriptionSettings,
}

/// What `create` and `update` both take. At `update`, each setting given replaces the stored
/// one and the rest stay.
#[derive(Args)]
pub(super) struct SubscriptionSettings {
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
    /// How many bytes of each answer's body the delivery journal keeps with the attempt
    /// (`event show`, `event-subscription attempts`): 0 (none) to 1024, default 64.
    #[arg(long, allow_negative_numbers = true)]
    journal_answer_bytes: Option<i64>,
    /// Where undeliverable events are written: s3://BUCKET[/PREFIX]. Unset: they are dropped
    /// (at update, "" removes it).
    #[arg(long)]
    deadletter_endpoint: Option<String>,
    /// Deliver the events that share this value in the order they were accepted (O1):
    /// subject, or data.FIELD[.FIELD...]. One request per key at a time; a failing event holds
    /// back only its key. Events without the value are delivered without order. Unset: no
    /// order (at update, none removes it).
    #[arg(long)]
    ordering_key: Option<String>,
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
    pub(super) advanced_filter_groups: Vec<Vec<String>>,
    /// A header sent with every delivery: NAME static VALUE [secret] (e.g. Authorization
    /// static "Bearer abc" secret); at most 10, values at most 4096 bytes. Secret values are
    /// kept in Secrets Manager and never shown.
    #[arg(long, num_args = 3..=4, value_names = ["NAME", "TYPE", "VALUE"],
          action = clap::ArgAction::Append)]
    delivery_attribute_mapping: Vec<String>,
    /// `--delivery-attribute-mapping` occurrences, one per flag.
    #[arg(skip)]
    pub(super) delivery_attribute_groups: Vec<Vec<String>>,
    /// The user's own tags, kept and shown: at most 25, each 1 to 256 characters (at update,
    /// the flag alone removes them).
    #[arg(long, num_args = 0..)]
    labels: Option<Vec<String>>,
    /// When the subscription ends: it receives nothing from then on and is deleted, as in
    /// Event Grid. A date (2026-12-31, midnight UTC) or a time (2026-12-31T18:00:00Z); in the
    /// future (at update, "" removes it).
    #[arg(long)]
    expiration_date: Option<String>,
    /// How deliveries prove themselves to a webhook besides its headers: oauth2, a bearer
    /// token from --token-url for the client credentials grant, fetched when needed and kept
    /// until shortly before it expires (at update: replaces the credentials whole, the secret
    /// given again; none removes them).
    #[arg(long)]
    delivery_auth: Option<String>,
    /// The OAuth 2.0 token endpoint (with --delivery-auth oauth2): https://, or http:// in
    /// the allowed networks, as for endpoints.
    #[arg(long)]
    token_url: Option<String>,
    /// The OAuth 2.0 client id (with --delivery-auth oauth2).
    #[arg(long)]
    client_id: Option<String>,
    /// A file holding the OAuth 2.0 client secret, or - for standard input (with
    /// --delivery-auth oauth2; never on the command line, where shell history and ps keep
    /// it). Kept in Secrets Manager and never shown.
    #[arg(long)]
    client_secret_file: Option<String>,
    /// The scope to ask tokens for: space-separated (with --delivery-auth oauth2).
    #[arg(long)]
    scope: Option<String>,
    /// The audience to ask tokens for, as some token endpoints want it (with
    /// --delivery-auth oauth2).
    #[arg(long)]
    audience: Option<String>,
}

impl SubscriptionSettings {
    /// A1: the OAuth 2.0 settings given: `Some(None)` for `--delivery-auth none`. The secret
    /// is read here, from its file or standard input.
    fn oauth(&self) -> Result<Option<Option<OAuthRequest>>, LimitError> {
        let given = [
            ("--token-url", self.token_url.is_some()),
            ("--client-id", self.client_id.is_some()),
            ("--client-secret-file", self.client_secret_file.is_some()),
            ("--scope", self.scope.is_some()),
            ("--audience", self.audience.is_some()),
        ];
        let first_given = given.iter().find(|(_, is)| *is).map(|(flag, _)| *flag);
        match self.delivery_auth.as_deref() {
            None | Some("none") => {
                if let Some(flag) = first_given {
                    return Err(LimitError::new(
                        flag,
                        "(given)",
                        "only with --delivery-auth oauth2",
                    ));
                }
                Ok(self.delivery_auth.as_ref().map(|_| None))
            }
            Some("oauth2") => {
                let required = |flag: &str, value: &Option<String>| {
                    value.clone().ok_or_else(|| {
                        LimitError::new(flag, "(missing)", "required with --delivery-auth oauth2")
                    })
                };
                let token_url = required("--token-url", &self.token_url)?;
                let client_id = required("--client-id", &self.client_id)?;
                let path = required("--client-secret-file", &self.client_secret_file)?;
                Ok(Some(Some(OAuthRequest {
                    token_url,
                    client_id,
                    client_secret: read_secret(&path)?,
                    scope: self.scope.clone(),
                    audience: self.audience.clone(),
                })))
            }
            Some(other) => Err(LimitError::new(
                "--delivery-auth",
                format!("{other:?}"),
                "oauth2, or none (at update: removes it)",
            )),
        }
    }

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
            journal_answer_bytes: self.journal_answer_bytes,
            oauth: self.oauth()?.flatten(),
            ordering_key: self.ordering_key.clone(),
        })
    }

    /// The settings as an update gives them: only those on the command line.
    fn update(&self, endpoint: Option<&str>) -> Result<SubscriptionUpdate, LimitError> {
        Ok(SubscriptionUpdate {
            journal_answer_bytes: self.journal_answer_bytes,
            ordering_key: self.ordering_key.clone(),
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
            oauth: self.oauth()?,
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

/// The global flags the event-subscription commands read.
pub(super) struct GlobalFlags<'a> {
    pub(super) tables: TableNames,
    pub(super) queues: OwnQueues<'a>,
    pub(super) secret_prefix: &'a str,
    pub(super) delivery_state_table: &'a str,
    pub(super) allowed_networks: Option<&'a str>,
    pub(super) delivery_destinations: Option<&'a str>,
    /// O1: the ordered queue, or why it is unknown.
    pub(super) ordered_queue: Result<String, String>,
    pub(super) output: OutputFormat,
}

/// `gridrelay event-subscription`: every setting checked before the store is opened, then the
/// command run through a [`Registry`] of the installation's AWS resources.
pub(super) async fn run_event_subscription(
    cmd: SubscriptionCommand,
    flags: GlobalFlags<'_>,
) -> anyhow::Result<()> {
    let (request, update) = checked(&cmd)?;
    // O1: an ordered subscription only where its events have a queue to go to; otherwise
    // ingest would refuse its topic's publishes.
    let ordering = request
        .as_ref()
        .and_then(|r| r.ordering_key.as_deref())
        .or(update.as_ref().and_then(|u| u.ordering_key.as_deref()));
    if let (Some(key), Err(why)) = (ordering.filter(|k| *k != "none"), &flags.ordered_queue) {
        return Err(invalid(LimitError::new(
            "orderingKey",
            format!("{key:?}"),
            format!("only on an installation with an ordered queue: {why}"),
        )));
    }
    let sdk = load_sdk_config().await;
    let store = DynamoSubscriptionStore::from_sdk(&sdk, flags.tables);
    let secrets = SecretsManagerStore::from_sdk(&sdk);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queues = command_queues(&cmd, &sdk, &sqs, flags.queues).await?;
    let endpoints = EndpointCheck {
        policy: OutboundPolicy::new(create_allowed_networks(flags.allowed_networks)?),
        resolver: Arc::new(SystemResolver),
    };
    let objects = S3ObjectStore::new(s3_client(&sdk));
    let resources = AwsResourceSender::from_sdk(&sdk);
    let allowed_destinations = create_delivery_destinations(
        flags.delivery_destinations,
        &queues.delivery_url,
        queues.control_url.as_deref(),
    )?;
    let registry = Registry {
        store: &store,
        secrets: &secrets,
        secret_prefix: flags.secret_prefix,
        control_queue: queues.control.as_ref(),
        endpoints: &endpoints,
        dead_letters: &objects,
        resources: &resources,
        allowed_destinations: &allowed_destinations,
    };
    let health = DynamoDeliveryStateStore::from_sdk(&sdk, flags.delivery_state_table);
    let status = StatusSources {
        health: &health,
        sqs: &sqs,
        delivery_queue: flags.queues.delivery,
    };
    subscription_command(&registry, &status, flags.output, cmd, request, update).await
}

/// What a `create` asks for and what an `update` changes, each checked before the store is
/// opened (as far as it does not depend on the topic).
fn checked(
    cmd: &SubscriptionCommand,
) -> anyhow::Result<(Option<SubscriptionRequest>, Option<SubscriptionUpdate>)> {
    let request = match cmd {
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
    let update = match cmd {
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
    Ok((request, update))
}

/// The queues a subscription command knows of: the delivery queue's URL (as given, for the
/// commands that send nothing), the control queue's, and the queue it sends to.
struct CommandQueues {
    delivery_url: String,
    control_url: Option<String>,
    control: Box<dyn MessageQueue>,
}

/// Only create and update send anything (handshake and expiry steps, to the control queue);
/// the other commands need no key, and get a queue that refuses every send.
async fn command_queues(
    cmd: &SubscriptionCommand,
    sdk: &aws_config::SdkConfig,
    sqs: &aws_sdk_sqs::Client,
    queues: OwnQueues<'_>,
) -> anyhow::Result<CommandQueues> {
    if !matches!(
        cmd,
        SubscriptionCommand::Create(_) | SubscriptionCommand::Update(_)
    ) {
        return Ok(CommandQueues {
            delivery_url: queues.delivery.to_string(),
            control_url: None,
            control: Box::new(NoControlQueue),
        });
    }
    let delivery_url = delivery_queue_url(sqs, queues.delivery).await?;
    let control_url = queues.control_url(sqs).await?;
    let control = SqsQueue::new(sqs.clone(), &control_url, queues.key(sdk).await?);
    Ok(CommandQueues {
        delivery_url,
        control_url: Some(control_url),
        control: Box::new(control),
    })
}

/// The control queue of the commands that send nothing to it: a send is a bug, refused.
pub(crate) struct NoControlQueue;

#[async_trait::async_trait]
impl MessageQueue for NoControlQueue {
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

impl NoControlQueue {
    fn refused() -> QueueError {
        QueueError("this command does not use the control queue".to_string())
    }
}

/// Where `show` reads how delivery goes: endpoint health and the delivery queue.
pub(crate) struct StatusSources<'a> {
    pub(crate) health: &'a dyn DeliveryStateStore,
    pub(crate) sqs: &'a aws_sdk_sqs::Client,
    pub(crate) delivery_queue: &'a str,
}

/// What `show` says of delivery to a subscription (#11 item 14): its endpoint's health (failures
/// since the last success, delayed until, the last failure), its host's (#34 item 8), its
/// token endpoint's (A1) and the events in the delivery
/// queue (for every subscription: per-subscription counts are not kept). What cannot be read
/// is `null`, with a note on stderr; `show` still prints the subscription.
pub(crate) async fn delivery_status(
    sources: &StatusSources<'_>,
    sub: &Subscription,
) -> serde_json::Value {
    let health = match sources.health.endpoint_health(&sub.endpoint).await {
        Ok(h) => Some(h.value),
        Err(e) => {
            eprintln!(
                "note: endpoint health could not be read ({e}); is --delivery-state-table right?"
            );
            None
        }
    };
    // #34 item 8: the host's record (an AWS resource has none).
    let host = match gridrelay_shared::health::origin_health_key(&sub.endpoint) {
        Some(origin) => sources
            .health
            .endpoint_health(&origin)
            .await
            .ok()
            .map(|h| h.value),
        None => None,
    };
    // A1: an OAuth subscription's token endpoint record.
    let token = match &sub.delivery_auth {
        Some(_) => {
            let key = gridrelay_shared::oauth::token_status_key(&sub.id);
            match sources.health.endpoint_health(&key).await {
                Ok(t) => Some(t.value),
                Err(e) => {
                    eprintln!("note: the token endpoint's record could not be read ({e})");
                    None
                }
            }
        }
        None => None,
    };
    let queue = match queue_counts(sources.sqs, sources.delivery_queue).await {
        Ok(counts) => Some(counts),
        Err(e) => {
            eprintln!("note: the delivery queue could not be read ({e:#})");
            None
        }
    };
    view::delivery_status_view(
        health.as_ref(),
        host.as_ref(),
        token.as_ref(),
        queue.as_ref(),
        chrono::Utc::now(),
    )
}

/// SQS's approximate counts of a queue's messages: waiting, delayed and being handled.
pub(crate) async fn queue_counts(
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
) -> anyhow::Result<view::QueueCounts> {
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

/// Runs an event-subscription command; `request` is a `create`'s and `update` an `update`'s,
/// both checked.
async fn subscription_command(
    registry: &Registry<'_>,
    status: &StatusSources<'_>,
    output: OutputFormat,
    cmd: SubscriptionCommand,
    request: Option<SubscriptionRequest>,
    update: Option<SubscriptionUpdate>,
) -> anyhow::Result<()> {
    match (cmd, request) {
        (SubscriptionCommand::Update(u), _) => {
            let update = update.context("update was not validated")?;
            update_subscription(registry, output, &u, &update).await
        }
        (SubscriptionCommand::Create(c), Some(request)) => {
            create_subscription(registry, output, &c, &request).await
        }
        (SubscriptionCommand::SigningSecret(SigningSecretCommand::Rotate(r)), _) => {
            rotate_signing_secret(registry, output, &r).await
        }
        (SubscriptionCommand::Show(s), _) => {
            show_subscription(registry.store, status, output, s).await
        }
        (SubscriptionCommand::List(l), _) => list_subscriptions(registry.store, output, &l).await,
        (SubscriptionCommand::Delete(s), _) => delete_subscription(registry, s).await,
        (SubscriptionCommand::Create(_), None) => bail!("subscription was not validated"),
        // Answered from the journal before any store is opened (`main`).
        (SubscriptionCommand::Attempts(_), _) => bail!("attempts are read from the journal"),
        (SubscriptionCommand::PortalLink(_), _) => bail!("portal links are made in main"),
    }
}

/// Prints one subscription; `extra`: a secret shown once (a signing secret), in the JSON and
/// under the table.
fn print_subscription(
    output: OutputFormat,
    sub: &Subscription,
    extra: Option<(&str, String)>,
) -> anyhow::Result<()> {
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
}

/// `event-subscription update`: the changes stored, and a new endpoint's handshake waited for
/// unless `--no-wait`.
async fn update_subscription(
    registry: &Registry<'_>,
    output: OutputFormat,
    u: &UpdateSubscription,
    update: &SubscriptionUpdate,
) -> anyhow::Result<()> {
    let Updated {
        subscription: mut sub,
        handshake,
    } = registry
        .update(&u.topic_name, &u.name, update, chrono::Utc::now())
        .await
        .map_err(registration_error)?;
    let mut failure = None;
    if let Some(which) = handshake.filter(|_| !u.no_wait) {
        sub = wait_for_provisioning(registry.store, sub, which).await?;
        failure = handshake_failure(&sub, which);
    }
    print_subscription(output, &sub, None)?;
    failure.map_or(Ok(()), |why| Err(anyhow::anyhow!(why)))
}

/// `event-subscription create`: the subscription registered, and its handshake waited for
/// unless `--no-wait`.
async fn create_subscription(
    registry: &Registry<'_>,
    output: OutputFormat,
    c: &CreateSubscription,
    request: &SubscriptionRequest,
) -> anyhow::Result<()> {
    let mut sub = registry
        .register(request, chrono::Utc::now())
        .await
        .map_err(registration_error)?;
    let mut failure = None;
    if !c.no_wait {
        sub = wait_for_provisioning(registry.store, sub, Handshake::Subscription).await?;
        failure = handshake_failure(&sub, Handshake::Subscription);
    }
    // A signing secret is shown once: verify deliveries with it.
    print_subscription(
        output,
        &sub,
        request
            .signing_secret
            .as_ref()
            .map(|s| ("signingSecret", s.to_text())),
    )?;
    failure.map_or(Ok(()), |why| Err(anyhow::anyhow!(why)))
}

/// `event-subscription signing-secret rotate`: signing with a new secret, which is printed.
async fn rotate_signing_secret(
    registry: &Registry<'_>,
    output: OutputFormat,
    r: &RotateSigningSecret,
) -> anyhow::Result<()> {
    let secret = SigningSecret::from_flag(&r.signing_secret).map_err(invalid)?;
    let grace = gridrelay_shared::signing::grace_hours(r.grace_period_hours).map_err(invalid)?;
    let sub = registry
        .rotate_signing_secret(&r.topic_name, &r.name, &secret, grace, chrono::Utc::now())
        .await
        .map_err(registration_error)?;
    print_subscription(output, &sub, Some(("signingSecret", secret.to_text())))
}

/// `event-subscription show`: the subscription, with how delivery to it goes.
async fn show_subscription(
    store: &dyn SubscriptionStore,
    status: &StatusSources<'_>,
    output: OutputFormat,
    SubscriptionName { topic_name, name }: SubscriptionName,
) -> anyhow::Result<()> {
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

/// `event-subscription list`: one page of a topic's subscriptions, in name order.
async fn list_subscriptions(
    store: &dyn SubscriptionStore,
    output: OutputFormat,
    l: &ListSubscriptions,
) -> anyhow::Result<()> {
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

/// `event-subscription delete`.
async fn delete_subscription(
    registry: &Registry<'_>,
    SubscriptionName { topic_name, name }: SubscriptionName,
) -> anyhow::Result<()> {
    if !registry
        .delete(&topic_name, &name)
        .await
        .map_err(registration_error)?
    {
        bail!("event subscription {name} on topic {topic_name} does not exist");
    }
    print(&json!({"deleted": name, "topic": topic_name}))
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

pub(crate) fn registration_error(e: RegistrationError) -> anyhow::Error {
    match e {
        RegistrationError::Invalid(e) => invalid(e),
        RegistrationError::Store(e) => store_error(e),
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
    control_queue: Option<&str>,
) -> anyhow::Result<AllowedDestinations> {
    let allowed = match given {
        Some(given) => AllowedDestinations::parse(given).map_err(invalid)?,
        None if local_stack() => AllowedDestinations::any(),
        None => AllowedDestinations::default(),
    };
    let mut own = vec![delivery_queue.to_string()];
    own.extend(control_queue.map(str::to_string));
    if let (Some(names), Some((base, _))) = (
        ResourceNames::beside_delivery_queue(delivery_queue),
        delivery_queue.rsplit_once('/'),
    ) {
        own.extend(
            [
                names.control_queue,
                names.replay_queue,
                names.dead_letter_queue,
                names.ordered_queue,
                names.delivery_redrive_queue,
                names.dead_letter_redrive_queue,
                names.ordered_redrive_queue,
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

/// A1: a secret from the file at `path`, or from standard input for `-`, checked (its line
/// end dropped). The error names the flag and the path, never what was read.
fn read_secret(path: &str) -> Result<String, LimitError> {
    let unreadable = |e: std::io::Error| {
        LimitError::new(
            "--client-secret-file",
            format!("{path:?} ({e})"),
            "a readable file holding the secret, or - for standard input",
        )
    };
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(unreadable)?
    } else {
        std::fs::read_to_string(path).map_err(unreadable)?
    };
    gridrelay_shared::oauth::validate_client_secret(&text)
}
