//! What a million delivered events cost on AWS, from what a run counted and timed, at list
//! prices. The bench counts every AWS API call the local stack makes (`aws_calls`), times every
//! handler invocation as Lambda would bill it (the runner's stop report), and knows what it
//! published; this module prices those counts. Pure, so the arithmetic is unit-tested.

/// AWS list prices, us-east-1, as published on the services' pricing pages (checked
/// 2025-06; first paid tier, free tiers ignored). Change them here.
#[derive(Debug, Clone, Copy)]
pub struct Prices {
    /// API Gateway HTTP API, per request, metered in 512 KB units.
    pub http_api_request: f64,
    /// Lambda, per request.
    pub lambda_request: f64,
    /// Lambda duration per GB-second, x86_64 and arm64.
    pub lambda_gb_second_x86: f64,
    pub lambda_gb_second_arm: f64,
    /// SQS standard queue, per request, metered in 64 KB chunks.
    pub sqs_request: f64,
    /// SQS FIFO queue (O1's ordered queue), per request, metered in 64 KB chunks.
    pub sqs_fifo_request: f64,
    /// DynamoDB on demand, per read and write request unit.
    pub dynamodb_read: f64,
    pub dynamodb_write: f64,
    /// S3 standard, per PUT/POST/LIST and per GET.
    pub s3_put: f64,
    pub s3_get: f64,
    /// Secrets Manager, per API call.
    pub secrets_call: f64,
    /// Amazon Data Firehose, Direct PUT, per GB ingested (first 500 TB), each record rounded
    /// up to 5 KB: per 5 KB step.
    pub firehose_5kb_step: f64,
    /// S3 standard storage, per GB-month.
    pub s3_gb_month: f64,
}

pub const LIST_PRICES: Prices = Prices {
    http_api_request: 1.00e-6,
    lambda_request: 0.20e-6,
    lambda_gb_second_x86: 0.000_016_666_7,
    lambda_gb_second_arm: 0.000_013_333_4,
    sqs_request: 0.40e-6,
    sqs_fifo_request: 0.50e-6,
    dynamodb_read: 0.125e-6,
    dynamodb_write: 0.625e-6,
    s3_put: 0.005e-3,
    s3_get: 0.000_4e-3,
    secrets_call: 0.05e-4,
    // $0.029 per GB, 5 KB of it (decimal units, the dearer reading).
    firehose_5kb_step: 0.029 * 5e3 / 1e9,
    s3_gb_month: 0.023,
};

/// How long the journal is kept by default (`JournalRetentionDays`), for its storage's cost.
pub const JOURNAL_RETENTION_DAYS: f64 = 7.0;
/// The benchmark topics' archive retention (`--retention-days 7`).
pub const ARCHIVE_RETENTION_DAYS: f64 = 7.0;

/// How long the benchmark topics' archived events are stored: their retention's class and its
/// day of margin (`shared::archive::class_expiry_days`; 7 days keeps 8), for the archive
/// storage's cost.
pub fn archive_stored_days() -> f64 {
    use gridrelay_shared::archive::{archive_class, class_expiry_days};
    archive_class(ARCHIVE_RETENTION_DAYS as u16)
        .map_or(0.0, |class| f64::from(class_expiry_days(class)))
}

/// The deduplicated rows' window (`--dedup-window-seconds`, P1): the longest. What it costs
/// does not depend on it (a read and a write of each event's id); its marks' storage is a
/// few hundred bytes per event for about an hour and a day at most, under $0.01 per million.
pub const DEDUP_WINDOW_SECONDS: u16 = 300;

/// What the managed peers charge per million events delivered once, at the same date.
pub const PEERS: [(&str, f64); 2] = [
    // $1.00 per million custom events + $0.20 per million API destination invocations.
    ("EventBridge + API destinations", 1.20),
    // $0.60 per million operations: one to publish, one to deliver (64 KB chunks).
    ("Azure Event Grid (basic)", 1.20),
];

/// One function's invocations and the milliseconds Lambda would bill for them.
#[derive(Debug, Clone, Copy, Default)]
pub struct FunctionTime {
    pub invocations: u64,
    pub billed_ms: u64,
    pub memory_mb: u32,
}

/// What a run did, counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub events: u64,
    /// Publish requests, each in 512 KB units.
    pub http_api_units: u64,
    pub ingest: FunctionTime,
    pub deliver: FunctionTime,
    pub dead_letter: FunctionTime,
    /// SQS requests, each in 64 KB chunks of its payload.
    pub sqs_chunks: u64,
    /// DynamoDB calls that read and that write; each priced as one request unit (items here
    /// are under 1 KB; a strongly consistent read under 4 KB is one unit).
    pub dynamodb_reads: u64,
    pub dynamodb_writes: u64,
    pub s3_puts: u64,
    pub s3_gets: u64,
    pub secrets_calls: u64,
    /// The delivery journal's Firehose records, in the 5 KB steps they are billed in.
    pub firehose_steps: u64,
    /// The journal's bytes as stored (its records, compressed by their writers), kept
    /// [`JOURNAL_RETENTION_DAYS`].
    pub journal_stored_bytes: u64,
    /// The topic archive's Firehose records (`ingest`'s), in 5 KB steps.
    pub archive_steps: u64,
    /// The archive's bytes as stored, kept [`archive_stored_days`].
    pub archive_stored_bytes: u64,
}

/// Dollars per million events, by what they pay for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostPerMillion {
    pub api_gateway: f64,
    pub lambda: f64,
    pub sqs: f64,
    pub dynamodb: f64,
    pub other: f64,
    /// The delivery journal: Firehose ingestion and S3 storage for its retention (#35).
    pub journal: f64,
    /// The topic archive: Firehose ingestion and S3 storage for the topic's retention (#35).
    pub archive: f64,
}

impl CostPerMillion {
    pub fn total(&self) -> f64 {
        self.api_gateway
            + self.lambda
            + self.sqs
            + self.dynamodb
            + self.other
            + self.journal
            + self.archive
    }
}

/// Which processor the functions run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    X86,
    Arm,
}

impl Usage {
    /// The run's cost scaled to a million events.
    pub fn per_million(&self, prices: &Prices, arch: Architecture) -> CostPerMillion {
        let scale = if self.events == 0 {
            0.0
        } else {
            1e6 / self.events as f64
        };
        let gb_second = match arch {
            Architecture::X86 => prices.lambda_gb_second_x86,
            Architecture::Arm => prices.lambda_gb_second_arm,
        };
        let lambda: f64 = [self.ingest, self.deliver, self.dead_letter]
            .iter()
            .map(|f| {
                f.invocations as f64 * prices.lambda_request
                    + f.billed_ms as f64 / 1000.0 * f64::from(f.memory_mb) / 1024.0 * gb_second
            })
            .sum();
        CostPerMillion {
            api_gateway: self.http_api_units as f64 * prices.http_api_request * scale,
            lambda: lambda * scale,
            sqs: self.sqs_chunks as f64 * prices.sqs_request * scale,
            dynamodb: (self.dynamodb_reads as f64 * prices.dynamodb_read
                + self.dynamodb_writes as f64 * prices.dynamodb_write)
                * scale,
            other: (self.s3_puts as f64 * prices.s3_put
                + self.s3_gets as f64 * prices.s3_get
                + self.secrets_calls as f64 * prices.secrets_call)
                * scale,
            journal: (self.firehose_steps as f64 * prices.firehose_5kb_step
                + self.journal_stored_bytes as f64 / 1e9
                    * prices.s3_gb_month
                    * (JOURNAL_RETENTION_DAYS / 30.0))
                * scale,
            archive: (self.archive_steps as f64 * prices.firehose_5kb_step
                + self.archive_stored_bytes as f64 / 1e9
                    * prices.s3_gb_month
                    * (archive_stored_days() / 30.0))
                * scale,
        }
    }
}

/// What a deployed stack pays in a month in which it receives nothing (#38): what is billed by
/// the hour or the call whether events flow or not. EventBridge and Event Grid charge nothing
/// for an idle bus or topic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdleCost {
    /// The SQS event sources' long polls of empty queues: [`IDLE_POLLERS`] each, a
    /// `ReceiveMessage` every [`LONG_POLL_SECONDS`].
    pub sqs_polling: f64,
    pub alarms: f64,
    pub secrets: f64,
}

impl IdleCost {
    pub fn total(&self) -> f64 {
        self.sqs_polling + self.alarms + self.secrets
    }
}

/// What a stack holds that is billed while idle (counted from `infra/template.yaml`: a test
/// keeps these true).
#[derive(Debug, Clone, Copy)]
pub struct IdleParts {
    /// SQS event-source mappings on standard queues: the delivery, control, replay and
    /// dead-letter queues'.
    pub event_sources: u32,
    /// On FIFO queues, whose requests cost more: the ordered queue's (O1).
    pub fifo_event_sources: u32,
    pub alarms: u32,
    /// Secrets Manager secrets the stack makes: the queue key and the portal key.
    pub secrets: u32,
}

pub const STACK_IDLE_PARTS: IdleParts = IdleParts {
    event_sources: 4,
    fifo_event_sources: 1,
    alarms: 7,
    secrets: 2,
};

/// Long-polling connections Lambda keeps open on each SQS event source while its queue is
/// empty (Lambda starts with five and scales from there).
pub const IDLE_POLLERS: u32 = 5;
/// How long each of them waits in a `ReceiveMessage` before the next (SQS's longest wait).
pub const LONG_POLL_SECONDS: f64 = 20.0;
/// CloudWatch standard alarm, per month; Secrets Manager secret, per month.
pub const ALARM_MONTH: f64 = 0.10;
pub const SECRET_MONTH: f64 = 0.40;

impl IdleParts {
    /// A 30-day month's idle cost at `prices`.
    pub fn per_month(&self, prices: &Prices) -> IdleCost {
        let month_seconds = 30.0 * 86_400.0;
        let polls =
            |sources: u32| f64::from(sources * IDLE_POLLERS) * month_seconds / LONG_POLL_SECONDS;
        IdleCost {
            sqs_polling: polls(self.event_sources) * prices.sqs_request
                + polls(self.fifo_event_sources) * prices.sqs_fifo_request,
            alarms: f64::from(self.alarms) * ALARM_MONTH,
            secrets: f64::from(self.secrets) * SECRET_MONTH,
        }
    }
}

/// API Gateway HTTP API meters a request in 512 KB units.
pub fn http_api_units(body_bytes: usize) -> u64 {
    body_bytes.div_ceil(512 * 1024).max(1) as u64
}

/// Firehose bills each record rounded up to 5 KB.
pub fn firehose_steps(record_bytes: usize) -> u64 {
    record_bytes.div_ceil(5_000).max(1) as u64
}

/// SQS bills each 64 KB chunk of a request's payload as one request.
pub fn sqs_chunks(payload_bytes: usize) -> u64 {
    payload_bytes.div_ceil(64 * 1024).max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn requests_are_metered_in_their_services_units() {
        assert_eq!(http_api_units(0), 1);
        assert_eq!(http_api_units(512 * 1024), 1);
        assert_eq!(http_api_units(512 * 1024 + 1), 2);
        assert_eq!(sqs_chunks(10), 1);
        assert_eq!(sqs_chunks(64 * 1024 + 1), 2);
        assert_eq!(sqs_chunks(256 * 1024), 4);
        assert_eq!(firehose_steps(1), 1);
        assert_eq!(firehose_steps(5_000), 1);
        assert_eq!(firehose_steps(5_001), 2);
    }

    /// #38: the idle parts are the stack's: its event sources, alarms and secrets, counted in
    /// the SAM template; and a month of them is priced as the parts say.
    #[test]
    fn an_idle_stack_pays_for_its_polling_alarms_and_secrets() {
        let template = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../infra/template.yaml"
        ))
        .expect("the SAM template");
        let count = |ty: &str| template.matches(&format!("Type: {ty}\n")).count() as u32;
        assert_eq!(
            (
                STACK_IDLE_PARTS.event_sources + STACK_IDLE_PARTS.fifo_event_sources,
                STACK_IDLE_PARTS.alarms,
                STACK_IDLE_PARTS.secrets
            ),
            (
                count("AWS::Lambda::EventSourceMapping"),
                count("AWS::CloudWatch::Alarm"),
                count("AWS::SecretsManager::Secret")
            )
        );
        let idle = STACK_IDLE_PARTS.per_month(&LIST_PRICES);
        // 4 standard sources x 5 pollers x 129,600 twenty-second polls in 30 days, at $0.40 a
        // million, and the ordered queue's 648,000 at $0.50 (FIFO).
        let polling = 2_592_000.0 * 0.4e-6 + 648_000.0 * 0.5e-6;
        assert!(close(idle.sqs_polling, polling));
        assert!(close(idle.alarms, 0.7));
        assert!(close(idle.secrets, 0.8));
        assert!(close(idle.total(), polling + 1.5));
    }

    #[test]
    fn a_run_is_priced_per_million_events() {
        // 1,000 events: 10 publishes, 20 SQS chunks, one deliver invocation of 1 s at 1 GB.
        let usage = Usage {
            events: 1_000,
            http_api_units: 10,
            sqs_chunks: 20,
            deliver: FunctionTime {
                invocations: 1,
                billed_ms: 1_000,
                memory_mb: 1024,
            },
            dynamodb_reads: 4,
            dynamodb_writes: 2,
            s3_puts: 1,
            firehose_steps: 3,
            journal_stored_bytes: 30_000,
            archive_steps: 2,
            archive_stored_bytes: 20_000,
            ..Usage::default()
        };
        let cost = usage.per_million(&LIST_PRICES, Architecture::X86);
        // ×1,000 to a million events.
        assert!(close(cost.api_gateway, 10.0 * 1e-6 * 1e3));
        assert!(close(cost.sqs, 20.0 * 0.4e-6 * 1e3));
        assert!(close(cost.lambda, (0.2e-6 + 0.000_016_666_7) * 1e3));
        assert!(close(
            cost.dynamodb,
            (4.0 * 0.125e-6 + 2.0 * 0.625e-6) * 1e3
        ));
        assert!(close(cost.other, 0.005e-3 * 1e3));
        // Three 5 KB steps at $0.029 per GB, and 30 KB kept 7 days at $0.023 per GB-month.
        assert!(close(
            cost.journal,
            (3.0 * 0.029 * 5e3 / 1e9 + 30_000.0 / 1e9 * 0.023 * 7.0 / 30.0) * 1e3
        ));
        assert!(close(
            cost.archive,
            // Stored 8 days: the 7-day class and its day of margin.
            (2.0 * 0.029 * 5e3 / 1e9 + 20_000.0 / 1e9 * 0.023 * 8.0 / 30.0) * 1e3
        ));
        let arm = usage.per_million(&LIST_PRICES, Architecture::Arm);
        assert!(arm.lambda < cost.lambda);
        assert!(close(
            cost.total(),
            cost.api_gateway
                + cost.lambda
                + cost.sqs
                + cost.dynamodb
                + cost.other
                + cost.journal
                + cost.archive
        ));
    }
}
