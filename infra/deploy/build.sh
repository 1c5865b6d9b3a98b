#!/usr/bin/env bash
# Builds the three Lambda functions as deployable `bootstrap` binaries (x86_64, provided.al2023)
# with cargo-lambda (zig as the linker, no Docker): target/lambda/<function>/bootstrap.
# One binary at a time, with the flags cargo-lambda-cdk uses, so `cdk synth` reuses the build.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
eval "$(infra/deploy/tools.sh)"
for f in gridrelay-ingest gridrelay-deliver gridrelay-dead-letter; do
  cargo lambda build --release --x86-64 --locked --bin "$f"
  ls -l "target/lambda/$f/bootstrap" >&2
done
