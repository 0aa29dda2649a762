# mado's entry points. Both install what they need if it is missing.
.PHONY: demo test check fmt

demo:   ## import this repository into the embedded local store and check it out
	./scripts/demo.sh

test:   ## the whole test suite, with a real MinIO server
	./scripts/test.sh

check:  ## formatting and lints
	. scripts/env.sh && cargo fmt --all -- --check && cargo clippy --workspace --all-targets -- -D warnings

fmt:
	cargo fmt --all
