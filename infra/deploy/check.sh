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
echo "== cdk synth (bundles the functions with cargo lambda)" >&2
(cd infra/cdk && rm -rf cdk.out && npx --no-install cdk synth --quiet --no-notices --no-version-reporting)
for f in $(cd infra/cdk/cdk.out && ls -d asset.*/ 2>/dev/null); do
  [[ -x "infra/cdk/cdk.out/$f/bootstrap" ]] && echo "bundled: infra/cdk/cdk.out/${f}bootstrap" >&2
done
test "$(ls infra/cdk/cdk.out/asset.*/bootstrap 2>/dev/null | wc -l)" -ge 3 || { echo "cdk synth did not bundle three bootstrap binaries" >&2; exit 1; }
# The stack's default architecture is arm64: the bundles must be aarch64 ELF binaries (e_machine 0xb7).
python3 - infra/cdk/cdk.out/asset.*/bootstrap <<'EOF'
import sys
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        machine = int.from_bytes(f.read(20)[18:20], "little")
    if machine != 0xB7:
        sys.exit(f"{path}: ELF machine {machine:#x}, expected aarch64 (0xb7), the stack's default architecture")
print(f"{len(sys.argv) - 1} bundles are aarch64", file=sys.stderr)
EOF
