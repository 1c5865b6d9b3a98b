//! AWS resources as destinations: a subscription may deliver to an SQS queue, an SNS topic, a
//! Lambda function, an EventBridge bus or a Kinesis stream instead of a webhook, as Event Grid
//! delivers to Azure resources (S4).
//!
//! It exists so that everything about such a destination that is a rule, not a call, lives in
//! one place the deliver function, the command line and the adapters share, and is tested
//! without AWS: which ARNs name which kind of resource, which destinations an installation may
//! write to, what each service's batch API takes in one call, what an AWS error means as a
//! status (S4) and outcome (L6), and how an event becomes a message: its body is the event in
//! the subscription's delivery schema, and the fields consumers route on (event type, subject,
//! id) ride beside it as message attributes, EventBridge's `DetailType` and `Source`, or
//! Kinesis's partition key.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::classify::DeliveryOutcome;
use crate::limits::LimitError;
use crate::schema::DeliverySchema;

/// What kind of endpoint a subscription delivers to (`--endpoint-type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EndpointType {
    /// An HTTP endpoint, validated with the handshake.
    #[default]
    WebHook,
    /// An SQS queue: one message per event (`SendMessageBatch`).
    #[serde(rename = "SqsQueue")]
    Sqs,
    /// An SNS topic: one message per event (`PublishBatch`).
    #[serde(rename = "SnsTopic")]
    Sns,
    /// A Lambda function: one asynchronous invocation per batch, the batch as its payload.
    #[serde(rename = "LambdaFunction")]
    Lambda,
    /// An EventBridge event bus: one entry per event (`PutEvents`).
    #[serde(rename = "EventBridgeBus")]
    EventBridge,
    /// A Kinesis data stream: one record per event (`PutRecords`).
    #[serde(rename = "KinesisStream")]
    Kinesis,
}

/// Every endpoint type, in the order the command line lists them.
pub const ENDPOINT_TYPES: [EndpointType; 6] = [
    EndpointType::WebHook,
    EndpointType::Sqs,
    EndpointType::Sns,
    EndpointType::Lambda,
    EndpointType::EventBridge,
    EndpointType::Kinesis,
];

impl EndpointType {
    /// The name `show` prints (`destination.endpointType`), as `az` prints `WebHook`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WebHook => "WebHook",
            Self::Sqs => "SqsQueue",
            Self::Sns => "SnsTopic",
            Self::Lambda => "LambdaFunction",
            Self::EventBridge => "EventBridgeBus",
            Self::Kinesis => "KinesisStream",
        }
    }

    /// The name `--endpoint-type` takes.
    pub fn flag_name(self) -> &'static str {
        match self {
            Self::WebHook => "webhook",
            Self::Sqs => "sqs",
            Self::Sns => "sns",
            Self::Lambda => "lambda",
            Self::EventBridge => "eventbridge",
            Self::Kinesis => "kinesis",
        }
    }

    pub fn is_resource(self) -> bool {
        self != Self::WebHook
    }

    /// Whether the subscription's batching settings (B2, B3) apply: to webhooks and Lambda
    /// functions, which receive a batch as one request, as in Event Grid (webhooks and Azure
    /// Functions). Queues, topics, buses and streams receive one message per event.
    pub fn takes_batches(self) -> bool {
        matches!(self, Self::WebHook | Self::Lambda)
    }

    /// What one call of the service's API takes (none for webhooks).
    pub fn call_limits(self) -> Option<CallLimits> {
        const KIB: usize = 1024;
        let limits = match self {
            Self::WebHook => return None,
            // SendMessageBatch: 10 messages, 1 MiB in all and each.
            Self::Sqs => CallLimits {
                entries: 10,
                call_bytes: 1024 * KIB,
                entry_bytes: 1024 * KIB,
            },
            // PublishBatch: 10 messages, 256 KiB in all and each.
            Self::Sns => CallLimits {
                entries: 10,
                call_bytes: 256 * KIB,
                entry_bytes: 256 * KIB,
            },
            // Invoke (asynchronous): one payload of at most 1 MiB.
            Self::Lambda => CallLimits {
                entries: 1,
                call_bytes: 1024 * KIB,
                entry_bytes: 1024 * KIB,
            },
            // PutEvents: 10 entries, 256 KiB in all.
            Self::EventBridge => CallLimits {
                entries: 10,
                call_bytes: 256 * KIB,
                entry_bytes: 256 * KIB,
            },
            // PutRecords: 500 records, 5 MiB in all, 1 MiB each (data and partition key).
            Self::Kinesis => CallLimits {
                entries: 500,
                call_bytes: 5 * 1024 * KIB,
                entry_bytes: 1024 * KIB,
            },
        };
        Some(limits)
    }

    /// The ARN's service and resource part this type's destinations have, for errors.
    fn arn_form(self) -> &'static str {
        match self {
            Self::WebHook => "an absolute http:// or https:// URL",
            Self::Sqs => "an SQS queue ARN: arn:aws:sqs:REGION:ACCOUNT:QUEUE[.fifo]",
            Self::Sns => "an SNS topic ARN: arn:aws:sns:REGION:ACCOUNT:TOPIC[.fifo]",
            Self::Lambda => {
                "a Lambda function ARN: arn:aws:lambda:REGION:ACCOUNT:function:NAME[:VERSION_OR_ALIAS]"
            }
            Self::EventBridge => {
                "an EventBridge event bus ARN: arn:aws:events:REGION:ACCOUNT:event-bus/NAME"
            }
            Self::Kinesis => "a Kinesis stream ARN: arn:aws:kinesis:REGION:ACCOUNT:stream/NAME",
        }
    }

    /// The type an ARN's service names, if it is one gridrelay delivers to.
    pub fn of_arn(arn: &str) -> Option<Self> {
        let service = arn.strip_prefix("arn:")?.split(':').nth(1)?;
        match service {
            "sqs" => Some(Self::Sqs),
            "sns" => Some(Self::Sns),
            "lambda" => Some(Self::Lambda),
            "events" => Some(Self::EventBridge),
            "kinesis" => Some(Self::Kinesis),
            _ => None,
        }
    }
}

impl fmt::Display for EndpointType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.flag_name())
    }
}

impl FromStr for EndpointType {
    type Err = LimitError;

    /// The `--endpoint-type` names, in any case, or the names `show` prints.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ENDPOINT_TYPES
            .into_iter()
            .find(|t| t.flag_name().eq_ignore_ascii_case(text) || t.as_str() == text)
            .ok_or_else(|| {
                LimitError::new(
                    "endpointType",
                    format!("{text:?}"),
                    "one of webhook, sqs, sns, lambda, eventbridge, kinesis",
                )
            })
    }
}

/// What one call of a service's batch API takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Entries (messages, records) per call.
    pub entries: usize,
    /// Bytes of all entries of one call.
    pub call_bytes: usize,
    /// Bytes of one entry.
    pub entry_bytes: usize,
}

impl CallLimits {
    /// Cuts entries (given by their sizes, in order) into consecutive calls within the limits.
    /// An entry larger than `entry_bytes` is not in any call: it is a failed attempt of its
    /// own (413) and is returned apart, by index.
    pub fn pack(&self, sizes: &[usize]) -> (Vec<Vec<usize>>, Vec<usize>) {
        let mut calls: Vec<Vec<usize>> = Vec::new();
        let mut too_large = Vec::new();
        let mut current: Vec<usize> = Vec::new();
        let mut bytes = 0;
        for (i, &size) in sizes.iter().enumerate() {
            if size > self.entry_bytes.min(self.call_bytes) {
                too_large.push(i);
                continue;
            }
            if !current.is_empty()
                && (current.len() >= self.entries || bytes + size > self.call_bytes)
            {
                calls.push(std::mem::take(&mut current));
                bytes = 0;
            }
            current.push(i);
            bytes += size;
        }
        if !current.is_empty() {
            calls.push(current);
        }
        (calls, too_large)
    }
}

/// A subscription's AWS resource, parsed from its ARN.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceDestination {
    pub endpoint_type: EndpointType,
    pub arn: String,
    pub region: String,
    pub account: String,
    /// The queue's, topic's, bus's or stream's name; the function's name (with its
    /// qualifier, if the ARN has one, in `qualifier`).
    pub name: String,
    pub qualifier: Option<String>,
}

impl ResourceDestination {
    /// Whether it is an SQS FIFO queue or SNS FIFO topic: its messages need a group id and a
    /// deduplication id.
    pub fn is_fifo(&self) -> bool {
        matches!(self.endpoint_type, EndpointType::Sqs | EndpointType::Sns)
            && self.name.ends_with(".fifo")
    }

    /// Parses `arn` as a destination of `endpoint_type`, naming the field and the form expected
    /// when it is not one.
    pub fn parse(endpoint_type: EndpointType, arn: &str) -> Result<Self, LimitError> {
        let invalid = || LimitError::new("endpoint", format!("{arn:?}"), endpoint_type.arn_form());
        if !endpoint_type.is_resource() {
            return Err(invalid());
        }
        let parts: Vec<&str> = arn.splitn(6, ':').collect();
        let [prefix, partition, service, region, account, resource] = parts[..] else {
            return Err(invalid());
        };
        let expected_service = match endpoint_type {
            EndpointType::Sqs => "sqs",
            EndpointType::Sns => "sns",
            EndpointType::Lambda => "lambda",
            EndpointType::EventBridge => "events",
            EndpointType::Kinesis => "kinesis",
            EndpointType::WebHook => return Err(invalid()),
        };
        let region_ok = !region.is_empty()
            && region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        let account_ok = account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit());
        if prefix != "arn"
            || !matches!(partition, "aws" | "aws-cn" | "aws-us-gov")
            || service != expected_service
            || !region_ok
            || !account_ok
        {
            return Err(invalid());
        }
        let name_ok = |name: &str, max: usize, extra: &[u8]| {
            !name.is_empty()
                && name.len() <= max
                && name.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || extra.contains(&b)
                })
        };
        let (name, qualifier) = match endpoint_type {
            EndpointType::Sqs | EndpointType::Sns => {
                // A FIFO queue's or topic's name ends in `.fifo`, counted in its length.
                let max = if endpoint_type == EndpointType::Sqs {
                    80
                } else {
                    256
                };
                let base = resource.strip_suffix(".fifo").unwrap_or(resource);
                (
                    (name_ok(base, max - (resource.len() - base.len()), b"")).then_some(resource),
                    None,
                )
            }
            EndpointType::Lambda => {
                let mut rest = resource.splitn(3, ':');
                match (rest.next(), rest.next(), rest.next()) {
                    (Some("function"), Some(name), qualifier)
                        if name_ok(name, 64, b"")
                            && qualifier.is_none_or(|q| name_ok(q, 128, b"$")) =>
                    {
                        (Some(name), qualifier)
                    }
                    _ => (None, None),
                }
            }
            EndpointType::EventBridge => {
                let name = resource.strip_prefix("event-bus/");
                (name.filter(|n| name_ok(n, 256, b"./")), None)
            }
            EndpointType::Kinesis => {
                let name = resource.strip_prefix("stream/");
                (name.filter(|n| name_ok(n, 128, b".")), None)
            }
            EndpointType::WebHook => (None, None),
        };
        let name = name.ok_or_else(invalid)?;
        Ok(Self {
            endpoint_type,
            arn: arn.to_string(),
            region: region.to_string(),
            account: account.to_string(),
            name: name.to_string(),
            qualifier: qualifier.map(str::to_string),
        })
    }
}

/// Which destinations an installation may deliver to: ARN patterns, `*` matching any run of
/// characters and `?` one, as in IAM policies (the deploy's `DeliveryDestinationArns`, the
/// functions' and command line's `GRIDRELAY_DELIVERY_DESTINATIONS`). Empty: none.
///
/// The installation's own queues are refused whatever the patterns say
/// ([`AllowedDestinations::refusing_own_queues`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedDestinations {
    patterns: Vec<String>,
    own_queues: Vec<OwnQueue>,
}

/// One of the installation's own SQS queues (delivery, dead-letter and their redrive queues),
/// known by account and name. gridrelay's own messages travel there: events written into one
/// would be read as delivery messages (#34 item 2: a publisher holding one topic's key could
/// have another topic's subscriber sent chosen events), so no subscription may deliver to one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OwnQueue {
    account: String,
    name: String,
}

impl OwnQueue {
    /// From a queue's ARN (`arn:aws:sqs:REGION:ACCOUNT:NAME`) or URL (`https://sqs.REGION.
    /// amazonaws.com/ACCOUNT/NAME`, an emulator's `http://127.0.0.1:5055/ACCOUNT/NAME`).
    fn parse(queue: &str) -> Option<Self> {
        let (account, name) = if queue.starts_with("arn:") {
            let mut parts = queue.splitn(6, ':').skip(4);
            (parts.next()?, parts.next()?)
        } else {
            let mut segments = queue.trim_end_matches('/').rsplit('/');
            let name = segments.next()?;
            (segments.next()?, name)
        };
        let account_id = account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit());
        (account_id && !name.is_empty() && !name.contains(['/', ':'])).then(|| Self {
            account: account.to_string(),
            name: name.to_string(),
        })
    }
}

impl AllowedDestinations {
    /// Patterns separated by commas (blanks around them ignored). Each is `*` or starts with
    /// `arn:`.
    pub fn parse(text: &str) -> Result<Self, LimitError> {
        let mut patterns = Vec::new();
        for pattern in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if pattern != "*" && !pattern.starts_with("arn:") {
                return Err(LimitError::new(
                    "deliveryDestinations",
                    format!("{pattern:?}"),
                    "ARNs or ARN patterns (`*` and `?` as in IAM), separated by commas",
                ));
            }
            patterns.push(pattern.to_string());
        }
        Ok(Self {
            patterns,
            own_queues: Vec::new(),
        })
    }

    /// Every destination (for a local installation).
    pub fn any() -> Self {
        Self {
            patterns: vec!["*".to_string()],
            own_queues: Vec::new(),
        }
    }

    /// These queues (ARNs or URLs: the installation's own) refused whatever the patterns say.
    /// Text that names no queue is left out.
    pub fn refusing_own_queues<'a>(mut self, queues: impl IntoIterator<Item = &'a str>) -> Self {
        self.own_queues
            .extend(queues.into_iter().filter_map(OwnQueue::parse));
        self
    }

    /// As [`Self::refusing_own_queues`], for a list a user gave (`GRIDRELAY_OWN_QUEUES`): ARNs
    /// or URLs separated by commas, each of which must name a queue.
    pub fn refusing_listed_queues(self, field: &str, text: &str) -> Result<Self, LimitError> {
        let listed: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .collect();
        if let Some(bad) = listed.iter().find(|q| OwnQueue::parse(q).is_none()) {
            return Err(LimitError::new(
                field,
                format!("{bad:?}"),
                "SQS queue ARNs (arn:aws:sqs:REGION:ACCOUNT:NAME) or URLs \
                 (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME), separated by commas",
            ));
        }
        Ok(self.refusing_own_queues(listed))
    }

    /// Whether `destination` is one of the installation's own queues.
    pub fn is_own_queue(&self, destination: &ResourceDestination) -> bool {
        destination.endpoint_type == EndpointType::Sqs
            && self
                .own_queues
                .iter()
                .any(|q| q.account == destination.account && q.name == destination.name)
    }

    /// Whether events may be written to `destination`: allowed, and not one of the
    /// installation's own queues.
    pub fn permits(&self, destination: &ResourceDestination) -> bool {
        !self.is_own_queue(destination) && self.allows(&destination.arn)
    }

    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    pub fn allows(&self, arn: &str) -> bool {
        self.patterns
            .iter()
            .any(|p| glob_match(p.as_bytes(), arn.as_bytes()))
    }

    /// `Ok` if `destination` may be delivered to; the error names the ARN and the patterns.
    pub fn check(&self, destination: &ResourceDestination) -> Result<(), LimitError> {
        if self.is_own_queue(destination) {
            return Err(LimitError::new(
                "endpoint",
                format!("{:?}", destination.arn),
                "a queue that is not one of this installation's own (its delivery, dead-letter and redrive queues carry gridrelay's own messages)",
            ));
        }
        if self.allows(&destination.arn) {
            return Ok(());
        }
        let allowed = if self.patterns.is_empty() {
            "a destination this installation may deliver to; it allows none (set DeliveryDestinationArns when deploying, GRIDRELAY_DELIVERY_DESTINATIONS here)".to_string()
        } else {
            format!(
                "a destination this installation may deliver to: {}",
                self.patterns.join(", ")
            )
        };
        Err(LimitError::new(
            "endpoint",
            format!("{:?}", destination.arn),
            allowed,
        ))
    }
}

/// IAM-style matching: `*` any run of characters, `?` one; the rest literally.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// What an AWS service's error means for the attempt (S4): the status it stands for, which
/// the subscription's status table classifies, and the `lastDeliveryOutcome` it is recorded
/// as (L6). Kept with the service's error code, for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceFailure {
    pub status: u16,
    pub outcome: DeliveryOutcome,
    /// The service's error code (for example `AWS.SimpleQueueService.NonExistentQueue`).
    pub code: String,
}

impl ServiceFailure {
    /// S4: an AWS error code (and the HTTP status it came with, if any) as the status it
    /// means: validation → 400, too large → 413, access denied → 403, bad credentials → 401,
    /// not found → 404, throttled → 503. A disabled key or function is `Disabled`, a queue
    /// with too much in flight `Full` (both retried as 503). Any other code keeps its HTTP
    /// status (a 5xx is retried), or 500.
    pub fn of_code(code: &str, http_status: Option<u16>) -> Self {
        let (status, outcome) = match code {
            "InvalidParameterValue"
            | "InvalidParameter"
            | "InvalidParameterException"
            | "InvalidParameterValueException"
            | "ValidationException"
            | "ValidationError"
            | "MalformedDetail"
            | "InvalidAttributeName"
            | "InvalidAttributeValue"
            | "InvalidMessageContents"
            | "InvalidArgumentException"
            | "InvalidArgument"
            | "InvalidRequestContentException"
            | "RecursiveInvocationException"
            | "InvalidBatchEntryId"
            | "BatchEntryIdsNotDistinct"
            | "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
            | "AWS.SimpleQueueService.InvalidBatchEntryId"
            | "EmptyBatchRequest"
            | "AWS.SimpleQueueService.EmptyBatchRequest"
            | "TooManyEntriesInBatchRequest"
            | "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
            | "UnsupportedOperation"
            | "AWS.SimpleQueueService.UnsupportedOperation" => (400, DeliveryOutcome::BadRequest),
            "BatchRequestTooLong"
            | "AWS.SimpleQueueService.BatchRequestTooLong"
            | "RequestEntityTooLargeException"
            | "RequestTooLargeException"
            | "SerializedRequestEntityTooLargeException"
            | "PayloadTooLarge"
            | "EntryTooLarge" => (413, DeliveryOutcome::PayloadTooLarge),
            "AccessDenied"
            | "AccessDeniedException"
            | "AuthorizationError"
            | "KMSAccessDenied"
            | "KMSAccessDeniedException"
            | "KmsAccessDenied"
            | "KMS.AccessDeniedException"
            | "KMS.OptInRequired"
            | "KMSOptInRequired"
            | "NotAuthorized" => (403, DeliveryOutcome::Forbidden),
            "UnrecognizedClientException"
            | "InvalidClientTokenId"
            | "ExpiredToken"
            | "ExpiredTokenException"
            | "InvalidSignatureException"
            | "SignatureDoesNotMatch"
            | "MissingAuthenticationToken"
            | "IncompleteSignature" => (401, DeliveryOutcome::Unauthorized),
            "QueueDoesNotExist"
            | "AWS.SimpleQueueService.NonExistentQueue"
            | "NonExistentQueue"
            | "NotFound"
            | "NotFoundException"
            | "ResourceNotFoundException"
            | "ResourceNotFound" => (404, DeliveryOutcome::NotFound),
            "Throttling"
            | "ThrottlingException"
            | "ThrottledException"
            | "Throttled"
            | "TooManyRequestsException"
            | "RequestThrottled"
            | "RequestThrottledException"
            | "ProvisionedThroughputExceededException"
            | "LimitExceededException"
            | "KMSThrottling"
            | "KMSThrottlingException"
            | "KmsThrottled"
            | "KMS.ThrottlingException"
            | "EC2ThrottledException"
            | "ENILimitReachedException"
            | "SubnetIPAddressLimitReachedException"
            | "ServiceUnavailable"
            | "ServiceUnavailableException" => (503, DeliveryOutcome::Busy),
            "KMSDisabled"
            | "KMSDisabledException"
            | "KmsDisabled"
            | "KMSInvalidStateException"
            | "KMSInvalidState"
            | "KmsInvalidState"
            | "KMS.DisabledException"
            | "KMS.InvalidStateException"
            | "KMS.InvalidKeyUsageException"
            | "KMS.NotFoundException"
            | "KMSNotFound"
            | "KMSNotFoundException"
            | "KmsNotFound"
            | "EndpointDisabled"
            | "ResourceNotReadyException"
            | "ResourceConflictException" => (503, DeliveryOutcome::Disabled),
            "OverLimit" | "AWS.SimpleQueueService.OverLimit" => (503, DeliveryOutcome::Full),
            _ => {
                let status = http_status
                    .filter(|s| (400..600).contains(s))
                    .unwrap_or(500);
                (status, DeliveryOutcome::of_status(status))
            }
        };
        Self {
            status,
            outcome,
            code: code.to_string(),
        }
    }

    /// An entry gridrelay did not send: larger than one entry of the service may be.
    pub fn entry_too_large() -> Self {
        Self::of_code("EntryTooLarge", None)
    }
}

/// The fields consumers route on, read from an event as it is queued (its delivery schema's
/// field names; a custom-schema event's Event Grid envelope).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingFields {
    pub id: String,
    pub event_type: String,
    pub subject: String,
}

impl RoutingFields {
    pub fn of(event: &RawValue, schema: DeliverySchema) -> Self {
        #[derive(Deserialize)]
        struct Fields {
            #[serde(default)]
            id: Option<serde_json::Value>,
            #[serde(default, rename = "eventType")]
            event_type: Option<serde_json::Value>,
            #[serde(default, rename = "type")]
            cloud_type: Option<serde_json::Value>,
            #[serde(default)]
            subject: Option<serde_json::Value>,
        }
        let text = |v: Option<serde_json::Value>| match v {
            Some(serde_json::Value::String(s)) => s,
            _ => String::new(),
        };
        let Ok(f) = serde_json::from_str::<Fields>(event.get()) else {
            return Self::default();
        };
        let event_type = match schema {
            DeliverySchema::CloudEventSchemaV1_0 => f.cloud_type,
            _ => f.event_type,
        };
        Self {
            id: text(f.id),
            event_type: text(event_type),
            subject: text(f.subject),
        }
    }
}

/// What a message says besides its body: the event's routing fields, and the subscription
/// and attempt count as webhooks get them in headers (H2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageContext<'a> {
    pub topic: &'a str,
    pub subscription: &'a str,
    /// Attempts before this one (`aeg-delivery-count`).
    pub delivery_count: u32,
}

/// SQS and SNS message attributes of one event (all `String`): `eventType`, `subject`, `id`,
/// `aeg-subscription-name` and `aeg-delivery-count`. A value that is empty, or holds a
/// character the services do not take in an attribute, is left out (the body has it).
pub fn message_attributes(
    fields: &RoutingFields,
    context: &MessageContext<'_>,
) -> Vec<(&'static str, String)> {
    let allowed = crate::queue_text::sqs_takes;
    [
        ("eventType", fields.event_type.clone()),
        ("subject", fields.subject.clone()),
        ("id", fields.id.clone()),
        ("aeg-subscription-name", context.subscription.to_string()),
        ("aeg-delivery-count", context.delivery_count.to_string()),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty() && v.chars().all(allowed))
    .collect()
}

/// The bytes SQS and SNS count for a message: its body, and each attribute's name, type
/// (`String`) and value.
pub fn message_bytes(body: &str, attributes: &[(&'static str, String)]) -> usize {
    body.len()
        + attributes
            .iter()
            .map(|(n, v)| n.len() + "String".len() + v.len())
            .sum::<usize>()
}

/// Longest EventBridge `Source`, `DetailType` and Kinesis partition key taken here.
const MAX_SOURCE_CHARS: usize = 256;
const MAX_DETAIL_TYPE_CHARS: usize = 128;
const MAX_PARTITION_KEY_CHARS: usize = 256;

/// EventBridge `Source` of one event: its subject, so rules can match on it (prefix
/// patterns), or `gridrelay.TOPIC` when it has none, is longer than 256 characters, or starts
/// with `aws.` (reserved for AWS).
pub fn eventbridge_source(fields: &RoutingFields, context: &MessageContext<'_>) -> String {
    let s = &fields.subject;
    if !s.is_empty() && s.chars().count() <= MAX_SOURCE_CHARS && !s.starts_with("aws.") {
        s.clone()
    } else {
        format!("gridrelay.{}", context.topic)
    }
}

/// EventBridge `DetailType` of one event: its event type, or `gridrelay.Event` when it has
/// none or is longer than 128 characters.
pub fn eventbridge_detail_type(fields: &RoutingFields) -> String {
    let t = &fields.event_type;
    if !t.is_empty() && t.chars().count() <= MAX_DETAIL_TYPE_CHARS {
        t.clone()
    } else {
        "gridrelay.Event".to_string()
    }
}

/// Bytes EventBridge counts for an entry: `Source`, `DetailType`, `Detail` and the bus.
pub fn eventbridge_bytes(
    body: &str,
    fields: &RoutingFields,
    context: &MessageContext<'_>,
) -> usize {
    body.len() + eventbridge_source(fields, context).len() + eventbridge_detail_type(fields).len()
}

/// Kinesis partition key of one event: its subject, so one subject's events stay on one shard
/// in order, or its id when it has no subject (or one longer than 256 characters), or the
/// topic's name when it has neither.
pub fn kinesis_partition_key(fields: &RoutingFields, context: &MessageContext<'_>) -> String {
    [&fields.subject, &fields.id]
        .into_iter()
        .find(|k| !k.is_empty() && k.chars().count() <= MAX_PARTITION_KEY_CHARS)
        .cloned()
        .unwrap_or_else(|| context.topic.to_string())
}

/// Longest FIFO message group id and deduplication id.
const MAX_FIFO_ID_CHARS: usize = 128;

/// The message group of one event in a FIFO queue or topic: its subject, so one subject's
/// events are handed out in the order the queue got them, or its id when the subject is empty,
/// longer than 128 characters or holds a character a group id may not (letters, digits and
/// ASCII punctuation only), or the topic's name when the id cannot be one either. (gridrelay
/// itself promises no order, G2: retries and concurrent calls may reorder events.)
pub fn fifo_group_id(fields: &RoutingFields, context: &MessageContext<'_>) -> String {
    let fits = |k: &str| {
        !k.is_empty()
            && k.len() <= MAX_FIFO_ID_CHARS
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b.is_ascii_punctuation())
    };
    [fields.subject.as_str(), fields.id.as_str(), context.topic]
        .into_iter()
        .find(|k| fits(k))
        .unwrap_or("gridrelay")
        .to_string()
}

/// The deduplication id of one event in a FIFO queue or topic: the same for every attempt of
/// the same event (a hash of topic, subscription, id and the body as delivered), so the queue
/// keeps one copy of an event sent again within its five-minute window (a retry after an
/// answer that was lost, or the same event published again). Two events that share an id but
/// not their content (a custom schema's own `id` field, CloudEvents of different sources) are
/// two messages: nothing distinct is lost (G1).
pub fn fifo_deduplication_id(
    fields: &RoutingFields,
    context: &MessageContext<'_>,
    body: &str,
) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for part in [context.topic, context.subscription, fields.id.as_str()] {
        hash.update(part.len().to_be_bytes());
        hash.update(part.as_bytes());
    }
    hash.update(body.as_bytes());
    crate::validation::hex(&hash.finalize())
}

/// Bytes the service counts for one entry of `endpoint_type` carrying `body`.
pub fn entry_bytes(
    endpoint_type: EndpointType,
    body: &str,
    fields: &RoutingFields,
    context: &MessageContext<'_>,
) -> usize {
    match endpoint_type {
        EndpointType::Sqs | EndpointType::Sns => {
            message_bytes(body, &message_attributes(fields, context))
        }
        EndpointType::EventBridge => eventbridge_bytes(body, fields, context),
        EndpointType::Kinesis => body.len() + kinesis_partition_key(fields, context).len(),
        EndpointType::Lambda | EndpointType::WebHook => body.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUEUE: &str = "arn:aws:sqs:us-east-1:123456789012:orders";

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).unwrap()
    }

    #[test]
    fn endpoint_types_read_both_names_and_refuse_others() {
        for t in ENDPOINT_TYPES {
            assert_eq!(
                t.flag_name()
                    .to_uppercase()
                    .parse::<EndpointType>()
                    .unwrap(),
                t
            );
            assert_eq!(t.as_str().parse::<EndpointType>().unwrap(), t);
        }
        let e = "servicebus".parse::<EndpointType>().unwrap_err();
        assert_eq!(e.field, "endpointType");
        assert!(e.allowed.contains("eventbridge"), "{e}");
    }

    /// Each type takes its own service's ARNs and names the form it wants otherwise.
    #[test]
    fn arns_are_parsed_by_type_and_refused_naming_the_form() {
        let d = ResourceDestination::parse(EndpointType::Sqs, QUEUE).unwrap();
        assert_eq!(
            (d.region.as_str(), d.account.as_str(), d.name.as_str()),
            ("us-east-1", "123456789012", "orders")
        );
        let f = ResourceDestination::parse(
            EndpointType::Lambda,
            "arn:aws:lambda:eu-west-1:123456789012:function:handle-orders:live",
        )
        .unwrap();
        assert_eq!(
            (f.name.as_str(), f.qualifier.as_deref()),
            ("handle-orders", Some("live"))
        );
        let b = ResourceDestination::parse(
            EndpointType::EventBridge,
            "arn:aws:events:us-east-1:123456789012:event-bus/orders",
        )
        .unwrap();
        assert_eq!(b.name, "orders");
        let s = ResourceDestination::parse(
            EndpointType::Kinesis,
            "arn:aws-cn:kinesis:cn-north-1:123456789012:stream/clicks.v2",
        )
        .unwrap();
        assert_eq!(s.name, "clicks.v2");
        assert!(
            ResourceDestination::parse(EndpointType::Sns, "arn:aws:sns:us-east-1:123456789012:t")
                .is_ok()
        );

        for (t, arn) in [
            (EndpointType::Sns, QUEUE),
            (EndpointType::Sqs, "arn:aws:sqs:us-east-1:12345:orders"),
            (EndpointType::Sqs, "arn:aws:sqs:us-east-1:123456789012:"),
            (
                EndpointType::Sqs,
                "https://sqs.us-east-1.amazonaws.com/123456789012/orders",
            ),
            (
                EndpointType::Lambda,
                "arn:aws:lambda:us-east-1:123456789012:orders",
            ),
            (
                EndpointType::EventBridge,
                "arn:aws:events:us-east-1:123456789012:rule/x",
            ),
            (
                EndpointType::Kinesis,
                "arn:aws:kinesis:us-east-1:123456789012:stream/a b",
            ),
            (EndpointType::WebHook, QUEUE),
        ] {
            let e = ResourceDestination::parse(t, arn).unwrap_err();
            assert_eq!(e.field, "endpoint");
            assert_eq!(e.allowed, t.arn_form(), "{arn}");
        }
        let fifo = ResourceDestination::parse(
            EndpointType::Sqs,
            "arn:aws:sqs:us-east-1:123456789012:o.fifo",
        )
        .unwrap();
        assert!(fifo.is_fifo());
        assert!(
            !ResourceDestination::parse(EndpointType::Sqs, QUEUE)
                .unwrap()
                .is_fifo()
        );
        let long = format!("arn:aws:sqs:us-east-1:123456789012:{}.fifo", "q".repeat(75));
        assert!(ResourceDestination::parse(EndpointType::Sqs, &long).is_ok());
        let too_long = format!("arn:aws:sqs:us-east-1:123456789012:{}.fifo", "q".repeat(76));
        assert!(ResourceDestination::parse(EndpointType::Sqs, &too_long).is_err());
        assert_eq!(EndpointType::of_arn(QUEUE), Some(EndpointType::Sqs));
        assert_eq!(EndpointType::of_arn("arn:aws:s3:::bucket"), None);
    }

    /// Only the destinations the installation names may be delivered to.
    #[test]
    fn allowed_destinations_match_like_iam() {
        let a = AllowedDestinations::parse(
            " arn:aws:sqs:us-east-1:123456789012:orders-* , arn:aws:sns:*:123456789012:alert?",
        )
        .unwrap();
        assert!(a.allows("arn:aws:sqs:us-east-1:123456789012:orders-eu"));
        assert!(a.allows("arn:aws:sqs:us-east-1:123456789012:orders-"));
        assert!(!a.allows("arn:aws:sqs:us-east-1:123456789012:orders"));
        assert!(a.allows("arn:aws:sns:eu-west-1:123456789012:alerts"));
        assert!(!a.allows("arn:aws:sns:eu-west-1:123456789012:alertss"));
        let d = ResourceDestination::parse(EndpointType::Sqs, QUEUE).unwrap();
        let e = a.check(&d).unwrap_err();
        assert!(e.allowed.contains("orders-*"), "{e}");
        let none = AllowedDestinations::default().check(&d).unwrap_err();
        assert!(none.allowed.contains("allows none"), "{none}");
        assert!(AllowedDestinations::any().check(&d).is_ok());
        let bad = AllowedDestinations::parse("orders").unwrap_err();
        assert_eq!(bad.field, "deliveryDestinations");
        assert_eq!(
            AllowedDestinations::parse("").unwrap(),
            AllowedDestinations::default()
        );
    }

    /// #34 item 2: the installation's own queues, named by URL or ARN, are refused whatever
    /// the patterns allow (`*` included), at create and at delivery; other queues, and other
    /// kinds of resource of the same name, are not.
    #[test]
    fn the_installations_own_queues_are_never_destinations() {
        let a = AllowedDestinations::any().refusing_own_queues([
            "http://127.0.0.1:5055/123456789012/gridrelay-delivery",
            "arn:aws:sqs:us-east-1:123456789012:gridrelay-dead-letter",
            "not a queue",
        ]);
        let queue = |arn: &str| ResourceDestination::parse(EndpointType::Sqs, arn).unwrap();
        for own in [
            "arn:aws:sqs:us-east-1:123456789012:gridrelay-delivery",
            "arn:aws:sqs:eu-west-1:123456789012:gridrelay-dead-letter",
        ] {
            assert!(!a.permits(&queue(own)), "{own}");
            let e = a.check(&queue(own)).unwrap_err();
            assert_eq!(e.field, "endpoint");
            assert!(e.value.contains(own), "{e}");
            assert!(
                e.allowed.contains("not one of this installation's own"),
                "{e}"
            );
        }
        for other in [
            "arn:aws:sqs:us-east-1:123456789012:gridrelay-delivery-copy",
            "arn:aws:sqs:us-east-1:210987654321:gridrelay-delivery",
        ] {
            assert!(a.permits(&queue(other)), "{other}");
            assert!(a.check(&queue(other)).is_ok(), "{other}");
        }
        let topic = ResourceDestination::parse(
            EndpointType::Sns,
            "arn:aws:sns:us-east-1:123456789012:gridrelay-delivery",
        )
        .unwrap();
        assert!(a.permits(&topic));

        // A list a user gives must name queues: a name alone protects nothing, so it is refused.
        let listed = AllowedDestinations::any()
            .refusing_listed_queues(
                "GRIDRELAY_OWN_QUEUES",
                " arn:aws:sqs:us-east-1:123456789012:a , https://sqs.us-east-1.amazonaws.com/123456789012/b,",
            )
            .unwrap();
        assert!(!listed.permits(&queue("arn:aws:sqs:us-east-1:123456789012:a")));
        assert!(!listed.permits(&queue("arn:aws:sqs:us-east-1:123456789012:b")));
        for bad in [
            "gridrelay-delivery",
            "http://localhost:9324/queue/gridrelay-delivery",
        ] {
            let e = AllowedDestinations::any()
                .refusing_listed_queues("GRIDRELAY_OWN_QUEUES", bad)
                .unwrap_err();
            assert_eq!(e.field, "GRIDRELAY_OWN_QUEUES");
            assert!(
                e.value.contains(bad) && e.allowed.contains("queue ARNs"),
                "{e}"
            );
        }
    }

    /// S4: AWS errors mean the status they stand for, with 003's outcome names.
    #[test]
    fn aws_errors_map_to_the_status_they_mean_s4() {
        let s = |code| {
            let f = ServiceFailure::of_code(code, Some(400));
            (f.status, f.outcome)
        };
        assert_eq!(
            s("InvalidParameterValue"),
            (400, DeliveryOutcome::BadRequest)
        );
        assert_eq!(s("MalformedDetail"), (400, DeliveryOutcome::BadRequest));
        assert_eq!(
            s("AWS.SimpleQueueService.BatchRequestTooLong"),
            (413, DeliveryOutcome::PayloadTooLarge)
        );
        assert_eq!(
            s("RequestEntityTooLargeException"),
            (413, DeliveryOutcome::PayloadTooLarge)
        );
        assert_eq!(
            s("AccessDeniedException"),
            (403, DeliveryOutcome::Forbidden)
        );
        assert_eq!(s("AuthorizationError"), (403, DeliveryOutcome::Forbidden));
        assert_eq!(
            s("UnrecognizedClientException"),
            (401, DeliveryOutcome::Unauthorized)
        );
        assert_eq!(
            s("AWS.SimpleQueueService.NonExistentQueue"),
            (404, DeliveryOutcome::NotFound)
        );
        assert_eq!(s("NotFound"), (404, DeliveryOutcome::NotFound));
        assert_eq!(
            s("ResourceNotFoundException"),
            (404, DeliveryOutcome::NotFound)
        );
        assert_eq!(
            s("ProvisionedThroughputExceededException"),
            (503, DeliveryOutcome::Busy)
        );
        assert_eq!(s("ThrottlingException"), (503, DeliveryOutcome::Busy));
        assert_eq!(s("KMSDisabledException"), (503, DeliveryOutcome::Disabled));
        // The query-compatible codes aws-sdk-sqs reports, and SNS's and Kinesis's own: a KMS
        // key's trouble is retried, never a 400 dead-lettered at once.
        for (code, expected) in [
            (
                "KMS.AccessDeniedException",
                (403, DeliveryOutcome::Forbidden),
            ),
            ("KMS.OptInRequired", (403, DeliveryOutcome::Forbidden)),
            ("KMS.ThrottlingException", (503, DeliveryOutcome::Busy)),
            ("KMS.DisabledException", (503, DeliveryOutcome::Disabled)),
            (
                "KMS.InvalidStateException",
                (503, DeliveryOutcome::Disabled),
            ),
            (
                "KMS.InvalidKeyUsageException",
                (503, DeliveryOutcome::Disabled),
            ),
            ("KMS.NotFoundException", (503, DeliveryOutcome::Disabled)),
            ("KMSNotFound", (503, DeliveryOutcome::Disabled)),
            ("KMSNotFoundException", (503, DeliveryOutcome::Disabled)),
            ("KMSThrottlingException", (503, DeliveryOutcome::Busy)),
            ("KMSOptInRequired", (403, DeliveryOutcome::Forbidden)),
            (
                "SerializedRequestEntityTooLargeException",
                (413, DeliveryOutcome::PayloadTooLarge),
            ),
        ] {
            assert_eq!(s(code), expected, "{code}");
        }
        assert_eq!(
            s("AWS.SimpleQueueService.OverLimit"),
            (503, DeliveryOutcome::Full)
        );
        assert_eq!(
            ServiceFailure::of_code("InternalFailure", Some(500)).status,
            500
        );
        assert_eq!(ServiceFailure::of_code("Weird", Some(409)).status, 409);
        assert_eq!(ServiceFailure::of_code("Weird", Some(200)).status, 500);
        assert_eq!(ServiceFailure::entry_too_large().status, 413);
    }

    /// Calls stay within each service's entries and bytes; an entry too large for one goes
    /// in none.
    #[test]
    fn entries_are_packed_within_the_service_limits() {
        let sqs = EndpointType::Sqs.call_limits().unwrap();
        let (calls, big) = sqs.pack(&[10; 25]);
        assert_eq!(
            calls.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![10, 10, 5]
        );
        assert!(big.is_empty());
        let sns = EndpointType::Sns.call_limits().unwrap();
        let (calls, big) = sns.pack(&[200_000, 100_000, 300_000, 50_000]);
        assert_eq!(calls, vec![vec![0], vec![1, 3]]);
        assert_eq!(big, vec![2]);
        assert!(EndpointType::WebHook.call_limits().is_none());
        let kinesis = EndpointType::Kinesis.call_limits().unwrap();
        assert_eq!(kinesis.pack(&[1; 1200]).0.len(), 3);
    }

    proptest::proptest! {
        /// Every entry is in exactly one call or too large, in order, and no call passes a
        /// limit.
        #[test]
        fn packing_keeps_every_entry_once(sizes in proptest::collection::vec(0usize..400_000, 0..60), kind in 1usize..6) {
            let limits = ENDPOINT_TYPES[kind].call_limits().unwrap();
            let (calls, big) = limits.pack(&sizes);
            let mut seen: Vec<usize> = calls.iter().flatten().copied().chain(big.iter().copied()).collect();
            seen.sort_unstable();
            proptest::prop_assert_eq!(seen, (0..sizes.len()).collect::<Vec<_>>());
            for call in &calls {
                proptest::prop_assert!(!call.is_empty() && call.len() <= limits.entries);
                proptest::prop_assert!(call.iter().map(|&i| sizes[i]).sum::<usize>() <= limits.call_bytes);
                proptest::prop_assert!(call.windows(2).all(|w| w[0] < w[1]));
            }
            for &i in &big {
                proptest::prop_assert!(sizes[i] > limits.entry_bytes.min(limits.call_bytes));
            }
        }
    }

    /// FIFO queues and topics: a group per subject (or id, or topic), and one deduplication id
    /// per event and subscription, the same at every attempt.
    #[test]
    fn fifo_messages_are_grouped_by_subject_and_deduplicated_by_event() {
        let context = MessageContext {
            topic: "shop",
            subscription: "audit",
            delivery_count: 0,
        };
        let fields = |id: &str, subject: &str| RoutingFields {
            id: id.into(),
            event_type: "t".into(),
            subject: subject.into(),
        };
        assert_eq!(
            fifo_group_id(&fields("1", "/orders/7"), &context),
            "/orders/7"
        );
        assert_eq!(fifo_group_id(&fields("1", "/café"), &context), "1");
        assert_eq!(fifo_group_id(&fields("1", &"s".repeat(129)), &context), "1");
        assert_eq!(fifo_group_id(&fields("", ""), &context), "shop");
        let a = fifo_deduplication_id(&fields("1", "/a"), &context, "{}");
        assert_eq!(a.len(), 64);
        assert_eq!(a, fifo_deduplication_id(&fields("1", "/a"), &context, "{}"));
        assert_ne!(
            a,
            fifo_deduplication_id(&fields("1", "/b"), &context, "{\"x\":1}"),
            "the same id with other content is another event"
        );
        assert_ne!(a, fifo_deduplication_id(&fields("2", "/a"), &context, "{}"));
        let other = MessageContext {
            subscription: "billing",
            ..context.clone()
        };
        assert_ne!(a, fifo_deduplication_id(&fields("1", "/a"), &other, "{}"));
        assert_ne!(
            fifo_deduplication_id(&fields("", "/a"), &context, "{\"n\":1}"),
            fifo_deduplication_id(&fields("", "/a"), &context, "{\"n\":2}")
        );
    }

    /// Consumers route on the type, subject and id without reading the body.
    #[test]
    fn routing_fields_ride_beside_the_body() {
        let eg = raw(r#"{"id":"1","eventType":"Order.Created","subject":"/orders/7","data":{}}"#);
        let f = RoutingFields::of(&eg, DeliverySchema::EventGridSchema);
        assert_eq!(
            (f.id.as_str(), f.event_type.as_str(), f.subject.as_str()),
            ("1", "Order.Created", "/orders/7")
        );
        let ce = raw(r#"{"id":"2","type":"Order.Paid","source":"/s","specversion":"1.0"}"#);
        let f = RoutingFields::of(&ce, DeliverySchema::CloudEventSchemaV1_0);
        assert_eq!(
            (f.event_type.as_str(), f.subject.as_str()),
            ("Order.Paid", "")
        );
        let context = MessageContext {
            topic: "shop",
            subscription: "audit",
            delivery_count: 2,
        };
        let attributes = message_attributes(&f, &context);
        assert_eq!(
            attributes,
            vec![
                ("eventType", "Order.Paid".to_string()),
                ("id", "2".to_string()),
                ("aeg-subscription-name", "audit".to_string()),
                ("aeg-delivery-count", "2".to_string()),
            ]
        );
        let odd = RoutingFields {
            id: "x".into(),
            event_type: "a\u{1}b".into(),
            subject: String::new(),
        };
        assert!(
            message_attributes(&odd, &context)
                .iter()
                .all(|(n, _)| *n != "eventType")
        );
        assert_eq!(
            message_bytes("{}", &[("id", "x".to_string())]),
            2 + 2 + 6 + 1
        );

        assert_eq!(eventbridge_source(&f, &context), "gridrelay.shop");
        let with_subject = RoutingFields::of(&eg, DeliverySchema::EventGridSchema);
        assert_eq!(eventbridge_source(&with_subject, &context), "/orders/7");
        assert_eq!(eventbridge_detail_type(&with_subject), "Order.Created");
        assert_eq!(
            eventbridge_detail_type(&RoutingFields::default()),
            "gridrelay.Event"
        );
        assert_eq!(kinesis_partition_key(&with_subject, &context), "/orders/7");
        assert_eq!(kinesis_partition_key(&f, &context), "2");
        assert_eq!(
            kinesis_partition_key(&RoutingFields::default(), &context),
            "shop"
        );
        assert_eq!(
            RoutingFields::of(&raw("[1]"), DeliverySchema::EventGridSchema),
            RoutingFields::default()
        );
    }
}
