/**
 * gridrelay as a CDK construct: the same stack as infra/template.yaml, to embed in your own app.
 *
 *   new Gridrelay(this, 'Events', { deadLetterExpiration: Duration.days(90) });
 *
 * Functions are built from the Rust workspace with cargo-lambda (cargo-lambda-cdk's RustFunction).
 */
import { isIP } from 'node:net';
import * as path from 'node:path';
import { ArnFormat, CfnOutput, Duration, Fn, RemovalPolicy, Stack } from 'aws-cdk-lib';
import * as apigw from 'aws-cdk-lib/aws-apigatewayv2';
import { HttpLambdaIntegration } from 'aws-cdk-lib/aws-apigatewayv2-integrations';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';
import * as cwActions from 'aws-cdk-lib/aws-cloudwatch-actions';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as glue from 'aws-cdk-lib/aws-glue';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as firehose from 'aws-cdk-lib/aws-kinesisfirehose';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { SqsEventSource } from 'aws-cdk-lib/aws-lambda-event-sources';
import * as logs from 'aws-cdk-lib/aws-logs';
import * as s3 from 'aws-cdk-lib/aws-s3';
import * as secretsmanager from 'aws-cdk-lib/aws-secretsmanager';
import * as sns from 'aws-cdk-lib/aws-sns';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { RustFunction } from 'cargo-lambda-cdk';
import { Construct } from 'constructs';

/** SQS's largest message (1 MiB): events up to Event Grid's 1 MB travel in one. */
const MAX_MESSAGE_SIZE_BYTES = 1_048_576;
/** O1: the ordered queue's redrive count, SQS's most: every hold of an ordered message until
 * it is due is a receive (shared/src/ordering.rs ORDERED_MAX_RECEIVE_COUNT). */
const ORDERED_MAX_RECEIVE_COUNT = 1000;
/** #35: the topic archive's retention classes, in days (shared::archive::ARCHIVE_CLASSES): a
 * topic's events are archived in the shortest at least as long as its retention, and its
 * objects expire a day past the class (shared::archive::class_expiry_days). */
export const ARCHIVE_CLASSES = [1, 7, 30, 90, 365];

/** The control queue's event source: the least maximum concurrency SQS event sources allow. */
const CONTROL_MAX_CONCURRENCY = 2;

export interface GridrelayProps {
  /** Delivery queue messages per deliver invocation. Default 10: the most AWS allows without a
   * batching window, and the cheapest then (1 costs deliver up to 10 times as much per event;
   * docs/performance.md, "Event-source batch size and window"). Above 10, set
   * deliveryBatchingWindow. */
  readonly deliveryBatchSize?: number;
  /** How long the event source may wait to fill a deliver batch. Default none (G3: immediate);
   * a window holds events back up to this long when traffic is light; for one-event publishes
   * it saves about $0.05 per million events in SQS deletes, journal records and health reads
   * (measured with 1 s and 10 messages; docs/performance.md, "Event-source batch size and
   * window"). */
  readonly deliveryBatchingWindow?: Duration;
  /** Most deliver invocations at once (the event source's maximum concurrency, 2-1000). Each
   * has up to 768 requests in flight; endpoints that hang hold at most this much of the
   * account's concurrency. Default 50. docs/deploying.md, "Concurrency and the account". */
  readonly deliverMaxConcurrency?: number;
  /** Most deliver invocations at once on the replay queue (its event source's maximum
   * concurrency, 2-1000): what replays' deliveries may take of the account's concurrency,
   * whatever their rate (#35). Default 2. docs/replay.md. */
  readonly replayMaxConcurrency?: number;
  /** Concurrency reserved for deliver, from the account's unreserved pool. At least twice
   * deliverMaxConcurrency (the delivery and ordered queues' event sources) plus 2 (the control
   * queue's) plus replayMaxConcurrency, or the event sources are throttled. Default: none
   * reserved. */
  readonly deliverReservedConcurrency?: number;
  /** Concurrency reserved for ingest, so other functions can never throttle publishing.
   * Default: none reserved. */
  readonly ingestReservedConcurrency?: number;
  /** Most dead-letter invocations at once (2-1000). Default 5. */
  readonly deadLetterMaxConcurrency?: number;
  /** Seconds a warm function keeps the topics, subscriptions and secret header values it read
   * (0-300, 0 keeps nothing). Default 10. */
  readonly configCacheSeconds?: number;
  /** Networks (CIDRs) deliveries and handshakes may reach although they are not public
   * (private, loopback, link-local, ...), where plain http:// is allowed too. Default: none,
   * only public addresses over https://. The deliver function checks every connection's
   * resolved address against it (GRIDRELAY_ALLOWED_NETWORKS). */
  readonly allowedNetworks?: string[];
  /** AWS resources (SQS queues, SNS topics, EventBridge buses, Kinesis streams, Lambda
   * functions) event subscriptions may deliver to, as ARNs or ARN patterns (`*` and `?` as in
   * IAM; never `*` alone). The deliver function may write only to these: its role's policy and
   * GRIDRELAY_DELIVERY_DESTINATIONS; give the command line the same list
   * (--delivery-destinations). Default: none. */
  readonly deliveryDestinationArns?: string[];
  /** Processor the functions run on. Default ARM_64 (Graviton: 20 % less per GB-second). */
  readonly architecture?: lambda.Architecture;
  /** Cargo profile the functions are built with. Default "release" (what to deploy); "dev"
   * builds them unoptimised, for checks that only synthesize. */
  readonly buildProfile?: 'release' | 'dev';
  /** Dead-letter queue messages per dead-letter invocation. Default 10. */
  readonly deadLetterBatchSize?: number;
  /** How long the event source may wait to group dead-letter writes. Default 30 seconds. */
  readonly deadLetterBatchingWindow?: Duration;
  /** Receives before a message that keeps failing moves to its redrive queue. Default 10
   * (failed records come back after 30 s, 90 s, 4.5 min, 13.5 min, then every 30 min: about
   * 3.3 hours). */
  readonly maxReceiveCount?: number;
  /** When dead-letter objects expire. Default: never. */
  readonly deadLetterExpiration?: Duration;
  /** How long the delivery journal (every attempt of every event, docs/journal.md) is kept,
   * in whole days from 1 to 365. Default 7 days. */
  readonly journalRetention?: Duration;
  /** How long the topic archives written before retention classes (by a stack from before them,
   * under `archive/YYYY/`) are kept, in whole days from 1 to 365. Default 365 days. Archives
   * written since are kept by their topic's class (1, 7, 30, 90 or 365 days, the shortest at
   * least as long as its `--retention-days`). docs/archive.md. */
  readonly archiveRetention?: Duration;
  /** How long the journal's stream gathers entries before writing them (0 to 900 s): an attempt
   * can be read by `gridrelay event show` this long after it was made. Default 60 s. */
  readonly journalBufferInterval?: Duration;
  /** How long function logs are kept. Default one month. */
  readonly logRetention?: logs.RetentionDays;
  /** GRIDRELAY_TIME_SCALE: 1 in production, smaller only for test stacks. Default "1". */
  readonly timeScale?: string;
  /** Name prefix of the Secrets Manager secrets holding secret delivery header values (default `gridrelay`). */
  readonly secretPrefix?: string;
  /** Where alarms notify. Default: nowhere (alarms only). */
  readonly alarmTopic?: sns.ITopic;
  /** The workspace Cargo.toml the functions are built from. Default: this repository's. */
  readonly cargoManifest?: string;
  /** What happens to tables and the bucket when the stack is deleted. Default RETAIN. */
  readonly removalPolicy?: RemovalPolicy;
  /**
   * What publishers and the portal's visitors reach the functions through (#38,
   * docs/front-door.md): `httpApi`, API Gateway's HTTP API ($1.00 per million requests;
   * throttling, custom domains, access logs), or `functionUrl`, a Lambda function URL each for
   * ingest and the portal (no price of its own). Default `httpApi`.
   */
  readonly frontDoor?: 'httpApi' | 'functionUrl';
}

export class Gridrelay extends Construct {
  /** The HTTP API front door; none with `frontDoor: 'functionUrl'`. */
  public readonly api?: apigw.HttpApi;
  /** The function URLs of ingest and the portal with `frontDoor: 'functionUrl'`. */
  public readonly functionUrls?: { ingest: lambda.FunctionUrl; portal: lambda.FunctionUrl };
  public readonly publishUrl: string;
  /** Where the portal's pages are: PortalUrl/TOPIC/SUBSCRIPTION. */
  public readonly portalUrl: string;
  public readonly topicsTable: dynamodb.Table;
  public readonly subscriptionsTable: dynamodb.Table;
  public readonly deliveryStateTable: dynamodb.Table;
  /** #35: replays of topics' archives (partition key topic, sort key name). */
  public readonly replaysTable: dynamodb.Table;
  public readonly deliveryQueue: sqs.Queue;
  /** Subscriptions' handshake and expiry steps (control work), apart from the deliveries so they
   * never wait behind a bulk backlog (#34 item 12); deliver consumes it too. */
  public readonly controlQueue: sqs.Queue;
  /** Replays' deliveries and their retries (#35), apart from live ones so a replay's backlog
   * never delays them; deliver consumes it with an event source of its own, capped at
   * replayMaxConcurrency. */
  public readonly replayQueue: sqs.Queue;
  public readonly deliveryRedriveQueue: sqs.Queue;
  /** O1: ordered subscriptions' events, a FIFO queue with a message group per key; deliver
   * consumes it and holds its messages in flight until due (docs/ordering.md). */
  public readonly orderedQueue: sqs.Queue;
  /** Where SQS parks ordered messages that keep failing (a FIFO queue's is FIFO). */
  public readonly orderedRedriveQueue: sqs.Queue;
  public readonly deadLetterQueue: sqs.Queue;
  public readonly deadLetterRedriveQueue: sqs.Queue;
  public readonly deadLetterBucket: s3.Bucket;
  /** The delivery journal (#35): deliver and dead-letter put each invocation's steps to this
   * stream as a GZIP-compressed record of JSON lines, which it writes to the bucket as they are
   * (`.json.gz` objects) under `journal/YYYY/MM/DD/HH/`; Athena reads them through the Glue
   * table `journalTable`. */
  public readonly journalBucket: s3.Bucket;
  public readonly journalStream: firehose.CfnDeliveryStream;
  /** Topic archives (#35): ingest puts the accepted events of topics with a retention to the
   * stream of their retention class (`days`), which writes them into `journalBucket` under
   * `archive/<days>d/YYYY/MM/DD/HH/`, expired by the class's lifecycle rule. */
  public readonly archiveStreams: { readonly days: number; readonly stream: firehose.CfnDeliveryStream }[];
  /** @deprecated The 365-day class's stream, the construct's first archive stream (kept by
   * name); use `archiveStreams`. */
  public get archiveStream(): firehose.CfnDeliveryStream {
    return this.archiveStreams[this.archiveStreams.length - 1].stream;
  }
  public readonly journalTable: glue.CfnTable;
  /** The key every message on the construct's own queues is sealed with (#34 item 2). */
  public readonly queueKey: secretsmanager.Secret;
  /** The key subscribers' portal links are signed with (#36); rotating it revokes them all. */
  public readonly portalKey: secretsmanager.Secret;
  public readonly ingest: lambda.Function;
  public readonly deliver: lambda.Function;
  public readonly deadLetter: lambda.Function;
  /** The subscribers' portal (#36): GET /portal/{topic}/{name} on the publish API. */
  public readonly portal: lambda.Function;

  constructor(scope: Construct, id: string, props: GridrelayProps = {}) {
    super(scope, id);
    const limits = checkedSettings(props);
    const removalPolicy = props.removalPolicy ?? RemovalPolicy.RETAIN;
    const maxReceiveCount = props.maxReceiveCount ?? 10;
    const manifestPath = props.cargoManifest ?? path.join(__dirname, '..', '..', '..', '..', 'Cargo.toml');

    const table = (name: string, sortKey?: string) =>
      new dynamodb.Table(this, name, {
        partitionKey: { name: sortKey ? 'topic' : 'name', type: dynamodb.AttributeType.STRING },
        sortKey: sortKey ? { name: sortKey, type: dynamodb.AttributeType.STRING } : undefined,
        billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
        pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
        encryption: dynamodb.TableEncryption.AWS_MANAGED,
        removalPolicy,
      });
    this.topicsTable = table('TopicsTable');
    this.subscriptionsTable = table('SubscriptionsTable', 'name');

    const redrive = (name: string) =>
      new sqs.Queue(this, name, {
        maxMessageSizeBytes: MAX_MESSAGE_SIZE_BYTES,
        retentionPeriod: Duration.days(14),
        encryption: sqs.QueueEncryption.SQS_MANAGED,
        enforceSSL: true,
      });
    this.deliveryRedriveQueue = redrive('DeliveryRedriveQueue');
    this.deadLetterRedriveQueue = redrive('DeadLetterRedriveQueue');
    // The queues the deliver function consumes: visibility at least six times its timeout;
    // poison messages parked in the delivery redrive queue.
    const consumed = (id: string) => new sqs.Queue(this, id, {
      maxMessageSizeBytes: MAX_MESSAGE_SIZE_BYTES,
      visibilityTimeout: Duration.seconds(1800),
      retentionPeriod: Duration.days(4),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      enforceSSL: true,
      deadLetterQueue: { queue: this.deliveryRedriveQueue, maxReceiveCount },
    });
    this.deliveryQueue = consumed('DeliveryQueue');
    // #34 item 12: handshake and expiry steps, apart from the deliveries.
    this.controlQueue = consumed('ControlQueue');
    // #35: replays' deliveries, apart from live ones.
    this.replayQueue = consumed('ReplayQueue');
    // O1: high throughput (each key its own, deduplication per key); kept 14 days, SQS's most
    // (a key whose first event waits keeps the rest); every hold until due is a receive, so
    // its redrive count is SQS's most, out of the retry ladder's reach.
    this.orderedRedriveQueue = new sqs.Queue(this, 'OrderedRedriveQueue', {
      fifo: true,
      maxMessageSizeBytes: MAX_MESSAGE_SIZE_BYTES,
      retentionPeriod: Duration.days(14),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      enforceSSL: true,
    });
    this.orderedQueue = new sqs.Queue(this, 'OrderedQueue', {
      fifo: true,
      fifoThroughputLimit: sqs.FifoThroughputLimit.PER_MESSAGE_GROUP_ID,
      deduplicationScope: sqs.DeduplicationScope.MESSAGE_GROUP,
      maxMessageSizeBytes: MAX_MESSAGE_SIZE_BYTES,
      visibilityTimeout: Duration.seconds(1800),
      retentionPeriod: Duration.days(14),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      enforceSSL: true,
      deadLetterQueue: { queue: this.orderedRedriveQueue, maxReceiveCount: ORDERED_MAX_RECEIVE_COUNT },
    });
    this.deadLetterQueue = new sqs.Queue(this, 'DeadLetterQueue', {
      maxMessageSizeBytes: MAX_MESSAGE_SIZE_BYTES,
      // L4: five minutes between the last attempt and the write.
      deliveryDelay: Duration.minutes(5),
      visibilityTimeout: Duration.seconds(360),
      retentionPeriod: Duration.days(4),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      enforceSSL: true,
      deadLetterQueue: { queue: this.deadLetterRedriveQueue, maxReceiveCount },
    });

    this.deadLetterBucket = new s3.Bucket(this, 'DeadLetterBucket', {
      encryption: s3.BucketEncryption.S3_MANAGED,
      blockPublicAccess: s3.BlockPublicAccess.BLOCK_ALL,
      objectOwnership: s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
      enforceSSL: true,
      lifecycleRules: props.deadLetterExpiration
        ? [{ id: 'ExpireDeadLetters', expiration: props.deadLetterExpiration }]
        : undefined,
      removalPolicy,
    });

    this.journalBucket = new s3.Bucket(this, 'JournalBucket', {
      encryption: s3.BucketEncryption.S3_MANAGED,
      blockPublicAccess: s3.BlockPublicAccess.BLOCK_ALL,
      objectOwnership: s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
      enforceSSL: true,
      lifecycleRules: [
        { id: 'ExpireJournal', prefix: 'journal/', expiration: Duration.days(limits.journalDays) },
        // Topic archives: each retention class's objects expire after its days (the command
        // line reads these rules); a topic's replays reach back its own retention.
        ...ARCHIVE_CLASSES.map((days) => ({ id: `ExpireArchive${days}d`, prefix: `archive/${days}d/`, expiration: Duration.days(days + 1) })),
        // Archives written before classes (archive/YYYY/...): archiveRetention.
        { id: 'ExpireArchive', prefix: 'archive/2', expiration: Duration.days(limits.archiveDays) },
        { id: 'AbortIncompleteUploads', abortIncompleteMultipartUploadAfter: Duration.days(1) },
      ],
      removalPolicy,
    });
    this.journalStream = this.hourlyStream('Journal', 'journal/', limits.journalBufferSeconds);
    // #35: topic archives, beside the journal: ingest puts the accepted events of topics with a
    // retention to their class's stream (one role for all: archive/ only); replays read them
    // under archive/. The 365-day class's is the construct's first archive stream, kept as it
    // was (ArchiveStream).
    const archiveRole = this.streamRole('Archive', 'archive/');
    this.archiveStreams = ARCHIVE_CLASSES.map((days) => ({
      days,
      stream: this.hourlyStream(days === 365 ? 'Archive' : `Archive${days}d`, `archive/${days}d/`, limits.journalBufferSeconds, archiveRole),
    }));
    const journalDatabase = new glue.CfnDatabase(this, 'JournalDatabase', {
      catalogId: Stack.of(this).account,
      databaseInput: { description: "gridrelay's delivery journal (docs/journal.md)." },
    });
    const column = (name: string, type: string) => ({ name, type });
    this.journalTable = new glue.CfnTable(this, 'JournalTable', {
      catalogId: Stack.of(this).account,
      databaseName: journalDatabase.ref,
      tableInput: {
        name: 'journal',
        tableType: 'EXTERNAL_TABLE',
        parameters: {
          'classification': 'json',
          'compressionType': 'gzip',
          'projection.enabled': 'true',
          'projection.hour.type': 'date',
          'projection.hour.format': 'yyyy/MM/dd/HH',
          'projection.hour.range': 'NOW-365DAYS,NOW',
          'projection.hour.interval': '1',
          'projection.hour.interval.unit': 'HOURS',
          'storage.location.template': `s3://${this.journalBucket.bucketName}/journal/\${hour}/`,
        },
        partitionKeys: [column('hour', 'string')],
        storageDescriptor: {
          location: `s3://${this.journalBucket.bucketName}/journal/`,
          inputFormat: 'org.apache.hadoop.mapred.TextInputFormat',
          outputFormat: 'org.apache.hadoop.hive.ql.io.HiveIgnoreKeyTextOutputFormat',
          serdeInfo: {
            serializationLibrary: 'org.openx.data.jsonserde.JsonSerDe',
            parameters: { 'ignore.malformed.json': 'true' },
          },
          columns: JOURNAL_COLUMNS.map(([name, type]) => column(name, type)),
        },
      },
    });

    // Endpoint health (D1) and late successes (R4); records expire on their own.
    this.deliveryStateTable = new dynamodb.Table(this, 'DeliveryStateTable', {
      partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING },
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      timeToLiveAttribute: 'expiresAt',
      encryption: dynamodb.TableEncryption.AWS_MANAGED,
      removalPolicy,
    });

    // #35: replays, moved on by their steps in deliver; started, read and cancelled by the
    // command line.
    this.replaysTable = new dynamodb.Table(this, 'ReplaysTable', {
      partitionKey: { name: 'topic', type: dynamodb.AttributeType.STRING },
      sortKey: { name: 'name', type: dynamodb.AttributeType.STRING },
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      encryption: dynamodb.TableEncryption.AWS_MANAGED,
      pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
      removalPolicy,
    });

    const secretPrefix = props.secretPrefix ?? 'gridrelay';
    // #34 item 2: the functions seal every message they write to their own queues with this
    // key and act only on sealed ones, so nobody else can make them deliver. Its name is
    // outside the secret prefix: no subscription's header can name it.
    this.queueKey = new secretsmanager.Secret(this, 'QueueKey', {
      description: 'gridrelay seals its queue messages with this key; only its functions read it.',
      generateSecretString: { passwordLength: 64, excludePunctuation: true },
    });
    // #36: portal links are signed with this key; `gridrelay portal-key rotate` replaces it,
    // which revokes every link. Outside the secret prefix, as the queue key is.
    this.portalKey = new secretsmanager.Secret(this, 'PortalKey', {
      description: "gridrelay signs subscribers' portal links with this key; rotating it revokes them all.",
      generateSecretString: { passwordLength: 64, excludePunctuation: true },
    });
    const environment = {
      GRIDRELAY_TOPICS_TABLE: this.topicsTable.tableName,
      GRIDRELAY_SUBSCRIPTIONS_TABLE: this.subscriptionsTable.tableName,
      GRIDRELAY_DELIVERY_QUEUE_URL: this.deliveryQueue.queueUrl,
      GRIDRELAY_DEAD_LETTER_QUEUE_URL: this.deadLetterQueue.queueUrl,
      // O1: ordered subscriptions' events, a message group per key.
      GRIDRELAY_ORDERED_QUEUE_URL: this.orderedQueue.queueUrl,
      GRIDRELAY_TIME_SCALE: props.timeScale ?? '1',
      GRIDRELAY_DEAD_LETTER_EVENTS_TOPIC: 'gridrelay-dead-letter-events',
      GRIDRELAY_SECRET_PREFIX: secretPrefix,
      GRIDRELAY_DELIVERY_STATE_TABLE: this.deliveryStateTable.tableName,
      GRIDRELAY_QUEUE_KEY_SECRET: this.queueKey.secretArn,
      GRIDRELAY_CONFIG_CACHE_SECONDS: String(limits.configCacheSeconds),
      // The functions' metrics (embedded metric format) carry it as dimension Stack.
      GRIDRELAY_STACK_NAME: Stack.of(this).stackName,
      RUST_LOG: 'info',
    };
    const fn = (name: string, binaryName: string, timeout: Duration, description: string, reservedConcurrentExecutions?: number) =>
      new RustFunction(this, name, {
        manifestPath,
        binaryName,
        description,
        timeout,
        reservedConcurrentExecutions,
        memorySize: 256,
        architecture: props.architecture ?? lambda.Architecture.ARM_64,
        bundling: { profile: props.buildProfile ?? 'release' },
        environment,
        loggingFormat: lambda.LoggingFormat.JSON,
        logGroup: new logs.LogGroup(this, `${name}Logs`, {
          retention: props.logRetention ?? logs.RetentionDays.ONE_MONTH,
          removalPolicy: RemovalPolicy.DESTROY,
        }),
      });
    this.ingest = fn('Ingest', 'gridrelay-ingest', Duration.seconds(15),
      'Validates, authorises and fans out published events into the delivery queue.', limits.ingestReserved);
    this.deliver = fn('Deliver', 'gridrelay-deliver', Duration.seconds(300),
      'Batches and POSTs events, classifies responses, re-enqueues retries, dead-letters terminal failures.',
      limits.deliverReserved);
    this.deadLetter = fn('DeadLetter', 'gridrelay-dead-letter', Duration.seconds(60),
      "Writes undeliverable events to S3 in Event Grid's dead-letter format.");
    this.portal = fn('Portal', 'gridrelay-portal', Duration.seconds(15),
      "The subscribers' portal, /portal/{topic}/{name} behind a signed, expiring link.");
    this.portal.addEnvironment('GRIDRELAY_JOURNAL_BUCKET', this.journalBucket.bucketName);
    this.portal.addEnvironment('GRIDRELAY_PORTAL_KEY_SECRET', this.portalKey.secretArn);

    // Least privilege: each function gets only the actions it calls, on only its resources.
    const allow = (f: lambda.Function, actions: string[], resources: string[]) =>
      f.addToRolePolicy(new iam.PolicyStatement({ actions, resources }));
    allow(this.ingest, ['dynamodb:GetItem'], [this.topicsTable.tableArn]);
    allow(this.ingest, ['dynamodb:Query'], [this.subscriptionsTable.tableArn]);
    // The manual validation URL reads and updates the subscription.
    allow(this.ingest, ['dynamodb:GetItem', 'dynamodb:PutItem'], [this.subscriptionsTable.tableArn]);
    // O1: ordered subscriptions' events go to the ordered queue.
    allow(this.ingest, ['sqs:SendMessage'], [this.deliveryQueue.queueArn, this.orderedQueue.queueArn]);
    // GetItem: each delivery; PutItem: the handshake's provisioning state; DeleteItem: a
    // subscription whose expiration time has come.
    allow(this.deliver, ['dynamodb:GetItem', 'dynamodb:PutItem', 'dynamodb:DeleteItem'],
      [this.subscriptionsTable.tableArn]);
    // D1, R4: endpoint health and late successes; caps' allowances (BatchGetItem: a
    // subscription's slot items read at once).
    allow(this.deliver, ['dynamodb:GetItem', 'dynamodb:BatchGetItem', 'dynamodb:PutItem', 'dynamodb:UpdateItem', 'dynamodb:DeleteItem'],
      [this.deliveryStateTable.tableArn]);
    // H1: secret delivery header values, only under the prefix (deleted with an expired
    // subscription).
    const secretsUnderPrefix = Stack.of(this).formatArn({
      service: 'secretsmanager',
      resource: 'secret',
      resourceName: `${secretPrefix}/*`,
      arnFormat: ArnFormat.COLON_RESOURCE_NAME,
    });
    allow(this.deliver, ['secretsmanager:GetSecretValue', 'secretsmanager:DeleteSecret'], [secretsUnderPrefix]);
    // O1: ordered messages that cannot be read are parked in the ordered redrive queue.
    allow(this.deliver, ['sqs:SendMessage'],
      [this.deliveryQueue.queueArn, this.controlQueue.queueArn, this.replayQueue.queueArn, this.deadLetterQueue.queueArn,
        this.orderedRedriveQueue.queueArn]);
    // #35: the delivery journal, one PutRecordBatch per invocation (deliver's attempts,
    // dead-letter's writes and drops).
    for (const f of [this.deliver, this.deadLetter]) {
      allow(f, ['firehose:PutRecordBatch'], [this.journalStream.attrArn]);
    }
    // #35: topic archives, one PutRecordBatch per publish to a topic with a retention.
    allow(this.ingest, ['firehose:PutRecordBatch'], this.archiveStreams.map((a) => a.stream.attrArn));
    // P1: accepted event ids of topics with a deduplication window, read (one BatchGetItem per
    // 100 events) and marked (one BatchWriteItem per 25); those items only.
    this.ingest.addToRolePolicy(new iam.PolicyStatement({
      actions: ['dynamodb:BatchGetItem', 'dynamodb:BatchWriteItem'],
      resources: [this.deliveryStateTable.tableArn],
      conditions: { 'ForAllValues:StringLike': { 'dynamodb:LeadingKeys': ['dedup#*'] } },
    }));
    // #35: replays: their records (read, then written over the version read), and the topic
    // archives they send again (listed and read under archive/ only).
    allow(this.deliver, ['dynamodb:GetItem', 'dynamodb:PutItem'], [this.replaysTable.tableArn]);
    this.deliver.addToRolePolicy(new iam.PolicyStatement({
      actions: ['s3:ListBucket'],
      resources: [this.journalBucket.bucketArn],
      conditions: { StringLike: { 's3:prefix': 'archive/*' } },
    }));
    allow(this.deliver, ['s3:GetObject'], [this.journalBucket.arnForObjects('archive/*')]);
    // S4: AWS resource destinations, only those named (none by default). Each action applies
    // to its own service's ARNs: SendMessageBatch is sqs:SendMessage, PublishBatch
    // sns:Publish, an asynchronous Invoke lambda:InvokeFunction.
    if (limits.deliveryDestinationArns.length > 0) {
      allow(this.deliver, DESTINATION_ACTIONS, limits.deliveryDestinationArns);
    }
    allow(this.deadLetter, ['s3:PutObject'], [this.deadLetterBucket.arnForObjects('*')]);
    allow(this.deadLetter, ['sqs:SendMessage'],
      [this.deadLetterQueue.queueArn, this.deliveryQueue.queueArn, this.orderedQueue.queueArn]);
    // L7: dead-letter writes are announced to the system topic's subscribers.
    allow(this.deadLetter, ['dynamodb:Query'], [this.subscriptionsTable.tableArn]);
    for (const f of [this.ingest, this.deliver, this.deadLetter]) {
      allow(f, ['secretsmanager:GetSecretValue'], [this.queueKey.secretArn]);
    }
    // #36: the portal reads one subscription and its topic (whether it keeps an archive), its
    // endpoint's and host's health (one BatchGetItem), the delivery journal and the topics'
    // archives (dropped events sent again), listed and read under journal/ and archive/ only.
    allow(this.portal, ['dynamodb:GetItem'], [this.subscriptionsTable.tableArn, this.topicsTable.tableArn]);
    // A signing-secret rotation: the subscription written over the version read, its new
    // secret kept under the prefix, the one it retires deleted.
    allow(this.portal, ['dynamodb:PutItem'], [this.subscriptionsTable.tableArn]);
    // Signing secrets only (PREFIX/TOPIC/SUBSCRIPTION/signing/...), not delivery headers'.
    allow(this.portal, ['secretsmanager:CreateSecret', 'secretsmanager:PutSecretValue', 'secretsmanager:DeleteSecret'], [
      Stack.of(this).formatArn({
        service: 'secretsmanager',
        resource: 'secret',
        resourceName: `${secretPrefix}/*/signing/*`,
        arnFormat: ArnFormat.COLON_RESOURCE_NAME,
      }),
    ]);
    allow(this.portal, ['dynamodb:BatchGetItem'], [this.deliveryStateTable.tableArn]);
    // Claims: a test event's of its window (one per subscription per 10 s), a dropped event's
    // sent again (once per 20 minutes); those items only.
    this.portal.addToRolePolicy(new iam.PolicyStatement({
      actions: ['dynamodb:PutItem'],
      resources: [this.deliveryStateTable.tableArn],
      conditions: { 'ForAllValues:StringLike': { 'dynamodb:LeadingKeys': ['claim#portal-test#*', 'claim#portal-again#*'] } },
    }));
    this.portal.addToRolePolicy(new iam.PolicyStatement({
      actions: ['s3:ListBucket'],
      resources: [this.journalBucket.bucketArn],
      conditions: { StringLike: { 's3:prefix': ['journal/*', 'archive/*'] } },
    }));
    allow(this.portal, ['s3:GetObject'], [this.journalBucket.arnForObjects('journal/*'), this.journalBucket.arnForObjects('archive/*')]);
    // Its key, and the queue key test events and events sent again are sealed with.
    allow(this.portal, ['secretsmanager:GetSecretValue'], [this.portalKey.secretArn, this.queueKey.secretArn]);
    // Test events and dead-lettered events sent again: into the delivery queue, from a
    // subscription's dead-letter objects, rewritten or deleted as their events leave (the
    // portal keeps to the subscription's folder).
    allow(this.portal, ['sqs:SendMessage'], [this.deliveryQueue.queueArn]);
    allow(this.portal, ['s3:ListBucket'], [this.deadLetterBucket.bucketArn]);
    allow(this.portal, ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'], [this.deadLetterBucket.arnForObjects('*')]);

    // Event sources: ReportBatchItemFailures, so one bad message never fails its batch.
    this.deliver.addEventSource(new SqsEventSource(this.deliveryQueue, {
      batchSize: props.deliveryBatchSize ?? 10,
      maxBatchingWindow: props.deliveryBatchingWindow,
      maxConcurrency: limits.deliverMax,
      reportBatchItemFailures: true,
    }));
    // Control work is light and must not take the account's concurrency: the least SQS allows.
    this.deliver.addEventSource(new SqsEventSource(this.controlQueue, {
      batchSize: 10,
      maxConcurrency: CONTROL_MAX_CONCURRENCY,
      reportBatchItemFailures: true,
    }));
    // #35: replays' deliveries take at most replayMaxConcurrency invocations, whatever their rate.
    this.deliver.addEventSource(new SqsEventSource(this.replayQueue, {
      batchSize: props.deliveryBatchSize ?? 10,
      maxBatchingWindow: props.deliveryBatchingWindow,
      maxConcurrency: limits.replayMax,
      reportBatchItemFailures: true,
    }));
    // O1: a FIFO event source takes batches of at most 10 and no window; deliver holds a key's
    // waiting message in flight (ChangeMessageVisibility) and never sends to the queue.
    this.deliver.addEventSource(new SqsEventSource(this.orderedQueue, {
      batchSize: 10,
      maxConcurrency: limits.deliverMax,
      reportBatchItemFailures: true,
    }));
    this.deadLetter.addEventSource(new SqsEventSource(this.deadLetterQueue, {
      batchSize: props.deadLetterBatchSize ?? 10,
      maxBatchingWindow: props.deadLetterBatchingWindow ?? Duration.seconds(30),
      maxConcurrency: limits.deadLetterMax,
      reportBatchItemFailures: true,
    }));

    const frontDoor = props.frontDoor ?? 'httpApi';
    if (frontDoor !== 'httpApi' && frontDoor !== 'functionUrl') {
      throw new Error(`frontDoor is ${JSON.stringify(frontDoor)}; it must be httpApi or functionUrl`);
    }
    if (frontDoor === 'functionUrl') {
      // #38: no per-request price of its own; ingest and the portal answer unknown paths and
      // methods themselves. CDK adds both permissions a public URL needs for principal *:
      // lambda:InvokeFunctionUrl (auth type NONE) and lambda:InvokeFunction (via the URL).
      const publicUrl = (fn: lambda.Function) => fn.addFunctionUrl({
        authType: lambda.FunctionUrlAuthType.NONE,
        invokeMode: lambda.InvokeMode.BUFFERED,
      });
      this.functionUrls = { ingest: publicUrl(this.ingest), portal: publicUrl(this.portal) };
      // A function URL ends with "/": the base URL is its scheme and host.
      this.publishUrl = `https://${Fn.select(2, Fn.split('/', this.functionUrls.ingest.url))}`;
      this.portalUrl = `${this.functionUrls.portal.url}portal`;
    } else {
      this.api = new apigw.HttpApi(this, 'PublishApi', {
        description: "Event Grid's publish protocol, POST /topics/{topic}/api/events, the manual validation URL, "
          + "and the subscribers' portal, GET /portal/{topic}/{name}",
      });
      const ingestIntegration = new HttpLambdaIntegration('IngestIntegration', this.ingest);
      this.api.addRoutes({
        path: '/topics/{topic}/api/events',
        methods: [apigw.HttpMethod.POST],
        integration: ingestIntegration,
      });
      this.api.addRoutes({
        path: '/subscriptions/validate',
        methods: [apigw.HttpMethod.GET],
        integration: ingestIntegration,
      });
      const portalIntegration = new HttpLambdaIntegration('PortalIntegration', this.portal);
      for (const path of ['/portal/{topic}/{name}', '/portal/gridrelay.css']) {
        this.api.addRoutes({ path, methods: [apigw.HttpMethod.GET], integration: portalIntegration });
      }
      // Its pages' forms: a test event, dead-lettered events sent again, a signing-secret rotation.
      for (const path of ['/portal/{topic}/{name}/test-event', '/portal/{topic}/{name}/send-again', '/portal/{topic}/{name}/signing-secret']) {
        this.api.addRoutes({ path, methods: [apigw.HttpMethod.POST], integration: portalIntegration });
      }
      this.publishUrl = this.api.apiEndpoint;
      this.portalUrl = `${this.api.apiEndpoint}/portal`;
    }
    // Validation URLs sent in the handshake point at the publish API.
    this.deliver.addEnvironment('GRIDRELAY_PUBLIC_URL', this.publishUrl);
    this.deliver.addEnvironment('GRIDRELAY_ALLOWED_NETWORKS', limits.allowedNetworks.join(','));
    this.deliver.addEnvironment('GRIDRELAY_DELIVERY_DESTINATIONS', limits.deliveryDestinationArns.join(','));
    // The stack's own queues: never a destination, whatever the list above allows.
    this.deliver.addEnvironment('GRIDRELAY_OWN_QUEUES', this.ownQueueArns());
    // #34 item 12: subscriptions' handshake and expiry steps, apart from the deliveries.
    this.deliver.addEnvironment('GRIDRELAY_CONTROL_QUEUE_URL', this.controlQueue.queueUrl);
    // #35: replays' deliveries and their retries, apart from live ones.
    this.deliver.addEnvironment('GRIDRELAY_REPLAY_QUEUE_URL', this.replayQueue.queueUrl);
    // O1: where an ordered message that cannot be read is parked after a few receives, so its
    // key goes on (shared/src/ordering.rs UNREADABLE_RECEIVES).
    this.deliver.addEnvironment('GRIDRELAY_ORDERED_REDRIVE_QUEUE_URL', this.orderedRedriveQueue.queueUrl);
    // #35: every invocation's steps go to the delivery journal in one call.
    this.deliver.addEnvironment('GRIDRELAY_JOURNAL_STREAM', this.journalStream.ref);
    this.deadLetter.addEnvironment('GRIDRELAY_JOURNAL_STREAM', this.journalStream.ref);
    // #35: replays' steps read the topic archives (in the journal's bucket) and move their
    // records on.
    this.deliver.addEnvironment('GRIDRELAY_REPLAYS_TABLE', this.replaysTable.tableName);
    this.deliver.addEnvironment('GRIDRELAY_JOURNAL_BUCKET', this.journalBucket.bucketName);
    // #35: accepted events of topics with a retention go to their class's archive stream, one
    // call per publish.
    this.ingest.addEnvironment('GRIDRELAY_ARCHIVE_STREAMS', this.archiveStreamNames());

    this.alarms(props.alarmTopic);
  }

  /** `GRIDRELAY_ARCHIVE_STREAMS`: each class's stream, as `1=name,7=name,…`. */
  private archiveStreamNames(): string {
    return this.archiveStreams.map((a) => `${a.days}=${a.stream.ref}`).join(',');
  }

  /** A role Firehose takes to write the journal's bucket under `prefix` only. */
  private streamRole(name: string, prefix: string): iam.Role {
    const role = new iam.Role(this, `${name}StreamRole`, {
      assumedBy: new iam.ServicePrincipal('firehose.amazonaws.com', {
        conditions: { StringEquals: { 'aws:SourceAccount': Stack.of(this).account } },
      }),
    });
    role.addToPolicy(new iam.PolicyStatement({
      actions: ['s3:AbortMultipartUpload', 's3:GetBucketLocation', 's3:ListBucket', 's3:ListBucketMultipartUploads'],
      resources: [this.journalBucket.bucketArn],
    }));
    role.addToPolicy(new iam.PolicyStatement({
      actions: ['s3:PutObject', 's3:GetObject', 's3:AbortMultipartUpload'],
      resources: [this.journalBucket.arnForObjects(`${prefix}*`)],
    }));
    return role;
  }

  /** A Firehose stream into the journal's bucket under `prefix` and its own UTC hour prefix,
   * keeping the records as their writers compressed them (GZIP members, billed by their
   * bytes) in objects named .json.gz for Athena, through a role that may write only there
   * (`role`: its own by default). */
  private hourlyStream(name: string, prefix: string, bufferSeconds: number, role = this.streamRole(name, prefix)): firehose.CfnDeliveryStream {
    const stream = new firehose.CfnDeliveryStream(this, `${name}Stream`, {
      deliveryStreamType: 'DirectPut',
      deliveryStreamEncryptionConfigurationInput: { keyType: 'AWS_OWNED_CMK' },
      extendedS3DestinationConfiguration: {
        bucketArn: this.journalBucket.bucketArn,
        roleArn: role.roleArn,
        prefix,
        compressionFormat: 'UNCOMPRESSED',
        fileExtension: '.json.gz',
        bufferingHints: { intervalInSeconds: bufferSeconds, sizeInMBs: 64 },
      },
    });
    stream.node.addDependency(role);
    return stream;
  }

  private alarms(topic?: sns.ITopic) {
    const above0 = (name: string, metric: cloudwatch.Metric, description: string) =>
      metric.createAlarm(this, `${name}Alarm`, {
        alarmDescription: description,
        threshold: 0,
        evaluationPeriods: 1,
        comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
      });
    // The functions write these in embedded metric format: per subscription, and for the stack.
    const stackMetric = (metricName: string) => new cloudwatch.Metric({
      namespace: 'Gridrelay', metricName, dimensionsMap: { Stack: Stack.of(this).stackName },
      statistic: 'Sum', period: Duration.minutes(5),
    });
    const depth = (name: string, queue: sqs.Queue, description: string) =>
      queue.metricApproximateNumberOfMessagesVisible({ statistic: 'Maximum', period: Duration.minutes(5) })
        .createAlarm(this, `${name}Alarm`, {
          alarmDescription: description,
          threshold: 0,
          evaluationPeriods: 1,
          comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
          treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
        });
    const alarms = [
      above0('DroppedEvents', stackMetric('EventsDropped'),
        'Events were dropped (terminal failure without a dead-letter destination, or a deleted subscription).'),
      above0('DeadLetteredEvents', stackMetric('EventsDeadLettered'),
        "Events were dead-lettered (attempts or time to live exhausted); see the subscription's metrics and the dead-letter bucket."),
      above0('DeadLetterDroppedEvents', stackMetric('DeadLetterEventsDropped'),
        'Dead-lettered events were dropped after their location was unavailable for four hours.'),
      above0('UnsealedMessages', stackMetric('UnsealedMessagesDropped'),
        'Messages that gridrelay did not write (no valid seal) reached its own queues and were dropped; something else can write to them.'),
      depth('DeliveryRedriveDepth', this.deliveryRedriveQueue, 'Poison messages reached the delivery redrive queue.'),
      depth('DeadLetterRedriveDepth', this.deadLetterRedriveQueue, 'Poison messages reached the dead-letter redrive queue.'),
      depth('OrderedRedriveDepth', this.orderedRedriveQueue, 'Poison messages reached the ordered redrive queue (O1).'),
    ];
    if (topic) {
      alarms.forEach((a) => a.addAlarmAction(new cwActions.SnsAction(topic)));
    }
  }

  /** The ARNs of the stack's own queues, comma-separated: no subscription may deliver to them. */
  public ownQueueArns(): string {
    return [this.deliveryQueue, this.controlQueue, this.replayQueue, this.deadLetterQueue, this.orderedQueue,
      this.deliveryRedriveQueue, this.deadLetterRedriveQueue, this.orderedRedriveQueue]
      .map((q) => q.queueArn)
      .join(',');
  }

  /** Stack outputs a user needs to point the gridrelay command line at this deployment. */
  public addOutputs() {
    new CfnOutput(this, 'QueueKeySecret', { value: this.queueKey.secretArn, description: 'Set GRIDRELAY_QUEUE_KEY_SECRET to it (the command line seals what it sends to the delivery queue with its key).' });
    new CfnOutput(this, 'PortalKeySecret', { value: this.portalKey.secretArn, description: 'Set GRIDRELAY_PORTAL_KEY_SECRET to it (`event-subscription portal-link` signs links with its key; `portal-key rotate` replaces it).' });
    new CfnOutput(this, 'PortalUrl', { value: this.portalUrl, description: 'Subscribers\' portal pages are PortalUrl/TOPIC/SUBSCRIPTION, opened with a link from `gridrelay event-subscription portal-link`; set GRIDRELAY_PORTAL_URL to it.' });
    new CfnOutput(this, 'OwnQueues', { value: this.ownQueueArns(), description: 'Set GRIDRELAY_OWN_QUEUES to it (the command line then refuses them as destinations).' });
    new CfnOutput(this, 'ControlQueueUrl', { value: this.controlQueue.queueUrl, description: "Set GRIDRELAY_CONTROL_QUEUE_URL to it (the command line sends subscriptions' handshake and expiry steps to it)." });
    new CfnOutput(this, 'OrderedQueueUrl', { value: this.orderedQueue.queueUrl, description: 'Set GRIDRELAY_ORDERED_QUEUE_URL to it (O1; the command line accepts --ordering-key only with it).' });
    new CfnOutput(this, 'ReplayQueueUrl', { value: this.replayQueue.queueUrl, description: "Set GRIDRELAY_REPLAY_QUEUE_URL to it (`gridrelay redrive queue` puts replays' parked deliveries back on it)." });
    new CfnOutput(this, 'PublishUrl', { value: this.publishUrl, description: 'Set GRIDRELAY_PUBLISH_URL to it.' });
    new CfnOutput(this, 'TopicsTableName', { value: this.topicsTable.tableName, description: 'Set GRIDRELAY_TOPICS_TABLE to it.' });
    new CfnOutput(this, 'SubscriptionsTableName', { value: this.subscriptionsTable.tableName, description: 'Set GRIDRELAY_SUBSCRIPTIONS_TABLE to it.' });
    new CfnOutput(this, 'DeadLetterBucketName', { value: this.deadLetterBucket.bucketName, description: 'Dead-letter destinations are s3://THIS-BUCKET/PREFIX.' });
    new CfnOutput(this, 'JournalBucketName', { value: this.journalBucket.bucketName, description: 'Set GRIDRELAY_JOURNAL_BUCKET to it (`gridrelay event show` reads the delivery journal there).' });
    new CfnOutput(this, 'JournalStreamName', { value: this.journalStream.ref });
    new CfnOutput(this, 'ArchiveStreamNames', { value: this.archiveStreamNames(), description: "The topic archives' streams by retention class (#35), for GRIDRELAY_ARCHIVE_STREAMS; they are kept in JournalBucketName under archive/<class>d/." });
    new CfnOutput(this, 'ReplaysTableName', { value: this.replaysTable.tableName, description: 'Set GRIDRELAY_REPLAYS_TABLE to it (`gridrelay replay` starts, reads and cancels replays there).' });
    new CfnOutput(this, 'DeliveryStateTableName', { value: this.deliveryStateTable.tableName, description: 'Set GRIDRELAY_DELIVERY_STATE_TABLE to it (`event-subscription show` and `gridrelay console` read endpoint health there).' });
    new CfnOutput(this, 'JournalAthenaTable', { value: `${this.journalTable.databaseName}.journal`, description: 'The delivery journal as an Athena table (docs/journal.md has queries).' });
  }
}

/** The concurrency and cache props, validated: each error names the prop, its value and what is allowed. */
export function checkedSettings(props: GridrelayProps) {
  const whole = (name: string, value: number | undefined, min: number, max: number, why = '') => {
    if (value !== undefined && !(Number.isInteger(value) && value >= min && value <= max)) {
      throw new Error(`${name} is ${value}; it must be a whole number from ${min}${why} to ${max}`);
    }
    return value;
  };
  const deliverMax = whole('deliverMaxConcurrency', props.deliverMaxConcurrency, 2, 1000) ?? 50;
  const deadLetterMax = whole('deadLetterMaxConcurrency', props.deadLetterMaxConcurrency, 2, 1000) ?? 5;
  const replayMax = whole('replayMaxConcurrency', props.replayMaxConcurrency, 2, 1000) ?? 2;
  // Lambda wants reserved concurrency to cover every SQS event source's maximum together: the
  // delivery and ordered queues' (O1), the control queue's 2 and the replay queue's.
  const deliverReserved = whole('deliverReservedConcurrency', props.deliverReservedConcurrency,
    2 * deliverMax + CONTROL_MAX_CONCURRENCY + replayMax, 10000,
    ` (twice deliverMaxConcurrency, for the delivery and ordered queues, plus the control queue's ${CONTROL_MAX_CONCURRENCY} plus replayMaxConcurrency: less would throttle the event sources)`);
  const ingestReserved = whole('ingestReservedConcurrency', props.ingestReservedConcurrency, 1, 10000);
  const configCacheSeconds = whole('configCacheSeconds', props.configCacheSeconds, 0, 300) ?? 10;
  const journalDays = whole('journalRetention (days)', props.journalRetention?.toDays({ integral: false }), 1, 365) ?? 7;
  const archiveDays = whole('archiveRetention (days)', props.archiveRetention?.toDays({ integral: false }), 1, 365) ?? 365;
  const journalBufferSeconds = whole('journalBufferInterval (seconds)', props.journalBufferInterval?.toSeconds({ integral: false }), 0, 900) ?? 60;
  const allowedNetworks = props.allowedNetworks ?? [];
  for (const net of allowedNetworks) {
    const [address, prefix, ...rest] = net.split('/');
    const family = isIP(address);
    const bits = family === 4 ? 32 : 128;
    const prefixOk = prefix === undefined || (/^\d{1,3}$/.test(prefix) && Number(prefix) <= bits);
    if (family === 0 || !prefixOk || rest.length > 0) {
      throw new Error(`allowedNetworks has ${JSON.stringify(net)}; each must be an IPv4 or IPv6 CIDR or address, like 10.0.0.0/8 or fd00::/8`);
    }
  }
  const deliveryDestinationArns = props.deliveryDestinationArns ?? [];
  for (const arn of deliveryDestinationArns) {
    if (!/^arn:[^:,\s]+:(sqs|sns|events|kinesis|lambda|\*):[^,\s]*$/.test(arn)) {
      throw new Error(`deliveryDestinationArns has ${JSON.stringify(arn)}; each must be an SQS, SNS, EventBridge, Kinesis or Lambda ARN or ARN pattern, like arn:aws:sqs:us-east-1:123456789012:orders-*`);
    }
  }
  return {
    deliverMax, deadLetterMax, replayMax, deliverReserved, ingestReserved, configCacheSeconds, allowedNetworks, deliveryDestinationArns,
    journalDays, archiveDays, journalBufferSeconds,
  };
}

/** The delivery journal's columns, as its lines hold them (docs/journal.md). */
export const JOURNAL_COLUMNS: [string, string][] = [
  ['topic', 'string'], ['subscription', 'string'], ['ids', 'array<string>'], ['time', 'string'],
  ['step', 'string'], ['type', 'string'], ['subject', 'string'], ['bytes', 'bigint'],
  ['attempt', 'int'], ['ms', 'bigint'], ['endpoint', 'string'], ['status', 'int'],
  ['outcome', 'string'], ['retry_after_s', 'bigint'], ['error', 'string'], ['next', 'string'],
  ['due', 'string'], ['reason', 'string'], ['until', 'string'], ['location', 'string'],
  ['answer', 'string'], ['replay', 'string'], ['redrive', 'string'], ['delivery', 'string'],
];

/** What the deliver function may do to the AWS resources it delivers to (S4). */
export const DESTINATION_ACTIONS = [
  'sqs:SendMessage', 'sqs:GetQueueUrl', 'sns:Publish', 'events:PutEvents', 'kinesis:PutRecords', 'lambda:InvokeFunction',
];
