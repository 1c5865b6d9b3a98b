#!/usr/bin/env bash
# What the console's browser tests (cli/tests/console/browser.rs) drive and load, installed from
# the project's own files: Debian's Chromium and ChromeDriver (apt, where missing) and axe-core,
# the accessibility checker (npm, pinned in tests/browser/package-lock.json).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  command -v apt-get >/dev/null || {
    echo "the console's browser tests need chromium and chromedriver on PATH; this script installs Debian's packages with apt, which is not here: install them another way" >&2
    exit 1
  }
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  echo "installing Debian's chromium and chromium-driver" >&2
  # A fresh machine may have no package lists yet: read them once if the install cannot start.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null \
    || { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }
fi
source "$root/infra/local/node_ca.sh"
npm ci --prefer-offline --prefix tests/browser --no-audit --no-fund --loglevel=error
