#!/usr/bin/env bash
# Checks the deployment definitions: cfn-lint, `sam validate --lint` and the roles' exact
# permissions (after SAM's transform) on the SAM template,
# the CDK construct's assertion tests, and a real `cdk synth` (which bundles the functions with
# cargo-lambda). Needs no AWS account: nothing is deployed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
eval "$(infra/deploy/tools.sh)"
export AWS_REGION="${AWS_REGION:-us-east-1}" AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"
export SAM_CLI_TELEMETRY=0 CDK_DISABLE_CLI_TELEMETRY=true

echo "== cfn-lint infra/template.yaml" >&2
cfn-lint infra/template.yaml
echo "== sam validate --lint" >&2
(cd infra && sam validate --lint --template template.yaml)
echo "== least privilege and concurrency limits of the SAM stack (SAM's own transform)" >&2
python infra/deploy/check_sam_template.py

echo "== CDK assertion tests" >&2
(cd infra/cdk && npm test --silent)
# The architecture to bundle for: CDK_ARCHITECTURE, x86_64 (what `make test` gives: the
# builds it already made for the bootstrap tests are reused) or arm64 (the stack's
# default; `make soak` bundles it, a cross build of its own).
architecture="${CDK_ARCHITECTURE:-arm64}"
case "$architecture" in
  arm64) machine=0xB7 ;;
  x86_64) machine=0x3E ;;
  *) echo "CDK_ARCHITECTURE is '$architecture'; allowed: arm64, x86_64" >&2; exit 2 ;;
esac
# The cargo profile to bundle with: CDK_BUILD_PROFILE, release (the default: what deploys) or dev
# (what `make test` gives, to reuse the bootstrap tests' builds of infra/deploy/build.sh).
profile="${CDK_BUILD_PROFILE:-release}"
echo "== cdk synth for $architecture, profile $profile (bundles the functions with cargo lambda)" >&2
(cd infra/cdk && rm -rf cdk.out && npx --no-install cdk synth -c "architecture=$architecture" -c "profile=$profile" --quiet --no-notices --no-version-reporting)
for f in $(cd infra/cdk/cdk.out && ls -d asset.*/ 2>/dev/null); do
  [[ -x "infra/cdk/cdk.out/$f/bootstrap" ]] && echo "bundled: infra/cdk/cdk.out/${f}bootstrap" >&2
done
test "$(ls infra/cdk/cdk.out/asset.*/bootstrap 2>/dev/null | wc -l)" -ge 4 || { echo "cdk synth did not bundle four bootstrap binaries" >&2; exit 1; }
# The bundles must be ELF binaries of that architecture (e_machine 0xb7 aarch64, 0x3e x86-64).
python3 - "$architecture" "$machine" infra/cdk/cdk.out/asset.*/bootstrap <<'EOF'
import sys
architecture, expected, paths = sys.argv[1], int(sys.argv[2], 16), sys.argv[3:]
for path in paths:
    with open(path, "rb") as f:
        machine = int.from_bytes(f.read(20)[18:20], "little")
    if machine != expected:
        sys.exit(f"{path}: ELF machine {machine:#x}, expected {architecture} ({expected:#x})")
print(f"{len(paths)} bundles are {architecture}", file=sys.stderr)
EOF
