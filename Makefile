# cudarl-pipe: `make run` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CARGO ?= cargo
BIN := target/release/cudarl-pipe

.PHONY: setup build run curriculum test lint bench clean

## setup: Python virtualenv with the test tools (pyarrow, polars).
setup: $(VENV)/.stamp
$(VENV)/.stamp: requirements-dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

## build: the release binary.
build:
	$(CARGO) build --release -p cudarl-cli

## run: set up, build, run the main job on the bundled data.
run: setup build
	$(BIN) run curriculum
	$(BIN) status

## curriculum: ingest -> curriculum on the bundled data.
curriculum: build
	$(BIN) run curriculum

## test: set up, build, lint, and run every test (Rust and Python).
test: setup lint
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		CUDARL_REQUIRE_NVCC=1 CUDARL_REQUIRE_PYTHON=1 CUDARL_PYTHON=$(abspath $(PY)) $(CARGO) nextest run --workspace --no-fail-fast; \
	else \
		CUDARL_REQUIRE_NVCC=1 CUDARL_REQUIRE_PYTHON=1 CUDARL_PYTHON=$(abspath $(PY)) $(CARGO) test --workspace --no-fail-fast; \
	fi

## lint: rustfmt and clippy with warnings as errors.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## bench: CPU benchmarks; results in benchmarks/results/.
bench: build
	$(BIN) bench noop --out benchmarks/results/noop-run-curriculum.json
	$(BIN) bench ingest-sakana --out benchmarks/results/ingest-sakana-full-size.json

clean:
	rm -rf target artifacts $(VENV)
