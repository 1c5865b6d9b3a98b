#!/usr/bin/env bash
# `make bench`: every benchmark, in one run, each figure beside its baseline from the same run
# (these machines are noisy: only ratios carry from one run to another). About 13 minutes on 2
# cores with incremental release builds; docs/performance.md quotes a run.
#   - hot path: per-event CPU work of publish parsing, batching and rendering, without I/O
#   - engine: the deliver handler over in-memory ports against a loopback sink, beside wrk's
#     ceiling on the same sink (installs wrk from Debian if it is missing)
#   - end to end: `gridrelay local` on moto, subscribers answering at once and after 50 ms,
#     unbatched and batched, and the old 32 requests per invocation as the baseline; AWS calls
#     counted by a proxy in front of moto; then the cost per million events on AWS
#   - cold start: each function's bootstrap (infra/deploy/build.sh) under an emulated Lambda
#     Runtime API: init time beside a bare process start, size, deliver's memory for a full batch
#   - latency: publish to first attempt at 1,000 events/s, with where the time goes; then the
#     same beside 100,000 events held for a delayed endpoint, and beside a replay (#35) of
#     30,000 archived events at its default rate (100 a second) and of 100,000 at 1,000 a
#     second, on LocalStack's SQS (installs it into .venv-localstack with
#     infra/local/localstack.sh)
#   - memory size: deliver's billed time per warm batch under the CPU share Lambda gives each
#     memory size (a cgroup CPU quota; needs root), priced per million events
#   - console: the operator console's overview (#36) with 1 and with 500 subscriptions, each
#     with an hour of journal, on moto
#   - ordered delivery (O1, #39): one key and 100 keys beside unordered, and one publish of
#     1,000 events to an ordered subscription beside an unordered one, on LocalStack's SQS
#   - batch size: deliver's billed time per warm invocation of 1 to 1,000 messages at 256 MB's
#     CPU share, priced per million events (why the event source hands 10 with no window)
# Sizes: BENCH_ENGINE_EVENTS, BENCH_E2E_EVENTS, BENCH_COST_EVENTS (environment).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export MOTO_PORT="${MOTO_PORT:-5058}"
engine_events="${BENCH_ENGINE_EVENTS:-50000}"
e2e_events="${BENCH_E2E_EVENTS:-100000}"
cost_events="${BENCH_COST_EVENTS:-20000}"

if ! command -v wrk >/dev/null; then
  echo "installing wrk (the engine benchmark's loopback ceiling)" >&2
  if [[ $(id -u) -eq 0 ]]; then apt-get install -y -qq wrk >/dev/null
  else sudo apt-get install -y -qq wrk >/dev/null; fi
fi

printf '\n== machine\n'
echo "$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GB", $2/1048576}' /proc/meminfo), $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"

printf '\n== hot path (per-event CPU work)\n'
mkdir -p .run
quietly() { "$@" 2>.run/bench-build.log || { cat .run/bench-build.log >&2; exit 1; }; }
quietly cargo bench --locked -p gridrelay-shared --bench hot_path
quietly cargo build --release --locked -p gridrelay-bench -p gridrelay-cli
printf '\n== engine\n'
target/release/gridrelay-bench engine --events "$engine_events"

if [[ -z "${AWS_ENDPOINT_URL:-}" ]]; then
  trap 'infra/local/moto.sh stop' EXIT
  infra/local/moto.sh start >/dev/null
  eval "$(infra/local/moto.sh env)"
fi
printf '\n== cold start\n'
quietly bash infra/deploy/build.sh
target/release/gridrelay-bench cold-start

# First on a fresh emulator: moto's SQS slows with every queue and message it holds.
printf '\n== latency\n'
target/release/gridrelay-bench latency --gridrelay target/release/gridrelay

# #34 item 1: a healthy subscription beside 100,000 events held for a delayed endpoint. On
# LocalStack's SQS (DynamoDB on moto): moto's ReceiveMessage reads every message of the queue
# for each one it hands out, so the held messages alone slow it (docs/performance.md).
printf '\n== neighbour of a held backlog (SQS on LocalStack, DynamoDB on moto)\n'
if [[ "${AWS_ENDPOINT_URL:-}" == "http://127.0.0.1:$MOTO_PORT" ]]; then
  (
    trap 'infra/local/localstack.sh stop' EXIT
    infra/local/localstack.sh start
    eval "$(infra/local/localstack.sh env)"
    target/release/gridrelay-bench latency --gridrelay target/release/gridrelay --held 100000 --seconds 15
    printf '\n== neighbour of a replay (#35; SQS on LocalStack, DynamoDB on moto)\n'
    target/release/gridrelay-bench latency --gridrelay target/release/gridrelay --replay 30000 --replay-rate 100
    printf '\n== neighbour of a fast replay, on the replay queue (#35)\n'
    target/release/gridrelay-bench latency --gridrelay target/release/gridrelay --replay 100000 --replay-rate 1000
    # O1 (#39): on LocalStack's SQS too: moto's FIFO SendMessageBatch takes about five times
    # its standard one (270 ms against 55 ms for ten messages, here), LocalStack's the same.
    printf '\n== ordered delivery (O1; SQS on LocalStack, DynamoDB on moto)\n'
    target/release/gridrelay-bench ordered --gridrelay target/release/gridrelay
  )
else
  target/release/gridrelay-bench latency --gridrelay target/release/gridrelay --held 100000 --seconds 15
  printf '\n== neighbour of a replay (#35)\n'
  target/release/gridrelay-bench latency --gridrelay target/release/gridrelay --replay 30000 --replay-rate 100
  printf '\n== ordered delivery (O1)\n'
  target/release/gridrelay-bench ordered --gridrelay target/release/gridrelay
fi

# #36: the console's overview with 1 and with 500 subscriptions, an hour of journal each.
printf '\n== console\n'
target/release/gridrelay-bench console --gridrelay target/release/gridrelay

printf '\n== end to end\n'
target/release/gridrelay-bench e2e --events "$e2e_events" --cost-events "$cost_events" \
  --gridrelay target/release/gridrelay

printf '\n== memory size\n'
target/release/gridrelay-bench memory-size

printf '\n== batch size\n'
target/release/gridrelay-bench batch-size
