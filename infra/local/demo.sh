#!/usr/bin/env bash
# `make demo`: the whole system on this machine, against moto.
#
# Starts moto (installed into .venv), `gridrelay local` and a sample subscriber; creates a topic
# with three webhook subscriptions and one to an SQS queue; publishes one event; and shows it
# delivered to the first, retried then delivered to the second, dead-lettered into S3 for the
# third, and written to the queue as a message with routing attributes; ends with the event's life
# as the delivery journal has it (`gridrelay event show`), and what the topic archived
# (`gridrelay archive list`), sent again to one subscription (`gridrelay replay start`), and the
# operator console's overview showing the third failing (DEMO_HOLD=1 keeps it all running). Waits run 100 times
# faster than real (GRIDRELAY_TIME_SCALE=0.01): the 5-minute dead-letter delay takes 3 seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export MOTO_PORT="${MOTO_PORT:-5055}"
port="${DEMO_PORT:-7071}"
hook_port="${DEMO_SUBSCRIBER_PORT:-7081}"
export GRIDRELAY_TIME_SCALE="${GRIDRELAY_TIME_SCALE:-0.01}"
export GRIDRELAY_PUBLISH_URL="http://127.0.0.1:$port"
mkdir -p .run
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Building gridrelay"
cargo build --quiet -p gridrelay-cli
gridrelay="$root/target/debug/gridrelay"

step "Starting the AWS emulator (moto) on 127.0.0.1:$MOTO_PORT"
infra/local/moto.sh start
eval "$(infra/local/moto.sh env)"

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  infra/local/moto.sh stop
}
trap cleanup EXIT

step "Starting the sample subscriber on 127.0.0.1:$hook_port"
python3 infra/local/demo_subscriber.py "$hook_port" &
pids+=($!)

step "Starting gridrelay local (publish API on 127.0.0.1:$port, time scale $GRIDRELAY_TIME_SCALE)"
RUST_LOG="${RUST_LOG:-warn}" "$gridrelay" local --listen "127.0.0.1:$port" >.run/local.json 2>.run/local.log &
pids+=($!)
for _ in $(seq 1 100); do [[ -s .run/local.json ]] && break; sleep 0.2; done
[[ -s .run/local.json ]] || { cat .run/local.log >&2; exit 1; }
cat .run/local.json

topic="demo-$(date +%s)"
step "gridrelay topic create --name $topic --retention-days 1"
"$gridrelay" topic create --name "$topic" --retention-days 1 | tee .run/topic.json
key=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["key1"])' .run/topic.json)

step "Three event subscriptions: happy, flaky (503 once), broken (400, dead-lettered)"
"$gridrelay" event-subscription create --topic-name "$topic" --name happy --endpoint "http://127.0.0.1:$hook_port/happy" \
  --delivery-attribute-mapping X-Demo static hello \
  --delivery-attribute-mapping Authorization static "Bearer demo-secret" secret >/dev/null
"$gridrelay" event-subscription create --topic-name "$topic" --name flaky --endpoint "http://127.0.0.1:$hook_port/flaky" >/dev/null
"$gridrelay" event-subscription create --topic-name "$topic" --name broken --endpoint "http://127.0.0.1:$hook_port/broken" \
  --deadletter-endpoint s3://gridrelay-dead-letters/demo >/dev/null
"$gridrelay" event-subscription create --topic-name gridrelay-dead-letter-events --name "notices-$topic" \
  --endpoint "http://127.0.0.1:$hook_port/notices" --subject-begins-with "/buckets/gridrelay-dead-letters/objects/demo/$topic/" >/dev/null
echo "  and notices-$topic on the system topic gridrelay-dead-letter-events (dead-letter announcements)"

step "An AWS resource as the destination: an SQS queue (no handshake; it must exist)"
queue_arn=$("$root/.venv/bin/python" -c '
import boto3, os, sys
sqs = boto3.client("sqs", region_name=os.environ.get("AWS_REGION", "us-east-1"))
url = sqs.create_queue(QueueName=sys.argv[1])["QueueUrl"]
print(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])
' "$topic-in")
"$gridrelay" event-subscription create --topic-name "$topic" --name to-queue --endpoint-type sqs --endpoint "$queue_arn" >/dev/null
echo "  to-queue -> $queue_arn"

step "Endpoint validation handshake (run by the service; events flow once Succeeded)"
for sub in "$topic/happy" "$topic/flaky" "$topic/broken" "gridrelay-dead-letter-events/notices-$topic"; do
  for _ in $(seq 1 100); do
    state=$("$gridrelay" event-subscription show --topic-name "${sub%%/*}" --name "${sub#*/}" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["provisioningState"])')
    [[ "$state" == Succeeded || "$state" == Failed ]] && break
    sleep 0.2
  done
  echo "  $sub: $state"
  [[ "$state" == Succeeded ]] || { echo "validation did not succeed; see .run/local.log" >&2; exit 1; }
done
"$gridrelay" event-subscription list --topic-name "$topic" | python3 -c '
import json, sys
for s in json.load(sys.stdin):
    dl = (s.get("deadLetterDestination") or {}).get("bucket", "none")
    d = s["destination"]
    print(f"  {s['"'"'name'"'"']:<8} -> {d['"'"'endpointType'"'"']} {d.get('"'"'endpointUrl'"'"') or d.get('"'"'resourceId'"'"')}  dead-letter bucket: {dl}")
'

step "Publishing one event (Event Grid's publish protocol)"
event='[{"id":"order-1","subject":"/orders/1","eventType":"Contoso.Orders.Created","eventTime":"2026-11-22T03:00:00Z","dataVersion":"1.0","data":{"order":1,"total":42.5}}]'
echo "curl -X POST $GRIDRELAY_PUBLISH_URL/topics/$topic/api/events?api-version=2018-01-01 -H 'aeg-sas-key: …'"
status=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$GRIDRELAY_PUBLISH_URL/topics/$topic/api/events?api-version=2018-01-01" \
  -H "aeg-sas-key: $key" -H 'content-type: application/json' -d "$event")
echo "publish answered $status"

step "Deliveries (the subscriber's log)"
"$root/.venv/bin/python" - "$topic" <<'PY'
import json, os, sys, time
import boto3
topic = sys.argv[1]
s3 = boto3.client("s3")
deadline = time.time() + 60
while time.time() < deadline:
    listed = s3.list_objects_v2(Bucket="gridrelay-dead-letters", Prefix=f"demo/{topic}/")
    if listed.get("KeyCount", 0):
        break
    time.sleep(0.5)
else:
    sys.exit("no dead-letter object appeared within 60 s; see .run/local.log")
key = listed["Contents"][0]["Key"]
body = json.loads(s3.get_object(Bucket="gridrelay-dead-letters", Key=key)["Body"].read())
print(f"\n\033[1m== Dead-lettered into s3://gridrelay-dead-letters/{key}\033[0m")
print(json.dumps(body, indent=2))

sqs = boto3.client("sqs", region_name=os.environ.get("AWS_REGION", "us-east-1"))
url = sqs.get_queue_url(QueueName=f"{topic}-in")["QueueUrl"]
messages = []
while time.time() < deadline and not messages:
    messages = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], WaitTimeSeconds=1).get("Messages", [])
if not messages:
    sys.exit("no message reached the SQS queue within 60 s; see .run/local.log")
m = messages[0]
print(f"\n\033[1m== Written to the SQS queue {topic}-in\033[0m")
print(json.dumps({"body": json.loads(m["Body"]),
                  "messageAttributes": {k: v["StringValue"] for k, v in m.get("MessageAttributes", {}).items()}}, indent=2))
PY

step "The event's life, as the delivery journal has it (#35)"
echo "$gridrelay event show --topic-name $topic --event-id order-1 -o table"
# The dead-letter write is journaled as its invocation ends, just after the object appears.
for _ in $(seq 1 50); do
  life=$("$gridrelay" event show --topic-name "$topic" --event-id order-1 -o table 2>&1 || true)
  grep -q "dead-lettered to" <<<"$life" && break
  sleep 0.2
done
echo "$life"
grep -q "dead-lettered to" <<<"$life" || { echo "the journal does not show the dead-letter write; see .run/local.log" >&2; exit 1; }

step "What the topic archived, for replays (#35)"
echo "$gridrelay archive list --topic-name $topic --start-time 1h -o table"
"$gridrelay" archive list --topic-name "$topic" --start-time 1h -o table | tee .run/archive.txt
grep -q "order-1" .run/archive.txt || { echo "the archive does not hold the event; see .run/local.log" >&2; exit 1; }

step "Replaying the last hour to happy (#35): run in the stack, paced, marked gridrelay-replay"
echo "$gridrelay replay start --topic-name $topic --name demo-replay --start-time 1h --subscription happy"
"$gridrelay" replay start --topic-name "$topic" --name demo-replay --start-time 1h --subscription happy -o table
# It starts once the window is surely all archived (20 s past its end here), then sends.
for _ in $(seq 1 60); do
  shown=$("$gridrelay" replay show --topic-name "$topic" --name demo-replay -o table)
  grep -q Completed <<<"$shown" && break
  sleep 1
done
echo "$shown"
grep -q Completed <<<"$shown" || { echo "the replay did not complete; see .run/local.log" >&2; exit 1; }
for _ in $(seq 1 50); do
  life=$("$gridrelay" event show --topic-name "$topic" --event-id order-1 -o table 2>&1 || true)
  grep -q "replayed by demo-replay" <<<"$life" && break
  sleep 0.2
done
grep "replayed by demo-replay" -A1 <<<"$life" || { echo "the journal does not show the replay; see .run/local.log" >&2; exit 1; }

step "The operator console (#36): what the overview shows of broken"
console=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["console"] or "")' .run/local.json)
[[ -n "$console" ]] || { echo "gridrelay local started no console (port 7072 taken? see .run/local.log)" >&2; exit 1; }
{
  echo "open $console"
  # The URL's token is exchanged for the console's cookie, as a browser does.
  curl -sf -c .run/console.cookies -o /dev/null "$console"
  base=${console%%/\?token=*}
  for _ in $(seq 1 50); do
    curl -sf -b .run/console.cookies "$base/" >.run/console.html || true
    python3 - .run/console.html <<'PY' && break
import re, sys
page = open(sys.argv[1]).read()
row = re.search(r'>broken</a>.*?</tr>', page, re.S)
sys.exit(0 if row and 'Failing' in row.group(0) and '<strong>400</strong>' in row.group(0) else 1)
PY
    sleep 0.2
    false
  done || { echo "the console does not show broken failing; see .run/console.html" >&2; exit 1; }
  echo "the overview shows broken as Failing, its last answer 400 (.run/console.html)"
}
if [[ -n "${DEMO_HOLD:-}" ]]; then
  echo "DEMO_HOLD is set: the system and its console run until you press Ctrl-C"
  while sleep 3600; do :; done
fi

sleep 1
step "Summary"
echo "happy:  delivered on the first attempt"
echo "flaky:  503, retried after the (scaled) 30 s minimum, then delivered"
echo "broken: 400 is not retried; dead-lettered after the (scaled) 5-minute delay, with the L6 fields,"
echo "        and the write announced on the system topic gridrelay-dead-letter-events"
echo "to-queue: one SQS message per event, its type, subject and id as message attributes"
echo "journal: every attempt and where each copy stands, from gridrelay event show"
echo "archive: the topic keeps what it accepted for a day (--retention-days 1): gridrelay archive list"
echo "replay:  the last hour sent again to happy, with a gridrelay-replay header: gridrelay replay start"
echo "console: every subscription at a glance, attempts, dead letters and events in a browser;"
echo "         DEMO_HOLD=1 make demo keeps it running to look at"
echo "Logs: .run/local.log   Stopping."
