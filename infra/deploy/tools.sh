#!/usr/bin/env bash
# Installs the deploy tools into the project's .venv-deploy (aws-sam-cli, cfn-lint, cargo-lambda
# with zig, pinned in requirements.txt), the CDK app's packages (npm ci, from
# package-lock.json) and Rust's aarch64 target (the functions deploy on arm64). Prints the PATH entry to use them: eval "$(infra/deploy/tools.sh)".
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv-deploy"
if [[ ! -x "$venv/bin/cargo-lambda" ]] || ! cmp -s "$root/infra/deploy/requirements.txt" "$venv/.requirements"; then
  echo "installing deploy tools into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/infra/deploy/requirements.txt" >&2
  cp "$root/infra/deploy/requirements.txt" "$venv/.requirements"
fi
if [[ ! -d "$root/infra/cdk/node_modules" ]] || [[ "$root/infra/cdk/package-lock.json" -nt "$root/infra/cdk/node_modules/.package-lock.json" ]]; then
  echo "installing the CDK app's packages (npm ci)" >&2
  (cd "$root/infra/cdk" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
# The stacks' default architecture is arm64: its standard library, for cargo lambda --arm64.
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  echo "adding the Rust target aarch64-unknown-linux-gnu (rustup)" >&2
  rustup target add aarch64-unknown-linux-gnu >&2
fi
echo "export PATH=\"$venv/bin:\$PATH\""
