#!/usr/bin/env bash
# Runs LocalStack (the last open-source release, localstack-core 2026.3.0) without Docker, from
# the project's own virtualenv, for SQS, S3, SNS, EventBridge, Secrets Manager, Kinesis and Firehose.
# Its DynamoDB and Lambda need Docker or downloads, so those stay on moto: `env` points the
# SDK's per-service endpoints for them at moto ($MOTO_PORT).
#
#   infra/local/localstack.sh install   create .venv-localstack (Python 3.13) and install the pinned set
#   infra/local/localstack.sh start     install if needed, start on 127.0.0.1:$LOCALSTACK_PORT (default 4566), wait until ready
#   infra/local/localstack.sh stop      stop the LocalStack this script started (by its PID)
#   infra/local/localstack.sh env       print the environment for the mixed stack (LocalStack, DynamoDB and Lambda on moto)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/.venv-localstack"
run="$root/.run"
port="${LOCALSTACK_PORT:-4566}"
moto_port="${MOTO_PORT:-5055}"
pidfile="$run/localstack-$port.pid"
requirements="$root/infra/local/localstack-requirements.txt"
services=sqs,s3,sns,events,secretsmanager,kinesis,firehose

python313() {
  for candidate in python3.13 "$(pyenv root 2>/dev/null)/versions/3.13"*/bin/python3.13; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null; then
      command -v "$candidate"
      return
    fi
  done
  echo "LocalStack 2026.3.0 needs Python 3.13 (python3.13 on PATH, or pyenv's 3.13)" >&2
  exit 1
}

install() {
  if [[ ! -x "$venv/bin/python" ]] || ! cmp -s "$requirements" "$venv/.requirements"; then
    local python
    python=$(python313)
    echo "installing localstack-core into $venv" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/.requirements"
  fi
}

ready() {
  python3 - "$port" "$services" <<'PY'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/_localstack/health", timeout=2) as r:
        state = json.load(r)["services"]
except Exception:
    sys.exit(1)
sys.exit(0 if all(state.get(s) in ("available", "running") for s in sys.argv[2].split(",")) else 1)
PY
}

start() {
  install
  mkdir -p "$run"
  if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && ready; then
    echo "LocalStack already running on 127.0.0.1:$port" >&2
    return
  fi
  if ready; then
    echo "something not started by this script already answers on 127.0.0.1:$port; stop it or set LOCALSTACK_PORT" >&2
    exit 1
  fi
  # On the host (not in a container: everything it writes, and the Kinesis emulator it installs
  # from the npm registry at its first Kinesis call, under .run), no DNS server, no persistence.
  # Extra settings pass through the environment (KINESIS_ERROR_PROBABILITY, for one).
  source "$root/infra/local/node_ca.sh"
  OVERRIDE_IN_DOCKER=0 FILESYSTEM_ROOT="$run/localstack-$port" GATEWAY_LISTEN="127.0.0.1:$port" \
    SERVICES="$services" DNS_ADDRESS=0 PERSISTENCE=0 SKIP_SSL_CERT_DOWNLOAD=1 DISABLE_EVENTS=1 \
    nohup "$venv/bin/python" -m localstack.runtime.main >"$run/localstack-$port.log" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 1 300); do
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then break; fi
    if ready; then
      echo "LocalStack running on 127.0.0.1:$port (log: $run/localstack-$port.log)" >&2
      return
    fi
    sleep 0.2
  done
  echo "LocalStack did not start; see $run/localstack-$port.log" >&2
  tail -20 "$run/localstack-$port.log" >&2 || true
  stop
  exit 1
}

stop() {
  if [[ -f "$pidfile" ]]; then
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    # Not stopped within 10 s: stopped hard, with the Kinesis emulator it started.
    if kill -0 "$pid" 2>/dev/null; then
      pkill -9 -P "$pid" 2>/dev/null || true
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  fi
}

env_lines() {
  cat <<ENV
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$moto_port
export AWS_ENDPOINT_URL_LAMBDA=http://127.0.0.1:$moto_port
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
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
