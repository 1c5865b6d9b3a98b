#!/usr/bin/env bash
# `make test`: installs the emulator into .venv, starts it on a port of its own, runs the
# format and lint checks and every test against it, and stops it again.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export MOTO_PORT="${MOTO_PORT:-5056}"

command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 is required for the moto emulator" >&2; exit 1; }

if [[ -z "${AWS_ENDPOINT_URL:-}" ]]; then
  trap 'infra/local/moto.sh stop' EXIT
  infra/local/moto.sh start
  eval "$(infra/local/moto.sh env)"
else
  echo "using the AWS API at $AWS_ENDPOINT_URL" >&2
fi

echo "== format and lint" >&2
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== tests (unit, property, end-to-end)" >&2
cargo test --workspace --locked
