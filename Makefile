# gridrelay: two commands.
#   make demo   run the whole system locally and show delivery, retry and dead-lettering
#   make test   install what the tests need, then run every check and test
# and the long runs of the life-cycle checks (chaos, fuzzing, simulation): make soak
# and the end-to-end suites on LocalStack (DynamoDB and Lambda on moto): make test-localstack
# and the dependencies' licences, bans and sources (deny.toml): make deny
.PHONY: demo test test-localstack soak deny build lint bench clean-local

demo:
	bash infra/local/demo.sh

test:
	bash infra/local/test.sh

test-localstack:
	bash infra/local/test-localstack.sh

soak:
	bash infra/local/soak.sh

deny:
	bash infra/local/deny.sh

build:
	cargo build --workspace

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

bench:
	bash infra/local/bench.sh

clean-local:
	-bash infra/local/moto.sh stop
	-bash infra/local/localstack.sh stop
	rm -rf .run
