# Sourced by `make test` and `make test-localstack`: one build of the crates for the Lambda
# bootstraps (infra/deploy/build.sh), the CDK app's bundles (infra/deploy/check.sh) and the tests.
#
# cargo lambda builds for an explicit target (x86_64-unknown-linux-gnu) and links with zig; cargo
# test builds for the host, without a target, in another directory. So a fresh clone compiled
# most crates twice. On an x86_64 machine the dev bootstraps need no cross linker: cargo lambda
# builds them with cargo's own (CARGO_LAMBDA_COMPILER=cargo), and every cargo command here builds
# for that same explicit target (CARGO_BUILD_TARGET), so they share target/x86_64-unknown-linux-gnu
# wherever their crates' features agree. make soak's arm64 bundles still cross-link with zig.
if [[ "$(uname -m)" == x86_64 ]]; then
  export CARGO_BUILD_TARGET=x86_64-unknown-linux-gnu
  export CARGO_LAMBDA_COMPILER=cargo
fi
