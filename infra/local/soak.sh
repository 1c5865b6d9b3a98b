#!/usr/bin/env bash
# `make soak`: the long runs of the life-cycle checks (release builds). On moto the chaos run is
# longer than a working session: moto slows as its state grows (docs/testing.md#the-long-runs).
#   - chaos: 100,000 events to four subscriptions whose subscribers fail ~30 % of requests, with
#     `gridrelay local` killed (SIGKILL) and restarted 5 times and 5 % of its AWS calls throttled;
#     prints lost (must be 0), duplicates and the time it took
#   - fuzz: a million inputs per strategy through publish parsing and fan-out
#   - the simulation with 20,000 seeds
#   - the deployment checks with the functions bundled for arm64 (`make test` bundles x86_64)
#   - the dependencies' licences, bans and sources against deny.toml (`make deny`)
# Sizes: CHAOS_EVENTS, CHAOS_KILLS, CHAOS_AWS_FAULTS, FUZZ_CASES, SIMULATION_SEEDS (environment);
# CHAOS_JOURNAL=0 runs without the delivery journal.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export MOTO_PORT="${MOTO_PORT:-5057}"
export CHAOS_EVENTS="${CHAOS_EVENTS:-100000}" CHAOS_KILLS="${CHAOS_KILLS:-5}"
export FUZZ_CASES="${FUZZ_CASES:-1000000}" SIMULATION_SEEDS="${SIMULATION_SEEDS:-20000}"
# A twentieth of the runner's SQS, DynamoDB, S3 and Secrets Manager calls throttled, and an
# eightieth failing with a 5xx, through the fault proxy (cli/tests/chaos.rs; also make test's).
export CHAOS_AWS_FAULTS="${CHAOS_AWS_FAULTS:-0.05}"
started=$(date +%s)
mkdir -p .run
section() { printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - started))" >&2; }

if [[ -z "${AWS_ENDPOINT_URL:-}" ]]; then
  trap 'infra/local/moto.sh stop' EXIT
  infra/local/moto.sh start
  eval "$(infra/local/moto.sh env)"
fi

section "chaos: $CHAOS_EVENTS events, $CHAOS_KILLS kills"
cargo test --release --locked -p gridrelay-cli --test chaos -- --nocapture 2>&1 | tee .run/soak-chaos.log | grep -E '^(chaos:|test |test result|lost)'

section "fuzz: $FUZZ_CASES inputs per strategy"
cargo test --release --locked -p gridrelay-ingest --test fuzz -- --nocapture --test-threads 1 2>&1 | grep -E '^(fuzz:|test |test result)'

section "simulation: $SIMULATION_SEEDS seeds"
cargo test --release --locked -p gridrelay-simulation -- --nocapture 2>&1 | grep -E '(seeds:|^model:|^test |^test result)'

section "deployment definitions, the functions bundled for arm64 (the stack's default; a cross build)"
CDK_ARCHITECTURE=arm64 infra/deploy/check.sh

section "dependencies: licences, bans and sources (deny.toml)"
infra/local/deny.sh

section "done"
