# Sourced by the scripts that make npm fetch (browser.sh, and localstack.sh, whose LocalStack
# installs its Kinesis emulator from the npm registry at the first Kinesis call).
# npm 11 fetches through Node's TLS, which reads extra CAs from NODE_EXTRA_CA_CERTS only: where
# npm is configured with a CA file (a registry behind a proxy) and that is unset, use it.
if [[ -z "${NODE_EXTRA_CA_CERTS:-}" ]] && command -v npm >/dev/null; then
  cafile=$(npm config get cafile 2>/dev/null || true)
  if [[ -f "$cafile" ]]; then export NODE_EXTRA_CA_CERTS="$cafile"; fi
fi
