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
echo "== least privilege of the SAM roles (SAM's own transform)" >&2
python infra/deploy/check_sam_policies.py

echo "== CDK assertion tests" >&2
(cd infra/cdk && npm test --silent)
echo "== cdk synth (bundles the functions with cargo lambda)" >&2
(cd infra/cdk && rm -rf cdk.out && npx --no-install cdk synth --quiet --no-notices --no-version-reporting)
for f in $(cd infra/cdk/cdk.out && ls -d asset.*/ 2>/dev/null); do
  [[ -x "infra/cdk/cdk.out/$f/bootstrap" ]] && echo "bundled: infra/cdk/cdk.out/${f}bootstrap" >&2
done
test "$(ls infra/cdk/cdk.out/asset.*/bootstrap 2>/dev/null | wc -l)" -ge 3 || { echo "cdk synth did not bundle three bootstrap binaries" >&2; exit 1; }
