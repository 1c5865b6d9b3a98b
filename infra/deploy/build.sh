#!/usr/bin/env bash
# Builds the four Lambda functions as `bootstrap` binaries (provided.al2023) with cargo-lambda
# (zig as the linker, no Docker; `make test` links with cargo's own, CARGO_LAMBDA_COMPILER=cargo,
# see infra/local/shared-build.sh): target/lambda/<function>/bootstrap, for this machine's
# processor (x86_64), so the tests can run them under an emulated Runtime API. The stacks deploy
# arm64 by default: `sam build` and `cdk synth` build those themselves (check.sh runs the latter).
# BUILD_PROFILE: release (the default: what deploys, and what the benchmarks measure) or dev (what
# `make test` builds: the same code unoptimised, 175 s instead of 497 s from a fresh clone).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
eval "$(infra/deploy/tools.sh)"
# One cargo invocation for the four, so their crates compile and link side by side (from a fresh
# clone on 2 cores: 417 s, against 459 s for three builds one after another). The stacks' own
# builds of one function each (`cdk synth`) find everything built.
functions=(gridrelay-ingest gridrelay-deliver gridrelay-dead-letter gridrelay-portal)
profile="${BUILD_PROFILE:-release}"
case "$profile" in
  release | dev) ;;
  *) echo "BUILD_PROFILE is '$profile'; allowed: release, dev" >&2; exit 2 ;;
esac
cargo lambda build --profile "$profile" --x86-64 --locked "${functions[@]/#/--bin=}"
for f in "${functions[@]}"; do
  ls -l "target/lambda/$f/bootstrap" >&2
done
