#!/usr/bin/env bash
# `make deny`: installs the pinned cargo-deny into .tools (built from crates.io, once) and checks
# the licences, bans and sources of every dependency against deny.toml. Advisories are not
# checked: their database is on GitHub, out of these machines' reach (see deny.toml).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
version=0.20.2
deny=.tools/bin/cargo-deny
if [[ ! -x "$deny" ]] || [[ "$("$deny" --version)" != "cargo-deny $version" ]]; then
  echo "installing cargo-deny $version into .tools (a few minutes, once)" >&2
  cargo install --locked --quiet --root .tools "cargo-deny@$version"
fi
"$deny" --version >&2
"$deny" --locked check licenses bans sources
