#!/usr/bin/env bash
# `make soak`: the long runs of the life-cycle checks (release builds). On moto the chaos run is
# longer than a working session: moto slows as its state grows (docs/testing.md#the-long-runs).
#   - chaos: 100,000 events to nine subscriptions (five webhooks whose subscribers fail ~30 % of
#     requests, four AWS resources), with 5 % of the runner's AWS calls throttled, in 20
#     segments of 5,000 events, each on a fresh moto (moto slows as its state grows), each
#     with `gridrelay local` killed (SIGKILL) and restarted twice; prints each segment's lost
#     (must be 0), duplicates and time, and their sum (docs/testing.md#the-long-runs)
#   - fuzz: a million inputs per strategy through publish parsing and fan-out
#   - the simulation with 20,000 seeds
#   - the deployment checks with the functions bundled for arm64 (`make test` bundles x86_64)
#   - the dependencies' licences, bans and sources against deny.toml (`make deny`)
# Sizes: CHAOS_EVENTS (all segments'), CHAOS_SEGMENTS, CHAOS_KILLS (each segment's),
# CHAOS_AWS_FAULTS, FUZZ_CASES, SIMULATION_SEEDS (environment); CHAOS_JOURNAL=0 runs without the
# delivery journal. The whole chaos run is longer than a working session: CHAOS_SEGMENTS_RUN=3-5
# runs only those segments, and SOAK_ONLY=chaos only the
# chaos run. CHAOS_SEED=N gives segment i the seed N+i-1, so a segment can be run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export MOTO_PORT="${MOTO_PORT:-5057}"
export CHAOS_EVENTS="${CHAOS_EVENTS:-100000}" CHAOS_KILLS="${CHAOS_KILLS:-2}"
CHAOS_SEGMENTS="${CHAOS_SEGMENTS:-20}"
CHAOS_SEGMENTS_RUN="${CHAOS_SEGMENTS_RUN:-1-$CHAOS_SEGMENTS}"
SOAK_ONLY="${SOAK_ONLY:-}"
export FUZZ_CASES="${FUZZ_CASES:-1000000}" SIMULATION_SEEDS="${SIMULATION_SEEDS:-20000}"
# A twentieth of the runner's SQS, DynamoDB, S3 and Secrets Manager calls throttled, and an
# eightieth failing with a 5xx, through the fault proxy (cli/tests/chaos.rs; also make test's).
export CHAOS_AWS_FAULTS="${CHAOS_AWS_FAULTS:-0.05}"
started=$(date +%s)
mkdir -p .run
section() { printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - started))" >&2; }

own_moto=
if [[ -z "${AWS_ENDPOINT_URL:-}" ]]; then
  own_moto=1
  trap 'infra/local/moto.sh stop' EXIT
  infra/local/moto.sh start
  eval "$(infra/local/moto.sh env)"
fi

first_segment=${CHAOS_SEGMENTS_RUN%-*} last_segment=${CHAOS_SEGMENTS_RUN#*-}
segment_events=$(( (CHAOS_EVENTS + CHAOS_SEGMENTS - 1) / CHAOS_SEGMENTS ))
section "chaos: segments $first_segment to $last_segment of $CHAOS_SEGMENTS, each $segment_events events and $CHAOS_KILLS kills"
cargo test --release --locked -p gridrelay-cli --test chaos --no-run 2>&1 | tail -1
: > .run/soak-chaos.log
failed_segments=()
for ((segment = first_segment; segment <= last_segment; segment++)); do
  section "chaos segment $segment of $CHAOS_SEGMENTS"
  if [[ -n "$own_moto" && $segment -gt $first_segment ]]; then
    # A fresh moto: its state (and its slowness) does not carry over.
    infra/local/moto.sh stop
    infra/local/moto.sh start
  fi
  seed=()
  [[ -n "${CHAOS_SEED:-}" ]] && seed=(CHAOS_SEED=$((CHAOS_SEED + segment - 1)))
  if ! env CHAOS_EVENTS="$segment_events" "${seed[@]}" \
    cargo test --release --locked -p gridrelay-cli --test chaos -- --nocapture 2>&1 \
    | tee -a .run/soak-chaos.log | grep -E '^(chaos:|test |test result|lost)'; then
    failed_segments+=("$segment")
  fi
done
python3 infra/local/soak_summary.py .run/soak-chaos.log
if ((${#failed_segments[@]})); then
  echo "chaos segments that failed: ${failed_segments[*]} (.run/soak-chaos.log)" >&2
  exit 1
fi
[[ "$SOAK_ONLY" == chaos ]] && { section "done"; exit 0; }

section "fuzz: $FUZZ_CASES inputs per strategy"
cargo test --release --locked -p gridrelay-ingest --test fuzz -- --nocapture --test-threads 1 2>&1 | grep -E '^(fuzz:|test |test result)'

section "simulation: $SIMULATION_SEEDS seeds"
cargo test --release --locked -p gridrelay-simulation -- --nocapture 2>&1 | grep -E '(seeds:|^model:|^test |^test result)'

section "deployment definitions, the functions bundled for arm64 (the stack's default; a cross build)"
CDK_ARCHITECTURE=arm64 infra/deploy/check.sh

section "dependencies: licences, bans and sources (deny.toml)"
infra/local/deny.sh

section "done"
