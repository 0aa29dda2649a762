# mado's entry points. Both install what they need if it is missing.
.PHONY: demo test check fmt bench bench-quick pjdfstest install uninstall

PREFIX ?= $(HOME)/.local
# scripts/env.sh is bash (it finds the clone from BASH_SOURCE); dash, make's
# default /bin/sh, stops it there with "Bad substitution".
SHELL := /bin/bash

demo:   ## import this repository into the embedded local store and check it out
	./scripts/demo.sh

test:   ## the whole test suite, with a real MinIO server
	./scripts/test.sh

bench:  ## every benchmark scenario, mado and its peers, at RTT 0/20/50 ms: writes docs/BENCHMARKS.md and plots
	./scripts/ensure-deps.sh --bench && . scripts/env.sh && python3 bench/run.py

bench-quick:  ## a small, fast version of `make bench` (the test suite runs it)
	./scripts/ensure-deps.sh --bench && . scripts/env.sh && python3 bench/run.py --quick --out "$${BENCH_OUT:-/tmp/mado-bench-quick/BENCHMARKS.md}"

pjdfstest:  ## the POSIX suite pjdfstest against a workspace mount (root; `make test` runs it too)
	./scripts/ensure-deps.sh && ./scripts/pjdfstest.sh

check:  ## formatting and lints
	. scripts/env.sh && cargo fmt --all -- --check && cargo clippy --workspace --all-targets -- -D warnings

fmt:
	cargo fmt --all

install:  ## build the release binary and install it with its manual pages and bash, zsh and fish completions under PREFIX (default ~/.local)
	./scripts/ensure-deps.sh && . scripts/env.sh && cargo install --locked --path crates/cli --root "$(PREFIX)"
	mkdir -p "$(PREFIX)/share/man/man1" "$(PREFIX)/share/bash-completion/completions" \
	  "$(PREFIX)/share/zsh/site-functions" "$(PREFIX)/share/fish/vendor_completions.d"
	"$(PREFIX)/bin/mado" man --dir "$(PREFIX)/share/man/man1"
	"$(PREFIX)/bin/mado" completion bash > "$(PREFIX)/share/bash-completion/completions/mado"
	"$(PREFIX)/bin/mado" completion zsh > "$(PREFIX)/share/zsh/site-functions/_mado"
	"$(PREFIX)/bin/mado" completion fish > "$(PREFIX)/share/fish/vendor_completions.d/mado.fish"
	@echo "installed $(PREFIX)/bin/mado; make sure $(PREFIX)/bin is on your PATH"

uninstall:
	rm -f "$(PREFIX)/bin/mado" "$(PREFIX)/share/man/man1/mado.1" "$(PREFIX)/share/man/man1"/mado-*.1 "$(PREFIX)/share/bash-completion/completions/mado" \
	  "$(PREFIX)/share/zsh/site-functions/_mado" "$(PREFIX)/share/fish/vendor_completions.d/mado.fish"
