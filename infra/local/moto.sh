#!/usr/bin/env bash
# Runs moto server, the local AWS emulator, from the project's own virtualenv.
#
#   infra/local/moto.sh install   create .venv and install moto[server] (pinned in requirements.txt)
#   infra/local/moto.sh start     install if needed, start on 127.0.0.1:$MOTO_PORT (default 5055), wait until ready
#   infra/local/moto.sh stop      stop the server this script started
#   infra/local/moto.sh env       print the environment the SDK needs to use it
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv"
run="$root/.run"
port="${MOTO_PORT:-5055}"
pidfile="$run/moto-$port.pid"

install() {
  if [[ ! -x "$venv/bin/moto_server" ]] || ! cmp -s "$root/infra/local/requirements.txt" "$venv/.requirements"; then
    echo "installing moto[server] into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/infra/local/requirements.txt"
    cp "$root/infra/local/requirements.txt" "$venv/.requirements"
  fi
}

ready() {
  python3 - "$port" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/moto-api/", timeout=2)
except Exception:
    sys.exit(1)
PY
}

start() {
  install
  mkdir -p "$run"
  if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && ready; then
    echo "moto already running on 127.0.0.1:$port" >&2
    return
  fi
  # moto's server with DynamoDB's requests one at a time, as DynamoDB keeps writes to an item
  # atomic (infra/local/moto_server.py says why).
  nohup "$venv/bin/python" "$root/infra/local/moto_server.py" -H 127.0.0.1 -p "$port" \
    >"$run/moto-$port.log" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 1 100); do
    if ready; then
      echo "moto running on 127.0.0.1:$port (log: $run/moto-$port.log)" >&2
      return
    fi
    sleep 0.2
  done
  echo "moto did not start; see $run/moto-$port.log" >&2
  tail -20 "$run/moto-$port.log" >&2 || true
  exit 1
}

stop() {
  if [[ -f "$pidfile" ]]; then
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  fi
}

env_lines() {
  cat <<ENV
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_ACCESS_KEY_ID=testing
export AWS_SECRET_ACCESS_KEY=testing
export AWS_REGION=us-east-1
ENV
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  env) env_lines ;;
  *) echo "usage: $0 install|start|stop|env" >&2; exit 2 ;;
esac
