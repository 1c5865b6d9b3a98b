#!/usr/bin/env bash
# `make test`: installs what the tests need from the project's own files, then runs every check:
#   - moto (the AWS emulator) and azure-eventgrid into .venv, started on a port of its own
#   - Debian's Chromium and ChromeDriver, and axe-core, for the console's browser tests
#   - format and lint (cargo fmt, cargo clippy -D warnings), no I/O crate in the rules crate's
#     or the ports crate's dependencies, and one set of features for the functions' and the
#     tests' builds (workspace-hack/)
#   - the deployable functions (cargo lambda build, dev profile; tools into .venv-deploy)
#   - the deployment definitions (cfn-lint, sam validate --lint, CDK tests, cdk synth)
#   - unit, property and end-to-end tests (cargo test), including the bootstrap binaries
#     under an emulated Lambda Runtime API
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export MOTO_PORT="${MOTO_PORT:-5056}"
# shellcheck source=infra/local/shared-build.sh
source infra/local/shared-build.sh
started=$(date +%s)
section() { printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - started))" >&2; }

for tool in cargo python3 npm; do
  command -v "$tool" >/dev/null || { echo "$tool is required; see README.md" >&2; exit 1; }
done

if [[ -z "${AWS_ENDPOINT_URL:-}" ]]; then
  trap 'infra/local/moto.sh stop' EXIT
  infra/local/moto.sh start
  eval "$(infra/local/moto.sh env)"
else
  echo "using the AWS API at $AWS_ENDPOINT_URL" >&2
  infra/local/moto.sh install   # the Azure SDK the client test publishes with
fi

section "format and lint"
infra/local/check-rule-ids.sh
python3 infra/local/check-feature-union.py
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The rules crate (shared) and the ports crate stay free of I/O: no async runtime, AWS SDK or
# HTTP client may enter their dependency trees.
for crate in gridrelay-shared gridrelay-ports; do
  if io=$(cargo tree -p "$crate" -e normal --prefix none --locked | grep -E '^(tokio|reqwest|hyper|aws-[a-z-]+) '); then
    echo "$crate must not depend on I/O crates, but depends on:" >&2
    echo "$io" | sort -u >&2
    exit 1
  fi
done

section "deployable functions (cargo lambda build, dev profile)"
# Unoptimised: the bootstrap tests check the binaries' wiring, not their speed, and a fresh clone
# builds them in 175 s instead of 497 s. The release builds are `make soak`'s and `make bench`'s.
BUILD_PROFILE=dev infra/deploy/build.sh

section "deployment definitions"
# Bundled for x86_64 in the dev profile: the builds just made (arm64's cross build in the release
# profile is `make soak`'s).
CDK_ARCHITECTURE=x86_64 CDK_BUILD_PROFILE=dev infra/deploy/check.sh

section "browser test parts (Chromium, ChromeDriver, axe-core)"
infra/local/browser.sh

section "tests (unit, property, end-to-end)"
# The end-to-end tests mostly wait (on scaled timers, moto, subscribers): six at a time instead
# of one per core took tests/it from 108 s to 44 s on 2 cores (35 s at ten), the same tests
# passing; six leaves the timing-sensitive ones some room.
RUST_TEST_THREADS="${RUST_TEST_THREADS:-6}" cargo test --workspace --locked

section "done"
