# cudarl-pipe: `make run` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CARGO ?= cargo
BIN := target/release/cudarl-pipe
DATE := $(shell date -u +%F)
# tch (torch-sys) builds against the torch wheel in .venv, found through the venv's python.
export LIBTORCH_USE_PYTORCH := 1
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(VIRTUAL_ENV)/bin:$(PATH)

.PHONY: setup build install run curriculum test lint bench carry clean

## setup: Python virtualenv: test tools (pyarrow, polars), nvcc 13.0 wheels, torch 2.11.0 for tch.
setup: $(VENV)/.stamp
$(VENV)/.stamp: requirements-dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-cache-dir -r requirements-dev.txt
	touch $@

## build: the optimized binaries (cudarl-pipe, its GPU worker cudarl-pipe-worker, the sandboxed
## runner cudarl-pipe-runner, its trainer cudarl-pipe-train). FEATURES=sql adds `cudarl-pipe sql`
## (polars; a longer cold build).
FEATURES ?=
build: setup
	$(CARGO) build --release -p cudarl-cli -p cudarl-torch -p cudarl-runner -p cudarl-train $(if $(FEATURES),--features cudarl-cli/$(FEATURES))

## install: the built binaries into $(PREFIX)/bin (default ~/.local/bin; put it on PATH). They
## find one another side by side, and libtorch in this checkout's .venv.
PREFIX ?= $(HOME)/.local
install: build
	install -d $(PREFIX)/bin
	install -m 755 target/release/cudarl-pipe target/release/cudarl-pipe-worker target/release/cudarl-pipe-runner target/release/cudarl-pipe-train $(PREFIX)/bin/
	@echo "installed cudarl-pipe and its sibling binaries in $(PREFIX)/bin"

## run: set up, build, then the main job on the bundled data: the pipeline's default targets
## (`cudarl-pipe run`, i.e. `run rl-train eval`):
## ingest + synth-tasks -> splits (what is held out) -> validate (the task kernels; beside it
## sft-repairs, kb-specs, and tokenizer and pretrain on the train split's kernels) -> curriculum (tiers,
## with the splits) -> sft-data ->
## SFT of both agents -> multi-turn RL -> eval (SFT vs RL on the hold-out families).
## `model = "auto"`:
## configs/model/small.toml with a GPU, tiny.toml without. The compile-only look at the SFT
## generator is `cudarl-pipe run sft-eval`; the curriculum with the archives is `make curriculum`.
## Without a GPU the pipeline file's `cpu` profile applies by itself (pipelines/default.toml
## [profiles.cpu]: 2 cores, configs/model/cpu.toml, compile-only rewards, a smaller data set and
## RL run),
## and `status`, `show` and `export` reuse the settings of the last run of the default targets.
run: setup build
	$(BIN) run
	$(BIN) status

## curriculum: ingest + task families -> validate (compile-only without a GPU) -> curriculum,
## and KernelBench native signatures (kb-specs), on the bundled data; remembered as run `archive`
## (`cudarl-pipe show curriculum --run archive`).
curriculum: build
	$(BIN) run curriculum kb-specs --set curriculum.archive=true --run archive

## test: set up, build, lint, and run every test (Rust and Python). A one-off build: no
## incremental compilation state (it would double the target folder's size).
test lint: export CARGO_INCREMENTAL := 0
test: setup lint
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		CUDARL_REQUIRE_NVCC=1 CUDARL_REQUIRE_PYTHON=1 CUDARL_PYTHON=$(abspath $(PY)) $(CARGO) nextest run --workspace --features cudarl-cli/sql --no-fail-fast; \
	else \
		CUDARL_REQUIRE_NVCC=1 CUDARL_REQUIRE_PYTHON=1 CUDARL_PYTHON=$(abspath $(PY)) $(CARGO) test --workspace --features cudarl-cli/sql --no-fail-fast; \
	fi

## lint: rustfmt and clippy with warnings as errors; ruff (lint and format) on the Python code.
lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --features cudarl-cli/sql -- -D warnings
	$(VENV)/bin/ruff check python scripts tests/python
	$(VENV)/bin/ruff format --check python scripts tests/python

## bench: CPU benchmarks; results in benchmarks/results/.
bench: build
	$(BIN) bench noop --out benchmarks/results/noop_run_curriculum_cpu_$(DATE).json
	$(BIN) bench ingest-sakana --out benchmarks/results/ingest_sakana_full_size_cpu_$(DATE).json

## carry: stripped, gzip-compressed binaries for a GPU host without a Rust toolchain, in .carry/ (cudarl-pipe, the
## worker, the gated GPU test binary, and the trainer and judge libraries' tests, whose GPU tests are gated);
## scripts/gpu/checks.sh runs them there.
carry: build
	$(CARGO) test --release --no-run -p cudarl-cli --test gpu
	$(CARGO) test --release --no-run -p cudarl-train --lib
	$(CARGO) test --release --no-run -p cudarl-torch --lib
	mkdir -p .carry && rm -f .carry/*.gz
	cp target/release/cudarl-pipe target/release/cudarl-pipe-worker target/release/cudarl-pipe-runner target/release/cudarl-pipe-train .carry/
	cp "$$(ls -t target/release/deps/gpu-* | grep -v '\.d$$' | head -1)" .carry/gpu-tests
	cp "$$(ls -t target/release/deps/cudarl_train-* | grep -v '\.d$$' | head -1)" .carry/train-tests
	cp "$$(ls -t target/release/deps/cudarl_torch-* | grep -v '\.d$$' | head -1)" .carry/torch-tests
	strip .carry/cudarl-pipe .carry/cudarl-pipe-worker .carry/cudarl-pipe-runner .carry/cudarl-pipe-train .carry/gpu-tests .carry/train-tests .carry/torch-tests
	gzip -9 .carry/cudarl-pipe .carry/cudarl-pipe-worker .carry/cudarl-pipe-runner .carry/cudarl-pipe-train .carry/gpu-tests .carry/train-tests .carry/torch-tests
	ls -la .carry

clean:
	rm -rf target artifacts $(VENV)
