/**
 * The Gridrelay construct's template: resources, event-source mappings and IAM policies.
 * Bundling is skipped (context aws:cdk:bundling-stacks = []), so no Rust is compiled here;
 * `make test` runs a real `cdk synth` with bundling separately.
 */
import { test } from 'node:test';
import * as assert from 'node:assert/strict';
import { App, Duration, Stack } from 'aws-cdk-lib';
import { Match, Template } from 'aws-cdk-lib/assertions';
import { Architecture } from 'aws-cdk-lib/aws-lambda';
import * as firehose from 'aws-cdk-lib/aws-kinesisfirehose';
import { Gridrelay, GridrelayProps } from '../lib/gridrelay';

function synth(props: GridrelayProps = {}): { template: Template; construct: Gridrelay; stack: Stack } {
  const app = new App({ context: { 'aws:cdk:bundling-stacks': [] } });
  const stack = new Stack(app, 'Test');
  const construct = new Gridrelay(stack, 'Gridrelay', { deadLetterExpiration: Duration.days(90), ...props });
  construct.addOutputs();
  return { template: Template.fromStack(stack), construct, stack };
}

const { template, construct, stack } = synth();
const ref = (c: { node: { defaultChild?: unknown } }) => stack.resolve((c.node.defaultChild as { logicalId: string }).logicalId);

test('four Rust functions on provided.al2023', () => {
  template.resourcePropertiesCountIs('AWS::Lambda::Function', { Runtime: 'provided.al2023', Handler: 'bootstrap' }, 4);
  template.hasResourceProperties('AWS::Lambda::Function', {
    Timeout: 300,
    LoggingConfig: Match.objectLike({ LogFormat: 'JSON' }),
    Environment: { Variables: Match.objectLike({ GRIDRELAY_TIME_SCALE: '1', GRIDRELAY_CONFIG_CACHE_SECONDS: '10' }) },
  });
});

test('the functions run on arm64 unless told otherwise', () => {
  template.resourcePropertiesCountIs('AWS::Lambda::Function', { Architectures: ['arm64'] }, 4);
  const app = new App({ context: { 'aws:cdk:bundling-stacks': [] } });
  const x86 = new Stack(app, 'X86');
  new Gridrelay(x86, 'Gridrelay', { architecture: Architecture.X86_64 });
  Template.fromStack(x86).resourcePropertiesCountIs('AWS::Lambda::Function', { Architectures: ['x86_64'] }, 4);
});

test('event sources cap their invocations; nothing is reserved unless asked for', () => {
  template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
    EventSourceArn: { 'Fn::GetAtt': [ref(construct.deliveryQueue), 'Arn'] },
    ScalingConfig: { MaximumConcurrency: 50 },
  });
  template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
    EventSourceArn: { 'Fn::GetAtt': [ref(construct.deadLetterQueue), 'Arn'] },
    ScalingConfig: { MaximumConcurrency: 5 },
  });
  // #34 item 12: control work takes the least SQS allows, whatever deliverMaxConcurrency is.
  template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
    EventSourceArn: { 'Fn::GetAtt': [ref(construct.controlQueue), 'Arn'] },
    ScalingConfig: { MaximumConcurrency: 2 },
  });
  // #35: replays' deliveries take replayMaxConcurrency, 2 by default.
  template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
    EventSourceArn: { 'Fn::GetAtt': [ref(construct.replayQueue), 'Arn'] },
    ScalingConfig: { MaximumConcurrency: 2 },
  });
  for (const fn of Object.values(template.findResources('AWS::Lambda::Function'))) {
    assert.equal(fn.Properties.ReservedConcurrentExecutions, undefined);
  }
  const app = new App({ context: { 'aws:cdk:bundling-stacks': [] } });
  const reserved = new Stack(app, 'Reserved');
  const g = new Gridrelay(reserved, 'Gridrelay', {
    deliverMaxConcurrency: 20, replayMaxConcurrency: 5, deliverReservedConcurrency: 47, ingestReservedConcurrency: 10,
  });
  const t = Template.fromStack(reserved);
  t.hasResourceProperties('AWS::Lambda::EventSourceMapping', { ScalingConfig: { MaximumConcurrency: 20 } });
  t.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
    EventSourceArn: { 'Fn::GetAtt': [reserved.resolve((g.controlQueue.node.defaultChild as unknown as { logicalId: string }).logicalId), 'Arn'] },
    ScalingConfig: { MaximumConcurrency: 2 },
  });
  t.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
    EventSourceArn: { 'Fn::GetAtt': [reserved.resolve((g.replayQueue.node.defaultChild as unknown as { logicalId: string }).logicalId), 'Arn'] },
    ScalingConfig: { MaximumConcurrency: 5 },
  });
  const reservedOf = (f: { node: { defaultChild?: unknown } }) =>
    t.findResources('AWS::Lambda::Function')[reserved.resolve((f.node.defaultChild as { logicalId: string }).logicalId)]
      .Properties.ReservedConcurrentExecutions;
  assert.equal(reservedOf(g.deliver), 47);
  assert.equal(reservedOf(g.ingest), 10);
  assert.equal(reservedOf(g.deadLetter), undefined);
});

test('concurrency props out of range are refused, naming the prop, its value and the range', () => {
  const build = (props: ConstructorParameters<typeof Gridrelay>[2]) => {
    const app = new App({ context: { 'aws:cdk:bundling-stacks': [] } });
    new Gridrelay(new Stack(app, 'Bad'), 'Gridrelay', props);
  };
  assert.throws(() => build({ deliverMaxConcurrency: 1 }), /deliverMaxConcurrency is 1; it must be a whole number from 2 to 1000/);
  assert.throws(() => build({ deadLetterMaxConcurrency: 1001 }), /deadLetterMaxConcurrency is 1001; .* from 2 to 1000/);
  assert.throws(() => build({ deliverMaxConcurrency: 100, deliverReservedConcurrency: 40 }),
    /deliverReservedConcurrency is 40; it must be a whole number from 204 \(twice deliverMaxConcurrency, for the delivery and ordered queues, plus the control queue's 2 plus replayMaxConcurrency/);
  // Every event source's maxima together: the delivery queue's alone is not enough.
  assert.throws(() => build({ deliverMaxConcurrency: 20, deliverReservedConcurrency: 42 }),
    /deliverReservedConcurrency is 42; it must be a whole number from 44/);
  assert.throws(() => build({ replayMaxConcurrency: 1 }), /replayMaxConcurrency is 1; it must be a whole number from 2 to 1000/);
  assert.throws(() => build({ ingestReservedConcurrency: 2.5 }), /ingestReservedConcurrency is 2.5/);
  assert.throws(() => build({ configCacheSeconds: 301 }), /configCacheSeconds is 301; it must be a whole number from 0 to 300/);
  assert.throws(() => build({ allowedNetworks: ['10.0.0.0/8', 'intranet'] }), /allowedNetworks has "intranet"; each must be an IPv4 or IPv6 CIDR/);
  assert.throws(() => build({ allowedNetworks: ['10.0.0.0/33'] }), /allowedNetworks has "10.0.0.0\/33"/);
  assert.throws(() => build({ allowedNetworks: ['1.2.3'] }), /allowedNetworks has "1.2.3"/);
  assert.doesNotThrow(() => build({ allowedNetworks: ['fd00::/8', '192.0.2.7', '::1/128'] }));
  assert.throws(() => build({ journalRetention: Duration.days(366) }), /journalRetention \(days\) is 366; it must be a whole number from 1 to 365/);
  assert.throws(() => build({ archiveRetention: Duration.days(366) }), /archiveRetention \(days\) is 366; it must be a whole number from 1 to 365/);
  assert.throws(() => build({ journalRetention: Duration.hours(12) }), /journalRetention \(days\) is 0.5/);
  assert.throws(() => build({ journalBufferInterval: Duration.minutes(16) }), /journalBufferInterval \(seconds\) is 960; it must be a whole number from 0 to 900/);
});

test('#35: the delivery journal: deliver and dead-letter put to its stream only; the stream keeps their GZIP records under journal/ as .json.gz, kept 7 days', () => {
  const stream = stack.resolve(construct.journalStream.logicalId);
  for (const f of [construct.deliver, construct.deadLetter]) {
    assert.deepEqual(grants(f).get('firehose:PutRecordBatch'), [{ 'Fn::GetAtt': [stream, 'Arn'] }]);
    template.hasResourceProperties('AWS::Lambda::Function', {
      Role: { 'Fn::GetAtt': [stack.resolve((f.role!.node.defaultChild as unknown as { logicalId: string }).logicalId), 'Arn'] },
      Environment: { Variables: Match.objectLike({ GRIDRELAY_JOURNAL_STREAM: { Ref: stream } }) },
    });
  }
  const archives = construct.archiveStreams.map((a) => stack.resolve(a.stream.logicalId));
  assert.deepEqual(grants(construct.ingest).get('firehose:PutRecordBatch'), archives.map((a) => ({ 'Fn::GetAtt': [a, 'Arn'] })));
  template.hasResourceProperties('AWS::KinesisFirehose::DeliveryStream', {
    DeliveryStreamType: 'DirectPut',
    ExtendedS3DestinationConfiguration: Match.objectLike({
      Prefix: 'journal/',
      CompressionFormat: 'UNCOMPRESSED',
      FileExtension: '.json.gz',
      BufferingHints: { IntervalInSeconds: 60, SizeInMBs: 64 },
    }),
  });
  template.hasResourceProperties('AWS::S3::Bucket', {
    LifecycleConfiguration: { Rules: Match.arrayWith([Match.objectLike({ Prefix: 'journal/', ExpirationInDays: 7 })]) },
  });
  // The stream's role writes only the journal's objects.
  const writes = Object.values(template.findResources('AWS::IAM::Policy'))
    .flatMap((p) => p.Properties.PolicyDocument.Statement)
    .filter((s: { Action: string | string[] }) => [s.Action].flat().includes('s3:PutObject'));
  const journalWrites = writes.filter((s: { Resource: unknown }) => JSON.stringify(s.Resource).includes('journal/*'));
  assert.equal(journalWrites.length, 1, JSON.stringify(writes));
  // #35: the archive's streams, one per retention class: ingest alone puts to them, named in
  // GRIDRELAY_ARCHIVE_STREAMS; each writes under its class's prefix through one role that
  // writes only archive/ objects; each class's objects expire after its days, and those
  // written before classes after archiveRetention (365 by default).
  assert.equal(construct.archiveStream, construct.archiveStreams[4].stream, 'the deprecated name still names the 365-day stream');
  assert.equal(archives[4], stack.resolve((construct.node.findChild('ArchiveStream') as firehose.CfnDeliveryStream).logicalId), 'the 365-day class keeps the first stream');
  template.hasResourceProperties('AWS::Lambda::Function', {
    Role: { 'Fn::GetAtt': [stack.resolve((construct.ingest.role!.node.defaultChild as unknown as { logicalId: string }).logicalId), 'Arn'] },
    Environment: {
      Variables: Match.objectLike({
        GRIDRELAY_ARCHIVE_STREAMS: {
          'Fn::Join': ['', ['1=', { Ref: archives[0] }, ',7=', { Ref: archives[1] }, ',30=', { Ref: archives[2] }, ',90=', { Ref: archives[3] }, ',365=', { Ref: archives[4] }]],
        },
      }),
    },
  });
  const namesOutput = Object.entries(template.findOutputs('*')).find(([id]) => id.includes('ArchiveStreamNames'))?.[1];
  assert.deepEqual(namesOutput?.Value, {
    'Fn::Join': ['', ['1=', { Ref: archives[0] }, ',7=', { Ref: archives[1] }, ',30=', { Ref: archives[2] }, ',90=', { Ref: archives[3] }, ',365=', { Ref: archives[4] }]],
  });
  for (const f of [construct.deliver, construct.deadLetter]) {
    for (const archive of archives) {
      assert.ok(!JSON.stringify(grants(f).get('firehose:PutRecordBatch')).includes(archive));
    }
  }
  for (const days of [1, 7, 30, 90, 365]) {
    template.hasResourceProperties('AWS::KinesisFirehose::DeliveryStream', {
      ExtendedS3DestinationConfiguration: Match.objectLike({ Prefix: `archive/${days}d/`, CompressionFormat: 'UNCOMPRESSED', FileExtension: '.json.gz' }),
    });
    template.hasResourceProperties('AWS::S3::Bucket', {
      LifecycleConfiguration: { Rules: Match.arrayWith([Match.objectLike({ Prefix: `archive/${days}d/`, ExpirationInDays: days + 1 })]) },
    });
  }
  const archiveWrites = writes.filter((s: { Resource: unknown }) => JSON.stringify(s.Resource).includes('archive/*'));
  assert.equal(archiveWrites.length, 1, JSON.stringify(writes));
  template.hasResourceProperties('AWS::S3::Bucket', {
    LifecycleConfiguration: { Rules: Match.arrayWith([Match.objectLike({ Prefix: 'archive/2', ExpirationInDays: 365 })]) },
  });
  template.hasResourceProperties('AWS::Glue::Table', {
    TableInput: Match.objectLike({
      Name: 'journal',
      PartitionKeys: [{ Name: 'hour', Type: 'string' }],
      Parameters: Match.objectLike({ 'projection.hour.format': 'yyyy/MM/dd/HH' }),
    }),
  });
});

test('deliver reaches only public https:// endpoints unless allowedNetworks widens it', () => {
  const deliverEnv = (props: ConstructorParameters<typeof Gridrelay>[2]) => {
    const app = new App({ context: { 'aws:cdk:bundling-stacks': [] } });
    const stack = new Stack(app, 'Nets');
    const g = new Gridrelay(stack, 'Gridrelay', props);
    const t = Template.fromStack(stack);
    const id = stack.resolve((g.deliver.node.defaultChild as unknown as { logicalId: string }).logicalId);
    return t.findResources('AWS::Lambda::Function')[id].Properties.Environment.Variables;
  };
  assert.equal(deliverEnv({}).GRIDRELAY_ALLOWED_NETWORKS, '');
  assert.equal(deliverEnv({ allowedNetworks: ['10.0.0.0/8', 'fd00::/8'] }).GRIDRELAY_ALLOWED_NETWORKS, '10.0.0.0/8,fd00::/8');
});

test('publish route and validation URL route on an HTTP API', () => {
  template.hasResourceProperties('AWS::ApiGatewayV2::Route', { RouteKey: 'POST /topics/{topic}/api/events' });
  template.hasResourceProperties('AWS::ApiGatewayV2::Route', { RouteKey: 'GET /subscriptions/validate' });
  template.hasResourceProperties('AWS::Lambda::Function', {
    Timeout: 300,
    Environment: { Variables: Match.objectLike({ GRIDRELAY_PUBLIC_URL: Match.anyValue() }) },
  });
});

/** The Lambda permissions of `fn` granted to principal *: (action, auth type, via the URL). */
function publicPermissions(t: Template, s: Stack, fn: { node: { defaultChild?: unknown } }): unknown[] {
  const arn = JSON.stringify({ 'Fn::GetAtt': [s.resolve((fn.node.defaultChild as { logicalId: string }).logicalId), 'Arn'] });
  return Object.values(t.findResources('AWS::Lambda::Permission'))
    .filter((p) => p.Properties.Principal === '*' && JSON.stringify(p.Properties.FunctionName) === arn)
    .map((p) => [p.Properties.Action, p.Properties.FunctionUrlAuthType, p.Properties.InvokedViaFunctionUrl])
    .sort((a, b) => String(a[0]).localeCompare(String(b[0])));
}

test('#38: the HTTP API is the default front door, and nothing is granted to principal *', () => {
  template.resourceCountIs('AWS::ApiGatewayV2::Api', 1);
  template.resourceCountIs('AWS::Lambda::Url', 0);
  for (const fn of [construct.ingest, construct.portal, construct.deliver, construct.deadLetter]) {
    assert.deepEqual(publicPermissions(template, stack, fn), []);
  }
});

test('#38: frontDoor functionUrl: a public function URL each for ingest and the portal, with both permissions, and no API', () => {
  const f = synth({ frontDoor: 'functionUrl' });
  f.template.resourceCountIs('AWS::ApiGatewayV2::Api', 0);
  f.template.resourceCountIs('AWS::ApiGatewayV2::Route', 0);
  const urls = Object.entries(f.template.findResources('AWS::Lambda::Url'));
  const target = (fn: { node: { defaultChild?: unknown } }) =>
    JSON.stringify({ 'Fn::GetAtt': [f.stack.resolve((fn.node.defaultChild as { logicalId: string }).logicalId), 'Arn'] });
  assert.deepEqual(
    urls.map(([, u]) => [JSON.stringify(u.Properties.TargetFunctionArn), u.Properties.AuthType, u.Properties.InvokeMode]).sort(),
    [[target(f.construct.ingest), 'NONE', 'BUFFERED'], [target(f.construct.portal), 'NONE', 'BUFFERED']].sort(),
  );
  // Both, or every request is refused: linters do not catch a missing lambda:InvokeFunction.
  for (const fn of [f.construct.ingest, f.construct.portal]) {
    assert.deepEqual(publicPermissions(f.template, f.stack, fn), [
      ['lambda:InvokeFunction', undefined, true],
      ['lambda:InvokeFunctionUrl', 'NONE', undefined],
    ]);
  }
  for (const fn of [f.construct.deliver, f.construct.deadLetter]) {
    assert.deepEqual(publicPermissions(f.template, f.stack, fn), []);
  }
  // The outputs and deliver's validation URLs name the URLs.
  const outputs = f.template.findOutputs('*');
  const ingestUrl = urls.find(([, u]) => JSON.stringify(u.Properties.TargetFunctionArn) === target(f.construct.ingest))?.[0];
  const portalUrl = urls.find(([, u]) => JSON.stringify(u.Properties.TargetFunctionArn) === target(f.construct.portal))?.[0];
  const output = (name: string) => JSON.stringify(Object.entries(outputs).find(([id]) => id.includes(name))?.[1]);
  assert.ok(output('PublishUrl').includes(String(ingestUrl)), output('PublishUrl'));
  assert.ok(output('PortalUrl').includes(String(portalUrl)), output('PortalUrl'));
  const deliverEnv = JSON.stringify(f.template.toJSON().Resources[f.stack.resolve((f.construct.deliver.node.defaultChild as unknown as { logicalId: string }).logicalId)].Properties.Environment.Variables.GRIDRELAY_PUBLIC_URL);
  assert.ok(deliverEnv.includes(String(ingestUrl)), deliverEnv);
  assert.throws(() => synth({ frontDoor: 'cloudFront' as 'httpApi' }), /frontDoor is "cloudFront"; it must be httpApi or functionUrl/);
});

test('event-source mappings report batch item failures', () => {
  template.resourceCountIs('AWS::Lambda::EventSourceMapping', 5);
  template.allResourcesProperties('AWS::Lambda::EventSourceMapping', {
    FunctionResponseTypes: ['ReportBatchItemFailures'],
    BatchSize: 10,
  });
  template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
    EventSourceArn: { 'Fn::GetAtt': [ref(construct.deliveryQueue), 'Arn'] },
    FunctionName: { Ref: ref(construct.deliver) },
  });
  template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
    EventSourceArn: { 'Fn::GetAtt': [ref(construct.deadLetterQueue), 'Arn'] },
    FunctionName: { Ref: ref(construct.deadLetter) },
    MaximumBatchingWindowInSeconds: 30,
  });
  // #34 item 12: deliver also consumes the control queue, without a batching window.
  const control = template.findResources('AWS::Lambda::EventSourceMapping', {
    Properties: { EventSourceArn: { 'Fn::GetAtt': [ref(construct.controlQueue), 'Arn'] } },
  });
  assert.equal(Object.keys(control).length, 1);
  const mapping = Object.values(control)[0].Properties;
  assert.deepEqual(mapping.FunctionName, { Ref: ref(construct.deliver) });
  assert.equal(mapping.MaximumBatchingWindowInSeconds, undefined);
  // #35: and the replay queue, as it consumes the delivery queue.
  template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
    EventSourceArn: { 'Fn::GetAtt': [ref(construct.replayQueue), 'Arn'] },
    FunctionName: { Ref: ref(construct.deliver) },
  });
});

test('queues: redrive for poison messages, five-minute dead-letter delay (L4)', () => {
  template.hasResourceProperties('AWS::SQS::Queue', {
    DelaySeconds: 300,
    RedrivePolicy: { deadLetterTargetArn: Match.anyValue(), maxReceiveCount: 10 },
  });
  template.hasResourceProperties('AWS::SQS::Queue', { VisibilityTimeout: 1800, RedrivePolicy: Match.anyValue() });
  template.resourceCountIs('AWS::SQS::Queue', 8);
  // Events up to 1 MB (#11 item 6): every queue takes SQS's largest message.
  template.resourcePropertiesCountIs('AWS::SQS::Queue', { MaximumMessageSize: 1048576 }, 8);
});

test('O1: the ordered queue is FIFO with a message group per key, consumed by deliver in batches of 10', () => {
  const queues = template.findResources('AWS::SQS::Queue');
  const ordered = queues[ref(construct.orderedQueue)].Properties;
  assert.equal(ordered.FifoQueue, true);
  assert.equal(ordered.FifoThroughputLimit, 'perMessageGroupId');
  assert.equal(ordered.DeduplicationScope, 'messageGroup');
  assert.equal(ordered.MessageRetentionPeriod, 1209600);
  assert.equal(ordered.QueueName, undefined, 'CloudFormation names it (ending .fifo)');
  assert.deepEqual(ordered.RedrivePolicy, {
    deadLetterTargetArn: { 'Fn::GetAtt': [ref(construct.orderedRedriveQueue), 'Arn'] },
    maxReceiveCount: 1000,
  });
  assert.equal(queues[ref(construct.orderedRedriveQueue)].Properties.FifoQueue, true);
  const mapping = Object.values(template.findResources('AWS::Lambda::EventSourceMapping', {
    Properties: { EventSourceArn: { 'Fn::GetAtt': [ref(construct.orderedQueue), 'Arn'] } },
  }))[0].Properties;
  assert.deepEqual(mapping.FunctionName, { Ref: ref(construct.deliver) });
  assert.equal(mapping.BatchSize, 10);
  assert.equal(mapping.MaximumBatchingWindowInSeconds, undefined);
  assert.deepEqual(mapping.FunctionResponseTypes, ['ReportBatchItemFailures']);
  const told = template.findResources('AWS::Lambda::Function', {
    Properties: { Environment: { Variables: { GRIDRELAY_ORDERED_QUEUE_URL: { Ref: ref(construct.orderedQueue) } } } },
  });
  for (const fn of [construct.ingest, construct.deliver, construct.deadLetter]) {
    assert.ok(Object.keys(told).includes(ref(fn)), `${fn.node.id} is told the ordered queue`);
  }
  // deliver parks ordered messages that cannot be read in the ordered redrive queue.
  const parks = template.findResources('AWS::Lambda::Function', {
    Properties: { Environment: { Variables: { GRIDRELAY_ORDERED_REDRIVE_QUEUE_URL: { Ref: ref(construct.orderedRedriveQueue) } } } },
  });
  assert.deepEqual(Object.keys(parks), [ref(construct.deliver)]);
});

for (const [lane, variable, outputId] of [
  ['controlQueue', 'GRIDRELAY_CONTROL_QUEUE_URL', 'ControlQueueUrl'],
  ['replayQueue', 'GRIDRELAY_REPLAY_QUEUE_URL', 'ReplayQueueUrl'],
] as const) {
  test(`#34 item 12, #35: the ${lane} is the delivery queue's twin, parked in the same redrive queue`, () => {
    const queues = template.findResources('AWS::SQS::Queue');
    const twin = queues[ref(construct[lane])].Properties;
    const delivery = queues[ref(construct.deliveryQueue)].Properties;
    for (const setting of ['VisibilityTimeout', 'SqsManagedSseEnabled', 'MessageRetentionPeriod', 'RedrivePolicy']) {
      assert.deepEqual(twin[setting], delivery[setting], setting);
    }
    assert.deepEqual(twin.RedrivePolicy, {
      deadLetterTargetArn: { 'Fn::GetAtt': [ref(construct.deliveryRedriveQueue), 'Arn'] },
      maxReceiveCount: 10,
    });
    // Only deliver is told of it.
    const url = { Ref: ref(construct[lane]) };
    const told = template.findResources('AWS::Lambda::Function', {
      Properties: { Environment: { Variables: { [variable]: url } } },
    });
    assert.deepEqual(Object.keys(told), [ref(construct.deliver)]);
    // What the command line needs: the queue's URL, and the queue among the stack's own.
    const outputs = template.findOutputs('*');
    const output = Object.entries(outputs).filter(([id]) => id.includes(outputId));
    assert.equal(output.length, 1);
    assert.deepEqual(output[0][1].Value, url);
    assert.match(output[0][1].Description, new RegExp(`^Set ${variable} to it`));
    const own = Object.entries(outputs).filter(([id]) => id.includes('OwnQueues'));
    assert.match(JSON.stringify(own[0][1].Value), new RegExp(`"${ref(construct[lane])}","Arn"`));
  });
}

test('delivery state table expires its records (D1, R4)', () => {
  template.hasResourceProperties('AWS::DynamoDB::Table', {
    KeySchema: [{ AttributeName: 'pk', KeyType: 'HASH' }],
    TimeToLiveSpecification: { AttributeName: 'expiresAt', Enabled: true },
  });
});

test('tables: on-demand with point-in-time recovery (topics, subscriptions, replays)', () => {
  template.resourcePropertiesCountIs('AWS::DynamoDB::Table', {
    BillingMode: 'PAY_PER_REQUEST',
    PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: true },
  }, 3);
});

test('dead-letter bucket: encrypted, private, expiring', () => {
  template.hasResourceProperties('AWS::S3::Bucket', {
    BucketEncryption: Match.objectLike({}),
    PublicAccessBlockConfiguration: {
      BlockPublicAcls: true, BlockPublicPolicy: true, IgnorePublicAcls: true, RestrictPublicBuckets: true,
    },
    LifecycleConfiguration: { Rules: [Match.objectLike({ ExpirationInDays: 90, Status: 'Enabled' })] },
  });
});

test('alarms on redrive depth, dropped and dead-lettered events', () => {
  template.resourceCountIs('AWS::CloudWatch::Alarm', 7);
  // The functions' own metrics (embedded metric format), for the stack: no log filter reads them.
  for (const metricName of ['EventsDropped', 'EventsDeadLettered', 'DeadLetterEventsDropped', 'UnsealedMessagesDropped']) {
    template.hasResourceProperties('AWS::CloudWatch::Alarm', {
      Namespace: 'Gridrelay', MetricName: metricName,
      Dimensions: [{ Name: 'Stack', Value: Match.anyValue() }],
    });
  }
  template.resourceCountIs('AWS::Logs::MetricFilter', 0);
  template.hasResourceProperties('AWS::Lambda::Function', {
    Environment: { Variables: Match.objectLike({ GRIDRELAY_STACK_NAME: Match.anyValue() }) },
  });
});

/** Every IAM statement attached to a function's role, as action → resources. */
test('deliver writes to no AWS resource unless deliveryDestinationArns names it (S4)', () => {
  const deliverOf = (props: ConstructorParameters<typeof Gridrelay>[2]) => {
    const app = new App({ context: { 'aws:cdk:bundling-stacks': [] } });
    const stack = new Stack(app, 'Dest');
    const g = new Gridrelay(stack, 'Gridrelay', props);
    const t = Template.fromStack(stack);
    const id = stack.resolve((g.deliver.node.defaultChild as unknown as { logicalId: string }).logicalId);
    const role = stack.resolve((g.deliver.role!.node.defaultChild as unknown as { logicalId: string }).logicalId);
    const statements = Object.values(t.findResources('AWS::IAM::Policy'))
      .filter((p) => (p.Properties.Roles as Array<{ Ref: string }>).some((r) => r.Ref === role))
      .flatMap((p) => p.Properties.PolicyDocument.Statement as Array<{ Action: string | string[]; Resource: unknown }>);
    return { env: t.findResources('AWS::Lambda::Function')[id].Properties.Environment.Variables, statements };
  };
  const none = deliverOf({});
  assert.equal(none.env.GRIDRELAY_DELIVERY_DESTINATIONS, '');
  // #34 item 2: the stack's eight queues, refused as destinations whatever the list allows.
  const own = JSON.stringify(none.env.GRIDRELAY_OWN_QUEUES);
  for (const queue of ['DeliveryQueue', 'ControlQueue', 'ReplayQueue', 'DeadLetterQueue', 'OrderedQueue', 'DeliveryRedriveQueue', 'DeadLetterRedriveQueue', 'OrderedRedriveQueue']) {
    assert.match(own, new RegExp(`"[A-Za-z0-9]*${queue}[0-9A-F]{8}","Arn"`), `GRIDRELAY_OWN_QUEUES names ${queue}: ${own}`);
  }
  assert.ok(!JSON.stringify(none.statements).includes('sns:Publish'), 'no destination actions without destinations');
  const arns = ['arn:aws:sqs:us-east-1:123456789012:orders-*', 'arn:aws:events:us-east-1:123456789012:event-bus/orders'];
  const some = deliverOf({ deliveryDestinationArns: arns });
  assert.equal(some.env.GRIDRELAY_DELIVERY_DESTINATIONS, arns.join(','));
  const granted = some.statements.filter((s) => JSON.stringify(s.Action).includes('kinesis:PutRecords'));
  assert.equal(granted.length, 1);
  assert.deepEqual(granted[0].Resource, arns);
  assert.deepEqual(granted[0].Action, ['sqs:SendMessage', 'sqs:GetQueueUrl', 'sns:Publish', 'events:PutEvents', 'kinesis:PutRecords', 'lambda:InvokeFunction']);
  assert.throws(() => deliverOf({ deliveryDestinationArns: ['*'] }), /deliveryDestinationArns has "\*"; each must be an SQS, SNS/);
  assert.throws(() => deliverOf({ deliveryDestinationArns: ['arn:aws:s3:::bucket'] }), /deliveryDestinationArns has "arn:aws:s3:::bucket"/);
});

function grants(fn: { role?: { node: { defaultChild?: unknown } } }): Map<string, unknown[]> {
  const role = stack.resolve((fn.role!.node.defaultChild as { logicalId: string }).logicalId);
  const out = new Map<string, unknown[]>();
  const policies = template.findResources('AWS::IAM::Policy');
  for (const policy of Object.values(policies)) {
    const roles = policy.Properties.Roles as Array<{ Ref: string }>;
    if (!roles.some((r) => r.Ref === role)) continue;
    for (const s of policy.Properties.PolicyDocument.Statement) {
      const actions: string[] = Array.isArray(s.Action) ? s.Action : [s.Action];
      const resources = Array.isArray(s.Resource) ? s.Resource : [s.Resource];
      for (const a of actions) out.set(a, [...(out.get(a) ?? []), ...resources]);
    }
  }
  return out;
}

/** The conditions of `fn`'s statements allowing `action` (s3:ListBucket: which prefixes it may list). */
function listConditions(fn: { role?: { node: { defaultChild?: unknown } } }, action = 's3:ListBucket'): unknown[] {
  const role = ref(fn.role!);
  return Object.values(template.findResources('AWS::IAM::Policy'))
    .filter((p) => (p.Properties.Roles as Array<{ Ref: string }>).some((r) => r.Ref === role))
    .flatMap((p) => p.Properties.PolicyDocument.Statement)
    .filter((s: { Action: string | string[] }) => [s.Action].flat().includes(action))
    .map((s: { Condition?: unknown }) => s.Condition);
}

test('least privilege: ingest reads topics and subscriptions, sends to the delivery queue, puts to the archive stream and marks accepted ids (P1) only', () => {
  const g = grants(construct.ingest);
  assert.deepEqual([...g.keys()].sort(), ['dynamodb:BatchGetItem', 'dynamodb:BatchWriteItem', 'dynamodb:GetItem', 'dynamodb:PutItem', 'dynamodb:Query', 'firehose:PutRecordBatch', 'secretsmanager:GetSecretValue', 'sqs:SendMessage']);
  // P1: the delivery state table's dedup# items only.
  const state = [{ 'Fn::GetAtt': [ref(construct.deliveryStateTable), 'Arn'] }];
  for (const action of ['dynamodb:BatchGetItem', 'dynamodb:BatchWriteItem']) {
    assert.deepEqual(g.get(action), state);
    assert.deepEqual(listConditions(construct.ingest, action), [
      { 'ForAllValues:StringLike': { 'dynamodb:LeadingKeys': ['dedup#*'] } },
    ]);
  }
  assert.deepEqual(g.get('dynamodb:GetItem'), [
    { 'Fn::GetAtt': [ref(construct.topicsTable), 'Arn'] },
    { 'Fn::GetAtt': [ref(construct.subscriptionsTable), 'Arn'] },
  ]);
  assert.deepEqual(g.get('dynamodb:PutItem'), [{ 'Fn::GetAtt': [ref(construct.subscriptionsTable), 'Arn'] }]);
  assert.deepEqual(g.get('dynamodb:Query'), [{ 'Fn::GetAtt': [ref(construct.subscriptionsTable), 'Arn'] }]);
  // O1: ordered subscriptions' events go to the ordered queue.
  assert.deepEqual(g.get('sqs:SendMessage'), [
    { 'Fn::GetAtt': [ref(construct.deliveryQueue), 'Arn'] },
    { 'Fn::GetAtt': [ref(construct.orderedQueue), 'Arn'] },
  ]);
});

test('#34 item 2: each function reads the generated queue key, and only that secret beside its own', () => {
  template.hasResourceProperties('AWS::SecretsManager::Secret', {
    GenerateSecretString: { PasswordLength: 64, ExcludePunctuation: true },
  });
  const key = { Ref: ref(construct.queueKey) };
  template.hasResourceProperties('AWS::Lambda::Function', {
    Environment: { Variables: Match.objectLike({ GRIDRELAY_QUEUE_KEY_SECRET: key }) },
  });
  // Every function is told of it (the portal too: one environment).
  assert.equal(Object.keys(template.findResources('AWS::Lambda::Function', {
    Properties: { Environment: { Variables: { GRIDRELAY_QUEUE_KEY_SECRET: key } } },
  })).length, 4);
  assert.deepEqual(grants(construct.ingest).get('secretsmanager:GetSecretValue'), [key]);
  assert.deepEqual(grants(construct.deadLetter).get('secretsmanager:GetSecretValue'), [key]);
  const deliver = grants(construct.deliver).get('secretsmanager:GetSecretValue') ?? [];
  assert.equal(deliver.length, 2);
  assert.deepEqual(deliver[1], key);
});

test('least privilege: deliver consumes its two queues and sends to its four queues and the ordered redrive queue only', () => {
  const g = grants(construct.deliver);
  for (const [action, resources] of g) {
    assert.ok(!action.includes('*'), `wildcard action ${action}`);
    assert.ok(resources.every((r) => r !== '*'), `${action} on every resource`);
  }
  const state = { 'Fn::GetAtt': [ref(construct.deliveryStateTable), 'Arn'] };
  const replays = { 'Fn::GetAtt': [ref(construct.replaysTable), 'Arn'] };
  assert.deepEqual(g.get('dynamodb:GetItem'), [{ 'Fn::GetAtt': [ref(construct.subscriptionsTable), 'Arn'] }, state, replays]);
  assert.deepEqual(g.get('dynamodb:PutItem'), [{ 'Fn::GetAtt': [ref(construct.subscriptionsTable), 'Arn'] }, state, replays]);
  assert.deepEqual(g.get('dynamodb:UpdateItem'), [state]);
  assert.deepEqual(g.get('dynamodb:BatchGetItem'), [state]);
  assert.deepEqual(g.get('dynamodb:DeleteItem'), [{ 'Fn::GetAtt': [ref(construct.subscriptionsTable), 'Arn'] }, state]);
  const deliveryQueue = { 'Fn::GetAtt': [ref(construct.deliveryQueue), 'Arn'] };
  const controlQueue = { 'Fn::GetAtt': [ref(construct.controlQueue), 'Arn'] };
  const replayQueue = { 'Fn::GetAtt': [ref(construct.replayQueue), 'Arn'] };
  const orderedQueue = { 'Fn::GetAtt': [ref(construct.orderedQueue), 'Arn'] };
  assert.deepEqual(g.get('sqs:SendMessage'), [
    deliveryQueue,
    controlQueue,
    replayQueue,
    { 'Fn::GetAtt': [ref(construct.deadLetterQueue), 'Arn'] },
    // O1: ordered messages that cannot be read are parked there.
    { 'Fn::GetAtt': [ref(construct.orderedRedriveQueue), 'Arn'] },
  ]);
  // Its event sources (#34 item 12, #35, O1): the same on the control, replay and ordered
  // queues as on the delivery queue (it never sends to the ordered queue).
  for (const action of ['sqs:ReceiveMessage', 'sqs:DeleteMessage', 'sqs:GetQueueAttributes', 'sqs:ChangeMessageVisibility', 'sqs:GetQueueUrl']) {
    assert.deepEqual(g.get(action), [deliveryQueue, controlQueue, replayQueue, orderedQueue], action);
  }
  const secrets = JSON.stringify(g.get('secretsmanager:GetSecretValue'));
  assert.ok(secrets.includes(':secret:gridrelay/*'), `secrets only under the prefix: ${secrets}`);
  const deleted = JSON.stringify(g.get('secretsmanager:DeleteSecret'));
  assert.ok(deleted.includes(':secret:gridrelay/*'), `expired subscriptions' secrets only under the prefix: ${deleted}`);
  assert.ok(!g.has('s3:PutObject'), 'deliver never writes to S3');
  // #35: replays read the topic archives only: listed and read under archive/.
  assert.ok(JSON.stringify(g.get('s3:GetObject')).includes('/archive/*'), JSON.stringify(g.get('s3:GetObject')));
  assert.deepEqual(listConditions(construct.deliver), [{ StringLike: { 's3:prefix': 'archive/*' } }]);
  template.hasResourceProperties('AWS::Lambda::Function', {
    Role: { 'Fn::GetAtt': [stack.resolve((construct.deliver.role!.node.defaultChild as unknown as { logicalId: string }).logicalId), 'Arn'] },
    Environment: { Variables: Match.objectLike({ GRIDRELAY_REPLAYS_TABLE: { Ref: ref(construct.replaysTable) } }) },
  });
});

test('least privilege: dead-letter writes objects in its bucket and announces them (L7)', () => {
  const g = grants(construct.deadLetter);
  const s3Actions = [...g.keys()].filter((a) => a.startsWith('s3:'));
  assert.deepEqual(s3Actions, ['s3:PutObject']);
  assert.deepEqual(g.get('s3:PutObject'), [
    { 'Fn::Join': ['', [{ 'Fn::GetAtt': [ref(construct.deadLetterBucket), 'Arn'] }, '/*']] },
  ]);
  assert.deepEqual(g.get('dynamodb:Query'), [{ 'Fn::GetAtt': [ref(construct.subscriptionsTable), 'Arn'] }]);
  assert.ok(!g.has('dynamodb:GetItem'), 'dead-letter never reads single records');
  assert.deepEqual(g.get('sqs:SendMessage'), [
    { 'Fn::GetAtt': [ref(construct.deadLetterQueue), 'Arn'] },
    { 'Fn::GetAtt': [ref(construct.deliveryQueue), 'Arn'] },
    { 'Fn::GetAtt': [ref(construct.orderedQueue), 'Arn'] },
  ]);
});

test('#34 item 12, #35: only deliver may touch the control and replay queues', () => {
  for (const queue of [construct.controlQueue, construct.replayQueue]) {
    const arn = JSON.stringify({ 'Fn::GetAtt': [ref(queue), 'Arn'] });
    for (const fn of [construct.ingest, construct.deadLetter, construct.portal]) {
      const g = JSON.stringify([...grants(fn)]);
      assert.ok(!g.includes(arn), `${fn.node.id} is granted something on ${queue.node.id}: ${g}`);
    }
  }
});

test('#36: the portal answers its five routes of the publish API and touches only what its page shows and sends', () => {
  const integrations = template.findResources('AWS::ApiGatewayV2::Integration');
  const portalArn = JSON.stringify({ 'Fn::GetAtt': [ref(construct.portal), 'Arn'] });
  const portalIntegrations = Object.entries(integrations)
    .filter(([, i]) => JSON.stringify(i.Properties.IntegrationUri) === portalArn)
    .map(([id]) => id);
  assert.equal(portalIntegrations.length, 1);
  const routes = Object.values(template.findResources('AWS::ApiGatewayV2::Route'))
    .filter((r) => JSON.stringify(r.Properties.Target).includes(portalIntegrations[0]))
    .map((r) => r.Properties.RouteKey)
    .sort();
  assert.deepEqual(routes, [
    'GET /portal/gridrelay.css',
    'GET /portal/{topic}/{name}',
    'POST /portal/{topic}/{name}/send-again',
    'POST /portal/{topic}/{name}/signing-secret',
    'POST /portal/{topic}/{name}/test-event',
  ]);

  const key = { Ref: ref(construct.portalKey) };
  template.resourcePropertiesCountIs('AWS::SecretsManager::Secret', {
    GenerateSecretString: { PasswordLength: 64, ExcludePunctuation: true },
  }, 2);
  template.hasResourceProperties('AWS::Lambda::Function', {
    Environment: { Variables: Match.objectLike({
      GRIDRELAY_PORTAL_KEY_SECRET: key,
      GRIDRELAY_JOURNAL_BUCKET: { Ref: ref(construct.journalBucket) },
    }) },
  });
  const g = grants(construct.portal);
  const state = { 'Fn::GetAtt': [ref(construct.deliveryStateTable), 'Arn'] };
  const bucket = { 'Fn::GetAtt': [ref(construct.journalBucket), 'Arn'] };
  const deadLetters = { 'Fn::GetAtt': [ref(construct.deadLetterBucket), 'Arn'] };
  const deadLetterObjects = { 'Fn::Join': ['', [deadLetters, '/*']] };
  const secrets = JSON.stringify(g.get('secretsmanager:CreateSecret'));
  assert.ok(secrets.includes(':secret:gridrelay/*/signing/*'), `a rotation's secrets: signing secrets only: ${secrets}`);
  const underPrefix = g.get('secretsmanager:CreateSecret');
  assert.deepEqual(Object.fromEntries(g), {
    'dynamodb:GetItem': [
      { 'Fn::GetAtt': [ref(construct.subscriptionsTable), 'Arn'] },
      { 'Fn::GetAtt': [ref(construct.topicsTable), 'Arn'] },
    ],
    'dynamodb:PutItem': [{ 'Fn::GetAtt': [ref(construct.subscriptionsTable), 'Arn'] }, state],
    'secretsmanager:CreateSecret': underPrefix,
    'secretsmanager:PutSecretValue': underPrefix,
    'secretsmanager:DeleteSecret': underPrefix,
    'dynamodb:BatchGetItem': [state],
    's3:ListBucket': [bucket, deadLetters],
    's3:GetObject': [
      { 'Fn::Join': ['', [bucket, '/journal/*']] },
      { 'Fn::Join': ['', [bucket, '/archive/*']] },
      deadLetterObjects,
    ],
    's3:PutObject': [deadLetterObjects],
    's3:DeleteObject': [deadLetterObjects],
    'secretsmanager:GetSecretValue': [key, { Ref: ref(construct.queueKey) }],
    'sqs:SendMessage': [{ 'Fn::GetAtt': [ref(construct.deliveryQueue), 'Arn'] }],
  });
  // The journal's bucket under journal/ and archive/ only; the dead-letter bucket whole (its
  // subscriptions' folders are the portal's to keep to).
  assert.deepEqual(listConditions(construct.portal), [
    { StringLike: { 's3:prefix': ['journal/*', 'archive/*'] } },
    undefined,
  ]);
  // Subscriptions written whole (a rotation); the delivery state only as test events' claims.
  assert.deepEqual(listConditions(construct.portal, 'dynamodb:PutItem'), [
    undefined,
    { 'ForAllValues:StringLike': { 'dynamodb:LeadingKeys': ['claim#portal-test#*', 'claim#portal-again#*'] } },
  ]);
  const outputs = template.findOutputs('*');
  assert.deepEqual(Object.values(outputs).filter((o) => JSON.stringify(o.Value) === JSON.stringify(key)).length, 1);
  assert.ok(Object.keys(outputs).some((id) => id.includes('PortalUrl')), Object.keys(outputs).join(', '));
});
