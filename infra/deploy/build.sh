#!/usr/bin/env bash
# Builds the three Lambda functions as `bootstrap` binaries (provided.al2023) with cargo-lambda
# (zig as the linker, no Docker): target/lambda/<function>/bootstrap, for this machine's
# processor (x86_64), so the tests can run them under an emulated Runtime API. The stacks deploy
# arm64 by default: `sam build` and `cdk synth` build those themselves (check.sh runs the latter).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
eval "$(infra/deploy/tools.sh)"
for f in gridrelay-ingest gridrelay-deliver gridrelay-dead-letter; do
  cargo lambda build --release --x86-64 --locked --bin "$f"
  ls -l "target/lambda/$f/bootstrap" >&2
done
