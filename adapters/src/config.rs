//! Names of the AWS resources a function uses, read from its environment.
//!
//! On AWS the SAM/CDK stack sets these; `gridrelay local` and the tests pass them directly.

/// DynamoDB table of topics.
pub const TOPICS_TABLE_ENV: &str = "GRIDRELAY_TOPICS_TABLE";
/// DynamoDB table of subscriptions.
pub const SUBSCRIPTIONS_TABLE_ENV: &str = "GRIDRELAY_SUBSCRIPTIONS_TABLE";
/// SQS queue of events waiting for delivery.
pub const DELIVERY_QUEUE_URL_ENV: &str = "GRIDRELAY_DELIVERY_QUEUE_URL";
/// The queue subscriptions' handshake and expiry steps go to (#34 item 12), apart from the
/// deliveries so they never wait behind a backlog: the stack's ControlQueueUrl output. The
/// deliver function takes the delivery queue's place where it is not set (a stack made before it).
pub const CONTROL_QUEUE_URL_ENV: &str = "GRIDRELAY_CONTROL_QUEUE_URL";
/// The queue replays' deliveries and their retries go to (#35), apart from live deliveries so
/// a replay's backlog never delays them: the stack's ReplayQueueUrl output. The deliver
/// function takes the delivery queue's place where it is not set (a stack made before it).
pub const REPLAY_QUEUE_URL_ENV: &str = "GRIDRELAY_REPLAY_QUEUE_URL";
/// O1: the FIFO queue ordered subscriptions' events go to, one message group per key: the
/// stack's OrderedQueueUrl output. Without it, `ingest` refuses events for an ordered
/// subscription (503) rather than deliver them out of order.
pub const ORDERED_QUEUE_URL_ENV: &str = "GRIDRELAY_ORDERED_QUEUE_URL";
/// O1: the ordered queue's redrive queue (FIFO), where `deliver` parks an ordered message
/// that cannot be read after a few receives, so its key goes on. Without it (a stack made
/// before), such a message holds its key until SQS's own redrive or retention.
pub const ORDERED_REDRIVE_QUEUE_URL_ENV: &str = "GRIDRELAY_ORDERED_REDRIVE_QUEUE_URL";
/// SQS queue of events waiting to be written to their dead-letter location.
pub const DEAD_LETTER_QUEUE_URL_ENV: &str = "GRIDRELAY_DEAD_LETTER_QUEUE_URL";
/// L7: the system topic dead-letter writes are announced on (default `gridrelay-dead-letter-events`).
pub const DEAD_LETTER_EVENTS_TOPIC_ENV: &str = "GRIDRELAY_DEAD_LETTER_EVENTS_TOPIC";

/// The publish API's public base URL; validation URLs point at it.
pub const PUBLIC_URL_ENV: &str = "GRIDRELAY_PUBLIC_URL";
/// The origin named in CloudEvents abuse-protection requests (default `eventgrid.azure.net`).
pub const WEBHOOK_ORIGIN_ENV: &str = "GRIDRELAY_WEBHOOK_ORIGIN";
/// D1, R4: DynamoDB table of endpoint health and late successes.
pub const DELIVERY_STATE_TABLE_ENV: &str = "GRIDRELAY_DELIVERY_STATE_TABLE";
/// The local runner's delivery state table (`gridrelay local`'s default prefix).
pub const DEFAULT_DELIVERY_STATE_TABLE: &str = "gridrelay-delivery-state";

/// The delivery journal's Firehose stream (#35); without it, `deliver` keeps no journal.
pub const JOURNAL_STREAM_ENV: &str = "GRIDRELAY_JOURNAL_STREAM";

/// The topic archive's Firehose streams (#35), one per retention class, as `1=name,7=name,…`
/// ([`gridrelay_shared::archive::parse_archive_streams`]); without them, `ingest` archives
/// nothing. Each writes to the journal's bucket, under its class's prefix (`archive/7d/`).
pub const ARCHIVE_STREAMS_ENV: &str = "GRIDRELAY_ARCHIVE_STREAMS";

/// Replays' DynamoDB table (#35), which `deliver` runs their steps against.
pub const REPLAYS_TABLE_ENV: &str = "GRIDRELAY_REPLAYS_TABLE";

/// The bucket the delivery journal's stream writes to, for the command line's questions.
pub const JOURNAL_BUCKET_ENV: &str = "GRIDRELAY_JOURNAL_BUCKET";

/// H1: the name prefix of the Secrets Manager secrets that hold secret delivery header values
/// (default `gridrelay`; the deliver function may read only secrets under it).
pub const SECRET_PREFIX_ENV: &str = "GRIDRELAY_SECRET_PREFIX";
pub const DEFAULT_SECRET_PREFIX: &str = "gridrelay";

pub const DEFAULT_TOPICS_TABLE: &str = "gridrelay-topics";
pub const DEFAULT_SUBSCRIPTIONS_TABLE: &str = "gridrelay-subscriptions";

#[derive(Debug, thiserror::Error)]
#[error("environment variable {name} is not set: {purpose}")]
pub struct MissingSetting {
    pub name: &'static str,
    pub purpose: &'static str,
}

/// The two DynamoDB tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableNames {
    pub topics: String,
    pub subscriptions: String,
}

impl Default for TableNames {
    fn default() -> Self {
        Self {
            topics: DEFAULT_TOPICS_TABLE.to_string(),
            subscriptions: DEFAULT_SUBSCRIPTIONS_TABLE.to_string(),
        }
    }
}

impl TableNames {
    /// From the environment, with the defaults for anything unset.
    pub fn from_env() -> Self {
        let d = Self::default();
        Self {
            topics: std::env::var(TOPICS_TABLE_ENV).unwrap_or(d.topics),
            subscriptions: std::env::var(SUBSCRIPTIONS_TABLE_ENV).unwrap_or(d.subscriptions),
        }
    }
}

/// A setting the function cannot run without.
pub fn required(name: &'static str, purpose: &'static str) -> Result<String, MissingSetting> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or(MissingSetting { name, purpose })
}

/// How long a warm function keeps the topics, subscriptions and secret header values it read
/// ([`gridrelay_ports::cache`]): [`gridrelay_ports::cache::CONFIG_CACHE_ENV`] if set, else
/// 10 s; refused out of range, naming the setting, the value and the range.
pub fn config_cache_from_env() -> Result<std::time::Duration, gridrelay_shared::limits::LimitError>
{
    use gridrelay_ports::cache::{CONFIG_CACHE_ENV, DEFAULT_CONFIG_CACHE, config_cache_time};
    match std::env::var(CONFIG_CACHE_ENV) {
        Ok(v) if !v.trim().is_empty() => config_cache_time(&v),
        _ => Ok(DEFAULT_CONFIG_CACHE),
    }
}

/// Networks outbound requests may reach although not public, where plain `http://` is allowed
/// too ([`gridrelay_shared::outbound`]): comma-separated CIDRs; unset or empty, none. The stack
/// parameter `AllowedNetworks` sets it; `gridrelay local` defaults to loopback.
pub const ALLOWED_NETWORKS_ENV: &str = "GRIDRELAY_ALLOWED_NETWORKS";

/// The allowed networks from the environment (none when unset); refused naming the value.
pub fn allowed_networks_from_env()
-> Result<gridrelay_shared::outbound::AllowedNetworks, gridrelay_shared::limits::LimitError> {
    std::env::var(ALLOWED_NETWORKS_ENV)
        .unwrap_or_default()
        .parse()
}

/// Which AWS resources events may be delivered to (S4): ARNs or ARN patterns separated by
/// commas, `*` and `?` as in IAM. The deploy sets it from `DeliveryDestinationArns`, the same
/// list the deliver function's IAM policy names; the command line reads it to refuse a
/// subscription to anything else at create time. Unset: none.
pub const DELIVERY_DESTINATIONS_ENV: &str = "GRIDRELAY_DELIVERY_DESTINATIONS";

/// The installation's own queues (delivery, dead-letter and their redrive queues), ARNs or URLs
/// separated by commas: no subscription may deliver to one, whatever
/// `GRIDRELAY_DELIVERY_DESTINATIONS` allows (#34 item 2). The deploy sets it from the stack's
/// queues; the command line reads it beside the delivery queue it is given.
pub const OWN_QUEUES_ENV: &str = "GRIDRELAY_OWN_QUEUES";
/// The Secrets Manager secret (ARN or name) holding the key every message on the
/// installation's own queues is sealed with (#34 item 2).
pub const QUEUE_KEY_SECRET_ENV: &str = "GRIDRELAY_QUEUE_KEY_SECRET";
/// The Secrets Manager secret (ARN or name) holding the key subscribers' portal links are
/// signed with (#36): the portal and `event-subscription portal-link` read it.
pub const PORTAL_KEY_SECRET_ENV: &str = "GRIDRELAY_PORTAL_KEY_SECRET";

/// The allowed destinations from the environment (none when unset; refused naming the value),
/// refusing the installation's own queues: `GRIDRELAY_OWN_QUEUES` and `known` (queue URLs or
/// ARNs the caller already has).
pub fn delivery_destinations_from_env(
    known: &[&str],
) -> Result<gridrelay_shared::destination::AllowedDestinations, gridrelay_shared::limits::LimitError>
{
    gridrelay_shared::destination::AllowedDestinations::parse(
        &std::env::var(DELIVERY_DESTINATIONS_ENV).unwrap_or_default(),
    )?
    .refusing_own_queues(known.iter().copied())
    .refusing_listed_queues(
        OWN_QUEUES_ENV,
        &std::env::var(OWN_QUEUES_ENV).unwrap_or_default(),
    )
}
