"""Least privilege and concurrency limits in the SAM template, checked on what SAM really deploys.

Transforms infra/template.yaml with SAM's own translator (the one `sam deploy` uses), then
asserts, for each function's role, the exact actions and resources it is allowed, and that no
managed policy other than basic Lambda logging is attached; that every event source caps its
invocations (MaximumConcurrency) by default and reserved concurrency is set only when asked for;
and that the functions run on arm64 unless the Architecture parameter says otherwise.
Run by infra/deploy/check.sh.
"""
import os
import sys
from pathlib import Path

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class ManagedPolicies:
    """The managed policy names SAM may need to resolve, without calling IAM."""

    def load(self):
        base = "arn:aws:iam::aws:policy/service-role/"
        return {n: base + n for n in ["AWSLambdaBasicExecutionRole", "AWSLambdaSQSQueueExecutionRole"]}


def getatt(name):
    return {"Fn::GetAtt": [name, "Arn"]}


# S4: the AWS resources deliver may write to, granted only when the parameter names some.
DESTINATIONS = {"Ref": "DeliveryDestinationArns"}
DESTINATIONS_CONDITION = "HasDeliveryDestinations"

QUEUE_KEY = {"Ref": "QueueKey"}
# #36: signing secrets only (PREFIX/TOPIC/SUBSCRIPTION/signing/...), not delivery headers'.
SIGNING_SECRETS = {"Fn::Sub": "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:${SecretPrefix}/*/signing/*"}
PORTAL_KEY = {"Ref": "PortalKey"}

# #35: the topic archive's streams by retention class (days), as ingest reads them from
# GRIDRELAY_ARCHIVE_STREAMS (shared::archive::ARCHIVE_CLASSES); the 365-day class's is the
# stack's first archive stream, ArchiveStream.
ARCHIVE_STREAMS = [
    (1, "ArchiveStream1d"),
    (7, "ArchiveStream7d"),
    (30, "ArchiveStream30d"),
    (90, "ArchiveStream90d"),
    (365, "ArchiveStream"),
]


EXPECTED = {
    "IngestFunction": {
        "dynamodb:GetItem": [getatt("TopicsTable"), getatt("SubscriptionsTable")],
        "dynamodb:Query": [getatt("SubscriptionsTable")],
        "dynamodb:PutItem": [getatt("SubscriptionsTable")],
        # O1: ordered subscriptions' events go to the ordered (FIFO) queue.
        "sqs:SendMessage": [getatt("DeliveryQueue"), getatt("OrderedQueue")],
        # #34 item 2: the key its queue messages are sealed with.
        "secretsmanager:GetSecretValue": [QUEUE_KEY],
        # #35: topic archives, one call per publish.
        "firehose:PutRecordBatch": [getatt(stream) for _, stream in ARCHIVE_STREAMS],
        # P1: accepted event ids of topics with a deduplication window (dedup# items only:
        # checked below).
        "dynamodb:BatchGetItem": [getatt("DeliveryStateTable")],
        "dynamodb:BatchWriteItem": [getatt("DeliveryStateTable")],
    },
    "DeliverFunction": {
        # #35: replays' records (read, then written over the version read).
        "dynamodb:GetItem": [getatt("SubscriptionsTable"), getatt("DeliveryStateTable"), getatt("ReplaysTable")],
        "dynamodb:PutItem": [getatt("SubscriptionsTable"), getatt("DeliveryStateTable"), getatt("ReplaysTable")],
        "dynamodb:UpdateItem": [getatt("DeliveryStateTable")],
        # #35: replays read the topic archives, listed (under archive/ only: checked below)
        # and read under archive/ only.
        "s3:ListBucket": [getatt("JournalBucket")],
        "s3:GetObject": [{"Fn::Sub": "${JournalBucket.Arn}/archive/*"}],
        # #34 item 5: a subscription's slot items read at once.
        "dynamodb:BatchGetItem": [getatt("DeliveryStateTable")],
        "dynamodb:DeleteItem": [getatt("SubscriptionsTable"), getatt("DeliveryStateTable")],
        # #35: the delivery journal, one call per invocation.
        "firehose:PutRecordBatch": [getatt("JournalStream")],
        # O1: ordered messages that cannot be read are parked in the ordered redrive queue.
        "sqs:SendMessage": [getatt("DeliveryQueue"), getatt("ControlQueue"), getatt("ReplayQueue"), getatt("DeadLetterQueue"), getatt("OrderedRedriveQueue"), DESTINATIONS],
        "sqs:GetQueueUrl": [DESTINATIONS],
        "sns:Publish": [DESTINATIONS],
        "events:PutEvents": [DESTINATIONS],
        "kinesis:PutRecords": [DESTINATIONS],
        "lambda:InvokeFunction": [DESTINATIONS],
        "secretsmanager:GetSecretValue": [
            {"Fn::Sub": "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:${SecretPrefix}/*"},
            QUEUE_KEY,
        ],
        "secretsmanager:DeleteSecret": [
            {"Fn::Sub": "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:${SecretPrefix}/*"}
        ],
        # Its four event sources: the delivery queue, the control queue (#34 item 12), the
        # replay queue (#35) and the ordered queue (O1: its messages held in flight until due;
        # deliver never sends to it).
        "sqs:ReceiveMessage": [getatt("DeliveryQueue"), getatt("ControlQueue"), getatt("ReplayQueue"), getatt("OrderedQueue")],
        "sqs:DeleteMessage": [getatt("DeliveryQueue"), getatt("ControlQueue"), getatt("ReplayQueue"), getatt("OrderedQueue")],
        "sqs:GetQueueAttributes": [getatt("DeliveryQueue"), getatt("ControlQueue"), getatt("ReplayQueue"), getatt("OrderedQueue")],
        "sqs:ChangeMessageVisibility": [getatt("DeliveryQueue"), getatt("ControlQueue"), getatt("ReplayQueue"), getatt("OrderedQueue")],
    },
    "DeadLetterFunction": {
        "s3:PutObject": [{"Fn::Sub": "${DeadLetterBucket.Arn}/*"}],
        # L7's announcements, to ordered subscriptions of the system topic too (O1).
        "sqs:SendMessage": [getatt("DeadLetterQueue"), getatt("DeliveryQueue"), getatt("OrderedQueue")],
        "dynamodb:Query": [getatt("SubscriptionsTable")],
        "sqs:ReceiveMessage": [getatt("DeadLetterQueue")],
        "sqs:DeleteMessage": [getatt("DeadLetterQueue")],
        "sqs:GetQueueAttributes": [getatt("DeadLetterQueue")],
        "sqs:ChangeMessageVisibility": [getatt("DeadLetterQueue")],
        "secretsmanager:GetSecretValue": [QUEUE_KEY],
        # #35: where each message's events went, one call per invocation.
        "firehose:PutRecordBatch": [getatt("JournalStream")],
    },
    # #36: one subscription's page: it, its endpoint's and host's health (one BatchGetItem),
    # the journal (listed under journal/ only: checked below) and its key; test events and
    # events sent again into the delivery queue (sealed): dead-lettered ones from the
    # dead-letter bucket's objects, rewritten or deleted as their events leave; dropped ones
    # from the topic's archive (archive/, listed under it only).
    "PortalFunction": {
        # The subscription, and its topic (whether it keeps an archive).
        "dynamodb:GetItem": [getatt("SubscriptionsTable"), getatt("TopicsTable")],
        # A signing-secret rotation: the subscription written over the version read, its new
        # secret kept under the prefix, the one it retires deleted (signing secrets only).
        # ...and the portal's claims (those items only: checked below).
        "dynamodb:PutItem": [getatt("SubscriptionsTable"), getatt("DeliveryStateTable")],
        "secretsmanager:CreateSecret": [SIGNING_SECRETS],
        "secretsmanager:PutSecretValue": [SIGNING_SECRETS],
        "secretsmanager:DeleteSecret": [SIGNING_SECRETS],
        "dynamodb:BatchGetItem": [getatt("DeliveryStateTable")],
        "s3:ListBucket": [getatt("JournalBucket"), getatt("DeadLetterBucket")],
        # The journal, and the topics' archives (dropped events sent again).
        "s3:GetObject": [
            {"Fn::Sub": "${JournalBucket.Arn}/journal/*"},
            {"Fn::Sub": "${JournalBucket.Arn}/archive/*"},
            {"Fn::Sub": "${DeadLetterBucket.Arn}/*"},
        ],
        "s3:PutObject": [{"Fn::Sub": "${DeadLetterBucket.Arn}/*"}],
        "s3:DeleteObject": [{"Fn::Sub": "${DeadLetterBucket.Arn}/*"}],
        "secretsmanager:GetSecretValue": [PORTAL_KEY, QUEUE_KEY],
        "sqs:SendMessage": [getatt("DeliveryQueue")],
    },
}


# Each event source, by its queue: the function it invokes and its MaximumConcurrency (a
# parameter's name, or a fixed number). The control queue's is SQS's least: control work is light.
CAPPED_SOURCES = {
    "DeliveryQueue": ("DeliverFunction", "DeliverMaximumConcurrency"),
    "ControlQueue": ("DeliverFunction", 2),
    "ReplayQueue": ("DeliverFunction", "ReplayMaximumConcurrency"),
    "OrderedQueue": ("DeliverFunction", "DeliverMaximumConcurrency"),
    "DeadLetterQueue": ("DeadLetterFunction", "DeadLetterMaximumConcurrency"),
}
RESERVED = {"DeliverFunction": "DeliverReservedConcurrency", "IngestFunction": "IngestReservedConcurrency"}


def concurrency_problems(resources, defaults):
    """Each event source caps its invocations with its parameter (a safe default between 2 and
    1000); reserved concurrency is a parameter that defaults to none; arm64 is the default."""
    problems = []
    for queue, (function, parameter) in CAPPED_SOURCES.items():
        mapping = next(
            (r["Properties"] for r in resources.values()
             if r["Type"] == "AWS::Lambda::EventSourceMapping" and r["Properties"]["EventSourceArn"] == getatt(queue)),
            None,
        )
        if mapping is None or mapping["FunctionName"] != {"Ref": function}:
            problems.append(f"{queue}: expected an event source to {function}, got {mapping}")
            continue
        cap = mapping.get("ScalingConfig", {}).get("MaximumConcurrency")
        if isinstance(parameter, int):
            if cap != parameter:
                problems.append(f"{queue}: event source MaximumConcurrency is {cap}, expected {parameter}")
        elif cap != {"Ref": parameter}:
            problems.append(f"{queue}: event source MaximumConcurrency is {cap}, expected the {parameter} parameter")
        elif not 2 <= int(defaults.get(parameter, 0)) <= 1000:
            problems.append(f"{parameter}: default {defaults.get(parameter)} is outside 2-1000")
    for function, parameter in RESERVED.items():
        reserved = resources[function]["Properties"].get("ReservedConcurrentExecutions")
        if not (isinstance(reserved, dict) and {"Ref": parameter} in reserved.get("Fn::If", [])):
            problems.append(f"{function}: ReservedConcurrentExecutions is {reserved}, expected the {parameter} parameter")
        if int(defaults.get(parameter, -1)) != 0:
            problems.append(f"{parameter}: default {defaults.get(parameter)}, expected 0 (none reserved)")
    if defaults.get("Architecture") != "arm64":
        problems.append(f"Architecture: default {defaults.get('Architecture')}, expected arm64")
    for function in EXPECTED:
        architectures = resources[function]["Properties"].get("Architectures")
        if architectures != [{"Ref": "Architecture"}]:
            problems.append(f"{function}: Architectures {architectures}, expected the Architecture parameter")
    return problems


def metric_problems(resources):
    """The functions' metrics are embedded metric format with dimension Stack (issue #9): the
    alarms must name that dimension (a metric without it has no data) and the functions must be
    told the stack's name."""
    problems = []
    for alarm, metric in [
        ("DroppedEventsAlarm", "EventsDropped"),
        ("DeadLetteredEventsAlarm", "EventsDeadLettered"),
        ("DeadLetterDroppedEventsAlarm", "DeadLetterEventsDropped"),
        ("UnsealedMessagesAlarm", "UnsealedMessagesDropped"),
    ]:
        props = resources.get(alarm, {}).get("Properties", {})
        if props.get("MetricName") != metric or [d.get("Name") for d in props.get("Dimensions", [])] != ["Stack"]:
            problems.append(f"{alarm}: expected {metric} with dimension Stack, got {props}")
    for function in ["DeliverFunction", "DeadLetterFunction"]:
        env = resources[function]["Properties"].get("Environment", {}).get("Variables", {})
        if "GRIDRELAY_STACK_NAME" not in env:
            problems.append(f"{function}: GRIDRELAY_STACK_NAME is not set (its metrics' Stack dimension)")
    if any(r["Type"] == "AWS::Logs::MetricFilter" for r in resources.values()):
        problems.append("a log metric filter: the functions' metrics are embedded metric format")
    return problems


def generated_key_problems(resources, secret):
    """A secret the stack generates: 64 letters and digits."""
    generated = resources.get(secret, {}).get("Properties", {}).get("GenerateSecretString")
    if generated != {"PasswordLength": 64, "ExcludePunctuation": True}:
        return [f"{secret}: expected a generated 64-character key, got {generated}"]
    return []


def queue_key_problems(resources):
    """#34 item 2: a generated key (64 letters and digits) that every function is told of."""
    problems = generated_key_problems(resources, "QueueKey")
    for function in ["IngestFunction", "DeliverFunction", "DeadLetterFunction"]:
        env = resources[function]["Properties"].get("Environment", {}).get("Variables", {})
        if env.get("GRIDRELAY_QUEUE_KEY_SECRET") != QUEUE_KEY:
            problems.append(f"{function}: GRIDRELAY_QUEUE_KEY_SECRET is {env.get('GRIDRELAY_QUEUE_KEY_SECRET')}")
    return problems


def ordered_queue_problems(resources, outputs, globals_env):
    """O1: the ordered queue is FIFO in high-throughput mode, kept 14 days, with a FIFO redrive
    queue whose receive count (1000, SQS's most) the retry ladder's holds never reach; its
    event source takes batches of 10 and no window (FIFO sources take none); every function
    is told its URL, it is among the stack's own queues, and the stack outputs it; deliver is
    told the redrive queue's URL, where it parks ordered messages that cannot be read."""
    problems = []
    ordered = resources.get("OrderedQueue", {}).get("Properties", {})
    expected = {
        "FifoQueue": True,
        "FifoThroughputLimit": "perMessageGroupId",
        "DeduplicationScope": "messageGroup",
        "MessageRetentionPeriod": 1209600,
        "SqsManagedSseEnabled": True,
        "RedrivePolicy": {"deadLetterTargetArn": getatt("OrderedRedriveQueue"), "maxReceiveCount": 1000},
    }
    for setting, value in expected.items():
        if ordered.get(setting) != value:
            problems.append(f"OrderedQueue: {setting} is {ordered.get(setting)}, expected {value}")
    if "QueueName" in ordered:
        problems.append("OrderedQueue: a fixed QueueName (CloudFormation names it, ending .fifo)")
    redrive = resources.get("OrderedRedriveQueue", {}).get("Properties", {})
    if redrive.get("FifoQueue") is not True:
        problems.append(f"OrderedRedriveQueue: FifoQueue is {redrive.get('FifoQueue')}")
    mapping = next(
        (r["Properties"] for r in resources.values()
         if r["Type"] == "AWS::Lambda::EventSourceMapping" and r["Properties"]["EventSourceArn"] == getatt("OrderedQueue")),
        {},
    )
    if mapping.get("BatchSize") != 10 or "MaximumBatchingWindowInSeconds" in mapping:
        problems.append(f"OrderedQueue's event source: expected BatchSize 10 and no window, got {mapping}")
    if globals_env.get("GRIDRELAY_ORDERED_QUEUE_URL") != {"Ref": "OrderedQueue"}:
        problems.append(f"Globals: GRIDRELAY_ORDERED_QUEUE_URL is {globals_env.get('GRIDRELAY_ORDERED_QUEUE_URL')}")
    env = resources["DeliverFunction"]["Properties"].get("Environment", {}).get("Variables", {})
    own = env.get("GRIDRELAY_OWN_QUEUES", {}).get("Fn::Join", ["", []])[1]
    for queue in ["OrderedQueue", "OrderedRedriveQueue"]:
        if getatt(queue) not in own:
            problems.append(f"DeliverFunction: GRIDRELAY_OWN_QUEUES lacks {queue}")
    if env.get("GRIDRELAY_ORDERED_REDRIVE_QUEUE_URL") != {"Ref": "OrderedRedriveQueue"}:
        problems.append(
            f"DeliverFunction: GRIDRELAY_ORDERED_REDRIVE_QUEUE_URL is {env.get('GRIDRELAY_ORDERED_REDRIVE_QUEUE_URL')}"
        )
    if outputs.get("OrderedQueueUrl", {}).get("Value") != {"Ref": "OrderedQueue"}:
        problems.append(f"Outputs: OrderedQueueUrl is {outputs.get('OrderedQueueUrl')}")
    return problems


def lane_queue_problems(resources, outputs):
    """#34 item 12, #35: the control and replay queues are the delivery queue's twins
    (visibility, retention, encryption, redrive queue), deliver is told their URLs, they are
    among the stack's own queues, and the stack outputs them for the command line."""
    problems = []
    delivery = resources["DeliveryQueue"]["Properties"]
    env = resources["DeliverFunction"]["Properties"].get("Environment", {}).get("Variables", {})
    for queue, variable, output in [
        ("ControlQueue", "GRIDRELAY_CONTROL_QUEUE_URL", "ControlQueueUrl"),
        ("ReplayQueue", "GRIDRELAY_REPLAY_QUEUE_URL", "ReplayQueueUrl"),
    ]:
        lane = resources.get(queue, {}).get("Properties", {})
        for setting in ["VisibilityTimeout", "MessageRetentionPeriod", "SqsManagedSseEnabled", "RedrivePolicy"]:
            if lane.get(setting) != delivery.get(setting):
                problems.append(f"{queue}: {setting} is {lane.get(setting)}, the delivery queue's is {delivery.get(setting)}")
        if env.get(variable) != {"Ref": queue}:
            problems.append(f"DeliverFunction: {variable} is {env.get(variable)}")
        if getatt(queue) not in env.get("GRIDRELAY_OWN_QUEUES", {}).get("Fn::Join", ["", []])[1]:
            problems.append(f"DeliverFunction: GRIDRELAY_OWN_QUEUES lacks {queue}: {env.get('GRIDRELAY_OWN_QUEUES')}")
        if outputs.get(output, {}).get("Value") != {"Ref": queue}:
            problems.append(f"Outputs: {output} is {outputs.get(output)}")
    return problems


def stream_problems(resources, stream, prefix, writers, env_name, env_value=None, role_prefix=None):
    """#35: `writers` write to `stream` (named to them by `env_name`: `env_value`, by default a
    Ref to the stream); the stream writes their GZIP records (JSON lines) as they are, named
    .json.gz, into the journal's bucket under `prefix` with its own hour prefix (what the readers
    and the Glue table expect), through a role that may only write under `role_prefix` (by
    default `prefix`)."""
    problems = []
    env_value = env_value or {"Ref": stream}
    role_prefix = role_prefix or prefix
    for function in writers:
        env = resources[function]["Properties"].get("Environment", {}).get("Variables", {})
        if env.get(env_name) != env_value:
            problems.append(f"{function}: {env_name} is {env.get(env_name)}")
    destination = resources[stream]["Properties"].get("ExtendedS3DestinationConfiguration", {})
    expected = {
        "Prefix": prefix,
        # The writers compress each record; the stream keeps them as they are, named for Athena.
        "CompressionFormat": "UNCOMPRESSED",
        "FileExtension": ".json.gz",
        "BucketARN": getatt("JournalBucket"),
    }
    for key, value in expected.items():
        if destination.get(key) != value:
            problems.append(f"{stream}: {key} is {destination.get(key)}, expected {value}")
    if "DynamicPartitioningConfiguration" in destination or "ErrorOutputPrefix" in destination:
        problems.append(f"{stream}: expected the stream's own hour prefix, no dynamic partitioning")
    role = destination.get("RoleARN", {}).get("Fn::GetAtt", ["?"])[0]
    statements = [
        s
        for p in resources[role]["Properties"]["Policies"]
        for s in p["PolicyDocument"]["Statement"]
    ] if role in resources else []
    writes = [s for s in statements if "s3:PutObject" in s["Action"]]
    if writes != [s for s in statements if s["Resource"] != getatt("JournalBucket")] or len(writes) != 1:
        problems.append(f"{role}: expected one write statement, got {statements}")
    elif writes[0]["Resource"] != {"Fn::Sub": f"${{JournalBucket.Arn}}/{role_prefix}*"}:
        problems.append(f"{role}: writes to {writes[0]['Resource']}, expected only {role_prefix}")
    return problems


def journal_problems(resources):
    """#35: the journal's stream and the archive's, one per retention class (stream_problems);
    the journal's objects expire after JournalRetentionDays, each class's after its days, and
    archives written before classes (archive/YYYY/...) after ArchiveRetentionDays; no rule of
    one class reaches another's objects."""
    problems = stream_problems(
        resources, "JournalStream", "journal/", ["DeliverFunction", "DeadLetterFunction"], "GRIDRELAY_JOURNAL_STREAM"
    )
    streams_env = {"Fn::Sub": ",".join(f"{days}=${{{stream}}}" for days, stream in ARCHIVE_STREAMS)}
    for days, stream in ARCHIVE_STREAMS:
        problems += stream_problems(
            resources, stream, f"archive/{days}d/", ["IngestFunction"], "GRIDRELAY_ARCHIVE_STREAMS",
            env_value=streams_env, role_prefix="archive/",
        )
    rules = resources["JournalBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    expiring = [(r.get("Prefix"), r.get("ExpirationInDays")) for r in rules if "ExpirationInDays" in r]
    expected = [("journal/", {"Ref": "JournalRetentionDays"}), ("archive/2", {"Ref": "ArchiveRetentionDays"})]
    # A day past the class: a read at the edge of a topic's retention, or a replay that takes
    # a while, still finds its events (shared::archive::class_expiry_days).
    expected += [(f"archive/{days}d/", days + 1) for days, _ in ARCHIVE_STREAMS]
    if sorted(map(repr, expiring)) != sorted(map(repr, expected)):
        problems.append(f"JournalBucket: expected rules expiring {expected}, got {expiring}")
    prefixes = [prefix for prefix, _ in expected]
    for prefix in prefixes:
        if any(other != prefix and other.startswith(prefix) for other in prefixes):
            problems.append(f"JournalBucket: the rule for {prefix} reaches another's objects")
    return problems


def archive_output_problems(outputs):
    """#35: ArchiveStreamNames names each class's stream as ingest reads them."""
    expected = {"Fn::Sub": ",".join(f"{days}=${{{stream}}}" for days, stream in ARCHIVE_STREAMS)}
    got = outputs.get("ArchiveStreamNames", {}).get("Value")
    return [] if got == expected else [f"ArchiveStreamNames output is {got}, expected {expected}"]


def replay_problems(resources):
    """#35: deliver runs replays' steps against the replays' table and the archive in the
    journal's bucket, named to it; it may list the bucket under archive/ only."""
    problems = []
    env = resources["DeliverFunction"]["Properties"].get("Environment", {}).get("Variables", {})
    for name, value in [
        ("GRIDRELAY_REPLAYS_TABLE", {"Ref": "ReplaysTable"}),
        ("GRIDRELAY_JOURNAL_BUCKET", {"Ref": "JournalBucket"}),
    ]:
        if env.get(name) != value:
            problems.append(f"DeliverFunction: {name} is {env.get(name)}, expected {value}")
    problems += listing_problems(resources, "DeliverFunction", "archive/")
    keys = [k["AttributeName"] for k in resources["ReplaysTable"]["Properties"]["KeySchema"]]
    if keys != ["topic", "name"]:
        problems.append(f"ReplaysTable: keys {keys}, expected topic and name")
    return problems


def listing_problems(resources, function, *prefixes):
    """`function` may list the journal's bucket under `prefixes` only."""
    # After the transform, the function's policies are its role's.
    statements = [
        s
        for p in resources[function + "Role"]["Properties"].get("Policies", [])
        for s in p["PolicyDocument"]["Statement"]
        if isinstance(s, dict)
    ]
    lists = [s for s in statements if s.get("Action") == "s3:ListBucket" and s.get("Resource") == getatt("JournalBucket")]
    allowed = [prefix + "*" for prefix in prefixes]
    condition = {"StringLike": {"s3:prefix": allowed[0] if len(allowed) == 1 else allowed}}
    if len(lists) != 1 or lists[0].get("Condition") != condition:
        return [f"{function}: s3:ListBucket on the journal's bucket must be limited to {', '.join(prefixes)}: {lists}"]
    return []


# #36: the delivery state items the portal writes: its test events' claims of their windows,
# and its dropped events' sent again.
PORTAL_CLAIMS = ["claim#portal-test#*", "claim#portal-again#*"]


def leading_keys_problems(resources, function, action, keys):
    """`function`'s one statement granting `action` on the delivery state table is limited to
    the items whose keys match `keys`."""
    statements = [
        s
        for p in resources[f"{function}Role"]["Properties"].get("Policies", [])
        for s in p["PolicyDocument"]["Statement"]
        if isinstance(s, dict) and s.get("Resource") == getatt("DeliveryStateTable") and action in str(s.get("Action"))
    ]
    only = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": keys}}
    if len(statements) != 1 or statements[0].get("Condition") != only:
        return [f"{function}: {action} on the delivery state table must be limited to {keys}: {statements}"]
    return []


# #36: the portal's routes on the front door, to the portal function, and no others to it.
PORTAL_ROUTES = {
    "/portal/{topic}/{name}": ["get"],
    "/portal/gridrelay.css": ["get"],
    "/portal/{topic}/{name}/test-event": ["post"],
    "/portal/{topic}/{name}/send-again": ["post"],
    "/portal/{topic}/{name}/signing-secret": ["post"],
}


def route_problems(resources, function, expected):
    """The HTTP API's routes (its OpenAPI body's paths and methods) to `function` are
    `expected`, no more and no fewer."""
    paths = resources["PublishApi"]["Properties"]["Body"]["paths"]
    routed = {
        path: sorted(methods)
        for path, methods in paths.items()
        if any(f"${{{function}.Arn}}" in str(m) for m in methods.values())
    }
    if routed != expected:
        return [f"PublishApi: routes to {function} are {routed}, expected {expected}"]
    return []


def portal_problems(resources, outputs):
    """#36: the portal is told of its generated key and the journal's bucket, lists that bucket
    under journal/ and archive/ only, answers its five routes of the front door (GET its pages, POST their
    forms), and the stack names its key's secret and its pages' URL."""
    problems = generated_key_problems(resources, "PortalKey")
    env = resources["PortalFunction"]["Properties"].get("Environment", {}).get("Variables", {})
    for name, value in [
        ("GRIDRELAY_PORTAL_KEY_SECRET", PORTAL_KEY),
        ("GRIDRELAY_JOURNAL_BUCKET", {"Ref": "JournalBucket"}),
    ]:
        if env.get(name) != value:
            problems.append(f"PortalFunction: {name} is {env.get(name)}, expected {value}")
    problems += listing_problems(resources, "PortalFunction", "journal/", "archive/")
    problems += leading_keys_problems(resources, "PortalFunction", "PutItem", PORTAL_CLAIMS)
    problems += route_problems(resources, "PortalFunction", PORTAL_ROUTES)
    if outputs.get("PortalKeySecret", {}).get("Value") != PORTAL_KEY:
        problems.append(f"Outputs: PortalKeySecret is {outputs.get('PortalKeySecret')}")
    if "/portal" not in str(outputs.get("PortalUrl", {}).get("Value")):
        problems.append(f"Outputs: PortalUrl is {outputs.get('PortalUrl')}")
    return problems


# #38: the routes of the HTTP API front door, by function: ingest's two, the portal's five.
INGEST_ROUTES = {"/topics/{topic}/api/events": ["post"], "/subscriptions/validate": ["get"]}


def front_door_problems(resources, conditions, outputs, source_parameters):
    """#38: PublishFrontDoor picks the front door, HttpApi by default. With HttpApi, the API, its
    stage and an apigateway.amazonaws.com permission per route (on that route only) exist, and
    nothing public; with FunctionUrl, ingest and the portal each get a function URL with no
    auth and the two permissions a public URL needs (lambda:InvokeFunctionUrl with
    FunctionUrlAuthType NONE, and lambda:InvokeFunction with InvokedViaFunctionUrl, both for
    principal *: linters do not catch a missing second one, and every request is then
    refused), and no other resource grants anything to *. The outputs, and deliver's validation
    URLs, follow the choice."""
    problems = []
    parameter = source_parameters.get("PublishFrontDoor", {})
    if parameter.get("Default") != "HttpApi" or parameter.get("AllowedValues") != ["HttpApi", "FunctionUrl"]:
        problems.append(f"PublishFrontDoor: expected HttpApi (default) or FunctionUrl, got {parameter}")
    for name, value in {"UseHttpApi": "HttpApi", "UseFunctionUrl": "FunctionUrl"}.items():
        if conditions.get(name) != {"Fn::Equals": [{"Ref": "PublishFrontDoor"}, value]}:
            problems.append(f"Conditions: {name} is {conditions.get(name)}")
    for name in ["PublishApi", "PublishApiApiGatewayDefaultStage"]:
        if resources.get(name, {}).get("Condition") != "UseHttpApi":
            problems.append(f"{name}: expected only with UseHttpApi, got {resources.get(name, {}).get('Condition')}")
    problems += route_problems(resources, "IngestFunction", INGEST_ROUTES)
    permissions = {k: r for k, r in resources.items() if r["Type"] == "AWS::Lambda::Permission"}
    for function, routes in [("IngestFunction", INGEST_ROUTES), ("PortalFunction", PORTAL_ROUTES)]:
        api = sorted(
            str(r["Properties"]["SourceArn"]["Fn::Sub"]).split("${PublishApi}/*/")[-1]
            for r in permissions.values()
            if r["Properties"]["FunctionName"] == {"Ref": function}
            and r["Properties"]["Principal"] == "apigateway.amazonaws.com"
            and r.get("Condition") == "UseHttpApi"
        )
        expected = sorted(
            f"{method.upper()}{path.replace('{topic}', '*').replace('{name}', '*')}"
            for path, methods in routes.items()
            for method in methods
        )
        if api != expected:
            problems.append(f"{function}: API Gateway may invoke it on {api}, expected {expected}")
        url = resources.get(function + "Url", {})
        props = url.get("Properties", {})
        if (url.get("Type"), url.get("Condition"), props.get("AuthType"), props.get("TargetFunctionArn")) != (
            "AWS::Lambda::Url", "UseFunctionUrl", "NONE", getatt(function)
        ):
            problems.append(f"{function}Url: expected a public function URL only with UseFunctionUrl, got {url}")
        public = sorted(
            (r["Properties"]["Action"], r["Properties"].get("FunctionUrlAuthType"), r["Properties"].get("InvokedViaFunctionUrl"))
            for r in permissions.values()
            if r["Properties"]["FunctionName"] == {"Ref": function} and r["Properties"]["Principal"] == "*"
            and r.get("Condition") == "UseFunctionUrl"
        )
        needed = [("lambda:InvokeFunction", None, True), ("lambda:InvokeFunctionUrl", "NONE", None)]
        if public != needed:
            problems.append(f"{function}: its function URL's permissions for * are {public}, expected {needed}")
    for name, r in permissions.items():
        if r["Properties"]["Principal"] == "*" and r.get("Condition") != "UseFunctionUrl":
            problems.append(f"{name}: grants * outside the function URL front door")
    env = resources["DeliverFunction"]["Properties"].get("Environment", {}).get("Variables", {})
    for name, value, url in [
        ("DeliverFunction GRIDRELAY_PUBLIC_URL", env.get("GRIDRELAY_PUBLIC_URL"), "IngestFunctionUrl"),
        ("Outputs PublishUrl", outputs.get("PublishUrl", {}).get("Value"), "IngestFunctionUrl"),
        ("Outputs PortalUrl", outputs.get("PortalUrl", {}).get("Value"), "PortalFunctionUrl"),
    ]:
        chosen = (value or {}).get("Fn::If", [None, None, None])
        if chosen[0] != "UseFunctionUrl" or url not in str(chosen[1]) or "PublishApi" not in str(chosen[2]):
            problems.append(f"{name}: expected {url}'s with UseFunctionUrl, else the API's: {value}")
    return problems


def main():
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "template.yaml"
    source = yaml_parse(path.read_text())
    for resource in source["Resources"].values():
        if resource["Type"] == "AWS::Serverless::Function":
            # What `sam package` does: code locations become S3 objects.
            resource["Properties"]["CodeUri"] = "s3://packaged/code.zip"
    defaults = {name: p["Default"] for name, p in source["Parameters"].items() if "Default" in p}
    source_parameters = dict(source["Parameters"])
    globals_env = dict(source.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {}))
    template = transform(source, {}, ManagedPolicies())
    resources = template["Resources"]
    conditions = template.get("Conditions", {})
    problems = []
    for function, expected in EXPECTED.items():
        role = resources[function + "Role"]["Properties"]
        managed = [a.split("/")[-1] for a in role.get("ManagedPolicyArns", [])]
        if managed != ["AWSLambdaBasicExecutionRole"]:
            problems.append(f"{function}: managed policies {managed}, expected only AWSLambdaBasicExecutionRole")
        granted = {}
        for policy in role.get("Policies", []):
            for statement in policy["PolicyDocument"]["Statement"]:
                if "Fn::If" in statement:
                    # Only the destinations statement is conditional, and only on there being
                    # destinations: granted when they are named, nothing otherwise.
                    condition, granted_if, otherwise = statement["Fn::If"]
                    if condition != DESTINATIONS_CONDITION or otherwise != {"Ref": "AWS::NoValue"}:
                        problems.append(f"{function}: unexpected conditional statement {statement}")
                        continue
                    if granted_if.get("Resource") != DESTINATIONS:
                        problems.append(f"{function}: destinations statement on {granted_if.get('Resource')}")
                    statement = granted_if
                if statement.get("Effect") != "Allow":
                    continue
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                targets = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                for action in actions:
                    granted.setdefault(action, []).extend(targets)
        if granted != expected:
            problems.append(f"{function}: granted {granted}\n  expected {expected}")
    mappings = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::EventSourceMapping"]
    if len(mappings) != len(CAPPED_SOURCES) or any(m.get("FunctionResponseTypes") != ["ReportBatchItemFailures"] for m in mappings):
        problems.append(f"expected {len(CAPPED_SOURCES)} SQS mappings with ReportBatchItemFailures, got {mappings}")
    problems += concurrency_problems(resources, defaults)
    problems += metric_problems(resources)
    problems += queue_key_problems(resources)
    problems += lane_queue_problems(resources, template.get("Outputs", {}))
    problems += ordered_queue_problems(resources, template.get("Outputs", {}), globals_env)
    problems += journal_problems(resources)
    problems += archive_output_problems(template.get("Outputs", {}))
    problems += replay_problems(resources)
    problems += portal_problems(resources, template.get("Outputs", {}))
    # P1: ingest reads and marks accepted event ids, and no other item of the table.
    for action in ["BatchGetItem", "BatchWriteItem"]:
        problems += leading_keys_problems(resources, "IngestFunction", action, ["dedup#*"])
    problems += front_door_problems(resources, conditions, template.get("Outputs", {}), source_parameters)
    if problems:
        print("SAM template check failed:\n" + "\n".join(problems), file=sys.stderr)
        sys.exit(1)
    print(
        f"SAM roles hold exactly the expected permissions ({sum(map(len, EXPECTED.values()))} grants, {len(EXPECTED)} roles); "
        f"deliver at most {defaults['DeliverMaximumConcurrency']} on each of the delivery and ordered queues "
        f"(control queue {CAPPED_SOURCES['ControlQueue'][1]}, "
        f"replay queue {defaults['ReplayMaximumConcurrency']}) and dead-letter at most "
        f"{defaults['DeadLetterMaximumConcurrency']} invocations at once; {defaults['Architecture']}"
    )


main()
